/* registry.c - the process-global serde registry (upstream factory.py):
 * names -> factories, and creation from a JSON config. The table is the
 * registries' one type (util/name_table.h): global mutable state behind a
 * mutex, the built-ins registered exactly once before any use.
 *
 * Single- and multi-output serdes share the table (one name space); each
 * entry carries its kind, and the create functions of one kind refuse the
 * other's names, pointing at the right function. */
#include <stdio.h>
#include <string.h>

#include "core/error_internal.h"
#include "kvserde/error.h"
#include "kvserde/multi_processor.h"
#include "kvserde/processor.h"
#include "kvserde/registry.h"
#include "serde/builtins.h"
#include "util/name_table.h"

static void register_builtins(void);

/* An entry's kind is its kvs_serde_kind; its fn a kvs_serde_factory_fn
 * (single) or a kvs_multi_serde_factory_fn (multi). */
static kvs_name_table table =
    KVS_NAME_TABLE_INIT("serde type", "serde registry", register_builtins);

static void register_builtins(void)
{
    const kvs_name_entry fp8 = {.kind = KVS_SERDE_SINGLE,
                                .fn = (kvs_name_table_fn)kvs_fp8_factory};
    const kvs_name_entry kv_split = {.kind = KVS_SERDE_MULTI,
                                     .fn = (kvs_name_table_fn)kvs_kv_split_factory};
    const kvs_name_entry pipeline = {.kind = KVS_SERDE_SINGLE,
                                     .fn = (kvs_name_table_fn)kvs_pipeline_factory};
    const kvs_name_entry q8_0 = {.kind = KVS_SERDE_SINGLE,
                                 .fn = (kvs_name_table_fn)kvs_ggml_q8_0_factory};
    const kvs_name_entry q4_0 = {.kind = KVS_SERDE_SINGLE,
                                 .fn = (kvs_name_table_fn)kvs_ggml_q4_0_factory};
    (void)kvs_name_table_add_builtin(&table, "fp8", &fp8);
    (void)kvs_name_table_add_builtin(&table, "kv_split", &kv_split);
    (void)kvs_name_table_add_builtin(&table, "pipeline", &pipeline);
    (void)kvs_name_table_add_builtin(&table, "ggml_q8_0", &q8_0);
    (void)kvs_name_table_add_builtin(&table, "ggml_q4_0", &q4_0);
}

int kvs_serde_register(const char *name, kvs_serde_factory_fn factory, void *userdata)
{
    kvs_name_entry e = {.kind = KVS_SERDE_SINGLE, .fn = (kvs_name_table_fn)factory,
                        .userdata = userdata};
    return kvs_name_table_add(&table, name, &e);
}

int kvs_multi_serde_register(const char *name, kvs_multi_serde_factory_fn factory,
                             void *userdata)
{
    kvs_name_entry e = {.kind = KVS_SERDE_MULTI, .fn = (kvs_name_table_fn)factory,
                        .userdata = userdata};
    return kvs_name_table_add(&table, name, &e);
}

size_t kvs_serde_types(const char **names, size_t cap)
{
    return kvs_name_table_names(&table, names, cap);
}

const char *kvs_serde_kind_name(kvs_serde_kind kind)
{
    switch (kind) {
    case KVS_SERDE_SINGLE: return "single";
    case KVS_SERDE_MULTI: return "multi";
    }
    return "unknown";
}

int kvs_serde_type_kind(const char *name, kvs_serde_kind *out)
{
    if (name == NULL || out == NULL)
        return kvs_set_error(KVS_EINVAL, "serde registry: NULL %s",
                             name == NULL ? "name" : "output");
    kvs_name_entry e;
    int rc = kvs_name_table_find(&table, name, &e);
    if (rc) return rc;
    *out = (kvs_serde_kind)e.kind;
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * From a config to a factory call
 * ------------------------------------------------------------------ */

/* Everything both kinds do before calling the factory: validate the config,
 * find the type, check its kind (`instead` names the function of the other
 * kind for the refusal), read max_workers, and copy the kwargs the factory
 * may see (the config without "type" and "max_workers"). */
static int prepare(const json_t *config, kvs_serde_kind want, const char *instead,
                   kvs_name_entry *e, unsigned *workers, json_t **kwargs)
{
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
    int rc = kvs_name_table_find(&table, json_string_value(type), e);
    if (rc) return rc;
    /* Said for a person at a shell as much as for a C caller: no function
     * names (`instead` is kept for the comment trail of callers). */
    (void)instead;
    if (e->kind != (int)want)
        return kvs_set_error(KVS_EINVAL,
                             e->kind == KVS_SERDE_MULTI
                                 ? "serde type '%s' is multi-output (a group of tensors per "
                                   "blob, such as K and V); create it with the multi-output API"
                                 : "serde type '%s' is single-output (one tensor per blob); "
                                   "create it with the single-output API",
                             e->name);
    rc = kvs_kwargs_get_positive_int(config, "serde config", "max_workers", 1, workers);
    if (rc) return rc;

    /* A shallow copy without the registry's two keys. */
    *kwargs = json_copy((json_t *)config);
    if (*kwargs == NULL)
        return kvs_set_error(KVS_ENOMEM, "serde config: out of memory copying kwargs");
    json_object_del(*kwargs, "type");
    json_object_del(*kwargs, "max_workers");
    return KVS_OK;
}

/* A failed factory must say why; if it did not, say which one failed. */
static int factory_failed(int rc, unsigned long serial, const kvs_name_entry *e)
{
    if (kvs_error_serial() == serial)
        kvs_set_error(rc, "serde config: factory '%s' failed: %s", e->name, kvs_strerror(rc));
    return rc;
}

static int single_pair_json(const json_t *config, const char *instead, kvs_serde_pair *out)
{
    memset(out, 0, sizeof *out);
    kvs_name_entry e;
    unsigned workers;
    json_t *kwargs;
    int rc = prepare(config, KVS_SERDE_SINGLE, instead, &e, &workers, &kwargs);
    if (rc) return rc;
    kvs_serde_pair pair = {0};
    unsigned long serial = kvs_error_serial();
    rc = ((kvs_serde_factory_fn)e.fn)(kwargs, e.userdata, &pair);
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
        return factory_failed(rc, serial, &e);
    }
    pair.max_workers = workers;
    *out = pair;
    return KVS_OK;
}

