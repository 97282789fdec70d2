/* task_queue.c - see task_queue.h. */
#include "l2/task_queue.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvserde/error.h"

int kvs_l2_tq_init(kvs_l2_task_queue *q, const char *owner)
{
    memset(q, 0, sizeof *q);
    q->owner = owner;
    for (int d = 0; d < 3; d++) q->fds[d].fd = -1;
    for (int d = 0; d < 3; d++) {
        int rc = kvs_notifier_init(&q->fds[d], owner);
        if (rc) {
            for (int e = 0; e < d; e++) kvs_notifier_close(&q->fds[e]);
            return rc;
        }
    }
    pthread_mutex_init(&q->lock, NULL);
    pthread_cond_init(&q->submits_done, NULL);
    kvs_result_map_init(&q->bitmaps[0]);
    kvs_result_map_init(&q->bitmaps[1]);
    return KVS_OK;
}

int kvs_l2_tq_fd(kvs_l2_task_queue *q, kvs_l2_direction d)
{
    /* Under the lock: close_fds() may run on another thread at once. */
    pthread_mutex_lock(&q->lock);
    int fd = kvs_notifier_fd(&q->fds[d]);
    pthread_mutex_unlock(&q->lock);
    if (fd < 0) return kvs_set_error(KVS_ECLOSED, "%s: adapter is closed", q->owner);
    return fd;
}

static void free_task(kvs_l2_task *t)
{
    if (t) free(t->bitmap.hits);
    free(t);
}

int kvs_l2_tq_begin(kvs_l2_task_queue *q, kvs_l2_direction d, size_t nkeys,
                    kvs_l2_task **out)
{
    kvs_l2_task *t = calloc(1, sizeof *t);
    if (t && d != KVS_L2_STORE && nkeys > 0 && !(t->bitmap.hits = calloc(nkeys, 1))) {
        free(t);
        t = NULL;
    }
    if (t == NULL)
        return kvs_set_error(KVS_ENOMEM, "%s: out of memory for a task of %zu keys",
                             q->owner, nkeys);
    t->direction = d;
    t->store.state = KVS_TASK_OK;
    t->bitmap.state = KVS_TASK_OK;
    t->bitmap.nkeys = nkeys;

    pthread_mutex_lock(&q->lock);
    int rc = KVS_OK;
    if (q->closed)
        rc = kvs_set_error(KVS_ECLOSED, "%s: submit after close", q->owner);
    else if (d != KVS_L2_STORE && kvs_result_map_reserve(&q->bitmaps[d - 1]) != KVS_OK)
        rc = kvs_set_error(KVS_ENOMEM, "%s: out of memory for a result slot", q->owner);
    if (rc == KVS_OK) {
        t->id = q->next_id++;
        t->store.id = t->id;
        q->submitting++;
    }
    pthread_mutex_unlock(&q->lock);
    if (rc) {
        free_task(t);
        return rc;
    }
    *out = t;
    return KVS_OK;
}

void kvs_l2_tq_end_submit(kvs_l2_task_queue *q)
{
    pthread_mutex_lock(&q->lock);
    if (--q->submitting == 0) pthread_cond_broadcast(&q->submits_done);
    pthread_mutex_unlock(&q->lock);
}

void kvs_l2_tq_fail(kvs_l2_task *t, int status, const char *message)
{
    int *slot = t->direction == KVS_L2_STORE ? &t->store.status : &t->bitmap.status;
    char *msg = t->direction == KVS_L2_STORE ? t->store.message : t->bitmap.message;
    if (*slot != KVS_OK) return; /* the first error wins */
    *slot = status;
    snprintf(msg, KVS_ERROR_MSG_MAX, "%s", message);
    if (t->direction == KVS_L2_STORE) {
        t->store.state = KVS_TASK_FAILED;
        t->store.bytes_written = 0;
    }
}

void kvs_l2_tq_hit(kvs_l2_task *t, size_t i)
{
    if (!t->bitmap.hits[i]) {
        t->bitmap.hits[i] = 1;
        t->bitmap.nhits++;
    }
}

