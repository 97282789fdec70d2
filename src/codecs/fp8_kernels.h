/* fp8_kernels.h - internal: the table of fp8 array kernels one ISA variant
 * provides, and the dispatcher that picks a variant.
 *
 * Indexes: fp8 format 0 = float8_e4m3fn, 1 = float8_e5m2; wide type
 * 0 = float32, 1 = float16, 2 = bfloat16. Every variant must produce exactly
 * the bytes of the scalar variant for every input (see include/kvserde/fp8.h
 * for the semantics). Kernels accept any n (including 0) and any alignment.
 */
#ifndef KVSERDE_FP8_KERNELS_H
#define KVSERDE_FP8_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "kvserde/dtype.h"
#include "kvserde/memobj.h"

enum { KVS_FP8_FMT_E4M3FN = 0, KVS_FP8_FMT_E5M2 = 1, KVS_FP8_NFMT = 2 };
enum { KVS_WIDE_F32 = 0, KVS_WIDE_F16 = 1, KVS_WIDE_BF16 = 2, KVS_NWIDE = 3 };

typedef void (*kvs_fp8_encode_fn)(const void *src, uint8_t *dst, size_t n,
                                  int saturate);
typedef void (*kvs_fp8_decode_fn)(const uint8_t *src, void *dst, size_t n);
/* encode, the codes also written to `copy` (n bytes, ordinary stores) while
 * dst gets non-temporal stores whatever n is: for a large output that is
 * not read again soon (a frame's payload) whose bytes a checksum must still
 * read from cache, block by block (pipeline.c). */
typedef void (*kvs_fp8_encode_copy_fn)(const void *src, uint8_t *dst, uint8_t *copy, size_t n,
                                       int saturate);

/* n byte codes -> n 16-bit values through a table of 128: value(c) =
 * hi[c & 0x7F] << 8 | lo[c & 0x7F], with the code's bit 7 OR-ed into bit 15
 * (a table of a sign-symmetric function of an fp8 code, like the decoders'
 * own). lo and hi 64-byte aligned; any n, any alignment of src and dst;
 * the store policy below. kv_split's scaled reads use it. */
typedef void (*kvs_fp8_lut16_fn)(const uint8_t *src, void *dst, size_t n, const uint8_t *lo,
                                 const uint8_t *hi);

typedef struct kvs_fp8_kernels {
    const char *isa; /* "scalar", "avx2", "avx512", "avx512fp16" */
    kvs_fp8_encode_fn encode[KVS_FP8_NFMT][KVS_NWIDE];
    kvs_fp8_decode_fn decode[KVS_FP8_NFMT][KVS_NWIDE];
    kvs_fp8_encode_copy_fn encode_copy[KVS_FP8_NFMT][KVS_NWIDE]; /* NULL: none (scalar) */
    kvs_fp8_lut16_fn lut16; /* NULL: none (scalar, avx2) */
} kvs_fp8_kernels;

/* The variants. The scalar one always exists; the others return NULL when
 * not compiled in (non-x86 build). They do not check the CPU. */
const kvs_fp8_kernels *kvs_fp8_kernels_scalar(void);
const kvs_fp8_kernels *kvs_fp8_kernels_avx2(void);
const kvs_fp8_kernels *kvs_fp8_kernels_avx512(void);
const kvs_fp8_kernels *kvs_fp8_kernels_avx512fp16(void);

/* The variant in use (chosen once: KVSERDE_ISA, else the best available).
 * Fails (KVS_EINVAL / KVS_EUNSUPPORTED, message set) when KVSERDE_ISA names
 * a variant that is unknown or cannot run on this CPU. */
int kvs_fp8_kernels_get(const kvs_fp8_kernels **out);

/* Store policy, shared by every SIMD variant (decided per kernel call, from
 * the bytes that one call writes): a call writing at least
 * kvs_fp8_nt_min_bytes() uses non-temporal (streaming) stores, full 64-byte
 * lines after a head that aligns the destination; smaller outputs use
 * ordinary stores, because the output of a small object is read again at
 * once (checksum, frame, network) and should still be in the caches. The
 * default was measured with bench_fp8 --nt-sweep (docs/performance.md):
 * ordinary stores win up to 4 MiB when the output is read back, NT wins
 * from 16 MiB, 8 MiB is a wash. Keep it at most the output of one piece of a
 * parallel split (KVS_SPLIT_DEFAULT_CHUNK_BYTES of bfloat16: 8 MiB), so the
 * pieces of a large object stream too. kvs_fp8_set_nt_min_bytes() is for
 * tests and the benchmark (0: always stream, SIZE_MAX: never); it is not
 * synchronized with kernels running at the time, which read it once. */
