/* coef_coder.c - the adaptive binary range coder of the transform stage's
 * coefficients (coef_coder.h). The range coder is LZMA's: a 32-bit range,
 * a 64-bit low whose carry is propagated through one cached byte; the
 * probabilities are 15-bit with a rate that slows as a context learns. The
 * encoder's output and the decoder's input are the same number of bytes
 * (5 flushed + one per renormalisation), which is what lets the decoder
 * refuse a stream with bytes left over. */
#include "codecs/coef_coder.h"

#include <math.h>
#include <string.h>

#include "kvserde/error.h"

/* 15-bit probabilities (range >> 15 still leaves 9 bits of resolution,
 * range >= 2^24), adapted by 1/4 of the distance at first and 1/128 once
 * a context has seen 62 bits: fast to learn, then quiet. The fixed 1/32
 * of LZMA cost 0.1 bit per coefficient more on kvdata (estimation noise
 * of a short window). */
#define PROB_BITS 15
#define PROB_ONE (1u << PROB_BITS)
#define RATE_MAX 7
#define TOP (1u << 24)
#define LEN_MAX 16 /* bit lengths 1..16 of |q| <= 65535 */
/* Contexts per class: the magnitude of the same component one token
 * before, 0, 1, 2, 3 or more (neighbouring tokens' coefficients are alike
 * in size: measured on kvdata, 5-8% fewer bits than the class alone). */
#define PREV_CONTEXTS 4

/* The adaptive probabilities of one context class: that a coefficient is
 * zero; for each bit length so far, that it is longer; for each bit length,
 * that the bit below the leading one is set. */
typedef struct prob {
    uint16_t p; /* of a 0 bit, out of PROB_ONE */
    uint16_t n; /* bits seen, up to the count where the rate is RATE_MAX */
} prob;

typedef struct class_probs {
    prob zero;
    prob longer[LEN_MAX];
    prob below[LEN_MAX][3]; /* the two bits below the leading one, as a tree */
} class_probs;

static void probs_init(class_probs *p)
{
    p->zero = (prob){PROB_ONE / 2, 0};
    for (int i = 0; i < LEN_MAX; i++) {
        p->longer[i] = (prob){PROB_ONE / 2, 0};
        for (int k = 0; k < 3; k++) p->below[i][k] = (prob){PROB_ONE / 2, 0};
    }
}

/* Move the probability toward the bit seen: by 1/2^rate, the rate growing
 * with the count n of bits seen, 1 + floor(log2(n + 2)): 2, 2, 3, 3, 3, 3,
 * 4, ... up to RATE_MAX. */
#define RATE_COUNT 62 /* the count from which the rate is RATE_MAX */

/* One entry past RATE_COUNT, RATE_MAX: a count stops there, so the rate
 * is a plain look-up (no branch on the count). */
static const uint8_t rate_of_count[RATE_COUNT + 1] = {
    2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5,
    5, 5, 5, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6,
    6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, RATE_MAX};

/* Branch-free: which way the bit went is the one thing the coder cannot
 * predict, so the update selects instead of jumping. */
static inline void adapt(prob *p, unsigned bit)
{
    unsigned rate = rate_of_count[p->n];
    p->n = (uint16_t)(p->n + (p->n < RATE_COUNT));
    unsigned up = p->p + ((PROB_ONE - p->p) >> rate), down = p->p - (p->p >> rate);
    p->p = (uint16_t)(bit ? down : up);
}

/* ---- encoder ------------------------------------------------------------ */

typedef struct enc {
    uint64_t low;
    uint32_t range;
    uint8_t cache;
    uint64_t cache_size;
    uint8_t *out;
    size_t pos, cap;
    int full;
} enc;

static void put(enc *e, uint8_t b)
{
    if (e->pos < e->cap)
        e->out[e->pos++] = b;
    else
        e->full = 1;
}

static void shift_low(enc *e)
{
    if ((uint32_t)e->low < 0xFF000000u || (e->low >> 32) != 0) {
        uint8_t carry = (uint8_t)(e->low >> 32);
        uint8_t temp = e->cache;
        do {
            put(e, (uint8_t)(temp + carry));
            temp = 0xFF;
        } while (--e->cache_size != 0);
        e->cache = (uint8_t)(e->low >> 24);
    }
    e->cache_size++;
    e->low = (e->low & 0x00FFFFFFu) << 8;
}

static inline void enc_bit(enc *e, prob *p, unsigned bit)
{
    uint32_t bound = (e->range >> PROB_BITS) * p->p;
    if (bit == 0) {
        e->range = bound;
    } else {
        e->low += bound;
        e->range -= bound;
    }
    adapt(p, bit);
    while (e->range < TOP) {
        e->range <<= 8;
        shift_low(e);
    }
}

static inline void enc_direct(enc *e, uint32_t value, unsigned nbits)
{
    while (nbits-- > 0) {
        e->range >>= 1;
        if ((value >> nbits) & 1u) e->low += e->range;
        while (e->range < TOP) {
            e->range <<= 8;
            shift_low(e);
        }
    }
}

/* The context of the value one row up (clamped as it was coded). */
static unsigned prev_context(int32_t v)
{
    uint32_t m = (uint32_t)(v < 0 ? -(int64_t)v : v);
    return m >= PREV_CONTEXTS - 1 ? PREV_CONTEXTS - 1 : m;
}

static unsigned bit_length(uint32_t m)
{
    unsigned e = 0;
    while (m >> e) e++;
    return e;
}

