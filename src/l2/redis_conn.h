/* redis_conn.h - internal: the Redis adapter's connection layer
 * (redis_conn.c): the node table and each node's backoff, RESP commands,
 * pipelines of commands driven over non-blocking sockets (sendmsg(2) from
 * the caller's memory, recv(2), poll(2), one deadline for all), a load's
 * bulk strings read straight into their destinations (redis_bulk.h), and
 * the connection sets the workers borrow. Why this file drives the sockets
 * itself rather than hiredis: redis_adapter.c's head comment. The state it
 * works on is the adapter's (redis_adapter.h: state_mu, nodes, counters,
 * the connection settings). */
#ifndef KVS_L2_REDIS_CONN_H
#define KVS_L2_REDIS_CONN_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#include "kvserde/l2.h"
#include "kvserde/l2_redis.h"
#include "l2/redis_bulk.h"
#include "l2/redis_cluster.h"

#define KVS_REDIS_ERR_MAX 400    /* a node-level error ("127.0.0.1:6379: ...") */
#define KVS_REDIS_ADDR_MAX (KVS_REDIS_HOST_MAX + 16)
#define KVS_REDIS_MAX_NODES 4096 /* distinct node addresses one adapter tracks */
#define KVS_REDIS_NS_PER_MS 1000000ll

typedef struct redis_adapter redis_adapter;

/* One Redis server (a cluster node, or the single server). */
typedef struct rnode {
    char host[KVS_REDIS_HOST_MAX];
    int port;
    char addr[KVS_REDIS_ADDR_MAX]; /* "host:port" for messages and status */
    /* guarded by the adapter's state_mu */
    int64_t next_attempt;    /* monotonic ns before which no connect is tried */
    unsigned backoff_ms;     /* the next failure's wait; 0 = none yet */
    unsigned open_conns;
    int failed;              /* the last connect failed or a connection broke */
    char last_error[KVS_REDIS_ERR_MAX];
    char backoff_error[KVS_REDIS_ERR_MAX]; /* the last failed connection attempt's */
} rnode;

/* The connections of one worker (or of the synchronous calls): at most one
 * per node, indexed by node. */
typedef struct connset {
    struct connset *next_free;
    redisContext **conns;
    size_t cap;
    char *rbuf;              /* KVS_REDIS_READ_CHUNK bytes */
} connset;

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
    char err[KVS_REDIS_ERR_MAX]; /* "<addr>: <reason>" once failed */
    /* Loads only (bulk != NULL): replies are read by pipe_read_load. */
    kvs_memobj **dest;          /* command j's destination (NULL: an ASKING) */
    lout *outs;                 /* command j's bulk string outcome; its replies[j] is NULL */
    kvs_redis_bulk *bulk;       /* the reply being read */
    int took_held;              /* the bytes hiredis' reader held were taken */
} rpipe;

enum { PIPE_RUNNING, PIPE_DONE, PIPE_FAILED };



/* Monotonic time in ns, and the ms from now to t (rounded up, >= 0). */
int64_t kvs_redis_now_ns(void);
int kvs_redis_ms_until(int64_t t, int64_t now);

/* The deadline of a task or call starting now: timeout_ms from now. */
int64_t kvs_redis_deadline(const redis_adapter *r);

/* snprintf for messages, which may be cut to fit their buffer (by design:
 * a message holds a host name, a server's error text, ...). */
void kvs_redis_msgf(char *buf, size_t size, const char *format, ...)
    __attribute__((format(printf, 3, 4)));

/* Count an error for status (errors, last_error). */
void kvs_redis_count_error(redis_adapter *r, const char *msg);

/* The node table (nodes are only ever added; a node's host, port and addr
 * never change, so its pointer is used without the lock). find_or_add: the
 * index of host:port, added if new; -1 if the table is full or out of
 * memory. */
int kvs_redis_node_find_or_add(redis_adapter *r, const char *host, int port);
rnode *kvs_redis_node_get(redis_adapter *r, int i);
size_t kvs_redis_node_count(redis_adapter *r);

/* Format argv[0..argc) as a RESP array; the last argument is referenced,
 * not copied (it must outlive the command). -1 if out of memory. _words:
 * NUL-terminated arguments (at most 4). */
int kvs_redis_cmd_build(resp_cmd *c, int argc, const char *const *argv, const size_t *lens);
int kvs_redis_cmd_words(resp_cmd *c, int argc, const char *const *argv);

/* A pipe's room for ncmds commands (a load pipe's: also their destinations
 * and outcomes, and a reply reader); -1 if out of memory (nothing kept).
 * _free frees commands, replies and room, and leaves the pipe empty. */
int kvs_redis_pipe_alloc(rpipe *p, size_t ncmds);
int kvs_redis_pipe_alloc_load(rpipe *p, size_t ncmds);
void kvs_redis_pipe_free(rpipe *p);

/* Run every pipe to completion or failure, all at once, until deadline
 * (buf: KVS_REDIS_READ_CHUNK bytes). A failed pipe keeps the replies it
 * got; its connection must be dropped. */
void kvs_redis_run_pipes(redis_adapter *r, rpipe *pipes, size_t n, char *buf, int64_t deadline);

/* The set's connection to node i, opened if needed (backoff rules in
 * redis_conn.c). NULL with err set if there is none. *reused: it was open
 * already. no_wait: fail at once while the node is in backoff. */
redisContext *kvs_redis_conn_get(redis_adapter *r, connset *cs, int i, int64_t deadline,
                                 int no_wait, int *reused, char *err, size_t errsize);

/* Close the set's connection to node i (if any); msg says why it broke
 * (NULL: closed on purpose). _close_all: every one of the set's. */
void kvs_redis_conn_drop(redis_adapter *r, connset *cs, int i, const char *msg);
void kvs_redis_connset_close_all(redis_adapter *r, connset *cs);

/* A set's life: init (-1 if out of memory), then borrowed by a worker
 * (take: there is always one, as many sets as workers; put: back), free
 * (closes its connections). */
int kvs_redis_connset_init(connset *cs);
connset *kvs_redis_connset_take(redis_adapter *r);
void kvs_redis_connset_put(redis_adapter *r, connset *cs);
void kvs_redis_connset_free(redis_adapter *r, connset *cs);

#endif /* KVS_L2_REDIS_CONN_H */
