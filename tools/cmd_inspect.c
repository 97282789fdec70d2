/* kvserde inspect - what a safetensors file holds, and with --compare how far
 * each tensor is from the same tensor of another file. */
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/half.h"
#include "commands.h"
#include "frames.h"
#include "kvserde/kvserde.h"
#include "safetensors.h"

static const char inspect_usage[] =
    "usage: kvserde inspect FILE [--compare ORIG] [--key-file F]...\n"
    "                       [--transform T.safetensors]\n"
    "\n"
    "Validates FILE (a safetensors file) and lists its header size, data size,\n"
    "__metadata__ entries, and each tensor's name, dtype, shape and bytes, in\n"
    "data order. Tensors that hold a frame (the pipeline serde's blobs) are then\n"
    "listed under frames: their stages and parameters, the layout the frame\n"
    "records, header and payload bytes, the key binding, and whether every\n"
    "check (header, checksums, with a key file the aes_gcm tag) passes.\n"
    "\n"
    "  --compare ORIG  also compare every tensor with the tensor of the same name\n"
    "                  in ORIG (both files must hold the same names and shapes).\n"
    "                  Tensors encoded by `kvserde encode` are decoded first, in\n"
    "                  either file. Per tensor, over the elements whose ORIG value\n"
    "                  is finite (NONFINITE counts the others):\n"
    "                    MAX_ABS_ERR  max |x - o|\n"
    "                    RMSE         sqrt(mean((x - o)^2))\n"
    "                    SNR_DB       10 log10(sum o^2 / sum (x - o)^2)\n"
    "                    COSINE       sum x o / sqrt(sum x^2 sum o^2)\n"
    "                  A non-finite x against a finite o makes the error infinite.\n"
    "  --key-file F    an aes_gcm key file (repeatable): check and decode\n"
    "                  encrypted frames\n"
    "  --transform T   the transform file (`kvserde calibrate`) of frames made by\n"
    "                  the transform stage, to decode them for --compare\n"
    "  -h, --help      show this help\n"
    "\n"
    "Exit status: 0 success, 1 failure (reason on stderr), 2 usage error.\n";

/* A copy of s with control bytes escaped, so names cannot garble a
 * terminal. */
static char *printable(const char *s)
{
    size_t n = strlen(s);
    char *out = malloc(4 * n + 1), *p = out;
    if (out == NULL) return NULL;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch < 0x20 || ch == 0x7F)
            p += sprintf(p, "\\x%02x", ch);
        else
            *p++ = (char)ch;
    }
    *p = '\0';
    return out;
}

/* ----- a table of strings printed in aligned columns ----------------- */

#define MAX_COLS 10

typedef struct table {
    size_t ncols, nrows, cap;
    char **cells; /* nrows x ncols */
    int right[MAX_COLS];
} table;

static int table_add(table *t, char **row)
{
    if (t->nrows == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 16;
        char **c = realloc(t->cells, cap * t->ncols * sizeof *c);
        if (c == NULL) return -1;
        t->cells = c;
        t->cap = cap;
    }
    for (size_t j = 0; j < t->ncols; j++) t->cells[t->nrows * t->ncols + j] = row[j];
    t->nrows++;
    return 0;
}

static void table_print(const table *t, const char *indent)
{
    size_t w[MAX_COLS] = {0};
    for (size_t i = 0; i < t->nrows; i++)
        for (size_t j = 0; j < t->ncols; j++) {
            size_t l = strlen(t->cells[i * t->ncols + j]);
            if (l > w[j]) w[j] = l;
        }
    for (size_t i = 0; i < t->nrows; i++) {
        fputs(indent, stdout);
        for (size_t j = 0; j < t->ncols; j++) {
            const char *c = t->cells[i * t->ncols + j];
            int last = j + 1 == t->ncols;
            if (t->right[j])
                printf("%*s", (int)w[j], c);
            else if (last)
                fputs(c, stdout); /* no trailing spaces */
            else
                printf("%-*s", (int)w[j], c);
            if (!last) fputs("  ", stdout);
        }
        fputc('\n', stdout);
    }
}

static void table_free(table *t)
{
    for (size_t i = 0; i < t->nrows * t->ncols; i++) free(t->cells[i]);
    free(t->cells);
}

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    char *s = NULL;
    va_list ap;
    va_start(ap, f);
    if (vasprintf(&s, f, ap) < 0) s = NULL;
    va_end(ap);
    return s;
}

