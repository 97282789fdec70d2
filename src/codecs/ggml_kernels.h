/* ggml_kernels.h - internal: the table of ggml block kernels (q8_0, q4_0)
 * one ISA variant provides, the choice of variant, and the object-level
 * conversion the serde and the pipeline stages share.
 *
 * Indexes: type 0 = q8_0, 1 = q4_0 (kvs_ggml_type); wide type as in
 * fp8_kernels.h (0 float32, 1 float16, 2 bfloat16). Every variant must
 * produce exactly the bytes of the scalar variant for every input
 * (include/kvserde/ggml.h gives the semantics). Kernels take any number of
 * blocks (0 included) at any alignment.
 */
#ifndef KVSERDE_GGML_KERNELS_H
#define KVSERDE_GGML_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "codecs/fp8_kernels.h"
#include "kvserde/ggml.h"
#include "kvserde/memobj.h"

enum { KVS_GGML_NTYPES = 2 };

/* Quantize nblocks blocks of 32 elements. Returns nblocks, or the index of
 * the first block holding a non-finite element (blocks before it written,
 * that one and those after not). */
typedef size_t (*kvs_ggml_encode_fn)(const void *src, uint8_t *dst, size_t nblocks);
/* Dequantize nblocks blocks. Every input decodes. */
typedef void (*kvs_ggml_decode_fn)(const uint8_t *src, void *dst, size_t nblocks);

typedef struct kvs_ggml_kernels {
    const char *isa; /* "scalar", "avx2", "avx512" */
    kvs_ggml_encode_fn encode[KVS_GGML_NTYPES][KVS_NWIDE];
    kvs_ggml_decode_fn decode[KVS_GGML_NTYPES][KVS_NWIDE];
} kvs_ggml_kernels;

/* The variants; the SIMD ones are compiled in on x86 only. None checks the
 * CPU. */
const kvs_ggml_kernels *kvs_ggml_kernels_scalar(void);
const kvs_ggml_kernels *kvs_ggml_kernels_avx2(void);
const kvs_ggml_kernels *kvs_ggml_kernels_avx512(void);

/* The variant in use: the one of the fp8 kernels' choice (scalar, avx2,
 * avx512: kvs_fp8_kernels_get, which refuses a KVSERDE_ISA this CPU cannot
 * run). */
int kvs_ggml_kernels_get(const kvs_ggml_kernels **out);

/* The reference's scales, in float32, shared by every variant: q8_0 d from
 * the block's largest |x|, q4_0 d from its signed max, and id = 1 / d (0
 * when d is 0). */
static inline float kvs_ggml_q8_0_scale(float amax)
{
    return amax / 127.0f;
}

static inline float kvs_ggml_q4_0_scale(float max)
{
    return max / -8.0f;
}

static inline float kvs_ggml_inverse(float d)
{
    return d != 0.0f ? 1.0f / d : 0.0f;
}

/* The scalar reference for one block, shared by the scalar kernels and
 * the SIMD variants' tests: x holds 32 float32 values, all finite. */
void kvs_ggml_q8_0_block(const float *x, uint8_t *out);
void kvs_ggml_q4_0_block(const float *x, uint8_t *out);

/* Object level (ggml_serde.c), shared by the ggml serdes and the pipeline's
 * ggml stages. check_layout: every group float32 / float16 / bfloat16 with
 * a last dimension that is a multiple of 32 (`role` "source" / "destination"
 * names it in messages); the kernels can run. nbytes: the exact block bytes
 * of a checked layout. convert_all: the whole object, encoding `wide` into
 * `blocks` unless `decode`, spread over the processor's workers when large
 * (kvs_serde_parallel_for); encoding refuses a non-finite element with its
 * group and index. */
int kvs_ggml_check_layout(kvs_ggml_type type, const kvs_layout *layout, const char *role);
uint64_t kvs_ggml_nbytes(kvs_ggml_type type, const kvs_layout *layout);
int kvs_ggml_convert_all(kvs_ggml_type type, const kvs_memobj *wide, uint8_t *blocks,
                         int decode);
