/* test_layout.c - memory layouts (upstream MemoryLayoutDesc). */
#include <stdint.h>
#include <string.h>

#include "kvs_test.h"
#include "kvserde/memobj.h"

static kvs_shape make_shape(uint32_t ndim, const int64_t *dims)
{
    kvs_shape s;
    memset(&s, 0, sizeof s);
    s.ndim = ndim;
    for (uint32_t i = 0; i < ndim; i++) s.dims[i] = dims[i];
    return s;
}

/* A layout filled with a recognizable pattern, to detect writes. */
static void poison(kvs_layout *l)
{
    memset(l, 0xA5, sizeof *l);
}

static int is_poisoned(const kvs_layout *l)
{
    const unsigned char *p = (const unsigned char *)l;
    for (size_t i = 0; i < sizeof *l; i++)
        if (p[i] != 0xA5) return 0;
    return 1;
}

/* ------------------------------------------------------------ success */

static void test_single_group_upstream(void)
{
    const int64_t dims[] = {2, 4, 256, 128};
    kvs_shape s = make_shape(4, dims);
    kvs_dtype dt = KVS_DTYPE_BFLOAT16;
    kvs_layout l;
    poison(&l);
    REQUIRE_OK(kvs_layout_init(&l, 1, &s, 1, &dt));
    CHECK_EQ_INT(l.ngroups, 1);
    CHECK_EQ_INT(l.groups[0].shape.ndim, 4);
    CHECK_EQ_INT(l.groups[0].shape.dims[2], 256);
    CHECK_EQ_INT(l.groups[0].dtype, KVS_DTYPE_BFLOAT16);
    CHECK_EQ_U64(kvs_layout_group_numel(&l, 0), 262144);
    CHECK_EQ_U64(kvs_layout_group_nbytes(&l, 0), 524288);
    CHECK_EQ_U64(kvs_layout_group_offset(&l, 0), 0);
    CHECK_EQ_U64(kvs_layout_numel(&l), 262144);
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 524288);
    CHECK_OK(kvs_layout_validate(&l));
}

static void test_multi_group_upstream(void)
{
    const int64_t d0[] = {4, 8}, d1[] = {16};
    kvs_shape shapes[2] = {make_shape(2, d0), make_shape(1, d1)};
    kvs_dtype dts[2] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16};
    kvs_layout l;
    REQUIRE_OK(kvs_layout_init(&l, 2, shapes, 2, dts));
    CHECK_EQ_INT(l.ngroups, 2);
    CHECK_EQ_U64(kvs_layout_group_numel(&l, 0), 32);
    CHECK_EQ_U64(kvs_layout_group_numel(&l, 1), 16);
    CHECK_EQ_U64(kvs_layout_group_nbytes(&l, 0), 64);
    CHECK_EQ_U64(kvs_layout_group_nbytes(&l, 1), 32);
    CHECK_EQ_U64(kvs_layout_group_offset(&l, 0), 0);
    CHECK_EQ_U64(kvs_layout_group_offset(&l, 1), 64);
    CHECK_EQ_U64(kvs_layout_numel(&l), 48);
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 96);
}

static void test_three_groups_mixed(void)
{
    /* float32 [3], fp8 [5], float16 [2,3]: 12 + 5 + 12 bytes, no padding. */
    const int64_t d0[] = {3}, d1[] = {5}, d2[] = {2, 3};
    kvs_shape shapes[3] = {make_shape(1, d0), make_shape(1, d1), make_shape(2, d2)};
    kvs_dtype dts[3] = {KVS_DTYPE_FLOAT32, KVS_DTYPE_FLOAT8_E5M2, KVS_DTYPE_FLOAT16};
    kvs_layout l;
    REQUIRE_OK(kvs_layout_init(&l, 3, shapes, 3, dts));
    CHECK_EQ_U64(kvs_layout_group_offset(&l, 1), 12);
    CHECK_EQ_U64(kvs_layout_group_offset(&l, 2), 17);
    CHECK_EQ_U64(kvs_layout_group_nbytes(&l, 2), 12);
    CHECK_EQ_U64(kvs_layout_numel(&l), 14);
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 29);
}

