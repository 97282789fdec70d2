/* redis_adapter.c - the "redis" L2 adapter (kvserde/l2_redis.h): objects
 * stored as Redis string values under prefix + kvs_fs_key_path(key), on one
 * server or a Redis Cluster, through hiredis.
 *
 * The files (redis_adapter.h): this one has the ops, status, listing,
 * create and the factory; redis_conn.c the connections and the protocol,
 * redis_work.c the run of a task's keys, redis_cluster.c and
 * redis_slot_map.c the cluster's slots, redis_url.c the URLs.
 *
 * What hiredis does and what the adapter does. hiredis parses replies (the
 * redisReader of each connection's redisContext, made with redisConnectFd),
 * except a load's bulk strings: pipe_read_load (redis_conn.c) reads those itself, with
 * redis_bulk.h, straight from the socket into the destination objects
 * (hiredis would buffer a value whole, copy it into a reply, and this file
 * copy it again); the other replies to a load go to hiredis' reader whole.
 * The adapter connects and drives the sockets itself, non-blocking under
 * poll(2), for these reasons: one deadline per task, however many round
 * trips and nodes it takes (hiredis' blocking calls have a timeout per
 * system call); several nodes' pipelines in flight at once; values sent
 * from the caller's memory with sendmsg(2) (hiredis would first copy each
 * value into its output buffer), with MSG_NOSIGNAL so a closed socket never
 * raises SIGPIPE in the host program; and sockets created close-on-exec
 * (hiredis 0.14 makes inheritable ones, which a host program that spawns
 * processes would leak into them) that try every address of the host.
 *
 * Threads and locks:
 *   - The completion plumbing (ids, eventfds, unread results, the pool,
 *     close) is the adapters' shared base (adapter_base.h).
 *   - A task's keys are cut into up to `connections` contiguous slices, one
 *     pool job each (the shared batch runner, batch_slices.h); each job
 *     borrows a connection set (one redisContext per node) from a free list
 *     with as many sets as workers, so a set is only ever used by one
 *     thread at a time and needs no lock of its own.
 *     The synchronous calls (delete, object sizes, usage) use one more set,
 *     under sync_mu, on the caller's thread.
 *   - state_mu guards the node table (nodes are only ever added, and a
 *     node's host/port/addr never change, so a node pointer can be used
 *     without the lock), each node's backoff and connection state, and the
 *     counters reported by status.
 *   - map_mu guards the cluster slot map.
 *   - lock_mu guards the lock counts (the shared lock table, lock_table.h,
 *     keyed by the key's kvs_fs_key_path). del_lock (a writer-preferring
 *     rwlock) makes a delete atomic with respect to lookups: a lookup holds
 *     it for reading from its EXISTS to its lock, a delete for writing from
 *     its lock check to its DEL, so a key a lookup reports found and locked
 *     is never deleted by this adapter in between.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "kvserde/error.h"
#include "kvserde/export.h"
#include "kvserde/l2.h"
#include "kvserde/l2_fs.h"
#include "kvserde/l2_redis.h"
#include "kvserde/registry.h"
#include "l2/adapter_base.h"
#include "l2/builtins.h"
#include "l2/lock_table.h"
#include "l2/redis_adapter.h"
#include "l2/redis_conn.h"
#include "l2/redis_url.h"

static const struct kvs_l2_adapter_ops redis_ops;

static redis_adapter *redis_of(kvs_l2_adapter *a)
{
    return KVS_CONTAINER_OF(a, redis_adapter, base.adapter);
}

/* ---------------------------------------------------------------------
 * Worker side
 * ------------------------------------------------------------------ */

/* The batch runner's run(): this slice's keys as one run of
 * kvs_redis_run_work, on a connection set of its own. */
static void run_slice(kvs_l2_slice *s)
{
    kvs_l2_batch *b = s->batch;
    redis_adapter *r = b->runner.ctx;
    kvs_l2_direction d = b->t->direction;
    rwork w = {0};
    w.op = d == KVS_L2_STORE ? OP_STORE : d == KVS_L2_LOOKUP ? OP_LOOKUP : OP_LOAD;
    w.keys = b->keys;
    w.objects = b->objects;
    w.hit = b->hit;
    w.begin = s->begin;
    w.end = s->end;
    int64_t deadline = kvs_redis_deadline(r);
    connset *cs = kvs_redis_connset_take(r);
    if (w.op == OP_LOOKUP) pthread_rwlock_rdlock(&r->del_lock);
    kvs_redis_run_work(r, cs, &w, deadline);
    if (w.op == OP_LOOKUP) pthread_rwlock_unlock(&r->del_lock);
    kvs_redis_connset_put(r, cs);
    /* Hits are in b->hit already; the bytes and the error (the run's
     * lowest failing key) are the slice's. */
    s->bytes = w.bytes;
    if (w.status != KVS_OK) kvs_l2_slice_fail(s, w.status, "%s", w.message);
}

