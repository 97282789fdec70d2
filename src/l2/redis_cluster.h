/* redis_cluster.h - internal: the pure parts of Redis Cluster routing for
 * the redis adapter (src/l2/redis_work.c, redis_slot_map.c): the key ->
 * hash slot function (CRC16 with {hash tag} rules), MOVED / ASK
 * redirection errors, and the CLUSTER SLOTS reply. Nothing here does I/O or keeps state, so the test
 * can check each piece against the server's own answers.
 *
 * References: the Redis Cluster specification ("Keys distribution model",
 * "Redirection and resharding") and the CLUSTER SLOTS command page. */
#ifndef KVS_L2_REDIS_CLUSTER_H
#define KVS_L2_REDIS_CLUSTER_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>

#define KVS_REDIS_SLOTS 16384
#define KVS_REDIS_HOST_MAX 256 /* bytes of a host name, NUL included */

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0, no reflection),
 * the checksum Redis Cluster hashes keys with: crc16("123456789") is
 * 0x31c3. */
uint16_t kvs_redis_crc16(const void *data, size_t len);

/* The hash slot (0 to 16383) of a key of `len` bytes: crc16 of the whole
 * key mod 16384, unless the key holds a '{' followed later by a '}' with at
 * least one byte between the first '{' and the first '}' after it: then
 * only those bytes are hashed ("{user1}.a" and "{user1}.b" share a slot;
 * "{}x" and "x{" hash whole). */
unsigned kvs_redis_key_slot(const void *key, size_t len);

typedef enum kvs_redis_redirect_kind {
    KVS_REDIS_NOT_REDIRECT = 0,
    KVS_REDIS_MOVED = 1, /* the slot has a new owner: update the map */
    KVS_REDIS_ASK = 2,   /* migrating: ask that node once, with ASKING */
} kvs_redis_redirect_kind;

/* One redirection: "MOVED 3999 127.0.0.1:6381", "ASK 3999 [::1]:6381".
 * The endpoint may be empty before ':' (an unknown endpoint: Redis then
 * means "the node you asked"), which is returned as host "". */
typedef struct kvs_redis_redirect {
    kvs_redis_redirect_kind kind;
    unsigned slot;
    char host[KVS_REDIS_HOST_MAX];
    int port;
} kvs_redis_redirect;

/* Parse an error reply's text of `len` bytes. Returns the kind and fills
 * *out for MOVED / ASK; KVS_REDIS_NOT_REDIRECT for any other error, and for
 * a MOVED / ASK that is malformed (slot over 16383, port out of range, no
 * ':'), which the caller then reports as a plain error. */
kvs_redis_redirect_kind kvs_redis_parse_redirect(const char *err, size_t len,
                                                 kvs_redis_redirect *out);

/* One slot range of CLUSTER SLOTS: the master serving [start, end]. */
typedef struct kvs_redis_slot_range {
    unsigned start, end;
    char host[KVS_REDIS_HOST_MAX];
    int port;
} kvs_redis_slot_range;

/* Parse a CLUSTER SLOTS reply: an array of [start, end, [host, port, id,
 * ...], replicas...]. An empty host (a node that does not know its own
 * address) becomes `asked_host`, the host the reply came from. On success
 * *out is a malloc'd array of *count ranges (the caller frees it) and 0 is
 * returned; on a malformed reply -1, with the reason in err ("element 2: no
 * master") and *out NULL. An empty array is valid (no slot is served). */
int kvs_redis_parse_cluster_slots(const redisReply *reply, const char *asked_host,
                                  kvs_redis_slot_range **out, size_t *count, char *err,
                                  size_t errsize);

/* "host:port", with an IPv6 host in brackets ("[::1]:6379"), into buf. */
void kvs_redis_format_addr(const char *host, int port, char *buf, size_t size);

#endif /* KVS_L2_REDIS_CLUSTER_H */
