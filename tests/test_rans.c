/* test_rans.c - the rANS coder (src/codecs/rans.c): normalisation, the
 * table form (exact bytes, refusals), round trips of every length around
 * the 32-lane groups with one and four contexts and skewed, uniform and
 * one-symbol tables, contexts above the last table, the scalar, AVX2 and
 * AVX-512 kernels (each this CPU runs) writing the same stream and reading
 * each other's, the encoder's refusals, and the decoder's refusal of
 * truncated, extended and damaged streams. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/rans.h"
#include "codecs/rans_kernels.h"
#include "kvs_test.h"
#include "kvserde/error.h"

static const char *const isa_name[] = {"scalar", "avx2", "avx512"};

/* Use the kernel set isa from now on; whether this CPU runs it (if not,
 * the set in use is another, and the caller skips it). */
static int use_isa(int isa)
{
    return kvs_rans_set_isa(isa) == isa;
}

/* The SIMD sets this CPU runs, for the tests that compare them with the
 * scalar one; prints what it skips. */
static int simd_isas(const char *test, int isas[2])
{
    int k = 0;
    for (int isa = KVS_RANS_AVX2; isa <= KVS_RANS_AVX512; isa++)
        if (use_isa(isa)) isas[k++] = isa;
        else printf("%s: no %s here: not compared\n", test, isa_name[isa]);
    return k;
}

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static unsigned freq_sum(const kvs_rans_freqs *t)
{
    unsigned s = 0;
    for (int i = 0; i < 256; i++) s += t->f[i];
    return s;
}

static void test_normalize(void)
{
    uint32_t c[256] = {0};
    kvs_rans_freqs t;
    kvs_rans_normalize(c, &t); /* nothing counted: symbol 0 takes all */
    CHECK_EQ_INT(t.f[0], KVS_RANS_TOTAL);
    CHECK_EQ_INT(freq_sum(&t), KVS_RANS_TOTAL);
    /* ... costing nothing but its form's 4 bytes */
    CHECK(kvs_rans_normalize_estimate(c, &t) == 32.0 && t.f[0] == KVS_RANS_TOTAL);
    c[7] = 5;
    kvs_rans_normalize(c, &t);
    CHECK_EQ_INT(t.f[7], KVS_RANS_TOTAL);
    CHECK_EQ_INT(freq_sum(&t), KVS_RANS_TOTAL);
    c[7] = 3, c[8] = 1;
    kvs_rans_normalize(c, &t);
    CHECK_EQ_INT(t.f[7], KVS_RANS_TOTAL / 4 * 3);
    CHECK_EQ_INT(t.f[8], KVS_RANS_TOTAL / 4);
    /* 128 rare and 128 common symbols: rounding the rare ones up to 1
     * overspends more than any one frequency can give back */
    for (int s = 0; s < 256; s++) c[s] = s < 128 ? 1 : 100000;
    kvs_rans_normalize(c, &t);
    CHECK_EQ_INT(freq_sum(&t), KVS_RANS_TOTAL);
    int ok = 1;
    for (int s = 0; s < 256; s++) ok &= t.f[s] >= 1;
    CHECK(ok);
    /* every symbol once */
    for (int s = 0; s < 256; s++) c[s] = 1;
    kvs_rans_normalize(c, &t);
    for (int s = 0; s < 256; s++) ok &= t.f[s] == KVS_RANS_TOTAL / 256;
    CHECK(ok);
    /* the cost: 1 bit for each of two even symbols, infinite-ish without a code */
    memset(c, 0, sizeof c);
    c[1] = c[2] = 10;
    kvs_rans_normalize(c, &t);
    CHECK(kvs_rans_cost_bits(c, &t) == 20.0);
    c[3] = 1;
    CHECK(kvs_rans_cost_bits(c, &t) >= 1e9);
}

/* Largest remainders as their definition reads (one scan for the largest
 * fraction per unit left, the lower symbol first among equal ones), what
 * kvs_rans_normalize must give on every input. */
static void normalize_ref(const uint32_t count[256], uint16_t f[256])
{
    uint64_t total = 0, rem[256];
    for (int s = 0; s < 256; s++) total += count[s];
    memset(f, 0, 256 * sizeof f[0]);
    if (total == 0) {
        f[0] = KVS_RANS_TOTAL;
        return;
    }
    int sum = 0;
    for (int s = 0; s < 256; s++) {
        uint64_t q = (uint64_t)count[s] * KVS_RANS_TOTAL;
        f[s] = (uint16_t)(count[s] == 0 ? 0 : q / total ? q / total : 1);
        rem[s] = count[s] && q / total ? q % total : 0;
        sum += f[s];
    }
    for (int d = (int)KVS_RANS_TOTAL - sum; d > 0; d--) {
        int best = 0;
        for (int s = 1; s < 256; s++)
            if (rem[s] > rem[best]) best = s;
        f[best]++;
        rem[best] = 0;
    }
    for (int d = (int)KVS_RANS_TOTAL - sum; d < 0;) {
        int big = 0;
        for (int s = 1; s < 256; s++)
            if (f[s] > f[big]) big = s;
        int take = (f[big] + 7) / 8;
        if (take > f[big] - 1) take = f[big] - 1;
        if (take > -d) take = -d;
        f[big] = (uint16_t)(f[big] - take);
        d += take;
    }
}

/* kvs_rans_normalize against normalize_ref: 3000 random count vectors,
 * sparse and dense, counts of 1 beside large ones (rounded up, then taken
 * back), equal counts (equal fractions), totals from 1 to about 2^40; and
 * kvs_rans_normalize_estimate against the table, cost and size apart. */
