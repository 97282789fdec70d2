/* kvserde eval - run serdes over KV safetensors files and report size,
 * speed and fidelity (docs/cli.md). Each (K or V, layer) slice of the `kv`
 * tensor [2, layers, tokens, hidden] is one object [tokens, hidden] (what a
 * connector stores per layer), or with --objects layer or chunk each layer's
 * K and V or each file's `kv`, serialized and deserialized on this thread:
 * timed in one pass over the files, measured in a second (enum eval_pass). */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "commands.h"
#include "kvserde/kvserde.h"
#include "safetensors.h"

#define MAX_LAYERS 256

const kvs_eval_preset kvs_eval_presets[] = {
    {"raw", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"}]}",
     "the tensor's bytes and a CRC-32C"},
    {"lossless", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\"}]}",
     "byte planes, zstd -1 or raw per plane"},
    {"lossless-max",
     "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\",\"level\":19}]}",
     "byte planes, zstd -19 (slow encode)"},
    {"lossless-rans",
     "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\",\"coder\":\"rans\"}]}",
     "bf16 exponent by rANS per channel group, sign+mantissa raw"},
    {"lossless-rows",
     "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\",\"coder\":\"rans\","
     "\"level\":2}]}",
     "lossless-rans and rows that repeat earlier rows in part (level 2)"},
    {"lossless-signs",
     "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\",\"coder\":\"rans\","
     "\"level\":3}]}",
     "lossless-rows, or signs coded as flips per class of channels (level 3)"},
    {"fp8", "{\"type\":\"fp8\"}", "the plain fp8 serde, e4m3, saturating"},
    {"fp8-pipeline", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"}]}",
     "fp8 codes in a frame"},
    {"fp8-lossless", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"lossless\"}]}",
     "fp8 codes, then the lossless stage"},
    {"ggml_q8_0", "{\"type\":\"ggml_q8_0\"}", "llama.cpp q8_0 blocks (8.5 bits)"},
    {"ggml_q4_0", "{\"type\":\"ggml_q4_0\"}", "llama.cpp q4_0 blocks (4.5 bits)"},
    /* The int stage (docs/frame_format.md). The kivi rows treat K and V apart:
     * measure them with --objects layer (per-slice objects are quantized
     * with the V settings). Figures: eval --objects layer, all 16 kvdata
     * files (docs/performance.md). */
    {"int8", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"int\",\"bits\":8,"
             "\"k_axis\":\"token\",\"zero_point\":false}]}",
     "int8 symmetric, a float16 scale per 64 channels of a token (8.25 bits)"},
    {"int4-kivi", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"int\",\"bits\":4}]}",
     "int4 KIVI: K per channel, V per token, groups of 64, scale and zero (4.5 bits)"},
    {"int2-kivi", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"int\",\"bits\":2,"
                  "\"group\":32}]}",
     "int2 KIVI, groups of 32 (3 bits)"},
    {"int47-had-ll", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"int\",\"bits\":8,"
                     "\"levels\":47,\"k_axis\":\"tensor\",\"v_axis\":\"tensor\","
                     "\"zero_point\":false,\"hadamard\":256},{\"type\":\"lossless\"}]}",
     "Hadamard over 256 channels, one step per K or V, 47 levels, entropy-coded (~4 bits)"},
    {"int21-had-ll", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"int\",\"bits\":8,"
                     "\"levels\":21,\"k_axis\":\"tensor\",\"v_axis\":\"tensor\","
                     "\"zero_point\":false,\"hadamard\":256},{\"type\":\"lossless\"}]}",
     "Hadamard over 256 channels, one step per K or V, 21 levels, entropy-coded (~2.9 bits)"},
    /* The calibrated ladder: "@calibration" stands for the transform file
     * `kvserde eval --calibration` writes; without it these are left out.
     * Steps (in units of each layer's RMS) from docs/fidelity.md. */
    {"xform-1b",
     "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"transform\",\"path\":\"@calibration\","
     "\"step\":0.52}]}",
     "calibrated transform, step 0.52 RMS (kvdata: 1.18 bits, attention 19.7 dB)"},
    {"xform-2b",
     "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"transform\",\"path\":\"@calibration\","
     "\"step\":0.15}]}",
     "calibrated transform, step 0.15 RMS (kvdata: 2.15 bits, 29.5 dB)"},
    {"xform-4b",
     "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"transform\",\"path\":\"@calibration\","
     "\"step\":0.019}]}",
     "calibrated transform, step 0.019 RMS (kvdata: 4.29 bits, 45.6 dB)"},
};

/* The placeholder of the calibrated presets. */
#define CALIBRATION_PLACEHOLDER "@calibration"
const size_t kvs_eval_npresets = sizeof kvs_eval_presets / sizeof kvs_eval_presets[0];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Touch every page of [p, p+n) once, reading (src) or writing zeros, so that
 * the timed calls do not pay the kernel's page faults: a fresh malloc of a
 * few MiB and a mapped file fault a page at a time on first touch, while an
 * engine serializes from resident KV and into pooled buffers. */
static void map_pages(const void *src, void *dst, size_t n)
{
    if (dst) {
        memset(dst, 0, n);
        return;
    }
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < n; i += 4096) sink ^= ((const uint8_t *)src)[i];
    (void)sink;
}

/* Push [p, p+n) out of every level of cache, written back (x86 clflush,
 * aarch64 dc civac; elsewhere nothing), and wait until it is: a timed call
 * finds the caller's buffers in memory, as an engine's are (KV the GPU
 * just copied out, a pooled buffer last used a while ago), while the
 * serde's own memory stays as its previous call left it. */
