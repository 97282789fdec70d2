/* kvs_test_kvdata.h - the real KV cache of ../shared/kvdata (read its
 * README.md) for test_kv_split and bench_kv_split_scopes: find the
 * directory, read one chunk's "kv" tensor ([2, 6, 256, 256] bfloat16:
 * K/V, layers, tokens, 4 heads x 64), and measure what a kv_split scale
 * scope costs in bytes and buys in SNR on it. Header-only; nothing here
 * copies the data anywhere. */
#ifndef KVS_TEST_KVDATA_H
#define KVS_TEST_KVDATA_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "codecs/half.h"
#include "kvserde/error.h"
#include "kvserde/multi.h"

#define KVDATA_LAYERS 6
#define KVDATA_TOKENS 256
#define KVDATA_HIDDEN 256
#define KVDATA_HEADS 4

/* The directory: $KVS_KVDATA_DIR if set (and then only it), else
 * ../shared/kvdata or ../../shared/kvdata from the source tree (a main
 * checkout or a worktree beside it). NULL if none holds index.json; *why
 * says what was tried. */
static inline const char *kvdata_dir(char *buf, size_t size, char *why, size_t why_size)
{
    const char *env = getenv("KVS_KVDATA_DIR");
    const char *cands[3] = {env, KVS_SOURCE_DIR "/../shared/kvdata",
                            KVS_SOURCE_DIR "/../../shared/kvdata"};
    int ncands = env && env[0] ? 1 : 3; /* a directory given is the only one */
    struct stat st;
    for (int i = 0; i < ncands; i++) {
        if (cands[i] == NULL || !cands[i][0]) continue;
        snprintf(buf, size, "%s/index.json", cands[i]);
        if (stat(buf, &st) == 0) {
            snprintf(buf, size, "%s", cands[i]);
            return buf;
        }
    }
    if (ncands == 1)
        snprintf(why, why_size, "no kvdata: $KVS_KVDATA_DIR (%s) holds no index.json", env);
    else
        snprintf(why, why_size,
                 "no kvdata: $KVS_KVDATA_DIR is unset, and neither %s nor %s holds index.json",
                 cands[1], cands[2]);
    return NULL;
}

/* The "kv" tensor of one file as float32 [2 x 6 x 256 x 256] (malloc'd),
 * or NULL with *why. */
static inline float *kvdata_load(const char *dir, int prompt, int part, char *why,
                                 size_t why_size)
{
    char path[1100];
    snprintf(path, sizeof path, "%.1000s/kv_B_p%02d_c%d.safetensors", dir, prompt % 100,
             part % 10);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(why, why_size, "cannot open %s", path);
        return NULL;
    }
    uint8_t len8[8];
    float *out = NULL;
    char *hdr = NULL;
    json_t *j = NULL;
    if (fread(len8, 1, 8, f) != 8) goto bad;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    if (hlen > (1u << 20) || (hdr = malloc(hlen + 1)) == NULL || fread(hdr, 1, hlen, f) != hlen)
        goto bad;
    hdr[hlen] = 0;
    j = json_loads(hdr, 0, NULL);
    json_t *kv = json_object_get(j, "kv");
    json_t *offs = json_object_get(kv, "data_offsets");
    const char *dt = json_string_value(json_object_get(kv, "dtype"));
    if (!kv || !dt || strcmp(dt, "BF16") != 0 || json_array_size(offs) != 2)
        goto bad;
    uint64_t a = (uint64_t)json_integer_value(json_array_get(offs, 0));
    uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 1));
    size_t n = 2 * KVDATA_LAYERS * KVDATA_TOKENS * KVDATA_HIDDEN;
    if (b - a != 2 * n || fseek(f, (long)(8 + hlen + a), SEEK_SET) != 0) goto bad;
    uint16_t *raw = malloc(2 * n);
    out = malloc(4 * n);
    if (!raw || !out || fread(raw, 2, n, f) != n) {
        free(raw);
        goto bad;
    }
    for (size_t i = 0; i < n; i++) out[i] = kvs_bf16_to_f32(raw[i]); /* little-endian host */
    free(raw);
    json_decref(j);
    free(hdr);
    fclose(f);
    return out;
bad:
    snprintf(why, why_size, "%.1100s: not the safetensors file kvdata/README.md describes", path);
    free(out);
    json_decref(j);
    free(hdr);
    fclose(f);
    return NULL;
}

/* One scope on one chunk: K and V both stored as `store` with `scale`
 * (num_kv_heads 4), serialized as bfloat16 [6, 256, 256] each and read
 * back. */
