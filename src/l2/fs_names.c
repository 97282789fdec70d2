/* fs_names.c - object key <-> relative path for the fs adapter.
 *
 * The scheme (also in kvserde/l2_fs.h):
 *
 *     path = D "/" [H "/"] F
 *     D    = esc(model_name) "+" esc(cache_salt), cut into components
 *     H    = hex(chunk_hash[0..64)) ","             (only if the hash > 64 bytes)
 *     F    = hex(rest of chunk_hash) "," dec(kv_rank) "," dec(object_group_id)
 *
 * esc() writes a byte of A-Z a-z 0-9 '_' '-' '.' as itself ("plain") and any
 * other byte b as the 3-character code '%' HEX(b >> 4) HEX(b & 15) with
 * uppercase digits; a '.' that would be the first character of a component
 * is written as "%2E". D is produced left to right and cut into components
 * of at most KVS_FS_COMPONENT_MAX (200) characters: a code that would not
 * fit in the current component starts the next one, so codes are never
 * split. hex() is lowercase, two digits per byte; dec() is the canonical
 * decimal (no leading zeros or '+', '-' only for negatives).
 *
 * Why it stays inside the directory. Every component is non-empty (D holds
 * the '+', a component is only started to receive a code, H and F hold
 * ','), contains no '/' or NUL, is at most 200 bytes (D: by the cut; H: 129;
 * F: at most 128 + 1 + 20 + 1 + 19 = 169), and never starts with '.' (D:
 * by the rule above; H and F start with a hex digit or ','). So no
 * component is "." or "..", no path is absolute, and every path names an
 * entry strictly below the directory (as long as nobody plants a symlink in
 * it, which the adapter's opens refuse for the final component with
 * O_NOFOLLOW).
 *
 * Why distinct keys get distinct paths (injectivity). kvs_fs_path_key()
 * below is a left inverse: decode(encode(k)) == k for every valid key k,
 * and a function with a left inverse is injective. Decoding works because:
 *   1. '/' never occurs inside a component, so splitting at '/' recovers
 *      the components.
 *   2. ',' never occurs in D (esc writes no ',': it is not plain and codes
 *      are '%' and hex digits; the separator is '+'), while H holds exactly
 *      one ',' and F exactly two. So the components without ',' are D's,
 *      in order; a one-',' component is H; the two-',' one is F.
 *   3. Concatenating D's components gives back the escaped text, since the
 *      cut only inserts '/' between whole codes. esc is a prefix code ('%'
 *      starts every 3-character code and no 1-character code), so the text
 *      parses uniquely into codes; '.' and "%2E" both decode to '.'.
 *   4. esc never writes '+', so the first (and only) unescaped '+' in D
 *      separates model_name from cache_salt.
 *   5. hex and dec are injective, and F's fields are ','-separated with
 *      no ',' inside them (a hash's hex has none, a decimal has none).
 * Distinct paths are therefore needed for distinct keys; and since the
 * decoder also re-encodes and compares, only canonical paths decode at all
 * (the adapter's directory scan uses that to skip foreign files).
 *
 * Why no key's file can be another key's directory. A file is always F (two
 * ','); a directory component is D's (no ',') or H (one ','). So in any
 * directory, the name of a key file never equals the name of a
 * subdirectory some other key needs, and stores of different keys never
 * fail because of one another.
 *
 * Length: D is at most 255*3 + 1 + 128*3 = 1150 characters; each full
 * component holds at least 198 (a 3-character code did not fit), so D has
 * at most 6 components. The longest path is 1150 + 6 + 130 + 169 = 1455
 * characters (see KVS_FS_KEY_PATH_MAX).
 */
#include "l2/fs_names.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/l2_fs.h"

static const char upper_hex[] = "0123456789ABCDEF";
static const char lower_hex[] = "0123456789abcdef";

/* The encoder: output so far and the length of the current component. */
typedef struct encoder {
    char *buf;
    size_t len;
    size_t comp;
} encoder;

static void put(encoder *e, const char *s, size_t n)
{
    memcpy(e->buf + e->len, s, n);
    e->len += n;
    e->comp += n;
}

static void cut(encoder *e)
{
    e->buf[e->len++] = '/';
    e->comp = 0;
}

static int is_plain(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.';
}

/* One byte of the model name or cache salt. */
static void put_name_byte(encoder *e, unsigned char c)
{
    int plain = is_plain(c) && !(c == '.' && e->comp == 0);
    if (e->comp + (plain ? 1u : 3u) > KVS_FS_COMPONENT_MAX) {
        cut(e);
        plain = is_plain(c) && c != '.'; /* now at a component's start */
    }
    if (plain) {
        char ch = (char)c;
        put(e, &ch, 1);
    } else {
        char code[3] = {'%', upper_hex[c >> 4], upper_hex[c & 15]};
        put(e, code, 3);
    }
}

static void put_hex(encoder *e, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char two[2] = {lower_hex[p[i] >> 4], lower_hex[p[i] & 15]};
        put(e, two, 2);
    }
}

