/* test_fp8_simd.c - every SIMD fp8 kernel variant this CPU supports agrees
 * bit for bit with the scalar reference (kvs_fp8_kernels_scalar()).
 *
 * Covered, for each variant, both fp8 formats and both overflow policies:
 *   - all 65536 bfloat16 and all 65536 float16 bit patterns;
 *   - all 256 codes of every decoder (float32, float16, bfloat16 results);
 *   - more than 10 million float32 inputs: every fp8 value, every exact
 *     midpoint between adjacent fp8 magnitudes (0 to the overflow
 *     thresholds) with its nextafterf neighbours, the overflow thresholds
 *     and their neighbours, NaN payloads (quiet and signalling), infinities,
 *     float32 subnormals, both zeros, all of it with both signs; then random
 *     bit patterns and random values near the fp8 range (fixed seed);
 *   - lengths 0..200 at byte offsets 0..7 of src and dst (so unaligned
 *     elements too), with guard bytes before and after dst checked;
 *   - arrays long enough to take the non-temporal store path, at aligned,
 *     unaligned and element-misaligned destinations, both with the store
 *     threshold lowered (kvs_fp8_set_nt_min_bytes) and at the default;
 *   - with the threshold at 0 (every call streams): lengths 0..200 at every
 *     destination offset 0..63 from a cache line, so every head, prefetch
 *     cut-off and tail around the streaming loop, with guard bytes;
 *   - runs with MXCSR set to flush-to-zero, denormals-are-zero and each
 *     directed rounding mode, which must not change a single byte.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define HAVE_MXCSR 1
#else
#define HAVE_MXCSR 0
#endif

#include "codecs/fp8_kernels.h"
#include "kvs_test.h"
#include "kvserde/fp8.h"

static const char *const fmt_names[KVS_FP8_NFMT] = {"e4m3fn", "e5m2"};
static const char *const wide_names[KVS_NWIDE] = {"float32", "float16", "bfloat16"};
static const size_t wide_size[KVS_NWIDE] = {4, 2, 2};

/* ---- variants ------------------------------------------------------------ */

typedef struct {
    const char *name;
    const kvs_fp8_kernels *k;
} variant;

static variant variants[4];
static int nvariants;
static const kvs_fp8_kernels *ref;

/* Every SIMD variant this CPU and build run (the dispatcher's own CPU
 * checks decide), through the variant switch. */
static void find_variants(void)
{
    ref = kvs_fp8_kernels_scalar();
    const char *const *names = kvs_fp8_isa_names();
    for (size_t i = 0; names[i] && nvariants < 4; i++) {
        const kvs_fp8_kernels *k;
        if (strcmp(names[i], "scalar") == 0 || !kvs_fp8_isa_available(names[i])) continue;
        if (kvs_fp8_set_isa(names[i]) != KVS_OK || kvs_fp8_kernels_get(&k) != KVS_OK) continue;
        variants[nvariants++] = (variant){names[i], k};
    }
    kvs_fp8_set_isa("auto");
    printf("test_fp8_simd: variants tested against scalar:");
    for (int v = 0; v < nvariants; v++)
        printf(" %s", variants[v].name);
    printf("%s\n", nvariants ? "" : " none (this CPU or build has no SIMD variant)");
}

/* ---- helpers ------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static uint32_t rng32(void)
{
    /* xorshift64*, fixed seed: the same inputs every run */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1DULL) >> 32);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Input element i of a wide array, as its bits (for messages). */
static uint32_t elem_bits(const void *src, int wide, size_t i)
{
    if (wide == KVS_WIDE_F32) {
        uint32_t v;
        memcpy(&v, (const unsigned char *)src + 4 * i, 4);
        return v;
    }
    uint16_t v;
    memcpy(&v, (const unsigned char *)src + 2 * i, 2);
    return v;
}

/* Encode src with the variant and the reference; return the number of
 * differing bytes (the first few are printed). */
