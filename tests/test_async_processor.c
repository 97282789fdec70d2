/* test_async_processor.c - the async serde processor (upstream
 * test_async_processor.py, group A cases 1-10, translated to C) and every
 * decision of DESIGN.md section 3 that the processor implements, each with a
 * test that fails without it. Exact codes and messages throughout. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvs_test.h"
#include "kvserde/fp8.h"
#include "kvserde/memobj.h"
#include "kvserde/processor.h"
#include "kvserde/registry.h"
#include "kvserde/serde.h"
#include "serde/processor_hooks.h"

/* ---------------------------------------------------------------------
 * A fake serde whose behaviour each test sets (upstream's fake serializer
 * returns 1 and estimates 1). An object whose first byte is FAIL_MARK fails
 * with fail_status / fail_message. A closed gate holds every transform at
 * its start, so tests can observe queued and running tasks.
 * ------------------------------------------------------------------ */

#define FAIL_MARK 0xEE
#define LOG_MAX 64

static struct fake_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int gate_closed;
    int entered;     /* transforms started (both directions) */
    int ser_calls;   /* serialize calls that got past the gate */
    int de_calls;
    size_t nwritten; /* what serialize reports */
    size_t estimate;
    int fail_status;
    char fail_message[KVS_ERROR_MSG_MAX];
    const kvs_memobj *log[LOG_MAX]; /* src objects in the order transformed */
    int nlog;
    int ser_destroyed, de_destroyed;
    kvs_processor *close_target; /* serialize calls close on it if set */
    int close_rc;
    char close_msg[KVS_ERROR_MSG_MAX];
} S = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void fake_reset(void)
{
    pthread_mutex_lock(&S.mu);
    S.gate_closed = 0;
    S.entered = S.ser_calls = S.de_calls = 0;
    S.nwritten = 1;
    S.estimate = 1;
    S.fail_status = KVS_ECORRUPT;
    snprintf(S.fail_message, sizeof S.fail_message, "fake: object marked to fail");
    S.nlog = 0;
    S.ser_destroyed = S.de_destroyed = 0;
    S.close_target = NULL;
    S.close_rc = 0;
    S.close_msg[0] = '\0';
    pthread_mutex_unlock(&S.mu);
}

static void gate_close(void)
{
    pthread_mutex_lock(&S.mu);
    S.gate_closed = 1;
    pthread_mutex_unlock(&S.mu);
}

static void gate_open(void)
{
    pthread_mutex_lock(&S.mu);
    S.gate_closed = 0;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
}

static int fake_get(const int *field)
{
    pthread_mutex_lock(&S.mu);
    int v = *field;
    pthread_mutex_unlock(&S.mu);
    return v;
}

/* Wait (up to 2 s) until `n` transforms have entered the fake. */
static int wait_entered(int n)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 2;
    pthread_mutex_lock(&S.mu);
    int rc = 0;
    while (S.entered < n && rc == 0)
        rc = pthread_cond_timedwait(&S.cv, &S.mu, &deadline);
    int ok = S.entered >= n;
    pthread_mutex_unlock(&S.mu);
    return ok;
}

static void fake_enter(const kvs_memobj *src, int *calls)
{
    pthread_mutex_lock(&S.mu);
    S.entered++;
    if (S.nlog < LOG_MAX)
        S.log[S.nlog++] = src;
    pthread_cond_broadcast(&S.cv);
    while (S.gate_closed)
        pthread_cond_wait(&S.cv, &S.mu);
    (*calls)++;
    pthread_mutex_unlock(&S.mu);
}

static int fake_serialize(kvs_serializer *self, const kvs_memobj *src, kvs_memobj *dst,
                          const kvs_object_key *key,
                          size_t *nwritten)
{
    (void)key;
    fake_enter(src, &S.ser_calls);
    if (S.close_target != NULL) {
        S.close_rc = kvs_processor_close(S.close_target);
        snprintf(S.close_msg, sizeof S.close_msg, "%s", kvs_last_error());
    }
    if (src->capacity > 0 && ((const uint8_t *)src->data)[0] == FAIL_MARK)
        return kvs_set_error(S.fail_status, "%s", S.fail_message);
    size_t n = src->used_size < dst->capacity ? src->used_size : dst->capacity;
    memcpy(dst->data, src->data, n);
    *nwritten = S.nwritten;
    return KVS_OK;
}

static int fake_estimate(const kvs_serializer *self, const kvs_layout *layout,
                         size_t *nbytes)
{
    *nbytes = S.estimate;
    return KVS_OK;
}

static void fake_ser_destroy(kvs_serializer *self)
{
    S.ser_destroyed++;
    free(self);
}

static int fake_deserialize(kvs_deserializer *self, const kvs_memobj *src,
                            kvs_memobj *dst, const kvs_object_key *key)
{
    (void)key;
    fake_enter(src, &S.de_calls);
    if (src->capacity > 0 && ((const uint8_t *)src->data)[0] == FAIL_MARK)
        return kvs_set_error(S.fail_status, "%s", S.fail_message);
    size_t n = src->used_size < dst->capacity ? src->used_size : dst->capacity;
    memcpy(dst->data, src->data, n);
    return KVS_OK;
}

static void fake_de_destroy(kvs_deserializer *self)
{
    S.de_destroyed++;
    free(self);
}

static const struct kvs_serializer_ops fake_ser_ops = {"fake", fake_serialize,
                                                       fake_estimate, fake_ser_destroy};
static const struct kvs_deserializer_ops fake_de_ops = {"fake", fake_deserialize,
                                                        fake_de_destroy};

static kvs_serializer *fake_ser(void)
{
    kvs_serializer *s = malloc(sizeof *s);
    s->ops = &fake_ser_ops;
    return s;
}

static kvs_deserializer *fake_de(void)
{
    kvs_deserializer *d = malloc(sizeof *d);
    d->ops = &fake_de_ops;
    return d;
}

/* A processor around a fresh fake pair. */
static kvs_processor *make_proc(unsigned workers)
{
    fake_reset();
    kvs_processor *p = NULL;
    if (kvs_async_processor_create(fake_ser(), fake_de(), workers, &p) != KVS_OK) {
        fprintf(stderr, "create failed: %s\n", kvs_last_error());
        return NULL;
    }
    return p;
}

/* ---------------------------------------------------------------------
 * Objects and waiting
 * ------------------------------------------------------------------ */

#define OBJ_BYTES 4096

typedef struct buf_obj {
    kvs_memobj obj;
    uint8_t data[OBJ_BYTES];
} buf_obj;

/* A flat uint8 object of OBJ_BYTES bytes filled with `fill`. */
static void make_obj(buf_obj *b, uint8_t fill)
{
    kvs_layout layout;
    kvs_layout_flat(&layout, OBJ_BYTES, KVS_DTYPE_UINT8);
    memset(b->data, fill, sizeof b->data);
    kvs_memobj_init(&b->obj, b->data, sizeof b->data, &layout, KVS_FMT_BINARY_BUFFER);
}

/* upstream _wait_for_fd: wait for POLLIN (2 s), then drain the counter.
 * Returns the counter (0 on timeout). */
static uint64_t wait_signal(int fd, int timeout_ms)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) != 1 || !(pfd.revents & POLLIN))
        return 0;
    uint64_t count = 0;
    kvs_event_fd_consume(fd, &count);
    return count;
}

enum { SER, DE };

static int query(kvs_processor *p, int dir, kvs_task_id id, kvs_task_result *r)
{
    return dir == SER ? kvs_processor_query_serialize_result(p, id, r)
                      : kvs_processor_query_deserialize_result(p, id, r);
}

static int submit(kvs_processor *p, int dir, kvs_memobj *const *src, size_t nsrc,
                  kvs_memobj *const *dst, size_t ndst, kvs_task_id *id)
{
    return dir == SER ? kvs_processor_submit_serialize(p, src, nsrc, dst, ndst, NULL, id)
                      : kvs_processor_submit_deserialize(p, src, nsrc, dst, ndst, NULL, id);
}

static int event_fd(kvs_processor *p, int dir)
{
    return dir == SER ? kvs_processor_serialize_event_fd(p)
                      : kvs_processor_deserialize_event_fd(p);
}

/* Query until the task is done (2 s), without touching the fd. */
static kvs_task_state wait_done(kvs_processor *p, int dir, kvs_task_id id,
                                kvs_task_result *r)
{
    for (int i = 0; i < 2000; i++) {
        if (query(p, dir, id, r) != KVS_OK)
            return KVS_TASK_PENDING;
        if (r->state != KVS_TASK_PENDING)
            return r->state;
        usleep(1000);
    }
    return KVS_TASK_PENDING;
}

