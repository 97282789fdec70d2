/* kvserde encode - put every float tensor of a safetensors file through a
 * serde. docs/cli.md describes the command and the file it writes. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "kvserde/kvserde.h"
#include "safetensors.h"

static const char encode_usage[] =
    "usage: kvserde encode [--serde JSON] [--raw] [--tensor NAME]... IN.safetensors\n"
    "                      OUT.safetensors\n"
    "\n"
    "Puts every float32, float16 and bfloat16 tensor of IN through the serde and\n"
    "writes OUT; every other tensor and the __metadata__ entries are kept.\n"
    "\n"
    "  --serde JSON  the serde config (default {\"type\": \"fp8\"}), e.g.\n"
    "                '{\"type\": \"fp8\", \"fp8_dtype\": \"float8_e5m2\"}'\n"
    "  --tensor NAME encode only the tensors named (repeatable; each must be a\n"
    "                float32, float16 or bfloat16 tensor of IN); the others are\n"
    "                kept as they are, e.g. the queries of a KV file beside 'kv'\n"
    "  --raw         store each encoded tensor as the serde's opaque bytes (a U8\n"
    "                tensor), even when the serde is fp8\n"
    "  -h, --help    show this help\n"
    "\n"
    "With the fp8 serde an encoded tensor keeps its name and shape and becomes an\n"
    "F8_E4M3 or F8_E5M2 tensor (PyTorch loads it as float8_e4m3fn / float8_e5m2).\n"
    "With any other serde (or --raw) it becomes a 1-D U8 tensor of the serialized\n"
    "bytes. OUT's __metadata__ records how to undo it:\n"
    "  kvserde.format        \"1\"\n"
    "  kvserde.serde         the serde config (compact JSON, sorted keys)\n"
    "  kvserde.dtype.NAME    the original dtype of tensor NAME (\"bfloat16\")\n"
    "  kvserde.shape.NAME    the original shape, for U8-blob tensors only\n"
    "With the pipeline serde (e.g. '{\"type\": \"pipeline\", \"stages\":\n"
    "[{\"type\": \"fp8\"}, {\"type\": \"crc32c\"}]}') each blob is a frame that records\n"
    "its own stages and layout; the entries above are written for it too. For\n"
    "aes_gcm, kvserde.serde records the key file paths, never a key.\n"
    "With kv_split ('{\"type\": \"kv_split\"}') every float tensor must be [2, ...]\n"
    "(K/V axis first); it becomes NAME.k (K, native by default), NAME.v (F8_E4M3 or\n"
    "F8_E5M2) and NAME.v_scale (F32 scales; NAME.k_scale for an fp8 K), recorded in\n"
    "kvserde.kv_split.NAME. With mode v_only only V is written (not decodable).\n"
    "`kvserde decode` reads them back. OUT is written to a temporary file next to\n"
    "it and renamed into place, so a failed run leaves no partial OUT.\n"
    "\n"
    "Exit status: 0 success, 1 failure (reason on stderr), 2 usage error.\n";

/* Everything encode needs while the writer asks for tensor bytes. */
typedef struct encode_ctx {
    const char *in_path;
    const kvs_st_file *in;
    kvs_serde_pair *serde;
    kvs_dtype *orig_dtype;  /* per output tensor (valid when encoded) */
    size_t *src_index;      /* per output tensor: its index in `in` */
    uint8_t *scratch;       /* serialized bytes of the current tensor */
    size_t scratch_cap;
    void *aligned;          /* an aligned copy of a misaligned source */
} encode_ctx;

/* The tensors encode reads: float32, float16 or bfloat16 (*dt set). */
static int is_float_tensor(const kvs_st_tensor *t, kvs_dtype *dt)
{
    return kvs_st_dtype_to_kvs(t->dtype, dt) == 0 &&
           (*dt == KVS_DTYPE_FLOAT32 || *dt == KVS_DTYPE_FLOAT16 || *dt == KVS_DTYPE_BFLOAT16);
}

