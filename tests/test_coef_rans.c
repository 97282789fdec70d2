/* test_coef_rans.c - the transform stage's static-table coefficient coder
 * (src/codecs/coef_rans.c): its tables pinned, exact round trips of every
 * class (zeros, +-32767, a single row or column, values beyond a class's
 * table that escape), the scalar and AVX-512 rANS kernels writing and
 * reading the same bytes, and damaged streams refused with their numbers. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/coef_rans.h"
#include "codecs/rans.h"
#include "codecs/rans_kernels.h"
#include "kvs_test.h"
#include "kvserde/error.h"

static uint64_t rng;
static double uniform(void) /* (0, 1), deterministic */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return ((rng >> 11) + 0.5) / 9007199254740992.0;
}

static double laplace(void)
{
    double u = uniform() - 0.5;
    return u < 0 ? log(1 + 2 * u) : -log(1 - 2 * u);
}

/* The generated tables (scripts/gen_coef_tables.py): a changed table is a
 * changed format, so their contents are pinned. */
#define TABLES_HASH 0x7652d03d60378a5aull
#define PIN_C0_ZERO 1021
#define PIN_C20_ONE 171
#define PIN_C40_ESCAPE 1
static void test_tables_pinned(void)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the u16s, little-endian */
    for (int c = 0; c < KVS_COEF_RANS_CLASSES; c++) {
        unsigned sum = 0;
        for (int s = 0; s <= KVS_COEF_ESCAPE; s++) {
            unsigned f = kvs_coef_freq[c][s];
            sum += f;
            h = (h ^ (f & 0xFF)) * 1099511628211ull;
            h = (h ^ (f >> 8)) * 1099511628211ull;
        }
        CHECK_EQ_INT(sum, KVS_RANS_TOTAL);
        CHECK(kvs_coef_freq[c][KVS_COEF_ESCAPE] >= 1); /* every value can be coded */
    }
    CHECK_EQ_INT(KVS_COEF_RANS_CLASSES, 64);
    CHECK_EQ_INT(KVS_COEF_ESCAPE, 207);
    printf("tables hash %016llx\n", (unsigned long long)h);
    CHECK(h == TABLES_HASH);
    CHECK_EQ_INT(kvs_coef_freq[0][0], PIN_C0_ZERO);
    CHECK_EQ_INT(kvs_coef_freq[20][1], PIN_C20_ONE);
    CHECK_EQ_INT(kvs_coef_freq[40][KVS_COEF_ESCAPE], PIN_C40_ESCAPE);
}

static int round_trip(const int32_t *q, size_t rows, size_t cols, const uint8_t *cls,
                      uint8_t *buf, size_t cap, size_t *n)
{
    float *back = malloc((rows * cols + 1) * sizeof(float));
    uint8_t *got = malloc(cols + 1);
    int rc = kvs_coef_rans_encode(q, rows, cols, cls, buf, cap, n);
    if (rc == KVS_OK) rc = kvs_coef_rans_decode(buf, *n, rows, cols, got, back, "t");
    if (rc == KVS_OK && memcmp(got, cls, cols) != 0) rc = 999;
    free(got);
    for (size_t i = 0; rc == KVS_OK && i < rows * cols; i++) {
        int32_t v = q[i] > KVS_COEF_RANS_MAX    ? KVS_COEF_RANS_MAX
                    : q[i] < -KVS_COEF_RANS_MAX ? -KVS_COEF_RANS_MAX
                                                : q[i];
        if (back[i] != (float)v) rc = 1000 + (int)(i % 1000);
    }
    free(back);
    return rc;
}

