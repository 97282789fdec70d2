/* seeds.c - writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/)
 * from real library output, so the seeds are valid inputs of each target's
 * format. Not a fuzz target: built as kvs_fuzz_seeds in the fuzz build.
 *
 *     build-fuzz/kvs_fuzz_seeds fuzz/corpus
 *
 * then, for encoded safetensors seeds, the tool (fuzz/README.md):
 *     kvserde encode fuzz/corpus/safetensors/plain.safetensors \
 *         fuzz/corpus/safetensors/fp8.safetensors   (and --raw, --serde ...)
 * The input layout of each binary seed is the one its fuzz_*.c decodes.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvserde/kvserde.h"
#include "kvserde/multi.h"
#include "kvserde/pipeline.h"
#include "kvserde/registry.h"

static const char *g_root;

static void put(const char *target, const char *name, const void *data, size_t len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_root, target);
    if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof path, "%s/%s/%s", g_root, target, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static void put_text(const char *target, const char *name, const char *text)
{
    put(target, name, text, strlen(text));
}

/* A growing byte buffer. */
typedef struct buf {
    uint8_t b[1 << 16];
    size_t n;
} buf;
static void b_u8(buf *b, unsigned v) { b->b[b->n++] = (uint8_t)v; }
static void b_u16(buf *b, unsigned v) { b_u8(b, v & 0xFF), b_u8(b, (v >> 8) & 0xFF); }
static void b_u32(buf *b, uint32_t v) { b_u16(b, v & 0xFFFF), b_u16(b, v >> 16); }
static void b_u64(buf *b, uint64_t v) { b_u32(b, (uint32_t)v), b_u32(b, (uint32_t)(v >> 32)); }
static void b_mem(buf *b, const void *p, size_t n) { memcpy(b->b + b->n, p, n), b->n += n; }

static void check(int rc, const char *what)
{
    if (rc != KVS_OK) {
        fprintf(stderr, "seeds: %s: %s\n", what, kvs_last_error());
        exit(1);
    }
}

static void json_seeds(void)
{
    static const char *const serde[] = {
        "{\"type\": \"fp8\"}",
        "{\"type\": \"fp8\", \"fp8_dtype\": \"float8_e5m2\", \"saturate\": false, \"max_workers\": 2}",
        "{\"type\": \"fp8\", \"fp8_dtype\": \"float8_e4m3fn\", \"max_workers\": \"3\"}",
        "{\"type\": \"fp8\", \"max_workers\": 2.0, \"saturate\": true}",
        "{\"type\": \"fp8\", \"max_workers\": 0}",
        "{\"type\": \"fp8\", \"foo\": 1}",
        "{\"type\": \"kv_split\", \"k_dtype\": \"native\", \"v_dtype\": \"float8_e4m3fn\"}",
        "{\"type\": 7}",
        "{\"fp8_dtype\": \"float8_e5m2\"}",
        "[{\"type\": \"fp8\"}]",
        "{\"type\": \"fp8\"",
    };
    for (size_t i = 0; i < sizeof serde / sizeof serde[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "config-%02zu.json", i);
        put_text("serde_config", name, serde[i]);
    }
    static const char *const l2[] = {
        "{\"type\": \"memory\"}",
        "{\"type\": \"memory\", \"capacity_bytes\": 100, \"workers\": 2}",
        "{\"type\": \"memory\", \"serde\": {\"type\": \"fp8\", \"fp8_dtype\": \"float8_e5m2\"}}",
        "{\"type\": \"memory\", \"serde\": {\"type\": \"fp8\"}, \"serde_pool_bytes\": 16}",
        "{\"type\": \"fs\", \"path\": \"/var/cache/kv\"}",
        "{\"type\": \"fs\", \"path\": \"/x\", \"fsync\": false, \"capacity_bytes\": 0, "
        "\"workers\": \"2\", \"create\": true}",
        "{\"type\": \"fs\", \"path\": \"/x\", \"serde\": {\"type\": \"fp8\", \"max_workers\": 2}, "
        "\"serde_pool_bytes\": 4096}",
        "{\"type\": \"fs\", \"path\": \"/x\", \"capacity_bytes\": 64}",
        "{\"type\": \"fs\", \"path\": \"\"}",
        "{\"type\": \"fs\", \"path\": \"/x\", \"workers\": 2000}",
        "{\"type\": \"memory\", \"serde\": \"fp8\"}",
        "{\"type\": \"memory\", \"serde\": {}}",
        "{\"type\": \"nosuch\"}",
        "{\"path\": \"/x\"}",
    };
    for (size_t i = 0; i < sizeof l2 / sizeof l2[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "spec-%02zu.json", i);
        put_text("l2_spec", name, l2[i]);
    }
}

/* fuzz_fp8_deserialize: opt, ngroups-1, per group (dtype | ndim<<3 | wide<<7,
 * dims), u32 selector, source bytes. */
