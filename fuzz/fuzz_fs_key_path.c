/* fuzz_fs_key_path.c - the fs adapter's key -> file name scheme
 * (kvs_fs_key_path / kvs_fs_path_key, l2_fs.h).
 *
 * Input: two object keys, field by field (the key struct is filled directly,
 * so invalid keys are tried too), then free text.
 * Properties, for every valid key k:
 *   - the path stays inside the directory: not empty, no leading '/', every
 *     '/'-separated component 1..200 bytes of printable ASCII, none "." or
 *     ".." or starting with '.', shorter than KVS_FS_KEY_PATH_MAX;
 *   - decode(encode(k)) == k (so encode is injective), and two different
 *     keys get different paths, neither a directory of the other;
 *   - a buffer one byte short is refused with KVS_ENOSPC and "" (no
 *     overflow: the buffers are exact-size heap blocks);
 * invalid keys are refused exactly when kvs_object_key_validate refuses
 * them; and any text that kvs_fs_path_key accepts re-encodes to itself.
 */
#include "fuzz_common.h"
#include "kvserde/l2_fs.h"
#include "kvserde/memobj.h"

static void read_key(fz_in *in, kvs_object_key *k)
{
    memset(k, 0, sizeof *k);
    uint8_t flags = fz_u8(in);
    size_t hlen = fz_u8(in);
    if (!(flags & 1)) hlen %= KVS_CHUNK_HASH_MAX + 1; /* mostly valid lengths */
    k->chunk_hash_len = hlen;
    fz_bytes(in, k->chunk_hash, hlen < KVS_CHUNK_HASH_MAX ? hlen : KVS_CHUNK_HASH_MAX);
    size_t mlen = fz_u8(in);
    fz_bytes(in, k->model_name, mlen); /* <= 255: always NUL-terminated */
    size_t slen = fz_u8(in) % (KVS_CACHE_SALT_MAX + 1);
    fz_bytes(in, k->cache_salt, slen);
    k->kv_rank = (int64_t)fz_u64(in);
    k->object_group_id = (int64_t)fz_u64(in);
    if (flags & 2) k->kv_rank = (int8_t)k->kv_rank;              /* small values */
    if (flags & 4) k->object_group_id = (uint8_t)k->object_group_id;
}

static void check_path(const char *path)
{
    size_t len = strlen(path);
    FZ_ASSERT(len > 0 && len < KVS_FS_KEY_PATH_MAX, "path length %zu", len);
    FZ_ASSERT(path[0] != '/', "absolute path '%s'", path);
    const char *c = path;
    for (;;) {
        const char *end = strchr(c, '/');
        size_t clen = end ? (size_t)(end - c) : strlen(c);
        FZ_ASSERT(clen >= 1 && clen <= 200, "component of %zu bytes in '%s'", clen, path);
        FZ_ASSERT(c[0] != '.', "component starting with '.' in '%s'", path);
        for (size_t i = 0; i < clen; i++)
            FZ_ASSERT(c[i] > 0x20 && c[i] < 0x7F, "byte 0x%02x in '%s'", (unsigned char)c[i],
                      path);
        if (!end) break;
        c = end + 1;
    }
}

