/* intq_kernels.h - internal: the hand-written SIMD kernels of the integer
 * quantizer (intq.c) and the choice of them.
 *
 * intq.c holds the portable code, which is the reference: every kernel
 * below gives exactly its bytes (codes, scales, zero points, decoded
 * elements) for every input, and a NULL entry means "use the portable
 * code". The scalar variant is all NULL. Kernels take any n (0 included)
 * at any alignment. The variant in use follows the fp8 kernels' choice
 * (KVSERDE_ISA, kvs_fp8_set_isa): "avx512" and "avx512fp16" run the
 * AVX-512 kernels, "avx2" the AVX2 ones (the fused token rows and the
 * channel axis's row operations, the rest NULL: intq_avx2.c), "scalar"
 * the portable code (whose hot loops GCC builds for AVX2 as well,
 * codecs/clones.h).
 */
#ifndef KVSERDE_INTQ_KERNELS_H
#define KVSERDE_INTQ_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* How the codes of a fused row are made (intq.c's code_range and
 * steps_of; scale_f16: float16 scales and zeros, else float32). */
typedef struct kvs_intq_rowfmt {
    uint64_t group;
    int zero_point, scale_f16;
    unsigned bits;
    float steps, lo, hi, mid;
} kvs_intq_rowfmt;

/* The most groups of a row encode_token_bf16 takes. */
#define KVS_INTQ_FUSED_GROUPS 64

