/* lossless_join.h - internal: the lossless stage's rANS records put back
 * together 32 elements at a time with AVX-512 BW (lossless_exponent.c holds
 * the portable join and chooses: where the rANS coder uses its AVX-512
 * kernels, the same CPU check and KVSERDE_ISA). */
#ifndef KVSERDE_FRAME_LOSSLESS_JOIN_H
#define KVSERDE_FRAME_LOSSLESS_JOIN_H

#include <stddef.h>
#include <stdint.h>

#if KVS_HAVE_X86
/* Elements [0, c) of n, c the largest multiple of 32 <= n, into out (2c
 * bytes, little-endian u16): element j is the exponent e[j] in bits 7-14,
 * the mantissa sm[j] & 0x7F in bits 0-6 and the sign in bit 15: set when
 * q[j] & bit is set, flipped when up is not NULL and bit 15 of up's element
 * j (2c bytes, decoded, not overlapping out) is set. Kinds 1 and 2 pass
 * q = sm and bit 0x80 (their sign is sm's bit 7), kind 3 its flip nibbles
 * and the row above. Returns c. */
size_t kvs_llx_join_avx512(const uint8_t *e, const uint8_t *sm, const uint8_t *q, uint8_t bit,
                           const uint8_t *up, size_t n, uint8_t *out);

/* The same with the mantissas packed 7 bits each (element j's in bits
 * 7j..7j+6 of the little-endian bit string m7, of which 7c / 8 bytes are
 * read), as kind 3 stores them. */
size_t kvs_llx_join7_avx512(const uint8_t *e, const uint8_t *m7, const uint8_t *q, uint8_t bit,
                            const uint8_t *up, size_t n, uint8_t *out);
#endif

#endif /* KVSERDE_FRAME_LOSSLESS_JOIN_H */
