/* kvserde demo - the tool's main job: synthetic KV-cache chunks shaped like
 * a real model's go through a serde into an L2 adapter and back, and the
 * summary says what it cost and how exact the numbers came back.
 *
 * Data: K has a few large-magnitude outlier channels (as real keys do), V
 * is near-Gaussian; a fixed seed makes every run identical. A chunk is one
 * object of layout [2, layers, tokens, heads x dims] (KV_2LTD).
 *
 * With a K/V serde (a multi-output serde such as kv_split) K and V are
 * reported apart: each one's accuracy and stored bytes. A native K must
 * come back bit-exact, the stored bytes must be exactly the serde's blob
 * sizes, and K16/V8 must carry 0.75x of the raw payload (V-only 0.25x);
 * in mode v_only K is not stored, and the K half of each load target must
 * come back untouched (it is filled with a canary first). */
#include <ftw.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "codecs/half.h"
#include "commands.h"
#include "kvserde/kvserde.h"

typedef struct demo_options {
    long layers, heads, head_dim, tokens, chunks;
    kvs_dtype dtype;
    const char *serde;   /* JSON, or "none" */
    const char *store;   /* directory to keep, or NULL for a temporary one */
    const char *l2;      /* a whole adapter spec, or NULL */
    unsigned long seed;
    double min_cosine;   /* below this a chunk counts as wrong */
    int serde_given;     /* --serde was on the command line */
} demo_options;

static void demo_usage(FILE *out)
{
    fprintf(out,
            "usage: kvserde demo [options]\n\n"
            "Stores synthetic KV-cache chunks through a serde into an L2 adapter, loads\n"
            "them back and verifies them.\n\n"
            "  --layers N      layers per chunk (default 32)\n"
            "  --heads N       KV heads (default 8)\n"
            "  --head-dim N    dims per head (default 128)\n"
            "  --tokens N      tokens per chunk (default 256)\n"
            "  --chunks N      chunks (default 8)\n"
            "  --dtype T       bfloat16 | float16 | float32 (default bfloat16)\n"
            "  --serde JSON    serde config (default {\"type\": \"fp8\"}); \"none\" stores raw.\n"
            "                  A K/V serde such as {\"type\": \"kv_split\"} reports K and V\n"
            "                  apart and checks the stored sizes (kv_split gets\n"
            "                  num_kv_heads from --heads unless given)\n"
            "  --store DIR     filesystem adapter directory to use and keep (default: a\n"
            "                  fresh temporary directory, removed at the end)\n"
            "  --l2 JSON       any adapter spec instead, e.g. {\"type\": \"memory\"}; its\n"
            "                  own \"serde\" key, if any, is used as given\n"
            "  --seed N        data seed (default 1)\n"
            "  --min-cosine X  a chunk whose cosine similarity is below X is wrong\n"
            "                  (default 0.99; a raw store must be exact)\n\n"
            "Exit status: 0 every chunk came back within bounds, 1 a chunk was lost or\n"
            "wrong or a step failed, 2 usage error.\n");
}

/* ---- synthetic data -------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    /* xorshift64*: fast, and plenty for test data */
    *s ^= *s >> 12, *s ^= *s << 25, *s ^= *s >> 27;
    return *s * 2685821657736338717ULL;
}

/* Approximately standard normal: Irwin-Hall sum of 4 uniforms, rescaled. */
static float rng_normal(uint64_t *s)
{
    uint64_t r = rng_next(s);
    float sum = (float)(r & 0xFFFF) + (float)((r >> 16) & 0xFFFF) +
                (float)((r >> 32) & 0xFFFF) + (float)(r >> 48);
    return (sum / 65536.0f - 2.0f) * 1.7320508f; /* var 4/12 -> 1 */
}

static void put_value(void *data, kvs_dtype dtype, size_t i, float v)
{
    switch (dtype) {
    case KVS_DTYPE_BFLOAT16: ((uint16_t *)data)[i] = kvs_f32_to_bf16(v); break;
    case KVS_DTYPE_FLOAT16: ((uint16_t *)data)[i] = kvs_f32_to_f16(v); break;
    default: ((float *)data)[i] = v; break;
    }
}

