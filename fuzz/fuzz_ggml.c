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

typedef struct encode_job {
    const uint8_t *bytes;
    kvs_dtype dt;
    kvs_ggml_type type;
    size_t n;
} encode_job;

static int encode_into(void *ctx, uint8_t *out)
{
    const encode_job *j = ctx;
    return kvs_ggml_encode(j->bytes, j->dt, out, j->type, j->n);
}

static void encode_differential(const uint8_t *bytes, size_t len, kvs_ggml_type type,
                                unsigned sel)
{
    static const kvs_dtype wide[3] = {KVS_DTYPE_FLOAT32, KVS_DTYPE_FLOAT16,
                                      KVS_DTYPE_BFLOAT16};
    kvs_dtype dt = wide[sel % 3];
    encode_job j = {bytes, dt, type, len / kvs_dtype_size(dt) / KVS_GGML_BLOCK * KVS_GGML_BLOCK};
    int rc = fz_same_on_every_variant(encode_into, &j,
                                      j.n / KVS_GGML_BLOCK * kvs_ggml_block_bytes(type),
                                      0 /* the blocks before a bad value are written */,
                                      "ggml encode");
    FZ_ASSERT(rc == KVS_OK || rc == KVS_EINVAL, "scalar encode: %d", rc);
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
    fz_deserialize_job job = {de, &src, &layout, nbytes};
    int rc = fz_same_on_every_variant(fz_deserialize_into, &job, nbytes, 1,
                                      "ggml deserialize");
    if (rc == KVS_OK)
        FZ_ASSERT(decodable && used == blocks * kvs_ggml_block_bytes(type),
                  "accepted %zu source bytes for %llu blocks (decodable layout: %d)", used,
                  (unsigned long long)blocks, decodable);
    kvs_deserializer_destroy(de);

    encode_differential(bytes, len, type, (unsigned)(opt >> 2));
    free(src_buf);
    free(bytes);
    return 0;
}
