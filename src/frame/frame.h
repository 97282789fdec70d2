/* frame.h - internal: the frame header of framed blobs, written and parsed
 * (docs/frame_format.md is the byte-by-byte definition).
 *
 *   offset size
 *   0      4    magic "KVSF"
 *   4      1    format version (1)
 *   5      1    flags: bit 0 = bound to an object key; other bits 0
 *   6      2    header length H, the CRC at its end included
 *   8      8    payload length P
 *   16     8    key fingerprint (0 when not bound)
 *   24     1    memory format
 *   25     1    groups G (0..16)
 *   26     1    stages S (1..16)
 *   27     1    reserved, 0
 *   28     ...  G groups: dtype u8, ndim u8 (0..8), ndim dims i64
 *   ...    ...  S stages: id u16, nparams u16 (0..64), params
 *   H-4    4    CRC-32C of bytes [0, H-4)
 *   H      P    payload; the blob is exactly H + P bytes
 * All integers little-endian.
 */
#ifndef KVSERDE_FRAME_FRAME_H
#define KVSERDE_FRAME_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "frame/stage.h"
#include "kvserde/memobj.h"

#define KVS_FRAME_MAGIC "KVSF"
#define KVS_FRAME_VERSION 1
#define KVS_FRAME_FIXED 28      /* bytes before the group records */
#define KVS_FRAME_MAX_STAGES 16
#define KVS_FRAME_FLAG_KEYED 0x01
/* The largest header: every group with KVS_MAX_DIMS dims, every stage with
 * the largest parameter block. */
#define KVS_FRAME_HEADER_MAX                                                 \
    (KVS_FRAME_FIXED + KVS_MAX_GROUPS * (2 + 8 * KVS_MAX_DIMS) +              \
     KVS_FRAME_MAX_STAGES * (4 + KVS_STAGE_PARAMS_MAX) + 4)

/* One stage record as read from a frame; params point into the blob. */
typedef struct kvs_frame_stage {
    uint16_t id;
    uint16_t nparams;
    const uint8_t *params;
    const kvs_stage_type *type; /* NULL when the id is unknown */
} kvs_frame_stage;

/* A parsed header. */
typedef struct kvs_frame {
    uint8_t version;
    uint8_t flags;
    uint16_t header_len;
    uint64_t payload_len;
    uint64_t key_fingerprint;
    kvs_memory_format format;
    kvs_layout layout;
    uint32_t nstages;
    kvs_frame_stage stages[KVS_FRAME_MAX_STAGES];
    const uint8_t *header; /* blob[0..header_len) */
    const uint8_t *payload;
} kvs_frame;

/* The header's size for a layout and the parameter sizes of the stages. */
size_t kvs_frame_header_size(const kvs_layout *layout, const size_t *nparams,
                             uint32_t nstages);

/* Write a header into out (kvs_frame_header_size bytes): fields, groups,
 * stage records (ids and params), CRC. `key` NULL writes an unbound frame. */
void kvs_frame_write_header(uint8_t *out, const kvs_layout *layout, kvs_memory_format format,
                            const kvs_object_key *key, uint64_t payload_len,
                            const uint16_t *ids, const uint8_t *const *params,
                            const size_t *nparams, uint32_t nstages);

/* Parse and check a blob: every length against the blob, the header CRC,
 * version, flags, groups (a valid layout), stage ids known and their
 * parameters checked by their types, H + P == len exactly. Outcomes:
 *   KVS_ECORRUPT      not a frame (magic), truncated, trailing bytes, a bad
 *                     header CRC, a malformed field
 *   KVS_EUNSUPPORTED  a format version or a stage id this build does not know
 * `who` starts each message ("pipeline"). Reads only the blob. */
int kvs_frame_parse(const uint8_t *blob, size_t len, const char *who, kvs_frame *out);

/* 1 if the blob starts with the frame magic. */
int kvs_frame_is_framed(const uint8_t *blob, size_t len);

/* The canonical bytes of an object key (what the fingerprint hashes and
 * aes_gcm authenticates): "kvserde-key-v1" NUL, u32 hash length, hash, u16
 * model length, model, i64 rank, i64 group id, u16 salt length, salt.
 * Writes at most KVS_KEY_CANONICAL_MAX bytes; returns the length. */
#define KVS_KEY_CANONICAL_MAX                                                \
    (15 + 4 + KVS_CHUNK_HASH_MAX + 2 + KVS_MODEL_NAME_MAX + 8 + 8 + 2 + KVS_CACHE_SALT_MAX)
size_t kvs_key_canonical(const kvs_object_key *key, uint8_t *out);

/* "key 0123456789abcdef (model 'm')" for messages. */
void kvs_key_describe(const kvs_object_key *key, char *buf, size_t cap);

#endif /* KVSERDE_FRAME_FRAME_H */
