/* bench_pipeline.c - framed pipelines (pipeline.h) against the plain fp8
 * serde, memcpy and the machine's streaming limit, on --size-mib MiB
 * (default 256) of bfloat16, encode and decode, 1 and 2 threads. Reports;
 * asserts nothing. `make bench-pipeline` builds and runs it.
 *
 * Rows (GB/s are of the bfloat16 side: 1e9 bytes of bfloat16 per second):
 *   memcpy          the bfloat16 bytes copied (the baseline of "x memcpy")
 *   stream 2->1     the read/write limit of fp8's shape: a trivial kernel
 *                   (AVX-512BW or AVX2, checked with __builtin_cpu_supports;
 *                   scalar otherwise) reads the bfloat16, packs one byte per
 *                   element and writes it with non-temporal stores (decode:
 *                   1->2, one byte read, two written, non-temporal)
 *   fp8             the plain fp8 serde (the baseline of "x fp8")
 *   fp8+crc32c, fp8+xxh3, bytes+crc32c    pipeline serdes
 *   fp8+aes_gcm     a pipeline with aes_gcm (key file made at start); when
 *                   the stage refuses creation in this build the row says
 *                   so ("n/a (aes_gcm not built)"): decided at run time by
 *                   trying to create the serde
 *   crc32c alone, xxh3 alone   the checksum over the bfloat16 bytes
 *                   (kvs_crc32c of the library's objects; libxxhash's
 *                   XXH3_64bits); encode and decode are the same pass
 * With 2 threads the buffer is cut in halves, each thread serializes its
 * half as its own object (and deserializes its own blob back); the time is
 * until both are done. Every timed run is one pass over the buffer, after
 * one untimed warm-up pass; each is preceded by a timed memcpy run of the
 * same bytes with the same threads, and "x memcpy" is the median over
 * those pairs of memcpy time / run time (pairing keeps the ratio meaningful
 * on a shared machine, as bench_fp8 does). Figures are medians of --runs
 * (default 5) with the spread (min-max GB/s) so the noise is visible.
 * Every buffer is written before any timing.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <openssl/evp.h>
#include <xxhash.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVS_BENCH_X86 1
#endif

#include "bench_timing.h"
#include "kvserde/error.h"
#include "kvserde/fp8.h"
#include "kvserde/memobj.h"
#include "kvserde/registry.h"
#include "kvserde/serde.h"
#include "frame/pipeline_internal.h"
#include "util/crc32c.h"

#define MAX_RUNS 101
#define NTHREADS_MAX 2

/* ---- the streaming kernels ------------------------------------------------ */

#ifdef KVS_BENCH_X86
__attribute__((target("avx512f,avx512bw"))) static void pack_avx512(const uint16_t *in,
                                                                     uint8_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i a = _mm512_loadu_si512((const void *)(in + i));
        __m512i b = _mm512_loadu_si512((const void *)(in + i + 32));
        __m256i pa = _mm512_cvtepi16_epi8(_mm512_srli_epi16(a, 8));
        __m256i pb = _mm512_cvtepi16_epi8(_mm512_srli_epi16(b, 8));
        __m512i p = _mm512_inserti64x4(_mm512_castsi256_si512(pa), pb, 1);
        _mm512_stream_si512((void *)(out + i), p);
    }
    for (; i < n; i++) out[i] = (uint8_t)(in[i] >> 8);
    _mm_sfence();
}

__attribute__((target("avx512f,avx512bw"))) static void unpack_avx512(const uint8_t *in,
                                                                       uint16_t *out, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_loadu_si256((const void *)(in + i));
        __m512i w = _mm512_slli_epi16(_mm512_cvtepu8_epi16(a), 8);
        _mm512_stream_si512((void *)(out + i), w);
    }
    for (; i < n; i++) out[i] = (uint16_t)(in[i] << 8);
    _mm_sfence();
}

__attribute__((target("avx2"))) static void pack_avx2(const uint16_t *in, uint8_t *out,
                                                      size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i a = _mm256_srli_epi16(_mm256_loadu_si256((const void *)(in + i)), 8);
        __m256i b = _mm256_srli_epi16(_mm256_loadu_si256((const void *)(in + i + 16)), 8);
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
        _mm256_stream_si256((void *)(out + i), p);
    }
    for (; i < n; i++) out[i] = (uint8_t)(in[i] >> 8);
    _mm_sfence();
}

