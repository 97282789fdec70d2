/* blas.c - OpenBLAS's routines by dlopen on first use (blas.h). */
#include "codecs/blas.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "kvserde/error.h"

#define OPENBLAS_SONAME "libopenblas.so.0"

static kvs_blas table;
static char failure[256]; /* why loading failed; empty once loaded */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void)
{
    void *h = dlopen(OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        const char *why = dlerror();
        snprintf(failure, sizeof failure, "%s", why ? why : "unknown reason");
        return;
    }
    static const char *const names[3] = {"cblas_sgemm", "cblas_dsyrk", "dsyevd_"};
    void *fn[3];
    for (int i = 0; i < 3; i++)
        if ((fn[i] = dlsym(h, names[i])) == NULL) {
            snprintf(failure, sizeof failure, "it has no %s", names[i]);
            return;
        }
    /* POSIX: a function pointer round-trips through dlsym's void * */
    *(void **)&table.sgemm = fn[0];
    *(void **)&table.dsyrk = fn[1];
    *(void **)&table.dsyevd = fn[2];
}

int kvs_blas_get(const char *who, const kvs_blas **out)
{
    pthread_once(&load_once, load);
    if (table.sgemm == NULL)
        return kvs_set_error(KVS_EUNSUPPORTED, "%s: OpenBLAS (%s) cannot be loaded: %s", who,
                             OPENBLAS_SONAME, failure);
    *out = &table;
    return KVS_OK;
}
