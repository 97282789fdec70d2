/* test_l2_memory.c - the L2 adapter contract (kvserde/l2.h) on the memory
 * adapter, the memory adapter's own choices (kvserde/l2_memory.h) and its
 * fault injection. Exact codes and messages throughout; fds are waited on
 * with poll(2), never slept on. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvs_test.h"
#include "kvs_test_list.h"
#include "kvs_test_objs.h"
#include "kvserde/l2.h"
#include "kvserde/l2_memory.h"
#include "kvserde/memobj.h"
#include "kvserde/processor.h"

/* ---------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------ */

#define WAIT_MS 10000

/* A valid key: chunk hash "chunk-<i>", model "test_model". */
static kvs_object_key key(int i)
{
    kvs_object_key k;
    char h[32];
    int n = snprintf(h, sizeof h, "chunk-%d", i);
    if (kvs_object_key_init(&k, h, (size_t)n, "test_model", 0, 0, NULL) != KVS_OK)
        abort();
    return k;
}

/* An object of n bytes: byte j is seed + j. */
static kvs_memobj *obj_new(size_t n, unsigned seed)
{
    kvs_layout l;
    kvs_memobj *o;
    if (kvs_layout_flat(&l, n, KVS_DTYPE_UINT8) != KVS_OK ||
        kvs_memobj_alloc(&l, KVS_FMT_BINARY_BUFFER, &o) != KVS_OK)
        abort();
    for (size_t j = 0; j < n; j++) ((uint8_t *)o->data)[j] = (uint8_t)(seed + j);
    return o;
}

static int obj_has(const kvs_memobj *o, size_t n, unsigned seed)
{
    for (size_t j = 0; j < n; j++)
        if (((const uint8_t *)o->data)[j] != (uint8_t)(seed + j)) return 0;
    return 1;
}

/* 1 if fd becomes readable within ms. */
static int wait_fd(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;
    do r = poll(&p, 1, ms);
    while (r < 0 && errno == EINTR);
    return r == 1 && (p.revents & POLLIN);
}

static uint64_t drain(int fd)
{
    uint64_t n = 0;
    if (kvs_event_fd_consume(fd, &n) != KVS_OK) return UINT64_MAX;
    return n;
}

/* Pop store results until `want` have come (or a wait times out). */
static size_t wait_stores(kvs_l2_adapter *a, kvs_l2_store_result *out, size_t want)
{
    size_t got = 0;
    int fd = kvs_l2_store_event_fd(a);
    while (got < want) {
        size_t c = 0;
        if (kvs_l2_pop_completed_stores(a, out + got, want - got, &c) != KVS_OK) break;
        got += c;
        if (got == want) break;
        if (!wait_fd(fd, WAIT_MS)) break;
        drain(fd);
    }
    return got;
}

/* One store task, waited for; returns the task's result. */
static kvs_l2_store_result store_sync(kvs_l2_adapter *a, const kvs_object_key *keys,
                                      kvs_memobj *const *objs, size_t n)
{
    kvs_l2_store_result r;
    memset(&r, 0, sizeof r);
    r.state = KVS_TASK_PENDING;
    kvs_l2_task_id id;
    if (kvs_l2_submit_store(a, keys, objs, n, &id) != KVS_OK) return r;
    if (wait_stores(a, &r, 1) != 1) r.state = KVS_TASK_PENDING;
    return r;
}

/* Query a lookup (load = 0) or load (load = 1) until it is done. */
static int wait_bitmap(kvs_l2_adapter *a, int load, kvs_l2_task_id id, kvs_l2_bitmap *bm,
                       int poll_ms)
{
    int fd = load ? kvs_l2_load_event_fd(a) : kvs_l2_lookup_event_fd(a);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int rc = load ? kvs_l2_query_load(a, id, bm) : kvs_l2_query_lookup_and_lock(a, id, bm);
        if (rc != KVS_OK || bm->state != KVS_TASK_PENDING) return rc;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if ((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000 > WAIT_MS)
            return KVS_EIO;
        if (wait_fd(fd, poll_ms)) drain(fd);
    }
}

static int lookup_sync(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                       kvs_l2_bitmap *bm)
{
    kvs_l2_task_id id;
    int rc = kvs_l2_submit_lookup_and_lock(a, keys, n, &id);
    return rc ? rc : wait_bitmap(a, 0, id, bm, WAIT_MS);
}

static int load_sync(kvs_l2_adapter *a, const kvs_object_key *keys,
                     kvs_memobj *const *objs, size_t n, kvs_l2_bitmap *bm)
{
    kvs_l2_task_id id;
    int rc = kvs_l2_submit_load(a, keys, objs, n, &id);
    return rc ? rc : wait_bitmap(a, 1, id, bm, WAIT_MS);
}

static kvs_l2_adapter *mem_new(uint64_t capacity, unsigned workers)
{
    kvs_memory_adapter_options o = {.capacity_bytes = capacity, .workers = workers};
    kvs_l2_adapter *a = NULL;
    if (kvs_memory_adapter_create(&o, &a) != KVS_OK) {
        fprintf(stderr, "create: %s\n", kvs_last_error());
        return NULL;
    }
    return a;
}

static int64_t size_of(kvs_l2_adapter *a, const kvs_object_key *k)
{
    int64_t s = -2;
    if (kvs_l2_object_sizes(a, k, 1, &s) != KVS_OK) return -3;
    return s;
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

/* ---------------------------------------------------------------------
 * Event fds and ids
 * ------------------------------------------------------------------ */

static void test_fds_distinct_nonblocking_cloexec(void)
{
    kvs_l2_adapter *a = mem_new(0, 1), *b = mem_new(0, 1);
    REQUIRE(a && b);
    int fds[6] = {kvs_l2_store_event_fd(a), kvs_l2_lookup_event_fd(a),
                  kvs_l2_load_event_fd(a),  kvs_l2_store_event_fd(b),
                  kvs_l2_lookup_event_fd(b), kvs_l2_load_event_fd(b)};
    for (int i = 0; i < 6; i++) {
        CHECK(fds[i] >= 0);
        CHECK(fcntl(fds[i], F_GETFL) & O_NONBLOCK);
        CHECK(fcntl(fds[i], F_GETFD) & FD_CLOEXEC);
        for (int j = 0; j < i; j++) CHECK(fds[i] != fds[j]);
        /* Nothing signalled yet. */
        CHECK(!wait_fd(fds[i], 0));
    }
    /* Stable: asking again gives the same fd. */
    CHECK_EQ_INT(kvs_l2_store_event_fd(a), fds[0]);
    kvs_l2_destroy(a);
    kvs_l2_destroy(b);
}

static void test_ids_from_zero_shared_across_directions(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k = key(0);
    kvs_memobj *o = obj_new(16, 1), *d = obj_new(16, 0);
    kvs_l2_task_id id = 99;
    CHECK_OK(kvs_l2_submit_store(a, &k, &o, 1, &id));
    CHECK_EQ_U64(id, 0);
    CHECK_OK(kvs_l2_submit_lookup_and_lock(a, &k, 1, &id));
    CHECK_EQ_U64(id, 1);
    CHECK_OK(kvs_l2_submit_load(a, &k, &d, 1, &id));
    CHECK_EQ_U64(id, 2);
    CHECK_OK(kvs_l2_submit_store(a, NULL, NULL, 0, &id));
    CHECK_EQ_U64(id, 3);
    CHECK_OK(kvs_l2_submit_lookup_and_lock(a, NULL, 0, &id));
    CHECK_EQ_U64(id, 4);
    /* A lookup id is not a load id: the load query for 1 is pending. */
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_close(a)); /* everything finishes */
    CHECK_OK(kvs_l2_query_load(a, 1, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_PENDING);
    CHECK_OK(kvs_l2_query_lookup_and_lock(a, 1, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    kvs_l2_bitmap_release(&bm);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
    kvs_memobj_free(d);
}

/* ---------------------------------------------------------------------
 * Store
 * ------------------------------------------------------------------ */

static void test_store_then_pop_once_bytes_written(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key keys[3] = {key(0), key(1), key(2)};
    kvs_memobj *objs[3] = {obj_new(100, 1), obj_new(256, 2), obj_new(7, 3)};
    /* The adapter stores the used size only. */
    CHECK_OK(kvs_memobj_set_used_size(objs[1], 40));
    kvs_l2_task_id id;
    REQUIRE_OK(kvs_l2_submit_store(a, keys, objs, 3, &id));
    CHECK_EQ_U64(id, 0);
    int fd = kvs_l2_store_event_fd(a);
    REQUIRE(wait_fd(fd, WAIT_MS));
    CHECK_EQ_U64(drain(fd), 1); /* exactly one signal per task */
    kvs_l2_store_result r[4];
    size_t n = 99;
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, 4, &n));
    REQUIRE(n == 1);
    CHECK_EQ_U64(r[0].id, 0);
    CHECK_EQ_INT(r[0].state, KVS_TASK_OK);
    CHECK_EQ_U64(r[0].bytes_written, 100 + 40 + 7);
    CHECK_EQ_INT(r[0].status, KVS_OK);
    CHECK_EQ_STR(r[0].message, "");
    /* Popped: gone. */
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, 4, &n));
    CHECK_EQ_INT(n, 0);
    /* cap 0 with a NULL array is fine. */
    CHECK_OK(kvs_l2_pop_completed_stores(a, NULL, 0, &n));
    CHECK_EQ_INT(n, 0);
    int64_t sizes[4];
    kvs_object_key k4[4] = {keys[0], keys[1], keys[2], key(3)};
    CHECK_OK(kvs_l2_object_sizes(a, k4, 4, sizes));
    CHECK_EQ_INT(sizes[0], 100);
    CHECK_EQ_INT(sizes[1], 40);
    CHECK_EQ_INT(sizes[2], 7);
    CHECK_EQ_INT(sizes[3], -1);
    /* No further signal arrives. */
    CHECK(!wait_fd(fd, 20));
    kvs_l2_destroy(a);
    for (int i = 0; i < 3; i++) kvs_memobj_free(objs[i]);
}

