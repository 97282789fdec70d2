/* lossless_mantissas_avx512.c - kind 3's mantissas (lossless_mantissas.h)
 * 8 at a time with one BMI2 pext or pdep (the portable loop takes three
 * shift-and-mask steps each way: the unpacking was a sixth of level 3's
 * decoding outside the rANS stream). Compiled with the AVX-512 flags,
 * which include -mbmi2 (CMakeLists.txt); the caller uses it with the rANS
 * coder's AVX-512 kernels (the same CPU check and KVSERDE_ISA, and CPUs
 * whose pdep is slow microcode have no AVX-512). Writes what the portable
 * loops write, bit for bit (test_lossless compares them). */
#include <immintrin.h>
#include <string.h>

#include "frame/lossless_mantissas.h"

#define LOW7 0x7F7F7F7F7F7F7F7Full

size_t kvs_llx_pack7_avx512(const uint8_t *sm, size_t k, uint8_t *out)
{
    size_t i = 0, o = 0;
    for (; i + 8 <= k; i += 8, o += 7) {
        uint64_t x;
        memcpy(&x, sm + i, 8); /* x86: little-endian */
        x = _pext_u64(x, LOW7);
        memcpy(out + o, &x, 8); /* its 8th byte (0) is the next group's first */
    }
    return i;
}

size_t kvs_llx_unpack7_avx512(const uint8_t *in, size_t k, uint8_t *sm)
{
    size_t i = 0, o = 0;
    for (; i + 8 <= k; i += 8, o += 7) {
        uint64_t x;
        memcpy(&x, in + o, 8);
        x = _pdep_u64(x, LOW7); /* the 8th byte falls outside the mask */
        memcpy(sm + i, &x, 8);
    }
    return i;
}
