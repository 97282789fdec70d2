/* Create the fp8 serde from JSON and round-trip a bfloat16 tensor. */
#include <kvserde/kvserde.h>
#include <stdio.h>

int main(void)
{
    kvs_serde_pair fp8;
    if (kvs_serde_create_pair("{\"type\": \"fp8\", \"fp8_dtype\": \"float8_e4m3fn\"}",
                              &fp8) != KVS_OK) {
        fprintf(stderr, "kvserde: %s\n", kvs_last_error());
        return 1;
    }
    /* A [2, 8] bfloat16 tensor: 1.0, 1.5, 2.0, ... as bfloat16 bits. */
    uint16_t kv[16];
    for (int i = 0; i < 16; i++) kv[i] = (uint16_t)(0x3F80 + 0x40 * i);
    kvs_layout layout = {0};
    int64_t shape[2] = {2, 8};
    kvs_layout_add_group(&layout, 2, shape, KVS_DTYPE_BFLOAT16);
    kvs_memobj src, blob, back;
    kvs_memobj_init(&src, kv, sizeof kv, &layout, KVS_FMT_UNDEFINED);

    /* Serialize into a buffer of the serde's estimate (24 bytes here). */
    kvs_layout blob_layout;
    kvs_serialized_layout(fp8.serializer, &layout, &blob_layout);
    uint8_t bytes[64];
    kvs_memobj_init(&blob, bytes, sizeof bytes, &blob_layout, KVS_FMT_BINARY_BUFFER);
    size_t written;
    if (kvs_serialize(fp8.serializer, &src, &blob, NULL, &written) != KVS_OK) {
        fprintf(stderr, "kvserde: %s\n", kvs_last_error());
        return 1;
    }
    kvs_memobj_set_used_size(&blob, written); /* store only these bytes */

    /* Deserialize back into a bfloat16 tensor of the same layout. */
    uint16_t restored[16];
    kvs_memobj_init(&back, restored, sizeof restored, &layout, KVS_FMT_UNDEFINED);
    if (kvs_deserialize(fp8.deserializer, &blob, &back, NULL) != KVS_OK) {
        fprintf(stderr, "kvserde: %s\n", kvs_last_error());
        return 1;
    }
    printf("%zu bf16 bytes -> %zu fp8 bytes; element 5: 0x%04x -> 0x%02x -> 0x%04x\n",
           sizeof kv, written, kv[5], bytes[5], restored[5]);
    kvs_serde_pair_destroy(&fp8);
    return 0;
}
