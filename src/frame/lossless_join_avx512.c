/* lossless_join_avx512.c - the elements of a rANS record from their fields,
 * 32 at a time (lossless_join.h). The SSE2 join takes 16 with byte unpacks
 * and compares on both halves; here the fields widen to 16 bits in one
 * instruction each, one ternary-logic op joins exponent and mantissa, and
 * the signs are mask registers (a byte test of the flips, the row above's
 * sign bits as a mask, their XOR), added as 0x8000 where set: kind 3's
 * rebuild of the signs was a tenth of its decoding. The same elements as
 * lossless_exponent.c's join1, bit for bit (test_lossless compares them).
 * Kind 3 may take its mantissas packed (kvs_llx_join7_avx512): unpacked
 * here, they skip a pass that wrote and read them back as bytes. */
#include <immintrin.h>

#include "frame/lossless_join.h"

/* The 32 elements of exponents ev and mantissas mv (16 bits each, the
 * mantissa's bit 7 ignored), sign bits where q & flip, flipped where up's
 * are set. */
static inline __m512i join32(__m512i ev, __m512i mv, const uint8_t *q, __m256i flip,
                             const uint8_t *up)
{
    /* e << 7 | (sm & 0x7F) */
    __m512i v = _mm512_ternarylogic_epi32(_mm512_slli_epi16(ev, 7), mv, _mm512_set1_epi16(0x7F),
                                          0xF8);
    __mmask32 s = _mm256_test_epi8_mask(_mm256_loadu_si256((const __m256i *)q), flip);
    if (up) s ^= _mm512_movepi16_mask(_mm512_loadu_si512((const void *)up));
    /* bit 15 is clear: + is | */
    return _mm512_mask_add_epi16(v, s, v, _mm512_set1_epi16((short)0x8000));
}

size_t kvs_llx_join_avx512(const uint8_t *e, const uint8_t *sm, const uint8_t *q, uint8_t bit,
                           const uint8_t *up, size_t n, uint8_t *out)
{
    const __m256i flip = _mm256_set1_epi8((char)bit);
    size_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512i ev = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(e + j)));
        __m512i mv = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(sm + j)));
        __m512i v = join32(ev, mv, q + j, flip, up ? up + 2 * j : NULL);
        _mm512_storeu_si512((void *)(out + 2 * j), v);
    }
    return j;
}

size_t kvs_llx_join7_avx512(const uint8_t *e, const uint8_t *m7, const uint8_t *q, uint8_t bit,
                            const uint8_t *up, size_t n, uint8_t *out)
{
    /* lossless_mantissas_avx512.c's VBMI unpacking, 32 at a time: each 7
     * bytes to a u64 lane, the 8 fields out of each lane */
    const __m256i spread = _mm256_set_epi8(0, 27, 26, 25, 24, 23, 22, 21, 0, 20, 19, 18, 17, 16,
                                           15, 14, 0, 13, 12, 11, 10, 9, 8, 7, 0, 6, 5, 4, 3, 2,
                                           1, 0);
    const __m256i fields = _mm256_set1_epi64x(0x312A231C150E0700ll); /* bits 0, 7, .. 49 */
    const __m256i flip = _mm256_set1_epi8((char)bit);
    size_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256i m = _mm256_maskz_loadu_epi8(0x0FFFFFFFu, m7 + j / 8 * 7);
        m = _mm256_multishift_epi64_epi8(fields, _mm256_permutexvar_epi8(spread, m));
        __m512i ev = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(e + j)));
        __m512i v = join32(ev, _mm512_cvtepu8_epi16(m), q + j, flip, up ? up + 2 * j : NULL);
        _mm512_storeu_si512((void *)(out + 2 * j), v);
    }
    return j;
}