static size_t compare_encode(const variant *var, int fmt, int wide, int sat, const void *src,
                             size_t n, const char *what)
{
    uint8_t *got = xmalloc(n), *want = xmalloc(n);
    memset(got, 0xA5, n);
    memset(want, 0x5A, n);
    var->k->encode[fmt][wide](src, got, n, sat);
    ref->encode[fmt][wide](src, want, n, sat);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            if (bad < 5)
                fprintf(stderr, "  %s, %s: %s -> %s sat=%d: input[%zu] = 0x%08x: got 0x%02x, "
                        "scalar 0x%02x\n", var->name, what, wide_names[wide], fmt_names[fmt],
                        sat, i, elem_bits(src, wide, i), got[i], want[i]);
            bad++;
        }
    }
    free(got);
    free(want);
    return bad;
}

static size_t compare_decode(const variant *var, int fmt, int wide, const uint8_t *src, size_t n,
                             const char *what)
{
    const size_t es = wide_size[wide];
    unsigned char *got = xmalloc(n * es), *want = xmalloc(n * es);
    memset(got, 0xA5, n * es);
    memset(want, 0x5A, n * es);
    var->k->decode[fmt][wide](src, got, n);
    ref->decode[fmt][wide](src, want, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(got + i * es, want + i * es, es) != 0) {
            if (bad < 5)
                fprintf(stderr, "  %s, %s: %s -> %s: code[%zu] = 0x%02x: got 0x%08x, scalar 0x%08x\n",
                        var->name, what, fmt_names[fmt], wide_names[wide], i, src[i],
                        elem_bits(got, wide, i), elem_bits(want, wide, i));
            bad++;
        }
    }
    free(got);
    free(want);
    return bad;
}

/* ---- exhaustive 16-bit sources and decodes -------------------------------- */

static uint16_t all16[65536];

static void test_all_16bit_inputs(void)
{
    for (uint32_t i = 0; i < 65536; i++)
        all16[i] = (uint16_t)i;
    for (int v = 0; v < nvariants; v++)
        for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++)
            for (int sat = 0; sat <= 1; sat++) {
                CHECK_EQ_INT(compare_encode(&variants[v], fmt, KVS_WIDE_BF16, sat, all16, 65536,
                                            "all bfloat16"), 0);
                CHECK_EQ_INT(compare_encode(&variants[v], fmt, KVS_WIDE_F16, sat, all16, 65536,
                                            "all float16"), 0);
            }
}

static void test_all_codes(void)
{
    /* all 256 codes, and again shifted by one byte and repeated past a full
     * vector so both the block and the partial-block paths see every code */
    uint8_t codes[1 + 3 * 256];
    for (int i = 0; i < (int)sizeof codes; i++)
        codes[i] = (uint8_t)(i - 1);
    for (int v = 0; v < nvariants; v++)
        for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++)
            for (int wide = 0; wide < KVS_NWIDE; wide++) {
                CHECK_EQ_INT(compare_decode(&variants[v], fmt, wide, codes + 1, 256, "all codes"), 0);
                CHECK_EQ_INT(compare_decode(&variants[v], fmt, wide, codes, sizeof codes,
                                            "all codes shifted"), 0);
            }
}

/* ---- float32 inputs ---------------------------------------------------------- */

typedef struct {
    uint32_t *v;
    size_t n, cap;
} u32vec;

static void push(u32vec *a, uint32_t x)
{
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 4096;
        uint32_t *p = realloc(a->v, a->cap * sizeof *p);
        if (!p) {
            fprintf(stderr, "out of memory\n");
            exit(2);
        }
        a->v = p;
    }
    a->v[a->n++] = x;
}

/* x, its nextafterf neighbours, with both signs. */
static void push_around(u32vec *a, float x)
{
    const float xs[3] = {nextafterf(x, -INFINITY), x, nextafterf(x, INFINITY)};
    for (int i = 0; i < 3; i++) {
        push(a, f2u(xs[i]));
        push(a, f2u(xs[i]) ^ 0x80000000u);
    }
}

/* The interesting float32 values: every fp8 value of both formats, the
 * midpoints between adjacent magnitudes (and the one past the largest
 * finite, the overflow threshold), each with neighbours, and specials. */
