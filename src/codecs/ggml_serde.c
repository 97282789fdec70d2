/* ggml_serde.c - the ggml_q8_0 / ggml_q4_0 serdes (include/kvserde/ggml.h):
 * each group of the source quantized into llama.cpp's blocks of 32 along the
 * last axis, packed back to back, no header. Also the choice of kernel
 * variant, the array functions of the public API and the object-level
 * conversion the pipeline's ggml stages share. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/ggml_kernels.h"
#include "codecs/half.h"
#include "kvserde/error.h"
#include "kvserde/registry.h"
#include "serde/builtins.h"

/* The variant follows the fp8 kernels' choice, so one switch (KVSERDE_ISA,
 * kvs_fp8_set_isa) picks the instruction set of every kernel. */
int kvs_ggml_kernels_get(const kvs_ggml_kernels **out)
{
    const kvs_fp8_kernels *fp8;
    int rc = kvs_fp8_kernels_get(&fp8);
    if (rc) return rc;
    const kvs_ggml_kernels *k = NULL;
#if KVS_HAVE_X86
    if (strncmp(fp8->isa, "avx512", 6) == 0) k = kvs_ggml_kernels_avx512(); /* and avx512fp16 */
    if (strcmp(fp8->isa, "avx2") == 0) k = kvs_ggml_kernels_avx2();
#endif
    *out = k ? k : kvs_ggml_kernels_scalar();
    return KVS_OK;
}

size_t kvs_ggml_block_bytes(kvs_ggml_type type)
{
    switch (type) {
    case KVS_GGML_Q8_0: return KVS_GGML_Q8_0_BYTES;
    case KVS_GGML_Q4_0: return KVS_GGML_Q4_0_BYTES;
    default: return 0;
    }
}

const char *kvs_ggml_type_name(kvs_ggml_type type)
{
    switch (type) {
    case KVS_GGML_Q8_0: return "ggml_q8_0";
    case KVS_GGML_Q4_0: return "ggml_q4_0";
    default: return NULL;
    }
}

static int check_type(kvs_ggml_type type)
{
    if (kvs_ggml_block_bytes(type) == 0)
        return kvs_set_error(KVS_EINVAL, "ggml: unknown block type %d; expected %d (q8_0) or %d "
                             "(q4_0)", (int)type, KVS_GGML_Q8_0, KVS_GGML_Q4_0);
    return KVS_OK;
}

/* "nan", "-inf": how a refused element is named. */
static const char *nonfinite_name(float x)
{
    return isnan(x) ? "nan" : x < 0 ? "-inf" : "inf";
}

static float element(const void *src, kvs_dtype dtype, uint64_t i)
{
    const uint8_t *p = (const uint8_t *)src + i * kvs_dtype_size(dtype);
    uint16_t h;
    float f;
    switch (dtype) {
    case KVS_DTYPE_FLOAT32: memcpy(&f, p, 4); return f;
    case KVS_DTYPE_FLOAT16: memcpy(&h, p, 2); return kvs_f16_to_f32(h);
    default: memcpy(&h, p, 2); return kvs_bf16_to_f32(h);
    }
}

/* The first non-finite element of block b of src (there is one). */
static uint64_t first_nonfinite(const void *src, kvs_dtype dtype, uint64_t b)
{
    uint64_t i = b * KVS_GGML_BLOCK;
    while (i + 1 < (b + 1) * KVS_GGML_BLOCK && isfinite(element(src, dtype, i))) i++;
    return i;
}

/* ---- arrays (public API) -------------------------------------------------- */

static int check_array(kvs_ggml_type type, kvs_dtype dtype, const char *role, size_t n)
{
    int rc = check_type(type);
    if (rc) return rc;
    const char *name = kvs_ggml_type_name(type);
    if (kvs_fp8_wide_index(dtype) < 0)
        return kvs_set_error(KVS_EINVAL,
                             "%s: unsupported %s dtype '%s'; expected float32, float16 or "
                             "bfloat16",
                             name, role, kvs_dtype_name(dtype));
    if (n % KVS_GGML_BLOCK)
        return kvs_set_error(KVS_EINVAL, "%s: %zu elements is not a multiple of %d", name, n,
                             KVS_GGML_BLOCK);
    return KVS_OK;
}