size_t kvs_fs_encode_key(const kvs_object_key *key, char buf[KVS_FS_KEY_PATH_MAX])
{
    encoder e = {buf, 0, 0};
    for (const char *p = key->model_name; *p; p++) put_name_byte(&e, (unsigned char)*p);
    if (e.comp + 1 > KVS_FS_COMPONENT_MAX) cut(&e);
    put(&e, "+", 1);
    for (const char *p = key->cache_salt; *p; p++) put_name_byte(&e, (unsigned char)*p);
    cut(&e);

    size_t first = 0;
    if (key->chunk_hash_len > KVS_FS_HASH_SPLIT) {
        put_hex(&e, key->chunk_hash, KVS_FS_HASH_SPLIT);
        put(&e, ",", 1);
        cut(&e);
        first = KVS_FS_HASH_SPLIT;
    }
    put_hex(&e, key->chunk_hash + first, key->chunk_hash_len - first);
    int n = snprintf(buf + e.len, KVS_FS_KEY_PATH_MAX - e.len, ",%" PRId64 ",%" PRId64,
                     key->kv_rank, key->object_group_id);
    return e.len + (size_t)n;
}

size_t kvs_fs_dir_len(const char *path, size_t len)
{
    while (len > 0 && path[len - 1] != '/') len--;
    return len ? len - 1 : 0;
}

int kvs_fs_key_path(const kvs_object_key *key, char *buf, size_t size)
{
    if (key == NULL) return kvs_set_error(KVS_EINVAL, "fs: key path: NULL key");
    if (buf == NULL) return kvs_set_error(KVS_EINVAL, "fs: key path: NULL buffer");
    if (size > 0) buf[0] = '\0';
    int rc = kvs_object_key_validate(key);
    if (rc) return rc;
    char tmp[KVS_FS_KEY_PATH_MAX];
    size_t n = kvs_fs_encode_key(key, tmp);
    if (n + 1 > size)
        return kvs_set_error(KVS_ENOSPC, "fs: key path needs %zu bytes, buffer holds %zu",
                             n + 1, size);
    memcpy(buf, tmp, n + 1);
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * Decoding
 * ------------------------------------------------------------------ */

static int hex_value(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Unescape D's text s[0..n) into model and salt. 0 on success. */
static int decode_names(const char *s, size_t n, char *model, char *salt)
{
    char *out = model;
    size_t len = 0, max = KVS_MODEL_NAME_MAX;
    int seen_sep = 0;
    for (size_t i = 0; i < n;) {
        int c;
        if (s[i] == '+') {
            if (seen_sep) return -1;
            seen_sep = 1;
            out[len] = '\0';
            out = salt;
            len = 0;
            max = KVS_CACHE_SALT_MAX;
            i++;
            continue;
        }
        if (s[i] == '%') {
            if (n - i < 3) return -1;
            int hi = hex_value(s[i + 1]), lo = hex_value(s[i + 2]);
            if (hi < 0 || lo < 0) return -1;
            c = hi * 16 + lo;
            i += 3;
        } else {
            if (!is_plain((unsigned char)s[i])) return -1;
            c = (unsigned char)s[i];
            i++;
        }
        if (c == 0 || len == max) return -1;
        out[len++] = (char)c;
    }
    if (!seen_sep) return -1;
    out[len] = '\0';
    return 0;
}

/* Lowercase hex s[0..n) appended to hash (length *hlen). 0 on success. */
static int decode_hex(const char *s, size_t n, uint8_t *hash, size_t *hlen)
{
    if (n % 2 != 0 || *hlen + n / 2 > KVS_CHUNK_HASH_MAX) return -1;
    for (size_t i = 0; i < n; i += 2) {
        int hi = hex_value(s[i]), lo = hex_value(s[i + 1]);
        if (hi < 0 || lo < 0) return -1;
        hash[(*hlen)++] = (uint8_t)(hi * 16 + lo);
    }
    return 0;
}

/* A decimal int64 filling s[0..n) exactly. 0 on success. */
static int decode_int(const char *s, size_t n, int64_t *out)
{
    char tmp[32];
    if (n == 0 || n >= sizeof tmp) return -1;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(tmp, &end, 10);
    if (errno != 0 || *end != '\0') return -1;
    *out = (int64_t)v;
    return 0;
}

static int not_a_key_path(const char *path)
{
    return kvs_set_error(KVS_EINVAL, "fs: not a key path: '%s'", path);
}

int kvs_fs_path_key(const char *path, kvs_object_key *out)
{
    if (path == NULL || out == NULL)
        return kvs_set_error(KVS_EINVAL, "fs: path key: NULL argument");
    size_t len = strnlen(path, KVS_FS_KEY_PATH_MAX);
    if (len == KVS_FS_KEY_PATH_MAX) return not_a_key_path(path);

    char names[KVS_FS_KEY_PATH_MAX]; /* D's components, concatenated */
    size_t names_len = 0, ncomp = 0;
    uint8_t hash[KVS_CHUNK_HASH_MAX];
    size_t hlen = 0;
    const char *file = NULL;
    size_t file_len = 0;
    int have_hash_dir = 0;

    for (size_t start = 0; start <= len;) {
        const char *slash = memchr(path + start, '/', len - start);
        size_t end = slash ? (size_t)(slash - path) : len;
        const char *c = path + start;
        size_t n = end - start;
        size_t commas = 0;
        for (size_t i = 0; i < n; i++) commas += c[i] == ',';
        if (n == 0 || file != NULL) return not_a_key_path(path);
        if (commas == 0) {
            if (have_hash_dir) return not_a_key_path(path);
            memcpy(names + names_len, c, n);
            names_len += n;
            ncomp++;
        } else if (commas == 1) {
            if (have_hash_dir || ncomp == 0 || c[n - 1] != ',' || slash == NULL ||
                decode_hex(c, n - 1, hash, &hlen) != 0)
                return not_a_key_path(path);
            have_hash_dir = 1;
        } else if (commas == 2 && slash == NULL && ncomp > 0) {
            file = c;
            file_len = n;
        } else {
            return not_a_key_path(path);
        }
        start = end + 1;
    }
    if (file == NULL) return not_a_key_path(path);

    char model[KVS_MODEL_NAME_MAX + 1], salt[KVS_CACHE_SALT_MAX + 1];
    if (decode_names(names, names_len, model, salt) != 0) return not_a_key_path(path);
    const char *c1 = memchr(file, ',', file_len);
    const char *c2 = memchr(c1 + 1, ',', file_len - (size_t)(c1 + 1 - file));
    int64_t rank, group;
    if (decode_hex(file, (size_t)(c1 - file), hash, &hlen) != 0 ||
        decode_int(c1 + 1, (size_t)(c2 - c1 - 1), &rank) != 0 ||
        decode_int(c2 + 1, file_len - (size_t)(c2 + 1 - file), &group) != 0)
        return not_a_key_path(path);

    kvs_object_key key;
    if (kvs_object_key_init(&key, hash, hlen, model, rank, group, salt) != KVS_OK)
        return not_a_key_path(path);
    /* Only the canonical spelling decodes: re-encode and compare. */
    char again[KVS_FS_KEY_PATH_MAX];
    size_t again_len = kvs_fs_encode_key(&key, again);
    if (again_len != len || memcmp(again, path, len) != 0) return not_a_key_path(path);
    *out = key;
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * Temporary names and store directories
 * ------------------------------------------------------------------ */

static int is_lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }
static int is_upper_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); }

