/* kvserde/serde.h - the synchronous serde interface (upstream serde/base.py,
 * sync half).
 *
 * A serde is a pure transform: a serializer turns a KV-shaped memory object
 * into bytes, a deserializer turns bytes back into a KV-shaped object. No
 * threads, no fds: the async processor (processor.h) adds those.
 *
 * Implementing one: embed the interface struct and recover yourself with
 * KVS_CONTAINER_OF:
 *
 *     struct my_ser { kvs_serializer base; int level; };
 *     static int my_serialize(kvs_serializer *s, const kvs_memobj *src,
 *                             kvs_memobj *dst, size_t *nwritten) {
 *         struct my_ser *self = KVS_CONTAINER_OF(s, struct my_ser, base);
 *         ...
 *     }
 *     static const struct kvs_serializer_ops my_ops = {
 *         "my", my_serialize, my_estimate, my_destroy };
 *
 * Contracts every implementation keeps (callers rely on them):
 *   - serialize is deterministic: the same src gives the same bytes.
 *   - estimate_serialized_size depends only on the layout and is an upper
 *     bound on what serialize writes for any object of that layout.
 *   - on failure nothing is written to dst (refuse before writing), and the
 *     thread's error message says why (kvs_set_error).
 *   - serialize and deserialize may be called from several threads at once
 *     on different objects.
 */
#ifndef KVSERDE_SERDE_H
#define KVSERDE_SERDE_H

#include <stddef.h>

#include "export.h"
#include "memobj.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_serializer kvs_serializer;
typedef struct kvs_deserializer kvs_deserializer;

struct kvs_serializer_ops {
    /* Short name used in messages ("fp8"). */
    const char *name;
    /* Write src's data into dst (from dst->data, at most dst->capacity
     * bytes) and set *nwritten to the bytes written. Does not change
     * dst->used_size (the async layer narrows it). */
    int (*serialize)(kvs_serializer *self, const kvs_memobj *src,
                     kvs_memobj *dst, size_t *nwritten);
    /* The buffer size to allocate for serializing an object of `layout`. */
    int (*estimate_serialized_size)(const kvs_serializer *self,
                                    const kvs_layout *layout, size_t *nbytes);
    /* Free the serializer. */
    void (*destroy)(kvs_serializer *self);
};

struct kvs_serializer {
    const struct kvs_serializer_ops *ops;
};

struct kvs_deserializer_ops {
    const char *name;
    /* Read serialized bytes from src (its first used_size bytes) and fill
     * dst, whose layout says what to produce. */
    int (*deserialize)(kvs_deserializer *self, const kvs_memobj *src,
                       kvs_memobj *dst);
    void (*destroy)(kvs_deserializer *self);
};

struct kvs_deserializer {
    const struct kvs_deserializer_ops *ops;
};

/* Checked calls through the ops tables. NULL arguments are refused with
 * KVS_EINVAL; otherwise they return what the implementation returns, and
 * make sure a failing implementation left a message. */
KVS_API int kvs_serialize(kvs_serializer *ser, const kvs_memobj *src,
                          kvs_memobj *dst, size_t *nwritten);
KVS_API int kvs_estimate_serialized_size(const kvs_serializer *ser,
                                         const kvs_layout *layout,
                                         size_t *nbytes);
KVS_API int kvs_deserialize(kvs_deserializer *de, const kvs_memobj *src,
                            kvs_memobj *dst);
/* Destroy through the ops table; NULL is a no-op. */
KVS_API void kvs_serializer_destroy(kvs_serializer *ser);
KVS_API void kvs_deserializer_destroy(kvs_deserializer *de);

/* Upstream utils.serialized_layout_desc: the layout of the temporary buffer
 * that serializing an object of `layout` needs: one flat uint8 group of the
 * serializer's estimate. */
KVS_API int kvs_serialized_layout(const kvs_serializer *ser,
                                  const kvs_layout *layout, kvs_layout *out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_SERDE_H */
