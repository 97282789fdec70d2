/* kvserde/pipeline.h - framed pipelines: self-describing, verified blobs,
 * bound to their object key, optionally encrypted.
 *
 * The "pipeline" serde (a single-kind serde of the registry, registry.h):
 *
 *     {"type": "pipeline", "stages": [{"type": "fp8"}, {"type": "crc32c"}]}
 *
 * writes one *frame* per object: a header that records the source layout
 * (groups, shapes, dtypes, memory format), the stage chain with each stage's
 * id and parameters, the payload length, a 64-bit fingerprint of the object
 * key and a CRC-32C of the header itself, followed by the payload the stages
 * produced. docs/frame_format.md defines the bytes. Decoding needs no
 * configuration: the reader rebuilds the chain from the frame (only the
 * secret keys of an encrypted frame come from the deserializer's config).
 *
 * Stages, in the order the chain allows
 *   1. exactly one typed stage (tensor -> bytes), first:
 *        {"type": "bytes"}   the tensor's own bytes (lossless)
 *        {"type": "fp8", "fp8_dtype": "float8_e4m3fn" | "float8_e5m2",
 *         "saturate": true}  one fp8 code per element, the fp8 serde's
 *                            numbers (fp8.h)
 *        {"type": "int", "bits": 4, "k_axis": "channel", "v_axis": "token",
 *         "group": 64, "k_group": G, "v_group": G, "zero_point": true,
 *         "scale_dtype": "float16", "levels": L, "hadamard": 0,
 *         "k_outliers": 0}
 *                            integer codes of `bits` (2-8) bits with a
 *                            scale (and zero point) per group of `group`
 *                            (1-65535) elements along the axis ("token",
 *                            "channel" or "tensor"), K and V apart (the
 *                            defaults are KIVI's). K and V are the halves
 *                            of a KV_2LTD / KV_2TD / KV_T2D object; any
 *                            other object is one [elements / last dim,
 *                            last dim] matrix with V's settings.
 *                            "hadamard": h rotates every head of h
 *                            channels (a power of two dividing the last
 *                            dim) first; "k_outliers": n keeps K's n
 *                            largest channels exactly; "levels" uses
 *                            fewer code values than 2^bits (default
 *                            2^bits with a zero point, 2^bits - 1 without)
 *                            so that a "lossless" stage after it codes a
 *                            finer step than fixed bits would. Error bound
 *                            and layout: docs/frame_format.md. Refused:
 *                            dtypes other than float32 / float16 /
 *                            bfloat16, non-finite elements, scales beyond
 *                            float16 (use "scale_dtype": "float32")
 *        {"type": "transform", "path": "T.safetensors", "step": 0.125,
 *         "k_step": ..., "v_step": ...}  (or "bits": 2.0, or "snr_db": 30)
 *                            lossy, for KV_2LTD chunks [2, layers, tokens,
 *                            hidden] of bfloat16 / float16 / float32 with
 *                            the transform's layers and hidden: the
 *                            calibrated basis `kvserde calibrate` wrote,
 *                            one uniform step per K / V (in units of the
 *                            layer's RMS; "step" sets both, default 0.125,
 *                            1e-4 to 64; "bits" 0.05-16 or "snr_db"
 *                            1-120 instead: the step whose predicted rate
 *                            or K/V SNR on the calibration statistics
 *                            meets it, resolved once at creation),
 *                            entropy-coded coefficients
 *                            (docs/frame_format.md, docs/fidelity.md). The
 *                            deserializer loads the same file from its own
 *                            config; a blob made with another transform,
 *                            or read without one, is KVS_EKEY
 *   2. then bytes -> bytes stages:
 *        {"type": "lossless", "level": 1, "coder": "zstd"}
 *                            exact compression: the typed stage's elements
 *                            split into byte planes per 64 Ki-element block,
 *                            each plane zstd (level -7 to 19, not 0) or raw,
 *                            whichever is smaller; with "coder": "rans",
 *                            2-byte elements (bfloat16, float16) are split
 *                            into the bfloat16 exponent, coded by rANS with
 *                            a table per channel group, and the sign and
 *                            mantissa, stored raw (other element sizes: the
 *                            zstd planes); 3x faster to encode, 0.6 %
 *                            larger on real KV; at "level" 2 or more the
 *                            rANS coder also lets a row refer to an
 *                            earlier row it repeats in part (1.56x on
 *                            real KV, a third slower); at 3 or more it
 *                            may code the signs instead, as flips of the
 *                            sign above per class of channels, mantissas
 *                            packed (1.58x on real KV, slower again)
 *                            (docs/frame_format.md, docs/performance.md)
 *        {"type": "crc32c"}  appends a CRC-32C of the bytes (4 bytes)
 *        {"type": "xxh3"}    appends an XXH3-64 of the bytes (8 bytes)
 *        {"type": "aes_gcm", "key_files": ["/etc/kv/k1", ...]}
 *                            AES-256-GCM (docs/security.md), 16-byte tag
 *   Rules, checked when the serde is created (KVS_EINVAL, the message says
 *   which order is allowed): the typed stage first and only once; at most
 *   one checksum (crc32c or xxh3); encryption last and at most once;
 *   anything that rewrites bytes (compression) before the checksum and the
 *   encryption. Every frame's payload is checked: a chain with neither a
 *   checksum nor encryption gets {"type": "crc32c"} appended, and the frame
 *   records it like any other stage. At most 16 stages.
 *
 * Sizes: estimate = header + the stages' bounds (fp8 + crc32c on N
 * elements: header + N + 4); serialize writes exactly the frame (the wrapper
 * stores only those bytes). The header is 28 bytes + 2 + 8 x ndim per group
 * + 4 + parameter bytes per stage + 4.
 *
 * Passes over memory: when the typed stage can encode any range of its
 * output (fp8, bytes), the checksum and the encryption run on each 256 KiB
 * block of it right after it is written, while it is in cache. Decoding
 * checks the whole payload first (a checksum reads it; aes_gcm decrypts it
 * into a scratch buffer and verifies the tag) and only then decodes into
 * the destination. The deserializer keeps up to 4 such scratch buffers
 * (1 GiB in all) for later calls, shared under a lock by the threads that
 * decode through it; they hold plaintext and are wiped when freed and when
 * the deserializer is destroyed (docs/security.md).
 *
 * Serialize is deterministic for the same source and key, except with
 * aes_gcm: every blob gets a fresh random nonce (the one documented
 * exception).
 *
 * Deserialize outcomes (each message names the object key and the numbers):
 *   KVS_ECORRUPT      not a frame, truncated, trailing bytes, header CRC or a
 *                     checksum mismatch, a malformed field, or a stored layout
 *                     that is not the destination's ("pipeline: stored object
 *                     is [2x4x64x256 bfloat16] (262144 bytes), destination
 *                     layout is [2x4x48x256 bfloat16] (196608 bytes)")
 *   KVS_EKEY          written for another object key: the fingerprint in
 *                     the frame is not the key's, or a frame written with
 *                     no key is loaded under one; or encoded with another
 *                     transform than the deserializer's (or it has none):
 *                     "transform: blob was encoded with transform
 *                     99f680d834080eae, this reader has transform ..."
 *   KVS_EUNSUPPORTED  a frame format version or a stage id this build does
 *                     not know
 *   KVS_EAUTH         aes_gcm: no configured key matches, or the tag does
 *                     not verify (ciphertext, header or key altered)
 * All of them are found before any destination byte is written. A NULL key
 * skips the binding check (a serde used directly on a file has no key);
 * aes_gcm still authenticates what it was given.
 */
