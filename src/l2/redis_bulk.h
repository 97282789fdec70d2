/* redis_bulk.h - reading one RESP reply whose bulk string goes straight
 * into the caller's memory: the Redis adapter's loads (redis_conn.c,
 * pipe_read_load) read each GET reply with it, so a value is received from
 * the socket into the destination object with no copy in between.
 *
 * The reader is a push parser over the bytes of one reply (RESP2):
 *   1. The first line ("$<len>\r\n", "-ERR ...\r\n", "+OK\r\n", ":5\r\n",
 *      "$-1\r\n") is gathered, at most KVS_REDIS_LINE_MAX bytes.
 *   2. A bulk string of len >= 0 stops at KVS_RB_HEADER: len is known and
 *      no payload byte has been taken. The caller decides, before any byte
 *      is written: kvs_redis_bulk_accept(dst) (dst holds len bytes) or
 *      kvs_redis_bulk_skip() (the payload is read and dropped, e.g. a value
 *      that does not fit; the connection stays in step).
 *   3. The payload goes to dst: bytes the caller already read into a
 *      scratch buffer are copied by kvs_redis_bulk_feed; or the caller
 *      recv()s straight into the place kvs_redis_bulk_direct() names and
 *      reports it with kvs_redis_bulk_advance() (no copy). Then the CRLF.
 *   4. KVS_RB_DONE: bulk = 1 with len bytes in dst (or skipped), or bulk =
 *      0 with the whole one-line reply in line[0..line_len) (type byte and
 *      CRLF included: the adapter hands it to hiredis' reader, so errors,
 *      redirections, statuses, integers and nil become redisReply objects
 *      as before).
 *   Anything else is KVS_RB_ERROR with err set, in hiredis' wording where
 *   hiredis has one ("Protocol error, got \"!\" as reply type byte"); an
 *   aggregate ('*') is refused: no command read this way gets one.
 * kvs_redis_bulk_feed never takes bytes beyond the reply's end, so the
 * caller passes the rest of its buffer to the next reply's reader. */
#ifndef KVS_L2_REDIS_BULK_H
#define KVS_L2_REDIS_BULK_H

#include <stddef.h>
#include <stdint.h>

#define KVS_REDIS_READ_CHUNK (256 * 1024) /* bytes read from a socket at a time into scratch */
#define KVS_REDIS_DIRECT_MIN (16 * 1024)  /* payload left from which it is recv()d in place */
#define KVS_REDIS_LINE_MAX 16384          /* the longest first line of a reply */

typedef enum kvs_redis_bulk_state {
    KVS_RB_LINE,    /* gathering the first line */
    KVS_RB_HEADER,  /* a bulk header: len known; accept or skip */
    KVS_RB_PAYLOAD, /* payload bytes (into dst, or dropped) */
    KVS_RB_CRLF,    /* the payload's trailing CRLF */
    KVS_RB_DONE,
    KVS_RB_ERROR,
} kvs_redis_bulk_state;

typedef struct kvs_redis_bulk {
    kvs_redis_bulk_state state;
    int bulk;      /* a bulk string of len >= 0 (else a one-line reply) */
    uint64_t len;  /* bulk: the payload's length */
    char *dst;     /* PAYLOAD: where the payload goes; NULL: skipped */
    uint64_t got;  /* payload bytes taken */
    unsigned crlf; /* CRLF bytes taken */
    size_t line_len;
    char line[KVS_REDIS_LINE_MAX];
    char err[96];
} kvs_redis_bulk;

/* Ready for a new reply. */
void kvs_redis_bulk_reset(kvs_redis_bulk *b);

/* Take bytes of the reply from buf[0..n): up to its end, or to
 * KVS_RB_HEADER, or to an error. Returns how many were taken (less than n
 * only when the state is then HEADER, DONE or ERROR). */
size_t kvs_redis_bulk_feed(kvs_redis_bulk *b, const char *buf, size_t n);

/* HEADER: the payload goes to dst (room for len bytes), or is dropped. */
void kvs_redis_bulk_accept(kvs_redis_bulk *b, void *dst);
void kvs_redis_bulk_skip(kvs_redis_bulk *b);

/* PAYLOAD into dst: how many payload bytes may be received at *where right
 * now (0 if none: another state, or skipping). After writing k of them
 * there, call kvs_redis_bulk_advance(b, k). */
size_t kvs_redis_bulk_direct(const kvs_redis_bulk *b, void **where);
void kvs_redis_bulk_advance(kvs_redis_bulk *b, size_t k);

#endif
