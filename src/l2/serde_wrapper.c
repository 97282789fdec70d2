/* serde_wrapper.c - the serde L2 wrapper (upstream SerdeL2AdapterWrapper):
 * an L2 adapter around any inner adapter and any serde processor. Stores
 * serialize first, loads deserialize after; lookup, unlock, delete, sizes
 * and usage pass straight through to the inner adapter.
 *
 * Two shapes, one implementation: around a single-output serde processor
 * (objects in, blobs out) or a multi-output one (groups of optional slots
 * in, blobs out: the multi shape). Only the proc_* calls below tell them
 * apart; a task holds `slots` pointers per key (1, or the group size). In
 * the multi shape, whole KV chunks become K/V views of their memory
 * (chunk_views) and go the group path.
 *
 * Life of a store task (ids and results come from the shared task queue):
 *   submit    (caller) refuse a batch of mixed layouts; take an id; take n
 *             temps of the processor's estimate for object 0's layout from
 *             the pool (all or nothing); under the lock, register the task
 *             and submit_serialize(objects -> temps).
 *   SERIALIZE (chained) the serialize finished: the processor narrowed
 *             each temp to the bytes it wrote, so the inner adapter stores
 *             only those. Submit the inner store with the caller's keys.
 *   STORE     (chained) the inner store finished (popped from the inner):
 *             release the temps, complete with the inner's result.
 * Life of a load task:
 *   submit    (caller) temps as for a store (sized from the destination
 *             layout's estimate); under the lock, register and submit the
 *             inner load into the temps.
 *   LOAD      (chained) the inner load finished: it set each found
 *             temp's used size to the stored size. No key found: complete
 *             with the inner bitmap. Otherwise submit_deserialize of only the
 *             found temps into their destinations.
 *   DESER     (chained) ok: complete with the inner bitmap (a partial
 *             inner load keeps its bits). Failed: the processor stopped at
 *             one object, and the objects before it were deserialized; that
 *             key's bit is cleared and its error recorded (after the inner
 *             load's, if any: the first error wins), and the found keys
 *             after it are submitted again as a new batch, so one damaged
 *             blob costs only its own bit (docs/decisions.md). Temps are
 *             released when the last batch has finished.
 * Any failure on the way (pool exhausted, a refused submit, a failed
 * serialize or inner store) releases the temps and completes the task as
 * failed at once: no task hangs, no temp leaks.
 *
 * Chaining: a phase ends on the thread that finished it, which submits the
 * next phase itself (the processor's worker submits the inner store, the
 * inner adapter's worker submits the deserialize, the last phase's thread
 * completes the task), through completion hooks (util/completion_hook.h)
 * on the async processors and on the built-in adapters' task queues
 * (l2/adapter_base.h: fs, memory, redis). A store or a load then costs
 * three thread wake-ups (caller -> first phase's worker -> second phase's
 * worker -> caller) where handing each phase back to a poll thread cost
 * five, and two, as the bare adapter, when its transform is small enough
 * to run inline on the thread at hand (INLINE_MAX_BYTES; docs/performance.md,
 * "Small objects through the serde wrapper"). A store of large objects
 * goes on in pieces (PIECE_BYTES), each chained on its own.
 * A processor or an inner adapter that cannot call a hook (a third
 * party's) signals its fd as before, and the wrapper's poll thread moves
 * those phases on. Within a phase tasks move on in submission order (l2.h:
 * oldest first): the phase lists are FIFO.
 *
 * Locking: one mutex (mu) guards the task lists, the pool and the in-flight
 * count. Submits to the processor and the inner adapter are made while
 * holding it, together with the registration of the task, so a completion
 * (drained under the same lock, by a hook or the poll thread) is never seen
 * before its task is known. The lock order is mu, then the processor's or
 * the inner adapter's own locks: they call hooks with their locks released,
 * and a hook never waits for mu: when another thread (or its own, inside a
 * submit) holds it, the hook leaves the phase marked pending for the holder
 * to drain when it lets go. So holding mu across their submits cannot
 * deadlock, and a completion never puts its thread to sleep on mu.
 *
 * Close (decided here; upstream abandons in-flight tasks without signalling
 * them): refuse new submits, then let every task in flight run through all
 * its phases to the end - the processor and the inner adapter are still
 * open, so each one completes (ok or failed) and signals exactly as it would
 * have - then stop the poll thread, close the processor and the inner
 * adapter, free the pooled temps and close the fds. This is the processor's
 * own rule ("close with tasks queued or running: they run to the end and
 * signal"), applied to the whole pipeline. A second or racing close waits
 * for the first to finish and returns KVS_OK. Only the first close reports
 * an error (the processor's or the inner adapter's close failing); the
 * wrapper is closed and released either way.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "kvserde/error.h"
#include "kvserde/export.h"
#include "kvserde/l2.h"
#include "kvserde/memobj.h"
#include "kvserde/multi_processor.h"
#include "kvserde/processor.h"
#include "l2/adapter_base.h"
#include "l2/builtins.h"
#include "l2/task_queue.h"
#include "serde/processor_hooks.h"
#include "util/completion_hook.h"
#include "util/prefault.h"

#define OWNER "serde wrapper"
#define DEFAULT_POOL_BYTES (UINT64_C(1) << 30)
#define TEMP_ALIGN 64
/* Idle temps kept for reuse (they also count against the pool budget). */
#define MAX_CACHED_TEMPS 1024
#define POP_BATCH 16
/* A store of several objects whose temps add up to more than this goes on
 * in pieces of about this many temp bytes: each piece is stored as soon as
 * it is serialized, so the inner adapter's writes overlap the serialize of
 * the next pieces instead of waiting for the whole batch. */
#define PIECE_BYTES ((size_t)4 << 20)
/* A serialize or deserialize whose objects (both sides) add up to at most
 * this runs inline (processor_hooks.h): well under a thread wake-up's cost. */
#define INLINE_MAX_BYTES ((size_t)128 << 10)

/* ---------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------ */

/* One temporary buffer: a flat uint8 object of exactly `size` bytes. */
struct temp {
    kvs_memobj obj;
    size_t size;
    struct temp *next; /* idle list */
};

enum phase { PH_SERIALIZE = 0, PH_STORE = 1, PH_LOAD = 2, PH_DESER = 3, NPHASES = 4 };

struct wtask {
    kvs_l2_task *t;             /* the result record (owned until completed) */
    enum phase phase;
    uint64_t sub_id;            /* the processor's or the inner adapter's id */
    size_t n;
    size_t slots;               /* pointers per item in objs / sel_dst: 1 (the
                                   single shape) or the multi serde's group size */
    kvs_object_key *keys;       /* the caller's keys, copied at submit: the
                                   serde sees these, never temp keys */
    kvs_memobj **objs;          /* n x slots: the caller's objects, or its groups
                                   (NULL = absent slot) */
    kvs_memobj *views;          /* whole KV chunks on a multi wrapper: the
                                   n x 2 K/V views objs points at (owned) */
    struct temp **temps;        /* n temps */
    kvs_memobj **tobjs;         /* &temps[i]->obj, the arrays handed on */
    size_t temp_size;           /* bytes per temp */
    /* load only */
    uint8_t *hits;              /* the inner load's bitmap */
    int inner_status;
    char inner_message[KVS_ERROR_MSG_MAX];
    kvs_memobj **sel_src, **sel_dst; /* the found keys' temps / destinations
                                        (sel_dst: slots per key) */
    kvs_object_key *sel_keys;   /* and their keys */
    size_t *sel_idx;            /* each found key's index in the task */
    size_t nsel, sel_off;       /* found keys; the first one not yet deserialized */
    struct wtask *prev, *next;  /* the phase's list */
    /* A store in pieces: each piece is a wtask of its own on the phase
     * lists, whose arrays point into its whole task's (borrowed, not
     * freed with the piece) and whose t is the whole task's. The whole
     * task is on no list; it completes when its last piece finishes. */
    struct wtask *whole;        /* a piece: its whole task; else NULL */
    size_t pieces_left;         /* the whole task: pieces not yet finished */
};

struct wrapper {
    kvs_l2_adapter base;
    kvs_l2_adapter *inner;
    /* The serde: exactly one of the two. The multi shape (mproc) takes
     * groups of gs slots; everything else is shared. */
    kvs_processor *proc;
    kvs_multi_processor *mproc;
    size_t gs;                  /* mproc's group size; 0 in the single shape */
    char serde_name[64];        /* for messages */
    kvs_l2_task_queue tq;
    int tq_ready;

    /* Each phase's completion fd, and whether the phase is hooked instead:
     * its completions then call phase_done() on the thread that finished
     * the phase, and the poll thread does not wait on the fd. Set at create,
     * before the poll thread starts; read-only after. */
    int phase_fd[NPHASES];
    int hooked[NPHASES];
    kvs_notifier wake;

