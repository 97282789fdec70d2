/* rans_avx512.c - the groups of 32 symbols of rans.c with AVX-512: the 32
 * states as two vectors of 16, table entries fetched by gathers (the
 * encoder's by byte permutes of the tables' byte form where rans.h has
 * one, else from their wide form, ahead of the states' chain), the
 * renormalisation words moved in and out with expand and compress. The
 * stream is the scalar kernels' bit for bit (rans_kernels.h): in a group the
 * decoder takes words for lanes 0-15, then 16-31, each vector in lane order,
 * and the encoder stores them so. */
#include <immintrin.h>
#include <stdatomic.h>

#include "codecs/rans_kernels.h"
#include "util/cpu_features.h"

#define RANS_L (1u << 15)

/* Sixteen contexts, at most top (in every lane), shifted to their tables'
 * offsets. */
static inline __m512i ctx_of(const uint8_t *ctx16, __m512i top, int shift)
{
    __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)ctx16));
    return _mm512_slli_epi32(_mm512_min_epu32(c, top), shift);
}

/* Sixteen symbols out of the states X; 32 bytes at *pp are readable.
 * The 32 states are only two dependency chains (a gather, a multiply, the
 * renormalisation), so on Intel's cores the kernel waits on their latency,
 * not on its ports: each step from one state to the next is kept short (on
 * AMD's Zen 4 its gathers' throughput bounds it instead: a second stream's
 * chains hide 9 %, docs/performance.md). The slot
 * index is one ternary-logic op. On Intel's cores the product f (x >> M)
 * is taken as two vpmuludq (5 cycles) on the even and odd lanes, not one
 * vpmulld (10): the entries' frequency sits on top (rans.h), so one shift
 * of each lane parity gives it with nothing but the other lane's bits
 * above bit 31, which a vpmuludq ignores (41.7 -> 37.8 us for a block's
 * 81,920 symbols). AMD's Zen 4 does vpmulld in 3 cycles, and there the
 * one product is faster than the two and their shifts and merge (`mullo`,
 * a constant in each copy: level 3 whole chunks decode 4-10 % faster,
 * docs/performance.md). */
static inline __attribute__((always_inline)) __m512i
dec_half(const uint32_t *slot, __m512i top, __m512i X, const uint8_t *ctx16, uint8_t *sym16,
         const uint8_t **pp, int mullo)
{
    const __m512i slots = _mm512_set1_epi32(KVS_RANS_TOTAL - 1);
    __m512i idx = _mm512_and_si512(X, slots);
    if (ctx16) /* (X & slots) | the context's offset */
        idx = _mm512_ternarylogic_epi32(X, slots, ctx_of(ctx16, top, KVS_RANS_SCALE_BITS), 0xEA);
    __m512i e = _mm512_i32gather_epi32(idx, (const void *)slot, 4);
    __m512i q = _mm512_srli_epi32(X, KVS_RANS_SCALE_BITS);
    if (mullo) {
        X = _mm512_mullo_epi32(_mm512_srli_epi32(e, KVS_RANS_DEC_F_SHIFT), q);
    } else {
        __m512i qodd = _mm512_srli_epi64(X, 32 + KVS_RANS_SCALE_BITS);
        __m512i even = _mm512_mul_epu32(_mm512_srli_epi32(e, KVS_RANS_DEC_F_SHIFT), q);
        __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(e, 32 + KVS_RANS_DEC_F_SHIFT), qodd);
        X = _mm512_mask_shuffle_epi32(even, 0xAAAA, odd, _MM_PERM_CDAB);
    }
    X = _mm512_add_epi32(X, _mm512_and_si512(e, slots));
    _mm_storeu_si128((__m128i *)sym16,
                     _mm512_cvtepi32_epi8(_mm512_srli_epi32(e, KVS_RANS_DEC_SYM_SHIFT)));
    __mmask16 in = _mm512_cmplt_epu32_mask(X, _mm512_set1_epi32(RANS_L));
    const uint8_t *p = *pp;
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    w = _mm512_maskz_expand_epi32(in, w);
    X = _mm512_mask_or_epi32(X, in, _mm512_slli_epi32(X, 16), w);
    *pp = p + 2 * __builtin_popcount(in);
    return X;
}

static atomic_int dec_form = -1; /* kvs_rans_set_dec_mullo */

void kvs_rans_set_dec_mullo(int form) { atomic_store(&dec_form, form); }

