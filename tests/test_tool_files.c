/* test_tool_files.c - end to end: runs the built `kvserde` tool's encode,
 * decode and inspect commands on safetensors files written here, and checks
 * every output byte against the library's fp8 kernels, every message and
 * every exit status, and that a failed run leaves no file behind.
 *
 * The tool is $KVS_TEST_BIN_DIR/kvserde (CMake sets the variable). Files are
 * written and read back with this file's own minimal safetensors code, so
 * the tool's reader and writer are checked against an independent one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "codecs/half.h"
#include "kvs_test.h"
#include "kvserde/kvserde.h"

extern char **environ;

static char tool[4096];
static char root_dir[4096]; /* mkdtemp: io/ holds captured output, work/ the files */
static char io_dir[4200];
static char work[4200];
static double last_run_cpu_s; /* user + system CPU seconds of the last run */

/* ----- small helpers ----------------------------------------------------- */

static char *path_in(const char *name)
{
    static char bufs[8][4400];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", work, name);
    return b;
}

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t r;
    while (buf && (r = fread(buf + n, 1, cap - n, f)) > 0) {
        n += r;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (nb == NULL) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    if (len) *len = n;
    return buf;
}

static int write_all_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL) return -1;
    size_t w = len ? fwrite(data, 1, len, f) : 0;
    return fclose(f) == 0 && w == len ? 0 : -1;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Run the tool with the given arguments (NULL-terminated), optionally with
 * one extra environment entry. Returns the exit status (128 + signal if it
 * died); *out / *err receive what it printed (malloc'd) unless NULL. */
static int run_env(const char *env_entry, char **out, char **err, const char *const *args)
{
    char *argv[32];
    size_t argc = 0;
    argv[argc++] = tool;
    for (size_t i = 0; args[i] && argc < 31; i++) argv[argc++] = (char *)args[i];
    argv[argc] = NULL;

    char opath[4300], epath[4300];
    snprintf(opath, sizeof opath, "%s/stdout", io_dir);
    snprintf(epath, sizeof epath, "%s/stderr", io_dir);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, opath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, epath, O_WRONLY | O_CREAT | O_TRUNC, 0644);

    char **envp = environ;
    char **extra = NULL;
    if (env_entry) {
        size_t n = 0;
        while (environ[n]) n++;
        extra = calloc(n + 2, sizeof *extra);
        for (size_t i = 0; i < n; i++) extra[i] = environ[i];
        extra[n] = (char *)env_entry;
        envp = extra;
    }
    pid_t pid;
    int rc = posix_spawn(&pid, tool, &fa, NULL, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    free(extra);
    if (rc != 0) {
        fprintf(stderr, "cannot run %s: %s\n", tool, strerror(rc));
        return -1;
    }
    int status;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
    }
    last_run_cpu_s = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                     (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    if (out) *out = read_all(opath, NULL);
    if (err) *err = read_all(epath, NULL);
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static int run(char **out, char **err, const char *const *args)
{
    return run_env(NULL, out, err, args);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Exit status `code`, stdout empty, stderr exactly `msg`. */
#define CHECK_FAILS(args, code, msg)                                        \
    do {                                                                    \
        char *o_ = NULL, *e_ = NULL;                                        \
        CHECK_EQ_INT(run(&o_, &e_, args), code);                            \
        CHECK_EQ_STR(o_, "");                                               \
        CHECK_EQ_STR(e_, msg);                                              \
        free(o_);                                                           \
        free(e_);                                                           \
    } while (0)

/* Exit status 0, stdout exactly `msg`, stderr empty. */
#define CHECK_PRINTS(args, msg)                                             \
    do {                                                                    \
        char *o_ = NULL, *e_ = NULL;                                        \
        CHECK_EQ_INT(run(&o_, &e_, args), 0);                               \
        CHECK_EQ_STR(o_, msg);                                              \
        CHECK_EQ_STR(e_, "");                                               \
        free(o_);                                                           \
        free(e_);                                                           \
    } while (0)

static char *strf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *strf(const char *fmt, ...)
{
    static char bufs[8][8192];
    static int next;
    char *b = bufs[next++ % 8];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, sizeof bufs[0], fmt, ap);
    va_end(ap);
    return b;
}

/* The names in the work directory, sorted, comma-separated. */
static char *listing(void)
{
    static char buf[4096];
    struct dirent **names;
    int n = scandir(work, &names, NULL, alphasort);
    buf[0] = '\0';
    for (int i = 0; i < n; i++) {
        if (strcmp(names[i]->d_name, ".") && strcmp(names[i]->d_name, "..")) {
            if (buf[0]) strncat(buf, ",", sizeof buf - strlen(buf) - 1);
            strncat(buf, names[i]->d_name, sizeof buf - strlen(buf) - 1);
        }
        free(names[i]);
    }
    if (n >= 0) free(names);
    return buf;
}

/* Remove everything inside `dir` (not dir itself). */
static void clear_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[8192];
    struct stat st;
    while (d && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            chmod(p, 0755);
            clear_dir(p);
            rmdir(p);
        } else {
            unlink(p);
        }
    }
    if (d) closedir(d);
}

/* The header size N of a safetensors file. */
static unsigned long long header_size(const char *path)
{
    size_t len = 0;
    char *buf = read_all(path, &len);
    unsigned long long n = 0;
    for (int i = 7; buf && len >= 8 && i >= 0; i--) n = (n << 8) | (uint8_t)buf[i];
    free(buf);
    return n;
}

/* ----- writing safetensors files (independently of the tool) ------------ */

typedef struct tdesc {
    const char *name;
    const char *dtype;
    const char *shape; /* JSON array text */
    const void *data;
    size_t nbytes;
} tdesc;

/* Tensors in the given order, back to back; `meta` is the __metadata__
 * object's JSON text or NULL; `pad` pads the header to 8 bytes. */
static int write_st(const char *path, const tdesc *t, size_t n, const char *meta, int pad)
{
    char *h = malloc(1 << 16);
    size_t len = 0, off = 0;
    len += (size_t)sprintf(h + len, "{");
    if (meta) len += (size_t)sprintf(h + len, "\"__metadata__\":%s%s", meta, n ? "," : "");
    for (size_t i = 0; i < n; i++) {
        len += (size_t)sprintf(h + len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,"
                                       "\"data_offsets\":[%zu,%zu]}",
                               i ? "," : "", t[i].name, t[i].dtype, t[i].shape, off,
                               off + t[i].nbytes);
        off += t[i].nbytes;
    }
    len += (size_t)sprintf(h + len, "}");
    while (pad && len % 8) h[len++] = ' ';
    size_t total = 8 + len + off;
    uint8_t *buf = malloc(total);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)len >> (8 * i));
    memcpy(buf + 8, h, len);
    off = 8 + len;
    for (size_t i = 0; i < n; i++) {
        if (t[i].nbytes) memcpy(buf + off, t[i].data, t[i].nbytes);
        off += t[i].nbytes;
    }
    int rc = write_all_file(path, buf, total);
    free(buf);
    free(h);
    return rc;
}

/* A raw file: the 8-byte size `n`, then `header`, then `ndata` zero bytes. */
static void write_raw(const char *path, uint64_t n, const char *header, size_t ndata)
{
    size_t hl = strlen(header);
    uint8_t *buf = calloc(1, 8 + hl + ndata);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(n >> (8 * i));
    memcpy(buf + 8, header, hl);
    write_all_file(path, buf, 8 + hl + ndata);
    free(buf);
}

/* ----- reading them back -------------------------------------------------- */

typedef struct stf {
    char *buf;
    size_t len;
    uint64_t n;
    json_t *hdr;
} stf;

static int st_load(const char *path, stf *f)
{
    memset(f, 0, sizeof *f);
    f->buf = read_all(path, &f->len);
    if (f->buf == NULL || f->len < 8) return -1;
    for (int i = 7; i >= 0; i--) f->n = (f->n << 8) | (uint8_t)f->buf[i];
    if (f->n > f->len - 8) return -1;
    f->hdr = json_loadb(f->buf + 8, f->n, 0, NULL);
    return f->hdr ? 0 : -1;
}

static void st_free(stf *f)
{
    json_decref(f->hdr);
    free(f->buf);
}

/* Tensor `name` must have this dtype, shape and byte size; returns its data. */
static const uint8_t *st_get(const stf *f, const char *name, const char *dtype,
                             const char *shape, size_t nbytes)
{
    json_t *t = json_object_get(f->hdr, name);
    if (t == NULL) {
        KVS_FAIL_("tensor '%s' missing", name);
        return NULL;
    }
    CHECK_EQ_STR(json_string_value(json_object_get(t, "dtype")), dtype);
    char *s = json_dumps(json_object_get(t, "shape"), JSON_COMPACT);
    CHECK_EQ_STR(s, shape);
    free(s);
    json_t *offs = json_object_get(t, "data_offsets");
    uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 0));
    uint64_t e = (uint64_t)json_integer_value(json_array_get(offs, 1));
    CHECK_EQ_U64(e - b, nbytes);
    if (e - b != nbytes || 8 + f->n + e > f->len) return NULL;
    return (const uint8_t *)f->buf + 8 + f->n + b;
}

/* __metadata__ as compact JSON with sorted keys ("null" if absent). */
static char *st_meta(const stf *f)
{
    json_t *m = json_object_get(f->hdr, "__metadata__");
    return m ? json_dumps(m, JSON_COMPACT | JSON_SORT_KEYS) : strdup("null");
}

/* ----- the round-trip input ------------------------------------------------ */

static uint16_t all16[65536];     /* every 16-bit pattern */
static const float f32_vals[20] = {
    0.0f,  -0.0f,    1.0f,    -1.5f,     0.1f,      448.0f,   464.0f,
    465.0f, 1e6f,    -1e6f,   INFINITY,  -INFINITY, NAN,      1e-9f,
    57344.0f, 61440.0f, 3.14159f, -2.71828f, 0.001953125f, 240.0f};
static const uint8_t ids[7] = {1, 2, 3, 250, 0, 7, 9};
#define IN_META "{\"format\":\"pt\",\"source\":\"kvserde test\"}"

static const char *write_roundtrip_input(void)
{
    for (unsigned i = 0; i < 65536; i++) all16[i] = (uint16_t)i;
    tdesc t[] = {
        {"bf16_all", "BF16", "[256,256]", all16, sizeof all16},
        {"f16_all", "F16", "[65536]", all16, sizeof all16},
        {"f32", "F32", "[4,5]", f32_vals, sizeof f32_vals},
        {"ids", "U8", "[7]", ids, sizeof ids},
    };
    const char *p = path_in("in.safetensors");
    if (write_st(p, t, 4, IN_META, 1) != 0) return NULL;
    return p;
}

/* The expected codes of the three float tensors for one fp8 config. */
typedef struct expected {
    uint8_t bf16[65536], f16[65536], f32[20];
} expected;

static void expect_codes(kvs_dtype fp8, int saturate, expected *e)
{
    kvs_fp8_encode(all16, KVS_DTYPE_BFLOAT16, e->bf16, fp8, saturate, 65536);
    kvs_fp8_encode(all16, KVS_DTYPE_FLOAT16, e->f16, fp8, saturate, 65536);
    kvs_fp8_encode(f32_vals, KVS_DTYPE_FLOAT32, e->f32, fp8, saturate, 20);
}

/* An encoded file holds exactly the expected codes and metadata. */
static void check_encoded(const char *path, const char *f8, const expected *e,
                          const char *serde_meta)
{
    stf f;
    if (st_load(path, &f) != 0) {
        KVS_FAIL_("cannot load %s", path);
        return;
    }
    CHECK_EQ_INT(f.n % 8, 0);
    CHECK(f.buf[8 + f.n - 1] == ' ' || f.buf[8 + f.n - 1] == '}');
    const uint8_t *p;
    if ((p = st_get(&f, "bf16_all", f8, "[256,256]", 65536))) CHECK(memcmp(p, e->bf16, 65536) == 0);
    if ((p = st_get(&f, "f16_all", f8, "[65536]", 65536))) CHECK(memcmp(p, e->f16, 65536) == 0);
    if ((p = st_get(&f, "f32", f8, "[4,5]", 20))) CHECK(memcmp(p, e->f32, 20) == 0);
    if ((p = st_get(&f, "ids", "U8", "[7]", 7))) CHECK(memcmp(p, ids, 7) == 0);
    char *m = st_meta(&f);
    CHECK_EQ_STR(m, strf("{\"format\":\"pt\",\"kvserde.dtype.bf16_all\":\"bfloat16\","
                         "\"kvserde.dtype.f16_all\":\"float16\",\"kvserde.dtype.f32\":"
                         "\"float32\",\"kvserde.format\":\"1\",\"kvserde.serde\":\"%s\","
                         "\"source\":\"kvserde test\"}",
                         serde_meta));
    free(m);
    CHECK_EQ_U64(json_object_size(f.hdr), 5);
    st_free(&f);
}

/* A decoded file holds the library's decoding of the expected codes, as
 * `as` (or each tensor's original dtype when `as` is negative). */
static void check_decoded(const char *path, kvs_dtype f8, const expected *e, int as)
{
    stf f;
    if (st_load(path, &f) != 0) {
        KVS_FAIL_("cannot load %s", path);
        return;
    }
    static uint8_t want[65536 * 4];
    struct {
        const char *name;
        kvs_dtype orig;
        const char *shape;
        const uint8_t *codes;
        size_t n;
    } ts[] = {{"bf16_all", KVS_DTYPE_BFLOAT16, "[256,256]", e->bf16, 65536},
              {"f16_all", KVS_DTYPE_FLOAT16, "[65536]", e->f16, 65536},
              {"f32", KVS_DTYPE_FLOAT32, "[4,5]", e->f32, 20}};
    for (size_t i = 0; i < 3; i++) {
        kvs_dtype dt = as < 0 ? ts[i].orig : (kvs_dtype)as;
        const char *stname = dt == KVS_DTYPE_FLOAT32   ? "F32"
                             : dt == KVS_DTYPE_FLOAT16 ? "F16"
                                                       : "BF16";
        size_t nb = ts[i].n * kvs_dtype_size(dt);
        CHECK_OK(kvs_fp8_decode(ts[i].codes, f8, want, dt, ts[i].n));
        const uint8_t *p = st_get(&f, ts[i].name, stname, ts[i].shape, nb);
        if (p) {
            CHECK(memcmp(p, want, nb) == 0);
        }
    }
    const uint8_t *p;
    if ((p = st_get(&f, "ids", "U8", "[7]", 7))) CHECK(memcmp(p, ids, 7) == 0);
    char *m = st_meta(&f);
    CHECK_EQ_STR(m, IN_META);
    free(m);
    CHECK_EQ_U64(json_object_size(f.hdr), 5);
    st_free(&f);
}

