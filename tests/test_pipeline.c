/* test_pipeline.c - framed pipelines (pipeline.h, src/frame/): creation and
 * the ordering rules, the exact bytes of a frame (header fields at the
 * offsets of src/frame/frame.h, the fp8 payload against the plain fp8 serde,
 * the checksums against independent implementations), hostile frames
 * (every byte flipped, every truncation), the key binding, verify, and the
 * key plumbing of the async processor and of the serde wrapper, and the
 * bytes stage's source read in place by the transform after it (read-only
 * pages, a guard page after it, the bytes of the stages run on a copy).
 * aes_gcm inside a pipeline (the header and key bound, wrong keys, fused
 * blocks) is here; the cipher itself is test_aes_gcm.c's. */
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "codecs/fp8_kernels.h"
#include "frame/frame.h"
#include "frame/pipeline_internal.h"
#include "frame/stage.h"
#include "frame/stage_aes_gcm.h"
#include "kvs_test.h"
#include "kvs_test_objs.h"
#include "kvserde/l2.h"
#include "kvserde/l2_memory.h"
#include "kvserde/memobj.h"
#include "kvserde/pipeline.h"
#include "kvserde/processor.h"
#include "kvserde/registry.h"
#include "kvserde/serde.h"

#define MODEL "test_model"
#define CANARY 0xA5
#define FP8_CRC "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"crc32c\"}]}"
#define FP8_XXH3 "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"xxh3\"}]}"
#define BYTES_CRC "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"crc32c\"}]}"
#define BYTES_XXH3 "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"xxh3\"}]}"

/* ---------------------------------------------------------------------
 * Independent references: bitwise CRC-32C, little-endian fields
 * ------------------------------------------------------------------ */

static uint32_t ref_crc32c(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

static uint64_t rd_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void wr_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Recompute a patched header's CRC, so the check after it is what fires. */
static void fix_header_crc(uint8_t *blob)
{
    size_t h = (size_t)rd_le(blob + 6, 2);
    wr_le(blob + h - 4, ref_crc32c(blob, h - 4), 4);
}

/* ---------------------------------------------------------------------
 * Keys, layouts, objects
 * ------------------------------------------------------------------ */

static kvs_object_key make_key(const char *hash, const char *model, int64_t rank, int64_t gid,
                               const char *salt)
{
    kvs_object_key k;
    if (kvs_object_key_init(&k, hash, strlen(hash), model, rank, gid, salt) != KVS_OK) abort();
    return k;
}

static kvs_object_key key_a(void) { return make_key("chunk-A", MODEL, 0, 0, "salt"); }

/* Key A and the five keys that differ from it in one field each. */
static void key_variants(kvs_object_key *k)
{
    k[0] = key_a();
    k[1] = make_key("chunk-B", MODEL, 0, 0, "salt");
    k[2] = make_key("chunk-A", MODEL, 0, 0, "salt2");
    k[3] = make_key("chunk-A", "other_model", 0, 0, "salt");
    k[4] = make_key("chunk-A", MODEL, 1, 0, "salt");
    k[5] = make_key("chunk-A", MODEL, 0, 1, "salt");
}

static kvs_object_key key_n(int i)
{
    char h[24];
    snprintf(h, sizeof h, "chunk-%d", i);
    return make_key(h, MODEL, 0, 0, NULL);
}

static void add_group(kvs_layout *l, kvs_dtype dt, uint32_t ndim, int64_t d0, int64_t d1,
                      int64_t d2, int64_t d3)
{
    const int64_t dims[4] = {d0, d1, d2, d3};
    if (kvs_layout_add_group(l, ndim, dims, dt) != KVS_OK) abort();
}

static kvs_layout layout_kv(kvs_dtype dt, int64_t tokens)
{
    kvs_layout l = {0};
    add_group(&l, dt, 4, 2, 2, tokens, 8);
    return l;
}

static kvs_memobj *new_obj(const kvs_layout *l)
{
    kvs_memobj *o = NULL;
    if (kvs_memobj_alloc(l, KVS_FMT_KV_2LTD, &o) != KVS_OK) abort();
    return o;
}

static kvs_memobj *new_canary(const kvs_layout *l)
{
    kvs_memobj *o = new_obj(l);
    memset(o->data, CANARY, o->capacity);
    return o;
}

static int canary_intact(const kvs_memobj *o)
{
    const uint8_t *p = o->data;
    for (size_t i = 0; i < o->capacity; i++)
        if (p[i] != CANARY) return 0;
    return 1;
}

static kvs_memobj *new_bytes_obj(size_t n)
{
    kvs_layout l;
    if (kvs_layout_flat(&l, n, KVS_DTYPE_UINT8) != KVS_OK) abort();
    return new_obj(&l);
}

/* Every bit pattern, NaN and inf included: the bytes of a fixed LCG. */
static void fill_random(kvs_memobj *o, uint64_t seed)
{
    uint64_t s = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    uint8_t *p = o->data;
    for (size_t i = 0; i < o->capacity; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        p[i] = (uint8_t)(s >> 56);
    }
}

/* bfloat16 values float8_e4m3fn holds exactly, rotated by `rot`. */
static void fill_exact_bf16(kvs_memobj *o, int rot)
{
    static const uint16_t v[8] = {0x0000, 0x3F00, 0xBF80, 0x3FC0, 0x4000, 0xC040, 0x4080, 0x3E80};
    uint8_t *p = o->data;
    for (size_t i = 0; i < o->capacity / 2; i++) wr_le(p + 2 * i, v[(i + (size_t)rot) % 8], 2);
}

static int same_data(const kvs_memobj *a, const kvs_memobj *b)
{
    size_t n = (size_t)kvs_layout_nbytes(&a->layout);
    return n == (size_t)kvs_layout_nbytes(&b->layout) && memcmp(a->data, b->data, n) == 0;
}

/* ---------------------------------------------------------------------
 * Sync serialize / deserialize on raw blobs
 * ------------------------------------------------------------------ */

typedef struct blob {
    uint8_t *data;
    size_t len, estimate;
} blob;

/* Serialize into a buffer of exactly the estimate; data NULL on failure. */
static blob ser(kvs_serde_pair *p, const kvs_memobj *src, const kvs_object_key *key)
{
    blob b = {NULL, 0, 0};
    if (kvs_estimate_serialized_size(p->serializer, &src->layout, &b.estimate) != KVS_OK)
        return b;
    kvs_memobj *dst = new_bytes_obj(b.estimate);
    if (kvs_serialize(p->serializer, src, dst, key, &b.len) == KVS_OK) {
        b.data = malloc(b.len + 1); /* room for one trailing byte */
        memcpy(b.data, dst->data, b.len);
    }
    kvs_memobj_free(dst);
    return b;
}

static int deser(kvs_serde_pair *p, const uint8_t *data, size_t len, kvs_memobj *dst,
                 const kvs_object_key *key)
{
    kvs_memobj src = {(void *)data, len, len, {0}, KVS_FMT_UNDEFINED, 0};
    if (kvs_layout_flat(&src.layout, len, KVS_DTYPE_UINT8) != KVS_OK) abort();
    return kvs_deserialize(p->deserializer, &src, dst, key);
}

static size_t header_len(const blob *b) { return (size_t)rd_le(b->data + 6, 2); }

/* ---------------------------------------------------------------------
 * 1. Creation
 * ------------------------------------------------------------------ */

static void test_create_ok(void)
{
    static const char *const ok[] = {
        FP8_CRC, FP8_XXH3, BYTES_CRC, BYTES_XXH3,
        "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"}]}",
        "{\"type\":\"pipeline\",\"max_workers\":2,\"stages\":[{\"type\":\"fp8\","
        "\"fp8_dtype\":\"float8_e5m2\",\"saturate\":false},{\"type\":\"xxh3\"}]}",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        kvs_serde_pair p;
        CHECK_OK(kvs_serde_create_pair(ok[i], &p));
        kvs_serde_pair_destroy(&p);
    }
}

