/* lossless_exponent.c - one block of the lossless stage's rANS coder
 * (lossless_exponent.h).
 *
 * Record of a block of k elements (docs/frame_format.md):
 *   u8 0, then the 2k bytes raw; or
 *   u8 1 | the k sign and mantissa bytes (bit 7 the sign, bits 0-6 the
 *   mantissa) | u8 groups G (1-4) | when G > 1, the group of each channel,
 *   2 bits each, channel c in bits 2(c mod 4) of byte c / 4 (ceil(period /
 *   4) bytes, unused bits 0) | G frequency tables (rans.h) | the rANS stream
 *   of the k exponents, to the end of the record.
 * The sign and mantissa bytes come first so that the encoder writes them in
 * place while it splits the elements.
 *
 * Why channel groups and nothing richer: on the real KV cache
 * (docs/performance.md) the exponent costs 2.62 bits per element order-0
 * with the tables, 2.51 with 4 channel groups (map and tables included),
 * 2.55 with the previous token's exponent as context and 2.51 with both;
 * sign and mantissa are 7.97 bits of 8, so they stay raw. */
#include "frame/lossless_exponent.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "codecs/rans.h"
#include "kvserde/error.h"

#define LLX_RAW 0
#define LLX_CODED 1
#define LLX_GROUPS 4 /* the most the encoder tries (and the map's 2 bits hold) */

struct kvs_llx_scratch {
    size_t max_k;
    uint8_t *exp; /* the block's exponents */
    uint8_t *ctx; /* each element's group */
    uint8_t *stream;
    uint32_t sum[KVS_LLX_MAX_PERIOD];
    uint16_t sum16[KVS_LLX_MAX_PERIOD];
    uint16_t mean[KVS_LLX_MAX_PERIOD];     /* x 256 */
    uint16_t order[2][KVS_LLX_MAX_PERIOD]; /* channels by mean */
    uint8_t group[KVS_LLX_MAX_PERIOD];
    kvs_rans_enc_tables enc;
    kvs_rans_dec_tables dec;
};

static void scratch_free(kvs_llx_scratch *w)
{
    if (w == NULL) return;
    free(w->exp);
    free(w->ctx);
    free(w->stream);
    free(w);
}

/* One scratch of KVS_LLX_KEPT_K elements kept for the next call, as the
 * stage keeps its zstd contexts: allocating its 450 KiB afresh (mapped and
 * faulted in) cost a third of coding a block. A call takes the kept one or
 * makes its own, and keeps it afterwards if the slot is free; the kept one
 * is reachable from here until the process ends. */
#define KVS_LLX_KEPT_K 65536u
static _Atomic(kvs_llx_scratch *) scratch_kept;

kvs_llx_scratch *kvs_llx_scratch_take(size_t max_k)
{
    if (max_k <= KVS_LLX_KEPT_K) {
        kvs_llx_scratch *w = atomic_exchange(&scratch_kept, NULL);
        if (w) return w;
        max_k = KVS_LLX_KEPT_K;
    }
    kvs_llx_scratch *w = malloc(sizeof *w);
    if (w == NULL) return NULL;
    w->max_k = max_k;
    w->exp = malloc(max_k);
    w->ctx = malloc(max_k);
    w->stream = malloc(kvs_rans_bound(max_k));
    if (w->exp == NULL || w->ctx == NULL || w->stream == NULL) {
        scratch_free(w);
        return NULL;
    }
    return w;
}

void kvs_llx_scratch_give(kvs_llx_scratch *w)
{
    kvs_llx_scratch *none = NULL;
    if (w && (w->max_k != KVS_LLX_KEPT_K ||
              !atomic_compare_exchange_strong(&scratch_kept, &none, w)))
        scratch_free(w);
}

/* src (k u16) -> exponents and sign+mantissa bytes. */
static void split_fields(const uint8_t *src, size_t k, uint8_t *exp, uint8_t *sm)
{
    size_t i = 0;
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

static void join_fields(const uint8_t *exp, const uint8_t *sm, size_t k, uint8_t *dst)
{
    size_t i = 0;
#ifdef __SSE2__
    const __m128i zero = _mm_setzero_si128(), m7f = _mm_set1_epi16(0x7F),
                  m80 = _mm_set1_epi16(0x80);
    for (; i + 16 <= k; i += 16) {
        __m128i e = _mm_loadu_si128((const __m128i *)(exp + i));
        __m128i s = _mm_loadu_si128((const __m128i *)(sm + i));
        __m128i e0 = _mm_unpacklo_epi8(e, zero), e1 = _mm_unpackhi_epi8(e, zero);
        __m128i s0 = _mm_unpacklo_epi8(s, zero), s1 = _mm_unpackhi_epi8(s, zero);
        __m128i v0 = _mm_or_si128(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(s0, m80), 8),
                                               _mm_slli_epi16(e0, 7)),
                                  _mm_and_si128(s0, m7f));
        __m128i v1 = _mm_or_si128(_mm_or_si128(_mm_slli_epi16(_mm_and_si128(s1, m80), 8),
                                               _mm_slli_epi16(e1, 7)),
                                  _mm_and_si128(s1, m7f));
        _mm_storeu_si128((__m128i *)(dst + 2 * i), v0);
        _mm_storeu_si128((__m128i *)(dst + 2 * i + 16), v1);
    }
