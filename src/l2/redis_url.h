/* redis_url.h - internal: the Redis adapter's URLs (redis_url.c),
 * redis://[[user][:password]@]host[:port][/db]; rediss:// (TLS), queries
 * and fragments are refused. */
#ifndef KVS_L2_REDIS_URL_H
#define KVS_L2_REDIS_URL_H

#include <stddef.h>

#include "l2/redis_cluster.h"

typedef struct redis_url {
    char host[KVS_REDIS_HOST_MAX];
    int port;
    unsigned db;
    char *username; /* percent-decoded; NULL if absent */
    char *password;
} redis_url;

/* Parse url into *u (port 6379 and database 0 unless given). KVS_OK, or
 * KVS_EINVAL "redis: bad URL '<url, password as ***>': <why>" / KVS_ENOMEM
 * with nothing kept. */
int kvs_redis_parse_url(const char *url, redis_url *u);

/* Free u's strings (the password wiped first). */
void kvs_redis_url_free(redis_url *u);

/* The URL for messages: the password (between "user:" and '@') as "***". */
void kvs_redis_redact_url(const char *url, char *out, size_t size);

#endif /* KVS_L2_REDIS_URL_H */
