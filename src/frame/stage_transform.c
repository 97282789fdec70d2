/* stage_transform.c - the "transform" typed stage: a calibrated linear
 * transform (transform.h) decorrelates each layer's K and V, the
 * coefficients are quantized with one uniform step per K / V (a multiple of
 * the layer's RMS on the calibration chunks), the trailing components that
 * quantize to zero everywhere are dropped (they would cost bits and decode
 * time for nothing), and the rest are entropy-coded with one context class
 * per component chosen by the encoder and stored (coef_rans.h; payloads of
 * version 1 were coded by coef_coder.h and still decode).
 * docs/frame_format.md "The transform payload" defines the bytes;
 * docs/fidelity.md has the measurements behind the defaults.
 *
 * Parameters (20 bytes): the transform's fingerprint (u64), the K step and
 * the V step (f32 each, in units of the layer's RMS), 4 bytes 0. A reader
 * must be configured with the same transform file: one with another or none
 * is refused (KVS_EKEY) naming both fingerprints, before any byte of the
 * destination is written.
 *
 * Serves one group of shape [2, layers, tokens, hidden] (KV_2LTD) in
 * bfloat16, float16 or float32, where layers and hidden are the
 * transform's; anything else is refused at encode with the shape wanted. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/basis_products.h"
#include "codecs/blas.h"
#include "codecs/clones.h"
#include "codecs/coef_coder.h"
#include "codecs/coef_rans.h"
#include "codecs/half.h"
#include "codecs/transform.h"
#include "frame/stage.h"
#include "kvserde/error.h"
#include "kvserde/registry.h"
#include "util/le.h"

#define PARAMS_SIZE 20
#define PAYLOAD_HEADER 16
#define RECORD_SIZE 8
#define PAYLOAD_VERSION 2       /* the static-table rANS (coef_rans.h) */
#define PAYLOAD_VERSION_RANGE 1 /* the adaptive range coder (coef_coder.h), read only */
#define MODE_CODED 0
#define MODE_RAW 1
#define Q_MAX 32767 /* coefficients are clamped to +-Q_MAX (the raw mode's i16) */
#define STEP_MIN 1e-4
#define STEP_MAX 64.0

typedef struct transform_stage {
    kvs_stage base;
    kvs_transform *t;
    float step[2]; /* K, V: in units of the layer's RMS */
} transform_stage;

static const char *const kv_name[2] = {"K", "V"};

static int get_number(const json_t *config, const char *key, double def, double lo, double hi,
                      double *out)
{
    const json_t *v = json_object_get(config, key);
    if (v == NULL) {
        *out = def;
        return KVS_OK;
    }
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi))
        return kvs_set_error(KVS_EINVAL, "transform: %s must be a number from %g to %g, got %s",
                             key, lo, hi, json_is_number(v) ? "a number out of range"
                                                            : kvs_json_type_name(v));
    *out = json_number_value(v);
    return KVS_OK;
}

/* ---- a step for a target --------------------------------------------
 * "bits" and "snr_db" are resolved once, when the stage is created, from
 * the calibration variances alone (so the step, recorded in every frame, is
 * the same for every blob): each component is modelled as a Gaussian of its
 * calibration variance, rounded to the step; its entropy and its squared
 * error are summed over components, layers, K and V. docs/fidelity.md
 * measures how far the blobs land from the target. */

static double phi(double x) { return exp(-0.5 * x * x) / sqrt(2 * M_PI); }
static double cdf(double x) { return 0.5 * erfc(-x / sqrt(2.0)); }

/* Entropy (bits) and mean squared error of N(0, sigma^2) rounded to delta. */
static void gauss_rounded(double sigma, double delta, double *bits, double *mse)
{
    double r = sigma / delta;
    if (r > 4) { /* high-rate: uniform error within the bin */
        *bits = log2(r) + 0.5 * log2(2 * M_PI * M_E);
        *mse = delta * delta / 12;
        return;
    }
    if (sigma <= 0) {
        *bits = 0;
        *mse = 0;
        return;
    }
    double h = 0, e = 0, s2 = sigma * sigma;
    int kmax = (int)ceil(8 * r) + 1;
    for (int k = -kmax; k <= kmax; k++) {
        double a = (k - 0.5) * delta / sigma, b = (k + 0.5) * delta / sigma, c = k * delta;
        double p = cdf(b) - cdf(a);
        if (p > 0) h -= p * log2(p);
        double m2 = s2 * p - s2 * (b * phi(b) - a * phi(a)); /* int x^2 */
        double m1 = sigma * (phi(a) - phi(b));               /* int x */
        e += m2 - 2 * c * m1 + c * c * p;
    }
    *bits = h;
    *mse = e > 0 ? e : 0;
}

