/* lossless_exponent.c - one block of the lossless stage's rANS coder
 * (lossless_exponent.h).
 *
 * Record of a block of k elements (docs/frame_format.md):
 *   u8 0, then the 2k bytes raw; or
 *   u8 1 | the k sign and mantissa bytes (bit 7 the sign, bits 0-6 the
 *   mantissa) | u8 groups G (1-4) | when G > 1, the group of each channel,
 *   2 bits each, channel c in bits 2(c mod 4) of byte c / 4 (ceil(period /
 *   4) bytes, unused bits 0) | G frequency tables (rans.h) | the rANS stream
 *   of the k exponents, to the end of the record; or (payload version 3)
 *   u8 2, row references: a row (period elements) may name an earlier row
 *   of the block; each of its elements equal to the one above it in that
 *   row is one set flag and nothing else, the others store their sign and
 *   mantissa byte and code their exponent as the difference to the
 *   exponent above (mod 256) under a table of its own:
 *   u32 u | the u sign and mantissa bytes of the elements not repeated |
 *   u8 G | the group map as above | a bit per row (row r in bit r mod 8 of
 *   byte r / 8, ceil(rows / 8) bytes, unused bits 0): it has a reference |
 *   u16 distance (1 to r) of each row with one, in row order | G group
 *   tables, the difference table | u8 flag coding C (0 raw, 1 rANS) | when
 *   C = 1 the flag table | u32 F | F bytes: the flags of the rows with a
 *   reference, 8 a byte (element order, bit 0 first, the last byte padded
 *   with 0), raw (F their count) or their rANS stream | the rANS stream of
 *   the u exponent symbols
 *   (a row without a reference: its exponents under the groups' tables; a
 *   row with one: the differences), to the end of the record; or (payload
 *   version 4) u8 3, the signs coded: the k mantissas, 7 bits each, element
 *   i in bits 7i..7i+6 of the little-endian bit string (ceil(7k / 8) bytes,
 *   unused bits 0) | u8 G | the group map as above | the sign class of
 *   each channel (0-3), 2 bits each as the group map (ceil(period / 4)
 *   bytes) | G group tables | 4 sign tables (symbols 0-15) | the rANS
 *   stream of the k exponents (the groups' tables) and then, for each
 *   group j of 4 rows and each channel c, a nibble under the table of c's
 *   class: bit t the sign of element (4j + t, c) XOR the sign above it
 *   (row 4j + t - 1; row 0: XOR 0), 0 past the block's end.
 * The sign and mantissa bytes come first so that the encoder writes them in
 * place while it splits the elements.
 *
 * Why channel groups and row references (docs/performance.md measures
 * each): on the real KV cache the exponent costs 2.62 bits per element
 * order-0 with the tables, 2.51 with 4 channel groups (map and tables
 * included), 2.55 with the previous token's exponent as context and 2.51
 * with both. What is left is repeats across tokens (what zstd -19 finds):
 * 3.4 % of the elements equal the element above them in an earlier row the
 * encoder can find cheaply (by hashing 32 sampled channels), and in such a
 * row the other elements' exponents equal the ones above 79 % of the time
 * (1.17 bits against 2.53). Sign and mantissa are 7.97 bits of 8 taken
 * one element at a time, but K after RoPE has channels that rotate slowly
 * and keep their sign for many tokens: a sign as a flip of the one above,
 * coded per class of channels four rows at a time, costs 0.71-0.76 bits in
 * K2-K5 (1 raw). */
#include "frame/lossless_exponent.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "codecs/rans.h"
#include "codecs/rans_kernels.h"
#include "frame/lossless_flips.h"
#include "frame/lossless_join.h"
#include "frame/lossless_mantissas.h"
#include "frame/lossless_refs.h"
#include "frame/lossless_split.h"
#include "frame/lossless_rows.h"
#include "kvserde/error.h"
#include "util/cpu_features.h"
#include "util/crc32c.h"
#include "util/le.h"

#define LLX_RAW 0
#define LLX_CODED 1
#define LLX_REFS 2
#define LLX_SIGNS 3
#define LLX_GROUPS 4 /* the most the encoder tries (and the map's 2 bits hold) */
#define LLX_DIFF_CTX LLX_GROUPS /* the encoder's context of the differences */
#define LLX_SAMPLES KVS_LLX_REF_SAMPLES /* channels hashed per row to find a reference */
#define LLX_HASH_BITS 12
#define LLX_MAX_DISTANCE 65535u /* a reference's u16 */
#define LLX_SIGN_CLASSES 4      /* kind 3: the map's 2 bits */
#define LLX_SIGN_CTX LLX_GROUPS /* the encoder's first sign context */
#define LLX_SIGN_ROWS 4         /* rows of a channel in one sign symbol */

/* The counts of keys (hist_keys) in several ways (key i in way i mod the
 * ways), because exponents cluster on a few values and each way's
 * increments of one counter chain through memory. Which ways pay differs
 * by core, measured alone on a 128 KiB block of kvdata: on Intel (Sapphire
 * Rapids) eight ways of 16-bit counters, folded into 32-bit totals
 * (hist_total) before a way can overflow: 16 KiB that stay in L1 beside
 * the keys where eight of 32-bit took 32 KiB (23 -> 18.5 us against four
 * of 32-bit); on AMD (Zen 3) four ways of 32-bit counters, as its 16-bit
 * increments of memory are slow (47 us for eight of 16-bit, 26 us). One
 * layout per process (hist_short). */
#define HIST_WAYS 8 /* of 16-bit counters */
#define HIST_WAYS32 4 /* of 32-bit counters */
typedef struct llx_hist {
    uint16_t way[HIST_WAYS][LLX_GROUPS * 256];
    uint32_t way32[HIST_WAYS32][LLX_GROUPS * 256];
    uint32_t total[LLX_GROUPS][256];
    uint32_t most; /* the most any 16-bit way counted since the last fold */
} llx_hist;

struct kvs_llx_scratch {
    size_t max_k;
    uint8_t *exp; /* the block's exponents (kind 3: then the sign nibbles) */
    uint8_t *ctx; /* each element's group (kind 3: then the nibbles' contexts) */
    uint16_t *key; /* the encoder: each element's group << 8 | exponent
                    * (kind 3: then each nibble's class << 4 | nibble, bytes) */
    uint8_t *stream;
    uint8_t *sym;     /* row references: the exponent symbols of the stream */
    uint8_t *sym_ctx; /* ... and their contexts */
    uint8_t *sm;      /* ... the sign and mantissa bytes not repeated */
    uint8_t *flags;   /* ... the repeat flags, 8 a byte */
    uint8_t *flag_stream;
    uint32_t *ref;    /* ... each row's distance to its reference, 0 none */
    uint32_t *mark;   /* ... the encoder: row q is candidate mark[q] & 63 of row
                       * (mark[q] >> 6) - 1 */
    uint32_t hash[1u << LLX_HASH_BITS]; /* sampled (channel, value) -> row + 1 */
    uint32_t sum[KVS_LLX_MAX_PERIOD];
    uint16_t sum16[KVS_LLX_MAX_PERIOD];
    uint16_t mean[KVS_LLX_MAX_PERIOD];     /* x 256 */
    uint16_t order[2][KVS_LLX_MAX_PERIOD]; /* channels by mean */
    uint8_t group[KVS_LLX_MAX_PERIOD];
    uint8_t sclass[KVS_LLX_MAX_PERIOD];  /* kind 3: each channel's sign class */
    uint32_t flips[KVS_LLX_MAX_PERIOD];  /* ... the encoder: its sign flips */
    llx_hist hist[2]; /* the encoder: of rows without a reference, with one */
    kvs_rans_enc_tables enc;
    kvs_rans_dec_tables dec;
};

static void scratch_free(kvs_llx_scratch *w)
{
    if (w == NULL) return;
    free(w->exp);
    free(w->ctx);
    free(w->key);
    free(w->stream);
    free(w->sym);
    free(w->sym_ctx);
    free(w->sm);
    free(w->flags);
    free(w->flag_stream);
    free(w->ref);
    free(w->mark);
    free(w);
}

/* Scratches of KVS_LLX_KEPT_K elements kept for the next call, as the
 * stage keeps its zstd contexts: allocating its 450 KiB afresh (mapped and
 * faulted in) cost a third of coding a block (the row references' arrays,
 * about 490 KiB more, are only touched when encoding at level 2 and when
 * decoding records of kind 2; kind 3 decodes its mantissas into sm, with
 * AVX-512 and rows of a multiple of 8 only the rows' tails). Four slots: a
 * decoder of two blocks at once takes two, and a processor's two workers
 * split an object's blocks. A call takes a kept one or makes its own, and
 * keeps it afterwards if a slot is free; the kept ones are reachable from
 * here until the process ends. */
#define KVS_LLX_KEPT_K 65536u
#define KVS_LLX_KEPT 4
static _Atomic(kvs_llx_scratch *) scratch_kept[KVS_LLX_KEPT];

kvs_llx_scratch *kvs_llx_scratch_take(size_t max_k)
{
    if (max_k <= KVS_LLX_KEPT_K) {
        for (int s = 0; s < KVS_LLX_KEPT; s++) {
            kvs_llx_scratch *w = atomic_exchange(&scratch_kept[s], NULL);
            if (w) return w;
        }
        max_k = KVS_LLX_KEPT_K;
    }
    kvs_llx_scratch *w = calloc(1, sizeof *w);
    if (w == NULL) return NULL;
    w->max_k = max_k;
    /* kind 3 codes up to max_k / 4 + KVS_LLX_MAX_PERIOD nibbles after the
     * exponents (sign_nibbles) */
    size_t max_sym = max_k + max_k / 4 + KVS_LLX_MAX_PERIOD;
    w->exp = malloc(max_sym);
    w->ctx = malloc(max_sym);
    w->key = malloc(max_k * sizeof w->key[0]);
    w->stream = malloc(kvs_rans_bound(max_sym));
    w->sym = malloc(max_k);
    w->sym_ctx = malloc(max_k);
    w->sm = malloc(max_k);
    w->flags = malloc(max_k / 8 + 4); /* encode_refs ORs 3 bytes at a time */
    w->flag_stream = malloc(kvs_rans_bound(max_k / 8 + 1));
    w->ref = malloc((max_k / 2 + 1) * sizeof w->ref[0]); /* rows of period >= 2 */
    w->mark = malloc((max_k / 2 + 2) * sizeof w->mark[0]);
    if (w->exp == NULL || w->ctx == NULL || w->key == NULL || w->stream == NULL || w->sym == NULL ||
        w->sym_ctx == NULL || w->sm == NULL || w->flags == NULL || w->flag_stream == NULL ||
        w->ref == NULL || w->mark == NULL) {
        scratch_free(w);
        return NULL;
    }
    return w;
}

void kvs_llx_scratch_give(kvs_llx_scratch *w)
{
    if (w == NULL) return;
    if (w->max_k == KVS_LLX_KEPT_K)
        for (int s = 0; s < KVS_LLX_KEPT; s++) {
            kvs_llx_scratch *none = NULL;
            if (atomic_compare_exchange_strong(&scratch_kept[s], &none, w)) return;
        }
    scratch_free(w);
}

#if KVS_HAVE_X86
/* The rebuild of rows with references and the encoder's split of them:
 * AVX-512 VBMI2 where the CPU has it and the rANS coder uses its AVX-512
 * kernels (the same set; KVSERDE_ISA and kvs_rans_set_isa choose for
 * both). */
static int rows_simd(void)
{
    return (kvs_cpu_features() & KVS_CPU_AVX512VBMI2) && kvs_rans_avx512_in_use();
}

/* Else AVX2 where the rANS coder uses its AVX2 or AVX-512 kernels. */
static int rows_avx2(void)
{
    return kvs_rans_isa() >= KVS_RANS_AVX2;
}
#endif

/* src (k u16) -> exponents and sign+mantissa bytes. */
static void split_fields(const uint8_t *src, size_t k, uint8_t *exp, uint8_t *sm)
{
    size_t i = 0;
#if KVS_HAVE_X86
    if (kvs_rans_avx512_in_use()) i = kvs_llx_split_avx512(src, k, exp, sm);
#endif
#ifdef __SSE2__
    const __m128i lo8 = _mm_set1_epi16(0x00FF), m7f = _mm_set1_epi16(0x7F),
                  m80 = _mm_set1_epi16(0x80);
    for (; i + 16 <= k; i += 16) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + 2 * i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 2 * i + 16));
        __m128i ea = _mm_and_si128(_mm_srli_epi16(a, 7), lo8);
        __m128i eb = _mm_and_si128(_mm_srli_epi16(b, 7), lo8);
        __m128i sa = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 8), m80), _mm_and_si128(a, m7f));
        __m128i sb = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(b, 8), m80), _mm_and_si128(b, m7f));
        _mm_storeu_si128((__m128i *)(exp + i), _mm_packus_epi16(ea, eb));
        _mm_storeu_si128((__m128i *)(sm + i), _mm_packus_epi16(sa, sb));
    }
