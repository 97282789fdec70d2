/* test_memobj.c - memory objects (upstream MemoryObj). */
#include <stdint.h>
#include <string.h>

#include "kvs_test.h"
#include "kvserde/memobj.h"

/* [4, 8] bfloat16 + [16] float16: 64 + 32 = 96 bytes. */
static void two_group_layout(kvs_layout *l)
{
    const int64_t d0[] = {4, 8}, d1[] = {16};
    memset(l, 0, sizeof *l);
    kvs_layout_add_group(l, 2, d0, KVS_DTYPE_BFLOAT16);
    kvs_layout_add_group(l, 1, d1, KVS_DTYPE_FLOAT16);
}

static void poison(kvs_memobj *o)
{
    memset(o, 0xA5, sizeof *o);
}

static int is_poisoned(const kvs_memobj *o)
{
    const unsigned char *p = (const unsigned char *)o;
    for (size_t i = 0; i < sizeof *o; i++)
        if (p[i] != 0xA5) return 0;
    return 1;
}

static void test_format_values(void)
{
    CHECK_EQ_INT(KVS_FMT_UNDEFINED, 0);
    CHECK_EQ_INT(KVS_FMT_KV_2LTD, 1);
    CHECK_EQ_INT(KVS_FMT_KV_T2D, 2);
    CHECK_EQ_INT(KVS_FMT_KV_2TD, 3);
    CHECK_EQ_INT(KVS_FMT_BINARY, 4);
    CHECK_EQ_INT(KVS_FMT_BINARY_BUFFER, 5);
    CHECK_EQ_INT(KVS_FMT_KV_MLA_FMT, 6);
    CHECK_EQ_INT(KVS_FMT_EC_TD, 7);
    CHECK_EQ_INT(KVS_FMT_HS_TD, 8);
}

static void test_init_basic(void)
{
    kvs_layout l;
    two_group_layout(&l);
    REQUIRE(kvs_layout_nbytes(&l) == 96);
    unsigned char buf[128];
    kvs_memobj o;
    poison(&o);
    REQUIRE_OK(kvs_memobj_init(&o, buf, sizeof buf, &l, KVS_FMT_KV_2LTD));
    CHECK(o.data == buf);
    CHECK_EQ_U64(o.capacity, 128);
    CHECK_EQ_U64(o.used_size, 96); /* the layout's bytes, not the capacity */
    CHECK_EQ_U64(kvs_memobj_size(&o), 96);
    CHECK_EQ_INT(o.format, KVS_FMT_KV_2LTD);
    CHECK_EQ_INT(o.owns_data, 0);
    CHECK_EQ_INT(kvs_layout_equal(&o.layout, &l), 1);
}

static void test_init_every_format(void)
{
    kvs_layout l;
    kvs_layout_flat(&l, 4, KVS_DTYPE_UINT8);
    unsigned char buf[4];
    for (int f = 0; f <= 8; f++) {
        kvs_memobj o;
        CHECK_OK(kvs_memobj_init(&o, buf, sizeof buf, &l, (kvs_memory_format)f));
        CHECK_EQ_INT(o.format, f);
    }
}

static void test_init_exact_capacity(void)
{
    kvs_layout l;
    two_group_layout(&l);
    unsigned char buf[96];
    kvs_memobj o;
    REQUIRE_OK(kvs_memobj_init(&o, buf, 96, &l, KVS_FMT_UNDEFINED));
    CHECK_EQ_U64(o.capacity, 96);
    CHECK_EQ_U64(kvs_memobj_size(&o), 96);
}

static void test_init_empty(void)
{
    kvs_layout l;
    REQUIRE_OK(kvs_layout_init(&l, 0, NULL, 0, NULL));
    kvs_memobj o;
    poison(&o);
    /* NULL data is fine with capacity 0. */
    REQUIRE_OK(kvs_memobj_init(&o, NULL, 0, &l, KVS_FMT_BINARY_BUFFER));
    CHECK(o.data == NULL);
    CHECK_EQ_U64(o.capacity, 0);
    CHECK_EQ_U64(kvs_memobj_size(&o), 0);
    CHECK_EQ_INT(o.layout.ngroups, 0);
}