/* Whether dec_half takes its product by vpmulld: on AMD's cores, unless a
 * test chose. */
static int dec_mullo(void)
{
    int form = atomic_load_explicit(&dec_form, memory_order_relaxed);
    return form >= 0 ? form : (kvs_cpu_features() & KVS_CPU_AMD) != 0;
}

static inline __attribute__((always_inline)) size_t
dec_groups(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t **pp, const uint8_t *end,
           const uint8_t *ctx, uint8_t *sym, size_t n, const kvs_rans_warm *warm, int mullo)
{
    const uint8_t *p = *pp;
    /* the table's address and top in registers: the symbols' byte stores
     * could alias *d, and GCC read them again for every half */
    const uint32_t *slot = d->slot;
    const __m512i top = _mm512_set1_epi32((int)d->top);
    __m512i X0 = _mm512_loadu_si512(x), X1 = _mm512_loadu_si512(x + 16);
    size_t i = 0;
    for (; i + KVS_RANS_LANES <= n && end - p >= 2 * KVS_RANS_LANES; i += KVS_RANS_LANES) {
        kvs_rans_warm_group(warm, i / KVS_RANS_LANES);
        X0 = dec_half(slot, top, X0, ctx ? ctx + i : NULL, sym + i, &p, mullo);
        X1 = dec_half(slot, top, X1, ctx ? ctx + i + 16 : NULL, sym + i + 16, &p, mullo);
    }
    _mm512_storeu_si512(x, X0);
    _mm512_storeu_si512(x + 16, X1);
    *pp = p;
    return i;
}

size_t kvs_rans_dec_groups_avx512(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t **pp,
                                  const uint8_t *end, const uint8_t *ctx, uint8_t *sym, size_t n,
                                  const kvs_rans_warm *warm)
{
    return dec_mullo() ? dec_groups(d, x, pp, end, ctx, sym, n, warm, 1)
                       : dec_groups(d, x, pp, end, ctx, sym, n, warm, 0);
}

static inline __attribute__((always_inline)) void dec_joint(kvs_rans_dec_run run[2], int mullo)
{
    kvs_rans_dec_run *a = &run[0], *b = &run[1];
    const uint8_t *pa = a->p, *pb = b->p;
    /* the runs' fields in registers: the symbols' byte stores could alias
     * the runs and their tables, and GCC read every field again for every
     * half (four loads, a test and a broadcast from memory each) */
    const uint32_t *sa = a->d->slot, *sb = b->d->slot;
    const __m512i ta = _mm512_set1_epi32((int)a->d->top), tb = _mm512_set1_epi32((int)b->d->top);
    const uint8_t *ca = a->ctx, *cb = b->ctx, *ea = a->end, *eb = b->end;
    uint8_t *ya = a->sym, *yb = b->sym;
    const size_t n = a->n < b->n ? a->n : b->n;
    __m512i A0 = _mm512_loadu_si512(a->x), A1 = _mm512_loadu_si512(a->x + 16);
    __m512i B0 = _mm512_loadu_si512(b->x), B1 = _mm512_loadu_si512(b->x + 16);
    size_t i = 0;
    /* While both streams have a whole group: four chains, not two. Each
     * stream's halves stay in their order (they share its word pointer);
     * the two streams' steps are independent and overlap. */
    const kvs_rans_warm wa = a->warm, wb = b->warm;
    for (; i + KVS_RANS_LANES <= n && ea - pa >= 2 * KVS_RANS_LANES &&
           eb - pb >= 2 * KVS_RANS_LANES;
         i += KVS_RANS_LANES) {
        kvs_rans_warm_group(&wa, i / KVS_RANS_LANES);
        kvs_rans_warm_group(&wb, i / KVS_RANS_LANES);
        A0 = dec_half(sa, ta, A0, ca ? ca + i : NULL, ya + i, &pa, mullo);
        B0 = dec_half(sb, tb, B0, cb ? cb + i : NULL, yb + i, &pb, mullo);
        A1 = dec_half(sa, ta, A1, ca ? ca + i + 16 : NULL, ya + i + 16, &pa, mullo);
        B1 = dec_half(sb, tb, B1, cb ? cb + i + 16 : NULL, yb + i + 16, &pb, mullo);
    }
    _mm512_storeu_si512(a->x, A0);
    _mm512_storeu_si512(a->x + 16, A1);
    _mm512_storeu_si512(b->x, B0);
    _mm512_storeu_si512(b->x + 16, B1);
    a->done = b->done = i;
    a->p = pa;
    b->p = pb;
}

