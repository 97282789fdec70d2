/* cpu_features.c - the instruction sets this CPU runs, read once
 * (cpu_features.h). */
#include "util/cpu_features.h"

#include <pthread.h>

#if KVS_HAVE_X86
#include <cpuid.h>

static unsigned features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

static void read_features(void)
{
    unsigned eax, ebx, ecx, edx;
    __builtin_cpu_init();
    int f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29));
    int fp16 = __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (edx & (1u << 23));
    unsigned f = 0;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi2") && f16c)
        f |= KVS_CPU_AVX2;
    if ((f & KVS_CPU_AVX2) && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
        __builtin_cpu_supports("avx512vbmi"))
        f |= KVS_CPU_AVX512;
    if ((f & KVS_CPU_AVX512) && fp16) f |= KVS_CPU_AVX512FP16;
    if ((f & KVS_CPU_AVX512) && __builtin_cpu_supports("avx512vbmi2")) f |= KVS_CPU_AVX512VBMI2;
    features = f;
}

unsigned kvs_cpu_features(void)
{
    pthread_once(&features_once, read_features);
    return features;
}
#else
unsigned kvs_cpu_features(void)
{
    return 0;
}
#endif
