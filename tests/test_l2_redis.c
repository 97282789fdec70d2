/* test_l2_redis.c - the Redis L2 adapter ("redis", kvserde/l2_redis.h)
 * against real redis-server processes this test starts on loopback ports
 * (and stops: SIGKILL + waitpid at exit, also when a check fails or a
 * fatal signal arrives): the l2.h contract, fp8 through the serde wrapper,
 * two adapters sharing one store, missing and evicted keys, hostile model
 * names, timeouts, a server killed mid-batch and restarted, reconnection
 * backoff (a task's final attempt, the cause in its message), AUTH/SELECT, a
 * 3-master Redis Cluster with a slot migration (ASK, then MOVED), close
 * with tasks in flight, loads read straight into their destinations (the
 * reply reader on every split of its input; values of the sizes around
 * its buffers, up to 32 MiB, mixed with misses, error replies and refused
 * values in one pipeline; a connection cut or stalled mid-value), and
 * every refusal of the config.
 *
 * The servers are kvs_test_redis.h's. redis-server and redis-cli come from scripts/setup.sh; without them the
 * test fails (a skipped test would hide a broken setup). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "codecs/half.h"
#include "kvs_test.h"
#include "kvs_test_list.h"
#include "kvs_test_objs.h"
#include "kvs_test_l2.h"
#include "kvs_test_redis.h"
#include "kvserde/fp8.h"
#include "kvserde/l2.h"
#include "kvserde/l2_fs.h"
#include "kvserde/l2_redis.h"
#include "kvserde/memobj.h"
#include "kvserde/processor.h"
#include "l2/redis_bulk.h"
#include "l2/redis_cluster.h"


#define WAIT_MS 20000

/* ---------------------------------------------------------------------
 * Talking to a server directly
 * ------------------------------------------------------------------ */

static redisContext *raw_connect(int port)
{
    struct timeval tv = {10, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c == NULL || c->err) {
        fprintf(stderr, "raw connect to %d: %s\n", port, c ? c->errstr : "oom");
        abort();
    }
    redisSetTimeout(c, tv);
    return c;
}

static redisReply *raw(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (r == NULL) {
        fprintf(stderr, "raw command '%s' failed: %s\n", fmt, c->errstr);
        abort();
    }
    return r;
}

/* An integer reply (or -1000 for anything else). */
static long long raw_int(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    long long v = r && r->type == REDIS_REPLY_INTEGER ? r->integer : -1000;
    if (r && r->type == REDIS_REPLY_ERROR) fprintf(stderr, "raw: %s\n", r->str);
    if (r) freeReplyObject(r);
    return v;
}

/* 1 if the reply is +OK. */
static int raw_ok(redisContext *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    int ok = r && r->type == REDIS_REPLY_STATUS && strcmp(r->str, "OK") == 0;
    if (!ok) fprintf(stderr, "raw '%s': %s\n", fmt, r && r->str ? r->str : c->errstr);
    if (r) freeReplyObject(r);
    return ok;
}

static void flush_server(int port)
{
    redisContext *c = raw_connect(port);
    if (!raw_ok(c, "FLUSHALL")) abort();
    redisFree(c);
}

/* ---------------------------------------------------------------------
 * Keys, objects, adapters
 * ------------------------------------------------------------------ */

static kvs_object_key key_of(uint32_t i, const char *model)
{
    uint8_t h[4] = {(uint8_t)(i >> 24), (uint8_t)(i >> 16), (uint8_t)(i >> 8), (uint8_t)i};
    kvs_object_key k;
    if (kvs_object_key_init(&k, h, 4, model, 0, 0, NULL) != KVS_OK) abort();
    return k;
}

/* prefix + kvs_fs_key_path(key): the documented Redis key. */
static void redis_key(const char *prefix, const kvs_object_key *k, char *out, size_t size)
{
    char path[KVS_FS_KEY_PATH_MAX];
    if (kvs_fs_key_path(k, path, sizeof path) != KVS_OK) abort();
    snprintf(out, size, "%s%s", prefix, path);
}

static kvs_memobj *bytes_obj(size_t n, unsigned seed)
{
    kvs_layout l;
    kvs_memobj *o = NULL;
    if (kvs_layout_flat(&l, n, KVS_DTYPE_UINT8) != KVS_OK ||
        kvs_memobj_alloc(&l, KVS_FMT_BINARY_BUFFER, &o) != KVS_OK)
        abort();
    for (size_t i = 0; i < n; i++) ((uint8_t *)o->data)[i] = (uint8_t)(seed * 131u + i * 7u + 3u);
    return o;
}

static int same_bytes(const kvs_memobj *a, const kvs_memobj *b)
{
    return kvs_memobj_size(a) == kvs_memobj_size(b) &&
           (kvs_memobj_size(a) == 0 || memcmp(a->data, b->data, kvs_memobj_size(a)) == 0);
}

static void free_objs(kvs_memobj **o, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvs_memobj_free(o[i]);
        o[i] = NULL;
    }
}

