/* test_multi_wrapper.c - the serde wrapper in the multi shape (l2.h:
 * kvs_serde_wrapper_create_multi, kvs_l2_submit_store_groups / _load_groups)
 * with the kv_split serde, end to end through the memory, fs and Redis
 * adapters (a redis-server this test starts on loopback, kvs_test_redis.h):
 *
 *   - whole KV chunks of every KV format (KV_2LTD, KV_2TD, KV_T2D) and
 *     dtype, in both modes: K native bit-exact, V within fp8's bound, the
 *     stored objects exactly the blobs, K16/V8 0.75x and V-only 0.25x of
 *     the raw payload measured on the stored objects, and in v_only the K
 *     half of each load target (interleaved rows for T2D) untouched;
 *   - the split tier with groups: V-only store, then V-only load into a
 *     group whose K slot is NULL, a canary in K's memory;
 *   - refusals at submit with nothing queued: a required slot NULL, a
 *     forbidden slot present, formats without K/V halves, mixed layouts and
 *     absence patterns, groups on adapters without a multi serde;
 *   - the pool (all or nothing), per-key load failures, close with group
 *     tasks in flight.
 */
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/half.h"
#include "kvs_test.h"
#include "kvs_test_l2.h"
#include "kvs_test_redis.h"
#include "kvserde/l2.h"
#include "kvserde/l2_memory.h"
#include "kvserde/memobj.h"
#include "kvserde/multi.h"
#include "kvserde/multi_processor.h"
#include "kvserde/registry.h"

#define CANARY 0xA5
#define LAYERS 3
#define TOKENS 16
#define HIDDEN 64

static int redis_port; /* 0: no server */
static char fs_root[128];

/* ---------------------------------------------------------------------
 * Objects
 * ------------------------------------------------------------------ */

