/* name_table.h - internal: the one lookup-table type of kvserde's
 * process-global registries (the serde registry, src/serde/registry.c, and
 * the L2 adapter registry, src/l2/registry.c): type names -> factories,
 * with listing, and the refusals of a duplicate, an unknown or a bad name
 * in one message shape, whichever registry says them.
 *
 * A table is global mutable state: a mutex guards it, and its built-ins are
 * registered exactly once (pthread_once) before any use, so the first call
 * of any kind sees them. Entries are copied out by value, so a caller never
 * holds a pointer into the table past the lock (only a name, which never
 * moves or changes once registered).
 *
 * The pipeline's stage table (src/frame/stage_registry.c) is not one of
 * these: it is a const array fixed at build time (stage ids are part of the
 * frame format), looked up by id as well as by name, with no registration
 * and so no lock and no duplicate to refuse. */
#ifndef KVS_UTIL_NAME_TABLE_H
#define KVS_UTIL_NAME_TABLE_H

#include <pthread.h>
#include <stddef.h>

#define KVS_NAME_TABLE_MAX 64      /* entries one table holds */
#define KVS_NAME_TABLE_NAME_MAX 63 /* bytes of a name, NUL excluded */

/* A factory of any signature: stored as this, called as what `kind` says
 * (a cast back to the registry's own type; C allows the round trip). */
typedef void (*kvs_name_table_fn)(void);

typedef struct kvs_name_entry {
    char name[KVS_NAME_TABLE_NAME_MAX + 1];
    int kind;              /* the registry's: e.g. single- or multi-output serde */
    kvs_name_table_fn fn;  /* the factory */
    void *userdata;        /* passed to the factory */
} kvs_name_entry;

typedef struct kvs_name_table {
    const char *what;      /* what a name names, in messages: "serde type" */
    const char *registry;  /* the registry, in messages: "serde registry" */
    void (*builtins)(void); /* registers the built-ins (kvs_name_table_add_builtin) */
    pthread_mutex_t lock;
    pthread_once_t once;
    size_t len;            /* guarded by lock, as entries */
    kvs_name_entry entries[KVS_NAME_TABLE_MAX];
} kvs_name_table;

/* A table as a static initializer. */
#define KVS_NAME_TABLE_INIT(what_, registry_, builtins_)                               \
    {                                                                                  \
        .what = (what_), .registry = (registry_), .builtins = (builtins_),             \
        .lock = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT, .len = 0         \
    }

/* Register `name` with e's kind, fn and userdata (e->name is ignored).
 * KVS_EINVAL "<registry>: NULL name or factory" (name or e->fn NULL),
 * "<registry>: name must be 1 to 63 characters, got N"; KVS_EEXIST
 * "<what> already registered: '<name>'" (the first registration stays);
 * KVS_ENOSPC "<registry> is full: 64 types". */
int kvs_name_table_add(kvs_name_table *t, const char *name, const kvs_name_entry *e);

/* For t->builtins only (it runs inside the once, so it must not wait for
 * it): add the built-in `name` (a literal, short enough) with e's kind, fn
 * and userdata. Refusals as above, which a built-in never meets. */
int kvs_name_table_add_builtin(kvs_name_table *t, const char *name, const kvs_name_entry *e);

/* The registered names in registration order into names[0..cap) (names may
 * be NULL with cap 0); returns how many are registered. */
size_t kvs_name_table_names(kvs_name_table *t, const char **names, size_t cap);

/* Copy the entry of `name` into *out. KVS_EINVAL "unknown <what> '<name>';
 * registered: a, b, c" (every name, sorted; "(none)" if empty). */
int kvs_name_table_find(kvs_name_table *t, const char *name, kvs_name_entry *out);

#endif /* KVS_UTIL_NAME_TABLE_H */
