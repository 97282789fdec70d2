/* redis_work.c - running a run of keys (a slice on a worker, or a
 * synchronous call): each key's commands are routed to its node (a
 * redirection, else the slot map, else the only server), pipelined per
 * node, and followed through MOVED / ASK, until every key has an outcome or
 * the run's deadline passes. See redis_adapter.h. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "kvserde/error.h"
#include "kvserde/l2_fs.h"
#include "l2/lock_table.h"
#include "l2/redis_adapter.h"
#include "l2/redis_cluster.h"
#include "l2/redis_conn.h"

#define MAX_REDIRECTS 5 /* per key and task */

static const char *const op_name[] = {"store", "lookup", "load", "delete", "size query"};

static void work_fail(rwork *w, size_t i, int status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Record key i's failure; the lowest key index wins. */
static void work_fail(rwork *w, size_t i, int status, const char *fmt, ...)
{
    if (w->status != KVS_OK && w->err_index <= i) return;
    w->status = status;
    w->err_index = i;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->message, sizeof w->message, fmt, ap);
    va_end(ap);
}


/* Per-key state of a run (index: key - begin). */
typedef struct kstate {
    char *rkey;           /* prefix + path */
    size_t rkey_len;
    unsigned slot;
    int redirect;         /* node to use next round (MOVED / ASK), or -1 */
    int asking;           /* send ASKING first */
    int redirects;
    char *lost_err;       /* set when retried once after a kept connection
                           * broke: that error is the one reported */
    int node;             /* this round's node */
    int pipe;             /* this round's pipe */
    size_t first_cmd;     /* this round's first command in the pipe */
    char last_redirect[KVS_REDIS_ADDR_MAX];
} kstate;

static int op_ncmds(rop op) { return op == OP_SIZES ? 2 : 1; }

/* Build key k's commands into p (ASKING first if asked to). */
static int build_key_cmds(const rwork *w, const kstate *ks, size_t i, rpipe *p)
{
    static const char *const names[] = {"SET", "EXISTS", "GET", "DEL", "EXISTS"};
    if (ks->asking) {
        const char *a[] = {"ASKING"};
        if (kvs_redis_cmd_words(&p->cmds[p->ncmds++], 1, a) != 0) return -1;
    }
    const char *argv[3] = {names[w->op], ks->rkey, NULL};
    size_t lens[3] = {strlen(names[w->op]), ks->rkey_len, 0};
    int argc = 2;
    if (w->op == OP_STORE) {
        const kvs_memobj *obj = w->objects[i];
        argv[2] = obj->data;
        lens[2] = kvs_memobj_size(obj);
        if (lens[2] == 0) argv[2] = "";
        argc = 3;
    }
    if (kvs_redis_cmd_build(&p->cmds[p->ncmds++], argc, argv, lens) != 0) return -1;
    if (p->dest) p->dest[p->ncmds - 1] = w->objects[i]; /* a load's GET */
    if (w->op == OP_SIZES) {
        const char *s[] = {"STRLEN", ks->rkey};
        size_t sl[] = {6, ks->rkey_len};
        if (kvs_redis_cmd_build(&p->cmds[p->ncmds++], 2, s, sl) != 0) return -1;
    }
    return 0;
}

/* An error reply to key i: KVS_ENOSPC for Redis's OOM, else KVS_EIO. */
static void fail_reply(redis_adapter *r, rwork *w, size_t i, const rnode *nd,
                       const redisReply *rep)
{
    int status = strncmp(rep->str, "OOM ", 4) == 0 ? KVS_ENOSPC : KVS_EIO;
    char msg[KVS_ERROR_MSG_MAX];
    kvs_redis_msgf(msg, sizeof msg, "%s: %s", nd->addr, rep->str);
    kvs_redis_count_error(r, msg);
    work_fail(w, i, status, "redis: %s of key %zu: %s", op_name[w->op], i, msg);
}

static void fail_unexpected(redis_adapter *r, rwork *w, size_t i, const rnode *nd,
                            const redisReply *rep)
{
    char msg[KVS_REDIS_ERR_MAX];
    kvs_redis_msgf(msg, sizeof msg, "%s: unexpected reply of type %d", nd->addr, rep->type);
    kvs_redis_count_error(r, msg);
    work_fail(w, i, KVS_EIO, "redis: %s of key %zu: %s", op_name[w->op], i, msg);
}