static void test_pop_oldest_first_and_cap(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[3] = {key(0), key(1), key(2)};
    kvs_memobj *o[3] = {obj_new(1, 0), obj_new(2, 0), obj_new(3, 0)};
    kvs_l2_task_id ids[3];
    for (int i = 0; i < 3; i++) REQUIRE_OK(kvs_l2_submit_store(a, &k[i], &o[i], 1, &ids[i]));
    /* Wait for all three signals (one worker: they finish in order). */
    int fd = kvs_l2_store_event_fd(a);
    uint64_t signals = 0;
    while (signals < 3 && wait_fd(fd, WAIT_MS)) signals += drain(fd);
    CHECK_EQ_U64(signals, 3);
    kvs_l2_store_result r[3];
    size_t n;
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, 2, &n));
    REQUIRE(n == 2);
    CHECK_EQ_U64(r[0].id, 0);
    CHECK_EQ_U64(r[0].bytes_written, 1);
    CHECK_EQ_U64(r[1].id, 1);
    CHECK_EQ_U64(r[1].bytes_written, 2);
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, 3, &n));
    REQUIRE(n == 1);
    CHECK_EQ_U64(r[0].id, 2);
    CHECK_EQ_U64(r[0].bytes_written, 3);
    kvs_l2_destroy(a);
    for (int i = 0; i < 3; i++) kvs_memobj_free(o[i]);
}

static void test_store_replaces_and_keeps_locks(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k = key(5);
    kvs_memobj *o1 = obj_new(64, 1), *o2 = obj_new(32, 9), *d = obj_new(64, 0);
    CHECK_EQ_INT(store_sync(a, &k, &o1, 1).state, KVS_TASK_OK);
    kvs_l2_bitmap bm;
    REQUIRE_OK(lookup_sync(a, &k, 1, &bm));
    CHECK_EQ_INT(bm.nhits, 1);
    kvs_l2_bitmap_release(&bm);
    kvs_l2_store_result r = store_sync(a, &k, &o2, 1);
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_U64(r.bytes_written, 32);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 32);
    /* Still locked after the replacement. */
    uint8_t del = 9;
    CHECK_OK(kvs_l2_delete(a, &k, 1, &del));
    CHECK_EQ_INT(del, 0);
    REQUIRE_OK(load_sync(a, &k, &d, 1, &bm));
    CHECK_EQ_INT(bm.nhits, 1);
    CHECK_EQ_INT(kvs_memobj_size(d), 32);
    CHECK(obj_has(d, 32, 9));
    kvs_l2_bitmap_release(&bm);
    CHECK_OK(kvs_l2_unlock(a, &k, 1));
    CHECK_OK(kvs_l2_delete(a, &k, 1, &del));
    CHECK_EQ_INT(del, 1);
    kvs_l2_destroy(a);
    kvs_memobj_free(o1);
    kvs_memobj_free(o2);
    kvs_memobj_free(d);
}

static void test_key_fields_are_distinct(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[6];
    REQUIRE_OK(kvs_object_key_init(&k[0], "ab", 2, "m", 0, 0, NULL));
    REQUIRE_OK(kvs_object_key_init(&k[1], "ab", 2, "m", 1, 0, NULL));     /* rank */
    REQUIRE_OK(kvs_object_key_init(&k[2], "ab", 2, "m", 0, 1, NULL));     /* group */
    REQUIRE_OK(kvs_object_key_init(&k[3], "ab", 2, "m", 0, 0, "salt"));   /* salt */
    REQUIRE_OK(kvs_object_key_init(&k[4], "ab", 2, "m2", 0, 0, NULL));    /* model */
    REQUIRE_OK(kvs_object_key_init(&k[5], "ab\0", 3, "m", 0, 0, NULL));   /* hash len */
    kvs_memobj *o[6];
    for (int i = 0; i < 6; i++) o[i] = obj_new((size_t)i + 1, 0);
    CHECK_EQ_INT(store_sync(a, k, o, 6).state, KVS_TASK_OK);
    int64_t s[6];
    CHECK_OK(kvs_l2_object_sizes(a, k, 6, s));
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(s[i], i + 1);
    json_t *st = NULL;
    CHECK_OK(kvs_l2_status(a, &st));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "keys")), 6);
    json_decref(st);
    kvs_l2_destroy(a);
    for (int i = 0; i < 6; i++) kvs_memobj_free(o[i]);
}

static void test_many_keys(void)
{
    enum { N = 2000 };
    kvs_l2_adapter *a = mem_new(0, 2);
    REQUIRE(a);
    static kvs_object_key k[N];
    static kvs_memobj *o[N];
    static int64_t s[N];
    static uint8_t del[N];
    kvs_memobj *one = obj_new(3, 0);
    for (int i = 0; i < N; i++) {
        k[i] = key(i);
        o[i] = one;
    }
    kvs_l2_store_result r = store_sync(a, k, o, N);
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_U64(r.bytes_written, 3 * N);
    CHECK_OK(kvs_l2_object_sizes(a, k, N, s));
    int all = 1;
    for (int i = 0; i < N; i++) all &= s[i] == 3;
    CHECK(all);
    kvs_l2_bitmap bm;
    REQUIRE_OK(lookup_sync(a, k, N, &bm));
    CHECK_EQ_INT(bm.nkeys, N);
    CHECK_EQ_INT(bm.nhits, N);
    kvs_l2_bitmap_release(&bm);
    CHECK_OK(kvs_l2_unlock(a, k, N));
    CHECK_OK(kvs_l2_delete(a, k, N, del));
    all = 1;
    for (int i = 0; i < N; i++) all &= del[i] == 1;
    CHECK(all);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 0);
    kvs_l2_destroy(a);
    kvs_memobj_free(one);
}

/* ---------------------------------------------------------------------
 * Lookup-and-lock, unlock, delete
 * ------------------------------------------------------------------ */

