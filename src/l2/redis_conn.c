/* redis_conn.c - see redis_conn.h. */
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
#include "l2/builtins.h"
#include "l2/redis_adapter.h"
#include "l2/redis_bulk.h"
#include "l2/redis_cluster.h"
#include "l2/redis_conn.h"

#define BACKOFF_FIRST_MS 10
#define BACKOFF_MAX_MS 250
#define IOV_BATCH 64 /* iovecs per sendmsg */

/* ---------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------ */

int64_t kvs_redis_now_ns(void)
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

int64_t kvs_redis_deadline(const redis_adapter *r)
{
    return kvs_redis_now_ns() + (int64_t)r->timeout_ms * KVS_REDIS_NS_PER_MS;
}

int kvs_redis_ms_until(int64_t t, int64_t now)
{
    if (t <= now) return 0;
    int64_t ms = (t - now + KVS_REDIS_NS_PER_MS - 1) / KVS_REDIS_NS_PER_MS;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

void kvs_redis_msgf(char *buf, size_t size, const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    vsnprintf(buf, size, format, ap);
    va_end(ap);
}


/* Count an error for status (errors, last_error). */
void kvs_redis_count_error(redis_adapter *r, const char *msg)
{
    pthread_mutex_lock(&r->state_mu);
    r->errors++;
    kvs_redis_msgf(r->last_error, sizeof r->last_error, "%s", msg);
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
    if (r->nnodes == KVS_REDIS_MAX_NODES || strlen(host) >= KVS_REDIS_HOST_MAX) return -1;
    if (r->nnodes == r->nodes_cap) {
        size_t cap = r->nodes_cap ? 2 * r->nodes_cap : 8;
        rnode **nn = realloc(r->nodes, cap * sizeof *nn);
        if (nn == NULL) return -1;
        r->nodes = nn;
        r->nodes_cap = cap;
    }
    rnode *nd = calloc(1, sizeof *nd);
    if (nd == NULL) return -1;
    kvs_redis_msgf(nd->host, sizeof nd->host, "%s", host);
    nd->port = port;
    kvs_redis_format_addr(host, port, nd->addr, sizeof nd->addr);
    r->nodes[r->nnodes] = nd;
    return (int)r->nnodes++;
}

int kvs_redis_node_find_or_add(redis_adapter *r, const char *host, int port)
{
    pthread_mutex_lock(&r->state_mu);
    int i = node_find_or_add_locked(r, host, port);
    pthread_mutex_unlock(&r->state_mu);
    return i;
}

rnode *kvs_redis_node_get(redis_adapter *r, int i)
{
    pthread_mutex_lock(&r->state_mu);
    rnode *nd = r->nodes[i];
    pthread_mutex_unlock(&r->state_mu);
    return nd;
}

size_t kvs_redis_node_count(redis_adapter *r)
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
    kvs_redis_msgf(nd->last_error, sizeof nd->last_error, "%s", msg);
    kvs_redis_msgf(nd->backoff_error, sizeof nd->backoff_error, "%s", msg);
    nd->backoff_ms = nd->backoff_ms ? nd->backoff_ms * 2 : BACKOFF_FIRST_MS;
    if (nd->backoff_ms > BACKOFF_MAX_MS) nd->backoff_ms = BACKOFF_MAX_MS;
    nd->next_attempt = kvs_redis_now_ns() + (int64_t)nd->backoff_ms * KVS_REDIS_NS_PER_MS;
    r->errors++;
    kvs_redis_msgf(r->last_error, sizeof r->last_error, "%s", msg);
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
        kvs_redis_msgf(nd->last_error, sizeof nd->last_error, "%s", msg);
        r->errors++;
        kvs_redis_msgf(r->last_error, sizeof r->last_error, "%s", msg);
    }
    pthread_mutex_unlock(&r->state_mu);
}

/* ---------------------------------------------------------------------
 * Commands and pipelines
 * ------------------------------------------------------------------ */

/* Format argv[0..argc) as a RESP array; the last argument is referenced,
 * not copied (it must outlive the command). -1 if out of memory. */
int kvs_redis_cmd_build(resp_cmd *c, int argc, const char *const *argv, const size_t *lens)
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
int kvs_redis_cmd_words(resp_cmd *c, int argc, const char *const *argv)
{
    size_t lens[4];
    for (int i = 0; i < argc; i++) lens[i] = strlen(argv[i]);
    return kvs_redis_cmd_build(c, argc, argv, lens);
}

static size_t cmd_size(const resp_cmd *c) { return c->head_len + c->last_len + 2; }