static kvs_l2_adapter *open_json(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static kvs_l2_adapter *open_json(const char *fmt, ...)
{
    char spec[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(spec, sizeof spec, fmt, ap);
    va_end(ap);
    kvs_l2_adapter *a = NULL;
    if (kvs_l2_create(spec, &a) != KVS_OK) {
        fprintf(stderr, "kvs_l2_create(%s): %s\n", spec, kvs_last_error());
        return NULL;
    }
    return a;
}

static int store_wait(kvs_l2_adapter *a, const kvs_object_key *keys, kvs_memobj **objs,
                      size_t n, kvs_l2_store_result *res)
{
    kvs_l2_task_id id;
    int rc = kvs_l2_submit_store(a, keys, objs, n, &id);
    if (rc) return rc;
    return store_result(a, id, res);
}

static int load_wait(kvs_l2_adapter *a, const kvs_object_key *keys, kvs_memobj **objs,
                     size_t n, kvs_l2_bitmap *out)
{
    kvs_l2_task_id id;
    int rc = kvs_l2_submit_load(a, keys, objs, n, &id);
    return rc ? rc : bitmap_result(a, 1, id, out);
}

static int lookup_wait(kvs_l2_adapter *a, const kvs_object_key *keys, size_t n,
                       kvs_l2_bitmap *out)
{
    kvs_l2_task_id id;
    int rc = kvs_l2_submit_lookup_and_lock(a, keys, n, &id);
    return rc ? rc : bitmap_result(a, 0, id, out);
}

/* The adapter's status JSON, as an owned object. */
static json_t *status_of(kvs_l2_adapter *a)
{
    json_t *s = NULL;
    if (kvs_l2_status(a, &s) != KVS_OK) abort();
    return s;
}

static long long status_int(kvs_l2_adapter *a, const char *k1, const char *k2)
{
    json_t *s = status_of(a);
    json_t *v = json_object_get(s, k1);
    if (k2) v = json_object_get(v, k2);
    long long r = json_is_integer(v) ? json_integer_value(v) : -1;
    json_decref(s);
    return r;
}

static int status_healthy(kvs_l2_adapter *a)
{
    json_t *s = status_of(a);
    int h = json_is_true(json_object_get(s, "is_healthy"));
    json_decref(s);
    return h;
}

static int S; /* the port of the shared standalone server */

/* ---------------------------------------------------------------------
 * Pure parts: slots, redirections
 * ------------------------------------------------------------------ */

static unsigned slot_of(const char *s) { return kvs_redis_key_slot(s, strlen(s)); }

static void test_slots_and_redirect_parsing(void)
{
    CHECK_EQ_INT(kvs_redis_crc16("123456789", 9), 0x31c3);
    CHECK_EQ_INT(slot_of("foo"), 12182);
    CHECK_EQ_INT(slot_of("{user1000}.following"), slot_of("user1000"));
    CHECK_EQ_INT(slot_of("{user1000}.followers"), slot_of("user1000"));
    CHECK_EQ_INT(slot_of("foo{}{bar}"), kvs_redis_crc16("foo{}{bar}", 10) & 16383);
    CHECK_EQ_INT(slot_of("foo{{bar}}zap"), slot_of("{bar"));
    CHECK_EQ_INT(slot_of("foo{bar}{zap}"), slot_of("bar"));
    CHECK_EQ_INT(slot_of("}{a}"), slot_of("a"));
    CHECK_EQ_INT(slot_of("x{"), kvs_redis_crc16("x{", 2) & 16383);
    CHECK_EQ_INT(kvs_redis_key_slot("", 0), 0);

    kvs_redis_redirect rd;
    const char *m = "MOVED 3999 127.0.0.1:6381";
    CHECK_EQ_INT(kvs_redis_parse_redirect(m, strlen(m), &rd), KVS_REDIS_MOVED);
    CHECK_EQ_INT(rd.slot, 3999);
    CHECK_EQ_STR(rd.host, "127.0.0.1");
    CHECK_EQ_INT(rd.port, 6381);
    m = "ASK 16383 [::1]:7000";
    CHECK_EQ_INT(kvs_redis_parse_redirect(m, strlen(m), &rd), KVS_REDIS_ASK);
    CHECK_EQ_INT(rd.slot, 16383);
    CHECK_EQ_STR(rd.host, "::1");
    CHECK_EQ_INT(rd.port, 7000);
    m = "MOVED 7 :6380";
    CHECK_EQ_INT(kvs_redis_parse_redirect(m, strlen(m), &rd), KVS_REDIS_MOVED);
    CHECK_EQ_STR(rd.host, "");
    const char *bad[] = {"MOVED 16384 h:1", "MOVED 1 h", "MOVED 1 h:0",  "MOVED 1 h:70000",
                         "MOVED x h:1",     "ASK 1",     "ERR MOVED 1 h:1", "MOVEDX 1 h:1",
                         "MOVED -1 h:1",    "TRYAGAIN"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_EQ_INT(kvs_redis_parse_redirect(bad[i], strlen(bad[i]), &rd),
                     KVS_REDIS_NOT_REDIRECT);
}

/* ---------------------------------------------------------------------
 * Config refusals (no server needed: creating an adapter touches no
 * network)
 * ------------------------------------------------------------------ */

static void test_config_refusals(void)
{
    static const struct {
        const char *spec;
        const char *msg;
    } cases[] = {
        {"{\"type\":\"redis\",\"foo\":1}",
         "redis: unknown key 'foo'; accepted: url, urls, cluster, key_prefix, timeout_ms, "
         "connections, username, password"},
        {"{\"type\":\"redis\",\"url\":5}", "redis: url must be a string, got integer"},
        {"{\"type\":\"redis\",\"url\":\"redis://h\",\"urls\":[\"redis://h\"]}",
         "redis: give 'url' or 'urls', not both"},
        {"{\"type\":\"redis\",\"urls\":\"redis://h\"}",
         "redis: urls must be a non-empty array of strings, got string"},
        {"{\"type\":\"redis\",\"urls\":[]}",
         "redis: urls must be a non-empty array of strings, got an empty array"},
        {"{\"type\":\"redis\",\"urls\":[\"redis://h\",3]}",
         "redis: urls[1] must be a string, got integer"},
        {"{\"type\":\"redis\",\"urls\":[\"redis://a\",\"redis://b\"]}",
         "redis: 2 URLs need \"cluster\": true"},
        {"{\"type\":\"redis\",\"url\":\"http://h\"}",
         "redis: bad URL 'http://h': must start with redis://"},
        {"{\"type\":\"redis\",\"url\":\"rediss://h\"}",
         "redis: bad URL 'rediss://h': TLS (rediss://) is not supported"},
        {"{\"type\":\"redis\",\"url\":\"redis://\"}", "redis: bad URL 'redis://': missing host"},
        {"{\"type\":\"redis\",\"url\":\"redis://:6379\"}",
         "redis: bad URL 'redis://:6379': missing host"},
        {"{\"type\":\"redis\",\"url\":\"redis://h:0\"}",
         "redis: bad URL 'redis://h:0': port must be a number from 1 to 65535"},
        {"{\"type\":\"redis\",\"url\":\"redis://h:65536\"}",
         "redis: bad URL 'redis://h:65536': port must be a number from 1 to 65535"},
        {"{\"type\":\"redis\",\"url\":\"redis://h:\"}",
         "redis: bad URL 'redis://h:': port must be a number from 1 to 65535"},
        {"{\"type\":\"redis\",\"url\":\"redis://h:6x\"}",
         "redis: bad URL 'redis://h:6x': port must be a number from 1 to 65535"},
        {"{\"type\":\"redis\",\"url\":\"redis://h/x\"}",
         "redis: bad URL 'redis://h/x': database must be a number from 0 to 999999999"},
        {"{\"type\":\"redis\",\"url\":\"redis://h/-1\"}",
         "redis: bad URL 'redis://h/-1': database must be a number from 0 to 999999999"},
        {"{\"type\":\"redis\",\"url\":\"redis://h?db=1\"}",
         "redis: bad URL 'redis://h?db=1': query and fragment are not supported"},
        {"{\"type\":\"redis\",\"url\":\"redis://[::1\"}",
         "redis: bad URL 'redis://[::1': unclosed '[' in the host"},
        {"{\"type\":\"redis\",\"url\":\"redis://[::1]x\"}",
         "redis: bad URL 'redis://[::1]x': junk after the host"},
        {"{\"type\":\"redis\",\"url\":\"redis://u:p%zz@h\"}",
         "redis: bad URL 'redis://u:***@h': bad percent-encoding in the user information"},
        {"{\"type\":\"redis\",\"url\":\"redis://u:secret@h:0\"}",
         "redis: bad URL 'redis://u:***@h:0': port must be a number from 1 to 65535"},
        {"{\"type\":\"redis\",\"cluster\":true,\"url\":\"redis://h:7000/1\"}",
         "redis: cluster mode supports database 0 only, URL 'redis://h:7000/1' selects 1"},
        {"{\"type\":\"redis\",\"url\":\"redis://u@h\"}", "redis: a username needs a password"},
        {"{\"type\":\"redis\",\"username\":\"u\"}", "redis: a username needs a password"},
        {"{\"type\":\"redis\",\"key_prefix\":5}", "redis: key_prefix must be a string, got integer"},
        {"{\"type\":\"redis\",\"username\":3}", "redis: username must be a string, got integer"},
        {"{\"type\":\"redis\",\"password\":null}", "redis: password must be a string, got null"},
        {"{\"type\":\"redis\",\"timeout_ms\":0}",
         "redis: timeout_ms must be an integer from 1 to 3600000, got 0"},
        {"{\"type\":\"redis\",\"timeout_ms\":3600001}",
         "redis: timeout_ms must be an integer from 1 to 3600000, got 3600001"},
        {"{\"type\":\"redis\",\"timeout_ms\":\"100\"}",
         "redis: timeout_ms must be an integer from 1 to 3600000, got string"},
        {"{\"type\":\"redis\",\"connections\":0}",
         "redis: connections must be an integer from 1 to 1024, got 0"},
        {"{\"type\":\"redis\",\"connections\":1.5}",
         "redis: connections must be an integer from 1 to 1024, got 1.5"},
        {"{\"type\":\"redis\",\"cluster\":\"yes\"}",
         "redis: cluster must be a JSON boolean, got string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        kvs_l2_adapter *a = (kvs_l2_adapter *)1;
        CHECK_ERR(kvs_l2_create(cases[i].spec, &a), KVS_EINVAL, cases[i].msg);
        CHECK(a == NULL);
    }
    char spec[512], msg[128];
    char prefix[301];
    memset(prefix, 'p', 300);
    prefix[300] = '\0';
    snprintf(spec, sizeof spec, "{\"type\":\"redis\",\"key_prefix\":\"%s\"}", prefix);
    kvs_l2_adapter *a = NULL;
    CHECK_ERR(kvs_l2_create(spec, &a), KVS_EINVAL, "redis: key_prefix is 300 bytes, at most 256");

    /* The C API's own refusals. */
    CHECK_ERR(kvs_redis_adapter_create(NULL, NULL), KVS_EINVAL, "redis: output pointer is NULL");
    kvs_redis_options o = {0};
    o.nurls = 1;
    CHECK_ERR(kvs_redis_adapter_create(&o, &a), KVS_EINVAL, "redis: urls is NULL");
    o.nurls = 0;
    o.timeout_ms = 3600001;
    CHECK_ERR(kvs_redis_adapter_create(&o, &a), KVS_EINVAL,
              "redis: timeout_ms 3600001 out of range [1, 3600000]");
    o.timeout_ms = 0;
    o.connections = 2000;
    CHECK_ERR(kvs_redis_adapter_create(&o, &a), KVS_EINVAL,
              "redis: connections 2000 out of range [1, 1024]");
    const char *urls[] = {"redis://h", NULL};
    o.connections = 0;
    o.urls = urls;
    o.nurls = 2;
    o.cluster = 1;
    CHECK_ERR(kvs_redis_adapter_create(&o, &a), KVS_EINVAL, "redis: URL 1 is NULL");

    /* Accepted: creating touches no network (nothing need listen), the
     * IPv6 and percent-encoded forms parse, and the status says what it
     * will talk to. */
    const char *good[] = {
        "{\"type\":\"redis\"}",
        "{\"type\":\"redis\",\"url\":\"redis://[::1]:7001/0\",\"key_prefix\":\"\"}",
        "{\"type\":\"redis\",\"url\":\"redis://us%40er:p%3Ass@127.0.0.1:1/15\","
        "\"connections\":\"3\",\"timeout_ms\":5}",
        "{\"type\":\"redis\",\"cluster\":true,\"urls\":[\"redis://127.0.0.1:1\","
        "\"redis://127.0.0.1:2/\"]}",
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
        a = NULL;
        CHECK_OK(kvs_l2_create(good[i], &a));
        if (a == NULL) continue;
        json_t *s = status_of(a);
        CHECK_EQ_STR(json_string_value(json_object_get(s, "type")), "redis");
        CHECK(json_is_true(json_object_get(s, "is_healthy")));
        CHECK_EQ_INT(json_integer_value(json_object_get(s, "nodes_connected")), 0);
        if (i == 1) {
            CHECK_EQ_STR(json_string_value(json_object_get(
                             json_array_get(json_object_get(s, "nodes"), 0), "address")),
                         "[::1]:7001");
            CHECK_EQ_STR(json_string_value(json_object_get(s, "key_prefix")), "");
        }
        if (i == 3) CHECK_EQ_INT(json_array_size(json_object_get(s, "nodes")), 2);
        json_decref(s);
        kvs_l2_destroy(a);
    }
    (void)msg;
}

/* ---------------------------------------------------------------------
 * The load reply reader (redis_bulk.h), without a server
 * ------------------------------------------------------------------ */

/* Feed `in` to one reader per reply, split at `cut` (and, when step is 1,
 * one byte at a time), bulk strings accepted into out (skipped when skip):
 * the replies, as "B<len>:<payload>" or "L<line>" joined by '|', or
 * "E<err>" at an error. */
static void bulk_run(const char *in, size_t len, size_t cut, int bytewise, int skip,
                     char *out, size_t size)
{
    static kvs_redis_bulk b;
    char payload[64];
    size_t o = 0, pos = 0;
    out[0] = '\0';
    kvs_redis_bulk_reset(&b);
    while (pos < len) {
        size_t end = pos < cut ? cut : len;
        if (bytewise) end = pos + 1;
        if (end > len) end = len;
        while (pos < end) {
            pos += kvs_redis_bulk_feed(&b, in + pos, end - pos);
            if (b.state == KVS_RB_HEADER) {
                if (skip || b.len > sizeof payload) kvs_redis_bulk_skip(&b);
                else kvs_redis_bulk_accept(&b, payload);
            } else if (b.state == KVS_RB_DONE) {
                if (b.bulk)
                    o += (size_t)snprintf(out + o, size - o, "%sB%llu:%.*s", o ? "|" : "",
                                          (unsigned long long)b.len,
                                          b.dst ? (int)b.len : 0, payload);
                else
                    o += (size_t)snprintf(out + o, size - o, "%sL%.*s", o ? "|" : "",
                                          (int)b.line_len, b.line);
                kvs_redis_bulk_reset(&b);
            } else if (b.state == KVS_RB_ERROR) {
                snprintf(out + o, size - o, "%sE%s", o ? "|" : "", b.err);
                return;
            } else if (pos < end) {
                CHECK(0); /* stopped early without a reason */
                return;
            }
        }
    }
    if (b.state != KVS_RB_LINE || b.line_len) snprintf(out + o, size - o, "|partial");
}

static void test_bulk_reader(void)
{
    static const char in[] = "$0\r\n\r\n$5\r\nhe\r\nl\r\n$-1\r\n-WRONGTYPE x\r\n+OK\r\n:5\r\n"
                             "-MOVED 3 127.0.0.1:7001\r\n$1\r\n\n\r\n";
    const char *want = "B0:|B5:he\r\nl|L$-1\r\n|L-WRONGTYPE x\r\n|L+OK\r\n|L:5\r\n"
                       "|L-MOVED 3 127.0.0.1:7001\r\n|B1:\n";
    const char *want_skip = "B0:|B5:|L$-1\r\n|L-WRONGTYPE x\r\n|L+OK\r\n|L:5\r\n"
                            "|L-MOVED 3 127.0.0.1:7001\r\n|B1:";
    char got[512];
    size_t len = sizeof in - 1;
    int all = 1;
    for (size_t cut = 0; cut <= len; cut++) { /* every split point */
        bulk_run(in, len, cut, 0, 0, got, sizeof got);
        all &= strcmp(got, want) == 0;
        bulk_run(in, len, cut, 0, 1, got, sizeof got);
        all &= strcmp(got, want_skip) == 0;
    }
    CHECK(all);
    bulk_run(in, len, 0, 1, 0, got, sizeof got);
    CHECK_EQ_STR(got, want);

    /* Direct receives: the payload goes where _direct says, the tail by feed. */
    static kvs_redis_bulk b;
    char dst[8] = "........";
    kvs_redis_bulk_reset(&b);
    CHECK_EQ_INT(kvs_redis_bulk_feed(&b, "$6\r\nabc", 7), 4);
    CHECK_EQ_INT(b.state, KVS_RB_HEADER);
    CHECK_EQ_U64(b.len, 6);
    void *where = NULL;
    CHECK_EQ_INT(kvs_redis_bulk_direct(&b, &where), 0); /* no destination yet */
    kvs_redis_bulk_accept(&b, dst);
    CHECK_EQ_INT(kvs_redis_bulk_direct(&b, &where), 6);
    CHECK(where == dst);
    memcpy(where, "abcd", 4);
    kvs_redis_bulk_advance(&b, 4);
    CHECK_EQ_INT(kvs_redis_bulk_direct(&b, &where), 2);
    CHECK(where == dst + 4);
    CHECK_EQ_INT(kvs_redis_bulk_feed(&b, "ef\r\n+OK\r\n", 9), 4); /* stops at the reply's end */
    CHECK_EQ_INT(b.state, KVS_RB_DONE);
    CHECK(memcmp(dst, "abcdef..", 8) == 0);

    /* Malformed replies stop the reader, in hiredis' words where it has some. */
    static const struct {
        const char *in, *want;
    } bad[] = {
        {"$abc\r\n", "EBad bulk string length"},
        {"$\r\n", "EBad bulk string length"},
        {"$+5\r\n", "EBad bulk string length"},
        {"$12345678901234567890\r\n", "EBad bulk string length"},
        {"$2\r\nabXY", "EProtocol error, bulk string not followed by CRLF"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        bulk_run(bad[i].in, strlen(bad[i].in), 0, 0, 0, got, sizeof got);
        CHECK_EQ_STR(got, bad[i].want);
    }
    /* A type byte no GET reply has: handed over alone, for hiredis to judge. */
    kvs_redis_bulk_reset(&b);
    CHECK_EQ_INT(kvs_redis_bulk_feed(&b, "!!!\r\n", 5), 1);
    CHECK_EQ_INT(b.state, KVS_RB_DONE);
    CHECK_EQ_INT(b.bulk, 0);
    CHECK_EQ_INT(b.line_len, 1);
    /* A first line longer than the reader holds. */
    char *longline = malloc(KVS_REDIS_LINE_MAX + 8);
    REQUIRE(longline != NULL);
    longline[0] = '-';
    memset(longline + 1, 'x', KVS_REDIS_LINE_MAX + 4);
    memcpy(longline + KVS_REDIS_LINE_MAX + 5, "\r\n", 2);
    bulk_run(longline, KVS_REDIS_LINE_MAX + 7, 0, 0, 0, got, sizeof got);
    CHECK_EQ_STR(got, "EProtocol error, reply line longer than 16384 bytes");
    free(longline);
}

/* ---------------------------------------------------------------------
 * The contract on one server
 * ------------------------------------------------------------------ */

static void test_store_lookup_load_delete(void)
{
    flush_server(S);
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d/0\","
                                  "\"key_prefix\":\"kvs-test:\"}", S);
    REQUIRE(a != NULL);
    int fds[3] = {kvs_l2_store_event_fd(a), kvs_l2_lookup_event_fd(a), kvs_l2_load_event_fd(a)};
    CHECK(fds[0] >= 0 && fds[1] >= 0 && fds[2] >= 0);
    CHECK(fds[0] != fds[1] && fds[1] != fds[2] && fds[0] != fds[2]);

    enum { N = 5 };
    kvs_object_key keys[N + 1];
    kvs_memobj *objs[N];
    size_t sizes[N] = {0, 1, 4096, 1 << 20, 100};
    uint64_t total = 0;
    for (int i = 0; i <= N; i++) keys[i] = key_of((uint32_t)i, "meta-llama/Llama-3-8B");
    for (int i = 0; i < N; i++) {
        objs[i] = bytes_obj(sizes[i] ? sizes[i] : 1, (unsigned)i);
        kvs_memobj_set_used_size(objs[i], sizes[i]);
        total += sizes[i];
    }
    kvs_l2_store_result sr;
    kvs_l2_task_id id;
    REQUIRE_OK(kvs_l2_submit_store(a, keys, objs, N, &id));
    CHECK_EQ_INT(id, 0);
    REQUIRE_OK(store_result(a, id, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    CHECK_EQ_U64(sr.bytes_written, total);

    /* Binary-safe, under the documented key. */
    redisContext *c = raw_connect(S);
    char rk[2048];
    redis_key("kvs-test:", &keys[3], rk, sizeof rk);
    CHECK_EQ_STR(rk, "kvs-test:meta-llama%2FLlama-3-8B+/00000003,0,0");
    redisReply *r = raw(c, "GET %s", rk);
    CHECK(r->type == REDIS_REPLY_STRING && r->len == (size_t)(1 << 20) &&
          memcmp(r->str, objs[3]->data, r->len) == 0);
    freeReplyObject(r);
    CHECK_EQ_INT(raw_int(c, "DBSIZE"), N);

    /* Lookup-and-lock: ids continue, misses are no error, pop once. */
    kvs_l2_bitmap b;
    REQUIRE_OK(kvs_l2_submit_lookup_and_lock(a, keys, N + 1, &id));
    CHECK_EQ_INT(id, 1);
    REQUIRE_OK(bitmap_result(a, 0, id, &b));
    CHECK_EQ_INT(b.nkeys, N + 1);
    CHECK_EQ_INT(b.nhits, N);
    CHECK_EQ_INT(b.hits[N], 0);
    CHECK_EQ_INT(b.status, KVS_OK);
    kvs_l2_bitmap_release(&b);
    REQUIRE_OK(kvs_l2_query_lookup_and_lock(a, id, &b));
    CHECK_EQ_INT(b.state, KVS_TASK_PENDING);
    CHECK_EQ_INT(status_int(a, "locked_keys", NULL), N);

    /* Load: a missing key fails only its bit. */
    kvs_memobj *dst[N + 1];
    for (int i = 0; i <= N; i++) dst[i] = bytes_obj(1 << 20, 99);
    REQUIRE_OK(kvs_l2_submit_load(a, keys, dst, N + 1, &id));
    CHECK_EQ_INT(id, 2);
    REQUIRE_OK(bitmap_result(a, 1, id, &b));
    CHECK_EQ_INT(b.nhits, N);
    CHECK_EQ_INT(b.hits[N], 0);
    CHECK_EQ_INT(b.status, KVS_ENOTFOUND);
    CHECK_EQ_STR(b.message, "redis: load of key 5: not found");
    for (int i = 0; i < N; i++) CHECK(same_bytes(dst[i], objs[i]));
    kvs_l2_bitmap_release(&b);

    /* Empty batches complete at once and take ids. */
    REQUIRE_OK(kvs_l2_submit_load(a, keys, dst, 0, &id));
    CHECK_EQ_INT(id, 3);
    REQUIRE_OK(bitmap_result(a, 1, id, &b));
    CHECK_EQ_INT(b.state, KVS_TASK_OK);
    CHECK_EQ_INT(b.nkeys, 0);
    kvs_l2_bitmap_release(&b);

    /* Object sizes: an empty value is 0, a missing key -1. */
    int64_t sz[N + 1];
    REQUIRE_OK(kvs_l2_object_sizes(a, keys, N + 1, sz));
    for (int i = 0; i < N; i++) CHECK_EQ_INT(sz[i], (int64_t)sizes[i]);
    CHECK_EQ_INT(sz[N], -1);

    /* Delete keeps locked keys; after an unlock it removes them. */
    uint8_t del[N + 1];
    REQUIRE_OK(kvs_l2_delete(a, keys, N + 1, del));
    for (int i = 0; i <= N; i++) CHECK_EQ_INT(del[i], 0);
    CHECK_EQ_INT(raw_int(c, "DBSIZE"), N);
    CHECK_OK(kvs_l2_unlock(a, keys, 2));
    CHECK_OK(kvs_l2_unlock(a, keys, 2)); /* a key not locked is ignored */
    REQUIRE_OK(kvs_l2_delete(a, keys, N + 1, del));
    CHECK_EQ_INT(del[0], 1);
    CHECK_EQ_INT(del[1], 1);
    CHECK_EQ_INT(del[2], 0);
    CHECK_EQ_INT(del[N], 0);
    CHECK_EQ_INT(raw_int(c, "EXISTS %s", rk), 1);
    CHECK_EQ_INT(raw_int(c, "DBSIZE"), N - 2);
    CHECK_EQ_INT(status_int(a, "locked_keys", NULL), N - 2);

    /* A value larger than the destination fails only that key. */
    kvs_memobj *small = bytes_obj(1000, 1);
    kvs_memobj *two[2] = {small, dst[0]};
    kvs_object_key k2[2] = {keys[3], keys[4]};
    REQUIRE_OK(load_wait(a, k2, two, 2, &b));
    CHECK_EQ_INT(b.hits[0], 0);
    CHECK_EQ_INT(b.hits[1], 1);
    CHECK_EQ_INT(b.status, KVS_ENOSPC);
    CHECK_EQ_STR(b.message, "redis: load of key 0: stored object is 1048576 bytes, "
                            "destination holds 1000");
    kvs_l2_bitmap_release(&b);

    /* An error reply (a key of another type) names the server's error. */
    freeReplyObject(raw(c, "DEL %s", rk));
    CHECK_EQ_INT(raw_int(c, "LPUSH %s x", rk), 1);
    REQUIRE_OK(load_wait(a, k2, two, 1, &b));
    CHECK_EQ_INT(b.nhits, 0);
    CHECK_EQ_INT(b.status, KVS_EIO);
    char want[512];
    snprintf(want, sizeof want,
             "redis: load of key 0: 127.0.0.1:%d: WRONGTYPE Operation against a key holding "
             "the wrong kind of value",
             S);
    CHECK_EQ_STR(b.message, want);
    kvs_l2_bitmap_release(&b);

    /* A big batch is one task; every key comes back. */
    enum { M = 300 };
    kvs_object_key *mk = malloc(M * sizeof *mk);
    kvs_memobj *mo[M], *md[M];
    for (int i = 0; i < M; i++) {
        mk[i] = key_of(1000u + (uint32_t)i, "batch");
        mo[i] = bytes_obj(64 + (size_t)i, (unsigned)i);
        md[i] = bytes_obj(64 + M, 0);
    }
    REQUIRE_OK(store_wait(a, mk, mo, M, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    REQUIRE_OK(load_wait(a, mk, md, M, &b));
    CHECK_EQ_INT(b.nhits, M);
    int same = 1;
    for (int i = 0; i < M; i++) same &= same_bytes(mo[i], md[i]);
    CHECK(same);
    kvs_l2_bitmap_release(&b);
    free_objs(mo, M);
    free_objs(md, M);
    free(mk);

    /* Usage and status. */
    kvs_l2_usage u;
    REQUIRE_OK(kvs_l2_get_usage(a, &u));
    CHECK(u.bytes_used > (1u << 20));
    CHECK_EQ_U64(u.capacity, 0);
    json_t *s = status_of(a);
    CHECK_EQ_STR(json_string_value(json_object_get(s, "type")), "redis");
    CHECK(json_is_true(json_object_get(s, "is_healthy")));
    CHECK(json_is_false(json_object_get(s, "cluster")));
    CHECK_EQ_INT(json_integer_value(json_object_get(s, "nodes_connected")), 1);
    CHECK_EQ_INT(json_integer_value(json_object_get(s, "connections")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(s, "timeout_ms")), 2000);
    json_t *node = json_array_get(json_object_get(s, "nodes"), 0);
    snprintf(want, sizeof want, "127.0.0.1:%d", S);
    CHECK_EQ_STR(json_string_value(json_object_get(node, "address")), want);
    CHECK(json_is_true(json_object_get(node, "connected")));
    CHECK_EQ_INT(json_integer_value(json_object_get(s, "errors")), 1); /* the WRONGTYPE */
    json_decref(s);

    kvs_memobj_free(small);
    free_objs(dst, N + 1);
    free_objs(objs, N);
    redisFree(c);
    kvs_l2_destroy(a);
}

/* Issue 16 item 3: values are received straight into their destinations.
 * Sizes around the reader's buffers (hiredis' 16 KiB, the direct-receive
 * threshold, the 256 KiB read chunk) and 32 MiB, one key per task and all
 * in one pipeline with a miss, an error reply and refused values between
 * them: every value arrives whole, nothing is written past its length or
 * into a refused destination (canaries), and the stream stays in step. */
static void test_load_in_place(void)
{
    flush_server(S);
    static const size_t sizes[] = {0,
                                   1,
                                   2,
                                   16383,
                                   16384,
                                   16385,
                                   KVS_REDIS_DIRECT_MIN - 1,
                                   KVS_REDIS_DIRECT_MIN,
                                   KVS_REDIS_DIRECT_MIN + 1,
                                   KVS_REDIS_READ_CHUNK - 1,
                                   KVS_REDIS_READ_CHUNK,
                                   KVS_REDIS_READ_CHUNK + 1,
                                   3 * KVS_REDIS_READ_CHUNK + 5,
                                   (size_t)32 << 20};
    enum { NS = sizeof sizes / sizeof *sizes, CANARY = 64 };
    kvs_object_key keys[NS];
    kvs_memobj *src[NS], *dst[NS];
    for (size_t i = 0; i < NS; i++) {
        keys[i] = key_of((uint32_t)i, "in-place");
        src[i] = bytes_obj(sizes[i] ? sizes[i] : 1, (unsigned)i + 1);
        kvs_memobj_set_used_size(src[i], sizes[i]);
        dst[i] = bytes_obj(sizes[i] + CANARY, 0xEE);
        memset(dst[i]->data, 0xEE, dst[i]->capacity);
    }
    for (int conns = 1; conns <= 2; conns++) {
        kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                      "\"key_prefix\":\"inplace:\",\"connections\":%d,"
                                      "\"timeout_ms\":20000}",
                                      S, conns);
        REQUIRE(a != NULL);
        kvs_l2_store_result sr;
        REQUIRE_OK(store_wait(a, keys, src, NS, &sr));
        CHECK_EQ_INT(sr.state, KVS_TASK_OK);
        kvs_l2_bitmap b;
        /* One key per task, then all of them in one task. */
        for (size_t i = 0; i <= NS; i++) {
            size_t first = i < NS ? i : 0, n = i < NS ? 1 : NS;
            for (size_t k = first; k < first + n; k++) {
                memset(dst[k]->data, 0xEE, dst[k]->capacity);
                kvs_memobj_set_used_size(dst[k], 0);
            }
            REQUIRE_OK(load_wait(a, &keys[first], &dst[first], n, &b));
            CHECK_EQ_INT(b.nhits, n);
            CHECK_EQ_INT(b.status, KVS_OK);
            kvs_l2_bitmap_release(&b);
            for (size_t k = first; k < first + n; k++) {
                CHECK(same_bytes(dst[k], src[k]));
                const uint8_t *tail = (const uint8_t *)dst[k]->data + sizes[k];
                int clean = 1;
                for (int c = 0; c < CANARY; c++) clean &= tail[c] == 0xEE;
                CHECK(clean);
                if (!same_bytes(dst[k], src[k]) || !clean)
                    fprintf(stderr, "  size %zu, %d connection(s), %zu key(s) per task\n",
                            sizes[k], conns, n);
            }
        }
        kvs_l2_destroy(a);
    }

    /* One pipeline (one connection): 32 MiB, a miss, 32 MiB into a
     * destination one byte short (refused, untouched), an error reply, a
     * KV-shaped destination of another layout (refused, untouched), 1 byte,
     * 0 bytes, 32 MiB again. */
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                  "\"key_prefix\":\"inplace:\",\"connections\":1,"
                                  "\"timeout_ms\":20000}",
                                  S);
    REQUIRE(a != NULL);
    redisContext *c = raw_connect(S);
    kvs_object_key list_key = key_of(900, "in-place"), kv_key = key_of(901, "in-place");
    char rk[2048];
    redis_key("inplace:", &list_key, rk, sizeof rk);
    CHECK_EQ_INT(raw_int(c, "RPUSH %s a b", rk), 2);
    kvs_memobj *kv_src = kvs_test_kv_obj(64, 16, 7), *kv_dst = kvs_test_kv_obj(48, 16, 0x5A);
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(a, &kv_key, &kv_src, 1, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    size_t big = NS - 1;
    kvs_memobj *big2 = bytes_obj(sizes[big] + CANARY, 0), *short1 = bytes_obj(sizes[big] - 1, 0);
    memset(short1->data, 0xA5, short1->capacity);
    kvs_object_key mk[8] = {keys[big],  key_of(999, "in-place"), keys[big], list_key,
                            kv_key,     keys[1],                 keys[0],   keys[big]};
    kvs_memobj *md[8] = {dst[big], dst[3], short1, dst[4], kv_dst, dst[1], dst[0], big2};
    for (int k = 0; k < 8; k++)
        if (md[k] != short1 && md[k] != kv_dst) memset(md[k]->data, 0xEE, md[k]->capacity);
    kvs_l2_bitmap b;
    REQUIRE_OK(load_wait(a, mk, md, 8, &b));
    static const uint8_t want_hits[8] = {1, 0, 0, 0, 0, 1, 1, 1};
    for (int k = 0; k < 8; k++) CHECK_EQ_INT(b.hits[k], want_hits[k]);
    CHECK_EQ_INT(b.status, KVS_ENOTFOUND);
    CHECK_EQ_STR(b.message, "redis: load of key 1: not found");
    kvs_l2_bitmap_release(&b);
    CHECK(same_bytes(dst[big], src[big]) && same_bytes(big2, src[big]));
    CHECK(same_bytes(dst[1], src[1]) && same_bytes(dst[0], src[0]));
    CHECK(kvs_test_all_bytes(short1, 0xA5)); /* refused before a byte was written */
    CHECK(kvs_test_all_bytes(kv_dst, 0x5A));
    CHECK(kvs_test_all_bytes(dst[4], 0xEE)); /* the error reply wrote nothing */
    /* Each failure's own message, one key per task. */
    static const struct {
        int k, status;
        const char *msg;
    } fails[] = {
        {2, KVS_ENOSPC, "redis: load of key 0: stored object is 33554432 bytes, destination "
                        "holds 33554431"},
        {3, KVS_EIO, NULL}, /* WRONGTYPE, below */
        {4, KVS_ECORRUPT, "redis: load of key 0: stored object is 16384 bytes, destination "
                          "layout needs 12288"},
    };
    for (size_t f = 0; f < sizeof fails / sizeof *fails; f++) {
        REQUIRE_OK(load_wait(a, &mk[fails[f].k], &md[fails[f].k], 1, &b));
        CHECK_EQ_INT(b.nhits, 0);
        CHECK_EQ_INT(b.status, fails[f].status);
        char want[512];
        if (fails[f].msg) snprintf(want, sizeof want, "%s", fails[f].msg);
        else
            snprintf(want, sizeof want,
                     "redis: load of key 0: 127.0.0.1:%d: WRONGTYPE Operation against a key "
                     "holding the wrong kind of value",
                     S);
        CHECK_EQ_STR(b.message, want);
        kvs_l2_bitmap_release(&b);
    }
    CHECK(kvs_test_all_bytes(short1, 0xA5) && kvs_test_all_bytes(kv_dst, 0x5A));
    /* The connection is still in step: the next load on it works. */
    REQUIRE_OK(load_wait(a, &keys[2], &dst[2], 1, &b));
    CHECK_EQ_INT(b.nhits, 1);
    kvs_l2_bitmap_release(&b);
    CHECK(same_bytes(dst[2], src[2]));
    json_t *st = status_of(a);
    CHECK_EQ_INT(json_integer_value(json_object_get(st, "nodes_connected")), 1);
    json_decref(st);

    redisFree(c);
    kvs_l2_destroy(a);
    kvs_memobj_free(big2);
    kvs_memobj_free(short1);
    kvs_memobj_free(kv_src);
    kvs_memobj_free(kv_dst);
    free_objs(src, NS);
    free_objs(dst, NS);
}

/* fp8 through the serde wrapper: Redis holds exactly the fp8 codes. */
/* Issue 17 item 3 on redis, the raw path (no serde): a value of more tokens
 * or fewer than a KV-shaped destination's layout fails only its key,
 * KVS_ECORRUPT with both sizes, the destination untouched. */
static void test_load_wrong_layout_size_refused(void)
{
    flush_server(S);
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                  "\"key_prefix\":\"sizes:\"}", S);
    REQUIRE(a != NULL);
    kvs_object_key keys[3];
    for (int k = 0; k < 3; k++) keys[k] = key_of((uint32_t)k, "sizes-model");
    kvs_memobj *src[3] = {kvs_test_kv_obj(64, 16, 1), kvs_test_kv_obj(48, 16, 2),
                          kvs_test_kv_obj(64, 16, 3)};
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(a, keys, src, 3, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    kvs_memobj *dst[3] = {kvs_test_kv_obj(48, 16, 0x5A), kvs_test_kv_obj(64, 16, 0x5A),
                          kvs_test_kv_obj(64, 16, 0x5A)};
    kvs_l2_bitmap b;
    REQUIRE_OK(load_wait(a, keys, dst, 3, &b));
    CHECK_EQ_INT(b.hits[0], 0);
    CHECK_EQ_INT(b.hits[1], 0);
    CHECK_EQ_INT(b.hits[2], 1);
    CHECK_EQ_INT(b.status, KVS_ECORRUPT);
    CHECK_EQ_STR(b.message, "redis: load of key 0: stored object is 16384 bytes, "
                            "destination layout needs 12288");
    kvs_l2_bitmap_release(&b);
    CHECK(kvs_test_all_bytes(dst[0], 0x5A) && kvs_test_all_bytes(dst[1], 0x5A));
    CHECK(kvs_test_all_bytes(dst[2], 3));
    REQUIRE_OK(load_wait(a, &keys[1], &dst[1], 1, &b));
    CHECK_EQ_INT(b.nhits, 0);
    CHECK_EQ_INT(b.status, KVS_ECORRUPT);
    CHECK_EQ_STR(b.message, "redis: load of key 0: stored object is 12288 bytes, "
                            "destination layout needs 16384");
    kvs_l2_bitmap_release(&b);
    CHECK(kvs_test_all_bytes(dst[1], 0x5A));
    kvs_l2_destroy(a);
    for (int k = 0; k < 3; k++) {
        kvs_memobj_free(src[k]);
        kvs_memobj_free(dst[k]);
    }
}

static void test_fp8_through_serde_wrapper(void)
{
    flush_server(S);
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                  "\"key_prefix\":\"fp8:\",\"serde\":{\"type\":\"fp8\"}}", S);
    REQUIRE(a != NULL);
    enum { N = 3 };
    int64_t dims[4] = {2, 3, 16, 64};
    kvs_layout l;
    kvs_dtype bf = KVS_DTYPE_BFLOAT16;
    kvs_shape sh = {4, {2, 3, 16, 64}};
    (void)dims;
    REQUIRE_OK(kvs_layout_init(&l, 1, &sh, 1, &bf));
    uint64_t ne = kvs_layout_numel(&l);
    kvs_memobj *src[N], *dst[N];
    kvs_object_key keys[N];
    for (int k = 0; k < N; k++) {
        REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &src[k]));
        REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &dst[k]));
        uint16_t *p = src[k]->data;
        for (uint64_t i = 0; i < ne; i++)
            p[i] = kvs_f32_to_bf16(((float)((int)(i * 7 + (uint64_t)k) % 401) - 200.0f) * 0.173f);
        keys[k] = key_of((uint32_t)k, "fp8-model");
    }
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(a, keys, src, N, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    CHECK_EQ_U64(sr.bytes_written, N * ne);

    redisContext *c = raw_connect(S);
    for (int k = 0; k < N; k++) {
        char rk[2048];
        redis_key("fp8:", &keys[k], rk, sizeof rk);
        redisReply *r = raw(c, "GET %s", rk);
        CHECK(r->type == REDIS_REPLY_STRING && r->len == ne);
        int codes_ok = r->type == REDIS_REPLY_STRING && r->len == ne;
        const uint16_t *p = src[k]->data;
        for (uint64_t i = 0; codes_ok && i < ne; i++)
            codes_ok = (uint8_t)r->str[i] ==
                       kvs_fp8_from_float(kvs_bf16_to_f32(p[i]), KVS_DTYPE_FLOAT8_E4M3FN, 1);
        CHECK(codes_ok);
        freeReplyObject(r);
    }
    redisFree(c);

    kvs_l2_bitmap b;
    REQUIRE_OK(load_wait(a, keys, dst, N, &b));
    CHECK_EQ_INT(b.nhits, N);
    for (int k = 0; k < N; k++) {
        const uint16_t *p = src[k]->data, *q = dst[k]->data;
        int ok = kvs_memobj_size(dst[k]) == ne * 2;
        for (uint64_t i = 0; ok && i < ne; i++) {
            float want = kvs_fp8_to_float(
                kvs_fp8_from_float(kvs_bf16_to_f32(p[i]), KVS_DTYPE_FLOAT8_E4M3FN, 1),
                KVS_DTYPE_FLOAT8_E4M3FN);
            ok = kvs_bf16_to_f32(q[i]) == want;
        }
        CHECK(ok);
    }
    kvs_l2_bitmap_release(&b);
    json_t *s = status_of(a);
    CHECK(json_is_true(json_object_get(s, "serde_wrapped")));
    CHECK_EQ_STR(json_string_value(json_object_get(s, "type")), "redis");
    json_decref(s);
    free_objs(src, N);
    free_objs(dst, N);
    kvs_l2_destroy(a);
}

/* Two adapters ("two machines") on one store: what one stores the other
 * finds and loads; locks are per adapter. */
static void test_two_machines_share_one_store(void)
{
    flush_server(S);
#define TWO_MACHINES_SPEC                                                              \
    "{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\",\"connections\":%d,"              \
    "\"serde\":{\"type\":\"fp8\"}}"
    kvs_l2_adapter *m1 = open_json(TWO_MACHINES_SPEC, S, 1);
    kvs_l2_adapter *m2 = open_json(TWO_MACHINES_SPEC, S, 3);
    REQUIRE(m1 != NULL && m2 != NULL);
    kvs_layout l;
    REQUIRE_OK(kvs_layout_flat(&l, 4096, KVS_DTYPE_BFLOAT16));
    enum { N = 6 };
    kvs_memobj *src[N], *dst[N];
    kvs_object_key keys[N];
    for (int k = 0; k < N; k++) {
        REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &src[k]));
        REQUIRE_OK(kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &dst[k]));
        uint16_t *p = src[k]->data;
        for (int i = 0; i < 4096; i++) p[i] = kvs_f32_to_bf16((float)((i + k) % 16) * 0.5f);
        keys[k] = key_of((uint32_t)(77 + k), "shared");
    }
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(m1, keys, src, N, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    kvs_l2_bitmap b;
    REQUIRE_OK(lookup_wait(m2, keys, N, &b));
    CHECK_EQ_INT(b.nhits, N);
    kvs_l2_bitmap_release(&b);
    REQUIRE_OK(load_wait(m2, keys, dst, N, &b));
    CHECK_EQ_INT(b.nhits, N);
    for (int k = 0; k < N; k++) CHECK(same_bytes(src[k], dst[k])); /* exact in e4m3 */
    kvs_l2_bitmap_release(&b);
    /* m2's locks do not bind m1: m1 deletes, and m2's next load misses. */
    uint8_t del[1];
    REQUIRE_OK(kvs_l2_delete(m1, keys, 1, del));
    CHECK_EQ_INT(del[0], 1);
    REQUIRE_OK(kvs_l2_delete(m2, keys + 1, 1, del));
    CHECK_EQ_INT(del[0], 0);
    REQUIRE_OK(load_wait(m2, keys, dst, 2, &b));
    CHECK_EQ_INT(b.hits[0], 0);
    CHECK_EQ_INT(b.hits[1], 1);
    kvs_l2_bitmap_release(&b);
    free_objs(src, N);
    free_objs(dst, N);
    kvs_l2_destroy(m1);
    kvs_l2_destroy(m2);
}

/* Redis may evict a key after the lookup found (and locked) it: the load
 * fails that key's bit only. */
static void test_key_evicted_between_lookup_and_load(void)
{
    flush_server(S);
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\"}", S);
    REQUIRE(a != NULL);
    enum { N = 3 };
    kvs_object_key keys[N];
    kvs_memobj *src[N], *dst[N];
    for (int i = 0; i < N; i++) {
        keys[i] = key_of((uint32_t)i, "evict");
        src[i] = bytes_obj(5000, (unsigned)i);
        dst[i] = bytes_obj(5000, 0);
    }
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(a, keys, src, N, &sr));
    kvs_l2_bitmap b;
    REQUIRE_OK(lookup_wait(a, keys, N, &b));
    CHECK_EQ_INT(b.nhits, N);
    kvs_l2_bitmap_release(&b);
    redisContext *c = raw_connect(S);
    char rk[2048];
    redis_key(KVS_REDIS_DEFAULT_PREFIX, &keys[1], rk, sizeof rk);
    CHECK_EQ_INT(raw_int(c, "DEL %s", rk), 1);
    redisFree(c);
    REQUIRE_OK(load_wait(a, keys, dst, N, &b));
    CHECK_EQ_INT(b.hits[0], 1);
    CHECK_EQ_INT(b.hits[1], 0);
    CHECK_EQ_INT(b.hits[2], 1);
    CHECK_EQ_INT(b.status, KVS_ENOTFOUND);
    CHECK_EQ_STR(b.message, "redis: load of key 1: not found");
    CHECK(same_bytes(src[0], dst[0]) && same_bytes(src[2], dst[2]));
    kvs_l2_bitmap_release(&b);
    free_objs(src, N);
    free_objs(dst, N);
    kvs_l2_destroy(a);
}

