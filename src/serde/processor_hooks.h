/* processor_hooks.h - internal: completion hooks on the async processors
 * (util/completion_hook.h), for the serde wrapper's phase chaining.
 *
 * Installs `ser` for finished serialize tasks and `de` for finished
 * deserialize tasks (a hook whose fn is NULL leaves that direction on its
 * event fd). Call before the first submit. Returns 1 if installed, 0 if
 * the processor is not one of kvs_async_processor_create's (resp.
 * kvs_async_multi_processor_create's): another implementation keeps
 * signalling its fds, and the caller polls them. */
#ifndef KVS_SERDE_PROCESSOR_HOOKS_H
#define KVS_SERDE_PROCESSOR_HOOKS_H

#include "kvserde/multi_processor.h"
#include "kvserde/processor.h"
#include "util/completion_hook.h"

int kvs_async_processor_set_hooks(kvs_processor *p, kvs_completion_hook ser,
                                  kvs_completion_hook de);
int kvs_async_multi_processor_set_hooks(kvs_multi_processor *p, kvs_completion_hook ser,
                                        kvs_completion_hook de);

/* Run a task whose objects (both sides, by capacity) add up to at most
 * max_bytes on the thread that submits it, inside the submit, instead of
 * waking a worker (0, the default: every task goes to a worker). Its hook
 * (or fd) then fires before the submit returns, on that thread. For the
 * serde wrapper, whose submits come from the thread that finished the
 * previous phase: a small task's transform costs less than the wake-up of
 * another thread. Returns 1 if set, 0 for another processor implementation. */
int kvs_async_processor_set_inline(kvs_processor *p, size_t max_bytes);
int kvs_async_multi_processor_set_inline(kvs_multi_processor *p, size_t max_bytes);

#endif /* KVS_SERDE_PROCESSOR_HOOKS_H */
