/* memobj.c - memory objects (upstream MemoryObj): a buffer, its capacity,
 * the layout of the data in it, and a logical used size. */
#include <stdlib.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/memobj.h"

#define MEMOBJ_ALIGN 64 /* cache line, and the widest SIMD vector */

static int format_valid(int format)
{
    return format >= KVS_FMT_UNDEFINED && format <= KVS_FMT_HS_TD;
}

int kvs_memobj_init(kvs_memobj *obj, void *data, size_t capacity,
                    const kvs_layout *layout, kvs_memory_format format)
{
    if (obj == NULL || layout == NULL)
        return kvs_set_error(KVS_EINVAL, "memobj: NULL argument");
    if (data == NULL && capacity > 0)
        return kvs_set_error(KVS_EINVAL, "memobj: NULL data with capacity %zu",
                             capacity);
    if (!format_valid((int)format))
        return kvs_set_error(KVS_EINVAL, "memobj: unknown memory format %d",
                             (int)format);
    int rc = kvs_layout_validate(layout);
    if (rc) return rc;
    uint64_t need = kvs_layout_nbytes(layout);
    if (need > capacity)
        return kvs_set_error(KVS_ENOSPC,
                             "memobj: capacity %zu bytes is smaller than the layout's "
                             "%llu bytes",
                             capacity, (unsigned long long)need);
    memset(obj, 0, sizeof *obj);
    obj->data = data;
    obj->capacity = capacity;
    obj->used_size = (size_t)need;
    obj->layout = *layout;
    obj->format = format;
    return KVS_OK;
}

int kvs_memobj_alloc(const kvs_layout *layout, kvs_memory_format format,
                     kvs_memobj **out)
{
    if (layout == NULL || out == NULL)
        return kvs_set_error(KVS_EINVAL, "memobj: NULL argument");
    if (!format_valid((int)format))
        return kvs_set_error(KVS_EINVAL, "memobj: unknown memory format %d",
                             (int)format);
    int rc = kvs_layout_validate(layout);
    if (rc) return rc;
    uint64_t need = kvs_layout_nbytes(layout);
    if (need > SIZE_MAX - MEMOBJ_ALIGN)
        return kvs_set_error(KVS_ENOMEM, "memobj: cannot allocate %llu bytes",
                             (unsigned long long)need);
    /* aligned_alloc wants a multiple of the alignment; allocate at least one
     * line so a zero-byte object still has a distinct, freeable buffer. */
    size_t alloc = ((size_t)need + MEMOBJ_ALIGN - 1) / MEMOBJ_ALIGN * MEMOBJ_ALIGN;
    if (alloc == 0) alloc = MEMOBJ_ALIGN;
    kvs_memobj *obj = malloc(sizeof *obj);
    void *data = obj ? aligned_alloc(MEMOBJ_ALIGN, alloc) : NULL;
    if (data == NULL) {
        free(obj);
        return kvs_set_error(KVS_ENOMEM, "memobj: cannot allocate %zu bytes", alloc);
    }
    memset(data, 0, alloc);
    rc = kvs_memobj_init(obj, data, (size_t)need, layout, format);
    if (rc) { /* unreachable: layout and format were checked above */
        free(data);
        free(obj);
        return rc;
    }
    obj->owns_data = 1;
    *out = obj;
    return KVS_OK;
}

void kvs_memobj_free(kvs_memobj *obj)
{
    if (obj == NULL) return;
    if (obj->owns_data) free(obj->data);
    free(obj);
}

int kvs_memobj_set_used_size(kvs_memobj *obj, size_t n)
{
    if (obj == NULL) return kvs_set_error(KVS_EINVAL, "memobj: NULL object");
    if (n > obj->capacity)
        return kvs_set_error(KVS_EINVAL,
                             "memobj: set_used_size: n=%zu out of range [0, %zu]", n,
                             obj->capacity);
    obj->used_size = n;
    return KVS_OK;
}

size_t kvs_memobj_size(const kvs_memobj *obj) { return obj->used_size; }

void *kvs_memobj_group_data(const kvs_memobj *obj, uint32_t i)
{
    return (char *)obj->data + kvs_layout_group_offset(&obj->layout, i);
}

size_t kvs_memobj_group_nbytes(const kvs_memobj *obj, uint32_t i)
{
    return (size_t)kvs_layout_group_nbytes(&obj->layout, i);
}
