/* bench_int.c - the int stage (pipeline {"type": "int", ...} + crc32c)
 * against memcpy of the same bfloat16 bytes, encode and decode, on one
 * thread: --size-mib MiB (default 64) of smooth random bfloat16 as one
 * KV_2LTD object [2, layers, 1024 tokens, 1024 channels]. Reports the
 * median GB/s of --runs (default 5) of the bfloat16 side and the median of
 * memcpy time / run time over pairs (a memcpy run right before each run,
 * so the ratio stays meaningful on a shared machine); asserts nothing.
 * --only WORD runs the configurations whose name starts with WORD (for a
 * profile of one). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvserde/kvserde.h"
#include "bench_timing.h"

static const char *const configs[][2] = {
    {"int8 token", "{\"type\":\"int\",\"bits\":8,\"k_axis\":\"token\",\"zero_point\":false}"},
    {"int4 kivi", "{\"type\":\"int\",\"bits\":4}"},
    {"int2 kivi g32", "{\"type\":\"int\",\"bits\":2,\"group\":32}"},
    {"int3 hadamard", "{\"type\":\"int\",\"bits\":3,\"k_axis\":\"token\",\"hadamard\":64}"},
    {"int5 hadamard", "{\"type\":\"int\",\"bits\":5,\"k_axis\":\"token\",\"hadamard\":128}"},
    {"int6 hadamard", "{\"type\":\"int\",\"bits\":6,\"hadamard\":256}"},
    {"int7 hadamard", "{\"type\":\"int\",\"bits\":7,\"k_axis\":\"token\",\"hadamard\":128}"},
    /* the int stage of the presets int47-had-ll / int21-had-ll, alone */
    {"int8 had tensor", "{\"type\":\"int\",\"bits\":8,\"levels\":47,\"k_axis\":\"tensor\","
                        "\"v_axis\":\"tensor\",\"zero_point\":false,\"hadamard\":256}"},
};

int main(int argc, char **argv)
{
    int mib = 64, runs = 5;
    const char *only = "";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--size-mib") == 0) mib = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--runs") == 0) runs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--only") == 0) only = argv[i + 1];
    }
    if (mib < 4 || runs < 1 || runs > 100) {
        fprintf(stderr, "usage: bench_int [--size-mib N >= 4] [--runs 1-100] [--only WORD]\n");
        return 2;
    }
    const int64_t layers = mib / 4, dims[4] = {2, layers, 1024, 1024};
    kvs_layout l = {0};
    kvs_memobj *src = NULL, *back = NULL, *copy = NULL;
    if (kvs_layout_add_group(&l, 4, dims, KVS_DTYPE_BFLOAT16) ||
        kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &src) || kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &back) ||
        kvs_memobj_alloc(&l, KVS_FMT_KV_2LTD, &copy)) {
        fprintf(stderr, "bench_int: %s\n", kvs_last_error());
        return 1;
    }
    size_t nbytes = (size_t)kvs_layout_nbytes(&l), n = nbytes / 2;
    uint16_t *x = src->data;
    uint64_t s = 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        float f = (float)sin((double)i * 0.001) * 2 + (float)(s >> 40) / (float)(1 << 24) - 0.5f;
        uint32_t u;
        memcpy(&u, &f, 4);
        x[i] = (uint16_t)(u >> 16);
    }
    memset(back->data, 0, nbytes);
    memcpy(copy->data, src->data, nbytes);
    printf("bench_int: %d MiB bfloat16, one thread, median of %d runs\n", mib, runs);
    printf("%-16s %8s %9s %9s %9s %9s\n", "config", "bits", "enc GB/s", "x memcpy", "dec GB/s",
           "x memcpy");
    for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
        if (strncmp(configs[c][0], only, strlen(only)) != 0) continue;
        char json[512];
        snprintf(json, sizeof json, "{\"type\":\"pipeline\",\"stages\":[%s]}", configs[c][1]);
        kvs_serde_pair p;
        size_t est, len = 0;
        kvs_memobj *blob = NULL;
        kvs_layout bl;
        if (kvs_serde_create_pair(json, &p) || kvs_estimate_serialized_size(p.serializer, &l, &est) ||
            kvs_layout_flat(&bl, est, KVS_DTYPE_UINT8) || kvs_memobj_alloc(&bl, KVS_FMT_BINARY, &blob)) {
            fprintf(stderr, "bench_int: %s\n", kvs_last_error());
            return 1;
        }
        double enc[100], dec[100], encr[100], decr[100];
        for (int r = -1; r < runs; r++) {
            double t0 = now_s();
            memcpy(copy->data, src->data, nbytes);
            double t1 = now_s();
            kvs_serialize(p.serializer, src, blob, NULL, &len);
            double t2 = now_s();
            kvs_memobj_set_used_size(blob, len);
            memcpy(copy->data, back->data, nbytes);
            double t3 = now_s();
            kvs_deserialize(p.deserializer, blob, back, NULL);
            double t4 = now_s();
            if (r < 0) continue; /* warm-up */
            enc[r] = nbytes / (t2 - t1) / 1e9;
            encr[r] = (t1 - t0) / (t2 - t1);
            dec[r] = nbytes / (t4 - t3) / 1e9;
            decr[r] = (t1 - t0) / (t4 - t3);
        }
        printf("%-16s %8.3f %9.3f %9.3f %9.3f %9.3f\n", configs[c][0], 8.0 * len / n,
               median(enc, runs), median(encr, runs), median(dec, runs), median(decr, runs));
        kvs_memobj_free(blob);
        kvs_serde_pair_destroy(&p);
    }
    double mc[100];
    for (int r = 0; r < runs; r++) {
        double t0 = now_s();
        memcpy(copy->data, src->data, nbytes);
        mc[r] = nbytes / (now_s() - t0) / 1e9;
    }
    printf("%-16s %8s %9.3f\n", "memcpy", "16", median(mc, runs));
    kvs_memobj_free(src);
    kvs_memobj_free(back);
    kvs_memobj_free(copy);
    return 0;
}