    pthread_t thread;
    int thread_started;

    /* close()'s sleep until no task is in flight: a count that moves when
     * inflight drops to 0 (not a condition of mu: see wait_idle) */
    pthread_mutex_t idle_mu;
    pthread_cond_t idle_cv;
    uint64_t idle_seq;          /* guarded by idle_mu */

    pthread_mutex_t mu;         /* guards everything below; held only
                                   between lock_mu and unlock_mu */
    struct wtask *heads[NPHASES], *tails[NPHASES]; /* each phase's tasks, FIFO */
    _Atomic int pending[NPHASES]; /* a hooked completion found mu held: the
                                     holder drains the phase (not guarded) */
    size_t inflight;
    int stop;
    /* the temp pool */
    uint64_t pool_capacity;
    uint64_t pool_in_use;       /* bytes of temps held by tasks */
    uint64_t pool_cached;       /* bytes of idle temps kept for reuse */
    size_t temps_in_use, temps_cached;
    uint64_t temps_allocated;   /* temps ever made (a reused one is not counted) */
    struct temp *idle_temps;
    uint64_t peak_in_use;

    pthread_mutex_t close_mu;   /* serializes close() callers */
    int closed;                 /* guarded by close_mu */
};

static void lock_mu(struct wrapper *w);
static void unlock_mu(struct wrapper *w, struct temp **to_free);

static struct wrapper *wr_of(kvs_l2_adapter *a)
{
    return KVS_CONTAINER_OF(a, struct wrapper, base);
}

/* ---------------------------------------------------------------------
 * The serde, either shape: the only place the two differ
 * ------------------------------------------------------------------ */

static int proc_submit_serialize(struct wrapper *w, kvs_memobj *const *src,
                                 kvs_memobj *const *dst, size_t n,
                                 const kvs_object_key *keys, kvs_task_id *id)
{
    if (w->mproc)
        return kvs_multi_processor_submit_serialize(w->mproc, src, n, w->gs, dst, n, keys, id);
    return kvs_processor_submit_serialize(w->proc, src, n, dst, n, keys, id);
}

static int proc_submit_deserialize(struct wrapper *w, kvs_memobj *const *src,
                                   kvs_memobj *const *dst, size_t n,
                                   const kvs_object_key *keys, kvs_task_id *id)
{
    if (w->mproc)
        return kvs_multi_processor_submit_deserialize(w->mproc, src, n, dst, n, w->gs, keys,
                                                      id);
    return kvs_processor_submit_deserialize(w->proc, src, n, dst, n, keys, id);
}

static int proc_query(struct wrapper *w, int deser, kvs_task_id id, kvs_task_result *r)
{
    if (w->mproc)
        return deser ? kvs_multi_processor_query_deserialize_result(w->mproc, id, r)
                     : kvs_multi_processor_query_serialize_result(w->mproc, id, r);
    return deser ? kvs_processor_query_deserialize_result(w->proc, id, r)
                 : kvs_processor_query_serialize_result(w->proc, id, r);
}

/* The serializer's estimate for one item (an object, or a group of w->gs
 * slots with NULL where a slot is absent). */
static int proc_estimate(struct wrapper *w, kvs_memobj *const *item, size_t *est)
{
    if (w->mproc == NULL)
        return kvs_processor_estimate_serialized_size(w->proc, &item[0]->layout, est);
    const kvs_layout **layouts = calloc(w->gs, sizeof *layouts);
    if (layouts == NULL) return kvs_set_error(KVS_ENOMEM, "%s: out of memory", OWNER);
    for (size_t j = 0; j < w->gs; j++) layouts[j] = item[j] ? &item[j]->layout : NULL;
    int rc = kvs_multi_processor_estimate_serialized_size(w->mproc, layouts, w->gs, est);
    free(layouts);
    return rc;
}

static int proc_close(struct wrapper *w)
{
    return w->mproc ? kvs_multi_processor_close(w->mproc) : kvs_processor_close(w->proc);
}

/* ---------------------------------------------------------------------
 * The temp pool
 * ------------------------------------------------------------------ */

static void temp_free(struct temp *t)
{
    if (t) free(t->obj.data);
    free(t);
}

static struct temp *temp_new(size_t size)
{
    if (size > SIZE_MAX - TEMP_ALIGN) return NULL;
    size_t alloc = (size + TEMP_ALIGN - 1) / TEMP_ALIGN * TEMP_ALIGN;
    if (alloc == 0) alloc = TEMP_ALIGN;
    struct temp *t = calloc(1, sizeof *t);
    if (t == NULL) return NULL;
    /* Not zero-filled: every byte a consumer reads was written first (the
     * serializer's output, or the inner load's stored bytes). Its pages are
     * mapped here, in one call, rather than faulted in one by one under the
     * serializer's stores; the pool then keeps the temp for later tasks. */
    void *data = aligned_alloc(TEMP_ALIGN, alloc);
    if (data) kvs_prefault(data, alloc);
    kvs_layout layout;
    if (data == NULL || kvs_layout_flat(&layout, size, KVS_DTYPE_UINT8) != KVS_OK ||
        kvs_memobj_init(&t->obj, data, size, &layout, KVS_FMT_BINARY_BUFFER) != KVS_OK) {
        free(data);
        free(t);
        return NULL;
    }
    t->size = size;
    return t;
}

/* Put temps back: cache them for reuse (the budget already covers them) or
 * free them. Called with mu held; frees happen after. */
static void pool_release_locked(struct wrapper *w, struct temp **temps, size_t n,
                                size_t size, struct temp **to_free)
{
    for (size_t i = 0; i < n; i++) {
        struct temp *t = temps[i];
        if (t == NULL) continue;
        temps[i] = NULL;
        w->pool_in_use -= size;
        w->temps_in_use--;
        if (w->temps_cached < MAX_CACHED_TEMPS) {
            t->next = w->idle_temps;
            w->idle_temps = t;
            w->pool_cached += size;
            w->temps_cached++;
        } else {
            t->next = *to_free;
            *to_free = t;
        }
    }
}

static void free_list(struct temp *t)
{
    while (t) {
        struct temp *next = t->next;
        temp_free(t);
        t = next;
    }
}

/* All or nothing: n temps of `size` bytes into temps[0..n), or a failure
 * with nothing held. */
