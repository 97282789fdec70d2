/* stage_ggml.c - the "ggml_q8_0" and "ggml_q4_0" typed stages: llama.cpp's
 * blocks, the same bytes the plain ggml serdes write (ggml.h). The block
 * type is the stage id, so the stages record no parameters. Stateless: one
 * shared instance per type. */
#include "codecs/ggml_kernels.h"
#include "frame/stage.h"
#include "kvserde/error.h"
#include "kvserde/registry.h"

static kvs_stage q8_0_instance = {&kvs_stage_ggml_q8_0_type};
static kvs_stage q4_0_instance = {&kvs_stage_ggml_q4_0_type};

static kvs_ggml_type type_of(const kvs_stage *self)
{
    return self->type == &kvs_stage_ggml_q8_0_type ? KVS_GGML_Q8_0 : KVS_GGML_Q4_0;
}

static int create(const json_t *config, kvs_stage *instance, kvs_stage **out)
{
    static const char *const known[] = {"type", NULL};
    int rc = kvs_json_check_keys(config, instance->type->name, "member", known);
    if (rc) return rc;
    *out = instance;
    return KVS_OK;
}

static int q8_0_create(const json_t *config, kvs_stage **out)
{
    return create(config, &q8_0_instance, out);
}

static int q4_0_create(const json_t *config, kvs_stage **out)
{
    return create(config, &q4_0_instance, out);
}

static int ggml_bound(const kvs_stage *self, const kvs_layout *layout, size_t *nbytes)
{
    int rc = kvs_ggml_check_layout(type_of(self), layout, "source");
    if (rc) return rc;
    *nbytes = (size_t)kvs_ggml_nbytes(type_of(self), layout);
    return KVS_OK;
}

static int ggml_encode(const kvs_stage *self, const kvs_memobj *src, uint8_t *out, size_t cap,
                       size_t *n)
{
    return kvs_ggml_encode_object(type_of(self), src, out, cap, n);
}

static int q8_0_decode(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                       const uint8_t *in, size_t n, kvs_memobj *dst)
{
    (void)ctx;
    (void)params;
    (void)nparams; /* checked by check_params when the frame was parsed */
    return kvs_ggml_decode_object(KVS_GGML_Q8_0, in, n, dst);
}

static int q4_0_decode(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                       const uint8_t *in, size_t n, kvs_memobj *dst)
{
    (void)ctx;
    (void)params;
    (void)nparams;
    return kvs_ggml_decode_object(KVS_GGML_Q4_0, in, n, dst);
}

static int check_params(kvs_ggml_type type, size_t nparams)
{
    if (nparams != 0)
        return kvs_set_error(KVS_ECORRUPT, "%s: %zu parameter bytes in the frame, expected 0",
                             kvs_ggml_type_name(type), nparams);
    return KVS_OK;
}

static int q8_0_check_params(const uint8_t *params, size_t nparams)
{
    (void)params;
    return check_params(KVS_GGML_Q8_0, nparams);
}

static int q4_0_check_params(const uint8_t *params, size_t nparams)
{
    (void)params;
    return check_params(KVS_GGML_Q4_0, nparams);
}

static void shared_destroy(kvs_stage *self)
{
    (void)self; /* the shared instances are static */
}

const kvs_stage_type kvs_stage_ggml_q8_0_type = {
    .name = "ggml_q8_0",
    .id = KVS_STAGE_GGML_Q8_0,
    .kind = KVS_STAGE_TYPED,
    .create = q8_0_create,
    .typed_bound = ggml_bound,
    .typed_encode = ggml_encode,
    .typed_decode = q8_0_decode,
    .params_size = kvs_stage_no_params_size,
    .write_params = kvs_stage_no_params_write,
    .check_params = q8_0_check_params,
    .describe_params = kvs_stage_no_params_describe,
    .destroy = shared_destroy,
};

const kvs_stage_type kvs_stage_ggml_q4_0_type = {
    .name = "ggml_q4_0",
    .id = KVS_STAGE_GGML_Q4_0,
    .kind = KVS_STAGE_TYPED,
    .create = q4_0_create,
    .typed_bound = ggml_bound,
    .typed_encode = ggml_encode,
    .typed_decode = q4_0_decode,
    .params_size = kvs_stage_no_params_size,
    .write_params = kvs_stage_no_params_write,
    .check_params = q4_0_check_params,
    .describe_params = kvs_stage_no_params_describe,
    .destroy = shared_destroy,
};
