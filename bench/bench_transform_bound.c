/* bench_transform_bound.c - what bounds the transform stage's speed on this
 * machine: the core's peak rate of float32 multiply-adds, OpenBLAS's sgemm
 * at the stage's own shapes, and from them the highest encode / decode GB/s
 * of bfloat16 one core could reach if the basis products were all it did.
 *
 *   bench_transform_bound [--runs N] [--hidden H] [--tokens T]
 *
 * The stage (src/frame/stage_transform.c) projects each [T, H] slice of K
 * or V onto the H components of its layer's basis (encode: H x H
 * multiply-adds per row, 2 H flops per element) and rebuilds it from the
 * `kept` leading components (decode: 2 kept flops per element). Defaults:
 * T = 256 tokens, H = 256 (kvdata's chunks). `kept` is taken at 147, 183
 * and 234, the mean kept components of xform-1b / 2b / 4b on kvdata
 * (docs/fidelity.md). Set OPENBLAS_NUM_THREADS=1 for one core's figures.
 * Also the AVX512-BF16 dot products' rate where the CPU has them (the
 * inputs are bfloat16), and the AVX512-FP16 multiply-adds' with the GB/s
 * they would allow; the AMX-BF16 tiles' peak and the library's AMX
 * products (codecs/basis_products.h) at the same shapes, where the CPU has
 * AMX. Reports medians of --runs (default 7); asserts nothing. */
#include <cblas.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_timing.h"
#include "codecs/basis_products.h"
#include "codecs/basis_products_kernel.h"
#include "codecs/half.h"
#include "codecs/transform.h"
#include "kvserde/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

/* 12 independent chains in named variables (an array would live in memory
 * at -O2), more than FMA latency x ports on current cores, so the loop runs
 * at the multiply-add throughput. */
#define CHAINS 12
#define FMA12(fma)                                                                              \
    do {                                                                                        \
        a0 = fma(a0, b, c), a1 = fma(a1, b, c), a2 = fma(a2, b, c), a3 = fma(a3, b, c);         \
        a4 = fma(a4, b, c), a5 = fma(a5, b, c), a6 = fma(a6, b, c), a7 = fma(a7, b, c);         \
        a8 = fma(a8, b, c), a9 = fma(a9, b, c), a10 = fma(a10, b, c), a11 = fma(a11, b, c);     \
    } while (0)
#define SUM12(add) add(add(add(add(a0, a1), add(a2, a3)), add(add(a4, a5), add(a6, a7))), \
                       add(add(a8, a9), add(a10, a11)))

/* One peak kernel: `acc` accumulators started at distinct values (or the
 * compiler merges the chains into one) from `set1`, multiplied by b and
 * added c with `fma` in the 12 chains, reduced by `add` and `reduce` so
 * nothing is dead code; flops per second, `flops` per fma instruction. */
#define PEAK_KERNEL(name, isa, acc, set1, bval, cval, fma, add, reduce, flops)                 \
    __attribute__((target(isa))) static double name(long iters)                               \
    {                                                                                          \
        const __typeof__(bval) b = bval;                                                       \
        const __typeof__(cval) c = cval;                                                       \
        acc a0 = set1(0), a1 = set1(1), a2 = set1(2), a3 = set1(3), a4 = set1(4);              \
        acc a5 = set1(5), a6 = set1(6), a7 = set1(7), a8 = set1(8), a9 = set1(9);              \
        acc a10 = set1(10), a11 = set1(11);                                                    \
        double t = now_s();                                                                    \
        for (long k = 0; k < iters; k++) FMA12(fma);                                           \
        t = now_s() - t;                                                                       \
        volatile double sink = (double)reduce(SUM12(add));                                     \
        (void)sink;                                                                            \
        return (double)iters * CHAINS * (flops) / t;                                           \
    }

__attribute__((target("avx2"))) static inline float reduce256(__m256 v)
{
    float lanes[8];
    _mm256_storeu_ps(lanes, v);
    return lanes[0];
}

