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

static inline int fz_is_canary(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0xA5) return 0;
    return 1;
}

/* Deserialize src with `de` into a fresh canary-filled buffer of `layout`
 * (nbytes, KV_2LTD), returned in *out (to free); a refusal must be a KVS_E*
 * code with a message and leave the canary whole. Returns de's status. */
static inline int fz_deserialize_canary(kvs_deserializer *de, const kvs_memobj *src,
                                        const kvs_layout *layout, uint8_t **out, size_t nbytes,
                                        const char *what)
{
    uint8_t *buf = fz_canary_alloc(nbytes);
    kvs_memobj dst;
    int rc = kvs_memobj_init(&dst, nbytes ? buf : NULL, nbytes, layout, KVS_FMT_KV_2LTD);
    FZ_ASSERT(rc == KVS_OK, "memobj_init of a valid layout: %d", rc);
    rc = kvs_deserialize(de, src, &dst, NULL);
    if (rc != KVS_OK) {
        FZ_ASSERT_REFUSAL(rc, what);
        FZ_ASSERT(fz_is_canary(buf, nbytes), "a refused %s wrote to the destination", what);
    }
    *out = buf;
    return rc;
}

#endif /* KVS_FUZZ_COMMON_H */