static void test_normalize_definition(void)
{
    uint64_t s = 99;
    int bad = 0;
    for (int n = 0; n < 3000; n++) {
        uint32_t c[256] = {0};
        unsigned used = 1 + (unsigned)(lcg(&s) % 256), form = (unsigned)(lcg(&s) % 4);
        for (unsigned j = 0; j < used; j++) {
            unsigned sym = (unsigned)(lcg(&s) % 256);
            uint32_t v = form == 0   ? (uint32_t)(lcg(&s) % 100)
                         : form == 1 ? (lcg(&s) % 3 ? 1u : (uint32_t)(lcg(&s) % 1000000))
                         : form == 2 ? 7u
                                     : (uint32_t)lcg(&s);
            c[sym] = v;
        }
        kvs_rans_freqs t;
        uint16_t want[256];
        kvs_rans_normalize(c, &t);
        normalize_ref(c, want);
        if (memcmp(t.f, want, sizeof want) != 0 && bad++ < 3)
            fprintf(stderr, "normalize: vector %d (form %u, %u symbols) differs\n", n, form, used);
        /* the estimate: the same table, its cost and form's bytes */
        kvs_rans_freqs te;
        double est = kvs_rans_normalize_estimate(c, &te);
        double bits = kvs_rans_cost_bits(c, &t) + 8.0 * (double)kvs_rans_freqs_size(&t);
        if ((memcmp(&te, &t, sizeof t) != 0 || est != bits) && bad++ < 3)
            fprintf(stderr, "normalize_estimate: vector %d: %.3f bits, %.3f apart\n", n, est,
                    bits);
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_table_form(void)
{
    kvs_rans_freqs t = {{0}}, back;
    t.f[3] = 1000, t.f[4] = 0, t.f[5] = 24;
    uint8_t form[KVS_RANS_FREQS_MAX];
    size_t n = kvs_rans_freqs_write(&t, form);
    static const uint8_t want[] = {3, 5, 0x83, 0xE8, 0, 24};
    CHECK_EQ_INT((int)n, (int)sizeof want);
    CHECK_EQ_INT((int)kvs_rans_freqs_size(&t), (int)sizeof want);
    CHECK(memcmp(form, want, sizeof want) == 0);
    size_t used = 0;
    CHECK_OK(kvs_rans_freqs_read(form, n + 3, "t", &back, &used));
    CHECK_EQ_INT((int)used, (int)n);
    CHECK(memcmp(&t, &back, sizeof t) == 0);
    /* one symbol with all 1024 slots: two bytes */
    kvs_rans_freqs u = {{0}};
    u.f[255] = KVS_RANS_TOTAL;
    n = kvs_rans_freqs_write(&u, form);
    CHECK_EQ_INT((int)n, 4);
    CHECK_EQ_INT((int)kvs_rans_freqs_size(&u), 4);
    CHECK(form[0] == 255 && form[1] == 255 && form[2] == 0x84 && form[3] == 0);
    CHECK_OK(kvs_rans_freqs_read(form, n, "t", &back, &used));
    CHECK(memcmp(&u, &back, sizeof u) == 0);
    /* the size alone is the form's on tables of 1 to 256 symbols, of
     * frequencies on both sides of the two-byte threshold (127, 128) */
    uint64_t seed = 5;
    for (int trial = 0; trial < 500; trial++) {
        kvs_rans_freqs r = {{0}};
        unsigned left = KVS_RANS_TOTAL, lo = (unsigned)(lcg(&seed) % 256);
        for (unsigned s = lo; s < 256 && left; s++) {
            unsigned f = trial % 2 ? 127 + (unsigned)(lcg(&seed) % 3) : (unsigned)(lcg(&seed) % 9);
            f = f > left || s == 255 ? left : f;
            r.f[s] = (uint16_t)f;
            left -= f;
        }
        if (left) r.f[lo] = (uint16_t)(r.f[lo] + left);
        if (kvs_rans_freqs_size(&r) != kvs_rans_freqs_write(&r, form))
            KVS_FAIL_("trial %d: size %zu, form %zu bytes", trial, kvs_rans_freqs_size(&r),
                      kvs_rans_freqs_write(&r, form));
    }

    CHECK_ERR(kvs_rans_freqs_read(want, 1, "t", &back, &used), KVS_ECORRUPT,
              "t: frequency table truncated (1 of 2 bytes)");
    for (size_t k = 2; k < sizeof want; k++)
        CHECK(kvs_rans_freqs_read(want, k, "t", &back, &used) == KVS_ECORRUPT);
    CHECK_ERR(kvs_rans_freqs_read(want, 3, "t", &back, &used), KVS_ECORRUPT,
              "t: frequency table truncated at symbol 3 of 3-5");
    static const uint8_t swapped[] = {5, 3, 1};
    CHECK_ERR(kvs_rans_freqs_read(swapped, 3, "t", &back, &used), KVS_ECORRUPT,
              "t: frequency table from symbol 5 to 3");
    static const uint8_t short_sum[] = {3, 5, 0x83, 0xE8, 0, 23};
    CHECK_ERR(kvs_rans_freqs_read(short_sum, 6, "t", &back, &used), KVS_ECORRUPT,
              "t: frequencies sum to 1023, expected 1024");
    static const uint8_t too_big[] = {0, 0, 0x84, 0x01};
    CHECK_ERR(kvs_rans_freqs_read(too_big, 4, "t", &back, &used), KVS_ECORRUPT,
              "t: symbol 0 has frequency 1025, above the total 1024");
}

enum dist { SKEWED, UNIFORM, ONE_SYMBOL, RARE };

/* n symbols of `dist` in up to nctx contexts, and their tables. */
static void make_data(enum dist d, unsigned nctx, size_t n, uint64_t seed, uint8_t *sym,
                      uint8_t *ctx, kvs_rans_freqs *t)
{
    uint32_t c[KVS_RANS_MAX_CTX][256];
    memset(c, 0, sizeof c);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        unsigned cx = (unsigned)(lcg(&s) % nctx);
        uint8_t v;
        switch (d) {
        case SKEWED: v = (uint8_t)(120 + cx * 3 + (lcg(&s) % 7) * (lcg(&s) % 3)); break;
        case UNIFORM: v = (uint8_t)lcg(&s); break;
        case ONE_SYMBOL: v = 0xAB; break;
        default: v = lcg(&s) % 1000 ? 0 : (uint8_t)(1 + lcg(&s) % 255); break;
        }
        sym[i] = v;
        ctx[i] = (uint8_t)cx;
        c[cx][v]++;
    }
    for (unsigned j = 0; j < nctx; j++) kvs_rans_normalize(c[j], &t[j]);
}

/* Encode and decode; 1 if exact. *out, *m: the stream (malloc'd). */
static int rt(const kvs_rans_freqs *t, unsigned nctx, const uint8_t *sym, const uint8_t *ctx,
              size_t n, uint8_t **out, size_t *m)
{
    static kvs_rans_enc_tables e;
    static kvs_rans_dec_tables d;
    kvs_rans_enc_init(&e, t, nctx);
    kvs_rans_dec_init(&d, t, nctx);
    size_t cap = kvs_rans_bound(n);
    *out = malloc(cap);
    if (kvs_rans_encode(&e, sym, nctx > 1 ? ctx : NULL, n, *out, cap, m) != KVS_OK) return 0;
    if (*m > cap) return 0;
    uint8_t *back = malloc(n + 1);
    int ok = kvs_rans_decode(&d, *out, *m, nctx > 1 ? ctx : NULL, back, n, "t") == KVS_OK &&
             memcmp(back, sym, n) == 0;
    free(back);
    return ok;
}

static void test_roundtrips(void)
{
    static const size_t sizes[] = {0, 1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 1000, 4097,
                                   65536, 65536 + 31};
    uint8_t *sym = malloc(65536 + 64), *ctx = malloc(65536 + 64);
    kvs_rans_freqs t[KVS_RANS_MAX_CTX];
    int cases = 0, isas = 0;
    for (int isa = KVS_RANS_SCALAR; isa <= KVS_RANS_AVX512; isa++) {
        if (!use_isa(isa)) continue;
        isas++;
        for (int d = SKEWED; d <= RARE; d++)
            /* 1, 4-8 (the lossless stage's), and the most (the coefficient coder's) */
            for (unsigned nctx = 1; nctx <= KVS_RANS_MAX_CTX;
                 nctx += nctx == 1 ? 3 : nctx == 8 ? KVS_RANS_MAX_CTX - 8 : 1)
                for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
                    make_data((enum dist)d, nctx, sizes[z], sizes[z] * 7 + (size_t)d, sym, ctx,
                              t);
                    uint8_t *out = NULL;
                    size_t m = 0;
                    int ok = rt(t, nctx, sym, ctx, sizes[z], &out, &m);
                    if (!ok)
                        KVS_FAIL_("%s dist %d contexts %u, %zu symbols", isa_name[isa], d,
                                  nctx, sizes[z]);
                    if (d == ONE_SYMBOL) CHECK_EQ_INT((int)m, 4 * KVS_RANS_LANES);
                    if (d == UNIFORM && sizes[z] >= 4097)
                        if (m > 4 * KVS_RANS_LANES + sizes[z] + 8) KVS_FAIL_("uniform %zu -> %zu", sizes[z], m);
                    free(out);
                    cases++;
                }
    }
    CHECK(isas >= 1);
    CHECK_EQ_INT(cases, isas * 4 * 7 * (int)(sizeof sizes / sizeof sizes[0])); /* nctx 1, 4-8, 64 */
    kvs_rans_set_simd(1);
    free(sym);
    free(ctx);
}

