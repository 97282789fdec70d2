/* rans_kernels.h - internal: the groups of 32 symbols of rans.c, scalar
 * (rans.c) and AVX-512 (rans_avx512.c). Both variants read and write the
 * same stream bit for bit.
 *
 * Encoding runs groups groups-1 down to 0 (symbols [32 g, 32 g + 32), last
 * lane first) on the states x[0..32), storing words downwards from *pp
 * (room for one more word than it keeps must lie below); sets *nocode when
 * a symbol has frequency 0 (the stream is then garbage). Decoding runs
 * groups from symbol 0 while a whole group and 64 stream bytes remain, and
 * returns the symbols it decoded. */
#ifndef KVSERDE_CODECS_RANS_KERNELS_H
#define KVSERDE_CODECS_RANS_KERNELS_H

#include "codecs/rans.h"

/* The encoder shifts a word out of state x before coding a symbol of
 * frequency f when x >= ((L >> scale) << 16) f = f << KVS_RANS_XMAX_SHIFT. */
#define KVS_RANS_XMAX_SHIFT (31 - KVS_RANS_SCALE_BITS)

/* The encoder's reciprocal of each frequency f (rans.c; with the shift in
 * an entry's info, q = x / f), filled by kvs_rans_enc_init. */
extern uint32_t kvs_rans_rcp_of[KVS_RANS_TOTAL + 1];

void kvs_rans_enc_groups_scalar(const kvs_rans_enc_tables *e, const uint8_t *sym,
                                const uint8_t *ctx, size_t groups, uint32_t *x, uint8_t **pp,
                                uint32_t *nocode);
size_t kvs_rans_dec_groups_scalar(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t **pp,
                                  const uint8_t *end, const uint8_t *ctx, uint8_t *sym, size_t n);
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
} kvs_rans_dec_run;
void kvs_rans_dec_groups2_scalar(kvs_rans_dec_run run[2]);
#if KVS_HAVE_X86
void kvs_rans_dec_groups2_avx512(kvs_rans_dec_run run[2]);
/* Only the groups both runs can take (the first part of groups2): done is
 * the same count for both after it. */
void kvs_rans_dec_joint_avx512(kvs_rans_dec_run run[2]);
void kvs_rans_enc_groups_avx512(const kvs_rans_enc_tables *e, const uint8_t *sym,
                                const uint8_t *ctx, size_t groups, uint32_t *x, uint8_t **pp,
                                uint32_t *nocode);
size_t kvs_rans_dec_groups_avx512(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t **pp,
                                  const uint8_t *end, const uint8_t *ctx, uint8_t *sym, size_t n);
/* kvs_rans_dec_init's tables of nctx contexts (d->slot only), the same
 * entries as its scalar loop. */
void kvs_rans_dec_fill_avx512(kvs_rans_dec_tables *d, const kvs_rans_freqs *t, unsigned nctx);
#endif

/* Tests: use the AVX-512 kernels (on != 0, where the CPU has them) or the
 * scalar ones from now on; returns whether AVX-512 is in use. */
int kvs_rans_set_simd(int on);

/* Whether the AVX-512 kernels are in use (the CPU, KVSERDE_ISA,
 * kvs_rans_set_simd): the lossless stage's row rebuild follows it. */
int kvs_rans_simd_in_use(void);

#endif /* KVSERDE_CODECS_RANS_KERNELS_H */