#endif
    for (; i < k; i++) {
        unsigned v = (unsigned)src[2 * i] | (unsigned)src[2 * i + 1] << 8;
        exp[i] = (uint8_t)(v >> 7);
        sm[i] = (uint8_t)((v >> 8 & 0x80) | (v & 0x7F));
    }
}

/* An element from its exponent and its sign and mantissa byte. */
static inline unsigned join1(unsigned e, unsigned sm)
{
    return (sm & 0x80) << 8 | e << 7 | (sm & 0x7Fu);
}

#ifdef __SSE2__
/* join1 of 16 elements: *v0 the first 8, *v1 the next */
static inline void join16(__m128i e, __m128i s, __m128i *v0, __m128i *v1)
{
    const __m128i zero = _mm_setzero_si128(), m7f = _mm_set1_epi16(0x7F),
                  m80 = _mm_set1_epi16(0x80);
    __m128i e0 = _mm_unpacklo_epi8(e, zero), e1 = _mm_unpackhi_epi8(e, zero);
    __m128i s0 = _mm_unpacklo_epi8(s, zero), s1 = _mm_unpackhi_epi8(s, zero);
    *v0 = _mm_or_si128(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(s0, m80), 8),
                                    _mm_slli_epi16(e0, 7)),
                       _mm_and_si128(s0, m7f));
    *v1 = _mm_or_si128(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(s1, m80), 8),
                                    _mm_slli_epi16(e1, 7)),
                       _mm_and_si128(s1, m7f));
}
#endif

static void join_fields(const uint8_t *exp, const uint8_t *sm, size_t k, uint8_t *dst)
{
    size_t i = 0;
#if KVS_HAVE_X86
    if (kvs_rans_avx512_in_use()) i = kvs_llx_join_avx512(exp, sm, sm, 0x80, NULL, k, dst);
#endif
#ifdef __SSE2__
    for (; i + 16 <= k; i += 16) {
        __m128i v0, v1;
        join16(_mm_loadu_si128((const __m128i *)(exp + i)),
               _mm_loadu_si128((const __m128i *)(sm + i)), &v0, &v1);
        _mm_storeu_si128((__m128i *)(dst + 2 * i), v0);
        _mm_storeu_si128((__m128i *)(dst + 2 * i + 16), v1);
    }
#endif
    for (; i < k; i++) put_le16(dst + 2 * i, (uint16_t)join1(exp[i], sm[i]));
}

/* ctx[i] = group[(phase + i) mod period], row by row. */
static void fill_ctx(const uint8_t *group, uint32_t period, uint32_t phase, size_t k,
                     uint8_t *ctx)
{
    size_t i = 0, first = period - phase < k ? period - phase : k;
    memcpy(ctx, group + phase, first);
    for (i = first; i + period <= k; i += period) memcpy(ctx + i, group, period);
    if (i < k) memcpy(ctx + i, group, k - i);
}

/* Rank the block's channels by mean exponent into w->group (4 groups). */
static void rank_channels(kvs_llx_scratch *w, size_t k, uint32_t period, uint32_t phase)
{
    uint32_t *restrict sum = w->sum;
    const uint8_t *restrict exp = w->exp;
    memset(sum, 0, period * sizeof sum[0]);
    size_t i = 0;
    for (uint32_t c = phase; phase && c < period && i < k; c++, i++) sum[c] += exp[i];
    /* Whole rows: 16-bit sums of up to 256 rows at a time (255 x 256 fits),
     * added to the 32-bit ones. */
    uint16_t *restrict s16 = w->sum16;
#if KVS_HAVE_X86
    int simd = kvs_rans_avx512_in_use();
#endif
    while (i + period <= k) {
        size_t rows = (k - i) / period < 256 ? (k - i) / period : 256;
        memset(s16, 0, period * sizeof s16[0]);
        for (size_t r = 0; r < rows; r++, i += period) {
            uint32_t c = 0;
#if KVS_HAVE_X86
            if (simd) c = (uint32_t)kvs_llx_add_row_avx512(exp + i, period, s16);
#endif
#ifdef __SSE2__
            for (; c + 16 <= period; c += 16) {
                __m128i e = _mm_loadu_si128((const __m128i *)(exp + i + c));
                __m128i *q = (__m128i *)(s16 + c);
                _mm_storeu_si128(q, _mm_add_epi16(_mm_loadu_si128(q),
                                                  _mm_unpacklo_epi8(e, _mm_setzero_si128())));
                _mm_storeu_si128(q + 1, _mm_add_epi16(_mm_loadu_si128(q + 1),
                                                      _mm_unpackhi_epi8(e, _mm_setzero_si128())));
            }
#endif
            for (; c < period; c++) s16[c] = (uint16_t)(s16[c] + exp[i + c]);
        }
        for (uint32_t c = 0; c < period; c++) sum[c] += s16[c];
    }
    for (uint32_t c = 0; i < k; c++, i++) sum[c] += exp[i];
    /* Channel c holds elements i = (c - phase) mod period + j period: q of
     * them, one more when that first i is below k mod period. Without a
     * division per channel: three a channel were a tenth of the block's
     * analysis besides its histograms; the mean's in 32 bits where it fits
     * (a block of 2^16 elements: sum << 8 < 2^32). */
    uint64_t q = k / period, rm = k % period;
    for (uint32_t c = 0; c < period; c++) {
        size_t i0 = c >= phase ? c - phase : c + period - phase;
        uint64_t n = q + (i0 < rm), x = (uint64_t)w->sum[c] << 8;
        uint64_t mean = n == 0 ? 0 : x <= UINT32_MAX && n <= UINT32_MAX
                                          ? (uint32_t)x / (uint32_t)n
                                          : x / n;
        w->mean[c] = (uint16_t)mean; /* < 2^16 */
        w->order[0][c] = (uint16_t)c;
    }
    /* A stable radix sort by mean, low byte then high byte: ties stay in
     * channel order, so the ranking is the same on every machine. */
    for (int pass = 0; pass < 2; pass++) {
        const uint16_t *from = w->order[pass];
        uint16_t *to = w->order[pass ^ 1];
        uint32_t at[256] = {0};
        for (uint32_t r = 0; r < period; r++) at[w->mean[from[r]] >> (8 * pass) & 0xFF]++;
        for (uint32_t b = 0, sum_b = 0; b < 256; b++) {
            uint32_t c = at[b];
            at[b] = sum_b;
            sum_b += c;
        }
        for (uint32_t r = 0; r < period; r++) to[at[w->mean[from[r]] >> (8 * pass) & 0xFF]++] = from[r];
    }
    /* rank r in group r LLX_GROUPS / period: the ranks from
     * ceil(g period / LLX_GROUPS) on are in group g (no division a rank) */
    for (uint32_t g = 0, r = 0; g < LLX_GROUPS; g++) {
        uint64_t end = ((uint64_t)(g + 1) * period + LLX_GROUPS - 1) / LLX_GROUPS;
        for (; r < end; r++) w->group[w->order[0][r]] = (uint8_t)g;
    }
}

/* How many of the n u16 at a equal those at b (n <= KVS_LLX_MAX_PERIOD). */
static size_t count_equal(const uint8_t *a, const uint8_t *b, size_t n)
{
    size_t i = 0, m = 0;
#ifdef __SSE2__
    /* eight 16-bit counts (each at most n / 8 <= 512), summed at the end:
     * the x86-64 baseline has no popcount instruction */
    __m128i acc = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        __m128i x = _mm_loadu_si128((const __m128i *)(a + 2 * i));
        __m128i y = _mm_loadu_si128((const __m128i *)(b + 2 * i));
        acc = _mm_sub_epi16(acc, _mm_cmpeq_epi16(x, y));
    }
    uint16_t lane[8];
    _mm_storeu_si128((__m128i *)lane, acc);
    for (int l = 0; l < 8; l++) m += lane[l];
#endif
    for (; i < n; i++) m += get_le16(a + 2 * i) == get_le16(b + 2 * i);
    return m;
}

/* The set bits of v (the x86-64 baseline has no popcount instruction, and
 * GCC's builtin is then a call). */
static inline unsigned popcount64(uint64_t v)
{
    v = v - (v >> 1 & 0x5555555555555555u);
    v = (v & 0x3333333333333333u) + (v >> 2 & 0x3333333333333333u);
    v = (v + (v >> 4)) & 0x0F0F0F0F0F0F0F0Fu;
    return (unsigned)((v * 0x0101010101010101u) >> 56);
}

/* The set bits of p[0..n). */
static size_t bits_set(const uint8_t *p, size_t n)
{
    size_t m = 0, i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, p + i, 8);
        m += popcount64(v);
    }
    for (; i < n; i++)
        for (unsigned v = p[i]; v; v &= v - 1) m++;
    return m;
}

/* Row r's candidates (find_refs) by the scalar finder: the row before,
 * then each row two or more of the ns samples at at_c found, in the order
 * of its first sample; then the samples' slots point to row r. Into cand,
 * returns their count. len: the row's elements (the last row may be short). */
static uint32_t ref_candidates(kvs_llx_scratch *w, const uint8_t *row, size_t len, uint32_t ns,
                               const uint32_t *at_c, size_t r, size_t rows, uint32_t *cand)
{
    uint32_t none = (uint32_t)rows; /* mark[rows]: where an empty hash slot points */
    uint32_t all[LLX_SAMPLES + 1], votes[LLX_SAMPLES + 1], slot[LLX_SAMPLES];
    uint32_t stamp = (uint32_t)(r + 1) << 6, nc = 0;
    if (r) all[nc] = (uint32_t)(r - 1), votes[nc] = 2, w->mark[r - 1] = stamp | nc++;
    /* without branches on the data: a hit is a coin toss */
    for (uint32_t j = 0; j < ns; j++) {
        uint32_t c = at_c[j] < len ? at_c[j] : 0;
        uint32_t key = get_le16(row + 2 * c) | j << 16;
        slot[j] = (key * KVS_LLX_REF_HASH_MUL) >> (32 - LLX_HASH_BITS);
        uint32_t at = w->hash[slot[j]], q = at ? at - 1 : none;
        uint32_t *mk = &w->mark[q], m = *mk, fresh = (m & ~63u) != stamp;
        all[nc] = q;
        votes[nc] = 0;
        m = fresh ? stamp | nc : m;
        *mk = m;
        nc += fresh;
        votes[m & 63]++;
    }
    for (uint32_t j = 0; j < ns; j++) w->hash[slot[j]] = (uint32_t)(r + 1);
    uint32_t n = 0;
    for (uint32_t q = 0; q < nc; q++)
        if (votes[q] >= 2 && all[q] < r) cand[n++] = all[q];
    return n;
}

/* The rows of a block that starts at a row: w->ref[r] = the distance to the
 * earlier row with the most elements equal to row r's, when at least
 * max(2, period / 64) are, else 0 (a row with a few repeats still codes
 * its exponents as differences: 1.17 bits against 2.53). The candidates: the row before, and the
 * last rows that had the same value in at least two of LLX_SAMPLES sampled
 * channels (a hash of channel and value; a collision only costs a count).
 * One sampled value in common is mostly chance (a channel's values repeat
 * at random every few hundred rows), and counting every such candidate
 * was a fifth of the encoder. Returns the rows with a reference; 0 when
 * the first quarter of the rows (of at least 64) found fewer than one in
 * 16: such a block does not pay for its flags (kind 1 wins), and looking
 * further would cost as much as coding it. *repeats: the elements equal to
 * the one above them in their row's reference (kind 2's set flags). */
