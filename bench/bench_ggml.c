/* bench_ggml.c - the ggml block kernels (ggml.h) against memcpy of the same
 * bfloat16 bytes, in the same run (docs/performance.md). Reports; asserts
 * nothing.
 *
 *   bench_ggml [--reps N] [--mib M ...]
 *
 * For each size (MiB of bfloat16; default 0.125, 1, 16 and 64), kernel
 * variant this CPU has and block type: the median over N runs (default 15)
 * of encode (bfloat16 -> blocks) and decode (blocks -> bfloat16) of the
 * benchmarks' KV values (kv_values.h), one
 * thread, as GB/s of the bfloat16 bytes, and as a fraction of memcpy of
 * those bytes (buffers touched beforehand, so no page faults are timed).
 * The load average is printed first: the machine may be shared. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_timing.h"
#include "kv_values.h"
#include "kvserde/kvserde.h"

enum { OP_MEMCPY, OP_ENCODE, OP_DECODE };

/* Median seconds of `reps` runs of op. */
static double median_time(int op, int reps, kvs_ggml_type t, const uint16_t *bf16, uint8_t *blocks,
                          uint16_t *out, size_t n)
{
    double *s = malloc(sizeof(double) * (size_t)reps);
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        int rc = 0;
        if (op == OP_MEMCPY) memcpy(out, bf16, 2 * n);
        else if (op == OP_ENCODE) rc = kvs_ggml_encode(bf16, KVS_DTYPE_BFLOAT16, blocks, t, n);
        else rc = kvs_ggml_decode(blocks, t, out, KVS_DTYPE_BFLOAT16, n);
        s[r] = now_s() - t0;
        if (rc) {
            fprintf(stderr, "bench_ggml: %s\n", kvs_last_error());
            exit(1);
        }
    }
    qsort(s, (size_t)reps, sizeof *s, cmp_double);
    double m = s[reps / 2];
    free(s);
    return m;
}

int main(int argc, char **argv)
{
    int reps = 15;
    double mibs[16] = {0.125, 1, 16, 64};
    int nsizes = 4, custom = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
            if (!custom) nsizes = 0;
            custom = 1;
            if (nsizes < 16) mibs[nsizes++] = atof(argv[++i]);
        } else {
            fprintf(stderr, "usage: bench_ggml [--reps N] [--mib M ...]\n");
            return 2;
        }
    }
    if (reps < 1) reps = 1;
    double load[3] = {0};
    FILE *la = fopen("/proc/loadavg", "r");
    if (la) {
        if (fscanf(la, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(la);
    }
    printf("load average %.2f %.2f %.2f; median of %d runs, one thread, GB/s of bfloat16 bytes\n",
           load[0], load[1], load[2], reps);
    printf("%8s %-7s %-9s %8s %8s %8s %7s %7s\n", "MiB", "isa", "type", "memcpy", "encode",
           "decode", "enc/cp", "dec/cp");
    static const char *const isas[] = {"scalar", "avx2", "avx512"};
    for (int si = 0; si < nsizes; si++) {
        size_t n = (size_t)(mibs[si] * (1 << 20) / 2) / 32 * 32;
        if (n == 0) continue;
        uint16_t *bf16 = malloc(2 * n), *out = malloc(2 * n);
        uint8_t *blocks = malloc(n / 32 * KVS_GGML_Q8_0_BYTES);
        kvs_bench_fill_bf16(bf16, n, 1);
        memset(out, 0, 2 * n);
        memset(blocks, 0, n / 32 * KVS_GGML_Q8_0_BYTES);
        for (size_t v = 0; v < sizeof isas / sizeof isas[0]; v++) {
            if (!kvs_fp8_isa_available(isas[v]) || kvs_fp8_set_isa(isas[v]) != KVS_OK) continue;
            for (int t = 0; t < 2; t++) {
                kvs_ggml_type type = (kvs_ggml_type)t;
                double cp = median_time(OP_MEMCPY, reps, type, bf16, blocks, out, n);
                double en = median_time(OP_ENCODE, reps, type, bf16, blocks, out, n);
                double de = median_time(OP_DECODE, reps, type, bf16, blocks, out, n);
                double gb = 2.0 * (double)n / 1e9;
                printf("%8.3f %-7s %-9s %8.2f %8.2f %8.2f %7.2f %7.2f\n", mibs[si], isas[v],
                       kvs_ggml_type_name(type), gb / cp, gb / en, gb / de, cp / en, cp / de);
            }
        }
        kvs_fp8_set_isa("auto");
        free(bf16);
        free(out);
        free(blocks);
    }
    return 0;
}
