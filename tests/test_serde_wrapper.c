/* test_serde_wrapper.c - the serde L2 wrapper (src/l2/serde_wrapper.c):
 * upstream's groups H (test_serde_e2e.py), I (test_serde_fs_e2e.py) and J
 * (test_variable_size_payload.py) translated to C on the memory and the
 * filesystem adapters, plus the decisions of DESIGN.md section 3 (mixed
 * layouts refused, temps all or nothing, close, submit after close).
 *
 * The temp pool is observed through the wrapper's status JSON
 * ("serde_temp_pool": {"in_use_bytes", ...}): "no temp bytes held" is
 * in_use_bytes == 0 once every task has been read.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "codecs/half.h"
#include "kvs_test.h"
#include "kvs_test_list.h"
#include "kvserde/l2.h"
#include "kvserde/l2_memory.h"
#include "kvserde/memobj.h"
#include "kvserde/processor.h"
#include "kvserde/registry.h"
#include "kvserde/serde.h"

#define MODEL "test_model"
#define MAXK 16
#define WAIT_MS 30000

/* ---------------------------------------------------------------------
 * Keys, layouts, objects
 * ------------------------------------------------------------------ */

/* upstream IntHash2Bytes(i): the integer's bytes as the chunk hash */
static kvs_object_key key_of(int i)
{
    kvs_object_key k;
    uint8_t h[8];
    for (int b = 0; b < 8; b++) h[b] = (uint8_t)((uint64_t)i >> (8 * b));
    if (kvs_object_key_init(&k, h, sizeof h, MODEL, 0, 0, NULL) != KVS_OK) abort();
    return k;
}

static void keys_of(kvs_object_key *keys, const int *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) keys[i] = key_of(ids[i]);
}

static void keys_range(kvs_object_key *keys, int first, size_t n)
{
    for (size_t i = 0; i < n; i++) keys[i] = key_of(first + (int)i);
}

static kvs_layout layout1(kvs_dtype dt, uint32_t ndim, const int64_t *dims)
{
    kvs_layout l;
    kvs_shape s = {0};
    s.ndim = ndim;
    for (uint32_t i = 0; i < ndim; i++) s.dims[i] = dims[i];
    if (kvs_layout_init(&l, 1, &s, 1, &dt) != KVS_OK) abort();
    return l;
}

static kvs_memobj *new_obj(const kvs_layout *l)
{
    kvs_memobj *o = NULL;
    if (kvs_memobj_alloc(l, KVS_FMT_KV_2LTD, &o) != KVS_OK) abort();
    return o;
}

static void new_objs(kvs_memobj **objs, size_t n, const kvs_layout *l)
{
    for (size_t i = 0; i < n; i++) objs[i] = new_obj(l);
}

static void free_objs(kvs_memobj **objs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvs_memobj_free(objs[i]);
        objs[i] = NULL;
    }
}

static float elem_get(const kvs_memobj *o, uint32_t g, uint64_t i)
{
    const uint8_t *p = kvs_memobj_group_data(o, g);
    switch (o->layout.groups[g].dtype) {
    case KVS_DTYPE_FLOAT32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case KVS_DTYPE_FLOAT16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return kvs_f16_to_f32(h);
    }
    case KVS_DTYPE_BFLOAT16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return kvs_bf16_to_f32(h);
    }
    default: return p[i];
    }
}

static void elem_set(kvs_memobj *o, uint32_t g, uint64_t i, float v)
{
    uint8_t *p = kvs_memobj_group_data(o, g);
    switch (o->layout.groups[g].dtype) {
    case KVS_DTYPE_FLOAT32: memcpy(p + 4 * i, &v, 4); break;
    case KVS_DTYPE_FLOAT16: {
        uint16_t h = kvs_f32_to_f16(v);
        memcpy(p + 2 * i, &h, 2);
        break;
    }
    case KVS_DTYPE_BFLOAT16: {
        uint16_t h = kvs_f32_to_bf16(v);
        memcpy(p + 2 * i, &h, 2);
        break;
    }
    default: p[i] = (uint8_t)v; break;
    }
}

/* Values every dtype and float8_e4m3fn hold exactly. */
static const float exact_vals[8] = {0.0f, 0.5f, -1.0f, 1.5f, 2.0f, -3.0f, 4.0f, 0.25f};

/* An fp8-exact pattern, rotated by `rot` (per key / group). */
static void fill_exact(kvs_memobj *o, int rot)
{
    for (uint32_t g = 0; g < o->layout.ngroups; g++) {
        uint64_t n = kvs_layout_group_numel(&o->layout, g);
        for (uint64_t i = 0; i < n; i++)
            elem_set(o, g, i, exact_vals[(i + (uint64_t)rot + 3 * g) % 8]);
    }
}

static void fill_const(kvs_memobj *o, float v)
{
    for (uint32_t g = 0; g < o->layout.ngroups; g++) {
        uint64_t n = kvs_layout_group_numel(&o->layout, g);
        for (uint64_t i = 0; i < n; i++) elem_set(o, g, i, v);
    }
}

/* Standard normal values (Box-Muller on a fixed LCG): torch.randn stand-in. */
static void fill_randn(kvs_memobj *o, uint64_t seed)
{
    uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    for (uint32_t g = 0; g < o->layout.ngroups; g++) {
        uint64_t n = kvs_layout_group_numel(&o->layout, g);
        for (uint64_t i = 0; i < n; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            double u1 = ((s >> 11) + 1.0) / 9007199254740993.0;
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            double u2 = (s >> 11) / 9007199254740992.0;
            elem_set(o, g, i, (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)));
        }
    }
}

static int same_bytes(const kvs_memobj *a, const kvs_memobj *b)
{
    return kvs_memobj_size(a) == kvs_memobj_size(b) &&
           memcmp(a->data, b->data, kvs_memobj_size(a)) == 0;
}

/* Every element within float8_e4m3fn's rounding error (3 mantissa bits:
 * half a step is 2^-4 relative; subnormal steps are 2^-9) and the Pearson
 * correlation of the whole object. */
static int within_fp8(const kvs_memobj *ref, const kvs_memobj *got, double *corr)
{
    int ok = 1;
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0, n = 0;
    for (uint32_t g = 0; g < ref->layout.ngroups; g++) {
        uint64_t cnt = kvs_layout_group_numel(&ref->layout, g);
        for (uint64_t i = 0; i < cnt; i++) {
            double x = elem_get(ref, g, i), y = elem_get(got, g, i);
            /* plus the destination dtype's own rounding (bf16: 2^-9 relative) */
            double tol = fmax(fabs(x) * (0.0625 + 0.004), 0.001953125 * 1.01);
            if (fabs(x - y) > tol) ok = 0;
            sx += x, sy += y, sxx += x * x, syy += y * y, sxy += x * y, n += 1;
        }
    }
    double cov = sxy - sx * sy / n, vx = sxx - sx * sx / n, vy = syy - sy * sy / n;
    *corr = cov / sqrt(vx * vy);
    return ok;
}

/* ---------------------------------------------------------------------
 * Waiting for results
 * ------------------------------------------------------------------ */

/* Store results popped while looking for another id. */
static kvs_l2_store_result stash[64];
static size_t nstash;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait for store task `id` (up to WAIT_MS); 1 if found. */
static int wait_store(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_store_result *out)
{
    int64_t deadline = now_ms() + WAIT_MS;
    for (;;) {
        for (size_t i = 0; i < nstash; i++) {
            if (stash[i].id == id) {
                *out = stash[i];
                stash[i] = stash[--nstash];
                return 1;
            }
        }
        kvs_l2_store_result buf[8];
        size_t c = 0;
        if (kvs_l2_pop_completed_stores(a, buf, 8, &c) != KVS_OK) return 0;
        for (size_t i = 0; i < c && nstash < 64; i++) stash[nstash++] = buf[i];
        if (c > 0) continue;
        if (now_ms() > deadline) return 0;
        struct pollfd p = {kvs_l2_store_event_fd(a), POLLIN, 0};
        if (p.fd < 0) return 0;
        if (poll(&p, 1, 50) > 0) kvs_event_fd_consume(p.fd, NULL);
    }
}

/* Wait for a lookup (load 0) or load task, up to wait_ms, looking every
 * poll_ms; 1 if it ended. */
static int wait_bitmap_for(kvs_l2_adapter *a, int load, kvs_l2_task_id id, kvs_l2_bitmap *out,
                           int wait_ms, int poll_ms)
{
    int64_t deadline = now_ms() + wait_ms;
    for (;;) {
        int rc = load ? kvs_l2_query_load(a, id, out) : kvs_l2_query_lookup_and_lock(a, id, out);
        if (rc != KVS_OK) return 0;
        if (out->state != KVS_TASK_PENDING) return 1;
        if (now_ms() > deadline) return 0;
        struct pollfd p = {load ? kvs_l2_load_event_fd(a) : kvs_l2_lookup_event_fd(a), POLLIN,
                           0};
        if (p.fd < 0) return 0;
        if (poll(&p, 1, poll_ms) > 0) kvs_event_fd_consume(p.fd, NULL);
    }
}

static int wait_bitmap(kvs_l2_adapter *a, int load, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    return wait_bitmap_for(a, load, id, out, WAIT_MS, 50);
}

/* Submit a store and wait for it. */
static int do_store(kvs_l2_adapter *a, const kvs_object_key *keys, kvs_memobj **objs,
                    size_t n, kvs_l2_store_result *res)
{
    kvs_l2_task_id id;
    int rc = kvs_l2_submit_store(a, keys, objs, n, &id);
    if (rc != KVS_OK) return rc;
    return wait_store(a, id, res) ? KVS_OK : KVS_EIO;
}

static int do_load(kvs_l2_adapter *a, const kvs_object_key *keys, kvs_memobj **objs,
                   size_t n, kvs_l2_bitmap *bm)
{
    kvs_l2_task_id id;
    int rc = kvs_l2_submit_load(a, keys, objs, n, &id);
    if (rc != KVS_OK) return rc;
    return wait_bitmap(a, 1, id, bm) ? KVS_OK : KVS_EIO;
}

static int do_lookup(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                     kvs_l2_bitmap *bm)
{
    kvs_l2_task_id id;
    int rc = kvs_l2_submit_lookup_and_lock(a, keys, n, &id);
    if (rc != KVS_OK) return rc;
    return wait_bitmap(a, 0, id, bm) ? KVS_OK : KVS_EIO;
}

/* "11011" */
static const char *bits(const kvs_l2_bitmap *bm)
{
    static char s[MAXK + 1];
    size_t i = 0;
    for (; i < bm->nkeys && i < MAXK; i++) s[i] = bm->hits[i] ? '1' : '0';
    s[i] = '\0';
    return s;
}

/* Store n objects, load them back into dst: every key found, every byte
 * back. */
