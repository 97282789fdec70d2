/* test_eval.c - `kvserde eval` on a file small enough that every figure is
 * computed by hand here: kv [2, 1, 2, 4] bfloat16 and q [1, 2, 4], one head
 * of dim 4.
 *
 *   K = [[1.0625, 1, 1, 1], [1, 1, 1, 1]]  V = [[2, 2, 2, 2], [4, 4, 4, 4]]
 *   q = [[1, 1, 1, 1], [2, 0, 0, 0]]
 *
 * fp8 e4m3 has 3 mantissa bits: 1.0625 = 1.0001b is the tie between 1.000b
 * and 1.001b and rounds to even, 1.0; every other value is exact. So K's
 * error is 0.0625 in one element: K SNR = 10 log10((1.0625^2 + 7) /
 * 0.0625^2); V is exact. Attention (causal): token 0 sees only itself, out =
 * V[0] for both; token 1 scores q1.k / sqrt(4) = 1.0625 and 1 (original),
 * 1 and 1 (restored): out = 2 p + 4 (1 - p), p = 1 / (1 + e^-0.0625), and 3.
 * Sizes: the plain fp8 serde stores 8 bytes per slice (8 bits per
 * element, 2x); the pipeline [bytes, crc32c] stores a 58-byte header
 * (28 + 2 + 2 x 8 + 4 + 4 + 4) and 16 + 4 payload bytes per slice.
 *
 * The int stage, 2 bits symmetric (one step each side of 0), float32
 * scales, groups of 2, K per channel and V per token (INT2 below):
 *   --objects layer: one KV_2TD [2, 2, 4] object. K channel 0 holds 1.0625
 *   and 1: s = 1.0625, both come back 1.0625; the other channels and V
 *   (equal pairs) are exact. So K's error is again 0.0625 in one element
 *   and token 1 scores 1.0625 twice: the fp8 figures above. Size: header
 *   28 + (2 + 3 x 8) + (4 + 14) + (4 + 0) + 4 = 80; payload 4 + K (4
 *   scales x 4 + 2 rows x 1 byte) + V (4 scales x 4 + 2) + CRC 4 = 44: 124
 *   bytes for 16 elements.
 *   per-slice objects ([2, 4], memory format binary): both quantized per
 *   token (V's settings): K token 0's group {1.0625, 1} gives 1.0625 twice,
 *   so K's error is the same, but token 1's scores are the original ones:
 *   attention is exact. Size per slice: header 28 + 18 + 18 + 4 + 4 = 72,
 *   payload 4 + 16 + 2 + 4 = 26.
 *   --objects chunk: the whole KV_2LTD [2, 1, 2, 4] tensor as one object,
 *   K per channel and V per token as with --objects layer (the same
 *   errors), a header with four dims instead of three: 88 + 44 = 132 bytes.
 *   With --skip k0 the one slice left is a [1, 2, 4] binary object (V's
 *   settings, exact): header 80, payload 26.
 * The pipeline [bytes, crc32c] with --objects chunk: one object, header
 * 28 + 2 + 4 x 8 + 12 = 74 and payload 32 + 4; with --skip v0 the K slice as
 * [1, 2, 4]: header 66, payload 16 + 4. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvs_test.h"

static char tool[4096];
static char file[4096];
static char cal_file[4096]; /* other chunk values, for --calibration */
static char dir_path[64];

static void write_file_kv(const char *path, const uint16_t *kv, int with_q);

static void write_file(const char *path)
{
    static const uint16_t kv[16] = {0x3F88, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80,
                                    0x4000, 0x4000, 0x4000, 0x4000, 0x4080, 0x4080, 0x4080, 0x4080};
    write_file_kv(path, kv, 1);
}

/* kv [2, 1, 2, 4] and, with_q, q [1, 2, 4] (without: what `kvserde encode`
 * can put through the transform stage, which refuses every other shape). */