static void fp8_seeds(void)
{
    struct {
        const char *name;
        unsigned opt;
        unsigned ngroups;
        unsigned dt[3], ndim[3], dims[3][3];
        size_t nsrc;
    } s[] = {
        {"bf16-4x8", 0, 1, {3}, {2}, {{4, 8}}, 32},
        {"f16-e5m2", 1, 1, {2}, {1}, {{16}}, 16},
        {"f32-sat-off", 0, 1, {1}, {3}, {{2, 2, 4}}, 16},
        {"two-groups", 2, 2, {3, 1}, {1, 2}, {{8}, {2, 4}}, 16},
        {"short-src", 4, 1, {3}, {1}, {{20}}, 20},
        {"uint8-dst", 0, 1, {0}, {1}, {{8}}, 8},
        {"scalar", 0, 1, {2}, {0}, {{0}}, 1},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        static buf b;
        b.n = 0;
        b_u8(&b, s[i].opt);
        b_u8(&b, s[i].ngroups - 1);
        for (unsigned g = 0; g < s[i].ngroups; g++) {
            b_u8(&b, s[i].dt[g] | s[i].ndim[g] << 3);
            for (unsigned d = 0; d < s[i].ndim[g]; d++) b_u8(&b, s[i].dims[g][d]);
        }
        b_u32(&b, (uint32_t)(s[i].nsrc / 2));
        for (size_t k = 0; k < s[i].nsrc; k++) b_u8(&b, (unsigned)(k * 29 + 7 * i));
        b_u8(&b, 0x7F); /* e4m3fn NaN */
        b_u8(&b, 0xFE);
        b_u8(&b, 0x80); /* -0 */
        put("fp8_deserialize", s[i].name, b.b, b.n);
    }
}

/* fuzz_ggml: opt (bit 0 q4_0, bit 1 cut the source, bits 2-3 the encode
 * dtype), ngroups-1, per group (dtype | ndim<<3 | 0x80: last dim 32 x byte),
 * dims, u32 selector, source bytes: real blocks of kvs_ggml_encode. */
static void ggml_seeds(void)
{
    struct {
        const char *name;
        unsigned opt;
        kvs_dtype dt;
        unsigned ndim, dims[3]; /* the last one in units of 32 */
        size_t cut;             /* bytes dropped from the blocks */
    } s[] = {
        {"q8-bf16-2x64", 0x00, KVS_DTYPE_BFLOAT16, 2, {2, 2}, 0},
        {"q4-f32-4x32", 0x01, KVS_DTYPE_FLOAT32, 2, {4, 1}, 0},
        {"q4-f16-3d", 0x05, KVS_DTYPE_FLOAT16, 3, {2, 1, 3}, 0},
        {"q8-short", 0x00, KVS_DTYPE_BFLOAT16, 1, {2}, 5},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        static buf b;
        static float x[4096];
        static uint8_t blocks[4096];
        b.n = 0;
        b_u8(&b, s[i].opt);
        b_u8(&b, 0);
        b_u8(&b, (unsigned)s[i].dt | s[i].ndim << 3 | 0x80);
        size_t n = 1;
        for (unsigned d = 0; d < s[i].ndim; d++) {
            b_u8(&b, s[i].dims[d]);
            n *= d + 1 == s[i].ndim ? 32 * s[i].dims[d] : s[i].dims[d];
        }
        b_u32(&b, 0);
        kvs_ggml_type t = (s[i].opt & 1) ? KVS_GGML_Q4_0 : KVS_GGML_Q8_0;
        for (size_t j = 0; j < n; j++) x[j] = (float)((int)(j * 7919 % 61) - 30) * 0.125f;
        check(kvs_ggml_encode(x, KVS_DTYPE_FLOAT32, blocks, t, n), "ggml encode");
        b_mem(&b, blocks, n / 32 * kvs_ggml_block_bytes(t) - s[i].cut);
        put("ggml", s[i].name, b.b, b.n);
    }
}

