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
 * integer rounding of half.h, not vcvtneps2bf16 (which flushes subnormals).
 * Tails use masked loads and stores, so no byte past n is read or written.
 */
#include <immintrin.h>
#include <string.h>

#include "codecs/intq_kernels.h"

#define KVS_AI static inline __attribute__((always_inline))

/* The mask of the first n (< 16 / 32) lanes. */
KVS_AI __mmask16 first16(uint64_t n) { return (__mmask16)((1u << n) - 1); }
KVS_AI __mmask32 first32(uint64_t n) { return (__mmask32)((1ull << n) - 1); }

/* Lanes whose value is finite (neither inf nor NaN). */
KVS_AI __mmask16 finite(__m512 v)
{
    const __m512i exp = _mm512_set1_epi32(0x7F800000);
    return _mm512_cmpneq_epi32_mask(_mm512_and_si512(_mm512_castps_si512(v), exp), exp);
}

/* ---- encode ------------------------------------------------------------ */

KVS_AI __mmask16 widen16(const uint8_t *src, __mmask16 k, float *out)
{
    __m256i h = _mm256_maskz_loadu_epi16(k, src);
    const __m256i exp = _mm256_set1_epi16(0x7F80);
    __mmask16 bad = _mm256_mask_cmpeq_epi16_mask(k, _mm256_and_si256(h, exp), exp);
    _mm512_mask_storeu_ps(out, k, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
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

/* 16 groups (lanes k): 0 if one of them does not fit, else their scales
 * and zero points stored. */
KVS_AI int scales16(const float *mn, const float *mx, uint64_t i, __mmask16 k, int zp, int f16,
                    __m512 steps, uint8_t *scales, uint8_t *zeros, float *inv, float *zero)
{
    __m512 lo = _mm512_maskz_loadu_ps(k, mn + i), hi = _mm512_maskz_loadu_ps(k, mx + i);
    __m512 z = _mm512_setzero_ps(), range, s;
    __m256i zb = _mm256_setzero_si256(), sb = _mm256_setzero_si256();
    if (zp) {
        if (f16) {
            zb = _mm512_cvt_roundps_ph(lo, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
            z = _mm512_cvtph_ps(zb);
        } else {
            z = lo;
        }
        range = _mm512_sub_ps(hi, z);
    } else {
        range = _mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi));
    }
    s = scale_up(range, steps);
    if (f16) {
        sb = _mm512_cvt_roundps_ph(s, _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC);
        s = _mm512_cvtph_ps(sb);
    }
    if ((finite(s) & finite(z) & k) != k) return 0;
    if (f16) {
        _mm256_mask_storeu_epi16(scales + 2 * i, k, sb);
        if (zp) _mm256_mask_storeu_epi16(zeros + 2 * i, k, zb);
    } else {
        _mm512_mask_storeu_ps(scales + 4 * i, k, s);
        if (zp) _mm512_mask_storeu_ps(zeros + 4 * i, k, z);
    }
    /* a scale of 0 (every value of the group is z) divides by 1 */
    __mmask16 pos = _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_GT_OQ);
    _mm512_mask_storeu_ps(inv + i, k, _mm512_mask_blend_ps(pos, _mm512_set1_ps(1.0f), s));
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

/* y / r as far as rint can tell: y x rinv (rinv = 1 / r rounded, a
 * normal float; 0 where it is not), and the exact quotient only for the
 * lanes where rinv is 0 or the product is within |q| 2^-20 of a
 * half-integer. Why that is exact: with v = y / r, the product is within
 * |v| 2^-23 (1 + 2^-24) of v (two roundings of 2^-24 each; a subnormal
 * product is within 2^-150 of v and far from a half), and RN(v), what the
 * portable code rounds, within |v| 2^-24. A product farther than |q| 2^-20
 * from the half-integer between its neighbouring integers has v and RN(v)
 * strictly on its side (and no other half-integer within reach below
 * |v| = 2^22; beyond, the codes clamp alike), so rint gives the same
 * integer. An infinite product is never "near" (inf - inf is NaN) and
 * clamps as RN(v) does. */
KVS_AI __m512 quotient(__m512 y, __m512 r, __m512 rinv)
{
    __m512 q = _mm512_mul_ps(y, rinv);
    __m512 half = _mm512_add_ps(_mm512_roundscale_ps(q, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC),
                                _mm512_set1_ps(0.5f));
    __mmask16 near = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(q, half)),
                                        _mm512_mul_ps(_mm512_abs_ps(q), _mm512_set1_ps(0x1p-20f)),
                                        _CMP_LE_OQ) |
                     _mm512_cmp_ps_mask(rinv, _mm512_setzero_ps(), _CMP_EQ_OQ);
    return near ? _mm512_mask_div_ps(q, near, y, r) : q;
}

