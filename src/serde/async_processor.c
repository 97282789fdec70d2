/* async_processor.c - the default processors (upstream AsyncSerdeProcessor
 * and its tuple-aware analogue): a serde pair run on a thread pool, one
 * eventfd per direction, results popped once.
 *
 * One engine, two faces. `struct core` is the whole machinery: thread pool,
 * task ids, result maps, notifiers, close. A `struct transform` says how ONE
 * batch item is transformed, and is the only thing that differs:
 *   single  (kvs_processor)        src[i] -> dst[i]            kvs_serialize
 *   multi   (kvs_multi_processor)  group i -> dst[i], and back  kvs_multi_*
 * A task stores its objects flat, sources then destinations; the side that
 * holds groups has group_size pointers per item (1 for the single kind), so
 * the single processor is the multi machinery with groups of one.
 *
 * Life of a task:
 *   submit   (caller thread) check the arrays, copy them into a new task,
 *            then under the lock: refuse if closing, reserve a result slot,
 *            take the next id, queue the task. Everything that can fail
 *            happens before the id is taken, so a refused submit uses no id
 *            and leaves nothing behind.
 *   run      (worker thread, no lock) transform item by item, stop at the
 *            first failure and keep its code and message. A transform may
 *            split one large item over idle workers (kvs_serde_parallel_for,
 *            at the end of this file); it returns once every piece is done,
 *            so the rest of the task's life does not know about splits.
 *   finish   (worker thread) record the task in its direction's result map
 *            under the lock, then write 1 to the direction's eventfd - in
 *            that order, so a reader woken by the fd always finds the result.
 *            A direction with a completion hook (processor_hooks.h: the
 *            serde wrapper chaining its phases) calls the hook there
 *            instead of writing the fd, after the lock is released.
 *   query    (any thread) pop the task from the map under the lock, copy its
 *            result out, free it.
 *
 * The finished task itself is the stored result, so completion allocates
 * nothing and cannot fail (its map slot was reserved at submit).
 *
 * Close sets `closing` under the lock (from then on submits are refused, and
 * every accepted task is already queued), lets the pool drain and join, then
 * closes the fds. close_mu makes concurrent or repeated closes wait for the
 * first and then return.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error_internal.h"
#include "kvserde/error.h"
#include "kvserde/export.h"
#include "kvserde/multi.h"
#include "kvserde/multi_processor.h"
#include "kvserde/processor.h"
#include "kvserde/serde.h"
#include "serde/processor_hooks.h"
#include "util/completion_hook.h"
#include "util/notifier.h"
#include "util/result_map.h"
#include "util/thread_pool.h"

enum direction { DIR_SERIALIZE = 0, DIR_DESERIALIZE = 1 };

static const char *const direction_name[2] = {"serialize", "deserialize"};

struct core;

/* How one batch item is transformed. `src` / `dst` point at the item's
 * group on the group side (core->group_size pointers, one for the single
 * kind) and at its one object on the other side. */
struct transform {
    int (*serialize)(struct core *c, kvs_memobj *const *src, kvs_memobj *dst,
                     const kvs_object_key *key, size_t *nwritten);
    int (*deserialize)(struct core *c, kvs_memobj *src, kvs_memobj *const *dst,
                       const kvs_object_key *key);
    void (*destroy_serde)(struct core *c);
};

struct task {
    kvs_job job; /* pool linkage; run() recovers the task from it */
    struct core *core;
    enum direction dir;
    kvs_task_id id;
    kvs_task_result result;
    size_t n;           /* batch items */
    size_t nsrc;        /* pointers in the source part (n, or n x group_size) */
    kvs_object_key *keys; /* n keys copied at submit (after objs), or NULL */
    kvs_memobj *objs[]; /* sources then destinations, copied at submit */
};

struct core {
    const struct transform *xf;
    union {
        kvs_serializer *single;
        kvs_multi_serializer *multi;
    } ser;
    union {
        kvs_deserializer *single;
        kvs_multi_deserializer *multi;
    } de;
    size_t group_size;                 /* 1 for the single kind */
    kvs_thread_pool *pool;
    unsigned nworkers;
    _Atomic size_t split_min_bytes;    /* kvs_async_processor_set_split */
    _Atomic size_t split_chunk_bytes;
    _Atomic size_t inline_max_bytes;   /* kvs_async_processor_set_inline */

    pthread_mutex_t mu;                /* guards everything below */
    kvs_task_id next_id;               /* shared by both directions */
    kvs_result_map done[2];            /* finished tasks per direction */
    kvs_notifier notifier[2];          /* fds; -1 once closed */
    kvs_completion_hook hook[2];       /* replaces the fd where fn is set */
    int closing;                       /* submits refused */
    unsigned inflight;                 /* tasks queued or running */
    unsigned helping;                  /* split helpers queued or running */

    pthread_mutex_t close_mu;          /* serializes close() callers */
    int closed;                        /* guarded by close_mu (and mu) */
};

/* The core whose task this thread is running, so kvs_serde_parallel_for
 * called from inside the transform knows whose idle workers it may use.
 * NULL everywhere else (callers' threads, split helpers). */
static _Thread_local struct core *tl_core;

/* ---------------------------------------------------------------------
 * The two transforms
 * ------------------------------------------------------------------ */

static int single_serialize(struct core *c, kvs_memobj *const *src, kvs_memobj *dst,
                            const kvs_object_key *key, size_t *nwritten)
{
    return kvs_serialize(c->ser.single, src[0], dst, key, nwritten);
}

static int single_deserialize(struct core *c, kvs_memobj *src, kvs_memobj *const *dst,
                              const kvs_object_key *key)
{
    return kvs_deserialize(c->de.single, src, dst[0], key);
}

static void single_destroy_serde(struct core *c)
{
    kvs_serializer_destroy(c->ser.single);
    kvs_deserializer_destroy(c->de.single);
}

static const struct transform single_transform = {
    .serialize = single_serialize,
    .deserialize = single_deserialize,
    .destroy_serde = single_destroy_serde,
};

static int multi_serialize(struct core *c, kvs_memobj *const *src, kvs_memobj *dst,
                           const kvs_object_key *key, size_t *nwritten)
{
    return kvs_multi_serialize(c->ser.multi, src, c->group_size, dst, key, nwritten);
}