static int pool_reserve(struct wrapper *w, size_t n, size_t size, struct temp **temps)
{
    if (n == 0) return KVS_OK;
    uint64_t need = (uint64_t)n * size;
    int overflow = size != 0 && need / size != n;
    struct temp *to_free = NULL;

    lock_mu(w);
    uint64_t free_bytes = w->pool_capacity - w->pool_in_use;
    if (overflow || need > free_bytes) {
        uint64_t cap = w->pool_capacity;
        unlock_mu(w, &to_free);
        if (overflow)
            return kvs_set_error(KVS_ENOMEM,
                                 "%s: temp pool exhausted: need %zu temps of %zu bytes, "
                                 "%" PRIu64 " of %" PRIu64 " free",
                                 OWNER, n, size, free_bytes, cap);
        return kvs_set_error(KVS_ENOMEM,
                             "%s: temp pool exhausted: need %" PRIu64
                             " bytes for %zu temps, %" PRIu64 " of %" PRIu64 " free",
                             OWNER, need, n, free_bytes, cap);
    }
    w->pool_in_use += need;
    w->temps_in_use += n;
    if (w->pool_in_use > w->peak_in_use) w->peak_in_use = w->pool_in_use;
    /* Reuse idle temps of this size. */
    size_t got = 0;
    for (struct temp **pp = &w->idle_temps; *pp && got < n;) {
        struct temp *t = *pp;
        if (t->size == size) {
            *pp = t->next;
            t->next = NULL;
            temps[got++] = t;
            w->pool_cached -= size;
            w->temps_cached--;
        } else {
            pp = &t->next;
        }
    }
    /* Make room for the new ones (pool_in_use already counts them): in use
     * plus cached stays within the budget. */
    while (w->idle_temps && w->pool_in_use + w->pool_cached > w->pool_capacity) {
        struct temp *t = w->idle_temps;
        w->idle_temps = t->next;
        w->pool_cached -= t->size;
        w->temps_cached--;
        t->next = to_free;
        to_free = t;
    }
    unlock_mu(w, &to_free);

    for (size_t i = got; i < n; i++) {
        temps[i] = temp_new(size);
        if (temps[i] == NULL) {
            lock_mu(w);
            pool_release_locked(w, temps, i, size, &to_free);
            /* the temps never allocated were counted too */
            w->pool_in_use -= (uint64_t)(n - i) * size;
            w->temps_in_use -= n - i;
            unlock_mu(w, &to_free);
            return kvs_set_error(KVS_ENOMEM, "%s: cannot allocate a temp of %zu bytes",
                                 OWNER, size);
        }
    }
    if (got < n) {
        lock_mu(w);
        w->temps_allocated += n - got;
        unlock_mu(w, &to_free);
    }
    for (size_t i = 0; i < got; i++)
        (void)kvs_memobj_set_used_size(&temps[i]->obj, size); /* undo any narrowing */
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * Tasks
 * ------------------------------------------------------------------ */

static void wtask_free(struct wtask *wt)
{
    if (wt == NULL) return;
    if (wt->whole) { /* a piece: its arrays are the whole task's */
        free(wt);
        return;
    }
    free(wt->keys);
    free(wt->objs);
    free(wt->views);
    free(wt->temps);
    free(wt->tobjs);
    free(wt->hits);
    free(wt->sel_src);
    free(wt->sel_dst);
    free(wt->sel_keys);
    free(wt->sel_idx);
    free(wt);
}

static struct wtask *wtask_new(const kvs_object_key *keys, kvs_memobj *const *objs,
                               size_t n, size_t slots, int is_store)
{
    struct wtask *wt = calloc(1, sizeof *wt);
    if (wt == NULL) return NULL;
    wt->n = n;
    wt->slots = slots;
    int ok = (wt->objs = calloc(n * slots, sizeof *wt->objs)) != NULL &&
             (wt->temps = calloc(n, sizeof *wt->temps)) != NULL &&
             (wt->tobjs = calloc(n, sizeof *wt->tobjs)) != NULL;
    if (ok) ok = (wt->keys = malloc(n * sizeof *wt->keys)) != NULL;
    if (ok && !is_store)
        ok = (wt->hits = calloc(n, 1)) != NULL &&
             (wt->sel_src = calloc(n, sizeof *wt->sel_src)) != NULL &&
             (wt->sel_dst = calloc(n * slots, sizeof *wt->sel_dst)) != NULL &&
             (wt->sel_keys = malloc(n * sizeof *wt->sel_keys)) != NULL &&
             (wt->sel_idx = calloc(n, sizeof *wt->sel_idx)) != NULL;
    if (!ok) {
        wtask_free(wt);
        return NULL;
    }
    memcpy(wt->keys, keys, n * sizeof *keys);
    memcpy(wt->objs, objs, n * slots * sizeof *objs);
    return wt;
}

/* A phase's list is in submission order (l2.h: oldest first): tasks are
 * added at the tail and drains walk from the head, so tasks that finish a
 * phase together move on to the next one in the order they entered it. */
static void list_add_locked(struct wrapper *w, struct wtask *wt, enum phase ph)
{
    wt->phase = ph;
    wt->next = NULL;
    wt->prev = w->tails[ph];
    if (wt->prev) wt->prev->next = wt;
    else w->heads[ph] = wt;
    w->tails[ph] = wt;
}

static void list_remove_locked(struct wrapper *w, struct wtask *wt)
{
    if (wt->prev) wt->prev->next = wt->next;
    else w->heads[wt->phase] = wt->next;
    if (wt->next) wt->next->prev = wt->prev;
    else w->tails[wt->phase] = wt->prev;
    wt->prev = wt->next = NULL;
}

/* Release the temps of a task (mu held); idle buffers beyond the cache cap
 * are chained onto *to_free for the caller to free after unlocking. */
static void release_temps_locked(struct wrapper *w, struct wtask *wt, struct temp **to_free)
{
    pool_release_locked(w, wt->temps, wt->n, wt->temp_size, to_free);
}

/* Finish a registered task (mu held, already off its list): temps back to
 * the pool first, so a caller woken by the fd sees them released; then the
 * result and the signal. */
static void finish_locked(struct wrapper *w, struct wtask *wt, struct temp **to_free)
{
    release_temps_locked(w, wt, to_free);
    if (wt->whole) { /* a piece: the whole task completes with its last */
        struct wtask *whole = wt->whole;
        wtask_free(wt);
        if (--whole->pieces_left > 0) return;
        wt = whole; /* its temps all went back with its pieces */
    }
    kvs_l2_tq_complete(&w->tq, wt->t);
    wt->t = NULL;
    wtask_free(wt);
    if (--w->inflight == 0) {
        pthread_mutex_lock(&w->idle_mu);
        w->idle_seq++;
        pthread_cond_broadcast(&w->idle_cv);
        pthread_mutex_unlock(&w->idle_mu);
    }
}

/* Fill a load result from the inner bitmap kept in the task. */
static void load_result_from_inner(struct wtask *wt)
{
    for (size_t i = 0; i < wt->n; i++)
        if (wt->hits[i]) kvs_l2_tq_hit(wt->t, i);
    if (wt->inner_status != KVS_OK)
        kvs_l2_tq_fail(wt->t, wt->inner_status, wt->inner_message);
}

/* Key sel_idx[j] of a load was not deserialized: clear its bit and record
 * its error, after the inner load's (the first error wins). */
static void deser_key_failed(struct wtask *wt, size_t j, int status, const char *message)
{
    if (wt->inner_status != KVS_OK)
        kvs_l2_tq_fail(wt->t, wt->inner_status, wt->inner_message);
    wt->hits[wt->sel_idx[j]] = 0;
    char msg[KVS_ERROR_MSG_MAX];
    /* (the inner message cut to what fits after the prefix) */
    snprintf(msg, sizeof msg, OWNER ": load of key %zu: %.440s", wt->sel_idx[j], message);
    kvs_l2_tq_fail(wt->t, status, msg);
}

/* Deserialize the found keys from sel_off on as one batch (mu held; the
 * task is on no list). Completes the task if nothing is left or the submit
 * is refused (every key left then loses its bit). */
static void submit_deser_locked(struct wrapper *w, struct wtask *wt, struct temp **to_free)
{
    size_t n = wt->nsel - wt->sel_off;
    if (n == 0) {
        load_result_from_inner(wt);
        finish_locked(w, wt, to_free);
        return;
    }
    kvs_task_id pid;
    int rc = proc_submit_deserialize(w, wt->sel_src + wt->sel_off,
                                     wt->sel_dst + wt->sel_off * wt->slots, n,
                                     wt->sel_keys + wt->sel_off, &pid);
    if (rc != KVS_OK) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        for (size_t j = wt->sel_off; j < wt->nsel; j++) deser_key_failed(wt, j, rc, msg);
        load_result_from_inner(wt);
        finish_locked(w, wt, to_free);
        return;
    }
    wt->sub_id = pid;
    list_add_locked(w, wt, PH_DESER);
}

/* ---------------------------------------------------------------------
 * Moving tasks on (mu held)
 * ------------------------------------------------------------------ */

/* The serialize finished (the task is off its list): store the temps. */
static void serialized_locked(struct wrapper *w, struct wtask *wt, const kvs_task_result *r,
                              struct temp **to_free)
{
    if (r->state == KVS_TASK_FAILED) {
        kvs_l2_tq_fail(wt->t, r->status, r->message);
        finish_locked(w, wt, to_free);
        return;
    }
    kvs_l2_task_id iid;
    int rc = kvs_l2_submit_store(w->inner, wt->keys, wt->tobjs, wt->n, &iid);
    if (rc != KVS_OK) {
        kvs_l2_tq_fail(wt->t, rc, kvs_last_error());
        finish_locked(w, wt, to_free);
        return;
    }
    wt->sub_id = iid;
    list_add_locked(w, wt, PH_STORE);
}

/* The inner load finished (the task is off its list): deserialize the
 * keys it found. */
static void loaded_locked(struct wrapper *w, struct wtask *wt, kvs_l2_bitmap *bm,
                          struct temp **to_free)
{
    size_t nsel = 0;
    for (size_t i = 0; i < wt->n; i++) {
        wt->hits[i] = i < bm->nkeys && bm->hits && bm->hits[i] ? 1 : 0;
        if (wt->hits[i]) {
            wt->sel_src[nsel] = wt->tobjs[i];
            for (size_t j = 0; j < wt->slots; j++)
                wt->sel_dst[nsel * wt->slots + j] = wt->objs[i * wt->slots + j];
            wt->sel_keys[nsel] = wt->keys[i];
            wt->sel_idx[nsel] = i;
            nsel++;
        }
    }
    wt->nsel = nsel;
    wt->sel_off = 0;
    wt->inner_status = bm->status;
    snprintf(wt->inner_message, sizeof wt->inner_message, "%s", bm->message);
    submit_deser_locked(w, wt, to_free);
}

