/* test_lossless.c - the "lossless" stage (src/frame/stage_lossless.c):
 * bit-exact round trips through the pipeline (bfloat16, float16, float32,
 * fp8 codes, uint8) on adversarial inputs (all equal, random bytes, NaN and
 * inf patterns, one element, sizes that are no multiple of a block), the
 * expansion bound, the stage's own refusals of damaged and truncated
 * payloads, the frame's refusal of every damaged block, a blob split across
 * an async processor's two workers (the same bytes and values as without),
 * all of it under both coders ("zstd", "rans"), a version-1 frame written
 * before the rANS coder, the version-2 payload's exact bytes and refusals,
 * and every file of the real KV cache (../shared/kvdata/, skipped with a message when absent). */
#include <dirent.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "codecs/rans_kernels.h"
#include "frame/lossless_flips.h"
#include "frame/lossless_mantissas.h"
#include "frame/lossless_refs.h"
#include "frame/lossless_rows.h"
#include "frame/lossless_split.h"
#include "frame/pipeline_internal.h"
#include "frame/stage.h"
#include "util/cpu_features.h"
#include "util/crc32c.h"
#include "kvs_test.h"
#include "kvs_test_objs.h"
#include "kvs_test_proc.h"
#include "kvserde/memobj.h"
#include "kvserde/pipeline.h"
#include "kvserde/processor.h"
#include "kvserde/registry.h"
#include "kvserde/serde.h"

#define BYTES_LL "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\"}]}"
#define RANS_LL                                                                           \
    "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\",\"coder\":" \
    "\"rans\"}]}"
#define FP8_LL "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"lossless\"}]}"
#define RANS2_LL                                                                          \
    "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","        \
    "\"coder\":\"rans\",\"level\":2}]}"
#define RANS3_LL                                                                          \
    "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","        \
    "\"coder\":\"rans\",\"level\":3}]}"
#define BLOCK 65536u

static kvs_memobj *new_obj(const kvs_layout *l)
{
    kvs_memobj *o = NULL;
    if (kvs_memobj_alloc(l, KVS_FMT_KV_2LTD, &o) != KVS_OK) abort();
    return o;
}

static kvs_layout flat(uint64_t n, kvs_dtype dt)
{
    kvs_layout l;
    if (kvs_layout_flat(&l, n, dt) != KVS_OK) abort();
    return l;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* Serialize src; returns the blob (malloc'd) and its length, NULL on error. */
static uint8_t *ser(kvs_serde_pair *p, const kvs_memobj *src, size_t *len)
{
    size_t est;
    if (kvs_estimate_serialized_size(p->serializer, &src->layout, &est) != KVS_OK) return NULL;
    kvs_layout bl = flat(est, KVS_DTYPE_UINT8);
    kvs_memobj *dst = new_obj(&bl);
    uint8_t *out = NULL;
    if (kvs_serialize(p->serializer, src, dst, NULL, len) == KVS_OK) {
        out = malloc(*len + 1);
        memcpy(out, dst->data, *len);
    } else {
        fprintf(stderr, "serialize: %s\n", kvs_last_error());
    }
    kvs_memobj_free(dst);
    return out;
}

static int deser(kvs_serde_pair *p, const uint8_t *data, size_t len, kvs_memobj *dst)
{
    kvs_memobj src = {(void *)data, len, len, {0}, KVS_FMT_UNDEFINED, 0};
    if (kvs_layout_flat(&src.layout, len, KVS_DTYPE_UINT8) != KVS_OK) abort();
    return kvs_deserialize(p->deserializer, &src, dst, NULL);
}

/* Round trip src through json; 1 if bit-exact. *stored = blob bytes. */
static int roundtrip(const char *json, const kvs_memobj *src, size_t *stored)
{
    kvs_serde_pair p = kvs_test_serde_pair(json);
    size_t len = 0;
    uint8_t *b = ser(&p, src, &len);
    int ok = 0;
    if (b) {
        kvs_memobj *back = new_obj(&src->layout);
        int rc = deser(&p, b, len, back);
        if (rc) fprintf(stderr, "deserialize: %s\n", kvs_last_error());
        size_t n = (size_t)kvs_layout_nbytes(&src->layout);
        ok = rc == KVS_OK && memcmp(back->data, src->data, n) == 0;
        kvs_memobj_free(back);
    }
    if (stored) *stored = len;
    free(b);
    kvs_serde_pair_destroy(&p);
    return ok;
}

/* fp8 + lossless must give exactly what fp8 + crc32c gives. */
static int fp8_same(const kvs_memobj *src)
{
    kvs_serde_pair a = kvs_test_serde_pair(FP8_LL);
    kvs_serde_pair c = kvs_test_serde_pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"}]}");
    size_t la, lc;
    uint8_t *ba = ser(&a, src, &la), *bc = ser(&c, src, &lc);
    kvs_memobj *x = new_obj(&src->layout), *y = new_obj(&src->layout);
    int ok = ba && bc && deser(&a, ba, la, x) == KVS_OK && deser(&c, bc, lc, y) == KVS_OK &&
             memcmp(x->data, y->data, (size_t)kvs_layout_nbytes(&src->layout)) == 0;
    kvs_memobj_free(x);
    kvs_memobj_free(y);
    free(ba);
    free(bc);
    kvs_serde_pair_destroy(&a);
    kvs_serde_pair_destroy(&c);
    return ok;
}

enum fill { ALL_EQUAL, RANDOM, SPECIALS, SMOOTH };

static void fill(kvs_memobj *o, enum fill f, uint64_t seed)
{
    uint8_t *p = o->data;
    size_t n = (size_t)kvs_layout_nbytes(&o->layout);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        switch (f) {
        case ALL_EQUAL: p[i] = (uint8_t)(0x3F + (i & 1)); break;
        case RANDOM: p[i] = (uint8_t)lcg(&s); break;
        case SPECIALS: {
            /* +-inf, NaNs (quiet, signalling, payloads), +-0, denormals,
             * for every dtype's byte layout */
            static const uint8_t pat[] = {0x80, 0x7F, 0x80, 0xFF, 0xC0, 0x7F, 0x01, 0x7F,
                                          0x00, 0x00, 0x00, 0x80, 0x01, 0x00, 0xFF, 0xFF,
                                          0x00, 0x7C, 0x00, 0xFC, 0x00, 0x7E, 0x7F, 0x80};
            p[i] = (i / 24) % 3 == 2 ? (uint8_t)lcg(&s) : pat[i % sizeof pat];
            break;
        }
        case SMOOTH: {
            /* bfloat16-like: small exponents, random mantissas */
            if (i & 1) p[i] = (uint8_t)(0x3C + (lcg(&s) % 5) + ((lcg(&s) & 1) << 7));
            else p[i] = (uint8_t)lcg(&s);
            break;
        }
        }
    }
}

enum { ROWS_COPIED = SMOOTH + 1 };

/* SMOOTH, then each row from the second on a copy of a random earlier row
 * with about half of its elements changed (rows of c bfloat16). */
static void fill_rows(kvs_memobj *o, uint64_t c, uint64_t seed)
{
    fill(o, SMOOTH, seed);
    uint16_t *v = o->data;
    size_t n = (size_t)kvs_layout_nbytes(&o->layout) / 2;
    uint64_t s = seed;
    for (size_t r = 1; r * c < n; r++) {
        size_t from = (size_t)(lcg(&s) % r);
        for (size_t j = 0; j < c && r * c + j < n; j++)
            if (lcg(&s) & 1) v[r * c + j] = v[from * c + j];
    }
}

enum { SIGNS_KEPT = ROWS_COPIED + 1 };

/* SMOOTH, then the sign of each element of rows of c bfloat16 as K after
 * RoPE has them: three channels in four keep their sign from row to row,
 * flipping it once in 64 rows, the fourth has random signs. */
static void fill_signs(kvs_memobj *o, uint64_t c, uint64_t seed)
{
    fill(o, SMOOTH, seed);
    uint16_t *v = o->data;
    size_t n = (size_t)kvs_layout_nbytes(&o->layout) / 2;
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        unsigned sign = i < c ? (unsigned)lcg(&s) & 1 : (unsigned)(v[i - c] >> 15);
        if (i % c % 4 == 3) sign = (unsigned)lcg(&s) & 1;
        else if (lcg(&s) % 64 == 0) sign ^= 1;
        v[i] = (uint16_t)((v[i] & 0x7FFF) | sign << 15);
    }
}

enum { ROWS_HALVES = SIGNS_KEPT + 1 };

/* SMOOTH, then every fourth row from row 11 on the first half of one of
 * the rows 5 and 7 before it and the second half of the other (which
 * first, by the row): two candidates found by the same number of samples
 * and, mostly, with the same count, so the reference names the one whose
 * first sample comes first. */
static void fill_halves(kvs_memobj *o, uint64_t c, uint64_t seed)
{
    fill(o, SMOOTH, seed);
    uint16_t *v = o->data;
    size_t n = (size_t)kvs_layout_nbytes(&o->layout) / 2;
    for (size_t r = 11; (r + 1) * c <= n; r += 4) {
        size_t a = r % 8 == 3 ? r - 7 : r - 5, b = r % 8 == 3 ? r - 5 : r - 7;
        for (size_t j = 0; j < c; j++) v[r * c + j] = v[(j < c / 2 ? a : b) * c + j];
    }
}

/* A bfloat16 object of shape [rows, channels] under fill f of enum fill,
 * ROWS_COPIED, SIGNS_KEPT or ROWS_HALVES. */
static kvs_memobj *filled_obj(const int64_t shape[2], int f, uint64_t seed)
{
    kvs_layout l = {0};
    if (kvs_layout_add_group(&l, 2, shape, KVS_DTYPE_BFLOAT16) != KVS_OK) abort();
    kvs_memobj *o = new_obj(&l);
    uint64_t c = (uint64_t)shape[1];
    if (f == ROWS_COPIED) fill_rows(o, c, seed);
    else if (f == SIGNS_KEPT) fill_signs(o, c, seed);
    else if (f == ROWS_HALVES) fill_halves(o, c, seed);
    else fill(o, (enum fill)f, seed);
    return o;
}

/* ---------------------------------------------------------------------
 * Round trips
 * ------------------------------------------------------------------ */

static void test_adversarial_roundtrips(void)
{
    static const kvs_dtype dts[] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16, KVS_DTYPE_FLOAT32,
                                    KVS_DTYPE_UINT8, KVS_DTYPE_FLOAT8_E4M3FN};
    static const uint64_t sizes[] = {0, 1, 2, 3, 63, 64, 65, 4095, BLOCK - 1, BLOCK, BLOCK + 1,
                                     2 * BLOCK + 7, 3 * BLOCK - 1};
    for (int coder = 0; coder < 2; coder++)
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
            for (int f = ALL_EQUAL; f <= SMOOTH; f++) {
                kvs_layout l = flat(sizes[z], dts[d]);
                kvs_memobj *o = new_obj(&l);
                fill(o, (enum fill)f, sizes[z] * 31 + (uint64_t)f);
                size_t stored;
                int ok = roundtrip(coder ? RANS_LL : BYTES_LL, o, &stored);
                if (!ok)
                    fprintf(stderr, "%s: dtype %s, %llu elements, fill %d\n",
                            coder ? "rans" : "zstd", kvs_dtype_name(dts[d]),
                            (unsigned long long)sizes[z], f);
                CHECK(ok);
                /* never more than its block headers: 16 + (4 + 4 s) per block
                 * (the rANS coder's version 2: 24 + 5 per block), plus the
                 * frame (header <= 64 bytes here, crc32c 4) */
                size_t nb = (size_t)kvs_layout_nbytes(&l);
                size_t s = kvs_dtype_size(dts[d]);
                size_t blocks = (size_t)((sizes[z] + BLOCK - 1) / BLOCK);
                if (coder && s == 2)
                    CHECK(stored <= 64 + 4 + nb + 24 + 5 * blocks);
                else
                    CHECK(stored <= 64 + 4 + nb + 16 + (4 + 4 * s) * blocks);
                /* all equal: zstd's matches; rANS codes the exponent in ~0 bits */
                if (f == ALL_EQUAL && sizes[z] >= BLOCK)
                    CHECK(stored < (coder && s == 2 ? nb / 2 + nb / 50 : nb / 20));
                if (coder && s == 2 && f == RANDOM && sizes[z] >= BLOCK)
                    CHECK(stored <= 64 + 4 + nb + 24 + 5 * blocks); /* stored raw */
                kvs_memobj_free(o);
            }
}