static uint64_t rng(uint64_t *s)
{
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

static float rnd(uint64_t *s) /* about N(0, 1) */
{
    float a = 0;
    for (int i = 0; i < 4; i++) a += (float)(rng(s) % 65536) / 65536.0f;
    return (a - 2.0f) * 1.7320508f;
}

static void put(void *d, kvs_dtype dt, size_t i, float v)
{
    if (dt == KVS_DTYPE_FLOAT32) ((float *)d)[i] = v;
    else if (dt == KVS_DTYPE_FLOAT16) ((uint16_t *)d)[i] = kvs_f32_to_f16(v);
    else ((uint16_t *)d)[i] = kvs_f32_to_bf16(v);
}

static float get(const void *d, kvs_dtype dt, size_t i)
{
    if (dt == KVS_DTYPE_FLOAT32) return ((const float *)d)[i];
    if (dt == KVS_DTYPE_FLOAT16) return kvs_f16_to_f32(((const uint16_t *)d)[i]);
    return kvs_bf16_to_f32(((const uint16_t *)d)[i]);
}

/* A one-group object of `fmt`, every byte `fill`. */
static kvs_memobj *obj(kvs_memory_format fmt, kvs_dtype dt, uint32_t nd, const int64_t *dims,
                       uint8_t fill)
{
    kvs_layout l = {0};
    kvs_memobj *o = NULL;
    if (kvs_layout_add_group(&l, nd, dims, dt) != KVS_OK ||
        kvs_memobj_alloc(&l, fmt, &o) != KVS_OK)
        abort();
    memset(o->data, fill, o->capacity);
    return o;
}

/* A whole KV chunk of `fmt`: 2LTD [2, L, T, D], 2TD [2, T, D], T2D [T, 2, D]. */
static kvs_memobj *chunk(kvs_memory_format fmt, kvs_dtype dt, uint8_t fill)
{
    int64_t d4[4] = {2, LAYERS, TOKENS, HIDDEN}, d2td[3] = {2, TOKENS, HIDDEN},
            dt2d[3] = {TOKENS, 2, HIDDEN};
    if (fmt == KVS_FMT_KV_2LTD) return obj(fmt, dt, 4, d4, fill);
    return obj(fmt, dt, 3, fmt == KVS_FMT_KV_2TD ? d2td : dt2d, fill);
}

/* Element e of the K (half 0) or V (half 1) tensor of a chunk: its index
 * in the chunk's elements. */
static size_t half_index(const kvs_memobj *c, int half, size_t e)
{
    size_t n = (size_t)kvs_layout_numel(&c->layout) / 2;
    if (c->format != KVS_FMT_KV_T2D) return (size_t)half * n + e;
    return (e / HIDDEN) * 2 * HIDDEN + (size_t)half * HIDDEN + e % HIDDEN;
}

/* K: channels with outliers; V: N(0, 0.5). */
static void fill_kv(kvs_memobj *c, uint64_t seed)
{
    kvs_dtype dt = c->layout.groups[0].dtype;
    size_t n = (size_t)kvs_layout_numel(&c->layout) / 2;
    uint64_t s = seed * 2654435761u + 1;
    for (size_t e = 0; e < n; e++) {
        float k = rnd(&s) * (e % HIDDEN == 5 ? 12.0f : 1.0f);
        put(c->data, c->layout.groups[0].dtype, half_index(c, 0, e), k);
        put(c->data, dt, half_index(c, 1, e), 0.5f * rnd(&s));
    }
}

/* The bytes of element e of a half. */
static const uint8_t *half_bytes(const kvs_memobj *c, int half, size_t e)
{
    size_t es = kvs_dtype_size(c->layout.groups[0].dtype);
    return (const uint8_t *)c->data + half_index(c, half, e) * es;
}

/* K of `back` bit-equal to `orig`'s (exact = 1), or every K byte CANARY. */
static int k_check(const kvs_memobj *orig, const kvs_memobj *back, int exact)
{
    size_t n = (size_t)kvs_layout_numel(&orig->layout) / 2;
    size_t es = kvs_dtype_size(orig->layout.groups[0].dtype);
    for (size_t e = 0; e < n; e++) {
        const uint8_t *b = half_bytes(back, 0, e);
        if (exact && memcmp(b, half_bytes(orig, 0, e), es) != 0) return 0;
        for (size_t j = 0; !exact && j < es; j++)
            if (b[j] != CANARY) return 0;
    }
    return 1;
}

/* V of `back` within the fp8 e4m3 bound of multi.h: 2^-4 |x| plus half the
 * smallest subnormal (2^-10) times the scale, plus the destination's
 * rounding (2^-8 |y| for bfloat16). */
static int v_check(const kvs_memobj *orig, const kvs_memobj *back)
{
    kvs_dtype dt = orig->layout.groups[0].dtype;
    size_t n = (size_t)kvs_layout_numel(&orig->layout) / 2;
    float amax = 0;
    for (size_t e = 0; e < n; e++) amax = fmaxf(amax, fabsf(get(orig->data, dt, half_index(orig, 1, e))));
    double scale = amax / 448.0;
    for (size_t e = 0; e < n; e++) {
        double x = get(orig->data, dt, half_index(orig, 1, e));
        double y = get(back->data, dt, half_index(back, 1, e));
        if (fabs(y - x) > fabs(x) / 16 + scale / 1024 + fabs(y) / 256 + 1e-30) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------------
 * Waiting
 * ------------------------------------------------------------------ */

/* The store task's result (0), or -1 if it never came. */
static int store_done(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_store_result *res)
{
    return store_result(a, id, res) == KVS_OK ? 0 : -1;
}

static int load_done(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    return bitmap_result(a, 1, id, out) == KVS_OK ? 0 : -1;
}

/* 1 if the fd has nothing to read right now. */
static int fd_quiet(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    return poll(&p, 1, 0) == 0;
}

/* ---------------------------------------------------------------------
 * Adapters
 * ------------------------------------------------------------------ */

enum backend { MEMORY, FS, REDIS };
static const char *const backend_names[] = {"memory", "fs", "redis"};

/* An adapter of `b` with `serde` (JSON), or NULL with a message. */
static kvs_l2_adapter *open_adapter(enum backend b, const char *serde, const char *extra)
{
    static int seq;
    char spec[1024];
    switch (b) {
    case MEMORY:
        snprintf(spec, sizeof spec, "{\"type\": \"memory\", \"serde\": %s%s}", serde, extra);
        break;
    case FS:
        snprintf(spec, sizeof spec, "{\"type\": \"fs\", \"path\": \"%s/%d\", \"serde\": %s%s}",
                 fs_root, seq++, serde, extra);
        break;
    default:
        snprintf(spec, sizeof spec,
                 "{\"type\": \"redis\", \"url\": \"redis://127.0.0.1:%d\", \"serde\": "
                 "%s%s}",
                 redis_port, serde, extra);
        break;
    }
    kvs_l2_adapter *a = NULL;
    if (kvs_l2_create(spec, &a) != KVS_OK) {
        fprintf(stderr, "kvs_l2_create(%s): %s\n", spec, kvs_last_error());
        return NULL;
    }
    return a;
}

static kvs_object_key key_of(unsigned i, const char *model)
{
    kvs_object_key k;
    uint8_t h[4] = {(uint8_t)i, (uint8_t)(i >> 8), 0x4B, 0x56};
    if (kvs_object_key_init(&k, h, sizeof h, model, 0, 0, NULL) != KVS_OK) abort();
    return k;
}

/* The exact kv_split blob size of one chunk's halves (the serde's estimate). */
static size_t blob_size(const kvs_memobj *c, int v_only)
{
    kvs_kv_split_options o;
    kvs_kv_split_options_init(&o);
    o.mode = v_only ? KVS_KV_SPLIT_MODE_V_ONLY : KVS_KV_SPLIT_MODE_KV;
    kvs_multi_serializer *s = NULL;
    if (kvs_kv_split_serde_create(&o, &s, NULL) != KVS_OK) abort();
    kvs_layout half = {0};
    const kvs_shape *sh = &c->layout.groups[0].shape;
    int64_t dims[3];
    uint32_t nd = sh->ndim - 1;
    if (c->format == KVS_FMT_KV_T2D) dims[0] = sh->dims[0], dims[1] = sh->dims[2];
    else memcpy(dims, sh->dims + 1, nd * sizeof *dims);
    kvs_layout_add_group(&half, nd, dims, c->layout.groups[0].dtype);
    const kvs_layout *ls[2] = {v_only ? NULL : &half, &half};
    size_t n = 0;
    if (kvs_multi_estimate_serialized_size(s, ls, 2, &n) != KVS_OK) abort();
    kvs_multi_serializer_destroy(s);
    return n;
}

/* ---------------------------------------------------------------------
 * Whole KV chunks, every format, dtype, mode and backend
 * ------------------------------------------------------------------ */

static void chunks_round_trip(enum backend b)
{
    static const kvs_memory_format fmts[] = {KVS_FMT_KV_2LTD, KVS_FMT_KV_2TD, KVS_FMT_KV_T2D};
    static const char *const fmt_names[] = {"KV_2LTD", "KV_2TD", "KV_T2D"};
    static const kvs_dtype dts[] = {KVS_DTYPE_FLOAT16, KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT32};
    unsigned next_key = 0;
    for (int v_only = 0; v_only < 2; v_only++) {
        kvs_l2_adapter *a = open_adapter(
            b, v_only ? "{\"type\": \"kv_split\", \"mode\": \"v_only\"}" : "{\"type\": \"kv_split\"}",
            "");
        REQUIRE(a != NULL);
        for (size_t f = 0; f < 3; f++) {
            for (size_t d = 0; d < 3; d++) {
                kvs_memobj *orig[2], *back[2];
                kvs_object_key keys[2];
                for (int i = 0; i < 2; i++) {
                    orig[i] = chunk(fmts[f], dts[d], 0);
                    fill_kv(orig[i], next_key + 1);
                    back[i] = chunk(fmts[f], dts[d], CANARY);
                    keys[i] = key_of(next_key++, "test/multi-wrapper");
                }
                kvs_l2_task_id id;
                kvs_l2_store_result res;
                CHECK_OK(kvs_l2_submit_store(a, keys, orig, 2, &id));
                REQUIRE(store_done(a, id, &res) == 0);
                CHECK_EQ_INT(res.state, KVS_TASK_OK);
                size_t blob = blob_size(orig[0], v_only);
                /* stored bytes = the blob sizes */
                CHECK_EQ_U64(res.bytes_written, 2 * blob);
                int64_t sizes[2] = {0, 0};
                CHECK_OK(kvs_l2_object_sizes(a, keys, 2, sizes));
                CHECK_EQ_INT(sizes[0], (int64_t)blob);
                CHECK_EQ_INT(sizes[1], (int64_t)blob);
                /* the asym sizes, on the stored objects: K16/V8 0.75x of
                 * fp16 K+V, V-only 0.25x (plus the 84 bytes of a blob) */
                uint64_t raw = kvs_layout_nbytes(&orig[0]->layout);
                if (kvs_dtype_size(dts[d]) == 2)
                    CHECK_EQ_U64((uint64_t)(sizes[0] - 84) * 4, raw * (v_only ? 1 : 3));
                kvs_l2_bitmap bm;
                CHECK_OK(kvs_l2_submit_load(a, keys, back, 2, &id));
                REQUIRE(load_done(a, id, &bm) == 0);
                CHECK_EQ_INT(bm.nhits, 2);
                for (int i = 0; i < 2; i++) {
                    int k_ok = k_check(orig[i], back[i], !v_only);
                    int v_ok = v_check(orig[i], back[i]);
                    if (!k_ok || !v_ok)
                        fprintf(stderr, "  %s %s %s %s: K %s, V %s\n", backend_names[b],
                                fmt_names[f], kvs_dtype_name(dts[d]), v_only ? "v_only" : "kv",
                                k_ok ? "ok" : "WRONG", v_ok ? "ok" : "WRONG");
                    CHECK(k_ok && v_ok);
                    /* the caller's objects keep their layout's size */
                    CHECK_EQ_U64(kvs_memobj_size(back[i]), raw);
                }
                kvs_l2_bitmap_release(&bm);
                for (int i = 0; i < 2; i++) {
                    kvs_memobj_free(orig[i]);
                    kvs_memobj_free(back[i]);
                }
            }
        }
        json_t *st = NULL;
        CHECK_OK(kvs_l2_status(a, &st));
        CHECK(json_is_true(json_object_get(st, "serde_wrapped")));
        CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(st, "serde_temp_pool"),
                                                        "in_use_bytes")),
                     0);
        json_decref(st);
        kvs_l2_destroy(a);
    }
}

