/* fp8_dispatch.c - choose the fp8 kernel variant once, at first use.
 *
 * The choice is the best variant this CPU supports, unless the environment
 * variable KVSERDE_ISA names one (read once). A forced variant that is
 * unknown or that this CPU lacks is not silently replaced: every conversion
 * then fails with the reason, until kvs_fp8_set_isa() picks a usable one.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/fp8_kernels.h"
#include "kvserde/error.h"
#include "kvserde/fp8.h"
#include "util/cpu_features.h"

/* Every variant, from the portable one to the widest (best_variant takes
 * the last one this CPU runs). */
static const char *const isa_names[] = {"scalar", "avx2", "avx512", "avx512fp16", NULL};

const char *const *kvs_fp8_isa_names(void)
{
    return isa_names;
}

/* The variant named, if compiled in and supported here; else NULL. */
static const kvs_fp8_kernels *variant(const char *name)
{
    if (strcmp(name, "scalar") == 0) return kvs_fp8_kernels_scalar();
#if KVS_HAVE_X86
    unsigned cpu = kvs_cpu_features();
    if (strcmp(name, "avx2") == 0) return cpu & KVS_CPU_AVX2 ? kvs_fp8_kernels_avx2() : NULL;
    if (strcmp(name, "avx512") == 0)
        return cpu & KVS_CPU_AVX512 ? kvs_fp8_kernels_avx512() : NULL;
    if (strcmp(name, "avx512fp16") == 0)
        return cpu & KVS_CPU_AVX512FP16 ? kvs_fp8_kernels_avx512fp16() : NULL;
#endif
    return NULL;
}

static const kvs_fp8_kernels *best_variant(void)
{
    size_t n = 0;
    while (isa_names[n]) n++;
    const kvs_fp8_kernels *k = NULL;
    while (!k && n-- > 0) k = variant(isa_names[n]); /* "scalar" always is */
    return k;
}

static int known_isa(const char *name)
{
    for (size_t i = 0; isa_names[i]; i++)
        if (strcmp(name, isa_names[i]) == 0) return 1;
    return 0;
}

/* NULL when KVSERDE_ISA asked for a variant that cannot run here. */
static _Atomic(const kvs_fp8_kernels *) active;
static pthread_once_t active_once = PTHREAD_ONCE_INIT;
static char env_isa[32]; /* the refused KVSERDE_ISA value, for messages */

static void choose_once(void)
{
    const char *env = getenv("KVSERDE_ISA");
    if (env && *env && strcmp(env, "auto") != 0) {
        snprintf(env_isa, sizeof env_isa, "%s", env);
        atomic_store(&active, variant(env));
        return;
    }
    atomic_store(&active, best_variant());
}

int kvs_fp8_kernels_get(const kvs_fp8_kernels **out)
{
    pthread_once(&active_once, choose_once);
    const kvs_fp8_kernels *k = atomic_load(&active);
    if (k) {
        *out = k;
        return KVS_OK;
    }
    if (!known_isa(env_isa))
        return kvs_set_error(KVS_EINVAL,
                             "fp8: KVSERDE_ISA='%s' is unknown; known: scalar, avx2, avx512, avx512fp16, auto",
                             env_isa);
    return kvs_set_error(KVS_EUNSUPPORTED,
                         "fp8: KVSERDE_ISA='%s' is not supported by this CPU or build",
                         env_isa);
}

int kvs_fp8_isa_available(const char *name)
{
    return name != NULL && variant(name) != NULL;
}

int kvs_fp8_set_isa(const char *name)
{
    if (name == NULL)
        return kvs_set_error(KVS_EINVAL, "fp8: isa name is NULL");
    pthread_once(&active_once, choose_once);
    if (strcmp(name, "auto") == 0) {
        atomic_store(&active, best_variant());
        return KVS_OK;
    }
    if (!known_isa(name))
        return kvs_set_error(KVS_EINVAL,
                             "fp8: unknown isa '%s'; known: scalar, avx2, avx512, avx512fp16, auto",
                             name);
    const kvs_fp8_kernels *k = variant(name);
    if (k == NULL)
        return kvs_set_error(KVS_EUNSUPPORTED,
                             "fp8: isa '%s' is not supported by this CPU or build",
                             name);
    atomic_store(&active, k);
    return KVS_OK;
}

const char *kvs_fp8_isa(void)
{
    const kvs_fp8_kernels *k;
    return kvs_fp8_kernels_get(&k) == KVS_OK ? k->isa : "none";
}

static _Atomic size_t nt_min_bytes = KVS_FP8_NT_DEFAULT_MIN_BYTES;

size_t kvs_fp8_nt_min_bytes(void)
{
    return atomic_load_explicit(&nt_min_bytes, memory_order_relaxed);
}

void kvs_fp8_set_nt_min_bytes(size_t bytes)
{
    atomic_store_explicit(&nt_min_bytes, bytes, memory_order_relaxed);
}

int kvs_fp8_fmt_index(kvs_dtype dtype)
{
    switch (dtype) {
    case KVS_DTYPE_FLOAT8_E4M3FN: return KVS_FP8_FMT_E4M3FN;
    case KVS_DTYPE_FLOAT8_E5M2: return KVS_FP8_FMT_E5M2;
    default: return -1;
    }
}

int kvs_fp8_wide_index(kvs_dtype dtype)
{
    switch (dtype) {
    case KVS_DTYPE_FLOAT32: return KVS_WIDE_F32;
    case KVS_DTYPE_FLOAT16: return KVS_WIDE_F16;
    case KVS_DTYPE_BFLOAT16: return KVS_WIDE_BF16;
    default: return -1;
    }
}
