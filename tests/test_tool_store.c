/* test_tool_store.c - end to end: the built `kvserde` tool on stores.
 * `kvserde verify` on a filesystem store written here through the library
 * (good, damaged, foreign, unframed and encrypted objects; --key-file;
 * --delete-damaged; the open-mode warning), the same on a Redis store (a
 * redis-server of its own on loopback), and `kvserde demo` taking --serde
 * together with --l2. The tool is $KVS_TEST_BIN_DIR/kvserde. (A memory
 * store cannot be verified across processes: the tool's own is empty.) */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "kvs_test.h"
#include "kvserde/kvserde.h"

extern char **environ;

static char tool[4096], dir[4096], store[4200], outp[4200], errp[4200];

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strdup(buf);
}

/* Run the tool; its exit status, stdout and stderr (caller frees). */
static int run(char **out, char **err, const char *const *args)
{
    const char *argv[16] = {tool};
    size_t n = 1;
    for (; args[n - 1] && n < 15; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int rc = posix_spawn(&pid, tool, &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return -1;
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    *out = slurp(outp);
    *err = slurp(errp);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* ----- a store written through the library ------------------------------- */

static kvs_object_key key_of(int i)
{
    kvs_object_key k;
    uint8_t h[4] = {0, 0, 0, (uint8_t)i};
    kvs_object_key_init(&k, h, sizeof h, "m", 0, 0, NULL);
    return k;
}

/* Store keys [first, first + n) through the adapter of `base` (a spec's
 * members, without braces) with `serde` (JSON, or NULL for raw bytes). */
static void store_keys_in(const char *base, const char *serde, int first, int n)
{
    char spec[8192];
    snprintf(spec, sizeof spec, "{%s%s%s}", base, serde ? ", \"serde\": " : "",
             serde ? serde : "");
    kvs_l2_adapter *a;
    if (kvs_l2_create(spec, &a) != KVS_OK) {
        fprintf(stderr, "%s\n", kvs_last_error());
        abort();
    }
    kvs_layout l = {0};
    kvs_layout_add_group(&l, 4, (int64_t[]){2, 1, 4, 16}, KVS_DTYPE_BFLOAT16);
    for (int i = first; i < first + n; i++) {
        kvs_memobj *o;
        kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &o);
        uint16_t *v = o->data;
        for (int e = 0; e < 128; e++) v[e] = (uint16_t)(0x3F80 + e + i);
        kvs_object_key k = key_of(i);
        kvs_l2_task_id id;
        kvs_l2_store_result r;
        size_t got = 0;
        if (kvs_l2_submit_store(a, &k, &o, 1, &id) != KVS_OK) abort();
        while (got == 0) {
            usleep(1000);
            kvs_l2_pop_completed_stores(a, &r, 1, &got);
        }
        if (r.status != KVS_OK) abort();
        kvs_memobj_free(o);
    }
    kvs_l2_destroy(a);
}

/* ... through an fs adapter on `store`. */
static void store_keys(const char *serde, int first, int n)
{
    char base[4400];
    snprintf(base, sizeof base, "\"type\": \"fs\", \"path\": \"%s\", \"fsync\": false", store);
    store_keys_in(base, serde, first, n);
}

static char *obj_path(int i)
{
    static char p[2][4800];
    static int next;
    char rel[512];
    kvs_object_key k = key_of(i);
    kvs_fs_key_path(&k, rel, sizeof rel);
    char *b = p[next++ % 2];
    snprintf(b, sizeof p[0], "%s/%s", store, rel);
    return b;
}

static void copy_file(const char *from, const char *to)
{
    char *data = NULL;
    FILE *f = fopen(from, "rb");
    REQUIRE(f != NULL);
    data = malloc(1 << 20);
    size_t n = fread(data, 1, 1 << 20, f);
    fclose(f);
    f = fopen(to, "wb");
    REQUIRE(f != NULL);
    fwrite(data, 1, n, f);
    fclose(f);
    free(data);
}

static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    REQUIRE(f != NULL);
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x01, f);
    fclose(f);
}

static int rm_entry(const char *p, const struct stat *s, int flag, struct FTW *ftw)
{
    (void)s, (void)flag, (void)ftw;
    return remove(p);
}

