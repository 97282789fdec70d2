/* fp8_avx512.c - AVX-512 fp8 kernels, bit-identical to fp8_scalar.c.
 *
 * CPU features this file requires (compiled with -mavx512f -mavx512bw
 * -mavx512vl -mavx512bf16 -mavx512vbmi; the dispatcher must check all of
 * them before using kvs_fp8_kernels_avx512()):
 *   AVX512F      zmm arithmetic, masks, masked loads and stores
 *   AVX512BW     16-bit lane ops, byte/word masked loads and stores
 *   AVX512VL     (EVEX forms of the narrower instructions the compiler may
 *                choose)
 *   AVX512_BF16  vdpbf16ps: the float adder that rounds bfloat16 subnormal
 *                fp8 results
 *   AVX512_VBMI  vpermb / vpermi2b / vpermt2b: table lookups and packing
 * It is also compiled with -mavx2 -mf16c -mfma -mbmi2, so the compiler may
 * emit those too: the dispatcher checks them as well (as for avx2); and
 * as fp8_avx512fp16.c with -mavx512fp16 as well (AVX512_FP16: vaddph).
 * No instruction here depends on MXCSR: the only float arithmetic is
 * vdpbf16ps, which always rounds to nearest even and treats subnormal
 * inputs as zero, and those (below 2^-126) round to fp8 zero anyway, and
 * in the avx512fp16 variant vaddph with its rounding (to nearest even) and
 * exception suppression given in the instruction.
 *
 * Encoding works on bfloat16 bit patterns in 16-bit lanes (32 per vector):
 *   float32    is first rounded to bfloat16 *to odd* (truncate, OR "any
 *              dropped bit set" into the lowest kept bit). Rounding to odd
 *              at 8 significant bits and then to nearest even at 4 or fewer
 *              equals rounding to nearest even directly (an inexact result
 *              is odd, so it is never a midpoint or an fp8 value, and it
 *              stays on the same side of each), NaN stays NaN, and
 *              overflow thresholds (464, 61440) are midpoints too.
 *   float16    -> e4m3fn the same way (rebias the exponent, fold the 3
 *              dropped mantissa bits into a sticky bit); -> e5m2 directly:
 *              e5m2 is float16 without its 8 low mantissa bits, so it is
 *              integer RNE on the bits, subnormals included.
 *   bfloat16   (and the above) with |x| as bits a, codes ordered like
 *              magnitudes:
 *     normal     the integer RNE of the scalar code, (a >> drop) + inc with
 *                the "half - 1 + lsb" increment a vpermb lookup on the low
 *                6 bits, plus a rebias offset that is a multiple of 256;
 *     subnormal  a clamped to the smallest normal, added to a magic float
 *                whose ulp is the fp8 subnormal step, by vdpbf16ps with
 *                weights (1, 0) and (0, 1): the sums' low 16 bits are the
 *                code (plus the same offset), gathered back into 16-bit
 *                lanes by one vpermt2w;
 *     merging    max(normal, subnormal): the normal formula is monotonic
 *                and never exceeds the true code below the smallest normal,
 *                the clamped subnormal path gives exactly the smallest
 *                normal's code above it;
 *     overflow   min(code, cap), every input past the threshold (inf and,
 *                where it should, NaN included) being at least cap; NaN,
 *                where it must differ from cap, is a compare and a masked
 *                move;
 *     packing    vpermt2b picks the 64 code bytes of two vectors, and the
 *                sign bytes, OR-ed together.
 * Compiled again with -mavx512fp16 (fp8_avx512fp16.c, the avx512fp16
 * variant), bfloat16 and float16 -> e4m3fn are rounded with float16
 * arithmetic instead (bf16_core_fp16, f16_e4m3fn_core_fp16): no permutes,
 * no vdpbf16ps.
 * Decoding looks the 7-bit magnitude up in 128-entry byte tables (low and
 * high byte of the bfloat16 / float16 result; float32 = bfloat16 << 16 for
 * every fp8 value) with vpermi2b, ORs in the sign and interleaves the bytes
 * with vpermt2b.
 *
 * Arrays of any length and alignment: a partial block is done with masked
 * loads and stores. Arrays writing at least kvs_fp8_nt_min_bytes() use
 * non-temporal stores of whole 64-byte lines after a masked head that aligns
 * dst to 64 bytes (fp8_kernels.h: the store policy); encoders prefetch their
 * input KVS_FP8_PREFETCH_BYTES ahead.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "codecs/fp8_kernels.h"

#define KVS_AI static inline __attribute__((always_inline))


static __mmask64 mask_first(size_t k) /* the first k (< 64) lanes */
{
    return k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << k) - 1);
}

/* ---- constant tables -------------------------------------------------- */

/* bfloat16 normal path: 0x40 + RNE increment for the low 6 bits of the
 * source, when dropping 4 (e4m3fn) or 5 (e5m2) mantissa bits. The 0x40
 * turns (a >> drop) + inc into code + 0x400 (e4m3fn: (a >> 4) + inc - 0x3C0
 * is the code) or code + 0x200 (e5m2: (a >> 5) + inc - 0x1C0). */