static void store_and_load_all(kvs_l2_adapter *a, const kvs_object_key *keys, kvs_memobj **src,
                               kvs_memobj **dst, size_t n)
{
    kvs_l2_store_result res;
    CHECK_OK(do_store(a, keys, src, n, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(a, keys, dst, n, &bm));
    CHECK_EQ_INT(bm.nhits, n);
    kvs_l2_bitmap_release(&bm);
    for (size_t i = 0; i < n; i++) CHECK(same_bytes(src[i], dst[i]));
}

/* A field of the wrapper's "serde_temp_pool" status (-1 if missing). */
static long long pool_stat(kvs_l2_adapter *a, const char *field)
{
    json_t *st = NULL;
    if (kvs_l2_status(a, &st) != KVS_OK) return -1;
    json_t *v = json_object_get(json_object_get(st, "serde_temp_pool"), field);
    long long r = json_is_integer(v) ? (long long)json_integer_value(v) : -1;
    json_decref(st);
    return r;
}

static long long in_use(kvs_l2_adapter *a) { return pool_stat(a, "in_use_bytes"); }

/* ---------------------------------------------------------------------
 * Processors and adapters
 * ------------------------------------------------------------------ */

static kvs_processor *fp8_proc(void)
{
    kvs_processor *p = NULL;
    if (kvs_serde_create("{\"type\": \"fp8\"}", &p) != KVS_OK) return NULL;
    return p;
}

/* A test serde: identity (memcpy), prefix (upstream _PrefixSerializer:
 * estimate 64, writes the first 8 bytes), or failing. The deserializer
 * copies the stored bytes and zero-fills the rest of the destination. */
enum { TS_IDENTITY, TS_PREFIX, TS_FAIL };

struct tser {
    kvs_serializer base;
    int mode;
};
struct tde {
    kvs_deserializer base;
    int fail;
};

static int tser_serialize(kvs_serializer *s, const kvs_memobj *src, kvs_memobj *dst,
                          const kvs_object_key *key,
                          size_t *nwritten)
{
    (void)key;
    struct tser *t = KVS_CONTAINER_OF(s, struct tser, base);
    if (t->mode == TS_FAIL)
        return kvs_set_error(KVS_ECORRUPT, "tserde: injected serialize failure");
    size_t n = kvs_memobj_size(src);
    if (t->mode == TS_PREFIX) n = n < 8 ? n : 8;
    if (n > dst->capacity)
        return kvs_set_error(KVS_ENOSPC, "tserde: destination too small");
    memcpy(dst->data, src->data, n);
    *nwritten = n;
    return KVS_OK;
}

static int tser_estimate(const kvs_serializer *s, const kvs_layout *l, size_t *nbytes)
{
    const struct tser *t = KVS_CONTAINER_OF(s, const struct tser, base);
    *nbytes = t->mode == TS_PREFIX ? 64 : (size_t)kvs_layout_nbytes(l);
    return KVS_OK;
}

static void tser_destroy(kvs_serializer *s) { free(KVS_CONTAINER_OF(s, struct tser, base)); }

static int tde_deserialize(kvs_deserializer *d, const kvs_memobj *src, kvs_memobj *dst,
                           const kvs_object_key *key)
{
    (void)key;
    struct tde *t = KVS_CONTAINER_OF(d, struct tde, base);
    if (t->fail) return kvs_set_error(KVS_ECORRUPT, "tserde: injected deserialize failure");
    size_t n = kvs_memobj_size(src), cap = kvs_memobj_size(dst);
    if (n > cap) return kvs_set_error(KVS_ENOSPC, "tserde: destination too small");
    memcpy(dst->data, src->data, n);
    /* A byte buffer (a nested wrapper's temp) gets exactly the bytes: the
     * serde above checks the stored size. */
    if (dst->format == KVS_FMT_BINARY_BUFFER) return kvs_memobj_set_used_size(dst, n);
    memset((uint8_t *)dst->data + n, 0, cap - n);
    return KVS_OK;
}

static void tde_destroy(kvs_deserializer *d) { free(KVS_CONTAINER_OF(d, struct tde, base)); }

static const struct kvs_serializer_ops tser_ops = {"tserde", tser_serialize, tser_estimate,
                                                   tser_destroy};
static const struct kvs_deserializer_ops tde_ops = {"tserde", tde_deserialize, tde_destroy};

/* A processor (1 worker) over the test serde; ops: the serializer's. */
static kvs_processor *test_proc_ops(const struct kvs_serializer_ops *ops, int ser_mode,
                                    int de_fail)
{
    struct tser *s = calloc(1, sizeof *s);
    struct tde *d = calloc(1, sizeof *d);
    if (s == NULL || d == NULL) abort();
    s->base.ops = ops;
    s->mode = ser_mode;
    d->base.ops = &tde_ops;
    d->fail = de_fail;
    kvs_processor *p = NULL;
    if (kvs_async_processor_create(&s->base, &d->base, 1, &p) != KVS_OK) return NULL;
    return p;
}

static kvs_processor *test_proc(int ser_mode, int de_fail)
{
    return test_proc_ops(&tser_ops, ser_mode, de_fail);
}

/* A wrapper around a fresh memory adapter; *inner keeps a pointer to it for
 * fault injection (the wrapper owns it). pool 0 = default. */
static kvs_l2_adapter *mem_wrapper(kvs_processor *proc, uint64_t pool, kvs_l2_adapter **inner)
{
    kvs_l2_adapter *m = NULL, *w = NULL;
    nstash = 0;
    if (proc == NULL) return NULL;
    if (kvs_memory_adapter_create(NULL, &m) != KVS_OK) {
        kvs_processor_destroy(proc);
        return NULL;
    }
    kvs_serde_wrapper_options o = {pool};
    if (kvs_serde_wrapper_create(m, proc, &o, &w) != KVS_OK) return NULL;
    if (inner) *inner = m;
    return w;
}

/* A fresh directory under /tmp; path must hold 64 bytes. */
static int make_tmpdir(char *path)
{
    snprintf(path, 64, "/tmp/kvs_serde_wrapper_XXXXXX");
    return mkdtemp(path) ? 0 : -1;
}

static void rm_rf(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *d = opendir(path);
        if (d) {
            struct dirent *e;
            while ((e = readdir(d)) != NULL) {
                if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
                char sub[4096];
                snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
                rm_rf(sub);
            }
            closedir(d);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

/* Object files under path (recursively; names starting with '.' are the fs
 * adapter's own): how many, and their sizes. */
static size_t list_files(const char *path, long long *sizes, size_t cap)
{
    size_t n = 0;
    DIR *d = opendir(path);
    if (d == NULL) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(sub, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            n += list_files(sub, sizes ? sizes + n : NULL, cap > n ? cap - n : 0);
        } else if (S_ISREG(st.st_mode)) {
            if (sizes && n < cap) sizes[n] = (long long)st.st_size;
            n++;
        }
    }
    closedir(d);
    return n;
}

static kvs_l2_adapter *fs_adapter(const char *dir)
{
    char spec[512];
    snprintf(spec, sizeof spec, "{\"type\": \"fs\", \"path\": \"%s\"}", dir);
    kvs_l2_adapter *a = NULL;
    if (kvs_l2_create(spec, &a) != KVS_OK) return NULL;
    return a;
}

/* ---------------------------------------------------------------------
 * H: end to end on the memory adapter with fp8
 * ------------------------------------------------------------------ */

/* H52/H53: 5 keys stored and loaded back; fp8-exact values compare equal;
 * only the fp8 bytes are stored; no temp held after the cycle. */
static void test_store_load_5_keys_fp8(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, &inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 3, (int64_t[]){100, 2, 512});
    kvs_object_key keys[5];
    kvs_memobj *src[5], *dst[5];
    keys_range(keys, 0, 5);
    new_objs(src, 5, &l);
    new_objs(dst, 5, &l);
    for (int i = 0; i < 5; i++) fill_const(src[i], (float)(i + 1));

    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 5, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_INT(res.status, KVS_OK);
    CHECK_EQ_U64(res.bytes_written, 5 * 102400); /* one fp8 byte per element */
    CHECK_EQ_INT(in_use(w), 0);
    int64_t sizes[5];
    CHECK_OK(kvs_l2_object_sizes(inner, keys, 5, sizes));
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(sizes[i], 102400);

    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 5, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_STR(bits(&bm), "11111");
    CHECK_EQ_INT(bm.nhits, 5);
    CHECK_EQ_INT(bm.status, KVS_OK);
    CHECK_EQ_STR(bm.message, "");
    kvs_l2_bitmap_release(&bm);
    for (int i = 0; i < 5; i++) {
        CHECK(same_bytes(src[i], dst[i]));
        CHECK_EQ_INT(kvs_memobj_size(dst[i]), 204800);
    }
    CHECK_EQ_INT(in_use(w), 0);
    CHECK_EQ_INT(pool_stat(w, "tasks_in_flight"), 0);
    free_objs(src, 5);
    free_objs(dst, 5);
    kvs_l2_destroy(w);
}

/* I66 on memory: randn [2,4,256,128] bf16 within fp8 error, corr > 0.99. */
static void test_randn_within_fp8_error(void)
{
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 4, (int64_t[]){2, 4, 256, 128});
    kvs_object_key keys[2];
    kvs_memobj *src[2], *dst[2];
    keys_range(keys, 100, 2);
    new_objs(src, 2, &l);
    new_objs(dst, 2, &l);
    fill_randn(src[0], 0);
    fill_randn(src[1], 1);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 2, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 2, &bm));
    CHECK_EQ_STR(bits(&bm), "11");
    kvs_l2_bitmap_release(&bm);
    for (int i = 0; i < 2; i++) {
        double corr = 0;
        CHECK(within_fp8(src[i], dst[i], &corr));
        CHECK(corr > 0.99);
    }
    CHECK_EQ_INT(in_use(w), 0);
    free_objs(src, 2);
    free_objs(dst, 2);
    kvs_l2_destroy(w);
}

/* H58 then H57: an empty L2 misses everything; 5 cycles x 3 keys hit 3
 * each time; no temp held after any cycle. */
static void test_cycles_hold_no_temps(void)
{
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 3, (int64_t[]){100, 2, 512});
    kvs_object_key keys[3];
    kvs_memobj *src[3], *dst[3];
    new_objs(src, 3, &l);
    new_objs(dst, 3, &l);

    keys_range(keys, 0, 3);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 3, &bm));
    CHECK_EQ_STR(bits(&bm), "000");
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK_EQ_INT(bm.status, KVS_ENOTFOUND); /* the inner's first error, kept */
    kvs_l2_bitmap_release(&bm);
    CHECK_EQ_INT(in_use(w), 0);

    for (int cycle = 0; cycle < 5; cycle++) {
        keys_range(keys, 10 * (cycle + 1), 3);
        for (int i = 0; i < 3; i++) fill_exact(src[i], cycle + i);
        kvs_l2_store_result res;
        CHECK_OK(do_store(w, keys, src, 3, &res));
        CHECK_EQ_INT(res.state, KVS_TASK_OK);
        CHECK_EQ_INT(in_use(w), 0);
        CHECK_OK(do_load(w, keys, dst, 3, &bm));
        CHECK_EQ_STR(bits(&bm), "111");
        kvs_l2_bitmap_release(&bm);
        for (int i = 0; i < 3; i++) CHECK(same_bytes(src[i], dst[i]));
        CHECK_EQ_INT(in_use(w), 0);
    }
    /* the idle temps are reused, within the budget */
    CHECK(pool_stat(w, "cached_temps") > 0);
    CHECK(pool_stat(w, "cached_bytes") <= pool_stat(w, "capacity_bytes"));
    free_objs(src, 3);
    free_objs(dst, 3);
    kvs_l2_destroy(w);
}

/* Temps cost nothing to reuse: stores and loads of the same shape, task
 * after task, run on the temps the first task allocated (allocated_temps
 * counts every temp ever made); a store of another size makes its own. */
static void test_pool_reuses_temps(void)
{
    kvs_l2_adapter *w = mem_wrapper(test_proc(TS_IDENTITY, 0), 0, NULL);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_UINT8, 1, (int64_t[]){3 << 12});
    kvs_layout small = layout1(KVS_DTYPE_UINT8, 1, (int64_t[]){100});
    kvs_object_key keys[4];
    kvs_memobj *src[4], *dst[4], *one;
    new_objs(src, 4, &l);
    new_objs(dst, 4, &l);
    one = new_obj(&small);
    CHECK_EQ_INT(pool_stat(w, "allocated_temps"), 0);
    for (int cycle = 0; cycle < 4; cycle++) {
        keys_range(keys, 10 * cycle, 4);
        for (int i = 0; i < 4; i++) fill_exact(src[i], cycle * 4 + i);
        store_and_load_all(w, keys, src, dst, 4);
        CHECK_EQ_INT(pool_stat(w, "allocated_temps"), 4);
        CHECK_EQ_INT(pool_stat(w, "cached_temps"), 4);
        CHECK_EQ_INT(pool_stat(w, "cached_bytes"), 4 * (3 << 12));
    }
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, &one, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_INT(pool_stat(w, "allocated_temps"), 5);
    CHECK_EQ_INT(pool_stat(w, "cached_temps"), 5);
    free_objs(src, 4);
    free_objs(dst, 4);
    kvs_memobj_free(one);
    kvs_l2_destroy(w);
}

/* A store of several large objects goes on in pieces (about 4 MiB of temps
 * each): the inner adapter stores the first piece while the last is still
 * being serialized. The serializer, on the task's last key, waits (at most
 * 5 s) for key 0 to appear in the inner adapter: a store that serialized
 * the whole batch first would never let it. */
static kvs_l2_adapter *piece_inner;
static int piece_saw_key0 = -1;

static int piece_serialize(kvs_serializer *s, const kvs_memobj *src, kvs_memobj *dst,
                           const kvs_object_key *key, size_t *nwritten)
{
    kvs_object_key k0 = key_of(0), last = key_of(7);
    if (key && kvs_object_key_equal(key, &last)) {
        piece_saw_key0 = 0;
        for (int i = 0; i < 500 && !piece_saw_key0; i++) {
            int64_t size = -1;
            if (kvs_l2_object_sizes(piece_inner, &k0, 1, &size) == KVS_OK && size >= 0)
                piece_saw_key0 = 1;
            else
                usleep(10000);
        }
    }
    return tser_serialize(s, src, dst, key, nwritten);
}

static const struct kvs_serializer_ops piece_ser_ops = {"tserde", piece_serialize,
                                                        tser_estimate, tser_destroy};

static void test_large_store_goes_in_pieces(void)
{
    kvs_l2_adapter *w =
        mem_wrapper(test_proc_ops(&piece_ser_ops, TS_IDENTITY, 0), (uint64_t)64 << 20, &piece_inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_UINT8, 1, (int64_t[]){1 << 20});
    kvs_object_key keys[8];
    kvs_memobj *src[8], *dst[8];
    keys_range(keys, 0, 8);
    new_objs(src, 8, &l);
    new_objs(dst, 8, &l);
    for (int i = 0; i < 8; i++) fill_exact(src[i], i);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 8, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_INT(res.bytes_written, 8 << 20); /* the pieces' bytes add up */
    CHECK_EQ_INT(piece_saw_key0, 1);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 8, &bm));
    CHECK_EQ_STR(bits(&bm), "11111111");
    kvs_l2_bitmap_release(&bm);
    for (int i = 0; i < 8; i++) CHECK(same_bytes(src[i], dst[i]));
    free_objs(src, 8);
    free_objs(dst, 8);
    kvs_l2_destroy(w);
}

/* H56: L2 holds {0,1,3,4}; a load of 0..4 gives 11011 (the inner's partial
 * bitmap is kept) with the inner's miss as the message. */
static void test_partial_prefix_hit(void)
{
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 3, (int64_t[]){10, 2, 64});
    kvs_object_key keys[5], skeys[4];
    kvs_memobj *src[4], *dst[5];
    keys_range(keys, 0, 5);
    keys_of(skeys, (int[]){0, 1, 3, 4}, 4);
    new_objs(src, 4, &l);
    new_objs(dst, 5, &l);
    for (int i = 0; i < 4; i++) fill_exact(src[i], i);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, skeys, src, 4, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 5, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_STR(bits(&bm), "11011");
    CHECK_EQ_INT(bm.nhits, 4);
    CHECK_EQ_INT(bm.status, KVS_ENOTFOUND);
    CHECK_EQ_STR(bm.message, "memory: load of key 2: not found");
    kvs_l2_bitmap_release(&bm);
    CHECK(same_bytes(src[0], dst[0]));
    CHECK(same_bytes(src[1], dst[1]));
    CHECK(same_bytes(src[2], dst[3]));
    CHECK(same_bytes(src[3], dst[4]));
    CHECK_EQ_INT(in_use(w), 0);
    free_objs(src, 4);
    free_objs(dst, 5);
    kvs_l2_destroy(w);
}

