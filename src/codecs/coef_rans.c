/* coef_rans.c - the static-table rANS coder of the transform stage's
 * coefficients (coef_rans.h): symbols and raw bits out of the values, the
 * symbols through rans.h with one context per column class. */
#include "codecs/coef_rans.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/coef_rans_kernels.h"
#include "codecs/rans.h"
#include "codecs/rans_kernels.h"
#include "kvserde/error.h"
#include "util/le.h"

#define EXACT (1u << KVS_COEF_EXACT_BITS)
#define EXACT_SYMS (2 * EXACT - 1)
#define NSYM (KVS_COEF_ESCAPE + 1)
#define LEN_WORD 4
_Static_assert(KVS_COEF_RANS_CLASSES <= KVS_RANS_MAX_CTX, "one rANS context per class");
_Static_assert(NSYM <= 256, "byte symbols");

/* The coding tables of every class and, per symbol, the magnitude its raw
 * bits are added to, their count and its sign: built once (integer
 * arithmetic on the generated constants, the same on every machine). */
static kvs_rans_enc_tables enc_tables;
static kvs_rans_dec_tables dec_tables;
static int32_t sym_base[NSYM]; /* signed: -m for a negative symbol */
static int32_t sym_dir[NSYM];  /* +1 or -1: the raw bits add to the magnitude */
static uint8_t sym_raw[NSYM];
/* The AVX-512 kernels' look-ups (coef_rans_kernels.h): each class's coded
 * range, and each symbol's decoder entry, 256 (a gather's index is a
 * byte; those above the escape are escapes, never decoded). */
static uint32_t range_of[KVS_COEF_RANS_CLASSES];
static int ranges_exact; /* every class's table codes exactly its range and the escape */
static uint32_t entry_of[256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void)
{
    static kvs_rans_freqs t[KVS_COEF_RANS_CLASSES];
    for (unsigned c = 0; c < KVS_COEF_RANS_CLASSES; c++)
        for (unsigned s = 0; s < 256; s++) t[c].f[s] = s < NSYM ? kvs_coef_freq[c][s] : 0;
    kvs_rans_enc_init(&enc_tables, t, KVS_COEF_RANS_CLASSES);
    kvs_rans_dec_init(&dec_tables, t, KVS_COEF_RANS_CLASSES);
    sym_dir[0] = 1;
    for (int32_t m = 1; m < (int32_t)EXACT; m++) {
        sym_base[2 * m - 1] = m;
        sym_base[2 * m] = -m;
        sym_dir[2 * m - 1] = 1;
        sym_dir[2 * m] = -1;
    }
    for (unsigned s = EXACT_SYMS; s < KVS_COEF_ESCAPE; s++) {
        unsigned b = (s - EXACT_SYMS) / 2, e = b / (1u << KVS_COEF_MANT_BITS) +
                                                KVS_COEF_EXACT_BITS + 1; /* bit length */
        unsigned low = e - 1 - KVS_COEF_MANT_BITS;
        int32_t m = (int32_t)(1u << (e - 1) | (b % (1u << KVS_COEF_MANT_BITS)) << low);
        sym_dir[s] = (s - EXACT_SYMS) & 1 ? -1 : 1;
        sym_base[s] = sym_dir[s] * m;
        sym_raw[s] = (uint8_t)low;
    }
    sym_raw[KVS_COEF_ESCAPE] = KVS_COEF_ESCAPE_RAW;
    sym_dir[KVS_COEF_ESCAPE] = 1;
    for (unsigned s = 0; s < 256; s++) {
        uint32_t m = s < NSYM ? (uint32_t)(sym_base[s] < 0 ? -sym_base[s] : sym_base[s]) : 0;
        entry_of[s] = s < KVS_COEF_ESCAPE ? sym_raw[s] | (sym_dir[s] < 0 ? KVS_COEF_ENTRY_NEG : 0) |
                                                m << 8
                                          : KVS_COEF_ENTRY_ESCAPE;
    }
    /* The generated tables each code one range of symbols (from 0, or from
     * a bucket for the widest classes) and the escape; the AVX-512 escape
     * test relies on it, so a table with a gap leaves encoding scalar. */
    ranges_exact = 1;
    for (unsigned c = 0; c < KVS_COEF_RANS_CLASSES; c++) {
        unsigned lo = 0, hi = 0;
        while (lo < KVS_COEF_ESCAPE && kvs_coef_freq[c][lo] == 0) lo++;
        for (unsigned s = lo; s < KVS_COEF_ESCAPE; s++)
            if (kvs_coef_freq[c][s]) hi = s;
        for (unsigned s = lo; s <= hi; s++) ranges_exact &= kvs_coef_freq[c][s] != 0;
        range_of[c] = lo | hi << 8;
    }
}

