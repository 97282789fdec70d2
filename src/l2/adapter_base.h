/* adapter_base.h - internal: the skeleton every built-in L2 adapter (fs,
 * memory, redis) embeds, so the completion plumbing they share is written
 * once: the adapter handle, the task queue (ids, eventfds, unread results,
 * task_queue.h), the worker pool, the batch runner (batch_slices.h), and
 * close, which every adapter does in the same four steps.
 *
 * An adapter's struct starts with `kvs_l2_adapter_base base;`, gets back
 * to itself with KVS_CONTAINER_OF(a, my_adapter, base.adapter), and puts
 * the shared ops in its table:
 *
 *     static const struct kvs_l2_adapter_ops my_ops = {
 *         .name = "my",
 *         KVS_L2_BASE_COMPLETION_OPS,  // event fds, pops, queries, close
 *         KVS_L2_BASE_BATCH_OPS,       // submits through the batch runner
 *         .unlock = ..., ...            // what is its own
 *     };
 *
 * Life: kvs_l2_base_init() at create (before anything that can fail
 * after it is undone with kvs_l2_base_destroy()), kvs_l2_base_start() once
 * the adapter is ready to run tasks, then the ops; destroy calls
 * kvs_l2_base_destroy() (after close: the pool is stopped). */
#ifndef KVS_L2_ADAPTER_BASE_H
#define KVS_L2_ADAPTER_BASE_H

#include <pthread.h>

#include "kvserde/l2.h"
#include "l2/batch_slices.h"
#include "l2/task_queue.h"
#include "util/thread_pool.h"

typedef struct kvs_l2_adapter_base kvs_l2_adapter_base;

/* Close's adapter-specific last step (release a directory, connections),
 * after the workers are gone and the fds closed; NULL if none. */
typedef void (*kvs_l2_release_fn)(kvs_l2_adapter_base *b);

struct kvs_l2_adapter_base {
    kvs_l2_adapter adapter;     /* what callers hold */
    kvs_l2_task_queue q;        /* q.owner ("fs") prefixes the base's messages */
    kvs_thread_pool *pool;      /* NULL until kvs_l2_base_start() */
    kvs_l2_batch_runner runner; /* tasks as slices on pool (run NULL: unused) */
    kvs_l2_release_fn release;
    pthread_mutex_t close_mu;   /* serializes close() callers */
    int close_done;             /* guarded by close_mu */
};

/* Set the ops, open the task queue (messages start "<owner>: ") and the
 * close lock. kvs_l2_tq_init()'s error (KVS_EIO), with nothing to undo. */
int kvs_l2_base_init(kvs_l2_adapter_base *b, const struct kvs_l2_adapter_ops *ops,
                     const char *owner, kvs_l2_release_fn release);

/* Start `workers` threads named `thread_name`; with `run` (fs, redis) the
 * batch submits cut each task into up to `workers` slices run(slice) does,
 * ctx being run's (runner.ctx). kvs_thread_pool_create()'s error, with
 * nothing started. */
int kvs_l2_base_start(kvs_l2_adapter_base *b, unsigned workers, const char *thread_name,
                      kvs_l2_slice_fn run, void *ctx);

/* Stop the workers (every queued task runs and completes first) and free
 * the queue's unread results and the locks. b itself is the caller's. */
void kvs_l2_base_destroy(kvs_l2_adapter_base *b);

/* The task queue of an adapter built on this skeleton (its ops table has
 * the base's completion ops: fs, memory, redis), or NULL for any other
 * adapter. The serde wrapper hooks its store and load completions
 * (kvs_l2_tq_set_hook, util/completion_hook.h) to chain its phases; an
 * adapter without one keeps its event fds, and the wrapper polls them. */
kvs_l2_task_queue *kvs_l2_base_task_queue(kvs_l2_adapter *a);

/* KVS_ECLOSED "<owner>: adapter is closed": a synchronous call after close. */
int kvs_l2_base_refuse_closed(const kvs_l2_adapter_base *b);

/* The shared ops (see above). close: refuse new tasks, let every queued one
 * run, record and signal, close the fds (nothing can complete any more),
 * then b->release; a second close returns once the first has finished. */
int kvs_l2_base_store_fd(kvs_l2_adapter *a);
int kvs_l2_base_lookup_fd(kvs_l2_adapter *a);
int kvs_l2_base_load_fd(kvs_l2_adapter *a);
int kvs_l2_base_pop_stores(kvs_l2_adapter *a, kvs_l2_store_result *out, size_t cap,
                           size_t *count);
int kvs_l2_base_query_lookup(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out);
int kvs_l2_base_query_load(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out);
int kvs_l2_base_close(kvs_l2_adapter *a);
int kvs_l2_base_submit_store(kvs_l2_adapter *a, const kvs_object_key *keys,
                             kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id);
int kvs_l2_base_submit_lookup(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                              kvs_l2_task_id *id);
int kvs_l2_base_submit_load(kvs_l2_adapter *a, const kvs_object_key *keys,
                            kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id);

#define KVS_L2_BASE_COMPLETION_OPS                                                    \
    .store_event_fd = kvs_l2_base_store_fd, .lookup_event_fd = kvs_l2_base_lookup_fd, \
    .load_event_fd = kvs_l2_base_load_fd, .pop_completed_stores = kvs_l2_base_pop_stores, \
    .query_lookup_and_lock = kvs_l2_base_query_lookup,                                \
    .query_load = kvs_l2_base_query_load, .close = kvs_l2_base_close

#define KVS_L2_BASE_BATCH_OPS                                                         \
    .submit_store = kvs_l2_base_submit_store,                                         \
    .submit_lookup_and_lock = kvs_l2_base_submit_lookup,                              \
    .submit_load = kvs_l2_base_submit_load

#endif /* KVS_L2_ADAPTER_BASE_H */
