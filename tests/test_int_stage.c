/* test_int_stage.c - the "int" typed stage (src/frame/stage_int.c) and its
 * quantizer (src/codecs/intq.c): payload bytes computed by hand, the plane
 * layout of each memory format, the documented error bound (intq.h) on
 * synthetic data in every dtype and configuration and on the real KV cache
 * (../shared/kvdata, skipped with a message when absent), Hadamard and
 * outlier channels, refusals of configs, frames and damaged payloads with
 * nothing written, the same bytes when split across workers, and the AVX2
 * clones against the portable build of the same source, bit for bit. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The portable build of the quantizer, under other names, to hold the
 * library's (AVX2 clones, and the AVX-512 kernels where the CPU has them:
 * test_int_simd goes through every variant) against. */
#include "kvs_test_intq_ref.h"

#include "codecs/half.h"
#include "frame/stage.h"
#include "kvs_test.h"
#include "kvs_test_proc.h"
#include "kvs_test_kvdata.h"
#include "kvserde/memobj.h"
#include "kvserde/pipeline.h"
#include "kvserde/processor.h"
#include "kvserde/registry.h"
#include "kvserde/serde.h"

static uint64_t lcg(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* A uniform float in [-1, 1). */
static float unif(uint64_t *s) { return (float)((double)lcg(s) / 2147483648.0 * 2.0 - 1.0); }

static kvs_stage *make_stage(const char *json)
{
    json_error_t e;
    json_t *cfg = json_loads(json, 0, &e);
    kvs_stage *st = NULL;
    if (cfg == NULL || kvs_stage_int_type.create(cfg, &st) != KVS_OK) {
        fprintf(stderr, "%s: %s\n", json, kvs_last_error());
        abort();
    }
    json_decref(cfg);
    return st;
}


static void params_bytes(const kvs_stage *st, uint8_t *b)
{
    CHECK_EQ_U64(st->type->params_size(st), 14);
    CHECK_OK(st->type->write_params(st, b));
}

/* Encode with the stage: a malloc'd payload of *n bytes, or NULL. */
static uint8_t *encode(const kvs_stage *st, const kvs_memobj *src, size_t *n)
{
    size_t bound;
    if (st->type->typed_bound(st, &src->layout, &bound) != KVS_OK) return NULL;
    uint8_t *out = malloc(bound + 1);
    if (st->type->typed_encode(st, src, out, bound, n) != KVS_OK) {
        free(out);
        return NULL;
    }
    CHECK(*n <= bound);
    return out;
}

/* Decode with the parameters the stage records, as a reader would. */
static int decode(const kvs_stage *st, const uint8_t *in, size_t n, kvs_memobj *dst)
{
    uint8_t b[14];
    params_bytes(st, b);
    int rc = st->type->check_params(b, 14);
    return rc ? rc : st->type->typed_decode(b, 14, NULL, in, n, dst);
}

static kvs_memobj *obj(kvs_memory_format fmt, kvs_dtype dt, uint32_t nd, const int64_t *dims)
{
    kvs_layout l = {0};
    kvs_memobj *o = NULL;
    if (kvs_layout_add_group(&l, nd, dims, dt) != KVS_OK || kvs_memobj_alloc(&l, fmt, &o))
        abort();
    return o;
}

static kvs_memobj *like(const kvs_memobj *o)
{
    kvs_memobj *b = NULL;
    if (kvs_memobj_alloc(&o->layout, o->format, &b)) abort();
    return b;
}

static float get(const kvs_memobj *o, uint64_t i)
{
    kvs_dtype dt = o->layout.groups[0].dtype;
    return load_elem((const uint8_t *)o->data + i * kvs_dtype_size(dt), dt);
}

static void set(kvs_memobj *o, uint64_t i, float v)
{
    kvs_dtype dt = o->layout.groups[0].dtype;
    store_elem((uint8_t *)o->data + i * kvs_dtype_size(dt), dt, v);
}

static void fill(kvs_memobj *o, uint64_t seed, float amp)
{
    uint64_t n = kvs_layout_numel(&o->layout);
    for (uint64_t i = 0; i < n; i++) set(o, i, amp * unif(&seed));
}

/* ---------------------------------------------------------------------
 * The bound of intq.h, computed independently of the quantizer's plan:
 * the worst |x - x'| minus what the bound allows, over one plane [T, D]
 * (element (t, c) at base + t * stride + c). <= 0: within the bound.
 * ------------------------------------------------------------------ */

static double out_ulp(kvs_dtype dt, double v)
{
    double a = fabs(v);
    return dt == KVS_DTYPE_BFLOAT16 ? a * 0x1p-8 + 0x1p-133
           : dt == KVS_DTYPE_FLOAT16 ? a * 0x1p-11 + 0x1p-25
                                     : a * 0x1p-24 + 0x1p-149;
}

static double plane_excess(const kvs_memobj *src, const kvs_memobj *back, uint64_t base,
                           uint64_t stride, uint64_t T, uint64_t D, unsigned axis,
                           unsigned G, unsigned bits, int zp, int f16)
{
    double worst = -INFINITY;
    uint64_t rg = axis == KVS_INTQ_CHANNEL ? G : axis == KVS_INTQ_TOKEN ? 1 : T;
    uint64_t cg = axis == KVS_INTQ_TOKEN ? G : axis == KVS_INTQ_CHANNEL ? 1 : D;
    double levels = zp ? (double)((1 << bits) - 1) : (double)((1 << (bits - 1)) - 1);
    kvs_dtype dt = src->layout.groups[0].dtype;
    for (uint64_t t0 = 0; t0 < T; t0 += rg)
        for (uint64_t c0 = 0; c0 < D; c0 += cg) {
            uint64_t t1 = t0 + rg < T ? t0 + rg : T, c1 = c0 + cg < D ? c0 + cg : D;
            double mn = INFINITY, mx = -INFINITY;
            for (uint64_t t = t0; t < t1; t++)
                for (uint64_t c = c0; c < c1; c++) {
                    double x = get(src, base + t * stride + c);
                    mn = x < mn ? x : mn;
                    mx = x > mx ? x : mx;
                }
            double range = zp ? mx - mn + (f16 ? fabs(mn) * 0x1p-10 + 0x1p-24 : 0)
                              : fmax(fabs(mn), fabs(mx));
            double s = range / levels * (f16 ? 1 + 0x1p-9 : 1 + 0x1p-20) + (f16 ? 0x1p-24 : 0);
            for (uint64_t t = t0; t < t1; t++)
                for (uint64_t c = c0; c < c1; c++) {
                    uint64_t i = base + t * stride + c;
                    double x = get(src, i), y = get(back, i);
                    double allowed = s / 2 + fabs(x) * 0x1p-20 + out_ulp(dt, y);
                    worst = fmax(worst, fabs(x - y) - allowed);
                }
        }
    return worst;
}

/* ---------------------------------------------------------------------
 * Payload bytes by hand
 * ------------------------------------------------------------------ */

static void test_hand_computed(void)
{
    /* float32 [1, 4] {-1, 0, 0.5, 1}, 2 bits symmetric, a float32 scale
     * per 4 channels: s = 1 / 1; codes rint(x / s) + 2 = 1, 2, 2 (0.5
     * rounds to even 0), 3; packed LSB first: 1 | 2 << 2 | 2 << 4 | 3 << 6
     * = 0xe9. Decoded: -1, 0, 0, 1. */
    const int64_t d2[2] = {1, 4};
    kvs_memobj *o = obj(KVS_FMT_BINARY, KVS_DTYPE_FLOAT32, 2, d2), *b = like(o);
    const float x[4] = {-1, 0, 0.5f, 1};
    for (int i = 0; i < 4; i++) set(o, (uint64_t)i, x[i]);
    kvs_stage *st = make_stage("{\"type\":\"int\",\"bits\":2,\"v_axis\":\"token\",\"group\":4,"
                               "\"zero_point\":false,\"scale_dtype\":\"float32\"}");
    size_t n = 0;
    uint8_t *pl = encode(st, o, &n);
    REQUIRE(pl != NULL);
    const uint8_t want[9] = {1, 4, 0, 0, 0x00, 0x00, 0x80, 0x3f, 0xe9};
    CHECK_EQ_U64(n, 9);
    CHECK(n == 9 && memcmp(pl, want, 9) == 0);
    uint8_t pb[14];
    params_bytes(st, pb);
    const uint8_t want_params[14] = {2, 1, 0, 0, 4, 0, 4, 0, 1, 2, 0, 0, 0, 0};
    CHECK(memcmp(pb, want_params, 14) == 0);
    CHECK_OK(decode(st, pl, n, b));
    const float back[4] = {-1, 0, 0, 1};
    for (int i = 0; i < 4; i++) CHECK(get(b, (uint64_t)i) == back[i]);
    free(pl);
    st->type->destroy(st);

    /* bfloat16 {0, 1, 2, 3}, 2 bits with a zero point, float16 scales:
     * z = 0 (00 00), s = 3 / 3 = 1 (00 3c), codes 0 1 2 3 -> 0xe4; exact. */
    const float y[4] = {0, 1, 2, 3};
    kvs_memobj *ob = obj(KVS_FMT_BINARY, KVS_DTYPE_BFLOAT16, 2, d2), *bb = like(ob);
    for (int i = 0; i < 4; i++) set(ob, (uint64_t)i, y[i]);
    st = make_stage("{\"type\":\"int\",\"bits\":2,\"group\":4}");
    pl = encode(st, ob, &n);
    REQUIRE(pl != NULL);
    const uint8_t want2[9] = {1, 4, 0, 0, 0x00, 0x3c, 0x00, 0x00, 0xe4};
    CHECK(n == 9 && memcmp(pl, want2, 9) == 0);
    CHECK_OK(decode(st, pl, n, bb));
    CHECK(memcmp(bb->data, ob->data, 8) == 0);
    free(pl);
    st->type->destroy(st);

    /* 3 bits: codes straddle bytes. float32 [1, 3] {-3, 3, 1}, symmetric,
     * s = 3 / 3 = 1, codes rint(x) + 4 = 1, 7, 5: 1 | 7 << 3 | 5 << 6 =
     * 0x179 -> 79 01. */
    const int64_t d3[2] = {1, 3};
    kvs_memobj *o3 = obj(KVS_FMT_BINARY, KVS_DTYPE_FLOAT32, 2, d3), *b3 = like(o3);
    set(o3, 0, -3);
    set(o3, 1, 3);
    set(o3, 2, 1);
    st = make_stage("{\"type\":\"int\",\"bits\":3,\"group\":3,\"zero_point\":false,"
                    "\"scale_dtype\":\"float32\"}");
    pl = encode(st, o3, &n);
    REQUIRE(pl != NULL);
    const uint8_t want3[10] = {1, 4, 0, 0, 0x00, 0x00, 0x80, 0x3f, 0x79, 0x01};
    CHECK(n == 10 && memcmp(pl, want3, 10) == 0);
    CHECK_OK(decode(st, pl, n, b3));
    CHECK(memcmp(b3->data, o3->data, 12) == 0);
    free(pl);
    st->type->destroy(st);

    /* 5 levels in 8-bit codes (for an entropy coder after the stage):
     * float32 {-3, 3, 1}, symmetric, s = 3 / 2 = 1.5; codes rint(x / s) +
     * 128 = 126, 130, 129 (1 / 1.5 = 0.67 rounds to 1); back -3, 3, 1.5. */
    st = make_stage("{\"type\":\"int\",\"bits\":8,\"levels\":5,\"group\":3,"
                    "\"zero_point\":false,\"scale_dtype\":\"float32\"}");
    pl = encode(st, o3, &n);
    REQUIRE(pl != NULL);
    const uint8_t want4[11] = {1, 4, 0, 0, 0x00, 0x00, 0xc0, 0x3f, 126, 130, 129};
    CHECK(n == 11 && memcmp(pl, want4, 11) == 0);
    CHECK_OK(decode(st, pl, n, b3));
    CHECK(get(b3, 0) == -3 && get(b3, 1) == 3 && get(b3, 2) == 1.5f);
    free(pl);
    st->type->destroy(st);
    kvs_memobj_free(o);
    kvs_memobj_free(b);
    kvs_memobj_free(ob);
    kvs_memobj_free(bb);
    kvs_memobj_free(o3);
    kvs_memobj_free(b3);
}

/* The zero point of a group whose minimum is 0 with both signs: the
 * encoder folds its statistics in eight lanes (element i in lane i % 8),
 * each keeping the first of equal values it meets, and then the lanes in
 * order, so -0 in lane 1 (element 9) wins over +0 in lane 2 (element 2),
 * though +0 comes first in the row: the stored zero point is -0. */
static void test_signed_zero_minimum(void)
{
    const int64_t d2[2] = {1, 16};
    kvs_memobj *o = obj(KVS_FMT_BINARY, KVS_DTYPE_FLOAT32, 2, d2);
    for (uint64_t i = 0; i < 16; i++) set(o, i, 1.0f);
    set(o, 2, 0.0f);
    set(o, 9, -0.0f);
    kvs_stage *st = make_stage("{\"type\":\"int\",\"bits\":8,\"group\":16,"
                               "\"scale_dtype\":\"float32\"}");
    size_t n;
    uint8_t *pl = encode(st, o, &n);
    REQUIRE(pl != NULL);
    const uint8_t minus_zero[4] = {0x00, 0x00, 0x00, 0x80};
    CHECK(n == 4 + 4 + 4 + 16 && memcmp(pl + 8, minus_zero, 4) == 0);
    free(pl);
    st->type->destroy(st);
    kvs_memobj_free(o);
}

/* A subnormal scale (float32 values near 0): the codes divide by it (its
 * reciprocal would overflow to inf and give NaN codes for x = z, the case
 * fuzz_int found) and stay within the bound. */
static void test_subnormal_scale(void)
{
    const int64_t d2[2] = {1, 3};
    kvs_memobj *o = obj(KVS_FMT_BINARY, KVS_DTYPE_FLOAT32, 2, d2), *b = like(o);
    set(o, 0, 0.0f);
    set(o, 1, 1e-40f);
    set(o, 2, 5e-41f);
    kvs_stage *st = make_stage("{\"type\":\"int\",\"bits\":4,\"group\":3,"
                               "\"scale_dtype\":\"float32\"}");
    size_t n;
    uint8_t *pl = encode(st, o, &n);
    REQUIRE(pl != NULL);
    CHECK_EQ_U64(n, 4 + 8 + 2);
    /* s = 6.667e-42 (1e-40 / 15 rounded up): codes 0, 15 (14.998), 7 (7.4992) */
    CHECK(pl[12] == (0 | 15 << 4) && pl[13] == 7);
    CHECK_OK(decode(st, pl, n, b));
    CHECK(plane_excess(o, b, 0, 3, 1, 3, KVS_INTQ_TOKEN, 3, 4, 1, 0) <= 0);
    CHECK(get(b, 0) == 0.0f);
    free(pl);
    st->type->destroy(st);
    /* The other end: a float32 scale above 3.4e38 is finite and read back
     * (a reader once refused it; fuzz_int). 2 levels: s = the range. */
    set(o, 1, 3.4027e38f);
    set(o, 2, 3.4027e38f);
    st = make_stage("{\"type\":\"int\",\"bits\":2,\"levels\":2,\"group\":3,"
                    "\"scale_dtype\":\"float32\"}");
    pl = encode(st, o, &n);
    REQUIRE(pl != NULL);
    CHECK_OK(decode(st, pl, n, b));
    CHECK(get(b, 0) == 0.0f && get(b, 1) == 3.4027e38f && get(b, 2) == 3.4027e38f);
    free(pl);
    st->type->destroy(st);
    kvs_memobj_free(o);
    kvs_memobj_free(b);
}

/* K per channel, V per token in each KV format: the payload is the sizes
 * docs/frame_format.md gives, and the K plane really is grouped by
 * channel (a channel of one large value costs only its own precision). */
static void test_kv_planes(void)
{
    /* [2, L=2, T=6, D=8] KV_2LTD, 4 bits, groups of 4, float16 scale +
     * zero: a K plane has ceil(6/4) * 8 = 16 scales (+16 zeros) and 6 rows
     * of 4 bytes: 64 + 24 = 88; a V plane 6 * 2 scales: 24 + 24 + 24 = 72.
     * Payload 4 + 2 * 88 + 2 * 72 = 324. */
    const int64_t d4[4] = {2, 2, 6, 8};
    kvs_memobj *o = obj(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, 4, d4), *b = like(o);
    fill(o, 7, 2.0f);
    kvs_stage *st = make_stage("{\"type\":\"int\",\"bits\":4,\"group\":4}");
    size_t n = 0;
    uint8_t *pl = encode(st, o, &n);
    REQUIRE(pl != NULL);
    CHECK_EQ_U64(n, 324);
    CHECK_EQ_INT(pl[1], KVS_FMT_KV_2LTD);
    CHECK_OK(decode(st, pl, n, b));
    for (int l = 0; l < 4; l++) {
        unsigned axis = l < 2 ? KVS_INTQ_CHANNEL : KVS_INTQ_TOKEN;
        CHECK(plane_excess(o, b, (uint64_t)l * 48, 8, 6, 8, axis, 4, 4, 1, 1) <= 0);
    }
    free(pl);
    /* The same object as generic bytes (format binary): one plane [24, 8]
     * with V's settings: 24 * 2 scales and zeros (192) + 24 rows (96). */
    o->format = KVS_FMT_BINARY;
    pl = encode(st, o, &n);
    REQUIRE(pl != NULL);
    CHECK_EQ_U64(n, 4 + 192 + 96);
    free(pl);
    kvs_memobj_free(o);
    kvs_memobj_free(b);

    /* KV_T2D [T=5, 2, D=4]: K rows at t * 8, V rows at t * 8 + 4. */
    const int64_t d3[3] = {5, 2, 4};
    o = obj(KVS_FMT_KV_T2D, KVS_DTYPE_FLOAT16, 3, d3);
    b = like(o);
    fill(o, 9, 3.0f);
    /* one large K channel: with per-channel groups it does not spoil the
     * other channels' precision */
    for (int t = 0; t < 5; t++) set(o, (uint64_t)t * 8 + 1, 1000.0f + (float)t);
    pl = encode(st, o, &n);
    REQUIRE(pl != NULL);
    CHECK_OK(decode(st, pl, n, b));
    CHECK(plane_excess(o, b, 0, 8, 5, 4, KVS_INTQ_CHANNEL, 4, 4, 1, 1) <= 0);
    CHECK(plane_excess(o, b, 4, 8, 5, 4, KVS_INTQ_TOKEN, 4, 4, 1, 1) <= 0);
    for (int t = 0; t < 5; t++)
        CHECK(fabs(get(o, (uint64_t)t * 8) - get(b, (uint64_t)t * 8)) < 0.25);
    free(pl);
    st->type->destroy(st);
    kvs_memobj_free(o);
    kvs_memobj_free(b);
}

/* Every configuration without Hadamard, on every dtype, shapes whose
 * channels and tokens are no multiple of the group: within the bound. */
static void test_bound_synthetic(void)
{
    static const char *const dts[3] = {"bfloat16", "float16", "float32"};
    static const kvs_dtype dtv[3] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16, KVS_DTYPE_FLOAT32};
    static const char *const axes[3] = {"token", "channel", "tensor"};
    static const unsigned groups[3] = {1, 7, 32};
    const int64_t d3[3] = {2, 37, 45}; /* KV_2TD: K and V planes [37, 45] */
    int checked = 0;
    for (int di = 0; di < 3; di++)
        for (unsigned bits = 2; bits <= 8; bits++)
            for (int ka = 0; ka < 3; ka++)
                for (int zp = 0; zp < 2; zp++)
                    for (int f16 = 0; f16 < 2; f16++) {
                        unsigned G = groups[(bits + (unsigned)ka) % 3];
                        int va = (ka + 1) % 3;
                        char cfg[256];
                        snprintf(cfg, sizeof cfg,
                                 "{\"type\":\"int\",\"bits\":%u,\"k_axis\":\"%s\",\"v_axis\":"
                                 "\"%s\",\"group\":%u,\"zero_point\":%s,\"scale_dtype\":\"%s\"}",
                                 bits, axes[ka], axes[va], G, zp ? "true" : "false",
                                 f16 ? "float16" : "float32");
                        kvs_memobj *o = obj(KVS_FMT_KV_2TD, dtv[di], 3, d3), *b = like(o);
                        fill(o, bits * 31 + (uint64_t)ka, 5.0f);
                        set(o, 3, 0.0f);
                        kvs_stage *st = make_stage(cfg);
                        size_t n;
                        uint8_t *pl = encode(st, o, &n);
                        REQUIRE(pl != NULL);
                        CHECK_OK(decode(st, pl, n, b));
                        double e0 = plane_excess(o, b, 0, 45, 37, 45, (unsigned)ka, G, bits, zp,
                                                 f16);
                        double e1 = plane_excess(o, b, 37 * 45, 45, 37, 45, (unsigned)va, G,
                                                 bits, zp, f16);
                        if (e0 > 0 || e1 > 0)
                            fprintf(stderr, "%s %s: excess %g %g\n", cfg, dts[di], e0, e1);
                        CHECK(e0 <= 0 && e1 <= 0);
                        checked++;
                        free(pl);
                        st->type->destroy(st);
                        kvs_memobj_free(o);
                        kvs_memobj_free(b);
                    }
    CHECK_EQ_INT(checked, 3 * 7 * 3 * 2 * 2);
}

