/* fuzz_serde_config.c - JSON serde config -> kvs_serde_create_pair /
 * kvs_serde_create (registry.h).
 *
 * Input: the config text. Properties:
 *   - anything refused is refused cleanly: a KVS_E* code, a message, the
 *     pair zeroed, nothing leaked (LeakSanitizer);
 *   - the text and the parsed-object entry points agree;
 *   - an accepted config gives both halves and a max_workers in [1, 1024],
 *     kvs_serde_create accepts it too, and the pair round-trips a small
 *     object: the estimate bounds what serialize writes, deserialize
 *     succeeds on what serialize wrote.
 */
#include <jansson.h>

#include "fuzz_common.h"
#include "kvserde/kvserde.h"
#include "kvserde/processor.h"
#include "kvserde/registry.h"
#include "kvserde/serde.h"

#define MAX_WORKERS_FOR_PROCESSOR 4 /* bigger valid counts: pair only (speed) */

static void round_trip(const kvs_serde_pair *pair)
{
    static const kvs_dtype dtypes[3] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16,
                                        KVS_DTYPE_FLOAT32};
    for (int d = 0; d < 3; d++) {
        kvs_layout layout;
        int64_t dims[2] = {2, 8};
        layout.ngroups = 0;
        FZ_ASSERT(kvs_layout_add_group(&layout, 2, dims, dtypes[d]) == KVS_OK, "layout");
        size_t est = 0;
        int rc = kvs_estimate_serialized_size(pair->serializer, &layout, &est);
        if (rc != KVS_OK) {
            FZ_ASSERT_REFUSAL(rc, "estimate_serialized_size");
            continue;
        }
        size_t raw = (size_t)kvs_layout_nbytes(&layout);
        uint8_t *src = malloc(raw), *tmp = malloc(est ? est : 1), *back = malloc(raw);
        FZ_ASSERT(src && tmp && back, "out of memory");
        for (size_t i = 0; i < raw; i++) src[i] = (uint8_t)(i * 37 + 11);
        kvs_memobj s, t, b;
        kvs_layout flat;
        FZ_ASSERT(kvs_memobj_init(&s, src, raw, &layout, KVS_FMT_KV_2LTD) == KVS_OK, "init");
        FZ_ASSERT(kvs_layout_flat(&flat, est, KVS_DTYPE_UINT8) == KVS_OK, "flat");
        FZ_ASSERT(kvs_memobj_init(&t, tmp, est, &flat, KVS_FMT_BINARY_BUFFER) == KVS_OK, "init");
        FZ_ASSERT(kvs_memobj_init(&b, back, raw, &layout, KVS_FMT_KV_2LTD) == KVS_OK, "init");
        size_t nw = 0;
        rc = kvs_serialize(pair->serializer, &s, &t, NULL, &nw);
        if (rc == KVS_OK) {
            FZ_ASSERT(nw <= est, "serialize wrote %zu bytes, estimate %zu", nw, est);
            FZ_ASSERT(kvs_memobj_set_used_size(&t, nw) == KVS_OK, "narrow");
            rc = kvs_deserialize(pair->deserializer, &t, &b, NULL);
            FZ_ASSERT(rc == KVS_OK, "deserialize of a fresh serialize failed: %d", rc);
        } else {
            FZ_ASSERT_REFUSAL(rc, "serialize");
        }
        free(src);
        free(tmp);
        free(back);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text == NULL) return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    kvs_serde_pair pair;
    memset(&pair, 0x5A, sizeof pair);
    int rc = kvs_serde_create_pair(text, &pair);
    if (rc != KVS_OK) {
        FZ_ASSERT_REFUSAL(rc, "kvs_serde_create_pair");
        FZ_ASSERT(pair.serializer == NULL && pair.deserializer == NULL,
                  "a refused create left the pair non-zero");
    } else {
        FZ_ASSERT(pair.serializer && pair.deserializer, "accepted but a half is NULL");
        FZ_ASSERT(pair.max_workers >= 1 && pair.max_workers <= 1024, "max_workers %u",
                  pair.max_workers);
    }

    /* The parsed-object entry point agrees (when the text parses at all;
     * the text entry point refuses duplicate keys, as parsed here). */
    json_t *obj = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, NULL);
    if (obj != NULL) {
        kvs_serde_pair pair2;
        int rc2 = kvs_serde_create_pair_json(obj, &pair2);
        FZ_ASSERT(rc2 == rc, "text gives %d, parsed object gives %d", rc, rc2);
        if (rc2 == KVS_OK) kvs_serde_pair_destroy(&pair2);
        else FZ_ASSERT_REFUSAL(rc2, "kvs_serde_create_pair_json");
        json_decref(obj);
    }

    if (rc == KVS_OK) {
        round_trip(&pair);
        if (pair.max_workers <= MAX_WORKERS_FOR_PROCESSOR) {
            kvs_processor *p = NULL;
            int rc3 = kvs_serde_create(text, &p);
            FZ_ASSERT(rc3 == KVS_OK && p != NULL, "pair accepted, processor refused: %d", rc3);
            kvs_processor_destroy(p);
        }
        kvs_serde_pair_destroy(&pair);
        FZ_ASSERT(pair.serializer == NULL && pair.deserializer == NULL, "destroy did not zero");
    } else {
        kvs_processor *p = (kvs_processor *)&pair; /* must stay untouched */
        int rc3 = kvs_serde_create(text, &p);
        FZ_ASSERT(rc3 == rc, "pair refused with %d, processor with %d", rc, rc3);
        FZ_ASSERT(p == (kvs_processor *)&pair, "a refused kvs_serde_create changed *out");
    }
    free(text);
    return 0;
}
