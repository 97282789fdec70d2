/* fp8_bench.c - fp8 conversion throughput, as a ratio to memcpy measured in
 * the same run (DESIGN.md section 4). Reports; asserts nothing.
 *
 * For every conversion (bfloat16/float16/float32 -> e4m3fn/e5m2 and back),
 * every kernel variant asked for and available, and every thread count:
 *   - memory-bound: the wide-side buffer (float32/float16/bfloat16) is
 *     --size-mib MiB (default 256), the fp8 buffer a half or a quarter of it;
 *   - in cache: the same with a --cache-kib KiB (default 1024) wide buffer,
 *     converted over and over.
 * A timed run repeats the conversion until it takes at least --min-ms
 * (default 50 ms), after one untimed warm-up pass; the figure is the median
 * of --runs such runs (default 5). Buffers are written before any
 * timing (so every page is faulted in). With n threads, each converts its
 * own contiguous 1/n of the buffer (split on 64-element boundaries),
 * started and stopped together by barriers.
 *
 * memcpy copies the conversion's wide-side byte count (encode: its input,
 * decode: its output) with the same threads, in the same run: one timed
 * memcpy run right before each timed conversion run. "x memcpy" is the
 * median over those pairs of memcpy's time over the conversion's, that is
 * wide-side bytes per second over memcpy's bytes per second; pairing keeps
 * the ratio meaningful when the machine's load changes during the run.
 *
 * Input data: float32 values with random sign, random mantissa and a
 * random exponent in 2^-12 .. 2^9 (mostly inside the fp8 ranges, some
 * subnormal, some overflowing e4m3fn), converted exactly-rounded to
 * float16 / bfloat16; fp8 codes are random bytes (NaN codes included).
 * The SIMD kernels do not branch on data; the scalar one does a little.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bench_timing.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVS_BENCH_X86 1
#endif

#include "codecs/fp8_kernels.h"
#include "codecs/half.h"
#include "fp8_bench.h"
#include "kvserde/fp8.h"

#define MAX_THREADS 64
#define MAX_RUNS 101

#define NISA 4 /* kvs_fp8_isa_names() */
static const char *const *isa_names;
static const char *const fmt_names[KVS_FP8_NFMT] = {"e4m3fn", "e5m2"};
static const char *const wide_names[KVS_NWIDE] = {"float32", "float16", "bfloat16"};
static const size_t wide_size[KVS_NWIDE] = {4, 2, 2};
/* print order: bfloat16, float16, float32 */
static const int wide_order[KVS_NWIDE] = {KVS_WIDE_BF16, KVS_WIDE_F16, KVS_WIDE_F32};

typedef struct options {
    int json;
    size_t size_bytes;  /* memory-bound wide buffer */
    size_t cache_bytes; /* in-cache wide buffer */
    int runs;
    double min_s;
    int threads[8];
    int nthreads;
    int isa[NISA]; /* asked for */
    int nt_sweep;
} options;

/* ---- timing and threads --------------------------------------------------- */

/* ---- the streaming limit ----------------------------------------------------
 * What a conversion of a given read/write shape could reach if it did no
 * arithmetic: n elements of `in` bytes read with 64-byte AVX-512 loads, one
 * byte of each (2->1, 4->1: the low byte; 1->2, 1->4: zero-extended) written
 * with 64-byte non-temporal stores, no software prefetch. Scalar (ordinary
 * stores) when the CPU lacks AVX-512BW; the report names which. The bench's
 * buffers are 4096-aligned and split on 64-element boundaries, so every
 * store is a whole aligned line. */
#ifdef KVS_BENCH_X86
#define KVS_BENCH_T __attribute__((target("avx512f,avx512bw")))
KVS_BENCH_T static void limit_21(const void *src, void *dst, size_t n)
{
    const uint16_t *s = src;
    uint8_t *d = dst;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m256i a = _mm512_cvtepi16_epi8(_mm512_loadu_si512((const void *)(s + i)));
        const __m256i b = _mm512_cvtepi16_epi8(_mm512_loadu_si512((const void *)(s + i + 32)));
        _mm512_stream_si512((void *)(d + i), _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1));
    }
    for (; i < n; i++) d[i] = (uint8_t)s[i];
    _mm_sfence();
}
KVS_BENCH_T static void limit_41(const void *src, void *dst, size_t n)
{
    const uint32_t *s = src;
    uint8_t *d = dst;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m512i v = _mm512_castsi128_si512(_mm512_cvtepi32_epi8(_mm512_loadu_si512((const void *)(s + i))));
        v = _mm512_inserti32x4(v, _mm512_cvtepi32_epi8(_mm512_loadu_si512((const void *)(s + i + 16))), 1);
        v = _mm512_inserti32x4(v, _mm512_cvtepi32_epi8(_mm512_loadu_si512((const void *)(s + i + 32))), 2);
        v = _mm512_inserti32x4(v, _mm512_cvtepi32_epi8(_mm512_loadu_si512((const void *)(s + i + 48))), 3);
        _mm512_stream_si512((void *)(d + i), v);
    }
    for (; i < n; i++) d[i] = (uint8_t)s[i];
    _mm_sfence();
}
KVS_BENCH_T static void limit_12(const void *src, void *dst, size_t n)
{
    const uint8_t *s = src;
    uint16_t *d = dst;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512i a = _mm512_loadu_si512((const void *)(s + i));
        _mm512_stream_si512((void *)(d + i), _mm512_cvtepu8_epi16(_mm512_castsi512_si256(a)));
        _mm512_stream_si512((void *)(d + i + 32), _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(a, 1)));
    }
    for (; i < n; i++) d[i] = s[i];
    _mm_sfence();
}
KVS_BENCH_T static void limit_14(const void *src, void *dst, size_t n)
{
    const uint8_t *s = src;
    uint32_t *d = dst;
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        const __m512i a = _mm512_loadu_si512((const void *)(s + i));
        _mm512_stream_si512((void *)(d + i), _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(a, 0)));
        _mm512_stream_si512((void *)(d + i + 16), _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(a, 1)));
        _mm512_stream_si512((void *)(d + i + 32), _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(a, 2)));
        _mm512_stream_si512((void *)(d + i + 48), _mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(a, 3)));
    }
    for (; i < n; i++) d[i] = s[i];
    _mm_sfence();
}
#endif
static void limit_scalar_21(const void *src, void *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)((const uint16_t *)src)[i];
}
static void limit_scalar_41(const void *src, void *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = (uint8_t)((const uint32_t *)src)[i];
}
static void limit_scalar_12(const void *src, void *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = ((const uint8_t *)src)[i];
}
static void limit_scalar_14(const void *src, void *dst, size_t n)
{
    for (size_t i = 0; i < n; i++) ((uint32_t *)dst)[i] = ((const uint8_t *)src)[i];
}

