/* completion_hook.h - internal: a finished task handed to a function on the
 * thread that finished it, instead of a signal on its event fd.
 *
 * Why: a consumer that chains phases (the serde wrapper: serialize, then
 * the inner store; the inner load, then deserialize) would otherwise have
 * its own thread woken by the fd only to submit the next phase, one more
 * thread wake-up per phase (tens of microseconds on a VM). With a hook the
 * thread that finished phase k submits phase k+1 itself.
 *
 * The rules every component that takes a hook keeps (the async processor,
 * l2/task_queue.c):
 *   - fn(ctx, id) is called once per finished task of the hooked direction,
 *     after its result can be read (queried / popped as usual), with no lock
 *     of the component held, so fn may call the component back (query,
 *     submit) and take its own locks.
 *   - It is called on the thread that finished the task: a worker, or the
 *     submitting thread itself, before the submit returns, for a task that
 *     completes inside its submit (an empty batch, a failed hand-off). A
 *     consumer holding a lock across its submits must expect that re-entry.
 *   - The direction's event fd is then not signalled: the hook replaces it.
 *   - Installed before the first submit of that direction and never changed
 *     after; close joins the threads that call it, so after close no call is
 *     running or will start.
 */
#ifndef KVS_UTIL_COMPLETION_HOOK_H
#define KVS_UTIL_COMPLETION_HOOK_H

#include <stdint.h>

typedef struct kvs_completion_hook {
    void (*fn)(void *ctx, uint64_t id); /* NULL: no hook, signal the fd */
    void *ctx;
} kvs_completion_hook;

#endif /* KVS_UTIL_COMPLETION_HOOK_H */
