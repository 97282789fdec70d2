/* kvs_test_objs.h - test objects shared by several tests: the KV-shaped
 * objects of the size checks (issue 17 item 3: the same [2, 4, tokens,
 * hidden] bfloat16 object with more tokens or fewer), a canary check, and a
 * serde pair made from JSON. Header-only, static inline so a test that uses
 * one of them does not warn about the others. */
#ifndef KVS_TEST_OBJS_H
#define KVS_TEST_OBJS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/memobj.h"
#include "kvserde/registry.h"

/* The serializer and deserializer of `json`; aborts, naming the config and
 * the refusal, if the config does not make one. */
static inline kvs_serde_pair kvs_test_serde_pair(const char *json)
{
    kvs_serde_pair p;
    if (kvs_serde_create_pair(json, &p) != KVS_OK) {
        fprintf(stderr, "%s: %s\n", json, kvs_last_error());
        abort();
    }
    return p;
}

/* A [2, 4, tokens, hidden] bfloat16 KV_2LTD object, every byte `fill`;
 * aborts if it cannot be made. */
static inline kvs_memobj *kvs_test_kv_obj(int64_t tokens, int64_t hidden, uint8_t fill)
{
    kvs_layout l = {0};
    int64_t dims[4] = {2, 4, tokens, hidden};
    kvs_memobj *o = NULL;
    if (kvs_layout_add_group(&l, 4, dims, KVS_DTYPE_BFLOAT16) != KVS_OK ||
        kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &o) != KVS_OK)
        abort();
    memset(o->data, fill, o->capacity);
    return o;
}

/* 1 if every byte of o's buffer is v. */
static inline int kvs_test_all_bytes(const kvs_memobj *o, uint8_t v)
{
    for (size_t i = 0; i < o->capacity; i++)
        if (((const uint8_t *)o->data)[i] != v) return 0;
    return 1;
}

#endif /* KVS_TEST_OBJS_H */
