/* kvserde verify - scrub a filesystem store: read every stored object, check
 * its frame, checksums and (with key files) encryption tags, and count what
 * is ok, damaged, foreign (written for another key) or unframed. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
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
    "Reads every object of a filesystem store and checks it without decoding it:\n"
    "the frame header, the binding to the object's key, every checksum and, with\n"
    "key files, the aes_gcm tags. Prints how many objects are\n"
    "  ok           a frame that passed every check\n"
    "  damaged      a frame that failed one (truncated, bad CRC or checksum, bad tag)\n"
    "  foreign      a frame written for another key (copied or renamed)\n"
    "  unsupported  a frame of a format version or stage this build does not know\n"
    "  unverified   encrypted, and no --key-file given\n"
    "  unframed     not a frame (plain fp8, kv_split or raw bytes): not checkable\n"
    "and lists the damaged ones.\n"
    "\n"
    "  --l2 SPEC          an fs adapter spec ({\"type\": \"fs\", \"path\": ...}); or\n"
    "                     give the store's directory as DIR\n"
    "  --key-file F       an aes_gcm key file (repeatable), to check tags\n"
    "  --delete-damaged   delete the damaged objects (through the fs adapter)\n"
    "  -h, --help         show this help\n"
    "\n"
    "It also warns about objects and directories more open than the store's mode\n"
    "(the spec's \"mode\", default 0600; a KV cache is derived from users' prompts:\n"
    "docs/security.md).\n"
    "\n"
    "Exit status: 0 nothing damaged, 1 a damaged object or a failure, 2 usage error.\n";

enum outcome { OK, DAMAGED, FOREIGN, UNSUPPORTED, UNVERIFIED, UNFRAMED, NOUTCOMES };
static const char *const outcome_name[NOUTCOMES] = {"ok",          "damaged",    "foreign",
                                                    "unsupported", "unverified", "unframed"};

/* The scrub's state: nftw's callback takes no context pointer. */
static struct scrub {
    const char *root;
    size_t root_len;
    kvs_deserializer *de;
    size_t counts[NOUTCOMES];
    size_t objects, open_files, open_dirs, failures;
    mode_t file_mode, dir_mode; /* the store's configured modes */
    char open_example[4096];
    kvs_object_key *damaged;
    size_t ndamaged, damaged_cap;
    int progress;
} S;

static int read_file(const char *path, uint8_t **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *buf = malloc(n ? n : 1);
    while (buf && got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) continue;
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    if (buf == NULL || got != n) {
        free(buf);
        return -1;
    }
    *out = buf;
    *len = n;
    return 0;
}

