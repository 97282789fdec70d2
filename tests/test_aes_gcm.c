/* test_aes_gcm.c - the aes_gcm stage (src/frame/stage_aes_gcm.c): key files
 * and configs, the keyring, round trips, authentication of ciphertext,
 * header and object key, key rotation, known answers (key id, HKDF, NIST
 * AES-256-GCM, the whole blob format), piecing, threads, > 2 GiB payloads.
 *
 * The known answers were computed outside the library: the key id with
 * `openssl dgst -sha256`, the subkeys with `openssl kdf -keylen 32 -kdfopt
 * digest:SHA256 -kdfopt hexkey:<key> -kdfopt hexinfo:<info> HKDF`, the
 * blobs with Python's `cryptography` (HKDF + AESGCM over the AAD built from
 * the documented layout). The 2 GiB case is skipped under valgrind (too
 * slow) or when KVS_TEST_SKIP_LARGE is set. */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frame/stage.h"
#include "frame/stage_aes_gcm.h"
#include "kvs_test.h"
#include "kvserde/memobj.h"

static const kvs_stage_type *T = &kvs_stage_aes_gcm_type;
static char dir[64];

/* K1 = 00 01 .. 1f, K2 = ff fe .. e0 */
static uint8_t K1[32], K2[32];
static const char K1_ID[] = "62e759943ffeb05c";
static char k1_raw[128], k1_hex[128], k1_hexnl[128], k2_raw[128];

static void path_in_dir(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static void write_file(const char *path, const void *data, size_t n, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || write(fd, data, n) != (ssize_t)n || fchmod(fd, mode) != 0) {
        perror(path);
        exit(2);
    }
    close(fd);
}

static char *hex_of(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
    return out;
}

static void unhex(const char *h, uint8_t *out)
{
    for (size_t i = 0; h[2 * i]; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        out[i] = (uint8_t)v;
    }
}

/* A stage from a JSON text config. */
static int make_stage(const char *json, kvs_stage **out)
{
    json_error_t e;
    json_t *cfg = json_loads(json, 0, &e);
    if (cfg == NULL) {
        fprintf(stderr, "bad test JSON: %s\n", json);
        exit(2);
    }
    int rc = T->create(cfg, out);
    json_decref(cfg);
    return rc;
}

static int make_stage_files(const char *a, const char *b, kvs_stage **out)
{
    char json[512];
    if (b)
        snprintf(json, sizeof json, "{\"type\": \"aes_gcm\", \"key_files\": [\"%s\", \"%s\"]}",
                 a, b);
    else
        snprintf(json, sizeof json, "{\"type\": \"aes_gcm\", \"key_files\": [\"%s\"]}", a);
    return make_stage(json, out);
}

static int make_keyring(const char *stages_json, kvs_keyring **out)
{
    json_error_t e;
    json_t *st = json_loads(stages_json, 0, &e);
    if (st == NULL) {
        fprintf(stderr, "bad test JSON: %s\n", stages_json);
        exit(2);
    }
    int rc = kvs_keyring_from_config(st, out);
    json_decref(st);
    return rc;
}

static int make_keyring_files(const char *a, const char *b, kvs_keyring **out)
{
    char json[512];
    if (b)
        snprintf(json, sizeof json,
                 "[{\"type\": \"bytes\"}, {\"type\": \"aes_gcm\", \"key_files\": [\"%s\", "
                 "\"%s\"]}]",
                 a, b);
    else
        snprintf(json, sizeof json,
                 "[{\"type\": \"bytes\"}, {\"type\": \"aes_gcm\", \"key_file\": \"%s\"}]", a);
    return make_keyring(json, out);
}

static kvs_object_key test_key(const char *salt, uint8_t hash0)
{
    kvs_object_key k;
    uint8_t hash[8];
    for (int i = 0; i < 8; i++) hash[i] = (uint8_t)(hash0 + i);
    if (kvs_object_key_init(&k, hash, sizeof hash, "llama-3-8b", -2, 7, salt) != KVS_OK) exit(2);
    return k;
}

static uint8_t HEADER[40];

/* One encode of in[0..n) with fresh params; the blob (ciphertext || tag)
 * into out; params into params. */
static int encode(const kvs_stage *s, const kvs_object_key *key, const uint8_t *in, size_t n,
                  uint8_t *out, size_t cap, uint8_t *params, size_t *outn)
{
    int rc = T->write_params(s, params);
    if (rc) return rc;
    kvs_stage_ctx ctx = {key, HEADER, sizeof HEADER, NULL, 0, 0, NULL};
    return T->transform_encode(s, params, T->params_size(s), &ctx, in, n, out, cap, outn);
}

static int decode(const kvs_keyring *kr, const kvs_object_key *key, const uint8_t *header,
                  const uint8_t *params, const uint8_t *in, size_t n, uint8_t *out,
                  size_t cap, size_t *outn)
{
    kvs_stage_ctx ctx = {key, header, sizeof HEADER, kr, 0, 0, NULL};
    return T->transform_decode(params, KVS_AES_GCM_PARAMS_LEN, &ctx, in, n, out, cap, outn);
}

static int all_zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 0;
    return 1;
}

/* ------------------------------------------------------------------------ */

static void test_type(void)
{
    CHECK_EQ_STR(T->name, "aes_gcm");
    CHECK_EQ_INT(T->id, KVS_STAGE_AES_GCM);
    CHECK_EQ_INT(T->id, 66);
    CHECK_EQ_INT(T->kind, KVS_STAGE_TRANSFORM);
    CHECK_EQ_INT(T->in_place, 1);
    CHECK(T->typed_encode == NULL && T->check_digest == NULL);
    kvs_stage *s = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s));
    CHECK(s->type == T);
    CHECK_EQ_U64(T->bytes_bound(s, 0), 16);
    CHECK_EQ_U64(T->bytes_bound(s, 1000), 1016);
    CHECK_EQ_U64(T->bytes_bound(s, SIZE_MAX), SIZE_MAX);
    CHECK_EQ_U64(T->params_size(s), 20);
    T->destroy(s);
    T->destroy(NULL);
}

