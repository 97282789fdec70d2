/* bench_small.c - per-object latency and throughput of L2 stores and loads,
 * bare and through the serde wrapper (fp8), on the memory and fs adapters:
 * what one task at a time costs, where thread wake-ups rather than bytes
 * are the price (issue 16 item 4). Reports; asserts nothing.
 *
 *   bench_small [--runs N] [--fsync] [--sizes LIST] [--adapter memory|fs]
 *
 * Objects are KV_2TD bfloat16 chunks [2, tokens, 128] of 8 KiB, 1 MiB and
 * 32 MiB (--sizes takes a comma list of KiB, e.g. 8,1024). Per cell (adapter
 * x bare / fp8 x size x mode), stores then loads of the same keys:
 *   one   one object per task, one task at a time: submit -> poll the fd ->
 *         pop / query; the latency of each task is one object's. 256 objects
 *         of 8 KiB, 32 of 1 MiB, 4 of 32 MiB per run.
 *   batch one task of 64 objects (of 32 MiB: 8, so a batch holds at most
 *         256 MiB), timed from submit to its result; its per-object latency
 *         is the task's time / objects. 4 tasks of 8 KiB, 2 of 1 MiB, 1 of
 *         32 MiB per run.
 * (--sizes: up to 8 KiB counts as small, up to 1 MiB as medium, above as
 * large, for these counts.)
 * Every run (default 10) runs every cell once, in the same order, so a burst
 * of other work on a shared machine hits all of them alike; the keys are
 * deleted after each cell. Reported per cell: the median and p99 of the
 * per-object latency over all runs' samples, the range of the runs'
 * medians (how noisy), and the median throughput (GB/s of bfloat16 bytes,
 * 10^9 bytes/s); for wrapped cells, the ratio of the median latency to the
 * bare adapter's. The load average is printed before and after.
 *
 * The memory adapter is {"type": "memory"}; fs is {"type": "fs", "path":
 * <a fresh directory under /tmp>, "fsync": false} (--fsync: true), so the
 * figures are the software path, not the disk's flush. Wrapped is the same
 * spec with "serde": {"type": "fp8"}.
 */
#include <ftw.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_timing.h"
#include "kvserde/error.h"
#include "kvserde/l2.h"
#include "kvserde/memobj.h"
#include "kvserde/processor.h"
#include "kv_values.h"

#define HIDDEN 128
#define BATCH 64
#define BATCH_CAP_BYTES ((size_t)256 << 20)
#define MAX_SIZES 8

enum { DIR_STORE = 0, DIR_LOAD = 1 };
enum { MODE_ONE = 0, MODE_BATCH = 1 };

/* One cell's samples: per-object latency (us) and per-task throughput. */
struct series {
    double *lat;   /* every sample of every run */
    size_t nlat, cap;
    double run_median[64];
    double gbps[256];
    size_t ngbps;
};

struct cell {
    int fs, wrapped;
    size_t size;
    int mode;
    struct series s[2]; /* store, load */
};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static double quantile(double *v, size_t n, double q)
{
    if (n == 0) return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)((double)n * q);
    return v[i < n ? i : n - 1];
}

static void loadavg(double la[3])
{
    la[0] = la[1] = la[2] = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f == NULL) return;
    if (fscanf(f, "%lf %lf %lf", &la[0], &la[1], &la[2]) != 3) la[0] = -1;
    fclose(f);
}

static int die(const char *what)
{
    fprintf(stderr, "bench_small: %s: %s\n", what, kvs_last_error());
    exit(1);
}

static void push(struct series *s, double v)
{
    if (s->nlat == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1024;
        s->lat = realloc(s->lat, s->cap * sizeof *s->lat);
        if (s->lat == NULL) die("out of memory");
    }
    s->lat[s->nlat++] = v;
}

static kvs_object_key key_of(size_t i)
{
    kvs_object_key k;
    uint8_t h[8];
    for (int b = 0; b < 8; b++) h[b] = (uint8_t)((uint64_t)i >> (8 * b));
    if (kvs_object_key_init(&k, h, sizeof h, "bench_small", 0, 0, NULL) != KVS_OK)
        die("key");
    return k;
}

