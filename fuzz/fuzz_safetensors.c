/* fuzz_safetensors.c - the tool's safetensors reader (tools/safetensors.c,
 * compiled into this target) and the kvserde metadata on top of it.
 *
 * Input: a whole file. Properties:
 *   - kvs_safetensors_parse refuses (KVS_ECORRUPT / KVS_ENOMEM with a
 *     message, *out zeroed) or succeeds; never reads outside the buffer;
 *   - an accepted file is what the header promised: tensors in data order,
 *     contiguous from 0 to the end of the file, each span = numel x dtype
 *     size, every name found by kvs_st_find;
 *   - kvs_enc_open on an accepted file refuses cleanly or describes each
 *     tensor; kvs_enc_decode_tensor of every encoded tensor refuses cleanly
 *     or fills exactly its destination (an exact-size heap block).
 */
#include "fuzz_common.h"
#include "safetensors.h"

#define MAX_DECODE_ELEMS (1u << 20)

static void check_file(const uint8_t *buf, size_t len, const kvs_st_file *f)
{
    FZ_ASSERT(f->data_start == 8 + f->header_len && f->data_start <= len &&
                  f->data_len == len - f->data_start,
              "header %" PRIu64 " data %" PRIu64 "+%" PRIu64 " in %zu bytes", f->header_len,
              f->data_start, f->data_len, len);
    uint64_t next = 0;
    for (size_t i = 0; i < f->ntensors; i++) {
        const kvs_st_tensor *t = &f->tensors[i];
        FZ_ASSERT(t->begin == next && t->begin <= t->end && t->end <= f->data_len,
                  "tensor %zu spans [%" PRIu64 ", %" PRIu64 "), expected to start at %" PRIu64,
                  i, t->begin, t->end, next);
        next = t->end;
        unsigned bits = kvs_st_dtype_bits(t->dtype);
        FZ_ASSERT(bits > 0, "tensor %zu dtype %d", i, (int)t->dtype);
        FZ_ASSERT(t->data == buf + f->data_start + t->begin, "tensor %zu data pointer", i);
        uint64_t numel = 1;
        for (uint32_t d = 0; d < t->ndim; d++) numel *= t->shape[d];
        FZ_ASSERT(numel == t->numel, "tensor %zu numel", i);
        FZ_ASSERT((t->end - t->begin) * 8 == t->numel * bits,
                  "tensor %zu: %" PRIu64 " bytes for %" PRIu64 " x %u bits", i,
                  t->end - t->begin, t->numel, bits);
        if (t->end > t->begin) { /* touch both ends: ASan checks them */
            volatile uint8_t first = t->data[0], last = t->data[t->end - t->begin - 1];
            (void)first;
            (void)last;
        }
        FZ_ASSERT(kvs_st_find(f, t->name) == t, "kvs_st_find('%s')", t->name);
        char shape[256];
        kvs_st_format_shape(t->ndim, t->shape, shape, sizeof shape);
    }
    FZ_ASSERT(next == f->data_len, "tensors end at %" PRIu64 " of %" PRIu64, next, f->data_len);
    for (size_t i = 0; i < f->nmeta; i++)
        FZ_ASSERT(kvs_st_meta_get(f, f->meta[i].key) != NULL, "meta '%s'", f->meta[i].key);
}

/* The tool's frame reader: a pipeline deserializer without key files, made
 * once (frames rebuild their own stage chain). */
static kvs_deserializer *frame_reader(void)
{
    static kvs_serde_pair pair;
    if (pair.deserializer == NULL &&
        kvs_serde_create_pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"}]}",
                              &pair) != KVS_OK)
        abort();
    return pair.deserializer;
}

static void decode_all(const kvs_st_file *f)
{
    kvs_enc_file enc;
    int rc = kvs_enc_open(f, frame_reader(), &enc);
    if (rc != KVS_OK) {
        FZ_ASSERT_REFUSAL(rc, "kvs_enc_open");
        return;
    }
    static const kvs_dtype dts[3] = {KVS_DTYPE_FLOAT32, KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16};
    for (size_t i = 0; i < enc.ntensors; i++) {
        const kvs_enc_info *info = &enc.info[i];
        if (info->kind == KVS_ENC_NONE) continue;
        uint64_t numel = kvs_layout_numel(&info->layout);
        if (numel > MAX_DECODE_ELEMS) continue;
        kvs_dtype dt = dts[i % 3];
        size_t nbytes = (size_t)numel * kvs_dtype_size(dt);
        uint8_t *dst = fz_canary_alloc(nbytes);
        rc = kvs_enc_decode_tensor(f, &enc, i, dt, dst);
        if (rc != KVS_OK) FZ_ASSERT_REFUSAL(rc, "kvs_enc_decode_tensor");
        free(dst);
    }
    kvs_enc_close(&enc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvs_st_file f;
    memset(&f, 0x5A, sizeof f);
    int rc = kvs_safetensors_parse(data, size, &f);
    if (rc != KVS_OK) {
        FZ_ASSERT_REFUSAL(rc, "kvs_safetensors_parse");
        FZ_ASSERT(f.ntensors == 0 && f.tensors == NULL && f.meta == NULL,
                  "a refused parse left *out non-zero");
        return 0;
    }
    check_file(data, size, &f);
    decode_all(&f);
    kvs_st_file_free(&f);
    return 0;
}