static void special_f32(u32vec *a)
{
    for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++) {
        float prev = 0.0f;
        const float maxv = fmt == 0 ? 448.0f : 57344.0f;
        for (int c = 0; c < 0x80; c++) {
            const float x = fmt == 0 ? kvs_fp8_e4m3fn_to_f32((uint8_t)c)
                                     : kvs_fp8_e5m2_to_f32((uint8_t)c);
            if (!(x <= maxv)) /* NaN / inf codes */
                continue;
            push_around(a, x);
            if (c > 0)
                push_around(a, prev + (x - prev) / 2); /* exact midpoint */
            prev = x;
        }
        /* past the largest finite value: the next step would be 480 / 65536 */
        const float step = fmt == 0 ? 32.0f : 8192.0f;
        push_around(a, maxv + step / 2); /* 464 / 61440: the thresholds */
        push_around(a, maxv + step);
        push_around(a, maxv + step * 1.5f);
        push_around(a, 2.0f * maxv);
        /* fractions of the smallest subnormal step: below half, the tie at
         * half (rounds to 0), between, and the ties at 1.5 and 2.5 steps */
        const float sub = fmt == 0 ? 0x1p-9f : 0x1p-16f;
        push_around(a, sub / 4);
        push_around(a, sub / 2);
        push_around(a, sub * 0.75f);
        push_around(a, sub * 1.5f);
        push_around(a, sub * 2.5f);
    }
    const uint32_t specials[] = {
        0x00000000u, 0x00000001u, 0x00000002u, 0x00400000u, 0x007FFFFFu, /* 0, subnormals */
        0x00800000u, 0x00800001u,                                         /* FLT_MIN */
        0x7F7FFFFFu, 0x7F800000u,                                         /* FLT_MAX, inf */
        0x7F800001u, 0x7F800002u, 0x7FA00000u, 0x7FBFFFFFu,               /* signalling NaN */
        0x7FC00000u, 0x7FC00001u, 0x7FE00000u, 0x7FFFFFFFu,               /* quiet NaN */
        0x3F800000u, 0x40000000u, 0x33000000u, 0x33800000u, 0x37800000u,
    };
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        push(a, specials[i]);
        push(a, specials[i] | 0x80000000u);
    }
    /* every exponent with mantissas 0, 1, the tie patterns of both
     * formats' rounding (bit 19 / bit 20 alone, with the lsb, with a
     * sticky bit) and all ones */
    const uint32_t mants[] = {0, 1, 0x80000, 0x80001, 0x180000, 0x100000, 0x100001, 0x300000,
                              0x7FFFFF, 0x7FFFFE, 0x400000, 0x0FFFFF, 0x07FFFF};
    for (uint32_t e = 0; e < 256; e++)
        for (size_t m = 0; m < sizeof mants / sizeof mants[0]; m++) {
            push(a, (e << 23) | mants[m]);
            push(a, 0x80000000u | (e << 23) | mants[m]);
        }
}

static u32vec f32_inputs;
#define F32_RANDOM_BITS 5000000u
#define F32_RANDOM_NEAR 5000000u

static void build_f32_inputs(void)
{
    special_f32(&f32_inputs);
    for (uint32_t i = 0; i < F32_RANDOM_BITS; i++)
        push(&f32_inputs, rng32());
    /* near the fp8 range: exponents 2^-20 .. 2^17, random mantissa and sign,
     * and every fourth with the low 19 mantissa bits cleared, so that ties
     * happen often (e4m3fn: bit 19 alone; e5m2: bit 20 alone) */
    for (uint32_t i = 0; i < F32_RANDOM_NEAR; i++) {
        uint32_t r = rng32();
        uint32_t e = 107 + rng32() % 38;
        uint32_t u = (r & 0x80000000u) | (e << 23) | (rng32() & 0x7FFFFFu);
        if ((r & 3) == 0)
            u &= ~0x7FFFFu;
        push(&f32_inputs, u);
    }
}

static void test_float32_inputs(void)
{
    printf("test_fp8_simd: %zu float32 inputs\n", f32_inputs.n);
    CHECK(f32_inputs.n >= 10000000u);
    for (int v = 0; v < nvariants; v++)
        for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++)
            for (int sat = 0; sat <= 1; sat++)
                CHECK_EQ_INT(compare_encode(&variants[v], fmt, KVS_WIDE_F32, sat, f32_inputs.v,
                                            f32_inputs.n, "float32"), 0);
}