static void test_round_trips(void)
{
    enum { R = 256, C = 64 };
    static int32_t q[R * C];
    static uint8_t buf[R * C * 4 + 256], cls[C];
    size_t n;
    rng = 11;
    /* column j of class j, its values at the class's spread (mean square
     * 2^((j - 16) / 2)) and, in every fourth column, four times wider
     * (escapes) */
    for (int j = 0; j < C; j++) cls[j] = (uint8_t)j;
    for (int i = 0; i < R * C; i++) {
        int j = i % C;
        double sd = pow(2, (j - 16) / 4.0) * (j % 4 == 3 ? 4 : 1);
        q[i] = (int32_t)lrint(sd * laplace() / sqrt(2));
    }
    q[3] = 32767;
    q[4] = -32767;
    q[5] = 70000; /* clamped */
    q[6] = -70000;
    CHECK_OK(round_trip(q, R, C, cls, buf, sizeof buf, &n));
    /* the same matrix with every column in class 0 (nearly all escapes),
     * and in class 63 */
    memset(cls, 0, C);
    CHECK_OK(round_trip(q, R, C, cls, buf, sizeof buf, &n));
    memset(cls, 63, C);
    CHECK_OK(round_trip(q, R, C, cls, buf, sizeof buf, &n));
    /* all zeros in every class: the rANS states and nothing raw */
    memset(q, 0, sizeof q);
    for (int j = 0; j < C; j++) cls[j] = (uint8_t)j;
    CHECK_OK(round_trip(q, R, C, cls, buf, sizeof buf, &n));
    /* a single row, a single column, a single coefficient */
    for (int i = 0; i < C; i++) q[i] = (int32_t)(i * 517 % 65535) - 32767;
    CHECK_OK(round_trip(q, 1, C, cls, buf, sizeof buf, &n));
    CHECK_OK(round_trip(q, R, 1, cls + 40, buf, sizeof buf, &n));
    CHECK_OK(round_trip(q, 1, 1, cls + 5, buf, sizeof buf, &n));
    /* every value of 16 bits in a class that escapes most of them */
    static int32_t all[65535];
    for (int v = 0; v < 65535; v++) all[v] = v - 32767;
    uint8_t c2 = 2;
    static uint8_t big[65535 * 4 + 256];
    CHECK_OK(round_trip(all, 65535, 1, &c2, big, sizeof big, &n));
    c2 = 60;
    CHECK_OK(round_trip(all, 65535, 1, &c2, big, sizeof big, &n));
    /* a destination too small */
    CHECK_EQ_INT(kvs_coef_rans_encode(all, 65535, 1, &c2, big, 100, &n), KVS_ENOSPC);
}

/* The AVX-512 and scalar kernels (rANS, and the coder's symbol mapping
 * and value look-ups, coef_rans_kernels.h): the same bytes, each reading
 * the other's. */
static void test_kernels_agree(void)
{
    enum { R = 256, C = 100 };
    static int32_t q[R * C];
    static uint8_t a[R * C * 4], b[R * C * 4], cls[C];
    static float fa[R * C], fb[R * C];
    rng = 5;
    for (int j = 0; j < C; j++) cls[j] = (uint8_t)(j * 7 % 50);
    /* every fifth column 8 times wider than its class (escapes), and the
     * extremes; 100 columns: 6 groups of 16 and a tail of 4 */
    for (int i = 0; i < R * C; i++)
        q[i] = (int32_t)lrint(pow(2, (cls[i % C] - 16) / 4.0) * (i % 5 == 4 ? 8 : 1) * laplace());
    q[1] = 32767;
    q[2] = -32767;
    q[3] = 100000;
    q[4] = -100000;
    size_t na, nb;
    int simd = kvs_rans_set_simd(1);
    CHECK_OK(kvs_coef_rans_encode(q, R, C, cls, a, sizeof a, &na));
    kvs_rans_set_simd(0);
    CHECK_OK(kvs_coef_rans_encode(q, R, C, cls, b, sizeof b, &nb));
    CHECK(na == nb && memcmp(a, b, na) == 0);
    uint8_t got[C];
    CHECK_OK(kvs_coef_rans_decode(a, na, R, C, got, fb, "t"));
    kvs_rans_set_simd(1);
    CHECK_OK(kvs_coef_rans_decode(b, nb, R, C, got, fa, "t"));
    CHECK(memcmp(fa, fb, sizeof fa) == 0);
    if (!simd) printf("  (no AVX-512 here: both runs were scalar)\n");
}

/* The 16 bits at bit `at` of the raw bits p (least significant first) set
 * to v. */
static void set_bits(uint8_t *p, unsigned at, unsigned v)
{
    for (unsigned b = 0; b < 16; b++) {
        unsigned i = at + b;
        p[i / 8] = (uint8_t)((p[i / 8] & ~(1u << (i % 8))) | ((v >> b & 1u) << (i % 8)));
    }
}