static int multi_deserialize(struct core *c, kvs_memobj *src, kvs_memobj *const *dst,
                             const kvs_object_key *key)
{
    return kvs_multi_deserialize(c->de.multi, src, dst, c->group_size, key);
}

static void multi_destroy_serde(struct core *c)
{
    kvs_multi_serializer_destroy(c->ser.multi);
    kvs_multi_deserializer_destroy(c->de.multi);
}

static const struct transform multi_transform = {
    .serialize = multi_serialize,
    .deserialize = multi_deserialize,
    .destroy_serde = multi_destroy_serde,
};

/* ---------------------------------------------------------------------
 * Worker side
 * ------------------------------------------------------------------ */

/* Transform every item of the task, in order, stopping at the first
 * failure. Runs without the processor lock: the serde is pure and the
 * objects belong to this task until its result has been read. */
static void transform(struct task *t)
{
    struct core *c = t->core;
    size_t src_stride = t->dir == DIR_SERIALIZE ? c->group_size : 1;
    size_t dst_stride = t->dir == DIR_DESERIALIZE ? c->group_size : 1;
    kvs_memobj *const *src = t->objs;
    kvs_memobj *const *dst = t->objs + t->nsrc;

    for (size_t i = 0; i < t->n; i++) {
        int rc;
        const kvs_object_key *key = t->keys ? &t->keys[i] : NULL;
        if (t->dir == DIR_SERIALIZE) {
            size_t nwritten = 0;
            rc = c->xf->serialize(c, src + i * src_stride, dst[i], key, &nwritten);
            /* Narrow only after success, so an L2 adapter stores just the
             * bytes written; a serializer that claims more than dst holds
             * is broken and fails the object (memobj says why). */
            if (rc == KVS_OK)
                rc = kvs_memobj_set_used_size(dst[i], nwritten);
        } else {
            rc = c->xf->deserialize(c, src[i], dst + i * dst_stride, key);
        }
        if (rc != KVS_OK) {
            t->result.state = KVS_TASK_FAILED;
            t->result.status = rc;
            t->result.failed_index = i;
            /* kvs_last_error() is this worker's thread-local message of the
             * failing call; keep it with the task so the caller sees it. */
            snprintf(t->result.message, sizeof t->result.message,
                     "processor: %s object %zu of %zu failed: %s",
                     direction_name[t->dir], i, t->n, kvs_last_error());
            return;
        }
    }
    t->result.state = KVS_TASK_OK;
}

/* Record the finished task, then signal (or call the hook). Called with mu
 * not held. */
static void finish(struct core *c, struct task *t)
{
    enum direction dir = t->dir;
    kvs_task_id id = t->id;
    pthread_mutex_lock(&c->mu);
    /* Cannot fail: the slot was reserved at submit and ids are unique. */
    (void)kvs_result_map_put_reserved(&c->done[dir], t->id, t);
    c->inflight--;
    kvs_completion_hook hook = c->hook[dir];
    pthread_mutex_unlock(&c->mu);
    /* t may already be popped and freed by a querying thread: only c and
     * id from here on. The fds stay open until close() has joined every
     * worker. A failed write could only mean the counter overflowed (2^64 -
     * 2 unread signals); the result is recorded regardless. */
    if (hook.fn)
        hook.fn(hook.ctx, id);
    else
        (void)kvs_notifier_notify(&c->notifier[dir]);
}

static void run_task(kvs_job *job)
{
    struct task *t = KVS_CONTAINER_OF(job, struct task, job);
    struct core *c = t->core;
    /* Saved and restored, not cleared: a task run inline (task_runs_inline)
     * runs on the submitter's thread, which may be running a task itself. */
    struct core *outer = tl_core;
    tl_core = c;
    transform(t);
    tl_core = outer;
    finish(c, t);
}

/* ---------------------------------------------------------------------
 * Submit and query
 * ------------------------------------------------------------------ */

/* Whether a task is small enough to run on the submitting thread
 * (kvs_async_processor_set_inline): the bytes of all its objects, both
 * sides, at most the limit. */
static int task_runs_inline(struct core *c, const struct task *t)
{
    size_t limit = atomic_load(&c->inline_max_bytes), bytes = 0;
    if (limit == 0) return 0;
    for (size_t i = 0; i < t->n * (c->group_size + 1); i++) {
        if (t->objs[i] == NULL) continue;
        bytes += t->objs[i]->capacity;
        if (bytes > limit) return 0;
    }
    return 1;
}

/* Queue n items: the source part holds n x group_size pointers when
 * serializing (groups in, blobs out), n otherwise; the destination part the
 * other way round; keys (NULL = none) n keys, copied after the pointers so
 * the caller may reuse its array. The caller has checked the arrays. */