static void test_empty_layout(void)
{
    kvs_layout l;
    poison(&l);
    REQUIRE_OK(kvs_layout_init(&l, 0, NULL, 0, NULL));
    CHECK_EQ_INT(l.ngroups, 0);
    CHECK_EQ_U64(kvs_layout_numel(&l), 0);
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 0);
    CHECK_OK(kvs_layout_validate(&l));
    char buf[16];
    CHECK_EQ_STR(kvs_layout_format(&l, buf, sizeof buf), "[]");
}

static void test_scalar_shape(void)
{
    kvs_shape s = make_shape(0, NULL);
    kvs_dtype dt = KVS_DTYPE_FLOAT32;
    kvs_layout l;
    REQUIRE_OK(kvs_layout_init(&l, 1, &s, 1, &dt));
    CHECK_EQ_U64(kvs_layout_group_numel(&l, 0), 1);
    CHECK_EQ_U64(kvs_layout_group_nbytes(&l, 0), 4);
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 4);

    /* Through add_group too, with NULL dims. */
    kvs_layout m;
    memset(&m, 0, sizeof m);
    REQUIRE_OK(kvs_layout_add_group(&m, 0, NULL, KVS_DTYPE_BFLOAT16));
    CHECK_EQ_U64(kvs_layout_numel(&m), 1);
    CHECK_EQ_U64(kvs_layout_nbytes(&m), 2);
}

static void test_zero_dim(void)
{
    const int64_t dims[] = {4, 0, 128};
    kvs_shape s = make_shape(3, dims);
    kvs_dtype dt = KVS_DTYPE_FLOAT16;
    kvs_layout l;
    REQUIRE_OK(kvs_layout_init(&l, 1, &s, 1, &dt));
    CHECK_EQ_U64(kvs_layout_numel(&l), 0);
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 0);
    /* A zero-byte group before another: the next offset is unchanged. */
    const int64_t d1[] = {3};
    REQUIRE_OK(kvs_layout_add_group(&l, 1, d1, KVS_DTYPE_FLOAT32));
    CHECK_EQ_U64(kvs_layout_group_offset(&l, 1), 0);
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 12);
    /* Zero first, then huge dims: the element count is 0, no overflow. */
    const int64_t big[] = {0, (int64_t)1 << 62, (int64_t)1 << 62};
    kvs_layout z;
    memset(&z, 0, sizeof z);
    CHECK_OK(kvs_layout_add_group(&z, 3, big, KVS_DTYPE_FLOAT32));
    CHECK_EQ_U64(kvs_layout_nbytes(&z), 0);
}

/* A zero dim makes the byte size 0 wherever it is: torch (and upstream's
 * Python math.prod) give numel 0 for [2^62, 2^62, 0]. The refusal must not
 * depend on where the zero sits. */
static void test_zero_dim_after_huge_dims(void)
{
    const int64_t big[] = {(int64_t)1 << 62, (int64_t)1 << 62, 0};
    kvs_layout z;
    memset(&z, 0, sizeof z);
    CHECK_OK(kvs_layout_add_group(&z, 3, big, KVS_DTYPE_FLOAT32));
    CHECK_EQ_INT(z.ngroups, 1);
    CHECK_EQ_U64(kvs_layout_nbytes(&z), 0);
}

static void test_max_groups_and_dims(void)
{
    /* KVS_MAX_GROUPS groups of KVS_MAX_DIMS dims each are accepted. */
    kvs_shape shapes[KVS_MAX_GROUPS];
    kvs_dtype dts[KVS_MAX_GROUPS];
    const int64_t ones[KVS_MAX_DIMS] = {1, 1, 1, 1, 1, 1, 1, 2};
    for (int i = 0; i < KVS_MAX_GROUPS; i++) {
        shapes[i] = make_shape(KVS_MAX_DIMS, ones);
        dts[i] = KVS_DTYPE_FLOAT16;
    }
    kvs_layout l;
    REQUIRE_OK(kvs_layout_init(&l, KVS_MAX_GROUPS, shapes, KVS_MAX_GROUPS, dts));
    CHECK_EQ_INT(l.ngroups, KVS_MAX_GROUPS);
    CHECK_EQ_U64(kvs_layout_numel(&l), 2 * KVS_MAX_GROUPS);
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 4 * KVS_MAX_GROUPS);
    CHECK_EQ_U64(kvs_layout_group_offset(&l, KVS_MAX_GROUPS - 1), 4 * (KVS_MAX_GROUPS - 1));
}

