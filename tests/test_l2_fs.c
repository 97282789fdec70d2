/* test_l2_fs.c - the filesystem L2 adapter ("fs", kvserde/l2_fs.h) and its
 * key -> path scheme: the l2.h contract on a fresh temporary directory per
 * test, hostile key names, injectivity, damaged files, crash leftovers,
 * capacity, locks, close. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvs_test.h"
#include "kvs_test_list.h"
#define WAIT_MS 10000 /* per wait, kvs_test_l2.h */
#include "kvs_test_l2.h"
#include "kvs_test_objs.h"
#include "kvserde/l2.h"
#include "kvserde/l2_fs.h"
#include "kvserde/memobj.h"
#include "kvserde/processor.h"
#include "l2/builtins.h"
#include "l2/fs_adapter.h"
#include "l2/fs_names.h"


/* ---------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------ */

static int rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rm_rf(const char *path) { nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

/* A fresh directory per test. */
static void make_tmpdir(char *buf, size_t size)
{
    snprintf(buf, size, "/tmp/kvs_fs_test_XXXXXX");
    if (mkdtemp(buf) == NULL) {
        perror("mkdtemp");
        abort();
    }
}

static kvs_l2_adapter *open_fs(const char *dir, unsigned workers, uint64_t capacity,
                               int no_fsync)
{
    kvs_fs_options o = {0};
    o.path = dir;
    o.workers = workers;
    o.capacity_bytes = capacity;
    o.no_fsync = no_fsync;
    kvs_l2_adapter *a = NULL;
    if (kvs_fs_adapter_create(&o, &a) != KVS_OK) {
        fprintf(stderr, "kvs_fs_adapter_create(%s): %s\n", dir, kvs_last_error());
        return NULL;
    }
    return a;
}

/* IntHash2Bytes(i): the 4-byte big-endian hash upstream's tests use. */
static void int_key(kvs_object_key *k, uint32_t i, const char *model)
{
    uint8_t h[4] = {(uint8_t)(i >> 24), (uint8_t)(i >> 16), (uint8_t)(i >> 8), (uint8_t)i};
    if (kvs_object_key_init(k, h, 4, model, 0, 0, NULL) != KVS_OK) abort();
}

static kvs_memobj *make_obj(size_t n, unsigned seed)
{
    kvs_layout l;
    kvs_memobj *o = NULL;
    if (kvs_layout_flat(&l, n, KVS_DTYPE_UINT8) != KVS_OK ||
        kvs_memobj_alloc(&l, KVS_FMT_BINARY_BUFFER, &o) != KVS_OK)
        abort();
    for (size_t i = 0; i < n; i++) ((uint8_t *)o->data)[i] = (uint8_t)(seed * 31u + i * 7u + 1u);
    return o;
}

static int same_bytes(const kvs_memobj *a, const kvs_memobj *b)
{
    return kvs_memobj_size(a) == kvs_memobj_size(b) &&
           (kvs_memobj_size(a) == 0 || memcmp(a->data, b->data, kvs_memobj_size(a)) == 0);
}

/* Submit a store and wait for its result (the only store in flight). */
static int store_wait(kvs_l2_adapter *a, const kvs_object_key *keys, kvs_memobj **objs,
                      size_t n, kvs_l2_store_result *res)
{
    kvs_l2_task_id id;
    int rc = kvs_l2_submit_store(a, keys, objs, n, &id);
    return rc ? rc : store_result(a, id, res);
}

static int bitmap_wait(kvs_l2_adapter *a, int load, const kvs_object_key *keys,
                       kvs_memobj **objs, size_t n, kvs_l2_bitmap *out, kvs_l2_task_id *idp)
{
    kvs_l2_task_id id;
    int rc = load ? kvs_l2_submit_load(a, keys, objs, n, &id)
                  : kvs_l2_submit_lookup_and_lock(a, keys, n, &id);
    if (rc) return rc;
    if (idp) *idp = id;
    return bitmap_result(a, load, id, out);
}

static int load_wait(kvs_l2_adapter *a, const kvs_object_key *keys, kvs_memobj **objs,
                     size_t n, kvs_l2_bitmap *out)
{
    return bitmap_wait(a, 1, keys, objs, n, out, NULL);
}

static int lookup_wait(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                       kvs_l2_bitmap *out)
{
    return bitmap_wait(a, 0, keys, NULL, n, out, NULL);
}

/* Store int_key(i, model) holding n bytes, one task; 1 if it succeeded. */
static int store_int_key(kvs_l2_adapter *a, uint32_t i, const char *model, size_t n)
{
    kvs_object_key k;
    int_key(&k, i, model);
    kvs_memobj *o = make_obj(n, i);
    kvs_l2_store_result res;
    int rc = store_wait(a, &k, &o, 1, &res);
    int ok = rc == KVS_OK && res.state == KVS_TASK_OK;
    if (!ok)
        fprintf(stderr, "store of %u failed: %s\n", (unsigned)i,
                rc == KVS_OK ? res.message : kvs_last_error());
    kvs_memobj_free(o);
    return ok;
}

/* "<dir>/<key path>" */
static void key_file(const char *dir, const kvs_object_key *k, char *out, size_t size)
{
    char rel[KVS_FS_KEY_PATH_MAX];
    if (kvs_fs_key_path(k, rel, sizeof rel) != KVS_OK) abort();
    snprintf(out, size, "%s/%s", dir, rel);
}

static long long file_size(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static void write_file(const char *path, const void *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, data, n) != (ssize_t)n) abort();
    close(fd);
}

/* The tree walk (nftw has no user pointer: file-scope state). */
static char walk_root[PATH_MAX];
static int walk_regular, walk_tmp, walk_outside, walk_symlinks, walk_undecodable, walk_marker;

static int walk_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    size_t rl = strlen(walk_root);
    if (strncmp(path, walk_root, rl) != 0 || (path[rl] != '/' && path[rl] != '\0') ||
        strstr(path, "/../") || strstr(path, "/./"))
        walk_outside++;
    if (strncmp(path + ftw->base, ".tmp-", 5) == 0) walk_tmp++;
    if (flag == FTW_SL || flag == FTW_SLN) walk_symlinks++;
    if (flag == FTW_F && ftw->level == 1 && strcmp(path + ftw->base, ".kvserde-store") == 0) {
        walk_marker++; /* the store marker: not counted as a file below */
    } else if (flag == FTW_F) {
        walk_regular++;
        kvs_object_key k;
        if (kvs_fs_path_key(path + rl + 1, &k) != KVS_OK) walk_undecodable++;
    }
    return 0;
}

static void walk(const char *dir)
{
    snprintf(walk_root, sizeof walk_root, "%s", dir);
    walk_regular = walk_tmp = walk_outside = walk_symlinks = walk_undecodable = walk_marker = 0;
    nftw(dir, walk_cb, 16, FTW_PHYS);
}

/* A deterministic generator (xorshift64*). */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

/* ---------------------------------------------------------------------
 * The key -> path scheme
 * ------------------------------------------------------------------ */

static void check_path(const kvs_object_key *k, const char *expected)
{
    char buf[KVS_FS_KEY_PATH_MAX];
    CHECK_OK(kvs_fs_key_path(k, buf, sizeof buf));
    CHECK_EQ_STR(buf, expected);
    kvs_object_key back;
    CHECK_OK(kvs_fs_path_key(buf, &back));
    CHECK(kvs_object_key_equal(&back, k));
}

static void test_key_path_examples(void)
{
    kvs_object_key k;
    uint8_t h7[4] = {0, 0, 0, 7}, hab[1] = {0xab};
    REQUIRE_OK(kvs_object_key_init(&k, h7, 4, "meta-llama/Llama-3-8B", 0, 0, NULL));
    check_path(&k, "meta-llama%2FLlama-3-8B+/00000007,0,0");
    REQUIRE_OK(kvs_object_key_init(&k, hab, 1, "..", -1, 3, "s"));
    check_path(&k, "%2E.+s/ab,-1,3");
    REQUIRE_OK(kvs_object_key_init(&k, hab, 1, "../../etc", 2, 0, NULL));
    check_path(&k, "%2E.%2F..%2Fetc+/ab,2,0");
    REQUIRE_OK(kvs_object_key_init(&k, hab, 1, "a/../../b", 0, 0, ".x"));
    check_path(&k, "a%2F..%2F..%2Fb+.x/ab,0,0");
    REQUIRE_OK(kvs_object_key_init(&k, NULL, 0, "", 0, 0, NULL));
    check_path(&k, "+/,0,0");
    REQUIRE_OK(kvs_object_key_init(&k, NULL, 0, ".", INT64_MIN, INT64_MAX, "%+ ~"));
    check_path(&k, "%2E+%25%2B%20%7E/,-9223372036854775808,9223372036854775807");
    REQUIRE_OK(kvs_object_key_init(&k, hab, 1, "Qwen2.5-7B_x", 1, 2, "tenant-1.a"));
    check_path(&k, "Qwen2.5-7B_x+tenant-1.a/ab,1,2");
    REQUIRE_OK(kvs_object_key_init(&k, hab, 1, "caf\xc3\xa9", 0, 0, NULL));
    check_path(&k, "caf%C3%A9+/ab,0,0");

    /* A 65-byte hash puts its first 64 bytes in a directory of its own. */
    uint8_t h65[65];
    memset(h65, 0x11, sizeof h65);
    h65[64] = 0xfe;
    REQUIRE_OK(kvs_object_key_init(&k, h65, 65, "m", 0, 0, NULL));
    char expected[400];
    size_t n = (size_t)snprintf(expected, sizeof expected, "m+/");
    for (int i = 0; i < 128; i++) expected[n++] = '1';
    snprintf(expected + n, sizeof expected - n, ",/fe,0,0");
    check_path(&k, expected);
    /* 64 bytes still fit in the file name. */
    REQUIRE_OK(kvs_object_key_init(&k, h65, 64, "m", 0, 0, NULL));
    n = (size_t)snprintf(expected, sizeof expected, "m+/");
    for (int i = 0; i < 128; i++) expected[n++] = '1';
    snprintf(expected + n, sizeof expected - n, ",0,0");
    check_path(&k, expected);
}

/* A 255-byte model name is cut into components of at most 200 bytes, never
 * inside a %XX code, and a '.' at a component's start is escaped. */
static void test_key_path_long_names(void)
{
    kvs_object_key k;
    char model[256];
    memset(model, '.', 255);
    model[255] = '\0';
    REQUIRE_OK(kvs_object_key_init(&k, NULL, 0, model, 0, 0, NULL));
    char buf[KVS_FS_KEY_PATH_MAX];
    REQUIRE_OK(kvs_fs_key_path(&k, buf, sizeof buf));
    /* "%2E" + 197 dots fills 200, then "%2E" + the last 56 dots + "+". */
    char expected[600];
    size_t n = 0;
    n += (size_t)snprintf(expected + n, sizeof expected - n, "%%2E");
    memset(expected + n, '.', 197);
    n += 197;
    n += (size_t)snprintf(expected + n, sizeof expected - n, "/%%2E");
    memset(expected + n, '.', 56);
    n += 56;
    snprintf(expected + n, sizeof expected - n, "+/,0,0");
    CHECK_EQ_STR(buf, expected);

    /* The longest path of all, and the documented bound. */
    memset(model, 0xff, 255);
    char salt[129];
    memset(salt, '%', 128);
    salt[128] = '\0';
    uint8_t h[128];
    memset(h, 0xee, sizeof h);
    REQUIRE_OK(kvs_object_key_init(&k, h, 128, model, INT64_MIN, INT64_MAX, salt));
    REQUIRE_OK(kvs_fs_key_path(&k, buf, sizeof buf));
    CHECK_EQ_INT(strlen(buf), 1455);
    CHECK(strlen(buf) < KVS_FS_KEY_PATH_MAX);
    size_t comp = 0, ncomp = 1;
    for (const char *p = buf; *p; p++) {
        if (*p == '/') {
            CHECK(comp >= 1 && comp <= 200);
            comp = 0;
            ncomp++;
        } else {
            comp++;
        }
    }
    CHECK_EQ_INT(ncomp, 8); /* 6 for the names, 1 for the hash, the file */
    kvs_object_key back;
    CHECK_OK(kvs_fs_path_key(buf, &back));
    CHECK(kvs_object_key_equal(&back, &k));

    /* Buffer too small: refused with the size needed, buf emptied. */
    REQUIRE_OK(kvs_object_key_init(&k, NULL, 0, "", 0, 0, NULL));
    char small[6] = "xxxxx";
    CHECK_ERR(kvs_fs_key_path(&k, small, sizeof small), KVS_ENOSPC,
              "fs: key path needs 7 bytes, buffer holds 6");
    CHECK_EQ_STR(small, "");
    char exact[7];
    CHECK_OK(kvs_fs_key_path(&k, exact, sizeof exact));
    CHECK_EQ_STR(exact, "+/,0,0");
    CHECK_ERR(kvs_fs_key_path(NULL, buf, sizeof buf), KVS_EINVAL, "fs: key path: NULL key");
    CHECK_ERR(kvs_fs_key_path(&k, NULL, 0), KVS_EINVAL, "fs: key path: NULL buffer");
    kvs_object_key bad = k;
    bad.object_group_id = -2;
    CHECK_ERR(kvs_fs_key_path(&bad, buf, sizeof buf), KVS_EINVAL,
              "key: object group id -2 is negative");
}

