/* rans_avx2.c - the groups of 32 symbols of rans.c with AVX2, for CPUs
 * without AVX-512 (AMD Zen 2 and 3, Intel before Skylake-SP): the 32 states
 * as four vectors of 8, table entries fetched by gathers. AVX2 has no
 * expand or compress, so the renormalisation words move through a shuffle
 * chosen by the 8-bit mask of the lanes that take or give one (two small
 * tables, built once). The stream is the scalar kernels' bit for bit
 * (rans_kernels.h): in a group the decoder takes words for lanes 0-7, 8-15,
 * 16-23, 24-31, each vector in lane order, and the encoder stores them so.
 *
 * No pair kernel (two streams' groups at once, as rans_avx512.c has): the
 * eight state vectors and the constants outgrow AVX2's 16 registers, and
 * the spills made a pair 6 % slower than two single decodes (Zen 3, 65,536
 * symbols a stream: 54.5 against 51.5 us a stream). */
#include <immintrin.h>
#include <pthread.h>

#include "codecs/rans_kernels.h"

#define RANS_L (1u << 15)

/* expand_of[m]: for each lane set in m, which of the next words it takes
 * (its rank among the set lanes), a permutevar8x32 index; 0 elsewhere.
 * compress_of[m]: a pshufb of the 8 lanes' low words that puts the words
 * of the lanes set in m, in lane order, at the top of the 16 bytes (so one
 * store that ends at the word pointer writes them), zeros below. */
static uint8_t expand_of[256][8];
static uint8_t compress_of[256][16];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void)
{
    for (unsigned m = 0; m < 256; m++) {
        unsigned cnt = (unsigned)__builtin_popcount(m), j = 0;
        for (unsigned b = 0; b < 16; b++) compress_of[m][b] = 0x80;
        for (unsigned l = 0; l < 8; l++) {
            expand_of[m][l] = 0;
            if (!(m >> l & 1)) continue;
            expand_of[m][l] = (uint8_t)j;
            compress_of[m][2 * (8 - cnt + j)] = (uint8_t)(2 * l);
            compress_of[m][2 * (8 - cnt + j) + 1] = (uint8_t)(2 * l + 1);
            j++;
        }
    }
}

/* Eight contexts, at most top, shifted to their tables' offsets. */
static inline __m256i ctx_of(const uint8_t *ctx8, uint32_t top, int shift)
{
    __m256i c = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)ctx8));
    return _mm256_slli_epi32(_mm256_min_epu32(c, _mm256_set1_epi32((int)top)), shift);
}

/* Eight symbols out of the states X; 16 bytes at *pp are readable. */
static inline __m256i dec_oct(const kvs_rans_dec_tables *d, __m256i X, const uint8_t *ctx8,
                              uint8_t *sym8, const uint8_t **pp)
{
    const __m256i slots = _mm256_set1_epi32(KVS_RANS_TOTAL - 1);
    __m256i idx = _mm256_and_si256(X, slots);
    if (ctx8) idx = _mm256_or_si256(idx, ctx_of(ctx8, d->top, KVS_RANS_SCALE_BITS));
    __m256i e = _mm256_i32gather_epi32((const int *)d->slot, idx, 4);
    X = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_srli_epi32(e, KVS_RANS_DEC_F_SHIFT),
                                            _mm256_srli_epi32(X, KVS_RANS_SCALE_BITS)),
                         _mm256_and_si256(e, slots));
    /* the symbols: bits 10-17 of each entry, packed to 8 bytes */
    __m256i s = _mm256_and_si256(_mm256_srli_epi32(e, KVS_RANS_DEC_SYM_SHIFT),
                                 _mm256_set1_epi32(0xFF));
    __m128i s16 = _mm_packus_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    _mm_storel_epi64((__m128i *)sym8, _mm_packus_epi16(s16, s16));
    /* states below L take the next words, in lane order (X < 2^31: a
     * signed compare is exact) */
    __m256i in = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)RANS_L), X);
    unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(in));
    const uint8_t *p = *pp;
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    w = _mm256_permutevar8x32_epi32(
        w, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)expand_of[m])));
    X = _mm256_blendv_epi8(X, _mm256_or_si256(_mm256_slli_epi32(X, 16), w), in);
    *pp = p + 2 * __builtin_popcount(m);
    return X;
}