/* Each SIMD set against the scalar one, with one context (none given) and
 * four: the same stream, and each decodes the other's. */
static void test_kernels_agree(void)
{
    int isas[2], nisa = simd_isas("test_kernels_agree", isas);
    size_t n = 3 * 65536 + 17;
    uint8_t *sym = malloc(n), *ctx = malloc(n), *back = malloc(n);
    kvs_rans_freqs t[KVS_RANS_MAX_CTX];
    for (int c = 0; c < 2 * nisa; c++)
        for (int d = SKEWED; d <= RARE; d++) {
            int k = c / 2;
            unsigned nctx = c % 2 ? 4 : 1;
            make_data((enum dist)d, nctx, n, 99 + (uint64_t)d, sym, ctx, t);
            uint8_t *a = NULL, *b = NULL;
            size_t ma = 0, mb = 0;
            use_isa(KVS_RANS_SCALAR);
            CHECK(rt(t, nctx, sym, ctx, n, &a, &ma));
            use_isa(isas[k]);
            CHECK(rt(t, nctx, sym, ctx, n, &b, &mb));
            CHECK(ma == mb && memcmp(a, b, ma) == 0);
            kvs_rans_dec_tables *dt = malloc(sizeof *dt);
            kvs_rans_dec_init(dt, t, nctx);
            use_isa(KVS_RANS_SCALAR);
            CHECK(kvs_rans_decode(dt, b, mb, nctx > 1 ? ctx : NULL, back, n, "t") == KVS_OK &&
                  memcmp(back, sym, n) == 0);
            use_isa(isas[k]);
            CHECK(kvs_rans_decode(dt, a, ma, nctx > 1 ? ctx : NULL, back, n, "t") == KVS_OK &&
                  memcmp(back, sym, n) == 0);
            free(dt);
            free(a);
            free(b);
        }
    kvs_rans_set_simd(1);
    free(sym);
    free(ctx);
    free(back);
}

