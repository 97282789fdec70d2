/* test_multi.c - the multi-output interfaces, the group-length check and the
 * single-to-multi bridges: upstream test groups F (test_multi.py) and G
 * cases 46-49 (test_multi_output_mp_contract.py), translated to C.
 *
 * Where upstream uses a toy codec, so does this file: the "concat" codec
 * below, group of N slots, blob = N mask bytes (1 = present), N uint32-LE
 * byte lengths, then the present slots' raw bytes in slot order; so a blob
 * is 5N + sum(payload) bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "kvs_test.h"
#include "kvserde/fp8.h"
#include "kvserde/multi.h"

/* ---------------------------------------------------------------------
 * The toy concat codec
 * ------------------------------------------------------------------ */

typedef struct concat_ser {
    kvs_multi_serializer base;
} concat_ser;

typedef struct concat_de {
    kvs_multi_deserializer base;
} concat_de;

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static int concat_serialize(kvs_multi_serializer *s, kvs_memobj *const *src, size_t n,
                            kvs_memobj *dst, const kvs_object_key *key, size_t *nwritten)
{
    (void)key;
    int rc = kvs_validate_group_size(n, s->group_size, "src");
    if (rc) return rc;
    size_t total = 5 * n;
    for (size_t i = 0; i < n; i++) total += src[i] ? src[i]->used_size : 0;
    if (dst->capacity < total)
        return kvs_set_error(KVS_ENOSPC, "concat: destination too small: %zu bytes, need %zu",
                             dst->capacity, total);
    uint8_t *out = dst->data;
    size_t pos = 5 * n;
    for (size_t i = 0; i < n; i++) {
        size_t len = src[i] ? src[i]->used_size : 0;
        out[i] = src[i] != NULL;
        put_le32(out + n + 4 * i, (uint32_t)len);
        if (len) memcpy(out + pos, src[i]->data, len);
        pos += len;
    }
    *nwritten = total;
    return KVS_OK;
}

static int concat_estimate(const kvs_multi_serializer *s, const kvs_layout *const *layouts,
                           size_t n, size_t *nbytes)
{
    int rc = kvs_validate_group_size(n, s->group_size, "layout");
    if (rc) return rc;
    size_t total = 5 * n;
    for (size_t i = 0; i < n; i++)
        total += layouts[i] ? (size_t)kvs_layout_nbytes(layouts[i]) : 0;
    *nbytes = total;
    return KVS_OK;
}

static void concat_ser_destroy(kvs_multi_serializer *s)
{
    free(KVS_CONTAINER_OF(s, concat_ser, base));
}

static const struct kvs_multi_serializer_ops concat_ser_ops = {
    "concat", concat_serialize, concat_estimate, concat_ser_destroy};

static int concat_deserialize(kvs_multi_deserializer *d, const kvs_memobj *src,
                              kvs_memobj *const *dst, size_t n, const kvs_object_key *key)
{
    (void)key;
    int rc = kvs_validate_group_size(n, d->group_size, "dst");
    if (rc) return rc;
    const uint8_t *in = src->data;
    if (src->used_size < 5 * n)
        return kvs_set_error(KVS_ECORRUPT, "concat: truncated header");
    size_t pos = 5 * n;
    for (size_t i = 0; i < n; i++) {
        size_t len = get_le32(in + n + 4 * i);
        if (dst[i] != NULL) {
            if (!in[i])
                return kvs_set_error(KVS_EINVAL, "concat: slot %zu not in the blob", i);
            if (len != dst[i]->used_size || pos + len > src->used_size)
                return kvs_set_error(KVS_EINVAL, "concat: slot %zu has %zu bytes, want %zu",
                                     i, len, dst[i]->used_size);
        }
        pos += len;
    }
    pos = 5 * n;
    for (size_t i = 0; i < n; i++) {
        size_t len = get_le32(in + n + 4 * i);
        if (dst[i] != NULL && len) memcpy(dst[i]->data, in + pos, len);
        pos += len;
    }
    return KVS_OK;
}

static void concat_de_destroy(kvs_multi_deserializer *d)
{
    free(KVS_CONTAINER_OF(d, concat_de, base));
}

static const struct kvs_multi_deserializer_ops concat_de_ops = {
    "concat", concat_deserialize, concat_de_destroy};