/* Hadamard: per head the error's L2 norm is at most sqrt(h) x s / 2, with
 * s the scale of the rotated head (token axis, group = head), whose range
 * is at most 2 x the head's norm. Outlier channels come back exactly and
 * are the largest ones. */
static void test_hadamard_and_outliers(void)
{
    const int64_t d3[3] = {2, 16, 64}; /* KV_2TD, heads of 16 channels */
    kvs_memobj *o = obj(KVS_FMT_KV_2TD, KVS_DTYPE_FLOAT32, 3, d3), *b = like(o);
    fill(o, 11, 1.0f);
    for (int t = 0; t < 16; t++) { /* K channels 5 and 40 are outliers */
        set(o, (uint64_t)t * 64 + 5, 50.0f + (float)t);
        set(o, (uint64_t)t * 64 + 40, -70.0f + (float)t / 3);
    }
    kvs_stage *st = make_stage("{\"type\":\"int\",\"bits\":4,\"k_axis\":\"token\",\"group\":16,"
                               "\"zero_point\":false,\"scale_dtype\":\"float32\","
                               "\"hadamard\":16,\"k_outliers\":2}");
    size_t n;
    uint8_t *pl = encode(st, o, &n);
    REQUIRE(pl != NULL);
    /* K plane: 2 indices (4 bytes), 16 x 2 float32 values, 16 x 4 scales,
     * 16 rows of 32 bytes; V: 64 scales x 4 + 512. */
    CHECK_EQ_U64(n, 4 + (4 + 128 + 256 + 512) + (256 + 512));
    CHECK(pl[4] == 5 && pl[5] == 0 && pl[6] == 40 && pl[7] == 0);
    CHECK_OK(decode(st, pl, n, b));
    for (int t = 0; t < 16; t++) {
        CHECK(get(b, (uint64_t)t * 64 + 5) == 50.0f + (float)t);
        CHECK(get(b, (uint64_t)t * 64 + 40) == -70.0f + (float)t / 3);
    }
    double worst = -INFINITY;
    for (uint64_t row = 0; row < 32; row++)
        for (uint64_t h = 0; h < 4; h++) {
            double norm = 0, err = 0;
            for (uint64_t c = 0; c < 16; c++) {
                uint64_t i = row * 64 + h * 16 + c;
                int outlier = row < 16 && (h * 16 + c == 5 || h * 16 + c == 40);
                double x = outlier ? 0 : get(o, i), y = outlier ? 0 : get(b, i);
                norm += x * x;
                err += (x - y) * (x - y);
            }
            double s = 2 * sqrt(norm) / 7 * (1 + 0x1p-20);
            worst = fmax(worst, sqrt(err) - (sqrt(16.0) * s / 2 + 1e-5 * sqrt(norm)));
        }
    CHECK(worst <= 0);
    free(pl);
    st->type->destroy(st);
    kvs_memobj_free(o);
    kvs_memobj_free(b);
}

