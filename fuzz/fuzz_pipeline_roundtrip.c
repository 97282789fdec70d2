/* fuzz_pipeline_roundtrip.c - the pipeline serde (pipeline.h) end to end:
 * the input chooses a stage chain, a layout, the data and an object key;
 * serialize then deserialize must give back the source, and any one-byte
 * change of the blob must be refused.
 *
 * Input: byte 0 the chain: bit 0 typed stage (0 bytes, 1 fp8), bit 1 fp8
 * dtype (0 float8_e4m3fn, 1 float8_e5m2), bit 2 saturate, bits 3-4 the
 * checksum (0 none: crc32c is appended by the pipeline, 1 crc32c, 2 xxh3,
 * 3 none), bit 5 bind to a key (else NULL), bits 6-7 the memory format.
 * Byte 1: groups 1 + b % 3; per group a byte (dtype (b & 15) % 3: bfloat16,
 * float16, float32; ndim (b >> 4) % 4) and ndim dims (one byte each, 0..8;
 * fz_layout).
 * Then the key (hash length % 33 and hash, model length % 12 and model
 * bytes mapped to [a-z0-9], rank i8, group u8), the mutation (u32 position
 * taken modulo the blob length, u8 xor value, 0 read as 1), and the source
 * data (zero-filled past the end of the input).
 * Properties:
 *   - creation, estimate, serialize (<= estimate, deterministic: twice the
 *     same bytes), inspect (the chain, layout, format and key binding the
 *     config asked for) and verify all succeed;
 *   - deserialize succeeds and gives exactly the source for `bytes`, and
 *     for fp8 exactly what the plain fp8 serde decodes from its own output
 *     (and the payload's codes are that serde's bytes);
 *   - under another key the blob is refused with KVS_EKEY (keyed blobs and
 *     unkeyed blobs loaded under a key alike), the destination untouched;
 *   - after the mutation, verify and deserialize (with the key and without)
 *     refuse, the destination untouched: every byte of a frame is covered
 *     by the header CRC or the payload checksum.
 */
#include "fuzz_common.h"
#include "kvserde/dtype.h"
#include "kvserde/fp8.h"
#include "kvserde/memobj.h"
#include "kvserde/pipeline.h"
#include "kvserde/registry.h"
#include "kvserde/serde.h"

/* [typed*fp8dtype*saturate][check] */
static kvs_serde_pair g_pairs[8][3];
static kvs_serializer *g_fp8_ser[2][2];
static kvs_deserializer *g_fp8_de[2][2];

static const kvs_dtype g_dtypes[3] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16, KVS_DTYPE_FLOAT32};
static const kvs_memory_format g_formats[4] = {KVS_FMT_KV_2LTD, KVS_FMT_KV_2TD,
                                               KVS_FMT_KV_MLA_FMT, KVS_FMT_UNDEFINED};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    static const char *const checks[3] = {"", ",{\"type\":\"crc32c\"}", ",{\"type\":\"xxh3\"}"};
    for (int c = 0; c < 8; c++) {
        for (int k = 0; k < 3; k++) {
            char cfg[256];
            if (c & 1)
                snprintf(cfg, sizeof cfg,
                         "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\",\"fp8_dtype\":"
                         "\"%s\",\"saturate\":%s}%s]}",
                         c & 2 ? "float8_e5m2" : "float8_e4m3fn", c & 4 ? "true" : "false",
                         checks[k]);
            else
                snprintf(cfg, sizeof cfg,
                         "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"}%s]}",
                         checks[k]);
            if (kvs_serde_create_pair(cfg, &g_pairs[c][k]) != KVS_OK) {
                fprintf(stderr, "%s: %s\n", cfg, kvs_last_error());
                abort();
            }
        }
    }
    for (int d = 0; d < 2; d++)
        for (int s = 0; s < 2; s++)
            if (kvs_fp8_serde_create(d ? KVS_DTYPE_FLOAT8_E5M2 : KVS_DTYPE_FLOAT8_E4M3FN, s,
                                     &g_fp8_ser[d][s], &g_fp8_de[d][s]) != KVS_OK)
                abort();
    /* Refused at creation in this build (the placeholder stage) or not:
     * either way aes_gcm is not fuzzed here. */
    return 0;
}

