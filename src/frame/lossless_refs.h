/* lossless_refs.h - internal: the SIMD part of the lossless stage's
 * row-reference finder and of the estimate of its record kind 2
 * (lossless_exponent.c's find_refs and encode_refs hold the scalar ones
 * and choose). */
#ifndef KVSERDE_FRAME_LOSSLESS_REFS_H
#define KVSERDE_FRAME_LOSSLESS_REFS_H

#include <stddef.h>
#include <stdint.h>

/* Channels sampled per row, and the hash of a sample's (channel, value)
 * key: slot = (key * KVS_LLX_REF_HASH_MUL) >> (32 - hash_bits). */
#define KVS_LLX_REF_SAMPLES 32
#define KVS_LLX_REF_HASH_MUL 0x9E3779B1u

/* x86 only (declared everywhere for the tests, which check the machine
 * themselves). Row r of a block (row: its u16 elements, whole), sampled
 * at the elements at_c[0..32) (at_c[0] = 0, at_c[j] >= 1 and below the
 * row's length for j >= 1): key j = element at_c[j] | j << 16, looked up
 * in hash (row + 1 of the last row with that slot, 0 none), then every
 * key's slot set to r + 1. Writes the candidates to count into cand: row
 * r - 1 when r > 0, then each other row two or more samples found, in the
 * order of its first sample; returns their count (at most 17). r + 1 <
 * 2^16 (the rows are told apart as words). */
uint32_t kvs_llx_ref_candidates_avx512(const uint8_t *row, const uint32_t *at_c, uint32_t *hash,
                                       unsigned hash_bits, uint32_t r, uint32_t *cand);
/* Tests: how the AVX-512 finder tells its samples' rows apart, 0 by word
 * rotations, 1 by conflict detection (AVX512CD), -1 the form for this
 * CPU's vendor (the default: conflicts on AMD's cores); the same
 * candidates either way. */
void kvs_llx_set_ref_conflicts(int form);
/* The same with AVX2 (lossless_refs_avx2.c). */
uint32_t kvs_llx_ref_candidates_avx2(const uint8_t *row, const uint32_t *at_c, uint32_t *hash,
                                     unsigned hash_bits, uint32_t r, uint32_t *cand);

/* Of the nc candidates cand (rows of the block at src, period u16 each),
 * the one with the most of the len u16 at row equal to its own (len <=
 * period), the first among equal counts: its index in cand, its count in
 * *most (0 and 0 when nc is 0). One call a row: a call and the ISA's check
 * per candidate cost level 3 2-3 % of its encoding on Zen 4. */
uint32_t kvs_llx_best_candidate_avx512(const uint8_t *row, const uint8_t *src, size_t period,
                                       const uint32_t *cand, uint32_t nc, size_t len,
                                       size_t *most);

/* AVX-512 VBMI2. The kind 2 estimate's counts of elements [0, c) of a row
 * of n u16 (c the largest multiple of 32 <= n) against the row above it
 * (above; their exponents exp and exp_above): flag bit fbit + j of fl set
 * where element j equals above's (fl's bits there 0 before; 5 bytes from
 * fbit / 8 are written a step), each difference exp[j] - exp_above[j] (mod
 * 256) that is not 0 appended at nonzero[*nnz] (*nnz advanced), *same
 * increased by the flags set. Returns c. */
size_t kvs_llx_row_diffs_avx512vbmi2(const uint8_t *row, const uint8_t *above, const uint8_t *exp,
                                     const uint8_t *exp_above, size_t n, uint8_t *fl, size_t fbit,
                                     uint8_t *nonzero, size_t *nnz, size_t *same);

#endif /* KVSERDE_FRAME_LOSSLESS_REFS_H */