/* ---------------------------------------------------------------------
 * Refusals
 * ------------------------------------------------------------------ */

static void test_config_refused(void)
{
    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"type\":\"int\",\"bits\":9}", "int: \"bits\" must be an integer from 2 to 8, got an "
                                          "out-of-range integer"},
        {"{\"type\":\"int\",\"bits\":\"4\"}",
         "int: \"bits\" must be an integer from 2 to 8, got string"},
        {"{\"type\":\"int\",\"k_axis\":\"row\"}",
         "int: k_axis must be one of token, channel, tensor; got 'row'"},
        {"{\"type\":\"int\",\"group\":0}",
         "int: \"group\" must be an integer from 1 to 65535, got an out-of-range integer"},
        {"{\"type\":\"int\",\"hadamard\":48}",
         "int: hadamard is 48; expected 0 (off) or a power of two from 2 to 1024"},
        {"{\"type\":\"int\",\"hadamard\":1}",
         "int: hadamard is 1; expected 0 (off) or a power of two from 2 to 1024"},
        {"{\"type\":\"int\",\"k_outliers\":1025}",
         "int: \"k_outliers\" must be an integer from 0 to 1024, got an out-of-range integer"},
        {"{\"type\":\"int\",\"scale_dtype\":\"bfloat16\"}",
         "int: scale_dtype must be one of float16, float32; got 'bfloat16'"},
        {"{\"type\":\"int\",\"bits\":3,\"zero_point\":false,\"levels\":6}",
         "int: levels is 6; expected an odd integer from 3 to 7 with 3 bits, symmetric"},
        {"{\"type\":\"int\",\"bits\":3,\"levels\":9}",
         "int: levels is 9; expected an integer from 2 to 8 with 3 bits and a zero point"},
        {"{\"type\":\"int\",\"bit\":4}",
         "int: unknown member 'bit'; accepted: type, bits, k_axis, v_axis, group, k_group, "
         "v_group, zero_point, scale_dtype, hadamard, k_outliers, levels"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_t *cfg = json_loads(bad[i].json, 0, NULL);
        kvs_stage *st = NULL;
        CHECK_ERR(kvs_stage_int_type.create(cfg, &st), KVS_EINVAL, bad[i].msg);
        CHECK(st == NULL);
        json_decref(cfg);
    }
    /* Through the pipeline: the position in the chain is named. */
    kvs_serde_pair p;
    CHECK_ERR(kvs_serde_create_pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"int\","
                                    "\"bits\":1}]}", &p),
              KVS_EINVAL,
              "pipeline: stage 0: int: \"bits\" must be an integer from 2 to 8, got an "
              "out-of-range integer");
    /* Objects it cannot quantize. */
    kvs_stage *st = make_stage("{\"type\":\"int\",\"hadamard\":64}");
    const int64_t d2[2] = {4, 96};
    kvs_memobj *o = obj(KVS_FMT_BINARY, KVS_DTYPE_BFLOAT16, 2, d2);
    size_t nb;
    CHECK_ERR(st->type->typed_bound(st, &o->layout, &nb), KVS_EINVAL,
              "int: hadamard 64 does not divide the 96 channels of group 0");
    kvs_memobj_free(o);
    st->type->destroy(st);
    st = make_stage("{\"type\":\"int\"}");
    o = obj(KVS_FMT_BINARY, KVS_DTYPE_UINT8, 2, d2);
    CHECK_ERR(st->type->typed_bound(st, &o->layout, &nb), KVS_EINVAL,
              "int: group 0 is uint8; the int stage quantizes float32, float16 and bfloat16");
    kvs_memobj_free(o);
    o = obj(KVS_FMT_BINARY, KVS_DTYPE_FLOAT32, 2, d2);
    set(o, 100, NAN);
    uint8_t *out = malloc(1 << 16);
    CHECK_ERR(st->type->typed_encode(st, o, out, 1 << 16, &nb), KVS_EINVAL,
              "int: element (token 1, channel 4) of plane 0 is not finite; the int stage "
              "quantizes finite values only");
    set(o, 100, 1e6f);
    CHECK_ERR(st->type->typed_encode(st, o, out, 1 << 16, &nb), KVS_EINVAL,
              "int: values in [0, 1e+06] need a scale or zero point beyond float16; use "
              "\"scale_dtype\": \"float32\"");
    free(out);
    kvs_memobj_free(o);
    st->type->destroy(st);
}