static float get_value(const void *data, kvs_dtype dtype, size_t i)
{
    switch (dtype) {
    case KVS_DTYPE_BFLOAT16: return kvs_bf16_to_f32(((const uint16_t *)data)[i]);
    case KVS_DTYPE_FLOAT16: return kvs_f16_to_f32(((const uint16_t *)data)[i]);
    default: return ((const float *)data)[i];
    }
}

/* K rows: per-channel scale with a few outlier channels (x8 to x16); V
 * rows: N(0, 0.5). Values stay far below fp8's range limits. */
static void fill_chunk(kvs_memobj *obj, const demo_options *o, long chunk)
{
    uint64_t s = 0x9E3779B97F4A7C15ULL ^ (o->seed * 1000003ULL + (uint64_t)chunk);
    size_t hidden = (size_t)(o->heads * o->head_dim);
    size_t rows = (size_t)(o->layers * o->tokens);
    float *channel_scale = malloc(hidden * sizeof *channel_scale);
    for (size_t c = 0; c < hidden; c++) {
        channel_scale[c] = 0.6f + 0.4f * (float)(rng_next(&s) % 1000) / 1000.0f;
        if (rng_next(&s) % 64 == 0) channel_scale[c] *= 8.0f + (float)(rng_next(&s) % 9);
    }
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < hidden; c++)
            put_value(obj->data, o->dtype, r * hidden + c, rng_normal(&s) * channel_scale[c]);
    size_t v0 = rows * hidden;
    for (size_t i = 0; i < v0; i++) put_value(obj->data, o->dtype, v0 + i, 0.5f * rng_normal(&s));
    free(channel_scale);
}

/* ---- waiting on the adapter ------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wait (at most 120 s) for the store task `id`; 0 and its bytes if ok. */
static int wait_store(kvs_l2_adapter *a, kvs_l2_task_id id, uint64_t *bytes)
{
    double deadline = now_s() + 120;
    while (now_s() < deadline) {
        struct pollfd p = {kvs_l2_store_event_fd(a), POLLIN, 0};
        if (poll(&p, 1, 100) > 0) kvs_event_fd_consume(p.fd, NULL);
        kvs_l2_store_result r[8];
        size_t n = 0;
        kvs_l2_pop_completed_stores(a, r, 8, &n);
        for (size_t i = 0; i < n; i++) {
            if (r[i].id != id) continue;
            if (r[i].state != KVS_TASK_OK) {
                fprintf(stderr, "kvserde demo: store failed: %s\n", r[i].message);
                return -1;
            }
            *bytes = r[i].bytes_written;
            return 0;
        }
    }
    fprintf(stderr, "kvserde demo: store task %llu did not finish in 120 s\n",
            (unsigned long long)id);
    return -1;
}

/* Wait for a lookup (load == 0) or load task's bitmap. */
static int wait_bitmap(kvs_l2_adapter *a, int load, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    double deadline = now_s() + 120;
    while (now_s() < deadline) {
        struct pollfd p = {load ? kvs_l2_load_event_fd(a) : kvs_l2_lookup_event_fd(a), POLLIN,
                           0};
        if (poll(&p, 1, 100) > 0) kvs_event_fd_consume(p.fd, NULL);
        if (load) kvs_l2_query_load(a, id, out);
        else kvs_l2_query_lookup_and_lock(a, id, out);
        if (out->state != KVS_TASK_PENDING) return 0;
    }
    fprintf(stderr, "kvserde demo: %s task %llu did not finish in 120 s\n",
            load ? "load" : "lookup", (unsigned long long)id);
    return -1;
}

static void progress(const char *phase, long done, long total)
{
    if (!isatty(STDERR_FILENO)) return;
    int width = 30, filled = (int)(width * done / (total ? total : 1));
    fprintf(stderr, "\r%-6s [%.*s%*s] %ld/%ld", phase, filled,
            "##############################", width - filled, "", done, total);
    if (done == total) fputc('\n', stderr);
}

/* ---- accuracy -------------------------------------------------------- */

typedef struct accuracy {
    double max_abs, sum_sq_err, sum_sq_ref, dot, sum_sq_out;
    size_t nonfinite; /* a finite original that came back non-finite */
    size_t differing; /* elements not bit-equal */
} accuracy;