/* float32 multiply-adds: 16 and 8 lanes, 2 flops each */
PEAK_KERNEL(peak_avx512, "avx512f", __m512, _mm512_set1_ps, _mm512_set1_ps(0.999999f),
            _mm512_set1_ps(1e-6f), _mm512_fmadd_ps, _mm512_add_ps, _mm512_reduce_add_ps, 32)
PEAK_KERNEL(peak_avx2, "avx2,fma", __m256, _mm256_set1_ps, _mm256_set1_ps(0.999999f),
            _mm256_set1_ps(1e-6f), _mm256_fmadd_ps, _mm256_add_ps, reduce256, 16)
/* The bfloat16 dot products (each vdpbf16ps: 32 products and 32 sums into
 * 16 float32 lanes), for comparison: the stage's inputs are bfloat16. */
PEAK_KERNEL(peak_bf16dot, "avx512f,avx512bf16", __m512, _mm512_set1_ps,
            (__m512bh)_mm512_set1_epi16(0x3f80), (__m512bh)_mm512_set1_epi16(0x3380),
            _mm512_dpbf16_ps, _mm512_add_ps, _mm512_reduce_add_ps, 64)
/* float16 multiply-adds (AVX512-FP16: 32 lanes per vfmadd), the fastest
 * arithmetic this CPU has: twice float32's lanes. A float16 product loses
 * the precision the 4-bit rung needs (11-bit significands summed over 256
 * terms), so this is the bound of a transform that gave that up. */
PEAK_KERNEL(peak_fp16, "avx512f,avx512fp16", __m512h, _mm512_set1_ph,
            _mm512_set1_ph((_Float16)0.999f), _mm512_set1_ph((_Float16)0.001f), _mm512_fmadd_ph,
            _mm512_add_ph, _mm512_reduce_add_ph, 64)

/* AMX-BF16 tiles (TDPBF16PS: 16 x 16 x 32 products and sums into a tile of
 * 16 x 16 float32): 6 independent accumulators (tiles 0-5) fed by the same
 * two source tiles (6, 7), so the loop runs at the tile unit's throughput.
 * The sources are zero: the rate does not depend on the values. */
__attribute__((target("amx-tile,amx-bf16"))) static double peak_amx(long iters)
{
    kvs_basis_amx_config(); /* 8 tiles of 16 x 64 bytes */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    iters /= 16;
    double t = now_s();
    for (long k = 0; k < iters; k++) {
        _tile_dpbf16ps(0, 6, 7);
        _tile_dpbf16ps(1, 6, 7);
        _tile_dpbf16ps(2, 6, 7);
        _tile_dpbf16ps(3, 6, 7);
        _tile_dpbf16ps(4, 6, 7);
        _tile_dpbf16ps(5, 6, 7);
    }
    t = now_s() - t;
    float out[16 * 16];
    _tile_stored(0, out, 64);
    volatile float sink = out[0];
    (void)sink;
    _tile_release();
    return (double)iters * 6 * (16.0 * 16 * 32 * 2) / t;
}

/* The median flops per second of runs of a kernel. */
static double kernel_flops(double (*kernel)(long), int runs)
{
    double v[100];
    for (int r = 0; r < runs; r++) v[r] = kernel(20 * 1000 * 1000);
    return median(v, runs);
}

static double bf16dot_flops(int runs)
{
    return __builtin_cpu_supports("avx512bf16") ? kernel_flops(peak_bf16dot, runs) : 0;
}

static double fp16_flops(int runs)
{
    return __builtin_cpu_supports("avx512fp16") ? kernel_flops(peak_fp16, runs) : 0;
}

/* 0 unless the library's products run on AMX (which asks for the
 * permission to use the tiles). */
static double amx_flops(int runs)
{
    return kvs_basis_amx_in_use() ? kernel_flops(peak_amx, runs) : 0;
}