static void test_key_files_accepted(void)
{
    const char *paths[] = {k1_raw, k1_hex, k1_hexnl};
    char upper[128];
    char hex[65];
    hex_of(K1, 32, hex);
    for (char *c = hex; *c; c++)
        if (*c >= 'a') *c = (char)(*c - 'a' + 'A');
    path_in_dir(upper, sizeof upper, "k1.HEX");
    write_file(upper, hex, 64, 0400);
    for (int i = 0; i < 4; i++) {
        const char *p = i < 3 ? paths[i] : upper;
        char json[256];
        snprintf(json, sizeof json, "{\"type\": \"aes_gcm\", \"key_file\": \"%s\"}", p);
        kvs_stage *s = NULL;
        CHECK_OK(make_stage(json, &s));
        if (s == NULL) continue;
        uint8_t params[20];
        CHECK_OK(T->write_params(s, params));
        json_t *d = T->describe_params(params, sizeof params);
        CHECK(d != NULL);
        CHECK_EQ_STR(json_string_value(json_object_get(d, "key_id")), K1_ID);
        CHECK_EQ_INT(strlen(json_string_value(json_object_get(d, "nonce"))), 24);
        CHECK_EQ_INT(json_object_size(d), 2);
        json_decref(d);
        T->destroy(s);
    }
    /* mode 0700 (owner execute) and 0400 are fine */
    char p[128];
    path_in_dir(p, sizeof p, "k1.0700");
    write_file(p, K1, 32, 0700);
    kvs_stage *s = NULL;
    CHECK_OK(make_stage_files(p, NULL, &s));
    T->destroy(s);
}

/* A key file `name` of data[0..n) with `mode` is refused with `code` and
 * "aes_gcm: key file <path>" followed by `rest`. */
static void check_refused_file(const char *name, const void *data, size_t n, mode_t mode,
                               int code, const char *rest)
{
    char p[128], msg[512];
    kvs_stage *s = (kvs_stage *)1;
    path_in_dir(p, sizeof p, name);
    write_file(p, data, n, mode);
    snprintf(msg, sizeof msg, "aes_gcm: key file %s%s", p, rest);
    CHECK_ERR(make_stage_files(p, NULL, &s), code, msg);
    CHECK(s == NULL);
}

static void test_key_files_refused(void)
{
    static const struct {
        mode_t mode;
        const char *rest;
    } modes[] = {
        {0644, " is readable by group or others (mode 0644); chmod 600 it"},
        {0640, " is readable by group or others (mode 0640); chmod 600 it"},
        {0604, " is readable by group or others (mode 0604); chmod 600 it"},
        {0620, " is writable by group or others (mode 0620); chmod 600 it"},
        {0602, " is writable by group or others (mode 0602); chmod 600 it"},
    };
    for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
        check_refused_file("mode", K1, 32, modes[i].mode, KVS_EINVAL, modes[i].rest);

    static const size_t sizes[] = {0, 17, 31, 33, 63, 66, 100};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        uint8_t data[100];
        char rest[160];
        memset(data, 'a', sizeof data);
        snprintf(rest, sizeof rest,
                 " is %zu bytes; expected 32 raw bytes or 64 hex characters (optionally "
                 "followed by one newline)",
                 sizes[i]);
        check_refused_file("size", data, sizes[i], 0600, KVS_EINVAL, rest);
    }

    static const struct {
        size_t at, len;
        char c;
        const char *rest;
    } hexes[] = {
        {10, 64, 'g',
         ": character 11 is not a hex digit (a key file of 64 or 65 bytes holds 64 hex "
         "characters, optionally followed by one newline)"},
        {63, 64, '\n',
         ": character 64 is not a hex digit (a key file of 64 or 65 bytes holds 64 hex "
         "characters, optionally followed by one newline)"},
        {64, 65, ' ',
         " is 65 bytes but its last byte is not a newline (expected 64 hex characters, "
         "optionally followed by one newline)"},
    };
    for (size_t i = 0; i < sizeof hexes / sizeof *hexes; i++) {
        char hex[66];
        hex_of(K1, 32, hex);
        hex[hexes[i].at] = hexes[i].c;
        check_refused_file("badhex", hex, hexes[i].len, 0600, KVS_EINVAL, hexes[i].rest);
    }

    char p[128], msg[512];
    kvs_stage *s = NULL;
    path_in_dir(p, sizeof p, "missing");
    snprintf(msg, sizeof msg,
             "aes_gcm: cannot open key file %s: No such file or directory", p);
    CHECK_ERR(make_stage_files(p, NULL, &s), KVS_ENOTFOUND, msg);
    /* a bad second file fails the whole config, for the stage and the keyring */
    CHECK_ERR(make_stage_files(k1_raw, p, &s), KVS_ENOTFOUND, msg);
    kvs_keyring *kr = (kvs_keyring *)1;
    CHECK_ERR(make_keyring_files(k1_raw, p, &kr), KVS_ENOTFOUND, msg);
    CHECK(kr == NULL);

    snprintf(msg, sizeof msg, "aes_gcm: key file %s is not a regular file", dir);
    CHECK_ERR(make_stage_files(dir, NULL, &s), KVS_EINVAL, msg);
}

