/* lossless_split_avx2.c - the rANS encoder's search for keys the sampled
 * histograms lack (lossless_split.h), 32 elements a step with AVX2, for
 * cores without AVX-512 (lossless_split_avx512.c has the AVX-512 one):
 * the portable loop, a load and a test per element, costs about what the
 * sampled counting saves (docs/performance.md). Compiled with the AVX2
 * flags (CMakeLists.txt); the caller checks the CPU. Returns what the
 * portable loop returns (test_lossless runs both). */
#include <immintrin.h>

#include "frame/lossless_split.h"

size_t kvs_llx_first_absent_avx2(const uint8_t *exp, const uint8_t *ctx, size_t k,
                                 const uint8_t bm[128])
{
    /* The key's byte of bm, x = key >> 3 (ctx << 5 | exp >> 3, below 128),
     * from eight 16-byte slices by shuffles: x - 16 j has bit 7 clear (the
     * shuffle then takes slice j's byte x & 15) exactly for the slices j
     * up to x's own, so with slice j's table XORed with slice j - 1's the
     * XOR of the shuffles is x's byte. Without contexts x < 32: two
     * slices. */
    __m256i t[8];
    for (int j = 0; j < 8; j++) {
        __m128i s = _mm_loadu_si128((const __m128i *)(bm + 16 * j));
        if (j) s = _mm_xor_si128(s, _mm_loadu_si128((const __m128i *)(bm + 16 * (j - 1))));
        t[j] = _mm256_broadcastsi128_si256(s);
    }
    const int slices = ctx ? 8 : 2;
    const __m256i m1f = _mm256_set1_epi8(0x1F), m7 = _mm256_set1_epi8(7),
                  m16 = _mm256_set1_epi8(16), zero = _mm256_setzero_si256();
    const __m256i bit = _mm256_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64,
                                         -128, 1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32,
                                         64, -128);
    size_t i = 0;
    for (; i + 32 <= k; i += 32) {
        __m256i e = _mm256_loadu_si256((const __m256i *)(exp + i));
        __m256i x = _mm256_and_si256(_mm256_srli_epi16(e, 3), m1f);
        if (ctx) /* ctx < 4: ctx << 5 stays in its byte */
            x = _mm256_or_si256(x, _mm256_slli_epi16(
                                       _mm256_loadu_si256((const __m256i *)(ctx + i)), 5));
        __m256i byte = zero;
        for (int j = 0; j < slices; j++, x = _mm256_sub_epi8(x, m16))
            byte = _mm256_xor_si256(byte, _mm256_shuffle_epi8(t[j], x));
        __m256i b = _mm256_shuffle_epi8(bit, _mm256_and_si256(e, m7));
        unsigned miss = (unsigned)_mm256_movemask_epi8(
            _mm256_cmpeq_epi8(_mm256_and_si256(byte, b), zero));
        if (miss) return i + (size_t)__builtin_ctz(miss);
    }
    return i;
}
