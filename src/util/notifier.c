/* notifier.c - eventfd-backed completion signal (see notifier.h), and the
 * public kvs_event_fd_consume() that callers use on any kvserde event fd. */
#include "util/notifier.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvserde/error.h"
#include "kvserde/processor.h"

int kvs_notifier_init(kvs_notifier *n, const char *owner)
{
    /* Non-blocking so a consumer never stalls on an empty counter;
     * close-on-exec so a fork+exec in the host program does not leak it. */
    n->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (n->fd < 0)
        return kvs_set_error(KVS_EIO, "%s: cannot create eventfd: %s", owner,
                             strerror(errno));
    return KVS_OK;
}

int kvs_notifier_fd(const kvs_notifier *n) { return n->fd; }

int kvs_notifier_notify(kvs_notifier *n)
{
    if (n->fd < 0)
        return kvs_set_error(KVS_ECLOSED, "notifier: notify after close");
    /* One write of 1 per event, so the counter a consumer reads is exactly
     * the number of events since its last read. */
    const uint64_t one = 1;
    for (;;) {
        ssize_t w = write(n->fd, &one, sizeof one);
        if (w == (ssize_t)sizeof one)
            return KVS_OK;
        if (w < 0 && errno == EINTR)
            continue;
        return kvs_set_error(KVS_EIO, "notifier: write to eventfd %d failed: %s",
                             n->fd, w < 0 ? strerror(errno) : "short write");
    }
}

int kvs_notifier_consume(kvs_notifier *n, uint64_t *count)
{
    if (n->fd < 0)
        return kvs_set_error(KVS_ECLOSED, "notifier: consume after close");
    return kvs_event_fd_consume(n->fd, count);
}

void kvs_notifier_close(kvs_notifier *n)
{
    if (n->fd >= 0) {
        /* Linux releases the fd even when close() reports an error, so there
         * is nothing to retry; forget it either way. */
        (void)close(n->fd);
        n->fd = -1;
    }
}

int kvs_event_fd_consume(int fd, uint64_t *count)
{
    if (count)
        *count = 0;
    if (fd < 0)
        return kvs_set_error(KVS_EINVAL, "event fd: invalid fd %d", fd);
    uint64_t value;
    for (;;) {
        ssize_t r = read(fd, &value, sizeof value);
        if (r == (ssize_t)sizeof value) {
            if (count)
                *count = value;
            return KVS_OK;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return KVS_OK; /* counter is 0: nothing signalled */
        return kvs_set_error(KVS_EIO, "event fd: read of fd %d failed: %s", fd,
                             r < 0 ? strerror(errno) : "short read");
    }
}
