/* bench_processor.c - the async processor: round-trip latency of a tiny
 * task, and fp8 serialize throughput with 1 and 2 workers as a ratio to
 * memcpy of the same bytes in the same run. Reports; asserts nothing.
 *
 *   bench_processor [latency_iterations] [objects]
 *
 * Latency: one 64-element bfloat16 object through fp8, 1 worker (the
 * default): submit -> poll(2) says the fd is readable -> drain -> query,
 * timed per task; median and p99 over the iterations (default 20000).
 *
 * Throughput: `objects` (default 4) bfloat16 objects of 64 MiB each, one
 * task per object, all submitted at once; the wall time from the first
 * submit to the last result, best of 5. memcpy copies the same source bytes
 * (one thread) in the same run; ratio = fp8 source GB/s / memcpy GB/s.
 * Then the same for 8 cache-resident 1 MiB objects, 64 times over.
 *
 * Split (issue 4: "large objects are split across the processor's
 * workers"): ONE 256 MiB bfloat16 object per task, one task at a time,
 * serialize (bf16 -> e4m3fn) and deserialize (e4m3fn -> bf16), with 1
 * worker, 2 workers that may split it (the default threshold) and 2 workers
 * that may not, and with several piece sizes; as GB/s of the bfloat16 side
 * and as a ratio to memcpy of the same bytes (one thread) in the same run,
 * medians over 15 rounds that each run every configuration once in turn (so
 * bursts of other work hit them alike). Then the object size sweep that
 * picks the threshold: per size, the time with 2 workers split in 2 pieces
 * over the time unsplit, tasks interleaved.
 *
 *   bench_processor --split      only the split figures
 *
 *   bench_processor --latency-runs [runs] [iterations] [same|apart|free]
 *
 * The round trip above, `runs` times (default 10) with a fresh processor
 * each (a fresh worker thread, placed anew by the scheduler), `iterations`
 * tasks each (default 5000): per run the median and p99, the CPUs the
 * caller and the worker ran on, and how often each CPU entered an idle
 * state per task (cpuidle "usage" counters: a halted vCPU must be woken
 * by an IPI, a VM exit on a KVM guest). `same` pins the caller and the
 * worker to CPU 0, `apart` the caller to CPU 0 and the worker to CPU 1,
 * `free` (default) pins nothing. Then the median and p99 over all runs.
 * This is how the two modes of the round trip (docs/performance.md,
 * "Processor round trip: two modes") were told apart.
 */
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvserde/error.h"
#include "kvserde/fp8.h"
#include "kvserde/memobj.h"
#include "kvserde/processor.h"
#include "kvserde/serde.h"
#include "bench_timing.h"
#include "kv_values.h"


static int die(const char *what)
{
    fprintf(stderr, "bench_processor: %s: %s\n", what, kvs_last_error());
    return 1;
}

static int fp8_processor(unsigned workers, kvs_processor **p)
{
    kvs_serializer *ser;
    kvs_deserializer *de;
    int rc = kvs_fp8_serde_create(KVS_DTYPE_FLOAT8_E4M3FN, 1, &ser, &de);
    if (rc != KVS_OK)
        return rc;
    return kvs_async_processor_create(ser, de, workers, p);
}

/* Idle entries of one CPU so far, over its cpuidle states (-1: unknown). */
static long long idle_entries(int cpu)
{
    long long sum = -1;
    for (int st = 0; st < 8; st++) {
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cpuidle/state%d/usage", cpu, st);
        FILE *f = fopen(path, "r");
        if (f == NULL) break;
        long long v = 0;
        if (fscanf(f, "%lld", &v) == 1) sum = (sum < 0 ? 0 : sum) + v;
        fclose(f);
    }
    return sum;
}

/* The round trip of a 64-element bfloat16 object through fp8 on `p`:
 * `iterations` timed tasks (us into lat[]) after iterations / 10 untimed
 * ones. If idle[] is not NULL, the idle entries of CPUs 0 and 1 over the
 * timed tasks go there (see idle_entries). */