/* ----- tests -------------------------------------------------------------- */

static void test_roundtrip_e4m3(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    static expected e;
    expect_codes(KVS_DTYPE_FLOAT8_E4M3FN, 1, &e);
    const char *enc = path_in("enc.safetensors"), *dec = path_in("dec.safetensors");

    char *out = NULL, *err = NULL;
    CHECK_EQ_INT(run(&out, &err, ARGS("encode", in, enc)), 0);
    CHECK_EQ_STR(out, strf("%s: encoded 3 of 4 tensors with {\"type\":\"fp8\"}; data 262231 "
                           "-> 131099 bytes\n",
                           enc));
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);
    check_encoded(enc, "F8_E4M3", &e, "{\\\"type\\\":\\\"fp8\\\"}");

    /* The scalar kernels give the same file as the dispatched ones. */
    const char *enc2 = path_in("enc_scalar.safetensors");
    CHECK_EQ_INT(run_env("KVSERDE_ISA=scalar", NULL, NULL, ARGS("encode", in, enc2)), 0);
    size_t l1 = 0, l2 = 0;
    char *a = read_all(enc, &l1), *b = read_all(enc2, &l2);
    CHECK(a && b && l1 == l2 && memcmp(a, b, l1) == 0);
    free(a);
    free(b);

    CHECK_EQ_INT(run(&out, &err, ARGS("decode", enc, dec)), 0);
    CHECK_EQ_STR(out, strf("%s: decoded 3 of 4 tensors; data 131099 -> 262231 bytes\n", dec));
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);
    check_decoded(dec, KVS_DTYPE_FLOAT8_E4M3FN, &e, -1);
    CHECK_EQ_STR(listing(), "dec.safetensors,enc.safetensors,enc_scalar.safetensors,in.safetensors");
}

/* --tensor: only the tensors named are encoded, the others (float ones
 * too) are copied byte for byte and get no kvserde.dtype entry; decode
 * restores the file. A name IN lacks, or a tensor that is not float, is
 * refused before OUT is written. */
static void test_selected_tensors(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    static expected e;
    expect_codes(KVS_DTYPE_FLOAT8_E4M3FN, 1, &e);
    const char *enc = path_in("enc.safetensors"), *dec = path_in("dec.safetensors");
    CHECK_PRINTS(ARGS("encode", "--tensor", "f32", "--tensor", "bf16_all", in, enc),
                 /* 65536 + 20 codes, 131072 + 7 bytes kept */
                 strf("%s: encoded 2 of 4 tensors with {\"type\":\"fp8\"}; data 262231 "
                      "-> 196635 bytes\n",
                      enc));
    stf f;
    REQUIRE(st_load(enc, &f) == 0);
    const uint8_t *b = st_get(&f, "bf16_all", "F8_E4M3", "[256,256]", 65536);
    CHECK(b && memcmp(b, e.bf16, 65536) == 0);
    const uint8_t *x = st_get(&f, "f32", "F8_E4M3", "[4,5]", 20);
    CHECK(x && memcmp(x, e.f32, 20) == 0);
    const uint8_t *h = st_get(&f, "f16_all", "F16", "[65536]", sizeof all16);
    CHECK(h && memcmp(h, all16, sizeof all16) == 0); /* kept as it was */
    const uint8_t *u = st_get(&f, "ids", "U8", "[7]", sizeof ids);
    CHECK(u && memcmp(u, ids, sizeof ids) == 0);
    char *m = st_meta(&f);
    CHECK_EQ_STR(m, "{\"format\":\"pt\",\"kvserde.dtype.bf16_all\":\"bfloat16\","
                    "\"kvserde.dtype.f32\":\"float32\",\"kvserde.format\":\"1\","
                    "\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\",\"source\":\"kvserde test\"}");
    free(m);
    st_free(&f);
    CHECK_PRINTS(ARGS("decode", enc, dec),
                 strf("%s: decoded 2 of 4 tensors; data 196635 -> 262231 bytes\n", dec));
    REQUIRE(st_load(dec, &f) == 0);
    h = st_get(&f, "f16_all", "F16", "[65536]", sizeof all16);
    CHECK(h && memcmp(h, all16, sizeof all16) == 0);
    st_get(&f, "bf16_all", "BF16", "[256,256]", sizeof all16);
    st_get(&f, "f32", "F32", "[4,5]", sizeof f32_vals);
    st_free(&f);

    const char *bad = path_in("bad.safetensors");
    CHECK_FAILS(ARGS("encode", "--tensor", "kv", in, bad), 1,
                strf("kvserde encode: --tensor 'kv': %s has no tensor of that name\n", in));
    CHECK_FAILS(ARGS("encode", "--tensor", "f32", "--tensor", "ids", in, bad), 1,
                "kvserde encode: --tensor 'ids': the tensor is U8; only float32, float16 and "
                "bfloat16 tensors are encoded\n");
    CHECK_EQ_STR(listing(), "dec.safetensors,enc.safetensors,in.safetensors");
}

static void test_roundtrip_e5m2(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    static expected e;
    expect_codes(KVS_DTYPE_FLOAT8_E5M2, 0, &e);
    const char *enc = path_in("enc.safetensors"), *dec = path_in("dec.safetensors");
    /* Keys in any order and spacing: the metadata holds the canonical form. */
    CHECK_EQ_INT(run(NULL, NULL,
                     ARGS("encode", "--serde",
                          "{ \"type\": \"fp8\", \"saturate\": false, \"fp8_dtype\": \"float8_e5m2\" }",
                          in, enc)),
                 0);
    check_encoded(enc, "F8_E5M2", &e,
                  "{\\\"fp8_dtype\\\":\\\"float8_e5m2\\\",\\\"saturate\\\":false,"
                  "\\\"type\\\":\\\"fp8\\\"}");
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", enc, dec)), 0);
    check_decoded(dec, KVS_DTYPE_FLOAT8_E5M2, &e, -1);
    /* --serde=JSON works too, and options may follow the files. */
    CHECK_EQ_INT(run(NULL, NULL, ARGS("encode", in, enc, "--serde={\"type\":\"fp8\","
                                      "\"fp8_dtype\":\"float8_e5m2\",\"saturate\":false}")),
                 0);
    check_encoded(enc, "F8_E5M2", &e,
                  "{\\\"fp8_dtype\\\":\\\"float8_e5m2\\\",\\\"saturate\\\":false,"
                  "\\\"type\\\":\\\"fp8\\\"}");
}

static void test_decode_dtype(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    static expected e;
    expect_codes(KVS_DTYPE_FLOAT8_E4M3FN, 1, &e);
    const char *enc = path_in("enc.safetensors"), *dec = path_in("dec.safetensors");
    REQUIRE(run(NULL, NULL, ARGS("encode", in, enc)) == 0);
    char *out = NULL;
    CHECK_EQ_INT(run(&out, NULL, ARGS("decode", "--dtype", "float32", enc, dec)), 0);
    CHECK_EQ_STR(out, strf("%s: decoded 3 of 4 tensors; data 131099 -> 524375 bytes\n", dec));
    free(out);
    check_decoded(dec, KVS_DTYPE_FLOAT8_E4M3FN, &e, KVS_DTYPE_FLOAT32);
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", "--dtype=torch.float16", enc, dec)), 0);
    check_decoded(dec, KVS_DTYPE_FLOAT8_E4M3FN, &e, KVS_DTYPE_FLOAT16);
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", enc, "--dtype", "bfloat16", dec)), 0);
    check_decoded(dec, KVS_DTYPE_FLOAT8_E4M3FN, &e, KVS_DTYPE_BFLOAT16);
}

/* --raw stores the serde's bytes as U8 blobs with the shape in metadata;
 * decoding gives the same tensors as the native path. */
static void test_raw_blobs(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    static expected e;
    expect_codes(KVS_DTYPE_FLOAT8_E4M3FN, 1, &e);
    const char *enc = path_in("raw.safetensors"), *dec = path_in("dec.safetensors");
    REQUIRE(run(NULL, NULL, ARGS("encode", "--raw", in, enc)) == 0);
    stf f;
    REQUIRE(st_load(enc, &f) == 0);
    const uint8_t *p;
    if ((p = st_get(&f, "bf16_all", "U8", "[65536]", 65536))) CHECK(memcmp(p, e.bf16, 65536) == 0);
    if ((p = st_get(&f, "f16_all", "U8", "[65536]", 65536))) CHECK(memcmp(p, e.f16, 65536) == 0);
    if ((p = st_get(&f, "f32", "U8", "[20]", 20))) CHECK(memcmp(p, e.f32, 20) == 0);
    char *m = st_meta(&f);
    CHECK_EQ_STR(m, "{\"format\":\"pt\",\"kvserde.dtype.bf16_all\":\"bfloat16\","
                    "\"kvserde.dtype.f16_all\":\"float16\",\"kvserde.dtype.f32\":\"float32\","
                    "\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\","
                    "\"kvserde.shape.bf16_all\":\"[256,256]\",\"kvserde.shape.f16_all\":"
                    "\"[65536]\",\"kvserde.shape.f32\":\"[4,5]\",\"source\":\"kvserde test\"}");
    free(m);
    st_free(&f);
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", enc, dec)), 0);
    check_decoded(dec, KVS_DTYPE_FLOAT8_E4M3FN, &e, -1);
    /* A blob decodes to its own dtype, then converts: still exact here. */
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", "--dtype", "float32", enc, dec)), 0);
    check_decoded(dec, KVS_DTYPE_FLOAT8_E4M3FN, &e, KVS_DTYPE_FLOAT32);
}

/* The exact bytes of a small encoded and decoded file: the reference's
 * layout (dtype, largest first, then name), compact JSON, 8-byte padding.
 * The input's header is left unaligned, so its data is misaligned. */
static void test_exact_layout(void)
{
    clear_dir(work);
    uint16_t b[2] = {0x3F80, 0xC020}; /* 1.0, -2.5 */
    float a = 0.1f;
    uint8_t z = 7;
    tdesc t[] = {{"b", "BF16", "[2]", b, 4}, {"a", "F32", "[1]", &a, 4}, {"z", "U8", "[1]", &z, 1}};
    const char *in = path_in("small.safetensors"), *enc = path_in("enc.safetensors"),
               *dec = path_in("dec.safetensors");
    REQUIRE(write_st(in, t, 3, "{\"format\":\"pt\"}", 0) == 0);
    REQUIRE(run(NULL, NULL, ARGS("encode", in, enc)) == 0);
    size_t len = 0;
    char *buf = read_all(enc, &len);
    REQUIRE(buf);
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\",\"kvserde.dtype.a\":\"float32\","
                      "\"kvserde.dtype.b\":\"bfloat16\",\"kvserde.format\":\"1\","
                      "\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\"},"
                      "\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]},"
                      "\"b\":{\"dtype\":\"F8_E4M3\",\"shape\":[2],\"data_offsets\":[1,3]},"
                      "\"z\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[3,4]}}";
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    CHECK_EQ_U64(len, 8 + padded + 4);
    if (len == 8 + padded + 4) {
        CHECK_EQ_U64((uint8_t)buf[0] | (uint64_t)(uint8_t)buf[1] << 8, padded);
        CHECK(memcmp(buf + 8, hdr, hl) == 0);
        for (size_t i = hl; i < padded; i++) CHECK(buf[8 + i] == ' ');
        uint8_t codes[4];
        kvs_fp8_encode(&a, KVS_DTYPE_FLOAT32, codes, KVS_DTYPE_FLOAT8_E4M3FN, 1, 1);
        kvs_fp8_encode(b, KVS_DTYPE_BFLOAT16, codes + 1, KVS_DTYPE_FLOAT8_E4M3FN, 1, 2);
        codes[3] = 7;
        CHECK(memcmp(buf + 8 + padded, codes, 4) == 0);
        CHECK_EQ_INT(codes[2], 0xC2); /* -2.5 in e4m3fn */
    }
    free(buf);

    REQUIRE(run(NULL, NULL, ARGS("decode", enc, dec)) == 0);
    buf = read_all(dec, &len);
    REQUIRE(buf);
    hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
          "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[4,8]},"
          "\"z\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[8,9]}}";
    hl = strlen(hdr);
    padded = (hl + 7) / 8 * 8;
    CHECK_EQ_U64(len, 8 + padded + 9);
    if (len == 8 + padded + 9) {
        CHECK(memcmp(buf + 8, hdr, hl) == 0);
        float a2;
        memcpy(&a2, buf + 8 + padded, 4);
        CHECK(a2 == 0.1015625f); /* 0.1 -> e4m3fn 13/128 */
        uint16_t b2[2];
        memcpy(b2, buf + 8 + padded + 4, 4);
        CHECK_EQ_INT(b2[0], 0x3F80);
        CHECK_EQ_INT(b2[1], 0xC020);
        CHECK_EQ_INT((uint8_t)buf[8 + padded + 8], 7);
    }
    free(buf);
}

