/* task_queue.h - internal: the completion plumbing every L2 adapter shares
 * (upstream's suggested "EventfdTaskQueue"): one task-id counter for the
 * three directions, one eventfd per direction, the finished results waiting
 * to be read, and the closed flag, all under one lock.
 *
 * A task's life:
 *   1. kvs_l2_tq_begin()   at submit: allocates the result record (so
 *                          completion never allocates), takes an id, counts
 *                          the submit as in progress. Fails only with
 *                          KVS_ECLOSED or KVS_ENOMEM, and then uses no id.
 *   2. kvs_l2_tq_end_submit() once the task is handed to a worker (or
 *                          completed inline), so close can wait for
 *                          submits in progress before it stops the workers.
 *   3. the worker fills t->store (bytes, status) or t->bitmap (hits, status)
 *   4. kvs_l2_tq_complete() records the result under the lock, then writes
 *                          1 to the direction's eventfd (or calls the
 *                          direction's completion hook, if one is set).
 *   5. the caller pops it: kvs_l2_tq_pop_stores() / kvs_l2_tq_query().
 */
#ifndef KVS_L2_TASK_QUEUE_H
#define KVS_L2_TASK_QUEUE_H

#include <pthread.h>
#include <stddef.h>

#include "kvserde/l2.h"
#include "util/completion_hook.h"
#include "util/notifier.h"
#include "util/result_map.h"

typedef enum kvs_l2_direction {
    KVS_L2_STORE = 0,
    KVS_L2_LOOKUP = 1,
    KVS_L2_LOAD = 2,
} kvs_l2_direction;

/* One task's result record. */
typedef struct kvs_l2_task {
    kvs_l2_direction direction;
    kvs_l2_task_id id;
    kvs_l2_store_result store;  /* KVS_L2_STORE */
    kvs_l2_bitmap bitmap;       /* KVS_L2_LOOKUP / KVS_L2_LOAD: hits[nkeys] */
    struct kvs_l2_task *next;   /* finished-store FIFO */
} kvs_l2_task;

typedef struct kvs_l2_task_queue {
    pthread_mutex_t lock;
    pthread_cond_t submits_done;
    const char *owner;              /* component name for messages */
    kvs_l2_task_id next_id;
    kvs_notifier fds[3];
    kvs_completion_hook hooks[3];   /* replace fds[d] where fn is set */
    kvs_l2_task *stores_head, *stores_tail; /* finished stores, oldest first */
    kvs_result_map bitmaps[2];      /* finished lookups / loads by id */
    unsigned submitting;            /* begin() without end_submit() */
    int closed;
} kvs_l2_task_queue;

/* Open the three eventfds. `owner` (a static string, e.g. "fs") prefixes
 * messages. KVS_EIO if an eventfd cannot be made (none is left open). */
int kvs_l2_tq_init(kvs_l2_task_queue *q, const char *owner);

/* The direction's fd, or KVS_ECLOSED once the fds are closed. */
int kvs_l2_tq_fd(kvs_l2_task_queue *q, kvs_l2_direction d);

/* Start a task of `nkeys` keys (see above). The record's state is
 * KVS_TASK_OK with status KVS_OK; bitmaps start all-miss. */
int kvs_l2_tq_begin(kvs_l2_task_queue *q, kvs_l2_direction d, size_t nkeys,
                    kvs_l2_task **out);

/* The submit of a begun task is over (queued to a worker or completed). */
void kvs_l2_tq_end_submit(kvs_l2_task_queue *q);

/* Record a failure on the task: the first one wins (status + message). For a
 * store, the task becomes KVS_TASK_FAILED. */
void kvs_l2_tq_fail(kvs_l2_task *t, int status, const char *message);

/* Set key i's hit bit (lookup / load). */
void kvs_l2_tq_hit(kvs_l2_task *t, size_t i);

/* Deliver the direction's finished tasks to `hook` instead of its fd
 * (util/completion_hook.h: the serde wrapper chaining its phases). Set
 * before the first submit of that direction. */
void kvs_l2_tq_set_hook(kvs_l2_task_queue *q, kvs_l2_direction d, kvs_completion_hook hook);

/* Record the finished task and signal its fd (or call its hook, with the
 * lock released). Never fails, never allocates; after this the queue owns
 * t. */
void kvs_l2_tq_complete(kvs_l2_task_queue *q, kvs_l2_task *t);

/* Pop finished stores, oldest first (up to cap). */
void kvs_l2_tq_pop_stores(kvs_l2_task_queue *q, kvs_l2_store_result *out, size_t cap,
                          size_t *count);

/* Pop a finished lookup / load: fills *out (ownership of out->hits passes to
 * the caller) or, if not finished / unknown / already read, a pending
 * result. */
void kvs_l2_tq_query(kvs_l2_task_queue *q, kvs_l2_direction d, kvs_l2_task_id id,
                     kvs_l2_bitmap *out);

/* Refuse new tasks from now on and wait until no submit is in progress.
 * Returns 1 the first time, 0 if already closing. A 0 does not mean the
 * first close has finished (it may still be joining workers): an adapter
 * whose close must not return early serializes its closes with its own
 * mutex. */
int kvs_l2_tq_close_begin(kvs_l2_task_queue *q);

/* 1 once close has begun. */
int kvs_l2_tq_is_closed(kvs_l2_task_queue *q);

/* Close the fds (after the workers are gone: nothing will complete). */
void kvs_l2_tq_close_fds(kvs_l2_task_queue *q);

/* Free unread results and the lock. */
void kvs_l2_tq_destroy(kvs_l2_task_queue *q);

#endif /* KVS_L2_TASK_QUEUE_H */
