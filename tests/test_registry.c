/* test_registry.c - the serde registry and JSON configs (upstream
 * test_factory.py, group C), and every refusal with its code and message. */
#include <pthread.h>
#include <stdlib.h>

#include "kvs_test.h"
#include "kvserde/kvserde.h"

/* ---- a dummy serde that records the kwargs its factory saw ---------- */

static char dummy_seen_kwargs[256];
static int dummy_calls;

typedef struct dummy_ser {
    kvs_serializer base;
    int id;
} dummy_ser;
typedef struct dummy_de {
    kvs_deserializer base;
} dummy_de;

static int dummy_serialize(kvs_serializer *s, const kvs_memobj *src, kvs_memobj *dst,
                           const kvs_object_key *key,
                           size_t *n)
{
    (void)key;
    *n = 7;
    return KVS_OK;
}
static int dummy_estimate(const kvs_serializer *s, const kvs_layout *l, size_t *n)
{
    *n = 1;
    return KVS_OK;
}
static void dummy_ser_destroy(kvs_serializer *s) { free(KVS_CONTAINER_OF(s, dummy_ser, base)); }
static int dummy_deserialize(kvs_deserializer *d, const kvs_memobj *src, kvs_memobj *dst,
                             const kvs_object_key *key)
{
    (void)key;
    return KVS_OK;
}
static void dummy_de_destroy(kvs_deserializer *d) { free(KVS_CONTAINER_OF(d, dummy_de, base)); }

static const struct kvs_serializer_ops dummy_ser_ops = {"dummy", dummy_serialize,
                                                        dummy_estimate, dummy_ser_destroy};
static const struct kvs_deserializer_ops dummy_de_ops = {"dummy", dummy_deserialize,
                                                         dummy_de_destroy};

static int dummy_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out)
{
    dummy_calls++;
    char *text = json_dumps(kwargs, JSON_SORT_KEYS | JSON_COMPACT);
    snprintf(dummy_seen_kwargs, sizeof dummy_seen_kwargs, "%s", text ? text : "");
    free(text);
    dummy_ser *s = calloc(1, sizeof *s);
    dummy_de *d = calloc(1, sizeof *d);
    s->base.ops = &dummy_ser_ops;
    s->id = *(int *)userdata;
    d->base.ops = &dummy_de_ops;
    out->serializer = &s->base;
    out->deserializer = &d->base;
    return KVS_OK;
}

static int failing_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out)
{
    return kvs_set_error(KVS_EINVAL, "failing: level must be 1..9, got 12");
}

static int silent_failing_factory(const json_t *kwargs, void *userdata,
                                  kvs_serde_pair *out)
{
    return KVS_EUNSUPPORTED; /* forgets to say why */
}

/* ---- tests --------------------------------------------------------- */

/* 16: fp8 registered by default, first, without any call to register. */
static void test_fp8_registered_by_default(void)
{
    const char *names[8];
    size_t n = kvs_serde_types(names, 8);
    REQUIRE(n >= 1);
    CHECK_EQ_STR(names[0], "fp8");
    CHECK_EQ_U64(kvs_serde_types(NULL, 0), n);
}

/* 17: create fp8 from JSON gives a working pair (processor: test_async_processor). */
static void test_create_fp8_pair(void)
{
    kvs_serde_pair pair;
    REQUIRE_OK(kvs_serde_create_pair("{\"type\": \"fp8\"}", &pair));
    CHECK(pair.serializer != NULL);
    CHECK(pair.deserializer != NULL);
    CHECK_EQ_INT(pair.max_workers, 1);
    CHECK_EQ_STR(pair.serializer->ops->name, "fp8");
    kvs_serde_pair_destroy(&pair);
    CHECK(pair.serializer == NULL && pair.deserializer == NULL);
    kvs_serde_pair_destroy(NULL);
}

/* 17 (processor form): kvs_serde_create returns an async processor with
 * distinct fds that runs the configured serde; each create is independent. */