static void fresh_store(void)
{
    nftw(store, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    REQUIRE(mkdir(store, 0700) == 0);
}

/* Each line of the counts block, in order, for the store `where`. */
static char *counts_in(const char *where, size_t n, size_t ok, size_t damaged, size_t foreign,
                       size_t unverified, size_t unframed)
{
    static char buf[8192];
    snprintf(buf, sizeof buf,
             "verified %zu objects in %s\n  ok           %zu\n  damaged      %zu\n"
             "  foreign      %zu\n  unsupported  0\n  unverified   %zu\n  unframed     %zu\n",
             n, where, ok, damaged, foreign, unverified, unframed);
    return buf;
}

static char *counts(size_t n, size_t ok, size_t damaged, size_t foreign, size_t unverified,
                    size_t unframed)
{
    return counts_in(store, n, ok, damaged, foreign, unverified, unframed);
}

#define PIPE "{\"type\": \"pipeline\", \"stages\": [{\"type\": \"fp8\"}, {\"type\": \"xxh3\"}]}"

static void test_verify_counts_and_delete(void)
{
    fresh_store();
    store_keys(PIPE, 0, 4);
    store_keys("{\"type\": \"fp8\"}", 4, 1); /* unframed: plain fp8 bytes */
    flip_byte(obj_path(1), 90);               /* a payload byte: xxh3 mismatch */
    copy_file(obj_path(3), obj_path(2));      /* key 3's frame under key 2 */
    char *out, *err;
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", store)), 1);
    CHECK(out && strstr(out, counts(5, 2, 1, 1, 0, 1)) != NULL);
    /* one line per damaged and foreign object, in directory order */
    CHECK(out && strstr(out, "damaged  m+/00000001,0,0: pipeline: xxh3: payload damaged: "));
    CHECK(out && strstr(out, "foreign  m+/00000002,0,0: pipeline: blob was written for "
                             "another key: stored key fingerprint "));
    free(out);
    free(err);

    /* --l2 with the same store, deleting the damaged object only */
    char spec[4800];
    snprintf(spec, sizeof spec, "{\"type\": \"fs\", \"path\": \"%s\"}", store);
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", "--delete-damaged", "--l2", spec)), 1);
    CHECK(out && strstr(out, "deleted 1 of 1 damaged objects\n") != NULL);
    free(out);
    free(err);
    CHECK_EQ_INT(access(obj_path(1), F_OK), -1);
    CHECK_EQ_INT(access(obj_path(2), F_OK), 0); /* foreign: kept */
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", store)), 0);
    CHECK(out && strstr(out, counts(4, 2, 0, 1, 0, 1)) != NULL);
    free(out);
    free(err);
}

static void test_verify_encrypted(void)
{
    fresh_store();
    char kf[4300], json[8192];
    snprintf(kf, sizeof kf, "%s/key", dir);
    FILE *f = fopen(kf, "wb");
    REQUIRE(f != NULL);
    for (int i = 0; i < 32; i++) fputc(i * 7, f);
    fclose(f);
    chmod(kf, 0600);
    snprintf(json, sizeof json,
             "{\"type\": \"pipeline\", \"stages\": [{\"type\": \"fp8\"}, {\"type\": "
             "\"aes_gcm\", \"key_file\": \"%s\"}]}",
             kf);
    store_keys(json, 0, 2);
    flip_byte(obj_path(1), 100);
    char *out, *err;
    /* without the key nothing can be checked: unverified, not damaged */
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", store)), 0);
    CHECK(out && strstr(out, counts(2, 0, 0, 0, 2, 0)) != NULL);
    free(out);
    free(err);
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", "--key-file", kf, store)), 1);
    CHECK(out && strstr(out, counts(2, 1, 1, 0, 0, 0)) != NULL);
    CHECK(out && strstr(out, "damaged  m+/00000001,0,0: aes_gcm: authentication failed") == out);
    free(out);
    free(err);
    unlink(kf);
}

static void test_verify_warns_about_open_modes(void)
{
    fresh_store();
    store_keys(PIPE, 0, 2);
    char sub[4800];
    snprintf(sub, sizeof sub, "%s/m+", store);
    chmod(sub, 0700);
    chmod(obj_path(0), 0600);
    chmod(obj_path(1), 0640);
    char *out, *err;
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", store)), 0);
    char want[8192];
    snprintf(want, sizeof want,
             "kvserde verify: warning: 1 objects and 0 directories are more open than mode "
             "0600, e.g. %s (mode 0640); a KV cache reveals users' prompts "
             "(docs/security.md)\n",
             obj_path(1));
    CHECK_EQ_STR(err, want);
    free(out);
    free(err);
    /* a store configured for group reading: 0640 is what it asked for */
    char spec[4800];
    snprintf(spec, sizeof spec, "{\"type\": \"fs\", \"path\": \"%s\", \"mode\": \"0640\"}", store);
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", "--l2", spec)), 0);
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);
}

