/* intq_avx2.c - the integer quantizer's AVX2 kernels (intq_kernels.h),
 * for CPUs without AVX-512: the fused token rows (encode_token_bf16,
 * decode_bf16 at 2, 4 and 8 bits) the "int8 token" and "int4 kivi" presets
 * run, the fused channel blocks (encode_channel_bf16: int4 kivi's keys;
 * since 2026-12-07, int4 kivi encode 3.7 -> 5.5 GB/s at 64 MiB on Zen 4
 * under this set), and the row operations of the channel axis's unfused blocks
 * (widen_bf16, scales, reciprocals, quantize, load_scales: the blocks the
 * fused one does not take), each intq_avx512.c's algorithm in 8-lane
 * vectors. On Zen 3
 * (bench_int, 64 MiB, one thread, medians of 3 alternated runs against
 * main's portable code) int8 token encode 1.76 -> 5.24 GB/s, decode 3.84
 * -> 5.00; int4 kivi 1.56 -> 3.31 / 3.54 -> 5.90.
 *
 * The same IEEE float32 operations as intq.c's portable code, in the same
 * order, so the same bytes; why each step is exact is argued once, in
 * intq_avx512.c beside the 16-lane kernel it follows (scale_up,
 * scales_vec, rounded_quotient, fused_pair, pair_grid, decode_lookup,
 * bf16x16), and not repeated here. What differs for want of AVX-512: no masks
 * (comparisons give all-ones lanes; tails go through small local buffers
 * or scalar steps, so no byte past n is read or written), vcvtps2ph's
 * rounding from its immediate (F16C), no vrangeps (the near-half test of
 * the two vectors of a pair is two comparisons), no vcvtne2ps2bf16 (the
 * integer rounding of half.h always), vpshufb lookups of 16 bytes for
 * vpermw. The other entries are NULL: the portable code, which GCC builds
 * for AVX2 (codecs/clones.h). */
#include <immintrin.h>
#include <string.h>

#include "codecs/intq_kernels.h"

#define KVS_AI static inline __attribute__((always_inline))

/* All-ones lanes where v is inf or NaN. */
KVS_AI __m256i not_finite(__m256 v)
{
    const __m256i exp = _mm256_set1_epi32(0x7F800000);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), exp), exp);
}

KVS_AI __m256 abs_ps(__m256 v)
{
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
}

/* intq_avx512.c's prefetch_line: the line of `ahead` (NULL: none) of the
 * codes of elements i.., once per 64-byte line of codes. */
KVS_AI void prefetch_line(const uint8_t *ahead, uint64_t i, unsigned bits)
{
    if (ahead && i * bits % 512 == 0)
        _mm_prefetch((const char *)(ahead + i * bits / 8), _MM_HINT_T0);
}

/* ---- encode ------------------------------------------------------------ */

/* range / steps rounded up (intq.c's scale_up): one ulp up (the next bit
 * pattern, s >= 0) while s is finite and s x steps < range. */
KVS_AI __m256 scale_up(__m256 range, __m256 steps)
{
    __m256 s = _mm256_div_ps(range, steps);
    for (;;) {
        __m256i low = _mm256_andnot_si256(
            not_finite(s), _mm256_castps_si256(_mm256_cmp_ps(_mm256_mul_ps(s, steps), range, _CMP_LT_OQ)));
        if (_mm256_testz_si256(low, low)) return s;
        s = _mm256_castsi256_ps(_mm256_sub_epi32(_mm256_castps_si256(s), low)); /* low = -1 */
    }
}

/* intq_avx512.c's scales_vec for 8 groups: stored float16 bits (*sb,
 * *zb) or float32 values (*s, *z), divisors *inv; 0 if one does not fit.
 * Lanes past the row's groups hold lo = hi = 0, which fit. */
KVS_AI int scales_vec(__m256 lo, __m256 hi, int zp, int f16, __m256 steps, __m128i *sb,
                      __m128i *zb, __m256 *s, __m256 *z, __m256 *inv)
{
    __m256 range;
    *z = _mm256_setzero_ps();
    *zb = *sb = _mm_setzero_si128();
    if (zp) {
        if (f16) {
            *zb = _mm256_cvtps_ph(lo, _MM_FROUND_TO_NEG_INF);
            *z = _mm256_cvtph_ps(*zb);
        } else {
            *z = lo;
        }
        range = _mm256_sub_ps(hi, *z);
    } else {
        range = _mm256_max_ps(abs_ps(lo), abs_ps(hi));
    }
    *s = scale_up(range, steps);
    if (f16) {
        *sb = _mm256_cvtps_ph(*s, _MM_FROUND_TO_POS_INF);
        *s = _mm256_cvtph_ps(*sb);
    }
    __m256i bad = _mm256_or_si256(not_finite(*s), not_finite(*z));
    if (!_mm256_testz_si256(bad, bad)) return 0;
    __m256 pos = _mm256_cmp_ps(*s, _mm256_setzero_ps(), _CMP_GT_OQ);
    *inv = _mm256_blendv_ps(_mm256_set1_ps(1.0f), *s, pos); /* a scale of 0 divides by 1 */
    return 1;
}

/* scales_vec's stored bits of its 8 groups at sbuf / zbuf (groups 8 on
 * from 8 v: 2 bytes a group for float16, else 4). */
KVS_AI void store_scale_bits(uint8_t *sbuf, uint8_t *zbuf, uint64_t v, int f16, __m128i sb,
                             __m128i zb, __m256 s, __m256 z)
{
    if (f16) {
        _mm_storeu_si128((__m128i *)(sbuf + 16 * v), sb);
        _mm_storeu_si128((__m128i *)(zbuf + 16 * v), zb);
    } else {
        _mm256_storeu_ps((float *)(void *)(sbuf + 32 * v), s);
        _mm256_storeu_ps((float *)(void *)(zbuf + 32 * v), z);
    }
}

