/* kvserde/fp8.h - fp8 conversion kernels and the fp8 serde (upstream fp8.py).
 *
 * Formats (OCP 8-bit floating point):
 *   float8_e4m3fn  sign | 4-bit exponent (bias 7) | 3-bit mantissa. No
 *                  infinity; 0x7F / 0xFF are NaN; largest finite 448 (0x7E).
 *   float8_e5m2    sign | 5-bit exponent (bias 15) | 2-bit mantissa. 0x7C is
 *                  infinity, 0x7D..0x7F NaN; largest finite 57344 (0x7B).
 *
 * Encoding (float32, float16 or bfloat16 -> fp8): float16 and bfloat16 are
 * widened to float32 first (exact, so there is no double rounding), then
 * rounded to nearest, ties to even. Subnormals and -0 are kept. Overflow
 * follows the `saturate` policy:
 *   saturate != 0  every value whose magnitude rounds past the largest finite
 *                  value, and +-inf, becomes +-max (0x7E|sign for e4m3fn,
 *                  0x7B|sign for e5m2); NaN becomes 0x7F|sign.
 *   saturate == 0  bit-identical to PyTorch <= 2.11 CPU tensor.to(float8_*):
 *                  e4m3fn: |x| > 464, +-inf and NaN become 0x7F|sign (464
 *                  itself rounds to 448); e5m2: |x| >= 61440 and +-inf
 *                  become 0x7C|sign, NaN becomes 0x7F|sign.
 * Decoding (fp8 -> float32, float16 or bfloat16) is exact for every non-NaN
 * code (every fp8 value is representable in all three); a NaN code becomes
 * the quiet NaN of the same sign (0x7FC00000, 0x7E00, 0x7FC0, with the sign
 * bit set for negative codes).
 *
 * Kernels: a portable scalar implementation defines correctness; SIMD
 * variants (AVX2+F16C, AVX-512) are chosen at run time and are bit-identical
 * to it. The environment variable KVSERDE_ISA=scalar|avx2|avx512, read once
 * when a kernel is first used, forces a variant.
 */
#ifndef KVSERDE_FP8_H
#define KVSERDE_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "export.h"
#include "serde.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest finite magnitudes. */
#define KVS_FP8_E4M3FN_MAX 448.0f
#define KVS_FP8_E5M2_MAX 57344.0f

/* Encode n elements of src (src_dtype: float32, float16 or bfloat16) into n
 * fp8 codes of fp8_dtype (float8_e4m3fn or float8_e5m2). An unsupported
 * dtype is refused with KVS_EINVAL and its name ("fp8: unsupported source
 * dtype 'uint8'"). src and dst must not overlap. */
KVS_API int kvs_fp8_encode(const void *src, kvs_dtype src_dtype, uint8_t *dst,
                           kvs_dtype fp8_dtype, int saturate, size_t n);

/* Decode n fp8 codes into n elements of dst_dtype (float32, float16 or
 * bfloat16). */
KVS_API int kvs_fp8_decode(const uint8_t *src, kvs_dtype fp8_dtype, void *dst,
                           kvs_dtype dst_dtype, size_t n);

/* One element, through the scalar reference (any other dtype gives 0). */
KVS_API uint8_t kvs_fp8_from_float(float x, kvs_dtype fp8_dtype, int saturate);
KVS_API float kvs_fp8_to_float(uint8_t code, kvs_dtype fp8_dtype);

/* The kernel variant in use: "scalar", "avx2", "avx512" or "avx512fp16"
 * (the avx512 kernels, with float16 arithmetic for float16 -> e4m3fn, on
 * CPUs with AVX512-FP16) ("none" when
 * KVSERDE_ISA named a variant this CPU lacks: conversions then fail with
 * KVS_EUNSUPPORTED until kvs_fp8_set_isa() picks one). */
KVS_API const char *kvs_fp8_isa(void);

/* Force a kernel variant (a name kvs_fp8_isa_names() lists, or "auto" for the best
 * the CPU supports). Refused with KVS_EUNSUPPORTED if this CPU or build lacks
 * it, KVS_EINVAL for an unknown name; the variant in use is then unchanged.
 * Not meant to be called while conversions run on other threads. */
KVS_API int kvs_fp8_set_isa(const char *name);

/* 1 if the variant named is compiled in and supported by this CPU. */
KVS_API int kvs_fp8_isa_available(const char *name);

/* The names of every kernel variant kvserde knows, available here or not,
 * from the portable one to the widest, NULL-terminated: "scalar", "avx2",
 * "avx512", "avx512fp16". */
KVS_API const char *const *kvs_fp8_isa_names(void);

/* The fp8 serde.
 *
 * Serializer: every group of src is converted in order and packed back to
 * back, one byte per element, no header (the bytes upstream writes); sets
 * *nwritten to the element count. Refused before a byte is written if dst's
 * capacity is smaller than the element count (KVS_ENOSPC) or a group's dtype
 * is not float32/float16/bfloat16 (KVS_EINVAL). estimate_serialized_size =
 * floor(1.5 x elements), from the layout alone.
 *
 * Deserializer: element count, shapes and dtypes come from dst's layout;
 * src's used size must be exactly that many bytes: a stored object of more
 * or fewer bytes (one stored from another layout) is refused with
 * KVS_ECORRUPT ("fp8: stored object is 131072 bytes, destination layout
 * needs 98304"), dst untouched; each group is decoded to its own dtype.
 *
 * Both are written to *ser / *de; either pointer may be NULL if that half is
 * not wanted. fp8_dtype must be float8_e4m3fn or float8_e5m2. */
KVS_API int kvs_fp8_serde_create(kvs_dtype fp8_dtype, int saturate,
                                 kvs_serializer **ser, kvs_deserializer **de);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_FP8_H */