static int core_submit(struct core *c, enum direction dir, kvs_memobj *const *src,
                       kvs_memobj *const *dst, size_t n, const kvs_object_key *keys,
                       kvs_task_id *id)
{
    /* Bytes per batch item: its pointers, then its key if there are keys.
     * Pointers are 8 bytes and a key's alignment is 8, so the keys that
     * follow the pointer part are aligned. */
    size_t per_item = c->group_size + 1; /* pointers per batch item */
    size_t item_bytes = per_item * sizeof(kvs_memobj *) + (keys ? sizeof *keys : 0);
    _Static_assert(_Alignof(kvs_object_key) <= sizeof(kvs_memobj *),
                   "keys after the pointer part must be aligned");
    /* Allocate before taking the lock or an id: if this fails, nothing has
     * happened. */
    if (n > (SIZE_MAX - sizeof(struct task)) / item_bytes)
        return kvs_set_error(KVS_ENOMEM, "processor: batch of %zu objects is too large", n);
    size_t nsrc = dir == DIR_SERIALIZE ? n * c->group_size : n;
    size_t ndst = n * per_item - nsrc;
    struct task *t = malloc(sizeof *t + n * item_bytes);
    if (t == NULL)
        return kvs_set_error(KVS_ENOMEM, "processor: out of memory for a task of %zu objects", n);
    t->job.next = NULL;
    t->job.run = run_task;
    t->core = c;
    t->dir = dir;
    t->result.state = KVS_TASK_PENDING;
    t->result.status = KVS_OK;
    t->result.failed_index = 0;
    t->result.message[0] = '\0';
    t->n = n;
    t->nsrc = nsrc;
    t->keys = NULL;
    if (n > 0) {
        memcpy(t->objs, src, nsrc * sizeof *src);
        memcpy(t->objs + nsrc, dst, ndst * sizeof *dst);
        if (keys) {
            t->keys = (kvs_object_key *)(void *)(t->objs + n * per_item);
            memcpy(t->keys, keys, n * sizeof *keys);
        }
    }

    pthread_mutex_lock(&c->mu);
    if (c->closing) {
        pthread_mutex_unlock(&c->mu);
        free(t);
        return kvs_set_error(KVS_ECLOSED, "processor: submit_%s after close",
                             direction_name[dir]);
    }
    int rc = kvs_result_map_reserve(&c->done[dir]);
    if (rc != KVS_OK) {
        pthread_mutex_unlock(&c->mu);
        free(t);
        return kvs_set_error(KVS_ENOMEM, "processor: out of memory recording task results");
    }
    t->id = c->next_id++;
    *id = t->id;
    if (n == 0) {
        /* Nothing to transform: finish at once, on the caller's thread.
         * Signal under the lock so close() cannot close the fd in between
         * (close takes the lock before it touches the fds); a hook is called
         * after it, with no lock held (util/completion_hook.h). */
        t->result.state = KVS_TASK_OK;
        (void)kvs_result_map_put_reserved(&c->done[dir], t->id, t);
        kvs_completion_hook hook = c->hook[dir];
        if (hook.fn == NULL) (void)kvs_notifier_notify(&c->notifier[dir]);
        pthread_mutex_unlock(&c->mu);
        if (hook.fn) hook.fn(hook.ctx, *id);
        return KVS_OK;
    }
    if (task_runs_inline(c, t)) {
        /* Counted in flight like a queued task, so close() waits for it. */
        c->inflight++;
        pthread_mutex_unlock(&c->mu);
        run_task(&t->job);
        return KVS_OK;
    }
    /* Queue under the lock: close() sets `closing` under the same lock
     * before it shuts the pool down, so this cannot meet a stopped pool. */
    rc = kvs_thread_pool_submit(c->pool, &t->job);
    if (rc == KVS_OK)
        c->inflight++;
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static int core_query(struct core *c, enum direction dir, kvs_task_id id,
                      kvs_task_result *out)
{
    pthread_mutex_lock(&c->mu);
    struct task *t = kvs_result_map_pop(&c->done[dir], id);
    pthread_mutex_unlock(&c->mu);

    out->status = KVS_OK;
    out->failed_index = 0;
    out->message[0] = '\0';
    if (t == NULL) {
        /* In flight, never submitted, already read, or the other
         * direction's id: all the same to the caller. */
        out->state = KVS_TASK_PENDING;
        return KVS_OK;
    }
    out->state = t->result.state;
    if (t->result.state == KVS_TASK_FAILED) {
        out->status = t->result.status;
        out->failed_index = t->result.failed_index;
        memcpy(out->message, t->result.message, strlen(t->result.message) + 1);
    }
    free(t);
    return KVS_OK;
}

static int core_event_fd(struct core *c, enum direction dir)
{
    pthread_mutex_lock(&c->mu);
    int fd = kvs_notifier_fd(&c->notifier[dir]);
    pthread_mutex_unlock(&c->mu);
    if (fd < 0)
        return kvs_set_error(KVS_ECLOSED, "processor: %s event fd requested after close",
                             direction_name[dir]);
    return fd;
}

static int core_close(struct core *c)
{
    pthread_mutex_lock(&c->close_mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->close_mu);
        return KVS_OK;
    }
    pthread_mutex_lock(&c->mu);
    c->closing = 1;
    pthread_mutex_unlock(&c->mu);

    /* Every accepted task is queued by now; the pool runs them all (each
     * records and signals as usual) and joins its threads. Split helpers
     * are queued under the same lock and rule, so they drain too. */
    int rc = kvs_thread_pool_shutdown(c->pool);
    if (rc != KVS_OK) {
        /* Called from our own worker. Stay open (but refusing submits) so a
         * proper close from another thread can still finish the job. */
        pthread_mutex_unlock(&c->close_mu);
        return kvs_set_error(rc, "processor: close called from a processor thread");
    }
    pthread_mutex_lock(&c->mu);
    kvs_notifier_close(&c->notifier[DIR_SERIALIZE]);
    kvs_notifier_close(&c->notifier[DIR_DESERIALIZE]);
    c->closed = 1;
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_unlock(&c->close_mu);
    return KVS_OK;
}

static void free_task(void *t) { free(t); }

/* Release everything the core holds (it may be half built), serdes
 * included. The caller frees the struct around it. */
static void core_release(struct core *c)
{
    kvs_thread_pool_destroy(c->pool);
    kvs_notifier_close(&c->notifier[DIR_SERIALIZE]);
    kvs_notifier_close(&c->notifier[DIR_DESERIALIZE]);
    /* Results nobody read. */
    kvs_result_map_destroy(&c->done[DIR_SERIALIZE], free_task);
    kvs_result_map_destroy(&c->done[DIR_DESERIALIZE], free_task);
    c->xf->destroy_serde(c);
    pthread_mutex_destroy(&c->close_mu);
    pthread_mutex_destroy(&c->mu);
}

/* Set up a core around a serde pair (already stored in c->ser / c->de).
 * From here the core owns the pair: on failure core_release has been called
 * and only the struct around it is left to free. */
static int core_init(struct core *c, const struct transform *xf, size_t group_size,
                     unsigned max_workers)
{
    c->xf = xf;
    c->group_size = group_size;
    c->nworkers = max_workers;
    atomic_init(&c->split_min_bytes, KVS_SPLIT_DEFAULT_MIN_BYTES);
    atomic_init(&c->split_chunk_bytes, KVS_SPLIT_DEFAULT_CHUNK_BYTES);
    c->notifier[0].fd = c->notifier[1].fd = -1;
    kvs_result_map_init(&c->done[0]);
    kvs_result_map_init(&c->done[1]);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->close_mu, NULL);
    int rc;
    if ((rc = kvs_notifier_init(&c->notifier[DIR_SERIALIZE], "processor")) != KVS_OK ||
        (rc = kvs_notifier_init(&c->notifier[DIR_DESERIALIZE], "processor")) != KVS_OK ||
        (rc = kvs_thread_pool_create(max_workers, "kvs-proc", &c->pool)) != KVS_OK) {
        core_release(c);
        return rc;
    }
    return KVS_OK;
}