/* Elements [from, from + n) of two chunks (n 0: all of them). */
static void compare_range(const kvs_memobj *ref, const kvs_memobj *out, kvs_dtype dtype,
                          size_t from, size_t n, accuracy *acc)
{
    if (n == 0) n = (size_t)kvs_layout_numel(&ref->layout);
    size_t esize = kvs_dtype_size(dtype);
    for (size_t i = from; i < from + n; i++) {
        double a = get_value(ref->data, dtype, i), b = get_value(out->data, dtype, i);
        if (memcmp((const char *)ref->data + i * esize, (const char *)out->data + i * esize,
                   esize) != 0)
            acc->differing++;
        if (!isfinite(b)) {
            acc->nonfinite++;
            continue;
        }
        double e = fabs(a - b);
        if (e > acc->max_abs) acc->max_abs = e;
        acc->sum_sq_err += e * e, acc->sum_sq_ref += a * a;
        acc->dot += a * b, acc->sum_sq_out += b * b;
    }
}

static void compare_chunk(const kvs_memobj *ref, const kvs_memobj *out, kvs_dtype dtype,
                          accuracy *acc)
{
    compare_range(ref, out, dtype, 0, 0, acc);
}

static double cosine(const accuracy *a)
{
    double d = sqrt(a->sum_sq_ref) * sqrt(a->sum_sq_out);
    return d > 0 ? a->dot / d : 1.0;
}

static void add_accuracy(accuracy *total, const accuracy *a)
{
    total->max_abs = fmax(total->max_abs, a->max_abs);
    total->sum_sq_err += a->sum_sq_err, total->sum_sq_ref += a->sum_sq_ref;
    total->dot += a->dot, total->sum_sq_out += a->sum_sq_out;
    total->nonfinite += a->nonfinite, total->differing += a->differing;
}

static double snr_db(const accuracy *a)
{
    return a->sum_sq_err > 0 ? 10 * log10(a->sum_sq_ref / a->sum_sq_err) : INFINITY;
}

/* ---- K/V serdes ------------------------------------------------------- */

#define CANARY 0xA5

/* What the demo knows of a K/V serde (a multi-output serde of group size
 * 2, such as kv_split): whether K is stored and how, and the exact blob
 * size of one chunk (the serde's own estimate, which kv_split makes
 * exact). */
typedef struct kv_serde_info {
    int on;             /* the serde is a K/V serde */
    int k_stored;       /* 0 in mode v_only */
    int k_native, v_native, v_fp8, scoped;
    uint64_t blob_bytes; /* per chunk */
    uint64_t k_payload, v_payload; /* per chunk */
} kv_serde_info;

/* kv_split's per_layer_head scale needs the head count, which the demo
 * knows: --heads, unless the --serde config gives its own. */
static void add_heads(json_t *serde, const demo_options *o)
{
    const char *st = json_string_value(json_object_get(serde, "type"));
    if (st && strcmp(st, "kv_split") == 0 && !json_object_get(serde, "num_kv_heads"))
        json_object_set_new(serde, "num_kv_heads", json_integer(o->heads));
}

/* The serde config in effect: --serde, or the "serde" of --l2 (NULL if
 * none). The caller json_decref()s it. */
static json_t *serde_config(const demo_options *o)
{
    if (o->l2 && !o->serde_given) {
        json_t *spec = json_loads(o->l2, 0, NULL);
        json_t *serde = spec ? json_incref(json_object_get(spec, "serde")) : NULL;
        json_decref(spec);
        return serde;
    }
    if (strcmp(o->serde, "none") == 0) return NULL;
    json_t *serde = json_loads(o->serde, 0, NULL);
    if (json_is_object(serde)) add_heads(serde, o);
    return serde;
}

static const char *kw_string(const json_t *cfg, const char *key, const char *def)
{
    const char *v = json_string_value(json_object_get(cfg, key));
    return v ? v : def;
}

