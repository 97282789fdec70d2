/* cpu_features.h - internal: the instruction sets this CPU runs, read once
 * for the whole library (CPUID is a trap to the hypervisor on a VM,
 * microseconds each, and the kernels' dispatchers ask often).
 *
 * Each set is exactly what one family of kernel files is compiled for
 * (CMakeLists.txt: *_avx2.c, *_avx512.c, *_avx512fp16.c, *_avx512vbmi2.c,
 * *_amx.c),
 * so a file is used only where every instruction the compiler may emit for
 * it runs. __builtin_cpu_supports also checks that the OS saves the AVX /
 * AVX-512 register state; F16C and AVX512-FP16 are read from CPUID directly
 * because not every compiler's builtin knows them. */
#ifndef KVSERDE_UTIL_CPU_FEATURES_H
#define KVSERDE_UTIL_CPU_FEATURES_H

#define KVS_CPU_AVX2 1u        /* AVX2, FMA, BMI2, F16C */
#define KVS_CPU_AVX512 2u      /* KVS_CPU_AVX2 and AVX-512 F, BW, DQ, CD, VL, BF16, VBMI */
#define KVS_CPU_AVX512FP16 4u  /* KVS_CPU_AVX512 and AVX512-FP16 */
#define KVS_CPU_AVX512VBMI2 8u /* KVS_CPU_AVX512 and AVX512-VBMI2 */
/* AMX-TILE and AMX-BF16, and the OS enables the tile state in XCR0. A
 * process must still ask the kernel for the permission to use it
 * (arch_prctl ARCH_REQ_XCOMP_PERM; basis_products.c does, on first need). */
#define KVS_CPU_AMX_BF16 16u
/* Not an instruction set: the vendor is AMD. For the loops whose fastest
 * form was measured to differ between AMD's cores and Intel's (the lossless
 * encoder's histograms, lossless_exponent.c; the rANS decoder's product,
 * rans_avx512.c; the row finder's de-duplication, lossless_refs_avx512.c). */
#define KVS_CPU_AMD 32u

/* The sets above this CPU runs, and KVS_CPU_AMD (0 off x86-64).
 * Thread-safe. */
unsigned kvs_cpu_features(void);

/* Whether the environment variable KVSERDE_ISA forces an ISA older than
 * AVX-512 ("scalar" or "avx2"): the kernels that have no AVX2 variant
 * (the AMX products, the lossless stage's own) then keep their portable
 * path. */
int kvs_cpu_isa_forced_pre_avx512(void);

/* Whether KVSERDE_ISA forces "scalar": such kernels then take no SIMD
 * variant at all. */
int kvs_cpu_isa_forced_scalar(void);

#endif /* KVSERDE_UTIL_CPU_FEATURES_H */
