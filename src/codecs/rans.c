/* rans.c - static-table interleaved rANS over bytes (rans.h).
 *
 * The coder is ryg's rans_byte (public domain, 2014) with 16-bit words: a
 * state x lives in [L, 2^16 L) with L = 2^15. Coding symbol s of frequency f
 * and first slot c (in M = 2^10 slots) maps x to (x / f) M + x mod f + c
 * after the encoder has shifted out 16 bits whenever x >= (L / M) 2^16 f;
 * the decoder inverts it (s from the slot x mod M, then
 * x = f (x / M) + x mod M - c) and shifts in 16 bits whenever x < L. One
 * shift always suffices both ways, so both renormalisations are a
 * conditional move, not a loop. The encoder divides by a reciprocal
 * (Alverson; exact for x < 2^31, which the interval guarantees).
 *
 * The decoder is memory-safe on any stream: a slot always names a symbol
 * whose frequency covers it, so x stays in [1, 2^31) whatever the words
 * are, and the words are read with a bounds check per group of 32 symbols
 * (64 bytes must remain; the last groups from a zero-padded copy of the
 * last bytes) or per word near the end.
 *
 * The groups of 32 go through rans_avx512.c where the CPU has AVX-512
 * (kvs_cpu_features: KVS_CPU_AVX512), else rans_avx2.c where it has AVX2,
 * else the scalar loops here; KVSERDE_ISA "avx2" or "scalar" caps the
 * choice. All produce and accept the same stream, bit for bit
 * (tests/test_rans.c). */
#include "codecs/rans.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "codecs/rans_kernels.h"
#include "kvserde/error.h"
#include "util/cpu_features.h"

#define RANS_L (1u << 15)
#define RANS_HI (1u << 31) /* states lie in [RANS_L, RANS_HI) */
#define SLOT_MASK (KVS_RANS_TOTAL - 1)
/* The context of symbol i: ctx[i], at most the last table's (top). */
#define CTX_AT(ctx, i, top) ((ctx) ? ((ctx)[i] < (top) ? (ctx)[i] : (top)) : 0u)
_Static_assert(KVS_RANS_SCALE_BITS <= 15, "x_max = (L >> scale) << 16 needs L >= M");
_Static_assert(KVS_RANS_DEC_SYM_SHIFT + 8 <= KVS_RANS_DEC_F_SHIFT,
               "the decoder's entry: the symbol below the frequency");

/* The counted symbols of count in increasing order into sym; returns how
 * many. Four counts a compare: the branch per symbol on which counts are 0
 * was a quarter of the normalisation. */
static int counted_symbols(const uint32_t count[256], uint8_t sym[256])
{
    int nz = 0;
    for (unsigned s = 0; s < 256; s += 16) {
        unsigned m = 0;
#ifdef __SSE2__
        for (unsigned j = 0; j < 16; j += 4) {
            __m128i c = _mm_loadu_si128((const __m128i *)(count + s + j));
            m |= (unsigned)_mm_movemask_ps(_mm_castsi128_ps(
                     _mm_cmpeq_epi32(c, _mm_setzero_si128())))
                 << j;
        }
        m ^= 0xFFFF;
#else
        for (unsigned j = 0; j < 16; j++) m |= (unsigned)(count[s + j] != 0) << j;
#endif
        for (; m; m &= m - 1) sym[nz++] = (uint8_t)(s + (unsigned)__builtin_ctz(m));
    }
    return nz;
}

/* kvs_rans_normalize of the counts whose nz counted symbols are sym (in
 * order). */