static void test_create_refused(void)
{
#define ST(list) "{\"type\":\"pipeline\",\"stages\":" list "}"
    static const struct {
        const char *json, *msg;
    } cases[] = {
        {"{\"type\":\"pipeline\"}",
         "pipeline: \"stages\" is required: a list such as [{\"type\": \"fp8\"}, "
         "{\"type\": \"crc32c\"}]"},
        {ST("[]"), "pipeline: \"stages\" must be a non-empty list of stage objects, got an "
                   "empty array"},
        {ST("\"fp8\""),
         "pipeline: \"stages\" must be a non-empty list of stage objects, got string"},
        {ST("[1]"), "pipeline: stage 0 must be an object with a string \"type\"; got integer"},
        {ST("[{\"type\":\"fp8\"},[]]"),
         "pipeline: stage 1 must be an object with a string \"type\"; got array"},
        {ST("[{\"fp8_dtype\":\"float8_e5m2\"}]"),
         "pipeline: stage 0 must be an object with a string \"type\"; its \"type\" is missing"},
        {ST("[{\"type\":2}]"),
         "pipeline: stage 0 must be an object with a string \"type\"; its \"type\" is integer"},
        {ST("[{\"type\":\"zstd\"}]"),
         "pipeline: stage 0: unknown stage type 'zstd'; known: bytes, fp8, crc32c, xxh3, "
         "aes_gcm, lossless, ggml_q8_0, ggml_q4_0, int, transform"},
        {ST("[{\"type\":\"crc32c\"}]"),
         "pipeline: stage 0 'crc32c' is a bytes -> bytes stage; the chain starts with one "
         "typed stage (bytes, fp8, ggml_q8_0, ggml_q4_0, int, transform)"},
        {ST("[{\"type\":\"fp8\"},{\"type\":\"bytes\"}]"),
         "pipeline: stage 1 'bytes' is a typed stage; only stage 0 may be typed (tensor -> "
         "bytes), the rest are bytes -> bytes stages"},
        {ST("[{\"type\":\"fp8\"},{\"type\":\"crc32c\"},{\"type\":\"xxh3\"}]"),
         "pipeline: at most one checksum stage: stage 1 'crc32c' and stage 2 'xxh3'"},
        {ST("[{\"type\":\"bytes\"},{\"type\":\"xxh3\"},{\"type\":\"xxh3\"}]"),
         "pipeline: at most one checksum stage: stage 1 'xxh3' and stage 2 'xxh3'"},
        {ST("[{\"type\":\"fp8\",\"foo\":1}]"),
         "pipeline: stage 0: fp8: unknown member 'foo'; accepted: type, fp8_dtype, saturate"},
        {ST("[{\"type\":\"bytes\",\"foo\":1}]"),
         "pipeline: stage 0: bytes: unknown member 'foo'; accepted: type"},
        {ST("[{\"type\":\"fp8\"},{\"type\":\"crc32c\",\"x\":1}]"),
         "pipeline: stage 1: crc32c: unknown member 'x'; accepted: type"},
        {ST("[{\"type\":\"fp8\",\"fp8_dtype\":\"float16\"}]"),
         "pipeline: stage 0: fp8: fp8_dtype must be one of float8_e4m3fn, float8_e5m2; got "
         "'float16'"},
        {ST("[{\"type\":\"fp8\",\"saturate\":1}]"),
         "pipeline: stage 0: fp8: saturate must be a JSON boolean, got integer"},
        {"{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"}],\"foo\":1}",
         "pipeline: unknown kwarg 'foo'; accepted: stages, max_workers"},
        {ST("[{\"type\":\"bytes\"},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}]"),
         "pipeline: 17 stages; at most 16"},
    };
#undef ST
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvs_serde_pair p;
        memset(&p, 0x5A, sizeof p);
        CHECK_ERR(kvs_serde_create_pair(cases[i].json, &p), KVS_EINVAL, cases[i].msg);
        CHECK(p.serializer == NULL && p.deserializer == NULL);
    }
}

/* [fp8] gets crc32c appended, and the frame records it. */
static void test_checksum_appended(void)
{
    kvs_serde_pair p = kvs_test_serde_pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"}]}");
    kvs_layout l = layout_kv(KVS_DTYPE_BFLOAT16, 4);
    kvs_memobj *src = new_obj(&l);
    fill_random(src, 1);
    kvs_object_key k = key_a();
    blob b = ser(&p, src, &k);
    REQUIRE(b.data != NULL);
    kvs_frame_info info;
    CHECK_EQ_INT(kvs_frame_detect(b.data, b.len), 1);
    CHECK_EQ_INT(kvs_frame_detect(b.data, 3), 0);
    REQUIRE_OK(kvs_frame_inspect(b.data, b.len, &info));
    CHECK_EQ_INT(info.version, 1);
    CHECK_EQ_INT(info.keyed, 1);
    CHECK_EQ_U64(info.key_fingerprint, kvs_object_key_fingerprint(&k));
    CHECK_EQ_INT(info.header_bytes, 76);
    CHECK_EQ_U64(info.payload_bytes, 128 + 4);
    CHECK_EQ_INT(info.format, KVS_FMT_KV_2LTD);
    CHECK(kvs_layout_equal(&info.layout, &l));
    REQUIRE(info.nstages == 2);
    CHECK_EQ_STR(info.stages[0].name, "fp8");
    CHECK_EQ_STR(info.stages[0].params, "{\"fp8_dtype\":\"float8_e4m3fn\",\"saturate\":true}");
    CHECK_EQ_STR(info.stages[1].name, "crc32c");
    CHECK_EQ_STR(info.stages[1].params, "{}");
    CHECK_ERR(kvs_frame_inspect(b.data, 3, &info), KVS_ECORRUPT,
              "frame: not a kvserde frame (3 bytes, no 'KVSF' magic)");
    CHECK_ERR(kvs_frame_inspect(b.data, b.len, NULL), KVS_EINVAL,
              "frame: inspect: NULL argument");
    const char *names[10];
    CHECK_EQ_INT(kvs_pipeline_stage_types(names, 10), 10);
    CHECK_EQ_STR(names[0], "bytes");
    CHECK_EQ_STR(names[4], "aes_gcm");
    CHECK_EQ_STR(names[5], "lossless");
    CHECK_EQ_STR(names[6], "ggml_q8_0");
    CHECK_EQ_STR(names[8], "int");
    CHECK_EQ_STR(names[9], "transform");
    free(b.data);
    kvs_memobj_free(src);
    kvs_serde_pair_destroy(&p);
}

/* ---------------------------------------------------------------------
 * 2. Bytes
 * ------------------------------------------------------------------ */

static void test_crc32c_reference(void)
{
    CHECK_EQ_U64(ref_crc32c((const uint8_t *)"123456789", 9), 0xE3069283u);
}

/* The frame of src through `pipeline_json` against the plain fp8 serde of
 * `plain_json`: payload identical, trailer the independent digest, sizes
 * exact. digest 4 = crc32c, 8 = xxh3. */
static void check_fp8_frame(const char *pipeline_json, const char *plain_json,
                            const kvs_memobj *src, int digest)
{
    kvs_serde_pair p = kvs_test_serde_pair(pipeline_json), plain = kvs_test_serde_pair(plain_json);
    kvs_object_key k = key_a();
    blob b = ser(&p, src, &k), ref = ser(&plain, src, NULL);
    size_t n = (size_t)kvs_layout_numel(&src->layout);
    REQUIRE(b.data != NULL && ref.data != NULL);
    size_t h = header_len(&b);
    CHECK_EQ_INT(ref.len, n);
    CHECK_EQ_INT(b.len, h + n + (size_t)digest);
    CHECK_EQ_INT(b.estimate, b.len);
    CHECK(memcmp(b.data + h, ref.data, n) == 0);
    if (digest == 4)
        CHECK_EQ_U64(rd_le(b.data + h + n, 4), ref_crc32c(b.data + h, n));
    else
        CHECK_EQ_U64(rd_le(b.data + h + n, 8), XXH3_64bits(b.data + h, n));
    /* and back: the fp8 serde's decoding, through the frame */
    kvs_memobj *a = new_obj(&src->layout), *c = new_obj(&src->layout);
    CHECK_OK(deser(&p, b.data, b.len, a, &k));
    CHECK_OK(deser(&plain, ref.data, ref.len, c, NULL));
    CHECK(same_data(a, c));
    kvs_memobj_free(a);
    kvs_memobj_free(c);
    free(b.data);
    free(ref.data);
    kvs_serde_pair_destroy(&p);
    kvs_serde_pair_destroy(&plain);
}

static void test_fp8_payload_is_plain_fp8(void)
{
    static const kvs_dtype src_dtypes[] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16,
                                           KVS_DTYPE_FLOAT32};
    static const char *const fp8[] = {"float8_e4m3fn", "float8_e5m2"};
    static const char *const sat[] = {"true", "false"};
    for (size_t d = 0; d < 3; d++) {
        kvs_layout l = {0};
        add_group(&l, src_dtypes[d], 4, 2, 3, 5, 7); /* 210: SIMD tails too */
        kvs_memobj *src = new_obj(&l);
        fill_random(src, 10 + d);
        for (int f = 0; f < 2; f++)
            for (int s = 0; s < 2; s++) {
                char pj[256], plj[128];
                snprintf(pj, sizeof pj,
                         "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\",\"fp8_dtype\":"
                         "\"%s\",\"saturate\":%s},{\"type\":\"%s\"}]}",
                         fp8[f], sat[s], (f + s) % 2 ? "xxh3" : "crc32c");
                snprintf(plj, sizeof plj,
                         "{\"type\":\"fp8\",\"fp8_dtype\":\"%s\",\"saturate\":%s}", fp8[f],
                         sat[s]);
                check_fp8_frame(pj, plj, src, (f + s) % 2 ? 8 : 4);
            }
        kvs_memobj_free(src);
    }
}