static int multi_pair_json(const json_t *config, const char *instead,
                           kvs_multi_serde_pair *out)
{
    memset(out, 0, sizeof *out);
    kvs_name_entry e;
    unsigned workers;
    json_t *kwargs;
    int rc = prepare(config, KVS_SERDE_MULTI, instead, &e, &workers, &kwargs);
    if (rc) return rc;
    kvs_multi_serde_pair pair = {0};
    unsigned long serial = kvs_error_serial();
    rc = ((kvs_multi_serde_factory_fn)e.fn)(kwargs, e.userdata, &pair);
    json_decref(kwargs);
    if (rc != KVS_OK) {
        kvs_multi_serde_pair_destroy(&pair);
        return factory_failed(rc, serial, &e);
    }
    if (pair.serializer == NULL || pair.deserializer == NULL) {
        kvs_multi_serde_pair_destroy(&pair);
        return kvs_set_error(KVS_EINVAL,
                             "serde config: factory '%s' returned no serializer or "
                             "deserializer",
                             e.name);
    }
    if (pair.serializer->group_size == 0 ||
        pair.serializer->group_size != pair.deserializer->group_size) {
        size_t gs = pair.serializer->group_size, gd = pair.deserializer->group_size;
        kvs_multi_serde_pair_destroy(&pair);
        return kvs_set_error(KVS_EINVAL,
                             "serde config: factory '%s' returned group sizes %zu "
                             "(serializer) and %zu (deserializer)",
                             e.name, gs, gd);
    }
    pair.max_workers = workers;
    *out = pair;
    return KVS_OK;
}

/* Parse JSON text for the create functions; *config is NULL on failure. */
static int parse_text(const char *json_text, json_t **config)
{
    *config = NULL;
    if (json_text == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL text");
    json_error_t err;
    *config = json_loads(json_text, JSON_REJECT_DUPLICATES, &err);
    if (*config == NULL)
        return kvs_set_error(KVS_EINVAL, "serde config: invalid JSON at line %d, column %d: %s",
                             err.line, err.column, err.text);
    return KVS_OK;
}

/* ----- single ------------------------------------------------------- */

int kvs_serde_create_pair_json(const json_t *config, kvs_serde_pair *out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL output");
    return single_pair_json(config, "kvs_multi_serde_create_pair", out);
}

int kvs_serde_create_pair(const char *json_text, kvs_serde_pair *out)
{
    if (out) memset(out, 0, sizeof *out);
    json_t *config;
    int rc = parse_text(json_text, &config);
    if (rc) return rc;
    rc = kvs_serde_create_pair_json(config, out);
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

/* kvs_async_processor_create takes ownership of the pair: it destroys it
 * itself if it fails. */
int kvs_serde_create_json(const json_t *config, kvs_processor **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL output");
    kvs_serde_pair pair;
    int rc = single_pair_json(config, "kvs_multi_serde_create", &pair);
    if (rc) return rc;
    return kvs_async_processor_create(pair.serializer, pair.deserializer, pair.max_workers,
                                      out);
}

int kvs_serde_create(const char *json_text, kvs_processor **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL output");
    json_t *config;
    int rc = parse_text(json_text, &config);
    if (rc) return rc;
    rc = kvs_serde_create_json(config, out);
    json_decref(config);
    return rc;
}

/* ----- multi -------------------------------------------------------- */

int kvs_multi_serde_create_pair_json(const json_t *config, kvs_multi_serde_pair *out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL output");
    return multi_pair_json(config, "kvs_serde_create_pair", out);
}

int kvs_multi_serde_create_pair(const char *json_text, kvs_multi_serde_pair *out)
{
    if (out) memset(out, 0, sizeof *out);
    json_t *config;
    int rc = parse_text(json_text, &config);
    if (rc) return rc;
    rc = kvs_multi_serde_create_pair_json(config, out);
    json_decref(config);
    return rc;
}

int kvs_multi_serde_create_json(const json_t *config, kvs_multi_processor **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL output");
    kvs_multi_serde_pair pair;
    int rc = multi_pair_json(config, "kvs_serde_create", &pair);
    if (rc) return rc;
    return kvs_async_multi_processor_create(pair.serializer, pair.deserializer,
                                            pair.max_workers, out);
}

int kvs_multi_serde_create(const char *json_text, kvs_multi_processor **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "serde config: NULL output");
    json_t *config;
    int rc = parse_text(json_text, &config);
    if (rc) return rc;
    rc = kvs_multi_serde_create_json(config, out);
    json_decref(config);
    return rc;
}
