/* bench_l2.c - L2 store and load throughput through the serde wrapper: the
 * Redis adapter against a local redis-server this program starts (and
 * stops), next to the filesystem adapter in a directory under /tmp.
 * Reports; asserts nothing.
 *
 *   bench_l2 [chunks_per_task] [repetitions]
 *
 * A chunk is 32 MiB of fp8 as stored (float8_e4m3fn), serialized from a
 * 64 MiB bfloat16 object (32 Mi elements) by the fp8 serde. One store task
 * of `chunks_per_task` chunks (default 4), then one load task of the same
 * keys into fresh objects, each timed from submit to its result (the wrapper
 * serializes / deserializes on its processor's worker; the adapter does the
 * I/O on its own threads); median of `repetitions` (default 5). Figures are
 * GB/s (10^9 bytes/s) of raw bytes: the bfloat16 side.
 *
 *   bench_l2 --vs-hiredis [runs] [values]
 *
 * The raw Redis adapter (no serde) next to plain hiredis on the same
 * server (this program's): `values` (default 4, even) values of 32 MiB,
 * 2 connections. kvserde: one store task, then one load task of all the
 * values into KV-shaped objects (connections: 2, so each connection has
 * half of them). Plain hiredis: 2 threads, each with its own blocking
 * redisContext (redisConnect), SET / GET of its half, one redisCommand per
 * value; loads are reported as GET alone (the reply freed) and as GET plus
 * the memcpy into the destination object. Every run (default 9) does the
 * five in turn, the order rotating by run, so load changes on a shared
 * machine hit all of them alike. Reports median, min and max GB/s of each,
 * the ratios of the medians to plain hiredis, and the load average.
 *
 *   bench_l2 --vs-plain-fs [runs] [chunks]
 *
 * The fs adapter (fsync on, its default 2 workers) next to a plain loop on
 * the same bytes, in a directory under /tmp: `chunks` (default 8) bfloat16
 * chunks of 16 Mi elements, i.e. 16 MiB each as fp8. Every run (default 9)
 * does, in rotating order: one store task of the chunks through the fp8
 * serde ("serde": {"type": "fp8"}); one store task of their fp8 codes
 * (made once, before timing) through the raw adapter (no serde); and the
 * plain loop: 2 threads, each writing its half of the same codes as files,
 * one per chunk: open a temp file, write, fsync, close, rename over the
 * final name, fsync the directory. Then the fp8 serialize alone: the
 * chunks through kvs_serialize on this thread (the wrapper's processor
 * does that work before its inner store starts). GB/s are of the fp8 bytes
 * written; the fp8 store's ratio to the plain loop pairs each run's two
 * figures (median of the per-run ratios). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "kvserde/error.h"
#include "kvserde/fp8.h"
#include "kvserde/l2.h"
#include "kvserde/l2_fs.h"
#include "kvserde/l2_redis.h"
#include "kvserde/memobj.h"
#include "kvserde/processor.h"
#include "bench_timing.h"

#define CHUNK_ELEMS ((size_t)32 << 20) /* 32 Mi elements: 32 MiB of fp8 */
#define WAIT_MS 120000

/* the tests' helpers: redis-server processes, waiting on event fds (WAIT_MS
 * above) */
#include "kvs_test_l2.h"
#include "kvs_test_redis.h"

/* Key k of `model` and a source and a destination object of layout l; 0,
 * or -1 with a message. */
static int make_pair(const kvs_layout *l, size_t k, const char *model, kvs_object_key *key,
                     kvs_memobj **src, kvs_memobj **dst)
{
    uint8_t h[8] = {(uint8_t)k, 1, 2, 3, 4, 5, 6, 7};
    if (kvs_object_key_init(key, h, sizeof h, model, 0, 0, NULL) != KVS_OK ||
        kvs_memobj_alloc(l, KVS_FMT_KV_2LTD, src) != KVS_OK ||
        kvs_memobj_alloc(l, KVS_FMT_KV_2LTD, dst) != KVS_OK) {
        fprintf(stderr, "bench_l2: %s\n", kvs_last_error());
        return -1;
    }
    return 0;
}