static int check_workers(unsigned max_workers)
{
    if (max_workers < 1 || max_workers > KVS_PROCESSOR_MAX_WORKERS)
        return kvs_set_error(KVS_EINVAL, "processor: max_workers %u out of range [1, %u]",
                             max_workers, (unsigned)KVS_PROCESSOR_MAX_WORKERS);
    return KVS_OK;
}

static void core_set_hooks(struct core *c, kvs_completion_hook ser, kvs_completion_hook de)
{
    pthread_mutex_lock(&c->mu);
    c->hook[DIR_SERIALIZE] = ser;
    c->hook[DIR_DESERIALIZE] = de;
    pthread_mutex_unlock(&c->mu);
}

static void core_set_inline(struct core *c, size_t max_bytes)
{
    atomic_store(&c->inline_max_bytes, max_bytes);
}

static void core_set_split(struct core *c, size_t min_bytes, size_t chunk_bytes)
{
    atomic_store(&c->split_min_bytes, min_bytes);
    atomic_store(&c->split_chunk_bytes,
                 chunk_bytes ? chunk_bytes : KVS_SPLIT_DEFAULT_CHUNK_BYTES);
}

/* =====================================================================
 * The single processor (kvs_processor)
 * ================================================================== */

struct async_processor {
    kvs_processor base;
    struct core core;
};

static struct core *ap_core(kvs_processor *p)
{
    return &KVS_CONTAINER_OF(p, struct async_processor, base)->core;
}

static int ap_serialize_event_fd(kvs_processor *p)
{
    return core_event_fd(ap_core(p), DIR_SERIALIZE);
}

static int ap_deserialize_event_fd(kvs_processor *p)
{
    return core_event_fd(ap_core(p), DIR_DESERIALIZE);
}

static int ap_submit_serialize(kvs_processor *p, kvs_memobj *const *src,
                               kvs_memobj *const *dst, size_t n,
                               const kvs_object_key *keys, kvs_task_id *id)
{
    return core_submit(ap_core(p), DIR_SERIALIZE, src, dst, n, keys, id);
}

static int ap_submit_deserialize(kvs_processor *p, kvs_memobj *const *src,
                                 kvs_memobj *const *dst, size_t n,
                                 const kvs_object_key *keys, kvs_task_id *id)
{
    return core_submit(ap_core(p), DIR_DESERIALIZE, src, dst, n, keys, id);
}

static int ap_query_serialize_result(kvs_processor *p, kvs_task_id id,
                                     kvs_task_result *out)
{
    return core_query(ap_core(p), DIR_SERIALIZE, id, out);
}

static int ap_query_deserialize_result(kvs_processor *p, kvs_task_id id,
                                       kvs_task_result *out)
{
    return core_query(ap_core(p), DIR_DESERIALIZE, id, out);
}

static int ap_estimate_serialized_size(kvs_processor *p, const kvs_layout *layout,
                                       size_t *nbytes)
{
    /* The serializer's estimate already includes its margin (upstream E1+:
     * "used directly as the buffer size"); adding one here would double it. */
    return kvs_estimate_serialized_size(ap_core(p)->ser.single, layout, nbytes);
}

static int ap_close(kvs_processor *p) { return core_close(ap_core(p)); }

static void ap_destroy(kvs_processor *p)
{
    struct async_processor *ap = KVS_CONTAINER_OF(p, struct async_processor, base);
    core_release(&ap->core);
    free(ap);
}

static const struct kvs_processor_ops async_ops = {
    .name = "async",
    .serialize_event_fd = ap_serialize_event_fd,
    .deserialize_event_fd = ap_deserialize_event_fd,
    .submit_serialize = ap_submit_serialize,
    .query_serialize_result = ap_query_serialize_result,
    .submit_deserialize = ap_submit_deserialize,
    .query_deserialize_result = ap_query_deserialize_result,
    .estimate_serialized_size = ap_estimate_serialized_size,
    .close = ap_close,
    .destroy = ap_destroy,
};

int kvs_async_processor_create(kvs_serializer *ser, kvs_deserializer *de,
                               unsigned max_workers, kvs_processor **out)
{
    int rc;
    if (ser == NULL || de == NULL || out == NULL) {
        rc = kvs_set_error(KVS_EINVAL, "processor: %s is NULL",
                           ser == NULL ? "serializer" : de == NULL ? "deserializer" : "out");
        goto fail_serde;
    }
    if ((rc = check_workers(max_workers)) != KVS_OK)
        goto fail_serde;
    struct async_processor *ap = calloc(1, sizeof *ap);
    if (ap == NULL) {
        rc = kvs_set_error(KVS_ENOMEM, "processor: out of memory");
        goto fail_serde;
    }
    ap->base.ops = &async_ops;
    ap->core.ser.single = ser;
    ap->core.de.single = de;
    if ((rc = core_init(&ap->core, &single_transform, 1, max_workers)) != KVS_OK) {
        free(ap);
        return rc;
    }
    *out = &ap->base;
    return KVS_OK;

fail_serde:
    kvs_serializer_destroy(ser);
    kvs_deserializer_destroy(de);
    return rc;
}

