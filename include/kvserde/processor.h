/* kvserde/processor.h - the asynchronous serde interface (upstream
 * serde/base.py SerdeProcessor) and its default implementation (upstream
 * serde/async_processor.py AsyncSerdeProcessor).
 *
 * A processor runs serde transforms off the caller's thread with the same
 * submit -> eventfd -> query shape as an L2 adapter, so one poll loop can
 * drive both:
 *
 *     kvs_task_id id;
 *     kvs_processor_submit_serialize(p, src, n, dst, n, keys, &id);   (keys: n keys or NULL)
 *     struct pollfd pfd = { kvs_processor_serialize_event_fd(p), POLLIN, 0 };
 *     poll(&pfd, 1, -1);
 *     kvs_event_fd_consume(pfd.fd, NULL);      // reset the counter
 *     kvs_task_result r;
 *     kvs_processor_query_serialize_result(p, id, &r);
 *     if (r.state == KVS_TASK_FAILED) puts(r.message);
 *
 * Contracts (upstream's, plus the decisions of DESIGN.md section 3):
 *   - Two event fds, one per direction, always distinct. Each finished task
 *     adds exactly 1 to its direction's counter, success or failure, and only
 *     after its result can be queried: a readable fd means at least that many
 *     results are waiting. Several completions may be folded into one
 *     readable event (the counter says how many); the fds are level
 *     triggered like any eventfd.
 *   - Task ids come from one counter per processor shared by both
 *     directions, starting at 0, so a serialize id and a deserialize id never
 *     collide.
 *   - Query pops: a finished task's result is returned once, then the id is
 *     "pending" again. An id never submitted, already popped, or submitted
 *     in the other direction is "pending"; that is not an error.
 *   - A failed task carries its first error (status code and message), so
 *     no failure is ever swallowed.
 *
 * Thread safety: every function may be called from any thread, concurrently
 * with the others, except kvs_processor_destroy(), which must be the last
 * call. No function may be called from inside a serde transform that this
 * processor is running (close would wait for itself).
 */
#ifndef KVSERDE_PROCESSOR_H
#define KVSERDE_PROCESSOR_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "export.h"
#include "memobj.h"
#include "serde.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A task id (upstream SerdeTaskId). Ids start at 0 and increase by 1 per
 * accepted submit, serialize and deserialize alike. */
typedef uint64_t kvs_task_id;

/* What a query found. The values are part of the ABI. */
typedef enum kvs_task_state {
    KVS_TASK_PENDING = 0, /* in flight, or unknown, or already popped */
    KVS_TASK_OK = 1,      /* finished; every object was transformed */
    KVS_TASK_FAILED = 2,  /* finished; stopped at object failed_index */
} kvs_task_state;

/* The result of one task, as returned (once) by a query.
 *
 * For KVS_TASK_FAILED, `status` is the failing object's status code (a
 * negative KVS_E* value) and `message` its message, prefixed with the
 * direction and the object's position in the batch (0-based), e.g.
 *     "processor: serialize object 3 of 8 failed: fp8: destination too
 *      small: 1024 bytes, need 4096"
 * and `failed_index` is that position (3). Objects before it were
 * transformed (and, for serialize, narrowed: there is no rollback, as
 * upstream); the failing object and every later one were left as they were.
 * For KVS_TASK_OK and KVS_TASK_PENDING, status is KVS_OK, message is "" and
 * failed_index is 0. */
typedef struct kvs_task_result {
    kvs_task_state state;
    int status;
    size_t failed_index;
    char message[KVS_ERROR_MSG_MAX];
} kvs_task_result;

typedef struct kvs_processor kvs_processor;

/* The interface. Callers use the kvs_processor_* functions below, which
 * check arguments and then call these; implementers fill the table, embed a
 * kvs_processor as their first (or any) member, and recover themselves with
 * KVS_CONTAINER_OF. Every op follows the contracts above. */
