/* intq_avx512.c - the integer quantizer's AVX-512 kernels (intq_kernels.h):
 * the same IEEE float32 operations as intq.c's portable code, in the same
 * order, 16 lanes at a time (but for the codes' divisions, most of which
 * become products whose rounding provably agrees), so the same bytes.
 *
 * Why each is exact: vminps / vmaxps compute `a < b ? a : b` /
 * `a > b ? a : b` with their operands in the order the portable code
 * writes them (so -0 and +0 resolve alike); vroundps (to nearest even)
 * is rintf, of the same quotient wherever the product by a reciprocal
 * could round otherwise (quotient, below); the float16 rounding of
 * scales up and of zero points down is vcvtps2ph with that rounding
 * direction, which is what the portable code's round-to-nearest-then-step
 * gives for every finite float32 (overflow included: up past 65504 is
 * inf, down is 65504, and -inf below -65504); bfloat16 narrowing is the
 * integer rounding of half.h, or in the fused decoder vcvtne2ps2bf16 for
 * a line with no subnormal value (which that instruction reads as 0).
 * Tails use masked loads and stores, so no byte past n is read or written.
 * The fused rows (encode_token_bf16, encode_channel_bf16, decode_bf16)
 * are the same operations on values kept in registers: statistics on the
 * 16-bit patterns (magnitudes or order keys, whose extremes are the
 * values' extremes) and codes from the even and odd bfloat16 of each
 * 32-bit lane; what they cannot do exactly they leave to intq.c's
 * ordinary path, writing nothing. The Hadamard rotation (hadamard, and
 * in the rotated rows widen_rotated_bf16 / decode_rotated_bf16) does the
 * portable butterflies' operations on the same values (below, "Hadamard
 * rotation"); the odd widths' packing moves the same bits (pack_odd).
 */
#include <immintrin.h>
#include <string.h>

#include "codecs/intq_kernels.h"

#define KVS_AI static inline __attribute__((always_inline))

/* The mask of the first n lanes (all 16 from n = 16 on; first32: n < 32). */
KVS_AI __mmask16 first16(uint64_t n) { return (__mmask16)((1u << (n < 16 ? n : 16)) - 1); }
KVS_AI __mmask32 first32(uint64_t n) { return (__mmask32)((1ull << n) - 1); }

/* Lanes whose value is finite (neither inf nor NaN). */
KVS_AI __mmask16 finite(__m512 v)
{
    const __m512i exp = _mm512_set1_epi32(0x7F800000);
    return _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), exp), exp);
}

/* The line of `ahead` (NULL: none) that lines up with the codes of
 * elements i.. of a row `bits` wide, once per 64-byte line of codes: the
 * fused rows' prefetch (into L1) of the payload a few rows on, the codes
 * to be read (decode_bf16's `ahead`) or stored (encode_token_bf16's
 * `codes_ahead`, whose lines are then read for ownership before the
 * stores wait on it; prefetchw was no faster than this). */
KVS_AI void prefetch_line(const uint8_t *ahead, uint64_t i, unsigned bits)
{
    if (ahead && i * bits % 512 == 0)
        _mm_prefetch((const char *)(ahead + i * bits / 8), _MM_HINT_T0);
}

/* ---- encode ------------------------------------------------------------ */

/* 16 bfloat16 as float32 lanes. */
KVS_AI __m512 bf16_to_ps(__m256i h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

KVS_AI __mmask16 widen16(const uint8_t *src, __mmask16 k, float *out)
{
    __m256i h = _mm256_maskz_loadu_epi16(k, src);
    const __m256i exp = _mm256_set1_epi16(0x7F80);
    __mmask16 bad = _mm256_mask_cmpeq_epi16_mask(k, _mm256_and_si256(h, exp), exp);
    _mm512_mask_storeu_ps(out, k, bf16_to_ps(h));
    return bad;
}

static int widen_bf16(const uint8_t *src, uint64_t n, float *out)
{
    __mmask16 bad = 0;
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) bad |= widen16(src + 2 * i, 0xFFFF, out + i);
    if (i < n) bad |= widen16(src + 2 * i, first16(n - i), out + i);
    return bad != 0;
}

KVS_AI void minmax1(const float *x, uint64_t n, float *mn, float *mx)
{
    __m512 lo = _mm512_set1_ps(x[0]), hi = lo;
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        lo = _mm512_min_ps(v, lo);
        hi = _mm512_max_ps(v, hi);
    }
    if (i < n) {
        __mmask16 k = first16(n - i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        lo = _mm512_mask_min_ps(lo, k, v, lo);
        hi = _mm512_mask_max_ps(hi, k, v, hi);
    }
    *mn = _mm512_reduce_min_ps(lo);
    *mx = _mm512_reduce_max_ps(hi);
}

static void minmax(const float *x, uint64_t n, uint64_t group, float *mn, float *mx)
{
    for (uint64_t c0 = 0, k = 0; c0 < n; c0 += group, k++)
        minmax1(x + c0, n - c0 < group ? n - c0 : group, &mn[k], &mx[k]);
}

static void fold_columns(const float *x, uint64_t n, float *mn, float *mx)
{
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        _mm512_storeu_ps(mn + i, _mm512_min_ps(v, _mm512_loadu_ps(mn + i)));
        _mm512_storeu_ps(mx + i, _mm512_max_ps(v, _mm512_loadu_ps(mx + i)));
    }
    if (i < n) {
        __mmask16 k = first16(n - i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        _mm512_mask_storeu_ps(mn + i, k, _mm512_min_ps(v, _mm512_maskz_loadu_ps(k, mn + i)));
        _mm512_mask_storeu_ps(mx + i, k, _mm512_max_ps(v, _mm512_maskz_loadu_ps(k, mx + i)));
    }
}

/* range / steps rounded up (intq.c's scale_up): the quotient, then one
 * ulp up while it is finite and s x steps < range. */
KVS_AI __m512 scale_up(__m512 range, __m512 steps)
{
    __m512 s = _mm512_div_ps(range, steps);
    for (;;) {
        __mmask16 low = _mm512_mask_cmp_ps_mask(finite(s), _mm512_mul_ps(s, steps), range,
                                                _CMP_LT_OQ);
        if (!low) return s;
        /* s >= 0 here: the next float up is the next bit pattern */
        s = _mm512_castsi512_ps(_mm512_mask_add_epi32(_mm512_castps_si512(s), low,
                                                      _mm512_castps_si512(s), _mm512_set1_epi32(1)));
    }
}

/* The scales and zero points of 16 groups (lanes k) with values in
 * [lo, hi]: their stored bits (*sb, *zb: float16; else s, z are stored),
 * the divisors (*inv: s, or 1 for s = 0) and zeros (*z); returns 0 if one
 * of them does not fit. */
KVS_AI int scales_vec(__m512 lo, __m512 hi, __mmask16 k, int zp, int f16, __m512 steps,
                      __m256i *sb, __m256i *zb, __m512 *s, __m512 *z, __m512 *inv)
{
    __m512 range;
    *z = _mm512_setzero_ps();
    *zb = *sb = _mm256_setzero_si256();
    if (zp) {
        if (f16) {
            *zb = _mm512_cvt_roundps_ph(lo, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
            *z = _mm512_cvtph_ps(*zb);
        } else {
            *z = lo;
        }
        range = _mm512_sub_ps(hi, *z);
    } else {
        range = _mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi));
    }
    *s = scale_up(range, steps);
    if (f16) {
        *sb = _mm512_cvt_roundps_ph(*s, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
        *s = _mm512_cvtph_ps(*sb);
    }
    if ((finite(*s) & finite(*z) & k) != k) return 0;
    /* a scale of 0 (every value of the group is z) divides by 1 */
    __mmask16 pos = _mm512_cmp_ps_mask(*s, _mm512_setzero_ps(), _CMP_GT_OQ);
    *inv = _mm512_mask_blend_ps(pos, _mm512_set1_ps(1.0f), *s);
    return 1;
}

/* The stored bytes of scales_vec's 16 groups (lanes k) at group i. */
KVS_AI void store_scales(uint64_t i, __mmask16 k, int zp, int f16, __m256i sb, __m256i zb,
                         __m512 s, __m512 z, uint8_t *scales, uint8_t *zeros)
{
    if (f16) {
        _mm256_mask_storeu_epi16(scales + 2 * i, k, sb);
        if (zp) _mm256_mask_storeu_epi16(zeros + 2 * i, k, zb);
    } else {
        _mm512_mask_storeu_ps(scales + 4 * i, k, s);
        if (zp) _mm512_mask_storeu_ps(zeros + 4 * i, k, z);
    }
}

/* 16 groups (lanes k): 0 if one of them does not fit, else their scales
 * and zero points stored. */
KVS_AI int scales16(const float *mn, const float *mx, uint64_t i, __mmask16 k, int zp, int f16,
                    __m512 steps, uint8_t *scales, uint8_t *zeros, float *inv, float *zero)
{
    __m512 s, z, d;
    __m256i sb, zb;
    if (!scales_vec(_mm512_maskz_loadu_ps(k, mn + i), _mm512_maskz_loadu_ps(k, mx + i), k, zp,
                    f16, steps, &sb, &zb, &s, &z, &d))
        return 0;
    store_scales(i, k, zp, f16, sb, zb, s, z, scales, zeros);
    _mm512_mask_storeu_ps(inv + i, k, d);
    _mm512_mask_storeu_ps(zero + i, k, z);
    return 1;
}

static uint64_t scales(const float *mn, const float *mx, uint64_t n, int zp, int f16,
                       float steps, uint8_t *scales_out, uint8_t *zeros, float *inv, float *zero)
{
    const __m512 st = _mm512_set1_ps(steps);
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16)
        if (!scales16(mn, mx, i, 0xFFFF, zp, f16, st, scales_out, zeros, inv, zero)) return i;
    if (i < n && !scales16(mn, mx, i, first16(n - i), zp, f16, st, scales_out, zeros, inv, zero))
        return i;
    return n;
}