#define KVS_FP8_NT_DEFAULT_MIN_BYTES ((size_t)8 << 20)
size_t kvs_fp8_nt_min_bytes(void);
void kvs_fp8_set_nt_min_bytes(size_t bytes);

/* Encoders prefetch their input this many bytes ahead (software prefetch
 * into L1): the hardware prefetchers alone left the AVX-512 bfloat16
 * encoder at about 0.6 of the streaming limit, its loads waiting on memory
 * while the arithmetic of earlier blocks could have run (docs/performance.md). */
#define KVS_FP8_PREFETCH_BYTES 4096

/* kvs_fp8_encode (kvserde/fp8.h), the codes also left in copy[0..n)
 * (kvs_fp8_encode_copy_fn above: dst streamed, copy in cache). */
int kvs_fp8_encode_copy(const void *src, kvs_dtype src_dtype, uint8_t *dst, uint8_t *copy,
                        kvs_dtype fp8_dtype, int saturate, size_t n);

/* The active variant's lut16 (above), or the same values element by element
 * where it has none. Fails only when the kernels cannot run
 * (kvs_fp8_kernels_get). */
int kvs_fp8_lut16(const uint8_t *src, void *dst, size_t n, const uint8_t *lo, const uint8_t *hi);

/* Map dtypes to table indexes; -1 if not an fp8 / wide dtype. */
int kvs_fp8_fmt_index(kvs_dtype dtype);

/* Object-level conversion, shared by the fp8 serde and the pipeline's fp8
 * stage (fp8_serde.c). check_layout: every group a float dtype the kernels
 * convert (`role` "source" / "destination" names it in the message);
 * kernels_ready: the kernels can run. convert_range: elements [begin, end)
 * of `wide` (counted through its groups) <-> codes[begin, end) on this
 * thread, encoding unless `decode`, and when encoding with `copy` not NULL
 * the codes also in copy[0 .. end - begin) (kvs_fp8_encode_copy); convert_all:
 * the whole object, which
 * may be spread over the processor's workers (kvs_serde_parallel_for). */
int kvs_fp8_check_layout(const kvs_layout *layout, const char *role);
int kvs_fp8_kernels_ready(const kvs_layout *layout);
int kvs_fp8_convert_range(const kvs_memobj *wide, uint8_t *codes, uint8_t *copy,
                          kvs_dtype fp8_dtype, int saturate, int decode, uint64_t begin,
                          uint64_t end);
int kvs_fp8_convert_all(const kvs_memobj *wide, uint8_t *codes, kvs_dtype fp8_dtype,
                        int saturate, int decode);
int kvs_fp8_wide_index(kvs_dtype dtype);

/* Scalar element conversions (the reference), used by the scalar kernels and
 * by SIMD kernels for their tails if they wish. */
uint8_t kvs_fp8_e4m3fn_from_f32(float x, int saturate);
uint8_t kvs_fp8_e5m2_from_f32(float x, int saturate);
float kvs_fp8_e4m3fn_to_f32(uint8_t code);
float kvs_fp8_e5m2_to_f32(uint8_t code);

/* A SIMD variant is written as two generic array functions, static and
 * always inline in its own file:
 *     encode_array(const void *src, uint8_t *dst, uint8_t *copy, size_t n,
 *                  int wide, int fmt, int saturate)   (copy NULL: encode)
 *     decode_array(const uint8_t *src, void *dst, size_t n, int wide, int fmt)
 * KVS_FP8_DEFINE_VARIANT(accessor, "isa", lut16 or NULL) then defines its 18 table entries
 * (each with constant wide / fmt / saturate, so the compiler folds every
 * branch on them), its table, and `const kvs_fp8_kernels *accessor(void)`. */
#define KVS_FP8_ENCODER_(name, wide, fmt)                                        \
    static void name(const void *src, uint8_t *dst, size_t n, int saturate)      \
    {                                                                            \
        if (saturate)                                                            \
            encode_array(src, dst, NULL, n, wide, fmt, 1);                       \
        else                                                                     \
            encode_array(src, dst, NULL, n, wide, fmt, 0);                       \
    }                                                                            \
    static void name##_copy(const void *src, uint8_t *dst, uint8_t *copy, size_t n, \
                            int saturate)                                        \
    {                                                                            \
        if (saturate)                                                            \
            encode_array(src, dst, copy, n, wide, fmt, 1);                       \
        else                                                                     \
            encode_array(src, dst, copy, n, wide, fmt, 0);                       \
    }
