/* redis_url.c - see redis_url.h. */
#include "l2/redis_url.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvserde/error.h"
#include "l2/redis_conn.h"

void kvs_redis_redact_url(const char *url, char *out, size_t size)
{
    const char *auth = strstr(url, "://");
    auth = auth ? auth + 3 : url;
    size_t alen = strcspn(auth, "/?#");
    const char *at = NULL;
    for (const char *p = auth; p < auth + alen; p++)
        if (*p == '@') at = p;
    const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    if (colon == NULL) {
        kvs_redis_msgf(out, size, "%s", url);
        return;
    }
    kvs_redis_msgf(out, size, "%.*s***%s", (int)(colon + 1 - url), url, at);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Percent-decode s[0..n) into a new string; NULL if malformed (*bad = 1)
 * or out of memory (*bad = 0). */
static char *pct_decode(const char *s, size_t n, int *bad)
{
    *bad = 0;
    char *out = malloc(n + 1);
    if (out == NULL) return NULL;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '%') {
            out[len++] = s[i];
            continue;
        }
        int hi = i + 2 < n ? hexval(s[i + 1]) : -1;
        int lo = i + 2 < n ? hexval(s[i + 2]) : -1;
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) { /* "%00" would cut the string */
            free(out);
            *bad = 1;
            return NULL;
        }
        out[len++] = (char)(hi * 16 + lo);
        i += 2;
    }
    out[len] = '\0';
    return out;
}

void kvs_redis_url_free(redis_url *u)
{
    free(u->username);
    if (u->password) memset(u->password, 0, strlen(u->password));
    free(u->password);
    u->username = u->password = NULL;
}

static int bad_url(const char *url, const char *why)
{
    char shown[1024];
    kvs_redis_redact_url(url, shown, sizeof shown);
    return kvs_set_error(KVS_EINVAL, "redis: bad URL '%s': %s", shown, why);
}

int kvs_redis_parse_url(const char *url, redis_url *u)
{
    memset(u, 0, sizeof *u);
    u->port = 6379;
    if (strncmp(url, "rediss://", 9) == 0)
        return bad_url(url, "TLS (rediss://) is not supported");
    if (strncmp(url, "redis://", 8) != 0) return bad_url(url, "must start with redis://");
    const char *auth = url + 8;
    if (strpbrk(auth, "?#") != NULL)
        return bad_url(url, "query and fragment are not supported");
    size_t alen = strcspn(auth, "/");
    const char *at = NULL;
    for (const char *p = auth; p < auth + alen; p++)
        if (*p == '@') at = p;
    const char *hp = auth;
    if (at != NULL) {
        const char *colon = memchr(auth, ':', (size_t)(at - auth));
        size_t ulen = colon ? (size_t)(colon - auth) : (size_t)(at - auth);
        int bad = 0;
        if (ulen > 0 && (u->username = pct_decode(auth, ulen, &bad)) == NULL)
            goto decode_fail;
        if (colon && (u->password = pct_decode(colon + 1, (size_t)(at - colon - 1), &bad)) == NULL)
            goto decode_fail;
        hp = at + 1;
        goto decoded;
    decode_fail:
        kvs_redis_url_free(u);
        if (bad) return bad_url(url, "bad percent-encoding in the user information");
        return kvs_set_error(KVS_ENOMEM, "redis: out of memory parsing a URL");
    }
decoded:;
    const char *hend = auth + alen;
    const char *port = NULL;
    size_t hlen;
    if (hp < hend && *hp == '[') {
        const char *rb = memchr(hp, ']', (size_t)(hend - hp));
        if (rb == NULL) {
            kvs_redis_url_free(u);
            return bad_url(url, "unclosed '[' in the host");
        }
        hlen = (size_t)(rb - hp - 1);
        if (rb + 1 < hend) {
            if (rb[1] != ':') {
                kvs_redis_url_free(u);
                return bad_url(url, "junk after the host");
            }
            port = rb + 2;
        }
        hp++;
    } else {
        const char *colon = memchr(hp, ':', (size_t)(hend - hp));
        hlen = (size_t)((colon ? colon : hend) - hp);
        if (colon) port = colon + 1;
    }
    if (hlen == 0) {
        kvs_redis_url_free(u);
        return bad_url(url, "missing host");
    }
    if (hlen >= sizeof u->host) {
        kvs_redis_url_free(u);
        return bad_url(url, "host name too long");
    }
    memcpy(u->host, hp, hlen);
    u->host[hlen] = '\0';
    if (port != NULL) {
        size_t plen = (size_t)(hend - port);
        long v = 0;
        int ok = plen > 0 && plen <= 5;
        for (size_t i = 0; ok && i < plen; i++) {
            ok = port[i] >= '0' && port[i] <= '9';
            v = v * 10 + (port[i] - '0');
        }
        if (!ok || v < 1 || v > 65535) {
            kvs_redis_url_free(u);
            return bad_url(url, "port must be a number from 1 to 65535");
        }
        u->port = (int)v;
    }
    if (*hend == '/' && hend[1] != '\0') {
        const char *d = hend + 1;
        size_t dlen = strlen(d);
        long long v = 0;
        int ok = dlen > 0 && dlen <= 9;
        for (size_t i = 0; ok && i < dlen; i++) {
            ok = d[i] >= '0' && d[i] <= '9';
            v = v * 10 + (d[i] - '0');
        }
        if (!ok) {
            kvs_redis_url_free(u);
            return bad_url(url, "database must be a number from 0 to 999999999");
        }
        u->db = (unsigned)v;
    }
    return KVS_OK;
}

