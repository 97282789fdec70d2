/* lossless_refs_avx2.c - the row-reference finder's candidates of a row
 * (lossless_refs.h) with AVX2: the 32 samples hashed and looked up by
 * gathers, stored back by scalar stores (AVX2 has no scatter), and told
 * apart by 16 rotations of their 32 rows as words, each two unaligned loads
 * from the words written twice in a row. The scalar finder de-duplicates
 * through a mark per row in memory, each sample's load waiting on the
 * stores before it; on Zen 3 it was a quarter of a level-2 block's
 * encoding. Compiled with the AVX2 flags (CMakeLists.txt); the caller
 * checks the CPU. The same candidates, in the same order, as the scalar
 * finder (test_lossless compares the stage's bytes). */
#include <immintrin.h>

#include "frame/lossless_refs.h"

/* The 8 samples' row + 1 from hash (0 none), their slots into slot8. */
static inline __m256i look_up(const uint8_t *row, const uint32_t *at_c8, const uint32_t *hash,
                              unsigned hash_bits, __m256i j8, uint32_t *slot8)
{
    __m256i c = _mm256_loadu_si256((const __m256i *)at_c8);
    /* a u16 by a 4-byte gather inside the row: element c from bytes
     * [2c - 2, 2c + 2) (its high half), element 0 from [0, 4) */
    __m256i zero = _mm256_setzero_si256();
    __m256i off = _mm256_max_epi32(_mm256_sub_epi32(_mm256_add_epi32(c, c), _mm256_set1_epi32(2)),
                                   zero);
    __m256i v = _mm256_i32gather_epi32((const int *)(const void *)row, off, 1);
    __m256i at0 = _mm256_cmpeq_epi32(c, zero);
    v = _mm256_blendv_epi8(_mm256_srli_epi32(v, 16), _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF)),
                           at0);
    __m256i key = _mm256_or_si256(v, _mm256_slli_epi32(j8, 16));
    __m256i slot = _mm256_srli_epi32(
        _mm256_mullo_epi32(key, _mm256_set1_epi32((int)KVS_LLX_REF_HASH_MUL)), (int)(32 - hash_bits));
    _mm256_storeu_si256((__m256i *)slot8, slot);
    return _mm256_i32gather_epi32((const int *)hash, slot, 4);
}

/* Bit pair 2i of the 64-bit mask: word i of a equals word i of b. */
static inline uint64_t equal_pairs(__m256i a0, __m256i a1, __m256i b0, __m256i b1)
{
    uint32_t lo = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi16(a0, b0));
    uint32_t hi = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi16(a1, b1));
    return (uint64_t)hi << 32 | lo;
}

uint32_t kvs_llx_ref_candidates_avx2(const uint8_t *row, const uint32_t *at_c, uint32_t *hash,
                                     unsigned hash_bits, uint32_t r, uint32_t *cand)
{
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    uint32_t slot[32];
    __m256i h[4];
    for (int v = 0; v < 4; v++)
        h[v] = look_up(row, at_c + 8 * v, hash, hash_bits,
                       _mm256_add_epi32(iota, _mm256_set1_epi32(8 * v)), slot + 8 * v);
    /* every sample looked up before any is stored: the scalar finder
     * updates the table after the row */
    for (int j = 0; j < 32; j++) hash[slot[j]] = r + 1;
    /* the 32 rows + 1 as words (rows <= 2^16 - 2), in sample order, twice
     * in a row so that a rotation by t is two loads at word t */
    __m256i q0 = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xD8);
    __m256i q1 = _mm256_permute4x64_epi64(_mm256_packus_epi32(h[2], h[3]), 0xD8);
    uint16_t qw[64];
    _mm256_storeu_si256((__m256i *)qw, q0);
    _mm256_storeu_si256((__m256i *)(qw + 16), q1);
    _mm256_storeu_si256((__m256i *)(qw + 32), q0);
    _mm256_storeu_si256((__m256i *)(qw + 48), q1);
    /* Rotating by t compares every pair (i, i + t mod 32); its mask
     * rotated left by t is the pairs of rotation 32 - t, so 16 rotations
     * see them all. dup: samples another has; earlier: ... one before it.
     * Masks of bit pairs, two bits a sample (movemask of words). */
    uint64_t dup = 0, earlier = 0;
    for (unsigned t = 1; t <= 16; t++) {
        uint64_t m = equal_pairs(q0, q1, _mm256_loadu_si256((const __m256i *)(qw + t)),
                                 _mm256_loadu_si256((const __m256i *)(qw + t + 16)));
        uint64_t back = t < 16 ? (m << 2 * t | m >> (64 - 2 * t)) : m;
        dup |= m | back;
        earlier |= (m & ~0ull << (64 - 2 * t)) | (back & ~0ull << 2 * t);
    }
    /* the first sample of each row found twice, but not row r - 1 (counted
     * first anyway) nor an empty slot */
    __m256i zero = _mm256_setzero_si256(), rr = _mm256_set1_epi16((short)r);
    uint64_t first = dup & ~earlier & ~equal_pairs(q0, q1, zero, zero) &
                     ~equal_pairs(q0, q1, rr, rr) & 0x5555555555555555ull;
    uint32_t nc = 0;
    if (r) cand[nc++] = r - 1;
    for (; first; first &= first - 1) cand[nc++] = (uint32_t)qw[__builtin_ctzll(first) / 2] - 1;
    return nc;
}
