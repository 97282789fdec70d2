/* lossless_split.h - internal: the lossless stage's rANS encoder's first
 * passes over a block with AVX-512 (lossless_exponent.c holds the portable
 * loops, the tails and chooses): the elements split into their fields, the
 * exponents' sums per channel that rank the channels, the histograms'
 * keys, and the search for a key the sampled histograms lack. */
#ifndef KVSERDE_FRAME_LOSSLESS_SPLIT_H
#define KVSERDE_FRAME_LOSSLESS_SPLIT_H

#include <stddef.h>
#include <stdint.h>

/* x86 only (declared everywhere for the tests, which check the machine
 * themselves). Elements [0, c) of the k little-endian u16 at src, c the
 * largest multiple of 32 <= k, into exp (bits 7-14) and sm (bit 15 in bit
 * 7, bits 0-6). Returns c. */
size_t kvs_llx_split_avx512(const uint8_t *src, size_t k, uint8_t *exp, uint8_t *sm);

/* s16[j] += row[j] (mod 2^16) for j in [0, c), c the largest multiple of 32
 * <= n. Returns c. */
size_t kvs_llx_add_row_avx512(const uint8_t *row, size_t n, uint16_t *s16);

/* key[i] = ctx[i] << 8 | exp[i] (ctx NULL: 0 << 8) for i in [0, c), c the
 * largest multiple of 32 <= k. Returns c. */
size_t kvs_llx_keys_avx512(const uint8_t *exp, const uint8_t *ctx, size_t k, uint16_t *key);

/* The first i in [0, c) whose key ctx[i] << 8 | exp[i] (ctx NULL: exp[i])
 * has no bit in bm (bit key % 8 of byte key / 8: 1024 keys; ctx[i] < 4),
 * c the largest multiple of 64 <= k; c when every key there has its bit. */
size_t kvs_llx_first_absent_avx512(const uint8_t *exp, const uint8_t *ctx, size_t k,
                                   const uint8_t bm[128]);

/* The same with AVX2 (lossless_split_avx2.c), c the largest multiple of 32
 * <= k. */
size_t kvs_llx_first_absent_avx2(const uint8_t *exp, const uint8_t *ctx, size_t k,
                                 const uint8_t bm[128]);

#endif /* KVSERDE_FRAME_LOSSLESS_SPLIT_H */
