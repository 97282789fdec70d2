/* stage.h - internal: the stage types of framed pipelines (pipeline.h) and
 * their registry.
 *
 * A pipeline is one typed stage (tensor -> bytes) followed by bytes ->
 * bytes stages. Every stage type has a fixed numeric id and a name; a frame
 * records, per stage, its id and its parameters, so a reader rebuilds the
 * chain from the frame alone (only secret keys come from outside). That is
 * why decoding is an operation of the *type*, fed the parameters read from
 * the frame, while encoding is an operation of an *instance* created from
 * the JSON configuration.
 *
 * Ids are part of the frame format (docs/frame_format.md) and never change
 * meaning: a reader that meets an id it does not know refuses the blob with
 * KVS_EUNSUPPORTED.
 */
#ifndef KVSERDE_FRAME_STAGE_H
#define KVSERDE_FRAME_STAGE_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "kvserde/memobj.h"

/* Stage ids. Typed stages 1-63, bytes stages 64-127. */
enum kvs_stage_id {
    KVS_STAGE_BYTES = 1,   /* typed: the tensor's own bytes */
    KVS_STAGE_FP8 = 2,     /* typed: one fp8 code per element (fp8.h) */
    KVS_STAGE_TRANSFORM_CODED = 3, /* typed: calibrated transform, quantized, entropy-coded */
    KVS_STAGE_INT = 8,     /* typed: grouped integer codes, 2-8 bits (codecs/intq.h) */
    KVS_STAGE_GGML_Q8_0 = 16, /* typed: llama.cpp q8_0 blocks (ggml.h) */
    KVS_STAGE_GGML_Q4_0 = 17, /* typed: llama.cpp q4_0 blocks (ggml.h) */
    KVS_STAGE_CRC32C = 64, /* check: CRC-32C of the bytes, 4 bytes appended */
    KVS_STAGE_XXH3 = 65,   /* check: XXH3-64 of the bytes, 8 bytes appended */
    KVS_STAGE_AES_GCM = 66, /* transform: AES-256-GCM, 16-byte tag appended */
    KVS_STAGE_LOSSLESS = 80 /* transform: exact compression (byte planes by zstd, or the
                               bfloat16 exponent by rANS) */
};

/* What a stage does to the bytes, which fixes where it may stand. */
typedef enum kvs_stage_kind {
    KVS_STAGE_TYPED,     /* tensor -> bytes: first, exactly once */
    KVS_STAGE_CHECK,     /* appends a digest of the bytes before it */
    KVS_STAGE_TRANSFORM, /* rewrites the bytes (compression, encryption) */
} kvs_stage_kind;

/* Largest parameter block any stage writes (the frame caps it too). */
#define KVS_STAGE_PARAMS_MAX 64

/* What decoding needs beyond the bytes: the object key the caller passed
 * (NULL = none), the frame header (authenticated by encryption), and the
 * secret keys the pipeline was configured with. What the typed stage
 * produced, for a transform that models it (lossless): the pipeline fills
 * elem_size and channels, on encode and on decode alike, for the bytes stage
 * right after the typed stage, from the frame's layout: elem_size is 1 for
 * fp8 codes, int payloads and ggml blocks (channels 1 for ggml blocks: a block is no element), the dtype's size for `bytes` when every group has the same one
 * (else 1); channels is the last dim of the layout when every group has the
 * same last dim (else 1). Both 0 for later stages (nothing known). */
typedef struct kvs_keyring kvs_keyring;
typedef struct kvs_transform kvs_transform;
typedef struct kvs_stage_ctx {
    const kvs_object_key *key;
    const uint8_t *header; /* the frame header, its CRC included */
    size_t header_len;
    const kvs_keyring *keyring; /* NULL when no key files were configured */
    unsigned elem_size;         /* bytes per element the typed stage wrote; 0 unknown */
    uint64_t channels;          /* elements per row (the layout's last dim); 0 unknown */
    const kvs_transform *transform; /* typed_decode: the reader's transform file, or NULL */
} kvs_stage_ctx;

typedef struct kvs_stage kvs_stage;
typedef struct kvs_stage_type kvs_stage_type;

