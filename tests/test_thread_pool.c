/* test_thread_pool.c - the worker pool: FIFO order, parallelism, shutdown
 * drains the queue then joins, refusals. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "kvs_test.h"
#include "kvserde/export.h"
#include "util/thread_pool.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int order[1000];
static int norder;
static int gate_closed;
static int running, max_running;

struct job {
    kvs_job base;
    int index;
    int hold; /* wait at the gate */
    int self_free;
};

static void run_job(kvs_job *j)
{
    struct job *jb = KVS_CONTAINER_OF(j, struct job, base);
    pthread_mutex_lock(&mu);
    running++;
    if (running > max_running)
        max_running = running;
    pthread_cond_broadcast(&cv);
    while (jb->hold && gate_closed)
        pthread_cond_wait(&cv, &mu);
    order[norder++] = jb->index;
    running--;
    pthread_mutex_unlock(&mu);
    if (jb->self_free)
        free(jb);
}

static void reset(void)
{
    pthread_mutex_lock(&mu);
    norder = 0;
    gate_closed = 0;
    running = max_running = 0;
    pthread_mutex_unlock(&mu);
}

/* One worker runs jobs in submission order; shutdown runs every queued job
 * before returning; jobs may free themselves. */
static void test_fifo_and_drain_on_shutdown(void)
{
    reset();
    kvs_thread_pool *pool;
    REQUIRE_OK(kvs_thread_pool_create(1, "test", &pool));
    CHECK_EQ_INT(kvs_thread_pool_size(pool), 1);
    pthread_mutex_lock(&mu);
    gate_closed = 1;
    pthread_mutex_unlock(&mu);
    enum { N = 500 };
    for (int i = 0; i < N; i++) {
        struct job *j = calloc(1, sizeof *j);
        j->base.run = run_job;
        j->index = i;
        j->hold = i == 0;
        j->self_free = 1;
        REQUIRE_OK(kvs_thread_pool_submit(pool, &j->base));
    }
    pthread_mutex_lock(&mu);
    gate_closed = 0;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    CHECK_OK(kvs_thread_pool_shutdown(pool));
    CHECK_EQ_INT(norder, N);
    for (int i = 0; i < N; i++)
        CHECK_EQ_INT(order[i], i);
    struct job late = {.base.run = run_job};
    CHECK_ERR(kvs_thread_pool_submit(pool, &late.base), KVS_ECLOSED,
              "thread pool: submit after shutdown");
    CHECK_OK(kvs_thread_pool_shutdown(pool)); /* again: no-op */
    kvs_thread_pool_destroy(pool);
    kvs_thread_pool_destroy(NULL);
}

/* n workers run n jobs at once. */
static void test_parallel_workers(void)
{
    reset();
    kvs_thread_pool *pool;
    REQUIRE_OK(kvs_thread_pool_create(3, "test", &pool));
    pthread_mutex_lock(&mu);
    gate_closed = 1;
    pthread_mutex_unlock(&mu);
    struct job jobs[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (struct job){.base.run = run_job, .index = i, .hold = 1};
        REQUIRE_OK(kvs_thread_pool_submit(pool, &jobs[i].base));
    }
    pthread_mutex_lock(&mu);
    while (running < 3)
        pthread_cond_wait(&cv, &mu);
    gate_closed = 0;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    kvs_thread_pool_destroy(pool); /* shuts down, joins */
    CHECK_EQ_INT(max_running, 3);
    CHECK_EQ_INT(norder, 3);
}

static kvs_thread_pool *self_pool;
static int self_rc;

static void shutdown_from_worker(kvs_job *j)
{
    self_rc = kvs_thread_pool_shutdown(self_pool);
}

static void test_shutdown_from_worker_refused(void)
{
    REQUIRE_OK(kvs_thread_pool_create(1, "test", &self_pool));
    kvs_job j = {.run = shutdown_from_worker};
    REQUIRE_OK(kvs_thread_pool_submit(self_pool, &j));
    kvs_thread_pool_destroy(self_pool);
    CHECK_EQ_INT(self_rc, KVS_EINVAL);
}

static void test_refusals(void)
{
    kvs_thread_pool *pool = NULL;
    CHECK_ERR(kvs_thread_pool_create(0, "test", &pool), KVS_EINVAL,
              "thread pool: need at least 1 thread");
    CHECK(pool == NULL);
}

static void check_mask(kvs_job *j)
{
    sigset_t set;
    pthread_sigmask(SIG_SETMASK, NULL, &set);
    self_rc = sigismember(&set, SIGINT) && sigismember(&set, SIGTERM);
}

/* Workers block signals; the creator's mask is left as it was. */
static void test_workers_block_signals(void)
{
    sigset_t before, after;
    pthread_sigmask(SIG_SETMASK, NULL, &before);
    kvs_thread_pool *pool;
    REQUIRE_OK(kvs_thread_pool_create(1, NULL, &pool));
    pthread_sigmask(SIG_SETMASK, NULL, &after);
    CHECK_EQ_INT(sigismember(&after, SIGINT), sigismember(&before, SIGINT));
    self_rc = 0;
    kvs_job j = {.run = check_mask};
    REQUIRE_OK(kvs_thread_pool_submit(pool, &j));
    kvs_thread_pool_destroy(pool);
    CHECK_EQ_INT(self_rc, 1);
}

int main(void)
{
    RUN(test_fifo_and_drain_on_shutdown);
    RUN(test_parallel_workers);
    RUN(test_shutdown_from_worker_refused);
    RUN(test_refusals);
    RUN(test_workers_block_signals);
    return TEST_SUMMARY();
}