/* 1 / r where that is a normal float, else NaN (r > 0): a product by it
 * is NaN, which the near-half test sends to the division. */
KVS_AI __m256 reciprocal(__m256 r)
{
    __m256 inv = _mm256_div_ps(_mm256_set1_ps(1.0f), r);
    __m256 ok = _mm256_andnot_ps(_mm256_castsi256_ps(not_finite(inv)),
                                 _mm256_cmp_ps(inv, _mm256_set1_ps(0x1p-126f), _CMP_GE_OQ));
    return _mm256_blendv_ps(_mm256_set1_ps(__builtin_nanf("")), inv, ok);
}

/* bfloat16 bits as signed 16-bit keys in the order of their values (its
 * own inverse; intq_avx512.c's order_key). */
KVS_AI __m256i order_key(__m256i h)
{
    return _mm256_xor_si256(h, _mm256_srli_epi16(_mm256_srai_epi16(h, 15), 1));
}

/* The smallest / largest of 16 signed 16-bit lanes (phminposuw on the
 * sign-flipped or complemented lanes). */
KVS_AI int16_t hmin16(__m256i v)
{
    __m128i b = _mm_min_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    b = _mm_xor_si128(b, _mm_set1_epi16(INT16_MIN));
    return (int16_t)(_mm_cvtsi128_si32(_mm_minpos_epu16(b)) ^ 0x8000);
}

KVS_AI int16_t hmax16(__m256i v)
{
    __m128i b = _mm_max_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    b = _mm_xor_si128(b, _mm_set1_epi16(INT16_MAX));
    return (int16_t)(_mm_cvtsi128_si32(_mm_minpos_epu16(b)) ^ 0x7FFF);
}

/* Whether a group or channel with these keys (or magnitudes) is the
 * portable code's: not finite (a key or magnitude past the largest finite
 * one), or with a zero point a minimum of +-0 (keys 0 and -1), whose sign
 * the stored zero point keeps. */
KVS_AI int keys_refused(int16_t mn, int16_t mx, int zp)
{
    return mx >= 0x7F80 || (zp && (mn <= -0x7F81 || mn == 0 || mn == -1));
}

/* A group's statistics in the 16-bit patterns (group % 32 == 0): with a
 * zero point the keys' minimum and maximum, else the largest magnitude. */
KVS_AI void group_stats16(const uint8_t *p, uint64_t group, int zp, int16_t *mn, int16_t *mx)
{
    const __m256i mag = _mm256_set1_epi16(0x7FFF);
    __m256i lo = _mm256_set1_epi16(INT16_MAX), hi = _mm256_set1_epi16(INT16_MIN);
    for (uint64_t j = 0; j < group; j += 16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(p + 2 * j));
        v = zp ? order_key(v) : _mm256_and_si256(v, mag);
        lo = _mm256_min_epi16(lo, v);
        hi = _mm256_max_epi16(hi, v);
    }
    *mx = hmax16(hi);
    if (zp) *mn = hmin16(lo);
}

/* 8 keys (or magnitudes) back to float32 lanes. */
KVS_AI __m256 keys_to_ps(const int16_t *k)
{
    __m128i h = _mm_loadu_si128((const __m128i *)k);
    h = _mm_xor_si128(h, _mm_srli_epi16(_mm_srai_epi16(h, 15), 1));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The codes of the even (*ce) and odd (*co) elements of 16 bfloat16 v
 * (divisors re / ro, reciprocals ie / io, zeros ze / zo: one group's
 * twice in a token row, 8 channels' each in a channel block), as intq_avx512.c's
 * fused_pair: rint(q) as (q + 1.5 x 2^23) - 1.5 x 2^23, the code from
 * the sum's low bits (kmid: the magic's bits less mid), and the lanes
 * within 2^-12 of a half (or NaN: reciprocal NaN) divided. */
KVS_AI void codes16(__m256i v, __m256 re, __m256 ro, __m256 ie, __m256 io, __m256 ze,
                    __m256 zo, __m256i kmid, __m256i imid, int zp, __m256i *ce, __m256i *co)
{
    const __m256 magic = _mm256_set1_ps(0x1.8p23f), edge = _mm256_set1_ps(0.5f - 0x1p-12f);
    __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
    __m256 ye = zp ? _mm256_sub_ps(xe, ze) : xe, yo = zp ? _mm256_sub_ps(xo, zo) : xo;
    __m256 qe = _mm256_mul_ps(ye, ie), qo = _mm256_mul_ps(yo, io);
    __m256 te = _mm256_add_ps(qe, magic), to = _mm256_add_ps(qo, magic);
    __m256 fe = _mm256_sub_ps(qe, _mm256_sub_ps(te, magic));
    __m256 fo = _mm256_sub_ps(qo, _mm256_sub_ps(to, magic));
    *ce = _mm256_sub_epi32(_mm256_castps_si256(te), kmid);
    *co = _mm256_sub_epi32(_mm256_castps_si256(to), kmid);
    __m256 ne = _mm256_cmp_ps(abs_ps(fe), edge, _CMP_NLT_UQ);
    __m256 no = _mm256_cmp_ps(abs_ps(fo), edge, _CMP_NLT_UQ);
    if (_mm256_testz_ps(_mm256_or_ps(ne, no), _mm256_or_ps(ne, no))) return;
    /* (vcvtps2dq rounds to nearest even, rintf's mode) */
    __m256i de = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_div_ps(ye, re)), imid);
    __m256i dd = _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_div_ps(yo, ro)), imid);
    *ce = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(*ce), _mm256_castsi256_ps(de), ne));
    *co = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(*co), _mm256_castsi256_ps(dd), no));
}