static size_t find_refs(kvs_llx_scratch *w, const uint8_t *src, size_t k, uint32_t period,
                        size_t *repeats)
{
    size_t rows = (k + period - 1) / period, nref = 0;
    uint32_t ns = period < LLX_SAMPLES ? period : LLX_SAMPLES, at_c[LLX_SAMPLES];
    for (uint32_t j = 0; j < ns; j++) at_c[j] = (uint32_t)((uint64_t)j * period / ns);
    size_t need = period / 64 > 2 ? period / 64 : 2;
#if KVS_HAVE_X86
    /* the SIMD finders take whole rows of all 32 samples, and rows + 1
     * as 16-bit words */
    int whole = ns == LLX_SAMPLES && rows < 0xFFFF;
    int simd = whole && kvs_rans_avx512_in_use(), avx2 = whole && !simd && rows_avx2();
    int count_simd = kvs_rans_avx512_in_use();
#endif
    memset(w->hash, 0, sizeof w->hash);
    memset(w->mark, 0, (rows + 1) * sizeof w->mark[0]);
    *repeats = 0;
    for (size_t r = 0; r < rows; r++) {
        if (r == rows / 4 && rows >= 64 && nref * 16 < r) return 0;
        const uint8_t *row = src + 2 * r * period;
        size_t len = r + 1 < rows ? period : k - r * period;
        uint32_t cand[LLX_SAMPLES + 1], nc;
#if KVS_HAVE_X86
        if (simd && len == period)
            nc = kvs_llx_ref_candidates_avx512(row, at_c, w->hash, LLX_HASH_BITS, (uint32_t)r,
                                               cand);
        else if (avx2 && len == period)
            nc = kvs_llx_ref_candidates_avx2(row, at_c, w->hash, LLX_HASH_BITS, (uint32_t)r,
                                             cand);
        else
#endif
            nc = ref_candidates(w, row, len, ns, at_c, r, rows, cand);
        size_t best = 0, best_d = 0;
#if KVS_HAVE_X86
        if (count_simd) {
            uint32_t q = kvs_llx_best_candidate_avx512(row, src, period, cand, nc, len, &best);
            best_d = nc ? r - cand[q] : 0;
        } else
#endif
            for (uint32_t q = 0; q < nc; q++) {
                size_t m = count_equal(row, src + 2 * (size_t)cand[q] * period, len);
                if (m > best) best = m, best_d = r - cand[q];
            }
        w->ref[r] = best >= need && best_d <= LLX_MAX_DISTANCE ? (uint32_t)best_d : 0;
        nref += w->ref[r] != 0;
        *repeats += w->ref[r] ? best : 0;
    }
    return nref;
}

/* Element i's histogram key: its group (ctx NULL: 0) << 8 | its exponent. */
static inline unsigned key_at(const uint8_t *exp, const uint8_t *ctx, size_t i)
{
    return (ctx ? (unsigned)ctx[i] << 8 : 0u) | exp[i];
}

/* key[i] = ctx[i] << 8 | exp[i] (ctx NULL: all group 0), the histograms'
 * indices: made for the whole block before any is counted, as a store of
 * 16 read back at once as 16-bit loads does not forward (that was slower
 * than the byte loads it replaced). */
static void hist_keys(const uint8_t *restrict exp, const uint8_t *restrict ctx, size_t k,
                      uint16_t *restrict key)
{
    size_t i = 0;
#if KVS_HAVE_X86
    if (kvs_rans_avx512_in_use()) i = kvs_llx_keys_avx512(exp, ctx, k, key);
#endif
#ifdef __SSE2__
    for (; i + 16 <= k; i += 16) {
        __m128i e = _mm_loadu_si128((const __m128i *)(exp + i));
        __m128i c = ctx ? _mm_loadu_si128((const __m128i *)(ctx + i)) : _mm_setzero_si128();
        _mm_storeu_si128((__m128i *)(key + i), _mm_unpacklo_epi8(e, c));
        _mm_storeu_si128((__m128i *)(key + i + 8), _mm_unpackhi_epi8(e, c));
    }
#endif
    for (; i < k; i++) key[i] = (uint16_t)key_at(exp, ctx, i);
}

/* Whether the histograms use the 16-bit ways (else the 32-bit ones). */
static int hist_short(void)
{
    return !(kvs_cpu_features() & KVS_CPU_AMD);
}

static void hist_clear(llx_hist *h)
{
    if (hist_short()) memset(h->way, 0, sizeof h->way);
    else memset(h->way32, 0, sizeof h->way32);
    memset(h->total, 0, sizeof h->total);
    h->most = 0;
}

static void hist_fold(llx_hist *h)
{
    uint32_t *t = h->total[0];
    if (!hist_short()) {
        for (unsigned s = 0; s < LLX_GROUPS * 256; s++)
            t[s] += h->way32[0][s] + h->way32[1][s] + h->way32[2][s] + h->way32[3][s];
        memset(h->way32, 0, sizeof h->way32);
        return;
    }
    for (unsigned s = 0; s < LLX_GROUPS * 256; s++) {
        uint32_t c = 0;
        for (unsigned j = 0; j < HIST_WAYS; j++) c += h->way[j][s];
        t[s] += c;
    }
    memset(h->way, 0, sizeof h->way);
    h->most = 0;
}

/* Count the n keys in the 32-bit ways (n < 2^32: no way overflows). */
static void hist_add32(llx_hist *h, const uint16_t *restrict key, size_t n)
{
    uint32_t *w0 = h->way32[0], *w1 = h->way32[1], *w2 = h->way32[2], *w3 = h->way32[3];
    size_t j = 0;
    for (; j + HIST_WAYS32 <= n; j += HIST_WAYS32) {
        w0[key[j]]++;
        w1[key[j + 1]]++;
        w2[key[j + 2]]++;
        w3[key[j + 3]]++;
    }
    for (; j < n; j++) w0[key[j]]++;
}

/* Count the n keys: in the 16-bit ways, key i in way i mod 8, so a call
 * adds at most ceil(n / 8) to one counter. */
static void hist_add(llx_hist *h, const uint16_t *restrict key, size_t n)
{
    if (!hist_short()) {
        hist_add32(h, key, n);
        return;
    }
    for (size_t i = 0; i < n;) {
        size_t piece = n - i < (size_t)HIST_WAYS * 0x8000 ? n - i : (size_t)HIST_WAYS * 0x8000;
        uint32_t adds = (uint32_t)((piece + HIST_WAYS - 1) / HIST_WAYS);
        if (h->most + adds > 0xFFFF) hist_fold(h);
        h->most += adds;
        const uint16_t *k = key + i;
        uint16_t *w0 = h->way[0], *w1 = h->way[1], *w2 = h->way[2], *w3 = h->way[3];
        uint16_t *w4 = h->way[4], *w5 = h->way[5], *w6 = h->way[6], *w7 = h->way[7];
        size_t j = 0;
        for (; j + HIST_WAYS <= piece; j += HIST_WAYS) {
            w0[k[j]]++;
            w1[k[j + 1]]++;
            w2[k[j + 2]]++;
            w3[k[j + 3]]++;
            w4[k[j + 4]]++;
            w5[k[j + 5]]++;
            w6[k[j + 6]]++;
            w7[k[j + 7]]++;
        }
        for (; j < piece; j++) h->way[j % HIST_WAYS][k[j]]++;
        i += piece;
    }
}

/* The counts so far. */
static void hist_total(llx_hist *h, uint32_t out[LLX_GROUPS][256])
{
    hist_fold(h);
    memcpy(out, h->total, sizeof h->total);
}

/* The exponents' histograms count every HIST_SAMPLE-th unit of a block (a
 * row from channel 0, the first one from the block's phase; without
 * channels, runs of HIST_RUN elements) and scale the counts by HIST_SAMPLE:
 * the counts only set the tables and the estimates, and counting every
 * key was a sixth to a quarter of the encoder (docs/performance.md). The
 * other units add only the keys the sample lacks, with a count of 1 each,
 * so every symbol the block codes has a code. Blocks of fewer units, or of
 * rows shorter than HIST_MIN_ROW, are counted whole. */
#define HIST_SAMPLE 4
#define HIST_RUN 256
#define HIST_MIN_UNITS 16
#define HIST_MIN_ROW 64

/* bm's bit of every key h counts (key g << 8 | s: bit key % 8 of byte key /
 * 8). */
static void present_bits(uint32_t h[LLX_GROUPS][256], uint8_t bm[128])
{
    const uint32_t *t = h[0];
    for (unsigned j = 0; j < 128; j++) {
        unsigned b = 0;
        for (unsigned q = 0; q < 8; q++) b |= (unsigned)(t[8 * j + q] != 0) << q;
        bm[j] = (uint8_t)b;
    }
}

/* The first i in [0, k) whose key ctx[i] << 8 | exp[i] (ctx NULL: exp[i])
 * h does not count, or k; bm holds h's keys as bits for the SIMD searches,
 * the portable loop reads h. */
static size_t first_absent(const uint8_t *exp, const uint8_t *ctx, size_t k,
                           const uint8_t bm[128], uint32_t h[LLX_GROUPS][256])
{
    size_t i = 0;
#if KVS_HAVE_X86
    if (kvs_rans_avx512_in_use()) {
        i = kvs_llx_first_absent_avx512(exp, ctx, k, bm);
        if (i < (k & ~(size_t)63)) return i;
    } else if (rows_avx2()) {
        i = kvs_llx_first_absent_avx2(exp, ctx, k, bm);
        if (i < (k & ~(size_t)31)) return i;
    }
#endif
    /* eight keys a test, without a branch or a flag per key: a count less
     * 1 has its top bit set only where the count is 0 (counts < 2^31);
     * without contexts a loop of its own; the eight with an absent key are
     * then searched one by one */
    const uint32_t *t = h[0];
    for (; i + 8 <= k; i += 8) {
        uint32_t none = 0;
        if (ctx)
#pragma GCC unroll 8
            for (size_t q = i; q < i + 8; q++) none |= t[(unsigned)ctx[q] << 8 | exp[q]] - 1;
        else
#pragma GCC unroll 8
            for (size_t q = i; q < i + 8; q++) none |= t[exp[q]] - 1;
        if (none >> 31) break;
    }
    for (; i < k; i++)
        if (t[key_at(exp, ctx, i)] == 0) return i;
    return k;
}

/* The len elements of a unit outside the sample: each key that h (its
 * bits bm) lacks is counted once. */
static void add_absent(const uint8_t *exp, const uint8_t *ctx, size_t len, uint8_t bm[128],
                       uint32_t h[LLX_GROUPS][256])
{
    size_t i = 0;
    while ((i += first_absent(exp + i, ctx ? ctx + i : NULL, len - i, bm, h)) < len) {
        unsigned key = key_at(exp, ctx, i);
        h[key >> 8][key & 0xFF] = 1;
        bm[key >> 3] |= (uint8_t)(1u << (key & 7));
        i++;
    }
}

/* The block's exponent histograms per group (w->ctx when use_map, else one
 * group): into h of the rows without a reference, and with row references
 * (nref) into hr of the rows with one. */
static void exponent_hists(kvs_llx_scratch *w, size_t k, uint32_t period, uint32_t phase,
                           int use_map, size_t nref, uint32_t h[LLX_GROUPS][256],
                           uint32_t hr[LLX_GROUPS][256])
{
    const uint8_t *exp = w->exp, *ctx = use_map ? w->ctx : NULL;
    size_t unit = use_map ? period : HIST_RUN;
    size_t first = use_map && phase ? period - phase : unit;
    if (first > k) first = k;
    size_t units = 1 + (k - first + unit - 1) / unit;
    unsigned stride =
        (!use_map || period >= HIST_MIN_ROW) && units >= HIST_MIN_UNITS ? HIST_SAMPLE : 1;
    hist_clear(&w->hist[0]);
    if (nref) hist_clear(&w->hist[1]); /* nref: phase 0, unit u is row u */
    if (stride == 1) hist_keys(exp, ctx, k, w->key);
    if (stride == 1 && !nref) {
        hist_add(&w->hist[0], w->key, k);
    } else {
        for (size_t u = 0, i0 = 0, len = first; i0 < k;
             u++, i0 += len, len = k - i0 < unit ? k - i0 : unit) {
            if (u % stride) continue;
            if (stride > 1) hist_keys(exp + i0, ctx ? ctx + i0 : NULL, len, w->key + i0);
            hist_add(&w->hist[nref && w->ref[u] != 0], w->key + i0, len);
        }
    }
    hist_total(&w->hist[0], h);
    if (nref) hist_total(&w->hist[1], hr);
    if (stride == 1) return;
    uint8_t bm[2][128];
    for (int c = 0; c < (nref ? 2 : 1); c++) {
        uint32_t(*t)[256] = c ? hr : h;
        for (int g = 0; g < LLX_GROUPS; g++)
            for (int s = 0; s < 256; s++) t[g][s] *= stride;
        present_bits(t, bm[c]);
    }
    /* the units outside the sample: runs of them between the sampled ones
     * (with references, within runs of rows of one kind) */
    for (size_t r = 0, end; r < units; r = end) {
        int c = nref && w->ref[r] != 0;
        for (end = r + 1; end < units && nref && (w->ref[end] != 0) == c; end++) continue;
        if (!nref) end = units;
        for (size_t u = r; u < end;) {
            if (u % stride == 0) {
                u++;
                continue;
            }
            size_t u1 = (u / stride + 1) * stride < end ? (u / stride + 1) * stride : end;
            size_t i0 = first + (u - 1) * unit, i1 = first + (u1 - 1) * unit;
            if (i1 > k) i1 = k;
            add_absent(exp + i0, ctx ? ctx + i0 : NULL, i1 - i0, bm[c], c ? hr : h);
            u = u1;
        }
    }
}

/* The cost of 1, 2 and 4 groups of the histograms h (2: the ranking's
 * halves), tables and map included, in bits; t[g] the tables of 2^g groups,
 * *choice the cheapest g. */
