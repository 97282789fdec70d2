/* fuzz_l2_spec.c - JSON adapter spec -> kvs_l2_create (l2.h), for the
 * "memory" and "fs" adapters, with or without a "serde" sub-dict.
 *
 * Input: the spec text. Confinement: the fuzzer must not touch the file
 * system outside its own directory, start network clients or thousands of
 * threads, so before the call the spec is parsed and
 *   - an "fs" spec's non-empty string "path" is replaced by a fixed
 *     directory made at start-up (removed at exit), whatever it said;
 *   - a registered type other than "memory" and "fs" (e.g. "redis") is not
 *     created at all; unknown types are (they must be refused);
 *   - valid worker counts above 4 ("workers", "serde"."max_workers") become
 *     4 (counts out of range are kept: they must be refused).
 * Text that is not a JSON object (or has duplicate keys) goes to
 * kvs_l2_create as it is.
 * Properties:
 *   - a refused spec gives a KVS_E* code and a message, and leaks nothing;
 *   - an accepted adapter works: one small object is stored, looked up,
 *     loaded and deleted through it, every task completes with a result
 *     (ok, or failed with a code and a message), an unwrapped adapter gives
 *     back the stored bytes, and destroy releases everything.
 */
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <poll.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "kvserde/l2.h"
#include "kvserde/memobj.h"
#include "kvserde/processor.h"

#define MAX_WORKERS 4
#define WAIT_MS 20000

static char g_dir[256];

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 ? 0 : 0;
}

static void remove_dir(void) { nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    const char *base = getenv("KVS_FUZZ_DIR");
    if (base == NULL) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : NULL;
    if (base == NULL) base = getenv("TMPDIR");
    if (base == NULL) base = "/tmp";
    snprintf(g_dir, sizeof g_dir, "%s/kvs-fuzz-l2-XXXXXX", base);
    if (mkdtemp(g_dir) == NULL) abort();
    atexit(remove_dir);
    return 0;
}

/* A worker count that would be accepted and is above MAX_WORKERS becomes
 * MAX_WORKERS; anything else stays. */
static void clamp_workers(json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL) return;
    double x = -1;
    if (json_is_integer(v)) x = (double)json_integer_value(v);
    else if (json_is_real(v)) x = json_real_value(v);
    else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = strlen(s);
        if (n == 0 || n > 6 || strspn(s, "0123456789") != n) return;
        x = atof(s);
    }
    if (x > MAX_WORKERS && x <= 1024) json_object_set_new(obj, key, json_integer(MAX_WORKERS));
}

/* 1 if the spec may be created, after confining it. */
static int confine(json_t *spec)
{
    json_t *type = json_object_get(spec, "type");
    if (json_is_string(type)) {
        const char *t = json_string_value(type);
        int known = 0;
        const char *names[32];
        size_t n = kvs_l2_types(names, 32);
        for (size_t i = 0; i < n && i < 32; i++)
            if (strcmp(names[i], t) == 0) known = 1;
        if (known && strcmp(t, "memory") != 0 && strcmp(t, "fs") != 0) return 0;
        if (strcmp(t, "fs") == 0) {
            json_t *path = json_object_get(spec, "path");
            if (json_is_string(path) && json_string_length(path) > 0)
                json_object_set_new(spec, "path", json_string(g_dir));
        }
    }
    clamp_workers(spec, "workers");
    json_t *serde = json_object_get(spec, "serde");
    if (json_is_object(serde)) clamp_workers(serde, "max_workers");
    return 1;
}

static int wait_fd(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    int r;
    do r = poll(&p, 1, WAIT_MS);
    while (r < 0 && errno == EINTR);
    return r > 0;
}

/* A finished lookup or load; a load's miss (not a lookup's) has a reason. */
static void check_bitmap(const kvs_l2_bitmap *b, const char *what, int load)
{
    FZ_ASSERT(b->state == KVS_TASK_OK || b->state == KVS_TASK_FAILED, "%s: state %d", what,
              (int)b->state);
    if (b->state == KVS_TASK_FAILED || (load && b->nhits < b->nkeys))
        FZ_ASSERT(b->status < 0 && b->message[0], "%s: a miss without a reason (status %d)", what,
                  b->status);
}

