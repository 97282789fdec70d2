/* kvs_test_list.h - the kvs_l2_list_keys() contract (kvserde/l2.h), checked
 * the same way on every adapter: each adapter's test stores keys its own
 * way, then hands the adapter and its keys to kvs_test_list_contract().
 * Header-only, static inline (as kvs_test_objs.h); needs kvs_test.h. */
#ifndef KVS_TEST_LIST_H
#define KVS_TEST_LIST_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvs_test.h"
#include "kvserde/l2.h"
#include "kvserde/memobj.h"

/* What a listing reported. stop_after > 0: stop (returning stop_value)
 * once that many keys are in. */
typedef struct kvs_test_listing {
    kvs_object_key keys[4096];
    size_t n;
    size_t stop_after;
    int stop_value;
    int overflow;
} kvs_test_listing;

static inline int kvs_test_listing_add(void *ctx, const kvs_object_key *key)
{
    kvs_test_listing *l = ctx;
    if (l->n == sizeof l->keys / sizeof *l->keys) {
        l->overflow = 1;
        return -1000;
    }
    l->keys[l->n++] = *key;
    return l->stop_after && l->n >= l->stop_after ? l->stop_value : 0;
}

/* 1 if the listing holds each keys[i] whose want[i] is set exactly once
 * and nothing else (want NULL: every key). */
static inline int kvs_test_listing_is(const kvs_test_listing *l, const kvs_object_key *keys,
                                      size_t n, const uint8_t *want)
{
    size_t wanted = 0;
    for (size_t i = 0; i < n; i++) {
        if (want && !want[i]) continue;
        wanted++;
        size_t seen = 0;
        for (size_t j = 0; j < l->n; j++) seen += kvs_object_key_equal(&keys[i], &l->keys[j]);
        if (seen != 1) {
            fprintf(stderr, "listing: key %zu reported %zu times\n", i, seen);
            return 0;
        }
    }
    if (l->n != wanted) fprintf(stderr, "listing: %zu keys, %zu wanted\n", l->n, wanted);
    return !l->overflow && l->n == wanted;
}

/* keys[0..n) (n >= 1) are stored in `a` and nothing else is: each is
 * listed once; a callback returning 7 at the first key gets 7 back, with
 * no further call. */
static inline void kvs_test_list_all_then_stop(kvs_l2_adapter *a, const kvs_object_key *keys,
                                               size_t n)
{
    kvs_test_listing *l = calloc(1, sizeof *l);
    REQUIRE(l != NULL);
    CHECK_OK(kvs_l2_list_keys(a, kvs_test_listing_add, l));
    CHECK(kvs_test_listing_is(l, keys, n, NULL));
    memset(l, 0, sizeof *l);
    l->stop_after = 1;
    l->stop_value = 7;
    CHECK_EQ_INT(kvs_l2_list_keys(a, kvs_test_listing_add, l), 7);
    CHECK_EQ_INT(l->n, 1);
    free(l);
}

/* A callback that calls back into the adapter: deletes each key listed. */
typedef struct kvs_test_deleter {
    kvs_l2_adapter *a;
    size_t listed, deleted;
} kvs_test_deleter;

static inline int kvs_test_delete_listed(void *ctx, const kvs_object_key *key)
{
    kvs_test_deleter *d = ctx;
    uint8_t gone = 0;
    int rc = kvs_l2_delete(d->a, key, 1, &gone);
    d->listed++;
    d->deleted += gone;
    return rc;
}

/* keys[0..n) (n >= 4, at most 4096) are stored in `a` and nothing else is:
 * listed once each; after deleting every other one, the rest; a callback's
 * stop value ends the listing and is returned; a NULL callback is refused;
 * a callback may call back into the adapter (it deletes every key); then
 * `a` is closed and listing refused with KVS_ECLOSED (`closed_msg`). The
 * caller destroys `a`. */
static inline void kvs_test_list_contract(kvs_l2_adapter *a, const kvs_object_key *keys,
                                          size_t n, const char *closed_msg)
{
    kvs_test_listing *l = calloc(1, sizeof *l);
    uint8_t *want = calloc(n, 1), *deleted = calloc(n, 1);
    kvs_object_key *evens = calloc(n, sizeof *evens);
    REQUIRE(l && want && deleted && evens);
    kvs_test_list_all_then_stop(a, keys, n);

    size_t ne = 0;
    for (size_t i = 0; i < n; i += 2) evens[ne++] = keys[i];
    CHECK_OK(kvs_l2_delete(a, evens, ne, deleted));
    for (size_t i = 0; i < n; i++) want[i] = i % 2 == 1;
    for (size_t i = 0; i < ne; i++) CHECK_EQ_INT(deleted[i], 1);
    memset(l, 0, sizeof *l);
    CHECK_OK(kvs_l2_list_keys(a, kvs_test_listing_add, l));
    CHECK(kvs_test_listing_is(l, keys, n, want));

    /* stopping early: any value, a negative one too, is returned as it is */
    memset(l, 0, sizeof *l);
    l->stop_after = 2;
    l->stop_value = KVS_EIO;
    CHECK_EQ_INT(kvs_l2_list_keys(a, kvs_test_listing_add, l), KVS_EIO);
    CHECK_EQ_INT(l->n, 2);

    CHECK_ERR(kvs_l2_list_keys(a, NULL, NULL), KVS_EINVAL, "l2: key callback is NULL");
    CHECK_ERR(kvs_l2_list_keys(NULL, kvs_test_listing_add, l), KVS_EINVAL,
              "l2: adapter is NULL");
    kvs_test_deleter d = {a, 0, 0};
    CHECK_OK(kvs_l2_list_keys(a, kvs_test_delete_listed, &d));
    CHECK_EQ_INT(d.listed, n / 2);
    CHECK_EQ_INT(d.deleted, n / 2);
    memset(l, 0, sizeof *l);
    CHECK_OK(kvs_l2_list_keys(a, kvs_test_listing_add, l));
    CHECK_EQ_INT(l->n, 0);

    CHECK_OK(kvs_l2_close(a));
    CHECK_ERR(kvs_l2_list_keys(a, kvs_test_listing_add, l), KVS_ECLOSED, closed_msg);
    free(evens);
    free(deleted);
    free(want);
    free(l);
}

#endif /* KVS_TEST_LIST_H */
