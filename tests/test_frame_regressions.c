/* test_frame_regressions.c - bugs found by fuzz/fuzz_frame.c,
 * fuzz/fuzz_pipeline_roundtrip.c and their review, kept fixed.
 *   - kvs_pipeline_verify freed an uninitialized pointer when the payload
 *     checksum did not match (any damaged blob: a crash or heap corruption
 *     instead of KVS_ECORRUPT);
 *   - kvs_key_canonical (the key fingerprint) copied chunk_hash_len bytes
 *     into its fixed stack buffer without a bound, for a key struct that
 *     was not built by kvs_object_key_init.
 */
#include <stdint.h>
#include <string.h>

#include "kvserde/kvserde.h"
#include "kvserde/pipeline.h"
#include "kvserde/registry.h"
#include "kvs_test.h"

/* Leave a non-NULL pattern on the stack where the next call's locals go,
 * so an uninitialized pointer there is not NULL by luck. */
__attribute__((noinline)) static void dirty_stack(void)
{
    volatile uintptr_t junk[512];
    for (size_t i = 0; i < 512; i++) junk[i] = (uintptr_t)&junk[i];
}

static void test_verify_damaged_payload(void)
{
    kvs_serde_pair pair;
    REQUIRE(kvs_serde_create_pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},"
                                  "{\"type\":\"xxh3\"}]}",
                                  &pair) == KVS_OK);
    uint16_t data[64];
    for (int i = 0; i < 64; i++) data[i] = (uint16_t)(0x3C00 + i);
    kvs_layout lay, flat;
    kvs_memobj src, dst;
    uint8_t blob[512];
    size_t nw = 0;
    CHECK(kvs_layout_flat(&lay, 64, KVS_DTYPE_BFLOAT16) == KVS_OK);
    CHECK(kvs_memobj_init(&src, data, sizeof data, &lay, KVS_FMT_KV_2LTD) == KVS_OK);
    CHECK(kvs_layout_flat(&flat, sizeof blob, KVS_DTYPE_UINT8) == KVS_OK);
    CHECK(kvs_memobj_init(&dst, blob, sizeof blob, &flat, KVS_FMT_BINARY) == KVS_OK);
    CHECK(kvs_serialize(pair.serializer, &src, &dst, NULL, &nw) == KVS_OK);
    CHECK(kvs_pipeline_verify(pair.deserializer, blob, nw, NULL) == KVS_OK);
    blob[nw - 20] ^= 0x40; /* a payload byte: the checksum catches it */
    dirty_stack();
    CHECK_EQ_INT(kvs_pipeline_verify(pair.deserializer, blob, nw, NULL), KVS_ECORRUPT);
    blob[nw - 1] ^= 0x01; /* and the digest itself */
    dirty_stack();
    CHECK_EQ_INT(kvs_pipeline_verify(pair.deserializer, blob, nw, NULL), KVS_ECORRUPT);
    kvs_serde_pair_destroy(&pair);
}

static void test_fingerprint_of_an_unchecked_key(void)
{
    kvs_object_key k, big;
    static const uint8_t h[4] = {1, 2, 3, 4};
    REQUIRE(kvs_object_key_init(&k, h, sizeof h, "m", 0, 0, "") == KVS_OK);
    big = k;
    memset(big.chunk_hash, 7, sizeof big.chunk_hash);
    big.chunk_hash_len = 100000; /* not what kvs_object_key_init allows */
    (void)kvs_object_key_fingerprint(&big); /* bounded: no overflow (ASan) */
    CHECK(kvs_object_key_fingerprint(&k) != kvs_object_key_fingerprint(&big));
}

int main(void)
{
    RUN(test_verify_damaged_payload);
    RUN(test_fingerprint_of_an_unchecked_key);
    return TEST_SUMMARY();
}
