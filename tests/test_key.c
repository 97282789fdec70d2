/* test_key.c - object keys (upstream ObjectKey). */
#include <stdint.h>
#include <string.h>

#include "kvs_test.h"
#include "kvserde/memobj.h"

static const uint8_t HASH[8] = {0xde, 0xad, 0xbe, 0xef, 0x00, 0x01, 0x02, 0x03};

static void poison(kvs_object_key *k)
{
    memset(k, 0xA5, sizeof *k);
}

static int is_poisoned(const kvs_object_key *k)
{
    const unsigned char *p = (const unsigned char *)k;
    for (size_t i = 0; i < sizeof *k; i++)
        if (p[i] != 0xA5) return 0;
    return 1;
}

/* A string of n copies of c (n < cap). */
static char *repeat(char *buf, size_t cap, char c, size_t n)
{
    if (n >= cap) n = cap - 1;
    memset(buf, c, n);
    buf[n] = '\0';
    return buf;
}

static void test_init_fields(void)
{
    kvs_object_key k;
    poison(&k);
    REQUIRE_OK(kvs_object_key_init(&k, HASH, sizeof HASH, "meta-llama/Llama-3-8B", 3, 7,
                                   "tenant-A"));
    CHECK_EQ_U64(k.chunk_hash_len, 8);
    CHECK(memcmp(k.chunk_hash, HASH, 8) == 0);
    CHECK_EQ_STR(k.model_name, "meta-llama/Llama-3-8B");
    CHECK_EQ_INT(k.kv_rank, 3);
    CHECK_EQ_INT(k.object_group_id, 7);
    CHECK_EQ_STR(k.cache_salt, "tenant-A");
    CHECK_OK(kvs_object_key_validate(&k));
}

static void test_init_defaults(void)
{
    kvs_object_key k;
    poison(&k);
    /* NULL salt means "", an empty hash may be NULL, an empty model name and
     * negative kv_rank are allowed. */
    REQUIRE_OK(kvs_object_key_init(&k, NULL, 0, "", -1, 0, NULL));
    CHECK_EQ_U64(k.chunk_hash_len, 0);
    CHECK_EQ_STR(k.model_name, "");
    CHECK_EQ_STR(k.cache_salt, "");
    CHECK_EQ_INT(k.kv_rank, -1);
    CHECK_EQ_INT(k.object_group_id, 0);
    CHECK_OK(kvs_object_key_validate(&k));
}

static void test_init_limits_accepted(void)
{
    char model[KVS_MODEL_NAME_MAX + 2], salt[KVS_CACHE_SALT_MAX + 2];
    uint8_t hash[KVS_CHUNK_HASH_MAX];
    for (size_t i = 0; i < sizeof hash; i++) hash[i] = (uint8_t)i;
    kvs_object_key k;
    REQUIRE_OK(kvs_object_key_init(&k, hash, KVS_CHUNK_HASH_MAX,
                                   repeat(model, sizeof model, 'm', 255), INT64_MAX,
                                   INT64_MAX, repeat(salt, sizeof salt, 's', 128)));
    CHECK_EQ_U64(strlen(k.model_name), 255);
    CHECK_EQ_U64(strlen(k.cache_salt), 128);
    CHECK_EQ_U64(k.chunk_hash_len, KVS_CHUNK_HASH_MAX);
    CHECK(memcmp(k.chunk_hash, hash, sizeof hash) == 0);
    CHECK_EQ_INT(k.object_group_id, INT64_MAX);
    CHECK_OK(kvs_object_key_validate(&k));
    /* Characters forbidden in the salt are fine in the model name. */
    CHECK_OK(kvs_object_key_init(&k, HASH, 8, "org/model\\v2", 0, 0, "a-b_c.d:e"));
}

static void test_model_name_refusals(void)
{
    kvs_object_key k;
    poison(&k);
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, "llama@3", 0, 0, NULL), KVS_EINVAL,
              "key: model name 'llama@3' contains '@'");
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, "@", 0, 0, NULL), KVS_EINVAL,
              "key: model name '@' contains '@'");
    char model[KVS_MODEL_NAME_MAX + 8];
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, repeat(model, sizeof model, 'm', 256), 0, 0,
                                  NULL),
              KVS_EINVAL, "key: model name longer than 255 characters");
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, repeat(model, sizeof model, 'm', 260), 0, 0,
                                  NULL),
              KVS_EINVAL, "key: model name longer than 255 characters");
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, NULL, 0, 0, NULL), KVS_EINVAL,
              "key: NULL model name");
    CHECK(is_poisoned(&k));
}

static void test_cache_salt_refusals(void)
{
    kvs_object_key k;
    poison(&k);
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, "m", 0, 0, "a@b"), KVS_EINVAL,
              "key: cache salt 'a@b' contains '@'");
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, "m", 0, 0, "a/b"), KVS_EINVAL,
              "key: cache salt 'a/b' contains '/'");
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, "m", 0, 0, "a\\b"), KVS_EINVAL,
              "key: cache salt 'a\\b' contains '\\'");
    /* The first offending character is named. */
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, "m", 0, 0, "x/y@z"), KVS_EINVAL,
              "key: cache salt 'x/y@z' contains '/'");
    char salt[KVS_CACHE_SALT_MAX + 8];
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, "m", 0, 0,
                                  repeat(salt, sizeof salt, 's', 129)),
              KVS_EINVAL, "key: cache salt longer than 128 characters");
    CHECK(is_poisoned(&k));
}