__attribute__((target("avx2"))) static void unpack_avx2(const uint8_t *in, uint16_t *out,
                                                        size_t n)
{
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i a = _mm_loadu_si128((const void *)(in + i));
        __m256i w = _mm256_slli_epi16(_mm256_cvtepu8_epi16(a), 8);
        _mm256_stream_si256((void *)(out + i), w);
    }
    for (; i < n; i++) out[i] = (uint16_t)(in[i] << 8);
    _mm_sfence();
}

__attribute__((target("avx512f"))) static uint64_t read_avx512(const uint8_t *in, size_t n)
{
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    size_t i = 0;
    for (; i + 256 <= n; i += 256) {
        a = _mm512_xor_si512(a, _mm512_loadu_si512((const void *)(in + i)));
        b = _mm512_xor_si512(b, _mm512_loadu_si512((const void *)(in + i + 64)));
        c = _mm512_xor_si512(c, _mm512_loadu_si512((const void *)(in + i + 128)));
        d = _mm512_xor_si512(d, _mm512_loadu_si512((const void *)(in + i + 192)));
    }
    uint64_t r = (uint64_t)_mm512_reduce_or_epi64(
        _mm512_or_si512(_mm512_or_si512(a, b), _mm512_or_si512(c, d)));
    for (; i < n; i++) r += in[i];
    return r;
}

__attribute__((target("avx2"))) static uint64_t read_avx2(const uint8_t *in, size_t n)
{
    __m256i a = _mm256_setzero_si256(), b = a;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        a = _mm256_xor_si256(a, _mm256_loadu_si256((const void *)(in + i)));
        b = _mm256_xor_si256(b, _mm256_loadu_si256((const void *)(in + i + 32)));
    }
    a = _mm256_or_si256(a, b);
    uint64_t r = (uint64_t)_mm256_extract_epi64(a, 0) | (uint64_t)_mm256_extract_epi64(a, 3);
    for (; i < n; i++) r += in[i];
    return r;
}
#endif

static void pack_scalar(const uint16_t *in, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = (uint8_t)(in[i] >> 8);
}

static void unpack_scalar(const uint8_t *in, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) out[i] = (uint16_t)(in[i] << 8);
}

static uint64_t read_scalar(const uint8_t *in, size_t n)
{
    uint64_t r = 0;
    for (size_t i = 0; i < n; i++) r += in[i];
    return r;
}

static void (*g_pack)(const uint16_t *, uint8_t *, size_t) = pack_scalar;
static uint64_t (*g_read)(const uint8_t *, size_t) = read_scalar;
static void (*g_unpack)(const uint8_t *, uint16_t *, size_t) = unpack_scalar;
static const char *g_stream_isa = "scalar";

static void pick_stream_kernel(void)
{
#ifdef KVS_BENCH_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
        g_pack = pack_avx512;
        g_unpack = unpack_avx512;
        g_read = read_avx512;
        g_stream_isa = "avx512";
    } else if (__builtin_cpu_supports("avx2")) {
        g_pack = pack_avx2;
        g_unpack = unpack_avx2;
        g_read = read_avx2;
        g_stream_isa = "avx2";
    }
#endif
}

/* ---- what a thread does ---------------------------------------------------- */

enum kind {
    K_MEMCPY, K_STREAM, K_SERDE, K_CRC32C, K_XXH3,
    /* the parts of the bounds, over the n bytes of fp8 codes */
    K_READ,       /* read-only stream of the codes (a blob region) */
    K_CRC_CACHE,  /* CRC-32C of one cache-resident block, n bytes in all */
    K_AES_CACHE,  /* AES-256-GCM in place over one cache-resident block */
    K_AES_STREAM, /* AES-256-GCM in place over the codes (from memory) */
};

typedef struct row {
    const char *name;
    enum kind kind;
    const char *config; /* K_SERDE: NULL = the plain fp8 serde */
    kvs_serializer *ser;
    kvs_deserializer *de;
    char na[160]; /* non-empty: not measured, this is why */
} row;

/* One thread's share: elements [e0, e0 + n) of the bfloat16 buffer, its own
 * blob region. */