static void flush_lines(const void *p, size_t n)
{
    const uint8_t *line = (const uint8_t *)((uintptr_t)p & ~(uintptr_t)63);
    const uint8_t *end = (const uint8_t *)p + n;
    for (; n && line < end; line += 64) {
#if defined(__x86_64__) || defined(__i386__)
        _mm_clflush(line);
#elif defined(__aarch64__)
        __asm__ volatile("dc civac, %0" : : "r"(line) : "memory");
#endif
    }
#if defined(__x86_64__) || defined(__i386__)
    _mm_mfence();
#elif defined(__aarch64__)
    __asm__ volatile("dsb ish" : : : "memory");
#endif
}

static float half_to_float(uint16_t h)
{
    uint32_t s = (uint32_t)(h >> 15) << 31, e = (h >> 10) & 31, m = h & 1023;
    float f;
    if (e == 0) {
        f = ldexpf((float)m, -24);
        return s ? -f : f;
    }
    uint32_t bits = e == 31 ? s | 0x7F800000u | m << 13 : s | (e + 112) << 23 | m << 13;
    memcpy(&f, &bits, 4);
    return f;
}

static float to_float(const uint8_t *p, kvs_dtype dt)
{
    uint16_t h;
    uint32_t u;
    float f;
    switch (dt) {
    case KVS_DTYPE_BFLOAT16:
        memcpy(&h, p, 2);
        u = (uint32_t)h << 16;
        memcpy(&f, &u, 4);
        return f;
    case KVS_DTYPE_FLOAT16: memcpy(&h, p, 2); return half_to_float(h);
    case KVS_DTYPE_FLOAT32: memcpy(&f, p, 4); return f;
    default: return 0;
    }
}

/* What one config accumulates. */
typedef struct acc {
    double raw, stored, elems, enc_s, dec_s;
    int exact;
    double sig[2], noise[2], maxabs;
    double asig, anoise, adot, aa, ab;
    int attn;
    int warmed; /* the config's untimed first round trip ran (round_trip) */
    double slice_raw[2][MAX_LAYERS], slice_stored[2][MAX_LAYERS];
    int slice_exact[2][MAX_LAYERS];
    char skipped[600]; /* --sweep: why the preset does not apply to a file */
} acc;

typedef struct opts {
    int json, sweep, per_slice;
    int layer_objects; /* --objects layer: one KV_2TD [2, tokens, hidden] object per layer */
    int chunk_objects; /* --objects chunk: one object per file (its slices not skipped) */
    const char *serde;
    const char *plot; /* --plot FILE.svg */
    int heads, kv_heads, head_dim;
    int skip[2][MAX_LAYERS];
    const char *calibration[MAX_LAYERS]; /* --calibration files */
    int ncalibration;
    char transform_path[64]; /* the transform they gave (a temporary file) */
} opts;

static int usage(FILE *out, int rc)
{
    fprintf(out,
            "usage: kvserde eval [--json] [--per-slice] [--skip k0,v0,...] [--heads N]\n"
            "                    [--kv-heads N] [--head-dim N] [--objects slice|layer|chunk]\n"
            "                    [--calibration FILE]... [--plot FILE.svg]\n"
            "                    (--serde JSON | --sweep) FILE...\n\n"
            "Runs a serde (or, with --sweep, every preset `kvserde list` shows) over the `kv`\n"
            "tensor [2, layers, tokens, hidden] of each file, one object per (K or V, layer)\n"
            "slice, and reports bits per element (every header and scale included), the ratio\n"
            "to the raw bytes, encode and decode GB/s of the raw side on one thread, whether\n"
            "the round trip is bit-exact, K and V SNR, the max abs error and, when the file\n"
            "has `q` [layers, tokens, heads*head_dim], the attention output's SNR and cosine\n"
            "(causal within the chunk). --skip leaves slices out (v0: layer 0 V); --per-slice\n"
            "adds each slice's ratio. Head counts come from __metadata__ (num_heads,\n"
            "num_kv_heads, head_dim) or the flags. --objects layer stores each layer's K and V\n"
            "as one KV_2TD object [2, tokens, hidden] instead (what a serde that treats K and V\n"
            "differently, such as the int stage, needs; --skip then leaves out the layer, and\n"
            "--per-slice reports layers, as KV). --objects chunk stores each file's `kv` as\n"
            "one object, what a cache stores per chunk: the KV_2LTD tensor [2, layers, tokens,\n"
            "hidden], or with --skip the slices left in, in order, as one [slices, tokens,\n"
            "hidden] object (memory format binary); each slice is charged an equal share.\n\n"
            "--calibration FILE (repeatable, or FILE,FILE,...) first calibrates the transform\n"
            "stage on those files (never on the files evaluated: a file given both ways is\n"
            "refused); --sweep then adds the calibrated presets (xform-*), and \"%s\"\n"
            "in --serde stands for that transform. A serde whose typed stage is the\n"
            "transform gets each file's whole `kv` tensor as one KV_2LTD object; each row\n"
            "says \"calibrated\": true for those. --plot writes an SVG of bits per element\n"
            "against SNR (attention output, K and V) for each row.\n", CALIBRATION_PLACEHOLDER);
    return rc;
}

static int parse_skip(const char *s, opts *o)
{
    while (*s) {
        int kv = *s == 'k' || *s == 'K' ? 0 : *s == 'v' || *s == 'V' ? 1 : -1;
        char *end;
        long l = strtol(s + 1, &end, 10);
        if (kv < 0 || end == s + 1 || l < 0 || l >= MAX_LAYERS || (*end && *end != ',')) {
            fprintf(stderr, "kvserde eval: --skip takes a list such as k0,v0; got '%s'\n", s);
            return -1;
        }
        o->skip[kv][l] = 1;
        s = *end ? end + 1 : end;
    }
    return 0;
}