static void test_init_too_small(void)
{
    kvs_layout l;
    two_group_layout(&l);
    unsigned char buf[96];
    kvs_memobj o;
    poison(&o);
    CHECK_ERR(kvs_memobj_init(&o, buf, 95, &l, KVS_FMT_KV_2LTD), KVS_ENOSPC,
              "memobj: capacity 95 bytes is smaller than the layout's 96 bytes");
    CHECK_ERR(kvs_memobj_init(&o, NULL, 0, &l, KVS_FMT_KV_2LTD), KVS_ENOSPC,
              "memobj: capacity 0 bytes is smaller than the layout's 96 bytes");
    CHECK(is_poisoned(&o));
}

static void test_init_refusals(void)
{
    kvs_layout l;
    two_group_layout(&l);
    unsigned char buf[96];
    kvs_memobj o;
    poison(&o);
    CHECK_ERR(kvs_memobj_init(&o, NULL, 96, &l, KVS_FMT_KV_2LTD), KVS_EINVAL,
              "memobj: NULL data with capacity 96");
    CHECK_ERR(kvs_memobj_init(&o, buf, 96, &l, (kvs_memory_format)9), KVS_EINVAL,
              "memobj: unknown memory format 9");
    CHECK_ERR(kvs_memobj_init(&o, buf, 96, &l, (kvs_memory_format)-1), KVS_EINVAL,
              "memobj: unknown memory format -1");
    CHECK_ERR(kvs_memobj_init(NULL, buf, 96, &l, KVS_FMT_KV_2LTD), KVS_EINVAL,
              "memobj: NULL argument");
    CHECK_ERR(kvs_memobj_init(&o, buf, 96, NULL, KVS_FMT_KV_2LTD), KVS_EINVAL,
              "memobj: NULL argument");
    /* An invalid layout is refused with the layout's reason. */
    kvs_layout bad = l;
    bad.groups[1].shape.dims[0] = -4;
    CHECK_ERR(kvs_memobj_init(&o, buf, 96, &bad, KVS_FMT_KV_2LTD), KVS_EINVAL,
              "layout: group 1 dim 0 is negative (-4)");
    bad = l;
    bad.ngroups = KVS_MAX_GROUPS + 1;
    CHECK_ERR(kvs_memobj_init(&o, buf, 96, &bad, KVS_FMT_KV_2LTD), KVS_EINVAL,
              "layout: 17 groups, at most 16");
    CHECK(is_poisoned(&o));
}

static void test_set_used_size(void)
{
    kvs_layout l;
    kvs_layout_flat(&l, 1024, KVS_DTYPE_FLOAT32); /* 4096 bytes */
    static unsigned char buf[4096];
    kvs_memobj o;
    REQUIRE_OK(kvs_memobj_init(&o, buf, sizeof buf, &l, KVS_FMT_BINARY));
    CHECK_EQ_U64(kvs_memobj_size(&o), 4096);

    CHECK_OK(kvs_memobj_set_used_size(&o, 100));
    CHECK_EQ_U64(kvs_memobj_size(&o), 100);
    CHECK_EQ_U64(o.used_size, 100);
    CHECK_OK(kvs_memobj_set_used_size(&o, 0));
    CHECK_EQ_U64(kvs_memobj_size(&o), 0);
    /* Widen back up to the capacity. */
    CHECK_OK(kvs_memobj_set_used_size(&o, 4096));
    CHECK_EQ_U64(kvs_memobj_size(&o), 4096);

    CHECK_OK(kvs_memobj_set_used_size(&o, 1234));
    CHECK_ERR(kvs_memobj_set_used_size(&o, 5000), KVS_EINVAL,
              "memobj: set_used_size: n=5000 out of range [0, 4096]");
    CHECK_EQ_U64(kvs_memobj_size(&o), 1234);
    CHECK_ERR(kvs_memobj_set_used_size(&o, 4097), KVS_EINVAL,
              "memobj: set_used_size: n=4097 out of range [0, 4096]");
    CHECK_ERR(kvs_memobj_set_used_size(&o, SIZE_MAX), KVS_EINVAL,
              "memobj: set_used_size: n=18446744073709551615 out of range [0, 4096]");
    CHECK_EQ_U64(kvs_memobj_size(&o), 1234);
    /* Nothing else moved either. */
    CHECK(o.data == buf);
    CHECK_EQ_U64(o.capacity, 4096);

    CHECK_ERR(kvs_memobj_set_used_size(NULL, 0), KVS_EINVAL, "memobj: NULL object");
}

