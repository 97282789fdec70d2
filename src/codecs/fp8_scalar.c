/* fp8_scalar.c - the portable scalar fp8 kernels: the definition of correct.
 *
 * Every SIMD variant must produce exactly these bytes for every input. The
 * semantics are those of include/kvserde/fp8.h; this file only restates
 * what each step relies on.
 *
 * All conversions work on the IEEE-754 bit patterns with integer
 * arithmetic, never with float operations, so the result cannot depend on
 * the floating-point environment (rounding mode, FTZ/DAZ, x87 excess
 * precision) or on compiler flags such as -ffast-math. Arrays are read and
 * written through memcpy, so any alignment works and there is no
 * strict-aliasing question.
 *
 * Both fp8 formats are handled by one generic routine parameterised by the
 * format's constants; the two public element functions call it with
 * literal constants, so the compiler specialises it.
 *
 *   format     mant bits  bias  min normal  max finite      emax  max code
 *   e4m3fn     3          7     2^-6        448 = 1.75*2^8  8     0x7E
 *   e5m2       2          15    2^-14       57344=1.75*2^15 15    0x7B
 */
#include <stdint.h>
#include <string.h>

#include "codecs/fp8_kernels.h"
#include "codecs/half.h"

/* ---- element conversions ---------------------------------------------- */

/* Magnitude codes of an fp8 format are ordered like the values they stand
 * for: code = (biased exponent << M) | mantissa, and a subnormal is
 * exponent field 0. So rounding can be done on the integer code: computing
 * the truncated code and adding one when the discarded part is more than
 * half a unit (or exactly half and the code is odd, i.e. ties to even)
 * gives the correctly rounded code, and a carry out of the mantissa field
 * lands on the next exponent's code with mantissa 0, which is exactly the
 * next representable value (from the largest subnormal to the smallest
 * normal as well). */
static inline uint8_t fp8_from_f32_bits(uint32_t bits, int saturate,
                                        int mant_bits, int bias, int emax,
                                        uint32_t max_code,
                                        uint32_t nosat_overflow_code)
{
    const uint8_t sign = (uint8_t)((bits >> 24) & 0x80u);
    const uint32_t a = bits & 0x7FFFFFFFu; /* |x| as bits, ordered like |x| */
    /* What overflow becomes: +-max when saturating; otherwise the format's
     * own overflow result (inf for e5m2, NaN for e4m3fn, which has no inf),
     * as PyTorch <= 2.11 CPU does. */
    const uint8_t overflow =
        (uint8_t)(sign | (saturate ? max_code : nosat_overflow_code));

    if (a > 0x7F800000u) /* NaN (either kind, any payload): 0x7F | sign */
        return (uint8_t)(sign | 0x7Fu);

    /* Unbiased float32 exponent; -127 for zero and float32 subnormals,
     * 128 for inf. */
    const int e = (int)(a >> 23) - 127;
    if (e > emax) /* |x| >= 2^(emax+1) > max (inf included): overflow */
        return overflow;

    const int emin = 1 - bias; /* exponent of the smallest normal fp8 */
    uint32_t code, rem, half;
    if (e >= emin) {
        /* Normal fp8 result. The float32 bits are (E << 23) | mantissa with
         * E = e + 127; shifting right by 23 - M keeps E and the top M
         * mantissa bits, i.e. the float32 code of the truncated value with
         * an M-bit mantissa. Subtracting (127 - bias) << M rebiases the
         * exponent field to the fp8 bias. The dropped 23 - M bits are the
         * remainder, in units where one fp8 ulp is 2^(23-M). */
        const int drop = 23 - mant_bits;
        code = (a >> drop) - ((uint32_t)(127 - bias) << mant_bits);
        rem = a & ((1u << drop) - 1u);
        half = 1u << (drop - 1);
    } else {
        /* Subnormal fp8 result (or zero). The fp8 subnormal step is
         * 2^(emin - M); the value is sig * 2^(e - 23) with sig the 24-bit
         * significand including the implicit one, so in units of that step
         * it is sig / 2^shift with shift = 23 - M + (emin - e) > 23 - M.
         * sig < 2^24, so for shift >= 25 the value is below a quarter step
         * and rounds to zero; this also covers float32 zero and subnormals
         * (e = -127), whose implicit bit would not be one. shift = 24 can
         * still round up to the smallest subnormal (sig / 2^24 >= 1/2, a
         * tie only at sig == 2^23, which goes to the even 0). */
        const int shift = 23 - mant_bits + (emin - e);
        if (shift > 24)
            return sign; /* +-0 */
        const uint32_t sig = (a & 0x7FFFFFu) | 0x800000u;
        code = sig >> shift;
        rem = sig & ((1u << shift) - 1u);
        half = 1u << (shift - 1);
    }

    /* Round to nearest, ties to even (the code's lowest bit is the lowest
     * mantissa bit). */
    if (rem > half || (rem == half && (code & 1u)))
        code++;

    /* Past the largest finite code: for e4m3fn that is 0x7F (|x| > 464,
     * rounding to 480) or 0x80 (rounding to 512); for e5m2 0x7C (|x| >=
     * 61440, which is a tie with odd max mantissa, so it rounds up). */
    if (code > max_code)
        return overflow;
    return (uint8_t)(sign | code);
}