/* The symbol of v (|v| <= KVS_COEF_RANS_MAX) and, in *raw / *nraw, the bits
 * below its bucket. Without branches: whether a value is exact or in a
 * bucket is what the data decides, and the jumps were mispredicted. */
static inline unsigned symbol_of(int32_t v, uint32_t *raw, unsigned *nraw)
{
    uint32_t m = (uint32_t)(v < 0 ? -v : v), neg = v < 0, big = m >= EXACT;
    unsigned e = 32u - (unsigned)__builtin_clz(m | 1), low = big ? e - 1 - KVS_COEF_MANT_BITS : 0;
    unsigned b = (e - KVS_COEF_EXACT_BITS - 1) * (1u << KVS_COEF_MANT_BITS) +
                 (m >> low & ((1u << KVS_COEF_MANT_BITS) - 1));
    unsigned exact = m ? 2 * m - 1 + neg : 0;
    *nraw = low;
    *raw = m & ((1u << low) - 1);
    return big ? EXACT_SYMS + 2 * b + neg : exact;
}

/* ---- the raw bit stream ----------------------------------------------
 * Both ends move whole 64-bit words (no loop per byte, no branch per value
 * on the writer): the writer stores 8 bytes where it stands (its buffer has
 * 8 to spare) and moves on by the whole bytes it filled; the reader tops
 * up to 56-63 bits with one load while 8 bytes remain, byte by byte after. */

typedef struct bit_writer {
    uint64_t acc;
    unsigned count; /* bits in acc, below 8 after each put */
    uint8_t *out;
    size_t pos;
} bit_writer;

static inline void bits_put(bit_writer *w, uint32_t v, unsigned n)
{
    w->acc |= (uint64_t)v << w->count;
    w->count += n;
    put_le64(w->out + w->pos, w->acc);
    w->pos += w->count >> 3;
    w->acc >>= w->count & ~7u;
    w->count &= 7;
}

/* The last bits, and the zeros after them up to a whole byte. */
static void bits_flush(bit_writer *w)
{
    if (w->count) w->out[w->pos++] = (uint8_t)w->acc;
    w->acc = 0;
    w->count = 0;
}

typedef struct bit_reader {
    uint64_t acc;
    unsigned count; /* bits in acc */
    const uint8_t *in;
    size_t pos, n;
} bit_reader;

static inline void bits_refill(bit_reader *r)
{
    if (r->n - r->pos >= 8) {
        r->acc |= get_le64(r->in + r->pos) << r->count;
        r->pos += (63 - r->count) >> 3;
        r->count |= 56;
        return;
    }
    while (r->count <= 56 && r->pos < r->n) {
        r->acc |= (uint64_t)r->in[r->pos++] << r->count;
        r->count += 8;
    }
}

#if KVS_HAVE_X86
/* Move to bit `at` (at most the stream's bits), where a vector kernel
 * left off. */
static void bits_seek(bit_reader *r, size_t at)
{
    r->pos = at / 8;
    r->acc = 0;
    r->count = 0;
    bits_refill(r);
    r->acc >>= at % 8;
    r->count -= (unsigned)(at % 8);
}
#endif