/* fuzz_kv_split: opt, dtypes, u32 nk, u32 nv, blob. */
static void kv_split_seeds(void)
{
    struct {
        const char *name;
        kvs_kv_split_store k, v;
        kvs_kv_split_scale scale;
        kvs_kv_split_mode mode;
        kvs_dtype dt;
        unsigned opt, dts;
    } s[] = {
        {"default-f16", KVS_KV_SPLIT_STORE_NATIVE, KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN,
         KVS_KV_SPLIT_SCALE_PER_TENSOR, KVS_KV_SPLIT_MODE_KV, KVS_DTYPE_FLOAT16, 0x0F, 0x05},
        {"both-fp8-bf16", KVS_KV_SPLIT_STORE_FLOAT8_E5M2, KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN,
         KVS_KV_SPLIT_SCALE_PER_TENSOR, KVS_KV_SPLIT_MODE_KV, KVS_DTYPE_BFLOAT16, 0x0F, 0x0A},
        {"scale-none-f32", KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN, KVS_KV_SPLIT_STORE_FLOAT8_E5M2,
         KVS_KV_SPLIT_SCALE_NONE, KVS_KV_SPLIT_MODE_KV, KVS_DTYPE_FLOAT32, 0x0F, 0x30},
        {"v-only", KVS_KV_SPLIT_STORE_NATIVE, KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN,
         KVS_KV_SPLIT_SCALE_PER_TENSOR, KVS_KV_SPLIT_MODE_V_ONLY, KVS_DTYPE_BFLOAT16, 0x0B, 0x0A},
        {"native-both", KVS_KV_SPLIT_STORE_NATIVE, KVS_KV_SPLIT_STORE_NATIVE,
         KVS_KV_SPLIT_SCALE_PER_TENSOR, KVS_KV_SPLIT_MODE_KV, KVS_DTYPE_FLOAT16, 0x07, 0x00},
        {"bad-crc", KVS_KV_SPLIT_STORE_NATIVE, KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN,
         KVS_KV_SPLIT_SCALE_PER_TENSOR, KVS_KV_SPLIT_MODE_KV, KVS_DTYPE_FLOAT16, 0x0E, 0x05},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        kvs_kv_split_options o;
        kvs_kv_split_options_init(&o);
        o.k_store = s[i].k;
        o.v_store = s[i].v;
        o.scale = s[i].scale;
        o.mode = s[i].mode;
        kvs_multi_serializer *ser = NULL;
        check(kvs_kv_split_serde_create(&o, &ser, NULL), "kv_split create");
        enum { N = 24 };
        static uint8_t kd[N * 4], vd[N * 4], out[4096];
        for (size_t k = 0; k < sizeof kd; k++) {
            kd[k] = (uint8_t)(k * 13 + i);
            vd[k] = (uint8_t)(k * 7 + 3);
        }
        for (size_t k = 1; k < sizeof kd; k += 2) kd[k] = vd[k] = 0x3C; /* sane exponents */
        kvs_layout lay, flat;
        check(kvs_layout_flat(&lay, N, s[i].dt), "layout");
        kvs_memobj ko, vo, dst;
        check(kvs_memobj_init(&ko, kd, sizeof kd, &lay, KVS_FMT_KV_2TD), "k");
        check(kvs_memobj_init(&vo, vd, sizeof vd, &lay, KVS_FMT_KV_2TD), "v");
        check(kvs_layout_flat(&flat, sizeof out, KVS_DTYPE_UINT8), "flat");
        check(kvs_memobj_init(&dst, out, sizeof out, &flat, KVS_FMT_BINARY), "dst");
        kvs_memobj *group[2] = {s[i].mode == KVS_KV_SPLIT_MODE_V_ONLY ? NULL : &ko, &vo};
        size_t nw = 0;
        check(kvs_multi_serialize(ser, group, 2, &dst, NULL, &nw), "serialize");
        kvs_multi_serializer_destroy(ser);
        if (strcmp(s[i].name, "bad-crc") == 0) out[nw - 1] ^= 0x40;
        static buf b;
        b.n = 0;
        b_u8(&b, s[i].opt);
        b_u8(&b, s[i].dts);
        b_u32(&b, N);
        b_u32(&b, N);
        b_mem(&b, out, nw);
        put("kv_split", s[i].name, b.b, b.n);
    }
}

/* fuzz_fs_key_path: key 1 (flags, hash len, hash, model len, model, salt
 * len, salt, rank u64, group u64), mode, [key 2 or a change], path text. */
static void key(buf *b, unsigned flags, const void *hash, unsigned hlen, const char *model,
                const char *salt, int64_t rank, int64_t group)
{
    b_u8(b, flags);
    b_u8(b, hlen);
    b_mem(b, hash, hlen);
    b_u8(b, (unsigned)strlen(model));
    b_mem(b, model, strlen(model));
    b_u8(b, (unsigned)strlen(salt));
    b_mem(b, salt, strlen(salt));
    b_u64(b, (uint64_t)rank);
    b_u64(b, (uint64_t)group);
}

