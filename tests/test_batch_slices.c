/* test_batch_slices.c - the batch runner shared by the fs and Redis L2
 * adapters (src/l2/batch_slices.h), directly, on a real task queue and
 * thread pool with a test run() that records what it was given: the slice
 * bounds, the merge of hits / bytes / errors in key order whatever order
 * the slices finish in, the copies of the caller's arrays, empty batches,
 * refused submits that use no id, the inline fallback when the pool
 * refuses, and slices running on several workers at once. Exact values
 * throughout; results are waited for on the queue's fds with poll(2). */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvs_test.h"
#include "kvserde/l2.h"
#include "l2/batch_slices.h"
#include "l2/task_queue.h"
#include "util/thread_pool.h"

#define WAIT_MS 10000
#define MAX_KEYS 16
#define MAX_FAILS 4

/* What run() saw of one slice. */
typedef struct seen {
    size_t begin, end;
    pthread_t thread;
} seen;

/* The test's plan for run(), and what run() saw. */
typedef struct plan {
    /* the plan */
    unsigned hit_every;               /* lookups / loads: key i hits if i % hit_every == 0 */
    size_t fail_key[MAX_FAILS];       /* these keys fail, with these codes */
    int fail_status[MAX_FAILS];
    size_t nfails;
    int hold_slice;                   /* this slice waits until the others finished; -1: none */
    unsigned rendezvous;              /* > 0: every slice waits until this many are in run() */
    const kvs_object_key *want_keys;  /* if set: the batch's keys must equal these */
    kvs_memobj *const *want_objects;  /* if set: and its objects these */
    /* what run() saw */
    atomic_uint calls, finished, arrived;
    atomic_uint mismatches;           /* keys / objects not as wanted */
    atomic_int timed_out;             /* a wait in run() gave up */
    seen slices[MAX_KEYS];            /* by slice index; each slice writes its own */
} plan;

static kvs_object_key g_keys[MAX_KEYS];

