/* key.c - object keys (upstream ObjectKey) and temporary keys (upstream
 * utils.make_temp_key). */
#include <errno.h>
#include <string.h>
#include <sys/random.h>

#include "kvserde/error.h"
#include "kvserde/memobj.h"

/* Length of s if it is NUL-terminated within cap bytes, else cap. */
static size_t bounded_len(const char *s, size_t cap)
{
    const char *nul = memchr(s, '\0', cap);
    return nul ? (size_t)(nul - s) : cap;
}

static int check_model_name(const char *model, size_t cap)
{
    size_t len = bounded_len(model, cap);
    if (len > KVS_MODEL_NAME_MAX)
        return kvs_set_error(KVS_EINVAL, "key: model name longer than %d characters",
                             KVS_MODEL_NAME_MAX);
    if (memchr(model, '@', len))
        return kvs_set_error(KVS_EINVAL, "key: model name '%s' contains '@'", model);
    return KVS_OK;
}

static int check_cache_salt(const char *salt, size_t cap)
{
    size_t len = bounded_len(salt, cap);
    if (len > KVS_CACHE_SALT_MAX)
        return kvs_set_error(KVS_EINVAL, "key: cache salt longer than %d characters",
                             KVS_CACHE_SALT_MAX);
    for (size_t i = 0; i < len; i++) {
        if (salt[i] == '@' || salt[i] == '/' || salt[i] == '\\')
            return kvs_set_error(KVS_EINVAL, "key: cache salt '%s' contains '%c'",
                                 salt, salt[i]);
    }
    return KVS_OK;
}

int kvs_object_key_init(kvs_object_key *out, const void *chunk_hash,
                        size_t chunk_hash_len, const char *model_name,
                        int64_t kv_rank, int64_t object_group_id,
                        const char *cache_salt)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "key: NULL output");
    if (chunk_hash == NULL && chunk_hash_len > 0)
        return kvs_set_error(KVS_EINVAL, "key: NULL chunk hash of length %zu",
                             chunk_hash_len);
    if (chunk_hash_len > KVS_CHUNK_HASH_MAX)
        return kvs_set_error(KVS_EINVAL, "key: chunk hash is %zu bytes, at most %d",
                             chunk_hash_len, KVS_CHUNK_HASH_MAX);
    if (model_name == NULL) return kvs_set_error(KVS_EINVAL, "key: NULL model name");
    if (cache_salt == NULL) cache_salt = "";
    /* Bound the scans at max+1 so an over-long string is detected without
     * reading past it. */
    int rc = check_model_name(model_name, KVS_MODEL_NAME_MAX + 1);
    if (rc) return rc;
    rc = check_cache_salt(cache_salt, KVS_CACHE_SALT_MAX + 1);
    if (rc) return rc;
    if (object_group_id < 0)
        return kvs_set_error(KVS_EINVAL, "key: object group id %lld is negative",
                             (long long)object_group_id);
    memset(out, 0, sizeof *out);
    if (chunk_hash_len) memcpy(out->chunk_hash, chunk_hash, chunk_hash_len);
    out->chunk_hash_len = chunk_hash_len;
    memcpy(out->model_name, model_name, strlen(model_name));
    out->kv_rank = kv_rank;
    out->object_group_id = object_group_id;
    memcpy(out->cache_salt, cache_salt, strlen(cache_salt));
    return KVS_OK;
}

int kvs_object_key_validate(const kvs_object_key *key)
{
    if (key == NULL) return kvs_set_error(KVS_EINVAL, "key: NULL key");
    if (key->chunk_hash_len > KVS_CHUNK_HASH_MAX)
        return kvs_set_error(KVS_EINVAL, "key: chunk hash is %zu bytes, at most %d",
                             key->chunk_hash_len, KVS_CHUNK_HASH_MAX);
    if (bounded_len(key->model_name, sizeof key->model_name) == sizeof key->model_name)
        return kvs_set_error(KVS_EINVAL, "key: model name is not NUL-terminated");
    if (bounded_len(key->cache_salt, sizeof key->cache_salt) == sizeof key->cache_salt)
        return kvs_set_error(KVS_EINVAL, "key: cache salt is not NUL-terminated");
    int rc = check_model_name(key->model_name, sizeof key->model_name);
    if (rc) return rc;
    rc = check_cache_salt(key->cache_salt, sizeof key->cache_salt);
    if (rc) return rc;
    if (key->object_group_id < 0)
        return kvs_set_error(KVS_EINVAL, "key: object group id %lld is negative",
                             (long long)key->object_group_id);
    return KVS_OK;
}

int kvs_object_key_equal(const kvs_object_key *a, const kvs_object_key *b)
{
    return a->chunk_hash_len == b->chunk_hash_len &&
           memcmp(a->chunk_hash, b->chunk_hash, a->chunk_hash_len) == 0 &&
           strcmp(a->model_name, b->model_name) == 0 && a->kv_rank == b->kv_rank &&
           a->object_group_id == b->object_group_id &&
           strcmp(a->cache_salt, b->cache_salt) == 0;
}

int kvs_make_temp_key(const kvs_object_key *key, kvs_object_key *out)
{
    int rc = kvs_object_key_validate(key);
    if (rc) return rc;
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "key: NULL output");
    if (key->chunk_hash_len > KVS_CHUNK_HASH_MAX - KVS_TEMP_KEY_SUFFIX)
        return kvs_set_error(KVS_EINVAL,
                             "key: chunk hash is %zu bytes; a temp key appends %d and "
                             "the limit is %d",
                             key->chunk_hash_len, KVS_TEMP_KEY_SUFFIX,
                             KVS_CHUNK_HASH_MAX);
    uint8_t suffix[KVS_TEMP_KEY_SUFFIX];
    size_t got = 0;
    while (got < sizeof suffix) {
        ssize_t n = getrandom(suffix + got, sizeof suffix - got, 0);
        if (n < 0) {
            if (errno == EINTR) continue;
            return kvs_set_error(KVS_EIO, "key: getrandom failed: %s", strerror(errno));
        }
        got += (size_t)n;
    }
    kvs_object_key tmp = *key;
    memcpy(tmp.chunk_hash + tmp.chunk_hash_len, suffix, sizeof suffix);
    tmp.chunk_hash_len += sizeof suffix;
    *out = tmp;
    return KVS_OK;
}
