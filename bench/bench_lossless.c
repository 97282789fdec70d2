/* bench_lossless.c - the lossless stage against byte compressors and the
 * order-0 bounds, on the real KV cache (docs/performance.md). Reports;
 * asserts nothing.
 *
 *   bench_lossless [DIR]   (default $KVS_KVDATA_DIR, else ../shared/kvdata
 *                           next to the source tree)
 *
 * Every (K or V, layer) slice [tokens, hidden] of every file's `kv` is one
 * object. Layer-0 V repeats rows (kvdata/README.md) and is left out of the
 * totals; its row is printed apart. Per slice kind (K or V) and layer, as
 * ratios of the raw bytes (higher is better):
 *   zstd-1 raw, zstd-3 raw, lz4 raw       the bfloat16 bytes as stored
 *   zstd-1 pl, zstd-3 pl, zstd-19 pl, lz4 pl   the high- and low-byte planes,
 *                                         each compressed on its own
 *   H0 hi/lo, H0 exp/sm                   order-0 entropy bounds of the two
 *                                         byte planes, and of an exponent plane
 *                                         and a sign+mantissa plane (no table
 *                                         cost counted)
 *   stage, stage-19, stage-r, stage-r2, stage-r3   the pipeline [bytes,
 *                                         lossless] at level 1 and 19, and
 *                                         with the rANS coder ("coder":
 *                                         "rans") at level 1, 2 (row
 *                                         references) and 3 (and coded
 *                                         signs), frame header and CRC
 *                                         included
 * and for fp8 e4m3 codes (the plain fp8 serde's bytes): H0, zstd-1 and the
 * pipeline [fp8, lossless], as ratios of the fp8 bytes. GB/s (raw side, one
 * thread, encode / decode) for the stage and the baselines on the whole
 * data set, one pass. Then the stage's GB/s on whole chunks: each file's K
 * and V of layers 1-5 (V0 left out, as above) as one object of 2L - 1
 * slices, where the rANS decoder takes two blocks at a time; the median of
 * WHOLE_RUNS warm passes over every file, after one untimed pass. */
#include <dirent.h>
#include <jansson.h>
#include <lz4.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <zstd.h>

#include "bench_timing.h"
#include "kvserde/kvserde.h"

#define MAXL 16
enum { Z1R, Z3R, L4R, Z1P, Z3P, Z19P, L4P, H0HL, H0ES, STG, STG19, STGR, STGR2, STGR3,
       F8H0, F8Z1, F8STG, NCOL };
static const char *const colname[NCOL] = {"zstd-1",   "zstd-3",   "lz4",      "zstd-1p",
                                          "zstd-3p",  "zstd-19p", "lz4p",     "H0 hi/lo",
                                          "H0 e/sm",  "stage",    "stage-19", "stage-r",
                                          "stage-r2", "stage-r3",
                                          "f8 H0",    "f8 zstd1", "f8 stage"};
/* stored bytes per column; raw bytes (bf16 or fp8) per slice kind and layer */
static double stored[2][MAXL][NCOL], rawb[2][MAXL];
static double t_enc[NCOL], t_dec[NCOL], t_raw[NCOL];

static double h0_bytes(const uint8_t *p, size_t n)
{
    double c[256] = {0}, h = 0;
    for (size_t i = 0; i < n; i++) c[p[i]]++;
    for (int v = 0; v < 256; v++)
        if (c[v]) h -= c[v] * log2(c[v] / (double)n);
    return h / 8;
}

static double zstd_size(const uint8_t *p, size_t n, int level, int col, uint8_t *tmp, size_t cap,
                        uint8_t *back)
{
    double t0 = now_s();
    size_t z = ZSTD_compress(tmp, cap, p, n, level);
    double t1 = now_s();
    ZSTD_decompress(back, n, tmp, z);
    double t2 = now_s();
    t_enc[col] += t1 - t0;
    t_dec[col] += t2 - t1;
    return (double)z;
}

