/* test_fp8_kernels.c - the scalar fp8 kernels (src/codecs/fp8_scalar.c) and
 * the float16 / bfloat16 helpers (src/codecs/half.h) against an independent
 * reference.
 *
 * The reference never looks at the kernel code: it derives each fp8 code's
 * value as a double from the format definition (sign, exponent, mantissa
 * fields, ldexp), sorts the finite values, and encodes an input (held
 * exactly as a double) by searching for its neighbours and comparing with
 * their exact midpoint; the overflow policy compares |x| with the exact
 * threshold derived from the format (max + half an ulp of max). float16 and
 * bfloat16 inputs are turned into doubles by the same kind of field
 * decoding, not by half.h.
 *
 * Checked: every float16 and bfloat16 input (both formats, both policies,
 * through the array kernels); every float32 rounding boundary and its
 * neighbours; special values; millions of pseudo-random float32 patterns;
 * every code decoded to float32 / float16 / bfloat16; round trips; array
 * kernels on every length 0..200 with unaligned source and destination and
 * guard bytes; the documented values one by one; half.h exhaustively (and
 * against F16C hardware where the CPU has it).
 *
 * The kernel checks run once per variant (scalar, then avx2 and avx512 when
 * kvs_fp8_set_isa() accepts them here), each against the same reference, so
 * every SIMD variant is held to the scalar bytes on the same inputs.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define KVS_TEST_HAVE_X86 1
#else
#define KVS_TEST_HAVE_X86 0
#endif

#include "codecs/fp8_kernels.h"
#include "codecs/half.h"
#include "kvs_test.h"
#include "kvserde/fp8.h"

/* Number of individual comparisons made, reported at the end. */
static uint64_t n_compared;

/* At most this many mismatch lines per test, so a systematic bug does not
 * flood the log (every mismatch still fails the test). */
#define MAX_REPORTS 20
static int n_reported;

static void report_reset(void)
{
    n_reported = 0;
}

/* Fail the running test; print only the first MAX_REPORTS messages. */
#define FAIL_LIMITED(...)                                                  \
    do {                                                                   \
        if (n_reported++ < MAX_REPORTS)                                    \
            KVS_FAIL_(__VA_ARGS__);                                        \
        else                                                               \
            kvs_test_checks_failed_in_test++;                              \
    } while (0)

/* The kernel variant under test (the suite runs once per variant this CPU
 * and build have; the element functions are always the scalar ones). */
static const kvs_fp8_kernels *K;

static const char *const fmt_name[KVS_FP8_NFMT] = {"e4m3fn", "e5m2"};
static const char *const wide_name[KVS_NWIDE] = {"f32", "f16", "bf16"};
static const size_t wide_size[KVS_NWIDE] = {4, 2, 2};

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A NaN with the given sign (copysign is defined on NaN by C99 F.9.8.4). */
static double signed_nan(int negative)
{
    return copysign(NAN, negative ? -1.0 : 1.0);
}

/* xorshift64*: fixed seed, same sequence on every run and platform. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1Dull;
}

static uint32_t rng_u32(void)
{
    return (uint32_t)(rng_next() >> 32);
}

/* ======================================================================
 * Independent reference
 * ====================================================================== */

typedef struct ref_fmt {
    const char *name;
    int exp_bits, mant_bits, bias;
    int ieee_specials;     /* 1: all-ones exponent is inf (mant 0) / NaN
                              (e5m2); 0: only all-ones exp+mant is NaN
                              (e4m3fn, "fn" = finite, no inf) */
    double value[256];     /* value of each code; NaN for NaN codes */
    int npos;              /* nonnegative finite values, ascending */
    double pos[128];
    uint8_t pos_code[128];
    double max;            /* largest finite value */
    uint8_t max_code;
    double overflow_mid;   /* max + half an ulp of max */
    int mid_rounds_up;     /* a tie at overflow_mid goes past max */
    uint8_t nosat_code;    /* non-saturating overflow: inf, or NaN if none */
} ref_fmt;

static ref_fmt REF[KVS_FP8_NFMT];

/* The value of an fp8 code, straight from the format definition. */
static double ref_code_value(const ref_fmt *F, unsigned c)
{
    const int neg = (c >> 7) & 1;
    const unsigned E = (c >> F->mant_bits) & ((1u << F->exp_bits) - 1u);
    const unsigned m = c & ((1u << F->mant_bits) - 1u);
    const unsigned Emax = (1u << F->exp_bits) - 1u;
    const unsigned Mmax = (1u << F->mant_bits) - 1u;
    double v;

    if (F->ieee_specials && E == Emax)
        return m == 0 ? (neg ? -INFINITY : INFINITY) : signed_nan(neg);
    if (!F->ieee_specials && E == Emax && m == Mmax)
        return signed_nan(neg);
    if (E == 0) /* subnormal: 0.m * 2^(1-bias) */
        v = ldexp((double)m, 1 - F->bias - F->mant_bits);
    else /* normal: 1.m * 2^(E-bias) */
        v = ldexp((double)((1u << F->mant_bits) + m),
                  (int)E - F->bias - F->mant_bits);
    return neg ? -v : v;
}

static void ref_init_one(ref_fmt *F, const char *name, int exp_bits,
                         int mant_bits, int bias, int ieee_specials)
{
    memset(F, 0, sizeof *F);
    F->name = name;
    F->exp_bits = exp_bits;
    F->mant_bits = mant_bits;
    F->bias = bias;
    F->ieee_specials = ieee_specials;
    for (unsigned c = 0; c < 256; c++)
        F->value[c] = ref_code_value(F, c);

    /* Collect the nonnegative finite values and sort them (insertion sort,
     * no assumption that codes are ordered like values). */
    F->npos = 0;
    for (unsigned c = 0; c < 128; c++) {
        double v = F->value[c];
        if (isnan(v) || isinf(v))
            continue;
        int i = F->npos++;
        while (i > 0 && F->pos[i - 1] > v) {
            F->pos[i] = F->pos[i - 1];
            F->pos_code[i] = F->pos_code[i - 1];
            i--;
        }
        F->pos[i] = v;
        F->pos_code[i] = (uint8_t)c;
    }
    F->max = F->pos[F->npos - 1];
    F->max_code = F->pos_code[F->npos - 1];
    /* The value after max would be max + (max - previous), same binade. A
     * tie there rounds to whichever has the even lowest mantissa bit: the
     * next value's is the opposite of max's, so it goes past max exactly
     * when max's mantissa is odd. */
    F->overflow_mid = F->max + (F->max - F->pos[F->npos - 2]) / 2;
    F->mid_rounds_up = F->max_code & 1;
    F->nosat_code = ieee_specials
                        ? (uint8_t)(((1u << exp_bits) - 1u) << mant_bits)
                        : 0x7F;
}

static void ref_init(void)
{
    ref_init_one(&REF[KVS_FP8_FMT_E4M3FN], "e4m3fn", 4, 3, 7, 0);
    ref_init_one(&REF[KVS_FP8_FMT_E5M2], "e5m2", 5, 2, 15, 1);
}

