/* lossless_mantissas_avx512.c - kind 3's mantissas (lossless_mantissas.h)
 * 8 at a time with one BMI2 pext or pdep (the portable loop takes three
 * shift-and-mask steps each way: the unpacking was a sixth of level 3's
 * decoding outside the rANS stream); the unpacking 64 at a time with
 * AVX-512 VBMI before that. Compiled with the AVX-512 flags,
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
    /* 64 at a time first with AVX-512 VBMI (in the AVX-512 set the caller
     * checks): each 7 bytes of 8 mantissas spread to a u64 lane by one byte
     * permute, the 8 fields picked out of each lane by one multishift; a
     * pdep per 8 was 7 % of a level-3 block's decoding. The load is masked
     * to the 56 bytes used (no read past them). */
    const __m512i spread = _mm512_set_epi8(
        0, 55, 54, 53, 52, 51, 50, 49, 0, 48, 47, 46, 45, 44, 43, 42, 0, 41, 40, 39, 38, 37, 36,
        35, 0, 34, 33, 32, 31, 30, 29, 28, 0, 27, 26, 25, 24, 23, 22, 21, 0, 20, 19, 18, 17, 16, 15,
        14, 0, 13, 12, 11, 10, 9, 8, 7, 0, 6, 5, 4, 3, 2, 1, 0);
    const __m512i fields = _mm512_set1_epi64(0x312A231C150E0700ll); /* bits 0, 7, .. 49 */
    const __m512i low7 = _mm512_set1_epi8(0x7F);
    for (; i + 64 <= k; i += 64, o += 56) {
        __m512i x = _mm512_maskz_loadu_epi8(0x00FFFFFFFFFFFFFFull, in + o);
        x = _mm512_multishift_epi64_epi8(fields, _mm512_permutexvar_epi8(spread, x));
        _mm512_storeu_si512((void *)(sm + i), _mm512_and_si512(x, low7));
    }
    for (; i + 8 <= k; i += 8, o += 7) {
        uint64_t x;
        memcpy(&x, in + o, 8);
        x = _pdep_u64(x, LOW7); /* the 8th byte falls outside the mask */
        memcpy(sm + i, &x, 8);
    }
    return i;
}
