/* kvs_test_objs.h - KV-shaped test objects shared by the tests of the size
 * checks (issue 17 item 3): the same [2, 4, tokens, hidden] bfloat16 object
 * with more tokens or fewer, and a canary check. Header-only, static inline
 * so a test that uses one of them does not warn about the other. */
#ifndef KVS_TEST_OBJS_H
#define KVS_TEST_OBJS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvserde/memobj.h"

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
