/* test_l2_registry.c - the L2 adapter registry (kvs_l2_register /
 * kvs_l2_types / kvs_l2_create): built-ins, creation of the memory adapter
 * from JSON, every refusal with its exact message, the "serde" sub-dict as
 * upstream's config parser treats it (upstream test_factory.py cases 23-26),
 * duplicate registration, and a custom adapter type that sees its spec
 * without the registry's keys. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvs_test.h"
#include "kvserde/l2.h"
#include "kvserde/l2_memory.h"
#include "kvserde/registry.h"

/* ---------------------------------------------------------------------
 * A custom adapter type: records the spec it was given and builds a memory
 * adapter (or fails as told).
 * ------------------------------------------------------------------ */

static struct {
    int calls;
    char spec[1024];
    void *userdata;
} seen;

static int custom_factory(const json_t *spec, void *userdata, kvs_l2_adapter **out)
{
    seen.calls++;
    seen.userdata = userdata;
    char *text = json_dumps(spec, JSON_SORT_KEYS | JSON_COMPACT);
    snprintf(seen.spec, sizeof seen.spec, "%s", text ? text : "(null)");
    free(text);
    return kvs_memory_adapter_create(NULL, out);
}

static int failing_factory(const json_t *spec, void *userdata, kvs_l2_adapter **out)
{
    (void)spec;
    (void)out;
    if (userdata) return kvs_set_error(KVS_ENOSPC, "custom: no room for %d", 7);
    return KVS_EIO; /* no message of its own */
}

static int null_factory(const json_t *spec, void *userdata, kvs_l2_adapter **out)
{
    (void)spec;
    (void)userdata;
    *out = NULL;
    return KVS_OK;
}

static void reset_seen(void)
{
    memset(&seen, 0, sizeof seen);
}

/* ---------------------------------------------------------------------
 * Built-ins and creation
 * ------------------------------------------------------------------ */

static void test_builtins_registered(void)
{
    CHECK_EQ_INT(kvs_l2_types(NULL, 0), 3);
    const char *names[8];
    size_t n = kvs_l2_types(names, 8);
    REQUIRE(n == 3);
    CHECK_EQ_STR(names[0], "fs");
    CHECK_EQ_STR(names[1], "memory");
    CHECK_EQ_STR(names[2], "redis");
    /* cap smaller than the count: only cap written, total returned. */
    const char *one[1] = {NULL};
    CHECK_EQ_INT(kvs_l2_types(one, 1), n);
    CHECK_EQ_STR(one[0], "fs");
}

static void test_create_memory_from_json(void)
{
    kvs_l2_adapter *a = NULL;
    REQUIRE_OK(kvs_l2_create("{\"type\": \"memory\"}", &a));
    REQUIRE(a != NULL);
    CHECK_EQ_STR(a->ops->name, "memory");
    json_t *st;
    REQUIRE_OK(kvs_l2_status(a, &st));
    CHECK_EQ_STR(json_string_value(json_object_get(st, "type")), "memory");
    CHECK(json_is_true(json_object_get(st, "is_healthy")));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "capacity_bytes")), 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "workers")), 1);
    json_decref(st);
    kvs_l2_destroy(a);

    REQUIRE_OK(kvs_l2_create(
        "{\"type\": \"memory\", \"capacity_bytes\": 4096, \"workers\": 3}", &a));
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.capacity, 4096);
    REQUIRE_OK(kvs_l2_status(a, &st));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "workers")), 3);
    json_decref(st);
    /* It is a memory adapter: faults can be injected. */
    kvs_memory_fault f = {.op = KVS_MEMORY_FAULT_LOAD, .status = KVS_EIO};
    CHECK_OK(kvs_memory_adapter_inject(a, &f));
    kvs_l2_destroy(a);

    /* workers as upstream's int(): 2.0 and "2" too. */
    REQUIRE_OK(kvs_l2_create("{\"type\": \"memory\", \"workers\": 2.0}", &a));
    kvs_l2_destroy(a);
    REQUIRE_OK(kvs_l2_create("{\"type\": \"memory\", \"workers\": \"2\", "
                             "\"capacity_bytes\": 0}",
                             &a));
    kvs_l2_destroy(a);

    /* From a parsed object; the caller's object is not changed. */
    json_t *spec = json_pack("{s:s, s:I}", "type", "memory", "capacity_bytes",
                             (json_int_t)100);
    REQUIRE_OK(kvs_l2_create_json(spec, &a));
    CHECK_EQ_INT(json_object_size(spec), 2);
    kvs_l2_destroy(a);
    json_decref(spec);
}

