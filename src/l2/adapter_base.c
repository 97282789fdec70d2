/* adapter_base.c - see adapter_base.h. */
#include "l2/adapter_base.h"

#include "kvserde/error.h"
#include "kvserde/export.h"

static kvs_l2_adapter_base *base_of(kvs_l2_adapter *a)
{
    return KVS_CONTAINER_OF(a, kvs_l2_adapter_base, adapter);
}

int kvs_l2_base_init(kvs_l2_adapter_base *b, const struct kvs_l2_adapter_ops *ops,
                     const char *owner, kvs_l2_release_fn release)
{
    int rc = kvs_l2_tq_init(&b->q, owner);
    if (rc != KVS_OK) return rc;
    b->adapter.ops = ops;
    b->pool = NULL;
    b->runner = (kvs_l2_batch_runner){0};
    b->release = release;
    b->close_done = 0;
    pthread_mutex_init(&b->close_mu, NULL);
    return KVS_OK;
}

int kvs_l2_base_start(kvs_l2_adapter_base *b, unsigned workers, const char *thread_name,
                      kvs_l2_slice_fn run, void *ctx)
{
    int rc = kvs_thread_pool_create(workers, thread_name, &b->pool);
    if (rc != KVS_OK) return rc;
    b->runner = (kvs_l2_batch_runner){
        .q = &b->q, .pool = b->pool, .max_slices = workers, .run = run, .ctx = ctx};
    return KVS_OK;
}

void kvs_l2_base_destroy(kvs_l2_adapter_base *b)
{
    kvs_thread_pool_destroy(b->pool); /* NULL (never started): a no-op */
    kvs_l2_tq_destroy(&b->q);
    pthread_mutex_destroy(&b->close_mu);
}

int kvs_l2_base_refuse_closed(const kvs_l2_adapter_base *b)
{
    return kvs_set_error(KVS_ECLOSED, "%s: adapter is closed", b->q.owner);
}

kvs_l2_task_queue *kvs_l2_base_task_queue(kvs_l2_adapter *a)
{
    if (a == NULL || a->ops == NULL || a->ops->close != kvs_l2_base_close) return NULL;
    return &base_of(a)->q;
}

int kvs_l2_base_store_fd(kvs_l2_adapter *a)
{
    return kvs_l2_tq_fd(&base_of(a)->q, KVS_L2_STORE);
}

int kvs_l2_base_lookup_fd(kvs_l2_adapter *a)
{
    return kvs_l2_tq_fd(&base_of(a)->q, KVS_L2_LOOKUP);
}

int kvs_l2_base_load_fd(kvs_l2_adapter *a)
{
    return kvs_l2_tq_fd(&base_of(a)->q, KVS_L2_LOAD);
}

int kvs_l2_base_pop_stores(kvs_l2_adapter *a, kvs_l2_store_result *out, size_t cap,
                           size_t *count)
{
    kvs_l2_tq_pop_stores(&base_of(a)->q, out, cap, count);
    return KVS_OK;
}

int kvs_l2_base_query_lookup(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    kvs_l2_tq_query(&base_of(a)->q, KVS_L2_LOOKUP, id, out);
    return KVS_OK;
}

int kvs_l2_base_query_load(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    kvs_l2_tq_query(&base_of(a)->q, KVS_L2_LOAD, id, out);
    return KVS_OK;
}

int kvs_l2_base_close(kvs_l2_adapter *a)
{
    kvs_l2_adapter_base *b = base_of(a);
    pthread_mutex_lock(&b->close_mu);
    if (!b->close_done) {
        (void)kvs_l2_tq_close_begin(&b->q);
        int rc = kvs_thread_pool_shutdown(b->pool);
        if (rc != KVS_OK) { /* only from our own worker: never happens */
            pthread_mutex_unlock(&b->close_mu);
            return rc;
        }
        kvs_l2_tq_close_fds(&b->q);
        if (b->release) b->release(b);
        b->close_done = 1;
    }
    pthread_mutex_unlock(&b->close_mu);
    return KVS_OK;
}

int kvs_l2_base_submit_store(kvs_l2_adapter *a, const kvs_object_key *keys,
                             kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    return kvs_l2_batch_submit(&base_of(a)->runner, KVS_L2_STORE, keys, objects, n, id);
}

int kvs_l2_base_submit_lookup(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                              kvs_l2_task_id *id)
{
    return kvs_l2_batch_submit(&base_of(a)->runner, KVS_L2_LOOKUP, keys, NULL, n, id);
}

int kvs_l2_base_submit_load(kvs_l2_adapter *a, const kvs_object_key *keys,
                            kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    return kvs_l2_batch_submit(&base_of(a)->runner, KVS_L2_LOAD, keys, objects, n, id);
}
