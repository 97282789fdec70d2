/* lossless_mantissas_avx2.c - the 7-bit mantissas of the lossless stage's
 * record kind 3 unpacked 16 at a time with AVX2 (lossless_mantissas.h),
 * for CPUs without AVX-512 VBMI: each half of the vector takes 8 elements
 * from 7 bytes, a pshufb puts each element's two bytes in a 16-bit lane,
 * and a multiply by 2^(7 - its bit offset) lines its 7 bits up (AVX2 has
 * no variable 16-bit shift). No BMI2 bit deposit: on AMD Zen 2, which has
 * AVX2, pdep is microcoded (hundreds of cycles). On Zen 3 the scalar
 * unpacking was 8 % of a level-3 block's decoding.
 * Compiled with the AVX2 flags (CMakeLists.txt); the caller checks the
 * CPU. The same bytes as the scalar loop (test_lossless compares them). */
#include <immintrin.h>

#include "frame/lossless_mantissas.h"

size_t kvs_llx_unpack7_avx2(const uint8_t *in, size_t k, size_t nin, uint8_t *sm)
{
    /* element j of a half (bits 7j..7j+6 of its 7 bytes): bytes 7j / 8 and
     * the next; the low half's bytes from 0, the high half's from 7 */
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 7,
                                          8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14);
    /* 2^(7 - 7j mod 8): the element's bits to 7..13 of its lane */
    const __m256i mul = _mm256_setr_epi16(128, 1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64);
    const __m256i m7f = _mm256_set1_epi16(0x7F);
    size_t i = 0, o = 0;
    for (; i + 16 <= k && o + 16 <= nin; i += 16, o += 14) {
        __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(in + o)));
        __m256i e = _mm256_and_si256(
            _mm256_srli_epi16(_mm256_mullo_epi16(_mm256_shuffle_epi8(v, pick), mul), 7), m7f);
        __m256i b = _mm256_packus_epi16(e, e); /* each half's 8 bytes at its bottom */
        _mm_storeu_si128((__m128i *)(sm + i),
                         _mm256_castsi256_si128(_mm256_permute4x64_epi64(b, 0x08)));
    }
    return i;
}