int kvs_async_processor_set_split(struct kvs_processor *p, size_t min_bytes,
                                  size_t chunk_bytes)
{
    if (p == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: processor is NULL");
    if (p->ops != &async_ops)
        return kvs_set_error(KVS_EINVAL, "processor: %s is not an async processor",
                             p->ops->name ? p->ops->name : "(unnamed)");
    core_set_split(ap_core(p), min_bytes, chunk_bytes);
    return KVS_OK;
}

int kvs_async_processor_set_hooks(kvs_processor *p, kvs_completion_hook ser,
                                  kvs_completion_hook de)
{
    if (p == NULL || p->ops != &async_ops) return 0;
    core_set_hooks(ap_core(p), ser, de);
    return 1;
}

int kvs_async_processor_set_inline(kvs_processor *p, size_t max_bytes)
{
    if (p == NULL || p->ops != &async_ops) return 0;
    core_set_inline(ap_core(p), max_bytes);
    return 1;
}

/* =====================================================================
 * The multi processor (kvs_multi_processor)
 * ================================================================== */

struct async_multi_processor {
    kvs_multi_processor base;
    struct core core;
};

static struct core *amp_core(kvs_multi_processor *p)
{
    return &KVS_CONTAINER_OF(p, struct async_multi_processor, base)->core;
}

static int amp_serialize_event_fd(kvs_multi_processor *p)
{
    return core_event_fd(amp_core(p), DIR_SERIALIZE);
}

static int amp_deserialize_event_fd(kvs_multi_processor *p)
{
    return core_event_fd(amp_core(p), DIR_DESERIALIZE);
}

static int amp_submit_serialize(kvs_multi_processor *p, kvs_memobj *const *src_groups,
                                kvs_memobj *const *dst, size_t n,
                                const kvs_object_key *keys, kvs_task_id *id)
{
    return core_submit(amp_core(p), DIR_SERIALIZE, src_groups, dst, n, keys, id);
}

static int amp_submit_deserialize(kvs_multi_processor *p, kvs_memobj *const *src,
                                  kvs_memobj *const *dst_groups, size_t n,
                                  const kvs_object_key *keys, kvs_task_id *id)
{
    return core_submit(amp_core(p), DIR_DESERIALIZE, src, dst_groups, n, keys, id);
}

static int amp_query_serialize_result(kvs_multi_processor *p, kvs_task_id id,
                                      kvs_task_result *out)
{
    return core_query(amp_core(p), DIR_SERIALIZE, id, out);
}

static int amp_query_deserialize_result(kvs_multi_processor *p, kvs_task_id id,
                                        kvs_task_result *out)
{
    return core_query(amp_core(p), DIR_DESERIALIZE, id, out);
}

static int amp_estimate_serialized_size(kvs_multi_processor *p,
                                        const kvs_layout *const *layouts, size_t n,
                                        size_t *nbytes)
{
    return kvs_multi_estimate_serialized_size(amp_core(p)->ser.multi, layouts, n, nbytes);
}

static int amp_close(kvs_multi_processor *p) { return core_close(amp_core(p)); }

static void amp_destroy(kvs_multi_processor *p)
{
    struct async_multi_processor *amp =
        KVS_CONTAINER_OF(p, struct async_multi_processor, base);
    core_release(&amp->core);
    free(amp);
}

static const struct kvs_multi_processor_ops async_multi_ops = {
    .name = "async-multi",
    .serialize_event_fd = amp_serialize_event_fd,
    .deserialize_event_fd = amp_deserialize_event_fd,
    .submit_serialize = amp_submit_serialize,
    .query_serialize_result = amp_query_serialize_result,
    .submit_deserialize = amp_submit_deserialize,
    .query_deserialize_result = amp_query_deserialize_result,
    .estimate_serialized_size = amp_estimate_serialized_size,
    .close = amp_close,
    .destroy = amp_destroy,
};

int kvs_async_multi_processor_create(kvs_multi_serializer *ser, kvs_multi_deserializer *de,
                                     unsigned max_workers, kvs_multi_processor **out)
{
    int rc;
    if (ser == NULL || de == NULL || out == NULL) {
        rc = kvs_set_error(KVS_EINVAL, "processor: %s is NULL",
                           ser == NULL ? "serializer" : de == NULL ? "deserializer" : "out");
        goto fail_serde;
    }
    if (ser->group_size == 0 || ser->group_size != de->group_size) {
        rc = kvs_set_error(KVS_EINVAL,
                           "processor: serializer group size %zu but deserializer group "
                           "size %zu",
                           ser->group_size, de->group_size);
        goto fail_serde;
    }
    if ((rc = check_workers(max_workers)) != KVS_OK)
        goto fail_serde;
    struct async_multi_processor *amp = calloc(1, sizeof *amp);
    if (amp == NULL) {
        rc = kvs_set_error(KVS_ENOMEM, "processor: out of memory");
        goto fail_serde;
    }
    amp->base.ops = &async_multi_ops;
    amp->base.group_size = ser->group_size;
    amp->core.ser.multi = ser;
    amp->core.de.multi = de;
    if ((rc = core_init(&amp->core, &multi_transform, ser->group_size, max_workers)) !=
        KVS_OK) {
        free(amp);
        return rc;
    }
    *out = &amp->base;
    return KVS_OK;

fail_serde:
    kvs_multi_serializer_destroy(ser);
    kvs_multi_deserializer_destroy(de);
    return rc;
}

int kvs_async_multi_processor_set_split(kvs_multi_processor *p, size_t min_bytes,
                                        size_t chunk_bytes)
{
    if (p == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: processor is NULL");
    if (p->ops != &async_multi_ops)
        return kvs_set_error(KVS_EINVAL, "processor: %s is not an async processor",
                             p->ops->name ? p->ops->name : "(unnamed)");
    core_set_split(amp_core(p), min_bytes, chunk_bytes);
    return KVS_OK;
}

int kvs_async_multi_processor_set_hooks(kvs_multi_processor *p, kvs_completion_hook ser,
                                        kvs_completion_hook de)
{
    if (p == NULL || p->ops != &async_multi_ops) return 0;
    core_set_hooks(amp_core(p), ser, de);
    return 1;
}

int kvs_async_multi_processor_set_inline(kvs_multi_processor *p, size_t max_bytes)
{
    if (p == NULL || p->ops != &async_multi_ops) return 0;
    core_set_inline(amp_core(p), max_bytes);
    return 1;
}

/* =====================================================================
 * Splitting one item across idle workers (kvs_serde_parallel_for)
 * =====================================================================
 *
 * The worker running a task (the owner) cuts [0, n) into `nchunks` pieces
 * and queues up to one helper job per idle worker on the same pool. Pieces
 * are claimed one at a time from an atomic counter by the owner and by
 * every helper that gets to run, so:
 *   - the owner never waits for a piece nobody has started: it claims
 *     pieces until none is left, then waits only for pieces other threads
 *     are running (no deadlock, and no delay when the "idle" worker turns
 *     out to be busy: its helper job finds nothing left and exits);
 *   - a helper that runs late touches only the split's counters, never the
 *     caller's objects. The split state is reference counted (owner + each
 *     queued helper) and freed by the last one out.
 * Helpers are queued under the core lock while not closing (as tasks are),
 * so close's pool drain runs them too; a helper job that runs after its
 * split finished costs one atomic increment.
 */

struct split;

struct split_helper {
    kvs_job job;
    struct split *sp;
};

struct split {
    struct core *core;
    kvs_serde_range_fn fn;
    void *ctx;
    uint64_t n, chunk, nchunks;
    atomic_uint_fast64_t next;  /* next piece to claim */

    pthread_mutex_t mu;         /* guards everything below */
    pthread_cond_t all_done;
    uint64_t finished;          /* pieces run to the end */
    unsigned refs;              /* owner + helpers not yet done */
    int err_rc;                 /* first error by position, KVS_OK if none */
    uint64_t err_begin;
    char err_msg[KVS_ERROR_MSG_MAX];

    struct split_helper helpers[];
};

/* One call of the range function; a failure always leaves a message. */
static int run_range(kvs_serde_range_fn fn, void *ctx, uint64_t begin, uint64_t end)
{
    unsigned long serial = kvs_error_serial();
    int rc = fn(ctx, begin, end);
    if (rc != KVS_OK && kvs_error_serial() == serial)
        kvs_set_error(rc, "serde: items [%llu, %llu) failed: %s", (unsigned long long)begin,
                      (unsigned long long)end, kvs_strerror(rc));
    return rc;
}

/* Claim and run pieces until none is left; count them as finished. */
static void split_run(struct split *sp)
{
    uint64_t ran = 0;
    for (;;) {
        uint64_t k = atomic_fetch_add_explicit(&sp->next, 1, memory_order_relaxed);
        if (k >= sp->nchunks)
            break;
        uint64_t begin = k * sp->chunk;
        uint64_t end = sp->n - begin < sp->chunk ? sp->n : begin + sp->chunk;
        int rc = run_range(sp->fn, sp->ctx, begin, end);
        if (rc != KVS_OK) {
            pthread_mutex_lock(&sp->mu);
            if (sp->err_rc == KVS_OK || begin < sp->err_begin) {
                sp->err_rc = rc;
                sp->err_begin = begin;
                snprintf(sp->err_msg, sizeof sp->err_msg, "%s", kvs_last_error());
            }
            pthread_mutex_unlock(&sp->mu);
        }
        ran++;
    }
    pthread_mutex_lock(&sp->mu);
    sp->finished += ran;
    if (sp->finished == sp->nchunks)
        pthread_cond_broadcast(&sp->all_done);
    pthread_mutex_unlock(&sp->mu);
}

static void split_free(struct split *sp)
{
    pthread_cond_destroy(&sp->all_done);
    pthread_mutex_destroy(&sp->mu);
    free(sp);
}

static void split_release(struct split *sp)
{
    pthread_mutex_lock(&sp->mu);
    unsigned left = --sp->refs;
    pthread_mutex_unlock(&sp->mu);
    if (left == 0)
        split_free(sp);
}

static void run_split_helper(kvs_job *job)
{
    struct split *sp = KVS_CONTAINER_OF(job, struct split_helper, job)->sp;
    struct core *c = sp->core;
    split_run(sp);
    split_release(sp);
    pthread_mutex_lock(&c->mu);
    c->helping--;
    pthread_mutex_unlock(&c->mu);
}

int kvs_serde_parallel_for(uint64_t n, uint64_t nbytes, kvs_serde_range_fn fn, void *ctx)
{
    if (fn == NULL)
        return kvs_set_error(KVS_EINVAL, "serde: parallel_for: NULL function");
    if (n == 0)
        return KVS_OK;
    struct core *c = tl_core;
    if (c == NULL || c->nworkers < 2 ||
        nbytes < atomic_load_explicit(&c->split_min_bytes, memory_order_relaxed))
        return run_range(fn, ctx, 0, n);

    /* Pieces of about chunk_bytes, whole multiples of KVS_SPLIT_ALIGN items. */
    uint64_t per_item = nbytes / n ? nbytes / n : 1;
    uint64_t chunk = atomic_load_explicit(&c->split_chunk_bytes, memory_order_relaxed) /
                     per_item;
    chunk -= chunk % KVS_SPLIT_ALIGN;
    if (chunk < KVS_SPLIT_ALIGN)
        chunk = KVS_SPLIT_ALIGN;
    uint64_t nchunks = n / chunk + (n % chunk != 0);
    if (nchunks < 2)
        return run_range(fn, ctx, 0, n);

    pthread_mutex_lock(&c->mu);
    unsigned busy = c->inflight + c->helping;
    unsigned idle = busy < c->nworkers ? c->nworkers - busy : 0;
    pthread_mutex_unlock(&c->mu);
    uint64_t nhelpers = idle < nchunks - 1 ? idle : nchunks - 1;
    if (nhelpers == 0)
        return run_range(fn, ctx, 0, n);

    struct split *sp = malloc(sizeof *sp + nhelpers * sizeof(struct split_helper));
    if (sp == NULL)
        return run_range(fn, ctx, 0, n); /* splitting is an optimization, never a failure */
    sp->core = c;
    sp->fn = fn;
    sp->ctx = ctx;
    sp->n = n;
    sp->chunk = chunk;
    sp->nchunks = nchunks;
    atomic_init(&sp->next, 0);
    pthread_mutex_init(&sp->mu, NULL);
    pthread_cond_init(&sp->all_done, NULL);
    sp->finished = 0;
    sp->refs = 1 + (unsigned)nhelpers; /* the owner and every helper queued below */
    sp->err_rc = KVS_OK;
    sp->err_begin = 0;
    sp->err_msg[0] = '\0';

    /* Queue the helpers under the core lock, and only while not closing:
     * then the pool cannot have stopped (close sets `closing` under this
     * lock before it shuts the pool down), so no submit can fail. */
    pthread_mutex_lock(&c->mu);
    if (c->closing) {
        sp->refs = 1; /* no helper was queued: nobody else can see sp yet */
    } else {
        for (uint64_t h = 0; h < nhelpers; h++) {
            sp->helpers[h].job.next = NULL;
            sp->helpers[h].job.run = run_split_helper;
            sp->helpers[h].sp = sp;
            (void)kvs_thread_pool_submit(c->pool, &sp->helpers[h].job);
            c->helping++;
        }
    }
    pthread_mutex_unlock(&c->mu);

    /* Take part, as nobody's task: a nested call runs inline. */
    tl_core = NULL;
    split_run(sp);
    tl_core = c;

    pthread_mutex_lock(&sp->mu);
    while (sp->finished < sp->nchunks)
        pthread_cond_wait(&sp->all_done, &sp->mu);
    int rc = sp->err_rc;
    char msg[KVS_ERROR_MSG_MAX];
    if (rc != KVS_OK)
        memcpy(msg, sp->err_msg, sizeof msg);
    pthread_mutex_unlock(&sp->mu);
    split_release(sp);
    if (rc != KVS_OK)
        return kvs_set_error(rc, "%s", msg);
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * Checked calls through the ops table
 * ------------------------------------------------------------------ */

/* Each wrapper clears the thread's error before calling the op, then
 * checked() makes sure a failing implementation left a message that goes
 * with its code (as kvs_serialize does), so the caller never reads a stale
 * or missing one. */
static int checked(kvs_processor *p, const char *op, int rc)
{
    if (rc < 0 && kvs_last_error_code() != rc)
        kvs_set_error(rc, "processor: %s: %s failed: %s", p->ops->name, op,
                      kvs_strerror(rc));
    return rc;
}

static int check_batch(kvs_memobj *const *src, size_t nsrc,
                       kvs_memobj *const *dst, size_t ndst, kvs_task_id *id)
{
    if (id == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: task id pointer is NULL");
    if (nsrc != ndst)
        return kvs_set_error(KVS_EINVAL, "processor: %zu sources but %zu destinations",
                             nsrc, ndst);
    if (nsrc > 0 && src == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: source array is NULL with %zu objects",
                             nsrc);
    if (ndst > 0 && dst == NULL)
        return kvs_set_error(KVS_EINVAL,
                             "processor: destination array is NULL with %zu objects", ndst);
    for (size_t i = 0; i < nsrc; i++) {
        if (src[i] == NULL)
            return kvs_set_error(KVS_EINVAL, "processor: source %zu is NULL", i);
        if (dst[i] == NULL)
            return kvs_set_error(KVS_EINVAL, "processor: destination %zu is NULL", i);
    }
    return KVS_OK;
}

#define REQUIRE_PROCESSOR(p)                                                   \
    do {                                                                       \
        if ((p) == NULL)                                                       \
            return kvs_set_error(KVS_EINVAL, "processor: processor is NULL");  \
    } while (0)

int kvs_processor_serialize_event_fd(kvs_processor *p)
{
    REQUIRE_PROCESSOR(p);
    kvs_clear_error();
    return checked(p, "serialize_event_fd", p->ops->serialize_event_fd(p));
}

int kvs_processor_deserialize_event_fd(kvs_processor *p)
{
    REQUIRE_PROCESSOR(p);
    kvs_clear_error();
    return checked(p, "deserialize_event_fd", p->ops->deserialize_event_fd(p));
}

int kvs_processor_submit_serialize(kvs_processor *p, kvs_memobj *const *src,
                                   size_t nsrc, kvs_memobj *const *dst, size_t ndst,
                                   const kvs_object_key *keys, kvs_task_id *id)
{
    REQUIRE_PROCESSOR(p);
    int rc = check_batch(src, nsrc, dst, ndst, id);
    if (rc != KVS_OK)
        return rc;
    kvs_clear_error();
    return checked(p, "submit_serialize", p->ops->submit_serialize(p, src, dst, nsrc, keys, id));
}

int kvs_processor_submit_deserialize(kvs_processor *p, kvs_memobj *const *src,
                                     size_t nsrc, kvs_memobj *const *dst,
                                     size_t ndst, const kvs_object_key *keys,
                                     kvs_task_id *id)
{
    REQUIRE_PROCESSOR(p);
    int rc = check_batch(src, nsrc, dst, ndst, id);
    if (rc != KVS_OK)
        return rc;
    kvs_clear_error();
    return checked(p, "submit_deserialize",
                   p->ops->submit_deserialize(p, src, dst, nsrc, keys, id));
}

static int checked_query(kvs_processor *p, const char *op, int rc, kvs_task_result *out)
{
    rc = checked(p, op, rc);
    if (rc != KVS_OK)
        return rc;
    if (out->state != KVS_TASK_PENDING && out->state != KVS_TASK_OK &&
        out->state != KVS_TASK_FAILED)
        return kvs_set_error(KVS_EINVAL, "processor: %s: %s returned unknown state %d",
                             p->ops->name, op, (int)out->state);
    return KVS_OK;
}

int kvs_processor_query_serialize_result(kvs_processor *p, kvs_task_id id,
                                         kvs_task_result *out)
{
    REQUIRE_PROCESSOR(p);
    if (out == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: result pointer is NULL");
    kvs_clear_error();
    return checked_query(p, "query_serialize_result",
                         p->ops->query_serialize_result(p, id, out), out);
}

int kvs_processor_query_deserialize_result(kvs_processor *p, kvs_task_id id,
                                           kvs_task_result *out)
{
    REQUIRE_PROCESSOR(p);
    if (out == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: result pointer is NULL");
    kvs_clear_error();
    return checked_query(p, "query_deserialize_result",
                         p->ops->query_deserialize_result(p, id, out), out);
}

int kvs_processor_estimate_serialized_size(kvs_processor *p, const kvs_layout *layout,
                                           size_t *nbytes)
{
    REQUIRE_PROCESSOR(p);
    if (layout == NULL || nbytes == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: %s pointer is NULL",
                             layout == NULL ? "layout" : "size");
    kvs_clear_error();
    return checked(p, "estimate_serialized_size",
                   p->ops->estimate_serialized_size(p, layout, nbytes));
}

int kvs_processor_close(kvs_processor *p)
{
    REQUIRE_PROCESSOR(p);
    kvs_clear_error();
    return checked(p, "close", p->ops->close(p));
}

void kvs_processor_destroy(kvs_processor *p)
{
    if (p == NULL)
        return;
    /* destroy ops may assume a closed processor. If close fails (called
     * from the processor's own thread) nothing can be freed safely. */
    if (p->ops->close(p) != KVS_OK)
        return;
    p->ops->destroy(p);
}

/* ---------------------------------------------------------------------
 * Checked calls through the multi ops table: the same checks and messages
 * as above, with the group side's shape checked too.
 * ------------------------------------------------------------------ */

static int mchecked(kvs_multi_processor *p, const char *op, int rc)
{
    if (rc < 0 && kvs_last_error_code() != rc)
        kvs_set_error(rc, "processor: %s: %s failed: %s", p->ops->name, op,
                      kvs_strerror(rc));
    return rc;
}

#define REQUIRE_MULTI_PROCESSOR(p)                                             \
    do {                                                                       \
        if ((p) == NULL)                                                       \
            return kvs_set_error(KVS_EINVAL, "processor: processor is NULL");  \
    } while (0)

/* One side of a multi batch is n groups of group_size slots (NULL slots
 * allowed), the other n plain objects (none NULL). `groups_are_src` says
 * which. */
static int check_multi_batch(const kvs_multi_processor *p, int groups_are_src,
                             kvs_memobj *const *groups, size_t ngroups,
                             size_t group_size, kvs_memobj *const *objs, size_t nobjs,
                             kvs_task_id *id)
{
    if (id == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: task id pointer is NULL");
    if (ngroups != nobjs)
        return groups_are_src
                   ? kvs_set_error(KVS_EINVAL,
                                   "processor: %zu source groups but %zu destinations",
                                   ngroups, nobjs)
                   : kvs_set_error(KVS_EINVAL,
                                   "processor: %zu sources but %zu destination groups",
                                   nobjs, ngroups);
    int rc = kvs_validate_group_size(group_size, p->group_size, groups_are_src ? "src" : "dst");
    if (rc != KVS_OK)
        return rc;
    if (ngroups > 0 && groups == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: %s group array is NULL with %zu groups",
                             groups_are_src ? "source" : "destination", ngroups);
    if (nobjs > 0 && objs == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: %s array is NULL with %zu objects",
                             groups_are_src ? "destination" : "source", nobjs);
    for (size_t i = 0; i < nobjs; i++)
        if (objs[i] == NULL)
            return kvs_set_error(KVS_EINVAL, "processor: %s %zu is NULL",
                                 groups_are_src ? "destination" : "source", i);
    return KVS_OK;
}

size_t kvs_multi_processor_group_size(const kvs_multi_processor *p)
{
    return p ? p->group_size : 0;
}

int kvs_multi_processor_serialize_event_fd(kvs_multi_processor *p)
{
    REQUIRE_MULTI_PROCESSOR(p);
    kvs_clear_error();
    return mchecked(p, "serialize_event_fd", p->ops->serialize_event_fd(p));
}

int kvs_multi_processor_deserialize_event_fd(kvs_multi_processor *p)
{
    REQUIRE_MULTI_PROCESSOR(p);
    kvs_clear_error();
    return mchecked(p, "deserialize_event_fd", p->ops->deserialize_event_fd(p));
}

int kvs_multi_processor_submit_serialize(kvs_multi_processor *p,
                                         kvs_memobj *const *src_groups, size_t ngroups,
                                         size_t group_size, kvs_memobj *const *dst,
                                         size_t ndst, const kvs_object_key *keys,
                                         kvs_task_id *id)
{
    REQUIRE_MULTI_PROCESSOR(p);
    int rc = check_multi_batch(p, 1, src_groups, ngroups, group_size, dst, ndst, id);
    if (rc != KVS_OK)
        return rc;
    kvs_clear_error();
    return mchecked(p, "submit_serialize",
                    p->ops->submit_serialize(p, src_groups, dst, ngroups, keys, id));
}

int kvs_multi_processor_submit_deserialize(kvs_multi_processor *p, kvs_memobj *const *src,
                                           size_t nsrc, kvs_memobj *const *dst_groups,
                                           size_t ngroups, size_t group_size,
                                           const kvs_object_key *keys, kvs_task_id *id)
{
    REQUIRE_MULTI_PROCESSOR(p);
    int rc = check_multi_batch(p, 0, dst_groups, ngroups, group_size, src, nsrc, id);
    if (rc != KVS_OK)
        return rc;
    kvs_clear_error();
    return mchecked(p, "submit_deserialize",
                    p->ops->submit_deserialize(p, src, dst_groups, nsrc, keys, id));
}

static int mchecked_query(kvs_multi_processor *p, const char *op, int rc,
                          kvs_task_result *out)
{
    rc = mchecked(p, op, rc);
    if (rc != KVS_OK)
        return rc;
    if (out->state != KVS_TASK_PENDING && out->state != KVS_TASK_OK &&
        out->state != KVS_TASK_FAILED)
        return kvs_set_error(KVS_EINVAL, "processor: %s: %s returned unknown state %d",
                             p->ops->name, op, (int)out->state);
    return KVS_OK;
}

int kvs_multi_processor_query_serialize_result(kvs_multi_processor *p, kvs_task_id id,
                                               kvs_task_result *out)
{
    REQUIRE_MULTI_PROCESSOR(p);
    if (out == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: result pointer is NULL");
    kvs_clear_error();
    return mchecked_query(p, "query_serialize_result",
                          p->ops->query_serialize_result(p, id, out), out);
}

int kvs_multi_processor_query_deserialize_result(kvs_multi_processor *p, kvs_task_id id,
                                                 kvs_task_result *out)
{
    REQUIRE_MULTI_PROCESSOR(p);
    if (out == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: result pointer is NULL");
    kvs_clear_error();
    return mchecked_query(p, "query_deserialize_result",
                          p->ops->query_deserialize_result(p, id, out), out);
}

int kvs_multi_processor_estimate_serialized_size(kvs_multi_processor *p,
                                                 const kvs_layout *const *layouts,
                                                 size_t n, size_t *nbytes)
{
    REQUIRE_MULTI_PROCESSOR(p);
    if ((layouts == NULL && n > 0) || nbytes == NULL)
        return kvs_set_error(KVS_EINVAL, "processor: %s pointer is NULL",
                             nbytes == NULL ? "size" : "layout group");
    int rc = kvs_validate_group_size(n, p->group_size, "layout");
    if (rc != KVS_OK)
        return rc;
    kvs_clear_error();
    return mchecked(p, "estimate_serialized_size",
                    p->ops->estimate_serialized_size(p, layouts, n, nbytes));
}

int kvs_multi_processor_close(kvs_multi_processor *p)
{
    REQUIRE_MULTI_PROCESSOR(p);
    kvs_clear_error();
    return mchecked(p, "close", p->ops->close(p));
}

void kvs_multi_processor_destroy(kvs_multi_processor *p)
{
    if (p == NULL)
        return;
    /* As kvs_processor_destroy: nothing can be freed safely if close fails
     * (called from the processor's own thread). */
    if (p->ops->close(p) != KVS_OK)
        return;
    p->ops->destroy(p);
}