/* ---------------------------------------------------------------------
 * Refusals of the spec itself
 * ------------------------------------------------------------------ */

static void test_spec_refusals(void)
{
    kvs_l2_adapter *a = (kvs_l2_adapter *)&a; /* set to NULL on failure */
    CHECK_ERR(kvs_l2_create(NULL, &a), KVS_EINVAL, "l2 config: NULL text");
    CHECK(a == NULL);
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\"}", NULL), KVS_EINVAL,
              "l2 config: NULL output");
    CHECK_ERR(kvs_l2_create_json(NULL, &a), KVS_EINVAL, "l2 config: NULL config");
    CHECK_ERR(kvs_l2_create("{\"type\": ", &a), KVS_EINVAL,
              "l2 config: invalid JSON at line 1, column 9: unexpected token near end of file");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"type\": \"fs\"}", &a), KVS_EINVAL,
              "l2 config: invalid JSON at line 1, column 25: duplicate object key near "
              "'\"type\"'");
    CHECK_ERR(kvs_l2_create("[1, 2]", &a), KVS_EINVAL,
              "l2 config: must be a JSON object, got array");
    CHECK_ERR(kvs_l2_create("{}", &a), KVS_EINVAL, "l2 config: missing 'type' field");
    CHECK_ERR(kvs_l2_create("{\"path\": \"/tmp/x\"}", &a), KVS_EINVAL,
              "l2 config: missing 'type' field");
    CHECK_ERR(kvs_l2_create("{\"type\": 3}", &a), KVS_EINVAL,
              "l2 config: 'type' must be a string, got integer");
    CHECK_ERR(kvs_l2_create("{\"type\": null}", &a), KVS_EINVAL,
              "l2 config: 'type' must be a string, got null");
    json_t *arr = json_array();
    CHECK_ERR(kvs_l2_create_json(arr, &a), KVS_EINVAL,
              "l2 config: must be a JSON object, got array");
    json_decref(arr);
    CHECK(a == NULL);
}

/* Runs before any custom type is registered, so the list is the built-ins. */
static void test_unknown_type(void)
{
    kvs_l2_adapter *a;
    CHECK_ERR(kvs_l2_create("{\"type\": \"redis-nope\"}", &a), KVS_EINVAL,
              "unknown L2 adapter type 'redis-nope'; registered: fs, memory, redis");
    CHECK_ERR(kvs_l2_create("{\"type\": \"\"}", &a), KVS_EINVAL,
              "unknown L2 adapter type ''; registered: fs, memory, redis");
    /* The type is checked before the serde dict. */
    CHECK_ERR(kvs_l2_create("{\"type\": \"x\", \"serde\": \"fp8\"}", &a), KVS_EINVAL,
              "unknown L2 adapter type 'x'; registered: fs, memory, redis");
}

static void test_memory_spec_refusals(void)
{
    kvs_l2_adapter *a;
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"path\": \"/x\"}", &a), KVS_EINVAL,
              "memory: unknown key 'path'; accepted: capacity_bytes, workers");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"capacity_bytes\": -1}", &a),
              KVS_EINVAL, "memory: capacity_bytes must be an integer >= 0, got -1");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"capacity_bytes\": \"1k\"}", &a),
              KVS_EINVAL, "memory: capacity_bytes must be an integer >= 0, got string");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"capacity_bytes\": 1.5}", &a),
              KVS_EINVAL, "memory: capacity_bytes must be an integer >= 0, got real");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"workers\": 0}", &a), KVS_EINVAL,
              "memory: workers must be an integer from 1 to 1024, got 0");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"workers\": 2.5}", &a), KVS_EINVAL,
              "memory: workers must be an integer from 1 to 1024, got 2.5");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"workers\": \"two\"}", &a), KVS_EINVAL,
              "memory: workers must be an integer from 1 to 1024, got 'two'");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"workers\": 1025}", &a), KVS_EINVAL,
              "memory: workers must be an integer from 1 to 1024, got 1025");
}

/* ---------------------------------------------------------------------
 * The serde sub-dict (upstream _parse_serde_config)
 * ------------------------------------------------------------------ */

