/* serde.c - checked calls through the sync serde ops tables, and upstream
 * utils.serialized_layout_desc. */
#include "core/error_internal.h"
#include "kvserde/error.h"
#include "kvserde/serde.h"

/* An implementation that fails must say why; if it recorded nothing since
 * `serial`, say at least which serde failed, so no failure reaches the user
 * without a message. A success leaves the thread's last error alone. */
static int ensure_message(int rc, unsigned long serial, const char *name,
                          const char *op)
{
    if (rc != KVS_OK && kvs_error_serial() == serial)
        kvs_set_error(rc, "%s: %s failed: %s", name ? name : "serde", op,
                      kvs_strerror(rc));
    return rc;
}

int kvs_serialize(kvs_serializer *ser, const kvs_memobj *src, kvs_memobj *dst,
                  const kvs_object_key *key, size_t *nwritten)
{
    if (ser == NULL || src == NULL || dst == NULL || nwritten == NULL)
        return kvs_set_error(KVS_EINVAL, "serde: serialize: NULL argument");
    unsigned long serial = kvs_error_serial();
    return ensure_message(ser->ops->serialize(ser, src, dst, key, nwritten), serial,
                          ser->ops->name, "serialize");
}

int kvs_estimate_serialized_size(const kvs_serializer *ser, const kvs_layout *layout,
                                 size_t *nbytes)
{
    if (ser == NULL || layout == NULL || nbytes == NULL)
        return kvs_set_error(KVS_EINVAL, "serde: estimate: NULL argument");
    unsigned long serial = kvs_error_serial();
    return ensure_message(ser->ops->estimate_serialized_size(ser, layout, nbytes),
                          serial, ser->ops->name, "estimate_serialized_size");
}

int kvs_deserialize(kvs_deserializer *de, const kvs_memobj *src, kvs_memobj *dst,
                    const kvs_object_key *key)
{
    if (de == NULL || src == NULL || dst == NULL)
        return kvs_set_error(KVS_EINVAL, "serde: deserialize: NULL argument");
    unsigned long serial = kvs_error_serial();
    return ensure_message(de->ops->deserialize(de, src, dst, key), serial, de->ops->name,
                          "deserialize");
}

void kvs_serializer_destroy(kvs_serializer *ser)
{
    if (ser) ser->ops->destroy(ser);
}

void kvs_deserializer_destroy(kvs_deserializer *de)
{
    if (de) de->ops->destroy(de);
}

int kvs_serialized_layout(const kvs_serializer *ser, const kvs_layout *layout,
                          kvs_layout *out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "serde: NULL output layout");
    size_t n;
    int rc = kvs_estimate_serialized_size(ser, layout, &n);
    if (rc) return rc;
    return kvs_layout_flat(out, n, KVS_DTYPE_UINT8);
}