static void test_path_key_refuses_non_canonical(void)
{
    static const char *const bad[] = {
        "", "/", "+", ",0,0", "a", "a/b", "+/,0", "+/,0,0,0", "+/,0,0/", "/+/,0,0",
        "+//,0,0", "+/,00,0", "+/,+0,0", "+/, 0,0", "+/,0,-1", "+/,0,01", "+/A,0,0",
        "+/a,0,0", "+/0g,0,0", "%2e+/,0,0", ".+/,0,0", "..+/,0,0", "a%2E+/,0,0",
        "a+b+/,0,0", "%00+/,0,0", "%4+/,0,0", "%+/,0,0", "a@+/,0,0", "%40+/,0,0",
        "+%2F/,0,0", "+/ab,/,0,0", "../+/,0,0", "+/../,0,0", "a /b+/,0,0",
        "+/,9223372036854775808,0", "+/,0,-0", "x+/.tmp-1", "+/,0,0.kv",
        "+/,0,0\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        kvs_object_key k;
        char msg[128];
        snprintf(msg, sizeof msg, "fs: not a key path: '%s'", bad[i]);
        int rc = kvs_fs_path_key(bad[i], &k);
        if (rc != KVS_EINVAL) fprintf(stderr, "accepted: '%s'\n", bad[i]);
        CHECK_EQ_INT(rc, KVS_EINVAL);
        CHECK_EQ_STR(kvs_last_error(), msg);
    }
    /* A hash directory must hold exactly 64 bytes and be followed by the rest. */
    CHECK_EQ_INT(kvs_fs_path_key("+/ab,/cd,0,0", &(kvs_object_key){0}), KVS_EINVAL);
    CHECK_ERR(kvs_fs_path_key(NULL, &(kvs_object_key){0}), KVS_EINVAL,
              "fs: path key: NULL argument");
    kvs_object_key k;
    CHECK_OK(kvs_fs_path_key("+/,0,0", &k));
    CHECK_OK(kvs_fs_path_key("%2E+%25/ff00,-12,34", &k));
    CHECK_EQ_STR(k.model_name, ".");
    CHECK_EQ_STR(k.cache_salt, "%");
    CHECK_EQ_INT(k.chunk_hash_len, 2);
    CHECK_EQ_INT(k.kv_rank, -12);
    CHECK_EQ_INT(k.object_group_id, 34);
}

/* Random keys from an alphabet chosen to provoke collisions. */
static const unsigned char nasty[] = {'a', 'A', '.', '%', '+', '/', ',', '2', 'E', 'F',
                                      '-', '_', '0', ' ', 0x80, 0xff, '\\', '~'};

static void random_string(char *s, size_t max, int is_salt)
{
    size_t len;
    switch (rnd() % 6) {
    case 0: len = 0; break;
    case 1: len = max; break;
    case 2: len = 1 + rnd() % 3; break;
    case 3: len = max - rnd() % 4; break;
    default: len = rnd() % (max + 1); break;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c;
        do c = rnd() % 2 ? nasty[rnd() % sizeof nasty] : (unsigned char)(1 + rnd() % 255);
        while (c == '@' || (is_salt && (c == '/' || c == '\\')));
        s[i] = (char)c;
    }
    s[len] = '\0';
}

static void random_key(kvs_object_key *k)
{
    static const size_t hash_lens[] = {0, 1, 4, 32, 63, 64, 65, 80, 127, 128};
    static const int64_t ranks[] = {0, 1, -1, 10, -10, INT64_MIN, INT64_MAX};
    uint8_t h[KVS_CHUNK_HASH_MAX];
    size_t hl = rnd() % 2 ? hash_lens[rnd() % 10] : rnd() % 129;
    for (size_t i = 0; i < hl; i++) h[i] = rnd() % 3 ? (uint8_t)rnd() : (uint8_t)(rnd() % 2 ? 0 : 0x2c);
    char model[KVS_MODEL_NAME_MAX + 1], salt[KVS_CACHE_SALT_MAX + 1];
    random_string(model, KVS_MODEL_NAME_MAX, 0);
    random_string(salt, KVS_CACHE_SALT_MAX, 1);
    int64_t rank = rnd() % 2 ? ranks[rnd() % 7] : (int64_t)rnd();
    int64_t group = rnd() % 2 ? (int64_t)(rnd() % 3) : (int64_t)(rnd() >> 1);
    if (kvs_object_key_init(k, h, hl, model, rank, group, salt) != KVS_OK) abort();
}

/* Change one field of k a little. */
static void mutate_one_field(kvs_object_key *k)
{
    size_t ml = strlen(k->model_name), sl = strlen(k->cache_salt);
    switch (rnd() % 8) {
    case 0:
        if (k->chunk_hash_len) k->chunk_hash[rnd() % k->chunk_hash_len] ^= (uint8_t)(1 + rnd() % 255);
        else k->chunk_hash[k->chunk_hash_len++] = 0;
        break;
    case 1:
        if (k->chunk_hash_len < KVS_CHUNK_HASH_MAX) k->chunk_hash[k->chunk_hash_len++] = 0;
        else k->chunk_hash_len--;
        break;
    case 2: k->kv_rank = k->kv_rank == INT64_MAX ? 0 : k->kv_rank + 1; break;
    case 3: k->object_group_id = k->object_group_id == INT64_MAX ? 0 : k->object_group_id + 1; break;
    case 4: /* move the model/salt boundary */
        if (ml > 0 && sl < KVS_CACHE_SALT_MAX && k->model_name[ml - 1] != '/' &&
            k->model_name[ml - 1] != '\\') {
            memmove(k->cache_salt + 1, k->cache_salt, sl + 1);
            k->cache_salt[0] = k->model_name[ml - 1];
            k->model_name[ml - 1] = '\0';
        } else if (ml < KVS_MODEL_NAME_MAX) {
            k->model_name[ml] = '.';
            k->model_name[ml + 1] = '\0';
        } else {
            k->model_name[ml - 1] = '\0';
        }
        break;
    case 5:
        if (ml < KVS_MODEL_NAME_MAX) {
            k->model_name[ml] = (char)nasty[rnd() % 4];
            k->model_name[ml + 1] = '\0';
        } else {
            k->model_name[0] ^= 1;
        }
        break;
    case 6:
        if (sl > 0) k->cache_salt[sl - 1] = '\0';
        else k->cache_salt[0] = '.', k->cache_salt[1] = '\0';
        break;
    default:
        if (ml > 0) k->model_name[rnd() % ml] = (char)(rnd() % 2 ? '.' : '%');
        else k->model_name[0] = '%', k->model_name[1] = '\0';
        break;
    }
}

typedef struct named {
    char *path;
    kvs_object_key key;
} named;

static int cmp_named(const void *a, const void *b)
{
    return strcmp(((const named *)a)->path, ((const named *)b)->path);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every path round-trips and is well formed; distinct keys never share a
 * path; no key's file is another key's directory; keys differing in one
 * field never collide. */
static void test_key_path_injective_fuzz(void)
{
    enum { N = 12000, MUTATIONS = 30000 };
    named *v = calloc(N, sizeof *v);
    char **dirs = calloc((size_t)N * 8, sizeof *dirs);
    REQUIRE(v && dirs);
    size_t ndirs = 0, bad_shape = 0, bad_roundtrip = 0;
    char buf[KVS_FS_KEY_PATH_MAX];
    for (size_t i = 0; i < N; i++) {
        random_key(&v[i].key);
        if (kvs_fs_key_path(&v[i].key, buf, sizeof buf) != KVS_OK) abort();
        v[i].path = strdup(buf);
        kvs_object_key back;
        if (kvs_fs_path_key(buf, &back) != KVS_OK || !kvs_object_key_equal(&back, &v[i].key))
            bad_roundtrip++;
        /* Shape: components 1..200 printable bytes, none starting with '.'. */
        size_t comp = 0;
        for (const char *p = buf;; p++) {
            if (*p == '/' || *p == '\0') {
                if (comp == 0 || comp > KVS_FS_COMPONENT_MAX || p[-(long)comp] == '.')
                    bad_shape++;
                if (*p == '\0') break;
                dirs[ndirs++] = strndup(buf, (size_t)(p - buf));
                comp = 0;
            } else {
                if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f) bad_shape++;
                comp++;
            }
        }
    }
    CHECK_EQ_INT(bad_shape, 0);
    CHECK_EQ_INT(bad_roundtrip, 0);

    qsort(v, N, sizeof *v, cmp_named);
    size_t collisions = 0;
    for (size_t i = 1; i < N; i++)
        if (strcmp(v[i - 1].path, v[i].path) == 0 &&
            !kvs_object_key_equal(&v[i - 1].key, &v[i].key))
            collisions++;
    CHECK_EQ_INT(collisions, 0);

    qsort(dirs, ndirs, sizeof *dirs, cmp_str);
    size_t file_is_dir = 0;
    for (size_t i = 0; i < N; i++)
        if (bsearch(&v[i].path, dirs, ndirs, sizeof *dirs, cmp_str)) file_is_dir++;
    CHECK_EQ_INT(file_is_dir, 0);

    size_t same_after_mutation = 0, mutated_roundtrip = 0;
    for (size_t m = 0; m < MUTATIONS; m++) {
        kvs_object_key a, b;
        random_key(&a);
        b = a;
        mutate_one_field(&b);
        if (kvs_object_key_validate(&b) != KVS_OK || kvs_object_key_equal(&a, &b)) continue;
        char pa[KVS_FS_KEY_PATH_MAX], pb[KVS_FS_KEY_PATH_MAX];
        if (kvs_fs_key_path(&a, pa, sizeof pa) || kvs_fs_key_path(&b, pb, sizeof pb)) abort();
        if (strcmp(pa, pb) == 0) same_after_mutation++;
        kvs_object_key back;
        if (kvs_fs_path_key(pb, &back) != KVS_OK || !kvs_object_key_equal(&back, &b))
            mutated_roundtrip++;
    }
    CHECK_EQ_INT(same_after_mutation, 0);
    CHECK_EQ_INT(mutated_roundtrip, 0);

    /* Random text never decodes unless it is canonical. */
    size_t fake = 0;
    for (size_t m = 0; m < 20000; m++) {
        char s[64];
        size_t len = rnd() % 20;
        static const char alpha[] = "+/,%0aA.-2E9f";
        for (size_t i = 0; i < len; i++) s[i] = alpha[rnd() % (sizeof alpha - 1)];
        s[len] = '\0';
        kvs_object_key k;
        if (kvs_fs_path_key(s, &k) == KVS_OK) {
            if (kvs_fs_key_path(&k, buf, sizeof buf) != KVS_OK || strcmp(buf, s) != 0) fake++;
        }
    }
    CHECK_EQ_INT(fake, 0);

    for (size_t i = 0; i < N; i++) free(v[i].path);
    for (size_t i = 0; i < ndirs; i++) free(dirs[i]);
    free(v);
    free(dirs);
}

/* ---------------------------------------------------------------------
 * The adapter
 * ------------------------------------------------------------------ */