static void test_frame_params_refused(void)
{
    const uint8_t good[14] = {4, 1, 0, 1, 64, 0, 64, 0, 2, 15, 0, 0, 0, 0};
    const kvs_stage_type *t = &kvs_stage_int_type;
    CHECK_OK(t->check_params(good, 14));
    CHECK_ERR(t->check_params(good, 13), KVS_ECORRUPT,
              "int: 13 parameter bytes in the frame, expected 14");
    static const struct {
        int at;
        uint8_t v;
        const char *msg;
    } bad[] = {
        {0, 1, "int: frame: bits is 1; expected 2 to 8"},
        {0, 9, "int: frame: bits is 9; expected 2 to 8"},
        {1, 3, "int: frame: K axis is 3; expected 0 (token), 1 (channel) or 2 (tensor)"},
        {3, 2, "int: frame: zero point flag is 2; expected 0 or 1"},
        {4, 0, "int: frame: K group is 0; expected 1 to 65535"},
        {8, 3, "int: frame: scale dtype is 3; expected 2 (float16) or 1 (float32)"},
        {9, 16, "int: frame: levels is 17; expected an integer from 2 to 16 with 4 bits and a "
                "zero point"},
        {9, 0, "int: frame: levels is 1; expected an integer from 2 to 16 with 4 bits and a "
               "zero point"},
        {10, 3, "int: frame: hadamard is 3; expected 0 (off) or a power of two from 2 to 1024"},
        {13, 4, "int: frame: k_outliers is 1024; expected 0 to 1024"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t p[14];
        memcpy(p, good, 14);
        p[bad[i].at] = bad[i].v;
        if (bad[i].at == 13) p[12] = 1; /* 1025 */
        if (bad[i].at == 13) {
            CHECK_ERR(t->check_params(p, 14), KVS_ECORRUPT,
                      "int: frame: k_outliers is 1025; expected 0 to 1024");
            continue;
        }
        CHECK_ERR(t->check_params(p, 14), KVS_ECORRUPT, bad[i].msg);
    }
}

/* Damaged payloads: each refused with nothing written to dst. */
static void test_damaged_payloads(void)
{
    const int64_t d3[3] = {2, 8, 16};
    kvs_memobj *o = obj(KVS_FMT_KV_2TD, KVS_DTYPE_BFLOAT16, 3, d3), *b = like(o);
    fill(o, 3, 1.0f);
    kvs_stage *st = make_stage("{\"type\":\"int\",\"bits\":4,\"group\":8,\"k_outliers\":2}");
    size_t n;
    uint8_t *pl = encode(st, o, &n);
    REQUIRE(pl != NULL);
    /* K: 4 + 8 x 2 x 2 + 16 x 2 x 2 + 8 x 8 = 164; V: 16 x 2 x 2 + 64 = 128 */
    CHECK_EQ_U64(n, 4 + 164 + 128);
    uint8_t *dmg = malloc(n + 1);
    size_t nb = kvs_layout_nbytes(&o->layout);
    struct {
        size_t at, len;
        uint8_t v;
        int code;
        const char *msg;
    } cases[] = {
        {0, n, 2, KVS_ECORRUPT,
         "int: payload header damaged: 296 bytes, version 2, memory format 3, reserved 0 0; "
         "expected version 1, a format from 0 to 8, 0 0"},
        {1, n, 9, KVS_ECORRUPT,
         "int: payload header damaged: 296 bytes, version 1, memory format 9, reserved 0 0; "
         "expected version 1, a format from 0 to 8, 0 0"},
        {1, n, 4, KVS_ECORRUPT, "int: stored object is 296 bytes, destination layout needs 260"},
        {0, n - 1, 1, KVS_ECORRUPT,
         "int: stored object is 295 bytes, destination layout needs 296"},
        {0, 3, 1, KVS_ECORRUPT,
         "int: payload header damaged: 3 bytes, version 1, memory format 3, reserved 0 0; "
         "expected version 1, a format from 0 to 8, 0 0"},
        {6, n, 0, KVS_ECORRUPT,
         "int: group 0 plane 0: outlier 1 names channel 0; expected ascending channels below 16"},
        {6, n, 16, KVS_ECORRUPT,
         "int: group 0 plane 0: outlier 1 names channel 16; expected ascending channels below 16"},
        {4 + 36 + 1, n, 0x7e, KVS_ECORRUPT,
         "int: group 0 plane 0: scale 0 is nan (zero 0); expected a finite scale >= 0 and a "
         "finite zero"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memcpy(dmg, pl, n);
        if (cases[i].at < cases[i].len) dmg[cases[i].at] = cases[i].v;
        if (i == 7) { /* scale 0: 0x7e00 (NaN); its zero, right after the scales, 0 */
            dmg[4 + 36] = 0x00;
            dmg[4 + 36 + 32] = 0;
            dmg[4 + 36 + 33] = 0;
        }
        memset(b->data, 0xA5, nb);
        uint8_t uniform[4] = {0xA5, 0xA5, 0xA5, 0xA5};
        CHECK_ERR(decode(st, dmg, cases[i].len, b), cases[i].code, cases[i].msg);
        int untouched = 1;
        for (size_t k = 0; k < nb; k++) untouched &= ((uint8_t *)b->data)[k] == uniform[k % 4];
        CHECK(untouched);
    }
    /* A destination of another dtype is one the encoder never wrote. */
    kvs_memobj *u = obj(KVS_FMT_KV_2TD, KVS_DTYPE_UINT8, 3, d3);
    CHECK_ERR(decode(st, pl, n, u), KVS_ECORRUPT,
              "int: group 0 is uint8; the int stage quantizes float32, float16 and bfloat16");
    kvs_memobj_free(u);
    free(dmg);

    /* Through the pipeline: any flipped payload bit is refused (the
     * checksum), and so is a frame whose int parameters are damaged. */
    kvs_serde_pair p;
    REQUIRE_OK(kvs_serde_create_pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"int\"}]}", &p));
    size_t est, len;
    REQUIRE_OK(kvs_estimate_serialized_size(p.serializer, &o->layout, &est));
    kvs_layout bl;
    REQUIRE_OK(kvs_layout_flat(&bl, est, KVS_DTYPE_UINT8));
    kvs_memobj *blob = NULL;
    REQUIRE_OK(kvs_memobj_alloc(&bl, KVS_FMT_BINARY, &blob));
    REQUIRE_OK(kvs_serialize(p.serializer, o, blob, NULL, &len));
    kvs_memobj_set_used_size(blob, len);
    CHECK_OK(kvs_deserialize(p.deserializer, blob, b, NULL));
    kvs_frame_info info;
    CHECK_OK(kvs_frame_inspect(blob->data, len, &info));
    CHECK_EQ_STR(info.stages[0].name, "int");
    CHECK_EQ_STR(info.stages[0].params,
                 "{\"bits\":4,\"hadamard\":0,\"k_axis\":\"channel\",\"k_group\":64,"
                 "\"k_outliers\":0,\"levels\":16,\"scale_dtype\":\"float16\",\"v_axis\":\"token\","
                 "\"v_group\":64,\"zero_point\":true}");
    int refused = 0;
    for (size_t at = info.header_bytes; at < len; at += 7) {
        ((uint8_t *)blob->data)[at] ^= 0x10;
        refused += kvs_deserialize(p.deserializer, blob, b, NULL) == KVS_ECORRUPT;
        ((uint8_t *)blob->data)[at] ^= 0x10;
    }
    CHECK_EQ_U64((uint64_t)refused, (len - info.header_bytes + 6) / 7);
    kvs_memobj_free(blob);
    kvs_serde_pair_destroy(&p);
    free(pl);
    st->type->destroy(st);
    kvs_memobj_free(o);
    kvs_memobj_free(b);
}

/* ---------------------------------------------------------------------
 * Workers and clones
 * ------------------------------------------------------------------ */

static void test_split_across_workers(void)
{
    static const char *const cfgs[2] = {
        "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"int\",\"k_outliers\":3}]}",
        "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"int\",\"bits\":3,\"k_axis\":\"token\","
        "\"hadamard\":64,\"zero_point\":false}]}"};
    const int64_t d4[4] = {2, 4, 512, 256};
    kvs_memobj *src = obj(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, 4, d4);
    fill(src, 21, 4.0f);
    for (int c = 0; c < 2; c++) {
        kvs_serde_pair sync, p2;
        REQUIRE_OK(kvs_serde_create_pair(cfgs[c], &sync));
        REQUIRE_OK(kvs_serde_create_pair(cfgs[c], &p2));
        size_t est, len;
        REQUIRE_OK(kvs_estimate_serialized_size(sync.serializer, &src->layout, &est));
        kvs_layout bl;
        REQUIRE_OK(kvs_layout_flat(&bl, est, KVS_DTYPE_UINT8));
        kvs_memobj *want = NULL, *blob = NULL, *back = like(src), *back1 = like(src);
        REQUIRE_OK(kvs_memobj_alloc(&bl, KVS_FMT_BINARY, &want));
        REQUIRE_OK(kvs_memobj_alloc(&bl, KVS_FMT_BINARY, &blob));
        REQUIRE_OK(kvs_serialize(sync.serializer, src, want, NULL, &len));
        kvs_memobj_set_used_size(want, len);
        REQUIRE_OK(kvs_deserialize(sync.deserializer, want, back1, NULL));
        kvs_processor *p = NULL;
        REQUIRE_OK(kvs_async_processor_create(p2.serializer, p2.deserializer, 2, &p));
        REQUIRE_OK(kvs_async_processor_set_split(p, 0, 64 << 10));
        for (int round = 0; round < 3; round++) {
            kvs_task_id id;
            kvs_task_result r;
            REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &blob, 1, NULL, &id));
            REQUIRE(kvs_test_proc_wait(p, 1, id, &r) == KVS_OK);
            CHECK(r.state == KVS_TASK_OK);
            CHECK(blob->used_size == len && memcmp(blob->data, want->data, len) == 0);
            memset(back->data, 0, back->capacity);
            REQUIRE_OK(kvs_processor_submit_deserialize(p, &blob, 1, &back, 1, NULL, &id));
            REQUIRE(kvs_test_proc_wait(p, 0, id, &r) == KVS_OK);
            CHECK(r.state == KVS_TASK_OK);
            CHECK(memcmp(back->data, back1->data, back->capacity) == 0);
        }
        kvs_processor_destroy(p);
        kvs_memobj_free(want);
        kvs_memobj_free(blob);
        kvs_memobj_free(back);
        kvs_memobj_free(back1);
        kvs_serde_pair_destroy(&sync);
    }
    kvs_memobj_free(src);
}