static void normalize_counted(const uint32_t count[256], const uint8_t *sym, int nz,
                              kvs_rans_freqs *out)
{
    uint64_t total = 0;
    for (int j = 0; j < nz; j++) total += count[sym[j]];
    memset(out, 0, sizeof *out);
    if (total == 0) {
        out->f[0] = KVS_RANS_TOTAL;
        return;
    }
    /* Largest remainders: each counted symbol gets floor(c M / total) (at
     * least 1), and what is left goes one each to the symbols with the
     * largest fractions, the lower symbol first among equal ones (fewer
     * are left than symbols have a fraction). */
    uint64_t rem[256];
    int sum = 0;
    /* q / total by a product with 1 / total, then mended: the product is
     * within one of the quotient (q < 2^53), and a 64-bit division per
     * symbol was most of this function's time (a block's encoder
     * normalises 10 to 20 tables) */
    double inv = 1.0 / (double)total;
    for (int j = 0; j < nz; j++) {
        unsigned s = sym[j];
        uint64_t q = (uint64_t)count[s] * KVS_RANS_TOTAL;
        uint64_t quo = (uint64_t)((double)q * inv), r;
        if (quo * total > q) quo--;
        r = q - quo * total;
        if (r >= total) quo++, r -= total;
        out->f[s] = (uint16_t)(quo ? quo : 1);
        rem[j] = quo ? r : 0;
        sum += out->f[s];
    }
    int d = (int)KVS_RANS_TOTAL - sum;
    if (d > 0) {
        /* the counted symbols by fraction, largest first, equal ones in
         * symbol order (an insertion sort moves an entry only past smaller
         * ones): the first d take one each, as d scans for the largest did */
        uint8_t by[256];
        for (int j = 0; j < nz; j++) {
            int i = j;
            for (; i > 0 && rem[by[i - 1]] < rem[j]; i--) by[i] = by[i - 1];
            by[i] = (uint8_t)j;
        }
        for (int j = 0; j < d; j++) out->f[sym[by[j]]]++;
        d = 0;
    }
    /* Rounding rare symbols up to 1 overspent: take it back from the largest
     * frequencies (the lowest such symbol: only counted ones have any), an
     * eighth of one at a time (sum > M >= the symbols, so some frequency is
     * above 1 until d reaches 0). */
    while (d < 0) {
        int big = sym[0];
        for (int j = 1; j < nz; j++)
            if (out->f[sym[j]] > out->f[big]) big = sym[j];
        int take = (out->f[big] + 7) / 8;
        if (take > out->f[big] - 1) take = out->f[big] - 1;
        if (take > -d) take = -d;
        out->f[big] = (uint16_t)(out->f[big] - take);
        d += take;
    }
}

void kvs_rans_normalize(const uint32_t count[256], kvs_rans_freqs *out)
{
    uint8_t sym[256];
    int nz = counted_symbols(count, sym);
    normalize_counted(count, sym, nz, out);
}

/* -log2(f / M) for every frequency f: a block's encoder costs a few
 * hundred table entries, and log2 itself was a tenth of its time. */
static float code_bits[KVS_RANS_TOTAL + 1];
static pthread_once_t code_bits_once = PTHREAD_ONCE_INIT;

static void code_bits_init(void)
{
    for (unsigned f = 1; f <= KVS_RANS_TOTAL; f++)
        code_bits[f] = (float)(KVS_RANS_SCALE_BITS - log2((double)f));
}

/* kvs_rans_cost_bits over the nz counted symbols sym. */
static double cost_counted(const uint32_t count[256], const uint8_t *sym, int nz,
                           const kvs_rans_freqs *t)
{
    pthread_once(&code_bits_once, code_bits_init);
    double bits = 0;
    for (int j = 0; j < nz; j++) {
        unsigned s = sym[j];
        if (t->f[s] == 0) return 1e9;
        bits += (double)count[s] * code_bits[t->f[s]];
    }
    return bits;
}

double kvs_rans_cost_bits(const uint32_t count[256], const kvs_rans_freqs *t)
{
    uint8_t sym[256];
    int nz = counted_symbols(count, sym);
    return cost_counted(count, sym, nz, t);
}

double kvs_rans_normalize_estimate(const uint32_t count[256], kvs_rans_freqs *out)
{
    uint8_t sym[256];
    int nz = counted_symbols(count, sym);
    normalize_counted(count, sym, nz, out);
    return cost_counted(count, sym, nz, out) + 8.0 * (double)kvs_rans_freqs_size(out);
}

/* The table form's first and last symbol: the first and last with a
 * frequency (0 and 0 for a table of none). */
static void freqs_span(const kvs_rans_freqs *t, int *lo_out, int *hi_out)
{
    int lo = 0, hi = 255;
    /* four frequencies a test first: an exponent table starts near symbol
     * 100 and ends near 140, and the byte-at-a-time scans were a tenth of
     * the encoder's table work */
    while (lo + 4 <= 255 && (t->f[lo] | t->f[lo + 1] | t->f[lo + 2] | t->f[lo + 3]) == 0) lo += 4;
    while (lo < 255 && t->f[lo] == 0) lo++;
    while (hi - 4 > lo && (t->f[hi] | t->f[hi - 1] | t->f[hi - 2] | t->f[hi - 3]) == 0) hi -= 4;
    while (hi > lo && t->f[hi] == 0) hi--;
    *lo_out = lo, *hi_out = hi;
}

