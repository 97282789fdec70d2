/* kv_split.c - the K/V split multi-output serde: a group of two tensors
 * (slot 0 = K, slot 1 = V), each stored natively or cast to fp8 with an
 * optional per-tensor scale, in one self-describing, checksummed blob.
 *
 * include/kvserde/multi.h is the contract; docs/kv_split_format.md is the
 * byte format. The blob comes back from shared storage that other machines
 * write, so the reader treats it as hostile: every field is checked against
 * every other and against the blob's size, and the checksum is verified,
 * before a single destination byte is written.
 *
 * Work is done in chunks small enough to stay in cache, so the checksum of
 * each chunk of output is computed while the chunk is still hot.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/clones.h"
#include "codecs/half.h"
#include "codecs/fp8_kernels.h"
#include "codecs/kv_split.h"
#include "kvserde/error.h"
#include "kvserde/fp8.h"
#include "kvserde/multi.h"
#include "kvserde/registry.h"
#include "util/crc32c.h"
#include "util/le.h"

#define NSLOTS 2
#define FIXED_SIZE 16 /* magic, version, nslots, mask, total size */
#define DESC_SIZE 32  /* one slot descriptor */
#define HEADER_SIZE KVS_KV_SPLIT_HEADER_SIZE
#define TRAILER_SIZE KVS_KV_SPLIT_TRAILER_SIZE
#define OVERHEAD (HEADER_SIZE + TRAILER_SIZE)
#define BLOCK 1024            /* elements per vectorized conversion step */
#define SPAN (16 * 1024)      /* output bytes per checksum step (stays in cache) */
#define MIN_SCALE 0x1p-110f   /* smaller scales are replaced by 1.0 */

_Static_assert(FIXED_SIZE + NSLOTS * DESC_SIZE == HEADER_SIZE, "header layout");

static const char *const slot_names[NSLOTS] = {"K", "V"};

/* ---------------------------------------------------------------------
 * Element access for float32 / float16 / bfloat16 arrays at any alignment
 * ------------------------------------------------------------------ */

static int is_wide(kvs_dtype dt)
{
    return dt == KVS_DTYPE_FLOAT32 || dt == KVS_DTYPE_FLOAT16 || dt == KVS_DTYPE_BFLOAT16;
}

static int is_fp8(kvs_dtype dt)
{
    return dt == KVS_DTYPE_FLOAT8_E4M3FN || dt == KVS_DTYPE_FLOAT8_E5M2;
}

static float fp8_max(kvs_dtype fp8)
{
    return fp8 == KVS_DTYPE_FLOAT8_E4M3FN ? KVS_FP8_E4M3FN_MAX : KVS_FP8_E5M2_MAX;
}

/* The hot loops below run over blocks of exactly BLOCK elements (plus one
 * shorter tail), written branch-free: a constant trip count is what lets
 * GCC's -O2 vectorizer (the "very cheap" cost model) take them. */
#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* The three hot loops are also compiled for AVX2 (CLONES, codecs/clones.h):
 * twice the vector width, and a cheaper float32 -> bfloat16 pack. */

/* float16 bits -> float32, branch-free, for the scaled fp8 cast: the same
 * value as kvs_f16_to_f32() for every non-NaN input (a NaN's quiet bit may
 * differ, which the cast cannot observe: every NaN becomes the fp8 NaN). A subnormal is converted as
 * its integer mantissa times 2^-24: both steps exact, and with no subnormal
 * float32 operand or result, so FTZ / DAZ cannot change it. */
ALWAYS_INLINE float f16_to_f32_fast(uint16_t h)
{
    uint32_t a = h & 0x7FFFu, sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t normal = (a << 13) + 0x38000000u; /* rebias 15 -> 127 */
    uint32_t special = (a << 13) | 0x7F800000u;
    uint32_t sub = kvs_f32_to_bits((float)(int32_t)a * 0x1p-24f);
    uint32_t is_special = 0u - (uint32_t)(a >= 0x7C00u); /* all ones or zero */
    uint32_t is_sub = 0u - (uint32_t)(a < 0x0400u);
    uint32_t bits = (normal & ~is_special) | (special & is_special);
    bits = (bits & ~is_sub) | (sub & is_sub);
    return kvs_f32_from_bits(bits | sign);
}

/* out[i] = (float)src[i] * mul for i < n (src at any alignment). */
ALWAYS_INLINE void load_scaled_n(const uint8_t *restrict src, kvs_dtype dt, size_t n,
                                 float mul, float *restrict out)
{
    switch (dt) {
    case KVS_DTYPE_FLOAT32:
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, src + 4 * i, 4);
            out[i] = f * mul;
        }
        break;
    case KVS_DTYPE_FLOAT16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = f16_to_f32_fast(h) * mul;
        }
        break;
    default: /* bfloat16 */
        for (size_t i = 0; i < n; i++) {
            uint16_t b;
            memcpy(&b, src + 2 * i, 2);
            out[i] = kvs_f32_from_bits((uint32_t)b << 16) * mul;
        }
        break;
    }
}

CLONES static void load_scaled(const uint8_t *restrict src, kvs_dtype dt, size_t n, float mul,
                        float *restrict out)
{
    if (n == BLOCK)
        load_scaled_n(src, dt, BLOCK, mul, out);
    else
        load_scaled_n(src, dt, n, mul, out);
}

/* out[i] = (float)src[i] for i < n, exactly as half.h widens (the native
 * slot read into another dtype: not hot). */
