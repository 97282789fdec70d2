/* test_transform.c - the calibrated transform (codecs/transform.c), its
 * version 1 coefficient coder (codecs/coef_coder.c; coef_rans.c, version
 * 2's, has test_coef_rans.c) and the "transform" typed stage
 * (frame/stage_transform.c), alone and through the pipeline serde, payloads
 * of version 1 included. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codecs/basis_products.h"
#include "codecs/blas.h"
#include "codecs/coef_coder.h"
#include "codecs/coef_rans.h"
#include "codecs/half.h"
#include "codecs/transform.h"
#include "frame/stage.h"
#include "kvs_test.h"
#include "kvs_test_proc.h"
#include "kvserde/kvserde.h"

#define L 2
#define T 64
#define H 16
#define N (2 * L * T * H)

static uint64_t rng_state;
static double uniform(void) /* (0, 1), deterministic */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static double gauss(void) { return sqrt(-2 * log(uniform())) * cos(6.283185307179586 * uniform()); }

/* Correlated synthetic KV [2, L, T, H] as float32: a fixed mixing of
 * sources with decaying spread, and a per-channel offset. */
static void make_kv(uint64_t seed, float *kv)
{
    rng_state = seed;
    double mix[H][H];
    uint64_t keep = rng_state;
    rng_state = 42; /* the same mixing for every seed: one "model" */
    for (int i = 0; i < H; i++)
        for (int j = 0; j < H; j++) mix[i][j] = gauss();
    rng_state = keep;
    for (size_t s = 0; s < 2 * L; s++)
        for (int t = 0; t < T; t++) {
            double z[H];
            for (int j = 0; j < H; j++) z[j] = gauss() * 4.0 / (1 + j);
            for (int i = 0; i < H; i++) {
                double v = 0.5 * (double)i - 3.0 + (double)s;
                for (int j = 0; j < H; j++) v += mix[i][j] * z[j];
                kv[(s * T + t) * H + i] = (float)v;
            }
        }
}

static kvs_transform *calibrate(uint64_t seed, int chunks)
{
    kvs_calibration *c = NULL;
    kvs_transform *t = NULL;
    float *kv = malloc(N * sizeof(float));
    if (kv == NULL || kvs_calibration_new(L, H, &c) != KVS_OK) abort();
    for (int i = 0; i < chunks; i++) {
        make_kv(seed + (uint64_t)i, kv);
        if (kvs_calibration_add(c, kv, T) != KVS_OK) abort();
    }
    if (kvs_calibration_result(c, &t) != KVS_OK) abort();
    kvs_calibration_free(c);
    free(kv);
    return t;
}

/* The transform file, as `kvserde calibrate` lays it out (the tool's
 * writer is not in the library): a safetensors header and the F32 data.
 * fp_text NULL: the transform's own fingerprint. */
static void write_transform(const kvs_transform *t, const char *path, const char *fp_text)
{
    json_t *hdr = json_object();
    char fp[17];
    snprintf(fp, sizeof fp, "%016llx", (unsigned long long)t->fingerprint);
    json_object_set_new(hdr, "__metadata__",
                        json_pack("{s:s,s:s}", "kvserde.transform", "1",
                                  "kvserde.transform.fingerprint", fp_text ? fp_text : fp));
    uint64_t off = 0;
    for (int i = 0; i < KVS_TRANSFORM_NTENSORS; i++) {
        uint64_t n;
        kvs_transform_tensor(t, i, &n);
        json_t *shape = i % 3 == 1 ? json_pack("[i,i,i]", L, H, H) : json_pack("[i,i]", L, H);
        json_object_set_new(hdr, kvs_transform_tensor_names[i],
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", "F32", "shape", shape,
                                      "data_offsets", (json_int_t)off,
                                      (json_int_t)(off + n * 4)));
        off += n * 4;
    }
    char *text = json_dumps(hdr, JSON_COMPACT);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    uint8_t n8[8];
    for (int b = 0; b < 8; b++) n8[b] = (uint8_t)((uint64_t)padded >> 8 * b);
    fwrite(n8, 1, 8, f);
    fwrite(text, 1, len, f);
    for (size_t i = len; i < padded; i++) fputc(' ', f);
    for (int i = 0; i < KVS_TRANSFORM_NTENSORS; i++) {
        uint64_t n;
        const float *a = kvs_transform_tensor(t, i, &n);
        fwrite(a, 4, (size_t)n, f);
    }
    fclose(f);
    free(text);
    json_decref(hdr);
}

static char path_a[64], path_b[64];

static void make_files(void)
{
    snprintf(path_a, sizeof path_a, "/tmp/kvs-test-transform-a-%d", (int)getpid());
    snprintf(path_b, sizeof path_b, "/tmp/kvs-test-transform-b-%d", (int)getpid());
    kvs_transform *a = calibrate(100, 4), *b = calibrate(200, 4);
    write_transform(a, path_a, NULL);
    write_transform(b, path_b, NULL);
    kvs_transform_free(a);
    kvs_transform_free(b);
}

static void layout_4d(kvs_layout *l, int64_t l0, int64_t t0, int64_t h0, kvs_dtype dt)
{
    memset(l, 0, sizeof *l);
    const int64_t dims[4] = {2, l0, t0, h0};
    if (kvs_layout_add_group(l, 4, dims, dt) != KVS_OK) abort();
}

