/* test_lock_table.c - the per-key lock counts shared by the fs and Redis L2
 * adapters (src/l2/lock_table.h), directly: counts, release to zero,
 * release of what was never locked, distinct names, growth of the bucket
 * array with every count kept, and destroy. Exact values throughout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_test.h"
#include "l2/lock_table.h"

/* The n-th test name: shaped like an fs key path. */
static void name_of(size_t n, char *buf, size_t size)
{
    snprintf(buf, size, "test_model+/%zx,0,0", n);
}

/* One lock on each of the test names [from, to); the number of adds that
 * failed. */
static int lock_names(kvs_l2_lock_table *lt, size_t from, size_t to)
{
    char name[64];
    int failed = 0;
    for (size_t n = from; n < to; n++) {
        name_of(n, name, sizeof name);
        failed += kvs_l2_lock_table_add(lt, name) != 0;
    }
    return failed;
}

static void test_empty_table(void)
{
    kvs_l2_lock_table lt;
    REQUIRE(kvs_l2_lock_table_init(&lt) == 0);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 0);
    CHECK_EQ_U64(lt.nbuckets, 64);
    CHECK_EQ_U64(KVS_L2_LOCK_TABLE_INITIAL_BUCKETS, 64);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/a,0,0"), 0);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, ""), 0);
    kvs_l2_lock_table_destroy(&lt);
    CHECK(lt.buckets == NULL);
    CHECK_EQ_U64(lt.nbuckets, 0);
    CHECK_EQ_U64(lt.nlocked, 0);
}

/* add increments, release decrements, and a key at zero leaves the table. */
static void test_add_and_release_count(void)
{
    kvs_l2_lock_table lt;
    REQUIRE(kvs_l2_lock_table_init(&lt) == 0);
    CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, "m+/aa,0,0"), 0);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/aa,0,0"), 1);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 1);
    CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, "m+/aa,0,0"), 0);
    CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, "m+/aa,0,0"), 0);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/aa,0,0"), 3);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 1); /* keys, not locks */
    CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, "m+/bb,0,0"), 0);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/bb,0,0"), 1);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 2);

    kvs_l2_lock_table_release(&lt, "m+/aa,0,0");
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/aa,0,0"), 2);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 2);
    kvs_l2_lock_table_release(&lt, "m+/aa,0,0");
    kvs_l2_lock_table_release(&lt, "m+/aa,0,0");
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/aa,0,0"), 0);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 1);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/bb,0,0"), 1);

    /* Locked again after reaching zero: a fresh count of 1. */
    CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, "m+/aa,0,0"), 0);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/aa,0,0"), 1);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 2);
    kvs_l2_lock_table_destroy(&lt);
}

/* Unlock of a key that holds no lock is ignored (the L2 contract), also
 * once its count has come back to zero: it never goes below zero. */
static void test_release_unlocked_is_ignored(void)
{
    kvs_l2_lock_table lt;
    REQUIRE(kvs_l2_lock_table_init(&lt) == 0);
    kvs_l2_lock_table_release(&lt, "m+/never,0,0");
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 0);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/never,0,0"), 0);

    CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, "m+/once,0,0"), 0);
    kvs_l2_lock_table_release(&lt, "m+/once,0,0");
    kvs_l2_lock_table_release(&lt, "m+/once,0,0"); /* a second unlock */
    kvs_l2_lock_table_release(&lt, "m+/never,0,0");
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/once,0,0"), 0);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 0);
    /* ...and a later lock counts from 1, not from -1. */
    CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, "m+/once,0,0"), 0);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/once,0,0"), 1);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 1);
    kvs_l2_lock_table_destroy(&lt);
}

/* Names are compared whole: prefixes, extensions and the empty name are
 * other keys. */
static void test_names_are_distinct(void)
{
    static const char *const names[] = {"", "m", "m+", "m+/a", "m+/a,0,0", "m+/a,0,00",
                                        "M+/a,0,0"};
    const size_t nn = sizeof names / sizeof names[0];
    kvs_l2_lock_table lt;
    REQUIRE(kvs_l2_lock_table_init(&lt) == 0);
    for (size_t i = 0; i < nn; i++)
        for (size_t k = 0; k <= i; k++) CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, names[i]), 0);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), nn);
    for (size_t i = 0; i < nn; i++) CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, names[i]), i + 1);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/a,0"), 0);
    kvs_l2_lock_table_destroy(&lt);
}