static void test_config_refused(void)
{
    kvs_stage *s = NULL;
    char json[512];
    snprintf(json, sizeof json,
             "{\"type\": \"aes_gcm\", \"key_file\": \"%s\", \"key_files\": [\"%s\"]}", k1_raw,
             k1_raw);
    CHECK_ERR(make_stage(json, &s), KVS_EINVAL,
              "aes_gcm: give either key_file or key_files, not both");
    CHECK_ERR(make_stage("{\"type\": \"aes_gcm\"}", &s), KVS_EINVAL,
              "aes_gcm: no key file; give \"key_files\": [\"/path\", ...] or \"key_file\": "
              "\"/path\"");
    snprintf(json, sizeof json, "{\"type\": \"aes_gcm\", \"key_file\": \"%s\", \"key\": 1}",
             k1_raw);
    CHECK_ERR(make_stage(json, &s), KVS_EINVAL,
              "aes_gcm: unknown member 'key'; accepted: type, key_file, key_files");
    CHECK_ERR(make_stage("{\"type\": \"aes_gcm\", \"key_files\": \"/k\"}", &s), KVS_EINVAL,
              "aes_gcm: key_files must be a JSON array of paths, got string");
    CHECK_ERR(make_stage("{\"type\": \"aes_gcm\", \"key_files\": []}", &s), KVS_EINVAL,
              "aes_gcm: key_files is empty; give at least one key file");
    snprintf(json, sizeof json, "{\"type\": \"aes_gcm\", \"key_files\": [\"%s\", 3]}", k1_raw);
    CHECK_ERR(make_stage(json, &s), KVS_EINVAL,
              "aes_gcm: key_files[1] must be a string (a path), got integer");
    CHECK_ERR(make_stage("{\"type\": \"aes_gcm\", \"key_file\": [\"/k\"]}", &s), KVS_EINVAL,
              "aes_gcm: key_file must be a string (a path), got array");
    CHECK_ERR(make_stage("{\"type\": \"aes_gcm\", \"key_file\": \"\"}", &s), KVS_EINVAL,
              "aes_gcm: key_file is an empty path");
    CHECK_ERR(make_stage("{\"type\": \"aes_gcm\", \"key_files\": [\"\"]}", &s), KVS_EINVAL,
              "aes_gcm: key_files[0] is an empty path");
    CHECK_ERR(make_stage("[1]", &s), KVS_EINVAL,
              "aes_gcm: config must be a JSON object, got array");
    CHECK(s == NULL);
}

static void test_keyring_config(void)
{
    kvs_keyring *kr = (kvs_keyring *)1;
    CHECK_OK(kvs_keyring_from_config(NULL, &kr));
    CHECK(kr == NULL);
    kr = (kvs_keyring *)1;
    CHECK_OK(make_keyring("[{\"type\": \"bytes\"}, {\"type\": \"crc32c\"}, 5]", &kr));
    CHECK(kr == NULL);
    CHECK_ERR(make_keyring("{\"type\": \"aes_gcm\"}", &kr), KVS_EINVAL,
              "aes_gcm: the stages must be a JSON array, got object");
    CHECK_ERR(make_keyring("[{\"type\": \"aes_gcm\", \"key_files\": []}]", &kr), KVS_EINVAL,
              "aes_gcm: key_files is empty; give at least one key file");
    kvs_keyring_free(NULL);

    /* keys of two aes_gcm stages are collected (and duplicates kept once):
     * a blob of either decodes */
    char json[768];
    snprintf(json, sizeof json,
             "[{\"type\": \"aes_gcm\", \"key_file\": \"%s\"}, {\"type\": \"aes_gcm\", "
             "\"key_files\": [\"%s\", \"%s\", \"%s\"]}]",
             k2_raw, k1_hex, k2_raw, k1_raw);
    REQUIRE_OK(make_keyring(json, &kr));
    REQUIRE(kr != NULL);
    kvs_stage *s1 = NULL, *s2 = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s1));
    REQUIRE_OK(make_stage_files(k2_raw, NULL, &s2));
    uint8_t in[64], blob[80], out[64], params[20];
    memset(in, 0x42, sizeof in);
    size_t n = 0;
    kvs_object_key key = test_key("tenant-a", 1);
    for (int i = 0; i < 2; i++) {
        CHECK_OK(encode(i ? s2 : s1, &key, in, sizeof in, blob, sizeof blob, params, &n));
        CHECK_OK(decode(kr, &key, HEADER, params, blob, n, out, sizeof out, &n));
        CHECK_EQ_U64(n, sizeof in);
        CHECK(memcmp(in, out, sizeof in) == 0);
    }
    /* the no-match message lists each configured key once, in order */
    uint8_t bogus[20] = {0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};
    uint8_t id2[8];
    char id2hex[17], msg[256];
    REQUIRE_OK(kvs_aes_gcm_key_id(K2, id2));
    snprintf(msg, sizeof msg,
             "aes_gcm: no configured key has key id 0123456789abcdef (configured: %s, %s)",
             hex_of(id2, 8, id2hex), K1_ID);
    CHECK_ERR(decode(kr, &key, HEADER, bogus, blob, n, out, sizeof out, &n), KVS_EAUTH, msg);
    T->destroy(s1);
    T->destroy(s2);
    kvs_keyring_free(kr);
}