/* ---- the coefficient coder --------------------------------------------- */

static void test_coder_round_trip_exact(void)
{
    enum { R = 200, C = 12 };
    static int32_t q[R * C];
    static float back[R * C];
    static uint8_t buf[R * C * 8];
    uint8_t cls[C];
    rng_state = 7;
    for (int j = 0; j < C; j++) cls[j] = (uint8_t)(j * 3 % KVS_COEF_CLASSES);
    for (int i = 0; i < R * C; i++) {
        int j = i % C;
        double scale = j == 0 ? 0 : j == 1 ? 30000 : 40.0 / j;
        q[i] = (int32_t)lrint(scale * gauss());
    }
    q[5] = KVS_COEF_MAX;
    q[6] = -KVS_COEF_MAX;
    q[7] = 1;
    q[8] = -1;
    size_t n = 0;
    CHECK_OK(kvs_coef_encode(q, R, C, cls, buf, sizeof buf, &n));
    CHECK(n > 5 && n < sizeof buf);
    CHECK_OK(kvs_coef_decode(buf, n, R, C, cls, back, "test"));
    int bad = 0;
    for (int i = 0; i < R * C; i++) bad += back[i] != (float)(q[i] > KVS_COEF_MAX ? KVS_COEF_MAX
                                                           : q[i] < -KVS_COEF_MAX ? -KVS_COEF_MAX
                                                                                  : q[i]);
    CHECK_EQ_INT(bad, 0);
    /* every truncation and one extra byte refused, with the numbers */
    char msg[200];
    for (size_t cut = 5; cut < n; cut += 1 + cut / 4) {
        snprintf(msg, sizeof msg,
                 "test: coefficient stream damaged: its %zu bytes end before the last of 200 x "
                 "12 coefficients",
                 cut);
        CHECK_ERR(kvs_coef_decode(buf, cut, R, C, cls, back, "test"), KVS_ECORRUPT, msg);
    }
}

static void test_coder_refusals(void)
{
    int32_t q[4] = {0, 3, -7, 100};
    uint8_t cls[2] = {1, 2}, buf[64];
    float back[4];
    size_t n = 0;
    CHECK_OK(kvs_coef_encode(q, 2, 2, cls, buf, sizeof buf, &n));
    char msg[256];
    snprintf(msg, sizeof msg,
             "x: coefficient stream damaged: its %zu bytes end before the last of 2 x 2 "
             "coefficients", n - 1);
    CHECK_ERR(kvs_coef_decode(buf, n - 1, 2, 2, cls, back, "x"), KVS_ECORRUPT, msg);
    buf[n] = 0;
    snprintf(msg, sizeof msg,
             "x: coefficient stream damaged: 1 of its %zu bytes are left after the last "
             "coefficient", n + 1);
    CHECK_ERR(kvs_coef_decode(buf, n + 1, 2, 2, cls, back, "x"), KVS_ECORRUPT, msg);
    buf[0] = 1;
    snprintf(msg, sizeof msg,
             "x: coefficient stream damaged: %zu bytes, first byte 1 (a stream is at least 5 "
             "bytes and starts with 0)", n);
    CHECK_ERR(kvs_coef_decode(buf, n, 2, 2, cls, back, "x"), KVS_ECORRUPT, msg);
    CHECK_EQ_INT(kvs_coef_encode(q, 2, 2, cls, buf, 3, &n), KVS_ENOSPC);
}

/* ---- calibration and the file ------------------------------------------ */

static void test_calibration_deterministic(void)
{
    kvs_transform *a = calibrate(100, 4), *b = calibrate(100, 4), *c = calibrate(101, 4);
    CHECK_EQ_U64(a->fingerprint, b->fingerprint);
    CHECK(a->fingerprint != c->fingerprint);
    for (int i = 0; i < KVS_TRANSFORM_NTENSORS; i++) {
        uint64_t n, m;
        const float *x = kvs_transform_tensor(a, i, &n), *y = kvs_transform_tensor(b, i, &m);
        CHECK(n == m && memcmp(x, y, (size_t)n * 4) == 0);
    }
    /* orthonormal rows, variances descending */
    double worst = 0;
    for (int kv = 0; kv < 2; kv++)
        for (int l = 0; l < L; l++) {
            const float *B = a->basis[kv] + (size_t)l * H * H, *v = a->var[kv] + (size_t)l * H;
            for (int i = 0; i < H; i++) {
                if (i) CHECK(v[i] <= v[i - 1]);
                for (int j = 0; j < H; j++) {
                    double d = 0;
                    for (int k = 0; k < H; k++) d += (double)B[i * H + k] * B[j * H + k];
                    d -= i == j;
                    if (fabs(d) > worst) worst = fabs(d);
                }
            }
        }
    CHECK(worst < 1e-5);
    kvs_transform_free(a);
    kvs_transform_free(b);
    kvs_transform_free(c);
}

static void test_calibration_refuses_nonfinite(void)
{
    kvs_calibration *c;
    float *kv = calloc(N, sizeof(float));
    REQUIRE(kv && kvs_calibration_new(L, H, &c) == KVS_OK);
    kv[(size_t)(1 * L + 1) * T * H + 5 * H + 3] = NAN;
    CHECK_ERR(kvs_calibration_add(c, kv, T), KVS_EINVAL,
              "calibrate: V layer 1 token 5 holds a value that is not finite");
    kvs_transform *t = NULL;
    CHECK_ERR(kvs_calibration_result(c, &t), KVS_EINVAL, "calibrate: 0 tokens; need at least 2");
    kvs_calibration_free(c);
    free(kv);
}