/* Tables built while one set is in use and coded by another: the SIMD
 * encoders read a wide form of the tables (rans.h) that only a build
 * under them fills, and take the scalar loop when it is missing; either
 * way the stream is the scalar set's, for both directions of the switch. */
static void test_tables_across_sets(void)
{
    int isas[2], nisa = simd_isas("test_tables_across_sets", isas);
    size_t n = 65536 + 21;
    uint8_t *sym = malloc(n), *ctx = malloc(n);
    kvs_rans_freqs t[KVS_RANS_MAX_CTX];
    make_data(SKEWED, 4, n, 5, sym, ctx, t);
    static kvs_rans_enc_tables e;
    size_t cap = kvs_rans_bound(n), ma = 0, mb = 0;
    uint8_t *a = malloc(cap), *b = malloc(cap);
    use_isa(KVS_RANS_SCALAR);
    kvs_rans_enc_init(&e, t, 4);
    CHECK_OK(kvs_rans_encode(&e, sym, ctx, n, a, cap, &ma));
    for (int k = 0; k < nisa; k++) {
        /* built under the scalar set (into a cleared struct: no wide
         * form left from an earlier build), coded under a SIMD one */
        memset(&e, 0, sizeof e);
        use_isa(KVS_RANS_SCALAR);
        kvs_rans_enc_init(&e, t, 4);
        use_isa(isas[k]);
        CHECK_OK(kvs_rans_encode(&e, sym, ctx, n, b, cap, &mb));
        CHECK(ma == mb && memcmp(a, b, ma) == 0);
        /* built under a SIMD set, coded under the scalar one */
        kvs_rans_enc_init(&e, t, 4);
        use_isa(KVS_RANS_SCALAR);
        CHECK_OK(kvs_rans_encode(&e, sym, ctx, n, b, cap, &mb));
        CHECK(ma == mb && memcmp(a, b, ma) == 0);
    }
    kvs_rans_set_simd(1);
    free(sym);
    free(ctx);
    free(a);
    free(b);
}

/* kvs_rans_encode_tail, on every set this CPU runs: the stream
 * kvs_rans_encode writes, left at the end of the buffer (its offset the
 * buffer less the stream), whether it warms nothing, ranges shorter than
 * the groups reach or longer, or only a range to write (windowed tables,
 * with 4 contexts, and the gathered ones with 64; symbol counts with and
 * without a tail group, and odd and even group counts); and the same
 * refusals. */
static void test_encode_tail(void)
{
    static const size_t sizes[] = {0, 1, 31, 32, 33, 95, 1000, 4096 + 7, 65536 + 64};
    static const unsigned nctxs[] = {4, KVS_RANS_MAX_CTX};
    size_t nmax = 65536 + 64, cap = kvs_rans_bound(nmax);
    uint8_t *sym = malloc(nmax), *ctx = malloc(nmax), *a = malloc(cap), *b = malloc(cap);
    uint8_t *warm = malloc(1 << 20);
    memset(warm, 0x5C, 1 << 20);
    size_t at = 0;
    static kvs_rans_enc_tables e;
    kvs_rans_freqs t[KVS_RANS_MAX_CTX];
    int cases = 0;
    for (int isa = KVS_RANS_SCALAR; isa <= KVS_RANS_AVX512; isa++) {
        if (!use_isa(isa)) {
            printf("test_encode_tail: no %s here: not run\n", isa_name[isa]);
            continue;
        }
        for (size_t q = 0; q < sizeof nctxs / sizeof nctxs[0]; q++)
            for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
                size_t n = sizes[z], ma = 0;
                make_data(SKEWED, nctxs[q], n ? n : 1, 11 * n + q, sym, ctx, t);
                kvs_rans_enc_init(&e, t, nctxs[q]);
                CHECK_OK(kvs_rans_encode(&e, sym, ctx, n, a, cap, &ma));
                /* none, empty ranges, short ones, long ones, one to write */
                const kvs_rans_warm warms[4] = {{warm, 0, warm, 0},
                                                {warm, 100, warm + 4096, 100},
                                                {warm, 1 << 20, warm, 1 << 20},
                                                {NULL, 0, warm + 64, 12345}};
                for (int v = 0; v < 5; v++) {
                    memset(b, 0xEE, cap);
                    const kvs_rans_warm *wv = v ? &warms[v - 1] : NULL;
                    CHECK_OK(kvs_rans_encode_tail(&e, sym, ctx, n, b, cap, wv, &at));
                    if (cap - at != ma || memcmp(b + at, a, ma) != 0)
                        KVS_FAIL_("%s, %u contexts, %zu symbols, warm %d: %zu bytes at %zu, "
                                  "kvs_rans_encode's %zu", isa_name[isa], nctxs[q], n, v,
                                  cap - at, at, ma);
                    cases++;
                }
            }
        /* the refusals: a short buffer, a symbol without a code */
        make_data(SKEWED, 4, 1000, 5, sym, ctx, t);
        kvs_rans_enc_init(&e, t, 4);
        const kvs_rans_warm all = {warm, 1 << 20, warm, 1 << 20};
        CHECK_ERR(kvs_rans_encode_tail(&e, sym, ctx, 1000, b, kvs_rans_bound(1000) - 1, &all, &at),
                  KVS_ENOSPC, "rans: output holds 2129 bytes, 1000 symbols need 2130");
        t[ctx[500]].f[sym[500]] = 0;
        t[ctx[500]].f[(uint8_t)(sym[500] + 1)]++;
        kvs_rans_enc_init(&e, t, 4);
        size_t first = 0; /* the first symbol of that context and value */
        while (ctx[first] != ctx[500] || sym[first] != sym[500]) first++;
        char msg[120];
        snprintf(msg, sizeof msg,
                 "rans: symbol %u at %zu has frequency 0 in the table of context %u", sym[500],
                 first, ctx[500]);
        CHECK_ERR(kvs_rans_encode_tail(&e, sym, ctx, 1000, b, cap, &all, &at),
                  KVS_EINVAL, msg);
    }
    CHECK(cases >= 2 * 9 * 5);
    kvs_rans_set_simd(1);
    free(sym);
    free(ctx);
    free(a);
    free(b);
    free(warm);
}