static void test_round_trip(void)
{
    kvs_stage *s = NULL;
    kvs_keyring *kr = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s));
    REQUIRE_OK(make_keyring_files(k1_raw, NULL, &kr));
    kvs_object_key key = test_key("tenant-a", 1);
    static const size_t sizes[] = {0, 1, 15, 16, 17, 4096, 100003};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t n = sizes[si];
        uint8_t *in = malloc(n + 16), *buf = malloc(n + 16), *out = malloc(n + 1);
        REQUIRE(in && buf && out);
        for (size_t i = 0; i < n; i++) in[i] = (uint8_t)(i * 31 + 5);
        for (int keyed = 0; keyed < 2; keyed++) {
            const kvs_object_key *k = keyed ? &key : NULL;
            uint8_t params[20];
            size_t outn = 99;
            /* not in place */
            CHECK_OK(encode(s, k, in, n, buf, n + 16, params, &outn));
            CHECK_EQ_U64(outn, n + 16);
            CHECK(n < 16 || memcmp(buf, in, n) != 0);
            CHECK_OK(decode(kr, k, HEADER, params, buf, n + 16, out, n, &outn));
            CHECK_EQ_U64(outn, n);
            CHECK(memcmp(out, in, n) == 0);
            /* in place: encode, then decode in place too */
            memcpy(buf, in, n);
            CHECK_OK(encode(s, k, buf, n, buf, n + 16, params, &outn));
            CHECK_EQ_U64(outn, n + 16);
            CHECK_OK(decode(kr, k, HEADER, params, buf, n + 16, out, n + 1, &outn));
            CHECK_EQ_U64(outn, n);
            CHECK(memcmp(out, in, n) == 0);
            CHECK_OK(decode(kr, k, HEADER, params, buf, n + 16, buf, n, &outn));
            CHECK(memcmp(buf, in, n) == 0);
        }
        free(in);
        free(buf);
        free(out);
    }
    T->destroy(s);
    kvs_keyring_free(kr);
}

static void test_fresh_nonce(void)
{
    kvs_stage *s = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s));
    uint8_t in[48] = {0}, a[64], b[64], pa[20], pb[20];
    size_t n;
    CHECK_OK(encode(s, NULL, in, sizeof in, a, sizeof a, pa, &n));
    CHECK_OK(encode(s, NULL, in, sizeof in, b, sizeof b, pb, &n));
    CHECK(memcmp(pa, pb, 8) == 0);       /* same key id */
    CHECK(memcmp(pa + 8, pb + 8, 12) != 0); /* fresh nonce */
    CHECK(memcmp(a, b, sizeof a) != 0);
    CHECK(memcmp(a, b, 16) != 0);
    T->destroy(s);
}

static void test_tampering(void)
{
    kvs_stage *s = NULL;
    kvs_keyring *kr = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s));
    REQUIRE_OK(make_keyring_files(k1_raw, NULL, &kr));
    const char *auth = "aes_gcm: authentication failed (wrong key, or ciphertext, header or "
                       "object key altered)";
    kvs_object_key key = test_key("tenant-a", 1);
    kvs_object_key other_salt = test_key("tenant-b", 1);
    kvs_object_key no_salt = test_key("", 1);
    kvs_object_key other_hash = test_key("tenant-a", 2);
    kvs_object_key other_model = key;
    strcpy(other_model.model_name, "llama-3-8c");
    kvs_object_key other_rank = key;
    other_rank.kv_rank = 2;
    kvs_object_key other_group = key;
    other_group.object_group_id = 8;
    kvs_object_key longer_hash = key;
    longer_hash.chunk_hash_len = 9;

    uint8_t in[100], blob[116], out[100], params[20], header[sizeof HEADER];
    for (size_t i = 0; i < sizeof in; i++) in[i] = (uint8_t)i;
    size_t n;
    REQUIRE_OK(encode(s, &key, in, sizeof in, blob, sizeof blob, params, &n));

    const kvs_object_key *wrong_keys[] = {&other_salt, &no_salt,     &other_hash, &other_model,
                                          &other_rank, &other_group, &longer_hash, NULL};
    for (size_t i = 0; i < sizeof wrong_keys / sizeof *wrong_keys; i++) {
        memset(out, 0xee, sizeof out);
        n = 5;
        CHECK_ERR(decode(kr, wrong_keys[i], HEADER, params, blob, sizeof blob, out, sizeof out,
                         &n),
                  KVS_EAUTH, auth);
        CHECK(all_zero(out, sizeof out));
        CHECK_EQ_U64(n, 0);
    }
    /* every byte of ciphertext and tag, every byte of the header, and the
     * nonce */
    for (size_t i = 0; i < sizeof blob; i++) {
        blob[i] ^= 0x01;
        memset(out, 0xee, sizeof out);
        CHECK_ERR(decode(kr, &key, HEADER, params, blob, sizeof blob, out, sizeof out, &n),
                  KVS_EAUTH, auth);
        CHECK(all_zero(out, sizeof out));
        blob[i] ^= 0x01;
    }
    for (size_t i = 0; i < sizeof header; i++) {
        memcpy(header, HEADER, sizeof header);
        header[i] ^= 0x80;
        CHECK_ERR(decode(kr, &key, header, params, blob, sizeof blob, out, sizeof out, &n),
                  KVS_EAUTH, auth);
    }
    params[19] ^= 1;
    CHECK_ERR(decode(kr, &key, HEADER, params, blob, sizeof blob, out, sizeof out, &n),
              KVS_EAUTH, auth);
    params[19] ^= 1;
    /* a shorter header (the same bytes, one cut off) */
    kvs_stage_ctx ctx = {&key, HEADER, sizeof HEADER - 1, kr, 0, 0, NULL};
    CHECK_ERR(T->transform_decode(params, 20, &ctx, blob, sizeof blob, out, sizeof out, &n),
              KVS_EAUTH, auth);
    /* a truncated blob */
    CHECK_ERR(decode(kr, &key, HEADER, params, blob, sizeof blob - 1, out, sizeof out, &n),
              KVS_EAUTH, auth);
    /* untouched, it still decodes */
    CHECK_OK(decode(kr, &key, HEADER, params, blob, sizeof blob, out, sizeof out, &n));
    CHECK(memcmp(out, in, sizeof in) == 0);

    /* a keyless blob refuses every key, and "" salt is not "no key" */
    REQUIRE_OK(encode(s, NULL, in, sizeof in, blob, sizeof blob, params, &n));
    CHECK_ERR(decode(kr, &no_salt, HEADER, params, blob, sizeof blob, out, sizeof out, &n),
              KVS_EAUTH, auth);
    CHECK_ERR(decode(kr, &key, HEADER, params, blob, sizeof blob, out, sizeof out, &n),
              KVS_EAUTH, auth);
    CHECK_OK(decode(kr, NULL, HEADER, params, blob, sizeof blob, out, sizeof out, &n));
    T->destroy(s);
    kvs_keyring_free(kr);
}

