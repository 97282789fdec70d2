/* test_faults.c - fault injection: every system call and allocation a
 * store+load cycle makes through the serde wrapper and the fs adapter is
 * made to fail, one at a time, and the library must turn each failure into
 * a clean error on the right task, with nothing leaked or left behind.
 *
 * How: this executable alone is linked with GNU ld's --wrap for the calls
 * the library's objects make (the list is KVS_FAULT_WRAPPED_CALLS in
 * cmake/hardening.cmake; `nm -u libkvserde.a` shows them). Since the test
 * links the static library, each such call from the library goes to a
 * __wrap_* function below, which counts it per class ("malloc", "write",
 * ...) and, when armed, makes the Nth call of one class fail as the system
 * would (NULL / -1 with ENOMEM, EMFILE, EAGAIN, EIO, ENOSPC ...) or, for
 * the short-I/O kinds, transfer half of what was asked. Everything else goes
 * to the real function (__real_*). Calls made inside jansson, hiredis or
 * libc itself are not wrapped.
 *
 * The walk: a fault-free cycle first counts the calls of each class; then
 * for every fault kind and every call index N of that count, one cycle runs
 * with the Nth call failing. A cycle (see cycle()):
 *   create the wrapper (scenario "json": kvs_l2_create with a "serde"
 *   sub-dict; scenario "parts": kvs_fs_adapter_create + kvs_serde_create +
 *   kvs_serde_wrapper_create), store [B, A2'] and [C] in two tasks, lookup
 *   and lock [A, B] then unlock, load [A, B] and [C, A2] in two tasks,
 *   close, destroy.
 *   Scenario "pipeline" is "json" with a framed pipeline serde
 *   ({"type": "pipeline", "stages": [{"type": "fp8"}, {"type": "xxh3"}]},
 *   pipeline.h) in the wrapper, so its allocations are walked too: the
 *   fused fp8 + xxh3 encoder's streaming state comes from libxxhash's
 *   XXH3_createState, a call inside another library, so that call itself is
 *   wrapped (class "XXH3_createState": NULL as when its malloc fails; its
 *   blocks are tracked until XXH3_freeState). Its directory content (A, A2)
 *   is stored as frames before its cycles and put back as fp8 blobs after.
 * A and A2 were stored before the walk; B and C are new; A2' overwrites A2.
 * After each cycle, with faults off:
 *   - every refused call returned a KVS_E* code with a message, every task
 *     completed exactly once under its own id, a failed task / cleared bit
 *     came with a code and a message, and every loaded object is intact;
 *   - the library holds no more allocations than before (the wrappers track
 *     every block the library allocates; under ASan, LeakSanitizer also
 *     checks jansson's), no fd is left open (/proc/self/fd), no thread is
 *     left running (/proc/self/task), no ".tmp-*" file is left in the
 *     directory (unless the failed call was the unlink that removes it);
 *   - a fresh, fault-free wrapper loads A intact, A2 as the old or the new
 *     object (never torn; the new one if its store task succeeded), and B
 *     and C intact if their store task succeeded (intact or absent if not).
 * A cycle that hangs is caught by alarm(): the test prints the scenario,
 * kind and N and exits.
 *
 * Environment: KVS_FAULTS_STRIDE=k walks every k-th N only (default 1: all);
 * KVS_FAULTS_ONLY="kind:N" runs one case (to reproduce a report);
 * KVS_FAULTS_VERBOSE=1 prints every case.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "kvserde/fp8.h"
#include "kvserde/kvserde.h"
#include "kvserde/l2.h"
#include "kvserde/l2_fs.h"
#include "kvserde/registry.h"
#include "kvs_test.h"

#if defined(__SANITIZE_ADDRESS__)
#define KVS_HAVE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KVS_HAVE_LSAN 1
#endif
#endif
#ifdef KVS_HAVE_LSAN
#include <sanitizer/lsan_interface.h>
#endif

/* =====================================================================
 * Call classes, fault kinds, and the injection state
 * ================================================================== */

enum cls {
    C_MALLOC, C_CALLOC, C_REALLOC, C_ALIGNED, C_STRDUP,
    C_EVENTFD, C_PTHREAD,
    C_OPEN, C_READ, C_READ_EFD, C_WRITE, C_FSYNC, C_RENAME, C_STAT,
    C_MKDIR, C_UNLINK, C_FLOCK, C_FDOPENDIR, C_READDIR, C_GETRANDOM,
    C_XXH3,
    NCLS
};

static const char *const cls_names[NCLS] = {
    "malloc", "calloc", "realloc", "aligned_alloc", "strdup",
    "eventfd", "pthread_create",
    "open", "read", "read(eventfd)", "write", "fsync", "rename", "stat",
    "mkdir", "unlink", "flock", "fdopendir", "readdir", "getrandom",
    "XXH3_createState",
};

/* What an armed fault does to the call it hits. */
struct kind {
    const char *name;
    enum cls cls;
    int err;      /* errno (or pthread_create's return) of the failure */
    int shortio;  /* 1: no failure, transfer half the bytes instead */
};

static const struct kind kinds[] = {
    {"malloc", C_MALLOC, ENOMEM, 0},
    {"calloc", C_CALLOC, ENOMEM, 0},
    {"realloc", C_REALLOC, ENOMEM, 0},
    {"aligned_alloc", C_ALIGNED, ENOMEM, 0},
    {"strdup", C_STRDUP, ENOMEM, 0},
    {"eventfd", C_EVENTFD, EMFILE, 0},
    {"pthread_create", C_PTHREAD, EAGAIN, 0},
    {"open", C_OPEN, EMFILE, 0},
    {"read", C_READ, EIO, 0},
    {"short read", C_READ, 0, 1},
    {"read(eventfd)", C_READ_EFD, EAGAIN, 0},
    {"write", C_WRITE, ENOSPC, 0},
    {"short write", C_WRITE, 0, 1},
    {"fsync", C_FSYNC, EIO, 0},
    {"rename", C_RENAME, EIO, 0},
    {"stat", C_STAT, EIO, 0},
    {"mkdir", C_MKDIR, ENOSPC, 0},
    {"unlink", C_UNLINK, EIO, 0},
    {"flock", C_FLOCK, ENOLCK, 0},
    {"fdopendir", C_FDOPENDIR, ENOMEM, 0},
    {"readdir", C_READDIR, EIO, 0},
    {"getrandom", C_GETRANDOM, EAGAIN, 0},
    {"XXH3_createState", C_XXH3, ENOMEM, 0},
};
#define NKINDS (sizeof kinds / sizeof kinds[0])

static atomic_int g_counting;          /* count calls (during cycles) */
static atomic_long g_calls[NCLS];      /* calls per class since reset */
static atomic_int g_armed = -1;        /* the armed kind, -1 = none */
static atomic_long g_target;           /* its call index, from 1 */
static atomic_int g_fired;             /* the armed call happened */
#define BT_MAX 16
static void *g_fire_bt[BT_MAX];        /* where it happened */
static int g_fire_bt_len;

/* The action for this call of class c: NULL (go ahead) or the kind. */
static const struct kind *fault_hit(enum cls c)
{
    if (!atomic_load(&g_counting)) return NULL;
    long k = atomic_fetch_add(&g_calls[c], 1) + 1;
    int armed = atomic_load(&g_armed);
    if (armed < 0 || kinds[armed].cls != c || k != atomic_load(&g_target)) return NULL;
    int expected = 0;
    if (!atomic_compare_exchange_strong(&g_fired, &expected, 1)) return NULL;
    g_fire_bt_len = backtrace(g_fire_bt, BT_MAX);
    return &kinds[armed];
}

/* =====================================================================
 * Allocation tracking: every block the wrapped code allocates, until freed
 * ================================================================== */