static double choose_groups(uint32_t h[LLX_GROUPS][256], int use_map, size_t map_bytes,
                            kvs_rans_freqs t[3][LLX_GROUPS], int *choice)
{
    double best = 0;
    *choice = 0;
    for (int g = 0; g < (use_map ? 3 : 1); g++) {
        unsigned ng = 1u << g, per = LLX_GROUPS / ng;
        double bits = ng > 1 ? 8.0 * (double)map_bytes : 0;
        for (unsigned j = 0; j < ng; j++) {
            /* the group's fine histograms summed a histogram at a time (a
             * symbol at a time, the compiler kept it scalar: 2.7 % of the
             * encoder) */
            uint32_t m[256];
            memcpy(m, h[j * per], sizeof m);
            for (unsigned q = j * per + 1; q < (j + 1) * per; q++)
                for (int s = 0; s < 256; s++) m[s] += h[q][s];
            bits += kvs_rans_normalize_estimate(m, &t[g][j]);
        }
        if (g == 0 || bits < best) best = bits, *choice = g;
    }
    return best;
}

/* A 2-bit value per channel, v[c] / per (the group map, the sign classes). */
static void write_map(const uint8_t *v, uint32_t period, unsigned per, uint8_t *map)
{
    memset(map, 0, (period + 3) / 4);
    for (uint32_t c = 0; c < period; c++)
        map[c / 4] |= (uint8_t)((v[c] / per) << (2 * (c % 4)));
}

/* The block as a kind 2 record (row references found, repeats the elements
 * they repeat; w->ctx each element's group; h the exponents' histograms per
 * group of the rows without a reference; k1 kind 1's estimate), when its
 * estimate is below k1
 * and it comes out smaller than raw: returns its bytes, else 0. rec + 1
 * holds the sign and mantissa bytes (kind 1's), read before rec is
 * written. */
static size_t encode_refs(kvs_llx_scratch *w, const uint8_t *src, size_t k, uint32_t period,
                          size_t nref, size_t repeats, uint32_t h[LLX_GROUPS][256], double k1,
                          const kvs_rans_warm *warm, uint8_t *rec)
{
    size_t rows = (k + period - 1) / period, u = k - repeats, nfl = 0;
    size_t map_bytes = (period + 3) / 4;
    kvs_rans_freqs t2[3][LLX_GROUPS], td, tf;
    int c2;
    /* The estimate is these two, the differences' table and the flags'
     * bits; both of those are >= 0, and adding one to a double never
     * lowers it, so without them it is a floor of the estimate: when even
     * the floor is not below k1 the block cannot take kind 2, and the pass
     * that counts them is skipped (the choice, and so the bytes, as when
     * they were counted). */
    double groups_bits = choose_groups(h, 1, map_bytes, t2, &c2);
    double fixed_bits = 8.0 * (11 + 4 * KVS_RANS_LANES + (double)u + (double)(rows + 7) / 8 +
                               2.0 * (double)nref);
    if (groups_bits + fixed_bits >= k1) return 0;
    uint32_t hd[256], hf[256], hd16[16][256];
    memset(hd16, 0, sizeof hd16);
    const uint8_t *exp = w->exp, *ctx = w->ctx, *sm_all = rec + 1;
    uint8_t *fl = w->flags;
    memset(fl, 0, k / 8 + 4);
    /* First the estimate's counts (the flags, the differences'
     * histogram), and the symbols only when the estimate wins: most blocks at
     * level 3 find a few references and then take kind 3. */
#if KVS_HAVE_X86
    int simd = rows_simd();
#endif
    size_t nnz = 0; /* the SIMD pass: nonzero differences kept in w->sym */
    for (size_t r = 0; r < rows; r++) {
        size_t i0 = r * period, len = r + 1 < rows ? period : k - i0;
        if (w->ref[r] == 0) continue;
        size_t d = (size_t)w->ref[r] * period, c = 0, same = 0;
#if KVS_HAVE_X86
        if (simd) {
            size_t nnz0 = nnz;
            c = kvs_llx_row_diffs_avx512vbmi2(src + 2 * i0, src + 2 * (i0 - d), exp + i0,
                                              exp + i0 - d, len, fl, nfl, w->sym, &nnz, &same);
            hd16[0][0] += (uint32_t)(c - (nnz - nnz0)); /* its zero differences */
            nfl += c;
        }
#endif
#ifdef __SSE2__
        /* 16 flags a step from 16-bit compares; an element that repeats
         * has difference 0, so every difference is counted and hd[0] is
         * mended after; a histogram per lane, as the differences are
         * mostly 0 and one counter would chain its increments */
        for (; c + 16 <= len; c += 16, nfl += 16) {
            const uint8_t *a = src + 2 * (i0 + c), *b = a - 2 * d;
            __m128i e0 = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)a),
                                         _mm_loadu_si128((const __m128i *)b));
            __m128i e1 = _mm_cmpeq_epi16(_mm_loadu_si128((const __m128i *)(a + 16)),
                                         _mm_loadu_si128((const __m128i *)(b + 16)));
            uint32_t m = (uint32_t)_mm_movemask_epi8(_mm_packs_epi16(e0, e1)) << (nfl & 7);
            fl[nfl >> 3] = (uint8_t)(fl[nfl >> 3] | m);
            fl[(nfl >> 3) + 1] = (uint8_t)(fl[(nfl >> 3) + 1] | m >> 8);
            fl[(nfl >> 3) + 2] = (uint8_t)(fl[(nfl >> 3) + 2] | m >> 16);
            same += popcount64(m);
            uint8_t df[16];
            _mm_storeu_si128((__m128i *)df,
                             _mm_sub_epi8(_mm_loadu_si128((const __m128i *)(exp + i0 + c)),
                                          _mm_loadu_si128((const __m128i *)(exp + i0 + c - d))));
            /* unrolled: each count then one add to a fixed offset */
#pragma GCC unroll 16
            for (unsigned t = 0; t < 16; t++) hd16[t][df[t]]++;
        }
#endif
        for (; c < len; c++, nfl++) {
            size_t i = i0 + c;
            unsigned eq = get_le16(src + 2 * i) == get_le16(src + 2 * (i - d));
            hd16[0][(uint8_t)(exp[i] - exp[i - d])]++;
            fl[nfl >> 3] = (uint8_t)(fl[nfl >> 3] | eq << (nfl & 7));
            same += eq;
        }
        hd16[0][0] -= (uint32_t)same;
    }
    size_t at = 0;
    for (; at + 16 <= nnz; at += 16)
#pragma GCC unroll 16 /* each count then one add to a fixed offset */
        for (unsigned t = 0; t < 16; t++) hd16[t][w->sym[at + t]]++;
    for (; at < nnz; at++) hd16[at & 15][w->sym[at]]++;
    memcpy(hd, hd16[0], sizeof hd); /* a partial histogram at a time, as choose_groups */
    for (int t = 1; t < 16; t++)
        for (int s = 0; s < 256; s++) hd[s] += hd16[t][s];
    size_t nfb = (nfl + 7) / 8;
    /* four partial counts: the flag bytes are mostly 0 or 0xFF, and one
     * counter would chain its increments */
    uint32_t hf4[4][256];
    memset(hf4, 0, sizeof hf4);
    size_t b = 0;
    for (; b + 4 <= nfb; b += 4)
        hf4[0][fl[b]]++, hf4[1][fl[b + 1]]++, hf4[2][fl[b + 2]]++, hf4[3][fl[b + 3]]++;
    for (; b < nfb; b++) hf4[0][fl[b]]++;
    for (int s = 0; s < 256; s++) hf[s] = hf4[0][s] + hf4[1][s] + hf4[2][s] + hf4[3][s];
    /* the flags coded (their table and states) or raw, whichever is
     * smaller: a small block's flag table costs more than it saves */
    double flag_bits = kvs_rans_normalize_estimate(hf, &tf) + 8.0 * 4 * KVS_RANS_LANES;
    int flags_coded = flag_bits < 8.0 * (double)nfb;
    double k2 = groups_bits + kvs_rans_normalize_estimate(hd, &td) +
                (flags_coded ? flag_bits : 8.0 * (double)nfb) + fixed_bits;
    if (k2 >= k1) return 0;
    u = 0;
    for (size_t r = 0, bit = 0; r < rows; r++) {
        size_t i0 = r * period, len = r + 1 < rows ? period : k - i0;
        if (w->ref[r] == 0) { /* the exponents under the groups, as kind 1 */
            memcpy(w->sym + u, exp + i0, len);
            memcpy(w->sym_ctx + u, ctx + i0, len);
            memcpy(w->sm + u, sm_all + i0, len);
            u += len;
            continue;
        }
        size_t d = (size_t)w->ref[r] * period, c = 0;
#if KVS_HAVE_X86
        if (rows_simd()) {
            size_t used = 0;
            c = kvs_llx_row_split_avx512vbmi2(exp + i0, exp + i0 - d, sm_all + i0, fl, nfb, bit,
                                              len, LLX_DIFF_CTX, w->sym + u, w->sym_ctx + u,
                                              w->sm + u, &used);
            u += used;
            bit += c;
        } else if (rows_avx2()) {
            /* its stores past what it appends stay below w->sym + u + c
             * <= w->sym + i0 + len (u <= i0), inside the buffers */
            size_t used = 0;
            c = kvs_llx_row_split_avx2(exp + i0, exp + i0 - d, sm_all + i0, fl, nfb, bit, len,
                                       LLX_DIFF_CTX, w->sym + u, w->sym_ctx + u, w->sm + u, &used);
            u += used;
            bit += c;
        }
#endif
        /* without branches: whether an element repeats is a coin toss */
        for (; c < len; c++, bit++) {
            size_t i = i0 + c;
            w->sym[u] = (uint8_t)(exp[i] - exp[i - d]);
            w->sym_ctx[u] = LLX_DIFF_CTX;
            w->sm[u] = sm_all[i];
            u += !(fl[bit >> 3] >> (bit & 7) & 1);
        }
    }
    unsigned ng = 1u << c2, per = LLX_GROUPS / ng;
    /* the encoder's five contexts: the four fine groups (each with its
     * coarse group's table) and the differences; the decoder's are the G
     * coarse groups and the differences (context G), the same codes */
    kvs_rans_freqs tabs[LLX_GROUPS + 1];
    for (unsigned q = 0; q < LLX_GROUPS; q++) tabs[q] = t2[c2][q / per];
    tabs[LLX_DIFF_CTX] = td;
    size_t cap = kvs_rans_bound(u), sym_at = 0, flag_cap = kvs_rans_bound(nfb), flag_at = 0;
    kvs_rans_enc_init(&w->enc, tabs, LLX_GROUPS + 1);
    if (kvs_rans_encode_tail(&w->enc, w->sym, w->sym_ctx, u, w->stream, cap, warm,
                             &sym_at) != KVS_OK)
        return 0; /* cannot happen: every counted symbol has a code */
    if (flags_coded) {
        kvs_rans_enc_init(&w->enc, &tf, 1);
        if (kvs_rans_encode_tail(&w->enc, fl, NULL, nfb, w->flag_stream, flag_cap, NULL,
                                 &flag_at) != KVS_OK)
            return 0;
    } else {
        flag_at = flag_cap - nfb;
        memcpy(w->flag_stream + flag_at, fl, nfb);
    }
    size_t m = cap - sym_at, mf = flag_cap - flag_at;
    size_t tables =
        kvs_rans_freqs_size(&td) + 1 + (flags_coded ? kvs_rans_freqs_size(&tf) : 0);
    for (unsigned j = 0; j < ng; j++) tables += kvs_rans_freqs_size(&t2[c2][j]);
    size_t total = 1 + 4 + u + 1 + (ng > 1 ? map_bytes : 0) + (rows + 7) / 8 + 2 * nref + tables +
                   4 + mf + m;
    if (total >= 1 + 2 * k) return 0;
    uint8_t *p = rec;
    *p++ = LLX_REFS;
    put_le32(p, (uint32_t)u), p += 4;
    memcpy(p, w->sm, u), p += u;
    *p++ = (uint8_t)ng;
    if (ng > 1) write_map(w->group, period, per, p), p += map_bytes;
    memset(p, 0, (rows + 7) / 8);
    for (size_t r = 0; r < rows; r++)
        if (w->ref[r]) p[r / 8] |= (uint8_t)(1u << (r % 8));
    p += (rows + 7) / 8;
    for (size_t r = 0; r < rows; r++)
        if (w->ref[r]) *p++ = (uint8_t)w->ref[r], *p++ = (uint8_t)(w->ref[r] >> 8);
    for (unsigned j = 0; j < ng; j++) p += kvs_rans_freqs_write(&t2[c2][j], p);
    p += kvs_rans_freqs_write(&td, p);
    *p++ = (uint8_t)flags_coded;
    if (flags_coded) p += kvs_rans_freqs_write(&tf, p);
    put_le32(p, (uint32_t)mf), p += 4;
    memcpy(p, w->flag_stream + flag_at, mf), p += mf;
    memcpy(p, w->stream + sym_at, m), p += m;
    return (size_t)(p - rec);
}

