/* fuzz_int.c - the int stage (src/frame/stage_int.c, src/codecs/intq.c)
 * alone: its parameter check and decoder on arbitrary frames' parameters
 * and payloads, and its encoder on arbitrary data.
 *
 * Input: 14 parameter bytes (as a frame holds them), one byte of options,
 * one byte of layout, its dims (one byte each), then the rest.
 *   options bits 0-1  the memory format: binary, KV_2LTD, KV_2TD, KV_T2D
 *           bit 2     encode mode: the rest fills the object (float32
 *                     bits, or 16-bit words for bfloat16 / float16)
 *   layout  bits 0-1  dtype: bfloat16, float16, float32 (3: uint8)
 *           bits 2-3  rank - 1 (1 to 4); dims are byte % 24, except that
 *                     the K/V dim of the format is 2
 *           bit 4     the last dim is 64 (bit 5 clear) or 128 (set): the
 *                     fused rows' widths
 * Properties:
 *   - check_params refuses with a code and a message or accepts;
 *   - decode mode: the rest is a payload; decode refuses (KVS_ECORRUPT or
 *     KVS_ENOSPC, with a message) writing nothing (a canary), or succeeds;
 *   - encode mode (accepted parameters): encode refuses or writes at most
 *     typed_bound bytes; the payload decodes, and so does it again to the
 *     same bytes; shorter lengths (all up to 256 bytes, 64 of a longer
 *     payload, and one byte short) and one byte longer are refused writing
 *     nothing;
 *   - every kernel variant this CPU has (intq_kernels.h, through the
 *     KVSERDE_ISA names) gives the portable code's result: the same status,
 *     message and bytes for decode (of the rest, and of the encoder's
 *     payload) and for encode (refusals included).
 */
#include "frame/stage.h"
#include "fuzz_common.h"
#include "kvserde/error.h"
#include "kvserde/fp8.h"
#include <jansson.h>

#define MAX_ELEMS 20000
#define NPARAMS 14

static const kvs_stage_type *T = &kvs_stage_int_type;

/* The stage that writes `params`: the frame's fields as a JSON config. */
static kvs_stage *stage_of(const uint8_t *params)
{
    static const char *const axes[3] = {"token", "channel", "tensor"};
    json_t *cfg = json_pack(
        "{s:s,s:i,s:s,s:s,s:i,s:i,s:b,s:s,s:i,s:i,s:i}", "type", "int", "bits", params[0],
        "k_axis", axes[params[1]], "v_axis", axes[params[2]], "k_group",
        params[4] | params[5] << 8, "v_group", params[6] | params[7] << 8, "zero_point",
        params[3], "scale_dtype", params[8] == KVS_DTYPE_FLOAT16 ? "float16" : "float32",
        "hadamard", params[10] | params[11] << 8, "k_outliers", params[12] | params[13] << 8,
        "levels", params[9] + 1);
    kvs_stage *st = NULL;
    int rc = T->create(cfg, &st);
    FZ_ASSERT(rc == KVS_OK, "frame parameters accepted but the same config refused");
    uint8_t back[NPARAMS];
    T->write_params(st, back);
    FZ_ASSERT(memcmp(back, params, NPARAMS) == 0, "the config writes other parameters");
    json_decref(cfg);
    return st;
}

/* One encode or decode, for fz_same_on_every_variant. */
typedef struct int_job {
    const uint8_t *params;
    const kvs_stage *st;   /* encode: the stage of params */
    const kvs_memobj *src; /* encode: the object */
    size_t bound;
    const uint8_t *in;     /* decode: the payload */
    size_t n;
    const kvs_layout *layout; /* decode: the destination's */
    kvs_memory_format fmt;
} int_job;

static int encode_into(void *ctx, uint8_t *out)
{
    const int_job *j = ctx;
    size_t got = 0;
    return T->typed_encode(j->st, j->src, out, j->bound, &got);
}

static int decode_into(void *ctx, uint8_t *out)
{
    const int_job *j = ctx;
    size_t nbytes = (size_t)kvs_layout_nbytes(j->layout);
    kvs_memobj dst;
    int rc = kvs_memobj_init(&dst, nbytes ? out : NULL, nbytes, j->layout, j->fmt);
    FZ_ASSERT(rc == KVS_OK, "memobj_init of a valid layout: %d", rc);
    return T->typed_decode(j->params, NPARAMS, NULL, j->in, j->n, &dst);
}

/* decode of in[0..n) into a destination of `layout` on every variant */
static int decode_every_variant(const uint8_t *params, const uint8_t *in, size_t n,
                                const kvs_layout *layout, kvs_memory_format fmt)
{
    int_job j = {params, NULL, NULL, 0, in, n, layout, fmt};
    return fz_same_on_every_variant(decode_into, &j, (size_t)kvs_layout_nbytes(layout), 1,
                                    "int decode");
}

static int canary_intact(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0xA5) return 0;
    return 1;
}