static int round_trips(kvs_processor *p, int iterations, double *lat, long long *idle)
{
    kvs_layout kv, tmp_layout;
    kvs_layout_flat(&kv, 64, KVS_DTYPE_BFLOAT16);
    size_t est;
    kvs_processor_estimate_serialized_size(p, &kv, &est);
    kvs_layout_flat(&tmp_layout, est, KVS_DTYPE_UINT8);
    kvs_memobj *src, *dst;
    if (kvs_memobj_alloc(&kv, KVS_FMT_KV_2LTD, &src) != KVS_OK ||
        kvs_memobj_alloc(&tmp_layout, KVS_FMT_BINARY_BUFFER, &dst) != KVS_OK)
        return die("alloc");
    kvs_bench_fill_bf16(src->data, 64, 1);
    int fd = kvs_processor_serialize_event_fd(p);
    for (int i = -iterations / 10; i < iterations; i++) {
        if (i == 0 && idle)
            for (int c = 0; c < 2; c++) idle[c] = idle_entries(c);
        double t0 = now_s();
        kvs_task_id id;
        if (kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id) != KVS_OK)
            return die("submit");
        struct pollfd pfd = {fd, POLLIN, 0};
        while (poll(&pfd, 1, -1) != 1) {
        }
        kvs_event_fd_consume(fd, NULL);
        kvs_task_result r;
        kvs_processor_query_serialize_result(p, id, &r);
        double t1 = now_s();
        if (r.state != KVS_TASK_OK) {
            fprintf(stderr, "bench_processor: task %llu: state %d %s\n",
                    (unsigned long long)id, (int)r.state, r.message);
            return 1;
        }
        if (i >= 0)
            lat[i] = (t1 - t0) * 1e6;
    }
    if (idle)
        for (int c = 0; c < 2; c++)
            idle[c] = idle[c] < 0 ? -1 : idle_entries(c) - idle[c];
    kvs_memobj_free(src);
    kvs_memobj_free(dst);
    return 0;
}

static int bench_latency(int iterations)
{
    kvs_processor *p;
    if (fp8_processor(1, &p) != KVS_OK)
        return die("create");
    double *lat = malloc((size_t)iterations * sizeof *lat);
    if (lat == NULL)
        return 1;
    if (round_trips(p, iterations, lat, NULL) != 0)
        return 1;
    qsort(lat, (size_t)iterations, sizeof *lat, cmp_double);
    printf("round trip (submit -> fd readable -> query), 64 bf16 elements, 1 worker, %d "
           "tasks:\n  median %.1f us   p99 %.1f us   min %.1f us\n",
           iterations, lat[iterations / 2], lat[(size_t)((double)iterations * 0.99)],
           lat[0]);
    free(lat);
    kvs_processor_destroy(p);
    return 0;
}

/* Seconds for the processor to serialize every object `waves` times: each
 * wave submits one task per object at once and waits for all of them. */
static double run_fp8(kvs_processor *p, kvs_memobj **src, kvs_memobj **dst, int n,
                      int waves)
{
    int fd = kvs_processor_serialize_event_fd(p);
    double t0 = now_s();
    for (int w = 0; w < waves; w++) {
        kvs_task_id first = 0;
        for (int i = 0; i < n; i++) {
            kvs_task_id id;
            if (kvs_processor_submit_serialize(p, &src[i], 1, &dst[i], 1, NULL, &id) != KVS_OK)
                return -1;
            if (i == 0)
                first = id;
        }
        int done = 0;
        while (done < n) {
            struct pollfd pfd = {fd, POLLIN, 0};
            poll(&pfd, 1, -1);
            uint64_t c;
            kvs_event_fd_consume(fd, &c);
            done += (int)c;
        }
        for (int i = 0; i < n; i++) {
            kvs_task_result r;
            kvs_processor_query_serialize_result(p, first + (kvs_task_id)i, &r);
            if (r.state != KVS_TASK_OK) {
                fprintf(stderr, "bench_processor: %s\n", r.message);
                return -1;
            }
        }
    }
    return now_s() - t0;
}

/* memcpy on a second thread, to show the machine's memory ceiling. */
struct copy_job {
    kvs_memobj **src;
    void *dst;
    int from, to, waves;
    size_t bytes;
};