static void plan_reset(plan *p)
{
    memset(p, 0, sizeof *p);
    p->hold_slice = -1;
    atomic_init(&p->calls, 0);
    atomic_init(&p->finished, 0);
    atomic_init(&p->arrived, 0);
    atomic_init(&p->mismatches, 0);
    atomic_init(&p->timed_out, 0);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Wait (polling an atomic, 1 ms steps) until *v >= want; 0 on timeout. */
static int wait_count(atomic_uint *v, unsigned want)
{
    for (int ms = 0; ms < WAIT_MS; ms++) {
        if (atomic_load(v) >= want) return 1;
        sleep_ms(1);
    }
    return atomic_load(v) >= want;
}

static void test_run(kvs_l2_slice *s)
{
    kvs_l2_batch *b = s->batch;
    plan *p = b->runner.ctx;
    unsigned k = (unsigned)(s - b->slices);
    atomic_fetch_add(&p->calls, 1);
    if (k < MAX_KEYS) {
        p->slices[k].begin = s->begin;
        p->slices[k].end = s->end;
        p->slices[k].thread = pthread_self();
    }
    if (p->rendezvous) {
        atomic_fetch_add(&p->arrived, 1);
        if (!wait_count(&p->arrived, p->rendezvous)) atomic_store(&p->timed_out, 1);
    }
    if ((int)k == p->hold_slice && !wait_count(&p->finished, b->nslices - 1))
        atomic_store(&p->timed_out, 1);
    kvs_l2_direction d = b->t->direction;
    for (size_t i = s->begin; i < s->end; i++) {
        if (p->want_keys && !kvs_object_key_equal(&b->keys[i], &p->want_keys[i]))
            atomic_fetch_add(&p->mismatches, 1);
        if (p->want_objects && b->objects[i] != p->want_objects[i])
            atomic_fetch_add(&p->mismatches, 1);
        int failed = 0;
        for (size_t f = 0; f < p->nfails; f++) {
            if (p->fail_key[f] == i) {
                kvs_l2_slice_fail(s, p->fail_status[f], "test: key %zu failed (%d)", i,
                                  p->fail_status[f]);
                failed = 1;
            }
        }
        if (failed) continue;
        if (d == KVS_L2_STORE) s->bytes += 10 * (i + 1);
        else if (p->hit_every && i % p->hit_every == 0) b->hit[i] = 1;
    }
    atomic_fetch_add(&p->finished, 1);
}

/* A queue named "test", a pool of `threads`, and a runner over both. */
typedef struct rig {
    kvs_l2_task_queue q;
    kvs_thread_pool *pool;
    kvs_l2_batch_runner runner;
    plan p;
} rig;

static int rig_open(rig *r, unsigned threads, unsigned max_slices)
{
    plan_reset(&r->p);
    if (kvs_l2_tq_init(&r->q, "test") != KVS_OK) return -1;
    if (kvs_thread_pool_create(threads, "kvs-test", &r->pool) != KVS_OK) {
        kvs_l2_tq_destroy(&r->q);
        return -1;
    }
    r->runner = (kvs_l2_batch_runner){
        .q = &r->q, .pool = r->pool, .max_slices = max_slices, .run = test_run, .ctx = &r->p};
    return 0;
}

static void rig_close(rig *r)
{
    (void)kvs_l2_tq_close_begin(&r->q);
    kvs_thread_pool_destroy(r->pool); /* runs what is queued, joins */
    kvs_l2_tq_close_fds(&r->q);
    kvs_l2_tq_destroy(&r->q);
}

/* 1 once fd is readable within WAIT_MS; drains the eventfd. */
static int wait_fd(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int rc = poll(&pfd, 1, WAIT_MS);
    if (rc != 1) return 0;
    uint64_t v;
    (void)!read(fd, &v, sizeof v);
    return 1;
}

/* The lookup / load result of id, waited for. 0 on timeout. */
static int wait_bitmap(rig *r, kvs_l2_direction d, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    int fd = kvs_l2_tq_fd(&r->q, d);
    for (;;) {
        kvs_l2_tq_query(&r->q, d, id, out);
        if (out->state != KVS_TASK_PENDING) return 1;
        if (!wait_fd(fd)) return 0;
    }
}

/* The next finished store, waited for. 0 on timeout. */
static int wait_store(rig *r, kvs_l2_store_result *out)
{
    int fd = kvs_l2_tq_fd(&r->q, KVS_L2_STORE);
    for (;;) {
        size_t count = 0;
        kvs_l2_tq_pop_stores(&r->q, out, 1, &count);
        if (count == 1) return 1;
        if (!wait_fd(fd)) return 0;
    }
}

/* The message test_run() gives key i failing with status (its text is
 * written out again here: what the batch reports must be it, verbatim). */
static const char *fail_msg(size_t i, int status, char *buf, size_t size)
{
    snprintf(buf, size, "test: key %zu failed (%d)", i, status);
    return buf;
}

/* ---------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------ */

/* min(n, max_slices) slices, sizes differing by at most one, the larger
 * first, each run once on a pool worker. */
static void test_slice_bounds(void)
{
    static const struct {
        size_t n;
        unsigned max;
        unsigned nslices;
        size_t bounds[5][2];
    } cases[] = {
        {10, 4, 4, {{0, 3}, {3, 6}, {6, 8}, {8, 10}}},
        {8, 4, 4, {{0, 2}, {2, 4}, {4, 6}, {6, 8}}},
        {3, 4, 3, {{0, 1}, {1, 2}, {2, 3}}},
        {5, 3, 3, {{0, 2}, {2, 4}, {4, 5}}},
        {7, 1, 1, {{0, 7}}},
        {16, 5, 5, {{0, 4}, {4, 7}, {7, 10}, {10, 13}, {13, 16}}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rig r;
        REQUIRE(rig_open(&r, 4, cases[c].max) == 0);
        kvs_l2_task_id id;
        CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_LOOKUP, g_keys, NULL, cases[c].n, &id));
        kvs_l2_bitmap bm;
        CHECK(wait_bitmap(&r, KVS_L2_LOOKUP, id, &bm));
        CHECK_EQ_INT(bm.state, KVS_TASK_OK);
        CHECK_EQ_U64(bm.nkeys, cases[c].n);
        CHECK_EQ_U64(bm.nhits, 0);
        kvs_l2_bitmap_release(&bm);
        CHECK_EQ_INT(atomic_load(&r.p.calls), cases[c].nslices);
        for (unsigned k = 0; k < cases[c].nslices; k++) {
            CHECK_EQ_U64(r.p.slices[k].begin, cases[c].bounds[k][0]);
            CHECK_EQ_U64(r.p.slices[k].end, cases[c].bounds[k][1]);
            CHECK(!pthread_equal(r.p.slices[k].thread, pthread_self()));
        }
        rig_close(&r);
    }
}

