/* test_processor_stress.c - the async processor under load.
 *
 * 4 submitting threads x 25,000 tasks (KVS_STRESS_TASKS overrides the total,
 * for valgrind runs) of random batches of 0 to 4 small objects, serialize and
 * deserialize interleaved, on a 2-worker processor whose serde fails on a
 * known subset of objects (then again with 1 and with 4 workers). One poller thread waits on both event fds with
 * poll(2), drains them, and pops results. Checked:
 *   - every id is answered exactly once, in the direction it was submitted,
 *     with the right state, status, failing index and message, and with
 *     dst objects transformed (and narrowed) up to the failure and untouched
 *     after it;
 *   - whenever the fds have counted n completions, n results can be popped
 *     (results are recorded before the signal);
 *   - a popped id is pending afterwards; an in-flight id asked of the other
 *     direction is pending and stays in place;
 *   - the eventfd counters add up to the task count per direction, exactly;
 *   - close while tasks are queued or running loses none of them, and leaves
 *     no thread and no fd behind.
 */
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvs_test.h"
#include "kvserde/processor.h"

#define NSUB 4
#define DEFAULT_TASKS 100000
#define WINDOW 32 /* tasks in flight per submitter */
#define MAXB 4    /* objects per batch: 0..MAXB */
#define OBJ 16    /* bytes per object */
#define SENTINEL 0xAA

enum { SER = 0, DE = 1 };

/* ---------------------------------------------------------------------
 * The serde. Object bytes: [0] 'F' = fail / 'K' = ok, [1..4] task seq,
 * [5] index in batch, [6] bytes serialize reports (1..OBJ), [7] 'S' = slow,
 * rest payload.
 * ------------------------------------------------------------------ */

static uint32_t obj_seq(const uint8_t *d)
{
    uint32_t s;
    memcpy(&s, d + 1, sizeof s);
    return s;
}

static int stress_transform(const kvs_memobj *src, kvs_memobj *dst, const char *dir)
{
    const uint8_t *d = src->data;
    /* The last tasks of each submitter are slow, so that close finds a
     * full queue to finish. */
    if (d[7] == 'S')
        usleep(100);
    if (d[0] == 'F')
        return kvs_set_error(KVS_ECORRUPT, "stress: %s of task %u object %u marked to fail",
                             dir, obj_seq(d), (unsigned)d[5]);
    memcpy(dst->data, d, OBJ);
    return KVS_OK;
}

static int s_serialize(kvs_serializer *self, const kvs_memobj *src, kvs_memobj *dst,
                       const kvs_object_key *key,
                       size_t *nwritten)
{
    (void)key;
    int rc = stress_transform(src, dst, "serialize");
    if (rc == KVS_OK)
        *nwritten = ((const uint8_t *)src->data)[6];
    return rc;
}

static int s_estimate(const kvs_serializer *self, const kvs_layout *l, size_t *n)
{
    *n = OBJ;
    return KVS_OK;
}

static int s_deserialize(kvs_deserializer *self, const kvs_memobj *src, kvs_memobj *dst,
                         const kvs_object_key *key)
{
    (void)key;
    return stress_transform(src, dst, "deserialize");
}

static void s_ser_destroy(kvs_serializer *s) { free(s); }
static void s_de_destroy(kvs_deserializer *d) { free(d); }

static const struct kvs_serializer_ops s_ser_ops = {"stress", s_serialize, s_estimate,
                                                    s_ser_destroy};
static const struct kvs_deserializer_ops s_de_ops = {"stress", s_deserialize, s_de_destroy};

/* The known failing subset. */
static int marked_to_fail(uint32_t seq, unsigned i) { return (seq * 7u + i * 13u) % 17u == 0; }

/* ---------------------------------------------------------------------
 * Submitters and their in-flight slots
 * ------------------------------------------------------------------ */

struct slot {
    int busy;
    kvs_task_id id;
    int dir;
    size_t n;
    uint32_t seq;
    int expect_fail;
    size_t fail_index;
    kvs_memobj src[MAXB], dst[MAXB];
    uint8_t sbuf[MAXB][OBJ], dbuf[MAXB][OBJ];
};

struct submitter {
    /* Held across submit + recording the id in a slot, and by the poller
     * while it scans: so once the poller holds it, every task this thread
     * got an id for is visible in a slot. */
    pthread_mutex_t mu;
    pthread_cond_t freed;
    struct slot slots[WINDOW];
    int inflight;
    int index;
    int ntasks;
    uint64_t rng;
    long submitted[2];
    int refused; /* submits that failed (must stay 0) */
};

static kvs_processor *proc;
static struct submitter subs[NSUB];
static atomic_int processor_closed;

/* Per id: how many times it was answered (ids < total tasks). */
static uint8_t *answered;
static long total_tasks;