/* The toy's constructor refuses a group size below 1 (upstream test 37). */
static int concat_create(long group_size, kvs_multi_serializer **ser,
                         kvs_multi_deserializer **de)
{
    if (group_size < 1)
        return kvs_set_error(KVS_EINVAL, "concat: group_size must be >= 1, got %ld",
                             group_size);
    concat_ser *s = calloc(1, sizeof *s);
    concat_de *d = calloc(1, sizeof *d);
    if (!s || !d) {
        free(s);
        free(d);
        return kvs_set_error(KVS_ENOMEM, "concat: out of memory");
    }
    s->base.ops = &concat_ser_ops;
    s->base.group_size = (size_t)group_size;
    d->base.ops = &concat_de_ops;
    d->base.group_size = (size_t)group_size;
    *ser = &s->base;
    *de = &d->base;
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * An identity single-tensor serde (upstream's bridge tests use one)
 * ------------------------------------------------------------------ */

static int id_serialize(kvs_serializer *s, const kvs_memobj *src, kvs_memobj *dst,
                        const kvs_object_key *key,
                        size_t *nwritten)
{
    (void)key;
    if (dst->capacity < src->used_size)
        return kvs_set_error(KVS_ENOSPC, "identity: destination too small");
    memcpy(dst->data, src->data, src->used_size);
    *nwritten = src->used_size;
    return KVS_OK;
}

static int id_estimate(const kvs_serializer *s, const kvs_layout *layout, size_t *nbytes)
{
    *nbytes = (size_t)kvs_layout_nbytes(layout);
    return KVS_OK;
}

static void id_ser_destroy(kvs_serializer *s) { free(s); }

static const struct kvs_serializer_ops id_ser_ops = {"identity", id_serialize, id_estimate,
                                                     id_ser_destroy};

static int id_deserialize(kvs_deserializer *d, const kvs_memobj *src, kvs_memobj *dst,
                          const kvs_object_key *key)
{
    (void)key;
    if (src->used_size < dst->used_size)
        return kvs_set_error(KVS_ECORRUPT, "identity: source too small");
    memcpy(dst->data, src->data, dst->used_size);
    return KVS_OK;
}

static void id_de_destroy(kvs_deserializer *d) { free(d); }

static const struct kvs_deserializer_ops id_de_ops = {"identity", id_deserialize,
                                                      id_de_destroy};

static kvs_serializer *id_ser_new(void)
{
    kvs_serializer *s = malloc(sizeof *s);
    s->ops = &id_ser_ops;
    return s;
}

static kvs_deserializer *id_de_new(void)
{
    kvs_deserializer *d = malloc(sizeof *d);
    d->ops = &id_de_ops;
    return d;
}

/* ---------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------ */

static kvs_memobj *obj_new(uint64_t n, kvs_dtype dt)
{
    kvs_layout l;
    kvs_memobj *o = NULL;
    if (kvs_layout_flat(&l, n, dt) || kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &o))
        return NULL;
    return o;
}

static kvs_memobj *bf16_248(void) /* upstream's [2, 4, 8] bfloat16 */
{
    kvs_layout l;
    int64_t dims[3] = {2, 4, 8};
    kvs_memobj *o = NULL;
    if (kvs_layout_init(&l, 0, NULL, 0, NULL) ||
        kvs_layout_add_group(&l, 3, dims, KVS_DTYPE_BFLOAT16) ||
        kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &o))
        return NULL;
    return o;
}

static void fill_pattern(kvs_memobj *o, unsigned seed)
{
    uint8_t *p = o->data;
    for (size_t i = 0; i < o->used_size; i++) p[i] = (uint8_t)(i * 31 + seed * 7 + 1);
}

static int all_bytes(const kvs_memobj *o, uint8_t v)
{
    const uint8_t *p = o->data;
    for (size_t i = 0; i < o->used_size; i++)
        if (p[i] != v) return 0;
    return 1;
}

static int same_bytes(const kvs_memobj *a, const kvs_memobj *b)
{
    return a->used_size == b->used_size && memcmp(a->data, b->data, a->used_size) == 0;
}

/* ---------------------------------------------------------------------
 * Group F (test_multi.py)
 * ------------------------------------------------------------------ */

/* 36: group_size is a fixed property of the instance. */
static void test_f36_group_size_fixed(void)
{
    kvs_multi_serializer *s;
    kvs_multi_deserializer *d;
    REQUIRE_OK(concat_create(2, &s, &d));
    CHECK_EQ_INT(kvs_multi_serializer_group_size(s), 2);
    CHECK_EQ_INT(kvs_multi_deserializer_group_size(d), 2);
    CHECK_EQ_INT(s->group_size, 2);
    CHECK_EQ_INT(kvs_multi_serializer_group_size(NULL), 0);
    CHECK_EQ_INT(kvs_multi_deserializer_group_size(NULL), 0);
    kvs_multi_serializer_destroy(s);
    kvs_multi_deserializer_destroy(d);
}