size_t kvs_rans_freqs_size(const kvs_rans_freqs *t)
{
    int lo, hi;
    freqs_span(t, &lo, &hi);
    size_t n = 2;
    for (int s = lo; s <= hi; s++) n += 1 + (t->f[s] >= 128);
    return n;
}

size_t kvs_rans_freqs_write(const kvs_rans_freqs *t, uint8_t *out)
{
    int lo, hi;
    freqs_span(t, &lo, &hi);
    size_t at = 0;
    out[at++] = (uint8_t)lo;
    out[at++] = (uint8_t)hi;
    for (int s = lo; s <= hi; s++) {
        unsigned f = t->f[s];
        if (f < 128) {
            out[at++] = (uint8_t)f;
        } else {
            out[at++] = (uint8_t)(0x80 | f >> 8);
            out[at++] = (uint8_t)f;
        }
    }
    return at;
}

int kvs_rans_freqs_read(const uint8_t *in, size_t n, const char *what, kvs_rans_freqs *t,
                        size_t *used)
{
    if (n < 2)
        return kvs_set_error(KVS_ECORRUPT, "%s: frequency table truncated (%zu of 2 bytes)",
                             what, n);
    unsigned lo = in[0], hi = in[1];
    if (lo > hi)
        return kvs_set_error(KVS_ECORRUPT, "%s: frequency table from symbol %u to %u", what, lo,
                             hi);
    memset(t, 0, sizeof *t);
    size_t at = 2;
    uint32_t sum = 0;
    for (unsigned s = lo; s <= hi; s++) {
        if (at >= n)
            return kvs_set_error(KVS_ECORRUPT,
                                 "%s: frequency table truncated at symbol %u of %u-%u", what, s,
                                 lo, hi);
        unsigned f = in[at++];
        if (f & 0x80) {
            if (at >= n)
                return kvs_set_error(KVS_ECORRUPT,
                                     "%s: frequency table truncated at symbol %u of %u-%u", what,
                                     s, lo, hi);
            f = (f & 0x7F) << 8 | in[at++];
        }
        if (f > KVS_RANS_TOTAL)
            return kvs_set_error(KVS_ECORRUPT,
                                 "%s: symbol %u has frequency %u, above the total %u", what, s,
                                 f, KVS_RANS_TOTAL);
        t->f[s] = (uint16_t)f;
        sum += f;
    }
    if (sum != KVS_RANS_TOTAL)
        return kvs_set_error(KVS_ECORRUPT, "%s: frequencies sum to %u, expected %u", what,
                             (unsigned)sum, KVS_RANS_TOTAL);
    *used = at;
    return KVS_OK;
}

/* The encoder's reciprocal (with the shift in an entry's info, q = x / f)
 * and shift of every frequency f >= 2 (f = 1: ~0, shift 0, below): a
 * block's encoder builds up to eight tables, and the 64-bit division and
 * shift search per symbol were most of that. The scalar loop reads the
 * reciprocal here, the SIMD kernels from the tables' wide form. */
static uint32_t rcp_of[KVS_RANS_TOTAL + 1];
static uint8_t shift_of[KVS_RANS_TOTAL + 1];
static pthread_once_t rcp_once = PTHREAD_ONCE_INIT;

static void rcp_init(void)
{
    rcp_of[1] = ~0u;
    for (uint32_t f = 2, shift = 1; f <= KVS_RANS_TOTAL; f++) {
        while (f > (1u << shift)) shift++;
        rcp_of[f] = (uint32_t)(((1ull << (shift + 31)) + f - 1) / f);
        shift_of[f] = (uint8_t)(shift - 1);
    }
}

/* The symbols t codes: bit s of used[s / 64] set where f[s] > 0. */
static void coded_symbols(const kvs_rans_freqs *t, uint64_t used[4])
{
    for (unsigned q = 0; q < 4; q++) {
        uint64_t m = 0;
#ifdef __SSE2__
        for (unsigned s = 0; s < 64; s += 16) {
            const __m128i *f = (const __m128i *)(t->f + 64 * q + s);
            __m128i z = _mm_packs_epi16(_mm_cmpeq_epi16(_mm_loadu_si128(f), _mm_setzero_si128()),
                                        _mm_cmpeq_epi16(_mm_loadu_si128(f + 1), _mm_setzero_si128()));
            m |= (uint64_t)(~(unsigned)_mm_movemask_epi8(z) & 0xFFFF) << s;
        }
#else
        for (unsigned s = 0; s < 64; s++) m |= (uint64_t)(t->f[64 * q + s] != 0) << s;
#endif
        used[q] = m;
    }
}

