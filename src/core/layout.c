/* layout.c - memory layouts (upstream MemoryLayoutDesc): groups of
 * (shape, dtype) packed back to back. Validation bounds every byte size and
 * every running total below 2^63, so the accessors can do plain arithmetic. */
#include <stdio.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/memobj.h"

#define SIZE_LIMIT ((uint64_t)INT64_MAX)

/* a * b, or 0 with *overflow set if the product exceeds SIZE_LIMIT. */
static uint64_t mul_limited(uint64_t a, uint64_t b, int *overflow)
{
    if (a != 0 && b > SIZE_LIMIT / a) {
        *overflow = 1;
        return 0;
    }
    return a * b;
}

static int check_group(const kvs_shape *shape, int dtype, uint32_t index,
                       uint64_t *nbytes)
{
    if (shape->ndim > KVS_MAX_DIMS)
        return kvs_set_error(KVS_EINVAL, "layout: group %u has %u dims, at most %d",
                             index, shape->ndim, KVS_MAX_DIMS);
    if (!kvs_dtype_valid(dtype))
        return kvs_set_error(KVS_EINVAL, "layout: group %u has invalid dtype %d",
                             index, dtype);
    int overflow = 0, has_zero = 0;
    uint64_t numel = 1;
    for (uint32_t d = 0; d < shape->ndim; d++) {
        if (shape->dims[d] < 0)
            return kvs_set_error(KVS_EINVAL,
                                 "layout: group %u dim %u is negative (%lld)", index,
                                 d, (long long)shape->dims[d]);
        has_zero |= shape->dims[d] == 0;
        numel = mul_limited(numel, (uint64_t)shape->dims[d], &overflow);
    }
    uint64_t bytes = mul_limited(numel, kvs_dtype_size((kvs_dtype)dtype), &overflow);
    /* A zero dim makes the group empty wherever it stands, so products of
     * the dims before it cannot overflow anything real. */
    if (has_zero) bytes = 0, overflow = 0;
    if (overflow)
        return kvs_set_error(KVS_EINVAL, "layout: group %u byte size overflows 2^63",
                             index);
    *nbytes = bytes;
    return KVS_OK;
}

int kvs_layout_validate(const kvs_layout *layout)
{
    if (layout == NULL) return kvs_set_error(KVS_EINVAL, "layout: NULL layout");
    if (layout->ngroups > KVS_MAX_GROUPS)
        return kvs_set_error(KVS_EINVAL, "layout: %u groups, at most %d",
                             layout->ngroups, KVS_MAX_GROUPS);
    uint64_t total = 0;
    for (uint32_t i = 0; i < layout->ngroups; i++) {
        uint64_t bytes = 0;
        int rc = check_group(&layout->groups[i].shape, (int)layout->groups[i].dtype,
                             i, &bytes);
        if (rc) return rc;
        if (bytes > SIZE_LIMIT - total)
            return kvs_set_error(KVS_EINVAL, "layout: total byte size overflows 2^63");
        total += bytes;
    }
    return KVS_OK;
}

int kvs_layout_init(kvs_layout *out, size_t nshapes, const kvs_shape *shapes,
                    size_t ndtypes, const kvs_dtype *dtypes)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "layout: NULL output");
    if (nshapes != ndtypes)
        return kvs_set_error(KVS_EINVAL,
                             "layout: shapes and dtypes must have the same length: "
                             "%zu shapes, %zu dtypes",
                             nshapes, ndtypes);
    if (nshapes > KVS_MAX_GROUPS)
        return kvs_set_error(KVS_EINVAL, "layout: %zu groups, at most %d", nshapes,
                             KVS_MAX_GROUPS);
    if (nshapes > 0 && (shapes == NULL || dtypes == NULL))
        return kvs_set_error(KVS_EINVAL, "layout: NULL shapes or dtypes");
    kvs_layout tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.ngroups = (uint32_t)nshapes;
    for (size_t i = 0; i < nshapes; i++) {
        tmp.groups[i].shape = shapes[i];
        tmp.groups[i].dtype = dtypes[i];
    }
    int rc = kvs_layout_validate(&tmp);
    if (rc) return rc;
    *out = tmp;
    return KVS_OK;
}

