/* fuzz_transform.c - the "transform" typed stage (src/frame/stage_transform.c)
 * and its coefficient coders (src/codecs/coef_rans.c, which it writes, and
 * coef_coder.c, version 1's, which it still reads) alone, over a small
 * transform calibrated at start (2 layers, hidden 16, from synthetic
 * chunks).
 *
 * Input: byte 0 options, byte 1 the token count (1 + b % 32), the rest the
 * data.
 *   bit 0 clear  decode mode: the data is a stage payload, decoded into a
 *                [2, 2, tokens, 16] bfloat16 destination (canary-filled)
 *   bit 0 set    encode mode: the data gives the chunk's bfloat16 values
 *                (zeros past its end; NaN and inf included), with the K / V
 *                steps from bits 1-3; encoded, decoded, then every
 *                truncation of the payload and one flipped byte are decoded
 * Properties:
 *   - decode refuses (a KVS_E* code and a message) or succeeds; a refusal
 *     leaves every destination byte as it was;
 *   - encode succeeds within typed_bound, is deterministic, and its output
 *     decodes; every truncation of it is refused.
 */
#include <math.h>

#include "codecs/half.h"
#include "codecs/transform.h"
#include "frame/stage.h"
#include "fuzz_common.h"

#define LAYERS 2
#define HIDDEN 16
#define MAX_TOKENS 32
#define NELEM (2 * LAYERS * MAX_TOKENS * HIDDEN)

static kvs_transform *g_t;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    kvs_calibration *c;
    static float kv[2 * LAYERS * 64 * HIDDEN];
    if (kvs_calibration_new(LAYERS, HIDDEN, &c) != KVS_OK) abort();
    uint64_t s = 1;
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        kv[i] = (float)((double)(s >> 40) / 16777216.0 - 0.5) * (float)(1 + i % HIDDEN);
    }
    if (kvs_calibration_add(c, kv, 64) != KVS_OK || kvs_calibration_result(c, &g_t) != KVS_OK)
        abort();
    kvs_calibration_free(c);
    return 0;
}

static const kvs_stage_type *TY = &kvs_stage_transform_type;

static void layout_for(kvs_layout *l, unsigned tokens)
{
    memset(l, 0, sizeof *l);
    const int64_t dims[4] = {2, LAYERS, tokens, HIDDEN};
    if (kvs_layout_add_group(l, 4, dims, KVS_DTYPE_BFLOAT16) != KVS_OK) abort();
}

/* Decode into a canary-filled destination; a refusal must leave it. */
static int decode(const uint8_t *params, const uint8_t *in, size_t n, unsigned tokens,
                  uint16_t *out)
{
    kvs_layout l;
    layout_for(&l, tokens);
    size_t elems = (size_t)2 * LAYERS * tokens * HIDDEN;
    for (size_t i = 0; i < elems; i++) out[i] = 0xA5A5;
    kvs_memobj dst;
    kvs_memobj_init(&dst, out, elems * 2, &l, KVS_FMT_KV_2LTD);
    kvs_stage_ctx ctx = {NULL, NULL, 0, NULL, 0, 0, g_t};
    int rc = TY->check_params(params, 20);
    if (rc == KVS_OK) rc = TY->typed_decode(params, 20, &ctx, in, n, &dst);
    if (rc != KVS_OK) {
        FZ_ASSERT_REFUSAL(rc, "transform decode");
        for (size_t i = 0; i < elems; i++)
            FZ_ASSERT(out[i] == 0xA5A5, "refused decode wrote element %zu", i);
    }
    return rc;
}

static void params_for(float ks, float vs, uint8_t *p)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(g_t->fingerprint >> 8 * i);
    memcpy(p + 8, &ks, 4);
    memcpy(p + 12, &vs, 4);
    memset(p + 16, 0, 4);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in in = {data, size};
    uint8_t opt = fz_u8(&in);
    unsigned tokens = 1 + fz_u8(&in) % MAX_TOKENS;
    static uint16_t out[NELEM];
    uint8_t params[20];
    static const float steps[8] = {0.0001f, 0.01f, 0.05f, 0.125f, 0.5f, 1.0f, 8.0f, 64.0f};
    float ks = steps[(opt >> 1) & 7], vs = steps[(opt >> 4) & 7];
    params_for(ks, vs, params);
    if (!(opt & 1)) {
        decode(params, in.p, in.n, tokens, out);
        return 0;
    }
    static uint16_t src[NELEM];
    size_t elems = (size_t)2 * LAYERS * tokens * HIDDEN;
    for (size_t i = 0; i < elems; i++) src[i] = fz_u16(&in);
    kvs_transform *copy;
    if (kvs_transform_alloc(LAYERS, HIDDEN, &copy) != KVS_OK) abort();
    for (int i = 0; i < KVS_TRANSFORM_NTENSORS; i++) {
        uint64_t n;
        const float *a = kvs_transform_tensor(g_t, i, &n);
        memcpy((float *)kvs_transform_tensor(copy, i, &n), a, (size_t)n * 4);
    }
    kvs_transform_finish(copy);
    kvs_stage *st;
    if (kvs_stage_transform_new(copy, ks, vs, &st) != KVS_OK) abort();
    kvs_layout l;
    layout_for(&l, tokens);
    kvs_memobj sm;
    kvs_memobj_init(&sm, src, elems * 2, &l, KVS_FMT_KV_2LTD);
    size_t cap = 0, n = 0, n2 = 0;
    FZ_ASSERT(TY->typed_bound(st, &l, &cap) == KVS_OK, "bound refused");
    uint8_t *enc = malloc(cap), *enc2 = malloc(cap);
    FZ_ASSERT(TY->typed_encode(st, &sm, enc, cap, &n) == KVS_OK, "encode refused: %s",
              kvs_last_error());
    FZ_ASSERT(n <= cap, "encode wrote %zu of %zu", n, cap);
    FZ_ASSERT(TY->typed_encode(st, &sm, enc2, cap, &n2) == KVS_OK && n2 == n &&
                  memcmp(enc, enc2, n) == 0,
              "encode not deterministic");
    uint8_t p2[20];
    TY->write_params(st, p2);
    FZ_ASSERT(memcmp(p2, params, 20) == 0, "parameters differ");
    FZ_ASSERT(decode(params, enc, n, tokens, out) == KVS_OK, "own output refused: %s",
              kvs_last_error());
    for (size_t cut = 0; cut < n; cut += 1 + cut / 8)
        FZ_ASSERT(decode(params, enc, cut, tokens, out) != KVS_OK, "truncation to %zu accepted",
                  cut);
    if (n) {
        enc[(size_t)opt * 7 % n] ^= 0x5A;
        decode(params, enc, n, tokens, out);
    }
    free(enc);
    free(enc2);
    TY->destroy(st);
    return 0;
}
