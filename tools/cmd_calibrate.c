/* kvserde calibrate - estimate the transform of the "transform" pipeline
 * stage from sample KV chunks and write it as a safetensors file
 * (transform.h defines its tensors; docs/cli.md, docs/fidelity.md). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/transform.h"
#include "commands.h"
#include "kvserde/kvserde.h"
#include "safetensors.h"

static int usage(FILE *out, int rc)
{
    fprintf(out,
            "usage: kvserde calibrate --out T.safetensors FILE...\n\n"
            "Estimates, from the `kv` tensor [2, layers, tokens, hidden] (bfloat16, float16\n"
            "or float32) of each FILE, what the \"transform\" pipeline stage needs: per layer,\n"
            "for K and for V, the mean and the principal components (the eigenvectors of the\n"
            "covariance, largest variance first), and writes them to --out with their\n"
            "fingerprint. Every FILE must have the same layers and hidden size. Calibrate on\n"
            "other chunks than the ones you measure. The same files in the same order give\n"
            "the same bytes.\n");
    return rc;
}

/* Feed one file's `kv` to the calibration (created on the first file). */
static int add_file(const char *path, kvs_calibration **cal, uint32_t *layers, uint32_t *hidden)
{
    kvs_st_mapped map;
    kvs_st_file f;
    if (kvs_st_open(path, &map, &f) != KVS_OK) {
        fprintf(stderr, "kvserde calibrate: %s\n", kvs_last_error());
        return -1;
    }
    const kvs_st_tensor *kv = kvs_st_find(&f, "kv");
    kvs_dtype dt;
    int rc = 0;
    if (kv == NULL || kv->ndim != 4 || kv->shape[0] != 2 || kvs_st_dtype_to_kvs(kv->dtype, &dt) ||
        (dt != KVS_DTYPE_BFLOAT16 && dt != KVS_DTYPE_FLOAT16 && dt != KVS_DTYPE_FLOAT32) ||
        kv->shape[1] == 0 || kv->shape[1] > KVS_TRANSFORM_MAX_LAYERS || kv->shape[2] == 0 ||
        kv->shape[3] == 0 || kv->shape[3] > KVS_TRANSFORM_MAX_HIDDEN) {
        fprintf(stderr,
                "kvserde calibrate: %s: no `kv` tensor [2, layers, tokens, hidden] of bfloat16, "
                "float16 or float32 (1 to %d layers, hidden 1 to %d)\n",
                path, KVS_TRANSFORM_MAX_LAYERS, KVS_TRANSFORM_MAX_HIDDEN);
        rc = -1;
    } else if (*cal && (kv->shape[1] != *layers || kv->shape[3] != *hidden)) {
        fprintf(stderr,
                "kvserde calibrate: %s: `kv` has %llu layers x hidden %llu, the files before it "
                "%u x %u\n",
                path, (unsigned long long)kv->shape[1], (unsigned long long)kv->shape[3],
                *layers, *hidden);
        rc = -1;
    }
    if (rc == 0 && *cal == NULL) {
        *layers = (uint32_t)kv->shape[1];
        *hidden = (uint32_t)kv->shape[3];
        if (kvs_calibration_new(*layers, *hidden, cal) != KVS_OK) {
            fprintf(stderr, "kvserde calibrate: %s\n", kvs_last_error());
            rc = -1;
        }
    }
    float *x = rc ? NULL : malloc((size_t)kv->numel * sizeof(float));
    if (rc == 0 && x == NULL) {
        fprintf(stderr, "kvserde calibrate: out of memory for %s\n", path);
        rc = -1;
    }
    if (rc == 0) {
        kvs_convert_floats(kv->data, dt, x, KVS_DTYPE_FLOAT32, (size_t)kv->numel);
        if (kvs_calibration_add(*cal, x, kv->shape[2]) != KVS_OK) {
            fprintf(stderr, "kvserde calibrate: %s: %s\n", path, kvs_last_error());
            rc = -1;
        }
    }
    free(x);
    kvs_st_close(&map, &f);
    return rc;
}