/* ---- lengths, offsets, guards -------------------------------------------------- */

#define MAXLEN 200
#define GUARD 64

/* One source buffer of mixed values for every wide type. */
static unsigned char mixed_src[8 + 4 * MAXLEN];

static void fill_mixed(int wide)
{
    for (size_t i = 0; i < sizeof mixed_src / 4; i++) {
        uint32_t r = rng32();
        uint32_t pick = f32_inputs.v[r % f32_inputs.n];
        if (wide == KVS_WIDE_F32) {
            memcpy(mixed_src + 4 * i, &pick, 4);
        } else {
            uint16_t a = (uint16_t)(pick >> 16), b = (uint16_t)rng32();
            memcpy(mixed_src + 4 * i, &a, 2);
            memcpy(mixed_src + 4 * i + 2, &b, 2);
        }
    }
}

static void test_lengths_and_offsets(void)
{
    unsigned char *got = xmalloc(GUARD + 8 + 4 * MAXLEN + GUARD);
    unsigned char *want = xmalloc(4 * MAXLEN);
    uint8_t codes[8 + MAXLEN];
    size_t bad = 0, guard_bad = 0;

    for (int v = 0; v < nvariants; v++) {
        const variant *var = &variants[v];
        for (int wide = 0; wide < KVS_NWIDE; wide++) {
            fill_mixed(wide);
            for (size_t i = 0; i < sizeof codes; i++)
                codes[i] = (uint8_t)rng32();
            for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++)
                for (size_t n = 0; n <= MAXLEN; n++)
                    for (int so = 0; so < 8; so++) {
                        const int doff = (so * 3 + (int)n) & 7;
                        /* encode, both policies */
                        for (int sat = 0; sat <= 1; sat++) {
                            memset(got, 0xEE, GUARD + 8 + MAXLEN + GUARD);
                            unsigned char *d = got + GUARD + doff;
                            var->k->encode[fmt][wide](mixed_src + so, d, n, sat);
                            ref->encode[fmt][wide](mixed_src + so, want, n, sat);
                            if (memcmp(d, want, n) != 0) {
                                if (bad++ < 5)
                                    fprintf(stderr, "  %s encode %s -> %s sat=%d n=%zu src+%d "
                                            "dst+%d differs\n", var->name, wide_names[wide],
                                            fmt_names[fmt], sat, n, so, doff);
                            }
                            for (size_t g = 0; g < GUARD + (size_t)doff; g++)
                                guard_bad += got[g] != 0xEE;
                            for (size_t g = 0; g < GUARD; g++)
                                guard_bad += d[n + g] != 0xEE;
                        }
                        /* decode */
                        const size_t es = wide_size[wide];
                        memset(got, 0xEE, GUARD + 8 + 4 * MAXLEN + GUARD);
                        unsigned char *d = got + GUARD + doff;
                        var->k->decode[fmt][wide](codes + so, d, n);
                        ref->decode[fmt][wide](codes + so, want, n);
                        if (memcmp(d, want, n * es) != 0) {
                            if (bad++ < 5)
                                fprintf(stderr, "  %s decode %s -> %s n=%zu src+%d dst+%d "
                                        "differs\n", var->name, fmt_names[fmt], wide_names[wide],
                                        n, so, doff);
                        }
                        for (size_t g = 0; g < GUARD + (size_t)doff; g++)
                            guard_bad += got[g] != 0xEE;
                        for (size_t g = 0; g < GUARD; g++)
                            guard_bad += d[n * es + g] != 0xEE;
                    }
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(guard_bad, 0);
    free(got);
    free(want);
}

/* ---- long arrays (non-temporal store path) ---------------------------------- */

/* Arrays past the streaming-store threshold, and not a multiple of any
 * block: test_long_arrays runs them with the threshold lowered to
 * LONG_NT_MIN (so they stream without needing 8 MiB outputs), and once more
 * at bfloat16 -> fp8 with the default threshold and an output just past it. */
#define LONG_N ((size_t)(1u << 20) + 4099)
#define LONG_NT_MIN ((size_t)1 << 20)

/* lut16 (fp8_kernels.h, kv_split's scaled reads): value(c) = hi[c & 0x7F]
 * << 8 | lo[c & 0x7F] | (c & 0x80) << 8 for every code, at every length up
 * to MAXLEN and every alignment of either side, nothing written outside
 * dst; by each variant's kernel, and by kvs_fp8_lut16 with every variant
 * (the scalar fallback where the variant has none); and through the
 * streaming-store path of a long array. */
static void test_lut16(void)
{
    _Alignas(64) uint8_t lo[128], hi[128];
    for (int c = 0; c < 128; c++) {
        lo[c] = (uint8_t)rng32();
        hi[c] = (uint8_t)(rng32() & 0x7F);
    }
    uint8_t codes[8 + MAXLEN];
    for (size_t i = 0; i < sizeof codes; i++) codes[i] = (uint8_t)(i * 37 + 11);
    uint16_t want[MAXLEN];
    unsigned char *got = xmalloc(GUARD + 16 + 2 * MAXLEN + GUARD);
    size_t bad = 0, guard_bad = 0, cases = 0;
    const char *const *names = kvs_fp8_isa_names();
    for (size_t v = 0; names[v]; v++) {
        if (!kvs_fp8_isa_available(names[v])) continue;
        REQUIRE_OK(kvs_fp8_set_isa(names[v]));
        const kvs_fp8_kernels *k;
        REQUIRE_OK(kvs_fp8_kernels_get(&k));
        CHECK_EQ_INT(k->lut16 != NULL, strncmp(names[v], "avx512", 6) == 0);
        for (int direct = 0; direct < 2; direct++) {
            if (direct && k->lut16 == NULL) continue;
            for (size_t n = 0; n <= MAXLEN; n++)
                for (int so = 0; so < 8; so++) {
                    const int doff = (so * 5 + (int)n) & 15;
                    for (size_t i = 0; i < n; i++) {
                        unsigned c = codes[so + i];
                        want[i] = (uint16_t)(hi[c & 0x7F] << 8 | lo[c & 0x7F] | (c & 0x80) << 8);
                    }
                    memset(got, 0xEE, GUARD + 16 + 2 * MAXLEN + GUARD);
                    unsigned char *d = got + GUARD + doff;
                    if (direct)
                        k->lut16(codes + so, d, n, lo, hi);
                    else
                        CHECK_OK(kvs_fp8_lut16(codes + so, d, n, lo, hi));
                    cases++;
                    if (memcmp(d, want, 2 * n) != 0 && bad++ < 5)
                        fprintf(stderr, "  %s lut16 (%s) n=%zu src+%d dst+%d differs\n",
                                names[v], direct ? "kernel" : "kvs_fp8_lut16", n, so, doff);
                    for (size_t g = 0; g < GUARD + (size_t)doff; g++) guard_bad += got[g] != 0xEE;
                    for (size_t g = 0; g < GUARD; g++) guard_bad += d[2 * n + g] != 0xEE;
                }
        }
        /* long, streaming: every code many times */
        const size_t n = LONG_N;
        uint8_t *src = xmalloc(n);
        uint16_t *out = xmalloc(2 * n + 2);
        for (size_t i = 0; i < n; i++) src[i] = (uint8_t)rng32();
        kvs_fp8_set_nt_min_bytes(LONG_NT_MIN);
        CHECK_OK(kvs_fp8_lut16(src, (uint8_t *)out + 2, n, lo, hi));
        kvs_fp8_set_nt_min_bytes(KVS_FP8_NT_DEFAULT_MIN_BYTES);
        size_t long_bad = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned c = src[i];
            uint16_t w = (uint16_t)(hi[c & 0x7F] << 8 | lo[c & 0x7F] | (c & 0x80) << 8), g;
            memcpy(&g, (uint8_t *)out + 2 + 2 * i, 2);
            long_bad += g != w;
        }
        CHECK_EQ_U64(long_bad, 0);
        free(src);
        free(out);
    }
    kvs_fp8_set_isa("auto");
    CHECK(cases > 0);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(guard_bad, 0);
    free(got);
}

