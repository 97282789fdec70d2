/* registry.c - the process-global L2 adapter registry (upstream
 * register_l2_adapter_type / the adapter config parser): type names ->
 * factories, and creation of an adapter from a JSON spec, wrapped in the
 * serde wrapper when the spec has a "serde" dict.
 *
 * Like the serde registry, the table is global mutable state behind a
 * mutex, and the built-ins ("fs", "memory", "redis") are registered exactly once
 * before any use. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/l2.h"
#include "kvserde/processor.h"
#include "kvserde/registry.h"
#include "l2/builtins.h"
#include "util/name_list.h"

#define MAX_L2_TYPES 64
#define MAX_NAME_LEN 63

typedef struct entry {
    char name[MAX_NAME_LEN + 1];
    kvs_l2_factory_fn factory;
    void *userdata;
} entry;

static entry table[MAX_L2_TYPES];
static size_t table_len;
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;

static int register_locked(const char *name, kvs_l2_factory_fn factory, void *userdata)
{
    for (size_t i = 0; i < table_len; i++)
        if (strcmp(table[i].name, name) == 0)
            return kvs_set_error(KVS_EEXIST, "L2 adapter type already registered: '%s'",
                                 name);
    if (table_len == MAX_L2_TYPES)
        return kvs_set_error(KVS_ENOSPC, "l2 registry is full: %d types", MAX_L2_TYPES);
    entry *e = &table[table_len++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->factory = factory;
    e->userdata = userdata;
    return KVS_OK;
}

static void register_builtins(void)
{
    pthread_mutex_lock(&table_lock);
    register_locked("fs", kvs_fs_adapter_factory, NULL);
    register_locked("memory", kvs_memory_adapter_factory, NULL);
    register_locked("redis", kvs_redis_adapter_factory, NULL);
    pthread_mutex_unlock(&table_lock);
}

int kvs_l2_register(const char *name, kvs_l2_factory_fn factory, void *userdata)
{
    if (name == NULL || factory == NULL)
        return kvs_set_error(KVS_EINVAL, "l2 registry: NULL name or factory");
    size_t len = strlen(name);
    if (len == 0 || len > MAX_NAME_LEN)
        return kvs_set_error(KVS_EINVAL,
                             "l2 registry: name must be 1 to %d characters, got %zu",
                             MAX_NAME_LEN, len);
    pthread_once(&builtins_once, register_builtins);
    pthread_mutex_lock(&table_lock);
    int rc = register_locked(name, factory, userdata);
    pthread_mutex_unlock(&table_lock);
    return rc;
}

size_t kvs_l2_types(const char **names, size_t cap)
{
    pthread_once(&builtins_once, register_builtins);
    pthread_mutex_lock(&table_lock);
    size_t n = table_len;
    for (size_t i = 0; i < n && i < cap && names; i++) names[i] = table[i].name;
    pthread_mutex_unlock(&table_lock);
    return n;
}

/* Find `name`; on a miss the message lists what is registered, sorted (as
 * upstream's messages do). */
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
    const char *sorted[MAX_L2_TYPES];
    size_t n = table_len;
    for (size_t i = 0; i < n; i++) sorted[i] = table[i].name;
    kvs_names_sort(sorted, n);
    char list[MAX_L2_TYPES * (MAX_NAME_LEN + 2)];
    kvs_names_join(sorted, n, "(none)", list, sizeof list);
    pthread_mutex_unlock(&table_lock);
    return kvs_set_error(KVS_EINVAL, "unknown L2 adapter type '%s'; registered: %s", name, list);
}

/* The "serde" sub-dict, checked as upstream's _parse_serde_config does:
 * absent -> *serde NULL (no wrapper); present it must be an object with a
 * string "type". */
static int parse_serde(const json_t *spec, const json_t **serde)
{
    *serde = json_object_get(spec, "serde");
    if (*serde == NULL) return KVS_OK;
    if (!json_is_object(*serde))
        return kvs_set_error(KVS_EINVAL, "'serde' must be a dict, got %s",
                             kvs_json_type_name(*serde));
    if (!json_is_string(json_object_get(*serde, "type")))
        return kvs_set_error(KVS_EINVAL, "'serde' dict must include a 'type' field");
    return KVS_OK;
}

/* "serde_pool_bytes": the wrapper's temp pool, an integer >= 0 (0 = the
 * wrapper's default). Only meaningful with a "serde" dict. */