/* Where a window of coded symbols (rans.h's byte form) starts, and in *span
 * how many symbols it holds: after the longest run of uncoded symbols,
 * counted round the circle (the row residuals of kind 2 lie around 0 and
 * wrap past 255). */
static unsigned window_of(const uint64_t used[4], unsigned *span)
{
    unsigned first = 256, prev = 0, gap = 0, start = 0;
    for (unsigned q = 0; q < 4; q++)
        for (uint64_t m = used[q]; m; m &= m - 1) {
            unsigned s = 64 * q + (unsigned)__builtin_ctzll(m);
            if (first == 256) first = s;
            else if (s - prev - 1 > gap) gap = s - prev - 1, start = s;
            prev = s;
        }
    if (first == 256) { /* nothing coded */
        *span = 0;
        return 0;
    }
    if (first + 255 - prev >= gap) gap = first + 255 - prev, start = first;
    *span = 256 - gap;
    return start;
}

void kvs_rans_enc_init(kvs_rans_enc_tables *e, const kvs_rans_freqs *t, unsigned nctx)
{
    pthread_once(&rcp_once, rcp_init);
    e->top = nctx - 1;
    e->wide_ok = kvs_rans_isa() >= KVS_RANS_AVX2;
    /* The byte form where the AVX-512 kernels run and every context's
     * window is at most W = 256 >> ceil(log2 nctx) symbols. */
    unsigned log2 = 8 - (nctx > 1) - (nctx > 2) - (nctx > 4);
    e->win_ok = kvs_rans_isa() == KVS_RANS_AVX512 && nctx <= 8;
    uint64_t used[KVS_RANS_MAX_CTX][4];
    for (unsigned c = 0; c < nctx; c++) {
        coded_symbols(&t[c], used[c]);
        unsigned span, start = window_of(used[c], &span);
        if (span > 1u << log2) e->win_ok = 0;
        e->win_base[c] = (uint8_t)start;
    }
    memset(e->info, 0, nctx * 256 * sizeof e->info[0]);
    if (e->wide_ok) memset(e->wide, 0, nctx * 256 * sizeof e->wide[0]);
    if (e->win_ok) memset(e->win_field, 0, sizeof e->win_field);
    for (unsigned c = 0; c < nctx; c++) {
        uint32_t start = 0;
        for (unsigned q = 0; q < 4; q++)
            for (uint64_t m = used[c][q]; m; m &= m - 1) {
                unsigned s = 64 * q + (unsigned)__builtin_ctzll(m);
                uint32_t f = t[c].f[s];
                /* f = 1: q = x - 1 (the reciprocal of 1 does not fit): the
                 * bias makes bias + x + (x - 1)(M - 1) = x M + start */
                uint32_t bias = f == 1 ? start + KVS_RANS_TOTAL - 1 : start;
                uint32_t info = bias | f << 13 | (uint32_t)shift_of[f] << 26;
                uint64_t wide = info | (uint64_t)rcp_of[f] << 32;
                e->info[c * 256 + s] = info;
                if (e->wide_ok) e->wide[c * 256 + s] = wide;
                if (e->win_ok) {
                    unsigned j = c << log2 | ((s - e->win_base[c]) & 255);
                    for (unsigned b = 0; b < 8; b++) e->win_field[b][j] = (uint8_t)(wide >> 8 * b);
                }
                start += f;
            }
    }
    if (!e->win_ok) return;
    /* contexts above the last count as the last (CTX_AT) */
    for (unsigned c = 0; c < 64; c++) {
        unsigned k = c < nctx ? c : nctx - 1;
        e->win_base[c] = e->win_base[k];
        e->win_high[c] = (uint8_t)(k << log2 & 0xFF);
    }
    e->win_log2 = log2;
}

static const kvs_rans_kernels *kernels(void); /* which kernels, below */

