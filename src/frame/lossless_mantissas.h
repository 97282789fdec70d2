/* lossless_mantissas.h - internal: the 7-bit mantissa packing of the
 * lossless stage's record kind 3 with BMI2's bit deposit and extract (and
 * AVX-512 VBMI's byte permute and multishift to unpack, or AVX2's byte
 * shuffle and multiplies; lossless_exponent.c
 * holds the portable loops, the tails and chooses).
 * Element i's bits 0-6 are bits 7i..7i+6 of the little-endian bit string. */
#ifndef KVSERDE_FRAME_LOSSLESS_MANTISSAS_H
#define KVSERDE_FRAME_LOSSLESS_MANTISSAS_H

#include <stddef.h>
#include <stdint.h>

/* x86 only (declared everywhere for the tests, which check the machine
 * themselves). The mantissas of sm[0..c), c the largest multiple of 8 <=
 * k, packed into out (7c / 8 bytes, and one byte more is written: 0); out
 * may be sm. Returns c. */
size_t kvs_llx_pack7_avx512(const uint8_t *sm, size_t k, uint8_t *out);

/* The inverse for the first c (as above) of k elements: in[0..7c / 8 + 1)
 * is read (the byte after them too) and sm[0..c) written, bit 7 0. Returns
 * c. */
size_t kvs_llx_unpack7_avx512(const uint8_t *in, size_t k, uint8_t *sm);

/* The same with AVX2 (no BMI2 or VBMI), for the first c of k elements, c
 * the largest multiple of 16 <= k whose 16-byte reads stay inside
 * in[0..nin): reads nothing at or past in + nin. Returns c. */
size_t kvs_llx_unpack7_avx2(const uint8_t *in, size_t k, size_t nin, uint8_t *sm);

#endif /* KVSERDE_FRAME_LOSSLESS_MANTISSAS_H */
