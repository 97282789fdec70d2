/* transform.c - the calibrated transform (transform.h): its file, its
 * fingerprint, and the calibration that estimates it. The file is read
 * with a reader of its own that accepts exactly the six F32 tensors of
 * transform.h (the tool's general safetensors reader is not part of the
 * library); its writer is the tool's (`kvserde calibrate`). */
#include "codecs/transform.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "codecs/basis_products.h"
#include "codecs/blas.h"
#include "kvserde/error.h"

const char *const kvs_transform_tensor_names[KVS_TRANSFORM_NTENSORS] = {
    "k.mean", "k.basis", "k.var", "v.mean", "v.basis", "v.var"};

/* The sizes a transform may have (`who` names the caller in the message). */
static int check_dims(const char *who, uint32_t layers, uint32_t hidden)
{
    if (layers == 0 || layers > KVS_TRANSFORM_MAX_LAYERS || hidden == 0 ||
        hidden > KVS_TRANSFORM_MAX_HIDDEN)
        return kvs_set_error(KVS_EINVAL,
                             "%s: %u layers x hidden %u; 1 to %d layers, hidden 1 to %d",
                             who, layers, hidden, KVS_TRANSFORM_MAX_LAYERS,
                             KVS_TRANSFORM_MAX_HIDDEN);
    return KVS_OK;
}

int kvs_transform_alloc(uint32_t layers, uint32_t hidden, kvs_transform **out)
{
    int rc = check_dims("transform", layers, hidden);
    if (rc) return rc;
    kvs_transform *t = calloc(1, sizeof *t);
    if (t == NULL) return kvs_set_error(KVS_ENOMEM, "transform: out of memory");
    t->layers = layers;
    t->hidden = hidden;
    size_t lh = (size_t)layers * hidden;
    int ok = 1;
    for (int kv = 0; kv < 2; kv++) {
        t->mean[kv] = calloc(lh, sizeof(float));
        t->var[kv] = calloc(lh, sizeof(float));
        t->basis[kv] = calloc(lh * hidden, sizeof(float));
        t->rms[kv] = calloc(layers, sizeof(float));
        ok = ok && t->mean[kv] && t->var[kv] && t->basis[kv] && t->rms[kv];
    }
    if (!ok) {
        kvs_transform_free(t);
        return kvs_set_error(KVS_ENOMEM, "transform: out of memory for %u layers x hidden %u",
                             layers, hidden);
    }
    *out = t;
    return KVS_OK;
}

void kvs_transform_free(kvs_transform *t)
{
    if (t == NULL) return;
    for (int kv = 0; kv < 2; kv++) {
        free(t->mean[kv]);
        free(t->var[kv]);
        free(t->basis[kv]);
        free(t->rms[kv]);
    }
    kvs_basis_packed_free(t->packed);
    free(t);
}

const float *kvs_transform_tensor(const kvs_transform *t, int i, uint64_t *numel)
{
    uint64_t lh = (uint64_t)t->layers * t->hidden;
    int kv = i / 3;
    switch (i % 3) {
    case 0: *numel = lh; return t->mean[kv];
    case 1: *numel = lh * t->hidden; return t->basis[kv];
    default: *numel = lh; return t->var[kv];
    }
}

