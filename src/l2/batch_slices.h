/* batch_slices.h - internal: how the fs and Redis adapters run one store,
 * lookup or load task on several workers at once.
 *
 * Why. A task may carry thousands of keys, and each key waits on I/O (an
 * fsync, a read, a network round trip). Run as one pool job, a big batch
 * would use one worker while the others idle; so a task of n keys is cut
 * into up to `max_slices` contiguous slices (the adapter passes its worker
 * count), one pool job each.
 *
 * How, and what an adapter must do:
 *   1. kvs_l2_batch_submit() copies the caller's keys and objects (the
 *      caller may reuse its arrays once submit returns), cuts [0, n) into
 *      min(n, max_slices) slices whose sizes differ by at most one, the
 *      larger ones first (10 keys, 4 slices: [0,3) [3,6) [6,8) [8,10)),
 *      takes the task's id from the task queue, and queues every slice.
 *      Everything that can fail happens before the task takes an id.
 *   2. On a worker, the adapter's run(slice) does the keys
 *      [slice->begin, slice->end) of slice->batch, writing only memory
 *      that is the slice's own: hit[i] for its keys (lookups and loads),
 *      slice->bytes (stores: bytes stored), and its error with
 *      kvs_l2_slice_fail(). No lock is needed for any of it.
 *   3. When run() returns, an atomic countdown (acq_rel, so the last slice
 *      sees every other slice's writes) picks the last slice to finish;
 *      that one merges in key order and completes the task on the queue:
 *      a store's bytes_written is the sum of the slices' bytes, a lookup's
 *      or load's hits are hit[], and the task's error is that of the first
 *      slice (in key order) that has one. A slice that records only its
 *      lowest failing key's error therefore gives the task the failing key
 *      with the lowest index.
 *   A task of 0 keys has no slices and completes inside submit.
 *
 * The memory adapter does not use this: it runs a task as a single job and
 * records results on the task directly (its keys cost a memcpy, not I/O). */
#ifndef KVS_L2_BATCH_SLICES_H
#define KVS_L2_BATCH_SLICES_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kvserde/error.h"
#include "kvserde/l2.h"
#include "l2/task_queue.h"
#include "util/thread_pool.h"

typedef struct kvs_l2_batch kvs_l2_batch;

/* A contiguous run of a task's keys, run as one pool job. */
typedef struct kvs_l2_slice {
    kvs_job job;                     /* the pool's; not for run() */
    kvs_l2_batch *batch;
    size_t begin, end;               /* the keys [begin, end) of the batch */
    uint64_t bytes;                  /* stores: bytes this slice stored */
    int status;                      /* this slice's error, KVS_OK if none */
    char message[KVS_ERROR_MSG_MAX];
} kvs_l2_slice;

/* Runs one slice on a worker thread (see step 2 above). */
typedef void (*kvs_l2_slice_fn)(kvs_l2_slice *s);

/* How an adapter runs its batches: set once at create, copied into each
 * batch at submit. */
typedef struct kvs_l2_batch_runner {
    kvs_l2_task_queue *q;   /* ids, results, fds; q->owner prefixes messages */
    kvs_thread_pool *pool;  /* runs the slices */
    unsigned max_slices;    /* >= 1: at most this many slices a task */
    kvs_l2_slice_fn run;
    void *ctx;              /* for run(): the adapter */
} kvs_l2_batch_runner;

/* One submitted task. Lives from submit until the last slice has merged. */
struct kvs_l2_batch {
    kvs_l2_batch_runner runner;
    kvs_l2_task *t;          /* the queue's record; t->direction */
    size_t n;
    kvs_object_key *keys;    /* keys[n], a copy */
    kvs_memobj **objects;    /* objects[n], a copy: stores and loads, else NULL */
    uint8_t *hit;            /* hit[n], zeroed: lookups and loads, else NULL */
    atomic_uint remaining;   /* slices not finished yet */
    unsigned nslices;
    kvs_l2_slice slices[];
};

/* Submit a task of direction d on keys[n] (objects[n] for stores and loads,
 * ignored for lookups) and set *id. KVS_OK, or with nothing submitted and no
 * id used: KVS_ENOMEM ("<owner>: batch of N keys is too large", "<owner>:
 * out of memory for a task of N keys") or kvs_l2_tq_begin()'s error
 * (KVS_ECLOSED after close). */
int kvs_l2_batch_submit(const kvs_l2_batch_runner *runner, kvs_l2_direction d,
                        const kvs_object_key *keys, kvs_memobj *const *objects, size_t n,
                        kvs_l2_task_id *id);

/* Record the slice's error: the first one recorded wins (status and the
 * formatted message, cut to KVS_ERROR_MSG_MAX). */
void kvs_l2_slice_fail(kvs_l2_slice *s, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* KVS_L2_BATCH_SLICES_H */