#define KVS_FP8_DECODER_(name, wide, fmt)                                        \
    static void name(const uint8_t *src, void *dst, size_t n)                    \
    {                                                                            \
        decode_array(src, dst, n, wide, fmt);                                    \
    }
#define KVS_FP8_DEFINE_VARIANT(accessor, isa_name, lut16_fn)                     \
    KVS_FP8_ENCODER_(e4m3fn_from_f32, KVS_WIDE_F32, KVS_FP8_FMT_E4M3FN)          \
    KVS_FP8_ENCODER_(e4m3fn_from_f16, KVS_WIDE_F16, KVS_FP8_FMT_E4M3FN)          \
    KVS_FP8_ENCODER_(e4m3fn_from_bf16, KVS_WIDE_BF16, KVS_FP8_FMT_E4M3FN)        \
    KVS_FP8_ENCODER_(e5m2_from_f32, KVS_WIDE_F32, KVS_FP8_FMT_E5M2)              \
    KVS_FP8_ENCODER_(e5m2_from_f16, KVS_WIDE_F16, KVS_FP8_FMT_E5M2)              \
    KVS_FP8_ENCODER_(e5m2_from_bf16, KVS_WIDE_BF16, KVS_FP8_FMT_E5M2)            \
    KVS_FP8_DECODER_(e4m3fn_to_f32, KVS_WIDE_F32, KVS_FP8_FMT_E4M3FN)            \
    KVS_FP8_DECODER_(e4m3fn_to_f16, KVS_WIDE_F16, KVS_FP8_FMT_E4M3FN)            \
    KVS_FP8_DECODER_(e4m3fn_to_bf16, KVS_WIDE_BF16, KVS_FP8_FMT_E4M3FN)          \
    KVS_FP8_DECODER_(e5m2_to_f32, KVS_WIDE_F32, KVS_FP8_FMT_E5M2)                \
    KVS_FP8_DECODER_(e5m2_to_f16, KVS_WIDE_F16, KVS_FP8_FMT_E5M2)                \
    KVS_FP8_DECODER_(e5m2_to_bf16, KVS_WIDE_BF16, KVS_FP8_FMT_E5M2)              \
    static const kvs_fp8_kernels variant_table_ = {                              \
        .isa = isa_name,                                                         \
        .encode = {{[KVS_WIDE_F32] = e4m3fn_from_f32,                            \
                    [KVS_WIDE_F16] = e4m3fn_from_f16,                            \
                    [KVS_WIDE_BF16] = e4m3fn_from_bf16},                         \
                   {[KVS_WIDE_F32] = e5m2_from_f32,                              \
                    [KVS_WIDE_F16] = e5m2_from_f16,                              \
                    [KVS_WIDE_BF16] = e5m2_from_bf16}},                          \
        .decode = {{[KVS_WIDE_F32] = e4m3fn_to_f32,                              \
                    [KVS_WIDE_F16] = e4m3fn_to_f16,                              \
                    [KVS_WIDE_BF16] = e4m3fn_to_bf16},                           \
                   {[KVS_WIDE_F32] = e5m2_to_f32,                                \
                    [KVS_WIDE_F16] = e5m2_to_f16,                                \
                    [KVS_WIDE_BF16] = e5m2_to_bf16}},                            \
        .encode_copy = {{[KVS_WIDE_F32] = e4m3fn_from_f32_copy,                  \
                         [KVS_WIDE_F16] = e4m3fn_from_f16_copy,                  \
                         [KVS_WIDE_BF16] = e4m3fn_from_bf16_copy},               \
                        {[KVS_WIDE_F32] = e5m2_from_f32_copy,                    \
                         [KVS_WIDE_F16] = e5m2_from_f16_copy,                    \
                         [KVS_WIDE_BF16] = e5m2_from_bf16_copy}},                \
        .lut16 = lut16_fn,                                                       \
    };                                                                           \
    const kvs_fp8_kernels *accessor(void) { return &variant_table_; }

#endif /* KVSERDE_FP8_KERNELS_H */