static enum outcome classify(const uint8_t *blob, size_t len, const kvs_object_key *key)
{
    if (!kvs_frame_detect(blob, len)) return UNFRAMED;
    int rc = kvs_pipeline_verify(S.de, blob, len, key);
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

static void note_open(const char *path, mode_t mode, int is_dir)
{
    /* more open to group or others than the store's configured mode */
    if ((mode & 077 & ~(is_dir ? S.dir_mode : S.file_mode)) == 0) return;
    if (is_dir)
        S.open_dirs++;
    else
        S.open_files++;
    if (S.open_example[0] == '\0')
        snprintf(S.open_example, sizeof S.open_example, "%s (mode %04o)", path,
                 (unsigned)(mode & 07777));
}

static int visit(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    const char *base = path + ftw->base;
    if (ftw->level > 0 && base[0] == '.') /* temp files, markers: never objects */
        return flag == FTW_D ? FTW_SKIP_SUBTREE : FTW_CONTINUE;
    if (flag == FTW_D) {
        note_open(path, st->st_mode, 1);
        return FTW_CONTINUE;
    }
    if (flag != FTW_F) return FTW_CONTINUE; /* symlinks and the rest: not objects */
    kvs_object_key key;
    if (kvs_fs_path_key(path + S.root_len + 1, &key) != KVS_OK) return FTW_CONTINUE;
    note_open(path, st->st_mode, 0);
    uint8_t *blob;
    size_t len;
    if (read_file(path, &blob, &len) != 0) {
        fprintf(stderr, "kvserde verify: cannot read %s: %s\n", path, strerror(errno));
        S.failures++;
        return FTW_CONTINUE;
    }
    enum outcome o = classify(blob, len, &key);
    free(blob);
    S.counts[o]++;
    S.objects++;
    if (o == FOREIGN || o == UNSUPPORTED)
        printf("%-8s %s: %s\n", outcome_name[o], path + S.root_len + 1, kvs_last_error());
    if (o == DAMAGED) {
        printf("damaged  %s: %s\n", path + S.root_len + 1, kvs_last_error());
        if (S.ndamaged == S.damaged_cap) {
            size_t cap = S.damaged_cap ? 2 * S.damaged_cap : 64;
            kvs_object_key *grown = realloc(S.damaged, cap * sizeof *grown);
            if (grown == NULL) return FTW_STOP;
            S.damaged = grown;
            S.damaged_cap = cap;
        }
        S.damaged[S.ndamaged++] = key;
    }
    if (S.progress && S.objects % 256 == 0) {
        fprintf(stderr, "\rverify: %zu objects read", S.objects);
        fflush(stderr);
    }
    return FTW_CONTINUE;
}

/* The store's directory from DIR or an fs spec, and its configured file
 * mode (the spec's "mode", an octal string, else the fs default 0600). */
static int store_dir(const char *spec, const char *dir, char **out, mode_t *mode)
{
    *mode = 0600;
    if (dir) {
        *out = strdup(dir);
        return *out ? 0 : -1;
    }
    json_error_t err;
    json_t *j = json_loads(spec, JSON_REJECT_DUPLICATES, &err);
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *path = json_string_value(json_object_get(j, "path"));
    int rc = 0;
    if (j == NULL) {
        fprintf(stderr, "kvserde verify: --l2 is not JSON: %s (line %d)\n", err.text, err.line);
        rc = -1;
    } else if (type == NULL || strcmp(type, "fs") != 0 || path == NULL) {
        fprintf(stderr,
                "kvserde verify: --l2 must be an fs spec with a \"path\" (got type '%s'); "
                "only a filesystem store can be listed object by object\n",
                type ? type : "(none)");
        rc = -1;
    } else if ((*out = strdup(path)) == NULL) {
        rc = -1;
    }
    const char *m = json_string_value(json_object_get(j, "mode"));
    if (rc == 0 && m) {
        char *end;
        long v = strtol(m, &end, 8);
        if (*m == '\0' || *end != '\0' || v < 0 || v > 0777) {
            fprintf(stderr, "kvserde verify: --l2 \"mode\" must be an octal string such as "
                            "\"0640\", got '%s'\n", m);
            free(*out);
            rc = -1;
        } else {
            *mode = (mode_t)v;
        }
    }
    json_decref(j);
    return rc;
}

static int delete_damaged(const char *dir)
{
    json_t *spec = json_pack("{s:s,s:s,s:b}", "type", "fs", "path", dir, "create", 0);
    kvs_l2_adapter *fs;
    int rc = kvs_l2_create_json(spec, &fs);
    json_decref(spec);
    if (rc) return rc;
    uint8_t *deleted = calloc(S.ndamaged ? S.ndamaged : 1, 1);
    rc = deleted ? kvs_l2_delete(fs, S.damaged, S.ndamaged, deleted) : KVS_ENOMEM;
    size_t n = 0;
    for (size_t i = 0; deleted && i < S.ndamaged; i++) n += deleted[i] != 0;
    if (deleted) printf("deleted %zu of %zu damaged objects\n", n, S.ndamaged);
    free(deleted);
    kvs_l2_destroy(fs);
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
    char *root;
    mode_t mode;
    if (store_dir(spec, dir, &root, &mode) != 0) return 1;
    size_t len = strlen(root);
    while (len > 1 && root[len - 1] == '/') root[--len] = '\0';
    struct stat st;
    if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kvserde verify: %s is not a directory\n", root);
        free(root);
        return 1;
    }
    kvs_serde_pair pair;
    if (kvs_tool_frame_deserializer(key_files, nkeys, &pair) != KVS_OK) {
        fprintf(stderr, "kvserde verify: %s\n", kvs_last_error());
        free(root);
        return 1;
    }
    memset(&S, 0, sizeof S);
    S.root = root;
    S.root_len = len;
    S.de = pair.deserializer;
    S.progress = isatty(STDERR_FILENO);
    S.file_mode = mode;
    /* directories: an execute bit wherever the mode reads (the fs adapter's rule) */
    S.dir_mode = mode | (mode & 0444) >> 2;
    int walk = nftw(root, visit, 32, FTW_PHYS | FTW_ACTIONRETVAL);
    if (S.progress) fprintf(stderr, "\r\033[K");
    int status = 0;
    if (walk != 0) {
        fprintf(stderr, "kvserde verify: listing %s failed: %s\n", root, strerror(errno));
        status = 1;
    }
    printf("verified %zu objects in %s\n", S.objects, root);
    for (int o = 0; o < NOUTCOMES; o++) printf("  %-12s %zu\n", outcome_name[o], S.counts[o]);
    if (S.open_files || S.open_dirs)
        fprintf(stderr,
                "kvserde verify: warning: %zu objects and %zu directories are more open than "
                "mode %04o, e.g. %s; a KV cache reveals users' prompts (docs/security.md)\n",
                S.open_files, S.open_dirs, (unsigned)S.file_mode, S.open_example);
    if (del && S.ndamaged && delete_damaged(root) != KVS_OK) {
        fprintf(stderr, "kvserde verify: deleting damaged objects: %s\n", kvs_last_error());
        status = 1;
    }
    if (S.counts[DAMAGED] || S.failures) status = 1;
    free(S.damaged);
    kvs_serde_pair_destroy(&pair);
    free(root);
    return status;
}
