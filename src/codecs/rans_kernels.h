/* rans_kernels.h - internal: the groups of 32 symbols of rans.c, scalar
 * (rans.c), AVX2 (rans_avx2.c) and AVX-512 (rans_avx512.c). All variants
 * read and write the same stream bit for bit.
 *
 * Encoding runs groups groups-1 down to 0 (symbols [32 g, 32 g + 32), last
 * lane first) on the states x[0..32), storing words downwards from *pp (the
 * 16 bytes below each word it keeps must be writable: the AVX2 kernel
 * stores a whole vector that ends at its words); sets *nocode when
 * a symbol has frequency 0 (the stream is then garbage). Both directions
 * bring the g-th line of each of warm's ranges into cache with the g-th
 * group they code (kvs_rans_warm_group). Decoding runs
 * groups from symbol 0 while a whole group and 64 stream bytes remain, and
 * returns the symbols it decoded. */
#ifndef KVSERDE_CODECS_RANS_KERNELS_H
#define KVSERDE_CODECS_RANS_KERNELS_H

#include "codecs/rans.h"

/* The encoder shifts a word out of state x before coding a symbol of
 * frequency f when x >= ((L >> scale) << 16) f = f << KVS_RANS_XMAX_SHIFT. */
#define KVS_RANS_XMAX_SHIFT (31 - KVS_RANS_SCALE_BITS)

/* The g-th line of each of warm's ranges (kvs_rans_warm), with the g-th
 * group a kernel codes or decodes. Always inlined: GCC 12 takes a
 * function of prefetches alone for one without effects and deletes its
 * calls before it would inline them. */
static inline __attribute__((always_inline)) void kvs_rans_warm_group(const kvs_rans_warm *warm,
                                                                      size_t g)
{
    size_t at = 64 * g;
    if (at < warm->read_len) __builtin_prefetch(warm->read + at, 0);
    if (at < warm->write_len) __builtin_prefetch(warm->write + at, 1);
}

void kvs_rans_enc_groups_scalar(const kvs_rans_enc_tables *e, const uint8_t *sym,
                                const uint8_t *ctx, size_t groups, uint32_t *x, uint8_t **pp,
                                uint32_t *nocode, const kvs_rans_warm *warm);
size_t kvs_rans_dec_groups_scalar(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t **pp,
                                  const uint8_t *end, const uint8_t *ctx, uint8_t *sym, size_t n,
                                  const kvs_rans_warm *warm);
/* Two streams' groups at once (kvs_rans_decode2): each run ends where
 * kvs_rans_dec_groups_* alone would have, with its states in x, its words
 * at p and the symbols it decoded in done. The scalar twin is the two
 * decodes one after the other. */
typedef struct kvs_rans_dec_run {
    const kvs_rans_dec_tables *d;
    uint32_t *x;
    const uint8_t *p, *end;
    const uint8_t *ctx;
    uint8_t *sym;
    size_t n;
    size_t done;
    kvs_rans_warm warm; /* from the line of the run's first group */
} kvs_rans_dec_run;
/* With the kernels in use: the groups both runs can take, together where
 * the set has a pair kernel, then each alone. */
void kvs_rans_dec_groups2(kvs_rans_dec_run run[2]);

/* A set of kernels: the groups above, and optionally a pair kernel (only
 * the groups both runs can take: done is the same count for both after it)
 * and the decoder's table fill (kvs_rans_dec_init's entries, d->slot only);
 * NULL where the set has none. */
typedef struct kvs_rans_kernels {
    void (*enc_groups)(const kvs_rans_enc_tables *e, const uint8_t *sym, const uint8_t *ctx,
                       size_t groups, uint32_t *x, uint8_t **pp, uint32_t *nocode,
                       const kvs_rans_warm *warm);
    size_t (*dec_groups)(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t **pp,
                         const uint8_t *end, const uint8_t *ctx, uint8_t *sym, size_t n,
                         const kvs_rans_warm *warm);
    void (*dec_joint)(kvs_rans_dec_run run[2]);
    void (*dec_fill)(kvs_rans_dec_tables *d, const kvs_rans_freqs *t, unsigned nctx);
} kvs_rans_kernels;

#if KVS_HAVE_X86
void kvs_rans_enc_groups_avx2(const kvs_rans_enc_tables *e, const uint8_t *sym,
                              const uint8_t *ctx, size_t groups, uint32_t *x, uint8_t **pp,
                              uint32_t *nocode, const kvs_rans_warm *warm);
size_t kvs_rans_dec_groups_avx2(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t **pp,
                                const uint8_t *end, const uint8_t *ctx, uint8_t *sym, size_t n,
                                const kvs_rans_warm *warm);
void kvs_rans_dec_fill_avx2(kvs_rans_dec_tables *d, const kvs_rans_freqs *t, unsigned nctx);
void kvs_rans_dec_joint_avx512(kvs_rans_dec_run run[2]);
void kvs_rans_enc_groups_avx512(const kvs_rans_enc_tables *e, const uint8_t *sym,
                                const uint8_t *ctx, size_t groups, uint32_t *x, uint8_t **pp,
                                uint32_t *nocode, const kvs_rans_warm *warm);
size_t kvs_rans_dec_groups_avx512(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t **pp,
                                  const uint8_t *end, const uint8_t *ctx, uint8_t *sym, size_t n,
                                  const kvs_rans_warm *warm);
void kvs_rans_dec_fill_avx512(kvs_rans_dec_tables *d, const kvs_rans_freqs *t, unsigned nctx);
#endif

/* The kernel sets, in the order of what they need of the CPU. */
#define KVS_RANS_SCALAR 0
#define KVS_RANS_AVX2 1
#define KVS_RANS_AVX512 2

/* The set in use: chosen once, the best this CPU runs (AVX-512 needs
 * KVS_CPU_AVX512, AVX2 KVS_CPU_AVX2) with KVSERDE_ISA "avx2" or "scalar"
 * as a cap, until kvs_rans_set_isa. */
int kvs_rans_isa(void);

/* Tests: use the set isa (KVS_RANS_*), or the best below it this CPU runs,
 * from now on; returns the set in use. */
int kvs_rans_set_isa(int isa);

/* Tests: the best set this CPU runs (on != 0) or the scalar one; returns
 * whether the AVX-512 set is in use (which the lossless stage's and the
 * coefficient coder's own AVX-512 kernels follow). */
int kvs_rans_set_simd(int on);

/* Tests: the AVX-512 decoder's form of its product (rans_avx512.c), 0
 * the paired vpmuludq, 1 vpmulld, -1 the one for this CPU's vendor (the
 * default); the same symbols either way. */
void kvs_rans_set_dec_mullo(int form);

/* Whether the AVX-512 set is in use (the CPU, KVSERDE_ISA,
 * kvs_rans_set_isa): the lossless stage and the coefficient coder use
 * their own AVX-512 kernels only then. */
int kvs_rans_avx512_in_use(void);

#endif /* KVSERDE_CODECS_RANS_KERNELS_H */
