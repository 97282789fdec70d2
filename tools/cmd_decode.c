/* kvserde decode - undo `kvserde encode`: every encoded tensor back to its
 * original dtype (or the one asked for), kvserde's metadata removed. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "frames.h"
#include "kvserde/kvserde.h"
#include "safetensors.h"
#include "util/crc32c.h"
#include "util/le.h"

static const char decode_usage[] =
    "usage: kvserde decode [--dtype bfloat16|float16|float32] [--key-file F]...\n"
    "                      [--transform T.safetensors] IN.safetensors OUT.safetensors\n"
    "\n"
    "Reads a file written by `kvserde encode` and writes OUT with every encoded\n"
    "tensor decoded by the serde recorded in IN (kvserde.serde) back to its\n"
    "original dtype and shape; other tensors are copied unchanged, and the\n"
    "__metadata__ entries are kept except kvserde's own (kvserde.*).\n"
    "\n"
    "A tensor holding a frame (the pipeline serde's blobs) is decoded from the\n"
    "frame alone, whatever kvserde.serde says; an encrypted one needs the key\n"
    "file (--key-file), not the paths recorded in IN.\n"
    "\n"
    "A tensor the kv_split serde split into NAME.k / NAME.v (+ scales) is restored\n"
    "to its [2, ...] shape by the kv_split deserializer (not for mode v_only).\n"
    "\n"
    "IN may also be a plain safetensors file with F8_E4M3 / F8_E5M2 tensors and\n"
    "no kvserde metadata (as PyTorch or vLLM save them): every fp8 tensor is\n"
    "decoded exactly to --dtype (default bfloat16), everything else is kept.\n"
    "\n"
    "  --dtype D       decode every encoded tensor to D instead of its original\n"
    "                  dtype (bfloat16, float16 or float32; a \"torch.\" prefix is\n"
    "                  accepted)\n"
    "  --key-file F    an aes_gcm key file (repeatable), for encrypted frames\n"
    "  --transform T   the transform file (`kvserde calibrate`) of frames made by\n"
    "                  the transform stage\n"
    "  -h, --help      show this help\n"
    "\n"
    "OUT is written to a temporary file next to it and renamed into place, so a\n"
    "failed run leaves no partial OUT.\n"
    "\n"
    "Exit status: 0 success, 1 failure (reason on stderr), 2 usage error.\n";

/* A tensor the kv_split serde split (a kvserde.kv_split.NAME entry). */
typedef struct kv_restore {
    const char *name;  /* NAME (points into the metadata key) */
    kvs_dtype dtype;   /* original dtype */
    uint32_t ndim;     /* original shape, [2, ...] */
    uint64_t *shape;
    uint64_t numel;
    long slot[2];      /* tensor index of K / V, -1 if not stored */
    long scale[2];     /* tensor index of its scales, -1 for a native slot */
    kvs_kv_split_scale scope[2];
    uint64_t grid[2][3]; /* scoped slots: cols, rows_per_scale, cols_per_scale */
} kv_restore;

typedef struct decode_ctx {
    const char *in_path;
    const kvs_st_file *in;
    kvs_enc_file *enc;
    kvs_dtype *dtype; /* per tensor: the dtype to decode to */
    int plain;        /* a plain fp8 file: F8 tensors through kvs_fp8_decode */
    kv_restore *kv;   /* multi: the kv_split tensors to restore */
    long *kv_of;      /* multi: per output tensor, its kv index or -1 */
    uint8_t *scratch;
    size_t scratch_cap;
} decode_ctx;

static int kv_meta_error(const char *name, const char *what)
{
    return kvs_set_error(KVS_ECORRUPT, "kvserde metadata: %s%s: %s", KVS_META_KV_SPLIT, name,
                         what);
}

static long kv_tensor(const kvs_st_file *in, const json_t *slot, const char *field)
{
    const char *n = json_string_value(json_object_get(slot, field));
    const kvs_st_tensor *t = n ? kvs_st_find(in, n) : NULL;
    return t ? (long)(t - in->tensors) : -1;
}

