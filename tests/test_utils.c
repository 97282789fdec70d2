/* test_utils.c - upstream utils: make_temp_key (group E) and
 * serialized_layout_desc, plus the checked sync serde calls. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kvs_test.h"
#include "kvserde/kvserde.h"

/* ------------------------------------------------------------------ */
/* make_temp_key (upstream group E)                                    */
/* ------------------------------------------------------------------ */

static const uint8_t ZERO16[16] = {0};

static void base_key(kvs_object_key *k)
{
    memset(k, 0, sizeof *k);
    kvs_object_key_init(k, ZERO16, sizeof ZERO16, "test-model", 3, 5, "tenant-A");
}

static void test_temp_key_propagates_fields(void)
{
    kvs_object_key k, t;
    base_key(&k);
    REQUIRE_OK(kvs_object_key_validate(&k));
    memset(&t, 0xA5, sizeof t);
    REQUIRE_OK(kvs_make_temp_key(&k, &t));
    CHECK_EQ_STR(t.cache_salt, "tenant-A");
    CHECK_EQ_STR(t.model_name, "test-model");
    CHECK_EQ_INT(t.kv_rank, 3);
    CHECK_EQ_INT(t.object_group_id, 5);
    CHECK_OK(kvs_object_key_validate(&t));
    /* The original is not modified. */
    CHECK_EQ_U64(k.chunk_hash_len, 16);
}

static void test_temp_key_hash(void)
{
    kvs_object_key k, t;
    base_key(&k);
    REQUIRE_OK(kvs_make_temp_key(&k, &t));
    CHECK_EQ_INT(kvs_object_key_equal(&k, &t), 0);
    CHECK_EQ_U64(t.chunk_hash_len, k.chunk_hash_len + KVS_TEMP_KEY_SUFFIX);
    CHECK_EQ_U64(t.chunk_hash_len, 32);
    CHECK(memcmp(t.chunk_hash, ZERO16, 16) == 0); /* starts with the original */
    /* The suffix is random, not zeros (chance of 16 zero bytes: 2^-128). */
    CHECK(memcmp(t.chunk_hash + 16, ZERO16, 16) != 0);
}

static void test_temp_key_two_calls_differ(void)
{
    kvs_object_key k, t1, t2;
    base_key(&k);
    REQUIRE_OK(kvs_make_temp_key(&k, &t1));
    REQUIRE_OK(kvs_make_temp_key(&k, &t2));
    CHECK_EQ_INT(kvs_object_key_equal(&t1, &t2), 0);
    CHECK(memcmp(t1.chunk_hash + 16, t2.chunk_hash + 16, 16) != 0);
    CHECK(memcmp(t1.chunk_hash, t2.chunk_hash, 16) == 0);
}

static void test_temp_key_empty_hash(void)
{
    kvs_object_key k, t;
    REQUIRE_OK(kvs_object_key_init(&k, NULL, 0, "m", 0, 0, NULL));
    REQUIRE_OK(kvs_make_temp_key(&k, &t));
    CHECK_EQ_U64(t.chunk_hash_len, KVS_TEMP_KEY_SUFFIX);
    CHECK_EQ_STR(t.cache_salt, "");
}

static void test_temp_key_hash_limit(void)
{
    uint8_t hash[KVS_CHUNK_HASH_MAX];
    for (size_t i = 0; i < sizeof hash; i++) hash[i] = (uint8_t)(i + 1);
    kvs_object_key k, t;

    /* 112 bytes + 16 = exactly the limit: accepted. */
    REQUIRE_OK(kvs_object_key_init(&k, hash, KVS_CHUNK_HASH_MAX - KVS_TEMP_KEY_SUFFIX,
                                   "m", 0, 0, "s"));
    REQUIRE_OK(kvs_make_temp_key(&k, &t));
    CHECK_EQ_U64(t.chunk_hash_len, KVS_CHUNK_HASH_MAX);
    CHECK(memcmp(t.chunk_hash, hash, KVS_CHUNK_HASH_MAX - KVS_TEMP_KEY_SUFFIX) == 0);

    /* 113 bytes: refused, *out untouched. */
    REQUIRE_OK(kvs_object_key_init(&k, hash, KVS_CHUNK_HASH_MAX - 15, "m", 0, 0, "s"));
    memset(&t, 0xA5, sizeof t);
    kvs_object_key saved = t;
    CHECK_ERR(kvs_make_temp_key(&k, &t), KVS_EINVAL,
              "key: chunk hash is 113 bytes; a temp key appends 16 and the limit is 128");
    CHECK(memcmp(&t, &saved, sizeof t) == 0);

    REQUIRE_OK(kvs_object_key_init(&k, hash, KVS_CHUNK_HASH_MAX, "m", 0, 0, "s"));
    CHECK_ERR(kvs_make_temp_key(&k, &t), KVS_EINVAL,
              "key: chunk hash is 128 bytes; a temp key appends 16 and the limit is 128");
}