/* Hits from every slice; the task's error is the lowest failing key's
 * (slice 1's first error, key 4), although slice 2 (key 7) has failed
 * before slice 1 ends, and slice 1's later failure (key 5) does not
 * replace its first. */
static void test_lookup_merges_in_key_order(void)
{
    rig r;
    REQUIRE(rig_open(&r, 4, 4) == 0);
    r.p.hit_every = 3;
    r.p.nfails = 3;
    r.p.fail_key[0] = 7;
    r.p.fail_status[0] = KVS_EIO;
    r.p.fail_key[1] = 4;
    r.p.fail_status[1] = KVS_ENOTFOUND;
    r.p.fail_key[2] = 5;
    r.p.fail_status[2] = KVS_ECORRUPT;
    r.p.hold_slice = 1; /* [3, 6): does its keys after the others are done */
    kvs_l2_task_id id;
    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_LOOKUP, g_keys, NULL, 10, &id));
    kvs_l2_bitmap bm;
    REQUIRE(wait_bitmap(&r, KVS_L2_LOOKUP, id, &bm));
    CHECK_EQ_INT(atomic_load(&r.p.timed_out), 0);
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_U64(bm.nkeys, 10);
    CHECK_EQ_U64(bm.nhits, 4);
    static const uint8_t want[10] = {1, 0, 0, 1, 0, 0, 1, 0, 0, 1};
    for (size_t i = 0; bm.hits && i < 10; i++) CHECK_EQ_INT(bm.hits[i], want[i]);
    CHECK_EQ_INT(bm.status, KVS_ENOTFOUND);
    char msg[64];
    CHECK_EQ_STR(bm.message, fail_msg(4, KVS_ENOTFOUND, msg, sizeof msg));
    kvs_l2_bitmap_release(&bm);
    rig_close(&r);
}

/* A load is merged like a lookup; without errors the status is KVS_OK and
 * the message empty. */
static void test_load_hits(void)
{
    rig r;
    REQUIRE(rig_open(&r, 2, 2) == 0);
    r.p.hit_every = 2;
    kvs_memobj *objs[5] = {0};
    kvs_l2_task_id id;
    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_LOAD, g_keys, objs, 5, &id));
    kvs_l2_bitmap bm;
    REQUIRE(wait_bitmap(&r, KVS_L2_LOAD, id, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_U64(bm.nkeys, 5);
    CHECK_EQ_U64(bm.nhits, 3);
    static const uint8_t want[5] = {1, 0, 1, 0, 1};
    for (size_t i = 0; bm.hits && i < 5; i++) CHECK_EQ_INT(bm.hits[i], want[i]);
    CHECK_EQ_INT(bm.status, KVS_OK);
    CHECK_EQ_STR(bm.message, "");
    kvs_l2_bitmap_release(&bm);
    rig_close(&r);
}

/* A store's bytes_written is the sum over its slices; a failed store
 * reports its lowest failing key and 0 bytes. */
static void test_store_bytes_and_failure(void)
{
    rig r;
    REQUIRE(rig_open(&r, 2, 2) == 0);
    kvs_memobj *objs[5] = {0};
    kvs_l2_task_id id1, id2;
    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_STORE, g_keys, objs, 5, &id1));
    kvs_l2_store_result res;
    REQUIRE(wait_store(&r, &res));
    CHECK_EQ_U64(res.id, id1);
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 10 + 20 + 30 + 40 + 50);
    CHECK_EQ_INT(res.status, KVS_OK);
    CHECK_EQ_STR(res.message, "");

    r.p.nfails = 2;
    r.p.fail_key[0] = 4;
    r.p.fail_status[0] = KVS_EIO;
    r.p.fail_key[1] = 3;
    r.p.fail_status[1] = KVS_ENOSPC;
    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_STORE, g_keys, objs, 5, &id2));
    REQUIRE(wait_store(&r, &res));
    CHECK_EQ_U64(res.id, id2);
    CHECK_EQ_U64(id2, id1 + 1);
    CHECK_EQ_INT(res.state, KVS_TASK_FAILED);
    CHECK_EQ_U64(res.bytes_written, 0);
    CHECK_EQ_INT(res.status, KVS_ENOSPC);
    char msg[64];
    CHECK_EQ_STR(res.message, fail_msg(3, KVS_ENOSPC, msg, sizeof msg));
    rig_close(&r);
}