static void test_chunks_memory(void) { chunks_round_trip(MEMORY); }
static void test_chunks_fs(void) { chunks_round_trip(FS); }
static void test_chunks_redis(void) { chunks_round_trip(REDIS); }

/* ---------------------------------------------------------------------
 * The split tier with groups
 * ------------------------------------------------------------------ */

/* A [L, T, D] view of half `h` of a 2LTD chunk (no copy). */
static kvs_memobj half_view(kvs_memobj *c, int h)
{
    kvs_layout l = {0};
    int64_t dims[3] = {LAYERS, TOKENS, HIDDEN};
    kvs_layout_add_group(&l, 3, dims, c->layout.groups[0].dtype);
    size_t hb = (size_t)kvs_layout_nbytes(&l);
    kvs_memobj v;
    if (kvs_memobj_init(&v, (uint8_t *)c->data + (size_t)h * hb, hb, &l, KVS_FMT_UNDEFINED))
        abort();
    return v;
}

static void split_tier(enum backend b)
{
    kvs_l2_adapter *a = open_adapter(b, "{\"type\": \"kv_split\", \"mode\": \"v_only\"}", "");
    REQUIRE(a != NULL);
    enum { N = 3 };
    kvs_memobj *orig[N], *back[N], vin[N], vout[N];
    kvs_memobj *store_groups[2 * N], *load_groups[2 * N];
    kvs_object_key keys[N];
    for (int i = 0; i < N; i++) {
        orig[i] = chunk(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, 0);
        fill_kv(orig[i], 100 + (uint64_t)i);
        back[i] = chunk(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, CANARY); /* K's memory: a canary */
        vin[i] = half_view(orig[i], 1);
        vout[i] = half_view(back[i], 1);
        store_groups[2 * i] = NULL, store_groups[2 * i + 1] = &vin[i];
        load_groups[2 * i] = NULL, load_groups[2 * i + 1] = &vout[i];
        keys[i] = key_of(1000 + (unsigned)i, "test/split-tier");
    }
    kvs_l2_task_id id;
    kvs_l2_store_result res;
    CHECK_OK(kvs_l2_submit_store_groups(a, keys, store_groups, N, 2, &id));
    REQUIRE(store_done(a, id, &res) == 0);
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    size_t blob = blob_size(orig[0], 1);
    CHECK_EQ_U64(res.bytes_written, N * blob);
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_submit_load_groups(a, keys, load_groups, N, 2, &id));
    REQUIRE(load_done(a, id, &bm) == 0);
    CHECK_EQ_INT(bm.nhits, N);
    kvs_l2_bitmap_release(&bm);
    for (int i = 0; i < N; i++) {
        CHECK(k_check(orig[i], back[i], 0)); /* K never touched */
        CHECK(v_check(orig[i], back[i]));
    }

    /* The same blobs load as whole chunks (K half left alone) too. */
    kvs_memobj *whole = chunk(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, CANARY);
    CHECK_OK(kvs_l2_submit_load(a, &keys[1], &whole, 1, &id));
    REQUIRE(load_done(a, id, &bm) == 0);
    CHECK_EQ_INT(bm.nhits, 1);
    kvs_l2_bitmap_release(&bm);
    CHECK(k_check(orig[1], whole, 0) && v_check(orig[1], whole));
    kvs_memobj_free(whole);

    for (int i = 0; i < N; i++) {
        kvs_memobj_free(orig[i]);
        kvs_memobj_free(back[i]);
    }
    kvs_l2_destroy(a);
}

