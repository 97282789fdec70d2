/* coef_rans_kernels.h - internal: the coefficient coder's symbol mapping
 * (coef_rans.c), scalar and AVX-512 (coef_rans_avx512.c), the same symbols
 * and raw codes bit for bit.
 *
 * A row's coefficients row[j0..cols) (clamped to +-KVS_COEF_RANS_MAX) into
 * their symbols srow[j] and, for those with raw bits only, in order, their
 * raw codes (the bits | their count << 16) appended at pending[*k]; a
 * symbol that the table of its column's class cls[j] does not code
 * (frequency 0 in coef_tables.h) becomes the escape with 16 raw bits.
 * The scalar one does the columns from j0 on. */
#ifndef KVSERDE_CODECS_COEF_RANS_KERNELS_H
#define KVSERDE_CODECS_COEF_RANS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* The decoder's entry of a symbol (entry_of): its raw bit count (bits
 * 0-4), whether it is the escape (which the scalar decoder takes), whether
 * its value is negative, and its magnitude before the raw bits (bits 8-31):
 * the value is +-(magnitude + raw bits). */
#define KVS_COEF_ENTRY_ESCAPE 0x20u
#define KVS_COEF_ENTRY_NEG 0x40u

void kvs_coef_rans_row_scalar(const int32_t *row, size_t j0, size_t cols, const uint8_t *cls,
                              uint8_t *srow, uint32_t *pending, size_t *k);
#if KVS_HAVE_X86
/* Encoding, the same with range_of[c] = the first | the last symbol << 8
 * that class c codes (every class's table codes a range and the escape,
 * coef_rans.c checks), for whole groups of 16; returns the column it
 * stopped at. pending has room for cols codes. */
size_t kvs_coef_rans_row_avx512(const int32_t *row, size_t cols, const uint8_t *cls,
                                const uint32_t *range_of, uint8_t *srow, uint32_t *pending,
                                size_t *k);
/* Decoding: from coefficient i of the decoded symbols sym[0..count) (the
 * matrix in row order), whole groups of 16 into their values out[i..],
 * their raw bits from bit *bitpos of raw[0..raw_n) on (*bitpos moves past
 * them); stops before a group with an escape, one whose raw bits are not
 * all inside raw (4 bytes beyond the last), or fewer than 16 left, and
 * returns where: the scalar decoder takes that group. */
size_t kvs_coef_rans_values_avx512(const uint8_t *sym, size_t i, size_t count,
                                   const uint32_t *entry_of, const uint8_t *raw, size_t raw_n,
                                   size_t *bitpos, float *out);
#endif

#endif /* KVSERDE_CODECS_COEF_RANS_KERNELS_H */