/* The table keeps its own copy of a name: the caller's buffer is reused
 * for the next key (the adapters encode every key into one buffer). */
static void test_name_is_copied(void)
{
    kvs_l2_lock_table lt;
    REQUIRE(kvs_l2_lock_table_init(&lt) == 0);
    char buf[64];
    snprintf(buf, sizeof buf, "%s", "m+/first,0,0");
    CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, buf), 0);
    snprintf(buf, sizeof buf, "%s", "m+/other,0,0");
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, "m+/first,0,0"), 1);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, buf), 0);
    kvs_l2_lock_table_destroy(&lt);
}

/* The bucket array doubles when the table holds as many keys as buckets
 * (64 -> 128 at the 64th key, -> 256 at the 128th, ...), keeps every count
 * across the moves, and does not shrink when keys leave. */
static void test_growth_keeps_counts(void)
{
    kvs_l2_lock_table lt;
    REQUIRE(kvs_l2_lock_table_init(&lt) == 0);
    CHECK_EQ_INT(lock_names(&lt, 0, 63), 0);
    CHECK_EQ_U64(lt.nbuckets, 64);
    CHECK_EQ_INT(lock_names(&lt, 63, 64), 0);
    CHECK_EQ_U64(lt.nbuckets, 128);
    char name[64];
    name_of(63, name, sizeof name);
    CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, name), 0); /* a second lock: no new key */
    CHECK_EQ_U64(lt.nbuckets, 128);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 64);
    kvs_l2_lock_table_release(&lt, name);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, name), 1);

    /* 3000 keys in all, key n locked (n % 3) + 1 times. */
    const size_t total = 3000;
    CHECK_EQ_INT(lock_names(&lt, 64, 128), 0);
    CHECK_EQ_U64(lt.nbuckets, 256);
    CHECK_EQ_INT(lock_names(&lt, 128, total), 0);
    for (size_t n = 0; n < total; n++) {
        name_of(n, name, sizeof name);
        for (size_t k = 0; k < n % 3; k++) CHECK_EQ_INT(kvs_l2_lock_table_add(&lt, name), 0);
    }
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), total);
    CHECK_EQ_U64(lt.nbuckets, 4096); /* doubled at the 2048th key */
    int wrong = 0;
    for (size_t n = 0; n < total; n++) {
        name_of(n, name, sizeof name);
        wrong += kvs_l2_lock_table_count(&lt, name) != n % 3 + 1;
    }
    CHECK_EQ_INT(wrong, 0);

    /* Release every lock: each key leaves at its last one. */
    for (size_t n = 0; n < total; n++) {
        name_of(n, name, sizeof name);
        for (size_t k = 0; k < n % 3 + 1; k++) kvs_l2_lock_table_release(&lt, name);
        if (n == total / 2) CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), total - total / 2 - 1);
    }
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 0);
    CHECK_EQ_U64(lt.nbuckets, 4096);
    name_of(7, name, sizeof name);
    CHECK_EQ_U64(kvs_l2_lock_table_count(&lt, name), 0);
    kvs_l2_lock_table_destroy(&lt);
}

/* destroy frees locked entries (ASan's leak check sees it) and is safe on
 * a zeroed table and a second time. */
static void test_destroy(void)
{
    kvs_l2_lock_table zero;
    memset(&zero, 0, sizeof zero);
    kvs_l2_lock_table_destroy(&zero);
    CHECK(zero.buckets == NULL);

    kvs_l2_lock_table lt;
    REQUIRE(kvs_l2_lock_table_init(&lt) == 0);
    CHECK_EQ_INT(lock_names(&lt, 0, 100), 0);
    kvs_l2_lock_table_destroy(&lt);
    CHECK(lt.buckets == NULL);
    CHECK_EQ_U64(kvs_l2_lock_table_nlocked(&lt), 0);
    kvs_l2_lock_table_destroy(&lt);
}

int main(void)
{
    RUN(test_empty_table);
    RUN(test_add_and_release_count);
    RUN(test_release_unlocked_is_ignored);
    RUN(test_names_are_distinct);
    RUN(test_name_is_copied);
    RUN(test_growth_keeps_counts);
    RUN(test_destroy);
    return TEST_SUMMARY();
}