static void *copy_main(void *arg)
{
    struct copy_job *j = arg;
    for (int w = 0; w < j->waves; w++)
        for (int i = j->from; i < j->to; i++)
            memcpy(j->dst, j->src[i]->data, j->bytes);
    return NULL;
}

/* Seconds for two threads to copy every object `waves` times (each thread
 * half of the objects, into its own buffer). */
static double run_memcpy2(kvs_memobj **src, void *dst0, void *dst1, int n, int waves,
                          size_t bytes)
{
    struct copy_job a = {src, dst0, 0, n / 2, waves, bytes};
    struct copy_job b = {src, dst1, n / 2, n, waves, bytes};
    pthread_t t;
    double t0 = now_s();
    if (pthread_create(&t, NULL, copy_main, &b) != 0)
        return -1;
    copy_main(&a);
    pthread_join(t, NULL);
    return now_s() - t0;
}

/* fp8 serialize of `nobj` bfloat16 objects of `obj_bytes` each, `waves`
 * times, with 1 and 2 workers, against memcpy of the same source bytes.
 * Rounds alternate memcpy, 1 worker and 2 workers so that noise from other
 * work on the machine hits all three alike; the best round of each counts. */
static int bench_throughput(size_t obj_bytes, int nobj, int waves, int rounds)
{
    size_t nel = obj_bytes / 2;
    kvs_layout kv, tmp_layout;
    kvs_layout_flat(&kv, nel, KVS_DTYPE_BFLOAT16);
    kvs_memobj **src = calloc((size_t)nobj, sizeof *src);
    kvs_memobj **dst = calloc((size_t)nobj, sizeof *dst);
    kvs_memobj *copy, *copy2;
    kvs_processor *p;
    if (src == NULL || dst == NULL)
        return 1;
    if (fp8_processor(1, &p) != KVS_OK)
        return die("create");
    size_t est;
    kvs_processor_estimate_serialized_size(p, &kv, &est);
    kvs_processor_destroy(p);
    kvs_layout_flat(&tmp_layout, est, KVS_DTYPE_UINT8);
    for (int i = 0; i < nobj; i++) {
        if (kvs_memobj_alloc(&kv, KVS_FMT_KV_2LTD, &src[i]) != KVS_OK ||
            kvs_memobj_alloc(&tmp_layout, KVS_FMT_BINARY_BUFFER, &dst[i]) != KVS_OK)
            return die("alloc");
        kvs_bench_fill_bf16(src[i]->data, nel, (uint32_t)i * 977u);
    }
    if (kvs_memobj_alloc(&kv, KVS_FMT_KV_2LTD, &copy) != KVS_OK ||
        kvs_memobj_alloc(&kv, KVS_FMT_KV_2LTD, &copy2) != KVS_OK)
        return die("alloc");

    double total = (double)nobj * (double)obj_bytes * waves;
    double best_memcpy = 1e9, best_memcpy2 = 1e9, best[3] = {0, 1e9, 1e9};
    for (int round = 0; round < rounds; round++) {
        double t0 = now_s();
        for (int w = 0; w < waves; w++)
            for (int i = 0; i < nobj; i++)
                memcpy(copy->data, src[i]->data, obj_bytes);
        double t = now_s() - t0;
        if (t < best_memcpy)
            best_memcpy = t;
        t = run_memcpy2(src, copy->data, copy2->data, nobj, waves, obj_bytes);
        if (t > 0 && t < best_memcpy2)
            best_memcpy2 = t;
        for (unsigned wk = 1; wk <= 2; wk++) {
            if (fp8_processor(wk, &p) != KVS_OK)
                return die("create");
            t = run_fp8(p, src, dst, nobj, waves);
            kvs_processor_destroy(p);
            if (t < 0)
                return die("serialize");
            if (t < best[wk])
                best[wk] = t;
        }
    }
    double memcpy_gbs = total / best_memcpy / 1e9;
    printf("fp8 serialize (e4m3fn, saturate, %s kernels), %d x %zu KiB bfloat16 objects "
           "x %d, one object per task, best of %d:\n",
           kvs_fp8_isa(), nobj, obj_bytes >> 10, waves, rounds);
    printf("  memcpy (1 thread)  %6.2f GB/s   1.00x memcpy\n", memcpy_gbs);
    for (unsigned wk = 1; wk <= 2; wk++) {
        double gbs = total / best[wk] / 1e9;
        printf("  fp8, %u worker%s     %6.2f GB/s   %.2fx memcpy\n", wk, wk > 1 ? "s" : " ",
               gbs, gbs / memcpy_gbs);
    }
    printf("  2 workers / 1 worker: %.2fx   (memcpy on 2 threads: %.2f GB/s, %.2fx one "
           "thread: the machine's ceiling)\n",
           best[1] / best[2], total / best_memcpy2 / 1e9, best_memcpy / best_memcpy2);
    for (int i = 0; i < nobj; i++) {
        kvs_memobj_free(src[i]);
        kvs_memobj_free(dst[i]);
    }
    kvs_memobj_free(copy);
    kvs_memobj_free(copy2);
    free(src);
    free(dst);
    return 0;
}

