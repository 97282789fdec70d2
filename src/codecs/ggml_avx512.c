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

/* roundf lane by lane (halves away from zero), for |v| <= 128:
 * trunc(v + copysign(0.5 - 2^-25, v)). The sum is rounded once more, but
 * never across an integer it should not reach: below a half, v + 0.5 -
 * 2^-25 stays under the next integer by at least 2^-25 and that integer's
 * neighbour below is representable (spacing at most 2^-17 here, and the
 * sum rounds to it or stays), while an exact half, v = n + 0.5, sums to
 * n + 1 - 2^-25, a tie or nearer to n + 1, which rounds up to it (even). */
static inline __attribute__((always_inline)) __m512i round_away(__m512 v)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512i almost_half = _mm512_castps_si512(_mm512_set1_ps(0.49999997f));
    __m512 bias = _mm512_castsi512_ps(
        _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(v), sign), almost_half));
    return _mm512_cvttps_epi32(_mm512_add_ps(v, bias));
}

/* q8_0 codes of a block (vid: id in every lane; an infinite id wants code
 * 0 for every element: zero_codes) at out + 2. */
static inline __attribute__((always_inline)) void store_q8_codes(uint8_t *out, __m512 lo,
                                                                 __m512 hi, __m512 vid,
                                                                 int zero_codes)
{
    __m128i qlo = _mm_setzero_si128(), qhi = _mm_setzero_si128();
    if (!zero_codes) {
        qlo = _mm512_cvtepi32_epi8(round_away(_mm512_mul_ps(lo, vid)));
        qhi = _mm512_cvtepi32_epi8(round_away(_mm512_mul_ps(hi, vid)));
    }
    _mm_storeu_si128((__m128i *)(out + 2), qlo);
    _mm_storeu_si128((__m128i *)(out + 18), qhi);
}

/* q4_0 nibbles of a block: min(15, trunc(x * id + 8.5)), element j low and
 * j + 16 high, at out + 2 (zero_codes as above). */
static inline __attribute__((always_inline)) void store_q4_codes(uint8_t *out, __m512 lo,
                                                                 __m512 hi, __m512 vid,
                                                                 int zero_codes)
{
    __m128i q = _mm_setzero_si128();
    if (!zero_codes) {
        const __m512 half = _mm512_set1_ps(8.5f);
        const __m512i fifteen = _mm512_set1_epi32(15);
        __m512i nlo = _mm512_min_epi32(
            _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(lo, vid), half)), fifteen);
        __m512i nhi = _mm512_min_epi32(
            _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(hi, vid), half)), fifteen);
        q = _mm512_cvtepi32_epi8(_mm512_or_si512(nlo, _mm512_slli_epi32(nhi, 4)));
    }
    _mm_storeu_si128((__m128i *)(out + 2), q);
}

/* q4_0: whether max, the first element with |x| = amax (bits, non-zero), is
 * negative. */
static inline __attribute__((always_inline)) int first_max_negative(__m512 lo, __m512 hi,
                                                                   uint32_t amax)
{
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512i signbit = _mm512_set1_epi32((int)0x80000000u);
    const __m512i va = _mm512_set1_epi32((int)amax);
    const __m512i l = _mm512_castps_si512(lo), h = _mm512_castps_si512(hi);
    uint32_t at = (uint32_t)_mm512_cmpeq_epi32_mask(_mm512_and_si512(l, absmask), va) |
                  (uint32_t)_mm512_cmpeq_epi32_mask(_mm512_and_si512(h, absmask), va) << 16;
    uint32_t sg = (uint32_t)_mm512_test_epi32_mask(l, signbit) |
                  (uint32_t)_mm512_test_epi32_mask(h, signbit) << 16;
    return (sg >> __builtin_ctz(at)) & 1;
}

/* Blocks [begin, end) one at a time, each reducing its own maximum: the
 * tail of an array, and a group of 16 holding a non-finite value (the
 * return value is then its block). */
static inline __attribute__((always_inline)) size_t encode_one_by_one(const void *src,
                                                                      uint8_t *dst,
                                                                      size_t begin, size_t end,
                                                                      int type, int wide)
{
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    for (size_t b = begin; b < end; b++) {
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
            const float d = kvs_ggml_q8_0_scale(amax);
            const float id = kvs_ggml_inverse(d);
            put_d(out, d);
            store_q8_codes(out, lo, hi, _mm512_set1_ps(id), isinf(id));
        } else {
            const float max = abits && first_max_negative(lo, hi, abits) ? -amax : amax;
            const float d = kvs_ggml_q4_0_scale(max);
            const float id = kvs_ggml_inverse(d);
            put_d(out, d);
            store_q4_codes(out, lo, hi, _mm512_set1_ps(id), isinf(id));
        }
    }
    return end;
}

