/* fuzz_frame.c - framed pipeline blobs (pipeline.h, docs/frame_format.md)
 * as hostile input: kvs_frame_inspect, kvs_pipeline_verify and the pipeline
 * deserializer on arbitrary bytes.
 *
 * Input: byte 0 options, byte 1 the destination's group count (1 + b % 3),
 * then per group a byte (dtype (b & 15) % 6, any of them; ndim
 * (b >> 4) % 4) and ndim dims (one byte each, 0..15; fz_layout); the rest
 * is the blob, an exact-size heap block.
 * Options (applied to the blob before anything reads it):
 *   bit 0  bind the blob to the fuzzer's key: set the keyed flag and write
 *          the key's fingerprint at offset 16
 *   bit 1  rewrite the header CRC (at the header length the blob states),
 *          so the fuzzer gets past it into the field checks
 *   bit 2  rewrite the payload checksum of the last stage (crc32c / xxh3)
 *          once the header parses, so the fuzzer reaches the decoders
 *   bit 3  decode into the frame's own layout (when it parses and is at
 *          most MAX_DST bytes) instead of the one the input describes
 *   bit 4  deserialize under the key (else NULL: the binding is skipped)
 *   bit 5  the destination memory format is the frame's (else KV_2LTD)
 * Properties:
 *   - every call refuses (a KVS_E* code and a message) or succeeds;
 *   - an inspected frame is exactly header + payload bytes, 1..16 stages,
 *     a valid layout; verify never accepts what inspect refuses, verify
 *     under the key never accepts what verify without one refuses;
 *   - a refused deserialize leaves the destination untouched (canary);
 *   - a successful deserialize was also accepted by verify (same key) and
 *     decoded into the frame's layout; re-serializing what it decoded with
 *     the frame's stage chain gives a blob that deserializes to the same
 *     values (fp8 with saturate: +-inf may come back as +-max, fp8.h).
 */
#include <math.h>

#include "frame/frame.h"
#include "fuzz_common.h"
#include "kvserde/dtype.h"
#include "kvserde/memobj.h"
#include "kvserde/pipeline.h"
#include "kvserde/registry.h"
#include "kvserde/serde.h"
#include "util/crc32c.h"
#include <jansson.h>
#include <xxhash.h>

#define MAX_DST ((size_t)1 << 20)

static kvs_deserializer *g_de;
static kvs_serde_pair g_pair;
static kvs_object_key g_key;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static const uint8_t hash[4] = {0xF0, 0x0D, 0xCA, 0xFE};
    if (kvs_serde_create_pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"}]}",
                              &g_pair) != KVS_OK ||
        kvs_object_key_init(&g_key, hash, sizeof hash, "fuzz/model", 1, 2, "salt") != KVS_OK)
        abort();
    g_de = g_pair.deserializer;
    return 0;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint16_t le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

/* The blob's own header CRC, at the header length it states. */
static void fix_header_crc(uint8_t *blob, size_t len)
{
    if (len < KVS_FRAME_FIXED + 4) return;
    size_t h = le16(blob + 6);
    if (h < KVS_FRAME_FIXED + 4 || h > len) return;
    put_le(blob + h - 4, kvs_crc32c(0, blob, h - 4), 4);
}

/* The digest of the last stage, when it is a checksum. */
static void fix_payload_check(uint8_t *blob, size_t len, const kvs_frame_info *info)
{
    const char *last = info->stages[info->nstages - 1].name;
    uint8_t *payload = blob + info->header_bytes;
    size_t p = (size_t)info->payload_bytes;
    if (strcmp(last, "crc32c") == 0 && p >= 4)
        put_le(payload + p - 4, kvs_crc32c(0, payload, p - 4), 4);
    else if (strcmp(last, "xxh3") == 0 && p >= 8)
        put_le(payload + p - 8, XXH3_64bits(payload, p - 8), 8);
    (void)len;
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    float v;
    if (exp == 0) v = ldexpf((float)man, -24);
    else if (exp == 31) v = man ? NAN : INFINITY;
    else v = ldexpf((float)(man | 0x400), (int)exp - 25);
    return sign ? -v : v;
}

static float element(const uint8_t *p, kvs_dtype dt)
{
    uint32_t u;
    float f;
    switch (dt) {
    case KVS_DTYPE_FLOAT32: memcpy(&f, p, 4); return f;
    case KVS_DTYPE_FLOAT16: return half_to_float((uint16_t)(p[0] | p[1] << 8));
    case KVS_DTYPE_BFLOAT16:
        u = (uint32_t)(p[0] | p[1] << 8) << 16;
        memcpy(&f, &u, 4);
        return f;
    default: return (float)p[0];
    }
}

