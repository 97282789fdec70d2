/* memory_adapter.c - the "memory" L2 adapter (kvserde/l2_memory.h): a hash
 * map from object key to a private copy of the stored bytes, with the whole
 * L2 contract, plus fault injection for tests.
 *
 * Threads and locks:
 *   - The completion plumbing (ids, eventfds, unread results, the pool,
 *     close) is the adapters' shared base (adapter_base.h).
 *   - Stores, lookups and loads run as jobs on the adapter's thread pool,
 *     so even the memcpy happens off the caller's thread.
 *   - `mu` guards the map, the usage counter and the lock counts. The bytes
 *     of an object are a reference-counted blob, so a load copies them out
 *     without holding `mu` while a concurrent store may replace the entry
 *     or a delete may drop it; a store likewise copies into a new blob
 *     before taking `mu` and only swaps pointers under it.
 *   - `fault_mu` guards the fault list; a task reads it at its start and
 *     per key.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvserde/error.h"
#include "kvserde/export.h"
#include "kvserde/l2.h"
#include "kvserde/l2_memory.h"
#include "kvserde/registry.h"
#include "l2/adapter_base.h"
#include "l2/builtins.h"

/* The stored bytes of one object, shared by the map entry and the loads
 * copying from it. refs is guarded by the adapter's mu. */
typedef struct blob {
    size_t refs;
    size_t size;
    unsigned char data[];
} blob;

typedef struct entry {
    struct entry *next; /* bucket chain */
    uint64_t hash;
    kvs_object_key key;
    blob *bytes;
    uint64_t locks; /* lookups that found it minus unlocks */
} entry;

typedef struct fault {
    kvs_memory_fault_op op;
    int any_key;
    kvs_object_key key;
    int status;
    uint64_t latency_us;
} fault;

typedef struct memory_adapter {
    kvs_l2_adapter_base base;   /* runs each task as one pool job, no runner */
    unsigned workers;
    uint64_t capacity;

    pthread_mutex_t mu; /* guards everything in this group */
    entry **buckets;
    size_t nbuckets;    /* a power of two */
    size_t nentries;
    uint64_t bytes_used;

    pthread_mutex_t fault_mu;
    fault *faults;
    size_t nfaults, faults_cap;
} memory_adapter;

/* One submitted task: the task queue's record plus copies of the caller's
 * arrays (keys[n], then objects[n] for stores and loads). */
typedef struct mem_task {
    kvs_job job;
    memory_adapter *m;
    kvs_l2_task *t;
    size_t n;
    kvs_memobj **objects; /* NULL for lookups */
    kvs_object_key keys[];
} mem_task;

static const char *const op_name[3] = {"store", "lookup", "load"};

static const struct kvs_l2_adapter_ops memory_ops;

static memory_adapter *mem_of(kvs_l2_adapter *a)
{
    return KVS_CONTAINER_OF(a, memory_adapter, base.adapter);
}

/* ---------------------------------------------------------------------
 * The map (callers hold mu)
 * ------------------------------------------------------------------ */

static void hash_bytes(uint64_t *h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        *h ^= b[i];
        *h *= 0x100000001b3ull; /* FNV-1a */
    }
}

static uint64_t key_hash(const kvs_object_key *k)
{
    uint64_t h = 0xcbf29ce484222325ull;
    uint64_t len = k->chunk_hash_len;
    hash_bytes(&h, &len, sizeof len);
    hash_bytes(&h, k->chunk_hash, k->chunk_hash_len);
    /* Strings with their NUL, so ("ab", "c") and ("a", "bc") differ. */
    hash_bytes(&h, k->model_name, strlen(k->model_name) + 1);
    hash_bytes(&h, &k->kv_rank, sizeof k->kv_rank);
    hash_bytes(&h, &k->object_group_id, sizeof k->object_group_id);
    hash_bytes(&h, k->cache_salt, strlen(k->cache_salt) + 1);
    return h;
}

static entry **find_slot(memory_adapter *m, const kvs_object_key *k, uint64_t h)
{
    entry **slot = &m->buckets[h & (m->nbuckets - 1)];
    while (*slot && !((*slot)->hash == h && kvs_object_key_equal(&(*slot)->key, k)))
        slot = &(*slot)->next;
    return slot;
}

static entry *find(memory_adapter *m, const kvs_object_key *k)
{
    return *find_slot(m, k, key_hash(k));
}

