/* fuzz_common.h - small helpers shared by the libFuzzer targets fuzz/fuzz_*.c
 * (fuzz/README.md says how to build and run them).
 *
 * A target decodes its input with a byte reader (fz_*: reading past the end
 * gives zeros, so every input is usable), and states what must hold with
 * FZ_ASSERT, which prints the broken property and aborts: libFuzzer then
 * saves the input as a crash, like any sanitizer report.
 */
#ifndef KVS_FUZZ_COMMON_H
#define KVS_FUZZ_COMMON_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/fp8.h"
#include "kvserde/memobj.h"
#include "kvserde/serde.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FZ_ASSERT(cond, ...)                                                \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: property violated: %s\n  ", __FILE__,   \
                    __LINE__, #cond);                                       \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n  last kvserde error: %s\n",                 \
                    kvs_last_error());                                      \
            abort();                                                        \
        }                                                                   \
    } while (0)

/* A refusal is a KVS_E* code with a message. */
#define FZ_ASSERT_REFUSAL(rc, what)                                         \
    FZ_ASSERT((rc) >= KVS_EAUTH && (rc) < 0 &&                             \
                  kvs_last_error()[0] != '\0',                              \
              "%s returned %d (%s) with message '%s'", (what), (int)(rc),   \
              kvs_strerror(rc), kvs_last_error())

typedef struct fz_in {
    const uint8_t *p;
    size_t n;
} fz_in;

static inline uint8_t fz_u8(fz_in *in)
{
    if (in->n == 0) return 0;
    in->n--;
    return *in->p++;
}

static inline uint16_t fz_u16(fz_in *in)
{
    uint16_t v = fz_u8(in);
    return (uint16_t)(v | (uint16_t)fz_u8(in) << 8);
}

static inline uint32_t fz_u32(fz_in *in)
{
    uint32_t v = fz_u16(in);
    return v | (uint32_t)fz_u16(in) << 16;
}

static inline uint64_t fz_u64(fz_in *in)
{
    uint64_t v = fz_u32(in);
    return v | (uint64_t)fz_u32(in) << 32;
}

/* Up to n bytes into dst (zero-filled past the end); returns how many came
 * from the input. */
static inline size_t fz_bytes(fz_in *in, void *dst, size_t n)
{
    size_t k = n < in->n ? n : in->n;
    memcpy(dst, in->p, k);
    memset((uint8_t *)dst + k, 0, n - k);
    in->p += k;
    in->n -= k;
    return k;
}

/* An exact-size heap copy of the rest of the input (so that ASan catches a
 * read one byte past it); at least 1 byte is allocated. */
static inline uint8_t *fz_rest_copy(fz_in *in, size_t *len)
{
    uint8_t *p = malloc(in->n ? in->n : 1);
    if (p == NULL) abort();
    memcpy(p, in->p, in->n);
    *len = in->n;
    in->p += in->n;
    in->n = 0;
    return p;
}

/* A small layout: `ngroups` groups, each one byte (dtype
 * dtypes[(b & 15) % ndtypes], rank (b >> 4) % 4) and then its dims, one
 * byte each, modulo dim_mod. */
static inline void fz_layout(fz_in *in, kvs_layout *layout, unsigned ngroups,
                             const kvs_dtype *dtypes, unsigned ndtypes, unsigned dim_mod)
{
    layout->ngroups = 0;
    for (unsigned g = 0; g < ngroups; g++) {
        uint8_t b = fz_u8(in);
        uint32_t ndim = (b >> 4) % 4;
        int64_t dims[3];
        for (uint32_t d = 0; d < ndim; d++) dims[d] = fz_u8(in) % dim_mod;
        kvs_dtype dt = dtypes[(b & 15) % ndtypes];
        if (kvs_layout_add_group(layout, ndim, dims, dt) != KVS_OK) abort();
    }
}

/* n bytes filled with a canary (exact size, at least 1 allocated). */
static inline uint8_t *fz_canary_alloc(size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    if (p == NULL) abort();
    memset(p, 0xA5, n);
    return p;
}