/* 37: the toy refuses group_size 0 and -1. */
static void test_f37_bad_group_size(void)
{
    kvs_multi_serializer *s = NULL;
    kvs_multi_deserializer *d = NULL;
    CHECK_ERR(concat_create(0, &s, &d), KVS_EINVAL, "concat: group_size must be >= 1, got 0");
    CHECK_ERR(concat_create(-1, &s, &d), KVS_EINVAL,
              "concat: group_size must be >= 1, got -1");
    CHECK(s == NULL && d == NULL);
}

/* 38: validate_group_size names the role and both lengths. */
static void test_f38_validate_group_size(void)
{
    CHECK_ERR(kvs_validate_group_size(1, 2, "src"), KVS_EINVAL,
              "multi: src group length 1 does not match expected 2");
    CHECK_ERR(kvs_validate_group_size(3, 2, "dst"), KVS_EINVAL,
              "multi: dst group length 3 does not match expected 2");
    CHECK_ERR(kvs_validate_group_size(0, 1, "layout"), KVS_EINVAL,
              "multi: layout group length 0 does not match expected 1");
    CHECK_ERR(kvs_validate_group_size(5, 4, NULL), KVS_EINVAL,
              "multi: group group length 5 does not match expected 4");
    CHECK_OK(kvs_validate_group_size(2, 2, "src"));
    CHECK_OK(kvs_validate_group_size(0, 0, "src"));
}

/* 39: 2-slot bfloat16 [2,4,8] round trip in a buffer of the estimate. */
static void test_f39_round_trip(void)
{
    kvs_multi_serializer *s;
    kvs_multi_deserializer *d;
    REQUIRE_OK(concat_create(2, &s, &d));
    kvs_memobj *k = bf16_248(), *v = bf16_248(), *ko = bf16_248(), *vo = bf16_248();
    REQUIRE(k && v && ko && vo);
    fill_pattern(k, 1);
    fill_pattern(v, 2);
    const kvs_layout *layouts[2] = {&k->layout, &v->layout};
    size_t est = 0, n = 0;
    CHECK_OK(kvs_multi_estimate_serialized_size(s, layouts, 2, &est));
    CHECK_EQ_INT(est, 10 + 2 * 128);
    kvs_memobj *buf = obj_new(est, KVS_DTYPE_UINT8);
    kvs_memobj *src[2] = {k, v}, *dst[2] = {ko, vo};
    CHECK_OK(kvs_multi_serialize(s, src, 2, buf, NULL, &n));
    CHECK(n <= buf->capacity);
    CHECK_EQ_INT(n, est);
    CHECK_OK(kvs_memobj_set_used_size(buf, n));
    CHECK_OK(kvs_multi_deserialize(d, buf, dst, 2, NULL));
    CHECK(same_bytes(k, ko));
    CHECK(same_bytes(v, vo));
    kvs_memobj_free(k);
    kvs_memobj_free(v);
    kvs_memobj_free(ko);
    kvs_memobj_free(vo);
    kvs_memobj_free(buf);
    kvs_multi_serializer_destroy(s);
    kvs_multi_deserializer_destroy(d);
}

/* 40 + 41: (NULL, V) writes 2*5 + V bytes; reading (NULL, V_out) restores V
 * and leaves an unrelated K buffer (filled with 42.0) alone. */
static void test_f40_f41_absent_k(void)
{
    kvs_multi_serializer *s;
    kvs_multi_deserializer *d;
    REQUIRE_OK(concat_create(2, &s, &d));
    kvs_memobj *v = bf16_248(), *vo = bf16_248(), *ksentinel = obj_new(64, KVS_DTYPE_FLOAT32);
    REQUIRE(v && vo && ksentinel);
    fill_pattern(v, 3);
    float *kf = ksentinel->data;
    for (int i = 0; i < 64; i++) kf[i] = 42.0f;
    const kvs_layout *layouts[2] = {NULL, &v->layout};
    size_t est = 0, n = 0;
    CHECK_OK(kvs_multi_estimate_serialized_size(s, layouts, 2, &est));
    kvs_memobj *buf = obj_new(est, KVS_DTYPE_UINT8);
    kvs_memobj *src[2] = {NULL, v}, *dst[2] = {NULL, vo};
    CHECK_OK(kvs_multi_serialize(s, src, 2, buf, NULL, &n));
    CHECK_EQ_INT(n, 2 * 5 + v->used_size);
    CHECK_OK(kvs_memobj_set_used_size(buf, n));
    CHECK_OK(kvs_multi_deserialize(d, buf, dst, 2, NULL));
    CHECK(same_bytes(v, vo));
    int untouched = 1;
    for (int i = 0; i < 64; i++) untouched &= kf[i] == 42.0f;
    CHECK(untouched);
    kvs_memobj_free(v);
    kvs_memobj_free(vo);
    kvs_memobj_free(ksentinel);
    kvs_memobj_free(buf);
    kvs_multi_serializer_destroy(s);
    kvs_multi_deserializer_destroy(d);
}

