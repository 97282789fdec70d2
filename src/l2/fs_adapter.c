/* fs_adapter.c - the "fs" L2 adapter (kvserde/l2_fs.h): one file per key
 * under a directory, written through a temporary file and rename(2).
 *
 * Threads and locks:
 *   - The completion plumbing (ids, eventfds, unread results, the pool,
 *     close) is the adapters' shared base (adapter_base.h).
 *   - A task's keys are cut into up to `workers` contiguous slices, one pool
 *     job each, so one big batch uses every worker (parallel reads, and
 *     parallel fsyncs, which is where a store spends its time): the shared
 *     batch runner (batch_slices.h). Each slice records its own hits, bytes
 *     and first error in memory of its own; the last slice to finish merges
 *     them in key order and completes the task.
 *   - `mu` guards the usage counters and the lock counts (the shared lock
 *     table, lock_table.h, keyed by the key's path), and is held
 *     across the few metadata calls that must be atomic with them: a
 *     store's stat-of-the-old-file + capacity check + rename, a lookup's
 *     stat + lock, a delete's lock check + unlink. Data is written and read
 *     outside it.
 *   - `dir_lock` protects the directory fd for the synchronous calls
 *     (delete, object sizes, status): they hold it for reading, close takes
 *     it for writing to release the fd. Workers need no lock: close joins
 *     them before it releases the fd.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvserde/error.h"
#include "kvserde/export.h"
#include "kvserde/l2.h"
#include "kvserde/l2_fs.h"
#include "kvserde/registry.h"
#include "l2/adapter_base.h"
#include "l2/builtins.h"
#include "l2/fs_adapter.h"
#include "l2/fs_names.h"
#include "l2/lock_table.h"

#define MSG_PATH_MAX 200  /* longer paths are shortened in messages */
#define TMP_PATH_MAX (KVS_FS_KEY_PATH_MAX + KVS_FS_TEMP_NAME_LEN + 2)

/* The store marker at the root: tells a later open that the directory is a
 * store, so it may be adopted without asking (see l2_fs.h). */
#define MARKER_NAME ".kvserde-store"
#define MARKER_TEXT "kvserde fs store, format 1\n"

typedef struct fs_adapter {
    kvs_l2_adapter_base base;   /* runs tasks as slices on its pool */
    char *root;          /* the directory as given, without trailing '/' */
    int dirfd;           /* -1 once closed */
    int fsync;
    mode_t mode;         /* of every file made; exact, whatever the umask */
    mode_t dir_mode;     /* of every directory made: mode plus matching x bits */
    uint64_t capacity;
    unsigned workers;
    uint64_t nonce;      /* random: names this adapter's temporary files */
    atomic_uint_fast64_t tmp_seq;

    pthread_mutex_t mu;  /* guards the group below */
    uint64_t bytes_used;
    uint64_t nkeys;
    kvs_l2_lock_table locks; /* by the key's path */

    pthread_rwlock_t dir_lock;
    int closed;          /* the directory is released: written holding dir_lock */

    kvs_fs_read_hook read_hook;
    void *read_hook_arg;
} fs_adapter;

static const struct kvs_l2_adapter_ops fs_ops;

static fs_adapter *fs_of(kvs_l2_adapter *a)
{
    return KVS_CONTAINER_OF(a, fs_adapter, base.adapter);
}

/* The adapter running a slice (the runner's ctx). */
static fs_adapter *fs_of_slice(const kvs_l2_slice *s) { return s->batch->runner.ctx; }

/* ---------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------ */

/* "<root>/<rel>" for a message, with the middle of a long one replaced by
 * "..." so the message keeps both ends. */
static void msg_path(const fs_adapter *fs, const char *rel, char *out, size_t size)
{
    char full[8192];
    int n = snprintf(full, sizeof full, "%s/%s", fs->root, rel);
    size_t len = n < 0 ? 0 : (size_t)n;
    if (len >= sizeof full) len = sizeof full - 1;
    if (len > MSG_PATH_MAX) {
        size_t head = MSG_PATH_MAX / 2, tail = MSG_PATH_MAX - head - 3;
        memmove(full + head, "...", 3);
        memmove(full + head + 3, full + len - tail, tail);
        len = MSG_PATH_MAX;
    }
    if (len >= size) len = size - 1; /* callers pass MSG_PATH_MAX + 1 or more */
    memcpy(out, full, len);
    out[len] = '\0';
}

/* Key i failed in system call `call` with errno `err`. */
static void slice_fail_sys(kvs_l2_slice *s, const char *op, size_t i, const char *call,
                           int err, const char *rel)
{
    char where[MSG_PATH_MAX + 8];
    msg_path(fs_of_slice(s), rel, where, sizeof where);
    kvs_l2_slice_fail(s, KVS_EIO, "fs: %s of key %zu: %s: %s (%s)", op, i, call,
                      strerror(err), where);
}