static int meta_int(const kvs_st_file *f, const char *key, int flag)
{
    if (flag > 0) return flag;
    const char *v = kvs_st_meta_get(f, key);
    return v ? atoi(v) : 0;
}

/* softmax(q k^T / sqrt(d)) v for every head of one layer, causal. q:
 * [T, heads*d], k and v: [T, kvh*d] (floats). out: [T, heads*d]. */
static void attention(const float *q, const float *k, const float *v, int T, int heads, int kvh,
                      int d, float *out)
{
    double *w = malloc((size_t)T * sizeof *w);
    int group = heads / kvh;
    double scale = 1.0 / sqrt((double)d);
    for (int h = 0; h < heads; h++) {
        int g = h / group;
        for (int t = 0; t < T; t++) {
            const float *qt = q + (size_t)t * heads * d + (size_t)h * d;
            double mx = -INFINITY;
            for (int s = 0; s <= t; s++) {
                const float *ks = k + (size_t)s * kvh * d + (size_t)g * d;
                double dot = 0;
                for (int i = 0; i < d; i++) dot += (double)qt[i] * ks[i];
                w[s] = dot * scale;
                if (w[s] > mx) mx = w[s];
            }
            double sum = 0;
            for (int s = 0; s <= t; s++) sum += (w[s] = exp(w[s] - mx));
            float *o = out + (size_t)t * heads * d + (size_t)h * d;
            for (int i = 0; i < d; i++) {
                double a = 0;
                for (int s = 0; s <= t; s++) a += w[s] * v[(size_t)s * kvh * d + (size_t)g * d + i];
                o[i] = (float)(a / sum);
            }
        }
    }
    free(w);
}