/* 42: the bridge is layout-equivalent: same n, same bytes, same output. */
static void test_f42_bridge_equivalence(void)
{
    kvs_serializer *direct = id_ser_new();
    kvs_deserializer *direct_de = id_de_new();
    kvs_multi_serializer *ms;
    kvs_multi_deserializer *md;
    REQUIRE_OK(kvs_single_to_multi_serializer(id_ser_new(), &ms));
    REQUIRE_OK(kvs_single_to_multi_deserializer(id_de_new(), &md));
    CHECK_EQ_INT(kvs_multi_serializer_group_size(ms), 1);
    CHECK_EQ_INT(kvs_multi_deserializer_group_size(md), 1);

    kvs_memobj *x = bf16_248();
    REQUIRE(x);
    fill_pattern(x, 9);
    size_t est1 = 0, est2 = 0, n1 = 0, n2 = 0;
    const kvs_layout *layouts[1] = {&x->layout};
    CHECK_OK(kvs_estimate_serialized_size(direct, &x->layout, &est1));
    CHECK_OK(kvs_multi_estimate_serialized_size(ms, layouts, 1, &est2));
    CHECK_EQ_INT(est1, est2);
    kvs_memobj *b1 = obj_new(est1, KVS_DTYPE_UINT8), *b2 = obj_new(est2, KVS_DTYPE_UINT8);
    kvs_memobj *grp[1] = {x};
    CHECK_OK(kvs_serialize(direct, x, b1, NULL, &n1));
    CHECK_OK(kvs_multi_serialize(ms, grp, 1, b2, NULL, &n2));
    CHECK_EQ_INT(n1, n2);
    CHECK(memcmp(b1->data, b2->data, n1) == 0);

    kvs_memobj *o1 = bf16_248(), *o2 = bf16_248();
    kvs_memobj *og[1] = {o2};
    CHECK_OK(kvs_deserialize(direct_de, b1, o1, NULL));
    CHECK_OK(kvs_multi_deserialize(md, b2, og, 1, NULL));
    CHECK(same_bytes(o1, o2));
    CHECK(same_bytes(o1, x));

    kvs_memobj_free(x);
    kvs_memobj_free(b1);
    kvs_memobj_free(b2);
    kvs_memobj_free(o1);
    kvs_memobj_free(o2);
    kvs_serializer_destroy(direct);
    kvs_deserializer_destroy(direct_de);
    kvs_multi_serializer_destroy(ms); /* destroys the inner serde too */
    kvs_multi_deserializer_destroy(md);
}

/* 42, with the real fp8 serde: the bridge writes its bytes exactly. */
static void test_f42_bridge_equivalence_fp8(void)
{
    kvs_serializer *fs;
    kvs_deserializer *fd;
    kvs_serializer *inner_s;
    kvs_deserializer *inner_d;
    REQUIRE_OK(kvs_fp8_serde_create(KVS_DTYPE_FLOAT8_E4M3FN, 1, &fs, &fd));
    REQUIRE_OK(kvs_fp8_serde_create(KVS_DTYPE_FLOAT8_E4M3FN, 1, &inner_s, &inner_d));
    kvs_multi_serializer *ms;
    kvs_multi_deserializer *md;
    REQUIRE_OK(kvs_single_to_multi_serializer(inner_s, &ms));
    REQUIRE_OK(kvs_single_to_multi_deserializer(inner_d, &md));

    kvs_memobj *x = obj_new(1000, KVS_DTYPE_FLOAT32);
    REQUIRE(x);
    float *xf = x->data;
    for (int i = 0; i < 1000; i++) xf[i] = (float)(i - 500) * 0.37f;
    const kvs_layout *layouts[1] = {&x->layout};
    size_t e1, e2, n1, n2;
    CHECK_OK(kvs_estimate_serialized_size(fs, &x->layout, &e1));
    CHECK_OK(kvs_multi_estimate_serialized_size(ms, layouts, 1, &e2));
    CHECK_EQ_INT(e1, e2);
    kvs_memobj *b1 = obj_new(e1, KVS_DTYPE_UINT8), *b2 = obj_new(e2, KVS_DTYPE_UINT8);
    kvs_memobj *grp[1] = {x};
    CHECK_OK(kvs_serialize(fs, x, b1, NULL, &n1));
    CHECK_OK(kvs_multi_serialize(ms, grp, 1, b2, NULL, &n2));
    CHECK_EQ_INT(n1, n2);
    CHECK(memcmp(b1->data, b2->data, e1) == 0);
    /* the stored objects are the bytes written (as the processor narrows) */
    REQUIRE_OK(kvs_memobj_set_used_size(b1, n1));
    REQUIRE_OK(kvs_memobj_set_used_size(b2, n2));
    kvs_memobj *o1 = obj_new(1000, KVS_DTYPE_FLOAT32), *o2 = obj_new(1000, KVS_DTYPE_FLOAT32);
    kvs_memobj *og[1] = {o2};
    CHECK_OK(kvs_deserialize(fd, b1, o1, NULL));
    CHECK_OK(kvs_multi_deserialize(md, b2, og, 1, NULL));
    CHECK(same_bytes(o1, o2));
    kvs_memobj_free(x);
    kvs_memobj_free(b1);
    kvs_memobj_free(b2);
    kvs_memobj_free(o1);
    kvs_memobj_free(o2);
    kvs_serializer_destroy(fs);
    kvs_deserializer_destroy(fd);
    kvs_multi_serializer_destroy(ms);
    kvs_multi_deserializer_destroy(md);
}