#endif
    for (; i < k; i++) {
        unsigned v = (unsigned)(sm[i] & 0x80) << 8 | (unsigned)exp[i] << 7 | (sm[i] & 0x7Fu);
        dst[2 * i] = (uint8_t)v;
        dst[2 * i + 1] = (uint8_t)(v >> 8);
    }
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
    while (i + period <= k) {
        size_t rows = (k - i) / period < 256 ? (k - i) / period : 256;
        memset(s16, 0, period * sizeof s16[0]);
        for (size_t r = 0; r < rows; r++, i += period) {
            uint32_t c = 0;
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
    for (uint32_t c = 0; c < period; c++) {
        /* channel c holds elements i = (c - phase) mod period + j period */
        size_t i0 = (c + period - phase) % period;
        uint64_t n = i0 < k ? (k - 1 - i0) / period + 1 : 0;
        w->mean[c] = (uint16_t)(n ? ((uint64_t)w->sum[c] << 8) / n : 0); /* < 2^16 */
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
    for (uint32_t r = 0; r < period; r++)
        w->group[w->order[0][r]] = (uint8_t)((uint64_t)r * LLX_GROUPS / period);
}

void kvs_llx_encode_block(kvs_llx_scratch *w, const uint8_t *src, size_t k, uint64_t first,
                          uint32_t period, uint8_t *rec, size_t *used)
{
    uint32_t phase = (uint32_t)(first % period);
    size_t map_bytes = (period + 3) / 4;
    split_fields(src, k, w->exp, rec + 1);

    /* Four histograms per group, summed after: exponents cluster on a few
     * values, and one counter per value would chain its increments. */
    uint32_t h4[4][LLX_GROUPS][256], h[LLX_GROUPS][256];
    memset(h4, 0, sizeof h4);
    int use_map = period > 1;
    const uint8_t *exp = w->exp, *ctx = w->ctx;
    size_t i = 0;
    uint32_t *h0 = h4[0][0], *h1 = h4[1][0], *h2 = h4[2][0], *h3 = h4[3][0];
    if (use_map) {
        rank_channels(w, k, period, phase);
        fill_ctx(w->group, period, phase, k, w->ctx);
        for (; i + 4 <= k; i += 4) {
            h0[(unsigned)ctx[i] << 8 | exp[i]]++;
            h1[(unsigned)ctx[i + 1] << 8 | exp[i + 1]]++;
            h2[(unsigned)ctx[i + 2] << 8 | exp[i + 2]]++;
            h3[(unsigned)ctx[i + 3] << 8 | exp[i + 3]]++;
        }
        for (; i < k; i++) h0[(unsigned)ctx[i] << 8 | exp[i]]++;
    } else {
        for (; i + 4 <= k; i += 4) {
            h0[exp[i]]++;
            h1[exp[i + 1]]++;
            h2[exp[i + 2]]++;
            h3[exp[i + 3]]++;
        }
        for (; i < k; i++) h0[exp[i]]++;
    }
    for (int g = 0; g < LLX_GROUPS; g++)
        for (int s = 0; s < 256; s++) h[g][s] = h4[0][g][s] + h4[1][g][s] + h4[2][g][s] + h4[3][g][s];
    /* The cost of 1, 2 and 4 groups (2: the ranking's halves), tables and
     * map included; each table set kept for the choice. */
    kvs_rans_freqs t[3][LLX_GROUPS];
    uint8_t form[KVS_RANS_FREQS_MAX];
    double best = 0;
    int choice = 0;
    for (int g = 0; g < (use_map ? 3 : 1); g++) {
        unsigned ng = 1u << g, per = LLX_GROUPS / ng;
        double bits = ng > 1 ? 8.0 * (double)map_bytes : 0;
        for (unsigned j = 0; j < ng; j++) {
            uint32_t m[256];
            for (int s = 0; s < 256; s++) {
                m[s] = 0;
                for (unsigned q = j * per; q < (j + 1) * per; q++) m[s] += h[q][s];
            }
            kvs_rans_normalize(m, &t[g][j]);
            bits += kvs_rans_cost_bits(m, &t[g][j]) + 8.0 * (double)kvs_rans_freqs_write(&t[g][j], form);
        }
        if (g == 0 || bits < best) best = bits, choice = g;
    }
    unsigned ng = 1u << choice, per = LLX_GROUPS / ng;
    size_t raw = 1 + 2 * k;
    /* kind, G and the states besides the estimate (map and tables in it) */
    if (8.0 * (2 + 4 * KVS_RANS_LANES + (double)k) + best >= 8.0 * (double)raw) goto store_raw;

    /* The tables per fine group (the map's 4 groups fold into ng). */
    kvs_rans_freqs fine[LLX_GROUPS];
    for (unsigned q = 0; q < LLX_GROUPS; q++) fine[q] = t[choice][q / per];
    kvs_rans_enc_init(&w->enc, fine, LLX_GROUPS);
    size_t m = 0;
    if (kvs_rans_encode(&w->enc, w->exp, ng > 1 ? w->ctx : NULL, k, w->stream,
                        kvs_rans_bound(k), &m) != KVS_OK)
        goto store_raw; /* cannot happen: every counted symbol has a code */
    size_t tables = 0;
    for (unsigned j = 0; j < ng; j++) tables += kvs_rans_freqs_write(&t[choice][j], form);
    size_t head = 1 + k + 1 + (ng > 1 ? map_bytes : 0);
    size_t total = head + tables + m;
    if (total >= raw) goto store_raw;
    rec[0] = LLX_CODED;
    rec[1 + k] = (uint8_t)ng;
    if (ng > 1) {
        uint8_t *map = rec + 2 + k;
        memset(map, 0, map_bytes);
        for (uint32_t c = 0; c < period; c++)
            map[c / 4] |= (uint8_t)((w->group[c] / per) << (2 * (c % 4)));
    }
    uint8_t *tp = rec + head;
    for (unsigned j = 0; j < ng; j++) tp += kvs_rans_freqs_write(&t[choice][j], tp);
    memcpy(tp, w->stream, m);
    *used = total;
    return;
store_raw:
    rec[0] = LLX_RAW;
    memcpy(rec + 1, src, 2 * k);
    *used = raw;
}

int kvs_llx_decode_block(kvs_llx_scratch *w, const uint8_t *rec, size_t len, size_t k,
                         uint64_t first, uint32_t period, uint64_t block, uint8_t *dst)
{
    unsigned long long b = (unsigned long long)block;
    if (len < 1)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: empty record", b);
    if (rec[0] == LLX_RAW) {
        if (len != 1 + 2 * k)
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: block %llu: raw record of %zu bytes, expected %zu",
                                 b, len, 1 + 2 * k);
        memcpy(dst, rec + 1, 2 * k);
        return KVS_OK;
    }
    if (rec[0] != LLX_CODED)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: record kind %u (0 raw, 1 rANS)",
                             b, rec[0]);
    if (len - 1 < k + 1)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: %zu sign and mantissa bytes and the group "
                             "count, %zu bytes left",
                             b, k, len - 1);
    const uint8_t *sm = rec + 1;
    size_t at = 1 + k;
    unsigned ng = rec[at++];
    if (ng < 1 || ng > LLX_GROUPS)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: %u channel groups (1 to %u)", b,
                             ng, LLX_GROUPS);
    if (ng > 1) {
        size_t map_bytes = (period + 3) / 4;
        if (len - at < map_bytes)
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: block %llu: group map of %zu bytes, %zu left", b,
                                 map_bytes, len - at);
        for (uint32_t c = 0; c < 4 * map_bytes; c++) {
            unsigned g = rec[at + c / 4] >> (2 * (c % 4)) & 3;
            if (c < period && g >= ng)
                return kvs_set_error(KVS_ECORRUPT,
                                     "lossless: block %llu: channel %u in group %u of %u", b, c,
                                     g, ng);
            if (c >= period && g)
                return kvs_set_error(KVS_ECORRUPT,
                                     "lossless: block %llu: group map bits past channel %u set",
                                     b, period - 1);
            if (c < period) w->group[c] = (uint8_t)g;
        }
        at += map_bytes;
    }
    kvs_rans_freqs t[LLX_GROUPS];
    char what[64];
    snprintf(what, sizeof what, "lossless: block %llu", b);
    for (unsigned j = 0; j < ng; j++) {
        size_t u = 0;
        int rc = kvs_rans_freqs_read(rec + at, len - at, what, &t[j], &u);
        if (rc) return rc;
        at += u;
    }
    if (ng > 1) fill_ctx(w->group, period, (uint32_t)(first % period), k, w->ctx);
    kvs_rans_dec_init(&w->dec, t, ng);
    int rc = kvs_rans_decode(&w->dec, rec + at, len - at, ng > 1 ? w->ctx : NULL, w->exp, k, what);
    if (rc) return rc;
    join_fields(w->exp, sm, k, dst);
    return KVS_OK;
}