/* encode_copy (fp8_kernels.h: the pipeline's streamed fused encode): dst
 * and copy both get exactly the scalar encoder's bytes, at every length up
 * to MAXLEN, every alignment of either, nothing written outside them; and
 * one long array through the whole loop (prefetch, streaming stores). */
static void test_encode_copy(void)
{
    unsigned char *got = xmalloc(GUARD + 8 + MAXLEN + GUARD);
    unsigned char *cp = xmalloc(GUARD + 8 + MAXLEN + GUARD);
    unsigned char *want = xmalloc(MAXLEN);
    size_t bad = 0, guard_bad = 0, cases = 0;
    for (int v = 0; v < nvariants; v++) {
        const variant *var = &variants[v];
        for (int wide = 0; wide < KVS_NWIDE; wide++) {
            fill_mixed(wide);
            for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++) {
                REQUIRE(var->k->encode_copy[fmt][wide] != NULL);
                for (size_t n = 0; n <= MAXLEN; n++)
                    for (int so = 0; so < 8; so++) {
                        const int doff = (so * 3 + (int)n) & 7, coff = (so * 5 + (int)n + 1) & 7;
                        const int sat = (int)(n + so) & 1;
                        memset(got, 0xEE, GUARD + 8 + MAXLEN + GUARD);
                        memset(cp, 0xEE, GUARD + 8 + MAXLEN + GUARD);
                        unsigned char *d = got + GUARD + doff, *c = cp + GUARD + coff;
                        var->k->encode_copy[fmt][wide](mixed_src + so, d, c, n, sat);
                        ref->encode[fmt][wide](mixed_src + so, want, n, sat);
                        cases++;
                        if ((memcmp(d, want, n) != 0 || memcmp(c, want, n) != 0) && bad++ < 5)
                            fprintf(stderr, "  %s encode_copy %s -> %s sat=%d n=%zu src+%d "
                                    "dst+%d copy+%d differs\n", var->name, wide_names[wide],
                                    fmt_names[fmt], sat, n, so, doff, coff);
                        for (size_t g = 0; g < GUARD + (size_t)doff; g++) guard_bad += got[g] != 0xEE;
                        for (size_t g = 0; g < GUARD; g++) guard_bad += d[n + g] != 0xEE;
                        for (size_t g = 0; g < GUARD + (size_t)coff; g++) guard_bad += cp[g] != 0xEE;
                        for (size_t g = 0; g < GUARD; g++) guard_bad += c[n + g] != 0xEE;
                    }
            }
        }
    }
    CHECK_EQ_U64(cases, (uint64_t)nvariants * KVS_NWIDE * KVS_FP8_NFMT * (MAXLEN + 1) * 8);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(guard_bad, 0);
    free(got);
    free(cp);
    free(want);

    /* long: bfloat16 -> e4m3fn, dst and copy at odd offsets */
    const size_t n = LONG_N;
    uint16_t *src = xmalloc(2 * n);
    uint8_t *d = xmalloc(n + 3), *c = xmalloc(n + 5), *w = xmalloc(n);
    for (size_t i = 0; i < n; i++) src[i] = (uint16_t)rng32();
    ref->encode[KVS_FP8_FMT_E4M3FN][KVS_WIDE_BF16](src, w, n, 1);
    for (int v = 0; v < nvariants; v++) {
        memset(d, 0, n + 3);
        memset(c, 0, n + 5);
        variants[v].k->encode_copy[KVS_FP8_FMT_E4M3FN][KVS_WIDE_BF16](src, d + 3, c + 5, n, 1);
        CHECK(memcmp(d + 3, w, n) == 0);
        CHECK(memcmp(c + 5, w, n) == 0);
    }
    free(src);
    free(d);
    free(c);
    free(w);
}


