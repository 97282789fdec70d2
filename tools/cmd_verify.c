/* kvserde verify - scrub a store: list every stored object through its
 * adapter (kvs_l2_list_keys), read it raw, check its frame, checksums and
 * (with key files) encryption tags, and count what is ok, damaged, foreign
 * (written for another key) or unframed. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commands.h"
#include "frames.h"
#include "kvserde/kvserde.h"

static const char verify_usage[] =
    "usage: kvserde verify [--key-file F]... [--delete-damaged] (--l2 SPEC | DIR)\n"
    "\n"
    "Reads every object of a store and checks it without decoding it: the frame\n"
    "header, the binding to the object's key, every checksum and, with key files,\n"
    "the aes_gcm tags. Prints how many objects are\n"
    "  ok           a frame that passed every check\n"
    "  damaged      a frame that failed one (truncated, bad CRC or checksum, bad tag)\n"
    "  foreign      a frame written for another key (copied or renamed)\n"
    "  unsupported  a frame of a format version or stage this build does not know\n"
    "  unverified   encrypted, and no --key-file given\n"
    "  unframed     not a frame (plain fp8, kv_split or raw bytes): not checkable\n"
    "and lists the damaged ones (by kvs_fs_key_path: the file below an fs store,\n"
    "the Redis key without its key_prefix).\n"
    "\n"
    "  --l2 SPEC          any adapter spec ({\"type\": \"redis\", \"url\": ...}); its\n"
    "                     \"serde\" is ignored (objects are read as stored); or\n"
    "  DIR                an fs store's directory ({\"type\": \"fs\", \"path\": DIR})\n"
    "  --key-file F       an aes_gcm key file (repeatable), to check tags\n"
    "  --delete-damaged   delete the damaged objects (through the adapter)\n"
    "  -h, --help         show this help\n"
    "\n"
    "For an fs store it also warns about objects and directories more open than the\n"
    "store's mode (the spec's \"mode\", default 0600; a KV cache is derived from\n"
    "users' prompts: docs/security.md). A memory store lives inside its process:\n"
    "a new process's is always empty.\n"
    "\n"
    "Exit status: 0 nothing damaged, 1 a damaged object or a failure, 2 usage error.\n";

enum outcome { OK, DAMAGED, FOREIGN, UNSUPPORTED, UNVERIFIED, UNFRAMED, NOUTCOMES };
static const char *const outcome_name[NOUTCOMES] = {"ok",          "damaged",    "foreign",
                                                    "unsupported", "unverified", "unframed"};

#define BATCH 32 /* keys loaded per task */

/* The scrub's state. */
typedef struct scrub {
    kvs_l2_adapter *l2;
    int load_fd;
    kvs_deserializer *de;
    size_t counts[NOUTCOMES];
    size_t objects, failures;
    int progress;
    kvs_object_key batch[BATCH];
    size_t nbatch;
    kvs_object_key *damaged;
    size_t ndamaged, damaged_cap;
    /* fs stores only (root_fd >= 0): the open-mode check */
    int root_fd;
    const char *root;
    mode_t file_mode, dir_mode; /* the store's configured modes */
    size_t open_files, open_dirs;
    char open_example[4096];
    char **dirs; /* the directories holding objects, relative, repeated */
    size_t ndirs, dirs_cap;
} scrub;

static enum outcome classify(scrub *S, const uint8_t *blob, size_t len,
                             const kvs_object_key *key)
{
    if (!kvs_frame_detect(blob, len)) return UNFRAMED;
    int rc = kvs_pipeline_verify(S->de, blob, len, key);
    switch (rc) {
    case KVS_OK: return OK;
    case KVS_EKEY: return FOREIGN;
    case KVS_EUNSUPPORTED: return UNSUPPORTED;
    case KVS_EAUTH:
        /* Without key files nothing can authenticate: say so rather than
         * call it damaged. */
        return strstr(kvs_last_error(), "no configured key") ? UNVERIFIED : DAMAGED;
    default: return DAMAGED;
    }
}

