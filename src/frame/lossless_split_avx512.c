/* lossless_split_avx512.c - the rANS encoder's split of a block into
 * exponents and sign + mantissa bytes, its per-channel exponent sums and
 * its histograms' keys, 32 elements a step (lossless_split.h): the SSE2
 * loops take 16 and were a twentieth of level 3's encoder together; and
 * the search for keys the sampled histograms lack, 64 a step. Compiled with the AVX-512 flags
 * (CMakeLists.txt); the caller checks the CPU. Writes what the portable
 * loops write (test_lossless runs both). */
#include <immintrin.h>

#include "frame/lossless_split.h"

size_t kvs_llx_split_avx512(const uint8_t *src, size_t k, uint8_t *exp, uint8_t *sm)
{
    size_t i = 0;
    const __m512i m7f = _mm512_set1_epi16(0x7F), m80 = _mm512_set1_epi16(0x80);
    for (; i + 32 <= k; i += 32) {
        __m512i v = _mm512_loadu_si512(src + 2 * i);
        /* words to bytes keep the low byte: the exponent is v >> 7's */
        _mm256_storeu_si256((__m256i *)(exp + i), _mm512_cvtepi16_epi8(_mm512_srli_epi16(v, 7)));
        __m512i s = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 8), m80),
                                    _mm512_and_si512(v, m7f));
        _mm256_storeu_si256((__m256i *)(sm + i), _mm512_cvtepi16_epi8(s));
    }
    return i;
}

size_t kvs_llx_add_row_avx512(const uint8_t *row, size_t n, uint16_t *s16)
{
    size_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512i e = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(row + j)));
        _mm512_storeu_si512(s16 + j, _mm512_add_epi16(_mm512_loadu_si512(s16 + j), e));
    }
    return j;
}

size_t kvs_llx_keys_avx512(const uint8_t *exp, const uint8_t *ctx, size_t k, uint16_t *key)
{
    size_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m512i e = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(exp + i)));
        if (ctx) {
            __m512i c = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(ctx + i)));
            e = _mm512_or_si512(e, _mm512_slli_epi16(c, 8));
        }
        _mm512_storeu_si512(key + i, e);
    }
    return i;
}

size_t kvs_llx_first_absent_avx512(const uint8_t *exp, const uint8_t *ctx, size_t k,
                                   const uint8_t bm[128])
{
    /* the key's byte of bm (key >> 3: ctx << 5 | exp >> 3, 7 bits) picked
     * from the 128 bytes in two registers by vpermi2b, its bit by a
     * shuffle of 1 << (exp & 7) */
    const __m512i lo = _mm512_loadu_si512(bm), hi = _mm512_loadu_si512(bm + 64);
    const __m512i m1f = _mm512_set1_epi8(0x1F), m7 = _mm512_set1_epi8(7);
    const __m512i bit = _mm512_broadcast_i32x4(
        _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128));
    size_t i = 0;
    for (; i + 64 <= k; i += 64) {
        __m512i e = _mm512_loadu_si512(exp + i);
        __m512i idx = _mm512_and_si512(_mm512_srli_epi16(e, 3), m1f);
        if (ctx) /* ctx < 4: ctx << 5 stays in its byte */
            idx = _mm512_or_si512(idx, _mm512_slli_epi16(_mm512_loadu_si512(ctx + i), 5));
        __m512i byte = _mm512_permutex2var_epi8(lo, idx, hi);
        __m512i b = _mm512_shuffle_epi8(bit, _mm512_and_si512(e, m7));
        __mmask64 have = _mm512_test_epi8_mask(byte, b);
        if (~have) return i + (size_t)__builtin_ctzll(~have);
    }
    return i;
}
