/* test_ggml.c - the ggml_q8_0 / ggml_q4_0 blocks (ggml.h): bytes equal to
 * llama.cpp's reference quantizers, transcribed here on their own (with an
 * independent float16 rounding), on hand-checked vectors (ties, zeros, equal
 * values, subnormal and overflowing scales, the first of equal magnitudes)
 * and on random data of every source dtype; every kernel variant against
 * the scalar one, every float16 / bfloat16 pattern included, every block
 * count to 66 at every byte offset; non-finite input refused; round trips within the documented bounds on synthetic data
 * and on the real KV cache (../shared/kvdata); the serdes, the registry, the
 * pipeline stages and a split across a processor's workers. */
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/ggml_kernels.h"
#include "codecs/half.h"
#include "kvs_test.h"
#include "kvs_test_kvdata.h"
#include "kvserde/kvserde.h"

static const kvs_dtype wides[3] = {KVS_DTYPE_FLOAT32, KVS_DTYPE_FLOAT16, KVS_DTYPE_BFLOAT16};
static const char *const isas[] = {"scalar", "avx2", "avx512"};

/* ---- the test's own transcription of the reference ------------------------- */

/* float32 -> float16 bits, round to nearest even, by scaling in double (an
 * exact operation) and rint (the default rounding mode): not half.h's
 * integer method. Finite input only. */
static uint16_t t_f16(float f)
{
    uint16_t sign = signbit(f) ? 0x8000 : 0;
    double a = fabs((double)f);
    if (a >= 65520.0) return sign | 0x7C00;
    if (a < ldexp(1.0, -14)) return (uint16_t)(sign | (uint16_t)rint(a * ldexp(1.0, 24)));
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    double m = rint(a * ldexp(1.0, 11 - e)); /* 1024..2048 */
    if (m == 2048.0) {
        m = 1024.0;
        e++;
    }
    if (e - 1 > 15) return sign | 0x7C00;
    return (uint16_t)(sign | (uint16_t)((e - 1 + 15) << 10) | (uint16_t)((int)m - 1024));
}

static void t_q8_0(const float *x, uint8_t *y)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
    float d = amax / 127;
    float id = d ? 1.0f / d : 0.0f;
    uint16_t h = t_f16(d);
    y[0] = (uint8_t)h;
    y[1] = (uint8_t)(h >> 8);
    for (int j = 0; j < 32; j++) {
        float v = x[j] * id;
        y[2 + j] = isfinite(v) ? (uint8_t)(int8_t)roundf(v) : 0;
    }
}

static void t_q4_0(const float *x, uint8_t *y)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    float d = max / -8;
    float id = d ? 1.0f / d : 0.0f;
    uint16_t h = t_f16(d);
    y[0] = (uint8_t)h;
    y[1] = (uint8_t)(h >> 8);
    for (int j = 0; j < 16; j++) {
        float v0 = x[j] * id, v1 = x[j + 16] * id;
        float s0 = v0 + 8.5f, s1 = v1 + 8.5f;
        int a = isfinite(s0) ? (int)s0 : 0, b = isfinite(s1) ? (int)s1 : 0;
        y[2 + j] = (uint8_t)((a < 15 ? a : 15) | (b < 15 ? b : 15) << 4);
    }
}

static size_t bb(kvs_ggml_type t)
{
    return t == KVS_GGML_Q8_0 ? 34 : 18;
}

static void t_encode(kvs_ggml_type t, const float *x, uint8_t *y, size_t nblocks)
{
    for (size_t b = 0; b < nblocks; b++)
        (t == KVS_GGML_Q8_0 ? t_q8_0 : t_q4_0)(x + 32 * b, y + bb(t) * b);
}

/* Store n float32 values as dtype dt and put the stored values back in x,
 * so the reference sees what the encoder sees; a value the dtype cannot
 * hold (it overflows to inf) becomes 0. */