/* ---------------------------------------------------------------------
 * Splitting one object across workers
 * ------------------------------------------------------------------ */

enum { SER, DE };

/* Seconds for one task of one object: submit -> fd readable -> query. */
static double one_task(kvs_processor *p, int dir, kvs_memobj *src, kvs_memobj *dst)
{
    int fd = dir == SER ? kvs_processor_serialize_event_fd(p)
                        : kvs_processor_deserialize_event_fd(p);
    kvs_task_id id;
    double t0 = now_s();
    int rc = dir == SER ? kvs_processor_submit_serialize(p, &src, 1, &dst, 1, NULL, &id)
                        : kvs_processor_submit_deserialize(p, &src, 1, &dst, 1, NULL, &id);
    if (rc != KVS_OK)
        return -1;
    struct pollfd pfd = {fd, POLLIN, 0};
    while (poll(&pfd, 1, -1) != 1) {
    }
    kvs_event_fd_consume(fd, NULL);
    kvs_task_result res;
    if (dir == SER)
        kvs_processor_query_serialize_result(p, id, &res);
    else
        kvs_processor_query_deserialize_result(p, id, &res);
    double t = now_s() - t0;
    if (res.state != KVS_TASK_OK) {
        fprintf(stderr, "bench_processor: %s\n", res.message);
        return -1;
    }
    return t;
}

/* An fp8 processor with `workers` threads, the given split threshold and
 * piece size (0: the default). */
static kvs_processor *split_processor(unsigned workers, size_t min_bytes, size_t chunk)
{
    kvs_processor *p;
    if (fp8_processor(workers, &p) != KVS_OK)
        return NULL;
    if (kvs_async_processor_set_split(p, min_bytes, chunk) != KVS_OK) {
        kvs_processor_destroy(p);
        return NULL;
    }
    return p;
}

/* The 256 MiB case. Every round runs memcpy and one task per configuration
 * and direction, in turn, so a burst of other work on the machine hits them
 * all alike; each figure is the median over the rounds. */