/* A deserialize batch finished (the task is off its list). */
static void deserialized_locked(struct wrapper *w, struct wtask *wt, const kvs_task_result *r,
                                struct temp **to_free)
{
    if (r->state == KVS_TASK_OK) {
        wt->sel_off = wt->nsel;
    } else if (r->failed_index < wt->nsel - wt->sel_off) {
        /* Objects before failed_index were deserialized, the failing one
         * loses its bit and the ones after it go again. */
        size_t j = wt->sel_off + r->failed_index;
        deser_key_failed(wt, j, r->status, r->message);
        wt->sel_off = j + 1;
    } else {
        /* A processor naming no object of the batch fails them all. */
        for (size_t j = wt->sel_off; j < wt->nsel; j++)
            deser_key_failed(wt, j, r->status, r->message);
        wt->sel_off = wt->nsel;
    }
    submit_deser_locked(w, wt, to_free);
}

/* If the task's serialize, inner load or deserialize has finished (its
 * result is popped here), move it on to its next phase. */
static void advance_if_done_locked(struct wrapper *w, struct wtask *wt, struct temp **to_free)
{
    enum phase ph = wt->phase;
    if (ph == PH_LOAD) {
        kvs_l2_bitmap bm;
        memset(&bm, 0, sizeof bm);
        if (kvs_l2_query_load(w->inner, wt->sub_id, &bm) == KVS_OK &&
            bm.state != KVS_TASK_PENDING) {
            list_remove_locked(w, wt);
            loaded_locked(w, wt, &bm, to_free);
        }
        kvs_l2_bitmap_release(&bm);
        return;
    }
    kvs_task_result r;
    if (proc_query(w, ph == PH_DESER, wt->sub_id, &r) != KVS_OK || r.state == KVS_TASK_PENDING)
        return;
    list_remove_locked(w, wt);
    if (ph == PH_SERIALIZE) serialized_locked(w, wt, &r, to_free);
    else deserialized_locked(w, wt, &r, to_free);
}

/* Finished inner stores are popped (all of them, oldest first) rather than
 * queried by id: complete their tasks. */
static void drain_inner_store_locked(struct wrapper *w, struct temp **to_free)
{
    kvs_l2_store_result res[POP_BATCH];
    for (;;) {
        size_t count = 0;
        if (kvs_l2_pop_completed_stores(w->inner, res, POP_BATCH, &count) != KVS_OK)
            return;
        for (size_t k = 0; k < count; k++) {
            struct wtask *wt = w->heads[PH_STORE];
            while (wt && wt->sub_id != res[k].id) wt = wt->next;
            if (wt == NULL) continue; /* not ours (cannot happen) */
            list_remove_locked(w, wt);
            if (res[k].state == KVS_TASK_OK) {
                wt->t->store.bytes_written += res[k].bytes_written; /* pieces add up */
            } else {
                kvs_l2_tq_fail(wt->t, res[k].status != KVS_OK ? res[k].status : KVS_EIO,
                               res[k].message[0] ? res[k].message
                                                 : OWNER ": the inner store failed");
            }
            finish_locked(w, wt, to_free);
        }
        if (count < POP_BATCH) return;
    }
}

/* Every finished task of the phase, oldest first. A task may move on into
 * the same phase (a deserialize batch submitted again after a damaged
 * blob): it goes to the tail, where this walk may look at it again
 * (harmless: its new batch is either pending or finished). */
static void drain_locked(struct wrapper *w, enum phase ph, struct temp **to_free)
{
    if (ph == PH_STORE) {
        drain_inner_store_locked(w, to_free);
        return;
    }
    struct wtask *wt = w->heads[ph];
    while (wt) {
        struct wtask *next = wt->next;
        advance_if_done_locked(w, wt, to_free);
        wt = next;
    }
}

/* ---------------------------------------------------------------------
 * Locking and the completion hooks
 *
 * mu is held across every submit to the processor and the inner adapter,
 * with the registration of the task, so a completion (fd or hook) never
 * finds a task it does not know yet. A hook does not wait for mu: it marks
 * its phase pending and drains it only if mu is free (trylock). Whoever
 * holds mu drains the pending phases before letting go, and looks again
 * after letting go, so a mark is never left behind: either the marking
 * hook's trylock succeeds, or the holder it failed against sees the mark
 * after its unlock (the marks are sequentially consistent atomics). This
 * covers a hook on the holder's own thread (a task the callee completed
 * inside a submit: its trylock fails) and spares a hook on another thread
 * a sleep on mu and the holder a wake-up of it. So mu is taken only by
 * lock_mu and let go only by unlock_mu, everywhere (the temp pool, the
 * status, close): a plain unlock, or a sleep on a condition of mu, would
 * leave a mark made meanwhile behind, and its task would never end.
 * ------------------------------------------------------------------ */

/* Drain every phase marked pending (mu held); a drain can submit a next
 * phase that completes inline and marks again, hence the loop. */
static void drain_pending_locked(struct wrapper *w, struct temp **to_free)
{
    for (int ph = 0; ph < NPHASES; ph++) {
        if (atomic_exchange(&w->pending[ph], 0)) {
            drain_locked(w, (enum phase)ph, to_free);
            ph = -1; /* look at every phase anew */
        }
    }
}

static int any_pending(struct wrapper *w)
{
    for (int ph = 0; ph < NPHASES; ph++)
        if (atomic_load(&w->pending[ph])) return 1;
    return 0;
}

static void lock_mu(struct wrapper *w) { pthread_mutex_lock(&w->mu); }

/* Drain the pending phases, unlock, free the temps let go; then take mu
 * again for marks made while it was being released (their hooks' trylock
 * failed against this holder). */
static void unlock_mu(struct wrapper *w, struct temp **to_free)
{
    for (;;) {
        drain_pending_locked(w, to_free);
        pthread_mutex_unlock(&w->mu);
        free_list(*to_free);
        *to_free = NULL;
        if (!any_pending(w) || pthread_mutex_trylock(&w->mu) != 0) return;
    }
}

/* A task of phase ph finished (its result is readable); we are on the
 * thread that finished it, so the next phase is submitted from here when mu
 * is free; otherwise its holder does it. */
static void phase_done(struct wrapper *w, enum phase ph, uint64_t id)
{
    if (pthread_mutex_trylock(&w->mu) != 0) {
        atomic_store(&w->pending[ph], 1);
        /* the holder may have let go between the trylock and the mark */
        if (pthread_mutex_trylock(&w->mu) != 0) return;
        struct temp *to_free = NULL;
        unlock_mu(w, &to_free);
        return;
    }
    struct temp *to_free = NULL;
    if (ph == PH_STORE) {
        drain_inner_store_locked(w, &to_free);
    } else {
        struct wtask *wt = w->heads[ph];
        while (wt && wt->sub_id != id) wt = wt->next;
        if (wt) advance_if_done_locked(w, wt, &to_free);
    }
    unlock_mu(w, &to_free);
}

/* close()'s wait for the tasks in flight to end; then the poll thread is
 * told to stop. It cannot sleep on a condition of mu: a hook that finds mu
 * held leaves its phase marked for the holder, and a holder asleep in
 * pthread_cond_wait drains nothing, so a mark made just before that sleep
 * would stay, and the task with it. It lets mu go as every holder does
 * (unlock_mu drains), then sleeps on idle_seq, read before it looked: a
 * last task that drain (or anyone) finishes after the look moves it. */
static void wait_idle(struct wrapper *w)
{
    for (;;) {
        pthread_mutex_lock(&w->idle_mu);
        uint64_t seen = w->idle_seq;
        pthread_mutex_unlock(&w->idle_mu);
        struct temp *to_free = NULL;
        lock_mu(w);
        int idle = w->inflight == 0;
        if (idle) w->stop = 1;
        unlock_mu(w, &to_free);
        if (idle) return;
        pthread_mutex_lock(&w->idle_mu);
        while (w->idle_seq == seen) pthread_cond_wait(&w->idle_cv, &w->idle_mu);
        pthread_mutex_unlock(&w->idle_mu);
    }
}

static void serialize_done(void *ctx, uint64_t id) { phase_done(ctx, PH_SERIALIZE, id); }
static void inner_store_done(void *ctx, uint64_t id) { phase_done(ctx, PH_STORE, id); }
static void inner_load_done(void *ctx, uint64_t id) { phase_done(ctx, PH_LOAD, id); }
static void deserialize_done(void *ctx, uint64_t id) { phase_done(ctx, PH_DESER, id); }

/* Hook every phase whose processor or inner adapter can call one; the
 * others stay on the poll thread. Called at create, before any submit. */
