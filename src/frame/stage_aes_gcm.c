/* stage_aes_gcm.c - the aes_gcm transform stage: AES-256-GCM of the bytes
 * before it, bound to the frame header and the object key, with keys from
 * key files (docs/security.md).
 *
 *   config   {"type": "aes_gcm", "key_files": ["/k1", "/k2"]} or
 *            {"type": "aes_gcm", "key_file": "/k1"}. A key file holds 32 raw
 *            bytes or 64 hex characters (and at most one newline) and must
 *            not be readable or writable by group or others.
 *   key ids  the first 8 bytes of SHA-256("kvserde aes_gcm key id v1" ||
 *            key). A stage encrypts with the first key file's key; a reader
 *            decrypts with whichever key of its keyring (every key file of
 *            every aes_gcm stage of its config) has the blob's key id, so
 *            keys rotate by putting the new file first and keeping the old
 *            ones listed until their blobs are gone.
 *   subkeys  the cipher key of a blob is HKDF-SHA256(master key, salt
 *            empty, info "kvserde aes_gcm v1" 0x00 cache_salt): one key per
 *            tenant (LMCache's cache_salt), "" for a keyless blob.
 *   params   20 bytes per blob: key id (8), then a 96-bit nonce (12) from
 *            getrandom(2), fresh on every write_params (once per
 *            serialize). Encryption is the one exception to "serialize is
 *            deterministic".
 *   AAD      the frame header (which holds these params and the payload
 *            length), then the object key's canonical bytes
 *            (key_canonical_bytes below), or the single byte 0x00 when the
 *            blob has no object key.
 *   payload  ciphertext (n bytes), then the 16-byte tag.
 *
 * Nonce bound: with random 96-bit nonces NIST SP 800-38D (section 8.3)
 * limits one key to 2^32 encryptions, keeping the chance of a nonce
 * collision (which would reveal the XOR of two plaintexts and allow tag
 * forgery) below 2^-32. Rotate the master key well before 2^32 blobs have
 * been written with it. Per-tenant subkeys spread the count over tenants
 * only where the tenants (cache_salt values) differ: every blob of one
 * tenant counts against the same subkey.
 *
 * Thread safety: the stage instance and the keyring are read-only after
 * creation, and every encode and decode uses its own cipher context and
 * subkey on its stack, so any number of threads may encode and decode at
 * once with the same instance and keyring.
 *
 * Secrets: master keys live in the instance and the keyring and are wiped
 * (OPENSSL_cleanse) when they are freed; subkeys, key file contents and
 * cipher contexts are wiped as soon as a call is done with them. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>

#include "frame/frame.h"
#include "frame/stage.h"
#include "frame/stage_aes_gcm.h"
#include "kvserde/error.h"
#include "kvserde/registry.h"

#define TAG KVS_AES_GCM_TAG_LEN
#define PARAMS KVS_AES_GCM_PARAMS_LEN

static const char KEY_ID_LABEL[] = "kvserde aes_gcm key id v1"; /* hashed without its NUL */
static const char SUBKEY_LABEL[] = "kvserde aes_gcm v1";        /* then 0x00, cache_salt */

size_t kvs_aes_gcm_update_chunk = (size_t)1 << 30;

/* One master key and its id. */
typedef struct aes_master_key {
    uint8_t key[KVS_AES_GCM_KEY_LEN];
    uint8_t id[KVS_AES_GCM_KEY_ID_LEN];
} aes_master_key;

/* Every key of a pipeline's aes_gcm stages, for decoding. */

/* A growable list of master keys that never leaves a copy of a key in
 * freed memory (no realloc). */
typedef struct key_list {
    size_t n, cap;
    aes_master_key *keys;
} key_list;

/* Every key of a pipeline's aes_gcm stages, for decoding. */
struct kvs_keyring {
    key_list keys;
};

/* An instance: the key it encrypts with (the first key file's). */
typedef struct aes_gcm_stage {
    kvs_stage base;
    aes_master_key enc;
} aes_gcm_stage;

static void key_list_free(key_list *l)
{
    if (l->keys) {
        OPENSSL_cleanse(l->keys, l->cap * sizeof *l->keys);
        free(l->keys);
    }
    l->keys = NULL;
    l->n = l->cap = 0;
}

/* Append k unless an identical key is already there. */
static int key_list_add(key_list *l, const aes_master_key *k)
{
    for (size_t i = 0; i < l->n; i++)
        if (memcmp(&l->keys[i], k, sizeof *k) == 0) return KVS_OK;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 4;
        aes_master_key *keys = calloc(cap, sizeof *keys);
        if (keys == NULL) return kvs_set_error(KVS_ENOMEM, "aes_gcm: out of memory for %zu keys", cap);
        if (l->n) memcpy(keys, l->keys, l->n * sizeof *keys);
        size_t n = l->n;
        key_list_free(l);
        l->keys = keys;
        l->n = n;
        l->cap = cap;
    }
    l->keys[l->n++] = *k;
    return KVS_OK;
}