/* bfloat16 -> both formats just past the default threshold, streaming. */
static void test_default_threshold(void)
{
    const size_t n = KVS_FP8_NT_DEFAULT_MIN_BYTES + 4099;
    CHECK_EQ_INT(kvs_fp8_nt_min_bytes() == KVS_FP8_NT_DEFAULT_MIN_BYTES, 1);
    uint16_t *src = xmalloc(2 * n);
    uint8_t *want = xmalloc(n), *buf = xmalloc(n + 64);
    uint8_t *d = buf + (64 - ((uintptr_t)buf & 63)) % 64 + 3;
    for (size_t i = 0; i < n; i++)
        src[i] = (uint16_t)(f32_inputs.v[rng32() % f32_inputs.n] >> 16);
    for (int v = 0; v < nvariants; v++)
        for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++) {
            ref->encode[fmt][KVS_WIDE_BF16](src, want, n, 1);
            memset(d, 0, n);
            variants[v].k->encode[fmt][KVS_WIDE_BF16](src, d, n, 1);
            if (memcmp(d, want, n) != 0) {
                fprintf(stderr, "  %s encode bfloat16 -> %s at the default threshold differs\n",
                        variants[v].name, fmt_names[fmt]);
                CHECK(0);
            }
        }
    free(src);
    free(want);
    free(buf);
}

