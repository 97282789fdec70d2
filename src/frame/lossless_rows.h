/* lossless_rows.h - internal: the SIMD rebuild of a row with a reference of
 * the lossless stage's record kind 2, and the encoder's inverse, with
 * AVX-512 VBMI2 (lossless_rows_avx512vbmi2.c) or AVX2 (lossless_rows_avx2.c);
 * lossless_exponent.c holds the scalar loops and chooses. */
#ifndef KVSERDE_FRAME_LOSSLESS_ROWS_H
#define KVSERDE_FRAME_LOSSLESS_ROWS_H

#include <stddef.h>
#include <stdint.h>

/* x86 only (declared everywhere for the tests, which check the machine
 * themselves). Elements [0, c) of a row of n whose reference row is `above` (decoded,
 * 2n bytes, not overlapping out[0..2c)), c the largest multiple of 32 <= n:
 * element j repeats above's when flag bit fbit + j of fl[0..nfb) is set,
 * else takes the next of sym / sm (the difference to above's exponent, the
 * sign and mantissa byte). Returns c; *used = the sym / sm bytes taken. */
size_t kvs_llx_row_refs_avx512vbmi2(const uint8_t *above, const uint8_t *fl, size_t nfb,
                                    size_t fbit, const uint8_t *sym, const uint8_t *sm, size_t n,
                                    uint8_t *out, size_t *used);

/* The encoder's inverse for elements [0, c) of a row of n (c as above):
 * each element j whose flag bit fbit + j of fl[0..nfb) is clear appends
 * exp[j] - above[j] (mod 256) to sym, ctx to sym_ctx and sm[j] to sm_out,
 * in element order; nothing is written past what is appended. Returns c;
 * *used = the bytes appended to each. */
size_t kvs_llx_row_split_avx512vbmi2(const uint8_t *exp, const uint8_t *above, const uint8_t *sm,
                                     const uint8_t *fl, size_t nfb, size_t fbit, size_t n,
                                     uint8_t ctx, uint8_t *sym, uint8_t *sym_ctx, uint8_t *sm_out,
                                     size_t *used);

/* The same with AVX2, 16 elements a step (c the largest multiple of 16 the
 * steps reach). The rebuild stops where fewer than 16 of sym / sm remain
 * (avail: the bytes readable at each), so it reads nothing past them. The
 * split writes whole 8- and 16-byte stores: past what it appends, but
 * never past sym + c (nor sym_ctx + c, sm_out + c). */
size_t kvs_llx_row_refs_avx2(const uint8_t *above, const uint8_t *fl, size_t nfb, size_t fbit,
                             const uint8_t *sym, const uint8_t *sm, size_t avail, size_t n,
                             uint8_t *out, size_t *used);
size_t kvs_llx_row_split_avx2(const uint8_t *exp, const uint8_t *above, const uint8_t *sm,
                              const uint8_t *fl, size_t nfb, size_t fbit, size_t n, uint8_t ctx,
                              uint8_t *sym, uint8_t *sym_ctx, uint8_t *sm_out, size_t *used);

#endif /* KVSERDE_FRAME_LOSSLESS_ROWS_H */