static void install_hooks(struct wrapper *w)
{
    kvs_completion_hook ser = {serialize_done, w}, de = {deserialize_done, w};
    int proc_hooked = w->mproc ? kvs_async_multi_processor_set_hooks(w->mproc, ser, de)
                               : kvs_async_processor_set_hooks(w->proc, ser, de);
    /* With the hooks, a small transform runs on the thread that submits it
     * (the caller's for a store's serialize, the inner adapter's worker for
     * a load's deserialize): cheaper than waking a processor worker. */
    if (proc_hooked) {
        if (w->mproc) (void)kvs_async_multi_processor_set_inline(w->mproc, INLINE_MAX_BYTES);
        else (void)kvs_async_processor_set_inline(w->proc, INLINE_MAX_BYTES);
    }
    w->hooked[PH_SERIALIZE] = w->hooked[PH_DESER] = proc_hooked;
    kvs_l2_task_queue *q = kvs_l2_base_task_queue(w->inner);
    if (q) {
        kvs_l2_tq_set_hook(q, KVS_L2_STORE, (kvs_completion_hook){inner_store_done, w});
        kvs_l2_tq_set_hook(q, KVS_L2_LOAD, (kvs_completion_hook){inner_load_done, w});
        w->hooked[PH_STORE] = w->hooked[PH_LOAD] = 1;
    }
}

/* The poll thread: the phases that are not hooked, and the wake-up. */
static void *poll_main(void *arg)
{
    struct wrapper *w = arg;
    struct pollfd pfd[NPHASES + 1];
    enum phase phase_of[NPHASES];
    int npfd = 0;
    for (int ph = 0; ph < NPHASES; ph++) {
        if (w->hooked[ph]) continue;
        phase_of[npfd] = (enum phase)ph;
        pfd[npfd++] = (struct pollfd){w->phase_fd[ph], POLLIN, 0};
    }
    pfd[npfd] = (struct pollfd){kvs_notifier_fd(&w->wake), POLLIN, 0};
    int nall = npfd + 1;
    for (;;) {
        int ready[NPHASES + 1] = {0};
        int r = poll(pfd, (nfds_t)nall, -1);
        if (r < 0) {
            if (errno == EINTR) continue;
            /* Cannot happen with valid fds; never spin, never stall: look at
             * everything after a short pause. */
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
            for (int i = 0; i < nall; i++) ready[i] = 1;
        } else {
            for (int i = 0; i < nall; i++)
                ready[i] = (pfd[i].revents & (POLLIN | POLLERR)) != 0;
        }
        /* Reset the counters before looking, so a completion landing during
         * the drain leaves the fd readable for the next round. */
        for (int i = 0; i < nall; i++)
            if (ready[i]) (void)kvs_event_fd_consume(pfd[i].fd, NULL);

        struct temp *to_free = NULL;
        lock_mu(w);
        for (int i = 0; i < npfd; i++)
            if (ready[i]) drain_locked(w, phase_of[i], &to_free);
        int stop = w->stop;
        unlock_mu(w, &to_free);
        if (stop) break;
    }
    return NULL;
}

/* ---------------------------------------------------------------------
 * Submits
 * ------------------------------------------------------------------ */

/* A batch must share one layout (it sizes every temp). */
static int check_layouts(kvs_memobj *const *objects, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        if (!kvs_layout_equal(&objects[i]->layout, &objects[0]->layout)) {
            char a[200], b[200];
            return kvs_set_error(KVS_EINVAL, "%s: object %zu has layout %s but object 0 has %s",
                                 OWNER, i, kvs_layout_format(&objects[i]->layout, a, sizeof a),
                                 kvs_layout_format(&objects[0]->layout, b, sizeof b));
        }
    }
    return KVS_OK;
}

/* Groups likewise: every group has group 0's absence pattern and, slot by
 * slot, its layouts. */
static int check_group_layouts(kvs_memobj *const *groups, size_t n, size_t gs)
{
    for (size_t i = 1; i < n; i++) {
        for (size_t j = 0; j < gs; j++) {
            const kvs_memobj *a = groups[i * gs + j], *b = groups[j];
            if ((a == NULL) != (b == NULL))
                return kvs_set_error(KVS_EINVAL,
                                     "%s: group %zu slot %zu is %s but group 0's is %s; a "
                                     "batch shares one absence pattern",
                                     OWNER, i, j, a ? "present" : "absent",
                                     b ? "present" : "absent");
            if (a && !kvs_layout_equal(&a->layout, &b->layout)) {
                char x[200], y[200];
                return kvs_set_error(KVS_EINVAL,
                                     "%s: group %zu slot %zu has layout %s but group 0's "
                                     "has %s",
                                     OWNER, i, j, kvs_layout_format(&a->layout, x, sizeof x),
                                     kvs_layout_format(&b->layout, y, sizeof y));
            }
        }
    }
    return KVS_OK;
}

/* The start every submit shares: layouts, the task record and its id.
 * items: n x slots pointers. In the multi shape the serializer's estimate
 * is taken here, before an id, so a group the serde refuses (a required
 * slot absent) is refused with nothing queued; *est is then set (else 0). */
static int submit_begin(struct wrapper *w, kvs_l2_direction d, const kvs_object_key *keys,
                        kvs_memobj *const *items, size_t n, size_t slots,
                        struct wtask **out_wt, size_t *est, kvs_l2_task_id *id)
{
    int rc = slots == 1 && w->mproc == NULL ? check_layouts(items, n)
                                            : check_group_layouts(items, n, slots);
    if (rc) return rc;
    *est = 0;
    if (w->mproc && n > 0 && (rc = proc_estimate(w, items, est)) != KVS_OK) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        return kvs_set_error(rc, "%s: %s", OWNER, msg);
    }
    struct wtask *wt = NULL;
    if (n > 0) {
        wt = wtask_new(keys, items, n, slots, d == KVS_L2_STORE);
        if (wt == NULL)
            return kvs_set_error(KVS_ENOMEM, "%s: out of memory for a task of %zu keys",
                                 OWNER, n);
    }
    kvs_l2_task *t;
    rc = kvs_l2_tq_begin(&w->tq, d, n, &t);
    if (rc) {
        wtask_free(wt);
        return rc;
    }
    *id = t->id;
    if (n == 0) { /* an empty batch succeeds at once */
        kvs_l2_tq_complete(&w->tq, t);
        kvs_l2_tq_end_submit(&w->tq);
        *out_wt = NULL;
        return KVS_OK;
    }
    wt->t = t;
    *out_wt = wt;
    return KVS_OK;
}

/* Fail a task that was never registered (no temps held). */
static void fail_now(struct wrapper *w, struct wtask *wt, int status, const char *msg)
{
    kvs_l2_tq_fail(wt->t, status, msg);
    kvs_l2_tq_complete(&w->tq, wt->t);
    wt->t = NULL;
    wtask_free(wt);
}

/* Temps for a task, sized from item 0 (est: the estimate submit_begin
 * took, or 0 to take it here). On failure the task is completed as failed
 * and freed. */
static int take_temps(struct wrapper *w, struct wtask *wt, size_t est)
{
    int rc = KVS_OK;
    if (w->mproc == NULL) rc = proc_estimate(w, wt->objs, &est);
    if (rc == KVS_OK) rc = pool_reserve(w, wt->n, est, wt->temps);
    if (rc != KVS_OK) {
        fail_now(w, wt, rc, kvs_last_error());
        return rc;
    }
    wt->temp_size = est;
    for (size_t i = 0; i < wt->n; i++) wt->tobjs[i] = &wt->temps[i]->obj;
    return KVS_OK;
}

/* Objects per piece of a store task (about PIECE_BYTES of temps, at least
 * one), or 0 when it goes on whole: one object, or one piece would hold
 * them all. */
static size_t piece_objects(const struct wtask *wt)
{
    if (wt->n < 2 || wt->temp_size == 0) return 0;
    size_t per = wt->temp_size >= PIECE_BYTES / 2 ? 1 : PIECE_BYTES / wt->temp_size;
    return per < wt->n ? per : 0;
}

/* The pieces of a store task, per objects each (made before mu is taken);
 * NULL when memory is short: the task then goes on whole, only slower. */
static struct wtask **make_pieces(struct wtask *wt, size_t per, size_t *npieces)
{
    size_t np = (wt->n + per - 1) / per;
    struct wtask **pieces = calloc(np, sizeof *pieces);
    for (size_t i = 0; pieces && i < np; i++) {
        struct wtask *pc = calloc(1, sizeof *pc);
        if (pc == NULL) {
            while (i > 0) free(pieces[--i]);
            free(pieces);
            return NULL;
        }
        size_t first = i * per;
        pc->t = wt->t;
        pc->whole = wt;
        pc->n = first + per <= wt->n ? per : wt->n - first;
        pc->slots = wt->slots;
        pc->keys = wt->keys + first;
        pc->objs = wt->objs + first * wt->slots;
        pc->temps = wt->temps + first;
        pc->tobjs = wt->tobjs + first;
        pc->temp_size = wt->temp_size;
        pieces[i] = pc;
    }
    *npieces = np;
    return pieces;
}