/* a (the first decode) and b (the decode of its re-serialization) hold the
 * same values: equal, both NaN, or (saturating fp8) +-inf became +-max. An
 * object of no bytes may have no data (a and b NULL), which memcmp must not
 * be given. */
static void same_values(const kvs_layout *layout, const uint8_t *a, const uint8_t *b,
                        int saturate)
{
    size_t nbytes = (size_t)kvs_layout_nbytes(layout);
    if (nbytes == 0 || memcmp(a, b, nbytes) == 0) return;
    for (uint32_t g = 0; g < layout->ngroups; g++) {
        kvs_dtype dt = layout->groups[g].dtype;
        size_t es = kvs_dtype_size(dt), off = (size_t)kvs_layout_group_offset(layout, g);
        uint64_t n = kvs_layout_group_numel(layout, g);
        for (uint64_t i = 0; i < n; i++) {
            const uint8_t *pa = a + off + i * es, *pb = b + off + i * es;
            if (memcmp(pa, pb, es) == 0) continue;
            float x = element(pa, dt), y = element(pb, dt);
            int ok = (isnan(x) && isnan(y)) ||
                     (saturate && isinf(x) && !isinf(y) && !isnan(y) && signbit(x) == signbit(y));
            FZ_ASSERT(ok, "re-serialized group %u element %" PRIu64 " decodes to %g, was %g", g,
                      i, (double)y, (double)x);
        }
    }
}

/* The frame's stage chain as a pipeline config; NULL if a stage cannot be
 * expressed (the creation then decides). */
static char *chain_config(const kvs_frame_info *info)
{
    json_t *stages = json_array();
    for (uint32_t i = 0; i < info->nstages; i++) {
        json_t *st = json_loads(info->stages[i].params, 0, NULL);
        FZ_ASSERT(json_is_object(st), "stage %u params are not a JSON object: %s", i,
                  info->stages[i].params);
        json_object_set_new(st, "type", json_string(info->stages[i].name));
        json_array_append_new(stages, st);
    }
    json_t *cfg = json_pack("{s:s,s:o}", "type", "pipeline", "stages", stages);
    char *text = json_dumps(cfg, JSON_COMPACT);
    json_decref(cfg);
    return text;
}