/* Encode the exact value x. */
static uint8_t ref_encode(const ref_fmt *F, double x, int saturate)
{
    const uint8_t s = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return s | 0x7F;
    const double ax = fabs(x);
    if (isinf(ax) || ax > F->overflow_mid ||
        (ax == F->overflow_mid && F->mid_rounds_up))
        return s | (saturate ? F->max_code : F->nosat_code);
    if (ax >= F->max)
        return s | F->max_code;

    /* pos[lo] <= ax < pos[hi], hi = lo + 1 (pos[0] = 0 <= ax < max). */
    int lo = 0, hi = F->npos - 1;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (F->pos[mid] <= ax)
            lo = mid;
        else
            hi = mid;
    }
    /* Both values have at most 4 significant bits: their mean is exact. */
    const double m = (F->pos[lo] + F->pos[hi]) / 2;
    uint8_t c;
    if (ax < m)
        c = F->pos_code[lo];
    else if (ax > m)
        c = F->pos_code[hi];
    else /* tie: the one whose lowest mantissa bit (code bit 0) is 0 */
        c = (F->pos_code[lo] & 1) ? F->pos_code[hi] : F->pos_code[lo];
    return s | c;
}

/* Exact value of a float32 bit pattern as a double (NaN keeps its sign). */
static double f32_value(uint32_t u)
{
    if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x7FFFFFu))
        return signed_nan(u >> 31);
    return (double)u2f(u);
}

/* Exact value of a float16 bit pattern, from its fields. */
static double f16_value(uint16_t h)
{
    const int neg = h >> 15;
    const unsigned E = (h >> 10) & 0x1F, m = h & 0x3FF;
    double v;
    if (E == 31)
        return m ? signed_nan(neg) : (neg ? -INFINITY : INFINITY);
    if (E == 0)
        v = ldexp(m, -24);
    else
        v = ldexp(1024 + m, (int)E - 25);
    return neg ? -v : v;
}

/* Exact value of a bfloat16 bit pattern, from its fields. */
static double bf16_value(uint16_t b)
{
    const int neg = b >> 15;
    const unsigned E = (b >> 7) & 0xFF, m = b & 0x7F;
    double v;
    if (E == 255)
        return m ? signed_nan(neg) : (neg ? -INFINITY : INFINITY);
    if (E == 0)
        v = ldexp(m, -133);
    else
        v = ldexp(128 + m, (int)E - 134);
    return neg ? -v : v;
}

/* Same value and same sign (so +0 != -0); NaN equals NaN of either sign. */
static int same_value(double a, double b)
{
    if (isnan(a) || isnan(b))
        return isnan(a) && isnan(b);
    return a == b && signbit(a) == signbit(b);
}

/* ---- helpers to compare and report ---- */

static void check_code(const char *what, int fmt, int sat, uint32_t input,
                       uint8_t got, uint8_t want)
{
    n_compared++;
    if (got == want)
        return;
    kvs_test_checks_failed_in_test++;
    if (n_reported++ < MAX_REPORTS)
        fprintf(stderr,
                "  [%s] mismatch %s %s sat=%d input 0x%08x: got 0x%02x want "
                "0x%02x\n",
                K->isa, what, fmt_name[fmt], sat, (unsigned)input, got, want);
}

static uint8_t elem_encode(int fmt, float x, int sat)
{
    return fmt == KVS_FP8_FMT_E4M3FN ? kvs_fp8_e4m3fn_from_f32(x, sat)
                                     : kvs_fp8_e5m2_from_f32(x, sat);
}

static float elem_decode(int fmt, uint8_t c)
{
    return fmt == KVS_FP8_FMT_E4M3FN ? kvs_fp8_e4m3fn_to_f32(c)
                                     : kvs_fp8_e5m2_to_f32(c);
}


/* ======================================================================
 * The reference itself: the format facts the header documents
 * ====================================================================== */

static void test_reference_matches_documented_format(void)
{
    const ref_fmt *A = &REF[KVS_FP8_FMT_E4M3FN], *B = &REF[KVS_FP8_FMT_E5M2];
    /* Codes map to distinct values (the sort found no duplicates). */
    for (int f = 0; f < KVS_FP8_NFMT; f++)
        for (int i = 1; i < REF[f].npos; i++)
            CHECK(REF[f].pos[i - 1] < REF[f].pos[i]);

    CHECK_EQ_INT(A->npos, 127); /* 0x00..0x7E */
    CHECK(A->max == 448.0 && A->max == KVS_FP8_E4M3FN_MAX);
    CHECK_EQ_INT(A->max_code, 0x7E);
    CHECK(A->overflow_mid == 464.0);
    CHECK_EQ_INT(A->mid_rounds_up, 0);
    CHECK_EQ_INT(A->nosat_code, 0x7F);
    CHECK(A->pos[1] == ldexp(1, -9)); /* min subnormal */
    CHECK(isnan(A->value[0x7F]) && isnan(A->value[0xFF]));
    CHECK(A->value[0x80] == 0 && signbit(A->value[0x80]));

    CHECK_EQ_INT(B->npos, 124); /* 0x00..0x7B */
    CHECK(B->max == 57344.0 && B->max == KVS_FP8_E5M2_MAX);
    CHECK_EQ_INT(B->max_code, 0x7B);
    CHECK(B->overflow_mid == 61440.0);
    CHECK_EQ_INT(B->mid_rounds_up, 1);
    CHECK_EQ_INT(B->nosat_code, 0x7C);
    CHECK(B->pos[1] == ldexp(1, -16));
    CHECK(isinf(B->value[0x7C]) && B->value[0x7C] > 0);
    CHECK(isinf(B->value[0xFC]) && B->value[0xFC] < 0);
    for (unsigned c = 0x7D; c <= 0x7F; c++)
        CHECK(isnan(B->value[c]) && isnan(B->value[c | 0x80]));

    /* The spec's non-saturating rules, stated literally, agree with the
     * reference's "rounds past max" rule on values around the thresholds. */
    const double probes[] = {448, 455.99, 456, 463.999, 464, 464.0001, 470,
                             480, 500, 1e9};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        uint8_t want = probes[i] > 464 ? 0x7F : ref_encode(A, probes[i], 1);
        CHECK_EQ_INT(ref_encode(A, probes[i], 0), want);
        CHECK_EQ_INT(ref_encode(A, -probes[i], 0), want | 0x80);
    }
    const double probes5[] = {57344, 59000, 61439.99, 61440, 61440.01,
                              65536, 1e9};
    for (size_t i = 0; i < sizeof probes5 / sizeof probes5[0]; i++) {
        uint8_t want = probes5[i] >= 61440 ? 0x7C : 0x7B;
        CHECK_EQ_INT(ref_encode(B, probes5[i], 0), want);
        CHECK_EQ_INT(ref_encode(B, -probes5[i], 0), want | 0x80);
    }
}

