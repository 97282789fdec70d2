/* ggml_scalar.c - the portable reference of the ggml block kernels: it
 * defines the bytes every other variant must write (include/kvserde/ggml.h).
 *
 * The quantizers follow llama.cpp's quantize_row_q8_0_ref and
 * quantize_row_q4_0_ref operation by operation, in float32: the products
 * and sums must each be rounded on their own, never fused, or a tie such as
 * x * id + 8.5 landing exactly on an integer would come out differently.
 */
/* No fused multiply-add: GCC contracts only with -ffp-contract=fast, never
 * under -std=c11; clang needs to be told. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "codecs/ggml_kernels.h"
#include "codecs/half.h"

static void put_d(uint8_t *out, float d)
{
    uint16_t h = kvs_f32_to_f16(d);
    out[0] = (uint8_t)(h & 0xFF);
    out[1] = (uint8_t)(h >> 8);
}

static float get_d(const uint8_t *in)
{
    return kvs_f16_to_f32((uint16_t)(in[0] | in[1] << 8));
}

void kvs_ggml_q8_0_block(const float *x, uint8_t *out)
{
    float amax = 0.0f;
    for (int j = 0; j < KVS_GGML_BLOCK; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
    const float d = kvs_ggml_q8_0_scale(amax);
    const float id = kvs_ggml_inverse(d);
    put_d(out, d);
    for (int j = 0; j < KVS_GGML_BLOCK; j++) {
        /* |x * id| <= 127 (+ rounding), so the code fits int8; an infinite
         * id (d below 2^-128) is the case C leaves undefined: code 0. */
        int8_t q = isinf(id) ? 0 : (int8_t)roundf(x[j] * id);
        out[2 + j] = (uint8_t)q;
    }
}

void kvs_ggml_q4_0_block(const float *x, uint8_t *out)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < KVS_GGML_BLOCK; j++) {
        if (amax < fabsf(x[j])) { /* strictly: the first of equal magnitudes */
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    const float d = kvs_ggml_q4_0_scale(max);
    const float id = kvs_ggml_inverse(d);
    put_d(out, d);
    for (int j = 0; j < KVS_GGML_BLOCK / 2; j++) {
        uint8_t n[2];
        for (int h = 0; h < 2; h++) {
            /* x * id is in [-8, 8] (+ rounding): the sum in [0.5, 16.5). */
            const float v = x[j + 16 * h] * id + 8.5f;
            int t = isinf(id) ? 0 : (int)v;
            n[h] = (uint8_t)(t < 15 ? t : 15);
        }
        out[2 + j] = (uint8_t)(n[0] | n[1] << 4);
    }
}

static void q8_0_decode_block(const uint8_t *in, float *y)
{
    const float d = get_d(in);
    for (int j = 0; j < KVS_GGML_BLOCK; j++) y[j] = (float)(int8_t)in[2 + j] * d;
}

static void q4_0_decode_block(const uint8_t *in, float *y)
{
    const float d = get_d(in);
    for (int j = 0; j < KVS_GGML_BLOCK / 2; j++) {
        y[j] = (float)((in[2 + j] & 0x0F) - 8) * d;
        y[j + 16] = (float)((in[2 + j] >> 4) - 8) * d;
    }
}

/* ---- arrays -------------------------------------------------------------- */

/* Widen block b of src to float32; 0 if one of its values is not finite. */
static int widen_block(const void *src, int wide, size_t b, float *x)
{
    uint32_t worst = 0;
    for (int j = 0; j < KVS_GGML_BLOCK; j++) {
        size_t i = b * KVS_GGML_BLOCK + (size_t)j;
        uint32_t bits;
        if (wide == KVS_WIDE_F32) {
            memcpy(&bits, (const uint8_t *)src + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, (const uint8_t *)src + 2 * i, 2);
            bits = wide == KVS_WIDE_F16 ? kvs_f16_bits_to_f32_bits(h)
                                        : kvs_bf16_bits_to_f32_bits(h);
        }
        x[j] = kvs_f32_from_bits(bits);
        if ((bits & 0x7FFFFFFFu) > worst) worst = bits & 0x7FFFFFFFu;
    }
    return worst < 0x7F800000u;
}

static void narrow_block(const float *y, int wide, void *dst, size_t b)
{
    uint8_t *out = (uint8_t *)dst + b * KVS_GGML_BLOCK * (wide == KVS_WIDE_F32 ? 4 : 2);
    for (int j = 0; j < KVS_GGML_BLOCK; j++) {
        if (wide == KVS_WIDE_F32) {
            memcpy(out + 4 * j, &y[j], 4);
        } else {
            uint16_t h = wide == KVS_WIDE_F16 ? kvs_f32_to_f16(y[j]) : kvs_f32_to_bf16(y[j]);
            memcpy(out + 2 * j, &h, 2);
        }
    }
}

static size_t encode_array(const void *src, uint8_t *dst, size_t nblocks, int type, int wide)
{
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    float x[KVS_GGML_BLOCK];
    for (size_t b = 0; b < nblocks; b++) {
        if (!widen_block(src, wide, b, x)) return b;
        if (type == KVS_GGML_Q8_0)
            kvs_ggml_q8_0_block(x, dst + b * bb);
        else
            kvs_ggml_q4_0_block(x, dst + b * bb);
    }
    return nblocks;
}

static void decode_array(const uint8_t *src, void *dst, size_t nblocks, int type, int wide)
{
    const size_t bb = type == KVS_GGML_Q8_0 ? KVS_GGML_Q8_0_BYTES : KVS_GGML_Q4_0_BYTES;
    float y[KVS_GGML_BLOCK];
    for (size_t b = 0; b < nblocks; b++) {
        if (type == KVS_GGML_Q8_0)
            q8_0_decode_block(src + b * bb, y);
        else
            q4_0_decode_block(src + b * bb, y);
        narrow_block(y, wide, dst, b);
    }
}

KVS_GGML_DEFINE_VARIANT(kvs_ggml_kernels_scalar, "scalar")