static const uint8_t kvs_bf16_inc_tables[2][64] __attribute__((aligned(64))) = {
    {
        0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
        0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
        0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
        0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
    },
    {
        0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
        0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
        0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
        0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
    },
};

/* Decoding: for codes 0..127 of each format, the low and high bytes of the
 * bfloat16 and the float16 result (generated from the scalar reference;
 * tests/test_fp8_simd.c checks all 256 codes against it). Order per
 * format: bf16 low, bf16 high, f16 low, f16 high. */
static const uint8_t kvs_fp8_dec_tables[2][4][128] __attribute__((aligned(64))) = {
  {
      /* e4m3fn: bf16 low bytes */
      {
          0x00, 0x00, 0x80, 0xC0, 0x00, 0x20, 0x40, 0x60, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
          0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
          0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
          0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
          0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
          0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
          0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xF0,
          0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0, 0xE0, 0xC0,
      },
      /* e4m3fn: bf16 high bytes */
      {
          0x00, 0x3B, 0x3B, 0x3B, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C,
          0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D,
          0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E,
          0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F,
          0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40,
          0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
          0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42,
          0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x7F,
      },
      /* e4m3fn: f16 low bytes */
      {
          0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80,
          0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80,
          0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80,
          0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80,
          0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80,
          0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80,
          0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80,
          0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x80, 0x00, 0x00,
      },
      /* e4m3fn: f16 high bytes */
      {
          0x00, 0x18, 0x1C, 0x1E, 0x20, 0x21, 0x22, 0x23, 0x24, 0x24, 0x25, 0x25, 0x26, 0x26, 0x27, 0x27,
          0x28, 0x28, 0x29, 0x29, 0x2A, 0x2A, 0x2B, 0x2B, 0x2C, 0x2C, 0x2D, 0x2D, 0x2E, 0x2E, 0x2F, 0x2F,
          0x30, 0x30, 0x31, 0x31, 0x32, 0x32, 0x33, 0x33, 0x34, 0x34, 0x35, 0x35, 0x36, 0x36, 0x37, 0x37,
          0x38, 0x38, 0x39, 0x39, 0x3A, 0x3A, 0x3B, 0x3B, 0x3C, 0x3C, 0x3D, 0x3D, 0x3E, 0x3E, 0x3F, 0x3F,
          0x40, 0x40, 0x41, 0x41, 0x42, 0x42, 0x43, 0x43, 0x44, 0x44, 0x45, 0x45, 0x46, 0x46, 0x47, 0x47,
          0x48, 0x48, 0x49, 0x49, 0x4A, 0x4A, 0x4B, 0x4B, 0x4C, 0x4C, 0x4D, 0x4D, 0x4E, 0x4E, 0x4F, 0x4F,
          0x50, 0x50, 0x51, 0x51, 0x52, 0x52, 0x53, 0x53, 0x54, 0x54, 0x55, 0x55, 0x56, 0x56, 0x57, 0x57,
          0x58, 0x58, 0x59, 0x59, 0x5A, 0x5A, 0x5B, 0x5B, 0x5C, 0x5C, 0x5D, 0x5D, 0x5E, 0x5E, 0x5F, 0x7E,
      },
  },
  {
      /* e5m2: bf16 low bytes */
      {
          0x00, 0x80, 0x00, 0x40, 0x80, 0xA0, 0xC0, 0xE0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0,
          0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0,
          0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0,
          0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0,
          0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0,
          0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0,
          0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0,
          0x00, 0x20, 0x40, 0x60, 0x80, 0xA0, 0xC0, 0xE0, 0x00, 0x20, 0x40, 0x60, 0x80, 0xC0, 0xC0, 0xC0,
      },
      /* e5m2: bf16 high bytes */
      {
          0x00, 0x37, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39, 0x39,
          0x3A, 0x3A, 0x3A, 0x3A, 0x3A, 0x3A, 0x3A, 0x3A, 0x3B, 0x3B, 0x3B, 0x3B, 0x3B, 0x3B, 0x3B, 0x3B,
          0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3C, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D, 0x3D,
          0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3E, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F, 0x3F,
          0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41, 0x41,
          0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x42, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43, 0x43,
          0x44, 0x44, 0x44, 0x44, 0x44, 0x44, 0x44, 0x44, 0x45, 0x45, 0x45, 0x45, 0x45, 0x45, 0x45, 0x45,
          0x46, 0x46, 0x46, 0x46, 0x46, 0x46, 0x46, 0x46, 0x47, 0x47, 0x47, 0x47, 0x7F, 0x7F, 0x7F, 0x7F,
      },
      /* e5m2: f16 low bytes */
      {
          0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
          0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
          0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
          0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
          0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
          0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
          0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
          0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      },
      /* e5m2: f16 high bytes */
      {
          0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F,
          0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1D, 0x1E, 0x1F,
          0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2A, 0x2B, 0x2C, 0x2D, 0x2E, 0x2F,
          0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38, 0x39, 0x3A, 0x3B, 0x3C, 0x3D, 0x3E, 0x3F,
          0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48, 0x49, 0x4A, 0x4B, 0x4C, 0x4D, 0x4E, 0x4F,
          0x50, 0x51, 0x52, 0x53, 0x54, 0x55, 0x56, 0x57, 0x58, 0x59, 0x5A, 0x5B, 0x5C, 0x5D, 0x5E, 0x5F,
          0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68, 0x69, 0x6A, 0x6B, 0x6C, 0x6D, 0x6E, 0x6F,
          0x70, 0x71, 0x72, 0x73, 0x74, 0x75, 0x76, 0x77, 0x78, 0x79, 0x7A, 0x7B, 0x7C, 0x7E, 0x7E, 0x7E,
      },
  },
};