/* Predicted bits per element and SNR (dB, K and V together) at step s. */
static void predict(const kvs_transform *t, double s, double *bits, double *snr_db)
{
    double b = 0, sig = 0, noise = 0;
    for (int kv = 0; kv < 2; kv++)
        for (uint32_t l = 0; l < t->layers; l++) {
            const float *var = t->var[kv] + (size_t)l * t->hidden;
            const float *mean = t->mean[kv] + (size_t)l * t->hidden;
            double delta = s * t->rms[kv][l];
            for (uint32_t j = 0; j < t->hidden; j++) {
                double hb, e;
                gauss_rounded(sqrt((double)var[j]), delta, &hb, &e);
                b += hb;
                noise += e;
                sig += (double)var[j] + (double)mean[j] * mean[j];
            }
        }
    *bits = b / (2.0 * t->layers * t->hidden);
    *snr_db = noise > 0 ? 10 * log10(sig / noise) : INFINITY;
}

/* The step (bisection on its logarithm; the rate falls and the SNR falls
 * as the step grows) meeting the target. */
static double step_for_target(const kvs_transform *t, int want_bits, double target)
{
    double lo = log(STEP_MIN), hi = log(STEP_MAX);
    for (int i = 0; i < 60; i++) {
        double mid = 0.5 * (lo + hi), b, snr;
        predict(t, exp(mid), &b, &snr);
        int too_fine = want_bits ? b > target : snr > target;
        if (too_fine)
            lo = mid;
        else
            hi = mid;
    }
    return exp(want_bits ? hi : lo); /* the side that meets the target */
}

static int transform_create(const json_t *config, kvs_stage **out)
{
    static const char *const known[] = {"type",   "path", "step", "k_step",
                                        "v_step", "bits", "snr_db", NULL};
    int rc = kvs_json_check_keys(config, "transform", "member", known);
    if (rc) return rc;
    const char *path = json_string_value(json_object_get(config, "path"));
    if (path == NULL)
        return kvs_set_error(KVS_EINVAL,
                             "transform: \"path\" is required: the transform file `kvserde "
                             "calibrate` wrote");
    int ntargets = 0;
    static const char *const exclusive[] = {"step", "k_step", "v_step", "bits", "snr_db"};
    for (int i = 0; i < 5; i++) ntargets += json_object_get(config, exclusive[i]) != NULL;
    int has_target = json_object_get(config, "bits") || json_object_get(config, "snr_db");
    if (has_target && ntargets > 1)
        return kvs_set_error(KVS_EINVAL,
                             "transform: give one of \"step\" (and \"k_step\" / \"v_step\"), "
                             "\"bits\" or \"snr_db\"");
    double step, ks, vs, bits = 0, snr = 0;
    rc = get_number(config, "step", 0.125, STEP_MIN, STEP_MAX, &step);
    if (rc == KVS_OK) rc = get_number(config, "k_step", step, STEP_MIN, STEP_MAX, &ks);
    if (rc == KVS_OK) rc = get_number(config, "v_step", step, STEP_MIN, STEP_MAX, &vs);
    if (rc == KVS_OK) rc = get_number(config, "bits", 2.0, 0.05, 16.0, &bits);
    if (rc == KVS_OK) rc = get_number(config, "snr_db", 30.0, 1.0, 120.0, &snr);
    if (rc) return rc;
    const kvs_blas *blas; /* refused here, at configuration, if it cannot be loaded */
    rc = kvs_blas_get("transform", &blas);
    if (rc) return rc;
    transform_stage *s = calloc(1, sizeof *s);
    if (s == NULL) return kvs_set_error(KVS_ENOMEM, "transform: out of memory");
    rc = kvs_transform_load(path, &s->t);
    if (rc) {
        free(s);
        return rc;
    }
    if (has_target) {
        int want_bits = json_object_get(config, "bits") != NULL;
        ks = vs = step_for_target(s->t, want_bits, want_bits ? bits : snr);
    }
    s->base.type = &kvs_stage_transform_type;
    s->step[0] = (float)ks;
    s->step[1] = (float)vs;
    *out = &s->base;
    return KVS_OK;
}

/* [2, layers, tokens, hidden] of a float dtype, the transform's layers and
 * hidden; *tokens set. */
