/* async_processor.c - the default kvs_processor (upstream
 * AsyncSerdeProcessor): any serializer/deserializer pair run on a thread
 * pool, one eventfd per direction, results popped once.
 *
 * Life of a task:
 *   submit   (caller thread) check the arrays, copy them into a new task,
 *            then under the lock: refuse if closing, reserve a result slot,
 *            take the next id, queue the task. Everything that can fail
 *            happens before the id is taken, so a refused submit uses no id
 *            and leaves nothing behind.
 *   run      (worker thread, no lock) transform object by object, stop at
 *            the first failure and keep its code and message.
 *   finish   (worker thread) record the task in its direction's result map
 *            under the lock, then write 1 to the direction's eventfd - in
 *            that order, so a reader woken by the fd always finds the result.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/export.h"
#include "kvserde/processor.h"
#include "kvserde/serde.h"
#include "util/notifier.h"
#include "util/result_map.h"
#include "util/thread_pool.h"

enum direction { DIR_SERIALIZE = 0, DIR_DESERIALIZE = 1 };

static const char *const direction_name[2] = {"serialize", "deserialize"};

struct async_processor;

struct task {
    kvs_job job; /* pool linkage; run() recovers the task from it */
    struct async_processor *proc;
    enum direction dir;
    kvs_task_id id;
    kvs_task_result result;
    size_t n;
    kvs_memobj *objs[]; /* src[0..n) then dst[0..n), copied at submit */
};

struct async_processor {
    kvs_processor base;
    kvs_serializer *ser;
    kvs_deserializer *de;
    kvs_thread_pool *pool;

    pthread_mutex_t mu;                /* guards everything below */
    kvs_task_id next_id;               /* shared by both directions */
    kvs_result_map done[2];            /* finished tasks per direction */
    kvs_notifier notifier[2];          /* fds; -1 once closed */
    int closing;                       /* submits refused */

    pthread_mutex_t close_mu;          /* serializes close() callers */
    int closed;                        /* guarded by close_mu (and mu) */
};

static struct async_processor *ap_of(kvs_processor *p)
{
    return KVS_CONTAINER_OF(p, struct async_processor, base);
}

/* ---------------------------------------------------------------------
 * Worker side
 * ------------------------------------------------------------------ */

/* Transform every object of the task, in order, stopping at the first
 * failure. Runs without the processor lock: the serde is pure and the
 * objects belong to this task until its result has been read. */