/* The permutations that reduce 16 vectors to one: at level l, lane i of
 * the result takes the larger of lanes lo[l][i] and lo[l][i] + h (h = 8, 4,
 * 2, 1) of the pair (x: 0-15, y: 16-31), so each input's lanes halve in
 * count and keep their order: after the last level lane k holds vector k's
 * maximum. */
static const int32_t reduce_lo[4][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23},
    {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},
    {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29},
    {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30},
};

/* Lane k of the result: the unsigned (or signed) maximum of m[k]'s lanes. */
static inline __attribute__((always_inline)) __m512i reduce16(__m512i *m, int is_signed)
{
    for (int l = 0, n = 16, h = 8; l < 4; l++, n /= 2, h /= 2) {
        const __m512i ia = _mm512_loadu_si512(reduce_lo[l]);
        const __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(h));
        for (int i = 0; i < n / 2; i++) {
            __m512i x = _mm512_permutex2var_epi32(m[2 * i], ia, m[2 * i + 1]);
            __m512i y = _mm512_permutex2var_epi32(m[2 * i], ib, m[2 * i + 1]);
            m[i] = is_signed ? _mm512_max_epi32(x, y) : _mm512_max_epu32(x, y);
        }
    }
    return m[0];
}

/* The maxima of blocks b .. b + 15, lane k for block b + k:
 *   q8_0  *amax = the largest |x| as bits (the order of non-negative
 *         floats), so also >= 0x7F800000 when a value is not finite;
 *   q4_0  as bits, signed: *pos = the largest positive (-1: none), *neg =
 *         the largest |x| of the negative ones (-1: none), from the
 *         unsigned maximum of the raw bits (a negative one wins) and the
 *         signed one (a positive one wins). */
static inline __attribute__((always_inline)) void block_maxima(const void *src, int wide,
                                                               size_t b, int type,
                                                               __m512i *amax, __m512i *pos,
                                                               __m512i *neg)
{
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i mu[16], ms[16];
    for (int k = 0; k < 16; k++) {
        __m512 lo, hi;
        load_block(src, wide, b + (size_t)k, &lo, &hi);
        __m512i l = _mm512_castps_si512(lo), h = _mm512_castps_si512(hi);
        if (type == KVS_GGML_Q8_0) {
            mu[k] = _mm512_max_epu32(_mm512_and_si512(l, absmask), _mm512_and_si512(h, absmask));
        } else {
            mu[k] = _mm512_max_epu32(l, h);
            ms[k] = _mm512_max_epi32(l, h);
        }
    }
    const __m512i none = _mm512_set1_epi32(-1);
    __m512i u = reduce16(mu, 0);
    if (type == KVS_GGML_Q8_0) {
        *amax = u;
        return;
    }
    __m512i sg = reduce16(ms, 1);
    *neg = _mm512_mask_and_epi32(none, _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512()), u,
                                 absmask);
    *pos = _mm512_mask_mov_epi32(none, _mm512_cmpge_epi32_mask(sg, _mm512_setzero_si512()), sg);
    *amax = _mm512_max_epi32(*pos, *neg);
}

/* Sixteen blocks at a time: their maxima in one vector, d and id for all
 * of them with one division each (lane by lane the reference's scalar
 * operations), then the codes block by block. */