static void test_lookup_bitmap_and_pop_once(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[4] = {key(0), key(1), key(2), key(3)};
    kvs_memobj *o[2] = {obj_new(8, 0), obj_new(8, 1)};
    kvs_object_key stored[2] = {k[0], k[2]};
    CHECK_EQ_INT(store_sync(a, stored, o, 2).state, KVS_TASK_OK);

    kvs_l2_task_id id;
    REQUIRE_OK(kvs_l2_submit_lookup_and_lock(a, k, 4, &id));
    int fd = kvs_l2_lookup_event_fd(a);
    REQUIRE(wait_fd(fd, WAIT_MS));
    CHECK_EQ_U64(drain(fd), 1);
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_query_lookup_and_lock(a, id, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    REQUIRE(bm.nkeys == 4 && bm.hits != NULL);
    CHECK_EQ_INT(bm.hits[0], 1);
    CHECK_EQ_INT(bm.hits[1], 0);
    CHECK_EQ_INT(bm.hits[2], 1);
    CHECK_EQ_INT(bm.hits[3], 0);
    CHECK_EQ_INT(bm.nhits, 2);
    CHECK_EQ_INT(bm.status, KVS_OK); /* misses are not errors */
    CHECK_EQ_STR(bm.message, "");
    kvs_l2_bitmap_release(&bm);
    CHECK(bm.hits == NULL);
    CHECK_EQ_INT(bm.nkeys, 0);
    kvs_l2_bitmap_release(&bm); /* twice is fine */
    kvs_l2_bitmap_release(NULL);
    /* Once only. */
    CHECK_OK(kvs_l2_query_lookup_and_lock(a, id, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_PENDING);
    CHECK_EQ_INT(bm.nkeys, 0);
    CHECK(bm.hits == NULL);
    /* Never submitted: pending, not an error. */
    CHECK_OK(kvs_l2_query_lookup_and_lock(a, 12345, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_PENDING);
    CHECK_OK(kvs_l2_query_load(a, 12345, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_PENDING);
    json_t *st;
    CHECK_OK(kvs_l2_status(a, &st));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "locked_keys")), 2);
    json_decref(st);
    kvs_l2_destroy(a);
    kvs_memobj_free(o[0]);
    kvs_memobj_free(o[1]);
}

static void test_locks_prevent_delete_until_unlocked(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k = key(0), other = key(1), missing = key(7);
    kvs_memobj *o = obj_new(10, 0);
    kvs_object_key both[2] = {k, other};
    kvs_memobj *objs[2] = {o, o};
    CHECK_EQ_INT(store_sync(a, both, objs, 2).state, KVS_TASK_OK);
    kvs_l2_bitmap bm;
    for (int i = 0; i < 2; i++) { /* two locks */
        REQUIRE_OK(lookup_sync(a, &k, 1, &bm));
        CHECK_EQ_INT(bm.nhits, 1);
        kvs_l2_bitmap_release(&bm);
    }
    uint8_t del[3] = {9, 9, 9};
    kvs_object_key three[3] = {k, other, missing};
    CHECK_OK(kvs_l2_delete(a, three, 3, del));
    CHECK_EQ_INT(del[0], 0); /* locked */
    CHECK_EQ_INT(del[1], 1); /* not locked */
    CHECK_EQ_INT(del[2], 0); /* absent */
    CHECK_EQ_INT(size_of(a, &k), 10);
    CHECK_OK(kvs_l2_unlock(a, &k, 1));
    CHECK_OK(kvs_l2_delete(a, &k, 1, NULL)); /* deleted may be NULL */
    CHECK_EQ_INT(size_of(a, &k), 10);        /* one lock left */
    /* Unlocking absent keys is ignored. */
    CHECK_OK(kvs_l2_unlock(a, &missing, 1));
    CHECK_OK(kvs_l2_unlock(a, NULL, 0));
    CHECK_OK(kvs_l2_unlock(a, &k, 1));
    CHECK_OK(kvs_l2_delete(a, &k, 1, del));
    CHECK_EQ_INT(del[0], 1);
    CHECK_EQ_INT(size_of(a, &k), -1);
    /* Extra unlocks of a key with no locks do not go negative: a new lock
     * is one lock. */
    CHECK_EQ_INT(store_sync(a, &k, &o, 1).state, KVS_TASK_OK);
    CHECK_OK(kvs_l2_unlock(a, &k, 1));
    REQUIRE_OK(lookup_sync(a, &k, 1, &bm));
    kvs_l2_bitmap_release(&bm);
    CHECK_OK(kvs_l2_delete(a, &k, 1, del));
    CHECK_EQ_INT(del[0], 0);
    CHECK_OK(kvs_l2_unlock(a, &k, 1));
    CHECK_OK(kvs_l2_delete(a, &k, 1, del));
    CHECK_EQ_INT(del[0], 1);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 0);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
}

/* ---------------------------------------------------------------------
 * Load
 * ------------------------------------------------------------------ */

