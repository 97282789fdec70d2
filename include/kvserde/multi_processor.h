/* kvserde/multi_processor.h - the asynchronous interface for multi-output
 * serdes (multi.h), the tuple-aware counterpart of processor.h, and its
 * default implementation.
 *
 * Upstream stops at the sync multi interfaces and defers "a tuple-aware
 * AsyncSerdeProcessor analog" to a follow-up; this is that follow-up. A
 * multi processor keeps every contract of processor.h (read it first):
 *
 *   - two distinct eventfds, one per direction, each finished task adding
 *     exactly 1 to its direction's counter, after its result is recorded;
 *   - task ids from one counter per processor shared by both directions,
 *     from 0; a refused submit takes no id;
 *   - query pops (the result once, then "pending"; unknown ids, ids of the
 *     other direction and popped ids are "pending");
 *   - a failed task carries its first error: status, message and the
 *     position of the failing batch item (kvs_task_result);
 *   - an empty batch gets an id, succeeds and signals before submit returns;
 *   - submit after close fails with KVS_ECLOSED, close twice is a no-op,
 *     close lets queued and running tasks finish and signal first;
 *   - a successful serialize narrows the blob's used size to the bytes
 *     written.
 *
 * What changes is the shape of a batch item: one side of each item is a
 * *group* (multi.h: a fixed-length array of optional objects, NULL = absent
 * slot). A batch of `n` groups is passed as ONE flat array of n x group_size
 * pointers, row-major: group i is groups[i * group_size .. (i+1) * group_size).
 * C arrays carry no length, so the caller also states the group length it
 * built the array with; a length that is not the processor's group_size is
 * refused at submit (kvs_validate_group_size's message, naming the role):
 *
 *     // two K/V pairs -> two blobs, kv_split (group_size 2)
 *     kvs_memobj *groups[4] = { k0, v0,  k1, v1 };
 *     kvs_memobj *blobs[2]  = { b0, b1 };
 *     kvs_task_id id;
 *     kvs_multi_processor_submit_serialize(p, groups, 2, 2, blobs, 2, keys, &id);
 *
 *     // V only back from blob 0: K's slot absent, so K is not touched
 *     kvs_memobj *out[2] = { NULL, v0_back };
 *     kvs_multi_processor_submit_deserialize(p, blobs, 1, out, 1, 2, keys, &id);
 *
 * A NULL slot is passed through to the serde, which decides (kv_split
 * refuses a missing required slot, and never touches an absent destination
 * slot). The blobs (serialize destinations, deserialize sources) are plain
 * objects and must not be NULL. In messages and in kvs_task_result, "object
 * i" is batch item i: group i and blob i.
 *
 * The single and the multi processor are one implementation (the task,
 * thread pool, result map, notifiers and close logic of async_processor.c);
 * only the per-item transform differs.
 *
 * Thread safety: as processor.h.
 */
#ifndef KVSERDE_MULTI_PROCESSOR_H
#define KVSERDE_MULTI_PROCESSOR_H

#include <stddef.h>

#include "export.h"
#include "memobj.h"
#include "multi.h"
#include "processor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_multi_processor kvs_multi_processor;

/* The interface. Callers use the kvs_multi_processor_* functions below,
 * which check arguments (counts, NULLs, the group length) and then call
 * these with `n` batch items of group_size slots each on the group side;
 * implementers fill the table, embed a kvs_multi_processor, set group_size
 * and recover themselves with KVS_CONTAINER_OF. */
struct kvs_multi_processor_ops {
    /* Short name used in messages ("async-multi"). */
    const char *name;
    /* The fd (>= 0), or a negative status (KVS_ECLOSED after close). */
    int (*serialize_event_fd)(kvs_multi_processor *self);
    int (*deserialize_event_fd)(kvs_multi_processor *self);
    /* Queue src_groups[i * group_size ..] -> dst[i] for i < n; keys: n keys
     * or NULL (copied before this returns). */
    int (*submit_serialize)(kvs_multi_processor *self,
                            kvs_memobj *const *src_groups,
                            kvs_memobj *const *dst, size_t n,
                            const kvs_object_key *keys, kvs_task_id *id);
    int (*query_serialize_result)(kvs_multi_processor *self, kvs_task_id id,
                                  kvs_task_result *out);
    /* Queue src[i] -> dst_groups[i * group_size ..] for i < n. */
    int (*submit_deserialize)(kvs_multi_processor *self, kvs_memobj *const *src,
                              kvs_memobj *const *dst_groups, size_t n,
                              const kvs_object_key *keys, kvs_task_id *id);
    int (*query_deserialize_result)(kvs_multi_processor *self, kvs_task_id id,
                                    kvs_task_result *out);
    /* The blob size to allocate for a group of these layouts (n ==
     * group_size, NULL where the serialize will see an absent slot). */
    int (*estimate_serialized_size)(kvs_multi_processor *self,
                                    const kvs_layout *const *layouts, size_t n,
                                    size_t *nbytes);
    /* As kvs_processor_ops.close / destroy. */
    int (*close)(kvs_multi_processor *self);
    void (*destroy)(kvs_multi_processor *self);
};

struct kvs_multi_processor {
    const struct kvs_multi_processor_ops *ops;
    /* Slots per group (>= 1), fixed at creation (the serde's group_size). */
    size_t group_size;
};

