/* kvserde/l2.h - L2 storage adapters (upstream l2_adapters/base.py), the
 * adapter registry, and the serde wrapper (upstream serde_wrapper.py).
 *
 * An L2 adapter stores KV objects under object keys somewhere slower and
 * bigger than memory (a directory, Redis, ...). Like the serde processor it
 * is asynchronous: submit a batch, get a task id back at once, poll the
 * direction's event fd, query the result. The I/O runs on the adapter's own
 * threads, never the caller's.
 *
 * Contracts every adapter keeps (callers rely on them):
 *   - Three event fds: store, lookup-and-lock, load. Distinct from each
 *     other and from every other adapter's, non-blocking, close-on-exec
 *     eventfds owned by the adapter. Each finished task adds exactly 1 to
 *     its direction's counter, after its result can be read. Drain them with
 *     kvs_event_fd_consume() (processor.h).
 *   - Task ids: one counter per adapter shared by the three directions,
 *     starting at 0 (the serde wrapper passes lookups through: see below).
 *   - Results are popped: store results by kvs_l2_pop_completed_stores()
 *     (all finished stores at once), lookup and load results by a query
 *     that answers once per task; an unknown or already-read id is pending.
 *   - Store: objects[i]'s first used_size bytes (kvs_memobj_size) are
 *     stored under keys[i], replacing what was there; readers never see a
 *     partly written object. The result is per task: ok with the total
 *     bytes written, or failed with the first error.
 *   - Lookup-and-lock: bit i set if keys[i] is stored; a found key is also
 *     locked (a count per key: each lookup that finds it adds one), so it is
 *     not deleted or evicted until as many unlocks have come.
 *   - Load: for each key, the stored bytes are copied into objects[i]
 *     (whose capacity must hold them) and objects[i]'s used size is set to
 *     the stored size; bit i set on success. A missing key, or a stored
 *     object that is unreadable, truncated or larger than objects[i]'s
 *     capacity, clears only that key's bit; the object's bytes are then
 *     unspecified. The load's first error is kept with the result.
 *     The size is checked (the raw path, with no serde): an object of
 *     format KVS_FMT_BINARY or KVS_FMT_BINARY_BUFFER is a byte buffer and
 *     takes any stored size its capacity holds; any other object is
 *     KV-shaped, and a stored object that is not exactly its layout's byte
 *     size (stored from another layout: more tokens or fewer) clears only
 *     that key's bit with KVS_ECORRUPT ("memory: load of key 1: stored
 *     object is 262144 bytes, destination layout needs 196608"), before
 *     any byte of objects[i] is written.
 *   - The caller's key and object arrays are copied at submit; the objects
 *     must stay valid and untouched until the task's result has been read.
 *
 * Thread safety: every function may be called from any thread concurrently,
 * except kvs_l2_destroy(), which must be the last call.
 */
#ifndef KVSERDE_L2_H
#define KVSERDE_L2_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "export.h"
#include "memobj.h"
#include "multi_processor.h"
#include "processor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef uint64_t kvs_l2_task_id;

/* One finished store task. */
typedef struct kvs_l2_store_result {
    kvs_l2_task_id id;
    kvs_task_state state;           /* KVS_TASK_OK or KVS_TASK_FAILED */
    uint64_t bytes_written;         /* total bytes stored (0 if failed) */
    int status;                     /* first error (KVS_OK if ok) */
    char message[KVS_ERROR_MSG_MAX];
} kvs_l2_store_result;

/* The result of a lookup-and-lock or a load task: one byte per key of the
 * task, 1 = hit (found and locked / loaded), 0 = miss. `hits` is owned by
 * the result: free it with kvs_l2_bitmap_release(). For a pending task,
 * state is KVS_TASK_PENDING, nkeys 0 and hits NULL. state is KVS_TASK_OK
 * when the task ran, whatever its hits; status/message hold the task's
 * first error (a failed key's reason) or KVS_OK / "". */