static int count_threads(void)
{
    DIR *d = opendir("/proc/self/task");
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

/* Threads of this process once the count has settled at `expect` (or after
 * 2 s): a joined thread can linger in /proc for a moment after
 * pthread_join returns. */
static int threads_settle(int expect)
{
    int n = count_threads();
    for (int i = 0; i < 2000 && n != expect; i++) {
        usleep(1000);
        n = count_threads();
    }
    return n;
}

/* This program's threads when no processor exists: main, plus a sanitizer's
 * helper thread if any (measured in main()). */
static int base_threads;

static int fd_is_open(int fd) { return fcntl(fd, F_GETFD) != -1 || errno != EBADF; }

/* =====================================================================
 * Upstream group A, cases 1-10
 * ================================================================== */

/* A1: the two event fds are distinct. */
static void test_fds_are_distinct(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    int sfd = kvs_processor_serialize_event_fd(p);
    int dfd = kvs_processor_deserialize_event_fd(p);
    CHECK(sfd >= 0);
    CHECK(dfd >= 0);
    CHECK(sfd != dfd);
    kvs_processor_destroy(p);
}

/* A2 (and A3 for the other direction): the fd is signalled, the result is
 * OK once and then pending, the transform ran exactly once. */
static void check_signals_and_pops(int dir)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    buf_obj a, b;
    make_obj(&a, 1);
    make_obj(&b, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj};
    kvs_task_id id = 99;
    REQUIRE_OK(submit(p, dir, src, 1, dst, 1, &id));
    CHECK_EQ_U64(id, 0);
    CHECK_EQ_U64(wait_signal(event_fd(p, dir), 2000), 1);
    kvs_task_result r;
    CHECK_OK(query(p, dir, id, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_INT(r.status, KVS_OK);
    CHECK_EQ_STR(r.message, "");
    CHECK_OK(query(p, dir, id, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_PENDING);
    CHECK_EQ_INT(fake_get(dir == SER ? &S.ser_calls : &S.de_calls), 1);
    CHECK_EQ_INT(fake_get(dir == SER ? &S.de_calls : &S.ser_calls), 0);
    kvs_processor_destroy(p);
}

static void test_serialize_signals_fd_and_result_is_ok(void) { check_signals_and_pops(SER); }

/* A3 */
static void test_deserialize_signals_fd_and_result_is_ok(void) { check_signals_and_pops(DE); }

/* A4: a failing serializer still signals; the result is FAILED and carries
 * the first error. The same on the deserialize side (upstream 13). */
static void check_failure_reported(int dir)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    buf_obj a, b;
    make_obj(&a, FAIL_MARK);
    make_obj(&b, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj};
    kvs_task_id id;
    REQUIRE_OK(submit(p, dir, src, 1, dst, 1, &id));
    CHECK_EQ_U64(wait_signal(event_fd(p, dir), 2000), 1);
    kvs_task_result r;
    CHECK_OK(query(p, dir, id, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(r.status, KVS_ECORRUPT);
    CHECK_EQ_U64(r.failed_index, 0);
    CHECK_EQ_STR(r.message, dir == SER
                                ? "processor: serialize object 0 of 1 failed: fake: object "
                                  "marked to fail"
                                : "processor: deserialize object 0 of 1 failed: fake: "
                                  "object marked to fail");
    /* Popped once, like a success. */
    CHECK_OK(query(p, dir, id, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_PENDING);
    CHECK_EQ_INT(r.status, KVS_OK);
    CHECK_EQ_STR(r.message, "");
    kvs_processor_destroy(p);
}

static void test_serialize_failure_reports_failed(void) { check_failure_reported(SER); }

static void test_deserialize_failure_reports_failed(void) { check_failure_reported(DE); }

/* A5: an id never submitted is pending on both sides, with no error. */
static void test_query_unknown_id_is_pending(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    kvs_task_result r;
    memset(&r, 0x5A, sizeof r);
    kvs_clear_error();
    CHECK_OK(kvs_processor_query_serialize_result(p, 42, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_PENDING);
    CHECK_EQ_INT(r.status, KVS_OK);
    CHECK_EQ_U64(r.failed_index, 0);
    CHECK_EQ_STR(r.message, "");
    memset(&r, 0x5A, sizeof r);
    CHECK_OK(kvs_processor_query_deserialize_result(p, 42, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_PENDING);
    CHECK_EQ_STR(kvs_last_error(), "");
    kvs_processor_destroy(p);
}

/* A6: estimate is the serializer's, with no extra factor. */
static void test_estimate_delegates(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    kvs_layout empty;
    REQUIRE_OK(kvs_layout_init(&empty, 0, NULL, 0, NULL));
    size_t n = 0;
    CHECK_OK(kvs_processor_estimate_serialized_size(p, &empty, &n));
    CHECK_EQ_U64(n, 1);
    S.estimate = 12345;
    CHECK_OK(kvs_processor_estimate_serialized_size(p, &empty, &n));
    CHECK_EQ_U64(n, 12345);
    /* Still answers after close (the serializer lives until destroy). */
    CHECK_OK(kvs_processor_close(p));
    CHECK_OK(kvs_processor_estimate_serialized_size(p, &empty, &n));
    CHECK_EQ_U64(n, 12345);
    CHECK_ERR(kvs_processor_estimate_serialized_size(p, NULL, &n), KVS_EINVAL,
              "processor: layout pointer is NULL");
    CHECK_ERR(kvs_processor_estimate_serialized_size(p, &empty, NULL), KVS_EINVAL,
              "processor: size pointer is NULL");
    kvs_processor_destroy(p);
}

/* A7: a successful serialize narrows dst's used size to the bytes written. */
static void test_serialize_narrows_dst_to_bytes_written(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    S.nwritten = 213;
    buf_obj a, b;
    make_obj(&a, 7);
    make_obj(&b, 0);
    CHECK_EQ_U64(b.obj.used_size, OBJ_BYTES);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj};
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    kvs_task_result r;
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    CHECK_EQ_U64(b.obj.used_size, 213);
    CHECK_EQ_U64(kvs_memobj_size(&b.obj), 213);
    CHECK_EQ_U64(b.obj.capacity, OBJ_BYTES);
    kvs_processor_destroy(p);
}

/* A8: a failed serialize narrows nothing. */
static void test_serialize_failure_does_not_narrow_dst(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    S.nwritten = 213;
    buf_obj a, b;
    make_obj(&a, FAIL_MARK);
    make_obj(&b, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj};
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    kvs_task_result r;
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_FAILED);
    CHECK_EQ_U64(b.obj.used_size, OBJ_BYTES);
    kvs_processor_destroy(p);
}

/* A9, translated: upstream checks that a dst without set_used_size still
 * works. Every kvs_memobj can be narrowed, so the C counterpart is that the
 * used size is SET to the bytes written, whatever it was before: widened back
 * to the full capacity, or narrowed to 0. */
static void test_serialize_sets_used_size_exactly(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    buf_obj a, b;
    make_obj(&a, 7);
    make_obj(&b, 0);
    REQUIRE_OK(kvs_memobj_set_used_size(&b.obj, 10));
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj};
    kvs_task_id id;
    kvs_task_result r;
    S.nwritten = OBJ_BYTES;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    CHECK_EQ_U64(b.obj.used_size, OBJ_BYTES);
    S.nwritten = 0;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    CHECK_EQ_U64(b.obj.used_size, 0);
    kvs_processor_destroy(p);
}

/* A10, translated: upstream skips narrowing when the serializer returns a
 * non-int. In C the count is always a size_t; the only count that cannot be
 * applied is one beyond dst's capacity. kvserde decides that such a
 * serializer is broken: the object fails (memobj's message says why) and
 * dst keeps its used size, rather than a silent success. */
static void test_serializer_reporting_too_many_bytes_fails(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    buf_obj a, b;
    make_obj(&a, 7);
    make_obj(&b, 0);
    S.nwritten = OBJ_BYTES + 1;
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj};
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    kvs_task_result r;
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_FAILED);
    CHECK_EQ_INT(r.status, KVS_EINVAL);
    CHECK_EQ_STR(r.message, "processor: serialize object 0 of 1 failed: memobj: "
                            "set_used_size: n=4097 out of range [0, 4096]");
    CHECK_EQ_U64(b.obj.used_size, OBJ_BYTES);
    kvs_processor_destroy(p);
}

/* =====================================================================
 * Decisions (DESIGN.md section 3 and the issue)
 * ================================================================== */

/* Event fds are eventfds, non-blocking and close-on-exec. */
static void test_event_fds_are_nonblocking_cloexec_eventfds(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    for (int dir = SER; dir <= DE; dir++) {
        int fd = event_fd(p, dir);
        REQUIRE(fd >= 0);
        CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK);
        CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
        char path[64], link[128] = {0};
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        CHECK(readlink(path, link, sizeof link - 1) > 0);
        CHECK_EQ_STR(link, "anon_inode:[eventfd]");
        /* The same fd every time. */
        CHECK_EQ_INT(event_fd(p, dir), fd);
    }
    kvs_processor_destroy(p);
}

/* Ids: one counter shared by both directions, from 0; empty batches take
 * ids too; a refused submit takes none. */
static void test_task_ids_one_counter_from_zero(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    buf_obj a, b;
    make_obj(&a, 1);
    make_obj(&b, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj, &b.obj};
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    CHECK_EQ_U64(id, 0);
    REQUIRE_OK(kvs_processor_submit_deserialize(p, src, 1, dst, 1, NULL, &id));
    CHECK_EQ_U64(id, 1);
    REQUIRE_OK(kvs_processor_submit_serialize(p, NULL, 0, NULL, 0, NULL, &id));
    CHECK_EQ_U64(id, 2);
    REQUIRE_OK(kvs_processor_submit_deserialize(p, NULL, 0, NULL, 0, NULL, &id));
    CHECK_EQ_U64(id, 3);
    id = 77;
    CHECK_ERR(kvs_processor_submit_serialize(p, src, 1, dst, 2, NULL, &id), KVS_EINVAL,
              "processor: 1 sources but 2 destinations");
    CHECK_EQ_U64(id, 77); /* untouched */
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    CHECK_EQ_U64(id, 4);
    kvs_processor_destroy(p);
}

/* Exactly one eventfd write of 1 per finished task, success or failure: the
 * counters add up to the task counts per direction, and nothing more comes
 * later. */
static void test_one_signal_per_task(void)
{
    kvs_processor *p = make_proc(2);
    REQUIRE(p != NULL);
    enum { NS = 10, ND = 7 };
    buf_obj *objs = calloc(2 * (NS + ND), sizeof *objs);
    REQUIRE(objs != NULL);
    kvs_task_id ids[NS + ND];
    for (int i = 0; i < NS + ND; i++) {
        make_obj(&objs[2 * i], i % 3 == 0 ? FAIL_MARK : 1);
        make_obj(&objs[2 * i + 1], 0);
        kvs_memobj *src[] = {&objs[2 * i].obj}, *dst[] = {&objs[2 * i + 1].obj};
        REQUIRE_OK(submit(p, i < NS ? SER : DE, src, 1, dst, 1, &ids[i]));
    }
    int failed = 0;
    for (int i = 0; i < NS + ND; i++) {
        kvs_task_result r;
        kvs_task_state st = wait_done(p, i < NS ? SER : DE, ids[i], &r);
        CHECK(st != KVS_TASK_PENDING);
        failed += st == KVS_TASK_FAILED;
    }
    CHECK_EQ_INT(failed, 6); /* i = 0, 3, 6, 9, 12, 15 */
    /* A result is recorded before its signal, so the last signals may still
     * be on their way: collect until the totals are in (2 s at most). */
    uint64_t cs = 0, cd = 0, c;
    for (int i = 0; i < 2000 && (cs < NS || cd < ND); i++) {
        CHECK_OK(kvs_event_fd_consume(kvs_processor_serialize_event_fd(p), &c));
        cs += c;
        CHECK_OK(kvs_event_fd_consume(kvs_processor_deserialize_event_fd(p), &c));
        cd += c;
        if (cs < NS || cd < ND)
            usleep(1000);
    }
    CHECK_EQ_U64(cs, NS);
    CHECK_EQ_U64(cd, ND);
    /* And nothing more comes. */
    usleep(20000);
    CHECK_OK(kvs_event_fd_consume(kvs_processor_serialize_event_fd(p), &cs));
    CHECK_OK(kvs_event_fd_consume(kvs_processor_deserialize_event_fd(p), &cd));
    CHECK_EQ_U64(cs, 0);
    CHECK_EQ_U64(cd, 0);
    free(objs);
    kvs_processor_destroy(p);
}

/* The result is recorded before the fd is signalled: whenever the fd says
 * n tasks finished, n results are there to pop. (Signalling first would
 * leave a window in which this sees "pending"; the stress test checks the
 * same invariant a hundred thousand times.) */
static void test_result_recorded_before_signal(void)
{
    kvs_processor *p = make_proc(2);
    REQUIRE(p != NULL);
    buf_obj a, b;
    make_obj(&a, 1);
    make_obj(&b, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj};
    int fd = kvs_processor_serialize_event_fd(p);
    int early = 0;
    for (int i = 0; i < 2000; i++) {
        kvs_task_id id;
        REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
        uint64_t c = wait_signal(fd, 2000);
        CHECK_EQ_U64(c, 1);
        kvs_task_result r;
        CHECK_OK(kvs_processor_query_serialize_result(p, id, &r));
        early += r.state == KVS_TASK_PENDING;
        if (r.state == KVS_TASK_PENDING)
            wait_done(p, SER, id, &r);
    }
    CHECK_EQ_INT(early, 0);
    kvs_processor_destroy(p);
}

/* A serialize id asked of the deserialize side is pending, and that query
 * does not consume it. */
static void test_other_directions_id_is_pending(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    buf_obj a, b;
    make_obj(&a, 1);
    make_obj(&b, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj};
    kvs_task_id sid, did;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &sid));
    CHECK_EQ_U64(wait_signal(kvs_processor_serialize_event_fd(p), 2000), 1);
    REQUIRE_OK(kvs_processor_submit_deserialize(p, src, 1, dst, 1, NULL, &did));
    CHECK_EQ_U64(wait_signal(kvs_processor_deserialize_event_fd(p), 2000), 1);
    kvs_task_result r;
    CHECK_OK(kvs_processor_query_deserialize_result(p, sid, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_PENDING);
    CHECK_OK(kvs_processor_query_serialize_result(p, did, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_PENDING);
    CHECK_OK(kvs_processor_query_serialize_result(p, sid, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_OK(kvs_processor_query_deserialize_result(p, did, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    kvs_processor_destroy(p);
}

/* A batch runs in order and stops at its first failing object: earlier
 * objects are written and narrowed (no rollback, as upstream), the failing
 * one and later ones are untouched; the result names the object. */
static void test_batch_stops_at_first_failure(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    S.nwritten = 100;
    S.fail_status = KVS_ENOSPC;
    snprintf(S.fail_message, sizeof S.fail_message,
             "fake: destination too small: 1024 bytes, need 4096");
    enum { N = 5, BAD = 2 };
    buf_obj *o = calloc(2 * N, sizeof *o);
    REQUIRE(o != NULL);
    kvs_memobj *src[N], *dst[N];
    for (int i = 0; i < N; i++) {
        make_obj(&o[i], i == BAD || i == BAD + 1 ? FAIL_MARK : (uint8_t)(10 + i));
        make_obj(&o[N + i], 0);
        src[i] = &o[i].obj;
        dst[i] = &o[N + i].obj;
    }
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, N, dst, N, NULL, &id));
    kvs_task_result r;
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_FAILED);
    CHECK_EQ_INT(r.status, KVS_ENOSPC);
    CHECK_EQ_U64(r.failed_index, BAD);
    CHECK_EQ_STR(r.message, "processor: serialize object 2 of 5 failed: fake: destination "
                            "too small: 1024 bytes, need 4096");
    CHECK_EQ_INT(fake_get(&S.ser_calls), BAD + 1);
    pthread_mutex_lock(&S.mu);
    CHECK_EQ_INT(S.nlog, BAD + 1);
    for (int i = 0; i < S.nlog && i < N; i++)
        CHECK(S.log[i] == src[i]);
    pthread_mutex_unlock(&S.mu);
    for (int i = 0; i < N; i++) {
        if (i < BAD) {
            CHECK_EQ_U64(dst[i]->used_size, 100);
            CHECK_EQ_INT(o[N + i].data[0], 10 + i);
        } else {
            CHECK_EQ_U64(dst[i]->used_size, OBJ_BYTES);
            CHECK_EQ_INT(o[N + i].data[0], 0);
        }
    }
    free(o);
    kvs_processor_destroy(p);
}

/* A whole batch that succeeds narrows every dst; deserialize narrows none. */
static void test_batch_success_and_deserialize_does_not_narrow(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    S.nwritten = 33;
    enum { N = 4 };
    buf_obj *o = calloc(2 * N, sizeof *o);
    REQUIRE(o != NULL);
    kvs_memobj *src[N], *dst[N];
    for (int i = 0; i < N; i++) {
        make_obj(&o[i], (uint8_t)(20 + i));
        make_obj(&o[N + i], 0);
        src[i] = &o[i].obj;
        dst[i] = &o[N + i].obj;
    }
    kvs_task_id id;
    kvs_task_result r;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, N, dst, N, NULL, &id));
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_U64(dst[i]->used_size, 33);
        CHECK_EQ_INT(o[N + i].data[0], 20 + i);
        make_obj(&o[N + i], 0);
    }
    REQUIRE_OK(kvs_processor_submit_deserialize(p, src, N, dst, N, NULL, &id));
    CHECK_EQ_INT(wait_done(p, DE, id, &r), KVS_TASK_OK);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_U64(dst[i]->used_size, OBJ_BYTES);
        CHECK_EQ_INT(o[N + i].data[0], 20 + i);
    }
    free(o);
    kvs_processor_destroy(p);
}

