/* name_index.c - a sorted index of names (see name_index.h). */
#include "name_index.h"

#include <stdlib.h>
#include <string.h>

#include "kvserde/kvserde.h"

static int cmp_entry(const void *a, const void *b)
{
    const kvs_name_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c) return c;
    return x->index < y->index ? -1 : x->index > y->index;
}

int kvs_name_index_build(kvs_name_index *ix, const void *items, size_t n, size_t stride,
                         size_t name_offset)
{
    memset(ix, 0, sizeof *ix);
    if (n == 0) return KVS_OK;
    if (n > SIZE_MAX / sizeof *ix->entries ||
        (ix->entries = malloc(n * sizeof *ix->entries)) == NULL)
        return kvs_set_error(KVS_ENOMEM, "out of memory indexing %zu names", n);
    const unsigned char *p = items;
    for (size_t i = 0; i < n; i++) {
        memcpy(&ix->entries[i].name, p + i * stride + name_offset, sizeof(const char *));
        ix->entries[i].index = i;
    }
    qsort(ix->entries, n, sizeof *ix->entries, cmp_entry);
    ix->n = n;
    return KVS_OK;
}

void kvs_name_index_free(kvs_name_index *ix)
{
    if (ix == NULL) return;
    free(ix->entries);
    memset(ix, 0, sizeof *ix);
}

size_t kvs_name_index_find(const kvs_name_index *ix, const char *name)
{
    /* The first entry not below `name`. */
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(ix->entries[mid].name, name) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < ix->n && strcmp(ix->entries[lo].name, name) == 0) return ix->entries[lo].index;
    return KVS_NAME_NONE;
}

const char *kvs_name_index_duplicate(const kvs_name_index *ix)
{
    for (size_t i = 1; i < ix->n; i++)
        if (strcmp(ix->entries[i].name, ix->entries[i - 1].name) == 0)
            return ix->entries[i].name;
    return NULL;
}