typedef void (*limit_fn)(const void *src, void *dst, size_t n);
/* [encode 0 / decode 1][element size 2 -> 0, 4 -> 1] */
static limit_fn limit_kernels[2][2] = {{limit_scalar_21, limit_scalar_41},
                                       {limit_scalar_12, limit_scalar_14}};
static const char *limit_isa = "scalar";
static const char *const limit_shape[2][2] = {{"2->1", "4->1"}, {"1->2", "1->4"}};

static void pick_limit_kernels(void)
{
#ifdef KVS_BENCH_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")) {
        limit_kernels[0][0] = limit_21;
        limit_kernels[0][1] = limit_41;
        limit_kernels[1][0] = limit_12;
        limit_kernels[1][1] = limit_14;
        limit_isa = "avx512";
    }
#endif
}

enum { OP_MEMCPY, OP_ENCODE, OP_DECODE, OP_LIMIT };

/* What one thread does `reps` times. */
typedef struct work {
    int op;
    kvs_fp8_encode_fn enc;
    kvs_fp8_decode_fn dec;
    limit_fn lim;
    const unsigned char *src;
    unsigned char *dst;
    size_t n; /* elements (memcpy: bytes) */
    int reps;
} work;

typedef struct team {
    pthread_barrier_t start, stop;
    work w[MAX_THREADS];
} team;

typedef struct member {
    team *t;
    int id;
} member;

static void do_work(const work *w)
{
    for (int r = 0; r < w->reps; r++) {
        switch (w->op) {
        case OP_MEMCPY: memcpy(w->dst, w->src, w->n); break;
        case OP_ENCODE: w->enc(w->src, w->dst, w->n, 1); break;
        case OP_LIMIT: w->lim(w->src, w->dst, w->n); break;
        default: w->dec(w->src, w->dst, w->n); break;
        }
    }
}

static void *member_main(void *arg)
{
    member *m = (member *)arg;
    pthread_barrier_wait(&m->t->start);
    do_work(&m->t->w[m->id]);
    pthread_barrier_wait(&m->t->stop);
    return NULL;
}

/* One timed measurement: all threads start together, the time is until the
 * last one is done. Returns seconds, or a negative value on failure. */
static double run_team(team *t, int nthreads)
{
    pthread_t tid[MAX_THREADS];
    member m[MAX_THREADS];
    if (pthread_barrier_init(&t->start, NULL, (unsigned)nthreads) != 0 ||
        pthread_barrier_init(&t->stop, NULL, (unsigned)nthreads) != 0)
        return -1;
    int started = 1;
    for (int i = 1; i < nthreads; i++) {
        m[i] = (member){t, i};
        if (pthread_create(&tid[i], NULL, member_main, &m[i]) != 0) {
            fprintf(stderr, "fp8 bench: cannot start a thread\n");
            exit(1); /* the barrier would wait forever */
        }
        started++;
    }
    pthread_barrier_wait(&t->start);
    const double t0 = now_s();
    do_work(&t->w[0]);
    pthread_barrier_wait(&t->stop);
    const double t1 = now_s();
    for (int i = 1; i < started; i++)
        pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&t->start);
    pthread_barrier_destroy(&t->stop);
    return t1 - t0;
}

/* Split n elements of a conversion (or n bytes of memcpy) over nthreads,
 * on 64-element boundaries. */
static void split(team *t, int nthreads, const work *whole, size_t src_es, size_t dst_es)
{
    const size_t blocks = (whole->n + 63) / 64;
    for (int i = 0; i < nthreads; i++) {
        size_t b0 = blocks * (size_t)i / (size_t)nthreads;
        size_t b1 = blocks * (size_t)(i + 1) / (size_t)nthreads;
        size_t e0 = b0 * 64, e1 = b1 * 64 < whole->n ? b1 * 64 : whole->n;
        if (e0 > whole->n) e0 = whole->n;
        t->w[i] = *whole;
        t->w[i].src = whole->src + e0 * src_es;
        t->w[i].dst = whole->dst + e0 * dst_es;
        t->w[i].n = e1 - e0;
    }
}