static void test_split_tier_memory(void) { split_tier(MEMORY); }
static void test_split_tier_fs(void) { split_tier(FS); }
static void test_split_tier_redis(void) { split_tier(REDIS); }

/* K/V groups in mode kv: K and V stored, both loaded (groups of separate
 * tensors, not views). */
static void test_kv_groups(void)
{
    kvs_l2_adapter *a = open_adapter(MEMORY, "{\"type\": \"kv_split\"}", "");
    REQUIRE(a != NULL);
    kvs_memobj *c = chunk(KVS_FMT_KV_2LTD, KVS_DTYPE_FLOAT16, 0);
    fill_kv(c, 7);
    kvs_memobj *back = chunk(KVS_FMT_KV_2LTD, KVS_DTYPE_FLOAT16, CANARY);
    kvs_memobj k = half_view(c, 0), v = half_view(c, 1);
    kvs_memobj kb = half_view(back, 0), vb = half_view(back, 1);
    kvs_memobj *g[2] = {&k, &v}, *gb[2] = {&kb, &vb};
    kvs_object_key key = key_of(7, "test/kv-groups");
    kvs_l2_task_id id;
    kvs_l2_store_result res;
    CHECK_OK(kvs_l2_submit_store_groups(a, &key, g, 1, 2, &id));
    REQUIRE(store_done(a, id, &res) == 0);
    CHECK_EQ_U64(res.bytes_written, blob_size(c, 0));
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_submit_load_groups(a, &key, gb, 1, 2, &id));
    REQUIRE(load_done(a, id, &bm) == 0);
    CHECK_EQ_INT(bm.nhits, 1);
    kvs_l2_bitmap_release(&bm);
    CHECK(k_check(c, back, 1) && v_check(c, back));
    kvs_memobj_free(c);
    kvs_memobj_free(back);
    kvs_l2_destroy(a);
}