size_t kvs_rans_dec_groups_avx2(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t **pp,
                                const uint8_t *end, const uint8_t *ctx, uint8_t *sym, size_t n,
                                const kvs_rans_warm *warm)
{
    pthread_once(&tables_once, tables_init);
    const uint8_t *p = *pp;
    /* four variables, not an array: GCC kept an array's vectors in memory,
     * a store and a load on each state's dependency chain */
    __m256i X0 = _mm256_loadu_si256((const __m256i *)x);
    __m256i X1 = _mm256_loadu_si256((const __m256i *)(x + 8));
    __m256i X2 = _mm256_loadu_si256((const __m256i *)(x + 16));
    __m256i X3 = _mm256_loadu_si256((const __m256i *)(x + 24));
    size_t i = 0;
    /* a group takes at most 64 bytes, and each vector reads 16 from where
     * the ones before it left off: all inside the 64 */
    for (; i + KVS_RANS_LANES <= n && end - p >= 2 * KVS_RANS_LANES; i += KVS_RANS_LANES) {
        kvs_rans_warm_group(warm, i / KVS_RANS_LANES);
        X0 = dec_oct(d, X0, ctx ? ctx + i : NULL, sym + i, &p);
        X1 = dec_oct(d, X1, ctx ? ctx + i + 8 : NULL, sym + i + 8, &p);
        X2 = dec_oct(d, X2, ctx ? ctx + i + 16 : NULL, sym + i + 16, &p);
        X3 = dec_oct(d, X3, ctx ? ctx + i + 24 : NULL, sym + i + 24, &p);
    }
    _mm256_storeu_si256((__m256i *)x, X0);
    _mm256_storeu_si256((__m256i *)(x + 8), X1);
    _mm256_storeu_si256((__m256i *)(x + 16), X2);
    _mm256_storeu_si256((__m256i *)(x + 24), X3);
    *pp = p;
    return i;
}

/* The entries of eight symbols: info and reciprocal, in lane order (two
 * 64-bit gathers of four of the wide tables, rans.h). */
static inline void enc_entries(const kvs_rans_enc_tables *e, const uint8_t *sym8,
                               const uint8_t *ctx8, __m256i *info, __m256i *rcp)
{
    __m256i k = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sym8));
    if (ctx8) k = _mm256_or_si256(k, ctx_of(ctx8, e->top, 8));
    __m256 g0 = _mm256_castsi256_ps(
        _mm256_i32gather_epi64((const long long *)e->wide, _mm256_castsi256_si128(k), 8));
    __m256 g1 = _mm256_castsi256_ps(
        _mm256_i32gather_epi64((const long long *)e->wide, _mm256_extracti128_si256(k, 1), 8));
    *info = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(g0, g1, 0x88)), 0xD8);
    *rcp = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(g0, g1, 0xDD)), 0xD8);
}

/* Eight symbols (their entries) into the states X, their words stored
 * below *pp (the 16 bytes below it are written). */
static inline __m256i enc_oct(__m256i info, __m256i rcp, __m256i X, uint8_t **pp, __m256i *bad)
{
    __m256i f = _mm256_and_si256(_mm256_srli_epi32(info, 13), _mm256_set1_epi32(0x1FFF));
    *bad = _mm256_or_si256(*bad, _mm256_cmpeq_epi32(f, _mm256_setzero_si256()));
    /* x >= f << XMAX_SHIFT, unsigned (f = 1024 gives 2^31) */
    __m256i fs = _mm256_slli_epi32(f, KVS_RANS_XMAX_SHIFT);
    __m256i out = _mm256_cmpeq_epi32(_mm256_max_epu32(X, fs), X);
    unsigned m = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(out));
    __m256i lo = _mm256_and_si256(X, _mm256_set1_epi32(0xFFFF));
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1));
    w = _mm_shuffle_epi8(w, _mm_loadu_si128((const __m128i *)compress_of[m]));
    uint8_t *p = *pp;
    _mm_storeu_si128((__m128i *)(p - 16), w);
    *pp = p - 2 * __builtin_popcount(m);
    X = _mm256_blendv_epi8(X, _mm256_srli_epi32(X, 16), out);
    /* q = mulhi(X, rcp) >> shift, even and odd lanes apart */
    __m256i ev = _mm256_mul_epu32(X, rcp);
    __m256i od = _mm256_mul_epu32(_mm256_srli_epi64(X, 32), _mm256_srli_epi64(rcp, 32));
    __m256i hi = _mm256_blend_epi32(_mm256_srli_epi64(ev, 32), od, 0xAA);
    __m256i q = _mm256_srlv_epi32(hi, _mm256_srli_epi32(info, 26));
    __m256i cmpl = _mm256_sub_epi32(_mm256_set1_epi32(KVS_RANS_TOTAL), f);
    return _mm256_add_epi32(
        _mm256_add_epi32(X, _mm256_and_si256(info, _mm256_set1_epi32(0x1FFF))),
        _mm256_mullo_epi32(q, cmpl));
}

