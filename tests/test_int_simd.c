/* test_int_simd.c - the integer quantizer's hand-written kernels
 * (src/codecs/intq_avx512.c, intq_avx2.c, intq_kernels.h) against its portable code
 * (src/codecs/intq.c), bit for bit: each kernel on adversarial inputs
 * (every bfloat16 pattern, +-0, NaN, inf, subnormals, halves, float16
 * overflow, every length to past two vectors, misaligned buffers; the
 * Hadamard rotation for every head size and the packing for every width),
 * the fused and rotated rows against the portable functions they stand
 * for (their bytes, or nothing written where they leave a row to the
 * portable code), then
 * whole objects through every variant (KVSERDE_ISA names) against the
 * portable build, payload, decoded bytes, codes and messages of refusals
 * (damaged payloads too), with the decoder's streaming stores on and off;
 * and a KVSERDE_ISA that cannot run refused by the int stage, nothing
 * written. The kernel tests run for every hand-written set this CPU runs:
 * the AVX-512 one (src/codecs/intq_avx512.c) where it has AVX-512, the
 * AVX2 one (src/codecs/intq_avx2.c) where it has AVX2; each skips the
 * entries its set leaves NULL. The whole-object test runs on any CPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The portable build of the quantizer, under other names: its static row
 * functions are the reference. */
#include "kvs_test_intq_ref.h"

#include "codecs/fp8_kernels.h"
#include "kvs_test.h"
#include "kvserde/fp8.h"

#define MAXN 200 /* lengths 0..MAXN-1: past the 16 / 32 / 64-lane blocks and their tails */

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

static float unif(uint64_t *s) { return (float)((double)lcg(s) / 2147483648.0 * 2.0 - 1.0); }

/* A float that stresses a kernel: +-0, tiny, subnormal, huge, integers and
 * halves, or plain random values. */
static float nasty(uint64_t *s)
{
    switch (lcg(s) % 10) {
    case 0: return 0.0f;
    case 1: return -0.0f;
    case 2: return kvs_f32_from_bits((uint32_t)lcg(s) & 0x807FFFFFu); /* subnormal */
    case 3: return ldexpf(unif(s), -20);
    case 4: return (float)((int)(lcg(s) % 17) - 8) * 0.5f; /* halves */
    case 5: return unif(s) * 70000.0f;
    default: return unif(s) * 4.0f;
    }
}

static const kvs_intq_kernels *K; /* the set under test (run_kernel_tests) */

/* ---------------------------------------------------------------------
 * Kernels one by one
 * ------------------------------------------------------------------ */

static void test_widen_every_bf16(void)
{
    static uint8_t src[2 * 65536 + 2];
    static float want[65536], got[65536 + 1];
    for (uint32_t h = 0; h < 65536; h++) put_le16(src + 1 + 2 * h, (uint16_t)h);
    /* all patterns at once, from an odd address: NaN and inf among them */
    CHECK_EQ_INT(K->widen_bf16(src + 1, 65536, got), 1);
    CHECK_EQ_INT(widen_row(src + 1, KVS_DTYPE_BFLOAT16, 65536, want), 1);
    CHECK(memcmp(got, want, sizeof want) == 0);
    /* the flag, for every length and where the non-finite one sits */
    uint8_t row[2 * MAXN];
    for (unsigned n = 0; n < MAXN; n++)
        for (unsigned bad = 0; bad <= n; bad++) {
            for (unsigned i = 0; i < n; i++) put_le16(row + 2 * i, (uint16_t)(0x3F80 + i));
            if (bad < n) put_le16(row + 2 * bad, bad % 2 ? 0xFF80 : 0x7FC1);
            got[n] = 12345.0f; /* a sentinel past the end */
            int g = K->widen_bf16(row, n, got), w = widen_row(row, KVS_DTYPE_BFLOAT16, n, want);
            CHECK_EQ_INT(g, w);
            CHECK_EQ_INT(g, bad < n);
            CHECK(memcmp(got, want, sizeof(float) * n) == 0 && got[n] == 12345.0f);
        }
}

static void test_narrow(void)
{
    uint64_t s = 5;
    float in[MAXN];
    uint8_t want[2 * MAXN + 64], got[2 * MAXN + 128];
    for (int round = 0; round < 40; round++)
        for (unsigned n = 0; n < MAXN; n += 1 + round % 3)
            for (unsigned off = 0; off < 4; off++)
                for (int stream = 0; stream < 2; stream++) {
                    for (unsigned i = 0; i < n; i++) {
                        uint32_t b = (uint32_t)lcg(&s) << 1 ^ (uint32_t)lcg(&s);
                        switch (lcg(&s) % 6) {
                        case 0: b = (b & 0xFFFF0000u) | 0x8000u; break; /* a tie */
                        case 1: b = (b & 0x807FFFFFu); break;           /* subnormal */
                        case 2: b = (b & 0x80000000u) | 0x7F7FFFFFu; break; /* to inf */
                        case 3: b = (b & 0x80000000u) | 0x7F800000u | (b & 0x7FFFFFu); break;
                        default: break;
                        }
                        in[i] = kvs_f32_from_bits(b);
                    }
                    memset(got, 0xA5, sizeof got);
                    narrow_row(in, KVS_DTYPE_BFLOAT16, n, want);
                    K->narrow_bf16(in, n, got + 64 + off, stream);
                    if (stream) K->store_fence(); /* the kernels leave it to the caller */
                    CHECK(memcmp(got + 64 + off, want, 2 * n) == 0);
                    CHECK(got[63 + off] == 0xA5 && got[64 + off + 2 * n] == 0xA5);
                }
}

static void test_minmax_values_and_zeros(void)
{
    uint64_t s = 7;
    float x[MAXN], a[MAXN], b[MAXN], c[MAXN], d[MAXN], e[MAXN], f[MAXN];
    for (int round = 0; round < 300; round++)
        for (unsigned n = 1; n < 80; n++) {
            int zeros = round % 3 == 0; /* only zeros and one sign of values */
            for (unsigned i = 0; i < n; i++) {
                x[i] = nasty(&s);
                if (zeros) x[i] = lcg(&s) % 3 ? (lcg(&s) % 2 ? 0.0f : -0.0f) : fabsf(x[i]);
                if (zeros && round % 2) x[i] = -x[i];
            }
            /* groups of g, the last one shorter */
            unsigned g = round % 4 == 1 ? n : 1 + (unsigned)(lcg(&s) % 40);
            for (unsigned c0 = 0, k = 0; c0 < n; c0 += g, k++) {
                unsigned len = n - c0 < g ? n - c0 : g;
                a[k] = b[k] = x[c0];
                minmax(x + c0, len, &a[k], &b[k]);
            }
            unsigned ng = (n + g - 1) / g;
            group_minmax(K, x, n, g, c, d);
            CHECK(memcmp(c, a, sizeof(float) * ng) == 0 && memcmp(d, b, sizeof(float) * ng) == 0);
            K->minmax(x, n, g, e, f); /* the kernel alone: the same values */
            for (unsigned k = 0; k < ng; k++) CHECK(e[k] == a[k] && f[k] == b[k]);
        }
}

