/* coef_rans_avx512.c - the coefficient coder's symbol mapping with AVX-512
 * (coef_rans_kernels.h): 16 coefficients a step, the bit length from a
 * float's exponent (exact below 2^24; no AVX512CD here), the escape test
 * two permutes of the classes' coded ranges (registers, where a gather of
 * the rANS encoder's entries read a 64 KiB table), the raw codes
 * compressed in a register and stored whole (a compress to memory is
 * microcoded). The scalar loop took about 3 ns a coefficient, most of it
 * mispredicted branches on whether a value is exact or in a bucket. The
 * decoder's values come 16 at a time too, raw bits included: each lane's
 * bit offset is a prefix sum of the counts, its bits one gathered 32-bit
 * load. */
#include <immintrin.h>

#include "codecs/coef_rans.h"
#include "codecs/coef_rans_kernels.h"

size_t kvs_coef_rans_row_avx512(const int32_t *row, size_t cols, const uint8_t *cls,
                                const uint32_t *range_of, uint8_t *srow, uint32_t *pending,
                                size_t *k)
{
    const __m512i one = _mm512_set1_epi32(1), exact_max = _mm512_set1_epi32(15);
    const __m512i r0 = _mm512_loadu_si512(range_of), r1 = _mm512_loadu_si512(range_of + 16);
    const __m512i r2 = _mm512_loadu_si512(range_of + 32), r3 = _mm512_loadu_si512(range_of + 48);
    size_t j = 0, n = *k;
    for (; j + 16 <= cols; j += 16) {
        __m512i v = _mm512_loadu_si512(row + j);
        v = _mm512_min_epi32(_mm512_max_epi32(v, _mm512_set1_epi32(-KVS_COEF_RANS_MAX)),
                             _mm512_set1_epi32(KVS_COEF_RANS_MAX));
        __m512i m = _mm512_abs_epi32(v);
        __mmask16 negative = _mm512_cmplt_epi32_mask(v, _mm512_setzero_si512());
        __m512i neg = _mm512_maskz_mov_epi32(negative, one);
        __mmask16 big = _mm512_cmpgt_epi32_mask(m, exact_max);
        __m512i fl = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_or_si512(m, one)));
        __m512i e = _mm512_sub_epi32(_mm512_srli_epi32(fl, 23), _mm512_set1_epi32(126));
        __m512i low = _mm512_maskz_sub_epi32(big, e, _mm512_set1_epi32(1 + KVS_COEF_MANT_BITS));
        __m512i b = _mm512_add_epi32(
            _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(KVS_COEF_EXACT_BITS + 1)),
                              KVS_COEF_MANT_BITS),
            _mm512_and_si512(_mm512_srlv_epi32(m, low),
                             _mm512_set1_epi32((1 << KVS_COEF_MANT_BITS) - 1)));
        __m512i bucket = _mm512_add_epi32(
            _mm512_add_epi32(_mm512_slli_epi32(b, 1), neg),
            _mm512_set1_epi32(2 * (1 << KVS_COEF_EXACT_BITS) - 1));
        __mmask16 nonzero = _mm512_test_epi32_mask(m, m);
        __m512i exact = _mm512_maskz_add_epi32(
            nonzero, _mm512_sub_epi32(_mm512_slli_epi32(m, 1), one), neg);
        __m512i s = _mm512_mask_blend_epi32(big, exact, bucket);
        __m512i bits = _mm512_and_si512(m, _mm512_sub_epi32(_mm512_sllv_epi32(one, low), one));
        __m512i code = _mm512_or_si512(bits, _mm512_slli_epi32(low, 16));
        /* the escape: outside the class's coded range (lo | hi << 8) */
        __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(cls + j)));
        __m512i range = _mm512_mask_blend_epi32(
            _mm512_test_epi32_mask(c, _mm512_set1_epi32(32)), _mm512_permutex2var_epi32(r0, c, r1),
            _mm512_permutex2var_epi32(r2, c, r3));
        __mmask16 escape =
            _mm512_cmplt_epi32_mask(s, _mm512_and_si512(range, _mm512_set1_epi32(0xFF))) |
            _mm512_cmpgt_epi32_mask(s, _mm512_srli_epi32(range, 8));
        s = _mm512_mask_mov_epi32(s, escape, _mm512_set1_epi32(KVS_COEF_ESCAPE));
        __m512i esc_code = _mm512_or_si512(
            _mm512_or_si512(m, _mm512_slli_epi32(neg, 15)),
            _mm512_set1_epi32(KVS_COEF_ESCAPE_RAW << 16));
        code = _mm512_mask_mov_epi32(code, escape, esc_code);
        _mm_storeu_si128((__m128i *)(srow + j), _mm512_cvtepi32_epi8(s));
        __mmask16 has_raw = _mm512_test_epi32_mask(code, _mm512_set1_epi32((int)0xFFFF0000u));
        /* pending has room for the whole vector: n <= j, j + 16 <= cols */
        _mm512_storeu_si512(pending + n, _mm512_maskz_compress_epi32(has_raw, code));
        n += (size_t)__builtin_popcount(has_raw);
    }
    *k = n;
    return j;
}