/* Parse one kvserde.kv_split.NAME entry and check it against the tensors. */
static int kv_parse(const kvs_st_file *in, const char *name, const char *value, kv_restore *r)
{
    memset(r, 0, sizeof *r);
    r->name = name;
    r->slot[0] = r->slot[1] = r->scale[0] = r->scale[1] = -1;
    json_t *root = json_loads(value, JSON_REJECT_DUPLICATES, NULL);
    int rc = KVS_OK;
    json_t *shape = json_object_get(root, "shape");
    const char *dt = json_string_value(json_object_get(root, "dtype"));
    if (!json_is_object(root) || !json_is_array(shape) || dt == NULL)
        rc = kv_meta_error(name, "not an object with \"dtype\" and \"shape\"");
    else if (kvs_dtype_parse(dt, &r->dtype) != KVS_OK ||
             (r->dtype != KVS_DTYPE_FLOAT32 && r->dtype != KVS_DTYPE_FLOAT16 &&
              r->dtype != KVS_DTYPE_BFLOAT16))
        rc = kv_meta_error(name, "\"dtype\" must be float32, float16 or bfloat16");
    size_t nd = json_array_size(shape);
    if (rc == KVS_OK && (nd < 1 || nd > 64 || (r->shape = calloc(nd, sizeof *r->shape)) == NULL))
        rc = kv_meta_error(name, "bad \"shape\"");
    r->ndim = (uint32_t)nd;
    r->numel = 1;
    for (size_t d = 0; rc == KVS_OK && d < nd; d++) {
        json_t *v = json_array_get(shape, d);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            __builtin_mul_overflow(r->numel, (uint64_t)json_integer_value(v), &r->numel))
            rc = kv_meta_error(name, "bad \"shape\"");
        else
            r->shape[d] = (uint64_t)json_integer_value(v);
    }
    if (rc == KVS_OK && r->shape[0] != 2) rc = kv_meta_error(name, "\"shape\" must start with 2");
    static const char *const keys[2] = {"k", "v"};
    for (int s = 0; rc == KVS_OK && s < 2; s++) {
        json_t *slot = json_object_get(root, keys[s]);
        if (slot == NULL) continue;
        char what[160];
        r->slot[s] = kv_tensor(in, slot, "tensor");
        if (r->slot[s] < 0) {
            snprintf(what, sizeof what, "\"%s\" names no tensor of the file", keys[s]);
            rc = kv_meta_error(name, what);
            break;
        }
        kvs_st_dtype sd = in->tensors[r->slot[s]].dtype;
        int fp8 = sd == KVS_ST_F8_E4M3 || sd == KVS_ST_F8_E5M2;
        if (!fp8 && sd != kvs_st_dtype_from_kvs(r->dtype)) {
            snprintf(what, sizeof what, "tensor '%s' is %s; it must be %s or an fp8 dtype",
                     in->tensors[r->slot[s]].name, kvs_st_dtype_name(sd),
                     kvs_st_dtype_name(kvs_st_dtype_from_kvs(r->dtype)));
            rc = kv_meta_error(name, what);
            break;
        }
        if (fp8 != (json_object_get(slot, "scale") != NULL)) {
            snprintf(what, sizeof what, "\"%s\" has %s", keys[s],
                     fp8 ? "fp8 codes but no scales" : "scales but is not fp8");
            rc = kv_meta_error(name, what);
            break;
        }
        if (!fp8) continue;
        r->scale[s] = kv_tensor(in, slot, "scale");
        const char *scope = json_string_value(json_object_get(slot, "scope"));
        json_t *grid = json_object_get(slot, "grid");
        r->scope[s] = KVS_KV_SPLIT_SCALE_PER_TENSOR;
        if (scope && strcmp(scope, "per_layer") == 0) r->scope[s] = KVS_KV_SPLIT_SCALE_PER_LAYER;
        else if (scope && strcmp(scope, "per_layer_head") == 0) r->scope[s] = KVS_KV_SPLIT_SCALE_PER_LAYER_HEAD;
        else if (scope && strcmp(scope, "per_token") == 0) r->scope[s] = KVS_KV_SPLIT_SCALE_PER_TOKEN;
        else if (scope == NULL || strcmp(scope, "per_tensor") != 0) {
            snprintf(what, sizeof what, "unknown \"scope\" of \"%s\"", keys[s]);
            rc = kv_meta_error(name, what);
            break;
        }
        if (r->scale[s] < 0 || in->tensors[r->scale[s]].dtype != KVS_ST_F32) {
            snprintf(what, sizeof what, "the scales of \"%s\" name no F32 tensor of the file",
                     keys[s]);
            rc = kv_meta_error(name, what);
            break;
        }
        if (r->scope[s] != KVS_KV_SPLIT_SCALE_PER_TENSOR) {
            for (int g = 0; g < 3; g++) {
                json_t *v = json_array_get(grid, (size_t)g);
                if (!json_is_integer(v) || json_integer_value(v) < 0) {
                    snprintf(what, sizeof what, "a scoped \"%s\" needs a \"grid\" of 3 counts",
                             keys[s]);
                    rc = kv_meta_error(name, what);
                    break;
                }
                r->grid[s][g] = (uint64_t)json_integer_value(v);
            }
        } else if (in->tensors[r->scale[s]].numel != 1) {
            snprintf(what, sizeof what, "the per-tensor scale of \"%s\" is not one value", keys[s]);
            rc = kv_meta_error(name, what);
        }
    }
    if (rc == KVS_OK && r->slot[1] < 0) rc = kv_meta_error(name, "V is not stored");
    json_decref(root);
    return rc;
}