/* Byte-index vectors for vpermb / vpermt2b. */
static const uint8_t kvs_idx_tables[4][64] __attribute__((aligned(64))) = {
    /* 0: even bytes of (a, b): byte 2j of the 128-byte pair */
    {  0,   2,   4,   6,   8,  10,  12,  14,  16,  18,  20,  22,  24,  26,  28,  30,
      32,  34,  36,  38,  40,  42,  44,  46,  48,  50,  52,  54,  56,  58,  60,  62,
      64,  66,  68,  70,  72,  74,  76,  78,  80,  82,  84,  86,  88,  90,  92,  94,
      96,  98, 100, 102, 104, 106, 108, 110, 112, 114, 116, 118, 120, 122, 124, 126 },
    /* 1: odd bytes of (a, b) */
    {  1,   3,   5,   7,   9,  11,  13,  15,  17,  19,  21,  23,  25,  27,  29,  31,
      33,  35,  37,  39,  41,  43,  45,  47,  49,  51,  53,  55,  57,  59,  61,  63,
      65,  67,  69,  71,  73,  75,  77,  79,  81,  83,  85,  87,  89,  91,  93,  95,
      97,  99, 101, 103, 105, 107, 109, 111, 113, 115, 117, 119, 121, 123, 125, 127 },
    /* 2: byte 0 of each dword of (a, b), into bytes 0..31 (rest: don't care) */
    {  0,   4,   8,  12,  16,  20,  24,  28,  32,  36,  40,  44,  48,  52,  56,  60,
      64,  68,  72,  76,  80,  84,  88,  92,  96, 100, 104, 108, 112, 116, 120, 124,
       0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,
       0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0 },
    /* 3: byte 3 of each dword of (a, b), into bytes 0..31 */
    {  3,   7,  11,  15,  19,  23,  27,  31,  35,  39,  43,  47,  51,  55,  59,  63,
      67,  71,  75,  79,  83,  87,  91,  95,  99, 103, 107, 111, 115, 119, 123, 127,
       0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,
       0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0,   0 },
};

/* vpermt2w index: result word 2i = low word of dword i of the first
 * operand (word 2i), word 2i+1 = low word of dword i of the second (word
 * 32 + 2i). */
static const uint16_t kvs_even_odd_words[32] __attribute__((aligned(64))) = {
     0, 32,  2, 34,  4, 36,  6, 38,  8, 40, 10, 42, 12, 44, 14, 46,
    16, 48, 18, 50, 20, 52, 22, 54, 24, 56, 26, 58, 28, 60, 30, 62,
};

KVS_AI __m512i load_table(const uint8_t *t)
{
    return _mm512_load_si512((const void *)t);
}

/* ternary-logic immediates (A = first operand, B = second, C = third) */
#define TL_A_OR_B_AND_C 0xF8 /* A | (B & C) */
#define TL_A_AND_B_OR_C 0xEA /* (A & B) | C */

/* ---- encoders: one block of 64 elements -------------------------------- */

/* bfloat16 bits (32 per vector) -> codes in the low byte of each 16-bit
 * lane (the high byte is junk). fmt: 0 e4m3fn, 1 e5m2. */
