/* fp8_avx2.c - AVX2 + F16C fp8 kernels, bit-identical to fp8_scalar.c.
 *
 * CPU features this file requires (compiled with -mavx2 -mf16c -mfma
 * -mbmi2): AVX2 and F16C (the code uses no FMA or BMI2 instruction on
 * purpose, but the compiler may, so the dispatcher checks all four).
 *
 * Nothing here depends on MXCSR. The only float arithmetic is:
 *   - encoders, subnormal fp8 results: |x| (clamped to the smallest normal
 *     fp8 value) times 2^-15 (e4m3fn) or 2^-8 (e5m2), exact except for
 *     |x| < 2^-111 where any rounding or flush still gives 0 below, then
 *     vcvtps2ph with an explicit round-to-nearest-even immediate: the fp8
 *     subnormal step becomes the float16 subnormal step 2^-24, so the
 *     float16 bits are the fp8 code. vcvtps2ph never flushes its float16
 *     result; denormals-are-zero can only zero a float32 subnormal input,
 *     whose fp8 code is 0 anyway.
 *   - decoders: vcvtph2ps (exact, ignores DAZ for float16 inputs) and, for
 *     e4m3fn, a multiplication by 256 of normal numbers (exact).
 *
 * Encoders widen 8 elements to float32 lanes (bfloat16: unpack with zero;
 * float16: vcvtph2ps; float32: load) and round in integer arithmetic like
 * the scalar code: normal range (a + half - 1 + lsb) >> drop, rebiased;
 * subnormal range as above; max() merges the two (the normal formula is
 * monotonic and never exceeds the true code below the smallest normal, the
 * clamped subnormal path gives the smallest normal's code above it);
 * min(code, cap) handles overflow; NaN is a compare and blend. 32 codes are
 * packed to bytes with packus and the signs OR-ed in from a signed pack of
 * the sources (signed saturation keeps the sign).
 *
 * Decoders build the float16 bits of the fp8 value divided by 256 (e4m3fn:
 * its 7 magnitude bits shifted left by 7 are a float16 with the right
 * mantissa and an exponent 8 too small, subnormals included) or of the
 * value itself (e5m2: the code shifted left by 8), widen with vcvtph2ps,
 * and narrow exactly again where float16 / bfloat16 is wanted.
 *
 * Heads (to align streaming stores) and tails use the scalar element
 * functions, which are the reference.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codecs/fp8_kernels.h"
#include "codecs/half.h"

#define KVS_AI static inline __attribute__((always_inline))


/* ---- scalar elements (heads and tails) --------------------------------- */