static void test_shapes_and_fp8(void)
{
    /* a KV layout: channel count 256, two groups with different dtypes */
    kvs_layout l = {0};
    const int64_t dims[4] = {2, 3, 37, 256};
    REQUIRE(kvs_layout_add_group(&l, 4, dims, KVS_DTYPE_BFLOAT16) == KVS_OK);
    kvs_memobj *o = new_obj(&l);
    fill(o, SMOOTH, 5);
    size_t stored;
    CHECK(roundtrip(BYTES_LL, o, &stored));
    CHECK(stored < kvs_layout_nbytes(&l) * 3 / 4); /* the exponent plane compresses */
    CHECK(roundtrip(RANS_LL, o, &stored));
    CHECK(stored < kvs_layout_nbytes(&l) * 3 / 4);
    CHECK(fp8_same(o));
    kvs_memobj_free(o);

    kvs_layout m = {0};
    const int64_t d2[2] = {5, 7};
    REQUIRE(kvs_layout_add_group(&m, 2, d2, KVS_DTYPE_BFLOAT16) == KVS_OK);
    REQUIRE(kvs_layout_add_group(&m, 2, d2, KVS_DTYPE_FLOAT32) == KVS_OK);
    o = new_obj(&m);
    fill(o, RANDOM, 9);
    CHECK(roundtrip(BYTES_LL, o, NULL)); /* mixed sizes: one-byte elements */
    CHECK(roundtrip(RANS_LL, o, NULL));  /* ... so version 1 under the rANS coder */
    kvs_memobj_free(o);

    /* levels */
    kvs_layout f = flat(3 * BLOCK + 5, KVS_DTYPE_BFLOAT16);
    o = new_obj(&f);
    fill(o, SMOOTH, 11);
    CHECK(roundtrip("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":"
                    "\"lossless\",\"level\":-7},{\"type\":\"xxh3\"}]}",
                    o, NULL));
    CHECK(roundtrip("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":"
                    "\"lossless\",\"level\":9}]}",
                    o, NULL));
    kvs_memobj_free(o);
}

static void test_config_refused(void)
{
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","
         "\"level\":20}]}",
         "pipeline: stage 1: lossless: \"level\" must be an integer from -7 to 19 other than 0 "
         "(zstd's level; for the rans coder 2 and up add row references, 3 and up coded "
         "signs; default 1), got an out-of-range integer"},
        {"{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","
         "\"level\":\"max\"}]}",
         "pipeline: stage 1: lossless: \"level\" must be an integer from -7 to 19 other than 0 "
         "(zstd's level; for the rans coder 2 and up add row references, 3 and up coded "
         "signs; default 1), got string"},
        {"{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","
         "\"coder\":\"lz4\"}]}",
         "pipeline: stage 1: lossless: \"coder\" must be \"zstd\" (default) or \"rans\", got "
         "\"lz4\""},
        {"{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","
         "\"coder\":1}]}",
         "pipeline: stage 1: lossless: \"coder\" must be \"zstd\" (default) or \"rans\", got "
         "integer"},
        {"{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"crc32c\"},"
         "{\"type\":\"lossless\"}]}",
         "pipeline: stage 2 'lossless' rewrites the bytes after the checksum at stage 1 "
         "'crc32c'; put it before the checksum and the encryption"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvs_serde_pair p;
        int rc = kvs_serde_create_pair(cases[i].json, &p);
        CHECK(rc == KVS_EINVAL);
        if (rc == KVS_EINVAL && strcmp(kvs_last_error(), cases[i].msg) != 0)
            KVS_FAIL_("got \"%s\"\n expected \"%s\"", kvs_last_error(), cases[i].msg);
    }
}

/* ---------------------------------------------------------------------
 * The stage alone: damaged and truncated payloads
 * ------------------------------------------------------------------ */

static int stage_decode(const uint8_t *in, size_t n, unsigned elem, uint8_t *out, size_t cap,
                        size_t *got)
{
    const kvs_stage_type *t = &kvs_stage_lossless_type;
    static const uint8_t params[2] = {1, 0};
    kvs_stage_ctx ctx = {NULL, NULL, 0, NULL, elem, 1, NULL};
    size_t m;
    int rc = t->transform_decoded_size(params, 2, in, n, &m);
    if (rc) return rc;
    if (m > cap) return KVS_ENOSPC;
    return t->transform_decode(params, 2, &ctx, in, n, out, cap, got);
}

static void test_stage_refusals(void)
{
    json_t *cfg = json_pack("{s:s}", "type", "lossless");
    kvs_stage *st;
    REQUIRE(kvs_stage_lossless_type.create(cfg, &st) == KVS_OK);
    json_decref(cfg);
    size_t n = 2 * (2 * BLOCK + 100) + 1; /* bf16 with a one-byte tail */
    uint8_t *in = malloc(n), *back = malloc(n);
    size_t cap = kvs_stage_lossless_type.bytes_bound(st, n);
    uint8_t *enc = malloc(cap);
    uint64_t s = 7;
    for (size_t i = 0; i < n; i++)
        in[i] = (uint8_t)(i & 1 ? 0x3C + lcg(&s) % 4 : lcg(&s));
    memset(in + 1000, 0, 3000); /* a run for zstd's matches */
    kvs_stage_ctx ctx = {NULL, NULL, 0, NULL, 2, 256, NULL};
    size_t m = 0, got = 0;
    REQUIRE(kvs_stage_lossless_type.transform_encode(st, NULL, 0, &ctx, in, n, enc, cap, &m) ==
            KVS_OK);
    CHECK(m < n * 3 / 4);
    CHECK(stage_decode(enc, m, 2, back, n, &got) == KVS_OK && got == n &&
          memcmp(in, back, n) == 0);
    /* another element size than the typed stage's */
    CHECK(stage_decode(enc, m, 4, back, n, &got) == KVS_ECORRUPT);
    /* every truncation is refused */
    for (size_t k = 0; k < m; k += (k < 64 ? 1 : 997))
        CHECK(stage_decode(enc, k, 2, back, n, &got) != KVS_OK);
    CHECK(stage_decode(enc, m - 1, 2, back, n, &got) != KVS_OK);
    /* damage in the headers and the block table is refused by the stage */
    for (size_t k = 0; k < 16 + 12 + 4; k++) {
        for (int bit = 0; bit < 8; bit++) {
            enc[k] ^= (uint8_t)(1u << bit);
            int rc = stage_decode(enc, m, 2, back, n, &got);
            /* the block-element count may still decode the same planes only
             * for a damaged reserved bit; every change here is refused */
            if (rc == KVS_OK) KVS_FAIL_("byte %zu bit %d accepted", k, bit);
            enc[k] ^= (uint8_t)(1u << bit);
        }
    }
    /* damage inside a zstd plane is refused or changes the output, which
     * the frame's checksum refuses (test_frame_damage) */
    free(in);
    free(back);
    free(enc);
    kvs_stage_lossless_type.destroy(st);
}

/* Through the frame: every damaged byte of the payload is refused. */
/* rows: [513, 256] whose rows copy earlier rows in part (1: the rANS
 * coder's row references at level 2) or keep their signs (2: its coded
 * signs at level 3), else 2 blocks and 3 elements, flat. */
static void frame_damage(const char *json, int rows)
{
    kvs_layout l = flat(2 * BLOCK + 3, KVS_DTYPE_BFLOAT16);
    const int64_t dims[2] = {2 * BLOCK / 256 + 1, 256};
    if (rows) {
        l = (kvs_layout){0};
        REQUIRE(kvs_layout_add_group(&l, 2, dims, KVS_DTYPE_BFLOAT16) == KVS_OK);
    }
    kvs_memobj *o = new_obj(&l);
    if (rows == 1) fill_rows(o, 256, 3);
    else if (rows == 2) fill_signs(o, 256, 3);
    else fill(o, SMOOTH, 3);
    kvs_serde_pair p = kvs_test_serde_pair(json);
    size_t len;
    uint8_t *b = ser(&p, o, &len);
    REQUIRE(b != NULL);
    kvs_memobj *back = new_obj(&l);
    size_t tried = 0;
    for (size_t k = 0; k < len; k += 1 + k / 64) {
        b[k] ^= 0x10;
        int rc = deser(&p, b, len, back);
        if (rc == KVS_OK) KVS_FAIL_("damaged byte %zu of %zu accepted", k, len);
        b[k] ^= 0x10;
        tried++;
    }
    CHECK(tried > 100);
    for (size_t k = 0; k < len; k += 1 + k / 16) CHECK(deser(&p, b, k, back) != KVS_OK);
    CHECK(deser(&p, b, len, back) == KVS_OK);
    free(b);
    kvs_memobj_free(back);
    kvs_memobj_free(o);
    kvs_serde_pair_destroy(&p);
}

static void test_frame_damage(void)
{
    frame_damage(BYTES_LL, 0);
    frame_damage(RANS_LL, 0);
    frame_damage(RANS2_LL, 1);
    frame_damage(RANS3_LL, 2);
}

/* ---------------------------------------------------------------------
 * Old frames: a version-1 blob written by main before the rANS coder
 * (commit acc97f9) still decodes, under either coder's configuration
 * ------------------------------------------------------------------ */

static const uint8_t v1_blob[148] = {
    0x4B, 0x56, 0x53, 0x46, 0x01, 0x00, 0x40, 0x00, 0x54, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x04, 0x01, 0x03, 0x00, 0x03, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
    0x00, 0x00, 0x50, 0x00, 0x02, 0x00, 0x01, 0x00, 0x40, 0x00, 0x00, 0x00,
    0x84, 0xC5, 0xC7, 0x35, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
    0xF0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3C, 0x00, 0x00, 0x00,
    0x1F, 0x00, 0x00, 0x80, 0x28, 0xB5, 0x2F, 0xFD, 0x20, 0x78, 0xB5, 0x00,
    0x00, 0x78, 0x00, 0x01, 0x02, 0x80, 0x81, 0x02, 0x00, 0x01, 0x82, 0x80,
    0x01, 0x02, 0x00, 0x81, 0x82, 0x01, 0x00, 0x46, 0xD2, 0x59, 0x07, 0x15,
    0x00, 0x00, 0x80, 0x28, 0xB5, 0x2F, 0xFD, 0x20, 0x78, 0x65, 0x00, 0x00,
    0x28, 0x3F, 0x40, 0x41, 0x3F, 0x40, 0x01, 0x00, 0x10, 0x69, 0xD1, 0x02,
    0x41, 0xEE, 0xC3, 0x8B};

static void test_old_frames(void)
{
    kvs_layout l = {0};
    const int64_t dims[2] = {3, 40};
    REQUIRE(kvs_layout_add_group(&l, 2, dims, KVS_DTYPE_BFLOAT16) == KVS_OK);
    uint8_t want[240];
    for (int i = 0; i < 120; i++) {
        unsigned v = 0x3F00u + (unsigned)((i * 7) % 5) * 0x80u + (unsigned)(i % 3);
        want[2 * i] = (uint8_t)v;
        want[2 * i + 1] = (uint8_t)(v >> 8);
    }
    const char *cfgs[2] = {BYTES_LL, RANS_LL};
    for (int c = 0; c < 2; c++) {
        kvs_serde_pair p = kvs_test_serde_pair(cfgs[c]);
        kvs_memobj *back = NULL;
        REQUIRE(kvs_memobj_alloc(&l, KVS_FMT_BINARY, &back) == KVS_OK);
        CHECK_OK(deser(&p, v1_blob, sizeof v1_blob, back));
        CHECK(memcmp(back->data, want, sizeof want) == 0);
        kvs_memobj_free(back);
        kvs_serde_pair_destroy(&p);
    }
}

/* ---------------------------------------------------------------------
 * The rANS coder's payload (version 2): exact bytes and refusals
 * ------------------------------------------------------------------ */

static kvs_stage *rans_stage_at(int level)
{
    json_t *cfg = json_pack("{s:s,s:s,s:i}", "type", "lossless", "coder", "rans", "level", level);
    kvs_stage *st = NULL;
    if (kvs_stage_lossless_type.create(cfg, &st) != KVS_OK) abort();
    json_decref(cfg);
    return st;
}

