/* pipeline.c - the "pipeline" serde (pipeline.h): a typed stage and bytes
 * stages, run in order into one frame, and back.
 *
 * Where the bytes go. The frame is header | payload in dst. The typed stage
 * writes into a region, each check appends to the region it finds, each
 * transform that cannot work in place writes into the other region. The
 * regions are dst's payload area and one scratch buffer, chosen so that the
 * last stage ends in dst: with an odd number of out-of-place transforms the
 * typed stage starts in the scratch. A typed stage that would only copy
 * the source (bytes) writes nothing when an out-of-place transform follows
 * it: that transform reads the source itself (source_view), one fill
 * fewer, and with one transform no scratch. The header is written last
 * (it holds the payload length), except that a stage that authenticates
 * the header (encryption, always last) gets it before it runs: just
 * before, or, fused, before the typed stage starts (the payload length is
 * known then).
 *
 * Fusion. When the typed stage can encode any output range on its own and
 * checks or streamed transforms (encryption) follow it, the output is
 * produced in blocks of FUSE_BLOCK_DEFAULT bytes and each block is
 * checksummed and encrypted while it is still in cache, instead of a pass
 * over memory per stage (run_fused). A large payload that only checks
 * follow is streamed to dst while the typed stage leaves each block in a
 * cached copy for them.
 *
 * Decoding undoes the bytes stages over the whole payload before the typed
 * stage writes a byte of the destination; transforms decode into scratch
 * buffers the deserializer keeps between calls (scratch_take). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/fp8_kernels.h"
#include "codecs/transform.h"
#include "frame/frame.h"
#include "frame/pipeline_internal.h"
#include "frame/stage.h"
#include "kvserde/error.h"
#include "kvserde/pipeline.h"
#include "kvserde/registry.h"
#include "serde/builtins.h"
#include "util/prefault.h"

/* Output bytes per fused block: the fp8 encoder then reads 512 KiB of
 * bfloat16 and writes 256 KiB, inside the 1-2 MiB L2 of current x86 cores.
 * Measured (bench_pipeline, fp8+crc32c encode, one thread): 64 KiB blocks
 * gave 0.77x of plain fp8, 256 KiB 0.85x (each kernel call pays its loop
 * setup and restarts the prefetch stream); docs/performance.md has the
 * sweep. kvs_pipeline_fuse_block (pipeline_internal.h) overrides it. */
#define FUSE_BLOCK_DEFAULT ((uint64_t)256 << 10)
uint64_t kvs_pipeline_fuse_block = 0;

typedef struct pipeline_serializer {
    kvs_serializer base;
    uint32_t nstages;
    kvs_stage *stages[KVS_FRAME_MAX_STAGES];
} pipeline_serializer;

/* Scratch buffers of decoding (decrypted or decompressed bytes) the
 * deserializer keeps between calls: at most SCRATCH_KEEP of them and
 * SCRATCH_KEEP_BYTES in all (a larger one is freed after its call), so
 * each worker thread decoding through the same deserializer finds a buffer
 * whose pages are already mapped instead of faulting in a fresh one per
 * blob. They hold plaintext: every buffer is wiped before it is freed. */
#define SCRATCH_KEEP 4
#define SCRATCH_KEEP_BYTES ((size_t)1 << 30)

typedef struct scratch_buf {
    uint8_t *p;
    size_t cap;
} scratch_buf;

typedef struct pipeline_deserializer {
    kvs_deserializer base;
    kvs_keyring *keyring; /* NULL: no key files configured */
    kvs_transform *transform; /* NULL: the config has no transform stage */
    pthread_mutex_t mu;   /* guards kept, nkept, scratch_allocs */
    scratch_buf kept[SCRATCH_KEEP];
    size_t nkept;
    uint64_t scratch_allocs; /* buffers ever allocated (kvs_pipeline_scratch_allocs) */
} pipeline_deserializer;

/* ---------------------------------------------------------------------
 * Creation: the stage list and its ordering rules
 * ------------------------------------------------------------------ */

static void stages_destroy(kvs_stage **stages, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (stages[i]) stages[i]->type->destroy(stages[i]);
}

static int is_encryption(const kvs_stage_type *t)
{
    return t->kind == KVS_STAGE_TRANSFORM && t->needs_header;
}

/* The rules of pipeline.h, stage i of type t after the stages before it. */
static int check_order(const kvs_stage_type *const *types, uint32_t i)
{
    const kvs_stage_type *t = types[i];
    if ((i == 0) != (t->kind == KVS_STAGE_TYPED)) {
        if (i == 0)
            return kvs_set_error(KVS_EINVAL,
                                 "pipeline: stage 0 '%s' is a bytes -> bytes stage; the chain "
                                 "starts with one typed stage (%s)",
                                 t->name, kvs_stage_typed_list_text());
        return kvs_set_error(KVS_EINVAL,
                             "pipeline: stage %u '%s' is a typed stage; only stage 0 may be "
                             "typed (tensor -> bytes), the rest are bytes -> bytes stages",
                             i, t->name);
    }
    for (uint32_t j = 1; j < i; j++) {
        const kvs_stage_type *before = types[j];
        if (is_encryption(before))
            return kvs_set_error(KVS_EINVAL,
                                 "pipeline: stage %u '%s' follows the encryption at stage %u "
                                 "'%s'; encryption must be the last stage",
                                 i, t->name, j, before->name);
        if (before->kind == KVS_STAGE_CHECK && t->kind == KVS_STAGE_CHECK)
            return kvs_set_error(KVS_EINVAL,
                                 "pipeline: at most one checksum stage: stage %u '%s' and "
                                 "stage %u '%s'",
                                 j, before->name, i, t->name);
        if (before->kind == KVS_STAGE_CHECK && t->kind == KVS_STAGE_TRANSFORM &&
            !is_encryption(t))
            return kvs_set_error(KVS_EINVAL,
                                 "pipeline: stage %u '%s' rewrites the bytes after the "
                                 "checksum at stage %u '%s'; put it before the checksum "
                                 "and the encryption",
                                 i, t->name, j, before->name);
    }
    return KVS_OK;
}

