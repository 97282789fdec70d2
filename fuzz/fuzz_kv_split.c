/* fuzz_kv_split.c - the kv_split deserializer and kvs_kv_split_inspect
 * (multi.h, docs/kv_split_format.md) on arbitrary blobs and destination
 * groups.
 *
 * Input: byte 0 options, byte 1 the destination dtypes, two u32 element
 * counts, then the blob. Option bit 0 rewrites the blob's CRC-32C trailer
 * (at the declared total size) to the right value, so the fuzzer also gets
 * past the checksum into the header checks and the decoders.
 * The blob and every destination slot are exact-size heap blocks.
 * Properties:
 *   - inspect and deserialize refuse (KVS_E* code and message) or succeed;
 *     a refused deserialize leaves every destination untouched (canary);
 *   - deserialize never accepts a blob that inspect refuses (inspect is the
 *     complete validation), nor one with bytes after its total size;
 *   - a present destination slot that the blob does not hold, or of
 *     another element count, is refused.
 */
#include "fuzz_common.h"
#include "kvserde/memobj.h"
#include "kvserde/multi.h"
#include "util/crc32c.h"

#define MAX_ELEMS (1u << 18)

static kvs_multi_deserializer *g_de;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    if (kvs_kv_split_serde_create(NULL, NULL, &g_de) != KVS_OK) abort();
    return 0;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t opt = fz_u8(&in), dts = fz_u8(&in);
    uint32_t nk = fz_u32(&in) % MAX_ELEMS, nv = fz_u32(&in) % MAX_ELEMS;
    size_t len = 0;
    uint8_t *blob = fz_rest_copy(&in, &len);

    if ((opt & 1) && len >= KVS_KV_SPLIT_HEADER_SIZE + KVS_KV_SPLIT_TRAILER_SIZE) {
        uint64_t total = le64(blob + 8);
        if (total >= KVS_KV_SPLIT_HEADER_SIZE + KVS_KV_SPLIT_TRAILER_SIZE && total <= len) {
            uint32_t crc = kvs_crc32c(0, blob, (size_t)total - 4);
            for (int i = 0; i < 4; i++) blob[total - 4 + (size_t)i] = (uint8_t)(crc >> (8 * i));
        }
    }

    kvs_kv_split_info info;
    int irc = kvs_kv_split_inspect(blob, len, &info);
    if (irc == KVS_OK) {
        FZ_ASSERT(info.total_size <= len, "total %" PRIu64 " > blob %zu", info.total_size, len);
        for (int s = 0; s < 2; s++) {
            const kvs_kv_split_slot_info *si = &info.slots[s];
            if (!si->present) continue;
            FZ_ASSERT(si->offset <= info.total_size && si->nbytes <= info.total_size - si->offset,
                      "slot %d payload [%" PRIu64 ", +%" PRIu64 ") outside the blob", s,
                      si->offset, si->nbytes);
        }
        /* Mostly ask for what the blob holds, so the decoders run. */
        if (opt & 2) {
            nk = (uint32_t)(info.slots[0].numel % MAX_ELEMS);
            nv = (uint32_t)(info.slots[1].numel % MAX_ELEMS);
        }
    } else {
        FZ_ASSERT_REFUSAL(irc, "kvs_kv_split_inspect");
    }

    /* The destination group. */
    static const kvs_dtype dtypes[4] = {KVS_DTYPE_FLOAT32, KVS_DTYPE_FLOAT16,
                                        KVS_DTYPE_BFLOAT16, KVS_DTYPE_UINT8};
    int present[2] = {(opt >> 2) & 1, (opt >> 3) & 1};
    uint32_t numel[2] = {nk, nv};
    kvs_memobj objs[2];
    kvs_memobj *group[3] = {NULL, NULL, NULL};
    uint8_t *bufs[2] = {NULL, NULL};
    size_t nbytes[2] = {0, 0};
    for (int s = 0; s < 2; s++) {
        if (!present[s]) continue;
        kvs_dtype dt = dtypes[(dts >> (2 * s)) & 3];
        kvs_layout layout;
        layout.ngroups = 0;
        if ((dts >> (4 + s)) & 1 && numel[s] % 2 == 0) {
            /* two groups of one dtype: one contiguous tensor */
            int64_t half = numel[s] / 2;
            FZ_ASSERT(kvs_layout_add_group(&layout, 1, &half, dt) == KVS_OK, "layout");
            FZ_ASSERT(kvs_layout_add_group(&layout, 1, &half, dt) == KVS_OK, "layout");
        } else {
            FZ_ASSERT(kvs_layout_flat(&layout, numel[s], dt) == KVS_OK, "layout");
        }
        nbytes[s] = (size_t)kvs_layout_nbytes(&layout);
        bufs[s] = fz_canary_alloc(nbytes[s]);
        FZ_ASSERT(kvs_memobj_init(&objs[s], nbytes[s] ? bufs[s] : NULL, nbytes[s], &layout,
                                  KVS_FMT_KV_2TD) == KVS_OK,
                  "dst init");
        group[s] = &objs[s];
    }
    size_t n = 2;
    if (opt & 0x40) n = (opt & 0x80) ? 3 : 1; /* a group of the wrong length */

    kvs_layout flat;
    kvs_memobj src;
    FZ_ASSERT(kvs_layout_flat(&flat, len, KVS_DTYPE_UINT8) == KVS_OK, "flat");
    FZ_ASSERT(kvs_memobj_init(&src, len ? blob : NULL, len, &flat, KVS_FMT_BINARY) == KVS_OK,
              "src init");
    int rc = kvs_multi_deserialize(g_de, &src, group, n, NULL);
    if (rc == KVS_OK) {
        FZ_ASSERT(n == 2, "a group of length %zu accepted", n);
        FZ_ASSERT(irc == KVS_OK, "deserialize accepted a blob that inspect refuses (%d)", irc);
        FZ_ASSERT(info.total_size == len, "deserialize accepted %zu bytes of a %" PRIu64
                  "-byte blob", len, info.total_size);
        for (int s = 0; s < 2; s++) {
            if (!present[s]) continue;
            FZ_ASSERT(info.slots[s].present, "slot %d filled from a blob without it", s);
            FZ_ASSERT(info.slots[s].numel == numel[s],
                      "slot %d: %u elements filled from %" PRIu64, s, numel[s],
                      info.slots[s].numel);
        }
    } else {
        FZ_ASSERT_REFUSAL(rc, "kv_split deserialize");
        for (int s = 0; s < 2; s++)
            if (bufs[s])
                FZ_ASSERT(fz_is_canary(bufs[s], nbytes[s]),
                          "a refused deserialize wrote to slot %d", s);
    }
    free(bufs[0]);
    free(bufs[1]);
    free(blob);
    return 0;
}
