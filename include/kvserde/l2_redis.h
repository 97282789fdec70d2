/* kvserde/l2_redis.h - the Redis L2 adapter ("redis"): a KV store shared by
 * several machines on a Redis server or a Redis Cluster, through the hiredis
 * client library.
 *
 * The adapter keeps the whole contract of l2.h: three event fds, one task-id
 * counter from 0, pop-once results, per-key bitmaps, and every store, lookup
 * and load runs on the adapter's own threads, never the caller's.
 *
 * Threads and connections
 *   `connections` worker threads (default 2), each using connections of its
 *   own: one per Redis node it talks to, opened on first use and kept. A
 *   task's keys are cut into up to `connections` contiguous runs handled in
 *   parallel; each run sends its commands to each node as one pipeline (all
 *   commands written, then all replies read, with the two overlapping), so
 *   a run costs one round trip per node it touches, plus one per
 *   redirection (cluster). Values go from the caller's object to the socket
 *   without a copy, and (loads) from the socket into the caller's object
 *   without one (see Load). The synchronous calls (delete, object sizes, usage) use
 *   one more connection per node, on the calling thread.
 *
 * Keys
 *   The Redis key of an object key is key_prefix followed by
 *   kvs_fs_key_path(key) (kvserde/l2_fs.h): a printable encoding of every
 *   key field that is injective, so distinct keys never share a Redis key,
 *   and every key starts with the prefix, so nothing outside the prefix is
 *   ever read, written or deleted. Example, prefix "kvserde:", model
 *   "meta-llama/Llama-3-8B", no salt, hash 00 00 00 07, rank 0, group 0:
 *       kvserde:meta-llama%2FLlama-3-8B+/00000007,0,0
 *   Adapters sharing a server keep apart when their prefixes differ and
 *   each ends in ':' (paths never hold a ':'); with prefixes such as "p" and
 *   "pa" the key of model "ax" under the first is that of model "x" under
 *   the second.
 *   The encoding escapes '{' and '}', so in a cluster a key's slot comes
 *   from the whole key, and keys spread over the nodes; a prefix holding a
 *   hash tag (e.g. "{kv}:") puts every key of the adapter in one slot.
 *   A stored value is exactly the object's first used_size bytes (no
 *   header): other programs can read it with GET.
 *
 * Store
 *   SET key value for every key of the task (a store replaces what was
 *   there; a SET is atomic, so readers never see a partial object). Every
 *   key is sent, even after one fails: the keys that fail are not stored,
 *   the others are. The task fails with the lowest-index failure, e.g.
 *       "redis: store of key 1: 127.0.0.1:6379: OOM command not allowed
 *        when used memory > 'maxmemory'."          (KVS_ENOSPC)
 *   bytes_written counts the bytes of the keys stored (0 if the task
 *   failed, as l2.h says for every failed store).
 *
 * Lookup-and-lock
 *   EXISTS per key. A found key is locked: lock counts live in this adapter
 *   instance (a second adapter, e.g. on another machine, does not see
 *   them), and they keep this adapter's delete from removing the key. Redis
 *   itself may still evict or expire it (maxmemory policies), and another
 *   machine may delete it: a key found at lookup and gone at load fails
 *   only that key's load. A miss is not an error; a key whose node cannot
 *   be reached is a miss with the reason as the result's status/message.
 *
 * Load
 *   GET per key into objects[i]; the used size becomes the value's length.
 *   A missing key (KVS_ENOTFOUND: "redis: load of key 2: not found"), a
 *   value that is not exactly a KV-shaped destination's layout size
 *   (KVS_ECORRUPT: "redis: load of key 0: stored object is 16384 bytes,
 *   destination layout needs 12288"; see kvserde/l2.h), a
 *   value larger than the destination's capacity (KVS_ENOSPC: "redis: load
 *   of key 0: stored object is 4096 bytes, destination holds 1024"), an
 *   error reply (KVS_EIO: "redis: load of key 0: 127.0.0.1:6379: WRONGTYPE
 *   ...") or a connection fault clear only the affected keys' bits; the
 *   lowest-index error is the result's status and message.
 *   No copy: the adapter reads each GET reply itself (not through hiredis'
 *   reader): it parses the reply's header ("$<len>"), checks len against
 *   the destination as above before writing a byte of it (a refused value
 *   is read and dropped, the connection stays usable), then receives the
 *   value from the socket straight into objects[i], then its CRLF. Only
 *   the last few KiB of a value (under 16 KiB), small values and the reply
 *   lines around them pass through the connection's read buffer and are
 *   copied from there. Other replies (nil, an error, MOVED / ASK in a
 *   cluster, ASKING's +OK) are whole lines handed to hiredis' reader,
 *   handled as before. A load that fails part way through a value (the
 *   connection lost, the time limit) leaves objects[i]'s bytes unspecified
 *   and its used size unchanged, as l2.h allows; the connection is dropped.
 *   A reply line longer than 16 KiB, a malformed length or a value not
 *   followed by CRLF is a protocol error ("redis: load of key 0:
 *   127.0.0.1:6379: protocol error: Bad bulk string length"), which drops
 *   the connection too.
 *
 * Faults and time limits
 *   Each run of a task has timeout_ms (default 2000) from its start for
 *   everything: connecting, waiting out a reconnection backoff, writing,
 *   reading, following redirections. It never blocks longer: when time is
 *   up its unanswered keys fail with KVS_EIO ("redis: load of key 0:
 *   127.0.0.1:6379: timed out after 2000 ms"). A refused connection
 *   ("...: 127.0.0.1:6399: connect: Connection refused"), a connection that
 *   drops ("...: connection lost: server closed the connection"), or a
 *   failed AUTH or SELECT fail the keys routed to that node, and only
 *   those. A connection that failed, timed out or lost its place in the
 *   reply stream is closed; the next task opens a new one.
 *   Backoff: after a failed connection attempt a node is in backoff until
 *   an attempt succeeds; its next attempt waits 10 ms, doubling with each
 *   failure to at most 250 ms, so tasks reach a restarted server within
 *   about 250 ms of it answering. A task meeting a node in backoff waits
 *   for that next attempt, but never past the point where half of its
 *   timeout_ms is left: if the attempt is due later, the task makes a final
 *   attempt of its own there, so a server back in time serves it. A task
 *   makes one connection attempt per node (per redirection round): a
 *   refused attempt fails its keys at once, and the first task to meet a
 *   fault reports it without waiting. A task that fails on a node in
 *   backoff with another error than the one that put it there names that
 *   one too: "redis: store of key 3: 127.0.0.1:6390: timed out after 1000
 *   ms; the node was in backoff after: connect: Connection refused".
 *   A kept connection that the server closed while idle (a restart) is
 *   noticed before use, and a pipeline that fails on a kept connection
 *   before any reply is retried once on a new one, so tasks after a server
 *   restart succeed (if the retry fails too, the keys report the first
 *   failure). A SET whose reply was lost (timeout, broken connection) may
 *   still have been applied by the server.
 *
 * Redis Cluster ("cluster": true)
 *   The URLs are seeds. The adapter reads the slot map (CLUSTER SLOTS) from
 *   the first seed (or known node) that answers, on first use; routes each
 *   key to the master of its hash slot (CRC16, hash tags honoured); on
 *   "MOVED slot host:port" sends the key to that node and re-reads the map
 *   before its next round; on "ASK slot host:port" sends "ASKING" and the
 *   command to that node, once, without changing the map. A key is
 *   redirected at most 5 times per task ("redis: load of key 0: too many
 *   redirections (last: 127.0.0.1:7001)"). Nodes met in redirections or
 *   maps are added as they appear. A slot no master serves fails its keys
 *   ("...: cluster: slot 1234 is not served by any node"). Reading the map
 *   does not wait for a node in backoff (its error ends with "(next
 *   attempt in N ms)"). Cluster mode uses database 0 only.
 *
 * Delete, object sizes, usage, status
 *   Synchronous, on the calling thread, each bounded by timeout_ms. Delete
 *   skips locked keys (deleted[i] = 0) and DELs the others (deleted[i] = 1
 *   if the key existed); keys on an unreachable node are reported not
 *   deleted and the call returns KVS_EIO (with the first such key's
 *   message) after trying the others. Object sizes: EXISTS + STRLEN per key
 *   (-1 if absent or unreachable; KVS_EIO likewise). Usage: INFO memory of
 *   the node (the sum over the cluster's masters): bytes_used is Redis's
 *   used_memory (all of the server's memory, not only this adapter's keys),
 *   capacity its maxmemory (0 = unbounded, also if any master is
 *   unbounded); KVS_EIO if a node cannot be asked. After close, delete and
 *   object sizes are refused (KVS_ECLOSED: "redis: adapter is closed"),
 *   usage returns the last usage read (zeros if none), unlock and status
 *   keep working. Status (no network I/O):
 *       {"type": "redis", "is_healthy": true, "cluster": false,
 *        "key_prefix": "kvserde:", "connections": 2, "timeout_ms": 2000,
 *        "nodes": [{"address": "127.0.0.1:6379", "connected": true,
 *                   "last_error": ""}],
 *        "nodes_connected": 1, "errors": 0, "last_error": "",
 *        "redirections": {"moved": 0, "ask": 0}, "slot_map_refreshes": 0,
 *        "locked_keys": 0}
 *   A node is connected while a connection to it is open; errors counts
 *   every failed connection attempt, lost connection, timeout and error
 *   reply other than a redirection or a missing key; is_healthy is false
 *   once closed or while a node in use (the server; a master in the slot
 *   map) has failed its last connection attempt or lost its connection.
 *   The adapter connects lazily: creating it touches no network.
 *
 * JSON spec (kvs_l2_create):
 *     {"type": "redis", "url": "redis://127.0.0.1:6379/0",
 *      "key_prefix": "kvserde:", "timeout_ms": 2000, "connections": 2,
 *      "cluster": false, "username": "u", "password": "p",
 *      "serde": {"type": "fp8"}}
 *   url: "redis://[[username][:password]@]host[:port][/db]" (port default
 *   6379, db default 0; username and password are percent-decoded; an IPv6
 *   host goes in brackets). urls: an array of such strings instead of url
 *   (cluster seeds). Neither: "redis://127.0.0.1:6379/0". username and
 *   password (strings) override the URL's. key_prefix a string of at most
 *   256 bytes (default "kvserde:", "" allowed), timeout_ms an integer from
 *   1 to 3600000, connections an integer from 1 to 1024 (2.0 and "2"
 *   accepted as for a serde's max_workers), cluster a boolean. Refused
 *   (KVS_EINVAL), among others: "redis: unknown key 'foo'; accepted: url,
 *   urls, cluster, key_prefix, timeout_ms, connections, username, password",
 *   "redis: give 'url' or 'urls', not both", "redis: bad URL
 *   'http://h': must start with redis://", "redis: bad URL 'redis://h:0':
 *   port must be a number from 1 to 65535". Messages show a URL's password
 *   as "***".
 */