#ifndef KVSERDE_PIPELINE_H
#define KVSERDE_PIPELINE_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "memobj.h"
#include "serde.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The frame's 64-bit key fingerprint: XXH3-64 of the key's canonical bytes
 * (docs/frame_format.md). 0 for NULL. */
KVS_API uint64_t kvs_object_key_fingerprint(const kvs_object_key *key);

/* The stage types this build knows, in registry order: up to cap names into
 * names[]; returns the total count. */
KVS_API size_t kvs_pipeline_stage_types(const char **names, size_t cap);

/* What a frame's header says, for inspect and scrubs. */
#define KVS_FRAME_INFO_MAX_STAGES 16
typedef struct kvs_frame_info {
    unsigned version;
    int keyed;                /* bound to an object key */
    uint64_t key_fingerprint; /* 0 when not keyed */
    size_t header_bytes;
    uint64_t payload_bytes;
    kvs_memory_format format;
    kvs_layout layout;
    uint32_t nstages;
    struct {
        char name[32];
        char params[192]; /* the parameters as a JSON object */
    } stages[KVS_FRAME_INFO_MAX_STAGES];
} kvs_frame_info;

/* 1 if blob[0..len) starts like a frame (its magic), else 0. */
KVS_API int kvs_frame_detect(const void *blob, size_t len);

/* Parse and check a frame's header against the blob (not its payload's
 * checks: see kvs_pipeline_verify). KVS_OK with *out filled, or
 * KVS_ECORRUPT / KVS_EUNSUPPORTED as for deserialize. */
KVS_API int kvs_frame_inspect(const void *blob, size_t len, kvs_frame_info *out);

/* Check a stored blob without decoding it: the header, the key binding
 * (skipped for a NULL key), every checksum and, with the deserializer's
 * keys, the encryption tag. `de` must be a pipeline deserializer (its keys
 * are used; one without key files can still check unencrypted frames and
 * refuses encrypted ones with KVS_EAUTH). Returns KVS_OK or the code
 * deserialize would return. */
KVS_API int kvs_pipeline_verify(kvs_deserializer *de, const void *blob, size_t len,
                                const kvs_object_key *key);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_PIPELINE_H */