static void test_temp_key_refusals(void)
{
    kvs_object_key k, t;
    base_key(&k);
    CHECK_ERR(kvs_make_temp_key(NULL, &t), KVS_EINVAL, "key: NULL key");
    CHECK_ERR(kvs_make_temp_key(&k, NULL), KVS_EINVAL, "key: NULL output");
    /* An invalid source key is refused with validate's reason. */
    k.object_group_id = -1;
    CHECK_ERR(kvs_make_temp_key(&k, &t), KVS_EINVAL, "key: object group id -1 is negative");
    base_key(&k);
    memset(k.model_name, 'x', sizeof k.model_name);
    CHECK_ERR(kvs_make_temp_key(&k, &t), KVS_EINVAL,
              "key: model name is not NUL-terminated");
}

/* ------------------------------------------------------------------ */
/* A tiny test serde                                                   */
/* ------------------------------------------------------------------ */

enum ts_mode {
    TS_OK,           /* works; estimate = 2 * numel + 3 */
    TS_SILENT_FAIL,  /* returns fail_code without a message */
    TS_OWN_MESSAGE,  /* returns fail_code with its own message */
    TS_HUGE,         /* estimate is SIZE_MAX */
};

struct test_ser {
    kvs_serializer base;
    enum ts_mode mode;
    int fail_code;
    int destroyed;
};

static int ts_estimate(const kvs_serializer *s, const kvs_layout *layout, size_t *nbytes)
{
    const struct test_ser *self = KVS_CONTAINER_OF(s, const struct test_ser, base);
    if (self->mode == TS_SILENT_FAIL) return self->fail_code;
    if (self->mode == TS_OWN_MESSAGE)
        return kvs_set_error(self->fail_code, "tst: estimate refused (%d)", 11);
    if (self->mode == TS_HUGE) {
        *nbytes = SIZE_MAX;
        return KVS_OK;
    }
    int rc = kvs_layout_validate(layout);
    if (rc) return rc;
    *nbytes = (size_t)(2 * kvs_layout_numel(layout) + 3);
    return KVS_OK;
}

static int ts_serialize(kvs_serializer *s, const kvs_memobj *src, kvs_memobj *dst,
                        const kvs_object_key *key,
                        size_t *nwritten)
{
    (void)key;
    struct test_ser *self = KVS_CONTAINER_OF(s, struct test_ser, base);
    if (self->mode == TS_SILENT_FAIL) return self->fail_code;
    if (self->mode == TS_OWN_MESSAGE)
        return kvs_set_error(self->fail_code, "tst: serialize refused (%d)", 7);
    size_t need = (size_t)(2 * kvs_layout_numel(&src->layout) + 3);
    if (dst->capacity < need)
        return kvs_set_error(KVS_ENOSPC, "tst: need %zu bytes, have %zu", need,
                             dst->capacity);
    memset(dst->data, 0xAB, need);
    *nwritten = need;
    return KVS_OK;
}

static void ts_destroy(kvs_serializer *s)
{
    struct test_ser *self = KVS_CONTAINER_OF(s, struct test_ser, base);
    self->destroyed++;
}

static const struct kvs_serializer_ops ts_ops = {"tst", ts_serialize, ts_estimate,
                                                 ts_destroy};
