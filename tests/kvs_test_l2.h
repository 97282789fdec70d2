/* kvs_test_l2.h - waiting for L2 tasks in tests: an event fd, a store
 * task's result, a lookup or load task's bitmap (at most WAIT_MS per wait,
 * 1000 waits). Header-only, static inline. */
#ifndef KVS_TEST_L2_H
#define KVS_TEST_L2_H

#include <errno.h>
#include <poll.h>
#include <stdio.h>

#include "kvserde/l2.h"

#ifndef WAIT_MS
#define WAIT_MS 20000
#endif

static inline int wait_fd(int fd)
{
    struct pollfd p = {fd, POLLIN, 0};
    int r;
    do r = poll(&p, 1, WAIT_MS);
    while (r < 0 && errno == EINTR);
    if (r == 1) kvs_event_fd_consume(fd, NULL);
    return r == 1;
}

static inline int store_result(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_store_result *res)
{
    for (int tries = 0; tries < 1000; tries++) {
        size_t count = 0;
        kvs_l2_store_result r[16];
        kvs_l2_pop_completed_stores(a, r, 16, &count);
        for (size_t i = 0; i < count; i++) {
            if (r[i].id == id) {
                *res = r[i];
                return KVS_OK;
            }
        }
        if (!wait_fd(kvs_l2_store_event_fd(a))) break;
    }
    fprintf(stderr, "store task %llu never finished\n", (unsigned long long)id);
    return KVS_EIO;
}

static inline int bitmap_result(kvs_l2_adapter *a, int load, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    for (int tries = 0; tries < 1000; tries++) {
        int rc = load ? kvs_l2_query_load(a, id, out) : kvs_l2_query_lookup_and_lock(a, id, out);
        if (rc) return rc;
        if (out->state != KVS_TASK_PENDING) return KVS_OK;
        if (!wait_fd(load ? kvs_l2_load_event_fd(a) : kvs_l2_lookup_event_fd(a))) break;
    }
    fprintf(stderr, "task %llu never finished\n", (unsigned long long)id);
    return KVS_EIO;
}

#endif /* KVS_TEST_L2_H */
