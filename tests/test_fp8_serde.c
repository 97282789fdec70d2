/* test_fp8_serde.c - the fp8 serde (upstream test_fp8.py, group D) and
 * every refusal: sizes, packing of multi-group objects, round trips,
 * dst-untouched guarantees. */
#include <math.h>
#include <stdlib.h>

#include "kvs_test.h"
#include "kvs_test_objs.h"
#include "kvserde/kvserde.h"

static kvs_serializer *ser;
static kvs_deserializer *de;

/* bfloat16 bits of a float, round to nearest even (test data only). */
static uint16_t bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static float f32_of_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Deterministic standard normal samples (Box-Muller over an LCG). */
static uint64_t rng_state;
static double uniform01(void)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return ((rng_state >> 11) + 0.5) / 9007199254740992.0;
}
static float randn(void)
{
    return (float)(sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()));
}

/* 27: estimate of one group = floor(1.5 x elements). */
static void test_estimate_single_group(void)
{
    kvs_layout l = {0};
    int64_t dims[] = {2, 4, 256, 128};
    REQUIRE_OK(kvs_layout_add_group(&l, 4, dims, KVS_DTYPE_BFLOAT16));
    size_t n = 0;
    CHECK_OK(kvs_estimate_serialized_size(ser, &l, &n));
    CHECK_EQ_U64(n, 393216); /* 262144 elements x 1.5 */
    CHECK(n >= kvs_layout_numel(&l));
}

/* 28: estimate of several groups counts every element, dtypes aside. */
static void test_estimate_multi_group(void)
{
    kvs_layout l = {0};
    int64_t a[] = {4, 8}, b[] = {16};
    REQUIRE_OK(kvs_layout_add_group(&l, 2, a, KVS_DTYPE_BFLOAT16));
    REQUIRE_OK(kvs_layout_add_group(&l, 1, b, KVS_DTYPE_FLOAT16));
    size_t n = 0;
    CHECK_OK(kvs_estimate_serialized_size(ser, &l, &n));
    CHECK_EQ_U64(n, 72); /* floor(48 x 1.5) */
    /* odd counts round down; the empty layout needs nothing */
    kvs_layout odd;
    REQUIRE_OK(kvs_layout_flat(&odd, 273, KVS_DTYPE_BFLOAT16));
    CHECK_OK(kvs_estimate_serialized_size(ser, &odd, &n));
    CHECK_EQ_U64(n, 409);
    kvs_layout empty = {0};
    CHECK_OK(kvs_estimate_serialized_size(ser, &empty, &n));
    CHECK_EQ_U64(n, 0);
    kvs_layout serialized;
    CHECK_OK(kvs_serialized_layout(ser, &l, &serialized));
    CHECK_EQ_INT(serialized.ngroups, 1);
    CHECK_EQ_INT(serialized.groups[0].dtype, KVS_DTYPE_UINT8);
    CHECK_EQ_U64(kvs_layout_nbytes(&serialized), 72);
}

/* 29: bf16 [2,4,64,128] randn round trip: serialize returns numel, every
 * value comes back as exactly its fp8 rounding, correlation > 0.99. */
static void test_roundtrip_bf16_randn(void)
{
    kvs_layout l = {0};
    int64_t dims[] = {2, 4, 64, 128};
    REQUIRE_OK(kvs_layout_add_group(&l, 4, dims, KVS_DTYPE_BFLOAT16));
    size_t numel = (size_t)kvs_layout_numel(&l);
    kvs_memobj *src, *back, *temp;
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &src));
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &back));
    kvs_layout tl;
    REQUIRE_OK(kvs_serialized_layout(ser, &l, &tl));
    REQUIRE_OK(kvs_memobj_alloc(&tl, KVS_FMT_BINARY_BUFFER, &temp));
    rng_state = 0;
    uint16_t *x = src->data;
    for (size_t i = 0; i < numel; i++) x[i] = bf16_of(randn());

    size_t n = 0;
    CHECK_OK(kvs_serialize(ser, src, temp, NULL, &n));
    CHECK_EQ_U64(n, numel);
    CHECK_EQ_U64(temp->used_size, tl.groups[0].shape.dims[0]); /* not narrowed here */
    const uint8_t *codes = temp->data;
    for (size_t i = 0; i < n; i++) {
        if (codes[i] != kvs_fp8_from_float(f32_of_bf16(x[i]), KVS_DTYPE_FLOAT8_E4M3FN, 1)) {
            CHECK(!"serialized byte differs from the element conversion");
            break;
        }
    }
    CHECK_OK(kvs_memobj_set_used_size(temp, n)); /* as the async layer does */
    CHECK_OK(kvs_deserialize(de, temp, back, NULL));
    const uint16_t *y = back->data;
    double sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
    size_t mismatches = 0;
    for (size_t i = 0; i < numel; i++) {
        double a = f32_of_bf16(x[i]), b = f32_of_bf16(y[i]);
        if (b != kvs_fp8_to_float(codes[i], KVS_DTYPE_FLOAT8_E4M3FN)) mismatches++;
        sx += a, sy += b, sxx += a * a, syy += b * b, sxy += a * b;
    }
    CHECK_EQ_U64(mismatches, 0);
    double cov = sxy - sx * sy / (double)numel;
    double corr = cov / sqrt((sxx - sx * sx / (double)numel) * (syy - sy * sy / (double)numel));
    CHECK(corr > 0.99);
    kvs_memobj_free(src);
    kvs_memobj_free(back);
    kvs_memobj_free(temp);
}