static const char *variant_name; /* the name K was selected by */

static void test_kernel_table(void)
{
    REQUIRE(K != NULL);
    CHECK_EQ_STR(K->isa, variant_name);
    if (strcmp(variant_name, "scalar") == 0)
        CHECK(K == kvs_fp8_kernels_scalar());
    for (int f = 0; f < KVS_FP8_NFMT; f++)
        for (int w = 0; w < KVS_NWIDE; w++) {
            CHECK(K->encode[f][w] != NULL);
            CHECK(K->decode[f][w] != NULL);
        }
}

/* ======================================================================
 * 1. Every float16 and bfloat16 input
 * ====================================================================== */

static void test_encode_all_f16_bf16(void)
{
    uint16_t *src = malloc(65536 * sizeof *src);
    uint8_t *dst = malloc(65536);
    REQUIRE(src && dst);
    report_reset();
    for (uint32_t i = 0; i < 65536; i++)
        src[i] = (uint16_t)i;
    for (int w = KVS_WIDE_F16; w <= KVS_WIDE_BF16; w++)
        for (int f = 0; f < KVS_FP8_NFMT; f++)
            for (int sat = 0; sat <= 1; sat++) {
                memset(dst, 0xA5, 65536);
                K->encode[f][w](src, dst, 65536, sat);
                for (uint32_t i = 0; i < 65536; i++) {
                    double x = w == KVS_WIDE_F16 ? f16_value((uint16_t)i)
                                                 : bf16_value((uint16_t)i);
                    check_code(wide_name[w], f, sat, i, dst[i],
                               ref_encode(&REF[f], x, sat));
                }
            }
    free(src);
    free(dst);
}

/* ======================================================================
 * 2. float32: rounding boundaries, specials, random patterns
 * ====================================================================== */

typedef struct u32_list {
    uint32_t *v;
    size_t n, cap;
} u32_list;

static void list_add(u32_list *l, uint32_t u)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v)
            abort();
    }
    l->v[l->n++] = u;
}

/* x, its neighbours 1 and 2 float32 ulps away, all with both signs. */
static void list_add_around(u32_list *l, float x)
{
    float down = x, up = x;
    for (int k = 0; k < 3; k++) {
        list_add(l, f2u(down));
        list_add(l, f2u(down) ^ 0x80000000u);
        list_add(l, f2u(up));
        list_add(l, f2u(up) ^ 0x80000000u);
        down = nextafterf(down, -INFINITY);
        up = nextafterf(up, INFINITY);
    }
}

static void build_f32_boundaries(u32_list *l)
{
    for (int f = 0; f < KVS_FP8_NFMT; f++) {
        const ref_fmt *F = &REF[f];
        for (int i = 0; i < F->npos; i++) {
            double v = F->pos[i];
            double next = i + 1 < F->npos
                              ? F->pos[i + 1]
                              : F->max + (F->max - F->pos[i - 1]);
            double mid = (v + next) / 2;
            /* fp8 values and their midpoints fit float32 exactly. */
            if ((double)(float)mid != mid || (double)(float)next != next)
                abort();
            list_add_around(l, (float)v);
            list_add_around(l, (float)mid);
            /* quarter points: clearly on one side */
            list_add_around(l, (float)((v + mid) / 2));
            list_add_around(l, (float)((mid + next) / 2));
        }
        /* Past the overflow threshold: the value after max, the one after
         * that, and their midpoint (e4m3fn: 480, 496, 512). */
        double ulp = F->max - F->pos[F->npos - 2];
        list_add_around(l, (float)(F->max + ulp));
        list_add_around(l, (float)(F->max + 1.5 * ulp));
        list_add_around(l, (float)(F->max + 2 * ulp));
        /* below the smallest subnormal: a quarter and an eighth of it */
        list_add_around(l, (float)(F->pos[1] / 4));
        list_add_around(l, (float)(F->pos[1] / 8));
    }
    /* Every power of two in and well around the fp8 ranges. */
    for (int e = -30; e <= 20; e++)
        list_add_around(l, ldexpf(1.0f, e));
    /* Specials. */
    static const uint32_t specials[] = {
        0x00000000u, 0x80000000u,             /* +-0 */
        0x7F800000u, 0xFF800000u,             /* +-inf */
        0x7FC00000u, 0xFFC00000u,             /* quiet NaN */
        0x7FC00001u, 0x7FE00000u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0xFFD55555u,
        0x7F800001u, 0xFF800001u,             /* signalling NaN */
        0x7FA00000u, 0x7FBFFFFFu, 0xFFBFFFFFu, 0x7F800100u,
        0x00000001u, 0x80000001u,             /* float32 subnormals */
        0x00400000u, 0x007FFFFFu, 0x807FFFFFu, 0x00012345u,
        0x00800000u, 0x80800000u,             /* FLT_MIN */
        0x7F7FFFFFu, 0xFF7FFFFFu,             /* FLT_MAX */
        0x7F000000u, 0x4F000000u, 0x47800000u, /* 2^127, 2^31, 2^16 */
    };
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        list_add(l, specials[i]);
}

/* Encode the list through the array kernel and the element function and
 * compare both with the reference. */
static void check_f32_list(const uint32_t *in, size_t n, const char *what)
{
    uint8_t *dst = malloc(n ? n : 1);
    if (!dst)
        abort();
    for (int f = 0; f < KVS_FP8_NFMT; f++)
        for (int sat = 0; sat <= 1; sat++) {
            K->encode[f][KVS_WIDE_F32](in, dst, n, sat);
            for (size_t i = 0; i < n; i++) {
                uint8_t want = ref_encode(&REF[f], f32_value(in[i]), sat);
                check_code(what, f, sat, in[i], dst[i], want);
                check_code(what, f, sat, in[i],
                           elem_encode(f, u2f(in[i]), sat), want);
            }
        }
    free(dst);
}

static void test_encode_f32_boundaries(void)
{
    u32_list l = {0};
    report_reset();
    build_f32_boundaries(&l);
    CHECK(l.n > 5000);
    printf("  %zu float32 boundary inputs\n", l.n);
    check_f32_list(l.v, l.n, "f32 boundary");
    free(l.v);
}

#define RANDOM_CHUNK 65536
#define RANDOM_CHUNKS 64 /* x 2 kinds x 65536 = 8.4 M inputs */

static void test_encode_f32_random(void)
{
    uint32_t *in = malloc(RANDOM_CHUNK * sizeof *in);
    REQUIRE(in);
    report_reset();
    for (int chunk = 0; chunk < RANDOM_CHUNKS; chunk++) {
        /* Uniform bit patterns (mostly far outside the fp8 range). */
        for (size_t i = 0; i < RANDOM_CHUNK; i++)
            in[i] = rng_u32();
        check_f32_list(in, RANDOM_CHUNK, "f32 random bits");
        /* Random sign and mantissa, exponent in [2^-20, 2^18): the fp8
         * ranges, their subnormals and the overflow region. */
        for (size_t i = 0; i < RANDOM_CHUNK; i++) {
            uint32_t r = rng_u32();
            uint32_t e = 127 - 20 + (uint32_t)(rng_next() % 38);
            in[i] = (r & 0x807FFFFFu) | (e << 23);
        }
        check_f32_list(in, RANDOM_CHUNK, "f32 random in range");
    }
    free(in);
}