/* n <= 16 bits, or -1 when the stream has fewer left. */
static inline int32_t bits_get(bit_reader *r, unsigned n)
{
    if (r->count < 16) bits_refill(r);
    if (r->count < n) return -1;
    int32_t v = (int32_t)(r->acc & ((1u << n) - 1));
    r->acc >>= n;
    r->count -= n;
    return v;
}

/* ---- the column classes, first in the raw bits ----------------------
 * The columns come in the basis's order, largest variance first, so a
 * class is mostly its predecessor's or a little below: the first class in
 * 6 bits, then each one's difference from the one before, zigzagged (down
 * d -> 2d, up d -> 2d - 1) and written as an order-0 Exp-Golomb code (the
 * bit length of z + 1 in unary, then its bits below the leading one): about
 * 2-3 bits a class where a byte took 8, 1% of xform-1b's rate. */
#define CLASS_BITS 6
#define CLASS_LEN_MAX 8 /* bit length of a zigzagged difference + 1, <= 2 x 63 + 1 */
_Static_assert(KVS_COEF_RANS_CLASSES == 1 << CLASS_BITS, "a class in 6 bits");

static void classes_put(bit_writer *w, const uint8_t *cls, size_t cols)
{
    bits_put(w, cls[0], CLASS_BITS);
    for (size_t k = 1; k < cols; k++) {
        int d = (int)cls[k - 1] - (int)cls[k];
        uint32_t z = (uint32_t)(d >= 0 ? 2 * d : -2 * d - 1) + 1;
        unsigned len = 32u - (unsigned)__builtin_clz(z);
        bits_put(w, 1u << (len - 1), len); /* len - 1 zeros, then the leading 1 */
        bits_put(w, z & ((1u << (len - 1)) - 1), len - 1);
    }
}

/* The classes of cols columns into cls; KVS_ECORRUPT naming `what`. */
static int classes_get(bit_reader *r, uint8_t *cls, size_t cols, const char *what)
{
    int32_t c = bits_get(r, CLASS_BITS);
    for (size_t k = 0; c >= 0 && k < cols; k++) {
        if (k) {
            unsigned len = 1;
            int32_t bit;
            while ((bit = bits_get(r, 1)) == 0 && len < CLASS_LEN_MAX) len++;
            if (bit == 0)
                return kvs_set_error(KVS_ECORRUPT,
                                     "%s: coefficient stream damaged: component %zu's class "
                                     "code is longer than %d bits",
                                     what, k, 2 * CLASS_LEN_MAX - 1);
            int32_t low = bit == 1 ? bits_get(r, len - 1) : -1;
            if (low < 0) {
                c = -1;
                break;
            }
            int32_t z = (1 << (len - 1) | low) - 1;
            c = (int32_t)cls[k - 1] - (z & 1 ? -(z + 1) / 2 : z / 2);
            if (c < 0 || c >= KVS_COEF_RANS_CLASSES)
                return kvs_set_error(KVS_ECORRUPT,
                                     "%s: coefficient stream damaged: component %zu has class "
                                     "%d, at most %d",
                                     what, k, (int)c, KVS_COEF_RANS_CLASSES - 1);
        }
        cls[k] = (uint8_t)c;
    }
    if (c < 0)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: coefficient stream damaged: its %zu raw bytes end in the "
                             "classes of its %zu components",
                             what, r->n, cols);
    return KVS_OK;
}

/* ---- encode ---------------------------------------------------------- */