static void progress(int on, size_t done, size_t total)
{
    if (!on) return;
    int width = 40, fill = total ? (int)(width * done / total) : width;
    fprintf(stderr, "\r[%.*s%*s] %zu/%zu", fill, "========================================",
            width - fill, "", done, total);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

/* 1 if the serde is a pipeline whose typed stage is the transform: it
 * takes the whole [2, layers, tokens, hidden] tensor as one object. */
static int takes_whole_chunk(const char *serde_json)
{
    json_t *cfg = json_loads(serde_json, 0, NULL);
    const json_t *first = json_array_get(json_object_get(cfg, "stages"), 0);
    const char *type = json_string_value(json_object_get(first, "type"));
    int whole = type && strcmp(type, "transform") == 0;
    json_decref(cfg);
    return whole;
}

/* eval_file's two passes over every file of a config (kvs_cmd_eval): the
 * timing pass runs the objects' round trips one after the other, timed,
 * as an engine storing or loading a prompt's chunks calls its serde, with
 * nothing of eval's between them, their data flushed from the caches
 * first (flush_lines); the measuring pass runs them again, untimed, for
 * the sizes, the exactness and the float figures, whose conversions, sums
 * and attention (several MiB through the caches an object) would
 * otherwise evict the serde's scratch and tables before every timed call. */
enum eval_pass { PASS_TIMING, PASS_MEASURE };

/* Serialize and deserialize one object; in the timing pass, timing both. */
static int round_trip(const kvs_serde_pair *p, const void *src, size_t nbytes,
                      const kvs_layout *l, kvs_memory_format fmt, uint8_t *blob, size_t cap,
                      void *back, size_t *n, acc *a, enum eval_pass pass)
{
    kvs_memobj in, bo, out;
    kvs_memobj_init(&in, (void *)src, nbytes, l, fmt);
    kvs_layout bl;
    kvs_layout_flat(&bl, cap, KVS_DTYPE_UINT8);
    kvs_memobj_init(&bo, blob, cap, &bl, KVS_FMT_BINARY);
    kvs_memobj_init(&out, back, nbytes, l, fmt);
    if (pass == PASS_TIMING && !a->warmed) {
        /* A config's first object goes through once untimed: a process's
         * first call maps and fills what a serde keeps for the calls after
         * it (the lossless stage's scratch, tables and held blocks), a cost
         * paid once, not per object (timed, the first chunk at rANS level 3
         * decoded at half the others' speed). */
        a->warmed = 1;
        size_t w = 0;
        if (kvs_serialize(p->serializer, &in, &bo, NULL, &w) == KVS_OK) {
            kvs_memobj_set_used_size(&bo, w);
            (void)kvs_deserialize(p->deserializer, &bo, &out, NULL);
        }
        kvs_memobj_init(&bo, blob, cap, &bl, KVS_FMT_BINARY);
    }
    if (pass == PASS_TIMING) {
        flush_lines(src, nbytes);
        flush_lines(blob, cap);
        flush_lines(back, nbytes);
    }
    double t0 = now_s();
    int rc = kvs_serialize(p->serializer, &in, &bo, NULL, n);
    double t1 = now_s();
    if (rc == KVS_OK) {
        kvs_memobj_set_used_size(&bo, *n);
        rc = kvs_deserialize(p->deserializer, &bo, &out, NULL);
    }
    double t2 = now_s();
    if (pass == PASS_TIMING) {
        a->enc_s += t1 - t0;
        a->dec_s += t2 - t1;
    }
    return rc;
}

/* One file through one config (its serde p, made once for all the files, as
 * an engine keeps its serde) in one pass: 0 (with --sweep also when the
 * config refuses these tensors: a->skipped says why) or -1 (reported). */
static int eval_file(const char *path, const kvs_st_file *f, const char *serde_json,
                     const kvs_serde_pair *p, const opts *o, acc *a, enum eval_pass pass)
{
    int timing = pass == PASS_TIMING;
    const kvs_st_tensor *kv = kvs_st_find(f, "kv");
    kvs_dtype dt;
    if (kv == NULL || kv->ndim != 4 || kv->shape[0] != 2 || kvs_st_dtype_to_kvs(kv->dtype, &dt) ||
        (dt != KVS_DTYPE_BFLOAT16 && dt != KVS_DTYPE_FLOAT16 && dt != KVS_DTYPE_FLOAT32) ||
        kv->shape[1] > MAX_LAYERS) {
        fprintf(stderr, "kvserde eval: %s: no `kv` tensor [2, layers, tokens, hidden] of "
                        "bfloat16, float16 or float32 (at most %d layers)\n",
                path, MAX_LAYERS);
        return -1;
    }
    int L = (int)kv->shape[1], T = (int)kv->shape[2], H = (int)kv->shape[3];
    size_t es = kvs_dtype_size(dt), slice = (size_t)T * H * es;
    /* One object per file (a transform serde, or --objects chunk): the whole
     * KV_2LTD tensor, or, when --skip leaves slices out, the others in
     * order (K layers, then V layers) as one [S, tokens, hidden] object of
     * memory format binary; each slice is charged an equal share of the
     * blob. */
    int whole = takes_whole_chunk(serde_json) || o->chunk_objects, S = 0;
    for (int kvi = 0; whole && kvi < 2; kvi++)
        for (int layer = 0; layer < L; layer++) S += !o->skip[kvi][layer];
    int stacked = whole && S < 2 * L;
    kvs_layout l = {0};
    const int64_t dims[2] = {T, H}, wdims[4] = {2, L, T, H}, sdims[3] = {S, T, H};
    int rc = !whole     ? kvs_layout_add_group(&l, 2, dims, dt)
             : stacked ? kvs_layout_add_group(&l, 3, sdims, dt)
                       : kvs_layout_add_group(&l, 4, wdims, dt);
    size_t cap = 0, wn = 0, bsize = whole ? (size_t)S * slice : slice;
    if (rc == KVS_OK && (!whole || S > 0)) rc = kvs_estimate_serialized_size(p->serializer, &l, &cap);
    if (rc == KVS_EINVAL && o->sweep) {
        /* A preset that cannot take this layout (ggml blocks need a hidden
         * size that is a multiple of 32, a Hadamard rotation one it divides)
         * is reported as skipped, so one
         * preset does not stop the sweep. */
        if (!a->skipped[0]) snprintf(a->skipped, sizeof a->skipped, "%.200s: %.380s", path, kvs_last_error());
        return 0;
    }
    uint8_t *blob = malloc(cap ? cap : 1), *back = malloc(bsize ? bsize : 1);
    uint8_t *stack = stacked ? malloc(bsize ? bsize : 1) : NULL;
    float *orig = timing ? NULL : malloc(sizeof(float) * 2 * (size_t)L * T * H);
    float *rest = timing ? NULL : malloc(sizeof(float) * 2 * (size_t)L * T * H);
    if (rc || !blob || !back || (!timing && (!orig || !rest)) || (stacked && !stack)) {
        fprintf(stderr, "kvserde eval: %s\n", rc ? kvs_last_error() : "out of memory");
        rc = -1;
        goto out;
    }
    for (int kvi = 0, at = 0; stacked && kvi < 2; kvi++)
        for (int layer = 0; layer < L; layer++)
            if (!o->skip[kvi][layer])
                memcpy(stack + (size_t)at++ * slice, kv->data + ((size_t)kvi * L + layer) * slice,
                       slice);
    if (rc == 0) {
        map_pages(kv->data, NULL, 2 * (size_t)L * slice);
        map_pages(NULL, blob, cap);
        map_pages(NULL, back, bsize);
    }
    if (rc == 0 && whole && S > 0) {
        rc = round_trip(p, stacked ? stack : kv->data, bsize, &l,
                        stacked ? KVS_FMT_BINARY : KVS_FMT_KV_2LTD, blob, cap, back, &wn, a,
                        pass);
        if (rc) {
            fprintf(stderr, "kvserde eval: %s: %s\n", path, kvs_last_error());
            rc = -1;
        }
    }
    /* Objects: one slice (K or V of a layer) each, or with --objects layer
     * one KV_2TD [2, T, H] object per layer (both slices copied into pair);
     * or the file's one object above. */
    int layer_objects = o->layer_objects && !whole;
    int nobj_kv = layer_objects ? 1 : 2;
    uint8_t *pair = layer_objects ? malloc(2 * slice + 1) : NULL;
    if (layer_objects && pair == NULL) {
        fprintf(stderr, "kvserde eval: out of memory\n");
        rc = -1;
    }
    kvs_layout ol = l;
    const int64_t dims3[3] = {2, T, H};
    if (layer_objects) {
        memset(&ol, 0, sizeof ol);
        kvs_layout_add_group(&ol, 3, dims3, dt);
    }
    size_t ocap = cap, oslice = slice * (size_t)(3 - nobj_kv);
    if (layer_objects && kvs_estimate_serialized_size(p->serializer, &ol, &ocap) != KVS_OK) {
        fprintf(stderr, "kvserde eval: %s\n", kvs_last_error());
        rc = -1;
    }
    if (rc == 0 && ocap > cap) {
        free(blob);
        blob = malloc(ocap);
        cap = ocap;
        if (blob) map_pages(NULL, blob, cap);
    }
    uint8_t *oback = layer_objects ? malloc(oslice + 1) : back;
    if (layer_objects && oback) map_pages(NULL, oback, oslice);
    int at = 0; /* a whole object's slices so far */
    for (int kvi = 0; kvi < nobj_kv && rc == 0 && blob && oback && !(timing && whole); kvi++)
        for (int layer = 0; layer < L && rc == 0; layer++) {
            size_t idx = (size_t)kvi * L + layer;
            const uint8_t *src = kv->data + idx * slice;
            for (int h = 0; h < 3 - nobj_kv && !timing; h++) {
                size_t ix = (size_t)(kvi + h) * L + layer;
                float *of = orig + ix * T * H;
                const uint8_t *sp = kv->data + ix * slice;
                for (size_t i = 0; i < (size_t)T * H; i++) of[i] = to_float(sp + i * es, dt);
            }
            int skipped = o->skip[kvi][layer] || (layer_objects && o->skip[1][layer]);
            if (skipped && timing) continue;
            if (skipped) {
                for (int h = 0; h < 3 - nobj_kv; h++) {
                    size_t ix = (size_t)(kvi + h) * L + layer;
                    memcpy(rest + ix * T * H, orig + ix * T * H, sizeof(float) * T * H);
                }
                continue;
            }
            if (layer_objects) {
                memcpy(pair, kv->data + (size_t)layer * slice, slice);
                memcpy(pair + slice, kv->data + ((size_t)L + layer) * slice, slice);
                src = pair;
            }
            size_t n = 0;
            const uint8_t *got = oback;
            if (whole) {
                got = back + (size_t)at * slice;
                n = wn / (size_t)S + ((size_t)at < wn % (size_t)S);
                at++;
            } else {
                kvs_memory_format fmt = layer_objects ? KVS_FMT_KV_2TD : KVS_FMT_BINARY;
                rc = round_trip(p, src, oslice, &ol, fmt, blob, cap, oback, &n, a, pass);
            }
            if (rc) {
                fprintf(stderr, "kvserde eval: %s: %s\n", path, kvs_last_error());
                rc = -1;
                break;
            }
            if (timing) continue;
            a->raw += (double)oslice;
            a->stored += (double)n;
            a->elems += (double)(3 - nobj_kv) * T * H;
            int ex = memcmp(src, got, oslice) == 0;
            a->exact &= ex;
            a->slice_raw[kvi][layer] += (double)oslice;
            a->slice_stored[kvi][layer] += (double)n;
            a->slice_exact[kvi][layer] &= ex;
            for (int h = 0; h < 3 - nobj_kv; h++) {
                size_t ix = (size_t)(kvi + h) * L + layer;
                float *of = orig + ix * T * H, *rf = rest + ix * T * H;
                const uint8_t *bk = got + (size_t)h * slice;
                for (size_t i = 0; i < (size_t)T * H; i++) {
                    rf[i] = to_float(bk + i * es, dt);
                    double x = of[i], y = rf[i], e = x - y;
                    if (isnan(x) && isnan(y)) e = 0;
                    a->sig[kvi + h] += x * x;
                    a->noise[kvi + h] += e * e;
                    if (fabs(e) > a->maxabs || isnan(e)) a->maxabs = isnan(e) ? INFINITY : fabs(e);
                }
            }
        }
    if (rc == 0 && (!blob || !oback)) {
        fprintf(stderr, "kvserde eval: out of memory\n");
        rc = -1;
    }
    free(pair);
    if (oback != back) free(oback);
    if (timing) goto out;
    const kvs_st_tensor *q = kvs_st_find(f, "q");
    kvs_dtype qdt;
    int heads = meta_int(f, "num_heads", o->heads), kvh = meta_int(f, "num_kv_heads", o->kv_heads),
        hd = meta_int(f, "head_dim", o->head_dim);
    if (rc == 0 && q && q->ndim == 3 && kvs_st_dtype_to_kvs(q->dtype, &qdt) == 0 &&
        (qdt == KVS_DTYPE_BFLOAT16 || qdt == KVS_DTYPE_FLOAT16 || qdt == KVS_DTYPE_FLOAT32) &&
        (int)q->shape[0] == L && (int)q->shape[1] == T && heads > 0 && kvh > 0 && hd > 0 &&
        heads % kvh == 0 && (int)q->shape[2] == heads * hd && H == kvh * hd) {
        size_t qn = (size_t)T * heads * hd, qes = kvs_dtype_size(qdt);
        float *qf = malloc(sizeof(float) * qn), *ao = malloc(sizeof(float) * qn),
              *ar = malloc(sizeof(float) * qn);
        for (int layer = 0; qf && ao && ar && layer < L; layer++) {
            if (o->skip[0][layer] || o->skip[1][layer]) continue;
            for (size_t i = 0; i < qn; i++)
                qf[i] = to_float(q->data + ((size_t)layer * qn + i) * qes, qdt);
            float *ko = orig + (size_t)layer * T * H, *vo = orig + ((size_t)L + layer) * T * H;
            float *kr = rest + (size_t)layer * T * H, *vr = rest + ((size_t)L + layer) * T * H;
            attention(qf, ko, vo, T, heads, kvh, hd, ao);
            attention(qf, kr, vr, T, heads, kvh, hd, ar);
            for (size_t i = 0; i < qn; i++) {
                double x = ao[i], y = ar[i];
                a->asig += x * x;
                a->anoise += (x - y) * (x - y);
                a->adot += x * y;
                a->aa += x * x;
                a->ab += y * y;
            }
            a->attn = 1;
        }
        free(qf);
        free(ao);
        free(ar);
    }
out:
    free(stack);
    free(blob);
    free(back);
    free(orig);
    free(rest);
    return rc;
}

static json_t *num_or_null(int ok, double v)
{
    return ok && isfinite(v) ? json_real(v) : json_null();
}

static double snr_db(double sig, double noise) { return 10 * log10(sig / noise); }

static json_t *result_json(const char *serde, const char *preset, const acc *a, int L,
                           const opts *o)
{
    json_t *cfg = json_loads(serde, 0, NULL);
    json_t *r = json_object();
    json_object_set_new(r, "serde", cfg ? cfg : json_string(serde));
    json_object_set_new(r, "preset", preset ? json_string(preset) : json_null());
    int whole = takes_whole_chunk(serde);
    int layer_objects = o->layer_objects && !whole; /* a transform serde took chunks whole */
    json_object_set_new(r, "calibrated", json_boolean(whole));
    if (a->skipped[0]) json_object_set_new(r, "skipped", json_string(a->skipped));
    int any = a->elems > 0;
    json_object_set_new(r, "bits_per_element", num_or_null(any, 8 * a->stored / a->elems));
    json_object_set_new(r, "ratio", num_or_null(any, a->raw / a->stored));
    json_object_set_new(r, "lossless", any ? json_boolean(a->exact) : json_null());
    json_object_set_new(r, "k_snr_db",
                        num_or_null(any && a->noise[0] > 0, snr_db(a->sig[0], a->noise[0])));
    json_object_set_new(r, "v_snr_db",
                        num_or_null(any && a->noise[1] > 0, snr_db(a->sig[1], a->noise[1])));
    json_object_set_new(r, "max_abs_err", num_or_null(any, a->maxabs));
    json_object_set_new(r, "attn_snr_db",
                        num_or_null(a->attn && a->anoise > 0, snr_db(a->asig, a->anoise)));
    json_object_set_new(r, "attn_cosine",
                        num_or_null(a->attn && a->aa > 0 && a->ab > 0,
                                    a->adot / sqrt(a->aa * a->ab)));
    json_object_set_new(r, "encode_gbps", num_or_null(any && a->enc_s > 0, a->raw / a->enc_s / 1e9));
    json_object_set_new(r, "decode_gbps", num_or_null(any && a->dec_s > 0, a->raw / a->dec_s / 1e9));
    if (o->per_slice) {
        json_t *sl = json_array();
        for (int kvi = 0; kvi < 2; kvi++)
            for (int layer = 0; layer < L; layer++) {
                if (a->slice_raw[kvi][layer] == 0) continue;
                json_array_append_new(
                    sl, json_pack("{s:s,s:i,s:f,s:b}", "kv",
                                  layer_objects ? "KV" : kvi ? "V" : "K", "layer", layer,
                                  "ratio", a->slice_raw[kvi][layer] / a->slice_stored[kvi][layer],
                                  "lossless", a->slice_exact[kvi][layer]));
            }
        json_object_set_new(r, "slices", sl);
    }
    return r;
}

/* prec digits after the point; a negative prec: that many significant. */
static void fmt(char *buf, size_t n, const json_t *v, int prec)
{
    if (!json_is_number(v)) snprintf(buf, n, "-");
    else if (prec >= 0) snprintf(buf, n, "%.*f", prec, json_number_value(v));
    else snprintf(buf, n, "%.*g", -prec, json_number_value(v));
}

static void print_row(const json_t *r, const char *name)
{
    const char *skipped = json_string_value(json_object_get(r, "skipped"));
    if (skipped) {
        printf("%-14s skipped: %s\n", name, skipped);
        return;
    }
    char c[8][32];
    fmt(c[0], 32, json_object_get(r, "bits_per_element"), 3);
    fmt(c[1], 32, json_object_get(r, "ratio"), 4);
    fmt(c[2], 32, json_object_get(r, "k_snr_db"), 2);
    fmt(c[3], 32, json_object_get(r, "v_snr_db"), 2);
    fmt(c[4], 32, json_object_get(r, "max_abs_err"), -4);
    fmt(c[5], 32, json_object_get(r, "attn_snr_db"), 2);
    fmt(c[6], 32, json_object_get(r, "encode_gbps"), 3);
    fmt(c[7], 32, json_object_get(r, "decode_gbps"), 3);
    char cos[32];
    fmt(cos, 32, json_object_get(r, "attn_cosine"), 6);
    printf("%-14s %7s %7s %-5s %7s %7s %9s %8s %9s %7s %7s\n", name, c[0], c[1],
           json_is_true(json_object_get(r, "lossless")) ? "yes" : "no", c[2], c[3], c[4], c[5],
           cos, c[6], c[7]);
    const json_t *sl = json_object_get(r, "slices");
    for (size_t i = 0; i < json_array_size(sl); i++) {
        const json_t *s = json_array_get(sl, i);
        printf("    %s%-3d ratio %.4f%s\n", json_string_value(json_object_get(s, "kv")),
               (int)json_integer_value(json_object_get(s, "layer")),
               json_real_value(json_object_get(s, "ratio")),
               json_is_true(json_object_get(s, "lossless")) ? "" : " (lossy)");
    }
}

/* The rate-distortion picture: bits per element (x) against SNR (y) of
 * the attention output (filled), K and V (open) for each result row. */
static int write_plot(const char *path, const json_t *results, const char *const *names)
{
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "kvserde eval: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    const double W = 720, Hh = 480, x0 = 60, y0 = 420, xs = 620 / 17.0, ys = 380 / 60.0;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\" height=\"%g\" "
               "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%%\" "
               "height=\"100%%\" fill=\"white\"/>\n", W, Hh);
    for (int b = 0; b <= 16; b += 2)
        fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#ddd\"/>"
                   "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">%d</text>\n",
                x0 + b * xs, y0, x0 + b * xs, y0 - 60 * ys, x0 + b * xs, y0 + 15, b);
    for (int d = 0; d <= 60; d += 10)
        fprintf(f, "<line x1=\"%g\" y1=\"%g\" x2=\"%g\" y2=\"%g\" stroke=\"#ddd\"/>"
                   "<text x=\"%g\" y=\"%g\" text-anchor=\"end\">%d</text>\n",
                x0, y0 - d * ys, x0 + 17 * xs, y0 - d * ys, x0 - 5, y0 - d * ys + 4, d);
    fprintf(f, "<text x=\"%g\" y=\"%g\" text-anchor=\"middle\">bits per element (every "
               "header counted)</text>\n<text x=\"15\" y=\"%g\" transform=\"rotate(-90 15 "
               "%g)\" text-anchor=\"middle\">SNR dB (filled: attention output; open: K, V)"
               "</text>\n",
            x0 + 8.5 * xs, y0 + 35, y0 - 30 * ys, y0 - 30 * ys);
    static const char *const keys[3] = {"attn_snr_db", "k_snr_db", "v_snr_db"};
    static const char *const colors[3] = {"#1f77b4", "#d62728", "#2ca02c"};
    for (size_t r = 0; r < json_array_size(results); r++) {
        const json_t *row = json_array_get(results, r);
        double bits = json_number_value(json_object_get(row, "bits_per_element"));
        double x = x0 + (bits > 17 ? 17 : bits) * xs;
        for (int k = 0; k < 3; k++) {
            const json_t *v = json_object_get(row, keys[k]);
            if (!json_is_number(v)) continue;
            double db = json_number_value(v), y = y0 - (db > 60 ? 60 : db < 0 ? 0 : db) * ys;
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" stroke=\"%s\" fill=\"%s\"/>\n",
                    x, y, colors[k], k ? "none" : colors[k]);
            if (k == 0)
                fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x + 6, y - 4,
                        names[r] ? names[r] : "--serde");
        }
    }
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) {
        fprintf(stderr, "kvserde eval: cannot write %s\n", path);
        return -1;
    }
    return 0;
}