static void write_file_kv(const char *path, const uint16_t *kv, int with_q)
{
    static const uint16_t q[8] = {0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x4000, 0, 0, 0};
    char hdr[512];
    int n = snprintf(hdr, sizeof hdr,
                     "{\"__metadata__\":{\"head_dim\":\"4\",\"num_heads\":\"1\","
                     "\"num_kv_heads\":\"1\"},\"kv\":{\"dtype\":\"BF16\",\"shape\":[2,1,2,4],"
                     "\"data_offsets\":[0,32]}%s}",
                     with_q ? ",\"q\":{\"dtype\":\"BF16\",\"shape\":[1,2,4],"
                              "\"data_offsets\":[32,48]}"
                            : "");
    while (n % 8) hdr[n++] = ' ';
    FILE *f = fopen(path, "wb");
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    fwrite(len, 1, 8, f);
    fwrite(hdr, 1, (size_t)n, f);
    for (int i = 0; i < 16; i++) fputc(kv[i] & 255, f), fputc(kv[i] >> 8, f);
    for (int i = 0; with_q && i < 8; i++) fputc(q[i] & 255, f), fputc(q[i] >> 8, f);
    fclose(f);
}

static char *run(const char *args)
{
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "%s eval %s %s 2>&1", tool, args, file);
    FILE *p = popen(cmd, "r");
    if (p == NULL) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while ((r = fread(buf + n, 1, cap - 1 - n, p)) > 0) n += r;
    buf[n] = 0;
    int st = pclose(p);
    if (st != 0) {
        fprintf(stderr, "%s: exit %d\n%s\n", cmd, st, buf);
        free(buf);
        return NULL;
    }
    return buf;
}

/* Run a tool command line; its output (malloc'd) and exit status. */
static char *run_status(const char *args, int *status)
{
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", tool, args);
    FILE *p = popen(cmd, "r");
    if (p == NULL) return NULL;
    size_t cap = 1 << 16, n = 0, r;
    char *buf = malloc(cap);
    while ((r = fread(buf + n, 1, cap - 1 - n, p)) > 0) n += r;
    buf[n] = 0;
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return buf;
}

static double num(const json_t *r, const char *k) { return json_number_value(json_object_get(r, k)); }

#define NEAR(a, b) (fabs((a) - (b)) <= 1e-6 * (1 + fabs(b)))

/* The file's figures worked out in the header comment: K's SNR with one
 * element off by 0.0625, and the attention output's SNR when token 1
 * scores 1.0625 twice. */
static double k_snr_one_off(void) { return 10 * log10((1.0625 * 1.0625 + 7) / (0.0625 * 0.0625)); }

static double attn_snr_one_off(void)
{
    double p = 1 / (1 + exp(-0.0625)), o1 = 2 * p + 4 * (1 - p);
    return 10 * log10((4 * 4 + 4 * o1 * o1) / (4 * (o1 - 3) * (o1 - 3)));
}

/* `eval --json ARGS`'s document (NULL when it failed) and its first row. */
static json_t *run_json(const char *args, const json_t **row)
{
    char *out = run(args);
    json_t *doc = out ? json_loads(out, 0, NULL) : NULL;
    free(out);
    *row = json_array_get(json_object_get(doc, "results"), 0);
    return doc;
}

static void test_fp8_figures(void)
{
    char *out = run("--json --serde '{\"type\": \"fp8\"}'");
    REQUIRE(out != NULL);
    json_t *doc = json_loads(out, 0, NULL);
    REQUIRE(doc != NULL);
    CHECK(json_integer_value(json_object_get(doc, "files")) == 1);
    const json_t *r = json_array_get(json_object_get(doc, "results"), 0);
    REQUIRE(r != NULL);
    CHECK(json_is_null(json_object_get(r, "preset")));
    CHECK(json_is_object(json_object_get(r, "serde")));
    CHECK(NEAR(num(r, "bits_per_element"), 8.0));
    CHECK(NEAR(num(r, "ratio"), 2.0));
    CHECK(json_is_false(json_object_get(r, "lossless")));
    double k_snr = 10 * log10((1.0625 * 1.0625 + 7) / (0.0625 * 0.0625));
    CHECK(NEAR(num(r, "k_snr_db"), k_snr));
    CHECK(json_is_null(json_object_get(r, "v_snr_db"))); /* V is exact */
    CHECK(NEAR(num(r, "max_abs_err"), 0.0625));
    double p = 1 / (1 + exp(-0.0625)), o1 = 2 * p + 4 * (1 - p);
    double sig = 4 * 4 + 4 * o1 * o1, noise = 4 * (o1 - 3) * (o1 - 3);
    double cosv = (4 * 4 + 4 * o1 * 3) / sqrt(sig * (4 * 4 + 4 * 9));
    /* the tool keeps attention outputs in float: allow float rounding */
    CHECK(fabs(num(r, "attn_snr_db") - 10 * log10(sig / noise)) < 1e-3);
    CHECK(fabs(num(r, "attn_cosine") - cosv) < 1e-7);
    CHECK(num(r, "encode_gbps") > 0 && num(r, "decode_gbps") > 0);
    json_decref(doc);
    free(out);
}