/* Rebuild the kv_split blob of `r` from its tensors (docs/kv_split_format.md),
 * so the kv_split deserializer checks and reads it. */
static int kv_build_blob(const kvs_st_file *in, const kv_restore *r, uint8_t **out, size_t *len)
{
    uint64_t plen[2] = {0, 0}, total = KVS_KV_SPLIT_HEADER_SIZE + KVS_KV_SPLIT_TRAILER_SIZE;
    int version = 1;
    for (int s = 0; s < 2; s++) {
        if (r->slot[s] < 0) continue;
        const kvs_st_tensor *t = &in->tensors[r->slot[s]];
        plen[s] = t->end - t->begin;
        if (r->scale[s] >= 0 && r->scope[s] != KVS_KV_SPLIT_SCALE_PER_TENSOR) {
            version = 2;
            plen[s] += 24 + 4 * in->tensors[r->scale[s]].numel;
        }
        total += plen[s];
    }
    uint8_t *b = calloc(1, (size_t)total);
    if (b == NULL) return kvs_set_error(KVS_ENOMEM, "out of memory: %llu bytes", (unsigned long long)total);
    memcpy(b, KVS_KV_SPLIT_MAGIC, 4);
    put_le16(b + 4, (uint16_t)version);
    b[6] = 2;
    b[7] = (uint8_t)((r->slot[0] >= 0 ? 1 : 0) | (r->slot[1] >= 0 ? 2 : 0));
    put_le64(b + 8, total);
    uint64_t off = KVS_KV_SPLIT_HEADER_SIZE;
    for (int s = 0; s < 2; s++) {
        if (r->slot[s] < 0) continue;
        const kvs_st_tensor *t = &in->tensors[r->slot[s]];
        uint8_t *d = b + 16 + 32 * s;
        kvs_dtype stored = r->dtype;
        kvs_st_dtype_to_kvs(t->dtype, &stored); /* checked by kv_parse */
        int scoped = r->scale[s] >= 0 && r->scope[s] != KVS_KV_SPLIT_SCALE_PER_TENSOR;
        float scale = 1.0f;
        if (r->scale[s] >= 0 && !scoped) memcpy(&scale, in->tensors[r->scale[s]].data, 4);
        uint32_t scale_bits;
        memcpy(&scale_bits, &scale, 4);
        d[0] = (uint8_t)r->dtype;
        d[1] = (uint8_t)stored;
        d[2] = scoped ? (uint8_t)r->scope[s] : 0;
        put_le32(d + 4, scale_bits);
        put_le64(d + 8, t->numel);
        put_le64(d + 16, off);
        put_le64(d + 24, plen[s]);
        uint8_t *p = b + off;
        if (scoped) {
            const kvs_st_tensor *sc = &in->tensors[r->scale[s]];
            for (int g = 0; g < 3; g++) put_le64(p + 8 * g, r->grid[s][g]);
            if (sc->numel) memcpy(p + 24, sc->data, 4 * sc->numel);
            p += 24 + 4 * sc->numel;
        }
        if (t->end > t->begin) memcpy(p, t->data, (size_t)(t->end - t->begin));
        off += plen[s];
    }
    put_le32(b + off, kvs_crc32c(0, b, (size_t)off));
    *out = b;
    *len = (size_t)total;
    return KVS_OK;
}