uint8_t kvs_fp8_e4m3fn_from_f32(float x, int saturate)
{
    return fp8_from_f32_bits(kvs_f32_to_bits(x), saturate, 3, 7, 8, 0x7Eu,
                             0x7Fu);
}

uint8_t kvs_fp8_e5m2_from_f32(float x, int saturate)
{
    return fp8_from_f32_bits(kvs_f32_to_bits(x), saturate, 2, 15, 15, 0x7Bu,
                             0x7Cu);
}

/* fp8 code -> float32 bits; exact for every non-NaN code (float32 has more
 * exponent range and mantissa than either fp8 format). has_inf: e5m2 style
 * (all-ones exponent: mantissa 0 inf, else NaN); otherwise e4m3fn style
 * (only all-ones exponent with all-ones mantissa is NaN, the rest of that
 * exponent are ordinary finite values). */
static inline uint32_t fp8_to_f32_bits(uint8_t code, int mant_bits, int bias,
                                       int has_inf)
{
    const uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    const uint32_t mant_mask = (1u << mant_bits) - 1u;
    const uint32_t exp_all_ones = 0x7Fu >> mant_bits;
    uint32_t exp = (uint32_t)(code & 0x7Fu) >> mant_bits;
    uint32_t mant = code & mant_mask;

    if (exp == exp_all_ones) {
        if (has_inf && mant == 0)
            return sign | 0x7F800000u; /* +-inf */
        if (has_inf || mant == mant_mask)
            return sign | 0x7FC00000u; /* canonical quiet NaN, same sign */
    }
    if (exp == 0) {
        if (mant == 0)
            return sign; /* +-0 */
        /* Subnormal: mant * 2^(1 - bias - M). Normalise: shift the leading
         * one up to the implicit-bit position (bit M), lowering the
         * exponent once per shift, then drop it. */
        int e = 1 - bias;
        while (!(mant & (1u << mant_bits))) {
            mant <<= 1;
            e--;
        }
        mant &= mant_mask;
        return sign | ((uint32_t)(e + 127) << 23) | (mant << (23 - mant_bits));
    }
    /* Normal: rebias the exponent, put the mantissa at the top. */
    return sign | ((exp - (uint32_t)bias + 127u) << 23) |
           (mant << (23 - mant_bits));
}

static inline uint32_t e4m3fn_to_f32_bits(uint8_t code)
{
    return fp8_to_f32_bits(code, 3, 7, 0);
}

static inline uint32_t e5m2_to_f32_bits(uint8_t code)
{
    return fp8_to_f32_bits(code, 2, 15, 1);
}

float kvs_fp8_e4m3fn_to_f32(uint8_t code)
{
    return kvs_f32_from_bits(e4m3fn_to_f32_bits(code));
}

float kvs_fp8_e5m2_to_f32(uint8_t code)
{
    return kvs_f32_from_bits(e5m2_to_f32_bits(code));
}

/* float32 bits of an fp8 value -> float16 / bfloat16 bits. Both are exact
 * here: every fp8 value has at most 4 significant bits and its exponent is
 * within float16's range (e4m3fn: 2^-9..2^8 are float16 normals; e5m2 has
 * float16's exponent field exactly, its subnormals down to 2^-16 are
 * float16 subnormals) and within bfloat16's (8 mantissa bits, float32's
 * exponent), so the round-to-nearest narrowing discards only zero bits.
 * inf stays inf, and the canonical NaN 0x7FC00000 | sign narrows to
 * 0x7E00 | sign and 0x7FC0 | sign, the documented NaN values. */
static inline uint16_t fp8_f32_bits_to_f16(uint32_t f)
{
    return kvs_f32_bits_to_f16_bits(f);
}

static inline uint16_t fp8_f32_bits_to_bf16(uint32_t f)
{
    return (uint16_t)(f >> 16); /* low 16 bits are zero for fp8 values */
}

/* ---- array kernels ---------------------------------------------------- */

/* Unaligned loads and stores of the wide elements (native byte order, as
 * the tensors are in memory). */
static inline uint32_t load_u32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline uint16_t load_u16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store_u32(unsigned char *p, uint32_t v)
{
    memcpy(p, &v, sizeof v);
}

static inline void store_u16(unsigned char *p, uint16_t v)
{
    memcpy(p, &v, sizeof v);
}

/* Encoders: widen the element to float32 bits (exact for float16 and
 * bfloat16, so there is a single rounding), then the float32 path. */
#define KVS_E4M3FN(bits, sat) \
    fp8_from_f32_bits((bits), (sat), 3, 7, 8, 0x7Eu, 0x7Fu)
#define KVS_E5M2(bits, sat) \
    fp8_from_f32_bits((bits), (sat), 2, 15, 15, 0x7Bu, 0x7Cu)