/* The AVX-512 encoder's byte form (rans.h): taken when every context's
 * coded symbols fit a window of 256 >> ceil(log2 nctx) symbols, also one
 * that wraps past 255, and not when one needs a symbol more or there are
 * more than 8 contexts; either way the stream is the scalar set's, and a
 * symbol outside its window (frequency 0) is refused as by the scalar
 * set. Group counts odd and even (an odd top group goes by the gathers). */
static void test_window_tables(void)
{
    if (!use_isa(KVS_RANS_AVX512)) {
        printf("test_window_tables: no avx512 here: skipped\n");
        kvs_rans_set_simd(1);
        return;
    }
    static const unsigned nctxs[] = {1, 2, 3, 4, 5, 8, 9};
    static const size_t sizes[] = {32, 64, 96, 65536 + 32 * 3 + 5};
    size_t nmax = 65536 + 32 * 3 + 5, cap = kvs_rans_bound(nmax);
    uint8_t *sym = malloc(nmax), *ctx = malloc(nmax), *a = malloc(cap), *b = malloc(cap),
            *back = malloc(nmax);
    static kvs_rans_enc_tables e;
    static kvs_rans_dec_tables d;
    kvs_rans_freqs t[KVS_RANS_MAX_CTX];
    int windowed = 0, gathered = 0;
    for (size_t q = 0; q < sizeof nctxs / sizeof nctxs[0]; q++)
        for (unsigned extra = 0; extra < 2; extra++)
            for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
                unsigned nctx = nctxs[q], lg = 0;
                while ((1u << lg) < nctx) lg++;
                unsigned w = nctx > 8 ? 32 : 256u >> lg, span = w + extra > 256 ? 256 : w + extra;
                size_t n = sizes[z];
                uint64_t seed = 7 * n + nctx + extra;
                uint32_t count[KVS_RANS_MAX_CTX][256];
                memset(count, 0, sizeof count);
                /* context c's symbols: span values from 256 - span / 2 + 37 c
                 * (mod 256; context 0 wraps), the two ends always present */
                for (size_t i = 0; i < n; i++) {
                    unsigned c = (unsigned)(lcg(&seed) % nctx);
                    unsigned at = i < 2 * nctx ? (i / nctx ? span - 1 : 0)
                                               : (unsigned)(lcg(&seed) % span);
                    if (i < 2 * nctx) c = (unsigned)(i % nctx);
                    sym[i] = (uint8_t)(256 - span / 2 + 37 * c + at);
                    ctx[i] = (uint8_t)c;
                    count[c][sym[i]]++;
                }
                for (unsigned c = 0; c < nctx; c++) kvs_rans_normalize(count[c], &t[c]);
                size_t ma = 0, mb = 0;
                use_isa(KVS_RANS_SCALAR);
                kvs_rans_enc_init(&e, t, nctx);
                CHECK_OK(kvs_rans_encode(&e, sym, nctx > 1 ? ctx : NULL, n, a, cap, &ma));
                use_isa(KVS_RANS_AVX512);
                kvs_rans_enc_init(&e, t, nctx);
                int want = nctx <= 8 && span <= w;
                if ((int)e.win_ok != want)
                    KVS_FAIL_("%u contexts, spans of %u: byte form %u, expected %d", nctx, span,
                              e.win_ok, want);
                windowed += want, gathered += !want;
                CHECK_OK(kvs_rans_encode(&e, sym, nctx > 1 ? ctx : NULL, n, b, cap, &mb));
                if (ma != mb || memcmp(a, b, ma) != 0)
                    KVS_FAIL_("%u contexts, spans of %u, %zu symbols: not the scalar stream",
                              nctx, span, n);
                kvs_rans_dec_init(&d, t, nctx);
                CHECK(kvs_rans_decode(&d, b, mb, nctx > 1 ? ctx : NULL, back, n, "t") == KVS_OK &&
                      memcmp(back, sym, n) == 0);
                if (want && nctx > 1 && span < 256 && n >= 96) {
                    /* one symbol just outside its context's window, in a
                     * group the byte form codes: no code */
                    uint8_t keep = sym[n - 40];
                    sym[n - 40] = (uint8_t)(256 - span / 2 + 37 * ctx[n - 40] + span);
                    char msg[120];
                    snprintf(msg, sizeof msg,
                             "rans: symbol %u at %zu has frequency 0 in the table of context %u",
                             sym[n - 40], n - 40, ctx[n - 40]);
                    CHECK_ERR(kvs_rans_encode(&e, sym, ctx, n, b, cap, &mb), KVS_EINVAL, msg);
                    sym[n - 40] = keep;
                }
            }
    /* one context has a window of all 256 symbols, so a span above it is
     * windowed too */
    CHECK_EQ_INT(windowed, 7 * 4);
    CHECK_EQ_INT(gathered, 7 * 4);
    kvs_rans_set_simd(1);
    free(sym);
    free(ctx);
    free(a);
    free(b);
    free(back);
}