static void pipe_fail(rpipe *p, int lost, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void pipe_fail(rpipe *p, int lost, const char *fmt, ...)
{
    char why[KVS_REDIS_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    /* "; the node was in backoff after: ..." (kvs_redis_conn_get), or "" */
    char after[KVS_REDIS_ERR_MAX];
    kvs_redis_msgf(after, sizeof after, "%s", p->err);
    kvs_redis_msgf(p->err, sizeof p->err, "%s: %s%s", p->nd->addr, why, after);
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
        size_t n = pipe_recv(p, buf, KVS_REDIS_READ_CHUNK);
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
 * taken first. Timeouts and a lost connection are kvs_redis_run_pipes' and
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
        size_t n = pipe_recv(p, direct ? where : buf, direct ? want : KVS_REDIS_READ_CHUNK);
        if (n == 0) return;
        if (direct) kvs_redis_bulk_advance(p->bulk, n);
        else load_take(p, buf, n);
        if (p->state != PIPE_RUNNING) return;
    }
}

/* Run every pipe to completion or failure, all at once, until deadline. A
 * failed pipe keeps the replies it got; its connection must be dropped. */
void kvs_redis_run_pipes(redis_adapter *r, rpipe *pipes, size_t n, char *buf, int64_t deadline)
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
        int64_t now = kvs_redis_now_ns();
        if (now >= deadline) {
            for (size_t i = 0; i < n; i++)
                if (pipes[i].state == PIPE_RUNNING)
                    pipe_fail(&pipes[i], 0, "timed out after %u ms", r->timeout_ms);
            return;
        }
        int rc = poll(pfd, (nfds_t)m, kvs_redis_ms_until(deadline, now));
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

void kvs_redis_pipe_free(rpipe *p)
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
int kvs_redis_pipe_alloc(rpipe *p, size_t ncmds)
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
int kvs_redis_pipe_alloc_load(rpipe *p, size_t ncmds)
{
    if (kvs_redis_pipe_alloc(p, ncmds) != 0) return -1;
    p->dest = calloc(ncmds ? ncmds : 1, sizeof *p->dest);
    p->outs = calloc(ncmds ? ncmds : 1, sizeof *p->outs);
    p->bulk = malloc(sizeof *p->bulk);
    if (p->dest == NULL || p->outs == NULL || p->bulk == NULL) {
        kvs_redis_pipe_free(p);
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
void kvs_redis_conn_drop(redis_adapter *r, connset *cs, int i, const char *msg)
{
    if ((size_t)i >= cs->cap || cs->conns[i] == NULL) return;
    redisFree(cs->conns[i]);
    cs->conns[i] = NULL;
    node_conn_closed(r, kvs_redis_node_get(r, i), msg);
}

void kvs_redis_connset_close_all(redis_adapter *r, connset *cs)
{
    for (size_t i = 0; i < cs->cap; i++) kvs_redis_conn_drop(r, cs, (int)i, NULL);
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
    kvs_redis_msgf(port, sizeof port, "%d", nd->port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int gai = getaddrinfo(nd->host, port, &hints, &res);
    if (gai != 0) {
        kvs_redis_msgf(err, errsize, "%s: cannot resolve host: %s", nd->addr,
             gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
        return -1;
    }
    int fd = -1;
    kvs_redis_msgf(err, errsize, "%s: connect: no address", nd->addr);
    for (struct addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            kvs_redis_msgf(err, errsize, "%s: socket: %s", nd->addr, strerror(errno));
            continue;
        }
        int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
        int e = rc == 0 ? 0 : errno;
        if (e == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            for (;;) {
                int64_t now = kvs_redis_now_ns();
                rc = now < deadline ? poll(&p, 1, kvs_redis_ms_until(deadline, now)) : 0;
                if (rc >= 0 || errno != EINTR) break;
            }
            socklen_t len = sizeof e;
            if (rc == 0) {
                kvs_redis_msgf(err, errsize, "%s: connect: timed out after %u ms", nd->addr,
                               timeout_ms);
                close(fd);
                fd = -1;
                break; /* no time left for other addresses */
            }
            if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0) e = errno;
        }
        if (e != 0) {
            kvs_redis_msgf(err, errsize, "%s: connect: %s", nd->addr, strerror(e));
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
    kvs_redis_msgf(db, sizeof db, "%u", r->db);
    int auth = r->password != NULL, sel = r->db != 0;
    if (!auth && !sel) return 0;
    if (kvs_redis_pipe_alloc(&p, 2) != 0) {
        kvs_redis_msgf(err, errsize, "%s: out of memory", nd->addr);
        return -1;
    }
    int bad = 0;
    if (auth) {
        const char *a2[] = {"AUTH", r->password};
        const char *a3[] = {"AUTH", r->username, r->password}; /* an ACL user */
        bad |= r->username ? kvs_redis_cmd_words(&p.cmds[p.ncmds++], 3, a3)
                           : kvs_redis_cmd_words(&p.cmds[p.ncmds++], 2, a2);
    }
    if (sel) {
        const char *s[] = {"SELECT", db};
        bad |= kvs_redis_cmd_words(&p.cmds[p.ncmds++], 2, s);
    }
    int rc = 0;
    if (bad) {
        kvs_redis_msgf(err, errsize, "%s: out of memory", nd->addr);
        rc = -1;
    } else {
        kvs_redis_run_pipes(r, &p, 1, buf, deadline);
        if (p.state == PIPE_FAILED) {
            kvs_redis_msgf(err, errsize, "%s", p.err);
            rc = -1;
        }
        for (size_t i = 0; rc == 0 && i < p.nreplies; i++) {
            const redisReply *rep = p.replies[i];
            if (rep->type == REDIS_REPLY_ERROR) {
                kvs_redis_msgf(err, errsize, "%s: %s: %s", nd->addr,
                         auth && i == 0 ? "AUTH" : "SELECT", rep->str);
                rc = -1;
            }
        }
    }
    kvs_redis_pipe_free(&p);
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
        kvs_redis_msgf(err, errsize, "%s: out of memory", nd->addr);
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
redisContext *kvs_redis_conn_get(redis_adapter *r, connset *cs, int i, int64_t deadline,
                              int no_wait, int *reused, char *err, size_t errsize)
{
    rnode *nd = kvs_redis_node_get(r, i);
    *reused = 0;
    if (connset_reserve(cs, (size_t)i) != 0) {
        kvs_redis_msgf(err, errsize, "%s: out of memory", nd->addr);
        return NULL;
    }
    if (cs->conns[i] != NULL) {
        if (!conn_stale(cs->conns[i])) {
            *reused = 1;
            return cs->conns[i];
        }
        kvs_redis_conn_drop(r, cs, i, NULL); /* closed while idle: a restart; reconnect */
    }
    pthread_mutex_lock(&r->state_mu);
    int64_t next = nd->next_attempt;
    int in_backoff = nd->backoff_ms != 0; /* since a failed attempt, until a success */
    char last[KVS_REDIS_ERR_MAX];
    kvs_redis_msgf(last, sizeof last, "%s", nd->backoff_error);
    pthread_mutex_unlock(&r->state_mu);
    int64_t now = kvs_redis_now_ns();
    if (next > now) {
        if (no_wait) {
            kvs_redis_msgf(err, errsize, "%s (next attempt in %d ms)", last,
                           kvs_redis_ms_until(next, now));
            return NULL;
        }
        int64_t last_chance = deadline - (int64_t)r->timeout_ms * KVS_REDIS_NS_PER_MS / 2;
        sleep_until(next < last_chance ? next : last_chance);
        now = kvs_redis_now_ns();
    }
    redisContext *c = NULL;
    if (now >= deadline) {
        kvs_redis_msgf(err, errsize, "%s: timed out after %u ms", nd->addr, r->timeout_ms);
        kvs_redis_count_error(r, err);
    } else {
        c = conn_open(r, nd, cs->rbuf, deadline, err, errsize);
    }
    if (c != NULL) err[0] = '\0';
    if (in_backoff && strcmp(err, last) != 0) {
        size_t alen = strlen(nd->addr), len = strlen(err);
        const char *why = strncmp(last, nd->addr, alen) == 0 && strncmp(last + alen, ": ", 2) == 0
                              ? last + alen + 2
                              : last;
        kvs_redis_msgf(err + len, errsize - len, "; the node was in backoff after: %s", why);
    }
    if (c == NULL) return NULL;
    cs->conns[i] = c;
    node_connected(r, nd);
    return c;
}

/* Take a connection set for a worker (there is always one: as many sets
 * as workers). */
connset *kvs_redis_connset_take(redis_adapter *r)
{
    pthread_mutex_lock(&r->sets_mu);
    connset *cs = r->free_sets;
    r->free_sets = cs->next_free;
    pthread_mutex_unlock(&r->sets_mu);
    return cs;
}

void kvs_redis_connset_put(redis_adapter *r, connset *cs)
{
    pthread_mutex_lock(&r->sets_mu);
    cs->next_free = r->free_sets;
    r->free_sets = cs;
    pthread_mutex_unlock(&r->sets_mu);
}


int kvs_redis_connset_init(connset *cs)
{
    memset(cs, 0, sizeof *cs);
    cs->rbuf = malloc(KVS_REDIS_READ_CHUNK);
    return cs->rbuf ? 0 : -1;
}

void kvs_redis_connset_free(redis_adapter *r, connset *cs)
{
    kvs_redis_connset_close_all(r, cs);
    free(cs->conns);
    free(cs->rbuf);
}