/* H59-H64: buffer bounds round trips over dtypes and odd shapes. */
static void test_shapes_round_trip(void)
{
    struct {
        kvs_dtype dt;
        uint32_t ndim;
        int64_t dims[4];
        size_t nkeys;
    } cases[] = {
        {KVS_DTYPE_BFLOAT16, 3, {100, 2, 512}, 3},
        {KVS_DTYPE_FLOAT16, 3, {100, 2, 512}, 3},
        {KVS_DTYPE_FLOAT32, 3, {50, 2, 256}, 3},
        {KVS_DTYPE_BFLOAT16, 4, {256, 4, 2, 2048}, 2},
        {KVS_DTYPE_BFLOAT16, 1, {1}, 3},
        {KVS_DTYPE_BFLOAT16, 3, {7, 13, 3}, 3},
    };
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        kvs_layout l = layout1(cases[c].dt, cases[c].ndim, cases[c].dims);
        size_t n = cases[c].nkeys;
        kvs_object_key keys[3];
        kvs_memobj *src[3], *dst[3];
        keys_range(keys, 1000 * (int)(c + 1), n);
        new_objs(src, n, &l);
        new_objs(dst, n, &l);
        for (size_t i = 0; i < n; i++) fill_exact(src[i], (int)i);
        kvs_l2_store_result res;
        CHECK_OK(do_store(w, keys, src, n, &res));
        CHECK_EQ_INT(res.state, KVS_TASK_OK);
        CHECK_EQ_U64(res.bytes_written, n * kvs_layout_numel(&l));
        kvs_l2_bitmap bm;
        CHECK_OK(do_load(w, keys, dst, n, &bm));
        CHECK_EQ_INT(bm.nhits, n);
        kvs_l2_bitmap_release(&bm);
        for (size_t i = 0; i < n; i++) {
            if (!same_bytes(src[i], dst[i])) {
                char f[128];
                fprintf(stderr, "case %zu %s key %zu differs\n", c,
                        kvs_layout_format(&l, f, sizeof f), i);
                CHECK(0);
            }
            CHECK(kvs_layout_equal(&dst[i]->layout, &l));
        }
        CHECK_EQ_INT(in_use(w), 0);
        free_objs(src, n);
        free_objs(dst, n);
    }
    kvs_l2_destroy(w);
}

/* H65: multi-group objects [1,2,4,8] bf16, [4,4] fp16, [8] fp32, values
 * rotated per key and group; each group comes back exactly. */
static void test_multi_group_round_trip(void)
{
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    kvs_layout l;
    CHECK_OK(kvs_layout_init(&l, 0, NULL, 0, NULL));
    CHECK_OK(kvs_layout_add_group(&l, 4, (int64_t[]){1, 2, 4, 8}, KVS_DTYPE_BFLOAT16));
    CHECK_OK(kvs_layout_add_group(&l, 2, (int64_t[]){4, 4}, KVS_DTYPE_FLOAT16));
    CHECK_OK(kvs_layout_add_group(&l, 1, (int64_t[]){8}, KVS_DTYPE_FLOAT32));
    kvs_object_key keys[2];
    kvs_memobj *src[2], *dst[2];
    keys_range(keys, 500, 2);
    new_objs(src, 2, &l);
    new_objs(dst, 2, &l);
    fill_exact(src[0], 1);
    fill_exact(src[1], 5);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 2, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 2 * (64 + 16 + 8));
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 2, &bm));
    CHECK_EQ_STR(bits(&bm), "11");
    kvs_l2_bitmap_release(&bm);
    for (int i = 0; i < 2; i++) {
        for (uint32_t g = 0; g < 3; g++)
            CHECK(memcmp(kvs_memobj_group_data(src[i], g), kvs_memobj_group_data(dst[i], g),
                         kvs_memobj_group_nbytes(src[i], g)) == 0);
        CHECK_EQ_INT(dst[i]->layout.ngroups, 3);
        CHECK_EQ_INT(dst[i]->layout.groups[1].dtype, KVS_DTYPE_FLOAT16);
    }
    CHECK_EQ_INT(in_use(w), 0);
    free_objs(src, 2);
    free_objs(dst, 2);
    kvs_l2_destroy(w);
}

/* ---------------------------------------------------------------------
 * J and failure paths
 * ------------------------------------------------------------------ */

/* J70: the pool runs out on key 1 of 3: the task is complete (failed) as
 * submit returns, nothing is held, the inner adapter was never called. The
 * same for a load (every key a miss). */
static void test_pool_runs_out_on_key_1_of_3(void)
{
    /* [1024] bf16 -> fp8 estimate floor(1.5 * 1024) = 1536 bytes a temp */
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 1536 + 768, &inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){1024});
    kvs_object_key keys[3];
    kvs_memobj *src[3];
    keys_range(keys, 0, 3);
    new_objs(src, 3, &l);

    kvs_l2_task_id id = 99;
    CHECK_OK(kvs_l2_submit_store(w, keys, src, 3, &id));
    CHECK_EQ_INT(id, 0);
    /* signalled before submit returned */
    struct pollfd p = {kvs_l2_store_event_fd(w), POLLIN, 0};
    CHECK_EQ_INT(poll(&p, 1, 0), 1);
    kvs_l2_store_result res[4];
    size_t count = 0;
    CHECK_OK(kvs_l2_pop_completed_stores(w, res, 4, &count));
    REQUIRE(count == 1);
    CHECK_EQ_INT(res[0].id, 0);
    CHECK_EQ_INT(res[0].state, KVS_TASK_FAILED);
    CHECK_EQ_INT(res[0].status, KVS_ENOMEM);
    CHECK_EQ_U64(res[0].bytes_written, 0);
    CHECK_EQ_STR(res[0].message,
                 "serde wrapper: temp pool exhausted: need 4608 bytes for 3 temps, 2304 of "
                 "2304 free");
    CHECK_EQ_INT(in_use(w), 0);
    CHECK_EQ_INT(pool_stat(w, "in_use_temps"), 0);

    kvs_l2_task_id lid = 99;
    CHECK_OK(kvs_l2_submit_load(w, keys, src, 3, &lid));
    CHECK_EQ_INT(lid, 1);
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_query_load(w, lid, &bm)); /* complete at once */
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_STR(bits(&bm), "000");
    CHECK_EQ_INT(bm.status, KVS_ENOMEM);
    CHECK_EQ_STR(bm.message,
                 "serde wrapper: temp pool exhausted: need 4608 bytes for 3 temps, 2304 of "
                 "2304 free");
    kvs_l2_bitmap_release(&bm);
    CHECK_EQ_INT(in_use(w), 0);

    /* The inner never saw a task: its next id is still 0 (lookup passes
     * through to it) and nothing is stored. */
    kvs_l2_task_id iid = 99;
    CHECK_OK(kvs_l2_submit_lookup_and_lock(w, keys, 3, &iid));
    CHECK_EQ_INT(iid, 0);
    CHECK(wait_bitmap(w, 0, iid, &bm));
    CHECK_EQ_STR(bits(&bm), "000");
    kvs_l2_bitmap_release(&bm);
    int64_t sizes[3];
    CHECK_OK(kvs_l2_object_sizes(inner, keys, 3, sizes));
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(sizes[i], -1);

    /* one key fits */
    CHECK_OK(do_store(w, keys, src, 1, &res[0]));
    CHECK_EQ_INT(res[0].state, KVS_TASK_OK);
    CHECK_EQ_INT(in_use(w), 0);
    free_objs(src, 3);
    kvs_l2_destroy(w);
}

/* The pool is shared: a task in flight holds its temps until the inner
 * store ends, and a second task that does not fit fails at once. */
static void test_pool_shared_by_tasks_in_flight(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 1048576, &inner);
    REQUIRE(w != NULL);
    /* floor(1.5 * 174763) = 262144 bytes a temp */
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){174763});
    kvs_memory_fault slow = {KVS_MEMORY_FAULT_STORE, NULL, KVS_OK, 300000};
    CHECK_OK(kvs_memory_adapter_inject(inner, &slow));
    kvs_object_key keys[5];
    kvs_memobj *src[5];
    keys_range(keys, 0, 5);
    new_objs(src, 5, &l);
    kvs_l2_task_id a, b;
    CHECK_OK(kvs_l2_submit_store(w, keys, src, 2, &a));
    CHECK_EQ_INT(in_use(w), 524288);
    CHECK_OK(kvs_l2_submit_store(w, keys + 2, src + 2, 3, &b));
    kvs_l2_store_result rb, ra;
    CHECK(wait_store(w, b, &rb));
    CHECK_EQ_INT(rb.state, KVS_TASK_FAILED);
    CHECK_EQ_STR(rb.message, "serde wrapper: temp pool exhausted: need 786432 bytes for 3 "
                             "temps, 524288 of 1048576 free");
    CHECK(wait_store(w, a, &ra));
    CHECK_EQ_INT(ra.state, KVS_TASK_OK);
    CHECK_EQ_U64(ra.bytes_written, 2 * 174763);
    CHECK_EQ_INT(in_use(w), 0);
    CHECK_EQ_INT(pool_stat(w, "peak_in_use_bytes"), 524288);
    free_objs(src, 5);
    kvs_l2_destroy(w);
}

/* A batch whose temps fit but with a different size evicts idle temps so
 * that in use + idle stays within the budget. */
static void test_pool_cache_stays_in_budget(void)
{
    kvs_l2_adapter *w = mem_wrapper(test_proc(TS_IDENTITY, 0), 3 * 1024, NULL);
    REQUIRE(w != NULL);
    kvs_layout l1k = layout1(KVS_DTYPE_UINT8, 1, (int64_t[]){1024});
    kvs_layout l2k = layout1(KVS_DTYPE_UINT8, 1, (int64_t[]){2048});
    kvs_object_key keys[3];
    kvs_memobj *src[3], *big;
    keys_range(keys, 0, 3);
    new_objs(src, 3, &l1k);
    big = new_obj(&l2k);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 3, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_INT(pool_stat(w, "cached_bytes"), 3072);
    CHECK_EQ_INT(pool_stat(w, "allocated_temps"), 3);
    CHECK_OK(do_store(w, keys, &big, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_INT(in_use(w), 0);
    CHECK(pool_stat(w, "cached_bytes") <= 3072);
    /* two idle 1 KiB temps made way for the 2 KiB one */
    CHECK_EQ_INT(pool_stat(w, "allocated_temps"), 4);
    CHECK_OK(do_store(w, keys, src, 3, &res)); /* still fits */
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK(pool_stat(w, "cached_bytes") <= 3072);
    /* one idle 1 KiB temp reused, the 2 KiB one evicted for two new ones */
    CHECK_EQ_INT(pool_stat(w, "allocated_temps"), 6);
    free_objs(src, 3);
    kvs_memobj_free(big);
    kvs_l2_destroy(w);
}

/* An inner store failure fails the task with the inner's error; the temps
 * are released. */
static void test_inner_store_failure(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, &inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 2, (int64_t[]){16, 64});
    kvs_object_key keys[3];
    kvs_memobj *src[3];
    keys_range(keys, 0, 3);
    new_objs(src, 3, &l);
    kvs_memory_fault f = {KVS_MEMORY_FAULT_STORE, &keys[1], KVS_EIO, 0};
    CHECK_OK(kvs_memory_adapter_inject(inner, &f));
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 3, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(res.status, KVS_EIO);
    CHECK_EQ_U64(res.bytes_written, 0);
    CHECK_EQ_STR(res.message, "memory: injected store fault on key 1: I/O error");
    CHECK_EQ_INT(in_use(w), 0);
    CHECK_EQ_INT(pool_stat(w, "tasks_in_flight"), 0);
    free_objs(src, 3);
    kvs_l2_destroy(w);
}

/* An inner partial load: that key's bit clear, the others loaded. */
static void test_inner_partial_load(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, &inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_FLOAT16, 2, (int64_t[]){16, 64});
    kvs_object_key keys[3];
    kvs_memobj *src[3], *dst[3];
    keys_range(keys, 0, 3);
    new_objs(src, 3, &l);
    new_objs(dst, 3, &l);
    for (int i = 0; i < 3; i++) fill_exact(src[i], i);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 3, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    kvs_memory_fault f = {KVS_MEMORY_FAULT_LOAD, &keys[1], KVS_EIO, 0};
    CHECK_OK(kvs_memory_adapter_inject(inner, &f));
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 3, &bm));
    CHECK_EQ_STR(bits(&bm), "101");
    CHECK_EQ_INT(bm.nhits, 2);
    CHECK_EQ_INT(bm.status, KVS_EIO);
    CHECK_EQ_STR(bm.message, "memory: injected load fault on key 1: I/O error");
    kvs_l2_bitmap_release(&bm);
    CHECK(same_bytes(src[0], dst[0]));
    CHECK(same_bytes(src[2], dst[2]));
    CHECK_EQ_INT(in_use(w), 0);
    free_objs(src, 3);
    free_objs(dst, 3);
    kvs_l2_destroy(w);
}

/* A failing serializer fails the store with the processor's message; the
 * temps are released and the inner adapter is never called. */
static void test_serializer_failure(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(test_proc(TS_FAIL, 0), 0, &inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){256});
    kvs_object_key keys[2];
    kvs_memobj *src[2];
    keys_range(keys, 0, 2);
    new_objs(src, 2, &l);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 2, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(res.status, KVS_ECORRUPT);
    CHECK_EQ_STR(res.message,
                 "processor: serialize object 0 of 2 failed: tserde: injected serialize failure");
    CHECK_EQ_INT(in_use(w), 0);
    int64_t sizes[2];
    CHECK_OK(kvs_l2_object_sizes(inner, keys, 2, sizes));
    CHECK_EQ_INT(sizes[0], -1);
    CHECK_EQ_INT(sizes[1], -1);
    kvs_l2_task_id iid;
    CHECK_OK(kvs_l2_submit_lookup_and_lock(w, keys, 2, &iid));
    CHECK_EQ_INT(iid, 0); /* the inner's first task */
    kvs_l2_bitmap bm;
    CHECK(wait_bitmap(w, 0, iid, &bm));
    kvs_l2_bitmap_release(&bm);
    free_objs(src, 2);
    kvs_l2_destroy(w);
}