static void test_wrong_key_and_rotation(void)
{
    kvs_stage *s1 = NULL, *s21 = NULL;
    kvs_keyring *kr1 = NULL, *kr2 = NULL, *kr21 = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s1));
    REQUIRE_OK(make_stage_files(k2_raw, k1_raw, &s21));
    REQUIRE_OK(make_keyring_files(k1_hexnl, NULL, &kr1));
    REQUIRE_OK(make_keyring_files(k2_raw, NULL, &kr2));
    REQUIRE_OK(make_keyring_files(k2_raw, k1_raw, &kr21));
    uint8_t id2[8];
    char id2hex[17], msg[256];
    REQUIRE_OK(kvs_aes_gcm_key_id(K2, id2));
    hex_of(id2, 8, id2hex);

    kvs_object_key key = test_key("tenant-a", 1);
    uint8_t in[64], blob[80], out[64], params[20];
    memset(in, 7, sizeof in);
    size_t n;
    /* written with [k1]: [k2, k1] reads it, [k2] does not */
    REQUIRE_OK(encode(s1, &key, in, sizeof in, blob, sizeof blob, params, &n));
    CHECK_OK(decode(kr21, &key, HEADER, params, blob, n, out, sizeof out, &n));
    CHECK(memcmp(out, in, sizeof in) == 0);
    CHECK_OK(decode(kr1, &key, HEADER, params, blob, sizeof blob, out, sizeof out, &n));
    memset(out, 0xee, sizeof out);
    snprintf(msg, sizeof msg, "aes_gcm: no configured key has key id %s (configured: %s)",
             K1_ID, id2hex);
    CHECK_ERR(decode(kr2, &key, HEADER, params, blob, sizeof blob, out, sizeof out, &n),
              KVS_EAUTH, msg);
    snprintf(msg, sizeof msg, "aes_gcm: no configured key has key id %s (configured: none)",
             K1_ID);
    CHECK_ERR(decode(NULL, &key, HEADER, params, blob, sizeof blob, out, sizeof out, &n),
              KVS_EAUTH, msg);
    /* written with [k2, k1]: encrypted with k2 */
    REQUIRE_OK(encode(s21, &key, in, sizeof in, blob, sizeof blob, params, &n));
    CHECK(memcmp(params, id2, 8) == 0);
    CHECK_OK(decode(kr2, &key, HEADER, params, blob, n, out, sizeof out, &n));
    CHECK(memcmp(out, in, sizeof in) == 0);
    snprintf(msg, sizeof msg, "aes_gcm: no configured key has key id %s (configured: %s)",
             id2hex, K1_ID);
    CHECK_ERR(decode(kr1, &key, HEADER, params, blob, sizeof blob, out, sizeof out, &n),
              KVS_EAUTH, msg);

    /* encode with params naming another key */
    kvs_stage_ctx ctx = {&key, HEADER, sizeof HEADER, NULL, 0, 0, NULL};
    snprintf(msg, sizeof msg,
             "aes_gcm: the parameters name key id %s, but this stage encrypts with key id %s",
             id2hex, K1_ID);
    CHECK_ERR(T->transform_encode(s1, params, 20, &ctx, in, sizeof in, blob, sizeof blob, &n),
              KVS_EINVAL, msg);
    T->destroy(s1);
    T->destroy(s21);
    kvs_keyring_free(kr1);
    kvs_keyring_free(kr2);
    kvs_keyring_free(kr21);
}

static void test_sizes_and_params(void)
{
    kvs_stage *s = NULL;
    kvs_keyring *kr = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s));
    REQUIRE_OK(make_keyring_files(k1_raw, NULL, &kr));
    uint8_t in[64] = {0}, blob[80], out[64], params[20];
    size_t n = 3;
    REQUIRE_OK(T->write_params(s, params));
    kvs_stage_ctx ctx = {NULL, HEADER, sizeof HEADER, kr, 0, 0, NULL};
    CHECK_ERR(T->transform_encode(s, params, 20, &ctx, in, 64, blob, 79, &n), KVS_ENOSPC,
              "aes_gcm: output needs 80 bytes (64 of payload and the 16-byte tag); capacity "
              "is 79");
    CHECK_EQ_U64(n, 0);
    CHECK_ERR(T->transform_encode(s, params, 19, &ctx, in, 64, blob, 80, &n), KVS_EINVAL,
              "aes_gcm: parameter block of 19 bytes; expected 20 (8-byte key id, 12-byte "
              "nonce)");
    CHECK_ERR(T->transform_encode(s, params, 20, &ctx, in, 64, in + 1, 80, &n), KVS_EINVAL,
              "aes_gcm: the output overlaps the input without starting at the same byte");
    REQUIRE_OK(T->transform_encode(s, params, 20, &ctx, in, 64, blob, 80, &n));
    CHECK_ERR(T->transform_decode(params, 20, &ctx, blob, 7, out, 64, &n), KVS_ECORRUPT,
              "aes_gcm: payload of 7 bytes is shorter than the 16-byte tag");
    CHECK_ERR(T->transform_decode(params, 20, &ctx, blob, 80, out, 63, &n), KVS_ENOSPC,
              "aes_gcm: decrypted payload of 64 bytes does not fit in 63");
    CHECK_ERR(T->transform_decode(params, 21, &ctx, blob, 80, out, 64, &n), KVS_ECORRUPT,
              "aes_gcm: parameter block of 21 bytes; expected 20 (8-byte key id, 12-byte "
              "nonce)");
    CHECK_OK(T->transform_decode(params, 20, &ctx, blob, 80, out, 64, &n));
    CHECK_EQ_U64(n, 64);
    /* exactly the tag: an empty payload */
    REQUIRE_OK(T->transform_encode(s, params, 20, &ctx, in, 0, blob, 16, &n));
    CHECK_EQ_U64(n, 16);
    CHECK_OK(T->transform_decode(params, 20, &ctx, blob, 16, out, 0, &n));
    CHECK_EQ_U64(n, 0);

    CHECK_OK(T->check_params(params, 20));
    CHECK_ERR(T->check_params(params, 0), KVS_ECORRUPT,
              "aes_gcm: parameter block of 0 bytes; expected 20 (8-byte key id, 12-byte "
              "nonce)");
    CHECK_ERR(T->check_params(params, 64), KVS_ECORRUPT,
              "aes_gcm: parameter block of 64 bytes; expected 20 (8-byte key id, 12-byte "
              "nonce)");
    uint8_t fixed[20];
    unhex("0123456789abcdefcafebabefacedbaddecaf888", fixed);
    json_t *d = T->describe_params(fixed, 20);
    char *txt = json_dumps(d, JSON_SORT_KEYS | JSON_COMPACT);
    CHECK_EQ_STR(txt, "{\"key_id\":\"0123456789abcdef\",\"nonce\":\"cafebabefacedbaddecaf888\"}");
    free(txt);
    json_decref(d);
    CHECK(T->describe_params(fixed, 19) == NULL);
    T->destroy(s);
    kvs_keyring_free(kr);
}