static int parse_stages(const json_t *kwargs, kvs_stage **stages, uint32_t *nstages)
{
    static const char *const known[] = {"stages", NULL};
    /* max_workers is the registry's: accepted (and listed) as for every serde */
    int rc = kvs_kwargs_check_known(kwargs, "pipeline", known);
    if (rc) return rc;
    const json_t *list = json_object_get(kwargs, "stages");
    if (list == NULL)
        return kvs_set_error(KVS_EINVAL,
                             "pipeline: \"stages\" is required: a list such as "
                             "[{\"type\": \"fp8\"}, {\"type\": \"crc32c\"}]");
    if (!json_is_array(list) || json_array_size(list) == 0)
        return kvs_set_error(KVS_EINVAL,
                             "pipeline: \"stages\" must be a non-empty list of stage objects, "
                             "got %s%s",
                             json_is_array(list) ? "an empty " : "", kvs_json_type_name(list));
    size_t n = json_array_size(list);
    if (n > KVS_FRAME_MAX_STAGES)
        return kvs_set_error(KVS_EINVAL, "pipeline: %zu stages; at most %d", n,
                             KVS_FRAME_MAX_STAGES);
    const kvs_stage_type *types[KVS_FRAME_MAX_STAGES];
    int checked = 0;
    for (size_t i = 0; i < n; i++) {
        const json_t *st = json_array_get(list, i);
        const json_t *type = json_object_get(st, "type");
        if (!json_is_object(st))
            return kvs_set_error(KVS_EINVAL,
                                 "pipeline: stage %zu must be an object with a string "
                                 "\"type\"; got %s",
                                 i, kvs_json_type_name(st));
        if (!json_is_string(type))
            return kvs_set_error(KVS_EINVAL,
                                 "pipeline: stage %zu must be an object with a string "
                                 "\"type\"; its \"type\" is %s",
                                 i, type ? kvs_json_type_name(type) : "missing");
        types[i] = kvs_stage_type_by_name(json_string_value(type));
        if (types[i] == NULL)
            return kvs_set_error(KVS_EINVAL,
                                 "pipeline: stage %zu: unknown stage type '%s'; known: %s", i,
                                 json_string_value(type), kvs_stage_type_list_text());
        rc = check_order(types, (uint32_t)i);
        if (rc) return rc;
        if (types[i]->kind == KVS_STAGE_CHECK || is_encryption(types[i])) checked = 1;
    }
    /* Every frame's payload is checked (pipeline.h): crc32c is appended to
     * a chain that has neither a checksum nor encryption. */
    if (!checked && n == KVS_FRAME_MAX_STAGES)
        return kvs_set_error(KVS_EINVAL,
                             "pipeline: %zu stages and no checksum; at most %d before the "
                             "crc32c that is appended",
                             n, KVS_FRAME_MAX_STAGES - 1);
    json_t *crc = checked ? NULL : json_pack("{s:s}", "type", "crc32c");
    if (!checked && crc == NULL) return kvs_set_error(KVS_ENOMEM, "pipeline: out of memory");
    *nstages = 0;
    for (size_t i = 0; i < n + !checked && rc == KVS_OK; i++) {
        rc = i < n ? types[i]->create(json_array_get(list, i), &stages[i])
                   : kvs_stage_crc32c_type.create(crc, &stages[i]);
        if (rc == KVS_OK) *nstages = (uint32_t)i + 1;
    }
    json_decref(crc);
    if (rc) {
        /* The stage's own message, with its position in the chain. */
        rc = kvs_set_error(rc, "pipeline: stage %u: %s", *nstages, kvs_last_error());
        stages_destroy(stages, *nstages);
        *nstages = 0;
    }
    return rc;
}

/* ---------------------------------------------------------------------
 * Serialize
 * ------------------------------------------------------------------ */

/* The per-blob parameters of every stage. */
typedef struct blob_params {
    size_t n[KVS_FRAME_MAX_STAGES];
    uint16_t ids[KVS_FRAME_MAX_STAGES];
    uint8_t bytes[KVS_FRAME_MAX_STAGES][KVS_STAGE_PARAMS_MAX];
    const uint8_t *ptr[KVS_FRAME_MAX_STAGES];
} blob_params;

static void params_sizes(const pipeline_serializer *self, blob_params *bp)
{
    for (uint32_t i = 0; i < self->nstages; i++) {
        const kvs_stage *st = self->stages[i];
        bp->n[i] = st->type->params_size(st);
        bp->ids[i] = st->type->id;
        bp->ptr[i] = bp->bytes[i];
    }
}