static void test_store_lookup_load(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 0, 0, 0);
    REQUIRE(a != NULL);

    int fds[3] = {kvs_l2_store_event_fd(a), kvs_l2_lookup_event_fd(a), kvs_l2_load_event_fd(a)};
    CHECK(fds[0] >= 0 && fds[1] >= 0 && fds[2] >= 0);
    CHECK(fds[0] != fds[1] && fds[1] != fds[2] && fds[0] != fds[2]);
    for (int i = 0; i < 3; i++) {
        CHECK(fcntl(fds[i], F_GETFL) & O_NONBLOCK);
        CHECK(fcntl(fds[i], F_GETFD) & FD_CLOEXEC);
    }

    enum { N = 5 };
    kvs_object_key keys[N];
    kvs_memobj *src[N], *dst[N];
    for (uint32_t i = 0; i < N; i++) {
        int_key(&keys[i], i, "test_model");
        src[i] = make_obj(100 + i, i);
        dst[i] = make_obj(200, 99);
    }
    kvs_l2_task_id id;
    REQUIRE_OK(kvs_l2_submit_store(a, keys, src, N, &id));
    CHECK_EQ_U64(id, 0);
    REQUIRE(wait_fd(fds[0]));
    kvs_l2_store_result r[4];
    size_t count = 0;
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, 4, &count));
    REQUIRE(count == 1);
    CHECK_EQ_U64(r[0].id, 0);
    CHECK_EQ_INT(r[0].state, KVS_TASK_OK);
    CHECK_EQ_INT(r[0].status, KVS_OK);
    CHECK_EQ_U64(r[0].bytes_written, 100 + 101 + 102 + 103 + 104);
    CHECK_EQ_STR(r[0].message, "");
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, 4, &count));
    CHECK_EQ_INT(count, 0); /* popped once */

    /* On disk: one file per key, exactly the object's bytes. */
    for (int i = 0; i < N; i++) {
        char path[PATH_MAX];
        key_file(dir, &keys[i], path, sizeof path);
        CHECK_EQ_INT(file_size(path), 100 + i);
    }
    char path0[PATH_MAX];
    snprintf(path0, sizeof path0, "%s/test_model+/00000000,0,0", dir);
    CHECK_EQ_INT(file_size(path0), 100);

    kvs_object_key probe[N + 1];
    memcpy(probe, keys, sizeof keys);
    int_key(&probe[N], 1000, "test_model");
    kvs_l2_bitmap bm;
    kvs_l2_task_id lid;
    REQUIRE_OK(bitmap_wait(a, 0, probe, NULL, N + 1, &bm, &lid));
    CHECK_EQ_U64(lid, 1);
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.nkeys, N + 1);
    CHECK_EQ_INT(bm.nhits, N);
    CHECK_EQ_INT(bm.hits[N], 0);
    CHECK_EQ_INT(bm.status, KVS_OK); /* a miss is no error */
    kvs_l2_bitmap_release(&bm);
    CHECK_OK(kvs_l2_query_lookup_and_lock(a, lid, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_PENDING); /* answered once */
    CHECK_OK(kvs_l2_unlock(a, keys, N));

    kvs_l2_task_id did;
    REQUIRE_OK(bitmap_wait(a, 1, keys, dst, N, &bm, &did));
    CHECK_EQ_U64(did, 2);
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.nhits, N);
    CHECK_EQ_INT(bm.status, KVS_OK);
    kvs_l2_bitmap_release(&bm);
    for (int i = 0; i < N; i++) {
        CHECK_EQ_INT(kvs_memobj_size(dst[i]), 100 + i);
        CHECK(same_bytes(src[i], dst[i]));
    }
    CHECK_OK(kvs_l2_query_load(a, did, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_PENDING);
    CHECK_OK(kvs_l2_query_load(a, 12345, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_PENDING);

    int64_t sizes[N + 1];
    CHECK_OK(kvs_l2_object_sizes(a, probe, N + 1, sizes));
    for (int i = 0; i < N; i++) CHECK_EQ_INT(sizes[i], 100 + i);
    CHECK_EQ_INT(sizes[N], -1);

    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 510);
    CHECK_EQ_U64(u.capacity, 0);

    json_t *st = NULL;
    CHECK_OK(kvs_l2_status(a, &st));
    REQUIRE(st != NULL);
    CHECK_EQ_STR(json_string_value(json_object_get(st, "type")), "fs");
    CHECK_EQ_STR(json_string_value(json_object_get(st, "path")), dir);
    CHECK(json_is_true(json_object_get(st, "is_healthy")));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "keys")), N);
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "bytes_used")), 510);
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "locked_keys")), 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "workers")), 2);
    CHECK(json_is_true(json_object_get(st, "fsync")));
    json_decref(st);

    /* Replacing a key replaces its file and its bytes in the usage. */
    kvs_memobj *big = make_obj(150, 7);
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, keys, &big, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.id, 3);
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 560);
    REQUIRE_OK(load_wait(a, keys, dst, 1, &bm));
    CHECK(same_bytes(big, dst[0]));
    kvs_l2_bitmap_release(&bm);

    walk(dir);
    CHECK_EQ_INT(walk_regular, N);
    CHECK_EQ_INT(walk_tmp, 0);

    kvs_l2_destroy(a);
    kvs_memobj_free(big);
    for (int i = 0; i < N; i++) {
        kvs_memobj_free(src[i]);
        kvs_memobj_free(dst[i]);
    }
    rm_rf(dir);
}

/* Only used_size bytes are stored: a 16-byte object narrowed to 8 makes an
 * 8-byte file; a 0-byte object an empty one (upstream's tests 72 and 73). */
static void test_stores_used_size_only(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 1, 0, 0);
    REQUIRE(a != NULL);
    kvs_object_key k[2];
    int_key(&k[0], 1, "m");
    int_key(&k[1], 2, "m");
    kvs_memobj *o16 = make_obj(16, 0), *o0 = make_obj(16, 1);
    for (int i = 0; i < 16; i++) ((uint8_t *)o16->data)[i] = (uint8_t)i;
    REQUIRE_OK(kvs_memobj_set_used_size(o16, 8));
    REQUIRE_OK(kvs_memobj_set_used_size(o0, 0));
    kvs_memobj *objs[2] = {o16, o0};
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, k, objs, 2, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_EQ_U64(res.bytes_written, 8);
    char p[PATH_MAX];
    key_file(dir, &k[0], p, sizeof p);
    CHECK_EQ_INT(file_size(p), 8);
    key_file(dir, &k[1], p, sizeof p);
    CHECK_EQ_INT(file_size(p), 0);
    int64_t sizes[2];
    CHECK_OK(kvs_l2_object_sizes(a, k, 2, sizes));
    CHECK_EQ_INT(sizes[0], 8);
    CHECK_EQ_INT(sizes[1], 0);

    kvs_memobj *d0 = make_obj(16, 5), *d1 = make_obj(16, 6);
    memset(d0->data, 0, 16);
    kvs_memobj *dst[2] = {d0, d1};
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_wait(a, k, dst, 2, &bm));
    CHECK_EQ_INT(bm.nhits, 2);
    kvs_l2_bitmap_release(&bm);
    CHECK_EQ_INT(kvs_memobj_size(d0), 8);
    CHECK_EQ_INT(kvs_memobj_size(d1), 0);
    for (int i = 0; i < 16; i++) CHECK_EQ_INT(((uint8_t *)d0->data)[i], i < 8 ? i : 0);

    /* An empty batch completes at once, succeeds and signals. */
    kvs_l2_task_id id;
    CHECK_OK(kvs_l2_submit_store(a, NULL, NULL, 0, &id));
    CHECK(wait_fd(kvs_l2_store_event_fd(a)));
    size_t count;
    kvs_l2_store_result r;
    CHECK_OK(kvs_l2_pop_completed_stores(a, &r, 1, &count));
    CHECK_EQ_INT(count, 1);
    CHECK_EQ_U64(r.id, id);
    CHECK_EQ_INT(r.state, KVS_TASK_OK);
    CHECK_EQ_U64(r.bytes_written, 0);
    REQUIRE_OK(lookup_wait(a, NULL, 0, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.nkeys, 0);
    kvs_l2_bitmap_release(&bm);
    REQUIRE_OK(load_wait(a, NULL, NULL, 0, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    kvs_l2_bitmap_release(&bm);

    kvs_l2_destroy(a);
    kvs_memobj_free(o16);
    kvs_memobj_free(o0);
    kvs_memobj_free(d0);
    kvs_memobj_free(d1);
    rm_rf(dir);
}

/* A second adapter on the same directory finds what the first stored, with
 * the first still open and after it is gone. */
static void test_reopen_finds_objects(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 2, 0, 0);
    REQUIRE(a != NULL);
    enum { N = 6 };
    kvs_object_key keys[N];
    kvs_memobj *src[N], *dst[N];
    for (uint32_t i = 0; i < N; i++) {
        uint8_t h[80];
        memset(h, (int)i, sizeof h);
        REQUIRE_OK(kvs_object_key_init(&keys[i], h, i % 2 ? 80 : 8, "meta-llama/Llama-3-8B",
                                       (int64_t)i - 2, i, i % 3 ? "salt" : NULL));
        src[i] = make_obj(64 * (i + 1), i);
        dst[i] = make_obj(1024, 0);
    }
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, keys, src, N, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);

    kvs_l2_adapter *b = open_fs(dir, 3, 0, 1);
    REQUIRE(b != NULL);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(b, &u));
    CHECK_EQ_U64(u.bytes_used, 64 * (1 + 2 + 3 + 4 + 5 + 6));
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_wait(b, keys, dst, N, &bm));
    CHECK_EQ_INT(bm.nhits, N);
    kvs_l2_bitmap_release(&bm);
    for (int i = 0; i < N; i++) CHECK(same_bytes(src[i], dst[i]));
    /* Ids are per adapter. */
    kvs_l2_task_id id;
    REQUIRE_OK(kvs_l2_submit_lookup_and_lock(b, keys, 1, &id));
    CHECK_EQ_U64(id, 1);
    /* Distinct fds across adapters. */
    CHECK(kvs_l2_store_event_fd(a) != kvs_l2_store_event_fd(b));
    kvs_l2_destroy(b);
    kvs_l2_destroy(a);

    kvs_l2_adapter *c = open_fs(dir, 1, 0, 0);
    REQUIRE(c != NULL);
    json_t *st;
    CHECK_OK(kvs_l2_status(c, &st));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "keys")), N);
    json_decref(st);
    for (int i = 0; i < N; i++) memset(dst[i]->data, 0, 1024);
    REQUIRE_OK(load_wait(c, keys, dst, N, &bm));
    CHECK_EQ_INT(bm.nhits, N);
    kvs_l2_bitmap_release(&bm);
    for (int i = 0; i < N; i++) CHECK(same_bytes(src[i], dst[i]));
    kvs_l2_destroy(c);
    for (int i = 0; i < N; i++) {
        kvs_memobj_free(src[i]);
        kvs_memobj_free(dst[i]);
    }
    rm_rf(dir);
}

/* Keys that try to escape the directory or collide are stored and loaded
 * back distinctly, and every file is inside the directory. */