struct kvs_processor_ops {
    /* Short name used in messages ("async"). */
    const char *name;
    /* The fd (>= 0), or a negative status (KVS_ECLOSED after close). */
    int (*serialize_event_fd)(kvs_processor *self);
    int (*deserialize_event_fd)(kvs_processor *self);
    /* Queue src[i] -> dst[i] for i < n, with key keys[i] (keys NULL: no
     * keys). The kvs_processor_* wrapper has already checked nsrc == ndst
     * == n and that no pointer is NULL. */
    int (*submit_serialize)(kvs_processor *self, kvs_memobj *const *src,
                            kvs_memobj *const *dst, size_t n,
                            const kvs_object_key *keys, kvs_task_id *id);
    int (*query_serialize_result)(kvs_processor *self, kvs_task_id id,
                                  kvs_task_result *out);
    int (*submit_deserialize)(kvs_processor *self, kvs_memobj *const *src,
                              kvs_memobj *const *dst, size_t n,
                              const kvs_object_key *keys, kvs_task_id *id);
    int (*query_deserialize_result)(kvs_processor *self, kvs_task_id id,
                                    kvs_task_result *out);
    int (*estimate_serialized_size)(kvs_processor *self,
                                    const kvs_layout *layout, size_t *nbytes);
    /* Finish every accepted task, then release threads and fds. A second
     * call returns KVS_OK and does nothing. */
    int (*close)(kvs_processor *self);
    /* Free everything. Only called after close() succeeded. */
    void (*destroy)(kvs_processor *self);
};

struct kvs_processor {
    const struct kvs_processor_ops *ops;
};

/* ---------------------------------------------------------------------
 * Using a processor
 * ------------------------------------------------------------------ */

/* The event fd signalled once per finished serialize task (resp. deserialize
 * task). The two are distinct, non-blocking (EFD_NONBLOCK), close-on-exec
 * (EFD_CLOEXEC) eventfds owned by the processor: poll them for POLLIN, drain
 * them with kvs_event_fd_consume(), never close them.
 * Returns the fd (>= 0), or KVS_ECLOSED after close, KVS_EINVAL for NULL. */
KVS_API int kvs_processor_serialize_event_fd(kvs_processor *p);
KVS_API int kvs_processor_deserialize_event_fd(kvs_processor *p);

/* Queue one batch: serialize src[i] into dst[i] for every i < nsrc, in order.
 * Returns at once with the task's id in *id; the work runs on the
 * processor's threads.
 *
 * keys is NULL (no keys: every serialize sees key NULL) or an array of nsrc
 * keys, keys[i] being the key of object i, which its serialize receives
 * (serde.h: a serde may bind or encrypt per key). A caller storing to L2
 * passes the objects' real keys.
 *
 * The arrays (keys included) are copied, so the caller may reuse them when this returns;
 * the objects themselves must stay valid, and must not be touched by the
 * caller, until the task's result has been read (as upstream).
 *
 * Per object, a successful serialize narrows dst[i]'s used size to the bytes
 * written (kvs_memobj_set_used_size), so an L2 adapter stores only those; a
 * failed one changes nothing. A serializer reporting more bytes than dst[i]
 * holds fails the object. The batch stops at the first failing object and
 * the task reports KVS_TASK_FAILED with that object's error.
 *
 * An empty batch (nsrc == ndst == 0; the arrays may then be NULL) gets an id,
 * is recorded as KVS_TASK_OK and signals before this returns.
 *
 * Refused, with nothing queued, no id used and *id untouched:
 *   KVS_EINVAL  p or id NULL; nsrc != ndst ("processor: 2 sources but 3
 *               destinations"); an array NULL while its count is > 0; an
 *               element NULL ("processor: source 1 is NULL")
 *   KVS_ECLOSED after kvs_processor_close()
 *   KVS_ENOMEM  the task could not be allocated */
KVS_API int kvs_processor_submit_serialize(kvs_processor *p,
                                           kvs_memobj *const *src, size_t nsrc,
                                           kvs_memobj *const *dst, size_t ndst,
                                           const kvs_object_key *keys,
                                           kvs_task_id *id);

/* The serialize task's result, popped: the first query after the task
 * finished gets KVS_TASK_OK or KVS_TASK_FAILED, every other query gets
 * KVS_TASK_PENDING (see kvs_task_result). Results of tasks finished before
 * close stay queryable after close, until destroy.
 * Returns KVS_OK with *out filled, or KVS_EINVAL if p or out is NULL. */