KVS_AI float load_wide(const unsigned char *p, int wide)
{
    if (wide == KVS_WIDE_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return wide == KVS_WIDE_F16 ? kvs_f16_to_f32(h) : kvs_bf16_to_f32(h);
}

KVS_AI uint8_t encode_one(const unsigned char *p, int wide, int fmt, int sat)
{
    const float x = load_wide(p, wide);
    return fmt == KVS_FP8_FMT_E4M3FN ? kvs_fp8_e4m3fn_from_f32(x, sat)
                                     : kvs_fp8_e5m2_from_f32(x, sat);
}

KVS_AI void decode_one(uint8_t code, unsigned char *p, int wide, int fmt)
{
    const uint32_t f = kvs_f32_to_bits(fmt == KVS_FP8_FMT_E4M3FN ? kvs_fp8_e4m3fn_to_f32(code)
                                                                 : kvs_fp8_e5m2_to_f32(code));
    if (wide == KVS_WIDE_F32) {
        memcpy(p, &f, 4);
    } else {
        const uint16_t h = wide == KVS_WIDE_F16 ? kvs_f32_bits_to_f16_bits(f)
                                                : (uint16_t)(f >> 16); /* exact for fp8 values */
        memcpy(p, &h, 2);
    }
}

/* ---- encoders ------------------------------------------------------------ */

/* 8 float32 bit patterns -> 8 codes (0..0x7F, no sign) in 32-bit lanes. */
KVS_AI __m256i f32_core(__m256i x, int fmt, int sat)
{
    const int e4 = fmt == KVS_FP8_FMT_E4M3FN;
    const __m256i a = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
    /* normal range, signed: (a - (rebias << 23) + half - 1 + lsb) >> drop */
    __m256i n;
    if (e4) {
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 20), _mm256_set1_epi32(1));
        n = _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(
                a, _mm256_set1_epi32(0x7FFFF - (120 << 23))), lsb), 20);
    } else {
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(a, 21), _mm256_set1_epi32(1));
        n = _mm256_srai_epi32(_mm256_add_epi32(_mm256_add_epi32(
                a, _mm256_set1_epi32(0xFFFFF - (112 << 23))), lsb), 21);
    }
    /* subnormal range: clamp to 2^-6 / 2^-14, scale so the fp8 step is
     * 2^-24, round to float16 (nearest even, fixed by the immediate) */
    const __m256i c = _mm256_min_epi32(a, _mm256_set1_epi32(e4 ? 0x3C800000 : 0x38800000));
    const __m256 scaled = _mm256_mul_ps(_mm256_castsi256_ps(c),
                                        _mm256_set1_ps(e4 ? 0x1p-15f : 0x1p-8f));
    const __m128i h = _mm256_cvtps_ph(scaled, _MM_FROUND_TO_NEAREST_INT);
    n = _mm256_max_epi32(n, _mm256_cvtepu16_epi32(h));
    if (e4) {
        n = _mm256_min_epi32(n, _mm256_set1_epi32(sat ? 0x7E : 0x7F));
        if (!sat) return n; /* NaN reaches the cap 0x7F */
    } else {
        n = _mm256_min_epi32(n, _mm256_set1_epi32(sat ? 0x7B : 0x7C));
    }
    const __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    return _mm256_blendv_epi8(n, _mm256_set1_epi32(0x7F), nan);
}

/* 32 elements at s -> 32 codes. */
KVS_AI __m256i enc_block(const unsigned char *s, int wide, int fmt, int sat)
{
    __m256i x0, x1, x2, x3, signs;
    if (wide == KVS_WIDE_BF16) {
        /* x << 16 by interleaving with zero: lane-interleaved order (dword
         * lanes hold elements 0-3|8-11, 4-7|12-15 of each 16), which the
         * packs below undo except for a final qword permutation */
        const __m256i A = _mm256_loadu_si256((const __m256i *)s);
        const __m256i B = _mm256_loadu_si256((const __m256i *)(s + 32));
        const __m256i z = _mm256_setzero_si256();
        x0 = _mm256_unpacklo_epi16(z, A);
        x1 = _mm256_unpackhi_epi16(z, A);
        x2 = _mm256_unpacklo_epi16(z, B);
        x3 = _mm256_unpackhi_epi16(z, B);
        signs = _mm256_packs_epi16(A, B);
    } else {
        if (wide == KVS_WIDE_F32) {
            x0 = _mm256_loadu_si256((const __m256i *)s);
            x1 = _mm256_loadu_si256((const __m256i *)(s + 32));
            x2 = _mm256_loadu_si256((const __m256i *)(s + 64));
            x3 = _mm256_loadu_si256((const __m256i *)(s + 96));
        } else {
            x0 = _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)s)));
            x1 = _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 16))));
            x2 = _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 32))));
            x3 = _mm256_castps_si256(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + 48))));
        }
        signs = _mm256_packs_epi16(_mm256_packs_epi32(x0, x1), _mm256_packs_epi32(x2, x3));
    }
    const __m256i w01 = _mm256_packus_epi32(f32_core(x0, fmt, sat), f32_core(x1, fmt, sat));
    const __m256i w23 = _mm256_packus_epi32(f32_core(x2, fmt, sat), f32_core(x3, fmt, sat));
    __m256i b = _mm256_packus_epi16(w01, w23);
    b = _mm256_or_si256(b, _mm256_and_si256(signs, _mm256_set1_epi8((char)0x80)));
    if (wide == KVS_WIDE_BF16)
        return _mm256_permute4x64_epi64(b, 0xD8); /* qwords 0, 2, 1, 3 */
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Pairs of blocks [i, end) -> dst: 64 codes, stored as two 32-byte halves
 * back to back (one whole line when dst + i is 64-aligned, so a streaming
 * store never leaves a partial line in the write-combining buffer), input
 * prefetched KVS_FP8_PREFETCH_BYTES ahead while `pf`. */