static void test_load_copies_and_sets_used_size(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[2] = {key(0), key(1)};
    kvs_memobj *o[2] = {obj_new(256, 3), obj_new(64, 50)};
    CHECK_OK(kvs_memobj_set_used_size(o[0], 100));
    CHECK_EQ_INT(store_sync(a, k, o, 2).state, KVS_TASK_OK);
    /* Change the source: the adapter holds its own copy. */
    memset(o[0]->data, 0xAA, 256);
    kvs_memobj *d[2] = {obj_new(256, 0), obj_new(64, 0)};
    memset(d[0]->data, 0, 256);
    memset(d[1]->data, 0, 64);
    kvs_l2_task_id id;
    REQUIRE_OK(kvs_l2_submit_load(a, k, d, 2, &id));
    int fd = kvs_l2_load_event_fd(a);
    REQUIRE(wait_fd(fd, WAIT_MS));
    CHECK_EQ_U64(drain(fd), 1);
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_query_load(a, id, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    REQUIRE(bm.nkeys == 2);
    CHECK_EQ_INT(bm.hits[0], 1);
    CHECK_EQ_INT(bm.hits[1], 1);
    CHECK_EQ_INT(bm.nhits, 2);
    CHECK_EQ_INT(bm.status, KVS_OK);
    CHECK_EQ_INT(kvs_memobj_size(d[0]), 100);
    CHECK(obj_has(d[0], 100, 3));
    CHECK(((uint8_t *)d[0]->data)[100] == 0); /* nothing past the stored bytes */
    CHECK_EQ_INT(kvs_memobj_size(d[1]), 64);
    CHECK(obj_has(d[1], 64, 50));
    kvs_l2_bitmap_release(&bm);
    CHECK_OK(kvs_l2_query_load(a, id, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_PENDING);
    /* A load does not lock. */
    uint8_t del[2];
    CHECK_OK(kvs_l2_delete(a, k, 2, del));
    CHECK_EQ_INT(del[0], 1);
    CHECK_EQ_INT(del[1], 1);
    kvs_l2_destroy(a);
    for (int i = 0; i < 2; i++) {
        kvs_memobj_free(o[i]);
        kvs_memobj_free(d[i]);
    }
}

static void test_load_too_large_fails_only_that_key(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[3] = {key(0), key(1), key(2)};
    kvs_memobj *o[3] = {obj_new(16, 1), obj_new(4096, 2), obj_new(24, 3)};
    CHECK_EQ_INT(store_sync(a, k, o, 3).state, KVS_TASK_OK);
    kvs_memobj *d[3] = {obj_new(1024, 0), obj_new(1024, 0), obj_new(1024, 0)};
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_sync(a, k, d, 3, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.hits[0], 1);
    CHECK_EQ_INT(bm.hits[1], 0);
    CHECK_EQ_INT(bm.hits[2], 1);
    CHECK_EQ_INT(bm.nhits, 2);
    CHECK_EQ_INT(bm.status, KVS_ENOSPC);
    CHECK_EQ_STR(bm.message,
                 "memory: load of key 1: stored object is 4096 bytes, destination holds 1024");
    CHECK(obj_has(d[0], 16, 1));
    CHECK_EQ_INT(kvs_memobj_size(d[0]), 16);
    CHECK(obj_has(d[2], 24, 3));
    CHECK_EQ_INT(kvs_memobj_size(d[2]), 24);
    kvs_l2_bitmap_release(&bm);
    kvs_l2_destroy(a);
    for (int i = 0; i < 3; i++) {
        kvs_memobj_free(o[i]);
        kvs_memobj_free(d[i]);
    }
}

/* Issue 17 item 3, the raw path (no serde): a KV-shaped destination takes
 * exactly its layout's bytes. A stored object of more tokens or fewer fails
 * only its key, KVS_ECORRUPT with both sizes, the destination untouched. */
static void test_load_wrong_layout_size_refused(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[3] = {key(0), key(1), key(2)};
    kvs_memobj *o[3] = {kvs_test_kv_obj(64, 16, 1), kvs_test_kv_obj(48, 16, 2),
                        kvs_test_kv_obj(64, 16, 3)};
    CHECK_EQ_INT(store_sync(a, k, o, 3).state, KVS_TASK_OK);
    /* 64 tokens into 48 (longer), 48 into 64 (shorter), 64 into 64 */
    kvs_memobj *d[3] = {kvs_test_kv_obj(48, 16, 0x5A), kvs_test_kv_obj(64, 16, 0x5A),
                        kvs_test_kv_obj(64, 16, 0x5A)};
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_sync(a, k, d, 3, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.hits[0], 0);
    CHECK_EQ_INT(bm.hits[1], 0);
    CHECK_EQ_INT(bm.hits[2], 1);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK_EQ_STR(bm.message, "memory: load of key 0: stored object is 16384 bytes, "
                             "destination layout needs 12288");
    kvs_l2_bitmap_release(&bm);
    CHECK(kvs_test_all_bytes(d[0], 0x5A) && kvs_test_all_bytes(d[1], 0x5A));
    CHECK_EQ_INT(kvs_memobj_size(d[0]), 12288);
    CHECK_EQ_INT(kvs_memobj_size(d[1]), 16384);
    CHECK(kvs_test_all_bytes(d[2], 3));
    /* the shorter one alone, with its own message */
    REQUIRE_OK(load_sync(a, &k[1], &d[1], 1, &bm));
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK_EQ_STR(bm.message, "memory: load of key 0: stored object is 12288 bytes, "
                             "destination layout needs 16384");
    kvs_l2_bitmap_release(&bm);
    CHECK(kvs_test_all_bytes(d[1], 0x5A));
    /* a byte buffer of the same capacity still takes the shorter object */
    kvs_layout bl;
    kvs_memobj *buf = NULL;
    REQUIRE_OK(kvs_layout_flat(&bl, 16384, KVS_DTYPE_UINT8));
    REQUIRE_OK(kvs_memobj_alloc(&bl, KVS_FMT_BINARY_BUFFER, &buf));
    REQUIRE_OK(load_sync(a, &k[1], &buf, 1, &bm));
    CHECK_EQ_INT(bm.nhits, 1);
    CHECK_EQ_INT(kvs_memobj_size(buf), 12288);
    kvs_l2_bitmap_release(&bm);
    kvs_memobj_free(buf);
    kvs_l2_destroy(a);
    for (int i = 0; i < 3; i++) {
        kvs_memobj_free(o[i]);
        kvs_memobj_free(d[i]);
    }
}

static void test_load_missing_keys(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[3] = {key(0), key(1), key(2)};
    kvs_memobj *o = obj_new(8, 4);
    CHECK_EQ_INT(store_sync(a, &k[1], &o, 1).state, KVS_TASK_OK);
    kvs_memobj *d[3] = {obj_new(8, 0), obj_new(8, 0), obj_new(8, 0)};
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_sync(a, k, d, 3, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.hits[0], 0);
    CHECK_EQ_INT(bm.hits[1], 1);
    CHECK_EQ_INT(bm.hits[2], 0);
    CHECK_EQ_INT(bm.nhits, 1);
    /* The first error is kept. */
    CHECK_EQ_INT(bm.status, KVS_ENOTFOUND);
    CHECK_EQ_STR(bm.message, "memory: load of key 0: not found");
    CHECK(obj_has(d[1], 8, 4));
    kvs_l2_bitmap_release(&bm);
    /* Empty adapter lookup: all misses, no error. */
    kvs_object_key none = key(99);
    REQUIRE_OK(lookup_sync(a, &none, 1, &bm));
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK_EQ_INT(bm.hits[0], 0);
    CHECK_EQ_INT(bm.status, KVS_OK);
    kvs_l2_bitmap_release(&bm);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
    for (int i = 0; i < 3; i++) kvs_memobj_free(d[i]);
}

static void test_zero_byte_object(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k = key(0);
    kvs_memobj *o = obj_new(32, 1), *d = obj_new(32, 7);
    CHECK_OK(kvs_memobj_set_used_size(o, 0)); /* an empty serializer's output */
    kvs_l2_store_result r = store_sync(a, &k, &o, 1);
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_U64(r.bytes_written, 0);
    CHECK_EQ_INT(size_of(a, &k), 0);
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_sync(a, &k, &d, 1, &bm));
    CHECK_EQ_INT(bm.nhits, 1);
    CHECK_EQ_INT(kvs_memobj_size(d), 0);
    kvs_l2_bitmap_release(&bm);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
    kvs_memobj_free(d);
}

/* ---------------------------------------------------------------------
 * Capacity and usage
 * ------------------------------------------------------------------ */

static void test_capacity_and_usage(void)
{
    kvs_l2_adapter *a = mem_new(1000, 1);
    REQUIRE(a);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 0);
    CHECK_EQ_U64(u.capacity, 1000);
    kvs_object_key k[4] = {key(0), key(1), key(2), key(3)};
    kvs_memobj *o600 = obj_new(600, 0), *o500 = obj_new(500, 0), *o900 = obj_new(900, 0),
               *o100 = obj_new(100, 0);
    CHECK_EQ_INT(store_sync(a, &k[0], &o600, 1).state, KVS_TASK_OK);
    kvs_l2_store_result r = store_sync(a, &k[1], &o500, 1);
    CHECK_EQ_INT(r.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(r.status, KVS_ENOSPC);
    CHECK_EQ_U64(r.bytes_written, 0);
    CHECK_EQ_STR(r.message, "memory: capacity exceeded storing key 0: 500 bytes would make "
                            "1100 bytes used, capacity 1000");
    CHECK_EQ_INT(size_of(a, &k[1]), -1);
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 600);
    /* Replacing counts the old size out: 600 -> 900 fits. */
    CHECK_EQ_INT(store_sync(a, &k[0], &o900, 1).state, KVS_TASK_OK);
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 900);
    /* A batch stops at the key that does not fit; the keys before it stay. */
    CHECK_EQ_INT(store_sync(a, &k[0], &o100, 1).state, KVS_TASK_OK); /* 100 used */
    kvs_object_key batch[3] = {k[1], k[2], k[3]};
    kvs_memobj *bo[3] = {o500, o500, o100};
    r = store_sync(a, batch, bo, 3);
    CHECK_EQ_INT(r.state, KVS_TASK_FAILED);
    CHECK_EQ_STR(r.message, "memory: capacity exceeded storing key 1: 500 bytes would make "
                            "1100 bytes used, capacity 1000");
    CHECK_EQ_INT(size_of(a, &k[1]), 500);
    CHECK_EQ_INT(size_of(a, &k[2]), -1);
    CHECK_EQ_INT(size_of(a, &k[3]), -1);
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 600);
    /* Exactly at capacity is fine. */
    kvs_memobj *o400 = obj_new(400, 0);
    CHECK_EQ_INT(store_sync(a, &k[2], &o400, 1).state, KVS_TASK_OK);
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 1000);
    /* Delete frees its bytes. */
    CHECK_OK(kvs_l2_delete(a, &k[1], 1, NULL));
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 500);
    json_t *st;
    CHECK_OK(kvs_l2_status(a, &st));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "bytes_used")), 500);
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "capacity_bytes")), 1000);
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "keys")), 2);
    json_decref(st);
    kvs_l2_destroy(a);
    kvs_memobj_free(o600);
    kvs_memobj_free(o500);
    kvs_memobj_free(o900);
    kvs_memobj_free(o100);
    kvs_memobj_free(o400);
}

static void test_status_json(void)
{
    kvs_l2_adapter *a = mem_new(0, 3);
    REQUIRE(a);
    kvs_object_key k = key(0);
    kvs_memobj *o = obj_new(12, 0);
    CHECK_EQ_INT(store_sync(a, &k, &o, 1).state, KVS_TASK_OK);
    json_t *st = NULL;
    REQUIRE_OK(kvs_l2_status(a, &st));
    char *text = json_dumps(st, JSON_SORT_KEYS | JSON_COMPACT);
    CHECK_EQ_STR(text, "{\"bytes_used\":12,\"capacity_bytes\":0,\"is_healthy\":true,"
                       "\"keys\":1,\"locked_keys\":0,\"type\":\"memory\",\"workers\":3}");
    free(text);
    json_decref(st);
    CHECK_OK(kvs_l2_close(a));
    REQUIRE_OK(kvs_l2_status(a, &st));
    CHECK(json_is_false(json_object_get(st, "is_healthy")));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "keys")), 1);
    json_decref(st);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
}

/* ---------------------------------------------------------------------
 * Empty batches
 * ------------------------------------------------------------------ */

