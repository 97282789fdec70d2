/* rans.h - internal: static-table interleaved rANS over bytes, with one
 * frequency table per context.
 *
 * A coder for byte symbols whose statistics the caller has counted: each
 * symbol i is coded with the table of its context ctx[i] (0 to
 * KVS_RANS_MAX_CTX - 1), each table a distribution normalised to
 * KVS_RANS_TOTAL. 32 rANS states (32 bits, 16-bit renormalisation, state
 * interval [2^15, 2^31)) take symbols in turn (symbol i goes to state i mod
 * 32), so a decoder runs 32 independent dependency chains at once: two
 * AVX-512 vectors of 16, four AVX2 vectors of 8, or a scalar loop
 * (rans_avx512.c, rans_avx2.c, rans.c: the same stream bit for bit).
 *
 * Why a coder of our own: the lossless stage codes the bfloat16 exponent
 * with a table per channel group (docs/performance.md measures that it pays).
 * The maintained coders do not take per-symbol tables: zstd's and isa-l's
 * Huffman are not public API or code one table per block, liblz4 has no
 * entropy stage. So this is ryg's public-domain rans_byte scheme (division by
 * reciprocal in the encoder, exact for states below 2^31) in 16-bit words.
 *
 * Stream (little-endian): the 32 final encoder states (u32 each, state 0
 * first), then the renormalisation words (u16) in the order the decoder
 * reads them. kvs_rans_decode treats it as hostile: every read is checked,
 * the states must start inside the interval and end where the encoder
 * started (2^15 each) with every word consumed; anything else is refused.
 *
 * Table form (kvs_rans_freqs_write): u8 first symbol lo, u8 last symbol hi
 * (lo <= hi), then the frequency of each symbol lo..hi: one byte 0-127, or
 * two bytes 0x80 | f >> 8, f & 0xFF for 128-1024; the frequencies sum to
 * KVS_RANS_TOTAL. At most 2 + 2 x 256 bytes. */
#ifndef KVSERDE_CODECS_RANS_H
#define KVSERDE_CODECS_RANS_H

#include <stddef.h>
#include <stdint.h>

#define KVS_RANS_SCALE_BITS 10 /* 1024 slots: 0.003 bits per exponent over 4096 */
#define KVS_RANS_TOTAL (1u << KVS_RANS_SCALE_BITS)
#define KVS_RANS_LANES 32
/* The lossless stage takes 8 (4 channel groups, and the row residuals
 * (kind 2) or 4 sign classes (kind 3)); the transform stage's coefficient
 * coder one per column class, 64 (coef_rans.h). Tables fill only the
 * contexts they are given (kvs_rans_*_init), so a larger maximum costs the
 * lossless stage address space, not time. */
#define KVS_RANS_MAX_CTX 64
#define KVS_RANS_FREQS_MAX (2 + 2 * 256)

/* A normalised distribution: f[s] symbols s in KVS_RANS_TOTAL, summing to
 * KVS_RANS_TOTAL; a symbol with f[s] == 0 cannot be coded. */
typedef struct kvs_rans_freqs {
    uint16_t f[256];
} kvs_rans_freqs;

/* The encoder's per-symbol constants, per context (index ctx * 256 + s):
 * bias (bits 0-12) | f (bits 13-25, 0 = no code) | reciprocal shift (bits
 * 26-29). 1 KiB per context. The scalar loop takes the reciprocal of f
 * from one table of every frequency's (rans.c), which stays in L1
 * where a copy per symbol took 64 KiB for the coefficient coder's 64
 * contexts (its scalar encoding 4 % faster); the SIMD kernels gather both
 * at once from the wide form below (on Zen 5 the coefficient coder's 64
 * contexts encode at the same 2.4 TSC ticks a symbol either way). Only
 * the coded symbols' entries are written by kvs_rans_enc_init; the
 * others are 0. */