typedef struct kvs_l2_bitmap {
    kvs_task_state state;
    size_t nkeys;
    uint8_t *hits;
    size_t nhits;                   /* number of 1 bytes in hits */
    int status;
    char message[KVS_ERROR_MSG_MAX];
} kvs_l2_bitmap;

/* Free the hits array of a bitmap result and zero hits, nkeys and nhits
 * (state, status and message stay readable). NULL is a no-op. */
KVS_API void kvs_l2_bitmap_release(kvs_l2_bitmap *b);

/* Bytes stored and the capacity (0 = unbounded / unknown). */
typedef struct kvs_l2_usage {
    uint64_t bytes_used;
    uint64_t capacity;
} kvs_l2_usage;

typedef struct kvs_l2_adapter kvs_l2_adapter;

/* Called by kvs_l2_list_keys() once per stored key. Return 0 to go on, or
 * any other value to stop: kvs_l2_list_keys() then returns that value. */
typedef int (*kvs_l2_key_fn)(void *ctx, const kvs_object_key *key);

/* The interface. Callers use the kvs_l2_* functions below, which check the
 * arguments (non-NULL arrays and elements, valid keys) before calling these;
 * implementers fill the table and embed a kvs_l2_adapter. */
struct kvs_l2_adapter_ops {
    const char *name; /* the adapter type: "fs", "memory", "serde" ... */
    int (*store_event_fd)(kvs_l2_adapter *self);
    int (*lookup_event_fd)(kvs_l2_adapter *self);
    int (*load_event_fd)(kvs_l2_adapter *self);
    int (*submit_store)(kvs_l2_adapter *self, const kvs_object_key *keys,
                        kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id);
    int (*pop_completed_stores)(kvs_l2_adapter *self, kvs_l2_store_result *out,
                                size_t cap, size_t *count);
    int (*submit_lookup_and_lock)(kvs_l2_adapter *self, const kvs_object_key *keys,
                                  size_t n, kvs_l2_task_id *id);
    int (*query_lookup_and_lock)(kvs_l2_adapter *self, kvs_l2_task_id id,
                                 kvs_l2_bitmap *out);
    int (*unlock)(kvs_l2_adapter *self, const kvs_object_key *keys, size_t n);
    int (*submit_load)(kvs_l2_adapter *self, const kvs_object_key *keys,
                       kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id);
    int (*query_load)(kvs_l2_adapter *self, kvs_l2_task_id id, kvs_l2_bitmap *out);
    int (*delete_keys)(kvs_l2_adapter *self, const kvs_object_key *keys, size_t n,
                       uint8_t *deleted);
    int (*object_sizes)(kvs_l2_adapter *self, const kvs_object_key *keys, size_t n,
                        int64_t *sizes);
    int (*usage)(kvs_l2_adapter *self, kvs_l2_usage *out);
    int (*status)(kvs_l2_adapter *self, json_t **out);
    int (*close)(kvs_l2_adapter *self);
    void (*destroy)(kvs_l2_adapter *self);
    /* Added last, so tables written for older versions keep their layout;
     * NULL is "cannot list" (kvs_l2_list_keys() refuses it). */
    int (*list_keys)(kvs_l2_adapter *self, kvs_l2_key_fn fn, void *ctx);
};

struct kvs_l2_adapter {
    const struct kvs_l2_adapter_ops *ops;
};

/* ---------------------------------------------------------------------
 * Using an adapter
 * ------------------------------------------------------------------ */

/* The three event fds (>= 0), or KVS_ECLOSED after close. */
KVS_API int kvs_l2_store_event_fd(kvs_l2_adapter *a);
KVS_API int kvs_l2_lookup_event_fd(kvs_l2_adapter *a);
KVS_API int kvs_l2_load_event_fd(kvs_l2_adapter *a);

/* Queue a store of objects[i] under keys[i], i < n. n == 0 is a task that
 * succeeds at once (0 bytes) and signals. Refused with nothing queued:
 * KVS_EINVAL (NULL array with n > 0, NULL object, invalid key: "l2: key 2:
 * ..."), KVS_ECLOSED after close, KVS_ENOMEM. */
