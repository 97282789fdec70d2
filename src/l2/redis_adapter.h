/* redis_adapter.h - internal: the state of the "redis" L2 adapter
 * (kvserde/l2_redis.h) and the calls its files make of each other:
 *   redis_adapter.c  the adapter: ops, status, listing, create, factory
 *   redis_conn.c     connections, RESP, pipelines, backoff (redis_conn.h)
 *   redis_cluster.c  hash slots, MOVED / ASK and CLUSTER SLOTS parsing (pure)
 *   redis_slot_map.c the slot map those fill
 *   redis_work.c     a run of keys: routing, pipelining, redirections
 *   redis_url.c      redis:// URLs (redis_url.h)
 * Threads and locks: redis_adapter.c's head comment. */
#ifndef KVS_L2_REDIS_ADAPTER_H
#define KVS_L2_REDIS_ADAPTER_H

#include <pthread.h>
#include <stdint.h>

#include "kvserde/error.h"
#include "kvserde/l2.h"
#include "l2/adapter_base.h"
#include "l2/lock_table.h"
#include "l2/redis_cluster.h"
#include "l2/redis_conn.h"

#define KVS_REDIS_NO_NODE 0xffffu /* slot map entry: no master serves the slot */

struct redis_adapter {
    kvs_l2_adapter_base base;   /* runs tasks as slices on its pool */

    /* configuration (immutable after create) */
    char *prefix;
    size_t prefix_len;
    char *username, *password;  /* NULL: no AUTH */
    unsigned db;
    int cluster;
    unsigned timeout_ms;
    unsigned connections;
    size_t nseeds;              /* nodes[0..nseeds) are the configured URLs */

    pthread_mutex_t state_mu;   /* guards the group below */
    rnode **nodes;
    size_t nnodes, nodes_cap;
    uint64_t errors, moved, asked, refreshes;
    char last_error[KVS_ERROR_MSG_MAX];
    kvs_l2_usage last_usage;

    pthread_mutex_t map_mu;     /* guards the slot map */
    uint16_t slots[KVS_REDIS_SLOTS];
    int map_valid, map_stale;

    pthread_mutex_t sets_mu;    /* guards free_sets */
    connset *sets;              /* [connections] */
    connset *free_sets;
    pthread_mutex_t sync_mu;    /* guards sync_set and sync_closed */
    connset sync_set;
    int sync_closed;

    pthread_mutex_t lock_mu;    /* guards the lock table */
    kvs_l2_lock_table locks;    /* by kvs_fs_key_path */
    pthread_rwlock_t del_lock;
};


/* What a run of keys does. */
typedef enum rop { OP_STORE, OP_LOOKUP, OP_LOAD, OP_DELETE, OP_SIZES } rop;

/* One run of a task's keys [begin, end): a slice on a worker, or a
 * synchronous call. Results go to the task's arrays (indexed like keys);
 * the lowest-index error is kept. */
typedef struct rwork {
    rop op;
    const kvs_object_key *keys;
    kvs_memobj *const *objects; /* store, load */
    uint8_t *hit;               /* lookup, load, delete */
    int64_t *sizes;             /* sizes */
    const uint8_t *skip;        /* delete: keys not to touch (locked), or NULL */
    size_t begin, end;
    uint64_t bytes;             /* store: bytes stored */
    int status;
    size_t err_index;
    char message[KVS_ERROR_MSG_MAX];
} rwork;


/* Run w's keys on the connection set cs: route, pipeline per node, follow
 * redirections, until every key has an outcome or the deadline passes
 * (redis_work.c). */
void kvs_redis_run_work(redis_adapter *r, connset *cs, rwork *w, int64_t deadline);

/* Make sure a slot map is there, re-reading it from CLUSTER SLOTS if a
 * MOVED made it stale (redis_slot_map.c). 0, or -1 with err if there is no
 * usable map; a failed re-read keeps the old map (MOVED keys are routed by
 * their redirection anyway). */
int kvs_redis_ensure_map(redis_adapter *r, connset *cs, int64_t deadline, char *err,
                         size_t errsize);

/* A MOVED: slot is now served by node `target`; the map is stale. */
void kvs_redis_map_moved(redis_adapter *r, unsigned slot, int target);

#endif /* KVS_L2_REDIS_ADAPTER_H */