/* rint(y / r), with y x rinv for the quotient (rinv = 1 / r rounded, a
 * normal float; NaN where it is not), and the exact quotient only for the
 * lanes where the product q is NaN or inf or within 2^-12 of a
 * half-integer, for codes clamped to [lo, hi] with |lo|, |hi| <= 255
 * (code_range: levels <= 256). Why that is exact: with v = y / r, q is
 * within |v| 2^-23 (1 + 2^-24) of v (two roundings of 2^-24 each; a
 * subnormal product is within 2^-150 of v and far from a half), and RN(v),
 * what the portable code rounds, within |v| 2^-24. Where |q| >= 256, v and
 * RN(v) are past 255.5 on q's side, so both codes clamp to the same bound.
 * Where |q| < 256, a q farther than 2^-12 > |q| 2^-20 from the
 * half-integer between its neighbouring integers has v and RN(v) strictly
 * on its side, so rint gives the same integer. That distance is
 * 0.5 - |q - rint(q)|, and |q - rint(q)| (q's fraction, exact) is compared
 * with 0.5 - 2^-12 (a float) directly: the test is one subtraction and one
 * comparison, with rint(q) the rounding the codes need anyway. A NaN
 * (rinv NaN) or inf product fails "farther than" (unordered) and is
 * divided. (Before 2026-12-01 the test was |q| 2^-20, a product and two
 * more operations per 16 codes; the constant holds more lanes near, which
 * divide: the same codes.) */
KVS_AI __m512 rounded_quotient(__m512 y, __m512 r, __m512 rinv)
{
    enum { rn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }; /* a constant, for clang */
    __m512 q = _mm512_mul_ps(y, rinv);
    __m512 qi = _mm512_roundscale_ps(q, rn);
    __mmask16 near = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(q, qi)),
                                        _mm512_set1_ps(0.5f - 0x1p-12f), _CMP_NLT_UQ);
    return near ? _mm512_mask_roundscale_ps(qi, near, _mm512_mask_div_ps(q, near, y, r), rn) : qi;
}

/* 16 codes as 32-bit lanes: rint((x - z) / r) clamped to [lo, hi], plus
 * mid (rinv: as rounded_quotient's). */
KVS_AI __m512i code_lanes(__m512 x, __m512 r, __m512 rinv, __m512 z, __m512 lo, __m512 hi,
                          __m512 mid)
{
    __m512 q = rounded_quotient(_mm512_sub_ps(x, z), r, rinv);
    q = _mm512_max_ps(lo, q); /* q < lo ? lo : q */
    q = _mm512_min_ps(hi, q); /* q > hi ? hi : q */
    return _mm512_cvttps_epi32(_mm512_add_ps(q, mid));
}

/* code_lanes for the fused rows, which need no clamp: there every y =
 * x - z lies in [-range, range] (in [0, range] with a zero point: z <= the
 * group's minimum, and a float difference keeps the order) and the
 * divisor r >= range / steps (1 - 2^-24) - 2^-150 / steps (scale_up's
 * check s x steps >= range, rounded; float16 scales only larger); range,
 * a nonzero bfloat16 difference, is at least 2^-133, so |y / r| < steps +
 * 2^-9, steps <= 255, and the product and the division (within 2^-22 of
 * it) round to at most steps = hi = -lo: the clamps never act. A zero point
 * has mid 0; without one z is 0 and x - 0 is x (-0 included). zp: a
 * constant in each copy. */
KVS_AI __m512i fused_lanes(__m512 x, __m512 r, __m512 rinv, __m512 z, __m512 mid, int zp)
{
    if (zp) return _mm512_cvttps_epi32(rounded_quotient(_mm512_sub_ps(x, z), r, rinv));
    return _mm512_cvttps_epi32(_mm512_add_ps(rounded_quotient(x, r, rinv), mid));
}

/* The near lanes of fused_pair's vector (y = x - z, divisor r, q = y x
 * 1 / r, f = q - rint(q), codes c) redone as rounded_quotient's: the
 * division and its rounding, plus mid. */
KVS_AI __m512i near_codes(__m512 y, __m512 r, __m512 f, __m512 mid, __m512i c)
{
    enum { rn = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC };
    __mmask16 near = _mm512_cmp_ps_mask(_mm512_abs_ps(f), _mm512_set1_ps(0.5f - 0x1p-12f),
                                        _CMP_NLT_UQ);
    __m512i v = _mm512_cvt_roundps_epi32(_mm512_maskz_div_ps(near, y, r), rn);
    return _mm512_mask_add_epi32(c, near, v, _mm512_cvttps_epi32(mid));
}

/* fused_lanes of two vectors at once (the even and odd elements of 32:
 * divisors re / ro, reciprocals ie / io, zeros ze / zo), in fewer
 * operations. `paired`: no reciprocal is NaN, or both vectors' are (else
 * fused_lanes each, whose unordered test divides NaN products). Then every
 * finite |q| is below 256.01
 * (fused_lanes' bound), and rint(q) is (q + M) - M with M = 1.5 x 2^23:
 * q + M lies in [2^23, 2^24), where the spacing is 1, so it rounds to M
 * plus the integer nearest q (ties to even: M is even), exactly, and the
 * low bits of q + M less those of M are that integer; less those of M
 * less mid, the code. Two operations and one integer subtraction for
 * vrndscaleps (two uops), the add of mid and vcvttps2dq. The near-half
 * test (rounded_quotient's, the same fraction q - rint(q)) of both
 * vectors is one vrangeps (the larger magnitude of each pair of lanes;
 * with one NaN it gives the other operand, which is why `paired`; of two,
 * NaN) and one comparison; where it holds, the divisions of near_codes. */
KVS_AI void fused_pair(__m512 xe, __m512 xo, __m512 re, __m512 ro, __m512 ie, __m512 io,
                       __m512 ze, __m512 zo, __m512 mid, int zp, int paired, __m512i *ce,
                       __m512i *co)
{
    if (!paired) {
        *ce = fused_lanes(xe, re, ie, ze, mid, zp);
        *co = fused_lanes(xo, ro, io, zo, mid, zp);
        return;
    }
    const __m512 magic = _mm512_set1_ps(0x1.8p23f);
    const __m512i kmid = _mm512_sub_epi32(_mm512_castps_si512(magic), _mm512_cvttps_epi32(mid));
    __m512 ye = zp ? _mm512_sub_ps(xe, ze) : xe, yo = zp ? _mm512_sub_ps(xo, zo) : xo;
    __m512 qe = _mm512_mul_ps(ye, ie), qo = _mm512_mul_ps(yo, io);
    __m512 te = _mm512_add_ps(qe, magic), to = _mm512_add_ps(qo, magic);
    __m512 fe = _mm512_sub_ps(qe, _mm512_sub_ps(te, magic));
    __m512 fo = _mm512_sub_ps(qo, _mm512_sub_ps(to, magic));
    *ce = _mm512_sub_epi32(_mm512_castps_si512(te), kmid);
    *co = _mm512_sub_epi32(_mm512_castps_si512(to), kmid);
    if (_mm512_cmp_ps_mask(_mm512_range_ps(fe, fo, 0x0B), _mm512_set1_ps(0.5f - 0x1p-12f),
                           _CMP_NLT_UQ)) {
        *ce = near_codes(ye, re, fe, mid, *ce);
        *co = near_codes(yo, ro, fo, mid, *co);
    }
}

/* The fused encoders' codes of 32 elements (the even and odd ones of
 * fused_pair's, paired: no reciprocal NaN), each in one FMA, with a test
 * of their own for the lanes whose code needs fused_pair. With m the
 * integer part of mid (fused_pair's kmid) and G = 1.5 x 2^10 + m + 1/2,
 * w = RN(y x rinv + G) lies in [2^10, 2^11) (|y x rinv| < 256.01 and m
 * <= 255, fused_pair's bounds), where the spacing is 2^-13, so w = G + g
 * with g the exact product y x rinv rounded to a multiple of 2^-13, and
 * w's bits are those of 2^10 + 2^9 plus (g + 1/2 + m) 2^13: bits 13 up
 * hold floor(g + 1/2) + m over 0x22600 (whose low byte is 0, so the low
 * byte of w >> 13 is the code), the low 13 bits g + 1/2's fraction. Where
 * that fraction is not 0 (g is not a half-integer), g is at least 2^-13
 * from every half-integer and the exact product within 2^-14 of g, so at
 * least 2^-14 from one on g's side; the quotient v = y / r is within |v|
 * 2^-24 < 2^-15.9 of the product (rinv = RN(1 / r), a normal float), so
 * v and RN(v), what the portable code rounds, lie strictly on that side
 * too: floor(g + 1/2) = rint(RN(v)), the reference's code, with no clamp
 * (fused_lanes: the fused rows need none). Where the fraction is 0 (one
 * lane in 8192 of products spread evenly, more where values are halves
 * of a step, whose quotients are exact ties; a NaN product's low bits are
 * 0 too, though no caller passes a NaN reciprocal) the 32 codes are made
 * again by fused_pair. Returns nonzero for those; *we, *wo: the sums'
 * bits. */
KVS_AI __mmask16 pair_grid(__m512 xe, __m512 xo, __m512 ie, __m512 io, __m512 ze, __m512 zo,
                           __m512 grid, int zp, __m512i *we, __m512i *wo)
{
    const __m512i frac = _mm512_set1_epi32(0x1FFF);
    __m512 ye = zp ? _mm512_sub_ps(xe, ze) : xe, yo = zp ? _mm512_sub_ps(xo, zo) : xo;
    *we = _mm512_castps_si512(_mm512_fmadd_ps(ye, ie, grid));
    *wo = _mm512_castps_si512(_mm512_fmadd_ps(yo, io, grid));
    return _mm512_testn_epi32_mask(*we, frac) | _mm512_testn_epi32_mask(*wo, frac);
}

/* pair_grid's G for a row format's mid. */
KVS_AI __m512 grid_of(float mid) { return _mm512_set1_ps(kvs_intq_grid(mid)); }

/* The same as bytes. */
KVS_AI __m128i codes16(__m512 x, __m512 r, __m512 rinv, __m512 z, __m512 lo, __m512 hi,
                       __m512 mid)
{
    return _mm512_cvtepi32_epi8(code_lanes(x, r, rinv, z, lo, hi, mid));
}

/* x[0..n) with one divisor, reciprocal and zero (per_elem 0) or one each
 * (1); rinv NULL: divisions. */