static void test_inspect(void)
{
    clear_dir(work);
    uint16_t b[2] = {0x3F80, 0xC020};
    float a = 0.1f, s = 3.0f;
    uint8_t z = 7;
    tdesc t[] = {{"b", "BF16", "[2]", b, 4},
                 {"a", "F32", "[1]", &a, 4},
                 {"z", "U8", "[1]", &z, 1},
                 {"scalar", "F32", "[]", &s, 4},
                 {"empty", "F16", "[0,4]", NULL, 0},
                 {"long.tensor.name", "F32", "[1,1,1,1,1,1,1,1,1,1]", &s, 4}};
    const char *in = path_in("small.safetensors"), *enc = path_in("enc.safetensors");
    REQUIRE(write_st(in, t, 6, "{\"format\":\"pt\"}", 0) == 0);
    unsigned long long n = header_size(in);

    char *out = NULL, *err = NULL;
    CHECK_EQ_INT(run(&out, &err, ARGS("inspect", in)), 0);
    CHECK_EQ_STR(out, strf("%s: 6 tensors, header %llu bytes, data 17 bytes\n"
                           "metadata:\n"
                           "  format: pt\n"
                           "tensors:\n"
                           "  NAME              DTYPE  SHAPE                           BYTES\n"
                           "  b                 BF16   [2]                                 4\n"
                           "  a                 F32    [1]                                 4\n"
                           "  z                 U8     [1]                                 1\n"
                           "  scalar            F32    []                                  4\n"
                           "  empty             F16    [0, 4]                              0\n"
                           "  long.tensor.name  F32    [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]      4\n",
                           in, n));
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);

    /* Scalars, empty tensors and more than 8 dimensions survive a round
     * trip; the encoded file's listing shows kvserde's metadata. */
    REQUIRE(run(NULL, NULL, ARGS("encode", in, enc)) == 0);
    CHECK_EQ_INT(run(&out, &err, ARGS("inspect", enc)), 0);
    CHECK_EQ_STR(out, strf("%s: 6 tensors, header %llu bytes, data 6 bytes\n"
                           "metadata:\n"
                           "  format: pt\n"
                           "  kvserde.dtype.a: float32\n"
                           "  kvserde.dtype.b: bfloat16\n"
                           "  kvserde.dtype.empty: float16\n"
                           "  kvserde.dtype.long.tensor.name: float32\n"
                           "  kvserde.dtype.scalar: float32\n"
                           "  kvserde.format: 1\n"
                           "  kvserde.serde: {\"type\":\"fp8\"}\n"
                           "tensors:\n"
                           "  NAME              DTYPE    SHAPE                           BYTES\n"
                           "  a                 F8_E4M3  [1]                                 1\n"
                           "  b                 F8_E4M3  [2]                                 2\n"
                           "  empty             F8_E4M3  [0, 4]                              0\n"
                           "  long.tensor.name  F8_E4M3  [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]      1\n"
                           "  scalar            F8_E4M3  []                                  1\n"
                           "  z                 U8       [1]                                 1\n",
                           enc, header_size(enc)));
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);

    /* A file without metadata or tensors. */
    const char *empty = path_in("empty.safetensors");
    REQUIRE(write_st(empty, NULL, 0, NULL, 0) == 0);
    CHECK_EQ_INT(run(&out, NULL, ARGS("inspect", empty)), 0);
    CHECK_EQ_STR(out, strf("%s: 0 tensors, header 2 bytes, data 0 bytes\n"
                           "metadata: none\n"
                           "tensors:\n"
                           "  NAME  DTYPE  SHAPE  BYTES\n",
                           empty));
    free(out);
}

/* The round trip of scalars, empty tensors, many dimensions and --raw. */
static void test_odd_shapes(void)
{
    clear_dir(work);
    float s = 3.0f, many[6] = {1, 2, 3, 4, 5, 600};
    tdesc t[] = {{"scalar", "F32", "[]", &s, 4},
                 {"empty", "F16", "[0,4]", NULL, 0},
                 {"many", "F32", "[1,1,1,1,1,1,1,1,2,3]", many, 24}};
    const char *in = path_in("in.safetensors"), *enc = path_in("enc.safetensors"),
               *dec = path_in("dec.safetensors");
    REQUIRE(write_st(in, t, 3, NULL, 1) == 0);
    const char *modes[] = {"--serde={\"type\":\"fp8\"}", "--raw"};
    for (int m = 0; m < 2; m++) {
        CHECK_EQ_INT(run(NULL, NULL, ARGS("encode", modes[m], in, enc)), 0);
        CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", enc, dec)), 0);
        stf f;
        if (st_load(dec, &f) != 0) {
            KVS_FAIL_("cannot load %s", dec);
            continue;
        }
        const uint8_t *p;
        float want[6];
        uint8_t codes[6];
        if ((p = st_get(&f, "scalar", "F32", "[]", 4))) CHECK(memcmp(p, &s, 4) == 0);
        st_get(&f, "empty", "F16", "[0,4]", 0);
        kvs_fp8_encode(many, KVS_DTYPE_FLOAT32, codes, KVS_DTYPE_FLOAT8_E4M3FN, 1, 6);
        kvs_fp8_decode(codes, KVS_DTYPE_FLOAT8_E4M3FN, want, KVS_DTYPE_FLOAT32, 6);
        CHECK(want[5] == 448.0f);
        if ((p = st_get(&f, "many", "F32", "[1,1,1,1,1,1,1,1,2,3]", 24)))
            CHECK(memcmp(p, want, 24) == 0);
        char *meta = st_meta(&f);
        CHECK_EQ_STR(meta, "null"); /* the input had none */
        free(meta);
        st_free(&f);
    }
}

/* ----- inspect --compare ---------------------------------------------- */

typedef struct figures {
    char max_abs[64], rmse[64], snr[64], cosine[64], nonfinite[32];
} figures;

/* %.*g (fixed == 0) or %.*f, with nan / inf / -inf spelled out. */
static void fmt_num(char *buf, size_t size, double v, int prec, int fixed)
{
    if (isnan(v))
        snprintf(buf, size, "nan");
    else if (isinf(v))
        snprintf(buf, size, v > 0 ? "inf" : "-inf");
    else if (fixed)
        snprintf(buf, size, "%.*f", prec, v);
    else
        snprintf(buf, size, "%.*g", prec, v);
}

/* The figures inspect --help defines, over doubles, in element order. */
static figures expect_figures(const double *x, const double *o, size_t n)
{
    double e2 = 0, o2 = 0, x2 = 0, dot = 0, mx = 0;
    size_t cnt = 0, nonfinite = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(o[i])) {
            nonfinite++;
            continue;
        }
        cnt++;
        if (!isfinite(x[i])) {
            bad++;
            continue;
        }
        double d = fabs(x[i] - o[i]);
        if (d > mx) mx = d;
        e2 += d * d;
        o2 += o[i] * o[i];
        x2 += x[i] * x[i];
        dot += x[i] * o[i];
    }
    double rmse = cnt ? sqrt(e2 / (double)cnt) : 0;
    double snr = e2 == 0 ? INFINITY : 10 * log10(o2 / e2);
    double cosine = (x2 == 0 && o2 == 0) ? 1 : (x2 == 0 || o2 == 0) ? 0 : dot / sqrt(x2 * o2);
    if (bad) {
        mx = rmse = INFINITY;
        snr = -INFINITY;
        cosine = NAN;
    }
    figures f;
    fmt_num(f.max_abs, sizeof f.max_abs, mx, 6, 0);
    fmt_num(f.rmse, sizeof f.rmse, rmse, 6, 0);
    fmt_num(f.snr, sizeof f.snr, snr, 2, 1);
    fmt_num(f.cosine, sizeof f.cosine, cosine, 6, 1);
    snprintf(f.nonfinite, sizeof f.nonfinite, "%zu", nonfinite);
    return f;
}

/* The row of `name` in inspect's output: its whitespace-separated fields. */
static int row_fields(const char *out, const char *name, char fields[16][64])
{
    char prefix[128];
    snprintf(prefix, sizeof prefix, "\n  %s ", name);
    const char *p = strstr(out, prefix);
    if (p == NULL) return 0;
    p += 3;
    int n = 0;
    while (*p && *p != '\n' && n < 16) {
        while (*p == ' ') p++;
        int l = 0;
        while (*p && *p != ' ' && *p != '\n' && l < 63) fields[n][l++] = *p++;
        fields[n][l] = '\0';
        if (l) n++;
    }
    return n;
}

static void check_row(const char *out, const char *name, const char *orig, figures f)
{
    char fl[16][64];
    int n = row_fields(out, name, fl);
    if (n < 7) {
        KVS_FAIL_("no row for '%s' in:\n%s", name, out ? out : "(null)");
        return;
    }
    CHECK_EQ_STR(fl[n - 6], orig);
    CHECK_EQ_STR(fl[n - 5], f.max_abs);
    CHECK_EQ_STR(fl[n - 4], f.rmse);
    CHECK_EQ_STR(fl[n - 3], f.snr);
    CHECK_EQ_STR(fl[n - 2], f.cosine);
    CHECK_EQ_STR(fl[n - 1], f.nonfinite);
}

static void test_compare(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    const char *enc = path_in("enc.safetensors"), *raw = path_in("raw.safetensors");
    REQUIRE(run(NULL, NULL, ARGS("encode", "--serde={\"type\":\"fp8\",\"fp8_dtype\":"
                                 "\"float8_e5m2\",\"saturate\":false}", in, enc)) == 0);
    REQUIRE(run(NULL, NULL, ARGS("encode", "--raw", in, raw)) == 0);

    static double x[65536], o[65536];
    static uint8_t codes[65536];
    static float dec[65536];
    figures want[3];
    /* e5m2, saturate false */
    kvs_fp8_encode(all16, KVS_DTYPE_BFLOAT16, codes, KVS_DTYPE_FLOAT8_E5M2, 0, 65536);
    kvs_fp8_decode(codes, KVS_DTYPE_FLOAT8_E5M2, dec, KVS_DTYPE_FLOAT32, 65536);
    for (size_t i = 0; i < 65536; i++) {
        x[i] = dec[i];
        o[i] = kvs_bf16_to_f32(all16[i]);
    }
    want[0] = expect_figures(x, o, 65536);
    kvs_fp8_encode(all16, KVS_DTYPE_FLOAT16, codes, KVS_DTYPE_FLOAT8_E5M2, 0, 65536);
    kvs_fp8_decode(codes, KVS_DTYPE_FLOAT8_E5M2, dec, KVS_DTYPE_FLOAT32, 65536);
    for (size_t i = 0; i < 65536; i++) {
        x[i] = dec[i];
        o[i] = kvs_f16_to_f32(all16[i]);
    }
    want[1] = expect_figures(x, o, 65536);
    kvs_fp8_encode(f32_vals, KVS_DTYPE_FLOAT32, codes, KVS_DTYPE_FLOAT8_E5M2, 0, 20);
    kvs_fp8_decode(codes, KVS_DTYPE_FLOAT8_E5M2, dec, KVS_DTYPE_FLOAT32, 20);
    for (size_t i = 0; i < 20; i++) {
        x[i] = dec[i];
        o[i] = f32_vals[i];
    }
    want[2] = expect_figures(x, o, 20);
    /* Every bf16 NaN and the two infinities are left out; e5m2 without
     * saturation turns 61440 into inf, so the f32 tensor's error is infinite. */
    CHECK_EQ_STR(want[0].nonfinite, "256");
    CHECK_EQ_STR(want[2].max_abs, "inf");

    char *out = NULL, *err = NULL;
    CHECK_EQ_INT(run(&out, &err, ARGS("inspect", enc, "--compare", in)), 0);
    CHECK_EQ_STR(err, "");
    check_row(out, "bf16_all", "BF16", want[0]);
    check_row(out, "f16_all", "F16", want[1]);
    check_row(out, "f32", "F32", want[2]);
    figures same = {"0", "0", "inf", "1.000000", "0"};
    check_row(out, "ids", "U8", same);
    CHECK(strstr(out, "\n  NAME      DTYPE    SHAPE       BYTES  ORIG  MAX_ABS_ERR") != NULL);
    CHECK(strstr(out, strf("\ndata: 131099 bytes; %s: 262231 bytes (ratio 0.500)\n", in)) != NULL);
    free(out);
    free(err);

    /* Blobs are decoded before comparing; either file may be the encoded
     * one. e4m3fn with saturation: bf16 infinities become +-448, but the
     * original is not finite there, so they are not counted. */
    kvs_fp8_encode(all16, KVS_DTYPE_BFLOAT16, codes, KVS_DTYPE_FLOAT8_E4M3FN, 1, 65536);
    kvs_fp8_decode(codes, KVS_DTYPE_FLOAT8_E4M3FN, dec, KVS_DTYPE_FLOAT32, 65536);
    for (size_t i = 0; i < 65536; i++) {
        x[i] = dec[i];
        o[i] = kvs_bf16_to_f32(all16[i]);
    }
    figures w = expect_figures(x, o, 65536);
    CHECK_EQ_INT(run(&out, NULL, ARGS("inspect", "--compare", in, raw)), 0);
    check_row(out, "bf16_all", "BF16", w);
    free(out);
    /* The other way round (FILE is the original), x and o swap. */
    figures w2 = expect_figures(o, x, 65536);
    CHECK_EQ_INT(run(&out, NULL, ARGS("inspect", in, "--compare", raw)), 0);
    check_row(out, "bf16_all", "BF16", w2);
    free(out);

    /* Files that do not match. */
    uint8_t one = 1;
    tdesc t1[] = {{"ids", "U8", "[7]", ids, 7}};
    tdesc t2[] = {{"ids", "U8", "[1,7]", ids, 7}, {"x", "U8", "[1]", &one, 1}};
    const char *p1 = path_in("one.safetensors"), *p2 = path_in("two.safetensors");
    REQUIRE(write_st(p1, t1, 1, NULL, 0) == 0);
    REQUIRE(write_st(p2, t2, 2, NULL, 0) == 0);
    CHECK_FAILS(ARGS("inspect", p2, "--compare", p1), 1,
                strf("kvserde inspect: tensor 'ids': shape [1, 7] in %s but [7] in %s\n", p2,
                     p1));
    CHECK_FAILS(ARGS("inspect", p1, "--compare", in), 1,
                strf("kvserde inspect: tensor 'bf16_all' of %s is not in %s\n", in, p1));
    CHECK_FAILS(ARGS("inspect", in, "--compare", p1), 1,
                strf("kvserde inspect: tensor 'bf16_all' of %s is not in %s\n", in, p1));
}