/* The widest multiply-add this CPU has: its name, and flops per second
 * (median of runs), or 0 when it has none the bench knows. */
static double peak_flops(int runs, const char **isa)
{
    double (*kernel)(long) = NULL;
    if (__builtin_cpu_supports("avx512f")) *isa = "AVX-512F FMA", kernel = peak_avx512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        *isa = "AVX2 FMA", kernel = peak_avx2;
    else return *isa = "none measured", 0;
    return kernel_flops(kernel, runs);
}
#else
static double peak_flops(int runs, const char **isa)
{
    (void)runs;
    *isa = "not measured on this architecture";
    return 0;
}
static double bf16dot_flops(int runs)
{
    (void)runs;
    return 0;
}
static double fp16_flops(int runs)
{
    (void)runs;
    return 0;
}
static double amx_flops(int runs)
{
    (void)runs;
    return 0;
}
#endif

/* sgemm flops per second at the stage's shape (median of runs): encode is
 * [T, H] x [H, H]^T, decode [T, kept] x [kept, H]. */
static double sgemm_flops(int encode, int T, int H, int kept, const float *a, const float *b,
                          float *c, int runs)
{
    double v[100];
    const int reps = 20;
    for (int r = 0; r < runs; r++) {
        double t = now_s();
        for (int i = 0; i < reps; i++) {
            if (encode)
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, H, H, 1.0f, a, H, b, H,
                            0.0f, c, H);
            else
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, H, kept, 1.0f, a, kept,
                            b, H, 0.0f, c, H);
        }
        v[r] = reps * 2.0 * T * H * (encode ? H : kept) / (now_s() - t);
    }
    return median(v, runs);
}

/* The library's AMX products (basis_products.h) at the stage's shape, with
 * their padding, splitting and mean / step arithmetic: flops per second of
 * the product they stand for (median of runs), 0 where they do not run. */
static double amx_product_flops(int encode, int T, int H, int kept, const kvs_transform *t,
                                const uint16_t *x, const float *q, float *c, int runs)
{
    double v[100];
    const int reps = 20;
    if (!kvs_basis_amx_in_use() || t->packed == NULL) return 0;
    for (int r = 0; r < runs; r++) {
        double s = now_s();
        for (int i = 0; i < reps; i++)
            if (encode ? !kvs_basis_forward(t, 0, 0, x, (size_t)T, 1.0f, c)
                       : !kvs_basis_inverse(t, 0, 0, q, (size_t)T, (size_t)kept, 1.0f, c))
                return 0;
        v[r] = reps * 2.0 * T * H * (encode ? H : kept) / (now_s() - s);
    }
    return median(v, runs);
}

