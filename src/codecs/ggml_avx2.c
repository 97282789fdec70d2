/* ggml_avx2.c - AVX2 + F16C ggml block kernels, bit-identical to
 * ggml_scalar.c.
 *
 * Compiled with the flags of every *_avx2.c file (-mavx2 -mf16c -mfma
 * -mbmi2); the fp8 dispatcher checks them all before it picks "avx2", the
 * only way these kernels are chosen. One block (32 elements, four ymm of
 * float32) at a time, the same arithmetic as the AVX-512 variant (its top
 * comment): the block maximum as an integer maximum of |x|'s bits, d and id
 * in scalar float32, then the reference's float32 operations lane by lane,
 * each rounded on its own. AVX2 has no narrowing moves: the codes (within
 * [-127, 127], nibble bytes within [0, 255]) are packed with saturating
 * packs, which are exact for them, and a lane permute restores their order.
 * bfloat16 results are rounded to nearest even with integer operations (as
 * half.h; AVX2 has no bfloat16 conversion), float16 ones by vcvtps2ph.
 */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "codecs/ggml_kernels.h"

#define AI static inline __attribute__((always_inline))

/* Block b of src as four vectors of float32 (elements 0-7, ..., 24-31). */
AI void load_block(const void *src, int wide, size_t b, __m256 x[4])
{
    const uint8_t *p = (const uint8_t *)src + b * KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2);
    for (int i = 0; i < 4; i++) {
        if (wide == KVS_WIDE_F32)
            x[i] = _mm256_loadu_ps((const float *)(p + 32 * i));
        else if (wide == KVS_WIDE_F16)
            x[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16 * i)));
        else
            x[i] = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16 * i))), 16));
    }
}

AI void put_d(uint8_t *out, float d)
{
    uint16_t h = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    memcpy(out, &h, 2);
}

/* roundf lane by lane for |v| <= 128 (the AVX-512 file's round_away). */
AI __m256i round_away(__m256 v)
{
    const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u));
    __m256 bias = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(0.49999997f));
    return _mm256_cvttps_epi32(_mm256_add_ps(v, bias));
}

/* 32 int32 values (each within a byte's signed or unsigned range, as
 * `is_unsigned`) to 32 bytes in order. */
AI __m256i pack_bytes(__m256i a, __m256i b, __m256i c, __m256i d, int is_unsigned)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i v = is_unsigned ? _mm256_packus_epi16(ab, cd) : _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The input is prefetched KVS_FP8_PREFETCH_BYTES ahead (fp8_kernels.h)
 * while that stays inside the array. */
AI size_t encode_array(const void *src, uint8_t *dst, size_t nblocks, int type, int wide)
{
    const __m256i absmask = _mm256_set1_epi32(0x7FFFFFFF);
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    const size_t in_bytes = KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2); /* of a block */
    const size_t ahead = KVS_FP8_PREFETCH_BYTES / in_bytes;                  /* blocks */
    const size_t pf_end = nblocks > ahead + 1 ? nblocks - ahead - 1 : 0;
    for (size_t b = 0; b < nblocks; b++) {
        if (b <= pf_end) {
            const char *p = (const char *)src + (b + ahead) * in_bytes;
            for (size_t l = 0; l < in_bytes; l += 64) _mm_prefetch(p + l, _MM_HINT_T0);
        }
        __m256 x[4];
        __m256i a[4];
        load_block(src, wide, b, x);
        for (int i = 0; i < 4; i++) a[i] = _mm256_and_si256(_mm256_castps_si256(x[i]), absmask);
        __m256i m = _mm256_max_epu32(_mm256_max_epu32(a[0], a[1]), _mm256_max_epu32(a[2], a[3]));
        m = _mm256_max_epu32(m, _mm256_permute2x128_si256(m, m, 1));
        m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0x4E));
        m = _mm256_max_epu32(m, _mm256_shuffle_epi32(m, 0xB1));
        const uint32_t abits = (uint32_t)_mm256_cvtsi256_si32(m);
        if (abits >= 0x7F800000u) return b;
        uint8_t *out = dst + b * bb;
        float amax;
        memcpy(&amax, &abits, 4);
        if (type == KVS_GGML_Q8_0) {
            const float d = kvs_ggml_q8_0_scale(amax);
            const float id = kvs_ggml_inverse(d);
            put_d(out, d);
            __m256i q = _mm256_setzero_si256();
            if (!isinf(id)) {
                const __m256 vid = _mm256_set1_ps(id);
                __m256i r[4];
                for (int i = 0; i < 4; i++) r[i] = round_away(_mm256_mul_ps(x[i], vid));
                q = pack_bytes(r[0], r[1], r[2], r[3], 0);
            }
            _mm256_storeu_si256((__m256i *)(out + 2), q);
            continue;
        }
        float max = 0.0f;
        if (abits) {
            /* the first element with |x| = amax */
            const __m256i va = _mm256_set1_epi32((int)abits);
            uint32_t at = 0;
            for (int i = 0; i < 4; i++)
                at |= (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a[i], va)))
                      << (8 * i);
            unsigned j = (unsigned)__builtin_ctz(at);
            float lanes[8];
            _mm256_storeu_ps(lanes, x[j / 8]);
            max = lanes[j % 8];
        }
        const float d = kvs_ggml_q4_0_scale(max);
        const float id = kvs_ggml_inverse(d);
        put_d(out, d);
        __m128i q = _mm_setzero_si128();
        if (!isinf(id)) {
            const __m256 vid = _mm256_set1_ps(id), half = _mm256_set1_ps(8.5f);
            const __m256i fifteen = _mm256_set1_epi32(15);
            __m256i n[4];
            for (int i = 0; i < 4; i++)
                n[i] = _mm256_min_epi32(
                    _mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(x[i], vid), half)), fifteen);
            /* element j low, j + 16 high: bytes 0-7 from n[0] | n[2] << 4,
             * 8-15 from n[1] | n[3] << 4 */
            __m256i lo = _mm256_or_si256(n[0], _mm256_slli_epi32(n[2], 4));
            __m256i hi = _mm256_or_si256(n[1], _mm256_slli_epi32(n[3], 4));
            __m256i z = _mm256_setzero_si256();
            q = _mm256_castsi256_si128(pack_bytes(lo, hi, z, z, 1));
        }
        _mm_storeu_si128((__m128i *)(out + 2), q);
    }
    return nblocks;
}

