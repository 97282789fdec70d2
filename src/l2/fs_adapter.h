/* fs_adapter.h - internal hooks of the fs adapter (kvserde/l2_fs.h) for
 * tests. The registry's factory is declared in l2/builtins.h. */
#ifndef KVS_L2_FS_ADAPTER_H
#define KVS_L2_FS_ADAPTER_H

#include <stddef.h>

#include "kvserde/l2.h"

/* Called on the worker thread by every load, between taking the file's
 * size (fstat) and reading it, with the open fd and the key's index in its
 * task: lets a test change the file under the reader. Set it before
 * submitting the loads it should see; NULL removes it. Ignored for an
 * adapter that is not "fs". */
typedef void (*kvs_fs_read_hook)(void *arg, int fd, size_t key_index);
void kvs_fs_adapter_set_read_hook(kvs_l2_adapter *a, kvs_fs_read_hook hook, void *arg);

#endif /* KVS_L2_FS_ADAPTER_H */