/* A failing deserializer fails every key (even one the inner loaded), with
 * the processor's message; the temps are released. */
static void test_deserializer_failure(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(test_proc(TS_IDENTITY, 1), 0, &inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_FLOAT32, 1, (int64_t[]){100});
    kvs_object_key keys[3];
    kvs_memobj *src[3], *dst[3];
    keys_range(keys, 0, 3);
    new_objs(src, 3, &l);
    new_objs(dst, 3, &l);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 3, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 1200);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 3, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_STR(bits(&bm), "000");
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    /* every key fails on its own: the first one's error */
    CHECK_EQ_STR(bm.message, "serde wrapper: load of key 0: processor: deserialize object 0 "
                             "of 3 failed: tserde: injected deserialize failure");
    kvs_l2_bitmap_release(&bm);
    CHECK_EQ_INT(in_use(w), 0);

    /* with a partial inner load too: every bit clear, the inner's error first */
    kvs_memory_fault f = {KVS_MEMORY_FAULT_LOAD, &keys[0], KVS_EIO, 0};
    CHECK_OK(kvs_memory_adapter_inject(inner, &f));
    CHECK_OK(do_load(w, keys, dst, 3, &bm));
    CHECK_EQ_STR(bits(&bm), "000");
    CHECK_EQ_INT(bm.status, KVS_EIO);
    CHECK_EQ_STR(bm.message, "memory: injected load fault on key 0: I/O error");
    kvs_l2_bitmap_release(&bm);
    /* no key found: nothing to deserialize, the inner's bitmap stands */
    kvs_object_key missing[2];
    keys_range(missing, 50, 2);
    CHECK_OK(do_load(w, missing, dst, 2, &bm));
    CHECK_EQ_STR(bits(&bm), "00");
    CHECK_EQ_INT(bm.status, KVS_ENOTFOUND);
    kvs_l2_bitmap_release(&bm);
    CHECK_EQ_INT(in_use(w), 0);
    free_objs(src, 3);
    free_objs(dst, 3);
    kvs_l2_destroy(w);
}

/* Issue 17 item 4: a load of 4 keys where key 2's stored blob is damaged
 * (stored from 7 tokens, not 8, so fp8's size check refuses it): keys 0, 1
 * and 3 load exactly, key 2's bit alone is clear and its destination
 * untouched, and the task's error is key 2's. */
static void check_one_damaged_blob(kvs_l2_adapter *w)
{
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 4, (int64_t[]){2, 4, 8, 16});
    kvs_layout short_l = layout1(KVS_DTYPE_BFLOAT16, 4, (int64_t[]){2, 4, 7, 16});
    kvs_object_key keys[4];
    kvs_memobj *src[4], *dst[4];
    keys_range(keys, 0, 4);
    new_objs(src, 4, &l);
    new_objs(dst, 4, &l);
    for (int i = 0; i < 4; i++) {
        fill_exact(src[i], i);
        memset(dst[i]->data, 0x5A, dst[i]->capacity);
    }
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 4, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    kvs_memobj *bad = new_obj(&short_l);
    fill_exact(bad, 9);
    CHECK_OK(do_store(w, &keys[2], &bad, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 896);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 4, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_STR(bits(&bm), "1101");
    CHECK_EQ_INT(bm.nhits, 3);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK_EQ_STR(bm.message, "serde wrapper: load of key 2: processor: deserialize object 2 "
                             "of 4 failed: fp8: stored object is 896 bytes, destination "
                             "layout needs 1024");
    kvs_l2_bitmap_release(&bm);
    CHECK(same_bytes(src[0], dst[0]));
    CHECK(same_bytes(src[1], dst[1]));
    CHECK(same_bytes(src[3], dst[3]));
    size_t touched = 0;
    for (size_t b = 0; b < dst[2]->capacity; b++) touched += ((uint8_t *)dst[2]->data)[b] != 0x5A;
    CHECK_EQ_U64(touched, 0);
    CHECK_EQ_INT(in_use(w), 0);
    kvs_memobj_free(bad);
    free_objs(src, 4);
    free_objs(dst, 4);
}

static void test_one_damaged_blob_memory(void)
{
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    check_one_damaged_blob(w);
    /* Keys 0 and 2 damaged: the batch is resubmitted after each; key 0's
     * error is the task's. */
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 4, (int64_t[]){2, 4, 8, 16});
    kvs_layout long_l = layout1(KVS_DTYPE_BFLOAT16, 4, (int64_t[]){2, 4, 9, 16});
    kvs_object_key keys[4];
    keys_range(keys, 0, 4);
    kvs_memobj *bad = new_obj(&long_l), *dst[4];
    fill_exact(bad, 5);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, &keys[0], &bad, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    new_objs(dst, 4, &l);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 4, &bm));
    CHECK_EQ_STR(bits(&bm), "0101");
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK_EQ_STR(bm.message, "serde wrapper: load of key 0: processor: deserialize object 0 "
                             "of 4 failed: fp8: stored object is 1152 bytes, destination "
                             "layout needs 1024");
    kvs_l2_bitmap_release(&bm);
    kvs_memobj *ref[4];
    new_objs(ref, 4, &l);
    fill_exact(ref[1], 1);
    fill_exact(ref[3], 3);
    CHECK(same_bytes(ref[1], dst[1]) && same_bytes(ref[3], dst[3]));
    CHECK_EQ_INT(in_use(w), 0);
    kvs_memobj_free(bad);
    free_objs(dst, 4);
    free_objs(ref, 4);
    kvs_l2_destroy(w);
}

static void test_one_damaged_blob_fs(void)
{
    char dir[64];
    REQUIRE(make_tmpdir(dir) == 0);
    kvs_l2_adapter *fs = fs_adapter(dir), *w = NULL;
    REQUIRE(fs != NULL);
    REQUIRE_OK(kvs_serde_wrapper_create(fs, fp8_proc(), NULL, &w));
    nstash = 0;
    check_one_damaged_blob(w);
    kvs_l2_destroy(w);
    rm_rf(dir);
}

/* J68/J69 on memory: a serde with estimate 64 that writes 8 bytes: temps
 * are sized 64 (one batch), the inner stores 8 bytes per key, a load gives
 * back the first 8 bytes and zeros. */
static void test_variable_size_payload_memory(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(test_proc(TS_PREFIX, 0), 0, &inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_UINT8, 1, (int64_t[]){16});
    kvs_object_key keys[3];
    kvs_memobj *src[3], *dst[3];
    keys_range(keys, 0, 3);
    new_objs(src, 3, &l);
    new_objs(dst, 3, &l);
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 16; b++) ((uint8_t *)src[i]->data)[b] = (uint8_t)(b + i);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 3, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 24);
    CHECK_EQ_INT(pool_stat(w, "peak_in_use_bytes"), 3 * 64);
    int64_t sizes[3];
    CHECK_OK(kvs_l2_object_sizes(w, keys, 3, sizes)); /* passes through */
    for (int i = 0; i < 3; i++) CHECK_EQ_INT(sizes[i], 8);
    for (int i = 0; i < 3; i++) memset(dst[i]->data, 0xAA, 16);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 3, &bm));
    CHECK_EQ_STR(bits(&bm), "111");
    kvs_l2_bitmap_release(&bm);
    for (int i = 0; i < 3; i++) {
        const uint8_t *d = dst[i]->data;
        for (int b = 0; b < 8; b++) CHECK_EQ_INT(d[b], b + i);
        for (int b = 8; b < 16; b++) CHECK_EQ_INT(d[b], 0);
    }
    CHECK_EQ_INT(in_use(w), 0);
    free_objs(src, 3);
    free_objs(dst, 3);
    kvs_l2_destroy(w);
}

/* ---------------------------------------------------------------------
 * I and J on the filesystem adapter
 * ------------------------------------------------------------------ */

/* J72: on the fs adapter, the stored file of a 16-byte arange object holds
 * the 8 bytes written; a load restores them and zeros the rest. */
static void test_variable_size_payload_fs(void)
{
    char dir[64];
    REQUIRE(make_tmpdir(dir) == 0);
    kvs_l2_adapter *fs = fs_adapter(dir);
    if (fs == NULL) {
        fprintf(stderr, "fs adapter: %s\n", kvs_last_error());
        CHECK(fs != NULL);
        rm_rf(dir);
        return;
    }
    kvs_l2_adapter *w = NULL;
    REQUIRE_OK(kvs_serde_wrapper_create(fs, test_proc(TS_PREFIX, 0), NULL, &w));
    nstash = 0;
    kvs_layout l = layout1(KVS_DTYPE_UINT8, 1, (int64_t[]){16});
    kvs_object_key key = key_of(7);
    kvs_memobj *src = new_obj(&l), *dst = new_obj(&l);
    for (int b = 0; b < 16; b++) ((uint8_t *)src->data)[b] = (uint8_t)b;
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, &key, &src, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 8);
    long long sizes[8];
    size_t nfiles = list_files(dir, sizes, 8);
    CHECK_EQ_INT(nfiles, 1);
    if (nfiles == 1) CHECK_EQ_INT(sizes[0], 8);
    int64_t osize = 0;
    CHECK_OK(kvs_l2_object_sizes(w, &key, 1, &osize));
    CHECK_EQ_INT(osize, 8);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, &key, &dst, 1, &bm));
    CHECK_EQ_STR(bits(&bm), "1");
    kvs_l2_bitmap_release(&bm);
    for (int b = 0; b < 16; b++) CHECK_EQ_INT(((uint8_t *)dst->data)[b], b < 8 ? b : 0);
    CHECK_EQ_INT(in_use(w), 0);
    kvs_memobj_free(src);
    kvs_memobj_free(dst);
    kvs_l2_destroy(w);
    rm_rf(dir);
}

/* I66: fs + fp8 from a JSON spec: randn [2,4,256,128] bf16, 2 keys; files
 * appear; a restart (new fs adapter + wrapper on the same directory) finds
 * and loads them within fp8 error. */
static void test_fs_fp8_restart(void)
{
    char dir[64], spec[256];
    REQUIRE(make_tmpdir(dir) == 0);
    snprintf(spec, sizeof spec,
             "{\"type\": \"fs\", \"path\": \"%s\", \"serde\": {\"type\": \"fp8\"}}", dir);
    kvs_l2_adapter *w = NULL;
    if (kvs_l2_create(spec, &w) != KVS_OK) {
        fprintf(stderr, "fs adapter: %s\n", kvs_last_error());
        CHECK(0);
        rm_rf(dir);
        return;
    }
    nstash = 0;
    json_t *st = NULL;
    CHECK_OK(kvs_l2_status(w, &st));
    CHECK(json_is_true(json_object_get(st, "serde_wrapped")));
    CHECK_EQ_STR(json_string_value(json_object_get(st, "type")), "fs");
    json_decref(st);

    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 4, (int64_t[]){2, 4, 256, 128});
    kvs_object_key keys[2];
    kvs_memobj *src[2], *dst[2];
    keys_range(keys, 0, 2);
    new_objs(src, 2, &l);
    new_objs(dst, 2, &l);
    fill_randn(src[0], 0);
    fill_randn(src[1], 1);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 2, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 2 * 262144);
    long long sizes[8];
    CHECK_EQ_INT(list_files(dir, sizes, 8), 2);
    CHECK_EQ_INT(sizes[0], 262144);
    kvs_l2_destroy(w);

    w = NULL;
    REQUIRE_OK(kvs_l2_create(spec, &w));
    nstash = 0;
    kvs_l2_bitmap bm;
    CHECK_OK(do_lookup(w, keys, 2, &bm));
    CHECK_EQ_STR(bits(&bm), "11");
    kvs_l2_bitmap_release(&bm);
    CHECK_OK(kvs_l2_unlock(w, keys, 2));
    CHECK_OK(do_load(w, keys, dst, 2, &bm));
    CHECK_EQ_STR(bits(&bm), "11");
    kvs_l2_bitmap_release(&bm);
    for (int i = 0; i < 2; i++) {
        double corr = 0;
        CHECK(within_fp8(src[i], dst[i], &corr));
        CHECK(corr > 0.95);
    }
    CHECK_EQ_INT(in_use(w), 0);
    free_objs(src, 2);
    free_objs(dst, 2);
    kvs_l2_destroy(w);
    rm_rf(dir);
}

/* Keys that try to escape the directory stay inside it, each its own. */
static void test_fs_escaping_keys(void)
{
    char top[64], dir[128], spec[512];
    REQUIRE(make_tmpdir(top) == 0);
    snprintf(dir, sizeof dir, "%s/store", top);
    snprintf(spec, sizeof spec,
             "{\"type\": \"fs\", \"path\": \"%s\", \"serde\": {\"type\": \"fp8\"}}", dir);
    kvs_l2_adapter *w = NULL;
    if (kvs_l2_create(spec, &w) != KVS_OK) {
        fprintf(stderr, "fs adapter: %s\n", kvs_last_error());
        CHECK(0);
        rm_rf(top);
        return;
    }
    nstash = 0;
    const char *models[4] = {"meta-llama/Llama-3-8B", "..", "../../escape", "/abs/path"};
    kvs_object_key keys[4];
    for (int i = 0; i < 4; i++)
        CHECK_OK(kvs_object_key_init(&keys[i], "..", 2, models[i], 0, 0, NULL));
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){64});
    kvs_memobj *src[4], *dst[4];
    new_objs(src, 4, &l);
    new_objs(dst, 4, &l);
    for (int i = 0; i < 4; i++) fill_exact(src[i], i);
    store_and_load_all(w, keys, src, dst, 4);
    /* everything is under top/store */
    CHECK_EQ_INT(list_files(dir, NULL, 0), 4);
    CHECK_EQ_INT(list_files(top, NULL, 0), 4);
    free_objs(src, 4);
    free_objs(dst, 4);
    kvs_l2_destroy(w);
    rm_rf(top);
}

