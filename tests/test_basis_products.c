/* test_basis_products.c - the transform stage's basis products on AMX-BF16
 * (codecs/basis_products.c, the tile kernel basis_products_amx.c): each
 * product against a float64 reference within the bound basis_products.h
 * states, ragged shapes, coefficients up to +-32767, the choice (AMX where
 * the CPU has it, KVSERDE_ISA=scalar gives sgemm), and the stage's round
 * trip through both paths. On a CPU without AMX only the choice is checked
 * (the products then refuse and the stage takes sgemm). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codecs/basis_products.h"
#include "codecs/half.h"
#include "codecs/transform.h"
#include "frame/stage.h"
#include "kvs_test.h"
#include "kvserde/kvserde.h"
#include "util/cpu_features.h"

static uint64_t rng_state = 1;
static double uniform(void) /* (0, 1), deterministic */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static double gauss(void) { return sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform()); }

/* A transform of `layers` x hidden h: orthonormal bases (Gram-Schmidt of
 * Gaussian rows, in double), means of about 2 (larger than the spread, as
 * K's channels can be), unit variances. */
static kvs_transform *make_transform(uint32_t layers, uint32_t h)
{
    kvs_transform *t = NULL;
    if (kvs_transform_alloc(layers, h, &t) != KVS_OK) return NULL;
    double *row = malloc(h * sizeof(double)), *b = malloc((size_t)h * h * sizeof(double));
    for (int kv = 0; kv < 2; kv++)
        for (uint32_t l = 0; l < layers; l++) {
            for (uint32_t j = 0; j < h; j++) {
                for (uint32_t e = 0; e < h; e++) row[e] = gauss();
                for (uint32_t i = 0; i < j; i++) {
                    double d = 0;
                    for (uint32_t e = 0; e < h; e++) d += row[e] * b[(size_t)i * h + e];
                    for (uint32_t e = 0; e < h; e++) row[e] -= d * b[(size_t)i * h + e];
                }
                double n = 0;
                for (uint32_t e = 0; e < h; e++) n += row[e] * row[e];
                for (uint32_t e = 0; e < h; e++) b[(size_t)j * h + e] = row[e] / sqrt(n);
            }
            size_t off = (size_t)l * h;
            for (size_t i = 0; i < (size_t)h * h; i++) t->basis[kv][off * h + i] = (float)b[i];
            for (uint32_t e = 0; e < h; e++) {
                t->mean[kv][off + e] = (float)(2 + gauss());
                t->var[kv][off + e] = 1;
            }
        }
    free(row), free(b);
    kvs_transform_finish(t);
    return t;
}

static int amx_here(void)
{
    return (kvs_cpu_features() & KVS_CPU_AMX_BF16) != 0;
}

/* ---- the choice --------------------------------------------------------- */

/* KVSERDE_ISA is read once, at the first product: a child process that has
 * not asked yet sets it and sees its effect. */
static int in_use_with_isa(const char *isa)
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv("KVSERDE_ISA", isa, 1);
        _exit(kvs_basis_amx_in_use());
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

static void test_choice(void)
{
    CHECK_EQ_INT(in_use_with_isa("scalar"), 0);
    CHECK_EQ_INT(in_use_with_isa("avx2"), 0);
    CHECK_EQ_INT(in_use_with_isa("auto"), amx_here());
    const char *isa = getenv("KVSERDE_ISA");
    int forced_off = isa && (strcmp(isa, "scalar") == 0 || strcmp(isa, "avx2") == 0);
    CHECK_EQ_INT(kvs_basis_amx_in_use(), amx_here() && !forced_off);
    /* off: no packed copies, and the products refuse (the stage's sgemm) */
    CHECK_EQ_INT(kvs_basis_set_amx(0), 0);
    kvs_transform *t = make_transform(1, 32);
    REQUIRE(t != NULL);
    CHECK(t->packed == NULL);
    uint16_t x[32 * 32] = {0};
    float c[32 * 32];
    CHECK_EQ_INT(kvs_basis_forward(t, 0, 0, x, 32, 1.0f, c), 0);
    kvs_transform_free(t);
    CHECK_EQ_INT(kvs_basis_set_amx(1), amx_here());
    t = make_transform(1, 32);
    REQUIRE(t != NULL);
    CHECK((t->packed != NULL) == amx_here());
    CHECK_EQ_INT(kvs_basis_forward(t, 0, 0, x, 32, 1.0f, c), amx_here());
    kvs_transform_free(t);
}