/* ---------------------------------------------------------------------
 * Ops
 * ------------------------------------------------------------------ */

static int rd_unlock(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n)
{
    redis_adapter *r = redis_of(a);
    char path[KVS_FS_KEY_PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        (void)kvs_fs_key_path(&keys[i], path, sizeof path);
        pthread_mutex_lock(&r->lock_mu);
        kvs_l2_lock_table_release(&r->locks, path);
        pthread_mutex_unlock(&r->lock_mu);
    }
    return KVS_OK;
}

/* Run a synchronous call's keys on the caller's thread. Holds sync_mu;
 * KVS_ECLOSED after close. */
static int run_sync(redis_adapter *r, rwork *w)
{
    pthread_mutex_lock(&r->sync_mu);
    if (r->sync_closed) {
        pthread_mutex_unlock(&r->sync_mu);
        return kvs_l2_base_refuse_closed(&r->base);
    }
    kvs_redis_run_work(r, &r->sync_set, w, kvs_redis_deadline(r));
    pthread_mutex_unlock(&r->sync_mu);
    if (w->status != KVS_OK) return kvs_set_error(w->status, "%s", w->message);
    return KVS_OK;
}

static int rd_delete(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                     uint8_t *deleted)
{
    redis_adapter *r = redis_of(a);
    uint8_t *hit = calloc(n ? n : 1, 1), *locked = calloc(n ? n : 1, 1);
    if (hit == NULL || locked == NULL) {
        free(hit);
        free(locked);
        return kvs_set_error(KVS_ENOMEM, "redis: out of memory deleting %zu keys", n);
    }
    /* Under del_lock: no lookup can find and lock a key between our lock
     * check and its DEL. A locked key is kept. */
    pthread_rwlock_wrlock(&r->del_lock);
    char path[KVS_FS_KEY_PATH_MAX];
    pthread_mutex_lock(&r->lock_mu);
    for (size_t i = 0; i < n; i++) {
        (void)kvs_fs_key_path(&keys[i], path, sizeof path);
        locked[i] = kvs_l2_lock_table_count(&r->locks, path) != 0;
    }
    pthread_mutex_unlock(&r->lock_mu);
    rwork w = {0};
    w.op = OP_DELETE;
    w.keys = keys;
    w.hit = hit;
    w.skip = locked;
    w.end = n;
    int rc = run_sync(r, &w);
    pthread_rwlock_unlock(&r->del_lock);
    if (deleted) memcpy(deleted, hit, n);
    free(hit);
    free(locked);
    return rc;
}

static int rd_object_sizes(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                           int64_t *sizes)
{
    redis_adapter *r = redis_of(a);
    for (size_t i = 0; i < n; i++) sizes[i] = -1;
    rwork w = {0};
    w.op = OP_SIZES;
    w.keys = keys;
    w.sizes = sizes;
    w.end = n;
    return run_sync(r, &w);
}

/* The value of "name:" in an INFO reply; -1 if absent. */
static long long info_field(const char *info, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = info; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncmp(p, name, nl) == 0 && p[nl] == ':') return strtoll(p + nl + 1, NULL, 10);
    }
    return -1;
}