typedef struct share {
    const row *r;
    int decode;
    uint16_t *src;   /* bfloat16 in */
    uint16_t *dst;   /* bfloat16 out (decode, memcpy) */
    uint8_t *blob;   /* its blob region */
    size_t blob_cap;
    size_t blob_len; /* after encode */
    size_t n;        /* elements */
    kvs_memobj src_obj, dst_obj;
    uint8_t *block;  /* its cache-resident block (g_block bytes) */
    int rc;
    uint64_t sink;
} share;

static size_t g_block = (size_t)256 << 10; /* --fuse-kib */
static const uint8_t g_aes_key[32] = {1, 2, 3, 4, 5, 6, 7, 8};
static const uint8_t g_aes_iv[12] = {9, 9, 9};

/* AES-256-GCM in place over n bytes: `p` itself (block 0), or the same
 * block of `block` bytes again and again; the tag into the share's sink. */
static void aes_run(share *s, uint8_t *p, size_t n, size_t block)
{
    EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
    int outl = 0, ok = c && EVP_EncryptInit_ex(c, EVP_aes_256_gcm(), NULL, g_aes_key, g_aes_iv);
    for (size_t done = 0; ok && done < n;) {
        size_t step = block && n - done > block ? block : n - done;
        ok = EVP_EncryptUpdate(c, block ? p : p + done, &outl, block ? p : p + done, (int)step);
        done += step;
    }
    uint8_t tag[16] = {0}, last[16];
    ok = ok && EVP_EncryptFinal_ex(c, last, &outl) &&
         EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag);
    EVP_CIPHER_CTX_free(c);
    if (!ok) {
        fprintf(stderr, "bench_pipeline: AES-256-GCM failed\n");
        exit(1);
    }
    s->sink += tag[0];
}

static void run_share(share *s)
{
    const row *r = s->r;
    switch (r->kind) {
    case K_MEMCPY: memcpy(s->dst, s->src, s->n * 2); break;
    case K_STREAM:
        if (s->decode) g_unpack(s->blob, s->dst, s->n);
        else g_pack(s->src, s->blob, s->n);
        break;
    case K_CRC32C: s->sink += kvs_crc32c(0, s->src, s->n * 2); break;
    case K_XXH3: s->sink += XXH3_64bits(s->src, s->n * 2); break;
    case K_READ: s->sink += g_read(s->blob, s->n); break;
    case K_CRC_CACHE: {
        uint32_t c = 0;
        for (size_t done = 0; done < s->n; done += g_block)
            c = kvs_crc32c(c, s->block, s->n - done < g_block ? s->n - done : g_block);
        s->sink += c;
        break;
    }
    case K_AES_CACHE: aes_run(s, s->block, s->n, g_block); break;
    case K_AES_STREAM: aes_run(s, s->blob, s->n, 0); break;
    case K_SERDE: {
        if (s->decode) {
            kvs_memobj b;
            kvs_layout flat;
            kvs_layout_flat(&flat, s->blob_len, KVS_DTYPE_UINT8);
            kvs_memobj_init(&b, s->blob, s->blob_len, &flat, KVS_FMT_BINARY);
            s->rc = kvs_deserialize(r->de, &b, &s->dst_obj, NULL);
        } else {
            kvs_memobj b;
            kvs_layout flat;
            kvs_layout_flat(&flat, s->blob_cap, KVS_DTYPE_UINT8);
            kvs_memobj_init(&b, s->blob, s->blob_cap, &flat, KVS_FMT_BINARY);
            s->rc = kvs_serialize(r->ser, &s->src_obj, &b, NULL, &s->blob_len);
        }
        if (s->rc != KVS_OK) {
            fprintf(stderr, "bench_pipeline: %s %s: %s\n", r->name,
                    s->decode ? "decode" : "encode", kvs_last_error());
            exit(1);
        }
        break;
    }
    }
}

static void *thread_main(void *arg)
{
    run_share(arg);
    return NULL;
}

/* One pass with nthreads (the caller's thread is one of them). Seconds. */
static double pass(share *sh, int nthreads)
{
    pthread_t t;
    double t0 = now_s();
    if (nthreads > 1 && pthread_create(&t, NULL, thread_main, &sh[1]) != 0) {
        fprintf(stderr, "bench_pipeline: cannot start a thread\n");
        exit(1);
    }
    run_share(&sh[0]);
    if (nthreads > 1) pthread_join(t, NULL);
    return now_s() - t0;
}

