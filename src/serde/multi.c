/* multi.c - checked calls through the multi-output serde ops tables, the
 * group-length check, and the bridges that present a single-tensor serde as
 * a group of one (upstream serde/multi.py). */
#include <stdlib.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/multi.h"

/* An implementation that fails must say why; if it forgot, name at least
 * the serde and the operation. */
static int ensure_message(int rc, const char *name, const char *op)
{
    if (rc != KVS_OK && kvs_last_error_code() != rc)
        kvs_set_error(rc, "%s: %s failed: %s", name ? name : "multi serde", op,
                      kvs_strerror(rc));
    return rc;
}

int kvs_validate_group_size(size_t n, size_t expected, const char *role)
{
    if (n == expected) return KVS_OK;
    return kvs_set_error(KVS_EINVAL, "multi: %s group length %zu does not match expected %zu",
                         role ? role : "group", n, expected);
}

int kvs_multi_serialize(kvs_multi_serializer *ser, kvs_memobj *const *src_group,
                        size_t n, kvs_memobj *dst, const kvs_object_key *key,
                        size_t *nwritten)
{
    if (ser == NULL || (src_group == NULL && n > 0) || dst == NULL || nwritten == NULL)
        return kvs_set_error(KVS_EINVAL, "multi: serialize: NULL argument");
    kvs_clear_error();
    return ensure_message(ser->ops->serialize(ser, src_group, n, dst, key, nwritten),
                          ser->ops->name, "serialize");
}

int kvs_multi_estimate_serialized_size(const kvs_multi_serializer *ser,
                                       const kvs_layout *const *layouts, size_t n,
                                       size_t *nbytes)
{
    if (ser == NULL || (layouts == NULL && n > 0) || nbytes == NULL)
        return kvs_set_error(KVS_EINVAL, "multi: estimate: NULL argument");
    kvs_clear_error();
    return ensure_message(ser->ops->estimate_serialized_size(ser, layouts, n, nbytes),
                          ser->ops->name, "estimate_serialized_size");
}

int kvs_multi_deserialize(kvs_multi_deserializer *de, const kvs_memobj *src,
                          kvs_memobj *const *dst_group, size_t n,
                          const kvs_object_key *key)
{
    if (de == NULL || src == NULL || (dst_group == NULL && n > 0))
        return kvs_set_error(KVS_EINVAL, "multi: deserialize: NULL argument");
    kvs_clear_error();
    return ensure_message(de->ops->deserialize(de, src, dst_group, n, key), de->ops->name,
                          "deserialize");
}

size_t kvs_multi_serializer_group_size(const kvs_multi_serializer *ser)
{
    return ser ? ser->group_size : 0;
}

size_t kvs_multi_deserializer_group_size(const kvs_multi_deserializer *de)
{
    return de ? de->group_size : 0;
}

void kvs_multi_serializer_destroy(kvs_multi_serializer *ser)
{
    if (ser) ser->ops->destroy(ser);
}

void kvs_multi_deserializer_destroy(kvs_multi_deserializer *de)
{
    if (de) de->ops->destroy(de);
}

void kvs_multi_serde_pair_destroy(kvs_multi_serde_pair *pair)
{
    if (pair == NULL) return;
    kvs_multi_serializer_destroy(pair->serializer);
    kvs_multi_deserializer_destroy(pair->deserializer);
    memset(pair, 0, sizeof *pair);
}

/* ---------------------------------------------------------------------
 * Bridges: a single-tensor serde seen as a group of one. They add no bytes
 * and no checks beyond the group shape, so their output is the inner
 * serde's, byte for byte.
 * ------------------------------------------------------------------ */

typedef struct bridge_serializer {
    kvs_multi_serializer base;
    kvs_serializer *inner;
} bridge_serializer;

typedef struct bridge_deserializer {
    kvs_multi_deserializer base;
    kvs_deserializer *inner;
} bridge_deserializer;

