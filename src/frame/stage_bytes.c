/* stage_bytes.c - the "bytes" typed stage: the tensor's own bytes, groups
 * back to back, unchanged. The lossless path: a pipeline of bytes + a check
 * stores the exact tensor, verified; compression stages work on it. */
#include <string.h>

#include "frame/stage.h"
#include "kvserde/error.h"
#include "kvserde/registry.h"

static kvs_stage bytes_instance = {&kvs_stage_bytes_type};

static int bytes_create(const json_t *config, kvs_stage **out)
{
    static const char *const known[] = {"type", NULL};
    int rc = kvs_json_check_keys(config, "bytes", "member", known);
    if (rc) return rc;
    *out = &bytes_instance; /* stateless: one shared instance */
    return KVS_OK;
}

static int bytes_bound(const kvs_stage *self, const kvs_layout *layout, size_t *nbytes)
{
    (void)self;
    int rc = kvs_layout_validate(layout);
    if (rc) return rc;
    *nbytes = (size_t)kvs_layout_nbytes(layout);
    return KVS_OK;
}

static int bytes_encode(const kvs_stage *self, const kvs_memobj *src, uint8_t *out, size_t cap,
                        size_t *n)
{
    (void)self;
    size_t need = (size_t)kvs_layout_nbytes(&src->layout);
    if (cap < need)
        return kvs_set_error(KVS_ENOSPC, "bytes: destination too small: %zu bytes, need %zu",
                             cap, need);
    if (need) memcpy(out, src->data, need);
    *n = need;
    return KVS_OK;
}

static int bytes_encode_range(const kvs_stage *self, const kvs_memobj *src, uint8_t *out,
                              uint64_t begin, uint64_t end)
{
    (void)self;
    memcpy(out + begin, (const uint8_t *)src->data + begin, (size_t)(end - begin));
    return KVS_OK;
}

static const uint8_t *bytes_view(const kvs_stage *self, const kvs_memobj *src, size_t *n)
{
    (void)self;
    *n = (size_t)kvs_layout_nbytes(&src->layout);
    return src->data;
}

static int bytes_decode(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                      const uint8_t *in, size_t n, kvs_memobj *dst)
{
    (void)ctx;
    (void)params;
    (void)nparams;
    size_t need = (size_t)kvs_layout_nbytes(&dst->layout);
    if (n != need)
        return kvs_set_error(KVS_ECORRUPT,
                             "bytes: stored object is %zu bytes, destination layout needs %zu",
                             n, need);
    if (dst->capacity < need)
        return kvs_set_error(KVS_ENOSPC, "bytes: destination holds %zu bytes, need %zu",
                             dst->capacity, need);
    if (need) memcpy(dst->data, in, need);
    return KVS_OK;
}

static uint8_t *bytes_target(const uint8_t *params, size_t nparams, size_t n, kvs_memobj *dst)
{
    (void)params;
    size_t need = (size_t)kvs_layout_nbytes(&dst->layout);
    /* bytes_decode's checks (nparams: check_params refused others) */
    if (nparams != 0 || n != need || dst->capacity < need || need == 0) return NULL;
    return dst->data;
}

static int bytes_check_params(const uint8_t *params, size_t nparams)
{
    (void)params;
    if (nparams != 0)
        return kvs_set_error(KVS_ECORRUPT, "bytes: %zu parameter bytes in the frame, expected 0",
                             nparams);
    return KVS_OK;
}

static void bytes_destroy(kvs_stage *self)
{
    (void)self; /* the shared instance is static */
}

const kvs_stage_type kvs_stage_bytes_type = {
    .name = "bytes",
    .id = KVS_STAGE_BYTES,
    .kind = KVS_STAGE_TYPED,
    .create = bytes_create,
    .typed_bound = bytes_bound,
    .typed_encode = bytes_encode,
    .typed_encode_range = bytes_encode_range,
    .typed_encode_view = bytes_view,
    .typed_decode = bytes_decode,
    .typed_decode_target = bytes_target,
    .params_size = kvs_stage_no_params_size,
    .write_params = kvs_stage_no_params_write,
    .check_params = bytes_check_params,
    .describe_params = kvs_stage_no_params_describe,
    .destroy = bytes_destroy,
};
