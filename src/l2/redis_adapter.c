/* redis_adapter.c - the "redis" L2 adapter (kvserde/l2_redis.h): objects
 * stored as Redis string values under prefix + kvs_fs_key_path(key), on one
 * server or a Redis Cluster, through hiredis.
 *
 * What hiredis does and what this file does. hiredis parses replies (the
 * redisReader of each connection's redisContext, made with redisConnectFd),
 * except a load's bulk strings: pipe_read_load reads those itself, with
 * redis_bulk.h, straight from the socket into the destination objects
 * (hiredis would buffer a value whole, copy it into a reply, and this file
 * copy it again); the other replies to a load go to hiredis' reader whole.
 * This file connects and drives the sockets itself, non-blocking under
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
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

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
#include "l2/redis_bulk.h"
#include "l2/redis_cluster.h"

#define ERR_MAX 400              /* a node-level error ("127.0.0.1:6379: ...") */
#define ADDR_MAX (KVS_REDIS_HOST_MAX + 16)
#define MAX_NODES 4096           /* distinct node addresses one adapter tracks */
#define NO_NODE 0xffffu          /* slot map entry: no master serves the slot */
#define MAX_REDIRECTS 5          /* per key and task */
#define BACKOFF_FIRST_MS 10
#define BACKOFF_MAX_MS 250
#define READ_CHUNK KVS_REDIS_READ_CHUNK /* bytes read from a socket at a time */
#define IOV_BATCH 64             /* iovecs per sendmsg */
#define NS_PER_MS 1000000ll

/* ---------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------ */

/* One Redis server (a cluster node, or the single server). */
typedef struct rnode {
    char host[KVS_REDIS_HOST_MAX];
    int port;
    char addr[ADDR_MAX];     /* "host:port" for messages and status */
    /* guarded by the adapter's state_mu */
    int64_t next_attempt;    /* monotonic ns before which no connect is tried */
    unsigned backoff_ms;     /* the next failure's wait; 0 = none yet */
    unsigned open_conns;
    int failed;              /* the last connect failed or a connection broke */
    char last_error[ERR_MAX];
    char backoff_error[ERR_MAX]; /* the last failed connection attempt's */
} rnode;

/* The connections of one worker (or of the synchronous calls): at most one
 * per node, indexed by node. */
typedef struct connset {
    struct connset *next_free;
    redisContext **conns;
    size_t cap;
    char *rbuf;              /* READ_CHUNK bytes */
} connset;

typedef struct redis_adapter {
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
} redis_adapter;

/* What a run of keys does. */
typedef enum rop { OP_STORE, OP_LOOKUP, OP_LOAD, OP_DELETE, OP_SIZES } rop;

static const char *const op_name[] = {"store", "lookup", "load", "delete", "size query"};

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

/* One command: RESP text up to the last argument's bytes (head), then the
 * last argument sent from its own memory (a key, or a value: no copy), then
 * "\r\n". */
typedef struct resp_cmd {
    char *head;
    size_t head_len;
    const void *last;
    size_t last_len;
} resp_cmd;

/* What became of a bulk string reply to a load's GET (pipe_read_load). */
typedef enum lout_kind {
    LOUT_NONE,       /* not a bulk string: the reply is in replies[] */
    LOUT_PLACED,     /* the value is in its destination */
    LOUT_WRONG_SIZE, /* refused (read, dropped): not a KV-shaped destination's size */
    LOUT_TOO_BIG,    /* refused (read and dropped): over the destination's capacity */
} lout_kind;

typedef struct lout {
    lout_kind kind;
    uint64_t len;  /* the value's length */
    uint64_t need; /* LOUT_WRONG_SIZE: the layout's size */
} lout;

/* The commands for one node and their replies. */
typedef struct rpipe {
    int node;
    rnode *nd;
    redisContext *c;
    int reused;                 /* the connection was open before this pipe */
    resp_cmd *cmds;
    size_t ncmds;
    redisReply **replies;
    size_t nreplies;
    size_t wcmd, woff;          /* write cursor: command, and offset in it */
    int state;                  /* PIPE_* */
    int lost;                   /* failed because the connection closed */
    char err[ERR_MAX];          /* "<addr>: <reason>" once failed */
    /* Loads only (bulk != NULL): replies are read by pipe_read_load. */
    kvs_memobj **dest;          /* command j's destination (NULL: an ASKING) */
    lout *outs;                 /* command j's bulk string outcome; its replies[j] is NULL */
    kvs_redis_bulk *bulk;       /* the reply being read */
    int took_held;              /* the bytes hiredis' reader held were taken */
} rpipe;

enum { PIPE_RUNNING, PIPE_DONE, PIPE_FAILED };

static const struct kvs_l2_adapter_ops redis_ops;

static redis_adapter *redis_of(kvs_l2_adapter *a)
{
    return KVS_CONTAINER_OF(a, redis_adapter, base.adapter);
}

/* ---------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------ */

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