/* Known answers: key id, HKDF subkeys, NIST AES-256-GCM, whole blobs. */
static void test_known_answers(void)
{
    uint8_t id[8], sub[32], want[64];
    char hex[129];
    REQUIRE_OK(kvs_aes_gcm_key_id(K1, id));
    CHECK_EQ_STR(hex_of(id, 8, hex), K1_ID);

    /* openssl kdf -keylen 32 -kdfopt digest:SHA256 -kdfopt hexkey:0001..1f
     *   -kdfopt hexinfo:6b767365726465206165735f67636d20763100[74656e616e742d61] HKDF */
    REQUIRE_OK(kvs_aes_gcm_subkey(K1, "", sub));
    CHECK_EQ_STR(hex_of(sub, 32, hex),
                 "63386100bb59331f23856e1d5e428c8fb1fe17b5c5f45d71d234ce2dfac9306a");
    REQUIRE_OK(kvs_aes_gcm_subkey(K1, NULL, sub));
    CHECK_EQ_STR(hex_of(sub, 32, hex),
                 "63386100bb59331f23856e1d5e428c8fb1fe17b5c5f45d71d234ce2dfac9306a");
    REQUIRE_OK(kvs_aes_gcm_subkey(K1, "tenant-a", sub));
    CHECK_EQ_STR(hex_of(sub, 32, hex),
                 "b4a84b622a27ddf1bd0140ea5018ee5c6c2b7b342a29e8f018817feef5ca8c36");

    /* The GCM specification's test case 16 (AES-256, 96-bit IV, 20-byte AAD),
     * also in NIST's gcmEncryptExtIV256 vectors. */
    uint8_t k[32], iv[12], aad[20], pt[60], ct[60], tag[16], back[60];
    unhex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", k);
    unhex("cafebabefacedbaddecaf888", iv);
    unhex("feedfacedeadbeeffeedfacedeadbeefabaddad2", aad);
    unhex("d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532f"
          "cf0e2449a6b525b16aedf5aa0de657ba637b39",
          pt);
    REQUIRE_OK(kvs_aes_gcm_seal(k, iv, aad, 20, NULL, 0, pt, 60, ct, tag));
    CHECK_EQ_STR(hex_of(ct, 60, hex),
                 "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa8cb08e48590dbb3d"
                 "a7b08b1056828838c5f61e6393ba7a0abcc9f662");
    CHECK_EQ_STR(hex_of(tag, 16, hex), "76fc6ece0f4e1768cddf8853bb2d551b");
    /* the AAD split anywhere gives the same tag */
    REQUIRE_OK(kvs_aes_gcm_seal(k, iv, aad, 7, aad + 7, 13, pt, 60, ct, tag));
    CHECK_EQ_STR(hex_of(tag, 16, hex), "76fc6ece0f4e1768cddf8853bb2d551b");
    CHECK_OK(kvs_aes_gcm_open(k, iv, aad, 20, NULL, 0, ct, 60, tag, back));
    CHECK(memcmp(back, pt, 60) == 0);
    tag[0] ^= 1;
    CHECK_ERR(kvs_aes_gcm_open(k, iv, aad, 20, NULL, 0, ct, 60, tag, back), KVS_EAUTH,
              "aes_gcm: authentication failed (wrong key, or ciphertext, header or object key "
              "altered)");
    CHECK(all_zero(back, 60));

    /* Whole blobs through the stage, with params built here (key id of K1,
     * the nonce of test case 16): the AAD is HEADER || the key's canonical
     * bytes (keyed) or HEADER || 00 (keyless), the cipher key the tenant's
     * subkey. Expected values from Python's cryptography. */
    kvs_stage *s = NULL;
    kvs_keyring *kr = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s));
    REQUIRE_OK(make_keyring_files(k1_raw, NULL, &kr));
    uint8_t params[20];
    memcpy(params, id, 8);
    memcpy(params + 8, iv, 12);
    const char *msg = "kvserde aes_gcm known answer";
    size_t len = strlen(msg), n;
    uint8_t blob[64], out[64];
    kvs_object_key key = test_key("tenant-a", 0xa0);
    for (int keyed = 1; keyed >= 0; keyed--) {
        kvs_stage_ctx ctx = {keyed ? &key : NULL, HEADER, sizeof HEADER, kr, 0, 0, NULL};
        REQUIRE_OK(T->transform_encode(s, params, 20, &ctx, (const uint8_t *)msg, len, blob,
                                       sizeof blob, &n));
        CHECK_EQ_U64(n, len + 16);
        unhex(keyed ? "3161194ee70de0d97fb0ff61ec68bf894dd3bdb2edfd6d2c9cb588ec9a6f4e4ba9a2fed2"
                      "690161d38867acc7"
                    : "5eda149c5a05387fd6fb8c10707ea273e62abff4b9749b459b5cabc8cf499598eb80bae5"
                      "a4dc88416d677d5f",
              want);
        CHECK(memcmp(blob, want, len + 16) == 0);
        if (memcmp(blob, want, len + 16) != 0)
            fprintf(stderr, "  got %s\n", hex_of(blob, len + 16, (char[129]){0}));
        CHECK_OK(T->transform_decode(params, 20, &ctx, blob, n, out, sizeof out, &n));
        CHECK_EQ_U64(n, len);
        CHECK(memcmp(out, msg, len) == 0);
    }
    T->destroy(s);
    kvs_keyring_free(kr);
}