/* The codes of elements e..e + 31 (pairs 0-7: a, 8-15: b, each 32-bit
 * lane an even code OR its odd neighbour shifted up by `bits`: the byte or
 * word pack_codes makes of them, a nibble for 2 bits) packed at out. */
KVS_AI void pack_pairs(__m256i a, __m256i b, unsigned bits, uint8_t *out)
{
    if (bits == 8) { /* 16-bit words; vpackusdw works in lanes */
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
        _mm256_storeu_si256((__m256i *)out, p);
    } else if (bits == 4) {
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
        p = _mm256_packus_epi16(p, p); /* lane 0: pairs 0-7 twice, lane 1: 8-15 */
        _mm_storeu_si128((__m128i *)out,
                         _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08)));
    } else { /* two nibbles per 64-bit lane: the high one down to bit 4 */
        __m256i ta = _mm256_or_si256(a, _mm256_srli_epi64(a, 28));
        __m256i tb = _mm256_or_si256(b, _mm256_srli_epi64(b, 28));
        /* the low byte of each 64-bit lane to bytes 0-1 (a, lane 0), 2-3 (a,
         * lane 1), 4-5 / 6-7 (b): vpshufb's index differs per lane */
        const __m256i ia = _mm256_setr_epi8(0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                            -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
        const __m256i ib = _mm256_setr_epi8(-1, -1, -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                            -1, -1, -1, -1, -1, -1, 0, 8, -1, -1, -1, -1, -1, -1, -1, -1);
        __m256i t = _mm256_or_si256(_mm256_shuffle_epi8(ta, ia), _mm256_shuffle_epi8(tb, ib));
        __m128i w = _mm_or_si128(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
        _mm_storel_epi64((__m128i *)out, w);
    }
}

/* The codes of elements e..e + 31 by codes16 (the near lanes divided),
 * packed at out. */
KVS_AI void chunk32(const uint8_t *src, uint64_t e, __m256 r, __m256 ri, __m256 zz, __m256i kmid,
                    __m256i imid, unsigned bits, int zp, uint8_t *out)
{
    __m256i e0, o0, e1, o1;
    codes16(_mm256_loadu_si256((const __m256i *)(src + 2 * e)), r, r, ri, ri, zz, zz, kmid, imid,
            zp, &e0, &o0);
    codes16(_mm256_loadu_si256((const __m256i *)(src + 2 * e + 32)), r, r, ri, ri, zz, zz, kmid,
            imid, zp, &e1, &o1);
    pack_pairs(_mm256_or_si256(e0, _mm256_slli_epi32(o0, (int)bits)),
               _mm256_or_si256(e1, _mm256_slli_epi32(o1, (int)bits)), bits, out + e * bits / 8);
}

/* intq_avx512.c's pair_grid for 16 bfloat16 v (no NaN reciprocal): each
 * code from one FMA's sum w = RN(y x ri + grid), the pairs as pack_pairs
 * takes them (the even code, the odd one shifted up by `bits`, zeros
 * above: the packs saturate). Returns nonzero where some sum's low 13
 * bits are 0 (its code needs codes16). */
KVS_AI int grid16(__m256i v, __m256 ie, __m256 io, __m256 ze, __m256 zo, __m256 grid,
                  unsigned bits, int zp, __m256i *pairs)
{
    const __m256i frac = _mm256_set1_epi32(0x1FFF), zero = _mm256_setzero_si256();
    const __m256i low = _mm256_set1_epi32((int)((1u << bits) - 1));
    __m256 xe = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    __m256 xo = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0xFFFF0000u)));
    __m256 ye = zp ? _mm256_sub_ps(xe, ze) : xe, yo = zp ? _mm256_sub_ps(xo, zo) : xo;
    __m256i we = _mm256_castps_si256(_mm256_fmadd_ps(ye, ie, grid));
    __m256i wo = _mm256_castps_si256(_mm256_fmadd_ps(yo, io, grid));
    __m256i near = _mm256_or_si256(_mm256_cmpeq_epi32(_mm256_and_si256(we, frac), zero),
                                   _mm256_cmpeq_epi32(_mm256_and_si256(wo, frac), zero));
    *pairs = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(we, 13), low),
                             _mm256_and_si256(_mm256_srli_epi32(wo, 13 - (int)bits),
                                              _mm256_slli_epi32(low, (int)bits)));
    return !_mm256_testz_si256(near, near);
}

/* grid16's constant for a row format's mid (intq_avx512.c's grid_of). */
KVS_AI __m256 grid_of(float mid) { return _mm256_set1_ps(kvs_intq_grid(mid)); }

/* The codes of a row, group by group (bits and zp constants in each
 * copy), 32 at a time by grid16 and the chunks it leaves by chunk32 once
 * per window of 64 chunks (intq_avx512.c's token_codes); a row with a
 * NaN reciprocal by chunk32. */