struct kvs_stage_type {
    const char *name; /* the JSON "type" */
    uint16_t id;
    kvs_stage_kind kind;

    /* Build an instance from its JSON object (the "type" member included;
     * unknown members refused with the list of known ones). */
    int (*create)(const json_t *config, kvs_stage **out);

    /* ---- typed stages ------------------------------------------------ */
    /* Upper bound of the bytes encode writes for an object of `layout`;
     * refuses layouts the stage cannot encode (dtype, format). */
    int (*typed_bound)(const kvs_stage *self, const kvs_layout *layout, size_t *nbytes);
    /* Encode src into out[0..cap); *n = bytes written. May use
     * kvs_serde_parallel_for. */
    int (*typed_encode)(const kvs_stage *self, const kvs_memobj *src, uint8_t *out,
                        size_t cap, size_t *n);
    /* Optional: byte b of the output depends on the source alone (fp8:
     * element b; bytes: byte b) and the output is exactly typed_bound
     * bytes, so the pipeline may produce it block by block and checksum and
     * encrypt each block while it is in cache. Encodes output bytes [begin, end) on the
     * calling thread. NULL for stages without that property. */
    int (*typed_encode_range)(const kvs_stage *self, const kvs_memobj *src, uint8_t *out,
                              uint64_t begin, uint64_t end);
    /* Optional, with typed_encode_range: the same bytes into out[begin, end)
     * with non-temporal stores (a large payload is not read again soon) and
     * also into copy[0 .. end - begin), which stays in cache for the checks
     * that follow (pipeline.c). NULL where it would not save a pass. */
    int (*typed_encode_range_copy)(const kvs_stage *self, const kvs_memobj *src, uint8_t *out,
                                   uint8_t *copy, uint64_t begin, uint64_t end);
    /* Optional: typed_encode, and its output fed in order, each byte once,
     * to `check`'s stream (check_stream_update(state, ...)) as parts of it
     * are finished, while they are in cache: for a stage whose output
     * cannot be produced by ranges (typed_encode_range) but in parts
     * that end in order (int: plane by plane). The pipeline then writes
     * the digest instead of reading the payload again. */
    int (*typed_encode_check)(const kvs_stage *self, const kvs_memobj *src, uint8_t *out,
                              size_t cap, size_t *n, const kvs_stage_type *check,
                              void *state);
    /* Optional: typed_encode writes src's own bytes, unchanged and
     * contiguous (bytes: the groups are packed back to back already), so
     * a stage that only reads them may read src instead of a copy: returns
     * the first of the *n bytes typed_encode would write. NULL for stages
     * that rewrite. */
    const uint8_t *(*typed_encode_view)(const kvs_stage *self, const kvs_memobj *src,
                                        size_t *n);
    /* Decode in[0..n) into dst, with the parameters read from the frame
     * and what the reader was configured with (ctx: its transform).
     * Checks the parameters and that n is exactly what dst's layout needs
     * before writing any byte of dst. */
    int (*typed_decode)(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                        const uint8_t *in, size_t n, kvs_memobj *dst);
    /* Optional: where typed_decode would copy n input bytes unchanged
     * (bytes: dst's data, when n is what dst's layout needs and dst holds
     * it), so that the stage before may write them there itself; NULL when
     * typed_decode would refuse or rewrite (then it is called as usual). */
    uint8_t *(*typed_decode_target)(const uint8_t *params, size_t nparams, size_t n,
                                    kvs_memobj *dst);