/* The entries of group g - 1 gathered before group g is coded, as the
 * AVX-512 set (rans_avx512.c); Zen 5 running this set, 131,072 exponents
 * of real KV under 4 contexts: 1.75 -> 1.50 TSC ticks a symbol. */
void kvs_rans_enc_groups_avx2(const kvs_rans_enc_tables *e, const uint8_t *sym,
                              const uint8_t *ctx, size_t groups, uint32_t *x, uint8_t **pp,
                              uint32_t *nocode, const kvs_rans_warm *warm)
{
    if (!e->wide_ok) { /* tables built for other kernels (rans.h) */
        kvs_rans_enc_groups_scalar(e, sym, ctx, groups, x, pp, nocode, warm);
        return;
    }
    pthread_once(&tables_once, tables_init);
    uint8_t *p = *pp;
    __m256i bad = _mm256_setzero_si256();
    /* four variables, not an array (as the decoder's) */
    __m256i X0 = _mm256_loadu_si256((const __m256i *)x);
    __m256i X1 = _mm256_loadu_si256((const __m256i *)(x + 8));
    __m256i X2 = _mm256_loadu_si256((const __m256i *)(x + 16));
    __m256i X3 = _mm256_loadu_si256((const __m256i *)(x + 24));
    __m256i info[4], rcp[4];
    if (groups) {
        size_t i = (groups - 1) * KVS_RANS_LANES;
        for (int v = 3; v >= 0; v--)
            enc_entries(e, sym + i + 8 * v, ctx ? ctx + i + 8 * v : NULL, &info[v], &rcp[v]);
    }
    for (size_t g = groups, line = 0; g-- > 0; line++) {
        __m256i ni[4], nr[4];
        kvs_rans_warm_group(warm, line);
        if (g) {
            size_t i = (g - 1) * KVS_RANS_LANES;
            for (int v = 3; v >= 0; v--)
                enc_entries(e, sym + i + 8 * v, ctx ? ctx + i + 8 * v : NULL, &ni[v], &nr[v]);
        }
        X3 = enc_oct(info[3], rcp[3], X3, &p, &bad);
        X2 = enc_oct(info[2], rcp[2], X2, &p, &bad);
        X1 = enc_oct(info[1], rcp[1], X1, &p, &bad);
        X0 = enc_oct(info[0], rcp[0], X0, &p, &bad);
        if (g)
            for (int v = 0; v < 4; v++) info[v] = ni[v], rcp[v] = nr[v];
    }
    _mm256_storeu_si256((__m256i *)x, X0);
    _mm256_storeu_si256((__m256i *)(x + 8), X1);
    _mm256_storeu_si256((__m256i *)(x + 16), X2);
    _mm256_storeu_si256((__m256i *)(x + 24), X3);
    *pp = p;
    *nocode |= !_mm256_testz_si256(bad, bad);
}

void kvs_rans_dec_fill_avx2(kvs_rans_dec_tables *d, const kvs_rans_freqs *t, unsigned nctx)
{
    /* Eight slots a store, the last ones of a symbol by a masked store (the
     * last symbol's run ends at the table's end), and only the symbols with
     * slots, found 16 at a time: the scalar loop scans all 256 and stores
     * four slots at a time. */
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), step = _mm256_set1_epi32(8);
    for (unsigned c = 0; c < nctx; c++) {
        uint32_t *slot = d->slot + c * KVS_RANS_TOTAL, start = 0;
        for (unsigned s0 = 0; s0 < 256; s0 += 16) {
            __m256i f16 = _mm256_loadu_si256((const __m256i *)(t[c].f + s0));
            /* two mask bits a symbol: the even one says it has slots */
            uint32_t used = ~(uint32_t)_mm256_movemask_epi8(
                                _mm256_cmpeq_epi16(f16, _mm256_setzero_si256())) &
                            0x55555555u;
            for (; used; used &= used - 1) {
                uint32_t s = s0 + (uint32_t)__builtin_ctz(used) / 2, f = t[c].f[s], j = 0;
                __m256i v = _mm256_add_epi32(
                    _mm256_set1_epi32((int)(f << KVS_RANS_DEC_F_SHIFT |
                                            s << KVS_RANS_DEC_SYM_SHIFT)),
                    lane);
                for (; j + 8 <= f; j += 8) {
                    _mm256_storeu_si256((__m256i *)(slot + start + j), v);
                    v = _mm256_add_epi32(v, step);
                }
                if (j < f)
                    _mm256_maskstore_epi32((int *)(slot + start + j),
                                           _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(f - j)), lane),
                                           v);
                start += f;
            }
        }
    }
}