typedef struct measurement {
    double seconds[MAX_RUNS];  /* the conversion, per pass */
    double memcpy_s[MAX_RUNS]; /* the memcpy run just before it, per pass */
    double limit_s[MAX_RUNS];  /* the streaming-limit run just before it */
    int nruns;
    double median_s, memcpy_median_s, limit_median_s;
    double ratio; /* median over runs of memcpy time / conversion time */
    double ratio_limit, ratio_limit_min, ratio_limit_max; /* limit time / conversion time */
} measurement;

/* Prepare a team for `whole` and choose its repetitions from one untimed
 * warm-up run, so that a timed run lasts at least opt->min_s. */
static int prepare(team *t, const options *opt, int nthreads, const work *whole, size_t src_es,
                   size_t dst_es)
{
    split(t, nthreads, whole, src_es, dst_es);
    const double once = run_team(t, nthreads);
    int reps = 1;
    if (once < opt->min_s)
        reps = (int)ceil(opt->min_s / (once > 1e-7 ? once : 1e-7));
    if (reps > 1000000) reps = 1000000;
    for (int i = 0; i < nthreads; i++)
        t->w[i].reps = reps;
    return reps;
}

/* opt->runs timed runs of the conversion, each right after a timed memcpy
 * run of the same wide-side bytes and a timed run of the streaming-limit
 * kernel of the same shape and elements: the ratios of each triple are taken
 * under the same conditions, which keeps them meaningful on a shared
 * machine. */
static void measure(const options *opt, int nthreads, const work *conv, size_t src_es,
                    size_t dst_es, const work *copy, const work *limit, measurement *out)
{
    static team tc, tm, tl; /* large: not on the stack */
    const int rc = prepare(&tc, opt, nthreads, conv, src_es, dst_es);
    const int rm = prepare(&tm, opt, nthreads, copy, 1, 1);
    const int rl = prepare(&tl, opt, nthreads, limit, src_es, dst_es);
    double ratios[MAX_RUNS], rlim[MAX_RUNS], tmp[MAX_RUNS];
    out->nruns = 0;
    for (int r = 0; r < opt->runs; r++) {
        const double m = run_team(&tm, nthreads) / rm;
        const double l = run_team(&tl, nthreads) / rl;
        const double c = run_team(&tc, nthreads) / rc;
        out->memcpy_s[out->nruns] = m;
        out->limit_s[out->nruns] = l;
        out->seconds[out->nruns] = c;
        rlim[out->nruns] = l / c;
        ratios[out->nruns++] = m / c;
    }
    const size_t bytes = sizeof(double) * (size_t)out->nruns;
    memcpy(tmp, out->seconds, bytes);
    out->median_s = median(tmp, out->nruns);
    memcpy(tmp, out->memcpy_s, bytes);
    out->memcpy_median_s = median(tmp, out->nruns);
    memcpy(tmp, out->limit_s, bytes);
    out->limit_median_s = median(tmp, out->nruns);
    out->ratio = median(ratios, out->nruns);
    out->ratio_limit = median(rlim, out->nruns); /* sorts rlim */
    out->ratio_limit_min = rlim[0];
    out->ratio_limit_max = rlim[out->nruns - 1];
}

/* ---- data ---------------------------------------------------------------- */

static uint64_t rng = 0x2545F4914F6CDD1DULL;

static uint32_t rand32(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1DULL) >> 32);
}

#define PATTERN_ELEMS (1u << 18)

/* Fill buf (bytes) with wide-type data: a random pattern, tiled. */
static void fill_wide(unsigned char *buf, size_t bytes, int wide)
{
    const size_t es = wide_size[wide];
    unsigned char *pat = malloc(PATTERN_ELEMS * es);
    if (!pat) {
        memset(buf, 0x3C, bytes);
        return;
    }
    for (size_t i = 0; i < PATTERN_ELEMS; i++) {
        const uint32_t r = rand32();
        const uint32_t e = 127 - 12 + rand32() % 21;
        const uint32_t f = (r & 0x80000000u) | (e << 23) | (rand32() & 0x7FFFFFu);
        if (wide == KVS_WIDE_F32) {
            memcpy(pat + 4 * i, &f, 4);
        } else {
            const uint16_t h = wide == KVS_WIDE_F16 ? kvs_f32_bits_to_f16_bits(f)
                                                    : kvs_f32_bits_to_bf16_bits(f);
            memcpy(pat + 2 * i, &h, 2);
        }
    }
    const size_t pbytes = PATTERN_ELEMS * es;
    for (size_t off = 0; off < bytes; off += pbytes)
        memcpy(buf + off, pat, bytes - off < pbytes ? bytes - off : pbytes);
    free(pat);
}

static void fill_codes(unsigned char *buf, size_t bytes)
{
    for (size_t i = 0; i < bytes; i += 4) {
        const uint32_t r = rand32();
        memcpy(buf + i, &r, bytes - i < 4 ? bytes - i : 4);
    }
}

static void *alloc_faulted(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytes ? bytes : 1) != 0)
        return NULL;
    memset(p, 0, bytes); /* touch every page now, not while timing */
    return p;
}

/* ---- results --------------------------------------------------------------- */