void kvs_l2_tq_set_hook(kvs_l2_task_queue *q, kvs_l2_direction d, kvs_completion_hook hook)
{
    pthread_mutex_lock(&q->lock);
    q->hooks[d] = hook;
    pthread_mutex_unlock(&q->lock);
}

void kvs_l2_tq_complete(kvs_l2_task_queue *q, kvs_l2_task *t)
{
    kvs_l2_direction d = t->direction;
    kvs_l2_task_id id = t->id;
    pthread_mutex_lock(&q->lock);
    if (d == KVS_L2_STORE) {
        if (t->store.state == KVS_TASK_FAILED) t->store.bytes_written = 0;
        if (q->stores_tail) q->stores_tail->next = t;
        else q->stores_head = t;
        q->stores_tail = t;
    } else {
        /* Cannot fail: begin() reserved the slot and ids are unique. */
        kvs_result_map_put_reserved(&q->bitmaps[d - 1], t->id, t);
    }
    kvs_completion_hook hook = q->hooks[d];
    pthread_mutex_unlock(&q->lock);
    /* Result first, then the signal (DESIGN.md: completion). t may be
     * popped and freed by now: only id from here on. */
    if (hook.fn)
        hook.fn(hook.ctx, id);
    else
        kvs_notifier_notify(&q->fds[d]);
}

void kvs_l2_tq_pop_stores(kvs_l2_task_queue *q, kvs_l2_store_result *out, size_t cap,
                          size_t *count)
{
    size_t n = 0;
    pthread_mutex_lock(&q->lock);
    while (n < cap && q->stores_head) {
        kvs_l2_task *t = q->stores_head;
        q->stores_head = t->next;
        if (!q->stores_head) q->stores_tail = NULL;
        out[n++] = t->store;
        free_task(t);
    }
    pthread_mutex_unlock(&q->lock);
    *count = n;
}

void kvs_l2_tq_query(kvs_l2_task_queue *q, kvs_l2_direction d, kvs_l2_task_id id,
                     kvs_l2_bitmap *out)
{
    pthread_mutex_lock(&q->lock);
    kvs_l2_task *t = kvs_result_map_pop(&q->bitmaps[d - 1], id);
    pthread_mutex_unlock(&q->lock);
    memset(out, 0, sizeof *out);
    if (t == NULL) {
        out->state = KVS_TASK_PENDING;
        return;
    }
    *out = t->bitmap;
    t->bitmap.hits = NULL; /* the caller owns it now */
    free_task(t);
}

int kvs_l2_tq_close_begin(kvs_l2_task_queue *q)
{
    pthread_mutex_lock(&q->lock);
    int first = !q->closed;
    q->closed = 1;
    while (q->submitting > 0) pthread_cond_wait(&q->submits_done, &q->lock);
    pthread_mutex_unlock(&q->lock);
    return first;
}

int kvs_l2_tq_is_closed(kvs_l2_task_queue *q)
{
    pthread_mutex_lock(&q->lock);
    int closed = q->closed;
    pthread_mutex_unlock(&q->lock);
    return closed;
}

void kvs_l2_tq_close_fds(kvs_l2_task_queue *q)
{
    pthread_mutex_lock(&q->lock);
    for (int d = 0; d < 3; d++) kvs_notifier_close(&q->fds[d]);
    pthread_mutex_unlock(&q->lock);
}

static void free_task_value(void *v) { free_task(v); }

void kvs_l2_tq_destroy(kvs_l2_task_queue *q)
{
    kvs_l2_tq_close_fds(q);
    while (q->stores_head) {
        kvs_l2_task *t = q->stores_head;
        q->stores_head = t->next;
        free_task(t);
    }
    q->stores_tail = NULL;
    kvs_result_map_destroy(&q->bitmaps[0], free_task_value);
    kvs_result_map_destroy(&q->bitmaps[1], free_task_value);
    pthread_cond_destroy(&q->submits_done);
    pthread_mutex_destroy(&q->lock);
}