/* Multi-group objects: groups converted in order, packed back to back, and
 * each decoded back to its own dtype. Values exact in fp8 come back equal. */
static void test_multi_group_packing(void)
{
    kvs_layout l = {0};
    int64_t a[] = {2, 3}, b[] = {4}, c[] = {5};
    REQUIRE_OK(kvs_layout_add_group(&l, 2, a, KVS_DTYPE_BFLOAT16));
    REQUIRE_OK(kvs_layout_add_group(&l, 1, b, KVS_DTYPE_FLOAT16));
    REQUIRE_OK(kvs_layout_add_group(&l, 1, c, KVS_DTYPE_FLOAT32));
    kvs_memobj *src, *back;
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &src));
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &back));
    static const float exact[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, -0.5f};
    uint16_t *g0 = kvs_memobj_group_data(src, 0);
    uint16_t *g1 = kvs_memobj_group_data(src, 1);
    float *g2 = kvs_memobj_group_data(src, 2);
    for (int i = 0; i < 6; i++) g0[i] = bf16_of(exact[i % 8]);
    static const uint16_t f16_bits[] = {0x3C00, 0xC000, 0x3800, 0x4400}; /* 1,-2,0.5,4 */
    memcpy(g1, f16_bits, sizeof f16_bits);
    for (int i = 0; i < 5; i++) g2[i] = exact[(i + 3) % 8];

    uint8_t buf[64];
    memset(buf, 0xAA, sizeof buf);
    kvs_layout bl;
    REQUIRE_OK(kvs_layout_flat(&bl, sizeof buf, KVS_DTYPE_UINT8));
    kvs_memobj temp;
    REQUIRE_OK(kvs_memobj_init(&temp, buf, sizeof buf, &bl, KVS_FMT_BINARY_BUFFER));
    size_t n = 0;
    REQUIRE_OK(kvs_serialize(ser, src, &temp, NULL, &n));
    CHECK_EQ_U64(n, 15);
    /* e4m3fn codes: 0=0x00 0.5=0x30 1=0x38 1.5=0x3C 2=0x40 3=0x44 | 1=0x38
     * -2=0xC0 0.5=0x30 4=0x48 | 1.5=0x3C 2=0x40 3=0x44 4=0x48 -0.5=0xB0 */
    static const uint8_t expect[15] = {0x00, 0x30, 0x38, 0x3C, 0x40, 0x44, 0x38, 0xC0,
                                       0x30, 0x48, 0x3C, 0x40, 0x44, 0x48, 0xB0};
    CHECK(memcmp(buf, expect, 15) == 0);
    CHECK_EQ_INT(buf[15], 0xAA); /* nothing past the bytes written */
    CHECK_OK(kvs_memobj_set_used_size(&temp, n));
    REQUIRE_OK(kvs_deserialize(de, &temp, back, NULL));
    CHECK(memcmp(src->data, back->data, (size_t)kvs_layout_nbytes(&l)) == 0);
    kvs_memobj_free(src);
    kvs_memobj_free(back);
}