static const struct kvs_serializer_ops ts_ops_noname = {NULL, ts_serialize, ts_estimate,
                                                        ts_destroy};

static void ts_init(struct test_ser *t, enum ts_mode mode, int fail_code)
{
    memset(t, 0, sizeof *t);
    t->base.ops = &ts_ops;
    t->mode = mode;
    t->fail_code = fail_code;
}

struct test_de {
    kvs_deserializer base;
    enum ts_mode mode;
    int fail_code;
    int destroyed;
};

static int td_deserialize(kvs_deserializer *d, const kvs_memobj *src, kvs_memobj *dst,
                          const kvs_object_key *key)
{
    (void)key;
    struct test_de *self = KVS_CONTAINER_OF(d, struct test_de, base);
    if (self->mode == TS_SILENT_FAIL) return self->fail_code;
    if (self->mode == TS_OWN_MESSAGE)
        return kvs_set_error(self->fail_code, "tde: bad header byte %d", 3);
    memset(dst->data, 0, dst->used_size);
    return KVS_OK;
}

static void td_destroy(kvs_deserializer *d)
{
    struct test_de *self = KVS_CONTAINER_OF(d, struct test_de, base);
    self->destroyed++;
}

static const struct kvs_deserializer_ops td_ops = {"tde", td_deserialize, td_destroy};

static void td_init(struct test_de *t, enum ts_mode mode, int fail_code)
{
    memset(t, 0, sizeof *t);
    t->base.ops = &td_ops;
    t->mode = mode;
    t->fail_code = fail_code;
}

/* [4, 8] bfloat16 + [16] float16: 48 elements, 96 bytes. */
static void two_group_layout(kvs_layout *l)
{
    const int64_t d0[] = {4, 8}, d1[] = {16};
    memset(l, 0, sizeof *l);
    kvs_layout_add_group(l, 2, d0, KVS_DTYPE_BFLOAT16);
    kvs_layout_add_group(l, 1, d1, KVS_DTYPE_FLOAT16);
}

/* ------------------------------------------------------------------ */
/* serialized_layout                                                   */
/* ------------------------------------------------------------------ */

static void test_serialized_layout(void)
{
    struct test_ser ts;
    ts_init(&ts, TS_OK, 0);
    kvs_layout l, out;
    two_group_layout(&l);
    memset(&out, 0xA5, sizeof out);
    REQUIRE_OK(kvs_serialized_layout(&ts.base, &l, &out));
    CHECK_EQ_INT(out.ngroups, 1);
    CHECK_EQ_INT(out.groups[0].shape.ndim, 1);
    CHECK_EQ_INT(out.groups[0].shape.dims[0], 2 * 48 + 3);
    CHECK_EQ_INT(out.groups[0].dtype, KVS_DTYPE_UINT8);
    CHECK_EQ_U64(kvs_layout_nbytes(&out), 99);
    CHECK_OK(kvs_layout_validate(&out));
    kvs_layout expect;
    REQUIRE_OK(kvs_layout_flat(&expect, 99, KVS_DTYPE_UINT8));
    CHECK_EQ_INT(kvs_layout_equal(&out, &expect), 1);

    /* Upstream's single-group example: [2,4,256,128] bf16 = 262144 elements. */
    const int64_t d[] = {2, 4, 256, 128};
    memset(&l, 0, sizeof l);
    REQUIRE_OK(kvs_layout_add_group(&l, 4, d, KVS_DTYPE_BFLOAT16));
    REQUIRE_OK(kvs_serialized_layout(&ts.base, &l, &out));
    CHECK_EQ_U64(kvs_layout_nbytes(&out), 2 * 262144 + 3);

    /* An empty layout: estimate 3. */
    REQUIRE_OK(kvs_layout_init(&l, 0, NULL, 0, NULL));
    REQUIRE_OK(kvs_serialized_layout(&ts.base, &l, &out));
    CHECK_EQ_INT(out.ngroups, 1);
    CHECK_EQ_U64(kvs_layout_nbytes(&out), 3);
}