/* Header size and the payload's bound for `layout`. */
static int bounds(const pipeline_serializer *self, const kvs_layout *layout, size_t *header,
                  size_t *payload)
{
    const kvs_stage *typed = self->stages[0];
    size_t b;
    int rc = typed->type->typed_bound(typed, layout, &b);
    if (rc) return rc;
    for (uint32_t i = 1; i < self->nstages; i++) {
        size_t next = self->stages[i]->type->bytes_bound(self->stages[i], b);
        if (next < b)
            return kvs_set_error(KVS_ENOMEM, "pipeline: size of %zu bytes overflows at stage "
                                 "%u '%s'", b, i, self->stages[i]->type->name);
        b = next;
    }
    blob_params bp;
    params_sizes(self, &bp);
    *header = kvs_frame_header_size(layout, bp.n, self->nstages);
    if (b > SIZE_MAX - *header)
        return kvs_set_error(KVS_ENOMEM, "pipeline: a frame of %zu payload bytes overflows", b);
    *payload = b;
    return KVS_OK;
}

static int pipeline_estimate(const kvs_serializer *s, const kvs_layout *layout, size_t *nbytes)
{
    const pipeline_serializer *self = KVS_CONTAINER_OF(s, const pipeline_serializer, base);
    size_t h, p;
    int rc = bounds(self, layout, &h, &p);
    if (rc == KVS_OK) *nbytes = h + p;
    return rc;
}

/* Stages 1..k-1 can run fused with the typed stage: the typed stage encodes
 * output ranges, and each of them is a check or a transform that streams
 * (stage.h). Returns k (1: nothing fused). */
static uint32_t fused_end(const pipeline_serializer *self)
{
    if (self->stages[0]->type->typed_encode_range == NULL) return 1;
    uint32_t k = 1;
    while (k < self->nstages) {
        const kvs_stage_type *t = self->stages[k]->type;
        if (t->kind != KVS_STAGE_CHECK && (t->stream_begin == NULL || !t->in_place)) break;
        k++;
    }
    return k;
}

/* One fused stage's state; the check's digest is written to a discard
 * buffer and a stream is abandoned when the run fails. */
static void fused_state_drop(const kvs_stage_type *t, void *state)
{
    if (state == NULL) return;
    if (t->kind == KVS_STAGE_CHECK) {
        uint8_t discard[16];
        t->check_stream_final(state, discard);
    } else {
        (void)t->stream_end(state, NULL);
    }
}

static int fused_feed(const kvs_stage_type *t, void *state, uint8_t *p, size_t n)
{
    if (t->kind == KVS_STAGE_CHECK) {
        t->check_stream_update(state, p, n);
        return KVS_OK;
    }
    return t->stream_update(state, p, p, n);
}

/* Stage 1 is a check the typed stage can feed as it writes
 * (typed_encode_check) and nothing is fused by ranges. */
static int checked_as_written(const pipeline_serializer *self)
{
    return self->nstages > 1 && self->stages[0]->type->typed_encode_check &&
           self->stages[1]->type->kind == KVS_STAGE_CHECK;
}

/* The source's own bytes when stage 0 would only copy them
 * (typed_encode_view) and stage 1 is a transform that writes elsewhere:
 * stage 1 then reads the source and the copy is skipped. Not before a
 * check or an in-place transform: they write at or after the bytes they
 * read, which would be the caller's source. NULL when the copy is made
 * (an empty source too: nothing to save, and its data may be NULL). */
static const uint8_t *source_view(const pipeline_serializer *self, const kvs_memobj *src,
                                  size_t *n)
{
    const kvs_stage *typed = self->stages[0];
    if (typed->type->typed_encode_view == NULL || self->nstages < 2) return NULL;
    const kvs_stage_type *next = self->stages[1]->type;
    if (next->kind != KVS_STAGE_TRANSFORM || next->in_place) return NULL;
    const uint8_t *view = typed->type->typed_encode_view(typed, src, n);
    return *n ? view : NULL;
}

/* The typed stage into out, feeding stage 1's digest as it writes; the
 * digest appended: *n = the payload and the digest. */
static int encode_checked(const pipeline_serializer *self, const kvs_memobj *src, uint8_t *out,
                          size_t cap, size_t *n)
{
    const kvs_stage *typed = self->stages[0];
    const kvs_stage_type *check = self->stages[1]->type;
    void *state = NULL;
    int rc = check->check_stream_new(&state);
    if (rc == KVS_OK) rc = typed->type->typed_encode_check(typed, src, out, cap, n, check, state);
    if (rc) {
        fused_state_drop(check, state);
        return rc;
    }
    check->check_stream_final(state, out + *n);
    *n += check->digest_size;
    return KVS_OK;
}

/* The typed stage into `out` in blocks of FUSE_BLOCK_DEFAULT bytes, each block run
 * through stages 1..k-1 (fused_end) in order while it is in cache: checks
 * add it to their digest, streamed transforms rewrite it in place. Then, in
 * stage order, each stage takes the bytes the stages before it appended
 * (a digest, a tag) and appends its own. A stage that needs the header gets
 * `header` (written here with the final payload length). *n = bytes in out. */