KVS_API int kvs_l2_submit_store(kvs_l2_adapter *a, const kvs_object_key *keys,
                                kvs_memobj *const *objects, size_t n,
                                kvs_l2_task_id *id);

/* Pop up to `cap` finished store tasks into out[], oldest first; *count says
 * how many. Tasks beyond cap stay for the next call. */
KVS_API int kvs_l2_pop_completed_stores(kvs_l2_adapter *a, kvs_l2_store_result *out,
                                        size_t cap, size_t *count);

/* Queue a lookup-and-lock of keys[0..n). */
KVS_API int kvs_l2_submit_lookup_and_lock(kvs_l2_adapter *a, const kvs_object_key *keys,
                                          size_t n, kvs_l2_task_id *id);
/* Its result, once (see kvs_l2_bitmap). */
KVS_API int kvs_l2_query_lookup_and_lock(kvs_l2_adapter *a, kvs_l2_task_id id,
                                         kvs_l2_bitmap *out);

/* Release one lock on each key (a key not locked is ignored). No task id:
 * it always takes effect (upstream: "the caller will never retry"). */
KVS_API int kvs_l2_unlock(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n);

/* Queue a load of keys[i] into objects[i]. */
KVS_API int kvs_l2_submit_load(kvs_l2_adapter *a, const kvs_object_key *keys,
                               kvs_memobj *const *objects, size_t n,
                               kvs_l2_task_id *id);
/* Its per-key result, once. */
KVS_API int kvs_l2_query_load(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out);

/* The tuple-aware submits, for an adapter wrapped with a multi-output serde
 * (kvs_serde_wrapper_create_multi, or a spec whose "serde" is multi-output
 * such as {"type": "kv_split"}). groups is ONE flat array of n x group_size
 * pointers, row-major as for the multi processor (multi_processor.h): group
 * i is groups[i * group_size .. (i+1) * group_size), NULL = absent slot.
 * Key i is stored as / loaded from one blob that holds group i.
 *
 *   store  each group is serialized into one blob, stored under keys[i].
 *          An absent slot is not supplied (kv_split v_only: {NULL, V}).
 *   load   blob i is deserialized into group i's present slots; an absent
 *          slot is never touched (the split tier: K stays in L1 and its
 *          slot is NULL, only V is filled). Hits and errors per key, as
 *          kvs_l2_submit_load.
 *
 * Everything else is the wrapper's single-object contract (l2.h, serde
 * wrapper): one layout per slot and one absence pattern per batch, temps
 * from the same bounded pool all or nothing, only the bytes each serialize
 * wrote are stored, per-key load failures, close semantics. A group the
 * serde refuses (a required slot NULL, a slot its mode forbids) is refused
 * at submit with nothing queued and no id taken.
 *
 * Refused with KVS_EINVAL: NULL groups with n > 0, group_size 0, invalid
 * keys (as kvs_l2_submit_store); an adapter that is not a serde wrapper
 * ("l2: adapter 'fs' takes whole objects, not groups: groups need an
 * adapter whose "serde" is multi-output"; the ops table is unchanged, so
 * adapters built against older headers keep working); a wrapper around a single-output serde
 * ("serde wrapper: serde 'fp8' is single-output (one tensor per blob);
 * groups need a multi-output serde such as kv_split"); a group_size that is
 * not the serde's ("serde wrapper: groups of 3 slots, but serde 'kv_split'
 * takes groups of 2"). KVS_ECLOSED after close. */
KVS_API int kvs_l2_submit_store_groups(kvs_l2_adapter *a, const kvs_object_key *keys,
                                       kvs_memobj *const *groups, size_t n,
                                       size_t group_size, kvs_l2_task_id *id);
KVS_API int kvs_l2_submit_load_groups(kvs_l2_adapter *a, const kvs_object_key *keys,
                                      kvs_memobj *const *groups, size_t n,
                                      size_t group_size, kvs_l2_task_id *id);

