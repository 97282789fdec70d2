/* prefault.h - internal: map a fresh buffer's pages before it is written.
 *
 * A buffer from malloc of a few MiB is an mmap whose pages the kernel maps
 * one fault at a time on first touch; a buffer the library keeps and reuses
 * (the serde wrapper's temps, the pipeline's decode scratch) is better
 * mapped once, in one call, when it is made. */
#ifndef KVSERDE_UTIL_PREFAULT_H
#define KVSERDE_UTIL_PREFAULT_H

#include <stddef.h>

/* Map the whole pages inside [p, p+n) writable now (MADV_POPULATE_WRITE,
 * Linux 5.14). Best effort: where the kernel refuses, the pages fault in on
 * first touch as before. The contents are unchanged. */
void kvs_prefault(void *p, size_t n);

#endif /* KVSERDE_UTIL_PREFAULT_H */
