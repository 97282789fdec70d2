/* crc32c_sse42.c - CRC-32C with the SSE4.2 crc32 instruction.
 *
 * The instruction has a latency of 3 cycles and a throughput of 1, so one
 * dependent chain runs at a third of its speed. Large buffers are therefore
 * cut into three consecutive streams of equal length that are checksummed in
 * the same loop (three independent chains); the second and third results are
 * merged in with the precomputed tables that advance a CRC over that many
 * zero bytes (CRC is linear: crc(A||B) = shift(crc(A), |B|) ^ crc(B) for
 * raw registers). This is the scheme of Mark Adler's crc32c.c.
 *
 * Only this file uses the instruction; it is compiled for SSE4.2 through the
 * target attribute, and the dispatcher in crc32c.c calls it only when the
 * CPU reports SSE4.2.
 */
#include "util/crc32c.h"

#if KVS_HAVE_X86
#include <nmmintrin.h>
#include <string.h>

#define TARGET __attribute__((target("sse4.2")))

TARGET static inline uint64_t load64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Three streams of `block` bytes each from p, merged into crc. */
TARGET static inline uint64_t three_way(uint64_t crc0, const unsigned char *p,
                                        size_t block,
                                        const kvs_crc32c_shift_table *shift)
{
    uint64_t crc1 = 0, crc2 = 0;
    const unsigned char *end = p + block;
    do {
        crc0 = _mm_crc32_u64(crc0, load64(p));
        crc1 = _mm_crc32_u64(crc1, load64(p + block));
        crc2 = _mm_crc32_u64(crc2, load64(p + 2 * block));
        p += 8;
    } while (p < end);
    crc0 = kvs_crc32c_shift(shift, (uint32_t)crc0) ^ crc1;
    crc0 = kvs_crc32c_shift(shift, (uint32_t)crc0) ^ crc2;
    return crc0;
}

TARGET uint32_t kvs_crc32c_sse42(uint32_t crc, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    uint64_t c = (uint32_t)~crc;
    /* Align to 8 bytes so the 64-bit loads do not straddle lines. */
    while (len && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        len--;
    }
    while (len >= 3 * KVS_CRC32C_LONG) {
        c = three_way(c, p, KVS_CRC32C_LONG, &kvs_crc32c_long_shift);
        p += 3 * KVS_CRC32C_LONG;
        len -= 3 * KVS_CRC32C_LONG;
    }
    while (len >= 3 * KVS_CRC32C_SHORT) {
        c = three_way(c, p, KVS_CRC32C_SHORT, &kvs_crc32c_short_shift);
        p += 3 * KVS_CRC32C_SHORT;
        len -= 3 * KVS_CRC32C_SHORT;
    }
    for (; len >= 8; len -= 8, p += 8) c = _mm_crc32_u64(c, load64(p));
    while (len--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return ~(uint32_t)c;
}
#endif /* KVS_HAVE_X86 */