KVS_AI void quantize1(const float *x, uint64_t n, const float *r, const float *rinv,
                      const float *z, int per_elem, __m512 vlo, __m512 vhi, __m512 vmid,
                      uint8_t *codes)
{
    __m512 vr = _mm512_set1_ps(r[0]), vz = _mm512_set1_ps(z[0]);
    __m512 vinv = _mm512_set1_ps(rinv ? rinv[0] : __builtin_nanf("")); /* NaN: divide */
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (per_elem) {
            vr = _mm512_loadu_ps(r + i), vz = _mm512_loadu_ps(z + i);
            if (rinv) vinv = _mm512_loadu_ps(rinv + i);
        }
        _mm_storeu_si128((__m128i *)(codes + i),
                         codes16(_mm512_loadu_ps(x + i), vr, vinv, vz, vlo, vhi, vmid));
    }
    if (i < n) {
        __mmask16 k = first16(n - i);
        if (per_elem) {
            vr = _mm512_maskz_loadu_ps(k, r + i), vz = _mm512_maskz_loadu_ps(k, z + i);
            if (rinv) vinv = _mm512_maskz_loadu_ps(k, rinv + i);
        }
        _mm_mask_storeu_epi8(codes + i, k,
                             codes16(_mm512_maskz_loadu_ps(k, x + i), vr, vinv, vz, vlo, vhi,
                                     vmid));
    }
}

static void quantize(const float *x, uint64_t n, const float *r, const float *rinv,
                     const float *z, uint64_t group, float lo, float hi, float mid,
                     uint8_t *codes)
{
    const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi), vmid = _mm512_set1_ps(mid);
    if (group == 1) {
        quantize1(x, n, r, rinv, z, 1, vlo, vhi, vmid, codes);
        return;
    }
    for (uint64_t c0 = 0, k = 0; c0 < n; c0 += group, k++)
        quantize1(x + c0, n - c0 < group ? n - c0 : group, r + k, rinv ? rinv + k : NULL, z + k,
                  0, vlo, vhi, vmid, codes + c0);
}

/* 1 / r where that is a normal float, else NaN (r > 0): a product by it
 * is NaN, which rounded_quotient divides. */
KVS_AI __m512 reciprocal(__m512 r)
{
    __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), r);
    __mmask16 ok = finite(inv) & _mm512_cmp_ps_mask(inv, _mm512_set1_ps(0x1p-126f), _CMP_GE_OQ);
    return _mm512_mask_mov_ps(_mm512_set1_ps(__builtin_nanf("")), ok, inv);
}

static void reciprocals(const float *r, uint64_t n, float *out)
{
    for (uint64_t i = 0; i < n; i += 16) {
        __mmask16 k = first16(n - i);
        /* (masked-off lanes divide 1 by 0: inf, not stored) */
        _mm512_mask_storeu_ps(out + i, k, reciprocal(_mm512_maskz_loadu_ps(k, r + i)));
    }
}

/* 4 bits: the codes of a byte as one little-endian 16-bit word, w | w >> 4
 * (as intq.c's pack_codes; codes are below 16). */
KVS_AI __m512i fold4(__m512i w)
{
    return _mm512_or_si512(w, _mm512_srli_epi16(w, 4));
}

static void pack4(const uint8_t *codes, uint64_t n, uint8_t *out)
{
    uint64_t pairs = n / 2, i = 0;
    for (; i + 32 <= pairs; i += 32) {
        __m512i w = _mm512_loadu_si512(codes + 2 * i);
        _mm256_storeu_si256((__m256i *)(out + i),
                            _mm512_cvtepi16_epi8(fold4(w)));
    }
    if (i < pairs) {
        __m512i w = _mm512_maskz_loadu_epi16(first32(pairs - i), codes + 2 * i);
        _mm512_mask_cvtepi16_storeu_epi8(out + i, first32(pairs - i), fold4(w));
    }
    if (n & 1) out[n / 2] = codes[n - 1];
}

/* 2 bits: four codes as one 32-bit word, w | w >> 6 | w >> 12 | w >> 18. */
KVS_AI __m512i fold2(__m512i w)
{
    return _mm512_or_si512(_mm512_or_si512(w, _mm512_srli_epi32(w, 6)),
                           _mm512_or_si512(_mm512_srli_epi32(w, 12), _mm512_srli_epi32(w, 18)));
}

static void pack2(const uint8_t *codes, uint64_t n, uint8_t *out)
{
    uint64_t quads = n / 4, i = 0;
    for (; i + 16 <= quads; i += 16)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm512_cvtepi32_epi8(fold2(_mm512_loadu_si512(codes + 4 * i))));
    if (i < quads)
        _mm512_mask_cvtepi32_storeu_epi8(
            out + i, first16(quads - i),
            fold2(_mm512_maskz_loadu_epi32(first16(quads - i), codes + 4 * i)));
    if (n % 4) {
        unsigned v = 0;
        for (unsigned k = 0; quads * 4 + k < n; k++) v |= (unsigned)codes[quads * 4 + k] << (2 * k);
        out[quads] = (uint8_t)v;
    }
}

/* 3, 5, 6 and 7 bits: eight codes (the bytes of a 64-bit lane) folded
 * to their 8 x bits bits at the bottom of the lane in three steps, each
 * joining the neighbouring fields of a 16-, then 32-, then 64-bit lane:
 * the low field as it is, the high one shifted down next to it, one
 * bitwise select (vpternlogq) under the low field's mask; codes are below
 * 2^bits, so what the shift brings below that mask is the low field's own
 * bits, which the select drops. Then the `bits` bytes of each lane are
 * gathered by one byte permute (VBMI): pack_codes' LSB-first stream is
 * this little-endian layout. */
KVS_AI __m512i select_bits(__m512i mask, __m512i a, __m512i b)
{
    return _mm512_ternarylogic_epi64(mask, a, b, 0xCA); /* mask ? a : b, bit by bit */
}

KVS_AI __m512i fold_odd(__m512i w, unsigned bits)
{
    w = select_bits(_mm512_set1_epi16((short)((1u << bits) - 1)), w,
                    _mm512_srli_epi16(w, 8 - bits));
    w = select_bits(_mm512_set1_epi32((int)((1u << 2 * bits) - 1)), w,
                    _mm512_srli_epi32(w, 16 - 2 * bits));
    return select_bits(_mm512_set1_epi64((long long)((1ull << 4 * bits) - 1)), w,
                       _mm512_srli_epi64(w, 32 - 4 * bits));
}

/* The byte tables of the odd widths, built from their definitions (k, a
 * byte of a 64-byte vector): pack's gather, byte k of the packed block
 * from byte k % bits of lane k / bits; unpack's spread, lane i's byte j
 * from packed byte i x bits + j, and the bit offset (j x bits) of code j
 * within that lane for vpmultishiftqb. */
#define ODD_PACK(b, k) ((k) < 8 * (b) ? (k) / (b) * 8 + (k) % (b) : 0)
#define ODD_GATHER(b, k) ((k) / 8 * (b) + (k) % 8)
#define ODD_SHIFT(b, k) ((k) % 8 * (b))
#define ODD_8(f, b, k) f(b, k), f(b, k + 1), f(b, k + 2), f(b, k + 3), f(b, k + 4), \
                       f(b, k + 5), f(b, k + 6), f(b, k + 7)
#define ODD_64(f, b) {ODD_8(f, b, 0), ODD_8(f, b, 8), ODD_8(f, b, 16), ODD_8(f, b, 24), \
                      ODD_8(f, b, 32), ODD_8(f, b, 40), ODD_8(f, b, 48), ODD_8(f, b, 56)}
#define ODD_TABLES(f) {{0}, {0}, {0}, ODD_64(f, 3), {0}, ODD_64(f, 5), ODD_64(f, 6), ODD_64(f, 7)}
static const uint8_t odd_pack_index[8][64] = ODD_TABLES(ODD_PACK);
static const uint8_t odd_gather_index[8][64] = ODD_TABLES(ODD_GATHER);
static const uint8_t odd_shift_index[8][64] = ODD_TABLES(ODD_SHIFT);

/* The mask of the first n bytes (n <= 64). */
KVS_AI __mmask64 first64(uint64_t n) { return n >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << n) - 1; }

/* 64 codes a block, 8 x bits bytes out; the tail's codes masked (zeros,
 * as the portable accumulator's empty high bits) and only its
 * ceil(m x bits / 8) bytes stored. bits: a constant in each copy. */
KVS_AI void pack_odd(const uint8_t *codes, uint64_t n, uint8_t *out, unsigned bits)
{
    const __m512i index = _mm512_loadu_si512(odd_pack_index[bits]);
    uint64_t i = 0;
    for (; i + 64 <= n; i += 64)
        _mm512_mask_storeu_epi8(out + i / 8 * bits, first64(8 * bits),
                                _mm512_permutexvar_epi8(index, fold_odd(_mm512_loadu_si512(codes + i), bits)));
    if (i < n) {
        __m512i w = _mm512_maskz_loadu_epi8(first64(n - i), codes + i);
        _mm512_mask_storeu_epi8(out + i / 8 * bits, first64(((n - i) * bits + 7) / 8),
                                _mm512_permutexvar_epi8(index, fold_odd(w, bits)));
    }
}

static void pack3(const uint8_t *codes, uint64_t n, uint8_t *out) { pack_odd(codes, n, out, 3); }
static void pack5(const uint8_t *codes, uint64_t n, uint8_t *out) { pack_odd(codes, n, out, 5); }
static void pack6(const uint8_t *codes, uint64_t n, uint8_t *out) { pack_odd(codes, n, out, 6); }
static void pack7(const uint8_t *codes, uint64_t n, uint8_t *out) { pack_odd(codes, n, out, 7); }

/* 64 codes (one per byte) from a block of 8 x bits packed bytes: lane i
 * gets packed bytes i x bits.., each of its bytes j the 8 bits from bit j
 * x bits on (vpmultishiftqb; at most bit 7 x bits + 7 < 64, inside the
 * lane), masked to the code. */
KVS_AI __m512i spread_odd(__m512i packed, unsigned bits)
{
    __m512i lanes = _mm512_permutexvar_epi8(_mm512_loadu_si512(odd_gather_index[bits]), packed);
    __m512i c = _mm512_multishift_epi64_epi8(_mm512_loadu_si512(odd_shift_index[bits]), lanes);
    return _mm512_and_si512(c, _mm512_set1_epi8((char)((1u << bits) - 1)));
}

/* The tail reads only its ceil(m x bits / 8) bytes, as unpack_codes. */
KVS_AI void unpack_odd(const uint8_t *in, uint64_t n, uint8_t *codes, unsigned bits)
{
    uint64_t i = 0;
    for (; i + 64 <= n; i += 64)
        _mm512_storeu_si512(codes + i, spread_odd(_mm512_maskz_loadu_epi8(first64(8 * bits),
                                                                          in + i / 8 * bits), bits));
    if (i < n)
        _mm512_mask_storeu_epi8(codes + i, first64(n - i),
                                spread_odd(_mm512_maskz_loadu_epi8(first64(((n - i) * bits + 7) / 8),
                                                                   in + i / 8 * bits), bits));
}

