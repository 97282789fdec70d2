/* ggml_avx512.c - AVX-512 ggml block kernels, bit-identical to
 * ggml_scalar.c.
 *
 * Compiled with the flags of every *_avx512.c file (CMakeLists.txt); it uses
 * AVX512F (zmm arithmetic, vpmovdb), AVX512_BF16 (vcvtne2ps2bf16) and F16C
 * (float16 scales and elements), all of which the fp8 dispatcher checks
 * before it picks "avx512", the only way these kernels are chosen.
 *
 * One block (32 elements, two zmm of float32) at a time: the block maximum
 * is an integer maximum of |x|'s bits (the order of non-negative floats),
 * which also catches non-finite values; d and id are computed in scalar
 * float32 exactly as the reference does; the codes are the reference's
 * float32 operations lane by lane, each rounded on its own (separate
 * multiply and add, never fused):
 *   roundf   t = trunc(v); t + copysign(1, v) where |v - t| >= 0.5 (v - t
 *            is exact: |v| <= 128);
 *   q4_0     min(15, trunc(x * id + 8.5)), the first lane holding the
 *            largest |x| giving max (vpcmpeqd, tzcnt).
 * Decoding: code * d in float32, then vcvtne2ps2bf16 / vcvtps2ph (round to
 * nearest even, NaN kept quiet with its sign, as half.h does; the products
 * are never float32 subnormals, which vcvtne2ps2bf16 would flush: the
 * smallest non-zero |d| is 2^-24).
 */
/* No fused multiply-add: GCC contracts only with -ffp-contract=fast, never
 * under -std=c11; clang needs to be told. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "codecs/ggml_kernels.h"

/* Block b of src as two vectors of float32 (elements 0-15, 16-31). */
static inline __attribute__((always_inline)) void load_block(const void *src, int wide,
                                                             size_t b, __m512 *lo, __m512 *hi)
{
    const uint8_t *p = (const uint8_t *)src + b * KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2);
    if (wide == KVS_WIDE_F32) {
        *lo = _mm512_loadu_ps(p);
        *hi = _mm512_loadu_ps(p + 64);
    } else if (wide == KVS_WIDE_F16) {
        *lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        *hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
    } else {
        __m512i v = _mm512_loadu_si512(p);
        *lo = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
        *hi = _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
    }
}

static inline __attribute__((always_inline)) void put_d(uint8_t *out, float d)
{
    uint16_t h = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    memcpy(out, &h, 2);
}

/* roundf lane by lane: halves away from zero. */
static inline __attribute__((always_inline)) __m512i round_away(__m512 v)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    __m512 frac = _mm512_abs_ps(_mm512_sub_ps(v, t));
    __mmask16 up = _mm512_cmp_ps_mask(frac, _mm512_set1_ps(0.5f), _CMP_GE_OQ);
    __m512 one = _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(v), sign),
                        _mm512_castps_si512(_mm512_set1_ps(1.0f))));
    return _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, one));
}

static inline __attribute__((always_inline)) size_t encode_array(const void *src, uint8_t *dst,
                                                                 size_t nblocks, int type,
                                                                 int wide)
{
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    for (size_t b = 0; b < nblocks; b++) {
        __m512 lo, hi;
        load_block(src, wide, b, &lo, &hi);
        __m512i alo = _mm512_and_si512(_mm512_castps_si512(lo), absmask);
        __m512i ahi = _mm512_and_si512(_mm512_castps_si512(hi), absmask);
        uint32_t abits = _mm512_reduce_max_epu32(_mm512_max_epu32(alo, ahi));
        if (abits >= 0x7F800000u) return b;
        uint8_t *out = dst + b * bb;
        float amax;
        memcpy(&amax, &abits, 4);
        if (type == KVS_GGML_Q8_0) {
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            put_d(out, d);
            __m128i qlo = _mm_setzero_si128(), qhi = _mm_setzero_si128();
            if (!isinf(id)) {
                const __m512 vid = _mm512_set1_ps(id);
                qlo = _mm512_cvtepi32_epi8(round_away(_mm512_mul_ps(lo, vid)));
                qhi = _mm512_cvtepi32_epi8(round_away(_mm512_mul_ps(hi, vid)));
            }
            _mm_storeu_si128((__m128i *)(out + 2), qlo);
            _mm_storeu_si128((__m128i *)(out + 18), qhi);
        } else {
            float max = 0.0f;
            if (abits) {
                const __m512i va = _mm512_set1_epi32((int)abits);
                uint32_t at = (uint32_t)_mm512_cmpeq_epi32_mask(alo, va) |
                              (uint32_t)_mm512_cmpeq_epi32_mask(ahi, va) << 16;
                unsigned j = (unsigned)__builtin_ctz(at);
                __m512 from = j < 16 ? lo : hi;
                max = _mm_cvtss_f32(_mm512_castps512_ps128(
                    _mm512_permutexvar_ps(_mm512_set1_epi32((int)(j & 15)), from)));
            }
            const float d = max / -8.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            put_d(out, d);
            __m128i q = _mm_setzero_si128();
            if (!isinf(id)) {
                const __m512 vid = _mm512_set1_ps(id), half = _mm512_set1_ps(8.5f);
                const __m512i fifteen = _mm512_set1_epi32(15);
                __m512i nlo = _mm512_min_epi32(
                    _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(lo, vid), half)), fifteen);
                __m512i nhi = _mm512_min_epi32(
                    _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(hi, vid), half)), fifteen);
                q = _mm512_cvtepi32_epi8(_mm512_or_si512(nlo, _mm512_slli_epi32(nhi, 4)));
            }
            _mm_storeu_si128((__m128i *)(out + 2), q);
        }
    }
    return nblocks;
}

static inline __attribute__((always_inline)) void store_block(void *dst, int wide, size_t b,
                                                              __m512 lo, __m512 hi)
{
    uint8_t *p = (uint8_t *)dst + b * KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2);
    if (wide == KVS_WIDE_F32) {
        _mm512_storeu_ps(p, lo);
        _mm512_storeu_ps(p + 64, hi);
    } else if (wide == KVS_WIDE_F16) {
        _mm256_storeu_si256((__m256i *)p,
                            _mm512_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm256_storeu_si256((__m256i *)(p + 32),
                            _mm512_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
        _mm512_storeu_si512(p, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

static inline __attribute__((always_inline)) void decode_array(const uint8_t *src, void *dst,
                                                               size_t nblocks, int type,
                                                               int wide)
{
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    for (size_t b = 0; b < nblocks; b++) {
        const uint8_t *in = src + b * bb;
        uint16_t h;
        memcpy(&h, in, 2);
        const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
        __m512i qlo, qhi;
        if (type == KVS_GGML_Q8_0) {
            qlo = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(in + 2)));
            qhi = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(in + 18)));
        } else {
            const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(in + 2)));
            const __m512i eight = _mm512_set1_epi32(8);
            qlo = _mm512_sub_epi32(_mm512_and_si512(bytes, _mm512_set1_epi32(0x0F)), eight);
            qhi = _mm512_sub_epi32(_mm512_srli_epi32(bytes, 4), eight);
        }
        store_block(dst, wide, b, _mm512_mul_ps(_mm512_cvtepi32_ps(qlo), d),
                    _mm512_mul_ps(_mm512_cvtepi32_ps(qhi), d));
    }
}

KVS_GGML_DEFINE_VARIANT(kvs_ggml_kernels_avx512, "avx512")