KVS_AI void token_codes(const uint8_t *src, uint64_t n, uint64_t group, float mid,
                        const float *d, const float *rinv, const float *z, unsigned bits,
                        int zp, uint8_t *out, const uint8_t *ahead, const uint8_t *codes_ahead)
{
    const __m256 magic = _mm256_set1_ps(0x1.8p23f);
    const __m256 grid = grid_of(mid);
    const __m256i imid = _mm256_set1_epi32((int)mid);
    const __m256i kmid = _mm256_sub_epi32(_mm256_castps_si256(magic), imid);
    int nan = 0;
    for (uint64_t k = 0; k < n / group; k++) nan |= rinv[k] != rinv[k];
    uint64_t near = 0, j = 0; /* the window's flags; chunk j of the row */
    for (uint64_t c0 = 0, k = 0; c0 < n; c0 += group, k++) {
        const __m256 r = _mm256_set1_ps(d[k]), ri = _mm256_set1_ps(rinv[k]), zz = _mm256_set1_ps(z[k]);
        for (uint64_t e = c0; e < c0 + group; e += 32, j++) {
            if (ahead) _mm_prefetch((const char *)(ahead + 2 * e), _MM_HINT_T0);
            prefetch_line(codes_ahead, e, bits);
            if (nan) {
                chunk32(src, e, r, ri, zz, kmid, imid, bits, zp, out);
                continue;
            }
            __m256i a, b;
            int na = grid16(_mm256_loadu_si256((const __m256i *)(src + 2 * e)), ri, ri, zz, zz,
                            grid, bits, zp, &a);
            int nb = grid16(_mm256_loadu_si256((const __m256i *)(src + 2 * e + 32)), ri, ri, zz,
                            zz, grid, bits, zp, &b);
            pack_pairs(a, b, bits, out + e * bits / 8);
            near |= (uint64_t)(na | nb) << (j % KVS_INTQ_NEAR_WINDOW);
            if (j % KVS_INTQ_NEAR_WINDOW == KVS_INTQ_NEAR_WINDOW - 1 || e + 32 == n)
                for (uint64_t first = j - j % KVS_INTQ_NEAR_WINDOW; near; near &= near - 1) {
                    uint64_t ee = 32 * (first + (uint64_t)__builtin_ctzll(near)), kk = ee / group;
                    chunk32(src, ee, _mm256_set1_ps(d[kk]), _mm256_set1_ps(rinv[kk]),
                            _mm256_set1_ps(z[kk]), kmid, imid, bits, zp, out);
                }
        }
    }
}

static int encode_token_bf16(const uint8_t *src, uint64_t n, const kvs_intq_rowfmt *f,
                             uint8_t *scales_out, uint8_t *zeros, uint8_t *out,
                             const uint8_t *ahead, const uint8_t *codes_ahead)
{
    enum { G = KVS_INTQ_FUSED_GROUPS };
    int16_t mn[G] = {0}, mx[G] = {0}; /* lanes past the row's groups: 0, which fits */
    float d[G], rinv[G], z[G];
    uint8_t sbuf[4 * G], zbuf[4 * G];
    uint64_t ng = n / f->group;
    int zp = f->zero_point, f16 = f->scale_f16;
    for (uint64_t k = 0; k < ng; k++) {
        group_stats16(src + 2 * k * f->group, f->group, zp, &mn[k], &mx[k]);
        if (keys_refused(mn[k], mx[k], zp)) return 0;
    }
    const __m256 steps = _mm256_set1_ps(f->steps);
    for (uint64_t b = 0; b * 8 < ng; b++) {
        __m256 hi = keys_to_ps(mx + 8 * b), lo = zp ? keys_to_ps(mn + 8 * b) : hi;
        __m256 s, zv, dv;
        __m128i sb, zb;
        if (!scales_vec(lo, hi, zp, f16, steps, &sb, &zb, &s, &zv, &dv)) return 0;
        _mm256_storeu_ps(d + 8 * b, dv);
        _mm256_storeu_ps(z + 8 * b, zv);
        _mm256_storeu_ps(rinv + 8 * b, reciprocal(dv));
        store_scale_bits(sbuf, zbuf, b, f16, sb, zb, s, zv);
    }
    /* every group fits: now the bytes */
    size_t ss = f16 ? 2 : 4;
    memcpy(scales_out, sbuf, ng * ss);
    if (zp) memcpy(zeros, zbuf, ng * ss);
#define TOKEN_CODES(B, Z) \
    token_codes(src, n, f->group, f->mid, d, rinv, z, B, Z, out, ahead, codes_ahead)
    KVS_INTQ_EACH_WIDTH(f->bits, zp, TOKEN_CODES);
#undef TOKEN_CODES
    return 1;
}

/* ---- the fused channel blocks ------------------------------------------- */

/* The keys (or magnitudes) of channels c..c + 15 over the block's rows:
 * their smallest at mn[c..], largest at mx[c..] (intq_avx512.c's
 * column_stats16, 16 channels a vector). */
KVS_AI void column_stats(const uint8_t *src, uint64_t stride, uint64_t rows, int zp, int16_t *mn,
                         int16_t *mx)
{
    const __m256i mag = _mm256_set1_epi16(0x7FFF);
    __m256i lo = _mm256_set1_epi16(INT16_MAX), hi = _mm256_set1_epi16(INT16_MIN);
    for (uint64_t t = 0; t < rows; t++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(src + t * stride));
        v = zp ? order_key(v) : _mm256_and_si256(v, mag);
        lo = _mm256_min_epi16(lo, v);
        hi = _mm256_max_epi16(hi, v);
    }
    _mm256_storeu_si256((__m256i *)mn, lo);
    _mm256_storeu_si256((__m256i *)mx, hi);
}

/* 16 keys as the float32 values of the even (*e) and odd (*o) ones. */
KVS_AI void keys_pairs_to_ps(const int16_t *k, __m256 *e, __m256 *o)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)k);
    __m256i ke = _mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16), ko = _mm256_srai_epi32(v, 16);
    const __m256i m = _mm256_set1_epi32(0x7FFF);
    ke = _mm256_xor_si256(ke, _mm256_and_si256(_mm256_srai_epi32(ke, 15), m));
    ko = _mm256_xor_si256(ko, _mm256_and_si256(_mm256_srai_epi32(ko, 15), m));
    *e = _mm256_castsi256_ps(_mm256_slli_epi32(ke, 16));
    *o = _mm256_castsi256_ps(_mm256_slli_epi32(ko, 16));
}

/* The stored scales (and zeros) of channels c..c + 15 from their even and
 * odd halves (scales_vec's outputs for each). */
