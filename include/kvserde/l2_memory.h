/* kvserde/l2_memory.h - the in-process L2 adapter ("memory") and its fault
 * injection, for tests and for a single process that wants the L2 contract
 * without storage.
 *
 * The memory adapter keeps the whole contract of l2.h: three event fds, one
 * task-id counter from 0, pop-once results, lock counts, and every store,
 * lookup and load (even the memcpy) runs on the adapter's own worker
 * thread(s), never the caller's. Objects live in a hash map from key to a
 * private copy of the stored bytes, until deleted or the adapter is
 * destroyed; nothing survives the process.
 *
 * Choices this adapter makes where l2.h leaves room:
 *   - A store task stores its keys in order and stops at the first key that
 *     fails (capacity, injected fault, out of memory): the keys before it
 *     stay stored, that key and the later ones are not; the task fails
 *     with that key's error ("memory: capacity exceeded storing key 1: ...").
 *     Storing a key that is present replaces its bytes and keeps its locks.
 *   - Capacity (if not 0) bounds the sum of the stored objects' sizes. A
 *     store whose key would take the total over it fails with KVS_ENOSPC:
 *     "memory: capacity exceeded storing key 1: 600 bytes would make 1100
 *     bytes used, capacity 1000". Nothing is evicted.
 *   - Lookup-and-lock: a miss is not an error (the bitmap's status stays
 *     KVS_OK); an injected lookup fault makes that key a miss (not locked)
 *     and is the result's status and message.
 *   - Load: a missing key ("memory: load of key 2: not found",
 *     KVS_ENOTFOUND), a stored object that is not exactly a KV-shaped
 *     destination's layout size (KVS_ECORRUPT: "memory: load of key 0:
 *     stored object is 16384 bytes, destination layout needs 12288"; see
 *     kvserde/l2.h), a stored object larger than the destination's
 *     capacity (KVS_ENOSPC: "memory: load of key 0: stored object is 4096
 *     bytes, destination holds 1024") or an injected fault clear that key's
 *     bit; the first such error is the result's status and message. The
 *     other keys load.
 *   - Unlock, delete, object sizes, usage and status are synchronous and
 *     keep working after close (the stored objects stay until destroy).
 *   - Status: {"type": "memory", "is_healthy": true, "keys": N,
 *     "bytes_used": B, "capacity_bytes": C, "locked_keys": L, "workers": W};
 *     is_healthy is false once closed.
 *
 * JSON spec (kvs_l2_create): {"type": "memory", "capacity_bytes": N,
 * "workers": W}, both optional: capacity_bytes an integer >= 0 (0 or absent:
 * unbounded), workers an integer from 1 to 1024 (default 1; 2.0 and "2" are
 * accepted as for a serde's max_workers). Any other key is refused:
 * "memory: unknown key 'foo'; accepted: capacity_bytes, workers".
 */
#ifndef KVSERDE_L2_MEMORY_H
#define KVSERDE_L2_MEMORY_H

#include <stdint.h>

#include "error.h"
#include "export.h"
#include "l2.h"
#include "memobj.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_MEMORY_DEFAULT_WORKERS 1
#define KVS_MEMORY_MAX_WORKERS 1024

typedef struct kvs_memory_adapter_options {
    uint64_t capacity_bytes; /* 0 = unbounded */
    unsigned workers;        /* worker threads; 0 = KVS_MEMORY_DEFAULT_WORKERS */
} kvs_memory_adapter_options;

/* Create an empty memory adapter (ops name "memory"). options may be NULL
 * (unbounded, one worker). Refused: KVS_EINVAL for out NULL or workers
 * above KVS_MEMORY_MAX_WORKERS ("memory: workers 2000 out of range [1,
 * 1024]"); KVS_EIO if an eventfd or a thread cannot be created;
 * KVS_ENOMEM. Free with kvs_l2_destroy(). */
KVS_API int kvs_memory_adapter_create(const kvs_memory_adapter_options *options,
                                      kvs_l2_adapter **out);

/* ---------------------------------------------------------------------
 * Fault injection (for tests of the adapter's callers)
 * ------------------------------------------------------------------ */

/* The direction a fault applies to. */
typedef enum kvs_memory_fault_op {
    KVS_MEMORY_FAULT_STORE = 0,
    KVS_MEMORY_FAULT_LOOKUP = 1,
    KVS_MEMORY_FAULT_LOAD = 2,
} kvs_memory_fault_op;

/* One fault. It stays in force until kvs_memory_adapter_clear_faults().
 *
 * Matching: a fault matches a key of a task of direction `op` if `key` is
 * NULL (every key) or equal to it (kvs_object_key_equal).
 *
 * Failure: if status is a KVS_E* code (< 0), every matching key fails with
 * it and the message
 *     "memory: injected store fault on key 1: I/O error"
 * (direction, the key's index in its task, kvs_strerror(status)): a store
 * task fails and stops at that key (the keys before it are stored); a
 * lookup or load clears that key's bit and keeps the first such error as
 * the result's status and message. The first fault added that matches
 * decides. status KVS_OK adds no failure (a latency-only fault).
 *
 * Latency: before doing anything, a task of direction `op` sleeps, on its
 * worker thread, the sum of latency_us of the faults of that direction that
 * match at least one of its keys. Empty batches complete at submit and see
 * no fault.
 *
 * The fault is copied (and the key with it): the caller's struct and key
 * need not outlive the call. */
typedef struct kvs_memory_fault {
    kvs_memory_fault_op op;
    const kvs_object_key *key; /* NULL = every key */
    int status;                /* KVS_OK (latency only) or a negative KVS_E* */
    uint64_t latency_us;       /* added per task, in microseconds */
} kvs_memory_fault;

/* Add a fault to a memory adapter (the adapter kvs_memory_adapter_create or
 * the "memory" factory returned, not a serde wrapper around it). Takes
 * effect for tasks that start after this returns. Refused (KVS_EINVAL): a or
 * fault NULL, an adapter of another type ("memory: adapter is of type
 * 'fs', not 'memory'"), an unknown op ("memory: unknown fault op 7"), a
 * positive status ("memory: fault status 3 is not KVS_OK or a KVS_E* code"),
 * an invalid key ("memory: fault key: key: ..."); KVS_ENOMEM. */
KVS_API int kvs_memory_adapter_inject(kvs_l2_adapter *a, const kvs_memory_fault *fault);

/* Remove every fault (tasks already sleeping or running keep theirs).
 * KVS_EINVAL for NULL or an adapter of another type. */
KVS_API int kvs_memory_adapter_clear_faults(kvs_l2_adapter *a);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_L2_MEMORY_H */
