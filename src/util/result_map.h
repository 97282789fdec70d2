/* result_map.h - task id -> result, where reading a result removes it.
 *
 * The async processor and the L2 adapters record finished tasks here and
 * hand each result out exactly once (upstream's dict.pop(id, None)). Popped
 * entries are gone, and the table shrinks again as it empties, so its memory
 * follows the number of unread results, not the number of tasks ever run.
 *
 * Values are non-NULL pointers owned by the map until popped.
 *
 * Reservations let a completion path that must not fail record its result
 * without allocating: reserve a slot when the task is accepted (this is
 * where allocation can fail and the task can still be refused), then
 * kvs_result_map_put_reserved() at completion, which never allocates.
 *
 * Not thread-safe: the owner serializes calls with its own lock.
 */
#ifndef KVS_UTIL_RESULT_MAP_H
#define KVS_UTIL_RESULT_MAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvs_result_map {
    uint64_t *keys;
    void **values;     /* NULL marks an empty slot */
    size_t capacity;   /* 0 or a power of two */
    size_t count;      /* entries stored */
    size_t reserved;   /* slots promised to put_reserved() */
} kvs_result_map;

/* An empty map (allocates nothing until the first reserve or put). */
void kvs_result_map_init(kvs_result_map *m);

/* Call free_value (if not NULL) on every value still stored, then release the
 * table. The map is empty and reusable afterwards. */
void kvs_result_map_destroy(kvs_result_map *m, void (*free_value)(void *));

/* Promise one future put_reserved(): grows the table now if needed so that
 * put stays allocation-free. KVS_ENOMEM leaves the map unchanged. */
int kvs_result_map_reserve(kvs_result_map *m);

/* Give back a reservation that will not be used. */
void kvs_result_map_unreserve(kvs_result_map *m);

/* Store key -> value using one reservation. Never allocates. KVS_EINVAL if
 * value is NULL or no reservation is held; KVS_EEXIST if key is present. */
int kvs_result_map_put_reserved(kvs_result_map *m, uint64_t key, void *value);

/* Store key -> value, growing the table if needed. KVS_EINVAL if value is
 * NULL; KVS_EEXIST if key is present; KVS_ENOMEM. */
int kvs_result_map_put(kvs_result_map *m, uint64_t key, void *value);

/* Remove and return the value for key, or NULL if there is none. */
void *kvs_result_map_pop(kvs_result_map *m, uint64_t key);

/* The value for key without removing it, or NULL. */
void *kvs_result_map_get(const kvs_result_map *m, uint64_t key);

/* Entries stored. */
size_t kvs_result_map_count(const kvs_result_map *m);

#endif /* KVS_UTIL_RESULT_MAP_H */
