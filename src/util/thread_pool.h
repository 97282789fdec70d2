/* thread_pool.h - a fixed set of worker threads draining one FIFO queue.
 *
 * Jobs are intrusive: the caller embeds a kvs_job in its own task struct and
 * recovers the task in run() with KVS_CONTAINER_OF. Submitting therefore
 * never allocates and can only fail once the pool is shut down, so a caller
 * that has already handed out a task id never has to take it back.
 *
 * run() executes on a worker thread with no pool lock held; it may free the
 * job (the pool does not touch a job after calling run). Jobs run in FIFO
 * order of submission; with more than one thread, several run at once.
 *
 * Worker threads block every signal, so the host program's handlers run on
 * its own threads.
 */
#ifndef KVS_UTIL_THREAD_POOL_H
#define KVS_UTIL_THREAD_POOL_H

typedef struct kvs_job {
    struct kvs_job *next;            /* owned by the pool while queued */
    void (*run)(struct kvs_job *job);
} kvs_job;

typedef struct kvs_thread_pool kvs_thread_pool;

/* Start `nthreads` (>= 1) workers, named "<name>-<i>" (as far as the kernel's
 * 15 characters allow). KVS_EINVAL for nthreads == 0; KVS_EIO if a thread
 * cannot be started ("thread pool: cannot start thread 2 of 4: ...": the ones
 * already started are joined); KVS_ENOMEM. */
int kvs_thread_pool_create(unsigned nthreads, const char *name,
                           kvs_thread_pool **out);

/* Append `job` (its run member set) to the queue and wake a worker.
 * KVS_ECLOSED once shutdown has begun; the job is then not queued. */
int kvs_thread_pool_submit(kvs_thread_pool *pool, kvs_job *job);

/* Refuse new jobs, let the workers run every job already queued, then join
 * them. Blocks until done; a later or concurrent call returns once the
 * workers are joined. KVS_EINVAL when called from one of the pool's own
 * workers (it would wait for itself); the pool is then left as it was. */
int kvs_thread_pool_shutdown(kvs_thread_pool *pool);

/* Shut down (if needed) and free. NULL is a no-op. */
void kvs_thread_pool_destroy(kvs_thread_pool *pool);

/* The number of worker threads. */
unsigned kvs_thread_pool_size(const kvs_thread_pool *pool);

#endif /* KVS_UTIL_THREAD_POOL_H */