void kvs_transform_finish(kvs_transform *t)
{
    for (int kv = 0; kv < 2; kv++)
        for (uint32_t l = 0; l < t->layers; l++) {
            double s = 0;
            for (uint32_t j = 0; j < t->hidden; j++) s += t->var[kv][(size_t)l * t->hidden + j];
            float r = (float)sqrt(s / t->hidden);
            /* a layer without spread still gets a usable unit */
            t->rms[kv][l] = r > 1e-30f ? r : 1.0f;
        }
    kvs_basis_packed_free(t->packed);
    t->packed = kvs_basis_pack(t);
    XXH3_state_t *st = XXH3_createState();
    static const char tag[] = "kvserde-transform-v1";
    uint8_t dims[8];
    for (int b = 0; b < 4; b++) {
        dims[b] = (uint8_t)(t->layers >> 8 * b);
        dims[4 + b] = (uint8_t)(t->hidden >> 8 * b);
    }
    if (st == NULL) { /* cannot happen in practice; a one-shot hash is enough */
        t->fingerprint = 0;
        return;
    }
    XXH3_64bits_reset(st);
    XXH3_64bits_update(st, tag, sizeof tag);
    XXH3_64bits_update(st, dims, sizeof dims);
    for (int i = 0; i < KVS_TRANSFORM_NTENSORS; i++) {
        uint64_t n;
        const float *a = kvs_transform_tensor(t, i, &n);
        XXH3_64bits_update(st, a, (size_t)n * sizeof(float));
    }
    t->fingerprint = XXH3_64bits_digest(st);
    XXH3_freeState(st);
}

/* ---- the file ----------------------------------------------------------- */

static int read_file(const char *path, uint8_t **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return kvs_set_error(KVS_EIO, "transform: cannot open '%s': %s", path, strerror(errno));
    int rc = KVS_OK;
    long size = -1;
    if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0)
        rc = kvs_set_error(KVS_EIO, "transform: cannot read '%s': %s", path, strerror(errno));
    else if ((uint64_t)size > KVS_TRANSFORM_FILE_MAX)
        rc = kvs_set_error(KVS_ECORRUPT, "transform: '%s' is %ld bytes, at most %llu", path,
                           size, (unsigned long long)KVS_TRANSFORM_FILE_MAX);
    uint8_t *b = rc ? NULL : malloc((size_t)size + 1);
    if (rc == KVS_OK && b == NULL)
        rc = kvs_set_error(KVS_ENOMEM, "transform: out of memory reading '%s'", path);
    if (rc == KVS_OK && fread(b, 1, (size_t)size, f) != (size_t)size)
        rc = kvs_set_error(KVS_EIO, "transform: cannot read '%s'", path);
    fclose(f);
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = (size_t)size;
    return KVS_OK;
}

/* One tensor's entry in the header: F32, the expected shape, within the
 * data section; copies its bytes into dst. */
static int take_tensor(const json_t *hdr, const char *path, const char *name,
                       const uint64_t *shape, unsigned ndim, const uint8_t *data,
                       uint64_t data_len, float *dst)
{
    const json_t *e = json_object_get(hdr, name);
    if (!json_is_object(e))
        return kvs_set_error(KVS_ECORRUPT, "transform: '%s' has no tensor '%s'", path, name);
    const char *dtype = json_string_value(json_object_get(e, "dtype"));
    if (dtype == NULL || strcmp(dtype, "F32") != 0)
        return kvs_set_error(KVS_ECORRUPT, "transform: '%s': tensor '%s' is %s, expected F32",
                             path, name, dtype ? dtype : "without a dtype");
    const json_t *sh = json_object_get(e, "shape");
    int shape_ok = json_is_array(sh) && json_array_size(sh) == ndim;
    for (unsigned d = 0; shape_ok && d < ndim; d++) {
        const json_t *v = json_array_get(sh, d);
        shape_ok = json_is_integer(v) && json_integer_value(v) >= 0 &&
                   (uint64_t)json_integer_value(v) == shape[d];
    }
    if (!shape_ok)
        return kvs_set_error(KVS_ECORRUPT,
                             "transform: '%s': tensor '%s' does not have the shape [%llu, %llu%s] "
                             "that k.mean gives",
                             path, name, (unsigned long long)shape[0],
                             (unsigned long long)shape[1], ndim == 3 ? ", hidden" : "");
    uint64_t numel = 1;
    for (unsigned d = 0; d < ndim; d++) numel *= shape[d]; /* capped dims: no overflow */
    const json_t *off = json_object_get(e, "data_offsets");
    const json_t *b = json_array_get(off, 0), *en = json_array_get(off, 1);
    if (!json_is_array(off) || json_array_size(off) != 2 || !json_is_integer(b) ||
        !json_is_integer(en) || json_integer_value(b) < 0 ||
        json_integer_value(en) < json_integer_value(b) ||
        (uint64_t)json_integer_value(en) > data_len ||
        (uint64_t)(json_integer_value(en) - json_integer_value(b)) != numel * 4)
        return kvs_set_error(KVS_ECORRUPT,
                             "transform: '%s': tensor '%s': data_offsets do not span %llu bytes "
                             "inside the %llu-byte data section",
                             path, name, (unsigned long long)(numel * 4),
                             (unsigned long long)data_len);
    memcpy(dst, data + json_integer_value(b), (size_t)numel * 4);
    return KVS_OK;
}