#define TRACK_BITS 16
#define TRACK_SLOTS (1u << TRACK_BITS)
struct track {
    void *p;
    size_t size;
    void *caller;
    unsigned long epoch;
};
static struct track g_track[TRACK_SLOTS];
static size_t g_live;
static int g_track_overflow;
static unsigned long g_epoch;
static pthread_mutex_t g_track_mu = PTHREAD_MUTEX_INITIALIZER;

static size_t track_hash(const void *p)
{
    return (size_t)(((uintptr_t)p * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - TRACK_BITS));
}

static void track_add(void *p, size_t size, void *caller)
{
    if (p == NULL) return;
    pthread_mutex_lock(&g_track_mu);
    if (g_live >= TRACK_SLOTS / 2) {
        g_track_overflow = 1;
    } else {
        size_t i = track_hash(p);
        while (g_track[i].p != NULL) i = (i + 1) & (TRACK_SLOTS - 1);
        g_track[i] = (struct track){p, size, caller, g_epoch};
        g_live++;
    }
    pthread_mutex_unlock(&g_track_mu);
}

/* Linear probing with backward-shift deletion. Untracked pointers (blocks
 * from jansson or libc) are ignored. */
static void track_del(void *p)
{
    if (p == NULL) return;
    pthread_mutex_lock(&g_track_mu);
    size_t i = track_hash(p);
    while (g_track[i].p != NULL && g_track[i].p != p) i = (i + 1) & (TRACK_SLOTS - 1);
    if (g_track[i].p == p) {
        g_track[i].p = NULL;
        g_live--;
        size_t j = i;
        for (;;) {
            j = (j + 1) & (TRACK_SLOTS - 1);
            if (g_track[j].p == NULL) break;
            size_t h = track_hash(g_track[j].p);
            /* Move j back to i unless its home lies cyclically in (i, j]. */
            int stay = i <= j ? (i < h && h <= j) : (i < h || h <= j);
            if (!stay) {
                g_track[i] = g_track[j];
                g_track[j].p = NULL;
                i = j;
            }
        }
    }
    pthread_mutex_unlock(&g_track_mu);
}

static size_t track_live(void)
{
    pthread_mutex_lock(&g_track_mu);
    size_t n = g_live;
    pthread_mutex_unlock(&g_track_mu);
    return n;
}

/* "test_faults+0x1234" for a code address: feed the offset to
 * `addr2line -e test_faults` for the file and line. */
static void fmt_addr(void *addr, char *buf, size_t size)
{
    Dl_info info;
    if (addr && dladdr(addr, &info) && info.dli_fname) {
        const char *base = strrchr(info.dli_fname, '/');
        snprintf(buf, size, "%s+0x%" PRIxPTR, base ? base + 1 : info.dli_fname,
                 (uintptr_t)addr - (uintptr_t)info.dli_fbase);
    } else {
        snprintf(buf, size, "%p", addr);
    }
}

/* Print the blocks allocated since `epoch` that are still live. */
static void track_report_since(unsigned long epoch, const char *tag)
{
    pthread_mutex_lock(&g_track_mu);
    int shown = 0;
    for (size_t i = 0; i < TRACK_SLOTS && shown < 10; i++) {
        if (g_track[i].p == NULL || g_track[i].epoch < epoch) continue;
        char where[128];
        fmt_addr(g_track[i].caller, where, sizeof where);
        fprintf(stderr, "    [%s] leaked block of %zu bytes allocated from %s\n", tag,
                g_track[i].size, where);
        shown++;
    }
    pthread_mutex_unlock(&g_track_mu);
}

/* =====================================================================
 * The wrappers
 * ================================================================== */

#define WRAP_PROTO(ret, name, ...)                                          \
    ret __real_##name(__VA_ARGS__);                                        \
    ret __wrap_##name(__VA_ARGS__)

WRAP_PROTO(void *, malloc, size_t);
WRAP_PROTO(void *, calloc, size_t, size_t);
WRAP_PROTO(void *, realloc, void *, size_t);
WRAP_PROTO(void *, aligned_alloc, size_t, size_t);
WRAP_PROTO(int, posix_memalign, void **, size_t, size_t);
WRAP_PROTO(char *, strdup, const char *);
WRAP_PROTO(char *, strndup, const char *, size_t);
WRAP_PROTO(void, free, void *);
WRAP_PROTO(int, eventfd, unsigned int, int);
WRAP_PROTO(int, pthread_create, pthread_t *, const pthread_attr_t *, void *(*)(void *),
           void *);
WRAP_PROTO(int, open, const char *, int, ...);
WRAP_PROTO(int, open64, const char *, int, ...);
WRAP_PROTO(int, openat, int, const char *, int, ...);
WRAP_PROTO(int, openat64, int, const char *, int, ...);
WRAP_PROTO(ssize_t, read, int, void *, size_t);
WRAP_PROTO(ssize_t, pread, int, void *, size_t, off_t);
WRAP_PROTO(ssize_t, pread64, int, void *, size_t, off_t);
WRAP_PROTO(ssize_t, write, int, const void *, size_t);
WRAP_PROTO(ssize_t, pwrite, int, const void *, size_t, off_t);
WRAP_PROTO(ssize_t, pwrite64, int, const void *, size_t, off_t);
WRAP_PROTO(int, fsync, int);
WRAP_PROTO(int, fdatasync, int);
WRAP_PROTO(int, rename, const char *, const char *);
WRAP_PROTO(int, renameat, int, const char *, int, const char *);
WRAP_PROTO(int, fstat, int, struct stat *);
WRAP_PROTO(int, fstat64, int, struct stat *);
WRAP_PROTO(int, fstatat, int, const char *, struct stat *, int);
WRAP_PROTO(int, fstatat64, int, const char *, struct stat *, int);
WRAP_PROTO(int, mkdir, const char *, mode_t);
WRAP_PROTO(int, mkdirat, int, const char *, mode_t);
WRAP_PROTO(int, unlink, const char *);
WRAP_PROTO(int, unlinkat, int, const char *, int);
WRAP_PROTO(int, flock, int, int);
WRAP_PROTO(DIR *, fdopendir, int);
WRAP_PROTO(struct dirent *, readdir, DIR *);
WRAP_PROTO(struct dirent *, readdir64, DIR *);
WRAP_PROTO(ssize_t, getrandom, void *, size_t, unsigned int);
WRAP_PROTO(XXH3_state_t *, XXH3_createState, void);
WRAP_PROTO(XXH_errorcode, XXH3_freeState, XXH3_state_t *);

#define FAIL_ERRNO(k, ret) \
    do {                   \
        errno = (k)->err;  \
        return ret;        \
    } while (0)

void *__wrap_malloc(size_t n)
{
    const struct kind *k = fault_hit(C_MALLOC);
    if (k) FAIL_ERRNO(k, NULL);
    void *p = __real_malloc(n);
    track_add(p, n, __builtin_return_address(0));
    return p;
}

void *__wrap_calloc(size_t a, size_t b)
{
    const struct kind *k = fault_hit(C_CALLOC);
    if (k) FAIL_ERRNO(k, NULL);
    void *p = __real_calloc(a, b);
    track_add(p, a * b, __builtin_return_address(0));
    return p;
}

void *__wrap_realloc(void *old, size_t n)
{
    const struct kind *k = fault_hit(C_REALLOC);
    if (k) FAIL_ERRNO(k, NULL);
    void *p = __real_realloc(old, n);
    if (p != NULL || n == 0) track_del(old);
    track_add(p, n, __builtin_return_address(0));
    return p;
}

void *__wrap_aligned_alloc(size_t align, size_t n)
{
    const struct kind *k = fault_hit(C_ALIGNED);
    if (k) FAIL_ERRNO(k, NULL);
    void *p = __real_aligned_alloc(align, n);
    track_add(p, n, __builtin_return_address(0));
    return p;
}

int __wrap_posix_memalign(void **out, size_t align, size_t n)
{
    const struct kind *k = fault_hit(C_ALIGNED);
    if (k) return ENOMEM;
    int rc = __real_posix_memalign(out, align, n);
    if (rc == 0) track_add(*out, n, __builtin_return_address(0));
    return rc;
}