static size_t rans_encode(kvs_stage *st, const uint8_t *in, size_t n, uint64_t channels,
                          uint8_t **out)
{
    kvs_stage_ctx ctx = {NULL, NULL, 0, NULL, 2, channels, NULL};
    size_t cap = kvs_stage_lossless_type.bytes_bound(st, n), m = 0;
    *out = malloc(cap);
    if (kvs_stage_lossless_type.transform_encode(st, NULL, 0, &ctx, in, n, *out, cap, &m))
        abort();
    return m;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void test_rans_payload(void)
{
    kvs_stage *st = rans_stage_at(1);
    uint8_t params[2];
    CHECK_OK(kvs_stage_lossless_type.write_params(st, params));
    CHECK(params[0] == 1 && params[1] == 1);
    json_t *desc = kvs_stage_lossless_type.describe_params(params, 2);
    char *text = json_dumps(desc, JSON_SORT_KEYS | JSON_COMPACT);
    CHECK_EQ_STR(text, "{\"coder\":\"rans\",\"level\":1}");
    free(text);
    json_decref(desc);
    static const uint8_t bad_params[2] = {1, 2};
    CHECK_ERR(kvs_stage_lossless_type.check_params(bad_params, 2), KVS_ECORRUPT,
              "lossless: parameters level 1 (-7 to 19, not 0), coder 2 (0 zstd, 1 rans)");

    /* ten elements of 1.0 with 4 channels: the coded block would be larger
     * than raw (its 128 bytes of states), so it is stored raw */
    uint8_t in[2 * 4096 + 1];
    for (int i = 0; i < 4096; i++) in[2 * i] = 0x80, in[2 * i + 1] = 0x3F;
    in[8192] = 0x5A;
    uint8_t *enc = NULL, *back = malloc(sizeof in);
    size_t m = rans_encode(st, in, 20, 4, &enc), got = 0;
    static const uint8_t head[24] = {2, 2, 0, 0, 0, 0, 1, 0, 20, 0, 0, 0,
                                     0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0};
    CHECK_EQ_INT((int)m, 24 + 4 + 1 + 20);
    CHECK(memcmp(enc, head, 24) == 0);
    CHECK(enc[24] == 21 && enc[25] == 0 && enc[26] == 0 && enc[27] == 0);
    CHECK(enc[28] == 0 && memcmp(enc + 29, in, 20) == 0);
    CHECK(stage_decode(enc, m, 2, back, sizeof in, &got) == KVS_OK && got == 20 &&
          memcmp(back, in, 20) == 0);
    free(enc);

    /* 4096 of them and a tail byte: one symbol, coded in no bits; the
     * record is kind 1, the 4096 sign+mantissa bytes (0), one group, the
     * table {127..127: 1024} and the 32 states at their start 2^15 */
    m = rans_encode(st, in, sizeof in, 4, &enc);
    size_t rec = 1 + 4096 + 1 + 4 + 128;
    CHECK_EQ_INT((int)m, (int)(24 + 4 + rec + 1));
    static const uint8_t rtail[5] = {1, 127, 127, 0x84, 0x00};
    CHECK(enc[28] == 1);
    CHECK(memcmp(enc + 29 + 4096, rtail, 5) == 0);
    int zeros = 1, states = 1;
    for (int i = 0; i < 4096; i++) zeros &= enc[29 + i] == 0;
    for (int l = 0; l < 32; l++) {
        const uint8_t *q = enc + 34 + 4096 + 4 * l;
        states &= q[0] == 0 && q[1] == 0x80 && q[2] == 0 && q[3] == 0;
    }
    CHECK(zeros && states);
    CHECK(enc[m - 1] == 0x5A);
    CHECK(stage_decode(enc, m, 2, back, sizeof in, &got) == KVS_OK && got == sizeof in &&
          memcmp(back, in, sizeof in) == 0);
    /* every truncation refused; every damaged header and table byte refused,
     * but for the block size E (bytes 4-7) and the channel period (16-19),
     * which change nothing for one block coded with one group */
    for (size_t k = 0; k < m; k += (k < 64 ? 1 : 331))
        CHECK(stage_decode(enc, k, 2, back, sizeof in, &got) != KVS_OK);
    for (size_t k = 0; k < 24 + 4 + 1; k++)
        for (int bit = 0; bit < 8; bit++) {
            enc[k] ^= (uint8_t)(1u << bit);
            int rc = stage_decode(enc, m, 2, back, sizeof in, &got);
            /* (version 2 -> 3: version 3 holds every version 2 record) */
            int v3 = k == 0 && bit == 0;
            if (rc == KVS_OK && (memcmp(back, in, sizeof in) != 0 || (k < 4 && !v3) || k > 19 ||
                                 (k > 7 && k < 16)))
                KVS_FAIL_("byte %zu bit %d accepted", k, bit);
            enc[k] ^= (uint8_t)(1u << bit);
        }
    /* the messages */
    enc[1] = 1;
    CHECK_ERR(stage_decode(enc, m, 1, back, sizeof in, &got), KVS_ECORRUPT,
              "lossless: version 2 with element size 1 (2), channel period 4 (1 to 4096), "
              "reserved 0 (0)");
    enc[1] = 2;
    put_u32(enc + 16, 4097);
    CHECK_ERR(stage_decode(enc, m, 2, back, sizeof in, &got), KVS_ECORRUPT,
              "lossless: version 2 with element size 2 (2), channel period 4097 (1 to 4096), "
              "reserved 0 (0)");
    put_u32(enc + 16, 4);
    enc[28] = 2;
    CHECK_ERR(stage_decode(enc, m, 2, back, sizeof in, &got), KVS_ECORRUPT,
              "lossless: block 0: record kind 2 (0 raw, 1 rANS)");
    enc[28] = 1;
    uint8_t *g = enc + 29 + 4096; /* the group count, then the map or the table */
    g[0] = 5;
    CHECK_ERR(stage_decode(enc, m, 2, back, sizeof in, &got), KVS_ECORRUPT,
              "lossless: block 0: 5 channel groups (1 to 4)");
    g[0] = 2, g[1] = 0x0C; /* channel 1 in group 3 */
    CHECK_ERR(stage_decode(enc, m, 2, back, sizeof in, &got), KVS_ECORRUPT,
              "lossless: block 0: channel 1 in group 3 of 2");
    put_u32(enc + 16, 3), g[1] = 0x40; /* channel 3 of 3 */
    CHECK_ERR(stage_decode(enc, m, 2, back, sizeof in, &got), KVS_ECORRUPT,
              "lossless: block 0: group map bits past channel 2 set");
    put_u32(enc + 16, 4), g[0] = 1, g[1] = 127;
    g[3] = 0x83; /* the table sums to 768 */
    CHECK_ERR(stage_decode(enc, m, 2, back, sizeof in, &got), KVS_ECORRUPT,
              "lossless: block 0: frequencies sum to 768, expected 1024");
    g[3] = 0x84;
    enc[34 + 4096 + 1] = 0; /* state 0 below 2^15 */
    CHECK_ERR(stage_decode(enc, m, 2, back, sizeof in, &got), KVS_ECORRUPT,
              "lossless: block 0: rANS state 0 is 0, outside [32768, 2147483648)");
    enc[34 + 4096 + 1] = 0x80;
    enc[28] = 0; /* raw, but the record is not 1 + 2k bytes */
    CHECK_ERR(stage_decode(enc, m, 2, back, sizeof in, &got), KVS_ECORRUPT,
              "lossless: block 0: raw record of 4230 bytes, expected 8193");
    enc[28] = 1;
    CHECK(stage_decode(enc, m, 2, back, sizeof in, &got) == KVS_OK);
    free(enc);
    free(back);
    kvs_stage_lossless_type.destroy(st);
}

/* ---------------------------------------------------------------------
 * Row references (level 2, payload version 3)
 * ------------------------------------------------------------------ */

static void split_across_workers(const char *json);

static void refs_roundtrips(void)
{
    /* [rows, channels]: one element, odd sizes, a period that does not
     * divide the block (later blocks start inside a row: no references
     * there), several blocks */
    /* (rows of 45 and 100: flag bits that do not start a byte, and a
     * row's SIMD rebuild that leaves a tail) */
    static const int64_t shapes[][2] = {{1, 1},    {2, 2},     {3, 7},      {2, 4096},
                                        {64, 256}, {256, 256}, {300, 3000}, {513, 128},
                                        {200, 45}, {150, 100}};
    kvs_stage *st1 = rans_stage_at(1), *st2 = rans_stage_at(2);
    for (size_t z = 0; z < sizeof shapes / sizeof shapes[0]; z++)
        for (int f = ALL_EQUAL; f <= ROWS_COPIED; f++) {
            kvs_layout l = {0};
            REQUIRE(kvs_layout_add_group(&l, 2, shapes[z], KVS_DTYPE_BFLOAT16) == KVS_OK);
            kvs_memobj *o = new_obj(&l);
            if (f == ROWS_COPIED) fill_rows(o, (uint64_t)shapes[z][1], 7 + z);
            else fill(o, (enum fill)f, 11 * z + (uint64_t)f);
            size_t stored;
            int ok = roundtrip(RANS2_LL, o, &stored);
            if (!ok)
                fprintf(stderr, "rans level 2: [%lld, %lld], fill %d\n", (long long)shapes[z][0],
                        (long long)shapes[z][1], f);
            CHECK(ok);
            /* the stage alone: the version, and never above version 2's bound */
            size_t n = (size_t)kvs_layout_nbytes(&l), blocks = (n / 2 + BLOCK - 1) / BLOCK;
            uint8_t *e1 = NULL, *e2 = NULL;
            size_t m1 = rans_encode(st1, o->data, n, (uint64_t)shapes[z][1], &e1);
            size_t m2 = rans_encode(st2, o->data, n, (uint64_t)shapes[z][1], &e2);
            CHECK(m2 <= n + 24 + 5 * blocks);
            CHECK(e1[0] == 2);
            int big = shapes[z][0] >= 64;
            /* rows that repeat: references, and fewer bytes than level 1 */
            if (big && (f == ROWS_COPIED || f == ALL_EQUAL)) {
                CHECK(e2[0] == 3);
                CHECK(m2 < m1);
            }
            /* random bits: nothing repeats, so level 2 is level 1 */
            if (f == RANDOM) CHECK(e2[0] == 2 && m1 == m2 && memcmp(e1, e2, m1) == 0);
            if (shapes[z][0] < 2) CHECK(e2[0] == 2); /* one row: nothing to refer to */
            free(e1);
            free(e2);
            kvs_memobj_free(o);
        }
    kvs_stage_lossless_type.destroy(st1);
    kvs_stage_lossless_type.destroy(st2);
}

/* Both rebuilds of rows with references: the scalar loop (with the rANS
 * coder's scalar kernels) and, where the CPU has it, AVX-512 VBMI2 (with
 * the AVX-512 kernels); each round trip is exact, so they agree. */
static void test_rans_refs_roundtrips(void)
{
    for (int simd = 0; simd < 2; simd++) {
        if (kvs_rans_set_simd(simd) != simd) {
            printf("test_rans_refs_roundtrips: no AVX-512 here: the scalar rebuild only\n");
            continue;
        }
        refs_roundtrips();
        split_across_workers(RANS2_LL);
    }
    kvs_rans_set_simd(1);
}

/* The encoder counts a sample of each block's rows (every fourth unit:
 * lossless_exponent.c, exponent_hists); an exponent found only outside
 * the sample must still get a code. SMOOTH and ROWS_COPIED objects, then
 * the same with one element a row of an exponent (1-100) SMOOTH never has,
 * in rows (runs of 256 elements without channels) 2 and 3 of every four,
 * which no block samples, also where a block starts inside a row: at
 * levels 1-3, with every kernel set the CPU has (scalar, AVX2, AVX-512),
 * the round trip is exact, the sets write the same bytes, and the elements
 * cost less than 4 KiB a block where a block left raw would cost about
 * 40 KiB (at level 2 on ROWS_COPIED, the references kept). */
static void test_sampled_histograms(void)
{
    static const int64_t shapes[][2] = {{256, 256}, {128, 512}, {1024, 64}, {16, 4096},
                                        {44, 3000}, {131072, 1}, {8, 4096}};
    static const char *const json[] = {RANS_LL, RANS2_LL, RANS3_LL};
    static const char *const isa_name[] = {"scalar", "AVX2", "AVX-512"};
    for (size_t z = 0; z < sizeof shapes / sizeof shapes[0]; z++)
        for (int level = 1; level <= 3; level++)
            for (int f = SMOOTH; f <= ROWS_COPIED; f++) {
                kvs_memobj *o = filled_obj(shapes[z], f, 99 + z);
                size_t n = (size_t)kvs_layout_nbytes(&o->layout), blocks = (n / 2 + BLOCK - 1) / BLOCK;
                uint64_t c = (uint64_t)shapes[z][1], run = c > 1 ? c : 256, sd = 5 + z;
                kvs_stage *st = rans_stage_at(level);
                kvs_rans_set_isa(KVS_RANS_SCALAR);
                uint8_t *clean = NULL, *e[3] = {NULL, NULL, NULL};
                size_t m0 = rans_encode(st, o->data, n, c, &clean), m[3] = {0, 0, 0};
                uint16_t *v = o->data;
                for (uint64_t r = 0; r * run < n / 2; r++) {
                    if (r % 4 < 2) continue;
                    uint64_t at = r * run + lcg(&sd) % run;
                    if (at >= n / 2) continue;
                    v[at] = (uint16_t)((lcg(&sd) & 1) << 15 | (1 + r % 100) << 7 | (lcg(&sd) & 0x7F));
                }
                for (int isa = KVS_RANS_SCALAR; isa <= KVS_RANS_AVX512; isa++) {
                    if (kvs_rans_set_isa(isa) != isa) continue;
                    m[isa] = rans_encode(st, o->data, n, c, &e[isa]);
                    size_t stored;
                    int ok = roundtrip(json[level - 1], o, &stored);
                    int cheap = m[isa] < m0 + 4096 * blocks;
                    if (!ok || !cheap)
                        fprintf(stderr, "sampled histograms: [%lld, %lld], level %d, fill %d, %s: "
                                        "%zu bytes (%zu without the rare exponents)%s\n",
                                (long long)shapes[z][0], (long long)shapes[z][1], level, f,
                                isa_name[isa], m[isa], m0, ok ? "" : ", not exact");
                    CHECK(ok && cheap);
                    if (isa > KVS_RANS_SCALAR)
                        CHECK(m[isa] == m[0] && memcmp(e[isa], e[0], m[0]) == 0);
                }
                kvs_rans_set_simd(1);
                free(clean);
                for (int isa = 0; isa < 3; isa++) free(e[isa]);
                kvs_stage_lossless_type.destroy(st);
                kvs_memobj_free(o);
            }
}

/* A version 3 payload of one block of 8 elements, channel period 4, its
 * record kind 2 built by hand: u sign and mantissa bytes (0x11 * (j + 1)),
 * one group (exponent 127 only), row 1 referring d rows back with the
 * reference bits `bits`, the difference table {0: 1024}, the flag table
 * {flag: 1024} (every symbol of a one-symbol table costs no bits, so both
 * streams are their 32 states at 2^15). Returns its bytes. */
static size_t refs_payload(uint8_t *p, uint32_t u, uint8_t bits, unsigned d, uint8_t flag)
{
    static const uint8_t head[24] = {3, 2, 0, 0, 0, 0, 1, 0, 16, 0, 0, 0,
                                     0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0};
    memcpy(p, head, 24);
    uint8_t *r = p + 28, *q = r;
    *q++ = 2;
    put_u32(q, u), q += 4;
    for (uint32_t j = 0; j < u; j++) *q++ = (uint8_t)(0x11 * (j + 1));
    *q++ = 1;    /* one group */
    *q++ = bits; /* row 1 has a reference */
    *q++ = (uint8_t)d, *q++ = (uint8_t)(d >> 8);
    const uint8_t tabs[13] = {127, 127, 0x84, 0, 0, 0, 0x84, 0, 1, flag, flag, 0x84, 0};
    memcpy(q, tabs, 13), q += 13; /* group, difference, flag coding 1, flag table */
    put_u32(q, 128), q += 4;
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < 32; l++) *q++ = 0, *q++ = 0x80, *q++ = 0, *q++ = 0;
    put_u32(p + 24, (uint32_t)(q - r));
    return (size_t)(q - p);
}