/* ---------------------------------------------------------------------------
 * Hex
 * ------------------------------------------------------------------------- */

static void to_hex(const uint8_t *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hex_value(uint8_t c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* ---------------------------------------------------------------------------
 * The AAD's key part: the object key's canonical bytes (frame.h), the same
 * bytes the frame's key fingerprint hashes
 * ------------------------------------------------------------------------- */

/* The AAD after the header: the key's canonical bytes, or 0x00 for none. */
static int key_aad(const kvs_object_key *key, uint8_t *buf, size_t *len)
{
    if (key == NULL) {
        buf[0] = 0x00;
        *len = 1;
        return KVS_OK;
    }
    if (key->chunk_hash_len > KVS_CHUNK_HASH_MAX)
        return kvs_set_error(KVS_EINVAL, "aes_gcm: malformed object key (a chunk hash of %zu "
                             "bytes, over %d)", key->chunk_hash_len, KVS_CHUNK_HASH_MAX);
    *len = kvs_key_canonical(key, buf);
    return KVS_OK;
}

/* ---------------------------------------------------------------------------
 * Key ids, subkeys, the raw AEAD
 * ------------------------------------------------------------------------- */

int kvs_aes_gcm_key_id(const uint8_t key[KVS_AES_GCM_KEY_LEN],
                       uint8_t id[KVS_AES_GCM_KEY_ID_LEN])
{
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (md == NULL) return kvs_set_error(KVS_ENOMEM, "aes_gcm: out of memory for a digest");
    uint8_t digest[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    int ok = EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 &&
             EVP_DigestUpdate(md, KEY_ID_LABEL, sizeof KEY_ID_LABEL - 1) == 1 &&
             EVP_DigestUpdate(md, key, KVS_AES_GCM_KEY_LEN) == 1 &&
             EVP_DigestFinal_ex(md, digest, &len) == 1 && len >= KVS_AES_GCM_KEY_ID_LEN;
    EVP_MD_CTX_free(md);
    if (!ok) {
        ERR_clear_error();
        return kvs_set_error(KVS_EIO, "aes_gcm: the crypto library cannot compute SHA-256");
    }
    memcpy(id, digest, KVS_AES_GCM_KEY_ID_LEN);
    OPENSSL_cleanse(digest, sizeof digest);
    return KVS_OK;
}

int kvs_aes_gcm_subkey(const uint8_t master[KVS_AES_GCM_KEY_LEN], const char *cache_salt,
                       uint8_t out[KVS_AES_GCM_KEY_LEN])
{
    if (cache_salt == NULL) cache_salt = "";
    size_t salt_len = strnlen(cache_salt, KVS_CACHE_SALT_MAX + 1);
    if (salt_len > KVS_CACHE_SALT_MAX)
        return kvs_set_error(KVS_EINVAL, "aes_gcm: cache salt longer than %d characters",
                             KVS_CACHE_SALT_MAX);
    uint8_t info[sizeof SUBKEY_LABEL + KVS_CACHE_SALT_MAX];
    memcpy(info, SUBKEY_LABEL, sizeof SUBKEY_LABEL); /* the label and its NUL */
    memcpy(info + sizeof SUBKEY_LABEL, cache_salt, salt_len);
    size_t info_len = sizeof SUBKEY_LABEL + salt_len;

    EVP_PKEY_CTX *pc = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, NULL);
    if (pc == NULL) {
        ERR_clear_error();
        return kvs_set_error(KVS_ENOMEM, "aes_gcm: out of memory for HKDF");
    }
    size_t out_len = KVS_AES_GCM_KEY_LEN;
    int ok = EVP_PKEY_derive_init(pc) > 0 && EVP_PKEY_CTX_set_hkdf_md(pc, EVP_sha256()) > 0 &&
             EVP_PKEY_CTX_set1_hkdf_key(pc, master, KVS_AES_GCM_KEY_LEN) > 0 &&
             EVP_PKEY_CTX_add1_hkdf_info(pc, info, (int)info_len) > 0 &&
             EVP_PKEY_derive(pc, out, &out_len) > 0 && out_len == KVS_AES_GCM_KEY_LEN;
    EVP_PKEY_CTX_free(pc);
    if (!ok) {
        ERR_clear_error();
        OPENSSL_cleanse(out, KVS_AES_GCM_KEY_LEN);
        return kvs_set_error(KVS_EIO, "aes_gcm: the crypto library cannot derive the "
                                      "HKDF-SHA256 subkey");
    }
    return KVS_OK;
}

/* Feed in[0..n) to the cipher in pieces that fit its int lengths; out NULL
 * for additional data. 1 if every byte went through. */
static int gcm_update(EVP_CIPHER_CTX *c, int enc, uint8_t *out, const uint8_t *in, size_t n)
{
    size_t piece = kvs_aes_gcm_update_chunk;
    if (piece == 0 || piece > INT_MAX) piece = (size_t)1 << 30;
    while (n > 0) {
        size_t step = n < piece ? n : piece;
        int outl = 0;
        int ok = enc ? EVP_EncryptUpdate(c, out, &outl, in, (int)step)
                     : EVP_DecryptUpdate(c, out, &outl, in, (int)step);
        if (ok != 1 || (size_t)outl != step) return 0;
        in += step;
        if (out) out += step;
        n -= step;
    }
    return 1;
}

/* The shared start of seal and open: a context with the key, the nonce and
 * the additional data. NULL with a message on failure. */
static EVP_CIPHER_CTX *gcm_start(int enc, const uint8_t *key, const uint8_t *nonce,
                                 const uint8_t *aad1, size_t aad1_len, const uint8_t *aad2,
                                 size_t aad2_len, size_t n)
{
    if ((uint64_t)n > KVS_AES_GCM_MAX_PLAINTEXT) {
        kvs_set_error(KVS_EINVAL,
                      "aes_gcm: payload of %zu bytes exceeds the AES-GCM limit of %llu "
                      "bytes per blob",
                      n, (unsigned long long)KVS_AES_GCM_MAX_PLAINTEXT);
        return NULL;
    }
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    if (c == NULL) {
        ERR_clear_error();
        kvs_set_error(KVS_ENOMEM, "aes_gcm: out of memory for a cipher context");
        return NULL;
    }
    int ok = EVP_CipherInit_ex(c, EVP_aes_256_gcm(), NULL, NULL, NULL, enc) == 1 &&
             EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_IVLEN, KVS_AES_GCM_NONCE_LEN, NULL) == 1 &&
             EVP_CipherInit_ex(c, NULL, NULL, key, nonce, enc) == 1 &&
             gcm_update(c, enc, NULL, aad1, aad1_len) && gcm_update(c, enc, NULL, aad2, aad2_len);
    if (!ok) {
        EVP_CIPHER_CTX_free(c);
        ERR_clear_error();
        kvs_set_error(KVS_EIO, "aes_gcm: the crypto library cannot set up AES-256-GCM");
        return NULL;
    }
    return c;
}

int kvs_aes_gcm_seal(const uint8_t key[KVS_AES_GCM_KEY_LEN],
                     const uint8_t nonce[KVS_AES_GCM_NONCE_LEN], const uint8_t *aad1,
                     size_t aad1_len, const uint8_t *aad2, size_t aad2_len,
                     const uint8_t *in, size_t n, uint8_t *out,
                     uint8_t tag[KVS_AES_GCM_TAG_LEN])
{
    EVP_CIPHER_CTX *c = gcm_start(1, key, nonce, aad1, aad1_len, aad2, aad2_len, n);
    if (c == NULL) return kvs_last_error_code();
    uint8_t last[32];
    int outl = 0;
    int ok = gcm_update(c, 1, out, in, n) && EVP_EncryptFinal_ex(c, last, &outl) == 1 &&
             outl == 0 && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, TAG, tag) == 1;
    EVP_CIPHER_CTX_free(c); /* wipes the key schedule */
    if (!ok) {
        ERR_clear_error();
        return kvs_set_error(KVS_EIO, "aes_gcm: the crypto library failed to encrypt "
                                      "%zu bytes",
                             n);
    }
    return KVS_OK;
}

