/* builtins.h - internal: the factories of the L2 adapters built into
 * kvserde. The L2 registry (registry.c) registers them, in this order, once
 * before its first use. Each has the kvs_l2_factory_fn signature: `spec` is
 * the adapter's JSON object without "type", "serde" and "serde_pool_bytes";
 * on failure it returns a KVS_E* code with a message and allocates nothing. */
#ifndef KVS_L2_BUILTINS_H
#define KVS_L2_BUILTINS_H

#include <jansson.h>

#include "kvserde/l2.h"

/* "fs": one file per key under a directory (src/l2/fs_adapter.c). */
int kvs_fs_adapter_factory(const json_t *spec, void *userdata, kvs_l2_adapter **out);

/* "memory": an in-process hash map (src/l2/memory_adapter.c); see
 * kvserde/l2_memory.h for the accepted keys. */
int kvs_memory_adapter_factory(const json_t *spec, void *userdata,
                               kvs_l2_adapter **out);

/* "redis": a Redis server or Redis Cluster through hiredis
 * (src/l2/redis_adapter.c, the files redis_adapter.h lists); see
 * kvserde/l2_redis.h for the accepted keys. */
int kvs_redis_adapter_factory(const json_t *spec, void *userdata, kvs_l2_adapter **out);

/* The serde wrapper of either shape (exactly one of proc / mproc set),
 * whose messages name the serde `serde_name` (NULL: "single-output" /
 * "multi-output"): what kvs_serde_wrapper_create(_multi) and the registry
 * call (src/l2/serde_wrapper.c). Ownership as there. */
int kvs_serde_wrapper_create_named(kvs_l2_adapter *inner, kvs_processor *proc,
                                   kvs_multi_processor *mproc,
                                   const kvs_serde_wrapper_options *options,
                                   const char *serde_name, kvs_l2_adapter **out);

/* The group submits of kvserde/l2.h: `a` must be a serde wrapper (else
 * refused, naming the adapter); load 0 = store, 1 = load. Arguments
 * already checked by adapter.c. */
int kvs_serde_wrapper_submit_groups(kvs_l2_adapter *a, int load, const kvs_object_key *keys,
                                    kvs_memobj *const *groups, size_t n, size_t group_size,
                                    kvs_l2_task_id *id);

/* The raw path's size rule for loads (kvserde/l2.h, "Load"), shared by the
 * built-in adapters and checked before a destination byte is written: a
 * destination of format KVS_FMT_BINARY or KVS_FMT_BINARY_BUFFER is a byte
 * buffer and takes any stored size its capacity holds; any other destination
 * is KV-shaped and takes exactly its layout's byte size. Returns 1 (and sets
 * *need to the layout's size) if `stored` bytes must be refused for `obj`
 * (KVS_ECORRUPT, "...: stored object is S bytes, destination layout needs
 * N"), else 0. */
int kvs_l2_load_wrong_size(const kvs_memobj *obj, uint64_t stored, uint64_t *need);

#endif /* KVS_L2_BUILTINS_H */
