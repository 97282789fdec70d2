/* kvserde/memobj.h - memory layouts, memory objects and object keys.
 *
 * These are the C counterparts of upstream LMCache's MemoryLayoutDesc,
 * MemoryObj and ObjectKey. All three are plain value types: a caller may
 * place them on the stack or embed them; nothing here allocates except
 * kvs_memobj_alloc().
 */
#ifndef KVSERDE_MEMOBJ_H
#define KVSERDE_MEMOBJ_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------
 * Layout (upstream MemoryLayoutDesc)
 * ------------------------------------------------------------------ */

#define KVS_MAX_DIMS 8    /* dimensions per group shape */
#define KVS_MAX_GROUPS 16 /* groups per layout */

/* A tensor shape: `ndim` sizes, row-major. ndim == 0 is a scalar (1 element). */
typedef struct kvs_shape {
    uint32_t ndim;
    int64_t dims[KVS_MAX_DIMS];
} kvs_shape;

/* One group: a shape and a dtype. */
typedef struct kvs_group {
    kvs_shape shape;
    kvs_dtype dtype;
} kvs_group;

/* One or more groups packed back to back in list order, no padding: group
 * i starts at the sum of the byte sizes of groups 0..i-1. A layout with zero
 * groups is valid and describes 0 bytes.
 *
 * Build layouts with kvs_layout_init() / kvs_layout_add_group(), which
 * validate them; the accessors below assume a valid layout (one for which
 * kvs_layout_validate() returns KVS_OK). */
typedef struct kvs_layout {
    uint32_t ngroups;
    kvs_group groups[KVS_MAX_GROUPS];
} kvs_layout;

/* Build a layout from parallel lists of shapes and dtypes, as upstream's
 * MemoryLayoutDesc(shapes, dtypes). Refused with KVS_EINVAL when the counts
 * differ ("layout: shapes and dtypes must have the same length: 2 shapes,
 * 1 dtypes"), there are more than
 * KVS_MAX_GROUPS, a shape has more than KVS_MAX_DIMS dims or a negative dim,
 * a dtype is invalid, or a byte size overflows 2^63. *out is untouched on
 * failure. */
KVS_API int kvs_layout_init(kvs_layout *out, size_t nshapes,
                            const kvs_shape *shapes, size_t ndtypes,
                            const kvs_dtype *dtypes);

/* Append one group (shape given as ndim sizes). Same checks as init. */
KVS_API int kvs_layout_add_group(kvs_layout *layout, uint32_t ndim,
                                 const int64_t *dims, kvs_dtype dtype);

/* A one-group, one-dimension layout: [nelems] of dtype. */
KVS_API int kvs_layout_flat(kvs_layout *out, uint64_t nelems, kvs_dtype dtype);

/* KVS_OK if `layout` obeys every rule of kvs_layout_init(), else KVS_EINVAL
 * with the reason. Serdes call this on layouts they are handed. */
KVS_API int kvs_layout_validate(const kvs_layout *layout);

/* Element count and byte size of group i (i < ngroups). */
KVS_API uint64_t kvs_layout_group_numel(const kvs_layout *layout, uint32_t i);
KVS_API uint64_t kvs_layout_group_nbytes(const kvs_layout *layout, uint32_t i);
/* Byte offset of group i from the start of the object. */
KVS_API uint64_t kvs_layout_group_offset(const kvs_layout *layout, uint32_t i);
/* Totals over all groups. */
KVS_API uint64_t kvs_layout_numel(const kvs_layout *layout);
KVS_API uint64_t kvs_layout_nbytes(const kvs_layout *layout);

/* 1 if both layouts have the same groups (shapes and dtypes), else 0. */
KVS_API int kvs_layout_equal(const kvs_layout *a, const kvs_layout *b);

/* Human-readable form, e.g. "[2x4x64x128 bfloat16, 16 float16]", written
 * NUL-terminated into buf (truncated to bufsize). Returns buf. */
KVS_API char *kvs_layout_format(const kvs_layout *layout, char *buf,
                                size_t bufsize);

/* ---------------------------------------------------------------------
 * Memory object (upstream MemoryObj)
 * ------------------------------------------------------------------ */

/* Upstream MemoryFormat values (what the tensor layout means). Serdes never
 * read it; it travels with the object. */
typedef enum kvs_memory_format {
    KVS_FMT_UNDEFINED = 0,
    KVS_FMT_KV_2LTD = 1,       /* [2, num_layers, num_tokens, hidden_dim] */
    KVS_FMT_KV_T2D = 2,        /* [num_tokens, 2, hidden_dim] */
    KVS_FMT_KV_2TD = 3,        /* [2, num_tokens, hidden_dim] */
    KVS_FMT_BINARY = 4,        /* compressed binary */
    KVS_FMT_BINARY_BUFFER = 5, /* raw bytes */
    KVS_FMT_KV_MLA_FMT = 6,    /* [1, num_layers, num_tokens, aligned_head_size] */
    KVS_FMT_EC_TD = 7,         /* [num_tokens, hidden_dim], encoder cache */
    KVS_FMT_HS_TD = 8,         /* [num_tokens, hidden_dim], hidden states */
} kvs_memory_format;