/* Count mismatch (and every other bad argument) is refused at submit with
 * nothing queued: no transform runs, no signal, no id used. */
static void test_bad_submits_refused_and_nothing_queued(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    buf_obj a, b, c;
    make_obj(&a, 1);
    make_obj(&b, 1);
    make_obj(&c, 0);
    kvs_memobj *two[] = {&a.obj, &b.obj}, *three[] = {&c.obj, &c.obj, &c.obj};
    kvs_memobj *with_null[] = {&a.obj, NULL};
    kvs_task_id id = 77;
    for (int dir = SER; dir <= DE; dir++) {
        CHECK_ERR(submit(p, dir, two, 2, three, 3, &id), KVS_EINVAL,
                  "processor: 2 sources but 3 destinations");
        CHECK_ERR(submit(p, dir, three, 3, two, 2, &id), KVS_EINVAL,
                  "processor: 3 sources but 2 destinations");
        CHECK_ERR(submit(p, dir, two, 2, NULL, 0, &id), KVS_EINVAL,
                  "processor: 2 sources but 0 destinations");
        CHECK_ERR(submit(p, dir, NULL, 2, two, 2, &id), KVS_EINVAL,
                  "processor: source array is NULL with 2 objects");
        CHECK_ERR(submit(p, dir, two, 2, NULL, 2, &id), KVS_EINVAL,
                  "processor: destination array is NULL with 2 objects");
        CHECK_ERR(submit(p, dir, with_null, 2, two, 2, &id), KVS_EINVAL,
                  "processor: source 1 is NULL");
        CHECK_ERR(submit(p, dir, two, 2, with_null, 2, &id), KVS_EINVAL,
                  "processor: destination 1 is NULL");
        CHECK_ERR(submit(p, dir, two, 2, two, 2, NULL), KVS_EINVAL,
                  "processor: task id pointer is NULL");
        CHECK_ERR(submit(NULL, dir, two, 2, two, 2, &id), KVS_EINVAL,
                  "processor: processor is NULL");
    }
    CHECK_EQ_U64(id, 77);
    CHECK_EQ_U64(wait_signal(kvs_processor_serialize_event_fd(p), 50), 0);
    CHECK_EQ_U64(wait_signal(kvs_processor_deserialize_event_fd(p), 50), 0);
    CHECK_EQ_INT(fake_get(&S.entered), 0);
    REQUIRE_OK(kvs_processor_submit_serialize(p, NULL, 0, NULL, 0, NULL, &id));
    CHECK_EQ_U64(id, 0);
    kvs_processor_destroy(p);
}

/* An empty batch completes OK at once: its result and its signal are there
 * before submit returns, and no transform runs. */
static void test_empty_batch_completes_at_once(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    gate_close(); /* would hold any transform */
    buf_obj a;
    make_obj(&a, 1);
    kvs_memobj *some[] = {&a.obj};
    for (int dir = SER; dir <= DE; dir++) {
        kvs_task_id id;
        /* Non-NULL arrays with count 0 are empty batches too. */
        REQUIRE_OK(submit(p, dir, dir == SER ? NULL : some, 0, NULL, 0, &id));
        uint64_t count = 0;
        CHECK_OK(kvs_event_fd_consume(event_fd(p, dir), &count));
        CHECK_EQ_U64(count, 1);
        kvs_task_result r;
        CHECK_OK(query(p, dir, id, &r));
        CHECK_EQ_INT(r.state, KVS_TASK_OK);
        CHECK_OK(query(p, dir, id, &r));
        CHECK_EQ_INT(r.state, KVS_TASK_PENDING);
    }
    CHECK_EQ_INT(fake_get(&S.entered), 0);
    gate_open();
    kvs_processor_destroy(p);
}

/* After close: submit refused with KVS_ECLOSED (empty batches too), the fds
 * are gone; close again is a no-op; query and estimate still answer. */