/* Plausible KV values: small magnitudes, every mantissa bit used. */
static void fill_chunk(kvs_memobj *o, size_t elems, size_t k)
{
    uint16_t *v = o->data;
    for (size_t i = 0; i < elems; i++) {
        uint32_t x = (uint32_t)(i + k * 7919u) * 2654435761u;
        float f = ((float)(x >> 8) / 16777216.0f) * 8.0f - 4.0f;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        v[i] = (uint16_t)(bits >> 16);
    }
}

/* Store then load `n` chunks, `reps` times; medians in *store_s / *load_s.
 * 0, or -1 with a message. */
static int run(const char *spec, kvs_object_key *keys, kvs_memobj **src, kvs_memobj **dst,
               size_t n, int reps, double *store_s, double *load_s)
{
    kvs_l2_adapter *a = NULL;
    if (kvs_l2_create(spec, &a) != KVS_OK) {
        fprintf(stderr, "bench_l2: %s: %s\n", spec, kvs_last_error());
        return -1;
    }
    double st[64], ld[64];
    int rc = 0;
    for (int r = 0; r < reps && rc == 0; r++) {
        kvs_l2_task_id id;
        double t0 = now_s();
        if (kvs_l2_submit_store(a, keys, src, n, &id) != KVS_OK) {
            fprintf(stderr, "bench_l2: store: %s\n", kvs_last_error());
            rc = -1;
            break;
        }
        kvs_l2_store_result res;
        size_t count = 0;
        while (count == 0) {
            if (!wait_fd(kvs_l2_store_event_fd(a))) {
                fprintf(stderr, "bench_l2: store never finished\n");
                rc = -1;
                break;
            }
            kvs_l2_pop_completed_stores(a, &res, 1, &count);
        }
        if (rc) break;
        st[r] = now_s() - t0;
        if (res.state != KVS_TASK_OK) {
            fprintf(stderr, "bench_l2: store failed: %s\n", res.message);
            rc = -1;
            break;
        }
        t0 = now_s();
        if (kvs_l2_submit_load(a, keys, dst, n, &id) != KVS_OK) {
            fprintf(stderr, "bench_l2: load: %s\n", kvs_last_error());
            rc = -1;
            break;
        }
        kvs_l2_bitmap b = {0};
        for (;;) {
            kvs_l2_query_load(a, id, &b);
            if (b.state != KVS_TASK_PENDING) break;
            if (!wait_fd(kvs_l2_load_event_fd(a))) {
                fprintf(stderr, "bench_l2: load never finished\n");
                rc = -1;
                break;
            }
        }
        ld[r] = now_s() - t0;
        if (rc == 0 && b.nhits != n) {
            fprintf(stderr, "bench_l2: load found %zu of %zu: %s\n", b.nhits, n, b.message);
            rc = -1;
        }
        kvs_l2_bitmap_release(&b);
    }
    kvs_l2_destroy(a);
    if (rc) return rc;
    qsort(st, (size_t)reps, sizeof *st, cmp_double);
    qsort(ld, (size_t)reps, sizeof *ld, cmp_double);
    *store_s = st[reps / 2];
    *load_s = ld[reps / 2];
    return 0;
}

/* ---------------------------------------------------------------------
 * --vs-hiredis: the raw adapter against plain blocking hiredis
 * ------------------------------------------------------------------ */

#define VS_VALUE ((size_t)32 << 20) /* bytes per value */
#define VS_MAX 16                   /* values */
#define VS_CONNS 2

enum { VS_KVS_STORE, VS_PLAIN_SET, VS_KVS_LOAD, VS_PLAIN_GET, VS_PLAIN_GET_COPY, VS_NCASES };