typedef struct result {
    size_t wide_bytes;
    int threads;
    int op; /* OP_ENCODE / OP_DECODE */
    int fmt, wide, isa;
    int in_cache;
    double median_s, memcpy_s, ratio;
    double limit_s, ratio_limit, ratio_limit_min, ratio_limit_max;
    double runs_s[MAX_RUNS], memcpy_runs_s[MAX_RUNS], limit_runs_s[MAX_RUNS];
    int nruns;
} result;

typedef struct group { /* one (size, threads) */
    size_t wide_bytes;
    int threads;
    int in_cache; /* the --cache-kib group */
    double memcpy_s; /* median of every memcpy run of the group */
} group;

static double gbps(size_t bytes, double s)
{
    return s > 0 ? (double)bytes / s * 1e-9 : 0.0;
}

static const result *find_scalar(const result *res, int nres, const result *r)
{
    for (int i = 0; i < nres; i++)
        if (res[i].isa == 0 && res[i].op == r->op && res[i].fmt == r->fmt &&
            res[i].wide == r->wide && res[i].threads == r->threads &&
            res[i].wide_bytes == r->wide_bytes && res[i].in_cache == r->in_cache)
            return &res[i];
    return NULL;
}

static void conv_name(const result *r, char *buf, size_t len)
{
    if (r->op == OP_ENCODE)
        snprintf(buf, len, "%s -> %s", wide_names[r->wide], fmt_names[r->fmt]);
    else
        snprintf(buf, len, "%s -> %s", fmt_names[r->fmt], wide_names[r->wide]);
}

static void cpu_model(char *buf, size_t len)
{
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) == 0) {
            const char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ' || *c == '\t') c++;
                snprintf(buf, len, "%s", c);
                buf[strcspn(buf, "\n")] = 0;
            }
            break;
        }
    }
    fclose(f);
}

static void size_label(size_t bytes, char *buf, size_t len)
{
    if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
        snprintf(buf, len, "%zu MiB", bytes >> 20);
    else
        snprintf(buf, len, "%zu KiB", bytes >> 10);
}

static void print_text(const options *opt, const group *g, int ng, const result *res, int nres)
{
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    printf("kvserde fp8 conversion benchmark\n");
    printf("cpu: %s, %ld online CPUs; kernel in use by default: %s\n", cpu,
           sysconf(_SC_NPROCESSORS_ONLN), kvs_fp8_isa());
    printf("median of %d runs, each >= %.0f ms; GB/s = 1e9 bytes/s; x memcpy = wide-side bytes/s\n"
           "over memcpy of the same bytes with the same threads, timed right before each run\n"
           "(encode: input bytes, decode: output bytes; median of the pairs' ratios);\n"
           "x limit = over the streaming limit of the conversion's shape (%s kernel: 2->1,\n"
           "4->1, 1->2, 1->4 bytes per element, loads and non-temporal stores, no arithmetic),\n"
           "timed right before each run, median [min-max] of the ratios; limit GB/s = its\n"
           "wide-side median; x scalar = over the scalar kernel\n",
           opt->runs, opt->min_s * 1e3, limit_isa);
    for (int gi = 0; gi < ng; gi++) {
        char sz[32];
        size_label(g[gi].wide_bytes, sz, sizeof sz);
        printf("\n== %s wide buffers (%s), %d thread%s: memcpy %.2f GB/s ==\n", sz,
               g[gi].in_cache ? "in cache" : "memory-bound", g[gi].threads,
               g[gi].threads > 1 ? "s" : "", gbps(g[gi].wide_bytes, g[gi].memcpy_s));
        printf("%-22s %-10s %9s %9s %9s %6s %10s %-11s %9s\n", "conversion", "isa", "in GB/s",
               "out GB/s", "x memcpy", "shape", "limit GB/s", "x limit", "x scalar");
        for (int op = OP_ENCODE; op <= OP_DECODE; op++)
            for (int a = 0; a < (op == OP_ENCODE ? KVS_NWIDE : KVS_FP8_NFMT); a++)
                for (int b = 0; b < (op == OP_ENCODE ? KVS_FP8_NFMT : KVS_NWIDE); b++)
                    for (int isa = 0; isa < NISA; isa++)
                        for (int i = 0; i < nres; i++) {
                            const result *r = &res[i];
                            const int wide = wide_order[op == OP_ENCODE ? a : b];
                            const int fmt = op == OP_ENCODE ? b : a;
                            if (r->op != op || r->wide != wide || r->fmt != fmt ||
                                r->isa != isa || r->threads != g[gi].threads ||
                                r->wide_bytes != g[gi].wide_bytes || r->in_cache != g[gi].in_cache)
                                continue;
                            char name[64];
                            conv_name(r, name, sizeof name);
                            const size_t n = r->wide_bytes / wide_size[r->wide];
                            const size_t in = op == OP_ENCODE ? r->wide_bytes : n;
                            const size_t out = op == OP_ENCODE ? n : r->wide_bytes;
                            const result *sc = find_scalar(res, nres, r);
                            char xs[16] = "-";
                            if (sc)
                                snprintf(xs, sizeof xs, "%.2f", sc->median_s / r->median_s);
                            char xl[32];
                            snprintf(xl, sizeof xl, "%.2f [%.2f-%.2f]", r->ratio_limit,
                                     r->ratio_limit_min, r->ratio_limit_max);
                            printf("%-22s %-10s %9.2f %9.2f %9.2f %6s %10.2f %-11s %9s\n", name,
                                   isa_names[isa], gbps(in, r->median_s), gbps(out, r->median_s),
                                   r->ratio, limit_shape[op == OP_DECODE][r->wide == KVS_WIDE_F32],
                                   gbps(r->wide_bytes, r->limit_s), xl, xs);
                        }
    }
}

