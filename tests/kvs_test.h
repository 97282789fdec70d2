/* kvs_test.h - the minimal assertion harness every test file uses.
 *
 * A test file defines static void test_*(void) functions and a main() that
 * runs them with RUN(test_x) and ends with `return TEST_SUMMARY();`, which
 * prints "<file>: N passed, N failed" and returns non-zero if anything
 * failed. A failed CHECK prints file:line and the values, and the test goes
 * on (so one run shows every failure); REQUIRE returns from the test.
 */
#ifndef KVS_TEST_H
#define KVS_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "kvserde/error.h"

static int kvs_test_checks_failed_in_test;
static int kvs_tests_passed;
static int kvs_tests_failed;

#define KVS_FAIL_(...)                                                     \
    do {                                                                   \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                    \
        fprintf(stderr, __VA_ARGS__);                                      \
        fputc('\n', stderr);                                               \
        kvs_test_checks_failed_in_test++;                                  \
    } while (0)

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) KVS_FAIL_("CHECK failed: %s", #cond);                 \
    } while (0)

#define REQUIRE(cond)                                                      \
    do {                                                                   \
        if (!(cond)) {                                                     \
            KVS_FAIL_("REQUIRE failed: %s", #cond);                        \
            return;                                                        \
        }                                                                  \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                 \
    do {                                                                   \
        long long a_ = (long long)(a), b_ = (long long)(b);                \
        if (a_ != b_)                                                      \
            KVS_FAIL_("%s == %s failed: %lld != %lld", #a, #b, a_, b_);    \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                 \
    do {                                                                   \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                   \
        if (a_ != b_)                                                      \
            KVS_FAIL_("%s == %s failed: %" PRIu64 " != %" PRIu64, #a, #b,  \
                      a_, b_);                                             \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                 \
    do {                                                                   \
        const char *a_ = (a), *b_ = (b);                                   \
        if (a_ == NULL || b_ == NULL || strcmp(a_, b_) != 0)               \
            KVS_FAIL_("%s == %s failed:\n    got      \"%s\"\n    expected \"%s\"", \
                      #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)");     \
    } while (0)

/* The call returned `code` and the thread's message equals `msg` exactly. */
#define CHECK_ERR(call, code, msg)                                         \
    do {                                                                   \
        int rc_ = (call);                                                  \
        if (rc_ != (code))                                                 \
            KVS_FAIL_("%s returned %d (%s), expected %d (%s); message: %s",\
                      #call, rc_, kvs_strerror(rc_), (int)(code),          \
                      kvs_strerror(code), kvs_last_error());               \
        else CHECK_EQ_STR(kvs_last_error(), (msg));                        \
    } while (0)

/* The call returned KVS_OK; otherwise print the message. */
#define CHECK_OK(call)                                                     \
    do {                                                                   \
        int rc_ = (call);                                                  \
        if (rc_ != KVS_OK)                                                 \
            KVS_FAIL_("%s returned %d (%s): %s", #call, rc_,               \
                      kvs_strerror(rc_), kvs_last_error());                \
    } while (0)

#define REQUIRE_OK(call)                                                   \
    do {                                                                   \
        int rc_ = (call);                                                  \
        if (rc_ != KVS_OK) {                                               \
            KVS_FAIL_("%s returned %d (%s): %s", #call, rc_,               \
                      kvs_strerror(rc_), kvs_last_error());                \
            return;                                                        \
        }                                                                  \
    } while (0)

#define RUN(fn)                                                            \
    do {                                                                   \
        kvs_test_checks_failed_in_test = 0;                                \
        fn();                                                              \
        if (kvs_test_checks_failed_in_test) {                              \
            kvs_tests_failed++;                                            \
            fprintf(stderr, "FAIL %s\n", #fn);                             \
        } else {                                                           \
            kvs_tests_passed++;                                            \
        }                                                                  \
    } while (0)

#define TEST_SUMMARY()                                                     \
    (printf("%s: %d passed, %d failed\n", __FILE__, kvs_tests_passed,      \
            kvs_tests_failed),                                             \
     kvs_tests_failed ? 1 : 0)

#endif /* KVS_TEST_H */
