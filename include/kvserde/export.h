/* kvserde/export.h - symbol visibility and small shared macros.
 *
 * The library is built with -fvisibility=hidden; only declarations marked
 * KVS_API are exported from libkvserde.so.
 */
#ifndef KVSERDE_EXPORT_H
#define KVSERDE_EXPORT_H

#include <stddef.h>

#if defined(KVS_BUILDING_LIBRARY) && defined(__GNUC__)
#define KVS_API __attribute__((visibility("default")))
#else
#define KVS_API
#endif

/* Recover the enclosing struct from a pointer to one of its members: the
 * Linux-kernel idiom every kvserde interface uses. An implementation embeds
 * the interface struct (e.g. kvs_serializer) and gets itself back with
 * KVS_CONTAINER_OF(ptr, struct my_impl, base). */
#define KVS_CONTAINER_OF(ptr, type, member) \
    ((type *)(void *)((char *)(ptr) - offsetof(type, member)))

#endif /* KVSERDE_EXPORT_H */
