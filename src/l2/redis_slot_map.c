/* redis_slot_map.c - the Redis adapter's cluster slot map: which node
 * serves each of the 16384 hash slots, read from CLUSTER SLOTS (parsed by
 * redis_cluster.c) on first use and again after a MOVED made it stale; a
 * MOVED also points its slot at the new owner at once. Guarded by the
 * adapter's map_mu. See redis_adapter.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "l2/redis_adapter.h"
#include "l2/redis_cluster.h"
#include "l2/redis_conn.h"

/* Read CLUSTER SLOTS from the first node that answers (seeds first, then
 * nodes learnt since; nodes in backoff are not waited for) and install it.
 * 0, or -1 with the last node's error in err. */
static int refresh_map(redis_adapter *r, connset *cs, int64_t deadline, char *err,
                       size_t errsize)
{
    size_t n = kvs_redis_node_count(r);
    kvs_redis_msgf(err, errsize, "no node to ask");
    for (size_t i = 0; i < n; i++) {
        rnode *nd = kvs_redis_node_get(r, (int)i);
        int reused;
        redisContext *c = kvs_redis_conn_get(r, cs, (int)i, deadline, 1, &reused, err, errsize);
        if (c == NULL) continue;
        rpipe p = {0};
        p.node = (int)i;
        p.nd = nd;
        p.c = c;
        p.reused = reused;
        const char *argv[] = {"CLUSTER", "SLOTS"};
        if (kvs_redis_pipe_alloc(&p, 1) != 0 || kvs_redis_cmd_words(&p.cmds[0], 2, argv) != 0) {
            kvs_redis_pipe_free(&p);
            kvs_redis_msgf(err, errsize, "%s: out of memory", nd->addr);
            return -1;
        }
        p.ncmds = 1;
        kvs_redis_run_pipes(r, &p, 1, cs->rbuf, deadline);
        if (p.state == PIPE_FAILED) {
            kvs_redis_msgf(err, errsize, "%s", p.err);
            kvs_redis_conn_drop(r, cs, (int)i, p.err);
            kvs_redis_pipe_free(&p);
            continue;
        }
        const redisReply *rep = p.replies[0];
        kvs_redis_slot_range *ranges = NULL;
        size_t nranges = 0;
        char why[KVS_REDIS_ERR_MAX];
        if (rep->type == REDIS_REPLY_ERROR) {
            kvs_redis_msgf(err, errsize, "%s: CLUSTER SLOTS: %s", nd->addr, rep->str);
            kvs_redis_count_error(r, err);
            kvs_redis_pipe_free(&p);
            continue;
        }
        if (kvs_redis_parse_cluster_slots(rep, nd->host, &ranges, &nranges, why,
                                          sizeof why) != 0) {
            kvs_redis_msgf(err, errsize, "%s: CLUSTER SLOTS: malformed reply: %s", nd->addr, why);
            kvs_redis_count_error(r, err);
            kvs_redis_pipe_free(&p);
            continue;
        }
        kvs_redis_pipe_free(&p);
        uint16_t *map = malloc(sizeof r->slots);
        if (map == NULL) {
            free(ranges);
            kvs_redis_msgf(err, errsize, "out of memory for the slot map");
            return -1;
        }
        for (size_t s = 0; s < KVS_REDIS_SLOTS; s++) map[s] = KVS_REDIS_NO_NODE;
        int ok = 1;
        for (size_t k = 0; k < nranges && ok; k++) {
            int node = kvs_redis_node_find_or_add(r, ranges[k].host, ranges[k].port);
            if (node < 0) {
                ok = 0;
                break;
            }
            for (unsigned s = ranges[k].start; s <= ranges[k].end; s++) map[s] = (uint16_t)node;
        }
        free(ranges);
        if (!ok) {
            free(map);
            kvs_redis_msgf(err, errsize, "%s: CLUSTER SLOTS: too many nodes or out of memory",
                     nd->addr);
            return -1;
        }
        pthread_mutex_lock(&r->map_mu);
        memcpy(r->slots, map, sizeof r->slots);
        r->map_valid = 1;
        r->map_stale = 0;
        pthread_mutex_unlock(&r->map_mu);
        free(map);
        pthread_mutex_lock(&r->state_mu);
        r->refreshes++;
        pthread_mutex_unlock(&r->state_mu);
        return 0;
    }
    return -1;
}

int kvs_redis_ensure_map(redis_adapter *r, connset *cs, int64_t deadline, char *err,
                      size_t errsize)
{
    pthread_mutex_lock(&r->map_mu);
    int valid = r->map_valid, stale = r->map_stale;
    pthread_mutex_unlock(&r->map_mu);
    if (valid && !stale) return 0;
    if (refresh_map(r, cs, deadline, err, errsize) == 0) return 0;
    return valid ? 0 : -1;
}


void kvs_redis_map_moved(redis_adapter *r, unsigned slot, int target)
{
    pthread_mutex_lock(&r->map_mu);
    r->slots[slot] = (uint16_t)target;
    r->map_stale = 1;
    pthread_mutex_unlock(&r->map_mu);
}