static void test_create_processor(void)
{
    kvs_processor *p = NULL, *q = NULL;
    REQUIRE_OK(kvs_serde_create("{\"type\": \"fp8\", \"fp8_dtype\": \"float8_e5m2\"}", &p));
    REQUIRE_OK(kvs_serde_create("{\"type\": \"fp8\", \"max_workers\": 2.0}", &q));
    int fs = kvs_processor_serialize_event_fd(p), fd = kvs_processor_deserialize_event_fd(p);
    CHECK(fs >= 0 && fd >= 0 && fs != fd);
    CHECK(kvs_processor_serialize_event_fd(q) != fs);
    kvs_layout l;
    REQUIRE_OK(kvs_layout_flat(&l, 10, KVS_DTYPE_BFLOAT16));
    size_t est = 0;
    CHECK_OK(kvs_processor_estimate_serialized_size(p, &l, &est));
    CHECK_EQ_U64(est, 15);

    /* the processor runs the e5m2 serializer: 1e6 saturates to 0x7B */
    float big = 1e6f;
    uint8_t code[2] = {0, 0};
    kvs_layout fl, bl;
    REQUIRE_OK(kvs_layout_flat(&fl, 1, KVS_DTYPE_FLOAT32));
    REQUIRE_OK(kvs_layout_flat(&bl, 2, KVS_DTYPE_UINT8));
    kvs_memobj src, dst;
    REQUIRE_OK(kvs_memobj_init(&src, &big, sizeof big, &fl, KVS_FMT_UNDEFINED));
    REQUIRE_OK(kvs_memobj_init(&dst, code, sizeof code, &bl, KVS_FMT_BINARY_BUFFER));
    kvs_memobj *sp = &src, *dp = &dst;
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, &sp, 1, &dp, 1, NULL, &id));
    CHECK_EQ_U64(id, 0);
    REQUIRE_OK(kvs_processor_close(p)); /* finishes the task */
    kvs_task_result r;
    CHECK_OK(kvs_processor_query_serialize_result(p, id, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_INT(code[0], 0x7B);
    CHECK_EQ_U64(dst.used_size, 1); /* narrowed to the bytes written */
    kvs_processor_destroy(p);
    kvs_processor_destroy(q);

    CHECK_ERR(kvs_serde_create("{\"type\": \"zzz\"}", &p), KVS_EINVAL,
              "unknown serde type 'zzz'; registered: fp8, ggml_q4_0, ggml_q8_0, "
              "kv_split, pipeline");
    CHECK_ERR(kvs_serde_create("{\"type\": \"fp8\", \"max_workers\": 0}", &p), KVS_EINVAL,
              "serde config: max_workers must be an integer from 1 to 1024, got 0");
    CHECK_ERR(kvs_serde_create_json(NULL, &p), KVS_EINVAL, "serde config: NULL config");
    CHECK_ERR(kvs_serde_create("{}", NULL), KVS_EINVAL, "serde config: NULL output");
}

/* 18: missing type. */
static void test_missing_type(void)
{
    kvs_serde_pair pair;
    CHECK_ERR(kvs_serde_create_pair("{\"fp8_dtype\": \"float8_e4m3fn\"}", &pair), KVS_EINVAL,
              "serde config: missing 'type' field");
    CHECK(pair.serializer == NULL);
}

static void test_type_not_string(void)
{
    kvs_serde_pair pair;
    CHECK_ERR(kvs_serde_create_pair("{\"type\": 8}", &pair), KVS_EINVAL,
              "serde config: 'type' must be a string, got integer");
    CHECK_ERR(kvs_serde_create_pair("{\"type\": null}", &pair), KVS_EINVAL,
              "serde config: 'type' must be a string, got null");
}

/* 19: unknown type names what is registered. */
static void test_unknown_type(void)
{
    kvs_serde_pair pair;
    CHECK_ERR(kvs_serde_create_pair("{\"type\": \"does-not-exist\"}", &pair), KVS_EINVAL,
              "unknown serde type 'does-not-exist'; registered: fp8, ggml_q4_0, ggml_q8_0, "
              "kv_split, pipeline");
}

static void test_not_an_object_and_bad_json(void)
{
    kvs_serde_pair pair;
    CHECK_ERR(kvs_serde_create_pair("[\"fp8\"]", &pair), KVS_EINVAL,
              "serde config: must be a JSON object, got array");
    CHECK_ERR(kvs_serde_create_pair("\"fp8\"", &pair), KVS_EINVAL,
              "serde config: invalid JSON at line 1, column 5: '[' or '{' expected near "
              "'\"fp8\"'");
    CHECK_ERR(kvs_serde_create_pair("{\"type\": \"fp8\",}", &pair), KVS_EINVAL,
              "serde config: invalid JSON at line 1, column 16: string or '}' expected "
              "near '}'");
    CHECK_ERR(kvs_serde_create_pair("{\"type\": \"fp8\", \"type\": \"fp8\"}", &pair),
              KVS_EINVAL,
              "serde config: invalid JSON at line 1, column 22: duplicate object key "
              "near '\"type\"'");
    CHECK_ERR(kvs_serde_create_pair(NULL, &pair), KVS_EINVAL, "serde config: NULL text");
    CHECK_ERR(kvs_serde_create_pair_json(NULL, &pair), KVS_EINVAL,
              "serde config: NULL config");
    json_t *arr = json_array();
    CHECK_ERR(kvs_serde_create_pair_json(arr, &pair), KVS_EINVAL,
              "serde config: must be a JSON object, got array");
    json_decref(arr);
}

/* 20: max_workers accepts an integer, an integral float and a digit string. */
static void test_max_workers_forms(void)
{
    static const struct {
        const char *json;
        unsigned workers;
    } ok[] = {
        {"{\"type\": \"fp8\", \"max_workers\": 2}", 2},
        {"{\"type\": \"fp8\", \"max_workers\": 2.0}", 2},
        {"{\"type\": \"fp8\", \"max_workers\": \"2\"}", 2},
        {"{\"type\": \"fp8\", \"max_workers\": 1024}", 1024},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        kvs_serde_pair pair;
        CHECK_OK(kvs_serde_create_pair(ok[i].json, &pair));
        CHECK_EQ_INT(pair.max_workers, ok[i].workers);
        kvs_serde_pair_destroy(&pair);
    }
}

static void test_max_workers_refused(void)
{
    static const struct {
        const char *value, *message;
    } bad[] = {
        {"0", "serde config: max_workers must be an integer from 1 to 1024, got 0"},
        {"-1", "serde config: max_workers must be an integer from 1 to 1024, got -1"},
        {"2.5", "serde config: max_workers must be an integer from 1 to 1024, got 2.5"},
        {"\"two\"", "serde config: max_workers must be an integer from 1 to 1024, got 'two'"},
        {"\"2.0\"", "serde config: max_workers must be an integer from 1 to 1024, got '2.0'"},
        {"1025", "serde config: max_workers must be an integer from 1 to 1024, got 1025"},
        {"true", "serde config: max_workers must be an integer from 1 to 1024, got boolean"},
        {"null", "serde config: max_workers must be an integer from 1 to 1024, got null"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"type\": \"fp8\", \"max_workers\": %s}", bad[i].value);
        kvs_serde_pair pair;
        CHECK_ERR(kvs_serde_create_pair(json, &pair), KVS_EINVAL, bad[i].message);
        CHECK(pair.serializer == NULL && pair.deserializer == NULL);
    }
}

/* 21: dispatch to a registered factory, which sees its kwargs without
 * "type" and "max_workers". */
static void test_dispatch_to_registered_factory(void)
{
    static int id = 4242;
    REQUIRE_OK(kvs_serde_register("test-dummy-ser-de-xyz", dummy_factory, &id));
    kvs_serde_pair pair;
    REQUIRE_OK(kvs_serde_create_pair(
        "{\"type\": \"test-dummy-ser-de-xyz\", \"foo\": \"bar\", \"max_workers\": 3}", &pair));
    CHECK_EQ_STR(dummy_seen_kwargs, "{\"foo\":\"bar\"}");
    CHECK_EQ_INT(dummy_calls, 1);
    CHECK_EQ_INT(pair.max_workers, 3);
    CHECK_EQ_STR(pair.serializer->ops->name, "dummy");
    CHECK_EQ_INT(KVS_CONTAINER_OF(pair.serializer, dummy_ser, base)->id, 4242);
    kvs_serde_pair_destroy(&pair);

    /* each create is a new, independent pair */
    kvs_serde_pair a, b;
    REQUIRE_OK(kvs_serde_create_pair("{\"type\": \"test-dummy-ser-de-xyz\"}", &a));
    REQUIRE_OK(kvs_serde_create_pair("{\"type\": \"test-dummy-ser-de-xyz\"}", &b));
    CHECK(a.serializer != b.serializer);
    CHECK_EQ_STR(dummy_seen_kwargs, "{}");
    kvs_serde_pair_destroy(&a);
    kvs_serde_pair_destroy(&b);

    /* the unknown-type message lists every registered name, sorted */
    CHECK_ERR(kvs_serde_create_pair("{\"type\": \"nope\"}", &pair), KVS_EINVAL,
              "unknown serde type 'nope'; registered: fp8, ggml_q4_0, ggml_q8_0, kv_split, "
              "pipeline, "
              "test-dummy-ser-de-xyz");
    const char *names[8];
    CHECK_EQ_U64(kvs_serde_types(names, 8), 6);
    CHECK_EQ_STR(names[2], "pipeline");
    CHECK_EQ_STR(names[5], "test-dummy-ser-de-xyz");
}

/* 22: duplicates refused, built-in or not. */
static void test_duplicate_registration(void)
{
    static int id = 1;
    CHECK_ERR(kvs_serde_register("fp8", dummy_factory, &id), KVS_EEXIST,
              "serde type already registered: 'fp8'");
    REQUIRE_OK(kvs_serde_register("dup-once", dummy_factory, &id));
    CHECK_ERR(kvs_serde_register("dup-once", dummy_factory, &id), KVS_EEXIST,
              "serde type already registered: 'dup-once'");
}

static void test_register_refusals(void)
{
    CHECK_ERR(kvs_serde_register(NULL, dummy_factory, NULL), KVS_EINVAL,
              "serde registry: NULL name or factory");
    CHECK_ERR(kvs_serde_register("x", NULL, NULL), KVS_EINVAL,
              "serde registry: NULL name or factory");
    CHECK_ERR(kvs_serde_register("", dummy_factory, NULL), KVS_EINVAL,
              "serde registry: name must be 1 to 63 characters, got 0");
    char long_name[80];
    memset(long_name, 'a', 64);
    long_name[64] = '\0';
    CHECK_ERR(kvs_serde_register(long_name, dummy_factory, NULL), KVS_EINVAL,
              "serde registry: name must be 1 to 63 characters, got 64");
}

static void test_factory_failures_propagate(void)
{
    REQUIRE_OK(kvs_serde_register("failing", failing_factory, NULL));
    REQUIRE_OK(kvs_serde_register("silent-failing", silent_failing_factory, NULL));
    kvs_serde_pair pair;
    CHECK_ERR(kvs_serde_create_pair("{\"type\": \"failing\"}", &pair), KVS_EINVAL,
              "failing: level must be 1..9, got 12");
    CHECK_ERR(kvs_serde_create_pair("{\"type\": \"silent-failing\"}", &pair),
              KVS_EUNSUPPORTED, "serde config: factory 'silent-failing' failed: unsupported");
}

/* fp8 kwargs (DESIGN.md section 3). */
static void test_fp8_kwargs(void)
{
    kvs_serde_pair pair;
    REQUIRE_OK(kvs_serde_create_pair(
        "{\"type\": \"fp8\", \"fp8_dtype\": \"float8_e5m2\", \"saturate\": false}", &pair));
    /* e5m2 without saturation: 1e6 overflows to +inf (0x7C) */
    float big = 1e6f;
    uint8_t out[2] = {0, 0};
    kvs_layout l;
    kvs_memobj src, dst;
    REQUIRE_OK(kvs_layout_flat(&l, 1, KVS_DTYPE_FLOAT32));
    REQUIRE_OK(kvs_memobj_init(&src, &big, sizeof big, &l, KVS_FMT_UNDEFINED));
    kvs_layout bl;
    REQUIRE_OK(kvs_layout_flat(&bl, 2, KVS_DTYPE_UINT8));
    REQUIRE_OK(kvs_memobj_init(&dst, out, sizeof out, &bl, KVS_FMT_BINARY_BUFFER));
    size_t n = 0;
    CHECK_OK(kvs_serialize(pair.serializer, &src, &dst, NULL, &n));
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(out[0], 0x7C);
    kvs_serde_pair_destroy(&pair);

    /* defaults: e4m3fn, saturating: 1e6 -> 448 (0x7E) */
    REQUIRE_OK(kvs_serde_create_pair("{\"type\": \"fp8\"}", &pair));
    CHECK_OK(kvs_serialize(pair.serializer, &src, &dst, NULL, &n));
    CHECK_EQ_INT(out[0], 0x7E);
    kvs_serde_pair_destroy(&pair);

    REQUIRE_OK(kvs_serde_create_pair(
        "{\"type\": \"fp8\", \"fp8_dtype\": \"float8_e4m3fn\", \"saturate\": false}", &pair));
    CHECK_OK(kvs_serialize(pair.serializer, &src, &dst, NULL, &n));
    CHECK_EQ_INT(out[0], 0x7F);
    kvs_serde_pair_destroy(&pair);
}

static void test_fp8_kwargs_refused(void)
{
    static const struct {
        const char *json, *message;
    } bad[] = {
        {"{\"type\": \"fp8\", \"fp8_dtype\": \"float16\"}",
         "fp8: fp8_dtype must be one of float8_e4m3fn, float8_e5m2; got 'float16'"},
        {"{\"type\": \"fp8\", \"fp8_dtype\": 8}", "fp8: fp8_dtype must be a string, got integer"},
        {"{\"type\": \"fp8\", \"saturate\": \"yes\"}",
         "fp8: saturate must be a JSON boolean, got string"},
        {"{\"type\": \"fp8\", \"saturate\": 1}", "fp8: saturate must be a JSON boolean, got integer"},
        {"{\"type\": \"fp8\", \"foo\": \"bar\"}",
         "fp8: unknown kwarg 'foo'; accepted: fp8_dtype, saturate, max_workers"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvs_serde_pair pair;
        CHECK_ERR(kvs_serde_create_pair(bad[i].json, &pair), KVS_EINVAL, bad[i].message);
        CHECK(pair.serializer == NULL && pair.deserializer == NULL);
    }
}

/* Concurrent registration and creation: every name registered exactly once. */
static void *register_many(void *arg)
{
    static int id = 7;
    int base = *(int *)arg;
    for (int i = 0; i < 10; i++) {
        char name[32];
        snprintf(name, sizeof name, "concurrent-%d", base + i);
        if (kvs_serde_register(name, dummy_factory, &id) != KVS_OK) return (void *)1;
        kvs_serde_pair pair;
        if (kvs_serde_create_pair("{\"type\": \"fp8\"}", &pair) != KVS_OK) return (void *)1;
        kvs_serde_pair_destroy(&pair);
    }
    return NULL;
}

static void test_concurrent_registration(void)
{
    size_t before = kvs_serde_types(NULL, 0);
    pthread_t t[4];
    int bases[4] = {0, 10, 20, 30};
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, register_many, &bases[i]);
    for (int i = 0; i < 4; i++) {
        void *ret;
        pthread_join(t[i], &ret);
        CHECK(ret == NULL);
    }
    CHECK_EQ_U64(kvs_serde_types(NULL, 0), before + 40);
}

int main(void)
{
    RUN(test_fp8_registered_by_default);
    RUN(test_create_fp8_pair);
    RUN(test_create_processor);
    RUN(test_missing_type);
    RUN(test_type_not_string);
    RUN(test_unknown_type);
    RUN(test_not_an_object_and_bad_json);
    RUN(test_max_workers_forms);
    RUN(test_max_workers_refused);
    RUN(test_dispatch_to_registered_factory);
    RUN(test_duplicate_registration);
    RUN(test_register_refusals);
    RUN(test_factory_failures_propagate);
    RUN(test_fp8_kwargs);
    RUN(test_fp8_kwargs_refused);
    RUN(test_concurrent_registration);
    return TEST_SUMMARY();
}