/* Kind 3's sign flips: the sign of element (r, c) XOR the sign of (r - 1,
 * c) (row 0: XOR 0), LLX_SIGN_ROWS rows of a channel to a nibble (row
 * 4j + t in bit t, a row past the block's end 0), into nib[j * period + c];
 * returns their count. sm: the k sign and mantissa bytes (bit 7 the sign). */
static size_t sign_nibbles(const uint8_t *sm, size_t k, uint32_t period, uint8_t *nib)
{
#if KVS_HAVE_X86
    if (kvs_rans_avx512_in_use()) return kvs_llx_sign_nibbles_avx512(sm, k, period, nib);
#endif
    size_t rows = (k + period - 1) / period, groups = (rows + LLX_SIGN_ROWS - 1) / LLX_SIGN_ROWS;
    memset(nib, 0, groups * period);
    for (size_t r = 0; r < rows; r++) {
        size_t i0 = r * period, n = k - i0 < period ? k - i0 : period;
        unsigned t = (unsigned)(r % LLX_SIGN_ROWS);
        uint8_t *restrict q = nib + r / LLX_SIGN_ROWS * period, bit = (uint8_t)(1u << t);
        const uint8_t *restrict row = sm + i0, *restrict up = r ? row - period : NULL;
        size_t c = 0;
#ifdef __SSE2__
        /* the sign bit by a signed byte compare (SSE2 has no byte shift) */
        const __m128i zero = _mm_setzero_si128(), vb = _mm_set1_epi8((char)bit);
        for (; c + 16 <= n; c += 16) {
            __m128i x = _mm_loadu_si128((const __m128i *)(row + c));
            if (up) x = _mm_xor_si128(x, _mm_loadu_si128((const __m128i *)(up + c)));
            __m128i *qc = (__m128i *)(q + c);
            _mm_storeu_si128(qc, _mm_or_si128(_mm_loadu_si128(qc),
                                              _mm_and_si128(_mm_cmplt_epi8(x, zero), vb)));
        }
#endif
        for (; c < n; c++) q[c] = (uint8_t)(q[c] | ((row[c] ^ (up ? up[c] : 0)) & 0x80 ? bit : 0));
    }
    return groups * period;
}

/* The histograms of the n sign nibbles (rows of period) per sign class
 * (w->sclass), into h. */
static void nibble_hists(kvs_llx_scratch *w, const uint8_t *nib, size_t n, uint32_t period,
                         uint32_t h[LLX_SIGN_CLASSES][16])
{
    memset(h, 0, LLX_SIGN_CLASSES * sizeof h[0]);
#if KVS_HAVE_X86
    if (kvs_rans_avx512_in_use()) {
        kvs_llx_nibble_hists_avx512(nib, n, period, w->sclass, h);
        return;
    }
#endif
    /* First every nibble's key, class x 16 | nibble (into w->key, its n <=
     * max_k / 4 + KVS_LLX_MAX_PERIOD bytes within the 2 max_k there), then
     * the counts into 16 partial histograms (nibble i in i mod 16): most
     * nibbles are 0 in class 0, and one counter would chain its increments
     * (that pass was a tenth of level 3's encoder); keys stored 16 at a
     * time and read back at once do not forward, which made the counting
     * twice as slow. */
    uint32_t h16[16][LLX_SIGN_CLASSES * 16];
    memset(h16, 0, sizeof h16);
    uint8_t cls[KVS_LLX_MAX_PERIOD]; /* the class x 16 of each channel */
    uint8_t *restrict kb = (uint8_t *)w->key;
    for (uint32_t c = 0; c < period; c++) cls[c] = (uint8_t)(w->sclass[c] << 4);
    for (size_t j = 0; j < n; j += period) {
        uint32_t c = 0;
#ifdef __SSE2__
        for (; c + 16 <= period; c += 16)
            _mm_storeu_si128((__m128i *)(kb + j + c),
                             _mm_or_si128(_mm_loadu_si128((const __m128i *)(cls + c)),
                                          _mm_loadu_si128((const __m128i *)(nib + j + c))));
#endif
        for (; c < period; c++) kb[j + c] = (uint8_t)(cls[c] | nib[j + c]);
    }
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
#pragma GCC unroll 16 /* each count then one add to a fixed offset */
        for (unsigned t = 0; t < 16; t++) h16[t][kb[i + t]]++;
    for (; i < n; i++) h16[i & 15][kb[i]]++;
    for (unsigned q = 0; q < LLX_SIGN_CLASSES; q++)
        for (unsigned v = 0; v < 16; v++)
            for (unsigned t = 0; t < 16; t++) h[q][v] += h16[t][q << 4 | v];
}

/* Kind 3's sign classes (w->sclass, by how often a channel's sign flips:
 * at most 1 row in 10, 1 in 4, 2 in 5, more), the contexts of the n
 * nibbles at w->exp + k (after the exponents' in w->ctx) and their tables
 * ts: returns their cost in bits, the class map and tables included. */
static double sign_plan(kvs_llx_scratch *w, size_t k, uint32_t period, size_t n,
                        kvs_rans_freqs ts[LLX_SIGN_CLASSES])
{
    const uint8_t *restrict nib = w->exp + k;
    uint32_t *restrict flips = w->flips;
    memset(flips, 0, period * sizeof flips[0]);
    /* Each channel's flips, the set bits of its nibbles: 16 channels at a
     * time, summed in bytes over up to 63 nibbles (4 bits each), then
     * added to the u32 counts. */
    for (size_t j0 = 0; j0 < n; j0 += 63 * (size_t)period) {
        size_t j1 = n - j0 < 63 * (size_t)period ? n : j0 + 63 * (size_t)period;
        uint32_t c = 0;
#ifdef __SSE2__
        const __m128i m55 = _mm_set1_epi8(0x55), m33 = _mm_set1_epi8(0x33),
                      zero = _mm_setzero_si128();
        for (; c + 16 <= period; c += 16) {
            __m128i acc = zero;
            for (size_t j = j0; j < j1; j += period) {
                __m128i x = _mm_loadu_si128((const __m128i *)(nib + j + c));
                x = _mm_sub_epi8(x, _mm_and_si128(_mm_srli_epi16(x, 1), m55));
                x = _mm_add_epi8(_mm_and_si128(x, m33), _mm_and_si128(_mm_srli_epi16(x, 2), m33));
                acc = _mm_add_epi8(acc, x);
            }
            uint8_t a[16];
            _mm_storeu_si128((__m128i *)a, acc);
            for (unsigned t = 0; t < 16; t++) flips[c + t] += a[t];
        }
#endif
        for (; c < period; c++)
            for (size_t j = j0; j < j1; j += period) flips[c] += popcount64(nib[j + c]);
    }
    uint64_t rows = (k + period - 1) / period;
    for (uint32_t c = 0; c < period; c++) {
        uint64_t f = flips[c];
        w->sclass[c] =
            (uint8_t)(10 * f <= rows ? 0 : 4 * f <= rows ? 1 : 5 * f <= 2 * rows ? 2 : 3);
    }
    uint32_t hn[LLX_SIGN_CLASSES][16], h[LLX_SIGN_CLASSES][256];
    nibble_hists(w, nib, n, period, hn);
    memset(h, 0, sizeof h);
    for (unsigned q = 0; q < LLX_SIGN_CLASSES; q++) memcpy(h[q], hn[q], sizeof hn[q]);
    /* the contexts repeat every period */
    uint8_t *ctx = w->ctx + k;
    for (uint32_t c = 0; c < period && n; c++) ctx[c] = (uint8_t)(LLX_SIGN_CTX + w->sclass[c]);
    for (size_t j = period; j < n; j += period) memcpy(ctx + j, ctx, period);
    double bits = 8.0 * (double)((period + 3) / 4);
    for (unsigned q = 0; q < LLX_SIGN_CLASSES; q++)
        bits += kvs_rans_normalize_estimate(h[q], &ts[q]);
    return bits;
}

/* The mantissas (bits 0-6) of sm[0..k), 7 bits each, element i in bits
 * 7i..7i+6 of out (ceil(7k / 8) bytes, and out must hold one more when k
 * >= 8); returns the bytes. out may be sm: each 8 elements are read before
 * their bytes are written, below the next 8. */
static size_t pack_mantissas(const uint8_t *sm, size_t k, uint8_t *out)
{
    size_t i = 0;
#if KVS_HAVE_X86
    if (kvs_rans_avx512_in_use()) i = kvs_llx_pack7_avx512(sm, k, out);
#endif
    size_t o = i / 8 * 7;
    /* 8 at a time in a u64: 7-bit fields of bytes -> 14 bits of u16s -> 28
     * bits of u32s -> 56 bits */
    for (; i + 8 <= k; i += 8, o += 7) {
        uint64_t x = get_le64(sm + i) & 0x7F7F7F7F7F7F7F7Fu;
        x = (x & 0x007F007F007F007Fu) | (x & 0x7F007F007F007F00u) >> 1;
        x = (x & 0x00003FFF00003FFFu) | (x & 0x3FFF00003FFF0000u) >> 2;
        x = (x & 0x000000000FFFFFFFu) | (x & 0x0FFFFFFF00000000u) >> 4;
        put_le64(out + o, x); /* its 8th byte (0) is the next group's first */
    }
    for (; i < k; i += 8) {
        size_t n = k - i < 8 ? k - i : 8, nb = (7 * n + 7) / 8;
        uint64_t v = 0;
        for (size_t j = 0; j < n; j++) v |= (uint64_t)(sm[i + j] & 0x7F) << (7 * j);
        for (size_t j = 0; j < nb; j++) out[o + j] = (uint8_t)(v >> (8 * j));
        o += nb;
    }
    return o;
}

/* The block as a kind 3 record (signs coded): w->exp holds the k exponents
 * and then the n sign nibbles, w->ctx their contexts (the fine groups, then
 * the sign classes'); rec + 1 the sign and mantissa bytes (kind 1's, packed
 * in place); coarse the ng groups' tables, ts the sign tables. Returns its
 * bytes, or 0 (rec untouched) when it would not be smaller than raw. */
static size_t encode_signs(kvs_llx_scratch *w, size_t k, uint32_t period, size_t n,
                           const kvs_rans_freqs *coarse, unsigned ng,
                           const kvs_rans_freqs ts[LLX_SIGN_CLASSES], const kvs_rans_warm *warm,
                           uint8_t *rec)
{
    unsigned per = LLX_GROUPS / ng;
    kvs_rans_freqs tabs[LLX_GROUPS + LLX_SIGN_CLASSES];
    for (unsigned q = 0; q < LLX_GROUPS; q++) tabs[q] = coarse[q / per];
    for (unsigned q = 0; q < LLX_SIGN_CLASSES; q++) tabs[LLX_SIGN_CTX + q] = ts[q];
    kvs_rans_enc_init(&w->enc, tabs, LLX_GROUPS + LLX_SIGN_CLASSES);
    size_t cap = kvs_rans_bound(k + n), at = 0;
    if (kvs_rans_encode_tail(&w->enc, w->exp, w->ctx, k + n, w->stream, cap, warm, &at) != KVS_OK)
        return 0; /* cannot happen: every counted symbol has a code */
    size_t m = cap - at;
    size_t map_bytes = (period + 3) / 4, tables = 0;
    for (unsigned j = 0; j < ng; j++) tables += kvs_rans_freqs_size(&coarse[j]);
    for (unsigned q = 0; q < LLX_SIGN_CLASSES; q++) tables += kvs_rans_freqs_size(&ts[q]);
    size_t total = 1 + (7 * k + 7) / 8 + 1 + (ng > 1 ? map_bytes : 0) + map_bytes + tables + m;
    if (total >= 1 + 2 * k) return 0;
    uint8_t *p = rec;
    *p++ = LLX_SIGNS;
    p += pack_mantissas(rec + 1, k, rec + 1);
    *p++ = (uint8_t)ng;
    if (ng > 1) write_map(w->group, period, per, p), p += map_bytes;
    write_map(w->sclass, period, 1, p), p += map_bytes;
    for (unsigned j = 0; j < ng; j++) p += kvs_rans_freqs_write(&coarse[j], p);
    for (unsigned q = 0; q < LLX_SIGN_CLASSES; q++) p += kvs_rans_freqs_write(&ts[q], p);
    memcpy(p, w->stream + at, m), p += m;
    return (size_t)(p - rec);
}

