/* coef_rans_avx512.c - the coefficient coder's symbol mapping with AVX-512
 * (coef_rans_kernels.h): 16 coefficients a step, the bit length from a
 * float's exponent (exact below 2^24; no AVX512CD here), the escape test
 * one gather of the rANS encoder's entries, the raw codes compressed into
 * place. The scalar loop took about 3 ns a coefficient, most of it
 * mispredicted branches on whether a value is exact or in a bucket. */
#include <immintrin.h>

#include "codecs/coef_rans.h"
#include "codecs/coef_rans_kernels.h"

size_t kvs_coef_rans_row_avx512(const int32_t *row, size_t cols, const uint8_t *cls,
                                const kvs_rans_enc_tables *info, uint8_t *srow,
                                uint32_t *pending, size_t *k)
{
    const __m512i one = _mm512_set1_epi32(1), exact_max = _mm512_set1_epi32(15);
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
        /* the escape: frequency 0 (bits 13-25 of the entry) in the class's table */
        __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(cls + j)));
        __m512i idx = _mm512_or_si512(_mm512_slli_epi32(c, 8), s);
        __m512i entry = _mm512_i32gather_epi32(idx, (const void *)info->info, 4);
        __mmask16 escape = _mm512_testn_epi32_mask(entry, _mm512_set1_epi32(0x1FFF << 13));
        s = _mm512_mask_mov_epi32(s, escape, _mm512_set1_epi32(KVS_COEF_ESCAPE));
        __m512i esc_code = _mm512_or_si512(
            _mm512_or_si512(m, _mm512_slli_epi32(neg, 15)),
            _mm512_set1_epi32(KVS_COEF_ESCAPE_RAW << 16));
        code = _mm512_mask_mov_epi32(code, escape, esc_code);
        _mm_storeu_si128((__m128i *)(srow + j), _mm512_cvtepi32_epi8(s));
        __mmask16 has_raw = _mm512_test_epi32_mask(code, _mm512_set1_epi32((int)0xFFFF0000u));
        _mm512_mask_compressstoreu_epi32(pending + n, has_raw, code);
        n += (size_t)__builtin_popcount(has_raw);
    }
    *k = n;
    return j;
}

size_t kvs_coef_rans_plain_avx512(const uint8_t *srow, size_t j, size_t cols,
                                  const int32_t *raw_of, const float *value_of, float *orow)
{
    for (; j + 16 <= cols; j += 16) {
        __m512i s = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(srow + j)));
        __m512i raw = _mm512_i32gather_epi32(s, (const void *)raw_of, 4);
        if (_mm512_test_epi32_mask(raw, raw)) break;
        _mm512_storeu_ps(orow + j, _mm512_i32gather_ps(s, value_of, 4));
    }
    return j;
}