/* The bytes of tensor t for the kernels: its own, or (a file written
 * without alignment: the kernels want aligned elements) an aligned copy in
 * ctx->aligned, valid until the next call. */
static int aligned_source(encode_ctx *ctx, const kvs_st_tensor *t, kvs_dtype dtype,
                          const void **data)
{
    size_t nbytes = (size_t)(t->end - t->begin);
    free(ctx->aligned);
    ctx->aligned = NULL;
    *data = t->data;
    if (((uintptr_t)t->data % kvs_dtype_size(dtype)) == 0 || nbytes == 0) return KVS_OK;
    if ((ctx->aligned = malloc(nbytes)) == NULL)
        return kvs_set_error(KVS_ENOMEM, "out of memory: %zu bytes", nbytes);
    *data = memcpy(ctx->aligned, t->data, nbytes);
    return KVS_OK;
}

/* Serialize input tensor `ti` (a float tensor) into ctx->scratch. */
static int serialize_tensor(encode_ctx *ctx, size_t ti, kvs_dtype dtype, size_t *nwritten)
{
    const kvs_st_tensor *t = &ctx->in->tensors[ti];
    kvs_layout layout, out_layout;
    int rc = kvs_enc_layout(t->ndim, t->shape, dtype, &layout);
    size_t est = 0;
    if (rc == KVS_OK) rc = kvs_serialized_layout(ctx->serde->serializer, &layout, &out_layout);
    if (rc == KVS_OK) est = (size_t)kvs_layout_nbytes(&out_layout);
    if (rc == KVS_OK && est > ctx->scratch_cap) {
        free(ctx->scratch);
        ctx->scratch_cap = 0;
        if ((ctx->scratch = malloc(est)) == NULL)
            rc = kvs_set_error(KVS_ENOMEM, "out of memory: %zu bytes", est);
        else
            ctx->scratch_cap = est;
    }
    size_t nbytes = (size_t)(t->end - t->begin);
    const void *data = t->data;
    if (rc == KVS_OK) rc = aligned_source(ctx, t, dtype, &data);
    kvs_memobj src, dst;
    if (rc == KVS_OK)
        rc = kvs_memobj_init(&src, (void *)(uintptr_t)data, nbytes, &layout, KVS_FMT_UNDEFINED);
    if (rc == KVS_OK)
        rc = kvs_memobj_init(&dst, ctx->scratch, est, &out_layout, KVS_FMT_BINARY_BUFFER);
    if (rc == KVS_OK) rc = kvs_serialize(ctx->serde->serializer, &src, &dst, NULL, nwritten);
    if (rc) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        return kvs_set_error(rc, "%s: tensor '%s': %s", ctx->in_path, t->name, msg);
    }
    return KVS_OK;
}

/* The writer's callback for native fp8 tensors: serialize on demand, so
 * only one tensor's output is in memory at a time. */
static int produce_fp8(void *vctx, size_t index, const void **data)
{
    encode_ctx *ctx = vctx;
    size_t ti = ctx->src_index[index], n = 0;
    int rc = serialize_tensor(ctx, ti, ctx->orig_dtype[index], &n);
    if (rc) return rc;
    if (n != ctx->in->tensors[ti].numel)
        return kvs_set_error(KVS_EINVAL,
                             "%s: tensor '%s': the fp8 serde wrote %zu bytes for %llu elements",
                             ctx->in_path, ctx->in->tensors[ti].name, n,
                             (unsigned long long)ctx->in->tensors[ti].numel);
    *data = ctx->scratch;
    return KVS_OK;
}

/* What encode keeps of one tensor split by the kv_split serde until the
 * file is written: the blob (the output tensors point into it), the
 * tensor-wide scales, the scale tensors' shapes and the output names. */
typedef struct kv_part {
    uint8_t *blob;
    float scale[2];
    uint64_t scale_shape[2];
    char *names[4]; /* NAME.k, NAME.k_scale, NAME.v, NAME.v_scale */
} kv_part;