/* A buffer of `capacity` bytes at `data` holding data of `layout`.
 *
 * `used_size` is the logical size in bytes: the layout's byte size after
 * init, narrowed by kvs_memobj_set_used_size() (the async processor narrows
 * a serialize destination to the bytes actually written, so an L2 adapter
 * stores only those). Fields are public for reading; change them only
 * through the functions below. */
typedef struct kvs_memobj {
    void *data;
    size_t capacity;
    size_t used_size;
    kvs_layout layout;
    kvs_memory_format format;
    int owns_data; /* 1 if kvs_memobj_free() must free `data` */
} kvs_memobj;

/* Describe caller-owned memory. Refused (KVS_EINVAL) if data is NULL while
 * capacity > 0, the layout is invalid, or the format is unknown; refused with
 * KVS_ENOSPC if capacity < the layout's byte size. */
KVS_API int kvs_memobj_init(kvs_memobj *obj, void *data, size_t capacity,
                            const kvs_layout *layout, kvs_memory_format format);

/* Allocate an object whose buffer (64-byte aligned, zero-filled) holds
 * exactly the layout's bytes. Free with kvs_memobj_free(). */
KVS_API int kvs_memobj_alloc(const kvs_layout *layout, kvs_memory_format format,
                             kvs_memobj **out);

/* Free an object from kvs_memobj_alloc() (and its buffer). NULL is a no-op. */
KVS_API void kvs_memobj_free(kvs_memobj *obj);

/* Narrow (or widen back) the logical size: 0 <= n <= capacity, else
 * KVS_EINVAL ("memobj: set_used_size: n=5000 out of range [0, 4096]") and
 * nothing changes. */
KVS_API int kvs_memobj_set_used_size(kvs_memobj *obj, size_t n);

/* The logical size in bytes (used_size). */
KVS_API size_t kvs_memobj_size(const kvs_memobj *obj);

/* Start and byte size of group i of the object's layout (i < ngroups). */
KVS_API void *kvs_memobj_group_data(const kvs_memobj *obj, uint32_t i);
KVS_API size_t kvs_memobj_group_nbytes(const kvs_memobj *obj, uint32_t i);

/* ---------------------------------------------------------------------
 * Object key (upstream ObjectKey)
 * ------------------------------------------------------------------ */

#define KVS_CHUNK_HASH_MAX 128    /* bytes of chunk hash */
#define KVS_MODEL_NAME_MAX 255    /* characters of model name */
#define KVS_CACHE_SALT_MAX 128    /* characters of cache salt */
#define KVS_TEMP_KEY_SUFFIX 16    /* random bytes make_temp_key appends */

/* The identity of one stored KV object. */
typedef struct kvs_object_key {
    uint8_t chunk_hash[KVS_CHUNK_HASH_MAX];
    size_t chunk_hash_len;
    char model_name[KVS_MODEL_NAME_MAX + 1]; /* NUL-terminated, no '@' */
    int64_t kv_rank;
    int64_t object_group_id;                 /* >= 0 */
    char cache_salt[KVS_CACHE_SALT_MAX + 1]; /* no '@', '/', '\\' */
} kvs_object_key;

/* Build a validated key. `cache_salt` may be NULL (= ""). Refused with
 * KVS_EINVAL naming the field: hash NULL with length > 0 or longer than
 * KVS_CHUNK_HASH_MAX, model name NULL, longer than KVS_MODEL_NAME_MAX or
 * containing '@', negative object group id, cache salt over
 * KVS_CACHE_SALT_MAX characters or containing '@', '/' or '\\'. */
KVS_API int kvs_object_key_init(kvs_object_key *out, const void *chunk_hash,
                                size_t chunk_hash_len, const char *model_name,
                                int64_t kv_rank, int64_t object_group_id,
                                const char *cache_salt);

/* KVS_OK if `key` obeys the rules of kvs_object_key_init(), else KVS_EINVAL
 * (also when a string field is not NUL-terminated within its array). */
KVS_API int kvs_object_key_validate(const kvs_object_key *key);

/* 1 if every field is equal, else 0. */
KVS_API int kvs_object_key_equal(const kvs_object_key *a,
                                 const kvs_object_key *b);

/* Upstream utils.make_temp_key: a key for a temporary buffer derived from
 * `key`: the chunk hash followed by KVS_TEMP_KEY_SUFFIX random bytes from the
 * kernel's generator (getrandom), every other field copied. Two calls give
 * different keys. Refused (KVS_EINVAL) if the hash would exceed
 * KVS_CHUNK_HASH_MAX; KVS_EIO if the kernel gives no random bytes. */
KVS_API int kvs_make_temp_key(const kvs_object_key *key, kvs_object_key *out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_MEMOBJ_H */