static double lz4_size(const uint8_t *p, size_t n, int col, uint8_t *tmp, size_t cap, uint8_t *back)
{
    double t0 = now_s();
    int z = LZ4_compress_default((const char *)p, (char *)tmp, (int)n, (int)cap);
    double t1 = now_s();
    LZ4_decompress_safe((const char *)tmp, (char *)back, z, (int)n);
    double t2 = now_s();
    t_enc[col] += t1 - t0;
    t_dec[col] += t2 - t1;
    return (double)z;
}

/* One round trip of the n bytes at src (layout l) through serde p, checked
 * exact: the blob's size, and the encode and decode seconds in *te, *td. */
static size_t round_trip(kvs_serde_pair *p, const kvs_layout *l, const uint8_t *src, size_t n,
                         uint8_t *tmp, size_t cap, uint8_t *back, double *te, double *td)
{
    kvs_memobj in, bo, out;
    kvs_layout bl;
    kvs_layout_flat(&bl, cap, KVS_DTYPE_UINT8);
    kvs_memobj_init(&in, (void *)src, n, l, KVS_FMT_BINARY);
    kvs_memobj_init(&bo, tmp, cap, &bl, KVS_FMT_BINARY);
    kvs_memobj_init(&out, back, n, l, KVS_FMT_BINARY);
    size_t w = 0;
    double t0 = now_s();
    if (kvs_serialize(p->serializer, &in, &bo, NULL, &w) != KVS_OK) {
        fprintf(stderr, "bench_lossless: %s\n", kvs_last_error());
        exit(1);
    }
    double t1 = now_s();
    kvs_memobj_set_used_size(&bo, w);
    int rc = kvs_deserialize(p->deserializer, &bo, &out, NULL);
    double t2 = now_s();
    /* checked after the clock stops, as the baselines' decodes are not
     * compared inside theirs */
    if (rc != KVS_OK || memcmp(src, back, n) != 0) {
        fprintf(stderr, "bench_lossless: round trip not exact: %s\n",
                rc != KVS_OK ? kvs_last_error() : "decoded bytes differ");
        exit(1);
    }
    *te = t1 - t0, *td = t2 - t1;
    return w;
}

static double serde_size(kvs_serde_pair *p, const kvs_layout *l, const uint8_t *src, size_t n,
                         int col, uint8_t *tmp, size_t cap, uint8_t *back)
{
    double te, td;
    size_t w = round_trip(p, l, src, n, tmp, cap, back, &te, &td);
    t_enc[col] += te;
    t_dec[col] += td;
    return (double)w;
}

#define WHOLE_RUNS 7

/* The median of WHOLE_RUNS passes of serde p over the n chunks (each
 * bytes[i] long): encode and decode GB/s of the raw side, one thread. */
static void time_whole(const char *name, kvs_serde_pair *p, uint8_t *const *chunk,
                       const size_t *bytes, int n, const kvs_layout *layouts, uint8_t *tmp,
                       size_t cap, uint8_t *back)
{
    double enc[WHOLE_RUNS], dec[WHOLE_RUNS], raw = 0;
    for (int i = 0; i < n; i++) raw += (double)bytes[i];
    for (int r = -1; r < WHOLE_RUNS; r++) {
        double te = 0, td = 0;
        for (int i = 0; i < n; i++) {
            double e, d;
            round_trip(p, &layouts[i], chunk[i], bytes[i], tmp, cap, back, &e, &d);
            te += e, td += d;
        }
        if (r >= 0) enc[r] = raw / te / 1e9, dec[r] = raw / td / 1e9;
    }
    printf("  %-9s encode %7.3f  decode %7.3f\n", name, median(enc, WHOLE_RUNS),
           median(dec, WHOLE_RUNS));
}

static kvs_serde_pair pair(const char *json)
{
    kvs_serde_pair p;
    if (kvs_serde_create_pair(json, &p) != KVS_OK) {
        fprintf(stderr, "bench_lossless: %s\n", kvs_last_error());
        exit(1);
    }
    return p;
}