/* A batch of 0 keys has no slices and is complete when submit returns. */
static void test_empty_batch(void)
{
    rig r;
    REQUIRE(rig_open(&r, 2, 2) == 0);
    kvs_l2_task_id id;
    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_LOOKUP, NULL, NULL, 0, &id));
    kvs_l2_bitmap bm;
    kvs_l2_tq_query(&r.q, KVS_L2_LOOKUP, id, &bm); /* no wait */
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_U64(bm.nkeys, 0);
    CHECK_EQ_U64(bm.nhits, 0);
    CHECK_EQ_INT(bm.status, KVS_OK);
    kvs_l2_bitmap_release(&bm);

    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_STORE, NULL, NULL, 0, &id));
    kvs_l2_store_result res;
    size_t count = 0;
    kvs_l2_tq_pop_stores(&r.q, &res, 1, &count);
    CHECK_EQ_U64(count, 1);
    CHECK_EQ_U64(res.id, id);
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 0);
    CHECK_EQ_INT(atomic_load(&r.p.calls), 0);
    rig_close(&r);
}

/* The job that keeps a one-thread pool busy until the gate opens. */
typedef struct blocker {
    kvs_job job;
    atomic_int open, running;
} blocker;

static void run_blocker(kvs_job *job)
{
    blocker *b = KVS_CONTAINER_OF(job, blocker, job);
    atomic_store(&b->running, 1);
    for (int ms = 0; ms < WAIT_MS && !atomic_load(&b->open); ms++) sleep_ms(1);
}

/* The batch runs on copies of the caller's keys and objects: the caller
 * may reuse its arrays as soon as submit returns. Lookups get no objects
 * array. */
static void test_copies_caller_arrays(void)
{
    rig r;
    REQUIRE(rig_open(&r, 1, 1) == 0);
    blocker bl = {0};
    bl.job.run = run_blocker;
    REQUIRE_OK(kvs_thread_pool_submit(r.pool, &bl.job));
    kvs_object_key keys[3];
    kvs_memobj *objs[3];
    kvs_memobj *want_objs[3];
    static kvs_memobj storage[3]; /* only their addresses are compared */
    for (size_t i = 0; i < 3; i++) {
        keys[i] = g_keys[i + 5];
        objs[i] = want_objs[i] = &storage[i];
    }
    r.p.want_keys = &g_keys[5];
    r.p.want_objects = want_objs;
    kvs_l2_task_id id;
    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_LOAD, keys, objs, 3, &id));
    memset(keys, 0, sizeof keys); /* the caller reuses its arrays */
    memset(objs, 0, sizeof objs);
    CHECK_EQ_INT(atomic_load(&r.p.calls), 0); /* still queued behind the blocker */
    atomic_store(&bl.open, 1);
    kvs_l2_bitmap bm;
    REQUIRE(wait_bitmap(&r, KVS_L2_LOAD, id, &bm));
    kvs_l2_bitmap_release(&bm);
    CHECK_EQ_INT(atomic_load(&r.p.calls), 1);
    CHECK_EQ_INT(atomic_load(&r.p.mismatches), 0);
    rig_close(&r);
}

/* A refused submit uses no id and runs nothing: too large a batch
 * (KVS_ENOMEM), and after close (KVS_ECLOSED). */