static int parse_file(const char *path, const uint8_t *buf, size_t len, kvs_transform **out)
{
    if (len < 8)
        return kvs_set_error(KVS_ECORRUPT, "transform: '%s' is %zu bytes, not a safetensors file",
                             path, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | buf[i];
    if (n > len - 8)
        return kvs_set_error(KVS_ECORRUPT,
                             "transform: '%s': header of %llu bytes in a %zu-byte file", path,
                             (unsigned long long)n, len);
    json_error_t jerr;
    json_t *hdr = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!json_is_object(hdr)) {
        json_decref(hdr);
        return kvs_set_error(KVS_ECORRUPT, "transform: '%s': header is not a JSON object: %s",
                             path, jerr.text);
    }
    int rc = KVS_OK;
    const json_t *meta = json_object_get(hdr, "__metadata__");
    const char *version = json_string_value(json_object_get(meta, "kvserde.transform"));
    const char *fp_text = json_string_value(json_object_get(meta, "kvserde.transform.fingerprint"));
    const json_t *km = json_object_get(json_object_get(hdr, "k.mean"), "shape");
    const json_t *l0 = json_array_get(km, 0), *h0 = json_array_get(km, 1);
    if (version == NULL || strcmp(version, "1") != 0)
        rc = kvs_set_error(KVS_ECORRUPT,
                           "transform: '%s' is not a kvserde transform file (metadata "
                           "kvserde.transform is %s%s%s, expected \"1\"; see `kvserde calibrate`)",
                           path, version ? "\"" : "missing", version ? version : "",
                           version ? "\"" : "");
    else if (!json_is_array(km) || json_array_size(km) != 2 || !json_is_integer(l0) ||
             !json_is_integer(h0) || json_integer_value(l0) < 1 ||
             json_integer_value(l0) > KVS_TRANSFORM_MAX_LAYERS || json_integer_value(h0) < 1 ||
             json_integer_value(h0) > KVS_TRANSFORM_MAX_HIDDEN)
        rc = kvs_set_error(KVS_ECORRUPT,
                           "transform: '%s': tensor k.mean must be [layers, hidden] with 1 to %d "
                           "layers and hidden 1 to %d",
                           path, KVS_TRANSFORM_MAX_LAYERS, KVS_TRANSFORM_MAX_HIDDEN);
    kvs_transform *t = NULL;
    if (rc == KVS_OK)
        rc = kvs_transform_alloc((uint32_t)json_integer_value(l0),
                                 (uint32_t)json_integer_value(h0), &t);
    for (int i = 0; rc == KVS_OK && i < KVS_TRANSFORM_NTENSORS; i++) {
        uint64_t shape[3] = {t->layers, t->hidden, t->hidden}, numel;
        float *dst = (float *)kvs_transform_tensor(t, i, &numel);
        rc = take_tensor(hdr, path, kvs_transform_tensor_names[i], shape, i % 3 == 1 ? 3 : 2,
                         buf + 8 + n, len - 8 - n, dst);
    }
    if (rc == KVS_OK) {
        kvs_transform_finish(t);
        char want[17];
        snprintf(want, sizeof want, "%016llx", (unsigned long long)t->fingerprint);
        if (fp_text == NULL || strcmp(fp_text, want) != 0)
            rc = kvs_set_error(KVS_ECORRUPT,
                               "transform: '%s' damaged: its numbers have fingerprint %s, its "
                               "metadata kvserde.transform.fingerprint says %s",
                               path, want, fp_text ? fp_text : "nothing");
    }
    json_decref(hdr);
    if (rc) {
        kvs_transform_free(t);
        return rc;
    }
    *out = t;
    return KVS_OK;
}