/* dst too small: refused before a byte is written. */
static void test_dst_too_small(void)
{
    kvs_layout l;
    REQUIRE_OK(kvs_layout_flat(&l, 4096, KVS_DTYPE_BFLOAT16));
    kvs_memobj *src;
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &src));
    uint8_t buf[1024];
    memset(buf, 0x5A, sizeof buf);
    kvs_layout bl;
    REQUIRE_OK(kvs_layout_flat(&bl, sizeof buf, KVS_DTYPE_UINT8));
    kvs_memobj dst;
    REQUIRE_OK(kvs_memobj_init(&dst, buf, sizeof buf, &bl, KVS_FMT_BINARY_BUFFER));
    size_t n = 99;
    CHECK_ERR(kvs_serialize(ser, src, &dst, NULL, &n), KVS_ENOSPC,
              "fp8: destination too small: 1024 bytes, need 4096");
    CHECK_EQ_U64(n, 99);
    size_t touched = 0;
    for (size_t i = 0; i < sizeof buf; i++) touched += buf[i] != 0x5A;
    CHECK_EQ_U64(touched, 0);
    kvs_memobj_free(src);
}

/* src shorter than dst's element count: refused before dst is touched. */
static void test_src_truncated(void)
{
    kvs_layout l;
    REQUIRE_OK(kvs_layout_flat(&l, 100, KVS_DTYPE_FLOAT16));
    kvs_memobj *dst;
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &dst));
    memset(dst->data, 0x77, 200);
    uint8_t codes[100];
    memset(codes, 0x38, sizeof codes);
    kvs_layout bl;
    REQUIRE_OK(kvs_layout_flat(&bl, sizeof codes, KVS_DTYPE_UINT8));
    kvs_memobj src;
    REQUIRE_OK(kvs_memobj_init(&src, codes, sizeof codes, &bl, KVS_FMT_BINARY_BUFFER));
    REQUIRE_OK(kvs_memobj_set_used_size(&src, 99));
    CHECK_ERR(kvs_deserialize(de, &src, dst, NULL), KVS_ECORRUPT,
              "fp8: stored object is 99 bytes, destination layout needs 100");
    const uint8_t *d = dst->data;
    size_t touched = 0;
    for (size_t i = 0; i < 200; i++) touched += d[i] != 0x77;
    CHECK_EQ_U64(touched, 0);
    /* exactly the element count loads */
    REQUIRE_OK(kvs_memobj_set_used_size(&src, 100));
    CHECK_OK(kvs_deserialize(de, &src, dst, NULL));
    CHECK_EQ_INT(((uint16_t *)dst->data)[99], 0x3C00); /* 1.0 in float16 */
    kvs_memobj_free(dst);
}

/* Issue 17 item 3: a stored [2,4,64,256] object into a [2,4,48,256]
 * destination (and the reverse) is refused, KVS_ECORRUPT with both sizes,
 * the destination untouched. */
static void test_wrong_size_destination_refused(void)
{
    kvs_memobj *src64 = kvs_test_kv_obj(64, 256, 0), *src48 = kvs_test_kv_obj(48, 256, 0);
    for (size_t i = 0; i < src64->capacity / 2; i++) ((uint16_t *)src64->data)[i] = 0x3F80;
    for (size_t i = 0; i < src48->capacity / 2; i++) ((uint16_t *)src48->data)[i] = 0xBF80;
    kvs_layout bl;
    kvs_memobj *blob64, *blob48;
    REQUIRE_OK(kvs_layout_flat(&bl, 131072, KVS_DTYPE_UINT8));
    REQUIRE_OK(kvs_memobj_alloc(&bl, KVS_FMT_BINARY_BUFFER, &blob64));
    REQUIRE_OK(kvs_layout_flat(&bl, 98304, KVS_DTYPE_UINT8));
    REQUIRE_OK(kvs_memobj_alloc(&bl, KVS_FMT_BINARY_BUFFER, &blob48));
    size_t n;
    REQUIRE_OK(kvs_serialize(ser, src64, blob64, NULL, &n));
    CHECK_EQ_U64(n, 131072);
    REQUIRE_OK(kvs_serialize(ser, src48, blob48, NULL, &n));
    CHECK_EQ_U64(n, 98304);
    kvs_memobj *dst48 = kvs_test_kv_obj(48, 256, 0x77);
    kvs_memobj *dst64 = kvs_test_kv_obj(64, 256, 0x77);
    CHECK_ERR(kvs_deserialize(de, blob64, dst48, NULL), KVS_ECORRUPT,
              "fp8: stored object is 131072 bytes, destination layout needs 98304");
    CHECK_ERR(kvs_deserialize(de, blob48, dst64, NULL), KVS_ECORRUPT,
              "fp8: stored object is 98304 bytes, destination layout needs 131072");
    CHECK(kvs_test_all_bytes(dst48, 0x77) && kvs_test_all_bytes(dst64, 0x77));
    /* the matching sizes load */
    CHECK_OK(kvs_deserialize(de, blob48, dst48, NULL));
    CHECK_OK(kvs_deserialize(de, blob64, dst64, NULL));
    CHECK(memcmp(dst64->data, src64->data, src64->capacity) == 0); /* +-1.0 are exact */
    CHECK(memcmp(dst48->data, src48->data, src48->capacity) == 0);
    kvs_memobj *all[] = {src64, src48, blob64, blob48, dst48, dst64};
    for (size_t i = 0; i < 6; i++) kvs_memobj_free(all[i]);
}

