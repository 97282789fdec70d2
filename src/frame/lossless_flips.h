/* lossless_flips.h - internal: the sign flips of the lossless stage's
 * record kind 3 made and counted with AVX-512 (lossless_exponent.c's
 * sign_nibbles and sign_plan hold the portable loops and choose). */
#ifndef KVSERDE_FRAME_LOSSLESS_FLIPS_H
#define KVSERDE_FRAME_LOSSLESS_FLIPS_H

#include <stddef.h>
#include <stdint.h>

/* x86 only (declared everywhere for the tests, which check the machine
 * themselves). sign_nibbles' nibbles of the k sign and mantissa bytes at sm
 * (bit 7 the sign; rows of period from sm's start): bit t of nib[j period
 * + c] is the sign of element (4j + t, c) XOR the sign of (4j + t - 1, c)
 * (row 0: XOR 0), 0 past the block's end; every nibble of the
 * ceil(ceil(k / period) / 4) groups is written. Returns their count. */
size_t kvs_llx_sign_nibbles_avx512(const uint8_t *sm, size_t k, uint32_t period, uint8_t *nib);

/* The histograms of those nibbles (n of them, rows of period; every
 * value below 16) per sign class: h[q][v] += the nibbles of value v in
 * the channels c whose cls[c] is q (0 to 3). */
void kvs_llx_nibble_hists_avx512(const uint8_t *nib, size_t n, uint32_t period,
                                 const uint8_t *cls, uint32_t h[4][16]);

#endif /* KVSERDE_FRAME_LOSSLESS_FLIPS_H */