/* Model names that would collide or escape the prefix under a naive
 * "prefix:model:hash" scheme are stored distinctly, all under the prefix;
 * another prefix sees none of them. */
static void test_hostile_names_stay_distinct_under_the_prefix(void)
{
    flush_server(S);
    static const char *const models[] = {
        "a:b", "a", "a/b", "a%2Fb", "..", ".", "../x", "{a}", "a}", "{", "}{", "x{y}z",
        "a b", "\xc3\xbc", "kvserde:a", "a:b:00000000,0,0", "", "*", "a\\b"};
    enum { N = sizeof models / sizeof *models };
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                  "\"key_prefix\":\"p:\"}", S);
    /* Prefixes ending in ':' never share a key (paths hold no ':'). */
    kvs_l2_adapter *other = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                      "\"key_prefix\":\"p:a:\"}", S);
    REQUIRE(a != NULL && other != NULL);
    kvs_object_key keys[N + 2];
    kvs_memobj *src[N + 2], *dst[N + 2];
    for (int i = 0; i < N; i++) keys[i] = key_of(0, models[i]);
    /* Same model, the salt and the rank carry the difference. */
    REQUIRE_OK(kvs_object_key_init(&keys[N], "\0", 1, "a", 0, 0, "s:1"));
    REQUIRE_OK(kvs_object_key_init(&keys[N + 1], "\0", 1, "a", -1, 0, "s"));
    for (int i = 0; i < N + 2; i++) {
        src[i] = bytes_obj(32, (unsigned)i + 1);
        dst[i] = bytes_obj(32, 0);
    }
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(a, keys, src, N + 2, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    redisContext *c = raw_connect(S);
    CHECK_EQ_INT(raw_int(c, "DBSIZE"), N + 2);
    redisReply *r = raw(c, "KEYS *");
    CHECK(r->type == REDIS_REPLY_ARRAY && r->elements == N + 2);
    for (size_t i = 0; r->type == REDIS_REPLY_ARRAY && i < r->elements; i++) {
        CHECK(strncmp(r->element[i]->str, "p:", 2) == 0);
        CHECK(strpbrk(r->element[i]->str + 2, "{}:* ") == NULL); /* all escaped */
    }
    freeReplyObject(r);
    char rk[2048];
    redis_key("p:", &keys[2], rk, sizeof rk);
    CHECK_EQ_STR(rk, "p:a%2Fb+/00000000,0,0");
    redisFree(c);
    kvs_l2_bitmap b;
    REQUIRE_OK(load_wait(a, keys, dst, N + 2, &b));
    CHECK_EQ_INT(b.nhits, N + 2);
    for (int i = 0; i < N + 2; i++) CHECK(same_bytes(src[i], dst[i]));
    kvs_l2_bitmap_release(&b);
    REQUIRE_OK(lookup_wait(other, keys, N + 2, &b));
    CHECK_EQ_INT(b.nhits, 0);
    kvs_l2_bitmap_release(&b);
    free_objs(src, N + 2);
    free_objs(dst, N + 2);
    kvs_l2_destroy(a);
    kvs_l2_destroy(other);
}