/* ---------------------------------------------------------------------
 * Refusals at submit, nothing queued
 * ------------------------------------------------------------------ */

/* Nothing was queued on `a`: no signal, no result, nothing stored, and the
 * next task still gets id `next`. */
static void nothing_queued(kvs_l2_adapter *a, kvs_l2_task_id next)
{
    CHECK(fd_quiet(kvs_l2_store_event_fd(a)));
    CHECK(fd_quiet(kvs_l2_load_event_fd(a)));
    kvs_l2_store_result r[4];
    size_t count = 9;
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, 4, &count));
    CHECK_EQ_INT(count, 0);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 0);
    kvs_l2_task_id id = 99;
    CHECK_OK(kvs_l2_submit_store(a, NULL, NULL, 0, &id)); /* an empty task: the next id */
    CHECK_EQ_U64(id, next);
    REQUIRE(store_done(a, id, &r[0]) == 0);
}

static void test_required_slot_refused(void)
{
    kvs_l2_adapter *a = open_adapter(MEMORY, "{\"type\": \"kv_split\"}", "");
    REQUIRE(a != NULL);
    kvs_memobj *c = chunk(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, 0);
    kvs_memobj k = half_view(c, 0), v = half_view(c, 1);
    kvs_object_key keys[2] = {key_of(1, "m"), key_of(2, "m")};
    kvs_memobj *no_k[4] = {&k, &v, NULL, &v};
    kvs_l2_task_id id = 77;
    /* group 1 lacks K while group 0 has it: one absence pattern a batch */
    CHECK_ERR(kvs_l2_submit_store_groups(a, keys, no_k, 2, 2, &id), KVS_EINVAL,
              "serde wrapper: group 1 slot 0 is absent but group 0's is present; a batch "
              "shares one absence pattern");
    kvs_memobj *both_no_k[4] = {NULL, &v, NULL, &v};
    CHECK_ERR(kvs_l2_submit_store_groups(a, keys, both_no_k, 2, 2, &id), KVS_EINVAL,
              "serde wrapper: kv_split: K (slot 0) is required in mode 'kv' but the layout "
              "slot is absent");
    kvs_memobj *no_v[2] = {&k, NULL};
    CHECK_ERR(kvs_l2_submit_load_groups(a, keys, no_v, 1, 2, &id), KVS_EINVAL,
              "serde wrapper: kv_split: V (slot 1) is required in mode 'kv' but the layout "
              "slot is absent");
    CHECK_EQ_U64(id, 77);
    nothing_queued(a, 0);
    kvs_l2_destroy(a);

    a = open_adapter(MEMORY, "{\"type\": \"kv_split\", \"mode\": \"v_only\"}", "");
    REQUIRE(a != NULL);
    kvs_memobj *with_k[2] = {&k, &v};
    CHECK_ERR(kvs_l2_submit_store_groups(a, keys, with_k, 1, 2, &id), KVS_EINVAL,
              "serde wrapper: kv_split: K (slot 0) must be absent in mode 'v_only' but the "
              "layout slot is present");
    nothing_queued(a, 0);
    kvs_l2_destroy(a);
    kvs_memobj_free(c);
}