/* ---------------------------------------------------------------------
 * Contracts: refusals, ids, empty batches, pass-through, status, close
 * ------------------------------------------------------------------ */

static void test_mixed_layouts_refused(void)
{
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    kvs_layout a = layout1(KVS_DTYPE_BFLOAT16, 2, (int64_t[]){4, 8});
    kvs_layout b = layout1(KVS_DTYPE_FLOAT16, 2, (int64_t[]){4, 8});
    kvs_object_key keys[3];
    kvs_memobj *objs[3] = {new_obj(&a), new_obj(&a), new_obj(&b)};
    keys_range(keys, 0, 3);
    kvs_l2_task_id id = 77;
    CHECK_ERR(kvs_l2_submit_store(w, keys, objs, 3, &id), KVS_EINVAL,
              "serde wrapper: object 2 has layout [4x8 float16] but object 0 has "
              "[4x8 bfloat16]");
    CHECK_ERR(kvs_l2_submit_load(w, keys, objs, 3, &id), KVS_EINVAL,
              "serde wrapper: object 2 has layout [4x8 float16] but object 0 has "
              "[4x8 bfloat16]");
    CHECK_EQ_INT(id, 77);
    /* nothing queued, no id used */
    size_t count = 9;
    kvs_l2_store_result res;
    CHECK_OK(kvs_l2_pop_completed_stores(w, &res, 1, &count));
    CHECK_EQ_INT(count, 0);
    CHECK_OK(kvs_l2_submit_store(w, keys, objs, 2, &id));
    CHECK_EQ_INT(id, 0);
    CHECK(wait_store(w, id, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    /* the checked call's argument errors come first */
    CHECK_ERR(kvs_l2_submit_store(w, keys, NULL, 3, &id), KVS_EINVAL,
              "l2: object array is NULL with 3 objects");
    free_objs(objs, 3);
    kvs_l2_destroy(w);
}

/* An empty batch is a task that succeeds at once and signals; ids are one
 * counter shared by stores and loads. */
static void test_empty_batches_and_ids(void)
{
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    kvs_l2_task_id id;
    CHECK_OK(kvs_l2_submit_store(w, NULL, NULL, 0, &id));
    CHECK_EQ_INT(id, 0);
    struct pollfd p = {kvs_l2_store_event_fd(w), POLLIN, 0};
    CHECK_EQ_INT(poll(&p, 1, 0), 1);
    kvs_l2_store_result res;
    size_t count = 0;
    CHECK_OK(kvs_l2_pop_completed_stores(w, &res, 1, &count));
    CHECK_EQ_INT(count, 1);
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 0);

    CHECK_OK(kvs_l2_submit_load(w, NULL, NULL, 0, &id));
    CHECK_EQ_INT(id, 1);
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_query_load(w, id, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.nkeys, 0);
    kvs_l2_bitmap_release(&bm);
    CHECK_OK(kvs_l2_query_load(w, id, &bm)); /* popped: pending now */
    CHECK_EQ_INT(bm.state, KVS_TASK_PENDING);

    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){32});
    kvs_memobj *o = new_obj(&l);
    kvs_object_key k = key_of(1);
    CHECK_OK(kvs_l2_submit_store(w, &k, &o, 1, &id));
    CHECK_EQ_INT(id, 2);
    CHECK(wait_store(w, id, &res));
    CHECK_OK(kvs_l2_submit_load(w, &k, &o, 1, &id));
    CHECK_EQ_INT(id, 3);
    CHECK(wait_bitmap(w, 1, id, &bm));
    CHECK_EQ_STR(bits(&bm), "1");
    kvs_l2_bitmap_release(&bm);
    /* distinct fds */
    int sfd = kvs_l2_store_event_fd(w), lfd = kvs_l2_load_event_fd(w),
        kfd = kvs_l2_lookup_event_fd(w);
    CHECK(sfd >= 0 && lfd >= 0 && kfd >= 0);
    CHECK(sfd != lfd && sfd != kfd && lfd != kfd);
    kvs_memobj_free(o);
    kvs_l2_destroy(w);
}

/* Lookup (with its fd), unlock, delete, object sizes and usage are the
 * inner adapter's. */
static void test_pass_through(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, &inner);
    REQUIRE(w != NULL);
    CHECK_EQ_INT(kvs_l2_lookup_event_fd(w), kvs_l2_lookup_event_fd(inner));
    CHECK(kvs_l2_store_event_fd(w) != kvs_l2_store_event_fd(inner));
    CHECK(kvs_l2_load_event_fd(w) != kvs_l2_load_event_fd(inner));

    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){1000});
    kvs_object_key keys[3];
    kvs_memobj *src[2];
    keys_range(keys, 0, 3);
    new_objs(src, 2, &l);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 2, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);

    kvs_l2_bitmap bm;
    CHECK_OK(do_lookup(w, keys, 3, &bm));
    CHECK_EQ_STR(bits(&bm), "110");
    kvs_l2_bitmap_release(&bm);
    uint8_t deleted[2] = {9, 9};
    CHECK_OK(kvs_l2_delete(w, keys, 1, deleted)); /* locked: kept */
    CHECK_EQ_INT(deleted[0], 0);
    CHECK_OK(kvs_l2_unlock(w, keys, 2));
    CHECK_OK(kvs_l2_delete(w, keys, 1, deleted));
    CHECK_EQ_INT(deleted[0], 1);
    int64_t sizes[3];
    CHECK_OK(kvs_l2_object_sizes(w, keys, 3, sizes));
    CHECK_EQ_INT(sizes[0], -1);
    CHECK_EQ_INT(sizes[1], 1000);
    CHECK_EQ_INT(sizes[2], -1);
    kvs_l2_usage uw, ui;
    CHECK_OK(kvs_l2_get_usage(w, &uw));
    CHECK_OK(kvs_l2_get_usage(inner, &ui));
    CHECK_EQ_U64(uw.bytes_used, 1000);
    CHECK_EQ_U64(uw.bytes_used, ui.bytes_used);
    CHECK_EQ_U64(uw.capacity, ui.capacity);
    free_objs(src, 2);
    kvs_l2_destroy(w);
}

/* Status: the inner's JSON plus "serde_wrapped" and the pool. */
static void test_status(void)
{
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    json_t *st = NULL;
    CHECK_OK(kvs_l2_status(w, &st));
    CHECK_EQ_STR(json_string_value(json_object_get(st, "type")), "memory");
    CHECK(json_is_true(json_object_get(st, "is_healthy")));
    CHECK(json_is_true(json_object_get(st, "serde_wrapped")));
    json_t *pool = json_object_get(st, "serde_temp_pool");
    CHECK(json_is_object(pool));
    CHECK_EQ_INT(json_integer_value(json_object_get(pool, "capacity_bytes")), 1LL << 30);
    CHECK_EQ_INT(json_integer_value(json_object_get(pool, "in_use_bytes")), 0);
    json_decref(st);
    CHECK_EQ_STR(w->ops->name, "serde");
    kvs_l2_destroy(w);

    /* from a spec, with serde_pool_bytes */
    w = NULL;
    REQUIRE_OK(kvs_l2_create(
        "{\"type\": \"memory\", \"serde\": {\"type\": \"fp8\"}, \"serde_pool_bytes\": 4096}",
        &w));
    nstash = 0;
    CHECK_EQ_STR(w->ops->name, "serde");
    CHECK_EQ_INT(pool_stat(w, "capacity_bytes"), 4096);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){4096});
    kvs_memobj *o = new_obj(&l);
    kvs_object_key k = key_of(0);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, &k, &o, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_FAILED);
    CHECK_EQ_STR(res.message, "serde wrapper: temp pool exhausted: need 6144 bytes for 1 "
                              "temps, 4096 of 4096 free");
    kvs_memobj_free(o);
    kvs_l2_destroy(w);
}

/* The constructor owns inner and serde in every case. */
static void test_create_refused(void)
{
    kvs_l2_adapter *w = NULL, *m = NULL;
    CHECK_ERR(kvs_serde_wrapper_create(NULL, fp8_proc(), NULL, &w), KVS_EINVAL,
              "serde wrapper: NULL inner adapter");
    REQUIRE_OK(kvs_memory_adapter_create(NULL, &m));
    CHECK_ERR(kvs_serde_wrapper_create(m, NULL, NULL, &w), KVS_EINVAL,
              "serde wrapper: NULL serde processor");
    REQUIRE_OK(kvs_memory_adapter_create(NULL, &m));
    CHECK_ERR(kvs_serde_wrapper_create(m, fp8_proc(), NULL, NULL), KVS_EINVAL,
              "serde wrapper: NULL out");
    /* a closed inner adapter has no fds */
    REQUIRE_OK(kvs_memory_adapter_create(NULL, &m));
    CHECK_OK(kvs_l2_close(m));
    CHECK_EQ_INT(kvs_serde_wrapper_create(m, fp8_proc(), NULL, &w), KVS_ECLOSED);
    CHECK(w == NULL);
    /* a closed processor likewise */
    kvs_processor *p = fp8_proc();
    REQUIRE(p != NULL);
    CHECK_OK(kvs_processor_close(p));
    REQUIRE_OK(kvs_memory_adapter_create(NULL, &m));
    CHECK_EQ_INT(kvs_serde_wrapper_create(m, p, NULL, &w), KVS_ECLOSED);
    CHECK(w == NULL);
    /* nested wrappers work */
    kvs_l2_adapter *w1 = mem_wrapper(test_proc(TS_IDENTITY, 0), 0, NULL);
    REQUIRE(w1 != NULL);
    REQUIRE_OK(kvs_serde_wrapper_create(w1, fp8_proc(), NULL, &w));
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){300});
    kvs_memobj *src = new_obj(&l), *dst = new_obj(&l);
    fill_exact(src, 3);
    kvs_object_key k = key_of(3);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, &k, &src, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 300);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, &k, &dst, 1, &bm));
    CHECK_EQ_STR(bits(&bm), "1");
    kvs_l2_bitmap_release(&bm);
    CHECK(same_bytes(src, dst));
    kvs_memobj_free(src);
    kvs_memobj_free(dst);
    kvs_l2_destroy(w);
}

/* Close twice is a no-op; every submit after close is refused; the fds
 * are gone; results read before close stay read. */
static void test_close_twice_and_submit_after_close(void)
{
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){64});
    kvs_memobj *o = new_obj(&l);
    kvs_object_key k = key_of(1);
    CHECK_OK(kvs_l2_close(w));
    CHECK_OK(kvs_l2_close(w));
    kvs_l2_task_id id = 5;
    CHECK_ERR(kvs_l2_submit_store(w, &k, &o, 1, &id), KVS_ECLOSED,
              "serde wrapper: submit after close");
    CHECK_ERR(kvs_l2_submit_load(w, &k, &o, 1, &id), KVS_ECLOSED,
              "serde wrapper: submit after close");
    CHECK_ERR(kvs_l2_submit_store(w, NULL, NULL, 0, &id), KVS_ECLOSED,
              "serde wrapper: submit after close");
    CHECK_ERR(kvs_l2_submit_lookup_and_lock(w, &k, 1, &id), KVS_ECLOSED,
              "serde wrapper: submit after close");
    CHECK_EQ_INT(id, 5);
    CHECK_ERR(kvs_l2_store_event_fd(w), KVS_ECLOSED, "serde wrapper: adapter is closed");
    CHECK_ERR(kvs_l2_load_event_fd(w), KVS_ECLOSED, "serde wrapper: adapter is closed");
    CHECK_ERR(kvs_l2_lookup_event_fd(w), KVS_ECLOSED, "serde wrapper: adapter is closed");
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_query_load(w, 0, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_PENDING);
    size_t count = 9;
    kvs_l2_store_result res;
    CHECK_OK(kvs_l2_pop_completed_stores(w, &res, 1, &count));
    CHECK_EQ_INT(count, 0);
    CHECK_EQ_INT(in_use(w), 0);
    CHECK_OK(kvs_l2_close(w));
    kvs_memobj_free(o);
    kvs_l2_destroy(w);
}

/* Close with stores and loads in flight (in every phase: the inner adapter
 * is slow): each runs to the end, succeeds and signals exactly once; then
 * nothing is held. */