/* Submit the serialize of every piece (mu held, the whole task counted in
 * inflight). A piece the processor refuses fails the whole task (the first
 * error wins) and finishes at once; the other pieces go on. */
static void submit_pieces_locked(struct wrapper *w, struct wtask *wt, struct wtask **pieces,
                                 size_t np, struct temp **to_free)
{
    wt->pieces_left = np;
    for (size_t i = 0; i < np; i++) {
        struct wtask *pc = pieces[i];
        kvs_task_id pid;
        int rc = proc_submit_serialize(w, pc->objs, pc->tobjs, pc->n, pc->keys, &pid);
        if (rc == KVS_OK) {
            pc->sub_id = pid;
            list_add_locked(w, pc, PH_SERIALIZE);
        } else {
            kvs_l2_tq_fail(wt->t, rc, kvs_last_error());
            finish_locked(w, pc, to_free);
        }
    }
}

/* One submit for both directions and both shapes. views: owned by the
 * task from here on (freed with it, or here if it is refused). */
static int submit(struct wrapper *w, kvs_l2_direction d, const kvs_object_key *keys,
                  kvs_memobj *const *items, size_t n, size_t slots, kvs_memobj *views,
                  kvs_l2_task_id *id)
{
    struct wtask *wt;
    size_t est;
    int rc = submit_begin(w, d, keys, items, n, slots, &wt, &est, id);
    if (rc != KVS_OK || wt == NULL) {
        free(views);
        return rc;
    }
    wt->views = views;
    if (take_temps(w, wt, est) == KVS_OK) {
        size_t per = d == KVS_L2_STORE ? piece_objects(wt) : 0, npieces = 0;
        struct wtask **pieces = per ? make_pieces(wt, per, &npieces) : NULL;
        struct temp *to_free = NULL;
        lock_mu(w);
        uint64_t sub;
        if (pieces) {
            w->inflight++;
            submit_pieces_locked(w, wt, pieces, npieces, &to_free);
            unlock_mu(w, &to_free);
            free(pieces);
            kvs_l2_tq_end_submit(&w->tq);
            return KVS_OK;
        }
        if (d == KVS_L2_STORE) {
            kvs_task_id pid;
            rc = proc_submit_serialize(w, wt->objs, wt->tobjs, wt->n, wt->keys, &pid);
            sub = pid;
        } else {
            kvs_l2_task_id iid;
            rc = kvs_l2_submit_load(w->inner, keys, wt->tobjs, wt->n, &iid);
            sub = iid;
        }
        w->inflight++;
        if (rc == KVS_OK) {
            wt->sub_id = sub;
            list_add_locked(w, wt, d == KVS_L2_STORE ? PH_SERIALIZE : PH_LOAD);
        } else {
            kvs_l2_tq_fail(wt->t, rc, kvs_last_error()); /* a load: all keys missed */
            finish_locked(w, wt, &to_free);
        }
        unlock_mu(w, &to_free);
    }
    kvs_l2_tq_end_submit(&w->tq);
    return KVS_OK;
}

static const char *format_name(kvs_memory_format f)
{
    switch (f) {
    case KVS_FMT_UNDEFINED: return "UNDEFINED";
    case KVS_FMT_KV_2LTD: return "KV_2LTD";
    case KVS_FMT_KV_T2D: return "KV_T2D";
    case KVS_FMT_KV_2TD: return "KV_2TD";
    case KVS_FMT_BINARY: return "BINARY";
    case KVS_FMT_BINARY_BUFFER: return "BINARY_BUFFER";
    case KVS_FMT_KV_MLA_FMT: return "KV_MLA_FMT";
    case KVS_FMT_EC_TD: return "EC_TD";
    case KVS_FMT_HS_TD: return "HS_TD";
    }
    return "unknown";
}

/* The K and V halves of one whole KV chunk, as views of its memory (no
 * copy): KV_2LTD [2, L, T, D] -> two [L, T, D]; KV_2TD [2, T, D] -> two
 * [T, D]; KV_T2D [T, 2, D] -> two strided [T, D] halves (multi.h: format
 * KV_T2D marks them). Anything else has no K/V halves. */
static int chunk_views(struct wrapper *w, size_t i, const kvs_memobj *o, kvs_memobj *k,
                       kvs_memobj *v)
{
    const kvs_group *g = &o->layout.groups[0];
    const kvs_shape *sh = &g->shape;
    int ok = o->layout.ngroups == 1;
    int64_t dims[3];
    uint32_t nd = 0;
    size_t k_off = 0, v_off = 0;
    size_t esize = kvs_dtype_size(g->dtype);
    switch (o->format) {
    case KVS_FMT_KV_2LTD:
    case KVS_FMT_KV_2TD:
        nd = o->format == KVS_FMT_KV_2LTD ? 3 : 2;
        ok = ok && sh->ndim == nd + 1 && sh->dims[0] == 2;
        if (ok) {
            memcpy(dims, sh->dims + 1, nd * sizeof *dims);
            v_off = (size_t)(kvs_layout_nbytes(&o->layout) / 2);
        }
        break;
    case KVS_FMT_KV_T2D:
        nd = 2;
        ok = ok && sh->ndim == 3 && sh->dims[1] == 2;
        if (ok) {
            dims[0] = sh->dims[0], dims[1] = sh->dims[2];
            v_off = (size_t)sh->dims[2] * esize;
        }
        break;
    default: {
        const char *why = o->format == KVS_FMT_KV_MLA_FMT ? " (MLA: one latent, no separate K and V)"
                          : o->format == KVS_FMT_HS_TD || o->format == KVS_FMT_EC_TD
                              ? " (not a KV cache)"
                          : o->format == KVS_FMT_BINARY || o->format == KVS_FMT_BINARY_BUFFER
                              ? " (bytes)"
                              : "";
        return kvs_set_error(KVS_EINVAL,
                             "%s: object %zu has format %s%s, which has no K/V halves; serde "
                             "'%s' takes K and V (KV_2LTD, KV_2TD or KV_T2D chunks)",
                             OWNER, i, format_name(o->format), why, w->serde_name);
    }
    }
    if (!ok) {
        char lb[200];
        return kvs_set_error(KVS_EINVAL,
                             "%s: object %zu of format %s has layout %s, which is not %s",
                             OWNER, i, format_name(o->format),
                             kvs_layout_format(&o->layout, lb, sizeof lb),
                             o->format == KVS_FMT_KV_2LTD ? "[2, layers, tokens, hidden]"
                             : o->format == KVS_FMT_KV_2TD ? "[2, tokens, hidden]"
                                                           : "[tokens, 2, hidden]");
    }
    kvs_layout half;
    int rc = kvs_layout_init(&half, 0, NULL, 0, NULL);
    if (rc == KVS_OK) rc = kvs_layout_add_group(&half, nd, dims, g->dtype);
    if (rc != KVS_OK) return rc;
    /* The views are made field by field: a T2D half's bytes are strided, so
     * its capacity reaches the end of the chunk (kvs_memobj_init would
     * measure it as contiguous). */
    size_t hb = (size_t)kvs_layout_nbytes(&half);
    kvs_memory_format vf = o->format == KVS_FMT_KV_T2D ? KVS_FMT_KV_T2D : o->format;
    kvs_memobj *views[2] = {k, v};
    size_t offs[2] = {k_off, v_off};
    for (int s = 0; s < 2; s++) {
        memset(views[s], 0, sizeof *views[s]);
        views[s]->data = (uint8_t *)o->data + offs[s];
        views[s]->capacity = o->capacity - offs[s];
        views[s]->used_size = hb;
        views[s]->layout = half;
        views[s]->format = vf;
    }
    return KVS_OK;
}

/* Whole KV chunks on a multi wrapper: build each chunk's K/V views and
 * submit them as groups. The serde decides whether K goes along: if it
 * refuses a K/V group but takes one with K absent (kv_split mode v_only),
 * only the V halves are stored and loaded, and K's bytes are never read
 * nor written. */
