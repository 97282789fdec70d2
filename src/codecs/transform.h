/* transform.h - internal: the calibrated transform of the "transform" stage
 * (stage_transform.c): per layer, for K and for V, the mean vector and an
 * orthonormal basis (principal components of sample chunks, largest
 * variance first), estimated by `kvserde calibrate` and stored as a
 * safetensors file (docs/fidelity.md, docs/cli.md).
 *
 * The file's tensors, all F32, little-endian:
 *   k.mean  [layers, hidden]          K's mean per layer
 *   k.basis [layers, hidden, hidden]  row j of layer l: component j
 *   k.var   [layers, hidden]          each component's variance on the
 *                                     calibration chunks (descending)
 *   v.mean, v.basis, v.var            the same for V
 * and string metadata: kvserde.transform "1", kvserde.transform.fingerprint
 * (16 hex digits), kvserde.transform.layout "KV_2LTD", and what it was
 * calibrated on (kvserde.transform.chunks, kvserde.transform.tokens).
 *
 * The fingerprint is XXH3-64 (seed 0) of "kvserde-transform-v1" and a NUL,
 * layers and hidden (u32 LE each), then the bytes of k.mean, k.basis,
 * k.var, v.mean, v.basis, v.var: it identifies the numbers, not the file's
 * name or metadata. A frame records it; a reader refuses a blob made with
 * another transform (KVS_EKEY).
 */
#ifndef KVSERDE_CODECS_TRANSFORM_H
#define KVSERDE_CODECS_TRANSFORM_H

#include <stddef.h>
#include <stdint.h>

/* Caps on what a transform file may declare (hostile files). */
#define KVS_TRANSFORM_MAX_LAYERS 1024
#define KVS_TRANSFORM_MAX_HIDDEN 16384
#define KVS_TRANSFORM_FILE_MAX ((uint64_t)4 << 30)

typedef struct kvs_transform {
    uint32_t layers, hidden;
    float *mean[2];  /* [K=0 / V=1]: layers x hidden */
    float *basis[2]; /* layers x hidden x hidden, row-major, rows = components */
    float *var[2];   /* layers x hidden */
    float *rms[2];   /* layers: sqrt of the mean variance (the step's unit) */
    uint64_t fingerprint;
    /* the basis tile-packed for the AMX products, or NULL (sgemm serves):
     * made by kvs_transform_finish (codecs/basis_products.h) */
    struct kvs_basis_packed *packed;
} kvs_transform;

/* Allocate an empty transform of this size (every array zeroed). */
int kvs_transform_alloc(uint32_t layers, uint32_t hidden, kvs_transform **out);
void kvs_transform_free(kvs_transform *t);

/* Fill t->rms, t->fingerprint and t->packed from the arrays (which must
 * not change afterwards). */
void kvs_transform_finish(kvs_transform *t);

/* Load and check a transform file: the tensors above with consistent
 * shapes, the stored fingerprint equal to the numbers' own. KVS_EIO for a
 * file that cannot be read, KVS_ECORRUPT naming the file and what is wrong. */
int kvs_transform_load(const char *path, kvs_transform **out);

/* The names of the file's tensors, in fingerprint order, and their arrays. */
#define KVS_TRANSFORM_NTENSORS 6
extern const char *const kvs_transform_tensor_names[KVS_TRANSFORM_NTENSORS];
const float *kvs_transform_tensor(const kvs_transform *t, int i, uint64_t *numel);

/* ---- calibration ------------------------------------------------------- */

/* Streams sample chunks of [2, layers, tokens, hidden] (float32) into
 * running sums (double), then the eigendecomposition of each covariance
 * (LAPACK dsyevd). The result depends only on the chunks and their order. */
typedef struct kvs_calibration kvs_calibration;
int kvs_calibration_new(uint32_t layers, uint32_t hidden, kvs_calibration **out);
int kvs_calibration_add(kvs_calibration *c, const float *kv, uint64_t tokens);
int kvs_calibration_result(kvs_calibration *c, kvs_transform **out);
uint64_t kvs_calibration_chunks(const kvs_calibration *c);
uint64_t kvs_calibration_tokens(const kvs_calibration *c);
void kvs_calibration_free(kvs_calibration *c);

#endif /* KVSERDE_CODECS_TRANSFORM_H */
