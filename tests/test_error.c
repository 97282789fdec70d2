/* test_error.c - status strings and the per-thread last-error message. */
#include <pthread.h>
#include <string.h>

#include "kvs_test.h"
#include "kvserde/dtype.h"
#include "kvserde/error.h"

/* Nothing has failed on this thread yet (run before anything else). */
static void test_initially_empty(void)
{
    CHECK_EQ_STR(kvs_last_error(), "");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_OK);
}

static void test_strerror_every_code(void)
{
    CHECK_EQ_STR(kvs_strerror(KVS_OK), "ok");
    CHECK_EQ_STR(kvs_strerror(KVS_EINVAL), "invalid argument");
    CHECK_EQ_STR(kvs_strerror(KVS_ENOSPC), "no space");
    CHECK_EQ_STR(kvs_strerror(KVS_ENOMEM), "out of memory");
    CHECK_EQ_STR(kvs_strerror(KVS_ECORRUPT), "corrupt input");
    CHECK_EQ_STR(kvs_strerror(KVS_EEXIST), "already exists");
    CHECK_EQ_STR(kvs_strerror(KVS_ENOTFOUND), "not found");
    CHECK_EQ_STR(kvs_strerror(KVS_ECLOSED), "closed");
    CHECK_EQ_STR(kvs_strerror(KVS_EIO), "I/O error");
    CHECK_EQ_STR(kvs_strerror(KVS_EUNSUPPORTED), "unsupported");
    CHECK_EQ_STR(kvs_strerror(KVS_EKEY), "written for another key");
    CHECK_EQ_STR(kvs_strerror(KVS_EAUTH), "authentication failed");
}

static void test_strerror_unknown(void)
{
    CHECK_EQ_STR(kvs_strerror(1), "unknown kvserde status");
    CHECK_EQ_STR(kvs_strerror(-12), "unknown kvserde status");
    CHECK_EQ_STR(kvs_strerror(12345), "unknown kvserde status");
    CHECK_EQ_STR(kvs_strerror(-2147483647 - 1), "unknown kvserde status");
}

static void test_status_values_are_abi(void)
{
    CHECK_EQ_INT(KVS_OK, 0);
    CHECK_EQ_INT(KVS_EINVAL, -1);
    CHECK_EQ_INT(KVS_ENOSPC, -2);
    CHECK_EQ_INT(KVS_ENOMEM, -3);
    CHECK_EQ_INT(KVS_ECORRUPT, -4);
    CHECK_EQ_INT(KVS_EEXIST, -5);
    CHECK_EQ_INT(KVS_ENOTFOUND, -6);
    CHECK_EQ_INT(KVS_ECLOSED, -7);
    CHECK_EQ_INT(KVS_EIO, -8);
    CHECK_EQ_INT(KVS_EUNSUPPORTED, -9);
    CHECK_EQ_INT(KVS_EKEY, -10);
    CHECK_EQ_INT(KVS_EAUTH, -11);
}

static void test_set_and_read(void)
{
    kvs_clear_error();
    CHECK_EQ_INT(kvs_set_error(KVS_ENOSPC, "fp8: destination too small: %d bytes, need %d",
                               1024, 4096),
                 KVS_ENOSPC);
    CHECK_EQ_STR(kvs_last_error(), "fp8: destination too small: 1024 bytes, need 4096");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_ENOSPC);

    /* A later failure replaces both message and code. */
    CHECK_EQ_INT(kvs_set_error(KVS_ECORRUPT, "x: %s/%u", "abc", 7u), KVS_ECORRUPT);
    CHECK_EQ_STR(kvs_last_error(), "x: abc/7");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_ECORRUPT);

    /* The status is returned and recorded as given, even an unknown one. */
    CHECK_EQ_INT(kvs_set_error(42, "odd"), 42);
    CHECK_EQ_INT(kvs_last_error_code(), 42);
    CHECK_EQ_STR(kvs_last_error(), "odd");
}

static void test_clear(void)
{
    kvs_set_error(KVS_EIO, "something broke");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_EIO);
    kvs_clear_error();
    CHECK_EQ_STR(kvs_last_error(), "");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_OK);
    /* Clearing twice is harmless. */
    kvs_clear_error();
    CHECK_EQ_STR(kvs_last_error(), "");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_OK);
}

static void test_success_does_not_clear(void)
{
    kvs_set_error(KVS_EIO, "earlier failure");
    kvs_dtype out = KVS_DTYPE_UINT8;
    CHECK_OK(kvs_dtype_parse("float16", &out));
    CHECK_EQ_INT(out, KVS_DTYPE_FLOAT16);
    CHECK_EQ_STR(kvs_last_error(), "earlier failure");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_EIO);
}