static void test_submit_after_close_and_close_twice(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    buf_obj a, b;
    make_obj(&a, 1);
    make_obj(&b, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj};
    kvs_task_id done_id, id = 77;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &done_id));
    int sfd = kvs_processor_serialize_event_fd(p);
    int dfd = kvs_processor_deserialize_event_fd(p);
    CHECK_OK(kvs_processor_close(p));
    CHECK(!fd_is_open(sfd));
    CHECK(!fd_is_open(dfd));
    CHECK_ERR(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id), KVS_ECLOSED,
              "processor: submit_serialize after close");
    CHECK_ERR(kvs_processor_submit_deserialize(p, src, 1, dst, 1, NULL, &id), KVS_ECLOSED,
              "processor: submit_deserialize after close");
    CHECK_ERR(kvs_processor_submit_serialize(p, NULL, 0, NULL, 0, NULL, &id), KVS_ECLOSED,
              "processor: submit_serialize after close");
    CHECK_EQ_U64(id, 77);
    CHECK_ERR(kvs_processor_serialize_event_fd(p), KVS_ECLOSED,
              "processor: serialize event fd requested after close");
    CHECK_ERR(kvs_processor_deserialize_event_fd(p), KVS_ECLOSED,
              "processor: deserialize event fd requested after close");
    kvs_clear_error();
    CHECK_OK(kvs_processor_close(p));
    CHECK_OK(kvs_processor_close(p));
    CHECK_EQ_STR(kvs_last_error(), "");
    /* The task finished before close returned; its result is still there. */
    kvs_task_result r;
    CHECK_OK(kvs_processor_query_serialize_result(p, done_id, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_INT(fake_get(&S.ser_calls), 1);
    kvs_processor_destroy(p);
}

struct closer {
    kvs_processor *p;
    int rc;
    int done;
    pthread_mutex_t mu;
};

static void *close_thread(void *arg)
{
    struct closer *c = arg;
    int rc = kvs_processor_close(c->p);
    pthread_mutex_lock(&c->mu);
    c->rc = rc;
    c->done = 1;
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static int closer_done(struct closer *c)
{
    pthread_mutex_lock(&c->mu);
    int d = c->done;
    pthread_mutex_unlock(&c->mu);
    return d;
}

/* Close with one task running and two queued: close waits; all three run,
 * record and signal; then the threads are joined and the fds closed. */
static void test_close_finishes_queued_and_running_tasks(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    CHECK_EQ_INT(threads_settle(base_threads + 1), base_threads + 1);
    gate_close();
    buf_obj a, b, c;
    make_obj(&a, 1);
    make_obj(&b, FAIL_MARK);
    make_obj(&c, 0);
    kvs_memobj *ok_src[] = {&a.obj}, *bad_src[] = {&b.obj}, *dst[] = {&c.obj};
    kvs_task_id ids[3];
    REQUIRE_OK(kvs_processor_submit_serialize(p, ok_src, 1, dst, 1, NULL, &ids[0]));
    REQUIRE_OK(kvs_processor_submit_deserialize(p, bad_src, 1, dst, 1, NULL, &ids[1]));
    REQUIRE_OK(kvs_processor_submit_serialize(p, ok_src, 1, dst, 1, NULL, &ids[2]));
    CHECK(wait_entered(1)); /* task 0 running, 1 and 2 queued */
    /* Keep the counters readable after close closes the processor's fds. */
    int sdup = dup(kvs_processor_serialize_event_fd(p));
    int ddup = dup(kvs_processor_deserialize_event_fd(p));
    int sfd = kvs_processor_serialize_event_fd(p);
    REQUIRE(sdup >= 0 && ddup >= 0);

    struct closer cl = {.p = p, .mu = PTHREAD_MUTEX_INITIALIZER};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, close_thread, &cl) == 0);
    usleep(100000);
    CHECK(!closer_done(&cl)); /* still waiting for the tasks */
    CHECK_EQ_INT(fake_get(&S.entered), 1);
    /* Closing: new work is refused already. */
    kvs_task_id id;
    CHECK_ERR(kvs_processor_submit_serialize(p, ok_src, 1, dst, 1, NULL, &id), KVS_ECLOSED,
              "processor: submit_serialize after close");
    gate_open();
    pthread_join(t, NULL);
    CHECK_EQ_INT(cl.rc, KVS_OK);
    CHECK_EQ_INT(fake_get(&S.entered), 3);

    kvs_task_result r;
    CHECK_OK(kvs_processor_query_serialize_result(p, ids[0], &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_OK(kvs_processor_query_deserialize_result(p, ids[1], &r));
    CHECK_EQ_INT(r.state, KVS_TASK_FAILED);
    CHECK_OK(kvs_processor_query_serialize_result(p, ids[2], &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    uint64_t cs = 0, cd = 0;
    CHECK_OK(kvs_event_fd_consume(sdup, &cs));
    CHECK_OK(kvs_event_fd_consume(ddup, &cd));
    CHECK_EQ_U64(cs, 2);
    CHECK_EQ_U64(cd, 1);
    CHECK(!fd_is_open(sfd));
    CHECK_EQ_INT(threads_settle(base_threads), base_threads); /* workers joined */
    close(sdup);
    close(ddup);
    kvs_processor_destroy(p);
}

/* Two threads closing at once: both return OK, and only after the work is
 * done. */
static void test_concurrent_close(void)
{
    kvs_processor *p = make_proc(2);
    REQUIRE(p != NULL);
    gate_close();
    buf_obj a, c;
    make_obj(&a, 1);
    make_obj(&c, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&c.obj};
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    CHECK(wait_entered(1));
    struct closer c1 = {.p = p, .mu = PTHREAD_MUTEX_INITIALIZER};
    struct closer c2 = {.p = p, .mu = PTHREAD_MUTEX_INITIALIZER};
    pthread_t t1, t2;
    REQUIRE(pthread_create(&t1, NULL, close_thread, &c1) == 0);
    REQUIRE(pthread_create(&t2, NULL, close_thread, &c2) == 0);
    usleep(50000);
    CHECK(!closer_done(&c1));
    CHECK(!closer_done(&c2));
    gate_open();
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_EQ_INT(c1.rc, KVS_OK);
    CHECK_EQ_INT(c2.rc, KVS_OK);
    kvs_task_result r;
    CHECK_OK(kvs_processor_query_serialize_result(p, id, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    kvs_processor_destroy(p);
}

/* Closing from inside a transform would wait for itself: refused (submits
 * are refused from then on), and a close from another thread completes it. */
static void test_close_from_worker_refused(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    S.close_target = p;
    buf_obj a, c;
    make_obj(&a, 1);
    make_obj(&c, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&c.obj};
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    kvs_task_result r;
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    pthread_mutex_lock(&S.mu);
    CHECK_EQ_INT(S.close_rc, KVS_EINVAL);
    CHECK_EQ_STR(S.close_msg, "processor: close called from a processor thread");
    pthread_mutex_unlock(&S.mu);
    /* Half-closed: no new work, but the fds are still there. */
    CHECK_ERR(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id), KVS_ECLOSED,
              "processor: submit_serialize after close");
    CHECK(kvs_processor_serialize_event_fd(p) >= 0);
    CHECK_OK(kvs_processor_close(p));
    CHECK_ERR(kvs_processor_serialize_event_fd(p), KVS_ECLOSED,
              "processor: serialize event fd requested after close");
    kvs_processor_destroy(p);
}

/* max_workers threads, shared by both directions. */
static void test_workers_shared_by_both_directions(void)
{
    /* Tasks that may run at once get their own destinations: the caller
     * must not share an object between two tasks in flight. */
    buf_obj a, c, e;
    make_obj(&a, 1);
    make_obj(&c, 0);
    make_obj(&e, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&c.obj}, *dst2[] = {&e.obj};
    kvs_task_id id1, id2;
    kvs_task_result r;

    /* Two workers: a serialize and a deserialize run at the same time. */
    kvs_processor *p = make_proc(2);
    REQUIRE(p != NULL);
    CHECK_EQ_INT(threads_settle(base_threads + 2), base_threads + 2);
    gate_close();
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id1));
    REQUIRE_OK(kvs_processor_submit_deserialize(p, src, 1, dst2, 1, NULL, &id2));
    CHECK(wait_entered(2));
    gate_open();
    CHECK_EQ_INT(wait_done(p, SER, id1, &r), KVS_TASK_OK);
    CHECK_EQ_INT(wait_done(p, DE, id2, &r), KVS_TASK_OK);
    kvs_processor_destroy(p);

    /* One worker (the default): the deserialize waits behind the serialize. */
    p = make_proc(KVS_PROCESSOR_DEFAULT_WORKERS);
    REQUIRE(p != NULL);
    CHECK_EQ_INT(threads_settle(base_threads + 1), base_threads + 1);
    gate_close();
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id1));
    REQUIRE_OK(kvs_processor_submit_deserialize(p, src, 1, dst2, 1, NULL, &id2));
    CHECK(wait_entered(1));
    usleep(50000);
    CHECK_EQ_INT(fake_get(&S.entered), 1);
    gate_open();
    CHECK_EQ_INT(wait_done(p, SER, id1, &r), KVS_TASK_OK);
    CHECK_EQ_INT(wait_done(p, DE, id2, &r), KVS_TASK_OK);
    kvs_processor_destroy(p);
    CHECK_EQ_INT(threads_settle(base_threads), base_threads);
}

struct caller {
    kvs_processor *p;
    kvs_task_id id;
    int done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static void *query_submit_thread(void *arg)
{
    struct caller *c = arg;
    kvs_task_result r;
    kvs_task_id id;
    kvs_processor_query_serialize_result(c->p, c->id, &r);
    kvs_processor_submit_deserialize(c->p, NULL, 0, NULL, 0, NULL, &id);
    kvs_processor_serialize_event_fd(c->p);
    pthread_mutex_lock(&c->mu);
    c->done = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Transforms run outside the lock: while one is stuck, query, submit and
 * the fd getters still answer at once. */
static void test_transform_runs_outside_the_lock(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    gate_close();
    buf_obj a, c;
    make_obj(&a, 1);
    make_obj(&c, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&c.obj};
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    CHECK(wait_entered(1));
    struct caller cl = {.p = p, .id = id, .mu = PTHREAD_MUTEX_INITIALIZER,
                        .cv = PTHREAD_COND_INITIALIZER};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, query_submit_thread, &cl) == 0);
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 2;
    pthread_mutex_lock(&cl.mu);
    while (!cl.done && pthread_cond_timedwait(&cl.cv, &cl.mu, &deadline) == 0) {
    }
    int done = cl.done;
    pthread_mutex_unlock(&cl.mu);
    CHECK(done);
    gate_open(); /* lets the thread finish even if it was blocked */
    pthread_join(t, NULL);
    kvs_processor_destroy(p);
}

/* The caller's arrays are copied at submit: changing them afterwards does
 * not change the task. */
static void test_arrays_copied_at_submit(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    S.nwritten = 5;
    gate_close();
    buf_obj a, other, d1, d2;
    make_obj(&a, 0x11);
    make_obj(&other, 0x22);
    make_obj(&d1, 0);
    make_obj(&d2, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&d1.obj};
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    src[0] = &other.obj;
    dst[0] = &d2.obj;
    gate_open();
    kvs_task_result r;
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    CHECK_EQ_INT(d1.data[0], 0x11);
    CHECK_EQ_U64(d1.obj.used_size, 5);
    CHECK_EQ_INT(d2.data[0], 0);
    CHECK_EQ_U64(d2.obj.used_size, OBJ_BYTES);
    kvs_processor_destroy(p);
}

/* A long inner message is cut to fit, never overflows. */
static void test_long_failure_message_truncated(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    memset(S.fail_message, 'x', sizeof S.fail_message - 1);
    S.fail_message[sizeof S.fail_message - 1] = '\0';
    buf_obj a, c;
    make_obj(&a, FAIL_MARK);
    make_obj(&c, 0);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&c.obj};
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, src, 1, dst, 1, NULL, &id));
    kvs_task_result r;
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_FAILED);
    CHECK_EQ_U64(strlen(r.message), KVS_ERROR_MSG_MAX - 1);
    const char *prefix = "processor: serialize object 0 of 1 failed: xxx";
    CHECK(strncmp(r.message, prefix, strlen(prefix)) == 0);
    kvs_processor_destroy(p);
}

/* create takes ownership of the pair in every case; refusals are exact. */
static void test_create_refusals_destroy_the_pair(void)
{
    kvs_processor *p = (kvs_processor *)&p; /* must stay untouched */
    kvs_processor *const sentinel = p;
    fake_reset();
    CHECK_ERR(kvs_async_processor_create(NULL, fake_de(), 1, &p), KVS_EINVAL,
              "processor: serializer is NULL");
    CHECK_EQ_INT(S.de_destroyed, 1);
    fake_reset();
    CHECK_ERR(kvs_async_processor_create(fake_ser(), NULL, 1, &p), KVS_EINVAL,
              "processor: deserializer is NULL");
    CHECK_EQ_INT(S.ser_destroyed, 1);
    fake_reset();
    CHECK_ERR(kvs_async_processor_create(fake_ser(), fake_de(), 1, NULL), KVS_EINVAL,
              "processor: out is NULL");
    CHECK_EQ_INT(S.ser_destroyed, 1);
    CHECK_EQ_INT(S.de_destroyed, 1);
    fake_reset();
    CHECK_ERR(kvs_async_processor_create(fake_ser(), fake_de(), 0, &p), KVS_EINVAL,
              "processor: max_workers 0 out of range [1, 1024]");
    CHECK_EQ_INT(S.ser_destroyed + S.de_destroyed, 2);
    fake_reset();
    CHECK_ERR(kvs_async_processor_create(fake_ser(), fake_de(), 1025, &p), KVS_EINVAL,
              "processor: max_workers 1025 out of range [1, 1024]");
    CHECK_EQ_INT(S.ser_destroyed + S.de_destroyed, 2);
    CHECK(p == sentinel);
}

/* destroy closes (waiting for tasks), frees unread results, and destroys
 * the pair; NULL is a no-op. (ASan / valgrind see the frees.) */
static void test_destroy_owns_everything(void)
{
    kvs_processor *p = make_proc(2);
    REQUIRE(p != NULL);
    S.nwritten = 9;
    enum { N = 20 };
    buf_obj a, *c = calloc(N, sizeof *c);
    REQUIRE(c != NULL);
    make_obj(&a, 1);
    kvs_memobj *src[] = {&a.obj};
    kvs_task_id id;
    for (int i = 0; i < N; i++) { /* never queried */
        make_obj(&c[i], 0);
        kvs_memobj *dst[] = {&c[i].obj};
        REQUIRE_OK(submit(p, i % 2 ? SER : DE, src, 1, dst, 1, &id));
    }
    REQUIRE_OK(kvs_processor_submit_serialize(p, NULL, 0, NULL, 0, NULL, &id));
    kvs_processor_destroy(p); /* no close first */
    CHECK_EQ_INT(S.entered, N);
    CHECK_EQ_INT(S.ser_destroyed, 1);
    CHECK_EQ_INT(S.de_destroyed, 1);
    for (int i = 0; i < N; i++) /* every task ran: serializes narrowed */
        CHECK_EQ_U64(c[i].obj.used_size, i % 2 ? 9 : OBJ_BYTES);
    free(c);
    kvs_processor_destroy(NULL);
}

/* NULL processors and result pointers are refused with messages. */
static void test_null_arguments(void)
{
    kvs_task_result r;
    size_t n;
    kvs_layout l;
    kvs_layout_flat(&l, 4, KVS_DTYPE_UINT8);
    CHECK_ERR(kvs_processor_serialize_event_fd(NULL), KVS_EINVAL,
              "processor: processor is NULL");
    CHECK_ERR(kvs_processor_deserialize_event_fd(NULL), KVS_EINVAL,
              "processor: processor is NULL");
    CHECK_ERR(kvs_processor_query_serialize_result(NULL, 0, &r), KVS_EINVAL,
              "processor: processor is NULL");
    CHECK_ERR(kvs_processor_query_deserialize_result(NULL, 0, &r), KVS_EINVAL,
              "processor: processor is NULL");
    CHECK_ERR(kvs_processor_estimate_serialized_size(NULL, &l, &n), KVS_EINVAL,
              "processor: processor is NULL");
    CHECK_ERR(kvs_processor_close(NULL), KVS_EINVAL, "processor: processor is NULL");
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    CHECK_ERR(kvs_processor_query_serialize_result(p, 0, NULL), KVS_EINVAL,
              "processor: result pointer is NULL");
    CHECK_ERR(kvs_processor_query_deserialize_result(p, 0, NULL), KVS_EINVAL,
              "processor: result pointer is NULL");
    kvs_processor_destroy(p);
}