/* Double the bucket array when the map is fuller than one entry per
 * bucket. A failed allocation just keeps the chains longer. */
static void maybe_grow(memory_adapter *m)
{
    if (m->nentries < m->nbuckets) return;
    size_t nb = m->nbuckets * 2;
    entry **nbk = calloc(nb, sizeof *nbk);
    if (nbk == NULL) return;
    for (size_t i = 0; i < m->nbuckets; i++) {
        entry *e = m->buckets[i];
        while (e) {
            entry *next = e->next;
            e->next = nbk[e->hash & (nb - 1)];
            nbk[e->hash & (nb - 1)] = e;
            e = next;
        }
    }
    free(m->buckets);
    m->buckets = nbk;
    m->nbuckets = nb;
}

static void blob_unref(blob *b)
{
    if (b && --b->refs == 0) free(b);
}

/* ---------------------------------------------------------------------
 * Faults
 * ------------------------------------------------------------------ */

static int fault_matches(const fault *f, kvs_l2_direction d, const kvs_object_key *k)
{
    return (int)f->op == (int)d && (f->any_key || kvs_object_key_equal(&f->key, k));
}

/* The task's injected latency: the sum over faults of its direction that
 * match one of its keys. */
static uint64_t task_latency(memory_adapter *m, const mem_task *mt)
{
    uint64_t us = 0;
    kvs_l2_direction d = mt->t->direction;
    pthread_mutex_lock(&m->fault_mu);
    for (size_t f = 0; f < m->nfaults; f++) {
        if (m->faults[f].latency_us == 0) continue;
        for (size_t i = 0; i < mt->n; i++) {
            if (fault_matches(&m->faults[f], d, &mt->keys[i])) {
                us += m->faults[f].latency_us;
                break;
            }
        }
    }
    pthread_mutex_unlock(&m->fault_mu);
    return us;
}