int kvs_tool_calibrate(const char *const *files, size_t nfiles, const char *out_path, int quiet)
{
    kvs_calibration *cal = NULL;
    uint32_t layers = 0, hidden = 0;
    int rc = 0;
    for (size_t i = 0; i < nfiles && rc == 0; i++) rc = add_file(files[i], &cal, &layers, &hidden);
    kvs_transform *t = NULL;
    if (rc == 0 && kvs_calibration_result(cal, &t) != KVS_OK) {
        fprintf(stderr, "kvserde calibrate: %s\n", kvs_last_error());
        rc = -1;
    }
    if (rc == 0) {
        uint64_t shapes[KVS_TRANSFORM_NTENSORS][3];
        kvs_st_out outs[KVS_TRANSFORM_NTENSORS];
        for (int i = 0; i < KVS_TRANSFORM_NTENSORS; i++) {
            uint64_t numel;
            const float *a = kvs_transform_tensor(t, i, &numel);
            shapes[i][0] = layers;
            shapes[i][1] = hidden;
            shapes[i][2] = hidden;
            outs[i] = (kvs_st_out){kvs_transform_tensor_names[i], KVS_ST_F32,
                                   i % 3 == 1 ? 3u : 2u, shapes[i], numel * 4, a};
        }
        char fp[17], chunks[24], tokens[24];
        snprintf(fp, sizeof fp, "%016llx", (unsigned long long)t->fingerprint);
        snprintf(chunks, sizeof chunks, "%llu",
                 (unsigned long long)kvs_calibration_chunks(cal));
        snprintf(tokens, sizeof tokens, "%llu",
                 (unsigned long long)kvs_calibration_tokens(cal));
        kvs_st_meta meta[] = {
            {"kvserde.transform", "1"},
            {"kvserde.transform.chunks", chunks},
            {"kvserde.transform.fingerprint", fp},
            {"kvserde.transform.layout", "KV_2LTD"},
            {"kvserde.transform.tokens", tokens},
        };
        if (kvs_safetensors_write(out_path, outs, KVS_TRANSFORM_NTENSORS, meta,
                                  sizeof meta / sizeof meta[0], NULL, NULL) != KVS_OK) {
            fprintf(stderr, "kvserde calibrate: %s\n", kvs_last_error());
            rc = -1;
        } else if (!quiet) {
            printf("%s: transform %s, %u layers x hidden %u, from %s chunks (%s tokens)\n",
                   out_path, fp, layers, hidden, chunks, tokens);
            /* How concentrated the variance is: components holding 90% and
             * 99% of it, per layer (what the rate depends on). */
            for (int kv = 0; kv < 2; kv++)
                for (uint32_t l = 0; l < layers; l++) {
                    const float *v = t->var[kv] + (size_t)l * hidden;
                    double total = 0, run = 0;
                    for (uint32_t j = 0; j < hidden; j++) total += v[j];
                    uint32_t n90 = 0, n99 = 0;
                    for (uint32_t j = 0; j < hidden; j++) {
                        run += v[j];
                        if (run < 0.90 * total) n90 = j + 2;
                        if (run < 0.99 * total) n99 = j + 2;
                    }
                    printf("  %s layer %u: rms %.4g; 90%% of the variance in %u components, "
                           "99%% in %u\n",
                           kv ? "V" : "K", l, (double)t->rms[kv][l], n90 ? n90 : 1,
                           n99 ? n99 : 1);
                }
        }
    }
    kvs_transform_free(t);
    kvs_calibration_free(cal);
    return rc;
}

int kvs_cmd_calibrate(int argc, char **argv)
{
    const char *out = NULL;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return usage(stdout, 0);
        if (i + 1 < argc && strcmp(argv[i], "--out") == 0) {
            out = argv[++i];
        } else {
            fprintf(stderr, "kvserde calibrate: unknown or incomplete option '%s'\n\n", argv[i]);
            return usage(stderr, 2);
        }
    }
    if (out == NULL || i >= argc) {
        fprintf(stderr, "kvserde calibrate: give --out FILE and at least one input file\n\n");
        return usage(stderr, 2);
    }
    return kvs_tool_calibrate((const char *const *)argv + i, (size_t)(argc - i), out, 0) ? 1 : 0;
}