static void slice(int kvi, int layer, const uint8_t *s, int T, int H, kvs_serde_pair *ps,
                  uint8_t *tmp, size_t cap, uint8_t *back)
{
    size_t n = (size_t)T * H, nb = 2 * n;
    uint8_t *hi = malloc(n), *lo = malloc(n), *ex = malloc(n), *sm = malloc(n);
    for (size_t i = 0; i < n; i++) {
        uint16_t v = (uint16_t)(s[2 * i] | s[2 * i + 1] << 8);
        lo[i] = (uint8_t)v;
        hi[i] = (uint8_t)(v >> 8);
        ex[i] = (uint8_t)(v >> 7);
        sm[i] = (uint8_t)((v >> 8 & 0x80) | (v & 0x7F));
    }
    double *st = stored[kvi][layer];
    rawb[kvi][layer] += (double)nb;
    st[Z1R] += zstd_size(s, nb, 1, Z1R, tmp, cap, back);
    st[Z3R] += zstd_size(s, nb, 3, Z3R, tmp, cap, back);
    st[L4R] += lz4_size(s, nb, L4R, tmp, cap, back);
    st[Z1P] += zstd_size(hi, n, 1, Z1P, tmp, cap, back) + zstd_size(lo, n, 1, Z1P, tmp, cap, back);
    st[Z3P] += zstd_size(hi, n, 3, Z3P, tmp, cap, back) + zstd_size(lo, n, 3, Z3P, tmp, cap, back);
    st[Z19P] +=
        zstd_size(hi, n, 19, Z19P, tmp, cap, back) + zstd_size(lo, n, 19, Z19P, tmp, cap, back);
    st[L4P] += lz4_size(hi, n, L4P, tmp, cap, back) + lz4_size(lo, n, L4P, tmp, cap, back);
    st[H0HL] += h0_bytes(hi, n) + h0_bytes(lo, n);
    st[H0ES] += h0_bytes(ex, n) + h0_bytes(sm, n);
    kvs_layout l = {0};
    const int64_t dims[2] = {T, H};
    kvs_layout_add_group(&l, 2, dims, KVS_DTYPE_BFLOAT16);
    st[STG] += serde_size(&ps[0], &l, s, nb, STG, tmp, cap, back);
    st[STG19] += serde_size(&ps[1], &l, s, nb, STG19, tmp, cap, back);
    st[STGR] += serde_size(&ps[4], &l, s, nb, STGR, tmp, cap, back);
    st[STGR2] += serde_size(&ps[5], &l, s, nb, STGR2, tmp, cap, back);
    st[STGR3] += serde_size(&ps[6], &l, s, nb, STGR3, tmp, cap, back);
    /* fp8 codes: the plain fp8 serde's bytes */
    kvs_memobj in, co;
    kvs_layout cl;
    kvs_layout_flat(&cl, n, KVS_DTYPE_UINT8);
    uint8_t *codes = malloc(n);
    kvs_memobj_init(&in, (void *)s, nb, &l, KVS_FMT_BINARY);
    kvs_memobj_init(&co, codes, n, &cl, KVS_FMT_BINARY);
    size_t w;
    if (kvs_serialize(ps[2].serializer, &in, &co, NULL, &w) != KVS_OK || w != n) exit(1);
    st[F8H0] += h0_bytes(codes, n);
    st[F8Z1] += zstd_size(codes, n, 1, F8Z1, tmp, cap, back);
    kvs_layout f8l = {0};
    kvs_layout_add_group(&f8l, 2, dims, KVS_DTYPE_BFLOAT16);
    /* [fp8, lossless] on the bf16 slice: stored bytes vs the fp8 bytes */
    kvs_memobj b2;
    kvs_layout bl;
    kvs_layout_flat(&bl, cap, KVS_DTYPE_UINT8);
    kvs_memobj_init(&b2, tmp, cap, &bl, KVS_FMT_BINARY);
    double t0 = now_s();
    if (kvs_serialize(ps[3].serializer, &in, &b2, NULL, &w) != KVS_OK) exit(1);
    t_enc[F8STG] += now_s() - t0;
    st[F8STG] += (double)w;
    for (int c = 0; c < NCOL; c++) t_raw[c] += c >= F8H0 ? (double)n : (double)nb;
    free(hi);
    free(lo);
    free(ex);
    free(sm);
    free(codes);
}