static const char *const vs_name[VS_NCASES] = {
    "kvserde store", "hiredis SET", "kvserde load", "hiredis GET", "hiredis GET + copy"};

/* The plain clients' threads: each argument starts with this. */
typedef struct plain_thread {
    size_t begin, end; /* its share of the values */
    int failed;
} plain_thread;

/* Seconds for `nt` threads (at most 2) running fn over args[0..nt) (each
 * `size` bytes, a plain_thread first), the n values split between them; -1
 * if a thread could not start or failed. */
static double run_plain_threads(void *(*fn)(void *), void *args, size_t size, int nt, size_t n)
{
    pthread_t th[2];
    int started = 0, failed = nt > 2;
    double t0 = now_s();
    for (int k = 0; k < nt && !failed; k++) {
        plain_thread *p = (plain_thread *)((char *)args + size * (size_t)k);
        p->begin = n * (size_t)k / (size_t)nt;
        p->end = n * (size_t)(k + 1) / (size_t)nt;
        p->failed = 0;
        if (pthread_create(&th[k], NULL, fn, p) != 0) failed = 1;
        else started++;
    }
    for (int k = 0; k < started; k++) {
        pthread_join(th[k], NULL);
        failed |= ((plain_thread *)((char *)args + size * (size_t)k))->failed;
    }
    return failed ? -1 : now_s() - t0;
}

typedef struct vs_thread {
    plain_thread pt;
    int port, mode; /* VS_PLAIN_* */
    kvs_object_key *keys;
    kvs_memobj **objs;
} vs_thread;

/* One plain-hiredis thread: SET or GET keys [begin, end) on a blocking
 * connection of its own, under the same Redis keys as the adapter's. */
static void *vs_plain(void *arg)
{
    vs_thread *t = arg;
    redisContext *c = redisConnect("127.0.0.1", t->port);
    if (c == NULL || c->err) {
        t->pt.failed = 1;
        if (c) redisFree(c);
        return NULL;
    }
    char path[KVS_FS_KEY_PATH_MAX + 16];
    for (size_t i = t->pt.begin; i < t->pt.end && !t->pt.failed; i++) {
        memcpy(path, "vs:", 3);
        (void)kvs_fs_key_path(&t->keys[i], path + 3, sizeof path - 3);
        kvs_memobj *o = t->objs[i];
        redisReply *r;
        if (t->mode == VS_PLAIN_SET) {
            r = redisCommand(c, "SET %s %b", path, o->data, kvs_memobj_size(o));
            t->pt.failed = r == NULL || r->type != REDIS_REPLY_STATUS;
        } else {
            r = redisCommand(c, "GET %s", path);
            t->pt.failed = r == NULL || r->type != REDIS_REPLY_STRING || r->len > o->capacity;
            if (!t->pt.failed && t->mode == VS_PLAIN_GET_COPY) {
                memcpy(o->data, r->str, r->len);
                (void)kvs_memobj_set_used_size(o, r->len);
            }
        }
        if (r) freeReplyObject(r);
    }
    redisFree(c);
    return NULL;
}

/* Seconds for one plain-hiredis case over all n values, or -1. */
static double vs_plain_run(int port, int mode, kvs_object_key *keys, kvs_memobj **objs, size_t n)
{
    vs_thread t[VS_CONNS];
    for (int k = 0; k < VS_CONNS; k++) t[k] = (vs_thread){{0, 0, 0}, port, mode, keys, objs};
    return run_plain_threads(vs_plain, t, sizeof t[0], VS_CONNS, n);
}