/* Key i's (non-redirect) replies. A load's GET answered with a bulk
 * string has no reply object (rep[0] is NULL): lo says what became of it. */
static void handle_replies(redis_adapter *r, rwork *w, size_t i, const kstate *ks,
                           const rnode *nd, redisReply **rep, const lout *lo)
{
    for (int j = 0; j < op_ncmds(w->op); j++) {
        if (rep[j] != NULL && rep[j]->type == REDIS_REPLY_ERROR) {
            fail_reply(r, w, i, nd, rep[j]);
            return;
        }
    }
    const redisReply *a = rep[0];
    switch (w->op) {
    case OP_STORE:
        if (a->type != REDIS_REPLY_STATUS) break;
        w->bytes += kvs_memobj_size(w->objects[i]);
        return;
    case OP_LOOKUP:
        if (a->type != REDIS_REPLY_INTEGER) break;
        if (a->integer > 0) {
            pthread_mutex_lock(&r->lock_mu);
            int rc = kvs_l2_lock_table_add(&r->locks, ks->rkey + r->prefix_len);
            pthread_mutex_unlock(&r->lock_mu);
            if (rc != 0)
                work_fail(w, i, KVS_ENOMEM, "redis: lookup of key %zu: out of memory for its "
                          "lock", i);
            else
                w->hit[i] = 1;
        }
        return;
    case OP_LOAD: {
        if (a != NULL) {
            if (a->type == REDIS_REPLY_NIL) {
                work_fail(w, i, KVS_ENOTFOUND, "redis: load of key %zu: not found", i);
                return;
            }
            break; /* a string is never a reply object here (pipe_read_load) */
        }
        kvs_memobj *obj = w->objects[i];
        switch (lo->kind) {
        case LOUT_WRONG_SIZE:
            work_fail(w, i, KVS_ECORRUPT,
                      "redis: load of key %zu: stored object is %llu bytes, destination "
                      "layout needs %llu",
                      i, (unsigned long long)lo->len, (unsigned long long)lo->need);
            return;
        case LOUT_TOO_BIG:
            work_fail(w, i, KVS_ENOSPC,
                      "redis: load of key %zu: stored object is %llu bytes, destination "
                      "holds %zu",
                      i, (unsigned long long)lo->len, obj->capacity);
            return;
        default: /* LOUT_PLACED: the value is in obj already */
            (void)kvs_memobj_set_used_size(obj, (size_t)lo->len); /* fits: load_header */
            w->hit[i] = 1;
            return;
        }
    }
    case OP_DELETE:
        if (a->type != REDIS_REPLY_INTEGER) break;
        w->hit[i] = a->integer > 0;
        return;
    case OP_SIZES:
        if (a->type != REDIS_REPLY_INTEGER || rep[1]->type != REDIS_REPLY_INTEGER) break;
        w->sizes[i] = a->integer > 0 ? rep[1]->integer : -1;
        return;
    }
    fail_unexpected(r, w, i, nd, a);
}

/* Run w's keys: route, pipeline per node, follow redirections, until every
 * key has an outcome or the deadline passes. */