static int parse_pool_bytes(const json_t *spec, const json_t *serde, uint64_t *out)
{
    *out = 0;
    const json_t *v = json_object_get(spec, "serde_pool_bytes");
    if (v == NULL) return KVS_OK;
    if (serde == NULL)
        return kvs_set_error(KVS_EINVAL,
                             "l2 config: 'serde_pool_bytes' given without a 'serde' dict");
    if (!json_is_integer(v))
        return kvs_set_error(KVS_EINVAL,
                             "l2 config: serde_pool_bytes must be an integer >= 0, got %s",
                             kvs_json_type_name(v));
    json_int_t n = json_integer_value(v);
    if (n < 0)
        return kvs_set_error(KVS_EINVAL,
                             "l2 config: serde_pool_bytes must be an integer >= 0, got %lld",
                             (long long)n);
    *out = (uint64_t)n;
    return KVS_OK;
}

/* Run the factory on the spec without the registry's keys. */
static int create_inner(const entry *e, const json_t *spec, kvs_l2_adapter **out)
{
    json_t *kwargs = json_copy((json_t *)spec);
    if (kwargs == NULL)
        return kvs_set_error(KVS_ENOMEM, "l2 config: out of memory copying the spec");
    json_object_del(kwargs, "type");
    json_object_del(kwargs, "serde");
    json_object_del(kwargs, "serde_pool_bytes");
    kvs_l2_adapter *a = NULL;
    kvs_clear_error();
    int rc = e->factory(kwargs, e->userdata, &a);
    json_decref(kwargs);
    if (rc == KVS_OK && a == NULL)
        return kvs_set_error(KVS_EINVAL, "l2 config: factory '%s' returned no adapter",
                             e->name);
    if (rc != KVS_OK) {
        if (kvs_last_error_code() != rc)
            kvs_set_error(rc, "l2 config: factory '%s' failed: %s", e->name,
                          kvs_strerror(rc));
        return rc;
    }
    *out = a;
    return KVS_OK;
}

int kvs_l2_create_json(const json_t *spec, kvs_l2_adapter **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "l2 config: NULL output");
    *out = NULL;
    if (spec == NULL) return kvs_set_error(KVS_EINVAL, "l2 config: NULL config");
    if (!json_is_object(spec))
        return kvs_set_error(KVS_EINVAL, "l2 config: must be a JSON object, got %s",
                             kvs_json_type_name(spec));
    const json_t *type = json_object_get(spec, "type");
    if (type == NULL) return kvs_set_error(KVS_EINVAL, "l2 config: missing 'type' field");
    if (!json_is_string(type))
        return kvs_set_error(KVS_EINVAL, "l2 config: 'type' must be a string, got %s",
                             kvs_json_type_name(type));
    entry e;
    int rc = lookup(json_string_value(type), &e);
    if (rc) return rc;
    const json_t *serde;
    kvs_serde_wrapper_options opts = {0};
    if ((rc = parse_serde(spec, &serde)) ||
        (rc = parse_pool_bytes(spec, serde, &opts.temp_pool_bytes)))
        return rc;

    /* The processor first: a bad serde config is refused before the
     * adapter exists (an fs adapter would already have made its
     * directory). */
    kvs_processor *proc = NULL;
    kvs_multi_processor *mproc = NULL;
    if (serde) {
        const char *st = json_string_value(json_object_get(serde, "type"));
        kvs_serde_kind kind = KVS_SERDE_SINGLE;
        /* an unknown type is refused by the create call below */
        if (kvs_serde_type_kind(st, &kind) == KVS_OK && kind == KVS_SERDE_MULTI)
            rc = kvs_multi_serde_create_json(serde, &mproc);
        else
            rc = kvs_serde_create_json(serde, &proc);
        if (rc != KVS_OK) return rc;
    }
    kvs_l2_adapter *inner = NULL;
    rc = create_inner(&e, spec, &inner);
    if (rc != KVS_OK) {
        kvs_processor_destroy(proc);
        kvs_multi_processor_destroy(mproc);
        return rc;
    }
    if (proc == NULL && mproc == NULL) {
        *out = inner;
        return KVS_OK;
    }
    /* Takes ownership of inner and the processor in every case. */
    return kvs_serde_wrapper_create_named(inner, proc, mproc, &opts,
                                          json_string_value(json_object_get(serde, "type")),
                                          out);
}

int kvs_l2_create(const char *json_text, kvs_l2_adapter **out)
{
    if (out) *out = NULL;
    if (json_text == NULL) return kvs_set_error(KVS_EINVAL, "l2 config: NULL text");
    json_error_t err;
    json_t *spec = json_loads(json_text, JSON_REJECT_DUPLICATES, &err);
    if (spec == NULL)
        return kvs_set_error(KVS_EINVAL, "l2 config: invalid JSON at line %d, column %d: %s",
                             err.line, err.column, err.text);
    int rc = kvs_l2_create_json(spec, out);
    json_decref(spec);
    return rc;
}