void kvs_coef_rans_row_scalar(const int32_t *row, size_t j0, size_t cols, const uint8_t *cls,
                              uint8_t *srow, uint32_t *pending, size_t *k)
{
    size_t n = *k;
    for (size_t j = j0; j < cols; j++) {
        int32_t v = row[j];
        v = v > KVS_COEF_RANS_MAX ? KVS_COEF_RANS_MAX : v;
        v = v < -KVS_COEF_RANS_MAX ? -KVS_COEF_RANS_MAX : v;
        uint32_t bits;
        unsigned nbits, s = symbol_of(v, &bits, &nbits);
        int escape = kvs_coef_freq[cls[j]][s] == 0; /* beyond the class's table */
        uint32_t esc_bits = (uint32_t)(v < 0 ? -v : v) | (uint32_t)(v < 0) << 15;
        s = escape ? KVS_COEF_ESCAPE : s;
        bits = escape ? esc_bits : bits;
        nbits = escape ? KVS_COEF_ESCAPE_RAW : nbits;
        srow[j] = (uint8_t)s;
        pending[n] = bits | nbits << 16;
        n += nbits != 0;
    }
    *k = n;
}


int kvs_coef_rans_encode(const int32_t *q, size_t rows, size_t cols, const uint8_t *cls,
                         uint8_t *out, size_t cap, size_t *n)
{
    pthread_once(&tables_once, tables_init);
    size_t count = rows * cols, bound = kvs_rans_bound(count);
    /* symbols, their contexts, the rANS stream, the raw bits (the classes,
     * then at most 16 a coefficient) and a row's raw codes */
    size_t rawcap = 2 * count + 2 * cols + 8;
    uint8_t *buf = malloc(2 * count + bound + rawcap + 4 * cols);
    if (buf == NULL)
        return kvs_set_error(KVS_ENOMEM, "transform: out of memory coding %zu coefficients",
                             count);
    uint32_t *pending = (uint32_t *)(void *)buf; /* first: malloc's alignment */
    uint8_t *sym = buf + 4 * cols, *ctx = sym + count, *stream = ctx + count, *raw = stream + bound;
    bit_writer w = {0, 0, raw, 0};
    if (cols) classes_put(&w, cls, cols);
    /* A row at a time: the symbols and the raw codes of the coefficients
     * that have raw bits (coef_rans_kernels.h), then those codes into the
     * bit stream, whose dependency chain (the bit count) the coefficients
     * without raw bits stay out of. */
    for (size_t r = 0; r < rows; r++) {
        const int32_t *row = q + r * cols;
        memcpy(ctx + r * cols, cls, cols);
        size_t k = 0, j = 0;
#if KVS_HAVE_X86
        if (ranges_exact && kvs_rans_avx512_in_use())
            j = kvs_coef_rans_row_avx512(row, cols, cls, range_of, sym + r * cols, pending, &k);
#endif
        kvs_coef_rans_row_scalar(row, j, cols, cls, sym + r * cols, pending, &k);
        for (size_t i = 0; i < k; i++) bits_put(&w, pending[i] & 0xFFFF, pending[i] >> 16);
    }
    bits_flush(&w);
    size_t len = 0;
    int rc = kvs_rans_encode(&enc_tables, sym, ctx, count, stream, bound, &len);
    if (rc == KVS_OK && (len > UINT32_MAX || LEN_WORD + len + w.pos > cap)) rc = KVS_ENOSPC;
    if (rc == KVS_OK) {
        put_le32(out, (uint32_t)len);
        memcpy(out + LEN_WORD, stream, len);
        memcpy(out + LEN_WORD + len, raw, w.pos);
        *n = LEN_WORD + len + w.pos;
    }
    free(buf);
    return rc;
}

/* ---- decode ---------------------------------------------------------- */

/* Coefficient value *out of symbol s in class c, its raw bits from r: 0;
 * 1 when the raw bits run out; 2 + 0x8000 + v for an escape of v that the
 * class codes itself (v = 0 for -0). */