static void test_damaged_refused(void)
{
    /* a 2 x 2 stream in class 32: 5 (exact), -40 (a bucket and 2 raw bits),
     * 0, 2; raw bits: the classes (6 + 1), then the 2; class 0 cannot code
     * 5, 40 or 2 (escapes) */
    int32_t q[4] = {5, -40, 0, 2};
    uint8_t cls[2] = {32, 32}, buf[512], c[512];
    float back[4];
    uint8_t got[2];
    size_t n;
    CHECK_OK(kvs_coef_rans_encode(q, 2, 2, cls, buf, sizeof buf, &n));
    size_t len = buf[0] | (size_t)buf[1] << 8, raw = n - 4 - len;
    CHECK_EQ_INT((int)raw, 2);
    char msg[256];
    CHECK_ERR(kvs_coef_rans_decode(buf, 3, 2, 2, got, back, "x"), KVS_ECORRUPT,
              "x: coefficient stream damaged: 3 bytes, shorter than its 4-byte length");
    memcpy(c, buf, n);
    c[0] = (uint8_t)(n - 3);
    c[1] = 0;
    snprintf(msg, sizeof msg,
             "x: coefficient stream damaged: its rANS stream of %zu bytes runs past the %zu-byte "
             "stream",
             n - 3, n);
    CHECK_ERR(kvs_coef_rans_decode(c, n, 2, 2, got, back, "x"), KVS_ECORRUPT, msg);
    /* the raw bits cut short: their bytes run out at coefficient 1, or in
     * the classes */
    CHECK_ERR(kvs_coef_rans_decode(buf, n - 1, 2, 2, got, back, "x"), KVS_ECORRUPT,
              "x: coefficient stream damaged: its 1 raw bytes end at coefficient 1 of 2 x 2");
    CHECK_ERR(kvs_coef_rans_decode(buf, n - 2, 2, 2, got, back, "x"), KVS_ECORRUPT,
              "x: coefficient stream damaged: its 0 raw bytes end in the classes of its 2 "
              "components");
    /* one byte too many, and a padding bit set */
    memcpy(c, buf, n);
    c[n] = 0;
    snprintf(msg, sizeof msg,
             "x: coefficient stream damaged: %zu raw bytes, the coefficients use 9 bits",
             raw + 1);
    CHECK_ERR(kvs_coef_rans_decode(c, n + 1, 2, 2, got, back, "x"), KVS_ECORRUPT, msg);
    memcpy(c, buf, n);
    c[n - 1] |= 0x80;
    CHECK_ERR(kvs_coef_rans_decode(c, n, 2, 2, got, back, "x"), KVS_ECORRUPT,
              "x: coefficient stream damaged: 2 raw bytes, the coefficients use 9 bits and the "
              "rest are not 0");
    /* a damaged rANS state */
    memcpy(c, buf, n);
    c[4 + 3] ^= 0x40;
    CHECK(kvs_coef_rans_decode(c, n, 2, 2, got, back, "x") == KVS_ECORRUPT);
    /* escapes: class 0 escapes 5, -20 and 2; an escape of a value class 0
     * codes itself (0) or of -0 is refused */
    uint8_t c0[2] = {0, 0};
    CHECK_OK(kvs_coef_rans_encode(q, 2, 2, c0, buf, sizeof buf, &n));
    CHECK_OK(kvs_coef_rans_decode(buf, n, 2, 2, got, back, "x"));
    CHECK(back[0] == 5 && back[1] == -40 && back[2] == 0 && back[3] == 2);
    len = buf[0] | (size_t)buf[1] << 8;
    memcpy(c, buf, n);
    set_bits(c + 4 + len, 7, 0); /* coefficient 0's escape (after the classes): 0 */
    CHECK_ERR(kvs_coef_rans_decode(c, n, 2, 2, got, back, "x"), KVS_ECORRUPT,
              "x: coefficient stream damaged: coefficient 0 escapes 0, which class 0 codes "
              "without escape");
    set_bits(c + 4 + len, 7, 0x8000); /* -0 */
    CHECK_ERR(kvs_coef_rans_decode(c, n, 2, 2, got, back, "x"), KVS_ECORRUPT,
              "x: coefficient stream damaged: coefficient 0 escapes 0, which class 0 codes "
              "without escape");
    set_bits(c + 4 + len, 7, 1); /* 1: class 0 codes it */
    CHECK_ERR(kvs_coef_rans_decode(c, n, 2, 2, got, back, "x"), KVS_ECORRUPT,
              "x: coefficient stream damaged: coefficient 0 escapes 1, which class 0 codes "
              "without escape");
    /* classes: a difference that leaves 0-63, a code too long (one row of
     * two zeros in class 0: raw bits 000000 then 1 for "the same") */
    int32_t z[2] = {0, 0};
    CHECK_OK(kvs_coef_rans_encode(z, 1, 2, c0, buf, sizeof buf, &n));
    len = buf[0] | (size_t)buf[1] << 8;
    CHECK_EQ_INT((int)(n - 4 - len), 1);
    CHECK_EQ_INT(buf[n - 1], 0x40);
    memcpy(c, buf, n);
    c[n - 1] = 0x80; /* 0, 1, 1: zigzag 2, one class up: -1 */
    c[n] = 0x01;
    CHECK_ERR(kvs_coef_rans_decode(c, n + 1, 1, 2, got, back, "x"), KVS_ECORRUPT,
              "x: coefficient stream damaged: component 1 has class -1, at most 63");
    c[n - 1] = 0;
    c[n] = 0;
    c[n + 1] = 0;
    CHECK_ERR(kvs_coef_rans_decode(c, n + 2, 1, 2, got, back, "x"), KVS_ECORRUPT,
              "x: coefficient stream damaged: component 1's class code is longer than 15 bits");
    CHECK_ERR(kvs_coef_rans_decode(c, n, 1, 2, got, back, "x"), KVS_ECORRUPT,
              "x: coefficient stream damaged: its 1 raw bytes end in the classes of its 2 "
              "components");
    /* every truncation and flipped bit: refused or decoded, never a crash */
    int32_t big[64 * 8];
    uint8_t cl8[8] = {0, 5, 10, 15, 20, 25, 30, 35};
    rng = 9;
    for (int i = 0; i < 64 * 8; i++) big[i] = (int32_t)lrint(pow(2, (cl8[i % 8] - 16) / 4.0) *
                                                             laplace());
    static uint8_t s[64 * 8 * 4 + 256], d[64 * 8 * 4 + 256];
    static float out[64 * 8];
    uint8_t got8[8];
    CHECK_OK(kvs_coef_rans_encode(big, 64, 8, cl8, s, sizeof s, &n));
    for (size_t cut = 0; cut < n; cut++)
        CHECK(kvs_coef_rans_decode(s, cut, 64, 8, got8, out, "x") == KVS_ECORRUPT);
    for (size_t i = 0; i < 8 * n; i++) {
        memcpy(d, s, n);
        d[i / 8] ^= (uint8_t)(1u << (i % 8));
        int rc = kvs_coef_rans_decode(d, n, 64, 8, got8, out, "x");
        CHECK(rc == KVS_OK || rc == KVS_ECORRUPT);
    }
}

