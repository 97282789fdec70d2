/* Store one KV chunk through the fp8 serde into a directory and load it back. */
#include <kvserde/kvserde.h>
#include <poll.h>
#include <stdio.h>

static void wait_fd(int fd) /* until the adapter signals a finished task */
{
    struct pollfd p = {fd, POLLIN, 0};
    poll(&p, 1, 10000);
    kvs_event_fd_consume(fd, NULL);
}

int main(int argc, char **argv)
{
    char spec[512];
    snprintf(spec, sizeof spec, "{\"type\": \"fs\", \"path\": \"%s\", \"serde\": {\"type\": \"fp8\"}}",
             argc > 1 ? argv[1] : "/tmp/kvserde-example");
    kvs_l2_adapter *l2;
    if (kvs_l2_create(spec, &l2) != KVS_OK) {
        fprintf(stderr, "kvserde: %s\n", kvs_last_error());
        return 1;
    }
    kvs_layout layout = {0}; /* one chunk: [2 (K,V), 4 layers, 16 tokens, 64] bfloat16 */
    kvs_layout_add_group(&layout, 4, (int64_t[]){2, 4, 16, 64}, KVS_DTYPE_BFLOAT16);
    kvs_memobj *chunk, *loaded;
    kvs_memobj_alloc(&layout, KVS_FMT_KV_2LTD, &chunk);
    kvs_memobj_alloc(&layout, KVS_FMT_KV_2LTD, &loaded);
    uint16_t *kv = chunk->data;
    for (int i = 0; i < 8192; i++) kv[i] = (uint16_t)(0x3F80 + (i % 64)); /* ~1.0 .. 1.5 */
    kvs_object_key key;
    kvs_object_key_init(&key, "\x00\x01\x02\x03", 4, "meta-llama/Llama-3-8B", 0, 0, NULL);

    kvs_l2_task_id id;
    kvs_l2_store_result stored;
    size_t n = 0;
    kvs_l2_submit_store(l2, &key, &chunk, 1, &id);
    while (n == 0) {
        wait_fd(kvs_l2_store_event_fd(l2));
        kvs_l2_pop_completed_stores(l2, &stored, 1, &n);
    }
    kvs_l2_bitmap hits = {0};
    kvs_l2_submit_load(l2, &key, &loaded, 1, &id);
    while (hits.state == KVS_TASK_PENDING) {
        wait_fd(kvs_l2_load_event_fd(l2));
        kvs_l2_query_load(l2, id, &hits);
    }
    printf("stored %llu bytes for %zu; loaded %zu of 1; element 5: 0x%04x -> 0x%04x\n",
           (unsigned long long)stored.bytes_written, kvs_memobj_size(chunk), hits.nhits,
           kv[5], ((uint16_t *)loaded->data)[5]);
    kvs_l2_bitmap_release(&hits);
    kvs_memobj_free(chunk);
    kvs_memobj_free(loaded);
    kvs_l2_destroy(l2);
    return 0;
}