static void test_rans_refs_payload(void)
{
    uint8_t p[512], back[16];
    size_t got = 0, m = refs_payload(p, 6, 0x02, 1, 0x05);
    /* row 0: four elements of exponent 127 with sign and mantissa bytes
     * 0x11-0x44; row 1: elements 0 and 2 repeat row 0's, elements 1 and 3
     * have exponent 127 + 0 and bytes 0x55, 0x66 */
    static const uint16_t want[8] = {0x3F91, 0x3FA2, 0x3FB3, 0x3FC4,
                                     0x3F91, 0x3FD5, 0x3FB3, 0x3FE6};
    uint8_t wb[16];
    for (int j = 0; j < 8; j++)
        wb[2 * j] = (uint8_t)want[j], wb[2 * j + 1] = (uint8_t)(want[j] >> 8);
    CHECK(stage_decode(p, m, 2, back, sizeof back, &got) == KVS_OK && got == 16);
    CHECK(memcmp(back, wb, 16) == 0);
    /* every truncation refused */
    for (size_t k = 0; k < m; k++) CHECK(stage_decode(p, k, 2, back, sizeof back, &got) != KVS_OK);
    /* the messages */
    p[0] = 2;
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: record kind 2 (0 raw, 1 rANS)");
    p[0] = 5;
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: version 5, expected 1 to 4");
    p[0] = 3;
    p[28] = 3;
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: record kind 3 (0 raw, 1 rANS, 2 rANS with row references)");
    p[28] = 2;
    p[16] = 1; /* channel period 1 */
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: row references in a block that does not start a row "
              "(channel period 1, first element 0)");
    p[16] = 4;
    put_u32(p + 29, 9);
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: 9 sign and mantissa bytes of 8 elements, 283 bytes left");
    put_u32(p + 29, 6);
    m = refs_payload(p, 6, 0x03, 1, 0x05);
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: row reference bit of row 0 or past row 1 set");
    m = refs_payload(p, 6, 0x06, 1, 0x05);
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: row reference bit of row 0 or past row 1 set");
    m = refs_payload(p, 6, 0x02, 0, 0x05);
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: row 1 refers 0 rows back (1 to 1)");
    m = refs_payload(p, 6, 0x02, 2, 0x05);
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: row 1 refers 2 rows back (1 to 1)");
    m = refs_payload(p, 6, 0x02, 1, 0x15); /* element 4 of a row of 4 */
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: flag bits past element 3 set");
    m = refs_payload(p, 5, 0x02, 1, 0x05);
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: 6 elements not repeated, 5 sign and mantissa bytes");
    m = refs_payload(p, 6, 0x02, 1, 0x05);
    size_t fl = m - 256 - 4; /* the flag stream's length */
    put_u32(p + fl, 129); /* a byte of the exponent stream taken into the flags' */
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: 1 bytes after the rANS stream of 1 symbols");
    put_u32(p + fl, 127);
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: rANS stream of 127 bytes, shorter than its 128 bytes of states");
    put_u32(p + fl, 300);
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: flag stream of 300 bytes, 256 left");
    put_u32(p + fl, 128);
    p[fl + 4 + 1] = 0; /* the flag stream's state 0 below 2^15 */
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: rANS state 0 is 0, outside [32768, 2147483648)");
    p[fl + 4 + 1] = 0x80;
    p[fl - 2] = 0x83; /* the flag table sums to 768 */
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: frequencies sum to 768, expected 1024");
    p[fl - 2] = 0x84;
    CHECK(stage_decode(p, m, 2, back, sizeof back, &got) == KVS_OK);
    CHECK(memcmp(back, wb, 16) == 0);
    p[fl - 5] = 2;
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: flag coding 2 (0 raw, 1 rANS)");
    /* the flags raw: coding 0, no table, F = 1 and the flag byte */
    p[fl - 5] = 0;
    memmove(p + fl - 4, p + fl, 4 + 128 + 128);
    m -= 4;
    fl -= 4;
    put_u32(p + fl, 1);
    p[fl + 4] = 0x05;
    memmove(p + fl + 5, p + fl + 4 + 128, 128);
    m -= 127;
    put_u32(p + 24, (uint32_t)(m - 28));
    CHECK(stage_decode(p, m, 2, back, sizeof back, &got) == KVS_OK);
    CHECK(memcmp(back, wb, 16) == 0);
    put_u32(p + fl, 2);
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: 2 raw flag bytes, expected 1");
}

/* ---------------------------------------------------------------------
 * Coded signs (level 3, payload version 4)
 * ------------------------------------------------------------------ */

static void test_rans_signs_roundtrips(void)
{
    /* [rows, channels]: one element, one row, odd sizes and rows past a
     * multiple of 4, a period that does not divide the block (later blocks
     * start inside a row: no coded signs there), several blocks */
    static const int64_t shapes[][2] = {{1, 1},    {1, 5},     {2, 2},     {3, 7},
                                        {5, 4096}, {64, 256},  {257, 256}, {300, 3000},
                                        {513, 128}, {1027, 64}};
    kvs_stage *st2 = rans_stage_at(2), *st3 = rans_stage_at(3);
    int packed = 0; /* kind 3 records whose mantissas were checked */
    for (size_t z = 0; z < sizeof shapes / sizeof shapes[0]; z++)
        for (int f = ALL_EQUAL; f <= SIGNS_KEPT; f++) {
            kvs_memobj *o = filled_obj(shapes[z], f, 13 * z + (uint64_t)f);
            const kvs_layout l = o->layout;
            uint64_t c = (uint64_t)shapes[z][1];
            int ok = roundtrip(RANS3_LL, o, NULL);
            if (!ok)
                fprintf(stderr, "rans level 3: [%lld, %lld], fill %d\n", (long long)shapes[z][0],
                        (long long)shapes[z][1], f);
            CHECK(ok);
            /* the stage alone: the version, and never above version 2's bound */
            size_t n = (size_t)kvs_layout_nbytes(&l), blocks = (n / 2 + BLOCK - 1) / BLOCK;
            uint8_t *e2 = NULL, *e3 = NULL;
            size_t m2 = rans_encode(st2, o->data, n, c, &e2);
            size_t m3 = rans_encode(st3, o->data, n, c, &e3);
            CHECK(m3 <= n + 24 + 5 * blocks);
            CHECK(e3[0] >= 2 && e3[0] <= 4);
            /* signs kept: coded, and fewer bytes than level 2 */
            if (f == SIGNS_KEPT && shapes[z][0] >= 64) {
                CHECK(e3[0] == 4);
                CHECK(m3 < m2);
            }
            /* a kind 3 record in block 0: its mantissas are element i's
             * bits 0-6 in bits 7i..7i+6 (docs/frame_format.md) */
            size_t rec0 = 24 + 4 * blocks;
            if (e3[0] == 4 && e3[rec0] == 3) {
                size_t k0 = n / 2 < BLOCK ? n / 2 : BLOCK, bad = 0;
                const uint8_t *mb = e3 + rec0 + 1;
                for (size_t i = 0; i < k0; i++) {
                    unsigned got = 0;
                    for (unsigned t = 0; t < 7; t++) {
                        size_t bit = 7 * i + t;
                        got |= (unsigned)(mb[bit / 8] >> (bit % 8) & 1) << t;
                    }
                    bad += got != (((const uint8_t *)o->data)[2 * i] & 0x7Fu);
                }
                CHECK(bad == 0);
                packed++;
            }
            /* random bits and random signs: level 3 is level 2 */
            if (f == RANDOM || f == SMOOTH || f == ROWS_COPIED)
                CHECK(m2 == m3 && memcmp(e2, e3, m2) == 0);
            free(e2);
            free(e3);
            kvs_memobj_free(o);
        }
    CHECK(packed >= 4);
    kvs_stage_lossless_type.destroy(st2);
    kvs_stage_lossless_type.destroy(st3);
}

/* A version 4 payload of one block of 7 elements, channel period 4 (rows
 * of 4 and 3), its record kind 3 built by hand: the mantissas 0x11 x (i +
 * 1) packed 7 bits each, one group (exponent 127 only), channel c in sign
 * class c, the class tables {0}, {3}, {2}, {1} (each channel's flips: 0,
 * 1 and 2 in both rows, 1 and 3 in row 0 only: c3 has no row 1), one-symbol
 * tables, so the stream is its 32 states at 2^15. Returns its bytes. */
static size_t signs_payload(uint8_t *p)
{
    static const uint8_t head[24] = {4, 2, 0, 0, 0, 0, 1, 0, 14, 0, 0, 0,
                                     0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0};
    static const uint8_t rec[1 + 7 + 2 + 4 * 5] = {
        3,    0x11, 0xD1, 0x8C, 0x58, 0x35, 0xDF, 0x01, /* kind, mantissas */
        1,    0xE4,                                     /* one group, classes */
        127,  127,  0x84, 0,                            /* the group's table */
        0,    0,    0x84, 0,    3, 3, 0x84, 0, 2, 2, 0x84, 0, 1, 1, 0x84, 0};
    memcpy(p, head, 24);
    uint8_t *q = p + 28;
    memcpy(q, rec, sizeof rec), q += sizeof rec;
    for (int l = 0; l < 32; l++) *q++ = 0, *q++ = 0x80, *q++ = 0, *q++ = 0;
    put_u32(p + 24, (uint32_t)(q - p - 28));
    return (size_t)(q - p);
}