static void test_hostile_keys(void)
{
    char parent[64], dir[128];
    make_tmpdir(parent, sizeof parent);
    snprintf(dir, sizeof dir, "%s/store", parent);
    kvs_l2_adapter *a = open_fs(dir, 4, 0, 1);
    REQUIRE(a != NULL);

    char long_model[256], long_model2[256], salt128[129], salt128b[129];
    for (int i = 0; i < 255; i++) long_model[i] = (char)("./%+xA\xff"[i % 7]);
    long_model[255] = '\0';
    memcpy(long_model2, long_model, 256);
    long_model2[254] = 'B';
    memset(salt128, '.', 128);
    salt128[128] = '\0';
    memset(salt128b, '%', 128);
    salt128b[128] = '\0';
    struct {
        const char *model, *salt;
        size_t hlen;
        int64_t rank, group;
    } spec[] = {
        {"meta-llama/Llama-3-8B", "", 4, 0, 0},
        {"meta-llama%2FLlama-3-8B", "", 4, 0, 0},
        {"meta-llama", "Llama-3-8B", 4, 0, 0},
        {"..", "", 4, 0, 0},
        {".", "", 4, 0, 0},
        {"", "", 4, 0, 0},
        {"", "..", 4, 0, 0},
        {"../../etc", "", 4, 0, 0},
        {"a/../../b", "", 4, 0, 0},
        {"/abs/path", "", 4, 0, 0},
        {"x+", "", 4, 0, 0},
        {"x", "+", 4, 0, 0},
        {"x,0,0", "", 4, 0, 0},
        {".tmp-1", "", 4, 0, 0},
        {long_model, "", 4, 0, 0},
        {long_model2, "", 4, 0, 0},
        {long_model, salt128, 4, 0, 0},
        {long_model, salt128b, 128, -1, 1},
        {"m", salt128, 0, 0, 0},
        {"m", salt128b, 0, 0, 0},
        {"m", "", 0, 0, 0},
        {"m", "", 128, 0, 0},
        {"m", "", 64, 0, 0},
        {"m", "", 65, 0, 0},
        {"m", "", 4, -1, 0},
        {"m", "", 4, 1, 0},
        {"m", "", 4, 0, 1},
        {"m", "", 4, INT64_MIN, INT64_MAX},
    };
    enum { N = sizeof spec / sizeof spec[0] };
    kvs_object_key keys[N];
    kvs_memobj *src[N], *dst[N];
    for (size_t i = 0; i < N; i++) {
        uint8_t h[128];
        memset(h, 0x5a, sizeof h);
        REQUIRE_OK(kvs_object_key_init(&keys[i], h, spec[i].hlen, spec[i].model,
                                       spec[i].rank, spec[i].group, spec[i].salt));
        src[i] = make_obj(10 + i, (unsigned)i);
        dst[i] = make_obj(64, 0);
    }
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, keys, src, N, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    if (res.state != KVS_TASK_OK) fprintf(stderr, "%s\n", res.message);
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_wait(a, keys, dst, N, &bm));
    CHECK_EQ_INT(bm.nhits, N);
    kvs_l2_bitmap_release(&bm);
    for (size_t i = 0; i < N; i++) CHECK(same_bytes(src[i], dst[i]));

    walk(dir);
    CHECK_EQ_INT(walk_regular, N);
    CHECK_EQ_INT(walk_outside, 0);
    CHECK_EQ_INT(walk_tmp, 0);
    CHECK_EQ_INT(walk_symlinks, 0);
    CHECK_EQ_INT(walk_undecodable, 0);
    /* Nothing next to the store directory. */
    walk(parent);
    CHECK_EQ_INT(walk_regular, N + 1); /* and the store's marker, one level down */
    /* Every path resolves strictly below the directory. */
    char real_dir[PATH_MAX];
    REQUIRE(realpath(dir, real_dir) != NULL);
    for (size_t i = 0; i < N; i++) {
        char p[PATH_MAX], real[PATH_MAX];
        key_file(dir, &keys[i], p, sizeof p);
        REQUIRE(realpath(p, real) != NULL);
        size_t rl = strlen(real_dir);
        CHECK(strncmp(real, real_dir, rl) == 0 && real[rl] == '/');
    }
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 10 * N + N * (N - 1) / 2);

    kvs_l2_destroy(a);
    for (size_t i = 0; i < N; i++) {
        kvs_memobj_free(src[i]);
        kvs_memobj_free(dst[i]);
    }
    rm_rf(parent);
}

/* The read hook: change the file under the reader. */
static const char *hook_path;
static int hook_mode; /* 1: truncate to 4 bytes, 2: append 5 bytes */

static void change_file(void *arg, int fd, size_t index)
{
    (void)arg;
    (void)fd;
    if (index != 0) return;
    int w = open(hook_path, O_WRONLY | O_APPEND);
    if (w < 0) abort();
    if (hook_mode == 1 && ftruncate(w, 4) != 0) abort();
    if (hook_mode == 2 && write(w, "extra", 5) != 5) abort();
    close(w);
}

/* A damaged or foreign file fails only its key's load, with its message. */
static void test_bad_files_fail_only_their_key(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 2, 0, 0);
    REQUIRE(a != NULL);
    enum { N = 4 };
    kvs_object_key keys[N];
    kvs_memobj *src[N], *dst[N];
    for (uint32_t i = 0; i < N; i++) {
        int_key(&keys[i], i, "m");
        src[i] = make_obj(16, i);
        dst[i] = make_obj(16, 100);
    }
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, keys, src, N, &res));
    REQUIRE(res.state == KVS_TASK_OK);
    char p[N][PATH_MAX];
    for (int i = 0; i < N; i++) key_file(dir, &keys[i], p[i], sizeof p[i]);

    /* Key 1 larger than its destination, key 2 a directory, key 3 gone. */
    uint8_t big[32] = {0};
    write_file(p[1], big, sizeof big);
    REQUIRE(unlink(p[2]) == 0 && mkdir(p[2], 0755) == 0);
    REQUIRE(unlink(p[3]) == 0);
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_wait(a, keys, dst, N, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.nhits, 1);
    CHECK_EQ_INT(bm.hits[0], 1);
    CHECK_EQ_INT(bm.hits[1], 0);
    CHECK_EQ_INT(bm.hits[2], 0);
    CHECK_EQ_INT(bm.hits[3], 0);
    CHECK(same_bytes(src[0], dst[0]));
    char msg[PATH_MAX + 512];
    snprintf(msg, sizeof msg,
             "fs: load of key 1: stored object is 32 bytes, destination holds 16 (%s)", p[1]);
    CHECK_EQ_INT(bm.status, KVS_ENOSPC);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);

    /* Each failure alone, with its own message. */
    REQUIRE_OK(load_wait(a, &keys[2], &dst[2], 1, &bm));
    snprintf(msg, sizeof msg, "fs: load of key 0: not a regular file (%s)", p[2]);
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);
    REQUIRE_OK(load_wait(a, &keys[3], &dst[3], 1, &bm));
    snprintf(msg, sizeof msg, "fs: load of key 0: not found (%s)", p[3]);
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK_EQ_INT(bm.status, KVS_ENOTFOUND);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);
    /* A lookup sees the directory as not stored. */
    REQUIRE_OK(lookup_wait(a, &keys[2], 1, &bm));
    CHECK_EQ_INT(bm.nhits, 0);
    snprintf(msg, sizeof msg, "fs: lookup of key 0: not a regular file (%s)", p[2]);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);

    /* A symlink and a FIFO at a key's path: refused, nothing hangs. */
    REQUIRE(rmdir(p[2]) == 0 && symlink("/etc/hostname", p[2]) == 0);
    REQUIRE(mkfifo(p[3], 0644) == 0);
    REQUIRE_OK(load_wait(a, &keys[2], &dst[2], 2, &bm));
    CHECK_EQ_INT(bm.nhits, 0);
    snprintf(msg, sizeof msg, "fs: load of key 0: open: %s (%s)", strerror(ELOOP), p[2]);
    CHECK_EQ_INT(bm.status, KVS_EIO);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);
    REQUIRE_OK(load_wait(a, &keys[3], &dst[3], 1, &bm));
    snprintf(msg, sizeof msg, "fs: load of key 0: not a regular file (%s)", p[3]);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);
    int64_t sizes[N];
    CHECK_OK(kvs_l2_object_sizes(a, keys, N, sizes));
    CHECK_EQ_INT(sizes[0], 16);
    CHECK_EQ_INT(sizes[1], 32);
    CHECK_EQ_INT(sizes[2], -1);
    CHECK_EQ_INT(sizes[3], -1);

    /* A file that shrinks or grows while it is read. */
    hook_path = p[0];
    kvs_fs_adapter_set_read_hook(a, change_file, NULL);
    hook_mode = 1;
    REQUIRE_OK(load_wait(a, keys, dst, 1, &bm));
    snprintf(msg, sizeof msg, "fs: load of key 0: file shrank while reading: 4 of 16 bytes (%s)",
             p[0]);
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);
    REQUIRE_OK(store_wait(a, keys, src, 1, &res));
    hook_mode = 2;
    REQUIRE_OK(load_wait(a, keys, dst, 1, &bm));
    snprintf(msg, sizeof msg,
             "fs: load of key 0: file grew while reading: more than 16 bytes (%s)", p[0]);
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);
    kvs_fs_adapter_set_read_hook(a, NULL, NULL);

    /* Truncated between loads: with no header it is a shorter object. */
    REQUIRE(truncate(p[0], 5) == 0);
    REQUIRE_OK(load_wait(a, keys, dst, 1, &bm));
    CHECK_EQ_INT(bm.nhits, 1);
    CHECK_EQ_INT(kvs_memobj_size(dst[0]), 5);
    CHECK(memcmp(dst[0]->data, src[0]->data, 5) == 0);
    kvs_l2_bitmap_release(&bm);

    kvs_l2_destroy(a);
    for (int i = 0; i < N; i++) {
        kvs_memobj_free(src[i]);
        kvs_memobj_free(dst[i]);
    }
    rm_rf(dir);
}

/* Store failures: exact code and message, no temporary file left. */
static void test_store_failures(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 1, 0, 0);
    REQUIRE(a != NULL);
    kvs_object_key k[3];
    int_key(&k[0], 1, "blocked");
    int_key(&k[1], 2, "m");
    int_key(&k[2], 3, "m");
    kvs_memobj *o = make_obj(8, 1);
    kvs_memobj *objs[3] = {o, o, o};

    /* The model directory's name is taken by a file. */
    char p[PATH_MAX], msg[PATH_MAX + 512];
    snprintf(p, sizeof p, "%s/blocked+", dir);
    write_file(p, "x", 1);
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, k, objs, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(res.status, KVS_EIO);
    CHECK_EQ_U64(res.bytes_written, 0);
    snprintf(msg, sizeof msg, "fs: store of key 0: open: %s (%s/blocked+/00000001,0,0)",
             strerror(ENOTDIR), dir);
    CHECK_EQ_STR(res.message, msg);

    /* The key's path is a directory: rename refuses, the temp goes. */
    key_file(dir, &k[2], p, sizeof p);
    snprintf(msg, sizeof msg, "%s/m+", dir);
    REQUIRE(mkdir(msg, 0755) == 0 && mkdir(p, 0755) == 0);
    REQUIRE_OK(store_wait(a, &k[1], &objs[1], 2, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(res.status, KVS_EIO);
    snprintf(msg, sizeof msg, "fs: store of key 1: rename: %s (%s)", strerror(EISDIR), p);
    CHECK_EQ_STR(res.message, msg);
    int64_t sizes[3];
    CHECK_OK(kvs_l2_object_sizes(a, k, 3, sizes));
    CHECK_EQ_INT(sizes[0], -1);
    CHECK_EQ_INT(sizes[1], 8); /* the key before the failure stays stored */
    CHECK_EQ_INT(sizes[2], -1);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 8);
    walk(dir);
    CHECK_EQ_INT(walk_tmp, 0);
    CHECK_EQ_INT(walk_regular, 2); /* "blocked+" and key 1 */

    kvs_l2_destroy(a);
    kvs_memobj_free(o);
    rm_rf(dir);
}

/* Crash leftovers: files named exactly like the adapter's temporary files
 * (".tmp-kvs-" and 32 hex digits) are removed at open, unless a writer
 * still holds one; other files, even ".tmp-*" ones, are left alone and not
 * counted. */
#define TMP1 ".tmp-kvs-0123456789abcdef0000000000000001"
#define TMP2 ".tmp-kvs-0123456789abcdef0000000000000002"
#define TMP3 ".tmp-kvs-0123456789abcdef0000000000000003"

static void test_temp_files_cleaned_at_open(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 2, 0, 1);
    REQUIRE(a != NULL);
    CHECK(store_int_key(a, 9, "model/x", 12));
    kvs_l2_destroy(a);
    kvs_memobj *o = make_obj(12, 3);
    kvs_l2_store_result res;

    char p[PATH_MAX], held[PATH_MAX];
    snprintf(p, sizeof p, "%s/" TMP1, dir);
    write_file(p, "partial", 7);
    snprintf(p, sizeof p, "%s/model%%2Fx+/" TMP2, dir);
    write_file(p, "partial", 7);
    snprintf(p, sizeof p, "%s/model%%2Fx+/.tmp-crash-2", dir);
    write_file(p, "foreign", 7);
    snprintf(held, sizeof held, "%s/model%%2Fx+/" TMP3, dir);
    write_file(held, "in use", 6);
    int hfd = open(held, O_RDONLY);
    REQUIRE(hfd >= 0 && flock(hfd, LOCK_EX) == 0);
    snprintf(p, sizeof p, "%s/.keep", dir);
    write_file(p, "", 0);
    snprintf(p, sizeof p, "%s/README", dir);
    write_file(p, "not an object", 13);
    snprintf(p, sizeof p, "%s/.tmp-dir", dir);
    REQUIRE(mkdir(p, 0755) == 0);

    a = open_fs(dir, 2, 0, 1);
    REQUIRE(a != NULL);
    walk(dir);
    CHECK_EQ_INT(walk_tmp, 3); /* the held file, the foreign one, the directory */
    snprintf(p, sizeof p, "%s/" TMP1, dir);
    CHECK_EQ_INT(file_size(p), -1);
    snprintf(p, sizeof p, "%s/model%%2Fx+/" TMP2, dir);
    CHECK_EQ_INT(file_size(p), -1);
    snprintf(p, sizeof p, "%s/model%%2Fx+/.tmp-crash-2", dir);
    CHECK_EQ_INT(file_size(p), 7);
    CHECK_EQ_INT(file_size(held), 6);
    snprintf(p, sizeof p, "%s/README", dir);
    CHECK_EQ_INT(file_size(p), 13);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 12); /* only the object */
    json_t *st;
    CHECK_OK(kvs_l2_status(a, &st));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "keys")), 1);
    json_decref(st);
    close(hfd);

    /* Many stores leave no temporary file behind. */
    enum { N = 40 };
    kvs_object_key keys[N];
    kvs_memobj *objs[N];
    for (uint32_t i = 0; i < N; i++) {
        int_key(&keys[i], i, i % 2 ? "a" : "b");
        objs[i] = o;
    }
    for (int round = 0; round < 3; round++) {
        REQUIRE_OK(store_wait(a, keys, objs, N, &res));
        CHECK_EQ_INT(res.state, KVS_TASK_OK);
    }
    walk(dir);
    CHECK_EQ_INT(walk_tmp, 3);
    CHECK_EQ_INT(walk_regular, N + 1 + 4); /* + model/x, held, foreign, README, .keep */
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
    rm_rf(dir);
}