static void test_set_used_size_bound_is_capacity(void)
{
    /* The range is [0, capacity], not [0, layout bytes]. */
    kvs_layout l;
    kvs_layout_flat(&l, 10, KVS_DTYPE_UINT8);
    unsigned char buf[64];
    kvs_memobj o;
    REQUIRE_OK(kvs_memobj_init(&o, buf, sizeof buf, &l, KVS_FMT_BINARY_BUFFER));
    CHECK_EQ_U64(kvs_memobj_size(&o), 10);
    CHECK_OK(kvs_memobj_set_used_size(&o, 64));
    CHECK_EQ_U64(kvs_memobj_size(&o), 64);
    CHECK_ERR(kvs_memobj_set_used_size(&o, 65), KVS_EINVAL,
              "memobj: set_used_size: n=65 out of range [0, 64]");
    CHECK_EQ_U64(kvs_memobj_size(&o), 64);
}

static void test_group_data(void)
{
    kvs_layout l;
    two_group_layout(&l);
    unsigned char buf[100];
    kvs_memobj o;
    REQUIRE_OK(kvs_memobj_init(&o, buf, sizeof buf, &l, KVS_FMT_KV_2LTD));
    CHECK(kvs_memobj_group_data(&o, 0) == (void *)buf);
    CHECK(kvs_memobj_group_data(&o, 1) == (void *)(buf + 64));
    CHECK_EQ_U64(kvs_memobj_group_nbytes(&o, 0), 64);
    CHECK_EQ_U64(kvs_memobj_group_nbytes(&o, 1), 32);
    /* Narrowing the used size does not move groups. */
    CHECK_OK(kvs_memobj_set_used_size(&o, 10));
    CHECK(kvs_memobj_group_data(&o, 1) == (void *)(buf + 64));
    CHECK_EQ_U64(kvs_memobj_group_nbytes(&o, 1), 32);

    /* Three groups of odd sizes: float32[3], fp8[5], float16[2,3]. */
    const int64_t a[] = {3}, b[] = {5}, c[] = {2, 3};
    kvs_layout m;
    memset(&m, 0, sizeof m);
    REQUIRE_OK(kvs_layout_add_group(&m, 1, a, KVS_DTYPE_FLOAT32));
    REQUIRE_OK(kvs_layout_add_group(&m, 1, b, KVS_DTYPE_FLOAT8_E4M3FN));
    REQUIRE_OK(kvs_layout_add_group(&m, 2, c, KVS_DTYPE_FLOAT16));
    REQUIRE_OK(kvs_memobj_init(&o, buf, 29, &m, KVS_FMT_UNDEFINED));
    CHECK(kvs_memobj_group_data(&o, 1) == (void *)(buf + 12));
    CHECK(kvs_memobj_group_data(&o, 2) == (void *)(buf + 17));
    CHECK_EQ_U64(kvs_memobj_group_nbytes(&o, 0), 12);
    CHECK_EQ_U64(kvs_memobj_group_nbytes(&o, 1), 5);
    CHECK_EQ_U64(kvs_memobj_group_nbytes(&o, 2), 12);
}

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

static void test_alloc(void)
{
    kvs_layout l;
    two_group_layout(&l);
    kvs_memobj *o = NULL;
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_KV_T2D, &o));
    REQUIRE(o != NULL);
    CHECK(o->data != NULL);
    CHECK_EQ_U64((uintptr_t)o->data % 64, 0);
    CHECK_EQ_U64(o->capacity, 96);
    CHECK_EQ_U64(kvs_memobj_size(o), 96);
    CHECK_EQ_INT(o->owns_data, 1);
    CHECK_EQ_INT(o->format, KVS_FMT_KV_T2D);
    CHECK_EQ_INT(kvs_layout_equal(&o->layout, &l), 1);
    CHECK(all_zero(o->data, 96));
    CHECK((char *)kvs_memobj_group_data(o, 1) == (char *)o->data + 64);
    /* The whole buffer is writable (valgrind checks the bounds). */
    memset(o->data, 0x5A, o->capacity);
    kvs_memobj_free(o);
}