static int print_json(const options *opt, const group *g, int ng, const result *res, int nres)
{
    char cpu[256];
    cpu_model(cpu, sizeof cpu);
    json_t *root = json_object();
    json_object_set_new(root, "benchmark", json_string("fp8"));
    json_object_set_new(root, "cpu", json_string(cpu));
    json_object_set_new(root, "online_cpus", json_integer(sysconf(_SC_NPROCESSORS_ONLN)));
    json_object_set_new(root, "default_isa", json_string(kvs_fp8_isa()));
    json_object_set_new(root, "limit_isa", json_string(limit_isa));
    json_object_set_new(root, "nt_min_bytes", json_integer((json_int_t)kvs_fp8_nt_min_bytes()));
    json_object_set_new(root, "runs", json_integer(opt->runs));
    json_object_set_new(root, "min_ms", json_real(opt->min_s * 1e3));
    json_t *groups = json_array();
    for (int gi = 0; gi < ng; gi++) {
        json_t *o = json_object();
        json_object_set_new(o, "wide_bytes", json_integer((json_int_t)g[gi].wide_bytes));
        json_object_set_new(o, "threads", json_integer(g[gi].threads));
        json_object_set_new(o, "kind", json_string(g[gi].in_cache ? "in_cache" : "memory_bound"));
        json_object_set_new(o, "memcpy_gbps", json_real(gbps(g[gi].wide_bytes, g[gi].memcpy_s)));
        json_object_set_new(o, "memcpy_median_s", json_real(g[gi].memcpy_s));
        json_array_append_new(groups, o);
    }
    json_object_set_new(root, "memcpy", groups);
    json_t *arr = json_array();
    for (int i = 0; i < nres; i++) {
        const result *r = &res[i];
        const size_t n = r->wide_bytes / wide_size[r->wide];
        const size_t in = r->op == OP_ENCODE ? r->wide_bytes : n;
        const size_t out = r->op == OP_ENCODE ? n : r->wide_bytes;
        json_t *o = json_object();
        json_object_set_new(o, "op", json_string(r->op == OP_ENCODE ? "encode" : "decode"));
        json_object_set_new(o, "from", json_string(r->op == OP_ENCODE ? wide_names[r->wide]
                                                                       : fmt_names[r->fmt]));
        json_object_set_new(o, "to", json_string(r->op == OP_ENCODE ? fmt_names[r->fmt]
                                                                     : wide_names[r->wide]));
        json_object_set_new(o, "isa", json_string(isa_names[r->isa]));
        json_object_set_new(o, "threads", json_integer(r->threads));
        json_object_set_new(o, "kind", json_string(r->in_cache ? "in_cache" : "memory_bound"));
        json_object_set_new(o, "elements", json_integer((json_int_t)n));
        json_object_set_new(o, "in_bytes", json_integer((json_int_t)in));
        json_object_set_new(o, "out_bytes", json_integer((json_int_t)out));
        json_object_set_new(o, "median_s", json_real(r->median_s));
        json_object_set_new(o, "in_gbps", json_real(gbps(in, r->median_s)));
        json_object_set_new(o, "out_gbps", json_real(gbps(out, r->median_s)));
        json_object_set_new(o, "memcpy_gbps", json_real(gbps(r->wide_bytes, r->memcpy_s)));
        json_object_set_new(o, "ratio_memcpy", json_real(r->ratio));
        json_object_set_new(o, "limit_shape",
                            json_string(limit_shape[r->op == OP_DECODE][r->wide == KVS_WIDE_F32]));
        json_object_set_new(o, "limit_gbps", json_real(gbps(r->wide_bytes, r->limit_s)));
        json_object_set_new(o, "ratio_limit", json_real(r->ratio_limit));
        json_object_set_new(o, "ratio_limit_min", json_real(r->ratio_limit_min));
        json_object_set_new(o, "ratio_limit_max", json_real(r->ratio_limit_max));
        const result *sc = find_scalar(res, nres, r);
        json_object_set_new(o, "ratio_scalar", sc ? json_real(sc->median_s / r->median_s)
                                                  : json_null());
        json_t *runs = json_array();
        for (int k = 0; k < r->nruns; k++)
            json_array_append_new(runs, json_real(r->runs_s[k]));
        json_object_set_new(o, "runs_s", runs);
        runs = json_array();
        for (int k = 0; k < r->nruns; k++)
            json_array_append_new(runs, json_real(r->memcpy_runs_s[k]));
        json_object_set_new(o, "memcpy_runs_s", runs);
        runs = json_array();
        for (int k = 0; k < r->nruns; k++)
            json_array_append_new(runs, json_real(r->limit_runs_s[k]));
        json_object_set_new(o, "limit_runs_s", runs);
        json_array_append_new(arr, o);
    }
    json_object_set_new(root, "results", arr);
    int rc = json_dumpf(root, stdout, JSON_INDENT(2)) == 0 ? 0 : 1;
    putchar('\n');
    json_decref(root);
    return rc;
}