static void test_capacity(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 1, 100, 0);
    REQUIRE(a != NULL);
    kvs_object_key k[3];
    for (uint32_t i = 0; i < 3; i++) int_key(&k[i], i, "m");
    kvs_memobj *o60 = make_obj(60, 1), *o50 = make_obj(50, 2), *o90 = make_obj(90, 3),
               *o40 = make_obj(40, 4);
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, &k[0], &o60, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    REQUIRE_OK(store_wait(a, &k[1], &o50, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(res.status, KVS_ENOSPC);
    char p[PATH_MAX], msg[PATH_MAX + 512];
    key_file(dir, &k[1], p, sizeof p);
    snprintf(msg, sizeof msg,
             "fs: capacity exceeded storing key 0: 50 bytes would make 110 bytes used, "
             "capacity 100 (%s)",
             p);
    CHECK_EQ_STR(res.message, msg);
    CHECK_EQ_INT(file_size(p), -1);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 60);
    CHECK_EQ_U64(u.capacity, 100);
    /* Exactly full is fine; replacing counts the old size out. */
    REQUIRE_OK(store_wait(a, &k[1], &o40, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    REQUIRE_OK(store_wait(a, &k[0], &o60, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 100);
    uint8_t deleted[3];
    CHECK_OK(kvs_l2_delete(a, k, 3, deleted));
    CHECK_EQ_INT(deleted[0], 1);
    CHECK_EQ_INT(deleted[1], 1);
    CHECK_EQ_INT(deleted[2], 0);
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 0);
    REQUIRE_OK(store_wait(a, &k[2], &o90, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    walk(dir);
    CHECK_EQ_INT(walk_tmp, 0);
    kvs_l2_destroy(a);

    /* Reopened with a smaller capacity: the count comes from the scan. */
    a = open_fs(dir, 1, 95, 0);
    REQUIRE(a != NULL);
    REQUIRE_OK(store_wait(a, &k[0], &o40, 1, &res));
    CHECK_EQ_INT(res.status, KVS_ENOSPC);
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 90);
    kvs_l2_destroy(a);
    kvs_memobj_free(o60);
    kvs_memobj_free(o50);
    kvs_memobj_free(o90);
    kvs_memobj_free(o40);
    rm_rf(dir);
}

static void test_locks_and_delete(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 2, 0, 1);
    REQUIRE(a != NULL);
    kvs_object_key k[2];
    int_key(&k[0], 1, "m");
    int_key(&k[1], 2, "m");
    kvs_memobj *o = make_obj(10, 1);
    kvs_memobj *objs[2] = {o, o};
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, k, objs, 2, &res));
    kvs_l2_bitmap bm;
    REQUIRE_OK(lookup_wait(a, k, 1, &bm));
    CHECK_EQ_INT(bm.nhits, 1);
    kvs_l2_bitmap_release(&bm);
    REQUIRE_OK(lookup_wait(a, k, 1, &bm)); /* locked twice */
    kvs_l2_bitmap_release(&bm);
    json_t *st;
    CHECK_OK(kvs_l2_status(a, &st));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "locked_keys")), 1);
    json_decref(st);

    uint8_t deleted[2] = {9, 9};
    CHECK_OK(kvs_l2_delete(a, k, 2, deleted));
    CHECK_EQ_INT(deleted[0], 0); /* locked: kept */
    CHECK_EQ_INT(deleted[1], 1);
    char p[PATH_MAX];
    key_file(dir, &k[0], p, sizeof p);
    CHECK_EQ_INT(file_size(p), 10);
    CHECK_OK(kvs_l2_unlock(a, k, 1));
    CHECK_OK(kvs_l2_delete(a, k, 1, deleted));
    CHECK_EQ_INT(deleted[0], 0); /* one lock left */
    CHECK_OK(kvs_l2_unlock(a, k, 2)); /* key 1 was never locked: ignored */
    CHECK_OK(kvs_l2_unlock(a, k, 1)); /* more unlocks than locks: ignored */
    /* Replacing a locked key is allowed and keeps it locked. */
    REQUIRE_OK(lookup_wait(a, k, 1, &bm));
    kvs_l2_bitmap_release(&bm);
    REQUIRE_OK(store_wait(a, k, objs, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    CHECK_OK(kvs_l2_delete(a, k, 1, deleted));
    CHECK_EQ_INT(deleted[0], 0);
    CHECK_OK(kvs_l2_unlock(a, k, 1));
    CHECK_OK(kvs_l2_delete(a, k, 2, NULL));
    CHECK_EQ_INT(file_size(p), -1);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 0);
    CHECK_OK(kvs_l2_delete(a, k, 2, deleted)); /* absent: not deleted, no error */
    CHECK_EQ_INT(deleted[0], 0);
    CHECK_EQ_INT(deleted[1], 0);
    REQUIRE_OK(lookup_wait(a, k, 2, &bm));
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK_EQ_INT(bm.status, KVS_OK);
    kvs_l2_bitmap_release(&bm);

    /* Locks are per adapter: another one on the directory may delete. */
    REQUIRE_OK(store_wait(a, k, objs, 1, &res));
    REQUIRE_OK(lookup_wait(a, k, 1, &bm));
    kvs_l2_bitmap_release(&bm);
    kvs_l2_adapter *b = open_fs(dir, 1, 0, 1);
    REQUIRE(b != NULL);
    CHECK_OK(kvs_l2_delete(b, k, 1, deleted));
    CHECK_EQ_INT(deleted[0], 1);
    kvs_l2_destroy(b);

    /* A file that cannot be removed: EIO after trying the other keys. */
    REQUIRE_OK(store_wait(a, k, objs, 2, &res));
    char d[PATH_MAX];
    snprintf(d, sizeof d, "%s/m+", dir);
    REQUIRE(chmod(d, 0555) == 0);
    if (geteuid() != 0) { /* root ignores the mode */
        char msg[PATH_MAX + 512];
        snprintf(msg, sizeof msg, "fs: delete of key 0: unlink: %s (%s)", strerror(EACCES),
                 p);
        CHECK_ERR(kvs_l2_delete(a, k, 2, deleted), KVS_EIO, msg);
        CHECK_EQ_INT(deleted[0], 0);
        CHECK_EQ_INT(deleted[1], 0);
    }
    REQUIRE(chmod(d, 0755) == 0);

    kvs_l2_destroy(a);
    kvs_memobj_free(o);
    rm_rf(dir);
}

static void test_fsync_on_and_off(void)
{
    for (int no_fsync = 0; no_fsync < 2; no_fsync++) {
        char dir[64];
        make_tmpdir(dir, sizeof dir);
        kvs_l2_adapter *a = open_fs(dir, 2, 0, no_fsync);
        REQUIRE(a != NULL);
        json_t *st;
        CHECK_OK(kvs_l2_status(a, &st));
        CHECK_EQ_INT(json_is_true(json_object_get(st, "fsync")), !no_fsync);
        json_decref(st);
        enum { N = 8 };
        kvs_object_key keys[N];
        kvs_memobj *src[N], *dst[N];
        for (uint32_t i = 0; i < N; i++) {
            uint8_t h[70];
            memset(h, (int)i, sizeof h);
            REQUIRE_OK(kvs_object_key_init(&keys[i], h, 70, i % 2 ? "x/y" : "z", 0, 0, NULL));
            src[i] = make_obj(1000 + i, i);
            dst[i] = make_obj(2000, 0);
        }
        kvs_l2_store_result res;
        REQUIRE_OK(store_wait(a, keys, src, N, &res));
        CHECK_EQ_INT(res.state, KVS_TASK_OK);
        kvs_l2_bitmap bm;
        REQUIRE_OK(load_wait(a, keys, dst, N, &bm));
        CHECK_EQ_INT(bm.nhits, N);
        kvs_l2_bitmap_release(&bm);
        for (int i = 0; i < N; i++) CHECK(same_bytes(src[i], dst[i]));
        kvs_l2_destroy(a);
        for (int i = 0; i < N; i++) {
            kvs_memobj_free(src[i]);
            kvs_memobj_free(dst[i]);
        }
        rm_rf(dir);
    }
}

static void test_create_and_factory_refusals(void)
{
    char dir[64], p[PATH_MAX], msg[PATH_MAX + 512];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = (kvs_l2_adapter *)&a;
    kvs_fs_options o = {0};
    CHECK_ERR(kvs_fs_adapter_create(&o, NULL), KVS_EINVAL, "fs: output pointer is NULL");
    CHECK_ERR(kvs_fs_adapter_create(NULL, &a), KVS_EINVAL, "fs: options are NULL");
    CHECK(a == NULL);
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EINVAL, "fs: path is empty");
    o.path = "";
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EINVAL, "fs: path is empty");
    o.path = dir;
    o.workers = 2000;
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EINVAL, "fs: workers 2000 out of range [1, 1024]");
    o.workers = 0;
    snprintf(p, sizeof p, "%s/missing", dir);
    o.path = p;
    o.no_create = 1;
    snprintf(msg, sizeof msg, "fs: cannot open directory '%s': %s", p, strerror(ENOENT));
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_ENOTFOUND, msg);
    snprintf(p, sizeof p, "%s/file", dir);
    write_file(p, "x", 1);
    snprintf(msg, sizeof msg, "fs: cannot open directory '%s': %s", p, strerror(ENOTDIR));
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EIO, msg);
    o.no_create = 0;
    snprintf(p, sizeof p, "%s/file/sub", dir);
    snprintf(msg, sizeof msg, "fs: cannot create directory '%s': %s", p, strerror(ENOTDIR));
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EIO, msg);

    /* mkdir -p, trailing slashes dropped from the reported path. */
    snprintf(p, sizeof p, "%s/a/b/c//", dir);
    REQUIRE_OK(kvs_fs_adapter_create(&o, &a));
    json_t *st;
    CHECK_OK(kvs_l2_status(a, &st));
    snprintf(p, sizeof p, "%s/a/b/c", dir);
    CHECK_EQ_STR(json_string_value(json_object_get(st, "path")), p);
    json_decref(st);
    kvs_l2_destroy(a);

    /* The registry's factory, through kvs_l2_create. */
    char spec[512];
    snprintf(spec, sizeof spec,
             "{\"type\": \"fs\", \"path\": \"%s/j\", \"fsync\": false, \"capacity_bytes\": 64, "
             "\"workers\": 3, \"create\": true}",
             dir);
    REQUIRE_OK(kvs_l2_create(spec, &a));
    CHECK_OK(kvs_l2_status(a, &st));
    CHECK_EQ_STR(json_string_value(json_object_get(st, "type")), "fs");
    CHECK(json_is_false(json_object_get(st, "fsync")));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "capacity_bytes")), 64);
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "workers")), 3);
    json_decref(st);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.capacity, 64);
    kvs_l2_destroy(a);
    snprintf(spec, sizeof spec, "{\"type\": \"fs\", \"path\": \"%s/j\"}", dir);
    REQUIRE_OK(kvs_l2_create(spec, &a));
    CHECK_OK(kvs_l2_status(a, &st));
    CHECK(json_is_true(json_object_get(st, "fsync")));
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "workers")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "capacity_bytes")), 0);
    json_decref(st);
    kvs_l2_destroy(a);

    struct {
        const char *spec;
        int code;
        const char *msg;
    } bad[] = {
        {"{\"type\": \"fs\"}", KVS_EINVAL, "fs: missing 'path'"},
        {"{\"type\": \"fs\", \"path\": 3}", KVS_EINVAL, "fs: path must be a string, got integer"},
        {"{\"type\": \"fs\", \"path\": \"\"}", KVS_EINVAL, "fs: path is empty"},
        {"{\"type\": \"fs\", \"path\": \"/x\", \"bogus\": 1}", KVS_EINVAL,
         "fs: unknown key 'bogus'; accepted: path, fsync, capacity_bytes, workers, create, "
         "adopt, mode"},
        {"{\"type\": \"fs\", \"path\": \"/x\", \"max_workers\": 1}", KVS_EINVAL,
         "fs: unknown key 'max_workers'; accepted: path, fsync, capacity_bytes, workers, "
         "create, adopt, mode"},
        {"{\"type\": \"fs\", \"path\": \"/x\", \"fsync\": 1}", KVS_EINVAL,
         "fs: fsync must be a JSON boolean, got integer"},
        {"{\"type\": \"fs\", \"path\": \"/x\", \"create\": \"yes\"}", KVS_EINVAL,
         "fs: create must be a JSON boolean, got string"},
        {"{\"type\": \"fs\", \"path\": \"/x\", \"capacity_bytes\": -1}", KVS_EINVAL,
         "fs: capacity_bytes must be an integer >= 0, got -1"},
        {"{\"type\": \"fs\", \"path\": \"/x\", \"capacity_bytes\": \"1G\"}", KVS_EINVAL,
         "fs: capacity_bytes must be an integer >= 0, got string"},
        {"{\"type\": \"fs\", \"path\": \"/x\", \"workers\": 0}", KVS_EINVAL,
         "fs: workers must be an integer from 1 to 1024, got 0"},
        {"{\"type\": \"fs\", \"path\": \"/x\", \"workers\": 2.5}", KVS_EINVAL,
         "fs: workers must be an integer from 1 to 1024, got 2.5"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        a = (kvs_l2_adapter *)&a;
        CHECK_ERR(kvs_l2_create(bad[i].spec, &a), bad[i].code, bad[i].msg);
        CHECK(a == NULL);
    }
    json_t *arr = json_array();
    CHECK_ERR(kvs_fs_adapter_factory(arr, NULL, &a), KVS_EINVAL,
              "fs: spec must be a JSON object, got array");
    json_decref(arr);
    rm_rf(dir);
}