static int run_fused(const pipeline_serializer *self, uint32_t k, const blob_params *bp,
                     const kvs_memobj *src, const kvs_object_key *key, uint8_t *header,
                     size_t hlen, int *header_done, uint8_t *out, size_t *n)
{
    const kvs_stage *typed = self->stages[0];
    size_t total;
    int rc = typed->type->typed_bound(typed, &src->layout, &total);
    if (rc) return rc;
    size_t seen[KVS_FRAME_MAX_STAGES]; /* bytes stage i reads */
    size_t end = total;
    for (uint32_t i = 1; i < k; i++) {
        const kvs_stage *st = self->stages[i];
        seen[i] = end;
        end = st->type->kind == KVS_STAGE_CHECK ? end + st->type->digest_size
                                                : st->type->bytes_bound(st, end);
    }
    void *state[KVS_FRAME_MAX_STAGES] = {NULL};
    for (uint32_t i = 1; i < k && rc == KVS_OK; i++) {
        const kvs_stage *st = self->stages[i];
        const kvs_stage_type *t = st->type;
        if (t->kind == KVS_STAGE_CHECK) {
            rc = t->check_stream_new(&state[i]);
            continue;
        }
        kvs_stage_ctx ctx = {key, NULL, 0, NULL, 0, 0, NULL};
        if (i == 1) kvs_stage_typed_shape(typed->type->id, &src->layout, &ctx.elem_size,
                                          &ctx.channels);
        if (t->needs_header) {
            kvs_frame_write_header(header, &src->layout, src->format, key, end, bp->ids,
                                   bp->ptr, bp->n, self->nstages);
            *header_done = 1;
            ctx.header = header;
            ctx.header_len = hlen;
        }
        rc = t->stream_begin(st, bp->bytes[i], bp->n[i], &ctx, seen[i], &state[i]);
    }
    const uint64_t block =
        kvs_pipeline_fuse_block ? kvs_pipeline_fuse_block : FUSE_BLOCK_DEFAULT;
    /* A payload past the store policy's threshold (fp8_kernels.h) that only
     * checks read: the typed stage streams it to out and leaves each block
     * in a scratch that stays in cache for the checks too. Written in place
     * with ordinary stores, each line of out would first be read from
     * memory (measured: fp8+crc32c 0.74-0.81x of plain fp8 encode that way,
     * docs/performance.md). Transforms rewrite out in place, so not with
     * them; without memory for the scratch, in place too. */
    uint8_t *copy = NULL;
    if (typed->type->typed_encode_range_copy && total >= kvs_fp8_nt_min_bytes() &&
        total > block) {
        int checks_only = 1;
        for (uint32_t i = 1; i < k; i++)
            checks_only &= self->stages[i]->type->kind == KVS_STAGE_CHECK;
        if (checks_only) copy = aligned_alloc(64, (size_t)(block + 63) / 64 * 64);
    }
    for (uint64_t b = 0; b < total && rc == KVS_OK; b += block) {
        uint64_t e = total - b < block ? total : b + block;
        uint8_t *hot = copy ? copy : out + b;
        rc = copy ? typed->type->typed_encode_range_copy(typed, src, out, copy, b, e)
                  : typed->type->typed_encode_range(typed, src, out, b, e);
        for (uint32_t i = 1; i < k && rc == KVS_OK; i++)
            rc = fused_feed(self->stages[i]->type, state[i], hot, (size_t)(e - b));
    }
    free(copy);
    for (uint32_t i = 1; i < k && rc == KVS_OK; i++) {
        const kvs_stage_type *t = self->stages[i]->type;
        if (seen[i] > total) rc = fused_feed(t, state[i], out + total, seen[i] - total);
        if (rc) break;
        if (t->kind == KVS_STAGE_CHECK) t->check_stream_final(state[i], out + seen[i]);
        else rc = t->stream_end(state[i], out + seen[i]);
        state[i] = NULL;
    }
    /* On failure nothing more is written (digests go to a discard buffer). */
    for (uint32_t i = 1; i < k; i++) fused_state_drop(self->stages[i]->type, state[i]);
    if (rc) return rc;
    *n = end;
    return KVS_OK;
}