static void test_serialized_layout_refusals(void)
{
    struct test_ser ts;
    ts_init(&ts, TS_OK, 0);
    kvs_layout l, out, saved;
    two_group_layout(&l);
    memset(&out, 0xA5, sizeof out);
    saved = out;

    CHECK_ERR(kvs_serialized_layout(&ts.base, &l, NULL), KVS_EINVAL,
              "serde: NULL output layout");
    CHECK_ERR(kvs_serialized_layout(NULL, &l, &out), KVS_EINVAL,
              "serde: estimate: NULL argument");
    CHECK_ERR(kvs_serialized_layout(&ts.base, NULL, &out), KVS_EINVAL,
              "serde: estimate: NULL argument");

    /* The serializer's own refusal (here: an invalid layout) comes through. */
    kvs_layout bad = l;
    bad.groups[0].shape.dims[1] = -8;
    CHECK_ERR(kvs_serialized_layout(&ts.base, &bad, &out), KVS_EINVAL,
              "layout: group 0 dim 1 is negative (-8)");

    /* An estimate too large for a layout. */
    ts.mode = TS_HUGE;
    CHECK_ERR(kvs_serialized_layout(&ts.base, &l, &out), KVS_EINVAL,
              "layout: group 0 byte size overflows 2^63");

    /* A failing estimate without a message gets the fallback message. */
    ts.mode = TS_SILENT_FAIL;
    ts.fail_code = KVS_EUNSUPPORTED;
    CHECK_ERR(kvs_serialized_layout(&ts.base, &l, &out), KVS_EUNSUPPORTED,
              "tst: estimate_serialized_size failed: unsupported");
    CHECK(memcmp(&out, &saved, sizeof out) == 0);
}

/* ------------------------------------------------------------------ */
/* Checked calls                                                       */
/* ------------------------------------------------------------------ */

static void test_checked_null_arguments(void)
{
    struct test_ser ts;
    ts_init(&ts, TS_OK, 0);
    struct test_de td;
    td_init(&td, TS_OK, 0);
    kvs_layout l;
    two_group_layout(&l);
    unsigned char sbuf[96], dbuf[128];
    kvs_memobj src, dst;
    REQUIRE_OK(kvs_memobj_init(&src, sbuf, sizeof sbuf, &l, KVS_FMT_KV_2LTD));
    kvs_layout sl;
    REQUIRE_OK(kvs_serialized_layout(&ts.base, &l, &sl));
    REQUIRE_OK(kvs_memobj_init(&dst, dbuf, sizeof dbuf, &sl, KVS_FMT_BINARY_BUFFER));
    size_t n = 12345;

    CHECK_ERR(kvs_serialize(NULL, &src, &dst, NULL, &n), KVS_EINVAL,
              "serde: serialize: NULL argument");
    CHECK_ERR(kvs_serialize(&ts.base, NULL, &dst, NULL, &n), KVS_EINVAL,
              "serde: serialize: NULL argument");
    CHECK_ERR(kvs_serialize(&ts.base, &src, NULL, NULL, &n), KVS_EINVAL,
              "serde: serialize: NULL argument");
    CHECK_ERR(kvs_serialize(&ts.base, &src, &dst, NULL, NULL), KVS_EINVAL,
              "serde: serialize: NULL argument");
    CHECK_EQ_U64(n, 12345);

    CHECK_ERR(kvs_estimate_serialized_size(NULL, &l, &n), KVS_EINVAL,
              "serde: estimate: NULL argument");
    CHECK_ERR(kvs_estimate_serialized_size(&ts.base, NULL, &n), KVS_EINVAL,
              "serde: estimate: NULL argument");
    CHECK_ERR(kvs_estimate_serialized_size(&ts.base, &l, NULL), KVS_EINVAL,
              "serde: estimate: NULL argument");
    CHECK_EQ_U64(n, 12345);

    CHECK_ERR(kvs_deserialize(NULL, &dst, &src, NULL), KVS_EINVAL,
              "serde: deserialize: NULL argument");
    CHECK_ERR(kvs_deserialize(&td.base, NULL, &src, NULL), KVS_EINVAL,
              "serde: deserialize: NULL argument");
    CHECK_ERR(kvs_deserialize(&td.base, &dst, NULL, NULL), KVS_EINVAL,
              "serde: deserialize: NULL argument");
}