    /* ---- bytes stages (check and transform) -------------------------- */
    /* Upper bound of the output for n input bytes. */
    size_t (*bytes_bound)(const kvs_stage *self, size_t n);
    /* Check: the digest state is streamed, so the pipeline can feed it
     * block by block as the typed stage writes. digest_size bytes. */
    size_t digest_size;
    void (*check_digest)(const uint8_t *in, size_t n, uint8_t *digest);
    int (*check_stream_new)(void **state);
    void (*check_stream_update)(void *state, const uint8_t *in, size_t n);
    void (*check_stream_final)(void *state, uint8_t *digest); /* frees state */
    /* Optional (crc32c: kvs_crc32c_combine): the stream continued as if n
     * bytes whose kvs_crc32c from 0 is crc had been fed, so a typed stage
     * can checksum a part while it is in cache and add it after the parts
     * before it are done. NULL for checks that do not combine. */
    void (*check_stream_append_crc32c)(void *state, uint32_t crc, size_t n);
    /* Transform: encode in[0..n) into out (capacity cap; out == in allowed
     * when in_place is set), *outn = bytes written. A stage that sets
     * needs_header writes exactly bytes_bound(n) bytes and is given the
     * final frame header in ctx (encryption authenticates it); the ordering
     * rules keep such a stage last. Other stages get ctx->header NULL. */
    int in_place;
    int needs_header;
    int (*transform_encode)(const kvs_stage *self, const uint8_t *params, size_t nparams,
                            const kvs_stage_ctx *ctx, const uint8_t *in, size_t n,
                            uint8_t *out, size_t cap, size_t *outn);
    /* Optional, transforms that write elsewhere: transform_encode, and in
     * *crc the kvs_crc32c from 0 of the out[0..*outn) it wrote, taken as
     * parts of it were written (while in cache), so that a check right
     * after it that combines CRC-32Cs (check_stream_append_crc32c) need not
     * read the output again (pipeline.c). */
    int (*transform_encode_crc32c)(const kvs_stage *self, const uint8_t *params,
                                   size_t nparams, const kvs_stage_ctx *ctx, const uint8_t *in,
                                   size_t n, uint8_t *out, size_t cap, size_t *outn,
                                   uint32_t *crc);
    /* The exact size transform_decode will write for in[0..n), read from the
     * stage's own encoding, so the pipeline can allocate it; refuses sizes
     * that cannot be (KVS_ECORRUPT). */
    int (*transform_decoded_size)(const uint8_t *params, size_t nparams, const uint8_t *in,
                                  size_t n, size_t *outn);
    /* Optional, transforms only: the same encoding as transform_encode, fed
     * in consecutive pieces, so the pipeline can run it block by block right
     * after the typed stage writes each block (while it is in cache).
     * stream_begin gets the parameters and the ctx transform_encode would
     * (the final header for needs_header) and the total n; stream_update
     * encodes the next piece (out == in allowed); stream_end(state, tail)
     * writes what bytes_bound adds after the n bytes (the tag) into tail
     * and frees the state; tail NULL abandons it (frees, writes nothing). */
    int (*stream_begin)(const kvs_stage *self, const uint8_t *params, size_t nparams,
                        const kvs_stage_ctx *ctx, size_t n, void **state);
    int (*stream_update)(void *state, const uint8_t *in, uint8_t *out, size_t n);
    int (*stream_end)(void *state, uint8_t *tail);
    /* Transform decode: in -> out (out never aliases in), refusing damaged
     * or unauthenticated input with nothing useful left in out. */
    int (*transform_decode)(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                            const uint8_t *in, size_t n, uint8_t *out, size_t cap,
                            size_t *outn);
    /* Optional, both or neither: transform_decode that writes no byte of
     * out unless it succeeds (every refusal, the same one with the same
     * message, made before the first write), so the pipeline may decode
     * straight into the caller's destination instead of a scratch buffer
     * and a copy; *outn is then transform_decoded_size. transform_direct_ok
     * says whether it takes in[0..n) (lossless: the rANS payloads of a
     * bounded number of blocks); when it does not, or in is not what the
     * stage reads, transform_decode is used. With accept not NULL, in is
     * not checked yet: the stage takes its kvs_crc32c as it reads (in
     * cache) and calls accept(arg, crc) before its first write and before
     * any refusal of its own, and returns accept's refusal instead (the
     * crc32c check after it, folded in: pipeline.c). */
    int (*transform_direct_ok)(const uint8_t *params, size_t nparams, const uint8_t *in,
                               size_t n);
    int (*transform_decode_direct)(const uint8_t *params, size_t nparams,
                                   const kvs_stage_ctx *ctx, const uint8_t *in, size_t n,
                                   uint8_t *out, size_t cap, size_t *outn,
                                   int (*accept)(void *arg, uint32_t crc), void *arg);