static void key_seeds(void)
{
    static const uint8_t h4[4] = {0, 0, 0, 7};
    uint8_t h100[100];
    for (int i = 0; i < 100; i++) h100[i] = (uint8_t)(i * 3);
    char longname[256];
    for (int i = 0; i < 255; i++) longname[i] = (char)(i % 3 == 0 ? '%' : i % 3 == 1 ? '.' : 'a');
    longname[255] = '\0';
    static buf b;

    b.n = 0;
    key(&b, 0, h4, 4, "meta-llama/Llama-3-8B", "", 0, 0);
    b_u8(&b, 1 | (4 << 1)); /* k2 = k1 with rank changed */
    b_u8(&b, 1);
    const char *p1 = "meta-llama%2FLlama-3-8B+/00000007,0,0";
    b_mem(&b, p1, strlen(p1));
    put("fs_key_path", "llama", b.b, b.n);

    b.n = 0;
    key(&b, 0, h4 + 3, 1, "..", "s", -1, 3);
    b_u8(&b, 0);
    key(&b, 0, h4 + 3, 1, ".", "s.", -1, 3);
    const char *p2 = "%2E.+s/07,-1,3";
    b_mem(&b, p2, strlen(p2));
    put("fs_key_path", "dots", b.b, b.n);

    b.n = 0;
    key(&b, 0, h100, 100, longname, "salt with spaces", INT64_MIN, INT64_MAX);
    b_u8(&b, 1 | (2 << 1));
    b_u8(&b, 200);
    b_u8(&b, '/');
    put("fs_key_path", "long", b.b, b.n);

    b.n = 0;
    static const uint8_t h200[200] = {1, 2, 3};
    key(&b, 1, h200, 200, "bad@model", "x/y", 5, -2); /* invalid: every field */
    b_u8(&b, 0);
    key(&b, 0, h4, 0, "", "", 0, 0);
    b_mem(&b, "../../etc/passwd", 16);
    put("fs_key_path", "invalid", b.b, b.n);
}

/* A plain safetensors file: F16 k, BF16 v, F32 w, I64 scalar, metadata. */
static void safetensors_seed(void)
{
    const char *json =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"k\":{\"dtype\":\"F16\",\"shape\":[2,4],\"data_offsets\":[0,16]},"
        "\"v\":{\"dtype\":\"BF16\",\"shape\":[2,4],\"data_offsets\":[16,32]},"
        "\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[32,44]},"
        "\"n\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[44,52]}}";
    static buf b;
    b.n = 0;
    size_t hl = (strlen(json) + 7) / 8 * 8;
    b_u64(&b, hl);
    b_mem(&b, json, strlen(json));
    while (b.n < 8 + hl) b_u8(&b, ' ');
    static const uint16_t f16[8] = {0x3C00, 0xC000, 0x3800, 0x4200, 0x7BFF, 0x0001, 0x8000, 0x7E00};
    static const uint16_t bf16[8] = {0x3F80, 0xC000, 0x3F00, 0x4040, 0x7F7F, 0x0001, 0x8000, 0x7FC0};
    static const float f32[3] = {1.5f, -2.25f, 1e-30f};
    int64_t n = 42;
    b_mem(&b, f16, sizeof f16);
    b_mem(&b, bf16, sizeof bf16);
    b_mem(&b, f32, sizeof f32);
    b_mem(&b, &n, sizeof n);
    put("safetensors", "plain.safetensors", b.b, b.n);
}

/* One pipeline blob of `n` elements of dtype `dt` (shape [2, n/2]) through
 * the pipeline `cfg`, into out; returns its length. */
static size_t pipeline_blob(const char *cfg, kvs_dtype dt, unsigned n, const kvs_object_key *key,
                            uint8_t *out, size_t cap)
{
    kvs_serde_pair pair;
    check(kvs_serde_create_pair(cfg, &pair), cfg);
    static uint8_t data[4096];
    for (size_t k = 0; k < sizeof data; k++) data[k] = (uint8_t)(k * 37 + 11);
    for (size_t k = 1; k < sizeof data; k += 2) data[k] = 0x3C; /* sane exponents */
    kvs_layout lay;
    int64_t dims[2] = {2, n / 2};
    lay.ngroups = 0;
    check(kvs_layout_add_group(&lay, 2, dims, dt), "layout");
    kvs_memobj src, dst;
    check(kvs_memobj_init(&src, data, sizeof data, &lay, KVS_FMT_KV_2LTD), "src");
    kvs_layout flat;
    check(kvs_layout_flat(&flat, cap, KVS_DTYPE_UINT8), "flat");
    check(kvs_memobj_init(&dst, out, cap, &flat, KVS_FMT_BINARY), "dst");
    size_t nw = 0;
    check(kvs_serialize(pair.serializer, &src, &dst, key, &nw), "pipeline serialize");
    kvs_serde_pair_destroy(&pair);
    return nw;
}

/* fuzz_frame: opt, groups-1, per group (dtype | ndim<<4, dims), blob. The
 * destination described matches the blob's layout ([2, n/2] of dt), so the
 * seeds decode. */
