/* kvserde encode - put every float tensor of a safetensors file through a
 * serde. docs/cli.md describes the command and the file it writes. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "kvserde/kvserde.h"
#include "safetensors.h"

static const char encode_usage[] =
    "usage: kvserde encode [--serde JSON] [--raw] IN.safetensors OUT.safetensors\n"
    "\n"
    "Puts every float32, float16 and bfloat16 tensor of IN through the serde and\n"
    "writes OUT; every other tensor and the __metadata__ entries are kept.\n"
    "\n"
    "  --serde JSON  the serde config (default {\"type\": \"fp8\"}), e.g.\n"
    "                '{\"type\": \"fp8\", \"fp8_dtype\": \"float8_e5m2\"}'\n"
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
    free(ctx->aligned);
    ctx->aligned = NULL;
    if (rc == KVS_OK && ((uintptr_t)data % kvs_dtype_size(dtype)) != 0 && nbytes > 0) {
        /* A file written without alignment: the kernels want aligned
         * elements, so work on a copy. */
        if ((ctx->aligned = malloc(nbytes)) == NULL)
            rc = kvs_set_error(KVS_ENOMEM, "out of memory: %zu bytes", nbytes);
        else
            data = memcpy(ctx->aligned, data, nbytes);
    }
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
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *serde_text = "{\"type\": \"fp8\"}";
    int raw = 0, c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 's': serde_text = optarg; break;
        case 'r': raw = 1; break;
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
    char *canon = NULL;
    kvs_dtype fp8 = KVS_DTYPE_FLOAT8_E4M3FN;
    int is_fp8 = 0;
    if (kvs_serde_create_pair(serde_text, &serde) != KVS_OK ||
        kvs_serde_config_canonical(serde_text, &canon) != KVS_OK ||
        (is_fp8 = kvs_serde_config_fp8(serde_text, &fp8)) < 0) {
        fprintf(stderr, "kvserde encode: --serde: %s\n", kvs_last_error());
        kvs_serde_pair_destroy(&serde);
        free(canon);
        return 2;
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
    size_t nmeta = 0, nencoded = 0;
    uint64_t in_bytes = 0, out_bytes = 0;
    if (kvs_st_open(in_path, &map, &in) != KVS_OK) {
        fprintf(stderr, "kvserde encode: %s\n", kvs_last_error());
        kvs_serde_pair_destroy(&serde);
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
    outs = calloc(n ? n : 1, sizeof *outs);
    ctx.orig_dtype = calloc(n ? n : 1, sizeof *ctx.orig_dtype);
    ctx.src_index = calloc(n ? n : 1, sizeof *ctx.src_index);
    blobs = calloc(n ? n : 1, sizeof *blobs);
    blob_sizes = calloc(n ? n : 1, sizeof *blob_sizes);
    meta = calloc(in.nmeta + 2 + 2 * n, sizeof *meta);
    if (!outs || !ctx.orig_dtype || !ctx.src_index || !blobs || !blob_sizes || !meta) {
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
        kvs_st_out *o = &outs[i];
        kvs_dtype dt;
        o->name = t->name;
        o->dtype = t->dtype;
        o->ndim = t->ndim;
        o->shape = t->shape;
        o->nbytes = t->end - t->begin;
        o->data = t->data;
        ctx.src_index[i] = i;
        in_bytes += o->nbytes;
        int is_float = kvs_st_dtype_to_kvs(t->dtype, &dt) == 0 &&
                       (dt == KVS_DTYPE_FLOAT32 || dt == KVS_DTYPE_FLOAT16 ||
                        dt == KVS_DTYPE_BFLOAT16);
        if (is_float) {
            ctx.orig_dtype[i] = dt;
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

    if (kvs_safetensors_write(out_path, outs, n, meta, nmeta, produce_fp8, &ctx) != KVS_OK) {
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
    free(canon);
    return status;
}