/* ----- values of a tensor as doubles ----------------------------------- */

typedef struct valsrc {
    const kvs_st_tensor *t;
    float *decoded; /* an encoded tensor, decoded to float32 */
    uint32_t ndim;  /* the logical shape (the original one if encoded) */
    const uint64_t *shape;
    uint64_t numel;
    const char *dtype; /* the logical dtype name */
} valsrc;

static int plain_comparable(kvs_st_dtype d)
{
    return d != KVS_ST_F4 && d != KVS_ST_F6_E2M3 && d != KVS_ST_F6_E3M2 && d != KVS_ST_C64;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static double element(const uint8_t *p, kvs_st_dtype dt, uint64_t i)
{
    switch (dt) {
    case KVS_ST_BOOL: return p[i] != 0;
    case KVS_ST_U8: return p[i];
    case KVS_ST_I8: return (int8_t)p[i];
    case KVS_ST_I16: return (int16_t)le(p + 2 * i, 2);
    case KVS_ST_U16: return (uint16_t)le(p + 2 * i, 2);
    case KVS_ST_F16: return kvs_f16_to_f32((uint16_t)le(p + 2 * i, 2));
    case KVS_ST_BF16: return kvs_bf16_to_f32((uint16_t)le(p + 2 * i, 2));
    case KVS_ST_I32: return (int32_t)le(p + 4 * i, 4);
    case KVS_ST_U32: return (uint32_t)le(p + 4 * i, 4);
    case KVS_ST_F32: return kvs_f32_from_bits((uint32_t)le(p + 4 * i, 4));
    case KVS_ST_I64: return (double)(int64_t)le(p + 8 * i, 8);
    case KVS_ST_U64: return (double)le(p + 8 * i, 8);
    case KVS_ST_F64: {
        uint64_t u = le(p + 8 * i, 8);
        double d;
        memcpy(&d, &u, 8);
        return d;
    }
    case KVS_ST_F8_E4M3: return kvs_fp8_to_float(p[i], KVS_DTYPE_FLOAT8_E4M3FN);
    case KVS_ST_F8_E5M2: return kvs_fp8_to_float(p[i], KVS_DTYPE_FLOAT8_E5M2);
    case KVS_ST_F8_E8M0: return p[i] == 0xFF ? NAN : ldexp(1.0, (int)p[i] - 127);
    default: return NAN;
    }
}

static double value(const valsrc *s, uint64_t i)
{
    return s->decoded ? s->decoded[i] : element(s->t->data, s->t->dtype, i);
}

/* Set up the values of tensor i of `file`; an encoded tensor is decoded. */
static int valsrc_init(const kvs_st_file *file, kvs_enc_file *enc, size_t i, valsrc *s)
{
    memset(s, 0, sizeof *s);
    s->t = &file->tensors[i];
    const kvs_enc_info *info = &enc->info[i];
    if (info->kind == KVS_ENC_NONE) {
        s->ndim = s->t->ndim;
        s->shape = s->t->shape;
        s->numel = s->t->numel;
        s->dtype = kvs_st_dtype_name(s->t->dtype);
        return KVS_OK;
    }
    s->ndim = info->ndim;
    s->shape = info->shape;
    s->numel = info->numel;
    s->dtype = kvs_st_dtype_name(kvs_st_dtype_from_kvs(info->orig_dtype));
    s->decoded = malloc(info->numel ? (size_t)info->numel * sizeof(float) : 1);
    if (s->decoded == NULL) return kvs_set_error(KVS_ENOMEM, "out of memory");
    return kvs_enc_decode_tensor(file, enc, i, KVS_DTYPE_FLOAT32, s->decoded);
}

typedef struct stats {
    double max_abs, rmse, snr_db, cosine;
    uint64_t nonfinite;
} stats;

/* The figures --help documents; x is FILE's tensor, o is ORIG's. */
static stats compare(const valsrc *x, const valsrc *o)
{
    double sum_err2 = 0, sum_o2 = 0, sum_x2 = 0, dot = 0, max_abs = 0;
    uint64_t n = 0, nonfinite = 0, bad = 0;
    for (uint64_t i = 0; i < o->numel; i++) {
        double ov = value(o, i), xv = value(x, i);
        if (!isfinite(ov)) {
            nonfinite++;
            continue;
        }
        n++;
        if (!isfinite(xv)) {
            bad++;
            continue;
        }
        double d = fabs(xv - ov);
        if (d > max_abs) max_abs = d;
        sum_err2 += d * d;
        sum_o2 += ov * ov;
        sum_x2 += xv * xv;
        dot += xv * ov;
    }
    stats s = {0};
    s.nonfinite = nonfinite;
    if (bad) {
        s.max_abs = s.rmse = INFINITY;
        s.snr_db = -INFINITY;
        s.cosine = NAN;
        return s;
    }
    s.max_abs = max_abs;
    s.rmse = n ? sqrt(sum_err2 / (double)n) : 0.0;
    s.snr_db = sum_err2 == 0 ? INFINITY : 10.0 * log10(sum_o2 / sum_err2);
    if (sum_x2 == 0 && sum_o2 == 0)
        s.cosine = 1.0;
    else if (sum_x2 == 0 || sum_o2 == 0)
        s.cosine = 0.0;
    else
        s.cosine = dot / sqrt(sum_x2 * sum_o2);
    return s;
}

static char *fmt_g(double v)
{
    if (isnan(v)) return fmt("nan");
    if (isinf(v)) return fmt(v > 0 ? "inf" : "-inf");
    return fmt("%.6g", v);
}

static char *fmt_fixed(double v, int prec)
{
    if (isnan(v)) return fmt("nan");
    if (isinf(v)) return fmt(v > 0 ? "inf" : "-inf");
    return fmt("%.*f", prec, v);
}

static int same_shape(const valsrc *a, const valsrc *b)
{
    if (a->ndim != b->ndim) return 0;
    for (uint32_t d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d]) return 0;
    return 1;
}