static void test_close(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 2, 0, 0);
    REQUIRE(a != NULL);

    /* Tasks in flight at close run to the end and their results stay. */
    enum { TASKS = 30, PER = 4 };
    kvs_object_key keys[TASKS * PER];
    kvs_memobj *objs[TASKS * PER], *dst[TASKS * PER];
    for (uint32_t i = 0; i < TASKS * PER; i++) {
        int_key(&keys[i], i, "close");
        objs[i] = make_obj(4096, i);
        dst[i] = make_obj(4096, 0);
    }
    for (int t = 0; t < TASKS; t++) {
        kvs_l2_task_id id;
        REQUIRE_OK(kvs_l2_submit_store(a, keys + t * PER, objs + t * PER, PER, &id));
        CHECK_EQ_U64(id, (uint64_t)t);
    }
    CHECK_OK(kvs_l2_close(a));
    kvs_l2_store_result r[TASKS + 1];
    size_t count = 0;
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, TASKS + 1, &count));
    CHECK_EQ_INT(count, TASKS);
    for (size_t i = 0; i < count; i++) {
        CHECK_EQ_INT(r[i].state, KVS_TASK_OK);
        CHECK_EQ_U64(r[i].bytes_written, PER * 4096);
    }
    kvs_l2_task_id id = 77;
    CHECK_ERR(kvs_l2_submit_store(a, keys, objs, 1, &id), KVS_ECLOSED, "fs: submit after close");
    CHECK_ERR(kvs_l2_submit_lookup_and_lock(a, keys, 1, &id), KVS_ECLOSED,
              "fs: submit after close");
    CHECK_ERR(kvs_l2_submit_load(a, keys, dst, 1, &id), KVS_ECLOSED, "fs: submit after close");
    CHECK_ERR(kvs_l2_submit_store(a, NULL, NULL, 0, &id), KVS_ECLOSED, "fs: submit after close");
    CHECK_ERR(kvs_l2_store_event_fd(a), KVS_ECLOSED, "fs: adapter is closed");
    CHECK_ERR(kvs_l2_lookup_event_fd(a), KVS_ECLOSED, "fs: adapter is closed");
    CHECK_ERR(kvs_l2_load_event_fd(a), KVS_ECLOSED, "fs: adapter is closed");
    CHECK_ERR(kvs_l2_delete(a, keys, 1, NULL), KVS_ECLOSED, "fs: adapter is closed");
    int64_t size;
    CHECK_ERR(kvs_l2_object_sizes(a, keys, 1, &size), KVS_ECLOSED, "fs: adapter is closed");
    CHECK_OK(kvs_l2_unlock(a, keys, 1));
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, TASKS * PER * 4096);
    json_t *st;
    CHECK_OK(kvs_l2_status(a, &st));
    CHECK(json_is_false(json_object_get(st, "is_healthy")));
    json_decref(st);
    CHECK_OK(kvs_l2_close(a)); /* twice: no-op */
    kvs_l2_destroy(a);

    /* Loads in flight at close; destroy without close; unread results. */
    a = open_fs(dir, 3, 0, 0);
    REQUIRE(a != NULL);
    kvs_l2_task_id ids[TASKS];
    for (int t = 0; t < TASKS; t++)
        REQUIRE_OK(kvs_l2_submit_load(a, keys + t * PER, dst + t * PER, PER, &ids[t]));
    CHECK_OK(kvs_l2_close(a));
    for (int t = 0; t < TASKS; t++) {
        kvs_l2_bitmap bm;
        CHECK_OK(kvs_l2_query_load(a, ids[t], &bm));
        CHECK_EQ_INT(bm.state, KVS_TASK_OK);
        CHECK_EQ_INT(bm.nhits, PER);
        kvs_l2_bitmap_release(&bm);
    }
    for (int i = 0; i < TASKS * PER; i++) CHECK(same_bytes(objs[i], dst[i]));
    kvs_l2_destroy(a);
    a = open_fs(dir, 2, 0, 1);
    REQUIRE(a != NULL);
    for (int t = 0; t < TASKS; t++) {
        REQUIRE_OK(kvs_l2_submit_lookup_and_lock(a, keys + t * PER, PER, &id));
        REQUIRE_OK(kvs_l2_submit_store(a, keys + t * PER, objs + t * PER, PER, &id));
    }
    kvs_l2_destroy(a); /* closes, drains, frees the unread results */

    for (int i = 0; i < TASKS * PER; i++) {
        kvs_memobj_free(objs[i]);
        kvs_memobj_free(dst[i]);
    }
    rm_rf(dir);
}

/* Writers replacing the same keys while readers load them: a reader sees
 * one whole object or another, never a mix. */
typedef struct race_arg {
    kvs_l2_adapter *a;
    kvs_object_key *keys;
    int writer;
    int torn, failed, hits;
    kvs_memobj **objs; /* writers: RACE_ROUNDS * RACE_KEYS, alive until the end */
} race_arg;

enum { RACE_KEYS = 4, RACE_SIZE = 65536, RACE_ROUNDS = 25 };

static void *race_thread(void *p)
{
    race_arg *ra = p;
    kvs_memobj *dst[RACE_KEYS];
    for (int i = 0; i < RACE_KEYS; i++) dst[i] = make_obj(RACE_SIZE, 0);
    for (int round = 0; round < RACE_ROUNDS; round++) {
        kvs_l2_task_id id;
        if (ra->writer) {
            /* Each store gets objects of its own: they must stay untouched
             * until the store has finished. */
            kvs_memobj **objs = ra->objs + round * RACE_KEYS;
            for (int i = 0; i < RACE_KEYS; i++)
                memset(objs[i]->data, (ra->writer * 64 + round) & 0xff, RACE_SIZE);
            if (kvs_l2_submit_store(ra->a, ra->keys, objs, RACE_KEYS, &id) != KVS_OK)
                ra->failed++;
            continue;
        }
        if (kvs_l2_submit_load(ra->a, ra->keys, dst, RACE_KEYS, &id) != KVS_OK) {
            ra->failed++;
            continue;
        }
        kvs_l2_bitmap bm = {0};
        for (int tries = 0; tries < 100000; tries++) {
            kvs_l2_query_load(ra->a, id, &bm);
            if (bm.state != KVS_TASK_PENDING) break;
            /* The other reader may drain the fd first: short polls. */
            struct pollfd pf = {kvs_l2_load_event_fd(ra->a), POLLIN, 0};
            if (poll(&pf, 1, 10) == 1) kvs_event_fd_consume(pf.fd, NULL);
        }
        if (bm.state == KVS_TASK_PENDING) ra->failed++;
        for (int i = 0; i < RACE_KEYS; i++) {
            if (!bm.hits || !bm.hits[i]) continue;
            ra->hits++;
            const uint8_t *d = dst[i]->data;
            if (kvs_memobj_size(dst[i]) != RACE_SIZE) ra->torn++;
            for (size_t j = 1; j < kvs_memobj_size(dst[i]); j++)
                if (d[j] != d[0]) {
                    ra->torn++;
                    break;
                }
        }
        kvs_l2_bitmap_release(&bm);
    }
    for (int i = 0; i < RACE_KEYS; i++) kvs_memobj_free(dst[i]);
    return NULL;
}

static void test_concurrent_replace_never_torn(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 4, 0, 1);
    REQUIRE(a != NULL);
    kvs_object_key keys[RACE_KEYS];
    for (uint32_t i = 0; i < RACE_KEYS; i++) int_key(&keys[i], i, "race");
    race_arg args[4] = {{a, keys, 1, 0, 0, 0, NULL}, {a, keys, 2, 0, 0, 0, NULL},
                        {a, keys, 0, 0, 0, 0, NULL}, {a, keys, 0, 0, 0, 0, NULL}};
    kvs_memobj *wobjs[2][RACE_ROUNDS * RACE_KEYS];
    for (int w = 0; w < 2; w++) {
        for (int i = 0; i < RACE_ROUNDS * RACE_KEYS; i++) wobjs[w][i] = make_obj(RACE_SIZE, 0);
        args[w].objs = wobjs[w];
    }
    pthread_t th[4];
    for (int i = 0; i < 4; i++) REQUIRE(pthread_create(&th[i], NULL, race_thread, &args[i]) == 0);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        CHECK_EQ_INT(args[i].torn, 0);
        CHECK_EQ_INT(args[i].failed, 0);
    }
    CHECK(args[2].hits + args[3].hits > 0);
    CHECK_OK(kvs_l2_close(a));
    kvs_l2_store_result r[2 * RACE_ROUNDS + 1];
    size_t count;
    CHECK_OK(kvs_l2_pop_completed_stores(a, r, 2 * RACE_ROUNDS + 1, &count));
    CHECK_EQ_INT(count, 2 * RACE_ROUNDS);
    for (size_t i = 0; i < count; i++) {
        CHECK_EQ_INT(r[i].state, KVS_TASK_OK);
        if (r[i].state != KVS_TASK_OK) fprintf(stderr, "%s\n", r[i].message);
    }
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, RACE_KEYS * RACE_SIZE);
    kvs_l2_destroy(a);
    for (int w = 0; w < 2; w++)
        for (int i = 0; i < RACE_ROUNDS * RACE_KEYS; i++) kvs_memobj_free(wobjs[w][i]);
    walk(dir);
    CHECK_EQ_INT(walk_tmp, 0);
    CHECK_EQ_INT(walk_regular, RACE_KEYS);
    rm_rf(dir);
}

/* One big batch spread over the workers; the lowest failing key is the
 * task's error whichever slice it is in. */