void kvs_rans_dec_joint_avx512(kvs_rans_dec_run run[2])
{
    if (dec_mullo()) dec_joint(run, 1);
    else dec_joint(run, 0);
}

void kvs_rans_dec_fill_avx512(kvs_rans_dec_tables *d, const kvs_rans_freqs *t, unsigned nctx)
{
    /* Sixteen slots a store, and only the symbols with slots (found 32 at a
     * time): the scalar loop's 256 symbols of four slots a store were 5 %
     * of a level-3 block's decoding, for 4 to 8 tables of 1024 slots. */
    const __m512i step = _mm512_set1_epi32(16);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (unsigned c = 0; c < nctx; c++) {
        uint32_t *slot = d->slot + c * KVS_RANS_TOTAL, start = 0;
        for (unsigned s0 = 0; s0 < 256; s0 += 32) {
            __m512i f32 = _mm512_loadu_si512((const void *)(t[c].f + s0));
            uint32_t used = _mm512_test_epi16_mask(f32, f32);
            for (; used; used &= used - 1) {
                uint32_t s = s0 + (uint32_t)__builtin_ctz(used), f = t[c].f[s];
                __m512i v = _mm512_add_epi32(
                    _mm512_set1_epi32((int)(f << KVS_RANS_DEC_F_SHIFT |
                                            s << KVS_RANS_DEC_SYM_SHIFT)),
                    lane);
                for (uint32_t j = 0; j < f; j += 16) {
                    __mmask16 m = f - j >= 16 ? 0xFFFF : (__mmask16)((1u << (f - j)) - 1);
                    _mm512_mask_storeu_epi32(slot + start + j, m, v);
                    v = _mm512_add_epi32(v, step);
                }
                start += f;
            }
        }
    }
}

/* The entries of sixteen symbols: info and reciprocal (rans.h's wide form,
 * two 64-bit gathers of eight), each in lane order. */
static inline void enc_entries(const kvs_rans_enc_tables *e, const uint8_t *sym16,
                               const uint8_t *ctx16, __m512i *info, __m512i *rcp)
{
    const __m512i low =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i high = _mm512_add_epi32(low, _mm512_set1_epi32(1));
    __m512i k = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)sym16));
    if (ctx16) k = _mm512_or_si512(k, ctx_of(ctx16, _mm512_set1_epi32((int)e->top), 8));
    __m512i g0 = _mm512_i32gather_epi64(_mm512_castsi512_si256(k), (const void *)e->wide, 8);
    __m512i g1 = _mm512_i32gather_epi64(_mm512_extracti64x4_epi64(k, 1), (const void *)e->wide, 8);
    *info = _mm512_permutex2var_epi32(g0, low, g1);
    *rcp = _mm512_permutex2var_epi32(g0, high, g1);
}

/* Sixteen symbols (their entries) into the states X, their words stored
 * below *pp. */
static inline __m512i enc_half(__m512i info, __m512i rcp, __m512i X, uint8_t **pp,
                               __mmask16 *bad)
{
    __m512i f = _mm512_and_si512(_mm512_srli_epi32(info, 13), _mm512_set1_epi32(0x1FFF));
    *bad |= _mm512_cmpeq_epi32_mask(f, _mm512_setzero_si512());
    __mmask16 out = _mm512_cmpge_epu32_mask(X, _mm512_slli_epi32(f, KVS_RANS_XMAX_SHIFT));
    unsigned cnt = (unsigned)__builtin_popcount(out);
    __m256i w = _mm512_cvtepi32_epi16(_mm512_maskz_compress_epi32(out, X));
    uint8_t *p = *pp - 2 * cnt;
    _mm256_mask_storeu_epi16(p, (__mmask16)((1u << cnt) - 1), w);
    *pp = p;
    X = _mm512_mask_srli_epi32(X, out, X, 16);
    /* q = mulhi(X, rcp) >> shift, even and odd lanes apart */
    __m512i ev = _mm512_mul_epu32(X, rcp);
    __m512i od = _mm512_mul_epu32(_mm512_srli_epi64(X, 32), _mm512_srli_epi64(rcp, 32));
    __m512i hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(ev, 32), od);
    __m512i q = _mm512_srlv_epi32(hi, _mm512_srli_epi32(info, 26));
    __m512i cmpl = _mm512_sub_epi32(_mm512_set1_epi32(KVS_RANS_TOTAL), f);
    X = _mm512_add_epi32(_mm512_add_epi32(X, _mm512_and_si512(info, _mm512_set1_epi32(0x1FFF))),
                         _mm512_mullo_epi32(q, cmpl));
    return X;
}