/* The cipher fed in small, odd pieces gives the same bytes. */
static void test_pieces(void)
{
    kvs_stage *s = NULL;
    kvs_keyring *kr = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s));
    REQUIRE_OK(make_keyring_files(k1_raw, NULL, &kr));
    enum { N = 5000 };
    static uint8_t in[N], ref[N + 16], blob[N + 16], out[N];
    for (size_t i = 0; i < N; i++) in[i] = (uint8_t)(i ^ (i >> 8));
    uint8_t params[20];
    size_t n;
    kvs_object_key key = test_key("tenant-a", 1);
    kvs_stage_ctx ctx = {&key, HEADER, sizeof HEADER, kr, 0, 0, NULL};
    REQUIRE_OK(T->write_params(s, params));
    REQUIRE_OK(T->transform_encode(s, params, 20, &ctx, in, N, ref, sizeof ref, &n));
    static const size_t pieces[] = {1, 7, 16, 1000, 4999};
    size_t saved = kvs_aes_gcm_update_chunk;
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) {
        kvs_aes_gcm_update_chunk = pieces[i];
        CHECK_OK(T->transform_encode(s, params, 20, &ctx, in, N, blob, sizeof blob, &n));
        CHECK(memcmp(blob, ref, sizeof ref) == 0);
        CHECK_OK(T->transform_decode(params, 20, &ctx, ref, sizeof ref, out, N, &n));
        CHECK(memcmp(out, in, N) == 0);
    }
    kvs_aes_gcm_update_chunk = saved;
    T->destroy(s);
    kvs_keyring_free(kr);
}

/* Several threads encode and decode with one instance and one keyring. */
typedef struct worker {
    const kvs_stage *s;
    const kvs_keyring *kr;
    int id, failures;
} worker;

static void *work(void *arg)
{
    worker *w = arg;
    char salt[16];
    snprintf(salt, sizeof salt, "t%d", w->id);
    kvs_object_key key = test_key(salt, (uint8_t)w->id);
    uint8_t in[1024], blob[1040], out[1024], params[20];
    for (int it = 0; it < 300; it++) {
        for (size_t i = 0; i < sizeof in; i++) in[i] = (uint8_t)(i + it + w->id);
        size_t n;
        kvs_stage_ctx ctx = {&key, HEADER, sizeof HEADER, w->kr, 0, 0, NULL};
        if (T->write_params(w->s, params) ||
            T->transform_encode(w->s, params, 20, &ctx, in, sizeof in, blob, sizeof blob, &n) ||
            T->transform_decode(params, 20, &ctx, blob, n, out, sizeof out, &n) ||
            n != sizeof in || memcmp(in, out, n) != 0)
            w->failures++;
    }
    return NULL;
}

static void test_threads(void)
{
    kvs_stage *s = NULL;
    kvs_keyring *kr = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s));
    REQUIRE_OK(make_keyring_files(k2_raw, k1_raw, &kr));
    enum { NT = 4 };
    pthread_t th[NT];
    worker w[NT];
    for (int i = 0; i < NT; i++) {
        w[i] = (worker){s, kr, i, 0};
        REQUIRE(pthread_create(&th[i], NULL, work, &w[i]) == 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(w[i].failures, 0);
    }
    T->destroy(s);
    kvs_keyring_free(kr);
}

/* The stream (stage.h's stream_*: what the pipeline runs block by block
 * after the typed stage) writes the same bytes and tag as transform_encode
 * with the same params, whatever the pieces; an abandoned stream writes
 * nothing; a stream fed more or fewer bytes than announced is refused. */