/* A server that does not answer: the task fails at its timeout, not
 * later, and the adapter works again once the server answers. */
static void test_timeout_fails_the_task_on_time(void)
{
    flush_server(S);
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                  "\"timeout_ms\":300,\"connections\":1}", S);
    REQUIRE(a != NULL);
    kvs_object_key k = key_of(1, "slow");
    kvs_memobj *o = bytes_obj(100, 1), *d = bytes_obj(100, 0);
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(a, &k, &o, 1, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    redisContext *c = raw_connect(S);
    REQUIRE(raw_ok(c, "CLIENT PAUSE 2500 ALL"));
    int64_t t0 = now_ms();
    kvs_l2_bitmap b;
    REQUIRE_OK(load_wait(a, &k, &d, 1, &b));
    int64_t took = now_ms() - t0;
    CHECK(took >= 250 && took < 1800);
    CHECK_EQ_INT(b.nhits, 0);
    CHECK_EQ_INT(b.status, KVS_EIO);
    char want[256];
    snprintf(want, sizeof want, "redis: load of key 0: 127.0.0.1:%d: timed out after 300 ms", S);
    CHECK_EQ_STR(b.message, want);
    kvs_l2_bitmap_release(&b);
    CHECK(status_int(a, "errors", NULL) >= 1);
    /* PING waits for the pause to end; then the adapter (on a new
     * connection) works. */
    redisReply *r = raw(c, "PING");
    freeReplyObject(r);
    redisFree(c);
    REQUIRE_OK(load_wait(a, &k, &d, 1, &b));
    CHECK_EQ_INT(b.nhits, 1);
    CHECK(same_bytes(o, d));
    kvs_l2_bitmap_release(&b);
    CHECK(status_healthy(a));
    kvs_memobj_free(o);
    kvs_memobj_free(d);
    kvs_l2_destroy(a);
}