static void test_add_group_builds_same_as_init(void)
{
    const int64_t d0[] = {4, 8}, d1[] = {16};
    kvs_shape shapes[2] = {make_shape(2, d0), make_shape(1, d1)};
    kvs_dtype dts[2] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16};
    kvs_layout a, b;
    REQUIRE_OK(kvs_layout_init(&a, 2, shapes, 2, dts));
    REQUIRE_OK(kvs_layout_init(&b, 0, NULL, 0, NULL));
    REQUIRE_OK(kvs_layout_add_group(&b, 2, d0, KVS_DTYPE_BFLOAT16));
    CHECK_EQ_INT(b.ngroups, 1);
    CHECK_EQ_U64(kvs_layout_nbytes(&b), 64);
    CHECK_EQ_INT(kvs_layout_equal(&a, &b), 0);
    REQUIRE_OK(kvs_layout_add_group(&b, 1, d1, KVS_DTYPE_FLOAT16));
    CHECK_EQ_INT(b.ngroups, 2);
    CHECK_EQ_INT(kvs_layout_equal(&a, &b), 1);
    CHECK_EQ_U64(kvs_layout_group_offset(&b, 1), 64);
    CHECK_EQ_U64(kvs_layout_nbytes(&b), 96);
}

static void test_flat(void)
{
    kvs_layout l;
    poison(&l);
    REQUIRE_OK(kvs_layout_flat(&l, 1000, KVS_DTYPE_FLOAT16));
    CHECK_EQ_INT(l.ngroups, 1);
    CHECK_EQ_INT(l.groups[0].shape.ndim, 1);
    CHECK_EQ_INT(l.groups[0].shape.dims[0], 1000);
    CHECK_EQ_INT(l.groups[0].dtype, KVS_DTYPE_FLOAT16);
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 2000);

    REQUIRE_OK(kvs_layout_flat(&l, 0, KVS_DTYPE_UINT8));
    CHECK_EQ_INT(l.ngroups, 1);
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 0);

    /* The largest uint8 flat layout: 2^63 - 1 bytes. */
    REQUIRE_OK(kvs_layout_flat(&l, (uint64_t)INT64_MAX, KVS_DTYPE_UINT8));
    CHECK_EQ_U64(kvs_layout_nbytes(&l), (uint64_t)INT64_MAX);
}

static void test_flat_refusals(void)
{
    kvs_layout l;
    poison(&l);
    CHECK_ERR(kvs_layout_flat(&l, (uint64_t)INT64_MAX + 1, KVS_DTYPE_UINT8), KVS_EINVAL,
              "layout: group 0 byte size overflows 2^63");
    CHECK_ERR(kvs_layout_flat(&l, UINT64_MAX, KVS_DTYPE_UINT8), KVS_EINVAL,
              "layout: group 0 byte size overflows 2^63");
    CHECK_ERR(kvs_layout_flat(&l, (uint64_t)1 << 62, KVS_DTYPE_FLOAT32), KVS_EINVAL,
              "layout: group 0 byte size overflows 2^63");
    CHECK_ERR(kvs_layout_flat(&l, 4, (kvs_dtype)9), KVS_EINVAL,
              "layout: group 0 has invalid dtype 9");
    CHECK(is_poisoned(&l));
    CHECK_ERR(kvs_layout_flat(NULL, 4, KVS_DTYPE_UINT8), KVS_EINVAL,
              "layout: NULL output");
}