static void test_fold_columns(void)
{
    uint64_t s = 9;
    float x[MAXN], mn[2][MAXN + 1], mx[2][MAXN + 1];
    for (unsigned n = 0; n < MAXN; n++) {
        for (unsigned c = 0; c <= n; c++)
            mn[0][c] = mn[1][c] = INFINITY, mx[0][c] = mx[1][c] = -INFINITY;
        for (int t = 0; t < 6; t++) {
            for (unsigned c = 0; c < n; c++) x[c] = lcg(&s) % 2 ? (lcg(&s) % 2 ? 0.0f : -0.0f)
                                                              : nasty(&s);
            for (unsigned c = 0; c < n; c++) {
                mn[0][c] = x[c] < mn[0][c] ? x[c] : mn[0][c];
                mx[0][c] = x[c] > mx[0][c] ? x[c] : mx[0][c];
            }
            K->fold_columns(x, n, mn[1], mx[1]);
        }
        CHECK(memcmp(mn[0], mn[1], sizeof(float) * (n + 1)) == 0);
        CHECK(memcmp(mx[0], mx[1], sizeof(float) * (n + 1)) == 0);
    }
}

/* group_scales through the kernel and through the portable code: the same
 * status, message, stored bytes, divisors and zeros. */
static void compare_scales(const kvs_intq_params *p, const float *mn, const float *mx,
                           unsigned n)
{
    static const kvs_intq_kernels portable = {.isa = "scalar"};
    uint8_t sc[2][4 * MAXN + 8], zr[2][4 * MAXN + 8];
    float inv[2][MAXN], zero[2][MAXN];
    char msg[2][KVS_ERROR_MSG_MAX];
    int rc[2];
    for (int v = 0; v < 2; v++) {
        memset(sc[v], 0xA5, sizeof sc[v]);
        memset(zr[v], 0xA5, sizeof zr[v]);
        memset(inv[v], 0, sizeof inv[v]);
        memset(zero[v], 0, sizeof zero[v]);
        kvs_set_error(KVS_OK, "none");
        rc[v] = group_scales(v ? K : &portable, p, mn, mx, n, sc[v], zr[v], 1, inv[v], zero[v]);
        snprintf(msg[v], sizeof msg[v], "%s", kvs_last_error());
    }
    CHECK_EQ_INT(rc[1], rc[0]);
    CHECK_EQ_STR(msg[1], msg[0]);
    CHECK(memcmp(sc[0], sc[1], sizeof sc[0]) == 0 && memcmp(zr[0], zr[1], sizeof zr[0]) == 0);
    if (rc[0] == KVS_OK)
        CHECK(memcmp(inv[0], inv[1], sizeof(float) * n) == 0 &&
              memcmp(zero[0], zero[1], sizeof(float) * n) == 0);
}

static void test_scales(void)
{
    /* edges: float16's largest finite value and what rounds past it, the
     * smallest subnormal scale and below it, +-0 */
    static const float edges[] = {0.0f,      -0.0f,    65504.0f, 65519.0f,  65520.0f,
                                  1e5f,      -65504.0f, -65505.0f, -65520.0f, -1e5f,
                                  5.96e-8f,  1e-9f,    -1e-9f,   1e-30f,    -1e-30f,
                                  1.0f,      -1.0f,    0.5f,     3.0f,      7.5f};
    const unsigned ne = sizeof edges / sizeof edges[0];
    uint64_t s = 11;
    float mn[MAXN], mx[MAXN];
    for (int round = 0; round < 400; round++) {
        kvs_intq_params p = {0};
        p.bits = 2 + (unsigned)(lcg(&s) % 7);
        p.zero_point = (int)(lcg(&s) % 2);
        p.scale_dtype = lcg(&s) % 4 ? KVS_DTYPE_FLOAT16 : KVS_DTYPE_FLOAT32;
        unsigned most = p.zero_point ? 1u << p.bits : (1u << p.bits) - 1;
        p.levels = round % 2 ? most : (p.zero_point ? 2 : 3) + (unsigned)(lcg(&s) % (most - 2)) / 2 * 2;
        unsigned n = (unsigned)(lcg(&s) % 70);
        int fail_ok = round % 4 == 0; /* else values float16 holds */
        for (unsigned i = 0; i < n; i++) {
            float a = lcg(&s) % 3 ? nasty(&s) : edges[lcg(&s) % ne];
            float b = lcg(&s) % 3 ? nasty(&s) : edges[lcg(&s) % ne];
            if (!fail_ok) a = fmaxf(fminf(a, 60000.0f), -30000.0f), b = fmaxf(fminf(b, 30000.0f), -30000.0f);
            mn[i] = a < b ? a : b;
            mx[i] = a < b ? b : a;
        }
        compare_scales(&p, mn, mx, n);
    }
}

static void test_quantize_ties(void)
{
    uint64_t s = 13;
    float x[MAXN], r[MAXN], z[MAXN];
    uint8_t want[MAXN + 1], got[MAXN + 1];
    for (int round = 0; round < 300; round++) {
        unsigned bits = 2 + (unsigned)(lcg(&s) % 7);
        int zp = (int)(lcg(&s) % 2);
        unsigned group = lcg(&s) % 3 ? 1 : 1 + (unsigned)(lcg(&s) % 70); /* 1: per element */
        float hi = (float)(zp ? (1u << bits) - 1 : ((1u << bits) - 2) / 2);
        float lo = zp ? 0.0f : -hi, mid = zp ? 0.0f : (float)(1u << (bits - 1));
        unsigned n = (unsigned)(lcg(&s) % MAXN);
        for (unsigned i = 0; i < n; i++) {
            r[i] = lcg(&s) % 5 ? ldexpf(1.0f + (float)(lcg(&s) % 8) / 8, (int)(lcg(&s) % 20) - 10)
                               : kvs_f32_from_bits((uint32_t)(1 + lcg(&s) % 1000)); /* subnormal */
            z[i] = zp ? -hi / 2 * r[i] : 0.0f;
            /* k + 1/2 steps from z (a tie), an integer, or anything, past the range too */
            float k = (float)((int)(lcg(&s) % (unsigned)(2 * hi + 5)) - (int)hi - 2);
            switch (lcg(&s) % 4) {
            case 0: x[i] = z[i] + (k + 0.5f) * r[i]; break;
            case 1: x[i] = z[i] + k * r[i]; break;
            case 2: x[i] = lcg(&s) % 2 ? 0.0f : -0.0f; break;
            default: x[i] = z[i] + unif(&s) * hi * 1.2f * r[i]; break;
            }
        }
        want[n] = got[n] = 0xA5;
        for (unsigned c0 = 0; c0 < n; c0 += group) /* the reference, group by group */
            quantize_run(x + c0, n - c0 < group ? n - c0 : group, r + c0 / group, z + c0 / group,
                         group == 1, lo, hi, mid, want + c0);
        K->quantize(x, n, r, NULL, z, group, lo, hi, mid, got); /* divisions */
        CHECK(memcmp(got, want, n + 1) == 0);
        float rinv[MAXN];
        K->reciprocals(r, group == 1 ? n : (n + group - 1) / group, rinv);
        memset(got, 0xA5, n + 1);
        K->quantize(x, n, r, rinv, z, group, lo, hi, mid, got); /* reciprocals */
        CHECK(memcmp(got, want, n + 1) == 0);
    }
}