static void load_exact(const uint8_t *src, kvs_dtype dt, size_t n, float *out)
{
    if (dt == KVS_DTYPE_FLOAT32) {
        memcpy(out, src, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        out[i] = dt == KVS_DTYPE_FLOAT16 ? kvs_f16_to_f32(h) : kvs_bf16_to_f32(h);
    }
}

/* dst[i] = in[i] rounded to dt (nearest even) for i < n. */
static void store_f32(uint8_t *dst, kvs_dtype dt, size_t n, const float *in)
{
    switch (dt) {
    case KVS_DTYPE_FLOAT32:
        memcpy(dst, in, n * 4);
        break;
    case KVS_DTYPE_FLOAT16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = kvs_f32_to_f16(in[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        break;
    default: /* bfloat16 */
        for (size_t i = 0; i < n; i++) {
            uint16_t b = kvs_f32_to_bf16(in[i]);
            memcpy(dst + 2 * i, &b, 2);
        }
        break;
    }
}

/* dst[i] = in[i] * mul, rounded to float32 or (branch-free, the rule of
 * kvs_f32_bits_to_bf16_bits) bfloat16, for i < n. */
ALWAYS_INLINE void store_scaled_n(uint8_t *restrict dst, kvs_dtype dt, size_t n,
                                  const float *restrict in, float mul)
{
    if (dt == KVS_DTYPE_FLOAT32) {
        for (size_t i = 0; i < n; i++) {
            float f = in[i] * mul;
            memcpy(dst + 4 * i, &f, 4);
        }
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t f = kvs_f32_to_bits(in[i] * mul);
        uint32_t is_nan = 0u - (uint32_t)((f & 0x7FFFFFFFu) > 0x7F800000u);
        uint32_t rounded = (f + 0x7FFFu + ((f >> 16) & 1u)) >> 16;
        uint32_t quiet = (f >> 16) | 0x0040u;
        uint16_t b = (uint16_t)((rounded & ~is_nan) | (quiet & is_nan));
        memcpy(dst + 2 * i, &b, 2);
    }
}

CLONES static void store_scaled(uint8_t *restrict dst, kvs_dtype dt, size_t n,
                         const float *restrict in, float mul)
{
    if (n == BLOCK)
        store_scaled_n(dst, dt, BLOCK, in, mul);
    else
        store_scaled_n(dst, dt, n, in, mul);
}

/* The largest magnitude over the finite elements (0 if there are none).
 * Compared as integers: for non-negative IEEE values the bit patterns order
 * like the values, and the finite ones are those below the inf pattern
 * (NaN and inf count as 0). */
ALWAYS_INLINE uint32_t amax_bits32_n(const uint8_t *p, size_t n)
{
    int32_t best = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t u;
        memcpy(&u, p + 4 * i, 4);
        u &= 0x7FFFFFFF;
        u = u < 0x7F800000 ? u : 0;
        best = u > best ? u : best;
    }
    return (uint32_t)best;
}

ALWAYS_INLINE uint16_t amax_bits16_n(const uint8_t *p, size_t n, int16_t inf)
{
    int16_t best = 0;
    for (size_t i = 0; i < n; i++) {
        int16_t u;
        memcpy(&u, p + 2 * i, 2);
        u &= 0x7FFF;
        u = u < inf ? u : 0;
        best = u > best ? u : best;
    }
    return (uint16_t)best;
}

CLONES static float finite_amax(const uint8_t *src, kvs_dtype dt, size_t n)
{
    size_t esize = kvs_dtype_size(dt), i = 0;
    if (dt == KVS_DTYPE_FLOAT32) {
        uint32_t best = 0;
        for (; i + BLOCK <= n; i += BLOCK) {
            uint32_t m = amax_bits32_n(src + i * esize, BLOCK);
            best = m > best ? m : best;
        }
        uint32_t m = amax_bits32_n(src + i * esize, n - i);
        return kvs_f32_from_bits(m > best ? m : best);
    }
    int16_t inf = dt == KVS_DTYPE_FLOAT16 ? 0x7C00 : 0x7F80;
    uint16_t best = 0;
    for (; i + BLOCK <= n; i += BLOCK) {
        uint16_t m = amax_bits16_n(src + i * esize, BLOCK, inf);
        best = m > best ? m : best;
    }
    uint16_t m = amax_bits16_n(src + i * esize, n - i, inf);
    best = m > best ? m : best;
    return dt == KVS_DTYPE_FLOAT16 ? kvs_f16_to_f32(best) : kvs_bf16_to_f32(best);
}

/* ---------------------------------------------------------------------
 * Slots: what a layout may hold, and the plan for writing one
 * ------------------------------------------------------------------ */

/* A slot's tensor: a valid layout of one or more groups that all have the
 * same float dtype (so its bytes are one contiguous array). `role` is
 * "source", "layout" or "destination". */
static int slot_dtype(const kvs_layout *layout, int slot, const char *role, kvs_dtype *out)
{
    int rc = kvs_layout_validate(layout);
    if (rc) return rc;
    if (layout->ngroups == 0)
        return kvs_set_error(KVS_EINVAL,
                             "kv_split: %s %s has no groups; expected one tensor of "
                             "float32, float16 or bfloat16",
                             slot_names[slot], role);
    kvs_dtype dt = layout->groups[0].dtype;
    for (uint32_t g = 1; g < layout->ngroups; g++)
        if (layout->groups[g].dtype != dt)
            return kvs_set_error(KVS_EINVAL,
                                 "kv_split: %s %s mixes dtypes: group 0 is %s, group %u "
                                 "is %s",
                                 slot_names[slot], role, kvs_dtype_name(dt), g,
                                 kvs_dtype_name(layout->groups[g].dtype));
    if (!is_wide(dt))
        return kvs_set_error(KVS_EINVAL,
                             "kv_split: %s %s dtype '%s' unsupported; expected float32, "
                             "float16 or bfloat16",
                             slot_names[slot], role, kvs_dtype_name(dt));
    *out = dt;
    return KVS_OK;
}

/* The blob's scope code for a slot (descriptor byte +2, version 2): 0 for a
 * tensor-wide scale, else the kvs_kv_split_scale value. */
static int scoped(kvs_kv_split_scale s)
{
    return s == KVS_KV_SPLIT_SCALE_PER_LAYER || s == KVS_KV_SPLIT_SCALE_PER_LAYER_HEAD ||
           s == KVS_KV_SPLIT_SCALE_PER_TOKEN;
}

static const char *scale_name(kvs_kv_split_scale s)
{
    switch (s) {
    case KVS_KV_SPLIT_SCALE_PER_TENSOR: return "per_tensor";
    case KVS_KV_SPLIT_SCALE_NONE: return "none";
    case KVS_KV_SPLIT_SCALE_PER_LAYER: return "per_layer";
    case KVS_KV_SPLIT_SCALE_PER_LAYER_HEAD: return "per_layer_head";
    default: return "per_token";
    }
}

#define SCALE_BLOCK 24 /* cols, rows_per_scale, cols_per_scale (u64 each) */

typedef struct slot_plan {
    int present;
    kvs_dtype src_dtype;
    kvs_dtype stored_dtype;
    uint64_t numel;
    uint64_t offset;
    uint64_t nbytes;
    float scale; /* 1.0: plain cast or native */
    float inv;   /* fp8_max / amax when scale != 1.0 */
    /* a scoped fp8 slot (scope != 0): the scale table's geometry */
    int scope;
    uint64_t cols, rps, cps, nscales;
    float *scales, *invs; /* serialize: nscales each */
} slot_plan;

typedef struct kv_split_serializer {
    kvs_multi_serializer base;
    kvs_kv_split_options opts;
} kv_split_serializer;

typedef struct kv_split_deserializer {
    kvs_multi_deserializer base;
} kv_split_deserializer;

static kvs_dtype stored_dtype(kvs_kv_split_store store, kvs_dtype src)
{
    switch (store) {
    case KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN: return KVS_DTYPE_FLOAT8_E4M3FN;
    case KVS_KV_SPLIT_STORE_FLOAT8_E5M2: return KVS_DTYPE_FLOAT8_E5M2;
    default: return src;
    }
}

/* The scale groups of a scoped fp8 slot, from its layout (multi.h). */
static int scope_geometry(const kvs_kv_split_options *o, const kvs_layout *l, int s,
                          const char *what, slot_plan *p)
{
    const char *sn = scale_name(o->scale);
    char lb[200];
    const kvs_shape *sh = &l->groups[0].shape;
    if (l->ngroups != 1 || sh->ndim < 1 || sh->ndim > 4)
        return kvs_set_error(KVS_EINVAL,
                             "kv_split: scale '%s' needs one tensor of 1 to 4 dims "
                             "([layers, tokens, heads, head_dim], [layers, tokens, hidden], "
                             "[tokens, hidden] or [hidden]); %s %s is %s",
                             sn, slot_names[s], what, kvs_layout_format(l, lb, sizeof lb));
    uint64_t layers = 1, tokens = 1, hidden, lheads = 0;
    switch (sh->ndim) {
    case 4:
        layers = (uint64_t)sh->dims[0], tokens = (uint64_t)sh->dims[1];
        lheads = (uint64_t)sh->dims[2];
        hidden = lheads * (uint64_t)sh->dims[3];
        break;
    case 3:
        layers = (uint64_t)sh->dims[0], tokens = (uint64_t)sh->dims[1];
        hidden = (uint64_t)sh->dims[2];
        break;
    case 2: tokens = (uint64_t)sh->dims[0], hidden = (uint64_t)sh->dims[1]; break;
    default: hidden = (uint64_t)sh->dims[0]; break;
    }
    uint64_t heads = 1;
    if (o->scale == KVS_KV_SPLIT_SCALE_PER_LAYER_HEAD) {
        if (o->num_kv_heads && lheads && o->num_kv_heads != lheads)
            return kvs_set_error(KVS_EINVAL,
                                 "kv_split: num_kv_heads %u disagrees with the head axis of "
                                 "%s %s %s (%llu heads)",
                                 o->num_kv_heads, slot_names[s], what,
                                 kvs_layout_format(l, lb, sizeof lb),
                                 (unsigned long long)lheads);
        heads = o->num_kv_heads ? o->num_kv_heads : lheads;
        if (heads == 0)
            return kvs_set_error(KVS_EINVAL,
                                 "kv_split: scale 'per_layer_head' needs the KV head count: "
                                 "give num_kv_heads, or a [layers, tokens, heads, head_dim] "
                                 "layout (%s %s is %s)",
                                 slot_names[s], what, kvs_layout_format(l, lb, sizeof lb));
        if (hidden % heads != 0)
            return kvs_set_error(KVS_EINVAL,
                                 "kv_split: %s %s hidden size %llu is not a multiple of "
                                 "num_kv_heads %llu",
                                 slot_names[s], what, (unsigned long long)hidden,
                                 (unsigned long long)heads);
    }
    p->scope = (int)o->scale;
    if (p->numel == 0) { /* nothing to scale: an empty table */
        p->cols = p->rps = p->cps = p->nscales = 0;
        return KVS_OK;
    }
    p->cols = hidden;
    p->rps = o->scale == KVS_KV_SPLIT_SCALE_PER_TOKEN ? 1 : tokens;
    p->cps = hidden / heads;
    p->nscales = layers * tokens / p->rps * heads;
    return KVS_OK;
}

/* Check the presence pattern against the mode and each present layout, and
 * lay the blob out. `role` is "src" (serialize) or "layout" (estimate). */
static int plan_blob(const kvs_kv_split_options *o, const kvs_layout *const *layouts,
                     const char *role, slot_plan plan[NSLOTS], uint64_t *total)
{
    const char *mode = o->mode == KVS_KV_SPLIT_MODE_KV ? "kv" : "v_only";
    for (int s = 0; s < NSLOTS; s++) {
        memset(&plan[s], 0, sizeof plan[s]);
        plan[s].scale = plan[s].inv = 1.0f;
    }
    if (o->mode == KVS_KV_SPLIT_MODE_KV && layouts[0] == NULL)
        return kvs_set_error(KVS_EINVAL,
                             "kv_split: K (slot 0) is required in mode 'kv' but the %s "
                             "slot is absent",
                             role);
    if (o->mode == KVS_KV_SPLIT_MODE_V_ONLY && layouts[0] != NULL)
        return kvs_set_error(KVS_EINVAL,
                             "kv_split: K (slot 0) must be absent in mode 'v_only' but "
                             "the %s slot is present",
                             role);
    if (layouts[1] == NULL)
        return kvs_set_error(KVS_EINVAL,
                             "kv_split: V (slot 1) is required in mode '%s' but the %s "
                             "slot is absent",
                             mode, role);
    uint64_t offset = HEADER_SIZE;
    const char *what = strcmp(role, "src") == 0 ? "source" : "layout";
    for (int s = 0; s < NSLOTS; s++) {
        if (layouts[s] == NULL) continue;
        kvs_dtype dt;
        int rc = slot_dtype(layouts[s], s, what, &dt);
        if (rc) return rc;
        plan[s].present = 1;
        plan[s].src_dtype = dt;
        plan[s].stored_dtype = stored_dtype(s == 0 ? o->k_store : o->v_store, dt);
        plan[s].numel = kvs_layout_numel(layouts[s]);
        plan[s].offset = offset;
        /* Under 2^63 bytes (the layout rule; a stored element is never
         * wider than its source), but two of them could still wrap. */
        plan[s].nbytes = plan[s].numel * kvs_dtype_size(plan[s].stored_dtype);
        if (is_fp8(plan[s].stored_dtype) && scoped(o->scale)) {
            if ((rc = scope_geometry(o, layouts[s], s, what, &plan[s]))) return rc;
            /* nscales <= numel, so this stays far below 2^64 */
            plan[s].nbytes += SCALE_BLOCK + 4 * plan[s].nscales;
        }
        if (plan[s].nbytes > (uint64_t)SIZE_MAX - TRAILER_SIZE - offset)
            return kvs_set_error(KVS_EINVAL,
                                 "kv_split: blob size overflows: %s payload of %llu bytes "
                                 "after %llu",
                                 slot_names[s], (unsigned long long)plan[s].nbytes,
                                 (unsigned long long)offset);
        offset += plan[s].nbytes;
    }
    *total = offset + TRAILER_SIZE;
    return KVS_OK;
}

/* ---------------------------------------------------------------------
 * Walking a slot: physical layout (contiguous or a T2D half) x scale groups
 * ------------------------------------------------------------------ */

/* Where a slot's elements live: runs of `seg` contiguous elements, run j
 * at byte j x stride (one run for a contiguous object). */
typedef struct phys {
    uint64_t seg, stride;
} phys;

/* A T2D half (multi.h): format KV_T2D, one 2-dim group [tokens, hidden]. */
static int is_t2d_half(const kvs_memobj *obj)
{
    return obj->format == KVS_FMT_KV_T2D && obj->layout.ngroups == 1 &&
           obj->layout.groups[0].shape.ndim == 2;
}

static phys phys_of(const kvs_memobj *obj, uint64_t numel, size_t esize)
{
    phys ph = {numel ? numel : 1, 0};
    if (is_t2d_half(obj) && obj->layout.groups[0].shape.dims[1] > 0) {
        ph.seg = (uint64_t)obj->layout.groups[0].shape.dims[1];
        ph.stride = 2 * ph.seg * esize;
    }
    return ph;
}

/* The piece starting at element i: at most SPAN elements, within one
 * physical run and one scale group. Sets its scale index and the byte
 * offset of its first element in the object; returns its length. */
static size_t piece_at(uint64_t numel, uint64_t cols, uint64_t rps, uint64_t cps,
                       uint64_t nscales, phys ph, size_t esize, uint64_t i, uint64_t *sidx,
                       uint64_t *byte_off)
{
    uint64_t len = numel - i;
    if (len > SPAN) len = SPAN;
    *sidx = 0;
    if (nscales) {
        uint64_t r = i / cols, c = i % cols;
        *sidx = (r / rps) * (cols / cps) + c / cps;
        uint64_t left = cps - c % cps;
        if (len > left) len = left;
    }
    uint64_t off = i % ph.seg;
    if (len > ph.seg - off) len = ph.seg - off;
    *byte_off = (i / ph.seg) * ph.stride + off * esize;
    return (size_t)len;
}

/* ---------------------------------------------------------------------
 * Serialize
 * ------------------------------------------------------------------ */

static void write_header(uint8_t *b, const slot_plan plan[NSLOTS], uint64_t total)
{
    int v2 = plan[0].scope || plan[1].scope;
    memset(b, 0, HEADER_SIZE);
    memcpy(b, KVS_KV_SPLIT_MAGIC, 4);
    put_le16(b + 4, v2 ? 2 : 1);
    b[6] = NSLOTS;
    b[7] = (uint8_t)((plan[0].present ? 1 : 0) | (plan[1].present ? 2 : 0));
    put_le64(b + 8, total);
    for (int s = 0; s < NSLOTS; s++) {
        if (!plan[s].present) continue; /* an absent slot's descriptor is all zero */
        uint8_t *d = b + FIXED_SIZE + s * DESC_SIZE;
        d[0] = (uint8_t)plan[s].src_dtype;
        d[1] = (uint8_t)plan[s].stored_dtype;
        d[2] = (uint8_t)plan[s].scope;
        put_le32(d + 4, kvs_f32_to_bits(plan[s].scale));
        put_le64(d + 8, plan[s].numel);
        put_le64(d + 16, plan[s].offset);
        put_le64(d + 24, plan[s].nbytes);
    }
}

/* The scale of each group from the data (the only data-dependent step):
 * amax over the group's finite elements, then the per-tensor rule. */
static void compute_scales(slot_plan *p, const uint8_t *src, phys ph)
{
    size_t esize = kvs_dtype_size(p->src_dtype);
    float one = 0, *amax = p->nscales ? p->scales : &one;
    for (uint64_t j = 0; j < p->nscales; j++) amax[j] = 0;
    for (uint64_t i = 0; i < p->numel;) {
        uint64_t s, off;
        size_t m = piece_at(p->numel, p->cols, p->rps, p->cps, p->nscales, ph, esize, i, &s,
                            &off);
        float a = finite_amax(src + off, p->src_dtype, m);
        if (a > amax[s]) amax[s] = a;
        i += m;
    }
    float fmax = fp8_max(p->stored_dtype);
    uint64_t n = p->nscales ? p->nscales : 1;
    for (uint64_t j = 0; j < n; j++) {
        float a = amax[j], scale = a / fmax, inv = 1.0f;
        if (scale >= MIN_SCALE) inv = fmax / a;
        else scale = 1.0f;
        if (p->nscales) p->scales[j] = scale, p->invs[j] = inv;
        else p->scale = scale, p->inv = inv;
    }
}

/* Write one slot's payload at out, feeding every byte to *crc, a piece at a
 * time while it is still in cache. */
static int write_payload(const slot_plan *p, const uint8_t *src, phys ph, int saturate,
                         uint8_t *out, uint32_t *crc)
{
    if (p->scope) { /* the scale table first */
        put_le64(out, p->cols);
        put_le64(out + 8, p->rps);
        put_le64(out + 16, p->cps);
        for (uint64_t j = 0; j < p->nscales; j++)
            put_le32(out + SCALE_BLOCK + 4 * j, kvs_f32_to_bits(p->scales[j]));
        size_t tb = (size_t)(SCALE_BLOCK + 4 * p->nscales);
        *crc = kvs_crc32c(*crc, out, tb);
        out += tb;
    }
    size_t esize = kvs_dtype_size(p->src_dtype), osize = kvs_dtype_size(p->stored_dtype);
    float tmp[BLOCK];
    for (uint64_t i = 0; i < p->numel;) {
        uint64_t s, off;
        size_t m = piece_at(p->numel, p->cols, p->rps, p->cps, p->nscales, ph, esize, i, &s,
                            &off);
        const uint8_t *in = src + off;
        uint8_t *o = out + i * osize;
        if (!is_fp8(p->stored_dtype)) {
            memcpy(o, in, m * esize);
        } else {
            float scale = p->nscales ? p->scales[s] : p->scale;
            float inv = p->nscales ? p->invs[s] : p->inv;
            if (scale == 1.0f) { /* the plain cast: exactly the fp8 serde's bytes */
                int rc = kvs_fp8_encode(in, p->src_dtype, o, p->stored_dtype, saturate, m);
                if (rc) return rc;
            } else {
                for (size_t j = 0; j < m; j += BLOCK) {
                    size_t k = m - j < BLOCK ? m - j : BLOCK;
                    load_scaled(in + j * esize, p->src_dtype, k, inv, tmp);
                    int rc = kvs_fp8_encode(tmp, KVS_DTYPE_FLOAT32, o + j, p->stored_dtype,
                                            saturate, k);
                    if (rc) return rc;
                }
            }
        }
        *crc = kvs_crc32c(*crc, o, m * osize);
        i += m;
    }
    return KVS_OK;
}

/* The object must really hold what its layout describes (a T2D half: up
 * to the end of its last row). */
static int check_object(const kvs_memobj *obj, int slot, const char *role)
{
    uint64_t need = kvs_layout_nbytes(&obj->layout);
    if (is_t2d_half(obj) && need > 0) {
        uint64_t row = need / (uint64_t)obj->layout.groups[0].shape.dims[0];
        need += need - row; /* (tokens - 1) x 2 x row + row */
    }
    if (obj->capacity < need || (obj->data == NULL && need > 0))
        return kvs_set_error(KVS_EINVAL,
                             "kv_split: %s %s holds %zu bytes, its layout needs %llu",
                             slot_names[slot], role, obj->data ? obj->capacity : 0,
                             (unsigned long long)need);
    return KVS_OK;
}

/* Fail now, before any output, if the fp8 kernels cannot run (a forced
 * KVSERDE_ISA this CPU lacks). */
static int probe_fp8(const slot_plan plan[NSLOTS], int decode)
{
    for (int s = 0; s < NSLOTS; s++) {
        if (!plan[s].present || !is_fp8(plan[s].stored_dtype)) continue;
        uint8_t byte = 0;
        float f = 0;
        int rc = decode ? kvs_fp8_decode(&byte, plan[s].stored_dtype, &f,
                                         KVS_DTYPE_FLOAT32, 0)
                        : kvs_fp8_encode(&f, KVS_DTYPE_FLOAT32, &byte,
                                         plan[s].stored_dtype, 1, 0);
        if (rc) return rc;
    }
    return KVS_OK;
}

/* The key is not used: the blob's own CRC32C covers damage; binding to a
 * key is the frame's job (a pipeline). */
static int kv_split_serialize(kvs_multi_serializer *s, kvs_memobj *const *src_group,
                              size_t n, kvs_memobj *dst, const kvs_object_key *key,
                              size_t *nwritten)
{
    (void)key;
    kv_split_serializer *self = KVS_CONTAINER_OF(s, kv_split_serializer, base);
    int rc = kvs_validate_group_size(n, NSLOTS, "src");
    if (rc) return rc;
    const kvs_layout *layouts[NSLOTS];
    for (int i = 0; i < NSLOTS; i++)
        layouts[i] = src_group[i] ? &src_group[i]->layout : NULL;
    slot_plan plan[NSLOTS];
    uint64_t total;
    rc = plan_blob(&self->opts, layouts, "src", plan, &total);
    if (rc) return rc;
    for (int i = 0; i < NSLOTS; i++)
        if (plan[i].present && (rc = check_object(src_group[i], i, "source")))
            return rc;
    if (dst->capacity < total || dst->data == NULL)
        return kvs_set_error(KVS_ENOSPC, "kv_split: destination too small: %zu bytes, need %llu",
                             dst->data ? dst->capacity : 0, (unsigned long long)total);
    if ((rc = probe_fp8(plan, 0))) return rc;

    phys ph[NSLOTS] = {{1, 0}, {1, 0}};
    for (int i = 0; i < NSLOTS; i++) {
        slot_plan *p = &plan[i];
        if (!p->present) continue;
        ph[i] = phys_of(src_group[i], p->numel, kvs_dtype_size(p->src_dtype));
        if (!is_fp8(p->stored_dtype) || self->opts.scale == KVS_KV_SPLIT_SCALE_NONE)
            continue;
        if (p->nscales) {
            p->scales = malloc((size_t)p->nscales * 2 * sizeof(float));
            if (p->scales == NULL) {
                free(plan[0].scales);
                return kvs_set_error(KVS_ENOMEM, "kv_split: out of memory for %llu scales",
                                     (unsigned long long)p->nscales);
            }
            p->invs = p->scales + p->nscales;
        }
        compute_scales(p, src_group[i]->data, ph[i]);
    }

    uint8_t *b = dst->data;
    write_header(b, plan, total);
    uint32_t crc = kvs_crc32c(0, b, HEADER_SIZE);
    for (int i = 0; i < NSLOTS && rc == KVS_OK; i++) {
        if (!plan[i].present) continue;
        rc = write_payload(&plan[i], src_group[i]->data, ph[i], self->opts.saturate,
                           b + plan[i].offset, &crc);
    }
    free(plan[0].scales);
    free(plan[1].scales);
    if (rc) return rc; /* unreachable: dtypes checked, kernels probed */
    put_le32(b + total - TRAILER_SIZE, crc);
    *nwritten = (size_t)total;
    return KVS_OK;
}

static int kv_split_estimate(const kvs_multi_serializer *s, const kvs_layout *const *layouts,
                             size_t n, size_t *nbytes)
{
    const kv_split_serializer *self = KVS_CONTAINER_OF(s, const kv_split_serializer, base);
    int rc = kvs_validate_group_size(n, NSLOTS, "layout");
    if (rc) return rc;
    slot_plan plan[NSLOTS];
    uint64_t total;
    rc = plan_blob(&self->opts, layouts, "layout", plan, &total);
    if (rc) return rc;
    *nbytes = (size_t)total;
    return KVS_OK;
}

static void kv_split_serializer_destroy(kvs_multi_serializer *s)
{
    free(KVS_CONTAINER_OF(s, kv_split_serializer, base));
}

static const struct kvs_multi_serializer_ops kv_split_serializer_ops = {
    .name = "kv_split",
    .serialize = kv_split_serialize,
    .estimate_serialized_size = kv_split_estimate,
    .destroy = kv_split_serializer_destroy,
};

/* ---------------------------------------------------------------------
 * Parse (hostile input)
 * ------------------------------------------------------------------ */

/* One present slot's descriptor; `*offset` is where its payload must start
 * and advances past it. */
static int parse_slot(const uint8_t *d, int s, unsigned version, uint64_t *offset,
                      kvs_kv_split_slot_info *out)
{
    const char *name = slot_names[s];
    unsigned src = d[0], stored = d[1], scope = d[2];
    if (!is_wide((kvs_dtype)src))
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s source dtype code %u is not "
                             "float32, float16 or bfloat16",
                             name, src);
    if (stored != src && !is_fp8((kvs_dtype)stored))
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s stored dtype code %u is neither "
                             "the source dtype (%u) nor an fp8 dtype",
                             name, stored, src);
    if (d[3] || (version < 2 && scope))
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s reserved bytes are not zero", name);
    if (scope && !scoped((kvs_kv_split_scale)scope))
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s scale scope code %u is unknown",
                             name, scope);
    if (scope && !is_fp8((kvs_dtype)stored))
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: native %s slot has scale scope %u",
                             name, scope);
    uint32_t scale_bits = get_le32(d + 4);
    float scale = kvs_f32_from_bits(scale_bits);
    if ((!is_fp8((kvs_dtype)stored) || scope) && scale_bits != 0x3F800000u)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s %s slot has scale %g "
                             "(0x%08x), expected 1",
                             scope ? "scoped" : "native", name, (double)scale, scale_bits);
    if (is_fp8((kvs_dtype)stored) && !(isfinite(scale) && scale >= MIN_SCALE))
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s scale %g (0x%08x) is not a "
                             "finite value >= 2^-110",
                             name, (double)scale, scale_bits);
    uint64_t numel = get_le64(d + 8), off = get_le64(d + 16), nbytes = get_le64(d + 24);
    size_t esize = kvs_dtype_size((kvs_dtype)stored);
    if (scope) {
        /* the table's own consistency is checked with the checksum */
        if (nbytes < SCALE_BLOCK || nbytes - SCALE_BLOCK < numel)
            return kvs_set_error(KVS_ECORRUPT,
                                 "kv_split: corrupt header: scoped %s holds %llu elements "
                                 "but %llu bytes",
                                 name, (unsigned long long)numel, (unsigned long long)nbytes);
    } else if (numel > UINT64_MAX / esize || numel * esize != nbytes) {
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s holds %llu elements of %s but "
                             "%llu bytes",
                             name, (unsigned long long)numel,
                             kvs_dtype_name((kvs_dtype)stored), (unsigned long long)nbytes);
    }
    if (off != *offset)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s payload at offset %llu, expected "
                             "%llu",
                             name, (unsigned long long)off, (unsigned long long)*offset);
    if (nbytes > UINT64_MAX - TRAILER_SIZE - *offset)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s payload of %llu bytes overflows "
                             "the blob size",
                             name, (unsigned long long)nbytes);
    *offset += nbytes;
    out->present = 1;
    out->src_dtype = (kvs_dtype)src;
    out->stored_dtype = (kvs_dtype)stored;
    out->numel = numel;
    out->offset = off;
    out->nbytes = nbytes;
    out->scale = scale;
    out->scope = scope ? (kvs_kv_split_scale)scope : KVS_KV_SPLIT_SCALE_PER_TENSOR;
    return KVS_OK;
}