int main(int argc, char **argv)
{
    int runs = 7, H = 256, T = 256;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--runs") == 0) runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--hidden") == 0) H = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--tokens") == 0) T = atoi(argv[i + 1]);
    }
    if (runs < 1 || runs > 100 || H < 16 || H > 4096 || T < 1 || T > 65536) {
        fprintf(stderr, "usage: bench_transform_bound [--runs 1-100] [--hidden 16-4096] "
                        "[--tokens 1-65536]\n");
        return 2;
    }
    float *a = malloc((size_t)T * H * sizeof(float)), *b = malloc((size_t)H * H * sizeof(float)),
          *c = malloc((size_t)T * H * sizeof(float));
    if (a == NULL || b == NULL || c == NULL) {
        fprintf(stderr, "bench_transform_bound: out of memory\n");
        return 1;
    }
    for (size_t i = 0; i < (size_t)T * H; i++) a[i] = (float)((i * 2654435761u) % 1000) / 500 - 1;
    for (size_t i = 0; i < (size_t)H * H; i++) b[i] = (float)((i * 40503u) % 1000) / 16000 - 0.03f;

    const char *isa;
    double peak = peak_flops(runs, &isa);
    const char *threads = getenv("OPENBLAS_NUM_THREADS");
    printf("bench_transform_bound: T %d x hidden %d, median of %d runs, OPENBLAS_NUM_THREADS=%s\n",
           T, H, runs, threads ? threads : "(unset)");
    if (peak > 0) printf("core peak, %s: %.1f GFLOP/s\n", isa, peak / 1e9);
    else printf("core peak: %s\n", isa);
    double dot = bf16dot_flops(runs);
    if (dot > 0) printf("AVX512-BF16 dot products: %.1f GFLOP/s\n", dot / 1e9);
    double half = fp16_flops(runs);
    if (half > 0) {
        printf("AVX512-FP16 FMA: %.1f GFLOP/s; bound GB/s at it: encode %.3f, decode", half / 1e9,
               half / (2.0 * H) * 2 / 1e9);
        for (int k = 147; k <= 234; k += k == 147 ? 36 : 51)
            printf(" %.3f (kept %d)", half / (2.0 * (k * H / 256)) * 2 / 1e9, k * H / 256);
        printf("\n");
    }
    double amx = amx_flops(runs);
    if (amx > 0)
        printf("AMX-BF16 tiles (6 accumulators): %.1f GFLOP/s; bound GB/s at it: encode %.3f\n",
               amx / 1e9, amx / (2.0 * H) * 2 / 1e9);
    /* The AMX products' inputs: a one-layer transform of the same basis,
     * bfloat16 rows and integer coefficients (|q| <= 99: one bfloat16 part). */
    kvs_transform *t = NULL;
    uint16_t *x = malloc((size_t)T * H * sizeof(uint16_t));
    float *q = malloc((size_t)T * H * sizeof(float));
    if (x == NULL || q == NULL || kvs_transform_alloc(1, (uint32_t)H, &t) != KVS_OK) {
        fprintf(stderr, "bench_transform_bound: out of memory\n");
        return 1;
    }
    memcpy(t->basis[0], b, (size_t)H * H * sizeof(float));
    kvs_transform_finish(t);
    for (size_t i = 0; i < (size_t)T * H; i++) {
        x[i] = kvs_f32_to_bf16(a[i]);
        q[i] = (float)((int)((i * 2654435761u) % 199) - 99);
    }
    /* bf16 bytes per second a product rate allows: 2 bytes per element,
     * 2 x (H or kept) flops per element. */
    printf("%-22s %10s %14s %14s %16s\n", "product", "flops/elem", "sgemm GFLOP/s",
           "AMX GFLOP/s", "bound GB/s: sgemm / AMX / core peak");
    double enc = sgemm_flops(1, T, H, H, a, b, c, runs);
    double enc_amx = amx_product_flops(1, T, H, H, t, x, q, c, runs);
    printf("%-22s %10d %14.1f %14.1f %10.3f / %.3f / %.3f\n", "encode (all H)", 2 * H,
           enc / 1e9, enc_amx / 1e9, enc / (2.0 * H) * 2 / 1e9, enc_amx / (2.0 * H) * 2 / 1e9,
           peak / (2.0 * H) * 2 / 1e9);
    const int kept[] = {147 * H / 256, 183 * H / 256, 234 * H / 256};
    const char *name[] = {"decode (kept, 1b)", "decode (kept, 2b)", "decode (kept, 4b)"};
    for (int i = 0; i < 3; i++) {
        double dec = sgemm_flops(0, T, H, kept[i], a, b, c, runs);
        double dec_amx = amx_product_flops(0, T, H, kept[i], t, x, q, c, runs);
        printf("%-22s %10d %14.1f %14.1f %10.3f / %.3f / %.3f\n", name[i], 2 * kept[i],
               dec / 1e9, dec_amx / 1e9, dec / (2.0 * kept[i]) * 2 / 1e9,
               dec_amx / (2.0 * kept[i]) * 2 / 1e9, peak / (2.0 * kept[i]) * 2 / 1e9);
    }
    kvs_transform_free(t);
    free(a), free(b), free(c), free(x), free(q);
    return 0;
}