/* ----- framed pipelines ---------------------------------------------------- */

#define PIPE_FP8_CRC "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"crc32c\"}]}"
#define PIPE_BYTES_XXH3                                                                    \
    "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"xxh3\"}]}"

/* Every float tensor of the round-trip input is a 1-D U8 frame in `path`,
 * with the usual kvserde metadata (kvserde.dtype and kvserde.shape kept for
 * frames too). Returns the parsed file (st_free it). */
static int check_framed(const char *path, const char *serde_meta, stf *f)
{
    if (st_load(path, f) != 0) {
        KVS_FAIL_("cannot load %s", path);
        return -1;
    }
    const char *names[3] = {"bf16_all", "f16_all", "f32"};
    for (int i = 0; i < 3; i++) {
        json_t *t = json_object_get(f->hdr, names[i]);
        CHECK(t != NULL);
        CHECK_EQ_STR(json_string_value(json_object_get(t, "dtype")), "U8");
        json_t *offs = json_object_get(t, "data_offsets");
        uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 0));
        uint64_t e = (uint64_t)json_integer_value(json_array_get(offs, 1));
        CHECK(e - b >= 4 && memcmp(f->buf + 8 + f->n + b, "KVSF", 4) == 0);
    }
    const uint8_t *p;
    if ((p = st_get(f, "ids", "U8", "[7]", 7))) CHECK(memcmp(p, ids, 7) == 0);
    char *m = st_meta(f);
    CHECK_EQ_STR(m, strf("{\"format\":\"pt\",\"kvserde.dtype.bf16_all\":\"bfloat16\","
                         "\"kvserde.dtype.f16_all\":\"float16\",\"kvserde.dtype.f32\":"
                         "\"float32\",\"kvserde.format\":\"1\",\"kvserde.serde\":\"%s\","
                         "\"kvserde.shape.bf16_all\":\"[256,256]\",\"kvserde.shape.f16_all\":"
                         "\"[65536]\",\"kvserde.shape.f32\":\"[4,5]\",\"source\":\"kvserde test\"}",
                         serde_meta));
    free(m);
    return 0;
}

/* A decoded file holds exactly the round-trip input (a lossless pipeline). */
static void check_exact(const char *path)
{
    stf f;
    if (st_load(path, &f) != 0) {
        KVS_FAIL_("cannot load %s", path);
        return;
    }
    const uint8_t *p;
    if ((p = st_get(&f, "bf16_all", "BF16", "[256,256]", sizeof all16)))
        CHECK(memcmp(p, all16, sizeof all16) == 0);
    if ((p = st_get(&f, "f16_all", "F16", "[65536]", sizeof all16)))
        CHECK(memcmp(p, all16, sizeof all16) == 0);
    if ((p = st_get(&f, "f32", "F32", "[4,5]", sizeof f32_vals)))
        CHECK(memcmp(p, f32_vals, sizeof f32_vals) == 0);
    if ((p = st_get(&f, "ids", "U8", "[7]", 7))) CHECK(memcmp(p, ids, 7) == 0);
    char *m = st_meta(&f);
    CHECK_EQ_STR(m, IN_META);
    free(m);
    CHECK_EQ_U64(json_object_size(f.hdr), 5);
    st_free(&f);
}

/* Where tensor `name`'s bytes start in the file (0 if absent). */
static size_t tensor_file_offset(const stf *f, const char *name, size_t *len)
{
    json_t *offs = json_object_get(json_object_get(f->hdr, name), "data_offsets");
    if (offs == NULL) return 0;
    uint64_t b = (uint64_t)json_integer_value(json_array_get(offs, 0));
    uint64_t e = (uint64_t)json_integer_value(json_array_get(offs, 1));
    if (len) *len = (size_t)(e - b);
    return (size_t)(8 + f->n + b);
}

static void test_frames_roundtrip(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    static expected e;
    expect_codes(KVS_DTYPE_FLOAT8_E4M3FN, 1, &e);
    const char *enc = path_in("enc.safetensors"), *dec = path_in("dec.safetensors");

    /* fp8 + crc32c: the header records the chain; decode needs no --serde
     * and gives the library's fp8 decoding. */
    char *err = NULL;
    CHECK_PRINTS(ARGS("encode", "--serde", PIPE_FP8_CRC, in, enc),
                 strf("%s: encoded 3 of 4 tensors with {\"stages\":[{\"type\":\"fp8\"},"
                      "{\"type\":\"crc32c\"}],\"type\":\"pipeline\"}; data 262231 -> "
                      "131283 bytes\n",
                      enc));
    stf f;
    if (check_framed(enc, "{\\\"stages\\\":[{\\\"type\\\":\\\"fp8\\\"},{\\\"type\\\":"
                          "\\\"crc32c\\\"}],\\\"type\\\":\\\"pipeline\\\"}",
                     &f) == 0) {
        /* the fp8 stage's payload is exactly the fp8 serde's codes */
        size_t len = 0, off = tensor_file_offset(&f, "f32", &len);
        CHECK_EQ_U64(len, 60 + 20 + 4);
        if (len == 84) CHECK(memcmp(f.buf + off + 60, e.f32, 20) == 0);
        st_free(&f);
    }
    CHECK_PRINTS(ARGS("decode", enc, dec),
                 strf("%s: decoded 3 of 4 tensors; data 131283 -> 262231 bytes\n", dec));
    check_decoded(dec, KVS_DTYPE_FLOAT8_E4M3FN, &e, -1);
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", "--dtype", "float32", enc, dec)), 0);
    check_decoded(dec, KVS_DTYPE_FLOAT8_E4M3FN, &e, KVS_DTYPE_FLOAT32);

    /* bytes + xxh3: lossless, the exact input back. */
    CHECK_EQ_INT(run(NULL, NULL, ARGS("encode", "--serde", PIPE_BYTES_XXH3, in, enc)), 0);
    if (check_framed(enc, "{\\\"stages\\\":[{\\\"type\\\":\\\"bytes\\\"},{\\\"type\\\":"
                          "\\\"xxh3\\\"}],\\\"type\\\":\\\"pipeline\\\"}",
                     &f) == 0)
        st_free(&f);
    CHECK_PRINTS(ARGS("decode", enc, dec),
                 strf("%s: decoded 3 of 4 tensors; data 262421 -> 262231 bytes\n", dec));
    check_exact(dec);

    /* A frame is read as a frame whatever kvserde.serde says: here the
     * record claims the fp8 serde. */
    REQUIRE(st_load(enc, &f) == 0);
    char *hdr = strndup(f.buf + 8, f.n);
    char *at = strstr(hdr, "{\\\"stages\\\"");
    REQUIRE(at != NULL);
    const char *pipe = "{\\\"stages\\\":[{\\\"type\\\":\\\"bytes\\\"},{\\\"type\\\":\\\"xxh3\\\"}],"
                       "\\\"type\\\":\\\"pipeline\\\"}";
    const char *fp8 = "{\\\"type\\\":\\\"fp8\\\"}";
    REQUIRE(strncmp(at, pipe, strlen(pipe)) == 0);
    /* same length: pad the fp8 config with spaces inside the JSON string */
    memset(at, ' ', strlen(pipe));
    memcpy(at, fp8, strlen(fp8));
    memcpy(f.buf + 8, hdr, f.n);
    free(hdr);
    const char *other = path_in("other.safetensors");
    REQUIRE(write_all_file(other, f.buf, f.len) == 0);
    st_free(&f);
    CHECK_EQ_INT(run(NULL, &err, ARGS("decode", other, dec)), 0);
    CHECK_EQ_STR(err, "");
    free(err);
    check_exact(dec);
}

/* A damaged frame, and a frame whose layout is not the recorded one. */
static void test_frames_damaged(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    const char *enc = path_in("enc.safetensors"), *bad = path_in("bad.safetensors"),
               *dec = path_in("dec.safetensors");
    REQUIRE(run(NULL, NULL, ARGS("encode", "--serde", PIPE_FP8_CRC, in, enc)) == 0);
    stf f;
    REQUIRE(st_load(enc, &f) == 0);
    size_t len = 0, off = tensor_file_offset(&f, "f32", &len);
    REQUIRE(len == 84);
    f.buf[off + 60 + 3] ^= 0x01; /* the fourth fp8 code */
    REQUIRE(write_all_file(bad, f.buf, f.len) == 0);
    f.buf[off + 60 + 3] ^= 0x01;
    CHECK_FAILS(ARGS("decode", bad, dec), 1,
                strf("kvserde decode: %s: tensor 'f32': pipeline: crc32c: payload damaged: "
                     "checksum 8b7a0ca5 over 20 bytes, stored d49ed0fa; loading no key\n",
                     bad));
    CHECK(!exists(dec));
    /* inspect reports it and still lists the file */
    char *out = NULL;
    CHECK_EQ_INT(run(&out, NULL, ARGS("inspect", bad)), 0);
    CHECK(out && strstr(out, "  f32: frame v1, header 60 bytes, payload 24 bytes, layout [4x5 "
                             "float32], not keyed\n"
                             "    stage 0: fp8 {\"fp8_dtype\":\"float8_e4m3fn\",\"saturate\":true}\n"
                             "    stage 1: crc32c {}\n"
                             "    checks failed: pipeline: crc32c: payload damaged: checksum "
                             "8b7a0ca5 over 20 bytes, stored d49ed0fa; loading no key\n"));
    free(out);

    /* The recorded shape says [5,4]: the frame says [4x5]. */
    char *hdr = strndup(f.buf + 8, f.n);
    char *at = strstr(hdr, "\"kvserde.shape.f32\":\"[4,5]\"");
    REQUIRE(at != NULL);
    memcpy(at + strlen("\"kvserde.shape.f32\":\""), "[5,4]", 5);
    memcpy(f.buf + 8, hdr, f.n);
    free(hdr);
    REQUIRE(write_all_file(bad, f.buf, f.len) == 0);
    CHECK_FAILS(ARGS("decode", bad, dec), 1,
                strf("kvserde decode: %s: kvserde metadata: tensor 'f32': the frame holds [4x5 "
                     "float32] but kvserde.shape.f32 and kvserde.dtype.f32 say [5x4 float32]\n",
                     bad));
    st_free(&f);
    CHECK(!exists(dec));
    CHECK_EQ_STR(listing(), "bad.safetensors,enc.safetensors,in.safetensors");
}

/* aes_gcm: encode with a key file, decode with --key-file (the path the
 * file records need not exist), refuse without it. */
static void test_frames_aes_gcm(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    char key[4400], key2[4400];
    snprintf(key, sizeof key, "%s", path_in("k1.key"));
    snprintf(key2, sizeof key2, "%s", path_in("k2.key"));
    uint8_t k[32];
    for (int i = 0; i < 32; i++) k[i] = (uint8_t)(7 * i + 1);
    int fd = open(key, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, k, 32) == 32);
    close(fd);
    const char *enc = path_in("enc.safetensors"), *dec = path_in("dec.safetensors");
    char serde[9000];
    snprintf(serde, sizeof serde,
             "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"aes_gcm\","
             "\"key_files\":[\"%s\"]}]}",
             key);
    char *out = NULL, *err = NULL;
    CHECK_EQ_INT(run(&out, &err, ARGS("encode", "--serde", serde, in, enc)), 0);
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);
    /* the key moves: decode uses --key-file, not the recorded path */
    REQUIRE(rename(key, key2) == 0);
    CHECK_EQ_INT(run(&out, &err, ARGS("decode", "--key-file", key2, enc, dec)), 0);
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);
    check_exact(dec);
    unlink(dec);
    const char *want_key_id = "6c55f58b367249f7";
    CHECK_FAILS(ARGS("decode", enc, dec), 1,
                strf("kvserde decode: %s: tensor 'f32': aes_gcm: no configured key has key "
                     "id %s (configured: none)\n",
                     enc, want_key_id));
    CHECK(!exists(dec));
    CHECK_FAILS(ARGS("decode", "--key-file", key, enc, dec), 1,
                strf("kvserde decode: --key-file: pipeline: stage 1: aes_gcm: cannot open key "
                     "file %s: No such file or directory\n",
                     key));

    /* inspect: not verified without the key, checks ok with it */
    CHECK_EQ_INT(run(&out, &err, ARGS("inspect", enc)), 0);
    CHECK_EQ_STR(err, "");
    const char *stage = strf("    stage 0: bytes {}\n"
                             "    stage 1: aes_gcm {\"key_id\":\"%s\",\"nonce\":\"",
                             want_key_id);
    CHECK(out && strstr(out, "  f32: frame v1, header 78 bytes, payload 96 bytes, layout [4x5 "
                             "float32], not keyed\n"));
    CHECK(out && strstr(out, stage));
    CHECK(out && strstr(out, "\"}\n    encrypted: not verified (no --key-file)\n"));
    CHECK(out && !strstr(out, "checks ok"));
    free(out);
    free(err);
    CHECK_EQ_INT(run(&out, &err, ARGS("inspect", "--key-file", key2, enc)), 0);
    CHECK_EQ_STR(err, "");
    CHECK(out && strstr(out, "\"}\n    checks ok\n"));
    CHECK(out && !strstr(out, "not verified"));
    free(out);
    free(err);
    CHECK_EQ_STR(listing(), "enc.safetensors,in.safetensors,k2.key");
}