KVS_AI void store_column_scales(uint64_t c, int f16, int zp, const __m128i sb[2],
                                const __m128i zb[2], const __m256 sv[2], const __m256 zv[2],
                                uint8_t *scales, uint8_t *zeros)
{
    for (int w = 0; w < 1 + (zp != 0); w++) {
        uint8_t *out = w ? zeros : scales;
        const __m128i *b = w ? zb : sb;
        const __m256 *v = w ? zv : sv;
        if (f16) {
            _mm_storeu_si128((__m128i *)(out + 2 * c), _mm_unpacklo_epi16(b[0], b[1]));
            _mm_storeu_si128((__m128i *)(out + 2 * c + 16), _mm_unpackhi_epi16(b[0], b[1]));
        } else { /* unpacks work in 128-bit lanes: then the lanes in order */
            __m256 lo = _mm256_unpacklo_ps(v[0], v[1]), hi = _mm256_unpackhi_ps(v[0], v[1]);
            _mm256_storeu_ps((float *)(void *)(out + 4 * c), _mm256_permute2f128_ps(lo, hi, 0x20));
            _mm256_storeu_ps((float *)(void *)(out + 4 * c + 32),
                             _mm256_permute2f128_ps(lo, hi, 0x31));
        }
    }
}

/* The codes of channels c..c + 31 of row x by grid16 (nonzero: some need
 * codes16), or (exact) by codes16; the divisors, reciprocals and zeros of
 * the even channels of each 16 at d[c..c + 7], of the odd ones at
 * d[c + 8..c + 15]. */
KVS_AI int column_chunk(const uint8_t *x, uint64_t c, const float *d, const float *rinv,
                        const float *z, __m256 grid, __m256i kmid, __m256i imid, unsigned bits,
                        int zp, int exact, uint8_t *out)
{
    __m256i p[2];
    int near = 0;
    for (int h = 0; h < 2; h++) {
        uint64_t k = c + 16 * h;
        __m256i v = _mm256_loadu_si256((const __m256i *)(x + 2 * k));
        __m256 ie = _mm256_loadu_ps(rinv + k), io = _mm256_loadu_ps(rinv + k + 8);
        __m256 ze = _mm256_loadu_ps(z + k), zo = _mm256_loadu_ps(z + k + 8);
        if (exact) {
            __m256i ce, co;
            codes16(v, _mm256_loadu_ps(d + k), _mm256_loadu_ps(d + k + 8), ie, io, ze, zo, kmid,
                    imid, zp, &ce, &co);
            p[h] = _mm256_or_si256(ce, _mm256_slli_epi32(co, (int)bits));
        } else {
            near |= grid16(v, ie, io, ze, zo, grid, bits, zp, &p[h]);
        }
    }
    pack_pairs(p[0], p[1], bits, out + c * bits / 8);
    return near;
}

/* intq_avx512.c's encode_channel_bf16 in 8-lane vectors: the channels'
 * statistics over the block, every scale checked before any is stored,
 * then each row's codes 32 channels at a time by grid16 and the chunks it
 * leaves by codes16 once per window of 64 chunks (token_codes'); a block
 * with a NaN reciprocal by codes16 throughout. */
KVS_AI void column_codes(const uint8_t *src, uint64_t stride, uint64_t rows, uint64_t n,
                         const kvs_intq_rowfmt *f, const float *d, const float *rinv,
                         const float *z, unsigned bits, int zp, uint8_t *codes,
                         uint64_t row_bytes, const uint8_t *ahead)
{
    const __m256 magic = _mm256_set1_ps(0x1.8p23f), grid = grid_of(f->mid);
    const __m256i imid = _mm256_set1_epi32((int)f->mid);
    const __m256i kmid = _mm256_sub_epi32(_mm256_castps_si256(magic), imid);
    int nan = 0;
    for (uint64_t c = 0; c < n; c++) nan |= rinv[c] != rinv[c];
    uint64_t near = 0, j = 0, per_row = n / 32; /* the window's flags; chunk j of the block */
    for (uint64_t t = 0; t < rows; t++) {
        const uint8_t *x = src + t * stride;
        for (uint64_t c = 0; c < n; c += 32, j++) {
            if (ahead) _mm_prefetch((const char *)(ahead + t * stride + 2 * c), _MM_HINT_T1);
            near |= (uint64_t)column_chunk(x, c, d, rinv, z, grid, kmid, imid, bits, zp, nan,
                                           codes + t * row_bytes)
                    << (j % KVS_INTQ_NEAR_WINDOW);
            if (j % KVS_INTQ_NEAR_WINDOW == KVS_INTQ_NEAR_WINDOW - 1 ||
                (t == rows - 1 && c + 32 == n))
                for (uint64_t b = j - j % KVS_INTQ_NEAR_WINDOW; near; near &= near - 1) {
                    uint64_t jj = b + (uint64_t)__builtin_ctzll(near), tt = jj / per_row;
                    column_chunk(src + tt * stride, 32 * (jj % per_row), d, rinv, z, grid, kmid,
                                 imid, bits, zp, 1, codes + tt * row_bytes);
                }
        }
    }
}

