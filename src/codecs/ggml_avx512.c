/* ggml_avx512.c - AVX-512 ggml block kernels, bit-identical to
 * ggml_scalar.c.
 *
 * Compiled with the flags of every *_avx512.c file (CMakeLists.txt); it uses
 * AVX512F (zmm arithmetic), AVX512BW (word maxima), AVX512_VBMI (vpermt2b),
 * AVX512_BF16 (vcvtne2ps2bf16) and F16C (float16 scales and elements), all
 * of which the fp8 dispatcher checks before it picks "avx512", the only way
 * these kernels are chosen.
 *
 * Encoding takes 16 blocks at a time. Their maxima come from ordering
 * keys (block_keys: |x|'s bits for q8_0, the raw bits signed and unsigned
 * for q4_0; float16 and bfloat16 compare their own 16-bit patterns as
 * words, so a block is one load and three operations), reduced into one
 * vector whose lane k is block k's maximum (a tree of vpermt2d + max);
 * a maximum at or above infinity's bits marks a non-finite value. d and
 * id of all 16 blocks come from one division each, the reference's scalar
 * float32 operations lane by lane; then the codes, block by block, are the
 * reference's float32 operations lane by lane, each rounded on its own
 * (separate multiply and add, never fused):
 *   roundf   trunc(v + copysign(0.5 - 2^-25, v)) (round_away);
 *   q4_0     min(15, trunc(x * id + 8.5)), the first lane holding the
 *            largest |x| giving max (its sign: from the signed and the
 *            unsigned maximum, a tie of opposite signs looked up in the
 *            block).
 * A bfloat16 block is taken as float32 without a shuffle, its even and its
 * odd elements in two vectors; one vpermt2b gathers the codes' low bytes
 * back into element order. The input is prefetched as the fp8 encoders'
 * is (KVS_FP8_PREFETCH_BYTES).
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

/* Block b's 32 elements as two vectors of float32, in an order that
 * depends on `wide` (element_order undoes it): bfloat16 in one load, the
 * even elements (0, 2, .., 30: each dword's low word moved up) and the odd
 * ones (its high word, masked), no shuffle; float16 and float32 as
 * elements 0-15 and 16-31. */
static inline __attribute__((always_inline)) void load_block(const void *src, int wide,
                                                             size_t b, __m512 x[2])
{
    const uint8_t *p = (const uint8_t *)src + b * KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2);
    if (wide == KVS_WIDE_F32) {
        x[0] = _mm512_loadu_ps(p);
        x[1] = _mm512_loadu_ps(p + 64);
    } else if (wide == KVS_WIDE_F16) {
        x[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
        x[1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 32)));
    } else {
        const __m512i v = _mm512_loadu_si512(p);
        x[0] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        x[1] = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
    }
}

/* vpermt2b indexes that gather the low byte of every lane of load_block's
 * two vectors (as int32) back into element order, bytes 0-31. */
static const uint8_t element_order[2][64] = {
    {0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60,
     64, 68, 72, 76, 80, 84, 88, 92, 96, 100, 104, 108, 112, 116, 120, 124},
    {0, 64, 4, 68, 8, 72, 12, 76, 16, 80, 20, 84, 24, 88, 28, 92,
     32, 96, 36, 100, 40, 104, 44, 108, 48, 112, 52, 116, 56, 120, 60, 124},
};

static inline __attribute__((always_inline)) __m512i gather_index(int wide)
{
    return _mm512_loadu_si512(element_order[wide == KVS_WIDE_BF16]);
}

/* roundf lane by lane (halves away from zero), for |v| <= 128:
 * trunc(v + copysign(0.5 - 2^-25, v)). The sum is rounded once more, but
 * never across an integer it should not reach: below a half, v + 0.5 -
 * 2^-25 stays under the next integer by at least 2^-25 and that integer's
 * neighbour below is representable (spacing at most 2^-17 here, and the
 * sum rounds to it or stays), while an exact half, v = n + 0.5, sums to
 * n + 1 - 2^-25, a tie or nearer to n + 1, which rounds up to it (even).
 * (0xEA: (v & sign) | almost_half in one ternary-logic operation.) */
static inline __attribute__((always_inline)) __m512i round_away(__m512 v)
{
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512i almost_half = _mm512_castps_si512(_mm512_set1_ps(0.49999997f));
    __m512 bias = _mm512_castsi512_ps(
        _mm512_ternarylogic_epi32(_mm512_castps_si512(v), sign, almost_half, 0xEA));
    return _mm512_cvttps_epi32(_mm512_add_ps(v, bias));
}

/* q8_0 codes of a block (x: load_block's, vid: id in every lane; an
 * infinite id wants code 0 for every element: zero_codes) at out + 2. */