static const char *find_dir(int argc, char **argv)
{
    static char buf[4096];
    if (argc > 1) return argv[1];
    if (getenv("KVS_KVDATA_DIR")) return getenv("KVS_KVDATA_DIR");
    const char *c[] = {KVS_SOURCE_DIR "/../shared/kvdata", KVS_SOURCE_DIR "/../../shared/kvdata"};
    for (int i = 0; i < 2; i++) {
        struct stat sb;
        if (stat(c[i], &sb) == 0) {
            snprintf(buf, sizeof buf, "%s", c[i]);
            return buf;
        }
    }
    return NULL;
}

static void row(const char *name, const double *st, double raw, double raw8)
{
    printf("%-8s", name);
    for (int c = 0; c < NCOL; c++) printf(" %8.4f", (c >= F8H0 ? raw8 : raw) / st[c]);
    printf("\n");
}

int main(int argc, char **argv)
{
    const char *dir = find_dir(argc, argv);
    DIR *d = dir ? opendir(dir) : NULL;
    if (d == NULL) {
        printf("bench_lossless: skipped: no kvdata directory (give DIR or set KVS_KVDATA_DIR)\n");
        return 0;
    }
    kvs_serde_pair ps[7] = {
        pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\"}]}"),
        pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","
             "\"level\":19}]}"),
        pair("{\"type\":\"fp8\"}"),
        pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"fp8\"},{\"type\":\"lossless\"}]}"),
        pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","
             "\"coder\":\"rans\"}]}"),
        pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","
             "\"coder\":\"rans\",\"level\":2}]}"),
        pair("{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"lossless\","
             "\"coder\":\"rans\",\"level\":3}]}"),
    };
    size_t cap = 4 << 20;
    uint8_t *tmp = malloc(cap), *back = malloc(cap);
    struct dirent *e;
    int files = 0, L = 0;
    uint8_t *chunk[64];
    size_t chunk_bytes[64];
    kvs_layout chunk_layout[64];
    while ((e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        if (nl < 12 || strcmp(e->d_name + nl - 12, ".safetensors") != 0) continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *fp = fopen(path, "rb");
        if (!fp) continue;
        fseek(fp, 0, SEEK_END);
        long sz = ftell(fp);
        rewind(fp);
        uint8_t *b = malloc((size_t)sz);
        if (fread(b, 1, (size_t)sz, fp) != (size_t)sz) exit(1);
        fclose(fp);
        uint64_t hl = 0;
        for (int i = 7; i >= 0; i--) hl = hl << 8 | b[i];
        json_t *j = json_loadb((char *)b + 8, hl, 0, NULL);
        json_t *kv = json_object_get(j, "kv"), *sh = json_object_get(kv, "shape");
        size_t off = (size_t)json_integer_value(json_array_get(json_object_get(kv, "data_offsets"), 0));
        L = (int)json_integer_value(json_array_get(sh, 1));
        int T = (int)json_integer_value(json_array_get(sh, 2));
        int H = (int)json_integer_value(json_array_get(sh, 3));
        if (L > MAXL) L = MAXL;
        for (int kvi = 0; kvi < 2; kvi++)
            for (int layer = 0; layer < L; layer++)
                slice(kvi, layer, b + 8 + hl + off + ((size_t)kvi * L + layer) * 2 * T * H, T, H, ps,
                      tmp, cap, back);
        if (files < 64 && L > 1) { /* K, then V without layer 0: one object */
            size_t one = (size_t)2 * T * H;
            const uint8_t *kv0 = b + 8 + hl + off;
            chunk_bytes[files] = (2 * (size_t)L - 1) * one;
            chunk[files] = malloc(chunk_bytes[files]);
            memcpy(chunk[files], kv0, (size_t)L * one);
            memcpy(chunk[files] + (size_t)L * one, kv0 + ((size_t)L + 1) * one,
                   ((size_t)L - 1) * one);
            const int64_t cd[2] = {(2 * (int64_t)L - 1) * T, H};
            chunk_layout[files] = (kvs_layout){0};
            kvs_layout_add_group(&chunk_layout[files], 2, cd, KVS_DTYPE_BFLOAT16);
        }
        json_decref(j);
        free(b);
        files++;
    }
    closedir(d);
    printf("bench_lossless: %d files of %s; ratios to the raw bytes (fp8 columns: to the fp8 "
           "bytes)\n\n%-8s",
           files, dir, "slice");
    for (int c = 0; c < NCOL; c++) printf(" %8s", colname[c]);
    printf("\n");
    double tot[NCOL] = {0}, totK[NCOL] = {0}, totV[NCOL] = {0}, raw = 0, rawK = 0, rawV = 0;
    for (int kvi = 0; kvi < 2; kvi++)
        for (int layer = 0; layer < L; layer++) {
            char name[16];
            snprintf(name, sizeof name, "%s%d%s", kvi ? "V" : "K", layer,
                     kvi && layer == 0 ? "*" : "");
            row(name, stored[kvi][layer], rawb[kvi][layer], rawb[kvi][layer] / 2);
            if (kvi == 1 && layer == 0) continue;
            raw += rawb[kvi][layer];
            *(kvi ? &rawV : &rawK) += rawb[kvi][layer];
            for (int c = 0; c < NCOL; c++) {
                tot[c] += stored[kvi][layer][c];
                (kvi ? totV : totK)[c] += stored[kvi][layer][c];
            }
        }
    row("K all", totK, rawK, rawK / 2);
    row("V 1-5", totV, rawV, rawV / 2);
    row("no V0", tot, raw, raw / 2);
    printf("\n* layer-0 V repeats rows: left out of the totals.\n\nGB/s of the raw side (fp8 "
           "columns: of the bf16 side for the stage, of the codes otherwise), one thread, all "
           "slices:\n");
    for (int c = 0; c < NCOL; c++) {
        if (c == H0HL || c == H0ES || c == F8H0) continue;
        double r = c == F8STG ? 2 * t_raw[c] : t_raw[c];
        if (t_dec[c] > 0)
            printf("  %-9s encode %7.3f  decode %7.3f\n", colname[c], r / t_enc[c] / 1e9,
                   r / t_dec[c] / 1e9);
        else /* [fp8, lossless]: encode only (its decode is the fp8 serde's, lossy) */
            printf("  %-9s encode %7.3f  decode       -\n", colname[c], r / t_enc[c] / 1e9);
    }
    int nchunks = files < 64 ? files : 64;
    if (L > 1 && nchunks > 0) {
        printf("\nGB/s of the raw side, one thread, whole chunks (K and V 1-5 of each file as one "
               "object, %d blocks of 128 KiB), median of %d warm passes:\n",
               2 * L - 1, WHOLE_RUNS);
        const char *names[] = {"stage", "stage-r", "stage-r2", "stage-r3"};
        const int which[] = {0, 4, 5, 6};
        for (int k = 0; k < 4; k++)
            time_whole(names[k], &ps[which[k]], chunk, chunk_bytes, nchunks, chunk_layout, tmp,
                       cap, back);
        for (int i = 0; i < nchunks; i++) free(chunk[i]);
    }
    for (int i = 0; i < 7; i++) kvs_serde_pair_destroy(&ps[i]);
    free(tmp);
    free(back);
    return 0;
}