/* Unsupported dtypes, named, in any group, refused before writing. */
static void test_unsupported_dtypes(void)
{
    kvs_layout l = {0};
    int64_t a[] = {4}, b[] = {4};
    REQUIRE_OK(kvs_layout_add_group(&l, 1, a, KVS_DTYPE_BFLOAT16));
    REQUIRE_OK(kvs_layout_add_group(&l, 1, b, KVS_DTYPE_UINT8));
    kvs_memobj *obj;
    REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_UNDEFINED, &obj));
    uint8_t buf[16];
    memset(buf, 0x11, sizeof buf);
    kvs_layout bl;
    REQUIRE_OK(kvs_layout_flat(&bl, sizeof buf, KVS_DTYPE_UINT8));
    kvs_memobj raw;
    REQUIRE_OK(kvs_memobj_init(&raw, buf, sizeof buf, &bl, KVS_FMT_BINARY_BUFFER));
    size_t n;
    CHECK_ERR(kvs_serialize(ser, obj, &raw, NULL, &n), KVS_EINVAL,
              "fp8: unsupported source dtype 'uint8' in group 1; expected float32, "
              "float16 or bfloat16");
    CHECK_EQ_INT(buf[0], 0x11);
    CHECK_ERR(kvs_deserialize(de, &raw, obj, NULL), KVS_EINVAL,
              "fp8: unsupported destination dtype 'uint8' in group 1; expected float32, "
              "float16 or bfloat16");
    CHECK_EQ_INT(((uint8_t *)obj->data)[0], 0);
    kvs_memobj_free(obj);

    kvs_serializer *s;
    CHECK_ERR(kvs_fp8_serde_create(KVS_DTYPE_FLOAT16, 1, &s, NULL), KVS_EINVAL,
              "fp8: unsupported fp8 dtype 'float16'; expected float8_e4m3fn or "
              "float8_e5m2");
    CHECK_ERR(kvs_fp8_serde_create(KVS_DTYPE_FLOAT8_E5M2, 1, NULL, NULL), KVS_EINVAL,
              "fp8: no output requested");
    uint8_t code;
    float one = 1.0f;
    CHECK_ERR(kvs_fp8_encode(&one, KVS_DTYPE_UINT8, &code, KVS_DTYPE_FLOAT8_E4M3FN, 1, 1),
              KVS_EINVAL,
              "fp8: unsupported source dtype 'uint8'; expected float32, float16 or "
              "bfloat16");
    CHECK_ERR(kvs_fp8_decode(&code, KVS_DTYPE_FLOAT8_E4M3FN, &one, KVS_DTYPE_FLOAT8_E5M2, 1),
              KVS_EINVAL,
              "fp8: unsupported destination dtype 'float8_e5m2'; expected float32, "
              "float16 or bfloat16");
    CHECK_ERR(kvs_fp8_encode(NULL, KVS_DTYPE_FLOAT32, &code, KVS_DTYPE_FLOAT8_E4M3FN, 1, 1),
              KVS_EINVAL, "fp8: NULL buffer for 1 elements");
    CHECK_OK(kvs_fp8_encode(NULL, KVS_DTYPE_FLOAT32, NULL, KVS_DTYPE_FLOAT8_E4M3FN, 1, 0));
}

