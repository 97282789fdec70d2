/* kvserde decode - undo `kvserde encode`: every encoded tensor back to its
 * original dtype (or the one asked for), kvserde's metadata removed. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "frames.h"
#include "kvserde/kvserde.h"
#include "safetensors.h"

static const char decode_usage[] =
    "usage: kvserde decode [--dtype bfloat16|float16|float32] [--key-file F]...\n"
    "                      IN.safetensors OUT.safetensors\n"
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
    "IN may also be a plain safetensors file with F8_E4M3 / F8_E5M2 tensors and\n"
    "no kvserde metadata (as PyTorch or vLLM save them): every fp8 tensor is\n"
    "decoded exactly to --dtype (default bfloat16), everything else is kept.\n"
    "\n"
    "  --dtype D       decode every encoded tensor to D instead of its original\n"
    "                  dtype (bfloat16, float16 or float32; a \"torch.\" prefix is\n"
    "                  accepted)\n"
    "  --key-file F    an aes_gcm key file (repeatable), for encrypted frames\n"
    "  -h, --help      show this help\n"
    "\n"
    "OUT is written to a temporary file next to it and renamed into place, so a\n"
    "failed run leaves no partial OUT.\n"
    "\n"
    "Exit status: 0 success, 1 failure (reason on stderr), 2 usage error.\n";

typedef struct decode_ctx {
    const char *in_path;
    const kvs_st_file *in;
    kvs_enc_file *enc;
    kvs_dtype *dtype; /* per tensor: the dtype to decode to */
    int plain;        /* a plain fp8 file: F8 tensors through kvs_fp8_decode */
    uint8_t *scratch;
    size_t scratch_cap;
} decode_ctx;

static int produce_decoded(void *vctx, size_t index, const void **data)
{
    decode_ctx *ctx = vctx;
    const kvs_enc_info *info = &ctx->enc->info[index];
    const kvs_st_tensor *t = &ctx->in->tensors[index];
    uint64_t numel = ctx->plain ? t->numel : info->numel;
    size_t nbytes = (size_t)numel * kvs_dtype_size(ctx->dtype[index]);
    if (nbytes > ctx->scratch_cap) {
        free(ctx->scratch);
        ctx->scratch_cap = 0;
        if ((ctx->scratch = malloc(nbytes)) == NULL)
            return kvs_set_error(KVS_ENOMEM, "out of memory: %zu bytes", nbytes);
        ctx->scratch_cap = nbytes;
    }
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
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *dtype_text = NULL;
    char *key_files[KVS_TOOL_MAX_KEY_FILES];
    size_t nkeys = 0;
    int c;
    opterr = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case 'd': dtype_text = optarg; break;
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
    if (kvs_tool_frame_deserializer(key_files, nkeys, &frames) != KVS_OK) {
        fprintf(stderr, "kvserde decode: --key-file: %s\n", kvs_last_error());
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
    size_t nmeta = 0, ndecoded = 0, n = in.ntensors;
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
    outs = calloc(n ? n : 1, sizeof *outs);
    ctx.dtype = calloc(n ? n : 1, sizeof *ctx.dtype);
    meta = calloc(in.nmeta ? in.nmeta : 1, sizeof *meta);
    if (!outs || !ctx.dtype || !meta) {
        fprintf(stderr, "kvserde decode: out of memory\n");
        goto out;
    }
    ctx.in_path = in_path;
    ctx.in = &in;
    ctx.enc = &enc;
    for (size_t i = 0; i < in.nmeta; i++)
        if (strncmp(in.meta[i].key, KVS_META_PREFIX, strlen(KVS_META_PREFIX)) != 0)
            meta[nmeta++] = in.meta[i];
    for (size_t i = 0; i < n; i++) {
        const kvs_st_tensor *t = &in.tensors[i];
        const kvs_enc_info *info = &enc.info[i];
        kvs_st_out *o = &outs[i];
        o->name = t->name;
        in_bytes += t->end - t->begin;
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
            ctx.dtype[i] = dt;
            o->dtype = kvs_st_dtype_from_kvs(dt);
            o->ndim = plain_fp8 ? t->ndim : info->ndim;
            o->shape = plain_fp8 ? t->shape : info->shape;
            o->nbytes = nbytes;
            o->data = NULL; /* decoded on demand */
            ndecoded++;
        }
        out_bytes += o->nbytes;
    }
    if (kvs_safetensors_write(out_path, outs, n, meta, nmeta, produce_decoded, &ctx) != KVS_OK) {
        fprintf(stderr, "kvserde decode: %s\n", kvs_last_error());
        goto out;
    }
    printf("%s: decoded %zu of %zu tensors; data %llu -> %llu bytes\n", out_path, ndecoded, n,
           (unsigned long long)in_bytes, (unsigned long long)out_bytes);
    status = 0;

out:
    free(outs);
    free(meta);
    free(ctx.dtype);
    free(ctx.scratch);
    kvs_enc_close(&enc);
    kvs_st_close(&map, &in);
    kvs_serde_pair_destroy(&frames);
    return status;
}