/* Restore the [2, ...] tensor of `r` into dst (numel x dtype bytes) with
 * the kv_split deserializer. */
static int kv_restore_tensor(const kvs_st_file *in, kvs_multi_deserializer *de,
                             const kv_restore *r, kvs_dtype dtype, void *dst)
{
    uint8_t *blob = NULL;
    size_t len = 0;
    int rc = kv_build_blob(in, r, &blob, &len);
    static const uint64_t one = 1;
    kvs_layout half, blob_layout;
    if (rc == KVS_OK)
        rc = r->ndim == 1 ? kvs_enc_layout(1, &one, dtype, &half)
                          : kvs_enc_layout(r->ndim - 1, r->shape + 1, dtype, &half);
    size_t half_bytes = (size_t)(r->numel / 2) * kvs_dtype_size(dtype);
    kvs_memobj src, k, v;
    if (rc == KVS_OK) rc = kvs_layout_flat(&blob_layout, len, KVS_DTYPE_UINT8);
    if (rc == KVS_OK) rc = kvs_memobj_init(&src, blob, len, &blob_layout, KVS_FMT_BINARY_BUFFER);
    if (rc == KVS_OK) rc = kvs_memobj_init(&k, dst, half_bytes, &half, KVS_FMT_UNDEFINED);
    if (rc == KVS_OK)
        rc = kvs_memobj_init(&v, (uint8_t *)dst + half_bytes, half_bytes, &half, KVS_FMT_UNDEFINED);
    kvs_memobj *group[2] = {&k, &v};
    if (rc == KVS_OK) rc = kvs_multi_deserialize(de, &src, group, 2, NULL);
    free(blob);
    if (rc) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        return kvs_set_error(rc, "tensor '%s': %s", r->name, msg);
    }
    return KVS_OK;
}

/* Make ctx->scratch hold at least nbytes. */
static int grow_scratch(decode_ctx *ctx, size_t nbytes)
{
    if (nbytes <= ctx->scratch_cap) return KVS_OK;
    free(ctx->scratch);
    ctx->scratch_cap = 0;
    if ((ctx->scratch = malloc(nbytes)) == NULL)
        return kvs_set_error(KVS_ENOMEM, "out of memory: %zu bytes", nbytes);
    ctx->scratch_cap = nbytes;
    return KVS_OK;
}