/* kvs_intq_encode_fed on one worker (a small object): the payload fed in
 * order, each byte once, plane by plane (so a check reads each plane
 * while it is in cache) and then the empty rest; the same payload as
 * kvs_intq_encode. 3 layers of K and V: 6 planes; K blocks of 64 of the
 * 130 tokens (the last one short). */
typedef struct feed_log {
    const uint8_t *base;
    size_t next, sizes[16];
    int calls, out_of_order;
} feed_log;

static void log_feed(void *state, const uint8_t *bytes, size_t n)
{
    feed_log *l = state;
    l->out_of_order |= bytes != l->base + l->next;
    if (l->calls < 16) l->sizes[l->calls] = n;
    l->next += n;
    l->calls++;
}

/* int4 KIVI: K per channel, V per token, groups of 64, scale and zero */
static void kivi4_params(kvs_intq_params *p)
{
    memset(p, 0, sizeof *p);
    p->bits = 4;
    p->axis[0] = KVS_INTQ_CHANNEL;
    p->axis[1] = KVS_INTQ_TOKEN;
    p->group[0] = p->group[1] = 64;
    p->zero_point = 1;
    p->scale_dtype = KVS_DTYPE_FLOAT16;
    p->levels = 16;
}

/* A KV_2LTD bfloat16 object [2, layers, tokens, 128] filled from seed,
 * and the payload bound under p. */
