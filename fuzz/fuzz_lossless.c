/* fuzz_lossless.c - the lossless stage (src/frame/stage_lossless.c) alone:
 * its decoder on arbitrary payloads, and its encoder on arbitrary data.
 *
 * Input: byte 0 options, the rest the data (an exact-size heap block).
 *   bits 0-1  the element size the typed stage announces in kvs_stage_ctx:
 *             0 unknown, 1, 2, 4
 *   bit 2     encode mode: the data is the typed stage's output; encode it
 *             (level from bits 3-4: 1, -7, 3, 19 only for data <= 4 KiB;
 *             bit 5: the rANS coder instead, at level 1 when bits 3-4
 *             are 0, level 2 (row references) when 1, else level 3
 *             (and coded signs); the channel count
 *             from bits 6-7: 1, 3, 256, 4096), then decode that
 *   else      decode mode: the data is a stage payload
 * Properties:
 *   - decoded_size and decode refuse (a KVS_E* code and a message) or
 *     succeed; decode never accepts what decoded_size refuses and writes
 *     exactly the size decoded_size announced;
 *   - a refused decode leaves nothing read past the input (ASan) and a
 *     decoded payload re-encodes (same element size) to one that decodes to
 *     the same bytes;
 *   - where the stage offers to decode straight into the destination
 *     (transform_direct_ok), that decode refuses exactly when decode does,
 *     with the same code and message, leaving its output (0xA5 bytes)
 *     untouched, and otherwise writes decode's bytes; the check folded
 *     into it is given the input's CRC-32C exactly once;
 *   - encode: the output is at most bytes_bound(n), and at most its block
 *     headers over n; decoding it gives the data back bit for bit; every
 *     truncation of it is refused;
 *   - the rANS coder on data shorter than TILED: the data tiled to TILED
 *     bytes also decodes back bit for bit (blocks of 16 rows or more take
 *     the encoder's sampled histograms).
 */
#include "frame/stage.h"
#include "util/crc32c.h"
#include "fuzz_common.h"
#include "kvserde/error.h"
#include <jansson.h>

#define MAX_OUT ((size_t)4 << 20)

static kvs_stage *g_stage[7]; /* levels 1, -7, 3, 19; the rANS coder at 1, 2 and 3 */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static const int levels[4] = {1, -7, 3, 19};
    for (int i = 0; i < 4; i++) {
        json_t *cfg = json_pack("{s:s,s:i}", "type", "lossless", "level", levels[i]);
        if (cfg == NULL || kvs_stage_lossless_type.create(cfg, &g_stage[i]) != KVS_OK) abort();
        json_decref(cfg);
    }
    for (int i = 4; i < 7; i++) {
        json_t *cfg = json_pack("{s:s,s:s,s:i}", "type", "lossless", "coder", "rans", "level",
                                i - 3);
        if (cfg == NULL || kvs_stage_lossless_type.create(cfg, &g_stage[i]) != KVS_OK) abort();
        json_decref(cfg);
    }
    return 0;
}

static const kvs_stage_type *T = &kvs_stage_lossless_type;
static const uint8_t PARAMS[2] = {1, 0};

/* Decode in[0..n): KVS_OK with *out (malloc'd, *m bytes) or a refusal. */
static int decode(const uint8_t *in, size_t n, unsigned elem, uint8_t **out, size_t *m)
{
    kvs_stage_ctx ctx = {NULL, NULL, 0, NULL, elem, 1, NULL};
    *out = NULL;
    int rc = T->transform_decoded_size(PARAMS, 2, in, n, m);
    if (rc) {
        FZ_ASSERT_REFUSAL(rc, "lossless decoded_size");
        return rc;
    }
    if (*m > MAX_OUT) return KVS_ENOMEM;
    *out = malloc(*m ? *m : 1);
    size_t got = 0;
    rc = T->transform_decode(PARAMS, 2, &ctx, in, n, *out, *m, &got);
    if (rc) {
        FZ_ASSERT_REFUSAL(rc, "lossless decode");
        free(*out);
        *out = NULL;
        return rc;
    }
    FZ_ASSERT(got == *m, "decode wrote %zu bytes, announced %zu", got, *m);
    return KVS_OK;
}

/* The check folded into the direct decode: it must be given the input's
 * CRC-32C, once, before the stage writes or refuses. */
typedef struct fz_check {
    uint32_t want;
    int calls;
} fz_check;

static int fz_accept(void *arg, uint32_t crc)
{
    fz_check *c = arg;
    c->calls++;
    FZ_ASSERT(crc == c->want, "folded check given CRC %08x, the input's is %08x", crc, c->want);
    return KVS_OK;
}

/* decode(), and where the stage offers it the decode into the destination:
 * the same refusal before any byte of it, or the same bytes. */