/* A scoped slot's scale table (inside the checksummed payload). */
static int parse_scales(const uint8_t *b, int s, kvs_kv_split_slot_info *si)
{
    const char *name = slot_names[s];
    const uint8_t *t = b + si->offset;
    uint64_t cols = get_le64(t), rps = get_le64(t + 8), cps = get_le64(t + 16), ns = 0;
    uint64_t n = si->numel;
    int ok;
    if (n == 0) {
        ok = cols == 0 && rps == 0 && cps == 0;
    } else {
        ok = cols > 0 && n % cols == 0 && rps > 0 && (n / cols) % rps == 0 && cps > 0 &&
             cols % cps == 0;
        /* (rows / rps) x (cols / cps) <= rows x cols = n: no overflow */
        if (ok) ns = (n / cols / rps) * (cols / cps);
    }
    if (!ok)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt scale table: %s slot of %llu elements with "
                             "%llu columns, %llu rows and %llu columns per scale",
                             name, (unsigned long long)n, (unsigned long long)cols,
                             (unsigned long long)rps, (unsigned long long)cps);
    if (si->nbytes != SCALE_BLOCK + 4 * ns + n)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt scale table: %s has %llu scales and %llu "
                             "elements but %llu payload bytes",
                             name, (unsigned long long)ns, (unsigned long long)n,
                             (unsigned long long)si->nbytes);
    for (uint64_t j = 0; j < ns; j++) {
        float v = kvs_f32_from_bits(get_le32(t + SCALE_BLOCK + 4 * j));
        if (!(isfinite(v) && v >= MIN_SCALE))
            return kvs_set_error(KVS_ECORRUPT,
                                 "kv_split: corrupt scale table: %s scale %llu is %g, not a "
                                 "finite value >= 2^-110",
                                 name, (unsigned long long)j, (double)v);
    }
    si->cols = cols, si->rows_per_scale = rps, si->cols_per_scale = cps, si->nscales = ns;
    si->scales_offset = si->offset + SCALE_BLOCK;
    return KVS_OK;
}