static void sleep_us(uint64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* If an injected fault fails key i of the task, record it and return 1. */
static int injected_failure(memory_adapter *m, mem_task *mt, size_t i)
{
    kvs_l2_direction d = mt->t->direction;
    int status = KVS_OK;
    pthread_mutex_lock(&m->fault_mu);
    for (size_t f = 0; f < m->nfaults && status == KVS_OK; f++)
        if (m->faults[f].status != KVS_OK && fault_matches(&m->faults[f], d, &mt->keys[i]))
            status = m->faults[f].status;
    pthread_mutex_unlock(&m->fault_mu);
    if (status == KVS_OK) return 0;
    char msg[KVS_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "memory: injected %s fault on key %zu: %s", op_name[d], i,
             kvs_strerror(status));
    kvs_l2_tq_fail(mt->t, status, msg);
    return 1;
}

/* ---------------------------------------------------------------------
 * Worker side
 * ------------------------------------------------------------------ */

static void fail_task(kvs_l2_task *t, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail_task(kvs_l2_task *t, int status, const char *fmt, ...)
{
    char msg[KVS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvs_l2_tq_fail(t, status, msg);
}

/* Store key i; 0 on success, else the task has failed. */
static int store_one(memory_adapter *m, mem_task *mt, size_t i)
{
    kvs_l2_task *t = mt->t;
    if (injected_failure(m, mt, i)) return -1;
    const kvs_memobj *obj = mt->objects[i];
    size_t size = kvs_memobj_size(obj);
    /* Copy before taking the lock: a big memcpy never holds up the map. */
    blob *b = malloc(sizeof *b + size);
    if (b == NULL) {
        fail_task(t, KVS_ENOMEM, "memory: out of memory storing key %zu (%zu bytes)", i,
                  size);
        return -1;
    }
    b->refs = 1;
    b->size = size;
    if (size) memcpy(b->data, obj->data, size);

    const kvs_object_key *k = &mt->keys[i];
    uint64_t h = key_hash(k);
    pthread_mutex_lock(&m->mu);
    entry **slot = find_slot(m, k, h);
    uint64_t old = *slot ? (*slot)->bytes->size : 0;
    uint64_t after = m->bytes_used - old + size;
    if (m->capacity && after > m->capacity) {
        pthread_mutex_unlock(&m->mu);
        free(b);
        fail_task(t, KVS_ENOSPC,
                  "memory: capacity exceeded storing key %zu: %zu bytes would make "
                  "%llu bytes used, capacity %llu",
                  i, size, (unsigned long long)after, (unsigned long long)m->capacity);
        return -1;
    }
    blob *replaced = NULL;
    if (*slot) {
        replaced = (*slot)->bytes;
        (*slot)->bytes = b;
    } else {
        entry *e = malloc(sizeof *e);
        if (e == NULL) {
            pthread_mutex_unlock(&m->mu);
            free(b);
            fail_task(t, KVS_ENOMEM, "memory: out of memory storing key %zu", i);
            return -1;
        }
        e->next = NULL;
        e->hash = h;
        e->key = *k;
        e->bytes = b;
        e->locks = 0;
        *slot = e;
        m->nentries++;
        maybe_grow(m);
    }
    m->bytes_used = after;
    blob_unref(replaced);
    pthread_mutex_unlock(&m->mu);
    t->store.bytes_written += size;
    return 0;
}

static void run_store(memory_adapter *m, mem_task *mt)
{
    for (size_t i = 0; i < mt->n; i++)
        if (store_one(m, mt, i) != 0) break;
}

static void run_lookup(memory_adapter *m, mem_task *mt)
{
    for (size_t i = 0; i < mt->n; i++) {
        if (injected_failure(m, mt, i)) continue;
        pthread_mutex_lock(&m->mu);
        entry *e = find(m, &mt->keys[i]);
        if (e) e->locks++;
        pthread_mutex_unlock(&m->mu);
        if (e) kvs_l2_tq_hit(mt->t, i);
    }
}

static void run_load(memory_adapter *m, mem_task *mt)
{
    kvs_l2_task *t = mt->t;
    for (size_t i = 0; i < mt->n; i++) {
        if (injected_failure(m, mt, i)) continue;
        kvs_memobj *obj = mt->objects[i];
        pthread_mutex_lock(&m->mu);
        entry *e = find(m, &mt->keys[i]);
        blob *b = e ? e->bytes : NULL;
        size_t size = b ? b->size : 0;
        uint64_t need = 0;
        int wrong = b && kvs_l2_load_wrong_size(obj, size, &need);
        if (b && !wrong && size <= obj->capacity) b->refs++; /* keep it while copying */
        pthread_mutex_unlock(&m->mu);
        if (b == NULL) {
            fail_task(t, KVS_ENOTFOUND, "memory: load of key %zu: not found", i);
            continue;
        }
        if (wrong) {
            fail_task(t, KVS_ECORRUPT,
                      "memory: load of key %zu: stored object is %zu bytes, destination "
                      "layout needs %llu",
                      i, size, (unsigned long long)need);
            continue;
        }
        if (size > obj->capacity) {
            fail_task(t, KVS_ENOSPC,
                      "memory: load of key %zu: stored object is %zu bytes, destination "
                      "holds %zu",
                      i, size, obj->capacity);
            continue;
        }
        if (size) memcpy(obj->data, b->data, size);
        (void)kvs_memobj_set_used_size(obj, size); /* cannot fail: size fits */
        pthread_mutex_lock(&m->mu);
        blob_unref(b);
        pthread_mutex_unlock(&m->mu);
        kvs_l2_tq_hit(t, i);
    }
}

static void run_task(kvs_job *job)
{
    mem_task *mt = KVS_CONTAINER_OF(job, mem_task, job);
    memory_adapter *m = mt->m;
    uint64_t us = task_latency(m, mt);
    if (us) sleep_us(us);
    switch (mt->t->direction) {
    case KVS_L2_STORE: run_store(m, mt); break;
    case KVS_L2_LOOKUP: run_lookup(m, mt); break;
    case KVS_L2_LOAD: run_load(m, mt); break;
    }
    /* The queue owns the record from here; the adapter outlives this call
     * (close joins the workers before anything is freed). */
    kvs_l2_tq_complete(&m->base.q, mt->t);
    free(mt);
}

/* ---------------------------------------------------------------------
 * Submit side
 * ------------------------------------------------------------------ */

static int submit(memory_adapter *m, kvs_l2_direction d, const kvs_object_key *keys,
                  kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    /* Everything that can fail happens before the task takes an id. */
    int with_objects = d != KVS_L2_LOOKUP;
    size_t per = sizeof(kvs_object_key) + (with_objects ? sizeof(kvs_memobj *) : 0);
    if (n > (SIZE_MAX - sizeof(mem_task)) / per)
        return kvs_set_error(KVS_ENOMEM, "memory: batch of %zu keys is too large", n);
    mem_task *mt = malloc(sizeof *mt + n * per);
    if (mt == NULL)
        return kvs_set_error(KVS_ENOMEM, "memory: out of memory for a task of %zu keys", n);
    mt->job.next = NULL;
    mt->job.run = run_task;
    mt->m = m;
    mt->n = n;
    if (n) memcpy(mt->keys, keys, n * sizeof *keys);
    mt->objects = NULL;
    if (with_objects) {
        mt->objects = (kvs_memobj **)(void *)(mt->keys + n);
        if (n) memcpy(mt->objects, objects, n * sizeof *objects);
    }
    int rc = kvs_l2_tq_begin(&m->base.q, d, n, &mt->t);
    if (rc != KVS_OK) {
        free(mt);
        return rc;
    }
    *id = mt->t->id;
    if (n == 0) {
        /* Nothing to do: finish at once (before end_submit, so close cannot
         * have closed the fd in between). */
        kvs_l2_tq_complete(&m->base.q, mt->t);
        free(mt);
    } else if ((rc = kvs_thread_pool_submit(m->base.pool, &mt->job)) != KVS_OK) {
        /* Cannot happen: close stops the pool only after every submit in
         * progress has ended. Complete as failed rather than lose the id. */
        kvs_l2_tq_fail(mt->t, rc, kvs_last_error());
        kvs_l2_tq_complete(&m->base.q, mt->t);
        free(mt);
    }
    kvs_l2_tq_end_submit(&m->base.q);
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * Ops
 * ------------------------------------------------------------------ */

static int mem_submit_store(kvs_l2_adapter *a, const kvs_object_key *keys,
                            kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    return submit(mem_of(a), KVS_L2_STORE, keys, objects, n, id);
}

static int mem_submit_lookup(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                             kvs_l2_task_id *id)
{
    return submit(mem_of(a), KVS_L2_LOOKUP, keys, NULL, n, id);
}

static int mem_unlock(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n)
{
    memory_adapter *m = mem_of(a);
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        entry *e = find(m, &keys[i]);
        if (e && e->locks > 0) e->locks--;
    }
    pthread_mutex_unlock(&m->mu);
    return KVS_OK;
}

static int mem_submit_load(kvs_l2_adapter *a, const kvs_object_key *keys,
                           kvs_memobj *const *objects, size_t n, kvs_l2_task_id *id)
{
    return submit(mem_of(a), KVS_L2_LOAD, keys, objects, n, id);
}

static int mem_delete(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                      uint8_t *deleted)
{
    memory_adapter *m = mem_of(a);
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        entry **slot = find_slot(m, &keys[i], key_hash(&keys[i]));
        entry *e = *slot;
        int gone = e != NULL && e->locks == 0; /* a locked key is kept */
        if (gone) {
            *slot = e->next;
            m->nentries--;
            m->bytes_used -= e->bytes->size;
            blob_unref(e->bytes); /* a load still copying keeps it alive */
            free(e);
        }
        if (deleted) deleted[i] = (uint8_t)gone;
    }
    pthread_mutex_unlock(&m->mu);
    return KVS_OK;
}

static int mem_object_sizes(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                            int64_t *sizes)
{
    memory_adapter *m = mem_of(a);
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < n; i++) {
        entry *e = find(m, &keys[i]);
        sizes[i] = e ? (int64_t)e->bytes->size : -1;
    }
    pthread_mutex_unlock(&m->mu);
    return KVS_OK;
}

/* Every key is copied out under mu first, then fn runs without it: fn may
 * call back into the adapter, and a store that grows the map meanwhile
 * cannot make the listing see a key twice or miss one. */
static int mem_list_keys(kvs_l2_adapter *a, kvs_l2_key_fn fn, void *ctx)
{
    memory_adapter *m = mem_of(a);
    if (kvs_l2_tq_is_closed(&m->base.q))
        return kvs_l2_base_refuse_closed(&m->base);
    pthread_mutex_lock(&m->mu);
    size_t n = m->nentries, k = 0;
    kvs_object_key *keys = malloc((n ? n : 1) * sizeof *keys);
    for (size_t b = 0; keys && b < m->nbuckets; b++)
        for (entry *e = m->buckets[b]; e; e = e->next) keys[k++] = e->key;
    pthread_mutex_unlock(&m->mu);
    if (keys == NULL)
        return kvs_set_error(KVS_ENOMEM, "memory: out of memory listing %zu keys", n);
    int rc = KVS_OK;
    for (size_t i = 0; i < k && rc == 0; i++) rc = fn(ctx, &keys[i]);
    free(keys);
    return rc;
}

static int mem_usage(kvs_l2_adapter *a, kvs_l2_usage *out)
{
    memory_adapter *m = mem_of(a);
    pthread_mutex_lock(&m->mu);
    out->bytes_used = m->bytes_used;
    out->capacity = m->capacity;
    pthread_mutex_unlock(&m->mu);
    return KVS_OK;
}

static int mem_status(kvs_l2_adapter *a, json_t **out)
{
    memory_adapter *m = mem_of(a);
    int closed = kvs_l2_tq_is_closed(&m->base.q); /* closing counts as closed */
    pthread_mutex_lock(&m->mu);
    size_t keys = m->nentries, locked = 0;
    uint64_t used = m->bytes_used;
    for (size_t b = 0; b < m->nbuckets; b++)
        for (entry *e = m->buckets[b]; e; e = e->next) locked += e->locks > 0;
    pthread_mutex_unlock(&m->mu);
    json_t *s = json_pack("{s:s, s:b, s:I, s:I, s:I, s:I, s:I}", "type", "memory",
                          "is_healthy", !closed, "keys", (json_int_t)keys, "bytes_used",
                          (json_int_t)used, "capacity_bytes", (json_int_t)m->capacity,
                          "locked_keys", (json_int_t)locked, "workers",
                          (json_int_t)m->workers);
    if (s == NULL) return kvs_set_error(KVS_ENOMEM, "memory: out of memory for status");
    *out = s;
    return KVS_OK;
}

static void mem_destroy(kvs_l2_adapter *a)
{
    memory_adapter *m = mem_of(a);
    kvs_l2_base_destroy(&m->base);
    for (size_t b = 0; b < m->nbuckets; b++) {
        entry *e = m->buckets[b];
        while (e) {
            entry *next = e->next;
            blob_unref(e->bytes);
            free(e);
            e = next;
        }
    }
    free(m->buckets);
    free(m->faults);
    pthread_mutex_destroy(&m->fault_mu);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

static const struct kvs_l2_adapter_ops memory_ops = {
    .name = "memory",
    KVS_L2_BASE_COMPLETION_OPS,
    .submit_store = mem_submit_store,
    .submit_lookup_and_lock = mem_submit_lookup,
    .unlock = mem_unlock,
    .submit_load = mem_submit_load,
    .delete_keys = mem_delete,
    .object_sizes = mem_object_sizes,
    .usage = mem_usage,
    .status = mem_status,
    .destroy = mem_destroy,
    .list_keys = mem_list_keys,
};

/* ---------------------------------------------------------------------
 * Public API
 * ------------------------------------------------------------------ */

#define INITIAL_BUCKETS 64

int kvs_memory_adapter_create(const kvs_memory_adapter_options *options,
                              kvs_l2_adapter **out)
{
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "memory: output pointer is NULL");
    kvs_memory_adapter_options o = {0};
    if (options) o = *options;
    if (o.workers == 0) o.workers = KVS_MEMORY_DEFAULT_WORKERS;
    if (o.workers > KVS_MEMORY_MAX_WORKERS)
        return kvs_set_error(KVS_EINVAL, "memory: workers %u out of range [1, %u]",
                             o.workers, (unsigned)KVS_MEMORY_MAX_WORKERS);
    memory_adapter *m = calloc(1, sizeof *m);
    entry **buckets = calloc(INITIAL_BUCKETS, sizeof *buckets);
    if (m == NULL || buckets == NULL) {
        free(m);
        free(buckets);
        return kvs_set_error(KVS_ENOMEM, "memory: out of memory creating the adapter");
    }
    m->capacity = o.capacity_bytes;
    m->workers = o.workers;
    m->buckets = buckets;
    m->nbuckets = INITIAL_BUCKETS;
    int rc = kvs_l2_base_init(&m->base, &memory_ops, "memory", NULL);
    if (rc != KVS_OK) {
        free(buckets);
        free(m);
        return rc;
    }
    pthread_mutex_init(&m->mu, NULL);
    pthread_mutex_init(&m->fault_mu, NULL);
    rc = kvs_l2_base_start(&m->base, o.workers, "kvs-mem", NULL, NULL);
    if (rc != KVS_OK) {
        mem_destroy(&m->base.adapter); /* no pool: kvs_l2_base_destroy skips it */
        return rc;
    }
    *out = &m->base.adapter;
    return KVS_OK;
}

/* The memory adapter behind `a`, or NULL with a message. */
static memory_adapter *as_memory(kvs_l2_adapter *a)
{
    if (a == NULL) {
        kvs_set_error(KVS_EINVAL, "memory: adapter is NULL");
        return NULL;
    }
    if (a->ops != &memory_ops) {
        kvs_set_error(KVS_EINVAL, "memory: adapter is of type '%s', not 'memory'",
                      a->ops && a->ops->name ? a->ops->name : "?");
        return NULL;
    }
    return mem_of(a);
}

int kvs_memory_adapter_inject(kvs_l2_adapter *a, const kvs_memory_fault *fault_in)
{
    memory_adapter *m = as_memory(a);
    if (m == NULL) return KVS_EINVAL;
    if (fault_in == NULL) return kvs_set_error(KVS_EINVAL, "memory: fault is NULL");
    if ((int)fault_in->op < 0 || (int)fault_in->op > 2)
        return kvs_set_error(KVS_EINVAL, "memory: unknown fault op %d", (int)fault_in->op);
    if (fault_in->status > 0)
        return kvs_set_error(KVS_EINVAL,
                             "memory: fault status %d is not KVS_OK or a KVS_E* code",
                             fault_in->status);
    fault f = {.op = fault_in->op,
               .any_key = fault_in->key == NULL,
               .status = fault_in->status,
               .latency_us = fault_in->latency_us};
    if (fault_in->key) {
        if (kvs_object_key_validate(fault_in->key) != KVS_OK) {
            char reason[KVS_ERROR_MSG_MAX];
            snprintf(reason, sizeof reason, "%s", kvs_last_error());
            return kvs_set_error(KVS_EINVAL, "memory: fault key: %s", reason);
        }
        f.key = *fault_in->key;
    }
    pthread_mutex_lock(&m->fault_mu);
    if (m->nfaults == m->faults_cap) {
        size_t cap = m->faults_cap ? 2 * m->faults_cap : 8;
        fault *nf = realloc(m->faults, cap * sizeof *nf);
        if (nf == NULL) {
            pthread_mutex_unlock(&m->fault_mu);
            return kvs_set_error(KVS_ENOMEM, "memory: out of memory for %zu faults", cap);
        }
        m->faults = nf;
        m->faults_cap = cap;
    }
    m->faults[m->nfaults++] = f;
    pthread_mutex_unlock(&m->fault_mu);
    return KVS_OK;
}

int kvs_memory_adapter_clear_faults(kvs_l2_adapter *a)
{
    memory_adapter *m = as_memory(a);
    if (m == NULL) return KVS_EINVAL;
    pthread_mutex_lock(&m->fault_mu);
    m->nfaults = 0;
    pthread_mutex_unlock(&m->fault_mu);
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * The registry's factory
 * ------------------------------------------------------------------ */

int kvs_memory_adapter_factory(const json_t *spec, void *userdata, kvs_l2_adapter **out)
{
    (void)userdata;
    static const char *const known[] = {"capacity_bytes", "workers", NULL};
    int rc = kvs_json_check_keys(spec, "memory", "key", known);
    if (rc) return rc;
    kvs_memory_adapter_options o = {0};
    const json_t *cap = json_object_get(spec, "capacity_bytes");
    if (cap != NULL) {
        if (!json_is_integer(cap))
            return kvs_set_error(KVS_EINVAL,
                                 "memory: capacity_bytes must be an integer >= 0, got %s",
                                 kvs_json_type_name(cap));
        if (json_integer_value(cap) < 0)
            return kvs_set_error(KVS_EINVAL,
                                 "memory: capacity_bytes must be an integer >= 0, got %lld",
                                 (long long)json_integer_value(cap));
        o.capacity_bytes = (uint64_t)json_integer_value(cap);
    }
    rc = kvs_kwargs_get_positive_int(spec, "memory", "workers", KVS_MEMORY_DEFAULT_WORKERS,
                                     &o.workers);
    if (rc) return rc;
    return kvs_memory_adapter_create(&o, out);
}