static void frame_seeds(void)
{
    static const uint8_t hash[4] = {0xF0, 0x0D, 0xCA, 0xFE}; /* fuzz_frame's key */
    kvs_object_key key;
    check(kvs_object_key_init(&key, hash, sizeof hash, "fuzz/model", 1, 2, "salt"), "key");
    struct {
        const char *name, *cfg;
        kvs_dtype dt;
        unsigned n, opt;
        int keyed;
    } s[] = {
        {"fp8-crc32c", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"}]}",
         KVS_DTYPE_BFLOAT16, 24, 0x00, 0},
        {"fp8-e5m2-xxh3-keyed",
         "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\",\"fp8_dtype\":\"float8_e5m2\","
         "\"saturate\":false},{\"type\":\"xxh3\"}]}",
         KVS_DTYPE_FLOAT16, 16, 0x10, 1},
        {"bytes-crc32c-f32",
         "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"crc32c\"}]}",
         KVS_DTYPE_FLOAT32, 8, 0x08, 0},
        {"bytes-xxh3-keyed-fixups",
         "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"xxh3\"}]}",
         KVS_DTYPE_BFLOAT16, 12, 0x3F, 1},
        {"fp8-sat-f32-wrong-dst", "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"}]}",
         KVS_DTYPE_FLOAT32, 24, 0x06, 0},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        static buf b;
        static uint8_t out[8192];
        b.n = 0;
        b_u8(&b, s[i].opt);
        b_u8(&b, 0); /* one group */
        kvs_dtype ddt = strstr(s[i].name, "wrong-dst") ? KVS_DTYPE_BFLOAT16 : s[i].dt;
        b_u8(&b, (unsigned)ddt | 2 << 4);
        b_u8(&b, 2);
        b_u8(&b, s[i].n / 2);
        size_t nw = pipeline_blob(s[i].cfg, s[i].dt, s[i].n, s[i].keyed ? &key : NULL, out,
                                  sizeof out);
        b_mem(&b, out, nw);
        put("frame", s[i].name, b.b, b.n);
    }
}

/* fuzz_pipeline_roundtrip: chain, groups-1, per group (dtype index | ndim<<4,
 * dims), key (hash len, hash, model len-1, model, rank, group), u32
 * mutation position, u8 xor, data. */
static void roundtrip_seeds(void)
{
    struct {
        const char *name;
        unsigned chain, ngroups, dt[3], ndim[3], dims[3][3], hlen;
        uint32_t pos;
    } s[] = {
        {"bytes-bf16", 0x00, 1, {0}, {2}, {{4, 8}}, 0, 3},
        {"fp8-e4m3-sat-crc32c-keyed", 0x2D, 2, {0, 2}, {1, 2}, {{8}, {2, 4}}, 4, 40},
        {"fp8-e5m2-xxh3-f16", 0x53, 1, {1}, {3}, {{2, 2, 4}}, 16, 1000},
        {"bytes-xxh3-three-groups", 0xB0, 3, {2, 1, 0}, {1, 0, 2}, {{3}, {0}, {2, 3}}, 32, 7},
        {"fp8-empty-group", 0x05, 2, {0, 0}, {1, 2}, {{0}, {4, 4}}, 1, 0},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        static buf b;
        b.n = 0;
        b_u8(&b, s[i].chain);
        b_u8(&b, s[i].ngroups - 1);
        for (unsigned g = 0; g < s[i].ngroups; g++) {
            b_u8(&b, s[i].dt[g] | s[i].ndim[g] << 4);
            for (unsigned d = 0; d < s[i].ndim[g]; d++) b_u8(&b, s[i].dims[g][d]);
        }
        b_u8(&b, s[i].hlen);
        for (unsigned k = 0; k < s[i].hlen; k++) b_u8(&b, k * 17 + 1);
        b_u8(&b, 4);
        for (unsigned k = 0; k < 5; k++) b_u8(&b, k * 5 + (unsigned)i);
        b_u8(&b, 0xFF); /* rank -1 */
        b_u8(&b, 3);
        b_u32(&b, s[i].pos);
        b_u8(&b, 0x40);
        for (unsigned k = 0; k < 256; k++) b_u8(&b, k & 1 ? 0x3C + (k % 5) : k * 29);
        put("pipeline_roundtrip", s[i].name, b.b, b.n);
    }
}

static void put_lossless_payload(const kvs_serde_pair *p, kvs_memobj *src, unsigned opt,
                                 const char *name, unsigned version)
{
    size_t est, n;
    kvs_memobj *dst;
    check(kvs_estimate_serialized_size(p->serializer, &src->layout, &est), "estimate");
    kvs_layout bl;
    check(kvs_layout_flat(&bl, est, KVS_DTYPE_UINT8), "layout");
    check(kvs_memobj_alloc(&bl, KVS_FMT_BINARY, &dst), "alloc");
    check(kvs_serialize(p->serializer, src, dst, NULL, &n), "serialize");
    const uint8_t *b = dst->data;
    size_t h = (size_t)(b[6] | b[7] << 8);
    check(version == 0 || b[h] == version ? KVS_OK : KVS_EINVAL, "the payload version");
    buf out;
    out.n = 0;
    b_u8(&out, opt);
    b_mem(&out, b + h, n - h - 4);
    put("lossless", name, out.b, out.n);
    kvs_memobj_free(dst);
}

