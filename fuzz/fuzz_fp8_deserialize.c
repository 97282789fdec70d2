/* fuzz_fp8_deserialize.c - the fp8 deserializer (fp8.h) on arbitrary source
 * bytes and an arbitrary destination layout.
 *
 * Input: byte 0 options, byte 1 the group count, then per group a dtype, a
 * rank and the dims; a u32 source length selector; the rest is the source
 * bytes. Source and destination are exact-size heap blocks, so any read or
 * write out of bounds is an ASan report.
 * Properties:
 *   - deserialize refuses (a KVS_E* code and a message, the destination
 *     untouched: still the canary) or succeeds; it succeeds only if the
 *     source holds exactly one byte per destination element and every
 *     destination dtype is float32 / float16 / bfloat16;
 *   - every kernel variant this CPU has (scalar, avx2, avx512, avx512fp16) writes the
 *     same bytes as the scalar reference, for deserialize and, on the same
 *     bytes read as float data, for kvs_fp8_encode.
 */
#include "fuzz_common.h"
#include "kvserde/fp8.h"
#include "kvserde/memobj.h"
#include "kvserde/serde.h"

#define MAX_ELEMS (1u << 18)

typedef struct encode_job {
    const uint8_t *bytes;
    kvs_dtype dt, fp8;
    int saturate;
    size_t n;
} encode_job;

static int encode_into(void *ctx, uint8_t *out)
{
    const encode_job *j = ctx;
    return kvs_fp8_encode(j->bytes, j->dt, out, j->fp8, j->saturate, j->n);
}

static void encode_differential(const uint8_t *bytes, size_t len, kvs_dtype fp8, int saturate,
                                uint8_t sel)
{
    static const kvs_dtype wide[3] = {KVS_DTYPE_FLOAT32, KVS_DTYPE_FLOAT16,
                                      KVS_DTYPE_BFLOAT16};
    kvs_dtype dt = wide[sel % 3];
    encode_job j = {bytes, dt, fp8, saturate, len / kvs_dtype_size(dt)};
    int rc = fz_same_on_every_variant(encode_into, &j, j.n, 1, "fp8 encode");
    FZ_ASSERT(rc == KVS_OK, "scalar encode of %zu %s: %d", j.n, kvs_dtype_name(dt), rc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t opt = fz_u8(&in);
    kvs_dtype fp8 = (opt & 1) ? KVS_DTYPE_FLOAT8_E5M2 : KVS_DTYPE_FLOAT8_E4M3FN;
    int saturate = (opt >> 1) & 1;

    /* The destination layout: 1..16 groups of any dtype, rank 0..4. */
    kvs_layout layout;
    layout.ngroups = 0;
    unsigned ngroups = 1 + fz_u8(&in) % KVS_MAX_GROUPS;
    uint64_t total = 0;
    int all_wide = 1;
    for (unsigned g = 0; g < ngroups; g++) {
        uint8_t d = fz_u8(&in);
        kvs_dtype dt = (kvs_dtype)(d % KVS_DTYPE_COUNT);
        uint32_t ndim = (d >> 3) % 5;
        int64_t dims[KVS_MAX_DIMS];
        uint64_t numel = 1;
        for (uint32_t i = 0; i < ndim; i++) {
            dims[i] = (d & 0x80) ? fz_u16(&in) % 512 : fz_u8(&in) % 24;
            numel *= (uint64_t)dims[i];
        }
        if (total + numel > MAX_ELEMS) break;
        if (kvs_layout_add_group(&layout, ndim, dims, dt) != KVS_OK) break;
        total += numel;
        if (dt != KVS_DTYPE_FLOAT32 && dt != KVS_DTYPE_FLOAT16 && dt != KVS_DTYPE_BFLOAT16)
            all_wide = 0;
    }
    size_t nbytes = (size_t)kvs_layout_nbytes(&layout);

    /* The source: the rest of the input, of which a prefix is "used". */
    uint32_t sel = fz_u32(&in);
    size_t len = 0;
    uint8_t *bytes = fz_rest_copy(&in, &len);
    size_t used = (opt & 4) ? sel % (len + 1) : len;
    uint8_t *src_buf = malloc(used ? used : 1); /* exactly the used bytes */
    FZ_ASSERT(src_buf, "out of memory");
    memcpy(src_buf, bytes, used);
    kvs_layout flat;
    kvs_memobj src;
    FZ_ASSERT(kvs_layout_flat(&flat, used, KVS_DTYPE_UINT8) == KVS_OK, "flat");
    FZ_ASSERT(kvs_memobj_init(&src, used ? src_buf : NULL, used, &flat,
                              KVS_FMT_BINARY_BUFFER) == KVS_OK,
              "src init");

    kvs_deserializer *de = NULL;
    FZ_ASSERT(kvs_fp8_serde_create(fp8, saturate, NULL, &de) == KVS_OK, "fp8 serde");

    fz_deserialize_job job = {de, &src, &layout, nbytes};
    int rc = fz_same_on_every_variant(fz_deserialize_into, &job, nbytes, 1,
                                      "fp8 deserialize");
    if (rc == KVS_OK)
        FZ_ASSERT(all_wide && used == total,
                  "accepted %zu source bytes for %" PRIu64 " elements (all float dtypes: %d)",
                  used, total, all_wide);
    kvs_deserializer_destroy(de);

    encode_differential(bytes, len, fp8, saturate, (uint8_t)(sel >> 24));
    free(src_buf);
    free(bytes);
    return 0;
}