/* The server dies (SIGKILL) while a batch is in flight: that task fails
 * with a clear message at once, tasks while it is down fail fast, and once
 * it is back (same port) later tasks succeed. */
static void test_server_killed_mid_batch_and_restarted(void)
{
    server *srv = new_server();
    REQUIRE(start_server(srv, 0, NULL) == 0);
    int P = srv->port;
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                  "\"timeout_ms\":3000,\"connections\":2}", P);
    REQUIRE(a != NULL);
    enum { N = 8 };
    kvs_object_key keys[N];
    kvs_memobj *src[N], *dst[N];
    for (int i = 0; i < N; i++) {
        keys[i] = key_of((uint32_t)i, "restart");
        src[i] = bytes_obj(256 * 1024, (unsigned)i);
        dst[i] = bytes_obj(256 * 1024, 0);
    }
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(a, keys, src, N, &sr)); /* both connections open */
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);

    /* The server stops answering, the batch goes out, the server dies. */
    redisContext *c = raw_connect(P);
    REQUIRE(raw_ok(c, "CLIENT PAUSE 20000 ALL"));
    kvs_l2_task_id id;
    REQUIRE_OK(kvs_l2_submit_store(a, keys, src, N, &id));
    sleep_ms(200);
    int64_t t0 = now_ms();
    kill_server(srv);
    redisFree(c);
    REQUIRE_OK(store_result(a, id, &sr));
    int64_t took = now_ms() - t0;
    CHECK(took < 1500); /* not the 3000 ms timeout: the drop is seen at once */
    CHECK_EQ_INT(sr.state, KVS_TASK_FAILED);
    CHECK_EQ_INT(sr.status, KVS_EIO);
    char want[256];
    snprintf(want, sizeof want, "redis: store of key 0: 127.0.0.1:%d: connection lost: ", P);
    CHECK(strncmp(sr.message, want, strlen(want)) == 0);
    if (strncmp(sr.message, want, strlen(want)) != 0) fprintf(stderr, "got: %s\n", sr.message);

    /* While it is down: a refused connection, fast. */
    kvs_l2_bitmap b;
    t0 = now_ms();
    REQUIRE_OK(load_wait(a, keys, dst, 1, &b));
    CHECK(now_ms() - t0 < 1500);
    CHECK_EQ_INT(b.nhits, 0);
    snprintf(want, sizeof want, "redis: load of key 0: 127.0.0.1:%d: connect: Connection refused",
             P);
    CHECK_EQ_STR(b.message, want);
    kvs_l2_bitmap_release(&b);
    json_t *s = status_of(a);
    CHECK(json_is_false(json_object_get(s, "is_healthy")));
    CHECK_EQ_INT(json_integer_value(json_object_get(s, "nodes_connected")), 0);
    CHECK(json_integer_value(json_object_get(s, "errors")) >= 2);
    snprintf(want, sizeof want, "127.0.0.1:%d: connect: Connection refused", P);
    CHECK_EQ_STR(json_string_value(json_object_get(s, "last_error")), want);
    json_decref(s);
    /* Lookups of an unreachable server: misses with the reason. */
    REQUIRE_OK(lookup_wait(a, keys, 2, &b));
    CHECK_EQ_INT(b.nhits, 0);
    CHECK_EQ_INT(b.status, KVS_EIO);
    kvs_l2_bitmap_release(&b);

    /* Back on the same port (empty: no persistence): later tasks succeed. */
    REQUIRE(start_server(srv, 0, NULL) == 0);
    REQUIRE_OK(store_wait(a, keys, src, N, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    if (sr.state != KVS_TASK_OK) fprintf(stderr, "after restart: %s\n", sr.message);
    REQUIRE_OK(load_wait(a, keys, dst, N, &b));
    CHECK_EQ_INT(b.nhits, N);
    kvs_l2_bitmap_release(&b);
    CHECK(status_healthy(a));

    /* A restart while the adapter is idle: its kept connections are dead,
     * and the next task still succeeds at once. */
    kill_server(srv);
    REQUIRE(start_server(srv, 0, NULL) == 0);
    REQUIRE_OK(store_wait(a, keys, src, N, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    if (sr.state != KVS_TASK_OK) fprintf(stderr, "after idle restart: %s\n", sr.message);
    REQUIRE_OK(load_wait(a, keys, dst, N, &b));
    CHECK_EQ_INT(b.nhits, N);
    for (int i = 0; i < N; i++) CHECK(same_bytes(src[i], dst[i]));
    kvs_l2_bitmap_release(&b);

    kill_server(srv);
    srv->port = 0;
    free_objs(src, N);
    free_objs(dst, N);
    kvs_l2_destroy(a);
}

/* A server of the caller's own (to kill and restart), and an adapter of
 * one connection on it. */
static kvs_l2_adapter *open_own_server(server **srv, unsigned timeout_ms)
{
    *srv = new_server();
    if (start_server(*srv, 0, NULL) != 0) return NULL;
    return open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\",\"timeout_ms\":%u,"
                     "\"connections\":1}", (*srv)->port, timeout_ms);
}

static void close_own_server(server *srv, kvs_l2_adapter *a)
{
    kill_server(srv);
    srv->port = 0;
    kvs_l2_destroy(a);
}

/* A store of one key of a fresh object; the result's state. */
static int store_one(kvs_l2_adapter *a, uint32_t i, kvs_l2_store_result *sr)
{
    kvs_object_key k = key_of(i, "backoff");
    kvs_memobj *o = bytes_obj(1000, i);
    int rc = store_wait(a, &k, &o, 1, sr);
    kvs_memobj_free(o);
    if (rc != KVS_OK) abort();
    return sr->state;
}

/* The server is back while the node's backoff still runs: a task whose
 * time ends before the next scheduled attempt makes a final attempt within
 * its time, and succeeds, rather than failing without one. */
static void test_due_task_makes_a_final_attempt(void)
{
    server *srv;
    kvs_l2_adapter *a = open_own_server(&srv, 200);
    REQUIRE(a != NULL);
    kvs_l2_store_result sr;
    CHECK_EQ_INT(store_one(a, 0, &sr), KVS_TASK_OK);
    kill_server(srv);
    /* Grow the backoff past the task's time, ending on a task that made a
     * connection attempt (one that made none says "(next attempt in N
     * ms)"), so the next attempt is a whole backoff away. */
    int64_t t0 = now_ms();
    while (now_ms() - t0 < 10000) {
        CHECK_EQ_INT(store_one(a, 1, &sr), KVS_TASK_FAILED);
        if (now_ms() - t0 > 1500 && strstr(sr.message, "(next attempt in") == NULL) break;
        sleep_ms(5);
    }
    REQUIRE(start_server(srv, 0, NULL) == 0);
    int64_t ready = now_ms();
    CHECK_EQ_INT(store_one(a, 2, &sr), KVS_TASK_OK);
    if (sr.state != KVS_TASK_OK) fprintf(stderr, "due task: %s\n", sr.message);
    fprintf(stderr, "  stored %lld ms after the server answered\n", (long long)(now_ms() - ready));
    CHECK(status_healthy(a));
    close_own_server(srv, a);
}

/* A task that fails on a node in backoff with another error says which
 * error put the node in backoff: its wait is otherwise unexplained. */
static void test_failure_in_backoff_names_its_cause(void)
{
    server *srv;
    kvs_l2_adapter *a = open_own_server(&srv, 300);
    REQUIRE(a != NULL);
    int P = srv->port;
    kvs_l2_store_result sr;
    CHECK_EQ_INT(store_one(a, 0, &sr), KVS_TASK_OK);
    kill_server(srv);
    char want[256];
    snprintf(want, sizeof want, "redis: store of key 0: 127.0.0.1:%d: connect: Connection refused",
             P);
    CHECK_EQ_INT(store_one(a, 1, &sr), KVS_TASK_FAILED);
    CHECK_EQ_STR(sr.message, want);
    /* Refused again: that error says it all (no repeat of it). */
    CHECK_EQ_INT(store_one(a, 2, &sr), KVS_TASK_FAILED);
    CHECK_EQ_STR(sr.message, want);
    /* Back, but not answering: the connection after the backoff is made,
     * and the task times out on it. */
    REQUIRE(start_server(srv, 0, NULL) == 0);
    redisContext *c = raw_connect(P);
    REQUIRE(raw_ok(c, "CLIENT PAUSE 1500 ALL"));
    CHECK_EQ_INT(store_one(a, 3, &sr), KVS_TASK_FAILED);
    CHECK_EQ_INT(sr.status, KVS_EIO);
    snprintf(want, sizeof want,
             "redis: store of key 0: 127.0.0.1:%d: timed out after 300 ms; the node was in "
             "backoff after: connect: Connection refused", P);
    CHECK_EQ_STR(sr.message, want);
    freeReplyObject(raw(c, "PING")); /* wait out the pause */
    redisFree(c);
    CHECK_EQ_INT(store_one(a, 4, &sr), KVS_TASK_OK);
    CHECK(status_healthy(a));
    close_own_server(srv, a);
}

/* AUTH (password from the URL or the config, with or without a user) and
 * SELECT. */
static void test_auth_and_database(void)
{
    server *srv = new_server();
    const char *extra[] = {"--requirepass", "s3cret", NULL};
    REQUIRE(start_server(srv, 0, extra) == 0);
    int P = srv->port;
    kvs_object_key k = key_of(5, "auth");
    kvs_memobj *o = bytes_obj(10, 1), *d = bytes_obj(10, 0);
    kvs_l2_store_result sr;
    kvs_l2_bitmap b;

    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://:s3cret@127.0.0.1:%d/3\"}",
                                  P);
    REQUIRE(a != NULL);
    REQUIRE_OK(store_wait(a, &k, &o, 1, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    REQUIRE_OK(load_wait(a, &k, &d, 1, &b));
    CHECK_EQ_INT(b.nhits, 1);
    kvs_l2_bitmap_release(&b);
    kvs_l2_destroy(a);
    redisContext *c = raw_connect(P);
    CHECK(raw_ok(c, "AUTH s3cret"));
    char rk[2048];
    redis_key(KVS_REDIS_DEFAULT_PREFIX, &k, rk, sizeof rk);
    CHECK_EQ_INT(raw_int(c, "EXISTS %s", rk), 0); /* not in db 0 */
    CHECK(raw_ok(c, "SELECT 3"));
    CHECK_EQ_INT(raw_int(c, "EXISTS %s", rk), 1);
    redisFree(c);

    /* The config's password, a user name in the URL. */
    a = open_json("{\"type\":\"redis\",\"url\":\"redis://default@127.0.0.1:%d/3\","
                  "\"password\":\"s3cret\"}", P);
    REQUIRE(a != NULL);
    REQUIRE_OK(load_wait(a, &k, &d, 1, &b));
    CHECK_EQ_INT(b.nhits, 1);
    kvs_l2_bitmap_release(&b);
    kvs_l2_destroy(a);

    /* A wrong password fails the task with the server's answer. */
    a = open_json("{\"type\":\"redis\",\"url\":\"redis://:nope@127.0.0.1:%d/3\"}", P);
    REQUIRE(a != NULL);
    REQUIRE_OK(store_wait(a, &k, &o, 1, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_FAILED);
    char want[256];
    snprintf(want, sizeof want,
             "redis: store of key 0: 127.0.0.1:%d: AUTH: WRONGPASS invalid username-password "
             "pair or user is disabled.",
             P);
    CHECK_EQ_STR(sr.message, want);
    kvs_l2_destroy(a);

    /* No password: the command's own error. */
    a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\"}", P);
    REQUIRE(a != NULL);
    REQUIRE_OK(store_wait(a, &k, &o, 1, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_FAILED);
    snprintf(want, sizeof want, "redis: store of key 0: 127.0.0.1:%d: NOAUTH Authentication "
             "required.", P);
    CHECK_EQ_STR(sr.message, want);
    kvs_l2_destroy(a);

    kill_server(srv);
    srv->port = 0;
    kvs_memobj_free(o);
    kvs_memobj_free(d);
}

/* Close with tasks queued and running: each finishes and its result can be
 * read; then the closed adapter refuses what it must. A task stuck on a
 * silent server ends at its timeout, so close does not hang. */
static void test_close_with_tasks_in_flight(void)
{
    flush_server(S);
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                  "\"connections\":2,\"timeout_ms\":400}", S);
    REQUIRE(a != NULL);
    enum { N = 16, T = 4 };
    kvs_object_key keys[N];
    kvs_memobj *src[N], *dst[T][N];
    for (int i = 0; i < N; i++) {
        keys[i] = key_of((uint32_t)i, "close");
        src[i] = bytes_obj(64 * 1024, (unsigned)i);
        for (int t = 0; t < T; t++) dst[t][i] = bytes_obj(64 * 1024, 0);
    }
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(a, keys, src, N, &sr));
    kvs_l2_usage before;
    REQUIRE_OK(kvs_l2_get_usage(a, &before));
    kvs_l2_task_id st[T], lk[T], ld[T];
    for (int t = 0; t < T; t++) {
        REQUIRE_OK(kvs_l2_submit_store(a, keys, src, N, &st[t]));
        REQUIRE_OK(kvs_l2_submit_lookup_and_lock(a, keys, N, &lk[t]));
        REQUIRE_OK(kvs_l2_submit_load(a, keys, dst[t], N, &ld[t]));
    }
    CHECK_OK(kvs_l2_close(a));
    kvs_l2_store_result res[T + 1];
    size_t count = 0;
    CHECK_OK(kvs_l2_pop_completed_stores(a, res, T + 1, &count));
    CHECK_EQ_INT(count, T);
    for (size_t i = 0; i < count; i++) CHECK_EQ_INT(res[i].state, KVS_TASK_OK);
    for (int t = 0; t < T; t++) {
        kvs_l2_bitmap b;
        CHECK_OK(kvs_l2_query_lookup_and_lock(a, lk[t], &b));
        CHECK_EQ_INT(b.nhits, N);
        kvs_l2_bitmap_release(&b);
        CHECK_OK(kvs_l2_query_load(a, ld[t], &b));
        CHECK_EQ_INT(b.nhits, N);
        kvs_l2_bitmap_release(&b);
        CHECK(same_bytes(src[N - 1], dst[t][N - 1]));
    }
    kvs_l2_task_id id;
    CHECK_ERR(kvs_l2_submit_store(a, keys, src, 1, &id), KVS_ECLOSED, "redis: submit after close");
    CHECK_ERR(kvs_l2_submit_load(a, keys, src, 1, &id), KVS_ECLOSED, "redis: submit after close");
    CHECK_ERR(kvs_l2_submit_lookup_and_lock(a, keys, 1, &id), KVS_ECLOSED,
              "redis: submit after close");
    CHECK_ERR(kvs_l2_store_event_fd(a), KVS_ECLOSED, "redis: adapter is closed");
    CHECK_ERR(kvs_l2_load_event_fd(a), KVS_ECLOSED, "redis: adapter is closed");
    uint8_t del[1];
    int64_t sz[1];
    CHECK_ERR(kvs_l2_delete(a, keys, 1, del), KVS_ECLOSED, "redis: adapter is closed");
    CHECK_ERR(kvs_l2_object_sizes(a, keys, 1, sz), KVS_ECLOSED, "redis: adapter is closed");
    kvs_l2_usage after;
    CHECK_OK(kvs_l2_get_usage(a, &after)); /* the last usage read */
    CHECK_EQ_U64(after.bytes_used, before.bytes_used);
    CHECK_OK(kvs_l2_unlock(a, keys, N));
    CHECK_EQ_INT(status_int(a, "locked_keys", NULL), N); /* distinct keys, each still locked T - 1 times */
    json_t *s = status_of(a);
    CHECK(json_is_false(json_object_get(s, "is_healthy")));
    CHECK_EQ_INT(json_integer_value(json_object_get(s, "nodes_connected")), 0);
    json_decref(s);
    CHECK_OK(kvs_l2_close(a));
    kvs_l2_destroy(a);

    /* Stuck on a paused server: close waits for the timeout, no more. */
    a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\",\"timeout_ms\":400}", S);
    REQUIRE(a != NULL);
    REQUIRE_OK(store_wait(a, keys, src, 1, &sr));
    redisContext *c = raw_connect(S);
    REQUIRE(raw_ok(c, "CLIENT PAUSE 2500 ALL"));
    REQUIRE_OK(kvs_l2_submit_load(a, keys, dst[0], N, &id));
    int64_t t0 = now_ms();
    CHECK_OK(kvs_l2_close(a));
    CHECK(now_ms() - t0 < 2000);
    kvs_l2_bitmap b;
    CHECK_OK(kvs_l2_query_load(a, id, &b));
    CHECK_EQ_INT(b.state, KVS_TASK_OK);
    CHECK_EQ_INT(b.nhits, 0);
    char want[256];
    snprintf(want, sizeof want, "redis: load of key 0: 127.0.0.1:%d: timed out after 400 ms", S);
    CHECK_EQ_STR(b.message, want);
    kvs_l2_bitmap_release(&b);
    kvs_l2_destroy(a);
    freeReplyObject(raw(c, "PING")); /* wait out the pause */
    redisFree(c);

    free_objs(src, N);
    for (int t = 0; t < T; t++) free_objs(dst[t], N);
}

/* ---------------------------------------------------------------------
 * A fake server for replies a real one does not give on demand
 * ------------------------------------------------------------------ */

typedef enum fake_mode {
    FAKE_MOVED_TO_ITSELF, /* a cluster whose only node always says MOVED */
    FAKE_PARTIAL_MAP,     /* a cluster map that serves slot 0 only */
    FAKE_GARBAGE,         /* not RESP */
    FAKE_WRONG_TYPE,      /* an integer where a string belongs */
} fake_mode;

#define FAKE_VALUE ((size_t)64 << 20)
#define FAKE_CUT ((size_t)1 << 20)

typedef struct fake_server {
    int listen_fd, port;
    fake_mode mode;
    int value_faults; /* GET: a 64 MiB value; the 1st connection is closed 1 MiB
                       * into it, the 2nd stalls there, later ones get it all */
    int conns;        /* connections accepted (the server thread's) */
    atomic_int stop; /* set by fake_stop, read by the server thread */
    pthread_t thread;
} fake_server;

/* The reply to one command (argv of bulk strings). */
static void fake_reply(fake_server *f, const redisReply *cmd, char *out, size_t size)
{
    int slots = cmd->elements >= 2 && strcasecmp(cmd->element[0]->str, "CLUSTER") == 0;
    if (slots)
        snprintf(out, size, "*1\r\n*3\r\n:0\r\n:%d\r\n*2\r\n$9\r\n127.0.0.1\r\n:%d\r\n",
                 f->mode == FAKE_PARTIAL_MAP ? 0 : 16383, f->port);
    else if (f->mode == FAKE_MOVED_TO_ITSELF)
        snprintf(out, size, "-MOVED 1 127.0.0.1:%d\r\n", f->port);
    else if (f->mode == FAKE_GARBAGE)
        snprintf(out, size, "!!!\r\n");
    else
        snprintf(out, size, ":5\r\n");
}

/* Byte i of the value_faults value. */
static uint8_t fake_byte(size_t i) { return (uint8_t)((i * 2654435761u) >> 11); }

/* value_faults: answer a GET on the nth connection; 0 to close it. */
static int fake_value(int fd, int nth)
{
    char head[32];
    int hl = snprintf(head, sizeof head, "$%zu\r\n", FAKE_VALUE);
    if (send(fd, head, (size_t)hl, MSG_NOSIGNAL) != hl) return 0;
    size_t end = nth <= 2 ? FAKE_CUT : FAKE_VALUE;
    static uint8_t chunk[65536];
    for (size_t off = 0; off < end; off += sizeof chunk) {
        for (size_t i = 0; i < sizeof chunk; i++) chunk[i] = fake_byte(off + i);
        if (send(fd, chunk, sizeof chunk, MSG_NOSIGNAL) != (ssize_t)sizeof chunk) return 0;
    }
    if (nth == 1) return 0;
    return nth == 2 || send(fd, "\r\n", 2, MSG_NOSIGNAL) == 2;
}

static void *fake_main(void *arg)
{
    fake_server *f = arg;
    struct pollfd p[9];
    redisReader *rd[9] = {0};
    int nth[9] = {0};
    int n = 1;
    p[0].fd = f->listen_fd;
    p[0].events = POLLIN;
    while (!f->stop) {
        if (poll(p, (nfds_t)n, 20) <= 0) continue;
        if ((p[0].revents & POLLIN) && n < 9) {
            int c = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0) {
                p[n].fd = c;
                p[n].events = POLLIN;
                p[n].revents = 0;
                nth[n] = ++f->conns;
                rd[n++] = redisReaderCreate();
            }
        }
        for (int i = 1; i < n; i++) {
            if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            char buf[4096];
            ssize_t got = recv(p[i].fd, buf, sizeof buf, 0);
            int keep = got > 0;
            if (keep) redisReaderFeed(rd[i], buf, (size_t)got);
            void *cmd;
            while (keep && redisReaderGetReply(rd[i], &cmd) == REDIS_OK && cmd != NULL) {
                const redisReply *c = cmd;
                if (f->value_faults && c->elements >= 1 &&
                    strcasecmp(c->element[0]->str, "GET") == 0) {
                    keep = fake_value(p[i].fd, nth[i]);
                    freeReplyObject(cmd);
                    continue;
                }
                char out[256];
                fake_reply(f, cmd, out, sizeof out);
                freeReplyObject(cmd);
                if (send(p[i].fd, out, strlen(out), MSG_NOSIGNAL) < 0) break;
            }
            if (!keep) { /* gone, or to be cut: drop it */
                close(p[i].fd);
                redisReaderFree(rd[i]);
                p[i] = p[n - 1];
                rd[i] = rd[n - 1];
                nth[i] = nth[n - 1];
                n--;
                i--;
            }
        }
    }
    for (int i = 1; i < n; i++) {
        close(p[i].fd);
        redisReaderFree(rd[i]);
    }
    return NULL;
}