static void kv_part_free(kv_part *p)
{
    free(p->blob);
    for (int i = 0; i < 4; i++) free(p->names[i]);
    memset(p, 0, sizeof *p);
}

/* "[3x4]" (sizes joined by 'x'), written into buf. */
static const char *x_shape(uint32_t ndim, const uint64_t *shape, char *buf, size_t size)
{
    size_t pos = 0;
    pos += (size_t)snprintf(buf, size, "[");
    for (uint32_t d = 0; d < ndim && pos < size; d++)
        pos += (size_t)snprintf(buf + pos, size - pos, d ? "x%llu" : "%llu",
                                (unsigned long long)shape[d]);
    if (pos < size) snprintf(buf + pos, size - pos, "]");
    return buf;
}

static const char *scope_name(kvs_kv_split_scale s)
{
    switch (s) {
    case KVS_KV_SPLIT_SCALE_PER_LAYER: return "per_layer";
    case KVS_KV_SPLIT_SCALE_PER_LAYER_HEAD: return "per_layer_head";
    case KVS_KV_SPLIT_SCALE_PER_TOKEN: return "per_token";
    default: return "per_tensor";
    }
}

static char *name_with(const char *name, const char *suffix)
{
    size_t n = strlen(name) + strlen(suffix) + 1;
    char *s = malloc(n);
    if (s) snprintf(s, n, "%s%s", name, suffix);
    return s;
}

/* Split float tensor `ti` ([2, ...]) into K and V with the kv_split
 * serializer `ser` (k_present: 0 in mode v_only), append its output tensors
 * to outs[*nout..] and set *meta_value to its kvserde.kv_split entry. */