static void test_verify_usage(void)
{
    char *out, *err;
    CHECK_EQ_INT(run(&out, &err, ARGS("verify")), 2);
    CHECK(err && strstr(err, "kvserde verify: give the store as --l2 SPEC or as DIR (one of "
                             "them)\n") == err);
    free(out);
    free(err);
    /* any adapter now; a memory store is the tool's own, and empty */
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", "--l2", "{\"type\": \"memory\"}")), 0);
    CHECK(out && strstr(out, counts_in("the memory store", 0, 0, 0, 0, 0, 0)) == out);
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", "--l2", "{\"type\": \"nosuch\"}")), 1);
    CHECK_EQ_STR(err, "kvserde verify: unknown L2 adapter type 'nosuch'; registered: fs, memory, "
                      "redis\n");
    free(out);
    free(err);
}

/* ----- a Redis store ------------------------------------------------------- */

static pid_t redis_pid;

/* A redis-server on a free loopback port (0 if none could be started). */
static int start_redis(void)
{
    for (int attempt = 0; attempt < 20; attempt++) {
        int port = 20000 + rand() % 10000;
        char p[16];
        snprintf(p, sizeof p, "%d", port);
        const char *argv[] = {"redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", dir, NULL};
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        for (int fd = 0; fd < 3; fd++)
            posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", fd ? O_WRONLY : O_RDONLY, 0);
        int rc = posix_spawnp(&redis_pid, "redis-server", &fa, NULL, (char *const *)argv,
                              environ);
        posix_spawn_file_actions_destroy(&fa);
        if (rc != 0) return 0;
        for (int wait = 0; wait < 200; wait++) { /* up to 10 s for a PONG */
            if (waitpid(redis_pid, NULL, WNOHANG) == redis_pid) break; /* port taken */
            redisContext *c = redisConnect("127.0.0.1", port);
            redisReply *r = c && !c->err ? redisCommand(c, "PING") : NULL;
            int up = r && r->type == REDIS_REPLY_STATUS;
            if (r) freeReplyObject(r);
            if (c) redisFree(c);
            if (up) return port;
            usleep(50000);
        }
        kill(redis_pid, SIGKILL);
        waitpid(redis_pid, NULL, 0);
        redis_pid = 0;
    }
    return 0;
}

/* Replace key i's stored bytes with themselves, byte `at` flipped, through a
 * plain (serde-less) adapter of `spec`. */
static void damage_raw(const char *spec, int i, size_t at)
{
    kvs_l2_adapter *a;
    REQUIRE(kvs_l2_create(spec, &a) == KVS_OK);
    kvs_object_key k = key_of(i);
    int64_t size;
    REQUIRE(kvs_l2_object_sizes(a, &k, 1, &size) == KVS_OK && size > (int64_t)at);
    kvs_layout l;
    kvs_memobj *o;
    REQUIRE(kvs_layout_flat(&l, (uint64_t)size, KVS_DTYPE_UINT8) == KVS_OK &&
            kvs_memobj_alloc(&l, KVS_FMT_BINARY_BUFFER, &o) == KVS_OK);
    kvs_l2_task_id id;
    kvs_l2_bitmap bm = {0};
    REQUIRE(kvs_l2_submit_load(a, &k, &o, 1, &id) == KVS_OK);
    while (kvs_l2_query_load(a, id, &bm) == KVS_OK && bm.state == KVS_TASK_PENDING)
        usleep(1000);
    CHECK_EQ_INT(bm.nhits, 1);
    kvs_l2_bitmap_release(&bm);
    ((uint8_t *)o->data)[at] ^= 0x01;
    kvs_l2_store_result r;
    size_t got = 0;
    REQUIRE(kvs_l2_submit_store(a, &k, &o, 1, &id) == KVS_OK);
    while (got == 0) {
        usleep(1000);
        kvs_l2_pop_completed_stores(a, &r, 1, &got);
    }
    CHECK_EQ_INT(r.status, KVS_OK);
    kvs_memobj_free(o);
    kvs_l2_destroy(a);
}