KVS_API int kvs_processor_query_serialize_result(kvs_processor *p,
                                                 kvs_task_id id,
                                                 kvs_task_result *out);

/* The same pair for deserialize: src[i] holds serialized bytes (its used
 * size), dst[i] is KV-shaped and is filled. Nothing is narrowed. */
KVS_API int kvs_processor_submit_deserialize(kvs_processor *p,
                                             kvs_memobj *const *src,
                                             size_t nsrc,
                                             kvs_memobj *const *dst,
                                             size_t ndst,
                                             const kvs_object_key *keys,
                                             kvs_task_id *id);
KVS_API int kvs_processor_query_deserialize_result(kvs_processor *p,
                                                   kvs_task_id id,
                                                   kvs_task_result *out);

/* The buffer size to allocate for serializing an object of `layout`: the
 * serializer's own estimate, with no extra factor (it already includes any
 * margin). Works before and after close. */
KVS_API int kvs_processor_estimate_serialized_size(kvs_processor *p,
                                                   const kvs_layout *layout,
                                                   size_t *nbytes);

/* Stop accepting work (later submits fail with KVS_ECLOSED), let every
 * queued and running task finish, record its result and signal its fd, then
 * join the threads and close both fds. Blocks until that is done. A second
 * call (or one racing with the first) returns KVS_OK once the first has
 * finished. Fails with KVS_EINVAL if called from one of the processor's own
 * threads, i.e. from inside a transform (it would wait for itself): submits
 * are refused from then on, and a close from another thread completes it. */
KVS_API int kvs_processor_close(kvs_processor *p);

/* Close (if not yet closed), then free the processor, its unread results
 * and, for kvs_async_processor_create's processors, its serializer and
 * deserializer. NULL is a no-op. */
KVS_API void kvs_processor_destroy(kvs_processor *p);

/* Drain an event fd: read its 8-byte counter into *count (count may be NULL)
 * and reset it to 0. A counter at 0 (EAGAIN) gives *count = 0 and KVS_OK.
 * KVS_EINVAL for fd < 0, KVS_EIO if read(2) fails otherwise. */
KVS_API int kvs_event_fd_consume(int fd, uint64_t *count);

/* ---------------------------------------------------------------------
 * The default implementation (upstream AsyncSerdeProcessor)
 * ------------------------------------------------------------------ */

#define KVS_PROCESSOR_DEFAULT_WORKERS 1
#define KVS_PROCESSOR_MAX_WORKERS 1024

/* A processor that runs `ser` / `de` on a pool of `max_workers` threads
 * (1 is upstream's default) shared by both directions. Transforms run
 * outside the processor's lock, so with several workers several batches
 * transform at once. Objects within one batch run in order on the task's
 * thread, except that a serde using kvs_serde_parallel_for() (fp8 does) may
 * have one large object's elements converted by idle workers too (see
 * kvs_async_processor_set_split() in serde.h); the bytes are the same.
 *
 * Takes ownership of ser and de in every case: they are destroyed with the
 * processor, and at once if creation fails.
 *
 * Refused: KVS_EINVAL if ser, de or out is NULL, or max_workers is outside
 * [1, KVS_PROCESSOR_MAX_WORKERS] ("processor: max_workers 0 out of range
 * [1, 1024]"); KVS_EIO if an eventfd or a thread cannot be created;
 * KVS_ENOMEM. *out is untouched on failure. */
KVS_API int kvs_async_processor_create(kvs_serializer *ser,
                                       kvs_deserializer *de,
                                       unsigned max_workers,
                                       kvs_processor **out);

/* Tune splitting for a processor made by kvs_async_processor_create (or the
 * registry): objects whose transform passes nbytes >= min_bytes to
 * kvs_serde_parallel_for are split (SIZE_MAX: never; 0: whenever there are
 * at least two pieces) into pieces of about chunk_bytes (0: the default).
 * Applies to transforms that start afterwards. KVS_EINVAL for NULL or for a
 * processor of another implementation ("processor: other is not an async
 * processor"). */
KVS_API int kvs_async_processor_set_split(struct kvs_processor *p,
                                          size_t min_bytes, size_t chunk_bytes);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_PROCESSOR_H */