static void test_rans_signs_payload(void)
{
    uint8_t p[512], back[14];
    size_t got = 0, m = signs_payload(p);
    /* signs: row 0 + - + -, row 1 + + - */
    static const uint16_t want[7] = {0x3F91, 0xBFA2, 0x3FB3, 0xBFC4, 0x3FD5, 0x3FE6, 0xBFF7};
    uint8_t wb[14];
    for (int j = 0; j < 7; j++)
        wb[2 * j] = (uint8_t)want[j], wb[2 * j + 1] = (uint8_t)(want[j] >> 8);
    CHECK(stage_decode(p, m, 2, back, sizeof back, &got) == KVS_OK && got == 14);
    CHECK(memcmp(back, wb, 14) == 0);
    /* every truncation refused */
    for (size_t k = 0; k < m; k++) CHECK(stage_decode(p, k, 2, back, sizeof back, &got) != KVS_OK);
    /* the messages */
    p[28] = 4;
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: record kind 4 (0 raw, 1 rANS, 2 rANS with row references, 3 "
              "rANS with coded signs)");
    p[28] = 3;
    p[16] = 1; /* channel period 1 */
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: coded signs in a block that does not start a row (channel "
              "period 1, first element 0)");
    p[16] = 4;
    p[35] |= 0x80; /* bit 55: past the 49 bits of 7 mantissas */
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: mantissa bits past element 6 set");
    p[35] &= 0x7F;
    p[54] = p[55] = 3; /* class 3 codes flips in rows 0 and 1: c3 has no row 1 */
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: sign flip bits past element 6 set");
    p[54] = p[55] = 16;
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: sign table 3 codes symbol 16 (0 to 15)");
    p[54] = p[55] = 1;
    p[36] = 0;
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: 0 channel groups (1 to 4)");
    p[36] = 1;
    p[40] = 0x83; /* the group table sums to 768 */
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: frequencies sum to 768, expected 1024");
    p[40] = 0x84;
    p[m - 127] = 0; /* state 0 below 2^15 */
    CHECK_ERR(stage_decode(p, m, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: rANS state 0 is 0, outside [32768, 2147483648)");
    p[m - 127] = 0x80;
    put_u32(p + 24, 8); /* the record cut after its mantissas */
    CHECK_ERR(stage_decode(p, 28 + 8, 2, back, sizeof back, &got), KVS_ECORRUPT,
              "lossless: block 0: 7 mantissa bytes and the group count, 7 bytes left");
    put_u32(p + 24, (uint32_t)(m - 28));
    CHECK(stage_decode(p, m, 2, back, sizeof back, &got) == KVS_OK);
    CHECK(memcmp(back, wb, 14) == 0);
}

/* ---------------------------------------------------------------------
 * The real KV cache
 * ------------------------------------------------------------------ */

static const char *kvdata_dir(void)
{
    static char dir[4096];
    const char *env = getenv("KVS_KVDATA_DIR"); /* when set, the only place looked at */
    const char *cands[] = {env, KVS_SOURCE_DIR "/../shared/kvdata", KVS_SOURCE_DIR
                           "/../../shared/kvdata"};
    for (size_t i = 0; i < (env ? 1 : sizeof cands / sizeof cands[0]); i++) {
        struct stat sb;
        if (cands[i] && stat(cands[i], &sb) == 0 && S_ISDIR(sb.st_mode)) {
            snprintf(dir, sizeof dir, "%s", cands[i]);
            return dir;
        }
    }
    return NULL;
}


/* Levels 1 to 3 with the scalar kernels and with each SIMD set this CPU
 * runs: AVX2 (the rANS kernels, the rows with references) and AVX-512 (the
 * rANS kernels and table fill, the VBMI2 split of rows with references, the
 * BMI2 / VBMI mantissa packing, the join of the fields, the reference
 * finder's candidates and counts, the fields' split, the channels' sums,
 * the keys and the sign flips): the same bytes on every shape and fill
 * (rows of 45, 100 and 13: flags that do not start a byte and rows that
 * leave a tail of the 32, 64 or 8 at a time; k mod 8 from 1 to 7; rows of
 * 40 and 72, whose packed mantissas the AVX-512 join unpacks itself, with
 * tails; [700, 100]: a block that ends inside a row; ROWS_HALVES:
 * candidates that tie), and each decodes the other's. */
static void test_rans_isas(void)
{
    int isas[2], nisa = 0;
    for (int isa = KVS_RANS_AVX2; isa <= KVS_RANS_AVX512; isa++)
        if (kvs_rans_set_isa(isa) == isa) isas[nisa++] = isa;
        else
            printf("test_rans_isas: no %s here: not compared\n",
                   isa == KVS_RANS_AVX2 ? "AVX2" : "AVX-512");
    static const int64_t shapes[][2] = {{1, 1},   {1, 5},    {3, 7},     {5, 4096},
                                        {9, 13},  {64, 256}, {257, 256}, {513, 128},
                                        {67, 45}, {150, 100}, {1027, 64}, {33, 40},
                                        {700, 72}, {700, 100}, {40, 48},
                                        {700, 256}, {1300, 256}}; /* 3 and 6 blocks: in pairs */
    size_t same = 0, runs = 0;
    for (int level = 1; level <= 3 && nisa > 0; level++) {
        kvs_stage *st = rans_stage_at(level);
        for (size_t z = 0; z < sizeof shapes / sizeof shapes[0]; z++)
            for (int f = ALL_EQUAL; f <= ROWS_HALVES; f++) {
                kvs_memobj *o = filled_obj(shapes[z], f, 17 * z + (uint64_t)f);
                uint64_t c = (uint64_t)shapes[z][1];
                size_t n = (size_t)kvs_layout_nbytes(&o->layout);
                uint8_t *e0 = NULL, *back = malloc(n);
                /* the scalar bytes once, then each set's against them */
                kvs_rans_set_isa(KVS_RANS_SCALAR);
                size_t m0 = rans_encode(st, o->data, n, c, &e0);
                for (int v = 0; v < nisa; v++) {
                    uint8_t *e1 = NULL;
                    kvs_rans_set_isa(isas[v]);
                    size_t m1 = rans_encode(st, o->data, n, c, &e1), got = 0;
                    int eq = m0 == m1 && memcmp(e0, e1, m0) == 0;
                    if (!eq)
                        fprintf(stderr, "isa %d level %d, [%lld, %lld], fill %d: %zu and %zu bytes\n",
                                isas[v], level, (long long)shapes[z][0], (long long)shapes[z][1],
                                f, m0, m1);
                    same += eq;
                    /* each decodes the other's */
                    CHECK(stage_decode(e0, m0, 2, back, n, &got) == KVS_OK && got == n &&
                          memcmp(back, o->data, n) == 0);
                    kvs_rans_set_isa(KVS_RANS_SCALAR);
                    CHECK(stage_decode(e1, m1, 2, back, n, &got) == KVS_OK && got == n &&
                          memcmp(back, o->data, n) == 0);
                    runs++;
                    free(e1);
                }
                free(e0);
                free(back);
                kvs_memobj_free(o);
            }
        kvs_stage_lossless_type.destroy(st);
    }
    CHECK(same == runs);
    CHECK(nisa == 0 || runs > 0);
    kvs_rans_set_simd(1);
}

/* Blocks decode two at a time (kvs_llx_decode_pair); a damaged block that
 * is not the first is refused as one block at a time refuses: the first
 * damaged block in order named, the blocks before it written, none from it
 * on. The damage is each block's last stream byte (its last word), which
 * only the end of its rANS decode finds, for both kernel sets and each
 * record kind. */
static void test_rans_damaged_pair(void)
{
    static const int64_t shape[2] = {5 * 256 + 100, 256}; /* 6 blocks */
    static const int damaged[][2] = {{3, -1}, {3, 4}, {2, 3}, {5, -1}, {1, 4}, {0, 1}};
    int have_simd = kvs_rans_set_simd(1);
    for (int level = 1; level <= 3; level++) {
        kvs_stage *st = rans_stage_at(level);
        kvs_memobj *o = filled_obj(shape, level == 1 ? SMOOTH : ROWS_HALVES, 41);
        size_t n = (size_t)kvs_layout_nbytes(&o->layout), got = 0;
        uint8_t *e = NULL, *back = malloc(n);
        size_t m = rans_encode(st, o->data, n, 256, &e), nblocks = 6;
        size_t at = 24 + 4 * nblocks, end[6];
        REQUIRE(m > at && e[0] >= 2);
        for (size_t b = 0; b < nblocks; b++) {
            at += (size_t)e[24 + 4 * b] | (size_t)e[25 + 4 * b] << 8 |
                  (size_t)e[26 + 4 * b] << 16 | (size_t)e[27 + 4 * b] << 24;
            end[b] = at;
        }
        REQUIRE(at == m);
        for (int simd = 0; simd < 1 + have_simd; simd++) {
            kvs_rans_set_simd(simd);
            for (size_t c = 0; c < sizeof damaged / sizeof damaged[0]; c++) {
                for (int d = 0; d < 2; d++)
                    if (damaged[c][d] >= 0) e[end[damaged[c][d]] - 1] ^= 0x21;
                memset(back, 0xA5, n);
                int rc = stage_decode(e, m, 2, back, n, &got);
                char want[32];
                int first = damaged[c][0];
                snprintf(want, sizeof want, "lossless: block %d: rANS ", first);
                if (rc != KVS_ECORRUPT || strstr(kvs_last_error(), want) != kvs_last_error())
                    KVS_FAIL_("level %d simd %d blocks %d %d: rc %d, %s", level, simd, first,
                              damaged[c][1], rc, kvs_last_error());
                size_t before = (size_t)first * 2 * BLOCK;
                CHECK(memcmp(back, o->data, before) == 0);
                int untouched = 1;
                for (size_t i = before; i < n; i++) untouched &= back[i] == 0xA5;
                CHECK(untouched);
                for (int d = 0; d < 2; d++)
                    if (damaged[c][d] >= 0) e[end[damaged[c][d]] - 1] ^= 0x21;
            }
            CHECK(stage_decode(e, m, 2, back, n, &got) == KVS_OK && got == n &&
                  memcmp(back, o->data, n) == 0);
        }
        free(e);
        free(back);
        kvs_memobj_free(o);
        kvs_stage_lossless_type.destroy(st);
    }
    kvs_rans_set_simd(1);
}

/* The pipeline decodes the rANS coder's payloads straight into the
 * caller's destination (no scratch buffer, no copy: transform_decode_direct),
 * so every refusal must come before its first byte: crafted blobs (a byte
 * of the payload flipped and the frame's CRC-32C made to match, so that
 * only the lossless stage can refuse) leave a destination of 0xA5 bytes
 * untouched, whichever block is damaged, for objects of 1 and 6 blocks, at
 * levels 1-3 (record kinds 1, 2, 3), with both kernel sets, with the
 * refusal and message of the stage decoding into a scratch (blocks two at
 * a time there, streams kept two at once here); accepted ones decode what
 * the scratch path decodes. A destination that overlaps the
 * blob takes the scratch path and still decodes exactly. The frame's
 * CRC-32C is folded into that decode: a damaged byte without the refit is
 * refused by it, with its message, the destination untouched. */
static void refit_crc(uint8_t *b, size_t len)
{
    size_t h = (size_t)b[6] | (size_t)b[7] << 8;
    uint32_t c = kvs_crc32c(0, b + h, len - h - 4);
    for (int i = 0; i < 4; i++) b[len - 4 + i] = (uint8_t)(c >> (8 * i));
}

/* TSan looks for races, and the damage sweep below is one thread's work:
 * under TSan it takes about a third as many bytes (all of them in the plain and
 * ASan builds), as test_lossless ran past its 900 s under TSan on a 2-vCPU
 * Intel host (2026-12-03: this sweep was nine tenths of it). */
#if defined(__SANITIZE_THREAD__)
#define KVS_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KVS_TEST_TSAN 1
#endif
#endif
#ifndef KVS_TEST_TSAN
#define KVS_TEST_TSAN 0
#endif

static void direct_refusals(const char *json, int rows, int nblocks, int *refused)
{
    kvs_layout l = {0};
    const int64_t dims[2] = {nblocks == 1 ? 256 : (nblocks - 1) * 256 + 100, 256};
    REQUIRE(kvs_layout_add_group(&l, 2, dims, KVS_DTYPE_BFLOAT16) == KVS_OK);
    kvs_memobj *o = new_obj(&l), *back = new_obj(&l), *ref = new_obj(&l);
    if (rows == 1) fill_rows(o, 256, 7);
    else if (rows == 2) fill_signs(o, 256, 7);
    else fill(o, SMOOTH, 7);
    size_t n = (size_t)kvs_layout_nbytes(&l), len;
    kvs_serde_pair p = kvs_test_serde_pair(json);
    uint8_t *b = ser(&p, o, &len);
    REQUIRE(b != NULL);
    /* the direct path: exact, and no scratch buffer taken */
    memset(back->data, 0xA5, n);
    CHECK(deser(&p, b, len, back) == KVS_OK && memcmp(back->data, o->data, n) == 0);
    CHECK(kvs_pipeline_scratch_allocs(p.deserializer) == 0);
    size_t h = (size_t)b[6] | (size_t)b[7] << 8;
    /* the reference: the same bytes through the stage into a scratch */
    for (size_t k = h; k < len - 4; k += 1 + (k - h) / (KVS_TEST_TSAN ? 12 : 48)) {
        b[k] ^= 0x40;
        refit_crc(b, len);
        memset(back->data, 0xA5, n);
        int rc = deser(&p, b, len, back);
        char msg[512];
        snprintf(msg, sizeof msg, "%s", rc ? kvs_last_error() : "");
        size_t got = 0;
        memset(ref->data, 0xA5, n);
        int want = stage_decode(b + h, len - h - 4, 2, ref->data, n, &got);
        /* (the stage alone finds a decoded size other than the object's
         * too long for ref: the pipeline then decodes into a scratch) */
        if (rc != KVS_OK && want != KVS_ENOSPC &&
            (want != rc || strcmp(msg, kvs_last_error()) != 0))
            KVS_FAIL_("%s: byte %zu: refused with %d '%s', the stage alone %d '%s'", json, k, rc,
                      msg, want, kvs_last_error());
        if (rc != KVS_OK) {
            int untouched = 1;
            for (size_t i = 0; i < n; i++) untouched &= ((uint8_t *)back->data)[i] == 0xA5;
            if (!untouched)
                KVS_FAIL_("%s: byte %zu: refused (%s), destination written", json, k, msg);
            (*refused)++;
        } else {
            CHECK(want == KVS_OK && got == n && memcmp(back->data, ref->data, n) == 0);
        }
        b[k] ^= 0x40;
        /* without the CRC refit: the check folded into the decode refuses
         * first, as the check before it did, naming the checksum */
        refit_crc(b, len);
        b[k] ^= 0x40;
        memset(back->data, 0xA5, n);
        rc = deser(&p, b, len, back);
        if (rc != KVS_ECORRUPT || strstr(kvs_last_error(), "crc32c: payload damaged") == NULL)
            KVS_FAIL_("%s: byte %zu damaged: rc %d, %s", json, k, rc, kvs_last_error());
        int untouched = 1;
        for (size_t i = 0; i < n; i++) untouched &= ((uint8_t *)back->data)[i] == 0xA5;
        CHECK(untouched);
        b[k] ^= 0x40;
    }
    refit_crc(b, len);
    /* dst over the blob's own bytes: not direct (it would overwrite the
     * records it reads), decoded exactly through the scratch */
    uint8_t *both = malloc(len + n);
    memcpy(both + n / 2, b, len);
    kvs_memobj src = {both + n / 2, len, len, {0}, KVS_FMT_UNDEFINED, 0};
    REQUIRE(kvs_layout_flat(&src.layout, len, KVS_DTYPE_UINT8) == KVS_OK);
    kvs_memobj dst = {both, n, n, l, KVS_FMT_KV_2LTD, 0};
    CHECK(kvs_deserialize(p.deserializer, &src, &dst, NULL) == KVS_OK &&
          memcmp(both, o->data, n) == 0);
    free(both);
    free(b);
    kvs_memobj_free(o);
    kvs_memobj_free(back);
    kvs_memobj_free(ref);
    kvs_serde_pair_destroy(&p);
}

static void test_direct_refusals(void)
{
    int have_simd = kvs_rans_set_simd(1);
    for (int simd = 0; simd < 1 + have_simd; simd++) {
        kvs_rans_set_simd(simd);
        int refused = 0;
        static const int counts[] = {1, 6, 7}; /* 7: an odd block after the pairs */
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            int nb = counts[c];
            direct_refusals(RANS_LL, 0, nb, &refused);
            direct_refusals(RANS2_LL, 1, nb, &refused);
            direct_refusals(RANS3_LL, 2, nb, &refused);
        }
        CHECK(refused > 100); /* the crafted bytes reached the stage's checks */
    }
    kvs_rans_set_simd(1);
}

/* The BMI2 mantissa packing against the bit string it defines (element i's
 * bits 0-6 in bits 7i..7i+6), at every start offset 0-7 and counts 0-200
 * (the unpacking's VBMI steps of 64 and the pdep tail): what it packs and
 * what it writes past (one 0 byte), what it unpacks. */
#if defined(__x86_64__)
/* The AVX2 unpacking against the bit string's definition, every count
 * 0-200 and every byte count available (the bytes exactly as long as the
 * mantissas, in a buffer of that size: ASan sees a read past it), at start
 * offsets 0-7: how many it takes, what it writes, and nothing past that. */
static size_t unpack7_avx2_bad(void)
{
    uint8_t sm[200], back[210];
    uint64_t s = 321;
    size_t bad = 0;
    for (size_t k = 0; k <= 200; k++) {
        size_t nin = (7 * k + 7) / 8;
        uint8_t *in = malloc(nin + 8);
        for (size_t off = 0; off < 8; off++) {
            for (size_t i = 0; i < k; i++) sm[i] = (uint8_t)(lcg(&s) & 0x7F);
            uint8_t *p = in + off;
            memset(p, 0, nin);
            for (size_t i = 0; i < k; i++)
                for (unsigned t = 0; t < 7; t++)
                    if (sm[i] >> t & 1) p[(7 * i + t) / 8] |= (uint8_t)(1u << ((7 * i + t) % 8));
            memset(back, 0xA5, sizeof back);
            size_t c = kvs_llx_unpack7_avx2(p, k, nin, back);
            /* as far as whole 16-byte reads reach inside the bytes */
            size_t want_c = 0;
            while (want_c + 16 <= k && want_c / 16 * 14 + 16 <= nin) want_c += 16;
            bad += c != want_c;
            for (size_t i = 0; i < c; i++) bad += back[i] != sm[i];
            for (size_t i = c; i < sizeof back; i++) bad += back[i] != 0xA5;
        }
        free(in);
    }
    return bad;
}
#endif

static void test_mantissa_kernels(void)
{
#if defined(__x86_64__)
    if (kvs_cpu_features() & KVS_CPU_AVX2) CHECK_EQ_INT((int)unpack7_avx2_bad(), 0);
    else printf("test_mantissa_kernels: no AVX2 here: its unpacking not compared\n");
    if (!kvs_rans_set_simd(1)) {
        printf("test_mantissa_kernels: no AVX-512 here: nothing to compare\n");
        return;
    }
    uint8_t sm[210], in[200], out[200], want[200], back[210];
    uint64_t s = 12345;
    size_t bad = 0;
    for (size_t off = 0; off < 8; off++)
        for (size_t k = 0; k <= 200; k++) {
            for (size_t i = 0; i < sizeof sm; i++) sm[i] = (uint8_t)lcg(&s);
            memset(out, 0xA5, sizeof out);
            size_t c = kvs_llx_pack7_avx512(sm, k, out + off);
            bad += c != k / 8 * 8;
            memset(want, 0, sizeof want);
            for (size_t i = 0; i < c; i++)
                for (unsigned t = 0; t < 7; t++)
                    if (sm[i] >> t & 1) want[(7 * i + t) / 8] |= (uint8_t)(1u << ((7 * i + t) % 8));
            size_t nb = c / 8 * 7;
            bad += memcmp(out + off, want, nb) != 0;
            bad += c && out[off + nb] != 0; /* the byte past them */
            bad += out[off + nb + (c > 0)] != 0xA5;
            for (size_t i = 0; i < off; i++) bad += out[i] != 0xA5;
            /* unpack from the bit string with the next byte's bits set */
            memcpy(in + off, want, nb);
            in[off + nb] = 0xFF;
            memset(back, 0xA5, sizeof back);
            bad += kvs_llx_unpack7_avx512(in + off, k, back) != c;
            for (size_t i = 0; i < c; i++) bad += back[i] != (sm[i] & 0x7F);
            bad += back[c] != 0xA5;
        }
    CHECK(bad == 0);
#else
    printf("test_mantissa_kernels: not x86: nothing to compare\n");
#endif
}

#if defined(__x86_64__)
/* The split of elements into fields, channel sums and histogram keys
 * (lossless_split.h), every count 0-100: the values that differ from their
 * definitions' and the bytes written past them. */
static size_t split_kernels_bad(void)
{
    uint8_t src[2 * 104], exp[104], sm[104], row[104];
    uint16_t s16[104], want[104];
    uint64_t s = 777;
    size_t bad = 0;
    for (size_t k = 0; k <= 100; k++) {
        for (size_t i = 0; i < sizeof src; i++) src[i] = (uint8_t)lcg(&s);
        memset(exp, 0xA5, sizeof exp);
        memset(sm, 0xA5, sizeof sm);
        size_t c = kvs_llx_split_avx512(src, k, exp, sm);
        bad += c != k / 32 * 32;
        for (size_t i = 0; i < c; i++) {
            unsigned v = (unsigned)src[2 * i] | (unsigned)src[2 * i + 1] << 8;
            bad += exp[i] != (uint8_t)(v >> 7);
            bad += sm[i] != (uint8_t)((v >> 8 & 0x80) | (v & 0x7F));
        }
        for (size_t i = c; i < sizeof exp; i++) bad += exp[i] != 0xA5 || sm[i] != 0xA5;
        for (size_t i = 0; i < 104; i++) {
            row[i] = (uint8_t)lcg(&s);
            s16[i] = want[i] = (uint16_t)lcg(&s);
        }
        c = kvs_llx_add_row_avx512(row, k, s16);
        bad += c != k / 32 * 32;
        for (size_t i = 0; i < c; i++) want[i] = (uint16_t)(want[i] + row[i]);
        bad += memcmp(s16, want, sizeof s16) != 0;

        /* the keys, with contexts (row) and without */
        uint16_t key[104];
        for (int with = 0; with < 2; with++) {
            memset(key, 0xA5, sizeof key);
            c = kvs_llx_keys_avx512(exp, with ? row : NULL, k, key);
            bad += c != k / 32 * 32;
            for (size_t i = 0; i < 104; i++)
                bad += key[i] != (i < c ? (uint16_t)((with ? row[i] << 8 : 0) | exp[i]) : 0xA5A5);
        }
    }
    return bad;
}

/* The search for a key the sampled histograms lack (lossless_split.h),
 * AVX-512 (lanes 64) or AVX2 (32), against the portable loop: lengths
 * around the lanes, contexts and none, bitmaps with every key, about half
 * of them, and one key missing at a chosen element. */
static size_t first_absent_bad(int avx512)
{
    uint8_t exp[700], cx[700], bm[128];
    uint64_t s = 4242;
    size_t bad = 0, lanes = avx512 ? 64 : 32;
    for (size_t k = 0; k <= 700; k += k < 140 ? 1 : 37) {
        for (size_t i = 0; i < k; i++) exp[i] = (uint8_t)lcg(&s), cx[i] = (uint8_t)(lcg(&s) % 4);
        for (int form = 0; form < 3; form++)
            for (int with = 0; with < 2; with++) {
                const uint8_t *c = with ? cx : NULL;
                for (int j = 0; j < 128; j++) bm[j] = form == 1 ? (uint8_t)lcg(&s) : 0xFF;
                if (form == 2 && k) { /* only element `at`'s key missing */
                    size_t at = (size_t)(lcg(&s) % k);
                    unsigned key = (with ? (unsigned)cx[at] << 8 : 0u) | exp[at];
                    bm[key >> 3] = (uint8_t)(bm[key >> 3] & ~(1u << (key & 7)));
                }
                size_t v = k / lanes * lanes, want = v;
                for (size_t i = 0; i < v; i++) {
                    unsigned key = (with ? (unsigned)cx[i] << 8 : 0u) | exp[i];
                    if (!(bm[key >> 3] >> (key & 7) & 1)) {
                        want = i;
                        break;
                    }
                }
                size_t got = avx512 ? kvs_llx_first_absent_avx512(exp, c, k, bm)
                                    : kvs_llx_first_absent_avx2(exp, c, k, bm);
                bad += got != want;
            }
    }
    return bad;
}

/* Kind 3's sign flips (lossless_flips.h): periods below, at and above its
 * 64 lanes, row counts not a multiple of 4, a last row cut short; every
 * nibble written and nothing after them. */
static size_t flips_kernel_bad(void)
{
    static const uint32_t periods[] = {2, 3, 45, 64, 100, 130};
    static const size_t ks[] = {1, 2, 63, 64, 65, 200, 513, 1000, 1301};
    uint8_t sm[1301], nib[1400];
    uint64_t s = 4242;
    size_t bad = 0;
    for (size_t i = 0; i < sizeof sm; i++) sm[i] = (uint8_t)lcg(&s);
    for (size_t a = 0; a < sizeof periods / sizeof periods[0]; a++)
        for (size_t b = 0; b < sizeof ks / sizeof ks[0]; b++) {
            uint32_t p = periods[a];
            size_t k = ks[b], rows = (k + p - 1) / p, want_n = (rows + 3) / 4 * p;
            memset(nib, 0xA5, sizeof nib);
            bad += kvs_llx_sign_nibbles_avx512(sm, k, p, nib) != want_n;
            for (size_t i = 0; i < want_n; i++) {
                size_t j = i / p, c = i % p;
                unsigned want = 0;
                for (unsigned t = 0; t < 4; t++) {
                    size_t e = (4 * j + t) * p + c;
                    if (e >= k) continue;
                    unsigned up = 4 * j + t ? sm[e - p] >> 7 : 0;
                    want |= ((sm[e] >> 7) ^ up) << t;
                }
                bad += nib[i] != want;
            }
            for (size_t i = want_n; i < sizeof nib; i++) bad += nib[i] != 0xA5;
        }
    return bad;
}

/* Kind 3's nibble histograms per sign class (lossless_flips.h) against
 * their definition: periods below, at and above its 64 lanes, row counts
 * below, at and past the 255 its byte counters hold between folds, classes
 * and values drawn; added to what h held. */
static size_t nibble_hists_bad(void)
{
    static const uint32_t periods[] = {2, 3, 45, 64, 100, 130, 256};
    static const size_t row_counts[] = {1, 4, 254, 255, 256, 600};
    enum { MAX_N = 600 * 256 };
    uint8_t *nib = malloc(MAX_N), cls[256];
    uint64_t s = 31337;
    size_t bad = 0;
    for (size_t a = 0; a < sizeof periods / sizeof periods[0]; a++)
        for (size_t b = 0; b < sizeof row_counts / sizeof row_counts[0]; b++) {
            uint32_t p = periods[a];
            size_t n = row_counts[b] * p;
            for (uint32_t c = 0; c < p; c++) cls[c] = (uint8_t)(lcg(&s) % 4);
            /* mostly 0, as a class of kept signs has them, and all 0 in
             * every other channel of class 0 (a count of every row) */
            for (size_t i = 0; i < n; i++)
                nib[i] = lcg(&s) % 3 || (cls[i % p] == 0 && i % p % 2 == 0)
                             ? 0
                             : (uint8_t)(lcg(&s) % 16);
            uint32_t h[4][16], want[4][16];
            for (int q = 0; q < 4; q++)
                for (int v = 0; v < 16; v++) h[q][v] = want[q][v] = (uint32_t)(q * 16 + v);
            for (size_t i = 0; i < n; i++) want[cls[i % p]][nib[i]]++;
            kvs_llx_nibble_hists_avx512(nib, n, p, cls, h);
            bad += memcmp(h, want, sizeof h) != 0;
        }
    free(nib);
    return bad;
}

/* The AVX-512 finder's best candidate of a row (lossless_refs.h) against
 * its definition: rows of 1 to 100 elements (tails of the 32 a step) in
 * blocks of up to 9 rows, every earlier row a candidate, each element
 * equal to the row's one in three (by its low byte or its high one
 * otherwise), ties (the first wins), no candidates. */
static size_t best_candidate_bad(void)
{
    enum { P = 100, ROWS = 9 };
    uint8_t blk[2 * P * ROWS];
    uint32_t cand[ROWS];
    uint64_t s = 4711;
    size_t bad = 0;
    for (size_t len = 1; len <= P; len++)
        for (uint32_t nc = 0; nc < ROWS; nc++) {
            const uint8_t *row = blk + 2 * (size_t)P * (ROWS - 1);
            for (size_t i = 0; i < sizeof blk; i++) blk[i] = (uint8_t)lcg(&s);
            for (uint32_t q = 0; q < nc; q++) {
                cand[q] = (uint32_t)((q * 5 + len) % (ROWS - 1));
                uint8_t *c = blk + 2 * (size_t)P * cand[q];
                for (size_t i = 0; i < len; i++) {
                    unsigned t = (unsigned)lcg(&s) % 3;
                    c[2 * i] = row[2 * i], c[2 * i + 1] = row[2 * i + 1];
                    if (t) c[2 * i + (t == 2)] ^= (uint8_t)(1 + lcg(&s) % 255);
                }
            }
            size_t want = 0, most = 12345;
            uint32_t want_q = 0;
            for (uint32_t q = 0; q < nc; q++) {
                size_t m = 0;
                for (size_t i = 0; i < len; i++)
                    m += memcmp(row + 2 * i, blk + 2 * ((size_t)P * cand[q] + i), 2) == 0;
                if (m > want) want = m, want_q = q;
            }
            uint32_t got = kvs_llx_best_candidate_avx512(row, blk, P, cand, nc, len, &most);
            bad += got != want_q || most != want;
        }
    return bad;
}

/* The AVX-512 finder's candidates of a row (lossless_refs.h) in both its
 * forms (word rotations, conflict detection), against their definition:
 * row r - 1 first (r > 0), then the first sample of each other row that two
 * or more of the 32 samples found, in the samples' order, never an empty
 * slot (0) nor row r - 1 again; and every sample's slot holding r + 1
 * after. Rows of 256 sampled at every 8th element, the slots they hash to
 * set to rows drawn from a few (repeats within each half of the samples
 * and across the halves, singles, empties, the row before), 4,000 draws;
 * and one row worked by hand. */
static size_t ref_candidates_bad(void)
{
    enum { BITS = 12, P = 256 };
    static uint32_t hash[1u << BITS];
    uint8_t row[2 * P];
    uint32_t at_c[KVS_LLX_REF_SAMPLES], slot[KVS_LLX_REF_SAMPLES], v[KVS_LLX_REF_SAMPLES];
    uint32_t cand[KVS_LLX_REF_SAMPLES + 1], want[KVS_LLX_REF_SAMPLES + 1];
    for (uint32_t j = 0; j < KVS_LLX_REF_SAMPLES; j++) at_c[j] = 8 * j;
    uint64_t s = 777;
    size_t bad = 0;
    for (int trial = 0; trial <= 4000; trial++) {
        uint32_t r = trial ? (uint32_t)(lcg(&s) % 5000) : 200;
        for (size_t i = 0; i < sizeof row; i++) row[i] = (uint8_t)lcg(&s);
        /* the samples' slots, made distinct (an element changed until its
         * key hashes apart from the earlier samples') */
        for (uint32_t j = 0; j < KVS_LLX_REF_SAMPLES; j++)
            for (int clash = 1; clash;) {
                uint32_t key = (row[2 * at_c[j]] | (uint32_t)row[2 * at_c[j] + 1] << 8) | j << 16;
                slot[j] = (key * KVS_LLX_REF_HASH_MUL) >> (32 - BITS);
                clash = 0;
                for (uint32_t i = 0; i < j; i++) clash |= slot[i] == slot[j];
                if (clash) row[2 * at_c[j]]++;
            }
        if (trial == 0) {
            /* rows 7 (samples 3 and 20), 12 (10, 11, 31) and the row
             * before (5, 6) found twice or more, empties (0, 1), row 2 once
             * (30), the others once each */
            for (uint32_t j = 0; j < KVS_LLX_REF_SAMPLES; j++) v[j] = 100 + j;
            v[3] = v[20] = 8, v[10] = v[11] = v[31] = 13, v[5] = v[6] = r, v[0] = v[1] = 0;
            v[30] = 3;
        } else {
            uint32_t pool[8] = {0, r}, np = r > 1 ? 2 + (uint32_t)(lcg(&s) % 6) : 2;
            for (uint32_t q = 2; q < np; q++) pool[q] = 1 + (uint32_t)(lcg(&s) % (r - 1));
            for (uint32_t j = 0; j < KVS_LLX_REF_SAMPLES; j++)
                v[j] = lcg(&s) % 3 || r < 2 ? pool[lcg(&s) % np] : 1 + (uint32_t)(lcg(&s) % r);
        }
        size_t nw = 0;
        if (r) want[nw++] = r - 1;
        for (uint32_t j = 0; j < KVS_LLX_REF_SAMPLES; j++) {
            unsigned before = 0, after = 0;
            for (uint32_t i = 0; i < KVS_LLX_REF_SAMPLES; i++) {
                before += i < j && v[i] == v[j];
                after += i > j && v[i] == v[j];
            }
            if (v[j] && v[j] != r && !before && after) want[nw++] = v[j] - 1;
        }
        if (trial == 0) bad += nw != 3 || want[0] != 199 || want[1] != 7 || want[2] != 12;
        for (int form = 0; form < 2; form++) {
            for (uint32_t j = 0; j < KVS_LLX_REF_SAMPLES; j++) hash[slot[j]] = v[j];
            kvs_llx_set_ref_conflicts(form);
            uint32_t n = kvs_llx_ref_candidates_avx512(row, at_c, hash, BITS, r, cand);
            bad += n != nw || memcmp(cand, want, nw * sizeof want[0]) != 0;
            for (uint32_t j = 0; j < KVS_LLX_REF_SAMPLES; j++) bad += hash[slot[j]] != r + 1;
        }
    }
    kvs_llx_set_ref_conflicts(-1);
    return bad;
}

/* The kind 2 estimate's VBMI2 pass over a row (lossless_refs.h): rows of
 * 0-100 elements, half of them repeated, at every flag offset 0-7: the
 * flags, the nonzero differences in order, the counts, nothing set past
 * the row's flags and no byte written outside the differences appended. */
static size_t row_diffs_bad(void)
{
    uint8_t row[2 * 100], above[2 * 100], ex[100], exa[100], fl[24], nz[100], want_nz[100];
    uint64_t s = 99;
    size_t bad = 0;
    for (size_t n = 0; n <= 100; n++)
        for (size_t off = 0; off < 8; off++) {
            for (size_t i = 0; i < sizeof row; i++) row[i] = above[i] = (uint8_t)lcg(&s);
            for (size_t i = 0; i < 100; i++) {
                if (lcg(&s) & 1) above[2 * i] ^= (uint8_t)(1 + lcg(&s) % 255);
                ex[i] = (uint8_t)lcg(&s);
                exa[i] = lcg(&s) % 4 ? ex[i] : (uint8_t)lcg(&s);
            }
            memset(fl, 0, sizeof fl);
            memset(nz, 0xA5, sizeof nz);
            size_t nnz = 3, same = 5, c = kvs_llx_row_diffs_avx512vbmi2(row, above, ex, exa, n, fl,
                                                                       off, nz, &nnz, &same);
            bad += c != n / 32 * 32;
            size_t m = 3, eq = 5;
            for (size_t j = 0; j < c; j++) {
                unsigned e = row[2 * j] == above[2 * j] && row[2 * j + 1] == above[2 * j + 1];
                eq += e;
                bad += (fl[(off + j) / 8] >> ((off + j) % 8) & 1) != e;
                uint8_t d = (uint8_t)(ex[j] - exa[j]);
                if (d) want_nz[m++] = d;
            }
            for (size_t b = off + c; b < 8 * sizeof fl; b++) bad += fl[b / 8] >> (b % 8) & 1;
            bad += nnz != m || same != eq || memcmp(nz + 3, want_nz + 3, m - 3) != 0;
            for (size_t i = 0; i < sizeof nz; i++) bad += (i < 3 || i >= m) && nz[i] != 0xA5;
        }
    return bad;
}
#endif

#if defined(__x86_64__)
/* The rows-with-references kernels (lossless_rows.h) against the scalar
 * loops' definitions, at flag offsets 0-7 and rows of 0 to 100: the AVX2
 * ones (vbmi2 0: steps of 16) or the AVX-512 VBMI2 ones (steps of 32). The
 * rebuild: the elements it takes, the sym / sm bytes it uses (given only
 * those, in buffers of exactly that size: ASan sees a read past them), and
 * nothing written past them in out; the split: what it appends, and
 * nothing written at or past sym + c (for VBMI2: past what it appends). */
static size_t row_kernels_bad(int vbmi2)
{
    enum { N = 100 };
    size_t step = vbmi2 ? 32 : 16, bad = 0;
    uint8_t above[2 * N], fl[24], out[2 * N + 8], want[2 * N], exa[N], ex[N], smr[N];
    uint8_t sym[N + 32], ctx[N + 32], smo[N + 32];
    uint64_t s = 7;
    for (size_t n = 0; n <= N; n++)
        for (size_t off = 0; off < 8; off++) {
            for (size_t i = 0; i < sizeof above; i++) above[i] = (uint8_t)lcg(&s);
            for (size_t i = 0; i < sizeof fl; i++) fl[i] = (uint8_t)(lcg(&s) & lcg(&s));
            for (size_t i = 0; i < N; i++)
                ex[i] = (uint8_t)lcg(&s), exa[i] = (uint8_t)lcg(&s), smr[i] = (uint8_t)lcg(&s);
            /* the rebuild: avail = the row's own count of kept elements */
            size_t avail = 0;
            for (size_t j = 0; j < n; j++) avail += !(fl[(off + j) / 8] >> ((off + j) % 8) & 1);
            uint8_t *sy = malloc(avail + 1), *sm = malloc(avail + 1);
            for (size_t i = 0; i < avail; i++) sy[i] = (uint8_t)lcg(&s), sm[i] = (uint8_t)lcg(&s);
            size_t u = 0;
            for (size_t j = 0; j < n; j++) {
                unsigned a = above[2 * j] | above[2 * j + 1] << 8, v = a;
                if (!(fl[(off + j) / 8] >> ((off + j) % 8) & 1)) {
                    unsigned e = (sy[u] + (a >> 7)) & 0xFF;
                    v = (sm[u] & 0x80u) << 8 | e << 7 | (sm[u] & 0x7Fu);
                    u++;
                }
                want[2 * j] = (uint8_t)v, want[2 * j + 1] = (uint8_t)(v >> 8);
            }
            memset(out, 0xA5, sizeof out);
            size_t used = 0, c;
            if (vbmi2)
                c = kvs_llx_row_refs_avx512vbmi2(above, fl, sizeof fl, off, sy, sm, n, out, &used);
            else
                c = kvs_llx_row_refs_avx2(above, fl, sizeof fl, off, sy, sm, avail, n, out, &used);
            size_t kept = 0;
            for (size_t j = 0; j < c; j++) kept += !(fl[(off + j) / 8] >> ((off + j) % 8) & 1);
            bad += c % step != 0 || c > n || used != kept;
            /* where the AVX2 steps stop: the row's end, or too few bytes */
            if (!vbmi2) bad += c + 16 <= n && used + 16 <= avail;
            else bad += c != n / 32 * 32;
            bad += memcmp(out, want, 2 * c) != 0;
            for (size_t i = 2 * c; i < sizeof out; i++) bad += out[i] != 0xA5;
            free(sy);
            free(sm);
            /* the split */
            memset(sym, 0xA5, sizeof sym), memset(ctx, 0xA5, sizeof ctx);
            memset(smo, 0xA5, sizeof smo);
            used = 0;
            if (vbmi2)
                c = kvs_llx_row_split_avx512vbmi2(ex, exa, smr, fl, sizeof fl, off, n, 4, sym, ctx,
                                                  smo, &used);
            else
                c = kvs_llx_row_split_avx2(ex, exa, smr, fl, sizeof fl, off, n, 4, sym, ctx, smo,
                                           &used);
            bad += c != n / step * step;
            u = 0;
            for (size_t j = 0; j < c; j++) {
                if (fl[(off + j) / 8] >> ((off + j) % 8) & 1) continue;
                bad += sym[u] != (uint8_t)(ex[j] - exa[j]) || ctx[u] != 4 || smo[u] != smr[j];
                u++;
            }
            bad += used != u;
            for (size_t i = vbmi2 ? u : c; i < sizeof sym; i++)
                bad += sym[i] != 0xA5 || ctx[i] != 0xA5 || smo[i] != 0xA5;
        }
    return bad;
}
#endif

/* The rows-with-references kernels of each SIMD set this CPU has. */
static void test_row_kernels(void)
{
#if defined(__x86_64__)
    if (kvs_cpu_features() & KVS_CPU_AVX2) CHECK_EQ_INT((int)row_kernels_bad(0), 0);
    else printf("test_row_kernels: no AVX2 here: not compared\n");
    if (kvs_cpu_features() & KVS_CPU_AVX512VBMI2) CHECK_EQ_INT((int)row_kernels_bad(1), 0);
    else printf("test_row_kernels: no AVX-512 VBMI2 here: not compared\n");
#else
    printf("test_row_kernels: not x86: nothing to compare\n");
#endif
}

/* The encoder's AVX-512 kernels (and the AVX2 search for absent keys)
 * against their definitions. */
static void test_encoder_kernels(void)
{
#if defined(__x86_64__)
    if (kvs_cpu_features() & KVS_CPU_AVX2) CHECK(first_absent_bad(0) == 0);
    else printf("test_encoder_kernels: no AVX2 here: the AVX2 search not compared\n");
    if (!kvs_rans_set_simd(1)) {
        printf("test_encoder_kernels: no AVX-512 here: nothing to compare\n");
        return;
    }
    CHECK(split_kernels_bad() == 0);
    CHECK(first_absent_bad(1) == 0);
    CHECK(flips_kernel_bad() == 0);
    CHECK(nibble_hists_bad() == 0);
    CHECK(best_candidate_bad() == 0);
    CHECK(ref_candidates_bad() == 0);
    if (kvs_cpu_features() & KVS_CPU_AVX512VBMI2) CHECK(row_diffs_bad() == 0);
    else printf("test_encoder_kernels: no AVX-512 VBMI2 here: the row pass not compared\n");
#else
    printf("test_encoder_kernels: not x86: nothing to compare\n");
#endif
}

/* The `kv` tensor of a safetensors file: its bytes (malloc'd) and shape. */
static uint8_t *read_kv(const char *path, int64_t dims[4], size_t *nbytes)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL) return NULL;
    fseek(fp, 0, SEEK_END);
    long sz = ftell(fp);
    rewind(fp);
    uint8_t *all = malloc((size_t)sz);
    uint8_t *out = NULL;
    if (fread(all, 1, (size_t)sz, fp) == (size_t)sz && sz > 8) {
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | all[i];
        json_t *j = hl <= (uint64_t)sz - 8 ? json_loadb((char *)all + 8, hl, 0, NULL) : NULL;
        json_t *kv = json_object_get(j, "kv");
        json_t *off = json_object_get(kv, "data_offsets");
        json_t *shape = json_object_get(kv, "shape");
        if (json_array_size(off) == 2 && json_array_size(shape) == 4 &&
            strcmp(json_string_value(json_object_get(kv, "dtype")), "BF16") == 0) {
            size_t a = (size_t)json_integer_value(json_array_get(off, 0));
            size_t e = (size_t)json_integer_value(json_array_get(off, 1));
            for (int i = 0; i < 4; i++) dims[i] = json_integer_value(json_array_get(shape, i));
            if (a <= e && 8 + hl + e <= (uint64_t)sz) {
                *nbytes = e - a;
                out = malloc(*nbytes);
                memcpy(out, all + 8 + hl + a, *nbytes);
            }
        }
        json_decref(j);
    }
    free(all);
    fclose(fp);
    return out;
}

