/* result_map.c - open addressing with linear probing (see result_map.h).
 *
 * Linear probing keeps a lookup to one or two cache lines; deletion shifts
 * later entries of the same run back instead of leaving tombstones, so a
 * table that sees millions of put/pop pairs never degrades and can shrink.
 * The load factor stays at or below 1/2 (counting reservations), and the
 * table halves once it is 1/8 full, so grow/shrink cannot ping-pong. It
 * never shrinks below MIN_CAPACITY: a processor with one task at a time
 * keeps one small table instead of allocating per task.
 */
#include "util/result_map.h"

#include <stdlib.h>

#include "kvserde/error.h"

#define MIN_CAPACITY 16

/* Task ids are sequential; a multiplicative mix spreads consecutive keys
 * over the table instead of filling one long run. */
static size_t home_slot(uint64_t key, size_t mask)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & mask;
}

void kvs_result_map_init(kvs_result_map *m)
{
    m->keys = NULL;
    m->values = NULL;
    m->capacity = 0;
    m->count = 0;
    m->reserved = 0;
}

void kvs_result_map_destroy(kvs_result_map *m, void (*free_value)(void *))
{
    if (free_value != NULL)
        for (size_t i = 0; i < m->capacity; i++)
            if (m->values[i] != NULL)
                free_value(m->values[i]);
    free(m->keys);
    free(m->values);
    kvs_result_map_init(m);
}

/* Insert into a table known to have a free slot and not to hold key. */
static void insert_slot(uint64_t *keys, void **values, size_t capacity,
                        uint64_t key, void *value)
{
    size_t mask = capacity - 1;
    size_t i = home_slot(key, mask);
    while (values[i] != NULL)
        i = (i + 1) & mask;
    keys[i] = key;
    values[i] = value;
}

static int rehash(kvs_result_map *m, size_t capacity)
{
    uint64_t *keys = malloc(capacity * sizeof *keys);
    void **values = calloc(capacity, sizeof *values);
    if (keys == NULL || values == NULL) {
        free(keys);
        free(values);
        return kvs_set_error(KVS_ENOMEM, "result map: out of memory for %zu slots",
                             capacity);
    }
    for (size_t i = 0; i < m->capacity; i++)
        if (m->values[i] != NULL)
            insert_slot(keys, values, capacity, m->keys[i], m->values[i]);
    free(m->keys);
    free(m->values);
    m->keys = keys;
    m->values = values;
    m->capacity = capacity;
    return KVS_OK;
}

/* Make room for `need` entries at load <= 1/2. */
static int ensure_room(kvs_result_map *m, size_t need)
{
    if (need <= m->capacity / 2)
        return KVS_OK;
    size_t capacity = m->capacity ? m->capacity : MIN_CAPACITY;
    while (need > capacity / 2) {
        if (capacity > SIZE_MAX / 2 / sizeof(void *))
            return kvs_set_error(KVS_ENOMEM, "result map: %zu entries is too many", need);
        capacity *= 2;
    }
    return rehash(m, capacity);
}

static void maybe_shrink(kvs_result_map *m)
{
    size_t live = m->count + m->reserved;
    if (m->capacity <= MIN_CAPACITY || live * 8 > m->capacity)
        return;
    size_t capacity = m->capacity;
    while (capacity > MIN_CAPACITY && live * 4 <= capacity / 2)
        capacity /= 2;
    /* A failed shrink only costs memory; keep the bigger table. */
    (void)rehash(m, capacity);
}

static size_t find_slot(const kvs_result_map *m, uint64_t key)
{
    if (m->capacity == 0)
        return SIZE_MAX;
    size_t mask = m->capacity - 1;
    for (size_t i = home_slot(key, mask);; i = (i + 1) & mask) {
        if (m->values[i] == NULL)
            return SIZE_MAX;
        if (m->keys[i] == key)
            return i;
    }
}

int kvs_result_map_reserve(kvs_result_map *m)
{
    int rc = ensure_room(m, m->count + m->reserved + 1);
    if (rc == KVS_OK)
        m->reserved++;
    return rc;
}

void kvs_result_map_unreserve(kvs_result_map *m)
{
    if (m->reserved > 0) {
        m->reserved--;
        maybe_shrink(m);
    }
}

int kvs_result_map_put_reserved(kvs_result_map *m, uint64_t key, void *value)
{
    if (value == NULL)
        return kvs_set_error(KVS_EINVAL, "result map: NULL value for key %llu",
                             (unsigned long long)key);
    if (m->reserved == 0)
        return kvs_set_error(KVS_EINVAL, "result map: put_reserved without a reservation");
    if (find_slot(m, key) != SIZE_MAX)
        return kvs_set_error(KVS_EEXIST, "result map: key %llu already present",
                             (unsigned long long)key);
    /* The reservation guarantees a free slot at load <= 1/2. */
    m->reserved--;
    insert_slot(m->keys, m->values, m->capacity, key, value);
    m->count++;
    return KVS_OK;
}

int kvs_result_map_put(kvs_result_map *m, uint64_t key, void *value)
{
    if (value == NULL)
        return kvs_set_error(KVS_EINVAL, "result map: NULL value for key %llu",
                             (unsigned long long)key);
    if (find_slot(m, key) != SIZE_MAX)
        return kvs_set_error(KVS_EEXIST, "result map: key %llu already present",
                             (unsigned long long)key);
    int rc = ensure_room(m, m->count + m->reserved + 1);
    if (rc != KVS_OK)
        return rc;
    insert_slot(m->keys, m->values, m->capacity, key, value);
    m->count++;
    return KVS_OK;
}

void *kvs_result_map_pop(kvs_result_map *m, uint64_t key)
{
    size_t i = find_slot(m, key);
    if (i == SIZE_MAX)
        return NULL;
    void *value = m->values[i];
    m->values[i] = NULL;
    m->count--;

    /* Backward-shift deletion: walk the rest of the run and move back every
     * entry whose home slot is not in (i, j], so no lookup ever stops early
     * at the hole we just made. */
    size_t mask = m->capacity - 1;
    for (size_t j = (i + 1) & mask; m->values[j] != NULL; j = (j + 1) & mask) {
        size_t home = home_slot(m->keys[j], mask);
        int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
        if (stays)
            continue;
        m->keys[i] = m->keys[j];
        m->values[i] = m->values[j];
        m->values[j] = NULL;
        i = j;
    }
    maybe_shrink(m);
    return value;
}

void *kvs_result_map_get(const kvs_result_map *m, uint64_t key)
{
    size_t i = find_slot(m, key);
    return i == SIZE_MAX ? NULL : m->values[i];
}

size_t kvs_result_map_count(const kvs_result_map *m) { return m->count; }
