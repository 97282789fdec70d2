/* fp8_convert.c - the public fp8 conversion entry points: check the
 * arguments once, then hand the whole array to the active kernel variant. */
#include <string.h>

#include "codecs/fp8_kernels.h"
#include "kvserde/error.h"
#include "kvserde/fp8.h"

static int check_fp8(kvs_dtype fp8_dtype, int *fmt)
{
    *fmt = kvs_fp8_fmt_index(fp8_dtype);
    if (*fmt < 0)
        return kvs_set_error(KVS_EINVAL,
                             "fp8: unsupported fp8 dtype '%s'; expected float8_e4m3fn "
                             "or float8_e5m2",
                             kvs_dtype_name(fp8_dtype));
    return KVS_OK;
}

/* kvs_fp8_encode, and with `copy` (not NULL) the kernels' encode_copy
 * (fp8_kernels.h), or for a variant without one (scalar) the codes copied
 * after encoding: the same bytes either way. */
static int encode(const void *src, kvs_dtype src_dtype, uint8_t *dst, uint8_t *copy,
                  kvs_dtype fp8_dtype, int saturate, size_t n)
{
    int fmt, rc = check_fp8(fp8_dtype, &fmt);
    if (rc) return rc;
    int wide = kvs_fp8_wide_index(src_dtype);
    if (wide < 0)
        return kvs_set_error(KVS_EINVAL,
                             "fp8: unsupported source dtype '%s'; expected float32, "
                             "float16 or bfloat16",
                             kvs_dtype_name(src_dtype));
    if (n > 0 && (src == NULL || dst == NULL))
        return kvs_set_error(KVS_EINVAL, "fp8: NULL buffer for %zu elements", n);
    const kvs_fp8_kernels *k;
    rc = kvs_fp8_kernels_get(&k);
    if (rc) return rc;
    if (copy == NULL) {
        k->encode[fmt][wide](src, dst, n, saturate != 0);
    } else if (k->encode_copy[fmt][wide]) {
        k->encode_copy[fmt][wide](src, dst, copy, n, saturate != 0);
    } else {
        k->encode[fmt][wide](src, dst, n, saturate != 0);
        memcpy(copy, dst, n);
    }
    return KVS_OK;
}

int kvs_fp8_encode(const void *src, kvs_dtype src_dtype, uint8_t *dst,
                   kvs_dtype fp8_dtype, int saturate, size_t n)
{
    return encode(src, src_dtype, dst, NULL, fp8_dtype, saturate, n);
}

int kvs_fp8_encode_copy(const void *src, kvs_dtype src_dtype, uint8_t *dst, uint8_t *copy,
                        kvs_dtype fp8_dtype, int saturate, size_t n)
{
    if (n > 0 && copy == NULL)
        return kvs_set_error(KVS_EINVAL, "fp8: NULL copy buffer for %zu elements", n);
    return encode(src, src_dtype, dst, copy, fp8_dtype, saturate, n);
}

int kvs_fp8_lut16(const uint8_t *src, void *dst, size_t n, const uint8_t *lo, const uint8_t *hi)
{
    const kvs_fp8_kernels *k;
    int rc = kvs_fp8_kernels_get(&k);
    if (rc) return rc;
    if (k->lut16) {
        k->lut16(src, dst, n, lo, hi);
        return KVS_OK;
    }
    uint8_t *d = dst;
    for (size_t i = 0; i < n; i++) {
        unsigned c = src[i] & 0x7F;
        uint16_t v = (uint16_t)(hi[c] << 8 | lo[c] | (src[i] & 0x80) << 8);
        memcpy(d + 2 * i, &v, 2);
    }
    return KVS_OK;
}

int kvs_fp8_decode(const uint8_t *src, kvs_dtype fp8_dtype, void *dst,
                   kvs_dtype dst_dtype, size_t n)
{
    int fmt, rc = check_fp8(fp8_dtype, &fmt);
    if (rc) return rc;
    int wide = kvs_fp8_wide_index(dst_dtype);
    if (wide < 0)
        return kvs_set_error(KVS_EINVAL,
                             "fp8: unsupported destination dtype '%s'; expected float32, "
                             "float16 or bfloat16",
                             kvs_dtype_name(dst_dtype));
    if (n > 0 && (src == NULL || dst == NULL))
        return kvs_set_error(KVS_EINVAL, "fp8: NULL buffer for %zu elements", n);
    const kvs_fp8_kernels *k;
    rc = kvs_fp8_kernels_get(&k);
    if (rc) return rc;
    k->decode[fmt][wide](src, dst, n);
    return KVS_OK;
}

uint8_t kvs_fp8_from_float(float x, kvs_dtype fp8_dtype, int saturate)
{
    switch (fp8_dtype) {
    case KVS_DTYPE_FLOAT8_E4M3FN: return kvs_fp8_e4m3fn_from_f32(x, saturate != 0);
    case KVS_DTYPE_FLOAT8_E5M2: return kvs_fp8_e5m2_from_f32(x, saturate != 0);
    default: return 0;
    }
}

float kvs_fp8_to_float(uint8_t code, kvs_dtype fp8_dtype)
{
    switch (fp8_dtype) {
    case KVS_DTYPE_FLOAT8_E4M3FN: return kvs_fp8_e4m3fn_to_f32(code);
    case KVS_DTYPE_FLOAT8_E5M2: return kvs_fp8_e5m2_to_f32(code);
    default: return 0.0f;
    }
}
