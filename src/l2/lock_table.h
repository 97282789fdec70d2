/* lock_table.h - internal: the per-key lock counts of an L2 adapter whose
 * storage cannot hold them itself (the fs and Redis adapters).
 *
 * The L2 contract (kvserde/l2.h): a lookup-and-lock that finds a key adds
 * one lock to it, unlock() takes one away, and delete_keys() leaves a key
 * with locks in place. The fs adapter's files and the Redis adapter's
 * values have nowhere to keep such a count, so each adapter keeps a table
 * in memory: key name -> lock count, holding only the keys whose count is
 * above zero (an unlock that brings a count to zero drops the key, so the
 * table never grows with keys that were once locked).
 *
 * A key's name is a NUL-terminated string that names it injectively; both
 * adapters use its kvs_fs_key_path() (the fs adapter because it is the
 * file's path anyway, the Redis adapter because it is its value's name
 * without the prefix).
 *
 * No lock of its own: each adapter must make a count atomic with its own
 * state (the fs adapter checks the file and locks it under one mutex, a
 * delete checks the count and unlinks under it), so callers serialize every
 * call on a table with their own mutex.
 *
 * (The memory adapter is not a user: its map entry holds the stored bytes,
 * so it keeps the count in the entry, where a lookup never allocates.) */
#ifndef KVS_L2_LOCK_TABLE_H
#define KVS_L2_LOCK_TABLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvs_l2_lock_entry kvs_l2_lock_entry;

typedef struct kvs_l2_lock_table {
    kvs_l2_lock_entry **buckets; /* chains of entries */
    size_t nbuckets;             /* a power of two */
    size_t nlocked;              /* keys with a count above zero = entries */
} kvs_l2_lock_table;

/* The number of buckets a new table starts with; it doubles whenever it
 * holds as many keys as buckets. */
#define KVS_L2_LOCK_TABLE_INITIAL_BUCKETS 64

/* An empty table. 0, or -1 if out of memory (then nothing to destroy, and
 * destroy() is still safe). */
int kvs_l2_lock_table_init(kvs_l2_lock_table *lt);

/* Free every entry and the buckets. Safe on a zeroed table or one whose
 * init failed. */
void kvs_l2_lock_table_destroy(kvs_l2_lock_table *lt);

/* One more lock on `name` (a new entry at count 1 if it had none). 0, or -1
 * if out of memory, and then the table is as it was. */
int kvs_l2_lock_table_add(kvs_l2_lock_table *lt, const char *name);

/* One lock less on `name`; at zero the entry is dropped. A name that holds
 * no lock is ignored (unlock of a key never locked is not an error). */
void kvs_l2_lock_table_release(kvs_l2_lock_table *lt, const char *name);

/* The lock count of `name`: 0 if it holds none. */
uint64_t kvs_l2_lock_table_count(const kvs_l2_lock_table *lt, const char *name);

/* The number of distinct keys holding at least one lock ("locked_keys" in
 * the adapters' status). */
size_t kvs_l2_lock_table_nlocked(const kvs_l2_lock_table *lt);

#endif /* KVS_L2_LOCK_TABLE_H */