/* Threshold 0: every call streams, so short arrays exercise the head that
 * aligns dst, the prefetching loop's end, the plain loop and the tail, at
 * every destination offset within a cache line. */
static void test_nt_edges(void)
{
    enum { NOFF = 64 };
    unsigned char *buf = xmalloc(GUARD + NOFF + 4 * MAXLEN + GUARD + 64);
    unsigned char *base = buf + (64 - ((uintptr_t)buf & 63)) % 64 + GUARD; /* 64-aligned */
    unsigned char *want = xmalloc(4 * MAXLEN);
    uint8_t codes[8 + MAXLEN];
    size_t bad = 0, guard_bad = 0;
    for (size_t i = 0; i < sizeof codes; i++)
        codes[i] = (uint8_t)rng32();
    kvs_fp8_set_nt_min_bytes(0);
    for (int v = 0; v < nvariants; v++)
        for (int wide = 0; wide < KVS_NWIDE; wide++) {
            const size_t es = wide_size[wide];
            fill_mixed(wide);
            for (size_t n = 0; n <= MAXLEN; n++)
                for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++) {
                    for (int sat = 0; sat <= 1; sat++) {
                        const unsigned char *s = mixed_src + (n & 1); /* odd: misaligned */
                        ref->encode[fmt][wide](s, want, n, sat);
                        for (int off = 0; off < NOFF; off++) {
                            unsigned char *d = base + off;
                            memset(d - GUARD, 0xEE, GUARD + n + GUARD);
                            variants[v].k->encode[fmt][wide](s, d, n, sat);
                            bad += memcmp(d, want, n) != 0;
                            for (int g = 0; g < GUARD; g++)
                                guard_bad += (d[-1 - g] != 0xEE) + (d[n + g] != 0xEE);
                        }
                    }
                    ref->decode[fmt][wide](codes + (n & 7), want, n);
                    for (int off = 0; off < NOFF; off += (int)es) {
                        unsigned char *d = base + off;
                        memset(d - GUARD, 0xEE, GUARD + n * es + GUARD);
                        variants[v].k->decode[fmt][wide](codes + (n & 7), d, n);
                        bad += memcmp(d, want, n * es) != 0;
                        for (int g = 0; g < GUARD; g++)
                            guard_bad += (d[-1 - g] != 0xEE) + (d[n * es + g] != 0xEE);
                    }
                }
        }
    kvs_fp8_set_nt_min_bytes(KVS_FP8_NT_DEFAULT_MIN_BYTES);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(guard_bad, 0);
    free(buf);
    free(want);
}

