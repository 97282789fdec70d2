/* safetensors.h - the tool's reader, validator and writer of safetensors
 * files, and the conventions kvserde uses to store encoded tensors in them.
 *
 * The format: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON (the
 * header), then the data section. The header is an object mapping each
 * tensor name to {"dtype": "F16", "shape": [2, 3], "data_offsets": [b, e]}
 * (offsets relative to the first byte after the header), plus an optional
 * "__metadata__" object of string -> string.
 *
 * The reader validates as the reference implementation (the Rust
 * `safetensors` crate) does: N <= 100,000,000; the header fits in the file,
 * is valid UTF-8 JSON starting with '{' (trailing spaces allowed); every
 * dtype is known; the tensors, ordered by offset, are contiguous from 0 with
 * no gap and no overlap and end exactly at the end of the file; and each
 * tensor's span equals its shape's element count x its dtype's size, without
 * overflow. Duplicate JSON keys are refused too (the reference silently
 * keeps the last one). Every refusal is KVS_ECORRUPT with a message that
 * names the tensor and the numbers:
 *   "safetensors: tensor 'k.0': data_offsets [0, 100] span 100 bytes but
 *    shape [5, 8] x F16 needs 80"
 *
 * The writer lays tensors out as the reference does (by dtype, largest
 * alignment first, then by name), writes the header as compact JSON
 * ("__metadata__" first with its keys sorted, then the tensors in data
 * order, each as {"dtype","shape","data_offsets"}) padded with spaces to a
 * multiple of 8 bytes, and publishes the file atomically: a temporary file in
 * the destination's directory, fsync, rename; on any failure the temporary
 * file is removed and the destination is untouched.
 *
 * The header cap allows about 900,000 tensors with typical names (up to
 * about 1.8 million with minimal entries), so nothing here is quadratic:
 * parsing, writing, duplicate checks and every lookup by name (kvs_st_find,
 * kvs_st_meta_get, through name_index.h) are O(n log n) in all.
 */
#ifndef KVSERDE_TOOL_SAFETENSORS_H
#define KVSERDE_TOOL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kvserde/kvserde.h"
#include "name_index.h"

/* The header size cap of the reference implementation. */
#define KVS_ST_MAX_HEADER 100000000u

/* safetensors dtypes, in the reference's order (which is also the writer's
 * layout order, last first). */
typedef enum kvs_st_dtype {
    KVS_ST_BOOL,
    KVS_ST_F4,
    KVS_ST_F6_E2M3,
    KVS_ST_F6_E3M2,
    KVS_ST_U8,
    KVS_ST_I8,
    KVS_ST_F8_E5M2,
    KVS_ST_F8_E4M3,
    KVS_ST_F8_E8M0,
    KVS_ST_I16,
    KVS_ST_U16,
    KVS_ST_F16,
    KVS_ST_BF16,
    KVS_ST_I32,
    KVS_ST_U32,
    KVS_ST_F32,
    KVS_ST_C64,
    KVS_ST_F64,
    KVS_ST_I64,
    KVS_ST_U64,
    KVS_ST_NDTYPES
} kvs_st_dtype;

/* "F16", "BF16", ...; "?" for an out-of-range value. */
const char *kvs_st_dtype_name(kvs_st_dtype dtype);
/* Bits per element (4, 6, 8, 16, 32 or 64); 0 for an out-of-range value. */
unsigned kvs_st_dtype_bits(kvs_st_dtype dtype);
/* 0 and *out set if `name` is a safetensors dtype name, else -1. */
int kvs_st_dtype_parse(const char *name, kvs_st_dtype *out);
/* The kvserde dtype of a safetensors dtype (F32, F16, BF16, U8, F8_E4M3,
 * F8_E5M2): 0 and *out set, else -1. */
int kvs_st_dtype_to_kvs(kvs_st_dtype dtype, kvs_dtype *out);
/* The safetensors dtype of a kvserde dtype (always exists). */
kvs_st_dtype kvs_st_dtype_from_kvs(kvs_dtype dtype);