/* fuzz_lossless: opt, then a stage payload (decode mode, bit 2 clear) or
 * data to encode (bit 2 set). Payloads are cut from real frames of
 * [bytes, lossless, crc32c]: the bytes between the header and the CRC. */
static void lossless_seeds(void)
{
    static const struct {
        const char *name;
        kvs_dtype dtype;
        size_t nelems;
        int fill;
        unsigned opt;
    } s[] = {
        {"bf16-smooth", KVS_DTYPE_BFLOAT16, 700, 1, 2},
        {"bf16-equal", KVS_DTYPE_BFLOAT16, 333, 0, 2},
        {"f32-random", KVS_DTYPE_FLOAT32, 65, 2, 3},
        {"u8-smooth", KVS_DTYPE_UINT8, 1001, 1, 1},
    };
    /* the rANS coder (bit 5 of the options; channel count from bits 6-7:
     * 1, 3, 256, 4096) on the bfloat16 ones, "-rans-" in the names */
    for (int rans = 0; rans < 2; rans++) {
        char cfg[160];
        snprintf(cfg, sizeof cfg,
                 "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},"
                 "{\"type\":\"lossless\"%s},{\"type\":\"crc32c\"}]}",
                 rans ? ",\"coder\":\"rans\"" : "");
        kvs_serde_pair p;
        check(kvs_serde_create_pair(cfg, &p), "lossless pipeline");
        for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
            if (rans && s[i].dtype != KVS_DTYPE_BFLOAT16) continue;
            const unsigned opt = s[i].opt | (rans ? 0x20u | (s[i].fill ? 2u : 1u) << 6 : 0u);
            const char *coder = rans ? "-rans" : "";
            kvs_layout l;
            check(kvs_layout_flat(&l, s[i].nelems, s[i].dtype), "layout");
            kvs_memobj *src;
            check(kvs_memobj_alloc(&l, KVS_FMT_BINARY, &src), "alloc");
            uint8_t *d = src->data;
            uint32_t x = 12345;
            for (size_t k = 0; k < src->capacity; k++) {
                x = x * 1103515245u + 12345u;
                d[k] = s[i].fill == 0                ? 0x3F
                       : s[i].fill == 1 && (k & 1) ? (uint8_t)(0x3C + (x >> 30))
                                                   : (uint8_t)(x >> 24);
            }
            char name[64];
            snprintf(name, sizeof name, "%s%s-payload", s[i].name, coder);
            put_lossless_payload(&p, src, s[i].opt, name, 0);
            static buf out;
            out.n = 0;
            b_u8(&out, opt | 4);
            b_mem(&out, src->data, src->capacity < 4000 ? src->capacity : 4000);
            snprintf(name, sizeof name, "%s%s-data", s[i].name, coder);
            put("lossless", name, out.b, out.n);
            kvs_memobj_free(src);
        }
        kvs_serde_pair_destroy(&p);
    }
}

/* A deterministic fill of an object's single group with values of a few
 * magnitudes (exponents near 1) and both signs, like a KV chunk, built as
 * bits: bfloat16 / float16 / float32. */
static void fill_values(kvs_memobj *o)
{
    uint32_t x = 777;
    const kvs_dtype dt = o->layout.groups[0].dtype;
    const size_t n = (size_t)kvs_layout_numel(&o->layout);
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        const uint32_t r = x >> 8, e = (r >> 20) % 6;
        if (dt == KVS_DTYPE_FLOAT32) {
            uint32_t u = (r & 0x807FFFFFu) | (124 + e) << 23;
            memcpy((uint8_t *)o->data + 4 * i, &u, 4);
        } else {
            uint16_t h = dt == KVS_DTYPE_BFLOAT16 ? (uint16_t)((r & 0x807F) | (124 + e) << 7)
                                                  : (uint16_t)((r & 0x83FF) | (12 + e) << 10);
            memcpy((uint8_t *)o->data + 2 * i, &h, 2);
        }
    }
}

/* Serialize `o` through the pipeline `cfg` (no key); the stage-0 parameters
 * and the payload (without the appended CRC) are cut from the frame
 * (docs/frame_format.md: header length at 6, groups at 25, stages at 26,
 * group and stage records from 28). Returns the payload length. */