/* 30/31: missing objects are refused by the checked calls. */
static void test_null_objects(void)
{
    kvs_layout l;
    REQUIRE_OK(kvs_layout_flat(&l, 1, KVS_DTYPE_FLOAT32));
    float v = 1;
    kvs_memobj obj;
    REQUIRE_OK(kvs_memobj_init(&obj, &v, sizeof v, &l, KVS_FMT_UNDEFINED));
    size_t n;
    CHECK_ERR(kvs_serialize(ser, NULL, &obj, NULL, &n), KVS_EINVAL,
              "serde: serialize: NULL argument");
    CHECK_ERR(kvs_deserialize(de, &obj, NULL, NULL), KVS_EINVAL,
              "serde: deserialize: NULL argument");
}

/* e5m2 and the float32 / float16 destinations through the serde. */
static void test_e5m2_all_destination_dtypes(void)
{
    kvs_serializer *s5;
    kvs_deserializer *d5;
    REQUIRE_OK(kvs_fp8_serde_create(KVS_DTYPE_FLOAT8_E5M2, 1, &s5, &d5));
    float vals[6] = {1.0f, -3.0f, 57344.0f, 1e9f, 0.0f, 1.5f};
    kvs_layout l;
    REQUIRE_OK(kvs_layout_flat(&l, 6, KVS_DTYPE_FLOAT32));
    kvs_memobj src;
    REQUIRE_OK(kvs_memobj_init(&src, vals, sizeof vals, &l, KVS_FMT_UNDEFINED));
    uint8_t codes[9];
    kvs_layout bl;
    REQUIRE_OK(kvs_layout_flat(&bl, sizeof codes, KVS_DTYPE_UINT8));
    kvs_memobj temp;
    REQUIRE_OK(kvs_memobj_init(&temp, codes, sizeof codes, &bl, KVS_FMT_BINARY_BUFFER));
    size_t n;
    REQUIRE_OK(kvs_serialize(s5, &src, &temp, NULL, &n));
    static const uint8_t expect[6] = {0x3C, 0xC2, 0x7B, 0x7B, 0x00, 0x3E};
    CHECK(memcmp(codes, expect, 6) == 0);
    REQUIRE_OK(kvs_memobj_set_used_size(&temp, n));
    uint16_t f16[6];
    kvs_layout hl;
    REQUIRE_OK(kvs_layout_flat(&hl, 6, KVS_DTYPE_FLOAT16));
    kvs_memobj half;
    REQUIRE_OK(kvs_memobj_init(&half, f16, sizeof f16, &hl, KVS_FMT_UNDEFINED));
    REQUIRE_OK(kvs_deserialize(d5, &temp, &half, NULL));
    static const uint16_t f16_expect[6] = {0x3C00, 0xC200, 0x7B00, 0x7B00, 0x0000, 0x3E00};
    CHECK(memcmp(f16, f16_expect, sizeof f16) == 0);
    float back[6];
    kvs_memobj fobj;
    REQUIRE_OK(kvs_memobj_init(&fobj, back, sizeof back, &l, KVS_FMT_UNDEFINED));
    REQUIRE_OK(kvs_deserialize(d5, &temp, &fobj, NULL));
    static const float f32_expect[6] = {1.0f, -3.0f, 57344.0f, 57344.0f, 0.0f, 1.5f};
    CHECK(memcmp(back, f32_expect, sizeof back) == 0);
    kvs_serializer_destroy(s5);
    kvs_deserializer_destroy(d5);
}

int main(void)
{
    if (kvs_fp8_serde_create(KVS_DTYPE_FLOAT8_E4M3FN, 1, &ser, &de) != KVS_OK) {
        fprintf(stderr, "cannot create the fp8 serde: %s\n", kvs_last_error());
        return 1;
    }
    RUN(test_estimate_single_group);
    RUN(test_estimate_multi_group);
    RUN(test_roundtrip_bf16_randn);
    RUN(test_multi_group_packing);
    RUN(test_dst_too_small);
    RUN(test_src_truncated);
    RUN(test_unsupported_dtypes);
    RUN(test_null_objects);
    RUN(test_e5m2_all_destination_dtypes);
    RUN(test_wrong_size_destination_refused);
    kvs_serializer_destroy(ser);
    kvs_deserializer_destroy(de);
    return TEST_SUMMARY();
}