/* Delete keys now (synchronously). deleted (may be NULL) gets 1 for each key
 * removed, 0 for a key absent or locked (a locked key is kept). */
KVS_API int kvs_l2_delete(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                          uint8_t *deleted);

/* Stored size in bytes of each key, -1 if absent (advisory: may change). */
KVS_API int kvs_l2_object_sizes(kvs_l2_adapter *a, const kvs_object_key *keys,
                                size_t n, int64_t *sizes);

/* Enumerate the stored keys (upstream list_l2_keys): fn(ctx, key) once per
 * key, on the caller's thread, with a key valid only during the call.
 *   - Every key stored before the call (its store task finished) and not
 *     deleted before it is reported exactly once; keys stored or deleted
 *     while the call runs may or may not be. The order is unspecified.
 *   - fn may call back into the adapter (object sizes, loads, delete, even
 *     close: the listing then ends early or goes on, as the adapter can):
 *     no adapter lock is held while fn runs.
 *   - fn returning non-zero stops the listing, and that value is returned;
 *     otherwise KVS_OK once every key has been reported.
 *   - Refused: fn NULL (KVS_EINVAL), a closed adapter (KVS_ECLOSED), an
 *     adapter that cannot list (KVS_EUNSUPPORTED "<name>: listing keys is
 *     not supported"); an I/O failure part way (KVS_EIO) returns after the
 *     keys reported so far.
 * Per adapter: fs walks the store's directories as its open does (files
 * whose path is not a key path are skipped); memory copies each bucket's
 * keys out under its lock; redis pages through SCAN MATCH <key_prefix>*
 * COUNT 1000 on the server or on every master of the cluster (one page in
 * memory at a time, plus the names reported so far, since SCAN may return
 * a name twice), skipping names that are not prefix + kvs_fs_key_path() of
 * a valid key; the serde wrapper lists its inner adapter (the keys of the
 * serialized objects, which are the caller's keys).
 * Why a callback and not a cursor: a Redis Cluster listing is one SCAN
 * cursor per master, and an fs one a stack of open directories; the
 * callback keeps that state inside the call, so nothing has to be freed
 * when a caller stops early, and a caller never holds a cursor that a
 * resharding or a close invalidates. */
KVS_API int kvs_l2_list_keys(kvs_l2_adapter *a, kvs_l2_key_fn fn, void *ctx);

/* Bytes stored and capacity. */
KVS_API int kvs_l2_get_usage(kvs_l2_adapter *a, kvs_l2_usage *out);

/* A JSON object describing the adapter's state; it always holds "type" and
 * "is_healthy" (upstream report_status). The caller json_decref()s it. */
KVS_API int kvs_l2_status(kvs_l2_adapter *a, json_t **out);

/* Finish or fail every task in flight (each signals), release threads and
 * fds. Idempotent. Later submits fail with KVS_ECLOSED; unlock, usage and
 * status keep working; delete and object sizes may be refused with
 * KVS_ECLOSED (the fs adapter releases its directory at close). */
KVS_API int kvs_l2_close(kvs_l2_adapter *a);

/* Close if needed, then free. NULL is a no-op. */
KVS_API void kvs_l2_destroy(kvs_l2_adapter *a);

/* ---------------------------------------------------------------------
 * Adapter registry: create adapters from JSON specs
 * ------------------------------------------------------------------ */

/* A factory: build an adapter from `spec` (the JSON object without "type",
 * "serde" and "serde_pool_bytes"). On failure return a KVS_E* code with a
 * message. */
typedef int (*kvs_l2_factory_fn)(const json_t *spec, void *userdata,
                                 kvs_l2_adapter **out);

/* Register an adapter type; a name already registered is refused
 * (KVS_EEXIST: "L2 adapter type already registered: 'fs'"). Built-ins
 * ("fs", "memory", "redis") are registered before first use. */
KVS_API int kvs_l2_register(const char *name, kvs_l2_factory_fn factory,
                            void *userdata);

