/* clones.h - internal: CLONES, the attribute that has GCC compile a hot loop
 * twice, portable and for AVX2, and pick one at load time (an ifunc, so
 * glibc only): twice the vector width from the same source, so the same
 * operations and the same bytes either way (the build is ISO C, so no FMA
 * contraction tells the two apart). -DKVS_NO_CLONES builds the portable
 * version only, and so does a TSan build: ThreadSanitizer crashes in ifunc
 * resolvers, which run before its runtime is initialized. */
#ifndef KVSERDE_CODECS_CLONES_H
#define KVSERDE_CODECS_CLONES_H

#if KVS_HAVE_X86 && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__) && \
    !defined(KVS_NO_CLONES) && !defined(__SANITIZE_THREAD__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

#endif /* KVSERDE_CODECS_CLONES_H */