static int bench_split_large(size_t bytes, int rounds)
{
    size_t nel = bytes / 2;
    kvs_layout kv, blob;
    kvs_layout_flat(&kv, nel, KVS_DTYPE_BFLOAT16);
    kvs_layout_flat(&blob, nel + nel / 2, KVS_DTYPE_UINT8);
    kvs_memobj *src, *tmp, *back, *copy;
    if (kvs_memobj_alloc(&kv, KVS_FMT_KV_2LTD, &src) != KVS_OK ||
        kvs_memobj_alloc(&blob, KVS_FMT_BINARY_BUFFER, &tmp) != KVS_OK ||
        kvs_memobj_alloc(&kv, KVS_FMT_KV_2LTD, &back) != KVS_OK ||
        kvs_memobj_alloc(&kv, KVS_FMT_KV_2LTD, &copy) != KVS_OK)
        return die("alloc");
    kvs_bench_fill_bf16(src->data, nel, 7);
    memset(tmp->data, 0, tmp->capacity);
    memset(back->data, 0, bytes);
    memset(copy->data, 0, bytes);

    static const struct {
        const char *label;
        unsigned workers;
        size_t min_bytes, chunk;
    } cfg[] = {
        {"1 worker                        ", 1, SIZE_MAX, 0},
        {"2 workers, no split             ", 2, SIZE_MAX, 0},
        {"2 workers, split (defaults)     ", 2, KVS_SPLIT_DEFAULT_MIN_BYTES, 0},
        {"2 workers, split,   1 MiB pieces", 2, 0, (size_t)1 << 20},
        {"2 workers, split,   4 MiB pieces", 2, 0, (size_t)4 << 20},
        {"2 workers, split,  16 MiB pieces", 2, 0, (size_t)16 << 20},
        {"2 workers, split,  64 MiB pieces", 2, 0, (size_t)64 << 20},
        {"2 workers, split, 128 MiB pieces", 2, 0, (size_t)128 << 20},
    };
    enum { NCFG = sizeof cfg / sizeof cfg[0] };
    kvs_processor *p[NCFG];
    for (int i = 0; i < NCFG; i++)
        if ((p[i] = split_processor(cfg[i].workers, cfg[i].min_bytes, cfg[i].chunk)) == NULL)
            return die("create");
    double *t = malloc((size_t)rounds * (2 * NCFG + 1) * sizeof *t);
    if (t == NULL)
        return 1;
    for (int r = -1; r < rounds; r++) { /* round -1 warms up */
        double t0 = now_s();
        memcpy(copy->data, src->data, bytes);
        if (r >= 0)
            t[(2 * NCFG) * rounds + r] = now_s() - t0;
        for (int dir = SER; dir <= DE; dir++)
            for (int i = 0; i < NCFG; i++) {
                double x = dir == SER ? one_task(p[i], SER, src, tmp)
                                      : one_task(p[i], DE, tmp, back);
                if (x < 0)
                    return die("transform");
                if (r >= 0)
                    t[(dir * NCFG + i) * rounds + r] = x;
            }
    }
    double mc = median(t + (2 * NCFG) * rounds, rounds);
    printf("one %zu MiB bfloat16 object per task, one task at a time (%s kernels), "
           "median of %d interleaved rounds:\n  memcpy (1 thread)                 %6.2f GB/s\n",
           bytes >> 20, kvs_fp8_isa(), rounds, (double)bytes / mc / 1e9);
    for (int dir = SER; dir <= DE; dir++) {
        printf("  %s\n", dir == SER ? "serialize bf16 -> e4m3fn:" : "deserialize e4m3fn -> bf16:");
        double base = 0;
        for (int i = 0; i < NCFG; i++) {
            double m = median(t + (dir * NCFG + i) * rounds, rounds);
            if (i == 0)
                base = m;
            printf("    %s %6.2f GB/s   %.2fx memcpy   %.2fx 1 worker\n", cfg[i].label,
                   (double)bytes / m / 1e9, mc / m, base / m);
        }
    }
    free(t);
    for (int i = 0; i < NCFG; i++)
        kvs_processor_destroy(p[i]);
    kvs_memobj_free(src);
    kvs_memobj_free(tmp);
    kvs_memobj_free(back);
    kvs_memobj_free(copy);
    return 0;
}

/* Per object size and direction: 2 workers that split every object into 2
 * pieces (threshold 0) against 2 workers that never split, interleaved
 * task by task; medians. */