/* Seconds for one kvserde store or load task of all n values, or -1. */
static double vs_kvs_run(kvs_l2_adapter *a, int mode, kvs_object_key *keys, kvs_memobj **objs,
                         size_t n)
{
    kvs_l2_task_id id;
    double t0 = now_s();
    if (mode == VS_KVS_STORE) {
        if (kvs_l2_submit_store(a, keys, objs, n, &id) != KVS_OK) return -1;
        kvs_l2_store_result res;
        size_t count = 0;
        while (count == 0) {
            if (!wait_fd(kvs_l2_store_event_fd(a))) return -1;
            kvs_l2_pop_completed_stores(a, &res, 1, &count);
        }
        if (res.state != KVS_TASK_OK) {
            fprintf(stderr, "bench_l2: store failed: %s\n", res.message);
            return -1;
        }
        return now_s() - t0;
    }
    if (kvs_l2_submit_load(a, keys, objs, n, &id) != KVS_OK) return -1;
    kvs_l2_bitmap b = {0};
    for (;;) {
        kvs_l2_query_load(a, id, &b);
        if (b.state != KVS_TASK_PENDING) break;
        if (!wait_fd(kvs_l2_load_event_fd(a))) return -1;
    }
    double t = now_s() - t0;
    if (b.nhits != n) {
        fprintf(stderr, "bench_l2: load found %zu of %zu: %s\n", b.nhits, n, b.message);
        t = -1;
    }
    kvs_l2_bitmap_release(&b);
    return t;
}

static void loadavg(char *out, size_t size)
{
    snprintf(out, size, "?");
    FILE *f = fopen("/proc/loadavg", "r");
    if (f == NULL) return;
    double a, b, c;
    if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) snprintf(out, size, "%.2f %.2f %.2f", a, b, c);
    fclose(f);
}

static int vs_hiredis(int port, int runs, size_t n)
{
    kvs_layout l;
    if (kvs_layout_flat(&l, VS_VALUE / 2, KVS_DTYPE_BFLOAT16) != KVS_OK) return 1;
    kvs_object_key keys[VS_MAX];
    kvs_memobj *src[VS_MAX], *dst[VS_MAX];
    for (size_t k = 0; k < n; k++) {
        if (make_pair(&l, k, "vs/model", &keys[k], &src[k], &dst[k]) != 0) return 1;
        uint8_t *v = src[k]->data;
        for (size_t i = 0; i < VS_VALUE; i++) v[i] = (uint8_t)((i * 2654435761u) >> 13 ^ k);
        memset(dst[k]->data, 0, dst[k]->capacity);
    }
    char spec[256];
    snprintf(spec, sizeof spec,
             "{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\",\"connections\":%d,"
             "\"timeout_ms\":60000,\"key_prefix\":\"vs:\"}",
             port, VS_CONNS);
    kvs_l2_adapter *a = NULL;
    if (kvs_l2_create(spec, &a) != KVS_OK) {
        fprintf(stderr, "bench_l2: %s: %s\n", spec, kvs_last_error());
        return 1;
    }
    char la0[64], la1[64];
    loadavg(la0, sizeof la0);
    static double secs[VS_NCASES][64];
    int rc = 0;
    /* A first store so that every load has its values (not timed). */
    if (vs_kvs_run(a, VS_KVS_STORE, keys, src, n) < 0) rc = 1;
    for (int r = 0; r < runs && rc == 0; r++) {
        for (int j = 0; j < VS_NCASES && rc == 0; j++) {
            int c = (j + r) % VS_NCASES;
            int load = c >= VS_KVS_LOAD;
            kvs_memobj **objs = load ? dst : src;
            double t = c == VS_KVS_STORE || c == VS_KVS_LOAD
                           ? vs_kvs_run(a, c, keys, objs, n)
                           : vs_plain_run(port, c, keys, objs, n);
            if (t < 0) {
                fprintf(stderr, "bench_l2: %s failed\n", vs_name[c]);
                rc = 1;
            }
            secs[c][r] = t;
            if (load && c != VS_PLAIN_GET && rc == 0 &&
                memcmp(dst[0]->data, src[0]->data, VS_VALUE) != 0) {
                fprintf(stderr, "bench_l2: %s loaded wrong bytes\n", vs_name[c]);
                rc = 1;
            }
        }
    }
    kvs_l2_destroy(a);
    loadavg(la1, sizeof la1);
    if (rc == 0) {
        double bytes = (double)n * (double)VS_VALUE, med[VS_NCASES];
        printf("Redis on 127.0.0.1 (own redis-server), %zu values of 32 MiB, %d connections, "
               "%d interleaved runs\n",
               n, VS_CONNS, runs);
        printf("load average before: %s, after: %s\n\n", la0, la1);
        printf("%-20s %10s %10s %10s\n", "", "median", "min", "max");
        for (int c = 0; c < VS_NCASES; c++) {
            qsort(secs[c], (size_t)runs, sizeof secs[c][0], cmp_double);
            med[c] = bytes / secs[c][runs / 2] / 1e9;
            printf("%-20s %10.2f %10.2f %10.2f  GB/s\n", vs_name[c], med[c],
                   bytes / secs[c][runs - 1] / 1e9, bytes / secs[c][0] / 1e9);
        }
        printf("\nkvserde store / hiredis SET:        %.2fx\n",
               med[VS_KVS_STORE] / med[VS_PLAIN_SET]);
        printf("kvserde load / hiredis GET:         %.2fx\n", med[VS_KVS_LOAD] / med[VS_PLAIN_GET]);
        printf("kvserde load / hiredis GET + copy:  %.2fx\n",
               med[VS_KVS_LOAD] / med[VS_PLAIN_GET_COPY]);
    }
    for (size_t k = 0; k < n; k++) {
        kvs_memobj_free(src[k]);
        kvs_memobj_free(dst[k]);
    }
    return rc;
}