/* ======================================================================
 * 3. Decode every code
 * ====================================================================== */

/* Decoding of one code, checked whatever path produced it. */
static void check_decoded(int f, int w, unsigned c, uint32_t got_bits)
{
    const double want = REF[f].value[c];
    const int neg = (c >> 7) & 1;
    int ok;
    n_compared++;
    if (isnan(want)) {
        static const uint32_t canon[KVS_NWIDE] = {0x7FC00000u, 0x7E00u,
                                                  0x7FC0u};
        static const uint32_t signbit_of[KVS_NWIDE] = {0x80000000u, 0x8000u,
                                                       0x8000u};
        ok = got_bits == (canon[w] | (neg ? signbit_of[w] : 0));
    } else {
        double got = w == KVS_WIDE_F32   ? f32_value(got_bits)
                     : w == KVS_WIDE_F16 ? f16_value((uint16_t)got_bits)
                                         : bf16_value((uint16_t)got_bits);
        ok = same_value(got, want);
    }
    if (!ok) {
        kvs_test_checks_failed_in_test++;
        if (n_reported++ < MAX_REPORTS)
            fprintf(stderr, "  [%s] mismatch decode %s -> %s code 0x%02x: got 0x%x\n",
                    K->isa, fmt_name[f], wide_name[w], c, (unsigned)got_bits);
    }
}