/* 43: a group of another size is refused, on every operation. */
static void test_f43_bridge_group_of_two(void)
{
    kvs_multi_serializer *ms;
    kvs_multi_deserializer *md;
    REQUIRE_OK(kvs_single_to_multi_serializer(id_ser_new(), &ms));
    REQUIRE_OK(kvs_single_to_multi_deserializer(id_de_new(), &md));
    kvs_memobj *x = obj_new(16, KVS_DTYPE_UINT8), *buf = obj_new(64, KVS_DTYPE_UINT8);
    memset(buf->data, 0xAB, 64);
    kvs_memobj *two[2] = {x, x};
    size_t n = 777;
    CHECK_ERR(kvs_multi_serialize(ms, two, 2, buf, NULL, &n), KVS_EINVAL,
              "single-to-multi(identity): expected group of size 1, got 2");
    CHECK_EQ_INT(n, 777);
    CHECK(all_bytes(buf, 0xAB));
    const kvs_layout *layouts[2] = {&x->layout, &x->layout};
    CHECK_ERR(kvs_multi_estimate_serialized_size(ms, layouts, 2, &n), KVS_EINVAL,
              "single-to-multi(identity): expected layout group of size 1, got 2");
    CHECK_ERR(kvs_multi_serialize(ms, two, 0, buf, NULL, &n), KVS_EINVAL,
              "single-to-multi(identity): expected group of size 1, got 0");
    memset(x->data, 0xCD, 16);
    CHECK_ERR(kvs_multi_deserialize(md, buf, two, 2, NULL), KVS_EINVAL,
              "single-to-multi(identity): expected group of size 1, got 2");
    CHECK(all_bytes(x, 0xCD));
    kvs_memobj_free(x);
    kvs_memobj_free(buf);
    kvs_multi_serializer_destroy(ms);
    kvs_multi_deserializer_destroy(md);
}

/* 44: (NULL,) is not a valid serialize input, nor a NULL layout. */
static void test_f44_bridge_absent_src(void)
{
    kvs_multi_serializer *ms;
    REQUIRE_OK(kvs_single_to_multi_serializer(id_ser_new(), &ms));
    kvs_memobj *buf = obj_new(64, KVS_DTYPE_UINT8);
    kvs_memobj *none[1] = {NULL};
    size_t n = 0;
    CHECK_ERR(kvs_multi_serialize(ms, none, 1, buf, NULL, &n), KVS_EINVAL,
              "single-to-multi(identity): the single-tensor serializer does not admit an "
              "absent src slot");
    const kvs_layout *layouts[1] = {NULL};
    CHECK_ERR(kvs_multi_estimate_serialized_size(ms, layouts, 1, &n), KVS_EINVAL,
              "single-to-multi(identity): the single-tensor serializer requires a layout "
              "in slot 0");
    kvs_memobj_free(buf);
    kvs_multi_serializer_destroy(ms);
}

/* 45: deserializing into (NULL,) is a deliberate no-op, even from junk. */
static void test_f45_bridge_absent_dst(void)
{
    kvs_multi_deserializer *md;
    REQUIRE_OK(kvs_single_to_multi_deserializer(id_de_new(), &md));
    kvs_memobj *buf = obj_new(0, KVS_DTYPE_UINT8);
    kvs_memobj *none[1] = {NULL};
    CHECK_OK(kvs_multi_deserialize(md, buf, none, 1, NULL));
    kvs_memobj_free(buf);
    kvs_multi_deserializer_destroy(md);
}

/* The checked calls refuse NULLs, and give a failing implementation that
 * forgot its message one that names it. */
static int mute_serialize(kvs_multi_serializer *s, kvs_memobj *const *src, size_t n,
                          kvs_memobj *dst, const kvs_object_key *key, size_t *nwritten)
{
    (void)key;
    return KVS_ECORRUPT;
}