/* ---- the products against float64 --------------------------------------
 * The bound (basis_products.h): the basis parts are within 2^-16 of it
 * (decode; encode's three within 2^-24), the bfloat16 data and the
 * coefficients are exact, products are exact in float32, and each of the K
 * float32 additions rounds by at most 2^-23 of the sum of the magnitudes
 * so far. Dropping the basis' low parts (2^-9) or the coefficients' (up to
 * 64 for |q| near 2^15) breaks it by far. (Encode's third part is below
 * what the additions' bound can tell; tools measure it, fidelity.md.) */
#define EPS_PARTS 1.52587890625e-05 /* 2^-16 */
#define EPS_PARTS_FORWARD 5.9604644775390625e-08 /* 2^-24 */
#define EPS_ADD 1.1920928955078125e-07 /* 2^-23 */

static const size_t tokens[] = {1, 15, 17, 256, 300};

/* Forward: c = (x - mean) B^T / delta; returns the worst error / bound. */
static double forward_worst(const kvs_transform *t, size_t T)
{
    size_t h = t->hidden;
    const float *b = t->basis[1], *mean = t->mean[1];
    uint16_t *x = malloc(T * h * sizeof(uint16_t));
    float *c = malloc(T * h * sizeof(float));
    if (x == NULL || c == NULL) return INFINITY;
    for (size_t i = 0; i < T * h; i++)
        x[i] = kvs_f32_to_bf16((float)(mean[i % h] + 3 * gauss()));
    const float inv_delta = 1 / 0.037f;
    double worst = 0;
    if (!kvs_basis_forward(t, 1, 0, x, T, inv_delta, c)) worst = INFINITY;
    for (size_t r = 0; r < T && worst < INFINITY; r++)
        for (size_t j = 0; j < h; j++) {
            double ref = 0, dev = 0, mag = 0;
            for (size_t e = 0; e < h; e++) {
                double xe = kvs_bf16_to_f32(x[r * h + e]), bj = b[j * h + e];
                ref += (xe - mean[e]) * bj;
                dev += fabs((xe - mean[e]) * bj);
                mag += (fabs(xe) + fabs(mean[e])) * fabs(bj);
            }
            double bound = (EPS_PARTS_FORWARD * dev + (h + 4) * EPS_ADD * mag) * inv_delta +
                           EPS_ADD * fabs(ref * inv_delta);
            double err = fabs(c[r * h + j] - ref * inv_delta) / bound;
            if (err > worst) worst = err;
        }
    free(x), free(c);
    return worst;
}

/* Inverse: x = delta q B[0..kept) with |q| up to qmax (every fourth row
 * block's coefficients small, so the kernel's skip of zero low parts is
 * exercised next to blocks that need them). */