/* float32 bits -> bfloat16 bits, round to nearest even; NaN quiet with its
 * sign and top payload bits (half.h's kvs_f32_bits_to_bf16_bits). */
AI __m256i to_bf16(__m256 v)
{
    const __m256i f = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(f, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(f, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(f, _mm256_set1_epi32(0x7FFFFFFF)),
                                     _mm256_set1_epi32(0x7F800000));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(f, 16), _mm256_set1_epi32(0x0040));
    return _mm256_blendv_epi8(r, q, nan);
}

AI void store_block(void *dst, int wide, size_t b, const __m256 y[4])
{
    uint8_t *p = (uint8_t *)dst + b * KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2);
    if (wide == KVS_WIDE_F32) {
        for (int i = 0; i < 4; i++) _mm256_storeu_ps((float *)(p + 32 * i), y[i]);
    } else if (wide == KVS_WIDE_F16) {
        for (int i = 0; i < 4; i++)
            _mm_storeu_si128((__m128i *)(p + 16 * i),
                             _mm256_cvtps_ph(y[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
        for (int i = 0; i < 4; i += 2) {
            __m256i v = _mm256_packus_epi32(to_bf16(y[i]), to_bf16(y[i + 1]));
            _mm256_storeu_si256((__m256i *)(p + 32 * (i / 2)), _mm256_permute4x64_epi64(v, 0xD8));
        }
    }
}

AI void decode_array(const uint8_t *src, void *dst, size_t nblocks, int type, int wide)
{
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    for (size_t b = 0; b < nblocks; b++) {
        const uint8_t *in = src + b * bb;
        uint16_t h;
        memcpy(&h, in, 2);
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
        __m256i q[4];
        if (type == KVS_GGML_Q8_0) {
            for (int i = 0; i < 4; i++)
                q[i] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(in + 2 + 8 * i)));
        } else {
            const __m256i eight = _mm256_set1_epi32(8), low = _mm256_set1_epi32(0x0F);
            for (int i = 0; i < 2; i++) {
                __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(in + 2 + 8 * i)));
                q[i] = _mm256_sub_epi32(_mm256_and_si256(v, low), eight);
                q[i + 2] = _mm256_sub_epi32(_mm256_srli_epi32(v, 4), eight);
            }
        }
        __m256 y[4];
        for (int i = 0; i < 4; i++) y[i] = _mm256_mul_ps(_mm256_cvtepi32_ps(q[i]), d);
        store_block(dst, wide, b, y);
    }
}

KVS_GGML_DEFINE_VARIANT(kvs_ggml_kernels_avx2, "avx2")