typedef struct kvdata_result {
    size_t blob_bytes;       /* the whole blob */
    size_t scale_bytes;      /* of it: the scale tables (24 + 4 per scale) */
    double snr_k, snr_v;     /* dB, over the bfloat16 inputs */
    double max_rel_excess;   /* worst |err| beyond the fp8 bound (<= 0: within) */
} kvdata_result;

static inline int kvdata_measure(const float *kv, kvs_kv_split_scale scale,
                                 kvs_kv_split_store store, kvdata_result *res)
{
    size_t half = (size_t)KVDATA_LAYERS * KVDATA_TOKENS * KVDATA_HIDDEN;
    kvs_kv_split_options o;
    kvs_kv_split_options_init(&o);
    o.k_store = o.v_store = store;
    o.scale = scale;
    o.num_kv_heads = KVDATA_HEADS;
    kvs_multi_serializer *s = NULL;
    kvs_multi_deserializer *d = NULL;
    int rc = kvs_kv_split_serde_create(&o, &s, &d);
    if (rc) return rc;
    kvs_layout l = {0};
    int64_t dims[3] = {KVDATA_LAYERS, KVDATA_TOKENS, KVDATA_HIDDEN};
    kvs_layout_add_group(&l, 3, dims, KVS_DTYPE_BFLOAT16);
    kvs_memobj *in[2] = {NULL, NULL}, *back[2] = {NULL, NULL}, *blob = NULL;
    const kvs_layout *ls[2] = {&l, &l};
    size_t est = 0, n = 0;
    rc = kvs_multi_estimate_serialized_size(s, ls, 2, &est);
    kvs_layout bl;
    if (!rc) rc = kvs_layout_flat(&bl, est, KVS_DTYPE_UINT8);
    if (!rc) rc = kvs_memobj_alloc(&bl, KVS_FMT_BINARY_BUFFER, &blob);
    for (int h = 0; h < 2 && !rc; h++) {
        rc = kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &in[h]);
        if (!rc) rc = kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &back[h]);
        for (size_t i = 0; !rc && i < half; i++)
            ((uint16_t *)in[h]->data)[i] = kvs_f32_to_bf16(kv[(size_t)h * half + i]);
    }
    if (!rc) rc = kvs_multi_serialize(s, in, 2, blob, NULL, &n);
    if (!rc) rc = kvs_memobj_set_used_size(blob, n);
    if (!rc) rc = kvs_multi_deserialize(d, blob, back, 2, NULL);
    kvs_kv_split_info info;
    if (!rc) rc = kvs_kv_split_inspect(blob->data, n, &info);
    if (!rc) {
        res->blob_bytes = n;
        res->scale_bytes = 0;
        res->max_rel_excess = -INFINITY;
        for (int h = 0; h < 2; h++) {
            const kvs_kv_split_slot_info *si = &info.slots[h];
            if (si->scope != KVS_KV_SPLIT_SCALE_PER_TENSOR)
                res->scale_bytes += 24 + 4 * (size_t)si->nscales;
            double err = 0, ref = 0;
            double rel = store == KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN ? 0x1p-4 : 0x1p-3;
            for (size_t i = 0; i < half; i++) {
                double x = kvs_bf16_to_f32(((uint16_t *)in[h]->data)[i]);
                double y = kvs_bf16_to_f32(((uint16_t *)back[h]->data)[i]);
                err += (y - x) * (y - x), ref += x * x;
                /* the bound with the largest scale of the slot (a loose
                 * check; the exact per-group bound is test_kv_split's) */
                double sc = si->scale;
                if (si->nscales) {
                    sc = 0;
                    const uint8_t *t = (const uint8_t *)blob->data + si->scales_offset;
                    for (uint64_t g = 0; g < si->nscales; g++) {
                        uint32_t b = (uint32_t)t[4 * g] | (uint32_t)t[4 * g + 1] << 8 |
                                     (uint32_t)t[4 * g + 2] << 16 | (uint32_t)t[4 * g + 3] << 24;
                        float v;
                        memcpy(&v, &b, 4);
                        if (v > sc) sc = v;
                    }
                }
                double bound = rel * fabs(x) + sc * 0x1p-10 + fabs(y) * 0x1p-8;
                if (fabs(y - x) - bound > res->max_rel_excess)
                    res->max_rel_excess = fabs(y - x) - bound;
            }
            *(h ? &res->snr_v : &res->snr_k) = 10 * log10(ref / err);
        }
    }
    for (int h = 0; h < 2; h++) {
        kvs_memobj_free(in[h]);
        kvs_memobj_free(back[h]);
    }
    kvs_memobj_free(blob);
    kvs_multi_serializer_destroy(s);
    kvs_multi_deserializer_destroy(d);
    return rc;
}

#endif /* KVS_TEST_KVDATA_H */