/* The whole of a serialize / deserialize, checks first: encode_object
 * quantizes src into out[0..cap) (*n = the bytes, exactly nbytes; KVS_ENOSPC
 * when cap is short); decode_object refuses in[0..n) unless n is exactly
 * what dst's layout needs (KVS_ECORRUPT) and dst holds its layout
 * (KVS_ENOSPC), before writing any byte of dst. */
int kvs_ggml_encode_object(kvs_ggml_type type, const kvs_memobj *src, uint8_t *out, size_t cap,
                           size_t *n);
int kvs_ggml_decode_object(kvs_ggml_type type, const uint8_t *in, size_t n, kvs_memobj *dst);

/* A variant is written as two generic array functions, static and always
 * inline in its own file:
 *     size_t encode_array(const void *src, uint8_t *dst, size_t nblocks,
 *                         int type, int wide)
 *     void decode_array(const uint8_t *src, void *dst, size_t nblocks,
 *                       int type, int wide)
 * KVS_GGML_DEFINE_VARIANT(accessor, "isa") then defines its 12 table
 * entries (each with constant type / wide, so the compiler folds every
 * branch on them), its table, and `const kvs_ggml_kernels *accessor(void)`. */
#define KVS_GGML_ENCODER_(name, type, wide)                                      \
    static size_t name(const void *src, uint8_t *dst, size_t nblocks)            \
    {                                                                            \
        return encode_array(src, dst, nblocks, type, wide);                      \
    }
#define KVS_GGML_DECODER_(name, type, wide)                                      \
    static void name(const uint8_t *src, void *dst, size_t nblocks)              \
    {                                                                            \
        decode_array(src, dst, nblocks, type, wide);                             \
    }
#define KVS_GGML_DEFINE_VARIANT(accessor, isa_name)                              \
    KVS_GGML_ENCODER_(q8_0_from_f32, KVS_GGML_Q8_0, KVS_WIDE_F32)                \
    KVS_GGML_ENCODER_(q8_0_from_f16, KVS_GGML_Q8_0, KVS_WIDE_F16)                \
    KVS_GGML_ENCODER_(q8_0_from_bf16, KVS_GGML_Q8_0, KVS_WIDE_BF16)              \
    KVS_GGML_ENCODER_(q4_0_from_f32, KVS_GGML_Q4_0, KVS_WIDE_F32)                \
    KVS_GGML_ENCODER_(q4_0_from_f16, KVS_GGML_Q4_0, KVS_WIDE_F16)                \
    KVS_GGML_ENCODER_(q4_0_from_bf16, KVS_GGML_Q4_0, KVS_WIDE_BF16)              \
    KVS_GGML_DECODER_(q8_0_to_f32, KVS_GGML_Q8_0, KVS_WIDE_F32)                  \
    KVS_GGML_DECODER_(q8_0_to_f16, KVS_GGML_Q8_0, KVS_WIDE_F16)                  \
    KVS_GGML_DECODER_(q8_0_to_bf16, KVS_GGML_Q8_0, KVS_WIDE_BF16)                \
    KVS_GGML_DECODER_(q4_0_to_f32, KVS_GGML_Q4_0, KVS_WIDE_F32)                  \
    KVS_GGML_DECODER_(q4_0_to_f16, KVS_GGML_Q4_0, KVS_WIDE_F16)                  \
    KVS_GGML_DECODER_(q4_0_to_bf16, KVS_GGML_Q4_0, KVS_WIDE_BF16)                \
    static const kvs_ggml_kernels variant_table_ = {                             \
        .isa = isa_name,                                                         \
        .encode = {{q8_0_from_f32, q8_0_from_f16, q8_0_from_bf16},               \
                   {q4_0_from_f32, q4_0_from_f16, q4_0_from_bf16}},              \
        .decode = {{q8_0_to_f32, q8_0_to_f16, q8_0_to_bf16},                     \
                   {q4_0_to_f32, q4_0_to_f16, q4_0_to_bf16}},                    \
    };                                                                           \
    const kvs_ggml_kernels *accessor(void) { return &variant_table_; }

#endif /* KVSERDE_GGML_KERNELS_H */