/* kvs_event_fd_consume: counter, empty counter, bad fds. */
static void test_event_fd_consume(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    int fd = kvs_processor_serialize_event_fd(p);
    uint64_t c = 99;
    CHECK_OK(kvs_event_fd_consume(fd, &c));
    CHECK_EQ_U64(c, 0); /* EAGAIN is "nothing signalled" */
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, NULL, 0, NULL, 0, NULL, &id));
    REQUIRE_OK(kvs_processor_submit_serialize(p, NULL, 0, NULL, 0, NULL, &id));
    CHECK_OK(kvs_event_fd_consume(fd, &c));
    CHECK_EQ_U64(c, 2);
    REQUIRE_OK(kvs_processor_submit_serialize(p, NULL, 0, NULL, 0, NULL, &id));
    CHECK_OK(kvs_event_fd_consume(fd, NULL)); /* drain without reading */
    CHECK_OK(kvs_event_fd_consume(fd, &c));
    CHECK_EQ_U64(c, 0);
    kvs_processor_destroy(p);

    c = 99;
    CHECK_ERR(kvs_event_fd_consume(-1, &c), KVS_EINVAL, "event fd: invalid fd -1");
    CHECK_EQ_U64(c, 0);
    int pipefd[2];
    REQUIRE(pipe(pipefd) == 0);
    close(pipefd[1]);
    char expect[128];
    snprintf(expect, sizeof expect, "event fd: read of fd %d failed: short read", pipefd[0]);
    CHECK_ERR(kvs_event_fd_consume(pipefd[0], &c), KVS_EIO, expect);
    int closed = pipefd[0];
    close(closed);
    snprintf(expect, sizeof expect, "event fd: read of fd %d failed: Bad file descriptor",
             closed);
    CHECK_ERR(kvs_event_fd_consume(closed, &c), KVS_EIO, expect);
}

/* ---------------------------------------------------------------------
 * The interface is an ops table other processors can implement; the
 * checked calls hold them to the contract.
 * ------------------------------------------------------------------ */

static int bad_fd(kvs_processor *self) { return 3; }
static int bad_submit(kvs_processor *self, kvs_memobj *const *src, kvs_memobj *const *dst,
                      size_t n, const kvs_object_key *keys, kvs_task_id *id)
{
    (void)keys;
    return KVS_EIO; /* forgets to say why */
}
static int bad_query(kvs_processor *self, kvs_task_id id, kvs_task_result *out)
{
    out->state = (kvs_task_state)7;
    return KVS_OK;
}
static int bad_estimate(kvs_processor *self, const kvs_layout *l, size_t *n)
{
    return kvs_set_error(KVS_EUNSUPPORTED, "other: no estimate");
}
static int bad_close(kvs_processor *self) { return KVS_OK; }
static int bad_destroyed;
static void bad_destroy(kvs_processor *self) { bad_destroyed++; }

static const struct kvs_processor_ops other_ops = {
    "other",   bad_fd,       bad_fd,    bad_submit, bad_query,
    bad_submit, bad_query, bad_estimate, bad_close, bad_destroy,
};

static void test_other_implementations_are_checked(void)
{
    kvs_processor other = {&other_ops};
    buf_obj a;
    make_obj(&a, 1);
    kvs_memobj *objs[] = {&a.obj};
    kvs_task_id id;
    kvs_task_result r;
    size_t n;
    kvs_layout l;
    kvs_layout_flat(&l, 4, KVS_DTYPE_UINT8);
    CHECK_EQ_INT(kvs_processor_serialize_event_fd(&other), 3);
    CHECK_ERR(kvs_processor_submit_serialize(&other, objs, 1, objs, 1, NULL, &id), KVS_EIO,
              "processor: other: submit_serialize failed: I/O error");
    CHECK_ERR(kvs_processor_submit_deserialize(&other, objs, 1, objs, 1, NULL, &id), KVS_EIO,
              "processor: other: submit_deserialize failed: I/O error");
    /* The argument checks come first, whatever the implementation. */
    CHECK_ERR(kvs_processor_submit_serialize(&other, objs, 1, objs, 0, NULL, &id), KVS_EINVAL,
              "processor: 1 sources but 0 destinations");
    CHECK_ERR(kvs_processor_query_serialize_result(&other, 0, &r), KVS_EINVAL,
              "processor: other: query_serialize_result returned unknown state 7");
    CHECK_ERR(kvs_processor_estimate_serialized_size(&other, &l, &n), KVS_EUNSUPPORTED,
              "other: no estimate");
    kvs_processor_destroy(&other);
    CHECK_EQ_INT(bad_destroyed, 1);
}


/* ---------------------------------------------------------------------
 * Completion hooks (serde/processor_hooks.h: the serde wrapper's phase
 * chaining)
 * ------------------------------------------------------------------ */

struct hook_log {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kvs_processor *p;
    int dir;
    int n;
    uint64_t ids[8];
    int states[8];
    char threads[8][16];
};

/* Queries the task from inside the hook: the result must be readable
 * already, and no processor lock held (a held lock would deadlock here). */
static void hook_record(void *ctx, uint64_t id)
{
    struct hook_log *h = ctx;
    kvs_task_result r;
    int rc = query(h->p, h->dir, id, &r);
    pthread_mutex_lock(&h->mu);
    if (h->n < 8) {
        h->ids[h->n] = id;
        h->states[h->n] = rc == KVS_OK ? (int)r.state : -1;
        if (pthread_getname_np(pthread_self(), h->threads[h->n], 16) != 0)
            snprintf(h->threads[h->n], 16, "?");
    }
    h->n++;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

static int hook_wait(struct hook_log *h, int n)
{
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 5;
    pthread_mutex_lock(&h->mu);
    int rc = 0;
    while (h->n < n && rc == 0) rc = pthread_cond_timedwait(&h->cv, &h->mu, &deadline);
    int ok = h->n >= n;
    pthread_mutex_unlock(&h->mu);
    return ok;
}

/* Each finished task calls its direction's hook once, with its id, on the
 * thread that finished it (the worker; the submitting thread for an empty
 * batch, before the submit returns), once the result is readable; the fds
 * are not signalled. Another implementation takes no hooks (0). */
/* kvs_async_processor_set_inline: a task whose objects add up to at most
 * the limit runs inside its submit (its hook fires on the submitting thread
 * before the submit returns); a larger one goes to a worker. */
static void test_small_tasks_run_inline(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    struct hook_log hs = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                          .p = p, .dir = SER};
    REQUIRE(kvs_async_processor_set_hooks(p, (kvs_completion_hook){hook_record, &hs},
                                          (kvs_completion_hook){NULL, NULL}) == 1);
    kvs_processor other = {&other_ops};
    CHECK_EQ_INT(kvs_async_processor_set_inline(&other, 1), 0);
    /* two objects of OBJ_BYTES: inline at a limit of 2 x OBJ_BYTES, not below */
    CHECK_EQ_INT(kvs_async_processor_set_inline(p, 2 * OBJ_BYTES), 1);
    buf_obj a, b;
    make_obj(&a, 1);
    make_obj(&b, 2);
    kvs_memobj *src[] = {&a.obj}, *dst[] = {&b.obj};
    kvs_task_id id;
    REQUIRE_OK(submit(p, SER, src, 1, dst, 1, &id));
    pthread_mutex_lock(&hs.mu);
    CHECK_EQ_INT(hs.n, 1); /* finished before the submit returned */
    CHECK_EQ_STR(hs.threads[0], "test_async_proc");
    pthread_mutex_unlock(&hs.mu);
    CHECK_EQ_INT(b.data[0], 1); /* transformed (the test serde copies) */
    CHECK_EQ_INT(kvs_async_processor_set_inline(p, 2 * OBJ_BYTES - 1), 1);
    REQUIRE_OK(submit(p, SER, src, 1, dst, 1, &id));
    REQUIRE(hook_wait(&hs, 2));
    pthread_mutex_lock(&hs.mu);
    CHECK_EQ_STR(hs.threads[1], "kvs-proc-0");
    pthread_mutex_unlock(&hs.mu);
    kvs_processor_destroy(p);
}

static void test_completion_hooks_replace_the_fd(void)
{
    kvs_processor *p = make_proc(1);
    REQUIRE(p != NULL);
    struct hook_log hs = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                          .p = p, .dir = SER};
    struct hook_log hd = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER,
                          .p = p, .dir = DE};
    CHECK_EQ_INT(kvs_async_processor_set_hooks(p, (kvs_completion_hook){hook_record, &hs},
                                               (kvs_completion_hook){hook_record, &hd}),
                 1);
    kvs_processor other = {&other_ops};
    CHECK_EQ_INT(kvs_async_processor_set_hooks(&other, (kvs_completion_hook){hook_record, &hs},
                                               (kvs_completion_hook){NULL, NULL}),
                 0);
    buf_obj a, b, c, d;
    make_obj(&a, 1);
    make_obj(&b, 2);
    make_obj(&c, 3);
    make_obj(&d, 4);
    kvs_memobj *src1[] = {&a.obj}, *dst1[] = {&b.obj}, *src2[] = {&c.obj}, *dst2[] = {&d.obj};
    kvs_task_id id;
    REQUIRE_OK(submit(p, SER, NULL, 0, NULL, 0, &id)); /* empty: done inside the submit */
    CHECK_EQ_U64(id, 0);
    pthread_mutex_lock(&hs.mu);
    CHECK_EQ_INT(hs.n, 1);
    CHECK_EQ_STR(hs.threads[0], "test_async_proc");
    pthread_mutex_unlock(&hs.mu);
    REQUIRE_OK(submit(p, SER, src1, 1, dst1, 1, &id));
    REQUIRE_OK(submit(p, DE, src2, 1, dst2, 1, &id));
    REQUIRE_OK(submit(p, SER, src2, 1, dst1, 1, &id));
    REQUIRE(hook_wait(&hs, 3));
    REQUIRE(hook_wait(&hd, 1));
    pthread_mutex_lock(&hs.mu);
    CHECK_EQ_INT(hs.n, 3);
    uint64_t want[3] = {0, 1, 3};
    for (int i = 0; i < 3 && i < hs.n; i++) {
        CHECK_EQ_U64(hs.ids[i], want[i]);
        CHECK_EQ_INT(hs.states[i], KVS_TASK_OK);
    }
    CHECK_EQ_STR(hs.threads[1], "kvs-proc-0");
    CHECK_EQ_STR(hs.threads[2], "kvs-proc-0");
    pthread_mutex_unlock(&hs.mu);
    pthread_mutex_lock(&hd.mu);
    CHECK_EQ_INT(hd.n, 1);
    CHECK_EQ_U64(hd.ids[0], 2);
    CHECK_EQ_INT(hd.states[0], KVS_TASK_OK);
    CHECK_EQ_STR(hd.threads[0], "kvs-proc-0");
    pthread_mutex_unlock(&hd.mu);
    /* the hook replaced the signal; the results were popped inside it */
    uint64_t count = 99;
    CHECK_OK(kvs_event_fd_consume(event_fd(p, SER), &count));
    CHECK_EQ_U64(count, 0);
    CHECK_OK(kvs_event_fd_consume(event_fd(p, DE), &count));
    CHECK_EQ_U64(count, 0);
    kvs_task_result r;
    CHECK_OK(query(p, SER, 1, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_PENDING);
    kvs_processor_destroy(p);
}

/* ---------------------------------------------------------------------
 * With the registry and the real fp8 serde
 * ------------------------------------------------------------------ */