static int check_layout(const kvs_transform *t, const kvs_layout *layout, const char *what,
                        uint64_t *tokens)
{
    int rc = kvs_layout_validate(layout);
    if (rc) return rc;
    const kvs_group *g = layout->ngroups == 1 ? &layout->groups[0] : NULL;
    if (g == NULL || g->shape.ndim != 4 || g->shape.dims[0] != 2 ||
        (uint64_t)g->shape.dims[1] != t->layers || (uint64_t)g->shape.dims[3] != t->hidden ||
        g->shape.dims[2] < 1 || g->shape.dims[2] > INT32_MAX / 2 ||
        (g->dtype != KVS_DTYPE_BFLOAT16 && g->dtype != KVS_DTYPE_FLOAT16 &&
         g->dtype != KVS_DTYPE_FLOAT32)) {
        char got[256];
        kvs_layout_format(layout, got, sizeof got);
        return kvs_set_error(KVS_EINVAL,
                             "transform: %s is %s; the transform serves one group [2 x %u x "
                             "tokens x %u] (KV_2LTD with its %u layers and hidden %u) of "
                             "bfloat16, float16 or float32",
                             what, got, t->layers, t->hidden, t->layers, t->hidden);
    }
    /* a stream's byte count is a u32 in the payload */
    uint64_t stream_max = (uint64_t)g->shape.dims[2] * t->hidden * 2 + t->hidden;
    if (stream_max > UINT32_MAX)
        return kvs_set_error(KVS_EINVAL,
                             "transform: %s has %lld tokens x hidden %u; at most %llu tokens "
                             "per chunk (a stream's size is 32-bit)",
                             what, (long long)g->shape.dims[2], t->hidden,
                             (unsigned long long)((UINT32_MAX - t->hidden) / (2ull * t->hidden)));
    *tokens = (uint64_t)g->shape.dims[2];
    return KVS_OK;
}

static size_t payload_bound(const kvs_transform *t, uint64_t tokens)
{
    return PAYLOAD_HEADER + (size_t)2 * t->layers * RECORD_SIZE +
           (size_t)2 * t->layers * (tokens * t->hidden * 2 + t->hidden);
}

int kvs_stage_transform_new(kvs_transform *t, float k_step, float v_step, kvs_stage **out)
{
    transform_stage *s = calloc(1, sizeof *s);
    if (s == NULL) {
        kvs_transform_free(t);
        return kvs_set_error(KVS_ENOMEM, "transform: out of memory");
    }
    s->base.type = &kvs_stage_transform_type;
    s->t = t;
    s->step[0] = k_step;
    s->step[1] = v_step;
    *out = &s->base;
    return KVS_OK;
}

static int transform_bound(const kvs_stage *self, const kvs_layout *layout, size_t *nbytes)
{
    const transform_stage *s = KVS_CONTAINER_OF(self, const transform_stage, base);
    uint64_t tokens = 0; /* set by check_layout (-O3 cannot tell) */
    int rc = check_layout(s->t, layout, "the source", &tokens);
    if (rc == KVS_OK) *nbytes = payload_bound(s->t, tokens);
    return rc;
}

/* The step of K or V in layer l, in the data's units. */
static float layer_step(const kvs_transform *t, int kv, uint32_t l, float step)
{
    return step * t->rms[kv][l];
}

/* A component's context class from the sum of its T quantized values'
 * squares: their mean square in half-octaves, 0 for up to 2^-8 (one +-1 in
 * 256 tokens) and below (the encoder's choice, stored: the decoder reads
 * it). The tables of coef_tables.h were fitted to this mapping. */
static uint8_t component_class(double sum_sq, size_t rows)
{
    double ms = sum_sq / (double)rows;
    if (ms <= 0) return 0;
    int c = (int)floor(2 * log2(ms)) + 16;
    return (uint8_t)(c < 0 ? 0 : c >= KVS_COEF_RANS_CLASSES ? KVS_COEF_RANS_CLASSES - 1 : c);
}