static int pipeline_serialize(kvs_serializer *s, const kvs_memobj *src, kvs_memobj *dst,
                              const kvs_object_key *key, size_t *nwritten)
{
    pipeline_serializer *self = KVS_CONTAINER_OF(s, pipeline_serializer, base);
    size_t h, bound;
    int rc = bounds(self, &src->layout, &h, &bound);
    if (rc) return rc;
    if (dst->capacity < h + bound)
        return kvs_set_error(KVS_ENOSPC, "pipeline: destination too small: %zu bytes, need %zu",
                             dst->capacity, h + bound);
    blob_params bp;
    params_sizes(self, &bp);
    for (uint32_t i = 0; i < self->nstages; i++) {
        const kvs_stage *st = self->stages[i];
        rc = st->type->write_params(st, bp.bytes[i]);
        if (rc) return rc;
    }
    unsigned out_of_place = 0;
    for (uint32_t i = 1; i < self->nstages; i++)
        if (self->stages[i]->type->kind == KVS_STAGE_TRANSFORM && !self->stages[i]->type->in_place)
            out_of_place++;
    size_t n;
    const uint8_t *view = source_view(self, src, &n);
    /* Regions are filled by the typed stage (unless stage 1 reads the
     * source) and by each out-of-place transform, alternately, the last
     * one dst's payload; a single fill needs no scratch. */
    unsigned fills = out_of_place + (view == NULL);
    uint8_t *payload = (uint8_t *)dst->data + h, *scratch = NULL;
    if (fills > 1 && (scratch = malloc(bound)) == NULL)
        return kvs_set_error(KVS_ENOMEM, "pipeline: out of memory for a %zu-byte scratch buffer",
                             bound);
    uint8_t *first = fills % 2 ? payload : scratch, *second = fills % 2 ? scratch : payload;
    /* With the view, stage 1 (out of place) writes `other`: the first fill. */
    uint8_t *cur = view ? second : first, *other = view ? first : second;
    const uint8_t *in = view ? view : cur; /* what the next transform reads */
    uint8_t header[KVS_FRAME_HEADER_MAX];
    int header_done = 0;
    uint32_t k = fused_end(self);
    if (view) {
        k = 1; /* stage 1 is out of place: nothing fused, nothing checked */
    } else if (k > 1) {
        rc = run_fused(self, k, &bp, src, key, header, h, &header_done, cur, &n);
    } else if (checked_as_written(self)) {
        rc = encode_checked(self, src, cur, bound, &n);
        k = 2;
    } else {
        rc = self->stages[0]->type->typed_encode(self->stages[0], src, cur, bound, &n);
    }
    for (uint32_t i = k; rc == KVS_OK && i < self->nstages; i++) {
        const kvs_stage *st = self->stages[i];
        const kvs_stage_type *t = st->type;
        if (t->kind == KVS_STAGE_CHECK) {
            t->check_digest(cur, n, cur + n);
            n += t->digest_size;
            continue;
        }
        kvs_stage_ctx ctx = {key, NULL, 0, NULL, 0, 0, NULL};
        if (i == 1) kvs_stage_typed_shape(self->stages[0]->type->id, &src->layout,
                                          &ctx.elem_size, &ctx.channels);
        if (t->needs_header) {
            kvs_frame_write_header(header, &src->layout, src->format, key, t->bytes_bound(st, n),
                                   bp.ids, bp.ptr, bp.n, self->nstages);
            header_done = 1;
            ctx.header = header;
            ctx.header_len = h;
        }
        uint8_t *to = t->in_place ? cur : other;
        size_t m;
        const kvs_stage_type *next = i + 1 < self->nstages ? self->stages[i + 1]->type : NULL;
        if (!t->in_place && t->transform_encode_crc32c && next && next->kind == KVS_STAGE_CHECK &&
            next->check_stream_append_crc32c) {
            /* the check after it from the CRC-32C the stage took as it wrote */
            uint32_t crc = 0;
            void *state = NULL;
            rc = t->transform_encode_crc32c(st, bp.bytes[i], bp.n[i], &ctx, in, n, to, bound, &m,
                                            &crc);
            if (rc == KVS_OK) rc = next->check_stream_new(&state);
            if (rc == KVS_OK) {
                next->check_stream_append_crc32c(state, crc, m);
                next->check_stream_final(state, to + m);
                m += next->digest_size;
                i++;
            }
        } else {
            rc = t->transform_encode(st, bp.bytes[i], bp.n[i], &ctx, in, n, to, bound, &m);
        }
        if (rc == KVS_OK && t->needs_header && m != t->bytes_bound(st, n))
            rc = kvs_set_error(KVS_EINVAL, "pipeline: stage '%s' wrote %zu bytes, announced %zu",
                               t->name, m, t->bytes_bound(st, n));
        if (rc == KVS_OK && !t->in_place) {
            other = cur;
            cur = to;
        }
        in = cur;
        n = m;
    }
    free(scratch);
    if (rc) return rc;
    if (!header_done)
        kvs_frame_write_header(header, &src->layout, src->format, key, n, bp.ids, bp.ptr, bp.n,
                               self->nstages);
    memcpy(dst->data, header, h);
    *nwritten = h + n;
    return KVS_OK;
}

static void pipeline_serializer_destroy(kvs_serializer *s)
{
    pipeline_serializer *self = KVS_CONTAINER_OF(s, pipeline_serializer, base);
    stages_destroy(self->stages, self->nstages);
    free(self);
}

static const struct kvs_serializer_ops pipeline_serializer_ops = {
    .name = "pipeline",
    .serialize = pipeline_serialize,
    .estimate_serialized_size = pipeline_estimate,
    .destroy = pipeline_serializer_destroy,
};

/* ---------------------------------------------------------------------
 * Deserialize and verify
 * ------------------------------------------------------------------ */

static int check_key(const kvs_frame *f, const kvs_object_key *key)
{
    if (key == NULL) return KVS_OK; /* nothing to bind to (pipeline.h) */
    int keyed = (f->flags & KVS_FRAME_FLAG_KEYED) != 0;
    if (keyed && kvs_object_key_fingerprint(key) == f->key_fingerprint) return KVS_OK;
    /* Only a refusal describes the key (its fingerprint again, and text):
     * a load that passes pays for one fingerprint. */
    char who[128];
    kvs_key_describe(key, who, sizeof who);
    if (!keyed)
        return kvs_set_error(KVS_EKEY,
                             "pipeline: blob was written without an object key, loaded for %s",
                             who);
    return kvs_set_error(KVS_EKEY,
                         "pipeline: blob was written for another key: stored key fingerprint "
                         "%016llx, loading %s",
                         (unsigned long long)f->key_fingerprint, who);
}

static int check_layout(const kvs_frame *f, const kvs_layout *dst)
{
    if (kvs_layout_equal(&f->layout, dst)) return KVS_OK;
    char a[256], b[256];
    kvs_layout_format(&f->layout, a, sizeof a);
    kvs_layout_format(dst, b, sizeof b);
    return kvs_set_error(KVS_ECORRUPT,
                         "pipeline: stored object is %s (%llu bytes), destination layout is %s "
                         "(%llu bytes)",
                         a, (unsigned long long)kvs_layout_nbytes(&f->layout), b,
                         (unsigned long long)kvs_layout_nbytes(dst));
}

static void scratch_free(scratch_buf b)
{
    if (b.p == NULL) return;
    explicit_bzero(b.p, b.cap);
    free(b.p);
}