static void flat_obj(kvs_memobj *o, uint8_t *p, size_t n)
{
    kvs_layout flat;
    FZ_ASSERT(kvs_layout_flat(&flat, n, KVS_DTYPE_UINT8) == KVS_OK, "flat");
    FZ_ASSERT(kvs_memobj_init(o, n ? p : NULL, n, &flat, KVS_FMT_BINARY) == KVS_OK, "flat obj");
}

/* Deserialize blob into a canary destination of `layout`; the buffer is
 * returned in *out (caller frees). */
static int load(kvs_deserializer *de, uint8_t *blob, size_t len, const kvs_layout *layout,
                kvs_memory_format fmt, const kvs_object_key *key, uint8_t **out)
{
    size_t nbytes = (size_t)kvs_layout_nbytes(layout);
    uint8_t *buf = fz_canary_alloc(nbytes);
    kvs_memobj src, dst;
    flat_obj(&src, blob, len);
    FZ_ASSERT(kvs_memobj_init(&dst, nbytes ? buf : NULL, nbytes, layout, fmt) == KVS_OK, "dst");
    int rc = kvs_deserialize(de, &src, &dst, key);
    if (rc != KVS_OK) {
        FZ_ASSERT_REFUSAL(rc, "deserialize");
        FZ_ASSERT(fz_is_canary(buf, nbytes), "a refused deserialize (%d) wrote to the "
                                             "destination", rc);
    }
    *out = buf;
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t chain = fz_u8(&in);
    int fp8 = chain & 1, e5m2 = (chain >> 1) & 1, sat = (chain >> 2) & 1;
    int check = (chain >> 3) & 3, keyed = (chain >> 5) & 1;
    if (check == 3) check = 0;
    kvs_memory_format fmt = g_formats[chain >> 6];
    kvs_layout layout;
    fz_layout(&in, &layout, 1 + fz_u8(&in) % 3, g_dtypes, 3, 9);
    uint8_t hash[32];
    size_t hlen = fz_u8(&in) % 33;
    fz_bytes(&in, hash, hlen);
    char model[16];
    size_t mlen = 1 + fz_u8(&in) % 12;
    for (size_t i = 0; i < mlen; i++) model[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[fz_u8(&in) % 36];
    model[mlen] = '\0';
    int64_t rank = (int8_t)fz_u8(&in), group = fz_u8(&in);
    kvs_object_key key, other;
    FZ_ASSERT(kvs_object_key_init(&key, hash, hlen, model, rank, group, "") == KVS_OK, "key");
    other = key;
    other.object_group_id++;
    uint32_t mpos = fz_u32(&in);
    uint8_t mxor = fz_u8(&in);
    if (mxor == 0) mxor = 1;

    size_t nbytes = (size_t)kvs_layout_nbytes(&layout);
    uint8_t *srcbuf = malloc(nbytes ? nbytes : 1);
    FZ_ASSERT(srcbuf != NULL, "oom");
    fz_bytes(&in, srcbuf, nbytes);
    kvs_memobj src;
    FZ_ASSERT(kvs_memobj_init(&src, nbytes ? srcbuf : NULL, nbytes, &layout, fmt) == KVS_OK,
              "src");
    const kvs_object_key *k = keyed ? &key : NULL;

    kvs_serde_pair *pair = &g_pairs[fp8 ? 1 | e5m2 << 1 | sat << 2 : 0][check];
    size_t est = 0;
    int rc = kvs_estimate_serialized_size(pair->serializer, &layout, &est);
    FZ_ASSERT(rc == KVS_OK, "estimate: %d", rc);
    uint8_t *blob = fz_canary_alloc(est), *blob2 = fz_canary_alloc(est);
    kvs_memobj out;
    flat_obj(&out, blob, est);
    size_t nw = 0, nw2 = 0;
    rc = kvs_serialize(pair->serializer, &src, &out, k, &nw);
    FZ_ASSERT(rc == KVS_OK, "serialize: %d", rc);
    FZ_ASSERT(nw <= est, "serialize wrote %zu bytes, estimate %zu", nw, est);
    flat_obj(&out, blob2, est);
    rc = kvs_serialize(pair->serializer, &src, &out, k, &nw2);
    FZ_ASSERT(rc == KVS_OK && nw2 == nw && memcmp(blob, blob2, nw) == 0,
              "serialize is not deterministic (%d, %zu / %zu bytes)", rc, nw, nw2);
    free(blob2);

    kvs_frame_info info;
    rc = kvs_frame_inspect(blob, nw, &info);
    FZ_ASSERT(rc == KVS_OK, "inspect of a fresh blob: %d", rc);
    FZ_ASSERT(info.nstages == 2 && strcmp(info.stages[0].name, fp8 ? "fp8" : "bytes") == 0 &&
                  strcmp(info.stages[1].name, check == 2 ? "xxh3" : "crc32c") == 0,
              "inspect: %u stages, '%s', '%s'", info.nstages, info.stages[0].name,
              info.stages[1].name);
    FZ_ASSERT(kvs_layout_equal(&info.layout, &layout) && info.format == fmt,
              "inspect: another layout or format (%d, want %d)", (int)info.format, (int)fmt);
    FZ_ASSERT(info.keyed == keyed &&
                  info.key_fingerprint == (keyed ? kvs_object_key_fingerprint(&key) : 0),
              "inspect: keyed %d, fingerprint %016" PRIx64, info.keyed, info.key_fingerprint);
    FZ_ASSERT(info.header_bytes + info.payload_bytes == nw, "inspect: sizes");
    rc = kvs_pipeline_verify(pair->deserializer, blob, nw, k);
    FZ_ASSERT(rc == KVS_OK, "verify of a fresh blob: %d", rc);

    uint8_t *got = NULL;
    rc = load(pair->deserializer, blob, nw, &layout, fmt, k, &got);
    FZ_ASSERT(rc == KVS_OK, "deserialize of a fresh blob: %d", rc);
    if (!fp8) {
        FZ_ASSERT(memcmp(got, srcbuf, nbytes) == 0, "bytes: the round trip changed the data");
    } else {
        size_t numel = (size_t)kvs_layout_numel(&layout);
        uint8_t *codes = fz_canary_alloc(numel);
        kvs_memobj enc;
        flat_obj(&enc, codes, numel);
        size_t n8 = 0;
        rc = kvs_serialize(g_fp8_ser[e5m2][sat], &src, &enc, NULL, &n8);
        FZ_ASSERT(rc == KVS_OK && n8 == numel, "plain fp8 serialize: %d, %zu bytes", rc, n8);
        FZ_ASSERT(info.payload_bytes >= numel &&
                      memcmp(blob + info.header_bytes, codes, numel) == 0,
                  "the pipeline's fp8 codes are not the fp8 serde's");
        uint8_t *want = NULL;
        rc = load(g_fp8_de[e5m2][sat], codes, numel, &layout, fmt, NULL, &want);
        FZ_ASSERT(rc == KVS_OK, "plain fp8 deserialize: %d", rc);
        FZ_ASSERT(memcmp(got, want, nbytes) == 0,
                  "fp8: the pipeline decodes other values than the fp8 serde");
        free(want);
        free(codes);
    }
    free(got);

    /* Another key: refused as written for another object. */
    rc = load(pair->deserializer, blob, nw, &layout, fmt, &other, &got);
    FZ_ASSERT(rc == KVS_EKEY, "deserialize under another key: %d, want KVS_EKEY", rc);
    free(got);

    /* One byte changed: refused, with the key and without. */
    size_t pos = mpos % nw;
    blob[pos] ^= mxor;
    for (int kk = 0; kk < 2; kk++) {
        const kvs_object_key *kx = kk ? k : NULL;
        rc = kvs_pipeline_verify(pair->deserializer, blob, nw, kx);
        FZ_ASSERT(rc != KVS_OK, "verify accepted a blob with byte %zu of %zu changed (^0x%02x)",
                  pos, nw, mxor);
        FZ_ASSERT_REFUSAL(rc, "verify of a damaged blob");
        rc = load(pair->deserializer, blob, nw, &layout, fmt, kx, &got);
        FZ_ASSERT(rc != KVS_OK,
                  "deserialize accepted a blob with byte %zu of %zu changed (^0x%02x)", pos,
                  nw, mxor);
        free(got);
    }
    free(blob);
    free(srcbuf);
    return 0;
}