/* inspect lists every frame's stages, parameters, layout and checks. */
static void test_frames_inspect(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    const char *enc = path_in("enc.safetensors");
    REQUIRE(run(NULL, NULL, ARGS("encode", "--serde", PIPE_FP8_CRC, in, enc)) == 0);
    char *out = NULL, *err = NULL;
    CHECK_EQ_INT(run(&out, &err, ARGS("inspect", enc)), 0);
    CHECK_EQ_STR(out,
                 strf("%s: 4 tensors, header %llu bytes, data 131283 bytes\n"
                      "metadata:\n"
                      "  format: pt\n"
                      "  kvserde.dtype.bf16_all: bfloat16\n"
                      "  kvserde.dtype.f16_all: float16\n"
                      "  kvserde.dtype.f32: float32\n"
                      "  kvserde.format: 1\n"
                      "  kvserde.serde: {\"stages\":[{\"type\":\"fp8\"},{\"type\":\"crc32c\"}],"
                      "\"type\":\"pipeline\"}\n"
                      "  kvserde.shape.bf16_all: [256,256]\n"
                      "  kvserde.shape.f16_all: [65536]\n"
                      "  kvserde.shape.f32: [4,5]\n"
                      "  source: kvserde test\n"
                      "tensors:\n"
                      "  NAME      DTYPE  SHAPE    BYTES\n"
                      "  bf16_all  U8     [65600]  65600\n"
                      "  f16_all   U8     [65592]  65592\n"
                      "  f32       U8     [84]        84\n"
                      "  ids       U8     [7]          7\n"
                      "frames:\n"
                      "  bf16_all: frame v1, header 60 bytes, payload 65540 bytes, layout "
                      "[256x256 bfloat16], not keyed\n"
                      "    stage 0: fp8 {\"fp8_dtype\":\"float8_e4m3fn\",\"saturate\":true}\n"
                      "    stage 1: crc32c {}\n"
                      "    checks ok\n"
                      "  f16_all: frame v1, header 52 bytes, payload 65540 bytes, layout "
                      "[65536 float16], not keyed\n"
                      "    stage 0: fp8 {\"fp8_dtype\":\"float8_e4m3fn\",\"saturate\":true}\n"
                      "    stage 1: crc32c {}\n"
                      "    checks ok\n"
                      "  f32: frame v1, header 60 bytes, payload 24 bytes, layout [4x5 float32], "
                      "not keyed\n"
                      "    stage 0: fp8 {\"fp8_dtype\":\"float8_e4m3fn\",\"saturate\":true}\n"
                      "    stage 1: crc32c {}\n"
                      "    checks ok\n",
                      enc, header_size(enc)));
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);
    /* --compare decodes the frames first */
    CHECK_EQ_INT(run(&out, &err, ARGS("inspect", enc, "--compare", in)), 0);
    CHECK_EQ_STR(err, "");
    CHECK(out && strstr(out, "\nframes:\n  bf16_all: frame v1, "));
    CHECK(out && strstr(out, "checks ok\ndata: 131283 bytes; "));
    free(out);
    free(err);
}

/* A plain fp8 file, as PyTorch or vLLM save one: no kvserde metadata. */
static void test_plain_fp8(void)
{
    clear_dir(work);
    uint8_t e4[6] = {0x00, 0x38, 0xB8, 0x7E, 0x7F, 0x01};
    uint8_t e5[4] = {0x3C, 0x7B, 0x7C, 0xFF};
    int32_t n32[3] = {1, -2, 300000};
    tdesc t[] = {{"k", "F8_E4M3", "[2,3]", e4, 6},
                 {"v", "F8_E5M2", "[4]", e5, 4},
                 {"pos", "I32", "[3]", n32, 12}};
    const char *in = path_in("plain.safetensors"), *dec = path_in("dec.safetensors");
    REQUIRE(write_st(in, t, 3, "{\"format\":\"pt\",\"model\":\"m\"}", 1) == 0);
    kvs_dtype as[2] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT32};
    for (int r = 0; r < 2; r++) {
        char *out = NULL, *err = NULL;
        if (r == 0)
            CHECK_EQ_INT(run(&out, &err, ARGS("decode", in, dec)), 0);
        else
            CHECK_EQ_INT(run(&out, &err, ARGS("decode", "--dtype", "float32", in, dec)), 0);
        CHECK_EQ_STR(out, strf("%s: decoded 2 of 3 tensors; data 22 -> %d bytes\n", dec,
                               r == 0 ? 32 : 52));
        CHECK_EQ_STR(err, "");
        free(out);
        free(err);
        size_t es = kvs_dtype_size(as[r]);
        const char *stn = r == 0 ? "BF16" : "F32";
        uint8_t want[64];
        stf f;
        REQUIRE(st_load(dec, &f) == 0);
        const uint8_t *p;
        CHECK_OK(kvs_fp8_decode(e4, KVS_DTYPE_FLOAT8_E4M3FN, want, as[r], 6));
        if ((p = st_get(&f, "k", stn, "[2,3]", 6 * es))) CHECK(memcmp(p, want, 6 * es) == 0);
        CHECK_OK(kvs_fp8_decode(e5, KVS_DTYPE_FLOAT8_E5M2, want, as[r], 4));
        if ((p = st_get(&f, "v", stn, "[4]", 4 * es))) CHECK(memcmp(p, want, 4 * es) == 0);
        if (r == 1 && p) {
            float v1;
            memcpy(&v1, p + 4, 4);
            CHECK(v1 == 57344.0f); /* 0x7B: the largest finite e5m2 */
        }
        if ((p = st_get(&f, "pos", "I32", "[3]", 12))) CHECK(memcmp(p, n32, 12) == 0);
        char *m = st_meta(&f);
        CHECK_EQ_STR(m, "{\"format\":\"pt\",\"model\":\"m\"}");
        free(m);
        CHECK_EQ_U64(json_object_size(f.hdr), 4);
        st_free(&f);
    }
    /* Neither kvserde metadata nor an fp8 tensor: refused, and it says so. */
    tdesc plain[] = {{"pos", "I32", "[3]", n32, 12}};
    REQUIRE(write_st(in, plain, 1, "{\"format\":\"pt\"}", 1) == 0);
    unlink(dec);
    CHECK_FAILS(ARGS("decode", in, dec), 1,
                strf("kvserde decode: %s: not a kvserde-encoded file (no 'kvserde.serde' "
                     "metadata) and no F8_E4M3 or F8_E5M2 tensor to decode\n",
                     in));
    CHECK_EQ_STR(listing(), "plain.safetensors");
}

/* ----- refusals -------------------------------------------------------- */

/* ggml blocks: one U8 tensor of llama.cpp's blocks per float tensor (the
 * library's bytes), metadata to undo it, decode restores the dequantized
 * values; a last dimension that is not a multiple of 32 is refused with the
 * numbers. */
static void test_ggml_blocks(void)
{
    clear_dir(work);
    static uint16_t bf[4 * 64];
    static float f32[2 * 32];
    for (int i = 0; i < 4 * 64; i++) bf[i] = kvs_f32_to_bf16((float)(i % 37) * 0.25f - 4.0f);
    for (int i = 0; i < 2 * 32; i++) f32[i] = (float)i * 0.5f - 9.0f;
    const tdesc t[2] = {{"a", "BF16", "[4,64]", bf, sizeof bf},
                        {"b", "F32", "[2,32]", f32, sizeof f32}};
    const char *in = path_in("in.safetensors"), *enc = path_in("q4.safetensors"),
               *dec = path_in("dec.safetensors");
    REQUIRE(write_st(in, t, 2, NULL, 1) == 0);
    REQUIRE(run(NULL, NULL, ARGS("encode", "--serde", "{\"type\":\"ggml_q4_0\"}", in, enc)) == 0);
    uint8_t want_a[8 * 18], want_b[2 * 18];
    REQUIRE(kvs_ggml_encode(bf, KVS_DTYPE_BFLOAT16, want_a, KVS_GGML_Q4_0, 256) == KVS_OK);
    REQUIRE(kvs_ggml_encode(f32, KVS_DTYPE_FLOAT32, want_b, KVS_GGML_Q4_0, 64) == KVS_OK);
    stf f;
    REQUIRE(st_load(enc, &f) == 0);
    const uint8_t *p;
    if ((p = st_get(&f, "a", "U8", "[144]", 144))) CHECK(memcmp(p, want_a, 144) == 0);
    if ((p = st_get(&f, "b", "U8", "[36]", 36))) CHECK(memcmp(p, want_b, 36) == 0);
    char *m = st_meta(&f);
    CHECK_EQ_STR(m, "{\"kvserde.dtype.a\":\"bfloat16\",\"kvserde.dtype.b\":\"float32\","
                    "\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"ggml_q4_0\\\"}\","
                    "\"kvserde.shape.a\":\"[4,64]\",\"kvserde.shape.b\":\"[2,32]\"}");
    free(m);
    st_free(&f);
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", enc, dec)), 0);
    uint16_t back_a[256];
    float back_b[64];
    REQUIRE(kvs_ggml_decode(want_a, KVS_GGML_Q4_0, back_a, KVS_DTYPE_BFLOAT16, 256) == KVS_OK);
    REQUIRE(kvs_ggml_decode(want_b, KVS_GGML_Q4_0, back_b, KVS_DTYPE_FLOAT32, 64) == KVS_OK);
    REQUIRE(st_load(dec, &f) == 0);
    if ((p = st_get(&f, "a", "BF16", "[4,64]", 512))) CHECK(memcmp(p, back_a, 512) == 0);
    if ((p = st_get(&f, "b", "F32", "[2,32]", 256))) CHECK(memcmp(p, back_b, 256) == 0);
    st_free(&f);

    /* Framed: the pipeline stage of the same name, same values back. */
    const char *fr = path_in("q4f.safetensors");
    CHECK_EQ_INT(run(NULL, NULL,
                     ARGS("encode", "--serde",
                          "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"ggml_q4_0\"},"
                          "{\"type\":\"crc32c\"}]}",
                          in, fr)),
                 0);
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", fr, dec)), 0);
    REQUIRE(st_load(dec, &f) == 0);
    if ((p = st_get(&f, "a", "BF16", "[4,64]", 512))) CHECK(memcmp(p, back_a, 512) == 0);
    st_free(&f);

    /* Refused with the numbers; no output left behind. */
    static uint16_t odd[3 * 40];
    const tdesc t2[1] = {{"c", "F16", "[3,40]", odd, sizeof odd}};
    const char *in2 = path_in("odd.safetensors"), *enc2 = path_in("odd-q8.safetensors");
    REQUIRE(write_st(in2, t2, 1, NULL, 1) == 0);
    char *err = NULL;
    CHECK_EQ_INT(run(NULL, &err, ARGS("encode", "--serde", "{\"type\":\"ggml_q8_0\"}", in2, enc2)),
                 1);
    const char *want = strf("kvserde encode: %s: tensor 'c': ggml_q8_0: source group 0 [3x40 float16]: "
                      "the last dimension 40 is not a multiple of 32 (blocks of 32 run along it)\n",
                      in2);
    CHECK_EQ_STR(err, want);
    CHECK(!exists(enc2));
    free(err);
}

static void test_usage(void)
{
    clear_dir(work);
    char *out = NULL, *err = NULL;
    const char *cmds[] = {"encode", "decode", "inspect"};
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(run(&out, &err, ARGS(cmds[i], "--help")), 0);
        const char *u = strf("usage: kvserde %s ", cmds[i]);
        CHECK(out && strncmp(out, u, strlen(u)) == 0);
        CHECK(out && strstr(out, "Exit status: 0 success, 1 failure (reason on stderr), 2 "
                                 "usage error.\n"));
        CHECK_EQ_STR(err, "");
        free(out);
        free(err);
        CHECK_EQ_INT(run(&out, &err, ARGS(cmds[i], "-h")), 0);
        free(out);
        free(err);
        /* an unknown option: the reason, then the usage, on stderr */
        CHECK_EQ_INT(run(&out, &err, ARGS(cmds[i], "--bogus", "a", "b")), 2);
        CHECK_EQ_STR(out, "");
        CHECK(err && strncmp(err, strf("kvserde %s: unknown option '--bogus'\n\nusage: kvserde %s",
                                       cmds[i], cmds[i]),
                             strlen(strf("kvserde %s: unknown option '--bogus'\n\nusage: "
                                         "kvserde %s",
                                         cmds[i], cmds[i]))) == 0);
        free(out);
        free(err);
    }
    CHECK_EQ_INT(run(NULL, &err, ARGS("encode", "only-one")), 2);
    CHECK(err && strncmp(err, "kvserde encode: expected IN and OUT, got 1 argument\n\n", 53) == 0);
    free(err);
    CHECK_EQ_INT(run(NULL, &err, ARGS("decode", "a", "b", "c")), 2);
    CHECK(err && strncmp(err, "kvserde decode: expected IN and OUT, got 3 arguments\n\n", 54) == 0);
    free(err);
    CHECK_EQ_INT(run(NULL, &err, ARGS("inspect")), 2);
    CHECK(err && strncmp(err, "kvserde inspect: expected one FILE, got 0 arguments\n\n", 53) == 0);
    free(err);
    CHECK_EQ_INT(run(NULL, &err, ARGS("encode", "a", "b", "--serde")), 2);
    CHECK(err && strncmp(err, "kvserde encode: option '--serde' needs a value\n", 47) == 0);
    free(err);
    CHECK_EQ_INT(run(NULL, &err, ARGS("inspect", "a", "--compare")), 2);
    CHECK(err && strncmp(err, "kvserde inspect: option '--compare' needs a value\n", 50) == 0);
    free(err);

    /* Bad option values are usage errors, found before any file is read. */
    CHECK_FAILS(ARGS("encode", "--serde", "{\"type\":\"fp8\",\"fp8_dtype\":\"float16\"}", "a", "b"),
                2,
                "kvserde encode: --serde: fp8: fp8_dtype must be one of float8_e4m3fn, "
                "float8_e5m2; got 'float16'\n");
    CHECK_FAILS(ARGS("encode", "--serde", "{\"type\":", "a", "b"), 2,
                "kvserde encode: --serde: serde config: invalid JSON at line 1, column 8: "
                "unexpected token near end of file\n");
    CHECK_EQ_INT(run(NULL, &err, ARGS("encode", "--serde", "{\"type\":\"nope\"}", "a", "b")), 2);
    CHECK(err && strncmp(err, "kvserde encode: --serde: unknown serde type 'nope'", 50) == 0);
    free(err);
    CHECK_FAILS(ARGS("decode", "--dtype", "uint8", "a", "b"), 2,
                "kvserde decode: --dtype must be bfloat16, float16 or float32, got 'uint8'\n");
    CHECK_FAILS(ARGS("decode", "--dtype", "fp32", "a", "b"), 2,
                "kvserde decode: --dtype must be bfloat16, float16 or float32, got 'fp32'\n");

    /* Files that cannot be read are failures (1). */
    const char *missing = path_in("missing.safetensors");
    CHECK_FAILS(ARGS("inspect", missing), 1,
                strf("kvserde inspect: %s: No such file or directory\n", missing));
    CHECK_FAILS(ARGS("encode", missing, path_in("out.safetensors")), 1,
                strf("kvserde encode: %s: No such file or directory\n", missing));
    CHECK_FAILS(ARGS("decode", work, path_in("out.safetensors")), 1,
                strf("kvserde decode: %s: Is a directory\n", work));
    CHECK_EQ_STR(listing(), "");
}