static void test_refused_submits(void)
{
    rig r;
    REQUIRE(rig_open(&r, 2, 2) == 0);
    kvs_l2_task_id id1, id2, id = 4242;
    kvs_l2_bitmap bm;
    /* (Each task waited for before the next: run() records slice 0 of both.) */
    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_LOOKUP, g_keys, NULL, 1, &id1));
    CHECK(wait_bitmap(&r, KVS_L2_LOOKUP, id1, &bm));
    kvs_l2_bitmap_release(&bm);
    size_t huge = SIZE_MAX / sizeof(kvs_object_key) + 1;
    char msg[96];
    snprintf(msg, sizeof msg, "test: batch of %zu keys is too large", huge);
    CHECK_ERR(kvs_l2_batch_submit(&r.runner, KVS_L2_LOOKUP, g_keys, NULL, huge, &id),
              KVS_ENOMEM, msg);
    CHECK_EQ_U64(id, 4242);
    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_LOOKUP, g_keys, NULL, 1, &id2));
    CHECK_EQ_U64(id2, id1 + 1);
    CHECK(wait_bitmap(&r, KVS_L2_LOOKUP, id2, &bm));
    kvs_l2_bitmap_release(&bm);
    CHECK_EQ_INT(atomic_load(&r.p.calls), 2);

    CHECK_EQ_INT(kvs_l2_tq_close_begin(&r.q), 1);
    kvs_memobj *objs[3] = {0};
    CHECK_ERR(kvs_l2_batch_submit(&r.runner, KVS_L2_STORE, g_keys, objs, 3, &id), KVS_ECLOSED,
              "test: submit after close");
    CHECK_EQ_U64(id, 4242);
    CHECK_EQ_INT(atomic_load(&r.p.calls), 2);
    rig_close(&r);
}

/* If the pool refuses a slice (it cannot while the queue is open: close
 * stops the pool only after the submits in progress), the slice runs on the
 * submitting thread rather than lose the task. */
static void test_inline_when_pool_refuses(void)
{
    rig r;
    REQUIRE(rig_open(&r, 2, 3) == 0);
    REQUIRE_OK(kvs_thread_pool_shutdown(r.pool));
    r.p.hit_every = 1;
    kvs_l2_task_id id;
    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_LOOKUP, g_keys, NULL, 6, &id));
    CHECK_EQ_INT(atomic_load(&r.p.calls), 3);
    for (unsigned k = 0; k < 3; k++) CHECK(pthread_equal(r.p.slices[k].thread, pthread_self()));
    kvs_l2_bitmap bm;
    kvs_l2_tq_query(&r.q, KVS_L2_LOOKUP, id, &bm); /* complete already */
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_U64(bm.nhits, 6);
    kvs_l2_bitmap_release(&bm);
    rig_close(&r);
}

/* The slices of one task run on as many workers at once: each of 4 slices
 * waits until all 4 have started, which only ends if they run together. */
static void test_slices_run_in_parallel(void)
{
    rig r;
    REQUIRE(rig_open(&r, 4, 4) == 0);
    r.p.rendezvous = 4;
    kvs_l2_task_id id;
    CHECK_OK(kvs_l2_batch_submit(&r.runner, KVS_L2_LOOKUP, g_keys, NULL, 8, &id));
    kvs_l2_bitmap bm;
    REQUIRE(wait_bitmap(&r, KVS_L2_LOOKUP, id, &bm));
    kvs_l2_bitmap_release(&bm);
    CHECK_EQ_INT(atomic_load(&r.p.timed_out), 0);
    CHECK_EQ_INT(atomic_load(&r.p.calls), 4);
    for (unsigned a = 0; a < 4; a++)
        for (unsigned b = a + 1; b < 4; b++)
            CHECK(!pthread_equal(r.p.slices[a].thread, r.p.slices[b].thread));
    rig_close(&r);
}

int main(void)
{
    for (int i = 0; i < MAX_KEYS; i++) {
        char h[16];
        int n = snprintf(h, sizeof h, "chunk-%d", i);
        if (kvs_object_key_init(&g_keys[i], h, (size_t)n, "test_model", i, 0, NULL) != KVS_OK)
            abort();
    }
    RUN(test_slice_bounds);
    RUN(test_lookup_merges_in_key_order);
    RUN(test_load_hits);
    RUN(test_store_bytes_and_failure);
    RUN(test_empty_batch);
    RUN(test_copies_caller_arrays);
    RUN(test_refused_submits);
    RUN(test_inline_when_pool_refuses);
    RUN(test_slices_run_in_parallel);
    return TEST_SUMMARY();
}