static kvs_processor *fp8_proc_from_config(const char *json)
{
    kvs_processor *p = NULL;
    if (kvs_serde_create(json, &p) != KVS_OK) {
        fprintf(stderr, "kvs_serde_create: %s\n", kvs_last_error());
        return NULL;
    }
    return p;
}

/* The registry's create returns this processor around the configured serde
 * with the config's max_workers, and each create makes a new, independent
 * processor: own threads, fds, ids and lifetime. fp8 through the processor
 * narrows to one byte per element and round-trips. */
static void test_registry_fp8_processors_are_independent(void)
{
    kvs_processor *p1 = fp8_proc_from_config("{\"type\": \"fp8\", \"max_workers\": 2}");
    kvs_processor *p2 = fp8_proc_from_config("{\"type\": \"fp8\"}");
    REQUIRE(p1 != NULL && p2 != NULL);
    CHECK_EQ_INT(threads_settle(base_threads + 3), base_threads + 3);
    int fds[4] = {kvs_processor_serialize_event_fd(p1), kvs_processor_deserialize_event_fd(p1),
                  kvs_processor_serialize_event_fd(p2), kvs_processor_deserialize_event_fd(p2)};
    for (int i = 0; i < 4; i++)
        for (int j = i + 1; j < 4; j++)
            CHECK(fds[i] != fds[j]);

    enum { NEL = 1000 };
    kvs_layout kv, ser_layout;
    kvs_layout_flat(&kv, NEL, KVS_DTYPE_FLOAT32);
    size_t est = 0;
    REQUIRE_OK(kvs_processor_estimate_serialized_size(p1, &kv, &est));
    CHECK_EQ_U64(est, NEL * 3 / 2); /* the serializer's 1.5x, nothing added */
    kvs_layout_flat(&ser_layout, est, KVS_DTYPE_UINT8);
    kvs_memobj *src, *tmp, *back;
    REQUIRE_OK(kvs_memobj_alloc(&kv, KVS_FMT_KV_2LTD, &src));
    REQUIRE_OK(kvs_memobj_alloc(&ser_layout, KVS_FMT_BINARY_BUFFER, &tmp));
    REQUIRE_OK(kvs_memobj_alloc(&kv, KVS_FMT_KV_2LTD, &back));
    float *f = src->data;
    for (int i = 0; i < NEL; i++)
        f[i] = (float)(i % 17) * 0.25f - 2.0f; /* exact in e4m3fn */

    kvs_task_id id1, id2;
    kvs_task_result r;
    REQUIRE_OK(kvs_processor_submit_serialize(p1, &src, 1, &tmp, 1, NULL, &id1));
    REQUIRE_OK(kvs_processor_submit_serialize(p2, NULL, 0, NULL, 0, NULL, &id2));
    CHECK_EQ_U64(id1, 0);
    CHECK_EQ_U64(id2, 0); /* each processor counts from 0 */
    CHECK_EQ_INT(wait_done(p1, SER, id1, &r), KVS_TASK_OK);
    CHECK_EQ_U64(tmp->used_size, NEL); /* narrowed from 1500 */
    /* p1's result is not p2's. */
    CHECK_OK(kvs_processor_query_serialize_result(p2, id2, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);

    /* Closing p2 leaves p1 working. */
    CHECK_OK(kvs_processor_close(p2));
    REQUIRE_OK(kvs_processor_submit_deserialize(p1, &tmp, 1, &back, 1, NULL, &id1));
    CHECK_EQ_U64(id1, 1);
    CHECK_EQ_INT(wait_done(p1, DE, id1, &r), KVS_TASK_OK);
    CHECK(memcmp(src->data, back->data, NEL * sizeof(float)) == 0);

    /* A real codec failure travels with its task. */
    kvs_layout small;
    kvs_memobj *tiny;
    kvs_layout_flat(&small, 10, KVS_DTYPE_UINT8);
    REQUIRE_OK(kvs_memobj_alloc(&small, KVS_FMT_BINARY_BUFFER, &tiny));
    REQUIRE_OK(kvs_processor_submit_serialize(p1, &src, 1, &tiny, 1, NULL, &id1));
    CHECK_EQ_INT(wait_done(p1, SER, id1, &r), KVS_TASK_FAILED);
    CHECK_EQ_INT(r.status, KVS_ENOSPC);
    CHECK_EQ_STR(r.message, "processor: serialize object 0 of 1 failed: fp8: destination "
                            "too small: 10 bytes, need 1000");
    CHECK_EQ_U64(tiny->used_size, 10);

    kvs_processor_destroy(p1);
    kvs_processor_destroy(p2);
    kvs_memobj_free(src);
    kvs_memobj_free(tmp);
    kvs_memobj_free(back);
    kvs_memobj_free(tiny);
    CHECK_EQ_INT(threads_settle(base_threads), base_threads);
}

/* =====================================================================
 * Splitting one large object across the workers (issue 4):
 * kvs_serde_parallel_for and kvs_async_processor_set_split
 * ================================================================== */

/* "ranger": a serializer that hands items [0, n) (n = the source's used
 * size) to kvs_serde_parallel_for and records every range it is given, on
 * which thread, optionally spinning in each so that helpers get a share;
 * ranges at or after `fail_from` fail (with a message naming the range, or
 * silently). A source whose first byte is GATE_MARK waits at the fake's
 * gate instead, to keep a worker busy. */

#define GATE_MARK 0xAB
#define MAX_RANGES 4096

static struct ranger_state {
    pthread_mutex_t mu;
    int n;
    uint64_t begin[MAX_RANGES], end[MAX_RANGES];
    pthread_t thread[MAX_RANGES];
    int spin_us;
    uint64_t fail_from;
    int fail_silent;
    int nested; /* each range calls kvs_serde_parallel_for itself */
    int inner_calls;
    int await_second; /* ranges wait (up to 5 s) until a 2nd thread ran one */
    int threads_seen;
    pthread_t first_thread;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void ranger_reset(int spin_us)
{
    pthread_mutex_lock(&R.mu);
    R.n = 0;
    R.spin_us = spin_us;
    R.fail_from = UINT64_MAX;
    R.fail_silent = 0;
    R.nested = 0;
    R.inner_calls = 0;
    R.await_second = 0;
    R.threads_seen = 0;
    pthread_mutex_unlock(&R.mu);
}

/* Ranges of the next split wait until a second thread has run one, so the
 * test knows the helper took part without depending on timing. */
static void ranger_await_second(void)
{
    pthread_mutex_lock(&R.mu);
    R.await_second = 1;
    pthread_mutex_unlock(&R.mu);
}

static double now_mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int inner_range(void *ctx, uint64_t begin, uint64_t end)
{
    pthread_mutex_lock(&R.mu);
    R.inner_calls++;
    pthread_mutex_unlock(&R.mu);
    return KVS_OK;
}

static int ranger_range(void *ctx, uint64_t begin, uint64_t end)
{
    pthread_mutex_lock(&R.mu);
    if (R.n < MAX_RANGES) {
        R.begin[R.n] = begin;
        R.end[R.n] = end;
        R.thread[R.n] = pthread_self();
        R.n++;
    }
    if (R.threads_seen == 0) {
        R.first_thread = pthread_self();
        R.threads_seen = 1;
    } else if (R.threads_seen == 1 && !pthread_equal(R.first_thread, pthread_self())) {
        R.threads_seen = 2;
    }
    int spin = R.spin_us, nested = R.nested, silent = R.fail_silent;
    uint64_t fail_from = R.fail_from;
    for (int i = 0; i < 50000 && R.await_second && R.threads_seen < 2; i++) {
        pthread_mutex_unlock(&R.mu);
        usleep(100);
        pthread_mutex_lock(&R.mu);
    }
    pthread_mutex_unlock(&R.mu);
    double until = now_mono() + spin * 1e-6;
    while (now_mono() < until) {
    }
    if (nested) {
        /* From inside a range, even on the task's worker: one inline call. */
        int rc = kvs_serde_parallel_for(end - begin, (end - begin) * 1000, inner_range, NULL);
        if (rc != KVS_OK)
            return rc;
    }
    if (begin >= fail_from)
        return silent ? KVS_EIO
                      : kvs_set_error(KVS_ECORRUPT, "ranger: range at %llu failed",
                                      (unsigned long long)begin);
    return KVS_OK;
}

static int ranger_serialize(kvs_serializer *self, const kvs_memobj *src, kvs_memobj *dst,
                            const kvs_object_key *key,
                            size_t *nwritten)
{
    (void)key;
    if (src->capacity > 0 && ((const uint8_t *)src->data)[0] == GATE_MARK) {
        fake_enter(src, &S.ser_calls);
        *nwritten = 0;
        return KVS_OK;
    }
    int rc = kvs_serde_parallel_for(src->used_size, src->used_size, ranger_range, NULL);
    if (rc != KVS_OK)
        return rc;
    *nwritten = src->used_size;
    return KVS_OK;
}

static void ranger_ser_destroy(kvs_serializer *self) { free(self); }

static const struct kvs_serializer_ops ranger_ser_ops = {
    .name = "ranger",
    .serialize = ranger_serialize,
    .estimate_serialized_size = fake_estimate,
    .destroy = ranger_ser_destroy,
};

/* A processor whose serializer is the ranger (deserializer: the fake). */
static kvs_processor *make_ranger_proc(unsigned workers, size_t min_bytes, size_t chunk)
{
    fake_reset();
    kvs_serializer *s = malloc(sizeof *s);
    s->ops = &ranger_ser_ops;
    kvs_processor *p = NULL;
    if (kvs_async_processor_create(s, fake_de(), workers, &p) != KVS_OK ||
        kvs_async_processor_set_split(p, min_bytes, chunk) != KVS_OK) {
        fprintf(stderr, "create failed: %s\n", kvs_last_error());
        kvs_processor_destroy(p);
        return NULL;
    }
    return p;
}

/* The recorded ranges cover [0, n) exactly, without overlap, every inner
 * boundary a multiple of KVS_SPLIT_ALIGN; returns the number of distinct
 * threads that ran them (0 if the cover is wrong). */
static int ranges_cover(uint64_t n, pthread_t *one_thread)
{
    pthread_mutex_lock(&R.mu);
    int count = R.n, threads = 0, ok = 1;
    pthread_t seen[8];
    uint64_t covered = 0;
    /* ranges are claimed in order, but recorded in the order they started */
    for (uint64_t at = 0; ok && at < n;) {
        int found = -1;
        for (int i = 0; i < count; i++)
            if (R.begin[i] == at) found = i;
        if (found < 0 || R.end[found] <= at) {
            ok = 0;
            break;
        }
        if (R.end[found] != n && R.end[found] % KVS_SPLIT_ALIGN != 0)
            ok = 0;
        covered += R.end[found] - at;
        at = R.end[found];
    }
    if (covered != n)
        ok = 0;
    uint64_t sum = 0;
    for (int i = 0; i < count; i++) {
        sum += R.end[i] - R.begin[i];
        int known = 0;
        for (int j = 0; j < threads; j++)
            known |= pthread_equal(seen[j], R.thread[i]);
        if (!known && threads < 8)
            seen[threads++] = R.thread[i];
    }
    if (sum != n)
        ok = 0; /* an overlap */
    if (one_thread != NULL && count > 0)
        *one_thread = R.thread[0];
    pthread_mutex_unlock(&R.mu);
    return ok ? threads : 0;
}

static int ranger_count(void)
{
    pthread_mutex_lock(&R.mu);
    int n = R.n;
    pthread_mutex_unlock(&R.mu);
    return n;
}

/* A flat uint8 source of `n` bytes (the ranger's items) and a destination. */
static kvs_memobj *alloc_u8(size_t n, uint8_t fill)
{
    kvs_layout l;
    kvs_memobj *o = NULL;
    kvs_layout_flat(&l, n, KVS_DTYPE_UINT8);
    if (kvs_memobj_alloc(&l, KVS_FMT_BINARY_BUFFER, &o) == KVS_OK)
        memset(o->data, fill, n);
    return o;
}

/* With 2 workers, a threshold the object reaches and a free worker, the
 * ranges cover the object exactly, are claimed by both workers (never by
 * the caller's thread), and the task completes and narrows as unsplit. */
static void test_split_runs_on_both_workers(void)
{
    enum { N = 64 * 40 + 17 }; /* 41 ranges of 64 items, the last one short */
    kvs_processor *p = make_ranger_proc(2, 0, 64);
    REQUIRE(p != NULL);
    ranger_reset(0);
    ranger_await_second();
    kvs_memobj *src = alloc_u8(N, 1), *dst = alloc_u8(N, 0);
    REQUIRE(src && dst);
    kvs_task_id id;
    kvs_task_result r;
    REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id));
    CHECK_EQ_U64(wait_signal(kvs_processor_serialize_event_fd(p), 5000), 1);
    CHECK_OK(kvs_processor_query_serialize_result(p, id, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_U64(dst->used_size, N);
    CHECK_EQ_INT(ranger_count(), 41);
    CHECK_EQ_INT(ranges_cover(N, NULL), 2);
    pthread_mutex_lock(&R.mu);
    for (int i = 0; i < R.n; i++) CHECK(!pthread_equal(R.thread[i], pthread_self()));
    pthread_mutex_unlock(&R.mu);
    kvs_processor_destroy(p);
    kvs_memobj_free(src);
    kvs_memobj_free(dst);
}

/* No split: below the threshold, with one worker, on the caller's thread,
 * or when the other worker is busy: exactly one call fn(0, n). */
static void test_split_only_when_it_can_help(void)
{
    enum { N = 64 * 40 };
    kvs_memobj *src = alloc_u8(N, 1), *dst = alloc_u8(N, 0);
    REQUIRE(src && dst);
    kvs_task_id id;
    kvs_task_result r;
    pthread_t who;

    /* below the threshold */
    kvs_processor *p = make_ranger_proc(2, N + 1, 64);
    REQUIRE(p != NULL);
    ranger_reset(0);
    REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id));
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    CHECK_EQ_INT(ranger_count(), 1);
    CHECK_EQ_INT(ranges_cover(N, NULL), 1);
    /* at the threshold it splits */
    CHECK_OK(kvs_async_processor_set_split(p, N, 64));
    ranger_reset(0);
    ranger_await_second();
    REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id));
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    CHECK_EQ_INT(ranger_count(), 40);
    CHECK_EQ_INT(ranges_cover(N, NULL), 2);
    /* one piece only (a chunk as large as the object) */
    CHECK_OK(kvs_async_processor_set_split(p, 0, N));
    ranger_reset(0);
    REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id));
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    CHECK_EQ_INT(ranger_count(), 1);

    /* the other worker busy (held at the gate): no helper to ask */
    CHECK_OK(kvs_async_processor_set_split(p, 0, 64));
    ranger_reset(200);
    kvs_memobj *held = alloc_u8(16, GATE_MARK), *held_dst = alloc_u8(16, 0);
    REQUIRE(held && held_dst);
    gate_close();
    kvs_task_id hid;
    REQUIRE_OK(kvs_processor_submit_serialize(p, &held, 1, &held_dst, 1, NULL, &hid));
    CHECK(wait_entered(1));
    REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id));
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    CHECK_EQ_INT(ranger_count(), 1); /* one call, on the task's own worker */
    CHECK_EQ_INT(ranges_cover(N, NULL), 1);
    gate_open();
    CHECK_EQ_INT(wait_done(p, SER, hid, &r), KVS_TASK_OK);
    kvs_processor_destroy(p);

    /* one worker */
    p = make_ranger_proc(1, 0, 64);
    REQUIRE(p != NULL);
    ranger_reset(0);
    REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id));
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    CHECK_EQ_INT(ranger_count(), 1);

    /* the caller's own thread: the serde works the same without a processor */
    ranger_reset(0);
    kvs_serializer s = {&ranger_ser_ops};
    size_t nw = 0;
    CHECK_OK(kvs_serialize(&s, src, dst, NULL, &nw));
    CHECK_EQ_U64(nw, N);
    CHECK_EQ_INT(ranger_count(), 1);
    CHECK_EQ_INT(ranges_cover(N, &who), 1);
    CHECK(pthread_equal(who, pthread_self()));
    kvs_processor_destroy(p);
    kvs_memobj_free(src);
    kvs_memobj_free(dst);
    kvs_memobj_free(held);
    kvs_memobj_free(held_dst);
}