/* A float's bits as a little-endian u32 in a frame's parameters. */
static float get_le_float(const uint8_t *p)
{
    uint32_t u = get_le32(p);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void put_le_float(uint8_t *p, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    put_le32(p, u);
}

static void load_rows(const void *src, kvs_dtype dtype, size_t offset, size_t n, float *out)
{
    if (dtype == KVS_DTYPE_FLOAT32) {
        memcpy(out, (const float *)src + offset, n * sizeof(float));
    } else if (dtype == KVS_DTYPE_BFLOAT16) {
        const uint16_t *p = (const uint16_t *)src + offset;
        for (size_t i = 0; i < n; i++) out[i] = kvs_bf16_to_f32(p[i]);
    } else {
        const uint16_t *p = (const uint16_t *)src + offset;
        for (size_t i = 0; i < n; i++) out[i] = kvs_f16_to_f32(p[i]);
    }
}

/* T rows of h values, each x + mean, rounded to dtype at dst: the mean
 * added and the result converted in one pass. */
CLONES_V4 static void store_rows_mean(const float *x, size_t T, size_t h, const float *mean,
                                   kvs_dtype dtype, void *dst)
{
    for (size_t r = 0; r < T; r++) {
        const float *in = x + r * h;
        if (dtype == KVS_DTYPE_FLOAT32) {
            float *p = (float *)dst + r * h;
            for (size_t e = 0; e < h; e++) p[e] = in[e] + mean[e];
        } else if (dtype == KVS_DTYPE_BFLOAT16) {
            uint16_t *p = (uint16_t *)dst + r * h;
            for (size_t e = 0; e < h; e++) p[e] = kvs_f32_to_bf16(in[e] + mean[e]);
        } else {
            uint16_t *p = (uint16_t *)dst + r * h;
            for (size_t e = 0; e < h; e++) p[e] = kvs_f32_to_f16(in[e] + mean[e]);
        }
    }
}

/* Round to nearest, ties to even (the rounding mode's, as lrintf), clamped
 * to +-Q_MAX, NaN -> 0. Adding and subtracting 1.5 x 2^23 rounds any float
 * of magnitude below 2^22 to an integer exactly; written without branches
 * or a library call so the loop over a whole slice vectorizes. */
#define ROUND_MAGIC 12582912.0f

static int32_t quantize(float c)
{
    float v = c == c ? c : 0.0f;
    v = v > (float)Q_MAX ? (float)Q_MAX : v;
    v = v < -(float)Q_MAX ? -(float)Q_MAX : v;
    return (int32_t)((v + ROUND_MAGIC) - ROUND_MAGIC);
}

/* q = quantize(c) for T rows of h, and per component whether any value is
 * nonzero (the OR) and the sum of the squares, summed in token order as
 * the classes always were: one pass, so neither needs another over q. */
CLONES_V4 static void quantize_rows(const float *c, size_t T, size_t h, int32_t *q,
                                 int32_t *nonzero, double *sum_sq)
{
    for (size_t k = 0; k < h; k++) nonzero[k] = 0, sum_sq[k] = 0;
    for (size_t r = 0; r < T; r++)
        for (size_t k = 0; k < h; k++) {
            int32_t v = quantize(c[r * h + k]);
            q[r * h + k] = v;
            nonzero[k] |= v;
            sum_sq[k] += (double)v * v;
        }
}

/* ---- encode: the streams (K or V of one layer) split across workers ----
 * Each stream is coded into its own slot of the output (a stream's most:
 * its classes and T x kept raw i16), so workers never share a byte; the
 * slots are then closed up in stream order. The bytes do not depend on the
 * split. */

typedef struct enc_job {
    const transform_stage *s;
    const kvs_blas *blas;
    const void *src;
    kvs_dtype dtype;
    size_t T;
    uint8_t *out;
    size_t slots; /* offset of stream 0's slot: the end of the stream table */
    size_t slot;  /* bytes per slot */
} enc_job;

/* A worker's scratch for one stream at a time. */
typedef struct enc_scratch {
    float *a, *c;     /* T x hidden: the rows as float (sgemm path), the coefficients */
    int32_t *q;       /* T x hidden: the quantized coefficients */
    uint8_t *cls;     /* hidden: the context classes */
    int32_t *nonzero; /* hidden: the OR of each component's values */
    double *sum_sq;   /* hidden: the sum of each component's squares */
} enc_scratch;

/* Stream i into its record and its slot. */
static void encode_stream(const enc_job *j, size_t i, const enc_scratch *w)
{
    float *a = w->a, *c = w->c;
    int32_t *q = w->q, *nonzero = w->nonzero;
    uint8_t *cls = w->cls;
    double *sum_sq = w->sum_sq;
    const kvs_transform *t = j->s->t;
    size_t h = t->hidden, T = j->T, rows = T * h;
    int kv = (int)(i / t->layers);
    uint32_t l = (uint32_t)(i % t->layers);
    uint8_t *rec = j->out + PAYLOAD_HEADER + i * RECORD_SIZE, *dst = j->out + j->slots + i * j->slot;
    float delta = layer_step(t, kv, l, j->s->step[kv]);
    /* bfloat16 rows go to the AMX products as they are (basis_products.h);
     * float16 and float32 rows, or a CPU without AMX, take sgemm */
    if (j->dtype != KVS_DTYPE_BFLOAT16 ||
        !kvs_basis_forward(t, kv, l, (const uint16_t *)j->src + i * rows, T, 1.0f / delta, c)) {
        load_rows(j->src, j->dtype, i * rows, rows, a);
        const float *mean = t->mean[kv] + (size_t)l * h;
        for (size_t r = 0; r < T; r++)
            for (size_t e = 0; e < h; e++) a[r * h + e] -= mean[e];
        j->blas->sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)T, (int)h, (int)h,
                       1.0f / delta, a, (int)h, t->basis[kv] + (size_t)l * h * h, (int)h, 0.0f,
                       c, (int)h);
    }
    quantize_rows(c, T, h, q, nonzero, sum_sq);
    /* Components are kept up to the last one with a nonzero value: the
     * trailing ones cost neither bits nor decode time. */
    uint32_t kept = (uint32_t)h;
    while (kept > 0 && nonzero[kept - 1] == 0) kept--;
    /* rows of kept values, in place (row r moves down, never up) */
    for (size_t r = 1; r < T && kept < h; r++)
        memmove(q + r * kept, q + r * h, kept * sizeof(int32_t));
    size_t nq = T * kept, written = 0;
    int mode = MODE_CODED;
    if (kept) {
        for (size_t k = 0; k < kept; k++) cls[k] = component_class(sum_sq[k], T);
        /* a coded stream holds its classes; a raw one has them as bytes in
         * front (unused: version 1's layout) */
        if (kvs_coef_rans_encode(q, T, kept, cls, dst, nq * 2 + kept, &written) != KVS_OK) {
            mode = MODE_RAW; /* the coder would not save anything (or had no memory) */
            memcpy(dst, cls, kept);
            for (size_t e = 0; e < nq; e++) put_le16(dst + kept + 2 * e, (uint16_t)q[e]);
            written = nq * 2 + kept;
        }
    }
    put_le16(rec, (uint16_t)kept);
    rec[2] = (uint8_t)mode;
    rec[3] = 0;
    put_le32(rec + 4, (uint32_t)written);
}