static int bench_split_sweep(void)
{
    static const size_t sizes[] = {(size_t)256 << 10, (size_t)1 << 20,  (size_t)2 << 20,
                                   (size_t)4 << 20,   (size_t)8 << 20,  (size_t)16 << 20,
                                   (size_t)32 << 20,  (size_t)64 << 20, (size_t)256 << 20};
    size_t maxb = sizes[sizeof sizes / sizeof sizes[0] - 1];
    kvs_layout kv, blob;
    kvs_layout_flat(&kv, maxb / 2, KVS_DTYPE_BFLOAT16);
    kvs_layout_flat(&blob, maxb / 2, KVS_DTYPE_UINT8);
    kvs_memobj *big, *bigtmp;
    if (kvs_memobj_alloc(&kv, KVS_FMT_KV_2LTD, &big) != KVS_OK ||
        kvs_memobj_alloc(&blob, KVS_FMT_BINARY_BUFFER, &bigtmp) != KVS_OK)
        return die("alloc");
    kvs_bench_fill_bf16(big->data, maxb / 2, 3);
    memset(bigtmp->data, 0x3c, maxb / 2);
    kvs_processor *whole = split_processor(2, SIZE_MAX, 0);
    kvs_processor *split = split_processor(2, 0, 0);
    if (split == NULL || whole == NULL)
        return die("create");
    printf("object size sweep, one task at a time, 2 workers, each object split in 2 "
           "pieces or not at all\n(medians of interleaved tasks; bfloat16 side size):\n"
           "  %9s  %-28s  %-28s\n  %9s  %9s %9s %8s  %9s %9s %8s\n",
           "", "serialize bf16 -> e4m3fn", "deserialize e4m3fn -> bf16", "object",
           "unsplit", "split", "speedup", "unsplit", "split", "speedup");
    enum { MAXREPS = 2001 };
    double *tw = malloc(MAXREPS * sizeof *tw), *ts = malloc(MAXREPS * sizeof *ts);
    if (tw == NULL || ts == NULL)
        return 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t bytes = sizes[i];
        kvs_memobj kvo, blo;
        kvs_layout l, bl;
        kvs_layout_flat(&l, bytes / 2, KVS_DTYPE_BFLOAT16);
        kvs_layout_flat(&bl, bytes / 2, KVS_DTYPE_UINT8);
        kvs_memobj_init(&kvo, big->data, bytes, &l, KVS_FMT_KV_2LTD);
        kvs_memobj_init(&blo, bigtmp->data, bytes / 2, &bl, KVS_FMT_BINARY_BUFFER);
        if (kvs_async_processor_set_split(split, 0, bytes / 2) != KVS_OK)
            return die("set_split");
        int reps = (int)(((size_t)2 << 30) / bytes) | 1;
        if (reps > MAXREPS)
            reps = MAXREPS;
        if (reps < 15)
            reps = 15;
        printf("  %6zu KiB", bytes >> 10);
        for (int dir = SER; dir <= DE; dir++) {
            kvs_memobj *src = dir == SER ? &kvo : &blo, *dst = dir == SER ? &blo : &kvo;
            for (int r = -1; r < reps; r++) {
                double a = one_task(whole, dir, src, dst);
                double b = one_task(split, dir, src, dst);
                if (a < 0 || b < 0)
                    return die("transform");
                if (r >= 0) {
                    tw[r] = a;
                    ts[r] = b;
                }
            }
            double mw = median(tw, reps), ms = median(ts, reps);
            printf("  %7.0f us %7.0f us %7.2fx", mw * 1e6, ms * 1e6, mw / ms);
        }
        printf("\n");
    }
    free(tw);
    free(ts);
    kvs_processor_destroy(split);
    kvs_processor_destroy(whole);
    kvs_memobj_free(big);
    kvs_memobj_free(bigtmp);
    return 0;
}

/* The worker thread of the processor just created: the task named
 * "kvs-proc-0" of this process (tid, or -1). */
static int find_worker_tid(void)
{
    DIR *d = opendir("/proc/self/task");
    if (d == NULL) return -1;
    int tid = -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && tid < 0) {
        if (e->d_name[0] == '.') continue;
        char path[300], name[64] = "";
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL) continue;
        if (fgets(name, sizeof name, f) && strncmp(name, "kvs-proc-0", 10) == 0)
            tid = atoi(e->d_name);
        fclose(f);
    }
    closedir(d);
    return tid;
}

/* The CPU a thread last ran on (/proc/<tid>/stat field 39), or -1. */
static int last_cpu(int tid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the name may hold spaces */
    if (p == NULL) return -1;
    int field = 2, cpu = -1;
    for (char *tok = strtok(p + 1, " "); tok; tok = strtok(NULL, " "))
        if (++field == 39) { cpu = atoi(tok); break; }
    return cpu;
}

static void pin(int tid, int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)sched_setaffinity(tid, sizeof set, &set);
}