/* The kernel multiplies by the divisors' reciprocals and divides only near
 * a half (intq_avx512.c's quotient): one divisor per group and one per
 * element. Values a few ulps either side of every half-integer step,
 * divisors over the whole float range (subnormal ones, whose reciprocal
 * overflows; huge ones, whose reciprocal is subnormal), 3.2 million codes
 * against the division. */
static void test_quantize_reciprocal(void)
{
    enum { G = 64, NG = 25 };
    uint64_t s = 31;
    float x[G * NG], r[NG], z[NG];
    uint8_t want[G * NG], got[G * NG];
    long differ = 0;
    for (int round = 0; round < 1000; round++) {
        unsigned bits = 2 + (unsigned)(lcg(&s) % 7);
        int zp = (int)(lcg(&s) % 2);
        float hi = (float)(zp ? (1u << bits) - 1 : ((1u << bits) - 2) / 2);
        float lo = zp ? 0.0f : -hi, mid = zp ? 0.0f : (float)(1u << (bits - 1));
        for (unsigned k = 0; k < NG; k++) {
            uint32_t e = lcg(&s) % 8 == 0 ? (uint32_t)(lcg(&s) % 255) : 100 + (uint32_t)(lcg(&s) % 50);
            r[k] = kvs_f32_from_bits(e << 23 | ((uint32_t)lcg(&s) & 0x7FFFFF));
            if (!(r[k] > 0)) r[k] = 1.0f; /* the divisor is never 0 */
            z[k] = zp ? -(float)(lcg(&s) % 8) * r[k] : 0.0f;
            for (unsigned i = 0; i < G; i++) {
                float k2 = (float)((int)(lcg(&s) % (unsigned)(2 * hi + 5)) - (int)hi - 2) + 0.5f;
                float v = z[k] + k2 * r[k];
                for (int u = (int)(lcg(&s) % 7) - 3; u != 0; u += u > 0 ? -1 : 1)
                    v = nextafterf(v, u > 0 ? INFINITY : -INFINITY);
                x[k * G + i] = lcg(&s) % 4 ? v : z[k] + unif(&s) * hi * r[k];
            }
        }
        for (unsigned k = 0; k < NG; k++)
            quantize_run(x + k * G, G, r + k, z + k, 0, lo, hi, mid, want + k * G);
        float rinv[NG], re[G * NG], ze[G * NG], rinve[G * NG];
        K->reciprocals(r, NG, rinv);
        K->quantize(x, G * NG, r, rinv, z, G, lo, hi, mid, got);
        for (unsigned i = 0; i < G * NG; i++) differ += got[i] != want[i];
        /* the same divisors, one per element (the channel axis) */
        for (unsigned i = 0; i < G * NG; i++) re[i] = r[i / G], ze[i] = z[i / G];
        K->reciprocals(re, G * NG, rinve);
        memset(got, 0, sizeof got);
        K->quantize(x, G * NG, re, rinve, ze, 1, lo, hi, mid, got);
        for (unsigned i = 0; i < G * NG; i++) differ += got[i] != want[i];
    }
    CHECK(differ == 0);
}

static void test_pack_unpack(void)
{
    uint64_t s = 17;
    uint8_t codes[MAXN], want[MAXN + 2], got[MAXN + 2], back[2][MAXN + 1];
    for (unsigned bits = 2; bits <= 8; bits++)
        for (unsigned n = 0; n < MAXN; n++)
            for (unsigned off = 0; off < 2; off++) {
                for (unsigned i = 0; i < n; i++) codes[i] = (uint8_t)(lcg(&s) & ((1u << bits) - 1));
                memset(want, 0xA5, sizeof want);
                memset(got, 0xA5, sizeof got);
                pack_codes(codes, n, bits, want + off);
                pack(K, codes, n, bits, got + off);
                CHECK(memcmp(got, want, sizeof want) == 0);
                back[0][n] = back[1][n] = 0xA5;
                unpack_codes(want + off, n, bits, back[0]);
                unpack(K, want + off, n, bits, back[1]);
                CHECK(memcmp(back[0], back[1], n + 1) == 0 && memcmp(back[1], codes, n) == 0);
            }
    for (unsigned bits = 2; bits < 8; bits++) CHECK(K->pack[bits] && K->unpack[bits]);
}

/* Long rows of every width below 8 (several 64-code blocks and every
 * tail), each from an odd address, every byte past the packed or unpacked
 * end left alone, codes of all ones and random. */
static void test_pack_unpack_long(void)
{
    enum { N = 1100 };
    static uint8_t codes[N], want[N + 8], got[N + 8], back[2][N + 8];
    uint64_t s = 47;
    for (unsigned bits = 2; bits < 8; bits++)
        for (unsigned n = 0; n < N; n += 1 + (unsigned)(lcg(&s) % 23)) {
            int ones = lcg(&s) % 4 == 0;
            for (unsigned i = 0; i < n; i++)
                codes[i] = (uint8_t)(ones ? (1u << bits) - 1 : lcg(&s) & ((1u << bits) - 1));
            memset(want, 0xA5, sizeof want);
            memset(got, 0xA5, sizeof got);
            pack_codes(codes, n, bits, want + 1);
            K->pack[bits](codes, n, got + 1);
            CHECK(memcmp(got, want, sizeof want) == 0);
            memset(back, 0x5A, sizeof back);
            unpack_codes(want + 1, n, bits, back[0] + 1);
            K->unpack[bits](want + 1, n, back[1] + 1);
            CHECK(memcmp(back[0], back[1], sizeof back[0]) == 0 &&
                  memcmp(back[1] + 1, codes, n) == 0);
        }
}

/* The rotation against hadamard_row, every head size, rows of 1 to 5
 * heads (and 1 to 40 heads of the small ones: their masked tails), from
 * an odd float offset: values of every kind (+-0, subnormal, halves,
 * huge ones whose sums overflow to inf, where inf - inf makes NaN, and
 * inf itself: the decoder's dequantized values), the floats past the row
 * untouched. */
static void test_hadamard(void)
{
    enum { N = 5 * 1024 };
    static float x[N + 2], want[N + 2], got[N + 2];
    uint64_t s = 53;
    for (unsigned h = 2; h <= 1024; h *= 2)
        for (int round = 0; round < 60; round++) {
            unsigned heads = 1 + (unsigned)(lcg(&s) % (h < 16 ? 40 : 5));
            uint64_t D = (uint64_t)h * heads;
            int mode = round % 4;
            for (uint64_t i = 0; i < D; i++) {
                float v = nasty(&s);
                if (mode == 1) v = unif(&s) * 3.4e38f; /* sums past FLT_MAX */
                if (mode == 2 && lcg(&s) % 50 == 0) v = lcg(&s) % 2 ? INFINITY : -INFINITY;
                if (mode == 3) v = lcg(&s) % 2 ? 0.0f : -0.0f;
                x[1 + i] = v;
            }
            x[0] = x[1 + D] = 777.0f;
            memcpy(want, x, sizeof(float) * (D + 2));
            memcpy(got, x, sizeof(float) * (D + 2));
            hadamard_row(want + 1, D, h);
            K->hadamard(got + 1, D, h);
            CHECK(memcmp(got, want, sizeof(float) * (D + 2)) == 0);
        }
}