/* Validate b[0..len) completely: structure, lengths, then the checksum. */
static int parse_blob(const uint8_t *b, size_t len, kvs_kv_split_info *info)
{
    memset(info, 0, sizeof *info);
    if (len < HEADER_SIZE)
        return kvs_set_error(KVS_ECORRUPT, "kv_split: truncated blob: %zu bytes, need %d",
                             len, HEADER_SIZE);
    if (memcmp(b, KVS_KV_SPLIT_MAGIC, 4) != 0)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: bad magic %02x %02x %02x %02x, expected 4b 56 53 50 "
                             "('KVSP')",
                             b[0], b[1], b[2], b[3]);
    unsigned version = get_le16(b + 4);
    if (version < 1 || version > KVS_KV_SPLIT_VERSION)
        return kvs_set_error(KVS_EUNSUPPORTED,
                             "kv_split: unsupported blob version %u; this build reads "
                             "versions 1 to %d",
                             version, KVS_KV_SPLIT_VERSION);
    if (b[6] != NSLOTS)
        return kvs_set_error(KVS_ECORRUPT, "kv_split: corrupt header: %u slots, expected %d",
                             b[6], NSLOTS);
    unsigned mask = b[7];
    if (mask & ~3u)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: present mask 0x%02x has bits other "
                             "than K (0x01) and V (0x02)",
                             mask);
    uint64_t declared = get_le64(b + 8);
    uint64_t offset = HEADER_SIZE;
    static const uint8_t zeros[DESC_SIZE];
    for (int s = 0; s < NSLOTS; s++) {
        const uint8_t *d = b + FIXED_SIZE + s * DESC_SIZE;
        if (!(mask & (1u << s))) {
            if (memcmp(d, zeros, DESC_SIZE) != 0)
                return kvs_set_error(KVS_ECORRUPT,
                                     "kv_split: corrupt header: absent %s slot has a "
                                     "non-zero descriptor",
                                     slot_names[s]);
            continue;
        }
        int rc = parse_slot(d, s, version, &offset, &info->slots[s]);
        if (rc) return rc;
    }
    uint64_t total = offset + TRAILER_SIZE;
    if (declared != total)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: declared size %llu, but header and "
                             "payloads make %llu",
                             (unsigned long long)declared, (unsigned long long)total);
    if (len < total)
        return kvs_set_error(KVS_ECORRUPT, "kv_split: truncated blob: %zu bytes, need %llu",
                             len, (unsigned long long)total);
    uint32_t stored = get_le32(b + total - TRAILER_SIZE);
    uint32_t computed = kvs_crc32c(0, b, (size_t)total - TRAILER_SIZE);
    if (stored != computed)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: checksum mismatch: stored 0x%08x, computed 0x%08x",
                             stored, computed);
    for (int s = 0; s < NSLOTS; s++) {
        if (info->slots[s].scope == KVS_KV_SPLIT_SCALE_PER_TENSOR) continue;
        int rc = parse_scales(b, s, &info->slots[s]);
        if (rc) return rc;
    }
    info->version = version;
    info->total_size = total;
    info->crc32c = stored;
    return KVS_OK;
}