static int encode_channel_bf16(const uint8_t *src, uint64_t stride, uint64_t rows, uint64_t n,
                               const kvs_intq_rowfmt *f, uint8_t *scales_out, uint8_t *zeros,
                               uint8_t *codes, uint64_t row_bytes, int16_t *keys, float *d,
                               float *z, float *rinv, const uint8_t *ahead)
{
    int16_t *mn = keys, *mx = keys + n;
    int zp = f->zero_point, f16 = f->scale_f16;
    for (uint64_t c = 0; c < n; c += 16) column_stats(src + 2 * c, stride, rows, zp, mn + c, mx + c);
    for (uint64_t c = 0; c < n; c++)
        if (keys_refused(mn[c], mx[c], zp)) return 0;
    /* every channel's scales known to fit before any is stored; then
     * computed again, for the stored bits */
    const __m256 steps = _mm256_set1_ps(f->steps);
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t c = 0; c < n; c += 16) {
            __m256 lo[2], hi[2], sv[2], zv[2], dv[2];
            __m128i sb[2], zb[2];
            keys_pairs_to_ps(mx + c, &hi[0], &hi[1]);
            if (zp) keys_pairs_to_ps(mn + c, &lo[0], &lo[1]);
            else lo[0] = hi[0], lo[1] = hi[1];
            for (int h = 0; h < 2; h++) {
                if (!scales_vec(lo[h], hi[h], zp, f16, steps, &sb[h], &zb[h], &sv[h], &zv[h], &dv[h]))
                    return 0; /* (pass 1 computes what pass 0 found to fit) */
                if (pass == 0) {
                    _mm256_storeu_ps(d + c + 8 * h, dv[h]);
                    _mm256_storeu_ps(z + c + 8 * h, zv[h]);
                    _mm256_storeu_ps(rinv + c + 8 * h, reciprocal(dv[h]));
                }
            }
            if (pass) store_column_scales(c, f16, zp, sb, zb, sv, zv, scales_out, zeros);
        }
#define COLUMN_CODES(B, Z) \
    column_codes(src, stride, rows, n, f, d, rinv, z, B, Z, codes, row_bytes, ahead)
    KVS_INTQ_EACH_WIDTH(f->bits, zp, COLUMN_CODES);
#undef COLUMN_CODES
    return 1;
}

/* ---- the unfused rows (the channel axis's blocks) ------------------------ */

static int widen_bf16(const uint8_t *src, uint64_t n, float *out)
{
    const __m128i exp = _mm_set1_epi16(0x7F80);
    __m128i bad = _mm_setzero_si128();
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(src + 2 * i));
        bad = _mm_or_si128(bad, _mm_cmpeq_epi16(_mm_and_si128(h, exp), exp));
        _mm256_storeu_si256((__m256i *)(void *)(out + i), _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    int any = !_mm_testz_si128(bad, bad);
    for (; i < n; i++) {
        uint32_t h = (uint32_t)src[2 * i] | (uint32_t)src[2 * i + 1] << 8, f = h << 16;
        memcpy(out + i, &f, 4);
        any |= (h & 0x7F80) == 0x7F80;
    }
    return any;
}

/* scales() 8 groups at a time, in blocks of 16 (the contract's unit of
 * refusal); a short last block padded with empty groups (lo = hi = 0,
 * which fit) in a local buffer. */
static uint64_t scales(const float *mn, const float *mx, uint64_t n, int zp, int f16,
                       float steps, uint8_t *scales_out, uint8_t *zeros, float *inv, float *zero)
{
    const __m256 st = _mm256_set1_ps(steps);
    size_t ss = f16 ? 2 : 4;
    for (uint64_t i = 0; i < n; i += 16) {
        uint64_t m = n - i < 16 ? n - i : 16;
        float lo[16] = {0}, hi[16] = {0}, d[16], zz[16];
        uint8_t sb[64], zb[64];
        memcpy(lo, mn + i, 4 * m); /* (before inv / zero, which may alias them) */
        memcpy(hi, mx + i, 4 * m);
        for (int h = 0; h < 2; h++) {
            __m256 s, z, dv;
            __m128i sh, zh;
            if (!scales_vec(_mm256_loadu_ps(lo + 8 * h), _mm256_loadu_ps(hi + 8 * h), zp, f16, st,
                            &sh, &zh, &s, &z, &dv))
                return i;
            _mm256_storeu_ps(d + 8 * h, dv);
            _mm256_storeu_ps(zz + 8 * h, z);
            store_scale_bits(sb, zb, (uint64_t)h, f16, sh, zh, s, z);
        }
        memcpy(scales_out + i * ss, sb, m * ss);
        if (zp) memcpy(zeros + i * ss, zb, m * ss);
        memcpy(inv + i, d, 4 * m);
        memcpy(zero + i, zz, 4 * m);
    }
    return n;
}

/* rint(y / r) as intq_avx512.c's rounded_quotient: the product by rinv,
 * and the division where it is within 2^-12 of a half or NaN. */
KVS_AI __m256 rounded_quotient(__m256 y, __m256 r, __m256 rinv)
{
    enum { rn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC };
    __m256 q = _mm256_mul_ps(y, rinv), qi = _mm256_round_ps(q, rn);
    __m256 near = _mm256_cmp_ps(abs_ps(_mm256_sub_ps(q, qi)), _mm256_set1_ps(0.5f - 0x1p-12f),
                                _CMP_NLT_UQ);
    if (_mm256_testz_ps(near, near)) return qi;
    return _mm256_blendv_ps(qi, _mm256_round_ps(_mm256_div_ps(y, r), rn), near);
}

/* 8 codes: rint((x - z) / r) clamped to [lo, hi] (the portable code's
 * comparisons, operands in its order), plus mid, as bytes at out. */
KVS_AI void codes8_at(__m256 x, __m256 r, __m256 rinv, __m256 z, __m256 lo, __m256 hi,
                      __m256 mid, uint8_t *out)
{
    __m256 q = rounded_quotient(_mm256_sub_ps(x, z), r, rinv);
    q = _mm256_min_ps(hi, _mm256_max_ps(lo, q));
    __m256i c = _mm256_cvttps_epi32(_mm256_add_ps(q, mid));
    c = _mm256_packus_epi16(_mm256_packus_epi32(c, c), c); /* (each lane's dword 0) */
    _mm_storel_epi64((__m128i *)out,
                     _mm_unpacklo_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1)));
}

