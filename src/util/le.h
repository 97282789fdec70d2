/* le.h - internal: little-endian fixed-width fields at any alignment on
 * any host, for the byte formats kvserde writes and parses (frames,
 * kv_split blobs, stage payloads). A little-endian host moves a field as
 * one load or store (memcpy: GCC does not make one of the byte loops at
 * -O2); any other host goes byte by byte. */
#ifndef KVSERDE_UTIL_LE_H
#define KVSERDE_UTIL_LE_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KVS_LE_HOST 1
#else
#define KVS_LE_HOST 0
#endif

static inline void put_le16(uint8_t *p, uint16_t v)
{
    if (KVS_LE_HOST) {
        memcpy(p, &v, 2);
        return;
    }
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void put_le32(uint8_t *p, uint32_t v)
{
    if (KVS_LE_HOST) {
        memcpy(p, &v, 4);
        return;
    }
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
    if (KVS_LE_HOST) {
        memcpy(p, &v, 8);
        return;
    }
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t get_le16(const uint8_t *p)
{
    uint16_t v;
    if (KVS_LE_HOST) {
        memcpy(&v, p, 2);
        return v;
    }
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t get_le32(const uint8_t *p)
{
    uint32_t v = 0;
    if (KVS_LE_HOST) {
        memcpy(&v, p, 4);
        return v;
    }
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static inline uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    if (KVS_LE_HOST) {
        memcpy(&v, p, 8);
        return v;
    }
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

#endif /* KVSERDE_UTIL_LE_H */