static void sleep_until(int64_t t)
{
    struct timespec ts = {(time_t)(t / 1000000000ll), (long)(t % 1000000000ll)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* Milliseconds from now to t, rounded up, at least 0. */
static int ms_until(int64_t t, int64_t now)
{
    if (t <= now) return 0;
    int64_t ms = (t - now + NS_PER_MS - 1) / NS_PER_MS;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

/* snprintf for messages, which may be cut to fit their buffer (by design:
 * a message holds a host name, a server's error text, ...). */
static void msgf(char *buf, size_t size, const char *format, ...)
    __attribute__((format(printf, 3, 4)));

static void msgf(char *buf, size_t size, const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    vsnprintf(buf, size, format, ap);
    va_end(ap);
}

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

/* Count an error for status (errors, last_error). */
static void count_error(redis_adapter *r, const char *msg)
{
    pthread_mutex_lock(&r->state_mu);
    r->errors++;
    msgf(r->last_error, sizeof r->last_error, "%s", msg);
    pthread_mutex_unlock(&r->state_mu);
}

/* ---------------------------------------------------------------------
 * Nodes
 * ------------------------------------------------------------------ */

/* The index of host:port, added if new; -1 if the table is full or out of
 * memory. Caller holds state_mu. */
static int node_find_or_add_locked(redis_adapter *r, const char *host, int port)
{
    for (size_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i]->port == port && strcmp(r->nodes[i]->host, host) == 0)
            return (int)i;
    if (r->nnodes == MAX_NODES || strlen(host) >= KVS_REDIS_HOST_MAX) return -1;
    if (r->nnodes == r->nodes_cap) {
        size_t cap = r->nodes_cap ? 2 * r->nodes_cap : 8;
        rnode **nn = realloc(r->nodes, cap * sizeof *nn);
        if (nn == NULL) return -1;
        r->nodes = nn;
        r->nodes_cap = cap;
    }
    rnode *nd = calloc(1, sizeof *nd);
    if (nd == NULL) return -1;
    msgf(nd->host, sizeof nd->host, "%s", host);
    nd->port = port;
    kvs_redis_format_addr(host, port, nd->addr, sizeof nd->addr);
    r->nodes[r->nnodes] = nd;
    return (int)r->nnodes++;
}

static int node_find_or_add(redis_adapter *r, const char *host, int port)
{
    pthread_mutex_lock(&r->state_mu);
    int i = node_find_or_add_locked(r, host, port);
    pthread_mutex_unlock(&r->state_mu);
    return i;
}

static rnode *node_get(redis_adapter *r, int i)
{
    pthread_mutex_lock(&r->state_mu);
    rnode *nd = r->nodes[i];
    pthread_mutex_unlock(&r->state_mu);
    return nd;
}

static size_t node_count(redis_adapter *r)
{
    pthread_mutex_lock(&r->state_mu);
    size_t n = r->nnodes;
    pthread_mutex_unlock(&r->state_mu);
    return n;
}

/* A connection attempt failed: back off and remember why. */
static void node_connect_failed(redis_adapter *r, rnode *nd, const char *msg)
{
    pthread_mutex_lock(&r->state_mu);
    nd->failed = 1;
    msgf(nd->last_error, sizeof nd->last_error, "%s", msg);
    msgf(nd->backoff_error, sizeof nd->backoff_error, "%s", msg);
    nd->backoff_ms = nd->backoff_ms ? nd->backoff_ms * 2 : BACKOFF_FIRST_MS;
    if (nd->backoff_ms > BACKOFF_MAX_MS) nd->backoff_ms = BACKOFF_MAX_MS;
    nd->next_attempt = now_ns() + (int64_t)nd->backoff_ms * NS_PER_MS;
    r->errors++;
    msgf(r->last_error, sizeof r->last_error, "%s", msg);
    pthread_mutex_unlock(&r->state_mu);
}

static void node_connected(redis_adapter *r, rnode *nd)
{
    pthread_mutex_lock(&r->state_mu);
    nd->failed = 0;
    nd->backoff_ms = 0;
    nd->next_attempt = 0;
    nd->open_conns++;
    pthread_mutex_unlock(&r->state_mu);
}

/* A connection to nd is closed; msg (may be NULL) says why it broke. */
static void node_conn_closed(redis_adapter *r, rnode *nd, const char *msg)
{
    pthread_mutex_lock(&r->state_mu);
    if (nd->open_conns) nd->open_conns--;
    if (msg) {
        nd->failed = 1;
        msgf(nd->last_error, sizeof nd->last_error, "%s", msg);
        r->errors++;
        msgf(r->last_error, sizeof r->last_error, "%s", msg);
    }
    pthread_mutex_unlock(&r->state_mu);
}

/* ---------------------------------------------------------------------
 * Commands and pipelines
 * ------------------------------------------------------------------ */

/* Format argv[0..argc) as a RESP array; the last argument is referenced,
 * not copied (it must outlive the command). -1 if out of memory. */
static int cmd_build(resp_cmd *c, int argc, const char *const *argv, const size_t *lens)
{
    size_t cap = 16 + 32 * (size_t)argc;
    for (int i = 0; i < argc - 1; i++) cap += lens[i];
    char *h = malloc(cap);
    if (h == NULL) return -1;
    size_t len = (size_t)snprintf(h, cap, "*%d\r\n", argc);
    for (int i = 0; i < argc - 1; i++) {
        len += (size_t)snprintf(h + len, cap - len, "$%zu\r\n", lens[i]);
        memcpy(h + len, argv[i], lens[i]);
        len += lens[i];
        memcpy(h + len, "\r\n", 2);
        len += 2;
    }
    len += (size_t)snprintf(h + len, cap - len, "$%zu\r\n", lens[argc - 1]);
    c->head = h;
    c->head_len = len;
    c->last = argv[argc - 1];
    c->last_len = lens[argc - 1];
    return 0;
}

/* A command of NUL-terminated words (the last one must outlive it). */
static int cmd_words(resp_cmd *c, int argc, const char *const *argv)
{
    size_t lens[4];
    for (int i = 0; i < argc; i++) lens[i] = strlen(argv[i]);
    return cmd_build(c, argc, argv, lens);
}

static size_t cmd_size(const resp_cmd *c) { return c->head_len + c->last_len + 2; }

static void pipe_fail(rpipe *p, int lost, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void pipe_fail(rpipe *p, int lost, const char *fmt, ...)
{
    char why[ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    char after[ERR_MAX]; /* "; the node was in backoff after: ..." (conn_get), or "" */
    msgf(after, sizeof after, "%s", p->err);
    msgf(p->err, sizeof p->err, "%s: %s%s", p->nd->addr, why, after);
    p->state = PIPE_FAILED;
    p->lost = lost;
}

/* Write as much of the pipe's commands as the socket takes. */
static void pipe_write(rpipe *p)
{
    static const char crlf[2] = {'\r', '\n'};
    while (p->wcmd < p->ncmds) {
        struct iovec iov[IOV_BATCH];
        int k = 0;
        size_t off = p->woff;
        for (size_t i = p->wcmd; i < p->ncmds && k + 3 <= IOV_BATCH; i++, off = 0) {
            const resp_cmd *c = &p->cmds[i];
            const struct { const void *b; size_t n; } part[3] = {
                {c->head, c->head_len}, {c->last, c->last_len}, {crlf, 2}};
            for (int j = 0; j < 3; j++) {
                if (off >= part[j].n) {
                    off -= part[j].n;
                    continue;
                }
                iov[k].iov_base = (char *)part[j].b + off;
                iov[k].iov_len = part[j].n - off;
                k++;
                off = 0;
            }
        }
        struct msghdr msg = {0};
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)k;
        ssize_t w = sendmsg(p->c->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return;
            pipe_fail(p, errno == EPIPE || errno == ECONNRESET, "connection lost: %s",
                      strerror(errno));
            return;
        }
        /* Advance the cursor by w bytes. */
        size_t left = (size_t)w;
        while (left > 0 && p->wcmd < p->ncmds) {
            size_t rest = cmd_size(&p->cmds[p->wcmd]) - p->woff;
            if (left < rest) {
                p->woff += left;
                left = 0;
            } else {
                left -= rest;
                p->wcmd++;
                p->woff = 0;
            }
        }
    }
}

static void pipe_read_load(rpipe *p, char *buf);

/* Receive at most cap bytes into buf without blocking: how many came, or 0
 * when none are there now (EAGAIN) or the pipe failed (connection lost). */
static size_t pipe_recv(rpipe *p, void *buf, size_t cap)
{
    for (;;) {
        ssize_t n = recv(p->c->fd, buf, cap, MSG_DONTWAIT);
        if (n > 0) return (size_t)n;
        if (n == 0) {
            pipe_fail(p, 1, "connection lost: server closed the connection");
            return 0;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            pipe_fail(p, errno == ECONNRESET || errno == EPIPE, "connection lost: %s",
                      strerror(errno));
        return 0;
    }
}

/* Read what the socket has, and take the replies that are complete. */
static void pipe_read(rpipe *p, char *buf)
{
    if (p->bulk) {
        pipe_read_load(p, buf);
        return;
    }
    for (;;) {
        size_t n = pipe_recv(p, buf, READ_CHUNK);
        if (n == 0) return;
        if (redisReaderFeed(p->c->reader, buf, n) != REDIS_OK) {
            pipe_fail(p, 0, "out of memory reading a reply");
            return;
        }
        while (p->nreplies < p->ncmds) {
            void *rep = NULL;
            if (redisReaderGetReply(p->c->reader, &rep) != REDIS_OK) {
                pipe_fail(p, 0, "protocol error: %s", p->c->reader->errstr);
                return;
            }
            if (rep == NULL) break;
            p->replies[p->nreplies++] = rep;
        }
        if (p->nreplies == p->ncmds) {
            p->state = PIPE_DONE;
            return;
        }
    }
}

/* ---------------------------------------------------------------------
 * Loads: bulk string replies read straight into the destinations
 * ------------------------------------------------------------------ */

/* The reply to command p->nreplies has a bulk string header: refuse it
 * (its bytes are then read and dropped, the destination untouched, the
 * connection stays in step) or receive it into its destination. The size rules are l2.h's, checked
 * before a byte is written: a KV-shaped destination takes exactly its
 * layout's size (kvs_l2_load_wrong_size), any destination at most its
 * capacity. */
static void load_header(rpipe *p)
{
    size_t j = p->nreplies;
    kvs_memobj *obj = p->dest[j];
    lout *o = &p->outs[j];
    if (obj == NULL) {
        pipe_fail(p, 0, "protocol error: a bulk string reply to ASKING");
        return;
    }
    o->len = p->bulk->len;
    if (kvs_l2_load_wrong_size(obj, o->len, &o->need)) o->kind = LOUT_WRONG_SIZE;
    else if (o->len > obj->capacity) o->kind = LOUT_TOO_BIG;
    else o->kind = LOUT_PLACED;
    if (o->kind == LOUT_PLACED) kvs_redis_bulk_accept(p->bulk, obj->data);
    else kvs_redis_bulk_skip(p->bulk);
}

/* The reply to command p->nreplies is complete. A one-line reply (error,
 * redirection, nil, status, integer) goes through hiredis' reader, which
 * makes it a redisReply as for every other command (and words a protocol
 * error as before). */
static void load_reply_done(rpipe *p)
{
    const kvs_redis_bulk *b = p->bulk;
    if (!b->bulk) {
        redisReader *rd = p->c->reader;
        void *rep = NULL;
        if (redisReaderFeed(rd, b->line, b->line_len) != REDIS_OK) {
            pipe_fail(p, 0, "out of memory reading a reply");
            return;
        }
        if (redisReaderGetReply(rd, &rep) != REDIS_OK) {
            pipe_fail(p, 0, "protocol error: %s", rd->errstr);
            return;
        }
        if (rep == NULL) {
            pipe_fail(p, 0, "protocol error: an aggregate reply (type byte '%c') to a load",
                      b->line[0]);
            return;
        }
        p->replies[p->nreplies] = rep;
    }
    if (++p->nreplies == p->ncmds) p->state = PIPE_DONE;
    kvs_redis_bulk_reset(p->bulk);
}

/* Take n bytes read from the socket: the rest of the reply being read,
 * then the next ones. */
static void load_take(rpipe *p, const char *data, size_t n)
{
    for (;;) {
        if (n > 0 && p->state != PIPE_RUNNING) {
            pipe_fail(p, 0, "protocol error: bytes after the last reply");
            return;
        }
        size_t k = kvs_redis_bulk_feed(p->bulk, data, n);
        data += k;
        n -= k;
        switch (p->bulk->state) {
        case KVS_RB_HEADER:
            load_header(p);
            if (p->state == PIPE_FAILED) return;
            break;
        case KVS_RB_DONE:
            load_reply_done(p);
            if (p->state == PIPE_FAILED) return;
            break;
        case KVS_RB_ERROR:
            pipe_fail(p, 0, "protocol error: %s", p->bulk->err);
            return;
        default: /* every byte taken, the reply goes on */
            return;
        }
        if (n == 0 && p->bulk->state == KVS_RB_LINE) return;
    }
}

/* Read a load pipe's replies (its GETs, and an ASKING before a redirected
 * one) with no copy of the values: the one place where a bulk reply is
 * read into a buffer. Each reply's first line is parsed here
 * (kvs_redis_bulk, redis_bulk.h); a value's length is checked against its
 * destination before a byte of it is written (load_header); then while
 * KVS_REDIS_DIRECT_MIN bytes or more of the value are still to come they
 * are recv()d straight into the destination, the rest (the tail, the CRLF,
 * the next replies' lines, small values) through buf and copied from
 * there. Bytes hiredis' reader held from earlier replies (none, normally:
 * a pipe reads every reply it asked for, or its connection is dropped) are
 * taken first. Timeouts and a lost connection are run_pipes' and
 * pipe_fail's, as for every pipe: the connection is then dropped. */
static void pipe_read_load(rpipe *p, char *buf)
{
    redisReader *rd = p->c->reader;
    if (!p->took_held) {
        p->took_held = 1;
        if (rd->err || rd->ridx != -1) {
            pipe_fail(p, 0, "protocol error: a reply left half read");
            return;
        }
        size_t held = rd->len - rd->pos;
        if (held > 0) {
            char *copy = malloc(held); /* rd->buf moves when lines are fed back */
            if (copy == NULL) {
                pipe_fail(p, 0, "out of memory reading a reply");
                return;
            }
            memcpy(copy, rd->buf + rd->pos, held);
            rd->pos = rd->len; /* all taken */
            load_take(p, copy, held);
            free(copy);
            if (p->state != PIPE_RUNNING) return;
        }
    }
    for (;;) {
        void *where = NULL;
        size_t want = kvs_redis_bulk_direct(p->bulk, &where);
        int direct = want >= KVS_REDIS_DIRECT_MIN;
        size_t n = pipe_recv(p, direct ? where : buf, direct ? want : READ_CHUNK);
        if (n == 0) return;
        if (direct) kvs_redis_bulk_advance(p->bulk, n);
        else load_take(p, buf, n);
        if (p->state != PIPE_RUNNING) return;
    }
}

/* Run every pipe to completion or failure, all at once, until deadline. A
 * failed pipe keeps the replies it got; its connection must be dropped. */
static void run_pipes(redis_adapter *r, rpipe *pipes, size_t n, char *buf, int64_t deadline)
{
    struct pollfd pfd[64];
    size_t idx[64];
    for (size_t i = 0; i < n; i++)
        if (pipes[i].state == PIPE_RUNNING && pipes[i].ncmds == 0) pipes[i].state = PIPE_DONE;
    for (;;) {
        size_t m = 0;
        int any = 0;
        for (size_t i = 0; i < n; i++) {
            if (pipes[i].state != PIPE_RUNNING) continue;
            any = 1;
            if (m == 64) continue; /* served in a later pass */
            short ev = POLLIN;
            if (pipes[i].wcmd < pipes[i].ncmds) ev |= POLLOUT;
            pfd[m].fd = pipes[i].c->fd;
            pfd[m].events = ev;
            pfd[m].revents = 0;
            idx[m++] = i;
        }
        if (!any) return;
        int64_t now = now_ns();
        if (now >= deadline) {
            for (size_t i = 0; i < n; i++)
                if (pipes[i].state == PIPE_RUNNING)
                    pipe_fail(&pipes[i], 0, "timed out after %u ms", r->timeout_ms);
            return;
        }
        int rc = poll(pfd, (nfds_t)m, ms_until(deadline, now));
        if (rc < 0) {
            if (errno == EINTR) continue;
            int err = errno;
            for (size_t i = 0; i < n; i++)
                if (pipes[i].state == PIPE_RUNNING)
                    pipe_fail(&pipes[i], 0, "poll: %s", strerror(err));
            return;
        }
        for (size_t j = 0; j < m; j++) {
            rpipe *p = &pipes[idx[j]];
            short re = pfd[j].revents;
            if (re == 0) continue;
            if ((re & POLLOUT) || ((re & (POLLERR | POLLHUP)) && p->wcmd < p->ncmds))
                pipe_write(p);
            if (p->state == PIPE_RUNNING && (re & (POLLIN | POLLERR | POLLHUP)))
                pipe_read(p, buf);
        }
    }
}

static void pipe_free(rpipe *p)
{
    for (size_t i = 0; i < p->ncmds; i++) free(p->cmds[i].head);
    for (size_t i = 0; i < p->nreplies; i++)
        if (p->replies[i]) freeReplyObject(p->replies[i]);
    free(p->cmds);
    free(p->replies);
    free(p->dest);
    free(p->outs);
    free(p->bulk);
    p->cmds = NULL;
    p->replies = NULL;
    p->dest = NULL;
    p->outs = NULL;
    p->bulk = NULL;
    p->ncmds = p->nreplies = 0;
}

/* Room for ncmds commands; -1 if out of memory. */
static int pipe_alloc(rpipe *p, size_t ncmds)
{
    p->cmds = calloc(ncmds ? ncmds : 1, sizeof *p->cmds);
    p->replies = calloc(ncmds ? ncmds : 1, sizeof *p->replies);
    if (p->cmds == NULL || p->replies == NULL) {
        free(p->cmds);
        free(p->replies);
        p->cmds = NULL;
        p->replies = NULL;
        return -1;
    }
    return 0;
}

/* A load pipe: room for ncmds commands, their destinations and outcomes,
 * and a reply reader; -1 if out of memory (nothing kept). */
static int pipe_alloc_load(rpipe *p, size_t ncmds)
{
    if (pipe_alloc(p, ncmds) != 0) return -1;
    p->dest = calloc(ncmds ? ncmds : 1, sizeof *p->dest);
    p->outs = calloc(ncmds ? ncmds : 1, sizeof *p->outs);
    p->bulk = malloc(sizeof *p->bulk);
    if (p->dest == NULL || p->outs == NULL || p->bulk == NULL) {
        pipe_free(p);
        return -1;
    }
    kvs_redis_bulk_reset(p->bulk);
    return 0;
}

/* ---------------------------------------------------------------------
 * Connections
 * ------------------------------------------------------------------ */

/* Make room for node i in the set; -1 if out of memory. */
static int connset_reserve(connset *cs, size_t i)
{
    if (i < cs->cap) return 0;
    size_t cap = cs->cap ? cs->cap : 4;
    while (cap <= i) cap *= 2;
    redisContext **nc = realloc(cs->conns, cap * sizeof *nc);
    if (nc == NULL) return -1;
    memset(nc + cs->cap, 0, (cap - cs->cap) * sizeof *nc);
    cs->conns = nc;
    cs->cap = cap;
    return 0;
}

/* Close the set's connection to node i (if any); msg says why it broke
 * (NULL: closed on purpose). */
static void conn_drop(redis_adapter *r, connset *cs, int i, const char *msg)
{
    if ((size_t)i >= cs->cap || cs->conns[i] == NULL) return;
    redisFree(cs->conns[i]);
    cs->conns[i] = NULL;
    node_conn_closed(r, node_get(r, i), msg);
}

static void connset_close_all(redis_adapter *r, connset *cs)
{
    for (size_t i = 0; i < cs->cap; i++) conn_drop(r, cs, (int)i, NULL);
}

/* 1 if an idle connection has something to read (EOF after a server
 * restart, or junk): it cannot be used. */
static int conn_stale(redisContext *c)
{
    struct pollfd p = {c->fd, POLLIN, 0};
    int rc;
    do rc = poll(&p, 1, 0);
    while (rc < 0 && errno == EINTR);
    return rc != 0;
}

/* A non-blocking, close-on-exec TCP connection to nd, trying each address
 * of its host in turn until the deadline. The fd, or -1 with err set
 * ("127.0.0.1:6399: connect: Connection refused"). */
static int tcp_connect(const rnode *nd, int64_t deadline, unsigned timeout_ms, char *err,
                       size_t errsize)
{
    char port[8];
    msgf(port, sizeof port, "%d", nd->port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(nd->host, port, &hints, &res);
    if (gai != 0) {
        msgf(err, errsize, "%s: cannot resolve host: %s", nd->addr,
             gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    msgf(err, errsize, "%s: connect: no address", nd->addr);
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            msgf(err, errsize, "%s: socket: %s", nd->addr, strerror(errno));
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        int e = rc == 0 ? 0 : errno;
        if (e == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            for (;;) {
                int64_t now = now_ns();
                rc = now < deadline ? poll(&p, 1, ms_until(deadline, now)) : 0;
                if (rc >= 0 || errno != EINTR) break;
            }
            socklen_t len = sizeof e;
            if (rc == 0) {
                msgf(err, errsize, "%s: connect: timed out after %u ms", nd->addr, timeout_ms);
                close(fd);
                fd = -1;
                break; /* no time left for other addresses */
            }
            if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
        }
        if (e != 0) {
            msgf(err, errsize, "%s: connect: %s", nd->addr, strerror(e));
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0) {
        int one = 1; /* small commands go out at once */
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

/* AUTH / SELECT on a new connection. 0, or -1 with err set. */
static int conn_handshake(redis_adapter *r, rnode *nd, redisContext *c, char *buf,
                          int64_t deadline, char *err, size_t errsize)
{
    rpipe p = {0};
    p.nd = nd;
    p.c = c;
    char db[24];
    msgf(db, sizeof db, "%u", r->db);
    int auth = r->password != NULL, sel = r->db != 0;
    if (!auth && !sel) return 0;
    if (pipe_alloc(&p, 2) != 0) {
        msgf(err, errsize, "%s: out of memory", nd->addr);
        return -1;
    }
    int bad = 0;
    if (auth) {
        const char *a2[] = {"AUTH", r->password};
        const char *a3[] = {"AUTH", r->username, r->password}; /* an ACL user */
        bad |= r->username ? cmd_words(&p.cmds[p.ncmds++], 3, a3)
                           : cmd_words(&p.cmds[p.ncmds++], 2, a2);
    }
    if (sel) {
        const char *s[] = {"SELECT", db};
        bad |= cmd_words(&p.cmds[p.ncmds++], 2, s);
    }
    int rc = 0;
    if (bad) {
        msgf(err, errsize, "%s: out of memory", nd->addr);
        rc = -1;
    } else {
        run_pipes(r, &p, 1, buf, deadline);
        if (p.state == PIPE_FAILED) {
            msgf(err, errsize, "%s", p.err);
            rc = -1;
        }
        for (size_t i = 0; rc == 0 && i < p.nreplies; i++) {
            const redisReply *rep = p.replies[i];
            if (rep->type == REDIS_REPLY_ERROR) {
                msgf(err, errsize, "%s: %s: %s", nd->addr,
                         auth && i == 0 ? "AUTH" : "SELECT", rep->str);
                rc = -1;
            }
        }
    }
    pipe_free(&p);
    return rc;
}

/* One connection attempt to nd: connect, then AUTH / SELECT. NULL with err
 * set (and the node's backoff grown) if it fails. */
static redisContext *conn_open(redis_adapter *r, rnode *nd, char *buf, int64_t deadline,
                               char *err, size_t errsize)
{
    int fd = tcp_connect(nd, deadline, r->timeout_ms, err, errsize);
    redisContext *c = fd < 0 ? NULL : redisConnectFd(fd); /* takes fd: redisFree closes it */
    if (fd >= 0 && (c == NULL || c->err)) {
        msgf(err, errsize, "%s: out of memory", nd->addr);
        if (c) redisFree(c);
        else close(fd);
        c = NULL;
    } else if (c != NULL && conn_handshake(r, nd, c, buf, deadline, err, errsize) != 0) {
        redisFree(c);
        c = NULL;
    }
    if (c == NULL) node_connect_failed(r, nd, err);
    return c;
}

/* The set's connection to node i, opened if needed. NULL with err set if
 * there is none. *reused: it was open already.
 * A node whose last connection attempt failed is in backoff; its next
 * attempt is scheduled. With no_wait a task fails at once until then.
 * Otherwise it waits for that attempt, but never past the last point where
 * an attempt still fits (half of timeout_ms before the deadline: the time
 * a final attempt gets), so a server back within the task's time serves
 * it rather than the task failing unheard. A task that then fails with
 * another error than the one that put the node in backoff names that one
 * too (the wait or the little time left is otherwise unexplained; the same
 * error again would say nothing new): err
 * ends with "; the node was in backoff after: <error>", and holds just
 * that when the connection is made, for a failure on it to append
 * (pipe_fail). */
static redisContext *conn_get(redis_adapter *r, connset *cs, int i, int64_t deadline,
                              int no_wait, int *reused, char *err, size_t errsize)
{
    rnode *nd = node_get(r, i);
    *reused = 0;
    if (connset_reserve(cs, (size_t)i) != 0) {
        msgf(err, errsize, "%s: out of memory", nd->addr);
        return NULL;
    }
    if (cs->conns[i] != NULL) {
        if (!conn_stale(cs->conns[i])) {
            *reused = 1;
            return cs->conns[i];
        }
        conn_drop(r, cs, i, NULL); /* closed while idle: a restart; reconnect */
    }
    pthread_mutex_lock(&r->state_mu);
    int64_t next = nd->next_attempt;
    int in_backoff = nd->backoff_ms != 0; /* since a failed attempt, until a success */
    char last[ERR_MAX];
    msgf(last, sizeof last, "%s", nd->backoff_error);
    pthread_mutex_unlock(&r->state_mu);
    int64_t now = now_ns();
    if (next > now) {
        if (no_wait) {
            msgf(err, errsize, "%s (next attempt in %d ms)", last, ms_until(next, now));
            return NULL;
        }
        int64_t last_chance = deadline - (int64_t)r->timeout_ms * NS_PER_MS / 2;
        sleep_until(next < last_chance ? next : last_chance);
        now = now_ns();
    }
    redisContext *c = NULL;
    if (now >= deadline) {
        msgf(err, errsize, "%s: timed out after %u ms", nd->addr, r->timeout_ms);
        count_error(r, err);
    } else {
        c = conn_open(r, nd, cs->rbuf, deadline, err, errsize);
    }
    if (c != NULL) err[0] = '\0';
    if (in_backoff && strcmp(err, last) != 0) {
        size_t alen = strlen(nd->addr), len = strlen(err);
        const char *why = strncmp(last, nd->addr, alen) == 0 && strncmp(last + alen, ": ", 2) == 0
                              ? last + alen + 2
                              : last;
        msgf(err + len, errsize - len, "; the node was in backoff after: %s", why);
    }
    if (c == NULL) return NULL;
    cs->conns[i] = c;
    node_connected(r, nd);
    return c;
}

/* Take a connection set for a worker (there is always one: as many sets
 * as workers). */
static connset *connset_take(redis_adapter *r)
{
    pthread_mutex_lock(&r->sets_mu);
    connset *cs = r->free_sets;
    r->free_sets = cs->next_free;
    pthread_mutex_unlock(&r->sets_mu);
    return cs;
}

static void connset_put(redis_adapter *r, connset *cs)
{
    pthread_mutex_lock(&r->sets_mu);
    cs->next_free = r->free_sets;
    r->free_sets = cs;
    pthread_mutex_unlock(&r->sets_mu);
}

/* ---------------------------------------------------------------------
 * The cluster slot map
 * ------------------------------------------------------------------ */

/* Read CLUSTER SLOTS from the first node that answers (seeds first, then
 * nodes learnt since; nodes in backoff are not waited for) and install it.
 * 0, or -1 with the last node's error in err. */
static int refresh_map(redis_adapter *r, connset *cs, int64_t deadline, char *err,
                       size_t errsize)
{
    size_t n = node_count(r);
    msgf(err, errsize, "no node to ask");
    for (size_t i = 0; i < n; i++) {
        rnode *nd = node_get(r, (int)i);
        int reused;
        redisContext *c = conn_get(r, cs, (int)i, deadline, 1, &reused, err, errsize);
        if (c == NULL) continue;
        rpipe p = {0};
        p.node = (int)i;
        p.nd = nd;
        p.c = c;
        p.reused = reused;
        const char *argv[] = {"CLUSTER", "SLOTS"};
        if (pipe_alloc(&p, 1) != 0 || cmd_words(&p.cmds[0], 2, argv) != 0) {
            pipe_free(&p);
            msgf(err, errsize, "%s: out of memory", nd->addr);
            return -1;
        }
        p.ncmds = 1;
        run_pipes(r, &p, 1, cs->rbuf, deadline);
        if (p.state == PIPE_FAILED) {
            msgf(err, errsize, "%s", p.err);
            conn_drop(r, cs, (int)i, p.err);
            pipe_free(&p);
            continue;
        }
        const redisReply *rep = p.replies[0];
        kvs_redis_slot_range *ranges = NULL;
        size_t nranges = 0;
        char why[ERR_MAX];
        if (rep->type == REDIS_REPLY_ERROR) {
            msgf(err, errsize, "%s: CLUSTER SLOTS: %s", nd->addr, rep->str);
            count_error(r, err);
            pipe_free(&p);
            continue;
        }
        if (kvs_redis_parse_cluster_slots(rep, nd->host, &ranges, &nranges, why,
                                          sizeof why) != 0) {
            msgf(err, errsize, "%s: CLUSTER SLOTS: malformed reply: %s", nd->addr, why);
            count_error(r, err);
            pipe_free(&p);
            continue;
        }
        pipe_free(&p);
        uint16_t *map = malloc(sizeof r->slots);
        if (map == NULL) {
            free(ranges);
            msgf(err, errsize, "out of memory for the slot map");
            return -1;
        }
        for (size_t s = 0; s < KVS_REDIS_SLOTS; s++) map[s] = NO_NODE;
        int ok = 1;
        for (size_t k = 0; k < nranges && ok; k++) {
            int node = node_find_or_add(r, ranges[k].host, ranges[k].port);
            if (node < 0) {
                ok = 0;
                break;
            }
            for (unsigned s = ranges[k].start; s <= ranges[k].end; s++) map[s] = (uint16_t)node;
        }
        free(ranges);
        if (!ok) {
            free(map);
            msgf(err, errsize, "%s: CLUSTER SLOTS: too many nodes or out of memory",
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

/* Make sure a map is there (re-reading it if a MOVED made it stale). 0, or
 * -1 with err if there is no usable map; a failed re-read keeps the old
 * map (MOVED keys are routed by their redirection anyway). */
static int ensure_map(redis_adapter *r, connset *cs, int64_t deadline, char *err,
                      size_t errsize)
{
    pthread_mutex_lock(&r->map_mu);
    int valid = r->map_valid, stale = r->map_stale;
    pthread_mutex_unlock(&r->map_mu);
    if (valid && !stale) return 0;
    if (refresh_map(r, cs, deadline, err, errsize) == 0) return 0;
    return valid ? 0 : -1;
}

/* ---------------------------------------------------------------------
 * Running the keys of a slice or a synchronous call
 * ------------------------------------------------------------------ */

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
    char last_redirect[ADDR_MAX];
} kstate;

static int op_ncmds(rop op) { return op == OP_SIZES ? 2 : 1; }

/* Build key k's commands into p (ASKING first if asked to). */
static int build_key_cmds(const rwork *w, const kstate *ks, size_t i, rpipe *p)
{
    static const char *const names[] = {"SET", "EXISTS", "GET", "DEL", "EXISTS"};
    if (ks->asking) {
        const char *a[] = {"ASKING"};
        if (cmd_words(&p->cmds[p->ncmds++], 1, a) != 0) return -1;
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
    if (cmd_build(&p->cmds[p->ncmds++], argc, argv, lens) != 0) return -1;
    if (p->dest) p->dest[p->ncmds - 1] = w->objects[i]; /* a load's GET */
    if (w->op == OP_SIZES) {
        const char *s[] = {"STRLEN", ks->rkey};
        size_t sl[] = {6, ks->rkey_len};
        if (cmd_build(&p->cmds[p->ncmds++], 2, s, sl) != 0) return -1;
    }
    return 0;
}

/* An error reply to key i: KVS_ENOSPC for Redis's OOM, else KVS_EIO. */
static void fail_reply(redis_adapter *r, rwork *w, size_t i, const rnode *nd,
                       const redisReply *rep)
{
    int status = strncmp(rep->str, "OOM ", 4) == 0 ? KVS_ENOSPC : KVS_EIO;
    char msg[KVS_ERROR_MSG_MAX];
    msgf(msg, sizeof msg, "%s: %s", nd->addr, rep->str);
    count_error(r, msg);
    work_fail(w, i, status, "redis: %s of key %zu: %s", op_name[w->op], i, msg);
}

static void fail_unexpected(redis_adapter *r, rwork *w, size_t i, const rnode *nd,
                            const redisReply *rep)
{
    char msg[ERR_MAX];
    msgf(msg, sizeof msg, "%s: unexpected reply of type %d", nd->addr, rep->type);
    count_error(r, msg);
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
static void run_work(redis_adapter *r, connset *cs, rwork *w, int64_t deadline)
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
    char err[ERR_MAX];
    while (npending > 0) {
        /* Route: a redirection, else the slot map, else the only server. */
        if (r->cluster && ensure_map(r, cs, deadline, err, sizeof err) != 0) {
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
            if (s->node == (int)NO_NODE) {
                char msg[ERR_MAX];
                msgf(msg, sizeof msg, "cluster: slot %u is not served by any node", s->slot);
                count_error(r, msg);
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
                pipes[p].nd = node_get(r, s->node);
                npipes++;
            }
            s->pipe = (int)p;
            pipes[p].ncmds += (size_t)(op_ncmds(w->op) + s->asking); /* counted first */
        }
        /* Connect and build each node's commands. */
        for (size_t p = 0; p < npipes; p++) {
            size_t want = pipes[p].ncmds;
            pipes[p].ncmds = 0;
            int ok = (w->op == OP_LOAD ? pipe_alloc_load(&pipes[p], want)
                                       : pipe_alloc(&pipes[p], want)) == 0;
            for (size_t j = 0; ok && j < npending; j++) {
                kstate *s = &ks[pending[j]];
                if (s->pipe != (int)p) continue;
                s->first_cmd = pipes[p].ncmds;
                ok = build_key_cmds(w, s, w->begin + pending[j], &pipes[p]) == 0;
            }
            if (!ok) {
                msgf(pipes[p].err, sizeof pipes[p].err, "%s: out of memory",
                         pipes[p].nd->addr);
                pipes[p].state = PIPE_FAILED;
                continue;
            }
            pipes[p].c = conn_get(r, cs, pipes[p].node, deadline, 0, &pipes[p].reused,
                                  pipes[p].err, sizeof pipes[p].err);
            if (pipes[p].c == NULL) pipes[p].state = PIPE_FAILED;
        }
        run_pipes(r, pipes, npipes, cs->rbuf, deadline);
        for (size_t p = 0; p < npipes; p++)
            if (pipes[p].state == PIPE_FAILED && pipes[p].c != NULL)
                conn_drop(r, cs, pipes[p].node, pipes[p].err);

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
            int target = node_find_or_add(r, rd.host[0] ? rd.host : p->nd->host, rd.port);
            kvs_redis_format_addr(rd.host[0] ? rd.host : p->nd->host, rd.port,
                                  s->last_redirect, sizeof s->last_redirect);
            pthread_mutex_lock(&r->state_mu);
            if (kind == KVS_REDIS_MOVED) r->moved++;
            else r->asked++;
            pthread_mutex_unlock(&r->state_mu);
            if (target < 0) {
                work_fail(w, i, KVS_ENOMEM, "redis: %s of key %zu: too many nodes (%d)", opn,
                          i, MAX_NODES);
                continue;
            }
            if (++s->redirects > MAX_REDIRECTS) {
                char msg[ERR_MAX + 64];
                msgf(msg, sizeof msg, "too many redirections (last: %s)",
                         s->last_redirect);
                count_error(r, msg);
                work_fail(w, i, KVS_EIO, "redis: %s of key %zu: %s", opn, i, msg);
                continue;
            }
            if (kind == KVS_REDIS_MOVED) {
                pthread_mutex_lock(&r->map_mu);
                r->slots[rd.slot] = (uint16_t)target;
                r->map_stale = 1;
                pthread_mutex_unlock(&r->map_mu);
            }
            s->redirect = target;
            s->asking = kind == KVS_REDIS_ASK;
            next[nnext++] = k;
        }
        for (size_t p = 0; p < npipes; p++) pipe_free(&pipes[p]);
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

/* ---------------------------------------------------------------------
 * Worker side
 * ------------------------------------------------------------------ */

/* The batch runner's run(): this slice's keys as one run of run_work, on
 * a connection set of its own. */
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
    int64_t deadline = now_ns() + (int64_t)r->timeout_ms * NS_PER_MS;
    connset *cs = connset_take(r);
    if (w.op == OP_LOOKUP) pthread_rwlock_rdlock(&r->del_lock);
    run_work(r, cs, &w, deadline);
    if (w.op == OP_LOOKUP) pthread_rwlock_unlock(&r->del_lock);
    connset_put(r, cs);
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
    run_work(r, &r->sync_set, w, now_ns() + (int64_t)r->timeout_ms * NS_PER_MS);
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
    int64_t deadline = now_ns() + (int64_t)r->timeout_ms * NS_PER_MS;
    char err[ERR_MAX];
    int rc = KVS_OK;
    size_t npipes = 0;
    uint8_t *use = NULL;
    rpipe *pipes = NULL;
    if (r->cluster && ensure_map(r, cs, deadline, err, sizeof err) != 0) {
        rc = kvs_set_error(KVS_EIO, "redis: usage: cluster: cannot read the slot map: %s",
                           err);
        goto out;
    }
    /* The nodes to ask: the server, or every master in the slot map. */
    size_t nn = node_count(r);
    use = calloc(nn ? nn : 1, 1);
    pipes = calloc(nn ? nn : 1, sizeof *pipes);
    if (use == NULL || pipes == NULL) {
        rc = kvs_set_error(KVS_ENOMEM, "redis: out of memory reading usage");
        goto out;
    }
    if (r->cluster) {
        pthread_mutex_lock(&r->map_mu);
        for (size_t s = 0; s < KVS_REDIS_SLOTS; s++)
            if (r->slots[s] != NO_NODE && r->slots[s] < nn) use[r->slots[s]] = 1;
        pthread_mutex_unlock(&r->map_mu);
    } else {
        use[0] = 1;
    }
    for (size_t i = 0; i < nn && rc == KVS_OK; i++) {
        if (!use[i]) continue;
        rpipe *p = &pipes[npipes++];
        p->node = (int)i;
        p->nd = node_get(r, (int)i);
        const char *argv[] = {"INFO", "memory"};
        if (pipe_alloc(p, 1) != 0 || cmd_words(&p->cmds[0], 2, argv) != 0) {
            rc = kvs_set_error(KVS_ENOMEM, "redis: out of memory reading usage");
            break;
        }
        p->ncmds = 1;
        p->c = conn_get(r, cs, p->node, deadline, 0, &p->reused, p->err, sizeof p->err);
        if (p->c == NULL) rc = kvs_set_error(KVS_EIO, "redis: usage: %s", p->err);
    }
    if (rc == KVS_OK) {
        run_pipes(r, pipes, npipes, cs->rbuf, deadline);
        kvs_l2_usage u = {0, 0};
        int unbounded = 0;
        for (size_t j = 0; j < npipes && rc == KVS_OK; j++) {
            rpipe *p = &pipes[j];
            if (p->state == PIPE_FAILED) {
                conn_drop(r, cs, p->node, p->err);
                rc = kvs_set_error(KVS_EIO, "redis: usage: %s", p->err);
                break;
            }
            const redisReply *rep = p->replies[0];
            long long used = rep->type == REDIS_REPLY_STRING ? info_field(rep->str, "used_memory")
                                                             : -1;
            long long max = rep->type == REDIS_REPLY_STRING ? info_field(rep->str, "maxmemory")
                                                            : -1;
            if (used < 0 || max < 0) {
                msgf(err, sizeof err, "%s: INFO memory: %s", p->nd->addr,
                         rep->type == REDIS_REPLY_ERROR ? rep->str : "no used_memory/maxmemory");
                count_error(r, err);
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
    for (size_t j = 0; j < npipes; j++) pipe_free(&pipes[j]);
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
    for (unsigned i = 0; i < r->connections; i++) connset_close_all(r, &r->sets[i]);
    pthread_mutex_lock(&r->sync_mu);
    connset_close_all(r, &r->sync_set);
    r->sync_closed = 1;
    pthread_mutex_unlock(&r->sync_mu);
}

static void connset_free(redis_adapter *r, connset *cs)
{
    connset_close_all(r, cs);
    free(cs->conns);
    free(cs->rbuf);
}

static void rd_destroy(kvs_l2_adapter *a)
{
    redis_adapter *r = redis_of(a);
    kvs_l2_base_destroy(&r->base);
    for (unsigned i = 0; r->sets && i < r->connections; i++) connset_free(r, &r->sets[i]);
    connset_free(r, &r->sync_set);
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
    int64_t deadline = now_ns() + (int64_t)r->timeout_ms * NS_PER_MS;
    for (int attempt = 0;; attempt++) {
        rpipe p = {0};
        p.node = i;
        p.nd = node_get(r, i);
        p.c = conn_get(r, cs, i, deadline, 0, &p.reused, err, errsize);
        if (p.c == NULL) return NULL;
        const char *argv[] = {"SCAN", cursor, "MATCH", pattern, "COUNT", LIST_COUNT};
        size_t lens[6];
        for (int k = 0; k < 6; k++) lens[k] = strlen(argv[k]);
        if (pipe_alloc(&p, 1) != 0 || cmd_build(&p.cmds[0], 6, argv, lens) != 0) {
            pipe_free(&p);
            msgf(err, errsize, "%s: out of memory", p.nd->addr);
            return NULL;
        }
        p.ncmds = 1;
        run_pipes(r, &p, 1, cs->rbuf, deadline);
        if (p.state == PIPE_FAILED) {
            int retry = p.lost && p.reused && attempt == 0;
            msgf(err, errsize, "%s", p.err);
            conn_drop(r, cs, i, p.err);
            pipe_free(&p);
            if (retry) continue;
            count_error(r, err);
            return NULL;
        }
        redisReply *rep = p.replies[0];
        p.nreplies = 0; /* ours now */
        pipe_free(&p);
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

    char err[ERR_MAX];
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
               ensure_map(r, &r->sync_set, now_ns() + (int64_t)r->timeout_ms * NS_PER_MS,
                          err, sizeof err) != 0) {
        rc = kvs_set_error(KVS_EIO, "redis: list keys: cluster: cannot read the slot map: %s",
                           err);
    } else {
        nn = node_count(r);
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
            const char *addr = node_get(r, (int)i)->addr;
            const redisReply *names = rep->type == REDIS_REPLY_ARRAY && rep->elements == 2
                                          ? rep->element[1] : NULL;
            if (rep->type == REDIS_REPLY_ERROR) {
                msgf(err, sizeof err, "%s: SCAN: %s", addr, rep->str);
                rc = KVS_EIO;
            } else if (names == NULL || names->type != REDIS_REPLY_ARRAY ||
                       rep->element[0]->type != REDIS_REPLY_STRING ||
                       rep->element[0]->len == 0 || rep->element[0]->len >= sizeof cursor) {
                msgf(err, sizeof err, "%s: SCAN: malformed reply", addr);
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
                count_error(r, err);
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
 * URLs
 * ------------------------------------------------------------------ */

typedef struct redis_url {
    char host[KVS_REDIS_HOST_MAX];
    int port;
    unsigned db;
    char *username; /* percent-decoded; NULL if absent */
    char *password;
} redis_url;

/* The URL for messages: the password (between "user:" and '@') as "***". */
static void redact(const char *url, char *out, size_t size)
{
    const char *auth = strstr(url, "://");
    auth = auth ? auth + 3 : url;
    size_t alen = strcspn(auth, "/?#");
    const char *at = NULL;
    for (const char *p = auth; p < auth + alen; p++)
        if (*p == '@') at = p;
    const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    if (colon == NULL) {
        msgf(out, size, "%s", url);
        return;
    }
    msgf(out, size, "%.*s***%s", (int)(colon + 1 - url), url, at);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decode s[0..n) into a new string; NULL if malformed (*bad = 1)
 * or out of memory (*bad = 0). */
static char *pct_decode(const char *s, size_t n, int *bad)
{
    *bad = 0;
    char *out = malloc(n + 1);
    if (out == NULL) return NULL;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            out[len++] = s[i];
            continue;
        }
        int hi = i + 2 < n ? hexval(s[i + 1]) : -1;
        int lo = i + 2 < n ? hexval(s[i + 2]) : -1;
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) { /* "%00" would cut the string */
            free(out);
            *bad = 1;
            return NULL;
        }
        out[len++] = (char)(hi * 16 + lo);
        i += 2;
    }
    out[len] = '\0';
    return out;
}

static void url_free(redis_url *u)
{
    free(u->username);
    if (u->password) memset(u->password, 0, strlen(u->password));
    free(u->password);
    u->username = u->password = NULL;
}

static int bad_url(const char *url, const char *why)
{
    char shown[1024];
    redact(url, shown, sizeof shown);
    return kvs_set_error(KVS_EINVAL, "redis: bad URL '%s': %s", shown, why);
}

/* redis://[[user][:password]@]host[:port][/db] */
static int parse_url(const char *url, redis_url *u)
{
    memset(u, 0, sizeof *u);
    u->port = 6379;
    if (strncmp(url, "rediss://", 9) == 0)
        return bad_url(url, "TLS (rediss://) is not supported");
    if (strncmp(url, "redis://", 8) != 0) return bad_url(url, "must start with redis://");
    const char *auth = url + 8;
    if (strpbrk(auth, "?#") != NULL)
        return bad_url(url, "query and fragment are not supported");
    size_t alen = strcspn(auth, "/");
    const char *at = NULL;
    for (const char *p = auth; p < auth + alen; p++)
        if (*p == '@') at = p;
    const char *hp = auth;
    if (at != NULL) {
        const char *colon = memchr(auth, ':', (size_t)(at - auth));
        size_t ulen = colon ? (size_t)(colon - auth) : (size_t)(at - auth);
        int bad = 0;
        if (ulen > 0 && (u->username = pct_decode(auth, ulen, &bad)) == NULL)
            goto decode_fail;
        if (colon && (u->password = pct_decode(colon + 1, (size_t)(at - colon - 1), &bad)) == NULL)
            goto decode_fail;
        hp = at + 1;
        goto decoded;
    decode_fail:
        url_free(u);
        if (bad) return bad_url(url, "bad percent-encoding in the user information");
        return kvs_set_error(KVS_ENOMEM, "redis: out of memory parsing a URL");
    }
decoded:;
    const char *hend = auth + alen;
    const char *port = NULL;
    size_t hlen;
    if (hp < hend && *hp == '[') {
        const char *rb = memchr(hp, ']', (size_t)(hend - hp));
        if (rb == NULL) {
            url_free(u);
            return bad_url(url, "unclosed '[' in the host");
        }
        hlen = (size_t)(rb - hp - 1);
        if (rb + 1 < hend) {
            if (rb[1] != ':') {
                url_free(u);
                return bad_url(url, "junk after the host");
            }
            port = rb + 2;
        }
        hp++;
    } else {
        const char *colon = memchr(hp, ':', (size_t)(hend - hp));
        hlen = (size_t)((colon ? colon : hend) - hp);
        if (colon) port = colon + 1;
    }
    if (hlen == 0) {
        url_free(u);
        return bad_url(url, "missing host");
    }
    if (hlen >= sizeof u->host) {
        url_free(u);
        return bad_url(url, "host name too long");
    }
    memcpy(u->host, hp, hlen);
    u->host[hlen] = '\0';
    if (port != NULL) {
        size_t plen = (size_t)(hend - port);
        long v = 0;
        int ok = plen > 0 && plen <= 5;
        for (size_t i = 0; ok && i < plen; i++) {
            ok = port[i] >= '0' && port[i] <= '9';
            v = v * 10 + (port[i] - '0');
        }
        if (!ok || v < 1 || v > 65535) {
            url_free(u);
            return bad_url(url, "port must be a number from 1 to 65535");
        }
        u->port = (int)v;
    }
    if (*hend == '/' && hend[1] != '\0') {
        const char *d = hend + 1;
        size_t dlen = strlen(d);
        long long v = 0;
        int ok = dlen > 0 && dlen <= 9;
        for (size_t i = 0; ok && i < dlen; i++) {
            ok = d[i] >= '0' && d[i] <= '9';
            v = v * 10 + (d[i] - '0');
        }
        if (!ok) {
            url_free(u);
            return bad_url(url, "database must be a number from 0 to 999999999");
        }
        u->db = (unsigned)v;
    }
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * Public API
 * ------------------------------------------------------------------ */

static int connset_init(connset *cs)
{
    memset(cs, 0, sizeof *cs);
    cs->rbuf = malloc(READ_CHUNK);
    return cs->rbuf ? 0 : -1;
}

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
    if (o.nurls > MAX_NODES)
        return kvs_set_error(KVS_EINVAL, "redis: %zu URLs, at most %d", o.nurls, MAX_NODES);
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
        int rc = parse_url(o.urls[i], &u);
        if (rc != KVS_OK) {
            free(url_user);
            free(url_pass);
            return rc;
        }
        if (o.cluster && u.db != 0) {
            char shown[1024];
            redact(o.urls[i], shown, sizeof shown);
            url_free(&u);
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
        url_free(&u);
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
              locks_oom || r->sets == NULL || connset_init(&r->sync_set) != 0;
    for (unsigned i = 0; !oom && i < o.connections; i++) {
        oom = connset_init(&r->sets[i]) != 0;
        r->sets[i].next_free = r->free_sets;
        r->free_sets = &r->sets[i];
    }
    for (size_t i = 0; !oom && i < o.nurls; i++) {
        redis_url u;
        (void)parse_url(o.urls[i], &u); /* checked above */
        url_free(&u);
        oom = node_find_or_add(r, u.host, u.port) < 0;
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