KVS_AI size_t enc_loop(const unsigned char *s, uint8_t *dst, uint8_t *copy, size_t i,
                       size_t end, int wide, int fmt, int sat, int nt, int pf)
{
    const size_t es = wide == KVS_WIDE_F32 ? 4 : 2;
    for (; i + 64 <= end; i += 64) {
        const unsigned char *p = s + i * es;
        if (pf)
            for (size_t l = 0; l < es; l++)
                _mm_prefetch((const char *)(p + KVS_FP8_PREFETCH_BYTES + 64 * l), _MM_HINT_T0);
        const __m256i v0 = enc_block(p, wide, fmt, sat);
        const __m256i v1 = enc_block(p + 32 * es, wide, fmt, sat);
        if (nt) {
            _mm256_stream_si256((__m256i *)(dst + i), v0);
            _mm256_stream_si256((__m256i *)(dst + i + 32), v1);
        } else {
            _mm256_storeu_si256((__m256i *)(dst + i), v0);
            _mm256_storeu_si256((__m256i *)(dst + i + 32), v1);
        }
        if (copy) {
            _mm256_storeu_si256((__m256i *)(copy + i), v0);
            _mm256_storeu_si256((__m256i *)(copy + i + 32), v1);
        }
    }
    return i;
}

/* copy: NULL, or a second destination (encode_copy in fp8_kernels.h): dst
 * then streams whatever n is. */
KVS_AI void encode_array(const void *src, uint8_t *dst, uint8_t *copy, size_t n, int wide,
                         int fmt, int sat)
{
    const size_t es = wide == KVS_WIDE_F32 ? 4 : 2;
    const unsigned char *s = (const unsigned char *)src;
    const size_t ahead = KVS_FP8_PREFETCH_BYTES / es;
    const size_t pf_end = n > ahead + 64 ? n - ahead : 0;
    size_t i = 0;
    if (copy || n >= kvs_fp8_nt_min_bytes()) {
        for (; i < n && ((uintptr_t)(dst + i) & 63) != 0; i++) {
            dst[i] = encode_one(s + i * es, wide, fmt, sat);
            if (copy) copy[i] = dst[i];
        }
        i = enc_loop(s, dst, copy, i, pf_end, wide, fmt, sat, 1, 1);
        i = enc_loop(s, dst, copy, i, n, wide, fmt, sat, 1, 0);
        for (; i + 32 <= n; i += 32) { /* one 32-byte half: aligned, the last line */
            const __m256i v = enc_block(s + i * es, wide, fmt, sat);
            _mm256_stream_si256((__m256i *)(dst + i), v);
            if (copy) _mm256_storeu_si256((__m256i *)(copy + i), v);
        }
        _mm_sfence();
    } else {
        i = enc_loop(s, dst, NULL, i, pf_end, wide, fmt, sat, 0, 1);
        i = enc_loop(s, dst, NULL, i, n, wide, fmt, sat, 0, 0);
        for (; i + 32 <= n; i += 32)
            _mm256_storeu_si256((__m256i *)(dst + i), enc_block(s + i * es, wide, fmt, sat));
    }
    for (; i < n; i++) {
        dst[i] = encode_one(s + i * es, wide, fmt, sat);
        if (copy) copy[i] = dst[i];
    }
}

/* ---- decoders ------------------------------------------------------------ */