/* Two streams at once (kvs_rans_decode2, the pair kernels): each stream's
 * symbols are its own decode's, for every kernel set and for streams of
 * different lengths (the pair loop stops at the shorter and the longer
 * goes on alone); each SIMD set's pairs leave each run's states, words and
 * count as the scalar set's do; a damaged stream, either one, is
 * refused. */
static void test_pair_decode(void)
{
    static const size_t sizes[2][4] = {{65536 + 17, 100, 31, 81920}, {65536, 70000, 33, 81920}};
    kvs_rans_freqs t[2][KVS_RANS_MAX_CTX];
    kvs_rans_dec_tables *dt = malloc(2 * sizeof *dt);
    uint8_t *sym[2], *ctx[2], *back[2], *ref[2], *out[2];
    size_t m[2];
    for (int s = 0; s < 2; s++) {
        sym[s] = malloc(81920), ctx[s] = malloc(81920), back[s] = malloc(81920);
        ref[s] = malloc(81920);
    }
    int isas[2], nisa = simd_isas("test_pair_decode", isas);
    for (size_t z = 0; z < 4; z++) {
        for (int s = 0; s < 2; s++) {
            size_t n = sizes[s][z];
            /* other tables and contexts per stream: a pairing that mixed them up fails */
            make_data(s ? UNIFORM : SKEWED, s ? 4 : 6, n, 5 + z * 2 + (size_t)s, sym[s], ctx[s],
                      t[s]);
            CHECK(rt(t[s], s ? 4 : 6, sym[s], ctx[s], n, &out[s], &m[s]));
            kvs_rans_dec_init(&dt[s], t[s], s ? 4 : 6);
        }
        for (int isa = KVS_RANS_SCALAR; isa <= KVS_RANS_AVX512; isa++) {
            if (!use_isa(isa)) continue;
            kvs_rans_dec_job job[2];
            for (int s = 0; s < 2; s++) {
                memset(back[s], 0, 81920);
                /* the second stream warms its destination and its symbols
                 * (the same symbols either way) */
                kvs_rans_warm warm = {s ? sym[s] : NULL, s ? sizes[s][z] : 0,
                                      s ? back[s] : NULL, s ? sizes[s][z] : 0};
                job[s] = (kvs_rans_dec_job){&dt[s], out[s], m[s],        ctx[s],
                                            back[s], sizes[s][z], "t", warm};
            }
            CHECK_OK(kvs_rans_decode2(job));
            for (int s = 0; s < 2; s++) CHECK(memcmp(back[s], sym[s], sizes[s][z]) == 0);
            /* the streams swapped: still each its own */
            kvs_rans_dec_job swapped[2] = {job[1], job[0]};
            CHECK_OK(kvs_rans_decode2(swapped));
            for (int s = 0; s < 2; s++) CHECK(memcmp(back[s], sym[s], sizes[s][z]) == 0);
            /* either stream's last word damaged: refused, naming it */
            for (int s = 0; s < 2; s++) {
                out[s][m[s] - 1] ^= 0x40;
                job[s].what = "damaged";
                int rc = kvs_rans_decode2(job);
                CHECK(rc == KVS_ECORRUPT && strncmp(kvs_last_error(), "damaged", 7) == 0);
                job[s].what = "t";
                out[s][m[s] - 1] ^= 0x40;
            }
        }
        for (int v = 0; v < nisa; v++) {
            /* the pair kernels themselves */
            uint32_t x[2][2][KVS_RANS_LANES];
            kvs_rans_dec_run run[2][2];
            for (int k = 0; k < 2; k++)
                for (int s = 0; s < 2; s++) {
                    for (int l = 0; l < KVS_RANS_LANES; l++)
                        x[k][s][l] = (uint32_t)out[s][4 * l] | (uint32_t)out[s][4 * l + 1] << 8 |
                                     (uint32_t)out[s][4 * l + 2] << 16 |
                                     (uint32_t)out[s][4 * l + 3] << 24;
                    run[k][s] = (kvs_rans_dec_run){&dt[s],         x[k][s], out[s] + 4 * KVS_RANS_LANES,
                                                   out[s] + m[s],  ctx[s],  k ? back[s] : ref[s],
                                                   sizes[s][z],    0,       {NULL, 0, NULL, 0}};
                }
            use_isa(KVS_RANS_SCALAR);
            kvs_rans_dec_groups2(run[0]);
            use_isa(isas[v]);
            kvs_rans_dec_groups2(run[1]);
            for (int s = 0; s < 2; s++) {
                CHECK(run[0][s].done == run[1][s].done && run[0][s].p == run[1][s].p);
                CHECK(memcmp(x[0][s], x[1][s], sizeof x[0][s]) == 0);
                CHECK(memcmp(ref[s], back[s], run[0][s].done) == 0);
                /* the groups run while a whole one and 64 bytes of words remain */
                CHECK(run[0][s].done > 0 || sizes[s][z] < KVS_RANS_LANES ||
                      m[s] < 4 * KVS_RANS_LANES + 2 * KVS_RANS_LANES);
            }
        }
        free(out[0]);
        free(out[1]);
    }
    kvs_rans_set_simd(1);
    for (int s = 0; s < 2; s++) {
        free(sym[s]);
        free(ctx[s]);
        free(back[s]);
        free(ref[s]);
    }
    free(dt);
}

