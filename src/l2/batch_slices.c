/* batch_slices.c - see batch_slices.h. */
#include "l2/batch_slices.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvserde/export.h"

static void free_batch(kvs_l2_batch *b)
{
    free(b->keys);
    free(b->objects);
    free(b->hit);
    free(b);
}

/* Merge the slices in key order and complete the task. */
static void finish_batch(kvs_l2_batch *b)
{
    kvs_l2_task *t = b->t;
    if (t->direction == KVS_L2_STORE) {
        uint64_t bytes = 0;
        for (unsigned k = 0; k < b->nslices; k++) bytes += b->slices[k].bytes;
        t->store.bytes_written = bytes;
    } else {
        for (size_t i = 0; i < b->n; i++)
            if (b->hit[i]) kvs_l2_tq_hit(t, i);
    }
    for (unsigned k = 0; k < b->nslices; k++) {
        if (b->slices[k].status != KVS_OK) {
            kvs_l2_tq_fail(t, b->slices[k].status, b->slices[k].message);
            break;
        }
    }
    kvs_l2_task_queue *q = b->runner.q;
    free_batch(b);
    /* The queue owns the record from here; the adapter outlives this call
     * (close joins the workers before anything is freed). */
    kvs_l2_tq_complete(q, t);
}

static void run_slice_job(kvs_job *job)
{
    kvs_l2_slice *s = KVS_CONTAINER_OF(job, kvs_l2_slice, job);
    kvs_l2_batch *b = s->batch;
    b->runner.run(s);
    /* The last slice merges (acq_rel: it sees every other slice's work). */
    if (atomic_fetch_sub(&b->remaining, 1) == 1) finish_batch(b);
}

int kvs_l2_batch_submit(const kvs_l2_batch_runner *runner, kvs_l2_direction d,
                        const kvs_object_key *keys, kvs_memobj *const *objects, size_t n,
                        kvs_l2_task_id *id)
{
    kvs_l2_task_queue *q = runner->q;
    /* Everything that can fail happens before the task takes an id. */
    unsigned nslices = n < runner->max_slices ? (unsigned)n : runner->max_slices;
    if (n > SIZE_MAX / sizeof(kvs_object_key))
        return kvs_set_error(KVS_ENOMEM, "%s: batch of %zu keys is too large", q->owner, n);
    kvs_l2_batch *b = calloc(1, sizeof *b + (size_t)nslices * sizeof(kvs_l2_slice));
    int oom = b == NULL;
    if (!oom && n > 0) {
        b->keys = malloc(n * sizeof *keys);
        if (d != KVS_L2_LOOKUP) b->objects = malloc(n * sizeof *objects);
        if (d != KVS_L2_STORE) b->hit = calloc(n, 1);
        oom = b->keys == NULL || (d != KVS_L2_LOOKUP && b->objects == NULL) ||
              (d != KVS_L2_STORE && b->hit == NULL);
    }
    if (oom) {
        if (b) free_batch(b);
        return kvs_set_error(KVS_ENOMEM, "%s: out of memory for a task of %zu keys",
                             q->owner, n);
    }
    b->runner = *runner;
    b->n = n;
    b->nslices = nslices;
    if (n) memcpy(b->keys, keys, n * sizeof *keys);
    if (n && b->objects) memcpy(b->objects, objects, n * sizeof *objects);
    atomic_init(&b->remaining, nslices);
    size_t begin = 0;
    for (unsigned k = 0; k < nslices; k++) {
        kvs_l2_slice *s = &b->slices[k];
        size_t count = n / nslices + (k < n % nslices);
        s->job.run = run_slice_job;
        s->batch = b;
        s->begin = begin;
        s->end = begin + count;
        begin = s->end;
    }

    int rc = kvs_l2_tq_begin(q, d, n, &b->t);
    if (rc != KVS_OK) {
        free_batch(b);
        return rc;
    }
    *id = b->t->id;
    if (n == 0) {
        /* Nothing to do: finish at once (before end_submit, so close cannot
         * have closed the fd in between). */
        finish_batch(b);
    } else {
        /* b stays alive until every slice has run, hence until after the
         * last submit below. */
        for (unsigned k = 0; k < nslices; k++) {
            kvs_job *job = &b->slices[k].job;
            /* Cannot fail: close stops the pool only after every submit in
             * progress has ended. Run it here rather than lose the task. */
            if (kvs_thread_pool_submit(runner->pool, job) != KVS_OK) run_slice_job(job);
        }
    }
    kvs_l2_tq_end_submit(q);
    return KVS_OK;
}

void kvs_l2_slice_fail(kvs_l2_slice *s, int status, const char *fmt, ...)
{
    if (s->status != KVS_OK) return; /* the slice's first error wins */
    s->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->message, sizeof s->message, fmt, ap);
    va_end(ap);
}