static uint32_t load_wide(const unsigned char *p, int w)
{
    if (w == KVS_WIDE_F32) {
        uint32_t u;
        memcpy(&u, p, 4);
        return u;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

static void test_decode_all_codes(void)
{
    /* 256 codes once (short path) and 9 times plus 3 (long arrays may take
     * another path: both must be right). */
    enum { LONG = 256 * 9 + 3 };
    uint8_t *codes = malloc(LONG);
    unsigned char *out = malloc(LONG * 4);
    REQUIRE(codes && out);
    report_reset();
    for (size_t i = 0; i < LONG; i++)
        codes[i] = (uint8_t)(i * 7 + 3); /* every code, shuffled order */
    for (int f = 0; f < KVS_FP8_NFMT; f++) {
        for (unsigned c = 0; c < 256; c++) /* element function */
            check_decoded(f, KVS_WIDE_F32, c, f2u(elem_decode(f, (uint8_t)c)));
        for (int w = 0; w < KVS_NWIDE; w++) {
            const size_t ns[2] = {256, LONG};
            for (int k = 0; k < 2; k++) {
                memset(out, 0xA5, LONG * 4);
                K->decode[f][w](codes, out, ns[k]);
                for (size_t i = 0; i < ns[k]; i++)
                    check_decoded(f, w, codes[i],
                                  load_wide(out + i * wide_size[w], w));
                for (size_t i = ns[k] * wide_size[w]; i < LONG * 4; i++)
                    if (out[i] != 0xA5) {
                        KVS_FAIL_("[%s] decode %s->%s n=%zu wrote byte %zu",
                                  K->isa, fmt_name[f], wide_name[w], ns[k], i);
                        break;
                    }
            }
        }
    }
    /* The documented NaN / inf bits, explicitly. */
    CHECK_EQ_U64(f2u(kvs_fp8_e4m3fn_to_f32(0x7F)), 0x7FC00000u);
    CHECK_EQ_U64(f2u(kvs_fp8_e4m3fn_to_f32(0xFF)), 0xFFC00000u);
    CHECK_EQ_U64(f2u(kvs_fp8_e5m2_to_f32(0x7D)), 0x7FC00000u);
    CHECK_EQ_U64(f2u(kvs_fp8_e5m2_to_f32(0xFE)), 0xFFC00000u);
    CHECK_EQ_U64(f2u(kvs_fp8_e5m2_to_f32(0x7C)), 0x7F800000u);
    CHECK_EQ_U64(f2u(kvs_fp8_e5m2_to_f32(0xFC)), 0xFF800000u);
    CHECK_EQ_U64(f2u(kvs_fp8_e4m3fn_to_f32(0x7E)), f2u(448.0f));
    CHECK_EQ_U64(f2u(kvs_fp8_e4m3fn_to_f32(0x01)), f2u(ldexpf(1, -9)));
    CHECK_EQ_U64(f2u(kvs_fp8_e5m2_to_f32(0x01)), f2u(ldexpf(1, -16)));
    CHECK_EQ_U64(f2u(kvs_fp8_e4m3fn_to_f32(0x80)), 0x80000000u);
    {
        uint8_t c[2] = {0x7F, 0xFF};
        uint16_t h[2];
        K->decode[KVS_FP8_FMT_E4M3FN][KVS_WIDE_F16](c, h, 2);
        CHECK_EQ_U64(h[0], 0x7E00);
        CHECK_EQ_U64(h[1], 0xFE00);
        K->decode[KVS_FP8_FMT_E4M3FN][KVS_WIDE_BF16](c, h, 2);
        CHECK_EQ_U64(h[0], 0x7FC0);
        CHECK_EQ_U64(h[1], 0xFFC0);
        c[0] = 0x7C; /* e5m2 inf */
        K->decode[KVS_FP8_FMT_E5M2][KVS_WIDE_F16](c, h, 2);
        CHECK_EQ_U64(h[0], 0x7C00);
        CHECK_EQ_U64(h[1], 0xFE00);
        K->decode[KVS_FP8_FMT_E5M2][KVS_WIDE_BF16](c, h, 2);
        CHECK_EQ_U64(h[0], 0x7F80);
        CHECK_EQ_U64(h[1], 0xFFC0);
    }
    free(codes);
    free(out);
}

/* ======================================================================
 * 4. Round trip
 * ====================================================================== */

static void test_round_trip(void)
{
    uint8_t codes[256], back[256];
    unsigned char wide[256 * 4];
    report_reset();
    for (unsigned c = 0; c < 256; c++)
        codes[c] = (uint8_t)c;
    for (int f = 0; f < KVS_FP8_NFMT; f++) {
        const ref_fmt *F = &REF[f];
        for (int sat = 0; sat <= 1; sat++) {
            /* What each code must come back as: itself if finite; NaN codes
             * as the canonical 0x7F | sign; inf as +-max or inf. */
            uint8_t want[256];
            for (unsigned c = 0; c < 256; c++) {
                double v = F->value[c];
                if (isnan(v))
                    want[c] = (uint8_t)((c & 0x80) | 0x7F);
                else if (isinf(v))
                    want[c] = (uint8_t)((c & 0x80) |
                                        (sat ? F->max_code : F->nosat_code));
                else
                    want[c] = (uint8_t)c;
            }
            for (unsigned c = 0; c < 256; c++)
                check_code("roundtrip elem", f, sat, c,
                           elem_encode(f, elem_decode(f, (uint8_t)c), sat),
                           want[c]);
            for (int w = 0; w < KVS_NWIDE; w++) {
                K->decode[f][w](codes, wide, 256);
                K->encode[f][w](wide, back, 256, sat);
                for (unsigned c = 0; c < 256; c++)
                    check_code(wide_name[w], f, sat, c, back[c], want[c]);
            }
        }
    }
}

/* ======================================================================
 * 5. Array kernels: every length 0..200, unaligned, guard bytes
 * ====================================================================== */

#define MAXN 200
#define GUARD 16
#define MAXOFF 7

static void check_guards(const unsigned char *buf, size_t total, size_t lo,
                         size_t hi, const char *what, int f, int w, size_t n,
                         int off)
{
    for (size_t i = 0; i < total; i++) {
        if ((i < lo || i >= hi) && buf[i] != 0xA5) {
            FAIL_LIMITED("[%s] %s %s/%s n=%zu dst offset %d: wrote byte %td "
                         "outside [dst, dst+n)", K->isa, what, fmt_name[f],
                         wide_name[w], n, off, (ptrdiff_t)i - (ptrdiff_t)lo);
            return;
        }
    }
}

/* An interesting float32 input: an fp8 value, a midpoint, a special or
 * random bits. */
static uint32_t interesting_f32(void)
{
    const ref_fmt *F = &REF[rng_next() & 1];
    uint32_t r = rng_u32();
    switch (r % 5) {
    case 0: {
        int i = (int)(rng_next() % (uint64_t)(F->npos - 1));
        return f2u((float)((F->pos[i] + F->pos[i + 1]) / 2)) | (r & 0x80000000u);
    }
    case 1:
        return f2u((float)F->pos[rng_next() % (uint64_t)F->npos]) ^
               ((r >> 8) & 1) ^ (r & 0x80000000u);
    case 2:
        return (r & 1) ? 0x7FC00001u : 0xFF800000u;
    default:
        return rng_u32();
    }
}

static void test_array_kernels_lengths_offsets(void)
{
    /* Inputs: 200 wide elements of each type, 200 codes. */
    uint32_t in32[MAXN];
    uint16_t in16[MAXN], inbf[MAXN];
    uint8_t codes[MAXN];
    for (int i = 0; i < MAXN; i++) {
        in32[i] = interesting_f32();
        in16[i] = (uint16_t)rng_u32();
        inbf[i] = (uint16_t)(in32[i] >> 16) ^ (uint16_t)(rng_u32() & 3);
        codes[i] = (uint8_t)rng_u32();
    }
    const void *inputs[KVS_NWIDE] = {in32, in16, inbf};
    report_reset();

    enum { SRCB = MAXN * 4 + MAXOFF + 8, DSTB = GUARD + MAXOFF + MAXN * 4 + GUARD };
    unsigned char srcbuf[SRCB], dstbuf[DSTB], want[MAXN * 4];
    uint64_t ncalls = 0;

    for (int w = 0; w < KVS_NWIDE; w++) {
        const size_t es = wide_size[w];
        for (int f = 0; f < KVS_FP8_NFMT; f++) {
            /* expected bytes from the element functions */
            uint8_t want_enc[2][MAXN];
            for (int sat = 0; sat <= 1; sat++)
                for (int i = 0; i < MAXN; i++) {
                    float x = w == KVS_WIDE_F32   ? u2f(in32[i])
                              : w == KVS_WIDE_F16 ? kvs_f16_to_f32(in16[i])
                                                  : kvs_bf16_to_f32(inbf[i]);
                    want_enc[sat][i] = elem_encode(f, x, sat);
                }
            for (int i = 0; i < MAXN; i++) {
                uint32_t u = f2u(elem_decode(f, codes[i]));
                if (w == KVS_WIDE_F32) {
                    memcpy(want + 4 * i, &u, 4);
                } else {
                    uint16_t h = w == KVS_WIDE_F16 ? kvs_f32_bits_to_f16_bits(u)
                                                   : (uint16_t)(u >> 16);
                    memcpy(want + 2 * i, &h, 2);
                }
            }

            for (size_t n = 0; n <= MAXN; n++)
                for (int so = 0; so <= MAXOFF; so++)
                    for (int doff = 0; doff <= MAXOFF; doff++) {
                        /* encode */
                        memcpy(srcbuf + so, inputs[w], n * es);
                        for (int sat = 0; sat <= 1; sat++) {
                            memset(dstbuf, 0xA5, sizeof dstbuf);
                            uint8_t *d = dstbuf + GUARD + doff;
                            K->encode[f][w](srcbuf + so, d, n, sat);
                            ncalls++;
                            if (memcmp(d, want_enc[sat], n) != 0)
                                FAIL_LIMITED("[%s] encode %s/%s sat=%d n=%zu "
                                             "src+%d dst+%d differs from "
                                             "elements", K->isa, fmt_name[f],
                                             wide_name[w], sat, n, so, doff);
                            check_guards(dstbuf, sizeof dstbuf, GUARD + doff,
                                         GUARD + doff + n, "encode", f, w, n,
                                         doff);
                            if (memcmp(srcbuf + so, inputs[w], n * es) != 0)
                                FAIL_LIMITED("[%s] encode changed its source",
                                             K->isa);
                        }
                        /* decode */
                        memcpy(srcbuf + so, codes, n);
                        memset(dstbuf, 0xA5, sizeof dstbuf);
                        unsigned char *d = dstbuf + GUARD + doff;
                        K->decode[f][w](srcbuf + so, d, n);
                        ncalls++;
                        if (memcmp(d, want, n * es) != 0)
                            FAIL_LIMITED("[%s] decode %s/%s n=%zu src+%d "
                                         "dst+%d differs from elements",
                                         K->isa, fmt_name[f], wide_name[w], n,
                                         so, doff);
                        check_guards(dstbuf, sizeof dstbuf, GUARD + doff,
                                     GUARD + doff + n * es, "decode", f, w, n,
                                     doff);
                    }
        }
    }
    n_compared += ncalls;
    CHECK(ncalls == (uint64_t)3 * 2 * 201 * 64 * 3);
}

/* Long arrays (decoders may switch strategy with n): odd lengths around
 * powers of two, unaligned, guard bytes, against the element functions. */
static void test_array_kernels_long(void)
{
    static const size_t lens[] = {255, 256, 257, 511, 512, 513, 1023, 4099};
    enum { MAXL = 4099 };
    uint8_t *codes = malloc(MAXL + 8);
    unsigned char *buf = malloc(GUARD + 8 + MAXL * 4 + GUARD);
    unsigned char *src = malloc(MAXL * 4 + 8);
    uint8_t *enc = malloc(GUARD + 8 + MAXL + GUARD);
    REQUIRE(codes && buf && src && enc);
    report_reset();
    for (size_t i = 0; i < MAXL + 8; i++)
        codes[i] = (uint8_t)rng_u32();
    for (int f = 0; f < KVS_FP8_NFMT; f++)
        for (int w = 0; w < KVS_NWIDE; w++)
            for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
                for (int off = 1; off <= 7; off += 3) {
                    const size_t n = lens[li], es = wide_size[w];
                    const size_t total = GUARD + 8 + MAXL * 4 + GUARD;
                    memset(buf, 0xA5, total);
                    K->decode[f][w](codes + off, buf + GUARD + off, n);
                    int bad = 0;
                    for (size_t i = 0; i < n && !bad; i++) {
                        uint32_t u = f2u(elem_decode(f, codes[off + i]));
                        uint32_t got = load_wide(buf + GUARD + off + i * es, w);
                        uint32_t exp = w == KVS_WIDE_F32 ? u
                                       : w == KVS_WIDE_F16
                                           ? kvs_f32_bits_to_f16_bits(u)
                                           : u >> 16;
                        bad = got != exp;
                    }
                    if (bad)
                        FAIL_LIMITED("[%s] decode %s/%s n=%zu differs",
                                     K->isa, fmt_name[f], wide_name[w], n);
                    check_guards(buf, total, GUARD + off,
                                 GUARD + off + n * es, "decode long", f, w, n,
                                 off);
                    /* encode those wide values back (unaligned source) */
                    memcpy(src + off, buf + GUARD + off, n * es);
                    memset(enc, 0xA5, GUARD + 8 + MAXL + GUARD);
                    K->encode[f][w](src + off, enc + GUARD + off, n, 1);
                    for (size_t i = 0; i < n; i++) {
                        uint8_t c = codes[off + i];
                        double v = REF[f].value[c];
                        uint8_t exp = isnan(v) ? (uint8_t)((c & 0x80) | 0x7F)
                                      : isinf(v) ? (uint8_t)((c & 0x80) |
                                                             REF[f].max_code)
                                                 : c;
                        if (enc[GUARD + off + i] != exp) {
                            FAIL_LIMITED("[%s] encode long %s/%s n=%zu i=%zu",
                                         K->isa, fmt_name[f], wide_name[w], n,
                                         i);
                            break;
                        }
                    }
                    check_guards(enc, GUARD + 8 + MAXL + GUARD, GUARD + off,
                                 GUARD + off + n, "encode long", f, w, n, off);
                    n_compared += 2 * n;
                }
    free(codes);
    free(buf);
    free(src);
    free(enc);
}

/* ======================================================================
 * 6. The documented values, one by one
 * ====================================================================== */

/* Element function and array kernel (float32), both must give `want`. */
#define CHECK_E4(x, sat, want)                                              \
    do {                                                                    \
        float in_ = (x);                                                     \
        uint8_t arr_;                                                       \
        K->encode[KVS_FP8_FMT_E4M3FN][KVS_WIDE_F32](&in_, &arr_, 1, (sat));    \
        CHECK_EQ_INT(kvs_fp8_e4m3fn_from_f32(in_, (sat)), (want));           \
        CHECK_EQ_INT(arr_, (want));                                           \
    } while (0)
#define CHECK_E5(x, sat, want)                                              \
    do {                                                                    \
        float in_ = (x);                                                     \
        uint8_t arr_;                                                       \
        K->encode[KVS_FP8_FMT_E5M2][KVS_WIDE_F32](&in_, &arr_, 1, (sat));      \
        CHECK_EQ_INT(kvs_fp8_e5m2_from_f32(in_, (sat)), (want));             \
        CHECK_EQ_INT(arr_, (want));                                           \
    } while (0)

static void test_documented_values(void)
{
    /* e4m3fn */
    CHECK_E4(448.0f, 1, 0x7E);
    CHECK_E4(448.0f, 0, 0x7E);
    CHECK_E4(-448.0f, 1, 0xFE);
    CHECK_E4(464.0f, 1, 0x7E);
    CHECK_E4(464.0f, 0, 0x7E); /* tie, even mantissa: stays 448 */
    CHECK_E4(-464.0f, 0, 0xFE);
    CHECK_E4(464.0001f, 1, 0x7E);
    CHECK_E4(464.0001f, 0, 0x7F);
    CHECK_E4(nextafterf(464.0f, INFINITY), 0, 0x7F);
    CHECK_E4(-464.0001f, 0, 0xFF);
    CHECK_E4(480.0f, 1, 0x7E);
    CHECK_E4(480.0f, 0, 0x7F);
    CHECK_E4(1e30f, 1, 0x7E);
    CHECK_E4(1e30f, 0, 0x7F);
    CHECK_E4(INFINITY, 1, 0x7E);
    CHECK_E4(INFINITY, 0, 0x7F);
    CHECK_E4(-INFINITY, 1, 0xFE);
    CHECK_E4(-INFINITY, 0, 0xFF);
    CHECK_E4(NAN, 1, 0x7F);
    CHECK_E4(NAN, 0, 0x7F);
    CHECK_E4(u2f(0xFFC00000u), 1, 0xFF);
    CHECK_E4(u2f(0x7F800001u), 1, 0x7F); /* signalling NaN */
    CHECK_E4(ldexpf(1, -10), 1, 0x00);   /* half the smallest subnormal */
    CHECK_E4(ldexpf(1, -10), 0, 0x00);
    CHECK_E4(nextafterf(ldexpf(1, -10), 1), 1, 0x01);
    CHECK_E4(-ldexpf(1, -10), 1, 0x80);
    CHECK_E4(ldexpf(3, -10), 1, 0x02); /* 1.5 x min subnormal: tie to even */
    CHECK_E4(ldexpf(1, -9), 1, 0x01);
    CHECK_E4(ldexpf(15, -10), 1, 0x08); /* 7.5 x 2^-9: tie up to 2^-6 */
    CHECK_E4(-0.0f, 1, 0x80);
    CHECK_E4(-0.0f, 0, 0x80);
    CHECK_E4(0.0f, 1, 0x00);
    CHECK_E4(1.0f, 1, 0x38);
    CHECK_E4(-2.0f, 1, 0xC0);
    CHECK_E4(1.0625f, 1, 0x38); /* tie between 1 and 1.125: even is 1 */
    CHECK_E4(1.1875f, 1, 0x3A); /* tie between 1.125 and 1.25: even 1.25 */
    CHECK_E4(u2f(0x00000001u), 1, 0x00); /* float32 subnormal */
    CHECK_E4(-FLT_MAX, 0, 0xFF);

    /* e5m2 */
    CHECK_E5(57344.0f, 1, 0x7B);
    CHECK_E5(57344.0f, 0, 0x7B);
    CHECK_E5(61440.0f, 1, 0x7B);
    CHECK_E5(61440.0f, 0, 0x7C); /* tie, max's mantissa odd: goes up */
    CHECK_E5(-61440.0f, 0, 0xFC);
    CHECK_E5(61439.996f, 1, 0x7B);
    CHECK_E5(61439.996f, 0, 0x7B);
    CHECK_E5(65536.0f, 1, 0x7B);
    CHECK_E5(65536.0f, 0, 0x7C);
    CHECK_E5(INFINITY, 1, 0x7B);
    CHECK_E5(INFINITY, 0, 0x7C);
    CHECK_E5(-INFINITY, 1, 0xFB);
    CHECK_E5(-INFINITY, 0, 0xFC);
    CHECK_E5(NAN, 1, 0x7F);
    CHECK_E5(NAN, 0, 0x7F);
    CHECK_E5(u2f(0xFFC00000u), 0, 0xFF);
    CHECK_E5(ldexpf(1, -17), 1, 0x00); /* half the smallest subnormal */
    CHECK_E5(nextafterf(ldexpf(1, -17), 1), 1, 0x01);
    CHECK_E5(ldexpf(1, -16), 1, 0x01);
    CHECK_E5(-0.0f, 1, 0x80);
    CHECK_E5(1.0f, 1, 0x3C);
    CHECK_E5(FLT_MAX, 0, 0x7C);

    /* float16 and bfloat16 sources go through the same rounding. */
    {
        uint16_t h[4] = {0x7C00, 0xFC00, 0x7E00, 0x5B40}; /* inf -inf NaN 232 */
        uint8_t c[4];
        K->encode[KVS_FP8_FMT_E4M3FN][KVS_WIDE_F16](h, c, 4, 1);
        CHECK_EQ_INT(c[0], 0x7E);
        CHECK_EQ_INT(c[1], 0xFE);
        CHECK_EQ_INT(c[2], 0x7F);
        CHECK_EQ_INT(c[3], 0x76); /* 232 = tie of 224/240 -> 224 */
        K->encode[KVS_FP8_FMT_E5M2][KVS_WIDE_F16](h, c, 4, 0);
        CHECK_EQ_INT(c[0], 0x7C);
        CHECK_EQ_INT(c[1], 0xFC);
        CHECK_EQ_INT(c[2], 0x7F);
        uint16_t b[2] = {0x43E8, 0x43E9}; /* 464, 466 */
        K->encode[KVS_FP8_FMT_E4M3FN][KVS_WIDE_BF16](b, c, 2, 0);
        CHECK_EQ_INT(c[0], 0x7E);
        CHECK_EQ_INT(c[1], 0x7F);
    }
}

/* ======================================================================
 * half.h
 * ====================================================================== */

static void test_half_widen_all(void)
{
    report_reset();
    for (uint32_t i = 0; i < 65536; i++) {
        const uint16_t h = (uint16_t)i;
        /* float16 */
        uint32_t got = kvs_f16_bits_to_f32_bits(h);
        double want = f16_value(h);
        int ok;
        if (isnan(want)) /* NaN: sign, payload << 13, quiet bit set */
            ok = got == (((uint32_t)(h & 0x8000) << 16) | 0x7FC00000u |
                         ((uint32_t)(h & 0x3FF) << 13));
        else
            ok = same_value(f32_value(got), want);
        ok = ok && f2u(kvs_f16_to_f32(h)) == got;
        /* bfloat16: value from the fields, and every bit kept */
        uint32_t gotb = kvs_bf16_bits_to_f32_bits(h);
        ok = ok && gotb == ((uint32_t)h << 16) &&
             same_value(f32_value(gotb), bf16_value(h)) &&
             f2u(kvs_bf16_to_f32(h)) == gotb;
        n_compared += 2;
        if (!ok) {
            kvs_test_checks_failed_in_test++;
            if (n_reported++ < MAX_REPORTS)
                fprintf(stderr, "  widen 0x%04x: f16 -> 0x%08x\n", h,
                        (unsigned)got);
        }
    }
}

/* Narrowing float32 -> float16 / bfloat16, exhaustively at every boundary:
 * each value round-trips, each midpoint goes to the even neighbour and the
 * float32 values next to it go to the nearer one. */
static void test_half_narrow_boundaries(void)
{
    for (int kind = 0; kind < 2; kind++) { /* 0 = f16, 1 = bf16 */
        const uint32_t last = kind ? 0x7F7F : 0x7BFF; /* largest finite */
        const uint32_t inf = kind ? 0x7F80 : 0x7C00;
        int bad = 0;
        for (uint32_t h = 0; h <= last && bad < MAX_REPORTS; h++) {
            for (uint32_t s = 0; s <= 0x8000; s += 0x8000) {
                double v = kind ? bf16_value((uint16_t)h) : f16_value((uint16_t)h);
                double nv = h == last ? (kind ? ldexp(1, 128) : 65536.0)
                                      : (kind ? bf16_value((uint16_t)(h + 1))
                                              : f16_value((uint16_t)(h + 1)));
                float fv = (float)v, mid = (float)((v + nv) / 2);
                if ((double)mid != (v + nv) / 2)
                    abort(); /* midpoints are float32 values */
                if (s) {
                    fv = -fv;
                    mid = -mid;
                }
                uint16_t (*nar)(uint32_t) =
                    kind ? kvs_f32_bits_to_bf16_bits : kvs_f32_bits_to_f16_bits;
                const uint32_t up = h + 1 > last ? inf : h + 1;
                const uint32_t even = (h & 1) ? up : h;
                const float toward0 = nextafterf(mid, 0);
                const float away = nextafterf(mid, s ? -INFINITY : INFINITY);
                int ok = nar(f2u(fv)) == (h | s) && nar(f2u(mid)) == (even | s) &&
                         nar(f2u(toward0)) == (h | s) && nar(f2u(away)) == (up | s);
                n_compared += 4;
                if (!ok) {
                    bad++;
                    KVS_FAIL_("narrow %s h=0x%04x sign=%u", kind ? "bf16" : "f16",
                              (unsigned)h, (unsigned)s);
                }
            }
        }
        /* NaN: quiet, sign and top payload kept; inf stays inf. */
        uint16_t (*nar)(uint32_t) =
            kind ? kvs_f32_bits_to_bf16_bits : kvs_f32_bits_to_f16_bits;
        CHECK_EQ_U64(nar(0x7F800000u), inf);
        CHECK_EQ_U64(nar(0xFF800000u), inf | 0x8000);
        CHECK_EQ_U64(nar(0x7FC00000u), kind ? 0x7FC0 : 0x7E00);
        CHECK_EQ_U64(nar(0xFFC00000u), kind ? 0xFFC0 : 0xFE00);
        CHECK_EQ_U64(nar(0x7F800001u), kind ? 0x7FC0 : 0x7E00);
        CHECK_EQ_U64(nar(0x7FA02000u), kind ? 0x7FE0 : 0x7F01);
        CHECK_EQ_U64(nar(0x7F7FFFFFu), inf); /* FLT_MAX */
        CHECK_EQ_U64(nar(0x00000001u), 0);   /* float32 subnormal */
        CHECK_EQ_U64(nar(0x80000001u), 0x8000);
    }
    CHECK_EQ_U64(kvs_f32_to_f16(1.0f), 0x3C00);
    CHECK_EQ_U64(kvs_f32_to_bf16(1.0f), 0x3F80);
}

#if KVS_TEST_HAVE_X86
__attribute__((target("f16c"))) static uint32_t hw_f16_to_f32(uint16_t h)
{
    return f2u(_cvtsh_ss(h));
}

__attribute__((target("f16c"))) static uint16_t hw_f32_to_f16(uint32_t u)
{
    return (uint16_t)_cvtss_sh(u2f(u), _MM_FROUND_TO_NEAREST_INT);
}
#endif

/* half.h must give the F16C instructions' results, NaNs included. */
static void test_half_matches_f16c(void)
{
#if KVS_TEST_HAVE_X86
    /* F16C is a VEX extension: it needs the OS's AVX state support (which
     * __builtin_cpu_supports("avx") checks) and its own CPUID bit (not every
     * compiler's __builtin_cpu_supports knows "f16c"). */
    unsigned eax, ebx, ecx = 0, edx;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx") || !__get_cpuid(1, &eax, &ebx, &ecx, &edx) ||
        !(ecx & (1u << 29))) {
        printf("test_half_matches_f16c: no F16C on this CPU, skipped\n");
        return;
    }
    report_reset();
    for (uint32_t i = 0; i < 65536; i++) {
        uint32_t want = hw_f16_to_f32((uint16_t)i);
        uint32_t got = kvs_f16_bits_to_f32_bits((uint16_t)i);
        n_compared++;
        if (got != want)
            FAIL_LIMITED("f16 0x%04x: got 0x%08x, F16C 0x%08x", (unsigned)i,
                         (unsigned)got, (unsigned)want);
    }
    for (uint32_t i = 0; i < 2000000; i++) {
        uint32_t u = rng_u32();
        if (i & 1) /* half of them near the float16 range */
            u = (u & 0x807FFFFFu) | ((uint32_t)(127 - 26 + (u >> 8) % 44) << 23);
        uint16_t want = hw_f32_to_f16(u), got = kvs_f32_bits_to_f16_bits(u);
        n_compared++;
        if (got != want)
            FAIL_LIMITED("f32 0x%08x: got 0x%04x, F16C 0x%04x", (unsigned)u,
                         (unsigned)got, (unsigned)want);
    }
#else
    printf("test_half_matches_f16c: not x86, skipped\n");
#endif
}

/* The variant switch: the names, the refusals with their messages, the
 * CPU checks (read here from CPUID independently of the dispatcher) and
 * "auto" choosing the widest variant this CPU runs. */
static void test_isa_switch(void)
{
    const char *const *names = kvs_fp8_isa_names();
    static const char *const want[] = {"scalar", "avx2", "avx512", "avx512fp16"};
    size_t n = 0;
    while (names[n]) n++;
    CHECK_EQ_U64(n, 4);
    for (size_t i = 0; i < 4 && i < n; i++) CHECK_EQ_STR(names[i], want[i]);

    REQUIRE_OK(kvs_fp8_set_isa("scalar"));
    CHECK_ERR(kvs_fp8_set_isa("avx1024"), KVS_EINVAL,
              "fp8: unknown isa 'avx1024'; known: scalar, avx2, avx512, avx512fp16, auto");
    CHECK_EQ_STR(kvs_fp8_isa(), "scalar"); /* unchanged */
    CHECK_ERR(kvs_fp8_set_isa(NULL), KVS_EINVAL, "fp8: isa name is NULL");
    CHECK_EQ_INT(kvs_fp8_isa_available(NULL), 0);
    CHECK_EQ_INT(kvs_fp8_isa_available("auto"), 0);

    int expect[4] = {1, 0, 0, 0};
#if KVS_TEST_HAVE_X86
    unsigned eax, ebx, ecx = 0, edx = 0;
    __builtin_cpu_init();
    const int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
    expect[1] = f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                __builtin_cpu_supports("bmi2");
    expect[2] = expect[1] && __builtin_cpu_supports("avx512f") &&
                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
    edx = 0;
    expect[3] = expect[2] && __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) &&
                (edx & (1u << 23)); /* AVX512-FP16 */
#endif
    const char *widest = "scalar";
    for (size_t i = 0; i < 4; i++) {
        CHECK_EQ_INT(kvs_fp8_isa_available(want[i]), expect[i]);
        if (expect[i]) {
            widest = want[i];
            CHECK_OK(kvs_fp8_set_isa(want[i]));
            CHECK_EQ_STR(kvs_fp8_isa(), want[i]);
        } else {
            char msg[128];
            snprintf(msg, sizeof msg, "fp8: isa '%s' is not supported by this CPU or build",
                     want[i]);
            CHECK_ERR(kvs_fp8_set_isa(want[i]), KVS_EUNSUPPORTED, msg);
        }
    }
    printf("test_isa_switch: this CPU runs up to %s\n", widest);
    CHECK_OK(kvs_fp8_set_isa("auto"));
    CHECK_EQ_STR(kvs_fp8_isa(), widest);
}

