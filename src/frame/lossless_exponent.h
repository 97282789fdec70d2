/* lossless_exponent.h - internal: one block of the lossless stage's rANS
 * coder (payload version 2, docs/frame_format.md): 16-bit elements split
 * into the bfloat16 exponent (bits 7-14), coded with rANS under a table per
 * channel group, and the sign and mantissa (bit 15 and bits 0-6), stored
 * raw; or the block raw when that is smaller.
 *
 * Element i of a block whose first element is number `first` of the
 * payload belongs to channel (first + i) mod `period` (period = the
 * layout's last dim, 1 when unknown). The encoder ranks the block's
 * channels by their mean exponent, cuts the ranking into 1, 2 or 4 groups
 * (whichever its cost estimate, tables and group map included, finds
 * smallest), and codes each group's exponents with that group's table.
 * Where the block starts a row, a row may instead refer to an earlier row
 * it repeats in part (payload version 3): its repeated elements cost a
 * flag, its other exponents are coded as differences to the ones above.
 * Or (payload version 4) the signs are coded too: a sign as a flip of the
 * sign above it in its channel, four rows of a channel to a symbol, under
 * a table per class of channels (by how often they flip), the mantissas
 * packed 7 bits each (K after RoPE: slowly rotating channels keep their
 * sign for many tokens).
 * For float16 the same bits are the 5 exponent bits and the top 3 mantissa
 * bits: still exact, only less well modelled. */
#ifndef KVSERDE_FRAME_LOSSLESS_EXPONENT_H
#define KVSERDE_FRAME_LOSSLESS_EXPONENT_H

#include <stddef.h>
#include <stdint.h>

#include "codecs/rans.h"

/* The largest period the group map is kept for (the encoder uses period 1
 * above it; a reader refuses a larger one). */
#define KVS_LLX_MAX_PERIOD 4096u

/* The record of a block of k elements is at most 1 + 2k bytes. */
#define KVS_LLX_RECORD_MAX(k) (1 + 2 * (size_t)(k))

typedef struct kvs_llx_scratch kvs_llx_scratch;

/* Working memory for blocks of up to max_k elements (NULL: out of memory),
 * and back when done (kept for the next call or freed). */
kvs_llx_scratch *kvs_llx_scratch_take(size_t max_k);
void kvs_llx_scratch_give(kvs_llx_scratch *w);

/* The record kinds beyond kind 1 an encoder may use, and a payload
 * version holds (a bit set): version 3 row references (kind 2), version 4
 * those and the signs coded per channel (kind 3). */
#define KVS_LLX_REFS 1u
#define KVS_LLX_SIGNS 2u

/* Code the k elements at src (2k bytes, little-endian u16) into rec
 * (KVS_LLX_RECORD_MAX(k) bytes); *used = the record's bytes. k <= max_k.
 * tools: the kinds it may try (KVS_LLX_REFS, KVS_LLX_SIGNS); warm: the
 * memory the caller touches next, brought into cache while the block's
 * symbols are coded (kvs_rans_warm; NULL none). Returns the kind the
 * record uses among those (KVS_LLX_REFS or KVS_LLX_SIGNS), 0 for kinds 0
 * and 1 (what payload version 2 holds). */
unsigned kvs_llx_encode_block(kvs_llx_scratch *w, const uint8_t *src, size_t k, uint64_t first,
                              uint32_t period, unsigned tools, const kvs_rans_warm *warm,
                              uint8_t *rec, size_t *used);

/* Decode record rec[0..len) of block `block` (for messages) into the 2k
 * bytes at dst, or refuse it (KVS_ECORRUPT, a message naming the block).
 * tools: the kinds beyond 1 the payload's version holds (0 for version 2,
 * KVS_LLX_REFS for 3, KVS_LLX_REFS | KVS_LLX_SIGNS for 4). */
int kvs_llx_decode_block(kvs_llx_scratch *w, const uint8_t *rec, size_t len, size_t k,
                         uint64_t first, uint32_t period, unsigned tools, uint64_t block,
                         uint8_t *dst);

/* One block's record and destination, for kvs_llx_decode_pair. */
typedef struct kvs_llx_block {
    const uint8_t *rec;
    size_t len, k;
    uint64_t first, block;
    uint8_t *dst;
} kvs_llx_block;

/* Two blocks, each with its own scratch (neither NULL, not the same):
 * kvs_llx_decode_block on blk[0] then on blk[1] (the same bytes, the same
 * first refusal and message, no destination byte written that those calls
 * would not write), with their exponents' rANS streams decoded at once. */
int kvs_llx_decode_pair(kvs_llx_scratch *w[2], const kvs_llx_block blk[2], uint32_t period,
                        unsigned tools);

/* Blocks held: decoded and checked as far as every refusal, their
 * elements not yet written, so that an object's blocks are all checked
 * before its first destination byte is written (the lossless stage
 * decoding into the caller's destination). One slot per block, for blocks
 * of up to 65,536 elements; about 290 KiB a slot, of which a block touches
 * what its symbols take (64-80 KiB). NULL: out of memory, or nblocks 0 or
 * above KVS_LLX_HELD_MAX. Kept for the next call, as the scratches. */
#define KVS_LLX_HELD_MAX 64u
typedef struct kvs_llx_held kvs_llx_held;
kvs_llx_held *kvs_llx_held_take(uint64_t nblocks);
void kvs_llx_held_give(kvs_llx_held *h);

/* Hold the n blocks blk[0..n) in slots slot .. slot + n - 1, with the two
 * scratches w: two blocks' streams decoded at once, the next block's
 * started as soon as one ends (kvs_rans_streams_joint). The refusal and
 * its message are kvs_llx_decode_block's on the first block refused, in
 * order; nothing is written to any block's destination. k <= 65,536. */
int kvs_llx_hold_range(kvs_llx_scratch *w[2], kvs_llx_held *h, uint64_t slot,
                       const kvs_llx_block *blk, size_t n, uint32_t period, unsigned tools);
/* Write the elements of the block held in `slot` (kvs_llx_hold returned
 * KVS_OK for it) to its destination: what kvs_llx_decode_block writes. */
void kvs_llx_held_write(const kvs_llx_held *h, uint64_t slot);
/* The kvs_crc32c (from 0) of the record of the block held in `slot`,
 * taken right after the block was checked (while the record is in cache). */
uint32_t kvs_llx_held_crc(const kvs_llx_held *h, uint64_t slot);

#endif /* KVSERDE_FRAME_LOSSLESS_EXPONENT_H */