static int encode_kv_split(encode_ctx *ctx, size_t ti, kvs_dtype dt, kvs_multi_serializer *ser,
                           int k_present, kv_part *part, kvs_st_out *outs, size_t *nout,
                           char **meta_value)
{
    const kvs_st_tensor *t = &ctx->in->tensors[ti];
    char sbuf[256];
    if (t->ndim < 1 || t->shape[0] != 2)
        return kvs_set_error(KVS_EINVAL,
                             "tensor '%s' is %s %s; the kv_split serde needs a K/V axis of size "
                             "2 first ([2, ...])",
                             t->name, x_shape(t->ndim, t->shape, sbuf, sizeof sbuf),
                             kvs_dtype_name(dt));
    static const uint64_t one = 1;
    kvs_layout half;
    int rc = t->ndim == 1 ? kvs_enc_layout(1, &one, dt, &half)
                          : kvs_enc_layout(t->ndim - 1, t->shape + 1, dt, &half);
    size_t half_bytes = (size_t)(t->end - t->begin) / 2;
    const void *src = t->data;
    if (rc == KVS_OK) rc = aligned_source(ctx, t, dt, &src);
    const uint8_t *data = src;
    kvs_memobj k, v, dst;
    if (rc == KVS_OK)
        rc = kvs_memobj_init(&k, (void *)(uintptr_t)data, half_bytes, &half, KVS_FMT_UNDEFINED);
    if (rc == KVS_OK)
        rc = kvs_memobj_init(&v, (void *)(uintptr_t)(data + half_bytes), half_bytes, &half,
                             KVS_FMT_UNDEFINED);
    const kvs_layout *layouts[2] = {k_present ? &half : NULL, &half};
    kvs_memobj *group[2] = {k_present ? &k : NULL, &v};
    size_t est = 0, nw = 0;
    if (rc == KVS_OK) rc = kvs_multi_estimate_serialized_size(ser, layouts, 2, &est);
    kvs_layout blob_layout;
    if (rc == KVS_OK) rc = kvs_layout_flat(&blob_layout, est, KVS_DTYPE_UINT8);
    if (rc == KVS_OK && (part->blob = malloc(est ? est : 1)) == NULL)
        rc = kvs_set_error(KVS_ENOMEM, "out of memory: %zu bytes", est);
    if (rc == KVS_OK)
        rc = kvs_memobj_init(&dst, part->blob, est, &blob_layout, KVS_FMT_BINARY_BUFFER);
    if (rc == KVS_OK) rc = kvs_multi_serialize(ser, group, 2, &dst, NULL, &nw);
    kvs_kv_split_info info;
    if (rc == KVS_OK) rc = kvs_kv_split_inspect(part->blob, nw, &info);
    if (rc) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        return kvs_set_error(rc, "%s: tensor '%s': %s", ctx->in_path, t->name, msg);
    }

    json_t *root = json_object();
    json_object_set_new(root, "dtype", json_string(kvs_dtype_name(dt)));
    json_t *shape = json_array();
    for (uint32_t d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer((json_int_t)t->shape[d]));
    json_object_set_new(root, "shape", shape);
    size_t first = *nout;
    static const char *const slot_key[2] = {"k", "v"};
    static const char *const suffix[4] = {".k", ".k_scale", ".v", ".v_scale"};
    for (int s = 0; s < 2; s++) {
        const kvs_kv_split_slot_info *si = &info.slots[s];
        if (!si->present) continue;
        int fp8 = si->stored_dtype == KVS_DTYPE_FLOAT8_E4M3FN ||
                  si->stored_dtype == KVS_DTYPE_FLOAT8_E5M2;
        int scoped = fp8 && si->scope != KVS_KV_SPLIT_SCALE_PER_TENSOR;
        json_t *slot = json_object();
        part->names[2 * s] = name_with(t->name, suffix[2 * s]);
        kvs_st_out *o = &outs[(*nout)++];
        o->name = part->names[2 * s];
        o->dtype = kvs_st_dtype_from_kvs(si->stored_dtype);
        o->ndim = t->ndim - 1;
        o->shape = t->ndim > 1 ? t->shape + 1 : NULL;
        o->nbytes = si->numel * kvs_dtype_size(si->stored_dtype);
        o->data = part->blob + si->offset + (scoped ? 24 + 4 * si->nscales : 0);
        json_object_set_new(slot, "tensor", json_string(o->name ? o->name : ""));
        if (fp8) {
            part->names[2 * s + 1] = name_with(t->name, suffix[2 * s + 1]);
            kvs_st_out *so = &outs[(*nout)++];
            part->scale[s] = si->scale;
            part->scale_shape[s] = scoped ? si->nscales : 1;
            so->name = part->names[2 * s + 1];
            so->dtype = KVS_ST_F32;
            so->ndim = 1;
            so->shape = &part->scale_shape[s];
            so->nbytes = 4 * part->scale_shape[s];
            so->data = scoped ? (const void *)(part->blob + si->scales_offset)
                              : (const void *)&part->scale[s];
            json_object_set_new(slot, "scale", json_string(so->name ? so->name : ""));
            json_object_set_new(slot, "scope", json_string(scope_name(si->scope)));
            if (scoped) {
                json_t *grid = json_array();
                json_array_append_new(grid, json_integer((json_int_t)si->cols));
                json_array_append_new(grid, json_integer((json_int_t)si->rows_per_scale));
                json_array_append_new(grid, json_integer((json_int_t)si->cols_per_scale));
                json_object_set_new(slot, "grid", grid);
            }
        }
        json_object_set_new(root, slot_key[s], slot);
    }
    *meta_value = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    int missing = *meta_value == NULL;
    for (size_t i = first; i < *nout; i++) missing |= outs[i].name == NULL;
    if (missing) return kvs_set_error(KVS_ENOMEM, "out of memory");
    return KVS_OK;
}

static char *key_for(const char *prefix, const char *name)
{
    size_t n = strlen(prefix) + strlen(name) + 1;
    char *k = malloc(n);
    if (k) snprintf(k, n, "%s%s", prefix, name);
    return k;
}

