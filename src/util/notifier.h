/* notifier.h - a completion signal a poll loop can wait on (an eventfd).
 *
 * Producers call kvs_notifier_notify() once per finished unit of work; the
 * consumer polls kvs_notifier_fd() for POLLIN and drains the counter with
 * kvs_notifier_consume(). The counter sums notifications, so none is lost
 * when several land between two polls. Shared by the async processor and
 * the L2 adapters.
 *
 * notify and consume may run on any threads at once (the kernel serializes
 * them). close must not race with either: callers close only after the
 * producers have stopped.
 */
#ifndef KVS_UTIL_NOTIFIER_H
#define KVS_UTIL_NOTIFIER_H

#include <stdint.h>

typedef struct kvs_notifier {
    int fd; /* -1 once closed (or before init) */
} kvs_notifier;

/* Open the eventfd (counter 0, EFD_NONBLOCK | EFD_CLOEXEC). `owner` names the
 * component in the message on failure: "processor: cannot create eventfd:
 * Too many open files" (KVS_EIO). n->fd is -1 on failure. */
int kvs_notifier_init(kvs_notifier *n, const char *owner);

/* The fd to poll, or -1 once closed. */
int kvs_notifier_fd(const kvs_notifier *n);

/* Add 1 to the counter: exactly one 8-byte write of the value 1.
 * KVS_ECLOSED when closed; KVS_EIO if the write fails (only possible when
 * the counter would pass 2^64 - 2, i.e. nobody ever drains it). */
int kvs_notifier_notify(kvs_notifier *n);

/* Read and reset the counter into *count (may be NULL); 0 if nothing was
 * signalled. KVS_ECLOSED when closed. */
int kvs_notifier_consume(kvs_notifier *n, uint64_t *count);

/* Close the fd. Idempotent: a second call does nothing. */
void kvs_notifier_close(kvs_notifier *n);

#endif /* KVS_UTIL_NOTIFIER_H */