static void note_open(scrub *S, const char *rel, mode_t mode, int is_dir)
{
    /* more open to group or others than the store's configured mode */
    if ((mode & 077 & ~(is_dir ? S->dir_mode : S->file_mode)) == 0) return;
    if (is_dir)
        S->open_dirs++;
    else
        S->open_files++;
    if (S->open_example[0] == '\0')
        snprintf(S->open_example, sizeof S->open_example, "%s%s%s (mode %04o)", S->root,
                 *rel ? "/" : "", rel, (unsigned)(mode & 07777));
}

static int grow(void **items, size_t *cap, size_t n, size_t size)
{
    if (n < *cap) return 0;
    size_t c = *cap ? 2 * *cap : 64;
    void *g = realloc(*items, c * size);
    if (g == NULL) return -1;
    *items = g;
    *cap = c;
    return 0;
}

/* fs: the object's mode now, its directories' after the listing. */
static int check_modes(scrub *S, const char *rel)
{
    struct stat st;
    if (fstatat(S->root_fd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0) note_open(S, rel, st.st_mode, 0);
    for (const char *p = strchr(rel, '/'); p; p = strchr(p + 1, '/')) {
        char *dir = strndup(rel, (size_t)(p - rel));
        if (dir == NULL || grow((void **)&S->dirs, &S->dirs_cap, S->ndirs, sizeof *S->dirs)) {
            free(dir);
            return -1;
        }
        S->dirs[S->ndirs++] = dir;
    }
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* fs: each directory holding objects once, and the root. */
static void check_dir_modes(scrub *S)
{
    struct stat st;
    if (fstat(S->root_fd, &st) == 0) note_open(S, "", st.st_mode, 1);
    qsort(S->dirs, S->ndirs, sizeof *S->dirs, by_name);
    for (size_t i = 0; i < S->ndirs; i++) {
        if (i > 0 && strcmp(S->dirs[i], S->dirs[i - 1]) == 0) continue;
        if (fstatat(S->root_fd, S->dirs[i], &st, AT_SYMLINK_NOFOLLOW) == 0)
            note_open(S, S->dirs[i], st.st_mode, 1);
    }
}

static void record(scrub *S, const kvs_object_key *key, const uint8_t *blob, size_t len)
{
    char name[KVS_FS_KEY_PATH_MAX];
    kvs_fs_key_path(key, name, sizeof name);
    if (S->root_fd >= 0 && check_modes(S, name) != 0) S->failures++;
    enum outcome o = classify(S, blob, len, key);
    S->counts[o]++;
    S->objects++;
    if (o == FOREIGN || o == UNSUPPORTED || o == DAMAGED)
        printf("%-8s %s: %s\n", outcome_name[o], name, kvs_last_error());
    if (o == DAMAGED) {
        if (grow((void **)&S->damaged, &S->damaged_cap, S->ndamaged, sizeof *S->damaged)) {
            fprintf(stderr, "kvserde verify: out of memory\n");
            S->failures++;
        } else {
            S->damaged[S->ndamaged++] = *key;
        }
    }
    if (S->progress && S->objects % 256 == 0) {
        fprintf(stderr, "\rverify: %zu objects read", S->objects);
        fflush(stderr);
    }
}

/* Load the batch's keys raw (byte buffers of each object's stored size)
 * and classify each. A key gone since it was listed is skipped. */
static int flush_batch(scrub *S)
{
    size_t n = S->nbatch;
    S->nbatch = 0;
    if (n == 0) return KVS_OK;
    int64_t sizes[BATCH];
    kvs_memobj *objs[BATCH];
    kvs_object_key keys[BATCH];
    size_t m = 0;
    int rc = kvs_l2_object_sizes(S->l2, S->batch, n, sizes);
    if (rc != KVS_OK) return rc;
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] < 0) continue; /* deleted since listed */
        if (sizes[i] == 0) {        /* nothing to load: an empty object */
            record(S, &S->batch[i], NULL, 0);
            continue;
        }
        kvs_layout l;
        if ((rc = kvs_layout_flat(&l, (uint64_t)sizes[i], KVS_DTYPE_UINT8)) != KVS_OK ||
            (rc = kvs_memobj_alloc(&l, KVS_FMT_BINARY_BUFFER, &objs[m])) != KVS_OK)
            break;
        keys[m++] = S->batch[i];
    }
    kvs_l2_task_id id;
    kvs_l2_bitmap bm = {0};
    if (rc == KVS_OK && m > 0 && (rc = kvs_l2_submit_load(S->l2, keys, objs, m, &id)) == KVS_OK) {
        while ((rc = kvs_l2_query_load(S->l2, id, &bm)) == KVS_OK &&
               bm.state == KVS_TASK_PENDING) {
            struct pollfd p = {S->load_fd, POLLIN, 0};
            if (poll(&p, 1, 1000) > 0) kvs_event_fd_consume(S->load_fd, NULL);
        }
        for (size_t i = 0; rc == KVS_OK && i < m; i++) {
            if (bm.hits && bm.hits[i]) {
                record(S, &keys[i], objs[i]->data, kvs_memobj_size(objs[i]));
                continue;
            }
            /* shrunk or grown since sized, or unreadable: the load says */
            char name[KVS_FS_KEY_PATH_MAX];
            kvs_fs_key_path(&keys[i], name, sizeof name);
            fprintf(stderr, "kvserde verify: cannot read %s: %s\n", name, bm.message);
            S->failures++;
        }
        kvs_l2_bitmap_release(&bm);
    }
    for (size_t i = 0; i < m; i++) kvs_memobj_free(objs[i]);
    return rc;
}

