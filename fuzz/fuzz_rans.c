/* fuzz_rans.c - the rANS coder (src/codecs/rans.c) alone: its decoder on
 * arbitrary streams, and encode + decode of arbitrary symbols.
 *
 * Input: byte 0 options, the rest the data.
 *   bits 0-1  contexts - 1 (1 to 4)
 *   bit 2     round-trip mode: the data are the symbols (symbol i's context
 *             i times an odd data byte, mod the contexts), with tables
 *             normalised from their counts; else decode mode: the data are
 *             table forms (one per context; a refused form is replaced by a
 *             fixed table), a u16 symbol count, then the stream (symbol i in
 *             context i mod the contexts)
 * Properties:
 *   - decode refuses (KVS_ECORRUPT and a message) or succeeds, never
 *     reading or writing out of bounds (ASan), with every kernel set this
 *     CPU runs (scalar, AVX2, AVX-512) agreeing on the outcome and the
 *     symbols;
 *   - a stream the decoder accepts re-encodes to exactly the same bytes
 *     (rANS decoding is the inverse of encoding, step by step);
 *   - round trip: the stream is within kvs_rans_bound, every kernel set
 *     writes the same bytes (the tables built with it in use, as the AVX2
 *     encoder has its own form of them), and it decodes to the symbols;
 *     every truncation is refused.
 */
#include <stdlib.h>
#include <string.h>

#include "codecs/rans.h"
#include "codecs/rans_kernels.h"
#include "fuzz_common.h"
#include "kvserde/error.h"

static kvs_rans_enc_tables g_enc;
static kvs_rans_dec_tables g_dec;

/* Encode n symbols with every kernel set (they must agree), each with
 * tables built while it is in use; returns the stream. */
static uint8_t *encode_all(const kvs_rans_freqs *t, unsigned nctx, const uint8_t *sym,
                           const uint8_t *ctx, size_t n, size_t *m)
{
    size_t cap = kvs_rans_bound(n);
    uint8_t *a = malloc(cap), *b = malloc(cap);
    kvs_rans_set_isa(KVS_RANS_SCALAR);
    kvs_rans_enc_init(&g_enc, t, nctx);
    int rc = kvs_rans_encode(&g_enc, sym, ctx, n, a, cap, m);
    FZ_ASSERT(rc == KVS_OK, "encode refused: %d", rc);
    FZ_ASSERT(*m <= cap, "stream of %zu bytes, bound %zu", *m, cap);
    for (int isa = KVS_RANS_AVX2; isa <= KVS_RANS_AVX512; isa++) {
        if (kvs_rans_set_isa(isa) != isa) continue;
        kvs_rans_enc_init(&g_enc, t, nctx);
        size_t mb = 0;
        rc = kvs_rans_encode(&g_enc, sym, ctx, n, b, cap, &mb);
        FZ_ASSERT(rc == KVS_OK, "encode refused (kernel set %d): %d", isa, rc);
        FZ_ASSERT(mb == *m && memcmp(a, b, *m) == 0, "kernel set %d's stream differs", isa);
    }
    free(b);
    return a;
}

/* Decode with every kernel set; they must agree with the scalar one. */
static int decode_all(const uint8_t *s, size_t len, const uint8_t *ctx, uint8_t *sym, size_t n)
{
    uint8_t *other = malloc(n ? n : 1);
    kvs_rans_set_isa(KVS_RANS_SCALAR);
    int ra = kvs_rans_decode(&g_dec, s, len, ctx, sym, n, "fuzz");
    if (ra) FZ_ASSERT_REFUSAL(ra, "rans decode (scalar)");
    for (int isa = KVS_RANS_AVX2; isa <= KVS_RANS_AVX512; isa++) {
        if (kvs_rans_set_isa(isa) != isa) continue;
        int rb = kvs_rans_decode(&g_dec, s, len, ctx, other, n, "fuzz");
        if (rb) FZ_ASSERT_REFUSAL(rb, "rans decode");
        FZ_ASSERT(ra == rb, "scalar %d, kernel set %d %d", ra, isa, rb);
        FZ_ASSERT(ra || n == 0 || memcmp(sym, other, n) == 0, "kernel set %d's symbols differ",
                  isa);
    }
    free(other);
    return ra;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    unsigned nctx = (data[0] & 3) + 1;
    const uint8_t *d = data + 1;
    size_t n = size - 1;
    kvs_rans_freqs t[KVS_RANS_MAX_CTX];
    if (data[0] & 4) {
        uint8_t *ctx = malloc(n ? n : 1), *back = malloc(n ? n : 1);
        uint32_t c[KVS_RANS_MAX_CTX][256];
        memset(c, 0, sizeof c);
        for (size_t i = 0; i < n; i++) {
            ctx[i] = (uint8_t)((i * (d[i / 2] | 1)) % nctx);
            c[ctx[i]][d[i]]++;
        }
        for (unsigned j = 0; j < nctx; j++) kvs_rans_normalize(c[j], &t[j]);
        kvs_rans_dec_init(&g_dec, t, nctx);
        size_t m = 0;
        uint8_t *s = encode_all(t, nctx, d, ctx, n, &m);
        FZ_ASSERT(decode_all(s, m, ctx, back, n) == KVS_OK, "own stream refused");
        FZ_ASSERT(n == 0 || memcmp(back, d, n) == 0, "round trip differs");
        for (size_t k = 0; k < m; k += 1 + k / 4)
            FZ_ASSERT(decode_all(s, k, ctx, back, n) != KVS_OK, "truncation to %zu accepted",
                      k);
        free(s);
        free(ctx);
        free(back);
        return 0;
    }
    size_t at = 0;
    for (unsigned j = 0; j < nctx; j++) {
        size_t used = 0;
        if (kvs_rans_freqs_read(d + at, n - at, "fuzz", &t[j], &used) == KVS_OK) {
            at += used;
        } else {
            FZ_ASSERT_REFUSAL(KVS_ECORRUPT, "rans table");
            memset(&t[j], 0, sizeof t[j]);
            t[j].f[j] = KVS_RANS_TOTAL / 2, t[j].f[200] = KVS_RANS_TOTAL / 2;
        }
    }
    if (n - at < 2) return 0;
    size_t count = (size_t)d[at] | (size_t)d[at + 1] << 8;
    at += 2;
    kvs_rans_dec_init(&g_dec, t, nctx);
    uint8_t *ctx = malloc(count ? count : 1), *sym = malloc(count ? count : 1);
    for (size_t i = 0; i < count; i++) ctx[i] = (uint8_t)(i % nctx);
    if (decode_all(d + at, n - at, nctx > 1 ? ctx : NULL, sym, count) == KVS_OK) {
        size_t m = 0;
        uint8_t *s = encode_all(t, nctx, sym, nctx > 1 ? ctx : NULL, count, &m);
        FZ_ASSERT(m == n - at && memcmp(s, d + at, m) == 0,
                  "an accepted stream of %zu bytes re-encodes to %zu other bytes", n - at, m);
        free(s);
    }
    free(ctx);
    free(sym);
    return 0;
}