static int rd_usage(kvs_l2_adapter *a, kvs_l2_usage *out)
{
    redis_adapter *r = redis_of(a);
    pthread_mutex_lock(&r->sync_mu);
    if (r->sync_closed) { /* the last usage read */
        pthread_mutex_unlock(&r->sync_mu);
        pthread_mutex_lock(&r->state_mu);
        *out = r->last_usage;
        pthread_mutex_unlock(&r->state_mu);
        return KVS_OK;
    }
    connset *cs = &r->sync_set;
    int64_t deadline = kvs_redis_deadline(r);
    char err[KVS_REDIS_ERR_MAX];
    int rc = KVS_OK;
    size_t npipes = 0;
    uint8_t *use = NULL;
    rpipe *pipes = NULL;
    if (r->cluster && kvs_redis_ensure_map(r, cs, deadline, err, sizeof err) != 0) {
        rc = kvs_set_error(KVS_EIO, "redis: usage: cluster: cannot read the slot map: %s",
                           err);
        goto out;
    }
    /* The nodes to ask: the server, or every master in the slot map. */
    size_t nn = kvs_redis_node_count(r);
    use = calloc(nn ? nn : 1, 1);
    pipes = calloc(nn ? nn : 1, sizeof *pipes);
    if (use == NULL || pipes == NULL) {
        rc = kvs_set_error(KVS_ENOMEM, "redis: out of memory reading usage");
        goto out;
    }
    if (r->cluster) {
        pthread_mutex_lock(&r->map_mu);
        for (size_t s = 0; s < KVS_REDIS_SLOTS; s++)
            if (r->slots[s] != KVS_REDIS_NO_NODE && r->slots[s] < nn) use[r->slots[s]] = 1;
        pthread_mutex_unlock(&r->map_mu);
    } else {
        use[0] = 1;
    }
    for (size_t i = 0; i < nn && rc == KVS_OK; i++) {
        if (!use[i]) continue;
        rpipe *p = &pipes[npipes++];
        p->node = (int)i;
        p->nd = kvs_redis_node_get(r, (int)i);
        const char *argv[] = {"INFO", "memory"};
        if (kvs_redis_pipe_alloc(p, 1) != 0 || kvs_redis_cmd_words(&p->cmds[0], 2, argv) != 0) {
            rc = kvs_set_error(KVS_ENOMEM, "redis: out of memory reading usage");
            break;
        }
        p->ncmds = 1;
        p->c = kvs_redis_conn_get(r, cs, p->node, deadline, 0, &p->reused, p->err, sizeof p->err);
        if (p->c == NULL) rc = kvs_set_error(KVS_EIO, "redis: usage: %s", p->err);
    }
    if (rc == KVS_OK) {
        kvs_redis_run_pipes(r, pipes, npipes, cs->rbuf, deadline);
        kvs_l2_usage u = {0, 0};
        int unbounded = 0;
        for (size_t j = 0; j < npipes && rc == KVS_OK; j++) {
            rpipe *p = &pipes[j];
            if (p->state == PIPE_FAILED) {
                kvs_redis_conn_drop(r, cs, p->node, p->err);
                rc = kvs_set_error(KVS_EIO, "redis: usage: %s", p->err);
                break;
            }
            const redisReply *rep = p->replies[0];
            long long used = rep->type == REDIS_REPLY_STRING ? info_field(rep->str, "used_memory")
                                                             : -1;
            long long max = rep->type == REDIS_REPLY_STRING ? info_field(rep->str, "maxmemory")
                                                            : -1;
            if (used < 0 || max < 0) {
                kvs_redis_msgf(err, sizeof err, "%s: INFO memory: %s", p->nd->addr,
                         rep->type == REDIS_REPLY_ERROR ? rep->str : "no used_memory/maxmemory");
                kvs_redis_count_error(r, err);
                rc = kvs_set_error(KVS_EIO, "redis: usage: %s", err);
                break;
            }
            u.bytes_used += (uint64_t)used;
            u.capacity += (uint64_t)max;
            unbounded |= max == 0;
        }
        if (rc == KVS_OK) {
            if (unbounded) u.capacity = 0;
            *out = u;
            pthread_mutex_lock(&r->state_mu);
            r->last_usage = u;
            pthread_mutex_unlock(&r->state_mu);
        }
    }
out:
    for (size_t j = 0; j < npipes; j++) kvs_redis_pipe_free(&pipes[j]);
    free(pipes);
    free(use);
    pthread_mutex_unlock(&r->sync_mu);
    return rc;
}