/* The AVX-512 decoder's two forms of its product (paired vpmuludq, as on
 * Intel's cores, and vpmulld, as on AMD's): each decodes the scalar set's
 * streams to their symbols, alone and in pairs, for one context, the
 * lossless stage's 4 and the coefficient coder's 64; and a damaged word
 * gives what the scalar decoder gives (the same status and symbols).
 * A form that took a wrong frequency or dropped a lane's product fails. */
static void test_dec_products(void)
{
    if (!use_isa(KVS_RANS_AVX512)) {
        printf("test_dec_products: no avx512 here: skipped\n");
        return;
    }
    size_t n = 65536 + 17;
    uint8_t *sym = malloc(n), *ctx = malloc(n), *back = malloc(n), *ref = malloc(n);
    kvs_rans_freqs t[KVS_RANS_MAX_CTX];
    kvs_rans_dec_tables *dt = malloc(sizeof *dt);
    static const unsigned nctxs[] = {1, 4, KVS_RANS_MAX_CTX};
    int cases = 0;
    for (int d = SKEWED; d <= RARE; d++)
        for (int c = 0; c < 3; c++) {
            unsigned nctx = nctxs[c];
            const uint8_t *cx = nctx > 1 ? ctx : NULL;
            make_data((enum dist)d, nctx, n, 31 + (uint64_t)(d * 3 + c), sym, ctx, t);
            uint8_t *s = NULL;
            size_t m = 0;
            use_isa(KVS_RANS_SCALAR);
            CHECK(rt(t, nctx, sym, ctx, n, &s, &m));
            kvs_rans_dec_init(dt, t, nctx);
            size_t k = 4 * KVS_RANS_LANES + (m - 4 * KVS_RANS_LANES) / 3; /* a word to damage */
            s[k] ^= 0x21;
            int ref_rc = kvs_rans_decode(dt, s, m, cx, ref, n, "t");
            s[k] ^= 0x21;
            for (int form = 0; form < 2; form++) {
                use_isa(KVS_RANS_AVX512);
                kvs_rans_set_dec_mullo(form);
                memset(back, 0, n);
                CHECK(kvs_rans_decode(dt, s, m, cx, back, n, "t") == KVS_OK &&
                      memcmp(back, sym, n) == 0);
                uint8_t *back2 = malloc(n);
                kvs_rans_dec_job job[2] = {{dt, s, m, cx, back, n, "t", {NULL, 0, NULL, 0}},
                                           {dt, s, m, cx, back2, n, "t", {NULL, 0, back2, n}}};
                memset(back, 0, n);
                CHECK(kvs_rans_decode2(job) == KVS_OK && memcmp(back, sym, n) == 0 &&
                      memcmp(back2, sym, n) == 0);
                free(back2);
                s[k] ^= 0x21;
                int rc = kvs_rans_decode(dt, s, m, cx, back, n, "t");
                CHECK_EQ_INT(rc, ref_rc);
                if (rc == KVS_OK) CHECK(memcmp(back, ref, n) == 0);
                s[k] ^= 0x21;
                cases++;
            }
            free(s);
        }
    CHECK_EQ_INT(cases, 4 * 3 * 2);
    kvs_rans_set_dec_mullo(-1);
    kvs_rans_set_simd(1);
    free(dt);
    free(sym);
    free(ctx);
    free(back);
    free(ref);
}

/* The decoder's tables built by each SIMD fill (AVX2, AVX-512) and by the
 * scalar loop: the same entries, for every distribution and context count,
 * and for a table of runs of 1 to 33 slots that end on and off a store of
 * 8 or 16, and the last symbol 255; nothing written past the last table. */
static void test_dec_tables_agree(void)
{
    int isas[2], nisa = simd_isas("test_dec_tables_agree", isas);
    if (nisa == 0) return;
    size_t n = 5000;
    uint8_t *sym = malloc(n), *ctx = malloc(n);
    kvs_rans_freqs t[KVS_RANS_MAX_CTX];
    kvs_rans_dec_tables *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    int differ = 0, cases = 0;
    for (int d = SKEWED; d <= RARE + 1; d++)
        for (unsigned nctx = 1; nctx <= KVS_RANS_MAX_CTX; nctx++, cases++) {
            if (d <= RARE) {
                make_data((enum dist)d, nctx, n, 31 * (uint64_t)d + nctx, sym, ctx, t);
            } else {
                for (unsigned c = 0; c < nctx; c++) {
                    memset(&t[c], 0, sizeof t[c]);
                    unsigned left = KVS_RANS_TOTAL, s = c;
                    for (unsigned f = 1; left > 40; f = f % 33 + 1, s += 1 + f % 3) {
                        t[c].f[s] = (uint16_t)f;
                        left -= f;
                    }
                    t[c].f[255] = (uint16_t)left;
                }
            }
            memset(a, 0xA5, sizeof *a);
            use_isa(KVS_RANS_SCALAR);
            kvs_rans_dec_init(a, t, nctx);
            for (int v = 0; v < nisa; v++) {
                memset(b, 0xA5, sizeof *b);
                use_isa(isas[v]);
                kvs_rans_dec_init(b, t, nctx);
                /* the whole struct: the tables, top, and the slots past them */
                differ += memcmp(a, b, sizeof *a) != 0;
            }
        }
    kvs_rans_set_simd(1);
    CHECK_EQ_INT(differ, 0);
    CHECK_EQ_INT(cases, 5 * KVS_RANS_MAX_CTX);
    free(a);
    free(b);
    free(sym);
    free(ctx);
}