static void test_alloc_odd_sizes(void)
{
    /* Sizes that are not multiples of 64 (1, 63, 65, 1000) and one large. */
    const uint64_t counts[] = {1, 63, 65, 1000, 1 << 20};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        kvs_layout l;
        REQUIRE_OK(kvs_layout_flat(&l, counts[i], KVS_DTYPE_UINT8));
        kvs_memobj *o = NULL;
        REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_BINARY_BUFFER, &o));
        CHECK_EQ_U64((uintptr_t)o->data % 64, 0);
        CHECK_EQ_U64(o->capacity, counts[i]);
        CHECK_EQ_U64(kvs_memobj_size(o), counts[i]);
        CHECK(all_zero(o->data, counts[i]));
        kvs_memobj_free(o);
    }
}

static void test_alloc_zero_bytes(void)
{
    kvs_layout l;
    REQUIRE_OK(kvs_layout_init(&l, 0, NULL, 0, NULL));
    kvs_memobj *a = NULL, *b = NULL;
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &a));
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &b));
    CHECK(a->data != NULL);
    CHECK(a->data != b->data);
    CHECK_EQ_U64((uintptr_t)a->data % 64, 0);
    CHECK_EQ_U64(a->capacity, 0);
    CHECK_EQ_U64(kvs_memobj_size(a), 0);
    CHECK_EQ_INT(a->owns_data, 1);
    kvs_memobj_free(a);
    kvs_memobj_free(b);

    /* A zero dim gives 0 bytes too. */
    const int64_t d[] = {0, 128};
    memset(&l, 0, sizeof l);
    REQUIRE_OK(kvs_layout_add_group(&l, 2, d, KVS_DTYPE_BFLOAT16));
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_KV_2TD, &a));
    CHECK_EQ_U64(kvs_memobj_size(a), 0);
    kvs_memobj_free(a);
}

static void test_alloc_refusals(void)
{
    kvs_layout l;
    two_group_layout(&l);
    kvs_memobj *sentinel = (kvs_memobj *)(uintptr_t)0x1234;
    kvs_memobj *o = sentinel;
    CHECK_ERR(kvs_memobj_alloc(NULL, KVS_FMT_KV_2LTD, &o), KVS_EINVAL,
              "memobj: NULL argument");
    CHECK_ERR(kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, NULL), KVS_EINVAL,
              "memobj: NULL argument");
    kvs_layout bad = l;
    bad.groups[0].dtype = (kvs_dtype)6;
    CHECK_ERR(kvs_memobj_alloc(&bad, KVS_FMT_KV_2LTD, &o), KVS_EINVAL,
              "layout: group 0 has invalid dtype 6");
    CHECK_ERR(kvs_memobj_alloc(&l, (kvs_memory_format)9, &o), KVS_EINVAL,
              "memobj: unknown memory format 9");
    CHECK(o == sentinel);
}

/* ASan and TSan abort on an impossible allocation instead of returning NULL,
 * so the out-of-memory path is only exercised without them. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define KVS_TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define KVS_TEST_SANITIZED 1
#endif
#endif

static void test_alloc_out_of_memory(void)
{
#ifndef KVS_TEST_SANITIZED
    /* A valid layout of 2^50 bytes: more than any 47/48-bit address space. */
    kvs_layout huge;
    REQUIRE_OK(kvs_layout_flat(&huge, (uint64_t)1 << 50, KVS_DTYPE_UINT8));
    kvs_memobj *sentinel = (kvs_memobj *)(uintptr_t)0x1234;
    kvs_memobj *o = sentinel;
    CHECK_ERR(kvs_memobj_alloc(&huge, KVS_FMT_BINARY, &o), KVS_ENOMEM,
              "memobj: cannot allocate 1125899906842624 bytes");
    CHECK(o == sentinel);
    if (o != sentinel) kvs_memobj_free(o);
#endif
}

static void test_free_null(void)
{
    kvs_set_error(KVS_EIO, "kept");
    kvs_memobj_free(NULL);
    CHECK_EQ_STR(kvs_last_error(), "kept");
}

int main(void)
{
    RUN(test_format_values);
    RUN(test_init_basic);
    RUN(test_init_every_format);
    RUN(test_init_exact_capacity);
    RUN(test_init_empty);
    RUN(test_init_too_small);
    RUN(test_init_refusals);
    RUN(test_set_used_size);
    RUN(test_set_used_size_bound_is_capacity);
    RUN(test_group_data);
    RUN(test_alloc);
    RUN(test_alloc_odd_sizes);
    RUN(test_alloc_zero_bytes);
    RUN(test_alloc_refusals);
    RUN(test_alloc_out_of_memory);
    RUN(test_free_null);
    return TEST_SUMMARY();
}
