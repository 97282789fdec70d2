/* crc32c.h - internal: CRC-32C (Castagnoli), the checksum of iSCSI, ext4
 * and SSE4.2's crc32 instruction.
 *
 * Polynomial 0x1EDC6F41 (reflected 0x82F63B78), initial value and final xor
 * 0xFFFFFFFF, bits processed LSB first: crc32c("123456789") = 0xE3069283.
 *
 * The running-value convention is zlib's: start with 0 and feed the buffer
 * in pieces of any size, each call taking the previous result:
 *     uint32_t c = kvs_crc32c(0, a, alen);
 *     c = kvs_crc32c(c, b, blen);      == kvs_crc32c(0, a||b, alen + blen)
 *
 * The implementation is chosen once, at first use: the SSE4.2 crc32
 * instruction (three interleaved streams, merged with precomputed
 * zero-extension tables) when the CPU has it, else a portable slicing-by-8
 * table version. Both give the same value for every input. Thread-safe.
 */
#ifndef KVSERDE_UTIL_CRC32C_H
#define KVSERDE_UTIL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of buf[0..len) continued from `crc` (0 to start). buf may be
 * NULL when len is 0. */
uint32_t kvs_crc32c(uint32_t crc, const void *buf, size_t len);

/* The same, always through the portable table code (for tests). */
uint32_t kvs_crc32c_portable(uint32_t crc, const void *buf, size_t len);

/* The implementation kvs_crc32c() uses: "sse4.2" or "table". */
const char *kvs_crc32c_impl(void);

/* ---- shared between crc32c.c and crc32c_sse42.c ---------------------- */

/* Tables that advance a raw (un-inverted) CRC register over n zero bytes:
 * shift(zeros, crc) = the register after feeding n zero bytes to `crc`. */
typedef struct kvs_crc32c_shift_table {
    uint32_t t[4][256];
} kvs_crc32c_shift_table;

/* The stream lengths the SSE4.2 code interleaves, and the tables for them
 * (filled once by the dispatcher before the SSE4.2 code is used). */
#define KVS_CRC32C_LONG 8192
#define KVS_CRC32C_SHORT 256
extern kvs_crc32c_shift_table kvs_crc32c_long_shift;
extern kvs_crc32c_shift_table kvs_crc32c_short_shift;

static inline uint32_t kvs_crc32c_shift(const kvs_crc32c_shift_table *z, uint32_t crc)
{
    return z->t[0][crc & 0xFF] ^ z->t[1][(crc >> 8) & 0xFF] ^
           z->t[2][(crc >> 16) & 0xFF] ^ z->t[3][crc >> 24];
}

/* The SSE4.2 implementation (crc32c_sse42.c); only call it when the CPU has
 * SSE4.2 and the shift tables are filled. Absent from non-x86 builds. */
uint32_t kvs_crc32c_sse42(uint32_t crc, const void *buf, size_t len);

#endif /* KVSERDE_UTIL_CRC32C_H */
