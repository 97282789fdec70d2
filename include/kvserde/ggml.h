/* kvserde/ggml.h - llama.cpp's q8_0 and q4_0 blocks: kernels and the
 * "ggml_q8_0" / "ggml_q4_0" serdes.
 *
 * Formats (ggml's block_q8_0 / block_q4_0): the elements are cut into blocks
 * of 32 consecutive values along the last axis; each block is stored as its
 * scale d (float16, little-endian) followed by its codes:
 *   q8_0  34 bytes: d, then 32 signed bytes q[j]; value j = q[j] * d
 *         (8.5 bits per element).
 *   q4_0  18 bytes: d, then 16 bytes; byte j holds element j in its low
 *         nibble and element j + 16 in its high nibble, each an unsigned
 *         nibble n; value = (n - 8) * d (4.5 bits per element).
 *
 * Encoding: the bytes are exactly those of llama.cpp's reference quantizers
 * quantize_row_q8_0_ref / quantize_row_q4_0_ref (ggml/src/ggml-quants.c) for
 * every finite input; float16 and bfloat16 sources are widened to float32
 * first (exact), as a caller of those float32 functions would. All the
 * arithmetic is float32, each operation rounded to nearest even (no fused
 * multiply-add), in the default floating-point environment (kvserde does not
 * set it: under directed rounding or flush-to-zero the bytes may differ from
 * the reference's and between kernel variants):
 *   q8_0  amax = the largest |x| of the block; d = amax / 127; id = 1 / d
 *         (0 when d is 0); q[j] = roundf(x[j] * id) (halves away from zero).
 *   q4_0  max = the first x of the block with the largest |x| (its sign
 *         kept; +0 when every |x| is 0, so such a block's d is -0, stored
 *         0x8000); d = max / -8; id = 1 / d (0 when d is 0);
 *         n[j] = min(15, trunc(x[j] * id + 8.5)).
 *   Both  the stored d is float16(d), round to nearest even: subnormal
 *         float16 scales are kept, a d above 65504 (|x| above about 8.3e6
 *         for q8_0, 5.2e5 for q4_0) is stored as infinity, as the reference
 *         does, and decodes to inf / NaN.
 * Blocks whose scale is so small that 1 / d overflows float32 (largest |x|
 * below about 2^-121 for q8_0, 2^-125 for q4_0: float32 subnormals and the
 * smallest normals) make the reference convert an infinity or NaN to an
 * integer, which C leaves undefined; kvserde writes code 0 for every element
 * of such a block (the bytes the reference writes when compiled for x86-64
 * without vectorization). Their float16 d is +-0, so they decode to zeros.
 * Non-finite input (NaN, +-inf) is refused with KVS_EINVAL naming the
 * element: the reference has no defined result for it (an infinity makes d
 * inf and every code undefined; a NaN is skipped by the maximum unless it
 * comes last, then lands in d, and its own code is undefined).
 *
 * Decoding is dequantize_row_q8_0 / dequantize_row_q4_0: value = code * d in
 * float32 (d widened exactly from float16), then rounded to nearest even to
 * a float16 or bfloat16 destination. Every byte pattern decodes: a NaN or
 * infinite d gives NaN / inf values, as the reference's dequantizers do.
 *
 * Error bound of a round trip (float32 destination), per element of a block
 * with largest magnitude amax: q8_0 at most 0.57 x amax / 127 (half a step,
 * plus the float16 rounding of d times up to 127 codes); q4_0 at most
 * 1.01 x amax / 8 (a whole step: the element of sign opposite to max's with
 * magnitude amax needs code 16 and is clamped to 15). A d in float16's
 * subnormal range (amax below about 2^-14 x 127 resp. x 8) adds up to
 * 2^-25 x 127 resp. x 8; a float16 / bfloat16 destination adds its own
 * rounding (2^-11 / 2^-8 relative).
 *
 * Kernels: a portable scalar reference defines the bytes; AVX2 + F16C and
 * AVX-512 variants are chosen at run time and are bit-identical to it. The
 * variant follows the fp8 kernels' choice (kvs_fp8_set_isa / KVSERDE_ISA in
 * fp8.h), so one switch picks the instruction set of every kernel.
 */
#ifndef KVSERDE_GGML_H
#define KVSERDE_GGML_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "export.h"
#include "serde.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvs_ggml_type {
    KVS_GGML_Q8_0 = 0,
    KVS_GGML_Q4_0 = 1,
} kvs_ggml_type;

/* Elements per block (both types). */
#define KVS_GGML_BLOCK 32
/* Bytes per block. */
#define KVS_GGML_Q8_0_BYTES 34
#define KVS_GGML_Q4_0_BYTES 18

/* Bytes of one block of `type` (34 or 18; 0 for an unknown type). */
KVS_API size_t kvs_ggml_block_bytes(kvs_ggml_type type);

/* "ggml_q8_0" / "ggml_q4_0" (NULL for an unknown type). */
KVS_API const char *kvs_ggml_type_name(kvs_ggml_type type);

/* Quantize n elements of src (float32, float16 or bfloat16; n a multiple of
 * 32) into n / 32 blocks of `type` at dst. Refused before a byte is written:
 * an n that is not a multiple of 32, an unsupported dtype or type
 * (KVS_EINVAL). A non-finite element is refused with KVS_EINVAL and its
 * index ("ggml_q8_0: element 70 is nan; ggml blocks need finite values");
 * the blocks before its block are written by then. src and dst must not
 * overlap. */
KVS_API int kvs_ggml_encode(const void *src, kvs_dtype src_dtype, uint8_t *dst,
                            kvs_ggml_type type, size_t n);

/* Dequantize n / 32 blocks of `type` at src into n elements of dst_dtype
 * (float32, float16 or bfloat16; n a multiple of 32). */
KVS_API int kvs_ggml_decode(const uint8_t *src, kvs_ggml_type type, void *dst,
                            kvs_dtype dst_dtype, size_t n);

/* The ggml serdes ("ggml_q8_0", "ggml_q4_0" in the registry; no kwargs).
 *
 * Serializer: every group of src (float32, float16 or bfloat16, the last
 * dimension a multiple of 32) is quantized in order and the blocks packed
 * back to back, no header: a group's bytes are those llama.cpp writes for
 * its rows. estimate_serialized_size is exact: elements / 32 x the block
 * size. A layout with a group whose last dimension is not a multiple of 32
 * (or with no dimension) is refused by both, before any byte is written
 * ("ggml_q4_0: group 0 [256x100 bfloat16]: the last dimension 100 is not a
 * multiple of 32"), as is an unsupported dtype (KVS_EINVAL).
 *
 * Deserializer: dst's layout says what was stored; src's used size must be
 * exactly its block bytes (KVS_ECORRUPT otherwise, dst untouched); each
 * group is decoded to its own dtype.
 *
 * Large objects may be converted by several of the processor's workers at
 * once (kvs_serde_parallel_for, serde.h); the bytes do not depend on it.
 * Either of ser / de may be NULL if that half is not wanted. */
KVS_API int kvs_ggml_serde_create(kvs_ggml_type type, kvs_serializer **ser,
                                  kvs_deserializer **de);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_GGML_H */