static int kv_serde_probe(const demo_options *o, const kvs_layout *half, kv_serde_info *out)
{
    memset(out, 0, sizeof *out);
    json_t *cfg = serde_config(o);
    kvs_serde_kind kind;
    const char *type = json_string_value(json_object_get(cfg, "type"));
    if (cfg == NULL || type == NULL || kvs_serde_type_kind(type, &kind) != KVS_OK ||
        kind != KVS_SERDE_MULTI) {
        json_decref(cfg);
        return KVS_OK;
    }
    kvs_multi_serde_pair pair;
    int rc = kvs_multi_serde_create_pair_json(cfg, &pair);
    if (rc == KVS_OK && kvs_multi_serializer_group_size(pair.serializer) != 2)
        rc = kvs_set_error(KVS_EINVAL, "serde '%s' takes groups of %zu, not K and V", type,
                           kvs_multi_serializer_group_size(pair.serializer));
    if (rc == KVS_OK) {
        out->on = 1;
        out->k_stored = strcmp(kw_string(cfg, "mode", "kv"), "v_only") != 0;
        out->k_native = strcmp(kw_string(cfg, "k_dtype", "native"), "native") == 0;
        out->v_native = strcmp(kw_string(cfg, "v_dtype", "float8_e4m3fn"), "native") == 0;
        out->v_fp8 = !out->v_native;
        const char *sc = kw_string(cfg, "scale", "per_tensor");
        out->scoped = strcmp(sc, "per_tensor") != 0 && strcmp(sc, "none") != 0;
        const kvs_layout *layouts[2] = {out->k_stored ? half : NULL, half};
        size_t est = 0;
        rc = kvs_multi_estimate_serialized_size(pair.serializer, layouts, 2, &est);
        out->blob_bytes = est;
        uint64_t numel = kvs_layout_numel(half), esize = kvs_dtype_size(half->groups[0].dtype);
        out->k_payload = out->k_stored ? numel * (out->k_native ? esize : 1) : 0;
        out->v_payload = numel * (out->v_native ? esize : 1);
    }
    kvs_multi_serde_pair_destroy(&pair);
    json_decref(cfg);
    return rc;
}

/* ---- the adapter ----------------------------------------------------- */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    return remove(path);
}

/* The adapter: --l2's spec, or an fs adapter in `dir`; --serde goes into
 * either (a spec that has its own "serde" and a --serde are refused, so
 * neither is silently ignored). */