static inline __attribute__((always_inline)) void store_q8_codes(uint8_t *out, const __m512 x[2],
                                                                 __m512 vid, __m512i order,
                                                                 int zero_codes)
{
    __m256i q = _mm256_setzero_si256();
    if (!zero_codes)
        q = _mm512_castsi512_si256(_mm512_permutex2var_epi8(
            round_away(_mm512_mul_ps(x[0], vid)), order, round_away(_mm512_mul_ps(x[1], vid))));
    _mm256_storeu_si256((__m256i *)(out + 2), q);
}

/* q4_0 nibbles of a block: min(15, trunc(x * id + 8.5)) (within 0..16
 * before the minimum), element j low and j + 16 high, at out + 2
 * (zero_codes as above). */
static inline __attribute__((always_inline)) void store_q4_codes(uint8_t *out, const __m512 x[2],
                                                                 __m512 vid, __m512i order,
                                                                 int zero_codes)
{
    __m128i q = _mm_setzero_si128();
    if (!zero_codes) {
        const __m512 half = _mm512_set1_ps(8.5f);
        __m512i n0 = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(x[0], vid), half));
        __m512i n1 = _mm512_cvttps_epi32(_mm512_add_ps(_mm512_mul_ps(x[1], vid), half));
        __m256i n = _mm256_min_epu8(
            _mm512_castsi512_si256(_mm512_permutex2var_epi8(n0, order, n1)), _mm256_set1_epi8(15));
        q = _mm_or_si128(_mm256_castsi256_si128(n),
                         _mm_slli_epi16(_mm256_extracti128_si256(n, 1), 4));
    }
    _mm_storeu_si128((__m128i *)(out + 2), q);
}

static inline __attribute__((always_inline)) void put_d(uint8_t *out, float d)
{
    uint16_t h = (uint16_t)_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    memcpy(out, &h, 2);
}

/* q4_0: whether max, the first element of block b with |x| = amax (bits,
 * non-zero), is negative (the block read again in element order: only
 * for ties of opposite signs, and block by block). */