int kvs_kv_split_inspect(const void *blob, size_t len, kvs_kv_split_info *out)
{
    if (out == NULL || (blob == NULL && len > 0))
        return kvs_set_error(KVS_EINVAL, "kv_split: inspect: NULL argument");
    kvs_kv_split_info info;
    int rc = parse_blob(blob, len, &info);
    if (rc == KVS_OK) *out = info;
    return rc;
}

/* ---------------------------------------------------------------------
 * Deserialize
 * ------------------------------------------------------------------ */

/* A lookup table for one scale (read_run): each of the 256 codes decoded,
 * times the scale, rounded to dt (float16, bfloat16 or float32: 256
 * entries of its size), by the same operations as the block path of
 * read_run, so the same bytes. A run of a few thousand elements and more
 * then costs one lookup each instead of a decode, a multiply and a rounding
 * (float16 rounding does not even vectorize). For a 16-bit dt whose table
 * is sign-symmetric (entry c | 0x80 = entry c with bit 15 set: always, as
 * fp8 decoding, scaling and rounding to nearest even are, but checked), lo
 * and hi are its 128 magnitudes' bytes for the kernels' vectorized lookup
 * (kvs_fp8_lut16). */
typedef struct scaled_lut {
    float scale; /* the scale it was built for; 0: none yet (0 is never a scale) */
    int sym16;
    uint8_t table[256 * 4];
    _Alignas(64) uint8_t lo[128];
    _Alignas(64) uint8_t hi[128];
} scaled_lut;