static int make_adapter(const demo_options *o, const char *dir, kvs_l2_adapter **out)
{
    json_t *spec;
    if (o->l2) {
        json_error_t err;
        spec = json_loads(o->l2, JSON_REJECT_DUPLICATES, &err);
        if (spec == NULL)
            return kvs_set_error(KVS_EINVAL, "--l2 is not JSON: %s (column %d)", err.text,
                                 err.column);
        if (o->serde_given && json_object_get(spec, "serde")) {
            json_decref(spec);
            return kvs_set_error(KVS_EINVAL,
                                 "--serde and a \"serde\" inside --l2 both given; use one");
        }
    } else {
        spec = json_pack("{s:s, s:s}", "type", "fs", "path", dir);
    }
    if ((!o->l2 || o->serde_given) && strcmp(o->serde, "none") != 0) {
        json_error_t err;
        json_t *serde = json_loads(o->serde, 0, &err);
        if (serde == NULL) {
            json_decref(spec);
            return kvs_set_error(KVS_EINVAL, "--serde is not JSON: %s (column %d)",
                                 err.text, err.column);
        }
        add_heads(serde, o);
        json_object_set_new(spec, "serde", serde);
    }
    int rc = kvs_l2_create_json(spec, out);
    json_decref(spec);
    return rc;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int kvs_cmd_demo(int argc, char **argv)
{
    demo_options o = {32, 8, 128, 256, 8, KVS_DTYPE_BFLOAT16, "{\"type\": \"fp8\"}", NULL,
                      NULL, 1, 0.99, 0};
    static const struct option longopts[] = {
        {"layers", required_argument, 0, 'L'}, {"heads", required_argument, 0, 'H'},
        {"head-dim", required_argument, 0, 'D'}, {"tokens", required_argument, 0, 'T'},
        {"chunks", required_argument, 0, 'C'}, {"dtype", required_argument, 0, 't'},
        {"serde", required_argument, 0, 's'}, {"store", required_argument, 0, 'o'},
        {"l2", required_argument, 0, 'l'}, {"seed", required_argument, 0, 'r'},
        {"min-cosine", required_argument, 0, 'm'}, {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    optind = 1;
    int c;
    long v = 0;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'L': bad = parse_long(optarg, 1, 1024, &o.layers); break;
        case 'H': bad = parse_long(optarg, 1, 1024, &o.heads); break;
        case 'D': bad = parse_long(optarg, 1, 4096, &o.head_dim); break;
        case 'T': bad = parse_long(optarg, 1, 1 << 20, &o.tokens); break;
        case 'C': bad = parse_long(optarg, 1, 1 << 20, &o.chunks); break;
        case 't':
            bad = kvs_dtype_parse(optarg, &o.dtype) != KVS_OK ||
                  (o.dtype != KVS_DTYPE_BFLOAT16 && o.dtype != KVS_DTYPE_FLOAT16 &&
                   o.dtype != KVS_DTYPE_FLOAT32);
            break;
        case 's': o.serde = optarg, o.serde_given = 1; break;
        case 'o': o.store = optarg; break;
        case 'l': o.l2 = optarg; break;
        case 'r': bad = parse_long(optarg, 0, 1L << 40, &v), o.seed = (unsigned long)v; break;
        case 'm': {
            char *end;
            o.min_cosine = strtod(optarg, &end);
            bad = *optarg == '\0' || *end != '\0' || !(o.min_cosine >= -1 && o.min_cosine <= 1);
            break;
        }
        case 'h': demo_usage(stdout); return 0;
        default: demo_usage(stderr); return 2;
        }
        if (bad) {
            const char *name = "?";
            for (const struct option *lo = longopts; lo->name; lo++)
                if (lo->val == c) name = lo->name;
            fprintf(stderr, "kvserde demo: bad value '%s' for --%s\n\n", optarg, name);
            demo_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "kvserde demo: unexpected argument '%s'\n\n", argv[optind]);
        demo_usage(stderr);
        return 2;
    }
    if (o.store && o.l2) {
        fprintf(stderr, "kvserde demo: --store and --l2 exclude each other\n\n");
        demo_usage(stderr);
        return 2;
    }

    char tmpdir[] = "/tmp/kvserde-demo-XXXXXX";
    const char *dir = o.store;
    if (!o.store && !o.l2) {
        if (mkdtemp(tmpdir) == NULL) {
            perror("kvserde demo: mkdtemp");
            return 1;
        }
        dir = tmpdir;
    }
    int status = 1;
    kvs_l2_adapter *l2 = NULL;
    size_t n = (size_t)o.chunks;
    kvs_memobj **orig = calloc(n, sizeof *orig), **back = calloc(n, sizeof *back);
    kvs_object_key *keys = calloc(n, sizeof *keys);
    kvs_l2_bitmap bm = {0};
    if (!orig || !back || !keys) {
        fprintf(stderr, "kvserde demo: out of memory\n");
        goto out;
    }
    if (make_adapter(&o, dir, &l2) != KVS_OK) {
        fprintf(stderr, "kvserde demo: %s\n", kvs_last_error());
        goto out;
    }

    kvs_layout layout = {0};
    int64_t dims[4] = {2, o.layers, o.tokens, o.heads * o.head_dim};
    if (kvs_layout_add_group(&layout, 4, dims, o.dtype) != KVS_OK) {
        fprintf(stderr, "kvserde demo: %s\n", kvs_last_error());
        goto out;
    }
    uint64_t raw = kvs_layout_nbytes(&layout) * n;
    kvs_layout half = {0};
    kv_serde_info kv;
    if (kvs_layout_add_group(&half, 3, dims + 1, o.dtype) != KVS_OK ||
        kv_serde_probe(&o, &half, &kv) != KVS_OK) {
        fprintf(stderr, "kvserde demo: %s\n", kvs_last_error());
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t hash[8];
        for (int b = 0; b < 8; b++) hash[b] = (uint8_t)((o.seed * 131 + i) >> (8 * (7 - b)));
        if (kvs_object_key_init(&keys[i], hash, sizeof hash, "demo/synthetic-llama", 0, 0, "") ||
            kvs_memobj_alloc(&layout, KVS_FMT_KV_2LTD, &orig[i]) ||
            kvs_memobj_alloc(&layout, KVS_FMT_KV_2LTD, &back[i])) {
            fprintf(stderr, "kvserde demo: %s\n", kvs_last_error());
            goto out;
        }
        fill_chunk(orig[i], &o, (long)i);
        if (kv.on) memset(back[i]->data, CANARY, back[i]->capacity);
        progress("build", (long)i + 1, (long)n);
    }

    /* store, one task per chunk */
    double t0 = now_s();
    uint64_t stored_total = 0;
    for (size_t i = 0; i < n; i++) {
        kvs_l2_task_id id;
        uint64_t bytes = 0;
        if (kvs_l2_submit_store(l2, &keys[i], &orig[i], 1, &id) != KVS_OK) {
            fprintf(stderr, "kvserde demo: store: %s\n", kvs_last_error());
            goto out;
        }
        if (wait_store(l2, id, &bytes)) goto out;
        stored_total += bytes;
        progress("store", (long)i + 1, (long)n);
    }
    double store_s = now_s() - t0;

    /* lookup and lock all, load each, unlock */
    kvs_l2_task_id id;
    if (kvs_l2_submit_lookup_and_lock(l2, keys, n, &id) != KVS_OK || wait_bitmap(l2, 0, id, &bm)) {
        fprintf(stderr, "kvserde demo: lookup: %s\n", kvs_last_error());
        goto out;
    }
    size_t found = bm.nhits;
    kvs_l2_bitmap_release(&bm);
    t0 = now_s();
    size_t loaded = 0;
    for (size_t i = 0; i < n; i++) {
        if (kvs_l2_submit_load(l2, &keys[i], &back[i], 1, &id) != KVS_OK ||
            wait_bitmap(l2, 1, id, &bm)) {
            fprintf(stderr, "kvserde demo: load: %s\n", kvs_last_error());
            goto out;
        }
        if (bm.nhits == 1) loaded++;
        else fprintf(stderr, "kvserde demo: chunk %zu not loaded: %s\n", i, bm.message);
        kvs_l2_bitmap_release(&bm);
        progress("load", (long)i + 1, (long)n);
    }
    double load_s = now_s() - t0;
    kvs_l2_unlock(l2, keys, n);

    /* verify */
    accuracy total = {0}, kacc = {0}, vacc = {0};
    size_t wrong = 0, k_touched = 0;
    int raw_store = !o.l2 && strcmp(o.serde, "none") == 0;
    size_t half_n = (size_t)kvs_layout_numel(&half);
    size_t half_b = (size_t)kvs_layout_nbytes(&half);
    for (size_t i = 0; i < n; i++) {
        accuracy a = {0};
        if (kv.on) {
            /* K and V apart; in v_only K is not stored and must be untouched */
            accuracy ka = {0}, va = {0};
            int bad = 0;
            if (kv.k_stored) {
                compare_range(orig[i], back[i], o.dtype, 0, half_n, &ka);
                bad |= ka.nonfinite || cosine(&ka) < o.min_cosine ||
                       (kv.k_native && ka.differing);
                add_accuracy(&kacc, &ka);
                add_accuracy(&a, &ka);
            } else {
                const uint8_t *kb = back[i]->data;
                for (size_t b = 0; b < half_b; b++)
                    if (kb[b] != CANARY) {
                        k_touched++, bad = 1;
                        break;
                    }
            }
            compare_range(orig[i], back[i], o.dtype, half_n, half_n, &va);
            bad |= va.nonfinite || cosine(&va) < o.min_cosine || (kv.v_native && va.differing);
            add_accuracy(&vacc, &va);
            add_accuracy(&a, &va);
            if (bad) wrong++;
        } else {
            compare_chunk(orig[i], back[i], o.dtype, &a);
            if (a.nonfinite || cosine(&a) < o.min_cosine || (raw_store && a.differing)) wrong++;
        }
        add_accuracy(&total, &a);
    }
    /* The stored bytes are exactly the blobs' (checked), and K16/V8 and
     * V-only carry 0.75x / 0.25x of the raw payload. */
    int sizes_ok = 1;
    double payload_ratio = 0;
    if (kv.on) {
        sizes_ok = stored_total == kv.blob_bytes * n;
        payload_ratio = (double)(kv.k_payload + kv.v_payload) / (double)(2 * half_b);
    }
    uint64_t numel = (kv.on && !kv.k_stored ? kvs_layout_numel(&half) : kvs_layout_numel(&layout)) * n;
    double rmse = sqrt(total.sum_sq_err / (double)numel);
    double snr = snr_db(&total);
    char lbuf[128];
    printf("kvserde demo\n");
    printf("  adapter      %s\n", o.l2 ? o.l2 : dir);
    printf("  serde        %s\n", o.l2 && !o.serde_given ? "(from --l2)" : o.serde);
    printf("  chunks       %zu x %s (%s)\n", n, kvs_layout_format(&layout, lbuf, sizeof lbuf),
           "KV_2LTD");
    printf("  found        %zu of %zu at lookup, %zu loaded\n", found, n, loaded);
    printf("  raw bytes    %llu\n", (unsigned long long)raw);
    printf("  stored bytes %llu (%.3fx of raw)\n", (unsigned long long)stored_total,
           raw ? (double)stored_total / (double)raw : 0.0);
    if (kv.on) {
        uint64_t hraw = (uint64_t)half_b * n;
        printf("  K stored     %llu of %llu raw bytes (%s)\n",
               (unsigned long long)(kv.k_payload * n), (unsigned long long)hraw,
               !kv.k_stored ? "not stored: mode v_only" : kv.k_native ? "native" : "fp8");
        printf("  V stored     %llu of %llu raw bytes (%s)\n",
               (unsigned long long)(kv.v_payload * n), (unsigned long long)hraw,
               kv.v_native ? "native" : "fp8");
        printf("  blobs        %llu bytes a chunk (%llu of headers, scale tables and "
               "checksum); stored bytes %s the blob sizes\n",
               (unsigned long long)kv.blob_bytes,
               (unsigned long long)(kv.blob_bytes - kv.k_payload - kv.v_payload),
               sizes_ok ? "equal" : "DO NOT equal");
        int k16v8 = kv.k_native && kv.v_fp8 && kvs_dtype_size(o.dtype) == 2;
        if (k16v8)
            printf("  payload      %.3fx of raw K+V (%s must give %s: %s)\n", payload_ratio,
                   kv.k_stored ? "K16/V8" : "V8 only", kv.k_stored ? "0.750x" : "0.250x",
                   payload_ratio == (kv.k_stored ? 0.75 : 0.25) ? "ok" : "WRONG");
        if (k16v8 && payload_ratio != (kv.k_stored ? 0.75 : 0.25)) sizes_ok = 0;
        if (kv.k_stored)
            printf("  K accuracy   %smax abs err %.6g, SNR %.2f dB, cosine %.6f\n",
                   kacc.differing == 0 ? "exact (bit-equal), " : "", kacc.max_abs,
                   snr_db(&kacc), cosine(&kacc));
        else
            printf("  K            not loaded (v_only); its half of every load target %s\n",
                   k_touched ? "WAS WRITTEN" : "untouched (canary intact)");
        printf("  V accuracy   %smax abs err %.6g, SNR %.2f dB, cosine %.6f\n",
               vacc.differing == 0 ? "exact (bit-equal), " : "", vacc.max_abs, snr_db(&vacc),
               cosine(&vacc));
    }
    printf("  store        %.2f GB/s of raw bytes (%.3f s)\n", (double)raw / store_s / 1e9, store_s);
    printf("  load         %.2f GB/s of raw bytes (%.3f s)\n", (double)raw / load_s / 1e9, load_s);
    printf("  max abs err  %.6g\n", total.max_abs);
    printf("  RMSE         %.6g\n", rmse);
    printf("  SNR          %.2f dB\n", snr);
    printf("  cosine sim   %.6f\n", cosine(&total));
    int ok = found == n && loaded == n && wrong == 0 && sizes_ok;
    printf("  result       %s: %zu of %zu chunks back within bounds\n", ok ? "OK" : "FAILED",
           n - wrong, n);
    status = ok ? 0 : 1;

out:
    kvs_l2_destroy(l2);
    for (size_t i = 0; orig && back && i < n; i++) {
        kvs_memobj_free(orig[i]);
        kvs_memobj_free(back[i]);
    }
    free(orig);
    free(back);
    free(keys);
    if (dir == tmpdir) nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return status;
}