/* ---- the buffers ------------------------------------------------------------ */

static uint16_t *g_src, *g_dst;
static uint8_t *g_blob, *g_blocks[NTHREADS_MAX];
static size_t g_n, g_blob_bytes;

static uint64_t rng = 0x2545F4914F6CDD1DULL;
static uint32_t rand32(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1DULL) >> 32);
}

/* bfloat16 with random sign and mantissa, exponent 2^-12 .. 2^9 (mostly in
 * the fp8 ranges), as bench_fp8's data. A 256 Ki pattern repeated. */
static void fill_source(void)
{
    enum { PAT = 1 << 18 };
    for (size_t i = 0; i < g_n; i++) {
        if (i < PAT) {
            uint32_t r = rand32();
            unsigned e = 127 - 12 + (r >> 8) % 22;
            g_src[i] = (uint16_t)((r >> 31) << 15 | e << 7 | (r & 0x7F));
        } else {
            g_src[i] = g_src[i % PAT];
        }
    }
}

static void make_shares(share *sh, const row *r, int nthreads, int decode)
{
    size_t half = g_n / (size_t)nthreads;
    size_t cap = g_blob_bytes / (size_t)nthreads;
    for (int i = 0; i < nthreads; i++) {
        share *s = &sh[i];
        size_t blob_len = s->blob_len; /* kept from the encode pass */
        memset(s, 0, sizeof *s);
        s->r = r;
        s->decode = decode;
        s->n = i == nthreads - 1 ? g_n - half * (size_t)i : half;
        s->src = g_src + half * (size_t)i;
        s->dst = g_dst + half * (size_t)i;
        s->blob = g_blob + (cap & ~(size_t)63) * (size_t)i;
        s->blob_cap = cap & ~(size_t)63;
        s->blob_len = blob_len;
        s->block = g_blocks[i];
        kvs_layout lay;
        kvs_layout_flat(&lay, s->n, KVS_DTYPE_BFLOAT16);
        kvs_memobj_init(&s->src_obj, s->src, s->n * 2, &lay, KVS_FMT_KV_2LTD);
        kvs_memobj_init(&s->dst_obj, s->dst, s->n * 2, &lay, KVS_FMT_KV_2LTD);
    }
}

/* ---- measuring ------------------------------------------------------------- */

typedef struct result {
    int measured;
    double med_gbps, min_gbps, max_gbps, x_memcpy;
} result;

static int g_runs = 5;

static void measure(share *sh, int nthreads, share *copy, result *out)
{
    double gb[MAX_RUNS], ratio[MAX_RUNS];
    (void)pass(sh, nthreads); /* warm-up (and, for encode, the blob decode reads) */
    for (int k = 0; k < g_runs; k++) {
        double m = pass(copy, nthreads);
        double t = pass(sh, nthreads);
        gb[k] = (double)g_n * 2 / t / 1e9;
        ratio[k] = m / t;
    }
    out->measured = 1;
    out->med_gbps = median(gb, g_runs);
    out->x_memcpy = median(ratio, g_runs);
    out->min_gbps = out->max_gbps = gb[0];
    for (int k = 1; k < g_runs; k++) {
        if (gb[k] < out->min_gbps) out->min_gbps = gb[k];
        if (gb[k] > out->max_gbps) out->max_gbps = gb[k];
    }
}

static int write_key_file(char *path, size_t cap)
{
    snprintf(path, cap, "%s/kvs-bench-aes-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    uint8_t key[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)rand32();
    int ok = write(fd, key, sizeof key) == (ssize_t)sizeof key;
    close(fd);
    return ok ? 0 : -1;
}

static void usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--size-mib N] [--runs N] [--fuse-kib N]\n"
            "  --size-mib N  bfloat16 buffer size (default 256)\n"
            "  --runs N      timed runs per figure, median reported (default 5, at most %d)\n"
            "  --fuse-kib N  the pipeline's fused block and the in-cache block of the bound\n"
            "                rows, KiB of fp8 output (default 256, 4 to 1048576)\n"
            "  --only TEXT   measure only the rows whose name holds TEXT (repeatable; memcpy\n"
            "                and plain fp8 are always measured, the baselines)\n",
            argv0, MAX_RUNS);
}