int kvs_aes_gcm_open(const uint8_t key[KVS_AES_GCM_KEY_LEN],
                     const uint8_t nonce[KVS_AES_GCM_NONCE_LEN], const uint8_t *aad1,
                     size_t aad1_len, const uint8_t *aad2, size_t aad2_len,
                     const uint8_t *in, size_t n, const uint8_t tag[KVS_AES_GCM_TAG_LEN],
                     uint8_t *out)
{
    EVP_CIPHER_CTX *c = gcm_start(0, key, nonce, aad1, aad1_len, aad2, aad2_len, n);
    if (c == NULL) return kvs_last_error_code();
    uint8_t tag_copy[TAG], last[32];
    memcpy(tag_copy, tag, TAG); /* tag may lie in out's way when out == in */
    int outl = 0;
    int ok = gcm_update(c, 0, out, in, n) &&
             EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, TAG, tag_copy) == 1 &&
             EVP_DecryptFinal_ex(c, last, &outl) == 1 && outl == 0;
    EVP_CIPHER_CTX_free(c);
    if (!ok) {
        ERR_clear_error();
        if (n) OPENSSL_cleanse(out, n);
        return kvs_set_error(KVS_EAUTH, "aes_gcm: authentication failed (wrong key, or "
                                        "ciphertext, header or object key altered)");
    }
    return KVS_OK;
}