static void test_checked_success(void)
{
    struct test_ser ts;
    ts_init(&ts, TS_OK, 0);
    kvs_layout l;
    two_group_layout(&l);
    size_t n = 0;
    REQUIRE_OK(kvs_estimate_serialized_size(&ts.base, &l, &n));
    CHECK_EQ_U64(n, 99);

    unsigned char sbuf[96], dbuf[128];
    memset(dbuf, 0, sizeof dbuf);
    kvs_memobj src, dst;
    REQUIRE_OK(kvs_memobj_init(&src, sbuf, sizeof sbuf, &l, KVS_FMT_KV_2LTD));
    kvs_layout sl;
    REQUIRE_OK(kvs_serialized_layout(&ts.base, &l, &sl));
    REQUIRE_OK(kvs_memobj_init(&dst, dbuf, sizeof dbuf, &sl, KVS_FMT_BINARY_BUFFER));
    n = 0;
    REQUIRE_OK(kvs_serialize(&ts.base, &src, &dst, NULL, &n));
    CHECK_EQ_U64(n, 99);
    CHECK(dbuf[0] == 0xAB && dbuf[98] == 0xAB && dbuf[99] == 0);

    /* The implementation's own refusal passes through unchanged. */
    unsigned char small[50];
    kvs_layout fl;
    REQUIRE_OK(kvs_layout_flat(&fl, 50, KVS_DTYPE_UINT8));
    REQUIRE_OK(kvs_memobj_init(&dst, small, sizeof small, &fl, KVS_FMT_BINARY_BUFFER));
    CHECK_ERR(kvs_serialize(&ts.base, &src, &dst, NULL, &n), KVS_ENOSPC,
              "tst: need 99 bytes, have 50");

    struct test_de td;
    td_init(&td, TS_OK, 0);
    memset(sbuf, 0xFF, sizeof sbuf);
    REQUIRE_OK(kvs_memobj_init(&dst, dbuf, sizeof dbuf, &sl, KVS_FMT_BINARY_BUFFER));
    CHECK_OK(kvs_deserialize(&td.base, &dst, &src, NULL));
    CHECK(sbuf[0] == 0 && sbuf[95] == 0);
}

static void test_checked_fallback_message(void)
{
    struct test_ser ts;
    ts_init(&ts, TS_SILENT_FAIL, KVS_ENOSPC);
    kvs_layout l;
    two_group_layout(&l);
    unsigned char sbuf[96], dbuf[128];
    kvs_memobj src, dst;
    REQUIRE_OK(kvs_memobj_init(&src, sbuf, sizeof sbuf, &l, KVS_FMT_KV_2LTD));
    kvs_layout sl;
    REQUIRE_OK(kvs_layout_flat(&sl, 99, KVS_DTYPE_UINT8));
    REQUIRE_OK(kvs_memobj_init(&dst, dbuf, sizeof dbuf, &sl, KVS_FMT_BINARY_BUFFER));
    size_t n = 0;

    CHECK_ERR(kvs_serialize(&ts.base, &src, &dst, NULL, &n), KVS_ENOSPC,
              "tst: serialize failed: no space");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_ENOSPC);

    /* A stale message from an earlier failure with the same code must not
     * be passed off as this failure's reason. */
    kvs_set_error(KVS_ENOSPC, "stale message from before");
    CHECK_ERR(kvs_serialize(&ts.base, &src, &dst, NULL, &n), KVS_ENOSPC,
              "tst: serialize failed: no space");
    kvs_set_error(KVS_EINVAL, "stale estimate message");
    ts.fail_code = KVS_EINVAL;
    CHECK_ERR(kvs_estimate_serialized_size(&ts.base, &l, &n), KVS_EINVAL,
              "tst: estimate_serialized_size failed: invalid argument");

    /* Without a name the fallback says "serde". */
    ts.base.ops = &ts_ops_noname;
    ts.fail_code = KVS_EIO;
    CHECK_ERR(kvs_serialize(&ts.base, &src, &dst, NULL, &n), KVS_EIO,
              "serde: serialize failed: I/O error");

    struct test_de td;
    td_init(&td, TS_SILENT_FAIL, KVS_ECORRUPT);
    CHECK_ERR(kvs_deserialize(&td.base, &dst, &src, NULL), KVS_ECORRUPT,
              "tde: deserialize failed: corrupt input");
}