void kvs_rans_dec_init(kvs_rans_dec_tables *d, const kvs_rans_freqs *t, unsigned nctx)
{
    d->top = nctx - 1;
    if (kernels()->dec_fill) {
        kernels()->dec_fill(d, t, nctx);
        return;
    }
    for (unsigned c = 0; c < nctx; c++) {
        uint32_t *slot = d->slot + c * KVS_RANS_TOTAL, start = 0;
        for (uint32_t s = 0; s < 256; s++) {
            uint32_t f = t[c].f[s], j = 0;
            uint32_t base = f << KVS_RANS_DEC_F_SHIFT | s << KVS_RANS_DEC_SYM_SHIFT;
#ifdef __SSE2__
            /* four slots a store: filling the table was a third of decoding */
            __m128i v = _mm_add_epi32(_mm_set1_epi32((int)base), _mm_setr_epi32(0, 1, 2, 3));
            for (; j + 4 <= f; j += 4) {
                _mm_storeu_si128((__m128i *)(slot + start + j), v);
                v = _mm_add_epi32(v, _mm_set1_epi32(4));
            }
#endif
            for (; j < f; j++) slot[start + j] = base | j;
            start += f;
        }
    }
}

/* ---- which kernels --------------------------------------------------- */

static const kvs_rans_kernels kernel_sets[] = {
    [KVS_RANS_SCALAR] = {kvs_rans_enc_groups_scalar, kvs_rans_dec_groups_scalar, NULL, NULL},
#if KVS_HAVE_X86
    [KVS_RANS_AVX2] = {kvs_rans_enc_groups_avx2, kvs_rans_dec_groups_avx2, NULL,
                       kvs_rans_dec_fill_avx2},
    [KVS_RANS_AVX512] = {kvs_rans_enc_groups_avx512, kvs_rans_dec_groups_avx512,
                         kvs_rans_dec_joint_avx512, kvs_rans_dec_fill_avx512},
#endif
};

static atomic_int isa_state = -1; /* -1 not chosen yet, else a KVS_RANS_* */

/* The best set this CPU runs (util/cpu_features.h: what each file is
 * compiled for). */
static int isa_available(void)
{
    unsigned f = kvs_cpu_features();
    return f & KVS_CPU_AVX512 ? KVS_RANS_AVX512 : f & KVS_CPU_AVX2 ? KVS_RANS_AVX2
                                                                   : KVS_RANS_SCALAR;
}

int kvs_rans_isa(void)
{
    int s = atomic_load_explicit(&isa_state, memory_order_relaxed);
    if (s < 0) {
        s = isa_available();
        if (kvs_cpu_isa_forced_pre_avx512() && s > KVS_RANS_AVX2) s = KVS_RANS_AVX2;
        if (kvs_cpu_isa_forced_scalar()) s = KVS_RANS_SCALAR;
        atomic_store_explicit(&isa_state, s, memory_order_relaxed);
    }
    return s;
}

static const kvs_rans_kernels *kernels(void)
{
    return &kernel_sets[kvs_rans_isa()];
}

int kvs_rans_set_isa(int isa)
{
    int s = isa < KVS_RANS_SCALAR ? KVS_RANS_SCALAR : isa;
    if (s > isa_available()) s = isa_available();
    atomic_store_explicit(&isa_state, s, memory_order_relaxed);
    return s;
}

int kvs_rans_avx512_in_use(void)
{
    return kvs_rans_isa() == KVS_RANS_AVX512;
}

int kvs_rans_set_simd(int on)
{
    return kvs_rans_set_isa(on ? KVS_RANS_AVX512 : KVS_RANS_SCALAR) == KVS_RANS_AVX512;
}

/* ---- encode ---------------------------------------------------------- */

/* One symbol into state x (info: its table entry); the word is stored at
 * p - 2 whether or not it is kept (p moves down only if it is), so no
 * branch on the data. */
static inline uint32_t enc_put(uint32_t x, uint32_t info, uint8_t **pp)
{
    uint32_t f = info >> 13 & 0x1FFF, rcp = rcp_of[f];
    uint8_t *p = *pp;
    uint32_t out = x >= f << KVS_RANS_XMAX_SHIFT; /* x_max = ((L >> scale) << 16) f */
    p[-2] = (uint8_t)x;
    p[-1] = (uint8_t)(x >> 8);
    *pp = p - 2 * out;
    x = out ? x >> 16 : x;
    uint32_t q = (uint32_t)(((uint64_t)x * rcp) >> 32) >> (info >> 26);
    return x + (info & 0x1FFF) + q * (KVS_RANS_TOTAL - f);
}