/* Streams [begin, end) / KVS_SPLIT_ALIGN (kvs_serde_parallel_for). */
static int encode_range(void *ctx, uint64_t begin, uint64_t end)
{
    const enc_job *j = ctx;
    size_t h = j->s->t->hidden, rows = j->T * h;
    enc_scratch w = {malloc(rows * sizeof(float)), malloc(rows * sizeof(float)),
                     malloc(rows * sizeof(int32_t)), malloc(h), malloc(h * sizeof(int32_t)),
                     malloc(h * sizeof(double))};
    int rc = KVS_OK;
    if (!w.a || !w.c || !w.q || !w.cls || !w.nonzero || !w.sum_sq)
        rc = kvs_set_error(KVS_ENOMEM, "transform: out of memory for %zu x %zu coefficients",
                           j->T, h);
    for (uint64_t i = begin / KVS_SPLIT_ALIGN; rc == KVS_OK && i < end / KVS_SPLIT_ALIGN; i++)
        encode_stream(j, (size_t)i, &w);
    free(w.a), free(w.c), free(w.q), free(w.cls), free(w.nonzero), free(w.sum_sq);
    return rc;
}

static int transform_encode(const kvs_stage *self, const kvs_memobj *src, uint8_t *out,
                            size_t cap, size_t *n)
{
    const transform_stage *s = KVS_CONTAINER_OF(self, const transform_stage, base);
    const kvs_transform *t = s->t;
    uint64_t tokens = 0; /* set by check_layout (-O3 cannot tell) */
    const kvs_blas *blas = NULL;
    int rc = check_layout(t, &src->layout, "the source", &tokens);
    if (rc == KVS_OK) rc = kvs_blas_get("transform", &blas);
    if (rc) return rc;
    size_t need = payload_bound(t, tokens);
    if (cap < need)
        return kvs_set_error(KVS_ENOSPC, "transform: destination too small: %zu bytes, need %zu",
                             cap, need);
    size_t nstreams = (size_t)2 * t->layers;
    out[0] = PAYLOAD_VERSION;
    out[1] = out[2] = out[3] = 0;
    put_le32(out + 4, t->layers);
    put_le32(out + 8, (uint32_t)tokens);
    put_le32(out + 12, t->hidden);
    enc_job job = {s,
                   blas,
                   src->data,
                   src->layout.groups[0].dtype,
                   (size_t)tokens,
                   out,
                   PAYLOAD_HEADER + nstreams * RECORD_SIZE,
                   (size_t)tokens * t->hidden * 2 + t->hidden};
    rc = kvs_serde_parallel_for(nstreams * KVS_SPLIT_ALIGN,
                                (size_t)kvs_layout_nbytes(&src->layout), encode_range, &job);
    if (rc) return rc;
    /* Close up the slots: stream i moves down to its final offset. */
    size_t pos = job.slots;
    for (size_t i = 0; i < nstreams; i++) {
        uint32_t bytes = get_le32(out + PAYLOAD_HEADER + i * RECORD_SIZE + 4);
        memmove(out + pos, out + job.slots + i * job.slot, bytes);
        pos += bytes;
    }
    *n = pos;
    return KVS_OK;
}