/* x[0..n) with one divisor, reciprocal and zero (per_elem 0) or one each
 * (1); rinv NULL: divisions (a NaN reciprocal). The tail through a local
 * buffer of 8. */
KVS_AI void quantize1(const float *x, uint64_t n, const float *r, const float *rinv,
                      const float *z, int per_elem, __m256 lo, __m256 hi, __m256 mid,
                      uint8_t *codes)
{
    __m256 vr = _mm256_set1_ps(r[0]), vz = _mm256_set1_ps(z[0]);
    __m256 vi = _mm256_set1_ps(rinv ? rinv[0] : __builtin_nanf(""));
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        if (per_elem) {
            vr = _mm256_loadu_ps(r + i), vz = _mm256_loadu_ps(z + i);
            if (rinv) vi = _mm256_loadu_ps(rinv + i);
        }
        codes8_at(_mm256_loadu_ps(x + i), vr, vi, vz, lo, hi, mid, codes + i);
    }
    if (i < n) {
        uint64_t m = n - i;
        float tx[8] = {0}, tr[8] = {1, 1, 1, 1, 1, 1, 1, 1}, tz[8] = {0}, ti[8] = {0};
        uint8_t tc[8];
        memcpy(tx, x + i, 4 * m);
        if (per_elem) {
            memcpy(tr, r + i, 4 * m), memcpy(tz, z + i, 4 * m);
            if (rinv) memcpy(ti, rinv + i, 4 * m);
            vr = _mm256_loadu_ps(tr), vz = _mm256_loadu_ps(tz);
            if (rinv) vi = _mm256_loadu_ps(ti);
        }
        codes8_at(_mm256_loadu_ps(tx), vr, vi, vz, lo, hi, mid, tc);
        memcpy(codes + i, tc, m);
    }
}

static void quantize(const float *x, uint64_t n, const float *r, const float *rinv,
                     const float *z, uint64_t group, float lo, float hi, float mid,
                     uint8_t *codes)
{
    const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi), vmid = _mm256_set1_ps(mid);
    if (group == 1) {
        quantize1(x, n, r, rinv, z, 1, vlo, vhi, vmid, codes);
        return;
    }
    for (uint64_t c0 = 0, k = 0; c0 < n; c0 += group, k++)
        quantize1(x + c0, n - c0 < group ? n - c0 : group, r + k, rinv ? rinv + k : NULL, z + k,
                  0, vlo, vhi, vmid, codes + c0);
}

static void reciprocals(const float *r, uint64_t n, float *out)
{
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, reciprocal(_mm256_loadu_ps(r + i)));
    if (i < n) {
        float t[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        memcpy(t, r + i, 4 * (n - i));
        _mm256_storeu_ps(t, reciprocal(_mm256_loadu_ps(t)));
        memcpy(out + i, t, 4 * (n - i));
    }
}

static void load_scales(const uint8_t *p, uint64_t n, int f16, float *out)
{
    if (!f16) { /* little-endian float32 already */
        memcpy(out, p, 4 * n);
        return;
    }
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * i))));
    for (; i < n; i++) out[i] = _cvtsh_ss((unsigned short)(p[2 * i] | p[2 * i + 1] << 8));
}

/* ---- decode ------------------------------------------------------------ */

/* 8 float32 -> bfloat16 bits in 32-bit lanes (half.h's
 * kvs_f32_bits_to_bf16_bits: NaN quieted, else round to nearest even). */
KVS_AI __m256i bf16x8(__m256 v)
{
    __m256i f = _mm256_castps_si256(v);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(f, _mm256_set1_epi32(0x7FFFFFFF)),
                                     _mm256_set1_epi32(0x7F800000));
    __m256i hi = _mm256_srli_epi32(f, 16);
    __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(f, _mm256_set1_epi32(0x7FFF)), lsb), 16);
    return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}

/* The codes of elements e..e + 7 of a row `bits` wide as 32-bit lanes. */
KVS_AI __m256i codes8(const uint8_t *in, uint64_t e, unsigned bits)
{
    if (bits == 8) return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(in + e)));
    uint32_t w;
    if (bits == 4) {
        memcpy(&w, in + e / 2, 4);
        return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)w),
                                                  _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                _mm256_set1_epi32(15));
    }
    uint16_t h;
    memcpy(&h, in + e / 4, 2);
    return _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(h),
                                              _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                            _mm256_set1_epi32(3));
}

/* x = (u - mid) s + z: a product, then a sum (not fused, as in C). */
KVS_AI __m256 dequant8(__m256i u, __m256 s, __m256 z, __m256 mid)
{
    return _mm256_add_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(u), mid), s), z);
}

/* bf16x8 of two vectors (elements 0-7, 8-15) as 16 words in order. */
KVS_AI __m256i bf16x16(__m256 a, __m256 b)
{
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16x8(a), bf16x8(b)), 0xD8);
}

KVS_AI void store32(uint8_t *o, __m256i v, int stream)
{
    if (stream) _mm256_stream_si256((__m256i *)(void *)o, v);
    else _mm256_storeu_si256((__m256i *)(void *)o, v);
}

/* decode_bf16, 16 elements at a time; group 1 (a scale and zero per
 * element) or a multiple of 16, whose chunks left are counted (no
 * division per chunk). bits: a constant in each copy. */