char *__wrap_strdup(const char *s)
{
    const struct kind *k = fault_hit(C_STRDUP);
    if (k) FAIL_ERRNO(k, NULL);
    char *p = __real_strdup(s);
    track_add(p, p ? strlen(p) + 1 : 0, __builtin_return_address(0));
    return p;
}

char *__wrap_strndup(const char *s, size_t n)
{
    const struct kind *k = fault_hit(C_STRDUP);
    if (k) FAIL_ERRNO(k, NULL);
    char *p = __real_strndup(s, n);
    track_add(p, p ? strlen(p) + 1 : 0, __builtin_return_address(0));
    return p;
}

void __wrap_free(void *p)
{
    track_del(p);
    __real_free(p);
}

int __wrap_eventfd(unsigned int initval, int flags)
{
    const struct kind *k = fault_hit(C_EVENTFD);
    if (k) FAIL_ERRNO(k, -1);
    return __real_eventfd(initval, flags);
}

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *attr, void *(*fn)(void *),
                          void *arg)
{
    const struct kind *k = fault_hit(C_PTHREAD);
    if (k) return k->err;
    return __real_pthread_create(t, attr, fn, arg);
}

static mode_t open_mode(int flags, va_list ap)
{
    return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

int __wrap_open(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    const struct kind *k = fault_hit(C_OPEN);
    if (k) FAIL_ERRNO(k, -1);
    return __real_open(path, flags, mode);
}

int __wrap_open64(const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    const struct kind *k = fault_hit(C_OPEN);
    if (k) FAIL_ERRNO(k, -1);
    return __real_open64(path, flags, mode);
}

int __wrap_openat(int dfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    const struct kind *k = fault_hit(C_OPEN);
    if (k) FAIL_ERRNO(k, -1);
    return __real_openat(dfd, path, flags, mode);
}

int __wrap_openat64(int dfd, const char *path, int flags, ...)
{
    va_list ap;
    va_start(ap, flags);
    mode_t mode = open_mode(flags, ap);
    va_end(ap);
    const struct kind *k = fault_hit(C_OPEN);
    if (k) FAIL_ERRNO(k, -1);
    return __real_openat64(dfd, path, flags, mode);
}

enum { FD_OTHER, FD_REG, FD_EVENTFD };

/* What an fd is, without going through the wrappers. */
static int fd_type(int fd)
{
    struct stat st;
    if (__real_fstat64(fd, &st) != 0) return FD_OTHER;
    if (S_ISREG(st.st_mode)) return FD_REG;
    char link[64], target[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return FD_OTHER;
    target[n] = '\0';
    return strcmp(target, "anon_inode:[eventfd]") == 0 ? FD_EVENTFD : FD_OTHER;
}

/* The fault for a read (resp. write) of n bytes on fd: 0 = go ahead with
 * *n (maybe halved), -1 = fail with errno set. */
static int io_fault(int fd, size_t *n, int is_write)
{
    int type = fd_type(fd);
    const struct kind *k = NULL;
    if (type == FD_REG) k = fault_hit(is_write ? C_WRITE : C_READ);
    else if (type == FD_EVENTFD && !is_write) k = fault_hit(C_READ_EFD);
    /* Writes to eventfds are never failed: they cannot fail on Linux except
     * when the counter would overflow, which a completion count never
     * reaches. */
    if (k == NULL) return 0;
    if (k->shortio) {
        if (*n > 1) *n /= 2;
        return 0;
    }
    errno = k->err;
    return -1;
}

ssize_t __wrap_read(int fd, void *buf, size_t n)
{
    if (io_fault(fd, &n, 0) != 0) return -1;
    return __real_read(fd, buf, n);
}

ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off)
{
    if (io_fault(fd, &n, 0) != 0) return -1;
    return __real_pread(fd, buf, n, off);
}

ssize_t __wrap_pread64(int fd, void *buf, size_t n, off_t off)
{
    if (io_fault(fd, &n, 0) != 0) return -1;
    return __real_pread64(fd, buf, n, off);
}

ssize_t __wrap_write(int fd, const void *buf, size_t n)
{
    if (io_fault(fd, &n, 1) != 0) return -1;
    return __real_write(fd, buf, n);
}

ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    if (io_fault(fd, &n, 1) != 0) return -1;
    return __real_pwrite(fd, buf, n, off);
}

ssize_t __wrap_pwrite64(int fd, const void *buf, size_t n, off_t off)
{
    if (io_fault(fd, &n, 1) != 0) return -1;
    return __real_pwrite64(fd, buf, n, off);
}

#define SIMPLE_WRAP(cls, call)                   \
    do {                                         \
        const struct kind *k = fault_hit(cls);   \
        if (k) FAIL_ERRNO(k, -1);                \
        return call;                             \
    } while (0)

int __wrap_fsync(int fd) { SIMPLE_WRAP(C_FSYNC, __real_fsync(fd)); }
int __wrap_fdatasync(int fd) { SIMPLE_WRAP(C_FSYNC, __real_fdatasync(fd)); }
int __wrap_rename(const char *a, const char *b) { SIMPLE_WRAP(C_RENAME, __real_rename(a, b)); }
int __wrap_renameat(int da, const char *a, int db, const char *b)
{
    SIMPLE_WRAP(C_RENAME, __real_renameat(da, a, db, b));
}
int __wrap_fstat(int fd, struct stat *st) { SIMPLE_WRAP(C_STAT, __real_fstat(fd, st)); }
int __wrap_fstat64(int fd, struct stat *st) { SIMPLE_WRAP(C_STAT, __real_fstat64(fd, st)); }
int __wrap_fstatat(int dfd, const char *p, struct stat *st, int fl)
{
    SIMPLE_WRAP(C_STAT, __real_fstatat(dfd, p, st, fl));
}
int __wrap_fstatat64(int dfd, const char *p, struct stat *st, int fl)
{
    SIMPLE_WRAP(C_STAT, __real_fstatat64(dfd, p, st, fl));
}
int __wrap_mkdir(const char *p, mode_t m) { SIMPLE_WRAP(C_MKDIR, __real_mkdir(p, m)); }
int __wrap_mkdirat(int dfd, const char *p, mode_t m)
{
    SIMPLE_WRAP(C_MKDIR, __real_mkdirat(dfd, p, m));
}
int __wrap_unlink(const char *p) { SIMPLE_WRAP(C_UNLINK, __real_unlink(p)); }
int __wrap_unlinkat(int dfd, const char *p, int fl)
{
    SIMPLE_WRAP(C_UNLINK, __real_unlinkat(dfd, p, fl));
}
int __wrap_flock(int fd, int op) { SIMPLE_WRAP(C_FLOCK, __real_flock(fd, op)); }
ssize_t __wrap_getrandom(void *buf, size_t n, unsigned int flags)
{
    SIMPLE_WRAP(C_GETRANDOM, __real_getrandom(buf, n, flags));
}

/* libxxhash allocates the state with its own (unwrapped) malloc: the call
 * is the allocation, failed as XXH3_createState fails when malloc does. */
XXH3_state_t *__wrap_XXH3_createState(void)
{
    const struct kind *k = fault_hit(C_XXH3);
    if (k) FAIL_ERRNO(k, NULL);
    XXH3_state_t *p = __real_XXH3_createState();
    track_add(p, 1, __builtin_return_address(0)); /* size opaque here */
    return p;
}

XXH_errorcode __wrap_XXH3_freeState(XXH3_state_t *p)
{
    track_del(p);
    return __real_XXH3_freeState(p);
}

DIR *__wrap_fdopendir(int fd)
{
    const struct kind *k = fault_hit(C_FDOPENDIR);
    if (k) FAIL_ERRNO(k, NULL);
    return __real_fdopendir(fd);
}

struct dirent *__wrap_readdir(DIR *d)
{
    const struct kind *k = fault_hit(C_READDIR);
    if (k) FAIL_ERRNO(k, NULL);
    return __real_readdir(d);
}