static void test_dequantize(void)
{
    uint64_t s = 19;
    uint8_t codes[MAXN];
    float sc[MAXN], z[MAXN], want[MAXN + 1], got[MAXN + 1];
    for (int round = 0; round < 300; round++) {
        unsigned group = lcg(&s) % 3 ? 1 : 1 + (unsigned)(lcg(&s) % 70);
        float mid = lcg(&s) % 2 ? 0.0f : (float)(1u << (lcg(&s) % 8));
        unsigned n = (unsigned)(lcg(&s) % MAXN);
        for (unsigned i = 0; i < n; i++) {
            codes[i] = (uint8_t)lcg(&s);
            sc[i] = lcg(&s) % 4 ? fabsf(nasty(&s)) : kvs_f32_from_bits((uint32_t)lcg(&s) % 0x7F800000u);
            z[i] = nasty(&s);
        }
        want[n] = got[n] = 777.0f;
        for (unsigned c0 = 0; c0 < n; c0 += group)
            dequantize_run(codes + c0, n - c0 < group ? n - c0 : group, sc + c0 / group,
                           z + c0 / group, group == 1, mid, want + c0);
        K->dequantize(codes, n, sc, z, group, mid, got);
        CHECK(memcmp(got, want, sizeof(float) * (n + 1)) == 0);
    }
}

static void test_load_scales(void)
{
    uint8_t in[4 * MAXN];
    float want[MAXN + 1], got[MAXN + 1];
    uint64_t s = 29;
    for (int f16 = 0; f16 < 2; f16++)
        for (unsigned n = 0; n < MAXN; n++) {
            for (unsigned i = 0; i < sizeof in; i++) in[i] = (uint8_t)lcg(&s);
            kvs_dtype sd = f16 ? KVS_DTYPE_FLOAT16 : KVS_DTYPE_FLOAT32;
            for (unsigned i = 0; i < n; i++) want[i] = get_scale(in + 1 + i * kvs_dtype_size(sd), sd);
            want[n] = got[n] = 5.0f;
            K->load_scales(in + 1, n, f16, got);
            CHECK(memcmp(got, want, sizeof(float) * (n + 1)) == 0);
        }
    /* every float16 pattern, NaN payloads included */
    static uint8_t all[2 * 65536];
    static float w16[65536], g16[65536];
    for (uint32_t h = 0; h < 65536; h++) put_le16(all + 2 * h, (uint16_t)h), w16[h] = kvs_f16_to_f32((uint16_t)h);
    K->load_scales(all, 65536, 1, g16);
    CHECK(memcmp(g16, w16, sizeof w16) == 0);
}


/* ---------------------------------------------------------------------
 * Fused rows (encode_token_bf16, decode_bf16)
 * ------------------------------------------------------------------ */

enum { FN = 4096 }; /* the longest fused row tested */

/* The bytes of one token row of bfloat16 as the portable block loop makes
 * them (widen, group statistics, scales, division, pack); -1: refused as
 * not finite, else the scales' status. */
static int ref_token_row(const kvs_intq_params *p, const uint8_t *src, unsigned n,
                         unsigned group, uint8_t *scales, uint8_t *zeros, uint8_t *codes)
{
    static const kvs_intq_kernels portable = {.isa = "scalar"};
    static float row[FN], a[FN], b[FN];
    static uint8_t u[FN];
    if (widen_row(src, KVS_DTYPE_BFLOAT16, n, row)) return -1;
    unsigned ng = n / group;
    group_minmax(&portable, row, n, group, a, b);
    int rc = group_scales(&portable, p, a, b, ng, scales, zeros, 0, a, b);
    if (rc) return rc;
    float lo, hi, mid;
    code_range(p, &lo, &hi, &mid);
    for (unsigned k = 0; k < ng; k++)
        quantize_run(row + k * group, group, a + k, b + k, 0, lo, hi, mid, u + k * group);
    pack_codes(u, n, p->bits, codes);
    return 0;
}

/* One group of values that reach a branch of the fused encoder: plain,
 * halves of the step (ties), +-0 only or with one sign of values (a zero
 * minimum or maximum), constant, tiny (subnormal float16 scales),
 * bfloat16 subnormals (subnormal float32 scales: the fused codes' bound
 * without a clamp is loosest there), huge (scales past float16), a NaN or
 * inf. */
static void fused_group(uint64_t *s, const kvs_intq_params *p, uint8_t *dst, unsigned len)
{
    unsigned mode = (unsigned)(lcg(s) % 13);
    float steps = (float)(p->zero_point ? p->levels - 1 : (p->levels - 1) / 2);
    float scale = ldexpf(1.0f, (int)(lcg(s) % 12) - 6), c = nasty(s);
    for (unsigned i = 0; i < len; i++) {
        float v;
        switch (mode) {
        case 0: case 1: /* halves of a step of `scale` over the full range */
            v = ((float)(int)(lcg(s) % (unsigned)(2 * steps + 1)) - steps) * 0.5f * scale;
            if (i == 0) v = steps * scale;
            break;
        case 2: v = lcg(s) % 2 ? 0.0f : -0.0f; break;
        case 3: v = lcg(s) % 3 ? fabsf(unif(s)) : (lcg(s) % 2 ? 0.0f : -0.0f); break;
        case 4: v = lcg(s) % 3 ? -fabsf(unif(s)) : (lcg(s) % 2 ? 0.0f : -0.0f); break;
        case 5: v = c; break;
        case 6: v = ldexpf(unif(s), -30); break;
        case 7: v = unif(s) * 3e5f; break;
        case 8: v = nasty(s); break;
        case 9: v = ldexpf(unif(s), -127 - (int)(lcg(s) % 6)); break;
        default: v = unif(s) * scale * steps; break;
        }
        put_le16(dst + 2 * i, (uint16_t)(kvs_f32_to_bits(v) >> 16));
    }
    if (lcg(s) % 40 == 0) put_le16(dst + 2 * (lcg(s) % len), lcg(s) % 2 ? 0x7FC0 : 0xFF80);
}

/* Parameters of the fused rows' presets: 2, 4 or 8 bits, with or without
 * a zero point, float16 or float32 scales, all levels or fewer. */
static kvs_intq_params fused_params(uint64_t *s, int round)
{
    kvs_intq_params p = {0};
    p.bits = (unsigned[]){2, 4, 8}[lcg(s) % 3];
    p.zero_point = (int)(lcg(s) % 2);
    p.scale_dtype = lcg(s) % 4 ? KVS_DTYPE_FLOAT16 : KVS_DTYPE_FLOAT32;
    unsigned most = p.zero_point ? 1u << p.bits : (1u << p.bits) - 1;
    p.levels = round % 2 ? most : most - (p.zero_point ? 1 : 2);
    return p;
}