static int rd_status(kvs_l2_adapter *a, json_t **out)
{
    redis_adapter *r = redis_of(a);
    int closing = kvs_l2_tq_is_closed(&r->base.q); /* closing counts as closed */
    json_t *nodes = json_array();
    if (nodes == NULL) return kvs_set_error(KVS_ENOMEM, "redis: out of memory for status");
    /* The nodes in use: the server, or the masters of the slot map. */
    pthread_mutex_lock(&r->map_mu);
    pthread_mutex_lock(&r->state_mu);
    size_t nn = r->nnodes;
    uint8_t *use = calloc(nn ? nn : 1, 1);
    if (use != NULL) {
        if (r->cluster && r->map_valid) {
            for (size_t s = 0; s < KVS_REDIS_SLOTS; s++)
                if (r->slots[s] < nn) use[r->slots[s]] = 1;
        } else {
            for (size_t i = 0; i < (r->cluster ? r->nseeds : 1); i++) use[i] = 1;
        }
    }
    int healthy = !closing && use != NULL, oom = use == NULL;
    json_int_t connected = 0;
    for (size_t i = 0; i < nn && !oom; i++) {
        rnode *nd = r->nodes[i];
        if (nd->open_conns) connected++;
        if (use[i] && nd->failed) healthy = 0;
        if (json_array_append_new(nodes, json_pack("{s:s, s:b, s:s}", "address", nd->addr,
                                                   "connected", nd->open_conns > 0,
                                                   "last_error", nd->last_error)) != 0)
            oom = 1;
    }
    json_t *s = oom ? NULL
                    : json_pack("{s:s, s:b, s:b, s:s, s:I, s:I, s:o, s:I, s:I, s:s, "
                                "s:{s:I, s:I}, s:I}",
                                "type", "redis", "is_healthy", healthy, "cluster", r->cluster,
                                "key_prefix", r->prefix, "connections",
                                (json_int_t)r->connections, "timeout_ms",
                                (json_int_t)r->timeout_ms, "nodes", nodes, "nodes_connected",
                                connected, "errors", (json_int_t)r->errors, "last_error",
                                r->last_error, "redirections", "moved", (json_int_t)r->moved,
                                "ask", (json_int_t)r->asked, "slot_map_refreshes",
                                (json_int_t)r->refreshes);
    pthread_mutex_unlock(&r->state_mu);
    pthread_mutex_unlock(&r->map_mu);
    free(use);
    if (s == NULL) {
        if (oom) json_decref(nodes); /* "s:o" took it otherwise */
        return kvs_set_error(KVS_ENOMEM, "redis: out of memory for status");
    }
    pthread_mutex_lock(&r->lock_mu);
    json_int_t locked = (json_int_t)kvs_l2_lock_table_nlocked(&r->locks);
    pthread_mutex_unlock(&r->lock_mu);
    if (json_object_set_new(s, "locked_keys", json_integer(locked)) != 0) {
        json_decref(s);
        return kvs_set_error(KVS_ENOMEM, "redis: out of memory for status");
    }
    *out = s;
    return KVS_OK;
}

/* Close's last step (adapter_base.h): every connection. */
static void rd_release(kvs_l2_adapter_base *b)
{
    redis_adapter *r = KVS_CONTAINER_OF(b, redis_adapter, base);
    for (unsigned i = 0; i < r->connections; i++) kvs_redis_connset_close_all(r, &r->sets[i]);
    pthread_mutex_lock(&r->sync_mu);
    kvs_redis_connset_close_all(r, &r->sync_set);
    r->sync_closed = 1;
    pthread_mutex_unlock(&r->sync_mu);
}

static void rd_destroy(kvs_l2_adapter *a)
{
    redis_adapter *r = redis_of(a);
    kvs_l2_base_destroy(&r->base);
    for (unsigned i = 0; r->sets && i < r->connections; i++) kvs_redis_connset_free(r, &r->sets[i]);
    kvs_redis_connset_free(r, &r->sync_set);
    free(r->sets);
    kvs_l2_lock_table_destroy(&r->locks);
    for (size_t i = 0; i < r->nnodes; i++) free(r->nodes[i]);
    free(r->nodes);
    free(r->prefix);
    free(r->username);
    if (r->password) memset(r->password, 0, strlen(r->password));
    free(r->password);
    pthread_rwlock_destroy(&r->del_lock);
    pthread_mutex_destroy(&r->lock_mu);
    pthread_mutex_destroy(&r->sync_mu);
    pthread_mutex_destroy(&r->sets_mu);
    pthread_mutex_destroy(&r->map_mu);
    pthread_mutex_destroy(&r->state_mu);
    free(r);
}

/* ---------------------------------------------------------------------
 * Listing keys
 * ------------------------------------------------------------------ */

#define LIST_COUNT "1000" /* SCAN's COUNT: names per page, roughly */

/* One SCAN page from node i: SCAN cursor MATCH pattern COUNT 1000, on the
 * synchronous set (sync_mu held by the caller). A kept connection that
 * turns out broken is replaced once (a restart while idle). The reply, or
 * NULL with the error in err. */