/* Every byte the canary: the first, and each equal to the one before it
 * (one memcmp, not a loop the coverage instrumentation slows down). */
static inline int fz_is_canary(const uint8_t *p, size_t n)
{
    return n == 0 || (p[0] == 0xA5 && memcmp(p, p + 1, n - 1) == 0);
}

/* One operation run with every kernel variant: `run(ctx, out)` writes at
 * most n bytes to out (filled with the canary before each run) and returns
 * a status. It runs with the scalar kernels first, then with each other
 * variant this CPU has (kvs_fp8_isa_names; the fp8 choice picks the ggml
 * kernels too), and each must return the scalar run's status, the same
 * message when it refuses, and the same n bytes, refused or not; a refusal
 * must be a KVS_E* code with a message, and with `untouched_on_refusal` it
 * must leave out as it was. `what` names the operation in failures.
 * Returns the scalar run's status; the variant is "auto" again after. */
typedef int (*fz_variant_run)(void *ctx, uint8_t *out);

static inline int fz_same_on_every_variant(fz_variant_run run, void *ctx, size_t n,
                                           int untouched_on_refusal, const char *what)
{
    uint8_t *ref = fz_canary_alloc(n), *got = fz_canary_alloc(n);
    char ref_msg[512] = "";
    const char *const *names = kvs_fp8_isa_names(); /* names[0] is "scalar" */
    int rc = 0;
    for (size_t i = 0; names[i]; i++) {
        if (!kvs_fp8_isa_available(names[i])) continue;
        FZ_ASSERT(kvs_fp8_set_isa(names[i]) == KVS_OK, "isa %s", names[i]);
        uint8_t *out = i == 0 ? ref : got;
        memset(out, 0xA5, n);
        int r = run(ctx, out);
        if (r != KVS_OK) {
            FZ_ASSERT_REFUSAL(r, what);
            FZ_ASSERT(!untouched_on_refusal || fz_is_canary(out, n),
                      "a refused %s (%s) wrote to the destination", what, names[i]);
        }
        if (i == 0) {
            rc = r;
            if (r) snprintf(ref_msg, sizeof ref_msg, "%s", kvs_last_error());
            continue;
        }
        FZ_ASSERT(r == rc, "%s: %s returns %d, scalar %d", what, names[i], r, rc);
        if (r) FZ_ASSERT(strcmp(kvs_last_error(), ref_msg) == 0, "%s: %s says '%s', scalar '%s'",
                         what, names[i], kvs_last_error(), ref_msg);
        if (memcmp(got, ref, n) != 0) /* then find the byte, for the message */
            for (size_t j = 0; j < n; j++)
                FZ_ASSERT(got[j] == ref[j], "%s: %s differs from scalar at byte %zu of %zu: "
                          "0x%02x != 0x%02x", what, names[i], j, n, got[j], ref[j]);
    }
    FZ_ASSERT(kvs_fp8_set_isa("auto") == KVS_OK, "auto isa");
    free(ref);
    free(got);
    return rc;
}

/* A deserialize for fz_same_on_every_variant: `src` into `out` described by
 * `layout` (nbytes), memory format KV_2LTD. */
typedef struct fz_deserialize_job {
    kvs_deserializer *de;
    const kvs_memobj *src;
    const kvs_layout *layout;
    size_t nbytes;
} fz_deserialize_job;

static inline int fz_deserialize_into(void *ctx, uint8_t *out)
{
    const fz_deserialize_job *j = ctx;
    kvs_memobj dst;
    int rc = kvs_memobj_init(&dst, j->nbytes ? out : NULL, j->nbytes, j->layout, KVS_FMT_KV_2LTD);
    FZ_ASSERT(rc == KVS_OK, "memobj_init of a valid layout: %d", rc);
    return kvs_deserialize(j->de, j->src, &dst, NULL);
}

#endif /* KVS_FUZZ_COMMON_H */