/* 16 codes -> 16 float16 bit patterns: e5m2 the exact value, e4m3fn the
 * value / 256 (see the top comment). NaN codes give 0x7E00 | sign, which
 * widens to the canonical float32 NaN and stays one through * 256. */
KVS_AI __m256i f16_bits(__m128i codes, int fmt)
{
    const __m256i w = _mm256_cvtepu8_epi16(codes);
    const __m256i qnan = _mm256_set1_epi16(0x7E00);
    if (fmt == KVS_FP8_FMT_E5M2) {
        const __m256i p = _mm256_slli_epi16(w, 8);
        const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7F)),
                                               _mm256_set1_epi16(0x7C));
        return _mm256_blendv_epi8(
            p, _mm256_or_si256(_mm256_and_si256(p, _mm256_set1_epi16((short)0x8000)), qnan), nan);
    }
    const __m256i mag = _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(0x3F80));
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi16(w, 8), _mm256_set1_epi16((short)0x8000));
    const __m256i nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x3F80));
    return _mm256_or_si256(sign, _mm256_blendv_epi8(mag, qnan, nan));
}

KVS_AI void store32(unsigned char *d, __m256i v, int nt)
{
    if (nt)
        _mm256_stream_si256((__m256i *)d, v);
    else
        _mm256_storeu_si256((__m256i *)d, v);
}

/* 16 codes at s -> 16 results at d. */
KVS_AI void dec_block(const uint8_t *s, unsigned char *d, int wide, int fmt, int nt)
{
    const __m256i p = f16_bits(_mm_loadu_si128((const __m128i *)s), fmt);
    if (wide == KVS_WIDE_F16 && fmt == KVS_FP8_FMT_E5M2) {
        store32(d, p, nt);
        return;
    }
    __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(p));
    __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1));
    if (fmt == KVS_FP8_FMT_E4M3FN) {
        lo = _mm256_mul_ps(lo, _mm256_set1_ps(256.0f));
        hi = _mm256_mul_ps(hi, _mm256_set1_ps(256.0f));
    }
    if (wide == KVS_WIDE_F32) {
        store32(d, _mm256_castps_si256(lo), nt);
        store32(d + 32, _mm256_castps_si256(hi), nt);
    } else if (wide == KVS_WIDE_F16) {
        const __m256i h = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm256_cvtps_ph(lo, _MM_FROUND_TO_NEAREST_INT)),
            _mm256_cvtps_ph(hi, _MM_FROUND_TO_NEAREST_INT), 1);
        store32(d, h, nt);
    } else {
        const __m256i b = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(lo), 16),
                                              _mm256_srli_epi32(_mm256_castps_si256(hi), 16));
        store32(d, _mm256_permute4x64_epi64(b, 0xD8), nt);
    }
}

KVS_AI void decode_array(const uint8_t *src, void *dst, size_t n, int wide, int fmt)
{
    const size_t es = wide == KVS_WIDE_F32 ? 4 : 2;
    unsigned char *d = (unsigned char *)dst;
    size_t i = 0;
    if (n * es >= kvs_fp8_nt_min_bytes() && (uintptr_t)d % es == 0) {
        for (; i < n && ((uintptr_t)(d + i * es) & 31) != 0; i++)
            decode_one(src[i], d + i * es, wide, fmt);
        for (; i + 16 <= n; i += 16)
            dec_block(src + i, d + i * es, wide, fmt, 1);
        _mm_sfence();
    } else {
        for (; i + 16 <= n; i += 16)
            dec_block(src + i, d + i * es, wide, fmt, 0);
    }
    for (; i < n; i++)
        decode_one(src[i], d + i * es, wide, fmt);
}

/* ---- the table: the 12 kernels as encode_array / decode_array with
 * constant arguments (fp8_kernels.h) ---------------------------------------- */

KVS_FP8_DEFINE_VARIANT(kvs_fp8_kernels_avx2, "avx2", NULL)