static int mute_deserialize(kvs_multi_deserializer *d, const kvs_memobj *src,
                            kvs_memobj *const *dst, size_t n, const kvs_object_key *key)
{
    (void)key;
    return KVS_EIO;
}

static void test_checked_calls(void)
{
    kvs_multi_serializer *s;
    kvs_multi_deserializer *d;
    REQUIRE_OK(concat_create(1, &s, &d));
    kvs_memobj *x = obj_new(8, KVS_DTYPE_UINT8), *buf = obj_new(64, KVS_DTYPE_UINT8);
    kvs_memobj *g[1] = {x};
    const kvs_layout *l[1] = {&x->layout};
    size_t n;
    CHECK_ERR(kvs_multi_serialize(NULL, g, 1, buf, NULL, &n), KVS_EINVAL,
              "multi: serialize: NULL argument");
    CHECK_ERR(kvs_multi_serialize(s, NULL, 1, buf, NULL, &n), KVS_EINVAL,
              "multi: serialize: NULL argument");
    CHECK_ERR(kvs_multi_serialize(s, g, 1, NULL, NULL, &n), KVS_EINVAL,
              "multi: serialize: NULL argument");
    CHECK_ERR(kvs_multi_serialize(s, g, 1, buf, NULL, NULL), KVS_EINVAL,
              "multi: serialize: NULL argument");
    CHECK_ERR(kvs_multi_estimate_serialized_size(s, NULL, 1, &n), KVS_EINVAL,
              "multi: estimate: NULL argument");
    CHECK_ERR(kvs_multi_estimate_serialized_size(s, l, 1, NULL), KVS_EINVAL,
              "multi: estimate: NULL argument");
    CHECK_ERR(kvs_multi_deserialize(d, NULL, g, 1, NULL), KVS_EINVAL,
              "multi: deserialize: NULL argument");
    CHECK_ERR(kvs_multi_deserialize(d, buf, NULL, 1, NULL), KVS_EINVAL,
              "multi: deserialize: NULL argument");
    /* A NULL group of length 0 reaches the implementation, which refuses it. */
    CHECK_ERR(kvs_multi_serialize(s, NULL, 0, buf, NULL, &n), KVS_EINVAL,
              "multi: src group length 0 does not match expected 1");
    CHECK_ERR(kvs_multi_deserialize(d, buf, NULL, 0, NULL), KVS_EINVAL,
              "multi: dst group length 0 does not match expected 1");

    static const struct kvs_multi_serializer_ops mute_ops = {"mute", mute_serialize, NULL,
                                                             NULL};
    static const struct kvs_multi_deserializer_ops mute_de_ops = {"mute", mute_deserialize,
                                                                  NULL};
    kvs_multi_serializer mute = {&mute_ops, 1};
    kvs_multi_deserializer mute_de = {&mute_de_ops, 1};
    CHECK_ERR(kvs_multi_serialize(&mute, g, 1, buf, NULL, &n), KVS_ECORRUPT,
              "mute: serialize failed: corrupt input");
    CHECK_ERR(kvs_multi_deserialize(&mute_de, buf, g, 1, NULL), KVS_EIO,
              "mute: deserialize failed: I/O error");

    CHECK_ERR(kvs_single_to_multi_serializer(NULL, &s), KVS_EINVAL,
              "single-to-multi: NULL serializer or output");
    CHECK_ERR(kvs_single_to_multi_deserializer(NULL, &d), KVS_EINVAL,
              "single-to-multi: NULL deserializer or output");
    kvs_multi_serializer_destroy(NULL);
    kvs_multi_deserializer_destroy(NULL);
    kvs_multi_serde_pair_destroy(NULL);

    kvs_multi_serde_pair pair = {s, d, 3};
    kvs_multi_serde_pair_destroy(&pair);
    CHECK(pair.serializer == NULL && pair.deserializer == NULL && pair.max_workers == 0);
    kvs_memobj_free(x);
    kvs_memobj_free(buf);
}