/* kvs_serde_parallel_for's own contract off any processor. */
static void test_parallel_for_contract(void)
{
    ranger_reset(0);
    CHECK_OK(kvs_serde_parallel_for(0, 0, ranger_range, NULL));
    CHECK_EQ_INT(ranger_count(), 0);
    CHECK_OK(kvs_serde_parallel_for(1000, (uint64_t)1 << 40, ranger_range, NULL));
    CHECK_EQ_INT(ranger_count(), 1);
    CHECK_EQ_INT(ranges_cover(1000, NULL), 1);
    CHECK_ERR(kvs_serde_parallel_for(10, 10, NULL, NULL), KVS_EINVAL,
              "serde: parallel_for: NULL function");
    /* inline: fn's status and message come back untouched */
    ranger_reset(0);
    pthread_mutex_lock(&R.mu);
    R.fail_from = 0;
    pthread_mutex_unlock(&R.mu);
    CHECK_ERR(kvs_serde_parallel_for(10, 10, ranger_range, NULL), KVS_ECORRUPT,
              "ranger: range at 0 failed");
    /* a failure without a message gets one naming the range */
    pthread_mutex_lock(&R.mu);
    R.fail_silent = 1;
    pthread_mutex_unlock(&R.mu);
    CHECK_ERR(kvs_serde_parallel_for(10, 10, ranger_range, NULL), KVS_EIO,
              "serde: items [0, 10) failed: I/O error");
}

/* A range that calls kvs_serde_parallel_for again gets one inline call,
 * on whichever worker runs it. */
static void test_split_nested_runs_inline(void)
{
    enum { N = 64 * 8 };
    kvs_processor *p = make_ranger_proc(2, 0, 64);
    REQUIRE(p != NULL);
    ranger_reset(500);
    pthread_mutex_lock(&R.mu);
    R.nested = 1;
    pthread_mutex_unlock(&R.mu);
    kvs_memobj *src = alloc_u8(N, 1), *dst = alloc_u8(N, 0);
    REQUIRE(src && dst);
    kvs_task_id id;
    kvs_task_result r;
    REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id));
    CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_OK);
    CHECK_EQ_INT(ranger_count(), 8);
    pthread_mutex_lock(&R.mu);
    CHECK_EQ_INT(R.inner_calls, 8);
    pthread_mutex_unlock(&R.mu);
    kvs_processor_destroy(p);
    kvs_memobj_free(src);
    kvs_memobj_free(dst);
}

/* Failures of a split object: every range still runs; the task reports the
 * failing range with the lowest begin, as its own message (or a message
 * naming the range when fn gave none); nothing is narrowed. */
static void test_split_failure_is_the_first_by_position(void)
{
    enum { N = 64 * 30 };
    kvs_memobj *src = alloc_u8(N, 1), *dst = alloc_u8(N, 0);
    REQUIRE(src && dst);
    kvs_task_id id;
    kvs_task_result r;
    for (int silent = 0; silent <= 1; silent++) {
        kvs_processor *p = make_ranger_proc(2, 0, 64);
        REQUIRE(p != NULL);
        ranger_reset(300);
        pthread_mutex_lock(&R.mu);
        R.fail_from = 64 * 11;
        R.fail_silent = silent;
        pthread_mutex_unlock(&R.mu);
        REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id));
        CHECK_EQ_INT(wait_done(p, SER, id, &r), KVS_TASK_FAILED);
        CHECK_EQ_INT(ranger_count(), 30);
        CHECK_EQ_INT(ranges_cover(N, NULL) > 0, 1);
        CHECK_EQ_INT(r.status, silent ? KVS_EIO : KVS_ECORRUPT);
        CHECK_EQ_U64(r.failed_index, 0);
        CHECK_EQ_STR(r.message,
                     silent ? "processor: serialize object 0 of 1 failed: serde: items "
                              "[704, 768) failed: I/O error"
                            : "processor: serialize object 0 of 1 failed: ranger: range at "
                              "704 failed");
        CHECK_EQ_U64(dst->used_size, N); /* not narrowed */
        kvs_processor_destroy(p);
    }
    kvs_memobj_free(src);
    kvs_memobj_free(dst);
}

/* Close while a split object is being converted: close waits for it, its
 * helpers drain with the pool, and the result is there. */
static void test_close_during_split(void)
{
    enum { N = 64 * 60 };
    kvs_processor *p = make_ranger_proc(2, 0, 64);
    REQUIRE(p != NULL);
    ranger_reset(500);
    kvs_memobj *src = alloc_u8(N, 1), *dst = alloc_u8(N, 0);
    REQUIRE(src && dst);
    kvs_task_id id;
    REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id));
    for (int i = 0; i < 2000 && ranger_count() < 2; i++) usleep(500);
    CHECK_OK(kvs_processor_close(p));
    kvs_task_result r;
    CHECK_OK(kvs_processor_query_serialize_result(p, id, &r));
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_INT(ranger_count(), 60);
    CHECK_EQ_U64(dst->used_size, N);
    kvs_processor_destroy(p);
    kvs_memobj_free(src);
    kvs_memobj_free(dst);
}

static void test_set_split_refusals(void)
{
    CHECK_ERR(kvs_async_processor_set_split(NULL, 0, 0), KVS_EINVAL,
              "processor: processor is NULL");
    kvs_processor other = {&other_ops};
    CHECK_ERR(kvs_async_processor_set_split(&other, 0, 0), KVS_EINVAL,
              "processor: other is not an async processor");
}

/* ---- the fp8 serde, split and unsplit ------------------------------- */