void kvs_rans_enc_groups_scalar(const kvs_rans_enc_tables *e, const uint8_t *sym,
                                const uint8_t *ctx, size_t groups, uint32_t *x, uint8_t **pp,
                                uint32_t *nocode, const kvs_rans_warm *warm)
{
    uint8_t *p = *pp;
    uint32_t bad = 0;
    for (size_t g = groups, line = 0; g-- > 0; line++) {
        size_t i = g * KVS_RANS_LANES;
        kvs_rans_warm_group(warm, line);
        for (int l = KVS_RANS_LANES - 1; l >= 0; l--) {
            unsigned k = CTX_AT(ctx, i + l, e->top) * 256u + sym[i + l];
            uint32_t info = e->info[k];
            bad |= (info >> 13 & 0x1FFF) == 0;
            x[l] = enc_put(x[l], info, &p);
        }
    }
    *pp = p;
    *nocode |= bad;
}

/* Nothing to warm (kvs_rans_warm), for the kernels' callers that have none. */
static const kvs_rans_warm no_warm = {NULL, 0, NULL, 0};

int kvs_rans_encode_tail(const kvs_rans_enc_tables *e, const uint8_t *sym, const uint8_t *ctx,
                         size_t n, uint8_t *out, size_t cap, const kvs_rans_warm *warm,
                         size_t *at)
{
    if (cap < kvs_rans_bound(n))
        return kvs_set_error(KVS_ENOSPC, "rans: output holds %zu bytes, %zu symbols need %zu",
                             cap, n, kvs_rans_bound(n));
    uint32_t x[KVS_RANS_LANES];
    for (int l = 0; l < KVS_RANS_LANES; l++) x[l] = RANS_L;
    uint8_t *p = out + cap; /* words go down from the end: at most n + 1 stores */
    uint32_t nocode = 0;
    /* The symbols after the last whole group, last first; then the groups. */
    for (size_t i = n; i-- > n - n % KVS_RANS_LANES;) {
        unsigned k = CTX_AT(ctx, i, e->top) * 256u + sym[i];
        uint32_t info = e->info[k];
        nocode |= (info >> 13 & 0x1FFF) == 0;
        x[i % KVS_RANS_LANES] = enc_put(x[i % KVS_RANS_LANES], info, &p);
    }
    kernels()->enc_groups(e, sym, ctx, n / KVS_RANS_LANES, x, &p, &nocode, warm ? warm : &no_warm);
    if (nocode) {
        size_t i = 0;
        while (i < n && e->info[CTX_AT(ctx, i, e->top) * 256u + sym[i]] >> 13 & 0x1FFF) i++;
        return kvs_set_error(KVS_EINVAL,
                             "rans: symbol %u at %zu has frequency 0 in the table of context %u",
                             i < n ? sym[i] : 0, i, i < n ? CTX_AT(ctx, i, e->top) : 0);
    }
    /* the states before the words: at most 2n + 2 bytes of words end at
     * out + cap >= out + 4 * KVS_RANS_LANES + 2n + 2 */
    p -= 4 * KVS_RANS_LANES;
    for (int l = 0; l < KVS_RANS_LANES; l++)
        for (int b = 0; b < 4; b++) p[4 * l + b] = (uint8_t)(x[l] >> (8 * b));
    *at = (size_t)(p - out);
    return KVS_OK;
}

int kvs_rans_encode(const kvs_rans_enc_tables *e, const uint8_t *sym, const uint8_t *ctx,
                    size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    size_t at = 0;
    int rc = kvs_rans_encode_tail(e, sym, ctx, n, out, cap, NULL, &at);
    if (rc) return rc;
    *outn = cap - at;
    memmove(out, out + at, *outn);
    return KVS_OK;
}

/* ---- decode ---------------------------------------------------------- */

/* w's ranges from the line of the group that starts at symbol done (a
 * whole number of groups) on. */
static kvs_rans_warm warm_from(const kvs_rans_warm *w, size_t done)
{
    size_t at = 64 * (done / KVS_RANS_LANES);
    kvs_rans_warm r = no_warm;
    if (at < w->read_len) r.read = w->read + at, r.read_len = w->read_len - at;
    if (at < w->write_len) r.write = w->write + at, r.write_len = w->write_len - at;
    return r;
}

/* One symbol out of state x; *p is a word inside the stream (when the state
 * needs one) or ignored. Returns the new state, the symbol in *s, the
 * words used in *in (0 or 1). */
static inline uint32_t dec_step(const uint32_t *tab, uint32_t x, const uint8_t *p, uint8_t *s,
                                uint32_t *in)
{
    uint32_t e = tab[x & SLOT_MASK];
    x = (e >> KVS_RANS_DEC_F_SHIFT) * (x >> KVS_RANS_SCALE_BITS) + (e & SLOT_MASK);
    *s = (uint8_t)(e >> KVS_RANS_DEC_SYM_SHIFT);
    *in = x < RANS_L;
    return *in ? x << 16 | (uint32_t)p[0] | (uint32_t)p[1] << 8 : x;
}