/* ---------------------------------------------------------------------
 * --vs-plain-fs: the fs store of fp8 chunks against a plain write loop
 * ------------------------------------------------------------------ */

#define PF_CHUNK_ELEMS ((size_t)16 << 20) /* 16 MiB of fp8 per chunk */
#define PF_CHUNKS_MAX 32
#define PF_THREADS 2

enum { PF_FP8_STORE, PF_RAW_STORE, PF_PLAIN, PF_NCASES };
static const char *const pf_name[PF_NCASES] = {"fs store, fp8 serde", "fs store, raw (codes)",
                                               "plain loop, 2 threads"};

typedef struct pf_thread {
    plain_thread pt;
    const char *dir;
    kvs_memobj **codes;
} pf_thread;

/* The plain loop's files [begin, end): temp file, write, fsync, rename,
 * directory fsync, as the fs adapter does for each object. */
static void *pf_plain(void *arg)
{
    pf_thread *t = arg;
    int dfd = open(t->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        t->pt.failed = 1;
        return NULL;
    }
    for (size_t i = t->pt.begin; i < t->pt.end && !t->pt.failed; i++) {
        char tmp[160], fin[160];
        snprintf(tmp, sizeof tmp, "%s/.tmp-%zu", t->dir, i);
        snprintf(fin, sizeof fin, "%s/chunk-%zu", t->dir, i);
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) {
            t->pt.failed = 1;
            break;
        }
        const uint8_t *p = t->codes[i]->data;
        size_t left = kvs_memobj_size(t->codes[i]);
        while (left > 0) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) {
                t->pt.failed = 1;
                break;
            }
            p += w;
            left -= (size_t)w;
        }
        if (fsync(fd) != 0) t->pt.failed = 1;
        close(fd);
        if (t->pt.failed || rename(tmp, fin) != 0 || fsync(dfd) != 0) t->pt.failed = 1;
    }
    close(dfd);
    return NULL;
}

static double pf_plain_run(const char *dir, kvs_memobj **codes, size_t n)
{
    pf_thread t[PF_THREADS];
    for (int k = 0; k < PF_THREADS; k++) t[k] = (pf_thread){{0, 0, 0}, dir, codes};
    return run_plain_threads(pf_plain, t, sizeof t[0], PF_THREADS, n);
}

