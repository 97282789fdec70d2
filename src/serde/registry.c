/* registry.c - the process-global serde registry (upstream factory.py):
 * names -> factories, and creation from a JSON config. The table is the one
 * piece of global mutable state in kvserde; a mutex guards it, and the
 * built-ins are registered exactly once before any use. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "core/error_internal.h"
#include "kvserde/error.h"
#include "kvserde/processor.h"
#include "kvserde/registry.h"
#include "serde/builtins.h"

#define MAX_SERDE_TYPES 64
#define MAX_NAME_LEN 63

typedef struct entry {
    char name[MAX_NAME_LEN + 1];
    kvs_serde_factory_fn factory;
    void *userdata;
} entry;

static entry table[MAX_SERDE_TYPES];
static size_t table_len;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;

static int register_locked(const char *name, kvs_serde_factory_fn factory,
                           void *userdata)
{
    for (size_t i = 0; i < table_len; i++)
        if (strcmp(table[i].name, name) == 0)
            return kvs_set_error(KVS_EEXIST, "serde type already registered: '%s'", name);
    if (table_len == MAX_SERDE_TYPES)
        return kvs_set_error(KVS_ENOSPC, "serde registry is full: %d types",
                             MAX_SERDE_TYPES);
    entry *e = &table[table_len++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->factory = factory;
    e->userdata = userdata;
    return KVS_OK;
}

static void register_builtins(void)
{
    pthread_mutex_lock(&table_lock);
    register_locked("fp8", kvs_fp8_factory, NULL);
    pthread_mutex_unlock(&table_lock);
}

int kvs_serde_register(const char *name, kvs_serde_factory_fn factory, void *userdata)
{
    if (name == NULL || factory == NULL)
        return kvs_set_error(KVS_EINVAL, "serde registry: NULL name or factory");
    size_t len = strlen(name);
    if (len == 0 || len > MAX_NAME_LEN)
        return kvs_set_error(KVS_EINVAL,
                             "serde registry: name must be 1 to %d characters, got %zu",
                             MAX_NAME_LEN, len);
    pthread_once(&builtins_once, register_builtins);
    pthread_mutex_lock(&table_lock);
    int rc = register_locked(name, factory, userdata);
    pthread_mutex_unlock(&table_lock);
    return rc;
}

size_t kvs_serde_types(const char **names, size_t cap)
{
    pthread_once(&builtins_once, register_builtins);
    pthread_mutex_lock(&table_lock);
    size_t n = table_len;
    for (size_t i = 0; i < n && i < cap; i++) names[i] = table[i].name;
    pthread_mutex_unlock(&table_lock);
    return n;
}

/* Find `name`; on a miss, the message lists what is registered (sorted, as
 * upstream does). */
static int lookup(const char *name, entry *out)
{
    pthread_once(&builtins_once, register_builtins);
    pthread_mutex_lock(&table_lock);
    for (size_t i = 0; i < table_len; i++) {
        if (strcmp(table[i].name, name) == 0) {
            *out = table[i];
            pthread_mutex_unlock(&table_lock);
            return KVS_OK;
        }
    }
    const char *sorted[MAX_SERDE_TYPES];
    size_t n = table_len;
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        for (; j > 0 && strcmp(sorted[j - 1], table[i].name) > 0; j--)
            sorted[j] = sorted[j - 1];
        sorted[j] = table[i].name;
    }
    char list[MAX_SERDE_TYPES * (MAX_NAME_LEN + 2)];
    size_t len = 0;
    list[0] = '\0';
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "",
                                sorted[i]);
    pthread_mutex_unlock(&table_lock);
    return kvs_set_error(KVS_EINVAL, "unknown serde type '%s'; registered: %s", name,
                         n ? list : "(none)");
}

int kvs_serde_create_pair_json(const json_t *config, kvs_serde_pair *out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL output");
    memset(out, 0, sizeof *out);
    if (config == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL config");
    if (!json_is_object(config))
        return kvs_set_error(KVS_EINVAL, "serde config: must be a JSON object, got %s",
                             kvs_json_type_name(config));
    const json_t *type = json_object_get(config, "type");
    if (type == NULL)
        return kvs_set_error(KVS_EINVAL, "serde config: missing 'type' field");
    if (!json_is_string(type))
        return kvs_set_error(KVS_EINVAL, "serde config: 'type' must be a string, got %s",
                             kvs_json_type_name(type));
    entry e;
    int rc = lookup(json_string_value(type), &e);
    if (rc) return rc;
    unsigned workers;
    rc = kvs_kwargs_get_positive_int(config, "serde config", "max_workers", 1, &workers);
    if (rc) return rc;

    /* The factory sees its own kwargs only: a shallow copy without the
     * registry's two keys. */
    json_t *kwargs = json_copy((json_t *)config);
    if (kwargs == NULL)
        return kvs_set_error(KVS_ENOMEM, "serde config: out of memory copying kwargs");
    json_object_del(kwargs, "type");
    json_object_del(kwargs, "max_workers");
    kvs_serde_pair pair = {0};
    unsigned long serial = kvs_error_serial();
    rc = e.factory(kwargs, e.userdata, &pair);
    json_decref(kwargs);
    if (rc == KVS_OK && (pair.serializer == NULL || pair.deserializer == NULL)) {
        kvs_serde_pair_destroy(&pair);
        return kvs_set_error(KVS_EINVAL,
                             "serde config: factory '%s' returned no serializer or "
                             "deserializer",
                             e.name);
    }
    if (rc != KVS_OK) {
        kvs_serde_pair_destroy(&pair);
        if (kvs_error_serial() == serial)
            kvs_set_error(rc, "serde config: factory '%s' failed: %s", e.name,
                          kvs_strerror(rc));
        return rc;
    }
    pair.max_workers = workers;
    *out = pair;
    return KVS_OK;
}

int kvs_serde_create_pair(const char *json_text, kvs_serde_pair *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (json_text == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL text");
    json_error_t err;
    json_t *config = json_loads(json_text, JSON_REJECT_DUPLICATES, &err);
    if (config == NULL)
        return kvs_set_error(KVS_EINVAL, "serde config: invalid JSON at line %d, column %d: %s",
                             err.line, err.column, err.text);
    int rc = kvs_serde_create_pair_json(config, out);
    json_decref(config);
    return rc;
}

void kvs_serde_pair_destroy(kvs_serde_pair *pair)
{
    if (pair == NULL) return;
    kvs_serializer_destroy(pair->serializer);
    kvs_deserializer_destroy(pair->deserializer);
    memset(pair, 0, sizeof *pair);
}

/* Both creators take ownership of the pair: kvs_async_processor_create
 * destroys it itself if it fails. */
static int processor_from_pair(kvs_serde_pair *pair, kvs_processor **out)
{
    return kvs_async_processor_create(pair->serializer, pair->deserializer,
                                      pair->max_workers, out);
}

int kvs_serde_create_json(const json_t *config, kvs_processor **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL output");
    kvs_serde_pair pair;
    int rc = kvs_serde_create_pair_json(config, &pair);
    return rc ? rc : processor_from_pair(&pair, out);
}

int kvs_serde_create(const char *json_text, kvs_processor **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL output");
    kvs_serde_pair pair;
    int rc = kvs_serde_create_pair(json_text, &pair);
    return rc ? rc : processor_from_pair(&pair, out);
}