typedef struct kvs_rans_enc_tables {
    uint32_t info[KVS_RANS_MAX_CTX * 256];
    uint32_t top; /* the last context with a table: nctx - 1 */
    /* The AVX2 and AVX-512 kernels' form of the same: info | the
     * reciprocal << 32, both from one 64-bit gather (on Zen 3 the two
     * 32-bit gathers, the second waiting on the first's f, were 1.4x
     * slower: 96 against 65-69 us for 65,536 symbols; on Zen 5 see
     * rans_avx512.c). Filled only where kvs_rans_enc_init runs with those
     * kernels in use (wide_ok); elsewhere they code from info. */
    uint32_t wide_ok;
    uint64_t wide[KVS_RANS_MAX_CTX * 256];
    /* The AVX-512 kernel's byte form, where every context's coded symbols
     * lie in a window of W = 256 >> ceil(log2 nctx) symbols (nctx <= 8;
     * win_ok): context c's window starts at win_base[c], and byte b of
     * wide's entry (c, s) is win_field[b][c W + s - win_base[c]] (0
     * elsewhere: no code), so the entries of 64 symbols are eight 256-byte
     * lookups by byte permutes instead of gathers (rans_avx512.c). */
    uint32_t win_ok, win_log2;
    uint8_t win_base[64], win_high[64];
    uint8_t win_field[8][256];
} kvs_rans_enc_tables;

/* The decoder's table, per context (index ctx * KVS_RANS_TOTAL + slot): the
 * slot's symbol's frequency (bits 21-31), the symbol (bits 10-17) and the
 * slot's offset from the symbol's first slot (bits 0-9). The frequency on
 * top is one shift from the gathered entry to the multiply, on the
 * decoder's critical path (a field in the middle took a shift, a mask and
 * the + 1 of a stored f - 1). 4 KiB per context: a lossless block's eight
 * stay in L1, and a block fills 4 KiB per context it uses. */
#define KVS_RANS_DEC_F_SHIFT (31 - KVS_RANS_SCALE_BITS)
#define KVS_RANS_DEC_SYM_SHIFT KVS_RANS_SCALE_BITS
typedef struct kvs_rans_dec_tables {
    uint32_t slot[KVS_RANS_MAX_CTX * KVS_RANS_TOTAL];
    uint32_t top; /* the last context with a table: nctx - 1 */
} kvs_rans_dec_tables;

/* Normalise counts (any, not all zero) to a distribution that gives every
 * counted symbol at least 1. All-zero counts give f[0] = KVS_RANS_TOTAL. */
void kvs_rans_normalize(const uint32_t count[256], kvs_rans_freqs *out);

/* Bits the symbols counted in `count` take under `t` (their order-0 cost,
 * without the table), an estimate for choosing contexts. A counted symbol
 * that `t` cannot code counts 1e9 bits. */
double kvs_rans_cost_bits(const uint32_t count[256], const kvs_rans_freqs *t);

/* kvs_rans_normalize into out, and what the counts cost under it in
 * bits, its table form included (kvs_rans_cost_bits + 8 x
 * kvs_rans_freqs_size), from one scan of the counts: the lossless
 * encoder's estimates normalise 10 to 20 tables a block. */
double kvs_rans_normalize_estimate(const uint32_t count[256], kvs_rans_freqs *out);

/* The compact table form into out (KVS_RANS_FREQS_MAX bytes suffice);
 * returns its byte count. */
size_t kvs_rans_freqs_write(const kvs_rans_freqs *t, uint8_t *out);
/* Its byte count alone, for the encoder's estimates. */
size_t kvs_rans_freqs_size(const kvs_rans_freqs *t);

/* Read one table form from in[0..n): KVS_OK with *used its bytes, or
 * KVS_ECORRUPT (truncated, lo > hi, a frequency above KVS_RANS_TOTAL, a sum
 * other than KVS_RANS_TOTAL) with a message naming `what`. */
int kvs_rans_freqs_read(const uint8_t *in, size_t n, const char *what, kvs_rans_freqs *t,
                        size_t *used);

/* Build the coding tables of nctx (1 to KVS_RANS_MAX_CTX) distributions
 * (only those: a block with fewer contexts fills less). */
void kvs_rans_enc_init(kvs_rans_enc_tables *e, const kvs_rans_freqs *t, unsigned nctx);
void kvs_rans_dec_init(kvs_rans_dec_tables *d, const kvs_rans_freqs *t, unsigned nctx);

/* The most bytes kvs_rans_encode writes for n symbols. */
static inline size_t kvs_rans_bound(size_t n)
{
    return 4 * KVS_RANS_LANES + 2 * n + 2;
}

/* Code sym[0..n), symbol i with the table of context ctx[i] (ctx NULL: all
 * context 0; a value above nctx - 1 counts as nctx - 1), into out[0..cap),
 * cap >= kvs_rans_bound(n); *outn = the stream's bytes. KVS_EINVAL if a
 * symbol has frequency 0 in its table, KVS_ENOSPC if cap is short. */