/* ---------------------------------------------------------------------------
 * Key files and the config
 * ------------------------------------------------------------------------- */

#define KEY_FILE_READ_MAX 66 /* one more than the largest valid file */

/* Read one key file into k (key and id). */
static int read_key_file(const char *path, aes_master_key *k)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int err = errno;
        return kvs_set_error(err == ENOENT || err == ENOTDIR ? KVS_ENOTFOUND : KVS_EIO,
                             "aes_gcm: cannot open key file %s: %s", path, strerror(err));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return kvs_set_error(KVS_EIO, "aes_gcm: cannot read the mode of key file %s: %s",
                             path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kvs_set_error(KVS_EINVAL, "aes_gcm: key file %s is not a regular file", path);
    }
    unsigned mode = (unsigned)st.st_mode & 07777;
    if (mode & (S_IRGRP | S_IWGRP | S_IROTH | S_IWOTH)) {
        close(fd);
        return kvs_set_error(KVS_EINVAL,
                             "aes_gcm: key file %s is %s by group or others (mode %04o); "
                             "chmod 600 it",
                             path, (mode & (S_IRGRP | S_IROTH)) ? "readable" : "writable",
                             mode);
    }
    uint8_t buf[KEY_FILE_READ_MAX];
    size_t n = 0;
    int rc = KVS_OK;
    while (n < sizeof buf) {
        ssize_t got = read(fd, buf + n, sizeof buf - n);
        if (got < 0) {
            if (errno == EINTR) continue;
            rc = kvs_set_error(KVS_EIO, "aes_gcm: cannot read key file %s: %s", path,
                               strerror(errno));
            break;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    if (rc == KVS_OK) {
        if (n == KVS_AES_GCM_KEY_LEN) {
            memcpy(k->key, buf, KVS_AES_GCM_KEY_LEN);
        } else if (n == 2 * KVS_AES_GCM_KEY_LEN || n == 2 * KVS_AES_GCM_KEY_LEN + 1) {
            for (size_t i = 0; i < 2 * KVS_AES_GCM_KEY_LEN && rc == KVS_OK; i += 2) {
                int hi = hex_value(buf[i]), lo = hex_value(buf[i + 1]);
                if (hi < 0 || lo < 0)
                    rc = kvs_set_error(KVS_EINVAL,
                                       "aes_gcm: key file %s: character %zu is not a hex "
                                       "digit (a key file of 64 or 65 bytes holds 64 hex "
                                       "characters, optionally followed by one newline)",
                                       path, hi < 0 ? i + 1 : i + 2);
                else
                    k->key[i / 2] = (uint8_t)(hi << 4 | lo);
            }
            if (rc == KVS_OK && n == 2 * KVS_AES_GCM_KEY_LEN + 1 && buf[n - 1] != '\n')
                rc = kvs_set_error(KVS_EINVAL,
                                   "aes_gcm: key file %s is 65 bytes but its last byte is "
                                   "not a newline (expected 64 hex characters, optionally "
                                   "followed by one newline)",
                                   path);
        } else {
            long long size = n < sizeof buf ? (long long)n : (long long)st.st_size;
            if (size < (long long)n) size = (long long)n; /* grew since fstat */
            rc = kvs_set_error(KVS_EINVAL,
                               "aes_gcm: key file %s is %lld bytes; expected 32 raw bytes "
                               "or 64 hex characters (optionally followed by one newline)",
                               path, size);
        }
    }
    OPENSSL_cleanse(buf, sizeof buf);
    if (rc == KVS_OK) rc = kvs_aes_gcm_key_id(k->key, k->id);
    if (rc != KVS_OK) OPENSSL_cleanse(k, sizeof *k);
    return rc;
}

/* Read every key file of one aes_gcm stage config into l, in order. */
static int load_config_keys(const json_t *config, key_list *l)
{
    static const char *const known[] = {"type", "key_file", "key_files", NULL};
    if (!json_is_object(config))
        return kvs_set_error(KVS_EINVAL, "aes_gcm: config must be a JSON object, got %s",
                             config ? kvs_json_type_name(config) : "nothing");
    int rc = kvs_json_check_keys(config, "aes_gcm", "member", known);
    if (rc) return rc;
    const json_t *one = json_object_get(config, "key_file");
    const json_t *list = json_object_get(config, "key_files");
    if (one && list)
        return kvs_set_error(KVS_EINVAL,
                             "aes_gcm: give either key_file or key_files, not both");
    if (!one && !list)
        return kvs_set_error(KVS_EINVAL,
                             "aes_gcm: no key file; give \"key_files\": [\"/path\", ...] "
                             "or \"key_file\": \"/path\"");
    size_t count = 1;
    if (list) {
        if (!json_is_array(list))
            return kvs_set_error(KVS_EINVAL,
                                 "aes_gcm: key_files must be a JSON array of paths, got %s",
                                 kvs_json_type_name(list));
        count = json_array_size(list);
        if (count == 0)
            return kvs_set_error(KVS_EINVAL,
                                 "aes_gcm: key_files is empty; give at least one key file");
    }
    for (size_t i = 0; i < count; i++) {
        const json_t *v = list ? json_array_get(list, i) : one;
        if (!json_is_string(v)) {
            if (list)
                return kvs_set_error(KVS_EINVAL,
                                     "aes_gcm: key_files[%zu] must be a string (a path), "
                                     "got %s",
                                     i, kvs_json_type_name(v));
            return kvs_set_error(KVS_EINVAL,
                                 "aes_gcm: key_file must be a string (a path), got %s",
                                 kvs_json_type_name(v));
        }
        const char *path = json_string_value(v);
        if (path[0] == '\0') {
            if (list)
                return kvs_set_error(KVS_EINVAL, "aes_gcm: key_files[%zu] is an empty path", i);
            return kvs_set_error(KVS_EINVAL, "aes_gcm: key_file is an empty path");
        }
        aes_master_key k;
        rc = read_key_file(path, &k);
        if (rc == KVS_OK) rc = key_list_add(l, &k);
        OPENSSL_cleanse(&k, sizeof k);
        if (rc) return rc;
    }
    return KVS_OK;
}

int kvs_keyring_from_config(const json_t *stages, kvs_keyring **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "aes_gcm: NULL keyring output");
    *out = NULL;
    if (stages == NULL) return KVS_OK;
    if (!json_is_array(stages))
        return kvs_set_error(KVS_EINVAL, "aes_gcm: the stages must be a JSON array, got %s",
                             kvs_json_type_name(stages));
    key_list l = {0};
    size_t i;
    const json_t *stage;
    json_array_foreach(stages, i, stage) {
        const json_t *type = json_object_get(stage, "type"); /* NULL for a non-object */
        if (!json_is_string(type) || strcmp(json_string_value(type), "aes_gcm") != 0) continue;
        int rc = load_config_keys(stage, &l);
        if (rc) {
            key_list_free(&l);
            return rc;
        }
    }
    if (l.n == 0) return KVS_OK;
    kvs_keyring *kr = malloc(sizeof *kr);
    if (kr == NULL) {
        key_list_free(&l);
        return kvs_set_error(KVS_ENOMEM, "aes_gcm: out of memory for the keyring");
    }
    kr->keys = l; /* taken over: wiped and freed by kvs_keyring_free */
    *out = kr;
    return KVS_OK;
}