/* Every field of the header at its offset (src/frame/frame.h). */
static void test_header_bytes(void)
{
    kvs_serde_pair p = kvs_test_serde_pair(
        "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\",\"fp8_dtype\":\"float8_e5m2\","
        "\"saturate\":false},{\"type\":\"xxh3\"}]}");
    kvs_layout l = layout_kv(KVS_DTYPE_BFLOAT16, 4);
    kvs_memobj *src = new_obj(&l);
    fill_random(src, 2);
    kvs_object_key k = key_a();
    blob b = ser(&p, src, &k), u = ser(&p, src, NULL);
    REQUIRE(b.data != NULL && u.data != NULL);
    /* 28 fixed + group (2 + 4 x 8) + fp8 (4 + 2) + xxh3 (4) + CRC 4 */
    const size_t h = 28 + 34 + 6 + 4 + 4;
    const uint8_t *x = b.data;
    CHECK(memcmp(x, "KVSF", 4) == 0);
    CHECK_EQ_INT(x[4], 1);
    CHECK_EQ_INT(x[5], 1);
    CHECK_EQ_U64(rd_le(x + 6, 2), h);
    CHECK_EQ_U64(rd_le(x + 8, 8), 128 + 8);
    CHECK_EQ_U64(rd_le(x + 16, 8), kvs_object_key_fingerprint(&k));
    CHECK_EQ_INT(x[24], KVS_FMT_KV_2LTD);
    CHECK_EQ_INT(x[25], 1);
    CHECK_EQ_INT(x[26], 2);
    CHECK_EQ_INT(x[27], 0);
    CHECK_EQ_INT(x[28], KVS_DTYPE_BFLOAT16);
    CHECK_EQ_INT(x[29], 4);
    static const int64_t dims[4] = {2, 2, 4, 8};
    for (int d = 0; d < 4; d++) CHECK_EQ_U64(rd_le(x + 30 + 8 * d, 8), (uint64_t)dims[d]);
    CHECK_EQ_U64(rd_le(x + 62, 2), 2); /* fp8 stage id */
    CHECK_EQ_U64(rd_le(x + 64, 2), 2); /* nparams */
    CHECK_EQ_INT(x[66], KVS_DTYPE_FLOAT8_E5M2);
    CHECK_EQ_INT(x[67], 0); /* saturate false */
    CHECK_EQ_U64(rd_le(x + 68, 2), 65); /* xxh3 */
    CHECK_EQ_U64(rd_le(x + 70, 2), 0);
    CHECK_EQ_U64(rd_le(x + h - 4, 4), ref_crc32c(x, h - 4));
    CHECK_EQ_INT(b.len, h + 128 + 8);
    CHECK_EQ_U64(rd_le(x + h + 128, 8), XXH3_64bits(x + h, 128));
    /* unbound: flags 0, fingerprint 0, the rest equal but the CRC */
    CHECK_EQ_INT(u.len, b.len);
    CHECK_EQ_INT(u.data[5], 0);
    CHECK_EQ_U64(rd_le(u.data + 16, 8), 0);
    CHECK(memcmp(u.data + 24, x + 24, h - 28) == 0);
    CHECK_EQ_U64(rd_le(u.data + h - 4, 4), ref_crc32c(u.data, h - 4));
    CHECK(memcmp(u.data + h, x + h, 136) == 0);
    /* deterministic */
    blob again = ser(&p, src, &k);
    CHECK(again.data && again.len == b.len && memcmp(again.data, b.data, b.len) == 0);
    free(again.data);
    free(b.data);
    free(u.data);
    kvs_memobj_free(src);
    kvs_serde_pair_destroy(&p);
}

/* bytes + check: the payload is the source's bytes, sizes exact, the round
 * trip bit-exact. */
static void check_bytes_roundtrip(const char *json, const kvs_layout *l, uint64_t seed,
                                  int digest)
{
    kvs_serde_pair p = kvs_test_serde_pair(json);
    kvs_memobj *src = new_obj(l), *dst = new_canary(l);
    fill_random(src, seed);
    size_t nb = (size_t)kvs_layout_nbytes(l);
    kvs_object_key k = key_a();
    blob b = ser(&p, src, &k);
    REQUIRE(b.data != NULL);
    size_t h = header_len(&b);
    CHECK_EQ_INT(b.len, h + nb + (size_t)digest);
    CHECK_EQ_INT(b.estimate, b.len);
    CHECK(nb == 0 || memcmp(b.data + h, src->data, nb) == 0);
    if (digest == 4)
        CHECK_EQ_U64(rd_le(b.data + h + nb, 4), ref_crc32c(b.data + h, nb));
    else
        CHECK_EQ_U64(rd_le(b.data + h + nb, 8), XXH3_64bits(b.data + h, nb));
    CHECK_OK(deser(&p, b.data, b.len, dst, &k));
    CHECK(same_data(src, dst));
    free(b.data);
    kvs_memobj_free(src);
    kvs_memobj_free(dst);
    kvs_serde_pair_destroy(&p);
}

static void test_bytes_every_dtype(void)
{
    for (int dt = 0; dt < KVS_DTYPE_COUNT; dt++) {
        kvs_layout l = {0};
        add_group(&l, (kvs_dtype)dt, 3, 3, 5, 7, 0);
        check_bytes_roundtrip(BYTES_CRC, &l, 20 + (uint64_t)dt, 4);
        check_bytes_roundtrip(BYTES_XXH3, &l, 30 + (uint64_t)dt, 8);
    }
}

static void test_multi_group_and_empty(void)
{
    kvs_layout l = {0};
    add_group(&l, KVS_DTYPE_BFLOAT16, 3, 2, 3, 4, 0);
    add_group(&l, KVS_DTYPE_UINT8, 2, 0, 3, 0, 0); /* 0 elements */
    add_group(&l, KVS_DTYPE_FLOAT32, 1, 5, 0, 0, 0);
    add_group(&l, KVS_DTYPE_FLOAT8_E5M2, 0, 0, 0, 0, 0); /* scalar */
    check_bytes_roundtrip(BYTES_CRC, &l, 40, 4);
    check_bytes_roundtrip(BYTES_XXH3, &l, 41, 8);
    kvs_layout empty = {0};
    add_group(&empty, KVS_DTYPE_FLOAT16, 2, 0, 8, 0, 0);
    check_bytes_roundtrip(BYTES_CRC, &empty, 42, 4);
    /* fp8 over groups of different dtypes, one of them empty */
    kvs_layout f = {0};
    add_group(&f, KVS_DTYPE_BFLOAT16, 3, 2, 3, 4, 0);
    add_group(&f, KVS_DTYPE_FLOAT32, 2, 0, 3, 0, 0);
    add_group(&f, KVS_DTYPE_FLOAT16, 1, 7, 0, 0, 0);
    kvs_memobj *src = new_obj(&f);
    fill_random(src, 43);
    check_fp8_frame(FP8_CRC, "{\"type\":\"fp8\"}", src, 4);
    kvs_memobj_free(src);
}

/* Big enough for several fused blocks (256 KiB) and a partial last one. */
static void test_large_object(void)
{
    kvs_layout l;
    REQUIRE_OK(kvs_layout_flat(&l, (3u << 20) / 2 + 1000, KVS_DTYPE_BFLOAT16));
    check_bytes_roundtrip(BYTES_CRC, &l, 50, 4);
    kvs_memobj *src = new_obj(&l);
    fill_random(src, 51);
    check_fp8_frame(FP8_XXH3, "{\"type\":\"fp8\"}", src, 8);
    kvs_memobj_free(src);
}

/* ---------------------------------------------------------------------
 * 3. Hostile frames
 * ------------------------------------------------------------------ */

/* A serde, a source, its keyed frame and a canary destination. */
typedef struct fixture {
    kvs_serde_pair p;
    kvs_object_key key;
    kvs_memobj *src, *dst;
    blob b;
    uint8_t *work; /* a copy to damage */
} fixture;

static int fixture_open(fixture *f, const char *json, int64_t tokens)
{
    f->p = kvs_test_serde_pair(json);
    f->key = key_a();
    kvs_layout l = layout_kv(KVS_DTYPE_BFLOAT16, tokens);
    f->src = new_obj(&l);
    fill_exact_bf16(f->src, 0);
    f->dst = new_canary(&l);
    f->b = ser(&f->p, f->src, &f->key);
    f->work = malloc(f->b.len + 1);
    return f->b.data != NULL;
}

static void fixture_close(fixture *f)
{
    free(f->b.data);
    free(f->work);
    kvs_memobj_free(f->src);
    kvs_memobj_free(f->dst);
    kvs_serde_pair_destroy(&f->p);
}

static uint8_t *fixture_copy(fixture *f)
{
    memcpy(f->work, f->b.data, f->b.len);
    return f->work;
}

