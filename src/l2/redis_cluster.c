/* redis_cluster.c - Redis Cluster key slots, redirections and slot maps
 * (see redis_cluster.h). Pure functions: no I/O, no state. */
#include "l2/redis_cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* crc16 table for polynomial 0x1021 (generated: t[i] = the CRC of byte i
 * shifted into the high half). */
static const uint16_t crc16_table[256] = {
    0x0000, 0x1021, 0x2042, 0x3063, 0x4084, 0x50a5, 0x60c6, 0x70e7,
    0x8108, 0x9129, 0xa14a, 0xb16b, 0xc18c, 0xd1ad, 0xe1ce, 0xf1ef,
    0x1231, 0x0210, 0x3273, 0x2252, 0x52b5, 0x4294, 0x72f7, 0x62d6,
    0x9339, 0x8318, 0xb37b, 0xa35a, 0xd3bd, 0xc39c, 0xf3ff, 0xe3de,
    0x2462, 0x3443, 0x0420, 0x1401, 0x64e6, 0x74c7, 0x44a4, 0x5485,
    0xa56a, 0xb54b, 0x8528, 0x9509, 0xe5ee, 0xf5cf, 0xc5ac, 0xd58d,
    0x3653, 0x2672, 0x1611, 0x0630, 0x76d7, 0x66f6, 0x5695, 0x46b4,
    0xb75b, 0xa77a, 0x9719, 0x8738, 0xf7df, 0xe7fe, 0xd79d, 0xc7bc,
    0x48c4, 0x58e5, 0x6886, 0x78a7, 0x0840, 0x1861, 0x2802, 0x3823,
    0xc9cc, 0xd9ed, 0xe98e, 0xf9af, 0x8948, 0x9969, 0xa90a, 0xb92b,
    0x5af5, 0x4ad4, 0x7ab7, 0x6a96, 0x1a71, 0x0a50, 0x3a33, 0x2a12,
    0xdbfd, 0xcbdc, 0xfbbf, 0xeb9e, 0x9b79, 0x8b58, 0xbb3b, 0xab1a,
    0x6ca6, 0x7c87, 0x4ce4, 0x5cc5, 0x2c22, 0x3c03, 0x0c60, 0x1c41,
    0xedae, 0xfd8f, 0xcdec, 0xddcd, 0xad2a, 0xbd0b, 0x8d68, 0x9d49,
    0x7e97, 0x6eb6, 0x5ed5, 0x4ef4, 0x3e13, 0x2e32, 0x1e51, 0x0e70,
    0xff9f, 0xefbe, 0xdfdd, 0xcffc, 0xbf1b, 0xaf3a, 0x9f59, 0x8f78,
    0x9188, 0x81a9, 0xb1ca, 0xa1eb, 0xd10c, 0xc12d, 0xf14e, 0xe16f,
    0x1080, 0x00a1, 0x30c2, 0x20e3, 0x5004, 0x4025, 0x7046, 0x6067,
    0x83b9, 0x9398, 0xa3fb, 0xb3da, 0xc33d, 0xd31c, 0xe37f, 0xf35e,
    0x02b1, 0x1290, 0x22f3, 0x32d2, 0x4235, 0x5214, 0x6277, 0x7256,
    0xb5ea, 0xa5cb, 0x95a8, 0x8589, 0xf56e, 0xe54f, 0xd52c, 0xc50d,
    0x34e2, 0x24c3, 0x14a0, 0x0481, 0x7466, 0x6447, 0x5424, 0x4405,
    0xa7db, 0xb7fa, 0x8799, 0x97b8, 0xe75f, 0xf77e, 0xc71d, 0xd73c,
    0x26d3, 0x36f2, 0x0691, 0x16b0, 0x6657, 0x7676, 0x4615, 0x5634,
    0xd94c, 0xc96d, 0xf90e, 0xe92f, 0x99c8, 0x89e9, 0xb98a, 0xa9ab,
    0x5844, 0x4865, 0x7806, 0x6827, 0x18c0, 0x08e1, 0x3882, 0x28a3,
    0xcb7d, 0xdb5c, 0xeb3f, 0xfb1e, 0x8bf9, 0x9bd8, 0xabbb, 0xbb9a,
    0x4a75, 0x5a54, 0x6a37, 0x7a16, 0x0af1, 0x1ad0, 0x2ab3, 0x3a92,
    0xfd2e, 0xed0f, 0xdd6c, 0xcd4d, 0xbdaa, 0xad8b, 0x9de8, 0x8dc9,
    0x7c26, 0x6c07, 0x5c64, 0x4c45, 0x3ca2, 0x2c83, 0x1ce0, 0x0cc1,
    0xef1f, 0xff3e, 0xcf5d, 0xdf7c, 0xaf9b, 0xbfba, 0x8fd9, 0x9ff8,
    0x6e17, 0x7e36, 0x4e55, 0x5e74, 0x2e93, 0x3eb2, 0x0ed1, 0x1ef0,
};

uint16_t kvs_redis_crc16(const void *data, size_t len)
{
    const unsigned char *p = data;
    uint16_t crc = 0;
    for (size_t i = 0; i < len; i++)
        crc = (uint16_t)((crc << 8) ^ crc16_table[((crc >> 8) ^ p[i]) & 0xff]);
    return crc;
}