static void test_lossless_figures(void)
{
    char *out = run("--json --serde "
                    "'{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},{\"type\":\"crc32c\"}]}'");
    REQUIRE(out != NULL);
    json_t *doc = json_loads(out, 0, NULL);
    REQUIRE(doc != NULL);
    const json_t *r = json_array_get(json_object_get(doc, "results"), 0);
    CHECK(NEAR(num(r, "bits_per_element"), 8.0 * 2 * 78 / 16));
    CHECK(NEAR(num(r, "ratio"), 32.0 / 156));
    CHECK(json_is_true(json_object_get(r, "lossless")));
    CHECK(json_is_null(json_object_get(r, "k_snr_db")));
    CHECK(json_is_null(json_object_get(r, "v_snr_db")));
    CHECK(json_is_null(json_object_get(r, "attn_snr_db")));
    CHECK(NEAR(num(r, "attn_cosine"), 1.0));
    CHECK(NEAR(num(r, "max_abs_err"), 0.0));
    json_decref(doc);
    free(out);
}

#define INT2 "'{\"type\":\"pipeline\",\"stages\":[{\"type\":\"int\",\"bits\":2,"   \
             "\"group\":2,\"zero_point\":false,\"scale_dtype\":\"float32\"}]}'"

/* INT2 on objects that hold K and V of the layer together (K per channel):
 * stored bytes in all, and the errors of the header comment. */
static void check_int2_whole_layer(const json_t *r, int stored)
{
    CHECK(NEAR(num(r, "bits_per_element"), 8.0 * stored / 16));
    CHECK(NEAR(num(r, "ratio"), 32.0 / stored));
    CHECK(json_is_false(json_object_get(r, "lossless")));
    CHECK(NEAR(num(r, "k_snr_db"), k_snr_one_off()));
    CHECK(json_is_null(json_object_get(r, "v_snr_db")));
    CHECK(NEAR(num(r, "max_abs_err"), 0.0625));
    CHECK(fabs(num(r, "attn_snr_db") - attn_snr_one_off()) < 1e-3);
}

static void test_int_figures(void)
{
    const json_t *r;
    json_t *doc = run_json("--json --objects layer --serde " INT2, &r);
    REQUIRE(r != NULL);
    check_int2_whole_layer(r, 124);
    json_decref(doc);
    doc = run_json("--json --serde " INT2, &r);
    REQUIRE(r != NULL);
    CHECK(NEAR(num(r, "bits_per_element"), 8.0 * 2 * 98 / 16));
    CHECK(NEAR(num(r, "k_snr_db"), k_snr_one_off()));
    CHECK(json_is_null(json_object_get(r, "v_snr_db")));
    CHECK(json_is_null(json_object_get(r, "attn_snr_db"))); /* exact */
    json_decref(doc);
    /* layer objects report layers */
    char *out = run("--objects layer --per-slice --serde " INT2);
    REQUIRE(out != NULL);
    CHECK(strstr(out, "    KV0   ratio 0.2581 (lossy)") != NULL);
    free(out);
}

#define CRC_PIPELINE "'{\"type\":\"pipeline\",\"stages\":[{\"type\":\"bytes\"},"   \
                     "{\"type\":\"crc32c\"}]}'"