/* ---- decode: every stream checked, then decoded, then rebuilt ----------
 * Both passes split the streams across workers; nothing of the destination
 * is written until every stream has decoded. */

typedef struct dec_job {
    const kvs_transform *t;
    const kvs_blas *blas;
    const uint8_t *in;
    int version;
    float step[2];
    size_t T;
    const size_t *pos;  /* stream i's first byte in the payload */
    const size_t *cpos; /* its first coefficient in coef */
    float *coef;
    kvs_dtype dtype;
    void *dst;
} dec_job;

/* Pass 1: streams [begin, end) / KVS_SPLIT_ALIGN into their coefficients
 * (the only step that can still fail). */
static int decode_range(void *ctx, uint64_t begin, uint64_t end)
{
    const dec_job *j = ctx;
    int rc = KVS_OK;
    for (uint64_t s = begin / KVS_SPLIT_ALIGN; rc == KVS_OK && s < end / KVS_SPLIT_ALIGN; s++) {
        size_t i = (size_t)s, pos = j->pos[i];
        const uint8_t *rec = j->in + PAYLOAD_HEADER + i * RECORD_SIZE;
        uint32_t kept = get_le16(rec), bytes = get_le32(rec + 4);
        int kv = (int)(i / j->t->layers);
        uint32_t l = (uint32_t)(i % j->t->layers);
        float *coef = j->coef + j->cpos[i];
        char what[64];
        snprintf(what, sizeof what, "transform: %s layer %u", kv_name[kv], l);
        if (kept && rec[2] == MODE_CODED && j->version == PAYLOAD_VERSION) {
            uint8_t cls[KVS_TRANSFORM_MAX_HIDDEN];
            rc = kvs_coef_rans_decode(j->in + pos, bytes, j->T, kept, cls, coef, what);
            continue;
        }
        int classes = j->version == PAYLOAD_VERSION ? KVS_COEF_RANS_CLASSES : KVS_COEF_CLASSES;
        for (uint32_t k = 0; k < kept && rc == KVS_OK; k++)
            if (j->in[pos + k] >= classes)
                rc = kvs_set_error(KVS_ECORRUPT,
                                   "transform: payload damaged: %s layer %u component %u has "
                                   "context class %u, at most %d",
                                   kv_name[kv], l, k, j->in[pos + k], classes - 1);
        if (rc == KVS_OK && kept && rec[2] == MODE_CODED) {
            rc = kvs_coef_decode(j->in + pos + kept, bytes - kept, j->T, kept, j->in + pos, coef,
                                 what);
        } else if (rc == KVS_OK) {
            for (size_t e = 0; e < j->T * kept; e++)
                coef[e] = (float)(int16_t)get_le16(j->in + pos + kept + 2 * e);
        }
    }
    return rc;
}

/* Pass 2: streams [begin, end) / KVS_SPLIT_ALIGN, the basis product into
 * the destination. */
static int rebuild_range(void *ctx, uint64_t begin, uint64_t end)
{
    const dec_job *j = ctx;
    const kvs_transform *t = j->t;
    size_t h = t->hidden, T = j->T, es = kvs_dtype_size(j->dtype);
    float *x = malloc(T * h * sizeof(float));
    if (x == NULL)
        return kvs_set_error(KVS_ENOMEM, "transform: out of memory for %zu x %zu values", T, h);
    for (uint64_t s = begin / KVS_SPLIT_ALIGN; s < end / KVS_SPLIT_ALIGN; s++) {
        size_t i = (size_t)s;
        uint32_t kept = get_le16(j->in + PAYLOAD_HEADER + i * RECORD_SIZE);
        int kv = (int)(i / t->layers);
        uint32_t l = (uint32_t)(i % t->layers);
        const float *mean = t->mean[kv] + (size_t)l * h;
        float delta = layer_step(t, kv, l, j->step[kv]);
        if (kept && !kvs_basis_inverse(t, kv, l, j->coef + j->cpos[i], T, kept, delta, x))
            j->blas->sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)T, (int)h, (int)kept,
                           delta, j->coef + j->cpos[i], (int)kept,
                           t->basis[kv] + (size_t)l * h * h, (int)h, 0.0f, x, (int)h);
        else if (!kept)
            memset(x, 0, T * h * sizeof(float));
        store_rows_mean(x, T, h, mean, j->dtype, (char *)j->dst + i * T * h * es);
    }
    free(x);
    return KVS_OK;
}