static kvs_memobj *fed_object(const kvs_intq_params *p, int64_t layers, int64_t tokens,
                              uint64_t seed, size_t *bound)
{
    const int64_t d4[4] = {2, layers, tokens, 128};
    kvs_memobj *o = obj(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, 4, d4);
    fill(o, seed, 3.0f);
    *bound = 0;
    CHECK_EQ_INT(ref_intq_bound(p, &o->layout, bound), KVS_OK);
    return o;
}

static void test_encode_fed(void)
{
    kvs_intq_params p;
    kivi4_params(&p);
    REQUIRE_OK(ref_intq_check(&p, KVS_EINVAL, "test"));
    size_t bound, n1, n2;
    kvs_memobj *o = fed_object(&p, 3, 130, 5, &bound);
    uint8_t *x = malloc(bound), *y = malloc(bound);
    feed_log log = {x, 0, {0}, 0, 0};
    REQUIRE_OK(kvs_intq_encode_fed(&p, o, x, bound, &n1, log_feed, NULL, &log));
    REQUIRE_OK(kvs_intq_encode(&p, o, y, bound, &n2));
    CHECK(n1 == n2 && memcmp(x, y, n1) == 0);
    CHECK_EQ_U64(log.next, n1);
    CHECK_EQ_INT(log.out_of_order, 0);
    CHECK_EQ_INT(log.calls, 7);
    /* K plane: 3 blocks x 128 channels of float16 scales and zeros, then
     * 130 x 64 bytes of codes; the payload header (4 bytes) with the first.
     * V plane: 130 x 2 groups of scales and zeros, the same codes. */
    const size_t k_plane = 3 * 128 * 2 * 2 + 130 * 64, v_plane = 130 * 2 * 2 * 2 + 130 * 64;
    CHECK_EQ_U64(log.sizes[0], 4 + k_plane);
    CHECK_EQ_U64(log.sizes[1], k_plane);
    CHECK_EQ_U64(log.sizes[2], k_plane);
    CHECK_EQ_U64(log.sizes[3], v_plane);
    CHECK_EQ_U64(log.sizes[5], v_plane);
    CHECK_EQ_U64(log.sizes[6], 0);
    free(x);
    free(y);
    kvs_memobj_free(o);
}