static redisReply *list_scan_page(redis_adapter *r, int i, const char *cursor,
                                  const char *pattern, char *err, size_t errsize)
{
    connset *cs = &r->sync_set;
    int64_t deadline = kvs_redis_deadline(r);
    for (int attempt = 0;; attempt++) {
        rpipe p = {0};
        p.node = i;
        p.nd = kvs_redis_node_get(r, i);
        p.c = kvs_redis_conn_get(r, cs, i, deadline, 0, &p.reused, err, errsize);
        if (p.c == NULL) return NULL;
        const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", LIST_COUNT};
        size_t lens[6];
        for (int k = 0; k < 6; k++) lens[k] = strlen(argv[k]);
        if (kvs_redis_pipe_alloc(&p, 1) != 0 ||
            kvs_redis_cmd_build(&p.cmds[0], 6, argv, lens) != 0) {
            kvs_redis_pipe_free(&p);
            kvs_redis_msgf(err, errsize, "%s: out of memory", p.nd->addr);
            return NULL;
        }
        p.ncmds = 1;
        kvs_redis_run_pipes(r, &p, 1, cs->rbuf, deadline);
        if (p.state == PIPE_FAILED) {
            int retry = p.lost && p.reused && attempt == 0;
            kvs_redis_msgf(err, errsize, "%s", p.err);
            kvs_redis_conn_drop(r, cs, i, p.err);
            kvs_redis_pipe_free(&p);
            if (retry) continue;
            kvs_redis_count_error(r, err);
            return NULL;
        }
        redisReply *rep = p.replies[0];
        p.nreplies = 0; /* ours now */
        kvs_redis_pipe_free(&p);
        return rep;
    }
}

/* Every name SCAN returns on the server, or on each master of the cluster,
 * that is prefix + kvs_fs_key_path() of a valid key, once: SCAN may return
 * a name twice, so the names reported are kept (`seen`). Each page is
 * fetched holding sync_mu and reported without it, so fn may call back
 * into the adapter. */
static int rd_list_keys(kvs_l2_adapter *a, kvs_l2_key_fn fn, void *ctx)
{
    redis_adapter *r = redis_of(a);
    /* MATCH <prefix>*, the prefix's glob characters escaped. */
    char pattern[2 * KVS_REDIS_PREFIX_MAX + 2];
    size_t pl = 0;
    for (size_t k = 0; k < r->prefix_len; k++) {
        if (strchr("*?[]\\", r->prefix[k])) pattern[pl++] = '\\';
        pattern[pl++] = r->prefix[k];
    }
    pattern[pl++] = '*';
    pattern[pl] = '\0';

    char err[KVS_REDIS_ERR_MAX];
    kvs_l2_lock_table seen;
    uint8_t *use = NULL;
    kvs_object_key *page = NULL;
    size_t page_cap = 0, nn = 0;
    int rc = KVS_OK;
    if (kvs_l2_lock_table_init(&seen) != 0)
        return kvs_set_error(KVS_ENOMEM, "redis: out of memory listing keys");
    /* The nodes to scan, fixed at the start: the server, or every master. */
    pthread_mutex_lock(&r->sync_mu);
    if (r->sync_closed) {
        rc = kvs_l2_base_refuse_closed(&r->base);
    } else if (r->cluster &&
               kvs_redis_ensure_map(r, &r->sync_set, kvs_redis_deadline(r),
                          err, sizeof err) != 0) {
        rc = kvs_set_error(KVS_EIO, "redis: list keys: cluster: cannot read the slot map: %s",
                           err);
    } else {
        nn = kvs_redis_node_count(r);
        use = calloc(nn ? nn : 1, 1);
        if (use == NULL) rc = kvs_set_error(KVS_ENOMEM, "redis: out of memory listing keys");
        pthread_mutex_lock(&r->map_mu);
        for (size_t s = 0; use && r->cluster && s < KVS_REDIS_SLOTS; s++)
            if (r->slots[s] < nn) use[r->slots[s]] = 1;
        pthread_mutex_unlock(&r->map_mu);
        if (use && !r->cluster) use[0] = 1;
    }
    pthread_mutex_unlock(&r->sync_mu);

    for (size_t i = 0; i < nn && rc == KVS_OK; i++) {
        if (!use[i]) continue;
        char cursor[32] = "0";
        do {
            size_t npage = 0;
            pthread_mutex_lock(&r->sync_mu);
            redisReply *rep = NULL;
            if (r->sync_closed)
                rc = kvs_l2_base_refuse_closed(&r->base);
            else if ((rep = list_scan_page(r, (int)i, cursor, pattern, err, sizeof err)) == NULL)
                rc = kvs_set_error(KVS_EIO, "redis: list keys: %s", err);
            pthread_mutex_unlock(&r->sync_mu);
            if (rc != KVS_OK) break;
            const char *addr = kvs_redis_node_get(r, (int)i)->addr;
            const redisReply *names = rep->type == REDIS_REPLY_ARRAY && rep->elements == 2
                                          ? rep->element[1] : NULL;
            if (rep->type == REDIS_REPLY_ERROR) {
                kvs_redis_msgf(err, sizeof err, "%s: SCAN: %s", addr, rep->str);
                rc = KVS_EIO;
            } else if (names == NULL || names->type != REDIS_REPLY_ARRAY ||
                       rep->element[0]->type != REDIS_REPLY_STRING ||
                       rep->element[0]->len == 0 || rep->element[0]->len >= sizeof cursor) {
                kvs_redis_msgf(err, sizeof err, "%s: SCAN: malformed reply", addr);
                rc = KVS_EIO;
            } else if (names->elements > page_cap) {
                kvs_object_key *grown = realloc(page, names->elements * sizeof *page);
                if (grown == NULL) rc = KVS_ENOMEM;
                else page = grown, page_cap = names->elements;
            }
            if (rc == KVS_OK) memcpy(cursor, rep->element[0]->str, rep->element[0]->len + 1);
            for (size_t k = 0; rc == KVS_OK && k < names->elements; k++) {
                const redisReply *e = names->element[k];
                char path[KVS_FS_KEY_PATH_MAX];
                size_t plen = e->type == REDIS_REPLY_STRING ? e->len : 0;
                if (plen <= r->prefix_len || plen - r->prefix_len >= sizeof path ||
                    memcmp(e->str, r->prefix, r->prefix_len) != 0 ||
                    memchr(e->str, '\0', plen) != NULL)
                    continue; /* not one of ours */
                memcpy(path, e->str + r->prefix_len, plen - r->prefix_len + 1);
                if (kvs_fs_path_key(path, &page[npage]) != KVS_OK ||
                    kvs_l2_lock_table_count(&seen, path) != 0)
                    continue; /* a foreign name, or one reported already */
                if (kvs_l2_lock_table_add(&seen, path) != 0) rc = KVS_ENOMEM;
                else npage++;
            }
            freeReplyObject(rep);
            if (rc == KVS_EIO) {
                kvs_redis_count_error(r, err);
                rc = kvs_set_error(KVS_EIO, "redis: list keys: %s", err);
            } else if (rc == KVS_ENOMEM) {
                rc = kvs_set_error(KVS_ENOMEM, "redis: out of memory listing keys");
            }
            for (size_t k = 0; k < npage && rc == KVS_OK; k++) rc = fn(ctx, &page[k]);
        } while (rc == KVS_OK && strcmp(cursor, "0") != 0);
    }
    free(page);
    free(use);
    kvs_l2_lock_table_destroy(&seen);
    return rc;
}