static size_t frame_parts(const char *cfg, const kvs_memobj *o, uint8_t *out, size_t cap,
                          const uint8_t **params, size_t *nparams, const uint8_t **payload)
{
    kvs_serde_pair p;
    check(kvs_serde_create_pair(cfg, &p), cfg);
    kvs_layout bl;
    check(kvs_layout_flat(&bl, cap, KVS_DTYPE_UINT8), "layout");
    kvs_memobj dst;
    check(kvs_memobj_init(&dst, out, cap, &bl, KVS_FMT_BINARY), "init");
    size_t n;
    check(kvs_serialize(p.serializer, o, &dst, NULL, &n), cfg);
    kvs_serde_pair_destroy(&p);
    size_t h = (size_t)(out[6] | out[7] << 8), q = 28;
    for (unsigned g = 0; g < out[25]; g++) q += 2 + 8 * (size_t)out[q + 1];
    *nparams = (size_t)(out[q + 2] | out[q + 3] << 8);
    *params = out + q + 4;
    *payload = out + h;
    return n - h - 4; /* the crc32c the pipeline appends */
}

/* fuzz_int: 14 parameter bytes, options (memory format index | 4 encode),
 * layout (dtype index | (rank - 1) << 2), dims, then a payload (decode) or
 * the values (encode), cut from real frames of [int]. */
static void int_seeds(void)
{
    static const struct {
        const char *name, *stage;
        kvs_memory_format fmt;
        unsigned fmt_index;
        kvs_dtype dt;
        unsigned dt_index, nd;
        int64_t dims[4];
        int encode;
    } s[] = {
        {"kivi4-2td-decode", "{\"type\":\"int\",\"bits\":4,\"k_axis\":\"channel\",\"v_axis\":\"token\"}",
         KVS_FMT_KV_2TD, 2, KVS_DTYPE_BFLOAT16, 0, 3, {2, 16, 16}, 0},
        {"kivi4-2td-encode", "{\"type\":\"int\",\"bits\":4,\"k_axis\":\"channel\",\"v_axis\":\"token\"}",
         KVS_FMT_KV_2TD, 2, KVS_DTYPE_BFLOAT16, 0, 3, {2, 16, 16}, 1},
        {"int8-2ltd-f16-decode", "{\"type\":\"int\",\"bits\":8}",
         KVS_FMT_KV_2LTD, 1, KVS_DTYPE_FLOAT16, 1, 4, {2, 2, 8, 16}, 0},
        {"had16-t2d-encode", "{\"type\":\"int\",\"bits\":3,\"hadamard\":16,\"zero_point\":false}",
         KVS_FMT_KV_T2D, 3, KVS_DTYPE_BFLOAT16, 0, 3, {8, 2, 16}, 1},
        {"int2-binary-f32-decode", "{\"type\":\"int\",\"bits\":2,\"v_group\":32}",
         KVS_FMT_BINARY, 0, KVS_DTYPE_FLOAT32, 2, 2, {4, 32}, 0},
    };
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        char cfg[256];
        snprintf(cfg, sizeof cfg, "{\"type\":\"pipeline\",\"stages\":[%s]}", s[i].stage);
        kvs_layout l = {0};
        check(kvs_layout_add_group(&l, s[i].nd, s[i].dims, s[i].dt), "layout");
        kvs_memobj *o;
        check(kvs_memobj_alloc(&l, s[i].fmt, &o), "alloc");
        fill_values(o);
        static uint8_t frame[1 << 15];
        const uint8_t *params, *payload;
        size_t np, n = frame_parts(cfg, o, frame, sizeof frame, &params, &np, &payload);
        static buf b;
        b.n = 0;
        b_mem(&b, params, np);
        b_u8(&b, s[i].fmt_index | (s[i].encode ? 4u : 0u));
        b_u8(&b, s[i].dt_index | (s[i].nd - 1) << 2);
        for (unsigned d = 0; d < s[i].nd; d++) b_u8(&b, (unsigned)s[i].dims[d]);
        if (s[i].encode) b_mem(&b, o->data, o->capacity);
        else b_mem(&b, payload, n);
        put("int", s[i].name, b.b, b.n);
        kvs_memobj_free(o);
    }
}

/* fuzz_transform: options, token count - 1, data. The fuzzer calibrates
 * its own small transform at start, which this program does not have, so
 * the seeds are encode-mode chunks (bit 0; steps from bits 1-3) and two
 * decode-mode payloads (versions 1 and 2) too short for the coder's header. */
static void transform_seeds(void)
{
    static const uint8_t short_payload[] = {0x00, 0x03, 0x01, 0x00, 0x00, 0x00};
    put("transform", "dec-short", short_payload, sizeof short_payload);
    static const uint8_t short_v2[] = {0x00, 0x03, 0x02, 0x00, 0x00, 0x00}; /* version 2 */
    put("transform", "dec-short-v2", short_v2, sizeof short_v2);
    static const struct {
        const char *name;
        unsigned opt, tokens;
    } s[] = {{"enc-7-tokens", 0x01, 7}, {"enc-32-tokens-fine", 0x0F, 32}, {"enc-1-token", 0x05, 1}};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        kvs_layout l;
        check(kvs_layout_flat(&l, 2 * 2 * s[i].tokens * 16, KVS_DTYPE_BFLOAT16), "layout");
        kvs_memobj *o;
        check(kvs_memobj_alloc(&l, KVS_FMT_BINARY, &o), "alloc");
        fill_values(o);
        static buf b;
        b.n = 0;
        b_u8(&b, s[i].opt);
        b_u8(&b, s[i].tokens - 1);
        b_mem(&b, o->data, o->capacity);
        put("transform", s[i].name, b.b, b.n);
        kvs_memobj_free(o);
    }
}