static void unpack3(const uint8_t *in, uint64_t n, uint8_t *codes) { unpack_odd(in, n, codes, 3); }
static void unpack5(const uint8_t *in, uint64_t n, uint8_t *codes) { unpack_odd(in, n, codes, 5); }
static void unpack6(const uint8_t *in, uint64_t n, uint8_t *codes) { unpack_odd(in, n, codes, 6); }
static void unpack7(const uint8_t *in, uint64_t n, uint8_t *codes) { unpack_odd(in, n, codes, 7); }

/* ---- fused token rows (encode) ---------------------------------------- */

/* bfloat16 bits as signed 16-bit keys in the order of their values (a
 * negative one's magnitude bits flipped, so -0 sorts just below +0), and
 * back: the map is its own inverse. */
KVS_AI __m512i order_key(__m512i h)
{
    return _mm512_xor_si512(h, _mm512_srli_epi16(_mm512_srai_epi16(h, 15), 1));
}

/* The smallest / largest of 32 signed 16-bit lanes (phminposuw finds the
 * unsigned minimum of 8: the sign bit flipped, or all bits for the max). */
KVS_AI int16_t hmin16(__m512i v)
{
    __m256i a = _mm256_min_epi16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i b = _mm_min_epi16(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    b = _mm_xor_si128(b, _mm_set1_epi16(INT16_MIN));
    return (int16_t)(_mm_cvtsi128_si32(_mm_minpos_epu16(b)) ^ 0x8000);
}

KVS_AI int16_t hmax16(__m512i v)
{
    __m256i a = _mm256_max_epi16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
    __m128i b = _mm_max_epi16(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));
    b = _mm_xor_si128(b, _mm_set1_epi16(INT16_MAX));
    return (int16_t)(_mm_cvtsi128_si32(_mm_minpos_epu16(b)) ^ 0x7FFF);
}

/* The statistics of a group in the 16-bit patterns, 32 at a time (no
 * float row): with a zero point the keys' minimum and maximum, else the
 * largest magnitude (|x| of a bfloat16 is its low 15 bits, which order as
 * the values: fabsf of the reference, -0 included). */
KVS_AI void group_stats16(const uint8_t *p, uint64_t group, int zp, int16_t *mn, int16_t *mx)
{
    const __m512i mag = _mm512_set1_epi16(0x7FFF);
    __m512i v = _mm512_loadu_si512(p);
    v = zp ? order_key(v) : _mm512_and_si512(v, mag);
    __m512i lo = v, hi = v;
    for (uint64_t j = 32; j < group; j += 32) {
        v = _mm512_loadu_si512(p + 2 * j);
        v = zp ? order_key(v) : _mm512_and_si512(v, mag);
        lo = _mm512_min_epi16(lo, v);
        hi = _mm512_max_epi16(hi, v);
    }
    *mx = hmax16(hi);
    if (zp) *mn = hmin16(lo);
}

/* Keys (or magnitudes) of 16 groups back to float32 lanes. */
KVS_AI __m512 keys_to_ps(__m256i key)
{
    return bf16_to_ps(_mm512_castsi512_si256(order_key(_mm512_castsi256_si512(key))));
}

/* 32 codes `bits` wide packed at out from lanes of pairs t (the even
 * code in bits 0..bits-1, its odd neighbour's above it: the byte or word
 * the portable pack_codes makes; for 2 bits the lane's bits 4-7 and
 * 28-31 zero, as two pairs per 64-bit lane become one byte). */
KVS_AI void narrow_pairs(__m512i t, unsigned bits, uint8_t *out)
{
    if (bits == 8)
        _mm256_storeu_si256((__m256i *)out, _mm512_cvtepi32_epi16(t));
    else if (bits == 4)
        _mm_storeu_si128((__m128i *)out, _mm512_cvtepi32_epi8(t));
    else /* two pairs per 64-bit lane: the high one's 4 bits up to bit 4 */
        _mm_storel_epi64((__m128i *)out,
                         _mm512_cvtepi64_epi8(_mm512_or_si512(t, _mm512_srli_epi64(t, 28))));
}

/* The codes of 32 consecutive elements as an even and an odd vector
 * (32-bit lanes), packed `bits` wide at out. */
KVS_AI void pack_pairs(__m512i ev, __m512i od, unsigned bits, uint8_t *out)
{
    narrow_pairs(_mm512_or_si512(ev, _mm512_slli_epi32(od, bits)), bits, out);
}

/* The same from pair_grid's sums: the even code is the low byte of we >>
 * 13 (bits 0..bits-1, zeros above them to bit 7); the odd one, shifted
 * up by `bits`, comes with we >> (13 - bits), whose bits from `bits` to 7
 * are the code and up to bit 20 the constant's (none in bits 4-7 or from
 * bit 21 on: what narrow_pairs' 2-bit form needs); the bits below
 * `bits` are the even code's (one bit-select). */
KVS_AI void pack_grid(__m512i we, __m512i wo, unsigned bits, uint8_t *out)
{
    const __m512i low = _mm512_set1_epi32((int)((1u << bits) - 1));
    __m512i t = _mm512_ternarylogic_epi32(low, _mm512_srli_epi32(we, 13),
                                          _mm512_srli_epi32(wo, 13 - bits), 0xCA);
    narrow_pairs(t, bits, out);
}