static inline __attribute__((always_inline)) int first_max_negative(const void *src, int wide,
                                                                   size_t b, uint32_t amax)
{
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512i signbit = _mm512_set1_epi32((int)0x80000000u);
    const __m512i va = _mm512_set1_epi32((int)amax);
    const uint8_t *p = (const uint8_t *)src + b * KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2);
    __m512i l, h;
    if (wide == KVS_WIDE_BF16) {
        const __m512i v = _mm512_loadu_si512(p);
        l = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16);
        h = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16);
    } else {
        __m512 x[2];
        load_block(src, wide, b, x); /* element order */
        l = _mm512_castps_si512(x[0]);
        h = _mm512_castps_si512(x[1]);
    }
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
    const __m512i order = gather_index(wide);
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    for (size_t b = begin; b < end; b++) {
        __m512 x[2];
        load_block(src, wide, b, x);
        __m512i a0 = _mm512_and_si512(_mm512_castps_si512(x[0]), absmask);
        __m512i a1 = _mm512_and_si512(_mm512_castps_si512(x[1]), absmask);
        uint32_t abits = _mm512_reduce_max_epu32(_mm512_max_epu32(a0, a1));
        if (abits >= 0x7F800000u) return b;
        uint8_t *out = dst + b * bb;
        float amax;
        memcpy(&amax, &abits, 4);
        if (type == KVS_GGML_Q8_0) {
            const float d = kvs_ggml_q8_0_scale(amax);
            const float id = kvs_ggml_inverse(d);
            put_d(out, d);
            store_q8_codes(out, x, _mm512_set1_ps(id), order, isinf(id));
        } else {
            const float max = abits && first_max_negative(src, wide, b, abits) ? -amax : amax;
            const float d = kvs_ggml_q4_0_scale(max);
            const float id = kvs_ggml_inverse(d);
            put_d(out, d);
            store_q4_codes(out, x, _mm512_set1_ps(id), order, isinf(id));
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

/* The unroll hints only where the compiler optimizes: at -O0 with the
 * sanitizers GCC cannot place the inner loop's and warns ("ignoring loop
 * annotation"), an error under -Werror in a Debug ASan build. */
#ifdef __OPTIMIZE__
#define UNROLL(n) _Pragma(#n)
#else
#define UNROLL(n)
#endif

/* Lane k of the result: the unsigned (or signed) maximum of m[k]'s lanes. */
static inline __attribute__((always_inline)) __m512i reduce16(__m512i *m, int is_signed)
{
    UNROLL(GCC unroll 4)
    for (int l = 0, n = 16, h = 8; l < 4; l++, n /= 2, h /= 2) {
        const __m512i ia = _mm512_loadu_si512(reduce_lo[l]);
        const __m512i ib = _mm512_add_epi32(ia, _mm512_set1_epi32(h));
        UNROLL(GCC unroll 8)
        for (int i = 0; i < n / 2; i++) {
            __m512i x = _mm512_permutex2var_epi32(m[2 * i], ia, m[2 * i + 1]);
            __m512i y = _mm512_permutex2var_epi32(m[2 * i], ib, m[2 * i + 1]);
            m[i] = is_signed ? _mm512_max_epi32(x, y) : _mm512_max_epu32(x, y);
        }
    }
    return m[0];
}

/* Block b's ordering keys, 16 lanes whose maximum gives the block's
 * (keys_to_f32 then makes it float32 bits):
 *   q8_0  ku: |x| as bits, unsigned (the order of non-negative floats,
 *         non-finite values above every finite one);
 *   q4_0  ku: the raw bits, unsigned (a negative value wins, the largest
 *         magnitude first); ks: signed (a positive one wins, the largest
 *         first).
 * float16 and bfloat16 keys are their own 16-bit patterns, compared as
 * words: the larger word of each dword pair goes to its high word (the
 * low word then breaks only ties of high words, which leave the maximum's
 * high word the same); float32 keys are its bits. */
static inline __attribute__((always_inline)) void block_keys(const void *src, int wide, size_t b,
                                                             int type, __m512i *ku, __m512i *ks)
{
    const uint8_t *p = (const uint8_t *)src + b * KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2);
    if (wide == KVS_WIDE_F32) {
        const __m512i l = _mm512_loadu_si512(p), h = _mm512_loadu_si512(p + 64);
        const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
        if (type == KVS_GGML_Q8_0) {
            *ku = _mm512_max_epu32(_mm512_and_si512(l, absmask), _mm512_and_si512(h, absmask));
        } else {
            *ku = _mm512_max_epu32(l, h);
            *ks = _mm512_max_epi32(l, h);
        }
        return;
    }
    const __m512i v = _mm512_loadu_si512(p);
    if (type == KVS_GGML_Q8_0) {
        const __m512i a = _mm512_and_si512(v, _mm512_set1_epi16(0x7FFF));
        *ku = _mm512_max_epu16(a, _mm512_slli_epi32(a, 16));
    } else {
        const __m512i t = _mm512_slli_epi32(v, 16);
        *ku = _mm512_max_epu16(v, t);
        *ks = _mm512_max_epi16(v, t);
    }
}

/* Reduced keys as the float32 bits of the values they stand for. */
static inline __attribute__((always_inline)) __m512i keys_to_f32(__m512i k, int wide)
{
    if (wide == KVS_WIDE_F32) return k;
    if (wide == KVS_WIDE_BF16) return _mm512_and_si512(k, _mm512_set1_epi32((int)0xFFFF0000u));
    return _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(k, 16))));
}

/* The maxima of blocks b .. b + 15, lane k for block b + k, as float32
 * bits:
 *   q8_0  *amax = the largest |x| (so also >= 0x7F800000 when a value is
 *         not finite);
 *   q4_0  signed: *pos = the largest positive (-1: none), *neg = the
 *         largest |x| of the negative ones (-1: none), *amax the larger. */
static inline __attribute__((always_inline)) void block_maxima(const void *src, int wide,
                                                               size_t b, int type,
                                                               __m512i *amax, __m512i *pos,
                                                               __m512i *neg)
{
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    __m512i mu[16], ms[16];
#pragma GCC unroll 16
    for (int k = 0; k < 16; k++) block_keys(src, wide, b + (size_t)k, type, &mu[k], &ms[k]);
    const __m512i none = _mm512_set1_epi32(-1);
    __m512i u = keys_to_f32(reduce16(mu, 0), wide);
    if (type == KVS_GGML_Q8_0) {
        *amax = u;
        return;
    }
    __m512i sg = keys_to_f32(reduce16(ms, 1), wide);
    *neg = _mm512_mask_and_epi32(none, _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512()), u,
                                 absmask);
    *pos = _mm512_mask_mov_epi32(none, _mm512_cmpge_epi32_mask(sg, _mm512_setzero_si512()), sg);
    *amax = _mm512_max_epi32(*pos, *neg);
}

/* Blocks b .. b + 15 into out (block b + k at out + k bytes-per-block):
 * their maxima in one vector, d and id for all of them with one division
 * each (lane by lane the reference's scalar operations), then the codes
 * block by block. 0, with nothing written, when one of them holds a
 * non-finite value. */
