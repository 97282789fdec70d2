/* bench_kv_split_scopes - what each kv_split scale scope costs in bytes and
 * buys in SNR on the real KV cache of ../shared/kvdata (README.md there):
 * all 16 chunks, K and V both stored as fp8 (e4m3fn, then e5m2), each
 * scope; per scope the blob bytes of one chunk, the scale-table bytes, and
 * K's and V's SNR (mean and worst over the chunks). Reported, never
 * asserted (tests/test_kv_split.c asserts the bounds and sizes).
 *
 *     bench_kv_split_scopes [KVDATA_DIR]
 */
#include <stdio.h>
#include <stdlib.h>

#include "../tests/kvs_test_kvdata.h"
#include "kvserde/error.h"

int main(int argc, char **argv)
{
    char buf[1024], why[2048];
    const char *dir = argc > 1 ? argv[1] : kvdata_dir(buf, sizeof buf, why, sizeof why);
    if (dir == NULL) {
        printf("bench_kv_split_scopes: skipped: %s\n", why);
        return 0;
    }
    static const kvs_kv_split_scale scopes[5] = {
        KVS_KV_SPLIT_SCALE_NONE, KVS_KV_SPLIT_SCALE_PER_TENSOR, KVS_KV_SPLIT_SCALE_PER_LAYER,
        KVS_KV_SPLIT_SCALE_PER_LAYER_HEAD, KVS_KV_SPLIT_SCALE_PER_TOKEN};
    static const char *const names[5] = {"none", "per_tensor", "per_layer", "per_layer_head",
                                         "per_token"};
    static const kvs_kv_split_store stores[2] = {KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN,
                                                 KVS_KV_SPLIT_STORE_FLOAT8_E5M2};
    float *kv[16] = {0};
    int nfiles = 0;
    for (int p = 0; p < 8; p++)
        for (int c = 0; c < 2; c++) {
            float *x = kvdata_load(dir, p, c, why, sizeof why);
            if (x == NULL) {
                printf("bench_kv_split_scopes: %s\n", why);
                continue;
            }
            kv[nfiles++] = x;
        }
    if (nfiles == 0) return 1;
    size_t raw = 2 * 2 * (size_t)KVDATA_LAYERS * KVDATA_TOKENS * KVDATA_HIDDEN;
    printf("kvdata %s: %d chunks of [2, 6, 256, 256] bfloat16 (%zu raw bytes each), K and V "
           "both fp8, num_kv_heads 4\n",
           dir, nfiles, raw);
    printf("%-8s %-15s %10s %8s %8s %18s %18s\n", "fp8", "scale", "blob B", "scales B",
           "x raw", "K SNR dB mean/min", "V SNR dB mean/min");
    for (int s = 0; s < 2; s++) {
        for (int i = 0; i < 5; i++) {
            double k_sum = 0, v_sum = 0, k_min = 1e9, v_min = 1e9;
            kvdata_result r = {0};
            for (int f = 0; f < nfiles; f++) {
                if (kvdata_measure(kv[f], scopes[i], stores[s], &r) != KVS_OK) {
                    printf("failed: %s\n", kvs_last_error());
                    return 1;
                }
                k_sum += r.snr_k, v_sum += r.snr_v;
                k_min = r.snr_k < k_min ? r.snr_k : k_min;
                v_min = r.snr_v < v_min ? r.snr_v : v_min;
            }
            printf("%-8s %-15s %10zu %8zu %8.4f %10.2f/%-7.2f %10.2f/%-7.2f\n",
                   s ? "e5m2" : "e4m3fn", names[i], r.blob_bytes, r.scale_bytes,
                   (double)r.blob_bytes / (double)raw, k_sum / nfiles, k_min, v_sum / nfiles,
                   v_min);
        }
    }
    for (int f = 0; f < nfiles; f++) free(kv[f]);
    return 0;
}