/* kvs_intq_encode_fed with a crc32c combine (what the pipeline's crc32c
 * check gives): each plane's bytes before its codes through feed, then its
 * codes through feed_crc32c by their value, in payload order; that value
 * is the codes' crc32c and the running value the payload's. 2 layers of
 * 1100 tokens: 70 KiB of codes a plane, summed in pieces (32 KiB) as the
 * blocks are written. */
typedef struct crc_log {
    const uint8_t *base;
    size_t next, appended[8];
    uint32_t crc;
    int feeds, appends, bad;
} crc_log;

static void crc_log_feed(void *state, const uint8_t *bytes, size_t n)
{
    crc_log *l = state;
    l->bad |= bytes != l->base + l->next;
    l->crc = kvs_crc32c(l->crc, bytes, n);
    l->next += n;
    l->feeds++;
}

static void crc_log_append(void *state, uint32_t crc, size_t n)
{
    crc_log *l = state;
    l->bad |= crc != kvs_crc32c(0, l->base + l->next, n);
    l->crc = kvs_crc32c_combine(l->crc, crc, n);
    if (l->appends < 8) l->appended[l->appends] = n;
    l->next += n;
    l->appends++;
}

static void test_encode_fed_crc32c(void)
{
    kvs_intq_params p;
    kivi4_params(&p);
    size_t bound, n1, n2;
    kvs_memobj *o = fed_object(&p, 2, 1100, 6, &bound);
    uint8_t *x = malloc(bound), *y = malloc(bound);
    REQUIRE(x && y);
    crc_log log = {x, 0, {0}, 0, 0, 0, 0};
    REQUIRE_OK(kvs_intq_encode_fed(&p, o, x, bound, &n1, crc_log_feed, crc_log_append, &log));
    REQUIRE_OK(ref_intq_encode(&p, o, y, bound, &n2));
    CHECK(n1 == n2 && memcmp(x, y, n1) == 0);
    CHECK_EQ_U64(log.next, n1);
    CHECK_EQ_INT(log.bad, 0);
    CHECK_EQ_U64(log.crc, kvs_crc32c(0, x, n1));
    CHECK_EQ_INT(log.appends, 4);
    CHECK_EQ_INT(log.feeds, 5); /* the bytes before each plane's codes, then the empty rest */
    for (int i = 0; i < 4; i++) CHECK_EQ_U64(log.appended[i], 1100 * 64);
    free(x);
    free(y);
    kvs_memobj_free(o);
}

/* The library's kernels (AVX2 clones on a CPU that has AVX2, the AVX-512
 * kernels on one with AVX-512) and the portable build of the same source: the same payload and the same
 * decoded bytes, over random configurations, dtypes and shapes. */