static void test_close_with_tasks_in_flight(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, &inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 2, (int64_t[]){64, 128});
    enum { NT = 4, PER = 2 };
    kvs_object_key keys[2 * NT * PER];
    kvs_memobj *src[2 * NT * PER], *dst[NT * PER];
    keys_range(keys, 0, 2 * NT * PER);
    new_objs(src, 2 * NT * PER, &l);
    new_objs(dst, NT * PER, &l);
    for (int i = 0; i < 2 * NT * PER; i++) fill_exact(src[i], i);
    /* the keys the loads read are stored first */
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys + NT * PER, src + NT * PER, NT * PER, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);

    kvs_memory_fault slow_store = {KVS_MEMORY_FAULT_STORE, NULL, KVS_OK, 100000};
    kvs_memory_fault slow_load = {KVS_MEMORY_FAULT_LOAD, NULL, KVS_OK, 100000};
    CHECK_OK(kvs_memory_adapter_inject(inner, &slow_store));
    CHECK_OK(kvs_memory_adapter_inject(inner, &slow_load));
    /* our own references to the counters survive the wrapper closing its fds */
    int sfd = dup(kvs_l2_store_event_fd(w)), lfd = dup(kvs_l2_load_event_fd(w));
    REQUIRE(sfd >= 0 && lfd >= 0);
    kvs_event_fd_consume(sfd, NULL);
    kvs_event_fd_consume(lfd, NULL);
    kvs_l2_task_id sid[NT], lid[NT];
    for (int t = 0; t < NT; t++) {
        CHECK_OK(kvs_l2_submit_store(w, keys + t * PER, src + t * PER, PER, &sid[t]));
        CHECK_OK(kvs_l2_submit_load(w, keys + NT * PER + t * PER, dst + t * PER, PER,
                                    &lid[t]));
    }
    CHECK(pool_stat(w, "tasks_in_flight") > 0);
    CHECK_OK(kvs_l2_close(w));
    uint64_t ns = 0, nl = 0;
    CHECK_OK(kvs_event_fd_consume(sfd, &ns));
    CHECK_OK(kvs_event_fd_consume(lfd, &nl));
    CHECK_EQ_U64(ns, NT);
    CHECK_EQ_U64(nl, NT);
    close(sfd);
    close(lfd);

    kvs_l2_store_result out[NT + 1];
    size_t count = 0;
    CHECK_OK(kvs_l2_pop_completed_stores(w, out, NT + 1, &count));
    CHECK_EQ_INT(count, NT);
    for (size_t i = 0; i < count; i++) {
        CHECK_EQ_INT(out[i].state, KVS_TASK_OK);
        CHECK_EQ_U64(out[i].bytes_written, PER * 8192);
    }
    for (int t = 0; t < NT; t++) {
        kvs_l2_bitmap bm;
        CHECK_OK(kvs_l2_query_load(w, lid[t], &bm));
        CHECK_EQ_INT(bm.state, KVS_TASK_OK);
        CHECK_EQ_STR(bits(&bm), "11");
        kvs_l2_bitmap_release(&bm);
    }
    for (int i = 0; i < NT * PER; i++) CHECK(same_bytes(src[NT * PER + i], dst[i]));
    CHECK_EQ_INT(in_use(w), 0);
    CHECK_EQ_INT(pool_stat(w, "cached_bytes"), 0);
    CHECK_EQ_INT(pool_stat(w, "tasks_in_flight"), 0);
    free_objs(src, 2 * NT * PER);
    free_objs(dst, NT * PER);
    kvs_l2_destroy(w);
}

/* A completion that lands while a refused submit holds the wrapper's lock
 * is still carried on. A finishing task's hook only marks its phase when
 * the lock is taken, trusting the holder to drain the mark as it lets go:
 * the temp pool's refusal let go without draining, so a load whose inner
 * read finished in that moment was never deserialized nor completed, and
 * close() then waited for it for ever (found by test_faults, one run in
 * about 200 on a busy 2-core host). Here refused submits hammer the lock
 * while a load is in flight, round after round. */
static void test_completion_during_refused_submit(void)
{
    enum { ROUNDS = 2000, SPAM_MAX = 100000 };
    /* 1.5 x 2048 bytes a temp: the load's one fits, the other task's two
     * never do */
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 3 * 3072 / 2, NULL);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){2048});
    kvs_object_key keys[2]; /* key 1 is never stored: its load is refused first */
    kvs_memobj *src[1], *dst[2];
    keys_range(keys, 0, 2);
    new_objs(src, 1, &l);
    new_objs(dst, 2, &l);
    fill_exact(src[0], 1);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    int stuck = 0;
    long refused = 0;
    for (int r = 0; r < ROUNDS && !stuck; r++) {
        kvs_l2_task_id id;
        CHECK_OK(kvs_l2_submit_load(w, keys, dst, 1, &id));
        kvs_l2_bitmap bm = {0};
        int done = 0;
        for (int i = 0; i < SPAM_MAX && !done; i++) {
            kvs_l2_task_id rid;
            kvs_l2_bitmap rb;
            CHECK_OK(kvs_l2_submit_load(w, keys, dst, 2, &rid)); /* the pool refuses it */
            CHECK_OK(kvs_l2_query_load(w, rid, &rb));
            /* a load's refusal: the task done, its keys missed, the reason
             * (the pool's free bytes with the load in flight, or after it) */
            const char *why = "serde wrapper: temp pool exhausted: need 6144 bytes for 2 "
                              "temps, 1536 of 4608 free";
            const char *why_after = "serde wrapper: temp pool exhausted: need 6144 bytes for "
                                    "2 temps, 4608 of 4608 free";
            int ok = rb.state == KVS_TASK_OK && rb.status == KVS_ENOMEM && rb.nhits == 0 &&
                     (strcmp(rb.message, why) == 0 || strcmp(rb.message, why_after) == 0);
            if (!ok) KVS_FAIL_("refused load: state %d status %d '%s'", (int)rb.state,
                               rb.status, rb.message);
            refused += ok;
            kvs_l2_bitmap_release(&rb);
            CHECK_OK(kvs_l2_query_load(w, id, &bm));
            done = bm.state != KVS_TASK_PENDING;
            if (!done) kvs_l2_bitmap_release(&bm);
        }
        if (!done) {
            /* nothing takes the lock now: a mark left behind stays */
            struct timespec ts = {0, 200000000};
            nanosleep(&ts, NULL);
            CHECK_OK(kvs_l2_query_load(w, id, &bm));
            done = bm.state != KVS_TASK_PENDING;
        }
        if (!done) {
            stuck = 1;
            KVS_FAIL_("round %d: the load never completed", r);
            continue;
        }
        CHECK_EQ_INT(bm.state, KVS_TASK_OK);
        CHECK_EQ_STR(bits(&bm), "1");
        kvs_l2_bitmap_release(&bm);
        CHECK(same_bytes(src[0], dst[0]));
    }
    CHECK(stuck || refused >= ROUNDS); /* each round refused at least once */
    if (!stuck) CHECK_OK(kvs_l2_close(w)); /* else close would wait for the lost load */
    free_objs(src, 1);
    free_objs(dst, 2);
    if (!stuck) kvs_l2_destroy(w);
}

/* close() with a load in flight returns once the load has ended, however
 * the load's completions meet close's own holds of the wrapper's lock (a
 * hook that finds it held leaves its phase marked for the holder; close
 * used to sleep on a condition of that lock, where a mark made just before
 * the sleep would have stayed: a window these rounds did not hit in 5 runs
 * of the old code alone, so this guards the new wait rather than showing
 * the old one's flaw). Rounds of a load submitted and close called
 * at once; close runs on a thread of its own so that a lost load fails the
 * test instead of hanging it. */
struct closer {
    kvs_l2_adapter *w;
    atomic_int done;
    int rc;
};

static void *closer_main(void *arg)
{
    struct closer *c = arg;
    c->rc = kvs_l2_close(c->w);
    atomic_store(&c->done, 1);
    return NULL;
}

static void test_close_meets_completions(void)
{
    enum { ROUNDS = 400 };
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){2048});
    kvs_object_key key;
    kvs_memobj *src[1], *dst[1];
    keys_range(&key, 0, 1);
    new_objs(src, 1, &l);
    new_objs(dst, 1, &l);
    fill_exact(src[0], 3);
    for (int r = 0; r < ROUNDS; r++) {
        kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
        REQUIRE(w != NULL);
        kvs_l2_store_result res;
        CHECK_OK(do_store(w, &key, src, 1, &res));
        CHECK_EQ_INT(res.state, KVS_TASK_OK);
        memset(dst[0]->data, 0, dst[0]->capacity);
        kvs_l2_task_id id;
        CHECK_OK(kvs_l2_submit_load(w, &key, dst, 1, &id));
        struct closer c = {w, 0, KVS_OK};
        pthread_t th;
        REQUIRE(pthread_create(&th, NULL, closer_main, &c) == 0);
        for (int ms = 0; ms < 5000 && !atomic_load(&c.done); ms++) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
        if (!atomic_load(&c.done)) {
            KVS_FAIL_("round %d: close did not return within 5 s", r);
            pthread_detach(th); /* it and the wrapper are lost */
            break;
        }
        pthread_join(th, NULL);
        CHECK_OK(c.rc);
        kvs_l2_bitmap bm;
        CHECK_OK(kvs_l2_query_load(w, id, &bm));
        CHECK_EQ_INT(bm.state, KVS_TASK_OK);
        CHECK_EQ_STR(bits(&bm), "1");
        kvs_l2_bitmap_release(&bm);
        CHECK(same_bytes(src[0], dst[0]));
        kvs_l2_destroy(w);
    }
    free_objs(src, 1);
    free_objs(dst, 1);
}

/* A soak of the paths that meet at the wrapper's lock: one thread stores
 * new keys, three load random ones (stored or not), one reads the status
 * and turns the memory adapter's latency on and off, over a temp pool of
 * 8 temps so that many tasks are refused. Every task must end within 10 s
 * and every hit must hold its key's bytes. Against the temp pool's plain
 * unlocks (before 2026-12-03) its 3 s lost a task in 1 run of 5 alone and
 * in 2 of 3 after the file's other tests (a 10 s harness of this shape: 3
 * of 3); test_completion_during_refused_submit is the sharp test of that,
 * this one guards the paths around it. KVS_SOAK_SECONDS sets the length
 * (default 3). */
enum { SOAK_ELEMS = 2048, SOAK_STORE_KEYS = 1 << 20 };

struct soak {
    kvs_l2_adapter *w, *inner;
    kvs_layout l;
    atomic_int stop, failed, stored; /* keys [0, stored) are stored */
    atomic_long loads, hits, refusals;
};

static void soak_fail(struct soak *s, const char *what, long long a, long long b)
{
    if (atomic_fetch_add(&s->failed, 1) == 0) KVS_FAIL_("soak: %s (%lld, %lld)", what, a, b);
    atomic_store(&s->stop, 1);
}

static void *soak_loader(void *arg)
{
    struct soak *s = arg;
    unsigned seed = (unsigned)(uintptr_t)&seed;
    kvs_memobj *dst[3], *want = new_obj(&s->l);
    new_objs(dst, 3, &s->l);
    while (!atomic_load(&s->stop)) {
        int n = 1 + (int)(rand_r(&seed) % 3), ids[3], upto = atomic_load(&s->stored);
        kvs_object_key keys[3];
        for (int i = 0; i < n; i++) {
            ids[i] = (int)(rand_r(&seed) % (unsigned)(upto + 4));
            keys[i] = key_of(ids[i]);
            memset(dst[i]->data, 0xAB, kvs_memobj_size(dst[i]));
        }
        kvs_l2_task_id id;
        kvs_l2_bitmap bm;
        if (kvs_l2_submit_load(s->w, keys, dst, (size_t)n, &id) != KVS_OK) {
            soak_fail(s, "a load refused at submit", n, 0);
            break;
        }
        /* the loaders share the load fd, and one's read of it takes the
         * others' wake-ups: each looks every ms */
        if (!wait_bitmap_for(s->w, 1, id, &bm, 10000, 1)) {
            soak_fail(s, "a load task never ended within 10 s (task, keys)", (long long)id, n);
            break;
        }
        atomic_fetch_add(&s->loads, 1);
        atomic_fetch_add(&s->refusals, bm.status == KVS_ENOMEM);
        for (int i = 0; i < n; i++) {
            if (bm.hits && bm.hits[i]) {
                atomic_fetch_add(&s->hits, 1);
                fill_exact(want, ids[i]);
                if (!same_bytes(dst[i], want)) soak_fail(s, "a hit with wrong bytes", ids[i], 0);
            } else if (ids[i] < upto && !(bm.status < 0 && bm.message[0])) {
                soak_fail(s, "a stored key missed without an error (key, status)", ids[i],
                          bm.status);
            }
        }
        kvs_l2_bitmap_release(&bm);
    }
    free_objs(dst, 3);
    kvs_memobj_free(want);
    return NULL;
}

static void *soak_storer(void *arg)
{
    struct soak *s = arg;
    unsigned seed = 7;
    kvs_memobj *src[3];
    new_objs(src, 3, &s->l);
    int next = 0;
    while (!atomic_load(&s->stop) && next < SOAK_STORE_KEYS) {
        int n = 1 + (int)(rand_r(&seed) % 3);
        kvs_object_key keys[3];
        for (int i = 0; i < n; i++) {
            keys[i] = key_of(next + i);
            fill_exact(src[i], next + i);
        }
        kvs_l2_task_id id;
        kvs_l2_store_result r;
        if (kvs_l2_submit_store(s->w, keys, src, (size_t)n, &id) != KVS_OK) {
            soak_fail(s, "a store refused at submit", n, 0);
            break;
        }
        if (!wait_store(s->w, id, &r)) { /* this thread is the only one popping */
            soak_fail(s, "a store task never ended within 30 s (task, keys)", (long long)id, n);
            break;
        }
        if (r.state == KVS_TASK_OK) atomic_store(&s->stored, next += n);
        else if (r.status == KVS_ENOMEM) atomic_fetch_add(&s->refusals, 1);
        else soak_fail(s, "a store failed (status, keys)", r.status, n);
    }
    free_objs(src, 3);
    return NULL;
}