unsigned kvs_llx_encode_block(kvs_llx_scratch *w, const uint8_t *src, size_t k, uint64_t first,
                              uint32_t period, unsigned tools, const kvs_rans_warm *warm,
                              uint8_t *rec, size_t *used)
{
    uint32_t phase = (uint32_t)(first % period);
    size_t map_bytes = (period + 3) / 4;
    split_fields(src, k, w->exp, rec + 1);

    int use_map = period > 1;
    if (use_map) {
        rank_channels(w, k, period, phase);
        fill_ctx(w->group, period, phase, k, w->ctx);
    }
    /* Row references need whole rows from the block's start. */
    size_t repeats = 0;
    size_t nref = (tools & KVS_LLX_REFS) && use_map && phase == 0 && k >= 2 * (size_t)period
                      ? find_refs(w, src, k, period, &repeats)
                      : 0;
    /* The exponents' histograms per group: of the rows without a
     * reference (h), and of those with one (hr) when there are any; kind 1
     * counts them all. */
    uint32_t h[LLX_GROUPS][256], hall[LLX_GROUPS][256], hr[LLX_GROUPS][256];
    exponent_hists(w, k, period, phase, use_map, nref, h, hr);
    memcpy(hall, h, sizeof h);
    if (nref)
        for (int g = 0; g < LLX_GROUPS; g++)
            for (int s = 0; s < 256; s++) hall[g][s] += hr[g][s];
    kvs_rans_freqs t[3][LLX_GROUPS];
    int choice = 0;
    double best = choose_groups(hall, use_map, map_bytes, t, &choice);
    /* kind, G and the states besides the estimate (map and tables in it) */
    double k1 = 8.0 * (2 + 4 * KVS_RANS_LANES + (double)k) + best;
    /* Kind 3 (whole rows from the block's start): kind 1 with the
     * mantissas packed and the signs' code instead of their bits. */
    double k3 = k1;
    size_t nn = 0;
    kvs_rans_freqs ts[LLX_SIGN_CLASSES];
    if ((tools & KVS_LLX_SIGNS) && use_map && phase == 0) {
        nn = sign_nibbles(rec + 1, k, period, w->exp + k);
        k3 = k1 - 8.0 * (double)k + 8.0 * (double)((7 * k + 7) / 8) +
             sign_plan(w, k, period, nn, ts);
    }
    size_t n =
        nref ? encode_refs(w, src, k, period, nref, repeats, h, k3 < k1 ? k3 : k1, warm, rec) : 0;
    if (n) {
        *used = n;
        return KVS_LLX_REFS;
    }
    unsigned ng = 1u << choice, per = LLX_GROUPS / ng;
    n = k3 < k1 ? encode_signs(w, k, period, nn, t[choice], ng, ts, warm, rec) : 0;
    if (n) {
        *used = n;
        return KVS_LLX_SIGNS;
    }
    size_t raw = 1 + 2 * k;
    if (k1 >= 8.0 * (double)raw) goto store_raw;
    /* The tables per fine group (the map's 4 groups fold into ng). */
    kvs_rans_freqs fine[LLX_GROUPS];
    for (unsigned q = 0; q < LLX_GROUPS; q++) fine[q] = t[choice][q / per];
    kvs_rans_enc_init(&w->enc, fine, LLX_GROUPS);
    size_t cap = kvs_rans_bound(k), at = 0;
    if (kvs_rans_encode_tail(&w->enc, w->exp, ng > 1 ? w->ctx : NULL, k, w->stream, cap, warm,
                             &at) != KVS_OK)
        goto store_raw; /* cannot happen: every counted symbol has a code */
    size_t m = cap - at;
    size_t tables = 0;
    for (unsigned j = 0; j < ng; j++) tables += kvs_rans_freqs_size(&t[choice][j]);
    size_t head = 1 + k + 1 + (ng > 1 ? map_bytes : 0);
    size_t total = head + tables + m;
    if (total >= raw) goto store_raw;
    rec[0] = LLX_CODED;
    rec[1 + k] = (uint8_t)ng;
    if (ng > 1) write_map(w->group, period, per, rec + 2 + k);
    uint8_t *tp = rec + head;
    for (unsigned j = 0; j < ng; j++) tp += kvs_rans_freqs_write(&t[choice][j], tp);
    memcpy(tp, w->stream + at, m);
    *used = total;
    return 0;
store_raw:
    rec[0] = LLX_RAW;
    memcpy(rec + 1, src, 2 * k);
    *used = raw;
    return 0;
}
/* A map of 2-bit values below n (write_map) at rec[*at..len) into v; what
 * names it ("group", "sign class") in messages. */
static int read_map(const uint8_t *rec, size_t len, size_t *at, uint32_t period, unsigned n,
                    const char *what, unsigned long long b, uint8_t *v)
{
    size_t map_bytes = (period + 3) / 4;
    if (len - *at < map_bytes)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: %s map of %zu bytes, %zu left",
                             b, what, map_bytes, len - *at);
    for (uint32_t c = 0; c < 4 * map_bytes; c++) {
        unsigned g = rec[*at + c / 4] >> (2 * (c % 4)) & 3;
        if (c < period && g >= n)
            return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: channel %u in %s %u of %u",
                                 b, c, what, g, n);
        if (c >= period && g)
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: block %llu: %s map bits past channel %u set", b, what,
                                 period - 1);
        if (c < period) v[c] = (uint8_t)g;
    }
    *at += map_bytes;
    return KVS_OK;
}

/* The group count and map at rec[*at..len) into w->group; *ng the count. */
static int read_groups(kvs_llx_scratch *w, const uint8_t *rec, size_t len, size_t *at,
                       uint32_t period, unsigned long long b, unsigned *ng)
{
    if (len - *at < 1)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: group count missing", b);
    *ng = rec[(*at)++];
    if (*ng < 1 || *ng > LLX_GROUPS)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: %u channel groups (1 to %u)", b,
                             *ng, LLX_GROUPS);
    if (*ng == 1) return KVS_OK;
    return read_map(rec, len, at, period, *ng, "group", b, w->group);
}

/* n tables at rec[*at..len) into t. */
static int read_tables(const uint8_t *rec, size_t len, size_t *at, unsigned n, const char *what,
                       kvs_rans_freqs *t)
{
    for (unsigned j = 0; j < n; j++) {
        size_t u = 0;
        int rc = kvs_rans_freqs_read(rec + *at, len - *at, what, &t[j], &u);
        if (rc) return rc;
        *at += u;
    }
    return KVS_OK;
}

/* The set flags among bits [bit, bit + n) of fl. */
static size_t flags_set(const uint8_t *fl, size_t bit, size_t n)
{
    size_t m = 0;
    for (; n && (bit & 7); bit++, n--) m += fl[bit >> 3] >> (bit & 7) & 1;
    m += bits_set(fl + (bit >> 3), n / 8);
    for (bit += n / 8 * 8, n %= 8; n; bit++, n--) m += fl[bit >> 3] >> (bit & 7) & 1;
    return m;
}

/* Whether the block holds whole rows from its start (kinds 2 and 3 need
 * them); if not, the error names what the record holds. */
static int starts_row(uint32_t period, uint64_t first, unsigned long long b, const char *what)
{
    if (period >= 2 && first % period == 0) return 1;
    kvs_set_error(KVS_ECORRUPT,
                  "lossless: block %llu: %s in a block that does not start a row (channel period "
                  "%u, first element %llu)",
                  b, what, period, (unsigned long long)first);
    return 0;
}

/* Where a block's decoding leaves what its writes read: the stream's
 * symbols (kinds 1 and 3: exp, kind 2: sym), kind 3's mantissas (sm),
 * kind 2's flags and row distances. A scratch's own arrays when the block
 * is written right after, a held slot's (kvs_llx_held) when it waits. */
typedef struct llx_out {
    uint8_t *exp, *sym, *sm, *flags;
    uint32_t *ref;
} llx_out;

/* A block's record read as far as its exponents' rANS stream: the stream
 * (job, when coded) and what the rest of the decoding needs. The two
 * halves apart let two blocks' streams be decoded at once
 * (kvs_llx_decode_pair); the first writes nothing to the destination,
 * and every check of a block comes before its second half (block_hold). */
typedef struct llx_pending {
    unsigned kind;
    int coded;
    kvs_rans_dec_job job;
    char what[64];
    const uint8_t *rec, *sm;
    size_t k, u, rows, nfb, groups; /* u, nfb: kind 2; groups: kind 3 */
    uint32_t period;
    unsigned long long b;
    int simd, fused; /* kind 3 */
    uint8_t *dst;
    llx_out o;
} llx_pending;

/* What a block's stream warms while it decodes (kvs_rans_dec_job): the
 * block's destination, written after every block of the object is
 * checked. */
static kvs_rans_warm block_warm(const llx_pending *pd)
{
    kvs_rans_warm warm = {NULL, 0, pd->dst, pd->dst ? 2 * pd->k : 0};
    return warm;
}

/* A kind 2 record (row references), past its kind byte: up to its stream. */
static int refs_parse(kvs_llx_scratch *w, const uint8_t *rec, size_t len, size_t k,
                      uint64_t first, uint32_t period, unsigned long long b, llx_pending *pd)
{
    if (!starts_row(period, first, b, "row references")) return KVS_ECORRUPT;
    if (len < 5)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: record of %zu bytes", b, len);
    size_t u = get_le32(rec + 1), at = 5;
    if (u > k || len - at < u)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: %zu sign and mantissa bytes of %zu elements, "
                             "%zu bytes left",
                             b, u, k, len - at);
    const uint8_t *sm = rec + at;
    at += u;
    unsigned ng = 0;
    int rc = read_groups(w, rec, len, &at, period, b, &ng);
    if (rc) return rc;
    size_t rows = (k + period - 1) / period, bitmap = (rows + 7) / 8;
    if (len - at < bitmap)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: row reference bits of %zu bytes, %zu left", b,
                             bitmap, len - at);
    const uint8_t *bits = rec + at;
    at += bitmap;
    if ((bits[0] & 1) || (rows % 8 && bits[bitmap - 1] >> (rows % 8)))
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: row reference bit of row 0 or past row %zu set",
                             b, rows - 1);
    size_t nfl = 0; /* elements in rows with a reference */
    for (size_t r = 0; r < rows; r++) {
        pd->o.ref[r] = 0;
        if (!(bits[r / 8] >> (r % 8) & 1)) continue;
        if (len - at < 2)
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: block %llu: row %zu's reference distance truncated", b,
                                 r);
        uint32_t d = get_le16(rec + at);
        at += 2;
        if (d < 1 || d > r)
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: block %llu: row %zu refers %u rows back (1 to %zu)", b,
                                 r, d, r);
        pd->o.ref[r] = d;
        nfl += r + 1 < rows ? period : k - r * period;
    }
    char *what = pd->what;
    kvs_rans_freqs t[LLX_GROUPS + 1], tf;
    rc = read_tables(rec, len, &at, ng + 1, what, t);
    if (rc) return rc;
    if (len - at < 1)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: flag coding missing", b);
    unsigned coded = rec[at++];
    if (coded > 1)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: flag coding %u (0 raw, 1 rANS)",
                             b, coded);
    if (coded) rc = read_tables(rec, len, &at, 1, what, &tf);
    if (rc) return rc;
    if (len - at < 4)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: flag stream length truncated",
                             b);
    size_t mf = get_le32(rec + at), nfb = (nfl + 7) / 8;
    at += 4;
    if (mf > len - at)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: flag stream of %zu bytes, %zu left", b, mf,
                             len - at);
    if (coded) {
        kvs_rans_dec_init(&w->dec, &tf, 1);
        rc = kvs_rans_decode(&w->dec, rec + at, mf, NULL, pd->o.flags, nfb, what);
        if (rc) return rc;
    } else if (mf != nfb) {
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: %zu raw flag bytes, expected %zu", b, mf, nfb);
    } else {
        memcpy(pd->o.flags, rec + at, nfb);
    }
    at += mf;
    size_t repeated = 0;
    repeated = bits_set(pd->o.flags, nfb);
    if (nfl % 8 && pd->o.flags[nfb - 1] >> (nfl % 8))
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: flag bits past element %zu set",
                             b, nfl - 1);
    if (k - repeated != u)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: %zu elements not repeated, %zu sign and "
                             "mantissa bytes",
                             b, k - repeated, u);
    /* the contexts of the u symbols: a row without a reference its
     * channels' groups, a row with one the differences' (ng) for each
     * element not repeated */
    size_t s = 0, fbit = 0;
    for (size_t r = 0; r < rows; r++) {
        size_t i0 = r * period, n = r + 1 < rows ? period : k - i0;
        if (pd->o.ref[r] == 0) {
            if (ng > 1) memcpy(w->sym_ctx + s, w->group, n);
            else memset(w->sym_ctx + s, 0, n);
            s += n;
            continue;
        }
        size_t miss = n - flags_set(pd->o.flags, fbit, n);
        memset(w->sym_ctx + s, (int)ng, miss);
        s += miss;
        fbit += n;
    }
    kvs_rans_dec_init(&w->dec, t, ng + 1);
    pd->job = (kvs_rans_dec_job){&w->dec,  rec + at, len - at, w->sym_ctx, pd->o.sym,
                                 u,         what,     block_warm(pd)};
    pd->sm = sm;
    pd->u = u;
    pd->rows = rows;
    pd->nfb = nfb;
    return KVS_OK;
}

