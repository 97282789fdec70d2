/* basis_products.h - internal: the transform stage's two dense products on
 * AMX-BF16 tiles, where the CPU has them (stage_transform.c falls back to
 * OpenBLAS's cblas_sgemm everywhere else).
 *
 *   forward (encode): c = (x - mean) B^T / delta for bfloat16 rows x,
 *     computed as (x B^T - B mean) / delta: the bfloat16 values are exact
 *     tile inputs, B mean is summed once per layer in double;
 *   inverse (decode): x = delta q B_kept, q the integer coefficients
 *     (|q| <= 32768), split q = hi + lo with both parts exact in bfloat16
 *     (lo is 0, and skipped, wherever |q| <= 256).
 * The basis is split into bfloat16 parts, three for encode (within 2^-24
 * of it) and two for decode (2^-16), and every pair of parts is
 * multiplied, so the result keeps float32 sgemm's precision: see
 * docs/fidelity.md "Speed" for the bound and the measured differences,
 * docs/decisions.md "the basis products".
 *
 * The packed copies of every layer's basis (both orientations, 5 parts,
 * 10 bytes per basis element, 2.5 times the float basis) are made once, by
 * kvs_transform_finish, and only when the products will run on AMX. */
#ifndef KVSERDE_CODECS_BASIS_PRODUCTS_H
#define KVSERDE_CODECS_BASIS_PRODUCTS_H

#include <stddef.h>
#include <stdint.h>

#include "codecs/transform.h"

typedef struct kvs_basis_packed kvs_basis_packed;

/* Whether the products run on AMX: the CPU has AMX-BF16 with the tile
 * state enabled (util/cpu_features.h), the kernel granted this process the
 * tile permission (asked once, on the first call), and KVSERDE_ISA is not
 * "scalar" or "avx2" (read once). Thread-safe. */
int kvs_basis_amx_in_use(void);

/* Tests: turn the AMX products on (where they can run) or off; returns the
 * state now in force. A transform finished while they were off has no
 * packed copies and keeps the sgemm path. */
int kvs_basis_set_amx(int on);

/* The packed copies for t (NULL when the products do not run on AMX, or
 * out of memory: the sgemm path then serves). */
kvs_basis_packed *kvs_basis_pack(const kvs_transform *t);
void kvs_basis_packed_free(kvs_basis_packed *p);

/* c (T x hidden, row-major) = (x - mean) B^T * inv_delta for T bfloat16
 * rows x of K (kv 0) or V (kv 1) of layer l. Returns 1 when done, 0 when
 * the caller must use sgemm (no packed copies, AMX off, out of memory). */
int kvs_basis_forward(const kvs_transform *t, int kv, uint32_t l, const uint16_t *x, size_t T,
                      float inv_delta, float *c);

/* x (T x hidden) = delta * q B[0..kept) for the T x kept integer-valued
 * coefficients q (row-major, float). Returns 1 when done, 0 when the
 * caller must use sgemm. */
int kvs_basis_inverse(const kvs_transform *t, int kv, uint32_t l, const float *q, size_t T,
                      size_t kept, float delta, float *x);

#endif /* KVSERDE_CODECS_BASIS_PRODUCTS_H */