/* The even and odd elements of 32 bfloat16 as float32 lanes. */
KVS_AI __m512 even_ps(__m512i v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
KVS_AI __m512 odd_ps(__m512i v)
{
    return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
}

/* The 32 codes of elements e.. e + 31 of src (one group: divisor r,
 * its reciprocal ri, zero zz) packed `bits` wide at out. A pair of bfloat16 is one 32-bit
 * lane: the even element is its low half shifted up, the odd one its high
 * half masked, so the codes come as an even and an odd vector with no
 * shuffle, and packing is an OR of them (the byte the portable pack_codes
 * makes of 2 or 4 codes) and one narrowing: the shuffle port was the
 * limit, with a widening and a narrowing per 16 codes. */
KVS_AI void codes32_packed(const uint8_t *src, uint64_t e, __m512 r, __m512 ri, __m512 zz,
                           __m512 mid, unsigned bits, int zp, uint8_t *out)
{
    /* paired always: both vectors have the group's reciprocal, so where it
     * is NaN every product of both is, and vrangeps of two NaN is NaN */
    __m512i v = _mm512_loadu_si512(src + 2 * e), ev, od;
    fused_pair(even_ps(v), odd_ps(v), r, r, ri, ri, zz, zz, mid, zp, 1, &ev, &od);
    pack_pairs(ev, od, bits, out + e * bits / 8);
}

/* The codes of the 32 bfloat16 v by pair_grid (reciprocals and zeros of
 * the even and odd elements ie, io, ze, zo; grid: grid_of(mid)), packed
 * at out: nonzero where fused_pair must make them. */
KVS_AI int grid_chunk(__m512i v, __m512 ie, __m512 io, __m512 ze, __m512 zo, __m512 grid,
                      unsigned bits, int zp, uint8_t *out)
{
    __m512i we, wo;
    __mmask16 near = pair_grid(even_ps(v), odd_ps(v), ie, io, ze, zo, grid, zp, &we, &wo);
    pack_grid(we, wo, bits, out);
    return near != 0;
}

/* The chunks of a token row flagged in `near` (bit b: the chunk of
 * elements 32 (first + b)..) made again whole by codes32_packed. */
KVS_AI void token_fixups(const uint8_t *src, uint64_t first, uint64_t near, uint64_t group,
                         const float *d, const float *rinv, const float *z, __m512 mid,
                         unsigned bits, int zp, uint8_t *out)
{
    for (; near; near &= near - 1) {
        uint64_t e = 32 * (first + (uint64_t)__builtin_ctzll(near)), k = e / group;
        codes32_packed(src, e, _mm512_set1_ps(d[k]), _mm512_set1_ps(rinv[k]),
                       _mm512_set1_ps(z[k]), mid, bits, zp, out);
    }
}

/* The codes of a row, group by group (bits a constant in each copy, so
 * the loop has no branch on it); a row with a NaN reciprocal (a divisor
 * whose reciprocal is not a normal float) by fused_pair. Otherwise the
 * chunks of 32 codes are made by pair_grid, a bit set for each chunk it
 * cannot make, and those chunks made again by fused_pair (the same codes
 * as the portable loop's, stored over the first ones) once per window of
 * KVS_INTQ_NEAR_WINDOW chunks and at the row's end: the branch then
 * depends only on the window's bits, where a branch per chunk waited on
 * its products and, mispredicted, threw away the chunks after it. Per 32
 * codes (int8, no zero point) 10 vector instructions besides the load and
 * the store, where fused_pair and pack_pairs take 17; on AMD Zen 4 at 256
 * MiB the int8 / int4 / int2 presets encode at 10.7 / 9.6 / 8.3 GB/s
 * against 9.7 / 8.2 / 7.0 before (docs/performance.md, 2026-12-07).
 * column_codes does the same over a block's rows. */
KVS_AI void token_codes(const uint8_t *src, uint64_t n, const kvs_intq_rowfmt *f,
                        const float *d, const float *rinv, const float *z, unsigned bits,
                        int zp, uint8_t *out, const uint8_t *ahead, const uint8_t *codes_ahead)
{
    const __m512 mid = _mm512_set1_ps(f->mid), grid = grid_of(f->mid);
    __mmask16 nan = 0;
    for (uint64_t k = 0; k < n / f->group; k += 16) {
        __m512 ri = _mm512_maskz_loadu_ps(first16(n / f->group - k), rinv + k);
        nan |= _mm512_cmp_ps_mask(ri, ri, _CMP_UNORD_Q);
    }
    uint64_t near = 0, j = 0; /* the window's flags; chunk j of the row */
    for (uint64_t c0 = 0, k = 0; c0 < n; c0 += f->group, k++) {
        const __m512 ri = _mm512_set1_ps(rinv[k]), zz = _mm512_set1_ps(z[k]);
        for (uint64_t e = c0; e < c0 + f->group; e += 32, j++) {
            if (ahead) _mm_prefetch((const char *)(ahead + 2 * e), _MM_HINT_T0);
            prefetch_line(codes_ahead, e, bits);
            if (nan) {
                codes32_packed(src, e, _mm512_set1_ps(d[k]), ri, zz, mid, bits, zp, out);
                continue;
            }
            near |= (uint64_t)grid_chunk(_mm512_loadu_si512(src + 2 * e), ri, ri, zz, zz, grid,
                                         bits, zp, out + e * bits / 8)
                    << (j % KVS_INTQ_NEAR_WINDOW);
            if (j % KVS_INTQ_NEAR_WINDOW == KVS_INTQ_NEAR_WINDOW - 1 || e + 32 == n) {
                token_fixups(src, j - j % KVS_INTQ_NEAR_WINDOW, near, f->group, d, rinv, z, mid,
                             bits, zp, out);
                near = 0;
            }
        }
    }
}

static int encode_token_bf16(const uint8_t *src, uint64_t n, const kvs_intq_rowfmt *f,
                             uint8_t *scales_out, uint8_t *zeros, uint8_t *out,
                             const uint8_t *ahead, const uint8_t *codes_ahead)
{
    int16_t mn[KVS_INTQ_FUSED_GROUPS], mx[KVS_INTQ_FUSED_GROUPS];
    float d[KVS_INTQ_FUSED_GROUPS], rinv[KVS_INTQ_FUSED_GROUPS], z[KVS_INTQ_FUSED_GROUPS];
    __m512 sv[KVS_INTQ_FUSED_GROUPS / 16], zv[KVS_INTQ_FUSED_GROUPS / 16];
    __m256i sb[KVS_INTQ_FUSED_GROUPS / 16], zb[KVS_INTQ_FUSED_GROUPS / 16];
    uint64_t ng = n / f->group;
    int zp = f->zero_point;
    /* statistics of every group, then their scales; nothing is written
     * until every group's are known to fit */
    for (uint64_t k = 0; k < ng; k++) group_stats16(src + 2 * k * f->group, f->group, zp, &mn[k], &mx[k]);
    for (uint64_t b = 0; b * 16 < ng; b++) {
        __mmask16 k = first16(ng - 16 * b);
        __m256i hi = _mm256_maskz_loadu_epi16(k, mx + 16 * b), lo = hi;
        /* not finite: a magnitude or key past the largest finite one;
         * with a zero point, a minimum of +-0 (keys 0 and -1), whose sign
         * the stored zero point keeps (a maximum of +-0 above a nonzero
         * minimum gives the same range either way) */
        __mmask16 bad = _mm256_mask_cmpge_epi16_mask(k, hi, _mm256_set1_epi16(0x7F80));
        if (zp) {
            lo = _mm256_maskz_loadu_epi16(k, mn + 16 * b);
            bad |= _mm256_mask_cmple_epi16_mask(k, lo, _mm256_set1_epi16(-0x7F81));
            bad |= _mm256_mask_cmplt_epu16_mask(k, _mm256_add_epi16(lo, _mm256_set1_epi16(1)),
                                                _mm256_set1_epi16(2));
        }
        __m512 dv;
        if (bad || !scales_vec(keys_to_ps(lo), keys_to_ps(hi), k, zp, f->scale_f16,
                               _mm512_set1_ps(f->steps), &sb[b], &zb[b], &sv[b], &zv[b], &dv))
            return 0;
        _mm512_mask_storeu_ps(d + 16 * b, k, dv);
        _mm512_mask_storeu_ps(z + 16 * b, k, zv[b]);
        _mm512_mask_storeu_ps(rinv + 16 * b, k, reciprocal(dv));
    }
    for (uint64_t b = 0; b * 16 < ng; b++)
        store_scales(16 * b, first16(ng - 16 * b), zp, f->scale_f16, sb[b],
                     zb[b], sv[b], zv[b], scales_out, zeros);
#define TOKEN_CODES(B, Z) token_codes(src, n, f, d, rinv, z, B, Z, out, ahead, codes_ahead)
    KVS_INTQ_EACH_WIDTH(f->bits, zp, TOKEN_CODES);
#undef TOKEN_CODES
    return 1;
}

/* The statistics of 32 channels over rows 0..rows of the block, as
 * group_stats16's (keys or magnitudes). */
KVS_AI void column_stats16(const uint8_t *src, uint64_t stride, uint64_t rows, int zp,
                           int16_t *mn, int16_t *mx)
{
    const __m512i mag = _mm512_set1_epi16(0x7FFF);
    __m512i lo = _mm512_set1_epi16(INT16_MAX), hi = _mm512_set1_epi16(INT16_MIN);
    for (uint64_t t = 0; t < rows; t++) {
        __m512i v = _mm512_loadu_si512(src + t * stride);
        v = zp ? order_key(v) : _mm512_and_si512(v, mag);
        lo = _mm512_min_epi16(lo, v);
        hi = _mm512_max_epi16(hi, v);
    }
    _mm512_storeu_si512(mn, lo);
    _mm512_storeu_si512(mx, hi);
}

/* The keys (or magnitudes) of the even / odd ones of 32 channels as
 * sign-extended 32-bit lanes, and such lanes back to float32 values. */
KVS_AI __m512i even_keys(__m512i k) { return _mm512_srai_epi32(_mm512_slli_epi32(k, 16), 16); }
KVS_AI __m512i odd_keys(__m512i k) { return _mm512_srai_epi32(k, 16); }
KVS_AI __m512 keys32_to_ps(__m512i k)
{
    __m512i h = _mm512_xor_si512(k, _mm512_and_si512(_mm512_srai_epi32(k, 15), _mm512_set1_epi32(0x7FFF)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}

/* The scales of 16 channels (every other one of 32) from their keys (or
 * magnitudes) lo, hi: 0 where a value is not finite, a zero point's
 * minimum is +-0 (as in encode_token_bf16) or a scale does not fit. */
KVS_AI int column_scales16(__m512i lo, __m512i hi, const kvs_intq_rowfmt *f, __m256i *sb,
                           __m256i *zb, __m512 *s, __m512 *z, __m512 *d)
{
    __mmask16 bad = _mm512_cmpge_epi32_mask(hi, _mm512_set1_epi32(0x7F80));
    if (f->zero_point) {
        bad |= _mm512_cmple_epi32_mask(lo, _mm512_set1_epi32(-0x7F81));
        bad |= _mm512_cmplt_epu32_mask(_mm512_add_epi32(lo, _mm512_set1_epi32(1)), _mm512_set1_epi32(2));
    }
    int ok = scales_vec(keys32_to_ps(lo), keys32_to_ps(hi), 0xFFFF, f->zero_point, f->scale_f16,
                        _mm512_set1_ps(f->steps), sb, zb, s, z, d);
    return ok && !bad;
}

/* Even and odd lanes (channels c, c + 2, ... and c + 1, c + 3, ...) of
 * 32-bit values back into channel order. */
KVS_AI void interleave(__m512i ev, __m512i od, __m512i *first, __m512i *second)
{
    const __m512i i0 = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i i1 = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    *first = _mm512_permutex2var_epi32(ev, i0, od);
    *second = _mm512_permutex2var_epi32(ev, i1, od);
}

/* The stored scales (and zeros) of channels c.. c + 31 from their even
 * and odd halves. */
KVS_AI void store_column_scales(uint64_t c, const kvs_intq_rowfmt *f, const __m256i sb[2],
                                const __m256i zb[2], const __m512 s[2], const __m512 z[2],
                                uint8_t *scales, uint8_t *zeros)
{
    __m512i a, b;
    if (f->scale_f16) {
        interleave(_mm512_cvtepu16_epi32(sb[0]), _mm512_cvtepu16_epi32(sb[1]), &a, &b);
        _mm256_storeu_si256((__m256i *)(scales + 2 * c), _mm512_cvtepi32_epi16(a));
        _mm256_storeu_si256((__m256i *)(scales + 2 * c + 32), _mm512_cvtepi32_epi16(b));
        if (!f->zero_point) return;
        interleave(_mm512_cvtepu16_epi32(zb[0]), _mm512_cvtepu16_epi32(zb[1]), &a, &b);
        _mm256_storeu_si256((__m256i *)(zeros + 2 * c), _mm512_cvtepi32_epi16(a));
        _mm256_storeu_si256((__m256i *)(zeros + 2 * c + 32), _mm512_cvtepi32_epi16(b));
        return;
    }
    interleave(_mm512_castps_si512(s[0]), _mm512_castps_si512(s[1]), &a, &b);
    _mm512_storeu_si512(scales + 4 * c, a);
    _mm512_storeu_si512(scales + 4 * c + 64, b);
    if (!f->zero_point) return;
    interleave(_mm512_castps_si512(z[0]), _mm512_castps_si512(z[1]), &a, &b);
    _mm512_storeu_si512(zeros + 4 * c, a);
    _mm512_storeu_si512(zeros + 4 * c + 64, b);
}

/* The codes of 32 channels c.. of row x (as codes32_packed, with the
 * divisors of the even channels at d[c..c + 15] and the odd ones' at
 * d[c + 16..c + 31]); `quick`: by pair_grid, returning nonzero where
 * fused_pair must make them, else by fused_pair. */
KVS_AI int column_chunk(const uint8_t *x, uint64_t c, const float *d, const float *rinv,
                        const float *z, __m512 mid, __m512 grid, unsigned bits, int zp, int quick,
                        int paired, uint8_t *out)
{
    __m512i v = _mm512_loadu_si512(x + 2 * c);
    if (quick)
        return grid_chunk(v, _mm512_loadu_ps(rinv + c), _mm512_loadu_ps(rinv + c + 16),
                          _mm512_loadu_ps(z + c), _mm512_loadu_ps(z + c + 16), grid, bits, zp,
                          out + c * bits / 8);
    __m512i ev, od;
    fused_pair(even_ps(v), odd_ps(v), _mm512_loadu_ps(d + c), _mm512_loadu_ps(d + c + 16),
               _mm512_loadu_ps(rinv + c), _mm512_loadu_ps(rinv + c + 16), _mm512_loadu_ps(z + c),
               _mm512_loadu_ps(z + c + 16), mid, zp, paired, &ev, &od);
    pack_pairs(ev, od, bits, out + c * bits / 8);
    return 0;
}

/* The codes of a block's rows, 32 channels at a time from one bfloat16
 * load. Where no reciprocal is NaN (fused_pair's `paired`) by pair_grid
 * and the chunks it leaves by fused_pair per window (token_codes'); else
 * each by fused_pair, through fused_lanes. */
KVS_AI void column_codes(const uint8_t *src, uint64_t stride, uint64_t rows, uint64_t n,
                         const kvs_intq_rowfmt *f, const float *d, const float *rinv,
                         const float *z, unsigned bits, int zp, uint8_t *codes,
                         uint64_t row_bytes, const uint8_t *ahead)
{
    const __m512 mid = _mm512_set1_ps(f->mid), grid = grid_of(f->mid);
    __mmask16 nan = 0; /* fused_pair's `paired`: no reciprocal of the block is NaN */
    for (uint64_t c = 0; c < n; c += 16) {
        __m512 ri = _mm512_loadu_ps(rinv + c);
        nan |= _mm512_cmp_ps_mask(ri, ri, _CMP_UNORD_Q);
    }
    uint64_t near = 0, j = 0, per_row = n / 32; /* the window's flags; chunk j of the block */
    for (uint64_t t = 0; t < rows; t++) {
        const uint8_t *x = src + t * stride;
        for (uint64_t c = 0; c < n; c += 32, j++) {
            if (ahead) _mm_prefetch((const char *)(ahead + t * stride + 2 * c), _MM_HINT_T1);
            near |= (uint64_t)column_chunk(x, c, d, rinv, z, mid, grid, bits, zp, !nan, 0,
                                           codes + t * row_bytes)
                    << (j % KVS_INTQ_NEAR_WINDOW);
            if (j % KVS_INTQ_NEAR_WINDOW == KVS_INTQ_NEAR_WINDOW - 1 ||
                (t == rows - 1 && c + 32 == n)) {
                for (uint64_t b = j - j % KVS_INTQ_NEAR_WINDOW; near; near &= near - 1) {
                    uint64_t jj = b + (uint64_t)__builtin_ctzll(near), tt = jj / per_row;
                    column_chunk(src + tt * stride, 32 * (jj % per_row), d, rinv, z, mid, grid,
                                 bits, zp, 0, 1, codes + tt * row_bytes);
                }
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
    __m256i sb[2], zb[2];
    __m512 sv[2], zv[2], dv[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
    for (uint64_t c = 0; c < n; c += 32)
        column_stats16(src + 2 * c, stride, rows, f->zero_point, mn + c, mx + c);
    /* every channel's scales known to fit before any is stored; then
     * computed again, for the stored bits */
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t c = 0; c < n; c += 32) {
            __m512i lo = _mm512_loadu_si512(mn + c), hi = _mm512_loadu_si512(mx + c);
            /* (both halves computed: the second pass stores both) */
            int ok = column_scales16(even_keys(lo), even_keys(hi), f, &sb[0], &zb[0], &sv[0],
                                     &zv[0], &dv[0]);
            ok &= column_scales16(odd_keys(lo), odd_keys(hi), f, &sb[1], &zb[1], &sv[1], &zv[1],
                                  &dv[1]);
            if (pass) {
                store_column_scales(c, f, sb, zb, sv, zv, scales_out, zeros);
                continue;
            }
            if (!ok) return 0;
            for (int h = 0; h < 2; h++) {
                _mm512_storeu_ps(d + c + 16 * h, dv[h]);
                _mm512_storeu_ps(z + c + 16 * h, zv[h]);
                _mm512_storeu_ps(rinv + c + 16 * h, reciprocal(dv[h]));
            }
        }
#define COLUMN_CODES(B, Z) \
    column_codes(src, stride, rows, n, f, d, rinv, z, B, Z, codes, row_bytes, ahead)
    KVS_INTQ_EACH_WIDTH(f->bits, f->zero_point, COLUMN_CODES);
#undef COLUMN_CODES
    return 1;
}

/* ---- Hadamard rotation ------------------------------------------------ */

/* intq.c's hadamard_heads, bit for bit: the same butterflies (a + b in the
 * place of a, a - b in that of b, stage after stage of pairs len apart),
 * then the one product by 1 / sqrt(h). Each element goes through the same
 * operations on the same values as there; only the order in which
 * independent pairs are done differs, which changes nothing. Pairs len =
 * 1, 2, 4, 8 apart lie in one vector: the partner comes by a permute, and
 * v x (+1 or -1) + partner is one FMA whose product is exact, so its one
 * rounding gives a + b in a's lane and -b + a = a - b in b's (IEEE's
 * definition of a - b), zeros' signs and infinities included. NaN arises
 * only as inf - inf's (the decoder's values are finite or inf; the
 * encoder's finite), the default NaN whichever the order. */
KVS_AI __m512 stage_in(__m512 v, unsigned len)
{
    switch (len) {
    case 1:
        return _mm512_fmadd_ps(v, _mm512_setr_ps(1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1),
                               _mm512_permute_ps(v, 0xB1));
    case 2:
        return _mm512_fmadd_ps(v, _mm512_setr_ps(1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1, 1, 1, -1, -1),
                               _mm512_permute_ps(v, 0x4E));
    case 4:
        return _mm512_fmadd_ps(v, _mm512_setr_ps(1, 1, 1, 1, -1, -1, -1, -1, 1, 1, 1, 1, -1, -1, -1, -1),
                               _mm512_shuffle_f32x4(v, v, 0xB1));
    default:
        return _mm512_fmadd_ps(v, _mm512_setr_ps(1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1, -1),
                               _mm512_shuffle_f32x4(v, v, 0x4E));
    }
}

/* The stages of pairs less than min(h, 16 nv) apart of nv vectors (16 nv
 * consecutive channels, heads of h, or 16 / h heads a vector for h < 16),
 * in registers; nv and h constants in each copy. */
/* (the loops written out: GCC's -O2 kept v[] on the stack otherwise) */
#define EACH_VECTOR(i, nv, ...) \
    do { \
        if (0 < (nv)) { enum { i = 0 }; __VA_ARGS__; } \
        if (1 < (nv)) { enum { i = 1 }; __VA_ARGS__; } \
        if (2 < (nv)) { enum { i = 2 }; __VA_ARGS__; } \
        if (3 < (nv)) { enum { i = 3 }; __VA_ARGS__; } \
        if (4 < (nv)) { enum { i = 4 }; __VA_ARGS__; } \
        if (5 < (nv)) { enum { i = 5 }; __VA_ARGS__; } \
        if (6 < (nv)) { enum { i = 6 }; __VA_ARGS__; } \
        if (7 < (nv)) { enum { i = 7 }; __VA_ARGS__; } \
        if (8 < (nv)) { enum { i = 8 }; __VA_ARGS__; } \
        if (9 < (nv)) { enum { i = 9 }; __VA_ARGS__; } \
        if (10 < (nv)) { enum { i = 10 }; __VA_ARGS__; } \
        if (11 < (nv)) { enum { i = 11 }; __VA_ARGS__; } \
        if (12 < (nv)) { enum { i = 12 }; __VA_ARGS__; } \
        if (13 < (nv)) { enum { i = 13 }; __VA_ARGS__; } \
        if (14 < (nv)) { enum { i = 14 }; __VA_ARGS__; } \
        if (15 < (nv)) { enum { i = 15 }; __VA_ARGS__; } \
    } while (0)

/* The pairs l vectors apart (vector i with i + l where i & l is 0). */
#define CROSS_STAGE(v, nv, l) \
    EACH_VECTOR(i, nv, if (!(i & (l)) && i + (l) < 16) { \
        __m512 a_ = v[i], b_ = v[(i + (l)) & 15]; \
        v[i] = _mm512_add_ps(a_, b_); \
        v[(i + (l)) & 15] = _mm512_sub_ps(a_, b_); \
    })

KVS_AI void stages_in_registers(__m512 *v, unsigned nv, unsigned h)
{
    if (h > 1) EACH_VECTOR(i, nv, v[i] = stage_in(v[i], 1));
    if (h > 2) EACH_VECTOR(i, nv, v[i] = stage_in(v[i], 2));
    if (h > 4) EACH_VECTOR(i, nv, v[i] = stage_in(v[i], 4));
    if (h > 8) EACH_VECTOR(i, nv, v[i] = stage_in(v[i], 8));
    if (nv > 1 && h > 16) CROSS_STAGE(v, nv, 1);
    if (nv > 2 && h > 32) CROSS_STAGE(v, nv, 2);
    if (nv > 4 && h > 64) CROSS_STAGE(v, nv, 4);
    if (nv > 8 && h > 128) CROSS_STAGE(v, nv, 8);
}

/* nv vectors from x on through stages_in_registers, the product by norm
 * after them where `last` (no stage is left). */
KVS_AI void rotate_chunk(float *x, unsigned nv, unsigned h, int last, __m512 norm)
{
    __m512 v[16];
    EACH_VECTOR(i, nv, v[i] = _mm512_loadu_ps(x + 16 * i));
    stages_in_registers(v, nv, h);
    EACH_VECTOR(i, nv, _mm512_storeu_ps(x + 16 * i, last ? _mm512_mul_ps(v[i], norm) : v[i]));
}

/* Heads of h < 16 channels, 16 / h to a vector; the row's last heads
 * masked (D is a multiple of h). */
KVS_AI void rotate_small(float *x, uint64_t D, unsigned h, __m512 norm)
{
    uint64_t i = 0;
    for (; i + 16 <= D; i += 16) rotate_chunk(x + i, 1, h, 1, norm);
    if (i < D) {
        __mmask16 k = first16(D - i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i);
        stages_in_registers(&v, 1, h);
        _mm512_mask_storeu_ps(x + i, k, _mm512_mul_ps(v, norm));
    }
}

/* Heads of 16 to 256 channels: each head's vectors held in registers
 * through every stage (16 of the 32 at 256). */
KVS_AI void rotate_heads(float *x, uint64_t D, unsigned h, __m512 norm)
{
    for (uint64_t base = 0; base < D; base += h) rotate_chunk(x + base, h / 16, h, 1, norm);
}

/* Heads of 512 or 1024 channels: each 256 as rotate_heads' without the
 * product, then the stages 256 (and 512) apart through memory, both in
 * one pass for 1024 (pairs 256 apart, then 512, of each four vectors),
 * the product by norm in the last. */
static void rotate_large(float *x, uint64_t D, unsigned h, __m512 norm)
{
    for (uint64_t base = 0; base < D; base += h) {
        float *v = x + base;
        for (unsigned c = 0; c < h; c += 256) rotate_chunk(v + c, 16, 256, 0, norm);
        for (unsigned j = 0; j < 256; j += 16) {
            if (h == 512) {
                __m512 a = _mm512_loadu_ps(v + j), b = _mm512_loadu_ps(v + j + 256);
                _mm512_storeu_ps(v + j, _mm512_mul_ps(_mm512_add_ps(a, b), norm));
                _mm512_storeu_ps(v + j + 256, _mm512_mul_ps(_mm512_sub_ps(a, b), norm));
                continue;
            }
            __m512 a0 = _mm512_loadu_ps(v + j), a1 = _mm512_loadu_ps(v + j + 256);
            __m512 a2 = _mm512_loadu_ps(v + j + 512), a3 = _mm512_loadu_ps(v + j + 768);
            __m512 b0 = _mm512_add_ps(a0, a1), b1 = _mm512_sub_ps(a0, a1);
            __m512 b2 = _mm512_add_ps(a2, a3), b3 = _mm512_sub_ps(a2, a3);
            _mm512_storeu_ps(v + j, _mm512_mul_ps(_mm512_add_ps(b0, b2), norm));
            _mm512_storeu_ps(v + j + 256, _mm512_mul_ps(_mm512_add_ps(b1, b3), norm));
            _mm512_storeu_ps(v + j + 512, _mm512_mul_ps(_mm512_sub_ps(b0, b2), norm));
            _mm512_storeu_ps(v + j + 768, _mm512_mul_ps(_mm512_sub_ps(b1, b3), norm));
        }
    }
}

static void hadamard(float *x, uint64_t D, unsigned h)
{
    const __m512 norm = _mm512_set1_ps(1.0f / __builtin_sqrtf((float)h)); /* hadamard_heads' */
    switch (h) {
    case 2: rotate_small(x, D, 2, norm); break;
    case 4: rotate_small(x, D, 4, norm); break;
    case 8: rotate_small(x, D, 8, norm); break;
    case 16: rotate_heads(x, D, 16, norm); break;
    case 32: rotate_heads(x, D, 32, norm); break;
    case 64: rotate_heads(x, D, 64, norm); break;
    case 128: rotate_heads(x, D, 128, norm); break;
    case 256: rotate_heads(x, D, 256, norm); break;
    default: rotate_large(x, D, h, norm); break;
    }
}

/* widen_rotated_bf16: chunks of max(h, 16) elements loaded as widen16's,
 * through rotate_chunk's operations, stored; nv (the chunk's vectors) and
 * h constants in each copy. */
KVS_AI int widen_rotated(const uint8_t *src, uint64_t n, unsigned nv, unsigned h, float *out,
                         const uint8_t *ahead)
{
    const __m512 norm = _mm512_set1_ps(1.0f / __builtin_sqrtf((float)h)); /* hadamard's */
    const __m256i exp = _mm256_set1_epi16(0x7F80);
    __mmask16 bad = 0;
    for (uint64_t e = 0; e < n; e += 16 * nv) {
        __m512 v[16];
        EACH_VECTOR(i, nv, {
            if (ahead && (e + 16 * i) % 32 == 0)
                _mm_prefetch((const char *)(ahead + 2 * (e + 16 * i)), _MM_HINT_T0);
            __m256i b = _mm256_loadu_si256((const __m256i *)(src + 2 * (e + 16 * i)));
            bad |= _mm256_cmpeq_epi16_mask(_mm256_and_si256(b, exp), exp);
            v[i] = bf16_to_ps(b);
        });
        stages_in_registers(v, nv, h);
        EACH_VECTOR(i, nv, _mm512_storeu_ps(out + e + 16 * i, _mm512_mul_ps(v[i], norm)));
    }
    return bad != 0;
}

static int widen_rotated_bf16(const uint8_t *src, uint64_t n, unsigned h, float *out,
                              const uint8_t *ahead)
{
    switch (h) {
    case 2: return widen_rotated(src, n, 1, 2, out, ahead);
    case 4: return widen_rotated(src, n, 1, 4, out, ahead);
    case 8: return widen_rotated(src, n, 1, 8, out, ahead);
    case 16: return widen_rotated(src, n, 1, 16, out, ahead);
    case 32: return widen_rotated(src, n, 2, 32, out, ahead);
    case 64: return widen_rotated(src, n, 4, 64, out, ahead);
    case 128: return widen_rotated(src, n, 8, 128, out, ahead);
    default: return widen_rotated(src, n, 16, 256, out, ahead);
    }
}

/* ---- decode ------------------------------------------------------------ */

KVS_AI __m512i spread4(__m256i b)
{
    __m512i x = _mm512_cvtepu8_epi16(b);
    return _mm512_and_si512(_mm512_or_si512(x, _mm512_slli_epi16(x, 4)), _mm512_set1_epi16(0x0F0F));
}

static void unpack4(const uint8_t *in, uint64_t n, uint8_t *codes)
{
    uint64_t pairs = n / 2, i = 0;
    for (; i + 32 <= pairs; i += 32)
        _mm512_storeu_si512(codes + 2 * i, spread4(_mm256_loadu_si256((const __m256i *)(in + i))));
    if (i < pairs) {
        __mmask32 k = first32(pairs - i);
        _mm512_mask_storeu_epi16(codes + 2 * i, k, spread4(_mm256_maskz_loadu_epi8(k, in + i)));
    }
    if (n & 1) codes[n - 1] = in[n / 2] & 15;
}

KVS_AI __m512i spread2(__m128i b)
{
    __m512i x = _mm512_cvtepu8_epi32(b);
    x = _mm512_or_si512(_mm512_or_si512(x, _mm512_slli_epi32(x, 6)),
                        _mm512_or_si512(_mm512_slli_epi32(x, 12), _mm512_slli_epi32(x, 18)));
    return _mm512_and_si512(x, _mm512_set1_epi32(0x03030303));
}

static void unpack2(const uint8_t *in, uint64_t n, uint8_t *codes)
{
    uint64_t quads = n / 4, i = 0;
    for (; i + 16 <= quads; i += 16)
        _mm512_storeu_si512(codes + 4 * i, spread2(_mm_loadu_si128((const __m128i *)(in + i))));
    if (i < quads) {
        __mmask16 k = first16(quads - i);
        _mm512_mask_storeu_epi32(codes + 4 * i, k, spread2(_mm_maskz_loadu_epi8(k, in + i)));
    }
    for (uint64_t j = quads * 4; j < n; j++) codes[j] = in[j / 4] >> (2 * (j & 3)) & 3;
}

/* 16 codes (bytes) as x' = (u - mid) s + z: a multiply, then an add (not
 * fused, as in C). */
KVS_AI __m512 dequant16(__m128i u8, __m512 s, __m512 z, __m512 mid)
{
    __m512 u = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(u8));
    return _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(u, mid), s), z);
}

/* dequant16 over codes[0..n): one scale and zero (per_elem 0) or one each
 * (1). */
KVS_AI void dequantize1(const uint8_t *codes, uint64_t n, const float *s, const float *z,
                        int per_elem, __m512 vmid, float *x)
{
    __m512 vs = _mm512_set1_ps(s[0]), vz = _mm512_set1_ps(z[0]);
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (per_elem) vs = _mm512_loadu_ps(s + i), vz = _mm512_loadu_ps(z + i);
        _mm512_storeu_ps(x + i, dequant16(_mm_loadu_si128((const __m128i *)(codes + i)), vs, vz, vmid));
    }
    if (i < n) {
        __mmask16 k = first16(n - i);
        if (per_elem) vs = _mm512_maskz_loadu_ps(k, s + i), vz = _mm512_maskz_loadu_ps(k, z + i);
        _mm512_mask_storeu_ps(x + i, k, dequant16(_mm_maskz_loadu_epi8(k, codes + i), vs, vz, vmid));
    }
}

static void dequantize(const uint8_t *codes, uint64_t n, const float *s, const float *z,
                       uint64_t group, float mid, float *x)
{
    const __m512 vmid = _mm512_set1_ps(mid);
    if (group == 1) {
        dequantize1(codes, n, s, z, 1, vmid, x);
        return;
    }
    for (uint64_t c0 = 0, k = 0; c0 < n; c0 += group, k++)
        dequantize1(codes + c0, n - c0 < group ? n - c0 : group, s + k, z + k, 0, vmid, x + c0);
}

static void load_scales(const uint8_t *p, uint64_t n, int f16, float *out)
{
    for (uint64_t i = 0; i < n; i += 16) {
        __mmask16 k = first16(n - i);
        __m512 v = f16 ? _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, p + 2 * i))
                       : _mm512_maskz_loadu_ps(k, p + 4 * i);
        _mm512_mask_storeu_ps(out + i, k, v);
    }
}