static void test_file_checked(void)
{
    kvs_transform *t = NULL;
    CHECK_OK(kvs_transform_load(path_a, &t));
    kvs_transform *a = calibrate(100, 4);
    CHECK(t && t->fingerprint == a->fingerprint && t->layers == L && t->hidden == H);
    char bad[80], msg[300];
    snprintf(bad, sizeof bad, "%s.bad", path_a);
    write_transform(a, bad, "0123456789abcdef");
    kvs_transform *u = NULL;
    snprintf(msg, sizeof msg,
             "transform: '%s' damaged: its numbers have fingerprint %016llx, its metadata "
             "kvserde.transform.fingerprint says 0123456789abcdef",
             bad, (unsigned long long)a->fingerprint);
    CHECK_ERR(kvs_transform_load(bad, &u), KVS_ECORRUPT, msg);
    FILE *f = fopen(bad, "wb");
    fwrite("\x10\0\0\0\0\0\0\0{\"x\":1}         ", 1, 24, f);
    fclose(f);
    snprintf(msg, sizeof msg,
             "transform: '%s' is not a kvserde transform file (metadata kvserde.transform is "
             "missing, expected \"1\"; see `kvserde calibrate`)",
             bad);
    CHECK_ERR(kvs_transform_load(bad, &u), KVS_ECORRUPT, msg);
    unlink(bad);
    snprintf(msg, sizeof msg, "transform: cannot open '%s': No such file or directory", bad);
    CHECK_ERR(kvs_transform_load(bad, &u), KVS_EIO, msg);
    CHECK(u == NULL);
    kvs_transform_free(t);
    kvs_transform_free(a);
}

/* ---- the stage through the pipeline ------------------------------------ */

static int make_pair(const char *path, const char *extra, kvs_serde_pair *p)
{
    char cfg[512];
    snprintf(cfg, sizeof cfg,
             "{\"type\": \"pipeline\", \"stages\": [{\"type\": \"transform\", "
             "\"path\": \"%s\"%s}]}",
             path, extra);
    return kvs_serde_create_pair(cfg, p);
}

/* Encode kv (float32 [2, L, T, H]) with pair p; blob malloc'd. */
static uint8_t *encode(const kvs_serde_pair *p, float *kv, kvs_layout *l, size_t *n)
{
    size_t cap = 0;
    if (kvs_estimate_serialized_size(p->serializer, l, &cap) != KVS_OK) return NULL;
    uint8_t *blob = malloc(cap);
    kvs_memobj in, out;
    kvs_layout bl;
    kvs_layout_flat(&bl, cap, KVS_DTYPE_UINT8);
    kvs_memobj_init(&in, kv, N * sizeof(float), l, KVS_FMT_KV_2LTD);
    kvs_memobj_init(&out, blob, cap, &bl, KVS_FMT_BINARY);
    if (kvs_serialize(p->serializer, &in, &out, NULL, n) != KVS_OK) {
        free(blob);
        return NULL;
    }
    return blob;
}

static int decode(const kvs_serde_pair *p, uint8_t *blob, size_t n, kvs_layout *l, float *back)
{
    kvs_memobj in, out;
    kvs_layout bl;
    kvs_layout_flat(&bl, n, KVS_DTYPE_UINT8);
    kvs_memobj_init(&in, blob, n, &bl, KVS_FMT_BINARY);
    kvs_memobj_init(&out, back, N * sizeof(float), l, KVS_FMT_KV_2LTD);
    return kvs_deserialize(p->deserializer, &in, &out, NULL);
}

/* The documented bound (docs/fidelity.md): per token row of K or V, the L2
 * error is at most step x rms x sqrt(hidden) / 2, plus float rounding. */
static void test_round_trip_within_bound(void)
{
    kvs_serde_pair p;
    REQUIRE(make_pair(path_a, ", \"k_step\": 0.05, \"v_step\": 0.2", &p) == KVS_OK);
    kvs_transform *t = NULL;
    REQUIRE(kvs_transform_load(path_a, &t) == KVS_OK);
    float *kv = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    make_kv(999, kv); /* not a calibration chunk */
    kvs_layout l;
    layout_4d(&l, L, T, H, KVS_DTYPE_FLOAT32);
    size_t n = 0;
    uint8_t *blob = encode(&p, kv, &l, &n);
    REQUIRE(blob != NULL);
    CHECK(n < N * 2); /* well under bfloat16's size */
    CHECK_OK(decode(&p, blob, n, &l, back));
    double worst = 0;
    for (int kvi = 0; kvi < 2; kvi++)
        for (int layer = 0; layer < L; layer++) {
            double bound = (kvi ? 0.2 : 0.05) * t->rms[kvi][layer] * sqrt((double)H) / 2;
            for (int r = 0; r < T; r++) {
                const float *x = kv + (((size_t)kvi * L + layer) * T + r) * H;
                const float *y = back + (((size_t)kvi * L + layer) * T + r) * H;
                double e = 0;
                for (int i = 0; i < H; i++) e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
                if (sqrt(e) / bound > worst) worst = sqrt(e) / bound;
            }
        }
    CHECK(worst > 0.1 && worst <= 1.0 + 1e-4);
    /* deterministic: the same bytes again */
    size_t n2 = 0;
    uint8_t *again = encode(&p, kv, &l, &n2);
    CHECK(again && n2 == n && memcmp(again, blob, n) == 0);
    free(again);
    free(blob);
    free(kv);
    free(back);
    kvs_transform_free(t);
    kvs_serde_pair_destroy(&p);
}