/* One token row of n bfloat16 at src through the reference and the
 * kernel set's encode_token_bf16 (codes_ahead as the kernel takes it):
 * where the kernel fuses the row (returns 1), the reference's bytes and
 * none past them; else nothing written (the caller runs the portable
 * code). Returns what the kernel returned. */
static int check_token_row(const kvs_intq_params *p, const uint8_t *src, unsigned n,
                           unsigned group, int codes_ahead)
{
    static uint8_t sc[2][4 * 64 + 8], zr[2][4 * 64 + 8], cd[2][FN + 8];
    size_t ss = kvs_dtype_size(p->scale_dtype), ng = n / group;
    for (int v = 0; v < 2; v++) {
        memset(sc[v], 0xA5, sizeof sc[v]);
        memset(zr[v], 0xA5, sizeof zr[v]);
        memset(cd[v], 0xA5, sizeof cd[v]);
    }
    int rw = ref_token_row(p, src, n, group, sc[0], zr[0], cd[0]);
    kvs_intq_rowfmt f;
    row_format(p, group, &f);
    /* codes prefetched for writing a row on (payload_ahead) or not: the
     * prefetch writes nothing, so the reference's codes stay as they are */
    int rg = K->encode_token_bf16(src, n, &f, sc[1], zr[1], cd[1], NULL,
                                  codes_ahead ? cd[0] : NULL);
    if (rg) { /* the reference's bytes, and none past them */
        CHECK_EQ_INT(rw, 0);
        CHECK(memcmp(sc[0], sc[1], sizeof sc[0]) == 0 && memcmp(zr[0], zr[1], sizeof zr[0]) == 0);
        CHECK(memcmp(cd[0], cd[1], sizeof cd[0]) == 0);
        CHECK(sc[1][ng * ss] == 0xA5 && cd[1][n * p->bits / 8] == 0xA5);
    } else { /* nothing written: the caller runs the portable code */
        for (size_t i = 0; i < sizeof sc[1]; i++) CHECK(sc[1][i] == 0xA5 && zr[1][i] == 0xA5);
        for (size_t i = 0; i < sizeof cd[1]; i++) CHECK(cd[1][i] == 0xA5);
    }
    return rg;
}

static void test_fused_encode(void)
{
    static uint8_t src[2 * FN];
    uint64_t s = 37;
    long fused = 0, fell_back = 0;
    for (int round = 0; round < 6000; round++) {
        kvs_intq_params p = fused_params(&s, round);
        unsigned n = 64 * (1 + (unsigned)(lcg(&s) % 16)), group;
        do group = 32 * (1 + (unsigned)(lcg(&s) % 4)); while (n % group || n / group > 64);
        for (unsigned c0 = 0; c0 < n; c0 += group) fused_group(&s, &p, src + 2 * c0, group);
        if (check_token_row(&p, src, n, group, round % 3 != 0)) fused++;
        else fell_back++;
    }
    /* both ways taken, most rows fused */
    CHECK(fused > 2000 && fell_back > 100);
}

/* Rows of 66 to 128 chunks of 32 codes (past the encoder's windows of 64
 * chunks whose near-half chunks it makes again at the window's end, the
 * last window partial), each group ties of the step (chunks with near
 * lanes) or plain values, the tie groups put on the windows' edges too:
 * the reference's bytes. A window's fix-ups dropped, or put on the wrong
 * chunks, change codes of a tie group. */
static void test_fused_encode_windows(void)
{
    static uint8_t src[2 * FN];
    uint64_t s = 41;
    long fused = 0;
    for (int round = 0; round < 400; round++) {
        kvs_intq_params p = fused_params(&s, round);
        unsigned group = 64, n = group * (33 + (unsigned)(lcg(&s) % 32)), ng = n / group;
        for (unsigned k = 0; k < ng; k++) {
            /* groups 31, 32 and the last hold chunks 62-65 and the row's end */
            int ties = k == 31 || k == 32 || k == ng - 1 || lcg(&s) % 4 == 0;
            float steps = (float)(p.zero_point ? p.levels - 1 : (p.levels - 1) / 2);
            float scale = ldexpf(1.0f, (int)(lcg(&s) % 12) - 6) * 0.75f;
            for (unsigned i = 0; i < group; i++) {
                float v = ties ? ((float)(int)(lcg(&s) % (unsigned)(2 * steps + 1)) - steps) * 0.5f *
                                     scale
                               : unif(&s) * scale * steps;
                if (i == 0) v = steps * scale;
                put_le16(src + 2 * (k * group + i), (uint16_t)(kvs_f32_to_bits(v) >> 16));
            }
        }
        fused += check_token_row(&p, src, n, group, 0);
    }
    CHECK(fused > 300);
}

/* The portable block loop's bytes for a channel-axis block of bfloat16
 * rows (token t at src + 2 t n): -1 refused as not finite, else the
 * scales' status. */
static int ref_channel_block(const kvs_intq_params *p, const uint8_t *src, unsigned rows,
                             unsigned n, uint8_t *scales, uint8_t *zeros, uint8_t *codes,
                             unsigned row_bytes)
{
    static const kvs_intq_kernels portable = {.isa = "scalar"};
    static float row[FN], mn[FN], mx[FN];
    static uint8_t u[FN];
    for (unsigned c = 0; c < n; c++) mn[c] = INFINITY, mx[c] = -INFINITY;
    for (unsigned t = 0; t < rows; t++) {
        if (widen_row(src + 2 * t * n, KVS_DTYPE_BFLOAT16, n, row)) return -1;
        for (unsigned c = 0; c < n; c++) {
            mn[c] = row[c] < mn[c] ? row[c] : mn[c];
            mx[c] = row[c] > mx[c] ? row[c] : mx[c];
        }
    }
    int rc = group_scales(&portable, p, mn, mx, n, scales, zeros, 0, mn, mx);
    if (rc) return rc;
    float lo, hi, mid;
    code_range(p, &lo, &hi, &mid);
    for (unsigned t = 0; t < rows; t++) {
        widen_row(src + 2 * t * n, KVS_DTYPE_BFLOAT16, n, row);
        quantize_run(row, n, mn, mx, 1, lo, hi, mid, u);
        pack_codes(u, n, p->bits, codes + t * row_bytes);
    }
    return 0;
}