/* fuzz_rans: options (contexts - 1 | 4 round trip), then the symbols: a
 * skewed distribution like an exponent plane's, a flat one, and a single
 * symbol repeated. (Files of the corpus named by a hash are inputs a fuzz
 * run found, kept for their coverage.) */
static void rans_seeds(void)
{
    static const struct {
        const char *name;
        unsigned opt, n, kind;
    } s[] = {{"rt-skewed-1ctx", 0x04, 3000, 0}, {"rt-flat-3ctx", 0x06, 1024, 1},
             {"rt-constant-4ctx", 0x07, 777, 2}};
    for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
        static buf b;
        b.n = 0;
        b_u8(&b, s[i].opt);
        uint32_t x = 99;
        for (unsigned k = 0; k < s[i].n; k++) {
            x = x * 1103515245u + 12345u;
            unsigned r = x >> 16;
            b_u8(&b, s[i].kind == 0 ? 120 + (r % 7) * (r % 3) : s[i].kind == 1 ? r & 0xFF : 0x7F);
        }
        put("rans", s[i].name, b.b, b.n);
    }
}

/* [64, 16] bfloat16 whose rows copy earlier rows in part. */
static void fill_rows_copied(uint16_t *v)
{
    uint32_t x = 12345;
    size_t from = 0;
    for (size_t k = 0; k < 64 * 16; k++) {
        x = x * 1103515245u + 12345u;
        size_t r = k / 16;
        if (k % 16 == 0) from = r ? (x >> 8) % r : 0;
        v[k] = r && (x >> 31) ? v[from * 16 + k % 16] : (uint16_t)(0x3C00 + (x >> 22));
    }
}

/* [64, 16] bfloat16 whose channels keep their sign from row to row but
 * for one in four. */
static void fill_signs_kept(uint16_t *v)
{
    uint32_t x = 54321;
    for (size_t k = 0; k < 64 * 16; k++) {
        x = x * 1103515245u + 12345u;
        unsigned sign = k < 16 || k % 4 == 3 ? x >> 31 : (unsigned)(v[k - 16] >> 15);
        if ((x >> 16) % 64 == 0) sign ^= 1;
        v[k] = (uint16_t)(sign << 15 | (0x3C00 + (x >> 22)));
    }
}

/* fuzz_lossless, the rANS coder at `level` on [64, 16] bfloat16 made by
 * fill: its payload (which must be `version`) as NAME-payload, and the
 * same data to encode at that level with 256 channels (opt bits 3-4
 * level_bits) as NAME-data. */
static void lossless_rans_seeds(int level, unsigned level_bits, void (*fill)(uint16_t *),
                                const char *name, unsigned version)
{
    char cfg[256], pname[64];
    snprintf(cfg, sizeof cfg,
             "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","
             "\"coder\":\"rans\",\"level\":%d},{\"type\":\"crc32c\"}]}",
             level);
    kvs_serde_pair p;
    check(kvs_serde_create_pair(cfg, &p), "lossless rans pipeline");
    kvs_layout l = {0};
    const int64_t dims[2] = {64, 16};
    check(kvs_layout_add_group(&l, 2, dims, KVS_DTYPE_BFLOAT16), "layout");
    kvs_memobj *src;
    check(kvs_memobj_alloc(&l, KVS_FMT_BINARY, &src), "alloc");
    fill(src->data);
    snprintf(pname, sizeof pname, "%s-payload", name);
    put_lossless_payload(&p, src, 2, pname, version);
    buf out;
    out.n = 0;
    b_u8(&out, 2 | 4 | level_bits << 3 | 32 | 2u << 6);
    b_mem(&out, src->data, src->capacity);
    snprintf(pname, sizeof pname, "%s-data", name);
    put("lossless", pname, out.b, out.n);
    kvs_memobj_free(src);
    kvs_serde_pair_destroy(&p);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    g_root = argv[1];
    mkdir(g_root, 0777);
    json_seeds();
    fp8_seeds();
    ggml_seeds();
    kv_split_seeds();
    key_seeds();
    safetensors_seed();
    frame_seeds();
    roundtrip_seeds();
    lossless_seeds();
    lossless_rans_seeds(2, 1, fill_rows_copied, "bf16-rows-refs", 3); /* row references */
    lossless_rans_seeds(3, 2, fill_signs_kept, "bf16-signs", 4);      /* coded signs */
    int_seeds();
    transform_seeds();
    rans_seeds();
    return 0;
}