/* Deserialize and verify agree on a damaged blob; returns the code. */
static int load_both(fixture *f, const uint8_t *data, size_t len, const kvs_object_key *key)
{
    int rc = deser(&f->p, data, len, f->dst, key);
    char msg[KVS_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", kvs_last_error());
    CHECK_ERR(kvs_pipeline_verify(f->p.deserializer, data, len, key), rc, msg);
    return rc;
}

/* Refused by both with exactly (code, msg), the destination untouched. */
static void expect_refused(fixture *f, const uint8_t *data, size_t len,
                           const kvs_object_key *key, int code, const char *msg)
{
    CHECK_ERR(load_both(f, data, len, key), code, msg);
    CHECK(canary_intact(f->dst));
}

static void test_every_byte_flipped(void)
{
    fixture f;
    REQUIRE(fixture_open(&f, FP8_CRC, 4));
    CHECK_EQ_INT(f.b.len, 76 + 128 + 4);
    static const uint8_t masks[] = {0xFF, 0x01};
    for (int m = 0; m < 2; m++) {
        size_t refused = 0, canary_kept = 0;
        for (size_t i = 0; i < f.b.len; i++) {
            uint8_t *w = fixture_copy(&f);
            w[i] ^= masks[m];
            int rc = load_both(&f, w, f.b.len, &f.key);
            if (rc == KVS_ECORRUPT || rc == KVS_EUNSUPPORTED || rc == KVS_EKEY) refused++;
            else fprintf(stderr, "byte %zu ^ 0x%02x: %d %s\n", i, masks[m], rc, kvs_last_error());
            canary_kept += canary_intact(f.dst);
        }
        CHECK_EQ_INT(refused, f.b.len);
        CHECK_EQ_INT(canary_kept, f.b.len);
    }
    fixture_close(&f);
}

static void test_truncated_and_trailing(void)
{
    fixture f;
    REQUIRE(fixture_open(&f, FP8_CRC, 4));
    size_t refused = 0;
    for (size_t n = 0; n < f.b.len; n++) {
        uint8_t *w = fixture_copy(&f);
        refused += load_both(&f, w, n, &f.key) == KVS_ECORRUPT && canary_intact(f.dst);
    }
    CHECK_EQ_INT(refused, f.b.len);
    REQUIRE(f.b.len == 208);
    static const struct {
        size_t len;
        const char *msg;
    } cases[] = {
        {3, "pipeline: not a kvserde frame (3 bytes, no 'KVSF' magic)"},
        {20, "pipeline: frame truncated: 20 bytes, a header needs at least 32"},
        {50, "pipeline: frame header length 76 does not fit the 50-byte blob"},
        {207, "pipeline: frame truncated: payload is 132 bytes, the blob holds 131 after its "
              "76-byte header"},
        {209, "pipeline: frame has trailing bytes: payload is 132 bytes, the blob holds 133 "
              "after its 76-byte header"},
    };
    uint8_t *w = fixture_copy(&f);
    w[208] = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_refused(&f, w, cases[i].len, &f.key, KVS_ECORRUPT, cases[i].msg);
    fixture_close(&f);
}

/* Patches with the header CRC fixed, so the check behind it fires. */
static void test_patched_fields(void)
{
    fixture f;
    REQUIRE(fixture_open(&f, FP8_CRC, 4));
    static const struct {
        size_t off;
        int width;
        uint64_t value;
        int code;
        const char *msg;
    } cases[] = {
        {4, 1, 2, KVS_EUNSUPPORTED,
         "pipeline: frame format version 2; this build reads version 1"},
        {68, 2, 99, KVS_EUNSUPPORTED,
         "pipeline: frame stage 1 has unknown stage id 99; this build knows ids 1 (bytes), 2 "
         "(fp8), 64 (crc32c), 65 (xxh3), 66 (aes_gcm), 80 (lossless), 16 (ggml_q8_0), "
         "17 (ggml_q4_0), 8 (int), 3 (transform)"},
        {5, 1, 3, KVS_EUNSUPPORTED, "pipeline: unknown frame flags 0x03"},
        {5, 1, 0, KVS_ECORRUPT, "pipeline: unbound frame carries a key fingerprint"},
        {24, 1, 9, KVS_ECORRUPT, "pipeline: unknown memory format 9 in the frame"},
        {25, 1, 17, KVS_ECORRUPT, "pipeline: frame has 17 groups, at most 16"},
        {26, 1, 0, KVS_ECORRUPT, "pipeline: frame has 0 stages, expected 1 to 16"},
        {27, 1, 1, KVS_ECORRUPT, "pipeline: reserved frame byte is 0x01, not 0"},
        {28, 1, 6, KVS_ECORRUPT, "pipeline: group 0 has unknown dtype 6"},
        {29, 1, 9, KVS_ECORRUPT, "pipeline: group 0 has 9 dims, at most 8"},
        {62, 2, 64, KVS_ECORRUPT, "pipeline: frame stage 0 'crc32c' is not a typed stage"},
        {68, 2, 1, KVS_ECORRUPT, "pipeline: frame stage 1 'bytes' is also a typed stage"},
        {66, 1, 3, KVS_ECORRUPT,
         "pipeline: frame stage 0: fp8: frame names fp8 dtype 3, expected 4 or 5"},
        {67, 1, 2, KVS_ECORRUPT,
         "pipeline: frame stage 0: fp8: frame saturate flag is 2, expected 0 or 1"},
        {8, 8, 131, KVS_ECORRUPT,
         "pipeline: frame has trailing bytes: payload is 131 bytes, the blob holds 132 after "
         "its 76-byte header"},
        {8, 8, 2, KVS_ECORRUPT,
         "pipeline: frame has trailing bytes: payload is 2 bytes, the blob holds 132 after its "
         "76-byte header"},
        {64, 2, 3, KVS_ECORRUPT,
         "pipeline: frame stage 0: fp8: 3 parameter bytes in the frame, expected 2"},
        {64, 2, 10, KVS_ECORRUPT,
         "pipeline: frame stage 0 has 10 parameter bytes; 6 remain in the header, at most 64 "
         "allowed"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *w = fixture_copy(&f);
        wr_le(w + cases[i].off, cases[i].value, cases[i].width);
        fix_header_crc(w);
        expect_refused(&f, w, f.b.len, &f.key, cases[i].code, cases[i].msg);
    }
    /* header CRC: flip a fingerprint byte */
    uint8_t *w = fixture_copy(&f);
    w[16] ^= 0x01;
    char msg[256];
    snprintf(msg, sizeof msg, "pipeline: frame header damaged: CRC-32C 0x%08x, stored 0x%08x",
             ref_crc32c(w, 72), (unsigned)rd_le(w + 72, 4));
    expect_refused(&f, w, f.b.len, &f.key, KVS_ECORRUPT, msg);
    /* the payload's checksum: flip a payload byte */
    w = fixture_copy(&f);
    w[76 + 5] ^= 0x01;
    snprintf(msg, sizeof msg,
             "pipeline: crc32c: payload damaged: checksum %08x over 128 bytes, stored %08x; "
             "loading key %016llx, model 'test_model'",
             ref_crc32c(w + 76, 128), (unsigned)rd_le(w + 76 + 128, 4),
             (unsigned long long)kvs_object_key_fingerprint(&f.key));
    expect_refused(&f, w, f.b.len, &f.key, KVS_ECORRUPT, msg);
    /* a payload shorter than its checksum (the header says 2 bytes) */
    w = fixture_copy(&f);
    wr_le(w + 8, 2, 8);
    fix_header_crc(w);
    expect_refused(&f, w, 78, NULL, KVS_ECORRUPT,
                   "pipeline: crc32c: payload damaged: 2 bytes, shorter than the 4-byte "
                   "checksum; loading no key");
    fixture_close(&f);
}

static void test_wrong_destination(void)
{
    fixture f;
    REQUIRE(fixture_open(&f, FP8_XXH3, 64));
    kvs_layout small = layout_kv(KVS_DTYPE_BFLOAT16, 48), f16 = layout_kv(KVS_DTYPE_FLOAT16, 64);
    kvs_memobj *a = new_canary(&small), *b = new_canary(&f16);
    CHECK_ERR(deser(&f.p, f.b.data, f.b.len, a, &f.key), KVS_ECORRUPT,
              "pipeline: stored object is [2x2x64x8 bfloat16] (4096 bytes), destination layout "
              "is [2x2x48x8 bfloat16] (3072 bytes)");
    CHECK_ERR(deser(&f.p, f.b.data, f.b.len, b, &f.key), KVS_ECORRUPT,
              "pipeline: stored object is [2x2x64x8 bfloat16] (4096 bytes), destination layout "
              "is [2x2x64x8 float16] (4096 bytes)");
    CHECK(canary_intact(a) && canary_intact(b));
    CHECK_OK(deser(&f.p, f.b.data, f.b.len, f.dst, &f.key));
    CHECK(same_data(f.src, f.dst));
    kvs_memobj_free(a);
    kvs_memobj_free(b);
    fixture_close(&f);
}

/* ---------------------------------------------------------------------
 * 4. Keys
 * ------------------------------------------------------------------ */

/* The message of a frame of `stored` loaded under `loading`, after `prefix`. */
static const char *foreign_msg(char *buf, const char *prefix, const kvs_object_key *stored,
                               const kvs_object_key *loading)
{
    snprintf(buf, KVS_ERROR_MSG_MAX,
             "%spipeline: blob was written for another key: stored key fingerprint %016llx, "
             "loading key %016llx, model '%s'",
             prefix, (unsigned long long)kvs_object_key_fingerprint(stored),
             (unsigned long long)kvs_object_key_fingerprint(loading), loading->model_name);
    return buf;
}

/* XXH3-64 of the canonical bytes, built here from docs/frame_format.md. */
static uint64_t ref_fingerprint(const kvs_object_key *k)
{
    uint8_t buf[1024];
    size_t n = 0, ml = strlen(k->model_name), sl = strlen(k->cache_salt);
    memcpy(buf, "kvserde-key-v1", 15);
    n = 15;
    wr_le(buf + n, k->chunk_hash_len, 4);
    n += 4;
    memcpy(buf + n, k->chunk_hash, k->chunk_hash_len);
    n += k->chunk_hash_len;
    wr_le(buf + n, ml, 2);
    memcpy(buf + n + 2, k->model_name, ml);
    n += 2 + ml;
    wr_le(buf + n, (uint64_t)k->kv_rank, 8);
    wr_le(buf + n + 8, (uint64_t)k->object_group_id, 8);
    wr_le(buf + n + 16, sl, 2);
    memcpy(buf + n + 18, k->cache_salt, sl);
    return XXH3_64bits(buf, n + 18 + sl);
}

static void test_fingerprints(void)
{
    kvs_object_key k[6], again = key_a();
    key_variants(k);
    CHECK_EQ_U64(kvs_object_key_fingerprint(&k[0]), kvs_object_key_fingerprint(&again));
    CHECK_EQ_U64(kvs_object_key_fingerprint(NULL), 0);
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_U64(kvs_object_key_fingerprint(&k[i]), ref_fingerprint(&k[i]));
        for (int j = 0; j < i; j++)
            CHECK(kvs_object_key_fingerprint(&k[i]) != kvs_object_key_fingerprint(&k[j]));
    }
}

static void test_key_binding(void)
{
    fixture f;
    REQUIRE(fixture_open(&f, FP8_CRC, 4));
    kvs_object_key k[6];
    key_variants(k);
    for (int i = 1; i < 6; i++) {
        CHECK_EQ_INT(load_both(&f, f.b.data, f.b.len, &k[i]), KVS_EKEY);
        CHECK(canary_intact(f.dst));
    }
    char msg[KVS_ERROR_MSG_MAX];
    expect_refused(&f, f.b.data, f.b.len, &k[2], KVS_EKEY, foreign_msg(msg, "", &k[0], &k[2]));
    /* the right key, and no key at all, load */
    CHECK_OK(kvs_pipeline_verify(f.p.deserializer, f.b.data, f.b.len, &k[0]));
    CHECK_OK(kvs_pipeline_verify(f.p.deserializer, f.b.data, f.b.len, NULL));
    CHECK_OK(deser(&f.p, f.b.data, f.b.len, f.dst, NULL));
    CHECK(same_data(f.src, f.dst));
    /* a blob written with no key, loaded under one */
    blob u = ser(&f.p, f.src, NULL);
    REQUIRE(u.data != NULL);
    kvs_memobj_free(f.dst);
    f.dst = new_canary(&f.src->layout);
    snprintf(msg, sizeof msg,
             "pipeline: blob was written without an object key, loaded for key %016llx, "
             "model 'test_model'",
             (unsigned long long)kvs_object_key_fingerprint(&k[0]));
    expect_refused(&f, u.data, u.len, &k[0], KVS_EKEY, msg);
    CHECK_OK(deser(&f.p, u.data, u.len, f.dst, NULL));
    CHECK(same_data(f.src, f.dst));
    free(u.data);
    fixture_close(&f);
}

static void test_verify_arguments(void)
{
    fixture f;
    REQUIRE(fixture_open(&f, FP8_CRC, 4));
    kvs_serde_pair fp8 = kvs_test_serde_pair("{\"type\":\"fp8\"}");
    CHECK_ERR(kvs_pipeline_verify(fp8.deserializer, f.b.data, f.b.len, NULL), KVS_EINVAL,
              "pipeline: verify needs a pipeline deserializer, got 'fp8'");
    CHECK_ERR(kvs_pipeline_verify(NULL, f.b.data, f.b.len, NULL), KVS_EINVAL,
              "pipeline: verify: NULL argument");
    CHECK_ERR(kvs_pipeline_verify(f.p.deserializer, NULL, 4, NULL), KVS_EINVAL,
              "pipeline: verify: NULL argument");
    CHECK_ERR(kvs_pipeline_verify(f.p.deserializer, NULL, 0, NULL), KVS_ECORRUPT,
              "pipeline: not a kvserde frame (0 bytes, no 'KVSF' magic)");
    /* the plain fp8 serde's output is not a frame */
    blob plain = ser(&fp8, f.src, NULL);
    REQUIRE(plain.data != NULL);
    CHECK_ERR(load_both(&f, plain.data, plain.len, NULL), KVS_ECORRUPT,
              "pipeline: not a kvserde frame (128 bytes, no 'KVSF' magic)");
    free(plain.data);
    kvs_serde_pair_destroy(&fp8);
    fixture_close(&f);
}

/* ---------------------------------------------------------------------
 * 5. The async processor passes keys[i] to object i
 * ------------------------------------------------------------------ */

#define NOBJ 3

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A task's result, queried by `query`: KVS_OK and *done set once it is in,
 * a status if querying failed. */
typedef struct waiter {
    int (*query)(struct waiter *w, int *done);
    void *handle; /* the processor or the adapter */
    uint64_t id;
    int serialize;
    void *out; /* kvs_task_result, kvs_l2_store_result or kvs_l2_bitmap */
} waiter;

/* Query, waiting on fd in between, for up to 10 s (then -1). */
static int wait_result(waiter *w, int fd)
{
    for (int64_t end = now_ms() + 10000; now_ms() < end;) {
        int done = 0, rc = w->query(w, &done);
        if (rc || done) return rc;
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, 50) > 0) kvs_event_fd_consume(fd, NULL);
    }
    return -1;
}