static void test_wrong_transform_refused(void)
{
    kvs_serde_pair pa, pb, none;
    REQUIRE(make_pair(path_a, "", &pa) == KVS_OK);
    REQUIRE(make_pair(path_b, "", &pb) == KVS_OK);
    REQUIRE(kvs_serde_create_pair("{\"type\": \"pipeline\", \"stages\": [{\"type\": \"bytes\"}]}",
                                  &none) == KVS_OK);
    kvs_transform *a = NULL, *b = NULL;
    REQUIRE(kvs_transform_load(path_a, &a) == KVS_OK && kvs_transform_load(path_b, &b) == KVS_OK);
    float *kv = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    make_kv(5, kv);
    kvs_layout l;
    layout_4d(&l, L, T, H, KVS_DTYPE_BFLOAT16);
    uint16_t *kv16 = malloc(N * 2);
    for (size_t i = 0; i < N; i++) kv16[i] = kvs_f32_to_bf16(kv[i]);
    size_t n = 0, cap = 0;
    REQUIRE(kvs_estimate_serialized_size(pa.serializer, &l, &cap) == KVS_OK);
    uint8_t *blob = malloc(cap);
    kvs_memobj in, bo, out;
    kvs_layout bl;
    kvs_layout_flat(&bl, cap, KVS_DTYPE_UINT8);
    kvs_memobj_init(&in, kv16, N * 2, &l, KVS_FMT_KV_2LTD);
    kvs_memobj_init(&bo, blob, cap, &bl, KVS_FMT_BINARY);
    REQUIRE(kvs_serialize(pa.serializer, &in, &bo, NULL, &n) == KVS_OK);
    kvs_memobj_set_used_size(&bo, n);
    memset(back, 0xAB, N * 2);
    kvs_memobj_init(&out, back, N * 2, &l, KVS_FMT_KV_2LTD);
    char msg[300];
    snprintf(msg, sizeof msg,
             "transform: blob was encoded with transform %016llx, this reader has transform "
             "%016llx",
             (unsigned long long)a->fingerprint, (unsigned long long)b->fingerprint);
    CHECK_ERR(kvs_deserialize(pb.deserializer, &bo, &out, NULL), KVS_EKEY, msg);
    snprintf(msg, sizeof msg,
             "transform: blob was encoded with transform %016llx; this reader has no transform "
             "configured (a pipeline stage {\"type\": \"transform\", \"path\": ...} with that "
             "file)",
             (unsigned long long)a->fingerprint);
    CHECK_ERR(kvs_deserialize(none.deserializer, &bo, &out, NULL), KVS_EKEY, msg);
    const uint8_t *bb = (const uint8_t *)back;
    int touched = 0;
    for (size_t i = 0; i < N * 2; i++) touched |= bb[i] != 0xAB;
    CHECK_EQ_INT(touched, 0);
    CHECK_OK(kvs_deserialize(pa.deserializer, &bo, &out, NULL));
    /* inspect shows the fingerprint and the steps */
    kvs_frame_info info;
    CHECK_OK(kvs_frame_inspect(blob, n, &info));
    snprintf(msg, sizeof msg, "{\"fingerprint\":\"%016llx\",\"k_step\":0.125,\"v_step\":0.125}",
             (unsigned long long)a->fingerprint);
    CHECK_EQ_STR(info.stages[0].params, msg);
    CHECK_EQ_STR(info.stages[0].name, "transform");
    free(blob);
    free(kv);
    free(kv16);
    free(back);
    kvs_transform_free(a);
    kvs_transform_free(b);
    kvs_serde_pair_destroy(&pa);
    kvs_serde_pair_destroy(&pb);
    kvs_serde_pair_destroy(&none);
}