void kvs_redis_run_work(redis_adapter *r, connset *cs, rwork *w, int64_t deadline)
{
    size_t n = w->end - w->begin;
    if (n == 0) return;
    const char *opn = op_name[w->op];
    kstate *ks = calloc(n, sizeof *ks);
    size_t *pending = calloc(n, sizeof *pending);
    size_t *next = calloc(n, sizeof *next);
    rpipe *pipes = calloc(n, sizeof *pipes);
    int oom = ks == NULL || pending == NULL || next == NULL || pipes == NULL;
    char path[KVS_FS_KEY_PATH_MAX];
    for (size_t k = 0; !oom && k < n; k++) {
        /* Keys were validated at submit, and the buffer holds any path. */
        (void)kvs_fs_key_path(&w->keys[w->begin + k], path, sizeof path);
        size_t plen = strlen(path);
        ks[k].rkey = malloc(r->prefix_len + plen + 1);
        if (ks[k].rkey == NULL) {
            oom = 1;
            break;
        }
        memcpy(ks[k].rkey, r->prefix, r->prefix_len);
        memcpy(ks[k].rkey + r->prefix_len, path, plen + 1);
        ks[k].rkey_len = r->prefix_len + plen;
        ks[k].slot = r->cluster ? kvs_redis_key_slot(ks[k].rkey, ks[k].rkey_len) : 0;
        ks[k].redirect = -1;
    }
    if (oom) {
        for (size_t k = 0; k < n; k++)
            work_fail(w, w->begin + k, KVS_ENOMEM, "redis: %s of key %zu: out of memory",
                      opn, w->begin + k);
        goto out;
    }

    size_t npending = 0;
    for (size_t k = 0; k < n; k++)
        if (w->skip == NULL || !w->skip[w->begin + k]) pending[npending++] = k;
    char err[KVS_REDIS_ERR_MAX];
    while (npending > 0) {
        /* Route: a redirection, else the slot map, else the only server. */
        if (r->cluster && kvs_redis_ensure_map(r, cs, deadline, err, sizeof err) != 0) {
            for (size_t j = 0; j < npending; j++)
                work_fail(w, w->begin + pending[j], KVS_EIO,
                          "redis: %s of key %zu: cluster: cannot read the slot map: %s", opn,
                          w->begin + pending[j], err);
            break;
        }
        size_t npipes = 0, nnext = 0;
        pthread_mutex_lock(&r->map_mu);
        for (size_t j = 0; j < npending; j++) {
            kstate *s = &ks[pending[j]];
            s->node = s->redirect >= 0 ? s->redirect : r->cluster ? r->slots[s->slot] : 0;
        }
        pthread_mutex_unlock(&r->map_mu);
        for (size_t j = 0; j < npending; j++) {
            size_t k = pending[j];
            kstate *s = &ks[k];
            if (s->node == (int)KVS_REDIS_NO_NODE) {
                char msg[KVS_REDIS_ERR_MAX];
                kvs_redis_msgf(msg, sizeof msg, "cluster: slot %u is not served by any node",
                               s->slot);
                kvs_redis_count_error(r, msg);
                work_fail(w, w->begin + k, KVS_EIO, "redis: %s of key %zu: %s", opn,
                          w->begin + k, msg);
                s->pipe = -1;
                continue;
            }
            size_t p = 0;
            while (p < npipes && pipes[p].node != s->node) p++;
            if (p == npipes) {
                memset(&pipes[p], 0, sizeof pipes[p]);
                pipes[p].node = s->node;
                pipes[p].nd = kvs_redis_node_get(r, s->node);
                npipes++;
            }
            s->pipe = (int)p;
            pipes[p].ncmds += (size_t)(op_ncmds(w->op) + s->asking); /* counted first */
        }
        /* Connect and build each node's commands. */
        for (size_t p = 0; p < npipes; p++) {
            size_t want = pipes[p].ncmds;
            pipes[p].ncmds = 0;
            int ok = (w->op == OP_LOAD ? kvs_redis_pipe_alloc_load(&pipes[p], want)
                                       : kvs_redis_pipe_alloc(&pipes[p], want)) == 0;
            for (size_t j = 0; ok && j < npending; j++) {
                kstate *s = &ks[pending[j]];
                if (s->pipe != (int)p) continue;
                s->first_cmd = pipes[p].ncmds;
                ok = build_key_cmds(w, s, w->begin + pending[j], &pipes[p]) == 0;
            }
            if (!ok) {
                kvs_redis_msgf(pipes[p].err, sizeof pipes[p].err, "%s: out of memory",
                         pipes[p].nd->addr);
                pipes[p].state = PIPE_FAILED;
                continue;
            }
            pipes[p].c = kvs_redis_conn_get(r, cs, pipes[p].node, deadline, 0, &pipes[p].reused,
                                  pipes[p].err, sizeof pipes[p].err);
            if (pipes[p].c == NULL) pipes[p].state = PIPE_FAILED;
        }
        kvs_redis_run_pipes(r, pipes, npipes, cs->rbuf, deadline);
        for (size_t p = 0; p < npipes; p++)
            if (pipes[p].state == PIPE_FAILED && pipes[p].c != NULL)
                kvs_redis_conn_drop(r, cs, pipes[p].node, pipes[p].err);

        /* Outcomes. */
        for (size_t j = 0; j < npending; j++) {
            size_t k = pending[j], i = w->begin + k;
            kstate *s = &ks[k];
            if (s->pipe < 0) continue;
            rpipe *p = &pipes[s->pipe];
            size_t first = s->first_cmd, count = (size_t)(op_ncmds(w->op) + s->asking);
            int was_asking = s->asking;
            s->asking = 0;
            if (p->nreplies < first + count) {
                /* A kept connection the server had closed (a restart we could
                 * not see yet): try once more on a new one. */
                if (p->lost && p->reused && p->nreplies == 0 && s->lost_err == NULL &&
                    (s->lost_err = strdup(p->err)) != NULL) {
                    s->asking = was_asking;
                    next[nnext++] = k;
                    continue;
                }
                work_fail(w, i, KVS_EIO, "redis: %s of key %zu: %s", opn, i,
                          s->lost_err ? s->lost_err : p->err);
                continue;
            }
            redisReply **rep = &p->replies[first];
            const lout *lo = p->outs ? &p->outs[first] : NULL;
            if (count > (size_t)op_ncmds(w->op)) { /* the ASKING reply (never a bulk string) */
                if (rep[0]->type == REDIS_REPLY_ERROR) {
                    fail_reply(r, w, i, p->nd, rep[0]);
                    continue;
                }
                rep++;
                if (lo) lo++;
            }
            /* A redirection of any of the key's commands moves the key. */
            kvs_redis_redirect rd;
            kvs_redis_redirect_kind kind = KVS_REDIS_NOT_REDIRECT;
            for (int c = 0; c < op_ncmds(w->op) && kind == KVS_REDIS_NOT_REDIRECT; c++)
                if (r->cluster && rep[c] != NULL && rep[c]->type == REDIS_REPLY_ERROR)
                    kind = kvs_redis_parse_redirect(rep[c]->str, rep[c]->len, &rd);
            if (kind == KVS_REDIS_NOT_REDIRECT) {
                s->redirect = -1;
                handle_replies(r, w, i, s, p->nd, rep, lo);
                continue;
            }
            int target = kvs_redis_node_find_or_add(r, rd.host[0] ? rd.host : p->nd->host, rd.port);
            kvs_redis_format_addr(rd.host[0] ? rd.host : p->nd->host, rd.port,
                                  s->last_redirect, sizeof s->last_redirect);
            pthread_mutex_lock(&r->state_mu);
            if (kind == KVS_REDIS_MOVED) r->moved++;
            else r->asked++;
            pthread_mutex_unlock(&r->state_mu);
            if (target < 0) {
                work_fail(w, i, KVS_ENOMEM, "redis: %s of key %zu: too many nodes (%d)", opn,
                          i, KVS_REDIS_MAX_NODES);
                continue;
            }
            if (++s->redirects > MAX_REDIRECTS) {
                char msg[KVS_REDIS_ERR_MAX + 64];
                kvs_redis_msgf(msg, sizeof msg, "too many redirections (last: %s)",
                         s->last_redirect);
                kvs_redis_count_error(r, msg);
                work_fail(w, i, KVS_EIO, "redis: %s of key %zu: %s", opn, i, msg);
                continue;
            }
            if (kind == KVS_REDIS_MOVED) kvs_redis_map_moved(r, rd.slot, target);
            s->redirect = target;
            s->asking = kind == KVS_REDIS_ASK;
            next[nnext++] = k;
        }
        for (size_t p = 0; p < npipes; p++) kvs_redis_pipe_free(&pipes[p]);
        size_t *tmp = pending;
        pending = next;
        next = tmp;
        npending = nnext;
    }

out:
    for (size_t k = 0; ks && k < n; k++) {
        free(ks[k].rkey);
        free(ks[k].lost_err);
    }
    free(ks);
    free(pending);
    free(next);
    free(pipes);
}