int kvs_ggml_encode(const void *src, kvs_dtype src_dtype, uint8_t *dst, kvs_ggml_type type,
                    size_t n)
{
    const kvs_ggml_kernels *k;
    int rc = check_array(type, src_dtype, "source", n);
    if (rc == KVS_OK) rc = kvs_ggml_kernels_get(&k);
    if (rc) return rc;
    size_t nblocks = n / KVS_GGML_BLOCK;
    size_t done = k->encode[type][kvs_fp8_wide_index(src_dtype)](src, dst, nblocks);
    if (done == nblocks) return KVS_OK;
    uint64_t i = first_nonfinite(src, src_dtype, done);
    return kvs_set_error(KVS_EINVAL, "%s: element %llu is %s; ggml blocks need finite values",
                         kvs_ggml_type_name(type), (unsigned long long)i,
                         nonfinite_name(element(src, src_dtype, i)));
}

int kvs_ggml_decode(const uint8_t *src, kvs_ggml_type type, void *dst, kvs_dtype dst_dtype,
                    size_t n)
{
    const kvs_ggml_kernels *k;
    int rc = check_array(type, dst_dtype, "destination", n);
    if (rc == KVS_OK) rc = kvs_ggml_kernels_get(&k);
    if (rc) return rc;
    k->decode[type][kvs_fp8_wide_index(dst_dtype)](src, dst, n / KVS_GGML_BLOCK);
    return KVS_OK;
}

/* ---- objects --------------------------------------------------------------- */

int kvs_ggml_check_layout(kvs_ggml_type type, const kvs_layout *layout, const char *role)
{
    int rc = check_type(type);
    if (rc == KVS_OK) rc = kvs_layout_validate(layout);
    if (rc) return rc;
    const char *name = kvs_ggml_type_name(type);
    for (uint32_t g = 0; g < layout->ngroups; g++) {
        const kvs_group *gr = &layout->groups[g];
        if (kvs_fp8_wide_index(gr->dtype) < 0)
            return kvs_set_error(KVS_EINVAL,
                                 "%s: unsupported %s dtype '%s' in group %u; expected "
                                 "float32, float16 or bfloat16",
                                 name, role, kvs_dtype_name(gr->dtype), g);
        int64_t last = gr->shape.ndim ? gr->shape.dims[gr->shape.ndim - 1] : 1;
        if (gr->shape.ndim == 0 || last % KVS_GGML_BLOCK) {
            char shape[160];
            size_t pos = (size_t)snprintf(shape, sizeof shape, "[");
            for (uint32_t d = 0; d < gr->shape.ndim && pos < sizeof shape; d++)
                pos += (size_t)snprintf(shape + pos, sizeof shape - pos, d ? "x%lld" : "%lld",
                                        (long long)gr->shape.dims[d]);
            if (pos < sizeof shape)
                snprintf(shape + pos, sizeof shape - pos, "%s%s]", gr->shape.ndim ? " " : "",
                         kvs_dtype_name(gr->dtype));
            return kvs_set_error(KVS_EINVAL,
                                 "%s: %s group %u %s: the last dimension %lld is not a "
                                 "multiple of %d (blocks of %d run along it)",
                                 name, role, g, shape, (long long)last, KVS_GGML_BLOCK,
                                 KVS_GGML_BLOCK);
        }
    }
    return KVS_OK;
}

uint64_t kvs_ggml_nbytes(kvs_ggml_type type, const kvs_layout *layout)
{
    /* elements < 2^63 and blocks of 32 elements take at most 34 bytes */
    return kvs_layout_numel(layout) / KVS_GGML_BLOCK * kvs_ggml_block_bytes(type);
}

/* Block ranges. Block i (counting through the groups in order) is bytes
 * [i x block, (i + 1) x block) of the blob and depends on its 32 elements
 * alone, so any range of blocks converts on its own: the conversion goes to
 * kvs_serde_parallel_for, which may spread a large object over the
 * processor's idle workers. */
typedef struct ggml_job {
    const kvs_ggml_kernels *k;
    kvs_ggml_type type;
    const kvs_memobj *wide; /* the KV-shaped object: source or destination */
    uint8_t *blocks;        /* the blob */
    int decode;
    uint64_t first[KVS_MAX_GROUPS + 1]; /* block index where group g starts */
} ggml_job;