static int bridge_serialize(kvs_multi_serializer *s, kvs_memobj *const *src_group,
                            size_t n, kvs_memobj *dst, const kvs_object_key *key,
                            size_t *nwritten)
{
    bridge_serializer *self = KVS_CONTAINER_OF(s, bridge_serializer, base);
    const char *name = self->inner->ops->name;
    if (n != 1)
        return kvs_set_error(KVS_EINVAL,
                             "single-to-multi(%s): expected group of size 1, got %zu",
                             name, n);
    if (src_group[0] == NULL)
        return kvs_set_error(KVS_EINVAL,
                             "single-to-multi(%s): the single-tensor serializer does "
                             "not admit an absent src slot",
                             name);
    return kvs_serialize(self->inner, src_group[0], dst, key, nwritten);
}

static int bridge_estimate(const kvs_multi_serializer *s,
                           const kvs_layout *const *layouts, size_t n, size_t *nbytes)
{
    const bridge_serializer *self = KVS_CONTAINER_OF(s, const bridge_serializer, base);
    const char *name = self->inner->ops->name;
    if (n != 1)
        return kvs_set_error(KVS_EINVAL,
                             "single-to-multi(%s): expected layout group of size 1, "
                             "got %zu",
                             name, n);
    if (layouts[0] == NULL)
        return kvs_set_error(KVS_EINVAL,
                             "single-to-multi(%s): the single-tensor serializer "
                             "requires a layout in slot 0",
                             name);
    return kvs_estimate_serialized_size(self->inner, layouts[0], nbytes);
}

static void bridge_serializer_destroy(kvs_multi_serializer *s)
{
    bridge_serializer *self = KVS_CONTAINER_OF(s, bridge_serializer, base);
    kvs_serializer_destroy(self->inner);
    free(self);
}

static const struct kvs_multi_serializer_ops bridge_serializer_ops = {
    .name = "single-to-multi",
    .serialize = bridge_serialize,
    .estimate_serialized_size = bridge_estimate,
    .destroy = bridge_serializer_destroy,
};

static int bridge_deserialize(kvs_multi_deserializer *d, const kvs_memobj *src,
                              kvs_memobj *const *dst_group, size_t n,
                              const kvs_object_key *key)
{
    bridge_deserializer *self = KVS_CONTAINER_OF(d, bridge_deserializer, base);
    if (n != 1)
        return kvs_set_error(KVS_EINVAL,
                             "single-to-multi(%s): expected group of size 1, got %zu",
                             self->inner->ops->name, n);
    /* (NULL,) is a deliberate skip, not an error: callers pass groups
     * through uniformly even when they chose not to materialize the only
     * output. */
    if (dst_group[0] == NULL) return KVS_OK;
    return kvs_deserialize(self->inner, src, dst_group[0], key);
}

static void bridge_deserializer_destroy(kvs_multi_deserializer *d)
{
    bridge_deserializer *self = KVS_CONTAINER_OF(d, bridge_deserializer, base);
    kvs_deserializer_destroy(self->inner);
    free(self);
}

static const struct kvs_multi_deserializer_ops bridge_deserializer_ops = {
    .name = "single-to-multi",
    .deserialize = bridge_deserialize,
    .destroy = bridge_deserializer_destroy,
};

int kvs_single_to_multi_serializer(kvs_serializer *inner, kvs_multi_serializer **out)
{
    if (inner == NULL || out == NULL)
        return kvs_set_error(KVS_EINVAL, "single-to-multi: NULL serializer or output");
    bridge_serializer *self = calloc(1, sizeof *self);
    if (self == NULL)
        return kvs_set_error(KVS_ENOMEM, "single-to-multi(%s): out of memory",
                             inner->ops->name);
    self->base.ops = &bridge_serializer_ops;
    self->base.group_size = 1;
    self->inner = inner;
    *out = &self->base;
    return KVS_OK;
}

int kvs_single_to_multi_deserializer(kvs_deserializer *inner, kvs_multi_deserializer **out)
{
    if (inner == NULL || out == NULL)
        return kvs_set_error(KVS_EINVAL, "single-to-multi: NULL deserializer or output");
    bridge_deserializer *self = calloc(1, sizeof *self);
    if (self == NULL)
        return kvs_set_error(KVS_ENOMEM, "single-to-multi(%s): out of memory",
                             inner->ops->name);
    self->base.ops = &bridge_deserializer_ops;
    self->base.group_size = 1;
    self->inner = inner;
    *out = &self->base;
    return KVS_OK;
}