#define DEFINE_ENCODER(name, elem_size, load_bits, convert)                \
    static void name(const void *src, uint8_t *dst, size_t n, int saturate) \
    {                                                                      \
        const unsigned char *s = (const unsigned char *)src;              \
        for (size_t i = 0; i < n; i++)                                     \
            dst[i] = convert(load_bits(s + i * (elem_size)), saturate);    \
    }

#define LOAD_F32_BITS(p) load_u32(p)
#define LOAD_F16_BITS(p) kvs_f16_bits_to_f32_bits(load_u16(p))
#define LOAD_BF16_BITS(p) kvs_bf16_bits_to_f32_bits(load_u16(p))

DEFINE_ENCODER(e4m3fn_from_f32_array, 4, LOAD_F32_BITS, KVS_E4M3FN)
DEFINE_ENCODER(e4m3fn_from_f16_array, 2, LOAD_F16_BITS, KVS_E4M3FN)
DEFINE_ENCODER(e4m3fn_from_bf16_array, 2, LOAD_BF16_BITS, KVS_E4M3FN)
DEFINE_ENCODER(e5m2_from_f32_array, 4, LOAD_F32_BITS, KVS_E5M2)
DEFINE_ENCODER(e5m2_from_f16_array, 2, LOAD_F16_BITS, KVS_E5M2)
DEFINE_ENCODER(e5m2_from_bf16_array, 2, LOAD_BF16_BITS, KVS_E5M2)

/* Decoders. Short arrays convert element by element. For longer ones the
 * 256 possible results are computed first, by the same element function,
 * into a table on the stack, and then looked up: identical bytes, a
 * fraction of the work. */
#define DECODE_TABLE_MIN 512

#define DEFINE_DECODER(name, wide_t, elem_size, store, convert)            \
    static void name(const uint8_t *src, void *dst, size_t n)              \
    {                                                                      \
        unsigned char *d = (unsigned char *)dst;                          \
        if (n < DECODE_TABLE_MIN) {                                        \
            for (size_t i = 0; i < n; i++)                                 \
                store(d + i * (elem_size), convert(src[i]));               \
            return;                                                        \
        }                                                                  \
        wide_t table[256];                                                 \
        for (unsigned c = 0; c < 256; c++)                                 \
            table[c] = convert((uint8_t)c);                                \
        for (size_t i = 0; i < n; i++)                                     \
            store(d + i * (elem_size), table[src[i]]);                     \
    }

#define E4M3FN_F32(c) e4m3fn_to_f32_bits(c)
#define E4M3FN_F16(c) fp8_f32_bits_to_f16(e4m3fn_to_f32_bits(c))
#define E4M3FN_BF16(c) fp8_f32_bits_to_bf16(e4m3fn_to_f32_bits(c))
#define E5M2_F32(c) e5m2_to_f32_bits(c)
#define E5M2_F16(c) fp8_f32_bits_to_f16(e5m2_to_f32_bits(c))
#define E5M2_BF16(c) fp8_f32_bits_to_bf16(e5m2_to_f32_bits(c))

DEFINE_DECODER(e4m3fn_to_f32_array, uint32_t, 4, store_u32, E4M3FN_F32)
DEFINE_DECODER(e4m3fn_to_f16_array, uint16_t, 2, store_u16, E4M3FN_F16)
DEFINE_DECODER(e4m3fn_to_bf16_array, uint16_t, 2, store_u16, E4M3FN_BF16)
DEFINE_DECODER(e5m2_to_f32_array, uint32_t, 4, store_u32, E5M2_F32)
DEFINE_DECODER(e5m2_to_f16_array, uint16_t, 2, store_u16, E5M2_F16)
DEFINE_DECODER(e5m2_to_bf16_array, uint16_t, 2, store_u16, E5M2_BF16)

/* ---- the table -------------------------------------------------------- */

static const kvs_fp8_kernels kvs_fp8_scalar_kernels = {
    .isa = "scalar",
    .encode = {
        [KVS_FP8_FMT_E4M3FN] = {
            [KVS_WIDE_F32] = e4m3fn_from_f32_array,
            [KVS_WIDE_F16] = e4m3fn_from_f16_array,
            [KVS_WIDE_BF16] = e4m3fn_from_bf16_array,
        },
        [KVS_FP8_FMT_E5M2] = {
            [KVS_WIDE_F32] = e5m2_from_f32_array,
            [KVS_WIDE_F16] = e5m2_from_f16_array,
            [KVS_WIDE_BF16] = e5m2_from_bf16_array,
        },
    },
    .decode = {
        [KVS_FP8_FMT_E4M3FN] = {
            [KVS_WIDE_F32] = e4m3fn_to_f32_array,
            [KVS_WIDE_F16] = e4m3fn_to_f16_array,
            [KVS_WIDE_BF16] = e4m3fn_to_bf16_array,
        },
        [KVS_FP8_FMT_E5M2] = {
            [KVS_WIDE_F32] = e5m2_to_f32_array,
            [KVS_WIDE_F16] = e5m2_to_f16_array,
            [KVS_WIDE_BF16] = e5m2_to_bf16_array,
        },
    },
};

const kvs_fp8_kernels *kvs_fp8_kernels_scalar(void)
{
    return &kvs_fp8_scalar_kernels;
}