static int has_skip(const opts *o)
{
    for (int kv = 0; kv < 2; kv++)
        for (int l = 0; l < MAX_LAYERS; l++)
            if (o->skip[kv][l]) return 1;
    return 0;
}

/* Calibrating on a file that is also evaluated would flatter the figures. */
static int check_calibration_files(const opts *o, char **files, int nfiles)
{
    for (int c = 0; c < o->ncalibration; c++) {
        char *a = realpath(o->calibration[c], NULL);
        for (int f = 0; a && f < nfiles; f++) {
            char *b = realpath(files[f], NULL);
            int same = b && strcmp(a, b) == 0;
            free(b);
            if (same) {
                fprintf(stderr, "kvserde eval: %s is both a calibration file and a file to "
                                "evaluate; calibrate on other chunks\n",
                        files[f]);
                free(a);
                return -1;
            }
        }
        free(a);
    }
    return 0;
}

static int calibrate_to_temp(opts *o)
{
    snprintf(o->transform_path, sizeof o->transform_path, "/tmp/kvserde-eval-XXXXXX");
    int fd = mkstemp(o->transform_path);
    if (fd < 0) {
        fprintf(stderr, "kvserde eval: cannot create a temporary transform file: %s\n",
                strerror(errno));
        return -1;
    }
    close(fd);
    if (kvs_tool_calibrate(o->calibration, (size_t)o->ncalibration, o->transform_path, 1)) {
        unlink(o->transform_path);
        return -1;
    }
    return 0;
}