static int fake_start_ex(fake_server *f, fake_mode mode, int value_faults)
{
    memset(f, 0, sizeof *f);
    f->mode = mode;
    f->value_faults = value_faults;
    f->port = pick_port();
    f->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)f->port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (f->listen_fd < 0 || bind(f->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        listen(f->listen_fd, 16) != 0)
        return -1;
    return pthread_create(&f->thread, NULL, fake_main, f) == 0 ? 0 : -1;
}

static int fake_start(fake_server *f, fake_mode mode) { return fake_start_ex(f, mode, 0); }

static void fake_stop(fake_server *f)
{
    f->stop = 1;
    pthread_join(f->thread, NULL);
    close(f->listen_fd);
}

/* Replies no healthy server gives: each fails its key with a clear
 * message, and nothing loops or hangs. */
static void test_odd_replies(void)
{
    static const struct {
        fake_mode mode;
        int cluster;
    } cases[] = {
        {FAKE_MOVED_TO_ITSELF, 1}, {FAKE_PARTIAL_MAP, 1}, {FAKE_GARBAGE, 0}, {FAKE_WRONG_TYPE, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        fake_server f;
        REQUIRE(fake_start(&f, cases[i].mode) == 0);
        kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                      "\"cluster\":%s,\"timeout_ms\":2000}",
                                      f.port, cases[i].cluster ? "true" : "false");
        REQUIRE(a != NULL);
        kvs_object_key k = key_of(3, "odd");
        kvs_memobj *d = bytes_obj(16, 0);
        kvs_l2_bitmap b;
        int64_t t0 = now_ms();
        CHECK_OK(load_wait(a, &k, &d, 1, &b));
        CHECK(now_ms() - t0 < 1500);
        CHECK_EQ_INT(b.nhits, 0);
        CHECK_EQ_INT(b.status, KVS_EIO);
        char want[256], rk[2048];
        redis_key(KVS_REDIS_DEFAULT_PREFIX, &k, rk, sizeof rk);
        switch (cases[i].mode) {
        case FAKE_MOVED_TO_ITSELF:
            snprintf(want, sizeof want,
                     "redis: load of key 0: too many redirections (last: 127.0.0.1:%d)", f.port);
            break;
        case FAKE_PARTIAL_MAP:
            snprintf(want, sizeof want,
                     "redis: load of key 0: cluster: slot %u is not served by any node",
                     slot_of(rk));
            break;
        case FAKE_GARBAGE:
            snprintf(want, sizeof want,
                     "redis: load of key 0: 127.0.0.1:%d: protocol error: Protocol error, got "
                     "\"!\" as reply type byte",
                     f.port);
            break;
        case FAKE_WRONG_TYPE:
            snprintf(want, sizeof want,
                     "redis: load of key 0: 127.0.0.1:%d: unexpected reply of type 3", f.port);
            break;
        }
        CHECK_EQ_STR(b.message, want);
        kvs_l2_bitmap_release(&b);
        CHECK(status_int(a, "errors", NULL) >= 1);
        kvs_memobj_free(d);
        kvs_l2_destroy(a);
        fake_stop(&f);
    }
}