/* A buffer of at least m bytes: the smallest kept one that fits, or a new
 * one with its pages mapped up front. p NULL when out of memory. */
static scratch_buf scratch_take(pipeline_deserializer *self, size_t m)
{
    scratch_buf got = {NULL, 0};
    pthread_mutex_lock(&self->mu);
    size_t best = SCRATCH_KEEP;
    for (size_t i = 0; i < self->nkept; i++)
        if (self->kept[i].cap >= m &&
            (best == SCRATCH_KEEP || self->kept[i].cap < self->kept[best].cap))
            best = i;
    if (best < SCRATCH_KEEP) {
        got = self->kept[best];
        self->kept[best] = self->kept[--self->nkept];
    } else {
        self->scratch_allocs++;
    }
    pthread_mutex_unlock(&self->mu);
    if (got.p) return got;
    size_t cap = m ? m : 1;
    got.p = malloc(cap);
    if (got.p == NULL) return got;
    got.cap = cap;
    kvs_prefault(got.p, cap); /* one call, not a fault per page later */
    return got;
}

/* Keep a buffer for the next call, or free it (wiped) when the keep is full:
 * the smallest kept one makes way for a larger one. */
static void scratch_give(pipeline_deserializer *self, scratch_buf b)
{
    if (b.p == NULL) return;
    scratch_buf drop = b;
    pthread_mutex_lock(&self->mu);
    size_t bytes = 0, small = 0;
    for (size_t i = 0; i < self->nkept; i++) {
        bytes += self->kept[i].cap;
        if (self->kept[i].cap < self->kept[small].cap) small = i;
    }
    if (self->nkept < SCRATCH_KEEP && b.cap <= SCRATCH_KEEP_BYTES - bytes) {
        self->kept[self->nkept++] = b;
        drop.p = NULL;
    } else if (self->nkept > 0 && self->kept[small].cap < b.cap &&
               b.cap <= SCRATCH_KEEP_BYTES - (bytes - self->kept[small].cap)) {
        drop = self->kept[small];
        self->kept[small] = b;
    }
    pthread_mutex_unlock(&self->mu);
    scratch_free(drop);
}

uint64_t kvs_pipeline_scratch_allocs(kvs_deserializer *de)
{
    pipeline_deserializer *self = KVS_CONTAINER_OF(de, pipeline_deserializer, base);
    pthread_mutex_lock(&self->mu);
    uint64_t n = self->scratch_allocs;
    pthread_mutex_unlock(&self->mu);
    return n;
}

/* Whether [a, a + an) and [b, b + bn) share a byte (as addresses: the
 * two may be different objects). */
static int overlaps(const void *a, size_t an, const void *b, size_t bn)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y ? y - x < an : x - y < bn;
}

/* Where stage 1 (fs) may decode in[0..n), m bytes, straight into dst
 * (NULL: into a scratch buffer, then the typed stage): when the typed
 * stage's decode is a copy of them into dst (typed_decode_target), stage 1
 * writes nothing unless it succeeds (transform_decode_direct) and takes
 * this payload, and dst shares no byte with what is read, in or the blob:
 * so a refusal still leaves dst untouched, and the copy is saved. */
static uint8_t *direct_target(const kvs_frame *f, const kvs_frame_stage *fs, const uint8_t *in,
                              size_t n, size_t m, kvs_memobj *dst)
{
    const kvs_frame_stage *typed = &f->stages[0];
    const kvs_stage_type *t = fs->type;
    if (dst == NULL || typed->type->typed_decode_target == NULL ||
        t->transform_decode_direct == NULL)
        return NULL;
    uint8_t *to = typed->type->typed_decode_target(typed->params, typed->nparams, m, dst);
    if (to == NULL || overlaps(to, m, in, n) ||
        overlaps(to, m, f->header, f->header_len + (size_t)f->payload_len) ||
        !t->transform_direct_ok(fs->params, fs->nparams, in, n))
        return NULL;
    return to;
}

/* A check stage's verdict on its digest of n bytes against the one stored
 * after them: KVS_OK, or the refusal naming both. */
static int check_verdict(const kvs_stage_type *t, const uint8_t *digest, const uint8_t *stored,
                         size_t n, const kvs_object_key *key)
{
    size_t d = t->digest_size;
    if (memcmp(digest, stored, d) == 0) return KVS_OK;
    uint64_t got = 0, want = 0;
    for (size_t b = d; b-- > 0;) {
        got = got << 8 | digest[b];
        want = want << 8 | stored[b];
    }
    char who[128];
    kvs_key_describe(key, who, sizeof who);
    return kvs_set_error(KVS_ECORRUPT,
                         "pipeline: %s: payload damaged: checksum %0*llx over %zu bytes, stored "
                         "%0*llx; loading %s",
                         t->name, (int)(2 * d), (unsigned long long)got, n, (int)(2 * d),
                         (unsigned long long)want, who);
}

/* A crc32c check folded into stage 1's decode into dst (direct_target): the
 * stage gives the CRC-32C it took of the n payload bytes as it read them. */
typedef struct folded_check {
    const kvs_stage_type *t;
    const uint8_t *stored;
    size_t n;
    const kvs_object_key *key;
} folded_check;

static int folded_accept(void *arg, uint32_t crc)
{
    const folded_check *c = arg;
    void *state = NULL;
    uint8_t digest[16];
    int rc = c->t->check_stream_new(&state);
    if (rc) return rc;
    c->t->check_stream_append_crc32c(state, crc, c->n);
    c->t->check_stream_final(state, digest);
    return check_verdict(c->t, digest, c->stored, c->n, c->key);
}