static int vs_plain_fs(int runs, size_t n)
{
    kvs_layout l;
    if (kvs_layout_flat(&l, PF_CHUNK_ELEMS, KVS_DTYPE_BFLOAT16) != KVS_OK) return 1;
    kvs_object_key keys[PF_CHUNKS_MAX];
    kvs_memobj *src[PF_CHUNKS_MAX], *codes[PF_CHUNKS_MAX];
    kvs_serializer *ser = NULL;
    kvs_deserializer *de = NULL;
    if (kvs_fp8_serde_create(KVS_DTYPE_FLOAT8_E4M3FN, 1, &ser, &de) != KVS_OK) {
        fprintf(stderr, "bench_l2: %s\n", kvs_last_error());
        return 1;
    }
    kvs_layout cl;
    if (kvs_layout_flat(&cl, PF_CHUNK_ELEMS, KVS_DTYPE_UINT8) != KVS_OK) return 1;
    for (size_t k = 0; k < n; k++) {
        kvs_memobj *unused;
        if (make_pair(&l, k, "bench/plainfs", &keys[k], &src[k], &unused) != 0) return 1;
        kvs_memobj_free(unused);
        fill_chunk(src[k], PF_CHUNK_ELEMS, k);
        size_t w = 0;
        if (kvs_memobj_alloc(&cl, KVS_FMT_BINARY_BUFFER, &codes[k]) != KVS_OK ||
            kvs_serialize(ser, src[k], codes[k], NULL, &w) != KVS_OK ||
            kvs_memobj_set_used_size(codes[k], w) != KVS_OK) {
            fprintf(stderr, "bench_l2: %s\n", kvs_last_error());
            return 1;
        }
    }
    char fsdir[96], rawdir[96], plaindir[96], spec[512];
    snprintf(fsdir, sizeof fsdir, "%s/fs-fp8", tmpdir);
    snprintf(rawdir, sizeof rawdir, "%s/fs-raw", tmpdir);
    snprintf(plaindir, sizeof plaindir, "%s/plain", tmpdir);
    if (mkdir(plaindir, 0700) != 0) {
        perror("bench_l2: mkdir");
        return 1;
    }
    kvs_l2_adapter *fp8 = NULL, *raw = NULL;
    snprintf(spec, sizeof spec, "{\"type\":\"fs\",\"path\":\"%s\",\"serde\":{\"type\":\"fp8\"}}",
             fsdir);
    int rc = kvs_l2_create(spec, &fp8);
    snprintf(spec, sizeof spec, "{\"type\":\"fs\",\"path\":\"%s\"}", rawdir);
    if (rc == KVS_OK) rc = kvs_l2_create(spec, &raw);
    if (rc != KVS_OK) {
        fprintf(stderr, "bench_l2: %s\n", kvs_last_error());
        return 1;
    }
    double secs[PF_NCASES][64], ratio[64], ser_s[64];
    /* one untimed round of each first: directories made, temps pooled */
    if (vs_kvs_run(fp8, VS_KVS_STORE, keys, src, n) < 0 ||
        vs_kvs_run(raw, VS_KVS_STORE, keys, codes, n) < 0 || pf_plain_run(plaindir, codes, n) < 0)
        rc = 1;
    for (int r = 0; r < runs && rc == 0; r++) {
        for (int j = 0; j < PF_NCASES && rc == 0; j++) {
            int c = (j + r) % PF_NCASES;
            double t = c == PF_FP8_STORE ? vs_kvs_run(fp8, VS_KVS_STORE, keys, src, n)
                       : c == PF_RAW_STORE ? vs_kvs_run(raw, VS_KVS_STORE, keys, codes, n)
                                           : pf_plain_run(plaindir, codes, n);
            if (t < 0) {
                fprintf(stderr, "bench_l2: %s failed\n", pf_name[c]);
                rc = 1;
            }
            secs[c][r] = t;
        }
        ratio[r] = secs[PF_PLAIN][r] / secs[PF_FP8_STORE][r];
        double t0 = now_s();
        for (size_t k = 0; k < n && rc == 0; k++) {
            size_t w;
            if (kvs_serialize(ser, src[k], codes[k], NULL, &w) != KVS_OK) rc = 1;
        }
        ser_s[r] = now_s() - t0;
    }
    if (rc == 0) {
        double bytes = (double)n * (double)PF_CHUNK_ELEMS;
        char la[64];
        loadavg(la, sizeof la);
        printf("fs store (fsync on) against a plain write loop: %zu chunks, %.0f MiB of fp8 "
               "written per case, %d runs\n",
               n, bytes / (1 << 20), runs);
        printf("%-26s %10s %10s %10s  (GB/s of fp8 bytes written)\n", "", "median", "min",
               "max");
        double med[PF_NCASES];
        for (int c = 0; c < PF_NCASES; c++) {
            qsort(secs[c], (size_t)runs, sizeof secs[c][0], cmp_double);
            med[c] = bytes / secs[c][runs / 2] / 1e9;
            printf("%-26s %10.2f %10.2f %10.2f\n", pf_name[c], med[c],
                   bytes / secs[c][runs - 1] / 1e9, bytes / secs[c][0] / 1e9);
        }
        qsort(ser_s, (size_t)runs, sizeof *ser_s, cmp_double);
        printf("%-26s %10.2f             (%.1f ms per task)\n", "fp8 serialize alone",
               bytes / ser_s[runs / 2] / 1e9, ser_s[runs / 2] * 1e3);
        qsort(ratio, (size_t)runs, sizeof *ratio, cmp_double);
        printf("\nfp8 store / plain loop, per-run ratios: median %.2fx (min %.2fx, max "
               "%.2fx)\n",
               ratio[runs / 2], ratio[0], ratio[runs - 1]);
        printf("raw store / plain loop (medians):       %.2fx\n",
               med[PF_RAW_STORE] / med[PF_PLAIN]);
        printf("fp8 store = serialize alone + raw store would be %.2f GB/s\n",
               bytes / (ser_s[runs / 2] + secs[PF_RAW_STORE][runs / 2]) / 1e9);
        json_t *st = NULL;
        if (kvs_l2_status(fp8, &st) == KVS_OK) {
            json_t *pool = json_object_get(st, "serde_temp_pool");
            printf("fp8 store's temps: %lld made for %d tasks of %zu (the rest reused)\n",
                   (long long)json_integer_value(json_object_get(pool, "allocated_temps")),
                   runs + 1, n);
            json_decref(st);
        }
        printf("load average: %s\n", la);
    }
    kvs_l2_destroy(fp8);
    kvs_l2_destroy(raw);
    kvs_serializer_destroy(ser);
    kvs_deserializer_destroy(de);
    for (size_t k = 0; k < n; k++) {
        kvs_memobj_free(src[k]);
        kvs_memobj_free(codes[k]);
    }
    return rc;
}

