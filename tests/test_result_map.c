/* test_result_map.c - the id -> result map: pop-once, collisions and
 * backward-shift deletion, reservations, and that it shrinks as it drains. */
#include <stdlib.h>

#include "kvs_test.h"
#include "util/result_map.h"

static void *val(uint64_t k) { return (void *)(uintptr_t)(k * 2 + 1); }

static void test_put_pop_once(void)
{
    kvs_result_map m;
    kvs_result_map_init(&m);
    CHECK(kvs_result_map_pop(&m, 0) == NULL); /* empty, no table */
    CHECK_OK(kvs_result_map_put(&m, 0, val(0)));
    CHECK_OK(kvs_result_map_put(&m, 42, val(42)));
    CHECK_EQ_U64(kvs_result_map_count(&m), 2);
    CHECK(kvs_result_map_get(&m, 42) == val(42));
    CHECK(kvs_result_map_pop(&m, 42) == val(42));
    CHECK(kvs_result_map_pop(&m, 42) == NULL);
    CHECK(kvs_result_map_pop(&m, 7) == NULL);
    CHECK(kvs_result_map_pop(&m, 0) == val(0));
    CHECK_EQ_U64(kvs_result_map_count(&m), 0);
    kvs_result_map_destroy(&m, NULL);
}

static void test_refusals(void)
{
    kvs_result_map m;
    kvs_result_map_init(&m);
    CHECK_ERR(kvs_result_map_put(&m, 5, NULL), KVS_EINVAL, "result map: NULL value for key 5");
    CHECK_OK(kvs_result_map_put(&m, 5, val(5)));
    CHECK_ERR(kvs_result_map_put(&m, 5, val(6)), KVS_EEXIST,
              "result map: key 5 already present");
    CHECK_ERR(kvs_result_map_put_reserved(&m, 6, val(6)), KVS_EINVAL,
              "result map: put_reserved without a reservation");
    CHECK_OK(kvs_result_map_reserve(&m));
    CHECK_ERR(kvs_result_map_put_reserved(&m, 5, val(5)), KVS_EEXIST,
              "result map: key 5 already present");
    CHECK_EQ_U64(m.reserved, 1); /* a refused put keeps the reservation */
    kvs_result_map_unreserve(&m);
    CHECK_EQ_U64(m.reserved, 0);
    kvs_result_map_unreserve(&m); /* nothing to give back: no-op */
    CHECK_EQ_U64(m.reserved, 0);
    kvs_result_map_destroy(&m, NULL);
}

/* Reservations: after reserving n, n put_reserved never reallocate. */
static void test_reserved_puts_never_allocate(void)
{
    kvs_result_map m;
    kvs_result_map_init(&m);
    enum { N = 1000 };
    for (int i = 0; i < N; i++)
        REQUIRE_OK(kvs_result_map_reserve(&m));
    uint64_t *keys = m.keys;
    size_t cap = m.capacity;
    CHECK(cap >= 2 * N);
    for (uint64_t i = 0; i < N; i++)
        CHECK_OK(kvs_result_map_put_reserved(&m, i, val(i)));
    CHECK(m.keys == keys);
    CHECK_EQ_U64(m.capacity, cap);
    CHECK_EQ_U64(m.reserved, 0);
    for (uint64_t i = 0; i < N; i++)
        CHECK(kvs_result_map_get(&m, i) == val(i));
    kvs_result_map_destroy(&m, NULL);
}

/* Many keys, deleted in a scrambled order: every remaining key stays
 * findable after each backward shift (checked against a reference). */
static void test_random_workload_matches_reference(void)
{
    kvs_result_map m;
    kvs_result_map_init(&m);
    enum { K = 4096 };
    static uint8_t present[K];
    uint64_t x = 88172645463325252ULL;
    for (int step = 0; step < 200000; step++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        /* keys spread so some collide in any table size */
        uint64_t k = (x % K) * 1024;
        int idx = (int)(k / 1024);
        if ((x >> 20) & 1) {
            int rc = kvs_result_map_put(&m, k, val(k));
            CHECK_EQ_INT(rc, present[idx] ? KVS_EEXIST : KVS_OK);
            present[idx] = 1;
        } else {
            void *v = kvs_result_map_pop(&m, k);
            CHECK(v == (present[idx] ? val(k) : NULL));
            present[idx] = 0;
        }
    }
    size_t n = 0;
    for (int i = 0; i < K; i++) {
        n += present[i];
        CHECK(kvs_result_map_get(&m, (uint64_t)i * 1024) == (present[i] ? val((uint64_t)i * 1024) : NULL));
    }
    CHECK_EQ_U64(kvs_result_map_count(&m), n);
    kvs_result_map_destroy(&m, NULL);
}

/* Memory follows unread results: a burst of 100k grows the table, popping
 * them all gives the memory back down to the minimum table. */
static void test_shrinks_when_drained(void)
{
    kvs_result_map m;
    kvs_result_map_init(&m);
    enum { N = 100000 };
    for (uint64_t i = 0; i < N; i++)
        REQUIRE_OK(kvs_result_map_put(&m, i, val(i)));
    CHECK(m.capacity >= 2 * N);
    for (uint64_t i = 0; i < N - 10; i++)
        CHECK(kvs_result_map_pop(&m, i) == val(i));
    CHECK(m.capacity <= 64);
    for (uint64_t i = N - 10; i < N; i++)
        CHECK(kvs_result_map_pop(&m, i) == val(i));
    CHECK_EQ_U64(m.capacity, 16); /* back to the minimum table */
    /* A steady put/pop stream over ever-growing ids keeps it small. */
    for (uint64_t i = 0; i < 1000000; i++) {
        REQUIRE_OK(kvs_result_map_put(&m, N + i, val(i)));
        if (i >= 8)
            CHECK(kvs_result_map_pop(&m, N + i - 8) == val(i - 8));
    }
    CHECK(m.capacity <= 32);
    kvs_result_map_destroy(&m, NULL);
}

static int freed;
static void count_free(void *v) { freed++; free(v); }

static void test_destroy_frees_values(void)
{
    kvs_result_map m;
    kvs_result_map_init(&m);
    for (uint64_t i = 0; i < 10; i++)
        REQUIRE_OK(kvs_result_map_put(&m, i, malloc(16)));
    free(kvs_result_map_pop(&m, 3));
    kvs_result_map_destroy(&m, count_free);
    CHECK_EQ_INT(freed, 9);
    CHECK_EQ_U64(kvs_result_map_count(&m), 0);
    /* reusable */
    CHECK_OK(kvs_result_map_put(&m, 1, val(1)));
    kvs_result_map_destroy(&m, NULL);
}

int main(void)
{
    RUN(test_put_pop_once);
    RUN(test_refusals);
    RUN(test_reserved_puts_never_allocate);
    RUN(test_random_workload_matches_reference);
    RUN(test_shrinks_when_drained);
    RUN(test_destroy_frees_values);
    return TEST_SUMMARY();
}