/* Issue 16 item 3: a connection lost or stalled in the middle of a value
 * being received into its destination fails the key cleanly (a lost
 * connection, a timeout), the connection is dropped, and the next load, on
 * a new connection, receives the whole value. Deterministic: the fake
 * server cuts the first connection and stalls the second 1 MiB into the
 * 64 MiB value. */
static void test_load_cut_mid_value(void)
{
    fake_server f;
    REQUIRE(fake_start_ex(&f, FAKE_WRONG_TYPE, 1) == 0);
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                  "\"connections\":1,\"timeout_ms\":800}",
                                  f.port);
    REQUIRE(a != NULL);
    kvs_object_key k = key_of(1, "cut");
    kvs_memobj *d = bytes_obj(FAKE_VALUE, 0);
    kvs_memobj_set_used_size(d, 0);
    kvs_l2_bitmap b;
    char want[256];
    /* Cut: the connection is new, so no retry hides it. */
    REQUIRE_OK(load_wait(a, &k, &d, 1, &b));
    CHECK_EQ_INT(b.nhits, 0);
    CHECK_EQ_INT(b.status, KVS_EIO);
    snprintf(want, sizeof want,
             "redis: load of key 0: 127.0.0.1:%d: connection lost: server closed the connection",
             f.port);
    CHECK_EQ_STR(b.message, want);
    kvs_l2_bitmap_release(&b);
    CHECK_EQ_INT(kvs_memobj_size(d), 0); /* not a loaded size */
    /* Stalled: the task's time limit, as for any reply. */
    int64_t t0 = now_ms();
    REQUIRE_OK(load_wait(a, &k, &d, 1, &b));
    CHECK(now_ms() - t0 < 5000); /* bounded; not a timing assertion on the limit itself */
    CHECK_EQ_INT(b.nhits, 0);
    CHECK_EQ_INT(b.status, KVS_EIO);
    snprintf(want, sizeof want, "redis: load of key 0: 127.0.0.1:%d: timed out after 800 ms",
             f.port);
    CHECK_EQ_STR(b.message, want);
    kvs_l2_bitmap_release(&b);
    json_t *s = status_of(a);
    CHECK_EQ_INT(json_integer_value(json_object_get(s, "nodes_connected")), 0); /* dropped */
    json_decref(s);
    kvs_l2_destroy(a);
    /* The next load works (a longer limit: 64 MiB under a sanitizer). */
    a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                  "\"connections\":1,\"timeout_ms\":20000}",
                  f.port);
    REQUIRE(a != NULL);
    REQUIRE_OK(load_wait(a, &k, &d, 1, &b));
    CHECK_EQ_INT(b.nhits, 1);
    CHECK_EQ_INT(b.status, KVS_OK);
    kvs_l2_bitmap_release(&b);
    CHECK_EQ_U64(kvs_memobj_size(d), FAKE_VALUE);
    int same = 1;
    for (size_t i = 0; i < FAKE_VALUE; i++) same &= ((const uint8_t *)d->data)[i] == fake_byte(i);
    CHECK(same);
    kvs_l2_destroy(a);
    kvs_memobj_free(d);
    fake_stop(&f);
}

/* ---------------------------------------------------------------------
 * Listing keys
 * ------------------------------------------------------------------ */

/* kvs_l2_list_keys on one server: the contract (kvs_test_list.h) over more
 * keys than one SCAN page; names with the prefix that are not a key's,
 * and other prefixes' keys, are never reported; a prefix with glob
 * characters matches only itself. */
static void test_list_keys(void)
{
    flush_server(S);
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                  "\"key_prefix\":\"lk*[1]:\"}", S);
    kvs_l2_adapter *b = open_json("{\"type\":\"redis\",\"url\":\"redis://127.0.0.1:%d\","
                                  "\"key_prefix\":\"lkX[1]:\"}", S);
    REQUIRE(a != NULL && b != NULL);
    enum { N = 2500 };
    kvs_object_key *keys = calloc(N, sizeof *keys);
    kvs_memobj **objs = calloc(N, sizeof *objs);
    REQUIRE(keys && objs);
    for (int i = 0; i < N; i++) {
        keys[i] = key_of((uint32_t)i, i % 2 ? "org/model" : "m");
        objs[i] = bytes_obj(8, (unsigned)i);
    }
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(a, keys, objs, N, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    REQUIRE_OK(store_wait(b, keys, objs, 3, &sr)); /* another prefix's */
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    redisContext *c = raw_connect(S);
    const char *foreign[] = {"lk*[1]:", "lk*[1]:junk", "lk*[1]:m+/0000000G,0,0",
                             "lk*[1]:m+/00000001,0,0/x", "lk*[1]:m+/00000001,01,0"};
    for (size_t i = 0; i < sizeof foreign / sizeof *foreign; i++)
        CHECK(raw_ok(c, "SET %s x", foreign[i]));
    char rk[2048], path[KVS_FS_KEY_PATH_MAX];
    kvs_fs_key_path(&keys[0], path, sizeof path);
    snprintf(rk, sizeof rk, "lk*[1]:%s%c", path, '\0'); /* a NUL: never a key path */
    redisReply *r = raw(c, "SET %b x", rk, strlen(rk) + 1);
    freeReplyObject(r);
    redisFree(c);
    kvs_test_list_contract(a, keys, N, "redis: adapter is closed");
    kvs_test_listing *l = calloc(1, sizeof *l);
    REQUIRE(l != NULL);
    CHECK_OK(kvs_l2_list_keys(b, kvs_test_listing_add, l));
    CHECK(kvs_test_listing_is(l, keys, 3, NULL));
    free(l);
    kvs_l2_destroy(a);
    kvs_l2_destroy(b);
    free_objs(objs, N);
    free(objs);
    free(keys);
}

/* ---------------------------------------------------------------------
 * Redis Cluster
 * ------------------------------------------------------------------ */