static int transform_decode(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                            const uint8_t *in, size_t n, kvs_memobj *dst)
{
    (void)nparams; /* checked by transform_check_params */
    uint64_t fp = get_le64(params);
    const kvs_transform *t = ctx ? ctx->transform : NULL;
    if (t == NULL)
        return kvs_set_error(KVS_EKEY,
                             "transform: blob was encoded with transform %016llx; this reader "
                             "has no transform configured (a pipeline stage {\"type\": "
                             "\"transform\", \"path\": ...} with that file)",
                             (unsigned long long)fp);
    if (t->fingerprint != fp)
        return kvs_set_error(KVS_EKEY,
                             "transform: blob was encoded with transform %016llx, this reader "
                             "has transform %016llx",
                             (unsigned long long)fp, (unsigned long long)t->fingerprint);
    float step[2] = {get_le_float(params + 8), get_le_float(params + 12)};
    uint64_t tokens = 0; /* set by check_layout (-O3 cannot tell) */
    const kvs_blas *blas = NULL;
    int rc = check_layout(t, &dst->layout, "the destination", &tokens);
    if (rc == KVS_OK) rc = kvs_blas_get("transform", &blas);
    if (rc) return rc;
    if (dst->capacity < kvs_layout_nbytes(&dst->layout))
        return kvs_set_error(KVS_ENOSPC, "transform: destination holds %zu bytes, need %llu",
                             dst->capacity, (unsigned long long)kvs_layout_nbytes(&dst->layout));
    size_t h = t->hidden, T = (size_t)tokens, nstreams = (size_t)2 * t->layers;
    size_t table = PAYLOAD_HEADER + nstreams * RECORD_SIZE;
    if (n < table)
        return kvs_set_error(KVS_ECORRUPT,
                             "transform: payload damaged: %zu bytes, shorter than its %zu-byte "
                             "header and stream table",
                             n, table);
    if ((in[0] != PAYLOAD_VERSION && in[0] != PAYLOAD_VERSION_RANGE) || in[1] || in[2] || in[3])
        return kvs_set_error(KVS_ECORRUPT,
                             "transform: payload damaged: version %u (expected %d or %d) or "
                             "nonzero reserved bytes",
                             in[0], PAYLOAD_VERSION_RANGE, PAYLOAD_VERSION);
    if (get_le32(in + 4) != t->layers || get_le32(in + 8) != T || get_le32(in + 12) != h)
        return kvs_set_error(KVS_ECORRUPT,
                             "transform: payload damaged: it says %u layers x %u tokens x hidden "
                             "%u, the layout %u x %zu x %zu",
                             get_le32(in + 4), get_le32(in + 8), get_le32(in + 12), t->layers, T, h);
    /* Every record checked, and the streams must account for the payload
     * exactly, before anything is decoded. */
    size_t *pos = malloc(2 * nstreams * sizeof(size_t)), *cpos = pos + nstreams;
    if (pos == NULL) return kvs_set_error(KVS_ENOMEM, "transform: out of memory");
    size_t total = table, coefs = 0;
    for (size_t i = 0; i < nstreams && rc == KVS_OK; i++) {
        const uint8_t *rec = in + PAYLOAD_HEADER + i * RECORD_SIZE;
        uint32_t kept = get_le16(rec), bytes = get_le32(rec + 4);
        const char *who = kv_name[i / t->layers];
        unsigned layer = (unsigned)(i % t->layers);
        if (kept > h || rec[2] > MODE_RAW || rec[3] != 0)
            rc = kvs_set_error(KVS_ECORRUPT,
                               "transform: payload damaged: %s layer %u keeps %u components "
                               "(hidden %zu), mode %u, reserved %u",
                               who, layer, kept, h, rec[2], rec[3]);
        else if (rec[2] == MODE_RAW && (uint64_t)bytes != (uint64_t)T * kept * 2 + kept)
            rc = kvs_set_error(KVS_ECORRUPT,
                               "transform: payload damaged: %s layer %u raw stream is %u bytes, "
                               "%zu x %u coefficients and their classes need %llu",
                               who, layer, bytes, T, kept,
                               (unsigned long long)T * kept * 2 + kept);
        else if (bytes < kept && (rec[2] == MODE_RAW || in[0] == PAYLOAD_VERSION_RANGE))
            rc = kvs_set_error(KVS_ECORRUPT,
                               "transform: payload damaged: %s layer %u stream is %u bytes, "
                               "shorter than its %u class bytes",
                               who, layer, bytes, kept);
        else if (kept == 0 && bytes != 0)
            rc = kvs_set_error(KVS_ECORRUPT,
                               "transform: payload damaged: %s layer %u keeps no component but "
                               "has %u stream bytes",
                               who, layer, bytes);
        else if (bytes > n - total)
            rc = kvs_set_error(KVS_ECORRUPT,
                               "transform: payload damaged: %s layer %u stream of %u bytes "
                               "runs past the %zu-byte payload",
                               who, layer, bytes, n);
        if (rc) break;
        pos[i] = total;
        cpos[i] = coefs;
        total += bytes;
        coefs += T * kept;
    }
    if (rc == KVS_OK && total != n)
        rc = kvs_set_error(KVS_ECORRUPT,
                           "transform: payload damaged: its streams account for %zu of its %zu "
                           "bytes",
                           total, n);
    float *coef = rc ? NULL : malloc((coefs ? coefs : 1) * sizeof(float));
    if (rc == KVS_OK && coef == NULL)
        rc = kvs_set_error(KVS_ENOMEM, "transform: out of memory decoding %zu coefficients",
                           coefs);
    dec_job job = {t, blas, in, in[0], {step[0], step[1]}, T, pos, cpos, coef,
                   dst->layout.groups[0].dtype, dst->data};
    size_t nbytes = (size_t)kvs_layout_nbytes(&dst->layout);
    if (rc == KVS_OK)
        rc = kvs_serde_parallel_for(nstreams * KVS_SPLIT_ALIGN, nbytes, decode_range, &job);
    if (rc == KVS_OK)
        rc = kvs_serde_parallel_for(nstreams * KVS_SPLIT_ALIGN, nbytes, rebuild_range, &job);
    free(coef);
    free(pos);
    return rc;
}