static void test_long_arrays(void)
{
    /* (source offset, destination offset from a 64-byte boundary) */
    static const int offs[3][2] = {{0, 0}, {1, 1}, {6, 8}};
    unsigned char *src = xmalloc(4 * LONG_N + 64);
    uint8_t *codes = xmalloc(LONG_N + 64);
    unsigned char *want = xmalloc(4 * LONG_N);
    unsigned char *buf = xmalloc(4 * LONG_N + 128);
    unsigned char *base = buf + (64 - ((uintptr_t)buf & 63)); /* 64-aligned, 64 spare */
    for (size_t i = 0; i < LONG_N + 64; i++)
        codes[i] = (uint8_t)rng32();
    kvs_fp8_set_nt_min_bytes(LONG_NT_MIN);
    for (int v = 0; v < nvariants; v++)
        for (int wide = 0; wide < KVS_NWIDE; wide++) {
            const size_t es = wide_size[wide];
            for (size_t i = 0; i < LONG_N + 16; i++) {
                uint32_t x = f32_inputs.v[rng32() % f32_inputs.n];
                if (wide == KVS_WIDE_F32) {
                    memcpy(src + 4 * i, &x, 4);
                } else {
                    uint16_t h = (uint16_t)(x >> (rng32() & 16));
                    memcpy(src + 2 * i, &h, 2);
                }
            }
            for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++)
                for (int o = 0; o < 3; o++) {
                    const unsigned char *s = src + offs[o][0];
                    unsigned char *d = base + offs[o][1];
                    for (int sat = 0; sat <= 1; sat++) {
                        ref->encode[fmt][wide](s, want, LONG_N, sat);
                        memset(d, 0, LONG_N);
                        variants[v].k->encode[fmt][wide](s, d, LONG_N, sat);
                        if (memcmp(d, want, LONG_N) != 0) {
                            fprintf(stderr, "  %s long encode %s -> %s sat=%d src+%d dst+%d "
                                    "differs\n", variants[v].name, wide_names[wide],
                                    fmt_names[fmt], sat, offs[o][0], offs[o][1]);
                            CHECK(0);
                        }
                    }
                    ref->decode[fmt][wide](codes + offs[o][0], want, LONG_N);
                    memset(d, 0, LONG_N * es);
                    variants[v].k->decode[fmt][wide](codes + offs[o][0], d, LONG_N);
                    if (memcmp(d, want, LONG_N * es) != 0) {
                        fprintf(stderr, "  %s long decode %s -> %s src+%d dst+%d differs\n",
                                variants[v].name, fmt_names[fmt], wide_names[wide],
                                offs[o][0], offs[o][1]);
                        CHECK(0);
                    }
                }
        }
    kvs_fp8_set_nt_min_bytes(KVS_FP8_NT_DEFAULT_MIN_BYTES);
    free(src);
    free(codes);
    free(want);
    free(buf);
}

/* ---- floating-point environment ------------------------------------------------ */

static void test_mxcsr_independent(void)
{
#if HAVE_MXCSR
    const unsigned saved = _mm_getcsr();
    uint8_t codes[256];
    for (int i = 0; i < 256; i++)
        codes[i] = (uint8_t)i;
    /* FTZ (bit 15) and DAZ (bit 6) with each non-default rounding mode
     * (bits 13-14: 1 down, 2 up, 3 toward zero) */
    for (unsigned rc = 1; rc <= 3; rc++) {
        _mm_setcsr((saved & ~0x6000u) | 0x8000u | 0x0040u | (rc << 13));
        for (int v = 0; v < nvariants; v++)
            for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++) {
                for (int sat = 0; sat <= 1; sat++) {
                    CHECK_EQ_INT(compare_encode(&variants[v], fmt, KVS_WIDE_BF16, sat, all16,
                                                65536, "bfloat16 under FTZ/DAZ/directed rounding"), 0);
                    CHECK_EQ_INT(compare_encode(&variants[v], fmt, KVS_WIDE_F16, sat, all16,
                                                65536, "float16 under FTZ/DAZ/directed rounding"), 0);
                    CHECK_EQ_INT(compare_encode(&variants[v], fmt, KVS_WIDE_F32, sat, f32_inputs.v,
                                                1000000, "float32 under FTZ/DAZ/directed rounding"), 0);
                }
                for (int wide = 0; wide < KVS_NWIDE; wide++)
                    CHECK_EQ_INT(compare_decode(&variants[v], fmt, wide, codes, 256,
                                                "codes under FTZ/DAZ/directed rounding"), 0);
            }
        _mm_setcsr(saved);
    }
#endif
}

int main(void)
{
    find_variants();
    build_f32_inputs();
    RUN(test_all_16bit_inputs);
    RUN(test_all_codes);
    RUN(test_float32_inputs);
    RUN(test_lengths_and_offsets);
    RUN(test_encode_copy);
    RUN(test_lut16);
    RUN(test_long_arrays);
    RUN(test_default_threshold);
    RUN(test_nt_edges);
    RUN(test_mxcsr_independent);
    free(f32_inputs.v);
    return TEST_SUMMARY();
}