static void test_checked_own_message_kept(void)
{
    struct test_ser ts;
    ts_init(&ts, TS_OWN_MESSAGE, KVS_EUNSUPPORTED);
    kvs_layout l;
    two_group_layout(&l);
    unsigned char sbuf[96], dbuf[128];
    kvs_memobj src, dst;
    REQUIRE_OK(kvs_memobj_init(&src, sbuf, sizeof sbuf, &l, KVS_FMT_KV_2LTD));
    REQUIRE_OK(kvs_memobj_init(&dst, dbuf, sizeof dbuf, &l, KVS_FMT_BINARY_BUFFER));
    size_t n = 0;
    CHECK_ERR(kvs_serialize(&ts.base, &src, &dst, NULL, &n), KVS_EUNSUPPORTED,
              "tst: serialize refused (7)");
    CHECK_ERR(kvs_estimate_serialized_size(&ts.base, &l, &n), KVS_EUNSUPPORTED,
              "tst: estimate refused (11)");
    struct test_de td;
    td_init(&td, TS_OWN_MESSAGE, KVS_ECORRUPT);
    CHECK_ERR(kvs_deserialize(&td.base, &dst, &src, NULL), KVS_ECORRUPT,
              "tde: bad header byte 3");
}

/* error.h: "Successful calls do not clear it" (the last error). That holds
 * for the checked serde calls too. */
static void test_checked_success_keeps_previous_error(void)
{
    struct test_ser ts;
    ts_init(&ts, TS_OK, 0);
    kvs_layout l, out;
    two_group_layout(&l);
    size_t n = 0;

    kvs_set_error(KVS_EIO, "earlier failure %d", 1);
    CHECK_OK(kvs_estimate_serialized_size(&ts.base, &l, &n));
    CHECK_EQ_STR(kvs_last_error(), "earlier failure 1");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_EIO);

    kvs_set_error(KVS_EIO, "earlier failure %d", 2);
    CHECK_OK(kvs_serialized_layout(&ts.base, &l, &out));
    CHECK_EQ_STR(kvs_last_error(), "earlier failure 2");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_EIO);
}

static void test_destroy(void)
{
    struct test_ser ts;
    ts_init(&ts, TS_OK, 0);
    kvs_serializer_destroy(&ts.base);
    CHECK_EQ_INT(ts.destroyed, 1);
    kvs_serializer_destroy(NULL); /* no-op */

    struct test_de td;
    td_init(&td, TS_OK, 0);
    kvs_deserializer_destroy(&td.base);
    CHECK_EQ_INT(td.destroyed, 1);
    kvs_deserializer_destroy(NULL);
}

/* ------------------------------------------------------------------ */
/* version                                                             */
/* ------------------------------------------------------------------ */

static void test_version(void)
{
    CHECK_EQ_STR(kvs_version(), KVS_VERSION_STRING);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", KVS_VERSION_MAJOR, KVS_VERSION_MINOR,
             KVS_VERSION_PATCH);
    CHECK_EQ_STR(kvs_version(), v);
}

int main(void)
{
    RUN(test_temp_key_propagates_fields);
    RUN(test_temp_key_hash);
    RUN(test_temp_key_two_calls_differ);
    RUN(test_temp_key_empty_hash);
    RUN(test_temp_key_hash_limit);
    RUN(test_temp_key_refusals);
    RUN(test_serialized_layout);
    RUN(test_serialized_layout_refusals);
    RUN(test_checked_null_arguments);
    RUN(test_checked_success);
    RUN(test_checked_fallback_message);
    RUN(test_checked_own_message_kept);
    RUN(test_checked_success_keeps_previous_error);
    RUN(test_destroy);
    RUN(test_version);
    return TEST_SUMMARY();
}