static size_t transform_params_size(const kvs_stage *self)
{
    (void)self;
    return PARAMS_SIZE;
}

static int transform_write_params(const kvs_stage *self, uint8_t *params)
{
    const transform_stage *s = KVS_CONTAINER_OF(self, const transform_stage, base);
    put_le64(params, s->t->fingerprint);
    put_le_float(params + 8, s->step[0]);
    put_le_float(params + 12, s->step[1]);
    memset(params + 16, 0, 4);
    return KVS_OK;
}

static int transform_check_params(const uint8_t *params, size_t nparams)
{
    if (nparams != PARAMS_SIZE)
        return kvs_set_error(KVS_ECORRUPT,
                             "transform: %zu parameter bytes in the frame, expected %d", nparams,
                             PARAMS_SIZE);
    for (int kv = 0; kv < 2; kv++) {
        float st = get_le_float(params + 8 + 4 * kv);
        if (!(st >= (float)STEP_MIN && st <= (float)STEP_MAX))
            return kvs_set_error(KVS_ECORRUPT,
                                 "transform: frame names a %s step of %g, expected %g to %g",
                                 kv_name[kv], (double)st, STEP_MIN, STEP_MAX);
    }
    if (params[16] | params[17] | params[18] | params[19])
        return kvs_set_error(KVS_ECORRUPT, "transform: frame's reserved parameter bytes are not 0");
    return KVS_OK;
}

static json_t *transform_describe(const uint8_t *params, size_t nparams)
{
    (void)nparams;
    uint64_t fp = get_le64(params);
    float ks = get_le_float(params + 8), vs = get_le_float(params + 12);
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)fp);
    return json_pack("{s:s,s:f,s:f}", "fingerprint", hex, "k_step", (double)ks, "v_step",
                     (double)vs);
}

static void transform_destroy(kvs_stage *self)
{
    transform_stage *s = KVS_CONTAINER_OF(self, transform_stage, base);
    kvs_transform_free(s->t);
    free(s);
}

int kvs_transform_from_config(const json_t *stages, kvs_transform **out)
{
    *out = NULL;
    const json_t *first = json_array_get(stages, 0); /* NULL for a non-array */
    const json_t *type = json_object_get(first, "type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "transform") != 0)
        return KVS_OK;
    const char *path = json_string_value(json_object_get(first, "path"));
    if (path == NULL) return KVS_OK; /* the serializer's creation refuses it */
    return kvs_transform_load(path, out);
}

const kvs_stage_type kvs_stage_transform_type = {
    .name = "transform",
    .id = KVS_STAGE_TRANSFORM_CODED,
    .kind = KVS_STAGE_TYPED,
    .create = transform_create,
    .typed_bound = transform_bound,
    .typed_encode = transform_encode,
    .typed_decode = transform_decode,
    .params_size = transform_params_size,
    .write_params = transform_write_params,
    .check_params = transform_check_params,
    .describe_params = transform_describe,
    .destroy = transform_destroy,
};