void kvs_keyring_free(kvs_keyring *kr)
{
    if (kr == NULL) return;
    key_list_free(&kr->keys);
    free(kr);
}

/* ---------------------------------------------------------------------------
 * The stage
 * ------------------------------------------------------------------------- */

static int aes_create(const json_t *config, kvs_stage **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "aes_gcm: NULL stage output");
    *out = NULL;
    key_list l = {0};
    int rc = load_config_keys(config, &l);
    if (rc) {
        key_list_free(&l);
        return rc;
    }
    aes_gcm_stage *s = calloc(1, sizeof *s);
    if (s == NULL) {
        key_list_free(&l);
        return kvs_set_error(KVS_ENOMEM, "aes_gcm: out of memory for the stage");
    }
    s->base.type = &kvs_stage_aes_gcm_type;
    s->enc = l.keys[0]; /* encrypt with the first key file's key */
    key_list_free(&l);
    *out = &s->base;
    return KVS_OK;
}

static void aes_destroy(kvs_stage *self)
{
    if (self == NULL) return;
    OPENSSL_cleanse(self, sizeof(aes_gcm_stage));
    free(self);
}

static size_t aes_bytes_bound(const kvs_stage *self, size_t n)
{
    return n > SIZE_MAX - TAG ? SIZE_MAX : n + TAG;
}