struct dirent *__wrap_readdir64(DIR *d)
{
    const struct kind *k = fault_hit(C_READDIR);
    if (k) FAIL_ERRNO(k, NULL);
    return __real_readdir64(d);
}

/* =====================================================================
 * The process: fds, threads, hang guard
 * ================================================================== */

/* Entries of a /proc/self directory, "." and ".." excluded (opendir and
 * readdir are libc's own, not wrapped). */
static int count_entries(const char *path)
{
    DIR *d = opendir(path);
    if (d == NULL) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n - (strcmp(path, "/proc/self/fd") == 0); /* the DIR's own fd */
}

/* The count, retried for a moment while it differs from `want`: a joined
 * thread may linger in /proc for an instant after pthread_join returns. */
static int settled_count(const char *path, int want)
{
    int n = count_entries(path);
    for (int i = 0; i < 200 && n != want; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        n = count_entries(path);
    }
    return n;
}

/* The process's threads between cases (main's before the first): a case
 * waits for this count before taking its own, since the threads the step
 * before it joined (use_scenario's stores, the previous case) may still be
 * listed in /proc for a moment; counted too early, one of them made a case
 * see a thread "left running" -1 times (one run in about 120 on a busy
 * 2-core host). */
static int g_tasks_idle;

static char g_case[160]; /* the case running, for the hang guard */