static int scaled_lut_build(kvs_dtype stored, float scale, kvs_dtype dt, scaled_lut *t)
{
    static const uint8_t codes[256] = {
#define ROW(x) x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7
#define ROWS(x) ROW(x), ROW(x + 8), ROW(x + 16), ROW(x + 24)
        ROWS(0), ROWS(32), ROWS(64), ROWS(96), ROWS(128), ROWS(160), ROWS(192), ROWS(224)
#undef ROWS
#undef ROW
    };
    float vals[256];
    int rc = kvs_fp8_decode(codes, stored, vals, KVS_DTYPE_FLOAT32, 256);
    if (rc) return rc;
    if (dt == KVS_DTYPE_FLOAT16) {
        for (int i = 0; i < 256; i++) vals[i] *= scale;
        store_f32(t->table, KVS_DTYPE_FLOAT16, 256, vals);
    } else {
        store_scaled(t->table, dt, 256, vals, scale);
    }
    t->scale = scale;
    t->sym16 = dt != KVS_DTYPE_FLOAT32;
    for (int c = 0; c < 128 && t->sym16; c++) {
        t->lo[c] = t->table[2 * c];
        t->hi[c] = t->table[2 * c + 1];
        t->sym16 = t->table[2 * (c + 128)] == t->lo[c] &&
                   t->table[2 * (c + 128) + 1] == (t->hi[c] | 0x80);
    }
    return KVS_OK;
}