/* ---- options ---------------------------------------------------------------- */

static void usage(FILE *f, const char *prog)
{
    fprintf(f,
            "usage: %s [options]\n\n"
            "fp8 conversion throughput (every conversion, kernel variant and thread\n"
            "count), as GB/s and as a ratio to memcpy of the same bytes in the same run.\n\n"
            "  --json            one JSON document on stdout instead of the table\n"
            "  --size-mib N      memory-bound wide-side buffer size (default 256)\n"
            "  --cache-kib N     in-cache wide-side buffer size (default 1024; 0 skips)\n"
            "  --runs N          timed runs per figure, median reported (default 5)\n"
            "  --min-ms N        minimum duration of one run (default 50)\n"
            "  --threads LIST    thread counts, e.g. 1,2 (default 1,2)\n"
            "  --isa LIST        kernel variants among scalar,avx2,avx512,avx512fp16 (default: all\n"
            "                    this CPU and build support)\n"
            "  --quick           smoke run: 16 MiB and 256 KiB buffers, 3 runs of >= 5 ms\n"
            "  --nt-sweep        instead: the non-temporal store threshold, bfloat16 -> e4m3fn\n"
            "                    (default variant, 1 thread), outputs of 256 KiB to --size-mib/2\n"
            "                    MiB converted and read back, streaming vs ordinary stores\n",
            prog);
}

static int parse_uint(const char *s, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *s == 0 || *end != 0 || v < 0 || v > max)
        return -1;
    *out = v;
    return 0;
}

/* 0 ok, 1 --help shown, 2 usage error (message printed) */
static int parse_options(int argc, char **argv, options *o)
{
    const char *prog = argc > 0 ? argv[0] : "bench_fp8";
    long size_mib = 256, cache_kib = 1024, runs = 5, min_ms = 50;
    int quick = 0, size_set = 0, cache_set = 0, runs_set = 0, min_set = 0, isa_set = 0;
    memset(o, 0, sizeof *o);
    o->threads[0] = 1;
    o->threads[1] = 2;
    o->nthreads = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout, prog);
            return 1;
        } else if (strcmp(a, "--json") == 0) {
            o->json = 1;
        } else if (strcmp(a, "--nt-sweep") == 0) {
            o->nt_sweep = 1;
        } else if (strcmp(a, "--quick") == 0) {
            quick = 1;
        } else if (strcmp(a, "--size-mib") == 0 || strcmp(a, "--cache-kib") == 0 ||
                   strcmp(a, "--runs") == 0 || strcmp(a, "--min-ms") == 0) {
            long x;
            const long max = strcmp(a, "--runs") == 0 ? MAX_RUNS / 2 : 1L << 20;
            if (!v || parse_uint(v, max, &x) != 0) {
                fprintf(stderr, "%s: %s needs a number from 0 to %ld\n", prog, a, max);
                return 2;
            }
            i++;
            if (strcmp(a, "--size-mib") == 0) size_mib = x, size_set = 1;
            else if (strcmp(a, "--cache-kib") == 0) cache_kib = x, cache_set = 1;
            else if (strcmp(a, "--runs") == 0) runs = x, runs_set = 1;
            else min_ms = x, min_set = 1;
        } else if (strcmp(a, "--threads") == 0 || strcmp(a, "--isa") == 0) {
            if (!v) {
                fprintf(stderr, "%s: %s needs a comma-separated list\n", prog, a);
                return 2;
            }
            i++;
            char list[256];
            snprintf(list, sizeof list, "%s", v);
            int threads = strcmp(a, "--threads") == 0;
            if (threads) o->nthreads = 0;
            else isa_set = 1;
            char *save = NULL;
            for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (threads) {
                    long t;
                    if (parse_uint(tok, MAX_THREADS, &t) != 0 || t < 1 || o->nthreads >= 8) {
                        fprintf(stderr, "%s: --threads: '%s' is not a thread count from 1 to "
                                "%d (at most 8 of them)\n", prog, tok, MAX_THREADS);
                        return 2;
                    }
                    o->threads[o->nthreads++] = (int)t;
                } else {
                    int k = -1;
                    for (int j = 0; j < NISA; j++)
                        if (strcmp(tok, isa_names[j]) == 0) k = j;
                    if (k < 0) {
                        fprintf(stderr, "%s: --isa: unknown variant '%s' (scalar, avx2, "
                                "avx512, avx512fp16)\n", prog, tok);
                        return 2;
                    }
                    o->isa[k] = 1;
                }
            }
            if (threads && o->nthreads == 0) {
                fprintf(stderr, "%s: --threads needs at least one count\n", prog);
                return 2;
            }
        } else {
            fprintf(stderr, "%s: unknown option '%s'\n\n", prog, a);
            usage(stderr, prog);
            return 2;
        }
    }
    if (quick) {
        if (!size_set) size_mib = 16;
        if (!cache_set) cache_kib = 256;
        if (!runs_set) runs = 3;
        if (!min_set) min_ms = 5;
    }
    if (runs < 1) {
        fprintf(stderr, "%s: --runs must be at least 1\n", prog);
        return 2;
    }
    if (!isa_set)
        for (int j = 0; j < NISA; j++) o->isa[j] = 1;
    o->size_bytes = (size_t)size_mib << 20;
    o->cache_bytes = (size_t)cache_kib << 10;
    o->runs = (int)runs;
    o->min_s = (double)min_ms * 1e-3;
    return 0;
}