static int bench_latency_runs(int runs, int iterations, const char *placement)
{
    int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    double *all = malloc((size_t)runs * (size_t)iterations * sizeof *all);
    double *lat = malloc((size_t)iterations * sizeof *lat);
    if (all == NULL || lat == NULL) return 1;
    cpu_set_t saved;
    sched_getaffinity(0, sizeof saved, &saved);
    printf("round trip, %d runs of %d tasks, a fresh processor per run, placement %s:\n",
           runs, iterations, placement);
    printf("  run  median us  p99 us  caller cpu  worker cpu  idle entries per task (cpu0 cpu1)\n");
    for (int run = 0; run < runs; run++) {
        kvs_processor *p;
        if (fp8_processor(1, &p) != KVS_OK) return die("create");
        int wtid = find_worker_tid();
        if (strcmp(placement, "same") == 0) {
            pin(0, 0);
            pin(wtid, 0);
        } else if (strcmp(placement, "apart") == 0 && ncpu > 1) {
            pin(0, 0);
            pin(wtid, 1);
        }
        long long idle[2];
        if (round_trips(p, iterations, lat, idle) != 0)
            return 1;
        double idle_per[2];
        for (int c = 0; c < 2; c++)
            idle_per[c] = c < ncpu && idle[c] >= 0 ? (double)idle[c] / iterations : -1;
        int ccpu = sched_getcpu(), wcpu = last_cpu(wtid);
        memcpy(all + (size_t)run * iterations, lat, (size_t)iterations * sizeof *lat);
        qsort(lat, (size_t)iterations, sizeof *lat, cmp_double);
        printf("  %3d  %9.1f  %6.1f  %10d  %10d  %.2f %.2f\n", run, lat[iterations / 2],
               lat[(size_t)((double)iterations * 0.99)], ccpu, wcpu, idle_per[0], idle_per[1]);
        kvs_processor_destroy(p);
        sched_setaffinity(0, sizeof saved, &saved);
    }
    size_t total = (size_t)runs * iterations;
    qsort(all, total, sizeof *all, cmp_double);
    double la[3] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3) la[0] = -1;
        fclose(f);
    }
    printf("  all runs: median %.1f us  p99 %.1f us  (load average %.2f %.2f %.2f)\n",
           all[total / 2], all[(size_t)((double)total * 0.99)], la[0], la[1], la[2]);
    free(all);
    free(lat);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--latency-runs") == 0) {
        int runs = argc > 2 ? atoi(argv[2]) : 10;
        int iterations = argc > 3 ? atoi(argv[3]) : 5000;
        const char *placement = argc > 4 ? argv[4] : "free";
        if (runs < 1 || iterations < 10 ||
            (strcmp(placement, "free") && strcmp(placement, "same") && strcmp(placement, "apart"))) {
            fprintf(stderr, "usage: bench_processor --latency-runs [runs >= 1] "
                            "[iterations >= 10] [same|apart|free]\n");
            return 2;
        }
        return bench_latency_runs(runs, iterations, placement);
    }
    if (argc > 1 && strcmp(argv[1], "--split") == 0) {
        if (bench_split_large((size_t)256 << 20, 15) != 0)
            return 1;
        return bench_split_sweep();
    }
    int iterations = argc > 1 ? atoi(argv[1]) : 20000;
    int nobj = argc > 2 ? atoi(argv[2]) : 4;
    if (iterations < 10 || nobj < 1) {
        fprintf(stderr, "usage: bench_processor [latency_iterations >= 10] [objects >= 1]\n"
                        "       bench_processor --split\n"
                        "       bench_processor --latency-runs [runs] [iterations] "
                        "[same|apart|free]\n");
        return 2;
    }
    if (bench_latency(iterations) != 0)
        return 1;
    /* The case: 64 MiB objects, far larger than the caches, so the
     * figure is bound by DRAM bandwidth. */
    if (bench_throughput((size_t)64 << 20, nobj, 1, 5) != 0)
        return 1;
    /* The same work in cache-resident pieces (8 x 1 MiB of source, 6 MiB of
     * output, within L3): what the workers do when memory is not the
     * limit. */
    if (bench_throughput((size_t)1 << 20, 8, 64, 5) != 0)
        return 1;
    if (bench_split_large((size_t)256 << 20, 15) != 0)
        return 1;
    return bench_split_sweep();
}