static int ggml_range(void *ctx, uint64_t begin, uint64_t end)
{
    const ggml_job *j = ctx;
    const kvs_layout *layout = &j->wide->layout;
    const size_t bb = kvs_ggml_block_bytes(j->type);
    for (uint32_t g = 0; g < layout->ngroups && begin < end; g++) {
        if (j->first[g + 1] <= begin) continue;
        uint64_t stop = end < j->first[g + 1] ? end : j->first[g + 1];
        kvs_dtype dt = layout->groups[g].dtype;
        int w = kvs_fp8_wide_index(dt);
        const uint64_t rel = begin - j->first[g];
        uint8_t *wide = (uint8_t *)kvs_memobj_group_data(j->wide, g) +
                        rel * KVS_GGML_BLOCK * kvs_dtype_size(dt);
        uint8_t *blocks = j->blocks + begin * bb;
        size_t n = (size_t)(stop - begin);
        if (j->decode) {
            j->k->decode[j->type][w](blocks, wide, n);
        } else {
            size_t done = j->k->encode[j->type][w](wide, blocks, n);
            if (done != n) {
                const void *gdata = kvs_memobj_group_data(j->wide, g);
                uint64_t i = first_nonfinite(gdata, dt, rel + done);
                return kvs_set_error(KVS_EINVAL,
                                     "%s: source group %u element %llu is %s; ggml blocks "
                                     "need finite values",
                                     kvs_ggml_type_name(j->type), g, (unsigned long long)i,
                                     nonfinite_name(element(gdata, dt, i)));
            }
        }
        begin = stop;
    }
    return KVS_OK;
}

int kvs_ggml_convert_all(kvs_ggml_type type, const kvs_memobj *wide, uint8_t *blocks,
                         int decode)
{
    ggml_job j = {.type = type, .wide = wide, .blocks = blocks, .decode = decode};
    int rc = wide->layout.ngroups ? kvs_ggml_kernels_get(&j.k) : KVS_OK;
    if (rc) return rc;
    for (uint32_t g = 0; g < wide->layout.ngroups; g++)
        j.first[g + 1] = j.first[g] + kvs_layout_group_numel(&wide->layout, g) / KVS_GGML_BLOCK;
    return kvs_serde_parallel_for(j.first[wide->layout.ngroups], kvs_layout_nbytes(&wide->layout),
                                  ggml_range, &j);
}

int kvs_ggml_encode_object(kvs_ggml_type type, const kvs_memobj *src, uint8_t *out, size_t cap,
                           size_t *n)
{
    int rc = kvs_ggml_check_layout(type, &src->layout, "source");
    if (rc) return rc;
    uint64_t need = kvs_ggml_nbytes(type, &src->layout);
    if (cap < need)
        return kvs_set_error(KVS_ENOSPC, "%s: destination too small: %zu bytes, need %llu",
                             kvs_ggml_type_name(type), cap, (unsigned long long)need);
    rc = kvs_ggml_convert_all(type, src, out, 0);
    if (rc == KVS_OK) *n = (size_t)need;
    return rc;
}

int kvs_ggml_decode_object(kvs_ggml_type type, const uint8_t *in, size_t n, kvs_memobj *dst)
{
    const char *name = kvs_ggml_type_name(type);
    int rc = kvs_ggml_check_layout(type, &dst->layout, "destination");
    if (rc) return rc;
    uint64_t need = kvs_ggml_nbytes(type, &dst->layout);
    if (n != need)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: stored object is %zu bytes, destination layout needs %llu",
                             name, n, (unsigned long long)need);
    if (dst->capacity < kvs_layout_nbytes(&dst->layout))
        return kvs_set_error(KVS_ENOSPC, "%s: destination holds %zu bytes, need %llu", name,
                             dst->capacity, (unsigned long long)kvs_layout_nbytes(&dst->layout));
    return kvs_ggml_convert_all(type, dst, (uint8_t *)(uintptr_t)in, 1);
}

/* ---- the serde -------------------------------------------------------------- */

typedef struct ggml_serializer {
    kvs_serializer base;
    kvs_ggml_type type;
} ggml_serializer;

typedef struct ggml_deserializer {
    kvs_deserializer base;
    kvs_ggml_type type;
} ggml_deserializer;

/* The key is not used: plain blocks are llama.cpp's bytes, bound to no key
 * (a framed pipeline adds the binding). */