static void refused_untouched(const uint8_t *params, const uint8_t *in, size_t n,
                              kvs_memobj *dst, const char *what)
{
    memset(dst->data, 0xA5, dst->capacity);
    int rc = T->typed_decode(params, NPARAMS, NULL, in, n, dst);
    FZ_ASSERT(rc == KVS_ECORRUPT, "%s: decode returned %d", what, rc);
    FZ_ASSERT_REFUSAL(rc, what);
    FZ_ASSERT(canary_intact(dst->data, dst->capacity), "%s: refused decode wrote dst", what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t params[NPARAMS];
    fz_bytes(&in, params, NPARAMS);
    uint8_t opt = fz_u8(&in), lay = fz_u8(&in);
    int rc = T->check_params(params, NPARAMS);
    if (rc) {
        FZ_ASSERT_REFUSAL(rc, "check_params");
        return 0;
    }
    static const kvs_dtype dts[4] = {KVS_DTYPE_BFLOAT16, KVS_DTYPE_FLOAT16, KVS_DTYPE_FLOAT32,
                                     KVS_DTYPE_UINT8};
    static const kvs_memory_format fmts[4] = {KVS_FMT_BINARY, KVS_FMT_KV_2LTD, KVS_FMT_KV_2TD,
                                              KVS_FMT_KV_T2D};
    kvs_memory_format fmt = fmts[opt & 3];
    kvs_dtype dt = dts[lay & 3];
    uint32_t nd = 1 + ((lay >> 2) & 3);
    int64_t dims[4];
    for (uint32_t d = 0; d < nd; d++) dims[d] = fz_u8(&in) % 24;
    /* bit 4: 64 or 128 channels, the widths of the AVX-512 fused rows */
    if (lay & 16) dims[nd - 1] = lay & 32 ? 128 : 64;
    if (fmt == KVS_FMT_KV_T2D && nd >= 2) dims[1] = 2;
    else if (fmt != KVS_FMT_BINARY) dims[0] = 2;
    kvs_layout l = {0};
    if (kvs_layout_add_group(&l, nd, dims, dt) != KVS_OK) return 0;
    uint64_t numel = kvs_layout_numel(&l);
    if (numel > MAX_ELEMS) return 0;
    kvs_memobj *obj = NULL, *dst = NULL;
    if (kvs_memobj_alloc(&l, fmt, &obj) || kvs_memobj_alloc(&l, fmt, &dst)) abort();
    size_t n;
    uint8_t *rest = fz_rest_copy(&in, &n);
    if (!(opt & 4)) { /* (a refusal writes nothing: fz_same_on_every_variant checks) */
        rc = decode_every_variant(params, rest, n, &l, fmt);
        if (rc)
            FZ_ASSERT(rc == KVS_ECORRUPT || rc == KVS_ENOSPC || rc == KVS_ENOMEM,
                      "decode returned %d", rc);
    } else {
        memcpy(obj->data, rest, n < obj->capacity ? n : obj->capacity);
        kvs_stage *st = stage_of(params);
        size_t bound, got = 0;
        rc = T->typed_bound(st, &l, &bound);
        uint8_t *out = NULL;
        if (rc == KVS_OK) {
            int_job j = {params, st, obj, bound, NULL, 0, NULL, fmt};
            int rv = fz_same_on_every_variant(encode_into, &j, bound, 0, "int encode");
            out = malloc(bound + 2);
            rc = T->typed_encode(st, obj, out, bound, &got);
            FZ_ASSERT(rc == rv, "encode returned %d, then %d", rv, rc);
            if (rc == KVS_OK) {
                FZ_ASSERT(decode_every_variant(params, out, got, &l, fmt) == KVS_OK,
                          "own payload refused");
                FZ_ASSERT(got <= bound, "encode wrote %zu bytes, bound %zu", got, bound);
                uint8_t *once = malloc(dst->capacity + 1);
                rc = T->typed_decode(params, NPARAMS, NULL, out, got, dst);
                FZ_ASSERT(rc == KVS_OK, "own payload refused");
                memcpy(once, dst->data, dst->capacity);
                rc = T->typed_decode(params, NPARAMS, NULL, out, got, dst);
                FZ_ASSERT(rc == KVS_OK && memcmp(once, dst->data, dst->capacity) == 0,
                          "decoding twice differs");
                free(once);
                /* every shorter length up to 256 bytes, then 64 spread out */
                size_t step = got <= 256 ? 1 : got / 64;
                for (size_t k = 0; k < got; k += step)
                    refused_untouched(params, out, k, dst, "truncated payload");
                refused_untouched(params, out, got - 1, dst, "truncated payload");
                out[got] = 0;
                refused_untouched(params, out, got + 1, dst, "payload with a trailing byte");
            }
        }
        if (rc) FZ_ASSERT_REFUSAL(rc, "encode");
        free(out);
        T->destroy(st);
    }
    free(rest);
    kvs_memobj_free(obj);
    kvs_memobj_free(dst);
    return 0;
}
