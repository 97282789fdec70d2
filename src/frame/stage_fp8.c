/* stage_fp8.c - the "fp8" typed stage: one fp8 code per element, the same
 * bytes the plain fp8 serde writes (fp8.h), with the fp8 format and the
 * saturation mode recorded in the frame so a reader needs no configuration.
 * Parameters: fp8 dtype (u8: 4 float8_e4m3fn, 5 float8_e5m2), saturate (u8
 * 0 or 1). */
#include <stdlib.h>

#include "codecs/fp8_kernels.h"
#include "frame/stage.h"
#include "kvserde/error.h"
#include "kvserde/registry.h"

typedef struct fp8_stage {
    kvs_stage base;
    kvs_dtype fp8_dtype;
    int saturate;
} fp8_stage;

static int fp8_create(const json_t *config, kvs_stage **out)
{
    static const char *const known[] = {"type", "fp8_dtype", "saturate", NULL};
    static const char *const dtypes[] = {"float8_e4m3fn", "float8_e5m2", NULL};
    int dtype_index, saturate;
    int rc = kvs_json_check_keys(config, "fp8", "member", known);
    if (rc == KVS_OK)
        rc = kvs_kwargs_get_choice(config, "fp8", "fp8_dtype", dtypes, 0, &dtype_index);
    if (rc == KVS_OK) rc = kvs_kwargs_get_bool(config, "fp8", "saturate", 1, &saturate);
    if (rc) return rc;
    fp8_stage *s = calloc(1, sizeof *s);
    if (s == NULL) return kvs_set_error(KVS_ENOMEM, "fp8: out of memory creating the stage");
    s->base.type = &kvs_stage_fp8_type;
    s->fp8_dtype = dtype_index == 0 ? KVS_DTYPE_FLOAT8_E4M3FN : KVS_DTYPE_FLOAT8_E5M2;
    s->saturate = saturate;
    *out = &s->base;
    return KVS_OK;
}

static int fp8_bound(const kvs_stage *self, const kvs_layout *layout, size_t *nbytes)
{
    (void)self;
    int rc = kvs_fp8_check_layout(layout, "source");
    if (rc) return rc;
    *nbytes = (size_t)kvs_layout_numel(layout);
    return KVS_OK;
}

static int fp8_encode(const kvs_stage *self, const kvs_memobj *src, uint8_t *out, size_t cap,
                      size_t *n)
{
    const fp8_stage *s = KVS_CONTAINER_OF(self, const fp8_stage, base);
    size_t need = (size_t)kvs_layout_numel(&src->layout);
    if (cap < need)
        return kvs_set_error(KVS_ENOSPC, "fp8: destination too small: %zu bytes, need %zu", cap,
                             need);
    int rc = kvs_fp8_kernels_ready(&src->layout);
    if (rc == KVS_OK) rc = kvs_fp8_convert_all(src, out, s->fp8_dtype, s->saturate, 0);
    if (rc == KVS_OK) *n = need;
    return rc;
}

static int fp8_encode_range(const kvs_stage *self, const kvs_memobj *src, uint8_t *out,
                            uint64_t begin, uint64_t end)
{
    const fp8_stage *s = KVS_CONTAINER_OF(self, const fp8_stage, base);
    return kvs_fp8_convert_range(src, out, NULL, s->fp8_dtype, s->saturate, 0, begin, end);
}

static int fp8_encode_range_copy(const kvs_stage *self, const kvs_memobj *src, uint8_t *out,
                                 uint8_t *copy, uint64_t begin, uint64_t end)
{
    const fp8_stage *s = KVS_CONTAINER_OF(self, const fp8_stage, base);
    return kvs_fp8_convert_range(src, out, copy, s->fp8_dtype, s->saturate, 0, begin, end);
}

static int fp8_decode(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                      const uint8_t *in, size_t n, kvs_memobj *dst)
{
    (void)ctx;
    (void)nparams; /* checked by fp8_check_params when the frame was parsed */
    int rc = kvs_fp8_check_layout(&dst->layout, "destination");
    if (rc) return rc;
    size_t need = (size_t)kvs_layout_numel(&dst->layout);
    if (n != need)
        return kvs_set_error(KVS_ECORRUPT,
                             "fp8: stored object is %zu bytes, destination layout needs %zu",
                             n, need);
    if (dst->capacity < kvs_layout_nbytes(&dst->layout))
        return kvs_set_error(KVS_ENOSPC, "fp8: destination holds %zu bytes, need %llu",
                             dst->capacity,
                             (unsigned long long)kvs_layout_nbytes(&dst->layout));
    rc = kvs_fp8_kernels_ready(&dst->layout);
    if (rc) return rc;
    return kvs_fp8_convert_all(dst, (uint8_t *)in, (kvs_dtype)params[0], 0, 1);
}

static size_t fp8_params_size(const kvs_stage *self)
{
    (void)self;
    return 2;
}

static int fp8_write_params(const kvs_stage *self, uint8_t *params)
{
    const fp8_stage *s = KVS_CONTAINER_OF(self, const fp8_stage, base);
    params[0] = (uint8_t)s->fp8_dtype;
    params[1] = (uint8_t)s->saturate;
    return KVS_OK;
}

static int fp8_check_params(const uint8_t *params, size_t nparams)
{
    if (nparams != 2)
        return kvs_set_error(KVS_ECORRUPT, "fp8: %zu parameter bytes in the frame, expected 2",
                             nparams);
    if (params[0] != KVS_DTYPE_FLOAT8_E4M3FN && params[0] != KVS_DTYPE_FLOAT8_E5M2)
        return kvs_set_error(KVS_ECORRUPT, "fp8: frame names fp8 dtype %u, expected %d or %d",
                             params[0], KVS_DTYPE_FLOAT8_E4M3FN, KVS_DTYPE_FLOAT8_E5M2);
    if (params[1] > 1)
        return kvs_set_error(KVS_ECORRUPT, "fp8: frame saturate flag is %u, expected 0 or 1",
                             params[1]);
    return KVS_OK;
}

static json_t *fp8_describe(const uint8_t *params, size_t nparams)
{
    (void)nparams;
    return json_pack("{s:s,s:b}", "fp8_dtype", kvs_dtype_name((kvs_dtype)params[0]),
                     "saturate", params[1]);
}

static void fp8_destroy(kvs_stage *self)
{
    free(KVS_CONTAINER_OF(self, fp8_stage, base));
}

const kvs_stage_type kvs_stage_fp8_type = {
    .name = "fp8",
    .id = KVS_STAGE_FP8,
    .kind = KVS_STAGE_TYPED,
    .create = fp8_create,
    .typed_bound = fp8_bound,
    .typed_encode = fp8_encode,
    .typed_encode_range = fp8_encode_range,
    .typed_encode_range_copy = fp8_encode_range_copy,
    .typed_decode = fp8_decode,
    .params_size = fp8_params_size,
    .write_params = fp8_write_params,
    .check_params = fp8_check_params,
    .describe_params = fp8_describe,
    .destroy = fp8_destroy,
};