static const kvs_fp8_kernels *kernels_for(int isa)
{
    if (!kvs_fp8_isa_available(isa_names[isa]))
        return NULL;
    return isa == 0   ? kvs_fp8_kernels_scalar()
           : isa == 1 ? kvs_fp8_kernels_avx2()
           : isa == 2 ? kvs_fp8_kernels_avx512()
                      : kvs_fp8_kernels_avx512fp16();
}

/* ---- the non-temporal store threshold ---------------------------------------- */

static volatile uint64_t sweep_sink;

/* Reads `bytes` at p (the consumer of a small object's output: a checksum,
 * a frame, a socket). */
static uint64_t read_back(const unsigned char *p, size_t bytes)
{
    uint64_t a = 0, b = 0, c = 0, d = 0, w[4];
    size_t i = 0;
    for (; i + 32 <= bytes; i += 32) {
        memcpy(w, p + i, 32);
        a ^= w[0], b ^= w[1], c ^= w[2], d ^= w[3];
    }
    for (; i < bytes; i++) a += p[i];
    return a ^ b ^ c ^ d;
}

/* bfloat16 -> e4m3fn through kvs_fp8_encode (the default variant), one
 * thread, outputs of 256 KiB .. size/2: each size with the threshold at 0
 * (every call streams) and at SIZE_MAX (never), interleaved run by run, once
 * encoding only and once encoding then reading the output back. The same
 * input buffer is converted over and over, so at small sizes it is in the
 * caches, as a small object that was just produced would be. */
static int nt_sweep(const options *opt)
{
    const size_t max_out = opt->size_bytes / 2 >= ((size_t)256 << 10) ? opt->size_bytes / 2
                                                                        : (size_t)256 << 10;
    unsigned char *src = alloc_faulted(2 * max_out), *dst = alloc_faulted(max_out);
    if (!src || !dst) {
        fprintf(stderr, "fp8 bench: cannot allocate %zu MiB\n", (3 * max_out) >> 20);
        free(src), free(dst);
        return 1;
    }
    fill_wide(src, 2 * max_out, KVS_WIDE_BF16);
    const size_t saved = kvs_fp8_nt_min_bytes();
    printf("kvserde fp8 non-temporal store threshold: bfloat16 -> e4m3fn, kernel %s, 1 thread\n"
           "current threshold: %zu bytes of output; median of %d runs (>= %.0f ms each),\n"
           "input GB/s; NT/ord = streaming time over ordinary time inverted (> 1: streaming\n"
           "wins), median [min-max] of the run-by-run ratios\n",
           kvs_fp8_isa(), saved, opt->runs, opt->min_s * 1e3);
    printf("%-10s | %-31s | %-31s\n", "", "encode only", "encode, then read the output");
    printf("%-10s | %7s %7s %-15s | %7s %7s %-15s\n", "output", "ord", "NT", "NT/ord", "ord",
           "NT", "NT/ord");
    for (size_t out = (size_t)256 << 10; out <= max_out; out *= 2) {
        char sz[32], cell[2][40];
        size_label(out, sz, sizeof sz);
        double gb[2][2];
        for (int rb = 0; rb <= 1; rb++) {
            double t[2][MAX_RUNS], ratio[MAX_RUNS];
            int reps = 1;
            for (int r = -1; r < opt->runs; r++) { /* r = -1: warm-up, sets reps */
                for (int nt = 0; nt <= 1; nt++) {
                    kvs_fp8_set_nt_min_bytes(nt ? 0 : SIZE_MAX);
                    const double t0 = now_s();
                    for (int k = 0; k < reps; k++) {
                        kvs_fp8_encode(src, KVS_DTYPE_BFLOAT16, dst, KVS_DTYPE_FLOAT8_E4M3FN, 1,
                                       out);
                        if (rb) sweep_sink = read_back(dst, out);
                    }
                    const double e = (now_s() - t0) / reps;
                    if (r >= 0) t[nt][r] = e;
                    else if (nt == 0 && e < opt->min_s)
                        reps = (int)ceil(opt->min_s / (e > 1e-7 ? e : 1e-7));
                }
                if (r >= 0) ratio[r] = t[0][r] / t[1][r];
            }
            gb[rb][0] = gbps(2 * out, median(t[0], opt->runs));
            gb[rb][1] = gbps(2 * out, median(t[1], opt->runs));
            const double m = median(ratio, opt->runs); /* sorts ratio */
            snprintf(cell[rb], sizeof cell[rb], "%.2f [%.2f-%.2f]", m, ratio[0],
                     ratio[opt->runs - 1]);
        }
        printf("%-10s | %7.2f %7.2f %-15s | %7.2f %7.2f %-15s\n", sz, gb[0][0], gb[0][1], cell[0],
               gb[1][0], gb[1][1], cell[1]);
        fflush(stdout);
    }
    kvs_fp8_set_nt_min_bytes(saved);
    free(src);
    free(dst);
    return 0;
}

/* ---- main ------------------------------------------------------------------ */

