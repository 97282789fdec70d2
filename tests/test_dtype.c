/* test_dtype.c - element type sizes, names and parsing. */
#include <limits.h>

#include "kvs_test.h"
#include "kvserde/dtype.h"

#define UNKNOWN_TAIL "; known: uint8, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2"

static void test_values_are_stable(void)
{
    CHECK_EQ_INT(KVS_DTYPE_UINT8, 0);
    CHECK_EQ_INT(KVS_DTYPE_FLOAT32, 1);
    CHECK_EQ_INT(KVS_DTYPE_FLOAT16, 2);
    CHECK_EQ_INT(KVS_DTYPE_BFLOAT16, 3);
    CHECK_EQ_INT(KVS_DTYPE_FLOAT8_E4M3FN, 4);
    CHECK_EQ_INT(KVS_DTYPE_FLOAT8_E5M2, 5);
    CHECK_EQ_INT(KVS_DTYPE_COUNT, 6);
}

static void test_sizes(void)
{
    CHECK_EQ_U64(kvs_dtype_size(KVS_DTYPE_UINT8), 1);
    CHECK_EQ_U64(kvs_dtype_size(KVS_DTYPE_FLOAT32), 4);
    CHECK_EQ_U64(kvs_dtype_size(KVS_DTYPE_FLOAT16), 2);
    CHECK_EQ_U64(kvs_dtype_size(KVS_DTYPE_BFLOAT16), 2);
    CHECK_EQ_U64(kvs_dtype_size(KVS_DTYPE_FLOAT8_E4M3FN), 1);
    CHECK_EQ_U64(kvs_dtype_size(KVS_DTYPE_FLOAT8_E5M2), 1);
}

static void test_names(void)
{
    CHECK_EQ_STR(kvs_dtype_name(KVS_DTYPE_UINT8), "uint8");
    CHECK_EQ_STR(kvs_dtype_name(KVS_DTYPE_FLOAT32), "float32");
    CHECK_EQ_STR(kvs_dtype_name(KVS_DTYPE_FLOAT16), "float16");
    CHECK_EQ_STR(kvs_dtype_name(KVS_DTYPE_BFLOAT16), "bfloat16");
    CHECK_EQ_STR(kvs_dtype_name(KVS_DTYPE_FLOAT8_E4M3FN), "float8_e4m3fn");
    CHECK_EQ_STR(kvs_dtype_name(KVS_DTYPE_FLOAT8_E5M2), "float8_e5m2");
}

static void test_valid(void)
{
    for (int d = 0; d < KVS_DTYPE_COUNT; d++) CHECK_EQ_INT(kvs_dtype_valid(d), 1);
    CHECK_EQ_INT(kvs_dtype_valid(-1), 0);
    CHECK_EQ_INT(kvs_dtype_valid(KVS_DTYPE_COUNT), 0);
    CHECK_EQ_INT(kvs_dtype_valid(100), 0);
    CHECK_EQ_INT(kvs_dtype_valid(INT_MAX), 0);
    CHECK_EQ_INT(kvs_dtype_valid(INT_MIN), 0);
}

static void test_invalid_values(void)
{
    const int bad[] = {-1, KVS_DTYPE_COUNT, 7, 255, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ_U64(kvs_dtype_size((kvs_dtype)bad[i]), 0);
        CHECK_EQ_STR(kvs_dtype_name((kvs_dtype)bad[i]), "invalid");
    }
}

static void test_parse_roundtrip(void)
{
    /* Every name parses back to its dtype, bare and with "torch.". */
    for (int d = 0; d < KVS_DTYPE_COUNT; d++) {
        kvs_dtype out = (kvs_dtype)((d + 1) % KVS_DTYPE_COUNT);
        CHECK_OK(kvs_dtype_parse(kvs_dtype_name((kvs_dtype)d), &out));
        CHECK_EQ_INT(out, d);
        char torch[64];
        snprintf(torch, sizeof torch, "torch.%s", kvs_dtype_name((kvs_dtype)d));
        out = (kvs_dtype)((d + 1) % KVS_DTYPE_COUNT);
        CHECK_OK(kvs_dtype_parse(torch, &out));
        CHECK_EQ_INT(out, d);
    }
}