int main(void)
{
    clock_t t0 = clock();
    ref_init();

    /* Independent of the variant: the reference, the element functions
     * (through the scalar table) and half.h. */
    RUN(test_reference_matches_documented_format);
    RUN(test_half_widen_all);
    RUN(test_half_narrow_boundaries);
    RUN(test_half_matches_f16c);
    RUN(test_isa_switch);

    /* The whole kernel suite, once per variant this CPU and build have:
     * every variant must give the reference's bytes, bit for bit. */
    const char *const *variants = kvs_fp8_isa_names();
    for (size_t v = 0; variants[v]; v++) {
        variant_name = variants[v];
        K = NULL;
        if (strcmp(variant_name, "scalar") == 0) {
            K = kvs_fp8_kernels_scalar();
        } else if (kvs_fp8_set_isa(variant_name) == KVS_OK) {
            if (kvs_fp8_kernels_get(&K) != KVS_OK)
                K = NULL;
        } else {
            printf("variant %s: not available on this CPU or build, skipped\n",
                   variant_name);
            continue;
        }
        printf("variant %s\n", variant_name);
        RUN(test_kernel_table);
        if (K == NULL || strcmp(K->isa, variant_name) != 0)
            continue;
        RUN(test_documented_values);
        RUN(test_encode_all_f16_bf16);
        RUN(test_encode_f32_boundaries);
        RUN(test_encode_f32_random);
        RUN(test_decode_all_codes);
        RUN(test_round_trip);
        RUN(test_array_kernels_lengths_offsets);
        RUN(test_array_kernels_long);
    }
    kvs_fp8_set_isa("auto");

    printf("%" PRIu64 " comparisons in %.1f s cpu\n", n_compared,
           (double)(clock() - t0) / CLOCKS_PER_SEC);
    return TEST_SUMMARY();
}