/* Damaged streams through both decoders (the AVX-512 value kernel stops
 * before a group it cannot vouch for, coef_rans_kernels.h): the same
 * status, the same message, the same values written before it. 40
 * columns, so groups of 16 cross rows; every fifth column escapes. */
static void test_kernels_refuse_alike(void)
{
    enum { R = 48, C = 40 };
    static int32_t q[R * C];
    static uint8_t s[R * C * 4 + 256], d[R * C * 4 + 256], cls[C];
    static float fa[R * C], fb[R * C];
    static char msg[512];
    rng = 11;
    for (int j = 0; j < C; j++) cls[j] = (uint8_t)(10 + j);
    for (int i = 0; i < R * C; i++)
        q[i] = (int32_t)lrint(pow(2, (cls[i % C] - 16) / 4.0) * (i % 5 == 4 ? 8 : 1) * laplace());
    size_t n;
    CHECK_OK(kvs_coef_rans_encode(q, R, C, cls, s, sizeof s, &n));
    int simd = kvs_rans_set_simd(1);
    for (size_t t = 0; t < n + 8 * n; t += t < n ? 1 : 3) {
        size_t len = t < n ? t : n; /* first every truncation, then flipped bits */
        memcpy(d, s, n);
        if (t >= n) d[(t - n) / 8] ^= (uint8_t)(1u << ((t - n) % 8));
        uint8_t got[C];
        memset(fa, 0, sizeof fa), memset(fb, 0, sizeof fb);
        kvs_rans_set_simd(1);
        int ra = kvs_coef_rans_decode(d, len, R, C, got, fa, "x");
        snprintf(msg, sizeof msg, "%s", ra ? kvs_last_error() : "");
        kvs_rans_set_simd(0);
        int rb = kvs_coef_rans_decode(d, len, R, C, got, fb, "x");
        CHECK_EQ_INT(ra, rb);
        CHECK(strcmp(msg, rb ? kvs_last_error() : "") == 0);
        CHECK(memcmp(fa, fb, sizeof fa) == 0);
    }
    kvs_rans_set_simd(simd);
    if (!simd) printf("  (no AVX-512 here: both runs were scalar)\n");
}

int main(void)
{
    RUN(test_tables_pinned);
    RUN(test_round_trips);
    RUN(test_kernels_agree);
    RUN(test_kernels_refuse_alike);
    RUN(test_damaged_refused);
    return TEST_SUMMARY();
}