static int query_proc(waiter *w, int *done)
{
    kvs_task_result *r = w->out;
    int rc = w->serialize ? kvs_processor_query_serialize_result(w->handle, w->id, r)
                          : kvs_processor_query_deserialize_result(w->handle, w->id, r);
    *done = r->state != KVS_TASK_PENDING;
    return rc;
}

/* Run one processor task to its end. */
static int proc_run(kvs_processor *p, int serialize, kvs_memobj **src, kvs_memobj **dst,
                    size_t n, const kvs_object_key *keys, kvs_task_result *r)
{
    waiter w = {query_proc, p, 0, serialize, r};
    int rc = serialize ? kvs_processor_submit_serialize(p, src, n, dst, n, keys, &w.id)
                       : kvs_processor_submit_deserialize(p, src, n, dst, n, keys, &w.id);
    if (rc) return rc;
    return wait_result(&w, serialize ? kvs_processor_serialize_event_fd(p)
                                     : kvs_processor_deserialize_event_fd(p));
}

static void new_kv_objs(kvs_memobj **o, const kvs_layout *l, int canary)
{
    for (int i = 0; i < NOBJ; i++) o[i] = canary ? new_canary(l) : new_obj(l);
}

static void free_objs(kvs_memobj **o, size_t n)
{
    for (size_t i = 0; i < n; i++) kvs_memobj_free(o[i]);
}

static void check_failed(const kvs_task_result *r, int status, const char *msg)
{
    CHECK_EQ_INT(r->state, KVS_TASK_FAILED);
    CHECK_EQ_INT(r->status, status);
    CHECK_EQ_INT(r->failed_index, 0);
    if (msg) CHECK_EQ_STR(r->message, msg);
}