/* Scaled fp8 runs of at least this many elements go through the table
 * (scaled_lut): building one costs about as much as converting 256
 * elements the block way. float16 always does (its block way is slower). */
#define TABLE_MIN_RUN 2048

/* Fill m elements at dst (dtype dt) from m stored elements at in; lut: the
 * caller's table, rebuilt here when the scale changes. */
static int read_run(kvs_dtype stored, const uint8_t *in, size_t m, float scale, uint8_t *dst,
                    kvs_dtype dt, scaled_lut *lut)
{
    size_t osize = kvs_dtype_size(dt);
    if (!is_fp8(stored)) {
        if (stored == dt) {
            memcpy(dst, in, m * osize);
            return KVS_OK;
        }
        /* Another float dtype: widen exactly (half.h, NaNs as the
         * hardware widens them), then round to nearest even. */
        size_t isize = kvs_dtype_size(stored);
        float tmp[BLOCK];
        for (size_t done = 0; done < m;) {
            size_t k = m - done < BLOCK ? m - done : BLOCK;
            load_exact(in + done * isize, stored, k, tmp);
            store_f32(dst + done * osize, dt, k, tmp);
            done += k;
        }
        return KVS_OK;
    }
    if (scale == 1.0f) /* the plain cast: exactly the fp8 serde's values */
        return kvs_fp8_decode(in, stored, dst, dt, m);
    if (dt != KVS_DTYPE_FLOAT16 && m < TABLE_MIN_RUN) {
        /* Decode a block with the SIMD kernels, then scale and round. */
        float tmp[BLOCK];
        for (size_t done = 0; done < m;) {
            size_t k = m - done < BLOCK ? m - done : BLOCK;
            int rc = kvs_fp8_decode(in + done, stored, tmp, KVS_DTYPE_FLOAT32, k);
            if (rc) return rc;
            store_scaled(dst + done * osize, dt, k, tmp, scale);
            done += k;
        }
        return KVS_OK;
    }
    if (lut->scale != scale) { /* built once per distinct scale in a row */
        int rc = scaled_lut_build(stored, scale, dt, lut);
        if (rc) return rc;
    }
    if (lut->sym16) return kvs_fp8_lut16(in, dst, m, lut->lo, lut->hi);
    /* float32 (a 16-bit table is always sign-symmetric: this loop serves
     * one only if that ever stopped holding) */
    for (size_t i = 0; i < m; i++) memcpy(dst + osize * i, lut->table + osize * in[i], osize);
    return KVS_OK;
}

/* Fill the destination (dtype dt, physical layout ph) from one slot. */
static int read_payload(const kvs_kv_split_slot_info *si, const uint8_t *b, uint8_t *dst,
                        kvs_dtype dt, phys ph)
{
    size_t osize = kvs_dtype_size(dt), isize = kvs_dtype_size(si->stored_dtype);
    const uint8_t *in = b + si->offset;
    if (si->scope != KVS_KV_SPLIT_SCALE_PER_TENSOR) in += SCALE_BLOCK + 4 * si->nscales;
    scaled_lut lut;
    lut.scale = 0;
    for (uint64_t i = 0; i < si->numel;) {
        uint64_t s, off;
        size_t m = piece_at(si->numel, si->cols, si->rows_per_scale, si->cols_per_scale,
                            si->nscales, ph, osize, i, &s, &off);
        float scale = si->nscales
                          ? kvs_f32_from_bits(get_le32(b + si->scales_offset + 4 * s))
                          : si->scale;
        int rc = read_run(si->stored_dtype, in + i * isize, m, scale, dst + off, dt, &lut);
        if (rc) return rc;
        i += m;
    }
    return KVS_OK;
}

static int kv_split_deserialize(kvs_multi_deserializer *d, const kvs_memobj *src,
                                kvs_memobj *const *dst_group, size_t n,
                                const kvs_object_key *key)
{
    (void)key;
    (void)d;
    int rc = kvs_validate_group_size(n, NSLOTS, "dst");
    if (rc) return rc;
    if (src->used_size > src->capacity || (src->data == NULL && src->used_size > 0))
        return kvs_set_error(KVS_EINVAL,
                             "kv_split: source used size %zu exceeds its capacity %zu",
                             src->used_size, src->data ? src->capacity : 0);
    kvs_kv_split_info info;
    rc = parse_blob(src->data, src->used_size, &info);
    if (rc) return rc;
    if (src->used_size != info.total_size) /* trailing bytes: not this blob */
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: stored object is %zu bytes, its header declares %llu",
                             src->used_size, (unsigned long long)info.total_size);

    /* Every requested slot must be in the blob and fit its destination. */
    kvs_dtype dts[NSLOTS] = {KVS_DTYPE_FLOAT32, KVS_DTYPE_FLOAT32};
    slot_plan probe[NSLOTS];
    memset(probe, 0, sizeof probe);
    for (int s = 0; s < NSLOTS; s++) {
        const kvs_memobj *dst = dst_group[s];
        if (dst == NULL) continue;
        const kvs_kv_split_slot_info *si = &info.slots[s];
        if (!si->present)
            return kvs_set_error(KVS_EINVAL,
                                 "kv_split: %s (slot %d) requested but the blob holds no %s",
                                 slot_names[s], s, slot_names[s]);
        if ((rc = slot_dtype(&dst->layout, s, "destination", &dts[s]))) return rc;
        uint64_t numel = kvs_layout_numel(&dst->layout);
        if (numel != si->numel) /* stored from another layout */
            return kvs_set_error(KVS_ECORRUPT,
                                 "kv_split: stored %s slot holds %llu elements, destination "
                                 "layout needs %llu",
                                 slot_names[s], (unsigned long long)si->numel,
                                 (unsigned long long)numel);
        if ((rc = check_object(dst, s, "destination"))) return rc;
        probe[s].present = 1;
        probe[s].stored_dtype = si->stored_dtype;
    }
    if ((rc = probe_fp8(probe, 1))) return rc;

    const uint8_t *b = src->data;
    for (int s = 0; s < NSLOTS; s++) {
        if (dst_group[s] == NULL) continue;
        const kvs_kv_split_slot_info *si = &info.slots[s];
        phys ph = phys_of(dst_group[s], si->numel, kvs_dtype_size(dts[s]));
        rc = read_payload(si, b, dst_group[s]->data, dts[s], ph);
        if (rc) return rc; /* unreachable: dtypes checked, kernels probed */
    }
    return KVS_OK;
}