static void test_serde_must_be_a_dict(void)
{
    static const struct {
        const char *value, *type;
    } cases[] = {
        {"\"fp8\"", "string"}, {"3", "integer"},  {"1.5", "real"},
        {"[\"fp8\"]", "array"}, {"true", "boolean"}, {"null", "null"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char spec[128], msg[128];
        snprintf(spec, sizeof spec, "{\"type\": \"memory\", \"serde\": %s}", cases[i].value);
        snprintf(msg, sizeof msg, "'serde' must be a dict, got %s", cases[i].type);
        kvs_l2_adapter *a;
        CHECK_ERR(kvs_l2_create(spec, &a), KVS_EINVAL, msg);
    }
    /* Checked before the adapter's factory runs (no fs directory made). */
    kvs_l2_adapter *a;
    CHECK_ERR(kvs_l2_create("{\"type\": \"fs\", \"path\": \"/nonexistent/kvs\", "
                            "\"serde\": \"fp8\"}",
                            &a),
              KVS_EINVAL, "'serde' must be a dict, got string");
}

static void test_serde_dict_needs_type(void)
{
    kvs_l2_adapter *a;
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"serde\": "
                            "{\"fp8_dtype\": \"float8_e4m3fn\"}}",
                            &a),
              KVS_EINVAL, "'serde' dict must include a 'type' field");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"serde\": {}}", &a), KVS_EINVAL,
              "'serde' dict must include a 'type' field");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"serde\": {\"type\": 8}}", &a),
              KVS_EINVAL, "'serde' dict must include a 'type' field");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"serde\": {\"type\": null}}", &a),
              KVS_EINVAL, "'serde' dict must include a 'type' field");
}

/* What the serde registry itself says about a config, to compare with. */
static void serde_registry_error(const char *config, int *code, char *msg, size_t size)
{
    kvs_serde_pair pair;
    *code = kvs_serde_create_pair(config, &pair);
    snprintf(msg, size, "%s", kvs_last_error());
    kvs_serde_pair_destroy(&pair);
}

static void test_serde_registry_refusals_pass_through(void)
{
    reset_seen();
    REQUIRE_OK(kvs_l2_register("test-seen-serde", custom_factory, NULL));
    static const char *const bad[] = {
        "{\"type\": \"no-such-serde\"}",
        "{\"type\": \"fp8\", \"fp8_dtype\": \"float16\"}",
        "{\"type\": \"fp8\", \"max_workers\": 0}",
        "{\"type\": \"fp8\", \"foo\": 1}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int code;
        char want[KVS_ERROR_MSG_MAX], spec[512];
        serde_registry_error(bad[i], &code, want, sizeof want);
        CHECK(code < 0);
        snprintf(spec, sizeof spec, "{\"type\": \"test-seen-serde\", \"serde\": %s}", bad[i]);
        kvs_l2_adapter *a;
        CHECK_ERR(kvs_l2_create(spec, &a), code, want);
    }
    /* A bad serde config is refused before the adapter is built. */
    CHECK_EQ_INT(seen.calls, 0);

    /* So an fs adapter with a bad serde leaves no directory behind. */
    char parent[] = "/tmp/kvs_l2_registry_XXXXXX";
    REQUIRE(mkdtemp(parent) != NULL);
    char dir[128], spec[512];
    snprintf(dir, sizeof dir, "%s/store", parent);
    snprintf(spec, sizeof spec,
             "{\"type\": \"fs\", \"path\": \"%s\", \"serde\": {\"type\": \"fp8\", "
             "\"fp8_dtype\": \"float16\"}}",
             dir);
    int code;
    char want[KVS_ERROR_MSG_MAX];
    serde_registry_error("{\"type\": \"fp8\", \"fp8_dtype\": \"float16\"}", &code, want,
                         sizeof want);
    kvs_l2_adapter *a;
    CHECK_ERR(kvs_l2_create(spec, &a), code, want);
    struct stat sb;
    CHECK(stat(dir, &sb) != 0 && errno == ENOENT);
    CHECK(rmdir(parent) == 0);
}