/* 16 float32 -> bfloat16 bits (half.h's kvs_f32_bits_to_bf16_bits). */
KVS_AI __m256i bf16x16(__m512 v)
{
    __m512i f = _mm512_castps_si512(v);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(f, _mm512_set1_epi32(0x7FFFFFFF)),
                                            _mm512_set1_epi32(0x7F800000));
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(f, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(f, _mm512_set1_epi32(0x7FFF)), lsb), 16);
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(f, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* elements [i, i + m) of in -> dst, ordinary stores (m <= 16) */
KVS_AI void narrow_part(const float *in, uint64_t m, uint8_t *dst)
{
    __mmask16 k = first16(m);
    _mm256_mask_storeu_epi16(dst, k, bf16x16(_mm512_maskz_loadu_ps(k, in)));
}

static void narrow_bf16(const float *in, uint64_t n, uint8_t *dst, int stream)
{
    uint64_t i = 0;
    stream = stream && (uintptr_t)dst % 2 == 0;
    if (stream) { /* a head up to a line boundary, then whole lines */
        uint64_t head = (uint64_t)(-(uintptr_t)dst & 63) / 2;
        if (head > n) head = n;
        for (; i + 16 <= head; i += 16) narrow_part(in + i, 16, dst + 2 * i);
        if (i < head) narrow_part(in + i, head - i, dst + 2 * i), i = head;
        for (; i + 32 <= n; i += 32) {
            __m512i line = _mm512_inserti64x4(_mm512_castsi256_si512(bf16x16(_mm512_loadu_ps(in + i))),
                                              bf16x16(_mm512_loadu_ps(in + i + 16)), 1);
            _mm512_stream_si512((void *)(dst + 2 * i), line);
        }
    }
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + 2 * i), bf16x16(_mm512_loadu_ps(in + i)));
    if (i < n) narrow_part(in + i, n - i, dst + 2 * i);
}