size_t kvs_rans_dec_groups_scalar(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t **pp,
                                  const uint8_t *end, const uint8_t *ctx, uint8_t *sym, size_t n,
                                  const kvs_rans_warm *warm)
{
    const uint8_t *p = *pp;
    size_t i = 0;
    for (; i + KVS_RANS_LANES <= n && end - p >= 2 * KVS_RANS_LANES; i += KVS_RANS_LANES) {
        kvs_rans_warm_group(warm, i / KVS_RANS_LANES);
        for (int l = 0; l < KVS_RANS_LANES; l++) {
            const uint32_t *tab = d->slot + CTX_AT(ctx, i + l, d->top) * KVS_RANS_TOTAL;
            uint32_t in;
            x[l] = dec_step(tab, x[l], p, &sym[i + l], &in);
            p += 2 * in;
        }
    }
    *pp = p;
    return i;
}

/* The 32 states at the start of in[0..len) into x, each checked. */
static int dec_states(const uint8_t *in, size_t len, const char *what, uint32_t *x)
{
    if (len < 4 * KVS_RANS_LANES)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: rANS stream of %zu bytes, shorter than its %u bytes of states", what,
                             len, 4 * KVS_RANS_LANES);
    for (int l = 0; l < KVS_RANS_LANES; l++) {
        const uint8_t *q = in + 4 * l;
        x[l] = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
               (uint32_t)q[3] << 24;
        if (x[l] < RANS_L || x[l] >= RANS_HI)
            return kvs_set_error(KVS_ECORRUPT,
                                 "%s: rANS state %d is %u, outside [%u, %u)", what, l,
                                 (unsigned)x[l], RANS_L, RANS_HI);
    }
    return KVS_OK;
}

/* The symbols from i on, after the groups kernel stopped at i with the
 * states x and the words at *p: the last groups, then one by one. */
static int dec_rest(const kvs_rans_dec_tables *d, uint32_t *x, const uint8_t *p,
                    const uint8_t *end, const uint8_t *ctx, uint8_t *sym, size_t n, size_t i,
                    const char *what)
{
    /* The kernel stops 64 bytes before the end (a group reads that far),
     * which left the last groups to the checked loop below (2 % of
     * decoding, the symbols 5-10x slower with AVX-512): they run from a
     * padded copy of those bytes. A valid stream never takes a word past
     * its end; if these groups do, the checked loop starts again where they
     * did and refuses as always. */
    if (n - i >= KVS_RANS_LANES && (size_t)(end - p) < 4 * KVS_RANS_LANES) {
        uint8_t pad[4 * KVS_RANS_LANES] = {0};
        uint32_t x0[KVS_RANS_LANES];
        size_t left = (size_t)(end - p);
        memcpy(pad, p, left);
        memcpy(x0, x, sizeof x0);
        const uint8_t *q = pad;
        size_t more = kernels()->dec_groups(d, x, &q, pad + sizeof pad, ctx ? ctx + i : NULL,
                                            sym + i, n - i, &no_warm);
        if ((size_t)(q - pad) <= left) {
            i += more;
            p += q - pad;
        } else {
            memcpy(x, x0, sizeof x0);
        }
    }
    /* The rest one by one, each word checked. */
    static const uint8_t none[2] = {0, 0};
    for (; i < n; i++) {
        const uint32_t *tab = d->slot + CTX_AT(ctx, i, d->top) * KVS_RANS_TOTAL;
        uint32_t used;
        const uint8_t *w = end - p >= 2 ? p : none;
        x[i % KVS_RANS_LANES] = dec_step(tab, x[i % KVS_RANS_LANES], w, &sym[i], &used);
        if (used && w == none)
            return kvs_set_error(KVS_ECORRUPT, "%s: rANS stream ends at symbol %zu of %zu",
                                 what, i, n);
        p += 2 * used;
    }
    if (p != end)
        return kvs_set_error(KVS_ECORRUPT, "%s: %zu bytes after the rANS stream of %zu symbols",
                             what, (size_t)(end - p), n);
    for (int l = 0; l < KVS_RANS_LANES; l++)
        if (x[l] != RANS_L)
            return kvs_set_error(KVS_ECORRUPT,
                                 "%s: rANS state %d ends at %u, not at its start %u", what, l,
                                 (unsigned)x[l], RANS_L);
    return KVS_OK;
}