typedef struct kvs_intq_kernels {
    const char *isa; /* "scalar", "avx2", "avx512" */
    /* n bfloat16 (little-endian) -> float32; returns 1 if any is inf or NaN */
    int (*widen_bf16)(const uint8_t *src, uint64_t n, float *out);
    /* widen_rotated_bf16: widen_bf16 and hadamard(out, n, h) in one pass,
     * the values rotated in registers (h from 2 to 256, n % 16 == 0);
     * returns 1, out not defined, if any value is inf or NaN. ahead: NULL,
     * or a row of n bfloat16 prefetched line by line (encode_token_bf16's
     * `ahead`). */
    int (*widen_rotated_bf16)(const uint8_t *src, uint64_t n, unsigned h, float *out,
                              const uint8_t *ahead);
    /* The values of the minimum and maximum of each group of `group`
     * elements of x[0..n) (the last one shorter) into mn[k], mx[k]; the
     * sign of a zero result may differ from the reference's, whose order
     * decides it (intq.c recomputes those with the portable code). */
    void (*minmax)(const float *x, uint64_t n, uint64_t group, float *mn, float *mx);
    /* mn[c] = x[c] < mn[c] ? x[c] : mn[c], mx[c] likewise, c < n */
    void (*fold_columns)(const float *x, uint64_t n, float *mn, float *mx);
    /* The scales (and zero points) of n groups with values in
     * [mn[i], mx[i]] (intq.c's group_scale): stored bits at scales[i] and
     * zeros[i] (2 bytes each for float16, 4 for float32, little-endian),
     * divisors into inv[i], zero points into zero[i] (mn / mx may be the
     * same arrays as inv / zero: each group is read before it is written).
     * Returns n, or the groups done (a multiple of 16) before a block of 16
     * that holds one whose scale or zero does not fit the scale dtype; the
     * caller then runs the portable code from there, which says so. */
    uint64_t (*scales)(const float *mn, const float *mx, uint64_t n, int zero_point, int scale_f16,
                  float steps, uint8_t *scales, uint8_t *zeros, float *inv, float *zero);
    /* 1 / r[i] rounded where that is a normal float, else NaN, for
     * quantize (r > 0) */
    void (*reciprocals)(const float *r, uint64_t n, float *out);
    /* intq.c's quantize_run, element i with r[i / group], z[i / group];
     * rinv: NULL or reciprocals() of r, which then saves most divisions */
    void (*quantize)(const float *x, uint64_t n, const float *r, const float *rinv,
                     const float *z, uint64_t group, float lo, float hi, float mid,
                     uint8_t *codes);
    /* intq.c's pack_codes / unpack_codes, indexed by bits (NULL: portable) */
    void (*pack[9])(const uint8_t *codes, uint64_t n, uint8_t *out);
    void (*unpack[9])(const uint8_t *in, uint64_t n, uint8_t *codes);
    /* intq.c's hadamard_row: every head of h channels of x[0..D) rotated
     * in place (h a power of two from 2 to 1024 dividing D), for values
     * finite or inf (the encoder's and the decoder's rows) */
    void (*hadamard)(float *x, uint64_t D, unsigned h);
    /* intq.c's dequantize_run, element i with s[i / group], z[i / group] */
    void (*dequantize)(const uint8_t *codes, uint64_t n, const float *s, const float *z,
                       uint64_t group, float mid, float *x);
    /* n stored scales or zeros (float16 if f16, else float32; little-endian)
     * as floats */
    void (*load_scales)(const uint8_t *p, uint64_t n, int f16, float *out);
    /* n float32 -> bfloat16 (round to nearest even, NaN quieted, as
     * kvs_f32_to_bf16); `stream`: the full 64-byte lines of dst with
     * non-temporal stores and no fence (store_fence below). The
     * decoder streams the rows of an object of at least
     * kvs_fp8_nt_min_bytes() (the fp8 kernels' policy and threshold,
     * applied to the whole object, whose rows are each far smaller). */
    void (*narrow_bf16)(const float *in, uint64_t n, uint8_t *dst, int stream);
    /* Fused rows: a token's values stay in registers from the bfloat16
     * source to the packed codes and back (no float row in memory).
     * encode_token_bf16: one token-axis row of n bfloat16 without outliers
     * or rotation to the bytes intq.c's block loop writes for it: the
     * scales (and zero points) of its n / f->group groups at scales /
     * zeros (as scales()), the codes packed f->bits wide at codes. For
     * f->bits 2, 4 or 8, n % 64 == 0, f->group % 32 == 0, f->group
     * dividing n, n / f->group <= KVS_INTQ_FUSED_GROUPS. Returns 1; or 0,
     * having written nothing, where the row needs the portable code (which
     * then refuses or writes it): a value not finite, a group minimum of
     * +-0 with a zero point (the sign of that zero, which the zero point
     * stores, is the reference's lane order's), a scale or zero that does
     * not fit. ahead: NULL, or a row of n bfloat16 the kernel prefetches
     * (into L1) line by line as it makes the codes, one line per line of
     * src, so the next rows' loads overlap this row's arithmetic.
     * codes_ahead: NULL, or payload bytes (as many as the row's codes) the
     * kernel prefetches line by line as it stores the codes, so the lines a
     * few rows on are read for ownership before their stores wait on it. */
    int (*encode_token_bf16)(const uint8_t *src, uint64_t n, const kvs_intq_rowfmt *f,
                             uint8_t *scales, uint8_t *zeros, uint8_t *codes,
                             const uint8_t *ahead, const uint8_t *codes_ahead);
    /* encode_channel_bf16: a channel-axis block of `rows` tokens of n
     * bfloat16 channels (token t at src + t * stride bytes) without
     * outliers or rotation, likewise: the n channels' scales (and zero
     * points) over the block at scales / zeros, token t's codes at
     * codes + t * row_bytes; n % 64 == 0, f->group unused. Work: keys (2n
     * int16), d, z, rinv (n floats each). Returns 1, or 0 having written
     * nothing, for the same reasons. ahead: NULL, or the next block (rows
     * tokens at the same stride), prefetched into L2 line by line as the
     * codes are made, for the statistics pass that reads it next. */
    int (*encode_channel_bf16)(const uint8_t *src, uint64_t stride, uint64_t rows, uint64_t n,
                               const kvs_intq_rowfmt *f, uint8_t *scales, uint8_t *zeros,
                               uint8_t *codes, uint64_t row_bytes, int16_t *keys, float *d,
                               float *z, float *rinv, const uint8_t *ahead);
    /* decode_bf16: one row of n codes packed `bits` wide (2, 4 or 8) to
     * bfloat16, as unpack, dequantize(codes, n, s, z, group, mid) and
     * narrow_bf16 give; n % 64 == 0, group 1 or a multiple of 16; stream
     * as narrow_bf16's, for a dst on a 64-byte boundary (else ordinary
     * stores). ahead: NULL, or n * bits / 8 bytes of the payload (the
     * codes a few rows on) the kernel prefetches into L1 line by line as
     * it reads the row's codes: with streamed stores in flight the
     * hardware prefetcher left the codes' loads waiting on memory. */
    void (*decode_bf16)(const uint8_t *in, uint64_t n, unsigned bits, const float *s,
                        const float *z, uint64_t group, float mid, uint8_t *dst, int stream,
                        const uint8_t *ahead);
    /* decode_rotated_bf16: one row of n codes, one per byte (unpacked),
     * rotated by heads of h channels, to bfloat16: as dequantize(codes, n,
     * s, z, group, mid), hadamard(x, n, h) and narrow_bf16 give, without
     * the float row; h from 2 to 256, n % 32 == 0, group 1 or a multiple
     * of 16; stream as decode_bf16's. */
    void (*decode_rotated_bf16)(const uint8_t *codes, uint64_t n, const float *s,
                                const float *z, uint64_t group, float mid, unsigned h,
                                uint8_t *dst, int stream);
    /* The store fence that orders the streamed rows before a range of
     * rows returns (decode_range calls it once, after its last row):
     * fencing every row (2 KiB in bench_int) waited for each row's
     * non-temporal stores to drain before the next row's (NULL where
     * nothing streams). */
    void (*store_fence)(void);
} kvs_intq_kernels;