static double inverse_worst(const kvs_transform *t, size_t T, size_t kept, int qmax)
{
    size_t h = t->hidden;
    const float *b = t->basis[0];
    float *q = malloc(T * kept * sizeof(float)), *x = malloc(T * h * sizeof(float));
    if (q == NULL || x == NULL) return INFINITY;
    for (size_t r = 0; r < T; r++)
        for (size_t k = 0; k < kept; k++) {
            int m = (r / 32) % 4 == 3 ? 256 : qmax;
            q[r * kept + k] = (float)((int)floor(uniform() * (2 * m + 1)) - m);
        }
    if (T > 1 && kept > 1) q[kept + 1] = (float)-qmax; /* the extremes */
    q[0] = (float)qmax;
    const float delta = 0.0213f;
    double worst = 0;
    if (!kvs_basis_inverse(t, 0, 0, q, T, kept, delta, x)) worst = INFINITY;
    for (size_t r = 0; r < T && worst < INFINITY; r++)
        for (size_t e = 0; e < h; e++) {
            double ref = 0, mag = 0;
            for (size_t k = 0; k < kept; k++) {
                ref += (double)q[r * kept + k] * b[k * h + e];
                mag += fabs((double)q[r * kept + k] * b[k * h + e]);
            }
            double bound = (EPS_PARTS + (kept + 4) * EPS_ADD) * mag * delta +
                           EPS_ADD * fabs(ref * delta) + 1e-30;
            double err = fabs(x[r * h + e] - ref * delta) / bound;
            if (err > worst) worst = err;
        }
    free(q), free(x);
    return worst;
}

static void test_products_against_float64(void)
{
    if (!kvs_basis_amx_in_use()) return; /* the sgemm path: test_transform.c */
    static const uint32_t hiddens[] = {256, 48}; /* kvdata's, and one not a multiple of 32 */
    for (size_t hi = 0; hi < 2; hi++) {
        kvs_transform *t = make_transform(1, hiddens[hi]);
        REQUIRE(t != NULL && t->packed != NULL);
        size_t h = t->hidden;
        for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; i++) {
            double w = forward_worst(t, tokens[i]);
            if (!(w <= 1)) fprintf(stderr, "  forward h %zu T %zu: error %g of the bound\n", h,
                                   tokens[i], w);
            CHECK(w <= 1);
            static const size_t kepts[] = {1, 31, 33, 256};
            static const int qmax[] = {256, 32767};
            for (size_t k = 0; k < 4; k++)
                for (size_t m = 0; m < 2; m++) {
                    size_t kept = kepts[k] < h ? kepts[k] : h;
                    double wi = inverse_worst(t, tokens[i], kept, qmax[m]);
                    if (!(wi <= 1))
                        fprintf(stderr, "  inverse h %zu T %zu kept %zu |q| <= %d: error %g "
                                        "of the bound\n", h, tokens[i], kept, qmax[m], wi);
                    CHECK(wi <= 1);
                }
        }
        kvs_transform_free(t);
    }
}

/* ---- the stage through both paths -------------------------------------- */

enum { RL = 2, RT = 300, RH = 48 };

/* Encode bfloat16 kv [2, RL, RT, RH] with the stage and decode it to
 * float32 with the current path; the blob's bytes in *blob. */
static int stage_round_trip(kvs_stage *s, const kvs_transform *t, const uint16_t *kv,
                            float *back, uint8_t **blob, size_t *n)
{
    kvs_layout l, lf;
    memset(&l, 0, sizeof l);
    memset(&lf, 0, sizeof lf);
    int64_t shape[] = {2, RL, RT, RH};
    kvs_layout_add_group(&l, 4, shape, KVS_DTYPE_BFLOAT16);
    kvs_layout_add_group(&lf, 4, shape, KVS_DTYPE_FLOAT32);
    kvs_memobj src, dst;
    size_t cap = 0;
    int rc = s->type->typed_bound(s, &l, &cap);
    if (rc) return rc;
    *blob = malloc(cap);
    kvs_memobj_init(&src, (void *)kv, 2 * RL * RT * RH * 2, &l, KVS_FMT_KV_2LTD);
    rc = s->type->typed_encode(s, &src, *blob, cap, n);
    if (rc) return rc;
    uint8_t params[64];
    s->type->write_params(s, params);
    kvs_stage_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.transform = t;
    kvs_memobj_init(&dst, back, 2 * RL * RT * RH * 4, &lf, KVS_FMT_KV_2LTD);
    return s->type->typed_decode(params, s->type->params_size(s), &ctx, *blob, *n, &dst);
}