static void test_equal(void)
{
    const int64_t d0[] = {4, 8};
    kvs_layout a, b;
    memset(&a, 0, sizeof a);
    REQUIRE_OK(kvs_layout_add_group(&a, 2, d0, KVS_DTYPE_BFLOAT16));
    b = a;
    CHECK_EQ_INT(kvs_layout_equal(&a, &b), 1);

    /* Dims past ndim are not part of the shape. */
    b.groups[0].shape.dims[5] = 77;
    CHECK_EQ_INT(kvs_layout_equal(&a, &b), 1);

    b = a;
    b.groups[0].dtype = KVS_DTYPE_FLOAT16; /* same size, other dtype */
    CHECK_EQ_INT(kvs_layout_equal(&a, &b), 0);

    b = a;
    b.groups[0].shape.dims[1] = 9;
    CHECK_EQ_INT(kvs_layout_equal(&a, &b), 0);

    /* Same element count, different shape. */
    const int64_t d_t[] = {8, 4}, d_flat[] = {32};
    memset(&b, 0, sizeof b);
    REQUIRE_OK(kvs_layout_add_group(&b, 2, d_t, KVS_DTYPE_BFLOAT16));
    CHECK_EQ_INT(kvs_layout_equal(&a, &b), 0);
    memset(&b, 0, sizeof b);
    REQUIRE_OK(kvs_layout_add_group(&b, 1, d_flat, KVS_DTYPE_BFLOAT16));
    CHECK_EQ_INT(kvs_layout_equal(&a, &b), 0);

    /* Extra group. */
    b = a;
    REQUIRE_OK(kvs_layout_add_group(&b, 0, NULL, KVS_DTYPE_UINT8));
    CHECK_EQ_INT(kvs_layout_equal(&a, &b), 0);
    CHECK_EQ_INT(kvs_layout_equal(&b, &a), 0);

    kvs_layout e1, e2;
    REQUIRE_OK(kvs_layout_init(&e1, 0, NULL, 0, NULL));
    REQUIRE_OK(kvs_layout_init(&e2, 0, NULL, 0, NULL));
    CHECK_EQ_INT(kvs_layout_equal(&e1, &e2), 1);
    CHECK_EQ_INT(kvs_layout_equal(&e1, &a), 0);
}

static void test_format(void)
{
    char buf[128];
    kvs_layout l;
    memset(&l, 0, sizeof l);
    const int64_t d0[] = {2, 4, 64, 128}, d1[] = {16};
    REQUIRE_OK(kvs_layout_add_group(&l, 4, d0, KVS_DTYPE_BFLOAT16));
    CHECK_EQ_STR(kvs_layout_format(&l, buf, sizeof buf), "[2x4x64x128 bfloat16]");
    REQUIRE_OK(kvs_layout_add_group(&l, 1, d1, KVS_DTYPE_FLOAT16));
    CHECK(kvs_layout_format(&l, buf, sizeof buf) == buf);
    CHECK_EQ_STR(buf, "[2x4x64x128 bfloat16, 16 float16]");

    REQUIRE_OK(kvs_layout_add_group(&l, 0, NULL, KVS_DTYPE_FLOAT8_E4M3FN));
    CHECK_EQ_STR(kvs_layout_format(&l, buf, sizeof buf),
                 "[2x4x64x128 bfloat16, 16 float16, scalar float8_e4m3fn]");

    const int64_t dz[] = {0, 3};
    memset(&l, 0, sizeof l);
    REQUIRE_OK(kvs_layout_add_group(&l, 2, dz, KVS_DTYPE_UINT8));
    CHECK_EQ_STR(kvs_layout_format(&l, buf, sizeof buf), "[0x3 uint8]");

    CHECK_EQ_STR(kvs_layout_format(NULL, buf, sizeof buf), "[]");
}

static void test_format_truncation(void)
{
    kvs_layout l;
    memset(&l, 0, sizeof l);
    const int64_t d0[] = {4, 8};
    REQUIRE_OK(kvs_layout_add_group(&l, 2, d0, KVS_DTYPE_BFLOAT16));
    char buf[16];
    memset(buf, 'Q', sizeof buf);
    CHECK_EQ_STR(kvs_layout_format(&l, buf, 5), "[4x8");
    CHECK(buf[5] == 'Q'); /* nothing written past bufsize */
    CHECK_EQ_STR(kvs_layout_format(&l, buf, 1), "");
    /* bufsize 0: nothing written, buf returned. */
    memset(buf, 'Q', sizeof buf);
    CHECK(kvs_layout_format(&l, buf, 0) == buf);
    CHECK(buf[0] == 'Q');
    CHECK(kvs_layout_format(&l, NULL, 10) == NULL);
    /* Exactly enough room ("[4x8 bfloat16]" is 14 chars). */
    CHECK_EQ_STR(kvs_layout_format(&l, buf, 15), "[4x8 bfloat16]");
    CHECK_EQ_STR(kvs_layout_format(&l, buf, 14), "[4x8 bfloat16");
}

/* ------------------------------------------------------------ refusals */