/* The port of the master serving `slot`, from CLUSTER SLOTS on `port`. */
static int owner_port(int port, unsigned slot)
{
    redisContext *c = raw_connect(port);
    redisReply *r = raw(c, "CLUSTER SLOTS");
    kvs_redis_slot_range *ranges;
    size_t n;
    char err[128];
    int owner = -1;
    if (kvs_redis_parse_cluster_slots(r, "127.0.0.1", &ranges, &n, err, sizeof err) == 0) {
        for (size_t i = 0; i < n; i++)
            if (slot >= ranges[i].start && slot <= ranges[i].end) owner = ranges[i].port;
        free(ranges);
    } else {
        fprintf(stderr, "CLUSTER SLOTS: %s\n", err);
    }
    freeReplyObject(r);
    redisFree(c);
    return owner;
}

static void node_id(int port, char *out, size_t size)
{
    redisContext *c = raw_connect(port);
    redisReply *r = raw(c, "CLUSTER MYID");
    snprintf(out, size, "%s", r->type == REDIS_REPLY_STRING ? r->str : "?");
    freeReplyObject(r);
    redisFree(c);
}

static int cluster_ok(int port)
{
    redisContext *c = raw_connect(port);
    redisReply *r = raw(c, "CLUSTER INFO");
    int ok = r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok") != NULL;
    freeReplyObject(r);
    redisFree(c);
    return ok;
}

static void test_cluster_routing_and_slot_migration(void)
{
    server *nodes[3];
    int ports[3];
    for (int i = 0; i < 3; i++) {
        nodes[i] = new_server();
        REQUIRE(start_server(nodes[i], 1, NULL) == 0);
        ports[i] = nodes[i]->port;
    }
    char a0[32], a1[32], a2[32], log[128];
    snprintf(a0, sizeof a0, "127.0.0.1:%d", ports[0]);
    snprintf(a1, sizeof a1, "127.0.0.1:%d", ports[1]);
    snprintf(a2, sizeof a2, "127.0.0.1:%d", ports[2]);
    snprintf(log, sizeof log, "%s/cluster-create.log", tmpdir);
    const char *create[] = {"redis-cli", "--cluster", "create", a0, a1, a2,
                            "--cluster-replicas", "0", "--cluster-yes", NULL};
    int rc = run_program(create, log);
    if (rc != 0) fprintf(stderr, "redis-cli --cluster create exited %d (see %s)\n", rc, log);
    REQUIRE(rc == 0);
    int64_t until = now_ms() + 15000;
    while (now_ms() < until && !(cluster_ok(ports[0]) && cluster_ok(ports[1]) &&
                                 cluster_ok(ports[2])))
        sleep_ms(50);
    REQUIRE(cluster_ok(ports[0]) && cluster_ok(ports[1]) && cluster_ok(ports[2]));

    /* One dead seed first, then one live one: the rest is learnt. */
    int dead = pick_port();
    kvs_l2_adapter *a = open_json("{\"type\":\"redis\",\"cluster\":true,\"urls\":["
                                  "\"redis://127.0.0.1:%d\",\"redis://127.0.0.1:%d\"],"
                                  "\"key_prefix\":\"c:\",\"timeout_ms\":3000}", dead, ports[1]);
    REQUIRE(a != NULL);
    enum { N = 48 };
    kvs_object_key keys[N + 1];
    kvs_memobj *src[N + 1], *dst[N + 1];
    for (int i = 0; i <= N; i++) {
        keys[i] = key_of((uint32_t)i, "cluster/model");
        src[i] = bytes_obj(4096, (unsigned)i);
        dst[i] = bytes_obj(4096, 0);
    }
    kvs_l2_store_result sr;
    REQUIRE_OK(store_wait(a, keys, src, N, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    if (sr.state != KVS_TASK_OK) fprintf(stderr, "cluster store: %s\n", sr.message);
    CHECK_EQ_U64(sr.bytes_written, (uint64_t)N * 4096);
    /* Spread over every master, each key on the master of its slot, and
     * our slot function agrees with the server's. */
    long long total = 0;
    for (int i = 0; i < 3; i++) {
        redisContext *c = raw_connect(ports[i]);
        long long n = raw_int(c, "DBSIZE");
        CHECK(n > 0);
        total += n;
        redisFree(c);
    }
    CHECK_EQ_INT(total, N);
    kvs_test_list_all_then_stop(a, keys, N); /* every master's keys, once each */
    redisContext *c0 = raw_connect(ports[0]);
    char rk[2048];
    for (int i = 0; i < N; i++) {
        redis_key("c:", &keys[i], rk, sizeof rk);
        CHECK_EQ_INT(raw_int(c0, "CLUSTER KEYSLOT %s", rk), slot_of(rk));
    }
    const char *tags[] = {"{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "}{a}", "x{"};
    for (size_t i = 0; i < sizeof tags / sizeof *tags; i++)
        CHECK_EQ_INT(raw_int(c0, "CLUSTER KEYSLOT %s", tags[i]), slot_of(tags[i]));
    redisFree(c0);

    kvs_l2_bitmap b;
    REQUIRE_OK(load_wait(a, keys, dst, N, &b));
    CHECK_EQ_INT(b.nhits, N);
    if (b.nhits != N) fprintf(stderr, "cluster load: %s\n", b.message);
    for (int i = 0; i < N; i++) CHECK(same_bytes(src[i], dst[i]));
    kvs_l2_bitmap_release(&b);
    json_t *s = status_of(a);
    CHECK(json_is_true(json_object_get(s, "cluster")));
    CHECK(json_is_true(json_object_get(s, "is_healthy"))); /* the dead seed is not in use */
    CHECK_EQ_INT(json_array_size(json_object_get(s, "nodes")), 4);
    CHECK_EQ_INT(json_integer_value(json_object_get(s, "nodes_connected")), 3);
    json_decref(s);
    long long refreshes = status_int(a, "slot_map_refreshes", NULL);
    CHECK(refreshes >= 1);

    /* Migrate key 0's slot to another master: IMPORTING / MIGRATING, the
     * key moved with MIGRATE. The adapter's map still says "source". */
    redis_key("c:", &keys[0], rk, sizeof rk);
    unsigned slot = slot_of(rk);
    int src_port = owner_port(ports[0], slot);
    REQUIRE(src_port > 0);
    int dst_port = src_port == ports[0] ? ports[1] : ports[0];
    int third = ports[0] + ports[1] + ports[2] - src_port - dst_port;
    char src_id[64], dst_id[64];
    node_id(src_port, src_id, sizeof src_id);
    node_id(dst_port, dst_id, sizeof dst_id);
    redisContext *cs = raw_connect(src_port), *cd = raw_connect(dst_port);
    REQUIRE(raw_ok(cd, "CLUSTER SETSLOT %u IMPORTING %s", slot, src_id));
    REQUIRE(raw_ok(cs, "CLUSTER SETSLOT %u MIGRATING %s", slot, dst_id));
    REQUIRE(raw_ok(cs, "MIGRATE 127.0.0.1 %d %s 0 5000", dst_port, rk));

    /* ASK: the source no longer has the key. */
    long long asked = status_int(a, "redirections", "ask");
    for (int i = 0; i < N; i++) memset(dst[i]->data, 0, 4096);
    REQUIRE_OK(load_wait(a, keys, dst, N, &b));
    CHECK_EQ_INT(b.nhits, N);
    if (b.nhits != N) fprintf(stderr, "load during migration: %s\n", b.message);
    for (int i = 0; i < N; i++) CHECK(same_bytes(src[i], dst[i]));
    kvs_l2_bitmap_release(&b);
    CHECK(status_int(a, "redirections", "ask") > asked);
    CHECK_EQ_INT(status_int(a, "redirections", "moved"), 0);

    /* A new key of the migrating slot is stored on the target (ASK). */
    uint32_t h = 100000;
    for (;; h++) {
        keys[N] = key_of(h, "cluster/model");
        char rk2[2048];
        redis_key("c:", &keys[N], rk2, sizeof rk2);
        if (slot_of(rk2) == slot) break;
    }
    asked = status_int(a, "redirections", "ask");
    REQUIRE_OK(store_wait(a, &keys[N], &src[N], 1, &sr));
    CHECK_EQ_INT(sr.state, KVS_TASK_OK);
    CHECK(status_int(a, "redirections", "ask") > asked);
    REQUIRE_OK(lookup_wait(a, keys, N + 1, &b));
    CHECK_EQ_INT(b.nhits, N + 1);
    kvs_l2_bitmap_release(&b);
    CHECK_OK(kvs_l2_unlock(a, keys, N + 1));

    /* The slot now belongs to the target everywhere: MOVED, then a new
     * map, then no more redirections. */
    redisContext *ct = raw_connect(third);
    REQUIRE(raw_ok(cd, "CLUSTER SETSLOT %u NODE %s", slot, dst_id));
    REQUIRE(raw_ok(cs, "CLUSTER SETSLOT %u NODE %s", slot, dst_id));
    REQUIRE(raw_ok(ct, "CLUSTER SETSLOT %u NODE %s", slot, dst_id));
    redisFree(ct);
    redisFree(cs);
    redisFree(cd);
    for (int i = 0; i <= N; i++) memset(dst[i]->data, 0, 4096);
    REQUIRE_OK(load_wait(a, keys, dst, N + 1, &b));
    CHECK_EQ_INT(b.nhits, N + 1);
    if (b.nhits != N + 1) fprintf(stderr, "load after migration: %s\n", b.message);
    for (int i = 0; i <= N; i++) CHECK(same_bytes(src[i], dst[i]));
    kvs_l2_bitmap_release(&b);
    long long moved = status_int(a, "redirections", "moved");
    CHECK(moved >= 1);
    CHECK(status_int(a, "slot_map_refreshes", NULL) > refreshes);
    asked = status_int(a, "redirections", "ask");
    REQUIRE_OK(load_wait(a, keys, dst, N + 1, &b));
    CHECK_EQ_INT(b.nhits, N + 1);
    kvs_l2_bitmap_release(&b);
    CHECK_EQ_INT(status_int(a, "redirections", "moved"), moved);
    CHECK_EQ_INT(status_int(a, "redirections", "ask"), asked);

    /* The synchronous calls route too; usage sums the masters. */
    int64_t sz[2];
    kvs_object_key two[2] = {keys[0], keys[N]};
    REQUIRE_OK(kvs_l2_object_sizes(a, two, 2, sz));
    CHECK_EQ_INT(sz[0], 4096);
    CHECK_EQ_INT(sz[1], 4096);
    uint8_t del[2];
    REQUIRE_OK(kvs_l2_delete(a, two, 2, del));
    CHECK(del[0] == 1 && del[1] == 1);
    kvs_l2_usage u;
    REQUIRE_OK(kvs_l2_get_usage(a, &u));
    CHECK(u.bytes_used > 3u * 1000000u); /* three servers' used_memory */
    CHECK_EQ_U64(u.capacity, 0);

    free_objs(src, N + 1);
    free_objs(dst, N + 1);
    kvs_l2_destroy(a);
    for (int i = 0; i < 3; i++) {
        kill_server(nodes[i]);
        nodes[i]->port = 0;
    }
}

int main(void)
{
    if (!on_path("redis-server") || !on_path("redis-cli")) {
        fprintf(stderr, "test_l2_redis: FAIL: redis-server and redis-cli must be on PATH "
                        "(Debian packages redis-server and redis-tools; run "
                        "scripts/setup.sh)\n");
        return 1;
    }
    if (kvs_test_redis_init() != 0) return 1;
    signal(SIGPIPE, SIG_DFL); /* the adapter must never raise it */

    RUN(test_slots_and_redirect_parsing);
    RUN(test_bulk_reader);
    RUN(test_config_refusals);

    server *main_server = new_server();
    if (start_server(main_server, 0, NULL) != 0) {
        fprintf(stderr, "test_l2_redis: FAIL: cannot start redis-server\n");
        return 1;
    }
    S = main_server->port;
    RUN(test_store_lookup_load_delete);
    RUN(test_fp8_through_serde_wrapper);
    RUN(test_load_wrong_layout_size_refused);
    RUN(test_load_in_place);
    RUN(test_two_machines_share_one_store);
    RUN(test_key_evicted_between_lookup_and_load);
    RUN(test_hostile_names_stay_distinct_under_the_prefix);
    RUN(test_timeout_fails_the_task_on_time);
    RUN(test_close_with_tasks_in_flight);
    RUN(test_server_killed_mid_batch_and_restarted);
    RUN(test_due_task_makes_a_final_attempt);
    RUN(test_failure_in_backoff_names_its_cause);
    RUN(test_auth_and_database);
    RUN(test_odd_replies);
    RUN(test_load_cut_mid_value);
    RUN(test_list_keys);
    RUN(test_cluster_routing_and_slot_migration);
    return TEST_SUMMARY();
}