static char *shape_json(uint32_t ndim, const uint64_t *shape)
{
    size_t cap = 3 + (size_t)ndim * 21, pos = 0; /* '[', sizes, ']', NUL */
    char *s = malloc(cap);
    if (s == NULL) return NULL;
    s[pos++] = '[';
    for (uint32_t d = 0; d < ndim; d++)
        pos += (size_t)snprintf(s + pos, cap - pos, d ? ",%llu" : "%llu",
                                (unsigned long long)shape[d]);
    snprintf(s + pos, cap - pos, "]");
    return s;
}

int kvs_cmd_encode(int argc, char **argv)
{
    static const struct option opts[] = {
        {"serde", required_argument, NULL, 's'},
        {"raw", no_argument, NULL, 'r'},
        {"tensor", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *serde_text = "{\"type\": \"fp8\"}";
    int raw = 0, c;
    enum { MAX_SELECTED = 256 };
    const char *selected[MAX_SELECTED];
    size_t nselected = 0;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 's': serde_text = optarg; break;
        case 'r': raw = 1; break;
        case 't':
            if (nselected == MAX_SELECTED) {
                fprintf(stderr, "kvserde encode: at most %d --tensor options\n", MAX_SELECTED);
                return 2;
            }
            selected[nselected++] = optarg;
            break;
        case 'h': fputs(encode_usage, stdout); return 0;
        case ':':
            fprintf(stderr, "kvserde encode: option '%s' needs a value\n\n%s", argv[optind - 1],
                    encode_usage);
            return 2;
        default:
            fprintf(stderr, "kvserde encode: unknown option '%s'\n\n%s", argv[optind - 1],
                    encode_usage);
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "kvserde encode: expected IN and OUT, got %d argument%s\n\n%s",
                argc - optind, argc - optind == 1 ? "" : "s", encode_usage);
        return 2;
    }
    const char *in_path = argv[optind], *out_path = argv[optind + 1];

    /* The serde config is part of the command line: a bad one is a usage
     * error, reported before any file is touched. */
    kvs_serde_pair serde = {0};
    kvs_multi_serde_pair multi = {0};
    char *canon = NULL;
    kvs_dtype fp8 = KVS_DTYPE_FLOAT8_E4M3FN;
    int is_fp8 = 0, is_multi = 0, k_present = 1;
    if ((is_multi = kvs_serde_config_multi(serde_text)) < 0 ||
        (is_multi ? kvs_multi_serde_create_pair(serde_text, &multi)
                  : kvs_serde_create_pair(serde_text, &serde)) != KVS_OK ||
        kvs_serde_config_canonical(serde_text, &canon) != KVS_OK ||
        (is_fp8 = kvs_serde_config_fp8(serde_text, &fp8)) < 0) {
        fprintf(stderr, "kvserde encode: --serde: %s\n", kvs_last_error());
        kvs_serde_pair_destroy(&serde);
        kvs_multi_serde_pair_destroy(&multi);
        free(canon);
        return 2;
    }
    if (is_multi) {
        json_t *cfg = json_loads(serde_text, 0, NULL);
        const char *type = json_string_value(json_object_get(cfg, "type"));
        const char *mode = json_string_value(json_object_get(cfg, "mode"));
        int bad_type = type == NULL || strcmp(type, "kv_split") != 0;
        k_present = mode == NULL || strcmp(mode, "v_only") != 0;
        if (bad_type || raw)
            fprintf(stderr,
                    bad_type ? "kvserde encode: --serde: the multi-output serde '%s' is not "
                               "supported; encode splits tensors with kv_split only\n"
                             : "kvserde encode: --raw does not apply to the %s serde, which "
                               "writes K and V as tensors of their own\n",
                    type ? type : "?");
        json_decref(cfg);
        if (bad_type || raw) {
            kvs_multi_serde_pair_destroy(&multi);
            free(canon);
            return 2;
        }
    }
    int native = is_fp8 && !raw;

    int status = 1;
    kvs_st_mapped map;
    kvs_st_file in;
    encode_ctx ctx = {0};
    kvs_st_out *outs = NULL;
    kvs_st_meta *meta = NULL;
    uint8_t **blobs = NULL;
    uint64_t *blob_sizes = NULL;
    kv_part *parts = NULL;
    size_t nmeta = 0, nencoded = 0, nout = 0;
    uint64_t in_bytes = 0, out_bytes = 0;
    if (kvs_st_open(in_path, &map, &in) != KVS_OK) {
        fprintf(stderr, "kvserde encode: %s\n", kvs_last_error());
        kvs_serde_pair_destroy(&serde);
        kvs_multi_serde_pair_destroy(&multi);
        free(canon);
        return 1;
    }
    for (size_t i = 0; i < in.nmeta; i++) {
        if (strncmp(in.meta[i].key, KVS_META_PREFIX, strlen(KVS_META_PREFIX)) == 0) {
            fprintf(stderr,
                    "kvserde encode: %s: metadata '%s' is kvserde's own; %s\n", in_path,
                    in.meta[i].key,
                    kvs_st_meta_get(&in, KVS_META_SERDE)
                        ? "the file is already encoded (decode it first)"
                        : "rename or remove that entry first");
            goto out;
        }
    }

    size_t n = in.ntensors;
    /* Every tensor --tensor names is in IN and a float tensor. */
    for (size_t k = 0; k < nselected; k++) {
        const kvs_st_tensor *t = NULL;
        for (size_t i = 0; i < n && t == NULL; i++)
            if (strcmp(in.tensors[i].name, selected[k]) == 0) t = &in.tensors[i];
        kvs_dtype dt;
        if (t == NULL) {
            fprintf(stderr, "kvserde encode: --tensor '%s': %s has no tensor of that name\n",
                    selected[k], in_path);
            goto out;
        }
        if (!is_float_tensor(t, &dt)) {
            fprintf(stderr,
                    "kvserde encode: --tensor '%s': the tensor is %s; only float32, float16 "
                    "and bfloat16 tensors are encoded\n",
                    selected[k], kvs_st_dtype_name(t->dtype));
            goto out;
        }
    }
    /* A kv_split tensor becomes up to 4 output tensors. */
    outs = calloc(n ? 4 * n : 1, sizeof *outs);
    ctx.orig_dtype = calloc(n ? 4 * n : 1, sizeof *ctx.orig_dtype);
    ctx.src_index = calloc(n ? 4 * n : 1, sizeof *ctx.src_index);
    blobs = calloc(n ? n : 1, sizeof *blobs);
    blob_sizes = calloc(n ? n : 1, sizeof *blob_sizes);
    parts = calloc(n ? n : 1, sizeof *parts);
    meta = calloc(in.nmeta + 2 + 2 * n, sizeof *meta);
    if (!outs || !ctx.orig_dtype || !ctx.src_index || !blobs || !blob_sizes || !parts || !meta) {
        fprintf(stderr, "kvserde encode: out of memory\n");
        goto out;
    }
    ctx.in_path = in_path;
    ctx.in = &in;
    ctx.serde = &serde;

    for (size_t i = 0; i < in.nmeta; i++) meta[nmeta++] = in.meta[i]; /* borrowed */
    size_t owned_from = nmeta; /* entries from here on are ours to free */
    meta[nmeta].key = strdup(KVS_META_FORMAT);
    meta[nmeta++].value = strdup(KVS_META_FORMAT_VERSION);
    meta[nmeta].key = strdup(KVS_META_SERDE);
    meta[nmeta++].value = strdup(canon);

    for (size_t i = 0; i < n; i++) {
        const kvs_st_tensor *t = &in.tensors[i];
        kvs_dtype dt;
        /* every float tensor, or those --tensor names; the others are kept */
        int encode = is_float_tensor(t, &dt);
        int chosen = nselected == 0;
        for (size_t k = 0; k < nselected && !chosen; k++)
            chosen = strcmp(t->name, selected[k]) == 0;
        encode = encode && chosen;
        in_bytes += t->end - t->begin;
        if (encode && is_multi) {
            /* K and V as tensors of their own, and one metadata entry. */
            size_t from = nout;
            nencoded++;
            meta[nmeta].key = key_for(KVS_META_KV_SPLIT, t->name);
            if (encode_kv_split(&ctx, i, dt, multi.serializer, k_present, &parts[i], outs,
                                &nout, &meta[nmeta++].value) != KVS_OK) {
                fprintf(stderr, "kvserde encode: %s\n", kvs_last_error());
                goto out;
            }
            for (size_t j = from; j < nout; j++) out_bytes += outs[j].nbytes;
            continue;
        }
        kvs_st_out *o = &outs[nout];
        o->name = t->name;
        o->dtype = t->dtype;
        o->ndim = t->ndim;
        o->shape = t->shape;
        o->nbytes = t->end - t->begin;
        o->data = t->data;
        ctx.src_index[nout++] = i;
        if (encode) {
            ctx.orig_dtype[nout - 1] = dt;
            nencoded++;
            meta[nmeta].key = key_for(KVS_META_DTYPE, t->name);
            meta[nmeta++].value = strdup(kvs_dtype_name(dt));
            if (native) {
                o->dtype = kvs_st_dtype_from_kvs(fp8);
                o->nbytes = t->numel;
                o->data = NULL; /* produced on demand */
            } else {
                size_t nw = 0;
                if (serialize_tensor(&ctx, i, dt, &nw) != KVS_OK) {
                    fprintf(stderr, "kvserde encode: %s\n", kvs_last_error());
                    goto out;
                }
                blobs[i] = malloc(nw ? nw : 1);
                if (blobs[i] == NULL) {
                    fprintf(stderr, "kvserde encode: out of memory\n");
                    goto out;
                }
                if (nw) memcpy(blobs[i], ctx.scratch, nw);
                blob_sizes[i] = nw;
                o->dtype = KVS_ST_U8;
                o->ndim = 1;
                o->shape = &blob_sizes[i];
                o->nbytes = nw;
                o->data = blobs[i];
                meta[nmeta].key = key_for(KVS_META_SHAPE, t->name);
                meta[nmeta++].value = shape_json(t->ndim, t->shape);
            }
        }
        out_bytes += o->nbytes;
    }
    for (size_t i = owned_from; i < nmeta; i++) {
        if (meta[i].key == NULL || meta[i].value == NULL) {
            fprintf(stderr, "kvserde encode: out of memory\n");
            goto out;
        }
    }

    if (kvs_safetensors_write(out_path, outs, nout, meta, nmeta, produce_fp8, &ctx) != KVS_OK) {
        fprintf(stderr, "kvserde encode: %s\n", kvs_last_error());
        goto out;
    }
    printf("%s: encoded %zu of %zu tensors with %s; data %llu -> %llu bytes\n", out_path,
           nencoded, n, canon, (unsigned long long)in_bytes, (unsigned long long)out_bytes);
    status = 0;

out:
    if (meta) {
        for (size_t i = in.nmeta; i < nmeta; i++) {
            free(meta[i].key);
            free(meta[i].value);
        }
    }
    for (size_t i = 0; blobs && i < in.ntensors; i++) free(blobs[i]);
    for (size_t i = 0; parts && i < in.ntensors; i++) kv_part_free(&parts[i]);
    free(parts);
    free(blobs);
    free(blob_sizes);
    free(meta);
    free(outs);
    free(ctx.orig_dtype);
    free(ctx.src_index);
    free(ctx.scratch);
    free(ctx.aligned);
    kvs_st_close(&map, &in);
    kvs_serde_pair_destroy(&serde);
    kvs_multi_serde_pair_destroy(&multi);
    free(canon);
    return status;
}