/* ---------------------------------------------------------------------
 * Using a multi processor
 * ------------------------------------------------------------------ */

/* The fixed group length (0 for NULL). */
KVS_API size_t kvs_multi_processor_group_size(const kvs_multi_processor *p);

/* As kvs_processor_serialize_event_fd / _deserialize_event_fd. */
KVS_API int kvs_multi_processor_serialize_event_fd(kvs_multi_processor *p);
KVS_API int kvs_multi_processor_deserialize_event_fd(kvs_multi_processor *p);

/* Queue one batch: serialize group i (src_groups[i * group_size ..
 * (i+1) * group_size), NULL = absent slot) into dst[i], for every i <
 * ngroups, in order. Returns at once with the task's id in *id.
 *
 * The pointer arrays are copied; the objects must stay valid and untouched
 * until the result has been read. Per item, a successful serialize narrows
 * dst[i]'s used size to the bytes written; a failed one changes nothing;
 * the batch stops at the first failing item (KVS_TASK_FAILED, its index,
 * "processor: serialize object 1 of 2 failed: kv_split: ...").
 *
 * An empty batch (ngroups == ndst == 0; the arrays may then be NULL) is
 * recorded as KVS_TASK_OK and signals before this returns.
 *
 * Refused, with nothing queued, no id used and *id untouched:
 *   KVS_EINVAL  p or id NULL; ngroups != ndst ("processor: 2 source groups
 *               but 3 destinations"); group_size != the processor's ("multi:
 *               src group length 1 does not match expected 2", also for an
 *               empty batch); an array NULL while its count is > 0; a
 *               destination NULL ("processor: destination 1 is NULL")
 *   KVS_ECLOSED after close
 *   KVS_ENOMEM  the task could not be allocated */
/* keys: NULL, or one key per item (keys[i] is passed to item i's
 * serialize), copied before this returns, as for kvs_processor_submit_*. */
KVS_API int kvs_multi_processor_submit_serialize(kvs_multi_processor *p,
                                                 kvs_memobj *const *src_groups,
                                                 size_t ngroups, size_t group_size,
                                                 kvs_memobj *const *dst,
                                                 size_t ndst,
                                                 const kvs_object_key *keys,
                                                 kvs_task_id *id);

/* Deserialize blob src[i] (its used size) into group i (dst_groups[i *
 * group_size ..], NULL = leave that slot alone), for every i < nsrc. Nothing
 * is narrowed. Refused as the serialize submit, with the roles swapped:
 * "processor: 2 sources but 3 destination groups", "multi: dst group length
 * 3 does not match expected 2", "processor: source 0 is NULL". */
KVS_API int kvs_multi_processor_submit_deserialize(kvs_multi_processor *p,
                                                   kvs_memobj *const *src,
                                                   size_t nsrc,
                                                   kvs_memobj *const *dst_groups,
                                                   size_t ngroups,
                                                   size_t group_size,
                                                   const kvs_object_key *keys,
                                                   kvs_task_id *id);

/* The task's result, popped (as kvs_processor_query_*_result). */
KVS_API int kvs_multi_processor_query_serialize_result(kvs_multi_processor *p,
                                                       kvs_task_id id,
                                                       kvs_task_result *out);
KVS_API int kvs_multi_processor_query_deserialize_result(kvs_multi_processor *p,
                                                         kvs_task_id id,
                                                         kvs_task_result *out);

/* The blob size to allocate for serializing a group of these layouts: the
 * multi serializer's own estimate. A layout group of another length is
 * refused ("multi: layout group length 1 does not match expected 2").
 * Works before and after close. */
KVS_API int kvs_multi_processor_estimate_serialized_size(kvs_multi_processor *p,
                                                         const kvs_layout *const *layouts,
                                                         size_t n, size_t *nbytes);

/* As kvs_processor_close / kvs_processor_destroy. */
KVS_API int kvs_multi_processor_close(kvs_multi_processor *p);
KVS_API void kvs_multi_processor_destroy(kvs_multi_processor *p);

/* ---------------------------------------------------------------------
 * The default implementation
 * ------------------------------------------------------------------ */

/* A multi processor that runs `ser` / `de` on a pool of `max_workers`
 * threads shared by both directions: kvs_async_processor_create's machinery
 * with a group-shaped transform. Large objects may be split across idle
 * workers (kvs_serde_parallel_for, serde.h) exactly as there.
 *
 * Takes ownership of ser and de in every case (destroyed with the processor,
 * or at once if creation fails). Refused: KVS_EINVAL if ser, de or out is
 * NULL, if the two halves disagree on the group size ("processor:
 * serializer group size 2 but deserializer group size 1"), or max_workers is
 * outside [1, KVS_PROCESSOR_MAX_WORKERS]; KVS_EIO (no eventfd or thread);
 * KVS_ENOMEM. *out is untouched on failure. */
KVS_API int kvs_async_multi_processor_create(kvs_multi_serializer *ser,
                                             kvs_multi_deserializer *de,
                                             unsigned max_workers,
                                             kvs_multi_processor **out);

/* As kvs_async_processor_set_split (serde.h), for a multi processor made
 * by kvs_async_multi_processor_create. */
KVS_API int kvs_async_multi_processor_set_split(kvs_multi_processor *p,
                                                size_t min_bytes, size_t chunk_bytes);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_MULTI_PROCESSOR_H */