/* The entries of the 64 symbols at sym64 (two groups) from the byte form
 * of the tables (rans.h): info and reciprocal of symbols 16v..16v+15 in
 * info[v] and rcp[v]; *bad gets a lane whose symbol lies outside its
 * context's window. Eight byte fields, each a 256-byte lookup of 64
 * symbols (two 128-byte permutes and a blend), then bytes to dwords by
 * unpacks; those work within 128-bit lanes, so the indexes are first put
 * in the order that leaves the dwords in lane order: byte 16k + 4q + r
 * takes symbol 16q + 4k + r. */
static inline void win_entries(const kvs_rans_enc_tables *e, const uint8_t *sym64,
                               const uint8_t *ctx64, __m512i info[4], __m512i rcp[4],
                               __mmask64 *bad)
{
    const __m512i order = _mm512_set_epi8(
        63, 62, 61, 60, 47, 46, 45, 44, 31, 30, 29, 28, 15, 14, 13, 12, 59, 58, 57, 56, 43,
        42, 41, 40, 27, 26, 25, 24, 11, 10, 9, 8, 55, 54, 53, 52, 39, 38, 37, 36, 23, 22,
        21, 20, 7, 6, 5, 4, 51, 50, 49, 48, 35, 34, 33, 32, 19, 18, 17, 16, 3, 2, 1, 0);
    __m512i s = _mm512_loadu_si512((const void *)sym64);
    __m512i c = ctx64 ? _mm512_min_epu8(_mm512_loadu_si512((const void *)ctx64),
                                        _mm512_set1_epi8((char)e->top))
                      : _mm512_setzero_si512();
    __m512i d = _mm512_sub_epi8(s, _mm512_permutexvar_epi8(c, _mm512_loadu_si512(e->win_base)));
    *bad |= _mm512_cmpgt_epu8_mask(d, _mm512_set1_epi8((char)((1u << e->win_log2) - 1)));
    __m512i j = _mm512_or_si512(d, _mm512_permutexvar_epi8(c, _mm512_loadu_si512(e->win_high)));
    j = _mm512_permutexvar_epi8(order, j);
    __mmask64 up = _mm512_movepi8_mask(j);
    __m512i f[8];
#pragma GCC unroll 8
    for (int b = 0; b < 8; b++) {
        const uint8_t *t = e->win_field[b];
        __m512i lo = _mm512_permutex2var_epi8(_mm512_loadu_si512(t), j, _mm512_loadu_si512(t + 64));
        __m512i hi =
            _mm512_permutex2var_epi8(_mm512_loadu_si512(t + 128), j, _mm512_loadu_si512(t + 192));
        f[b] = _mm512_mask_blend_epi8(up, lo, hi);
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        __m512i *out = h ? rcp : info;
        const __m512i *g = f + 4 * h;
        __m512i b01 = _mm512_unpacklo_epi8(g[0], g[1]), t01 = _mm512_unpackhi_epi8(g[0], g[1]);
        __m512i b23 = _mm512_unpacklo_epi8(g[2], g[3]), t23 = _mm512_unpackhi_epi8(g[2], g[3]);
        out[0] = _mm512_unpacklo_epi16(b01, b23);
        out[1] = _mm512_unpackhi_epi16(b01, b23);
        out[2] = _mm512_unpacklo_epi16(t01, t23);
        out[3] = _mm512_unpackhi_epi16(t01, t23);
    }
}

/* The entries of group g - 1 are gathered before group g is coded: the
 * gathers depend on the symbols only, and written ahead of the states'
 * chain in program order they overlap it, where gathered inside each step
 * the out-of-order window did not reach the next group's (on Zen 5,
 * 131,072 exponents of real KV under 4 contexts: 1.9 -> 1.0 TSC ticks a
 * symbol, together with the wide entries: two 64-bit gathers of eight
 * cost less than the 32-bit gather of sixteen whose f indexes a second
 * one; either change alone gave 1.7 and 1.85). */
/* groups >= 1, from the wide form (rans.h); line: warm's line for the
 * first of them. */