static int visit(void *ctx, const kvs_object_key *key)
{
    scrub *S = ctx;
    S->batch[S->nbatch++] = *key;
    return S->nbatch == BATCH ? flush_batch(S) : 0;
}

/* The adapter spec: DIR as an fs spec, or --l2 without its serde (the
 * objects are read as stored). For an fs store, its directory and its
 * configured file mode (the spec's "mode", an octal string, else the fs
 * default 0600). */
static json_t *raw_spec(const char *spec, const char *dir, const char **root, mode_t *mode)
{
    *mode = 0600;
    *root = NULL;
    json_t *j;
    if (dir) {
        j = json_pack("{s:s,s:s,s:b}", "type", "fs", "path", dir, "create", 0);
    } else {
        json_error_t err;
        j = json_loads(spec, JSON_REJECT_DUPLICATES, &err);
        if (j == NULL) {
            fprintf(stderr, "kvserde verify: --l2 is not JSON: %s (line %d)\n", err.text,
                    err.line);
            return NULL;
        }
        if (!json_is_object(j)) {
            fprintf(stderr, "kvserde verify: --l2 must be a JSON object\n");
            json_decref(j);
            return NULL;
        }
        json_object_del(j, "serde");
        json_object_del(j, "serde_pool_bytes");
    }
    const char *type = json_string_value(json_object_get(j, "type"));
    if (type == NULL || strcmp(type, "fs") != 0) return j;
    *root = json_string_value(json_object_get(j, "path"));
    const char *m = json_string_value(json_object_get(j, "mode"));
    if (m) {
        char *end;
        long v = strtol(m, &end, 8);
        if (*m == '\0' || *end != '\0' || v < 0 || v > 0777) {
            fprintf(stderr, "kvserde verify: --l2 \"mode\" must be an octal string such as "
                            "\"0640\", got '%s'\n", m);
            json_decref(j);
            return NULL;
        }
        *mode = (mode_t)v;
    }
    return j;
}

static int delete_damaged(scrub *S)
{
    uint8_t *deleted = calloc(S->ndamaged ? S->ndamaged : 1, 1);
    int rc = deleted ? kvs_l2_delete(S->l2, S->damaged, S->ndamaged, deleted) : KVS_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; deleted && i < S->ndamaged; i++) n += deleted[i] != 0;
    if (deleted) printf("deleted %zu of %zu damaged objects\n", n, S->ndamaged);
    free(deleted);
    return rc;
}