/* Both paths meet the stage's documented bound (test_transform.c: per row,
 * L2 error <= step x rms x sqrt(hidden) / 2, plus rounding), and they
 * differ only in rounding: few coefficients at a tie (the blobs' sizes
 * within a few bytes) and the decoded values of one blob within float32
 * rounding of each other. */
static void test_stage_both_paths(void)
{
    if (!amx_here()) return;
    REQUIRE(kvs_basis_set_amx(1) == 1);
    kvs_transform *t = make_transform(RL, RH);
    REQUIRE(t != NULL && t->packed != NULL);
    kvs_stage *s = NULL;
    const float step = 0.05f;
    REQUIRE_OK(kvs_stage_transform_new(t, step, step, &s));
    size_t nel = 2 * RL * RT * RH;
    uint16_t *kv = malloc(nel * 2);
    float *back[2] = {malloc(nel * 4), malloc(nel * 4)};
    uint8_t *blob[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    REQUIRE(kv && back[0] && back[1]);
    for (size_t i = 0; i < nel; i++) {
        size_t stream = i / (RT * RH), e = i % RH;
        int kvi = (int)(stream / RL);
        size_t layer = stream % RL;
        /* decaying spread along the basis, so components drop out */
        kv[i] = kvs_f32_to_bf16((float)(t->mean[kvi][layer * RH + e] + gauss() / (1 + e % 7)));
    }
    for (int path = 0; path < 2; path++) {
        kvs_basis_set_amx(path == 0);
        CHECK_OK(stage_round_trip(s, t, kv, back[path], &blob[path], &n[path]));
        double worst = 0;
        for (size_t r = 0; r < 2 * RL * RT; r++) {
            int kvi = (int)(r / (RL * RT));
            size_t layer = r / RT % RL;
            double bound = step * t->rms[kvi][layer] * sqrt((double)RH) / 2, e2 = 0;
            for (size_t e = 0; e < RH; e++) {
                double d = (double)kvs_bf16_to_f32(kv[r * RH + e]) - back[path][r * RH + e];
                e2 += d * d;
            }
            if (sqrt(e2) / bound > worst) worst = sqrt(e2) / bound;
        }
        CHECK(worst > 0.1 && worst <= 1.0 + 1e-4);
    }
    CHECK(n[0] + 16 >= n[1] && n[1] + 16 >= n[0]);
    /* the sgemm path's blob decoded by both paths */
    float *again = malloc(nel * 4);
    REQUIRE(again != NULL);
    kvs_basis_set_amx(1);
    kvs_layout lf;
    memset(&lf, 0, sizeof lf);
    kvs_layout_add_group(&lf, 4, (int64_t[]){2, RL, RT, RH}, KVS_DTYPE_FLOAT32);
    kvs_memobj dst;
    kvs_memobj_init(&dst, again, nel * 4, &lf, KVS_FMT_KV_2LTD);
    uint8_t params[64];
    s->type->write_params(s, params);
    kvs_stage_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.transform = t;
    CHECK_OK(s->type->typed_decode(params, s->type->params_size(s), &ctx, blob[1], n[1], &dst));
    double worst = 0;
    for (size_t i = 0; i < nel; i++) {
        double d = fabs((double)again[i] - back[1][i]) / (1e-5 + 1e-5 * fabs(back[1][i]));
        if (d > worst) worst = d;
    }
    CHECK(worst > 0 && worst <= 1); /* differ, by rounding only */
    free(again);
    free(blob[0]), free(blob[1]), free(back[0]), free(back[1]), free(kv);
    s->type->destroy(s);
}

int main(void)
{
    RUN(test_choice); /* first: its children must not inherit a choice */
    RUN(test_products_against_float64);
    RUN(test_stage_both_paths);
    return TEST_SUMMARY();
}