static void test_fused_encode_channels(void)
{
    enum { R = 70, N = 256 };
    static uint8_t src[2 * R * N], col[2 * R], sc[2][4 * N + 8], zr[2][4 * N + 8];
    static uint8_t cd[2][R * N + 8];
    static int16_t keys[2 * N];
    static float d[N], z[N], rinv[N];
    uint64_t s = 43;
    long fused = 0, fell_back = 0;
    for (int round = 0; round < 1500; round++) {
        kvs_intq_params p = fused_params(&s, round);
        unsigned n = 64 * (1 + (unsigned)(lcg(&s) % 4)), rows = 1 + (unsigned)(lcg(&s) % R);
        unsigned row_bytes = n * p.bits / 8;
        /* each channel one of fused_group's kinds, down the tokens; most
         * blocks with every channel plain, else nearly every block would
         * hold one that falls back */
        int plain = lcg(&s) % 3 != 0;
        for (unsigned c = 0; c < n; c++) {
            if (plain) {
                for (unsigned t = 0; t < rows; t++)
                    put_le16(col + 2 * t, (uint16_t)(kvs_f32_to_bits(unif(&s) * 2.0f - 0.3f) >> 16));
            } else {
                fused_group(&s, &p, col, rows);
            }
            for (unsigned t = 0; t < rows; t++) memcpy(src + 2 * (t * n + c), col + 2 * t, 2);
        }
        for (int v = 0; v < 2; v++) {
            memset(sc[v], 0xA5, sizeof sc[v]);
            memset(zr[v], 0xA5, sizeof zr[v]);
            memset(cd[v], 0xA5, sizeof cd[v]);
        }
        int rw = ref_channel_block(&p, src, rows, n, sc[0], zr[0], cd[0], row_bytes);
        kvs_intq_rowfmt f;
        row_format(&p, 1, &f);
        int rg = K->encode_channel_bf16(src, 2 * n, rows, n, &f, sc[1], zr[1], cd[1], row_bytes,
                                        keys, d, z, rinv, NULL);
        if (rg) {
            fused++;
            CHECK_EQ_INT(rw, 0);
            CHECK(memcmp(sc[0], sc[1], sizeof sc[0]) == 0 && memcmp(zr[0], zr[1], sizeof zr[0]) == 0);
            CHECK(memcmp(cd[0], cd[1], sizeof cd[0]) == 0);
        } else {
            fell_back++;
            for (size_t i = 0; i < sizeof sc[1]; i++) CHECK(sc[1][i] == 0xA5 && zr[1][i] == 0xA5);
            for (size_t i = 0; i < sizeof cd[1]; i++) CHECK(cd[1][i] == 0xA5);
        }
    }
    CHECK(fused > 700 && fell_back > 100);
}

static void test_fused_decode(void)
{
    static _Alignas(64) uint8_t got[2 * FN + 128];
    static uint8_t in[FN], u[FN], want[2 * FN];
    static float sc[FN], z[FN], row[FN];
    uint64_t s = 41;
    for (int round = 0; round < 3000; round++) {
        unsigned bits = (unsigned[]){2, 4, 8}[lcg(&s) % 3];
        unsigned n = 64 * (1 + (unsigned)(lcg(&s) % 16));
        unsigned group = (unsigned[]){1, 16, 32, 48, 64, 128}[lcg(&s) % 6];
        if (lcg(&s) % 5 == 0 || n % group) group = n; /* the tensor axis: one scale */
        float mid = lcg(&s) % 2 ? 0.0f : (float)(1u << (bits - 1));
        for (unsigned i = 0; i < n; i++) {
            in[i] = (uint8_t)lcg(&s);
            sc[i] = lcg(&s) % 4 ? fabsf(nasty(&s)) : kvs_f32_from_bits((uint32_t)lcg(&s) % 0x7F800000u);
            z[i] = nasty(&s);
        }
        unpack_codes(in, n, bits, u);
        /* a group's first element made a bfloat16 tie (low bits 0x8000)
         * when computed as the reference does, a product then a sum; a
         * fused multiply-add would round it elsewhere */
        for (unsigned c0 = 0; c0 < n; c0 += group)
            if (lcg(&s) % 2) {
                float pr = ((float)u[c0] - mid) * sc[c0 / group];
                float t = kvs_f32_from_bits((kvs_f32_to_bits(pr * 1.5f + 1.0f) & 0xFFFF0000u) | 0x8000u);
                z[c0 / group] = t - pr;
            }
        for (unsigned c0 = 0; c0 < n; c0 += group)
            dequantize_run(u + c0, group, sc + c0 / group, z + c0 / group, group == 1, mid, row + c0);
        narrow_row(row, KVS_DTYPE_BFLOAT16, n, want);
        unsigned off = (unsigned)(lcg(&s) % 2) * 2; /* on a line, or not */
        int stream = (int)(lcg(&s) % 2);
        /* a prefetched row (decode_ahead) or none: the bytes do not change */
        const uint8_t *ahead = lcg(&s) % 2 ? u : NULL;
        memset(got, 0xA5, sizeof got);
        K->decode_bf16(in, n, bits, sc, z, group, mid, got + 64 + off, stream, ahead);
        if (stream) K->store_fence();
        CHECK(memcmp(got + 64 + off, want, 2 * n) == 0);
        CHECK(got[63 + off] == 0xA5 && got[64 + off + 2 * n] == 0xA5);
    }
}

/* widen_rotated_bf16 against widen_row and hadamard_row: every head size
 * it takes, rows of 16 to 1024 channels, every bfloat16 kind (subnormal,
 * +-0, huge ones whose sums overflow), a NaN or inf somewhere (the flag,
 * as widen_row's), a prefetched row or none, nothing written past the
 * row. */
static void test_rotated_widen(void)
{
    static uint8_t src[2 * FN + 2];
    static float want[FN + 1], got[FN + 1];
    uint64_t s = 61;
    for (int round = 0; round < 4000; round++) {
        unsigned h = 2u << (lcg(&s) % 8); /* 2 to 256 */
        unsigned n = 16 * (1 + (unsigned)(lcg(&s) % 64));
        n = (n + h - 1) / h * h;
        int mode = (int)(lcg(&s) % 4);
        for (unsigned i = 0; i < n; i++) {
            float v = mode == 1 ? unif(&s) * 3.3e38f : nasty(&s);
            uint16_t b = (uint16_t)(kvs_f32_to_bits(v) >> 16);
            if (mode == 2) b = (uint16_t)lcg(&s); /* any pattern */
            put_le16(src + 1 + 2 * i, b);
        }
        if (mode == 3) put_le16(src + 1 + 2 * (lcg(&s) % n), lcg(&s) % 2 ? 0x7F80 : 0xFFC1);
        int bad = widen_row(src + 1, KVS_DTYPE_BFLOAT16, n, want);
        hadamard_row(want, n, h);
        got[n] = want[n] = 777.0f;
        const uint8_t *ahead = lcg(&s) % 2 ? src : NULL;
        CHECK_EQ_INT(K->widen_rotated_bf16(src + 1, n, h, got, ahead), bad);
        if (!bad) CHECK(memcmp(got, want, sizeof(float) * (n + 1)) == 0);
        CHECK(got[n] == 777.0f);
    }
}

/* decode_rotated_bf16 against dequantize_run, hadamard_row and
 * narrow_row: every head size it takes, rows of 32 to 1024 channels,
 * groups of 1, multiples of 16 and the whole row, mid 128 (its centred
 * codes), 0 and others, scales so large that sums overflow (inf, and NaN
 * from inf - inf) or subnormal results (bfloat16's own narrowing), on a
 * line (streamed or not) or off it, nothing written past the row. */
