/* basis_products_kernel.h - internal: the one call between the transform's
 * basis products (basis_products.c) and their AMX-BF16 tile kernel
 * (basis_products_amx.c, x86-64 only).
 *
 * C (m x 16 ntiles float32, row stride ldc) = A x B, where
 *   A: m rows of kblocks x 32 bfloat16 (row stride lda elements), m a
 *      multiple of 32, every element readable (the caller pads);
 *   a_lo (or NULL): A's low parts, the same shape, added where
 *      a_lo_flags[(row / 32) * kblocks + kb] is nonzero;
 *   b[0..nparts): B's parts (nparts <= KVS_BASIS_MAX_PARTS), each
 *      tile-packed bfloat16, column tile nt's block kb at
 *      b[p] + nt * nt_stride + kb * 512: 16 rows (K pairs) x 16 columns x 2
 *      (the pair), as TDPBF16PS reads it; ntiles is even.
 * Every pair of parts is multiplied: (A + a_lo)(b[0] + b[1] + ...). */
#ifndef KVSERDE_CODECS_BASIS_PRODUCTS_KERNEL_H
#define KVSERDE_CODECS_BASIS_PRODUCTS_KERNEL_H

#include <stddef.h>
#include <stdint.h>

#define KVS_BASIS_MAX_PARTS 3

typedef struct kvs_basis_gemm {
    const uint16_t *a, *a_lo;
    const uint8_t *a_lo_flags;
    size_t lda, m, kblocks;
    const uint16_t *b[KVS_BASIS_MAX_PARTS];
    size_t nparts, nt_stride, ntiles;
    float *c;
    size_t ldc;
} kvs_basis_gemm;

void kvs_basis_amx_gemm(const kvs_basis_gemm *g);

/* Loads the kernel's tile configuration on this thread (what the kernel
 * does first): every one of the 8 tiles 16 rows x 64 bytes. Release the
 * tiles with _tile_release() after use. */
void kvs_basis_amx_config(void);

#endif /* KVSERDE_CODECS_BASIS_PRODUCTS_KERNEL_H */