/* Stage 1 (fs) decodes in[0..n) into `to` (m bytes, direct_target), with
 * the check after it folded in when accept is not NULL. */
static int direct_decode(const kvs_frame *f, const kvs_frame_stage *fs,
                         const kvs_object_key *key, const kvs_keyring *keyring,
                         const uint8_t *in, size_t n, uint8_t *to, size_t m,
                         int (*accept)(void *, uint32_t), void *arg)
{
    const kvs_stage_type *t = fs->type;
    kvs_stage_ctx ctx = {key, f->header, f->header_len, keyring, 0, 0, NULL};
    kvs_stage_typed_shape(f->stages[0].type->id, &f->layout, &ctx.elem_size, &ctx.channels);
    size_t got;
    int rc = t->transform_decode_direct(fs->params, fs->nparams, &ctx, in, n, to, m, &got,
                                        accept, arg);
    if (rc == KVS_OK && got != m)
        rc = kvs_set_error(KVS_ECORRUPT, "%s: decoded %zu bytes, expected %zu", t->name, got, m);
    return rc;
}

/* Undo the bytes stages, last first: checks verify in place, transforms
 * write into scratch buffers (never dst), except that stage 1 may decode
 * straight into dst (direct_target; dst NULL: never), which sets *done.
 * On success *out / *outn are the typed stage's bytes, and *owned the
 * scratch buffer they are in (p NULL when none), for the caller to give
 * back. */
static int undo_bytes_stages(pipeline_deserializer *self, const kvs_frame *f,
                             const kvs_object_key *key, const uint8_t **out, size_t *outn,
                             scratch_buf *owned, kvs_memobj *dst, int *done)
{
    const kvs_keyring *keyring = self->keyring;
    const uint8_t *cur = f->payload;
    size_t n = (size_t)f->payload_len;
    scratch_buf held = {NULL, 0};
    owned->p = NULL;
    char who[128]; /* the key, described only for a refusal's message */
    int rc = KVS_OK;
    for (uint32_t i = f->nstages; i-- > 1 && rc == KVS_OK;) {
        const kvs_frame_stage *fs = &f->stages[i];
        const kvs_stage_type *t = fs->type;
        if (t->kind == KVS_STAGE_CHECK) {
            size_t d = t->digest_size;
            uint8_t digest[16];
            if (n < d) {
                kvs_key_describe(key, who, sizeof who);
                rc = kvs_set_error(KVS_ECORRUPT,
                                   "pipeline: %s: payload damaged: %zu bytes, shorter than the "
                                   "%zu-byte checksum; loading %s",
                                   t->name, n, d, who);
                break;
            }
            n -= d;
            /* A crc32c check right after stage 1, which decodes into dst:
             * folded into that decode, which takes the CRC-32C of each
             * block while in cache and gives it before writing dst or
             * refusing (its refusal then only when this check passes). */
            const kvs_frame_stage *s1 = &f->stages[1];
            size_t m1;
            uint8_t *to;
            if (i == 2 && t->check_stream_append_crc32c &&
                s1->type->kind == KVS_STAGE_TRANSFORM && s1->type->transform_decode_direct &&
                s1->type->transform_decoded_size(s1->params, s1->nparams, cur, n, &m1) ==
                    KVS_OK &&
                (to = direct_target(f, s1, cur, n, m1, dst)) != NULL) {
                folded_check fc = {t, cur + n, n, key};
                rc = direct_decode(f, s1, key, keyring, cur, n, to, m1, folded_accept, &fc);
                if (rc == KVS_OK) *done = 1;
                cur = to;
                n = m1;
                break; /* stage 1, the last to undo, is done */
            }
            t->check_digest(cur, n, digest);
            rc = check_verdict(t, digest, cur + n, n, key);
            continue;
        }
        size_t m;
        rc = t->transform_decoded_size(fs->params, fs->nparams, cur, n, &m);
        if (rc) break;
        uint8_t *to = i == 1 ? direct_target(f, fs, cur, n, m, dst) : NULL;
        if (to) {
            rc = direct_decode(f, fs, key, keyring, cur, n, to, m, NULL, NULL);
            if (rc == KVS_OK) *done = 1;
            cur = to;
            n = m;
            break; /* stage 1 was the last to undo */
        }
        scratch_buf next = scratch_take(self, m);
        if (next.p == NULL) {
            rc = kvs_set_error(KVS_ENOMEM, "pipeline: out of memory for %zu decoded bytes", m);
            break;
        }
        kvs_stage_ctx ctx = {key, f->header, f->header_len, keyring, 0, 0, NULL};
        if (i == 1) kvs_stage_typed_shape(f->stages[0].type->id, &f->layout, &ctx.elem_size,
                                          &ctx.channels);
        size_t got;
        rc = t->transform_decode(fs->params, fs->nparams, &ctx, cur, n, next.p, m, &got);
        if (rc == KVS_OK && got != m)
            rc = kvs_set_error(KVS_ECORRUPT, "%s: decoded %zu bytes, expected %zu", t->name, got,
                               m);
        scratch_give(self, held);
        held = next;
        cur = next.p;
        n = m;
    }
    if (rc) {
        scratch_give(self, held);
        return rc;
    }
    *out = cur;
    *outn = n;
    *owned = held;
    return KVS_OK;
}

static int open_frame(const void *blob, size_t len, const kvs_object_key *key, kvs_frame *f)
{
    int rc = kvs_frame_parse(blob, len, "pipeline", f);
    if (rc == KVS_OK) rc = check_key(f, key);
    return rc;
}