static void test_init_count_mismatch(void)
{
    const int64_t d[] = {4};
    kvs_shape shapes[2] = {make_shape(1, d), make_shape(1, d)};
    kvs_dtype dts[2] = {KVS_DTYPE_UINT8, KVS_DTYPE_UINT8};
    kvs_layout l;
    poison(&l);
    CHECK_ERR(kvs_layout_init(&l, 2, shapes, 1, dts), KVS_EINVAL,
              "layout: shapes and dtypes must have the same length: 2 shapes, 1 dtypes");
    CHECK_ERR(kvs_layout_init(&l, 0, shapes, 2, dts), KVS_EINVAL,
              "layout: shapes and dtypes must have the same length: 0 shapes, 2 dtypes");
    CHECK(is_poisoned(&l));
}

static void test_init_too_many_groups(void)
{
    kvs_shape shapes[KVS_MAX_GROUPS + 1];
    kvs_dtype dts[KVS_MAX_GROUPS + 1];
    for (int i = 0; i <= KVS_MAX_GROUPS; i++) {
        shapes[i] = make_shape(0, NULL);
        dts[i] = KVS_DTYPE_UINT8;
    }
    kvs_layout l;
    poison(&l);
    CHECK_ERR(kvs_layout_init(&l, KVS_MAX_GROUPS + 1, shapes, KVS_MAX_GROUPS + 1, dts),
              KVS_EINVAL, "layout: 17 groups, at most 16");
    CHECK(is_poisoned(&l));
}

static void test_init_too_many_dims(void)
{
    kvs_shape s;
    memset(&s, 0, sizeof s);
    s.ndim = KVS_MAX_DIMS + 1;
    for (int i = 0; i < KVS_MAX_DIMS; i++) s.dims[i] = 1;
    const int64_t d[] = {2};
    kvs_shape shapes[2] = {make_shape(1, d), s};
    kvs_dtype dts[2] = {KVS_DTYPE_UINT8, KVS_DTYPE_UINT8};
    kvs_layout l;
    poison(&l);
    CHECK_ERR(kvs_layout_init(&l, 2, shapes, 2, dts), KVS_EINVAL,
              "layout: group 1 has 9 dims, at most 8");
    CHECK(is_poisoned(&l));
}

static void test_init_negative_dim(void)
{
    const int64_t d[] = {4, -3, 2};
    kvs_shape s = make_shape(3, d);
    kvs_dtype dt = KVS_DTYPE_FLOAT32;
    kvs_layout l;
    poison(&l);
    CHECK_ERR(kvs_layout_init(&l, 1, &s, 1, &dt), KVS_EINVAL,
              "layout: group 0 dim 1 is negative (-3)");
    const int64_t dm[] = {INT64_MIN};
    s = make_shape(1, dm);
    CHECK_ERR(kvs_layout_init(&l, 1, &s, 1, &dt), KVS_EINVAL,
              "layout: group 0 dim 0 is negative (-9223372036854775808)");
    CHECK(is_poisoned(&l));
}

static void test_init_invalid_dtype(void)
{
    const int64_t d[] = {4};
    kvs_shape shapes[2] = {make_shape(1, d), make_shape(1, d)};
    kvs_dtype dts[2] = {KVS_DTYPE_FLOAT16, (kvs_dtype)KVS_DTYPE_COUNT};
    kvs_layout l;
    poison(&l);
    CHECK_ERR(kvs_layout_init(&l, 2, shapes, 2, dts), KVS_EINVAL,
              "layout: group 1 has invalid dtype 6");
    dts[1] = (kvs_dtype)-1;
    CHECK_ERR(kvs_layout_init(&l, 2, shapes, 2, dts), KVS_EINVAL,
              "layout: group 1 has invalid dtype -1");
    CHECK(is_poisoned(&l));
}

static void test_init_overflow(void)
{
    const int64_t d[] = {(int64_t)1 << 40, (int64_t)1 << 30};
    kvs_shape s = make_shape(2, d);
    kvs_dtype dt = KVS_DTYPE_FLOAT32;
    kvs_layout l;
    poison(&l);
    CHECK_ERR(kvs_layout_init(&l, 1, &s, 1, &dt), KVS_EINVAL,
              "layout: group 0 byte size overflows 2^63");
    /* numel fits but bytes do not: 2^62 float16 = 2^63 bytes. */
    const int64_t d2[] = {(int64_t)1 << 62};
    s = make_shape(1, d2);
    dt = KVS_DTYPE_FLOAT16;
    CHECK_ERR(kvs_layout_init(&l, 1, &s, 1, &dt), KVS_EINVAL,
              "layout: group 0 byte size overflows 2^63");
    /* Largest accepted: 2^62 - 1 float16 elements = 2^63 - 2 bytes. */
    const int64_t d3[] = {((int64_t)1 << 62) - 1};
    s = make_shape(1, d3);
    CHECK_OK(kvs_layout_init(&l, 1, &s, 1, &dt));
    CHECK_EQ_U64(kvs_layout_nbytes(&l), ((uint64_t)1 << 63) - 2);
}