/* The AVX-512 variant (F, BW, DQ, VL, BF16, VBMI, F16C, FMA; the fp8
 * dispatcher's avx512 check covers them), compiled in on x86 only. It
 * does not check the CPU. */
const kvs_intq_kernels *kvs_intq_kernels_avx512(void);

/* The AVX2 variant (AVX2, F16C, FMA, BMI2: the fp8 dispatcher's avx2
 * check), compiled in on x86 only: widen_bf16, scales, reciprocals,
 * quantize, load_scales, encode_token_bf16, decode_bf16 and store_fence,
 * every other entry NULL. It does not check the CPU. */
const kvs_intq_kernels *kvs_intq_kernels_avx2(void);

/* The fused encoders' codes by one FMA each (intq_avx512.c's pair_grid,
 * which argues it; intq_avx2.c's grid16): the sum's constant,
 * 1.5 x 2^10 + the integer part of mid + 1/2, and the count of 32-code
 * chunks whose flags are gathered before the chunks flagged are made again
 * by the exact path (a window). */
static inline float kvs_intq_grid(float mid) { return 0x1.8p10f + (float)(int)mid + 0.5f; }
#define KVS_INTQ_NEAR_WINDOW 64

/* The fused encoders' loops in one copy per code width (2, 4, 8) and zero
 * point, so neither is a branch inside them: CALL(bits, zp) with both
 * constants, chosen by the row format's. */
#define KVS_INTQ_EACH_WIDTH(bits, zp, CALL) \
    do { \
        switch ((bits) * 2 + ((zp) != 0)) { \
        case 16: CALL(8, 0); break; \
        case 17: CALL(8, 1); break; \
        case 8: CALL(4, 0); break; \
        case 9: CALL(4, 1); break; \
        case 4: CALL(2, 0); break; \
        default: CALL(2, 1); break; \
        } \
    } while (0)

#endif /* KVSERDE_INTQ_KERNELS_H */