int main(int argc, char **argv)
{
    size_t size_mib = 256;
    const char *only[16];
    int nonly = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--size-mib") == 0 && i + 1 < argc) {
            size_mib = (size_t)atol(argv[++i]);
        } else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
            g_runs = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc && nonly < 16) {
            only[nonly++] = argv[++i];
        } else if (strcmp(argv[i], "--fuse-kib") == 0 && i + 1 < argc) {
            long kib = atol(argv[++i]);
            if (kib < 4 || kib > (1 << 20)) {
                usage(argv[0]);
                return 2;
            }
            g_block = (size_t)kib << 10;
            kvs_pipeline_fuse_block = g_block;
        } else {
            usage(argv[0]);
            return 2;
        }
    }
    if (size_mib == 0 || g_runs < 1 || g_runs > MAX_RUNS) {
        usage(argv[0]);
        return 2;
    }
    pick_stream_kernel();
    g_n = size_mib << 19; /* bfloat16 elements */

    char keyfile[256] = "", aes_cfg[512];
    int have_key = write_key_file(keyfile, sizeof keyfile) == 0;
    snprintf(aes_cfg, sizeof aes_cfg,
             "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"aes_gcm\","
             "\"key_files\":[\"%s\"]}]}",
             keyfile);

    row rows[] = {
        {"memcpy", K_MEMCPY, NULL, NULL, NULL, ""},
        {"stream 2->1 / 1->2", K_STREAM, NULL, NULL, NULL, ""},
        {"fp8 (plain serde)", K_SERDE, NULL, NULL, NULL, ""},
        {"pipeline fp8+crc32c", K_SERDE,
         "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"crc32c\"}]}", NULL,
         NULL, ""},
        {"pipeline fp8+xxh3", K_SERDE,
         "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"xxh3\"}]}", NULL,
         NULL, ""},
        {"pipeline bytes+crc32c", K_SERDE,
         "{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"crc32c\"}]}",
         NULL, NULL, ""},
        /* fp8+aes_gcm: added by the lead; measured once the stage creates */
        {"pipeline fp8+aes_gcm", K_SERDE, aes_cfg, NULL, NULL, ""},
        {"crc32c alone", K_CRC32C, NULL, NULL, NULL, ""},
        {"xxh3 alone", K_XXH3, NULL, NULL, NULL, ""},
        {"[b] read the codes", K_READ, NULL, NULL, NULL, ""},
        {"[b] crc32c in cache", K_CRC_CACHE, NULL, NULL, NULL, ""},
        {"[b] aes_gcm in cache", K_AES_CACHE, NULL, NULL, NULL, ""},
        {"[b] aes_gcm over codes", K_AES_STREAM, NULL, NULL, NULL, ""},
    };
    enum {
        NROWS = sizeof rows / sizeof rows[0], ROW_MEMCPY = 0, ROW_FP8 = 2, ROW_CRC = 3,
        ROW_AES = 6, ROW_READ = 9, ROW_CRC_CACHE = 10, ROW_AES_CACHE = 11, ROW_AES_STREAM = 12
    };

    /* Serdes, and the largest blob any of them writes for the whole buffer
     * or for a half (2 threads). */
    kvs_layout whole, half;
    kvs_layout_flat(&whole, g_n, KVS_DTYPE_BFLOAT16);
    kvs_layout_flat(&half, g_n / 2, KVS_DTYPE_BFLOAT16);
    g_blob_bytes = g_n * 2 + 4096;
    for (int i = 0; i < NROWS; i++) {
        row *r = &rows[i];
        if (r->kind != K_SERDE) continue;
        int rc;
        if (r->config == NULL) {
            rc = kvs_fp8_serde_create(KVS_DTYPE_FLOAT8_E4M3FN, 1, &r->ser, &r->de);
        } else {
            kvs_serde_pair p;
            rc = kvs_serde_create_pair(r->config, &p);
            r->ser = p.serializer;
            r->de = p.deserializer;
        }
        if (rc != KVS_OK) {
            if (strstr(r->name, "aes_gcm") && rc == KVS_EUNSUPPORTED)
                snprintf(r->na, sizeof r->na, "n/a (aes_gcm not built)");
            else if (strstr(r->name, "aes_gcm"))
                snprintf(r->na, sizeof r->na, "n/a (aes_gcm refused: %s)", kvs_last_error());
            else
                snprintf(r->na, sizeof r->na, "n/a (%s)", kvs_last_error());
            continue;
        }
        size_t e1 = 0, e2 = 0;
        if (kvs_estimate_serialized_size(r->ser, &whole, &e1) == KVS_OK && e1 > g_blob_bytes)
            g_blob_bytes = e1;
        if (kvs_estimate_serialized_size(r->ser, &half, &e2) == KVS_OK &&
            2 * (e2 + 64) > g_blob_bytes)
            g_blob_bytes = 2 * (e2 + 64);
    }
    for (int i = 0; i < NROWS && nonly > 0; i++) {
        int keep = i == ROW_MEMCPY || i == ROW_FP8;
        for (int k = 0; k < nonly; k++) keep |= strstr(rows[i].name, only[k]) != NULL;
        if (!keep && rows[i].na[0] == '\0')
            snprintf(rows[i].na, sizeof rows[i].na, "(not selected)");
    }
    if (!have_key && rows[ROW_AES].na[0] == '\0')
        snprintf(rows[ROW_AES].na, sizeof rows[ROW_AES].na, "n/a (no key file could be written)");

    g_blob_bytes = (g_blob_bytes + 63) & ~(size_t)63;
    g_src = aligned_alloc(64, g_n * 2);
    g_dst = aligned_alloc(64, g_n * 2);
    g_blob = aligned_alloc(64, g_blob_bytes);
    for (int i = 0; i < NTHREADS_MAX; i++) {
        g_blocks[i] = aligned_alloc(64, g_block);
        if (g_blocks[i]) memset(g_blocks[i], 0x5a, g_block);
    }
    if (g_src == NULL || g_dst == NULL || g_blob == NULL || g_blocks[0] == NULL ||
        g_blocks[1] == NULL) {
        fprintf(stderr, "bench_pipeline: cannot allocate %zu MiB\n",
                (4 * g_n + g_blob_bytes) >> 20);
        return 1;
    }
    fill_source();
    memset(g_dst, 0, g_n * 2);
    memset(g_blob, 0, g_blob_bytes);

    static result res[NROWS][2][2]; /* row, threads-1, decode */
    static share sh[NTHREADS_MAX], cp[NTHREADS_MAX];
    row memcpy_row = {"memcpy", K_MEMCPY, NULL, NULL, NULL, ""};
    for (int t = 1; t <= 2; t++) {
        for (int i = 0; i < NROWS; i++) {
            if (rows[i].na[0]) continue;
            for (int d = 0; d < 2; d++) {
                /* encode first: its blob is what decode reads */
                make_shares(sh, &rows[i], t, d);
                if (d && rows[i].kind == K_SERDE) {
                    for (int k = 0; k < t; k++) sh[k].decode = 0;
                    (void)pass(sh, t); /* blobs of this thread split */
                    for (int k = 0; k < t; k++) sh[k].decode = 1;
                }
                make_shares(cp, &memcpy_row, t, 0);
                if (d && rows[i].kind != K_SERDE && rows[i].kind != K_STREAM) {
                    res[i][t - 1][1] = res[i][t - 1][0]; /* the same pass */
                    continue;
                }
                measure(sh, t, cp, &res[i][t - 1][d]);
            }
        }
    }

    if (keyfile[0]) unlink(keyfile);

    printf("bench_pipeline: %zu MiB of bfloat16 (%zu elements), median of %d runs (spread "
           "min-max), GB/s = 1e9 bytes of bfloat16 per second;\n"
           "x memcpy: median over runs of memcpy time / run time, memcpy timed right before "
           "each run; x fp8: over the plain fp8 serde's median, same threads and direction;\n"
           "stream kernel: %s; 2 threads: two halves, each its own object\n",
           size_mib, g_n, g_runs, g_stream_isa);
    for (int t = 1; t <= 2; t++) {
        printf("\n== %d thread%s ==\n", t, t > 1 ? "s" : "");
        printf("%-24s | %-26s %8s %6s | %-26s %8s %6s\n", "", "encode GB/s [min-max]",
               "x memcpy", "x fp8", "decode GB/s [min-max]", "x memcpy", "x fp8");
        for (int i = 0; i < NROWS; i++) {
            printf("%-24s |", rows[i].name);
            if (rows[i].na[0]) {
                printf(" %s\n", rows[i].na);
                continue;
            }
            for (int d = 0; d < 2; d++) {
                const result *r = &res[i][t - 1][d], *f = &res[ROW_FP8][t - 1][d];
                char a[64];
                snprintf(a, sizeof a, "%6.2f [%6.2f-%6.2f]", r->med_gbps, r->min_gbps,
                         r->max_gbps);
                char xf[16] = "-";
                if (f->measured) snprintf(xf, sizeof xf, "%.2f", r->med_gbps / f->med_gbps);
                printf(" %-26s %8.2f %6s %s", a, r->x_memcpy, xf, d ? "\n" : "|");
            }
        }
    }
    printf("\n(crc32c / xxh3 alone: one pass over the bfloat16 bytes; [b] rows: the parts of "
           "the bounds below,\n over the fp8 codes (half the bfloat16 bytes; in cache: one "
           "%zu KiB block per thread again and again),\n GB/s still of the bfloat16 they "
           "stand for; each is one pass, shown under encode and decode alike)\n",
           g_block >> 10);
    /* What the rule allows: a frame's checks pass before a destination byte
     * is written, so on decode the check (a read of the codes, or their
     * decryption into scratch) and the fp8 decode run one after the other;
     * on encode the check or the cipher runs on each block in cache right
     * after fp8 writes it. Times add: bound = 1 / (1/a + 1/b). */
    printf("\n== bounds: what each pipeline would reach if it cost only its parts, measured "
           "above ==\n");
    printf("%-8s %-22s %-44s %8s %8s %8s %8s\n", "threads", "pipeline", "bound = a + b",
           "GB/s", "bound", "x bound", "bnd/mcp");
    struct {
        int row, dir, a, b;
        const char *what;
    } bounds[] = {
        {ROW_CRC, 0, ROW_FP8, ROW_CRC_CACHE, "fp8 encode + crc32c in cache"},
        {ROW_CRC, 1, ROW_READ, ROW_FP8, "read the codes + fp8 decode"},
        {ROW_AES, 0, ROW_FP8, ROW_AES_CACHE, "fp8 encode + aes_gcm in cache"},
        {ROW_AES, 1, ROW_AES_STREAM, ROW_FP8, "aes_gcm over codes + fp8 decode"},
    };
    for (int t = 1; t <= 2; t++) {
        for (size_t k = 0; k < sizeof bounds / sizeof bounds[0]; k++) {
            const result *m = &res[bounds[k].row][t - 1][bounds[k].dir];
            const result *a = &res[bounds[k].a][t - 1][bounds[k].dir];
            const result *b = &res[bounds[k].b][t - 1][bounds[k].dir];
            const result *mc = &res[ROW_MEMCPY][t - 1][0];
            if (!m->measured || !a->measured || !b->measured) continue;
            double bound = 1.0 / (1.0 / a->med_gbps + 1.0 / b->med_gbps);
            char name[64];
            snprintf(name, sizeof name, "%s %s", rows[bounds[k].row].name + 9,
                     bounds[k].dir ? "dec" : "enc");
            printf("%-8d %-22s %-44s %8.2f %8.2f %8.2f %8.2f\n", t, name, bounds[k].what,
                   m->med_gbps, bound, m->med_gbps / bound, bound / mc->med_gbps);
        }
    }
    printf("(GB/s: the pipeline's median; bnd/mcp: the bound over the same run's memcpy of "
           "the bfloat16)\n");
    char la[64] = "?";
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fgets(la, sizeof la, lf) == NULL) snprintf(la, sizeof la, "?");
        fclose(lf);
    }
    printf("load average at the end: %s", la);
    for (int i = 0; i < NROWS; i++) {
        kvs_serializer_destroy(rows[i].ser);
        kvs_deserializer_destroy(rows[i].de);
    }
    free(g_src);
    free(g_dst);
    free(g_blob);
    for (int i = 0; i < NTHREADS_MAX; i++) free(g_blocks[i]);
    return 0;
}