int kvs_coef_encode(const int32_t *q, size_t rows, size_t cols, const uint8_t *cls,
                    uint8_t *out, size_t cap, size_t *n)
{
    class_probs probs[KVS_COEF_CLASSES][PREV_CONTEXTS];
    for (int c = 0; c < KVS_COEF_CLASSES; c++)
        for (int k = 0; k < PREV_CONTEXTS; k++) probs_init(&probs[c][k]);
    enc e = {0, 0xFFFFFFFFu, 0, 1, out, 0, cap, 0};
    for (size_t r = 0; r < rows && !e.full; r++) {
        const int32_t *row = q + r * cols;
        for (size_t j = 0; j < cols; j++) {
            int32_t v = row[j];
            if (v > KVS_COEF_MAX) v = KVS_COEF_MAX;
            if (v < -KVS_COEF_MAX) v = -KVS_COEF_MAX;
            unsigned ctx = r ? prev_context((row - cols)[j]) : 0;
            class_probs *p = &probs[cls[j] % KVS_COEF_CLASSES][ctx];
            enc_bit(&e, &p->zero, v != 0);
            if (v == 0) continue;
            uint32_t m = (uint32_t)(v < 0 ? -v : v);
            enc_direct(&e, v < 0, 1);
            unsigned len = bit_length(m); /* 1..16 */
            for (unsigned i = 1; i < LEN_MAX; i++) {
                enc_bit(&e, &p->longer[i], len > i);
                if (len <= i) break;
            }
            if (len >= 2) {
                unsigned b1 = (m >> (len - 2)) & 1u;
                enc_bit(&e, &p->below[len - 1][0], b1);
                if (len >= 3) {
                    enc_bit(&e, &p->below[len - 1][1 + b1], (m >> (len - 3)) & 1u);
                    if (len >= 4) enc_direct(&e, m & ((1u << (len - 3)) - 1u), len - 3);
                }
            }
        }
    }
    for (int i = 0; i < 5; i++) shift_low(&e);
    if (e.full) return KVS_ENOSPC;
    *n = e.pos;
    return KVS_OK;
}

/* ---- decoder ------------------------------------------------------------ */

typedef struct dec {
    uint32_t range, code;
    const uint8_t *in;
    size_t pos, n;
    int overrun; /* a byte past the end was asked for */
} dec;

static inline uint8_t get(dec *d)
{
    if (d->pos < d->n) return d->in[d->pos++];
    d->overrun = 1;
    return 0;
}

static inline unsigned dec_bit(dec *d, prob *p)
{
    uint32_t bound = (d->range >> PROB_BITS) * p->p;
    unsigned bit;
    if (d->code < bound) {
        d->range = bound;
        bit = 0;
    } else {
        d->code -= bound;
        d->range -= bound;
        bit = 1;
    }
    adapt(p, bit);
    while (d->range < TOP) {
        d->range <<= 8;
        d->code = d->code << 8 | get(d);
    }
    return bit;
}

static inline uint32_t dec_direct(dec *d, unsigned nbits)
{
    uint32_t v = 0;
    while (nbits-- > 0) {
        d->range >>= 1;
        uint32_t bit = d->code >= d->range;
        if (bit) d->code -= d->range;
        v = v << 1 | bit;
        while (d->range < TOP) {
            d->range <<= 8;
            d->code = d->code << 8 | get(d);
        }
    }
    return v;
}

int kvs_coef_decode(const uint8_t *in, size_t n, size_t rows, size_t cols, const uint8_t *cls,
                    float *out, const char *what)
{
    if (n < 5 || in[0] != 0)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: coefficient stream damaged: %zu bytes, first byte %u (a "
                             "stream is at least 5 bytes and starts with 0)",
                             what, n, n ? in[0] : 0u);
    dec d = {0xFFFFFFFFu, 0, in, 1, n, 0};
    for (int i = 0; i < 4; i++) d.code = d.code << 8 | get(&d);
    if (d.code == 0xFFFFFFFFu)
        return kvs_set_error(KVS_ECORRUPT, "%s: coefficient stream damaged: bad start code",
                             what);
    class_probs probs[KVS_COEF_CLASSES][PREV_CONTEXTS];
    for (int c = 0; c < KVS_COEF_CLASSES; c++)
        for (int k = 0; k < PREV_CONTEXTS; k++) probs_init(&probs[c][k]);
    for (size_t r = 0; r < rows && !d.overrun; r++) {
        float *row = out + r * cols;
        for (size_t j = 0; j < cols; j++) {
            unsigned ctx = r ? prev_context((int32_t)(row - cols)[j]) : 0;
            class_probs *p = &probs[cls[j] % KVS_COEF_CLASSES][ctx];
            if (!dec_bit(&d, &p->zero)) {
                row[j] = 0.0f;
                continue;
            }
            uint32_t negative = dec_direct(&d, 1);
            unsigned len = 1;
            while (len < LEN_MAX && dec_bit(&d, &p->longer[len])) len++;
            uint32_t m = 1;
            if (len >= 2) {
                unsigned b1 = dec_bit(&d, &p->below[len - 1][0]);
                m = 2u | b1;
                if (len >= 3) {
                    m = m << 1 | dec_bit(&d, &p->below[len - 1][1 + b1]);
                    if (len >= 4) m = m << (len - 3) | dec_direct(&d, len - 3);
                }
            }
            row[j] = negative ? -(float)m : (float)m;
        }
    }
    if (d.overrun)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: coefficient stream damaged: its %zu bytes end before the "
                             "last of %zu x %zu coefficients",
                             what, n, rows, cols);
    if (d.pos != n)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: coefficient stream damaged: %zu of its %zu bytes are left "
                             "after the last coefficient",
                             what, n - d.pos, n);
    return KVS_OK;
}