KVS_AI __m512i bf16_core(__m512i h, int fmt, int sat, int from_f16)
{
    const int e4 = fmt == KVS_FP8_FMT_E4M3FN;
    /* Offset of the normal-path result: code + off, off a multiple of
     * 256, so that the low byte is the code. */
    const int off = e4 ? 0x400 : 0x200;
    /* from_f16: h is already |x| (f16_to_bf16_odd), and NaN is above the
     * float16 infinity, 0x4780 once rebiased; else NaN is above 0x7F80. */
    const __m512i a = from_f16 ? h : _mm512_and_si512(h, _mm512_set1_epi16(0x7FFF));
    const __m512i nan_above = _mm512_set1_epi16(from_f16 ? 0x4780 : 0x7F80);
    const __m512i inc = _mm512_maskz_permutexvar_epi8(
        (__mmask64)0x5555555555555555ULL, h, load_table(kvs_bf16_inc_tables[fmt]));
    __m512i n = _mm512_add_epi16(e4 ? _mm512_srli_epi16(a, 4) : _mm512_srli_epi16(a, 5), inc);

    /* Subnormal fp8 results: |x| clamped to the smallest normal (2^-6 /
     * 2^-14) plus a magic float whose ulp is the subnormal step (2^-9 /
     * 2^-16) and whose low 16 bits are off. vdpbf16ps computes
     * magic + x[2i] * w[2i] + x[2i+1] * w[2i+1] in float32 with round to
     * nearest even; weights (1, 0) pick the even element, (0, 1) the odd
     * one. The clamp also keeps inf and NaN out of the partner lane. */
    const __m512i c = _mm512_min_epu16(a, _mm512_set1_epi16(e4 ? 0x3C80 : 0x3880));
    const __m512 magic = _mm512_castsi512_ps(
        _mm512_set1_epi32(e4 ? 0x46800000 + 0x400 : 0x43000000 + 0x200));
    const __m512i even = _mm512_castps_si512(_mm512_dpbf16_ps(
        magic, (__m512bh)c, (__m512bh)_mm512_set1_epi32(0x00003F80)));
    const __m512i odd = _mm512_castps_si512(_mm512_dpbf16_ps(
        magic, (__m512bh)c, (__m512bh)_mm512_set1_epi32(0x3F800000)));
    const __m512i sub = _mm512_permutex2var_epi16(
        even, _mm512_load_si512((const void *)kvs_even_odd_words), odd);
    n = _mm512_max_epu16(n, sub);

    if (e4) {
        n = _mm512_min_epu16(n, _mm512_set1_epi16((short)(off + (sat ? 0x7E : 0x7F))));
        if (sat) { /* NaN -> 0x7F (without saturation the cap is 0x7F) */
            __mmask32 nan = _mm512_cmpgt_epu16_mask(a, nan_above);
            n = _mm512_mask_mov_epi16(n, nan, _mm512_set1_epi16(0x7F));
        }
    } else {
        n = _mm512_min_epu16(n, _mm512_set1_epi16((short)(off + (sat ? 0x7B : 0x7C))));
        __mmask32 nan = _mm512_cmpgt_epu16_mask(a, nan_above);
        n = _mm512_mask_mov_epi16(n, nan, _mm512_set1_epi16(0x7F));
    }
    return n;
}

/* |float16| -> |bfloat16| rounded to odd (see f32_to_bf16_odd): the
 * exponent rebiased (+112), the mantissa's low 3 bits folded into a sticky
 * lowest bit. float16 subnormals come out as values below 2^-14 (not
 * their own value, but every value below 2^-10 is e4m3fn 0 alike), inf
 * as 2^16 (overflow) and NaN above it. For e4m3fn only. */
KVS_AI __m512i f16_to_bf16_odd(__m512i h)
{
    const __m512i q = _mm512_add_epi16(_mm512_and_si512(h, _mm512_set1_epi16(7)),
                                       _mm512_set1_epi16(7)); /* bit 3: sticky */
    const __m512i r = _mm512_ternarylogic_epi32(h, _mm512_set1_epi16(0x7FFF), q,
                                                TL_A_AND_B_OR_C);
    return _mm512_add_epi16(_mm512_srli_epi16(r, 3), _mm512_set1_epi16(0x3800));
}

#ifdef __AVX512FP16__
/* bf16_core with float16 arithmetic (the avx512fp16 variant), without the
 * permutes (which on this class of CPU all queue on one port) and the
 * bfloat16 dot products. Codes come out in the low byte, the high byte 0.
 *   normal     RNE of a >> drop (drop 4 for e4m3fn, 5 for e5m2), the
 *              exponent rebiased from 127 to 7 / 15 (0x3C00 / 0x3800 in a),
 *              with a saturating subtract: inputs below the normal range
 *              give 0; monotonic, and never above the true code below the
 *              smallest normal (as in bf16_core);
 *   subnormal  a clamped to the smallest normal (2^-6 / 2^-14), converted
 *              to float16 bits by rebiasing and widening the mantissa
 *              (e5m2: scaled by 2^10 on the way, so every value that can
 *              round to a nonzero code is a float16 normal; the few below
 *              float16's normal range come out as denormals or 0, and are
 *              fp8 0 alike), plus a magic whose float16 ulp is the fp8
 *              subnormal step (2.0: 2^-9; 16.0: 2^-6 = 2^-16 x 2^10); vaddph
 *              with embedded round to nearest even leaves magic + code;
 *   cap, NaN   as in bf16_core. */