static void test_other_refusals(void)
{
    kvs_object_key k;
    poison(&k);
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, "m", 0, -1, NULL), KVS_EINVAL,
              "key: object group id -1 is negative");
    CHECK_ERR(kvs_object_key_init(&k, HASH, 8, "m", 0, INT64_MIN, NULL), KVS_EINVAL,
              "key: object group id -9223372036854775808 is negative");
    uint8_t big[KVS_CHUNK_HASH_MAX + 1];
    memset(big, 1, sizeof big);
    CHECK_ERR(kvs_object_key_init(&k, big, KVS_CHUNK_HASH_MAX + 1, "m", 0, 0, NULL),
              KVS_EINVAL, "key: chunk hash is 129 bytes, at most 128");
    CHECK_ERR(kvs_object_key_init(&k, NULL, 5, "m", 0, 0, NULL), KVS_EINVAL,
              "key: NULL chunk hash of length 5");
    CHECK(is_poisoned(&k));
    CHECK_ERR(kvs_object_key_init(NULL, HASH, 8, "m", 0, 0, NULL), KVS_EINVAL,
              "key: NULL output");
}

static void make_key(kvs_object_key *k)
{
    memset(k, 0, sizeof *k);
    kvs_object_key_init(k, HASH, sizeof HASH, "model", 1, 2, "salt");
}

static void test_validate_hand_built(void)
{
    kvs_object_key k;

    make_key(&k);
    REQUIRE_OK(kvs_object_key_validate(&k));

    make_key(&k);
    k.chunk_hash_len = KVS_CHUNK_HASH_MAX + 1;
    CHECK_ERR(kvs_object_key_validate(&k), KVS_EINVAL,
              "key: chunk hash is 129 bytes, at most 128");

    make_key(&k);
    memset(k.model_name, 'm', sizeof k.model_name); /* no NUL anywhere */
    CHECK_ERR(kvs_object_key_validate(&k), KVS_EINVAL,
              "key: model name is not NUL-terminated");

    make_key(&k);
    memset(k.cache_salt, 's', sizeof k.cache_salt);
    CHECK_ERR(kvs_object_key_validate(&k), KVS_EINVAL,
              "key: cache salt is not NUL-terminated");

    /* 255 characters plus the NUL in the last byte is fine. */
    make_key(&k);
    memset(k.model_name, 'm', KVS_MODEL_NAME_MAX);
    k.model_name[KVS_MODEL_NAME_MAX] = '\0';
    CHECK_OK(kvs_object_key_validate(&k));

    make_key(&k);
    strcpy(k.model_name, "a@b");
    CHECK_ERR(kvs_object_key_validate(&k), KVS_EINVAL,
              "key: model name 'a@b' contains '@'");

    make_key(&k);
    strcpy(k.cache_salt, "t\\u");
    CHECK_ERR(kvs_object_key_validate(&k), KVS_EINVAL,
              "key: cache salt 't\\u' contains '\\'");

    make_key(&k);
    k.object_group_id = -5;
    CHECK_ERR(kvs_object_key_validate(&k), KVS_EINVAL,
              "key: object group id -5 is negative");

    /* Garbage after the terminator is ignored. */
    make_key(&k);
    k.model_name[10] = '@';
    k.cache_salt[20] = '/';
    CHECK_OK(kvs_object_key_validate(&k));

    CHECK_ERR(kvs_object_key_validate(NULL), KVS_EINVAL, "key: NULL key");
}

static void test_equal(void)
{
    kvs_object_key a, b;
    make_key(&a);
    make_key(&b);
    CHECK_EQ_INT(kvs_object_key_equal(&a, &b), 1);
    CHECK_EQ_INT(kvs_object_key_equal(&a, &a), 1);

    /* Bytes past chunk_hash_len do not count. */
    b.chunk_hash[100] = 0x77;
    CHECK_EQ_INT(kvs_object_key_equal(&a, &b), 1);

    make_key(&b);
    b.chunk_hash[7] ^= 1;
    CHECK_EQ_INT(kvs_object_key_equal(&a, &b), 0);

    make_key(&b);
    b.chunk_hash_len = 7; /* a prefix of a's hash */
    CHECK_EQ_INT(kvs_object_key_equal(&a, &b), 0);

    make_key(&b);
    strcpy(b.model_name, "model2");
    CHECK_EQ_INT(kvs_object_key_equal(&a, &b), 0);

    make_key(&b);
    b.kv_rank = 0;
    CHECK_EQ_INT(kvs_object_key_equal(&a, &b), 0);

    make_key(&b);
    b.object_group_id = 3;
    CHECK_EQ_INT(kvs_object_key_equal(&a, &b), 0);

    make_key(&b);
    strcpy(b.cache_salt, "");
    CHECK_EQ_INT(kvs_object_key_equal(&a, &b), 0);
    CHECK_EQ_INT(kvs_object_key_equal(&b, &a), 0);

    /* Keys built independently from the same fields are equal, even if the
     * destinations held different garbage before init (NULL salt == ""). */
    kvs_object_key c, d;
    memset(&c, 0x11, sizeof c);
    memset(&d, 0x22, sizeof d);
    REQUIRE_OK(kvs_object_key_init(&c, HASH, 4, "m", 0, 0, NULL));
    REQUIRE_OK(kvs_object_key_init(&d, HASH, 4, "m", 0, 0, ""));
    CHECK_EQ_INT(kvs_object_key_equal(&c, &d), 1);
}

int main(void)
{
    RUN(test_init_fields);
    RUN(test_init_defaults);
    RUN(test_init_limits_accepted);
    RUN(test_model_name_refusals);
    RUN(test_cache_salt_refusals);
    RUN(test_other_refusals);
    RUN(test_validate_hand_built);
    RUN(test_equal);
    return TEST_SUMMARY();
}