int kvs_transform_load(const char *path, kvs_transform **out)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc = read_file(path, &buf, &len);
    if (rc) return rc;
    rc = parse_file(path, buf, len, out);
    free(buf);
    return rc;
}

/* ---- calibration -------------------------------------------------------- */

struct kvs_calibration {
    uint32_t layers, hidden;
    uint64_t chunks, tokens;
    double *sum[2]; /* layers x hidden */
    double *sq[2];  /* layers x hidden x hidden: sum of x x^T (upper triangle) */
    double *rows;   /* tokens-block scratch, converted to double */
    const kvs_blas *blas;
};

#define CAL_BLOCK 256 /* rows converted and accumulated at a time */

void kvs_calibration_free(kvs_calibration *c)
{
    if (c == NULL) return;
    for (int kv = 0; kv < 2; kv++) {
        free(c->sum[kv]);
        free(c->sq[kv]);
    }
    free(c->rows);
    free(c);
}

int kvs_calibration_new(uint32_t layers, uint32_t hidden, kvs_calibration **out)
{
    const kvs_blas *blas;
    int rc = check_dims("calibrate", layers, hidden);
    if (rc == KVS_OK) rc = kvs_blas_get("calibrate", &blas);
    if (rc) return rc;
    kvs_calibration *c = calloc(1, sizeof *c);
    if (c == NULL) return kvs_set_error(KVS_ENOMEM, "calibrate: out of memory");
    c->layers = layers;
    c->hidden = hidden;
    c->blas = blas;
    size_t lh = (size_t)layers * hidden;
    int ok = 1;
    for (int kv = 0; kv < 2; kv++) {
        c->sum[kv] = calloc(lh, sizeof(double));
        c->sq[kv] = calloc(lh * hidden, sizeof(double));
        ok = ok && c->sum[kv] && c->sq[kv];
    }
    c->rows = malloc((size_t)CAL_BLOCK * hidden * sizeof(double));
    if (!ok || c->rows == NULL) {
        kvs_calibration_free(c);
        return kvs_set_error(KVS_ENOMEM, "calibrate: out of memory for %u layers x hidden %u",
                             layers, hidden);
    }
    *out = c;
    return KVS_OK;
}

int kvs_calibration_add(kvs_calibration *c, const float *kv, uint64_t tokens)
{
    size_t h = c->hidden;
    for (int k = 0; k < 2; k++)
        for (uint32_t l = 0; l < c->layers; l++) {
            const float *x = kv + ((size_t)k * c->layers + l) * tokens * h;
            double *sum = c->sum[k] + (size_t)l * h, *sq = c->sq[k] + (size_t)l * h * h;
            for (uint64_t t0 = 0; t0 < tokens; t0 += CAL_BLOCK) {
                size_t nb = tokens - t0 < CAL_BLOCK ? (size_t)(tokens - t0) : CAL_BLOCK;
                for (size_t r = 0; r < nb * h; r++) {
                    double v = x[t0 * h + r];
                    if (!isfinite(v))
                        return kvs_set_error(KVS_EINVAL,
                                             "calibrate: %s layer %u token %llu holds a value "
                                             "that is not finite",
                                             k ? "V" : "K", l,
                                             (unsigned long long)(t0 + r / h));
                    c->rows[r] = v;
                    sum[r % h] += v;
                }
                /* sq += rows^T rows (upper triangle, row-major) */
                c->blas->dsyrk(CblasRowMajor, CblasUpper, CblasTrans, (int)h, (int)nb, 1.0,
                               c->rows, (int)h, 1.0, sq, (int)h);
            }
        }
    c->chunks++;
    c->tokens += tokens;
    return KVS_OK;
}

