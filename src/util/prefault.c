/* prefault.c - see prefault.h. */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "util/prefault.h"

void kvs_prefault(void *p, size_t n)
{
#ifdef MADV_POPULATE_WRITE
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || p == NULL) return;
    uintptr_t a = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~((uintptr_t)page - 1);
    if (e > a) (void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
#else
    (void)p;
    (void)n;
#endif
}
