/* stage_check.c - the checksum stages: "crc32c" (CRC-32C, 4 bytes, the
 * SSE4.2 code of util/crc32c.c) and "xxh3" (XXH3-64, 8 bytes, Debian's
 * libxxhash). Each appends the digest of the bytes before it, little-endian;
 * decoding recomputes it and refuses a mismatch. Neither has parameters.
 * The digests stream, so the pipeline computes them block by block while the
 * typed stage's output is still in cache. */
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "frame/stage.h"
#include "kvserde/error.h"
#include "kvserde/registry.h"
#include "util/crc32c.h"

static kvs_stage crc32c_instance = {&kvs_stage_crc32c_type};
static kvs_stage xxh3_instance = {&kvs_stage_xxh3_type};

static int check_create(const json_t *config, const char *name, kvs_stage *instance,
                        kvs_stage **out)
{
    static const char *const known[] = {"type", NULL};
    int rc = kvs_json_check_keys(config, name, "member", known);
    if (rc) return rc;
    *out = instance; /* stateless: one shared instance */
    return KVS_OK;
}

static int crc32c_create(const json_t *config, kvs_stage **out)
{
    return check_create(config, "crc32c", &crc32c_instance, out);
}

static int xxh3_create(const json_t *config, kvs_stage **out)
{
    return check_create(config, "xxh3", &xxh3_instance, out);
}

static size_t crc32c_bound(const kvs_stage *self, size_t n)
{
    (void)self;
    return n + 4;
}

static size_t xxh3_bound(const kvs_stage *self, size_t n)
{
    (void)self;
    return n + 8;
}

/* ---- CRC-32C: the running value is the state ------------------------- */

static void crc32c_put(uint32_t c, uint8_t *digest)
{
    for (int i = 0; i < 4; i++) digest[i] = (uint8_t)(c >> (8 * i));
}

static void crc32c_digest(const uint8_t *in, size_t n, uint8_t *digest)
{
    crc32c_put(kvs_crc32c(0, in, n), digest);
}

static int crc32c_stream_new(void **state)
{
    uint32_t *c = malloc(sizeof *c);
    if (c == NULL) return kvs_set_error(KVS_ENOMEM, "crc32c: out of memory");
    *c = 0;
    *state = c;
    return KVS_OK;
}

static void crc32c_stream_update(void *state, const uint8_t *in, size_t n)
{
    uint32_t *c = state;
    *c = kvs_crc32c(*c, in, n);
}

static void crc32c_stream_append(void *state, uint32_t crc, size_t n)
{
    uint32_t *c = state;
    *c = kvs_crc32c_combine(*c, crc, n);
}

static void crc32c_stream_final(void *state, uint8_t *digest)
{
    crc32c_put(*(uint32_t *)state, digest);
    free(state);
}

/* ---- XXH3-64 --------------------------------------------------------- */

static void xxh3_put(XXH64_hash_t h, uint8_t *digest)
{
    for (int i = 0; i < 8; i++) digest[i] = (uint8_t)(h >> (8 * i));
}

static void xxh3_digest(const uint8_t *in, size_t n, uint8_t *digest)
{
    xxh3_put(XXH3_64bits(in, n), digest);
}

static int xxh3_stream_new(void **state)
{
    XXH3_state_t *st = XXH3_createState();
    if (st == NULL || XXH3_64bits_reset(st) != XXH_OK) {
        XXH3_freeState(st);
        return kvs_set_error(KVS_ENOMEM, "xxh3: out of memory");
    }
    *state = st;
    return KVS_OK;
}

static void xxh3_stream_update(void *state, const uint8_t *in, size_t n)
{
    (void)XXH3_64bits_update(state, in, n); /* fails only for a NULL state */
}

static void xxh3_stream_final(void *state, uint8_t *digest)
{
    xxh3_put(XXH3_64bits_digest(state), digest);
    XXH3_freeState(state);
}

/* ---- shared ---------------------------------------------------------- */

static int crc32c_check_params(const uint8_t *params, size_t nparams)
{
    (void)params;
    if (nparams == 0) return KVS_OK;
    return kvs_set_error(KVS_ECORRUPT, "crc32c: %zu parameter bytes in the frame, expected 0",
                         nparams);
}

static int xxh3_check_params(const uint8_t *params, size_t nparams)
{
    (void)params;
    if (nparams == 0) return KVS_OK;
    return kvs_set_error(KVS_ECORRUPT, "xxh3: %zu parameter bytes in the frame, expected 0",
                         nparams);
}

static void shared_destroy(kvs_stage *self)
{
    (void)self; /* the shared instances are static */
}

#define CHECK_STAGE(NAME, ID, SIZE, APPEND_CRC32C)                                      \
    const kvs_stage_type kvs_stage_##NAME##_type = {                                   \
        .name = #NAME,                                                                 \
        .id = ID,                                                                      \
        .kind = KVS_STAGE_CHECK,                                                       \
        .create = NAME##_create,                                                       \
        .bytes_bound = NAME##_bound,                                                   \
        .digest_size = SIZE,                                                           \
        .check_digest = NAME##_digest,                                                 \
        .check_stream_new = NAME##_stream_new,                                         \
        .check_stream_update = NAME##_stream_update,                                   \
        .check_stream_final = NAME##_stream_final,                                     \
        .check_stream_append_crc32c = APPEND_CRC32C,                                   \
        .params_size = kvs_stage_no_params_size,                                                 \
        .write_params = kvs_stage_no_params_write,                                               \
        .check_params = NAME##_check_params,                                           \
        .describe_params = kvs_stage_no_params_describe,                                         \
        .destroy = shared_destroy,                                                     \
    };

CHECK_STAGE(crc32c, KVS_STAGE_CRC32C, 4, crc32c_stream_append)
CHECK_STAGE(xxh3, KVS_STAGE_XXH3, 8, NULL) /* no combine: fed in order only */