static void kv_split_deserializer_destroy(kvs_multi_deserializer *d)
{
    free(KVS_CONTAINER_OF(d, kv_split_deserializer, base));
}

static const struct kvs_multi_deserializer_ops kv_split_deserializer_ops = {
    .name = "kv_split",
    .deserialize = kv_split_deserialize,
    .destroy = kv_split_deserializer_destroy,
};

/* ---------------------------------------------------------------------
 * Creation
 * ------------------------------------------------------------------ */

void kvs_kv_split_options_init(kvs_kv_split_options *opts)
{
    if (opts == NULL) return;
    opts->k_store = KVS_KV_SPLIT_STORE_NATIVE;
    opts->v_store = KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN;
    opts->scale = KVS_KV_SPLIT_SCALE_PER_TENSOR;
    opts->mode = KVS_KV_SPLIT_MODE_KV;
    opts->saturate = 1;
    opts->num_kv_heads = 0;
}

static int store_valid(kvs_kv_split_store s)
{
    return s == KVS_KV_SPLIT_STORE_NATIVE || s == KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN ||
           s == KVS_KV_SPLIT_STORE_FLOAT8_E5M2;
}

int kvs_kv_split_serde_create(const kvs_kv_split_options *opts, kvs_multi_serializer **ser,
                              kvs_multi_deserializer **de)
{
    kvs_kv_split_options o;
    kvs_kv_split_options_init(&o);
    if (opts) o = *opts;
    if (!store_valid(o.k_store))
        return kvs_set_error(KVS_EINVAL, "kv_split: unknown k_store %d", (int)o.k_store);
    if (!store_valid(o.v_store))
        return kvs_set_error(KVS_EINVAL, "kv_split: unknown v_store %d", (int)o.v_store);
    if (o.scale != KVS_KV_SPLIT_SCALE_PER_TENSOR && o.scale != KVS_KV_SPLIT_SCALE_NONE &&
        !scoped(o.scale))
        return kvs_set_error(KVS_EINVAL, "kv_split: unknown scale %d", (int)o.scale);
    if (o.mode != KVS_KV_SPLIT_MODE_KV && o.mode != KVS_KV_SPLIT_MODE_V_ONLY)
        return kvs_set_error(KVS_EINVAL, "kv_split: unknown mode %d", (int)o.mode);
    o.saturate = o.saturate != 0;
    if (ser == NULL && de == NULL)
        return kvs_set_error(KVS_EINVAL, "kv_split: no output requested");
    kv_split_serializer *s = NULL;
    kv_split_deserializer *d = NULL;
    if (ser && (s = calloc(1, sizeof *s)) == NULL) goto oom;
    if (de && (d = calloc(1, sizeof *d)) == NULL) goto oom;
    if (s) {
        s->base.ops = &kv_split_serializer_ops;
        s->base.group_size = NSLOTS;
        s->opts = o;
        *ser = &s->base;
    }
    if (d) {
        d->base.ops = &kv_split_deserializer_ops;
        d->base.group_size = NSLOTS;
        *de = &d->base;
    }
    return KVS_OK;
oom:
    free(s);
    free(d);
    return kvs_set_error(KVS_ENOMEM, "kv_split: out of memory creating the serde");
}

int kvs_kv_split_factory(const json_t *kwargs, void *userdata, kvs_multi_serde_pair *out)
{
    static const char *const known[] = {"k_dtype", "v_dtype",      "scale",
                                        "mode",    "saturate",     "num_kv_heads",
                                        NULL};
    static const char *const k_choices[] = {"native", "float8_e4m3fn", "float8_e5m2", NULL};
    static const kvs_kv_split_store k_map[] = {KVS_KV_SPLIT_STORE_NATIVE,
                                               KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN,
                                               KVS_KV_SPLIT_STORE_FLOAT8_E5M2};
    static const char *const v_choices[] = {"float8_e4m3fn", "float8_e5m2", "native", NULL};
    static const kvs_kv_split_store v_map[] = {KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN,
                                               KVS_KV_SPLIT_STORE_FLOAT8_E5M2,
                                               KVS_KV_SPLIT_STORE_NATIVE};
    static const char *const scales[] = {"per_tensor", "none",      "per_layer",
                                         "per_layer_head", "per_token", NULL};
    static const kvs_kv_split_scale scale_map[] = {
        KVS_KV_SPLIT_SCALE_PER_TENSOR, KVS_KV_SPLIT_SCALE_NONE, KVS_KV_SPLIT_SCALE_PER_LAYER,
        KVS_KV_SPLIT_SCALE_PER_LAYER_HEAD, KVS_KV_SPLIT_SCALE_PER_TOKEN};
    static const char *const modes[] = {"kv", "v_only", NULL};
    (void)userdata;
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "kv_split: NULL output pair");
    memset(out, 0, sizeof *out);
    if (kwargs == NULL || !json_is_object(kwargs))
        return kvs_set_error(KVS_EINVAL, "kv_split: kwargs must be a JSON object");
    int k, v, scale, mode, saturate;
    unsigned workers, heads = 0;
    int rc = kvs_kwargs_check_known(kwargs, "kv_split", known);
    if (!rc) rc = kvs_kwargs_get_choice(kwargs, "kv_split", "k_dtype", k_choices, 0, &k);
    if (!rc) rc = kvs_kwargs_get_choice(kwargs, "kv_split", "v_dtype", v_choices, 0, &v);
    if (!rc) rc = kvs_kwargs_get_choice(kwargs, "kv_split", "scale", scales, 0, &scale);
    if (!rc) rc = kvs_kwargs_get_choice(kwargs, "kv_split", "mode", modes, 0, &mode);
    if (!rc) rc = kvs_kwargs_get_bool(kwargs, "kv_split", "saturate", 1, &saturate);
    if (!rc)
        rc = kvs_kwargs_get_positive_int(kwargs, "kv_split", "max_workers", 1, &workers);
    if (!rc && json_object_get(kwargs, "num_kv_heads"))
        rc = kvs_kwargs_get_positive_int(kwargs, "kv_split", "num_kv_heads", 1, &heads);
    if (rc) return rc;
    kvs_kv_split_options o = {
        .k_store = k_map[k],
        .v_store = v_map[v],
        .scale = scale_map[scale],
        .mode = mode == 0 ? KVS_KV_SPLIT_MODE_KV : KVS_KV_SPLIT_MODE_V_ONLY,
        .saturate = saturate,
        .num_kv_heads = heads,
    };
    rc = kvs_kv_split_serde_create(&o, &out->serializer, &out->deserializer);
    if (rc) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->max_workers = workers;
    return KVS_OK;
}
