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

#include "codecs/half.h"
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
/* The three hot loops are also compiled for AVX2 and picked at load time
 * (an ifunc, so glibc only): twice the vector width, and a cheaper float32
 * -> bfloat16 pack. Same operations, so the same bytes either way.
 * (-DKVS_NO_CLONES builds the portable version only, and so does a TSan
 * build: ThreadSanitizer crashes in ifunc resolvers, which run before its
 * runtime is initialized.) */
#if KVS_HAVE_X86 && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__) && \
    !defined(KVS_NO_CLONES) && !defined(__SANITIZE_THREAD__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

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

typedef struct slot_plan {
    int present;
    kvs_dtype src_dtype;
    kvs_dtype stored_dtype;
    uint64_t numel;
    uint64_t offset;
    uint64_t nbytes;
    float scale; /* 1.0: plain cast or native */
    float inv;   /* fp8_max / amax when scale != 1.0 */
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

/* Check the presence pattern against the mode and each present layout, and
 * lay the blob out. `role` is "src" (serialize) or "layout" (estimate). */
static int plan_blob(const kvs_kv_split_options *o, const kvs_layout *const *layouts,
                     const char *role, slot_plan plan[NSLOTS], uint64_t *total)
{
    const char *mode = o->mode == KVS_KV_SPLIT_MODE_KV ? "kv" : "v_only";
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
        memset(&plan[s], 0, sizeof plan[s]);
        plan[s].scale = plan[s].inv = 1.0f;
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
 * Serialize
 * ------------------------------------------------------------------ */

static void write_header(uint8_t *b, const slot_plan plan[NSLOTS], uint64_t total)
{
    memset(b, 0, HEADER_SIZE);
    memcpy(b, KVS_KV_SPLIT_MAGIC, 4);
    put_le16(b + 4, KVS_KV_SPLIT_VERSION);
    b[6] = NSLOTS;
    b[7] = (uint8_t)((plan[0].present ? 1 : 0) | (plan[1].present ? 2 : 0));
    put_le64(b + 8, total);
    for (int s = 0; s < NSLOTS; s++) {
        if (!plan[s].present) continue; /* an absent slot's descriptor is all zero */
        uint8_t *d = b + FIXED_SIZE + s * DESC_SIZE;
        d[0] = (uint8_t)plan[s].src_dtype;
        d[1] = (uint8_t)plan[s].stored_dtype;
        put_le32(d + 4, kvs_f32_to_bits(plan[s].scale));
        put_le64(d + 8, plan[s].numel);
        put_le64(d + 16, plan[s].offset);
        put_le64(d + 24, plan[s].nbytes);
    }
}

/* Write one slot's payload at out, feeding every byte to *crc, a span at a
 * time while the span is still in cache. */
static int write_payload(const slot_plan *p, const uint8_t *src, int saturate, uint8_t *out,
                         uint32_t *crc)
{
    if (!is_fp8(p->stored_dtype)) {
        for (uint64_t done = 0; done < p->nbytes;) {
            size_t m = (size_t)(p->nbytes - done < SPAN ? p->nbytes - done : SPAN);
            memcpy(out + done, src + done, m);
            *crc = kvs_crc32c(*crc, out + done, m);
            done += m;
        }
        return KVS_OK;
    }
    size_t esize = kvs_dtype_size(p->src_dtype), n = (size_t)p->numel;
    float tmp[BLOCK];
    for (size_t done = 0; done < n;) {
        size_t span = n - done < SPAN ? n - done : SPAN;
        if (p->scale == 1.0f) { /* the plain cast: exactly the fp8 serde's bytes */
            int rc = kvs_fp8_encode(src + done * esize, p->src_dtype, out + done,
                                    p->stored_dtype, saturate, span);
            if (rc) return rc;
        } else {
            for (size_t i = 0; i < span; i += BLOCK) {
                size_t m = span - i < BLOCK ? span - i : BLOCK;
                load_scaled(src + (done + i) * esize, p->src_dtype, m, p->inv, tmp);
                int rc = kvs_fp8_encode(tmp, KVS_DTYPE_FLOAT32, out + done + i,
                                        p->stored_dtype, saturate, m);
                if (rc) return rc;
            }
        }
        *crc = kvs_crc32c(*crc, out + done, span);
        done += span;
    }
    return KVS_OK;
}

/* The source object must really hold what its layout describes. */
static int check_object(const kvs_memobj *obj, int slot, const char *role)
{
    uint64_t need = kvs_layout_nbytes(&obj->layout);
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

    /* Per-tensor scales, from the data (the only data-dependent step). */
    for (int i = 0; i < NSLOTS; i++) {
        slot_plan *p = &plan[i];
        if (!p->present || !is_fp8(p->stored_dtype) ||
            self->opts.scale != KVS_KV_SPLIT_SCALE_PER_TENSOR)
            continue;
        float amax = finite_amax(src_group[i]->data, p->src_dtype, (size_t)p->numel);
        float fmax = fp8_max(p->stored_dtype);
        float scale = amax / fmax;
        if (scale >= MIN_SCALE) {
            p->scale = scale;
            p->inv = fmax / amax;
        }
    }

    uint8_t *b = dst->data;
    write_header(b, plan, total);
    uint32_t crc = kvs_crc32c(0, b, HEADER_SIZE);
    for (int i = 0; i < NSLOTS; i++) {
        if (!plan[i].present) continue;
        rc = write_payload(&plan[i], src_group[i]->data, self->opts.saturate,
                           b + plan[i].offset, &crc);
        if (rc) return rc; /* unreachable: dtypes checked, kernels probed */
    }
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
static int parse_slot(const uint8_t *d, int s, uint64_t *offset, kvs_kv_split_slot_info *out)
{
    const char *name = slot_names[s];
    unsigned src = d[0], stored = d[1];
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
    if (d[2] || d[3])
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s reserved bytes are not zero", name);
    uint32_t scale_bits = get_le32(d + 4);
    float scale = kvs_f32_from_bits(scale_bits);
    if (!is_fp8((kvs_dtype)stored) && scale_bits != 0x3F800000u)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: native %s slot has scale %g "
                             "(0x%08x), expected 1",
                             name, (double)scale, scale_bits);
    if (is_fp8((kvs_dtype)stored) && !(isfinite(scale) && scale >= MIN_SCALE))
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s scale %g (0x%08x) is not a "
                             "finite value >= 2^-110",
                             name, (double)scale, scale_bits);
    uint64_t numel = get_le64(d + 8), off = get_le64(d + 16), nbytes = get_le64(d + 24);
    size_t esize = kvs_dtype_size((kvs_dtype)stored);
    if (numel > UINT64_MAX / esize || numel * esize != nbytes)
        return kvs_set_error(KVS_ECORRUPT,
                             "kv_split: corrupt header: %s holds %llu elements of %s but "
                             "%llu bytes",
                             name, (unsigned long long)numel,
                             kvs_dtype_name((kvs_dtype)stored), (unsigned long long)nbytes);
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
    if (version != KVS_KV_SPLIT_VERSION)
        return kvs_set_error(KVS_EUNSUPPORTED,
                             "kv_split: unsupported blob version %u; this build reads "
                             "version %d",
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
        int rc = parse_slot(d, s, &offset, &info->slots[s]);
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

/* Fill the n elements of dst (dtype dt) from one slot's payload. */
static int read_payload(const kvs_kv_split_slot_info *si, const uint8_t *in, uint8_t *dst,
                        kvs_dtype dt)
{
    size_t n = (size_t)si->numel, osize = kvs_dtype_size(dt);
    if (!is_fp8(si->stored_dtype)) {
        if (si->stored_dtype == dt) {
            memcpy(dst, in, (size_t)si->nbytes);
            return KVS_OK;
        }
        /* Another float dtype: widen exactly (half.h, NaNs as the
         * hardware widens them), then round to nearest even. */
        size_t isize = kvs_dtype_size(si->stored_dtype);
        float tmp[BLOCK];
        for (size_t done = 0; done < n;) {
            size_t m = n - done < BLOCK ? n - done : BLOCK;
            load_exact(in + done * isize, si->stored_dtype, m, tmp);
            store_f32(dst + done * osize, dt, m, tmp);
            done += m;
        }
        return KVS_OK;
    }
    if (si->scale == 1.0f) /* the plain cast: exactly the fp8 serde's values */
        return kvs_fp8_decode(in, si->stored_dtype, dst, dt, n);
    if (dt != KVS_DTYPE_FLOAT16) {
        /* Decode a block with the SIMD kernels, then scale and round. */
        float tmp[BLOCK];
        for (size_t done = 0; done < n;) {
            size_t m = n - done < BLOCK ? n - done : BLOCK;
            int rc = kvs_fp8_decode(in + done, si->stored_dtype, tmp, KVS_DTYPE_FLOAT32, m);
            if (rc) return rc;
            store_scaled(dst + done * osize, dt, m, tmp, si->scale);
            done += m;
        }
        return KVS_OK;
    }
    /* float16 rounding does not vectorize; but a code has only 256 possible
     * values, so compute each once, exactly as documented (decode, times
     * the scale, rounded to float16), and look the elements up. */
    static const uint8_t codes[256] = {
#define ROW(x) x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7
#define ROWS(x) ROW(x), ROW(x + 8), ROW(x + 16), ROW(x + 24)
        ROWS(0), ROWS(32), ROWS(64), ROWS(96), ROWS(128), ROWS(160), ROWS(192), ROWS(224)
#undef ROWS
#undef ROW
    };
    float vals[256];
    int rc = kvs_fp8_decode(codes, si->stored_dtype, vals, KVS_DTYPE_FLOAT32, 256);
    if (rc) return rc;
    for (int i = 0; i < 256; i++) vals[i] *= si->scale;
    uint16_t table[256];
    store_f32((uint8_t *)table, dt, 256, vals);
    for (size_t i = 0; i < n; i++) memcpy(dst + 2 * i, &table[in[i]], 2);
    return KVS_OK;
}

static int kv_split_deserialize(kvs_multi_deserializer *d, const kvs_memobj *src,
                                kvs_memobj *const *dst_group, size_t n,
                                const kvs_object_key *key)
{
    (void)key;
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
        rc = read_payload(si, b + si->offset, dst_group[s]->data, dts[s]);
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
    if (o.scale != KVS_KV_SPLIT_SCALE_PER_TENSOR && o.scale != KVS_KV_SPLIT_SCALE_NONE)
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
    static const char *const known[] = {"k_dtype", "v_dtype", "scale", "mode", "saturate",
                                        NULL};
    static const char *const k_choices[] = {"native", "float8_e4m3fn", "float8_e5m2", NULL};
    static const kvs_kv_split_store k_map[] = {KVS_KV_SPLIT_STORE_NATIVE,
                                               KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN,
                                               KVS_KV_SPLIT_STORE_FLOAT8_E5M2};
    static const char *const v_choices[] = {"float8_e4m3fn", "float8_e5m2", "native", NULL};
    static const kvs_kv_split_store v_map[] = {KVS_KV_SPLIT_STORE_FLOAT8_E4M3FN,
                                               KVS_KV_SPLIT_STORE_FLOAT8_E5M2,
                                               KVS_KV_SPLIT_STORE_NATIVE};
    static const char *const scales[] = {"per_tensor", "none", NULL};
    static const char *const modes[] = {"kv", "v_only", NULL};
    if (out == NULL) return kvs_set_error(KVS_EINVAL, "kv_split: NULL output pair");
    memset(out, 0, sizeof *out);
    if (kwargs == NULL || !json_is_object(kwargs))
        return kvs_set_error(KVS_EINVAL, "kv_split: kwargs must be a JSON object");
    int k, v, scale, mode, saturate;
    unsigned workers;
    int rc = kvs_kwargs_check_known(kwargs, "kv_split", known);
    if (!rc) rc = kvs_kwargs_get_choice(kwargs, "kv_split", "k_dtype", k_choices, 0, &k);
    if (!rc) rc = kvs_kwargs_get_choice(kwargs, "kv_split", "v_dtype", v_choices, 0, &v);
    if (!rc) rc = kvs_kwargs_get_choice(kwargs, "kv_split", "scale", scales, 0, &scale);
    if (!rc) rc = kvs_kwargs_get_choice(kwargs, "kv_split", "mode", modes, 0, &mode);
    if (!rc) rc = kvs_kwargs_get_bool(kwargs, "kv_split", "saturate", 1, &saturate);
    if (!rc)
        rc = kvs_kwargs_get_positive_int(kwargs, "kv_split", "max_workers", 1, &workers);
    if (rc) return rc;
    kvs_kv_split_options o = {
        .k_store = k_map[k],
        .v_store = v_map[v],
        .scale = scale == 0 ? KVS_KV_SPLIT_SCALE_PER_TENSOR : KVS_KV_SPLIT_SCALE_NONE,
        .mode = mode == 0 ? KVS_KV_SPLIT_MODE_KV : KVS_KV_SPLIT_MODE_V_ONLY,
        .saturate = saturate,
    };
    rc = kvs_kv_split_serde_create(&o, &out->serializer, &out->deserializer);
    if (rc) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    out->max_workers = workers;
    return KVS_OK;
}