static int submit_chunks(struct wrapper *w, kvs_l2_direction d, const kvs_object_key *keys,
                         kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    if (w->gs != 2)
        return kvs_set_error(KVS_EINVAL,
                             "%s: serde '%s' takes groups of %zu slots, not K/V pairs: submit "
                             "groups, not whole KV chunks",
                             OWNER, w->serde_name, w->gs);
    int rc = check_layouts(objects, n);
    if (rc) return rc;
    if (n == 0) return submit(w, d, keys, NULL, 0, 2, NULL, id);
    if (n > SIZE_MAX / (2 * sizeof(kvs_memobj)))
        return kvs_set_error(KVS_ENOMEM, "%s: out of memory for a task of %zu keys", OWNER, n);
    kvs_memobj *views = malloc(2 * n * sizeof *views);
    kvs_memobj **groups = malloc(2 * n * sizeof *groups);
    if (views == NULL || groups == NULL) {
        free(views);
        free(groups);
        return kvs_set_error(KVS_ENOMEM, "%s: out of memory for a task of %zu keys", OWNER, n);
    }
    for (size_t i = 0; i < n && rc == KVS_OK; i++) {
        rc = chunk_views(w, i, objects[i], &views[2 * i], &views[2 * i + 1]);
        groups[2 * i] = &views[2 * i];
        groups[2 * i + 1] = &views[2 * i + 1];
    }
    if (rc == KVS_OK) {
        size_t est;
        if (proc_estimate(w, groups, &est) != KVS_OK) {
            char msg[KVS_ERROR_MSG_MAX];
            int code = kvs_last_error_code();
            snprintf(msg, sizeof msg, "%s", kvs_last_error());
            kvs_memobj *v_only[2] = {NULL, groups[1]};
            if (proc_estimate(w, v_only, &est) == KVS_OK)
                for (size_t i = 0; i < n; i++) groups[2 * i] = NULL;
            else
                rc = kvs_set_error(code, "%s: %s", OWNER, msg);
        }
    }
    if (rc == KVS_OK) {
        rc = submit(w, d, keys, groups, n, 2, views, id); /* takes views */
        views = NULL;
    }
    free(views);
    free(groups);
    return rc;
}

static int wr_submit_store(kvs_l2_adapter *a, const kvs_object_key *keys,
                           kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    struct wrapper *w = wr_of(a);
    if (w->mproc) return submit_chunks(w, KVS_L2_STORE, keys, objects, n, id);
    return submit(w, KVS_L2_STORE, keys, objects, n, 1, NULL, id);
}

static int wr_submit_load(kvs_l2_adapter *a, const kvs_object_key *keys,
                          kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    struct wrapper *w = wr_of(a);
    if (w->mproc) return submit_chunks(w, KVS_L2_LOAD, keys, objects, n, id);
    return submit(w, KVS_L2_LOAD, keys, objects, n, 1, NULL, id);
}

/* Groups: only in the multi shape, and only of the serde's group size. */
static int submit_groups(kvs_l2_adapter *a, kvs_l2_direction d, const kvs_object_key *keys,
                         kvs_memobj *const *groups, size_t n, size_t group_size,
                         kvs_l2_task_id *id)
{
    struct wrapper *w = wr_of(a);
    if (w->mproc == NULL)
        return kvs_set_error(KVS_EINVAL,
                             "%s: serde '%s' is single-output (one tensor per blob); groups "
                             "need a multi-output serde such as kv_split",
                             OWNER, w->serde_name);
    if (group_size != w->gs)
        return kvs_set_error(KVS_EINVAL,
                             "%s: groups of %zu slots, but serde '%s' takes groups of %zu",
                             OWNER, group_size, w->serde_name, w->gs);
    return submit(w, d, keys, groups, n, group_size, NULL, id);
}

static int wr_pop_completed_stores(kvs_l2_adapter *a, kvs_l2_store_result *out, size_t cap,
                                   size_t *count)
{
    kvs_l2_tq_pop_stores(&wr_of(a)->tq, out, cap, count);
    return KVS_OK;
}

static int wr_query_load(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    kvs_l2_tq_query(&wr_of(a)->tq, KVS_L2_LOAD, id, out);
    return KVS_OK;
}

static int wr_store_event_fd(kvs_l2_adapter *a)
{
    return kvs_l2_tq_fd(&wr_of(a)->tq, KVS_L2_STORE);
}

static int wr_load_event_fd(kvs_l2_adapter *a)
{
    return kvs_l2_tq_fd(&wr_of(a)->tq, KVS_L2_LOAD);
}

/* ---------------------------------------------------------------------
 * Pass-through to the inner adapter
 * ------------------------------------------------------------------ */

/* The lookup fd is the inner adapter's own (as upstream). */
static int wr_lookup_event_fd(kvs_l2_adapter *a)
{
    struct wrapper *w = wr_of(a);
    if (kvs_l2_tq_is_closed(&w->tq))
        return kvs_set_error(KVS_ECLOSED, "%s: adapter is closed", OWNER);
    return kvs_l2_lookup_event_fd(w->inner);
}

static int wr_submit_lookup_and_lock(kvs_l2_adapter *a,
                                     const kvs_object_key *keys, size_t n,
                                     kvs_l2_task_id *id)
{
    struct wrapper *w = wr_of(a);
    if (kvs_l2_tq_is_closed(&w->tq))
        return kvs_set_error(KVS_ECLOSED, "%s: submit after close", OWNER);
    return kvs_l2_submit_lookup_and_lock(w->inner, keys, n, id);
}

static int wr_query_lookup_and_lock(kvs_l2_adapter *a, kvs_l2_task_id id, kvs_l2_bitmap *out)
{
    return kvs_l2_query_lookup_and_lock(wr_of(a)->inner, id, out);
}

static int wr_unlock(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n)
{
    return kvs_l2_unlock(wr_of(a)->inner, keys, n);
}

static int wr_delete(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                     uint8_t *deleted)
{
    return kvs_l2_delete(wr_of(a)->inner, keys, n, deleted);
}

static int wr_object_sizes(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                           int64_t *sizes)
{
    return kvs_l2_object_sizes(wr_of(a)->inner, keys, n, sizes);
}

/* The inner adapter's keys are the caller's (only the bytes are
 * serialized). */
static int wr_list_keys(kvs_l2_adapter *a, kvs_l2_key_fn fn, void *ctx)
{
    struct wrapper *w = wr_of(a);
    if (kvs_l2_tq_is_closed(&w->tq))
        return kvs_set_error(KVS_ECLOSED, "%s: adapter is closed", OWNER);
    return kvs_l2_list_keys(w->inner, fn, ctx);
}

static int wr_usage(kvs_l2_adapter *a, kvs_l2_usage *out)
{
    return kvs_l2_get_usage(wr_of(a)->inner, out);
}

/* The inner adapter's status plus "serde_wrapped": true and the pool. */
static int wr_status(kvs_l2_adapter *a, json_t **out)
{
    struct wrapper *w = wr_of(a);
    json_t *st = NULL;
    int rc = kvs_l2_status(w->inner, &st);
    if (rc) return rc;
    struct temp *to_free = NULL;
    lock_mu(w);
    json_t *pool = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
                             "capacity_bytes", (json_int_t)w->pool_capacity,
                             "in_use_bytes", (json_int_t)w->pool_in_use,
                             "in_use_temps", (json_int_t)w->temps_in_use,
                             "cached_bytes", (json_int_t)w->pool_cached,
                             "cached_temps", (json_int_t)w->temps_cached,
                             "peak_in_use_bytes", (json_int_t)w->peak_in_use,
                             "allocated_temps", (json_int_t)w->temps_allocated,
                             "tasks_in_flight", (json_int_t)w->inflight);
    unlock_mu(w, &to_free);
    /* json_object_set_new() takes the value's reference even when it fails. */
    int bad = pool == NULL || !json_is_object(st);
    if (bad) json_decref(pool);
    if (!bad) bad = json_object_set_new(st, "serde_temp_pool", pool) != 0;
    if (!bad) bad = json_object_set_new(st, "serde_wrapped", json_true()) != 0;
    if (bad) {
        json_decref(st);
        return kvs_set_error(KVS_ENOMEM, "%s: cannot build the status", OWNER);
    }
    *out = st;
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * Close / destroy
 * ------------------------------------------------------------------ */