int kvs_cmd_verify(int argc, char **argv)
{
    static const struct option opts[] = {{"l2", required_argument, NULL, 'l'},
                                         {"key-file", required_argument, NULL, 'k'},
                                         {"delete-damaged", no_argument, NULL, 'd'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *spec = NULL;
    char *key_files[KVS_TOOL_MAX_KEY_FILES];
    size_t nkeys = 0;
    int del = 0, c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case 'l': spec = optarg; break;
        case 'k':
            if (kvs_tool_add_key_file("verify", key_files, &nkeys, optarg) != 0) return 2;
            break;
        case 'd': del = 1; break;
        case 'h': fputs(verify_usage, stdout); return 0;
        default: fputs(verify_usage, stderr); return 2;
        }
    }
    const char *dir = optind < argc ? argv[optind] : NULL;
    if ((spec == NULL) == (dir == NULL) || argc - optind > 1) {
        fprintf(stderr, "kvserde verify: give the store as --l2 SPEC or as DIR (one of them)\n");
        fputs(verify_usage, stderr);
        return 2;
    }
    scrub S = {0};
    S.root_fd = -1;
    const char *path;
    mode_t mode;
    json_t *j = raw_spec(spec, dir, &path, &mode);
    if (j == NULL) return 1;
    const char *type = json_string_value(json_object_get(j, "type"));
    char where[4200], *root = path ? strdup(path) : NULL;
    if (root) {
        size_t len = strlen(root);
        while (len > 1 && root[len - 1] == '/') root[--len] = '\0';
        snprintf(where, sizeof where, "%s", root);
        S.root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (S.root_fd < 0) {
            fprintf(stderr, "kvserde verify: %s is not a directory\n", root);
            free(root);
            json_decref(j);
            return 1;
        }
    } else {
        snprintf(where, sizeof where, "the %s store", type ? type : "?");
    }
    kvs_serde_pair pair = {0};
    int status = 1;
    if (kvs_l2_create_json(j, &S.l2) != KVS_OK ||
        kvs_tool_frame_deserializer(key_files, nkeys, NULL, &pair) != KVS_OK) {
        fprintf(stderr, "kvserde verify: %s\n", kvs_last_error());
        goto out;
    }
    S.load_fd = kvs_l2_load_event_fd(S.l2);
    S.de = pair.deserializer;
    S.progress = isatty(STDERR_FILENO);
    S.root = root;
    S.file_mode = mode;
    /* directories: an execute bit wherever the mode reads (the fs adapter's rule) */
    S.dir_mode = mode | (mode & 0444) >> 2;
    status = 0;
    int rc = kvs_l2_list_keys(S.l2, visit, &S);
    if (rc == KVS_OK) rc = flush_batch(&S);
    if (S.progress) fprintf(stderr, "\r\033[K");
    if (rc != KVS_OK) {
        fprintf(stderr, "kvserde verify: listing %s failed: %s\n", where, kvs_last_error());
        status = 1;
    }
    if (S.root_fd >= 0) check_dir_modes(&S);
    printf("verified %zu objects in %s\n", S.objects, where);
    for (int o = 0; o < NOUTCOMES; o++) printf("  %-12s %zu\n", outcome_name[o], S.counts[o]);
    if (S.open_files || S.open_dirs)
        fprintf(stderr,
                "kvserde verify: warning: %zu objects and %zu directories are more open than "
                "mode %04o, e.g. %s; a KV cache reveals users' prompts (docs/security.md)\n",
                S.open_files, S.open_dirs, (unsigned)S.file_mode, S.open_example);
    if (del && S.ndamaged && delete_damaged(&S) != KVS_OK) {
        fprintf(stderr, "kvserde verify: deleting damaged objects: %s\n", kvs_last_error());
        status = 1;
    }
    if (S.counts[DAMAGED] || S.failures) status = 1;
out:
    kvs_l2_destroy(S.l2);
    kvs_serde_pair_destroy(&pair);
    for (size_t i = 0; i < S.ndirs; i++) free(S.dirs[i]);
    free(S.dirs);
    free(S.damaged);
    if (S.root_fd >= 0) close(S.root_fd);
    free(root);
    json_decref(j);
    return status;
}