typedef struct bad_file {
    const char *file;
    uint64_t n; /* 0: the header's length */
    const char *header;
    size_t ndata;
    const char *msg;
} bad_file;

static const bad_file bad_files[] = {
    {"truncated", 0, "{\"x\":{\"dtype\":\"F16\",\"shape\":[4,4],\"data_offsets\":[0,32]}}", 20,
     "safetensors: tensor 'x': data_offsets [0, 32] run past the end of the data section, "
     "which holds 20 bytes (truncated file?)"},
    {"overlap", 0,
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[4,12]}}",
     12, "safetensors: tensor 'b': data_offsets [4, 12] overlap tensor 'a', which ends at 8"},
    {"too_large", 100000001, "{}", 0,
     "safetensors: header too large: 100000001 bytes; the limit is 100000000"},
    {"dtype", 0, "{\"x\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]}}", 16,
     "safetensors: tensor 'x': unknown dtype 'F128'"},
    {"span", 0, "{\"k.0\":{\"dtype\":\"F16\",\"shape\":[5,8],\"data_offsets\":[0,100]}}", 100,
     "safetensors: tensor 'k.0': data_offsets [0, 100] span 100 bytes but shape [5, 8] x F16 "
     "needs 80"},
    {"gap", 0,
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[10,18]}}",
     18, "safetensors: tensor 'b': data_offsets [10, 18] leave a gap after tensor 'a', which "
         "ends at 8"},
    {"late_start", 0, "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[2,10]}}", 10,
     "safetensors: tensor 'a': data_offsets [2, 10] leave a gap: the data section starts at 0"},
    {"trailing", 0, "{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 11,
     "safetensors: the tensors cover 8 bytes but the data section holds 11: 3 trailing bytes"},
    {"reversed", 0, "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8,
     "safetensors: tensor 'a': data_offsets [8, 0] end before they begin"},
    {"header_cut", 1000, "{\"a\":1}", 0,
     "safetensors: truncated header: 1000 bytes declared but the file holds 7 after the size"},
    {"not_json", 0, "{\"a\":{\"dtype\":\"U8\",,}}", 0,
     "safetensors: header is not valid JSON: string or '}' expected near ',' (line 1, column 20)"},
    {"not_object", 0, "[1,2]", 0,
     "safetensors: header must be a JSON object starting with '{', got byte 0x5b"},
    {"duplicate", 0,
     "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
     "\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}",
     0, "safetensors: header is not valid JSON: duplicate object key near '\"a\"' (line 1, column 56)"},
    {"bad_utf8", 0, "{\"\xff\":1}", 0,
     "safetensors: header is not valid JSON: unable to decode byte 0xff near '\"' (line 1, column 2)"},
    {"overflow", 0,
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
     "safetensors: tensor 'a': shape [4294967296, 4294967296] x F32 overflows 64 bits"},
    {"no_dtype", 0, "{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
     "safetensors: tensor 'a': missing 'dtype'"},
    {"no_offsets", 0, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1,
     "safetensors: tensor 'a': missing 'data_offsets'"},
    {"three_offsets", 0, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 1,
     "safetensors: tensor 'a': data_offsets must hold 2 integers, got 3"},
    {"negative_dim", 0, "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}}", 1,
     "safetensors: tensor 'a': shape[0] must be a non-negative integer, got -1"},
    {"real_dim", 0, "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1,
     "safetensors: tensor 'a': shape[0] must be a non-negative integer, got real"},
    {"entry_type", 0, "{\"a\":[1]}", 0, "safetensors: tensor 'a': entry must be an object, got array"},
    {"meta_value", 0, "{\"__metadata__\":{\"k\":1}}", 0,
     "safetensors: __metadata__ entry 'k' must be a string, got integer"},
    {"partial_byte", 0, "{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1,
     "safetensors: tensor 'a': shape [3] x F4 is not a whole number of bytes"},
};

static void test_malformed(void)
{
    clear_dir(work);
    /* An earlier good output must survive a failed run untouched. */
    char out_path[4400], good[4400]; /* path_in's buffers are reused */
    snprintf(out_path, sizeof out_path, "%s", path_in("out.safetensors"));
    snprintf(good, sizeof good, "%s", path_in("good.safetensors"));
    REQUIRE(write_all_file(out_path, "previous", 8) == 0);
    REQUIRE(write_st(good, NULL, 0, NULL, 1) == 0);
    for (size_t i = 0; i < sizeof bad_files / sizeof bad_files[0]; i++) {
        const bad_file *b = &bad_files[i];
        char name[64];
        snprintf(name, sizeof name, "%s.safetensors", b->file);
        const char *p = path_in(name);
        write_raw(p, b->n ? b->n : strlen(b->header), b->header, b->ndata);
        CHECK_FAILS(ARGS("inspect", p), 1, strf("kvserde inspect: %s: %s\n", p, b->msg));
        CHECK_FAILS(ARGS("encode", p, out_path), 1, strf("kvserde encode: %s: %s\n", p, b->msg));
        CHECK_FAILS(ARGS("decode", p, out_path), 1, strf("kvserde decode: %s: %s\n", p, b->msg));
        CHECK_FAILS(ARGS("inspect", good, "--compare", p), 1,
                    strf("kvserde inspect: %s: %s\n", p, b->msg));
        /* only the inputs and the untouched earlier output are there */
        char *buf = read_all(out_path, NULL);
        CHECK_EQ_STR(buf, "previous");
        free(buf);
        unlink(p);
        CHECK_EQ_STR(listing(), "good.safetensors,out.safetensors");
    }
    const char *tiny = path_in("tiny.safetensors");
    REQUIRE(write_all_file(tiny, "\x01\x02\x03", 3) == 0);
    CHECK_FAILS(ARGS("inspect", tiny), 1,
                strf("kvserde inspect: %s: safetensors: file too small: 3 bytes; the header size "
                     "alone takes 8\n",
                     tiny));
}