    /* ---- every stage ------------------------------------------------- */
    /* The parameter block this instance records in a frame: at most
     * KVS_STAGE_PARAMS_MAX bytes, the same size for every blob of this
     * instance (nparams). Fresh per blob where the stage wants it (a
     * nonce): called once per serialize. */
    size_t (*params_size)(const kvs_stage *self);
    int (*write_params)(const kvs_stage *self, uint8_t *params);
    /* Check a parameter block read from a frame (before anything is
     * decoded), with a message naming the stage and the numbers. */
    int (*check_params)(const uint8_t *params, size_t nparams);
    /* The parameters as JSON, for inspect ("fp8_dtype": "float8_e4m3fn"). */
    json_t *(*describe_params)(const uint8_t *params, size_t nparams);
    void (*destroy)(kvs_stage *self);
};

/* An instance: its type first, then what the type keeps. */
struct kvs_stage {
    const kvs_stage_type *type;
};

/* The registry: every built-in stage type, by name or by id. NULL if none. */
const kvs_stage_type *kvs_stage_type_by_name(const char *name);
const kvs_stage_type *kvs_stage_type_by_id(uint16_t id);
/* Names in registry order, for messages and listings: up to cap into
 * names; returns the total count. */
size_t kvs_stage_type_names(const char **names, size_t cap);
/* "bytes, fp8, crc32c, xxh3, aes_gcm, lossless, ggml_q8_0, ggml_q4_0, int,
 * transform" (a static string). */
const char *kvs_stage_type_list_text(void);
/* "1 (bytes), 2 (fp8), 64 (crc32c), 65 (xxh3), 66 (aes_gcm), ...": the ids a
 * frame may name (a static string). */
const char *kvs_stage_type_id_list_text(void);
/* The typed stages' names in table order, ", "-joined: "bytes, fp8, ...". */
const char *kvs_stage_typed_list_text(void);

/* The stage types (one file each). */
extern const kvs_stage_type kvs_stage_bytes_type;
extern const kvs_stage_type kvs_stage_fp8_type;
extern const kvs_stage_type kvs_stage_crc32c_type;
extern const kvs_stage_type kvs_stage_xxh3_type;
extern const kvs_stage_type kvs_stage_aes_gcm_type;
extern const kvs_stage_type kvs_stage_lossless_type;
extern const kvs_stage_type kvs_stage_ggml_q8_0_type;
extern const kvs_stage_type kvs_stage_ggml_q4_0_type;
extern const kvs_stage_type kvs_stage_int_type;
extern const kvs_stage_type kvs_stage_transform_type;

/* The parameter functions of a stage that records none (bytes, the checks,
 * the ggml stages; stage_registry.c): size 0, nothing to write, "{}". */
size_t kvs_stage_no_params_size(const kvs_stage *self);
int kvs_stage_no_params_write(const kvs_stage *self, uint8_t *params);
json_t *kvs_stage_no_params_describe(const uint8_t *params, size_t nparams);

/* What the typed stage `typed_id` writes for `layout` (kvs_stage_ctx). */
void kvs_stage_typed_shape(uint16_t typed_id, const kvs_layout *layout, unsigned *elem_size,
                           uint64_t *channels);

/* The secret keys of aes_gcm, from the key files of a pipeline's config
 * (stage_aes_gcm.c). kvs_keyring_from_config collects the key files of
 * every aes_gcm stage of a "stages" array (NULL *out when there are none). */
int kvs_keyring_from_config(const json_t *stages, kvs_keyring **out);
void kvs_keyring_free(kvs_keyring *kr);

/* The transform a pipeline's reader needs (stage_transform.c): loaded from
 * the "path" of a "transform" typed stage of a "stages" array (NULL *out
 * when the chain has none). Free with kvs_transform_free (transform.h). */
int kvs_transform_from_config(const json_t *stages, kvs_transform **out);
/* A transform stage over a transform already in memory (taken over, freed
 * with the stage, also on failure), for tests and fuzzing. */
int kvs_stage_transform_new(kvs_transform *t, float k_step, float v_step, kvs_stage **out);

#endif /* KVSERDE_FRAME_STAGE_H */