int kvs_fp8_bench_main(int argc, char **argv)
{
    isa_names = kvs_fp8_isa_names();
    options opt;
    int rc = parse_options(argc, argv, &opt);
    if (rc)
        return rc == 1 ? 0 : 2;
    pick_limit_kernels();
    if (opt.nt_sweep)
        return nt_sweep(&opt);

    const kvs_fp8_kernels *kern[NISA] = {NULL};
    int nisa = 0;
    for (int j = 0; j < NISA; j++) {
        if (!opt.isa[j]) continue;
        kern[j] = kernels_for(j);
        if (!kern[j])
            fprintf(stderr, "fp8 bench: variant '%s' is not available here; skipped\n",
                    isa_names[j]);
        else
            nisa++;
    }
    if (nisa == 0) {
        fprintf(stderr, "fp8 bench: no kernel variant to measure\n");
        return 1;
    }

    size_t sizes[2];
    int nsizes = 0;
    if (opt.size_bytes >= 4096) sizes[nsizes++] = opt.size_bytes;
    if (opt.cache_bytes >= 4096) sizes[nsizes++] = opt.cache_bytes;
    if (nsizes == 0) {
        fprintf(stderr, "fp8 bench: both buffer sizes are zero\n");
        return 2;
    }
    const size_t maxb = sizes[0] > sizes[nsizes - 1] ? sizes[0] : sizes[nsizes - 1];
    unsigned char *wide = alloc_faulted(maxb), *fp8 = alloc_faulted(maxb / 2 + 64),
                  *copy = alloc_faulted(maxb);
    const int ngroups = nsizes * opt.nthreads;
    group *groups = calloc((size_t)ngroups, sizeof *groups);
    const int maxres = ngroups * 12 * 3;
    result *res = calloc((size_t)maxres, sizeof *res);
    if (!wide || !fp8 || !copy || !groups || !res) {
        fprintf(stderr, "fp8 bench: cannot allocate %zu MiB of buffers\n",
                (2 * maxb + maxb / 2) >> 20);
        free(wide), free(fp8), free(copy), free(groups), free(res);
        return 1;
    }
    int nres = 0, ng = 0;

    for (int si = 0; si < nsizes; si++) {
        const size_t bytes = sizes[si];
        for (int ti = 0; ti < opt.nthreads; ti++) {
            const int th = opt.threads[ti];
            group *g = &groups[ng++];
            g->wide_bytes = bytes;
            g->threads = th;
            g->in_cache = bytes == opt.cache_bytes && (nsizes == 1 || si == 1);
            if (!opt.json) {
                fprintf(stderr, "fp8 bench: %zu KiB, %d thread%s...\n", bytes >> 10, th,
                        th > 1 ? "s" : "");
            }
            const work mc = {OP_MEMCPY, NULL, NULL, NULL, wide, copy, bytes, 1};
            double all_memcpy[12 * 3 * MAX_RUNS];
            int nall = 0;
            for (int wi = 0; wi < KVS_NWIDE; wi++) {
                const int w = wide_order[wi];
                const size_t n = bytes / wide_size[w];
                for (int op = OP_ENCODE; op <= OP_DECODE; op++) {
                    if (op == OP_ENCODE) fill_wide(wide, bytes, w);
                    else fill_codes(fp8, n);
                    for (int fmt = 0; fmt < KVS_FP8_NFMT; fmt++)
                        for (int isa = 0; isa < NISA; isa++) {
                            if (!kern[isa]) continue;
                            work wk = {op, kern[isa]->encode[fmt][w], kern[isa]->decode[fmt][w],
                                       NULL, op == OP_ENCODE ? wide : fp8,
                                       op == OP_ENCODE ? fp8 : wide, n, 1};
                            work wl = wk;
                            wl.op = OP_LIMIT;
                            wl.lim = limit_kernels[op == OP_DECODE][wide_size[w] == 4];
                            measurement cm;
                            measure(&opt, th, &wk, op == OP_ENCODE ? wide_size[w] : 1,
                                    op == OP_ENCODE ? 1 : wide_size[w], &mc, &wl, &cm);
                            result *r = &res[nres++];
                            r->wide_bytes = bytes;
                            r->threads = th;
                            r->in_cache = g->in_cache;
                            r->op = op;
                            r->fmt = fmt;
                            r->wide = w;
                            r->isa = isa;
                            r->median_s = cm.median_s;
                            r->memcpy_s = cm.memcpy_median_s;
                            r->ratio = cm.ratio;
                            r->limit_s = cm.limit_median_s;
                            r->ratio_limit = cm.ratio_limit;
                            r->ratio_limit_min = cm.ratio_limit_min;
                            r->ratio_limit_max = cm.ratio_limit_max;
                            r->nruns = cm.nruns;
                            memcpy(r->limit_runs_s, cm.limit_s, sizeof(double) * (size_t)cm.nruns);
                            memcpy(r->runs_s, cm.seconds, sizeof(double) * (size_t)cm.nruns);
                            memcpy(r->memcpy_runs_s, cm.memcpy_s, sizeof(double) * (size_t)cm.nruns);
                            memcpy(all_memcpy + nall, cm.memcpy_s, sizeof(double) * (size_t)cm.nruns);
                            nall += cm.nruns;
                        }
                }
            }
            g->memcpy_s = median(all_memcpy, nall);
        }
    }

    if (opt.json)
        rc = print_json(&opt, groups, ng, res, nres);
    else
        print_text(&opt, groups, ng, res, nres);
    free(wide);
    free(fp8);
    free(copy);
    free(groups);
    free(res);
    return rc;
}
