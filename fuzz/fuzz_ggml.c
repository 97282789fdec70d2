/* fuzz_ggml.c - the ggml_q8_0 / ggml_q4_0 deserializers (ggml.h) on
 * arbitrary source bytes and an arbitrary destination layout, and the
 * encoders on the same bytes read as float data.
 *
 * Input: byte 0 options (bit 0 the block type, bit 1 cut the source to a
 * selected length, bits 2-3 the dtype of the encode check), byte 1 the group
 * count - 1, then per group a byte (bits 0-2 the dtype, 3-6 the rank mod 5,
 * 7: the last dim is 32 x (its byte mod 9)) and the dims, a byte each;
 * a u32 length selector; the rest is the source bytes. Source and
 * destination are exact-size heap blocks, so any read or write out of bounds
 * is an ASan report.
 * Properties:
 *   - deserialize refuses (a KVS_E* code and a message, the destination
 *     untouched: still the canary) or succeeds; it succeeds only if every
 *     group is float32 / float16 / bfloat16 with a last dimension that is a
 *     multiple of 32 and the source is exactly the layout's block bytes;
 *   - every kernel variant this CPU has writes the scalar reference's bytes:
 *     for deserialize, and for kvs_ggml_encode of the bytes read as floats
 *     (the same status and message when a value is not finite, the same
 *     blocks before it).
 */
#include "fuzz_common.h"
#include "kvserde/ggml.h"
#include "kvserde/fp8.h"
#include "kvserde/memobj.h"
#include "kvserde/serde.h"

#define MAX_ELEMS (1u << 18)

static const char *const isas[] = {"avx2", "avx512"};