/* One tensor of a parsed file. */
typedef struct kvs_st_tensor {
    char *name;
    kvs_st_dtype dtype;
    uint32_t ndim;
    uint64_t *shape; /* ndim sizes (NULL when ndim == 0: a scalar) */
    uint64_t numel;  /* product of the sizes */
    uint64_t begin;  /* data_offsets, relative to the data section */
    uint64_t end;
    const uint8_t *data; /* the parsed buffer + data section + begin */
} kvs_st_tensor;

/* One "__metadata__" entry. */
typedef struct kvs_st_meta {
    char *key;
    char *value;
} kvs_st_meta;

/* A parsed file. It points into the parsed buffer (tensor data), which must
 * outlive it. */
typedef struct kvs_st_file {
    uint64_t header_len;  /* N */
    uint64_t data_start;  /* 8 + N: where the data section begins */
    uint64_t data_len;    /* bytes of the data section */
    size_t ntensors;
    kvs_st_tensor *tensors; /* in data order (by offset) */
    int has_metadata;       /* the header has a "__metadata__" object */
    size_t nmeta;
    kvs_st_meta *meta;      /* sorted by key (byte order) */
    kvs_name_index tensor_names; /* tensors by name: kvs_st_find */
    kvs_name_index meta_keys;    /* meta by key: kvs_st_meta_get */
} kvs_st_file;

/* Parse and validate a whole file held in buf[0..len). A pure function of
 * the bytes (no I/O): safe on any input. On success fills *out (free with
 * kvs_st_file_free); on failure returns KVS_ECORRUPT (or KVS_ENOMEM) with
 * the reason, and *out is zeroed. */
int kvs_safetensors_parse(const uint8_t *buf, size_t len, kvs_st_file *out);
void kvs_st_file_free(kvs_st_file *file);

/* The tensor named `name`, or NULL. O(log n). */
const kvs_st_tensor *kvs_st_find(const kvs_st_file *file, const char *name);
/* The metadata value under `key`, or NULL. O(log n). */
const char *kvs_st_meta_get(const kvs_st_file *file, const char *key);

/* "[5, 8]" for a shape, written into buf (truncated to size). Returns buf. */
char *kvs_st_format_shape(uint32_t ndim, const uint64_t *shape, char *buf, size_t size);

/* ----- Reading files ------------------------------------------------------ */

/* A file's bytes in memory: mapped (regular files) or read (anything else,
 * such as a pipe). */
typedef struct kvs_st_mapped {
    const uint8_t *data;
    size_t len;
    int mapped; /* 1: munmap on close; 0: free */
} kvs_st_mapped;

/* Map or read the whole of `path`. KVS_EIO with "PATH: strerror" on
 * failure. */
int kvs_st_map(const char *path, kvs_st_mapped *out);
void kvs_st_unmap(kvs_st_mapped *m);

/* Map and parse `path`; a parse failure's message is prefixed with the path
 * ("in.safetensors: safetensors: ..."). Release with kvs_st_close(). */
int kvs_st_open(const char *path, kvs_st_mapped *map, kvs_st_file *file);
void kvs_st_close(kvs_st_mapped *map, kvs_st_file *file);

/* ----- Writing files ------------------------------------------------------ */

/* One tensor to write. Its bytes are `data` if not NULL, else what the
 * writer's produce callback returns for it. */
typedef struct kvs_st_out {
    const char *name;
    kvs_st_dtype dtype;
    uint32_t ndim;
    const uint64_t *shape;
    uint64_t nbytes; /* must equal the shape's element count x dtype size */
    const void *data;
} kvs_st_out;

/* Gives the bytes of tensors[index] (nbytes of them), valid until the next
 * call; called once per tensor whose data is NULL, in layout order. Return
 * KVS_OK, or a KVS_E* code with kvs_set_error() to abandon the write. */
