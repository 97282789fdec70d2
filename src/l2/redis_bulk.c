/* redis_bulk.c - one RESP reply, its bulk string read straight into the
 * caller's memory (redis_bulk.h). */
#include "l2/redis_bulk.h"

#include <stdio.h>
#include <string.h>

void kvs_redis_bulk_reset(kvs_redis_bulk *b)
{
    b->state = KVS_RB_LINE;
    b->bulk = 0;
    b->len = 0;
    b->dst = NULL;
    b->got = 0;
    b->crlf = 0;
    b->line_len = 0;
    b->err[0] = '\0';
}

static void set_error(kvs_redis_bulk *b, const char *msg)
{
    snprintf(b->err, sizeof b->err, "%s", msg);
    b->state = KVS_RB_ERROR;
}

/* The first line is complete (line[0..line_len) ends in CRLF). */
static void line_done(kvs_redis_bulk *b)
{
    if (b->line[0] != '$') {
        b->state = KVS_RB_DONE; /* '+', '-', ':': a one-line reply */
        return;
    }
    const char *p = b->line + 1, *end = b->line + b->line_len - 2;
    if (end - p == 2 && p[0] == '-' && p[1] == '1') {
        b->state = KVS_RB_DONE; /* nil */
        return;
    }
    /* A length of 1 to 19 digits, no sign: up to 10^19 - 1, which fits
     * uint64_t; a value that long would never fit a destination anyway. */
    if (p == end || end - p > 19) {
        set_error(b, "Bad bulk string length");
        return;
    }
    uint64_t len = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9') {
            set_error(b, "Bad bulk string length");
            return;
        }
        len = len * 10 + (uint64_t)(*p - '0');
    }
    b->bulk = 1;
    b->len = len;
    b->state = KVS_RB_HEADER;
}

size_t kvs_redis_bulk_feed(kvs_redis_bulk *b, const char *buf, size_t n)
{
    size_t used = 0;
    while (used < n) {
        switch (b->state) {
        case KVS_RB_LINE: {
            if (b->line_len == 0) {
                char t = buf[used];
                if (t != '$' && t != '+' && t != '-' && t != ':') {
                    /* Not a type a GET or ASKING reply has: the type byte
                     * alone, for hiredis to judge (and word the error). */
                    b->line[0] = t;
                    b->line_len = 1;
                    b->state = KVS_RB_DONE;
                    return used + 1;
                }
            }
            /* Up to and including the first '\n' after a '\r'. */
            while (used < n) {
                if (b->line_len == sizeof b->line) {
                    set_error(b, "Protocol error, reply line longer than 16384 bytes");
                    return used;
                }
                char ch = buf[used++];
                b->line[b->line_len++] = ch;
                if (ch == '\n' && b->line_len >= 3 && b->line[b->line_len - 2] == '\r') {
                    line_done(b);
                    break;
                }
            }
            break;
        }
        case KVS_RB_PAYLOAD: {
            uint64_t left = b->len - b->got;
            size_t k = left < n - used ? (size_t)left : n - used;
            if (b->dst && k) memcpy(b->dst + b->got, buf + used, k);
            b->got += k;
            used += k;
            if (b->got == b->len) b->state = KVS_RB_CRLF;
            break;
        }
        case KVS_RB_CRLF:
            if (buf[used] != "\r\n"[b->crlf]) {
                set_error(b, "Protocol error, bulk string not followed by CRLF");
                return used;
            }
            used++;
            if (++b->crlf == 2) b->state = KVS_RB_DONE;
            break;
        case KVS_RB_HEADER:
        case KVS_RB_DONE:
        case KVS_RB_ERROR:
            return used;
        }
    }
    return used;
}

void kvs_redis_bulk_accept(kvs_redis_bulk *b, void *dst)
{
    b->dst = dst;
    b->state = b->len ? KVS_RB_PAYLOAD : KVS_RB_CRLF;
}

void kvs_redis_bulk_skip(kvs_redis_bulk *b)
{
    b->dst = NULL;
    b->state = b->len ? KVS_RB_PAYLOAD : KVS_RB_CRLF;
}

size_t kvs_redis_bulk_direct(const kvs_redis_bulk *b, void **where)
{
    if (b->state != KVS_RB_PAYLOAD || b->dst == NULL) return 0;
    uint64_t left = b->len - b->got;
    *where = b->dst + b->got;
    return left > SIZE_MAX ? SIZE_MAX : (size_t)left;
}

void kvs_redis_bulk_advance(kvs_redis_bulk *b, size_t k)
{
    b->got += k;
    if (b->got == b->len) b->state = KVS_RB_CRLF;
}