/* json with every CALIBRATION_PLACEHOLDER replaced by path (malloc'd). */
static char *replace_placeholder(const char *json, const char *path)
{
    size_t pl = strlen(CALIBRATION_PLACEHOLDER), n = strlen(json) + 1;
    for (const char *p = json; (p = strstr(p, CALIBRATION_PLACEHOLDER)); p += pl)
        n += strlen(path);
    char *out = malloc(n), *w = out;
    if (out == NULL) return NULL;
    for (const char *p = json;;) {
        const char *hit = strstr(p, CALIBRATION_PLACEHOLDER);
        size_t k = hit ? (size_t)(hit - p) : strlen(p);
        memcpy(w, p, k);
        w += k;
        if (!hit) break;
        w += sprintf(w, "%s", path);
        p = hit + pl;
    }
    *w = 0;
    return out;
}

int kvs_cmd_eval(int argc, char **argv)
{
    opts o;
    memset(&o, 0, sizeof o);
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return usage(stdout, 0);
        if (strcmp(a, "--json") == 0) o.json = 1;
        else if (strcmp(a, "--sweep") == 0) o.sweep = 1;
        else if (strcmp(a, "--per-slice") == 0) o.per_slice = 1;
        else if (i + 1 < argc && strcmp(a, "--serde") == 0) o.serde = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--plot") == 0) o.plot = argv[++i];
        else if (i + 1 < argc && strcmp(a, "--calibration") == 0) {
            for (char *tok = strtok(argv[++i], ","); tok; tok = strtok(NULL, ","))
                if (o.ncalibration < MAX_LAYERS) o.calibration[o.ncalibration++] = tok;
        }
        else if (i + 1 < argc && strcmp(a, "--objects") == 0) {
            const char *v = argv[++i];
            if (strcmp(v, "slice") != 0 && strcmp(v, "layer") != 0 && strcmp(v, "chunk") != 0) {
                fprintf(stderr, "kvserde eval: --objects takes slice, layer or chunk; got '%s'\n",
                        v);
                return 2;
            }
            o.layer_objects = strcmp(v, "layer") == 0;
            o.chunk_objects = strcmp(v, "chunk") == 0;
        }
        else if (i + 1 < argc && strcmp(a, "--skip") == 0) {
            if (parse_skip(argv[++i], &o)) return 2;
        } else if (i + 1 < argc && strcmp(a, "--heads") == 0) o.heads = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--kv-heads") == 0) o.kv_heads = atoi(argv[++i]);
        else if (i + 1 < argc && strcmp(a, "--head-dim") == 0) o.head_dim = atoi(argv[++i]);
        else {
            fprintf(stderr, "kvserde eval: unknown or incomplete option '%s'\n\n", a);
            return usage(stderr, 2);
        }
    }
    if (i >= argc || (o.sweep == (o.serde != NULL))) {
        fprintf(stderr, "kvserde eval: give --serde JSON or --sweep, and at least one file\n\n");
        return usage(stderr, 2);
    }
    int nfiles = argc - i;
    if (check_calibration_files(&o, argv + i, nfiles)) return 2;
    /* The configs: --serde, or the presets (the calibrated ones only with a
     * calibration), with the placeholder replaced by the transform file. */
    size_t ncfg = 0;
    char *configs[64];
    const char *names[64];
    if (o.ncalibration && calibrate_to_temp(&o)) return 1;
    for (size_t c = 0; c < (o.sweep ? kvs_eval_npresets : 1); c++) {
        const char *json = o.sweep ? kvs_eval_presets[c].serde : o.serde;
        int needs = strstr(json, CALIBRATION_PLACEHOLDER) != NULL;
        if (needs && !o.ncalibration) {
            if (o.sweep) continue;
            fprintf(stderr, "kvserde eval: --serde names \"%s\" but no --calibration was given\n",
                    CALIBRATION_PLACEHOLDER);
            return 2;
        }
        configs[ncfg] = needs ? replace_placeholder(json, o.transform_path) : strdup(json);
        names[ncfg] = o.sweep ? kvs_eval_presets[c].name : NULL;
        if (configs[ncfg++] == NULL) {
            fprintf(stderr, "kvserde eval: out of memory\n");
            for (size_t d = 0; d < ncfg; d++) free(configs[d]);
            if (o.ncalibration) unlink(o.transform_path);
            return 1;
        }
    }
    for (size_t c = 0; c < ncfg; c++)
        if (takes_whole_chunk(configs[c]) && has_skip(&o)) {
            fprintf(stderr, "kvserde eval: --skip cannot leave slices out of a transform serde "
                            "(it encodes each chunk whole)\n");
            for (size_t d = 0; d < ncfg; d++) free(configs[d]);
            if (o.ncalibration) unlink(o.transform_path);
            return 2;
        }
    acc *accs = calloc(ncfg, sizeof *accs);
    kvs_st_mapped *maps = calloc((size_t)nfiles, sizeof *maps);
    kvs_st_file *files = calloc((size_t)nfiles, sizeof *files);
    if (!accs || !maps || !files) {
        fprintf(stderr, "kvserde eval: out of memory\n");
        return 1;
    }
    int rc = 0, L = 0, opened = 0;
    for (int f = 0; f < nfiles && rc == 0; f++, opened++)
        if (kvs_st_open(argv[i + f], &maps[f], &files[f]) != KVS_OK) {
            fprintf(stderr, "kvserde eval: %s\n", kvs_last_error());
            rc = 1;
        } else {
            const kvs_st_tensor *kv = kvs_st_find(&files[f], "kv");
            if (kv && kv->ndim == 4 && (int)kv->shape[1] > L) L = (int)kv->shape[1];
        }
    int bar = !o.json && isatty(STDERR_FILENO) && ncfg * (size_t)nfiles > 4;
    for (size_t c = 0; c < ncfg && rc == 0; c++) {
        accs[c].exact = 1;
        for (int kvi = 0; kvi < 2; kvi++)
            for (int l = 0; l < MAX_LAYERS; l++) accs[c].slice_exact[kvi][l] = 1;
        const char *json = configs[c];
        kvs_serde_pair p;
        if (kvs_serde_create_pair(json, &p) != KVS_OK) {
            fprintf(stderr, "kvserde eval: %s\n", kvs_last_error());
            rc = 1;
            break;
        }
        for (int pass = PASS_TIMING; pass <= PASS_MEASURE; pass++)
            for (int f = 0; f < nfiles && rc == 0; f++) {
                if (eval_file(argv[i + f], &files[f], json, &p, &o, &accs[c], pass)) rc = 1;
                progress(bar, (2 * c + (size_t)pass) * (size_t)nfiles + (size_t)f + 1,
                         2 * ncfg * (size_t)nfiles);
            }
        kvs_serde_pair_destroy(&p);
    }
    if (rc == 0) {
        json_t *results = json_array();
        for (size_t c = 0; c < ncfg; c++)
            json_array_append_new(results,
                                  result_json(configs[c], names[c], &accs[c], L, &o));
        if (o.plot && write_plot(o.plot, results, names)) rc = 1;
        if (o.json) {
            json_t *doc = json_pack("{s:i,s:o}", "files", nfiles, "results", results);
            char *text = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
            printf("%s\n", text);
            free(text);
            json_decref(doc);
        } else {
            printf("%d file(s); bits/elt and ratio include every header; GB/s of the raw side, "
                   "one thread\n",
                   nfiles);
            printf("%-14s %7s %7s %-5s %7s %7s %9s %8s %9s %7s %7s\n", "serde", "bits", "ratio",
                   "exact", "K dB", "V dB", "max err", "attn dB", "attn cos", "enc", "dec");
            for (size_t c = 0; c < ncfg; c++)
                print_row(json_array_get(results, c), names[c] ? names[c] : "--serde");
            json_decref(results);
        }
    }
    for (int f = 0; f < opened; f++)
        if (maps[f].data) kvs_st_close(&maps[f], &files[f]);
    free(maps);
    free(files);
    free(accs);
    for (size_t c = 0; c < ncfg; c++) free(configs[c]);
    if (o.ncalibration) unlink(o.transform_path);
    return rc;
}