/* A group of N != 2 through a generic group_size, both directions. */
static void test_group_of_three(void)
{
    kvs_multi_serializer *s;
    kvs_multi_deserializer *d;
    REQUIRE_OK(concat_create(3, &s, &d));
    kvs_memobj *a = obj_new(5, KVS_DTYPE_UINT8), *c = obj_new(7, KVS_DTYPE_UINT8);
    kvs_memobj *ao = obj_new(5, KVS_DTYPE_UINT8), *co = obj_new(7, KVS_DTYPE_UINT8);
    fill_pattern(a, 4);
    fill_pattern(c, 5);
    kvs_memobj *src[3] = {a, NULL, c}, *dst[3] = {ao, NULL, co};
    kvs_memobj *buf = obj_new(64, KVS_DTYPE_UINT8);
    size_t n;
    CHECK_OK(kvs_multi_serialize(s, src, 3, buf, NULL, &n));
    CHECK_EQ_INT(n, 15 + 12);
    CHECK_OK(kvs_memobj_set_used_size(buf, n));
    CHECK_OK(kvs_multi_deserialize(d, buf, dst, 3, NULL));
    CHECK(same_bytes(a, ao) && same_bytes(c, co));
    CHECK_ERR(kvs_multi_serialize(s, src, 2, buf, NULL, &n), KVS_EINVAL,
              "multi: src group length 2 does not match expected 3");
    kvs_memobj *b = obj_new(3, KVS_DTYPE_UINT8);
    kvs_memobj *want_b[3] = {NULL, b, NULL};
    CHECK_ERR(kvs_multi_deserialize(d, buf, want_b, 3, NULL), KVS_EINVAL,
              "concat: slot 1 not in the blob");
    kvs_memobj_free(a);
    kvs_memobj_free(b);
    kvs_memobj_free(c);
    kvs_memobj_free(ao);
    kvs_memobj_free(co);
    kvs_memobj_free(buf);
    kvs_multi_serializer_destroy(s);
    kvs_multi_deserializer_destroy(d);
}

/* ---------------------------------------------------------------------
 * Group G cases 46-49 (test_multi_output_mp_contract.py)
 * ------------------------------------------------------------------ */

/* 46: K (4096 B of 0x11) and V (2048 B of 0x22) round-trip with sizes and
 * fills preserved. */
static void test_g46_local_round_trip(void)
{
    kvs_multi_serializer *s;
    kvs_multi_deserializer *d;
    REQUIRE_OK(concat_create(2, &s, &d));
    kvs_memobj *k = obj_new(4096, KVS_DTYPE_UINT8), *v = obj_new(2048, KVS_DTYPE_UINT8);
    kvs_memobj *ko = obj_new(4096, KVS_DTYPE_UINT8), *vo = obj_new(2048, KVS_DTYPE_UINT8);
    memset(k->data, 0x11, 4096);
    memset(v->data, 0x22, 2048);
    const kvs_layout *layouts[2] = {&k->layout, &v->layout};
    size_t est, n;
    CHECK_OK(kvs_multi_estimate_serialized_size(s, layouts, 2, &est));
    kvs_memobj *buf = obj_new(est, KVS_DTYPE_UINT8);
    kvs_memobj *src[2] = {k, v}, *dst[2] = {ko, vo};
    CHECK_OK(kvs_multi_serialize(s, src, 2, buf, NULL, &n));
    CHECK_OK(kvs_memobj_set_used_size(buf, n));
    CHECK_OK(kvs_multi_deserialize(d, buf, dst, 2, NULL));
    CHECK_EQ_INT(ko->used_size, 4096);
    CHECK_EQ_INT(vo->used_size, 2048);
    CHECK(all_bytes(ko, 0x11));
    CHECK(all_bytes(vo, 0x22));
    kvs_memobj_free(k);
    kvs_memobj_free(v);
    kvs_memobj_free(ko);
    kvs_memobj_free(vo);
    kvs_memobj_free(buf);
    kvs_multi_serializer_destroy(s);
    kvs_multi_deserializer_destroy(d);
}

/* 47: absent K: the K destination (pre-filled 0xEE) is not passed, stays
 * 0xEE; V comes back as 0x22. */
static void test_g47_absent_k(void)
{
    kvs_multi_serializer *s;
    kvs_multi_deserializer *d;
    REQUIRE_OK(concat_create(2, &s, &d));
    kvs_memobj *v = obj_new(2048, KVS_DTYPE_UINT8), *vo = obj_new(2048, KVS_DTYPE_UINT8);
    kvs_memobj *kdst = obj_new(4096, KVS_DTYPE_UINT8);
    memset(v->data, 0x22, 2048);
    memset(kdst->data, 0xEE, 4096);
    kvs_memobj *buf = obj_new(4096, KVS_DTYPE_UINT8);
    kvs_memobj *src[2] = {NULL, v}, *dst[2] = {NULL, vo};
    size_t n;
    CHECK_OK(kvs_multi_serialize(s, src, 2, buf, NULL, &n));
    CHECK_OK(kvs_memobj_set_used_size(buf, n));
    CHECK_OK(kvs_multi_deserialize(d, buf, dst, 2, NULL));
    CHECK(all_bytes(kdst, 0xEE));
    CHECK(all_bytes(vo, 0x22));
    kvs_memobj_free(v);
    kvs_memobj_free(vo);
    kvs_memobj_free(kdst);
    kvs_memobj_free(buf);
    kvs_multi_serializer_destroy(s);
    kvs_multi_deserializer_destroy(d);
}

