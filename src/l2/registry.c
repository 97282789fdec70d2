/* registry.c - the process-global L2 adapter registry (upstream
 * register_l2_adapter_type / the adapter config parser): type names ->
 * factories, and creation of an adapter from a JSON spec, wrapped in the
 * serde wrapper when the spec has a "serde" dict.
 *
 * The table is the registries' one type (util/name_table.h), as the serde
 * registry's: global mutable state behind a mutex, the built-ins ("fs",
 * "memory", "redis") registered exactly once before any use. */
#include <stdio.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/l2.h"
#include "kvserde/processor.h"
#include "kvserde/registry.h"
#include "l2/builtins.h"
#include "util/name_table.h"

static void register_builtins(void);

static kvs_name_table table =
    KVS_NAME_TABLE_INIT("L2 adapter type", "l2 registry", register_builtins);

static void register_builtins(void)
{
    const kvs_name_entry fs = {.fn = (kvs_name_table_fn)kvs_fs_adapter_factory};
    const kvs_name_entry memory = {.fn = (kvs_name_table_fn)kvs_memory_adapter_factory};
    const kvs_name_entry redis = {.fn = (kvs_name_table_fn)kvs_redis_adapter_factory};
    (void)kvs_name_table_add_builtin(&table, "fs", &fs);
    (void)kvs_name_table_add_builtin(&table, "memory", &memory);
    (void)kvs_name_table_add_builtin(&table, "redis", &redis);
}

int kvs_l2_register(const char *name, kvs_l2_factory_fn factory, void *userdata)
{
    kvs_name_entry e = {.fn = (kvs_name_table_fn)factory, .userdata = userdata};
    return kvs_name_table_add(&table, name, &e);
}

size_t kvs_l2_types(const char **names, size_t cap)
{
    return kvs_name_table_names(&table, names, cap);
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
static int create_inner(const kvs_name_entry *e, const json_t *spec, kvs_l2_adapter **out)
{
    json_t *kwargs = json_copy((json_t *)spec);
    if (kwargs == NULL)
        return kvs_set_error(KVS_ENOMEM, "l2 config: out of memory copying the spec");
    json_object_del(kwargs, "type");
    json_object_del(kwargs, "serde");
    json_object_del(kwargs, "serde_pool_bytes");
    kvs_l2_adapter *a = NULL;
    kvs_clear_error();
    int rc = ((kvs_l2_factory_fn)e->fn)(kwargs, e->userdata, &a);
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
    kvs_name_entry e;
    int rc = kvs_name_table_find(&table, json_string_value(type), &e);
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