/* ---- fused rows (decode) ---------------------------------------------- */

/* 16 elements from e on: dequant16 with their own scales and zeros
 * (group 1) or their group's, group *k, whose 16-element chunks left are
 * counted in *left (group a multiple of 16): a counter, not a division by
 * the group size per 16 elements (a 64-bit div, which perf showed). */
KVS_AI __m512 decode16(__m128i u8, const float *s, const float *z, uint64_t group, uint64_t e,
                       uint64_t *k, uint64_t *left, __m512 vmid, int centred)
{
    __m512 vs = group == 1 ? _mm512_loadu_ps(s + e) : _mm512_set1_ps(s[*k]);
    __m512 vz = group == 1 ? _mm512_loadu_ps(z + e) : _mm512_set1_ps(z[*k]);
    if (group != 1 && --*left == 0) ++*k, *left = group / 16;
    if (!centred) return dequant16(u8, vs, vz, vmid);
    /* the codes' bit 7 flipped (decode_rows): as signed bytes they are
     * u - 128, so the float is (float)u - mid exactly, with no subtraction */
    return _mm512_add_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(u8)), vs), vz);
}

/* 32 float32 (a: elements 0-15, b: 16-31) as one line of bfloat16:
 * vcvtne2ps2bf16, one instruction where bf16x16 takes nine and a
 * narrowing each, gives bf16x16's bits (round to nearest even, a NaN
 * quieted alike) except for a subnormal input, which it reads as 0; a
 * line with one takes bf16x16. (A normal float32 never rounds to a
 * subnormal bfloat16: the exponent ranges are the same.) */
