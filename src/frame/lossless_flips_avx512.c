/* lossless_flips_avx512.c - kind 3's sign flips (lossless_flips.h) 64
 * channels and four rows a step: the portable loop ORs one row's bit into
 * 16 nibbles at a time, a read and a write of the nibbles per row; and
 * their histograms per sign class, 64 channels a step in a byte counter
 * per value and channel. Compiled with the AVX-512 flags (CMakeLists.txt);
 * the caller checks the CPU. Writes what the portable loops write
 * (test_lossless runs both). */
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

/* The byte counters of 64 channels hold at most 255 rows between folds. A
 * counter per value in a register, and a compare and a masked add per
 * value and row: the portable loop's 16 partial histograms took a load, an
 * add and a store per nibble, a twentieth of level 3's encoder. */
#define NIBBLE_FOLD_ROWS 255

void kvs_llx_nibble_hists_avx512(const uint8_t *nib, size_t n, uint32_t period,
                                 const uint8_t *cls, uint32_t h[4][16])
{
    size_t rows = n / period;
    const __m512i one = _mm512_set1_epi8(1), zero = _mm512_setzero_si512();
    for (uint32_t c = 0; c < period; c += 64) {
        __mmask64 live = period - c >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << (period - c)) - 1;
        __m512i cl = _mm512_maskz_loadu_epi8(live, cls + c);
        __mmask64 in[4];
        for (int q = 0; q < 4; q++)
            in[q] = _mm512_mask_cmpeq_epi8_mask(live, cl, _mm512_set1_epi8((char)q));
        for (size_t r0 = 0; r0 < rows; r0 += NIBBLE_FOLD_ROWS) {
            size_t r1 = rows - r0 < NIBBLE_FOLD_ROWS ? rows : r0 + NIBBLE_FOLD_ROWS;
            __m512i cnt[16];
            for (int v = 0; v < 16; v++) cnt[v] = zero;
            for (size_t r = r0; r < r1; r++) {
                __m512i x = _mm512_maskz_loadu_epi8(live, nib + r * period + c);
#pragma GCC unroll 16
                for (int v = 0; v < 16; v++)
                    cnt[v] = _mm512_mask_add_epi8(
                        cnt[v], _mm512_cmpeq_epi8_mask(x, _mm512_set1_epi8((char)v)), cnt[v], one);
            }
            /* each value's counts summed over the channels of each class */
            for (int v = 0; v < 16; v++)
                for (int q = 0; q < 4; q++)
                    h[q][v] += (uint32_t)_mm512_reduce_add_epi64(
                        _mm512_sad_epu8(_mm512_maskz_mov_epi8(in[q], cnt[v]), zero));
        }
    }
}