static kvs_memobj *chunk(size_t bytes)
{
    kvs_layout l;
    kvs_shape sh = {0};
    sh.ndim = 3;
    sh.dims[0] = 2;
    sh.dims[1] = (int64_t)(bytes / (2 * HIDDEN * 2));
    sh.dims[2] = HIDDEN;
    kvs_dtype dt = KVS_DTYPE_BFLOAT16;
    kvs_memobj *o = NULL;
    if (kvs_layout_init(&l, 1, &sh, 1, &dt) != KVS_OK ||
        kvs_memobj_alloc(&l, KVS_FMT_KV_2TD, &o) != KVS_OK)
        die("alloc");
    return o;
}

static void wait_fd(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    while (poll(&p, 1, -1) != 1) {
    }
    kvs_event_fd_consume(fd, NULL);
}

/* One task, submit to result; returns its time in us. */
static double run_task(kvs_l2_adapter *a, int dir, const kvs_object_key *keys,
                       kvs_memobj **objs, size_t n)
{
    kvs_l2_task_id id;
    double t0 = now_us();
    if (dir == DIR_STORE) {
        if (kvs_l2_submit_store(a, keys, objs, n, &id) != KVS_OK) die("submit store");
        int fd = kvs_l2_store_event_fd(a);
        for (;;) {
            kvs_l2_store_result r;
            size_t c = 0;
            kvs_l2_pop_completed_stores(a, &r, 1, &c);
            if (c == 1) {
                if (r.id != id || r.state != KVS_TASK_OK) {
                    fprintf(stderr, "bench_small: store %llu: %s\n",
                            (unsigned long long)r.id, r.message);
                    exit(1);
                }
                break;
            }
            wait_fd(fd);
        }
    } else {
        if (kvs_l2_submit_load(a, keys, objs, n, &id) != KVS_OK) die("submit load");
        int fd = kvs_l2_load_event_fd(a);
        for (;;) {
            kvs_l2_bitmap bm;
            kvs_l2_query_load(a, id, &bm);
            if (bm.state != KVS_TASK_PENDING) {
                if (bm.nhits != n) {
                    fprintf(stderr, "bench_small: load %llu: %zu of %zu hits: %s\n",
                            (unsigned long long)id, bm.nhits, n, bm.message);
                    exit(1);
                }
                kvs_l2_bitmap_release(&bm);
                break;
            }
            wait_fd(fd);
        }
    }
    return now_us() - t0;
}

static kvs_l2_adapter *open_adapter(int fs, int wrapped, const char *dir, int fsync_on)
{
    char spec[512];
    const char *serde = wrapped ? ", \"serde\": {\"type\": \"fp8\"}" : "";
    if (fs)
        snprintf(spec, sizeof spec, "{\"type\": \"fs\", \"path\": \"%s\", \"fsync\": %s%s}",
                 dir, fsync_on ? "true" : "false", serde);
    else
        snprintf(spec, sizeof spec, "{\"type\": \"memory\"%s}", serde);
    kvs_l2_adapter *a = NULL;
    if (kvs_l2_create(spec, &a) != KVS_OK) die(spec);
    return a;
}