/* A context above the last table's codes with the last table. */
static void test_context_clamp(void)
{
    size_t n = 1000;
    uint8_t *sym = malloc(n), *ctx = malloc(n), *big = malloc(n), *back = malloc(n);
    kvs_rans_freqs t[KVS_RANS_MAX_CTX];
    make_data(SKEWED, 2, n, 3, sym, ctx, t);
    for (size_t i = 0; i < n; i++) big[i] = ctx[i] ? (uint8_t)(1 + i % 255) : 0;
    for (int isa = KVS_RANS_SCALAR; isa <= KVS_RANS_AVX512; isa++) {
        if (!use_isa(isa)) continue;
        uint8_t *a = NULL, *b = NULL;
        size_t ma = 0, mb = 0;
        CHECK(rt(t, 2, sym, ctx, n, &a, &ma));
        CHECK(rt(t, 2, sym, big, n, &b, &mb));
        CHECK(ma == mb && memcmp(a, b, ma) == 0);
        free(a);
        free(b);
    }
    kvs_rans_set_simd(1);
    free(sym);
    free(ctx);
    free(big);
    free(back);
}

static void test_encoder_refusals(void)
{
    kvs_rans_freqs t = {{0}};
    t.f[1] = KVS_RANS_TOTAL;
    static kvs_rans_enc_tables e;
    kvs_rans_enc_init(&e, &t, 1);
    uint8_t sym[100], out[400];
    memset(sym, 1, sizeof sym);
    sym[70] = 2;
    size_t m;
    for (int isa = KVS_RANS_SCALAR; isa <= KVS_RANS_AVX512; isa++) {
        if (!use_isa(isa)) continue;
        CHECK_ERR(kvs_rans_encode(&e, sym, NULL, 100, out, sizeof out, &m), KVS_EINVAL,
                  "rans: symbol 2 at 70 has frequency 0 in the table of context 0");
    }
    kvs_rans_set_simd(1);
    CHECK_ERR(kvs_rans_encode(&e, sym, NULL, 100, out, 233, &m), KVS_ENOSPC,
              "rans: output holds 233 bytes, 100 symbols need 330");
}

static void test_decoder_refusals(void)
{
    size_t n = 5000;
    uint8_t *sym = malloc(n), *ctx = malloc(n), *back = malloc(n);
    kvs_rans_freqs t[KVS_RANS_MAX_CTX];
    make_data(SKEWED, 4, n, 5, sym, ctx, t);
    uint8_t *s = NULL;
    size_t m = 0;
    REQUIRE(rt(t, 4, sym, ctx, n, &s, &m));
    kvs_rans_dec_tables *d = malloc(sizeof *d);
    kvs_rans_dec_init(d, t, 4);
    for (int isa = KVS_RANS_SCALAR; isa <= KVS_RANS_AVX512; isa++) {
        if (!use_isa(isa)) continue;
        CHECK_ERR(kvs_rans_decode(d, s, 127, ctx, back, n, "t"), KVS_ECORRUPT,
                  "t: rANS stream of 127 bytes, shorter than its 128 bytes of states");
        /* every truncation, one extra byte, and a state out of range */
        int refused = 0, tried = 0;
        for (size_t k = 0; k < m; k += 1 + k / 50, tried++)
            refused += kvs_rans_decode(d, s, k, ctx, back, n, "t") == KVS_ECORRUPT;
        CHECK_EQ_INT(refused, tried);
        uint8_t *x = malloc(m + 2);
        memcpy(x, s, m);
        x[m] = x[m + 1] = 0;
        CHECK_ERR(kvs_rans_decode(d, x, m + 2, ctx, back, n, "t"), KVS_ECORRUPT,
                  "t: 2 bytes after the rANS stream of 5000 symbols");
        memcpy(x, s, m);
        x[3] = 0x80; /* state 0 at or above 2^31 */
        CHECK(kvs_rans_decode(d, x, m, ctx, back, n, "t") == KVS_ECORRUPT);
        memcpy(x, s, m);
        x[0] = x[1] = x[2] = x[3] = 0;
        CHECK_ERR(kvs_rans_decode(d, x, m, ctx, back, n, "t"), KVS_ECORRUPT,
                  "t: rANS state 0 is 0, outside [32768, 2147483648)");
        /* damage in the words: refused, or decodes to other symbols (which
         * the frame's checksum refuses); never read past the stream (ASan) */
        int caught = 0;
        for (size_t k = 4 * KVS_RANS_LANES; k < m; k += 7) {
            memcpy(x, s, m);
            x[k] ^= 0x24;
            int rc = kvs_rans_decode(d, x, m, ctx, back, n, "t");
            caught += rc == KVS_ECORRUPT || memcmp(back, sym, n) != 0;
        }
        CHECK_EQ_INT(caught, (int)((m - 4 * KVS_RANS_LANES + 6) / 7));
        /* the wrong count of symbols */
        CHECK(kvs_rans_decode(d, s, m, ctx, back, n - 1, "t") == KVS_ECORRUPT);
        free(x);
    }
    kvs_rans_set_simd(1);
    free(d);
    free(s);
    free(sym);
    free(ctx);
    free(back);
}

int main(void)
{
    RUN(test_normalize);
    RUN(test_normalize_definition);
    RUN(test_table_form);
    RUN(test_roundtrips);
    RUN(test_kernels_agree);
    RUN(test_tables_across_sets);
    RUN(test_window_tables);
    RUN(test_encode_tail);
    RUN(test_pair_decode);
    RUN(test_dec_products);
    RUN(test_dec_tables_agree);
    RUN(test_context_clamp);
    RUN(test_encoder_refusals);
    RUN(test_decoder_refusals);
    return TEST_SUMMARY();
}