static void encode_differential(const uint8_t *bytes, size_t len, kvs_ggml_type type,
                                unsigned sel)
{
    static const kvs_dtype wide[3] = {KVS_DTYPE_FLOAT32, KVS_DTYPE_FLOAT16,
                                      KVS_DTYPE_BFLOAT16};
    kvs_dtype dt = wide[sel % 3];
    size_t n = len / kvs_dtype_size(dt) / KVS_GGML_BLOCK * KVS_GGML_BLOCK;
    size_t out_n = n / KVS_GGML_BLOCK * kvs_ggml_block_bytes(type);
    uint8_t *ref = fz_canary_alloc(out_n), *got = fz_canary_alloc(out_n);
    char ref_msg[512] = "";
    FZ_ASSERT(kvs_fp8_set_isa("scalar") == KVS_OK, "scalar isa");
    int rc = kvs_ggml_encode(bytes, dt, ref, type, n);
    if (rc != KVS_OK) {
        FZ_ASSERT(rc == KVS_EINVAL, "scalar encode: %d", rc);
        snprintf(ref_msg, sizeof ref_msg, "%s", kvs_last_error());
    }
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!kvs_fp8_isa_available(isas[i])) continue;
        FZ_ASSERT(kvs_fp8_set_isa(isas[i]) == KVS_OK, "isa %s", isas[i]);
        memset(got, 0xA5, out_n);
        int rc2 = kvs_ggml_encode(bytes, dt, got, type, n);
        FZ_ASSERT(rc2 == rc, "%s encode returns %d, scalar %d", isas[i], rc2, rc);
        if (rc) FZ_ASSERT(strcmp(kvs_last_error(), ref_msg) == 0, "%s encode says '%s', scalar '%s'",
                          isas[i], kvs_last_error(), ref_msg);
        for (size_t j = 0; j < out_n; j++)
            FZ_ASSERT(got[j] == ref[j],
                      "%s encode differs from scalar at byte %zu of %zu (%s -> %s): 0x%02x != "
                      "0x%02x",
                      isas[i], j, out_n, kvs_dtype_name(dt), kvs_ggml_type_name(type), got[j],
                      ref[j]);
    }
    FZ_ASSERT(kvs_fp8_set_isa("auto") == KVS_OK, "auto isa");
    free(ref);
    free(got);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t opt = fz_u8(&in);
    kvs_ggml_type type = (opt & 1) ? KVS_GGML_Q4_0 : KVS_GGML_Q8_0;

    /* The destination layout: 1..16 groups of any dtype, rank 0..4, dims
     * mostly multiples of 32 in the last place. */
    kvs_layout layout;
    layout.ngroups = 0;
    unsigned ngroups = 1 + fz_u8(&in) % KVS_MAX_GROUPS;
    uint64_t total = 0, blocks = 0;
    int decodable = 1;
    for (unsigned g = 0; g < ngroups; g++) {
        uint8_t d = fz_u8(&in);
        kvs_dtype dt = (kvs_dtype)((d & 7) % KVS_DTYPE_COUNT);
        uint32_t ndim = (d >> 3) % 5;
        int64_t dims[KVS_MAX_DIMS];
        uint64_t numel = 1;
        for (uint32_t i = 0; i < ndim; i++) {
            uint8_t v = fz_u8(&in);
            dims[i] = i + 1 == ndim && (d & 0x80) ? 32 * (v % 9) : v % 24;
            numel *= (uint64_t)dims[i];
        }
        if (total + numel > MAX_ELEMS) break;
        if (kvs_layout_add_group(&layout, ndim, dims, dt) != KVS_OK) break;
        total += numel;
        blocks += numel / 32;
        if ((dt != KVS_DTYPE_FLOAT32 && dt != KVS_DTYPE_FLOAT16 && dt != KVS_DTYPE_BFLOAT16) ||
            ndim == 0 || dims[ndim - 1] % 32)
            decodable = 0;
    }
    size_t nbytes = (size_t)kvs_layout_nbytes(&layout);

    uint32_t sel = fz_u32(&in);
    size_t len = 0;
    uint8_t *bytes = fz_rest_copy(&in, &len);
    size_t used = (opt & 2) ? sel % (len + 1) : len;
    uint8_t *src_buf = malloc(used ? used : 1);
    FZ_ASSERT(src_buf, "out of memory");
    memcpy(src_buf, bytes, used);
    kvs_layout flat;
    kvs_memobj src;
    FZ_ASSERT(kvs_layout_flat(&flat, used, KVS_DTYPE_UINT8) == KVS_OK, "flat");
    FZ_ASSERT(kvs_memobj_init(&src, used ? src_buf : NULL, used, &flat,
                              KVS_FMT_BINARY_BUFFER) == KVS_OK,
              "src init");

    kvs_deserializer *de = NULL;
    FZ_ASSERT(kvs_ggml_serde_create(type, NULL, &de) == KVS_OK, "ggml serde");
    FZ_ASSERT(kvs_fp8_set_isa("scalar") == KVS_OK, "scalar isa");
    uint8_t *ref = NULL;
    int rc = fz_deserialize_canary(de, &src, &layout, &ref, nbytes, "ggml deserialize");
    if (rc == KVS_OK)
        FZ_ASSERT(decodable && used == blocks * kvs_ggml_block_bytes(type),
                  "accepted %zu source bytes for %llu blocks (decodable layout: %d)", used,
                  (unsigned long long)blocks, decodable);
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (!kvs_fp8_isa_available(isas[i])) continue;
        FZ_ASSERT(kvs_fp8_set_isa(isas[i]) == KVS_OK, "isa %s", isas[i]);
        uint8_t *got = NULL;
        int rc2 = fz_deserialize_canary(de, &src, &layout, &got, nbytes, "ggml deserialize");
        FZ_ASSERT(rc2 == rc, "%s deserialize returns %d, scalar %d", isas[i], rc2, rc);
        if (rc == KVS_OK)
            for (size_t j = 0; j < nbytes; j++)
                FZ_ASSERT(got[j] == ref[j], "%s deserialize differs from scalar at byte %zu of %zu",
                          isas[i], j, nbytes);
        free(got);
    }
    FZ_ASSERT(kvs_fp8_set_isa("auto") == KVS_OK, "auto isa");
    free(ref);
    kvs_deserializer_destroy(de);

    encode_differential(bytes, len, type, (unsigned)(opt >> 2));
    free(src_buf);
    free(bytes);
    return 0;
}