static void test_big_batch_and_first_error(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 4, 0, 1);
    REQUIRE(a != NULL);
    enum { N = 1000 };
    kvs_object_key *keys = calloc(N, sizeof *keys);
    kvs_memobj *src[N], *dst[N];
    REQUIRE(keys != NULL);
    for (uint32_t i = 0; i < N; i++) {
        int_key(&keys[i], i, i % 3 ? "big" : "batch");
        src[i] = make_obj(1 + i % 50, i);
        dst[i] = make_obj(64, 0);
    }
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, keys, src, N, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    uint64_t total = 0;
    for (int i = 0; i < N; i++) total += 1 + i % 50;
    CHECK_EQ_U64(res.bytes_written, total);
    kvs_l2_bitmap bm;
    REQUIRE_OK(lookup_wait(a, keys, N, &bm));
    CHECK_EQ_INT(bm.nhits, N);
    kvs_l2_bitmap_release(&bm);
    CHECK_OK(kvs_l2_unlock(a, keys, N));
    /* Keys 900 and 300 missing: the message names 300. */
    uint8_t del[2];
    kvs_object_key gone[2] = {keys[900], keys[300]};
    CHECK_OK(kvs_l2_delete(a, gone, 2, del));
    CHECK(del[0] && del[1]);
    REQUIRE_OK(load_wait(a, keys, dst, N, &bm));
    CHECK_EQ_INT(bm.nhits, N - 2);
    CHECK_EQ_INT(bm.hits[300], 0);
    CHECK_EQ_INT(bm.hits[900], 0);
    char p[PATH_MAX], msg[PATH_MAX + 512];
    key_file(dir, &keys[300], p, sizeof p);
    snprintf(msg, sizeof msg, "fs: load of key 300: not found (%s)", p);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (i != 300 && i != 900 && !same_bytes(src[i], dst[i])) bad++;
    CHECK_EQ_INT(bad, 0);
    kvs_l2_destroy(a);
    for (int i = 0; i < N; i++) {
        kvs_memobj_free(src[i]);
        kvs_memobj_free(dst[i]);
    }
    free(keys);
    rm_rf(dir);
}

/* A long directory path is shortened in the middle of messages. */
static void test_long_paths_in_messages(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 1, 0, 1);
    REQUIRE(a != NULL);
    char model[256];
    memset(model, 'q', 255);
    model[255] = '\0';
    kvs_object_key k;
    REQUIRE_OK(kvs_object_key_init(&k, "\x01", 1, model, 0, 0, NULL));
    kvs_memobj *d = make_obj(4, 0);
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_wait(a, &k, &d, 1, &bm));
    char full[PATH_MAX];
    key_file(dir, &k, full, sizeof full);
    size_t len = strlen(full);
    char expected[PATH_MAX + 512];
    snprintf(expected, sizeof expected, "fs: load of key 0: not found (%.100s...%s)", full,
             full + len - 97);
    CHECK_EQ_STR(bm.message, expected);
    kvs_l2_bitmap_release(&bm);
    kvs_l2_destroy(a);
    kvs_memobj_free(d);
    rm_rf(dir);
}

/* The directory removed under the adapter: unhealthy, stores fail. */
/* Issue 17 item 3 on fs, the raw path (no serde): a stored object of more
 * tokens or fewer than a KV-shaped destination's layout fails only its key,
 * KVS_ECORRUPT with both sizes, the destination untouched. */
static void test_load_wrong_layout_size_refused(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 1, 0, 1);
    REQUIRE(a);
    kvs_object_key k[3];
    for (uint32_t i = 0; i < 3; i++) int_key(&k[i], i, "m");
    kvs_memobj *o[3] = {kvs_test_kv_obj(64, 16, 1), kvs_test_kv_obj(48, 16, 2),
                        kvs_test_kv_obj(64, 16, 3)};
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, k, o, 3, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    char p[3][PATH_MAX], msg[PATH_MAX + 512];
    for (int i = 0; i < 3; i++) key_file(dir, &k[i], p[i], sizeof p[i]);
    kvs_memobj *d[3] = {kvs_test_kv_obj(48, 16, 0x5A), kvs_test_kv_obj(64, 16, 0x5A),
                        kvs_test_kv_obj(64, 16, 0x5A)};
    kvs_l2_bitmap bm;
    REQUIRE_OK(load_wait(a, k, d, 3, &bm));
    CHECK_EQ_INT(bm.state, KVS_TASK_OK);
    CHECK_EQ_INT(bm.hits[0], 0);
    CHECK_EQ_INT(bm.hits[1], 0);
    CHECK_EQ_INT(bm.hits[2], 1);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    snprintf(msg, sizeof msg, "fs: load of key 0: stored object is 16384 bytes, destination "
                              "layout needs 12288 (%s)", p[0]);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);
    CHECK(kvs_test_all_bytes(d[0], 0x5A) && kvs_test_all_bytes(d[1], 0x5A));
    CHECK(same_bytes(o[2], d[2]));
    REQUIRE_OK(load_wait(a, &k[1], &d[1], 1, &bm));
    CHECK_EQ_INT(bm.nhits, 0);
    CHECK_EQ_INT(bm.status, KVS_ECORRUPT);
    snprintf(msg, sizeof msg, "fs: load of key 0: stored object is 12288 bytes, destination "
                              "layout needs 16384 (%s)", p[1]);
    CHECK_EQ_STR(bm.message, msg);
    kvs_l2_bitmap_release(&bm);
    CHECK(kvs_test_all_bytes(d[1], 0x5A));
    kvs_l2_destroy(a);
    for (int i = 0; i < 3; i++) {
        kvs_memobj_free(o[i]);
        kvs_memobj_free(d[i]);
    }
    rm_rf(dir);
}

static void test_directory_removed(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 1, 0, 1);
    REQUIRE(a != NULL);
    rm_rf(dir);
    json_t *st;
    CHECK_OK(kvs_l2_status(a, &st));
    CHECK(json_is_false(json_object_get(st, "is_healthy")));
    json_decref(st);
    kvs_object_key k;
    int_key(&k, 1, "m");
    kvs_memobj *o = make_obj(4, 0);
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, &k, &o, 1, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(res.status, KVS_EIO);
    char msg[PATH_MAX + 512];
    snprintf(msg, sizeof msg, "fs: store of key 0: mkdir: %s (%s/m+/00000001,0,0)",
             strerror(ENOENT), dir);
    CHECK_EQ_STR(res.message, msg);
    kvs_l2_destroy(a);
    kvs_memobj_free(o);
}


/* ---------------------------------------------------------------------
 * Hostile neighbours: a second process, foreign files, permissions
 * ------------------------------------------------------------------ */

/* Item: a second process opening the directory used to remove a live
 * writer's temporary file between its create and its lock (the store then
 * failed with "rename: No such file or directory"). A child stores one key
 * per task in a loop while the parent opens and closes adapters on the same
 * directory; every store and every open must succeed. Bounded: STORES
 * stores or SECONDS seconds in the child, whichever comes first. */
static void test_second_process_opening_never_breaks_stores(void)
{
    enum { STORES = 3000, SECONDS = 4 };
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    fflush(NULL);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        kvs_l2_adapter *a = open_fs(dir, 1, 0, 1);
        if (a == NULL) _exit(2);
        time_t end = time(NULL) + SECONDS;
        int failed = 0;
        for (uint32_t i = 0; i < STORES && time(NULL) < end && !failed; i++)
            failed = !store_int_key(a, i % 64, "m", 64);
        kvs_l2_destroy(a);
        _exit(failed);
    }
    int opens = 0, open_failures = 0, status = 0;
    for (; opens < 100000; opens++) {
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        kvs_l2_adapter *b = open_fs(dir, 1, 0, 1);
        if (b == NULL) open_failures++;
        else kvs_l2_destroy(b);
    }
    if (opens == 100000) REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(opens > 0);
    CHECK_EQ_INT(open_failures, 0);
    CHECK(WIFEXITED(status));
    CHECK_EQ_INT(WEXITSTATUS(status), 0);
    walk(dir);
    CHECK_EQ_INT(walk_tmp, 0);
    CHECK_EQ_INT(walk_regular, 64);
    rm_rf(dir);
}

/* kvs_l2_create of an "fs" spec on dir with more members (", ..."). */
static int create_spec(const char *dir, const char *more, kvs_l2_adapter **a)
{
    char spec[PATH_MAX + 128];
    snprintf(spec, sizeof spec, "{\"type\": \"fs\", \"path\": \"%s\"%s}", dir, more);
    return kvs_l2_create(spec, a);
}

#define KVS_TMP ".tmp-kvs-00000000000000000000000000000abc"

/* Make dir/rel: a directory if text is NULL, else a file holding text.
 * The full path goes to path (PATH_MAX bytes) if not NULL. */
static void plant(const char *dir, const char *rel, const char *text, char *path)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, rel);
    if (text == NULL) {
        if (mkdir(p, 0755) != 0) abort();
    } else {
        write_file(p, text, strlen(text));
    }
    if (path) memcpy(path, p, sizeof p);
}

/* The refusal of an unmarked directory holding `entry`. */
static void not_a_store_msg(const char *dir, const char *entry, char *msg, size_t size)
{
    snprintf(msg, size,
             "fs: directory '%s' is not a kvserde store: no .kvserde-store marker, and it "
             "holds '%s'; set \"adopt\": true to use it",
             dir, entry);
}

/* Item: opening used to remove every ".tmp-*" file up to 12 levels down,
 * other programs' too. Now a directory that is neither empty, nor marked,
 * nor shaped like a store is refused unless adopted; once adopted, only
 * files named exactly as kvserde's temporaries, in directories the key
 * scheme makes, are removed. */
static void test_foreign_files_survive_open(void)
{
    char dir[64], p[PATH_MAX], msg[PATH_MAX + 256];
    make_tmpdir(dir, sizeof dir);
    plant(dir, "app", NULL, NULL);
    plant(dir, "app/.tmp-build.lock", "x\n", p);

    /* Not a store, and not adopted: refused, nothing touched. */
    kvs_fs_options o = {0};
    o.path = dir;
    kvs_l2_adapter *a = (kvs_l2_adapter *)&a;
    not_a_store_msg(dir, "app", msg, sizeof msg);
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EEXIST, msg);
    CHECK(a == NULL);
    CHECK_EQ_INT(file_size(p), 2);
    CHECK_ERR(create_spec(dir, ", \"adopt\": false", &a),
              KVS_EEXIST, msg);

    /* Adopted: more foreign things, and kvserde-named files where kvserde
     * never writes (outside the scheme's directories). */
    char foreign[4][PATH_MAX], ours[PATH_MAX];
    plant(dir, "app/" KVS_TMP, "keep", foreign[0]);
    plant(dir, ".tmp-build.lock", "keep", foreign[1]);
    plant(dir, "m+", NULL, NULL);
    plant(dir, "m+/sub", NULL, NULL); /* not a directory the scheme makes */
    plant(dir, "m+/sub/" KVS_TMP, "keep", foreign[2]);
    plant(dir, "m+/sub/00000001,0,0", "keep", foreign[3]);
    plant(dir, "m+/" KVS_TMP, "partial", ours); /* a crash leftover where kvserde writes */

    REQUIRE_OK(create_spec(dir, ", \"adopt\": true", &a));
    snprintf(p, sizeof p, "%s/app/.tmp-build.lock", dir);
    CHECK_EQ_INT(file_size(p), 2);
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(file_size(foreign[i]), 4);
    CHECK_EQ_INT(file_size(ours), -1);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 0); /* the file in m+/sub is no object */
    kvs_l2_destroy(a);
    snprintf(p, sizeof p, "%s/.kvserde-store", dir);
    CHECK_EQ_INT(file_size(p), 27); /* "kvserde fs store, format 1\n" */

    /* Marked now: opens without adopt. */
    a = open_fs(dir, 1, 0, 1);
    CHECK(a != NULL);
    if (a) kvs_l2_destroy(a);
    rm_rf(dir);
}

/* Unmarked directories: empty ones and stores written before markers
 * existed (only kvserde-shaped names) are taken and marked; anything else
 * is refused; a marker of another format is refused. */
static void test_store_marker(void)
{
    char dir[64], p[PATH_MAX], msg[PATH_MAX + 256];
    make_tmpdir(dir, sizeof dir);
    /* An old store: one object, one crash leftover in the root. */
    plant(dir, "m+", NULL, NULL);
    plant(dir, "m+/00000001,0,0", "abc", NULL);
    plant(dir, KVS_TMP, "partial", p);
    kvs_l2_adapter *a = open_fs(dir, 1, 0, 1);
    REQUIRE(a != NULL);
    kvs_l2_usage u;
    CHECK_OK(kvs_l2_get_usage(a, &u));
    CHECK_EQ_U64(u.bytes_used, 3);
    kvs_l2_destroy(a);
    CHECK_EQ_INT(file_size(p), -1);
    snprintf(p, sizeof p, "%s/.kvserde-store", dir);
    CHECK_EQ_INT(file_size(p), 27);

    /* A marker with other contents. */
    write_file(p, "kvserde fs store, format 9\n", 27);
    kvs_fs_options o = {0};
    o.path = dir;
    snprintf(msg, sizeof msg,
             "fs: '%s/.kvserde-store' is not a store marker of format 1 (it should hold one "
             "line: 'kvserde fs store, format 1')",
             dir);
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EUNSUPPORTED, msg);
    o.adopt = 1; /* adopting does not overrule a marker */
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EUNSUPPORTED, msg);
    rm_rf(dir);

    /* A foreign file in the root. */
    make_tmpdir(dir, sizeof dir);
    plant(dir, "notes.txt", "mine", p);
    o.path = dir;
    o.adopt = 0;
    not_a_store_msg(dir, "notes.txt", msg, sizeof msg);
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EEXIST, msg);
    CHECK_EQ_INT(file_size(p), 4);
    snprintf(p, sizeof p, "%s/.kvserde-store", dir);
    CHECK_EQ_INT(file_size(p), -1); /* a refused open writes nothing */
    rm_rf(dir);
}