static int produce_decoded(void *vctx, size_t index, const void **data)
{
    decode_ctx *ctx = vctx;
    if (ctx->kv_of) {
        const kv_restore *r = &ctx->kv[ctx->kv_of[index]];
        size_t nbytes = (size_t)r->numel * kvs_dtype_size(ctx->dtype[index]);
        if (grow_scratch(ctx, nbytes) != KVS_OK) return KVS_ENOMEM;
        int rc = kv_restore_tensor(ctx->in, ctx->enc->multi_serde.deserializer, r,
                                   ctx->dtype[index], ctx->scratch);
        if (rc) {
            char msg[KVS_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", kvs_last_error());
            return kvs_set_error(rc, "%s: %s", ctx->in_path, msg);
        }
        *data = ctx->scratch;
        return KVS_OK;
    }
    const kvs_enc_info *info = &ctx->enc->info[index];
    const kvs_st_tensor *t = &ctx->in->tensors[index];
    uint64_t numel = ctx->plain ? t->numel : info->numel;
    size_t nbytes = (size_t)numel * kvs_dtype_size(ctx->dtype[index]);
    if (grow_scratch(ctx, nbytes) != KVS_OK) return KVS_ENOMEM;
    int rc;
    if (ctx->plain) {
        kvs_dtype fp8 = t->dtype == KVS_ST_F8_E5M2 ? KVS_DTYPE_FLOAT8_E5M2 : KVS_DTYPE_FLOAT8_E4M3FN;
        rc = kvs_fp8_decode(t->data, fp8, ctx->scratch, ctx->dtype[index], (size_t)numel);
        if (rc) {
            char msg[KVS_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", kvs_last_error());
            rc = kvs_set_error(rc, "tensor '%s': %s", t->name, msg);
        }
    } else {
        rc = kvs_enc_decode_tensor(ctx->in, ctx->enc, index, ctx->dtype[index], ctx->scratch);
    }
    if (rc) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        return kvs_set_error(rc, "%s: %s", ctx->in_path, msg);
    }
    *data = ctx->scratch;
    return KVS_OK;
}

int kvs_cmd_decode(int argc, char **argv)
{
    static const struct option opts[] = {
        {"dtype", required_argument, NULL, 'd'},
        {"key-file", required_argument, NULL, 'k'},
        {"transform", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *dtype_text = NULL, *transform = NULL;
    char *key_files[KVS_TOOL_MAX_KEY_FILES];
    size_t nkeys = 0;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': dtype_text = optarg; break;
        case 't': transform = optarg; break;
        case 'k':
            if (kvs_tool_add_key_file("decode", key_files, &nkeys, optarg) != 0) return 2;
            break;
        case 'h': fputs(decode_usage, stdout); return 0;
        case ':':
            fprintf(stderr, "kvserde decode: option '%s' needs a value\n\n%s", argv[optind - 1],
                    decode_usage);
            return 2;
        default:
            fprintf(stderr, "kvserde decode: unknown option '%s'\n\n%s", argv[optind - 1],
                    decode_usage);
            return 2;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "kvserde decode: expected IN and OUT, got %d argument%s\n\n%s",
                argc - optind, argc - optind == 1 ? "" : "s", decode_usage);
        return 2;
    }
    kvs_dtype want = KVS_DTYPE_FLOAT32;
    if (dtype_text != NULL &&
        (kvs_dtype_parse(dtype_text, &want) != KVS_OK ||
         (want != KVS_DTYPE_FLOAT32 && want != KVS_DTYPE_FLOAT16 &&
          want != KVS_DTYPE_BFLOAT16))) {
        fprintf(stderr,
                "kvserde decode: --dtype must be bfloat16, float16 or float32, got '%s'\n",
                dtype_text);
        return 2;
    }
    const char *in_path = argv[optind], *out_path = argv[optind + 1];

    /* Frames are read by a deserializer that carries only the key files. */
    kvs_serde_pair frames = {0};
    if (kvs_tool_frame_deserializer(key_files, nkeys, transform, &frames) != KVS_OK) {
        fprintf(stderr, "kvserde decode: %s: %s\n", transform ? "--key-file / --transform"
                                                              : "--key-file",
                kvs_last_error());
        return 1;
    }
    kvs_st_mapped map;
    kvs_st_file in;
    if (kvs_st_open(in_path, &map, &in) != KVS_OK) {
        fprintf(stderr, "kvserde decode: %s\n", kvs_last_error());
        kvs_serde_pair_destroy(&frames);
        return 1;
    }
    int status = 1;
    kvs_enc_file enc = {0};
    decode_ctx ctx = {0};
    kvs_st_out *outs = NULL;
    kvs_st_meta *meta = NULL;
    size_t nmeta = 0, ndecoded = 0, n = in.ntensors, nout = 0;
    uint8_t *claimed = NULL; /* multi: tensors that are parts of a kv_split one */
    uint64_t in_bytes = 0, out_bytes = 0;
    if (kvs_enc_open(&in, frames.deserializer, &enc) != KVS_OK) {
        fprintf(stderr, "kvserde decode: %s: %s\n", in_path, kvs_last_error());
        goto out;
    }
    if (!enc.encoded) {
        /* A plain fp8 file (PyTorch, vLLM): its F8 tensors are decoded. */
        for (size_t i = 0; i < n && !ctx.plain; i++)
            ctx.plain = in.tensors[i].dtype == KVS_ST_F8_E4M3 || in.tensors[i].dtype == KVS_ST_F8_E5M2;
        if (!ctx.plain) {
            fprintf(stderr,
                    "kvserde decode: %s: not a kvserde-encoded file (no '%s' metadata) and no "
                    "F8_E4M3 or F8_E5M2 tensor to decode\n",
                    in_path, KVS_META_SERDE);
            goto out;
        }
    }
    /* A multi-output serde (kv_split): each kvserde.kv_split.NAME entry
     * gives back tensor NAME from its stored parts. */
    size_t nkv = 0;
    if (enc.multi) {
        ctx.kv = calloc(in.nmeta ? in.nmeta : 1, sizeof *ctx.kv);
        claimed = calloc(n ? n : 1, 1);
        if (!ctx.kv || !claimed) {
            fprintf(stderr, "kvserde decode: out of memory\n");
            goto out;
        }
        for (size_t i = 0; i < in.nmeta; i++) {
            const char *key = in.meta[i].key;
            if (strncmp(key, KVS_META_KV_SPLIT, strlen(KVS_META_KV_SPLIT)) != 0) continue;
            kv_restore *r = &ctx.kv[nkv++];
            if (kv_parse(&in, key + strlen(KVS_META_KV_SPLIT), in.meta[i].value, r) != KVS_OK) {
                fprintf(stderr, "kvserde decode: %s: %s\n", in_path, kvs_last_error());
                goto out;
            }
            if (r->slot[0] < 0) {
                fprintf(stderr,
                        "kvserde decode: %s: tensor '%s' cannot be restored: it was encoded "
                        "with kv_split mode v_only, so only V is stored ('%s'); K was never "
                        "stored\n",
                        in_path, r->name, in.tensors[r->slot[1]].name);
                goto out;
            }
            for (int s = 0; s < 2; s++) {
                if (r->slot[s] >= 0) claimed[r->slot[s]] = 1;
                if (r->scale[s] >= 0) claimed[r->scale[s]] = 1;
            }
        }
    }
    outs = calloc(n + nkv ? n + nkv : 1, sizeof *outs);
    ctx.dtype = calloc(n + nkv ? n + nkv : 1, sizeof *ctx.dtype);
    meta = calloc(in.nmeta ? in.nmeta : 1, sizeof *meta);
    if (enc.multi) ctx.kv_of = calloc(n + nkv ? n + nkv : 1, sizeof *ctx.kv_of);
    if (!outs || !ctx.dtype || !meta || (enc.multi && !ctx.kv_of)) {
        fprintf(stderr, "kvserde decode: out of memory\n");
        goto out;
    }
    ctx.in_path = in_path;
    ctx.in = &in;
    ctx.enc = &enc;
    for (size_t i = 0; i < in.nmeta; i++)
        if (strncmp(in.meta[i].key, KVS_META_PREFIX, strlen(KVS_META_PREFIX)) != 0)
            meta[nmeta++] = in.meta[i];
    for (size_t r = 0; r < nkv; r++) {
        kvs_st_out *o = &outs[nout];
        kvs_dtype dt = dtype_text ? want : ctx.kv[r].dtype;
        uint64_t nbytes;
        if (__builtin_mul_overflow(ctx.kv[r].numel, (uint64_t)kvs_dtype_size(dt), &nbytes)) {
            fprintf(stderr, "kvserde decode: %s: tensor '%s' is too large\n", in_path,
                    ctx.kv[r].name);
            goto out;
        }
        ctx.dtype[nout] = dt;
        ctx.kv_of[nout++] = (long)r;
        o->name = ctx.kv[r].name;
        o->dtype = kvs_st_dtype_from_kvs(dt);
        o->ndim = ctx.kv[r].ndim;
        o->shape = ctx.kv[r].shape;
        o->nbytes = nbytes;
        o->data = NULL; /* restored on demand */
        out_bytes += nbytes;
        ndecoded++;
    }
    for (size_t i = 0; i < n; i++) {
        const kvs_st_tensor *t = &in.tensors[i];
        const kvs_enc_info *info = &enc.info[i];
        in_bytes += t->end - t->begin;
        if (claimed && claimed[i]) continue;
        if (ctx.kv_of) ctx.kv_of[nout] = -1;
        kvs_st_out *o = &outs[nout++];
        o->name = t->name;
        int plain_fp8 = ctx.plain && (t->dtype == KVS_ST_F8_E4M3 || t->dtype == KVS_ST_F8_E5M2);
        if (!plain_fp8 && info->kind == KVS_ENC_NONE) {
            o->dtype = t->dtype;
            o->ndim = t->ndim;
            o->shape = t->shape;
            o->nbytes = t->end - t->begin;
            o->data = t->data;
        } else {
            /* An encoded tensor, or an fp8 one of a plain file (its own
             * shape, bfloat16 unless --dtype says otherwise). */
            kvs_dtype dt = dtype_text ? want : plain_fp8 ? KVS_DTYPE_BFLOAT16 : info->orig_dtype;
            uint64_t numel = plain_fp8 ? t->numel : info->numel, nbytes;
            if (__builtin_mul_overflow(numel, (uint64_t)kvs_dtype_size(dt), &nbytes)) {
                fprintf(stderr, "kvserde decode: %s: tensor '%s' is too large\n", in_path,
                        t->name);
                goto out;
            }
            ctx.dtype[nout - 1] = dt;
            o->dtype = kvs_st_dtype_from_kvs(dt);
            o->ndim = plain_fp8 ? t->ndim : info->ndim;
            o->shape = plain_fp8 ? t->shape : info->shape;
            o->nbytes = nbytes;
            o->data = NULL; /* decoded on demand */
            ndecoded++;
        }
        out_bytes += o->nbytes;
    }
    if (kvs_safetensors_write(out_path, outs, nout, meta, nmeta, produce_decoded, &ctx) != KVS_OK) {
        fprintf(stderr, "kvserde decode: %s\n", kvs_last_error());
        goto out;
    }
    printf("%s: decoded %zu of %zu tensors; data %llu -> %llu bytes\n", out_path, ndecoded, n,
           (unsigned long long)in_bytes, (unsigned long long)out_bytes);
    status = 0;

out:
    for (size_t i = 0; ctx.kv && i < in.nmeta; i++) free(ctx.kv[i].shape);
    free(ctx.kv);
    free(ctx.kv_of);
    free(claimed);
    free(outs);
    free(meta);
    free(ctx.dtype);
    free(ctx.scratch);
    kvs_enc_close(&enc);
    kvs_st_close(&map, &in);
    kvs_serde_pair_destroy(&frames);
    return status;
}
