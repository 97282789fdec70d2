/* lossless_refs_avx512vbmi2.c - the kind 2 estimate's pass over a row with
 * a reference (lossless_refs.h), 32 elements a step: its repeat flags from
 * word compares, and its exponent differences with the zeros left out by
 * VBMI2's byte compress. The differences are mostly 0 (every
 * repeated element's and 79 % of the others'), so counting only the others
 * leaves about a fifth of the increments, which bound that pass. Compiled
 * with the AVX-512 flags and -mavx512vbmi2 (CMakeLists.txt); the caller
 * checks the CPU. The same flags and counts as the portable loop
 * (test_lossless runs both). */
#include <immintrin.h>

#include "frame/lossless_refs.h"

size_t kvs_llx_row_diffs_avx512vbmi2(const uint8_t *row, const uint8_t *above, const uint8_t *exp,
                                     const uint8_t *exp_above, size_t n, uint8_t *fl, size_t fbit,
                                     uint8_t *nonzero, size_t *nnz, size_t *same)
{
    size_t c = 0, z = *nnz, s = 0;
    for (; c + 32 <= n; c += 32, fbit += 32) {
        uint32_t eq = _mm512_cmpeq_epi16_mask(_mm512_loadu_si512(row + 2 * c),
                                              _mm512_loadu_si512(above + 2 * c));
        uint64_t m = (uint64_t)eq << (fbit & 7);
        uint8_t *f = fl + (fbit >> 3);
        for (unsigned j = 0; j < 5; j++) f[j] = (uint8_t)(f[j] | m >> (8 * j));
        s += (size_t)__builtin_popcount(eq);
        __m256i df = _mm256_sub_epi8(_mm256_loadu_si256((const __m256i *)(exp + c)),
                                     _mm256_loadu_si256((const __m256i *)(exp_above + c)));
        /* compressed in a register, then a masked store of as many bytes:
         * VBMI2's compressing store to memory is microcode on AMD's Zen 4
         * (77 TSC ticks a store there against 3 for this pair) */
        __mmask32 nz = _mm256_test_epi8_mask(df, df);
        unsigned cnt = (unsigned)__builtin_popcount(nz);
        _mm256_mask_storeu_epi8(nonzero + z, (__mmask32)((1ull << cnt) - 1),
                                _mm256_maskz_compress_epi8(nz, df));
        z += cnt;
    }
    *nnz = z;
    *same += s;
    return c;
}