static void test_clones_match_portable(void)
{
    uint64_t seed = 99;
    int compared = 0;
    for (int round = 0; round < 200; round++) {
        kvs_intq_params p;
        memset(&p, 0, sizeof p);
        p.bits = 2 + (unsigned)(lcg(&seed) % 7);
        p.axis[0] = (unsigned)(lcg(&seed) % 3);
        p.axis[1] = (unsigned)(lcg(&seed) % 3);
        p.group[0] = 1 + (unsigned)(lcg(&seed) % 70);
        p.group[1] = 1 + (unsigned)(lcg(&seed) % 70);
        p.zero_point = (int)(lcg(&seed) % 2);
        p.scale_dtype = lcg(&seed) % 2 ? KVS_DTYPE_FLOAT16 : KVS_DTYPE_FLOAT32;
        p.hadamard = lcg(&seed) % 2 ? 0 : 1u << (1 + lcg(&seed) % 5);
        p.k_outliers = (unsigned)(lcg(&seed) % 4);
        /* all levels or 2 fewer (a valid count either way: the stage
         * checks it before the quantizer runs, and the kernels rely on
         * codes within [-255, 255]) */
        unsigned most = p.zero_point ? 1u << p.bits : (1u << p.bits) - 1;
        p.levels = most > 3 && lcg(&seed) % 2 ? most - 2 : most;
        REQUIRE_OK(ref_intq_check(&p, KVS_EINVAL, "test"));
        static const kvs_dtype dts[3] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16,
                                         KVS_DTYPE_FLOAT32};
        kvs_dtype dt = dts[lcg(&seed) % 3];
        int64_t D = p.hadamard ? (int64_t)p.hadamard * (1 + (int64_t)(lcg(&seed) % 4))
                               : 1 + (int64_t)(lcg(&seed) % 150);
        const int64_t d4[4] = {2, 1 + (int64_t)(lcg(&seed) % 3), 1 + (int64_t)(lcg(&seed) % 90), D};
        kvs_memobj *o = obj(KVS_FMT_KV_2LTD, dt, 4, d4), *a = like(o), *b = like(o);
        fill(o, seed, 1.0f + (float)(lcg(&seed) % 100));
        size_t bound = 0, n1, n2;
        REQUIRE_OK(ref_intq_bound(&p, &o->layout, &bound));
        uint8_t *x = malloc(bound), *y = malloc(bound);
        REQUIRE_OK(kvs_intq_encode(&p, o, x, bound, &n1));
        REQUIRE_OK(ref_intq_encode(&p, o, y, bound, &n2));
        CHECK(n1 == n2 && memcmp(x, y, n1) == 0);
        REQUIRE_OK(kvs_intq_decode(&p, x, n1, a));
        REQUIRE_OK(ref_intq_decode(&p, x, n1, b));
        CHECK(memcmp(a->data, b->data, a->capacity) == 0);
        compared++;
        free(x);
        free(y);
        kvs_memobj_free(o);
        kvs_memobj_free(a);
        kvs_memobj_free(b);
    }
    CHECK_EQ_INT(compared, 200);
}

/* ---------------------------------------------------------------------
 * The real KV cache
 * ------------------------------------------------------------------ */

static void test_kvdata(void)
{
    char dir[1024], why[1200];
    if (kvdata_dir(dir, sizeof dir, why, sizeof why) == NULL) {
        printf("test_kvdata skipped: %s\n", why);
        return;
    }
    float *kv = kvdata_load(dir, 0, 0, why, sizeof why);
    REQUIRE(kv != NULL);
    const int64_t d4[4] = {2, KVDATA_LAYERS, KVDATA_TOKENS, KVDATA_HIDDEN};
    kvs_memobj *o = obj(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, 4, d4), *b = like(o);
    uint64_t n = kvs_layout_numel(&o->layout), plane = KVDATA_TOKENS * KVDATA_HIDDEN;
    for (uint64_t i = 0; i < n; i++) set(o, i, kv[i]);
    /* KIVI int4 (K per channel, V per token, groups of 64, float16 scale and
     * zero) and int8 symmetric per token: within the bound on every plane */
    static const struct {
        const char *cfg;
        unsigned bits, ka, va;
        int zp;
        double min_snr;
    } cfgs[] = {
        {"{\"type\":\"int\",\"bits\":4}", 4, KVS_INTQ_CHANNEL, KVS_INTQ_TOKEN, 1, 20.0},
        {"{\"type\":\"int\",\"bits\":8,\"k_axis\":\"token\",\"zero_point\":false}", 8,
         KVS_INTQ_TOKEN, KVS_INTQ_TOKEN, 0, 42.0},
        {"{\"type\":\"int\",\"bits\":2,\"group\":32}", 2, KVS_INTQ_CHANNEL, KVS_INTQ_TOKEN, 1,
         5.0},
    };
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        kvs_stage *st = make_stage(cfgs[c].cfg);
        size_t len;
        uint8_t *pl = encode(st, o, &len);
        REQUIRE(pl != NULL);
        CHECK_OK(decode(st, pl, len, b));
        unsigned G = cfgs[c].bits == 2 ? 32 : 64;
        double sig = 0, noise = 0;
        for (uint64_t i = 0; i < n; i++) {
            double x = get(o, i), y = get(b, i);
            sig += x * x;
            noise += (x - y) * (x - y);
        }
        double worst = -INFINITY;
        for (uint64_t pi = 0; pi < 2 * KVDATA_LAYERS; pi++)
            worst = fmax(worst, plane_excess(o, b, pi * plane, KVDATA_HIDDEN, KVDATA_TOKENS,
                                             KVDATA_HIDDEN,
                                             pi < KVDATA_LAYERS ? cfgs[c].ka : cfgs[c].va, G,
                                             cfgs[c].bits, cfgs[c].zp, 1));
        CHECK(worst <= 0);
        double snr = 10 * log10(sig / noise);
        if (snr < cfgs[c].min_snr) fprintf(stderr, "%s: SNR %.2f dB\n", cfgs[c].cfg, snr);
        CHECK(snr >= cfgs[c].min_snr);
        free(pl);
        st->type->destroy(st);
    }
    free(kv);
    kvs_memobj_free(o);
    kvs_memobj_free(b);
}

int main(void)
{
    RUN(test_hand_computed);
    RUN(test_signed_zero_minimum);
    RUN(test_subnormal_scale);
    RUN(test_kv_planes);
    RUN(test_bound_synthetic);
    RUN(test_hadamard_and_outliers);
    RUN(test_config_refused);
    RUN(test_frame_params_refused);
    RUN(test_damaged_payloads);
    RUN(test_split_across_workers);
    RUN(test_encode_fed);
    RUN(test_encode_fed_crc32c);
    RUN(test_clones_match_portable);
    RUN(test_kvdata);
    return TEST_SUMMARY();
}