/* Deserialize blobs[] into fresh objects under keys: OK and src's data. */
static void check_loads(kvs_processor *p, kvs_memobj **blobs, const kvs_object_key *keys,
                        kvs_memobj **src, const kvs_layout *l)
{
    kvs_memobj *out[NOBJ];
    kvs_task_result r;
    new_kv_objs(out, l, 1);
    CHECK_OK(proc_run(p, 0, blobs, out, NOBJ, keys, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    for (int i = 0; i < NOBJ; i++) CHECK(same_data(src[i], out[i]));
    free_objs(out, NOBJ);
}

static void test_processor_keys(void)
{
    kvs_processor *p = NULL;
    REQUIRE_OK(kvs_serde_create(FP8_CRC, &p));
    kvs_layout l = layout_kv(KVS_DTYPE_BFLOAT16, 4);
    size_t est;
    REQUIRE_OK(kvs_processor_estimate_serialized_size(p, &l, &est));
    CHECK_EQ_INT(est, 76 + 128 + 4);
    kvs_memobj *src[NOBJ], *blobs[NOBJ], *ublobs[NOBJ], *out[NOBJ];
    kvs_object_key keys[NOBJ], rotated[NOBJ];
    new_kv_objs(src, &l, 0);
    for (int i = 0; i < NOBJ; i++) {
        fill_exact_bf16(src[i], i);
        blobs[i] = new_bytes_obj(est);
        ublobs[i] = new_bytes_obj(est);
        keys[i] = key_n(i);
    }
    for (int i = 0; i < NOBJ; i++) rotated[i] = keys[(i + 1) % NOBJ];
    kvs_task_result r;
    REQUIRE_OK(proc_run(p, 1, src, blobs, NOBJ, keys, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    REQUIRE_OK(proc_run(p, 1, src, ublobs, NOBJ, NULL, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    for (int i = 0; i < NOBJ; i++) {
        kvs_frame_info info;
        CHECK_EQ_INT(kvs_memobj_size(blobs[i]), est);
        REQUIRE_OK(kvs_frame_inspect(blobs[i]->data, kvs_memobj_size(blobs[i]), &info));
        CHECK_EQ_U64(info.key_fingerprint, kvs_object_key_fingerprint(&keys[i]));
        REQUIRE_OK(kvs_frame_inspect(ublobs[i]->data, kvs_memobj_size(ublobs[i]), &info));
        CHECK_EQ_INT(info.keyed, 0);
    }
    /* the same keys: exact data; keys NULL: no binding check, keyed or not */
    check_loads(p, blobs, keys, src, &l);
    check_loads(p, blobs, NULL, src, &l);
    check_loads(p, ublobs, NULL, src, &l);
    /* rotated keys: the batch stops at object 0, and each object alone fails */
    char msg[KVS_ERROR_MSG_MAX];
    new_kv_objs(out, &l, 1);
    REQUIRE_OK(proc_run(p, 0, blobs, out, NOBJ, rotated, &r));
    check_failed(&r, KVS_EKEY,
                 foreign_msg(msg, "processor: deserialize object 0 of 3 failed: ", &keys[0],
                             &keys[1]));
    for (int i = 0; i < NOBJ; i++) {
        REQUIRE_OK(proc_run(p, 0, &blobs[i], &out[i], 1, &rotated[i], &r));
        check_failed(&r, KVS_EKEY,
                     foreign_msg(msg, "processor: deserialize object 0 of 1 failed: ", &keys[i],
                                 &rotated[i]));
        CHECK(canary_intact(out[i]));
    }
    /* an unkeyed blob loaded under a key */
    REQUIRE_OK(proc_run(p, 0, ublobs, out, NOBJ, keys, &r));
    check_failed(&r, KVS_EKEY, NULL);
    CHECK(canary_intact(out[0]));
    free_objs(out, NOBJ);
    free_objs(src, NOBJ);
    free_objs(blobs, NOBJ);
    free_objs(ublobs, NOBJ);
    kvs_processor_destroy(p);
}

/* ---------------------------------------------------------------------
 * 6. The serde wrapper passes the caller's keys on store and load
 * ------------------------------------------------------------------ */

/* The only store in flight on the adapter: its result, popped. */
static int query_store(waiter *w, int *done)
{
    kvs_l2_store_result *res = w->out;
    size_t c = 0;
    int rc = kvs_l2_pop_completed_stores(w->handle, res, 1, &c);
    *done = c == 1;
    return rc == KVS_OK && c == 1 && res->id != w->id ? -1 : rc;
}

static int query_load(waiter *w, int *done)
{
    kvs_l2_bitmap *bm = w->out;
    int rc = kvs_l2_query_load(w->handle, w->id, bm);
    *done = bm->state != KVS_TASK_PENDING;
    return rc;
}

static int l2_store(kvs_l2_adapter *a, const kvs_object_key *keys, kvs_memobj **objs, size_t n,
                    kvs_l2_store_result *res)
{
    waiter w = {query_store, a, 0, 1, res};
    int rc = kvs_l2_submit_store(a, keys, objs, n, &w.id);
    return rc ? rc : wait_result(&w, kvs_l2_store_event_fd(a));
}

static int l2_load(kvs_l2_adapter *a, const kvs_object_key *keys, kvs_memobj **objs, size_t n,
                   kvs_l2_bitmap *bm)
{
    waiter w = {query_load, a, 0, 0, bm};
    int rc = kvs_l2_submit_load(a, keys, objs, n, &w.id);
    return rc ? rc : wait_result(&w, kvs_l2_load_event_fd(a));
}

static void test_wrapper_keys(void)
{
    kvs_l2_adapter *mem = NULL, *w = NULL;
    kvs_processor *p = NULL;
    REQUIRE_OK(kvs_memory_adapter_create(NULL, &mem));
    REQUIRE_OK(kvs_serde_create(FP8_XXH3, &p));
    REQUIRE_OK(kvs_serde_wrapper_create(mem, p, NULL, &w)); /* w owns mem and p */
    kvs_layout l = layout_kv(KVS_DTYPE_BFLOAT16, 4);
    kvs_memobj *src[2], *out[2];
    kvs_object_key keys[2] = {key_n(0), key_n(1)};
    for (int i = 0; i < 2; i++) {
        src[i] = new_obj(&l);
        fill_exact_bf16(src[i], i + 1);
        out[i] = new_canary(&l);
    }
    kvs_l2_store_result sr;
    REQUIRE_OK(l2_store(w, keys, src, 2, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    CHECK_EQ_U64(sr.bytes_written, 2 * (76 + 128 + 8));
    kvs_l2_bitmap bm;
    REQUIRE_OK(l2_load(w, keys, out, 2, &bm));
    CHECK_EQ_INT(bm.nhits, 2);
    CHECK(same_data(src[0], out[0]) && same_data(src[1], out[1]));
    kvs_l2_bitmap_release(&bm);
    /* the inner store holds frames bound to the caller's keys (not temp keys) */
    kvs_memobj *raw = new_bytes_obj(76 + 128 + 8);
    REQUIRE_OK(l2_load(mem, &keys[0], &raw, 1, &bm));
    CHECK_EQ_INT(bm.nhits, 1);
    kvs_l2_bitmap_release(&bm);
    kvs_frame_info info;
    REQUIRE_OK(kvs_frame_inspect(raw->data, kvs_memobj_size(raw), &info));
    CHECK_EQ_U64(info.key_fingerprint, kvs_object_key_fingerprint(&keys[0]));
    /* key 0's frame stored under key 1 in the inner store (the wrapper pops the
     * inner's store results, so the copy is seen by loading it back) */
    kvs_l2_task_id sid;
    REQUIRE_OK(kvs_l2_submit_store(mem, &keys[1], &raw, 1, &sid));
    kvs_memobj *back = new_bytes_obj(76 + 128 + 8);
    int copied = 0;
    for (int64_t end = now_ms() + 10000; !copied && now_ms() < end;) {
        REQUIRE_OK(l2_load(mem, &keys[1], &back, 1, &bm));
        copied = bm.nhits == 1 && memcmp(back->data, raw->data, kvs_memobj_size(raw)) == 0;
        kvs_l2_bitmap_release(&bm);
    }
    kvs_memobj_free(back);
    REQUIRE(copied);
    /* loading key 1 through the wrapper is refused */
    kvs_memobj *one = new_canary(&l);
    REQUIRE_OK(l2_load(w, &keys[1], &one, 1, &bm));
    CHECK_EQ_INT(bm.nkeys, 1);
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK(bm.hits && bm.hits[0] == 0);
    CHECK_EQ_INT(bm.status, KVS_EKEY);
    char msg[KVS_ERROR_MSG_MAX];
    CHECK_EQ_STR(bm.message,
                 foreign_msg(msg,
                             "serde wrapper: load of key 0: processor: deserialize object 0 of "
                             "1 failed: ",
                             &keys[0], &keys[1]));
    CHECK(canary_intact(one));
    kvs_l2_bitmap_release(&bm);
    kvs_memobj_free(one);
    kvs_memobj_free(raw);
    free_objs(src, 2);
    free_objs(out, 2);
    kvs_l2_destroy(w);
}

/* A frame with no checksum and no encryption (kvserde never writes one)
 * could be damaged unnoticed: the reader refuses it. */
static void test_unchecked_frame_refused(void)
{
    kvs_layout l = layout_kv(KVS_DTYPE_BFLOAT16, 4);
    size_t numel = (size_t)kvs_layout_numel(&l);
    uint16_t ids[1] = {KVS_STAGE_FP8};
    uint8_t params[2] = {KVS_DTYPE_FLOAT8_E4M3FN, 1};
    const uint8_t *pp[1] = {params};
    size_t np[1] = {2};
    size_t h = kvs_frame_header_size(&l, np, 1);
    uint8_t *frame = calloc(1, h + numel);
    REQUIRE(frame != NULL);
    kvs_frame_write_header(frame, &l, KVS_FMT_KV_2LTD, NULL, numel, ids, pp, np, 1);
    kvs_serde_pair p = kvs_test_serde_pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"}]}");
    kvs_memobj *dst = new_canary(&l);
    CHECK_ERR(deser(&p, frame, h + numel, dst, NULL), KVS_ECORRUPT,
              "pipeline: frame has no payload check (no checksum or encryption stage)");
    CHECK(canary_intact(dst));
    kvs_memobj_free(dst);
    kvs_serde_pair_destroy(&p);
    free(frame);
}

/* ---------------------------------------------------------------------
 * 7. aes_gcm inside a pipeline: the frame header and the object key are
 *    authenticated, keys rotate, and each failure has its own outcome
 * ------------------------------------------------------------------ */

/* A key file of 32 bytes `fill` with the given mode; returns its path. */
static const char *key_file(char *path, size_t cap, uint8_t fill, mode_t mode)
{
    snprintf(path, cap, "/tmp/kvs-test-pipeline-key-%d-%02x", (int)getpid(), fill);
    uint8_t k[32];
    memset(k, fill, sizeof k);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(k, 1, sizeof k, f) != sizeof k) abort();
    fclose(f);
    if (chmod(path, mode) != 0) abort();
    return path;
}

static void aes_config(char *json, size_t cap, const char *first, const char *second)
{
    if (second)
        snprintf(json, cap,
                 "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"crc32c\"},"
                 "{\"type\":\"aes_gcm\",\"key_files\":[\"%s\",\"%s\"]}]}",
                 first, second);
    else
        snprintf(json, cap,
                 "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"crc32c\"},"
                 "{\"type\":\"aes_gcm\",\"key_file\":\"%s\"}]}",
                 first);
}

static void test_aes_gcm_pipeline(void)
{
    char k1[128], k2[128], open_key[128], json[512], msg[KVS_ERROR_MSG_MAX];
    key_file(k1, sizeof k1, 0x11, 0600);
    key_file(k2, sizeof k2, 0x22, 0600);
    fixture f;
    aes_config(json, sizeof json, k1, NULL);
    REQUIRE(fixture_open(&f, json, 4));
    /* fp8 codes + crc32c, encrypted: header + 128 + 4 + 16-byte tag */
    size_t h = header_len(&f.b);
    CHECK_EQ_U64(f.b.len, h + 128 + 4 + 16);
    CHECK_EQ_U64(f.b.len, f.b.estimate);
    CHECK_OK(deser(&f.p, f.b.data, f.b.len, f.dst, &f.key));
    kvs_frame_info info;
    REQUIRE_OK(kvs_frame_inspect(f.b.data, f.b.len, &info));
    CHECK_EQ_INT(info.nstages, 3);
    CHECK_EQ_STR(info.stages[2].name, "aes_gcm");

    /* a fresh nonce per blob: the same source gives another ciphertext */
    blob again = ser(&f.p, f.src, &f.key);
    REQUIRE(again.data != NULL && again.len == f.b.len);
    CHECK(memcmp(again.data + h, f.b.data + h, f.b.len - h) != 0);
    free(again.data);

    /* a ciphertext byte, the tag, and a header byte (with the header CRC
     * made right again, so only the authentication can notice) */
    kvs_memobj_free(f.dst);
    f.dst = new_canary(&f.src->layout);
    const char *auth =
        "aes_gcm: authentication failed (wrong key, or ciphertext, header or object key altered)";
    uint8_t *w = fixture_copy(&f);
    w[h + 3] ^= 0x40;
    expect_refused(&f, w, f.b.len, &f.key, KVS_EAUTH, auth);
    w = fixture_copy(&f);
    w[f.b.len - 1] ^= 0x01;
    expect_refused(&f, w, f.b.len, &f.key, KVS_EAUTH, auth);
    w = fixture_copy(&f);
    w[24] = KVS_FMT_KV_2TD; /* the memory format: valid, but not what was sealed */
    fix_header_crc(w);
    expect_refused(&f, w, f.b.len, &f.key, KVS_EAUTH, auth);
    /* the fingerprint check comes first for another key; with no key the
     * AAD holds no key bytes, so a keyed blob fails authentication */
    kvs_object_key other = key_n(1);
    CHECK_EQ_INT(load_both(&f, f.b.data, f.b.len, &other), KVS_EKEY);
    expect_refused(&f, f.b.data, f.b.len, NULL, KVS_EAUTH, auth);

    /* rotation: a deserializer holding [k2, k1] opens it, one holding only
     * k2 says which key id the blob needs */
    kvs_serde_pair both = kvs_test_serde_pair((aes_config(json, sizeof json, k2, k1), json));
    CHECK_OK(deser(&both, f.b.data, f.b.len, f.dst, &f.key));
    kvs_serde_pair wrong = kvs_test_serde_pair((aes_config(json, sizeof json, k2, NULL), json));
    int rc = deser(&wrong, f.b.data, f.b.len, f.dst, &f.key);
    CHECK_EQ_INT(rc, KVS_EAUTH);
    CHECK(strstr(kvs_last_error(), "aes_gcm: no configured key has key id ") == kvs_last_error());
    kvs_serde_pair_destroy(&both);
    kvs_serde_pair_destroy(&wrong);
    fixture_close(&f);

    /* a key file others can read is refused when the pipeline is made */
    key_file(open_key, sizeof open_key, 0x33, 0644);
    aes_config(json, sizeof json, open_key, NULL);
    kvs_serde_pair p;
    snprintf(msg, sizeof msg,
             "pipeline: stage 2: aes_gcm: key file %s is readable by group or others (mode "
             "0644); chmod 600 it",
             open_key);
    CHECK_ERR(kvs_serde_create_pair(json, &p), KVS_EINVAL, msg);
    /* and nothing may follow the encryption */
    snprintf(json, sizeof json,
             "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"aes_gcm\","
             "\"key_file\":\"%s\"},{\"type\":\"crc32c\"}]}",
             k1);
    CHECK_ERR(kvs_serde_create_pair(json, &p), KVS_EINVAL,
              "pipeline: stage 2 'crc32c' follows the encryption at stage 1 'aes_gcm'; "
              "encryption must be the last stage");
    unlink(k1);
    unlink(k2);
    unlink(open_key);
}

/* Encryption runs fused with the typed stage, block by block (256 KiB of
 * codes per block: 640000 codes make three blocks, the last one short),
 * the checksum's digest encrypted after them: the payload is exactly
 * AES-256-GCM (subkey of the key file's key and the key's salt, AAD = the
 * header then the key's canonical bytes) of the plain fp8 codes and their
 * CRC-32C. Decoding goes through one scratch buffer the deserializer keeps:
 * a second decode allocates none. */
static void test_aes_gcm_fused_blocks(void)
{
    char k1[128], json[512];
    key_file(k1, sizeof k1, 0x11, 0600);
    uint8_t master[32];
    memset(master, 0x11, sizeof master);
    for (int with_crc = 0; with_crc < 2; with_crc++) {
        if (with_crc)
            aes_config(json, sizeof json, k1, NULL);
        else
            snprintf(json, sizeof json,
                     "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},"
                     "{\"type\":\"aes_gcm\",\"key_file\":\"%s\"}]}",
                     k1);
        fixture f;
        REQUIRE(fixture_open(&f, json, 20000));
        size_t n = 640000, d = with_crc ? 4 : 0;
        kvs_frame fr;
        REQUIRE_OK(kvs_frame_parse(f.b.data, f.b.len, "test", &fr));
        CHECK_EQ_U64(fr.payload_len, n + d + 16);
        uint8_t sub[32], kb[KVS_KEY_CANONICAL_MAX];
        REQUIRE_OK(kvs_aes_gcm_subkey(master, "salt", sub));
        size_t klen = kvs_key_canonical(&f.key, kb);
        uint8_t *plain = malloc(n + d);
        REQUIRE(plain != NULL);
        const uint8_t *params = fr.stages[with_crc ? 2 : 1].params;
        CHECK_OK(kvs_aes_gcm_open(sub, params + KVS_AES_GCM_KEY_ID_LEN, fr.header,
                                  fr.header_len, kb, klen, fr.payload, n + d,
                                  fr.payload + n + d, plain));
        kvs_serde_pair fp8 = kvs_test_serde_pair("{\"type\":\"fp8\"}");
        blob ref = ser(&fp8, f.src, NULL);
        REQUIRE(ref.data != NULL && ref.len == n);
        CHECK(memcmp(plain, ref.data, n) == 0);
        if (with_crc) CHECK_EQ_U64(rd_le(plain + n, 4), ref_crc32c(plain, n));
        CHECK_EQ_U64(kvs_pipeline_scratch_allocs(f.p.deserializer), 0);
        CHECK_OK(deser(&f.p, f.b.data, f.b.len, f.dst, &f.key));
        kvs_memobj *c = new_obj(&f.src->layout);
        CHECK_OK(deser(&fp8, ref.data, ref.len, c, NULL));
        CHECK(same_data(f.dst, c));
        memset(f.dst->data, CANARY, f.dst->capacity);
        CHECK_OK(deser(&f.p, f.b.data, f.b.len, f.dst, &f.key));
        CHECK(same_data(f.dst, c));
        CHECK_EQ_U64(kvs_pipeline_scratch_allocs(f.p.deserializer), 1);
        /* a refused blob gives its buffer back too */
        memset(f.dst->data, CANARY, f.dst->capacity);
        uint8_t *w = fixture_copy(&f);
        w[fr.header_len + 300000] ^= 0x08; /* in the second block */
        expect_refused(&f, w, f.b.len, &f.key, KVS_EAUTH,
                       "aes_gcm: authentication failed (wrong key, or ciphertext, header or "
                       "object key altered)");
        CHECK_EQ_U64(kvs_pipeline_scratch_allocs(f.p.deserializer), 1);
        kvs_memobj_free(c);
        free(ref.data);
        free(plain);
        kvs_serde_pair_destroy(&fp8);
        fixture_close(&f);
    }
    unlink(k1);
}

/* Threads decoding through one deserializer share its kept scratch
 * buffers: 4 threads x 20 decodes of an encrypted blob allocate at most one
 * buffer per thread decoding at once, and every decode is exact. */
typedef struct scratch_worker {
    kvs_serde_pair *p;
    const blob *b;
    const kvs_object_key *key;
    const kvs_memobj *want;
    int failures;
} scratch_worker;

static void *scratch_work(void *arg)
{
    scratch_worker *w = arg;
    kvs_memobj *dst = new_obj(&w->want->layout);
    for (int i = 0; i < 20; i++) {
        memset(dst->data, CANARY, dst->capacity);
        if (deser(w->p, w->b->data, w->b->len, dst, w->key) != KVS_OK ||
            !same_data(dst, w->want))
            w->failures++;
    }
    kvs_memobj_free(dst);
    return NULL;
}

static void test_scratch_shared_by_threads(void)
{
    char k1[128], json[512];
    key_file(k1, sizeof k1, 0x44, 0600);
    aes_config(json, sizeof json, k1, NULL);
    fixture f;
    REQUIRE(fixture_open(&f, json, 2000));
    kvs_memobj *want = new_obj(&f.src->layout);
    REQUIRE_OK(deser(&f.p, f.b.data, f.b.len, want, &f.key));
    enum { NT = 4 };
    pthread_t th[NT];
    scratch_worker w[NT];
    for (int i = 0; i < NT; i++) {
        w[i] = (scratch_worker){&f.p, &f.b, &f.key, want, 0};
        REQUIRE(pthread_create(&th[i], NULL, scratch_work, &w[i]) == 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(w[i].failures, 0);
    }
    uint64_t allocs = kvs_pipeline_scratch_allocs(f.p.deserializer);
    CHECK(allocs >= 1 && allocs <= NT);
    kvs_memobj_free(want);
    fixture_close(&f);
    unlink(k1);
}

/* ---------------------------------------------------------------------
 * The bytes stage read in place (pipeline.c: source_view)
 * ------------------------------------------------------------------ */

/* The payload of `bytes` then `stages` by the stages' own calls on a copy of
 * the source, as the pipeline ran them before it read the source in place:
 * each transform into a fresh buffer, each check's digest appended.
 * Returns it (malloc'd, *n bytes), NULL on failure. */
static uint8_t *reference_payload(const char *const *stages, size_t nstages,
                                  const kvs_memobj *src, size_t *n)
{
    *n = (size_t)kvs_layout_nbytes(&src->layout);
    uint8_t *cur = malloc(*n + 16);
    if (cur == NULL) return NULL;
    memcpy(cur, src->data, *n);
    for (size_t i = 0; i < nstages && cur; i++) {
        json_t *config = json_loads(stages[i], 0, NULL);
        const kvs_stage_type *t =
            kvs_stage_type_by_name(json_string_value(json_object_get(config, "type")));
        kvs_stage *st = NULL;
        if (t == NULL || t->create(config, &st) != KVS_OK) abort();
        json_decref(config);
        if (t->kind == KVS_STAGE_CHECK) {
            t->check_digest(cur, *n, cur + *n);
            *n += t->digest_size;
        } else {
            uint8_t params[KVS_STAGE_PARAMS_MAX];
            size_t np = t->params_size(st), cap = t->bytes_bound(st, *n), m = 0;
            kvs_stage_ctx ctx = {NULL, NULL, 0, NULL, 0, 0, NULL};
            if (i == 0) kvs_stage_typed_shape(KVS_STAGE_BYTES, &src->layout, &ctx.elem_size,
                                              &ctx.channels);
            uint8_t *out = malloc(cap + 16);
            if (out == NULL || t->write_params(st, params) != KVS_OK ||
                t->transform_encode(st, params, np, &ctx, cur, *n, out, cap, &m) != KVS_OK) {
                free(out);
                out = NULL;
            }
            free(cur);
            cur = out;
            *n = m;
        }
        t->destroy(st);
    }
    return cur;
}

/* A source the encoder may only read: its pages read-only while it runs,
 * its last byte right before a page nothing may touch (a read past the
 * source faults), its first byte wherever that puts it (not 64-aligned). */
typedef struct guarded_src {
    uint8_t *map;
    size_t span, page;
    kvs_memobj obj;
} guarded_src;

static void guarded_open(guarded_src *g, const kvs_memobj *like)
{
    size_t n = (size_t)kvs_layout_nbytes(&like->layout);
    g->page = (size_t)sysconf(_SC_PAGESIZE);
    g->span = (n + g->page - 1) / g->page * g->page;
    g->map = mmap(NULL, g->span + g->page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                  -1, 0);
    if (g->map == MAP_FAILED) abort();
    uint8_t *data = g->map + g->span - n;
    memcpy(data, like->data, n);
    if (mprotect(g->map + g->span, g->page, PROT_NONE) != 0 ||
        mprotect(g->map, g->span, PROT_READ) != 0 ||
        kvs_memobj_init(&g->obj, data, n, &like->layout, like->format) != KVS_OK)
        abort();
}

static void guarded_close(guarded_src *g) { munmap(g->map, g->span + g->page); }

/* bfloat16 the lossless stage compresses: a few exponents, random
 * mantissas and signs; the rest of the bytes (other dtypes) random too. */
static void fill_kv_like(kvs_memobj *o, uint64_t seed)
{
    fill_random(o, seed);
    uint8_t *p = o->data;
    for (size_t i = 1; i < o->capacity; i += 2) p[i] = (uint8_t)(0x3C + (p[i] & 0x83));
}

/* b decodes, into a destination of canaries, to exactly want's bytes. */
static int decodes_to(kvs_serde_pair *p, const blob *b, const kvs_object_key *key,
                      const kvs_memobj *want)
{
    kvs_memobj *back = new_canary(&want->layout);
    int rc = deser(p, b->data, b->len, back, key);
    if (rc) fprintf(stderr, "deserialize: %s\n", kvs_last_error());
    int ok = rc == KVS_OK && same_data(back, want);
    kvs_memobj_free(back);
    return ok;
}

static void test_bytes_stage_read_in_place(void)
{
    /* after bytes: one out-of-place transform (no scratch), two (the
     * ping-pong through one scratch), checks and encryption after it, and
     * the configs that copy (a check right after bytes: fused) */
    static const char *const ll = "{\"type\":\"lossless\"}";
    static const char *const r1 = "{\"type\":\"lossless\",\"coder\":\"rans\",\"level\":1}";
    static const char *const r2 = "{\"type\":\"lossless\",\"coder\":\"rans\",\"level\":2}";
    static const char *const r3 = "{\"type\":\"lossless\",\"coder\":\"rans\",\"level\":3}";
    static const char *const crc = "{\"type\":\"crc32c\"}";
    static const char *const xxh = "{\"type\":\"xxh3\"}";
    static const struct {
        const char *stages[3];
        size_t n;
    } cases[] = {
        {{ll, crc}, 2},     {{r1, crc}, 2},     {{r2, crc}, 2}, {{r3, crc}, 2}, {{r3, xxh}, 2},
        {{r3, ll, crc}, 3}, {{ll, r2, xxh}, 3}, {{crc}, 1},     {{xxh}, 1},
    };
    kvs_layout layouts[3] = {{0}, {0}, {0}};
    add_group(&layouts[0], KVS_DTYPE_BFLOAT16, 4, 2, 3, 4099, 8); /* 393504 bytes */
    add_group(&layouts[1], KVS_DTYPE_BFLOAT16, 1, 3 * 32768 + 13, 0, 0, 0);
    add_group(&layouts[2], KVS_DTYPE_BFLOAT16, 2, 5, 7, 0, 0); /* two groups, mixed sizes */
    add_group(&layouts[2], KVS_DTYPE_FLOAT32, 2, 3, 11, 0, 0);
    for (size_t l = 0; l < 3; l++) {
        kvs_memobj *plain = new_obj(&layouts[l]);
        fill_kv_like(plain, 77 + l);
        guarded_src g;
        guarded_open(&g, plain);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            char json[512] = "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"}";
            for (size_t i = 0; i < cases[c].n; i++)
                snprintf(json + strlen(json), sizeof json - strlen(json), ",%s",
                         cases[c].stages[i]);
            strncat(json, "]}", sizeof json - strlen(json) - 1);
            kvs_serde_pair p = kvs_test_serde_pair(json);
            blob from_guarded = ser(&p, &g.obj, NULL), from_plain = ser(&p, plain, NULL);
            size_t want_n = 0;
            uint8_t *want = reference_payload(cases[c].stages, cases[c].n, plain, &want_n);
            REQUIRE(from_guarded.data && from_plain.data && want);
            size_t h = header_len(&from_plain);
            CHECK_EQ_U64(from_guarded.len, from_plain.len);
            CHECK(memcmp(from_guarded.data, from_plain.data, from_plain.len) == 0);
            CHECK_EQ_U64(from_plain.len - h, want_n);
            CHECK(memcmp(from_plain.data + h, want, want_n) == 0);
            CHECK(same_data(&g.obj, plain));
            CHECK(decodes_to(&p, &from_guarded, NULL, plain));
            free(want);
            free(from_guarded.data);
            free(from_plain.data);
            kvs_serde_pair_destroy(&p);
        }
        /* encrypted (a fresh nonce per blob): round trips, the source read only */
        char k1[128], json[512];
        key_file(k1, sizeof k1, 0x55, 0600);
        snprintf(json, sizeof json,
                 "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},%s,"
                 "{\"type\":\"aes_gcm\",\"key_file\":\"%s\"}]}",
                 r3, k1);
        kvs_serde_pair p = kvs_test_serde_pair(json);
        kvs_object_key key = key_a();
        blob b = ser(&p, &g.obj, &key);
        REQUIRE(b.data != NULL);
        CHECK(decodes_to(&p, &b, &key, plain));
        free(b.data);
        kvs_serde_pair_destroy(&p);
        unlink(k1);
        guarded_close(&g);
        kvs_memobj_free(plain);
    }
}

int main(void)
{
    RUN(test_create_ok);
    RUN(test_create_refused);
    RUN(test_checksum_appended);
    RUN(test_crc32c_reference);
    RUN(test_fp8_payload_is_plain_fp8);
    RUN(test_header_bytes);
    RUN(test_bytes_every_dtype);
    RUN(test_multi_group_and_empty);
    RUN(test_large_object);
    RUN(test_every_byte_flipped);
    RUN(test_truncated_and_trailing);
    RUN(test_patched_fields);
    RUN(test_wrong_destination);
    RUN(test_fingerprints);
    RUN(test_key_binding);
    RUN(test_verify_arguments);
    RUN(test_processor_keys);
    RUN(test_wrapper_keys);
    RUN(test_aes_gcm_pipeline);
    RUN(test_aes_gcm_fused_blocks);
    RUN(test_scratch_shared_by_threads);
    RUN(test_unchecked_frame_refused);
    RUN(test_bytes_stage_read_in_place);
    /* Again with the store threshold at 0, so that every fused payload of
     * more than one block takes the streamed path (pipeline.c: out written
     * with non-temporal stores, the checks reading a cached copy), in
     * blocks of an odd size, so that they start at every alignment: the
     * same bytes. Encryption (a transform) keeps the in-place path. */
    kvs_fp8_set_nt_min_bytes(0);
    kvs_pipeline_fuse_block = 100003;
    RUN(test_fp8_payload_is_plain_fp8);
    RUN(test_large_object);
    RUN(test_aes_gcm_fused_blocks);
    kvs_pipeline_fuse_block = 0;
    kvs_fp8_set_nt_min_bytes(KVS_FP8_NT_DEFAULT_MIN_BYTES);
    return TEST_SUMMARY();
}