/* --objects chunk: one object per file, each slice charged an equal share. */
static void test_chunk_objects(void)
{
    const json_t *r;
    json_t *doc = run_json("--json --objects chunk --serde " CRC_PIPELINE, &r);
    REQUIRE(r != NULL);
    CHECK(NEAR(num(r, "bits_per_element"), 8.0 * 110 / 16));
    CHECK(json_is_true(json_object_get(r, "lossless")));
    CHECK(json_is_false(json_object_get(r, "calibrated")));
    json_decref(doc);
    doc = run_json("--json --objects chunk --skip v0 --serde " CRC_PIPELINE, &r);
    REQUIRE(r != NULL);
    CHECK(NEAR(num(r, "bits_per_element"), 8.0 * 86 / 8));
    CHECK(NEAR(num(r, "ratio"), 16.0 / 86));
    json_decref(doc);
    doc = run_json("--json --objects chunk --serde " INT2, &r);
    REQUIRE(r != NULL);
    check_int2_whole_layer(r, 132);
    json_decref(doc);
    char *out = run("--objects chunk --per-slice --skip k0 --serde " INT2);
    REQUIRE(out != NULL);
    CHECK(strstr(out, "--serde        106.000  0.1509 yes ") != NULL);
    CHECK(strstr(out, "    V0   ratio 0.1509\n") != NULL);
    free(out);
    /* everything skipped: no object, no figures */
    doc = run_json("--json --objects chunk --skip k0,v0 --serde " CRC_PIPELINE, &r);
    REQUIRE(r != NULL);
    CHECK(json_is_null(json_object_get(r, "bits_per_element")));
    CHECK(json_is_null(json_object_get(r, "encode_gbps")));
    json_decref(doc);
    int st = 0;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "eval --objects chunks --serde " CRC_PIPELINE " %s", file);
    out = run_status(cmd, &st);
    REQUIRE(out != NULL);
    CHECK(st == 2);
    CHECK(strcmp(out, "kvserde eval: --objects takes slice, layer or chunk; got 'chunks'\n") == 0);
    free(out);
}

static void test_sweep_and_table(void)
{
    char *out = run("--json --sweep");
    REQUIRE(out != NULL);
    json_t *doc = json_loads(out, 0, NULL);
    REQUIRE(doc != NULL);
    const json_t *res = json_object_get(doc, "results");
    CHECK(json_array_size(res) >= 4);
    int saw_lossless = 0;
    for (size_t i = 0; i < json_array_size(res); i++) {
        const json_t *r = json_array_get(res, i);
        CHECK(json_is_string(json_object_get(r, "preset")));
        if (strcmp(json_string_value(json_object_get(r, "preset")), "lossless") == 0) {
            saw_lossless = 1;
            CHECK(json_is_true(json_object_get(r, "lossless")));
        }
    }
    CHECK(saw_lossless);
    /* the ggml presets need a hidden size that is a multiple of 32: skipped
     * on this file, with the reason, the others still run */
    int saw_ggml = 0;
    for (size_t i = 0; i < json_array_size(res); i++) {
        const json_t *r = json_array_get(res, i);
        if (strcmp(json_string_value(json_object_get(r, "preset")), "ggml_q4_0") != 0) continue;
        saw_ggml = 1;
        const char *why = json_string_value(json_object_get(r, "skipped"));
        REQUIRE(why != NULL);
        CHECK(strstr(why, "ggml_q4_0: source group 0 [2x4 bfloat16]: the last dimension 4 is not "
                          "a multiple of 32") != NULL);
        CHECK(json_is_null(json_object_get(r, "bits_per_element")));
    }
    CHECK(saw_ggml);
    /* a preset these 4-channel tensors cannot take is reported, not run */
    int saw_unfit = 0;
    for (size_t i = 0; i < json_array_size(res); i++) {
        const json_t *r = json_array_get(res, i);
        if (strcmp(json_string_value(json_object_get(r, "preset")), "int47-had-ll") != 0) continue;
        saw_unfit = 1;
        const char *why = json_string_value(json_object_get(r, "skipped"));
        REQUIRE(why != NULL);
        CHECK(strstr(why, ": int: hadamard 256 does not divide the 4 channels of group 0") != NULL);
        CHECK(json_is_null(json_object_get(r, "bits_per_element")));
    }
    CHECK(saw_unfit);
    json_decref(doc);
    free(out);
    out = run("--sweep --per-slice --skip v0");
    REQUIRE(out != NULL);
    CHECK(strstr(out, "1 file(s)") != NULL);
    CHECK(strstr(out, "serde             bits   ratio exact") != NULL);
    CHECK(strstr(out, "    K0   ratio") != NULL);
    CHECK(strstr(out, "    V0   ratio") == NULL); /* skipped */
    CHECK(strstr(out, "\nggml_q8_0      skipped: ") != NULL);
    CHECK(strstr(out, "int21-had-ll   skipped: ") !=
          NULL);
    free(out);
}

