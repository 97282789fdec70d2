/* dtype.c - element type sizes and PyTorch names. */
#include <string.h>

#include "kvserde/dtype.h"
#include "kvserde/error.h"

static const struct {
    const char *name;
    size_t size;
} dtype_info[KVS_DTYPE_COUNT] = {
    [KVS_DTYPE_UINT8] = {"uint8", 1},
    [KVS_DTYPE_FLOAT32] = {"float32", 4},
    [KVS_DTYPE_FLOAT16] = {"float16", 2},
    [KVS_DTYPE_BFLOAT16] = {"bfloat16", 2},
    [KVS_DTYPE_FLOAT8_E4M3FN] = {"float8_e4m3fn", 1},
    [KVS_DTYPE_FLOAT8_E5M2] = {"float8_e5m2", 1},
};

int kvs_dtype_valid(int dtype) { return dtype >= 0 && dtype < KVS_DTYPE_COUNT; }

size_t kvs_dtype_size(kvs_dtype dtype)
{
    return kvs_dtype_valid((int)dtype) ? dtype_info[dtype].size : 0;
}

const char *kvs_dtype_name(kvs_dtype dtype)
{
    return kvs_dtype_valid((int)dtype) ? dtype_info[dtype].name : "invalid";
}

int kvs_dtype_parse(const char *name, kvs_dtype *out)
{
    if (name == NULL || out == NULL)
        return kvs_set_error(KVS_EINVAL, "dtype: NULL argument");
    const char *bare = strncmp(name, "torch.", 6) == 0 ? name + 6 : name;
    for (int i = 0; i < KVS_DTYPE_COUNT; i++) {
        if (strcmp(bare, dtype_info[i].name) == 0) {
            *out = (kvs_dtype)i;
            return KVS_OK;
        }
    }
    return kvs_set_error(KVS_EINVAL,
                         "dtype: unknown dtype '%s'; known: uint8, float32, float16, "
                         "bfloat16, float8_e4m3fn, float8_e5m2",
                         name);
}