static void test_layouts_refused(void)
{
    kvs_serde_pair p;
    REQUIRE(make_pair(path_a, "", &p) == KVS_OK);
    size_t cap;
    kvs_layout l;
    layout_4d(&l, L + 1, T, H, KVS_DTYPE_BFLOAT16);
    CHECK_ERR(kvs_estimate_serialized_size(p.serializer, &l, &cap), KVS_EINVAL,
              "transform: the source is [2x3x64x16 bfloat16]; the transform serves one group "
              "[2 x 2 x tokens x 16] (KV_2LTD with its 2 layers and hidden 16) of bfloat16, "
              "float16 or float32");
    kvs_layout t2d = {0};
    const int64_t dims[3] = {T, 2, H};
    kvs_layout_add_group(&t2d, 3, dims, KVS_DTYPE_BFLOAT16);
    CHECK_ERR(kvs_estimate_serialized_size(p.serializer, &t2d, &cap), KVS_EINVAL,
              "transform: the source is [64x2x16 bfloat16]; the transform serves one group "
              "[2 x 2 x tokens x 16] (KV_2LTD with its 2 layers and hidden 16) of bfloat16, "
              "float16 or float32");
    layout_4d(&l, L, T, H, KVS_DTYPE_UINT8);
    CHECK(kvs_estimate_serialized_size(p.serializer, &l, &cap) == KVS_EINVAL);
    layout_4d(&l, L, 134217728, H, KVS_DTYPE_BFLOAT16);
    CHECK_ERR(kvs_estimate_serialized_size(p.serializer, &l, &cap), KVS_EINVAL,
              "transform: the source has 134217728 tokens x hidden 16; at most 134217727 tokens "
              "per chunk (a stream's size is 32-bit)");
    kvs_serde_pair_destroy(&p);
    kvs_serde_pair q;
    CHECK_ERR(kvs_serde_create_pair("{\"type\": \"pipeline\", \"stages\": [{\"type\": "
                                    "\"transform\", \"step\": 0.1}]}",
                                    &q),
              KVS_EINVAL,
              "pipeline: stage 0: transform: \"path\" is required: the transform file `kvserde "
              "calibrate` wrote");
    char cfg[300];
    snprintf(cfg, sizeof cfg,
             "{\"type\": \"pipeline\", \"stages\": [{\"type\": \"transform\", \"path\": \"%s\", "
             "\"step\": 0}]}",
             path_a);
    CHECK_ERR(kvs_serde_create_pair(cfg, &q), KVS_EINVAL,
              "pipeline: stage 0: transform: step must be a number from 0.0001 to 64, got a "
              "number out of range");
}

/* The step a target resolves to (from the frame's parameters) and the
 * blob's size for one chunk. */
static double target_step(const char *extra, size_t *blob_bytes)
{
    kvs_serde_pair p;
    if (make_pair(path_a, extra, &p) != KVS_OK) return -1;
    float *kv = malloc(N * sizeof(float));
    make_kv(31, kv);
    kvs_layout l;
    layout_4d(&l, L, T, H, KVS_DTYPE_FLOAT32);
    size_t n = 0;
    uint8_t *blob = encode(&p, kv, &l, &n);
    kvs_frame_info info;
    double step = -1;
    if (blob && kvs_frame_inspect(blob, n, &info) == KVS_OK) {
        json_t *j = json_loads(info.stages[0].params, 0, NULL);
        step = json_number_value(json_object_get(j, "k_step"));
        if (json_number_value(json_object_get(j, "v_step")) != step) step = -2;
        json_decref(j);
    }
    *blob_bytes = n;
    free(blob);
    free(kv);
    kvs_serde_pair_destroy(&p);
    return step;
}

static void test_step_for_a_target(void)
{
    size_t n1, n4, s20, s40;
    double b1 = target_step(", \"bits\": 1.0", &n1), b4 = target_step(", \"bits\": 4.0", &n4);
    double d20 = target_step(", \"snr_db\": 20", &s20), d40 = target_step(", \"snr_db\": 40", &s40);
    CHECK(b1 > 0 && b4 > 0 && b4 < b1 && n4 > n1);
    CHECK(d20 > 0 && d40 > 0 && d40 < d20 && s40 > s20);
    /* resolved once from the calibration: the same step every time */
    size_t again;
    CHECK(target_step(", \"bits\": 1.0", &again) == b1 && again == n1);
    kvs_serde_pair p;
    CHECK_ERR(make_pair(path_a, ", \"bits\": 2.0, \"step\": 0.1", &p), KVS_EINVAL,
              "pipeline: stage 0: transform: give one of \"step\" (and \"k_step\" / "
              "\"v_step\"), \"bits\" or \"snr_db\"");
    CHECK_ERR(make_pair(path_a, ", \"snr_db\": 0.5", &p), KVS_EINVAL,
              "pipeline: stage 0: transform: snr_db must be a number from 1 to 120, got a number "
              "out of range");
}

/* ---- hostile payloads, straight into the stage's decoder --------------- */

typedef struct fixture {
    kvs_stage *st;
    kvs_transform *t; /* the stage's */
    uint8_t params[KVS_STAGE_PARAMS_MAX];
    uint8_t *payload;
    size_t n;
    kvs_layout l;
    uint16_t back[N];
} fixture;

static int fixture_init(fixture *f)
{
    memset(f, 0, sizeof *f);
    kvs_transform *t = calibrate(100, 4);
    f->t = t;
    if (kvs_stage_transform_new(t, 0.1f, 0.1f, &f->st) != KVS_OK) return -1;
    layout_4d(&f->l, L, T, H, KVS_DTYPE_BFLOAT16);
    static float kv[N];
    static uint16_t kv16[N];
    make_kv(77, kv);
    for (size_t i = 0; i < N; i++) kv16[i] = kvs_f32_to_bf16(kv[i]);
    size_t cap;
    if (f->st->type->typed_bound(f->st, &f->l, &cap) != KVS_OK) return -1;
    f->payload = malloc(cap);
    kvs_memobj src;
    kvs_memobj_init(&src, kv16, sizeof kv16, &f->l, KVS_FMT_KV_2LTD);
    f->st->type->write_params(f->st, f->params);
    return f->st->type->typed_encode(f->st, &src, f->payload, cap, &f->n);
}