static size_t aes_params_size(const kvs_stage *self)
{
    return PARAMS;
}

static int aes_write_params(const kvs_stage *self, uint8_t *params)
{
    const aes_gcm_stage *s = (const aes_gcm_stage *)self;
    uint8_t *nonce = params + KVS_AES_GCM_KEY_ID_LEN;
    size_t got = 0;
    while (got < KVS_AES_GCM_NONCE_LEN) {
        ssize_t r = getrandom(nonce + got, KVS_AES_GCM_NONCE_LEN - got, 0);
        if (r < 0) {
            if (errno == EINTR) continue;
            return kvs_set_error(KVS_EIO,
                                 "aes_gcm: the kernel gave no random bytes for the nonce: %s",
                                 strerror(errno));
        }
        got += (size_t)r;
    }
    memcpy(params, s->enc.id, KVS_AES_GCM_KEY_ID_LEN);
    return KVS_OK;
}

static int params_size_error(int code, size_t nparams)
{
    return kvs_set_error(code,
                         "aes_gcm: parameter block of %zu bytes; expected %d (8-byte key id, "
                         "12-byte nonce)",
                         nparams, PARAMS);
}

static int aes_check_params(const uint8_t *params, size_t nparams)
{
    if (params == NULL || nparams != PARAMS) return params_size_error(KVS_ECORRUPT, nparams);
    return KVS_OK;
}

static json_t *aes_describe_params(const uint8_t *params, size_t nparams)
{
    if (params == NULL || nparams != PARAMS) return NULL;
    char id[2 * KVS_AES_GCM_KEY_ID_LEN + 1], nonce[2 * KVS_AES_GCM_NONCE_LEN + 1];
    to_hex(params, KVS_AES_GCM_KEY_ID_LEN, id);
    to_hex(params + KVS_AES_GCM_KEY_ID_LEN, KVS_AES_GCM_NONCE_LEN, nonce);
    return json_pack("{s:s, s:s}", "key_id", id, "nonce", nonce);
}

/* The header part of the AAD, checked. */
static int ctx_header(const kvs_stage_ctx *ctx, const uint8_t **h, size_t *hlen)
{
    *h = ctx ? ctx->header : NULL;
    *hlen = ctx ? ctx->header_len : 0;
    if (*h == NULL && *hlen > 0)
        return kvs_set_error(KVS_EINVAL, "aes_gcm: no frame header given (%zu bytes announced)",
                             *hlen);
    return KVS_OK;
}

/* 1 if [a, a+an) and [b, b+bn) overlap without starting at the same byte. */
static int overlap_apart(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
    if (a == b || an == 0 || bn == 0) return 0;
    uintptr_t pa = (uintptr_t)a, pb = (uintptr_t)b;
    return pa < pb ? pb - pa < an : pa - pb < bn;
}

/* The checks every encryption of a payload of n bytes passes: the
 * parameters name this stage's key, n within the AES-GCM limit. */
static int check_encrypt(const aes_gcm_stage *s, const uint8_t *params, size_t nparams,
                         size_t n)
{
    if (params == NULL || nparams != PARAMS) return params_size_error(KVS_EINVAL, nparams);
    if (memcmp(params, s->enc.id, KVS_AES_GCM_KEY_ID_LEN) != 0) {
        char want[2 * KVS_AES_GCM_KEY_ID_LEN + 1], have[2 * KVS_AES_GCM_KEY_ID_LEN + 1];
        to_hex(params, KVS_AES_GCM_KEY_ID_LEN, want);
        to_hex(s->enc.id, KVS_AES_GCM_KEY_ID_LEN, have);
        return kvs_set_error(KVS_EINVAL,
                             "aes_gcm: the parameters name key id %s, but this stage "
                             "encrypts with key id %s",
                             want, have);
    }
    if ((uint64_t)n > KVS_AES_GCM_MAX_PLAINTEXT)
        return kvs_set_error(KVS_EINVAL,
                             "aes_gcm: payload of %zu bytes exceeds the AES-GCM limit of %llu "
                             "bytes per blob",
                             n, (unsigned long long)KVS_AES_GCM_MAX_PLAINTEXT);
    return KVS_OK;
}

/* Streamed encryption (stage.h's stream_*): the cipher context, keyed with
 * the blob's subkey and fed the AAD, and the bytes still to come. */
typedef struct aes_stream {
    EVP_CIPHER_CTX *c;
    size_t left;
} aes_stream;