static void enc_groups_wide(const kvs_rans_enc_tables *e, const uint8_t *sym, const uint8_t *ctx,
                            size_t groups, uint32_t *x, uint8_t **pp, uint32_t *nocode,
                            const kvs_rans_warm *warm, size_t line)
{
    uint8_t *p = *pp;
    __m512i X0 = _mm512_loadu_si512(x), X1 = _mm512_loadu_si512(x + 16);
    __mmask16 bad = 0;
    __m512i info0, rcp0, info1, rcp1;
    size_t last = (groups - 1) * KVS_RANS_LANES;
    enc_entries(e, sym + last + 16, ctx ? ctx + last + 16 : NULL, &info1, &rcp1);
    enc_entries(e, sym + last, ctx ? ctx + last : NULL, &info0, &rcp0);
    for (size_t g = groups; g-- > 0; line++) {
        __m512i ninfo0 = info0, nrcp0 = rcp0, ninfo1 = info1, nrcp1 = rcp1;
        kvs_rans_warm_group(warm, line);
        if (g > 0) {
            size_t i = (g - 1) * KVS_RANS_LANES;
            enc_entries(e, sym + i + 16, ctx ? ctx + i + 16 : NULL, &ninfo1, &nrcp1);
            enc_entries(e, sym + i, ctx ? ctx + i : NULL, &ninfo0, &nrcp0);
        }
        X1 = enc_half(info1, rcp1, X1, &p, &bad);
        X0 = enc_half(info0, rcp0, X0, &p, &bad);
        info0 = ninfo0, rcp0 = nrcp0, info1 = ninfo1, rcp1 = nrcp1;
    }
    _mm512_storeu_si512(x, X0);
    _mm512_storeu_si512(x + 16, X1);
    *pp = p;
    *nocode |= bad != 0;
}

/* The groups with the byte form (win_ok): two at a time, the next two's
 * entries looked up before these are coded. An odd top group goes first
 * by the gathers. */
static void enc_groups_win(const kvs_rans_enc_tables *e, const uint8_t *sym, const uint8_t *ctx,
                           size_t groups, uint32_t *x, uint8_t **pp, uint32_t *nocode,
                           const kvs_rans_warm *warm)
{
    size_t g = groups, line = 0;
    if (g & 1) {
        size_t i = (g - 1) * KVS_RANS_LANES;
        enc_groups_wide(e, sym + i, ctx ? ctx + i : NULL, 1, x, pp, nocode, warm, line++);
        g--;
    }
    uint8_t *p = *pp;
    __m512i X0 = _mm512_loadu_si512(x), X1 = _mm512_loadu_si512(x + 16);
    __mmask16 bad = 0;
    __mmask64 outside = 0;
    if (g) {
        __m512i info[4], rcp[4];
        size_t i = (g - 2) * KVS_RANS_LANES;
        win_entries(e, sym + i, ctx ? ctx + i : NULL, info, rcp, &outside);
        for (; g; g -= 2, line += 2) {
            __m512i ninfo[4], nrcp[4];
            kvs_rans_warm_group(warm, line);
            kvs_rans_warm_group(warm, line + 1);
            if (g > 2) {
                i = (g - 4) * KVS_RANS_LANES;
                win_entries(e, sym + i, ctx ? ctx + i : NULL, ninfo, nrcp, &outside);
            }
            X1 = enc_half(info[3], rcp[3], X1, &p, &bad);
            X0 = enc_half(info[2], rcp[2], X0, &p, &bad);
            X1 = enc_half(info[1], rcp[1], X1, &p, &bad);
            X0 = enc_half(info[0], rcp[0], X0, &p, &bad);
            if (g > 2)
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) info[v] = ninfo[v], rcp[v] = nrcp[v];
        }
    }
    _mm512_storeu_si512(x, X0);
    _mm512_storeu_si512(x + 16, X1);
    *pp = p;
    *nocode |= bad != 0 || outside != 0;
}

void kvs_rans_enc_groups_avx512(const kvs_rans_enc_tables *e, const uint8_t *sym,
                                const uint8_t *ctx, size_t groups, uint32_t *x, uint8_t **pp,
                                uint32_t *nocode, const kvs_rans_warm *warm)
{
    if (!e->wide_ok || groups == 0) /* no groups, or tables built for other kernels (rans.h) */
        kvs_rans_enc_groups_scalar(e, sym, ctx, groups, x, pp, nocode, warm);
    else if (e->win_ok)
        enc_groups_win(e, sym, ctx, groups, x, pp, nocode, warm);
    else
        enc_groups_wide(e, sym, ctx, groups, x, pp, nocode, warm, 0);
}
