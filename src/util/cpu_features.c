/* cpu_features.c - the instruction sets this CPU runs, read once
 * (cpu_features.h). */
#include "util/cpu_features.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

int kvs_cpu_isa_forced_pre_avx512(void)
{
    const char *isa = getenv("KVSERDE_ISA");
    return isa && (strcmp(isa, "scalar") == 0 || strcmp(isa, "avx2") == 0);
}

int kvs_cpu_isa_forced_scalar(void)
{
    const char *isa = getenv("KVSERDE_ISA");
    return isa && strcmp(isa, "scalar") == 0;
}

#if KVS_HAVE_X86
#include <cpuid.h>

static unsigned features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

/* CPUID 7.0 EDX: AMX-BF16 (bit 22), AMX-TILE (bit 24); XCR0 (xgetbv 0,
 * which needs OSXSAVE, CPUID 1 ECX bit 27): XTILECFG and XTILEDATA (bits
 * 17, 18), without which the OS does not save tile state. */
static int amx_bf16(void)
{
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return 0;
    if (!(edx & (1u << 22)) || !(edx & (1u << 24))) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    return (lo & (3u << 17)) == (3u << 17);
}

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
        __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bf16") &&
        __builtin_cpu_supports("avx512vbmi"))
        f |= KVS_CPU_AVX512;
    if ((f & KVS_CPU_AVX512) && fp16) f |= KVS_CPU_AVX512FP16;
    if ((f & KVS_CPU_AVX512) && __builtin_cpu_supports("avx512vbmi2")) f |= KVS_CPU_AVX512VBMI2;
    if (amx_bf16()) f |= KVS_CPU_AMX_BF16;
    if (__builtin_cpu_is("amd")) f |= KVS_CPU_AMD;
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
