/* half.h - internal: float16 and bfloat16 <-> float32, portable C.
 *
 * Everything works on bit patterns (uint16_t / uint32_t) with integer
 * operations only, so the results never depend on the floating-point
 * environment (rounding mode, FTZ/DAZ) or on compiler flags; memcpy is the
 * only type pun. The results are those of the x86 hardware conversions:
 *
 *   widening (f16 -> f32: vcvtph2ps / _cvtsh_ss; bf16 -> f32: a shift)
 *     exact for every input, subnormals included. A float16 NaN keeps its
 *     sign and payload (shifted left by 13) and comes out quiet: a
 *     signalling NaN gets the quiet bit set, as vcvtph2ps does (0x7C01 ->
 *     0x7FC02000). bfloat16 widening is a plain shift, so it keeps every
 *     bit, a signalling NaN included.
 *
 *   narrowing (f32 -> f16: vcvtps2ph with round-to-nearest-even;
 *              f32 -> bf16: round-to-nearest-even)
 *     round to nearest, ties to even; subnormal results are produced (never
 *     flushed); overflow gives +-inf; a NaN gives a quiet NaN with the same
 *     sign and the top payload bits (f16: sign | 0x7E00 | mant >> 13, as
 *     vcvtps2ph does; bf16: (bits >> 16) | 0x0040, as vcvtneps2bf16 does).
 *     Note vcvtneps2bf16 also treats float32 subnormal inputs as zero; this
 *     code does not (it matches PyTorch's c10::BFloat16 for non-NaN
 *     inputs; PyTorch writes every NaN as 0x7FC0, sign dropped).
 */
#ifndef KVSERDE_CODECS_HALF_H
#define KVSERDE_CODECS_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t kvs_f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float kvs_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- float16 ---------------------------------------------------------- */

/* float16 bits -> float32 bits, exact. float16: sign | 5-bit exponent (bias
 * 15) | 10-bit mantissa; float32: sign | 8-bit exponent (bias 127) |
 * 23-bit mantissa. */
static inline uint32_t kvs_f16_bits_to_f32_bits(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;

    if (exp == 0x1F) {
        /* Inf (mant == 0) or NaN: all-ones exponent; the mantissa moves to
         * the top of the float32 mantissa. A NaN is made quiet (bit 22),
         * as the hardware does; inf has no mantissa bits so stays inf. */
        uint32_t quiet = mant ? 0x00400000u : 0;
        return sign | 0x7F800000u | (mant << 13) | quiet;
    }
    if (exp == 0) {
        if (mant == 0)
            return sign; /* +-0 */
        /* Subnormal: value = mant * 2^-24. float32 has the range to hold it
         * as a normal number: shift the mantissa up until its leading one
         * reaches the implicit-bit position (bit 10), lowering the exponent
         * by one per shift. Starting exponent -14 is the float16 subnormal
         * exponent (1 - bias). */
        int e = -14;
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        mant &= 0x3FFu; /* drop the now-implicit leading one */
        return sign | ((uint32_t)(e + 127) << 23) | (mant << 13);
    }
    /* Normal: rebias the exponent (15 -> 127), widen the mantissa. */
    return sign | ((exp - 15 + 127) << 23) | (mant << 13);
}

static inline float kvs_f16_to_f32(uint16_t h)
{
    return kvs_f32_from_bits(kvs_f16_bits_to_f32_bits(h));
}

/* float32 bits -> float16 bits, round to nearest, ties to even. */
static inline uint16_t kvs_f32_bits_to_f16_bits(uint32_t f)
{
    uint16_t sign = (uint16_t)((f >> 16) & 0x8000u);
    uint32_t a = f & 0x7FFFFFFFu;

    if (a > 0x7F800000u) /* NaN: quiet, top 10 payload bits kept */
        return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) /* >= 65520 = max + half ulp: rounds to inf (65520
                             itself is a tie, max 0x7BFF is odd) */
        return (uint16_t)(sign | 0x7C00u);

    int e = (int)(a >> 23) - 127; /* unbiased float32 exponent */
    uint32_t code, rem, half;
    if (e >= -14) {
        /* Normal float16 result: rebias and keep the top 10 mantissa bits;
         * the 13 dropped bits decide the rounding. A carry out of the
         * mantissa correctly bumps the exponent. */
        code = (a >> 13) - ((127u - 15u) << 10);
        rem = a & 0x1FFFu;
        half = 0x1000u;
    } else {
        /* Subnormal (or zero) float16 result, in units of 2^-24. For a
         * float32 value sig * 2^(e-23) (sig with its implicit one) that is
         * sig >> (-1 - e). Below 2^-25 (shift would exceed 24) everything
         * rounds to 0, float32 subnormals included; 2^-25 itself is a tie
         * and goes to the even 0 below. */
        if (a < 0x33000000u) /* below 2^-25, half the smallest subnormal */
            return sign;
        uint32_t sig = (a & 0x7FFFFFu) | 0x800000u;
        int shift = -1 - e; /* 14..24 */
        code = sig >> shift;
        rem = sig & ((1u << shift) - 1u);
        half = 1u << (shift - 1);
    }
    if (rem > half || (rem == half && (code & 1u)))
        code++;
    return (uint16_t)(sign | code);
}

static inline uint16_t kvs_f32_to_f16(float x)
{
    return kvs_f32_bits_to_f16_bits(kvs_f32_to_bits(x));
}

/* ---- bfloat16 --------------------------------------------------------- */

/* bfloat16 is the top half of a float32: widening is a shift, exact for
 * every pattern (NaN payloads and signalling NaNs unchanged). */
static inline uint32_t kvs_bf16_bits_to_f32_bits(uint16_t b)
{
    return (uint32_t)b << 16;
}

static inline float kvs_bf16_to_f32(uint16_t b)
{
    return kvs_f32_from_bits(kvs_bf16_bits_to_f32_bits(b));
}

/* float32 bits -> bfloat16 bits, round to nearest, ties to even. */
static inline uint16_t kvs_f32_bits_to_bf16_bits(uint32_t f)
{
    if ((f & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: quiet, sign + payload top */
        return (uint16_t)((f >> 16) | 0x0040u);
    /* Adding 0x7FFF plus the lowest kept bit rounds the dropped 16 bits to
     * nearest with ties to even; a carry propagates into the exponent, and
     * the largest finite values round to inf exactly as they should. */
    uint32_t lsb = (f >> 16) & 1u;
    return (uint16_t)((f + 0x7FFFu + lsb) >> 16);
}

static inline uint16_t kvs_f32_to_bf16(float x)
{
    return kvs_f32_bits_to_bf16_bits(kvs_f32_to_bits(x));
}

#endif /* KVSERDE_CODECS_HALF_H */
