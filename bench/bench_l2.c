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
 * GB/s (10^9 bytes/s) of raw bytes: the bfloat16 side. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
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

#include "kvserde/error.h"
#include "kvserde/l2.h"
#include "kvserde/memobj.h"
#include "kvserde/processor.h"

extern char **environ;

#define CHUNK_ELEMS ((size_t)32 << 20) /* 32 Mi elements: 32 MiB of fp8 */
#define WAIT_MS 120000

static pid_t server_pid;
static char workdir[64];

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void cleanup(void)
{
    if (server_pid > 0) {
        kill(server_pid, SIGKILL);
        while (waitpid(server_pid, NULL, 0) < 0 && errno == EINTR) {
        }
        server_pid = 0;
    }
    if (workdir[0]) nftw(workdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static void on_fatal(int sig)
{
    if (server_pid > 0) kill(server_pid, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

static int port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* 1 once something accepts connections on 127.0.0.1:port. */
static int port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* Start redis-server on a free loopback port; the port, or -1. */
static int start_redis(void)
{
    srand((unsigned)(getpid() ^ time(NULL)));
    int port;
    do port = 20000 + rand() % 20000;
    while (!port_free(port));
    char p[16], logf[128];
    snprintf(p, sizeof p, "%d", port);
    snprintf(logf, sizeof logf, "%s/redis.log", workdir);
    const char *argv[] = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--daemonize", "no", "--dir", workdir,
                          "--logfile", logf, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    /* stderr too: a server that outlives a crashed test must not hold the
     * test runner's output pipe open (ctest would wait for its timeout). */
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    int rc = posix_spawnp(&server_pid, "redis-server", &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        fprintf(stderr, "bench_l2: cannot start redis-server: %s (run scripts/setup.sh)\n",
                strerror(rc));
        server_pid = 0;
        return -1;
    }
    for (int i = 0; i < 500; i++) {
        if (port_open(port)) return port;
        if (waitpid(server_pid, NULL, WNOHANG) == server_pid) break;
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "bench_l2: redis-server did not start (see %s)\n", logf);
    return -1;
}

static int wait_fd(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    int r;
    do r = poll(&p, 1, WAIT_MS);
    while (r < 0 && errno == EINTR);
    if (r == 1) kvs_event_fd_consume(fd, NULL);
    return r == 1;
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

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 4;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (n < 1 || n > 64 || reps < 1 || reps > 64) {
        fprintf(stderr, "usage: bench_l2 [chunks_per_task 1-64] [repetitions 1-64]\n");
        return 2;
    }
    snprintf(workdir, sizeof workdir, "/tmp/kvs_bench_l2_XXXXXX");
    if (mkdtemp(workdir) == NULL) {
        perror("bench_l2: mkdtemp");
        return 1;
    }
    atexit(cleanup);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGABRT, SIGSEGV};
    for (size_t i = 0; i < sizeof sigs / sizeof *sigs; i++) signal(sigs[i], on_fatal);
    int port = start_redis();
    if (port < 0) return 1;

    kvs_layout l;
    if (kvs_layout_flat(&l, CHUNK_ELEMS, KVS_DTYPE_BFLOAT16) != KVS_OK) return 1;
    kvs_object_key keys[64];
    kvs_memobj *src[64], *dst[64];
    for (size_t k = 0; k < n; k++) {
        uint8_t h[8] = {(uint8_t)k, 1, 2, 3, 4, 5, 6, 7};
        if (kvs_object_key_init(&keys[k], h, sizeof h, "bench/model", 0, 0, NULL) != KVS_OK ||
            kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &src[k]) != KVS_OK ||
            kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &dst[k]) != KVS_OK) {
            fprintf(stderr, "bench_l2: %s\n", kvs_last_error());
            return 1;
        }
        /* Plausible KV values: small magnitudes, every mantissa bit used. */
        uint16_t *v = src[k]->data;
        for (size_t i = 0; i < CHUNK_ELEMS; i++) {
            uint32_t x = (uint32_t)(i + k * 7919u) * 2654435761u;
            float f = ((float)(x >> 8) / 16777216.0f) * 8.0f - 4.0f;
            uint32_t bits;
            memcpy(&bits, &f, sizeof bits);
            v[i] = (uint16_t)(bits >> 16);
        }
        memset(dst[k]->data, 0, dst[k]->capacity);
    }

    char fsdir[96];
    snprintf(fsdir, sizeof fsdir, "%s/fs", workdir);
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