static void *soak_chaos(void *arg)
{
    struct soak *s = arg;
    unsigned seed = 99;
    while (!atomic_load(&s->stop)) {
        json_t *st = NULL;
        if (kvs_l2_status(s->w, &st) == KVS_OK) json_decref(st);
        unsigned r = rand_r(&seed) % 100;
        if (r < 3) {
            kvs_memory_fault f = {(kvs_memory_fault_op)(rand_r(&seed) % 3), NULL, KVS_OK,
                                  rand_r(&seed) % 300};
            CHECK_OK(kvs_memory_adapter_inject(s->inner, &f));
        } else if (r < 6) {
            CHECK_OK(kvs_memory_adapter_clear_faults(s->inner));
        }
        struct timespec ts = {0, (long)(rand_r(&seed) % 200) * 1000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_soak_lock_paths(void)
{
    const char *env = getenv("KVS_SOAK_SECONDS");
    int secs = env && atoi(env) > 0 ? atoi(env) : 3;
    static struct soak s;
    memset(&s, 0, sizeof s);
    s.l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){SOAK_ELEMS});
    /* 8 temps of 1.5 x 2048 bytes */
    s.w = mem_wrapper(fp8_proc(), 8 * 3072, &s.inner);
    REQUIRE(s.w != NULL);
    pthread_t th[5];
    void *(*const fn[5])(void *) = {soak_storer, soak_loader, soak_loader, soak_loader,
                                    soak_chaos};
    for (int i = 0; i < 5; i++) REQUIRE(pthread_create(&th[i], NULL, fn[i], &s) == 0);
    int64_t end = now_ms() + 1000 * (int64_t)secs;
    while (now_ms() < end && !atomic_load(&s.stop)) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    atomic_store(&s.stop, 1);
    for (int i = 0; i < 5; i++) pthread_join(th[i], NULL);
    printf("soak: %d s, %d keys stored, %ld loads, %ld hits, %ld refusals\n", secs,
           atomic_load(&s.stored), atomic_load(&s.loads), atomic_load(&s.hits),
           atomic_load(&s.refusals));
    CHECK_EQ_INT(atomic_load(&s.failed), 0);
    CHECK(atomic_load(&s.stored) > 0 && atomic_load(&s.hits) > 0);
    CHECK(atomic_load(&s.refusals) > 0);
    if (atomic_load(&s.failed) == 0) { /* else a lost task would keep close waiting */
        CHECK_OK(kvs_l2_close(s.w));
        CHECK_EQ_INT(in_use(s.w), 0);
        kvs_l2_destroy(s.w);
    }
}

/* destroy without close, with tasks in flight, leaks nothing. */
static void test_destroy_with_tasks_in_flight(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, &inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){4096});
    kvs_object_key keys[4];
    kvs_memobj *src[4];
    keys_range(keys, 0, 4);
    new_objs(src, 4, &l);
    kvs_memory_fault slow = {KVS_MEMORY_FAULT_STORE, NULL, KVS_OK, 50000};
    CHECK_OK(kvs_memory_adapter_inject(inner, &slow));
    kvs_l2_task_id id;
    for (int i = 0; i < 4; i++) CHECK_OK(kvs_l2_submit_store(w, keys + i, src + i, 1, &id));
    kvs_l2_destroy(w);
    free_objs(src, 4);
}

/* Several client threads at once (for TSan): stores, lookups, loads and
 * closes racing with the poll thread. */
struct client {
    kvs_l2_adapter *w;
    int base;
    int failures;
};

static void *client_main(void *arg)
{
    struct client *c = arg;
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 2, (int64_t[]){8, 32});
    kvs_memobj *src[2], *dst[2];
    new_objs(src, 2, &l);
    new_objs(dst, 2, &l);
    kvs_object_key keys[2];
    for (int round = 0; round < 20; round++) {
        keys_range(keys, c->base + 2 * round, 2);
        fill_exact(src[0], round);
        fill_exact(src[1], round + 1);
        kvs_l2_task_id id;
        if (kvs_l2_submit_store(c->w, keys, src, 2, &id) != KVS_OK) {
            c->failures++;
            continue;
        }
        /* poll for our own store without the shared stash */
        int found = 0;
        int64_t deadline = now_ms() + WAIT_MS;
        while (!found && now_ms() < deadline) {
            kvs_l2_bitmap bm;
            kvs_l2_task_id lid;
            /* a lookup tells us when the store landed */
            if (kvs_l2_submit_lookup_and_lock(c->w, keys, 2, &lid) != KVS_OK) break;
            if (!wait_bitmap(c->w, 0, lid, &bm)) break;
            found = bm.nhits == 2;
            for (size_t i = 0; i < bm.nkeys; i++)
                if (bm.hits[i]) kvs_l2_unlock(c->w, &keys[i], 1);
            kvs_l2_bitmap_release(&bm);
            if (!found) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
        }
        if (!found) {
            c->failures++;
            continue;
        }
        kvs_l2_bitmap bm;
        if (do_load(c->w, keys, dst, 2, &bm) != KVS_OK || bm.nhits != 2 ||
            !same_bytes(src[0], dst[0]) || !same_bytes(src[1], dst[1]))
            c->failures++;
        kvs_l2_bitmap_release(&bm);
    }
    free_objs(src, 2);
    free_objs(dst, 2);
    return NULL;
}

static void test_concurrent_clients(void)
{
    kvs_l2_adapter *w = NULL, *m = NULL;
    kvs_memory_adapter_options mo = {0, 2};
    REQUIRE_OK(kvs_memory_adapter_create(&mo, &m));
    kvs_processor *p = NULL;
    REQUIRE_OK(kvs_serde_create("{\"type\": \"fp8\", \"max_workers\": 2}", &p));
    REQUIRE_OK(kvs_serde_wrapper_create(m, p, NULL, &w));
    enum { NC = 4 };
    struct client cl[NC];
    pthread_t th[NC];
    for (int i = 0; i < NC; i++) {
        cl[i] = (struct client){w, 1000 * (i + 1), 0};
        REQUIRE(pthread_create(&th[i], NULL, client_main, &cl[i]) == 0);
    }
    for (int i = 0; i < NC; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(cl[i].failures, 0);
    }
    /* every store finished; drain them */
    kvs_l2_store_result out[16];
    size_t count, total = 0;
    do {
        CHECK_OK(kvs_l2_pop_completed_stores(w, out, 16, &count));
        for (size_t i = 0; i < count; i++) CHECK_EQ_INT(out[i].state, KVS_TASK_OK);
        total += count;
    } while (count == 16);
    CHECK(total <= NC * 20);
    CHECK_OK(kvs_l2_close(w));
    CHECK_OK(kvs_l2_pop_completed_stores(w, out, 16, &count));
    total += count;
    while (count == 16) {
        CHECK_OK(kvs_l2_pop_completed_stores(w, out, 16, &count));
        total += count;
    }
    CHECK_EQ_INT(total, NC * 20);
    CHECK_EQ_INT(in_use(w), 0);
    kvs_l2_destroy(w);
}

/* Racing closes: all return KVS_OK once the wrapper is closed. */
static void *close_main(void *arg)
{
    return (void *)(intptr_t)kvs_l2_close(arg);
}

static void test_racing_closes(void)
{
    kvs_l2_adapter *inner = NULL;
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, &inner);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 1, (int64_t[]){512});
    kvs_object_key k = key_of(1);
    kvs_memobj *o = new_obj(&l);
    kvs_memory_fault slow = {KVS_MEMORY_FAULT_STORE, NULL, KVS_OK, 50000};
    CHECK_OK(kvs_memory_adapter_inject(inner, &slow));
    kvs_l2_task_id id;
    CHECK_OK(kvs_l2_submit_store(w, &k, &o, 1, &id));
    pthread_t th[3];
    for (int i = 0; i < 3; i++) REQUIRE(pthread_create(&th[i], NULL, close_main, w) == 0);
    for (int i = 0; i < 3; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        CHECK_EQ_INT((int)(intptr_t)rv, KVS_OK);
    }
    kvs_l2_store_result res;
    size_t count = 0;
    CHECK_OK(kvs_l2_pop_completed_stores(w, &res, 1, &count));
    CHECK_EQ_INT(count, 1);
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    kvs_memobj_free(o);
    kvs_l2_destroy(w);
}

/* kvs_l2_list_keys passes through: the inner adapter's keys, which are the
 * caller's (the contract, kvs_test_list.h, on keys stored through the
 * wrapper); the wrapper's own close refuses it. */