static void test_serde_wraps_the_adapter(void)
{
    reset_seen();
    REQUIRE_OK(kvs_l2_register("test-wrapped", custom_factory, &seen));
    kvs_l2_adapter *a = NULL;
    REQUIRE_OK(kvs_l2_create("{\"type\": \"test-wrapped\", \"colour\": \"blue\", "
                             "\"serde\": {\"type\": \"fp8\", \"fp8_dtype\": \"float8_e5m2\"}, "
                             "\"serde_pool_bytes\": 65536, \"n\": 3}",
                             &a));
    REQUIRE(a != NULL);
    /* The factory saw its own keys only. */
    CHECK_EQ_INT(seen.calls, 1);
    CHECK_EQ_STR(seen.spec, "{\"colour\":\"blue\",\"n\":3}");
    CHECK(seen.userdata == &seen);
    /* And the result is the serde wrapper around it. */
    CHECK_EQ_STR(a->ops->name, "serde");
    json_t *st;
    REQUIRE_OK(kvs_l2_status(a, &st));
    CHECK(json_is_true(json_object_get(st, "serde_wrapped")));
    CHECK_EQ_STR(json_string_value(json_object_get(st, "type")), "memory");
    CHECK_EQ_INT(json_integer_value(
                     json_object_get(json_object_get(st, "serde_temp_pool"), "capacity_bytes")),
                 65536);
    json_decref(st);
    kvs_l2_destroy(a);

    /* Without "serde" there is no wrapper (upstream case 23). */
    reset_seen();
    REQUIRE_OK(kvs_l2_create("{\"type\": \"test-wrapped\"}", &a));
    CHECK_EQ_STR(a->ops->name, "memory");
    CHECK_EQ_STR(seen.spec, "{}");
    kvs_l2_destroy(a);

    /* The built-in memory type, wrapped. */
    REQUIRE_OK(kvs_l2_create("{\"type\": \"memory\", \"serde\": {\"type\": \"fp8\"}}", &a));
    CHECK_EQ_STR(a->ops->name, "serde");
    kvs_l2_destroy(a);
}

static void test_serde_pool_bytes(void)
{
    kvs_l2_adapter *a;
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"serde\": {\"type\": \"fp8\"}, "
                            "\"serde_pool_bytes\": -1}",
                            &a),
              KVS_EINVAL, "l2 config: serde_pool_bytes must be an integer >= 0, got -1");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"serde\": {\"type\": \"fp8\"}, "
                            "\"serde_pool_bytes\": \"1G\"}",
                            &a),
              KVS_EINVAL, "l2 config: serde_pool_bytes must be an integer >= 0, got string");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"serde\": {\"type\": \"fp8\"}, "
                            "\"serde_pool_bytes\": 2.5}",
                            &a),
              KVS_EINVAL, "l2 config: serde_pool_bytes must be an integer >= 0, got real");
    CHECK_ERR(kvs_l2_create("{\"type\": \"memory\", \"serde_pool_bytes\": 1024}", &a),
              KVS_EINVAL, "l2 config: 'serde_pool_bytes' given without a 'serde' dict");
    /* 0 is the wrapper's default. */
    REQUIRE_OK(kvs_l2_create("{\"type\": \"memory\", \"serde\": {\"type\": \"fp8\"}, "
                             "\"serde_pool_bytes\": 0}",
                             &a));
    kvs_l2_destroy(a);
}

/* ---------------------------------------------------------------------
 * Registration
 * ------------------------------------------------------------------ */

static void test_register_duplicates_and_refusals(void)
{
    CHECK_ERR(kvs_l2_register("fs", custom_factory, NULL), KVS_EEXIST,
              "L2 adapter type already registered: 'fs'");
    CHECK_ERR(kvs_l2_register("memory", custom_factory, NULL), KVS_EEXIST,
              "L2 adapter type already registered: 'memory'");
    REQUIRE_OK(kvs_l2_register("test-dup", custom_factory, NULL));
    CHECK_ERR(kvs_l2_register("test-dup", failing_factory, NULL), KVS_EEXIST,
              "L2 adapter type already registered: 'test-dup'");
    CHECK_ERR(kvs_l2_register(NULL, custom_factory, NULL), KVS_EINVAL,
              "l2 registry: NULL name or factory");
    CHECK_ERR(kvs_l2_register("x", NULL, NULL), KVS_EINVAL,
              "l2 registry: NULL name or factory");
    CHECK_ERR(kvs_l2_register("", custom_factory, NULL), KVS_EINVAL,
              "l2 registry: name must be 1 to 63 characters, got 0");
    char longname[65];
    memset(longname, 'n', 64);
    longname[64] = '\0';
    CHECK_ERR(kvs_l2_register(longname, custom_factory, NULL), KVS_EINVAL,
              "l2 registry: name must be 1 to 63 characters, got 64");
    longname[63] = '\0';
    CHECK_OK(kvs_l2_register(longname, custom_factory, NULL));
    /* The first registration stays in force. */
    reset_seen();
    kvs_l2_adapter *a;
    REQUIRE_OK(kvs_l2_create("{\"type\": \"test-dup\"}", &a));
    CHECK_EQ_INT(seen.calls, 1);
    kvs_l2_destroy(a);
    /* Registration order. */
    const char *names[64];
    size_t n = kvs_l2_types(names, 64);
    REQUIRE(n >= 4);
    CHECK_EQ_STR(names[0], "fs");
    CHECK_EQ_STR(names[1], "memory");
    int found = 0;
    for (size_t i = 2; i < n; i++) found += strcmp(names[i], "test-dup") == 0;
    CHECK_EQ_INT(found, 1);
    /* The unknown-type message lists every name, sorted. */
    char want[2048] = "unknown L2 adapter type 'zz'; registered: ";
    const char *sorted[64];
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        for (; j > 0 && strcmp(sorted[j - 1], names[i]) > 0; j--) sorted[j] = sorted[j - 1];
        sorted[j] = names[i];
    }
    for (size_t i = 0; i < n; i++) {
        if (i) strcat(want, ", ");
        strcat(want, sorted[i]);
    }
    CHECK_ERR(kvs_l2_create("{\"type\": \"zz\"}", &a), KVS_EINVAL, want);
}