#ifndef KVSERDE_L2_REDIS_H
#define KVSERDE_L2_REDIS_H

#include <stddef.h>

#include "error.h"
#include "export.h"
#include "l2.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_REDIS_DEFAULT_URL "redis://127.0.0.1:6379/0"
#define KVS_REDIS_DEFAULT_PREFIX "kvserde:"
#define KVS_REDIS_DEFAULT_TIMEOUT_MS 2000
#define KVS_REDIS_MAX_TIMEOUT_MS 3600000
#define KVS_REDIS_DEFAULT_CONNECTIONS 2
#define KVS_REDIS_MAX_CONNECTIONS 1024
#define KVS_REDIS_PREFIX_MAX 256

/* Options of kvs_redis_adapter_create(). A zero-initialized struct is the
 * default configuration: one server at KVS_REDIS_DEFAULT_URL, prefix
 * "kvserde:", 2000 ms, two connections. Strings are copied. */
typedef struct kvs_redis_options {
    const char *const *urls; /* nurls URLs (see above); NULL/0: the default */
    size_t nurls;            /* more than one needs cluster */
    int cluster;             /* 1: Redis Cluster, the URLs are seeds */
    const char *key_prefix;  /* NULL: KVS_REDIS_DEFAULT_PREFIX */
    const char *username;    /* NULL: the first URL's that has one */
    const char *password;    /* NULL: the first URL's that has one */
    unsigned timeout_ms;     /* 0: KVS_REDIS_DEFAULT_TIMEOUT_MS */
    unsigned connections;    /* worker threads; 0: KVS_REDIS_DEFAULT_CONNECTIONS */
} kvs_redis_options;

/* Create an adapter (ops name "redis"). Touches no network: connections
 * are opened by the first tasks. Refused (KVS_EINVAL): out NULL, a bad URL
 * (messages as for the JSON spec), several URLs without cluster ("redis: 2
 * URLs need \"cluster\": true"), a database other than 0 with cluster
 * ("redis: cluster mode supports database 0 only, URL 'redis://h:7000/1'
 * selects 1"), a username without a password ("redis: a username needs a
 * password"), a prefix over KVS_REDIS_PREFIX_MAX bytes, timeout_ms or
 * connections out of range; KVS_EIO if an eventfd or thread cannot be
 * created; KVS_ENOMEM. Free with kvs_l2_destroy(). */
KVS_API int kvs_redis_adapter_create(const kvs_redis_options *opts, kvs_l2_adapter **out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_L2_REDIS_H */