/* Poller statistics. */
static uint64_t consumed[2], popped[2];
static long errors;
static long wakeups, cross_checks, repop_checks;

static void stress_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void stress_error(const char *fmt, ...)
{
    if (errors++ < 10) {
        va_list ap;
        va_start(ap, fmt);
        fprintf(stderr, "stress: ");
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
}

static uint64_t next_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void fill_slot(struct slot *sl, uint32_t seq, int dir, size_t n, int slow)
{
    kvs_layout layout;
    kvs_layout_flat(&layout, OBJ, KVS_DTYPE_UINT8);
    sl->seq = seq;
    sl->dir = dir;
    sl->n = n;
    sl->expect_fail = 0;
    sl->fail_index = 0;
    for (size_t i = 0; i < n; i++) {
        int fail = marked_to_fail(seq, (unsigned)i);
        if (fail && !sl->expect_fail) {
            sl->expect_fail = 1;
            sl->fail_index = i;
        }
        uint8_t *d = sl->sbuf[i];
        memset(d, (int)(seq + i), OBJ);
        d[0] = fail ? 'F' : 'K';
        memcpy(d + 1, &seq, sizeof seq);
        d[5] = (uint8_t)i;
        d[6] = (uint8_t)(1 + (seq + i) % OBJ);
        d[7] = slow ? 'S' : '-';
        memset(sl->dbuf[i], SENTINEL, OBJ);
        kvs_memobj_init(&sl->src[i], sl->sbuf[i], OBJ, &layout, KVS_FMT_BINARY_BUFFER);
        kvs_memobj_init(&sl->dst[i], sl->dbuf[i], OBJ, &layout, KVS_FMT_BINARY_BUFFER);
    }
}

static void *submitter_main(void *arg)
{
    struct submitter *s = arg;
    for (int t = 0; t < s->ntasks; t++) {
        uint64_t r = next_rand(&s->rng);
        int dir = (int)(r & 1);
        size_t n = (size_t)((r >> 8) % (MAXB + 1));
        uint32_t seq = (uint32_t)(s->index * s->ntasks + t);

        pthread_mutex_lock(&s->mu);
        while (s->inflight == WINDOW)
            pthread_cond_wait(&s->freed, &s->mu);
        struct slot *sl = NULL;
        for (int i = 0; i < WINDOW; i++)
            if (!s->slots[i].busy) {
                sl = &s->slots[i];
                break;
            }
        fill_slot(sl, seq, dir, n, t >= s->ntasks - WINDOW);
        kvs_memobj *src[MAXB], *dst[MAXB];
        for (size_t i = 0; i < n; i++) {
            src[i] = &sl->src[i];
            dst[i] = &sl->dst[i];
        }
        kvs_task_id id;
        int rc = dir == SER ? kvs_processor_submit_serialize(proc, src, n, dst, n, NULL, &id)
                            : kvs_processor_submit_deserialize(proc, src, n, dst, n, NULL, &id);
        if (rc == KVS_OK) {
            sl->busy = 1;
            sl->id = id;
            s->inflight++;
            s->submitted[dir]++;
        } else {
            s->refused++;
        }
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

/* ---------------------------------------------------------------------
 * The poller
 * ------------------------------------------------------------------ */

static void check_result(const struct slot *sl, const kvs_task_result *r)
{
    const char *dname = sl->dir == SER ? "serialize" : "deserialize";
    if (sl->id >= (kvs_task_id)total_tasks) {
        stress_error("id %llu out of range", (unsigned long long)sl->id);
        return;
    }
    if (answered[sl->id]++ != 0)
        stress_error("id %llu answered twice", (unsigned long long)sl->id);
    kvs_task_state want = sl->expect_fail ? KVS_TASK_FAILED : KVS_TASK_OK;
    if (r->state != want) {
        stress_error("task %u (%s, %zu objects): state %d, expected %d", sl->seq, dname, sl->n,
              (int)r->state, (int)want);
        return;
    }
    size_t done = sl->n;
    if (sl->expect_fail) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg,
                 "processor: %s object %zu of %zu failed: stress: %s of task %u object %zu "
                 "marked to fail",
                 dname, sl->fail_index, sl->n, dname, sl->seq, sl->fail_index);
        if (r->status != KVS_ECORRUPT || r->failed_index != sl->fail_index ||
            strcmp(r->message, msg) != 0)
            stress_error("task %u: got status %d index %zu message \"%s\", expected \"%s\"", sl->seq,
                  r->status, r->failed_index, r->message, msg);
        done = sl->fail_index;
    } else if (r->status != KVS_OK || r->message[0] != '\0') {
        stress_error("task %u: OK with status %d message \"%s\"", sl->seq, r->status, r->message);
    }
    for (size_t i = 0; i < sl->n; i++) {
        const kvs_memobj *d = &sl->dst[i];
        if (i < done) {
            size_t want_used = sl->dir == SER ? sl->sbuf[i][6] : OBJ;
            if (d->used_size != want_used || memcmp(sl->dbuf[i], sl->sbuf[i], OBJ) != 0)
                stress_error("task %u object %zu: not transformed as expected (used %zu, want %zu)",
                      sl->seq, i, d->used_size, want_used);
        } else {
            int untouched = d->used_size == OBJ;
            for (int b = 0; b < OBJ; b++)
                untouched &= sl->dbuf[i][b] == SENTINEL;
            if (!untouched)
                stress_error("task %u object %zu: touched after the failure", sl->seq, i);
        }
    }
}

static int query_dir(int dir, kvs_task_id id, kvs_task_result *r)
{
    return dir == SER ? kvs_processor_query_serialize_result(proc, id, r)
                      : kvs_processor_query_deserialize_result(proc, id, r);
}

/* Pop every finished task; returns the number of tasks still in flight. */
static long scan(void)
{
    long left = 0;
    kvs_task_result r;
    for (int s = 0; s < NSUB; s++) {
        struct submitter *sub = &subs[s];
        pthread_mutex_lock(&sub->mu);
        for (int i = 0; i < WINDOW; i++) {
            struct slot *sl = &sub->slots[i];
            if (!sl->busy)
                continue;
            /* Now and then ask the other direction first: pending, and it
             * must not take the result away. */
            if ((sl->id % 7) == 0) {
                cross_checks++;
                if (query_dir(!sl->dir, sl->id, &r) != KVS_OK || r.state != KVS_TASK_PENDING)
                    stress_error("id %llu answered by the other direction",
                          (unsigned long long)sl->id);
            }
            if (query_dir(sl->dir, sl->id, &r) != KVS_OK) {
                stress_error("query failed: %s", kvs_last_error());
                continue;
            }
            if (r.state == KVS_TASK_PENDING) {
                left++;
                continue;
            }
            check_result(sl, &r);
            popped[sl->dir]++;
            if ((sl->id % 5) == 0) {
                repop_checks++;
                if (query_dir(sl->dir, sl->id, &r) != KVS_OK || r.state != KVS_TASK_PENDING)
                    stress_error("id %llu answered again", (unsigned long long)sl->id);
            }
            sl->busy = 0;
            sub->inflight--;
            pthread_cond_signal(&sub->freed);
        }
        pthread_mutex_unlock(&sub->mu);
    }
    return left;
}

static int fds[2];

static void consume_both(void)
{
    for (int d = 0; d < 2; d++) {
        uint64_t c = 0;
        if (kvs_event_fd_consume(fds[d], &c) != KVS_OK)
            stress_error("consume failed: %s", kvs_last_error());
        consumed[d] += c;
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *poller_main(void *arg)
{
    double deadline = now_s() + 600;
    for (;;) {
        /* Read the flag before the pass: a pass that starts after close
         * returned must find every task finished. */
        int closed = atomic_load(&processor_closed);
        struct pollfd pfd[2] = {{fds[SER], POLLIN, 0}, {fds[DE], POLLIN, 0}};
        if (poll(pfd, 2, 10) > 0)
            wakeups++;
        consume_both();
        long left = scan();
        /* Every completion the fds have counted must be poppable by now. */
        for (int d = 0; d < 2; d++)
            if (popped[d] < consumed[d])
                stress_error("%s: fd counted %llu completions but only %llu results were there",
                      d == SER ? "serialize" : "deserialize",
                      (unsigned long long)consumed[d], (unsigned long long)popped[d]);
        if (closed) {
            if (left != 0)
                stress_error("%ld tasks still pending after close", left);
            break;
        }
        if (now_s() > deadline) {
            stress_error("timed out with %ld tasks in flight", left);
            break;
        }
    }
    return arg;
}

static int count_dir(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

static void stress_round(unsigned workers)
{
    const char *env = getenv("KVS_STRESS_TASKS");
    total_tasks = env ? atol(env) : DEFAULT_TASKS;
    REQUIRE(total_tasks >= NSUB);
    total_tasks -= total_tasks % NSUB;
    answered = calloc((size_t)total_tasks, 1);
    REQUIRE(answered != NULL);
    memset(consumed, 0, sizeof consumed);
    memset(popped, 0, sizeof popped);
    errors = wakeups = cross_checks = repop_checks = 0;
    atomic_store(&processor_closed, 0);
    int threads_before = count_dir("/proc/self/task");
    int fds_before = count_dir("/proc/self/fd");

    kvs_serializer *ser = malloc(sizeof *ser);
    kvs_deserializer *de = malloc(sizeof *de);
    ser->ops = &s_ser_ops;
    de->ops = &s_de_ops;
    REQUIRE_OK(kvs_async_processor_create(ser, de, workers, &proc));
    /* dup: the counters stay readable after close closes the originals. */
    fds[SER] = dup(kvs_processor_serialize_event_fd(proc));
    fds[DE] = dup(kvs_processor_deserialize_event_fd(proc));
    REQUIRE(fds[SER] >= 0 && fds[DE] >= 0);

    double t0 = now_s();
    pthread_t poller, th[NSUB];
    /* The submitters' state first: the poller scans it from its start. */
    for (int s = 0; s < NSUB; s++) {
        subs[s] = (struct submitter){.index = s,
                                     .ntasks = (int)(total_tasks / NSUB),
                                     .rng = 0x9E3779B97F4A7C15ULL * (uint64_t)(s + 1)};
        pthread_mutex_init(&subs[s].mu, NULL);
        pthread_cond_init(&subs[s].freed, NULL);
    }
    REQUIRE(pthread_create(&poller, NULL, poller_main, NULL) == 0);
    for (int s = 0; s < NSUB; s++)
        REQUIRE(pthread_create(&th[s], NULL, submitter_main, &subs[s]) == 0);
    for (int s = 0; s < NSUB; s++)
        pthread_join(th[s], NULL);

    /* Close with tasks still queued and running (up to NSUB * WINDOW). */
    long inflight_at_close = 0;
    for (int s = 0; s < NSUB; s++) {
        pthread_mutex_lock(&subs[s].mu);
        inflight_at_close += subs[s].inflight;
        pthread_mutex_unlock(&subs[s].mu);
    }
    CHECK_OK(kvs_processor_close(proc));
    atomic_store(&processor_closed, 1);
    pthread_join(poller, NULL);
    double elapsed = now_s() - t0;

    /* The last completions may have landed after the poller's last read. */
    consume_both();
    long submitted[2] = {0, 0};
    int refused = 0;
    for (int s = 0; s < NSUB; s++) {
        submitted[SER] += subs[s].submitted[SER];
        submitted[DE] += subs[s].submitted[DE];
        refused += subs[s].refused;
    }
    CHECK_EQ_INT(refused, 0);
    CHECK_EQ_INT(submitted[SER] + submitted[DE], total_tasks);
    CHECK_EQ_U64(consumed[SER], (uint64_t)submitted[SER]);
    CHECK_EQ_U64(consumed[DE], (uint64_t)submitted[DE]);
    CHECK_EQ_U64(popped[SER], (uint64_t)submitted[SER]);
    CHECK_EQ_U64(popped[DE], (uint64_t)submitted[DE]);
    long once = 0;
    for (long i = 0; i < total_tasks; i++)
        once += answered[i] == 1;
    CHECK_EQ_INT(once, total_tasks);
    CHECK_EQ_INT(errors, 0);

    kvs_processor_destroy(proc);
    close(fds[SER]);
    close(fds[DE]);
    for (int s = 0; s < NSUB; s++) {
        pthread_mutex_destroy(&subs[s].mu);
        pthread_cond_destroy(&subs[s].freed);
    }
    /* A joined thread can linger in /proc for a moment. */
    int threads_after = count_dir("/proc/self/task");
    for (int i = 0; i < 2000 && threads_after != threads_before; i++) {
        usleep(1000);
        threads_after = count_dir("/proc/self/task");
    }
    CHECK_EQ_INT(threads_after, threads_before);
    CHECK_EQ_INT(count_dir("/proc/self/fd"), fds_before);
    free(answered);
    printf("stress: %u workers: %ld tasks (%ld serialize, %ld deserialize) in %.2f s, %ld in flight at "
           "close, %ld poller wake-ups, %ld cross-direction and %ld re-pop checks\n",
           workers, total_tasks, submitted[SER], submitted[DE], elapsed, inflight_at_close, wakeups,
           cross_checks, repop_checks);
}

/* The machine has 2 cores: 2 workers is the configuration that matters;
 * 1 (the default) and 4 (more workers than cores) change the interleaving. */
static void test_stress_2_workers(void) { stress_round(2); }
static void test_stress_1_worker(void) { stress_round(1); }
static void test_stress_4_workers(void) { stress_round(4); }

static void *nothing(void *arg) { return arg; }

int main(void)
{
    /* Sanitizer runtimes start a helper thread with the first thread the
     * program creates; start it now, so the thread counts that the rounds
     * compare see only the processor's threads. */
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) == 0)
        pthread_join(t, NULL);
    usleep(20000);
    /* A lost wake-up or a deadlock in close would hang: fail instead. */
    alarm(600);
    RUN(test_stress_2_workers);
    RUN(test_stress_1_worker);
    RUN(test_stress_4_workers);
    return TEST_SUMMARY();
}