static int wr_close(kvs_l2_adapter *a)
{
    struct wrapper *w = wr_of(a);
    pthread_mutex_lock(&w->close_mu);
    if (w->closed) { /* a no-op, even if the first close reported an error */
        pthread_mutex_unlock(&w->close_mu);
        return KVS_OK;
    }
    /* 1. No new tasks; wait for the submits under way to be registered. */
    (void)kvs_l2_tq_close_begin(&w->tq);
    /* 2. Every task in flight runs to its end and signals; the poll thread
     *    drives them while the processor and the inner adapter stay open. */
    wait_idle(w);
    /* 3. Stop the poll thread (before the fds it polls go away). */
    if (w->thread_started) {
        (void)kvs_notifier_notify(&w->wake);
        pthread_join(w->thread, NULL);
        w->thread_started = 0;
    }
    /* 4. The processor and the inner adapter: nothing of ours is in flight,
     *    but the caller's pass-through lookups on the inner finish here. */
    int rc = KVS_OK;
    char msg[KVS_ERROR_MSG_MAX] = "";
    int rp = proc_close(w);
    if (rp != KVS_OK) {
        rc = rp;
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
    }
    int ri = kvs_l2_close(w->inner);
    if (ri != KVS_OK && rc == KVS_OK) {
        rc = ri;
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
    }
    /* 5. Release the pool and the fds. */
    lock_mu(w);
    struct temp *idle = w->idle_temps;
    w->idle_temps = NULL;
    w->pool_cached = 0;
    w->temps_cached = 0;
    unlock_mu(w, &idle);
    kvs_l2_tq_close_fds(&w->tq);
    kvs_notifier_close(&w->wake);
    w->closed = 1;
    pthread_mutex_unlock(&w->close_mu);
    if (rc != KVS_OK) return kvs_set_error(rc, "%s", msg);
    return KVS_OK;
}

static void wr_free(struct wrapper *w)
{
    kvs_l2_destroy(w->inner);
    kvs_processor_destroy(w->proc);
    kvs_multi_processor_destroy(w->mproc);
    if (w->tq_ready) kvs_l2_tq_destroy(&w->tq);
    kvs_notifier_close(&w->wake);
    free_list(w->idle_temps);
    pthread_cond_destroy(&w->idle_cv);
    pthread_mutex_destroy(&w->idle_mu);
    pthread_mutex_destroy(&w->mu);
    pthread_mutex_destroy(&w->close_mu);
    free(w);
}

static void wr_destroy(kvs_l2_adapter *a)
{
    struct wrapper *w = wr_of(a);
    (void)wr_close(a);
    wr_free(w);
}

static const struct kvs_l2_adapter_ops wrapper_ops = {
    .name = "serde",
    .store_event_fd = wr_store_event_fd,
    .lookup_event_fd = wr_lookup_event_fd,
    .load_event_fd = wr_load_event_fd,
    .submit_store = wr_submit_store,
    .pop_completed_stores = wr_pop_completed_stores,
    .submit_lookup_and_lock = wr_submit_lookup_and_lock,
    .query_lookup_and_lock = wr_query_lookup_and_lock,
    .unlock = wr_unlock,
    .submit_load = wr_submit_load,
    .query_load = wr_query_load,
    .delete_keys = wr_delete,
    .object_sizes = wr_object_sizes,
    .usage = wr_usage,
    .status = wr_status,
    .close = wr_close,
    .destroy = wr_destroy,
    .list_keys = wr_list_keys,
};

/* kvs_l2_submit_store_groups / _load_groups (l2/builtins.h): only a
 * wrapper takes groups. */
int kvs_serde_wrapper_submit_groups(kvs_l2_adapter *a, int load, const kvs_object_key *keys,
                                    kvs_memobj *const *groups, size_t n, size_t group_size,
                                    kvs_l2_task_id *id)
{
    if (a->ops != &wrapper_ops)
        return kvs_set_error(KVS_EINVAL,
                             "l2: adapter '%s' takes whole objects, not groups: groups need an "
                             "adapter whose \"serde\" is multi-output",
                             a->ops->name ? a->ops->name : "?");
    return submit_groups(a, load ? KVS_L2_LOAD : KVS_L2_STORE, keys, groups, n, group_size, id);
}

/* ---------------------------------------------------------------------
 * Create
 * ------------------------------------------------------------------ */

/* Both shapes: exactly one of proc / mproc is set (l2/builtins.h). */
int kvs_serde_wrapper_create_named(kvs_l2_adapter *inner, kvs_processor *proc,
                                   kvs_multi_processor *mproc,
                                   const kvs_serde_wrapper_options *options,
                                   const char *serde_name, kvs_l2_adapter **out)
{
    if (inner == NULL || (proc == NULL && mproc == NULL) || out == NULL) {
        kvs_l2_destroy(inner);
        kvs_processor_destroy(proc);
        kvs_multi_processor_destroy(mproc);
        return kvs_set_error(KVS_EINVAL, "%s: NULL %s", OWNER,
                             inner == NULL                     ? "inner adapter"
                             : proc == NULL && mproc == NULL ? "serde processor"
                                                               : "out");
    }
    struct wrapper *w = calloc(1, sizeof *w);
    if (w == NULL) {
        kvs_l2_destroy(inner);
        kvs_processor_destroy(proc);
        kvs_multi_processor_destroy(mproc);
        return kvs_set_error(KVS_ENOMEM, "%s: out of memory", OWNER);
    }
    w->base.ops = &wrapper_ops;
    w->inner = inner;
    w->proc = proc;
    w->mproc = mproc;
    w->gs = mproc ? kvs_multi_processor_group_size(mproc) : 0;
    snprintf(w->serde_name, sizeof w->serde_name, "%s",
             serde_name && serde_name[0] ? serde_name
             : mproc                     ? "multi-output"
                                         : "single-output");
    w->wake.fd = -1;
    w->pool_capacity = options && options->temp_pool_bytes ? options->temp_pool_bytes
                                                            : DEFAULT_POOL_BYTES;
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->idle_mu, NULL);
    pthread_cond_init(&w->idle_cv, NULL);
    pthread_mutex_init(&w->close_mu, NULL);

    /* The four fds the poll thread drains; they must be distinct. */
    int rc = KVS_OK;
    int fds[4];
    const char *names[4] = {"inner store", "inner load", "serialize", "deserialize"};
    fds[0] = kvs_l2_store_event_fd(inner);
    fds[1] = fds[0] < 0 ? fds[0] : kvs_l2_load_event_fd(inner);
    fds[2] = fds[1] < 0   ? fds[1]
             : mproc ? kvs_multi_processor_serialize_event_fd(mproc)
                     : kvs_processor_serialize_event_fd(proc);
    fds[3] = fds[2] < 0   ? fds[2]
             : mproc ? kvs_multi_processor_deserialize_event_fd(mproc)
                     : kvs_processor_deserialize_event_fd(proc);
    if (fds[3] < 0) rc = fds[3]; /* the message is the failing call's */
    for (int i = 0; rc == KVS_OK && i < 4; i++)
        for (int j = i + 1; rc == KVS_OK && j < 4; j++)
            if (fds[i] == fds[j])
                rc = kvs_set_error(KVS_EINVAL, "%s: the %s and %s event fds are the same (%d)",
                                   OWNER, names[i], names[j], fds[i]);
    if (rc == KVS_OK) {
        w->phase_fd[PH_STORE] = fds[0];
        w->phase_fd[PH_LOAD] = fds[1];
        w->phase_fd[PH_SERIALIZE] = fds[2];
        w->phase_fd[PH_DESER] = fds[3];
        install_hooks(w);
        rc = kvs_l2_tq_init(&w->tq, OWNER);
        if (rc == KVS_OK) w->tq_ready = 1;
    }
    if (rc == KVS_OK) rc = kvs_notifier_init(&w->wake, OWNER);
    if (rc == KVS_OK) {
        int e = pthread_create(&w->thread, NULL, poll_main, w);
        if (e != 0)
            rc = kvs_set_error(KVS_EIO, "%s: cannot start the poll thread: %s", OWNER,
                               strerror(e));
        else
            w->thread_started = 1;
    }
    if (rc != KVS_OK) {
        /* Keep the message across the frees (they may set their own). */
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        wr_free(w);
        return kvs_set_error(rc, "%s", msg);
    }
    (void)pthread_setname_np(w->thread, "kvs-serde-l2");
    *out = &w->base;
    return KVS_OK;
}

KVS_API int kvs_serde_wrapper_create(kvs_l2_adapter *inner, kvs_processor *serde,
                                     const kvs_serde_wrapper_options *options,
                                     kvs_l2_adapter **out)
{
    if (serde == NULL) { /* say which shape was asked for */
        kvs_l2_destroy(inner);
        return kvs_set_error(KVS_EINVAL, "%s: NULL %s", OWNER,
                             inner == NULL ? "inner adapter" : "serde processor");
    }
    return kvs_serde_wrapper_create_named(inner, serde, NULL, options, NULL, out);
}

KVS_API int kvs_serde_wrapper_create_multi(kvs_l2_adapter *inner, kvs_multi_processor *serde,
                                           const kvs_serde_wrapper_options *options,
                                           kvs_l2_adapter **out)
{
    if (serde == NULL) {
        kvs_l2_destroy(inner);
        return kvs_set_error(KVS_EINVAL, "%s: NULL %s", OWNER,
                             inner == NULL ? "inner adapter" : "serde processor");
    }
    return kvs_serde_wrapper_create_named(inner, NULL, serde, options, NULL, out);
}