static int fixture_decode(fixture *f, const uint8_t *in, size_t n)
{
    kvs_stage_ctx ctx = {NULL, NULL, 0, NULL, 0, 0, f->t};
    kvs_memobj dst;
    memset(f->back, 0xAB, sizeof f->back);
    kvs_memobj_init(&dst, f->back, sizeof f->back, &f->l, KVS_FMT_KV_2LTD);
    int rc = f->st->type->typed_decode(f->params, 20, &ctx, in, n, &dst);
    if (rc != KVS_OK) /* refused: not a byte of dst written */
        for (size_t i = 0; i < N; i++)
            if (f->back[i] != 0xABAB) return 99;
    return rc;
}

static void test_damaged_payloads_refused(void)
{
    static fixture f;
    REQUIRE(fixture_init(&f) == KVS_OK);
    CHECK_OK(fixture_decode(&f, f.payload, f.n));
    uint8_t *c = malloc(f.n + 1);
    size_t table = 16 + 2 * L * 8;
    CHECK_ERR(fixture_decode(&f, f.payload, 20), KVS_ECORRUPT,
              "transform: payload damaged: 20 bytes, shorter than its 48-byte header and stream "
              "table");
    memcpy(c, f.payload, f.n);
    c[0] = 3;
    CHECK_ERR(fixture_decode(&f, c, f.n), KVS_ECORRUPT,
              "transform: payload damaged: version 3 (expected 1 or 2) or nonzero reserved "
              "bytes");
    memcpy(c, f.payload, f.n);
    c[8] = 65;
    CHECK_ERR(fixture_decode(&f, c, f.n), KVS_ECORRUPT,
              "transform: payload damaged: it says 2 layers x 65 tokens x hidden 16, the layout "
              "2 x 64 x 16");
    memcpy(c, f.payload, f.n);
    c[16] = 17; /* K layer 0 keeps 17 of 16 */
    CHECK_ERR(fixture_decode(&f, c, f.n), KVS_ECORRUPT,
              "transform: payload damaged: K layer 0 keeps 17 components (hidden 16), mode 0, "
              "reserved 0");
    memcpy(c, f.payload, f.n);
    c[16 + 8 + 2] = 2; /* K layer 1: mode 2 */
    char msg[200];
    snprintf(msg, sizeof msg,
             "transform: payload damaged: K layer 1 keeps %u components (hidden 16), mode 2, "
             "reserved 0",
             c[16 + 8]);
    CHECK_ERR(fixture_decode(&f, c, f.n), KVS_ECORRUPT, msg);
    memcpy(c, f.payload, f.n);
    c[16 + 8 + 2] = 1; /* raw, with the coded stream's length */
    CHECK(fixture_decode(&f, c, f.n) == KVS_ECORRUPT);
    /* the streams must account for the payload exactly */
    memcpy(c, f.payload, f.n);
    c[f.n] = 0;
    snprintf(msg, sizeof msg,
             "transform: payload damaged: its streams account for %zu of its %zu bytes", f.n,
             f.n + 1);
    CHECK_ERR(fixture_decode(&f, c, f.n + 1), KVS_ECORRUPT, msg);
    memcpy(c, f.payload, f.n);
    c[16 + 4] += 1; /* K layer 0's stream one byte longer: the last runs past */
    CHECK(fixture_decode(&f, c, f.n) == KVS_ECORRUPT);
    /* K layer 0's coded stream damaged (its rANS length word): refused by
     * the coder, naming the stream (test_coef_rans.c has its messages) */
    memcpy(c, f.payload, f.n);
    c[table + 2] = 0x7F;
    CHECK(fixture_decode(&f, c, f.n) == KVS_ECORRUPT);
    CHECK(strncmp(kvs_last_error(), "transform: K layer 0: coefficient stream damaged: ", 50) ==
          0);
    /* every truncation, and flipped bits anywhere: refused or decoded, never
     * a write before the refusal (fixture_decode returns 99 then) */
    for (size_t cut = 0; cut < f.n; cut += 1 + cut / 16) {
        int rc = fixture_decode(&f, f.payload, cut);
        CHECK(rc == KVS_ECORRUPT);
    }
    int refused = 0;
    for (size_t i = 0; i < f.n; i += 3) {
        memcpy(c, f.payload, f.n);
        c[i] ^= (uint8_t)(1u << (i % 8));
        int rc = fixture_decode(&f, c, f.n);
        CHECK(rc == KVS_OK || rc == KVS_ECORRUPT);
        refused += rc == KVS_ECORRUPT;
    }
    CHECK(refused > 0);
    /* parameters: the steps and the reserved bytes are checked */
    uint8_t p[20];
    memcpy(p, f.params, 20);
    CHECK_OK(f.st->type->check_params(p, 20));
    CHECK_ERR(f.st->type->check_params(p, 19), KVS_ECORRUPT,
              "transform: 19 parameter bytes in the frame, expected 20");
    float bad = NAN;
    memcpy(p + 12, &bad, 4);
    CHECK_ERR(f.st->type->check_params(p, 20), KVS_ECORRUPT,
              "transform: frame names a V step of nan, expected 0.0001 to 64");
    memcpy(p, f.params, 20);
    p[19] = 1;
    CHECK_ERR(f.st->type->check_params(p, 20), KVS_ECORRUPT,
              "transform: frame's reserved parameter bytes are not 0");
    free(c);
    free(f.payload);
    f.st->type->destroy(f.st);
}

