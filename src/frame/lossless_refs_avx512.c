/* lossless_refs_avx512.c - the row-reference finder's candidates of a row
 * (lossless_refs.h) with AVX-512: the 32 samples hashed, looked up and
 * stored back by gathers and scatters, and told apart by conflict
 * detection on AMD's cores, by 16 word rotations and compares on Intel's.
 * The scalar finder de-duplicates its samples through a mark per row in
 * memory, so each sample's load waits on the stores before it (and a
 * wrongly guessed alias flushes the pipeline): that was 0.7 of the rANS
 * kernel's time per block. Compiled with the AVX-512 flags and AVX512CD
 * (CMakeLists.txt); the caller checks the CPU. The same candidates, in the
 * same order, as the scalar finder (test_lossless runs both, and each form
 * here against the definition). */
#include <immintrin.h>
#include <stdatomic.h>

#include "frame/lossless_refs.h"
#include "util/cpu_features.h"

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

/* Of the 32 samples' rows + 1 (h0: samples 0-15, h1: 16-31), the first
 * sample of each row found twice or more, but not row r - 1 (the caller
 * counts it first anyway) nor an empty slot (0): a bit per sample. */
static uint32_t first_rotations(__m512i h0, __m512i h1, uint32_t r)
{
    /* the rows + 1 as words (r + 1 < 2^16) */
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
    return first;
}

/* The same by vpconflictd, which gives each lane the lanes before it of
 * equal value: within a (samples 0-15) and b (16-31), and across them in
 * four vectors of a half of a and a half of b, a's first (every pair of an
 * a-sample and a b-sample then has the a-sample in the lower lane, as in
 * the samples' order). A sample is first of its row when some later sample
 * equals it (a bit some lane's conflicts hold: their OR) and no earlier
 * does (its own conflicts are 0). On AMD's Zen 4 a vpconflictd costs 1.5
 * TSC ticks of throughput, and the six replace about 160 operations of the
 * rotations (level 3 whole chunks encode 3-4 % faster, docs/performance.md);
 * Intel's cores run it as microcode many times slower (not measured here),
 * so they keep the rotations. */
static uint32_t first_conflicts(__m512i a, __m512i b, uint32_t r)
{
    const __m512i low8 = _mm512_set1_epi32(0xFF);
    __m512i ca = _mm512_conflict_epi32(a), cb = _mm512_conflict_epi32(b);
    /* lanes 0-7 a's samples 0-7 or 8-15, lanes 8-15 b's 0-7 or 8-15: the
     * b-lanes' bits 0-7 are the a-samples equal to them */
    __m512i c0 = _mm512_conflict_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 1, 0)));
    __m512i c1 = _mm512_conflict_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 1, 0)));
    __m512i c2 = _mm512_conflict_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 3, 2)));
    __m512i c3 = _mm512_conflict_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    /* earlier: within a, within b, or b's against a (lanes 8-15, bits 0-7) */
    uint32_t eb = _mm512_test_epi32_mask(cb, cb) |
                  ((uint32_t)(_mm512_mask_test_epi32_mask(0xFF00, c0, low8) |
                              _mm512_mask_test_epi32_mask(0xFF00, c2, low8)) >> 8) |
                  _mm512_mask_test_epi32_mask(0xFF00, c1, low8) |
                  _mm512_mask_test_epi32_mask(0xFF00, c3, low8);
    uint32_t earlier = _mm512_test_epi32_mask(ca, ca) | eb << 16;
    /* later: a bit in some lane's conflicts, as a sample number (a's
     * bits 0-15 and b's 16-31; c0 and c1's bits 0-7 are a's samples 0-7,
     * c2 and c3's its 8-15) */
    __m512i t = _mm512_or_si512(ca, _mm512_slli_epi32(cb, 16));
    t = _mm512_ternarylogic_epi32(t, _mm512_or_si512(c0, c1), low8, 0xF8);
    t = _mm512_or_si512(t, _mm512_slli_epi32(_mm512_and_si512(_mm512_or_si512(c2, c3), low8), 8));
    uint32_t later = (uint32_t)_mm512_reduce_or_epi32(t);
    __m512i zero = _mm512_setzero_si512(), rv = _mm512_set1_epi32((int)r);
    uint32_t skip_a = _mm512_cmpeq_epi32_mask(a, zero) | _mm512_cmpeq_epi32_mask(a, rv);
    uint32_t skip_b = _mm512_cmpeq_epi32_mask(b, zero) | _mm512_cmpeq_epi32_mask(b, rv);
    uint32_t skip = skip_a | skip_b << 16;
    return later & ~earlier & ~skip;
}

static atomic_int conflicts_form = -1; /* kvs_llx_set_ref_conflicts */

void kvs_llx_set_ref_conflicts(int form) { atomic_store(&conflicts_form, form); }

/* Whether the finder tells its samples apart by conflict detection: on
 * AMD's cores, unless a test chose. */
static int ref_conflicts(void)
{
    int form = atomic_load_explicit(&conflicts_form, memory_order_relaxed);
    return form >= 0 ? form : (kvs_cpu_features() & KVS_CPU_AMD) != 0;
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
    uint32_t first = ref_conflicts() ? first_conflicts(h0, h1, r) : first_rotations(h0, h1, r);
    uint32_t qw[32];
    _mm512_storeu_si512(qw, h0);
    _mm512_storeu_si512(qw + 16, h1);
    uint32_t nc = 0;
    if (r) cand[nc++] = r - 1;
    for (; first; first &= first - 1) cand[nc++] = qw[__builtin_ctz(first)] - 1;
    return nc;
}

/* How many of the n u16 at a and b are equal. */
static size_t count_equal(const uint8_t *a, const uint8_t *b, size_t n)
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

uint32_t kvs_llx_best_candidate_avx512(const uint8_t *row, const uint8_t *src, size_t period,
                                       const uint32_t *cand, uint32_t nc, size_t len,
                                       size_t *most)
{
    uint32_t best_q = 0;
    size_t best = 0;
    for (uint32_t q = 0; q < nc; q++) {
        size_t m = count_equal(row, src + 2 * (size_t)cand[q] * period, len);
        if (m > best) best = m, best_q = q;
    }
    *most = best;
    return best_q;
}