static int write_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n > 0) {
        size_t chunk = n > ((size_t)1 << 30) ? (size_t)1 << 30 : n;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read up to n bytes; returns the count (short only at end of file) or -1. */
static ssize_t read_full(int fd, void *data, size_t n)
{
    char *p = data;
    size_t got = 0;
    while (got < n) {
        size_t chunk = n - got > ((size_t)1 << 30) ? (size_t)1 << 30 : n - got;
        ssize_t r = read(fd, p + got, chunk);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* fsync the directory rel[0..len) (len 0: the root). 0 or -1 with errno. */
static int fsync_dir(fs_adapter *fs, const char *rel, size_t len)
{
    if (len == 0) return fsync(fs->dirfd);
    char dir[KVS_FS_KEY_PATH_MAX];
    memcpy(dir, rel, len);
    dir[len] = '\0';
    int fd = openat(fs->dirfd, dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    errno = err;
    return rc;
}

/* The directory mode that goes with a file mode: each read bit brings the
 * matching execute (search) bit, so whoever may read the objects may also
 * reach them (0600 -> 0700, 0640 -> 0750). */
static mode_t dir_mode_of(mode_t mode) { return mode | ((mode & 0444) >> 2); }

/* mkdir with exactly mode dmode: mkdir's mode is narrowed by the umask, and
 * changing the umask would change it for the whole process. A setgid bit
 * inherited from the parent is kept: it is how a store shared by a group
 * keeps new entries in that group. 1 if made, 0 if it was there, -1 with
 * errno. */
static int make_dir_at(int dfd, const char *path, mode_t dmode)
{
    if (mkdirat(dfd, path, dmode) != 0) return errno == EEXIST ? 0 : -1;
    int fd = openat(dfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -1;
    struct stat st;
    int rc = fstat(fd, &st);
    if (rc == 0) rc = fchmod(fd, dmode | (st.st_mode & S_ISGID));
    int err = errno;
    close(fd);
    errno = err;
    return rc == 0 ? 1 : -1;
}

/* Make the directories of rel[0..dlen) that are missing (as mkdir -p below
 * the root); with fsync on, each new one's parent is synced so the new
 * entry is durable. 0, or -1 with errno and *call naming the call. */
static int make_dirs(fs_adapter *fs, const char *rel, size_t dlen, const char **call)
{
    char dir[KVS_FS_KEY_PATH_MAX];
    for (size_t i = 0; i <= dlen; i++) {
        if (i < dlen && rel[i] != '/') continue;
        memcpy(dir, rel, i);
        dir[i] = '\0';
        int made = make_dir_at(fs->dirfd, dir, fs->dir_mode);
        if (made < 0) {
            *call = "mkdir";
            return -1;
        }
        if (made && fs->fsync && fsync_dir(fs, rel, kvs_fs_dir_len(dir, i)) != 0) {
            *call = "fsync";
            return -1;
        }
    }
    return 0;
}

/* 1 if `name` (below dfd) still is the file open at fd; 0 if it has been
 * removed or replaced; -1 with errno. */
static int still_named(int dfd, const char *name, int fd)
{
    struct stat mine, named;
    if (fstat(fd, &mine) != 0) return -1;
    if (fstatat(dfd, name, &named, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -1;
    return mine.st_nlink > 0 && mine.st_ino == named.st_ino && mine.st_dev == named.st_dev;
}

/* Create a new temporary file in the directory rel[0..dlen) (made if
 * missing; dlen 0: the root), with the adapter's mode and locked, its path
 * written into tmp (TMP_PATH_MAX bytes). The fd, or -1 with errno and *call
 * naming the failing call.
 *
 * The flock tells an adapter opening the directory that the file is in use
 * (remove_stale_temp). Create and lock are two steps: in between, such an
 * adapter may take the file for a crash leftover, lock it and remove it. So
 * after locking, the name must still lead to this very file; if it does not
 * (or the remover holds the lock right now and is about to remove it), the
 * file is dropped and a new name tried. Once the check passes, no remover
 * can get the lock before the rename. */
static int open_temp(fs_adapter *fs, const char *rel, size_t dlen, char *tmp,
                     const char **call)
{
    for (int attempt = 0;; attempt++) {
        char name[KVS_FS_TEMP_NAME_LEN + 1];
        kvs_fs_temp_name(fs->nonce, atomic_fetch_add(&fs->tmp_seq, 1), name);
        snprintf(tmp, TMP_PATH_MAX, "%.*s%s%s", (int)dlen, rel, dlen ? "/" : "", name);
        int fd = openat(fs->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                        fs->mode);
        int err = errno;
        if (fd < 0) {
            if (err == ENOENT && dlen && attempt < 4) {
                if (make_dirs(fs, rel, dlen, call) != 0) return -1;
                continue;
            }
            if ((err == EEXIST || err == EINTR) && attempt < 16) continue;
            *call = "open";
            errno = err;
            return -1;
        }
        int named = -1;
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            err = errno;
            *call = "lock";
            if (err == EWOULDBLOCK || err == EINTR) named = 0; /* a remover has it */
        } else if ((named = still_named(fs->dirfd, tmp, fd)) < 0) {
            err = errno;
            *call = "stat";
        } else if (named == 1) {
            if (fchmod(fd, fs->mode) == 0) return fd; /* exact, whatever the umask */
            err = errno;
            *call = "chmod";
        }
        /* The name is this adapter's alone: removing it cannot hit another
         * writer's file (if a remover got there first, this is a no-op). */
        unlinkat(fs->dirfd, tmp, 0);
        close(fd);
        if (named == 0 && attempt < 16) continue;
        if (named == 0) err = EAGAIN; /* removed under us every time */
        errno = err;
        return -1;
    }
}

/* ---------------------------------------------------------------------
 * Worker side
 * ------------------------------------------------------------------ */

/* Store key i. 0 on success; else the slice has failed. */
static int store_one(fs_adapter *fs, kvs_l2_slice *s, size_t i)
{
    kvs_l2_batch *b = s->batch;
    const kvs_memobj *obj = b->objects[i];
    size_t size = kvs_memobj_size(obj);
    char rel[KVS_FS_KEY_PATH_MAX];
    size_t len = kvs_fs_encode_key(&b->keys[i], rel);
    size_t dlen = kvs_fs_dir_len(rel, len);

    /* A new temporary file next to the final one (same directory, so the
     * rename is atomic), locked until the rename. */
    char tmp[TMP_PATH_MAX];
    const char *call = NULL;
    int fd = open_temp(fs, rel, dlen, tmp, &call);
    if (fd < 0) {
        slice_fail_sys(s, "store", i, call, errno, rel);
        return -1;
    }
    call = NULL;
    int err = 0;
    if (write_all(fd, obj->data, size) != 0) call = "write";
    else if (fs->fsync && fsync(fd) != 0) call = "fsync";
    if (call) {
        err = errno;
        unlinkat(fs->dirfd, tmp, 0);
        close(fd);
        slice_fail_sys(s, "store", i, call, err, rel);
        return -1;
    }

    pthread_mutex_lock(&fs->mu);
    struct stat st;
    int existed = 0;
    if (fstatat(fs->dirfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        existed = S_ISREG(st.st_mode);
    } else if (errno != ENOENT && errno != ENOTDIR) {
        /* Unknown whether a key is replaced: the usage count would drift. */
        err = errno;
        pthread_mutex_unlock(&fs->mu);
        unlinkat(fs->dirfd, tmp, 0);
        close(fd);
        slice_fail_sys(s, "store", i, "stat", err, rel);
        return -1;
    }
    uint64_t old = existed ? (uint64_t)st.st_size : 0;
    /* Another process may have changed the directory since it was counted:
     * never let the count wrap. */
    uint64_t base = fs->bytes_used >= old ? fs->bytes_used - old : 0;
    uint64_t after = base + size;
    if (fs->capacity && after > fs->capacity) {
        pthread_mutex_unlock(&fs->mu);
        unlinkat(fs->dirfd, tmp, 0);
        close(fd);
        char where[MSG_PATH_MAX + 8];
        msg_path(fs, rel, where, sizeof where);
        kvs_l2_slice_fail(s, KVS_ENOSPC,
                          "fs: capacity exceeded storing key %zu: %zu bytes would make "
                          "%" PRIu64 " bytes used, capacity %" PRIu64 " (%s)",
                          i, size, after, fs->capacity, where);
        return -1;
    }
    if (renameat(fs->dirfd, tmp, fs->dirfd, rel) != 0) {
        err = errno;
        pthread_mutex_unlock(&fs->mu);
        unlinkat(fs->dirfd, tmp, 0);
        close(fd);
        slice_fail_sys(s, "store", i, "rename", err, rel);
        return -1;
    }
    fs->bytes_used = after;
    if (!existed) fs->nkeys++;
    pthread_mutex_unlock(&fs->mu);

    /* The object is in place (and counted); report a failure to make it
     * durable, so the caller can retry. */
    if (close(fd) != 0) call = "close";
    else if (fs->fsync && fsync_dir(fs, rel, dlen) != 0) call = "fsync";
    if (call) {
        slice_fail_sys(s, "store", i, call, errno, rel);
        return -1;
    }
    s->bytes += size;
    return 0;
}

static void lookup_one(fs_adapter *fs, kvs_l2_slice *s, size_t i)
{
    kvs_l2_batch *b = s->batch;
    char rel[KVS_FS_KEY_PATH_MAX];
    kvs_fs_encode_key(&b->keys[i], rel);
    struct stat st;
    pthread_mutex_lock(&fs->mu);
    int rc = fstatat(fs->dirfd, rel, &st, AT_SYMLINK_NOFOLLOW);
    int err = errno;
    int found = rc == 0 && S_ISREG(st.st_mode);
    int locked = found && kvs_l2_lock_table_add(&fs->locks, rel) == 0;
    pthread_mutex_unlock(&fs->mu);
    if (locked) {
        b->hit[i] = 1;
        return;
    }
    char where[MSG_PATH_MAX + 8];
    msg_path(fs, rel, where, sizeof where);
    if (found)
        kvs_l2_slice_fail(s, KVS_ENOMEM,
                          "fs: lookup of key %zu: out of memory for its lock (%s)", i, where);
    else if (rc == 0)
        kvs_l2_slice_fail(s, KVS_ECORRUPT, "fs: lookup of key %zu: not a regular file (%s)",
                          i, where);
    else if (err != ENOENT && err != ENOTDIR)
        slice_fail_sys(s, "lookup", i, "stat", err, rel);
    /* else: a plain miss, not an error */
}

static void load_one(fs_adapter *fs, kvs_l2_slice *s, size_t i)
{
    kvs_l2_batch *b = s->batch;
    kvs_memobj *obj = b->objects[i];
    char rel[KVS_FS_KEY_PATH_MAX];
    kvs_fs_encode_key(&b->keys[i], rel);
    char where[MSG_PATH_MAX + 8];

    /* O_NONBLOCK: a FIFO planted at the path must not hang the worker
     * (it is refused below); regular files ignore the flag. */
    int fd = openat(fs->dirfd, rel, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        int err = errno;
        if (err == ENOENT || err == ENOTDIR) {
            msg_path(fs, rel, where, sizeof where);
            kvs_l2_slice_fail(s, KVS_ENOTFOUND, "fs: load of key %zu: not found (%s)", i,
                              where);
        } else {
            slice_fail_sys(s, "load", i, "open", err, rel);
        }
        return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        slice_fail_sys(s, "load", i, "fstat", errno, rel);
        close(fd);
        return;
    }
    msg_path(fs, rel, where, sizeof where);
    if (!S_ISREG(st.st_mode)) {
        kvs_l2_slice_fail(s, KVS_ECORRUPT, "fs: load of key %zu: not a regular file (%s)",
                          i, where);
        close(fd);
        return;
    }
    uint64_t size = (uint64_t)st.st_size, need = 0;
    if (kvs_l2_load_wrong_size(obj, size, &need)) {
        kvs_l2_slice_fail(s, KVS_ECORRUPT,
                          "fs: load of key %zu: stored object is %" PRIu64
                          " bytes, destination layout needs %" PRIu64 " (%s)",
                          i, size, need, where);
        close(fd);
        return;
    }
    if (size > obj->capacity) {
        kvs_l2_slice_fail(s, KVS_ENOSPC,
                          "fs: load of key %zu: stored object is %" PRIu64
                          " bytes, destination holds %zu (%s)",
                          i, size, obj->capacity, where);
        close(fd);
        return;
    }
    if (fs->read_hook) fs->read_hook(fs->read_hook_arg, fd, i);
    ssize_t got = read_full(fd, obj->data, (size_t)size);
    char extra;
    ssize_t more = got == (ssize_t)size ? read_full(fd, &extra, 1) : 0;
    if (got < 0 || more < 0)
        slice_fail_sys(s, "load", i, "read", errno, rel);
    else if ((uint64_t)got < size)
        kvs_l2_slice_fail(s, KVS_ECORRUPT,
                          "fs: load of key %zu: file shrank while reading: %zd of %" PRIu64
                          " bytes (%s)",
                          i, got, size, where);
    else if (more > 0)
        kvs_l2_slice_fail(s, KVS_ECORRUPT,
                          "fs: load of key %zu: file grew while reading: more than %" PRIu64
                          " bytes (%s)",
                          i, size, where);
    else {
        (void)kvs_memobj_set_used_size(obj, (size_t)size); /* fits: checked above */
        b->hit[i] = 1;
    }
    close(fd);
}

/* The batch runner's run(): this slice's keys, in order; a store stops at
 * its first failure. */
static void run_slice(kvs_l2_slice *s)
{
    fs_adapter *fs = fs_of_slice(s);
    switch (s->batch->t->direction) {
    case KVS_L2_STORE:
        for (size_t i = s->begin; i < s->end; i++)
            if (store_one(fs, s, i) != 0) break;
        break;
    case KVS_L2_LOOKUP:
        for (size_t i = s->begin; i < s->end; i++) lookup_one(fs, s, i);
        break;
    case KVS_L2_LOAD:
        for (size_t i = s->begin; i < s->end; i++) load_one(fs, s, i);
        break;
    }
}

/* ---------------------------------------------------------------------
 * Ops
 * ------------------------------------------------------------------ */

static int fs_unlock(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n)
{
    fs_adapter *fs = fs_of(a);
    char rel[KVS_FS_KEY_PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        kvs_fs_encode_key(&keys[i], rel);
        pthread_mutex_lock(&fs->mu);
        kvs_l2_lock_table_release(&fs->locks, rel);
        pthread_mutex_unlock(&fs->mu);
    }
    return KVS_OK;
}

static int fs_delete(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                     uint8_t *deleted)
{
    fs_adapter *fs = fs_of(a);
    pthread_rwlock_rdlock(&fs->dir_lock);
    if (fs->closed) {
        pthread_rwlock_unlock(&fs->dir_lock);
        return kvs_l2_base_refuse_closed(&fs->base);
    }
    int rc = KVS_OK;
    char rel[KVS_FS_KEY_PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        kvs_fs_encode_key(&keys[i], rel);
        int gone = 0, err = 0;
        pthread_mutex_lock(&fs->mu);
        struct stat st;
        if (kvs_l2_lock_table_count(&fs->locks, rel) == 0 &&
            fstatat(fs->dirfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) {
            if (unlinkat(fs->dirfd, rel, 0) == 0) {
                gone = 1;
                uint64_t size = (uint64_t)st.st_size;
                fs->bytes_used = fs->bytes_used >= size ? fs->bytes_used - size : 0;
                if (fs->nkeys) fs->nkeys--;
            } else if (errno != ENOENT) {
                err = errno;
            }
        }
        pthread_mutex_unlock(&fs->mu);
        if (err && rc == KVS_OK) {
            char where[MSG_PATH_MAX + 8];
            msg_path(fs, rel, where, sizeof where);
            rc = kvs_set_error(KVS_EIO, "fs: delete of key %zu: unlink: %s (%s)", i,
                               strerror(err), where);
        }
        if (deleted) deleted[i] = (uint8_t)gone;
    }
    pthread_rwlock_unlock(&fs->dir_lock);
    return rc;
}

static int fs_object_sizes(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                           int64_t *sizes)
{
    fs_adapter *fs = fs_of(a);
    pthread_rwlock_rdlock(&fs->dir_lock);
    if (fs->closed) {
        pthread_rwlock_unlock(&fs->dir_lock);
        return kvs_l2_base_refuse_closed(&fs->base);
    }
    char rel[KVS_FS_KEY_PATH_MAX];
    for (size_t i = 0; i < n; i++) {
        kvs_fs_encode_key(&keys[i], rel);
        struct stat st;
        int ok = fstatat(fs->dirfd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                 S_ISREG(st.st_mode);
        sizes[i] = ok ? (int64_t)st.st_size : -1;
    }
    pthread_rwlock_unlock(&fs->dir_lock);
    return KVS_OK;
}

static int fs_usage(kvs_l2_adapter *a, kvs_l2_usage *out)
{
    fs_adapter *fs = fs_of(a);
    pthread_mutex_lock(&fs->mu);
    out->bytes_used = fs->bytes_used;
    out->capacity = fs->capacity;
    pthread_mutex_unlock(&fs->mu);
    return KVS_OK;
}

static int fs_status(kvs_l2_adapter *a, json_t **out)
{
    fs_adapter *fs = fs_of(a);
    int closing = kvs_l2_tq_is_closed(&fs->base.q); /* closing counts as closed */
    pthread_rwlock_rdlock(&fs->dir_lock);
    /* A directory removed under us has no links left: stores would fail. */
    struct stat st;
    int dir_ok = !fs->closed && fstat(fs->dirfd, &st) == 0 && st.st_nlink > 0;
    pthread_rwlock_unlock(&fs->dir_lock);
    pthread_mutex_lock(&fs->mu);
    uint64_t keys = fs->nkeys, used = fs->bytes_used;
    uint64_t locked = kvs_l2_lock_table_nlocked(&fs->locks);
    pthread_mutex_unlock(&fs->mu);
    json_t *s = json_pack("{s:s, s:s, s:b, s:I, s:I, s:I, s:I, s:I, s:b}", "type", "fs",
                          "path", fs->root, "is_healthy", !closing && dir_ok, "keys",
                          (json_int_t)keys, "bytes_used", (json_int_t)used,
                          "capacity_bytes", (json_int_t)fs->capacity, "locked_keys",
                          (json_int_t)locked, "workers", (json_int_t)fs->workers, "fsync",
                          fs->fsync);
    if (s == NULL) return kvs_set_error(KVS_ENOMEM, "fs: out of memory for status");
    *out = s;
    return KVS_OK;
}

/* Close's last step (adapter_base.h): release the directory. */
static void fs_release(kvs_l2_adapter_base *b)
{
    fs_adapter *fs = KVS_CONTAINER_OF(b, fs_adapter, base);
    pthread_rwlock_wrlock(&fs->dir_lock);
    close(fs->dirfd);
    fs->dirfd = -1;
    fs->closed = 1;
    pthread_rwlock_unlock(&fs->dir_lock);
}

static void fs_destroy(kvs_l2_adapter *a)
{
    fs_adapter *fs = fs_of(a);
    kvs_l2_base_destroy(&fs->base);
    if (fs->dirfd >= 0) close(fs->dirfd);
    kvs_l2_lock_table_destroy(&fs->locks);
    pthread_rwlock_destroy(&fs->dir_lock);
    pthread_mutex_destroy(&fs->mu);
    free(fs->root);
    free(fs);
}

static int fs_list_keys(kvs_l2_adapter *a, kvs_l2_key_fn fn, void *ctx);

static const struct kvs_l2_adapter_ops fs_ops = {
    .name = "fs",
    KVS_L2_BASE_COMPLETION_OPS,
    KVS_L2_BASE_BATCH_OPS,
    .unlock = fs_unlock,
    .delete_keys = fs_delete,
    .object_sizes = fs_object_sizes,
    .usage = fs_usage,
    .status = fs_status,
    .destroy = fs_destroy,
    .list_keys = fs_list_keys,
};

/* ---------------------------------------------------------------------
 * Opening the directory
 * ------------------------------------------------------------------ */

/* mkdir -p, each directory made with exactly dmode. 0, or -1 with errno. */
static int mkdir_p(const char *path, mode_t dmode)
{
    size_t len = strlen(path);
    char *p = malloc(len + 1);
    if (p == NULL) {
        errno = ENOMEM;
        return -1;
    }
    memcpy(p, path, len + 1);
    int rc = 0;
    for (size_t i = 1; i <= len && rc == 0; i++) {
        if (i < len && p[i] != '/') continue;
        char saved = p[i];
        p[i] = '\0';
        if (make_dir_at(AT_FDCWD, p, dmode) < 0) rc = -1;
        p[i] = saved;
    }
    int err = errno;
    free(p);
    errno = err;
    return rc;
}

/* A leftover temporary file: remove it unless a writer still holds it
 * (open_temp). The name is checked again once locked: a writer that has
 * finished may have renamed it away, and nothing else may be removed. */
static void remove_stale_temp(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        still_named(dfd, name, fd) == 1)
        unlinkat(dfd, name, 0);
    close(fd);
}

/* A walk of the store's directories: the open's census and the key
 * listing are the same walk, with a different visit per object file. */
typedef struct store_walk {
    const char *root;  /* for messages */
    const char *what;  /* "count", "list": for messages */
    int remove_temps;  /* the open removes stale temporaries; a listing does not */
    /* Called for every object file (a regular file whose path below the
     * root is a key path); non-zero stops the walk and is returned. */
    int (*visit)(struct store_walk *w, const char *rel, const kvs_object_key *key,
                 const struct stat *st);
    void *ctx;
} store_walk;

/* A failure to read part of the directory while walking it: refused (for
 * the census, a wrong count would let stores pass the capacity unnoticed;
 * for a listing, keys would be missed). */
static int scan_error(const store_walk *w, const char *call, const char *rel)
{
    int err = errno;
    return kvs_set_error(err == ENOMEM ? KVS_ENOMEM : KVS_EIO,
                         "fs: cannot %s the objects in '%s': %s '%s': %s", w->what, w->root,
                         call, *rel ? rel : ".", strerror(err));
}

/* Walk the directory open at fd (taken over): visit the object files (the
 * regular files whose path is a key path), remove stale temporaries (files
 * named exactly as open_temp names them) if asked to, enter only the
 * subdirectories the key scheme makes (kvs_fs_is_store_dir: that also
 * bounds the depth), skip everything else. rel holds the path of fd below
 * the root. An entry that vanishes while we look is skipped; any other
 * error, or a visit's non-zero value, is returned. */
static int scan_dir(int fd, char *rel, size_t rel_len, store_walk *w)
{
    DIR *d = fdopendir(fd);
    if (d == NULL) {
        int rc = scan_error(w, "fdopendir", rel);
        close(fd);
        return rc;
    }
    int dfd = dirfd(d);
    int rc = KVS_OK;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (de == NULL) {
            if (errno != 0) rc = scan_error(w, "readdir", rel);
            break;
        }
        const char *name = de->d_name;
        if (name[0] == '.') { /* ".", "..", the marker, and never an object */
            if (w->remove_temps && kvs_fs_is_temp_name(name)) remove_stale_temp(dfd, name);
            continue;
        }
        size_t nl = strlen(name);
        if (rel_len + 1 + nl >= KVS_FS_KEY_PATH_MAX) continue; /* never a key path */
        size_t len = rel_len;
        if (len) rel[len++] = '/';
        memcpy(rel + len, name, nl + 1);
        len += nl;
        struct stat st;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno != ENOENT) rc = scan_error(w, "stat", rel);
        } else if (S_ISDIR(st.st_mode) && kvs_fs_is_store_dir(rel)) {
            int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
            if (sub >= 0) rc = scan_dir(sub, rel, len, w);
            else if (errno != ENOENT) rc = scan_error(w, "open", rel);
        } else if (S_ISREG(st.st_mode)) {
            kvs_object_key key;
            if (kvs_fs_path_key(rel, &key) == KVS_OK) rc = w->visit(w, rel, &key, &st);
        }
        rel[rel_len] = '\0';
        if (rc) break;
    }
    closedir(d);
    return rc;
}

/* Walk the whole store below the directory open at dirfd (not taken
 * over: the walk has a descriptor of its own). */
static int walk_store(int dirfd, store_walk *w)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int err = errno;
        return kvs_set_error(err == ENOMEM ? KVS_ENOMEM : KVS_EIO,
                             "fs: cannot read directory '%s': %s", w->root, strerror(err));
    }
    char rel[KVS_FS_KEY_PATH_MAX] = "";
    return scan_dir(fd, rel, 0, w);
}

/* The census of an open: bytes and keys stored. */
typedef struct scan_totals {
    uint64_t bytes, keys;
} scan_totals;

static int count_object(store_walk *w, const char *rel, const kvs_object_key *key,
                        const struct stat *st)
{
    (void)rel, (void)key;
    scan_totals *tot = w->ctx;
    tot->bytes += (uint64_t)st->st_size;
    tot->keys++;
    return 0;
}

/* The listing: the caller's callback per object file. */
typedef struct list_ctx {
    kvs_l2_key_fn fn;
    void *ctx;
} list_ctx;

static int list_object(store_walk *w, const char *rel, const kvs_object_key *key,
                       const struct stat *st)
{
    (void)rel, (void)st;
    list_ctx *l = w->ctx;
    return l->fn(l->ctx, key);
}

/* The directory is read through a descriptor of the walk's own, taken
 * under dir_lock: no lock is held while fn runs, so fn may call back into
 * the adapter (delete, loads, close). */
static int fs_list_keys(kvs_l2_adapter *a, kvs_l2_key_fn fn, void *ctx)
{
    fs_adapter *fs = fs_of(a);
    pthread_rwlock_rdlock(&fs->dir_lock);
    if (fs->closed) {
        pthread_rwlock_unlock(&fs->dir_lock);
        return kvs_l2_base_refuse_closed(&fs->base);
    }
    int fd = openat(fs->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int err = errno;
    pthread_rwlock_unlock(&fs->dir_lock);
    if (fd < 0)
        return kvs_set_error(err == ENOMEM ? KVS_ENOMEM : KVS_EIO,
                             "fs: cannot read directory '%s': %s", fs->root, strerror(err));
    list_ctx l = {fn, ctx};
    store_walk w = {fs->root, "list", 0, list_object, &l};
    char rel[KVS_FS_KEY_PATH_MAX] = "";
    return scan_dir(fd, rel, 0, &w); /* takes fd over */
}

/* 1 if "A" and "a" name the same entry in the directory: a temporary file
 * (so a crash leaves only a file the next open removes) is also found under
 * its uppercase name. Not knowable in a read-only directory: then 0
 * (nothing can be stored there anyway). */
static int case_insensitive(fs_adapter *fs)
{
    char tmp[TMP_PATH_MAX], upper[TMP_PATH_MAX];
    const char *call;
    int fd = open_temp(fs, "", 0, tmp, &call);
    if (fd < 0) return 0;
    for (size_t i = 0;; i++) {
        upper[i] = tmp[i] >= 'a' && tmp[i] <= 'z' ? (char)(tmp[i] - 'a' + 'A') : tmp[i];
        if (tmp[i] == '\0') break;
    }
    int same = still_named(fs->dirfd, upper, fd) == 1;
    unlinkat(fs->dirfd, tmp, 0);
    close(fd);
    return same;
}

/* 1 if a directory without a marker may be taken as a store: every entry
 * of its root is one kvserde makes (a directory the key scheme makes, or a
 * temporary file), so it is empty or a store written before markers
 * existed. Else 0 with the first other entry's name in `foreign`; -1 with
 * errno if the directory cannot be read. */
static int only_store_entries(int dfd, char *foreign, size_t size)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (d == NULL) {
        int err = errno;
        if (fd >= 0) close(fd);
        errno = err;
        return -1;
    }
    int ok = 1;
    for (;;) {
        errno = 0;
        struct dirent *de = readdir(d);
        if (de == NULL) {
            if (errno != 0) ok = -1;
            break;
        }
        const char *name = de->d_name;
        if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0 || kvs_fs_is_temp_name(name))
            continue;
        struct stat st;
        if (kvs_fs_is_store_dir(name) && fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISDIR(st.st_mode))
            continue;
        snprintf(foreign, size, "%s", name);
        ok = 0;
        break;
    }
    int err = errno;
    closedir(d);
    errno = err;
    return ok;
}

/* One look: KVS_OK or a refusal, or 1 when the marker appeared between the
 * look for it and the listing. */
static int check_marker_once(int dfd, const char *root, int adopt, int *present);

/* Look for the marker; without one, refuse a directory that holds other
 * things than kvserde's unless `adopt`. *present says whether it is there. */
static int check_marker(int dfd, const char *root, int adopt, int *present)
{
    *present = 0;
    /* Another process opening the same fresh directory may rename its
     * marker into place between the look for it and the listing: the
     * listing then finds it, and the look is made again (the marker never
     * goes away once written, so a second look settles it). */
    for (int attempt = 0; attempt < 3; attempt++) {
        int rc = check_marker_once(dfd, root, adopt, present);
        if (rc <= 0) return rc;
    }
    return kvs_set_error(KVS_EIO, "fs: the store marker '%s/" MARKER_NAME
                                  "' appears in the listing but cannot be opened", root);
}

static int check_marker_once(int dfd, const char *root, int adopt, int *present)
{
    int fd = openat(dfd, MARKER_NAME, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) {
        char text[sizeof MARKER_TEXT];
        ssize_t got = read_full(fd, text, sizeof text);
        close(fd);
        if (got != (ssize_t)sizeof MARKER_TEXT - 1 ||
            memcmp(text, MARKER_TEXT, sizeof MARKER_TEXT - 1) != 0)
            return kvs_set_error(KVS_EUNSUPPORTED,
                                 "fs: '%s/" MARKER_NAME "' is not a store marker of format 1 "
                                 "(it should hold one line: '%.*s')",
                                 root, (int)sizeof MARKER_TEXT - 2, MARKER_TEXT);
        *present = 1;
        return KVS_OK;
    }
    if (errno != ENOENT)
        return kvs_set_error(KVS_EIO, "fs: cannot read the store marker '%s/" MARKER_NAME
                                      "': %s", root, strerror(errno));
    if (adopt) return KVS_OK;
    char foreign[256];
    int only = only_store_entries(dfd, foreign, sizeof foreign);
    if (only < 0)
        return kvs_set_error(KVS_EIO, "fs: cannot read directory '%s': %s", root,
                             strerror(errno));
    if (only == 0 && strcmp(foreign, MARKER_NAME) == 0)
        return 1; /* the marker appeared meanwhile: look again */
    if (only == 0)
        return kvs_set_error(KVS_EEXIST,
                             "fs: directory '%s' is not a kvserde store: no " MARKER_NAME
                             " marker, and it holds '%s'; set \"adopt\": true to use it",
                             root, foreign);
    return KVS_OK;
}

/* Write the marker (through a temporary file and rename, like an object).
 * A read-only directory is left without one: nothing is stored there, and
 * the next writable open writes it. */
static int write_marker(fs_adapter *fs)
{
    char tmp[TMP_PATH_MAX];
    const char *call = NULL;
    int fd = open_temp(fs, "", 0, tmp, &call);
    if (fd < 0) {
        if (errno == EACCES || errno == EPERM || errno == EROFS) return KVS_OK;
    } else {
        if (write_all(fd, MARKER_TEXT, sizeof MARKER_TEXT - 1) != 0) call = "write";
        else if (fs->fsync && fsync(fd) != 0) call = "fsync";
        else if (renameat(fs->dirfd, tmp, fs->dirfd, MARKER_NAME) != 0) call = "rename";
        else if (fs->fsync && fsync(fs->dirfd) != 0) call = "fsync";
        int err = errno;
        if (call) unlinkat(fs->dirfd, tmp, 0);
        close(fd);
        errno = err;
        if (call == NULL) return KVS_OK;
    }
    return kvs_set_error(KVS_EIO, "fs: cannot write the store marker '%s/" MARKER_NAME
                                  "': %s: %s", fs->root, call, strerror(errno));
}

/* A mode given in the options (0: the default). */
static int check_mode(unsigned mode)
{
    if (mode > 0777)
        return kvs_set_error(KVS_EINVAL, "fs: mode %04o is not a permission mode (0000 to 0777)",
                             mode);
    if (mode & 0111)
        return kvs_set_error(KVS_EINVAL,
                             "fs: mode %04o has execute bits; give the files' mode, such as "
                             "0640 (directories get the matching execute bits)",
                             mode);
    if (mode & 0002)
        return kvs_set_error(KVS_EINVAL,
                             "fs: mode %04o lets every local user write the store; grant "
                             "write to the owner and group only",
                             mode);
    if ((mode & 0600) != 0600)
        return kvs_set_error(KVS_EINVAL,
                             "fs: mode %04o must let the owner read and write (0600)", mode);
    return KVS_OK;
}

static uint64_t make_nonce(void)
{
    uint64_t v;
    size_t got = 0;
    while (got < sizeof v) {
        ssize_t n = getrandom((char *)&v + got, sizeof v - got, GRND_NONBLOCK);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    if (got == sizeof v) return v;
    /* No entropy yet (early boot): the names only need to differ from
     * other live writers', and O_EXCL catches the rest. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^
           ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)&ts;
}

int kvs_fs_adapter_create(const kvs_fs_options *opts, kvs_l2_adapter **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "fs: output pointer is NULL");
    *out = NULL;
    if (opts == NULL) return kvs_set_error(KVS_EINVAL, "fs: options are NULL");
    if (opts->path == NULL || opts->path[0] == '\0')
        return kvs_set_error(KVS_EINVAL, "fs: path is empty");
    unsigned workers = opts->workers ? opts->workers : KVS_FS_DEFAULT_WORKERS;
    if (workers > KVS_FS_MAX_WORKERS)
        return kvs_set_error(KVS_EINVAL, "fs: workers %u out of range [1, %u]", workers,
                             (unsigned)KVS_FS_MAX_WORKERS);
    int rc = opts->mode ? check_mode(opts->mode) : KVS_OK;
    if (rc) return rc;
    mode_t mode = opts->mode ? (mode_t)opts->mode : KVS_FS_DEFAULT_MODE;

    fs_adapter *fs = calloc(1, sizeof *fs);
    char *root = strdup(opts->path);
    kvs_l2_lock_table locks;
    int locks_oom = kvs_l2_lock_table_init(&locks) != 0;
    if (fs == NULL || root == NULL || locks_oom) {
        free(fs);
        free(root);
        kvs_l2_lock_table_destroy(&locks);
        return kvs_set_error(KVS_ENOMEM, "fs: out of memory creating the adapter");
    }
    size_t rlen = strlen(root);
    while (rlen > 1 && root[rlen - 1] == '/') root[--rlen] = '\0';

    int dfd = -1;
    if (!opts->no_create && mkdir_p(root, dir_mode_of(mode)) != 0) {
        rc = kvs_set_error(KVS_EIO, "fs: cannot create directory '%s': %s", root,
                           strerror(errno));
        goto fail;
    }
    dfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        int err = errno;
        rc = kvs_set_error(err == ENOENT ? KVS_ENOTFOUND : KVS_EIO,
                           "fs: cannot open directory '%s': %s", root, strerror(err));
        goto fail;
    }
    int marked;
    if ((rc = check_marker(dfd, root, opts->adopt, &marked)) != KVS_OK) goto fail;
    /* What open_temp needs, for the probe and the marker. */
    fs->root = root;
    fs->dirfd = dfd;
    fs->fsync = !opts->no_fsync;
    fs->mode = mode;
    fs->dir_mode = dir_mode_of(mode);
    fs->nonce = make_nonce();
    atomic_init(&fs->tmp_seq, 0);
    if (case_insensitive(fs)) {
        rc = kvs_set_error(KVS_EUNSUPPORTED,
                           "fs: directory '%s' has case-insensitive names; keys differing "
                           "only in case would collide",
                           root);
        goto fail;
    }
    scan_totals tot = {0, 0};
    store_walk census = {root, "count", 1, count_object, &tot};
    if ((rc = walk_store(dfd, &census)) != KVS_OK) goto fail;
    if (!marked && (rc = write_marker(fs)) != KVS_OK) goto fail;

    fs->capacity = opts->capacity_bytes;
    fs->workers = workers;
    fs->bytes_used = tot.bytes;
    fs->nkeys = tot.keys;
    fs->locks = locks;
    if ((rc = kvs_l2_base_init(&fs->base, &fs_ops, "fs", fs_release)) != KVS_OK) goto fail;
    if ((rc = kvs_l2_base_start(&fs->base, workers, "kvs-fs", run_slice, fs)) != KVS_OK) {
        kvs_l2_base_destroy(&fs->base);
        goto fail;
    }
    pthread_mutex_init(&fs->mu, NULL);
    pthread_rwlock_init(&fs->dir_lock, NULL);
    *out = &fs->base.adapter;
    return KVS_OK;

fail:
    if (dfd >= 0) close(dfd);
    free(root);
    kvs_l2_lock_table_destroy(&locks); /* fs->locks, if set, is this very table */
    free(fs);
    return rc;
}

void kvs_fs_adapter_set_read_hook(kvs_l2_adapter *a, kvs_fs_read_hook hook, void *arg)
{
    if (a == NULL || a->ops != &fs_ops) return;
    fs_adapter *fs = fs_of(a);
    fs->read_hook = hook;
    fs->read_hook_arg = arg;
}

/* ---------------------------------------------------------------------
 * The registry's factory
 * ------------------------------------------------------------------ */

/* "mode": a string of one to four octal digits ("0640"). An integer is
 * refused: 640 and 0640 would be easy to confuse, and JSON has no octal. */
static int parse_mode(const json_t *v, unsigned *out)
{
    *out = 0;
    if (v == NULL) return KVS_OK;
    const char *t = json_is_string(v) ? json_string_value(v) : NULL;
    size_t n = t ? strlen(t) : 0;
    int ok = n >= 1 && n <= 4 && strspn(t, "01234567") == n;
    if (!ok && t)
        return kvs_set_error(KVS_EINVAL,
                             "fs: mode must be a string of octal digits such as \"0640\", "
                             "got '%.40s'",
                             t);
    if (!ok)
        return kvs_set_error(KVS_EINVAL,
                             "fs: mode must be a string of octal digits such as \"0640\", "
                             "got %s",
                             kvs_json_type_name(v));
    *out = (unsigned)strtoul(t, NULL, 8);
    /* "0000" would otherwise read as "the default". */
    return check_mode(*out);
}

int kvs_fs_adapter_factory(const json_t *spec, void *userdata, kvs_l2_adapter **out)
{
    (void)userdata;
    if (out) *out = NULL;
    if (!json_is_object(spec))
        return kvs_set_error(KVS_EINVAL, "fs: spec must be a JSON object, got %s",
                             spec ? kvs_json_type_name(spec) : "NULL");
    static const char *const known[] = {"path",   "fsync", "capacity_bytes", "workers",
                                        "create", "adopt", "mode",           NULL};
    int rc = kvs_json_check_keys(spec, "fs", "key", known);
    if (rc) return rc;
    kvs_fs_options o = {0};
    const json_t *path = json_object_get(spec, "path");
    if (path == NULL) return kvs_set_error(KVS_EINVAL, "fs: missing 'path'");
    if (!json_is_string(path))
        return kvs_set_error(KVS_EINVAL, "fs: path must be a string, got %s",
                             kvs_json_type_name(path));
    o.path = json_string_value(path);
    int do_fsync, create, adopt;
    if ((rc = kvs_kwargs_get_bool(spec, "fs", "fsync", 1, &do_fsync)) ||
        (rc = kvs_kwargs_get_bool(spec, "fs", "create", 1, &create)) ||
        (rc = kvs_kwargs_get_bool(spec, "fs", "adopt", 0, &adopt)))
        return rc;
    o.adopt = adopt;
    if ((rc = parse_mode(json_object_get(spec, "mode"), &o.mode)) != KVS_OK) return rc;
    o.no_fsync = !do_fsync;
    o.no_create = !create;
    const json_t *cap = json_object_get(spec, "capacity_bytes");
    if (cap != NULL) {
        if (!json_is_integer(cap))
            return kvs_set_error(KVS_EINVAL,
                                 "fs: capacity_bytes must be an integer >= 0, got %s",
                                 kvs_json_type_name(cap));
        if (json_integer_value(cap) < 0)
            return kvs_set_error(KVS_EINVAL,
                                 "fs: capacity_bytes must be an integer >= 0, got %lld",
                                 (long long)json_integer_value(cap));
        o.capacity_bytes = (uint64_t)json_integer_value(cap);
    }
    rc = kvs_kwargs_get_positive_int(spec, "fs", "workers", KVS_FS_DEFAULT_WORKERS,
                                     &o.workers);
    if (rc) return rc;
    return kvs_fs_adapter_create(&o, out);
}
