/* lossless_flips_avx512.c - kind 3's sign flips (lossless_flips.h) 64
 * channels and four rows a step: the portable loop ORs one row's bit into
 * 16 nibbles at a time, a read and a write of the nibbles per row. Compiled
 * with the AVX-512 flags (CMakeLists.txt); the caller checks the CPU.
 * Writes what the portable loop writes (test_lossless runs both). */
#include <immintrin.h>

#include "frame/lossless_flips.h"

size_t kvs_llx_sign_nibbles_avx512(const uint8_t *sm, size_t k, uint32_t period, uint8_t *nib)
{
    size_t rows = (k + period - 1) / period, groups = (rows + 3) / 4;
    for (size_t j = 0; j < groups; j++)
        for (uint32_t c = 0; c < period; c += 64) {
            __mmask64 live =
                period - c >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (period - c)) - 1;
            __m512i q = _mm512_setzero_si512(), up = _mm512_setzero_si512();
            size_t r = 4 * j;
            /* the row above the group's first (masked loads read nothing
             * outside their lanes) */
            if (r) up = _mm512_maskz_loadu_epi8(live, sm + (r - 1) * period + c);
            for (unsigned t = 0; t < 4 && r + t < rows; t++) {
                size_t i0 = (r + t) * period + c;
                /* the last row may end before the period */
                __mmask64 in = k <= i0        ? 0
                               : k - i0 >= 64 ? live
                                              : live & (((__mmask64)1 << (k - i0)) - 1);
                __m512i x = _mm512_maskz_loadu_epi8(in, sm + i0);
                __mmask64 flip = _mm512_movepi8_mask(_mm512_xor_si512(x, up)) & in;
                __m512i bit = _mm512_set1_epi8((char)(1 << t));
                q = _mm512_or_si512(q, _mm512_maskz_mov_epi8(flip, bit));
                up = x;
            }
            _mm512_mask_storeu_epi8(nib + j * period + c, live, q);
        }
    return groups * period;
}