static void test_verify_redis(void)
{
    int port = start_redis();
    REQUIRE(port != 0);
    char base[256], plain[300], spec[1024];
    snprintf(base, sizeof base, "\"type\": \"redis\", \"url\": \"redis://127.0.0.1:%d\", "
             "\"key_prefix\": \"v:\"", port);
    snprintf(plain, sizeof plain, "{%s}", base);
    store_keys_in(base, PIPE, 0, 3);
    damage_raw(plain, 1, 90); /* a payload byte: xxh3 mismatch */
    /* the spec's serde is ignored: the objects are read as stored */
    snprintf(spec, sizeof spec, "{%s, \"serde\": %s}", base, PIPE);
    char *out, *err;
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", "--l2", spec)), 1);
    CHECK(out && strstr(out, "damaged  m+/00000001,0,0: pipeline: xxh3: payload damaged: ") == out);
    CHECK(out && strstr(out, counts_in("the redis store", 3, 2, 1, 0, 0, 0)) != NULL);
    free(out);
    free(err);
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", "--delete-damaged", "--l2", plain)), 1);
    CHECK(out && strstr(out, "deleted 1 of 1 damaged objects\n") != NULL);
    free(out);
    free(err);
    CHECK_EQ_INT(run(&out, &err, ARGS("verify", "--l2", plain)), 0);
    CHECK(out && strstr(out, counts_in("the redis store", 2, 2, 0, 0, 0, 0)) == out);
    free(out);
    free(err);
    kill(redis_pid, SIGKILL);
    waitpid(redis_pid, NULL, 0);
    redis_pid = 0;
}

static void test_demo_serde_with_l2(void)
{
    char *out, *err;
    CHECK_EQ_INT(run(&out, &err, ARGS("demo", "--chunks", "2", "--layers", "2", "--tokens", "16",
                                      "--serde", PIPE, "--l2", "{\"type\": \"memory\"}")),
                 0);
    CHECK(out && strstr(out, "  serde        " PIPE "\n") != NULL);
    /* fp8 codes + a 76-byte header + the 8-byte xxh3 per 65536-element chunk */
    CHECK(out && strstr(out, "  stored bytes 131240 (0.501x of raw)\n") != NULL);
    free(out);
    free(err);
    CHECK_EQ_INT(run(&out, &err,
                     ARGS("demo", "--serde", PIPE, "--l2",
                          "{\"type\": \"memory\", \"serde\": {\"type\": \"fp8\"}}")),
                 1);
    CHECK(err && strstr(err, "--serde and a \"serde\" inside --l2 both given; use one\n"));
    free(out);
    free(err);
}

int main(void)
{
    const char *bin = getenv("KVS_TEST_BIN_DIR");
    snprintf(tool, sizeof tool, "%s/kvserde", bin ? bin : ".");
    snprintf(dir, sizeof dir, "/tmp/kvs-test-tool-store-XXXXXX");
    if (mkdtemp(dir) == NULL) return 1;
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(outp, sizeof outp, "%s/stdout", dir);
    snprintf(errp, sizeof errp, "%s/stderr", dir);
    RUN(test_verify_counts_and_delete);
    RUN(test_verify_encrypted);
    RUN(test_verify_warns_about_open_modes);
    RUN(test_verify_usage);
    srand((unsigned)getpid());
    RUN(test_verify_redis);
    if (redis_pid > 0) { /* a failed check left it running */
        kill(redis_pid, SIGKILL);
        waitpid(redis_pid, NULL, 0);
    }
    RUN(test_demo_serde_with_l2);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return TEST_SUMMARY();
}