static void raw_write(const char *s)
{
    size_t n = strlen(s);
    while (n > 0) {
        long w = syscall(SYS_write, 2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void on_alarm(int sig)
{
    (void)sig;
    raw_write("test_faults: HANG: the case ");
    raw_write(g_case);
    raw_write(" did not finish within its time limit\n");
    if (atomic_load(&g_fired) && g_fire_bt_len > 0) {
        /* where the injected call was made (addr2line -e test_faults):
         * backtrace_symbols_fd does not allocate */
        raw_write("test_faults: the injected call was made from:\n");
        backtrace_symbols_fd(g_fire_bt, g_fire_bt_len, 2);
    }
    _exit(3);
}

/* =====================================================================
 * The objects, keys and directory
 * ================================================================== */

#define NELEM 512
enum { OBJ_A, OBJ_A2_OLD, OBJ_A2_NEW, OBJ_B, OBJ_C, NSRC };

static char g_dir[256];
static kvs_layout g_layout;
static _Alignas(64) uint16_t g_src[NSRC][NELEM];      /* bfloat16 sources */
static _Alignas(64) uint16_t g_expect[NSRC][NELEM];   /* their fp8 round trip */
static kvs_memobj g_src_obj[NSRC];
static kvs_object_key g_key_a, g_key_a2, g_key_b, g_key_c;
static char g_spec_json[1024];      /* the spec in use (fp8 or pipeline) */
static char g_spec_fp8[1024], g_spec_pipeline[1024];
static char g_serde_json[] = "{\"type\": \"fp8\", \"max_workers\": 1}";
#define PIPELINE_SERDE                                                     \
    "{\"type\": \"pipeline\", \"stages\": [{\"type\": \"fp8\"}, {\"type\": \"xxh3\"}], " \
    "\"max_workers\": 1}"
static uint64_t g_obj_bytes; /* bytes one object is stored as, in use */
static uint64_t g_obj_bytes_fp8 = NELEM, g_obj_bytes_pipeline;
static int g_stride = 1;
static int g_verbose;
static char g_only[64];

static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

static int setup_data(void)
{
    int64_t dims[2] = {4, NELEM / 4};
    g_layout.ngroups = 0;
    if (kvs_layout_add_group(&g_layout, 2, dims, KVS_DTYPE_BFLOAT16) != KVS_OK) return -1;
    for (int o = 0; o < NSRC; o++) {
        for (int i = 0; i < NELEM; i++)
            g_src[o][i] = bf16_of((float)((i * 7 + o * 131) % 97 - 48) / (float)(o + 3));
        if (kvs_memobj_init(&g_src_obj[o], g_src[o], sizeof g_src[o], &g_layout,
                            KVS_FMT_KV_2LTD) != KVS_OK)
            return -1;
    }
    /* The expected loads: the sync fp8 serde's round trip. */
    kvs_serializer *ser = NULL;
    kvs_deserializer *de = NULL;
    if (kvs_fp8_serde_create(KVS_DTYPE_FLOAT8_E4M3FN, 1, &ser, &de) != KVS_OK) return -1;
    int rc = 0;
    for (int o = 0; o < NSRC && rc == 0; o++) {
        static uint8_t fp8[NELEM];
        kvs_memobj enc, dec;
        kvs_layout flat;
        size_t nw = 0;
        rc |= kvs_layout_flat(&flat, NELEM, KVS_DTYPE_UINT8);
        rc |= kvs_memobj_init(&enc, fp8, sizeof fp8, &flat, KVS_FMT_BINARY_BUFFER);
        rc |= kvs_memobj_init(&dec, g_expect[o], sizeof g_expect[o], &g_layout,
                              KVS_FMT_KV_2LTD);
        rc |= kvs_serialize(ser, &g_src_obj[o], &enc, NULL, &nw);
        rc |= kvs_memobj_set_used_size(&enc, nw);
        rc |= kvs_deserialize(de, &enc, &dec, NULL);
    }
    kvs_serializer_destroy(ser);
    kvs_deserializer_destroy(de);
    if (rc != 0) return -1;
    /* Two different A2 versions must differ, or "old or new" proves nothing. */
    if (memcmp(g_expect[OBJ_A2_OLD], g_expect[OBJ_A2_NEW], sizeof g_expect[0]) == 0) return -1;

    static const uint8_t ha[] = {0xA0, 0x01}, ha2[] = {0xA2, 0x02}, hb[] = {0xB0, 0x0B};
    uint8_t hc[80]; /* over 64 bytes: one more directory level */
    for (size_t i = 0; i < sizeof hc; i++) hc[i] = (uint8_t)(0xC0 + i);
    rc |= kvs_object_key_init(&g_key_a, ha, sizeof ha, "faults/model", 0, 0, "");
    rc |= kvs_object_key_init(&g_key_a2, ha2, sizeof ha2, "faults/model", 1, 0, "");
    rc |= kvs_object_key_init(&g_key_b, hb, sizeof hb, "faults/model", 0, 1, "salt");
    /* C's model is its own directory, so every cycle creates directories. */
    rc |= kvs_object_key_init(&g_key_c, hc, sizeof hc, "faults/other-model", -1, 3, "");
    return rc == 0 ? 0 : -1;
}

static int make_dir(void)
{
    const char *base = getenv("KVS_FAULTS_DIR");
    if (base == NULL) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : NULL;
    if (base == NULL) base = getenv("TMPDIR");
    if (base == NULL) base = "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/kvs-faults-XXXXXX", base);
    if (mkdtemp(g_dir) == NULL) return -1;
    snprintf(g_spec_fp8, sizeof g_spec_fp8,
             "{\"type\": \"fs\", \"path\": \"%s\", \"workers\": 1, "
             "\"serde\": {\"type\": \"fp8\", \"max_workers\": 1}}",
             g_dir);
    snprintf(g_spec_pipeline, sizeof g_spec_pipeline,
             "{\"type\": \"fs\", \"path\": \"%s\", \"workers\": 1, \"serde\": %s}", g_dir,
             PIPELINE_SERDE);
    snprintf(g_spec_json, sizeof g_spec_json, "%s", g_spec_fp8);
    g_obj_bytes = g_obj_bytes_fp8;
    /* A pipeline frame of fp8 + xxh3 is exactly its estimate (pipeline.h). */
    kvs_serde_pair pair;
    if (kvs_serde_create_pair(PIPELINE_SERDE, &pair) != KVS_OK) return -1;
    size_t est = 0;
    int rc = kvs_estimate_serialized_size(pair.serializer, &g_layout, &est);
    kvs_serde_pair_destroy(&pair);
    g_obj_bytes_pipeline = est;
    return rc == KVS_OK ? 0 : -1;
}

static int rm_tree_cb(int dfd, const char *name)
{
    struct stat st;
    if (__real_fstatat64(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return -1;
    if (S_ISDIR(st.st_mode)) {
        int fd = __real_openat64(dfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
        if (fd < 0) return -1;
        DIR *d = __real_fdopendir(fd);
        if (d == NULL) {
            close(fd);
            return -1;
        }
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                rm_tree_cb(dirfd(d), de->d_name);
        closedir(d);
        return __real_unlinkat(dfd, name, AT_REMOVEDIR);
    }
    return __real_unlinkat(dfd, name, 0);
}

/* Count ".tmp-*" files under the directory (recursively). */
static int count_tmp(int dfd)
{
    int fd = __real_openat64(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) return 0;
    DIR *d = __real_fdopendir(fd);
    if (d == NULL) {
        close(fd);
        return 0;
    }
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        if (strncmp(de->d_name, ".tmp-", 5) == 0) {
            n++;
            continue;
        }
        if (de->d_type == DT_DIR) {
            int sub = __real_openat64(dirfd(d), de->d_name,
                                      O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
            if (sub >= 0) {
                n += count_tmp(sub);
                close(sub);
            }
        }
    }
    closedir(d);
    return n;
}

/* Remove the now-empty directories of a deleted key's path, so that every
 * cycle makes them again (and the mkdir calls are walked too). */
static void remove_key_dirs(const kvs_object_key *key)
{
    char path[KVS_FS_KEY_PATH_MAX];
    if (kvs_fs_key_path(key, path, sizeof path) != KVS_OK) return;
    int dfd = __real_open64(g_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd < 0) return;
    char *slash;
    while ((slash = strrchr(path, '/')) != NULL) {
        *slash = '\0';
        (void)__real_unlinkat(dfd, path, AT_REMOVEDIR); /* fails if not empty */
    }
    close(dfd);
}

/* =====================================================================
 * Driving an adapter
 * ================================================================== */

#define WAIT_MS 45000
#define CASE_ALARM_S 120

static int g_case_failed; /* checks failed in the current case */

#define FCHECK(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: [%s] ", __FILE__, __LINE__, g_case);    \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
            kvs_test_checks_failed_in_test++;                               \
            g_case_failed++;                                                \
        }                                                                   \
    } while (0)

/* A refused call: a KVS_E* code and the thread's message naming it. */
static void check_refusal(const char *what, int rc)
{
    FCHECK(rc >= KVS_EAUTH && rc < 0, "%s returned %d, not a KVS_E* code", what, rc);
    FCHECK(kvs_last_error_code() == rc, "%s returned %d but the last error code is %d", what,
           rc, kvs_last_error_code());
    FCHECK(kvs_last_error()[0] != '\0', "%s returned %d (%s) without a message", what, rc,
           kvs_strerror(rc));
}

static int poll_fd(int fd, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    int r;
    do r = poll(&p, 1, ms);
    while (r < 0 && errno == EINTR);
    return r;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Wait for the store tasks ids[0..n) and put their results in res[]. Every
 * popped result must be one of them, once. 0, or -1 on a timeout. */
static int wait_stores(kvs_l2_adapter *w, const kvs_l2_task_id *ids, size_t n,
                       kvs_l2_store_result *res)
{
    int seen[4] = {0};
    size_t nseen = 0;
    int fd = kvs_l2_store_event_fd(w);
    FCHECK(fd >= 0, "store event fd: %d", fd);
    if (fd < 0) return -1;
    int64_t deadline = now_ms() + WAIT_MS;
    while (nseen < n) {
        kvs_l2_store_result buf[8];
        size_t cnt = 0;
        int rc = kvs_l2_pop_completed_stores(w, buf, 8, &cnt);
        FCHECK(rc == KVS_OK, "pop_completed_stores: %d %s", rc, kvs_last_error());
        for (size_t i = 0; i < cnt; i++) {
            size_t j = 0;
            while (j < n && ids[j] != buf[i].id) j++;
            FCHECK(j < n, "a store result for unknown task %" PRIu64, buf[i].id);
            if (j == n) continue;
            FCHECK(!seen[j], "store task %" PRIu64 " completed twice", buf[i].id);
            if (seen[j]) continue;
            seen[j] = 1;
            res[j] = buf[i];
            nseen++;
        }
        if (nseen == n) break;
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            FCHECK(0, "store tasks did not complete within %d ms", WAIT_MS);
            return -1;
        }
        if (poll_fd(fd, (int)left) > 0) (void)kvs_event_fd_consume(fd, NULL);
    }
    return 0;
}

/* Wait for a lookup or load result. 0, or -1 on a timeout. */
static int wait_bitmap(kvs_l2_adapter *w, int load, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    int fd = load ? kvs_l2_load_event_fd(w) : kvs_l2_lookup_event_fd(w);
    FCHECK(fd >= 0, "event fd: %d", fd);
    if (fd < 0) return -1;
    int64_t deadline = now_ms() + WAIT_MS;
    for (;;) {
        int rc = load ? kvs_l2_query_load(w, id, out) : kvs_l2_query_lookup_and_lock(w, id, out);
        FCHECK(rc == KVS_OK, "query: %d %s", rc, kvs_last_error());
        if (rc != KVS_OK) return -1;
        if (out->state != KVS_TASK_PENDING) return 0;
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            FCHECK(0, "%s task %" PRIu64 " did not complete within %d ms",
                   load ? "load" : "lookup", id, WAIT_MS);
            return -1;
        }
        if (poll_fd(fd, left > 100 ? 100 : (int)left) > 0) (void)kvs_event_fd_consume(fd, NULL);
    }
}

/* A finished task result's status and message agree: ok, or a code and a
 * message. */
static void check_task_error(const char *what, kvs_task_state state, int status,
                             const char *message)
{
    FCHECK(state == KVS_TASK_OK || state == KVS_TASK_FAILED, "%s: state %d", what, (int)state);
    if (state == KVS_TASK_FAILED || status != KVS_OK) {
        FCHECK(status >= KVS_EAUTH && status < 0, "%s: status %d is not a KVS_E* code",
               what, status);
        FCHECK(message[0] != '\0', "%s: failed (%d) without a message", what, status);
    }
}

/* A load result for keys[] into dst[]: every set bit loaded an intact
 * object (one of the allowed expectations), every cleared bit comes with a
 * status and message. Returns the hits as a bit mask. */
static unsigned check_load(const char *what, const kvs_l2_bitmap *b, size_t n,
                           kvs_memobj *const *dst, const uint16_t *const *ok1,
                           const uint16_t *const *ok2)
{
    check_task_error(what, b->state, b->status, b->message);
    FCHECK(b->nkeys == n || b->state == KVS_TASK_FAILED, "%s: %zu keys in the bitmap, want %zu",
           what, b->nkeys, n);
    unsigned mask = 0, clear = 0;
    for (size_t i = 0; i < n; i++) {
        int hit = b->hits && i < b->nkeys && b->hits[i];
        if (!hit) {
            clear++;
            continue;
        }
        mask |= 1u << i;
        const void *got = kvs_memobj_group_data(dst[i], 0);
        int intact = memcmp(got, ok1[i], NELEM * 2) == 0 ||
                     (ok2[i] && memcmp(got, ok2[i], NELEM * 2) == 0);
        FCHECK(intact, "%s: key %zu reported loaded but its bytes are not the stored object",
               what, i);
    }
    if (clear) {
        FCHECK(b->status < 0 && b->message[0] != '\0',
               "%s: %u key(s) not loaded, but status %d and message '%s'", what, clear,
               b->status, b->message);
    }
    return mask;
}

/* Store objects through a fault-free wrapper (setup and repair). */
static int plain_store(const kvs_object_key *keys, kvs_memobj *const *objs, size_t n)
{
    kvs_l2_adapter *w = NULL;
    if (kvs_l2_create(g_spec_json, &w) != KVS_OK) return -1;
    kvs_l2_task_id id;
    kvs_l2_store_result r = {0};
    int rc = kvs_l2_submit_store(w, keys, objs, n, &id);
    if (rc == KVS_OK) rc = wait_stores(w, &id, 1, &r);
    if (rc == KVS_OK && r.state != KVS_TASK_OK) rc = -1;
    kvs_l2_destroy(w);
    return rc;
}

/* =====================================================================
 * One cycle
 * ================================================================== */

enum scenario { SC_JSON, SC_PARTS, SC_PIPELINE, NSCEN };
static const char *const scen_names[NSCEN] = {"json", "parts", "pipeline"};

/* Switch the spec (fp8 or pipeline serde) to the scenario's, storing A and
 * A2 (old) again as that serde writes them when it changes. 0 or -1. */
static int use_scenario(enum scenario sc)
{
    const char *spec = sc == SC_PIPELINE ? g_spec_pipeline : g_spec_fp8;
    if (strcmp(spec, g_spec_json) == 0) return 0;
    snprintf(g_spec_json, sizeof g_spec_json, "%s", spec);
    g_obj_bytes = sc == SC_PIPELINE ? g_obj_bytes_pipeline : g_obj_bytes_fp8;
    kvs_memobj *pre[2] = {&g_src_obj[OBJ_A], &g_src_obj[OBJ_A2_OLD]};
    kvs_object_key pre_keys[2] = {g_key_a, g_key_a2};
    return plain_store(pre_keys, pre, 2);
}

struct outcome {
    int created;       /* the wrapper was built */
    int store_ok[2];   /* store task 0 ([B, A2']) / 1 ([C]) succeeded */
    int any_error;     /* some call or task reported an error */
    int have_usage;    /* the adapter's own count at the end: */
    long long keys, bytes_used;
};

/* "keys" and "bytes_used" of an adapter's status. */
static int status_counts(kvs_l2_adapter *w, long long *keys, long long *bytes)
{
    json_t *js = NULL;
    int rc = kvs_l2_status(w, &js);
    if (rc != KVS_OK) return rc;
    json_t *k = json_object_get(js, "keys"), *b = json_object_get(js, "bytes_used");
    rc = json_is_integer(k) && json_is_integer(b) ? KVS_OK : KVS_EINVAL;
    if (rc == KVS_OK) {
        *keys = json_integer_value(k);
        *bytes = json_integer_value(b);
    }
    json_decref(js);
    return rc;
}

static _Alignas(64) uint16_t g_dst[4][NELEM];
static kvs_memobj g_dst_obj[4];

static void reset_dst(void)
{
    for (int i = 0; i < 4; i++) {
        memset(g_dst[i], 0xEE, sizeof g_dst[i]);
        (void)kvs_memobj_init(&g_dst_obj[i], g_dst[i], sizeof g_dst[i], &g_layout,
                              KVS_FMT_KV_2LTD);
    }
}

static int create_wrapper(enum scenario sc, kvs_l2_adapter **out)
{
    *out = NULL;
    if (sc == SC_JSON || sc == SC_PIPELINE) { /* g_spec_json is the scenario's */
        int rc = kvs_l2_create(g_spec_json, out);
        if (rc != KVS_OK) check_refusal("kvs_l2_create", rc);
        return rc;
    }
    kvs_fs_options o = {0};
    o.path = g_dir;
    o.workers = 1;
    kvs_l2_adapter *inner = NULL;
    int rc = kvs_fs_adapter_create(&o, &inner);
    if (rc != KVS_OK) {
        check_refusal("kvs_fs_adapter_create", rc);
        FCHECK(inner == NULL, "kvs_fs_adapter_create failed but set *out");
        return rc;
    }
    kvs_processor *proc = NULL;
    rc = kvs_serde_create(g_serde_json, &proc);
    if (rc != KVS_OK) {
        check_refusal("kvs_serde_create", rc);
        kvs_l2_destroy(inner);
        return rc;
    }
    rc = kvs_serde_wrapper_create(inner, proc, NULL, out); /* owns both, always */
    if (rc != KVS_OK) check_refusal("kvs_serde_wrapper_create", rc);
    return rc;
}

static void cycle(enum scenario sc, struct outcome *o)
{
    memset(o, 0, sizeof *o);
    reset_dst();
    kvs_l2_adapter *w = NULL;
    if (create_wrapper(sc, &w) != KVS_OK) {
        o->any_error = 1;
        return;
    }
    o->created = 1;

    /* Two store tasks. */
    kvs_object_key k0[2] = {g_key_b, g_key_a2};
    kvs_memobj *o0[2] = {&g_src_obj[OBJ_B], &g_src_obj[OBJ_A2_NEW]};
    kvs_memobj *o1[1] = {&g_src_obj[OBJ_C]};
    kvs_l2_task_id sid[2];
    size_t nstores = 0;
    int rc = kvs_l2_submit_store(w, k0, o0, 2, &sid[nstores]);
    int submitted0 = rc == KVS_OK;
    if (rc == KVS_OK) nstores++;
    else check_refusal("submit_store [B, A2']", rc), o->any_error = 1;
    rc = kvs_l2_submit_store(w, &g_key_c, o1, 1, &sid[nstores]);
    int submitted1 = rc == KVS_OK;
    if (rc == KVS_OK) nstores++;
    else check_refusal("submit_store [C]", rc), o->any_error = 1;
    if (nstores == 2) FCHECK(sid[0] != sid[1], "two store tasks got the same id");
    kvs_l2_store_result res[2];
    memset(res, 0, sizeof res);
    if (nstores > 0 && wait_stores(w, sid, nstores, res) == 0) {
        size_t j = 0;
        const uint64_t want[2] = {2 * g_obj_bytes, g_obj_bytes};
        for (int t = 0; t < 2; t++) {
            if (!(t == 0 ? submitted0 : submitted1)) continue;
            kvs_l2_store_result *r = &res[j++];
            char what[48];
            snprintf(what, sizeof what, "store task %d", t);
            check_task_error(what, r->state, r->status, r->message);
            if (r->state == KVS_TASK_OK) {
                o->store_ok[t] = 1;
                FCHECK(r->bytes_written == want[t], "%s: %" PRIu64 " bytes written, want %" PRIu64,
                       what, r->bytes_written, want[t]);
            } else {
                o->any_error = 1;
            }
        }
    }

    /* Lookup and lock A and B, then unlock. */
    kvs_object_key lk[2] = {g_key_a, g_key_b};
    kvs_l2_task_id lid;
    rc = kvs_l2_submit_lookup_and_lock(w, lk, 2, &lid);
    if (rc != KVS_OK) {
        check_refusal("submit_lookup_and_lock", rc);
        o->any_error = 1;
    } else {
        kvs_l2_bitmap b = {0};
        if (wait_bitmap(w, 0, lid, &b) == 0) {
            check_task_error("lookup", b.state, b.status, b.message);
            int a_hit = b.hits && b.nkeys == 2 && b.hits[0];
            FCHECK(a_hit || (b.status < 0 && b.message[0]),
                   "lookup: A (stored before) not found, and no error (status %d '%s')",
                   b.status, b.message);
            if (!a_hit) o->any_error = 1;
            FCHECK(!(o->store_ok[0] && b.hits && b.nkeys == 2 && !b.hits[1]) ||
                       (b.status < 0 && b.message[0]),
                   "lookup: B (stored by a successful task) not found, and no error");
            kvs_l2_bitmap_release(&b);
        }
        rc = kvs_l2_unlock(w, lk, 2);
        if (rc != KVS_OK) check_refusal("unlock", rc), o->any_error = 1;
    }

    /* Two load tasks: [A, B] and [C, A2]. */
    kvs_object_key l0[2] = {g_key_a, g_key_b}, l1[2] = {g_key_c, g_key_a2};
    kvs_memobj *d0[2] = {&g_dst_obj[0], &g_dst_obj[1]};
    kvs_memobj *d1[2] = {&g_dst_obj[2], &g_dst_obj[3]};
    kvs_l2_task_id did[2];
    int dsub[2];
    rc = kvs_l2_submit_load(w, l0, d0, 2, &did[0]);
    dsub[0] = rc == KVS_OK;
    if (rc != KVS_OK) check_refusal("submit_load [A, B]", rc), o->any_error = 1;
    rc = kvs_l2_submit_load(w, l1, d1, 2, &did[1]);
    dsub[1] = rc == KVS_OK;
    if (rc != KVS_OK) check_refusal("submit_load [C, A2]", rc), o->any_error = 1;
    if (dsub[0] && dsub[1]) FCHECK(did[0] != did[1], "two load tasks got the same id");
    for (int t = 0; t < 2; t++) {
        if (!dsub[t]) continue;
        kvs_l2_bitmap b = {0};
        if (wait_bitmap(w, 1, did[t], &b) != 0) continue;
        const uint16_t *ok1[2], *ok2[2] = {NULL, NULL};
        if (t == 0) {
            ok1[0] = g_expect[OBJ_A];
            ok1[1] = g_expect[OBJ_B];
        } else {
            ok1[0] = g_expect[OBJ_C];
            ok1[1] = g_expect[OBJ_A2_OLD];
            ok2[1] = g_expect[OBJ_A2_NEW];
        }
        unsigned hits = check_load(t == 0 ? "load [A, B]" : "load [C, A2]", &b, 2,
                                   t == 0 ? d0 : d1, ok1, ok2);
        if (hits != 3) o->any_error = 1;
        if (t == 0 && !(hits & 1)) /* A was stored before the cycle */
            FCHECK(b.status < 0, "load: A not loaded without an error");
        /* The second load must not see the result of the first. */
        kvs_l2_bitmap again = {0};
        if (kvs_l2_query_load(w, did[t], &again) == KVS_OK)
            FCHECK(again.state == KVS_TASK_PENDING, "load result popped twice");
        kvs_l2_bitmap_release(&again);
        kvs_l2_bitmap_release(&b);
    }

    rc = kvs_l2_close(w);
    if (rc != KVS_OK) check_refusal("kvs_l2_close", rc), o->any_error = 1;
    /* What the adapter believes is stored (status keeps working after close). */
    o->have_usage = status_counts(w, &o->keys, &o->bytes_used) == KVS_OK;
    kvs_l2_destroy(w);
}

/* After a cycle, with faults off: what is stored is intact, then put the
 * directory back as it was (A, A2 old; no B, C). */
static void verify_and_repair(const struct outcome *o)
{
    kvs_l2_adapter *w = NULL;
    int rc = kvs_l2_create(g_spec_json, &w);
    FCHECK(rc == KVS_OK, "verify: cannot create a wrapper: %s", kvs_last_error());
    if (rc != KVS_OK) return;
    /* The fresh adapter counted the directory: the truth the cycle's adapter
     * must have kept up to date (l2_fs.h: "kept up to date by this
     * adapter's stores and deletes"). */
    long long keys_now = 0, bytes_now = 0;
    if (o->have_usage && status_counts(w, &keys_now, &bytes_now) == KVS_OK) {
        FCHECK(o->keys == keys_now && o->bytes_used == bytes_now,
               "the adapter counted %lld keys / %lld bytes at the end, the directory holds "
               "%lld keys / %lld bytes",
               o->keys, o->bytes_used, keys_now, bytes_now);
    }
    reset_dst();
    kvs_object_key keys[4] = {g_key_a, g_key_a2, g_key_b, g_key_c};
    kvs_memobj *dst[4] = {&g_dst_obj[0], &g_dst_obj[1], &g_dst_obj[2], &g_dst_obj[3]};
    kvs_l2_task_id id;
    kvs_l2_bitmap b = {0};
    rc = kvs_l2_submit_load(w, keys, dst, 4, &id);
    FCHECK(rc == KVS_OK, "verify: submit_load: %s", kvs_last_error());
    if (rc == KVS_OK && wait_bitmap(w, 1, id, &b) == 0 && b.nkeys == 4 && b.hits) {
        const uint16_t *objs[4] = {g_expect[OBJ_A], g_expect[OBJ_A2_OLD], g_expect[OBJ_B],
                                   g_expect[OBJ_C]};
        FCHECK(b.hits[0], "verify: A, stored before the fault, no longer loads: %s",
               b.message);
        FCHECK(b.hits[1], "verify: A2 (old or new) no longer loads: %s", b.message);
        if (o->store_ok[0]) {
            FCHECK(b.hits[2], "verify: B's store task succeeded but B does not load: %s",
                   b.message);
        }
        if (o->store_ok[1]) {
            FCHECK(b.hits[3], "verify: C's store task succeeded but C does not load: %s",
                   b.message);
        }
        for (int i = 0; i < 4; i++) {
            if (!b.hits[i]) continue;
            if (i == 1) {
                int is_old = memcmp(g_dst[i], g_expect[OBJ_A2_OLD], sizeof g_dst[i]) == 0;
                int is_new = memcmp(g_dst[i], g_expect[OBJ_A2_NEW], sizeof g_dst[i]) == 0;
                FCHECK(is_old || is_new, "verify: A2 loads but is neither the old nor the "
                                         "new object (torn)");
                FCHECK(is_new || !o->store_ok[0],
                       "verify: A2's overwrite succeeded but A2 holds the old object");
                continue;
            }
            FCHECK(memcmp(g_dst[i], objs[i], sizeof g_dst[i]) == 0,
                   "verify: key %d loads but its bytes are wrong (torn or mixed up)", i);
        }
    }
    kvs_l2_bitmap_release(&b);
    /* Back to the starting state. */
    kvs_object_key del[2] = {g_key_b, g_key_c};
    (void)kvs_l2_delete(w, del, 2, NULL);
    kvs_l2_destroy(w);
    remove_key_dirs(&g_key_b);
    remove_key_dirs(&g_key_c);
    kvs_memobj *old = &g_src_obj[OBJ_A2_OLD];
    FCHECK(plain_store(&g_key_a2, &old, 1) == 0, "repair: cannot store A2 again");
}

/* =====================================================================
 * Cases and the walk
 * ================================================================== */

struct stats {
    long cases;          /* cycles run with a fault armed */
    long injected;       /* ... in which the fault happened */
    long not_reached;    /* ... the Nth call never came (timing) */
    long with_error;     /* ... in which some error was reported */
    long silent;         /* ... injected but everything succeeded */
    long failed;         /* ... with a failed check */
};

/* The call stack of the injected call (addr2line -e test_faults offsets). */
static void print_fire_site(void)
{
    fprintf(stderr, " from:");
    for (int i = 2; i < g_fire_bt_len && i < 9; i++) {
        char where[128];
        fmt_addr(g_fire_bt[i], where, sizeof where);
        fprintf(stderr, " %s", where);
    }
}

/* One cycle with kind `ki` armed at call n (ki < 0: none), and every check
 * around it. Fills calls[] with the calls the cycle made. */
static void run_case(enum scenario sc, int ki, long n, long *calls, struct stats *st)
{
    if (ki >= 0)
        snprintf(g_case, sizeof g_case, "%s/%s#%ld", scen_names[sc], kinds[ki].name, n);
    else
        snprintf(g_case, sizeof g_case, "%s/fault-free", scen_names[sc]);
    g_case_failed = 0;
    int fds0 = count_entries("/proc/self/fd");
    int tasks0 = settled_count("/proc/self/task", g_tasks_idle);
    size_t live0 = track_live();
    unsigned long epoch = ++g_epoch;

    alarm(CASE_ALARM_S);
    for (int c = 0; c < NCLS; c++) atomic_store(&g_calls[c], 0);
    atomic_store(&g_fired, 0);
    g_fire_bt_len = 0;
    atomic_store(&g_target, n);
    atomic_store(&g_armed, ki);
    atomic_store(&g_counting, 1);

    struct outcome o;
    cycle(sc, &o);

    atomic_store(&g_counting, 0);
    atomic_store(&g_armed, -1);
    int fired = atomic_load(&g_fired);
    if (calls)
        for (int c = 0; c < NCLS; c++) calls[c] = atomic_load(&g_calls[c]);

    /* Nothing left behind. */
    int fds1 = settled_count("/proc/self/fd", fds0);
    int tasks1 = settled_count("/proc/self/task", tasks0);
    FCHECK(fds1 == fds0, "%d fd(s) left open (%d before, %d after)", fds1 - fds0, fds0, fds1);
    FCHECK(tasks1 == tasks0, "%d thread(s) left running (%d before, %d after)",
           tasks1 - tasks0, tasks0, tasks1);
    size_t live1 = track_live();
    if (live1 != live0) {
        FCHECK(0, "%ld block(s) allocated by the library not freed",
               (long)live1 - (long)live0);
        track_report_since(epoch, g_case);
    }
#ifdef KVS_HAVE_LSAN
    FCHECK(__lsan_do_recoverable_leak_check() == 0, "LeakSanitizer found a leak (above)");
#endif
    int dfd = __real_open64(g_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    int tmps = dfd >= 0 ? count_tmp(dfd) : 0;
    if (dfd >= 0) close(dfd);
    int unlink_fault = ki >= 0 && kinds[ki].cls == C_UNLINK;
    FCHECK(tmps == 0 || unlink_fault, "%d temporary file(s) left in %s", tmps, g_dir);

    verify_and_repair(&o);
    /* Let the verifying adapter's joined threads leave /proc before the next
     * case counts. */
    (void)settled_count("/proc/self/task", tasks0);
    if (unlink_fault) { /* the next open removed them */
        dfd = __real_open64(g_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
        tmps = dfd >= 0 ? count_tmp(dfd) : 0;
        if (dfd >= 0) close(dfd);
        FCHECK(tmps == 0, "%d stale temporary file(s) not removed by the next open", tmps);
    }
    alarm(0);

    if (ki < 0) {
        FCHECK(!o.any_error, "the fault-free cycle reported an error: %s", kvs_last_error());
        return;
    }
    st->cases++;
    if (!fired) st->not_reached++;
    else st->injected++;
    if (fired && o.any_error) st->with_error++;
    if (fired && !o.any_error) st->silent++;
    if (g_case_failed) {
        st->failed++;
        if (fired && g_fire_bt_len > 0) {
            fprintf(stderr, "    [%s] the failed call was made", g_case);
            print_fire_site();
            fputc('\n', stderr);
        }
    }
    if (g_verbose) {
        fprintf(stderr, "  %-32s %s%s%s", g_case, fired ? "injected" : "not reached",
                fired ? (o.any_error ? ", error reported" : ", no error (recovered)") : "",
                g_case_failed ? ", CHECK FAILED" : "");
        if (fired && !g_case_failed) print_fire_site();
        fputc('\n', stderr);
    }
}

/* The fault-free cycle passes, and is stable enough to walk. */
static long g_count[NSCEN][NCLS];

static void test_fault_free_cycles(void)
{
    struct stats st = {0};
    for (int sc = 0; sc < NSCEN; sc++) {
        FCHECK(use_scenario((enum scenario)sc) == 0, "cannot store A and A2 for %s: %s",
               scen_names[sc], kvs_last_error());
        run_case((enum scenario)sc, -1, 0, g_count[sc], &st);
        run_case((enum scenario)sc, -1, 0, g_count[sc], &st); /* caches warmed */
        printf("%s cycle, calls per class:", scen_names[sc]);
        for (int c = 0; c < NCLS; c++)
            if (g_count[sc][c]) printf(" %s %ld", cls_names[c], g_count[sc][c]);
        printf("\n");
    }
}

static struct stats g_total;

static void walk(enum scenario sc)
{
    struct stats st = {0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    FCHECK(use_scenario(sc) == 0, "cannot store A and A2 for %s: %s", scen_names[sc],
           kvs_last_error());
    printf("%s: %-16s %6s %8s %9s %7s %10s %7s\n", scen_names[sc], "kind", "calls", "injected",
           "not hit", "errors", "recovered", "FAILED");
    for (size_t ki = 0; ki < NKINDS; ki++) {
        struct stats ks = {0};
        long calls = g_count[sc][kinds[ki].cls];
        for (long n = 1; n <= calls; n += g_stride) {
            if (g_only[0]) {
                char want[96];
                snprintf(want, sizeof want, "%s:%ld", kinds[ki].name, n);
                if (strcmp(want, g_only) != 0) continue;
            }
            run_case(sc, (int)ki, n, NULL, &ks);
        }
        printf("%s: %-16s %6ld %8ld %9ld %7ld %10ld %7ld\n", scen_names[sc], kinds[ki].name,
               calls, ks.injected, ks.not_reached, ks.with_error, ks.silent, ks.failed);
        st.cases += ks.cases;
        st.injected += ks.injected;
        st.not_reached += ks.not_reached;
        st.with_error += ks.with_error;
        st.silent += ks.silent;
        st.failed += ks.failed;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%s: %ld cases, %ld faults injected (%ld reported as errors, %ld recovered "
           "silently), %ld not reached, %ld with failed checks, %.1f s\n",
           scen_names[sc], st.cases, st.injected, st.with_error, st.silent, st.not_reached,
           st.failed, (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    fflush(stdout);
    g_total.cases += st.cases;
    g_total.injected += st.injected;
    g_total.failed += st.failed;
}

static void test_walk_json(void) { walk(SC_JSON); }
static void test_walk_parts(void) { walk(SC_PARTS); }
static void test_walk_pipeline(void) { walk(SC_PIPELINE); }

/* Remove the scratch directory (at exit, whatever the path to it). */
static void remove_scratch(void)
{
    char parent[sizeof g_dir];
    snprintf(parent, sizeof parent, "%s", g_dir);
    char *slash = strrchr(parent, '/');
    if (g_dir[0] == '\0' || slash == NULL) return;
    *slash = '\0';
    int dfd = __real_open64(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (dfd >= 0) {
        rm_tree_cb(dfd, slash + 1);
        close(dfd);
    }
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *s = getenv("KVS_FAULTS_STRIDE");
    if (s && atoi(s) > 0) g_stride = atoi(s);
    g_verbose = getenv("KVS_FAULTS_VERBOSE") != NULL;
    s = getenv("KVS_FAULTS_ONLY");
    if (s) snprintf(g_only, sizeof g_only, "%s", s);

    signal(SIGALRM, on_alarm);
    g_tasks_idle = count_entries("/proc/self/task");
    void *warm[2];
    (void)backtrace(warm, 2); /* loads the unwinder now, not inside a fault */

    if (setup_data() != 0 || make_dir() != 0) {
        fprintf(stderr, "test_faults: setup failed: %s\n", kvs_last_error());
        return 1;
    }
    atexit(remove_scratch);
    kvs_memobj *pre[2] = {&g_src_obj[OBJ_A], &g_src_obj[OBJ_A2_OLD]};
    kvs_object_key pre_keys[2] = {g_key_a, g_key_a2};
    if (plain_store(pre_keys, pre, 2) != 0) {
        fprintf(stderr, "test_faults: cannot store A and A2 in %s: %s\n", g_dir,
                kvs_last_error());
        return 1;
    }

    RUN(test_fault_free_cycles);
    RUN(test_walk_json);
    RUN(test_walk_parts);
    RUN(test_walk_pipeline);
    printf("total: %ld cases, %ld faults injected, %ld with failed checks (stride %d)\n",
           g_total.cases, g_total.injected, g_total.failed, g_stride);

    return TEST_SUMMARY();
}