/* Encoded files whose kvserde metadata does not add up. */
static void test_bad_kvserde_metadata(void)
{
    clear_dir(work);
    uint8_t codes[4] = {0x38, 0x40, 0x44, 0x48};
    const char *p = path_in("bad.safetensors"), *out = path_in("out.safetensors");
    struct {
        const char *meta;
        const char *dtype;
        const char *msg;
    } cases[] = {
        {"{\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\","
         "\"kvserde.dtype.y\":\"float32\"}",
         "F8_E4M3", "kvserde metadata: 'kvserde.dtype.y' names no tensor"},
        {"{\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\","
         "\"kvserde.dtype.x\":\"float32\"}",
         "F8_E5M2", "kvserde metadata: tensor 'x' is F8_E5M2 but kvserde.serde encodes float8_e4m3fn"},
        {"{\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\","
         "\"kvserde.dtype.x\":\"float32\"}",
         "I8", "kvserde metadata: tensor 'x' is I8; an encoded tensor without kvserde.shape must "
               "be F8_E4M3 or F8_E5M2"},
        {"{\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\","
         "\"kvserde.dtype.x\":\"uint8\"}",
         "F8_E4M3", "kvserde metadata: tensor 'x': original dtype 'uint8' is not float32, float16 "
                    "or bfloat16"},
        {"{\"kvserde.format\":\"2\",\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\"}", "F8_E4M3",
         "kvserde metadata: unsupported kvserde.format '2'; this kvserde reads format 1"},
        {"{\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\"}", "F8_E4M3",
         "kvserde metadata: 'kvserde.serde' without 'kvserde.format'"},
        {"{\"kvserde.dtype.x\":\"float32\"}", "F8_E4M3",
         "kvserde metadata: 'kvserde.dtype.x' without 'kvserde.serde'"},
        {"{\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"zip\\\"}\"}", "F8_E4M3",
         NULL /* the registry's message, checked by prefix */},
        {"{\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\","
         "\"kvserde.shape.x\":\"[4]\"}",
         "U8", "kvserde metadata: 'kvserde.shape.x' without 'kvserde.dtype.x'"},
        {"{\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\","
         "\"kvserde.dtype.x\":\"float32\",\"kvserde.shape.x\":\"[5]\"}",
         "U8", "tensor 'x': fp8: stored object is 4 bytes, destination layout needs 5"},
        {"{\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\","
         "\"kvserde.dtype.x\":\"float32\",\"kvserde.shape.x\":\"4\"}",
         "U8", "kvserde metadata: tensor 'x': kvserde.shape '4' is not a JSON array of sizes"},
        {"{\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\","
         "\"kvserde.extra\":\"1\"}",
         "U8", "kvserde metadata: unknown key 'kvserde.extra'"},
        {"{\"kvserde.format\":\"1\",\"kvserde.serde\":\"{\\\"stages\\\":[{\\\"type\\\":"
         "\\\"fp8\\\"}],\\\"type\\\":\\\"pipeline\\\"}\",\"kvserde.dtype.x\":\"float32\","
         "\"kvserde.shape.x\":\"[4]\"}",
         "U8", "kvserde metadata: tensor 'x' is not a frame but kvserde.serde is the pipeline "
               "serde"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tdesc t[] = {{"x", cases[i].dtype, "[4]", codes, 4}};
        REQUIRE(write_st(p, t, 1, cases[i].meta, 1) == 0);
        char *o = NULL, *e = NULL;
        CHECK_EQ_INT(run(&o, &e, ARGS("decode", p, out)), 1);
        CHECK_EQ_STR(o, "");
        if (cases[i].msg == NULL) {
            const char *want = strf("kvserde decode: %s: kvserde metadata: kvserde.serde: unknown "
                                    "serde type 'zip'",
                                    p);
            CHECK(e && strncmp(e, want, strlen(want)) == 0);
        } else {
            CHECK_EQ_STR(e, strf("kvserde decode: %s: %s\n", p, cases[i].msg));
        }
        free(o);
        free(e);
        CHECK(!exists(out));
        /* inspect without --compare lists any valid safetensors file */
        CHECK_EQ_INT(run(NULL, NULL, ARGS("inspect", p)), 0);
    }
    CHECK_EQ_STR(listing(), "bad.safetensors");

    /* decode wants an encoded file; encode refuses one (and kvserde.* keys). */
    uint8_t z = 1;
    tdesc plain[] = {{"z", "U8", "[1]", &z, 1}};
    REQUIRE(write_st(p, plain, 1, "{\"format\":\"pt\"}", 1) == 0);
    CHECK_FAILS(ARGS("decode", p, out), 1,
                strf("kvserde decode: %s: not a kvserde-encoded file (no 'kvserde.serde' "
                     "metadata) and no F8_E4M3 or F8_E5M2 tensor to decode\n",
                     p));
    const char *enc = path_in("enc.safetensors");
    REQUIRE(run(NULL, NULL, ARGS("encode", p, enc)) == 0);
    CHECK_FAILS(ARGS("encode", enc, out), 1,
                strf("kvserde encode: %s: metadata 'kvserde.format' is kvserde's own; the file "
                     "is already encoded (decode it first)\n",
                     enc));
    REQUIRE(write_st(p, plain, 1, "{\"kvserde.note\":\"x\"}", 1) == 0);
    CHECK_FAILS(ARGS("encode", p, out), 1,
                strf("kvserde encode: %s: metadata 'kvserde.note' is kvserde's own; rename or "
                     "remove that entry first\n",
                     p));
    CHECK(!exists(out));
}

/* A failed write leaves neither OUT nor a temporary file. */
static void test_failed_write(void)
{
    clear_dir(work);
    const char *in = write_roundtrip_input();
    REQUIRE(in);
    const char *nodir = path_in("nodir/out.safetensors");
    CHECK_FAILS(ARGS("encode", in, nodir), 1,
                strf("kvserde encode: safetensors: cannot create a temporary file in '%s': No "
                     "such file or directory\n",
                     path_in("nodir")));
    /* OUT is a directory: everything is written, the rename fails. */
    const char *dir = path_in("outdir");
    REQUIRE(mkdir(dir, 0755) == 0);
    char *o = NULL, *e = NULL;
    CHECK_EQ_INT(run(&o, &e, ARGS("encode", in, dir)), 1);
    CHECK_EQ_STR(o, "");
    const char *want = "kvserde encode: safetensors: cannot rename '";
    CHECK(e && strncmp(e, want, strlen(want)) == 0 &&
          strstr(e, strf("' to '%s': Is a directory\n", dir)));
    free(o);
    free(e);
    CHECK_EQ_STR(listing(), "in.safetensors,outdir");
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", in, dir)), 1);
    /* A directory that cannot be written to (not when running as root). */
    if (geteuid() != 0) {
        REQUIRE(chmod(dir, 0555) == 0);
        CHECK_EQ_INT(run(NULL, NULL, ARGS("encode", in, strf("%s/x.safetensors", dir))), 1);
        chmod(dir, 0755);
    }
    rmdir(dir);
    CHECK_EQ_STR(listing(), "in.safetensors");
    /* A relative OUT (no directory part) is written in the current one. */
}

/* ----- many tensors ---------------------------------------------------------- */

/* Every command is O(n log n) in the number of tensors (docs/cli.md): a file
 * of MANY tiny tensors goes through encode, inspect, inspect --compare and
 * decode, each within MANY_CPU_LIMIT seconds of CPU time (CPU, not wall
 * time, so a busy machine does not fail it). Each takes 2 to 5 s of CPU in
 * a plain build and 5 to 13 s with sanitizers; with a linear name lookup
 * per tensor, decode took 300 s and inspect --compare far longer. The header
 * lists the tensors by name while the data is in another order; every
 * 1000th tensor is U8 (kept as it is), the others BF16 [2]. */
#define MANY 200000u
#define MANY_CPU_LIMIT 40.0
#define MANY_U8(i) ((i) % 1000 == 999)
#define MANY_NU8 (MANY / 1000)

static void many_values(unsigned i, uint16_t v[2])
{
    v[0] = (uint16_t)(0x3F80 + i % 512);        /* 1.0 up to about 3 */
    v[1] = (uint16_t)(0xBE00 + (i * 13) % 256); /* small negatives */
}

/* A file of the 8-byte size, the header text and the data. */
static int write_parts(const char *path, const char *header, size_t len, const void *data,
                       size_t ndata)
{
    uint8_t n8[8];
    for (int b = 0; b < 8; b++) n8[b] = (uint8_t)((uint64_t)len >> (8 * b));
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(n8, 1, 8, f) == 8 && fwrite(header, 1, len, f) == len &&
             fwrite(data, 1, ndata, f) == ndata;
    if (f && fclose(f) != 0) ok = 0;
    return ok ? 0 : -1;
}

static int write_many(const char *path)
{
    uint64_t *off = malloc(MANY * sizeof *off);
    size_t cap = (size_t)MANY * 96 + 256, len = 0, ndata = 0;
    char *h = malloc(cap);
    uint8_t *data = malloc((size_t)MANY * 4);
    int rc = -1;
    if (off == NULL || h == NULL || data == NULL) goto out;
    /* Data slot s holds tensor s * 7919 mod MANY (7919 is prime to MANY). */
    for (unsigned s = 0; s < MANY; s++) {
        unsigned i = (unsigned)(((uint64_t)s * 7919) % MANY);
        off[i] = ndata;
        if (MANY_U8(i)) {
            data[ndata++] = (uint8_t)(i / 1000);
        } else {
            uint16_t v[2];
            many_values(i, v);
            memcpy(data + ndata, v, 4);
            ndata += 4;
        }
    }
    len += (size_t)snprintf(h, cap, "{\"__metadata__\":{\"source\":\"many\"}");
    for (unsigned i = 0; i < MANY; i++) {
        int u8 = MANY_U8(i);
        len += (size_t)snprintf(h + len, cap - len,
                                ",\"blk.%06u.kv\":{\"dtype\":\"%s\",\"shape\":[%d],"
                                "\"data_offsets\":[%llu,%llu]}",
                                i, u8 ? "U8" : "BF16", u8 ? 1 : 2, (unsigned long long)off[i],
                                (unsigned long long)off[i] + (u8 ? 1 : 4));
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    rc = write_parts(path, h, len, data, ndata);
out:
    free(off);
    free(h);
    free(data);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Run the tool; it must stay within MANY_CPU_LIMIT (the times are shown). */
static int run_timed(char **out, char **err, const char *what, const char *const *args)
{
    double t0 = now_s();
    int rc = run(out, err, args);
    fprintf(stderr, "  %u tensors: %s took %.2f s of CPU, %.2f s in all\n", MANY, what,
            last_run_cpu_s, now_s() - t0);
    if (last_run_cpu_s > MANY_CPU_LIMIT)
        KVS_FAIL_("%s of %u tensors took %.2f s of CPU; the limit is %.0f", what, MANY,
                  last_run_cpu_s, MANY_CPU_LIMIT);
    return rc;
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; s && *s; s++) n += *s == '\n';
    return n;
}

static void test_many_tensors(void)
{
    clear_dir(work);
    const char *in = path_in("many.safetensors"), *enc = path_in("many_enc.safetensors"),
               *dec = path_in("many_dec.safetensors");
    REQUIRE(write_many(in) == 0);
    const unsigned long long in_bytes = 4ull * (MANY - MANY_NU8) + MANY_NU8,
                             enc_bytes = 2ull * (MANY - MANY_NU8) + MANY_NU8;
    /* Sampled tensors: first, last, in between, and U8 ones. */
    static const unsigned samples[] = {0, 1, 7919, 123457, 199998, 999, 150999, 199999};
    const size_t nsamples = sizeof samples / sizeof samples[0];

    char *out = NULL, *err = NULL;
    CHECK_EQ_INT(run_timed(&out, &err, "encode", ARGS("encode", in, enc)), 0);
    CHECK_EQ_STR(out, strf("%s: encoded %u of %u tensors with {\"type\":\"fp8\"}; data %llu -> "
                           "%llu bytes\n",
                           enc, MANY - MANY_NU8, MANY, in_bytes, enc_bytes));
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);

    /* The listing: every metadata entry, every tensor in data order (the
     * F8_E4M3 ones by name, then the U8 ones). */
    CHECK_EQ_INT(run_timed(&out, &err, "inspect", ARGS("inspect", enc)), 0);
    CHECK_EQ_STR(err, "");
    free(err);
    REQUIRE(out);
    const char *head = strf("%s: %u tensors, header %llu bytes, data %llu bytes\n"
                            "metadata:\n"
                            "  kvserde.dtype.blk.000000.kv: bfloat16\n",
                            enc, MANY, header_size(enc), enc_bytes);
    CHECK(strncmp(out, head, strlen(head)) == 0);
    CHECK(strstr(out, "\n  kvserde.dtype.blk.199998.kv: bfloat16\n"
                      "  kvserde.format: 1\n"
                      "  kvserde.serde: {\"type\":\"fp8\"}\n"
                      "  source: many\n"
                      "tensors:\n"
                      "  NAME           DTYPE    SHAPE  BYTES\n"
                      "  blk.000000.kv  F8_E4M3  [2]        2\n"
                      "  blk.000001.kv  F8_E4M3  [2]        2\n") != NULL);
    CHECK(strstr(out, "\n  blk.199998.kv  F8_E4M3  [2]        2\n"
                      "  blk.000999.kv  U8       [1]        1\n") != NULL);
    const char *tail = "\n  blk.199999.kv  U8       [1]        1\n";
    CHECK(strlen(out) > strlen(tail) &&
          strcmp(out + strlen(out) - strlen(tail), tail) == 0);
    /* header line, "metadata:", the entries, "tensors:", the column names,
     * the rows */
    CHECK_EQ_U64(count_lines(out), 1 + 1 + (MANY - MANY_NU8 + 3) + 1 + 1 + MANY);
    free(out);

    /* --compare finds each tensor's original by name. */
    CHECK_EQ_INT(run_timed(&out, &err, "inspect --compare",
                           ARGS("inspect", enc, "--compare", in)),
                 0);
    CHECK_EQ_STR(err, "");
    free(err);
    REQUIRE(out);
    CHECK(strncmp(out, head, strlen(head)) == 0);
    CHECK_EQ_U64(count_lines(out), 1 + 1 + (MANY - MANY_NU8 + 3) + 1 + 1 + MANY + 1);
    const char *ratio = strf("\ndata: %llu bytes; %s: %llu bytes (ratio 0.500)\n", enc_bytes,
                             in, in_bytes);
    CHECK(strlen(out) > strlen(ratio) &&
          strcmp(out + strlen(out) - strlen(ratio), ratio) == 0);
    for (size_t k = 0; k < nsamples; k++) {
        unsigned i = samples[k];
        const char *name = strf("blk.%06u.kv", i);
        double x[2], o[2];
        if (MANY_U8(i)) {
            x[0] = o[0] = (double)(i / 1000);
            check_row(out, name, "U8", expect_figures(x, o, 1));
            continue;
        }
        uint16_t v[2];
        uint8_t codes[2];
        float back[2];
        many_values(i, v);
        CHECK_OK(kvs_fp8_encode(v, KVS_DTYPE_BFLOAT16, codes, KVS_DTYPE_FLOAT8_E4M3FN, 1, 2));
        CHECK_OK(kvs_fp8_decode(codes, KVS_DTYPE_FLOAT8_E4M3FN, back, KVS_DTYPE_FLOAT32, 2));
        for (int j = 0; j < 2; j++) {
            x[j] = back[j];
            o[j] = kvs_bf16_to_f32(v[j]);
        }
        check_row(out, name, "BF16", expect_figures(x, o, 2));
    }
    free(out);

    CHECK_EQ_INT(run_timed(&out, &err, "decode", ARGS("decode", enc, dec)), 0);
    CHECK_EQ_STR(out, strf("%s: decoded %u of %u tensors; data %llu -> %llu bytes\n", dec,
                           MANY - MANY_NU8, MANY, enc_bytes, in_bytes));
    CHECK_EQ_STR(err, "");
    free(out);
    free(err);

    /* The sampled tensors' bytes in both files. */
    stf fe, fd;
    REQUIRE(st_load(enc, &fe) == 0);
    if (st_load(dec, &fd) != 0) {
        st_free(&fe);
        KVS_FAIL_("cannot load %s", dec);
        return;
    }
    CHECK_EQ_U64(json_object_size(fe.hdr), MANY + 1);
    CHECK_EQ_U64(json_object_size(fd.hdr), MANY + 1);
    char *m = st_meta(&fd);
    CHECK_EQ_STR(m, "{\"source\":\"many\"}");
    free(m);
    for (size_t k = 0; k < nsamples; k++) {
        unsigned i = samples[k];
        const char *name = strf("blk.%06u.kv", i);
        const uint8_t *p;
        if (MANY_U8(i)) {
            uint8_t u = (uint8_t)(i / 1000);
            if ((p = st_get(&fe, name, "U8", "[1]", 1))) CHECK_EQ_INT(p[0], u);
            if ((p = st_get(&fd, name, "U8", "[1]", 1))) CHECK_EQ_INT(p[0], u);
            continue;
        }
        uint16_t v[2], want[2];
        uint8_t codes[2];
        many_values(i, v);
        CHECK_OK(kvs_fp8_encode(v, KVS_DTYPE_BFLOAT16, codes, KVS_DTYPE_FLOAT8_E4M3FN, 1, 2));
        CHECK_OK(kvs_fp8_decode(codes, KVS_DTYPE_FLOAT8_E4M3FN, want, KVS_DTYPE_BFLOAT16, 2));
        if ((p = st_get(&fe, name, "F8_E4M3", "[2]", 2))) CHECK(memcmp(p, codes, 2) == 0);
        if ((p = st_get(&fd, name, "BF16", "[2]", 4))) CHECK(memcmp(p, want, 4) == 0);
    }
    st_free(&fe);
    st_free(&fd);
}

/* encode refuses to write a header over the 100,000,000-byte cap (no
 * reader would open the file): CAP_N tensors with 4000-byte names make a
 * 53 MB header, and their kvserde.dtype entries double it. */
#define CAP_N 13000u
#define CAP_NAME 4000

static void cap_name(unsigned i, char *name)
{
    snprintf(name, CAP_NAME + 1, "%05u", i);
    memset(name + 5, 'n', CAP_NAME - 5);
    name[CAP_NAME] = '\0';
}

static void test_header_cap(void)
{
    clear_dir(work);
    const char *in = path_in("cap.safetensors"), *out_path = path_in("cap_enc.safetensors");
    size_t cap = (size_t)CAP_N * (CAP_NAME + 80) + 64, len = 0;
    char *h = malloc(cap), name[CAP_NAME + 1];
    uint16_t *data = calloc(CAP_N, sizeof *data);
    REQUIRE(h && data);
    len += (size_t)snprintf(h, cap, "{");
    for (unsigned i = 0; i < CAP_N; i++) {
        cap_name(i, name);
        len += (size_t)snprintf(h + len, cap - len,
                                "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[1],"
                                "\"data_offsets\":[%u,%u]}",
                                i ? "," : "", name, 2 * i, 2 * i + 2);
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    int rc = write_parts(in, h, len, data, CAP_N * sizeof *data);
    free(h);
    free(data);
    REQUIRE(rc == 0);

    /* The header the writer would make: __metadata__ (sorted keys), then
     * the F8_E4M3 tensors by name, padded to 8 bytes. */
    size_t want = strlen("{\"__metadata__\":{") + strlen("\"kvserde.format\":\"1\",") +
                  strlen("\"kvserde.serde\":\"{\\\"type\\\":\\\"fp8\\\"}\"}") + strlen("}");
    for (unsigned i = 0; i < CAP_N; i++) {
        want += strlen("\"kvserde.dtype.\":\"bfloat16\",") + CAP_NAME;
        want += (size_t)snprintf(NULL, 0, ",\"%s\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],"
                                          "\"data_offsets\":[%u,%u]}",
                                 "", i, i + 1) +
                CAP_NAME;
    }
    want = (want + 7) / 8 * 8;
    CHECK_FAILS(ARGS("encode", in, out_path), 1,
                strf("kvserde encode: safetensors: the header would take %zu bytes; the limit "
                     "is 100000000\n",
                     want));
    CHECK_EQ_STR(listing(), "cap.safetensors");
}

/* ----- kv_split: K and V as tensors of their own ------------------------ */

#define KV_L 3
#define KV_T 4
#define KV_H 8
#define KV_HALF (KV_L * KV_T * KV_H)

static uint16_t kv_in[2 * KV_HALF]; /* bf16 [2, 3, 4, 8] */

/* An input with the bf16 tensor "kv" [2, 3, 4, 8] (V values spread over
 * several binades, so the scales matter) and an untouched U8 "ids". */
static const char *write_kv_input(void)
{
    for (size_t i = 0; i < 2 * KV_HALF; i++) {
        float x = (float)((int)(i * 37 % 23) - 11) * (0.03f + (float)(i % KV_H) * 0.4f);
        kv_in[i] = kvs_f32_to_bf16(x);
    }
    const char *in = path_in("kv_in.safetensors");
    tdesc t[] = {{"kv", "BF16", "[2,3,4,8]", kv_in, sizeof kv_in}, {"ids", "U8", "[7]", ids, 7}};
    return write_st(in, t, 2, "{\"format\":\"pt\"}", 1) == 0 ? in : NULL;
}

/* The library's own kv_split round trip of kv_in with `config`: the blob
 * and its description, and K / V read back as `dtype` into out (2 halves). */
static int lib_kv_split(const char *config, kvs_dtype dtype, uint8_t **blob, size_t *blob_len,
                        kvs_kv_split_info *info, void *out)
{
    kvs_multi_serde_pair pair;
    if (kvs_multi_serde_create_pair(config, &pair) != KVS_OK) return -1;
    int64_t dims[3] = {KV_L, KV_T, KV_H};
    kvs_layout half, dhalf, bl;
    kvs_memobj k, v, dst, dk, dv;
    memset(&dhalf, 0, sizeof dhalf);
    memset(&half, 0, sizeof half);
    kvs_layout_add_group(&half, 3, dims, KVS_DTYPE_BFLOAT16);
    kvs_layout_add_group(&dhalf, 3, dims, dtype);
    int v_only = strstr(config, "v_only") != NULL;
    const kvs_layout *layouts[2] = {v_only ? NULL : &half, &half};
    size_t est = 0, nw = 0, hb = KV_HALF * kvs_dtype_size(dtype);
    int rc = kvs_multi_estimate_serialized_size(pair.serializer, layouts, 2, &est);
    *blob = malloc(est);
    kvs_layout_flat(&bl, est, KVS_DTYPE_UINT8);
    rc |= kvs_memobj_init(&k, kv_in, sizeof kv_in / 2, &half, KVS_FMT_UNDEFINED);
    rc |= kvs_memobj_init(&v, kv_in + KV_HALF, sizeof kv_in / 2, &half, KVS_FMT_UNDEFINED);
    rc |= kvs_memobj_init(&dst, *blob, est, &bl, KVS_FMT_BINARY_BUFFER);
    kvs_memobj *src[2] = {v_only ? NULL : &k, &v};
    if (rc == KVS_OK) rc = kvs_multi_serialize(pair.serializer, src, 2, &dst, NULL, &nw);
    *blob_len = nw;
    if (rc == KVS_OK) rc = kvs_kv_split_inspect(*blob, nw, info);
    dst.used_size = nw;
    rc |= kvs_memobj_init(&dk, out, hb, &dhalf, KVS_FMT_UNDEFINED);
    rc |= kvs_memobj_init(&dv, (uint8_t *)out + hb, hb, &dhalf, KVS_FMT_UNDEFINED);
    kvs_memobj *dg[2] = {v_only ? NULL : &dk, &dv};
    if (rc == KVS_OK) rc = kvs_multi_deserialize(pair.deserializer, &dst, dg, 2, NULL);
    kvs_multi_serde_pair_destroy(&pair);
    return rc;
}

/* Encode kv_in with `config`, check the parts against the library's blob,
 * decode (to bfloat16 and to float32) and check against the library's own
 * round trip. scope_json is the "v" entry of the kv_split metadata. */
static void check_kv_split(const char *config, const char *v_shape_json, const char *v_entry)
{
    clear_dir(work);
    const char *in = write_kv_input();
    REQUIRE(in);
    const char *enc = path_in("kv_enc.safetensors"), *dec = path_in("kv_dec.safetensors");
    char *serde = strf("--serde=%s", config);
    CHECK_EQ_INT(run(NULL, NULL, ARGS("encode", serde, in, enc)), 0);
    uint8_t *blob = NULL;
    size_t blob_len = 0;
    kvs_kv_split_info info;
    static uint16_t want16[2 * KV_HALF];
    static float want32[2 * KV_HALF];
    REQUIRE(lib_kv_split(config, KVS_DTYPE_BFLOAT16, &blob, &blob_len, &info, want16) == 0);
    free(blob);
    REQUIRE(lib_kv_split(config, KVS_DTYPE_FLOAT32, &blob, &blob_len, &info, want32) == 0);
    const kvs_kv_split_slot_info *vs = &info.slots[1];
    stf f;
    REQUIRE(st_load(enc, &f) == 0);
    CHECK_EQ_U64(json_object_size(f.hdr), 5); /* __metadata__ + 4 tensors */
    const uint8_t *p;
    /* K native, exactly the input's K half. */
    if ((p = st_get(&f, "kv.k", "BF16", "[3,4,8]", sizeof kv_in / 2)))
        CHECK(memcmp(p, kv_in, sizeof kv_in / 2) == 0);
    /* V: the blob's codes, and its scales beside them. */
    uint64_t codes_at = vs->offset + (vs->nscales ? 24 + 4 * vs->nscales : 0);
    if ((p = st_get(&f, "kv.v", "F8_E4M3", "[3,4,8]", KV_HALF)))
        CHECK(memcmp(p, blob + codes_at, KV_HALF) == 0);
    size_t nscales = vs->nscales ? (size_t)vs->nscales : 1;
    if ((p = st_get(&f, "kv.v_scale", "F32", v_shape_json, 4 * nscales))) {
        if (vs->nscales)
            CHECK(memcmp(p, blob + vs->scales_offset, 4 * nscales) == 0);
        else
            CHECK(memcmp(p, &vs->scale, 4) == 0);
    }
    if ((p = st_get(&f, "ids", "U8", "[7]", 7))) CHECK(memcmp(p, ids, 7) == 0);
    char *m = st_meta(&f);
    char *canon = NULL;
    json_t *cj = json_loads(config, 0, NULL);
    canon = json_dumps(cj, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(cj);
    json_t *want_meta = json_pack("{s:s,s:s,s:s,s:s}", "format", "pt", "kvserde.format", "1",
                                  "kvserde.serde", canon, "kvserde.kv_split.kv", "");
    char *entry = strf("{\"dtype\":\"bfloat16\",\"k\":{\"tensor\":\"kv.k\"},\"shape\":[2,3,4,8],"
                       "\"v\":%s}", v_entry);
    json_object_set_new(want_meta, "kvserde.kv_split.kv", json_string(entry));
    char *wm = json_dumps(want_meta, JSON_COMPACT | JSON_SORT_KEYS);
    CHECK_EQ_STR(m, wm);
    free(wm);
    json_decref(want_meta);
    free(canon);
    free(m);
    st_free(&f);
    free(blob);

    /* decode: the [2, ...] tensor, byte for byte what kv_split gives. */
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", enc, dec)), 0);
    REQUIRE(st_load(dec, &f) == 0);
    CHECK_EQ_U64(json_object_size(f.hdr), 3);
    if ((p = st_get(&f, "kv", "BF16", "[2,3,4,8]", sizeof kv_in))) {
        CHECK(memcmp(p, want16, sizeof want16) == 0);
        CHECK(memcmp(p, kv_in, sizeof kv_in / 2) == 0); /* K exact */
        const uint16_t *got = (const uint16_t *)p;
        for (size_t i = KV_HALF; i < 2 * KV_HALF; i++) { /* V within fp8 error */
            float x = kvs_bf16_to_f32(kv_in[i]), y = kvs_bf16_to_f32(got[i]);
            if (!(fabsf(y - x) <= fabsf(x) * (0.0625f + 0.008f) + 1e-3f)) {
                KVS_FAIL_("V element %zu: %g read back as %g", i - KV_HALF, x, y);
                break;
            }
        }
    }
    if ((p = st_get(&f, "ids", "U8", "[7]", 7))) CHECK(memcmp(p, ids, 7) == 0);
    m = st_meta(&f);
    CHECK_EQ_STR(m, "{\"format\":\"pt\"}");
    free(m);
    st_free(&f);
    CHECK_EQ_INT(run(NULL, NULL, ARGS("decode", "--dtype", "float32", enc, dec)), 0);
    REQUIRE(st_load(dec, &f) == 0);
    if ((p = st_get(&f, "kv", "F32", "[2,3,4,8]", sizeof want32)))
        CHECK(memcmp(p, want32, sizeof want32) == 0);
    st_free(&f);
}

static void test_kv_split_roundtrip(void)
{
    check_kv_split("{\"type\": \"kv_split\"}", "[1]",
                   "{\"scale\":\"kv.v_scale\",\"scope\":\"per_tensor\",\"tensor\":\"kv.v\"}");
}

static void test_kv_split_per_token(void)
{
    /* one scale per token of each layer: 3 x 4 = 12 */
    check_kv_split("{\"type\": \"kv_split\", \"scale\": \"per_token\"}", "[12]",
                   "{\"grid\":[8,1,8],\"scale\":\"kv.v_scale\",\"scope\":\"per_token\","
                   "\"tensor\":\"kv.v\"}");
}

static void test_kv_split_refusals(void)
{
    clear_dir(work);
    uint16_t x[12] = {0};
    const char *in = path_in("x.safetensors"), *out = path_in("x_enc.safetensors");
    tdesc t[] = {{"x", "BF16", "[3,4]", x, sizeof x}};
    REQUIRE(write_st(in, t, 1, NULL, 1) == 0);
    CHECK_FAILS(ARGS("encode", "--serde", "{\"type\":\"kv_split\"}", in, out), 1,
                "kvserde encode: tensor 'x' is [3x4] bfloat16; the kv_split serde needs a K/V "
                "axis of size 2 first ([2, ...])\n");
    CHECK(!exists(out));
    CHECK_FAILS(ARGS("encode", "--raw", "--serde", "{\"type\":\"kv_split\"}", in, out), 2,
                "kvserde encode: --raw does not apply to the kv_split serde, which writes K and "
                "V as tensors of their own\n");
    CHECK(!exists(out));
}

static void test_kv_split_v_only(void)
{
    clear_dir(work);
    const char *in = write_kv_input();
    REQUIRE(in);
    const char *config = "{\"type\":\"kv_split\",\"mode\":\"v_only\"}";
    const char *enc = path_in("vo.safetensors"), *dec = path_in("vo_dec.safetensors");
    CHECK_EQ_INT(run(NULL, NULL, ARGS("encode", "--serde", config, in, enc)), 0);
    uint8_t *blob = NULL;
    size_t blob_len = 0;
    kvs_kv_split_info info;
    static uint16_t want16[2 * KV_HALF];
    REQUIRE(lib_kv_split(config, KVS_DTYPE_BFLOAT16, &blob, &blob_len, &info, want16) == 0);
    CHECK(!info.slots[0].present);
    stf f;
    REQUIRE(st_load(enc, &f) == 0);
    CHECK_EQ_U64(json_object_size(f.hdr), 4); /* __metadata__, kv.v, kv.v_scale, ids */
    CHECK(json_object_get(f.hdr, "kv.k") == NULL);
    const uint8_t *p;
    if ((p = st_get(&f, "kv.v", "F8_E4M3", "[3,4,8]", KV_HALF)))
        CHECK(memcmp(p, blob + info.slots[1].offset, KV_HALF) == 0);
    if ((p = st_get(&f, "kv.v_scale", "F32", "[1]", 4))) CHECK(memcmp(p, &info.slots[1].scale, 4) == 0);
    st_get(&f, "ids", "U8", "[7]", 7);
    char *m = st_meta(&f);
    CHECK_EQ_STR(m, "{\"format\":\"pt\",\"kvserde.format\":\"1\",\"kvserde.kv_split.kv\":"
                    "\"{\\\"dtype\\\":\\\"bfloat16\\\",\\\"shape\\\":[2,3,4,8],\\\"v\\\":"
                    "{\\\"scale\\\":\\\"kv.v_scale\\\",\\\"scope\\\":\\\"per_tensor\\\","
                    "\\\"tensor\\\":\\\"kv.v\\\"}}\",\"kvserde.serde\":"
                    "\"{\\\"mode\\\":\\\"v_only\\\",\\\"type\\\":\\\"kv_split\\\"}\"}");
    free(m);
    st_free(&f);
    free(blob);
    char *msg = strf("kvserde decode: %s: tensor 'kv' cannot be restored: it was encoded with "
                     "kv_split mode v_only, so only V is stored ('kv.v'); K was never stored\n",
                     enc);
    CHECK_FAILS(ARGS("decode", enc, dec), 1, msg);
    CHECK(!exists(dec));
}

int main(int argc, char **argv)
{
    const char *bin = getenv("KVS_TEST_BIN_DIR");
    if (bin == NULL) {
        fprintf(stderr, "KVS_TEST_BIN_DIR is not set (ctest sets it)\n");
        return 1;
    }
    snprintf(tool, sizeof tool, "%s/kvserde", bin);
    const char *tmp = getenv("TMPDIR");
    snprintf(root_dir, sizeof root_dir, "%s/kvs_tool_files_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(root_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(io_dir, sizeof io_dir, "%s/io", root_dir);
    snprintf(work, sizeof work, "%s/work", root_dir);
    if (mkdir(io_dir, 0700) != 0 || mkdir(work, 0700) != 0) {
        perror("mkdir");
        return 1;
    }

    /* `test_tool_files many_tensors` (the ctest tool_many_tensors, with its
     * own TIMEOUT) runs the tests of large files alone. */
    if (argc > 1 && strcmp(argv[1], "many_tensors") == 0) {
        RUN(test_many_tensors);
        RUN(test_header_cap);
    } else {
        RUN(test_usage);
        RUN(test_roundtrip_e4m3);
        RUN(test_roundtrip_e5m2);
        RUN(test_selected_tensors);
        RUN(test_decode_dtype);
        RUN(test_raw_blobs);
        RUN(test_exact_layout);
        RUN(test_inspect);
        RUN(test_odd_shapes);
        RUN(test_compare);
        RUN(test_malformed);
        RUN(test_bad_kvserde_metadata);
        RUN(test_failed_write);
        RUN(test_frames_roundtrip);
        RUN(test_frames_damaged);
        RUN(test_frames_aes_gcm);
        RUN(test_frames_inspect);
        RUN(test_plain_fp8);
        RUN(test_ggml_blocks);
        RUN(test_kv_split_roundtrip);
        RUN(test_kv_split_per_token);
        RUN(test_kv_split_refusals);
        RUN(test_kv_split_v_only);
    }

    clear_dir(root_dir);
    rmdir(root_dir);
    return TEST_SUMMARY();
}