static void test_rotated_decode(void)
{
    static _Alignas(64) uint8_t got[2 * FN + 128];
    static uint8_t u[FN], want[2 * FN];
    static float sc[FN], z[FN], row[FN];
    uint64_t s = 59;
    for (int round = 0; round < 4000; round++) {
        unsigned h = 2u << (lcg(&s) % 8); /* 2 to 256 */
        unsigned n = 32 * (1 + (unsigned)(lcg(&s) % 32));
        n = (n + h - 1) / h * h;
        unsigned group = (unsigned[]){1, 16, 32, 48, 64, 128}[lcg(&s) % 6];
        if (lcg(&s) % 4 == 0 || n % group) group = n; /* the tensor axis */
        float mid = (float[]){128.0f, 0.0f, 4.0f, 32.0f}[lcg(&s) % 4];
        int mode = (int)(lcg(&s) % 4);
        for (unsigned i = 0; i < n; i++) {
            u[i] = (uint8_t)lcg(&s);
            sc[i] = fabsf(nasty(&s));
            if (mode == 1) sc[i] = 2e37f * (float)(1 + lcg(&s) % 8);  /* sums past FLT_MAX */
            if (mode == 2) sc[i] = kvs_f32_from_bits((uint32_t)lcg(&s) % 0x00400000u); /* tiny */
            z[i] = mode == 2 ? 0.0f : nasty(&s);
        }
        for (unsigned c0 = 0; c0 < n; c0 += group)
            dequantize_run(u + c0, group, sc + c0 / group, z + c0 / group, group == 1, mid, row + c0);
        hadamard_row(row, n, h);
        narrow_row(row, KVS_DTYPE_BFLOAT16, n, want);
        unsigned off = (unsigned)(lcg(&s) % 2) * 2;
        int stream = (int)(lcg(&s) % 2);
        memset(got, 0xA5, sizeof got);
        K->decode_rotated_bf16(u, n, sc, z, group, mid, h, got + 64 + off, stream);
        if (stream) K->store_fence();
        CHECK(memcmp(got + 64 + off, want, 2 * n) == 0);
        CHECK(got[63 + off] == 0xA5 && got[64 + off + 2 * n] == 0xA5);
    }
}

/* ---------------------------------------------------------------------
 * Whole objects through every variant
 * ------------------------------------------------------------------ */

/* Data that reaches every branch: groups of +-0 only, constant groups,
 * tiny values (subnormal float16 scales), values float16 cannot scale,
 * NaN and inf (refused), and plain random values. */
static void fill_nasty(kvs_memobj *o, uint64_t *s, int mode)
{
    kvs_dtype dt = o->layout.groups[0].dtype;
    uint64_t n = kvs_layout_numel(&o->layout);
    size_t es = kvs_dtype_size(dt);
    for (uint64_t i = 0; i < n; i++) {
        float v = unif(s) * 3.0f;
        switch (mode) {
        case 1: v = lcg(s) % 2 ? 0.0f : -0.0f; break;
        case 2: v = (i / 7) % 3 ? v : (lcg(s) % 2 ? 0.0f : -0.0f); break;
        case 3: v = ldexpf(v, -22); break;
        case 4: v = (float)(i % 5) * 0.25f; break;
        default: break;
        }
        store_elem((uint8_t *)o->data + i * es, dt, v);
    }
    if (mode == 5 && n) store_elem((uint8_t *)o->data + (lcg(s) % n) * es, dt, 1e30f);
    if (mode == 6 && n) store_elem((uint8_t *)o->data + (lcg(s) % n) * es, dt, NAN);
    if (mode == 7 && n) store_elem((uint8_t *)o->data + (lcg(s) % n) * es, dt, -INFINITY);
}

static void test_objects_every_variant(void)
{
    const char *const *names = kvs_fp8_isa_names();
    uint64_t s = 23;
    int compared = 0, fused_shapes = 0;
    for (int round = 0; round < 160; round++) {
        kvs_intq_params p = {0};
        p.bits = round % 3 == 0 ? 2 + (unsigned)(lcg(&s) % 7) : (unsigned[]){2, 4, 8}[lcg(&s) % 3];
        p.axis[0] = (unsigned)(lcg(&s) % 3);
        p.axis[1] = (unsigned)(lcg(&s) % 3);
        p.group[0] = lcg(&s) % 2 ? 32u << (lcg(&s) % 2) : 1 + (unsigned)(lcg(&s) % 70);
        p.group[1] = lcg(&s) % 2 ? 32u << (lcg(&s) % 2) : 1 + (unsigned)(lcg(&s) % 70);
        p.zero_point = (int)(lcg(&s) % 2);
        p.scale_dtype = lcg(&s) % 4 ? KVS_DTYPE_FLOAT16 : KVS_DTYPE_FLOAT32;
        p.levels = p.zero_point ? 1u << p.bits : (1u << p.bits) - 1;
        p.hadamard = lcg(&s) % 5 ? 0 : 2u << (lcg(&s) % 9); /* 2 to 512 */
        p.k_outliers = lcg(&s) % 4 ? 0 : 2;
        kvs_dtype dt = lcg(&s) % 4 ? KVS_DTYPE_BFLOAT16
                                   : (lcg(&s) % 2 ? KVS_DTYPE_FLOAT16 : KVS_DTYPE_FLOAT32);
        /* a third of them 64 to 192 channels: the fused rows' shapes */
        int64_t D = p.hadamard     ? p.hadamard * (1 + (int64_t)(lcg(&s) % (1 + 256 / p.hadamard)))
                    : lcg(&s) % 3 ? 1 + (int64_t)(lcg(&s) % 150)
                                   : 64 * (1 + (int64_t)(lcg(&s) % 3));
        fused_shapes += D % 64 == 0 && !p.hadamard && dt == KVS_DTYPE_BFLOAT16 && p.bits % 2 == 0 &&
                        p.bits != 6;
        const int64_t d4[4] = {2, 1 + (int64_t)(lcg(&s) % 2), 1 + (int64_t)(lcg(&s) % 80), D};
        kvs_layout l = {0};
        REQUIRE_OK(kvs_layout_add_group(&l, 4, d4, dt));
        size_t nb = (size_t)kvs_layout_nbytes(&l), bound;
        /* the source 2 bytes past a line: misaligned rows; the
         * destinations so every other round, else on a line, where the
         * fused decoder streams its rows (it stores misaligned rows with
         * ordinary stores) and decode_range fences them */
        size_t doff = round % 2 ? 2 : 64, dsize = (nb + 64 + doff + 63) / 64 * 64;
        uint8_t *sbuf = malloc(nb + 66);
        uint8_t *dbuf[2] = {aligned_alloc(64, dsize), aligned_alloc(64, dsize)};
        kvs_memobj src, dst[2];
        REQUIRE_OK(kvs_memobj_init(&src, sbuf + 2, nb, &l, KVS_FMT_KV_2LTD));
        fill_nasty(&src, &s, (int)(lcg(&s) % 8));
        REQUIRE_OK(ref_intq_bound(&p, &l, &bound));
        uint8_t *want = malloc(bound), *got = malloc(bound);
        size_t nw = 0, ng = 0;
        memset(want, 0xA5, bound);
        int rw = ref_intq_encode(&p, &src, want, bound, &nw);
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        for (size_t v = 0; names[v]; v++) {
            if (!kvs_fp8_isa_available(names[v])) continue;
            REQUIRE_OK(kvs_fp8_set_isa(names[v]));
            memset(got, 0xA5, bound);
            int rg = kvs_intq_encode(&p, &src, got, bound, &ng);
            CHECK_EQ_INT(rg, rw);
            if (rg) CHECK_EQ_STR(kvs_last_error(), msg);
            if (rg == KVS_OK) CHECK(ng == nw);
            CHECK(memcmp(got, want, bound) == 0);
            if (rw) continue;
            for (int stream = 0; stream < 2; stream++) {
                kvs_fp8_set_nt_min_bytes(stream ? 0 : SIZE_MAX);
                for (int k = 0; k < 2; k++) {
                    REQUIRE_OK(kvs_memobj_init(&dst[k], dbuf[k] + doff, nb, &l, KVS_FMT_KV_2LTD));
                    memset(dbuf[k], 0x5A, dsize);
                }
                REQUIRE_OK(kvs_intq_decode(&p, want, nw, &dst[0]));
                REQUIRE_OK(ref_intq_decode(&p, want, nw, &dst[1]));
                CHECK(memcmp(dbuf[0], dbuf[1], dsize) == 0);
            }
            kvs_fp8_set_nt_min_bytes(KVS_FP8_NT_DEFAULT_MIN_BYTES);
            /* a damaged payload (0xFF bytes: NaN scales, codes out of
             * order): the same refusal or the same bytes */
            if (nw > 8) {
                uint8_t *bad = malloc(nw);
                memcpy(bad, want, nw);
                for (int f = 0; f < 4; f++) bad[4 + lcg(&s) % (nw - 4)] = 0xFF;
                int rd[2];
                char m0[KVS_ERROR_MSG_MAX];
                for (int k = 0; k < 2; k++) {
                    REQUIRE_OK(kvs_memobj_init(&dst[k], dbuf[k] + doff, nb, &l, KVS_FMT_KV_2LTD));
                    memset(dbuf[k], 0x5A, dsize);
                    rd[k] = k ? ref_intq_decode(&p, bad, nw, &dst[1])
                              : kvs_intq_decode(&p, bad, nw, &dst[0]);
                    if (k == 0) snprintf(m0, sizeof m0, "%s", kvs_last_error());
                }
                CHECK_EQ_INT(rd[0], rd[1]);
                if (rd[0]) CHECK_EQ_STR(m0, kvs_last_error());
                CHECK(memcmp(dbuf[0], dbuf[1], dsize) == 0);
                free(bad);
            }
            compared++;
        }
        REQUIRE_OK(kvs_fp8_set_isa("auto"));
        free(want);
        free(got);
        free(sbuf);
        free(dbuf[0]);
        free(dbuf[1]);
    }
    CHECK(compared >= 160);
    CHECK(fused_shapes >= 20);
}