static const struct kvs_l2_adapter_ops redis_ops = {
    .name = "redis",
    KVS_L2_BASE_COMPLETION_OPS,
    KVS_L2_BASE_BATCH_OPS,
    .unlock = rd_unlock,
    .delete_keys = rd_delete,
    .object_sizes = rd_object_sizes,
    .usage = rd_usage,
    .status = rd_status,
    .destroy = rd_destroy,
    .list_keys = rd_list_keys,
};

/* ---------------------------------------------------------------------
 * Public API
 * ------------------------------------------------------------------ */

static char *dup_or_null(const char *s) { return s ? strdup(s) : NULL; }

int kvs_redis_adapter_create(const kvs_redis_options *opts, kvs_l2_adapter **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "redis: output pointer is NULL");
    *out = NULL;
    kvs_redis_options o = {0};
    if (opts) o = *opts;
    static const char *const default_url[] = {KVS_REDIS_DEFAULT_URL};
    if (o.nurls == 0) {
        o.urls = default_url;
        o.nurls = 1;
    }
    if (o.urls == NULL) return kvs_set_error(KVS_EINVAL, "redis: urls is NULL");
    if (o.nurls > 1 && !o.cluster)
        return kvs_set_error(KVS_EINVAL, "redis: %zu URLs need \"cluster\": true", o.nurls);
    if (o.nurls > KVS_REDIS_MAX_NODES)
        return kvs_set_error(KVS_EINVAL, "redis: %zu URLs, at most %d", o.nurls,
                             KVS_REDIS_MAX_NODES);
    if (o.key_prefix == NULL) o.key_prefix = KVS_REDIS_DEFAULT_PREFIX;
    if (strlen(o.key_prefix) > KVS_REDIS_PREFIX_MAX)
        return kvs_set_error(KVS_EINVAL, "redis: key_prefix is %zu bytes, at most %d",
                             strlen(o.key_prefix), KVS_REDIS_PREFIX_MAX);
    if (o.timeout_ms == 0) o.timeout_ms = KVS_REDIS_DEFAULT_TIMEOUT_MS;
    if (o.timeout_ms > KVS_REDIS_MAX_TIMEOUT_MS)
        return kvs_set_error(KVS_EINVAL, "redis: timeout_ms %u out of range [1, %d]",
                             o.timeout_ms, KVS_REDIS_MAX_TIMEOUT_MS);
    if (o.connections == 0) o.connections = KVS_REDIS_DEFAULT_CONNECTIONS;
    if (o.connections > KVS_REDIS_MAX_CONNECTIONS)
        return kvs_set_error(KVS_EINVAL, "redis: connections %u out of range [1, %d]",
                             o.connections, KVS_REDIS_MAX_CONNECTIONS);

    /* Every URL is checked before anything is allocated for the adapter. */
    const char *user = o.username, *pass = o.password;
    char *url_user = NULL, *url_pass = NULL;
    unsigned db = 0;
    for (size_t i = 0; i < o.nurls; i++) {
        if (o.urls[i] == NULL) {
            free(url_user);
            free(url_pass);
            return kvs_set_error(KVS_EINVAL, "redis: URL %zu is NULL", i);
        }
        redis_url u;
        int rc = kvs_redis_parse_url(o.urls[i], &u);
        if (rc != KVS_OK) {
            free(url_user);
            free(url_pass);
            return rc;
        }
        if (o.cluster && u.db != 0) {
            char shown[1024];
            kvs_redis_redact_url(o.urls[i], shown, sizeof shown);
            kvs_redis_url_free(&u);
            free(url_user);
            free(url_pass);
            return kvs_set_error(KVS_EINVAL,
                                 "redis: cluster mode supports database 0 only, URL '%s' "
                                 "selects %u",
                                 shown, u.db);
        }
        if (i == 0) db = u.db;
        if (url_user == NULL && u.username) {
            url_user = u.username;
            u.username = NULL;
        }
        if (url_pass == NULL && u.password) {
            url_pass = u.password;
            u.password = NULL;
        }
        kvs_redis_url_free(&u);
    }
    if (user == NULL) user = url_user;
    if (pass == NULL) pass = url_pass;
    if (user != NULL && pass == NULL) {
        free(url_user);
        free(url_pass);
        return kvs_set_error(KVS_EINVAL, "redis: a username needs a password");
    }

    redis_adapter *r = calloc(1, sizeof *r);
    int rc = KVS_OK;
    if (r == NULL) {
        free(url_user);
        free(url_pass);
        return kvs_set_error(KVS_ENOMEM, "redis: out of memory creating the adapter");
    }
    if ((rc = kvs_l2_base_init(&r->base, &redis_ops, "redis", rd_release)) != KVS_OK) {
        free(url_user);
        free(url_pass);
        free(r);
        return rc;
    }
    r->prefix = strdup(o.key_prefix);
    r->prefix_len = strlen(o.key_prefix);
    r->username = dup_or_null(user);
    r->password = dup_or_null(pass);
    free(url_user);
    if (url_pass) memset(url_pass, 0, strlen(url_pass));
    free(url_pass);
    r->db = db;
    r->cluster = o.cluster != 0;
    r->timeout_ms = o.timeout_ms;
    r->connections = o.connections;
    int locks_oom = kvs_l2_lock_table_init(&r->locks) != 0;
    r->sets = calloc(o.connections, sizeof *r->sets);
    pthread_mutex_init(&r->state_mu, NULL);
    pthread_mutex_init(&r->map_mu, NULL);
    pthread_mutex_init(&r->sets_mu, NULL);
    pthread_mutex_init(&r->sync_mu, NULL);
    pthread_mutex_init(&r->lock_mu, NULL);
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&r->del_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    int oom = r->prefix == NULL || (user && !r->username) || (pass && !r->password) ||
              locks_oom || r->sets == NULL || kvs_redis_connset_init(&r->sync_set) != 0;
    for (unsigned i = 0; !oom && i < o.connections; i++) {
        oom = kvs_redis_connset_init(&r->sets[i]) != 0;
        r->sets[i].next_free = r->free_sets;
        r->free_sets = &r->sets[i];
    }
    for (size_t i = 0; !oom && i < o.nurls; i++) {
        redis_url u;
        (void)kvs_redis_parse_url(o.urls[i], &u); /* checked above */
        kvs_redis_url_free(&u);
        oom = kvs_redis_node_find_or_add(r, u.host, u.port) < 0;
    }
    r->nseeds = r->nnodes;
    if (oom) {
        rc = kvs_set_error(KVS_ENOMEM, "redis: out of memory creating the adapter");
        goto fail;
    }
    if ((rc = kvs_l2_base_start(&r->base, o.connections, "kvs-redis", run_slice, r)) != KVS_OK)
        goto fail;
    *out = &r->base.adapter;
    return KVS_OK;