static int aes_stream_begin(const kvs_stage *self, const uint8_t *params, size_t nparams,
                            const kvs_stage_ctx *ctx, size_t n, void **state)
{
    const aes_gcm_stage *s = (const aes_gcm_stage *)self;
    *state = NULL;
    int rc = check_encrypt(s, params, nparams, n);
    const uint8_t *h;
    size_t hlen, klen = 0;
    uint8_t kbytes[KVS_KEY_CANONICAL_MAX];
    const kvs_object_key *key = ctx ? ctx->key : NULL;
    if (rc == KVS_OK) rc = ctx_header(ctx, &h, &hlen);
    if (rc == KVS_OK) rc = key_aad(key, kbytes, &klen);
    if (rc) return rc;
    aes_stream *st = calloc(1, sizeof *st);
    if (st == NULL) return kvs_set_error(KVS_ENOMEM, "aes_gcm: out of memory for a stream");
    uint8_t sub[KVS_AES_GCM_KEY_LEN];
    rc = kvs_aes_gcm_subkey(s->enc.key, key ? key->cache_salt : "", sub);
    if (rc == KVS_OK) {
        st->c = gcm_start(1, sub, params + KVS_AES_GCM_KEY_ID_LEN, h, hlen, kbytes, klen, n);
        if (st->c == NULL) rc = kvs_last_error_code();
    }
    OPENSSL_cleanse(sub, sizeof sub); /* the context keeps its own key schedule */
    if (rc) {
        free(st);
        return rc;
    }
    st->left = n;
    *state = st;
    return KVS_OK;
}

static int aes_stream_update(void *state, const uint8_t *in, uint8_t *out, size_t n)
{
    aes_stream *st = state;
    if (n > st->left)
        return kvs_set_error(KVS_EINVAL, "aes_gcm: %zu more bytes than the %zu announced", n,
                             st->left);
    if (!gcm_update(st->c, 1, out, in, n)) {
        ERR_clear_error();
        return kvs_set_error(KVS_EIO, "aes_gcm: the crypto library failed to encrypt %zu bytes",
                             n);
    }
    st->left -= n;
    return KVS_OK;
}

static int aes_stream_end(void *state, uint8_t *tail)
{
    aes_stream *st = state;
    if (st == NULL) return KVS_OK;
    int rc = KVS_OK;
    if (tail) {
        uint8_t last[32];
        int outl = 0;
        if (st->left != 0)
            rc = kvs_set_error(KVS_EINVAL, "aes_gcm: stream ended %zu bytes short", st->left);
        else if (EVP_EncryptFinal_ex(st->c, last, &outl) != 1 || outl != 0 ||
                 EVP_CIPHER_CTX_ctrl(st->c, EVP_CTRL_GCM_GET_TAG, TAG, tail) != 1) {
            ERR_clear_error();
            rc = kvs_set_error(KVS_EIO, "aes_gcm: the crypto library failed to finish the tag");
        }
    }
    EVP_CIPHER_CTX_free(st->c); /* wipes the key schedule */
    free(st);
    return rc;
}

/* The whole payload at once: one stream over it. */
static int aes_transform_encode(const kvs_stage *self, const uint8_t *params, size_t nparams,
                                const kvs_stage_ctx *ctx, const uint8_t *in, size_t n,
                                uint8_t *out, size_t cap, size_t *outn)
{
    const aes_gcm_stage *s = (const aes_gcm_stage *)self;
    if (outn) *outn = 0;
    int rc = check_encrypt(s, params, nparams, n);
    if (rc) return rc;
    if (cap < n + TAG)
        return kvs_set_error(KVS_ENOSPC,
                             "aes_gcm: output needs %zu bytes (%zu of payload and the 16-byte "
                             "tag); capacity is %zu",
                             n + TAG, n, cap);
    if ((in == NULL && n > 0) || out == NULL)
        return kvs_set_error(KVS_EINVAL, "aes_gcm: NULL input or output buffer");
    if (overlap_apart(in, n, out, n + TAG))
        return kvs_set_error(KVS_EINVAL,
                             "aes_gcm: the output overlaps the input without starting at "
                             "the same byte");
    void *st;
    rc = aes_stream_begin(self, params, nparams, ctx, n, &st);
    if (rc) return rc;
    rc = aes_stream_update(st, in, out, n);
    int end = aes_stream_end(st, rc == KVS_OK ? out + n : NULL);
    if (rc == KVS_OK) rc = end;
    if (rc == KVS_OK && outn) *outn = n + TAG;
    return rc;
}

static int aes_decoded_size(const uint8_t *params, size_t nparams, const uint8_t *in, size_t n,
                            size_t *outn)
{
    (void)params;
    (void)nparams;
    (void)in;
    if (n < TAG)
        return kvs_set_error(KVS_ECORRUPT,
                             "aes_gcm: payload of %zu bytes is shorter than the 16-byte tag", n);
    *outn = n - TAG;
    return KVS_OK;
}

