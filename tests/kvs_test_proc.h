/* kvs_test_proc.h - wait for an async processor's task by polling its
 * query (at most 10 s): the result, or -1 if it never finished. Header-only,
 * static inline (as kvs_test_objs.h). */
#ifndef KVS_TEST_PROC_H
#define KVS_TEST_PROC_H

#include <unistd.h>

#include "kvserde/processor.h"

static inline int kvs_test_proc_wait(kvs_processor *p, int serialize, kvs_task_id id,
                                     kvs_task_result *r)
{
    for (int i = 0; i < 10000; i++) {
        int rc = serialize ? kvs_processor_query_serialize_result(p, id, r)
                           : kvs_processor_query_deserialize_result(p, id, r);
        if (rc || r->state != KVS_TASK_PENDING) return rc;
        usleep(1000);
    }
    return -1;
}

#endif /* KVS_TEST_PROC_H */