static int ggml_serialize(kvs_serializer *s, const kvs_memobj *src, kvs_memobj *dst,
                          const kvs_object_key *key, size_t *nwritten)
{
    (void)key;
    const ggml_serializer *self = KVS_CONTAINER_OF(s, ggml_serializer, base);
    return kvs_ggml_encode_object(self->type, src, dst->data, dst->capacity, nwritten);
}

static int ggml_estimate(const kvs_serializer *s, const kvs_layout *layout, size_t *nbytes)
{
    const ggml_serializer *self = KVS_CONTAINER_OF(s, const ggml_serializer, base);
    int rc = kvs_ggml_check_layout(self->type, layout, "source");
    if (rc) return rc;
    *nbytes = (size_t)kvs_ggml_nbytes(self->type, layout);
    return KVS_OK;
}

static void ggml_serializer_destroy(kvs_serializer *s)
{
    free(KVS_CONTAINER_OF(s, ggml_serializer, base));
}

static const struct kvs_serializer_ops q8_0_serializer_ops = {
    .name = "ggml_q8_0",
    .serialize = ggml_serialize,
    .estimate_serialized_size = ggml_estimate,
    .destroy = ggml_serializer_destroy,
};

static const struct kvs_serializer_ops q4_0_serializer_ops = {
    .name = "ggml_q4_0",
    .serialize = ggml_serialize,
    .estimate_serialized_size = ggml_estimate,
    .destroy = ggml_serializer_destroy,
};

static int ggml_deserialize(kvs_deserializer *d, const kvs_memobj *src, kvs_memobj *dst,
                            const kvs_object_key *key)
{
    (void)key;
    const ggml_deserializer *self = KVS_CONTAINER_OF(d, ggml_deserializer, base);
    return kvs_ggml_decode_object(self->type, src->data, src->used_size, dst);
}

static void ggml_deserializer_destroy(kvs_deserializer *d)
{
    free(KVS_CONTAINER_OF(d, ggml_deserializer, base));
}

static const struct kvs_deserializer_ops q8_0_deserializer_ops = {
    .name = "ggml_q8_0",
    .deserialize = ggml_deserialize,
    .destroy = ggml_deserializer_destroy,
};

static const struct kvs_deserializer_ops q4_0_deserializer_ops = {
    .name = "ggml_q4_0",
    .deserialize = ggml_deserialize,
    .destroy = ggml_deserializer_destroy,
};

int kvs_ggml_serde_create(kvs_ggml_type type, kvs_serializer **ser, kvs_deserializer **de)
{
    int rc = check_type(type);
    if (rc) return rc;
    if (ser == NULL && de == NULL)
        return kvs_set_error(KVS_EINVAL, "%s: no output requested", kvs_ggml_type_name(type));
    ggml_serializer *s = NULL;
    ggml_deserializer *d = NULL;
    if (ser && (s = calloc(1, sizeof *s)) == NULL) goto oom;
    if (de && (d = calloc(1, sizeof *d)) == NULL) goto oom;
    if (s) {
        s->base.ops = type == KVS_GGML_Q8_0 ? &q8_0_serializer_ops : &q4_0_serializer_ops;
        s->type = type;
        *ser = &s->base;
    }
    if (d) {
        d->base.ops = type == KVS_GGML_Q8_0 ? &q8_0_deserializer_ops : &q4_0_deserializer_ops;
        d->type = type;
        *de = &d->base;
    }
    return KVS_OK;
oom:
    free(s);
    free(d);
    return kvs_set_error(KVS_ENOMEM, "%s: out of memory creating the serde",
                         kvs_ggml_type_name(type));
}

/* The registry's "ggml_q8_0" and "ggml_q4_0" factories: no kwargs of their
 * own. */
static int ggml_factory(kvs_ggml_type type, const json_t *kwargs, kvs_serde_pair *out)
{
    static const char *const known[] = {NULL};
    int rc = kvs_kwargs_check_known(kwargs, kvs_ggml_type_name(type), known);
    if (rc) return rc;
    return kvs_ggml_serde_create(type, &out->serializer, &out->deserializer);
}

int kvs_ggml_q8_0_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out)
{
    (void)userdata;
    return ggml_factory(KVS_GGML_Q8_0, kwargs, out);
}

int kvs_ggml_q4_0_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out)
{
    (void)userdata;
    return ggml_factory(KVS_GGML_Q4_0, kwargs, out);
}