/* 16 codes: rint((x - z) / r) clamped to [lo, hi], plus mid (rinv: as
 * quotient's). */
KVS_AI __m128i codes16(__m512 x, __m512 r, __m512 rinv, __m512 z, __m512 lo, __m512 hi,
                       __m512 mid)
{
    __m512 q = _mm512_roundscale_ps(quotient(_mm512_sub_ps(x, z), r, rinv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_max_ps(lo, q); /* q < lo ? lo : q */
    q = _mm512_min_ps(hi, q); /* q > hi ? hi : q */
    return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(_mm512_add_ps(q, mid)));
}

/* x[0..n) with one divisor, reciprocal and zero (per_elem 0) or one each
 * (1); rinv NULL: divisions. */
KVS_AI void quantize1(const float *x, uint64_t n, const float *r, const float *rinv,
                      const float *z, int per_elem, __m512 vlo, __m512 vhi, __m512 vmid,
                      uint8_t *codes)
{
    __m512 vr = _mm512_set1_ps(r[0]), vz = _mm512_set1_ps(z[0]);
    __m512 vinv = _mm512_set1_ps(rinv ? rinv[0] : 0.0f);
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

/* 1 / r[i] where that is a normal float, else 0 (r > 0). */
static void reciprocals(const float *r, uint64_t n, float *out)
{
    const __m512 one = _mm512_set1_ps(1.0f), tiny = _mm512_set1_ps(0x1p-126f);
    for (uint64_t i = 0; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? 0xFFFF : first16(n - i);
        __m512 inv = _mm512_div_ps(one, _mm512_maskz_loadu_ps(k, r + i));
        __mmask16 ok = finite(inv) & _mm512_cmp_ps_mask(inv, tiny, _CMP_GE_OQ);
        _mm512_mask_storeu_ps(out + i, k, _mm512_maskz_mov_ps(ok, inv));
    }
}

/* 4 bits: the codes of a byte as one little-endian 16-bit word, w | w >> 4
 * (as intq.c's pack_codes; codes are below 16). */
static void pack4(const uint8_t *codes, uint64_t n, uint8_t *out)
{
    uint64_t pairs = n / 2, i = 0;
    for (; i + 32 <= pairs; i += 32) {
        __m512i w = _mm512_loadu_si512(codes + 2 * i);
        _mm256_storeu_si256((__m256i *)(out + i),
                            _mm512_cvtepi16_epi8(_mm512_or_si512(w, _mm512_srli_epi16(w, 4))));
    }
    if (i < pairs) {
        __m512i w = _mm512_maskz_loadu_epi16(first32(pairs - i), codes + 2 * i);
        _mm512_mask_cvtepi16_storeu_epi8(out + i, first32(pairs - i),
                                         _mm512_or_si512(w, _mm512_srli_epi16(w, 4)));
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

/* x' = (u - mid) s + z: a multiply, then an add (not fused, as in C);
 * one scale and zero (per_elem 0) or one each (1). */
KVS_AI void dequantize1(const uint8_t *codes, uint64_t n, const float *s, const float *z,
                        int per_elem, __m512 vmid, float *x)
{
    __m512 vs = _mm512_set1_ps(s[0]), vz = _mm512_set1_ps(z[0]);
    uint64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        if (per_elem) vs = _mm512_loadu_ps(s + i), vz = _mm512_loadu_ps(z + i);
        __m512 u = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + i))));
        _mm512_storeu_ps(x + i, _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(u, vmid), vs), vz));
    }
    if (i < n) {
        __mmask16 k = first16(n - i);
        if (per_elem) vs = _mm512_maskz_loadu_ps(k, s + i), vz = _mm512_maskz_loadu_ps(k, z + i);
        __m512 u = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, codes + i)));
        _mm512_mask_storeu_ps(x + i, k, _mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(u, vmid), vs), vz));
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
        __mmask16 k = n - i >= 16 ? 0xFFFF : first16(n - i);
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
    if (stream) _mm_sfence();
}

static const kvs_intq_kernels avx512_kernels = {
    .isa = "avx512",
    .widen_bf16 = widen_bf16,
    .minmax = minmax,
    .fold_columns = fold_columns,
    .scales = scales,
    .quantize = quantize,
    .reciprocals = reciprocals,
    .pack = {[2] = pack2, [4] = pack4},
    .unpack = {[2] = unpack2, [4] = unpack4},
    .dequantize = dequantize,
    .load_scales = load_scales,
    .narrow_bf16 = narrow_bf16,
};

const kvs_intq_kernels *kvs_intq_kernels_avx512(void)
{
    return &avx512_kernels;
}