/* Encode k (if valid) into *path (malloc'd); 1 if valid. */
static int encode(const kvs_object_key *k, char **path)
{
    char *buf = malloc(KVS_FS_KEY_PATH_MAX);
    FZ_ASSERT(buf, "out of memory");
    int rc = kvs_fs_key_path(k, buf, KVS_FS_KEY_PATH_MAX);
    int valid = kvs_object_key_validate(k) == KVS_OK;
    if (!valid) {
        FZ_ASSERT(rc == KVS_EINVAL, "invalid key accepted (rc %d): '%s'", rc,
                  rc == KVS_OK ? buf : "");
        FZ_ASSERT_REFUSAL(rc, "kvs_fs_key_path");
        free(buf);
        *path = NULL;
        return 0;
    }
    FZ_ASSERT(rc == KVS_OK, "valid key refused: %d", rc);
    check_path(buf);

    /* Exact-size buffers: enough, and one byte short. */
    size_t len = strlen(buf);
    char *exact = malloc(len + 1);
    FZ_ASSERT(exact, "out of memory");
    FZ_ASSERT(kvs_fs_key_path(k, exact, len + 1) == KVS_OK && strcmp(exact, buf) == 0,
              "exact-size buffer");
    free(exact);
    char *shorter = malloc(len);
    FZ_ASSERT(shorter, "out of memory");
    rc = kvs_fs_key_path(k, shorter, len);
    FZ_ASSERT(rc == KVS_ENOSPC && shorter[0] == '\0', "short buffer: rc %d", rc);
    free(shorter);

    kvs_object_key back;
    rc = kvs_fs_path_key(buf, &back);
    FZ_ASSERT(rc == KVS_OK, "path '%s' of a valid key does not decode: %d", buf, rc);
    FZ_ASSERT(kvs_object_key_equal(k, &back), "decode(encode(k)) != k for '%s'", buf);
    *path = buf;
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    kvs_object_key k1, k2;
    read_key(&in, &k1);
    uint8_t mode = fz_u8(&in);
    if (mode & 1) {
        /* k2 = k1 with one field changed: the hard case for injectivity. */
        k2 = k1;
        switch ((mode >> 1) % 5) {
        case 0: k2.chunk_hash[fz_u8(&in) % KVS_CHUNK_HASH_MAX] ^= fz_u8(&in) | 1; break;
        case 1: k2.chunk_hash_len = fz_u8(&in) % (KVS_CHUNK_HASH_MAX + 1); break;
        case 2: k2.model_name[fz_u8(&in) % KVS_MODEL_NAME_MAX] = (char)fz_u8(&in); break;
        case 3: k2.cache_salt[fz_u8(&in) % KVS_CACHE_SALT_MAX] = (char)fz_u8(&in); break;
        default: k2.kv_rank = (int64_t)((uint64_t)k2.kv_rank + (uint64_t)(int8_t)fz_u8(&in)); break;
        }
    } else {
        read_key(&in, &k2);
    }
    char *p1 = NULL, *p2 = NULL;
    int v1 = encode(&k1, &p1), v2 = encode(&k2, &p2);
    if (v1 && v2) {
        int same = kvs_object_key_equal(&k1, &k2);
        FZ_ASSERT(same == (strcmp(p1, p2) == 0), "keys %s but paths '%s' and '%s'",
                  same ? "equal" : "differ", p1, p2);
        size_t l1 = strlen(p1), l2 = strlen(p2);
        FZ_ASSERT(!(l1 < l2 && strncmp(p1, p2, l1) == 0 && p2[l1] == '/'),
                  "key file '%s' is a directory of '%s'", p1, p2);
        FZ_ASSERT(!(l2 < l1 && strncmp(p2, p1, l2) == 0 && p1[l2] == '/'),
                  "key file '%s' is a directory of '%s'", p2, p1);
    }
    free(p1);
    free(p2);

    /* The rest as a path: accepted only if canonical. */
    size_t n = 0;
    uint8_t *rest = fz_rest_copy(&in, &n);
    char *text = malloc(n + 1);
    FZ_ASSERT(text, "out of memory");
    memcpy(text, rest, n);
    text[n] = '\0';
    kvs_object_key k3;
    int rc = kvs_fs_path_key(text, &k3);
    if (rc == KVS_OK) {
        char *again = NULL;
        FZ_ASSERT(encode(&k3, &again), "path_key gave an invalid key for '%s'", text);
        FZ_ASSERT(strcmp(again, text) == 0, "'%s' decodes to a key that encodes to '%s'", text,
                  again);
        free(again);
    } else {
        FZ_ASSERT_REFUSAL(rc, "kvs_fs_path_key");
    }
    free(text);
    free(rest);
    return 0;
}
