/* name_index.h - the tool's one way to look names up: a sorted index over
 * the names of an array of structs, built in O(n log n) and searched in
 * O(log n), in byte order (strcmp). A safetensors file can hold about
 * 900,000 tensors (docs/cli.md), so every lookup by name - a file's tensors
 * and __metadata__ keys, kvserde's metadata entries naming tensors,
 * `inspect --compare` matching two files, the writer's duplicate checks -
 * goes through one of these instead of a linear scan.
 *
 * The index borrows the names: they must outlive it and not change. */
#ifndef KVSERDE_TOOL_NAME_INDEX_H
#define KVSERDE_TOOL_NAME_INDEX_H

#include <stddef.h>
#include <stdint.h>

/* What kvs_name_index_find returns for a name that is not there. */
#define KVS_NAME_NONE SIZE_MAX

typedef struct kvs_name_entry {
    const char *name;
    size_t index; /* the item's position in the indexed array */
} kvs_name_entry;

typedef struct kvs_name_index {
    size_t n;
    kvs_name_entry *entries; /* by name; equal names by index */
} kvs_name_index;

/* Index n items of `stride` bytes each at `items`; item i's name is the
 * (const) char * stored name_offset bytes into it (offsetof(type, field)).
 * Returns KVS_OK, or KVS_ENOMEM with a message (and *ix empty). */
int kvs_name_index_build(kvs_name_index *ix, const void *items, size_t n, size_t stride,
                         size_t name_offset);
void kvs_name_index_free(kvs_name_index *ix);

/* The index of the (first) item named `name`, or KVS_NAME_NONE. */
size_t kvs_name_index_find(const kvs_name_index *ix, const char *name);

/* A name that more than one item has (the smallest such), or NULL. */
const char *kvs_name_index_duplicate(const kvs_name_index *ix);

#endif /* KVSERDE_TOOL_NAME_INDEX_H */