unsigned kvs_redis_key_slot(const void *key, size_t len)
{
    const char *k = key;
    const char *open = memchr(k, '{', len);
    if (open != NULL) {
        size_t after = (size_t)(open - k) + 1;
        const char *close = memchr(open + 1, '}', len - after);
        /* "{}" hashes the whole key: an empty tag is no tag. */
        if (close != NULL && close > open + 1)
            return kvs_redis_crc16(open + 1, (size_t)(close - open - 1)) & (KVS_REDIS_SLOTS - 1);
    }
    return kvs_redis_crc16(k, len) & (KVS_REDIS_SLOTS - 1);
}

/* A decimal number in s[0..len) with no sign; -1 if not one or above max. */
static long parse_decimal(const char *s, size_t len, long max)
{
    if (len == 0 || len > 10) return -1;
    long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v <= max ? v : -1;
}

kvs_redis_redirect_kind kvs_redis_parse_redirect(const char *err, size_t len,
                                                 kvs_redis_redirect *out)
{
    kvs_redis_redirect_kind kind;
    size_t skip;
    if (len > 6 && memcmp(err, "MOVED ", 6) == 0) {
        kind = KVS_REDIS_MOVED;
        skip = 6;
    } else if (len > 4 && memcmp(err, "ASK ", 4) == 0) {
        kind = KVS_REDIS_ASK;
        skip = 4;
    } else {
        return KVS_REDIS_NOT_REDIRECT;
    }
    const char *p = err + skip, *end = err + len;
    const char *sp = memchr(p, ' ', (size_t)(end - p));
    if (sp == NULL) return KVS_REDIS_NOT_REDIRECT;
    long slot = parse_decimal(p, (size_t)(sp - p), KVS_REDIS_SLOTS - 1);
    if (slot < 0) return KVS_REDIS_NOT_REDIRECT;
    const char *ep = sp + 1;
    /* The port follows the last ':' (an IPv6 address holds others). */
    const char *colon = NULL;
    for (const char *q = ep; q < end; q++)
        if (*q == ':') colon = q;
    if (colon == NULL) return KVS_REDIS_NOT_REDIRECT;
    long port = parse_decimal(colon + 1, (size_t)(end - colon - 1), 65535);
    if (port < 1) return KVS_REDIS_NOT_REDIRECT;
    const char *h = ep;
    size_t hlen = (size_t)(colon - ep);
    if (hlen >= 2 && h[0] == '[' && h[hlen - 1] == ']') {
        h++;
        hlen -= 2;
    }
    if (hlen >= KVS_REDIS_HOST_MAX) return KVS_REDIS_NOT_REDIRECT;
    out->kind = kind;
    out->slot = (unsigned)slot;
    memcpy(out->host, h, hlen);
    out->host[hlen] = '\0';
    out->port = (int)port;
    return kind;
}

static int fail_parse(char *err, size_t errsize, kvs_redis_slot_range *ranges,
                      kvs_redis_slot_range **out, size_t i, const char *what)
{
    snprintf(err, errsize, "element %zu: %s", i, what);
    free(ranges);
    *out = NULL;
    return -1;
}

int kvs_redis_parse_cluster_slots(const redisReply *reply, const char *asked_host,
                                  kvs_redis_slot_range **out, size_t *count, char *err,
                                  size_t errsize)
{
    *out = NULL;
    *count = 0;
    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY) {
        snprintf(err, errsize, "not an array");
        return -1;
    }
    size_t n = reply->elements;
    kvs_redis_slot_range *ranges = calloc(n ? n : 1, sizeof *ranges);
    if (ranges == NULL) {
        snprintf(err, errsize, "out of memory for %zu slot ranges", n);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        const redisReply *e = reply->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER)
            return fail_parse(err, errsize, ranges, out, i, "not [start, end, master]");
        long long start = e->element[0]->integer, stop = e->element[1]->integer;
        if (start < 0 || stop < start || stop >= KVS_REDIS_SLOTS)
            return fail_parse(err, errsize, ranges, out, i, "bad slot range");
        const redisReply *m = e->element[2];
        if (m->type != REDIS_REPLY_ARRAY || m->elements < 2 ||
            m->element[0]->type != REDIS_REPLY_STRING ||
            m->element[1]->type != REDIS_REPLY_INTEGER || m->element[1]->integer < 1 ||
            m->element[1]->integer > 65535)
            return fail_parse(err, errsize, ranges, out, i, "no master address");
        const char *host = m->element[0]->str;
        size_t hlen = m->element[0]->len;
        if (hlen == 0) { /* the node does not know its address: the one asked */
            host = asked_host;
            hlen = strlen(asked_host);
        }
        if (hlen >= KVS_REDIS_HOST_MAX || memchr(host, '\0', hlen) != NULL)
            return fail_parse(err, errsize, ranges, out, i, "bad host");
        ranges[i].start = (unsigned)start;
        ranges[i].end = (unsigned)stop;
        memcpy(ranges[i].host, host, hlen);
        ranges[i].host[hlen] = '\0';
        ranges[i].port = (int)m->element[1]->integer;
    }
    *out = ranges;
    *count = n;
    return 0;
}

void kvs_redis_format_addr(const char *host, int port, char *buf, size_t size)
{
    if (strchr(host, ':') != NULL)
        snprintf(buf, size, "[%s]:%d", host, port);
    else
        snprintf(buf, size, "%s:%d", host, port);
}
