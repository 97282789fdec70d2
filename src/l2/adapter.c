/* adapter.c - the checked kvs_l2_* calls every caller goes through (the
 * generic half of l2.h). Each checks its arguments with a message of its
 * own, clears the thread's error, calls the adapter's op and then makes
 * sure a failing op left a message that goes with its code, so a caller
 * never reads a stale or missing one (as the processor's calls do). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/l2.h"
#include "kvserde/memobj.h"
#include "l2/builtins.h"

static int checked(kvs_l2_adapter *a, const char *op, int rc)
{
    if (rc < 0 && kvs_last_error_code() != rc)
        kvs_set_error(rc, "l2: %s: %s failed: %s", a->ops->name, op, kvs_strerror(rc));
    return rc;
}

#define REQUIRE_ADAPTER(a)                                                 \
    do {                                                                   \
        if ((a) == NULL)                                                   \
            return kvs_set_error(KVS_EINVAL, "l2: adapter is NULL");       \
    } while (0)

/* Keys: the array is present when n > 0 and every key is valid. */
static int check_keys(const kvs_object_key *keys, size_t n)
{
    if (n > 0 && keys == NULL)
        return kvs_set_error(KVS_EINVAL, "l2: key array is NULL with %zu keys", n);
    for (size_t i = 0; i < n; i++) {
        if (kvs_object_key_validate(&keys[i]) != KVS_OK) {
            /* Keep the validator's reason, say which key it was. */
            char reason[KVS_ERROR_MSG_MAX];
            snprintf(reason, sizeof reason, "%s", kvs_last_error());
            return kvs_set_error(KVS_EINVAL, "l2: key %zu: %s", i, reason);
        }
    }
    return KVS_OK;
}

static int check_objects(kvs_memobj *const *objects, size_t n)
{
    if (n > 0 && objects == NULL)
        return kvs_set_error(KVS_EINVAL, "l2: object array is NULL with %zu objects", n);
    for (size_t i = 0; i < n; i++)
        if (objects[i] == NULL)
            return kvs_set_error(KVS_EINVAL, "l2: object %zu is NULL", i);
    return KVS_OK;
}

static int check_id(const kvs_l2_task_id *id)
{
    if (id == NULL) return kvs_set_error(KVS_EINVAL, "l2: task id pointer is NULL");
    return KVS_OK;
}

/* A bitmap an op returned must be pending, or ok with its hits. */
static int check_bitmap(kvs_l2_adapter *a, const char *op, int rc, kvs_l2_bitmap *out)
{
    rc = checked(a, op, rc);
    if (rc != KVS_OK) return rc;
    if (out->state != KVS_TASK_PENDING && out->state != KVS_TASK_OK &&
        out->state != KVS_TASK_FAILED)
        return kvs_set_error(KVS_EINVAL, "l2: %s: %s returned unknown state %d",
                             a->ops->name, op, (int)out->state);
    return KVS_OK;
}

void kvs_l2_bitmap_release(kvs_l2_bitmap *b)
{
    if (b == NULL) return;
    free(b->hits);
    /* The hits go; state, status and message stay readable. */
    b->hits = NULL;
    b->nkeys = 0;
    b->nhits = 0;
}

int kvs_l2_store_event_fd(kvs_l2_adapter *a)
{
    REQUIRE_ADAPTER(a);
    kvs_clear_error();
    return checked(a, "store_event_fd", a->ops->store_event_fd(a));
}

int kvs_l2_lookup_event_fd(kvs_l2_adapter *a)
{
    REQUIRE_ADAPTER(a);
    kvs_clear_error();
    return checked(a, "lookup_event_fd", a->ops->lookup_event_fd(a));
}

int kvs_l2_load_event_fd(kvs_l2_adapter *a)
{
    REQUIRE_ADAPTER(a);
    kvs_clear_error();
    return checked(a, "load_event_fd", a->ops->load_event_fd(a));
}

int kvs_l2_submit_store(kvs_l2_adapter *a, const kvs_object_key *keys,
                        kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    REQUIRE_ADAPTER(a);
    int rc;
    if ((rc = check_id(id)) || (rc = check_keys(keys, n)) ||
        (rc = check_objects(objects, n)))
        return rc;
    kvs_clear_error();
    return checked(a, "submit_store", a->ops->submit_store(a, keys, objects, n, id));
}

