/* coef_coder.c - the adaptive binary range coder of the transform stage's
 * coefficients (coef_coder.h). The range coder is LZMA's: a 32-bit range,
 * a 64-bit low whose carry is propagated through one cached byte, 11-bit
 * probabilities adapted by 1/32 of the distance after each bit. The
 * encoder's output and the decoder's input are the same number of bytes
 * (5 flushed + one per renormalisation), which is what lets the decoder
 * refuse a stream with bytes left over. */
#include "codecs/coef_coder.h"

#include <math.h>
#include <string.h>

#include "kvserde/error.h"

#define PROB_BITS 11
#define PROB_ONE (1u << PROB_BITS)
#define MOVE_BITS 5
#define TOP (1u << 24)
#define LEN_MAX 16 /* bit lengths 1..16 of |q| <= 65535 */

/* The adaptive probabilities of one context class: that a coefficient is
 * zero; for each bit length so far, that it is longer; for each bit length,
 * that the bit below the leading one is set. */
typedef struct class_probs {
    uint16_t zero;
    uint16_t longer[LEN_MAX];
    uint16_t second[LEN_MAX];
} class_probs;

static void probs_init(class_probs *p)
{
    p->zero = PROB_ONE / 2;
    for (int i = 0; i < LEN_MAX; i++) p->longer[i] = p->second[i] = PROB_ONE / 2;
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

static void enc_bit(enc *e, uint16_t *p, unsigned bit)
{
    uint32_t bound = (e->range >> PROB_BITS) * *p;
    if (bit == 0) {
        e->range = bound;
        *p = (uint16_t)(*p + ((PROB_ONE - *p) >> MOVE_BITS));
    } else {
        e->low += bound;
        e->range -= bound;
        *p = (uint16_t)(*p - (*p >> MOVE_BITS));
    }
    while (e->range < TOP) {
        e->range <<= 8;
        shift_low(e);
    }
}

static void enc_direct(enc *e, uint32_t value, unsigned nbits)
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

static unsigned bit_length(uint32_t m)
{
    unsigned e = 0;
    while (m >> e) e++;
    return e;
}

int kvs_coef_encode(const int32_t *q, size_t rows, size_t cols, const uint8_t *cls,
                    uint8_t *out, size_t cap, size_t *n)
{
    class_probs probs[KVS_COEF_CLASSES];
    for (int c = 0; c < KVS_COEF_CLASSES; c++) probs_init(&probs[c]);
    enc e = {0, 0xFFFFFFFFu, 0, 1, out, 0, cap, 0};
    for (size_t r = 0; r < rows && !e.full; r++) {
        const int32_t *row = q + r * cols;
        for (size_t j = 0; j < cols; j++) {
            class_probs *p = &probs[cls[j] % KVS_COEF_CLASSES];
            int32_t v = row[j];
            if (v > KVS_COEF_MAX) v = KVS_COEF_MAX;
            if (v < -KVS_COEF_MAX) v = -KVS_COEF_MAX;
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
                enc_bit(&e, &p->second[len - 1], (m >> (len - 2)) & 1u);
                if (len >= 3) enc_direct(&e, m & ((1u << (len - 2)) - 1u), len - 2);
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

static uint8_t get(dec *d)
{
    if (d->pos < d->n) return d->in[d->pos++];
    d->overrun = 1;
    return 0;
}

static unsigned dec_bit(dec *d, uint16_t *p)
{
    uint32_t bound = (d->range >> PROB_BITS) * *p;
    unsigned bit;
    if (d->code < bound) {
        d->range = bound;
        *p = (uint16_t)(*p + ((PROB_ONE - *p) >> MOVE_BITS));
        bit = 0;
    } else {
        d->code -= bound;
        d->range -= bound;
        *p = (uint16_t)(*p - (*p >> MOVE_BITS));
        bit = 1;
    }
    while (d->range < TOP) {
        d->range <<= 8;
        d->code = d->code << 8 | get(d);
    }
    return bit;
}

static uint32_t dec_direct(dec *d, unsigned nbits)
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
    class_probs probs[KVS_COEF_CLASSES];
    for (int c = 0; c < KVS_COEF_CLASSES; c++) probs_init(&probs[c]);
    for (size_t r = 0; r < rows && !d.overrun; r++) {
        float *row = out + r * cols;
        for (size_t j = 0; j < cols; j++) {
            class_probs *p = &probs[cls[j] % KVS_COEF_CLASSES];
            if (!dec_bit(&d, &p->zero)) {
                row[j] = 0.0f;
                continue;
            }
            uint32_t negative = dec_direct(&d, 1);
            unsigned len = 1;
            while (len < LEN_MAX && dec_bit(&d, &p->longer[len])) len++;
            uint32_t m = 1;
            if (len >= 2) {
                m = 2u | dec_bit(&d, &p->second[len - 1]);
                if (len >= 3) m = m << (len - 2) | dec_direct(&d, len - 2);
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