fail:
    rd_destroy(&r->base.adapter); /* handles a partly built adapter; pool NULL is a no-op */
    return rc;
}

/* ---------------------------------------------------------------------
 * The registry's factory
 * ------------------------------------------------------------------ */

static int get_string(const json_t *spec, const char *key, const char **out)
{
    const json_t *v = json_object_get(spec, key);
    if (v == NULL) return KVS_OK;
    if (!json_is_string(v))
        return kvs_set_error(KVS_EINVAL, "redis: %s must be a string, got %s", key,
                             kvs_json_type_name(v));
    *out = json_string_value(v);
    return KVS_OK;
}

int kvs_redis_adapter_factory(const json_t *spec, void *userdata, kvs_l2_adapter **out)
{
    (void)userdata;
    if (out) *out = NULL;
    if (!json_is_object(spec))
        return kvs_set_error(KVS_EINVAL, "redis: spec must be a JSON object, got %s",
                             spec ? kvs_json_type_name(spec) : "NULL");
    static const char *const known[] = {"url",        "urls",        "cluster",  "key_prefix",
                                        "timeout_ms", "connections", "username", "password",
                                        NULL};
    int rc = kvs_json_check_keys(spec, "redis", "key", known);
    if (rc) return rc;
    kvs_redis_options o = {0};
    const char *url = NULL;
    int cluster;
    if ((rc = get_string(spec, "url", &url)) || (rc = get_string(spec, "key_prefix",
                                                                  &o.key_prefix)) ||
        (rc = get_string(spec, "username", &o.username)) ||
        (rc = get_string(spec, "password", &o.password)) ||
        (rc = kvs_kwargs_get_bool(spec, "redis", "cluster", 0, &cluster)))
        return rc;
    o.cluster = cluster;
    const json_t *urls = json_object_get(spec, "urls");
    if (url != NULL && urls != NULL)
        return kvs_set_error(KVS_EINVAL, "redis: give 'url' or 'urls', not both");
    const char **list = NULL;
    if (urls != NULL) {
        if (!json_is_array(urls) || json_array_size(urls) == 0)
            return kvs_set_error(KVS_EINVAL,
                                 "redis: urls must be a non-empty array of strings, got %s",
                                 json_is_array(urls) ? "an empty array"
                                                     : kvs_json_type_name(urls));
        size_t n = json_array_size(urls);
        for (size_t i = 0; i < n; i++)
            if (!json_is_string(json_array_get(urls, i)))
                return kvs_set_error(KVS_EINVAL, "redis: urls[%zu] must be a string, got %s",
                                     i, kvs_json_type_name(json_array_get(urls, i)));
        list = malloc(n * sizeof *list);
        if (list == NULL) return kvs_set_error(KVS_ENOMEM, "redis: out of memory");
        for (size_t i = 0; i < n; i++) list[i] = json_string_value(json_array_get(urls, i));
        o.urls = list;
        o.nurls = n;
    } else if (url != NULL) {
        o.urls = &url;
        o.nurls = 1;
    }
    const json_t *t = json_object_get(spec, "timeout_ms");
    if (t != NULL) {
        if (!json_is_integer(t) || json_integer_value(t) < 1 ||
            json_integer_value(t) > KVS_REDIS_MAX_TIMEOUT_MS) {
            free(list);
            if (!json_is_integer(t))
                return kvs_set_error(KVS_EINVAL,
                                     "redis: timeout_ms must be an integer from 1 to %d, got "
                                     "%s",
                                     KVS_REDIS_MAX_TIMEOUT_MS, kvs_json_type_name(t));
            return kvs_set_error(KVS_EINVAL,
                                 "redis: timeout_ms must be an integer from 1 to %d, got %lld",
                                 KVS_REDIS_MAX_TIMEOUT_MS, (long long)json_integer_value(t));
        }
        o.timeout_ms = (unsigned)json_integer_value(t);
    }
    rc = kvs_kwargs_get_positive_int(spec, "redis", "connections",
                                     KVS_REDIS_DEFAULT_CONNECTIONS, &o.connections);
    if (rc == KVS_OK) rc = kvs_redis_adapter_create(&o, out);
    free(list);
    return rc;
}