static void test_formats_without_kv_refused(void)
{
    kvs_l2_adapter *a = open_adapter(MEMORY, "{\"type\": \"kv_split\"}", "");
    REQUIRE(a != NULL);
    kvs_object_key key = key_of(3, "m");
    kvs_l2_task_id id;
    int64_t mla[4] = {1, LAYERS, TOKENS, HIDDEN}, td[2] = {TOKENS, HIDDEN}, flat[1] = {4096};
    kvs_memobj *o = obj(KVS_FMT_KV_MLA_FMT, KVS_DTYPE_BFLOAT16, 4, mla, 0);
    CHECK_ERR(kvs_l2_submit_store(a, &key, &o, 1, &id), KVS_EINVAL,
              "serde wrapper: object 0 has format KV_MLA_FMT (MLA: one latent, no separate K "
              "and V), which has no K/V halves; serde 'kv_split' takes K and V (KV_2LTD, "
              "KV_2TD or KV_T2D chunks)");
    CHECK_ERR(kvs_l2_submit_load(a, &key, &o, 1, &id), KVS_EINVAL,
              "serde wrapper: object 0 has format KV_MLA_FMT (MLA: one latent, no separate K "
              "and V), which has no K/V halves; serde 'kv_split' takes K and V (KV_2LTD, "
              "KV_2TD or KV_T2D chunks)");
    kvs_memobj_free(o);
    o = obj(KVS_FMT_HS_TD, KVS_DTYPE_BFLOAT16, 2, td, 0);
    CHECK_ERR(kvs_l2_submit_store(a, &key, &o, 1, &id), KVS_EINVAL,
              "serde wrapper: object 0 has format HS_TD (not a KV cache), which has no K/V "
              "halves; serde 'kv_split' takes K and V (KV_2LTD, KV_2TD or KV_T2D chunks)");
    kvs_memobj_free(o);
    o = obj(KVS_FMT_BINARY_BUFFER, KVS_DTYPE_UINT8, 1, flat, 0);
    CHECK_ERR(kvs_l2_submit_store(a, &key, &o, 1, &id), KVS_EINVAL,
              "serde wrapper: object 0 has format BINARY_BUFFER (bytes), which has no K/V "
              "halves; serde 'kv_split' takes K and V (KV_2LTD, KV_2TD or KV_T2D chunks)");
    kvs_memobj_free(o);
    int64_t bad[4] = {3, LAYERS, TOKENS, HIDDEN};
    o = obj(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, 4, bad, 0);
    CHECK_ERR(kvs_l2_submit_store(a, &key, &o, 1, &id), KVS_EINVAL,
              "serde wrapper: object 0 of format KV_2LTD has layout [3x3x16x64 bfloat16], "
              "which is not [2, layers, tokens, hidden]");
    kvs_memobj_free(o);
    /* mixed layouts, as the single shape */
    kvs_memobj *c2[2] = {chunk(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, 0),
                         chunk(KVS_FMT_KV_2TD, KVS_DTYPE_BFLOAT16, 0)};
    kvs_object_key keys[2] = {key_of(4, "m"), key_of(5, "m")};
    CHECK_ERR(kvs_l2_submit_store(a, keys, c2, 2, &id), KVS_EINVAL,
              "serde wrapper: object 1 has layout [2x16x64 bfloat16] but object 0 has "
              "[2x3x16x64 bfloat16]");
    kvs_memobj k0 = half_view(c2[0], 0), v0 = half_view(c2[0], 1);
    int64_t small[3] = {LAYERS, TOKENS / 2, HIDDEN};
    kvs_memobj *vs = obj(KVS_FMT_UNDEFINED, KVS_DTYPE_BFLOAT16, 3, small, 0);
    kvs_memobj *g[4] = {&k0, &v0, &k0, vs};
    CHECK_ERR(kvs_l2_submit_store_groups(a, keys, g, 2, 2, &id), KVS_EINVAL,
              "serde wrapper: group 1 slot 1 has layout [3x8x64 bfloat16] but group 0's has "
              "[3x16x64 bfloat16]");
    CHECK_ERR(kvs_l2_submit_store_groups(a, keys, g, 1, 3, &id), KVS_EINVAL,
              "serde wrapper: groups of 3 slots, but serde 'kv_split' takes groups of 2");
    CHECK_ERR(kvs_l2_submit_store_groups(a, keys, NULL, 1, 2, &id), KVS_EINVAL,
              "l2: group array is NULL with 1 groups");
    nothing_queued(a, 0);
    kvs_memobj_free(vs);
    kvs_memobj_free(c2[0]);
    kvs_memobj_free(c2[1]);
    kvs_l2_destroy(a);
}