typedef int (*kvs_st_produce_fn)(void *ctx, size_t index, const void **data);

/* Build the header bytes (the 8-byte size, then the padded JSON) for these
 * tensors and metadata entries ("__metadata__" is written if nmeta > 0),
 * and the layout: order[i] is the index in `tensors` of the i-th tensor in
 * the data section. Refused (KVS_EINVAL) for a duplicate or reserved name,
 * a duplicate metadata key, nbytes that does not match shape x dtype, or a
 * header over KVS_ST_MAX_HEADER (which no reader would open).
 * *header is malloc'd; order must hold ntensors entries. */
int kvs_st_build_header(const kvs_st_out *tensors, size_t ntensors,
                        const kvs_st_meta *meta, size_t nmeta, uint8_t **header,
                        size_t *header_len, size_t *order);

/* Write a safetensors file to `path` atomically (temporary file in the same
 * directory, fsync, rename, directory fsync). On failure nothing is left
 * behind and `path` is untouched. KVS_EIO for system errors ("safetensors:
 * cannot create a temporary file in '/x': Permission denied"). */
int kvs_safetensors_write(const char *path, const kvs_st_out *tensors,
                          size_t ntensors, const kvs_st_meta *meta, size_t nmeta,
                          kvs_st_produce_fn produce, void *ctx);

/* ----- kvserde's conventions inside safetensors files ------------------- */

/* Metadata keys `kvserde encode` writes (docs/cli.md):
 *   kvserde.format          "1"
 *   kvserde.serde           the serde config, compact JSON with sorted keys
 *   kvserde.dtype.<name>    original dtype of an encoded tensor ("bfloat16")
 *   kvserde.shape.<name>    original shape of a tensor stored as an opaque
 *                           U8 blob ("[2,4,8]"), frames included (a frame
 *                           records its layout too: the two must agree);
 *                           absent for native fp8 ones
 * Every key starting with "kvserde." belongs to kvserde. */
#define KVS_META_PREFIX "kvserde."
#define KVS_META_FORMAT "kvserde.format"
#define KVS_META_FORMAT_VERSION "1"
#define KVS_META_SERDE "kvserde.serde"
#define KVS_META_DTYPE "kvserde.dtype."
#define KVS_META_SHAPE "kvserde.shape."
/* kvserde.kv_split.<name>: a tensor the kv_split serde (a multi-output
 * serde) split into <name>.k / <name>.v (+ <name>.k_scale / <name>.v_scale
 * for fp8 slots); the value is compact JSON with sorted keys recording the
 * original dtype and shape and each stored slot (docs/cli.md). */
#define KVS_META_KV_SPLIT "kvserde.kv_split."

/* How one tensor of a file was stored by `kvserde encode`. */
typedef enum kvs_enc_kind {
    KVS_ENC_NONE = 0, /* not encoded: kept as it was */
    KVS_ENC_FP8,      /* native F8_E4M3 / F8_E5M2 tensor, shape kept */
    KVS_ENC_BLOB,     /* U8 tensor holding the serde's serialized bytes */
    KVS_ENC_FRAME,    /* U8 tensor holding a frame (pipeline.h), whatever
                       * kvserde.serde says: read by the frame deserializer */
} kvs_enc_kind;

typedef struct kvs_enc_info {
    kvs_enc_kind kind;
    kvs_dtype orig_dtype; /* float32, float16 or bfloat16 */
    uint32_t ndim;        /* the original shape */
    uint64_t *shape;
    uint64_t numel;
    kvs_layout layout;    /* what the serde saw: kvs_enc_layout() */
    kvs_memory_format frame_format; /* KVS_ENC_FRAME: the frame's own */
} kvs_enc_info;

/* The layout the serde is given for a tensor: its shape when it has at most
 * KVS_MAX_DIMS dimensions, else one flat dimension, of `dtype`. */