static uint32_t xorshift(uint32_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

/* An object of `layout` filled with random bits: every value class (NaN
 * payloads, infinities, subnormals, overflow) turns up. */
static kvs_memobj *random_obj(const kvs_layout *layout, uint32_t seed)
{
    kvs_memobj *o = NULL;
    if (kvs_memobj_alloc(layout, KVS_FMT_KV_2LTD, &o) != KVS_OK)
        return NULL;
    uint8_t *b = o->data;
    for (size_t i = 0; i < o->capacity; i++) b[i] = (uint8_t)(xorshift(&seed) >> 7);
    return o;
}

/* Serialize `src` into a fresh blob with processor p (NULL: directly on
 * this thread) and deserialize it back into `back`. */
static int fp8_both_ways(kvs_processor *p, kvs_serializer *ser, kvs_deserializer *de,
                         kvs_memobj *src, kvs_memobj *blob, kvs_memobj *back)
{
    if (p == NULL) {
        size_t nw;
        int rc = kvs_serialize(ser, src, blob, NULL, &nw);
        if (rc == KVS_OK) rc = kvs_memobj_set_used_size(blob, nw);
        return rc == KVS_OK ? kvs_deserialize(de, blob, back, NULL) : rc;
    }
    kvs_task_id id;
    kvs_task_result r;
    if (kvs_processor_submit_serialize(p, &src, 1, &blob, 1, NULL, &id) != KVS_OK ||
        wait_done(p, SER, id, &r) != KVS_TASK_OK)
        return KVS_EIO;
    if (kvs_processor_submit_deserialize(p, &blob, 1, &back, 1, NULL, &id) != KVS_OK ||
        wait_done(p, DE, id, &r) != KVS_TASK_OK)
        return KVS_EIO;
    return KVS_OK;
}

static kvs_processor *fp8_split_proc(kvs_dtype fp8, int saturate, size_t min_bytes,
                                     size_t chunk)
{
    kvs_serializer *s;
    kvs_deserializer *d;
    kvs_processor *p;
    if (kvs_fp8_serde_create(fp8, saturate, &s, &d) != KVS_OK ||
        kvs_async_processor_create(s, d, 2, &p) != KVS_OK)
        return NULL;
    if (kvs_async_processor_set_split(p, min_bytes, chunk) != KVS_OK) {
        kvs_processor_destroy(p);
        return NULL;
    }
    return p;
}

/* The split never changes bytes: fp8 blobs and decoded objects are
 * identical split (small pieces, so boundaries fall everywhere, including
 * inside groups and across group ends), unsplit, and on the caller's
 * thread, for odd sizes and multi-group objects of mixed dtypes, both fp8
 * formats and both overflow policies. */
static void test_split_fp8_bytes_identical(void)
{
    static const uint64_t flat[] = {1, 63, 64, 65, 127, 4097, 100003};
    static const kvs_dtype wide[] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16, KVS_DTYPE_FLOAT32};
    enum { NLAYOUTS = 7 * 3 + 2 };
    kvs_layout layouts[NLAYOUTS];
    int nl = 0;
    for (size_t i = 0; i < sizeof flat / sizeof flat[0]; i++)
        for (size_t d = 0; d < 3; d++) kvs_layout_flat(&layouts[nl++], flat[i], wide[d]);
    int64_t d1[] = {70001}, d2[] = {3, 11111}, d3[] = {55557}, d4[] = {3}, d5[] = {129},
            d6[] = {64 * 100 + 1};
    kvs_layout_init(&layouts[nl], 0, NULL, 0, NULL);
    kvs_layout_add_group(&layouts[nl], 1, d1, KVS_DTYPE_BFLOAT16);
    kvs_layout_add_group(&layouts[nl], 2, d2, KVS_DTYPE_FLOAT32);
    kvs_layout_add_group(&layouts[nl], 1, d3, KVS_DTYPE_FLOAT16);
    nl++;
    kvs_layout_init(&layouts[nl], 0, NULL, 0, NULL);
    kvs_layout_add_group(&layouts[nl], 1, d4, KVS_DTYPE_FLOAT16);
    kvs_layout_add_group(&layouts[nl], 1, d5, KVS_DTYPE_BFLOAT16);
    kvs_layout_add_group(&layouts[nl], 1, d6, KVS_DTYPE_FLOAT32);
    nl++;
    REQUIRE(nl == NLAYOUTS);

    static const struct {
        kvs_dtype fp8;
        int saturate;
    } fmts[] = {{KVS_DTYPE_FLOAT8_E4M3FN, 1}, {KVS_DTYPE_FLOAT8_E5M2, 0}};
    for (size_t f = 0; f < 2; f++) {
        kvs_processor *split = fp8_split_proc(fmts[f].fp8, fmts[f].saturate, 0, 4096);
        kvs_processor *whole = fp8_split_proc(fmts[f].fp8, fmts[f].saturate, SIZE_MAX, 0);
        kvs_serializer *ser;
        kvs_deserializer *de;
        REQUIRE(split && whole);
        REQUIRE_OK(kvs_fp8_serde_create(fmts[f].fp8, fmts[f].saturate, &ser, &de));
        for (int i = 0; i < nl; i++) {
            uint64_t numel = kvs_layout_numel(&layouts[i]);
            kvs_memobj *src = random_obj(&layouts[i], (uint32_t)(i * 7919 + f + 1));
            kvs_memobj *blobs[3], *backs[3];
            REQUIRE(src != NULL);
            for (int k = 0; k < 3; k++) {
                blobs[k] = alloc_u8(numel + numel / 2 + 1, 0x5C);
                backs[k] = random_obj(&layouts[i], 99); /* same junk in each */
                REQUIRE(blobs[k] && backs[k]);
            }
            CHECK_OK(fp8_both_ways(NULL, ser, de, src, blobs[0], backs[0]));
            CHECK_OK(fp8_both_ways(whole, NULL, NULL, src, blobs[1], backs[1]));
            CHECK_OK(fp8_both_ways(split, NULL, NULL, src, blobs[2], backs[2]));
            for (int k = 0; k < 3; k++) CHECK_EQ_U64(blobs[k]->used_size, numel);
            for (int k = 1; k < 3; k++) {
                int same_blob = memcmp(blobs[0]->data, blobs[k]->data, blobs[0]->capacity) == 0;
                int same_back = memcmp(backs[0]->data, backs[k]->data, backs[0]->capacity) == 0;
                if (!same_blob || !same_back)
                    fprintf(stderr, "layout %d (%llu elements), fmt %zu, way %d differs\n", i,
                            (unsigned long long)numel, f, k);
                CHECK(same_blob);
                CHECK(same_back);
            }
            kvs_memobj_free(src);
            for (int k = 0; k < 3; k++) {
                kvs_memobj_free(blobs[k]);
                kvs_memobj_free(backs[k]);
            }
        }
        kvs_serializer_destroy(ser);
        kvs_deserializer_destroy(de);
        kvs_processor_destroy(split);
        kvs_processor_destroy(whole);
    }
}

/* fp8's refusals read exactly the same split or not, and write nothing:
 * they all come before the conversion is split. */
static void test_split_fp8_refusals_unchanged(void)
{
    kvs_processor *split = fp8_split_proc(KVS_DTYPE_FLOAT8_E4M3FN, 1, 0, 4096);
    kvs_processor *whole = fp8_split_proc(KVS_DTYPE_FLOAT8_E4M3FN, 1, SIZE_MAX, 0);
    REQUIRE(split && whole);
    enum { NEL = 100000 };
    kvs_layout kv, bad;
    kvs_layout_flat(&kv, NEL, KVS_DTYPE_BFLOAT16);
    int64_t dims[] = {NEL};
    kvs_layout_init(&bad, 0, NULL, 0, NULL);
    kvs_layout_add_group(&bad, 1, dims, KVS_DTYPE_BFLOAT16);
    kvs_layout_add_group(&bad, 1, dims, KVS_DTYPE_UINT8);
    kvs_memobj *src = random_obj(&kv, 5), *bsrc = random_obj(&bad, 6);
    REQUIRE(src && bsrc);
    kvs_task_id id;
    kvs_task_result r[2];
    for (int w = 0; w < 2; w++) {
        kvs_processor *p = w ? split : whole;
        kvs_memobj *small = alloc_u8(NEL - 1, 0x77), *big = alloc_u8(4 * NEL, 0x77);
        REQUIRE(small && big);
        /* destination too small */
        REQUIRE_OK(kvs_processor_submit_serialize(p, &src, 1, &small, 1, NULL, &id));
        CHECK_EQ_INT(wait_done(p, SER, id, &r[w]), KVS_TASK_FAILED);
        CHECK_EQ_INT(r[w].status, KVS_ENOSPC);
        CHECK_EQ_STR(r[w].message, "processor: serialize object 0 of 1 failed: fp8: "
                                   "destination too small: 99999 bytes, need 100000");
        CHECK_EQ_U64(small->used_size, NEL - 1);
        CHECK_EQ_INT(((uint8_t *)small->data)[0], 0x77);
        /* an unsupported group */
        REQUIRE_OK(kvs_processor_submit_serialize(p, &bsrc, 1, &big, 1, NULL, &id));
        CHECK_EQ_INT(wait_done(p, SER, id, &r[w]), KVS_TASK_FAILED);
        CHECK_EQ_STR(r[w].message, "processor: serialize object 0 of 1 failed: fp8: "
                                   "unsupported source dtype 'uint8' in group 1; expected "
                                   "float32, float16 or bfloat16");
        CHECK_EQ_INT(((uint8_t *)big->data)[0], 0x77);
        /* a truncated blob */
        REQUIRE_OK(kvs_memobj_set_used_size(small, 10));
        REQUIRE_OK(kvs_processor_submit_deserialize(p, &small, 1, &src, 1, NULL, &id));
        CHECK_EQ_INT(wait_done(p, DE, id, &r[w]), KVS_TASK_FAILED);
        CHECK_EQ_INT(r[w].status, KVS_ECORRUPT);
        CHECK_EQ_STR(r[w].message, "processor: deserialize object 0 of 1 failed: fp8: "
                                   "stored object is 10 bytes, destination layout "
                                   "needs 100000");
        kvs_memobj_free(small);
        kvs_memobj_free(big);
    }
    kvs_memobj_free(src);
    kvs_memobj_free(bsrc);
    kvs_processor_destroy(split);
    kvs_processor_destroy(whole);
}

static void *nothing(void *arg) { return arg; }

int main(void)
{
    /* A broken processor tends to hang (a lost signal, a deadlock) rather
     * than crash: fail within minutes instead of at ctest's timeout. */
    alarm(300);
    /* A sanitizer's helper thread starts with the first thread the program
     * creates: start it now, then take the baseline. */
    pthread_t t;
    if (pthread_create(&t, NULL, nothing, NULL) == 0)
        pthread_join(t, NULL);
    usleep(20000);
    base_threads = count_threads();
    /* upstream group A */
    RUN(test_fds_are_distinct);
    RUN(test_completion_hooks_replace_the_fd);
    RUN(test_small_tasks_run_inline);
    RUN(test_serialize_signals_fd_and_result_is_ok);
    RUN(test_deserialize_signals_fd_and_result_is_ok);
    RUN(test_serialize_failure_reports_failed);
    RUN(test_deserialize_failure_reports_failed);
    RUN(test_query_unknown_id_is_pending);
    RUN(test_estimate_delegates);
    RUN(test_serialize_narrows_dst_to_bytes_written);
    RUN(test_serialize_failure_does_not_narrow_dst);
    RUN(test_serialize_sets_used_size_exactly);
    RUN(test_serializer_reporting_too_many_bytes_fails);
    /* decisions */
    RUN(test_event_fds_are_nonblocking_cloexec_eventfds);
    RUN(test_task_ids_one_counter_from_zero);
    RUN(test_one_signal_per_task);
    RUN(test_result_recorded_before_signal);
    RUN(test_other_directions_id_is_pending);
    RUN(test_batch_stops_at_first_failure);
    RUN(test_batch_success_and_deserialize_does_not_narrow);
    RUN(test_bad_submits_refused_and_nothing_queued);
    RUN(test_empty_batch_completes_at_once);
    RUN(test_submit_after_close_and_close_twice);
    RUN(test_close_finishes_queued_and_running_tasks);
    RUN(test_concurrent_close);
    RUN(test_close_from_worker_refused);
    RUN(test_workers_shared_by_both_directions);
    RUN(test_transform_runs_outside_the_lock);
    RUN(test_arrays_copied_at_submit);
    RUN(test_long_failure_message_truncated);
    RUN(test_create_refusals_destroy_the_pair);
    RUN(test_destroy_owns_everything);
    RUN(test_null_arguments);
    RUN(test_event_fd_consume);
    RUN(test_other_implementations_are_checked);
    RUN(test_registry_fp8_processors_are_independent);
    /* splitting one object across the workers */
    RUN(test_split_runs_on_both_workers);
    RUN(test_split_only_when_it_can_help);
    RUN(test_parallel_for_contract);
    RUN(test_split_nested_runs_inline);
    RUN(test_split_failure_is_the_first_by_position);
    RUN(test_close_during_split);
    RUN(test_set_split_refusals);
    RUN(test_split_fp8_bytes_identical);
    RUN(test_split_fp8_refusals_unchanged);
    return TEST_SUMMARY();
}
