/* lossless_refs_avx512.c - the row-reference finder's candidates of a row
 * (lossless_refs.h) with AVX-512: the 32 samples hashed, looked up and
 * stored back by gathers and scatters, and told apart by 16 word rotations
 * and compares. The scalar finder de-duplicates its samples through a mark
 * per row in memory, so each sample's load waits on the stores before it
 * (and a wrongly guessed alias flushes the pipeline): that was 0.7 of the
 * rANS kernel's time per block. Compiled with the AVX-512 flags
 * (CMakeLists.txt); the caller checks the CPU. The same candidates, in the
 * same order, as the scalar finder (test_lossless runs both). */
#include <immintrin.h>

#include "frame/lossless_refs.h"

/* The 16 samples' row + 1 from hash (0 none), the keys' slots in *slot. */
static inline __m512i look_up(const uint8_t *row, const uint32_t *at_c16, const uint32_t *hash,
                              unsigned hash_bits, __m512i j16, __m512i *slot)
{
    __m512i c = _mm512_loadu_si512(at_c16);
    /* a u16 by a 4-byte gather inside the row: element c from bytes
     * [2c - 2, 2c + 2) (its high half), element 0 from [0, 4) */
    __m512i off = _mm512_max_epi32(_mm512_sub_epi32(_mm512_add_epi32(c, c), _mm512_set1_epi32(2)),
                                   _mm512_setzero_si512());
    __mmask16 nz = _mm512_test_epi32_mask(c, c);
    __m512i v = _mm512_i32gather_epi32(off, (const void *)row, 1);
    v = _mm512_mask_srli_epi32(_mm512_and_si512(v, _mm512_set1_epi32(0xFFFF)), nz, v, 16);
    __m512i key = _mm512_or_si512(v, _mm512_slli_epi32(j16, 16));
    *slot = _mm512_srli_epi32(_mm512_mullo_epi32(key, _mm512_set1_epi32((int)KVS_LLX_REF_HASH_MUL)),
                              32 - hash_bits);
    return _mm512_i32gather_epi32(*slot, (const void *)hash, 4);
}

uint32_t kvs_llx_ref_candidates_avx512(const uint8_t *row, const uint32_t *at_c, uint32_t *hash,
                                       unsigned hash_bits, uint32_t r, uint32_t *cand)
{
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i s0, s1;
    __m512i h0 = look_up(row, at_c, hash, hash_bits, iota, &s0);
    __m512i h1 = look_up(row, at_c + 16, hash, hash_bits,
                         _mm512_add_epi32(iota, _mm512_set1_epi32(16)), &s1);
    /* both halves looked up before either is stored: the scalar finder
     * updates the table after the row */
    _mm512_i32scatter_epi32((void *)hash, s0, _mm512_set1_epi32((int)(r + 1)), 4);
    _mm512_i32scatter_epi32((void *)hash, s1, _mm512_set1_epi32((int)(r + 1)), 4);
    /* the 32 samples' rows + 1 as words (rows <= 2^15: at most 2^15 + 1) */
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(h0)),
                                   _mm512_cvtepi32_epi16(h1), 1);
    /* Rotating by t compares every pair (i, i + t mod 32); its mask
     * rotated left by t is the pairs of rotation 32 - t, so 16 rotations
     * see them all. dup: samples another has; earlier: ... one before it. */
    const __m512i w_iota = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19,
                                            18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4,
                                            3, 2, 1, 0);
    uint32_t dup = 0, earlier = 0;
    for (unsigned t = 1; t <= 16; t++) {
        __m512i idx = _mm512_and_si512(_mm512_add_epi16(w_iota, _mm512_set1_epi16((short)t)),
                                       _mm512_set1_epi16(31));
        uint32_t m = _mm512_cmpeq_epi16_mask(q, _mm512_permutexvar_epi16(idx, q));
        uint32_t back = t < 16 ? (m << t | m >> (32 - t)) : m;
        dup |= m | back;
        earlier |= (m & ~0u << (32 - t)) | (back & ~0u << t);
    }
    /* the first sample of each row found twice, but not row r - 1 (counted
     * first anyway) nor an empty slot */
    uint32_t first = dup & ~earlier & ~_mm512_cmpeq_epi16_mask(q, _mm512_setzero_si512()) &
                     ~_mm512_cmpeq_epi16_mask(q, _mm512_set1_epi16((short)r));
    uint16_t qw[32];
    _mm512_storeu_si512(qw, q);
    uint32_t nc = 0;
    if (r) cand[nc++] = r - 1;
    for (; first; first &= first - 1) cand[nc++] = (uint32_t)qw[__builtin_ctz(first)] - 1;
    return nc;
}

size_t kvs_llx_count_equal_avx512(const uint8_t *a, const uint8_t *b, size_t n)
{
    /* 32 counts of up to n / 32 (n < 2^21: a block's row) as words */
    __m512i acc = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __mmask32 e = _mm512_cmpeq_epi16_mask(_mm512_loadu_si512(a + 2 * i),
                                              _mm512_loadu_si512(b + 2 * i));
        acc = _mm512_mask_sub_epi16(acc, e, acc, _mm512_set1_epi16(-1));
    }
    if (i < n) {
        __mmask32 live = (__mmask32)((1u << (n - i)) - 1);
        __mmask32 e = _mm512_mask_cmpeq_epi16_mask(live, _mm512_maskz_loadu_epi16(live, a + 2 * i),
                                                   _mm512_maskz_loadu_epi16(live, b + 2 * i));
        acc = _mm512_mask_sub_epi16(acc, e, acc, _mm512_set1_epi16(-1));
    }
    /* the words summed as u32 (each below 2^16) */
    __m512i lo = _mm512_and_si512(acc, _mm512_set1_epi32(0xFFFF));
    return (size_t)_mm512_reduce_add_epi32(_mm512_add_epi32(lo, _mm512_srli_epi32(acc, 16)));
}
