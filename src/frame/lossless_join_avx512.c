/* lossless_join_avx512.c - the elements of a rANS record from their fields,
 * 32 at a time (lossless_join.h). The SSE2 join takes 16 with byte unpacks
 * and compares on both halves; here the fields widen to 16 bits in one
 * instruction each, one ternary-logic op joins exponent and mantissa, and
 * the signs are mask registers (a byte test of the flips, the row above's
 * sign bits as a mask, their XOR), added as 0x8000 where set: kind 3's
 * rebuild of the signs was a tenth of its decoding. The same elements as
 * lossless_exponent.c's join1, bit for bit (test_lossless compares them). */
#include <immintrin.h>

#include "frame/lossless_join.h"

size_t kvs_llx_join_avx512(const uint8_t *e, const uint8_t *sm, const uint8_t *q, uint8_t bit,
                           const uint8_t *up, size_t n, uint8_t *out)
{
    const __m512i low7 = _mm512_set1_epi16(0x7F), sign = _mm512_set1_epi16((short)0x8000);
    const __m256i flip = _mm256_set1_epi8((char)bit);
    size_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512i ev = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(e + j)));
        __m512i mv = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(sm + j)));
        /* e << 7 | (sm & 0x7F) */
        __m512i v = _mm512_ternarylogic_epi32(_mm512_slli_epi16(ev, 7), mv, low7, 0xF8);
        __mmask32 s = _mm256_test_epi8_mask(_mm256_loadu_si256((const __m256i *)(q + j)), flip);
        if (up) s ^= _mm512_movepi16_mask(_mm512_loadu_si512((const void *)(up + 2 * j)));
        v = _mm512_mask_add_epi16(v, s, v, sign); /* bit 15 is clear: + is | */
        _mm512_storeu_si512((void *)(out + 2 * j), v);
    }
    return j;
}