/* The registered names, in registration order (as kvs_serde_types). */
KVS_API size_t kvs_l2_types(const char **names, size_t cap);

/* Create an adapter from a spec such as
 *     {"type": "fs", "path": "/var/cache/kv", "serde": {"type": "fp8"}}
 * A present "serde" wraps the adapter in the serde wrapper around a
 * processor created from that serde config: a single-output type
 * (kvs_serde_create_json) gives the single shape, a multi-output type such
 * as "kv_split" (kvs_multi_serde_create_json) the multi shape
 * (kvs_serde_wrapper_create_multi), and the wrapper's messages name the
 * type ("serde 'kv_split'"); an
 * optional "serde_pool_bytes" (integer >= 0) sets the wrapper's
 * temp_pool_bytes. The serde is created first, so a bad serde config is
 * refused before the adapter touches any storage. Refused (KVS_EINVAL):
 * malformed JSON, not an object, missing / non-string type ("l2 config:
 * missing 'type' field"), "unknown L2 adapter type 'x'", "'serde' must be a
 * dict, got string", "'serde' dict must include a 'type' field", and
 * whatever the adapter's factory or the serde registry refuse. */
KVS_API int kvs_l2_create(const char *json_text, kvs_l2_adapter **out);
KVS_API int kvs_l2_create_json(const json_t *spec, kvs_l2_adapter **out);

/* ---------------------------------------------------------------------
 * The serde wrapper (upstream SerdeL2AdapterWrapper)
 * ------------------------------------------------------------------ */

typedef struct kvs_serde_wrapper_options {
    /* Bytes of temporary buffers the wrapper may hold at once (the bounded
     * pool); a task whose temps do not fit fails at once. 0 = default
     * (1 GiB). */
    uint64_t temp_pool_bytes;
} kvs_serde_wrapper_options;

/* Wrap `inner` so that stores serialize through `serde` first and loads
 * deserialize after. Takes ownership of inner and serde in every case.
 * options may be NULL. The wrapper is itself an adapter (ops name "serde"),
 * with these differences from the general contract:
 *   - Lookup-and-lock, unlock, delete, object sizes and usage pass through
 *     to the inner adapter: the lookup event fd and lookup task ids are the
 *     inner's (as upstream), so a lookup id may equal a store or load id.
 *   - Store: each batch must have one layout (else KVS_EINVAL at submit,
 *     naming both layouts). Temps of the serializer's estimate are taken
 *     from the bounded pool, all or nothing; if they do not fit, the task
 *     completes at once as failed (KVS_ENOMEM, "serde wrapper: temp pool
 *     exhausted: need N bytes for K temps, F of C free"). The inner adapter
 *     stores only the bytes each serialize wrote, and bytes_written is the
 *     inner's (serialized) count.
 *   - Temps are reused: a finished task's temps stay in the pool, idle, for
 *     later tasks that need temps of the same size (loads and stores alike),
 *     at most 1024 of them and, with the temps in use, never more than
 *     temp_pool_bytes (idle ones are freed to make room). A new temp's
 *     pages are mapped when it is made (MADV_POPULATE_WRITE where the
 *     kernel has it), so neither a new nor a reused temp takes page faults
 *     under the serializer. Thread-safe (the pool has the wrapper's lock);
 *     close frees every temp.
 *   - Load: the inner loads serialized bytes into temps; only the keys it
 *     found are deserialized into the caller's objects, which keep their
 *     layout's size. Per key, as the general contract: a key whose
 *     deserialize fails (a damaged blob, or one whose size does not match
 *     the destination's layout: every built-in serde checks it) clears only
 *     its own bit, and the other keys load; the task's first error is the
 *     inner load's if it had one, else the first failing key's, e.g.
 *     "serde wrapper: load of key 2: processor: deserialize object 2 of 4
 *     failed: fp8: stored object is 98304 bytes, destination layout needs
 *     131072" (the processor's object index counts only the keys found). A
 *     partial inner load keeps its bitmap.
 *   - Phases and order: a store is serialize, then the inner store; a load
 *     the inner load, then deserialize. Each phase is submitted by the
 *     thread that finished the one before it (the processor's worker
 *     submits the inner store, the inner adapter's worker the deserialize:
 *     the async processors and the built-in adapters, fs, memory and
 *     redis, call the wrapper back directly); the wrapper's own poll thread
 *     moves on the phases of a processor or adapter that only signals its
 *     event fds (a third party's). Within a phase tasks move on in
 *     submission order: of tasks whose phase finishes at the same moment,
 *     the oldest moves on first, so stores that finish together are popped
 *     oldest first. A serialize or deserialize of at most 128 KiB (both
 *     sides) runs on the thread that submits it (the caller's for a store),
 *     cheaper than waking a worker.
 *   - A store of several objects whose temps exceed 4 MiB goes on in pieces
 *     of about 4 MiB (at least one object each): each piece is stored as
 *     soon as it is serialized, so writes overlap the serialize of the
 *     rest. The caller still sees one task: bytes_written adds the pieces
 *     up; a failing piece fails the task with its error (the first one
 *     wins) while the other pieces still store.
 *   - close: new submits are refused, every task in flight runs through all
 *     its phases and signals, then the poll thread stops, the processor and
 *     inner adapter are closed and every temp is freed.
 *   - status: the inner's JSON plus "serde_wrapped": true and
 *     "serde_temp_pool" {capacity_bytes, in_use_bytes, in_use_temps,
 *     cached_bytes, cached_temps (the idle ones), peak_in_use_bytes,
 *     allocated_temps (temps ever made: a reused one is not counted),
 *     tasks_in_flight}. */
