/* name_table.c - see name_table.h. */
#include "util/name_table.h"

#include <stdio.h>
#include <string.h>

#include "kvserde/error.h"
#include "util/name_list.h"

/* Caller holds t->lock. */
static int add_locked(kvs_name_table *t, const kvs_name_entry *e)
{
    for (size_t i = 0; i < t->len; i++)
        if (strcmp(t->entries[i].name, e->name) == 0)
            return kvs_set_error(KVS_EEXIST, "%s already registered: '%s'", t->what, e->name);
    if (t->len == KVS_NAME_TABLE_MAX)
        return kvs_set_error(KVS_ENOSPC, "%s is full: %d types", t->registry,
                             KVS_NAME_TABLE_MAX);
    t->entries[t->len++] = *e;
    return KVS_OK;
}

int kvs_name_table_add_builtin(kvs_name_table *t, const char *name, const kvs_name_entry *e)
{
    kvs_name_entry copy = *e;
    snprintf(copy.name, sizeof copy.name, "%s", name);
    pthread_mutex_lock(&t->lock);
    int rc = add_locked(t, &copy);
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int kvs_name_table_add(kvs_name_table *t, const char *name, const kvs_name_entry *e)
{
    if (name == NULL || e->fn == NULL)
        return kvs_set_error(KVS_EINVAL, "%s: NULL name or factory", t->registry);
    size_t len = strlen(name);
    if (len == 0 || len > KVS_NAME_TABLE_NAME_MAX)
        return kvs_set_error(KVS_EINVAL, "%s: name must be 1 to %d characters, got %zu",
                             t->registry, KVS_NAME_TABLE_NAME_MAX, len);
    pthread_once(&t->once, t->builtins);
    return kvs_name_table_add_builtin(t, name, e);
}

size_t kvs_name_table_names(kvs_name_table *t, const char **names, size_t cap)
{
    pthread_once(&t->once, t->builtins);
    pthread_mutex_lock(&t->lock);
    size_t n = t->len;
    for (size_t i = 0; names && i < n && i < cap; i++) names[i] = t->entries[i].name;
    pthread_mutex_unlock(&t->lock);
    return n;
}

int kvs_name_table_find(kvs_name_table *t, const char *name, kvs_name_entry *out)
{
    pthread_once(&t->once, t->builtins);
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < t->len; i++) {
        if (strcmp(t->entries[i].name, name) == 0) {
            *out = t->entries[i];
            pthread_mutex_unlock(&t->lock);
            return KVS_OK;
        }
    }
    const char *sorted[KVS_NAME_TABLE_MAX];
    size_t n = t->len;
    for (size_t i = 0; i < n; i++) sorted[i] = t->entries[i].name;
    kvs_names_sort(sorted, n);
    char list[KVS_NAME_TABLE_MAX * (KVS_NAME_TABLE_NAME_MAX + 2)];
    kvs_names_join(sorted, n, "(none)", list, sizeof list);
    pthread_mutex_unlock(&t->lock);
    return kvs_set_error(KVS_EINVAL, "unknown %s '%s'; registered: %s", t->what, name, list);
}
