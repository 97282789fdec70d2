/* intq.h - internal: the integer quantizer of the `int` pipeline stage
 * (docs/frame_format.md, "The int stage", is the byte definition).
 *
 * An object is cut into planes: one [tokens, channels] matrix per K or V
 * of a layer, found from the memory format (KV_2LTD, KV_2TD, KV_T2D with
 * their K/V dim of size 2); any other group is one plane [elements / last
 * dim, last dim] quantized with the V settings. Each plane is quantized in
 * groups of `group` elements along its axis, every group with its own
 * scale (and zero point), to `bits`-bit codes; optionally each head of
 * `hadamard` channels of a token is first rotated by the normalized
 * Walsh-Hadamard transform, and the K planes keep their `k_outliers`
 * largest channels (by absmax over the plane) at the source's precision.
 *
 * Error bound, per element and without Hadamard: |x - x'| <= s / 2 where s
 * is the element's group scale as stored, plus float32 rounding of the
 * arithmetic (relative 2^-22) and the final rounding to the object's dtype
 * (half an ulp of x'). s = range / steps rounded up (with float16 scales at
 * most x (1 + 2^-10) over it; a float16 zero point is rounded down, which
 * widens the range by at most 2^-11 |min|): symmetric, range = absmax and
 * steps = (levels - 1) / 2; with a zero point, range = max - min and steps
 * = levels - 1. levels is 2^bits - 1 and 2^bits by default; fewer levels
 * in 8-bit codes are for an entropy coder after the stage (a step of its
 * own, not the code width's).
 * With Hadamard the bound holds in the rotated domain: the error of a head
 * vector of h channels has L2 norm <= sqrt(h) x max s / 2 over its groups.
 * Outlier channels come back bit for bit.
 *
 * The bytes do not depend on the CPU: the row operations run through the
 * kernel variant of intq_kernels.h the fp8 kernels' choice names (AVX-512
 * where the CPU has it), each giving the portable code's bytes.
 */
#ifndef KVSERDE_CODECS_INTQ_H
#define KVSERDE_CODECS_INTQ_H

#include <stddef.h>
#include <stdint.h>

#include "kvserde/memobj.h"

enum kvs_intq_axis {
    KVS_INTQ_TOKEN = 0,   /* a group is `group` channels of one token */
    KVS_INTQ_CHANNEL = 1, /* a group is `group` tokens of one channel */
    KVS_INTQ_TENSOR = 2,  /* one group per plane */
};

#define KVS_INTQ_GROUP_MAX 65535
#define KVS_INTQ_HADAMARD_MAX 1024
#define KVS_INTQ_OUTLIERS_MAX 1024

typedef struct kvs_intq_params {
    unsigned bits;        /* 2 to 8: the width of a stored code */
    unsigned levels;      /* code values used: 2..2^bits with a zero point, odd
                           * 3..2^bits - 1 symmetric (those maxima by default) */
    unsigned axis[2];     /* K, V: enum kvs_intq_axis */
    unsigned group[2];    /* K, V: 1 to KVS_INTQ_GROUP_MAX (ignored for TENSOR) */
    int zero_point;       /* 0 symmetric, 1 scale and zero point */
    kvs_dtype scale_dtype; /* float16 or float32 */
    unsigned hadamard;    /* 0, or a power of two 2..1024 dividing the channels */
    unsigned k_outliers;  /* K channels kept exactly, 0..1024 (at most the channels) */
} kvs_intq_params;

/* The parameters' own checks; `who` starts the message ("int"), `code` is
 * the status (KVS_EINVAL for a config, KVS_ECORRUPT for a frame). */
int kvs_intq_check(const kvs_intq_params *p, int code, const char *who);

/* Upper bound of the payload for any memory format of `layout`; refuses
 * dtypes other than float32/float16/bfloat16 and a Hadamard size that does
 * not divide a group's channels (KVS_EINVAL). */
int kvs_intq_bound(const kvs_intq_params *p, const kvs_layout *layout, size_t *nbytes);

/* Quantize src into out[0..cap); *n = bytes written; p must have passed
 * kvs_intq_check (the kernels rely on its levels: codes within
 * [-255, 255]). Refuses non-finite
 * elements and scales that float16 cannot hold (KVS_EINVAL). Splits the
 * work with kvs_serde_parallel_for. */
int kvs_intq_encode(const kvs_intq_params *p, const kvs_memobj *src, uint8_t *out, size_t cap,
                    size_t *n);

/* Receives the payload's bytes in order, each once (a check's stream). */
typedef void (*kvs_intq_feed)(void *state, const uint8_t *bytes, size_t n);

/* Receives the next n bytes of the payload by their kvs_crc32c from 0
 * (a crc32c stream's kvs_crc32c_combine), in the same order as feed. */
typedef void (*kvs_intq_feed_crc32c)(void *state, uint32_t crc, size_t n);

/* kvs_intq_encode, and the payload fed to feed(state, ...) in order and
 * exactly once on success: plane by plane as each is finished (while it
 * is in cache) when one worker encodes the whole object, else all of it
 * after the last worker (the same bytes either way). feed_crc32c: NULL,
 * or the stream's combine; then a plane's codes (its last and largest
 * part, written block by block after its scales) are checksummed in
 * pieces as they are written, still in L1 or L2, and go to feed_crc32c
 * by their value after the plane's other bytes go to feed (fed a whole
 * plane at a time they were read back from L3: 1 MiB of int8 codes). */
int kvs_intq_encode_fed(const kvs_intq_params *p, const kvs_memobj *src, uint8_t *out,
                        size_t cap, size_t *n, kvs_intq_feed feed,
                        kvs_intq_feed_crc32c feed_crc32c, void *state);

/* Dequantize in[0..n) into dst (its layout and dtypes). Every size, index
 * and scale is checked before the first byte of dst is written
 * (KVS_ECORRUPT). */
int kvs_intq_decode(const kvs_intq_params *p, const uint8_t *in, size_t n, kvs_memobj *dst);

#endif /* KVSERDE_CODECS_INTQ_H */