KVS_API int kvs_serde_wrapper_create(kvs_l2_adapter *inner, kvs_processor *serde,
                                     const kvs_serde_wrapper_options *options,
                                     kvs_l2_adapter **out);

/* The same wrapper in the multi shape: around a multi-output serde
 * processor (multi_processor.h), one implementation with the single shape
 * (the same pool, phases, per-key load failures, close and status; only the
 * serde call differs). Ownership and refusals as kvs_serde_wrapper_create.
 * Its messages call the serde "multi-output" (one made from an adapter
 * spec names its type, "kv_split").
 *
 *   kvs_l2_submit_store_groups / _load_groups  take groups (above).
 *   kvs_l2_submit_store / _load  take whole KV chunks, if the serde's group
 *     size is 2 (K, V): KV_2LTD [2, layers, tokens, hidden] and KV_2TD
 *     [2, tokens, hidden] become views of their two halves ([layers, tokens,
 *     hidden] / [tokens, hidden]); KV_T2D [tokens, 2, hidden] becomes two
 *     strided [tokens, hidden] halves (multi.h: read and written in place,
 *     no gather copy). If the serde refuses a K/V group but takes one with K
 *     absent (kv_split "mode": "v_only"), only the V halves are stored and
 *     loaded, and a chunk's K bytes are never read or written. Refused at
 *     submit, nothing queued: a format with no K/V halves ("serde wrapper:
 *     object 0 has format KV_MLA_FMT (MLA: one latent, no separate K and
 *     V), which has no K/V halves; serde 'kv_split' takes K and V (KV_2LTD,
 *     KV_2TD or KV_T2D chunks)"; likewise HS_TD, EC_TD, BINARY,
 *     BINARY_BUFFER, UNDEFINED), a layout that does not fit its format, a
 *     serde whose group size is not 2, mixed layouts.
 *   Lookup, unlock, delete, sizes, usage and status: as the single shape.
 *     Stored objects are the serde's blobs (for kv_split, multi.h: 84 bytes
 *     plus the payloads), so object sizes report blob sizes. */
KVS_API int kvs_serde_wrapper_create_multi(kvs_l2_adapter *inner,
                                           kvs_multi_processor *serde,
                                           const kvs_serde_wrapper_options *options,
                                           kvs_l2_adapter **out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_L2_H */