static inline __attribute__((always_inline)) size_t encode_array(const void *src, uint8_t *dst,
                                                                 size_t nblocks, int type,
                                                                 int wide)
{
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    const __m512 inf = _mm512_set1_ps(INFINITY), one = _mm512_set1_ps(1.0f);
    size_t b = 0;
    for (; b + 16 <= nblocks; b += 16) {
        __m512i amax, pos = _mm512_setzero_si512(), negv = _mm512_setzero_si512();
        block_maxima(src, wide, b, type, &amax, &pos, &negv);
        if (_mm512_cmpge_epu32_mask(amax, _mm512_set1_epi32(0x7F800000))) {
            size_t done = encode_one_by_one(src, dst, b, b + 16, type, wide);
            if (done != b + 16) return done;
            continue;
        }
        /* q8_0: d = amax / 127. q4_0: |d| = amax / 8 (division is symmetric
         * in sign, so max / -8 = -+(amax / 8)); the sign comes per block. */
        const __m512 d = _mm512_div_ps(_mm512_castsi512_ps(amax),
                                       _mm512_set1_ps(type == KVS_GGML_Q8_0 ? 127.0f : 8.0f));
        __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ),
                                        one, d);
        const __mmask16 id_inf = _mm512_cmp_ps_mask(id, inf, _CMP_EQ_OQ);
        /* q4_0: max is negative when the negative maximum is the larger
         * (amax 0 keeps max = +0); equal maxima of both signs (a tie)
         * leave it to the first of them, looked up in the block. */
        const __mmask16 nonzero = _mm512_cmpneq_epi32_mask(amax, _mm512_setzero_si512());
        const __mmask16 max_neg = _mm512_mask_cmpgt_epi32_mask(nonzero, negv, pos);
        const __mmask16 tie = _mm512_mask_cmpeq_epi32_mask(nonzero, negv, pos);
        uint16_t dh[16];
        uint32_t amax_bits[16];
        _mm256_storeu_si256((__m256i *)dh,
                            _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        _mm512_storeu_si512(amax_bits, amax);
        for (int k = 0; k < 16; k++) {
            __m512 lo, hi;
            load_block(src, wide, b + (size_t)k, &lo, &hi);
            uint8_t *out = dst + (b + (size_t)k) * bb;
            const int zero_codes = (id_inf >> k) & 1;
            if (type == KVS_GGML_Q8_0) {
                memcpy(out, &dh[k], 2);
                store_q8_codes(out, lo, hi, _mm512_permutexvar_ps(_mm512_set1_epi32(k), id),
                               zero_codes);
                continue;
            }
            /* q4_0: d takes the sign opposite to max's. */
            int neg = (max_neg >> k) & 1;
            if ((tie >> k) & 1) neg = first_max_negative(lo, hi, amax_bits[k]);
            const uint16_t dk = (uint16_t)(dh[k] | (neg ? 0 : 0x8000));
            memcpy(out, &dk, 2);
            __m512i vid = _mm512_castps_si512(_mm512_permutexvar_ps(_mm512_set1_epi32(k), id));
            if (!neg) vid = _mm512_xor_si512(vid, _mm512_set1_epi32((int)0x80000000u));
            store_q4_codes(out, lo, hi, _mm512_castsi512_ps(vid), zero_codes);
        }
    }
    return encode_one_by_one(src, dst, b, nblocks, type, wide);
}

/* Store block b's 32 values as `wide`; with `nt` (dst 64-byte aligned, so
 * every block's output is whole lines) as streaming stores. */
static inline __attribute__((always_inline)) void store_block(void *dst, int wide, size_t b,
                                                              __m512 lo, __m512 hi, int nt)
{
    uint8_t *p = (uint8_t *)dst + b * KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2);
    if (wide == KVS_WIDE_F32) {
        if (nt) {
            _mm512_stream_ps((float *)p, lo);
            _mm512_stream_ps((float *)(p + 64), hi);
        } else {
            _mm512_storeu_ps(p, lo);
            _mm512_storeu_ps(p + 64, hi);
        }
        return;
    }
    __m512i v;
    if (wide == KVS_WIDE_F16)
        v = _mm512_inserti64x4(
            _mm512_castsi256_si512(
                _mm512_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)),
            _mm512_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), 1);
    else
        v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    if (nt)
        _mm512_stream_si512((__m512i *)p, v);
    else
        _mm512_storeu_si512(p, v);
}

/* The store policy of the fp8 kernels (fp8_kernels.h): an output of at
 * least kvs_fp8_nt_min_bytes() is written with streaming stores, if it
 * starts on a cache line (then every block's values are whole lines). */
static inline __attribute__((always_inline)) void decode_array(const uint8_t *src, void *dst,
                                                               size_t nblocks, int type,
                                                               int wide)
{
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    const size_t out_bytes = nblocks * KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2);
    const int nt = out_bytes >= kvs_fp8_nt_min_bytes() && ((uintptr_t)dst & 63) == 0;
    for (size_t b = 0; b < nblocks; b++) {
        const uint8_t *in = src + b * bb;
        uint16_t h;
        memcpy(&h, in, 2);
        const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)h));
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
                    _mm512_mul_ps(_mm512_cvtepi32_ps(qhi), d), nt);
    }
    if (nt) _mm_sfence();
}

KVS_GGML_DEFINE_VARIANT(kvs_ggml_kernels_avx512, "avx512")