static void test_truncation(void)
{
    char longmsg[2000];
    for (size_t i = 0; i < sizeof longmsg - 1; i++) longmsg[i] = (char)('a' + i % 26);
    longmsg[sizeof longmsg - 1] = '\0';

    CHECK_EQ_INT(kvs_set_error(KVS_EINVAL, "%s", longmsg), KVS_EINVAL);
    CHECK_EQ_U64(strlen(kvs_last_error()), KVS_ERROR_MSG_MAX - 1);
    CHECK(memcmp(kvs_last_error(), longmsg, KVS_ERROR_MSG_MAX - 1) == 0);
    CHECK_EQ_INT(kvs_last_error_code(), KVS_EINVAL);

    /* Exactly KVS_ERROR_MSG_MAX - 1 characters fit untouched. */
    char fits[KVS_ERROR_MSG_MAX];
    memset(fits, 'z', sizeof fits - 1);
    fits[sizeof fits - 1] = '\0';
    kvs_set_error(KVS_EIO, "%s", fits);
    CHECK_EQ_STR(kvs_last_error(), fits);

    /* One more is cut to the same length. */
    char over[KVS_ERROR_MSG_MAX + 1];
    memset(over, 'y', sizeof over - 1);
    over[sizeof over - 1] = '\0';
    kvs_set_error(KVS_EIO, "%s", over);
    CHECK_EQ_U64(strlen(kvs_last_error()), KVS_ERROR_MSG_MAX - 1);
    CHECK(kvs_last_error()[0] == 'y' && kvs_last_error()[KVS_ERROR_MSG_MAX - 2] == 'y');
}

static void test_own_message_as_argument(void)
{
    kvs_set_error(KVS_EINVAL, "inner %d", 5);
    CHECK_EQ_INT(kvs_set_error(KVS_EIO, "outer: %s", kvs_last_error()), KVS_EIO);
    CHECK_EQ_STR(kvs_last_error(), "outer: inner 5");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_EIO);

    /* Twice in one format, and nested again. */
    kvs_set_error(KVS_EINVAL, "ab");
    kvs_set_error(KVS_EINVAL, "%s-%s", kvs_last_error(), kvs_last_error());
    CHECK_EQ_STR(kvs_last_error(), "ab-ab");
    kvs_set_error(KVS_EINVAL, "[%s]", kvs_last_error());
    CHECK_EQ_STR(kvs_last_error(), "[ab-ab]");

    /* A long inner message: the prefix shifts it, the result is truncated,
     * and the copied text is the original inner text (no overlap damage). */
    char inner[KVS_ERROR_MSG_MAX];
    for (size_t i = 0; i < sizeof inner - 1; i++) inner[i] = (char)('A' + i % 26);
    inner[sizeof inner - 1] = '\0';
    kvs_set_error(KVS_EINVAL, "%s", inner);
    kvs_set_error(KVS_EIO, "outer: %s", kvs_last_error());
    char expect[KVS_ERROR_MSG_MAX];
    memcpy(expect, "outer: ", 7);
    memcpy(expect + 7, inner, KVS_ERROR_MSG_MAX - 1 - 7);
    expect[KVS_ERROR_MSG_MAX - 1] = '\0';
    CHECK_EQ_STR(kvs_last_error(), expect);
    CHECK_EQ_U64(strlen(kvs_last_error()), KVS_ERROR_MSG_MAX - 1);
}

/* Thread-locality: a worker and the main thread interleave (barriers) and
 * each must see only its own message. */
struct tl_state {
    pthread_barrier_t barrier;
    char fresh_msg[KVS_ERROR_MSG_MAX];
    int fresh_code;
    char after_main_msg[KVS_ERROR_MSG_MAX];
    int after_main_code;
};

static void *tl_worker(void *arg)
{
    struct tl_state *st = arg;
    /* Phase 1: main has already set its message; this thread sees none. */
    snprintf(st->fresh_msg, sizeof st->fresh_msg, "%s", kvs_last_error());
    st->fresh_code = kvs_last_error_code();
    kvs_set_error(KVS_ENOTFOUND, "worker message %d", 1);
    pthread_barrier_wait(&st->barrier);
    /* Phase 2: main sets another message meanwhile. */
    pthread_barrier_wait(&st->barrier);
    snprintf(st->after_main_msg, sizeof st->after_main_msg, "%s", kvs_last_error());
    st->after_main_code = kvs_last_error_code();
    return NULL;
}

static void test_thread_local(void)
{
    struct tl_state st;
    memset(&st, 0, sizeof st);
    REQUIRE(pthread_barrier_init(&st.barrier, NULL, 2) == 0);
    kvs_set_error(KVS_EEXIST, "main message %d", 0);
    pthread_t t;
    if (pthread_create(&t, NULL, tl_worker, &st) != 0) {
        pthread_barrier_destroy(&st.barrier);
        REQUIRE(0);
    }
    pthread_barrier_wait(&st.barrier); /* worker has set its message */
    CHECK_EQ_STR(kvs_last_error(), "main message 0");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_EEXIST);
    kvs_set_error(KVS_ECLOSED, "main message %d", 2);
    pthread_barrier_wait(&st.barrier);
    pthread_join(t, NULL);
    pthread_barrier_destroy(&st.barrier);

    CHECK_EQ_STR(st.fresh_msg, "");
    CHECK_EQ_INT(st.fresh_code, KVS_OK);
    CHECK_EQ_STR(st.after_main_msg, "worker message 1");
    CHECK_EQ_INT(st.after_main_code, KVS_ENOTFOUND);
    CHECK_EQ_STR(kvs_last_error(), "main message 2");
    CHECK_EQ_INT(kvs_last_error_code(), KVS_ECLOSED);
}

int main(void)
{
    RUN(test_initially_empty); /* must run first */
    RUN(test_strerror_every_code);
    RUN(test_strerror_unknown);
    RUN(test_status_values_are_abi);
    RUN(test_set_and_read);
    RUN(test_clear);
    RUN(test_success_does_not_clear);
    RUN(test_truncation);
    RUN(test_own_message_as_argument);
    RUN(test_thread_local);
    return TEST_SUMMARY();
}