static void test_kvdata(void)
{
    const char *dir = kvdata_dir();
    if (dir == NULL) {
        if (getenv("KVS_KVDATA_DIR"))
            printf("test_kvdata: skipped: KVS_KVDATA_DIR=%s is not a directory\n",
                   getenv("KVS_KVDATA_DIR"));
        else
            printf("test_kvdata: skipped: no ../shared/kvdata next to the source tree (nor "
                   "two levels up) and KVS_KVDATA_DIR unset\n");
        return;
    }
    DIR *d = opendir(dir);
    REQUIRE(d != NULL);
    struct dirent *ent;
    int files = 0;
    double raw = 0, stored_b = 0, raw8 = 0, stored8 = 0, stored_r = 0, stored_r2 = 0,
           stored_r3 = 0;
    while ((ent = readdir(d)) != NULL) {
        size_t nl = strlen(ent->d_name);
        if (nl < 12 || strcmp(ent->d_name + nl - 12, ".safetensors") != 0) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
        int64_t dims[4];
        size_t nbytes;
        uint8_t *kv = read_kv(path, dims, &nbytes);
        CHECK(kv != NULL);
        if (kv == NULL) continue;
        kvs_layout l = {0};
        REQUIRE(kvs_layout_add_group(&l, 4, dims, KVS_DTYPE_BFLOAT16) == KVS_OK);
        REQUIRE(kvs_layout_nbytes(&l) == nbytes);
        kvs_memobj *o = new_obj(&l);
        memcpy(o->data, kv, nbytes);
        size_t s1, s2, s3;
        int ok = roundtrip(BYTES_LL, o, &s1);
        if (!ok) fprintf(stderr, "%s: not bit-exact\n", ent->d_name);
        CHECK(ok);
        ok = roundtrip(RANS_LL, o, &s3);
        if (!ok) fprintf(stderr, "%s: not bit-exact through the rANS coder\n", ent->d_name);
        CHECK(ok);
        stored_r += (double)s3;
        size_t s4;
        ok = roundtrip(RANS2_LL, o, &s4);
        if (!ok) fprintf(stderr, "%s: not bit-exact through rANS level 2\n", ent->d_name);
        CHECK(ok);
        CHECK(s4 < s3); /* this model's rows repeat in part */
        stored_r2 += (double)s4;
        size_t s5;
        ok = roundtrip(RANS3_LL, o, &s5);
        if (!ok) fprintf(stderr, "%s: not bit-exact through rANS level 3\n", ent->d_name);
        CHECK(ok);
        CHECK(s5 < s4); /* K after RoPE keeps signs per channel */
        stored_r3 += (double)s5;
        CHECK(fp8_same(o));
        kvs_serde_pair p = kvs_test_serde_pair(FP8_LL);
        size_t len;
        uint8_t *b = ser(&p, o, &len);
        s2 = len;
        free(b);
        kvs_serde_pair_destroy(&p);
        raw += (double)nbytes;
        stored_b += (double)s1;
        raw8 += (double)nbytes / 2;
        stored8 += (double)s2;
        kvs_memobj_free(o);
        free(kv);
        files++;
    }
    closedir(d);
    printf("test_kvdata: %d files bit-exact; bytes + lossless %.4fx (the rANS coder %.4fx, at "
           "level 2 %.4fx, at level 3 %.4fx), fp8 + lossless %.4fx over the fp8 bytes (all "
           "layers, frame headers included)\n",
           files, raw / stored_b, raw / stored_r, raw / stored_r2, raw / stored_r3,
           raw8 / stored8);
    CHECK(raw / stored_r > 1.3);
    CHECK(files >= 1);
    CHECK(raw / stored_b > 1.3);
    CHECK(raw8 / stored8 > 1.1);
}