static void test_init_total_overflow(void)
{
    /* Each group fits (2^62 bytes) but the total reaches 2^63. */
    const int64_t d[] = {(int64_t)1 << 62};
    kvs_shape shapes[2] = {make_shape(1, d), make_shape(1, d)};
    kvs_dtype dts[2] = {KVS_DTYPE_UINT8, KVS_DTYPE_UINT8};
    kvs_layout l;
    poison(&l);
    CHECK_ERR(kvs_layout_init(&l, 2, shapes, 2, dts), KVS_EINVAL,
              "layout: total byte size overflows 2^63");
    CHECK(is_poisoned(&l));
    /* One byte less in the second group fits exactly: 2^63 - 1. */
    shapes[1].dims[0] = ((int64_t)1 << 62) - 1;
    REQUIRE_OK(kvs_layout_init(&l, 2, shapes, 2, dts));
    CHECK_EQ_U64(kvs_layout_nbytes(&l), (uint64_t)INT64_MAX);
    CHECK_EQ_U64(kvs_layout_group_offset(&l, 1), (uint64_t)1 << 62);
}

static void test_init_null_arguments(void)
{
    const int64_t d[] = {4};
    kvs_shape s = make_shape(1, d);
    kvs_dtype dt = KVS_DTYPE_UINT8;
    kvs_layout l;
    poison(&l);
    CHECK_ERR(kvs_layout_init(NULL, 1, &s, 1, &dt), KVS_EINVAL, "layout: NULL output");
    CHECK_ERR(kvs_layout_init(&l, 1, NULL, 1, &dt), KVS_EINVAL,
              "layout: NULL shapes or dtypes");
    CHECK_ERR(kvs_layout_init(&l, 1, &s, 1, NULL), KVS_EINVAL,
              "layout: NULL shapes or dtypes");
    CHECK(is_poisoned(&l));
}

static void test_add_group_refusals(void)
{
    const int64_t d[] = {4, 8};
    kvs_layout l, saved;
    memset(&l, 0, sizeof l);
    REQUIRE_OK(kvs_layout_add_group(&l, 2, d, KVS_DTYPE_BFLOAT16));
    saved = l;

    const int64_t nine[KVS_MAX_DIMS + 1] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_ERR(kvs_layout_add_group(&l, KVS_MAX_DIMS + 1, nine, KVS_DTYPE_UINT8),
              KVS_EINVAL, "layout: group 1 has 9 dims, at most 8");
    const int64_t neg[] = {2, 3, -1};
    CHECK_ERR(kvs_layout_add_group(&l, 3, neg, KVS_DTYPE_UINT8), KVS_EINVAL,
              "layout: group 1 dim 2 is negative (-1)");
    CHECK_ERR(kvs_layout_add_group(&l, 2, d, (kvs_dtype)7), KVS_EINVAL,
              "layout: group 1 has invalid dtype 7");
    const int64_t big[] = {(int64_t)1 << 40, (int64_t)1 << 30};
    CHECK_ERR(kvs_layout_add_group(&l, 2, big, KVS_DTYPE_FLOAT32), KVS_EINVAL,
              "layout: group 1 byte size overflows 2^63");
    /* Fits alone (2^63 - 1 bytes) but not after the first group's 64. */
    const int64_t most[] = {INT64_MAX};
    CHECK_ERR(kvs_layout_add_group(&l, 1, most, KVS_DTYPE_UINT8), KVS_EINVAL,
              "layout: total byte size overflows 2^63");
    CHECK_ERR(kvs_layout_add_group(&l, 1, NULL, KVS_DTYPE_UINT8), KVS_EINVAL,
              "layout: NULL dims");
    CHECK_ERR(kvs_layout_add_group(NULL, 1, d, KVS_DTYPE_UINT8), KVS_EINVAL,
              "layout: NULL layout");
    /* The layout is untouched by every refusal (bytewise). */
    CHECK(memcmp(&l, &saved, sizeof l) == 0);
}