KVS_AI __m512i bf16x32(__m512 a, __m512 b)
{
    /* subnormal: 2 x bits (the sign shifted out) from 2 to 0xFFFFFE, so
     * 2 x bits - 1 below 0xFFFFFF unsigned (0 wraps to the top) */
    const __m512i one = _mm512_set1_epi32(1);
    __m512i ia = _mm512_castps_si512(a), ib = _mm512_castps_si512(b);
    __m512i low = _mm512_min_epu32(_mm512_sub_epi32(_mm512_add_epi32(ia, ia), one),
                                   _mm512_sub_epi32(_mm512_add_epi32(ib, ib), one));
    if (_mm512_cmplt_epu32_mask(low, _mm512_set1_epi32(0xFFFFFF)))
        return _mm512_inserti64x4(_mm512_castsi256_si512(bf16x16(a)), bf16x16(b), 1);
    return (__m512i)_mm512_cvtne2ps_pbh(b, a);
}

/* decode_bf16 of 2- or 4-bit codes in groups of a multiple of 32: a
 * group's elements take at most 16 values, so its 16 bfloat16 results are
 * made once (dequant16 and bf16x32 of the codes 0..15: the same operations
 * on the same lanes, and bf16x32's result is each lane's own) and a line of
 * 32 elements is one lookup (vpermw), not 2 x 4 conversions and
 * products and a narrowing. */
KVS_AI void decode_lookup(const uint8_t *in, uint64_t n, unsigned bits, const float *s,
                          const float *z, uint64_t group, __m512 vmid, uint8_t *dst, int stream,
                          const uint8_t *ahead)
{
    const __m128i iota = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i table = _mm512_setzero_si512();
    uint64_t k = 0, left = 0; /* the group of the line, and its lines left */
    for (uint64_t i = 0; i < n; i += 64) {
        prefetch_line(ahead, i, bits);
        /* 64 codes, one per byte */
        __m512i c = bits == 4 ? spread4(_mm256_loadu_si256((const __m256i *)(in + i / 2)))
                              : spread2(_mm_loadu_si128((const __m128i *)(in + i / 4)));
        for (int h = 0; h < 2; h++) {
            if (left == 0) {
                __m512 x = dequant16(iota, _mm512_set1_ps(s[k]), _mm512_set1_ps(z[k]), vmid);
                table = bf16x32(x, x);
                k++, left = group / 32;
            }
            left--;
            __m512i line = _mm512_permutexvar_epi16(
                _mm512_cvtepu8_epi16(h ? _mm512_extracti64x4_epi64(c, 1) : _mm512_castsi512_si256(c)),
                table);
            uint8_t *o = dst + 2 * (i + 32 * (uint64_t)h);
            if (stream) _mm512_stream_si512((void *)o, line);
            else _mm512_storeu_si512(o, line);
        }
    }
}

/* decode_bf16 but the lookup; centred: 8-bit codes of mid 128, whose bit 7
 * is flipped once per 64 codes to save a subtraction per 16 (a constant in
 * each copy). */
KVS_AI void decode_rows(const uint8_t *in, uint64_t n, unsigned bits, const float *s,
                        const float *z, uint64_t group, __m512 vmid, uint8_t *dst, int stream,
                        int centred, const uint8_t *ahead)
{
    uint64_t k = 0, left = group / 16; /* decode16's group and chunks left */
    for (uint64_t i = 0; i < n; i += 64) {
        prefetch_line(ahead, i, bits);
        __m512i c;
        if (centred) c = _mm512_xor_si512(_mm512_loadu_si512(in + i), _mm512_set1_epi8((char)0x80));
        else if (bits == 8) c = _mm512_loadu_si512(in + i);
        else if (bits == 4) c = spread4(_mm256_loadu_si256((const __m256i *)(in + i / 2)));
        else c = spread2(_mm_loadu_si128((const __m128i *)(in + i / 4)));
        /* two 64-byte lines of bfloat16 */
        __m512 x0 = decode16(_mm512_castsi512_si128(c), s, z, group, i, &k, &left, vmid,
                              centred);
        __m512 x1 = decode16(_mm512_extracti32x4_epi32(c, 1), s, z, group, i + 16, &k, &left, vmid,
                              centred);
        __m512 x2 = decode16(_mm512_extracti32x4_epi32(c, 2), s, z, group, i + 32, &k, &left, vmid,
                              centred);
        __m512 x3 = decode16(_mm512_extracti32x4_epi32(c, 3), s, z, group, i + 48, &k, &left, vmid,
                              centred);
        __m512i a = bf16x32(x0, x1), b = bf16x32(x2, x3);
        if (stream) {
            _mm512_stream_si512((void *)(dst + 2 * i), a);
            _mm512_stream_si512((void *)(dst + 2 * i + 64), b);
        } else {
            _mm512_storeu_si512(dst + 2 * i, a);
            _mm512_storeu_si512(dst + 2 * i + 64, b);
        }
    }
}

static void decode_bf16(const uint8_t *in, uint64_t n, unsigned bits, const float *s,
                        const float *z, uint64_t group, float mid, uint8_t *dst, int stream,
                        const uint8_t *ahead)
{
    const __m512 vmid = _mm512_set1_ps(mid);
    stream = stream && (uintptr_t)dst % 64 == 0;
    if (bits != 8 && group % 32 == 0)
        decode_lookup(in, n, bits, s, z, group, vmid, dst, stream, ahead);
    else if (bits == 8 && mid == 128.0f)
        decode_rows(in, n, bits, s, z, group, vmid, dst, stream, 1, ahead);
    else
        decode_rows(in, n, bits, s, z, group, vmid, dst, stream, 0, ahead);
}

/* decode_rotated_bf16: chunks of max(h, 32) elements (one head, or two
 * to eight small ones: a line of bfloat16 at least), each dequantized
 * (decode16: dequantize's operations), rotated (stages_in_registers, then
 * the product by norm: hadamard's) and narrowed (bf16x32: narrow_bf16's
 * bits) in registers; nv = the chunk's vectors and h constants in each
 * copy. */
KVS_AI void rotated_rows(const uint8_t *codes, uint64_t n, const float *s, const float *z,
                         uint64_t group, __m512 vmid, unsigned nv, unsigned h, uint8_t *dst,
                         int stream, int centred)
{
    const __m512 norm = _mm512_set1_ps(1.0f / __builtin_sqrtf((float)h)); /* hadamard's */
    uint64_t k = 0, left = group / 16; /* decode16's group and chunks left */
    for (uint64_t e = 0; e < n; e += 16 * nv) {
        __m512 v[16];
        EACH_VECTOR(i, nv, {
            __m128i u = _mm_loadu_si128((const __m128i *)(codes + e + 16 * i));
            if (centred) u = _mm_xor_si128(u, _mm_set1_epi8((char)0x80));
            v[i] = decode16(u, s, z, group, e + 16 * i, &k, &left, vmid, centred);
        });
        stages_in_registers(v, nv, h);
        EACH_VECTOR(i, nv, if (i % 2 == 0) {
            __m512i line = bf16x32(_mm512_mul_ps(v[i], norm), _mm512_mul_ps(v[(i + 1) & 15], norm));
            uint8_t *o = dst + 2 * (e + 16 * i);
            if (stream) _mm512_stream_si512((void *)o, line);
            else _mm512_storeu_si512(o, line);
        });
    }
}

static void decode_rotated_bf16(const uint8_t *codes, uint64_t n, const float *s,
                                const float *z, uint64_t group, float mid, unsigned h,
                                uint8_t *dst, int stream)
{
    const __m512 vmid = _mm512_set1_ps(mid);
    stream = stream && (uintptr_t)dst % 64 == 0;
    int c = mid == 128.0f;
#define ROTATED(nv, h) c ? rotated_rows(codes, n, s, z, group, vmid, nv, h, dst, stream, 1) \
                         : rotated_rows(codes, n, s, z, group, vmid, nv, h, dst, stream, 0)
    switch (h) {
    case 2: ROTATED(2, 2); break;
    case 4: ROTATED(2, 4); break;
    case 8: ROTATED(2, 8); break;
    case 16: ROTATED(2, 16); break;
    case 32: ROTATED(2, 32); break;
    case 64: ROTATED(4, 64); break;
    case 128: ROTATED(8, 128); break;
    default: ROTATED(16, 256); break;
    }
#undef ROTATED
}

static void store_fence(void)
{
    _mm_sfence();
}

static const kvs_intq_kernels avx512_kernels = {
    .isa = "avx512",
    .widen_bf16 = widen_bf16,
    .widen_rotated_bf16 = widen_rotated_bf16,
    .minmax = minmax,
    .fold_columns = fold_columns,
    .scales = scales,
    .quantize = quantize,
    .reciprocals = reciprocals,
    .pack = {[2] = pack2, [3] = pack3, [4] = pack4, [5] = pack5, [6] = pack6, [7] = pack7},
    .unpack = {[2] = unpack2, [3] = unpack3, [4] = unpack4, [5] = unpack5, [6] = unpack6,
               [7] = unpack7},
    .dequantize = dequantize,
    .hadamard = hadamard,
    .load_scales = load_scales,
    .narrow_bf16 = narrow_bf16,
    .encode_token_bf16 = encode_token_bf16,
    .encode_channel_bf16 = encode_channel_bf16,
    .decode_bf16 = decode_bf16,
    .decode_rotated_bf16 = decode_rotated_bf16,
    .store_fence = store_fence,
};

const kvs_intq_kernels *kvs_intq_kernels_avx512(void)
{
    return &avx512_kernels;
}