size_t kvs_coef_rans_values_avx512(const uint8_t *sym, size_t i, size_t count,
                                   const uint32_t *entry_of, const uint8_t *raw, size_t raw_n,
                                   size_t *bitpos, float *out)
{
    const __m512i zero = _mm512_setzero_si512(), nraw_mask = _mm512_set1_epi32(31);
    size_t at = *bitpos;
    for (; i + 16 <= count; i += 16) {
        __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sym + i)));
        __m512i e = _mm512_i32gather_epi32(s, (const void *)entry_of, 4);
        if (_mm512_test_epi32_mask(e, _mm512_set1_epi32(KVS_COEF_ENTRY_ESCAPE))) break;
        __m512i nraw = _mm512_and_si512(e, nraw_mask), v = _mm512_srli_epi32(e, 8);
        if (_mm512_test_epi32_mask(nraw, nraw)) {
            /* lane l's bits start at the sum of the counts of lanes below l */
            __m512i end = _mm512_add_epi32(nraw, _mm512_alignr_epi32(nraw, zero, 15));
            end = _mm512_add_epi32(end, _mm512_alignr_epi32(end, zero, 14));
            end = _mm512_add_epi32(end, _mm512_alignr_epi32(end, zero, 12));
            end = _mm512_add_epi32(end, _mm512_alignr_epi32(end, zero, 8));
            size_t total = (uint32_t)_mm_extract_epi32(_mm512_extracti32x4_epi32(end, 3), 3);
            /* every lane's 4-byte load inside raw[0..raw_n), its bit offset
             * in 32 bits; the scalar decoder takes the group that is not (and
             * refuses a short one) */
            if ((at + total) / 8 + 4 > raw_n || at + total > UINT32_MAX) break;
            __m512i off = _mm512_add_epi32(_mm512_sub_epi32(end, nraw),
                                           _mm512_set1_epi32((int)at));
            __m512i w = _mm512_i32gather_epi32(_mm512_srli_epi32(off, 3), (const void *)raw, 1);
            w = _mm512_srlv_epi32(w, _mm512_and_si512(off, _mm512_set1_epi32(7)));
            __m512i keep = _mm512_sub_epi32(_mm512_sllv_epi32(_mm512_set1_epi32(1), nraw),
                                            _mm512_set1_epi32(1));
            v = _mm512_add_epi32(v, _mm512_and_si512(w, keep));
            at += total;
        }
        __mmask16 neg = _mm512_test_epi32_mask(e, _mm512_set1_epi32(KVS_COEF_ENTRY_NEG));
        v = _mm512_mask_sub_epi32(v, neg, zero, v);
        _mm512_storeu_ps(out + i, _mm512_cvtepi32_ps(v));
    }
    *bitpos = at;
    return i;
}