int kvs_rans_encode(const kvs_rans_enc_tables *e, const uint8_t *sym, const uint8_t *ctx,
                    size_t n, uint8_t *out, size_t cap, size_t *outn);

/* Memory a caller touches after coding or decoding, which the kernels
 * bring into cache meanwhile, a line of each range per group of 32
 * symbols (a kernel is a long stretch of arithmetic that leaves the memory
 * idle): bytes it reads next (the lossless encoder's next block, whose
 * split into fields waited on memory) and bytes it writes next (the
 * records' area ahead; the decoded block's destination). A length of 0:
 * none. */
typedef struct kvs_rans_warm {
    const uint8_t *read;
    size_t read_len;
    const uint8_t *write;
    size_t write_len;
} kvs_rans_warm;

/* kvs_rans_encode for a caller that copies the stream on: the stream is
 * left where the coder built it, at the end of out: out[*at .. cap) (the
 * same bytes; one copy of them fewer); warm (NULL: none) is brought into
 * cache meanwhile. */
int kvs_rans_encode_tail(const kvs_rans_enc_tables *e, const uint8_t *sym, const uint8_t *ctx,
                         size_t n, uint8_t *out, size_t cap, const kvs_rans_warm *warm,
                         size_t *at);

/* Decode exactly n symbols from in[0..len) into sym (ctx as for encode; the
 * same contexts the encoder used). KVS_ECORRUPT, with a message naming
 * `what`, when the stream is not exactly the coding of n symbols under these
 * tables as far as rANS can tell (a damaged word may still decode to wrong
 * symbols: the frame's checksum catches those). */
int kvs_rans_decode(const kvs_rans_dec_tables *d, const uint8_t *in, size_t len,
                    const uint8_t *ctx, uint8_t *sym, size_t n, const char *what);

/* One stream for kvs_rans_decode2 and the streams below: kvs_rans_decode's
 * arguments, and the memory the caller touches after it, brought into
 * cache while its symbols are decoded (kvs_rans_warm; lengths 0: none): the
 * lossless stage gives a block's destination, which it writes after every
 * block of the object is checked (a cold destination had decoding run 7 %
 * slower, docs/performance.md). */
typedef struct kvs_rans_dec_job {
    const kvs_rans_dec_tables *d;
    const uint8_t *in;
    size_t len;
    const uint8_t *ctx;
    uint8_t *sym;
    size_t n;
    const char *what;
    kvs_rans_warm warm;
} kvs_rans_dec_job;

/* Two independent streams decoded at once: the decoder's dependency chains
 * wait on their latency, so a second stream's chains fill the gaps (a
 * block's kernel time about 36 -> 28 us, docs/performance.md). KVS_OK,
 * with each stream's symbols kvs_rans_decode's, exactly when both
 * kvs_rans_decode calls would return it; else KVS_ECORRUPT naming one of
 * them (a caller that must name the first decodes them one by one). */
int kvs_rans_decode2(const kvs_rans_dec_job job[2]);

/* A stream decoded in steps, so that a caller with more streams than two
 * keeps two running at once: when one ends (kvs_rans_streams_joint says
 * which), it is finished and the next started in its place, and only the
 * last stream's end runs alone (with kvs_rans_decode2 on pairs, the odd
 * block of an object and the longer stream of each pair ran alone). */
typedef struct kvs_rans_dec_stream {
    kvs_rans_dec_job job;
    uint32_t x[KVS_RANS_LANES];
    const uint8_t *p;
    size_t done; /* symbols decoded */
} kvs_rans_dec_stream;
/* Read job's states (kvs_rans_decode's checks of them, its refusal). */
int kvs_rans_stream_start(kvs_rans_dec_stream *s, const kvs_rans_dec_job *job);
/* Decode the groups of 32 both streams can take at once; returns the one
 * (0 or 1) that can take no more so (with the scalar kernels: 0, having
 * decoded nothing). */
int kvs_rans_streams_joint(kvs_rans_dec_stream *s[2]);
/* The stream's remaining symbols and its end's checks: with start, what
 * kvs_rans_decode returns for the job (the same symbols, the same refusal
 * and message). Start and finish alone decode one job with its warm. */
int kvs_rans_stream_finish(kvs_rans_dec_stream *s);

#endif /* KVSERDE_CODECS_RANS_H */