/* Version 1 payloads (the range coder) still decode: the fixture's payload
 * rewritten as version 1, each coded stream's coefficients re-encoded by
 * kvs_coef_encode (its classes clamped to version 1's 32, as bytes in
 * front), decodes to the
 * same bytes as the version 2 original. */
static void test_version1_decodes(void)
{
    static fixture f;
    REQUIRE(fixture_init(&f) == KVS_OK);
    CHECK_EQ_INT(f.payload[0], 2);
    CHECK_OK(fixture_decode(&f, f.payload, f.n));
    static uint16_t want[N];
    memcpy(want, f.back, sizeof want);
    size_t table = 16 + 2 * L * 8, pos = table, out = table;
    uint8_t *v1 = malloc(2 * f.n + 4096);
    memcpy(v1, f.payload, table);
    v1[0] = 1;
    int coded = 0;
    for (int i = 0; i < 2 * L; i++) {
        uint8_t *rec = v1 + 16 + 8 * i;
        uint32_t kept = rec[0] | (uint32_t)rec[1] << 8;
        uint32_t bytes = rec[4] | (uint32_t)rec[5] << 8 | (uint32_t)rec[6] << 16;
        if (kept && rec[2] == 0) {
            static float cf[T * H];
            static int32_t q[T * H];
            uint8_t cls[H];
            CHECK_OK(kvs_coef_rans_decode(f.payload + pos, bytes, T, kept, cls, cf, "v2"));
            for (size_t e = 0; e < (size_t)T * kept; e++) q[e] = (int32_t)cf[e];
            for (uint32_t k = 0; k < kept; k++)
                cls[k] = cls[k] < KVS_COEF_CLASSES ? cls[k] : KVS_COEF_CLASSES - 1;
            size_t n1 = 0;
            memcpy(v1 + out, cls, kept);
            CHECK_OK(kvs_coef_encode(q, T, kept, cls, v1 + out + kept, 4096, &n1));
            rec[4] = (uint8_t)(kept + n1);
            rec[5] = (uint8_t)((kept + n1) >> 8);
            rec[6] = (uint8_t)((kept + n1) >> 16);
            out += kept + n1;
            coded++;
        } else {
            memcpy(v1 + out, f.payload + pos, bytes);
            out += bytes;
        }
        pos += bytes;
    }
    CHECK(coded > 0);
    CHECK_OK(fixture_decode(&f, v1, out));
    CHECK(memcmp(f.back, want, sizeof want) == 0);
    /* a version 1 class above 31 is refused as ever */
    v1[table] = 32;
    if (v1[16] | v1[17])
        CHECK_ERR(fixture_decode(&f, v1, out), KVS_ECORRUPT,
                  "transform: payload damaged: K layer 0 component 0 has context class 32, at "
                  "most 31");
    free(v1);
    free(f.payload);
    f.st->type->destroy(f.st);
}

/* ---- split across workers ---------------------------------------------- */

/* While the test runs, the library's sgemm calls go through counted_sgemm
 * (the loaded table's entry swapped, blas.h), which counts the threads that
 * made them and goes on to OpenBLAS's: the streams' products should run on
 * both workers. */
static kvs_sgemm_fn real_sgemm;
static pthread_t seen[2];
static atomic_int nseen;
static pthread_mutex_t seen_mu = PTHREAD_MUTEX_INITIALIZER;