void kvs_fs_temp_name(uint64_t nonce, uint64_t seq, char *buf)
{
    snprintf(buf, KVS_FS_TEMP_NAME_LEN + 1, KVS_FS_TEMP_PREFIX "%016" PRIx64 "%016" PRIx64,
             nonce, seq);
}

int kvs_fs_is_temp_name(const char *name)
{
    size_t p = sizeof KVS_FS_TEMP_PREFIX - 1;
    if (strncmp(name, KVS_FS_TEMP_PREFIX, p) != 0) return 0;
    for (size_t i = 0; i < KVS_FS_TEMP_HEX; i++) /* stops at a NUL: not hex */
        if (!is_lower_hex(name[p + i])) return 0;
    return name[p + KVS_FS_TEMP_HEX] == '\0';
}

/* A D component that is not D's last was cut because the next code did not
 * fit: it holds at least this many characters. */
#define FULL_COMPONENT (KVS_FS_COMPONENT_MAX - 2)

int kvs_fs_is_store_dir(const char *rel)
{
    int plus = 0, hash_dir = 0, have_d = 0;
    size_t last_d = 0; /* length of the latest D component */
    for (const char *c = rel;;) {
        size_t n = strcspn(c, "/");
        if (n == 0 || n > KVS_FS_COMPONENT_MAX || c[0] == '.' || hash_dir) return 0;
        size_t commas = 0, pluses = 0;
        for (size_t i = 0; i < n; i++) {
            if (c[i] == ',') commas++;
            else if (c[i] == '+') pluses++;
            else if (c[i] == '%') {
                if (i + 2 >= n || !is_upper_hex(c[i + 1]) || !is_upper_hex(c[i + 2])) return 0;
                i += 2;
            } else if (!is_plain((unsigned char)c[i])) return 0;
        }
        if (commas == 0) {
            if ((have_d && last_d < FULL_COMPONENT) || plus + pluses > 1) return 0;
            plus += (int)pluses;
            have_d = 1;
            last_d = n;
        } else {
            /* H: the first 128 hex digits of a long hash and ',', after all of D */
            if (commas != 1 || pluses || !plus || n != 2 * KVS_FS_HASH_SPLIT + 1 ||
                c[n - 1] != ',')
                return 0;
            for (size_t i = 0; i + 1 < n; i++)
                if (!is_lower_hex(c[i])) return 0;
            hash_dir = 1;
        }
        if (c[n] == '\0') break;
        c += n + 1;
    }
    /* D ends after the '+' was written; before that only full components. */
    return hash_dir || plus || last_d >= FULL_COMPONENT;
}