/* 48: single-output bridge: 1024 B of 0x5A round-trips. */
static void test_g48_single_bridge(void)
{
    kvs_multi_serializer *ms;
    kvs_multi_deserializer *md;
    REQUIRE_OK(kvs_single_to_multi_serializer(id_ser_new(), &ms));
    REQUIRE_OK(kvs_single_to_multi_deserializer(id_de_new(), &md));
    kvs_memobj *x = obj_new(1024, KVS_DTYPE_UINT8), *xo = obj_new(1024, KVS_DTYPE_UINT8);
    memset(x->data, 0x5A, 1024);
    const kvs_layout *layouts[1] = {&x->layout};
    size_t est, n;
    CHECK_OK(kvs_multi_estimate_serialized_size(ms, layouts, 1, &est));
    kvs_memobj *buf = obj_new(est, KVS_DTYPE_UINT8);
    kvs_memobj *src[1] = {x}, *dst[1] = {xo};
    CHECK_OK(kvs_multi_serialize(ms, src, 1, buf, NULL, &n));
    CHECK_EQ_INT(n, 1024);
    CHECK_OK(kvs_multi_deserialize(md, buf, dst, 1, NULL));
    CHECK(all_bytes(xo, 0x5A));
    kvs_memobj_free(x);
    kvs_memobj_free(xo);
    kvs_memobj_free(buf);
    kvs_multi_serializer_destroy(ms);
    kvs_multi_deserializer_destroy(md);
}

/* 49: byte accounting, on real kv_split blobs rather than arithmetic: K16/V8
 * payload = 0.75 x FP16 K+V; V-only = 1/3 of that = 0.25 x FP16. Header and
 * trailer are the fixed 84 bytes on top. */
static void test_g49_byte_accounting(void)
{
    enum { N = 8192 };
    kvs_kv_split_options o;
    kvs_kv_split_options_init(&o);
    kvs_multi_serializer *kv, *vonly;
    REQUIRE_OK(kvs_kv_split_serde_create(&o, &kv, NULL));
    o.mode = KVS_KV_SPLIT_MODE_V_ONLY;
    REQUIRE_OK(kvs_kv_split_serde_create(&o, &vonly, NULL));
    kvs_memobj *k = obj_new(N, KVS_DTYPE_FLOAT16), *v = obj_new(N, KVS_DTYPE_FLOAT16);
    kvs_memobj *buf = obj_new(4 * N + 1024, KVS_DTYPE_UINT8);
    size_t fp16 = k->used_size + v->used_size, all, vo;
    kvs_memobj *both[2] = {k, v}, *just_v[2] = {NULL, v};
    CHECK_OK(kvs_multi_serialize(kv, both, 2, buf, NULL, &all));
    CHECK_OK(kvs_multi_serialize(vonly, just_v, 2, buf, NULL, &vo));
    size_t hdr = KVS_KV_SPLIT_HEADER_SIZE + KVS_KV_SPLIT_TRAILER_SIZE;
    CHECK_EQ_INT(hdr, 84);
    CHECK_EQ_INT((all - hdr) * 4, fp16 * 3);  /* 0.75x */
    CHECK_EQ_INT((vo - hdr) * 4, fp16);       /* 0.25x */
    CHECK_EQ_INT((vo - hdr) * 3, all - hdr);  /* 1/3 of all-NVMe */
    printf("case 49: fp16 K+V %zu B; K16/V8 payload %zu B (%.3fx) + %zu B header; "
           "V-only payload %zu B (%.3fx) + %zu B header\n",
           fp16, all - hdr, (double)(all - hdr) / (double)fp16, hdr, vo - hdr,
           (double)(vo - hdr) / (double)fp16, hdr);
    kvs_memobj_free(k);
    kvs_memobj_free(v);
    kvs_memobj_free(buf);
    kvs_multi_serializer_destroy(kv);
    kvs_multi_serializer_destroy(vonly);
}

int main(void)
{
    RUN(test_f36_group_size_fixed);
    RUN(test_f37_bad_group_size);
    RUN(test_f38_validate_group_size);
    RUN(test_f39_round_trip);
    RUN(test_f40_f41_absent_k);
    RUN(test_f42_bridge_equivalence);
    RUN(test_f42_bridge_equivalence_fp8);
    RUN(test_f43_bridge_group_of_two);
    RUN(test_f44_bridge_absent_src);
    RUN(test_f45_bridge_absent_dst);
    RUN(test_checked_calls);
    RUN(test_group_of_three);
    RUN(test_g46_local_round_trip);
    RUN(test_g47_absent_k);
    RUN(test_g48_single_bridge);
    RUN(test_g49_byte_accounting);
    return TEST_SUMMARY();
}
