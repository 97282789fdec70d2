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
 * kvs_crc32c is ISA-L's crc32_iscsi (Debian libisal: run-time dispatch to
 * the CPU's fastest folding code); kvs_crc32c_portable is a slicing-by-8
 * table version kept as an independent reference for the tests. Both give
 * the same value for every input. Thread-safe.
 */
#ifndef KVSERDE_UTIL_CRC32C_H
#define KVSERDE_UTIL_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of buf[0..len) continued from `crc` (0 to start). buf may be
 * NULL when len is 0. */
uint32_t kvs_crc32c(uint32_t crc, const void *buf, size_t len);

/* The CRC-32C of a||b from crc_a = kvs_crc32c(0, a, alen), crc_b =
 * kvs_crc32c(0, b, len_b) and b's length alone (zlib's crc32_combine):
 * a producer that checksums a part while it is in cache but must feed the
 * parts before it first (the int stage's codes come after its scales) adds
 * the part later by its value, without reading it again. */
uint32_t kvs_crc32c_combine(uint32_t crc_a, uint32_t crc_b, size_t len_b);

/* The same, always through the portable table code (for tests). */
uint32_t kvs_crc32c_portable(uint32_t crc, const void *buf, size_t len);

/* The implementation kvs_crc32c() uses: "isa-l". */
const char *kvs_crc32c_impl(void);

#endif /* KVSERDE_UTIL_CRC32C_H */