/* Store, look up, load and delete one object. */
static void exercise(kvs_l2_adapter *a)
{
    static const uint8_t hash[4] = {1, 2, 3, 4};
    kvs_object_key key;
    FZ_ASSERT(kvs_object_key_init(&key, hash, sizeof hash, "fuzz/model", 0, 0, "") == KVS_OK,
              "key");
    kvs_layout layout;
    FZ_ASSERT(kvs_layout_flat(&layout, 64, KVS_DTYPE_BFLOAT16) == KVS_OK, "layout");
    uint16_t src[64], dst[64];
    for (int i = 0; i < 64; i++) src[i] = (uint16_t)(0x3f80 + i);
    memset(dst, 0, sizeof dst);
    kvs_memobj so, dobj;
    FZ_ASSERT(kvs_memobj_init(&so, src, sizeof src, &layout, KVS_FMT_KV_2LTD) == KVS_OK, "src");
    FZ_ASSERT(kvs_memobj_init(&dobj, dst, sizeof dst, &layout, KVS_FMT_KV_2LTD) == KVS_OK, "dst");
    kvs_memobj *sp = &so, *dp = &dobj;
    int wrapped = strcmp(a->ops->name, "serde") == 0;

    kvs_l2_task_id id;
    int rc = kvs_l2_submit_store(a, &key, &sp, 1, &id);
    int stored = 0;
    if (rc != KVS_OK) {
        FZ_ASSERT_REFUSAL(rc, "submit_store");
    } else {
        kvs_l2_store_result r;
        size_t cnt = 0;
        while (cnt == 0) {
            FZ_ASSERT(kvs_l2_pop_completed_stores(a, &r, 1, &cnt) == KVS_OK, "pop");
            if (cnt) break;
            FZ_ASSERT(wait_fd(kvs_l2_store_event_fd(a)), "store task never completed");
            kvs_event_fd_consume(kvs_l2_store_event_fd(a), NULL);
        }
        FZ_ASSERT(r.id == id, "store result for task %" PRIu64 ", submitted %" PRIu64, r.id, id);
        if (r.state == KVS_TASK_OK) stored = 1;
        else FZ_ASSERT(r.state == KVS_TASK_FAILED && r.status < 0 && r.message[0],
                       "store: state %d status %d", (int)r.state, r.status);
    }

    for (int load = 0; load < 2; load++) {
        rc = load ? kvs_l2_submit_load(a, &key, &dp, 1, &id)
                  : kvs_l2_submit_lookup_and_lock(a, &key, 1, &id);
        if (rc != KVS_OK) {
            FZ_ASSERT_REFUSAL(rc, load ? "submit_load" : "submit_lookup_and_lock");
            continue;
        }
        kvs_l2_bitmap b;
        for (;;) {
            rc = load ? kvs_l2_query_load(a, id, &b) : kvs_l2_query_lookup_and_lock(a, id, &b);
            FZ_ASSERT(rc == KVS_OK, "query");
            if (b.state != KVS_TASK_PENDING) break;
            int fd = load ? kvs_l2_load_event_fd(a) : kvs_l2_lookup_event_fd(a);
            FZ_ASSERT(wait_fd(fd), "%s task never completed", load ? "load" : "lookup");
            kvs_event_fd_consume(fd, NULL);
        }
        check_bitmap(&b, load ? "load" : "lookup", load);
        if (stored) FZ_ASSERT(b.nhits == 1, "%s missed a stored key: %s",
                              load ? "load" : "lookup", b.message);
        if (load && b.nhits == 1 && !wrapped)
            FZ_ASSERT(memcmp(src, dst, sizeof src) == 0, "loaded bytes differ");
        kvs_l2_bitmap_release(&b);
        if (!load) FZ_ASSERT(kvs_l2_unlock(a, &key, 1) == KVS_OK, "unlock");
    }
    uint8_t deleted = 0;
    rc = kvs_l2_delete(a, &key, 1, &deleted);
    if (rc != KVS_OK) FZ_ASSERT_REFUSAL(rc, "delete");
    json_t *st = NULL;
    FZ_ASSERT(kvs_l2_status(a, &st) == KVS_OK && json_is_object(st), "status");
    json_decref(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text == NULL) return 0;
    memcpy(text, data, size);
    text[size] = '\0';

    kvs_l2_adapter *a = NULL;
    int rc;
    json_t *spec = json_loads(text, JSON_REJECT_DUPLICATES, NULL); /* as kvs_l2_create */
    if (json_is_object(spec)) {
        if (!confine(spec)) {
            json_decref(spec);
            free(text);
            return 0;
        }
        rc = kvs_l2_create_json(spec, &a);
    } else {
        rc = kvs_l2_create(text, &a);
        FZ_ASSERT(rc != KVS_OK, "a spec that is not a JSON object was accepted");
    }
    json_decref(spec);
    free(text);

    if (rc != KVS_OK) {
        FZ_ASSERT_REFUSAL(rc, "kvs_l2_create");
        return 0;
    }
    FZ_ASSERT(a != NULL, "accepted without an adapter");
    exercise(a);
    FZ_ASSERT(kvs_l2_close(a) == KVS_OK, "close");
    kvs_l2_destroy(a);
    return 0;
}