static void test_calibration(void)
{
    char args[20000], t1[4200], t2[4200];
    snprintf(t1, sizeof t1, "%s/t1.safetensors", dir_path);
    snprintf(t2, sizeof t2, "%s/t2.safetensors", dir_path);
    int st;
    snprintf(args, sizeof args, "calibrate --out %s %s", t1, cal_file);
    char *out = run_status(args, &st);
    CHECK_EQ_INT(st, 0);
    CHECK(out && strstr(out, "1 layers x hidden 4, from 1 chunks (2 tokens)") != NULL);
    free(out);
    snprintf(args, sizeof args, "calibrate --out %s %s", t2, cal_file);
    free(run_status(args, &st));
    CHECK_EQ_INT(st, 0);
    /* deterministic: the same bytes */
    snprintf(args, sizeof args, "cmp %s %s", t1, t2);
    CHECK_EQ_INT(system(args), 0);
    /* encode with the transform stage, decode with and without the file */
    static const uint16_t kv[16] = {0x3F00, 0x3F80, 0x4000, 0x4040, 0xBF80, 0x3E80, 0x4080, 0x3F40,
                                    0x4000, 0x3F80, 0x4040, 0x4000, 0x4080, 0x4000, 0x3F80, 0x40A0};
    char kvf[4200], enc[4200], dec[4200];
    snprintf(kvf, sizeof kvf, "%s/kv.safetensors", dir_path);
    snprintf(enc, sizeof enc, "%s/enc.safetensors", dir_path);
    snprintf(dec, sizeof dec, "%s/dec.safetensors", dir_path);
    write_file_kv(kvf, kv, 0);
    snprintf(args, sizeof args,
             "encode --serde '{\"type\":\"pipeline\",\"stages\":[{\"type\":\"transform\","
             "\"path\":\"%s\",\"step\":0.01}]}' %s %s",
             t1, kvf, enc);
    free(run_status(args, &st));
    CHECK_EQ_INT(st, 0);
    snprintf(args, sizeof args, "decode %s %s", enc, dec);
    out = run_status(args, &st);
    CHECK_EQ_INT(st, 1);
    CHECK(out && strstr(out, "this reader has no transform configured") != NULL);
    free(out);
    snprintf(args, sizeof args, "decode --transform %s --dtype bfloat16 %s %s", t1, enc, dec);
    out = run_status(args, &st);
    CHECK_EQ_INT(st, 0);
    free(out);
    /* inspect --compare decodes the frame too: refused without the file,
     * the kv row with it (the stage's error at step 0.01 is small) */
    snprintf(args, sizeof args, "inspect %s --compare %s", enc, kvf);
    out = run_status(args, &st);
    CHECK_EQ_INT(st, 1);
    CHECK(out && strstr(out, "this reader has no transform configured") != NULL);
    free(out);
    snprintf(args, sizeof args, "inspect %s --transform %s --compare %s", enc, t1, kvf);
    out = run_status(args, &st);
    CHECK_EQ_INT(st, 0);
    CHECK(out && strstr(out, "stage 0: transform {") != NULL &&
          strstr(out, "\n  kv    U8 ") != NULL && strstr(out, "checks ok") != NULL);
    free(out);
    snprintf(args, sizeof args, "inspect %s --transform %s/missing.safetensors", enc, dir_path);
    out = run_status(args, &st);
    CHECK_EQ_INT(st, 1);
    CHECK(out && strstr(out, "kvserde inspect: --key-file / --transform: ") != NULL);
    free(out);
    unlink(kvf);
    unlink(enc);
    unlink(dec);
    unlink(t1);
    unlink(t2);
    /* the calibrated presets, marked, only with a calibration */
    snprintf(args, sizeof args, "eval --json --calibration %s --sweep %s", cal_file, file);
    out = run_status(args, &st);
    CHECK_EQ_INT(st, 0);
    json_t *doc = out ? json_loads(out, 0, NULL) : NULL;
    REQUIRE(doc != NULL);
    const json_t *res = json_object_get(doc, "results");
    int calibrated = 0, plain = 0;
    for (size_t i = 0; i < json_array_size(res); i++) {
        const json_t *r = json_array_get(res, i);
        const char *name = json_string_value(json_object_get(r, "preset"));
        int xform = name && strncmp(name, "xform-", 6) == 0;
        CHECK(json_is_boolean(json_object_get(r, "calibrated")));
        CHECK(json_is_true(json_object_get(r, "calibrated")) == xform);
        calibrated += xform;
        plain += !xform;
        if (xform)
            CHECK(num(r, "bits_per_element") > 0 &&
                  !json_is_true(json_object_get(r, "lossless")));
    }
    CHECK_EQ_INT(calibrated, 3);
    CHECK(plain >= 4);
    json_decref(doc);
    free(out);
    snprintf(args, sizeof args, "eval --json --sweep %s", file);
    out = run_status(args, &st);
    CHECK(st == 0 && out && strstr(out, "xform-") == NULL &&
          strstr(out, "\"calibrated\": true") == NULL);
    free(out);
    /* never calibrate on a file that is evaluated */
    snprintf(args, sizeof args, "eval --calibration %s --sweep %s", file, file);
    out = run_status(args, &st);
    CHECK_EQ_INT(st, 2);
    char want[9000];
    snprintf(want, sizeof want,
             "kvserde eval: %s is both a calibration file and a file to evaluate; calibrate on "
             "other chunks\n",
             file);
    CHECK_EQ_STR(out, want);
    free(out);
    snprintf(args, sizeof args,
             "eval --serde '{\"type\":\"pipeline\",\"stages\":[{\"type\":\"transform\","
             "\"path\":\"@calibration\"}]}' %s",
             file);
    out = run_status(args, &st);
    CHECK_EQ_INT(st, 2);
    CHECK_EQ_STR(out,
                 "kvserde eval: --serde names \"@calibration\" but no --calibration was given\n");
    free(out);
}