static inline __attribute__((always_inline)) int encode16(const void *src, uint8_t *out,
                                                          size_t b, int type, int wide,
                                                          __m512i order)
{
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    const __m512 inf = _mm512_set1_ps(INFINITY), one = _mm512_set1_ps(1.0f);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512i amax, pos = _mm512_setzero_si512(), negv = _mm512_setzero_si512();
    block_maxima(src, wide, b, type, &amax, &pos, &negv);
    if (_mm512_cmpge_epu32_mask(amax, _mm512_set1_epi32(0x7F800000))) return 0;
    /* q8_0: d = amax / 127. q4_0: |d| = amax / 8 (division is symmetric in
     * sign, so max / -8 = -+(amax / 8)); the sign comes per block. */
    __m512 d = _mm512_div_ps(_mm512_castsi512_ps(amax),
                             _mm512_set1_ps(type == KVS_GGML_Q8_0 ? 127.0f : 8.0f));
    __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(d, _mm512_setzero_ps(), _CMP_NEQ_OQ),
                                    one, d);
    const __mmask16 id_inf = _mm512_cmp_ps_mask(id, inf, _CMP_EQ_OQ);
    if (type == KVS_GGML_Q4_0) {
        /* max is negative when the negative maximum is the larger (amax 0
         * keeps max = +0); equal maxima of both signs (a tie) leave it to
         * the first of them, looked up in the block. d and id take the
         * sign opposite to max's. */
        const __mmask16 nonzero = _mm512_cmpneq_epi32_mask(amax, _mm512_setzero_si512());
        __mmask16 max_neg = _mm512_mask_cmpgt_epi32_mask(nonzero, negv, pos);
        const __mmask16 tie = _mm512_mask_cmpeq_epi32_mask(nonzero, negv, pos);
        if (tie) {
            uint32_t amax_bits[16];
            _mm512_storeu_si512(amax_bits, amax);
            for (int k = 0; k < 16; k++)
                if ((tie >> k) & 1 && first_max_negative(src, wide, b + (size_t)k, amax_bits[k]))
                    max_neg = (__mmask16)(max_neg | 1u << k);
        }
        const __mmask16 flip = (__mmask16)~max_neg;
        d = _mm512_castsi512_ps(_mm512_mask_xor_epi32(_mm512_castps_si512(d), flip,
                                                      _mm512_castps_si512(d), sign));
        id = _mm512_castsi512_ps(_mm512_mask_xor_epi32(_mm512_castps_si512(id), flip,
                                                       _mm512_castps_si512(id), sign));
    }
    uint16_t dh[16];
    float ids[16];
    _mm256_storeu_si256((__m256i *)dh,
                        _mm512_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    _mm512_storeu_ps(ids, id);
    for (int k = 0; k < 16; k++) {
        __m512 x[2];
        load_block(src, wide, b + (size_t)k, x);
        uint8_t *o = out + (size_t)k * bb;
        const int zero_codes = (id_inf >> k) & 1;
        memcpy(o, &dh[k], 2);
        if (type == KVS_GGML_Q8_0)
            store_q8_codes(o, x, _mm512_set1_ps(ids[k]), order, zero_codes);
        else
            store_q4_codes(o, x, _mm512_set1_ps(ids[k]), order, zero_codes);
    }
    return 1;
}

/* Prefetch the input of `count` blocks from block b + ahead (fp8_kernels.h:
 * KVS_FP8_PREFETCH_BYTES ahead), when they are inside the array. */
static inline __attribute__((always_inline)) void prefetch_blocks(const void *src, size_t b,
                                                                  size_t count, size_t nblocks,
                                                                  int wide)
{
    const size_t in_bytes = KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2); /* of a block */
    const size_t ahead = KVS_FP8_PREFETCH_BYTES / in_bytes;
    if (b + ahead + count > nblocks) return;
    const char *p = (const char *)src + (b + ahead) * in_bytes;
    for (size_t l = 0; l < count * in_bytes; l += 64) _mm_prefetch(p + l, _MM_HINT_T0);
}

/* Sixteen blocks at a time (encode16), the input prefetched. The output
 * takes ordinary stores at every size: streaming whole lines of 32 blocks
 * through a buffer on the stack measured no faster at 256 MiB (0.64-0.75
 * of memcpy against 0.60-0.80, docs/performance.md), the output being
 * half the input or less. */
static inline __attribute__((always_inline)) size_t encode_array(const void *src, uint8_t *dst,
                                                                 size_t nblocks, int type,
                                                                 int wide)
{
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    const __m512i order = gather_index(wide);
    size_t b = 0;
    for (; b + 16 <= nblocks; b += 16) {
        prefetch_blocks(src, b, 16, nblocks, wide);
        if (encode16(src, dst + b * bb, b, type, wide, order)) continue;
        size_t done = encode_one_by_one(src, dst, b, b + 16, type, wide);
        if (done != b + 16) return done;
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
