/* crc32c.c - CRC-32C: the portable slicing-by-8 code, the zero-extension
 * tables the SSE4.2 code merges its streams with, and the run-time choice
 * between the two.
 *
 * All tables are computed once, on first use (pthread_once), and are
 * read-only afterwards.
 */
#include <pthread.h>
#include <string.h>

#include "util/crc32c.h"

#define POLY 0x82F63B78u /* 0x1EDC6F41 bit-reversed: the LSB-first form */

static uint32_t table[8][256]; /* slicing-by-8 */
kvs_crc32c_shift_table kvs_crc32c_long_shift;
kvs_crc32c_shift_table kvs_crc32c_short_shift;

static uint32_t (*active)(uint32_t, const void *, size_t);
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

#if KVS_HAVE_X86 /* the SSE4.2 path's tables; nothing else needs them */
/* ---- GF(2) operators for appending zeros ------------------------------
 * A CRC register is a vector over GF(2); feeding it one zero bit is a
 * linear map, a 32x32 bit matrix (one uint32_t column per input bit).
 * Squaring the matrix doubles the number of zero bits it feeds. */

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
    uint32_t sum = 0;
    for (; vec; vec >>= 1, mat++)
        if (vec & 1) sum ^= *mat;
    return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat)
{
    for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* The operator feeding `len` zero bytes (len a power of two, >= 1). */
static void zeros_op(uint32_t *op, size_t len)
{
    uint32_t a[32], b[32];
    a[0] = POLY; /* one zero bit: shift right, xor POLY if bit 0 was set */
    for (int n = 1; n < 32; n++) a[n] = 1u << (n - 1);
    gf2_square(b, a); /* 2 bits */
    gf2_square(a, b); /* 4 bits */
    gf2_square(b, a); /* 8 bits = 1 byte */
    uint32_t *cur = b, *other = a;
    for (; len > 1; len >>= 1) {
        gf2_square(other, cur);
        uint32_t *t = cur;
        cur = other;
        other = t;
    }
    memcpy(op, cur, sizeof a);
}

static void build_shift(kvs_crc32c_shift_table *z, size_t len)
{
    uint32_t op[32];
    zeros_op(op, len);
    for (uint32_t n = 0; n < 256; n++) {
        z->t[0][n] = gf2_times(op, n);
        z->t[1][n] = gf2_times(op, n << 8);
        z->t[2][n] = gf2_times(op, n << 16);
        z->t[3][n] = gf2_times(op, n << 24);
    }
}

#endif /* KVS_HAVE_X86 */

/* ---- portable -------------------------------------------------------- */

static void build_tables(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int k = 1; k < 8; k++)
            table[k][n] = (table[k - 1][n] >> 8) ^ table[0][table[k - 1][n] & 0xFF];
}

static uint32_t load_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static uint32_t crc32c_table(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    for (; len >= 8; len -= 8, p += 8) {
        uint32_t lo = load_le32(p) ^ c, hi = load_le32(p + 4);
        c = table[7][lo & 0xFF] ^ table[6][(lo >> 8) & 0xFF] ^
            table[5][(lo >> 16) & 0xFF] ^ table[4][lo >> 24] ^
            table[3][hi & 0xFF] ^ table[2][(hi >> 8) & 0xFF] ^
            table[1][(hi >> 16) & 0xFF] ^ table[0][hi >> 24];
    }
    while (len--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xFF];
    return ~c;
}

/* ---- dispatch --------------------------------------------------------- */

#if KVS_HAVE_X86
static int cpu_has_sse42(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}
#endif

static void init(void)
{
    build_tables();
    active = crc32c_table;
#if KVS_HAVE_X86
    if (cpu_has_sse42()) {
        build_shift(&kvs_crc32c_long_shift, KVS_CRC32C_LONG);
        build_shift(&kvs_crc32c_short_shift, KVS_CRC32C_SHORT);
        active = kvs_crc32c_sse42;
    }
#endif
}

uint32_t kvs_crc32c(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&init_once, init);
    return len ? active(crc, buf, len) : crc;
}

uint32_t kvs_crc32c_portable(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&init_once, init);
    return len ? crc32c_table(crc, buf, len) : crc;
}

const char *kvs_crc32c_impl(void)
{
    pthread_once(&init_once, init);
    return active == crc32c_table ? "table" : "sse4.2";
}