int kvs_layout_add_group(kvs_layout *layout, uint32_t ndim, const int64_t *dims,
                         kvs_dtype dtype)
{
    if (layout == NULL) return kvs_set_error(KVS_EINVAL, "layout: NULL layout");
    if (layout->ngroups >= KVS_MAX_GROUPS)
        return kvs_set_error(KVS_EINVAL, "layout: already %u groups, at most %d",
                             layout->ngroups, KVS_MAX_GROUPS);
    if (ndim > KVS_MAX_DIMS)
        return kvs_set_error(KVS_EINVAL, "layout: group %u has %u dims, at most %d",
                             layout->ngroups, ndim, KVS_MAX_DIMS);
    if (ndim > 0 && dims == NULL)
        return kvs_set_error(KVS_EINVAL, "layout: NULL dims");
    kvs_layout tmp = *layout;
    kvs_group *g = &tmp.groups[tmp.ngroups++];
    memset(g, 0, sizeof *g);
    g->shape.ndim = ndim;
    if (ndim) memcpy(g->shape.dims, dims, ndim * sizeof *dims);
    g->dtype = dtype;
    int rc = kvs_layout_validate(&tmp);
    if (rc) return rc;
    *layout = tmp;
    return KVS_OK;
}

int kvs_layout_flat(kvs_layout *out, uint64_t nelems, kvs_dtype dtype)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "layout: NULL output");
    if (nelems > SIZE_LIMIT)
        return kvs_set_error(KVS_EINVAL, "layout: group 0 byte size overflows 2^63");
    kvs_layout tmp;
    memset(&tmp, 0, sizeof tmp);
    int64_t dim = (int64_t)nelems;
    int rc = kvs_layout_add_group(&tmp, 1, &dim, dtype);
    if (rc) return rc;
    *out = tmp;
    return KVS_OK;
}

uint64_t kvs_layout_group_numel(const kvs_layout *layout, uint32_t i)
{
    const kvs_shape *s = &layout->groups[i].shape;
    uint64_t n = 1;
    for (uint32_t d = 0; d < s->ndim; d++) n *= (uint64_t)s->dims[d];
    return n;
}

uint64_t kvs_layout_group_nbytes(const kvs_layout *layout, uint32_t i)
{
    return kvs_layout_group_numel(layout, i) * kvs_dtype_size(layout->groups[i].dtype);
}

uint64_t kvs_layout_group_offset(const kvs_layout *layout, uint32_t i)
{
    uint64_t off = 0;
    for (uint32_t g = 0; g < i; g++) off += kvs_layout_group_nbytes(layout, g);
    return off;
}

uint64_t kvs_layout_numel(const kvs_layout *layout)
{
    uint64_t n = 0;
    for (uint32_t g = 0; g < layout->ngroups; g++) n += kvs_layout_group_numel(layout, g);
    return n;
}

uint64_t kvs_layout_nbytes(const kvs_layout *layout)
{
    return kvs_layout_group_offset(layout, layout->ngroups);
}

int kvs_layout_equal(const kvs_layout *a, const kvs_layout *b)
{
    if (a->ngroups != b->ngroups) return 0;
    for (uint32_t g = 0; g < a->ngroups; g++) {
        const kvs_group *x = &a->groups[g], *y = &b->groups[g];
        if (x->dtype != y->dtype || x->shape.ndim != y->shape.ndim) return 0;
        for (uint32_t d = 0; d < x->shape.ndim; d++)
            if (x->shape.dims[d] != y->shape.dims[d]) return 0;
    }
    return 1;
}

char *kvs_layout_format(const kvs_layout *layout, char *buf, size_t bufsize)
{
    if (buf == NULL || bufsize == 0) return buf;
    size_t len = 0;
    buf[0] = '\0';
#define APPEND(...)                                                          \
    do {                                                                     \
        if (len < bufsize) {                                                 \
            int n_ = snprintf(buf + len, bufsize - len, __VA_ARGS__);        \
            if (n_ > 0) len += (size_t)n_;                                   \
        }                                                                    \
    } while (0)
    APPEND("[");
    for (uint32_t g = 0; layout && g < layout->ngroups && g < KVS_MAX_GROUPS; g++) {
        const kvs_group *grp = &layout->groups[g];
        if (g) APPEND(", ");
        if (grp->shape.ndim == 0) APPEND("scalar");
        for (uint32_t d = 0; d < grp->shape.ndim && d < KVS_MAX_DIMS; d++)
            APPEND(d ? "x%lld" : "%lld", (long long)grp->shape.dims[d]);
        APPEND(" %s", kvs_dtype_name(grp->dtype));
    }
    APPEND("]");
#undef APPEND
    return buf;
}