static void reserialize(const kvs_frame_info *info, const kvs_memobj *decoded,
                        const kvs_object_key *key)
{
    char *cfg = chain_config(info);
    kvs_serde_pair pair;
    int rc = kvs_serde_create_pair(cfg, &pair);
    free(cfg);
    if (rc != KVS_OK) { /* a chain the writer's rules refuse (two checksums ...) */
        FZ_ASSERT_REFUSAL(rc, "pipeline create from a frame's chain");
        return;
    }
    size_t est = 0, nw = 0;
    rc = kvs_estimate_serialized_size(pair.serializer, &decoded->layout, &est);
    FZ_ASSERT(rc == KVS_OK, "estimate for a layout the frame decoded into: %d", rc);
    uint8_t *blob = fz_canary_alloc(est);
    kvs_layout flat;
    kvs_memobj out;
    FZ_ASSERT(kvs_layout_flat(&flat, est, KVS_DTYPE_UINT8) == KVS_OK, "flat");
    FZ_ASSERT(kvs_memobj_init(&out, est ? blob : NULL, est, &flat, KVS_FMT_BINARY) == KVS_OK,
              "out");
    rc = kvs_serialize(pair.serializer, decoded, &out, key, &nw);
    FZ_ASSERT(rc == KVS_OK, "re-serializing a decoded object: %d", rc);
    FZ_ASSERT(nw <= est, "wrote %zu bytes, estimate %zu", nw, est);
    FZ_ASSERT(kvs_memobj_set_used_size(&out, nw) == KVS_OK, "used size");
    size_t nbytes = decoded->used_size;
    uint8_t *again = fz_canary_alloc(nbytes);
    kvs_memobj dst;
    FZ_ASSERT(kvs_memobj_init(&dst, nbytes ? again : NULL, nbytes, &decoded->layout,
                              decoded->format) == KVS_OK,
              "dst");
    rc = kvs_deserialize(pair.deserializer, &out, &dst, key);
    FZ_ASSERT(rc == KVS_OK, "deserializing the re-serialized blob: %d", rc);
    int saturate = 0;
    if (strcmp(info->stages[0].name, "fp8") == 0)
        saturate = strstr(info->stages[0].params, "\"saturate\":true") != NULL;
    same_values(&decoded->layout, decoded->data, again, saturate);
    free(again);
    free(blob);
    kvs_serde_pair_destroy(&pair);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t opt = fz_u8(&in);
    static const kvs_dtype all[KVS_DTYPE_COUNT] = {
        KVS_DTYPE_UINT8,         KVS_DTYPE_FLOAT32,     KVS_DTYPE_FLOAT16,
        KVS_DTYPE_BFLOAT16,      KVS_DTYPE_FLOAT8_E4M3FN, KVS_DTYPE_FLOAT8_E5M2};
    kvs_layout layout;
    fz_layout(&in, &layout, 1 + fz_u8(&in) % 3, all, KVS_DTYPE_COUNT, 16);
    size_t len = 0;
    uint8_t *blob = fz_rest_copy(&in, &len);

    if ((opt & 1) && len >= KVS_FRAME_FIXED) {
        blob[5] |= KVS_FRAME_FLAG_KEYED;
        put_le(blob + 16, kvs_object_key_fingerprint(&g_key), 8);
    }
    if (opt & 2) fix_header_crc(blob, len);

    kvs_frame_info info;
    int irc = kvs_frame_inspect(blob, len, &info);
    if (irc == KVS_OK) {
        FZ_ASSERT(info.header_bytes + info.payload_bytes == len,
                  "inspect: %zu + %" PRIu64 " bytes in a %zu-byte blob", info.header_bytes,
                  info.payload_bytes, len);
        FZ_ASSERT(info.nstages >= 1 && info.nstages <= KVS_FRAME_INFO_MAX_STAGES,
                  "inspect: %u stages", info.nstages);
        FZ_ASSERT(kvs_layout_validate(&info.layout) == KVS_OK, "inspect: invalid layout");
        FZ_ASSERT(kvs_frame_detect(blob, len), "inspected but not detected");
        if (opt & 4) {
            fix_payload_check(blob, len, &info);
            FZ_ASSERT(kvs_frame_inspect(blob, len, &info) == KVS_OK,
                      "the payload fix-up changed the header");
        }
        if ((opt & 8) && kvs_layout_nbytes(&info.layout) <= MAX_DST) layout = info.layout;
    } else {
        FZ_ASSERT_REFUSAL(irc, "kvs_frame_inspect");
    }

    int v0 = kvs_pipeline_verify(g_de, blob, len, NULL);
    if (v0 != KVS_OK) FZ_ASSERT_REFUSAL(v0, "kvs_pipeline_verify (no key)");
    int v1 = kvs_pipeline_verify(g_de, blob, len, &g_key);
    if (v1 != KVS_OK) FZ_ASSERT_REFUSAL(v1, "kvs_pipeline_verify (key)");
    FZ_ASSERT(v0 != KVS_OK || irc == KVS_OK, "verify accepted what inspect refuses (%d)", irc);
    FZ_ASSERT(v1 != KVS_OK || v0 == KVS_OK, "verify under a key accepted what verify without "
                                            "one refuses (%d)", v0);

    const kvs_object_key *key = (opt & 16) ? &g_key : NULL;
    kvs_memory_format fmt = (opt & 32) && irc == KVS_OK ? info.format : KVS_FMT_KV_2LTD;
    size_t nbytes = (size_t)kvs_layout_nbytes(&layout);
    uint8_t *buf = fz_canary_alloc(nbytes);
    kvs_layout flat;
    kvs_memobj src, dst;
    FZ_ASSERT(kvs_layout_flat(&flat, len, KVS_DTYPE_UINT8) == KVS_OK, "flat");
    FZ_ASSERT(kvs_memobj_init(&src, len ? blob : NULL, len, &flat, KVS_FMT_BINARY) == KVS_OK,
              "src");
    FZ_ASSERT(kvs_memobj_init(&dst, nbytes ? buf : NULL, nbytes, &layout, fmt) == KVS_OK,
              "dst");
    int rc = kvs_deserialize(g_de, &src, &dst, key);
    if (rc == KVS_OK) {
        FZ_ASSERT(irc == KVS_OK, "deserialize accepted what inspect refuses (%d)", irc);
        FZ_ASSERT((key ? v1 : v0) == KVS_OK, "deserialize accepted what verify refuses (%d)",
                  key ? v1 : v0);
        FZ_ASSERT(kvs_layout_equal(&info.layout, &layout),
                  "decoded into a layout that is not the frame's");
        reserialize(&info, &dst, key);
    } else {
        FZ_ASSERT_REFUSAL(rc, "pipeline deserialize");
        FZ_ASSERT(fz_is_canary(buf, nbytes), "a refused deserialize (%d) wrote to the "
                                             "destination", rc);
    }
    free(buf);
    free(blob);
    return 0;
}
