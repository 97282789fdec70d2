/* clones.h - internal: CLONES, the attribute that has GCC compile a hot loop
 * twice, portable and for AVX2, and pick one at load time (an ifunc, so
 * glibc only): twice the vector width from the same source, so the same
 * operations and the same bytes either way (the build is ISO C, so no FMA
 * contraction tells the two apart). CLONES_V4 adds a third, for AVX-512
 * (x86-64-v4), on the loops where it was measured to pay: the transform
 * stage's rows (2026-12-02: encode 7-15 % faster, decode 0-10 %, the same
 * bytes; docs/fidelity.md "Speed"). -DKVS_NO_CLONES builds the portable
 * version only, and so does a TSan build: ThreadSanitizer crashes in ifunc
 * resolvers, which run before its runtime is initialized. */
#ifndef KVSERDE_CODECS_CLONES_H
#define KVSERDE_CODECS_CLONES_H

#if KVS_HAVE_X86 && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__) && \
    !defined(KVS_NO_CLONES) && !defined(__SANITIZE_THREAD__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#define CLONES_V4 __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define CLONES
#define CLONES_V4
#endif

#endif /* KVSERDE_CODECS_CLONES_H */