static void test_stream(void)
{
    kvs_stage *s = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s));
    kvs_object_key key = test_key("tenant-a", 1);
    kvs_stage_ctx ctx = {&key, HEADER, sizeof HEADER, NULL, 0, 0, NULL};
    enum { N = 100003 };
    static uint8_t in[N], whole[N + 16], piece[N + 16];
    for (size_t i = 0; i < N; i++) in[i] = (uint8_t)(i * 13 + 7);
    uint8_t params[20];
    size_t outn = 0;
    REQUIRE_OK(T->write_params(s, params));
    REQUIRE_OK(T->transform_encode(s, params, 20, &ctx, in, N, whole, sizeof whole, &outn));
    static const size_t cuts[][3] = {{0, 1, N}, {16, 4096, 65536}, {17, 50000, N}};
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
        memcpy(piece, in, N); /* in place, as the pipeline runs it */
        memset(piece + N, 0xee, 16);
        void *st = NULL;
        REQUIRE_OK(T->stream_begin(s, params, 20, &ctx, N, &st));
        size_t at = 0;
        for (size_t k = 0; k < 3; k++) {
            CHECK_OK(T->stream_update(st, piece + at, piece + at, cuts[c][k] - at));
            at = cuts[c][k];
        }
        CHECK_OK(T->stream_update(st, piece + at, piece + at, N - at));
        CHECK_OK(T->stream_end(st, piece + N));
        CHECK(memcmp(piece, whole, sizeof whole) == 0);
    }
    void *st = NULL;
    uint8_t tag[16] = {0};
    REQUIRE_OK(T->stream_begin(s, params, 20, &ctx, 10, &st));
    CHECK_ERR(T->stream_update(st, in, piece, 11), KVS_EINVAL,
              "aes_gcm: 11 more bytes than the 10 announced");
    CHECK_OK(T->stream_update(st, in, piece, 4));
    CHECK_ERR(T->stream_end(st, tag), KVS_EINVAL, "aes_gcm: stream ended 6 bytes short");
    CHECK(all_zero(tag, sizeof tag));
    REQUIRE_OK(T->stream_begin(s, params, 20, &ctx, 10, &st));
    CHECK_OK(T->stream_end(st, NULL)); /* abandoned */
    CHECK_ERR(T->stream_begin(s, params, 19, &ctx, 10, &st), KVS_EINVAL,
              "aes_gcm: parameter block of 19 bytes; expected 20 (8-byte key id, 12-byte "
              "nonce)");
    CHECK(st == NULL);
    T->destroy(s);
}

/* More than INT_MAX bytes, in place. */
static void test_large(void)
{
    const char *preload = getenv("LD_PRELOAD");
    if (getenv("KVS_TEST_SKIP_LARGE") || (preload && strstr(preload, "vgpreload"))) {
        printf("test_large skipped (KVS_TEST_SKIP_LARGE, or under valgrind)\n");
        return;
    }
    kvs_stage *s = NULL;
    kvs_keyring *kr = NULL;
    REQUIRE_OK(make_stage_files(k1_raw, NULL, &s));
    REQUIRE_OK(make_keyring_files(k1_raw, NULL, &kr));
    size_t n = ((size_t)1 << 31) + 4097; /* over INT_MAX, two 1 GiB pieces and a tail */
    uint8_t *buf = malloc(n + 16), *out = malloc(n);
    if (buf == NULL || out == NULL) {
        printf("test_large skipped (no memory for 2 x %zu bytes)\n", n);
        free(buf);
        free(out);
        T->destroy(s);
        kvs_keyring_free(kr);
        return;
    }
    memset(buf, 0x5a, n);
    static const size_t marks[] = {0, 1u << 30, (1u << 30) + 1, 1u << 31, (1u << 31) + 4096};
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) buf[marks[i]] = (uint8_t)i;
    kvs_object_key key = test_key("tenant-a", 1);
    kvs_stage_ctx ctx = {&key, HEADER, sizeof HEADER, kr, 0, 0, NULL};
    uint8_t params[20];
    size_t outn = 0;
    REQUIRE_OK(T->write_params(s, params));
    CHECK_OK(T->transform_encode(s, params, 20, &ctx, buf, n, buf, n + 16, &outn));
    CHECK_EQ_U64(outn, n + 16);
    CHECK(buf[n - 1] != 0x5a || buf[n - 2] != 0x5a || buf[n - 3] != 0x5a);
    CHECK_OK(T->transform_decode(params, 20, &ctx, buf, n + 16, out, n, &outn));
    CHECK_EQ_U64(outn, n);
    size_t bad = 0;
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++) {
        if (out[marks[i]] != (uint8_t)i) bad++;
        out[marks[i]] = 0x5a;
    }
    static uint8_t ref[1 << 20];
    memset(ref, 0x5a, sizeof ref);
    for (size_t i = 0; i < n; i += sizeof ref) {
        size_t len = n - i < sizeof ref ? n - i : sizeof ref;
        bad += memcmp(out + i, ref, len) != 0;
    }
    CHECK_EQ_U64(bad, 0);
    /* a flipped byte past 2 GiB is caught */
    buf[n - 10] ^= 1;
    CHECK_EQ_INT(T->transform_decode(params, 20, &ctx, buf, n + 16, out, n, &outn), KVS_EAUTH);
    CHECK(out[0] == 0 && out[n / 2] == 0 && out[n - 1] == 0);
    free(buf);
    free(out);
    T->destroy(s);
    kvs_keyring_free(kr);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/kvs_test_aes_XXXXXX");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 2;
    }
    for (int i = 0; i < 32; i++) {
        K1[i] = (uint8_t)i;
        K2[i] = (uint8_t)(0xff - i);
    }
    for (size_t i = 0; i < sizeof HEADER; i++) HEADER[i] = (uint8_t)(i * 7 + 1);
    char hex[66];
    path_in_dir(k1_raw, sizeof k1_raw, "k1.raw");
    write_file(k1_raw, K1, 32, 0600);
    path_in_dir(k1_hex, sizeof k1_hex, "k1.hex");
    write_file(k1_hex, hex_of(K1, 32, hex), 64, 0600);
    path_in_dir(k1_hexnl, sizeof k1_hexnl, "k1.hexnl");
    hex_of(K1, 32, hex);
    hex[64] = '\n';
    write_file(k1_hexnl, hex, 65, 0600);
    path_in_dir(k2_raw, sizeof k2_raw, "k2.raw");
    write_file(k2_raw, K2, 32, 0600);

    RUN(test_type);
    RUN(test_key_files_accepted);
    RUN(test_key_files_refused);
    RUN(test_config_refused);
    RUN(test_keyring_config);
    RUN(test_round_trip);
    RUN(test_fresh_nonce);
    RUN(test_tampering);
    RUN(test_wrong_key_and_rotation);
    RUN(test_sizes_and_params);
    RUN(test_known_answers);
    RUN(test_pieces);
    RUN(test_stream);
    RUN(test_threads);
    RUN(test_large);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return TEST_SUMMARY();
}