int kvs_enc_layout(uint32_t ndim, const uint64_t *shape, kvs_dtype dtype, kvs_layout *out);

/* The canonical text of a serde config: compact JSON, keys sorted
 * (malloc'd). KVS_EINVAL for text that is not a JSON object. */
int kvs_serde_config_canonical(const char *json_text, char **out);

/* Whether a serde config is the fp8 serde: 1 with *fp8 set to its fp8_dtype
 * (float8_e4m3fn when absent), 0 for another type, KVS_EINVAL if the text
 * is not a JSON object with a string "type". */
int kvs_serde_config_fp8(const char *json_text, kvs_dtype *fp8);

/* Whether a serde config names a multi-output serde (registry.h): 1 if so,
 * 0 for a single-tensor or unknown type, KVS_EINVAL if the text is not a
 * JSON object with a string "type". */
int kvs_serde_config_multi(const char *json_text);

/* An opened encoded file: its serde and per-tensor encoding info. */
typedef struct kvs_enc_file {
    int encoded;          /* the file has kvserde.serde metadata */
    int pipeline;         /* kvserde.serde is the pipeline serde */
    kvs_serde_pair serde; /* built from kvserde.serde (when encoded and not
                           * the pipeline serde, whose config may name key
                           * files this machine does not have) */
    kvs_deserializer *frames; /* borrowed: reads the KVS_ENC_FRAME tensors */
    int multi;            /* kvserde.serde is a multi-output serde (kv_split):
                           * its tensors are described by kvserde.kv_split.*
                           * entries, every info[] entry is KVS_ENC_NONE */
    kvs_multi_serde_pair multi_serde; /* built from kvserde.serde when multi */
    size_t ntensors;
    kvs_enc_info *info;   /* ntensors entries, parallel to file->tensors */
} kvs_enc_file;

/* Read kvserde's metadata of a parsed file and check it against the
 * tensors: the format version, the serde config (built with the registry,
 * except the pipeline serde's), each kvserde.dtype / kvserde.shape entry
 * naming an existing tensor of the right storage dtype and size. A U8 blob
 * whose bytes are a frame (kvs_frame_detect) is KVS_ENC_FRAME, decoded by
 * `frames` (kvs_tool_frame_deserializer, frames.h; borrowed, must outlive
 * *out) whatever kvserde.serde says; its header must parse and record the
 * layout kvserde.shape / kvserde.dtype give ("kvserde metadata: tensor 'x':
 * the frame holds [2x4 float32] but kvserde.shape.x and kvserde.dtype.x
 * say [8 float32]"). With the pipeline serde every blob must be a frame.
 * KVS_ECORRUPT (or the registry's code) with the reason. A file without
 * kvserde.serde is "not encoded" (every tensor KVS_ENC_NONE) unless it has
 * other kvserde.* entries, which is refused. */
int kvs_enc_open(const kvs_st_file *file, kvs_deserializer *frames, kvs_enc_file *out);
void kvs_enc_close(kvs_enc_file *enc);

/* Decode tensor i (encoded: kind != NONE) of `file` into dst as dtype
 * `dtype` (float32, float16 or bfloat16): the element count of
 * info[i].layout x dtype size bytes. Native fp8 tensors go through the
 * serde's deserializer straight to `dtype`; blobs and frames are
 * deserialized to their original dtype and then converted (round to nearest
 * even) if asked for another. A failure's message starts with the tensor's
 * name ("tensor 'x': crc32c: ..."). */
int kvs_enc_decode_tensor(const kvs_st_file *file, kvs_enc_file *enc, size_t i,
                          kvs_dtype dtype, void *dst);

/* Convert n elements between float32, float16 and bfloat16 (through float32,
 * round to nearest even; the same dtype copies). */
void kvs_convert_floats(const void *src, kvs_dtype src_dtype, void *dst,
                        kvs_dtype dst_dtype, size_t n);

#endif /* KVSERDE_TOOL_SAFETENSORS_H */