int main(void)
{
    const char *bin = getenv("KVS_TEST_BIN_DIR");
    if (bin == NULL) {
        fprintf(stderr, "KVS_TEST_BIN_DIR is not set (ctest sets it)\n");
        return 1;
    }
    snprintf(tool, sizeof tool, "%s/kvserde", bin);
    char dir[] = "/tmp/kvs_test_eval_XXXXXX";
    if (mkdtemp(dir) == NULL) return 1;
    snprintf(dir_path, sizeof dir_path, "%s", dir);
    snprintf(file, sizeof file, "%s/small.safetensors", dir);
    write_file(file);
    static const uint16_t other[16] = {0x3F00, 0x3F80, 0x4000, 0x4040, 0xBF80, 0x3E80, 0x4080,
                                       0x3F40, 0x4000, 0x3F80, 0x4040, 0x4000, 0x4080, 0x4000,
                                       0x3F80, 0x40A0};
    snprintf(cal_file, sizeof cal_file, "%s/cal.safetensors", dir);
    write_file_kv(cal_file, other, 1);
    RUN(test_fp8_figures);
    RUN(test_lossless_figures);
    RUN(test_int_figures);
    RUN(test_chunk_objects);
    RUN(test_sweep_and_table);
    RUN(test_calibration);
    unlink(file);
    unlink(cal_file);
    rmdir(dir);
    return TEST_SUMMARY();
}