int kvs_rans_decode(const kvs_rans_dec_tables *d, const uint8_t *in, size_t len,
                    const uint8_t *ctx, uint8_t *sym, size_t n, const char *what)
{
    uint32_t x[KVS_RANS_LANES];
    int rc = dec_states(in, len, what, x);
    if (rc) return rc;
    const uint8_t *p = in + 4 * KVS_RANS_LANES, *end = in + len;
    size_t i = kernels()->dec_groups(d, x, &p, end, ctx, sym, n, &no_warm);
    return dec_rest(d, x, p, end, ctx, sym, n, i, what);
}

int kvs_rans_stream_start(kvs_rans_dec_stream *s, const kvs_rans_dec_job *job)
{
    s->job = *job;
    s->p = job->in + 4 * KVS_RANS_LANES;
    s->done = 0;
    return dec_states(job->in, job->len, job->what, s->x);
}

int kvs_rans_streams_joint(kvs_rans_dec_stream *s[2])
{
    const kvs_rans_kernels *k = kernels();
    if (k->dec_joint == NULL) return 0;
    kvs_rans_dec_run run[2];
    for (int t = 0; t < 2; t++) {
        const kvs_rans_dec_job *j = &s[t]->job;
        run[t] = (kvs_rans_dec_run){j->d,
                                    s[t]->x,
                                    s[t]->p,
                                    j->in + j->len,
                                    j->ctx ? j->ctx + s[t]->done : NULL,
                                    j->sym + s[t]->done,
                                    j->n - s[t]->done,
                                    0,
                                    warm_from(&j->warm, s[t]->done)};
    }
    k->dec_joint(run);
    for (int t = 0; t < 2; t++) {
        s[t]->p = run[t].p;
        s[t]->done += run[t].done;
    }
    /* the one whose next group is not whole (the kernel's own test) */
    const kvs_rans_dec_job *a = &s[0]->job;
    return s[0]->done + KVS_RANS_LANES <= a->n &&
           a->in + a->len - s[0]->p >= 2 * KVS_RANS_LANES;
}

int kvs_rans_stream_finish(kvs_rans_dec_stream *s)
{
    const kvs_rans_dec_job *j = &s->job;
    const uint8_t *end = j->in + j->len;
    size_t i = s->done;
    const uint8_t *ctx = j->ctx ? j->ctx + i : NULL;
    kvs_rans_warm warm = warm_from(&j->warm, i);
    i += kernels()->dec_groups(j->d, s->x, &s->p, end, ctx, j->sym + i, j->n - i, &warm);
    return dec_rest(j->d, s->x, s->p, end, j->ctx, j->sym, j->n, i, j->what);
}

void kvs_rans_dec_groups2(kvs_rans_dec_run run[2])
{
    const kvs_rans_kernels *k = kernels();
    if (k->dec_joint)
        k->dec_joint(run);
    else
        run[0].done = run[1].done = 0;
    /* then each alone as far as the single kernel goes */
    for (int s = 0; s < 2; s++) {
        kvs_rans_dec_run *r = &run[s];
        size_t i = r->done;
        kvs_rans_warm warm = warm_from(&r->warm, i);
        r->done = i + k->dec_groups(r->d, r->x, &r->p, r->end, r->ctx ? r->ctx + i : NULL,
                                    r->sym + i, r->n - i, &warm);
    }
}

int kvs_rans_decode2(const kvs_rans_dec_job job[2])
{
    uint32_t x[2][KVS_RANS_LANES];
    kvs_rans_dec_run run[2];
    for (int s = 0; s < 2; s++) {
        const kvs_rans_dec_job *j = &job[s];
        int rc = dec_states(j->in, j->len, j->what, x[s]);
        if (rc) return rc;
        run[s] = (kvs_rans_dec_run){j->d,   x[s],   j->in + 4 * KVS_RANS_LANES,
                                    j->in + j->len, j->ctx, j->sym, j->n, 0, j->warm};
    }
    kvs_rans_dec_groups2(run);
    for (int s = 0; s < 2; s++) {
        int rc = dec_rest(run[s].d, x[s], run[s].p, run[s].end, run[s].ctx, run[s].sym, run[s].n,
                          run[s].done, job[s].what);
        if (rc) return rc;
    }
    return KVS_OK;
}