KVS_AI void decode_rows(const uint8_t *in, uint64_t n, unsigned bits, const float *s,
                        const float *z, uint64_t group, __m256 vmid, uint8_t *dst, int stream,
                        const uint8_t *ahead)
{
    uint64_t k = 0, left = group / 16;
    __m256 vs = _mm256_set1_ps(s[0]), vz = _mm256_set1_ps(z[0]);
    for (uint64_t e = 0; e < n; e += 16) {
        prefetch_line(ahead, e, bits);
        __m256 x0, x1;
        if (group == 1) {
            x0 = dequant8(codes8(in, e, bits), _mm256_loadu_ps(s + e), _mm256_loadu_ps(z + e), vmid);
            x1 = dequant8(codes8(in, e + 8, bits), _mm256_loadu_ps(s + e + 8),
                          _mm256_loadu_ps(z + e + 8), vmid);
        } else {
            x0 = dequant8(codes8(in, e, bits), vs, vz, vmid);
            x1 = dequant8(codes8(in, e + 8, bits), vs, vz, vmid);
            if (--left == 0 && e + 16 < n) {
                ++k, left = group / 16;
                vs = _mm256_set1_ps(s[k]), vz = _mm256_set1_ps(z[k]);
            }
        }
        store32(dst + 2 * e, bf16x16(x0, x1), stream);
    }
}

/* 32 codes 2 or 4 bits wide (elements e..e + 31), one per byte in order. */
KVS_AI __m256i codes32(const uint8_t *in, uint64_t e, unsigned bits)
{
    const __m128i m4 = _mm_set1_epi8(15);
    if (bits == 4) {
        __m128i x = _mm_loadu_si128((const __m128i *)(in + e / 2));
        __m128i lo = _mm_and_si128(x, m4), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m4);
        return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    }
    /* 8 bytes: each byte's codes 0-1 (bits 0-3) and 2-3 (bits 4-7) as
     * nibbles, then the nibbles' two codes */
    const __m128i m2 = _mm_set1_epi8(3);
    __m128i x = _mm_loadl_epi64((const __m128i *)(in + e / 4));
    __m128i nib = _mm_unpacklo_epi8(_mm_and_si128(x, m4), _mm_and_si128(_mm_srli_epi16(x, 4), m4));
    __m128i lo = _mm_and_si128(nib, m2), hi = _mm_and_si128(_mm_srli_epi16(nib, 2), m2);
    return _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
}

/* decode_bf16 of 2- or 4-bit codes in groups of a multiple of 32, as
 * intq_avx512.c's decode_lookup: a group's codes take at most 16 values,
 * so its 16 bfloat16 results are made once (dequant8 and bf16x8 of the
 * codes 0..15, the same operations on the same lanes) and 32 elements
 * are two byte lookups (vpshufb of the results' low and high bytes). */
KVS_AI void decode_lookup(const uint8_t *in, uint64_t n, unsigned bits, const float *s,
                          const float *z, uint64_t group, __m256 vmid, uint8_t *dst, int stream,
                          const uint8_t *ahead)
{
    /* a word's low bytes to bytes 0-7, high bytes to 8-15, in each lane */
    const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                           0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    __m256i tlo = _mm256_setzero_si256(), thi = tlo;
    for (uint64_t e = 0, k = 0, left = 0; e < n; e += 32) {
        prefetch_line(ahead, e, bits);
        if (left == 0) {
            __m256 vs = _mm256_set1_ps(s[k]), vz = _mm256_set1_ps(z[k]);
            __m256i w = bf16x16(dequant8(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), vs, vz, vmid),
                                dequant8(_mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15), vs, vz, vmid));
            /* lane 0: results 0-7 low bytes, then high; lane 1: 8-15 */
            __m256i b = _mm256_shuffle_epi8(w, split);
            __m256i lo = _mm256_permute4x64_epi64(b, 0x88), hi = _mm256_permute4x64_epi64(b, 0xDD);
            /* qwords (r0-7, r8-15) in both lanes: the 16-entry tables */
            tlo = lo, thi = hi;
            k++, left = group / 32;
        }
        left--;
        __m256i c = codes32(in, e, bits);
        __m256i lo = _mm256_shuffle_epi8(tlo, c), hi = _mm256_shuffle_epi8(thi, c);
        /* (in lanes: elements 0-7 and 16-23, then 8-15 and 24-31) */
        __m256i a = _mm256_unpacklo_epi8(lo, hi), b = _mm256_unpackhi_epi8(lo, hi);
        store32(dst + 2 * e, _mm256_permute2x128_si256(a, b, 0x20), stream);
        store32(dst + 2 * e + 32, _mm256_permute2x128_si256(a, b, 0x31), stream);
    }
}

static void decode_bf16(const uint8_t *in, uint64_t n, unsigned bits, const float *s,
                        const float *z, uint64_t group, float mid, uint8_t *dst, int stream,
                        const uint8_t *ahead)
{
    const __m256 vmid = _mm256_set1_ps(mid);
    stream = stream && (uintptr_t)dst % 64 == 0;
    if (bits != 8 && group % 32 == 0) decode_lookup(in, n, bits, s, z, group, vmid, dst, stream, ahead);
    else if (bits == 8) decode_rows(in, n, 8, s, z, group, vmid, dst, stream, ahead);
    else if (bits == 4) decode_rows(in, n, 4, s, z, group, vmid, dst, stream, ahead);
    else decode_rows(in, n, 2, s, z, group, vmid, dst, stream, ahead);
}

static void store_fence(void)
{
    _mm_sfence();
}

static const kvs_intq_kernels avx2_kernels = {
    .isa = "avx2",
    .widen_bf16 = widen_bf16,
    .scales = scales,
    .quantize = quantize,
    .reciprocals = reciprocals,
    .load_scales = load_scales,
    .encode_token_bf16 = encode_token_bf16,
    .encode_channel_bf16 = encode_channel_bf16,
    .decode_bf16 = decode_bf16,
    .store_fence = store_fence,
};

const kvs_intq_kernels *kvs_intq_kernels_avx2(void)
{
    return &avx2_kernels;
}