/* ----- the command ------------------------------------------------------ */

typedef struct opened {
    const char *path;
    kvs_st_mapped map;
    kvs_st_file file;
    kvs_enc_file enc;
    int open, enc_open;
} opened;

static int open_file(opened *o, const char *path, int with_enc, kvs_deserializer *frames)
{
    o->path = path;
    if (kvs_st_open(path, &o->map, &o->file) != KVS_OK) {
        fprintf(stderr, "kvserde inspect: %s\n", kvs_last_error());
        return -1;
    }
    o->open = 1;
    if (with_enc) {
        if (kvs_enc_open(&o->file, frames, &o->enc) != KVS_OK) {
            fprintf(stderr, "kvserde inspect: %s: %s\n", path, kvs_last_error());
            return -1;
        }
        o->enc_open = 1;
    }
    return 0;
}

static void close_file(opened *o)
{
    if (o->enc_open) kvs_enc_close(&o->enc);
    if (o->open) kvs_st_close(&o->map, &o->file);
}

/* One row of the tensor table; with `orig`, the comparison columns too.
 * Returns 0, or -1 after printing the reason. */
static int tensor_row(table *tab, opened *f, size_t i, opened *orig)
{
    const kvs_st_tensor *t = &f->file.tensors[i];
    char shape[512];
    char *row[MAX_COLS] = {0};
    int status = -1;
    row[0] = printable(t->name);
    row[1] = fmt("%s", kvs_st_dtype_name(t->dtype));
    row[2] = fmt("%s", kvs_st_format_shape(t->ndim, t->shape, shape, sizeof shape));
    row[3] = fmt("%llu", (unsigned long long)(t->end - t->begin));
    valsrc x = {0}, o = {0};
    if (orig) {
        const kvs_st_tensor *ot = kvs_st_find(&orig->file, t->name);
        if (ot == NULL) {
            fprintf(stderr, "kvserde inspect: tensor '%s' of %s is not in %s\n", row[0],
                    f->path, orig->path);
            goto out;
        }
        if (valsrc_init(&f->file, &f->enc, i, &x) != KVS_OK ||
            valsrc_init(&orig->file, &orig->enc, (size_t)(ot - orig->file.tensors), &o) !=
                KVS_OK) {
            fprintf(stderr, "kvserde inspect: %s\n", kvs_last_error());
            goto out;
        }
        if (!same_shape(&x, &o)) {
            char s2[512];
            fprintf(stderr, "kvserde inspect: tensor '%s': shape %s in %s but %s in %s\n",
                    row[0], kvs_st_format_shape(x.ndim, x.shape, shape, sizeof shape), f->path,
                    kvs_st_format_shape(o.ndim, o.shape, s2, sizeof s2), orig->path);
            goto out;
        }
        row[4] = fmt("%s", o.dtype);
        if ((x.decoded || plain_comparable(t->dtype)) &&
            (o.decoded || plain_comparable(o.t->dtype))) {
            stats s = compare(&x, &o);
            row[5] = fmt_g(s.max_abs);
            row[6] = fmt_g(s.rmse);
            row[7] = fmt_fixed(s.snr_db, 2);
            row[8] = fmt_fixed(s.cosine, 6);
            row[9] = fmt("%llu", (unsigned long long)s.nonfinite);
        } else {
            for (int j = 5; j < 10; j++) row[j] = fmt("-");
        }
    }
    for (size_t j = 0; j < tab->ncols; j++)
        if (row[j] == NULL) {
            fprintf(stderr, "kvserde inspect: out of memory\n");
            goto out;
        }
    if (table_add(tab, row) != 0) {
        fprintf(stderr, "kvserde inspect: out of memory\n");
        goto out;
    }
    status = 0;
out:
    free(x.decoded);
    free(o.decoded);
    if (status)
        for (int j = 0; j < MAX_COLS; j++) free(row[j]);
    return status;
}