static int mode_of(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0 ? (int)(st.st_mode & 07777) : -1;
}

/* The modes of a store made at dir/new/store with one key stored: the
 * directories made (new, store, the key's), the object, the marker. */
static void check_store_modes(const char *dir, kvs_l2_adapter *a, int fmode, int dmode)
{
    CHECK(store_int_key(a, 5, "m", 8));
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/new", dir);
    CHECK_EQ_INT(mode_of(p), dmode);
    snprintf(p, sizeof p, "%s/new/store", dir);
    CHECK_EQ_INT(mode_of(p), dmode);
    snprintf(p, sizeof p, "%s/new/store/m+", dir);
    CHECK_EQ_INT(mode_of(p), dmode);
    snprintf(p, sizeof p, "%s/new/store/m+/00000005,0,0", dir);
    CHECK_EQ_INT(mode_of(p), fmode);
    snprintf(p, sizeof p, "%s/new/store/.kvserde-store", dir);
    CHECK_EQ_INT(mode_of(p), fmode);
}

/* Item: under umask 022 the store used to be 0755 / 0644, readable by every
 * local user. Now private whatever the umask, or the mode asked for. */
static void test_store_modes(void)
{
    static const struct {
        mode_t umask;
        const char *mode; /* NULL: the default */
        int fmode, dmode;
    } cases[] = {
        {022, NULL, 0600, 0700}, {0, NULL, 0600, 0700},   {077, "0640", 0640, 0750},
        {0, "640", 0640, 0750},  {022, "0660", 0660, 0770}, {0, "0644", 0644, 0755},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[64], p[PATH_MAX], more[64] = ", \"fsync\": false";
        make_tmpdir(dir, sizeof dir);
        snprintf(p, sizeof p, "%s/new/store", dir);
        if (cases[i].mode)
            snprintf(more, sizeof more, ", \"fsync\": false, \"mode\": \"%s\"", cases[i].mode);
        mode_t old = umask(cases[i].umask);
        kvs_l2_adapter *a = NULL;
        int rc = create_spec(p, more, &a);
        CHECK_OK(rc);
        if (rc == KVS_OK) {
            check_store_modes(dir, a, cases[i].fmode, cases[i].dmode);
            kvs_l2_destroy(a);
        }
        umask(old);
        rm_rf(dir);
    }

    /* The C option; an existing directory keeps its own mode, and a setgid
     * bit (a group's shared directory) is passed on to the new ones. */
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    REQUIRE(chmod(dir, 02771) == 0);
    kvs_fs_options o = {0};
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/new/store", dir);
    o.path = p;
    o.mode = 0660;
    kvs_l2_adapter *a = NULL;
    REQUIRE_OK(kvs_fs_adapter_create(&o, &a));
    check_store_modes(dir, a, 0660, 02770);
    kvs_l2_destroy(a);
    CHECK_EQ_INT(mode_of(dir), 02771);
    rm_rf(dir);
}

static void test_bad_modes(void)
{
    static const struct {
        const char *mode; /* JSON text */
        const char *msg;
    } bad[] = {
        {"\"0666\"", "fs: mode 0666 lets every local user write the store; grant write to the "
                     "owner and group only"},
        {"\"0622\"", "fs: mode 0622 lets every local user write the store; grant write to the "
                     "owner and group only"},
        {"\"0755\"", "fs: mode 0755 has execute bits; give the files' mode, such as 0640 "
                     "(directories get the matching execute bits)"},
        {"\"0400\"", "fs: mode 0400 must let the owner read and write (0600)"},
        {"\"0\"", "fs: mode 0000 must let the owner read and write (0600)"},
        {"\"1600\"", "fs: mode 1600 is not a permission mode (0000 to 0777)"},
        {"\"0680\"", "fs: mode must be a string of octal digits such as \"0640\", got '0680'"},
        {"\"00640\"", "fs: mode must be a string of octal digits such as \"0640\", got '00640'"},
        {"\"\"", "fs: mode must be a string of octal digits such as \"0640\", got ''"},
        {"\"rw-r-----\"",
         "fs: mode must be a string of octal digits such as \"0640\", got 'rw-r-----'"},
        {"416", "fs: mode must be a string of octal digits such as \"0640\", got integer"},
        {"null", "fs: mode must be a string of octal digits such as \"0640\", got null"},
    };
    char dir[64], sub[PATH_MAX], more[64];
    make_tmpdir(dir, sizeof dir);
    snprintf(sub, sizeof sub, "%s/s", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(more, sizeof more, ", \"mode\": %s", bad[i].mode);
        kvs_l2_adapter *a = (kvs_l2_adapter *)&a;
        CHECK_ERR(create_spec(sub, more, &a), KVS_EINVAL, bad[i].msg);
        CHECK(a == NULL);
    }
    kvs_fs_options o = {0};
    o.path = dir;
    kvs_l2_adapter *a = NULL;
    o.mode = 0777;
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EINVAL,
              "fs: mode 0777 has execute bits; give the files' mode, such as 0640 (directories "
              "get the matching execute bits)");
    o.mode = 04600;
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EINVAL,
              "fs: mode 4600 is not a permission mode (0000 to 0777)");
    o.mode = 0602;
    CHECK_ERR(kvs_fs_adapter_create(&o, &a), KVS_EINVAL,
              "fs: mode 0602 lets every local user write the store; grant write to the owner "
              "and group only");
    CHECK_EQ_INT(file_size(sub), -1); /* refused before anything is made */
    rm_rf(dir);
}

/* Run fn(dir) in a child that cannot read directories of mode 0000 (as
 * root: as the user nobody, owning dir's entries except `unreadable`). The
 * child's exit status: 0 passed, 77 could not drop root. */
static int run_unprivileged(const char *dir, const char *unreadable, int (*fn)(const char *))
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, unreadable);
    if (chmod(p, 0) != 0) return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(77);
        _exit(fn(dir));
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
    chmod(p, 0755);
    return WEXITSTATUS(status);
}

static int open_succeeds(const char *dir)
{
    kvs_l2_adapter *a = open_fs(dir, 1, 0, 1);
    if (a) kvs_l2_destroy(a);
    return a == NULL;
}

static int open_refused_for_m(const char *dir)
{
    kvs_fs_options o = {0};
    o.path = dir;
    kvs_l2_adapter *a = NULL;
    char msg[PATH_MAX + 128];
    snprintf(msg, sizeof msg, "fs: cannot count the objects in '%s': open 'm+': %s", dir,
             strerror(EACCES));
    int rc = kvs_fs_adapter_create(&o, &a);
    if (rc == KVS_EIO && strcmp(kvs_last_error(), msg) == 0) return 0;
    fprintf(stderr, "expected KVS_EIO \"%s\", got %d \"%s\"\n", msg, rc, kvs_last_error());
    if (a) kvs_l2_destroy(a);
    return 1;
}

/* An unreadable directory kvserde did not make is not entered, so it does
 * not stop the open; an unreadable directory of the key scheme does (its
 * objects could not be counted). */
static void test_unreadable_directories(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    plant(dir, "m+", NULL, NULL);
    plant(dir, "m+/00000001,0,0", "abc", NULL);
    plant(dir, "app", NULL, NULL);
    plant(dir, "app/x", "x", NULL);
    kvs_l2_adapter *a = NULL;
    REQUIRE_OK(create_spec(dir, ", \"adopt\": true", &a)); /* writes the marker */
    kvs_l2_destroy(a);
    if (geteuid() == 0) {
        static const char *const owned[] = {"", "/m+", "/m+/00000001,0,0", "/.kvserde-store"};
        for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) {
            char p[PATH_MAX];
            snprintf(p, sizeof p, "%s%s", dir, owned[i]);
            REQUIRE(chown(p, 65534, 65534) == 0);
        }
    }
    int rc = run_unprivileged(dir, "app", open_succeeds);
    if (rc == 77) {
        fprintf(stderr, "test_unreadable_directories: cannot drop root, skipped\n");
    } else {
        CHECK_EQ_INT(rc, 0);
        CHECK_EQ_INT(run_unprivileged(dir, "m+", open_refused_for_m), 0);
    }
    rm_rf(dir);
}

/* kvs_l2_list_keys: the contract (kvs_test_list.h) over keys of every
 * shape the scheme has (escaped model names, salts, split hash
 * directories), with foreign files beside them that are never reported,
 * and the walk the open's census makes: no temp file is removed by it. */
static void test_list_keys(void)
{
    char dir[64];
    make_tmpdir(dir, sizeof dir);
    kvs_l2_adapter *a = open_fs(dir, 2, 0, 1);
    REQUIRE(a != NULL);
    enum { N = 40 };
    kvs_object_key keys[N];
    kvs_memobj *objs[N];
    uint8_t big[100];
    for (int i = 0; i < N; i++) {
        const char *models[] = {"m", "org/Model-7B", "..", "caf\xc3\xa9"};
        memset(big, i, sizeof big);
        uint8_t h[4] = {0, 0, (uint8_t)(i >> 8), (uint8_t)i};
        REQUIRE_OK(kvs_object_key_init(&keys[i], i >= 30 ? big : h, i >= 30 ? sizeof big : 4,
                                       models[i % 4], i % 3 - 1, i % 5, i % 2 ? "salt" : ""));
        objs[i] = make_obj((size_t)i, (unsigned)i);
    }
    kvs_l2_store_result res;
    REQUIRE_OK(store_wait(a, keys, objs, N, &res));
    CHECK_EQ_INT(res.state, KVS_TASK_OK);
    /* foreign entries: at the root, in a store directory, a directory the
     * scheme never makes */
    char path[4096], k0[4096];
    snprintf(path, sizeof path, "%s/notes.txt", dir);
    write_file(path, "x", 1);
    key_file(dir, &keys[0], k0, sizeof k0);
    snprintf(path, sizeof path, "%.*s/junk,1", (int)(strrchr(k0, '/') - k0), k0);
    write_file(path, "x", 1);
    snprintf(path, sizeof path, "%s/other,dir", dir);
    REQUIRE(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/other,dir/a,0,0", dir);
    write_file(path, "x", 1);
    char tmp[KVS_FS_TEMP_NAME_LEN + 1];
    kvs_fs_temp_name(1, 2, tmp);
    snprintf(path, sizeof path, "%s/%s", dir, tmp);
    write_file(path, "x", 1);
    kvs_test_list_contract(a, keys, N, "fs: adapter is closed");
    CHECK_EQ_INT(file_size(path), 1); /* a listing leaves temporaries alone */
    kvs_l2_destroy(a);
    for (int i = 0; i < N; i++) kvs_memobj_free(objs[i]);
    rm_rf(dir);
}

int main(void)
{
    RUN(test_key_path_examples);
    RUN(test_key_path_long_names);
    RUN(test_path_key_refuses_non_canonical);
    RUN(test_key_path_injective_fuzz);
    RUN(test_store_lookup_load);
    RUN(test_stores_used_size_only);
    RUN(test_reopen_finds_objects);
    RUN(test_hostile_keys);
    RUN(test_bad_files_fail_only_their_key);
    RUN(test_store_failures);
    RUN(test_temp_files_cleaned_at_open);
    RUN(test_capacity);
    RUN(test_locks_and_delete);
    RUN(test_fsync_on_and_off);
    RUN(test_create_and_factory_refusals);
    RUN(test_close);
    RUN(test_concurrent_replace_never_torn);
    RUN(test_big_batch_and_first_error);
    RUN(test_long_paths_in_messages);
    RUN(test_directory_removed);
    RUN(test_load_wrong_layout_size_refused);
    RUN(test_second_process_opening_never_breaks_stores);
    RUN(test_foreign_files_survive_open);
    RUN(test_store_marker);
    RUN(test_store_modes);
    RUN(test_bad_modes);
    RUN(test_unreadable_directories);
    RUN(test_list_keys);
    return TEST_SUMMARY();
}