int kvs_l2_pop_completed_stores(kvs_l2_adapter *a, kvs_l2_store_result *out, size_t cap,
                                size_t *count)
{
    REQUIRE_ADAPTER(a);
    if (count == NULL) return kvs_set_error(KVS_EINVAL, "l2: count pointer is NULL");
    *count = 0;
    if (out == NULL && cap > 0)
        return kvs_set_error(KVS_EINVAL, "l2: result array is NULL with room for %zu",
                             cap);
    kvs_clear_error();
    int rc = checked(a, "pop_completed_stores",
                     a->ops->pop_completed_stores(a, out, cap, count));
    if (rc == KVS_OK && *count > cap)
        return kvs_set_error(KVS_EINVAL, "l2: %s: pop_completed_stores returned %zu of %zu",
                             a->ops->name, *count, cap);
    return rc;
}

int kvs_l2_submit_lookup_and_lock(kvs_l2_adapter *a, const kvs_object_key *keys,
                                  size_t n, kvs_l2_task_id *id)
{
    REQUIRE_ADAPTER(a);
    int rc;
    if ((rc = check_id(id)) || (rc = check_keys(keys, n))) return rc;
    kvs_clear_error();
    return checked(a, "submit_lookup_and_lock",
                   a->ops->submit_lookup_and_lock(a, keys, n, id));
}

int kvs_l2_query_lookup_and_lock(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    REQUIRE_ADAPTER(a);
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "l2: result pointer is NULL");
    memset(out, 0, sizeof *out);
    kvs_clear_error();
    return check_bitmap(a, "query_lookup_and_lock",
                        a->ops->query_lookup_and_lock(a, id, out), out);
}

int kvs_l2_unlock(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n)
{
    REQUIRE_ADAPTER(a);
    int rc = check_keys(keys, n);
    if (rc) return rc;
    kvs_clear_error();
    return checked(a, "unlock", a->ops->unlock(a, keys, n));
}

int kvs_l2_submit_load(kvs_l2_adapter *a, const kvs_object_key *keys,
                       kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    REQUIRE_ADAPTER(a);
    int rc;
    if ((rc = check_id(id)) || (rc = check_keys(keys, n)) ||
        (rc = check_objects(objects, n)))
        return rc;
    kvs_clear_error();
    return checked(a, "submit_load", a->ops->submit_load(a, keys, objects, n, id));
}

static int submit_groups(kvs_l2_adapter *a, int load, const kvs_object_key *keys,
                         kvs_memobj *const *groups, size_t n, size_t group_size,
                         kvs_l2_task_id *id)
{
    int rc;
    if ((rc = check_id(id)) || (rc = check_keys(keys, n))) return rc;
    if (groups == NULL && n > 0)
        return kvs_set_error(KVS_EINVAL, "l2: group array is NULL with %zu groups", n);
    if (group_size == 0) return kvs_set_error(KVS_EINVAL, "l2: group size is 0");
    if (n > SIZE_MAX / group_size)
        return kvs_set_error(KVS_EINVAL, "l2: %zu groups of %zu slots overflow", n, group_size);
    kvs_clear_error();
    return checked(a, load ? "submit_load_groups" : "submit_store_groups",
                   kvs_serde_wrapper_submit_groups(a, load, keys, groups, n, group_size, id));
}

int kvs_l2_submit_store_groups(kvs_l2_adapter *a, const kvs_object_key *keys,
                               kvs_memobj *const *groups, size_t n, size_t group_size,
                               kvs_l2_task_id *id)
{
    REQUIRE_ADAPTER(a);
    return submit_groups(a, 0, keys, groups, n, group_size, id);
}

int kvs_l2_submit_load_groups(kvs_l2_adapter *a, const kvs_object_key *keys,
                              kvs_memobj *const *groups, size_t n, size_t group_size,
                              kvs_l2_task_id *id)
{
    REQUIRE_ADAPTER(a);
    return submit_groups(a, 1, keys, groups, n, group_size, id);
}