/* A work directory under /tmp (tmpdir, kvs_test_redis.h) and a
 * redis-server in it, both removed at exit; the server's port, or -1. */
static int setup(void)
{
    if (kvs_test_redis_init() != 0) return -1;
    server *s = new_server();
    if (start_server(s, 0, NULL) != 0) {
        fprintf(stderr, "bench_l2: no redis-server (run scripts/setup.sh)\n");
        return -1;
    }
    return s->port;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--vs-hiredis") == 0) {
        int runs = argc > 2 ? atoi(argv[2]) : 9;
        size_t n = argc > 3 ? (size_t)strtoul(argv[3], NULL, 10) : 4;
        if (runs < 1 || runs > 64 || n < VS_CONNS || n > VS_MAX || n % VS_CONNS) {
            fprintf(stderr, "usage: bench_l2 --vs-hiredis [runs 1-64] [values 2-16, even]\n");
            return 2;
        }
        int port = setup();
        return port < 0 ? 1 : vs_hiredis(port, runs, n);
    }
    if (argc > 1 && strcmp(argv[1], "--vs-plain-fs") == 0) {
        int runs = argc > 2 ? atoi(argv[2]) : 9;
        size_t n = argc > 3 ? (size_t)strtoul(argv[3], NULL, 10) : 8;
        if (runs < 1 || runs > 64 || n < 1 || n > PF_CHUNKS_MAX) {
            fprintf(stderr, "usage: bench_l2 --vs-plain-fs [runs 1-64] [chunks 1-%d]\n",
                    PF_CHUNKS_MAX);
            return 2;
        }
        if (kvs_test_redis_init() != 0) return 1; /* the work directory only */
        return vs_plain_fs(runs, n);
    }
    size_t n = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 4;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (n < 1 || n > 64 || reps < 1 || reps > 64) {
        fprintf(stderr, "usage: bench_l2 [chunks_per_task 1-64] [repetitions 1-64]\n");
        return 2;
    }
    int port = setup();
    if (port < 0) return 1;

    kvs_layout l;
    if (kvs_layout_flat(&l, CHUNK_ELEMS, KVS_DTYPE_BFLOAT16) != KVS_OK) return 1;
    kvs_object_key keys[64];
    kvs_memobj *src[64], *dst[64];
    for (size_t k = 0; k < n; k++) {
        if (make_pair(&l, k, "bench/model", &keys[k], &src[k], &dst[k]) != 0) return 1;
        fill_chunk(src[k], CHUNK_ELEMS, k);
        memset(dst[k]->data, 0, dst[k]->capacity);
    }

    char fsdir[96];
    snprintf(fsdir, sizeof fsdir, "%s/fs", tmpdir);
    struct {
        const char *name;
        char spec[512];
    } rows[4];
    const char *serde = "\"serde\":{\"type\":\"fp8\"},\"serde_pool_bytes\":4294967296";
    rows[0].name = "redis, 1 connection";
    snprintf(rows[0].spec, sizeof rows[0].spec,
             "{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\",\"connections\":1,"
             "\"timeout_ms\":60000,%s}", port, serde);
    rows[1].name = "redis, 4 connections";
    snprintf(rows[1].spec, sizeof rows[1].spec,
             "{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\",\"connections\":4,"
             "\"timeout_ms\":60000,%s}", port, serde);
    rows[2].name = "fs /tmp, fsync";
    snprintf(rows[2].spec, sizeof rows[2].spec,
             "{\"type\":\"fs\",\"path\":\"%s\",\"workers\":4,%s}", fsdir, serde);
    rows[3].name = "fs /tmp, no fsync";
    snprintf(rows[3].spec, sizeof rows[3].spec,
             "{\"type\":\"fs\",\"path\":\"%s\",\"workers\":4,\"fsync\":false,%s}", fsdir,
             serde);

    double raw = (double)n * (double)CHUNK_ELEMS * 2.0;
    printf("L2 throughput through the serde wrapper (fp8 e4m3fn): %zu chunks of 32 MiB fp8 "
           "(64 MiB bfloat16) per task, median of %d\n",
           n, reps);
    printf("GB/s of raw (bfloat16) bytes; Redis: local redis-server on 127.0.0.1\n\n");
    printf("%-24s %12s %12s\n", "adapter", "store GB/s", "load GB/s");
    int rc = 0;
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        double st, ld;
        if (run(rows[i].spec, keys, src, dst, n, reps, &st, &ld) != 0) {
            rc = 1;
            continue;
        }
        printf("%-24s %12.2f %12.2f\n", rows[i].name, raw / st / 1e9, raw / ld / 1e9);
        fflush(stdout);
    }
    for (size_t k = 0; k < n; k++) {
        kvs_memobj_free(src[k]);
        kvs_memobj_free(dst[k]);
    }
    return rc;
}