static inline int decode_one(bit_reader *r, unsigned s, unsigned c, float *out)
{
    int32_t bits = bits_get(r, sym_raw[s]); /* 0 bits for most */
    if (bits < 0) return 1;
    if (s == KVS_COEF_ESCAPE) {
        int32_t v = bits & 0x7FFF;
        v = bits >> 15 ? -v : v;
        uint32_t ignored;
        unsigned nb, natural = symbol_of(v, &ignored, &nb);
        if (kvs_coef_freq[c][natural] != 0 || bits == 0x8000)
            return 2 + 0x8000 + (bits == 0x8000 ? 0 : v);
        *out = (float)v;
        return 0;
    }
    *out = (float)(sym_base[s] + sym_dir[s] * bits);
    return 0;
}


int kvs_coef_rans_decode(const uint8_t *in, size_t n, size_t rows, size_t cols,
                         uint8_t *cls, float *out, const char *what)
{
    pthread_once(&tables_once, tables_init);
    if (n < LEN_WORD)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: coefficient stream damaged: %zu bytes, shorter than its "
                             "%d-byte length",
                             what, n, LEN_WORD);
    size_t len = get_le32(in);
    if (len > n - LEN_WORD)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: coefficient stream damaged: its rANS stream of %zu bytes runs "
                             "past the %zu-byte stream",
                             what, len, n);
    size_t count = rows * cols;
    uint8_t *buf = malloc(2 * count + 1);
    if (buf == NULL)
        return kvs_set_error(KVS_ENOMEM, "transform: out of memory decoding %zu coefficients",
                             count);
    uint8_t *sym = buf, *ctx = buf + count;
    bit_reader br = {0, 0, in + LEN_WORD + len, 0, n - LEN_WORD - len};
    int rc = cols ? classes_get(&br, cls, cols, what) : KVS_OK;
    for (size_t r = 0; rc == KVS_OK && r < rows; r++) memcpy(ctx + r * cols, cls, cols);
    if (rc == KVS_OK) rc = kvs_rans_decode(&dec_tables, in + LEN_WORD, len, ctx, sym, count, what);
#if KVS_HAVE_X86
    int simd = kvs_rans_avx512_in_use();
#endif
    /* The matrix as one run of coefficients (rows are contiguous in sym
     * and out), j following i's column for its class. */
    for (size_t i = 0, j = 0; rc == KVS_OK && i < count;) {
        size_t stop = count;
#if KVS_HAVE_X86
        /* groups of 16 by vector; the one it stops at here */
        if (simd) {
            size_t at = br.pos * 8 - br.count, from = i;
            i = kvs_coef_rans_values_avx512(sym, i, count, entry_of, br.in, br.n, &at, out);
            if (i != from) {
                bits_seek(&br, at);
                j = (j + i - from) % cols;
            }
            stop = i + 16 < count ? i + 16 : count;
        }
#endif
        for (; i < stop; i++) {
            rc = decode_one(&br, sym[i], cls[j], &out[i]);
            if (rc) {
                rc = rc == 1 ? kvs_set_error(KVS_ECORRUPT,
                                             "%s: coefficient stream damaged: its %zu raw "
                                             "bytes end at coefficient %zu of %zu x %zu",
                                             what, br.n, i, rows, cols)
                             : kvs_set_error(KVS_ECORRUPT,
                                             "%s: coefficient stream damaged: coefficient "
                                             "%zu escapes %d, which class %u codes without "
                                             "escape",
                                             what, i, rc - 2 - 0x8000, cls[j]);
                break;
            }
            if (++j == cols) j = 0;
        }
    }
    if (rc == KVS_OK) {
        size_t used = br.pos * 8 - br.count; /* raw bits consumed */
        if ((used + 7) / 8 != br.n || (br.count && br.acc != 0))
            rc = kvs_set_error(KVS_ECORRUPT,
                               "%s: coefficient stream damaged: %zu raw bytes, the "
                               "coefficients use %zu bits%s",
                               what, br.n, used,
                               (used + 7) / 8 == br.n ? " and the rest are not 0" : "");
    }
    free(buf);
    return rc;
}