int kvs_l2_query_load(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    REQUIRE_ADAPTER(a);
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "l2: result pointer is NULL");
    memset(out, 0, sizeof *out);
    kvs_clear_error();
    return check_bitmap(a, "query_load", a->ops->query_load(a, id, out), out);
}

int kvs_l2_delete(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                  uint8_t *deleted)
{
    REQUIRE_ADAPTER(a);
    int rc = check_keys(keys, n);
    if (rc) return rc;
    kvs_clear_error();
    return checked(a, "delete", a->ops->delete_keys(a, keys, n, deleted));
}

int kvs_l2_object_sizes(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                        int64_t *sizes)
{
    REQUIRE_ADAPTER(a);
    int rc = check_keys(keys, n);
    if (rc) return rc;
    if (n > 0 && sizes == NULL)
        return kvs_set_error(KVS_EINVAL, "l2: sizes array is NULL with %zu keys", n);
    kvs_clear_error();
    return checked(a, "object_sizes", a->ops->object_sizes(a, keys, n, sizes));
}

/* The caller's callback, with its stop value recorded: that value is
 * returned as it is (any int), only the adapter's own failures get the
 * message check. */
typedef struct list_call {
    kvs_l2_key_fn fn;
    void *ctx;
    int stopped, stop;
} list_call;

static int list_trampoline(void *ctx, const kvs_object_key *key)
{
    list_call *c = ctx;
    int rc = c->fn(c->ctx, key);
    if (rc != 0) {
        c->stopped = 1;
        c->stop = rc;
    }
    return rc;
}

int kvs_l2_list_keys(kvs_l2_adapter *a, kvs_l2_key_fn fn, void *ctx)
{
    REQUIRE_ADAPTER(a);
    if (fn == NULL) return kvs_set_error(KVS_EINVAL, "l2: key callback is NULL");
    if (a->ops->list_keys == NULL) /* a table without the member: cannot list */
        return kvs_set_error(KVS_EUNSUPPORTED, "%s: listing keys is not supported",
                             a->ops->name);
    list_call c = {fn, ctx, 0, 0};
    kvs_clear_error();
    int rc = a->ops->list_keys(a, list_trampoline, &c);
    if (c.stopped) return c.stop;
    /* An adapter may have met (and skipped) names that are not keys. */
    if (rc == KVS_OK) kvs_clear_error();
    return checked(a, "list_keys", rc);
}

int kvs_l2_get_usage(kvs_l2_adapter *a, kvs_l2_usage *out)
{
    REQUIRE_ADAPTER(a);
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "l2: usage pointer is NULL");
    kvs_clear_error();
    return checked(a, "usage", a->ops->usage(a, out));
}

int kvs_l2_status(kvs_l2_adapter *a, json_t **out)
{
    REQUIRE_ADAPTER(a);
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "l2: status pointer is NULL");
    *out = NULL;
    kvs_clear_error();
    int rc = checked(a, "status", a->ops->status(a, out));
    if (rc == KVS_OK && (*out == NULL || !json_is_object(*out))) {
        json_decref(*out);
        *out = NULL;
        return kvs_set_error(KVS_EINVAL, "l2: %s: status did not return a JSON object",
                             a->ops->name);
    }
    return rc;
}

int kvs_l2_close(kvs_l2_adapter *a)
{
    REQUIRE_ADAPTER(a);
    kvs_clear_error();
    return checked(a, "close", a->ops->close(a));
}

void kvs_l2_destroy(kvs_l2_adapter *a)
{
    if (a == NULL) return;
    /* destroy ops may assume a closed adapter; if close fails nothing can
     * be freed safely (as kvs_processor_destroy). */
    if (a->ops->close(a) != KVS_OK) return;
    a->ops->destroy(a);
}

int kvs_l2_load_wrong_size(const kvs_memobj *obj, uint64_t stored, uint64_t *need)
{
    if (obj->format == KVS_FMT_BINARY || obj->format == KVS_FMT_BINARY_BUFFER) return 0;
    *need = kvs_layout_nbytes(&obj->layout);
    return stored != *need;
}
