/* lock_table.c - see lock_table.h. A chained hash table (FNV-1a of the
 * name), each entry holding its name inline so an entry is one
 * allocation. */
#include "l2/lock_table.h"

#include <stdlib.h>
#include <string.h>

struct kvs_l2_lock_entry {
    kvs_l2_lock_entry *next;
    uint64_t hash;
    uint64_t count; /* > 0: an entry at zero is dropped */
    char name[];
};

static uint64_t name_hash(const char *p)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *p; p++) {
        h ^= (unsigned char)*p;
        h *= 0x100000001b3ull; /* FNV-1a */
    }
    return h;
}

/* The link that points at name's entry, or the chain's final NULL link (where
 * a new entry goes). */
static kvs_l2_lock_entry **find_slot(const kvs_l2_lock_table *lt, const char *name,
                                     uint64_t h)
{
    kvs_l2_lock_entry **slot = &lt->buckets[h & (lt->nbuckets - 1)];
    while (*slot && !((*slot)->hash == h && strcmp((*slot)->name, name) == 0))
        slot = &(*slot)->next;
    return slot;
}

int kvs_l2_lock_table_init(kvs_l2_lock_table *lt)
{
    lt->nlocked = 0;
    lt->nbuckets = KVS_L2_LOCK_TABLE_INITIAL_BUCKETS;
    lt->buckets = calloc(lt->nbuckets, sizeof *lt->buckets);
    if (lt->buckets == NULL) {
        lt->nbuckets = 0;
        return -1;
    }
    return 0;
}

void kvs_l2_lock_table_destroy(kvs_l2_lock_table *lt)
{
    for (size_t b = 0; lt->buckets && b < lt->nbuckets; b++) {
        kvs_l2_lock_entry *e = lt->buckets[b];
        while (e) {
            kvs_l2_lock_entry *next = e->next;
            free(e);
            e = next;
        }
    }
    free(lt->buckets);
    lt->buckets = NULL;
    lt->nbuckets = 0;
    lt->nlocked = 0;
}

/* Double the bucket array when fuller than one entry per bucket, so chains
 * stay short however many keys are locked at once; a failed allocation only
 * keeps the chains longer (the add that triggered it has succeeded). */
static void maybe_grow(kvs_l2_lock_table *lt)
{
    if (lt->nlocked < lt->nbuckets) return;
    size_t nb = lt->nbuckets * 2;
    kvs_l2_lock_entry **nbk = calloc(nb, sizeof *nbk);
    if (nbk == NULL) return;
    for (size_t i = 0; i < lt->nbuckets; i++) {
        kvs_l2_lock_entry *e = lt->buckets[i];
        while (e) {
            kvs_l2_lock_entry *next = e->next;
            e->next = nbk[e->hash & (nb - 1)];
            nbk[e->hash & (nb - 1)] = e;
            e = next;
        }
    }
    free(lt->buckets);
    lt->buckets = nbk;
    lt->nbuckets = nb;
}

int kvs_l2_lock_table_add(kvs_l2_lock_table *lt, const char *name)
{
    uint64_t h = name_hash(name);
    kvs_l2_lock_entry **slot = find_slot(lt, name, h);
    if (*slot) {
        (*slot)->count++;
        return 0;
    }
    size_t len = strlen(name);
    kvs_l2_lock_entry *e = malloc(sizeof *e + len + 1);
    if (e == NULL) return -1;
    e->next = NULL;
    e->hash = h;
    e->count = 1;
    memcpy(e->name, name, len + 1);
    *slot = e;
    lt->nlocked++;
    maybe_grow(lt);
    return 0;
}

void kvs_l2_lock_table_release(kvs_l2_lock_table *lt, const char *name)
{
    kvs_l2_lock_entry **slot = find_slot(lt, name, name_hash(name));
    kvs_l2_lock_entry *e = *slot;
    if (e == NULL) return; /* not locked: ignored */
    if (--e->count == 0) {
        *slot = e->next;
        free(e);
        lt->nlocked--;
    }
}

uint64_t kvs_l2_lock_table_count(const kvs_l2_lock_table *lt, const char *name)
{
    const kvs_l2_lock_entry *e = *find_slot(lt, name, name_hash(name));
    return e ? e->count : 0;
}

size_t kvs_l2_lock_table_nlocked(const kvs_l2_lock_table *lt) { return lt->nlocked; }