static int aes_transform_decode(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                                const uint8_t *in, size_t n, uint8_t *out, size_t cap,
                                size_t *outn)
{
    if (outn) *outn = 0;
    int rc = aes_check_params(params, nparams);
    if (rc) return rc;
    if (n < TAG)
        return kvs_set_error(KVS_ECORRUPT,
                             "aes_gcm: payload of %zu bytes is shorter than the 16-byte tag", n);
    size_t m = n - TAG;
    if (cap < m)
        return kvs_set_error(KVS_ENOSPC,
                             "aes_gcm: decrypted payload of %zu bytes does not fit in %zu", m,
                             cap);
    if (in == NULL || (out == NULL && m > 0))
        return kvs_set_error(KVS_EINVAL, "aes_gcm: NULL input or output buffer");
    if (overlap_apart(in, n, out, m))
        return kvs_set_error(KVS_EINVAL,
                             "aes_gcm: the output overlaps the input without starting at "
                             "the same byte");

    /* The keys with the blob's key id (more than one only by a 64-bit
     * collision; each is tried). */
    const kvs_keyring *kr = ctx ? ctx->keyring : NULL;
    const aes_master_key *keys = kr ? kr->keys.keys : NULL;
    size_t nkeys = kr ? kr->keys.n : 0, matches = 0;
    for (size_t i = 0; i < nkeys; i++)
        if (memcmp(keys[i].id, params, KVS_AES_GCM_KEY_ID_LEN) == 0) matches++;
    if (matches == 0) {
        char want[2 * KVS_AES_GCM_KEY_ID_LEN + 1];
        char list[KVS_ERROR_MSG_MAX];
        size_t p = 0;
        to_hex(params, KVS_AES_GCM_KEY_ID_LEN, want);
        list[0] = '\0';
        for (size_t i = 0; i < nkeys && p + 2 * KVS_AES_GCM_KEY_ID_LEN + 3 < sizeof list; i++) {
            if (i) {
                memcpy(list + p, ", ", 2);
                p += 2;
            }
            to_hex(keys[i].id, KVS_AES_GCM_KEY_ID_LEN, list + p);
            p += 2 * KVS_AES_GCM_KEY_ID_LEN;
        }
        return kvs_set_error(KVS_EAUTH,
                             "aes_gcm: no configured key has key id %s (configured: %s)", want,
                             nkeys ? list : "none");
    }

    const uint8_t *h;
    size_t hlen, klen = 0;
    uint8_t kbytes[KVS_KEY_CANONICAL_MAX];
    const kvs_object_key *key = ctx ? ctx->key : NULL;
    rc = ctx_header(ctx, &h, &hlen);
    if (rc == KVS_OK) rc = key_aad(key, kbytes, &klen);
    if (rc) return rc;

    rc = KVS_EAUTH;
    for (size_t i = 0; i < nkeys && rc != KVS_OK; i++) {
        if (memcmp(keys[i].id, params, KVS_AES_GCM_KEY_ID_LEN) != 0) continue;
        uint8_t sub[KVS_AES_GCM_KEY_LEN];
        rc = kvs_aes_gcm_subkey(keys[i].key, key ? key->cache_salt : "", sub);
        if (rc == KVS_OK)
            rc = kvs_aes_gcm_open(sub, params + KVS_AES_GCM_KEY_ID_LEN, h, hlen, kbytes, klen,
                                  in, m, in + m, out);
        OPENSSL_cleanse(sub, sizeof sub);
        if (rc != KVS_OK && rc != KVS_EAUTH) break; /* not a key mismatch */
    }
    if (rc != KVS_OK) {
        if (m) OPENSSL_cleanse(out, m);
        return rc;
    }
    if (outn) *outn = m;
    return KVS_OK;
}

const kvs_stage_type kvs_stage_aes_gcm_type = {
    .name = "aes_gcm",
    .id = KVS_STAGE_AES_GCM,
    .kind = KVS_STAGE_TRANSFORM,
    .create = aes_create,
    .bytes_bound = aes_bytes_bound,
    .in_place = 1,
    .needs_header = 1,
    .transform_encode = aes_transform_encode,
    .stream_begin = aes_stream_begin,
    .stream_update = aes_stream_update,
    .stream_end = aes_stream_end,
    .transform_decoded_size = aes_decoded_size,
    .transform_decode = aes_transform_decode,
    .params_size = aes_params_size,
    .write_params = aes_write_params,
    .check_params = aes_check_params,
    .describe_params = aes_describe_params,
    .destroy = aes_destroy,
};
