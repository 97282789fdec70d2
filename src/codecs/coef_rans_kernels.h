/* coef_rans_kernels.h - internal: the coefficient coder's symbol mapping
 * (coef_rans.c), scalar and AVX-512 (coef_rans_avx512.c), the same symbols
 * and raw codes bit for bit.
 *
 * A row's coefficients row[j0..cols) (clamped to +-KVS_COEF_RANS_MAX) into
 * their symbols srow[j] and, for those with raw bits only, in order, their
 * raw codes (the bits | their count << 16) appended at pending[*k]; a
 * symbol that the table of its column's class cls[j] does not code (info:
 * the rANS encoder's entries, rans.h, frequency 0) becomes the escape with
 * 16 raw bits. The AVX-512 variant does whole groups of 16 and returns the
 * column it stopped at; the scalar one does the rest. */
#ifndef KVSERDE_CODECS_COEF_RANS_KERNELS_H
#define KVSERDE_CODECS_COEF_RANS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "codecs/rans.h"

void kvs_coef_rans_row_scalar(const int32_t *row, size_t j0, size_t cols, const uint8_t *cls,
                              const kvs_rans_enc_tables *info, uint8_t *srow, uint32_t *pending,
                              size_t *k);
#if KVS_HAVE_X86
/* Decoding: from column j of a row of decoded symbols srow[0..cols), the
 * values of whole groups of 16 none of whose symbols has raw bits
 * (raw_of[s] == 0; value_of[s] its value) into orow; returns the column of
 * the first group that has some, or where fewer than 16 are left (the
 * scalar decoder takes those, in order with the raw bits). */
size_t kvs_coef_rans_plain_avx512(const uint8_t *srow, size_t j, size_t cols,
                                  const int32_t *raw_of, const float *value_of, float *orow);
size_t kvs_coef_rans_row_avx512(const int32_t *row, size_t cols, const uint8_t *cls,
                                const kvs_rans_enc_tables *info, uint8_t *srow,
                                uint32_t *pending, size_t *k);
#endif

#endif /* KVSERDE_CODECS_COEF_RANS_KERNELS_H */
