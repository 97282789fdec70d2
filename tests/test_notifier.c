/* test_notifier.c - the eventfd notifier: flags, one write of 1 per notify,
 * consume resets, idempotent close. */
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include "kvs_test.h"
#include "util/notifier.h"

static void test_flags_and_counting(void)
{
    kvs_notifier n;
    REQUIRE_OK(kvs_notifier_init(&n, "test"));
    int fd = kvs_notifier_fd(&n);
    CHECK(fd >= 0);
    CHECK(fcntl(fd, F_GETFL) & O_NONBLOCK);
    CHECK(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    uint64_t c = 99;
    CHECK_OK(kvs_notifier_consume(&n, &c));
    CHECK_EQ_U64(c, 0);
    struct pollfd pfd = {fd, POLLIN, 0};
    CHECK_EQ_INT(poll(&pfd, 1, 0), 0);
    CHECK_OK(kvs_notifier_notify(&n));
    CHECK_OK(kvs_notifier_notify(&n));
    CHECK_OK(kvs_notifier_notify(&n));
    CHECK_EQ_INT(poll(&pfd, 1, 0), 1);
    CHECK_OK(kvs_notifier_consume(&n, &c));
    CHECK_EQ_U64(c, 3);
    CHECK_EQ_INT(poll(&pfd, 1, 0), 0);
    kvs_notifier_close(&n);
    CHECK_EQ_INT(kvs_notifier_fd(&n), -1);
    CHECK(fcntl(fd, F_GETFD) == -1);
    kvs_notifier_close(&n); /* idempotent */
    CHECK_ERR(kvs_notifier_notify(&n), KVS_ECLOSED, "notifier: notify after close");
    CHECK_ERR(kvs_notifier_consume(&n, &c), KVS_ECLOSED, "notifier: consume after close");
}

static kvs_notifier shared;

static void *notify_many(void *arg)
{
    for (int i = 0; i < 10000; i++)
        kvs_notifier_notify(&shared);
    return arg;
}

/* Concurrent notifies are never lost. */
static void test_concurrent_notifies_add_up(void)
{
    REQUIRE_OK(kvs_notifier_init(&shared, "test"));
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        REQUIRE(pthread_create(&t[i], NULL, notify_many, NULL) == 0);
    uint64_t total = 0, c;
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    CHECK_OK(kvs_notifier_consume(&shared, &c));
    total += c;
    CHECK_EQ_U64(total, 40000);
    kvs_notifier_close(&shared);
}

int main(void)
{
    RUN(test_flags_and_counting);
    RUN(test_concurrent_notifies_add_up);
    return TEST_SUMMARY();
}
