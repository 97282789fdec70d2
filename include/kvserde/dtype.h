/* kvserde/dtype.h - element types and their PyTorch names. */
#ifndef KVSERDE_DTYPE_H
#define KVSERDE_DTYPE_H

#include <stddef.h>

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. The numeric values are stable (they may be stored). */
typedef enum kvs_dtype {
    KVS_DTYPE_UINT8 = 0,
    KVS_DTYPE_FLOAT32 = 1,
    KVS_DTYPE_FLOAT16 = 2,
    KVS_DTYPE_BFLOAT16 = 3,
    KVS_DTYPE_FLOAT8_E4M3FN = 4,
    KVS_DTYPE_FLOAT8_E5M2 = 5,
} kvs_dtype;

#define KVS_DTYPE_COUNT 6

/* 1 if `dtype` is one of the values above, else 0. */
KVS_API int kvs_dtype_valid(int dtype);

/* Bytes per element (1, 2 or 4); 0 for an invalid dtype. */
KVS_API size_t kvs_dtype_size(kvs_dtype dtype);

/* The PyTorch name without the "torch." prefix: "uint8", "float32",
 * "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2". An invalid dtype
 * gives "invalid". Never returns NULL. */
KVS_API const char *kvs_dtype_name(kvs_dtype dtype);

/* Parse a PyTorch dtype name, with or without the "torch." prefix.
 * Returns KVS_OK and sets *out, or KVS_EINVAL ("dtype: unknown dtype 'x';
 * known: uint8, float32, ..."). */
KVS_API int kvs_dtype_parse(const char *name, kvs_dtype *out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_DTYPE_H */
