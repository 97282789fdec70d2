/* lossless_rows_avx512vbmi2.c - the rebuild of a row with a reference
 * (record kind 2, lossless_exponent.c) 32 elements at a time, with AVX-512
 * VBMI2's expanding byte loads: the scalar loop takes a flag, a difference
 * and a select per element, as much time as decoding the rANS stream; and
 * the encoder's inverse, the row's elements not repeated gathered with
 * compressing byte stores.
 * Compiled with the AVX-512 flags and -mavx512vbmi2 (CMakeLists.txt); the
 * caller checks the CPU. Writes what the scalar loop writes, bit for bit
 * (test_lossless runs both). */
#include <immintrin.h>

#include "frame/lossless_rows.h"

/* 32 flag bits from bit `bit` of fl[0..nfb) (0 past its end). */
static inline uint32_t flags32(const uint8_t *fl, size_t nfb, size_t bit)
{
    uint64_t v = 0;
    size_t b0 = bit >> 3;
    for (unsigned j = 0; j < 5 && b0 + j < nfb; j++) v |= (uint64_t)fl[b0 + j] << (8 * j);
    return (uint32_t)(v >> (bit & 7));
}

size_t kvs_llx_row_refs_avx512vbmi2(const uint8_t *above, const uint8_t *fl, size_t nfb,
                                    size_t fbit, const uint8_t *sym, const uint8_t *sm, size_t n,
                                    uint8_t *out, size_t *used)
{
    const __m512i lo8 = _mm512_set1_epi16(0xFF), m80 = _mm512_set1_epi16(0x80),
                  m7f = _mm512_set1_epi16(0x7F);
    size_t c = 0, s = 0;
    for (; c + 32 <= n; c += 32, fbit += 32) {
        __mmask32 rep = flags32(fl, nfb, fbit), keep = ~rep;
        /* the not-repeated elements' symbols and bytes, spread to their
         * places (expandload reads popcount(keep) bytes) */
        __m512i e = _mm512_cvtepu8_epi16(_mm256_maskz_expandloadu_epi8(keep, sym + s));
        __m512i b = _mm512_cvtepu8_epi16(_mm256_maskz_expandloadu_epi8(keep, sm + s));
        __m512i a = _mm512_loadu_si512(above + 2 * c);
        __m512i ex = _mm512_and_si512(_mm512_add_epi16(e, _mm512_srli_epi16(a, 7)), lo8);
        __m512i sign = _mm512_slli_epi16(_mm512_and_si512(b, m80), 8);
        __m512i v = _mm512_or_si512(_mm512_or_si512(sign, _mm512_slli_epi16(ex, 7)),
                                    _mm512_and_si512(b, m7f));
        _mm512_storeu_si512(out + 2 * c, _mm512_mask_blend_epi16(rep, v, a));
        s += (size_t)__builtin_popcount((unsigned)keep);
    }
    *used = s;
    return c;
}

size_t kvs_llx_row_split_avx512vbmi2(const uint8_t *exp, const uint8_t *above, const uint8_t *sm,
                                     const uint8_t *fl, size_t nfb, size_t fbit, size_t n,
                                     uint8_t ctx, uint8_t *sym, uint8_t *sym_ctx, uint8_t *sm_out,
                                     size_t *used)
{
    const __m256i cv = _mm256_set1_epi8((char)ctx);
    size_t c = 0, s = 0;
    for (; c + 32 <= n; c += 32, fbit += 32) {
        __mmask32 keep = ~flags32(fl, nfb, fbit);
        unsigned cnt = (unsigned)__builtin_popcount((unsigned)keep);
        __mmask32 low = _bzhi_u32(~0u, cnt);
        __m256i d = _mm256_sub_epi8(_mm256_loadu_si256((const __m256i *)(exp + c)),
                                    _mm256_loadu_si256((const __m256i *)(above + c)));
        __m256i b = _mm256_loadu_si256((const __m256i *)(sm + c));
        _mm256_mask_storeu_epi8(sym + s, low, _mm256_maskz_compress_epi8(keep, d));
        _mm256_mask_storeu_epi8(sm_out + s, low, _mm256_maskz_compress_epi8(keep, b));
        _mm256_mask_storeu_epi8(sym_ctx + s, low, cv);
        s += cnt;
    }
    *used = s;
    return c;
}
