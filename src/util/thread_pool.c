/* thread_pool.c - fixed worker threads over one mutex-protected FIFO (see
 * thread_pool.h). One queue and one condition variable are enough here:
 * jobs are whole serde batches (microseconds to seconds each), so lock
 * traffic on the queue is never the bottleneck.
 *
 * Spin, then sleep: a worker whose queue runs dry watches it for SPIN_NS
 * before it blocks on the condition variable. Waking a thread that sleeps
 * on an idle (virtual) CPU costs 40-50 us here, ten times the work of a
 * small task, while a caller in a submit -> poll -> query loop submits its
 * next task within a few microseconds. Measured on the 2-vCPU KVM machine:
 * condvar + eventfd ping-pong median 43 us without the spin, 4 us with it.
 * The price is at most SPIN_NS of one core's time per burst of work.
 *
 * The spin yields (sched_yield) between looks at the clock, so it only
 * uses a CPU nobody else wants. Without that a spinner kept its CPU from
 * a thread woken onto it (the scheduler does not preempt a task that has
 * just slept for one that wakes): with a caller and two pools chained (the
 * serde wrapper: processor worker, then adapter worker) on 2 vCPUs, a
 * store of one 8 KiB object waited out two spins: 115-127 us, against
 * 20-29 us with the yield and nothing else changed (docs/performance.md,
 * "Small objects through the serde wrapper"). */
#include "util/thread_pool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvserde/error.h"

#define SPIN_NS 50000 /* how long an idle worker watches the queue */
#define SPIN_PAUSES 16 /* pauses between looks at the clock (and yields) */

struct kvs_thread_pool {
    pthread_mutex_t mu;      /* guards head, tail, stopping */
    pthread_cond_t work;     /* signalled when a job arrives or on stop */
    kvs_job *head, *tail;
    int stopping;            /* no new jobs; workers exit once queue is empty */
    atomic_size_t queued;    /* jobs in the queue, for spinning workers to watch
                              * without the lock (changed under it) */

    pthread_mutex_t join_mu; /* serializes shutdown callers */
    int joined;              /* guarded by join_mu */

    unsigned nthreads;
    pthread_t threads[];
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Watch the queue for up to SPIN_NS without the lock. Only a hint: the
 * caller re-checks under the lock either way. */
static void spin_for_work(kvs_thread_pool *pool)
{
    uint64_t deadline = now_ns() + SPIN_NS;
    for (;;) {
        for (int i = 0; i < SPIN_PAUSES; i++) {
            if (atomic_load_explicit(&pool->queued, memory_order_relaxed) != 0)
                return;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        if (now_ns() >= deadline)
            return;
        sched_yield();
    }
}

static void *worker_main(void *arg)
{
    kvs_thread_pool *pool = arg;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        if (pool->head == NULL && !pool->stopping) {
            pthread_mutex_unlock(&pool->mu);
            spin_for_work(pool);
            pthread_mutex_lock(&pool->mu);
        }
        /* Check the queue before the stop flag: shutdown drains, it does not
         * drop queued jobs. */
        while (pool->head == NULL && !pool->stopping)
            pthread_cond_wait(&pool->work, &pool->mu);
        kvs_job *job = pool->head;
        if (job == NULL)
            break; /* stopping and drained */
        pool->head = job->next;
        if (pool->head == NULL)
            pool->tail = NULL;
        atomic_fetch_sub_explicit(&pool->queued, 1, memory_order_relaxed);
        pthread_mutex_unlock(&pool->mu);
        job->run(job); /* may free job */
        pthread_mutex_lock(&pool->mu);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

static void join_all(kvs_thread_pool *pool, unsigned n)
{
    pthread_mutex_lock(&pool->mu);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    for (unsigned i = 0; i < n; i++)
        pthread_join(pool->threads[i], NULL);
}

int kvs_thread_pool_create(unsigned nthreads, const char *name,
                           kvs_thread_pool **out)
{
    if (nthreads == 0)
        return kvs_set_error(KVS_EINVAL, "thread pool: need at least 1 thread");
    kvs_thread_pool *pool =
        calloc(1, sizeof *pool + (size_t)nthreads * sizeof(pthread_t));
    if (pool == NULL)
        return kvs_set_error(KVS_ENOMEM, "thread pool: out of memory for %u threads",
                             nthreads);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->work, NULL);
    pthread_mutex_init(&pool->join_mu, NULL);
    pool->nthreads = nthreads;

    /* New threads inherit the creating thread's signal mask: block all
     * signals around pthread_create so workers never run the host program's
     * handlers, then restore the caller's mask. */
    sigset_t all, saved;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &saved);
    int rc = KVS_OK;
    unsigned started = 0;
    for (; started < nthreads; started++) {
        int err = pthread_create(&pool->threads[started], NULL, worker_main, pool);
        if (err != 0) {
            rc = kvs_set_error(KVS_EIO, "thread pool: cannot start thread %u of %u: %s",
                               started + 1, nthreads, strerror(err));
            break;
        }
        if (name != NULL) {
            char tname[32];
            snprintf(tname, sizeof tname, "%.10s-%u", name, started);
            tname[15] = '\0'; /* the kernel's limit, NUL included */
            (void)pthread_setname_np(pool->threads[started], tname);
        }
    }
    pthread_sigmask(SIG_SETMASK, &saved, NULL);

    if (rc != KVS_OK) {
        join_all(pool, started);
        pthread_mutex_destroy(&pool->join_mu);
        pthread_cond_destroy(&pool->work);
        pthread_mutex_destroy(&pool->mu);
        free(pool);
        return rc;
    }
    *out = pool;
    return KVS_OK;
}

int kvs_thread_pool_submit(kvs_thread_pool *pool, kvs_job *job)
{
    pthread_mutex_lock(&pool->mu);
    if (pool->stopping) {
        pthread_mutex_unlock(&pool->mu);
        return kvs_set_error(KVS_ECLOSED, "thread pool: submit after shutdown");
    }
    job->next = NULL;
    if (pool->tail)
        pool->tail->next = job;
    else
        pool->head = job;
    pool->tail = job;
    atomic_fetch_add_explicit(&pool->queued, 1, memory_order_relaxed);
    /* One job, one wake-up: an idle worker takes it; busy workers find it
     * when they come back for the next job. */
    pthread_cond_signal(&pool->work);
    pthread_mutex_unlock(&pool->mu);
    return KVS_OK;
}

int kvs_thread_pool_shutdown(kvs_thread_pool *pool)
{
    pthread_t self = pthread_self();
    for (unsigned i = 0; i < pool->nthreads; i++)
        if (pthread_equal(self, pool->threads[i]))
            return kvs_set_error(KVS_EINVAL,
                                 "thread pool: shutdown called from its own worker %u",
                                 i);
    pthread_mutex_lock(&pool->join_mu);
    if (!pool->joined) {
        join_all(pool, pool->nthreads);
        pool->joined = 1;
    }
    pthread_mutex_unlock(&pool->join_mu);
    return KVS_OK;
}

void kvs_thread_pool_destroy(kvs_thread_pool *pool)
{
    if (pool == NULL)
        return;
    /* A destroy from a worker is a caller bug; joining is impossible then,
     * so leak rather than free memory the worker is still using. */
    if (kvs_thread_pool_shutdown(pool) != KVS_OK)
        return;
    pthread_mutex_destroy(&pool->join_mu);
    pthread_cond_destroy(&pool->work);
    pthread_mutex_destroy(&pool->mu);
    free(pool);
}

unsigned kvs_thread_pool_size(const kvs_thread_pool *pool) { return pool->nthreads; }