/* The frames section: for every U8 tensor that holds a frame, what its
 * header says and whether its checks pass. Written to `out`. */
static void frame_report(FILE *out, const kvs_st_file *file, kvs_deserializer *de, size_t nkeys)
{
    int any = 0;
    for (size_t i = 0; i < file->ntensors; i++) {
        const kvs_st_tensor *t = &file->tensors[i];
        size_t len = (size_t)(t->end - t->begin);
        if (t->dtype != KVS_ST_U8 || !kvs_frame_detect(t->data, len)) continue;
        if (!any) fputs("frames:\n", out);
        any = 1;
        char *name = printable(t->name);
        kvs_frame_info fi;
        if (kvs_frame_inspect(t->data, len, &fi) != KVS_OK) {
            char *msg = printable(kvs_last_error());
            fprintf(out, "  %s: not a valid frame: %s\n", name ? name : "?", msg ? msg : "?");
            free(msg);
            free(name);
            continue;
        }
        char layout[512];
        fprintf(out, "  %s: frame v%u, header %zu bytes, payload %llu bytes, layout %s",
                name ? name : "?", fi.version, fi.header_bytes,
                (unsigned long long)fi.payload_bytes,
                kvs_layout_format(&fi.layout, layout, sizeof layout));
        if (fi.format != KVS_FMT_UNDEFINED) fprintf(out, ", memory format %d", (int)fi.format);
        if (fi.keyed)
            fprintf(out, ", keyed (key fingerprint %016llx)\n",
                    (unsigned long long)fi.key_fingerprint);
        else
            fputs(", not keyed\n", out);
        int encrypted = 0;
        for (uint32_t s = 0; s < fi.nstages && s < KVS_FRAME_INFO_MAX_STAGES; s++) {
            fprintf(out, "    stage %u: %s %s\n", s, fi.stages[s].name, fi.stages[s].params);
            encrypted |= strcmp(fi.stages[s].name, "aes_gcm") == 0;
        }
        int rc = kvs_pipeline_verify(de, t->data, len, NULL);
        if (rc == KVS_OK) {
            fputs("    checks ok\n", out);
        } else if (encrypted && nkeys == 0 && rc == KVS_EAUTH) {
            fputs("    encrypted: not verified (no --key-file)\n", out);
        } else {
            char *msg = printable(kvs_last_error());
            fprintf(out, "    checks failed: %s\n", msg ? msg : "?");
            free(msg);
        }
        free(name);
    }
}