KVS_AI __m512i bf16_core_fp16(__m512i h, int fmt, int sat)
{
    const int e4 = fmt == KVS_FP8_FMT_E4M3FN;
    const int drop = e4 ? 4 : 5;
    const __m512i a = _mm512_and_si512(h, _mm512_set1_epi16(0x7FFF));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(a, drop), _mm512_set1_epi16(1));
    const short rebias = e4 ? 0x3C00 : 0x3800, half_less = (short)((1 << (drop - 1)) - 1);
    __m512i n = _mm512_srli_epi16(
        _mm512_add_epi16(_mm512_subs_epu16(a, _mm512_set1_epi16((short)(rebias - half_less))),
                         lsb),
        drop);
    const __m512i c = _mm512_min_epu16(a, _mm512_set1_epi16(e4 ? 0x3C80 : 0x3880));
    const __m512i f = _mm512_slli_epi16(
        _mm512_subs_epu16(c, _mm512_set1_epi16(e4 ? 0x3800 : 0x3300)), 3);
    const __m512i s = _mm512_castph_si512(_mm512_add_round_ph(
        _mm512_castsi512_ph(f), _mm512_set1_ph((_Float16)(e4 ? 2.0 : 16.0)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    n = _mm512_max_epu16(n, _mm512_sub_epi16(s, _mm512_set1_epi16(e4 ? 0x4000 : 0x4C00)));
    const __mmask32 nan = _mm512_cmpgt_epu16_mask(a, _mm512_set1_epi16(0x7F80));
    if (e4) {
        n = _mm512_min_epu16(n, _mm512_set1_epi16(sat ? 0x7E : 0x7F));
        if (sat) n = _mm512_mask_mov_epi16(n, nan, _mm512_set1_epi16(0x7F));
    } else {
        n = _mm512_min_epu16(n, _mm512_set1_epi16(sat ? 0x7B : 0x7C));
        n = _mm512_mask_mov_epi16(n, nan, _mm512_set1_epi16(0x7F));
    }
    return n;
}

/* float16 bits -> e4m3fn code in the low byte of each 16-bit lane (high
 * byte junk), with float16 arithmetic (the avx512fp16 variant): no detour
 * through bfloat16, and no permutes, which on this class of CPU all queue
 * on one port. With |x| as bits a:
 *   normal     RNE of a >> 7 (float16 keeps 10 mantissa bits, e4m3fn 3),
 *              the exponent rebiased by 15 - 7 = 8, i.e. 0x40 codes or
 *              0x2000 in a: (a - 0x2000 + 0x3F + lsb) >> 7 with a saturating
 *              subtract, so inputs below the normal range give 0; as in
 *              bf16_core the formula is monotonic and never above the true
 *              code below the smallest normal (2^-6, a = 0x2400), and at most
 *              0xC0 for any a, so the code fits the low byte;
 *   subnormal  a clamped to 0x2400, plus 2.0, whose float16 ulp is 2^-9,
 *              the e4m3fn subnormal step: vaddph with embedded round to
 *              nearest even (and exceptions suppressed, so MXCSR plays no
 *              part; float16 arithmetic does not flush denormals, and if it
 *              did, every float16 denormal is e4m3fn 0 anyway) gives the bits
 *              0x4000 + code: code 8, the smallest normal, for the clamp;
 *   merging    max and then the cap on the low bytes only (vpmaxub /
 *              vpminub), the high bytes being junk;
 *   NaN        saturating: a NaN (a > 0x7C00) is 0x7F; otherwise the cap
 *              0x7F already is NaN, and inf and overflow reach it. */
KVS_AI __m512i f16_e4m3fn_core_fp16(__m512i h, int sat)
{
    const __m512i a = _mm512_and_si512(h, _mm512_set1_epi16(0x7FFF));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(a, 7), _mm512_set1_epi16(1));
    const __m512i n = _mm512_srli_epi16(
        _mm512_add_epi16(_mm512_subs_epu16(a, _mm512_set1_epi16(0x2000 - 0x3F)), lsb), 7);
    const __m512i c = _mm512_min_epu16(a, _mm512_set1_epi16(0x2400));
    const __m512i sub = _mm512_castph_si512(
        _mm512_add_round_ph(_mm512_castsi512_ph(c), _mm512_set1_ph((_Float16)2.0),
                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m512i code = _mm512_min_epu8(_mm512_max_epu8(n, sub),
                                   _mm512_set1_epi16(sat ? 0x7E : 0x7F));
    if (sat) {
        const __mmask32 nan = _mm512_cmpgt_epu16_mask(a, _mm512_set1_epi16(0x7C00));
        code = _mm512_mask_mov_epi16(code, nan, _mm512_set1_epi16(0x7F));
    }
    return code;
}
#endif

/* float16 bits -> e4m3fn code in the low byte of each 16-bit lane (high
 * byte junk); -> e5m2 code in the high byte (low byte junk). No sign. */
KVS_AI __m512i f16_core(__m512i h, int fmt, int sat)
{
    if (fmt == KVS_FP8_FMT_E5M2) {
        /* e5m2 is float16 without its low 8 mantissa bits (same exponent
         * field and bias, subnormals included): RNE on the bits, the code
         * is the high byte. */
        const __m512i a = _mm512_and_si512(h, _mm512_set1_epi16(0x7FFF));
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi16(a, 8), _mm512_set1_epi16(1));
        __m512i t = _mm512_add_epi16(_mm512_add_epi16(a, _mm512_set1_epi16(0x7F)), lsb);
        t = _mm512_min_epu16(t, _mm512_set1_epi16(sat ? 0x7B00 : 0x7C00));
        __mmask32 nan = _mm512_cmpgt_epu16_mask(a, _mm512_set1_epi16(0x7C00));
        return _mm512_mask_mov_epi16(t, nan, _mm512_set1_epi16(0x7F00));
    }
#ifdef __AVX512FP16__
    return f16_e4m3fn_core_fp16(h, sat);
#else
    return bf16_core(f16_to_bf16_odd(h), fmt, sat, 1);
#endif
}

/* 64 codes from two vectors of 32 16-bit sources (`wide`; KVS_WIDE_F32:
 * bfloat16 rounded to odd from float32). The avx512fp16 variant rounds
 * bfloat16 with float16 arithmetic but keeps bf16_core for float32 sources:
 * bench_fp8 measured it 5% slower for them at 256 MiB (0.86-0.91 of the
 * streaming limit against 0.94-0.95) for 12% more in cache, while bfloat16
 * sources gain a third in cache and stay within the noise at 256 MiB
 * (docs/performance.md). */
KVS_AI __m512i enc16_block(__m512i h0, __m512i h1, int wide, int fmt, int sat)
{
    const __m512i signs = _mm512_permutex2var_epi8(h0, load_table(kvs_idx_tables[1]), h1);
    __m512i codes;
#ifdef __AVX512FP16__
    if (wide == KVS_WIDE_BF16) {
        codes = _mm512_permutex2var_epi8(bf16_core_fp16(h0, fmt, sat),
                                         load_table(kvs_idx_tables[0]),
                                         bf16_core_fp16(h1, fmt, sat));
    } else
#endif
    if (wide == KVS_WIDE_BF16 || wide == KVS_WIDE_F32) {
        codes = _mm512_permutex2var_epi8(bf16_core(h0, fmt, sat, 0), load_table(kvs_idx_tables[0]),
                                         bf16_core(h1, fmt, sat, 0));
    } else if (fmt == KVS_FP8_FMT_E5M2) { /* code in the high byte */
        codes = _mm512_permutex2var_epi8(f16_core(h0, fmt, sat), load_table(kvs_idx_tables[1]),
                                         f16_core(h1, fmt, sat));
    } else {
        codes = _mm512_permutex2var_epi8(f16_core(h0, fmt, sat), load_table(kvs_idx_tables[0]),
                                         f16_core(h1, fmt, sat));
    }
    return _mm512_ternarylogic_epi32(codes, signs, _mm512_set1_epi8((char)0x80), TL_A_OR_B_AND_C);
}

/* 32 float32 (two vectors) -> 32 bfloat16 rounded to odd: the top 16
 * bits, with the lowest one OR-ed with "any of the low 16 bits set". Round
 * to odd to 8 significant bits, then to nearest even to at most 4 (fp8),
 * is the same as rounding to nearest even directly: an inexact result is
 * odd, so it is never a midpoint or an fp8 value (those have at most 5
 * significant bits), and it stays on the same side of each of them. NaN
 * stays NaN (a payload only in the low bits sets the sticky bit), inf and
 * zero are exact, the sign is kept. */
KVS_AI __m512i f32_to_bf16_odd(__m512i x0, __m512i x1)
{
    /* the high and the low 16-bit halves of the 32 floats, in order */
    const __m512i hi = _mm512_permutex2var_epi16(
        x0, _mm512_cvtepu8_epi16(_mm256_load_si256((const void *)kvs_idx_tables[1])), x1);
    const __m512i lo = _mm512_permutex2var_epi16(
        x0, _mm512_cvtepu8_epi16(_mm256_load_si256((const void *)kvs_idx_tables[0])), x1);
    /* sticky = min(lo, 1) */
    return _mm512_or_si512(hi, _mm512_min_epu16(lo, _mm512_set1_epi16(1)));
}

/* 64 codes from four vectors of 16 float32. */
KVS_AI __m512i enc32_block(__m512i x0, __m512i x1, __m512i x2, __m512i x3, int fmt, int sat)
{
    return enc16_block(f32_to_bf16_odd(x0, x1), f32_to_bf16_odd(x2, x3), KVS_WIDE_F32, fmt, sat);
}

/* k (< 64, or 64) elements at src -> dst (and copy, unless NULL), masked. */
KVS_AI void enc_partial(const void *src, uint8_t *dst, uint8_t *copy, size_t k, int wide,
                        int fmt, int sat)
{
    const __mmask64 m = mask_first(k);
    __m512i out;
    if (wide == KVS_WIDE_F32) {
        const float *s = (const float *)src;
        out = enc32_block(_mm512_maskz_loadu_epi32((__mmask16)m, s),
                          _mm512_maskz_loadu_epi32((__mmask16)(m >> 16), s + 16),
                          _mm512_maskz_loadu_epi32((__mmask16)(m >> 32), s + 32),
                          _mm512_maskz_loadu_epi32((__mmask16)(m >> 48), s + 48), fmt, sat);
    } else {
        const uint16_t *s = (const uint16_t *)src;
        out = enc16_block(_mm512_maskz_loadu_epi16((__mmask32)m, s),
                          _mm512_maskz_loadu_epi16((__mmask32)(m >> 32), s + 32), wide, fmt, sat);
    }
    _mm512_mask_storeu_epi8(dst, m, out);
    if (copy) _mm512_mask_storeu_epi8(copy, m, out);
}

KVS_AI __m512i enc_full(const void *src, int wide, int fmt, int sat)
{
    if (wide == KVS_WIDE_F32) {
        const float *s = (const float *)src;
        return enc32_block(_mm512_loadu_si512(s), _mm512_loadu_si512(s + 16),
                           _mm512_loadu_si512(s + 32), _mm512_loadu_si512(s + 48), fmt, sat);
    }
    const uint16_t *s = (const uint16_t *)src;
    return enc16_block(_mm512_loadu_si512(s), _mm512_loadu_si512(s + 32), wide, fmt, sat);
}

/* Full blocks [i, end) -> dst (and copy, unless NULL, with ordinary
 * stores), prefetching the input KVS_FP8_PREFETCH_BYTES ahead while `pf`
 * (the caller keeps the prefetched lines inside the array); returns where
 * it stopped. */
KVS_AI size_t enc_loop(const unsigned char *s, uint8_t *dst, uint8_t *copy, size_t i,
                       size_t end, int wide, int fmt, int sat, int nt, int pf)
{
    const size_t esize = wide == KVS_WIDE_F32 ? 4 : 2;
    for (; i + 64 <= end; i += 64) {
        const unsigned char *p = s + i * esize;
        if (pf)
            for (size_t l = 0; l < esize; l++) /* 64 elements: esize lines */
                _mm_prefetch((const char *)(p + KVS_FP8_PREFETCH_BYTES + 64 * l), _MM_HINT_T0);
        const __m512i v = enc_full(p, wide, fmt, sat);
        if (nt)
            _mm512_stream_si512((void *)(dst + i), v);
        else
            _mm512_storeu_si512((void *)(dst + i), v);
        if (copy) _mm512_storeu_si512((void *)(copy + i), v);
    }
    return i;
}

/* copy: NULL, or a second destination (encode_copy in fp8_kernels.h): dst
 * then streams whatever n is. */
KVS_AI void encode_array(const void *src, uint8_t *dst, uint8_t *copy, size_t n, int wide,
                         int fmt, int sat)
{
    const size_t esize = wide == KVS_WIDE_F32 ? 4 : 2;
    const unsigned char *s = (const unsigned char *)src;
    /* prefetching block i reads up to element i + 64 + ahead */
    const size_t ahead = KVS_FP8_PREFETCH_BYTES / esize;
    const size_t pf_end = n > ahead + 64 ? n - ahead : 0;
    size_t i = 0;
    if (copy || n >= kvs_fp8_nt_min_bytes()) {
        size_t head = (size_t)(-(uintptr_t)dst & 63);
        if (head > n) head = n; /* a short array, or a small threshold (tests) */
        if (head) {
            enc_partial(s, dst, copy, head, wide, fmt, sat);
            i = head;
        }
        i = enc_loop(s, dst, copy, i, pf_end, wide, fmt, sat, 1, 1);
        i = enc_loop(s, dst, copy, i, n, wide, fmt, sat, 1, 0);
        _mm_sfence();
    } else {
        i = enc_loop(s, dst, copy, i, pf_end, wide, fmt, sat, 0, 1);
        i = enc_loop(s, dst, copy, i, n, wide, fmt, sat, 0, 0);
    }
    if (i < n)
        enc_partial(s + i * esize, dst + i, copy ? copy + i : NULL, n - i, wide, fmt, sat);
}

/* ---- decoders ----------------------------------------------------------- */

/* Interleave indexes for 16-bit results: result bytes 2j, 2j+1 = low[j],
 * high[j] (first 32 elements; the second vector adds 32). */
static const uint8_t kvs_dec_idx16[2][64] __attribute__((aligned(64))) = {
    {  0,  64,   1,  65,   2,  66,   3,  67,   4,  68,   5,  69,   6,  70,   7,  71,
       8,  72,   9,  73,  10,  74,  11,  75,  12,  76,  13,  77,  14,  78,  15,  79,
      16,  80,  17,  81,  18,  82,  19,  83,  20,  84,  21,  85,  22,  86,  23,  87,
      24,  88,  25,  89,  26,  90,  27,  91,  28,  92,  29,  93,  30,  94,  31,  95 },
    { 32,  96,  33,  97,  34,  98,  35,  99,  36, 100,  37, 101,  38, 102,  39, 103,
      40, 104,  41, 105,  42, 106,  43, 107,  44, 108,  45, 109,  46, 110,  47, 111,
      48, 112,  49, 113,  50, 114,  51, 115,  52, 116,  53, 117,  54, 118,  55, 119,
      56, 120,  57, 121,  58, 122,  59, 123,  60, 124,  61, 125,  62, 126,  63, 127 },
};

/* float32 results: bytes 4j+2, 4j+3 = low[16q + j], high[16q + j]; bytes
 * 4j, 4j+1 are zeroed by the mask. */
static const uint8_t kvs_dec_idx32[4][64] __attribute__((aligned(64))) = {
#define Q(q, j) 0, 0, (16 * (q) + (j)), (64 + 16 * (q) + (j))
#define ROW(q) { Q(q, 0), Q(q, 1), Q(q, 2), Q(q, 3), Q(q, 4), Q(q, 5), Q(q, 6), Q(q, 7),    \
                 Q(q, 8), Q(q, 9), Q(q, 10), Q(q, 11), Q(q, 12), Q(q, 13), Q(q, 14), Q(q, 15) }
    ROW(0), ROW(1), ROW(2), ROW(3),
#undef ROW
#undef Q
};

/* 64 codes -> low and high result bytes through 128-entry tables tl, th
 * (64-byte aligned) of the magnitude, the code's sign OR-ed into bit 7 of
 * the high byte. */
KVS_AI void dec_bytes(__m512i codes, const uint8_t *tl, const uint8_t *th, __m512i *lo,
                      __m512i *hi)
{
    *lo = _mm512_permutex2var_epi8(load_table(tl), codes, load_table(tl + 64));
    const __m512i h = _mm512_permutex2var_epi8(load_table(th), codes, load_table(th + 64));
    *hi = _mm512_ternarylogic_epi32(h, codes, _mm512_set1_epi8((char)0x80), TL_A_OR_B_AND_C);
}

/* k codes (1..64) at src -> dst, masked. wide: the result layout (F32:
 * bytes 2 and 3 of each float, the rest 0; else 16-bit results). */
KVS_AI void dec_partial(const uint8_t *src, void *dst, size_t k, int wide, const uint8_t *tl,
                        const uint8_t *th)
{
    const __mmask64 m = mask_first(k);
    __m512i lo, hi;
    dec_bytes(_mm512_maskz_loadu_epi8(m, src), tl, th, &lo, &hi);
    if (wide == KVS_WIDE_F32) {
        uint32_t *d = (uint32_t *)dst;
        for (int q = 0; q < 4; q++) {
            const __m512i v = _mm512_maskz_permutex2var_epi8(
                (__mmask64)0xCCCCCCCCCCCCCCCCULL, lo, load_table(kvs_dec_idx32[q]), hi);
            _mm512_mask_storeu_epi32(d + 16 * q, (__mmask16)(m >> (16 * q)), v);
        }
    } else {
        uint16_t *d = (uint16_t *)dst;
        for (int q = 0; q < 2; q++) {
            const __m512i v = _mm512_permutex2var_epi8(lo, load_table(kvs_dec_idx16[q]), hi);
            _mm512_mask_storeu_epi16(d + 32 * q, (__mmask32)(m >> (32 * q)), v);
        }
    }
}

KVS_AI void dec_full(const uint8_t *src, void *dst, int wide, const uint8_t *tl,
                     const uint8_t *th, int nt)
{
    __m512i lo, hi;
    dec_bytes(_mm512_loadu_si512(src), tl, th, &lo, &hi);
    __m512i *d = (__m512i *)dst;
    const int nv = wide == KVS_WIDE_F32 ? 4 : 2;
    for (int q = 0; q < nv; q++) {
        const __m512i v = wide == KVS_WIDE_F32
            ? _mm512_maskz_permutex2var_epi8((__mmask64)0xCCCCCCCCCCCCCCCCULL, lo,
                                             load_table(kvs_dec_idx32[q]), hi)
            : _mm512_permutex2var_epi8(lo, load_table(kvs_dec_idx16[q]), hi);
        if (nt)
            _mm512_stream_si512(d + q, v);
        else
            _mm512_storeu_si512(d + q, v);
    }
}

/* n codes -> dst through the tables (dec_bytes), with the store policy. */
KVS_AI void table_array(const uint8_t *src, void *dst, size_t n, int wide, const uint8_t *tl,
                        const uint8_t *th)
{
    const size_t esize = wide == KVS_WIDE_F32 ? 4 : 2;
    unsigned char *d = (unsigned char *)dst;
    size_t i = 0;
    if (n * esize >= kvs_fp8_nt_min_bytes() && (uintptr_t)d % esize == 0) {
        size_t head = (size_t)(-(uintptr_t)d & 63) / esize;
        if (head > n) head = n; /* only with a small threshold (tests) */
        if (head) {
            dec_partial(src, d, head, wide, tl, th);
            i = head;
        }
        for (; i + 64 <= n; i += 64)
            dec_full(src + i, d + i * esize, wide, tl, th, 1);
        _mm_sfence();
    } else {
        for (; i + 64 <= n; i += 64)
            dec_full(src + i, d + i * esize, wide, tl, th, 0);
    }
    if (i < n)
        dec_partial(src + i, d + i * esize, n - i, wide, tl, th);
}

/* wide F32 uses the bf16 tables (every fp8 value is a bfloat16). */
KVS_AI void decode_array(const uint8_t *src, void *dst, size_t n, int wide, int fmt)
{
    const int t = wide == KVS_WIDE_F16 ? 2 : 0;
    table_array(src, dst, n, wide, kvs_fp8_dec_tables[fmt][t], kvs_fp8_dec_tables[fmt][t + 1]);
}

/* The variant's lut16 (fp8_kernels.h). */
static void lut16_array(const uint8_t *src, void *dst, size_t n, const uint8_t *lo,
                        const uint8_t *hi)
{
    table_array(src, dst, n, KVS_WIDE_BF16, lo, hi);
}

/* ---- the table: the 12 kernels as encode_array / decode_array with
 * constant arguments (fp8_kernels.h) ---------------------------------------- */

#ifdef __AVX512FP16__
KVS_FP8_DEFINE_VARIANT(kvs_fp8_kernels_avx512fp16, "avx512fp16", lut16_array)
#else
KVS_FP8_DEFINE_VARIANT(kvs_fp8_kernels_avx512, "avx512", lut16_array)
#endif