static void transform(struct task *t)
{
    struct async_processor *ap = t->proc;
    kvs_memobj *const *src = t->objs;
    kvs_memobj *const *dst = t->objs + t->n;

    for (size_t i = 0; i < t->n; i++) {
        int rc;
        if (t->dir == DIR_SERIALIZE) {
            size_t nwritten = 0;
            rc = kvs_serialize(ap->ser, src[i], dst[i], &nwritten);
            /* Narrow only after success, so an L2 adapter stores just the
             * bytes written; a serializer that claims more than dst holds
             * is broken and fails the object (memobj says why). */
            if (rc == KVS_OK)
                rc = kvs_memobj_set_used_size(dst[i], nwritten);
        } else {
            rc = kvs_deserialize(ap->de, src[i], dst[i]);
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

/* Record the finished task, then signal. Called with mu not held. */
static void finish(struct async_processor *ap, struct task *t)
{
    enum direction dir = t->dir;
    pthread_mutex_lock(&ap->mu);
    /* Cannot fail: the slot was reserved at submit and ids are unique. */
    (void)kvs_result_map_put_reserved(&ap->done[dir], t->id, t);
    pthread_mutex_unlock(&ap->mu);
    /* t may already be popped and freed by a querying thread: only ap from
     * here on. The fds stay open until close() has joined every worker.
     * A failed write could only mean the counter overflowed (2^64 - 2
     * unread signals); the result is recorded regardless. */
    (void)kvs_notifier_notify(&ap->notifier[dir]);
}

static void run_task(kvs_job *job)
{
    struct task *t = KVS_CONTAINER_OF(job, struct task, job);
    transform(t);
    finish(t->proc, t);
}

/* ---------------------------------------------------------------------
 * Submit and query
 * ------------------------------------------------------------------ */

static int submit(struct async_processor *ap, enum direction dir,
                  kvs_memobj *const *src, kvs_memobj *const *dst, size_t n,
                  kvs_task_id *id)
{
    /* Allocate before taking the lock or an id: if this fails, nothing has
     * happened. */
    if (n > (SIZE_MAX - sizeof(struct task)) / (2 * sizeof(kvs_memobj *)))
        return kvs_set_error(KVS_ENOMEM, "processor: batch of %zu objects is too large", n);
    struct task *t = malloc(sizeof *t + 2 * n * sizeof(kvs_memobj *));
    if (t == NULL)
        return kvs_set_error(KVS_ENOMEM, "processor: out of memory for a task of %zu objects", n);
    t->job.next = NULL;
    t->job.run = run_task;
    t->proc = ap;
    t->dir = dir;
    t->result.state = KVS_TASK_PENDING;
    t->result.status = KVS_OK;
    t->result.failed_index = 0;
    t->result.message[0] = '\0';
    t->n = n;
    if (n > 0) {
        memcpy(t->objs, src, n * sizeof *src);
        memcpy(t->objs + n, dst, n * sizeof *dst);
    }

    pthread_mutex_lock(&ap->mu);
    if (ap->closing) {
        pthread_mutex_unlock(&ap->mu);
        free(t);
        return kvs_set_error(KVS_ECLOSED, "processor: submit_%s after close",
                             direction_name[dir]);
    }
    int rc = kvs_result_map_reserve(&ap->done[dir]);
    if (rc != KVS_OK) {
        pthread_mutex_unlock(&ap->mu);
        free(t);
        return kvs_set_error(KVS_ENOMEM, "processor: out of memory recording task results");
    }
    t->id = ap->next_id++;
    *id = t->id;
    if (n == 0) {
        /* Nothing to transform: finish at once, on the caller's thread.
         * Signal under the lock so close() cannot close the fd in between
         * (close takes the lock before it touches the fds). */
        t->result.state = KVS_TASK_OK;
        (void)kvs_result_map_put_reserved(&ap->done[dir], t->id, t);
        (void)kvs_notifier_notify(&ap->notifier[dir]);
        pthread_mutex_unlock(&ap->mu);
        return KVS_OK;
    }
    /* Queue under the lock: close() sets `closing` under the same lock
     * before it shuts the pool down, so this cannot meet a stopped pool. */
    rc = kvs_thread_pool_submit(ap->pool, &t->job);
    pthread_mutex_unlock(&ap->mu);
    return rc;
}

static int query(struct async_processor *ap, enum direction dir, kvs_task_id id,
                 kvs_task_result *out)
{
    pthread_mutex_lock(&ap->mu);
    struct task *t = kvs_result_map_pop(&ap->done[dir], id);
    pthread_mutex_unlock(&ap->mu);

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

/* ---------------------------------------------------------------------
 * Ops
 * ------------------------------------------------------------------ */

static int event_fd(struct async_processor *ap, enum direction dir)
{
    pthread_mutex_lock(&ap->mu);
    int fd = kvs_notifier_fd(&ap->notifier[dir]);
    pthread_mutex_unlock(&ap->mu);
    if (fd < 0)
        return kvs_set_error(KVS_ECLOSED, "processor: %s event fd requested after close",
                             direction_name[dir]);
    return fd;
}

static int ap_serialize_event_fd(kvs_processor *p)
{
    return event_fd(ap_of(p), DIR_SERIALIZE);
}

static int ap_deserialize_event_fd(kvs_processor *p)
{
    return event_fd(ap_of(p), DIR_DESERIALIZE);
}

static int ap_submit_serialize(kvs_processor *p, kvs_memobj *const *src,
                               kvs_memobj *const *dst, size_t n, kvs_task_id *id)
{
    return submit(ap_of(p), DIR_SERIALIZE, src, dst, n, id);
}

static int ap_submit_deserialize(kvs_processor *p, kvs_memobj *const *src,
                                 kvs_memobj *const *dst, size_t n, kvs_task_id *id)
{
    return submit(ap_of(p), DIR_DESERIALIZE, src, dst, n, id);
}

static int ap_query_serialize_result(kvs_processor *p, kvs_task_id id,
                                     kvs_task_result *out)
{
    return query(ap_of(p), DIR_SERIALIZE, id, out);
}

static int ap_query_deserialize_result(kvs_processor *p, kvs_task_id id,
                                       kvs_task_result *out)
{
    return query(ap_of(p), DIR_DESERIALIZE, id, out);
}

static int ap_estimate_serialized_size(kvs_processor *p, const kvs_layout *layout,
                                       size_t *nbytes)
{
    /* The serializer's estimate already includes its margin (upstream E1+:
     * "used directly as the buffer size"); adding one here would double it. */
    return kvs_estimate_serialized_size(ap_of(p)->ser, layout, nbytes);
}

static int ap_close(kvs_processor *p)
{
    struct async_processor *ap = ap_of(p);
    pthread_mutex_lock(&ap->close_mu);
    if (ap->closed) {
        pthread_mutex_unlock(&ap->close_mu);
        return KVS_OK;
    }
    pthread_mutex_lock(&ap->mu);
    ap->closing = 1;
    pthread_mutex_unlock(&ap->mu);

    /* Every accepted task is queued by now; the pool runs them all (each
     * records and signals as usual) and joins its threads. */
    int rc = kvs_thread_pool_shutdown(ap->pool);
    if (rc != KVS_OK) {
        /* Called from our own worker. Stay open (but refusing submits) so a
         * proper close from another thread can still finish the job. */
        pthread_mutex_unlock(&ap->close_mu);
        return kvs_set_error(rc, "processor: close called from a processor thread");
    }
    pthread_mutex_lock(&ap->mu);
    kvs_notifier_close(&ap->notifier[DIR_SERIALIZE]);
    kvs_notifier_close(&ap->notifier[DIR_DESERIALIZE]);
    ap->closed = 1;
    pthread_mutex_unlock(&ap->mu);
    pthread_mutex_unlock(&ap->close_mu);
    return KVS_OK;
}

static void free_task(void *t) { free(t); }

static void ap_destroy(kvs_processor *p)
{
    struct async_processor *ap = ap_of(p);
    kvs_thread_pool_destroy(ap->pool);
    kvs_notifier_close(&ap->notifier[DIR_SERIALIZE]);
    kvs_notifier_close(&ap->notifier[DIR_DESERIALIZE]);
    /* Results nobody read. */
    kvs_result_map_destroy(&ap->done[DIR_SERIALIZE], free_task);
    kvs_result_map_destroy(&ap->done[DIR_DESERIALIZE], free_task);
    kvs_serializer_destroy(ap->ser);
    kvs_deserializer_destroy(ap->de);
    pthread_mutex_destroy(&ap->close_mu);
    pthread_mutex_destroy(&ap->mu);
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
    if (max_workers < 1 || max_workers > KVS_PROCESSOR_MAX_WORKERS) {
        rc = kvs_set_error(KVS_EINVAL, "processor: max_workers %u out of range [1, %u]",
                           max_workers, (unsigned)KVS_PROCESSOR_MAX_WORKERS);
        goto fail_serde;
    }
    struct async_processor *ap = calloc(1, sizeof *ap);
    if (ap == NULL) {
        rc = kvs_set_error(KVS_ENOMEM, "processor: out of memory");
        goto fail_serde;
    }
    ap->base.ops = &async_ops;
    ap->ser = ser;
    ap->de = de;
    ap->notifier[0].fd = ap->notifier[1].fd = -1;
    kvs_result_map_init(&ap->done[0]);
    kvs_result_map_init(&ap->done[1]);
    pthread_mutex_init(&ap->mu, NULL);
    pthread_mutex_init(&ap->close_mu, NULL);

    /* From here ap owns ser and de: ap_destroy releases whatever exists. */
    if ((rc = kvs_notifier_init(&ap->notifier[DIR_SERIALIZE], "processor")) != KVS_OK ||
        (rc = kvs_notifier_init(&ap->notifier[DIR_DESERIALIZE], "processor")) != KVS_OK ||
        (rc = kvs_thread_pool_create(max_workers, "kvs-proc", &ap->pool)) != KVS_OK) {
        ap_destroy(&ap->base);
        return rc;
    }
    *out = &ap->base;
    return KVS_OK;

fail_serde:
    kvs_serializer_destroy(ser);
    kvs_deserializer_destroy(de);
    return rc;
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
                                   kvs_task_id *id)
{
    REQUIRE_PROCESSOR(p);
    int rc = check_batch(src, nsrc, dst, ndst, id);
    if (rc != KVS_OK)
        return rc;
    kvs_clear_error();
    return checked(p, "submit_serialize", p->ops->submit_serialize(p, src, dst, nsrc, id));
}

int kvs_processor_submit_deserialize(kvs_processor *p, kvs_memobj *const *src,
                                     size_t nsrc, kvs_memobj *const *dst,
                                     size_t ndst, kvs_task_id *id)
{
    REQUIRE_PROCESSOR(p);
    int rc = check_batch(src, nsrc, dst, ndst, id);
    if (rc != KVS_OK)
        return rc;
    kvs_clear_error();
    return checked(p, "submit_deserialize",
                   p->ops->submit_deserialize(p, src, dst, nsrc, id));
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