/* ---------------------------------------------------------------------
 * Split across a processor's workers: the same bytes, the same values
 * ------------------------------------------------------------------ */

static void split_across_workers(const char *json)
{
    kvs_layout l = {0};
    const int64_t dims[2] = {2560, 256}; /* 10 blocks of bfloat16 */
    REQUIRE(kvs_layout_add_group(&l, 2, dims, KVS_DTYPE_BFLOAT16) == KVS_OK);
    kvs_memobj *src = new_obj(&l);
    fill_rows(src, 256, 21); /* rows that repeat in part: references at rANS level 2 */
    kvs_serde_pair sync = kvs_test_serde_pair(json);
    size_t len;
    uint8_t *want = ser(&sync, src, &len);
    REQUIRE(want != NULL);
    kvs_serde_pair p2 = kvs_test_serde_pair(json);
    kvs_processor *p = NULL;
    REQUIRE(kvs_async_processor_create(p2.serializer, p2.deserializer, 2, &p) == KVS_OK);
    REQUIRE(kvs_async_processor_set_split(p, 0, 64 << 10) == KVS_OK);
    size_t est;
    REQUIRE(kvs_processor_estimate_serialized_size(p, &l, &est) == KVS_OK);
    kvs_layout bl = flat(est, KVS_DTYPE_UINT8);
    kvs_memobj *blob = new_obj(&bl), *back = new_obj(&l);
    for (int round = 0; round < 4; round++) {
        kvs_task_id id;
        kvs_task_result r;
        REQUIRE(kvs_processor_submit_serialize(p, &src, 1, &blob, 1, NULL, &id) == KVS_OK);
        REQUIRE(kvs_test_proc_wait(p, 1, id, &r) == KVS_OK);
        CHECK(r.state == KVS_TASK_OK);
        CHECK(blob->used_size == len && memcmp(blob->data, want, len) == 0);
        memset(back->data, 0, back->capacity);
        REQUIRE(kvs_processor_submit_deserialize(p, &blob, 1, &back, 1, NULL, &id) == KVS_OK);
        REQUIRE(kvs_test_proc_wait(p, 0, id, &r) == KVS_OK);
        CHECK(r.state == KVS_TASK_OK);
        CHECK(memcmp(back->data, src->data, (size_t)kvs_layout_nbytes(&l)) == 0);
    }
    kvs_processor_destroy(p);
    kvs_memobj_free(blob);
    kvs_memobj_free(back);
    kvs_memobj_free(src);
    free(want);
    kvs_serde_pair_destroy(&sync);
}

static void test_split_across_workers(void)
{
    split_across_workers(BYTES_LL);
    split_across_workers(RANS_LL);
    split_across_workers(RANS2_LL);
    split_across_workers(RANS3_LL);
}

int main(void)
{
    RUN(test_adversarial_roundtrips);
    RUN(test_shapes_and_fp8);
    RUN(test_config_refused);
    RUN(test_stage_refusals);
    RUN(test_frame_damage);
    RUN(test_split_across_workers);
    RUN(test_old_frames);
    RUN(test_rans_payload);
    RUN(test_rans_refs_roundtrips);
    RUN(test_sampled_histograms);
    RUN(test_rans_refs_payload);
    RUN(test_rans_signs_roundtrips);
    RUN(test_rans_signs_payload);
    RUN(test_rans_isas);
    RUN(test_rans_damaged_pair);
    RUN(test_direct_refusals);
    RUN(test_mantissa_kernels);
    RUN(test_encoder_kernels);
    RUN(test_row_kernels);
    RUN(test_kvdata);
    return TEST_SUMMARY();
}