/* ... and the rest, once the stream is decoded. */
static void refs_finish(const llx_pending *pd)
{
    const llx_out *w = &pd->o;
    size_t k = pd->k, u = pd->u, rows = pd->rows, nfb = pd->nfb;
    (void)nfb; /* the VBMI2 rows' (not built on other CPUs) */
    uint32_t period = pd->period;
    const uint8_t *sm = pd->sm;
    uint8_t *dst = pd->dst;
    if (u < k) w->sym[u] = 0; /* read (and not used) after the last symbol */
    /* the elements, row by row: a row above is always decoded already */
    size_t s = 0, fbit = 0;
    for (size_t r = 0; r < rows; r++) {
        size_t i0 = r * period, n = r + 1 < rows ? period : k - i0;
        uint8_t *out = dst + 2 * i0;
        if (w->ref[r] == 0) {
            join_fields(w->sym + s, sm + s, n, out);
            s += n;
            continue;
        }
        const uint8_t *above = out - 2 * (size_t)w->ref[r] * period;
        const uint8_t *restrict fl = w->flags, *restrict sym = w->sym;
        size_t c = 0;
#if KVS_HAVE_X86
        if (rows_simd()) {
            size_t used = 0;
            c = kvs_llx_row_refs_avx512vbmi2(above, fl, nfb, fbit, sym + s, sm + s, n, out, &used);
            s += used;
            fbit += c;
        } else if (rows_avx2()) {
            size_t used = 0;
            c = kvs_llx_row_refs_avx2(above, fl, nfb, fbit, sym + s, sm + s, u - s, n, out, &used);
            s += used;
            fbit += c;
        }
#endif
        /* without branches; sym[s] and sm[s] with s == u are still
         * inside their buffers (u < k, and the group count follows sm) */
        for (; c < n; c++, fbit++) {
            unsigned rep = fl[fbit >> 3] >> (fbit & 7) & 1, a = get_le16(above + 2 * c);
            unsigned e = (sym[s] + (a >> 7)) & 0xFF;
            unsigned v = join1(e, sm[s]);
            v = rep ? a : v;
            out[2 * c] = (uint8_t)v;
            out[2 * c + 1] = (uint8_t)(v >> 8);
            s += !rep;
        }
    }
}

/* KVS_ECORRUPT when a bit past the last of the k mantissas at in is set. */
static int mantissas_end_clear(const uint8_t *in, size_t k, unsigned long long b)
{
    unsigned used = (unsigned)(7 * k % 8);
    if (used && in[(7 * k + 7) / 8 - 1] >> used)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: mantissa bits past element %zu set", b, k - 1);
    return KVS_OK;
}

/* Element i's mantissa of those at in (its two bytes are in the record). */
static inline uint8_t mantissa_at(const uint8_t *in, size_t i)
{
    return (uint8_t)(get_le16(in + 7 * i / 8) >> (7 * i % 8) & 0x7F);
}

/* pack_mantissas' inverse: the k mantissas at in into sm (bit 7 0), or
 * KVS_ECORRUPT when a bit past the last one is set. Reads up to one byte
 * past them. */
static int unpack_mantissas(const uint8_t *in, size_t k, uint8_t *sm, unsigned long long b)
{
    int rc = mantissas_end_clear(in, k, b);
    if (rc) return rc;
    size_t i = 0;
#if KVS_HAVE_X86
    if (kvs_rans_avx512_in_use()) i = kvs_llx_unpack7_avx512(in, k, sm);
    else if (kvs_rans_isa() == KVS_RANS_AVX2) i = kvs_llx_unpack7_avx2(in, k, (7 * k + 7) / 8, sm);
#endif
    size_t o = i / 8 * 7;
    /* pack_mantissas' steps backwards */
    for (; i + 8 <= k; i += 8, o += 7) {
        /* the 8th byte read is the record's next (its group count at
         * least): the caller checked that it is there */
        uint64_t x = get_le64(in + o) & 0x00FFFFFFFFFFFFFFu;
        x = (x & 0x000000000FFFFFFFu) | (x & 0x00FFFFFFF0000000u) << 4;
        x = (x & 0x00003FFF00003FFFu) | (x & 0x0FFFC0000FFFC000u) << 2;
        x = (x & 0x007F007F007F007Fu) | (x & 0x3F803F803F803F80u) << 1;
        put_le64(sm + i, x);
    }
    for (; i < k; i += 8) {
        size_t n = k - i < 8 ? k - i : 8, nb = (7 * n + 7) / 8;
        uint64_t v = 0;
        for (size_t j = 0; j < nb; j++) v |= (uint64_t)in[o + j] << (8 * j);
        o += nb;
        for (size_t j = 0; j < n; j++) sm[i + j] = (uint8_t)(v >> (7 * j) & 0x7F);
    }
    return KVS_OK;
}

/* A kind 3 record (signs coded), past its kind byte: up to its stream. */
static int signs_parse(kvs_llx_scratch *w, const uint8_t *rec, size_t len, size_t k,
                       uint64_t first, uint32_t period, unsigned long long b, llx_pending *pd)
{
    if (!starts_row(period, first, b, "coded signs")) return KVS_ECORRUPT;
    size_t mb = (7 * k + 7) / 8;
    if (len - 1 < mb + 1)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: %zu mantissa bytes and the group count, %zu "
                             "bytes left",
                             b, mb, len - 1);
    /* With AVX-512 and rows that start on a byte of the mantissas (period
     * a multiple of 8) the join unpacks them itself, without a pass into
     * w->sm: then only the rows' tails of under 32 are unpacked there. */
    int simd = 0, fused = 0;
#if KVS_HAVE_X86
    simd = kvs_rans_avx512_in_use();
    fused = simd && period % 8 == 0;
#endif
    pd->simd = simd;
    pd->fused = fused;
    int rc = fused ? mantissas_end_clear(rec + 1, k, b) : unpack_mantissas(rec + 1, k, pd->o.sm, b);
    if (rc) return rc;
    size_t at = 1 + mb;
    unsigned ng;
    rc = read_groups(w, rec, len, &at, period, b, &ng);
    if (rc) return rc;
    rc = read_map(rec, len, &at, period, LLX_SIGN_CLASSES, "sign class", b, w->sclass);
    if (rc) return rc;
    kvs_rans_freqs t[LLX_GROUPS + LLX_SIGN_CLASSES];
    rc = read_tables(rec, len, &at, ng + LLX_SIGN_CLASSES, pd->what, t);
    if (rc) return rc;
    for (unsigned q = 0; q < LLX_SIGN_CLASSES; q++)
        for (unsigned v = 16; v < 256; v++)
            if (t[ng + q].f[v])
                return kvs_set_error(KVS_ECORRUPT,
                                     "lossless: block %llu: sign table %u codes symbol %u "
                                     "(0 to 15)",
                                     b, q, v);
    size_t rows = (k + period - 1) / period, groups = (rows + LLX_SIGN_ROWS - 1) / LLX_SIGN_ROWS;
    size_t nn = groups * period;
    pd->rows = rows;
    pd->groups = groups;
    uint8_t *ctx = w->ctx;
    if (ng > 1) fill_ctx(w->group, period, 0, k, ctx);
    else memset(ctx, 0, k);
    for (uint32_t c = 0; c < period; c++) ctx[k + c] = (uint8_t)(ng + w->sclass[c]);
    for (size_t j = period; j < nn; j += period) memcpy(ctx + k + j, ctx + k, period);
    kvs_rans_dec_init(&w->dec, t, ng + LLX_SIGN_CLASSES);
    pd->job = (kvs_rans_dec_job){&w->dec,  rec + at, len - at,      ctx,
                                 pd->o.exp, k + nn,   pd->what, block_warm(pd)};
    return KVS_OK;
}

/* ... its last check, once the stream is decoded: the last nibbles' bits
 * of rows past the end, and of the last row past its last element, are 0. */
static int signs_check(const llx_pending *pd)
{
    size_t k = pd->k, rows = pd->rows, groups = pd->groups;
    uint32_t period = pd->period;
    const uint8_t *nib = pd->o.exp + k;
    size_t in_last = rows - 1 - (groups - 1) * LLX_SIGN_ROWS, last = k - (rows - 1) * period;
    for (uint32_t c = 0; c < period; c++) {
        size_t valid = in_last + (c < last);
        if (nib[(groups - 1) * period + c] >> valid)
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: block %llu: sign flip bits past element %zu set",
                                 pd->b, k - 1);
    }
    return KVS_OK;
}

/* ... and the elements, checked. */
static void signs_finish(const llx_pending *pd)
{
    const llx_out *w = &pd->o;
    size_t k = pd->k, rows = pd->rows;
    uint32_t period = pd->period;
    const uint8_t *rec = pd->rec, *nib = w->exp + k;
    uint8_t *dst = pd->dst;
    int simd = pd->simd, fused = pd->fused;
    (void)simd; /* these three: the AVX-512 joins' (not built on other CPUs) */
    (void)fused;
    (void)rec;
    /* The elements row by row, each sign its flip XOR the sign above it
     * (the row above is in dst already): one pass, the signs not stored
     * apart first. */
    for (size_t r = 0; r < rows; r++) {
        size_t i0 = r * period, n = k - i0 < period ? k - i0 : period;
        uint8_t bit = (uint8_t)(1u << (r % LLX_SIGN_ROWS));
        const uint8_t *restrict q = nib + r / LLX_SIGN_ROWS * period;
        const uint8_t *restrict e = w->exp + i0, *sm = w->sm + i0; /* its tail: below */
        uint8_t *out = dst + 2 * i0;
        const uint8_t *up = r ? out - 2 * (size_t)period : NULL;
        size_t c = 0;
#if KVS_HAVE_X86
        if (fused) {
            c = kvs_llx_join7_avx512(e, rec + 1 + i0 / 8 * 7, q, bit, up, n, out);
            for (size_t j = c; j < n; j++) w->sm[i0 + j] = mantissa_at(rec + 1, i0 + j);
        } else if (simd) {
            c = kvs_llx_join_avx512(e, sm, q, bit, up, n, out);
        }
#endif
#ifdef __SSE2__
        /* the flip as a byte compare (SSE2 has no byte shift) */
        const __m128i zero = _mm_setzero_si128(), vb = _mm_set1_epi8((char)bit),
                      m80 = _mm_set1_epi8((char)0x80), m8000 = _mm_set1_epi16((short)0x8000);
        for (; c + 16 <= n; c += 16) {
            __m128i qv = _mm_loadu_si128((const __m128i *)(q + c));
            __m128i flip = _mm_andnot_si128(_mm_cmpeq_epi8(_mm_and_si128(qv, vb), zero), m80);
            __m128i v0, v1;
            join16(_mm_loadu_si128((const __m128i *)(e + c)),
                   _mm_or_si128(_mm_loadu_si128((const __m128i *)(sm + c)), flip), &v0, &v1);
            if (up) {
                __m128i a0 = _mm_loadu_si128((const __m128i *)(up + 2 * c));
                __m128i a1 = _mm_loadu_si128((const __m128i *)(up + 2 * c + 16));
                v0 = _mm_xor_si128(v0, _mm_and_si128(a0, m8000));
                v1 = _mm_xor_si128(v1, _mm_and_si128(a1, m8000));
            }
            _mm_storeu_si128((__m128i *)(out + 2 * c), v0);
            _mm_storeu_si128((__m128i *)(out + 2 * c + 16), v1);
        }
#endif
        for (; c < n; c++) {
            unsigned v = join1(e[c], sm[c] | (q[c] & bit ? 0x80u : 0));
            put_le16(out + 2 * c, (uint16_t)(v ^ (up ? get_le16(up + 2 * c) & 0x8000u : 0)));
        }
    }
}