uint64_t kvs_calibration_chunks(const kvs_calibration *c) { return c->chunks; }
uint64_t kvs_calibration_tokens(const kvs_calibration *c) { return c->tokens; }

int kvs_calibration_result(kvs_calibration *c, kvs_transform **out)
{
    if (c->tokens < 2)
        return kvs_set_error(KVS_EINVAL, "calibrate: %llu tokens; need at least 2",
                             (unsigned long long)c->tokens);
    kvs_transform *t;
    int rc = kvs_transform_alloc(c->layers, c->hidden, &t);
    if (rc) return rc;
    int n = (int)c->hidden, info = 0, lwork = 1 + 6 * n + 2 * n * n, liwork = 3 + 5 * n;
    size_t h = c->hidden;
    double *a = malloc(h * h * sizeof(double)), *w = malloc(h * sizeof(double));
    double *work = malloc((size_t)lwork * sizeof(double));
    int *iwork = malloc((size_t)liwork * sizeof(int));
    if (a == NULL || w == NULL || work == NULL || iwork == NULL)
        rc = kvs_set_error(KVS_ENOMEM, "calibrate: out of memory for the eigendecomposition");
    double cnt = (double)c->tokens;
    for (int kv = 0; kv < 2 && rc == KVS_OK; kv++)
        for (uint32_t l = 0; l < c->layers && rc == KVS_OK; l++) {
            const double *sum = c->sum[kv] + l * h, *sq = c->sq[kv] + l * h * h;
            /* covariance, full symmetric (sq holds the upper triangle) */
            for (size_t i = 0; i < h; i++)
                for (size_t j = i; j < h; j++) {
                    double v = (sq[i * h + j] - sum[i] * sum[j] / cnt) / (cnt - 1);
                    a[i * h + j] = a[j * h + i] = v;
                }
            /* Row-major symmetric = column-major symmetric: eigenvectors
             * come back as columns in column-major, i.e. rows of a here. */
            /* LAPACK's symmetric eigensolver (divide and conquer) */
            c->blas->dsyevd("V", "U", &n, a, &n, w, work, &lwork, iwork, &liwork, &info);
            if (info != 0) {
                rc = kvs_set_error(KVS_EINVAL,
                                   "calibrate: %s layer %u: the eigendecomposition did not "
                                   "converge (LAPACK dsyevd info %d)",
                                   kv ? "V" : "K", l, info);
                break;
            }
            float *mean = t->mean[kv] + l * h, *var = t->var[kv] + l * h;
            float *basis = t->basis[kv] + l * h * h;
            for (size_t i = 0; i < h; i++) mean[i] = (float)(sum[i] / cnt);
            for (size_t j = 0; j < h; j++) {
                size_t src = h - 1 - j; /* ascending -> descending */
                const double *vec = a + src * h;
                /* sign: the largest entry positive, so the file does not
                 * depend on the solver's arbitrary sign */
                size_t big = 0;
                for (size_t i = 1; i < h; i++)
                    if (fabs(vec[i]) > fabs(vec[big])) big = i;
                double sgn = vec[big] < 0 ? -1.0 : 1.0;
                for (size_t i = 0; i < h; i++) basis[j * h + i] = (float)(sgn * vec[i]);
                var[j] = (float)(w[src] > 0 ? w[src] : 0);
            }
        }
    free(a);
    free(w);
    free(work);
    free(iwork);
    if (rc) {
        kvs_transform_free(t);
        return rc;
    }
    kvs_transform_finish(t);
    *out = t;
    return KVS_OK;
}