int kvs_cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {
        {"compare", required_argument, NULL, 'c'},
        {"key-file", required_argument, NULL, 'k'},
        {"transform", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *orig_path = NULL, *transform = NULL;
    char *key_files[KVS_TOOL_MAX_KEY_FILES];
    size_t nkeys = 0;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': orig_path = optarg; break;
        case 't': transform = optarg; break;
        case 'k':
            if (kvs_tool_add_key_file("inspect", key_files, &nkeys, optarg) != 0) return 2;
            break;
        case 'h': fputs(inspect_usage, stdout); return 0;
        case ':':
            fprintf(stderr, "kvserde inspect: option '%s' needs a value\n\n%s", argv[optind - 1],
                    inspect_usage);
            return 2;
        default:
            fprintf(stderr, "kvserde inspect: unknown option '%s'\n\n%s", argv[optind - 1],
                    inspect_usage);
            return 2;
        }
    }
    if (argc - optind != 1) {
        fprintf(stderr, "kvserde inspect: expected one FILE, got %d arguments\n\n%s",
                argc - optind, inspect_usage);
        return 2;
    }

    kvs_serde_pair frames = {0};
    if (kvs_tool_frame_deserializer(key_files, nkeys, transform, &frames) != KVS_OK) {
        fprintf(stderr, "kvserde inspect: %s: %s\n",
                transform ? "--key-file / --transform" : "--key-file", kvs_last_error());
        return 1;
    }
    int status = 1;
    char *report = NULL;
    size_t report_len = 0;
    FILE *report_f = NULL;
    opened f = {0}, o = {0};
    table tab = {.ncols = orig_path ? 10 : 4};
    static const char *const heads[MAX_COLS] = {"NAME",        "DTYPE", "SHAPE",  "BYTES",
                                                "ORIG",        "MAX_ABS_ERR", "RMSE",
                                                "SNR_DB",      "COSINE", "NONFINITE"};
    for (int j = 3; j < MAX_COLS; j++) tab.right[j] = j != 4;
    char *head[MAX_COLS];
    for (size_t j = 0; j < tab.ncols; j++)
        if ((head[j] = fmt("%s", heads[j])) == NULL) goto out;
    if (table_add(&tab, head) != 0) goto out;

    if (open_file(&f, argv[optind], orig_path != NULL, frames.deserializer) != 0) goto out;
    if (orig_path && open_file(&o, orig_path, 1, frames.deserializer) != 0) goto out;
    for (size_t i = 0; i < f.file.ntensors; i++)
        if (tensor_row(&tab, &f, i, orig_path ? &o : NULL) != 0) goto out;
    if (orig_path) {
        for (size_t j = 0; j < o.file.ntensors; j++)
            if (kvs_st_find(&f.file, o.file.tensors[j].name) == NULL) {
                char *name = printable(o.file.tensors[j].name);
                fprintf(stderr, "kvserde inspect: tensor '%s' of %s is not in %s\n",
                        name ? name : "?", orig_path, f.path);
                free(name);
                goto out;
            }
    }

    if ((report_f = open_memstream(&report, &report_len)) == NULL) {
        fprintf(stderr, "kvserde inspect: out of memory\n");
        goto out;
    }
    frame_report(report_f, &f.file, frames.deserializer, nkeys);
    if (fclose(report_f) != 0) {
        report_f = NULL;
        fprintf(stderr, "kvserde inspect: out of memory\n");
        goto out;
    }
    report_f = NULL;

    /* Everything is known: print it all at once. */
    char *path = printable(f.path);
    printf("%s: %zu tensor%s, header %llu bytes, data %llu bytes\n", path ? path : "?",
           f.file.ntensors, f.file.ntensors == 1 ? "" : "s",
           (unsigned long long)f.file.header_len, (unsigned long long)f.file.data_len);
    free(path);
    if (f.file.nmeta == 0) {
        printf("metadata: none\n");
    } else {
        printf("metadata:\n");
        for (size_t i = 0; i < f.file.nmeta; i++) {
            char *k = printable(f.file.meta[i].key), *v = printable(f.file.meta[i].value);
            printf("  %s: %s\n", k ? k : "?", v ? v : "?");
            free(k);
            free(v);
        }
    }
    printf("tensors:\n");
    table_print(&tab, "  ");
    if (report_len) fwrite(report, 1, report_len, stdout);
    if (orig_path) {
        char *op = printable(orig_path);
        printf("data: %llu bytes; %s: %llu bytes (ratio %.3f)\n",
               (unsigned long long)f.file.data_len, op ? op : "?",
               (unsigned long long)o.file.data_len,
               o.file.data_len ? (double)f.file.data_len / (double)o.file.data_len : 0.0);
        free(op);
    }
    status = 0;
out:
    table_free(&tab);
    close_file(&f);
    close_file(&o);
    free(report);
    kvs_serde_pair_destroy(&frames);
    return status;
}
