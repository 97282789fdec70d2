/* fp8_serde.c - the fp8 serde (upstream fp8.py): each group of the source
 * object cast to one fp8 byte per element, packed back to back, no header,
 * so the stored bytes are exactly upstream's. */
#include <stdlib.h>

#include "codecs/fp8_kernels.h"
#include "kvserde/error.h"
#include "kvserde/fp8.h"
#include "serde/builtins.h"

typedef struct fp8_serializer {
    kvs_serializer base;
    kvs_dtype fp8_dtype;
    int saturate;
} fp8_serializer;

typedef struct fp8_deserializer {
    kvs_deserializer base;
    kvs_dtype fp8_dtype;
} fp8_deserializer;

/* Every group must be a float type the kernels convert; checked for all
 * groups before any byte is written. `role` is "source" or "destination". */
static int check_groups(const kvs_layout *layout, const char *role)
{
    int rc = kvs_layout_validate(layout);
    if (rc) return rc;
    for (uint32_t g = 0; g < layout->ngroups; g++) {
        if (kvs_fp8_wide_index(layout->groups[g].dtype) < 0)
            return kvs_set_error(KVS_EINVAL,
                                 "fp8: unsupported %s dtype '%s' in group %u; expected "
                                 "float32, float16 or bfloat16",
                                 role, kvs_dtype_name(layout->groups[g].dtype), g);
    }
    return KVS_OK;
}

static int fp8_serialize(kvs_serializer *s, const kvs_memobj *src, kvs_memobj *dst,
                         size_t *nwritten)
{
    fp8_serializer *self = KVS_CONTAINER_OF(s, fp8_serializer, base);
    int rc = check_groups(&src->layout, "source");
    if (rc) return rc;
    uint64_t total = kvs_layout_numel(&src->layout);
    if (dst->capacity < total)
        return kvs_set_error(KVS_ENOSPC, "fp8: destination too small: %zu bytes, need %llu",
                             dst->capacity, (unsigned long long)total);
    uint8_t *out = dst->data;
    for (uint32_t g = 0; g < src->layout.ngroups; g++) {
        size_t n = (size_t)kvs_layout_group_numel(&src->layout, g);
        rc = kvs_fp8_encode(kvs_memobj_group_data(src, g), src->layout.groups[g].dtype,
                            out, self->fp8_dtype, self->saturate, n);
        if (rc) return rc;
        out += n;
    }
    *nwritten = (size_t)total;
    return KVS_OK;
}

static int fp8_estimate(const kvs_serializer *s, const kvs_layout *layout,
                        size_t *nbytes)
{
    int rc = kvs_layout_validate(layout);
    if (rc) return rc;
    /* floor(1.5 x elements), the seed's documented estimate (DESIGN.md);
     * elements < 2^63, so this cannot overflow 64 bits. */
    uint64_t numel = kvs_layout_numel(layout);
    *nbytes = (size_t)(numel + numel / 2);
    return KVS_OK;
}

static void fp8_serializer_destroy(kvs_serializer *s)
{
    free(KVS_CONTAINER_OF(s, fp8_serializer, base));
}

static const struct kvs_serializer_ops fp8_serializer_ops = {
    .name = "fp8",
    .serialize = fp8_serialize,
    .estimate_serialized_size = fp8_estimate,
    .destroy = fp8_serializer_destroy,
};

static int fp8_deserialize(kvs_deserializer *d, const kvs_memobj *src, kvs_memobj *dst)
{
    fp8_deserializer *self = KVS_CONTAINER_OF(d, fp8_deserializer, base);
    int rc = check_groups(&dst->layout, "destination");
    if (rc) return rc;
    uint64_t total = kvs_layout_numel(&dst->layout);
    if (src->used_size < total)
        return kvs_set_error(KVS_ECORRUPT, "fp8: source too small: %zu bytes, need %llu",
                             src->used_size, (unsigned long long)total);
    const uint8_t *in = src->data;
    for (uint32_t g = 0; g < dst->layout.ngroups; g++) {
        size_t n = (size_t)kvs_layout_group_numel(&dst->layout, g);
        rc = kvs_fp8_decode(in, self->fp8_dtype, kvs_memobj_group_data(dst, g),
                            dst->layout.groups[g].dtype, n);
        if (rc) return rc;
        in += n;
    }
    return KVS_OK;
}

static void fp8_deserializer_destroy(kvs_deserializer *d)
{
    free(KVS_CONTAINER_OF(d, fp8_deserializer, base));
}

static const struct kvs_deserializer_ops fp8_deserializer_ops = {
    .name = "fp8",
    .deserialize = fp8_deserialize,
    .destroy = fp8_deserializer_destroy,
};

int kvs_fp8_serde_create(kvs_dtype fp8_dtype, int saturate, kvs_serializer **ser,
                         kvs_deserializer **de)
{
    if (kvs_fp8_fmt_index(fp8_dtype) < 0)
        return kvs_set_error(KVS_EINVAL,
                             "fp8: unsupported fp8 dtype '%s'; expected float8_e4m3fn "
                             "or float8_e5m2",
                             kvs_dtype_name(fp8_dtype));
    if (ser == NULL && de == NULL)
        return kvs_set_error(KVS_EINVAL, "fp8: no output requested");
    fp8_serializer *s = NULL;
    fp8_deserializer *d = NULL;
    if (ser && (s = calloc(1, sizeof *s)) == NULL) goto oom;
    if (de && (d = calloc(1, sizeof *d)) == NULL) goto oom;
    if (s) {
        s->base.ops = &fp8_serializer_ops;
        s->fp8_dtype = fp8_dtype;
        s->saturate = saturate != 0;
        *ser = &s->base;
    }
    if (d) {
        d->base.ops = &fp8_deserializer_ops;
        d->fp8_dtype = fp8_dtype;
        *de = &d->base;
    }
    return KVS_OK;
oom:
    free(s);
    free(d);
    return kvs_set_error(KVS_ENOMEM, "fp8: out of memory creating the serde");
}

/* The registry's "fp8" factory. kwargs: fp8_dtype ("float8_e4m3fn" default,
 * "float8_e5m2"), saturate (JSON boolean, default true). */
int kvs_fp8_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out)
{
    static const char *const known[] = {"fp8_dtype", "saturate", NULL};
    static const char *const dtypes[] = {"float8_e4m3fn", "float8_e5m2", NULL};
    int dtype_index, saturate;
    int rc = kvs_kwargs_check_known(kwargs, "fp8", known);
    if (rc == KVS_OK)
        rc = kvs_kwargs_get_choice(kwargs, "fp8", "fp8_dtype", dtypes, 0, &dtype_index);
    if (rc == KVS_OK) rc = kvs_kwargs_get_bool(kwargs, "fp8", "saturate", 1, &saturate);
    if (rc) return rc;
    kvs_dtype fp8 = dtype_index == 0 ? KVS_DTYPE_FLOAT8_E4M3FN : KVS_DTYPE_FLOAT8_E5M2;
    return kvs_fp8_serde_create(fp8, saturate, &out->serializer, &out->deserializer);
}