static void test_groups_need_a_multi_serde(void)
{
    kvs_l2_adapter *a = NULL;
    REQUIRE_OK(kvs_memory_adapter_create(NULL, &a));
    kvs_memobj *c = chunk(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, 0);
    kvs_memobj k = half_view(c, 0), v = half_view(c, 1);
    kvs_memobj *g[2] = {&k, &v};
    kvs_object_key key = key_of(1, "m");
    kvs_l2_task_id id;
    CHECK_ERR(kvs_l2_submit_store_groups(a, &key, g, 1, 2, &id), KVS_EINVAL,
              "l2: adapter 'memory' takes whole objects, not groups: groups need an adapter "
              "whose \"serde\" is multi-output");
    kvs_l2_destroy(a);
    a = open_adapter(MEMORY, "{\"type\": \"fp8\"}", "");
    REQUIRE(a != NULL);
    CHECK_ERR(kvs_l2_submit_load_groups(a, &key, g, 1, 2, &id), KVS_EINVAL,
              "serde wrapper: serde 'fp8' is single-output (one tensor per blob); groups need "
              "a multi-output serde such as kv_split");
    kvs_l2_destroy(a);
    kvs_memobj_free(c);
    /* and the registry no longer names a C function to a person */
    CHECK_ERR(kvs_serde_create("{\"type\": \"kv_split\"}", &(kvs_processor *){NULL}),
              KVS_EINVAL,
              "serde type 'kv_split' is multi-output (a group of tensors per blob, such as K "
              "and V); create it with the multi-output API");
}

/* ---------------------------------------------------------------------
 * Pool, per-key failures, close
 * ------------------------------------------------------------------ */

static void test_pool_all_or_nothing(void)
{
    kvs_memobj *c[3];
    for (int i = 0; i < 3; i++) c[i] = chunk(KVS_FMT_KV_2TD, KVS_DTYPE_BFLOAT16, 0);
    size_t blob = blob_size(c[0], 0);
    char extra[64];
    snprintf(extra, sizeof extra, ", \"serde_pool_bytes\": %zu", 2 * blob + blob / 2);
    kvs_l2_adapter *a = open_adapter(MEMORY, "{\"type\": \"kv_split\"}", extra);
    REQUIRE(a != NULL);
    kvs_object_key keys[3] = {key_of(1, "m"), key_of(2, "m"), key_of(3, "m")};
    kvs_l2_task_id id;
    kvs_l2_store_result res;
    CHECK_OK(kvs_l2_submit_store(a, keys, c, 3, &id));
    REQUIRE(store_done(a, id, &res) == 0);
    CHECK_EQ_INT(res.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(res.status, KVS_ENOMEM);
    char msg[200];
    snprintf(msg, sizeof msg, "serde wrapper: temp pool exhausted: need %zu bytes for 3 temps",
             3 * blob);
    CHECK(strncmp(res.message, msg, strlen(msg)) == 0);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 0);
    CHECK_OK(kvs_l2_submit_store(a, keys, c, 2, &id)); /* two fit */
    REQUIRE(store_done(a, id, &res) == 0);
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 2 * blob);
    for (int i = 0; i < 3; i++) kvs_memobj_free(c[i]);
    kvs_l2_destroy(a);
}

/* A damaged blob on disk fails only its own key. */
static void test_one_damaged_blob(void)
{
    char dir[200];
    snprintf(dir, sizeof dir, "%s/damaged", fs_root);
    char spec[400];
    snprintf(spec, sizeof spec,
             "{\"type\": \"fs\", \"path\": \"%s\", \"serde\": {\"type\": \"kv_split\"}}", dir);
    kvs_l2_adapter *a = NULL;
    REQUIRE_OK(kvs_l2_create(spec, &a));
    kvs_memobj *c[3], *back[3];
    kvs_object_key keys[3];
    for (int i = 0; i < 3; i++) {
        c[i] = chunk(KVS_FMT_KV_T2D, KVS_DTYPE_FLOAT16, 0);
        fill_kv(c[i], 40 + (uint64_t)i);
        back[i] = chunk(KVS_FMT_KV_T2D, KVS_DTYPE_FLOAT16, CANARY);
        keys[i] = key_of(40 + (unsigned)i, "test/damaged");
    }
    kvs_l2_task_id id;
    kvs_l2_store_result res;
    CHECK_OK(kvs_l2_submit_store(a, keys, c, 3, &id));
    REQUIRE(store_done(a, id, &res) == 0);
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    /* damage key 1's blob through a raw fs adapter on the same directory */
    kvs_l2_adapter *raw = NULL;
    snprintf(spec, sizeof spec, "{\"type\": \"fs\", \"path\": \"%s\"}", dir);
    REQUIRE_OK(kvs_l2_create(spec, &raw));
    size_t blob = blob_size(c[0], 0);
    int64_t bdims[1] = {(int64_t)blob};
    kvs_memobj *bytes = obj(KVS_FMT_BINARY_BUFFER, KVS_DTYPE_UINT8, 1, bdims, 0);
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_submit_load(raw, &keys[1], &bytes, 1, &id));
    REQUIRE(load_done(raw, id, &bm) == 0);
    CHECK_EQ_INT(bm.nhits, 1);
    kvs_l2_bitmap_release(&bm);
    ((uint8_t *)bytes->data)[100] ^= 0x40;
    CHECK_OK(kvs_l2_submit_store(raw, &keys[1], &bytes, 1, &id));
    REQUIRE(store_done(raw, id, &res) == 0);
    kvs_l2_destroy(raw);
    kvs_memobj_free(bytes);

    CHECK_OK(kvs_l2_submit_load(a, keys, back, 3, &id));
    REQUIRE(load_done(a, id, &bm) == 0);
    CHECK_EQ_INT(bm.nhits, 2);
    CHECK(bm.hits[0] == 1 && bm.hits[1] == 0 && bm.hits[2] == 1);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK(strstr(bm.message, "serde wrapper: load of key 1: ") == bm.message);
    CHECK(strstr(bm.message, "kv_split: checksum mismatch") != NULL);
    kvs_l2_bitmap_release(&bm);
    CHECK(k_check(c[0], back[0], 1) && v_check(c[0], back[0]));
    CHECK(k_check(c[2], back[2], 1) && v_check(c[2], back[2]));
    for (int i = 0; i < 3; i++) {
        kvs_memobj_free(c[i]);
        kvs_memobj_free(back[i]);
    }
    kvs_l2_destroy(a);
}