static void counted_sgemm(const enum CBLAS_ORDER o, const enum CBLAS_TRANSPOSE ta,
                          const enum CBLAS_TRANSPOSE tb, const blasint m, const blasint n,
                          const blasint k, const float alpha, const float *a, const blasint lda,
                          const float *b, const blasint ldb, const float beta, float *c,
                          const blasint ldc)
{
    pthread_mutex_lock(&seen_mu);
    int i = 0, have = atomic_load(&nseen);
    while (i < have && !pthread_equal(seen[i], pthread_self())) i++;
    if (i == have && have < 2) seen[atomic_fetch_add(&nseen, 1)] = pthread_self();
    pthread_mutex_unlock(&seen_mu);
    real_sgemm(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* An async processor with 2 workers splits one object's streams (K and V of
 * each layer) across them: the products run on both, and the blob and the
 * decoded values are the unsplit ones byte for byte. The products are
 * counted on the sgemm path, so the AMX one (test_basis_products.c, which
 * decode would take) is off here. */
static void test_split_across_workers(void)
{
    int amx = kvs_basis_amx_in_use();
    kvs_basis_set_amx(0);
    enum { REPS = 256, T2 = REPS * T, N2 = 2 * L * T2 * H };
    float *kv = malloc(N2 * sizeof(float)), *chunk = malloc(N * sizeof(float));
    REQUIRE(kv != NULL && chunk != NULL);
    for (int c = 0; c < REPS; c++) { /* long streams: each takes milliseconds */
        make_kv(500 + (uint64_t)c, chunk);
        for (int st = 0; st < 2 * L; st++)
            memcpy(kv + ((size_t)st * T2 + (size_t)c * T) * H, chunk + (size_t)st * T * H,
                   T * H * sizeof(float));
    }
    kvs_layout l, bl;
    layout_4d(&l, L, T2, H, KVS_DTYPE_FLOAT32);
    kvs_serde_pair sync, p2;
    REQUIRE(make_pair(path_a, ", \"step\": 0.1", &sync) == KVS_OK);
    REQUIRE(make_pair(path_a, ", \"step\": 0.1", &p2) == KVS_OK);
    size_t cap = 0, len = 0;
    REQUIRE_OK(kvs_estimate_serialized_size(sync.serializer, &l, &cap));
    uint8_t *want = malloc(cap), *blob = malloc(cap);
    float *back1 = malloc(N2 * sizeof(float)), *back = malloc(N2 * sizeof(float));
    REQUIRE(want && blob && back1 && back);
    kvs_layout_flat(&bl, cap, KVS_DTYPE_UINT8);
    kvs_memobj in, wmo, bmo, b1mo, bkmo;
    kvs_memobj_init(&in, kv, N2 * sizeof(float), &l, KVS_FMT_KV_2LTD);
    kvs_memobj_init(&wmo, want, cap, &bl, KVS_FMT_BINARY);
    kvs_memobj_init(&bmo, blob, cap, &bl, KVS_FMT_BINARY);
    kvs_memobj_init(&b1mo, back1, N2 * sizeof(float), &l, KVS_FMT_KV_2LTD);
    kvs_memobj_init(&bkmo, back, N2 * sizeof(float), &l, KVS_FMT_KV_2LTD);
    REQUIRE_OK(kvs_serialize(sync.serializer, &in, &wmo, NULL, &len));
    kvs_memobj_set_used_size(&wmo, len);
    REQUIRE_OK(kvs_deserialize(sync.deserializer, &wmo, &b1mo, NULL));
    kvs_processor *p = NULL;
    REQUIRE_OK(kvs_async_processor_create(p2.serializer, p2.deserializer, 2, &p));
    REQUIRE_OK(kvs_async_processor_set_split(p, 0, 1));
    const kvs_blas *blas = NULL;
    REQUIRE_OK(kvs_blas_get("test", &blas));
    kvs_blas *table = (kvs_blas *)blas; /* not const underneath: blas.h */
    real_sgemm = table->sgemm;
    table->sgemm = counted_sgemm;
    kvs_memobj *ip = &in, *bp = &bmo, *kp = &bkmo;
    /* the most threads seen encoding, decoding. Whether the idle worker
     * wakes before the calling one has claimed every piece is up to the
     * scheduler: with the other core busy (ctest -j2) a round went to one
     * thread alone most of the time (20 rounds failed in 8 of 30 runs next
     * to a busy loop), so up to 400 rounds; a quiet machine needs one or two */
    int threads[2] = {0, 0};
    for (int round = 0; round < 400 && (threads[0] < 2 || threads[1] < 2); round++) {
        kvs_task_id id;
        kvs_task_result r;
        memset(blob, 0, cap);
        atomic_store(&nseen, 0);
        REQUIRE_OK(kvs_processor_submit_serialize(p, &ip, 1, &bp, 1, NULL, &id));
        REQUIRE(kvs_test_proc_wait(p, 1, id, &r) == KVS_OK);
        if (atomic_load(&nseen) > threads[0]) threads[0] = atomic_load(&nseen);
        CHECK(r.state == KVS_TASK_OK);
        CHECK(bmo.used_size == len && memcmp(blob, want, len) == 0);
        memset(back, 0, N2 * sizeof(float));
        atomic_store(&nseen, 0);
        REQUIRE_OK(kvs_processor_submit_deserialize(p, &bp, 1, &kp, 1, NULL, &id));
        REQUIRE(kvs_test_proc_wait(p, 0, id, &r) == KVS_OK);
        if (atomic_load(&nseen) > threads[1]) threads[1] = atomic_load(&nseen);
        CHECK(r.state == KVS_TASK_OK);
        CHECK(memcmp(back, back1, N2 * sizeof(float)) == 0);
    }
    table->sgemm = real_sgemm;
    CHECK(threads[0] == 2);
    CHECK(threads[1] == 2);
    kvs_processor_destroy(p);
    kvs_serde_pair_destroy(&sync);
    free(kv), free(chunk), free(want), free(blob), free(back1), free(back);
    kvs_basis_set_amx(amx);
}

/* ---- OpenBLAS is loaded on first use ----------------------------------- */

/* Whether a library whose path contains `name` is mapped into this process. */
static int mapped(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    int found = 0;
    while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, name) != NULL;
    if (f) fclose(f);
    return found;
}

/* Runs first: linking kvserde does not load OpenBLAS (nor start its
 * threads); the first calibration does. */
static void test_openblas_loaded_on_first_use(void)
{
    CHECK(!mapped("libopenblas"));
    kvs_transform *t = calibrate(1, 1);
    CHECK(mapped("libopenblas"));
    kvs_transform_free(t);
}

int main(void)
{
    RUN(test_openblas_loaded_on_first_use);
    make_files();
    RUN(test_coder_round_trip_exact);
    RUN(test_coder_refusals);
    RUN(test_calibration_deterministic);
    RUN(test_calibration_refuses_nonfinite);
    RUN(test_file_checked);
    RUN(test_round_trip_within_bound);
    RUN(test_wrong_transform_refused);
    RUN(test_layouts_refused);
    RUN(test_step_for_a_target);
    RUN(test_damaged_payloads_refused);
    RUN(test_version1_decodes);
    RUN(test_split_across_workers);
    unlink(path_a);
    unlink(path_b);
    return TEST_SUMMARY();
}