static void test_empty_batches(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_l2_task_id id;
    /* Done and signalled before submit returns. */
    REQUIRE_OK(kvs_l2_submit_store(a, NULL, NULL, 0, &id));
    CHECK_EQ_U64(id, 0);
    CHECK(wait_fd(kvs_l2_store_event_fd(a), 0));
    CHECK_EQ_U64(drain(kvs_l2_store_event_fd(a)), 1);
    kvs_l2_store_result r;
    size_t n;
    CHECK_OK(kvs_l2_pop_completed_stores(a, &r, 1, &n));
    REQUIRE(n == 1);
    CHECK_EQ_U64(r.id, 0);
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_U64(r.bytes_written, 0);

    REQUIRE_OK(kvs_l2_submit_lookup_and_lock(a, NULL, 0, &id));
    CHECK_EQ_U64(id, 1);
    CHECK(wait_fd(kvs_l2_lookup_event_fd(a), 0));
    CHECK_EQ_U64(drain(kvs_l2_lookup_event_fd(a)), 1);
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_query_lookup_and_lock(a, id, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.nkeys, 0);
    CHECK_EQ_INT(bm.nhits, 0);
    kvs_l2_bitmap_release(&bm);

    kvs_object_key k = key(0);
    kvs_memobj *o = obj_new(1, 0);
    /* Non-NULL arrays with n == 0 are fine too. */
    REQUIRE_OK(kvs_l2_submit_load(a, &k, &o, 0, &id));
    CHECK_EQ_U64(id, 2);
    CHECK(wait_fd(kvs_l2_load_event_fd(a), 0));
    CHECK_EQ_U64(drain(kvs_l2_load_event_fd(a)), 1);
    CHECK_OK(kvs_l2_query_load(a, id, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.nkeys, 0);
    kvs_l2_bitmap_release(&bm);

    CHECK_OK(kvs_l2_object_sizes(a, NULL, 0, NULL));
    CHECK_OK(kvs_l2_delete(a, NULL, 0, NULL));
    CHECK_OK(kvs_l2_unlock(a, NULL, 0));
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
}

/* ---------------------------------------------------------------------
 * Refusals
 * ------------------------------------------------------------------ */

static void test_refusals_exact(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[3] = {key(0), key(1), key(2)};
    kvs_memobj *o = obj_new(4, 0);
    kvs_memobj *objs[3] = {o, o, o};
    kvs_l2_task_id id = 77;

    CHECK_ERR(kvs_l2_submit_store(NULL, k, objs, 3, &id), KVS_EINVAL, "l2: adapter is NULL");
    CHECK_ERR(kvs_l2_submit_store(a, k, objs, 3, NULL), KVS_EINVAL,
              "l2: task id pointer is NULL");
    CHECK_ERR(kvs_l2_submit_store(a, NULL, objs, 2, &id), KVS_EINVAL,
              "l2: key array is NULL with 2 keys");
    CHECK_ERR(kvs_l2_submit_store(a, k, NULL, 2, &id), KVS_EINVAL,
              "l2: object array is NULL with 2 objects");
    objs[1] = NULL;
    CHECK_ERR(kvs_l2_submit_store(a, k, objs, 3, &id), KVS_EINVAL, "l2: object 1 is NULL");
    CHECK_ERR(kvs_l2_submit_load(a, k, objs, 3, &id), KVS_EINVAL, "l2: object 1 is NULL");
    objs[1] = o;
    k[2].object_group_id = -1;
    CHECK_ERR(kvs_l2_submit_store(a, k, objs, 3, &id), KVS_EINVAL,
              "l2: key 2: key: object group id -1 is negative");
    CHECK_ERR(kvs_l2_submit_lookup_and_lock(a, k, 3, &id), KVS_EINVAL,
              "l2: key 2: key: object group id -1 is negative");
    CHECK_ERR(kvs_l2_submit_load(a, k, objs, 3, &id), KVS_EINVAL,
              "l2: key 2: key: object group id -1 is negative");
    CHECK_ERR(kvs_l2_unlock(a, k, 3), KVS_EINVAL,
              "l2: key 2: key: object group id -1 is negative");
    CHECK_ERR(kvs_l2_delete(a, k, 3, NULL), KVS_EINVAL,
              "l2: key 2: key: object group id -1 is negative");
    int64_t sizes[3];
    CHECK_ERR(kvs_l2_object_sizes(a, k, 3, sizes), KVS_EINVAL,
              "l2: key 2: key: object group id -1 is negative");
    k[2] = key(2);
    snprintf(k[0].model_name, sizeof k[0].model_name, "a@b");
    CHECK_ERR(kvs_l2_submit_lookup_and_lock(a, k, 3, &id), KVS_EINVAL,
              "l2: key 0: key: model name 'a@b' contains '@'");
    k[0] = key(0);
    CHECK_ERR(kvs_l2_submit_lookup_and_lock(a, NULL, 1, &id), KVS_EINVAL,
              "l2: key array is NULL with 1 keys");
    CHECK_ERR(kvs_l2_submit_lookup_and_lock(a, k, 1, NULL), KVS_EINVAL,
              "l2: task id pointer is NULL");
    CHECK_ERR(kvs_l2_submit_load(a, k, NULL, 1, &id), KVS_EINVAL,
              "l2: object array is NULL with 1 objects");
    CHECK_ERR(kvs_l2_unlock(a, NULL, 1), KVS_EINVAL, "l2: key array is NULL with 1 keys");
    CHECK_ERR(kvs_l2_delete(a, NULL, 4, NULL), KVS_EINVAL,
              "l2: key array is NULL with 4 keys");
    CHECK_ERR(kvs_l2_object_sizes(a, k, 2, NULL), KVS_EINVAL,
              "l2: sizes array is NULL with 2 keys");
    size_t n;
    kvs_l2_store_result r;
    CHECK_ERR(kvs_l2_pop_completed_stores(a, &r, 1, NULL), KVS_EINVAL,
              "l2: count pointer is NULL");
    CHECK_ERR(kvs_l2_pop_completed_stores(a, NULL, 2, &n), KVS_EINVAL,
              "l2: result array is NULL with room for 2");
    CHECK_ERR(kvs_l2_pop_completed_stores(NULL, &r, 1, &n), KVS_EINVAL,
              "l2: adapter is NULL");
    CHECK_ERR(kvs_l2_query_lookup_and_lock(a, 0, NULL), KVS_EINVAL,
              "l2: result pointer is NULL");
    CHECK_ERR(kvs_l2_query_load(a, 0, NULL), KVS_EINVAL, "l2: result pointer is NULL");
    kvs_l2_bitmap bm;
    CHECK_ERR(kvs_l2_query_load(NULL, 0, &bm), KVS_EINVAL, "l2: adapter is NULL");
    CHECK_ERR(kvs_l2_get_usage(a, NULL), KVS_EINVAL, "l2: usage pointer is NULL");
    CHECK_ERR(kvs_l2_status(a, NULL), KVS_EINVAL, "l2: status pointer is NULL");
    CHECK_ERR(kvs_l2_store_event_fd(NULL), KVS_EINVAL, "l2: adapter is NULL");
    CHECK_ERR(kvs_l2_lookup_event_fd(NULL), KVS_EINVAL, "l2: adapter is NULL");
    CHECK_ERR(kvs_l2_load_event_fd(NULL), KVS_EINVAL, "l2: adapter is NULL");
    CHECK_ERR(kvs_l2_close(NULL), KVS_EINVAL, "l2: adapter is NULL");
    kvs_l2_destroy(NULL);

    /* Refused submits used no id and queued nothing. */
    CHECK_EQ_U64(id, 77);
    REQUIRE_OK(kvs_l2_submit_store(a, k, objs, 3, &id));
    CHECK_EQ_U64(id, 0);
    CHECK_EQ_INT(wait_stores(a, &r, 1), 1);
    CHECK_EQ_U64(r.bytes_written, 12);
    CHECK_OK(kvs_l2_pop_completed_stores(a, &r, 1, &n));
    CHECK_EQ_INT(n, 0);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
}

static void test_create_refusals(void)
{
    kvs_l2_adapter *a = NULL;
    CHECK_ERR(kvs_memory_adapter_create(NULL, NULL), KVS_EINVAL,
              "memory: output pointer is NULL");
    kvs_memory_adapter_options o = {.workers = 2000};
    CHECK_ERR(kvs_memory_adapter_create(&o, &a), KVS_EINVAL,
              "memory: workers 2000 out of range [1, 1024]");
    CHECK(a == NULL);
    /* NULL options: unbounded, one worker. */
    REQUIRE_OK(kvs_memory_adapter_create(NULL, &a));
    json_t *st;
    CHECK_OK(kvs_l2_status(a, &st));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "workers")), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "capacity_bytes")), 0);
    json_decref(st);
    kvs_l2_destroy(a);
}

