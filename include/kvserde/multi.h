/* kvserde/multi.h - multi-output serdes: groups of optional tensors (upstream
 * serde/multi.py), the single-tensor bridges, and the K/V split serde.
 *
 * The serdes of serde.h take one typed tensor at each end. That breaks down
 * in two cases: K and V stored at different dtypes (one tensor has one
 * dtype), and one side absent (K kept in CPU memory while only V goes to
 * storage). The interfaces here take a *group* instead: a fixed-length array
 * of optional memory objects, where NULL marks an absent slot. They are
 * additive: serde.h and everything built on it are unchanged.
 *
 * ---------------------------------------------------------------------
 * Groups
 * ---------------------------------------------------------------------
 * A group is an array of `n` pointers passed with its length:
 *
 *     kvs_memobj *group[2] = { k, v };        slot 0 = K, slot 1 = V
 *     kvs_memobj *v_only[2] = { NULL, v };    K absent
 *
 * and the parallel layout group an estimate takes:
 *
 *     const kvs_layout *layouts[2] = { &k->layout, &v->layout };
 *
 * NULL in a slot means:
 *   serialize input     the caller does not supply that tensor (a V-only
 *                       write). A slot the implementation requires is
 *                       refused (KVS_EINVAL).
 *   deserialize output  the caller does not want that tensor materialized
 *                       (a V-only read). The implementation never touches
 *                       it, and never fails only because a slot it permits
 *                       to be absent is absent.
 *   estimate layouts    mirrors the absence pattern serialize will see.
 *
 * Every implementation documents its group_size, what each slot carries,
 * and which slots may be absent.
 *
 * ---------------------------------------------------------------------
 * Implementing one
 * ---------------------------------------------------------------------
 * As in serde.h: embed the interface struct, set `ops` and `group_size`,
 * and recover yourself with KVS_CONTAINER_OF. The contracts of serde.h hold
 * (deterministic serialize; estimate from layouts alone and an upper bound;
 * nothing written to dst on failure; concurrent calls on different objects
 * allowed), plus:
 *   - the ops receive the group length `n` exactly as the caller gave it and
 *     must refuse n != group_size before reading any slot (use
 *     kvs_validate_group_size(), or a message of their own);
 *   - serialize never writes to the source objects.
 */
#ifndef KVSERDE_MULTI_H
#define KVSERDE_MULTI_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "memobj.h"
#include "serde.h"