static void test_list_keys_passes_through(void)
{
    kvs_l2_adapter *w = mem_wrapper(fp8_proc(), 0, NULL);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 3, (int64_t[]){4, 2, 16});
    enum { N = 12 };
    kvs_object_key keys[N];
    kvs_memobj *src[N];
    keys_range(keys, 0, N);
    new_objs(src, N, &l);
    kvs_l2_store_result res;
    CHECK_OK(do_store(w, keys, src, N, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    kvs_test_list_contract(w, keys, N, "serde wrapper: adapter is closed");
    kvs_l2_destroy(w);
    free_objs(src, N);
}


/* ---------------------------------------------------------------------
 * Phase order and chaining (issue 16 items 4 and 6)
 * ------------------------------------------------------------------ */

/* A processor of another implementation than the async one, so the
 * wrapper cannot hook it and drives it from its poll thread: the identity
 * transform, done at submit, whose tasks finish only when the test
 * releases them (all at once, one eventfd write). It records the thread
 * each submit came from. */
#define MANUAL_MAX 16
struct manual_proc {
    kvs_processor base;
    pthread_mutex_t mu;
    int fd[2];                 /* serialize, deserialize eventfds */
    int auto_release[2];       /* finish at submit, signalling at once */
    uint64_t next_id;
    size_t ntasks;
    struct {
        uint64_t id;
        int dir, released;
    } tasks[MANUAL_MAX];
    size_t nsubmits[2];
    char submit_thread[2][MANUAL_MAX][16];
};

static struct manual_proc *mp_of(kvs_processor *p)
{
    return KVS_CONTAINER_OF(p, struct manual_proc, base);
}

static int mp_ser_fd(kvs_processor *p) { return mp_of(p)->fd[0]; }
static int mp_de_fd(kvs_processor *p) { return mp_of(p)->fd[1]; }

static int mp_submit(kvs_processor *p, int dir, kvs_memobj *const *src,
                     kvs_memobj *const *dst, size_t n, kvs_task_id *id)
{
    struct manual_proc *m = mp_of(p);
    for (size_t i = 0; i < n; i++) {
        size_t bytes = kvs_memobj_size(src[i]);
        if (bytes > dst[i]->capacity)
            return kvs_set_error(KVS_ENOSPC, "manual: destination too small");
        memcpy(dst[i]->data, src[i]->data, bytes);
        if (dir == 0) (void)kvs_memobj_set_used_size(dst[i], bytes);
    }
    pthread_mutex_lock(&m->mu);
    if (m->ntasks == MANUAL_MAX) {
        pthread_mutex_unlock(&m->mu);
        return kvs_set_error(KVS_ENOMEM, "manual: too many tasks");
    }
    *id = m->next_id++;
    m->tasks[m->ntasks].id = *id;
    m->tasks[m->ntasks].dir = dir;
    m->tasks[m->ntasks].released = m->auto_release[dir];
    m->ntasks++;
    if (m->nsubmits[dir] < MANUAL_MAX) {
        char *name = m->submit_thread[dir][m->nsubmits[dir]++];
        if (pthread_getname_np(pthread_self(), name, 16) != 0) snprintf(name, 16, "?");
    }
    if (m->auto_release[dir]) {
        uint64_t one = 1;
        if (write(m->fd[dir], &one, sizeof one) != sizeof one) abort();
    }
    pthread_mutex_unlock(&m->mu);
    return KVS_OK;
}

static int mp_submit_ser(kvs_processor *p, kvs_memobj *const *src, kvs_memobj *const *dst,
                         size_t n, const kvs_object_key *keys, kvs_task_id *id)
{
    (void)keys;
    return mp_submit(p, 0, src, dst, n, id);
}

static int mp_submit_de(kvs_processor *p, kvs_memobj *const *src, kvs_memobj *const *dst,
                        size_t n, const kvs_object_key *keys, kvs_task_id *id)
{
    (void)keys;
    return mp_submit(p, 1, src, dst, n, id);
}

static int mp_query(kvs_processor *p, int dir, kvs_task_id id, kvs_task_result *out)
{
    struct manual_proc *m = mp_of(p);
    memset(out, 0, sizeof *out);
    out->state = KVS_TASK_PENDING;
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->ntasks; i++) {
        if (m->tasks[i].id == id && m->tasks[i].dir == dir && m->tasks[i].released) {
            out->state = KVS_TASK_OK;
            m->tasks[i] = m->tasks[--m->ntasks];
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return KVS_OK;
}

static int mp_query_ser(kvs_processor *p, kvs_task_id id, kvs_task_result *out)
{
    return mp_query(p, 0, id, out);
}

static int mp_query_de(kvs_processor *p, kvs_task_id id, kvs_task_result *out)
{
    return mp_query(p, 1, id, out);
}

static int mp_estimate(kvs_processor *p, const kvs_layout *l, size_t *nbytes)
{
    (void)p;
    *nbytes = (size_t)kvs_layout_nbytes(l);
    return KVS_OK;
}

static int mp_close(kvs_processor *p)
{
    (void)p;
    return KVS_OK;
}

static void mp_destroy(kvs_processor *p)
{
    struct manual_proc *m = mp_of(p);
    close(m->fd[0]);
    close(m->fd[1]);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static const struct kvs_processor_ops manual_ops = {
    .name = "manual",
    .serialize_event_fd = mp_ser_fd,
    .deserialize_event_fd = mp_de_fd,
    .submit_serialize = mp_submit_ser,
    .query_serialize_result = mp_query_ser,
    .submit_deserialize = mp_submit_de,
    .query_deserialize_result = mp_query_de,
    .estimate_serialized_size = mp_estimate,
    .close = mp_close,
    .destroy = mp_destroy,
};

static struct manual_proc *manual_proc_new(int auto_ser, int auto_de)
{
    struct manual_proc *m = calloc(1, sizeof *m);
    if (m == NULL) abort();
    m->base.ops = &manual_ops;
    pthread_mutex_init(&m->mu, NULL);
    m->fd[0] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    m->fd[1] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (m->fd[0] < 0 || m->fd[1] < 0) abort();
    m->auto_release[0] = auto_ser;
    m->auto_release[1] = auto_de;
    return m;
}

/* Finish every unreleased task of the direction at once: one eventfd
 * write of their count, so the wrapper sees them in one drain. */
static size_t manual_release_all(struct manual_proc *m, int dir)
{
    pthread_mutex_lock(&m->mu);
    uint64_t n = 0;
    for (size_t i = 0; i < m->ntasks; i++)
        if (m->tasks[i].dir == dir && !m->tasks[i].released) {
            m->tasks[i].released = 1;
            n++;
        }
    if (n && write(m->fd[dir], &n, sizeof n) != sizeof n) abort();
    pthread_mutex_unlock(&m->mu);
    return (size_t)n;
}

static size_t manual_submits(struct manual_proc *m, int dir)
{
    pthread_mutex_lock(&m->mu);
    size_t n = m->nsubmits[dir];
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* Tasks whose serialize finishes at the same moment move on to the inner
 * store in submission order, so their stores finish, and are popped, oldest
 * first (l2.h). Adding at the head of the phase list moved them on newest
 * first: the pops came 4, 3, 2, 1, 0. */
static void test_phase_order_is_submission_order(void)
{
    struct manual_proc *mp = manual_proc_new(0, 1);
    kvs_l2_adapter *w = mem_wrapper(&mp->base, 0, NULL);
    REQUIRE(w != NULL);
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 2, (int64_t[]){4, 8});
    enum { NT = 5 };
    kvs_object_key keys[NT];
    kvs_memobj *src[NT];
    keys_range(keys, 0, NT);
    new_objs(src, NT, &l);
    kvs_l2_task_id ids[NT];
    for (int t = 0; t < NT; t++) {
        fill_exact(src[t], t);
        CHECK_OK(kvs_l2_submit_store(w, &keys[t], &src[t], 1, &ids[t]));
        CHECK_EQ_U64(ids[t], (uint64_t)t);
    }
    /* every serialize was submitted inside its store's submit */
    CHECK_EQ_INT(manual_submits(mp, 0), NT);
    CHECK_EQ_INT(pool_stat(w, "tasks_in_flight"), NT);
    CHECK_EQ_INT(manual_release_all(mp, 0), NT);

    kvs_l2_store_result out[NT];
    size_t got = 0;
    int64_t deadline = now_ms() + WAIT_MS;
    while (got < NT && now_ms() < deadline) {
        size_t c = 0;
        CHECK_OK(kvs_l2_pop_completed_stores(w, out + got, NT - got, &c));
        got += c;
        if (c == 0) {
            struct pollfd p = {kvs_l2_store_event_fd(w), POLLIN, 0};
            if (poll(&p, 1, 50) > 0) kvs_event_fd_consume(p.fd, NULL);
        }
    }
    CHECK_EQ_INT(got, NT);
    for (size_t i = 0; i < got; i++) {
        CHECK_EQ_U64(out[i].id, (uint64_t)i);
        CHECK_EQ_INT(out[i].state, KVS_TASK_OK);
        CHECK_EQ_U64(out[i].bytes_written, 64);
    }
    /* and what was stored is each task's own object */
    kvs_memobj *dst[NT];
    new_objs(dst, NT, &l);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, NT, &bm));
    CHECK_EQ_STR(bits(&bm), "11111");
    kvs_l2_bitmap_release(&bm);
    for (int t = 0; t < NT; t++) CHECK(same_bytes(src[t], dst[t]));
    free_objs(src, NT);
    free_objs(dst, NT);
    kvs_l2_destroy(w);
}

/* A thin adapter around a memory adapter that records the thread each
 * submit_store came from. Not a memory adapter itself, so the wrapper
 * polls its fds (the memory adapter's) rather than hooking it. */
struct spy_adapter {
    kvs_l2_adapter base;
    kvs_l2_adapter *m;
    pthread_mutex_t mu;
    size_t nstores;
    char store_thread[MANUAL_MAX][16];
};

static struct spy_adapter *spy_of(kvs_l2_adapter *a)
{
    return KVS_CONTAINER_OF(a, struct spy_adapter, base);
}

static int spy_store_fd(kvs_l2_adapter *a) { return kvs_l2_store_event_fd(spy_of(a)->m); }
static int spy_lookup_fd(kvs_l2_adapter *a) { return kvs_l2_lookup_event_fd(spy_of(a)->m); }
static int spy_load_fd(kvs_l2_adapter *a) { return kvs_l2_load_event_fd(spy_of(a)->m); }

static int spy_submit_store(kvs_l2_adapter *a, const kvs_object_key *keys,
                            kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    struct spy_adapter *s = spy_of(a);
    pthread_mutex_lock(&s->mu);
    if (s->nstores < MANUAL_MAX) {
        char *name = s->store_thread[s->nstores++];
        if (pthread_getname_np(pthread_self(), name, 16) != 0) snprintf(name, 16, "?");
    }
    pthread_mutex_unlock(&s->mu);
    return kvs_l2_submit_store(s->m, keys, objects, n, id);
}

static int spy_pop(kvs_l2_adapter *a, kvs_l2_store_result *out, size_t cap, size_t *count)
{
    return kvs_l2_pop_completed_stores(spy_of(a)->m, out, cap, count);
}

static int spy_submit_lookup(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                             kvs_l2_task_id *id)
{
    return kvs_l2_submit_lookup_and_lock(spy_of(a)->m, keys, n, id);
}

static int spy_query_lookup(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    return kvs_l2_query_lookup_and_lock(spy_of(a)->m, id, out);
}

static int spy_unlock(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n)
{
    return kvs_l2_unlock(spy_of(a)->m, keys, n);
}

static int spy_submit_load(kvs_l2_adapter *a, const kvs_object_key *keys,
                           kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    return kvs_l2_submit_load(spy_of(a)->m, keys, objects, n, id);
}

static int spy_query_load(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    return kvs_l2_query_load(spy_of(a)->m, id, out);
}

static int spy_delete(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                      uint8_t *deleted)
{
    return kvs_l2_delete(spy_of(a)->m, keys, n, deleted);
}

static int spy_sizes(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n, int64_t *sizes)
{
    return kvs_l2_object_sizes(spy_of(a)->m, keys, n, sizes);
}

static int spy_usage(kvs_l2_adapter *a, kvs_l2_usage *out)
{
    return kvs_l2_get_usage(spy_of(a)->m, out);
}

static int spy_status(kvs_l2_adapter *a, json_t **out) { return kvs_l2_status(spy_of(a)->m, out); }
static int spy_close(kvs_l2_adapter *a) { return kvs_l2_close(spy_of(a)->m); }

static void spy_destroy(kvs_l2_adapter *a)
{
    struct spy_adapter *s = spy_of(a);
    kvs_l2_destroy(s->m);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static const struct kvs_l2_adapter_ops spy_ops = {
    .name = "spy",
    .store_event_fd = spy_store_fd,
    .lookup_event_fd = spy_lookup_fd,
    .load_event_fd = spy_load_fd,
    .submit_store = spy_submit_store,
    .pop_completed_stores = spy_pop,
    .submit_lookup_and_lock = spy_submit_lookup,
    .query_lookup_and_lock = spy_query_lookup,
    .unlock = spy_unlock,
    .submit_load = spy_submit_load,
    .query_load = spy_query_load,
    .delete_keys = spy_delete,
    .object_sizes = spy_sizes,
    .usage = spy_usage,
    .status = spy_status,
    .close = spy_close,
    .destroy = spy_destroy,
};

/* Each phase is submitted by the thread that finished the one before it,
 * not handed to the wrapper's poll thread ("kvs-serde-l2"): the processor's
 * worker submits the inner store, the inner adapter's worker submits the
 * deserialize. */
static void test_phases_chain_on_the_finishing_thread(void)
{
    kvs_layout l = layout1(KVS_DTYPE_BFLOAT16, 2, (int64_t[]){4, 8});
    kvs_object_key keys[2];
    keys_range(keys, 0, 2);
    kvs_memobj *src[2], *dst[2];
    new_objs(src, 2, &l);
    new_objs(dst, 2, &l);
    fill_exact(src[0], 1);
    fill_exact(src[1], 2);
    kvs_l2_bitmap bm0;

    /* store: an async (hookable) processor, an inner it cannot hook */
    struct spy_adapter *spy = calloc(1, sizeof *spy);
    REQUIRE(spy != NULL);
    spy->base.ops = &spy_ops;
    pthread_mutex_init(&spy->mu, NULL);
    REQUIRE(kvs_memory_adapter_create(NULL, &spy->m) == KVS_OK);
    kvs_l2_adapter *w = NULL;
    REQUIRE(kvs_serde_wrapper_create(&spy->base, test_proc(TS_IDENTITY, 0), NULL, &w) ==
            KVS_OK);
    nstash = 0;
    kvs_l2_store_result res;
    for (int i = 0; i < 2; i++) {
        CHECK_OK(do_store(w, &keys[i], &src[i], 1, &res));
        CHECK_EQ_INT(res.state, KVS_TASK_OK);
    }
    /* an object over the inline limit (128 KiB both sides): its serialize
     * runs on the processor's worker, which then submits the store */
    kvs_layout big = layout1(KVS_DTYPE_BFLOAT16, 2, (int64_t[]){256, 256});
    kvs_memobj *bsrc = new_obj(&big), *bdst = new_obj(&big);
    fill_exact(bsrc, 3);
    kvs_object_key bkey = key_of(9);
    CHECK_OK(do_store(w, &bkey, &bsrc, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    pthread_mutex_lock(&spy->mu);
    CHECK_EQ_INT(spy->nstores, 3);
    /* the small ones were serialized inline, inside the caller's submit */
    CHECK_EQ_STR(spy->store_thread[0], "test_serde_wrap");
    CHECK_EQ_STR(spy->store_thread[1], "test_serde_wrap");
    /* the thread that finished the serialize, or the caller when it still
     * held the wrapper's lock then (inside its submit): never the wrapper's
     * poll thread, which no hooked phase wakes */
    CHECK(strcmp(spy->store_thread[2], "kvs-proc-0") == 0 ||
          strcmp(spy->store_thread[2], "test_serde_wrap") == 0);
    pthread_mutex_unlock(&spy->mu);
    CHECK_OK(do_load(w, &bkey, &bdst, 1, &bm0));
    CHECK_EQ_STR(bits(&bm0), "1");
    kvs_l2_bitmap_release(&bm0);
    CHECK(same_bytes(bsrc, bdst));
    kvs_memobj_free(bsrc);
    kvs_memobj_free(bdst);
    kvs_l2_bitmap bm;
    CHECK_OK(do_load(w, keys, dst, 2, &bm)); /* the poll thread drives this load */
    CHECK_EQ_STR(bits(&bm), "11");
    kvs_l2_bitmap_release(&bm);
    CHECK(same_bytes(src[0], dst[0]) && same_bytes(src[1], dst[1]));
    kvs_l2_destroy(w);

    /* load: a hookable inner (memory), a processor it cannot hook */
    struct manual_proc *mp = manual_proc_new(1, 1);
    w = mem_wrapper(&mp->base, 0, NULL);
    REQUIRE(w != NULL);
    CHECK_OK(do_store(w, keys, src, 2, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    memset(dst[0]->data, 0, dst[0]->capacity);
    memset(dst[1]->data, 0, dst[1]->capacity);
    for (int i = 0; i < 2; i++) {
        CHECK_OK(do_load(w, &keys[i], &dst[i], 1, &bm));
        CHECK_EQ_STR(bits(&bm), "1");
        kvs_l2_bitmap_release(&bm);
    }
    CHECK(same_bytes(src[0], dst[0]) && same_bytes(src[1], dst[1]));
    CHECK_EQ_INT(manual_submits(mp, 1), 2);
    for (size_t i = 0; i < 2; i++) /* as above: the finisher, or the lock's holder */
        CHECK(strcmp(mp->submit_thread[1][i], "kvs-mem-0") == 0 ||
              strcmp(mp->submit_thread[1][i], "test_serde_wrap") == 0);
    /* the serializes were submitted by the caller, inside its submits */
    CHECK_EQ_INT(manual_submits(mp, 0), 1);
    CHECK_EQ_STR(mp->submit_thread[0][0], "test_serde_wrap");
    kvs_l2_destroy(w);
    free_objs(src, 2);
    free_objs(dst, 2);
}

int main(void)
{
    RUN(test_store_load_5_keys_fp8);
    RUN(test_randn_within_fp8_error);
    RUN(test_cycles_hold_no_temps);
    RUN(test_partial_prefix_hit);
    RUN(test_shapes_round_trip);
    RUN(test_multi_group_round_trip);
    RUN(test_pool_runs_out_on_key_1_of_3);
    RUN(test_pool_shared_by_tasks_in_flight);
    RUN(test_pool_cache_stays_in_budget);
    RUN(test_pool_reuses_temps);
    RUN(test_large_store_goes_in_pieces);
    RUN(test_inner_store_failure);
    RUN(test_one_damaged_blob_memory);
    RUN(test_one_damaged_blob_fs);
    RUN(test_inner_partial_load);
    RUN(test_serializer_failure);
    RUN(test_deserializer_failure);
    RUN(test_variable_size_payload_memory);
    RUN(test_variable_size_payload_fs);
    RUN(test_fs_fp8_restart);
    RUN(test_fs_escaping_keys);
    RUN(test_mixed_layouts_refused);
    RUN(test_empty_batches_and_ids);
    RUN(test_pass_through);
    RUN(test_status);
    RUN(test_create_refused);
    RUN(test_close_twice_and_submit_after_close);
    RUN(test_close_with_tasks_in_flight);
    RUN(test_destroy_with_tasks_in_flight);
    RUN(test_concurrent_clients);
    RUN(test_racing_closes);
    RUN(test_completion_during_refused_submit);
    RUN(test_close_meets_completions);
    RUN(test_soak_lock_paths);
    RUN(test_list_keys_passes_through);
    RUN(test_phase_order_is_submission_order);
    RUN(test_phases_chain_on_the_finishing_thread);
    return TEST_SUMMARY();
}