static void test_add_group_too_many(void)
{
    kvs_layout l;
    memset(&l, 0, sizeof l);
    const int64_t d[] = {1};
    for (int i = 0; i < KVS_MAX_GROUPS; i++)
        REQUIRE_OK(kvs_layout_add_group(&l, 1, d, KVS_DTYPE_UINT8));
    CHECK_EQ_INT(l.ngroups, KVS_MAX_GROUPS);
    kvs_layout saved = l;
    CHECK_ERR(kvs_layout_add_group(&l, 1, d, KVS_DTYPE_UINT8), KVS_EINVAL,
              "layout: already 16 groups, at most 16");
    CHECK(memcmp(&l, &saved, sizeof l) == 0);
}

static void test_validate_hand_built(void)
{
    kvs_layout l;
    memset(&l, 0, sizeof l);
    CHECK_OK(kvs_layout_validate(&l));

    l.ngroups = KVS_MAX_GROUPS + 1;
    CHECK_ERR(kvs_layout_validate(&l), KVS_EINVAL, "layout: 17 groups, at most 16");
    l.ngroups = UINT32_MAX;
    CHECK_ERR(kvs_layout_validate(&l), KVS_EINVAL,
              "layout: 4294967295 groups, at most 16");

    memset(&l, 0, sizeof l);
    l.ngroups = 2;
    l.groups[0].shape.ndim = 1;
    l.groups[0].shape.dims[0] = 10;
    l.groups[1].shape.ndim = KVS_MAX_DIMS + 1;
    CHECK_ERR(kvs_layout_validate(&l), KVS_EINVAL, "layout: group 1 has 9 dims, at most 8");
    l.groups[1].shape.ndim = UINT32_MAX;
    CHECK_ERR(kvs_layout_validate(&l), KVS_EINVAL,
              "layout: group 1 has 4294967295 dims, at most 8");
    l.groups[1].shape.ndim = 2;
    l.groups[1].shape.dims[0] = 3;
    l.groups[1].shape.dims[1] = -7;
    CHECK_ERR(kvs_layout_validate(&l), KVS_EINVAL, "layout: group 1 dim 1 is negative (-7)");
    l.groups[1].shape.dims[1] = 7;
    l.groups[1].dtype = (kvs_dtype)100;
    CHECK_ERR(kvs_layout_validate(&l), KVS_EINVAL, "layout: group 1 has invalid dtype 100");
    l.groups[1].dtype = KVS_DTYPE_FLOAT32;
    CHECK_OK(kvs_layout_validate(&l));
    CHECK_EQ_U64(kvs_layout_nbytes(&l), 10 + 84);
    /* Garbage in dims past ndim is ignored. */
    l.groups[1].shape.dims[5] = -1;
    CHECK_OK(kvs_layout_validate(&l));

    CHECK_ERR(kvs_layout_validate(NULL), KVS_EINVAL, "layout: NULL layout");
}

static void test_validate_does_not_clear(void)
{
    /* A successful validate leaves the thread's previous error alone. */
    kvs_set_error(KVS_EIO, "earlier");
    kvs_layout l;
    memset(&l, 0, sizeof l);
    CHECK_OK(kvs_layout_validate(&l));
    CHECK_EQ_STR(kvs_last_error(), "earlier");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_EIO);
}

int main(void)
{
    RUN(test_single_group_upstream);
    RUN(test_multi_group_upstream);
    RUN(test_three_groups_mixed);
    RUN(test_empty_layout);
    RUN(test_scalar_shape);
    RUN(test_zero_dim);
    RUN(test_zero_dim_after_huge_dims);
    RUN(test_max_groups_and_dims);
    RUN(test_add_group_builds_same_as_init);
    RUN(test_flat);
    RUN(test_flat_refusals);
    RUN(test_equal);
    RUN(test_format);
    RUN(test_format_truncation);
    RUN(test_init_count_mismatch);
    RUN(test_init_too_many_groups);
    RUN(test_init_too_many_dims);
    RUN(test_init_negative_dim);
    RUN(test_init_invalid_dtype);
    RUN(test_init_overflow);
    RUN(test_init_total_overflow);
    RUN(test_init_null_arguments);
    RUN(test_add_group_refusals);
    RUN(test_add_group_too_many);
    RUN(test_validate_hand_built);
    RUN(test_validate_does_not_clear);
    return TEST_SUMMARY();
}