static void *as_dtype(float *x, size_t n, kvs_dtype dt)
{
    void *p = malloc(n * kvs_dtype_size(dt));
    for (size_t i = 0; i < n; i++) {
        if (dt == KVS_DTYPE_FLOAT32) {
            memcpy((uint8_t *)p + 4 * i, &x[i], 4);
            continue;
        }
        uint16_t h = dt == KVS_DTYPE_FLOAT16 ? kvs_f32_to_f16(x[i]) : kvs_f32_to_bf16(x[i]);
        if ((h & 0x7FFF) >= (dt == KVS_DTYPE_FLOAT16 ? 0x7C00 : 0x7F80)) h = 0;
        memcpy((uint8_t *)p + 2 * i, &h, 2);
        x[i] = dt == KVS_DTYPE_FLOAT16 ? kvs_f16_to_f32(h) : kvs_bf16_to_f32(h);
    }
    return p;
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static float gauss(void)
{
    float u = ((float)(rnd() % 1000000) + 0.5f) / 1e6f, v = (float)(rnd() % 1000000) / 1e6f;
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* Encode with every available variant and compare with the transcription. */
static void check_blocks(kvs_ggml_type t, float *x, size_t nblocks, kvs_dtype dt,
                         const char *what)
{
    size_t n = 32 * nblocks;
    void *src = as_dtype(x, n, dt);
    uint8_t *want = malloc(bb(t) * nblocks + 1), *got = malloc(bb(t) * nblocks + 1);
    t_encode(t, x, want, nblocks);
    for (size_t i = 0; i < 3; i++) {
        if (!kvs_fp8_isa_available(isas[i])) continue;
        REQUIRE_OK(kvs_fp8_set_isa(isas[i]));
        memset(got, 0xA5, bb(t) * nblocks + 1);
        CHECK_OK(kvs_ggml_encode(src, dt, got, t, n));
        CHECK(got[bb(t) * nblocks] == 0xA5); /* nothing past the blocks */
        for (size_t k = 0; k < bb(t) * nblocks; k++) {
            if (got[k] != want[k]) {
                KVS_FAIL_("%s %s %s (%s): byte %zu (block %zu) is 0x%02x, reference 0x%02x",
                          kvs_ggml_type_name(t), kvs_dtype_name(dt), what, isas[i], k,
                          k / bb(t), got[k], want[k]);
                break;
            }
        }
    }
    REQUIRE_OK(kvs_fp8_set_isa("auto"));
    free(src);
    free(want);
    free(got);
}

/* Whether dtype dt holds every one of x[0..n) exactly. */
static int holds_exactly(const float *x, size_t n, kvs_dtype dt)
{
    for (size_t i = 0; i < n; i++) {
        if (dt == KVS_DTYPE_FLOAT32) continue;
        float back = dt == KVS_DTYPE_FLOAT16 ? kvs_f16_to_f32(kvs_f32_to_f16(x[i]))
                                             : kvs_bf16_to_f32(kvs_f32_to_bf16(x[i]));
        if (memcmp(&back, &x[i], 4) != 0) return 0;
    }
    return 1;
}

/* One block through each variant, bytes compared with `want`: as float32,
 * and as float16 and bfloat16 when they hold it exactly; alone, and as 20
 * copies (so the SIMD paths for 16 blocks at once run). */
static void check_exact(kvs_ggml_type t, const float *x, const uint8_t *want, const char *what)
{
    enum { COPIES = 20 };
    float xs[32 * COPIES];
    uint8_t got[34 * COPIES];
    for (int c = 0; c < COPIES; c++) memcpy(xs + 32 * c, x, sizeof(float) * 32);
    for (int w = 0; w < 3; w++) {
        if (!holds_exactly(x, 32, wides[w])) continue;
        void *src = as_dtype(xs, 32 * COPIES, wides[w]);
        for (size_t i = 0; i < 3; i++) {
            if (!kvs_fp8_isa_available(isas[i])) continue;
            REQUIRE_OK(kvs_fp8_set_isa(isas[i]));
            for (int copies = 1; copies <= COPIES; copies += COPIES - 1) {
                CHECK_OK(kvs_ggml_encode(src, wides[w], got, t, 32 * (size_t)copies));
                for (int c = 0; c < copies; c++) {
                    if (memcmp(got + bb(t) * (size_t)c, want, bb(t)) == 0) continue;
                    char g[120] = "", wa[120] = "";
                    for (size_t k = 0; k < bb(t); k++) {
                        snprintf(g + strlen(g), sizeof g - strlen(g), "%02x", got[bb(t) * c + k]);
                        snprintf(wa + strlen(wa), sizeof wa - strlen(wa), "%02x", want[k]);
                    }
                    KVS_FAIL_("%s %s %s (%s, copy %d of %d):\n    got  %s\n    want %s",
                              kvs_ggml_type_name(t), kvs_dtype_name(wides[w]), what, isas[i], c,
                              copies, g, wa);
                    break;
                }
            }
        }
        free(src);
    }
    REQUIRE_OK(kvs_fp8_set_isa("auto"));
}

/* ---- hand-checked vectors ---------------------------------------------------- */

static void test_known_blocks(void)
{
    float x[32];
    uint8_t w[34];

    /* Zeros (and -0): q8_0 d = +0; q4_0 max stays +0, so d = 0 / -8 = -0
     * (0x8000) and every nibble is trunc(0 + 8.5) = 8. */
    for (int j = 0; j < 32; j++) x[j] = j % 2 ? -0.0f : 0.0f;
    memset(w, 0, 34);
    check_exact(KVS_GGML_Q8_0, x, w, "zeros");
    w[0] = 0x00, w[1] = 0x80;
    memset(w + 2, 0x88, 16);
    check_exact(KVS_GGML_Q4_0, x, w, "zeros");
    for (int j = 0; j < 32; j++) x[j] = -0.0f;
    check_exact(KVS_GGML_Q4_0, x, w, "negative zeros");

    /* A block of equal values 1.0: q8_0 d = 1/127 -> float16 0x2008, codes
     * 127; q4_0 max 1, d = -0.125 (0xB000), id = -8: 1 * -8 + 8.5 = 0.5 ->
     * 0. Equal negative values -3: d = 0.375 (0x3600), nibbles 0. */
    for (int j = 0; j < 32; j++) x[j] = 1.0f;
    w[0] = 0x08, w[1] = 0x20;
    memset(w + 2, 0x7F, 32);
    check_exact(KVS_GGML_Q8_0, x, w, "equal 1.0");
    w[0] = 0x00, w[1] = 0xB0;
    memset(w + 2, 0x00, 16);
    check_exact(KVS_GGML_Q4_0, x, w, "equal 1.0");
    for (int j = 0; j < 32; j++) x[j] = -3.0f;
    w[0] = 0x00, w[1] = 0x36;
    check_exact(KVS_GGML_Q4_0, x, w, "equal -3.0");

    /* Ties: amax 127 gives d = 1, id = 1, so x * id is x: roundf takes
     * halves away from zero (0.5 -> 1, -2.5 -> -3; RNE would give 0, -2). */
    memset(x, 0, sizeof x);
    x[0] = 127.0f, x[1] = 0.5f, x[2] = -0.5f, x[3] = 1.5f, x[4] = -2.5f, x[5] = 126.5f;
    x[6] = 0.49999997f, x[7] = -127.0f;
    memset(w, 0, 34);
    w[0] = 0x00, w[1] = 0x3C;
    const int8_t q8[8] = {127, 1, -1, 2, -3, 127, 0, -127};
    for (int j = 0; j < 8; j++) w[2 + j] = (uint8_t)q8[j];
    check_exact(KVS_GGML_Q8_0, x, w, "ties");
    /* The same halves in a block bfloat16 and float16 hold exactly (0.25
     * for 0.49999997): code 0. */
    x[6] = 0.25f;
    check_exact(KVS_GGML_Q8_0, x, w, "ties, every dtype");

    /* q4_0: max -8 -> d = 1, id = 1; trunc(x + 8.5): 0.5 -> 9, -0.5 -> 8,
     * 7 -> 15, 7.6 -> 16 clamped to 15, -8 -> 0, 8 (a later +8 of equal
     * magnitude does not replace the first -8) -> 16 -> 15. */
    memset(x, 0, sizeof x);
    x[0] = -8.0f, x[1] = 0.5f, x[2] = -0.5f, x[3] = 7.0f, x[4] = 7.6f, x[16] = 8.0f;
    x[17] = -7.5f;
    w[0] = 0x00, w[1] = 0x3C;
    const uint8_t lo[16] = {0, 9, 8, 15, 15, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
    const uint8_t hi[16] = {15, 1, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8};
    for (int j = 0; j < 16; j++) w[2 + j] = (uint8_t)(lo[j] | hi[j] << 4);
    check_exact(KVS_GGML_Q4_0, x, w, "ties and clamp");
    /* ...and the sign of d follows the first: +8 first gives d = -1. */
    x[0] = 8.0f, x[16] = -8.0f;
    w[1] = 0xBC;
    w[2] = (uint8_t)(0 | 15 << 4);
    w[2 + 1] = (uint8_t)(8 | 15 << 4);  /* 0.5 * -1 + 8.5 = 8; -7.5 -> 16 -> 15 */
    w[2 + 2] = (uint8_t)(9 | 8 << 4);   /* -0.5 -> 9 */
    w[2 + 3] = (uint8_t)(1 | 8 << 4);   /* 7 -> 1.5 -> 1 */
    w[2 + 4] = (uint8_t)(0 | 8 << 4);   /* 7.6 -> 0.9 -> 0 */
    check_exact(KVS_GGML_Q4_0, x, w, "first of equal magnitudes");
    /* In a block every dtype holds (7.5 for 7.6): 7.5 * -1 + 8.5 = 1. With
     * -8 first, 7.5 + 8.5 = 16 is clamped to 15, as 7.6 was. */
    x[4] = 7.5f;
    w[2 + 4] = (uint8_t)(1 | 8 << 4);
    check_exact(KVS_GGML_Q4_0, x, w, "first of equal magnitudes, every dtype");
    x[0] = -8.0f, x[16] = 8.0f;
    w[1] = 0x3C;
    for (int j = 0; j < 16; j++) w[2 + j] = (uint8_t)(lo[j] | hi[j] << 4);
    check_exact(KVS_GGML_Q4_0, x, w, "ties and clamp, every dtype");

    /* Subnormal float16 scale: amax 127 x 2^-20 -> d = 2^-20 = 16 x 2^-24
     * (0x0010); codes as for d = 1. */
    memset(x, 0, sizeof x);
    x[0] = ldexpf(127.0f, -20), x[1] = ldexpf(-3.0f, -20);
    memset(w, 0, 34);
    w[0] = 0x10, w[2] = 127, w[3] = (uint8_t)(int8_t)-3;
    check_exact(KVS_GGML_Q8_0, x, w, "subnormal d");

    /* 1 / d overflows (float32 subnormal input): d is +-0 in float16 and
     * kvserde writes code 0 (documented). */
    memset(x, 0, sizeof x);
    x[0] = 1e-40f, x[3] = -3e-41f;
    memset(w, 0, 34);
    check_exact(KVS_GGML_Q8_0, x, w, "1/d overflows");
    w[0] = 0x00, w[1] = 0x80; /* d = 1e-40 / -8 rounds to -0 in float16 */
    check_exact(KVS_GGML_Q4_0, x, w, "1/d overflows");

    /* A d beyond float16: stored as infinity, as the reference does. */
    for (int j = 0; j < 32; j++) x[j] = j == 5 ? 1e7f : 1.0f;
    uint8_t got[34];
    REQUIRE_OK(kvs_ggml_encode(x, KVS_DTYPE_FLOAT32, got, KVS_GGML_Q8_0, 32));
    CHECK(got[0] == 0x00 && got[1] == 0x7C && got[2 + 5] == 127 && got[2] == 0);
}

/* ---- random data, every dtype, every variant ------------------------------- */

static void test_random_vs_reference(void)
{
    enum { NB = 2048 };
    float *x = malloc(sizeof(float) * 32 * NB);
    for (int kind = 0; kind < 5; kind++) {
        for (int t = 0; t < 2; t++)
            for (int w = 0; w < 3; w++) {
        for (size_t i = 0; i < 32 * NB; i++) {
            size_t b = i / 32;
            float scale = ldexpf(1.0f, (int)(b % 40) - 20);
            switch (kind) {
            case 0: x[i] = gauss() * scale; break;
            case 1: x[i] = (float)((int)(rnd() % 33) - 16) * 0.5f * scale; break; /* ties */
            case 2: { /* random finite bit patterns */
                uint32_t u;
                do u = rnd() << 16 ^ rnd(); while ((u & 0x7F800000u) == 0x7F800000u);
                x[i] = kvs_f32_from_bits(u);
                break;
            }
            case 3: x[i] = (float)(rnd() % 3) * 127.0f / (float)(1 + b % 127); break;
            default: x[i] = gauss() * 1e-39f; break; /* tiny: 1/d overflows */
            }
        }
                char what[32];
                snprintf(what, sizeof what, "random kind %d", kind);
                check_blocks((kvs_ggml_type)t, x, NB, wides[w], what);
            }
    }
    free(x);
}

/* roundf's ties and near-ties: blocks with amax 127 (d = 1, id = 1, so
 * x * id is x) holding every float32 within 300 ulps of k and k + 0.5 for
 * k = 0..127, both signs. */
static void test_rounding_near_ties(void)
{
    enum { PER = 601, NK = 128 * 2 * 2 };
    size_t n = (size_t)PER * NK, nb = (n + 30) / 31;
    float *x = malloc(sizeof(float) * 32 * nb);
    size_t v = 0;
    for (size_t b = 0; b < nb; b++) {
        x[32 * b] = 127.0f;
        for (int j = 1; j < 32; j++) {
            size_t i = v < n ? v++ : 0;
            size_t which = i / PER;
            float c = (float)(which / 4) + ((which & 1) ? 0.5f : 0.0f);
            if (c > 126.5f) c = 126.5f;
            int off = (int)(i % PER) - PER / 2;
            float f = c;
            for (int s = 0; s < abs(off); s++) f = nextafterf(f, off < 0 ? -INFINITY : INFINITY);
            if (fabsf(f) > 127.0f) f = 127.0f;
            x[32 * b + j] = (which & 2) ? -f : f;
        }
    }
    for (int t = 0; t < 2; t++) check_blocks((kvs_ggml_type)t, x, nb, KVS_DTYPE_FLOAT32, "near ties");
    free(x);
}

/* Every float16 and every bfloat16 pattern (the non-finite ones replaced
 * by 0) in blocks, in several arrangements, against the reference. */
static void test_all_half_patterns(void)
{
    enum { N = 65536 };
    for (int w = 1; w < 3; w++) {
        float *x = malloc(sizeof(float) * N);
        for (int arr = 0; arr < 3; arr++) {
            for (uint32_t i = 0; i < N; i++) {
                uint16_t h = (uint16_t)(arr == 0 ? i : arr == 1 ? i * 40503u : (i * 7u) ^ (i >> 5));
                float f = w == 1 ? kvs_f16_to_f32(h) : kvs_bf16_to_f32(h);
                x[i] = isfinite(f) ? f : 0.0f;
            }
            for (int t = 0; t < 2; t++) check_blocks((kvs_ggml_type)t, x, N / 32, wides[w], "all patterns");
        }
        free(x);
    }
}

/* Decoding: dequantize_row_* for every scale pattern and every code, each
 * variant against the reference product, to every destination dtype. */
static void test_decode_all(void)
{
    enum { NB = 65536 };
    for (int t = 0; t < 2; t++) {
        size_t b = bb((kvs_ggml_type)t);
        uint8_t *in = malloc(b * NB);
        for (size_t k = 0; k < NB; k++) {
            in[b * k] = (uint8_t)k, in[b * k + 1] = (uint8_t)(k >> 8);
            for (size_t j = 2; j < b; j++) in[b * k + j] = (uint8_t)(k * 31 + j * 17);
        }
        float *want = malloc(sizeof(float) * 32 * NB);
        for (size_t k = 0; k < NB; k++) {
            float d = kvs_f16_to_f32((uint16_t)k);
            for (int j = 0; j < 32; j++) {
                int q = t == 0 ? (int8_t)in[b * k + 2 + j]
                               : j < 16 ? (in[b * k + 2 + j] & 15) - 8 : (in[b * k + 2 + j - 16] >> 4) - 8;
                want[32 * k + j] = (float)q * d;
            }
        }
        for (int w = 0; w < 3; w++) {
            size_t es = kvs_dtype_size(wides[w]);
            /* cache-line aligned, so with the streaming threshold at 0 the
             * streaming stores run too */
            uint8_t *got = aligned_alloc(64, es * 32 * NB);
            for (size_t i = 0; i < 6; i++) {
                if (!kvs_fp8_isa_available(isas[i % 3])) continue;
                REQUIRE_OK(kvs_fp8_set_isa(isas[i % 3]));
                kvs_fp8_set_nt_min_bytes(i < 3 ? KVS_FP8_NT_DEFAULT_MIN_BYTES : 0);
                CHECK_OK(kvs_ggml_decode(in, (kvs_ggml_type)t, got, wides[w], 32 * NB));
                for (size_t e = 0; e < 32 * NB; e++) {
                    uint32_t g, r;
                    if (w == 0) {
                        memcpy(&g, got + 4 * e, 4);
                        r = kvs_f32_to_bits(want[e]);
                    } else {
                        uint16_t h;
                        memcpy(&h, got + 2 * e, 2);
                        g = h;
                        r = w == 1 ? kvs_f32_to_f16(want[e]) : kvs_f32_to_bf16(want[e]);
                    }
                    if (g != r) {
                        KVS_FAIL_("%s -> %s (%s, streaming from %s): element %zu is 0x%x, "
                                  "reference 0x%x",
                                  kvs_ggml_type_name((kvs_ggml_type)t), kvs_dtype_name(wides[w]),
                                  isas[i % 3], i < 3 ? "8 MiB" : "0", e, g, r);
                        break;
                    }
                }
            }
            free(got);
        }
        kvs_fp8_set_nt_min_bytes(KVS_FP8_NT_DEFAULT_MIN_BYTES);
        REQUIRE_OK(kvs_fp8_set_isa("auto"));
        free(want);
        free(in);
    }
}

/* ---- refusals ------------------------------------------------------------------ */

static void test_nonfinite_refused(void)
{
    float x[64];
    uint8_t out[68];
    for (size_t i = 0; i < 3; i++) {
        if (!kvs_fp8_isa_available(isas[i])) continue;
        REQUIRE_OK(kvs_fp8_set_isa(isas[i]));
        for (int j = 0; j < 64; j++) x[j] = 1.0f;
        x[38] = NAN;
        CHECK_ERR(kvs_ggml_encode(x, KVS_DTYPE_FLOAT32, out, KVS_GGML_Q8_0, 64), KVS_EINVAL,
                  "ggml_q8_0: element 38 is nan; ggml blocks need finite values");
        x[38] = 1.0f;
        x[63] = -INFINITY;
        CHECK_ERR(kvs_ggml_encode(x, KVS_DTYPE_FLOAT32, out, KVS_GGML_Q4_0, 64), KVS_EINVAL,
                  "ggml_q4_0: element 63 is -inf; ggml blocks need finite values");
        uint16_t h[32];
        for (int j = 0; j < 32; j++) h[j] = 0x3C00;
        h[0] = 0x7C00;
        CHECK_ERR(kvs_ggml_encode(h, KVS_DTYPE_FLOAT16, out, KVS_GGML_Q8_0, 32), KVS_EINVAL,
                  "ggml_q8_0: element 0 is inf; ggml blocks need finite values");
    }
    REQUIRE_OK(kvs_fp8_set_isa("auto"));
    CHECK_ERR(kvs_ggml_encode(x, KVS_DTYPE_FLOAT32, out, KVS_GGML_Q8_0, 40), KVS_EINVAL,
              "ggml_q8_0: 40 elements is not a multiple of 32");
    CHECK_ERR(kvs_ggml_encode(x, KVS_DTYPE_UINT8, out, KVS_GGML_Q8_0, 32), KVS_EINVAL,
              "ggml_q8_0: unsupported source dtype 'uint8'; expected float32, float16 or bfloat16");
    CHECK_ERR(kvs_ggml_decode(out, (kvs_ggml_type)7, x, KVS_DTYPE_FLOAT32, 32), KVS_EINVAL,
              "ggml: unknown block type 7; expected 0 (q8_0) or 1 (q4_0)");
}

/* Every block count from 0 to 40 (and around 64) at every byte offset of
 * source and destination from 0 to 3, each variant against the scalar
 * one, on blocks mixing ties, zeros, equal magnitudes of both signs and
 * noise; a non-finite value in each block of 40 is refused with its index
 * by every variant. */
static void test_lengths_and_alignments(void)
{
    enum { MAXB = 66 };
    static const size_t counts_extra[] = {47, 63, 64, 65, 66};
    float *x = malloc(sizeof(float) * 32 * MAXB);
    for (size_t i = 0; i < 32 * MAXB; i++) {
        size_t b = i / 32;
        switch (b % 4) {
        case 0: x[i] = (float)((int)(rnd() % 17) - 8) * 0.5f; break;   /* halves, both signs */
        case 1: x[i] = b % 8 == 1 ? 0.0f : gauss(); break;            /* a block of zeros */
        case 2: x[i] = i % 32 == 3 ? -4.0f : i % 32 == 9 ? 4.0f : 1.0f; break; /* a tie */
        default: x[i] = gauss() * 3.0f; break;
        }
    }
    uint8_t *want = malloc(34 * MAXB + 8), *got = malloc(34 * MAXB + 8);
    for (int w = 0; w < 3; w++) {
        size_t es = kvs_dtype_size(wides[w]);
        void *packed = as_dtype(x, 32 * MAXB, wides[w]);
        uint8_t *src = malloc(32 * MAXB * es + 8);
        for (int t = 0; t < 2; t++) {
            kvs_ggml_type ty = (kvs_ggml_type)t;
            for (size_t ci = 0; ci < 41 + sizeof counts_extra / sizeof counts_extra[0]; ci++) {
                size_t nb = ci <= 40 ? ci : counts_extra[ci - 41];
                for (size_t so = 0; so < 4; so++)
                    for (size_t dof = 0; dof < 4; dof++) {
                        memcpy(src + so, packed, 32 * nb * es);
                        REQUIRE_OK(kvs_fp8_set_isa("scalar"));
                        memset(want, 0xA5, 34 * MAXB + 8);
                        CHECK_OK(kvs_ggml_encode(src + so, wides[w], want + dof, ty, 32 * nb));
                        for (size_t i = 1; i < 3; i++) {
                            if (!kvs_fp8_isa_available(isas[i])) continue;
                            REQUIRE_OK(kvs_fp8_set_isa(isas[i]));
                            memset(got, 0xA5, 34 * MAXB + 8);
                            CHECK_OK(kvs_ggml_encode(src + so, wides[w], got + dof, ty, 32 * nb));
                            if (memcmp(got, want, 34 * MAXB + 8) != 0)
                                KVS_FAIL_("%s %s, %zu blocks, offsets %zu / %zu: %s differs "
                                          "from scalar", kvs_ggml_type_name(ty),
                                          kvs_dtype_name(wides[w]), nb, so, dof, isas[i]);
                        }
                    }
            }
            /* a NaN, then an infinity, in block k of 40 (element 32 k + k % 32) */
            for (size_t k = 0; k < 40; k++) {
                size_t at = 32 * k + k % 32;
                for (int inf = 0; inf < 2; inf++) {
                    memcpy(src, packed, 32 * 40 * es);
                    uint32_t f32 = inf ? 0xFF800000u : 0x7FC00000u;
                    uint16_t h = wides[w] == KVS_DTYPE_FLOAT16 ? (inf ? 0xFC00 : 0x7E00)
                                                               : (uint16_t)(f32 >> 16);
                    if (es == 4) memcpy(src + 4 * at, &f32, 4);
                    else memcpy(src + 2 * at, &h, 2);
                    char msg[128];
                    snprintf(msg, sizeof msg, "%s: element %zu is %s; ggml blocks need finite values",
                             kvs_ggml_type_name(ty), at, inf ? "-inf" : "nan");
                    for (size_t i = 0; i < 3; i++) {
                        if (!kvs_fp8_isa_available(isas[i])) continue;
                        REQUIRE_OK(kvs_fp8_set_isa(isas[i]));
                        CHECK_ERR(kvs_ggml_encode(src, wides[w], got, ty, 32 * 40), KVS_EINVAL, msg);
                    }
                }
            }
        }
        free(src);
        free(packed);
    }
    REQUIRE_OK(kvs_fp8_set_isa("auto"));
    free(x);
    free(want);
    free(got);
}

/* ---- the serdes ------------------------------------------------------------------ */

static kvs_memobj *new_obj(const kvs_layout *l)
{
    kvs_memobj *o = NULL;
    if (kvs_memobj_alloc(l, KVS_FMT_KV_2LTD, &o) != KVS_OK) return NULL;
    return o;
}

static void fill_gauss(kvs_memobj *o)
{
    for (uint32_t g = 0; g < o->layout.ngroups; g++) {
        kvs_dtype dt = o->layout.groups[g].dtype;
        uint64_t n = kvs_layout_group_numel(&o->layout, g);
        uint8_t *p = kvs_memobj_group_data(o, g);
        for (uint64_t i = 0; i < n; i++) {
            float f = gauss();
            if (dt == KVS_DTYPE_FLOAT32) memcpy(p + 4 * i, &f, 4);
            else {
                uint16_t h = dt == KVS_DTYPE_FLOAT16 ? kvs_f32_to_f16(f) : kvs_f32_to_bf16(f);
                memcpy(p + 2 * i, &h, 2);
            }
        }
    }
}

static void test_serde_layouts_and_sizes(void)
{
    kvs_serde_pair q8 = {0}, q4 = {0};
    REQUIRE_OK(kvs_serde_create_pair("{\"type\":\"ggml_q8_0\"}", &q8));
    REQUIRE_OK(kvs_serde_create_pair("{\"type\":\"ggml_q4_0\"}", &q4));
    kvs_layout l = {0};
    const int64_t d1[2] = {4, 64}, d2[3] = {2, 3, 32};
    REQUIRE_OK(kvs_layout_add_group(&l, 2, d1, KVS_DTYPE_BFLOAT16));
    REQUIRE_OK(kvs_layout_add_group(&l, 3, d2, KVS_DTYPE_FLOAT32));
    size_t est = 0;
    CHECK_OK(kvs_estimate_serialized_size(q8.serializer, &l, &est));
    CHECK_EQ_U64(est, (256 + 192) / 32 * 34);
    CHECK_OK(kvs_estimate_serialized_size(q4.serializer, &l, &est));
    CHECK_EQ_U64(est, (256 + 192) / 32 * 18);

    /* Plain bytes: each group's blocks, back to back, as the array
     * function writes them. */
    kvs_memobj *src = new_obj(&l), *back = new_obj(&l);
    REQUIRE(src && back);
    fill_gauss(src);
    uint8_t blob[448 / 32 * 34], want[448 / 32 * 34];
    kvs_layout bl;
    REQUIRE_OK(kvs_layout_flat(&bl, sizeof blob, KVS_DTYPE_UINT8));
    kvs_memobj dst;
    REQUIRE_OK(kvs_memobj_init(&dst, blob, sizeof blob, &bl, KVS_FMT_BINARY_BUFFER));
    size_t nw = 0;
    CHECK_OK(kvs_serialize(q8.serializer, src, &dst, NULL, &nw));
    CHECK_EQ_U64(nw, sizeof blob);
    CHECK_OK(kvs_ggml_encode(kvs_memobj_group_data(src, 0), KVS_DTYPE_BFLOAT16, want,
                             KVS_GGML_Q8_0, 256));
    CHECK_OK(kvs_ggml_encode(kvs_memobj_group_data(src, 1), KVS_DTYPE_FLOAT32, want + 8 * 34,
                             KVS_GGML_Q8_0, 192));
    CHECK(memcmp(blob, want, sizeof blob) == 0);
    REQUIRE_OK(kvs_memobj_set_used_size(&dst, nw));
    CHECK_OK(kvs_deserialize(q8.deserializer, &dst, back, NULL));
    const uint8_t *sb = kvs_memobj_group_data(src, 1), *bk = kvs_memobj_group_data(back, 1);
    float a, b2;
    memcpy(&a, sb, 4);
    memcpy(&b2, bk, 4);
    CHECK(fabsf(a - b2) < 0.05f);

    /* Damaged (wrong size) refused before a byte of dst is written. */
    memset(back->data, 0x5A, back->capacity);
    REQUIRE_OK(kvs_memobj_set_used_size(&dst, nw - 1));
    CHECK_ERR(kvs_deserialize(q8.deserializer, &dst, back, NULL), KVS_ECORRUPT,
              "ggml_q8_0: stored object is 475 bytes, destination layout needs 476");
    CHECK(((uint8_t *)back->data)[0] == 0x5A && ((uint8_t *)back->data)[back->capacity - 1] == 0x5A);
    REQUIRE_OK(kvs_memobj_set_used_size(&dst, nw));
    CHECK_ERR(kvs_deserialize(q4.deserializer, &dst, back, NULL), KVS_ECORRUPT,
              "ggml_q4_0: stored object is 476 bytes, destination layout needs 252");

    /* Too small a destination. */
    kvs_memobj small;
    kvs_layout sl;
    REQUIRE_OK(kvs_layout_flat(&sl, 100, KVS_DTYPE_UINT8));
    REQUIRE_OK(kvs_memobj_init(&small, blob, 100, &sl, KVS_FMT_BINARY_BUFFER));
    CHECK_ERR(kvs_serialize(q4.serializer, src, &small, NULL, &nw), KVS_ENOSPC,
              "ggml_q4_0: destination too small: 100 bytes, need 252");

    /* The last dimension must be a multiple of 32. */
    kvs_layout bad = {0};
    const int64_t d3[2] = {256, 100};
    REQUIRE_OK(kvs_layout_add_group(&bad, 2, d1, KVS_DTYPE_BFLOAT16));
    REQUIRE_OK(kvs_layout_add_group(&bad, 2, d3, KVS_DTYPE_BFLOAT16));
    CHECK_ERR(kvs_estimate_serialized_size(q4.serializer, &bad, &est), KVS_EINVAL,
              "ggml_q4_0: source group 1 [256x100 bfloat16]: the last dimension 100 is not a "
              "multiple of 32 (blocks of 32 run along it)");
    kvs_layout scalar0 = {0};
    REQUIRE_OK(kvs_layout_add_group(&scalar0, 0, NULL, KVS_DTYPE_FLOAT32));
    CHECK_ERR(kvs_estimate_serialized_size(q8.serializer, &scalar0, &est), KVS_EINVAL,
              "ggml_q8_0: source group 0 [float32]: the last dimension 1 is not a multiple of "
              "32 (blocks of 32 run along it)");
    kvs_layout i8 = {0};
    REQUIRE_OK(kvs_layout_add_group(&i8, 2, d1, KVS_DTYPE_UINT8));
    CHECK_ERR(kvs_estimate_serialized_size(q8.serializer, &i8, &est), KVS_EINVAL,
              "ggml_q8_0: unsupported source dtype 'uint8' in group 0; expected float32, "
              "float16 or bfloat16");

    /* Non-finite input refused with its group and element. */
    uint16_t *g0 = kvs_memobj_group_data(src, 0);
    g0[200] = 0x7FC0;
    CHECK_ERR(kvs_serialize(q8.serializer, src, &dst, NULL, &nw), KVS_EINVAL,
              "ggml_q8_0: source group 0 element 200 is nan; ggml blocks need finite values");

    /* The registry refuses kwargs (there are none). */
    kvs_serde_pair p = {0};
    CHECK_ERR(kvs_serde_create_pair("{\"type\":\"ggml_q4_0\",\"bits\":4}", &p), KVS_EINVAL,
              "ggml_q4_0: unknown kwarg 'bits'; accepted: max_workers");
    kvs_memobj_free(src);
    kvs_memobj_free(back);
    kvs_serde_pair_destroy(&q8);
    kvs_serde_pair_destroy(&q4);
}

/* ---- round trips within the documented bounds ----------------------------------- */

/* Fails an element beyond the documented bound (ggml.h): q8_0 0.57 x
 * amax / 127, q4_0 1.01 x |max| / 8 (the clamp at 15 costs a whole step for
 * -max), plus the destination's own rounding (2^-8 |x'| for bfloat16,
 * 2^-11 for float16) and, for a d in float16's subnormal range, codes x
 * 2^-25. Returns the SNR in dB. */
static double roundtrip_check(kvs_ggml_type t, const float *x, size_t n, kvs_dtype dt,
                              const char *what)
{
    void *src = malloc(n * 4), *back = malloc(n * 4);
    float *xs = malloc(n * 4);
    memcpy(xs, x, n * 4);
    free(src);
    src = as_dtype(xs, n, dt);
    uint8_t *blob = malloc(n / 32 * bb(t));
    double sig = 0, err = 0, worst = 0;
    if (kvs_ggml_encode(src, dt, blob, t, n) != KVS_OK ||
        kvs_ggml_decode(blob, t, back, dt, n) != KVS_OK) {
        KVS_FAIL_("%s round trip of %s: %s", kvs_ggml_type_name(t), what, kvs_last_error());
    } else {
        for (size_t b = 0; b < n / 32; b++) {
            float amax = 0;
            for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(xs[32 * b + j]));
            double step = t == KVS_GGML_Q8_0 ? 0.57 * amax / 127 : 1.01 * amax / 8;
            /* a d in float16's subnormal range is off by up to 2^-25 */
            step += (t == KVS_GGML_Q8_0 ? 127 : 8) * ldexp(1.0, -25);
            for (int j = 0; j < 32; j++) {
                size_t i = 32 * b + (size_t)j;
                float y;
                if (dt == KVS_DTYPE_FLOAT32) memcpy(&y, (uint8_t *)back + 4 * i, 4);
                else {
                    uint16_t h;
                    memcpy(&h, (uint8_t *)back + 2 * i, 2);
                    y = dt == KVS_DTYPE_FLOAT16 ? kvs_f16_to_f32(h) : kvs_bf16_to_f32(h);
                }
                double e = fabs((double)y - xs[i]);
                double lim = step +
                             fabs(y) * (dt == KVS_DTYPE_BFLOAT16 ? ldexp(1, -8)
                                        : dt == KVS_DTYPE_FLOAT16 ? ldexp(1, -11) : 0);
                if (e - lim > worst) worst = e - lim;
                sig += (double)xs[i] * xs[i];
                err += e * e;
            }
        }
        if (worst > 0)
            KVS_FAIL_("%s %s %s: an element is %g beyond the documented bound",
                      kvs_ggml_type_name(t), kvs_dtype_name(dt), what, worst);
    }
    free(src);
    free(back);
    free(xs);
    free(blob);
    return err > 0 ? 10 * log10(sig / err) : INFINITY;
}

static void test_roundtrip_bounds(void)
{
    enum { N = 32 * 4096 };
    float *x = malloc(N * 4);
    for (size_t i = 0; i < N; i++) x[i] = gauss() * ldexpf(1.0f, (int)(i / 32 % 20) - 10);
    for (int t = 0; t < 2; t++)
        for (int w = 0; w < 3; w++) roundtrip_check((kvs_ggml_type)t, x, N, wides[w], "gaussian");
    /* outliers: one large value per block */
    for (size_t i = 0; i < N; i++) x[i] = i % 32 == 7 ? 50.0f * gauss() : gauss();
    for (int t = 0; t < 2; t++)
        for (int w = 0; w < 3; w++) roundtrip_check((kvs_ggml_type)t, x, N, wides[w], "outliers");
    free(x);
}

static void test_kvdata(void)
{
    char dir[1024], why[1200];
    if (kvdata_dir(dir, sizeof dir, why, sizeof why) == NULL) {
        printf("SKIP test_kvdata: %s\n", why);
        return;
    }
    float *kv = kvdata_load(dir, 0, 0, why, sizeof why);
    if (kv == NULL) {
        printf("SKIP test_kvdata: %s\n", why);
        return;
    }
    size_t half = (size_t)KVDATA_LAYERS * KVDATA_TOKENS * KVDATA_HIDDEN;
    for (int t = 0; t < 2; t++) {
        double k = roundtrip_check((kvs_ggml_type)t, kv, half, KVS_DTYPE_BFLOAT16, "kvdata K");
        double v = roundtrip_check((kvs_ggml_type)t, kv + half, half, KVS_DTYPE_BFLOAT16,
                                   "kvdata V");
        printf("kvdata %s/kv_B_p00_c0 %s: SNR K %.2f dB, V %.2f dB\n", dir,
               kvs_ggml_type_name((kvs_ggml_type)t), k, v);
        CHECK(k > (t == 0 ? 35.0 : 15.0) && v > (t == 0 ? 35.0 : 15.0));
    }
    free(kv);
}

/* ---- the pipeline stages ----------------------------------------------------------- */

static void test_pipeline_stages(void)
{
    kvs_layout l = {0};
    const int64_t dims[2] = {8, 96};
    REQUIRE_OK(kvs_layout_add_group(&l, 2, dims, KVS_DTYPE_FLOAT16));
    kvs_memobj *src = new_obj(&l), *back = new_obj(&l), *plain_back = new_obj(&l);
    REQUIRE(src && back && plain_back);
    fill_gauss(src);
    static const char *const types[2] = {"ggml_q8_0", "ggml_q4_0"};
    for (int t = 0; t < 2; t++) {
        char cfg[200];
        snprintf(cfg, sizeof cfg,
                 "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"%s\"},{\"type\":\"crc32c\"}]}",
                 types[t]);
        kvs_serde_pair p = {0};
        REQUIRE_OK(kvs_serde_create_pair(cfg, &p));
        size_t est = 0, nw = 0;
        REQUIRE_OK(kvs_estimate_serialized_size(p.serializer, &l, &est));
        uint8_t *frame = malloc(est);
        kvs_layout fl;
        REQUIRE_OK(kvs_layout_flat(&fl, est, KVS_DTYPE_UINT8));
        kvs_memobj f;
        REQUIRE_OK(kvs_memobj_init(&f, frame, est, &fl, KVS_FMT_BINARY_BUFFER));
        CHECK_OK(kvs_serialize(p.serializer, src, &f, NULL, &nw));
        /* the payload is the plain blocks */
        size_t plain_n = 8 * 96 / 32 * bb((kvs_ggml_type)t);
        uint8_t *plain = malloc(plain_n);
        CHECK_OK(kvs_ggml_encode(src->data, KVS_DTYPE_FLOAT16, plain, (kvs_ggml_type)t, 8 * 96));
        int found = 0;
        for (size_t off = 0; off + plain_n <= nw && !found; off++)
            found = memcmp(frame + off, plain, plain_n) == 0;
        CHECK(found);
        REQUIRE_OK(kvs_memobj_set_used_size(&f, nw));
        CHECK_OK(kvs_deserialize(p.deserializer, &f, back, NULL));
        CHECK_OK(kvs_ggml_decode(plain, (kvs_ggml_type)t, plain_back->data, KVS_DTYPE_FLOAT16,
                                 8 * 96));
        CHECK(memcmp(back->data, plain_back->data, 8 * 96 * 2) == 0);
        /* a damaged payload byte is refused by the check stage */
        frame[nw - 10] ^= 0x01;
        int rc = kvs_deserialize(p.deserializer, &f, back, NULL);
        CHECK_EQ_INT(rc, KVS_ECORRUPT);
        CHECK(strstr(kvs_last_error(), "crc32c") != NULL);
        /* a stage member it does not know */
        kvs_serde_pair bad = {0};
        snprintf(cfg, sizeof cfg, "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"%s\",\"x\":1}]}",
                 types[t]);
        rc = kvs_serde_create_pair(cfg, &bad);
        CHECK_EQ_INT(rc, KVS_EINVAL);
        CHECK(strstr(kvs_last_error(), "unknown member 'x'") != NULL);
        kvs_serde_pair_destroy(&bad);
        free(plain);
        free(frame);
        kvs_serde_pair_destroy(&p);
    }
    kvs_memobj_free(src);
    kvs_memobj_free(back);
    kvs_memobj_free(plain_back);
}

/* ---- split across a processor's workers: the same bytes ------------------------------ */

/* Wait on the direction's event fd until task id has a result. */
static int wait_result(kvs_processor *p, int serialize, kvs_task_id id, kvs_task_result *r)
{
    struct pollfd pfd = {serialize ? kvs_processor_serialize_event_fd(p)
                                   : kvs_processor_deserialize_event_fd(p),
                         POLLIN, 0};
    for (;;) {
        int rc = serialize ? kvs_processor_query_serialize_result(p, id, r)
                           : kvs_processor_query_deserialize_result(p, id, r);
        if (rc || r->state != KVS_TASK_PENDING) return rc;
        if (poll(&pfd, 1, 120000) != 1) return -1;
        kvs_event_fd_consume(pfd.fd, NULL);
    }
}

static void test_split_across_workers(void)
{
    kvs_layout l = {0};
    const int64_t dims[2] = {2048, 256};
    REQUIRE_OK(kvs_layout_add_group(&l, 2, dims, KVS_DTYPE_BFLOAT16));
    kvs_memobj *src = new_obj(&l), *back = new_obj(&l);
    REQUIRE(src && back);
    fill_gauss(src);
    size_t n = 2048 * 256, len = n / 32 * 18;
    uint8_t *want = malloc(len);
    REQUIRE_OK(kvs_ggml_encode(src->data, KVS_DTYPE_BFLOAT16, want, KVS_GGML_Q4_0, n));
    kvs_serde_pair pair = {0};
    REQUIRE_OK(kvs_serde_create_pair("{\"type\":\"ggml_q4_0\"}", &pair));
    kvs_processor *p = NULL;
    REQUIRE_OK(kvs_async_processor_create(pair.serializer, pair.deserializer, 2, &p));
    REQUIRE_OK(kvs_async_processor_set_split(p, 0, 64 << 10));
    kvs_layout bl;
    REQUIRE_OK(kvs_layout_flat(&bl, len, KVS_DTYPE_UINT8));
    kvs_memobj *blob = new_obj(&bl);
    for (int round = 0; round < 3; round++) {
        kvs_task_id id;
        kvs_task_result r;
        REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &blob, 1, NULL, &id));
        REQUIRE(wait_result(p, 1, id, &r) == KVS_OK);
        CHECK(r.state == KVS_TASK_OK);
        CHECK(blob->used_size == len && memcmp(blob->data, want, len) == 0);
        REQUIRE_OK(kvs_processor_submit_deserialize(p, &blob, 1, &back, 1, NULL, &id));
        REQUIRE(wait_result(p, 0, id, &r) == KVS_OK);
        CHECK(r.state == KVS_TASK_OK);
    }
    uint16_t *bk = malloc(n * 2);
    REQUIRE_OK(kvs_ggml_decode(want, KVS_GGML_Q4_0, bk, KVS_DTYPE_BFLOAT16, n));
    CHECK(memcmp(bk, back->data, n * 2) == 0);
    free(bk);
    kvs_processor_destroy(p);
    kvs_memobj_free(blob);
    kvs_memobj_free(src);
    kvs_memobj_free(back);
    free(want);
}

int main(void)
{
    RUN(test_known_blocks);
    RUN(test_random_vs_reference);
    RUN(test_rounding_near_ties);
    RUN(test_all_half_patterns);
    RUN(test_decode_all);
    RUN(test_nonfinite_refused);
    RUN(test_lengths_and_alignments);
    RUN(test_serde_layouts_and_sizes);
    RUN(test_roundtrip_bounds);
    RUN(test_kvdata);
    RUN(test_pipeline_stages);
    RUN(test_split_across_workers);
    return TEST_SUMMARY();
}