/* ---------------------------------------------------------------------
 * Close
 * ------------------------------------------------------------------ */

static void test_submit_after_close_and_close_twice(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k = key(0);
    kvs_memobj *o = obj_new(10, 1), *d = obj_new(10, 0);
    CHECK_EQ_INT(store_sync(a, &k, &o, 1).state, KVS_TASK_OK);
    kvs_l2_task_id id;
    REQUIRE_OK(kvs_l2_submit_store(a, &k, &o, 1, &id)); /* finished by close */
    CHECK_EQ_U64(id, 1);
    CHECK_OK(kvs_l2_close(a));
    CHECK_OK(kvs_l2_close(a)); /* no-op */
    id = 42;
    CHECK_ERR(kvs_l2_submit_store(a, &k, &o, 1, &id), KVS_ECLOSED,
              "memory: submit after close");
    CHECK_ERR(kvs_l2_submit_store(a, NULL, NULL, 0, &id), KVS_ECLOSED,
              "memory: submit after close");
    CHECK_ERR(kvs_l2_submit_lookup_and_lock(a, &k, 1, &id), KVS_ECLOSED,
              "memory: submit after close");
    CHECK_ERR(kvs_l2_submit_load(a, &k, &d, 1, &id), KVS_ECLOSED,
              "memory: submit after close");
    CHECK_EQ_U64(id, 42);
    CHECK_ERR(kvs_l2_store_event_fd(a), KVS_ECLOSED, "memory: adapter is closed");
    CHECK_ERR(kvs_l2_lookup_event_fd(a), KVS_ECLOSED, "memory: adapter is closed");
    CHECK_ERR(kvs_l2_load_event_fd(a), KVS_ECLOSED, "memory: adapter is closed");
    /* The task finished before close is still there to pop. */
    kvs_l2_store_result r;
    size_t n;
    CHECK_OK(kvs_l2_pop_completed_stores(a, &r, 1, &n));
    REQUIRE(n == 1);
    CHECK_EQ_U64(r.id, 1);
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    /* Synchronous calls keep working on what is stored. */
    CHECK_EQ_INT(size_of(a, &k), 10);
    CHECK_OK(kvs_l2_unlock(a, &k, 1));
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 10);
    uint8_t del;
    CHECK_OK(kvs_l2_delete(a, &k, 1, &del));
    CHECK_EQ_INT(del, 1);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
    kvs_memobj_free(d);
}