/* A KVSERDE_ISA that cannot run is refused by the int stage as by the fp8
 * kernels (the variant follows their choice), nothing written, until
 * kvs_fp8_set_isa picks a usable one. Runs first: the variable is read
 * once, at the first conversion. */
static void test_unknown_isa_refused(void)
{
    REQUIRE(setenv("KVSERDE_ISA", "avx1024", 1) == 0);
    kvs_intq_params p = {4, 16, {KVS_INTQ_CHANNEL, KVS_INTQ_TOKEN}, {64, 64}, 1,
                         KVS_DTYPE_FLOAT16, 0, 0};
    const int64_t d4[4] = {2, 1, 4, 8};
    kvs_layout l = {0};
    REQUIRE_OK(kvs_layout_add_group(&l, 4, d4, KVS_DTYPE_BFLOAT16));
    uint8_t data[2 * 2 * 4 * 8] = {0}, out[512], back[sizeof data];
    memset(out, 0xA5, sizeof out);
    kvs_memobj src, dst;
    REQUIRE_OK(kvs_memobj_init(&src, data, sizeof data, &l, KVS_FMT_KV_2LTD));
    size_t n = 0;
    CHECK_ERR(kvs_intq_encode(&p, &src, out, sizeof out, &n), KVS_EINVAL,
              "fp8: KVSERDE_ISA='avx1024' is unknown; known: scalar, avx2, avx512, avx512fp16, "
              "auto");
    CHECK(out[0] == 0xA5 && out[4] == 0xA5);
    REQUIRE_OK(kvs_fp8_set_isa("auto"));
    REQUIRE_OK(kvs_intq_encode(&p, &src, out, sizeof out, &n));
    REQUIRE_OK(kvs_fp8_set_isa("scalar"));
    REQUIRE(setenv("KVSERDE_ISA", "auto", 1) == 0);
    memset(back, 0x5A, sizeof back);
    REQUIRE_OK(kvs_memobj_init(&dst, back, sizeof back, &l, KVS_FMT_KV_2LTD));
    CHECK_OK(kvs_intq_decode(&p, out, n, &dst));
    CHECK(memcmp(back, data, sizeof data) == 0); /* zeros come back as zeros */
    REQUIRE_OK(kvs_fp8_set_isa("auto"));
}

/* The kernel tests of one hand-written set, each where the set has the
 * entry (NULL: the portable code runs, nothing to compare). */
static void run_kernel_tests(const kvs_intq_kernels *k)
{
    K = k;
    printf("test_int_simd: the %s kernels\n", K->isa);
    /* decode_range's one fence after its streamed rows (intq_kernels.h) */
    CHECK(K->store_fence != NULL);
#define RUN_IF(entry, test) \
    do { \
        if (K->entry) RUN(test); \
    } while (0)
    RUN_IF(widen_bf16, test_widen_every_bf16);
    RUN_IF(narrow_bf16, test_narrow);
    RUN_IF(minmax, test_minmax_values_and_zeros);
    RUN_IF(fold_columns, test_fold_columns);
    RUN_IF(scales, test_scales);
    RUN_IF(quantize, test_quantize_ties);
    RUN_IF(quantize, test_quantize_reciprocal);
    RUN_IF(pack[2], test_pack_unpack);
    RUN_IF(pack[2], test_pack_unpack_long);
    RUN_IF(hadamard, test_hadamard);
    RUN_IF(dequantize, test_dequantize);
    RUN_IF(load_scales, test_load_scales);
    RUN_IF(encode_token_bf16, test_fused_encode);
    RUN_IF(encode_token_bf16, test_fused_encode_windows);
    RUN_IF(encode_channel_bf16, test_fused_encode_channels);
    RUN_IF(decode_bf16, test_fused_decode);
    RUN_IF(decode_rotated_bf16, test_rotated_decode);
    RUN_IF(widen_rotated_bf16, test_rotated_widen);
#undef RUN_IF
}

int main(void)
{
    RUN(test_unknown_isa_refused);
    int sets = 0;
#if defined(__x86_64__)
    if (kvs_fp8_isa_available("avx512")) run_kernel_tests(kvs_intq_kernels_avx512()), sets++;
    if (kvs_fp8_isa_available("avx2")) run_kernel_tests(kvs_intq_kernels_avx2()), sets++;
#endif
    if (sets == 0)
        printf("test_int_simd: no hand-written kernels on this CPU or build (the portable code "
               "runs); whole objects only\n");
    RUN(test_objects_every_variant);
    return TEST_SUMMARY();
}