static int pipeline_deserialize(kvs_deserializer *d, const kvs_memobj *src, kvs_memobj *dst,
                                const kvs_object_key *key)
{
    pipeline_deserializer *self = KVS_CONTAINER_OF(d, pipeline_deserializer, base);
    kvs_frame f;
    int rc = open_frame(src->data, src->used_size, key, &f);
    if (rc == KVS_OK) rc = check_layout(&f, &dst->layout);
    if (rc) return rc;
    const uint8_t *bytes;
    size_t n;
    scratch_buf owned;
    int done = 0;
    rc = undo_bytes_stages(self, &f, key, &bytes, &n, &owned, dst, &done);
    if (rc || done) {
        scratch_give(self, owned);
        return rc;
    }
    const kvs_frame_stage *typed = &f.stages[0];
    kvs_stage_ctx ctx = {key, f.header, f.header_len, self->keyring, 0, 0, self->transform};
    rc = typed->type->typed_decode(typed->params, typed->nparams, &ctx, bytes, n, dst);
    scratch_give(self, owned);
    return rc;
}

int kvs_pipeline_verify(kvs_deserializer *de, const void *blob, size_t len,
                        const kvs_object_key *key)
{
    if (de == NULL || (blob == NULL && len > 0))
        return kvs_set_error(KVS_EINVAL, "pipeline: verify: NULL argument");
    if (strcmp(de->ops->name, "pipeline") != 0)
        return kvs_set_error(KVS_EINVAL, "pipeline: verify needs a pipeline deserializer, got '%s'",
                             de->ops->name);
    pipeline_deserializer *self = KVS_CONTAINER_OF(de, pipeline_deserializer, base);
    kvs_frame f;
    int rc = open_frame(blob, len, key, &f);
    if (rc) return rc;
    const uint8_t *bytes;
    size_t n;
    scratch_buf owned;
    int done = 0;
    rc = undo_bytes_stages(self, &f, key, &bytes, &n, &owned, NULL, &done);
    scratch_give(self, owned);
    return rc;
}

static void pipeline_deserializer_destroy(kvs_deserializer *d)
{
    pipeline_deserializer *self = KVS_CONTAINER_OF(d, pipeline_deserializer, base);
    kvs_keyring_free(self->keyring);
    kvs_transform_free(self->transform);
    for (size_t i = 0; i < self->nkept; i++) scratch_free(self->kept[i]);
    pthread_mutex_destroy(&self->mu);
    free(self);
}

static const struct kvs_deserializer_ops pipeline_deserializer_ops = {
    .name = "pipeline",
    .deserialize = pipeline_deserialize,
    .destroy = pipeline_deserializer_destroy,
};

/* ---------------------------------------------------------------------
 * The factory and the public helpers
 * ------------------------------------------------------------------ */

int kvs_pipeline_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out)
{
    (void)userdata;
    pipeline_serializer *s = calloc(1, sizeof *s);
    pipeline_deserializer *d = calloc(1, sizeof *d);
    if (s == NULL || d == NULL) {
        free(s);
        free(d);
        return kvs_set_error(KVS_ENOMEM, "pipeline: out of memory creating the serde");
    }
    int rc = parse_stages(kwargs, s->stages, &s->nstages);
    if (rc == KVS_OK) rc = kvs_keyring_from_config(json_object_get(kwargs, "stages"), &d->keyring);
    if (rc == KVS_OK)
        rc = kvs_transform_from_config(json_object_get(kwargs, "stages"), &d->transform);
    if (rc) {
        kvs_keyring_free(d->keyring);
        stages_destroy(s->stages, s->nstages);
        free(s);
        free(d);
        return rc;
    }
    pthread_mutex_init(&d->mu, NULL);
    s->base.ops = &pipeline_serializer_ops;
    d->base.ops = &pipeline_deserializer_ops;
    out->serializer = &s->base;
    out->deserializer = &d->base;
    return KVS_OK;
}

size_t kvs_pipeline_stage_types(const char **names, size_t cap)
{
    return kvs_stage_type_names(names, names ? cap : 0);
}

int kvs_frame_detect(const void *blob, size_t len)
{
    return blob != NULL && kvs_frame_is_framed(blob, len);
}

int kvs_frame_inspect(const void *blob, size_t len, kvs_frame_info *out)
{
    if ((blob == NULL && len > 0) || out == NULL)
        return kvs_set_error(KVS_EINVAL, "frame: inspect: NULL argument");
    kvs_frame f;
    int rc = kvs_frame_parse(blob, len, "frame", &f);
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    out->version = f.version;
    out->keyed = (f.flags & KVS_FRAME_FLAG_KEYED) != 0;
    out->key_fingerprint = f.key_fingerprint;
    out->header_bytes = f.header_len;
    out->payload_bytes = f.payload_len;
    out->format = f.format;
    out->layout = f.layout;
    out->nstages = f.nstages;
    for (uint32_t i = 0; i < f.nstages; i++) {
        const kvs_frame_stage *fs = &f.stages[i];
        snprintf(out->stages[i].name, sizeof out->stages[i].name, "%s", fs->type->name);
        json_t *p = fs->type->describe_params(fs->params, fs->nparams);
        char *text = p ? json_dumps(p, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
        snprintf(out->stages[i].params, sizeof out->stages[i].params, "%s", text ? text : "{}");
        free(text);
        json_decref(p);
    }
    return KVS_OK;
}