#ifdef __cplusplus
extern "C" {
#endif

/* =====================================================================
 * Interfaces (upstream MultiSerializer / MultiDeserializer)
 * ================================================================== */

typedef struct kvs_multi_serializer kvs_multi_serializer;
typedef struct kvs_multi_deserializer kvs_multi_deserializer;

struct kvs_multi_serializer_ops {
    /* Short name used in messages ("kv_split"). */
    const char *name;
    /* Serialize the group src_group[0..n) into dst (from dst->data, at most
     * dst->capacity bytes); set *nwritten to the bytes written. Does not
     * change dst->used_size (the async layer narrows it). */
    int (*serialize)(kvs_multi_serializer *self, kvs_memobj *const *src_group,
                     size_t n, kvs_memobj *dst, const kvs_object_key *key,
                     size_t *nwritten);
    /* The buffer size to allocate for serializing a group of these layouts
     * (NULL where serialize will see an absent slot). */
    int (*estimate_serialized_size)(const kvs_multi_serializer *self,
                                    const kvs_layout *const *layouts, size_t n,
                                    size_t *nbytes);
    void (*destroy)(kvs_multi_serializer *self);
};

struct kvs_multi_serializer {
    const struct kvs_multi_serializer_ops *ops;
    /* The fixed group length this serializer takes (>= 1), set by the
     * implementation when it is created and never changed, so callers and
     * the async layer can check groups before any work. */
    size_t group_size;
};

struct kvs_multi_deserializer_ops {
    const char *name;
    /* Read the serialized bytes of src (its first used_size bytes) and fill
     * the present slots of dst_group[0..n); NULL slots are left alone.
     * key: the object's key or NULL, as in serde.h. */
    int (*deserialize)(kvs_multi_deserializer *self, const kvs_memobj *src,
                       kvs_memobj *const *dst_group, size_t n,
                       const kvs_object_key *key);
    void (*destroy)(kvs_multi_deserializer *self);
};

struct kvs_multi_deserializer {
    const struct kvs_multi_deserializer_ops *ops;
    size_t group_size; /* as for the serializer */
};

/* Checked calls through the ops tables. key may be NULL (serde.h). A NULL
 * serde, dst, src, nwritten or nbytes, or a NULL group array with n > 0, is
 * refused with KVS_EINVAL
 * ("multi: serialize: NULL argument"). Otherwise they return what the
 * implementation returns (which refuses a group whose length is not its
 * group_size), and make sure a failing implementation left a message. */
KVS_API int kvs_multi_serialize(kvs_multi_serializer *ser,
                                kvs_memobj *const *src_group, size_t n,
                                kvs_memobj *dst, const kvs_object_key *key,
                                size_t *nwritten);
KVS_API int kvs_multi_estimate_serialized_size(const kvs_multi_serializer *ser,
                                               const kvs_layout *const *layouts,
                                               size_t n, size_t *nbytes);
KVS_API int kvs_multi_deserialize(kvs_multi_deserializer *de,
                                  const kvs_memobj *src,
                                  kvs_memobj *const *dst_group, size_t n,
                                  const kvs_object_key *key);

/* The fixed group length (0 for NULL). */
KVS_API size_t kvs_multi_serializer_group_size(const kvs_multi_serializer *ser);
KVS_API size_t kvs_multi_deserializer_group_size(const kvs_multi_deserializer *de);

/* Destroy through the ops table; NULL is a no-op. */
KVS_API void kvs_multi_serializer_destroy(kvs_multi_serializer *ser);
KVS_API void kvs_multi_deserializer_destroy(kvs_multi_deserializer *de);

/* Upstream validate_group_size: KVS_OK if n == expected, else KVS_EINVAL
 * with a message naming `role` ("src", "dst" or "layout"; NULL reads as
 * "group") and both lengths:
 *     "multi: src group length 1 does not match expected 2"
 * A pure arity check, for callers and implementations alike. */
KVS_API int kvs_validate_group_size(size_t n, size_t expected, const char *role);

/* The sync halves of one multi-output serde, as a registry factory builds
 * them (see the kv_split factory), plus the worker count the async layer
 * should use. */
typedef struct kvs_multi_serde_pair {
    kvs_multi_serializer *serializer;
    kvs_multi_deserializer *deserializer;
    unsigned max_workers;
} kvs_multi_serde_pair;

/* Destroy both halves and zero the pair. NULL is a no-op. */
KVS_API void kvs_multi_serde_pair_destroy(kvs_multi_serde_pair *pair);

/* =====================================================================
 * Single-tensor bridges (upstream single_to_multi_serializer / _deserializer)
 * ================================================================== */

/* Wrap a single-tensor serializer as a multi serializer of group_size 1.
 * The bytes written and the estimate are exactly those of calling `inner`
 * directly on slot 0. Refused (KVS_EINVAL), naming the inner serde:
 *   a group of another length  "single-to-multi(fp8): expected group of
 *                               size 1, got 2" ("expected layout group of
 *                               size 1, got 2" for the estimate)
 *   an absent src slot         "single-to-multi(fp8): the single-tensor
 *                               serializer does not admit an absent src slot"
 *   an absent layout slot      "single-to-multi(fp8): the single-tensor
 *                               serializer requires a layout in slot 0"
 * On success the wrapper owns `inner` and destroys it with itself; on
 * failure (KVS_EINVAL for NULL arguments, KVS_ENOMEM) `inner` stays the
 * caller's and *out is untouched. */
KVS_API int kvs_single_to_multi_serializer(kvs_serializer *inner,
                                           kvs_multi_serializer **out);

/* Wrap a single-tensor deserializer as a multi deserializer of group_size
 * 1: a present slot 0 is filled exactly as `inner` fills it; an absent one
 * is a deliberate skip (KVS_OK, nothing read or written); a group of another
 * length is refused ("single-to-multi(fp8): expected group of size 1, got
 * 2"). Ownership as for the serializer bridge. */
KVS_API int kvs_single_to_multi_deserializer(kvs_deserializer *inner,
                                             kvs_multi_deserializer **out);

/* =====================================================================
 * The K/V split serde ("kv_split")
 * ================================================================== */
/*
 * group_size 2: slot 0 = K, slot 1 = V. Each present slot is one tensor of
 * float32, float16 or bfloat16: a layout of one or more groups that all have
 * the same dtype (its bytes are one contiguous array of that dtype).
 *
 * Each slot is stored either natively (its own bytes, unchanged) or cast to
 * an fp8 format. For an fp8 slot, scale decides the arithmetic:
 *
 *   KVS_KV_SPLIT_SCALE_PER_TENSOR (default)
 *     amax  = the largest |x| over the slot's finite elements (NaN and +-inf
 *             are ignored);
 *     scale = amax / fp8_max (binary32 division; fp8_max = 448 for e4m3fn,
 *             57344 for e5m2), or 1.0 when that quotient is below 2^-110
 *             (amax == 0, an all-zero or all-non-finite slot, or values so
 *             small that every one of them casts to +-0 anyway);
 *     code  = fp8(x * (fp8_max / amax)) with scale != 1.0, fp8(x) with 1.0:
 *             binary32 multiply, then the fp8 cast of fp8.h (round to nearest
 *             even, `saturate` policy). Finite values never overflow, so no
 *             finite input becomes NaN;
 *     read  = fp8_value(code) * scale (binary32), rounded to the destination
 *             dtype (nearest even).
 *     Non-finite inputs: NaN stays NaN. +-inf becomes +-fp8_max (so it reads
 *     back as +-fp8_max x scale) with saturate (the default); without it,
 *     NaN for e4m3fn and +-inf for e5m2, as fp8.h casts them.
 *   KVS_KV_SPLIT_SCALE_NONE
 *     the plain fp8.h cast with scale 1.0: the slot's bytes are identical to
 *     what the fp8 serde writes for that tensor.
 *
 *   KVS_KV_SPLIT_SCALE_PER_LAYER / _PER_LAYER_HEAD / _PER_TOKEN
 *     the per-tensor arithmetic on each scale group (see the enum below).
 *
 * Accuracy (finite x, fp8 slot): |read - x| <= 2^-4 |x| for e4m3fn, 2^-3 |x|
 * for e5m2 (half an ulp of the scaled value), plus half the fp8 format's
 * smallest subnormal times scale for values in the subnormal range, plus one
 * rounding to the destination dtype. A native slot read back into its own
 * dtype is bit-exact; into another dtype it is widened exactly or narrowed
 * with round to nearest even.
 *
 * The scalings use binary32 arithmetic in the default floating-point
 * environment; a host process running with flush-to-zero / denormals-are-zero
 * enabled may get different bytes for slots whose values are tiny.
 *
 * mode:
 *   KVS_KV_SPLIT_MODE_KV (default)  both slots required.
 *   KVS_KV_SPLIT_MODE_V_ONLY        K must be absent (a present K is
 *                                   refused), V required.
 * Both apply alike to serialize and estimate (layout slots mirror them).
 *
 * Halves of a T2D chunk (strided slots): a slot object whose format is
 * KVS_FMT_KV_T2D and whose layout is one 2-dim group [tokens, hidden] is
 * read (serialize) or written (deserialize) as the K or V half of a
 * [tokens, 2, hidden] chunk: row t at data + t x 2 x hidden elements, the
 * other half's rows between them never read nor written. data points at
 * the half's first row, and capacity must reach the end of its last row.
 * This is how the serde wrapper hands T2D chunks over without a gather
 * copy. Any other object is one contiguous array.
 *
 * The blob (docs/kv_split_format.md): an 80-byte header (magic "KVSP",
 * version, which slots are present, total length, and per slot: source
 * dtype, stored dtype, element count, byte length, payload offset, scale),
 * the present slots' payloads back to back (K then V, no padding), and a
 * 4-byte CRC-32C of everything before it. Integers little-endian,
 * fixed-width. estimate_serialized_size is exact: 84 + sum over present
 * layout slots of elements x stored size (1 for fp8, the dtype size for
 * native), plus 24 + 4 x scales for each scoped fp8 slot; serialize writes
 * exactly that many bytes.
 *
 * The deserializer reads any kv_split blob regardless of the options it was
 * created with (the blob describes itself). Each present destination slot is
 * written in its own dtype (float32, float16 or bfloat16). Refused before
 * any destination byte is written, each with its own message:
 *   KVS_ECORRUPT  a blob shorter than its header or than the length it
 *                 declares ("kv_split: truncated blob: 50 bytes, need 80"),
 *                 a bad magic, an inconsistent header, a checksum mismatch;
 *                 a stored object longer than the length its header
 *                 declares ("kv_split: stored object is 148 bytes, its
 *                 header declares 108"); a slot whose recorded element
 *                 count is not what the destination's layout needs, i.e. a
 *                 blob stored from another layout, more tokens or fewer
 *                 ("kv_split: stored V slot holds 16384 elements,
 *                 destination layout needs 12288");
 *   KVS_EUNSUPPORTED  a version this build does not read;
 *   KVS_EINVAL    a destination slot the blob does not hold, an unsupported
 *                 destination dtype.
 * kvs_kv_split_inspect() (below) ignores bytes after the declared length;
 * the deserializer refuses them.
 */

/* How a slot is stored. */
typedef enum kvs_kv_split_store {
    KVS_KV_SPLIT_STORE_NATIVE = 0,        /* the slot's own bytes */
    KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN = 1,
    KVS_KV_SPLIT_STORE_FLOAT8_E5M2 = 2,
} kvs_kv_split_store;

/* The scale scope of an fp8 slot (native slots ignore it). The scoped
 * ones split the slot into scale groups and give each its own binary32
 * scale, computed per group exactly as PER_TENSOR computes its one scale
 * (amax over the group's finite elements, amax / fp8_max, 1.0 below 2^-110).
 * They read the slot's layout (one group) as
 *     [layers, tokens, heads, head_dim]  (4 dims: heads from the layout)
 *     [layers, tokens, hidden]           (3 dims)
 *     [tokens, hidden]                   (2 dims: one layer)
 *     [hidden]                           (1 dim: one layer, one token)
 * and are refused for any other layout ("kv_split: scale 'per_layer' needs
 * one tensor of 1 to 4 dims; V source is [...]"):
 *   PER_LAYER       one scale per layer                 layers scales
 *   PER_LAYER_HEAD  one per layer and KV head (the hidden axis cut into
 *                   num_kv_heads equal runs)             layers x heads
 *   PER_TOKEN       one per token row of each layer      layers x tokens
 * Heads: kvs_kv_split_options.num_kv_heads, else the layout's head axis;
 * neither, a count that does not divide hidden, or a count that disagrees
 * with the layout's head axis, is refused. A scoped blob costs 24 + 4 x
 * (number of scales) bytes more than the per-tensor one
 * (docs/kv_split_format.md, version 2). */
typedef enum kvs_kv_split_scale {
    KVS_KV_SPLIT_SCALE_PER_TENSOR = 0,
    KVS_KV_SPLIT_SCALE_NONE = 1,
    KVS_KV_SPLIT_SCALE_PER_LAYER = 2,
    KVS_KV_SPLIT_SCALE_PER_LAYER_HEAD = 3,
    KVS_KV_SPLIT_SCALE_PER_TOKEN = 4,
} kvs_kv_split_scale;

typedef enum kvs_kv_split_mode {
    KVS_KV_SPLIT_MODE_KV = 0,
    KVS_KV_SPLIT_MODE_V_ONLY = 1,
} kvs_kv_split_mode;

typedef struct kvs_kv_split_options {
    kvs_kv_split_store k_store; /* default NATIVE */
    kvs_kv_split_store v_store; /* default FLOAT8_E4M3FN */
    kvs_kv_split_scale scale;   /* default PER_TENSOR */
    kvs_kv_split_mode mode;     /* default KV */
    int saturate;               /* fp8 overflow policy of fp8.h; default 1 */
    unsigned num_kv_heads;      /* heads for PER_LAYER_HEAD; 0 (default) =
                                   the layout's head axis */
} kvs_kv_split_options;

/* Fill *opts with the defaults above. */
KVS_API void kvs_kv_split_options_init(kvs_kv_split_options *opts);

/* Create the kv_split serde with `opts` (NULL = the defaults). Either output
 * pointer may be NULL if that half is not wanted (not both). An option out of
 * range is refused with KVS_EINVAL ("kv_split: unknown k_store 7"). */
KVS_API int kvs_kv_split_serde_create(const kvs_kv_split_options *opts,
                                      kvs_multi_serializer **ser,
                                      kvs_multi_deserializer **de);

/* Blob constants. */
#define KVS_KV_SPLIT_MAGIC "KVSP"
/* The newest blob version this build writes and reads. It writes version 1
 * (readable by every build) unless a slot has a scoped scale, which needs
 * version 2; it reads both. */
#define KVS_KV_SPLIT_VERSION 2
#define KVS_KV_SPLIT_HEADER_SIZE 80
#define KVS_KV_SPLIT_TRAILER_SIZE 4 /* the CRC-32C */

/* What a blob's header says about one slot. */
typedef struct kvs_kv_split_slot_info {
    int present;
    kvs_dtype src_dtype;    /* dtype of the tensor that was serialized */
    kvs_dtype stored_dtype; /* == src_dtype (native) or an fp8 dtype */
    uint64_t numel;
    uint64_t offset;        /* of the payload, from the start of the blob */
    uint64_t nbytes;        /* of the payload */
    float scale;            /* 1.0 unless per-tensor scaled */
    /* version 2: the scale scope (PER_TENSOR for a tensor-wide scale,
     * including 1.0) and, for a scoped slot, its scale table: `nscales`
     * binary32 scales at blob offset scales_offset; element (row r, column
     * c) of the [rows, cols] slot uses scale (r / rows_per_scale) x (cols /
     * cols_per_scale) + c / cols_per_scale. 0 for a tensor-wide scale. */
    kvs_kv_split_scale scope;
    uint64_t nscales, cols, rows_per_scale, cols_per_scale, scales_offset;
} kvs_kv_split_slot_info;

typedef struct kvs_kv_split_info {
    unsigned version;
    uint64_t total_size;  /* header + payloads + trailer */
    uint32_t crc32c;      /* the stored checksum */
    kvs_kv_split_slot_info slots[2];
} kvs_kv_split_info;

/* Validate the blob in blob[0..len) completely (structure, lengths,
 * checksum) and describe it. Refused with the deserializer's messages. */
KVS_API int kvs_kv_split_inspect(const void *blob, size_t len,
                                 kvs_kv_split_info *out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_MULTI_H */