/* kvs_llx_decode_block's first half: the record read up to its stream. */
static int block_parse(kvs_llx_scratch *w, const llx_out *o, const kvs_llx_block *blk,
                       uint32_t period, unsigned tools, llx_pending *pd)
{
    const uint8_t *rec = blk->rec;
    size_t len = blk->len, k = blk->k;
    uint64_t first = blk->first;
    unsigned long long b = (unsigned long long)blk->block;
    *pd = (llx_pending){.rec = rec, .k = k, .period = period, .b = b, .dst = blk->dst, .o = *o};
    snprintf(pd->what, sizeof pd->what, "lossless: block %llu", b);
    if (len < 1)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: empty record", b);
    pd->kind = rec[0];
    if (rec[0] == LLX_RAW) {
        if (len != 1 + 2 * k)
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: block %llu: raw record of %zu bytes, expected %zu",
                                 b, len, 1 + 2 * k);
        return KVS_OK;
    }
    pd->coded = 1;
    if (rec[0] == LLX_REFS && (tools & KVS_LLX_REFS))
        return refs_parse(w, rec, len, k, first, period, b, pd);
    if (rec[0] == LLX_SIGNS && (tools & KVS_LLX_SIGNS))
        return signs_parse(w, rec, len, k, first, period, b, pd);
    if (rec[0] != LLX_CODED)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: record kind %u (0 raw, 1 rANS%s%s)", b, rec[0],
                             tools & KVS_LLX_REFS ? ", 2 rANS with row references" : "",
                             tools & KVS_LLX_SIGNS ? ", 3 rANS with coded signs" : "");
    if (len - 1 < k + 1)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: %zu sign and mantissa bytes and the group "
                             "count, %zu bytes left",
                             b, k, len - 1);
    pd->sm = rec + 1;
    size_t at = 1 + k;
    unsigned ng = 0;
    int rc = read_groups(w, rec, len, &at, period, b, &ng);
    if (rc) return rc;
    kvs_rans_freqs t[LLX_GROUPS];
    rc = read_tables(rec, len, &at, ng, pd->what, t);
    if (rc) return rc;
    if (ng > 1) fill_ctx(w->group, period, (uint32_t)(first % period), k, w->ctx);
    kvs_rans_dec_init(&w->dec, t, ng);
    pd->job = (kvs_rans_dec_job){&w->dec, rec + at,  len - at,      ng > 1 ? w->ctx : NULL,
                                 pd->o.exp, k,      pd->what, block_warm(pd)};
    return KVS_OK;
}

/* ... and its second half, the stream decoded: every check done, the
 * elements written. */
static void block_finish(const llx_pending *pd)
{
    switch (pd->kind) {
    case LLX_RAW: memcpy(pd->dst, pd->rec + 1, 2 * pd->k); return;
    case LLX_REFS: refs_finish(pd); return;
    case LLX_SIGNS: signs_finish(pd); return;
    default: join_fields(pd->o.exp, pd->sm, pd->k, pd->dst); return;
    }
}

/* What a block checks after its stream (kind 3's last nibbles). */
static int block_check(const llx_pending *pd)
{
    return pd->kind == LLX_SIGNS ? signs_check(pd) : KVS_OK;
}

/* A block's rANS stream, as block_parse set it up (with its warm). */
static int decode_job(const kvs_rans_dec_job *j)
{
    kvs_rans_dec_stream s;
    int rc = kvs_rans_stream_start(&s, j);
    return rc ? rc : kvs_rans_stream_finish(&s);
}

/* A block read, its stream decoded and checked: nothing written but o. */
static int block_hold(kvs_llx_scratch *w, const llx_out *o, const kvs_llx_block *blk,
                      uint32_t period, unsigned tools, llx_pending *pd)
{
    int rc = block_parse(w, o, blk, period, tools, pd);
    if (rc == KVS_OK && pd->coded) rc = decode_job(&pd->job);
    return rc ? rc : block_check(pd);
}

/* Two blocks held: their streams decoded at once where both are coded.
 * The refusal is the first that holding them one at a time, in order,
 * meets: a pair that fails anywhere is held again so. */
static int hold_pair(kvs_llx_scratch *w[2], const llx_out o[2], const kvs_llx_block blk[2],
                     uint32_t period, unsigned tools, llx_pending pd[2])
{
    int rc = block_parse(w[0], &o[0], &blk[0], period, tools, &pd[0]);
    if (rc) return rc; /* nothing before it: the refusal one at a time */
    if (block_parse(w[1], &o[1], &blk[1], period, tools, &pd[1]) == KVS_OK) {
        if (pd[0].coded && pd[1].coded) {
            kvs_rans_dec_job job[2] = {pd[0].job, pd[1].job};
            rc = kvs_rans_decode2(job);
        } else {
            for (int s = 0; s < 2 && rc == KVS_OK; s++)
                if (pd[s].coded) rc = decode_job(&pd[s].job);
        }
        if (rc == KVS_OK && (rc = block_check(&pd[0])) != KVS_OK) return rc;
        if (rc == KVS_OK) return block_check(&pd[1]);
    }
    /* The second record or a stream refused: one at a time, so that the
     * first block is held (or refused) before the second is read, with
     * their messages. */
    for (int s = 0; s < 2; s++) {
        rc = block_hold(w[s], &o[s], &blk[s], period, tools, &pd[s]);
        if (rc) return rc;
    }
    return KVS_OK;
}

/* A scratch's own arrays as the place a block waits in. */
static llx_out scratch_out(kvs_llx_scratch *w)
{
    return (llx_out){w->exp, w->sym, w->sm, w->flags, w->ref};
}

int kvs_llx_decode_block(kvs_llx_scratch *w, const uint8_t *rec, size_t len, size_t k,
                         uint64_t first, uint32_t period, unsigned tools, uint64_t block,
                         uint8_t *dst)
{
    kvs_llx_block blk = {rec, len, k, first, block, dst};
    llx_out o = scratch_out(w);
    llx_pending pd;
    int rc = block_hold(w, &o, &blk, period, tools, &pd);
    if (rc == KVS_OK) block_finish(&pd);
    return rc;
}

int kvs_llx_decode_pair(kvs_llx_scratch *w[2], const kvs_llx_block blk[2], uint32_t period,
                        unsigned tools)
{
    llx_out o[2] = {scratch_out(w[0]), scratch_out(w[1])};
    llx_pending pd[2];
    if (hold_pair(w, o, blk, period, tools, pd) == KVS_OK) {
        block_finish(&pd[0]);
        block_finish(&pd[1]);
        return KVS_OK;
    }
    /* A refusal: one block at a time, so that the first block is written
     * when only the second is refused, as two calls write it. */
    for (int s = 0; s < 2; s++) {
        int rc = kvs_llx_decode_block(w[s], blk[s].rec, blk[s].len, blk[s].k, blk[s].first,
                                      period, tools, blk[s].block, blk[s].dst);
        if (rc) return rc;
    }
    return KVS_OK;
}

/* ---- blocks held until every block of an object is checked ---------- */

/* A held slot's arrays, for a block of up to KVS_LLX_KEPT_K elements: the
 * symbols (as a scratch's exp, kind 2's too), the mantissas, the flags,
 * the rows' distances (u32, period >= 2). */
#define HELD_SYM (KVS_LLX_KEPT_K + KVS_LLX_KEPT_K / 4 + KVS_LLX_MAX_PERIOD)
#define HELD_SM KVS_LLX_KEPT_K
#define HELD_FLAGS (KVS_LLX_KEPT_K / 8 + 4)
#define HELD_REF (KVS_LLX_KEPT_K / 2 + 1)
#define HELD_REF_AT (((HELD_SYM + HELD_SM + HELD_FLAGS + 63) & ~(size_t)63)) /* aligned */
#define HELD_SLOT_BYTES (HELD_REF_AT + 4 * (size_t)HELD_REF)

struct kvs_llx_held {
    uint64_t cap; /* slots */
    llx_pending *pd;
    uint32_t *crc; /* kvs_crc32c of each held block's record */
    uint8_t *buf; /* cap x HELD_SLOT_BYTES */
};

/* Two kept, as the scratches are (a processor's two workers). */
#define KVS_LLX_HELD_KEPT 2
static _Atomic(kvs_llx_held *) held_kept[KVS_LLX_HELD_KEPT];

static void held_free(kvs_llx_held *h)
{
    if (h == NULL) return;
    free(h->pd);
    free(h->crc);
    free(h->buf);
    free(h);
}

kvs_llx_held *kvs_llx_held_take(uint64_t nblocks)
{
    if (nblocks == 0 || nblocks > KVS_LLX_HELD_MAX) return NULL;
    for (int s = 0; s < KVS_LLX_HELD_KEPT; s++) {
        kvs_llx_held *h = atomic_exchange(&held_kept[s], NULL);
        if (h && h->cap >= nblocks) return h;
        kvs_llx_held_give(h); /* too small: back, or freed for a larger one */
    }
    kvs_llx_held *h = calloc(1, sizeof *h);
    if (h == NULL) return NULL;
    h->cap = nblocks;
    h->pd = malloc((size_t)nblocks * sizeof *h->pd);
    h->crc = malloc((size_t)nblocks * sizeof *h->crc);
    h->buf = malloc((size_t)nblocks * HELD_SLOT_BYTES);
    if (h->pd == NULL || h->crc == NULL || h->buf == NULL) {
        held_free(h);
        return NULL;
    }
    return h;
}

void kvs_llx_held_give(kvs_llx_held *h)
{
    if (h == NULL) return;
    for (int s = 0; s < KVS_LLX_HELD_KEPT; s++) {
        kvs_llx_held *none = NULL;
        if (atomic_compare_exchange_strong(&held_kept[s], &none, h)) return;
    }
    /* full: keep the larger of it and a kept one */
    for (int s = 0; s < KVS_LLX_HELD_KEPT; s++) {
        kvs_llx_held *k = atomic_load(&held_kept[s]);
        if (k && k->cap < h->cap && atomic_compare_exchange_strong(&held_kept[s], &k, h)) {
            held_free(k);
            return;
        }
    }
    held_free(h);
}

static llx_out held_out(kvs_llx_held *h, uint64_t slot)
{
    uint8_t *p = h->buf + (size_t)slot * HELD_SLOT_BYTES;
    llx_out o = {p, p, p + HELD_SYM, p + HELD_SYM + HELD_SM, NULL};
    o.ref = (uint32_t *)(void *)(p + HELD_REF_AT);
    return o;
}

/* The lanes of kvs_llx_hold_range: each a block whose stream is being
 * decoded (-1: none). */
typedef struct llx_lanes {
    kvs_llx_scratch **w;
    kvs_llx_held *h;
    uint64_t slot;
    const kvs_llx_block *blk;
    size_t n, next;
    uint32_t period;
    unsigned tools;
    long blk_of[2];
    kvs_rans_dec_stream st[2];
} llx_lanes;

/* Block i is held: its record's CRC-32C, while the record is in cache. */
static void held_crc(llx_lanes *q, size_t i)
{
    q->h->crc[q->slot + i] = kvs_crc32c(0, q->blk[i].rec, q->blk[i].len);
}

/* Lane l takes the next block with a stream (blocks without one, raw, are
 * held on the way); KVS_OK with blk_of[l] -1 when none is left. */
static int lane_fill(llx_lanes *q, int l)
{
    q->blk_of[l] = -1;
    while (q->next < q->n) {
        size_t i = q->next++;
        llx_out o = held_out(q->h, q->slot + i);
        llx_pending *pd = &q->h->pd[q->slot + i];
        int rc = block_parse(q->w[l], &o, &q->blk[i], q->period, q->tools, pd);
        if (rc == KVS_OK && pd->coded) rc = kvs_rans_stream_start(&q->st[l], &pd->job);
        if (rc) return rc;
        if (pd->coded) {
            q->blk_of[l] = (long)i;
            return KVS_OK;
        }
        held_crc(q, i);
    }
    return KVS_OK;
}

/* Lane l's stream to its end, its block's last check, the lane refilled. */
static int lane_end(llx_lanes *q, int l)
{
    int rc = kvs_rans_stream_finish(&q->st[l]);
    if (rc == KVS_OK) rc = block_check(&q->h->pd[q->slot + (size_t)q->blk_of[l]]);
    if (rc) return rc;
    held_crc(q, (size_t)q->blk_of[l]);
    return lane_fill(q, l);
}

int kvs_llx_hold_range(kvs_llx_scratch *w[2], kvs_llx_held *h, uint64_t slot,
                       const kvs_llx_block *blk, size_t n, uint32_t period, unsigned tools)
{
    llx_lanes q;
    memset(&q, 0, sizeof q);
    q.w = w, q.h = h, q.slot = slot, q.blk = blk, q.n = n, q.period = period, q.tools = tools;
    int rc = lane_fill(&q, 0);
    if (rc == KVS_OK) rc = lane_fill(&q, 1);
    while (rc == KVS_OK && q.blk_of[0] >= 0 && q.blk_of[1] >= 0) {
        kvs_rans_dec_stream *s[2] = {&q.st[0], &q.st[1]};
        rc = lane_end(&q, kvs_rans_streams_joint(s));
    }
    for (int l = 0; l < 2 && rc == KVS_OK; l++)
        while (rc == KVS_OK && q.blk_of[l] >= 0) rc = lane_end(&q, l);
    if (rc == KVS_OK) return KVS_OK;
    /* A refusal, maybe of a later block than the first one refused: one
     * block at a time, in order, for the first refusal and its message. */
    for (size_t i = 0; i < n; i++) {
        llx_out o = held_out(h, slot + i);
        rc = block_hold(w[0], &o, &blk[i], period, tools, &h->pd[slot + i]);
        if (rc) return rc;
        held_crc(&q, i);
    }
    return KVS_OK;
}

uint32_t kvs_llx_held_crc(const kvs_llx_held *h, uint64_t slot)
{
    return h->crc[slot];
}

void kvs_llx_held_write(const kvs_llx_held *h, uint64_t slot)
{
    block_finish(&h->pd[slot]);
}