/* One run of one cell: stores then loads, samples appended. */
static void run_cell(struct cell *c, kvs_l2_adapter *a, kvs_memobj **src, kvs_memobj **dst,
                     kvs_object_key *keys, int run)
{
    size_t nobj, per_task, ntasks;
    if (c->mode == MODE_ONE) {
        nobj = c->size <= (8u << 10) ? 256 : c->size <= (1u << 20) ? 32 : 4;
        per_task = 1;
    } else {
        per_task = BATCH_CAP_BYTES / c->size < BATCH ? BATCH_CAP_BYTES / c->size : BATCH;
        ntasks = c->size <= (8u << 10) ? 4 : c->size <= (1u << 20) ? 2 : 1;
        nobj = per_task * ntasks;
    }
    ntasks = nobj / per_task;
    for (int dir = 0; dir < 2; dir++) {
        struct series *s = &c->s[dir];
        size_t first = s->nlat;
        for (size_t t = 0; t < ntasks; t++) {
            size_t off = t * per_task;
            double us = run_task(a, dir, keys + off, (dir == DIR_STORE ? src : dst) + off,
                                 per_task);
            for (size_t i = 0; i < per_task; i++) push(s, us / (double)per_task);
            if (s->ngbps < sizeof s->gbps / sizeof s->gbps[0])
                s->gbps[s->ngbps++] = (double)(per_task * c->size) / (us * 1e3);
        }
        double *tmp = malloc((s->nlat - first) * sizeof *tmp);
        if (tmp == NULL) die("out of memory");
        memcpy(tmp, s->lat + first, (s->nlat - first) * sizeof *tmp);
        s->run_median[run] = quantile(tmp, s->nlat - first, 0.5);
        free(tmp);
    }
    /* The bare path round-trips the bytes exactly. */
    if (!c->wrapped && memcmp(src[0]->data, dst[0]->data, c->size) != 0) {
        fprintf(stderr, "bench_small: a bare load returned other bytes\n");
        exit(1);
    }
    uint8_t *deleted = malloc(nobj);
    if (deleted == NULL) die("out of memory");
    if (kvs_l2_delete(a, keys, nobj, deleted) != KVS_OK) die("delete");
    free(deleted);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int main(int argc, char **argv)
{
    int runs = 10, fsync_on = 0, only = -1; /* only: -1 both, 0 memory, 1 fs */
    size_t sizes[MAX_SIZES] = {8u << 10, 1u << 20, 32u << 20};
    size_t nsizes = 3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            runs = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--adapter") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "memory") == 0 || strcmp(argv[i + 1], "fs") == 0)) {
            only = strcmp(argv[++i], "fs") == 0;
        } else if (strcmp(argv[i], "--fsync") == 0) {
            fsync_on = 1;
        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            nsizes = 0;
            for (char *tok = strtok(argv[++i], ","); tok && nsizes < MAX_SIZES;
                 tok = strtok(NULL, ","))
                sizes[nsizes++] = (size_t)atol(tok) << 10;
        } else {
            fprintf(stderr, "usage: bench_small [--runs N (1-64)] [--fsync] [--sizes KiB,...] "
                            "[--adapter memory|fs]\n");
            return 2;
        }
    }
    for (size_t i = 0; i < nsizes; i++)
        if (sizes[i] == 0 || sizes[i] % (2 * HIDDEN * 2) != 0) {
            fprintf(stderr, "bench_small: sizes must be multiples of 1 KiB\n");
            return 2;
        }
    if (runs < 1 || runs > 64 || nsizes == 0) {
        fprintf(stderr, "usage: bench_small [--runs N (1-64)] [--fsync] [--sizes KiB,...] "
                            "[--adapter memory|fs]\n");
        return 2;
    }
    char dir[] = "/tmp/kvs_bench_small_XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("bench_small: mkdtemp");
        return 1;
    }

    size_t ncells = (only < 0 ? 2 : 1) * 2 * nsizes * 2;
    struct cell *cells = calloc(ncells, sizeof *cells);
    if (cells == NULL) die("out of memory");
    size_t k = 0;
    for (int fs = 0; fs < 2; fs++)
        for (size_t si = 0; si < nsizes && (only < 0 || only == fs); si++)
            for (int mode = 0; mode < 2; mode++)
                for (int wrapped = 0; wrapped < 2; wrapped++)
                    cells[k++] = (struct cell){.fs = fs, .wrapped = wrapped,
                                               .size = sizes[si], .mode = mode};

    /* Objects for the largest cell of each size, made once. */
    size_t maxobj = 256;
    kvs_object_key *keys = malloc(maxobj * sizeof *keys);
    if (keys == NULL) die("out of memory");
    for (size_t i = 0; i < maxobj; i++) keys[i] = key_of(i);

    kvs_l2_adapter *ad[2][2];
    for (int fs = 0; fs < 2; fs++)
        for (int w = 0; w < 2; w++) {
            char sub[64];
            snprintf(sub, sizeof sub, "%s/%s", dir, w ? "fp8" : "bare");
            ad[fs][w] = open_adapter(fs, w, sub, fsync_on);
        }

    double la0[3];
    loadavg(la0);
    printf("bench_small: %d runs; load average before %.2f %.2f %.2f\n", runs, la0[0], la0[1],
           la0[2]);
    for (size_t si = 0; si < nsizes; si++) {
        size_t size = sizes[si];
        /* enough objects for the cell that uses most (batch mode) */
        size_t n = size <= (8u << 10) ? 256 : size <= (1u << 20) ? 128 : BATCH_CAP_BYTES / size;
        if (n < 4) n = 4;
        if (n > maxobj) n = maxobj;
        kvs_memobj **src = malloc(n * sizeof *src), **dst = malloc(n * sizeof *dst);
        if (src == NULL || dst == NULL) die("out of memory");
        for (size_t i = 0; i < n; i++) {
            src[i] = chunk(size);
            dst[i] = chunk(size);
            kvs_bench_fill_bf16(src[i]->data, size / 2, (uint32_t)i);
            memset(dst[i]->data, 0, size);
        }
        for (int run = -1; run < runs; run++) { /* run -1 warms up, not kept */
            for (size_t c = 0; c < ncells; c++) {
                if (cells[c].size != size) continue;
                struct cell saved = cells[c];
                run_cell(&cells[c], ad[cells[c].fs][cells[c].wrapped], src, dst, keys,
                         run < 0 ? 0 : run);
                if (run < 0) { /* drop the warm-up samples */
                    for (int d = 0; d < 2; d++) {
                        cells[c].s[d].nlat = saved.s[d].nlat;
                        cells[c].s[d].ngbps = saved.s[d].ngbps;
                    }
                }
            }
        }
        for (size_t i = 0; i < n; i++) {
            kvs_memobj_free(src[i]);
            kvs_memobj_free(dst[i]);
        }
        free(src);
        free(dst);
    }
    double la1[3];
    loadavg(la1);

    printf("per-object latency in us (median, p99 over all runs' samples; runs' medians "
           "min-max), throughput GB/s (median of tasks)\n");
    printf("%-6s %-4s %8s %-5s %-5s %9s %9s %19s %8s %8s\n", "adapt", "serd", "size", "mode",
           "dir", "median", "p99", "run medians", "GB/s", "x bare");
    double bare_median[2] = {0, 0};
    for (size_t c = 0; c < ncells; c++) {
        struct cell *ce = &cells[c];
        for (int d = 0; d < 2; d++) {
            struct series *s = &ce->s[d];
            double med = quantile(s->lat, s->nlat, 0.5), p99 = quantile(s->lat, s->nlat, 0.99);
            double lo = s->run_median[0], hi = s->run_median[0];
            for (int r = 1; r < runs; r++) {
                if (s->run_median[r] < lo) lo = s->run_median[r];
                if (s->run_median[r] > hi) hi = s->run_median[r];
            }
            double gb = quantile(s->gbps, s->ngbps, 0.5);
            char sz[32], ratio[16] = "";
            if (ce->size >= (1u << 20)) snprintf(sz, sizeof sz, "%zuMiB", ce->size >> 20);
            else snprintf(sz, sizeof sz, "%zuKiB", ce->size >> 10);
            if (!ce->wrapped) bare_median[d] = med;
            else if (bare_median[d] > 0) snprintf(ratio, sizeof ratio, "%.2f", med / bare_median[d]);
            char range[32];
            snprintf(range, sizeof range, "%.1f-%.1f", lo, hi);
            printf("%-6s %-4s %8s %-5s %-5s %9.1f %9.1f %19s %8.2f %8s\n",
                   ce->fs ? "fs" : "memory", ce->wrapped ? "fp8" : "-", sz,
                   ce->mode == MODE_ONE ? "one" : "batch", d == DIR_STORE ? "store" : "load",
                   med, p99, range, gb, ratio);
        }
    }
    printf("load average after %.2f %.2f %.2f; batch = 64 objects (32 MiB: %zu); fs %s\n",
           la1[0], la1[1], la1[2], BATCH_CAP_BYTES / (32u << 20),
           fsync_on ? "with fsync" : "without fsync");

    for (int fs = 0; fs < 2; fs++)
        for (int w = 0; w < 2; w++) kvs_l2_destroy(ad[fs][w]);
    for (size_t c = 0; c < ncells; c++) {
        free(cells[c].s[0].lat);
        free(cells[c].s[1].lat);
    }
    free(cells);
    free(keys);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