static void test_close_with_tasks_in_flight(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    /* Every store task sleeps 50 ms on the worker: several are queued or
     * running when close starts. */
    kvs_memory_fault slow = {.op = KVS_MEMORY_FAULT_STORE, .key = NULL, .latency_us = 50000};
    REQUIRE_OK(kvs_memory_adapter_inject(a, &slow));
    kvs_object_key k[3] = {key(0), key(1), key(2)};
    kvs_memobj *o[3] = {obj_new(5, 0), obj_new(6, 0), obj_new(7, 0)};
    kvs_memobj *d = obj_new(8, 0);
    /* Dups see the counters after close has closed the adapter's fds. */
    int sfd = dup(kvs_l2_store_event_fd(a)), lfd = dup(kvs_l2_lookup_event_fd(a)),
        dfd = dup(kvs_l2_load_event_fd(a));
    REQUIRE(sfd >= 0 && lfd >= 0 && dfd >= 0);
    kvs_l2_task_id ids[5];
    for (int i = 0; i < 3; i++) REQUIRE_OK(kvs_l2_submit_store(a, &k[i], &o[i], 1, &ids[i]));
    REQUIRE_OK(kvs_l2_submit_lookup_and_lock(a, k, 3, &ids[3]));
    REQUIRE_OK(kvs_l2_submit_load(a, &k[2], &d, 1, &ids[4]));
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_OK(kvs_l2_close(a));
    CHECK(ms_since(&t0) >= 100.0); /* it waited for the queued stores */
    /* Each task signalled exactly once. */
    CHECK_EQ_U64(drain(sfd), 3);
    CHECK_EQ_U64(drain(lfd), 1);
    CHECK_EQ_U64(drain(dfd), 1);
    kvs_l2_store_result r[4];
    size_t n;
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, 4, &n));
    REQUIRE(n == 3);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_U64(r[i].id, ids[i]);
        CHECK_EQ_INT(r[i].state, KVS_TASK_OK);
        CHECK_EQ_U64(r[i].bytes_written, 5 + (uint64_t)i);
    }
    /* The lookup and the load ran after the stores (one worker, FIFO). */
    kvs_l2_bitmap bm;
    CHECK_OK(kvs_l2_query_lookup_and_lock(a, ids[3], &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.nhits, 3);
    kvs_l2_bitmap_release(&bm);
    CHECK_OK(kvs_l2_query_load(a, ids[4], &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.nhits, 1);
    CHECK(obj_has(d, 7, 0));
    kvs_l2_bitmap_release(&bm);
    close(sfd);
    close(lfd);
    close(dfd);
    kvs_l2_destroy(a);
    for (int i = 0; i < 3; i++) kvs_memobj_free(o[i]);
    kvs_memobj_free(d);
}

static void test_destroy_with_unread_results_and_tasks(void)
{
    /* Unread results and queued tasks are all released by destroy alone
     * (valgrind / ASan check it). */
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_memory_fault slow = {.op = KVS_MEMORY_FAULT_LOAD, .key = NULL, .latency_us = 20000};
    REQUIRE_OK(kvs_memory_adapter_inject(a, &slow));
    kvs_object_key k = key(0);
    kvs_memobj *o = obj_new(5, 0), *d = obj_new(5, 0);
    kvs_l2_task_id id;
    REQUIRE_OK(kvs_l2_submit_store(a, &k, &o, 1, &id));
    REQUIRE_OK(kvs_l2_submit_lookup_and_lock(a, &k, 1, &id));
    REQUIRE_OK(kvs_l2_submit_load(a, &k, &d, 1, &id));
    REQUIRE_OK(kvs_l2_submit_load(a, &k, &d, 1, &id));
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
    kvs_memobj_free(d);
}

/* ---------------------------------------------------------------------
 * Work happens on the adapter's thread
 * ------------------------------------------------------------------ */

static void test_io_runs_off_the_callers_thread(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_memory_fault slow = {.op = KVS_MEMORY_FAULT_STORE, .key = NULL, .latency_us = 100000};
    REQUIRE_OK(kvs_memory_adapter_inject(a, &slow));
    kvs_object_key k = key(0);
    kvs_memobj *o = obj_new(9, 0);
    kvs_l2_task_id id;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    REQUIRE_OK(kvs_l2_submit_store(a, &k, &o, 1, &id));
    /* Submit returned before the store happened. */
    CHECK(ms_since(&t0) < 100.0);
    CHECK_EQ_INT(size_of(a, &k), -1);
    CHECK(!wait_fd(kvs_l2_store_event_fd(a), 0));
    kvs_l2_store_result r;
    CHECK_EQ_INT(wait_stores(a, &r, 1), 1);
    CHECK(ms_since(&t0) >= 100.0);
    CHECK_EQ_INT(size_of(a, &k), 9);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
}

/* ---------------------------------------------------------------------
 * Fault injection
 * ------------------------------------------------------------------ */

static void test_fault_store(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[3] = {key(0), key(1), key(2)};
    kvs_memobj *o[3] = {obj_new(3, 0), obj_new(4, 0), obj_new(5, 0)};
    kvs_memory_fault f = {.op = KVS_MEMORY_FAULT_STORE, .key = &k[1], .status = KVS_EIO};
    REQUIRE_OK(kvs_memory_adapter_inject(a, &f));
    kvs_l2_store_result r = store_sync(a, k, o, 3);
    CHECK_EQ_INT(r.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(r.status, KVS_EIO);
    CHECK_EQ_U64(r.bytes_written, 0);
    CHECK_EQ_STR(r.message, "memory: injected store fault on key 1: I/O error");
    CHECK_EQ_INT(size_of(a, &k[0]), 3); /* before the fault: stored */
    CHECK_EQ_INT(size_of(a, &k[1]), -1);
    CHECK_EQ_INT(size_of(a, &k[2]), -1); /* after it: not */
    /* Other keys, and the other directions, are untouched. */
    r = store_sync(a, &k[2], &o[2], 1);
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    kvs_l2_bitmap bm;
    REQUIRE_OK(lookup_sync(a, k, 3, &bm));
    CHECK_EQ_INT(bm.status, KVS_OK);
    CHECK_EQ_INT(bm.nhits, 2);
    kvs_l2_bitmap_release(&bm);
    /* Cleared: the key stores again. */
    CHECK_OK(kvs_memory_adapter_clear_faults(a));
    r = store_sync(a, &k[1], &o[1], 1);
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_U64(r.bytes_written, 4);
    /* A fault on every key, with another code; the first added decides. */
    kvs_memory_fault all = {.op = KVS_MEMORY_FAULT_STORE, .status = KVS_ENOSPC};
    kvs_memory_fault later = {.op = KVS_MEMORY_FAULT_STORE, .key = &k[0], .status = KVS_EIO};
    REQUIRE_OK(kvs_memory_adapter_inject(a, &all));
    REQUIRE_OK(kvs_memory_adapter_inject(a, &later));
    r = store_sync(a, k, o, 3);
    CHECK_EQ_INT(r.status, KVS_ENOSPC);
    CHECK_EQ_STR(r.message, "memory: injected store fault on key 0: no space");
    kvs_l2_destroy(a);
    for (int i = 0; i < 3; i++) kvs_memobj_free(o[i]);
}

static void test_fault_lookup(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[3] = {key(0), key(1), key(2)};
    kvs_memobj *o[3] = {obj_new(3, 0), obj_new(4, 0), obj_new(5, 0)};
    CHECK_EQ_INT(store_sync(a, k, o, 3).state, KVS_TASK_OK);
    kvs_memory_fault f = {.op = KVS_MEMORY_FAULT_LOOKUP, .key = &k[1], .status = KVS_ECORRUPT};
    REQUIRE_OK(kvs_memory_adapter_inject(a, &f));
    kvs_l2_bitmap bm;
    REQUIRE_OK(lookup_sync(a, k, 3, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.hits[0], 1);
    CHECK_EQ_INT(bm.hits[1], 0);
    CHECK_EQ_INT(bm.hits[2], 1);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK_EQ_STR(bm.message, "memory: injected lookup fault on key 1: corrupt input");
    kvs_l2_bitmap_release(&bm);
    /* The failed key was not locked: it deletes; the others do not. */
    uint8_t del[3];
    CHECK_OK(kvs_l2_delete(a, k, 3, del));
    CHECK_EQ_INT(del[0], 0);
    CHECK_EQ_INT(del[1], 1);
    CHECK_EQ_INT(del[2], 0);
    /* Loads are untouched by a lookup fault. */
    kvs_memobj *d = obj_new(8, 0);
    REQUIRE_OK(load_sync(a, &k[0], &d, 1, &bm));
    CHECK_EQ_INT(bm.nhits, 1);
    CHECK_EQ_INT(bm.status, KVS_OK);
    kvs_l2_bitmap_release(&bm);
    kvs_l2_destroy(a);
    for (int i = 0; i < 3; i++) kvs_memobj_free(o[i]);
    kvs_memobj_free(d);
}

static void test_fault_load(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[3] = {key(0), key(1), key(2)};
    kvs_memobj *o[3] = {obj_new(3, 10), obj_new(4, 20), obj_new(5, 30)};
    CHECK_EQ_INT(store_sync(a, k, o, 3).state, KVS_TASK_OK);
    kvs_memory_fault f = {.op = KVS_MEMORY_FAULT_LOAD, .key = &k[2], .status = KVS_EIO};
    REQUIRE_OK(kvs_memory_adapter_inject(a, &f));
    kvs_memobj *d[3] = {obj_new(8, 0), obj_new(8, 0), obj_new(8, 0)};
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_sync(a, k, d, 3, &bm));
    CHECK_EQ_INT(bm.hits[0], 1);
    CHECK_EQ_INT(bm.hits[1], 1);
    CHECK_EQ_INT(bm.hits[2], 0);
    CHECK_EQ_INT(bm.nhits, 2);
    CHECK_EQ_INT(bm.status, KVS_EIO);
    CHECK_EQ_STR(bm.message, "memory: injected load fault on key 2: I/O error");
    CHECK(obj_has(d[0], 3, 10));
    CHECK(obj_has(d[1], 4, 20));
    kvs_l2_bitmap_release(&bm);
    /* The key itself is fine: lookup finds it. */
    REQUIRE_OK(lookup_sync(a, &k[2], 1, &bm));
    CHECK_EQ_INT(bm.nhits, 1);
    kvs_l2_bitmap_release(&bm);
    kvs_l2_destroy(a);
    for (int i = 0; i < 3; i++) {
        kvs_memobj_free(o[i]);
        kvs_memobj_free(d[i]);
    }
}

static void test_fault_latency(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k[2] = {key(0), key(1)};
    kvs_memobj *o = obj_new(3, 0), *d = obj_new(3, 0);
    CHECK_EQ_INT(store_sync(a, k, (kvs_memobj *[]){o, o}, 2).state, KVS_TASK_OK);
    /* 60 ms for loads touching key 1 (latency only: nothing fails). */
    kvs_memory_fault f = {.op = KVS_MEMORY_FAULT_LOAD, .key = &k[1], .latency_us = 60000};
    REQUIRE_OK(kvs_memory_adapter_inject(a, &f));
    kvs_l2_task_id id;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    REQUIRE_OK(kvs_l2_submit_load(a, &k[1], &d, 1, &id));
    CHECK(!wait_fd(kvs_l2_load_event_fd(a), 20));
    kvs_l2_bitmap bm;
    REQUIRE_OK(wait_bitmap(a, 1, id, &bm, WAIT_MS));
    CHECK(ms_since(&t0) >= 60.0);
    CHECK_EQ_INT(bm.nhits, 1);
    CHECK_EQ_INT(bm.status, KVS_OK);
    kvs_l2_bitmap_release(&bm);
    /* Two matching faults add up. */
    REQUIRE_OK(kvs_memory_adapter_inject(a, &f));
    clock_gettime(CLOCK_MONOTONIC, &t0);
    REQUIRE_OK(load_sync(a, k, (kvs_memobj *[]){d, d}, 2, &bm));
    CHECK(ms_since(&t0) >= 120.0);
    CHECK_EQ_INT(bm.nhits, 2);
    kvs_l2_bitmap_release(&bm);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
    kvs_memobj_free(d);
}

/* Every op NULL, list_keys too (kvs_l2_list_keys refuses that: test_list_keys). */
static const struct kvs_l2_adapter_ops fake_ops = {.name = "fs", .list_keys = NULL};

static void test_fault_refusals(void)
{
    kvs_l2_adapter *a = mem_new(0, 1);
    REQUIRE(a);
    kvs_object_key k = key(0);
    kvs_memory_fault f = {.op = KVS_MEMORY_FAULT_STORE, .key = &k, .status = KVS_EIO};
    CHECK_ERR(kvs_memory_adapter_inject(NULL, &f), KVS_EINVAL, "memory: adapter is NULL");
    CHECK_ERR(kvs_memory_adapter_inject(a, NULL), KVS_EINVAL, "memory: fault is NULL");
    kvs_l2_adapter fake = {.ops = &fake_ops};
    CHECK_ERR(kvs_memory_adapter_inject(&fake, &f), KVS_EINVAL,
              "memory: adapter is of type 'fs', not 'memory'");
    CHECK_ERR(kvs_memory_adapter_clear_faults(&fake), KVS_EINVAL,
              "memory: adapter is of type 'fs', not 'memory'");
    CHECK_ERR(kvs_memory_adapter_clear_faults(NULL), KVS_EINVAL, "memory: adapter is NULL");
    f.op = (kvs_memory_fault_op)7;
    CHECK_ERR(kvs_memory_adapter_inject(a, &f), KVS_EINVAL, "memory: unknown fault op 7");
    f.op = KVS_MEMORY_FAULT_LOAD;
    f.status = 3;
    CHECK_ERR(kvs_memory_adapter_inject(a, &f), KVS_EINVAL,
              "memory: fault status 3 is not KVS_OK or a KVS_E* code");
    f.status = KVS_EIO;
    k.object_group_id = -4;
    CHECK_ERR(kvs_memory_adapter_inject(a, &f), KVS_EINVAL,
              "memory: fault key: key: object group id -4 is negative");
    /* None of those was added: a store of key(0) works. */
    kvs_object_key k0 = key(0);
    kvs_memobj *o = obj_new(2, 0);
    CHECK_EQ_INT(store_sync(a, &k0, &o, 1).state, KVS_TASK_OK);
    /* The fault holds a copy of its key. */
    kvs_object_key tmp = key(0);
    f.key = &tmp;
    f.op = KVS_MEMORY_FAULT_STORE;
    REQUIRE_OK(kvs_memory_adapter_inject(a, &f));
    tmp = key(9);
    CHECK_EQ_INT(store_sync(a, &k0, &o, 1).status, KVS_EIO);
    CHECK_EQ_INT(store_sync(a, &tmp, &o, 1).state, KVS_TASK_OK);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
}

/* ---------------------------------------------------------------------
 * Concurrency (meant for TSan): stores, lookups, loads, unlocks and
 * deletes of the same keys from several threads and workers.
 * ------------------------------------------------------------------ */

enum { CK = 8, ROUNDS = 150 };

struct conc {
    kvs_l2_adapter *a;
    kvs_object_key k[CK];
    int failures;
};

static void *reader_thread(void *arg)
{
    struct conc *c = arg;
    kvs_memobj *d[CK];
    for (int i = 0; i < CK; i++) d[i] = obj_new(64, 0);
    for (int r = 0; r < ROUNDS; r++) {
        kvs_l2_bitmap bm;
        kvs_l2_task_id id;
        if (kvs_l2_submit_lookup_and_lock(c->a, c->k, CK, &id) != KVS_OK ||
            wait_bitmap(c->a, 0, id, &bm, 2) != KVS_OK || bm.state != KVS_TASK_OK) {
            c->failures++;
            continue;
        }
        /* Unlock exactly what was locked. */
        for (int i = 0; i < CK; i++)
            if (bm.hits[i]) kvs_l2_unlock(c->a, &c->k[i], 1);
        kvs_l2_bitmap_release(&bm);
        if (kvs_l2_submit_load(c->a, c->k, d, CK, &id) != KVS_OK ||
            wait_bitmap(c->a, 1, id, &bm, 2) != KVS_OK || bm.state != KVS_TASK_OK) {
            c->failures++;
            continue;
        }
        for (int i = 0; i < CK; i++) /* whatever loaded is whole */
            if (bm.hits[i] && !(kvs_memobj_size(d[i]) == 32 && obj_has(d[i], 32, (unsigned)i)))
                c->failures++;
        kvs_l2_bitmap_release(&bm);
        kvs_l2_delete(c->a, c->k, CK, NULL);
    }
    for (int i = 0; i < CK; i++) kvs_memobj_free(d[i]);
    return NULL;
}

static void test_concurrent_use(void)
{
    struct conc c = {.a = mem_new(0, 3)};
    REQUIRE(c.a);
    for (int i = 0; i < CK; i++) c.k[i] = key(i);
    kvs_memobj *o[CK];
    for (int i = 0; i < CK; i++) o[i] = obj_new(32, (unsigned)i);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, reader_thread, &c) == 0);
    size_t stored = 0;
    for (int r = 0; r < ROUNDS; r++) {
        kvs_l2_task_id id;
        if (kvs_l2_submit_store(c.a, c.k, o, CK, &id) == KVS_OK) stored++;
        json_t *st;
        if (kvs_l2_status(c.a, &st) == KVS_OK) json_decref(st);
        kvs_l2_usage u;
        kvs_l2_get_usage(c.a, &u);
    }
    kvs_l2_store_result res[ROUNDS];
    CHECK_EQ_INT(wait_stores(c.a, res, stored), ROUNDS);
    int ok = 1;
    for (size_t i = 0; i < stored; i++) ok &= res[i].state == KVS_TASK_OK;
    CHECK(ok);
    pthread_join(th, NULL);
    CHECK_EQ_INT(c.failures, 0);
    /* Locks all released: everything deletes. */
    uint8_t del[CK];
    CHECK_OK(kvs_l2_delete(c.a, c.k, CK, del));
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(c.a, &u));
    CHECK_EQ_U64(u.bytes_used, 0);
    kvs_l2_destroy(c.a);
    for (int i = 0; i < CK; i++) kvs_memobj_free(o[i]);
}

