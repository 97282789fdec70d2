/* stage_int.c - the "int" typed stage: integer codes of 2 to 8 bits with a
 * scale (and zero point) per group, the quantizer of codecs/intq.h, with
 * every setting recorded in the frame so a reader needs no configuration.
 *
 * Parameters (14 bytes, little-endian): u8 bits, u8 K axis, u8 V axis (0
 * token, 1 channel, 2 tensor), u8 zero point (0/1), u16 K group, u16 V
 * group, u8 scale dtype (2 float16, 1 float32), u8 levels - 1, u16 hadamard (0 or
 * a power of two), u16 K outlier channels. */
#include <stdlib.h>
#include <string.h>

#include "codecs/intq.h"
#include "frame/stage.h"
#include "kvserde/error.h"
#include "kvserde/registry.h"
#include "util/le.h"

#define NPARAMS 14

typedef struct int_stage {
    kvs_stage base;
    kvs_intq_params p;
} int_stage;

static const char *const axis_names[] = {"token", "channel", "tensor", NULL};

/* An integer member from lo to hi, or def when absent. */
static int get_int(const json_t *config, const char *key, long lo, long hi, long def,
                   unsigned *out)
{
    const json_t *v = json_object_get(config, key);
    if (v == NULL) {
        *out = (unsigned)def;
        return KVS_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return kvs_set_error(KVS_EINVAL, "int: \"%s\" must be an integer from %ld to %ld, got %s",
                             key, lo, hi,
                             json_is_integer(v) ? "an out-of-range integer" : kvs_json_type_name(v));
    *out = (unsigned)json_integer_value(v);
    return KVS_OK;
}

static int int_create(const json_t *config, kvs_stage **out)
{
    static const char *const known[] = {"type", "bits", "k_axis", "v_axis", "group",
                                        "k_group", "v_group", "zero_point", "scale_dtype",
                                        "hadamard", "k_outliers", "levels", NULL};
    static const char *const scale_dtypes[] = {"float16", "float32", NULL};
    kvs_intq_params p;
    memset(&p, 0, sizeof p);
    int k_axis, v_axis, zp, sd;
    unsigned group = 0;
    int rc = kvs_json_check_keys(config, "int", "member", known);
    if (rc == KVS_OK) rc = get_int(config, "bits", 2, 8, 4, &p.bits);
    if (rc == KVS_OK)
        rc = kvs_kwargs_get_choice(config, "int", "k_axis", axis_names, KVS_INTQ_CHANNEL, &k_axis);
    if (rc == KVS_OK)
        rc = kvs_kwargs_get_choice(config, "int", "v_axis", axis_names, KVS_INTQ_TOKEN, &v_axis);
    if (rc == KVS_OK) rc = get_int(config, "group", 1, KVS_INTQ_GROUP_MAX, 64, &group);
    if (rc == KVS_OK) rc = get_int(config, "k_group", 1, KVS_INTQ_GROUP_MAX, group, &p.group[0]);
    if (rc == KVS_OK) rc = get_int(config, "v_group", 1, KVS_INTQ_GROUP_MAX, group, &p.group[1]);
    if (rc == KVS_OK) rc = kvs_kwargs_get_bool(config, "int", "zero_point", 1, &zp);
    if (rc == KVS_OK)
        rc = kvs_kwargs_get_choice(config, "int", "scale_dtype", scale_dtypes, 0, &sd);
    if (rc == KVS_OK) rc = get_int(config, "hadamard", 0, KVS_INTQ_HADAMARD_MAX, 0, &p.hadamard);
    if (rc == KVS_OK)
        rc = get_int(config, "k_outliers", 0, KVS_INTQ_OUTLIERS_MAX, 0, &p.k_outliers);
    if (rc == KVS_OK) rc = get_int(config, "levels", 2, 256, zp ? 1 << p.bits : (1 << p.bits) - 1,
                                   &p.levels);
    if (rc) return rc;
    p.axis[0] = (unsigned)k_axis;
    p.axis[1] = (unsigned)v_axis;
    p.zero_point = zp;
    p.scale_dtype = sd == 0 ? KVS_DTYPE_FLOAT16 : KVS_DTYPE_FLOAT32;
    rc = kvs_intq_check(&p, KVS_EINVAL, "int");
    if (rc) return rc;
    int_stage *s = calloc(1, sizeof *s);
    if (s == NULL) return kvs_set_error(KVS_ENOMEM, "int: out of memory creating the stage");
    s->base.type = &kvs_stage_int_type;
    s->p = p;
    *out = &s->base;
    return KVS_OK;
}

static void read_params(const uint8_t *b, kvs_intq_params *p)
{
    p->bits = b[0];
    p->axis[0] = b[1];
    p->axis[1] = b[2];
    p->zero_point = b[3];
    p->group[0] = get_le16(b + 4);
    p->group[1] = get_le16(b + 6);
    p->scale_dtype = (kvs_dtype)b[8];
    p->levels = b[9] + 1u;
    p->hadamard = get_le16(b + 10);
    p->k_outliers = get_le16(b + 12);
}

static int int_bound(const kvs_stage *self, const kvs_layout *layout, size_t *nbytes)
{
    const int_stage *s = KVS_CONTAINER_OF(self, const int_stage, base);
    return kvs_intq_bound(&s->p, layout, nbytes);
}

static int int_encode(const kvs_stage *self, const kvs_memobj *src, uint8_t *out, size_t cap,
                      size_t *n)
{
    const int_stage *s = KVS_CONTAINER_OF(self, const int_stage, base);
    return kvs_intq_encode(&s->p, src, out, cap, n);
}

static int int_encode_check(const kvs_stage *self, const kvs_memobj *src, uint8_t *out,
                            size_t cap, size_t *n, const kvs_stage_type *check, void *state)
{
    const int_stage *s = KVS_CONTAINER_OF(self, const int_stage, base);
    return kvs_intq_encode_fed(&s->p, src, out, cap, n, check->check_stream_update,
                               check->check_stream_append_crc32c, state);
}

static int int_decode(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                      const uint8_t *in, size_t n, kvs_memobj *dst)
{
    (void)ctx;
    (void)nparams; /* checked by int_check_params when the frame was parsed */
    kvs_intq_params p;
    read_params(params, &p);
    return kvs_intq_decode(&p, in, n, dst);
}

static size_t int_params_size(const kvs_stage *self)
{
    (void)self;
    return NPARAMS;
}

static int int_write_params(const kvs_stage *self, uint8_t *b)
{
    const kvs_intq_params *p = &KVS_CONTAINER_OF(self, const int_stage, base)->p;
    b[0] = (uint8_t)p->bits;
    b[1] = (uint8_t)p->axis[0];
    b[2] = (uint8_t)p->axis[1];
    b[3] = (uint8_t)p->zero_point;
    put_le16(b + 4, (uint16_t)p->group[0]);
    put_le16(b + 6, (uint16_t)p->group[1]);
    b[8] = (uint8_t)p->scale_dtype;
    b[9] = (uint8_t)(p->levels - 1);
    put_le16(b + 10, (uint16_t)p->hadamard);
    put_le16(b + 12, (uint16_t)p->k_outliers);
    return KVS_OK;
}

static int int_check_params(const uint8_t *params, size_t nparams)
{
    if (nparams != NPARAMS)
        return kvs_set_error(KVS_ECORRUPT, "int: %zu parameter bytes in the frame, expected %d",
                             nparams, NPARAMS);
    kvs_intq_params p;
    read_params(params, &p);
    return kvs_intq_check(&p, KVS_ECORRUPT, "int: frame");
}

static json_t *int_describe(const uint8_t *params, size_t nparams)
{
    (void)nparams;
    kvs_intq_params p;
    read_params(params, &p);
    return json_pack("{s:i,s:i,s:s,s:s,s:i,s:i,s:b,s:s,s:i,s:i}", "bits", (int)p.bits,
                     "levels", (int)p.levels, "k_axis",
                     axis_names[p.axis[0]], "v_axis", axis_names[p.axis[1]], "k_group",
                     (int)p.group[0], "v_group", (int)p.group[1], "zero_point", p.zero_point,
                     "scale_dtype", kvs_dtype_name(p.scale_dtype), "hadamard", (int)p.hadamard,
                     "k_outliers", (int)p.k_outliers);
}

static void int_destroy(kvs_stage *self)
{
    free(KVS_CONTAINER_OF(self, int_stage, base));
}

const kvs_stage_type kvs_stage_int_type = {
    .name = "int",
    .id = KVS_STAGE_INT,
    .kind = KVS_STAGE_TYPED,
    .create = int_create,
    .typed_bound = int_bound,
    .typed_encode = int_encode,
    .typed_encode_check = int_encode_check,
    .typed_decode = int_decode,
    .params_size = int_params_size,
    .write_params = int_write_params,
    .check_params = int_check_params,
    .describe_params = int_describe,
    .destroy = int_destroy,
};