static void test_parse_literals(void)
{
    kvs_dtype out = KVS_DTYPE_UINT8;
    CHECK_OK(kvs_dtype_parse("bfloat16", &out));
    CHECK_EQ_INT(out, KVS_DTYPE_BFLOAT16);
    CHECK_OK(kvs_dtype_parse("torch.float8_e4m3fn", &out));
    CHECK_EQ_INT(out, KVS_DTYPE_FLOAT8_E4M3FN);
    CHECK_OK(kvs_dtype_parse("torch.uint8", &out));
    CHECK_EQ_INT(out, KVS_DTYPE_UINT8);
    CHECK_OK(kvs_dtype_parse("float8_e5m2", &out));
    CHECK_EQ_INT(out, KVS_DTYPE_FLOAT8_E5M2);
}

static void test_parse_refusals(void)
{
    kvs_dtype out = KVS_DTYPE_FLOAT16;
    CHECK_ERR(kvs_dtype_parse("float64", &out), KVS_EINVAL,
              "dtype: unknown dtype 'float64'" UNKNOWN_TAIL);
    /* The message quotes the name as given, prefix included. */
    CHECK_ERR(kvs_dtype_parse("torch.int8", &out), KVS_EINVAL,
              "dtype: unknown dtype 'torch.int8'" UNKNOWN_TAIL);
    CHECK_ERR(kvs_dtype_parse("", &out), KVS_EINVAL,
              "dtype: unknown dtype ''" UNKNOWN_TAIL);
    CHECK_ERR(kvs_dtype_parse("torch.", &out), KVS_EINVAL,
              "dtype: unknown dtype 'torch.'" UNKNOWN_TAIL);
    /* Only one prefix is stripped; names are case-sensitive and exact. */
    CHECK_ERR(kvs_dtype_parse("torch.torch.float32", &out), KVS_EINVAL,
              "dtype: unknown dtype 'torch.torch.float32'" UNKNOWN_TAIL);
    CHECK_ERR(kvs_dtype_parse("Float32", &out), KVS_EINVAL,
              "dtype: unknown dtype 'Float32'" UNKNOWN_TAIL);
    CHECK_ERR(kvs_dtype_parse("float32 ", &out), KVS_EINVAL,
              "dtype: unknown dtype 'float32 '" UNKNOWN_TAIL);
    CHECK_ERR(kvs_dtype_parse("float", &out), KVS_EINVAL,
              "dtype: unknown dtype 'float'" UNKNOWN_TAIL);
    CHECK_ERR(kvs_dtype_parse("torch_float16", &out), KVS_EINVAL,
              "dtype: unknown dtype 'torch_float16'" UNKNOWN_TAIL);
    CHECK_ERR(kvs_dtype_parse("invalid", &out), KVS_EINVAL,
              "dtype: unknown dtype 'invalid'" UNKNOWN_TAIL);
    /* *out untouched by every refusal. */
    CHECK_EQ_INT(out, KVS_DTYPE_FLOAT16);
}

static void test_parse_null(void)
{
    kvs_dtype out = KVS_DTYPE_BFLOAT16;
    CHECK_ERR(kvs_dtype_parse(NULL, &out), KVS_EINVAL, "dtype: NULL argument");
    CHECK_EQ_INT(out, KVS_DTYPE_BFLOAT16);
    CHECK_ERR(kvs_dtype_parse("float32", NULL), KVS_EINVAL, "dtype: NULL argument");
}

int main(void)
{
    RUN(test_values_are_stable);
    RUN(test_sizes);
    RUN(test_names);
    RUN(test_valid);
    RUN(test_invalid_values);
    RUN(test_parse_roundtrip);
    RUN(test_parse_literals);
    RUN(test_parse_refusals);
    RUN(test_parse_null);
    return TEST_SUMMARY();
}