static void test_several_workers_ids_unique(void)
{
    enum { T = 40 };
    kvs_l2_adapter *a = mem_new(0, 4);
    REQUIRE(a);
    kvs_object_key k[T];
    kvs_memobj *o = obj_new(10, 0);
    for (int i = 0; i < T; i++) {
        k[i] = key(i);
        kvs_l2_task_id id;
        REQUIRE_OK(kvs_l2_submit_store(a, &k[i], &o, 1, &id));
        CHECK_EQ_U64(id, (uint64_t)i);
    }
    kvs_l2_store_result r[T];
    REQUIRE(wait_stores(a, r, T) == T);
    int seen[T] = {0};
    for (int i = 0; i < T; i++) {
        REQUIRE(r[i].id < T);
        seen[r[i].id]++;
        CHECK_EQ_INT(r[i].state, KVS_TASK_OK);
    }
    for (int i = 0; i < T; i++) CHECK_EQ_INT(seen[i], 1);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 10 * T);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
}

/* kvs_l2_list_keys: the contract (kvs_test_list.h), over enough keys
 * that the map grows between the stores; and a table without list_keys
 * (an adapter built for an older header) is refused. */
static void test_list_keys(void)
{
    kvs_l2_adapter *a = mem_new(0, 2);
    REQUIRE(a);
    enum { N = 300 };
    kvs_object_key keys[N];
    kvs_memobj *objs[N];
    for (int i = 0; i < N; i++) {
        keys[i] = key(i);
        objs[i] = obj_new((size_t)(i % 7), (unsigned)i);
    }
    kvs_l2_store_result r = store_sync(a, keys, objs, N);
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    kvs_test_list_contract(a, keys, N, "memory: adapter is closed");
    kvs_l2_destroy(a);
    for (int i = 0; i < N; i++) kvs_memobj_free(objs[i]);
    kvs_l2_adapter fake = {.ops = &fake_ops};
    kvs_test_listing *l = calloc(1, sizeof *l);
    CHECK_ERR(kvs_l2_list_keys(&fake, kvs_test_listing_add, l), KVS_EUNSUPPORTED,
              "fs: listing keys is not supported");
    free(l);
}

int main(void)
{
    RUN(test_fds_distinct_nonblocking_cloexec);
    RUN(test_ids_from_zero_shared_across_directions);
    RUN(test_store_then_pop_once_bytes_written);
    RUN(test_pop_oldest_first_and_cap);
    RUN(test_store_replaces_and_keeps_locks);
    RUN(test_key_fields_are_distinct);
    RUN(test_many_keys);
    RUN(test_lookup_bitmap_and_pop_once);
    RUN(test_locks_prevent_delete_until_unlocked);
    RUN(test_load_copies_and_sets_used_size);
    RUN(test_load_too_large_fails_only_that_key);
    RUN(test_load_missing_keys);
    RUN(test_zero_byte_object);
    RUN(test_capacity_and_usage);
    RUN(test_status_json);
    RUN(test_empty_batches);
    RUN(test_refusals_exact);
    RUN(test_create_refusals);
    RUN(test_submit_after_close_and_close_twice);
    RUN(test_close_with_tasks_in_flight);
    RUN(test_destroy_with_unread_results_and_tasks);
    RUN(test_io_runs_off_the_callers_thread);
    RUN(test_fault_store);
    RUN(test_fault_lookup);
    RUN(test_fault_load);
    RUN(test_fault_latency);
    RUN(test_fault_refusals);
    RUN(test_concurrent_use);
    RUN(test_several_workers_ids_unique);
    RUN(test_load_wrong_layout_size_refused);
    RUN(test_list_keys);
    return TEST_SUMMARY();
}
