/* fp8_serde.c - the fp8 serde (upstream fp8.py): each group of the source
 * object cast to one fp8 byte per element, packed back to back, no header,
 * so the stored bytes are exactly upstream's. Large objects may be converted
 * by several of the processor's workers at once (kvs_serde_parallel_for). */
#include <stdint.h>
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
int kvs_fp8_check_layout(const kvs_layout *layout, const char *role)
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

/* The last check before converting: the kernels can run (KVSERDE_ISA may
 * name a variant this CPU lacks). The first group's conversion would report
 * exactly this; checking it up front means that once it passes, no range
 * can fail, split or not. */
int kvs_fp8_kernels_ready(const kvs_layout *layout)
{
    const kvs_fp8_kernels *k;
    return layout->ngroups > 0 ? kvs_fp8_kernels_get(&k) : KVS_OK;
}

/* ---------------------------------------------------------------------
 * Element ranges. fp8 maps source element i (counting through the groups in
 * order) to byte i of the blob, and each byte depends on its element alone,
 * so any range of elements can be converted on its own: the serde hands the
 * conversion to kvs_serde_parallel_for, which may spread one large object
 * over the processor's idle workers. The bytes cannot depend on the split.
 * ------------------------------------------------------------------ */

typedef struct fp8_range_job {
    const kvs_memobj *wide;  /* the KV-shaped object: source or destination */
    uint8_t *codes;          /* the blob: one byte per element */
    uint8_t *copy;           /* NULL, or encoded codes also here, from copy_first */
    uint64_t copy_first;
    kvs_dtype fp8_dtype;
    int saturate;
    int decode;              /* 0: wide -> codes, 1: codes -> wide */
    uint64_t first[KVS_MAX_GROUPS + 1]; /* element index where group g starts */
} fp8_range_job;

static void range_job_init(fp8_range_job *j, const kvs_memobj *wide, uint8_t *codes,
                           kvs_dtype fp8_dtype, int saturate, int decode)
{
    j->wide = wide;
    j->codes = codes;
    j->copy = NULL;
    j->copy_first = 0;
    j->fp8_dtype = fp8_dtype;
    j->saturate = saturate;
    j->decode = decode;
    j->first[0] = 0;
    for (uint32_t g = 0; g < wide->layout.ngroups; g++)
        j->first[g + 1] = j->first[g] + kvs_layout_group_numel(&wide->layout, g);
}

/* Convert elements [begin, end): the part of each group that overlaps. */
static int fp8_range(void *ctx, uint64_t begin, uint64_t end)
{
    const fp8_range_job *j = ctx;
    const kvs_layout *layout = &j->wide->layout;
    for (uint32_t g = 0; g < layout->ngroups && begin < end; g++) {
        if (j->first[g + 1] <= begin) continue;
        uint64_t stop = end < j->first[g + 1] ? end : j->first[g + 1];
        kvs_dtype dt = layout->groups[g].dtype;
        uint8_t *wide = (uint8_t *)kvs_memobj_group_data(j->wide, g) +
                        (begin - j->first[g]) * kvs_dtype_size(dt);
        size_t n = (size_t)(stop - begin);
        int rc = j->decode ? kvs_fp8_decode(j->codes + begin, j->fp8_dtype, wide, dt, n)
                 : j->copy ? kvs_fp8_encode_copy(wide, dt, j->codes + begin,
                                                 j->copy + (begin - j->copy_first),
                                                 j->fp8_dtype, j->saturate, n)
                           : kvs_fp8_encode(wide, dt, j->codes + begin, j->fp8_dtype,
                                            j->saturate, n);
        if (rc) return rc;
        begin = stop;
    }
    return KVS_OK;
}

/* The key is not used: plain fp8 writes upstream's bytes, which carry no
 * binding to a key (a framed pipeline adds one). */
static int fp8_serialize(kvs_serializer *s, const kvs_memobj *src, kvs_memobj *dst,
                         const kvs_object_key *key, size_t *nwritten)
{
    (void)key;
    fp8_serializer *self = KVS_CONTAINER_OF(s, fp8_serializer, base);
    int rc = kvs_fp8_check_layout(&src->layout, "source");
    if (rc) return rc;
    uint64_t total = kvs_layout_numel(&src->layout);
    if (dst->capacity < total)
        return kvs_set_error(KVS_ENOSPC, "fp8: destination too small: %zu bytes, need %llu",
                             dst->capacity, (unsigned long long)total);
    rc = kvs_fp8_kernels_ready(&src->layout);
    if (rc) return rc;
    /* Everything that can be refused has been: the ranges only convert. */
    rc = kvs_fp8_convert_all(src, dst->data, self->fp8_dtype, self->saturate, 0);
    if (rc) return rc;
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

int kvs_fp8_convert_range(const kvs_memobj *wide, uint8_t *codes, uint8_t *copy,
                          kvs_dtype fp8_dtype, int saturate, int decode, uint64_t begin,
                          uint64_t end)
{
    fp8_range_job job;
    range_job_init(&job, wide, codes, fp8_dtype, saturate, decode);
    job.copy = decode ? NULL : copy;
    job.copy_first = begin;
    return fp8_range(&job, begin, end);
}

int kvs_fp8_convert_all(const kvs_memobj *wide, uint8_t *codes, kvs_dtype fp8_dtype,
                        int saturate, int decode)
{
    fp8_range_job job;
    range_job_init(&job, wide, codes, fp8_dtype, saturate, decode);
    return kvs_serde_parallel_for(kvs_layout_numel(&wide->layout),
                                  kvs_layout_nbytes(&wide->layout), fp8_range, &job);
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

static int fp8_deserialize(kvs_deserializer *d, const kvs_memobj *src, kvs_memobj *dst,
                           const kvs_object_key *key)
{
    (void)key;
    fp8_deserializer *self = KVS_CONTAINER_OF(d, fp8_deserializer, base);
    int rc = kvs_fp8_check_layout(&dst->layout, "destination");
    if (rc) return rc;
    uint64_t total = kvs_layout_numel(&dst->layout);
    if (src->used_size != total) /* one byte per element: no more, no fewer */
        return kvs_set_error(KVS_ECORRUPT,
                             "fp8: stored object is %zu bytes, destination layout needs %llu",
                             src->used_size, (unsigned long long)total);
    rc = kvs_fp8_kernels_ready(&dst->layout);
    if (rc) return rc;
    return kvs_fp8_convert_all(dst, src->data, self->fp8_dtype, 0, 1);
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