static int decode_both(const uint8_t *in, size_t n, unsigned elem, uint8_t **out, size_t *m)
{
    int rc = decode(in, n, elem, out, m);
    if (!T->transform_direct_ok(PARAMS, 2, in, n)) return rc;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", rc ? kvs_last_error() : "");
    size_t m2 = 0;
    FZ_ASSERT(T->transform_decoded_size(PARAMS, 2, in, n, &m2) == KVS_OK,
              "direct_ok on a payload decoded_size refuses");
    if (m2 > MAX_OUT) return rc;
    uint8_t *dst = malloc(m2 ? m2 : 1);
    memset(dst, 0xA5, m2);
    kvs_stage_ctx ctx = {NULL, NULL, 0, NULL, elem, 1, NULL};
    size_t got = 0;
    fz_check chk = {kvs_crc32c(0, in, n), 0};
    int rc2 = T->transform_decode_direct(PARAMS, 2, &ctx, in, n, dst, m2, &got, fz_accept, &chk);
    FZ_ASSERT(chk.calls == 1, "folded check called %d times", chk.calls);
    FZ_ASSERT(rc2 == rc, "direct decode returned %d, decode %d", rc2, rc);
    if (rc) {
        FZ_ASSERT(strcmp(msg, kvs_last_error()) == 0, "direct decode refused with '%s', decode '%s'",
                  kvs_last_error(), msg);
        for (size_t i = 0; i < m2; i++)
            FZ_ASSERT(dst[i] == 0xA5, "refused direct decode wrote byte %zu", i);
    } else {
        FZ_ASSERT(got == *m && memcmp(dst, *out, *m) == 0, "direct decode differs from decode");
    }
    free(dst);
    return rc;
}

static uint8_t *encode(const kvs_stage *st, const uint8_t *in, size_t n, unsigned elem,
                       uint64_t channels, size_t *m)
{
    kvs_stage_ctx ctx = {NULL, NULL, 0, NULL, elem, channels, NULL};
    size_t cap = T->bytes_bound(st, n);
    uint8_t *out = malloc(cap);
    int rc = T->transform_encode(st, PARAMS, 2, &ctx, in, n, out, cap, m);
    FZ_ASSERT(rc == KVS_OK, "encode of %zu bytes refused: %s", n, kvs_last_error());
    FZ_ASSERT(*m <= cap, "encode wrote %zu bytes, bound %zu", *m, cap);
    return out;
}

static void roundtrip(const kvs_stage *st, const uint8_t *in, size_t n, unsigned elem,
                      uint64_t channels)
{
    size_t m, back_n;
    uint8_t *enc = encode(st, in, n, elem, channels, &m);
    unsigned s = elem == 1 || elem == 2 || elem == 4 ? elem : 1;
    size_t blocks = (n / s + 65535) / 65536;
    if (enc[0] >= 2)
        FZ_ASSERT(m <= n + 24 + 5 * blocks, "%zu bytes grew to %zu (version %u)", n, m, enc[0]);
    else
        FZ_ASSERT(m <= n + 16 + (4 + 4 * s) * blocks, "%zu bytes grew to %zu", n, m);
    uint8_t *back;
    int rc = decode_both(enc, m, elem, &back, &back_n);
    FZ_ASSERT(rc == KVS_OK, "own output refused: %s", kvs_last_error());
    FZ_ASSERT(back_n == n && (n == 0 || memcmp(back, in, n) == 0), "round trip differs");
    free(back);
    for (size_t k = 0; k < m; k += 1 + k / 8) {
        uint8_t *cut = malloc(k ? k : 1);
        memcpy(cut, enc, k);
        uint8_t *o;
        size_t on;
        FZ_ASSERT(decode(cut, k, elem, &o, &on) != KVS_OK, "truncation to %zu of %zu accepted",
                  k, m);
        free(cut);
    }
    free(enc);
}

/* The rANS encoder counts a sample of a block's rows once it has 16 rows
 * (runs of 256 elements without channels) or more (lossless_exponent.c,
 * exponent_hists), more than most inputs hold: shorter ones are also
 * tiled to TILED bytes, copy j's even bytes (a 16-bit element's low byte)
 * XORed with j, and round-tripped (no truncations: each is a decode). */
#define TILED 12288

static void tiled_roundtrip(const kvs_stage *st, const uint8_t *in, size_t n, unsigned elem,
                            uint64_t channels)
{
    if (n == 0 || n >= TILED) return;
    uint8_t *t = malloc(TILED), *back;
    for (size_t i = 0; i < TILED; i++) t[i] = (uint8_t)(in[i % n] ^ (i % 2 ? 0 : i / n));
    size_t m, back_n;
    uint8_t *enc = encode(st, t, TILED, elem, channels, &m);
    FZ_ASSERT(decode_both(enc, m, elem, &back, &back_n) == KVS_OK,
              "own output of %d tiled bytes refused: %s", TILED, kvs_last_error());
    FZ_ASSERT(back_n == TILED && memcmp(back, t, TILED) == 0, "tiled round trip differs");
    free(back);
    free(enc);
    free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    static const unsigned elems[4] = {0, 1, 2, 4};
    unsigned opt = data[0], elem = elems[opt & 3];
    size_t n = size - 1;
    uint8_t *in = malloc(n ? n : 1);
    memcpy(in, data + 1, n);
    if (opt & 4) {
        static const uint64_t channels[4] = {1, 3, 256, 4096};
        int li = (opt >> 3) & 3;
        if (li == 3 && n > 4096) li = 0;
        if (opt & 32) li = 4 + ((opt >> 3 & 3) < 2 ? (opt >> 3 & 3) : 2);
        roundtrip(g_stage[li], in, n, elem, channels[opt >> 6]);
        if (opt & 32) tiled_roundtrip(g_stage[li], in, n, elem, channels[opt >> 6]);
    } else {
        uint8_t *out;
        size_t m;
        if (decode_both(in, n, elem, &out, &m) == KVS_OK) {
            roundtrip(g_stage[in[0] >= 2 && in[0] <= 4 ? in[0] + 2 : 0], out, m, elem, 256);
            free(out);
        }
    }
    free(in);
    return 0;
}