static void test_close_with_group_tasks_in_flight(void)
{
    kvs_l2_adapter *a =
        open_adapter(MEMORY, "{\"type\": \"kv_split\", \"mode\": \"v_only\", \"max_workers\": 2}", "");
    REQUIRE(a != NULL);
    enum { TASKS = 8 };
    kvs_memobj *c[TASKS], v[TASKS], *g[2 * TASKS];
    kvs_object_key keys[TASKS];
    kvs_l2_task_id ids[TASKS];
    for (int i = 0; i < TASKS; i++) {
        c[i] = chunk(KVS_FMT_KV_2LTD, KVS_DTYPE_BFLOAT16, 0);
        fill_kv(c[i], (uint64_t)i);
        v[i] = half_view(c[i], 1);
        g[2 * i] = NULL, g[2 * i + 1] = &v[i];
        keys[i] = key_of(200 + (unsigned)i, "test/close");
        CHECK_OK(kvs_l2_submit_store_groups(a, &keys[i], &g[2 * i], 1, 2, &ids[i]));
    }
    CHECK_OK(kvs_l2_close(a));
    /* every task ran to its end and can be read */
    kvs_l2_store_result r[TASKS];
    size_t count = 0;
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, TASKS, &count));
    CHECK_EQ_INT(count, TASKS);
    for (size_t i = 0; i < count; i++) CHECK_EQ_INT(r[i].state, KVS_TASK_OK);
    kvs_l2_task_id id;
    CHECK_EQ_INT(kvs_l2_submit_store_groups(a, keys, g, 1, 2, &id), KVS_ECLOSED);
    CHECK_EQ_INT(kvs_l2_submit_load_groups(a, keys, g, 1, 2, &id), KVS_ECLOSED);
    CHECK_OK(kvs_l2_close(a));
    kvs_l2_destroy(a);
    for (int i = 0; i < TASKS; i++) kvs_memobj_free(c[i]);
}

int main(void)
{
    snprintf(fs_root, sizeof fs_root, "/tmp/kvs_multi_wrapper_XXXXXX");
    if (mkdtemp(fs_root) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    if (!on_path("redis-server")) {
        fprintf(stderr, "test_multi_wrapper: FAIL: redis-server must be on PATH (Debian "
                        "package redis-server; run scripts/setup.sh)\n");
        return 1;
    }
    if (kvs_test_redis_init() != 0) return 1;
    signal(SIGPIPE, SIG_DFL);
    server *s = new_server();
    if (start_server(s, 0, NULL) != 0) {
        fprintf(stderr, "test_multi_wrapper: FAIL: cannot start redis-server\n");
        return 1;
    }
    redis_port = s->port;

    RUN(test_chunks_memory);
    RUN(test_chunks_fs);
    RUN(test_chunks_redis);
    RUN(test_split_tier_memory);
    RUN(test_split_tier_fs);
    RUN(test_split_tier_redis);
    RUN(test_kv_groups);
    RUN(test_required_slot_refused);
    RUN(test_formats_without_kv_refused);
    RUN(test_groups_need_a_multi_serde);
    RUN(test_pool_all_or_nothing);
    RUN(test_one_damaged_blob);
    RUN(test_close_with_group_tasks_in_flight);
    nftw(fs_root, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return TEST_SUMMARY();
}