static void test_factory_failures(void)
{
    static int marker;
    REQUIRE_OK(kvs_l2_register("test-fail-silent", failing_factory, NULL));
    REQUIRE_OK(kvs_l2_register("test-fail-loud", failing_factory, &marker));
    REQUIRE_OK(kvs_l2_register("test-null", null_factory, NULL));
    kvs_l2_adapter *a = (kvs_l2_adapter *)&a;
    CHECK_ERR(kvs_l2_create("{\"type\": \"test-fail-silent\"}", &a), KVS_EIO,
              "l2 config: factory 'test-fail-silent' failed: I/O error");
    CHECK(a == NULL);
    CHECK_ERR(kvs_l2_create("{\"type\": \"test-fail-loud\"}", &a), KVS_ENOSPC,
              "custom: no room for 7");
    CHECK_ERR(kvs_l2_create("{\"type\": \"test-null\"}", &a), KVS_EINVAL,
              "l2 config: factory 'test-null' returned no adapter");
    /* A failing factory with a serde: the processor made first is freed
     * (valgrind / ASan check it). */
    CHECK_ERR(kvs_l2_create("{\"type\": \"test-fail-loud\", \"serde\": {\"type\": \"fp8\"}}",
                            &a),
              KVS_ENOSPC, "custom: no room for 7");
}

/* ---------------------------------------------------------------------
 * Thread safety (for TSan): concurrent registration, listing, creation.
 * ------------------------------------------------------------------ */

static void *registry_thread(void *arg)
{
    long t = (long)arg;
    for (int i = 0; i < 10; i++) { /* 30 names: the table holds 64 */
        char name[32];
        snprintf(name, sizeof name, "test-t%ld-%d", t, i);
        if (kvs_l2_register(name, custom_factory, NULL) != KVS_OK) return (void *)1;
        const char *names[128];
        (void)kvs_l2_types(names, 128);
        kvs_l2_adapter *a;
        if (kvs_l2_create("{\"type\": \"memory\"}", &a) != KVS_OK) return (void *)1;
        kvs_l2_destroy(a);
    }
    return NULL;
}

static void test_concurrent_registry(void)
{
    pthread_t th[3];
    for (long i = 0; i < 3; i++)
        REQUIRE(pthread_create(&th[i], NULL, registry_thread, (void *)i) == 0);
    for (int i = 0; i < 3; i++) {
        void *rv;
        pthread_join(th[i], &rv);
        CHECK(rv == NULL);
    }
}

int main(void)
{
    RUN(test_builtins_registered);
    RUN(test_unknown_type);
    RUN(test_create_memory_from_json);
    RUN(test_spec_refusals);
    RUN(test_memory_spec_refusals);
    RUN(test_serde_must_be_a_dict);
    RUN(test_serde_dict_needs_type);
    RUN(test_serde_registry_refusals_pass_through);
    RUN(test_serde_wraps_the_adapter);
    RUN(test_serde_pool_bytes);
    RUN(test_register_duplicates_and_refusals);
    RUN(test_factory_failures);
    RUN(test_concurrent_registry);
    return TEST_SUMMARY();
}
