/* intq.c - the integer quantizer (intq.h): planes, groups, scales, bit
 * packing, the Hadamard rotation and K outlier channels.
 *
 * The work is cut into blocks, each writing its own scales and codes: one
 * token (token axis), `group` tokens (channel axis) or a whole plane
 * (tensor axis). Blocks are independent, so kvs_serde_parallel_for may
 * spread them over workers; outlier channels are chosen first, one plane at
 * a time, and the blocks read the chosen indices back from the output.
 *
 * Every float operation is a plain IEEE float32 operation in a fixed order
 * (the build is ISO C: no FMA contraction), so the AVX2 clones GCC builds
 * of the row kernels (CLONES, codecs/clones.h) give the same bytes as the
 * portable code on every input. That portable code is the reference of the
 * hand-written kernels too (intq_kernels.h): each row operation below goes
 * through the variant's kernel where it has one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/clones.h"
#include "codecs/fp8_kernels.h"
#include "codecs/half.h"
#include "codecs/intq.h"
#include "codecs/intq_kernels.h"
#include "kvserde/error.h"
#include "util/crc32c.h"
#include "kvserde/serde.h"
#include "util/le.h"

#define PAYLOAD_VERSION 1
#define PAYLOAD_HEADER 4 /* version, memory format, 2 reserved */
/* Rows of a channel-axis block held as floats at once; a taller block is
 * read twice (statistics, then codes). */
#define BUFFER_FLOATS ((size_t)1 << 20)

/* ---------------------------------------------------------------------
 * Plans: where the planes of a group are and what they cost
 * ------------------------------------------------------------------ */

typedef struct role_plan {
    unsigned axis, group, nout;
    uint64_t nscales, nblocks, block_rows;
    uint64_t off_values, off_scales, off_zeros, off_codes, bytes; /* within a plane */
} role_plan;

typedef struct group_plan {
    kvs_dtype dtype;
    size_t es;
    uint64_t nplanes, nk;                /* planes [0, nk) are K */
    uint64_t T, D, row_stride, plane_stride; /* in elements */
    uint64_t src_offset;                 /* byte offset of the group in the object */
    uint64_t payload_offset;             /* of the group's first plane */
    uint64_t row_bytes;
    role_plan role[2];
    uint64_t nitems; /* blocks of all its planes */
} group_plan;

typedef struct plan {
    uint32_t ngroups;
    group_plan g[KVS_MAX_GROUPS];
    uint64_t bytes, nitems;
} plan;

static int is_float(kvs_dtype dt)
{
    return dt == KVS_DTYPE_FLOAT32 || dt == KVS_DTYPE_FLOAT16 || dt == KVS_DTYPE_BFLOAT16;
}

static int known_format(unsigned f)
{
    return f <= KVS_FMT_HS_TD;
}

static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

/* a * b and a + b, saturating at UINT64_MAX (sizes past 2^63 are refused). */
static uint64_t mul_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

static void plan_role(const kvs_intq_params *p, group_plan *g, int k)
{
    role_plan *r = &g->role[k];
    uint64_t T = g->T, D = g->D;
    r->axis = p->axis[k];
    r->group = p->group[k];
    r->nout = k == 0 ? (unsigned)(p->k_outliers < D ? p->k_outliers : D) : 0;
    int empty = T == 0 || D == 0;
    switch (r->axis) {
    case KVS_INTQ_TOKEN:
        r->nscales = T * ceil_div(D, r->group);
        r->nblocks = empty ? 0 : T;
        r->block_rows = 1;
        break;
    case KVS_INTQ_CHANNEL:
        r->nscales = ceil_div(T, r->group) * D;
        r->nblocks = empty ? 0 : ceil_div(T, r->group);
        r->block_rows = r->group;
        break;
    default:
        r->nscales = empty ? 0 : 1;
        r->nblocks = empty ? 0 : 1;
        r->block_rows = T;
        break;
    }
    size_t ss = kvs_dtype_size(p->scale_dtype);
    r->off_values = 2 * (uint64_t)r->nout;
    r->off_scales = add_sat(r->off_values, mul_sat(mul_sat(T, r->nout), g->es));
    r->off_zeros = add_sat(r->off_scales, mul_sat(r->nscales, ss));
    r->off_codes = add_sat(r->off_zeros, p->zero_point ? mul_sat(r->nscales, ss) : 0);
    r->bytes = add_sat(r->off_codes, mul_sat(T, g->row_bytes));
}

/* The planes of group i under memory format `fmt` (intq.h). */
static int plan_group(const kvs_intq_params *p, const kvs_layout *layout, uint32_t i,
                      unsigned fmt, group_plan *g)
{
    const kvs_group *gr = &layout->groups[i];
    const int64_t *d = gr->shape.dims;
    uint32_t nd = gr->shape.ndim;
    if (!is_float(gr->dtype))
        return kvs_set_error(KVS_EINVAL,
                             "int: group %u is %s; the int stage quantizes float32, float16 "
                             "and bfloat16",
                             i, kvs_dtype_name(gr->dtype));
    memset(g, 0, sizeof *g);
    g->dtype = gr->dtype;
    g->es = kvs_dtype_size(gr->dtype);
    g->src_offset = kvs_layout_group_offset(layout, i);
    if (fmt == KVS_FMT_KV_2LTD && nd == 4 && d[0] == 2) {
        g->nplanes = 2 * (uint64_t)d[1];
        g->nk = (uint64_t)d[1];
        g->T = (uint64_t)d[2];
        g->D = (uint64_t)d[3];
        g->row_stride = g->D;
        g->plane_stride = g->T * g->D;
    } else if (fmt == KVS_FMT_KV_2TD && nd == 3 && d[0] == 2) {
        g->nplanes = 2;
        g->nk = 1;
        g->T = (uint64_t)d[1];
        g->D = (uint64_t)d[2];
        g->row_stride = g->D;
        g->plane_stride = g->T * g->D;
    } else if (fmt == KVS_FMT_KV_T2D && nd == 3 && d[1] == 2) {
        g->nplanes = 2;
        g->nk = 1;
        g->T = (uint64_t)d[0];
        g->D = (uint64_t)d[2];
        g->row_stride = 2 * g->D;
        g->plane_stride = g->D;
    } else {
        g->nplanes = 1;
        g->nk = 0;
        g->D = nd ? (uint64_t)d[nd - 1] : 1;
        g->T = g->D ? kvs_layout_group_numel(layout, i) / g->D : 0;
        g->row_stride = g->D;
        g->plane_stride = 0;
    }
    if (p->hadamard && g->D % p->hadamard != 0)
        return kvs_set_error(KVS_EINVAL,
                             "int: hadamard %u does not divide the %llu channels of group %u",
                             p->hadamard, (unsigned long long)g->D, i);
    g->row_bytes = ceil_div(mul_sat(g->D, p->bits), 8);
    plan_role(p, g, 0);
    plan_role(p, g, 1);
    g->nitems = add_sat(mul_sat(g->nk, g->role[0].nblocks),
                        mul_sat(g->nplanes - g->nk, g->role[1].nblocks));
    return KVS_OK;
}

static int make_plan(const kvs_intq_params *p, const kvs_layout *layout, unsigned fmt, plan *pl)
{
    pl->ngroups = layout->ngroups;
    pl->bytes = PAYLOAD_HEADER;
    pl->nitems = 0;
    for (uint32_t i = 0; i < layout->ngroups; i++) {
        group_plan *g = &pl->g[i];
        int rc = plan_group(p, layout, i, fmt, g);
        if (rc) return rc;
        g->payload_offset = pl->bytes;
        pl->bytes = add_sat(pl->bytes, add_sat(mul_sat(g->nk, g->role[0].bytes),
                                               mul_sat(g->nplanes - g->nk, g->role[1].bytes)));
        pl->nitems = add_sat(pl->nitems, g->nitems);
    }
    if (pl->bytes > (uint64_t)INT64_MAX || pl->bytes > SIZE_MAX)
        return kvs_set_error(KVS_EINVAL, "int: the quantized object's size overflows");
    return KVS_OK;
}

/* Plane `pi` of g: its role and where its payload starts. */
static int plane_role(const group_plan *g, uint64_t pi) { return pi < g->nk ? 0 : 1; }

static uint64_t plane_payload(const group_plan *g, uint64_t pi)
{
    if (pi < g->nk) return g->payload_offset + pi * g->role[0].bytes;
    return g->payload_offset + g->nk * g->role[0].bytes + (pi - g->nk) * g->role[1].bytes;
}

/* Item -> (group, plane, block). */
static void locate(const plan *pl, uint64_t item, uint32_t *gi, uint64_t *pi, uint64_t *bi)
{
    uint32_t i = 0;
    while (item >= pl->g[i].nitems) item -= pl->g[i++].nitems;
    const group_plan *g = &pl->g[i];
    uint64_t kitems = g->nk * g->role[0].nblocks;
    *gi = i;
    if (item < kitems) {
        *pi = item / g->role[0].nblocks;
        *bi = item % g->role[0].nblocks;
    } else {
        item -= kitems;
        *pi = g->nk + item / g->role[1].nblocks;
        *bi = item % g->role[1].nblocks;
    }
}

/* ---------------------------------------------------------------------
 * Row kernels
 * ------------------------------------------------------------------ */

static float load_elem(const uint8_t *p, kvs_dtype dt)
{
    uint16_t h;
    float f;
    switch (dt) {
    case KVS_DTYPE_BFLOAT16: memcpy(&h, p, 2); return kvs_bf16_to_f32(h);
    case KVS_DTYPE_FLOAT16: memcpy(&h, p, 2); return kvs_f16_to_f32(h);
    default: memcpy(&f, p, 4); return f;
    }
}

static void store_elem(uint8_t *p, kvs_dtype dt, float f)
{
    uint16_t h;
    switch (dt) {
    case KVS_DTYPE_BFLOAT16: h = kvs_f32_to_bf16(f); memcpy(p, &h, 2); break;
    case KVS_DTYPE_FLOAT16: h = kvs_f32_to_f16(f); memcpy(p, &h, 2); break;
    default: memcpy(p, &f, 4); break;
    }
}

/* src[0..n) as floats; returns 1 if any of them is inf or NaN. */
CLONES static int widen_row(const uint8_t *src, kvs_dtype dt, uint64_t n, float *out)
{
    unsigned bad = 0;
    if (dt == KVS_DTYPE_BFLOAT16) {
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            bad |= (h & 0x7F80u) == 0x7F80u;
            out[i] = kvs_f32_from_bits((uint32_t)h << 16);
        }
        return bad != 0;
    }
    for (uint64_t i = 0; i < n; i++) {
        out[i] = load_elem(src + i * kvs_dtype_size(dt), dt);
        bad |= (kvs_f32_to_bits(out[i]) & 0x7F800000u) == 0x7F800000u;
    }
    return bad != 0;
}

CLONES static void narrow_row(const float *in, kvs_dtype dt, uint64_t n, uint8_t *dst)
{
    if (dt == KVS_DTYPE_BFLOAT16) {
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h = kvs_f32_to_bf16(in[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
        return;
    }
    for (uint64_t i = 0; i < n; i++) store_elem(dst + i * kvs_dtype_size(dt), dt, in[i]);
}

/* The normalized Walsh-Hadamard transform of every head of h channels, in
 * place (it is its own inverse). Butterflies in a fixed order, then one
 * multiply by 1/sqrt(h). */
static inline __attribute__((always_inline)) void hadamard_heads(float *x, uint64_t D,
                                                                  unsigned h)
{
    float norm = 1.0f / sqrtf((float)h);
    for (uint64_t base = 0; base < D; base += h) {
        float *v = x + base;
        for (unsigned len = 1; len < h; len <<= 1)
            for (unsigned i = 0; i < h; i += 2 * len)
                for (unsigned j = i; j < i + len; j++) {
                    float a = v[j], b = v[j + len];
                    v[j] = a + b;
                    v[j + len] = a - b;
                }
        for (unsigned j = 0; j < h; j++) v[j] *= norm;
    }
}

/* The common sizes get their own copy with h a constant, which the
 * compiler unrolls and vectorizes; the operations are the same. */
CLONES static void hadamard_row(float *x, uint64_t D, unsigned h)
{
    switch (h) {
    case 64: hadamard_heads(x, D, 64); break;
    case 128: hadamard_heads(x, D, 128); break;
    case 256: hadamard_heads(x, D, 256); break;
    default: hadamard_heads(x, D, h); break;
    }
}

/* Codes of x[0..n) with one scale: rint((x - z) / d) clamped to [lo, hi],
 * plus mid (code_range); d is the scale, or 1 for a scale of 0. Per-element
 * scales (channel axis) through r[], z[]. */
CLONES static void quantize_run(const float *x, uint64_t n, const float *r, const float *z,
                                int per_elem, float lo, float hi, float mid, uint8_t *codes)
{
    if (per_elem) {
        for (uint64_t i = 0; i < n; i++) {
            float q = rintf((x[i] - z[i]) / r[i]);
            q = q < lo ? lo : q;
            q = q > hi ? hi : q;
            codes[i] = (uint8_t)(int)(q + mid);
        }
        return;
    }
    float ri = r[0], zi = z[0];
    for (uint64_t i = 0; i < n; i++) {
        float q = rintf((x[i] - zi) / ri);
        q = q < lo ? lo : q;
        q = q > hi ? hi : q;
        codes[i] = (uint8_t)(int)(q + mid);
    }
}

/* The steps a group's range is cut into, and the codes: symmetric: q in
 * [-(levels - 1) / 2, (levels - 1) / 2] stored as q + 2^(bits - 1); with a
 * zero point: [0, levels - 1] as they are. */
static float steps_of(const kvs_intq_params *p)
{
    return (float)(p->zero_point ? p->levels - 1 : (p->levels - 1) / 2);
}

static void code_range(const kvs_intq_params *p, float *lo, float *hi, float *mid)
{
    *hi = steps_of(p);
    *lo = p->zero_point ? 0.0f : -*hi;
    *mid = p->zero_point ? 0.0f : (float)(1u << (p->bits - 1));
}

/* x' = (u - mid) s + z (z = 0 without a zero point; mid from code_range). */
CLONES static void dequantize_run(const uint8_t *codes, uint64_t n, const float *s,
                                  const float *z, int per_elem, float mid, float *x)
{
    if (per_elem) {
        for (uint64_t i = 0; i < n; i++) x[i] = ((float)codes[i] - mid) * s[i] + z[i];
        return;
    }
    float si = s[0], zi = z[0];
    for (uint64_t i = 0; i < n; i++) x[i] = ((float)codes[i] - mid) * si + zi;
}

/* Codes, `bits` each, LSB first into out[0..ceil(n bits / 8)). */
CLONES static void pack_codes(const uint8_t *codes, uint64_t n, unsigned bits, uint8_t *out)
{
    if (bits == 8) {
        memcpy(out, codes, n);
        return;
    }
    /* 4 and 2 bits: the codes of a byte as one little-endian word, their
     * fields moved together with shifts (codes below 2^bits: nothing else
     * lands in the low byte), which the compiler vectorizes */
    if (bits == 4) {
        for (uint64_t i = 0; i < n / 2; i++) {
            unsigned w = get_le16(codes + 2 * i);
            out[i] = (uint8_t)(w | w >> 4);
        }
        if (n & 1) out[n / 2] = codes[n - 1];
        return;
    }
    if (bits == 2) {
        for (uint64_t q = 0; q < n / 4; q++) {
            uint32_t w = get_le32(codes + 4 * q);
            out[q] = (uint8_t)(w | w >> 6 | w >> 12 | w >> 18);
        }
        uint64_t i = n / 4 * 4;
        if (i < n) {
            unsigned v = 0;
            for (unsigned k = 0; i + k < n; k++) v |= (unsigned)codes[i + k] << (2 * k);
            out[i / 4] = (uint8_t)v;
        }
        return;
    }
    uint64_t acc = 0, o = 0;
    unsigned have = 0;
    for (uint64_t i = 0; i < n; i++) {
        acc |= (uint64_t)codes[i] << have;
        have += bits;
        while (have >= 8) {
            out[o++] = (uint8_t)acc;
            acc >>= 8;
            have -= 8;
        }
    }
    if (have) out[o] = (uint8_t)acc;
}

CLONES static void unpack_codes(const uint8_t *in, uint64_t n, unsigned bits, uint8_t *codes)
{
    if (bits == 8) {
        memcpy(codes, in, n);
        return;
    }
    if (bits == 4) {
        /* (as pack_codes: one byte's codes spread into a little-endian word) */
        for (uint64_t i = 0; i < n / 2; i++) {
            unsigned x = in[i];
            put_le16(codes + 2 * i, (uint16_t)((x | x << 4) & 0x0F0Fu));
        }
        if (n & 1) codes[n - 1] = in[n / 2] & 15;
        return;
    }
    if (bits == 2) {
        for (uint64_t i = 0; i < n / 4; i++) {
            uint32_t x = in[i];
            put_le32(codes + 4 * i, (x | x << 6 | x << 12 | x << 18) & 0x03030303u);
        }
        for (uint64_t i = n / 4 * 4; i < n; i++) codes[i] = in[i / 4] >> (2 * (i & 3)) & 3;
        return;
    }
    unsigned mask = (1u << bits) - 1;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t bit = i * bits;
        unsigned v = in[bit / 8] | (bit % 8 + bits > 8 ? (unsigned)in[bit / 8 + 1] << 8 : 0);
        codes[i] = (uint8_t)(v >> (bit % 8) & mask);
    }
}

/* ---------------------------------------------------------------------
 * The kernels in use: each wrapper below runs the variant's kernel where
 * it has one, else the portable code above (intq_kernels.h)
 * ------------------------------------------------------------------ */

static const kvs_intq_kernels portable_kernels = {.isa = "scalar"};

/* The variant of the fp8 kernels' choice (so a KVSERDE_ISA this CPU cannot
 * run is refused as there). KVS_INTQ_PORTABLE builds the portable code
 * only: the tests' reference. */
static int kernels_get(const kvs_intq_kernels **out)
{
    *out = &portable_kernels;
#if KVS_HAVE_X86 && !defined(KVS_INTQ_PORTABLE)
    const kvs_fp8_kernels *fp8;
    int rc = kvs_fp8_kernels_get(&fp8);
    if (rc) return rc;
    if (strncmp(fp8->isa, "avx512", 6) == 0) *out = kvs_intq_kernels_avx512(); /* and avx512fp16 */
    else if (strcmp(fp8->isa, "avx2") == 0) *out = kvs_intq_kernels_avx2();
#endif
    return KVS_OK;
}

static int widen(const kvs_intq_kernels *k, const uint8_t *src, kvs_dtype dt, uint64_t n,
                 float *out)
{
    if (dt == KVS_DTYPE_BFLOAT16 && k->widen_bf16) return k->widen_bf16(src, n, out);
    return widen_row(src, dt, n, out);
}

static void narrow(const kvs_intq_kernels *k, const float *in, kvs_dtype dt, uint64_t n,
                   uint8_t *dst, int stream)
{
    if (dt == KVS_DTYPE_BFLOAT16 && k->narrow_bf16) k->narrow_bf16(in, n, dst, stream);
    else narrow_row(in, dt, n, dst);
}

/* quantize_run / dequantize_run of x[0..n), element i with the divisor or
 * scale r[i / group] and zero z[i / group] (group 1: one per element);
 * rinv: reciprocals (below) of r, or NULL. */
static void quantize(const kvs_intq_kernels *k, const float *x, uint64_t n, const float *r,
                     const float *rinv, const float *z, uint64_t group, float lo, float hi,
                     float mid, uint8_t *codes)
{
    if (k->quantize) k->quantize(x, n, r, rinv, z, group, lo, hi, mid, codes);
    else if (group == 1) quantize_run(x, n, r, z, 1, lo, hi, mid, codes);
    else
        for (uint64_t c0 = 0, i = 0; c0 < n; c0 += group, i++)
            quantize_run(x + c0, n - c0 < group ? n - c0 : group, r + i, z + i, 0, lo, hi, mid,
                         codes + c0);
}

static void dequantize(const kvs_intq_kernels *k, const uint8_t *codes, uint64_t n,
                       const float *s, const float *z, uint64_t group, float mid, float *x)
{
    if (k->dequantize) k->dequantize(codes, n, s, z, group, mid, x);
    else if (group == 1) dequantize_run(codes, n, s, z, 1, mid, x);
    else
        for (uint64_t c0 = 0, i = 0; c0 < n; c0 += group, i++)
            dequantize_run(codes + c0, n - c0 < group ? n - c0 : group, s + i, z + i, 0, mid,
                           x + c0);
}

static void rotate(const kvs_intq_kernels *k, float *x, uint64_t D, unsigned h)
{
    if (k->hadamard) k->hadamard(x, D, h);
    else hadamard_row(x, D, h);
}

static void pack(const kvs_intq_kernels *k, const uint8_t *codes, uint64_t n, unsigned bits,
                 uint8_t *out)
{
    if (k->pack[bits]) k->pack[bits](codes, n, out);
    else pack_codes(codes, n, bits, out);
}

static void unpack(const kvs_intq_kernels *k, const uint8_t *in, uint64_t n, unsigned bits,
                   uint8_t *codes)
{
    if (k->unpack[bits]) k->unpack[bits](in, n, codes);
    else unpack_codes(in, n, bits, codes);
}

/* The kernel's reciprocals of n divisors into out; NULL if it has none
 * (quantize then divides). */
static const float *reciprocals(const kvs_intq_kernels *k, const float *r, uint64_t n,
                                float *out)
{
    if (!k->reciprocals) return NULL;
    k->reciprocals(r, n, out);
    return out;
}

/* Where the codes of a row are made: in place when 8-bit codes are the
 * stored bytes (no copy), else in the work buffer before pack. */
static uint8_t *codes_buffer(unsigned bits, uint8_t *stored, uint8_t *work)
{
    return bits == 8 ? stored : work;
}

static void pack_row(const kvs_intq_kernels *k, const uint8_t *codes, uint64_t n,
                     unsigned bits, uint8_t *out)
{
    if (bits != 8) pack(k, codes, n, bits, out);
}

/* ---------------------------------------------------------------------
 * Scales
 * ------------------------------------------------------------------ */

/* The float16 next to v in the direction of `up` (v finite). */
static uint16_t f16_step(uint16_t h, int up)
{
    int neg = (h & 0x8000) != 0;
    if ((h & 0x7FFF) == 0) return up ? 0x0001 : 0x8001;
    return (uint16_t)(neg == up ? h - 1 : h + 1);
}

/* v rounded to the scale dtype, up (toward +inf) or down; 0 if it does
 * not fit a float16. *bits = the stored bits. */
static int round_scale(float v, kvs_dtype sd, int up, float *out, uint32_t *bits)
{
    if (sd == KVS_DTYPE_FLOAT32) {
        *out = v; /* group_scale rounds a float32 scale up itself */
        *bits = kvs_f32_to_bits(v);
        return isfinite(v);
    }
    uint16_t h = kvs_f32_to_f16(v);
    float back = kvs_f16_to_f32(h);
    if (up ? back < v : back > v) {
        h = f16_step(h, up);
        back = kvs_f16_to_f32(h);
    }
    *out = back;
    *bits = h;
    return isfinite(back);
}

static void put_scale(uint8_t *p, kvs_dtype sd, uint32_t bits)
{
    if (sd == KVS_DTYPE_FLOAT32) put_le32(p, bits);
    else put_le16(p, (uint16_t)bits);
}

static float get_scale(const uint8_t *p, kvs_dtype sd)
{
    return sd == KVS_DTYPE_FLOAT32 ? kvs_f32_from_bits(get_le32(p)) : kvs_f16_to_f32(get_le16(p));
}

/* n stored scales (or zeros) from p on as floats. */
static void load_scales(const kvs_intq_kernels *k, const uint8_t *p, kvs_dtype sd, uint64_t n,
                        float *out)
{
    if (k->load_scales) {
        k->load_scales(p, n, sd == KVS_DTYPE_FLOAT16, out);
        return;
    }
    size_t ss = kvs_dtype_size(sd);
    for (uint64_t i = 0; i < n; i++) out[i] = get_scale(p + i * ss, sd);
}

/* range / steps rounded up: steps x s >= range, so no code is clamped
 * by more than half a step (inf when range is). */
static float scale_up(float range, float steps)
{
    float s = range / steps;
    while (isfinite(s) && s * steps < range) s = nextafterf(s, INFINITY);
    return s;
}

/* The scale (and zero) of a group with values in [mn, mx]: writes them at
 * index `idx` and returns the divisor of the codes (s, or 1 for s = 0) and
 * z. */
static int group_scale(const kvs_intq_params *p, float mn, float mx, uint8_t *scales,
                       uint8_t *zeros, uint64_t idx, float *inv, float *zero)
{
    size_t ss = kvs_dtype_size(p->scale_dtype);
    float s, z = 0;
    uint32_t sb, zb = 0;
    int ok;
    if (p->zero_point) {
        ok = round_scale(mn, p->scale_dtype, 0, &z, &zb);
        ok = ok && round_scale(scale_up(mx - z, steps_of(p)), p->scale_dtype, 1, &s, &sb);
    } else {
        float amax = fabsf(mn) > fabsf(mx) ? fabsf(mn) : fabsf(mx);
        ok = round_scale(scale_up(amax, steps_of(p)), p->scale_dtype, 1, &s, &sb);
    }
    if (!ok && p->scale_dtype == KVS_DTYPE_FLOAT16)
        return kvs_set_error(KVS_EINVAL,
                             "int: values in [%g, %g] need a scale or zero point beyond float16; "
                             "use \"scale_dtype\": \"float32\"",
                             (double)mn, (double)mx);
    if (!ok)
        return kvs_set_error(KVS_EINVAL,
                             "int: values in [%g, %g] span more than float32 holds; quantize "
                             "them with a zero point off",
                             (double)mn, (double)mx);
    put_scale(scales + idx * ss, p->scale_dtype, sb);
    if (p->zero_point) put_scale(zeros + idx * ss, p->scale_dtype, zb);
    /* the codes divide by s (a reciprocal overflows for a subnormal s);
     * s = 0 only when every value of the group is z */
    *inv = s > 0 ? s : 1.0f;
    *zero = z;
    return KVS_OK;
}

/* group_scale of n groups with values in [mn[i], mx[i]], stored at
 * indexes first + i, their divisors into inv[i] and zeros into zero[i]
 * (which may be mn and mx); stops at the first that fails. */
static int group_scales(const kvs_intq_kernels *k, const kvs_intq_params *p, const float *mn,
                        const float *mx, uint64_t n, uint8_t *scales, uint8_t *zeros,
                        uint64_t first, float *inv, float *zero)
{
    size_t ss = kvs_dtype_size(p->scale_dtype);
    uint64_t done = 0;
    if (k->scales)
        done = k->scales(mn, mx, n, p->zero_point, p->scale_dtype == KVS_DTYPE_FLOAT16,
                         steps_of(p), scales + first * ss, zeros + first * ss, inv, zero);
    int rc = KVS_OK;
    for (uint64_t i = done; i < n && rc == KVS_OK; i++)
        rc = group_scale(p, mn[i], mx[i], scales, zeros, first + i, &inv[i], &zero[i]);
    return rc;
}

/* ---------------------------------------------------------------------
 * Encode
 * ------------------------------------------------------------------ */

typedef struct enc_job {
    const kvs_intq_kernels *k;
    const kvs_intq_params *p;
    const plan *pl;
    const uint8_t *src;
    uint8_t *out;
    kvs_intq_feed feed; /* NULL, or kvs_intq_encode_fed's */
    kvs_intq_feed_crc32c feed_crc32c; /* NULL, or kvs_intq_encode_fed's */
    void *state;
    uint64_t fed; /* payload bytes fed so far */
    /* with feed_crc32c: the kvs_crc32c of the current plane's codes of
     * rows [0, codes_rows) (the rows after them are written, not summed) */
    uint32_t codes_crc;
    uint64_t codes_rows;
} enc_job;

typedef struct workspace {
    float *rows;   /* up to nrows x D */
    uint64_t nrows;
    float *a, *b;  /* D floats each: statistics, then the divisors and z */
    float *c;      /* D: the divisors' reciprocals (intq_kernels.h) */
    uint8_t *codes; /* D */
} workspace;

static int ws_alloc(workspace *w, uint64_t D, uint64_t nrows)
{
    memset(w, 0, sizeof *w);
    w->nrows = nrows;
    size_t d = (size_t)D ? (size_t)D : 1;
    w->rows = malloc(sizeof(float) * d * (size_t)nrows);
    w->a = malloc(sizeof(float) * d);
    w->b = malloc(sizeof(float) * d);
    w->c = malloc(sizeof(float) * d);
    w->codes = malloc(d);
    if (w->rows && w->a && w->b && w->c && w->codes) return KVS_OK;
    free(w->rows);
    free(w->a);
    free(w->b);
    free(w->c);
    free(w->codes);
    return kvs_set_error(KVS_ENOMEM, "int: out of memory for a %llu-channel work buffer",
                         (unsigned long long)D);
}

static void ws_free(workspace *w)
{
    free(w->rows);
    free(w->a);
    free(w->b);
    free(w->c);
    free(w->codes);
}

static const uint8_t *row_src(const enc_job *j, const group_plan *g, uint64_t pi, uint64_t t)
{
    return j->src + g->src_offset + (pi * g->plane_stride + t * g->row_stride) * g->es;
}

/* Token t of plane pi as floats, outliers zeroed, rotated; the next
 * token's source prefetched, line by line (a row is worked on for longer
 * than memory takes to answer; without it the loads of widen_row waited
 * on memory, a sixth of the encoder's time in perf). */
static void prefetch_next(const enc_job *j, const group_plan *g, uint64_t pi, uint64_t t)
{
    if (t + 1 < g->T) {
        const uint8_t *next = row_src(j, g, pi, t + 1);
        for (uint64_t o = 0; o < g->D * g->es; o += 64) __builtin_prefetch(next + o);
    }
}

/* The fused token rows (and the rotated rows' widen_rotated_bf16)
 * prefetch the row this many on (intq_kernels.h's `ahead`), line by line
 * as they work: 2 was a little faster than 1 in
 * bench_int at 64 MiB (noisy; docs/performance.md), both faster than the
 * burst of prefetches before the row that prefetch_next issues (its
 * prefetcht0 waited for fill buffers: a sixth of the encoder's time). */
#define TOKEN_AHEAD 2

static int load_row(const enc_job *j, const group_plan *g, uint64_t pi, const uint8_t *outl,
                    unsigned nout, uint64_t t, float *row)
{
    /* a bfloat16 row without outliers widened and rotated in registers
     * (intq_kernels.h); one with a value not finite is read again below,
     * which names it */
    if (j->k->widen_rotated_bf16 && g->dtype == KVS_DTYPE_BFLOAT16 && nout == 0 &&
        j->p->hadamard && j->p->hadamard <= 256 && g->D % 16 == 0) {
        const uint8_t *ahead = t + TOKEN_AHEAD < g->T ? row_src(j, g, pi, t + TOKEN_AHEAD) : NULL;
        if (!j->k->widen_rotated_bf16(row_src(j, g, pi, t), g->D, j->p->hadamard, row, ahead))
            return KVS_OK;
    }
    prefetch_next(j, g, pi, t);
    if (widen(j->k, row_src(j, g, pi, t), g->dtype, g->D, row))
        for (uint64_t c = 0; c < g->D; c++)
            if (!isfinite(row[c]))
            return kvs_set_error(KVS_EINVAL,
                                 "int: element (token %llu, channel %llu) of plane %llu is not "
                                 "finite; the int stage quantizes finite values only",
                                 (unsigned long long)t, (unsigned long long)c,
                                 (unsigned long long)pi);
    for (unsigned o = 0; o < nout; o++) row[get_le16(outl + 2 * o)] = 0.0f;
    if (j->p->hadamard) rotate(j->k, row, g->D, j->p->hadamard);
    return KVS_OK;
}

/* Folds x[0..n) into *mn, *mx: eight lanes at a time, then the rest (min
 * and max of finite values in any order are the same values, so lanes
 * change nothing but let the loop vectorize; the lanes are the byte
 * definition for +0 and -0, which compare equal: each lane keeps the first
 * of them it meets). The lanes are a GCC vector (eight floats, one AVX2
 * register): written as arrays, GCC kept them in scalar registers. */
typedef float minmax_lanes __attribute__((vector_size(32)));
typedef int32_t minmax_mask __attribute__((vector_size(32)));

CLONES static void minmax(const float *x, uint64_t n, float *mn, float *mx)
{
    minmax_lanes lo, hi;
    for (int k = 0; k < 8; k++) lo[k] = *mn, hi[k] = *mx;
    uint64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        minmax_lanes v;
        memcpy(&v, x + i, sizeof v);
        /* lo = v < lo ? v : lo, lane by lane (a mask of all ones or zeros) */
        minmax_mask lt = v < lo, gt = v > hi;
        lo = (minmax_lanes)((lt & (minmax_mask)v) | (~lt & (minmax_mask)lo));
        hi = (minmax_lanes)((gt & (minmax_mask)v) | (~gt & (minmax_mask)hi));
    }
    for (; i < n; i++) {
        lo[0] = x[i] < lo[0] ? x[i] : lo[0];
        hi[0] = x[i] > hi[0] ? x[i] : hi[0];
    }
    /* The lanes in order, as a tree: "the first of the smallest" is
     * associative, so pairs of neighbours give what lane after lane gave,
     * in a chain of 4 comparisons instead of 8. */
    for (int w = 1; w < 8; w *= 2)
        for (int k = 0; k < 8; k += 2 * w) {
            lo[k] = lo[k + w] < lo[k] ? lo[k + w] : lo[k];
            hi[k] = hi[k + w] > hi[k] ? hi[k + w] : hi[k];
        }
    float m0 = *mn, m1 = *mx;
    *mn = lo[0] < m0 ? lo[0] : m0;
    *mx = hi[0] > m1 ? hi[0] : m1;
}

/* The minimum and maximum of each group of `group` elements of x[0..n)
 * into mn[k], mx[k] (minmax from the group's first element): through the
 * kernel, whose values are the same; where one of them is zero, its sign
 * is the reference's (the order of minmax's lanes decides it). */
static void group_minmax(const kvs_intq_kernels *k, const float *x, uint64_t n, uint64_t group,
                         float *mn, float *mx)
{
    if (k->minmax) k->minmax(x, n, group, mn, mx);
    for (uint64_t c0 = 0, i = 0; c0 < n; c0 += group, i++)
        if (!k->minmax || mn[i] == 0 || mx[i] == 0) {
            mn[i] = mx[i] = x[c0];
            minmax(x + c0, n - c0 < group ? n - c0 : group, &mn[i], &mx[i]);
        }
}

/* The kernels' fused rows (intq_kernels.h) take bfloat16 rows without
 * rotation, of 2-, 4- and 8-bit codes, 64 channels at a time (the
 * encoder's without outliers too: it zeroes them in the float row). */
static int fused_shape(const kvs_intq_params *p, const group_plan *g)
{
    return g->dtype == KVS_DTYPE_BFLOAT16 && !p->hadamard &&
           (p->bits == 2 || p->bits == 4 || p->bits == 8) && g->D % 64 == 0;
}

/* The kernels' rotated rows (decode_rotated_bf16) take bfloat16 rows of
 * heads up to 256 channels, 32 channels at a time. */
static int fused_rotated(const kvs_intq_kernels *k, const kvs_intq_params *p,
                         const group_plan *g)
{
    return k->decode_rotated_bf16 && g->dtype == KVS_DTYPE_BFLOAT16 && p->hadamard &&
           p->hadamard <= 256 && g->D % 32 == 0;
}

/* The fused rows prefetch the codes this many payload bytes past the
 * row's, the decoder to read them (decode_bf16's `ahead`), the token
 * encoder to write them (encode_token_bf16's `codes_ahead`). Decode at
 * 256 MiB in bench_int: int8 3.6 -> 8.1 GB/s with 2 KiB (0.5 KiB: 6.8,
 * 1 KiB: 7.6, 4 KiB: 6.4), int4 7.5 -> 9.8; at 64 MiB, whose payload the
 * crc32c pass has just left in the cache, within the noise. Encode (int8,
 * alternated in one process): 12-20 % faster from 8 to 256 MiB, its codes'
 * lines no longer read for ownership as the stores wait (int4 and int2,
 * fewer code bytes per row: within the noise). docs/performance.md. */
#define PAYLOAD_AHEAD 2048

/* The n payload bytes PAYLOAD_AHEAD past `at` (in the payload of `size`
 * bytes from `payload`) for a kernel to prefetch, or NULL where they would
 * pass the payload's end: no kernel touches an address outside it. */
static const uint8_t *payload_ahead(const uint8_t *payload, uint64_t size, const uint8_t *at,
                                    uint64_t n)
{
    uint64_t off = (uint64_t)(at - payload) + PAYLOAD_AHEAD;
    return off + n <= size ? payload + off : NULL;
}

static int fused_token(const enc_job *j, const group_plan *g, const role_plan *r)
{
    return j->k->encode_token_bf16 && fused_shape(j->p, g) && r->nout == 0 && r->group % 32 == 0 &&
           g->D % r->group == 0 && g->D / r->group <= KVS_INTQ_FUSED_GROUPS;
}

static void row_format(const kvs_intq_params *p, uint64_t group, kvs_intq_rowfmt *f)
{
    f->group = group;
    f->zero_point = p->zero_point;
    f->scale_f16 = p->scale_dtype == KVS_DTYPE_FLOAT16;
    f->bits = p->bits;
    f->steps = steps_of(p);
    code_range(p, &f->lo, &f->hi, &f->mid);
}

static int encode_block(const enc_job *j, uint32_t gi, uint64_t pi, uint64_t bi, workspace *w)
{
    const kvs_intq_params *p = j->p;
    const group_plan *g = &j->pl->g[gi];
    const role_plan *r = &g->role[plane_role(g, pi)];
    uint8_t *base = j->out + plane_payload(g, pi);
    uint8_t *scales = base + r->off_scales, *zeros = base + r->off_zeros;
    uint8_t *codes = base + r->off_codes;
    const uint8_t *outl = base;
    uint64_t D = g->D, t0 = bi * r->block_rows;
    uint64_t t1 = t0 + r->block_rows < g->T ? t0 + r->block_rows : g->T;
    int held = t1 - t0 <= w->nrows; /* the block's rows stay in w->rows */
    int rc = KVS_OK;
    float lo, hi, mid;
    code_range(p, &lo, &hi, &mid);
    if (r->axis == KVS_INTQ_TOKEN && fused_token(j, g, r)) {
        kvs_intq_rowfmt f;
        row_format(p, r->group, &f);
        size_t ss = kvs_dtype_size(p->scale_dtype);
        uint64_t first = t0 * (D / r->group);
        const uint8_t *ahead = t0 + TOKEN_AHEAD < g->T ? row_src(j, g, pi, t0 + TOKEN_AHEAD) : NULL;
        uint8_t *row_codes = codes + t0 * g->row_bytes;
        if (j->k->encode_token_bf16(row_src(j, g, pi, t0), D, &f, scales + first * ss,
                                    zeros + first * ss, row_codes, ahead,
                                    payload_ahead(j->out, j->pl->bytes, row_codes, g->row_bytes)))
            return KVS_OK;
        /* else the row as below, which refuses it or writes it */
    }
    if (r->axis == KVS_INTQ_TOKEN) {
        float *row = w->rows;
        rc = load_row(j, g, pi, outl, r->nout, t0, row);
        uint64_t ng = ceil_div(D, r->group);
        /* the statistics of every group first: their chains of comparisons
         * are independent, and overlap when not held up by the scales */
        group_minmax(j->k, row, D, r->group, w->a, w->b);
        /* then the scales: w->a, w->b become the divisors and zeros */
        if (rc == KVS_OK)
            rc = group_scales(j->k, p, w->a, w->b, ng, scales, zeros, t0 * ng, w->a, w->b);
        if (rc == KVS_OK) {
            uint8_t *out = codes + t0 * g->row_bytes, *u = codes_buffer(p->bits, out, w->codes);
            const float *rinv = reciprocals(j->k, w->a, ng, w->c);
            quantize(j->k, row, D, w->a, rinv, w->b, r->group, lo, hi, mid, u);
            pack_row(j->k, u, D, p->bits, out);
        }
        return rc;
    }
    if (r->axis == KVS_INTQ_CHANNEL && j->k->encode_channel_bf16 && fused_shape(p, g) &&
        r->nout == 0) {
        kvs_intq_rowfmt f;
        row_format(p, 1, &f);
        size_t ss = kvs_dtype_size(p->scale_dtype);
        const uint8_t *ahead = t1 + (t1 - t0) <= g->T ? row_src(j, g, pi, t1) : NULL;
        /* (the keys in the row buffer: it holds at least D floats) */
        if (j->k->encode_channel_bf16(row_src(j, g, pi, t0), g->row_stride * g->es, t1 - t0, D,
                                      &f, scales + bi * D * ss, zeros + bi * D * ss,
                                      codes + t0 * g->row_bytes, g->row_bytes,
                                      (int16_t *)w->rows, w->a, w->b, w->c, ahead))
            return KVS_OK;
        /* else the block as below, which refuses it or writes it */
    }
    /* channel axis: per-channel statistics over the block; tensor: one */
    float *mn = w->a, *mx = w->b;
    float tmn = INFINITY, tmx = -INFINITY;
    for (uint64_t c = 0; c < D; c++) mn[c] = INFINITY, mx[c] = -INFINITY;
    for (uint64_t t = t0; t < t1 && rc == KVS_OK; t++) {
        float *row = w->rows + (held ? (t - t0) * D : 0);
        rc = load_row(j, g, pi, outl, r->nout, t, row);
        if (rc) break;
        if (r->axis == KVS_INTQ_TENSOR) {
            /* the row's, then the running ones (the first of equal values
             * is associative, so this is minmax from tmn and tmx) */
            float a, b;
            group_minmax(j->k, row, D, D, &a, &b);
            tmn = a < tmn ? a : tmn;
            tmx = b > tmx ? b : tmx;
        } else if (j->k->fold_columns) j->k->fold_columns(row, D, mn, mx);
        else
            for (uint64_t c = 0; c < D; c++) {
                mn[c] = row[c] < mn[c] ? row[c] : mn[c];
                mx[c] = row[c] > mx[c] ? row[c] : mx[c];
            }
    }
    if (r->axis == KVS_INTQ_TENSOR) {
        if (rc == KVS_OK) rc = group_scale(p, tmn, tmx, scales, zeros, 0, &mn[0], &mx[0]);
    } else if (rc == KVS_OK) {
        rc = group_scales(j->k, p, mn, mx, D, scales, zeros, bi * D, mn, mx);
    }
    /* now mn[] holds the divisors and mx[] the zeros */
    uint64_t ndiv = r->axis == KVS_INTQ_CHANNEL ? D : 1;
    const float *rinv = rc == KVS_OK ? reciprocals(j->k, mn, ndiv, w->c) : NULL;
    for (uint64_t t = t0; t < t1 && rc == KVS_OK; t++) {
        float *row = w->rows + (held ? (t - t0) * D : 0);
        if (!held) rc = load_row(j, g, pi, outl, r->nout, t, row);
        if (rc) break;
        uint8_t *out = codes + t * g->row_bytes, *u = codes_buffer(p->bits, out, w->codes);
        quantize(j->k, row, D, mn, rinv, mx, r->axis == KVS_INTQ_CHANNEL ? 1 : D, lo, hi, mid,
                 u);
        pack_row(j->k, u, D, p->bits, out);
    }
    return rc;
}

/* Rows of a block of role k held as floats: all of them when they fit. */
static uint64_t rows_held(const group_plan *g, int k)
{
    uint64_t rows = g->role[k].block_rows;
    return rows && g->D && rows * g->D <= BUFFER_FLOATS ? rows : 1;
}

static uint64_t block_rows_held(const plan *pl)
{
    uint64_t most = 1;
    for (uint32_t i = 0; i < pl->ngroups; i++)
        for (int k = 0; k < 2; k++) most = rows_held(&pl->g[i], k) > most ? rows_held(&pl->g[i], k) : most;
    return most;
}

static uint64_t max_channels(const plan *pl)
{
    uint64_t d = 1;
    for (uint32_t i = 0; i < pl->ngroups; i++) d = pl->g[i].D > d ? pl->g[i].D : d;
    return d;
}

/* The payload up to the end of plane pi of g to the feed: the planes are
 * stored in the order of the items (make_plan, locate), so once the last
 * block of a plane is done, every byte before its end is final. */
static void feed_through_plane(enc_job *j, const group_plan *g, uint64_t pi)
{
    uint64_t end = plane_payload(g, pi) + g->role[plane_role(g, pi)].bytes;
    j->feed(j->state, j->out + j->fed, (size_t)(end - j->fed));
    j->fed = end;
}

/* The codes a plane's rows take before they are checksummed (feed_crc32c):
 * pieces this large stay in L1 or L2 until read (48 KiB and 2 MiB here),
 * and ISA-L's crc32c pays its set-up once per piece, not per row: fed one
 * row at a time (1 KiB of int8 codes), the encoder was a fifth slower
 * than with the plane read back; at 32 KiB, int8 at 256 MiB runs as fast
 * with the check as without it. */
#define CODES_CRC_PIECE 32768

/* Block bi of plane pi is written: its rows' codes join the plane's crc32c
 * once a piece has gathered (or the plane is done); after the plane's last
 * block, its bytes before the codes go to feed and the codes to
 * feed_crc32c by their value. */
static void feed_block_codes(enc_job *j, const group_plan *g, uint64_t pi, uint64_t bi)
{
    const role_plan *r = &g->role[plane_role(g, pi)];
    uint64_t rows = (bi + 1) * r->block_rows < g->T ? (bi + 1) * r->block_rows : g->T;
    const uint8_t *codes = j->out + plane_payload(g, pi) + r->off_codes;
    int last = bi + 1 == r->nblocks;
    if ((rows - j->codes_rows) * g->row_bytes >= CODES_CRC_PIECE || last) {
        j->codes_crc = kvs_crc32c(j->codes_crc, codes + j->codes_rows * g->row_bytes,
                                  (size_t)((rows - j->codes_rows) * g->row_bytes));
        j->codes_rows = rows;
    }
    if (!last) return;
    uint64_t start = plane_payload(g, pi) + r->off_codes;
    j->feed(j->state, j->out + j->fed, (size_t)(start - j->fed));
    j->feed_crc32c(j->state, j->codes_crc, (size_t)(g->T * g->row_bytes));
    j->fed = start + g->T * g->row_bytes;
    j->codes_crc = 0;
    j->codes_rows = 0;
}

static int encode_range(void *ctx, uint64_t begin, uint64_t end)
{
    enc_job *j = ctx;
    workspace w;
    int rc = ws_alloc(&w, max_channels(j->pl), block_rows_held(j->pl));
    if (rc) return rc;
    /* fed plane by plane only by a worker that has the whole object (other
     * workers' planes are not known to be done; kvs_intq_encode_fed then
     * feeds everything at the end) */
    int feeds = j->feed && begin == 0 && end == j->pl->nitems;
    for (uint64_t it = begin; it < end && rc == KVS_OK; it++) {
        uint32_t gi;
        uint64_t pi, bi;
        locate(j->pl, it, &gi, &pi, &bi);
        const group_plan *g = &j->pl->g[gi];
        w.nrows = rows_held(g, plane_role(g, pi));
        rc = encode_block(j, gi, pi, bi, &w);
        if (rc == KVS_OK && feeds && j->feed_crc32c) feed_block_codes(j, g, pi, bi);
        else if (rc == KVS_OK && feeds && bi + 1 == g->role[plane_role(g, pi)].nblocks)
            feed_through_plane(j, g, pi);
    }
    ws_free(&w);
    return rc;
}

/* The outlier channels of one K plane: the nout largest by absmax over the
 * plane (the lower index first among equals), stored in ascending order,
 * then their values token by token. */
static int choose_outliers(const enc_job *j, const group_plan *g, uint64_t pi, float *amax,
                           float *row)
{
    const role_plan *r = &g->role[0];
    uint8_t *base = j->out + plane_payload(g, pi);
    for (uint64_t c = 0; c < g->D; c++) amax[c] = 0;
    for (uint64_t t = 0; t < g->T; t++) {
        widen_row(row_src(j, g, pi, t), g->dtype, g->D, row);
        for (uint64_t c = 0; c < g->D; c++) {
            float a = fabsf(row[c]);
            if (!(a <= INFINITY)) a = INFINITY; /* NaN: refused by load_row later */
            amax[c] = a > amax[c] ? a : amax[c];
        }
    }
    unsigned n = 0;
    for (unsigned o = 0; o < r->nout; o++) {
        uint64_t best = UINT64_MAX;
        for (uint64_t c = 0; c < g->D; c++)
            if (amax[c] >= 0 && (best == UINT64_MAX || amax[c] > amax[best])) best = c;
        amax[best] = -1; /* taken */
        n++;
    }
    for (uint64_t c = 0, o = 0; c < g->D && o < n; c++)
        if (amax[c] == -1) put_le16(base + 2 * o++, (uint16_t)c);
    uint8_t *val = base + r->off_values;
    for (uint64_t t = 0; t < g->T; t++) {
        const uint8_t *s = row_src(j, g, pi, t);
        for (unsigned o = 0; o < n; o++, val += g->es)
            memcpy(val, s + get_le16(base + 2 * o) * g->es, g->es);
    }
    return KVS_OK;
}

static uint64_t outlier_planes(const group_plan *g) { return g->role[0].nout ? g->nk : 0; }

static int outliers_range(void *ctx, uint64_t begin, uint64_t end)
{
    const enc_job *j = ctx;
    uint64_t D = max_channels(j->pl);
    float *amax = malloc(sizeof(float) * D), *row = malloc(sizeof(float) * D);
    int rc = amax && row ? KVS_OK
                         : kvs_set_error(KVS_ENOMEM, "int: out of memory choosing outliers");
    /* item = a K plane with outliers, counted through the groups */
    for (uint64_t it = begin; it < end && rc == KVS_OK; it++) {
        uint64_t k = it;
        uint32_t gi = 0;
        while (k >= outlier_planes(&j->pl->g[gi])) k -= outlier_planes(&j->pl->g[gi++]);
        rc = choose_outliers(j, &j->pl->g[gi], k, amax, row);
    }
    free(amax);
    free(row);
    return rc;
}

int kvs_intq_encode(const kvs_intq_params *p, const kvs_memobj *src, uint8_t *out, size_t cap,
                    size_t *n)
{
    return kvs_intq_encode_fed(p, src, out, cap, n, NULL, NULL, NULL);
}

int kvs_intq_encode_fed(const kvs_intq_params *p, const kvs_memobj *src, uint8_t *out,
                        size_t cap, size_t *n, kvs_intq_feed feed,
                        kvs_intq_feed_crc32c feed_crc32c, void *state)
{
    plan *pl = malloc(sizeof *pl);
    if (pl == NULL) return kvs_set_error(KVS_ENOMEM, "int: out of memory");
    unsigned fmt = known_format(src->format) ? (unsigned)src->format : KVS_FMT_UNDEFINED;
    int rc = make_plan(p, &src->layout, fmt, pl);
    if (rc == KVS_OK && cap < pl->bytes)
        rc = kvs_set_error(KVS_ENOSPC, "int: destination too small: %zu bytes, need %llu", cap,
                           (unsigned long long)pl->bytes);
    enc_job j = {NULL, p, pl, src->data, out, feed, feed_crc32c, state, 0, 0, 0};
    if (rc == KVS_OK) rc = kernels_get(&j.k);
    if (rc) {
        free(pl);
        return rc;
    }
    out[0] = PAYLOAD_VERSION;
    out[1] = (uint8_t)fmt;
    out[2] = out[3] = 0;
    uint64_t nk = 0;
    for (uint32_t i = 0; i < pl->ngroups; i++) nk += outlier_planes(&pl->g[i]);
    size_t nbytes = (size_t)kvs_layout_nbytes(&src->layout);
    if (nk) rc = kvs_serde_parallel_for(nk, nbytes, outliers_range, &j);
    if (rc == KVS_OK) rc = kvs_serde_parallel_for(pl->nitems, nbytes, encode_range, &j);
    if (rc == KVS_OK && feed) feed(state, out + j.fed, (size_t)(pl->bytes - j.fed));
    if (rc == KVS_OK) *n = (size_t)pl->bytes;
    free(pl);
    return rc;
}

int kvs_intq_bound(const kvs_intq_params *p, const kvs_layout *layout, size_t *nbytes)
{
    static const unsigned fmts[] = {KVS_FMT_UNDEFINED, KVS_FMT_KV_2LTD, KVS_FMT_KV_2TD,
                                    KVS_FMT_KV_T2D};
    plan *pl = malloc(sizeof *pl);
    if (pl == NULL) return kvs_set_error(KVS_ENOMEM, "int: out of memory");
    uint64_t most = 0;
    int rc = KVS_OK;
    for (size_t f = 0; f < sizeof fmts / sizeof fmts[0] && rc == KVS_OK; f++) {
        rc = make_plan(p, layout, fmts[f], pl);
        if (rc == KVS_OK && pl->bytes > most) most = pl->bytes;
    }
    free(pl);
    if (rc == KVS_OK) *nbytes = (size_t)most;
    return rc;
}

/* ---------------------------------------------------------------------
 * Decode
 * ------------------------------------------------------------------ */

typedef struct dec_job {
    const kvs_intq_kernels *k;
    int stream; /* bfloat16 rows with non-temporal stores (intq_kernels.h) */
    const kvs_intq_params *p;
    const plan *pl;
    const uint8_t *in;
    uint8_t *dst;
} dec_job;

/* A stored scale and zero decode cannot use: a scale not finite or below
 * 0, a zero not finite (without branches, so a chunk's test vectorizes). */
static inline int bad_scale(float s, float z)
{
    return !(s >= 0) | !(fabsf(s) < INFINITY) | !(fabsf(z) < INFINITY);
}

/* Everything decode relies on, before dst is touched: outlier indices
 * ascending and below the channel count, scales finite and >= 0, zero
 * points finite. */
static int check_plane(const kvs_intq_kernels *k, const kvs_intq_params *p,
                       const group_plan *g, uint64_t pi, const uint8_t *in, uint32_t gi)
{
    const role_plan *r = &g->role[plane_role(g, pi)];
    const uint8_t *base = in + plane_payload(g, pi);
    for (unsigned o = 0; o < r->nout; o++) {
        unsigned c = get_le16(base + 2 * o);
        if (c >= g->D || (o && c <= get_le16(base + 2 * o - 2)))
            return kvs_set_error(KVS_ECORRUPT,
                                 "int: group %u plane %llu: outlier %u names channel %u; "
                                 "expected ascending channels below %llu",
                                 gi, (unsigned long long)pi, o, c, (unsigned long long)g->D);
    }
    /* the scales a chunk at a time, converted by the kernels, and looked
     * at one by one only when the chunk holds a bad one */
    enum { CHUNK = 256 };
    float s[CHUNK], z[CHUNK];
    size_t ss = kvs_dtype_size(p->scale_dtype);
    for (uint64_t i0 = 0; i0 < r->nscales; i0 += CHUNK) {
        uint64_t n = r->nscales - i0 < CHUNK ? r->nscales - i0 : CHUNK;
        load_scales(k, base + r->off_scales + i0 * ss, p->scale_dtype, n, s);
        if (p->zero_point) load_scales(k, base + r->off_zeros + i0 * ss, p->scale_dtype, n, z);
        else memset(z, 0, sizeof(float) * n);
        int bad = 0;
        for (uint64_t i = 0; i < n; i++) bad |= bad_scale(s[i], z[i]);
        for (uint64_t i = 0; i < n && bad; i++)
            if (bad_scale(s[i], z[i]))
                return kvs_set_error(KVS_ECORRUPT,
                                     "int: group %u plane %llu: scale %llu is %g (zero %g); "
                                     "expected a finite scale >= 0 and a finite zero",
                                     gi, (unsigned long long)pi, (unsigned long long)(i0 + i),
                                     (double)s[i], (double)z[i]);
    }
    return KVS_OK;
}

/* n scales and zeros from s and z on into w->a and w->b (zeros 0 without
 * a zero point). */
static void row_scales(const dec_job *j, const uint8_t *s, const uint8_t *z, uint64_t n,
                       workspace *w)
{
    load_scales(j->k, s, j->p->scale_dtype, n, w->a);
    if (j->p->zero_point) load_scales(j->k, z, j->p->scale_dtype, n, w->b);
    else memset(w->b, 0, sizeof(float) * n);
}

/* The scales and zeros of block bi of a channel- or tensor-axis plane into
 * w->a and w->b (D of them, or 1). */
static void block_scales(const dec_job *j, const group_plan *g, uint64_t pi, uint64_t bi,
                         workspace *w)
{
    const kvs_intq_params *p = j->p;
    const role_plan *r = &g->role[plane_role(g, pi)];
    const uint8_t *base = j->in + plane_payload(g, pi);
    size_t ss = kvs_dtype_size(p->scale_dtype);
    uint64_t first = r->axis == KVS_INTQ_CHANNEL ? bi * g->D : 0;
    uint64_t n = r->axis == KVS_INTQ_CHANNEL ? g->D : 1;
    row_scales(j, base + r->off_scales + first * ss, base + r->off_zeros + first * ss, n, w);
}

static void decode_row(const dec_job *j, const group_plan *g, uint64_t pi, uint64_t t,
                       workspace *w)
{
    const kvs_intq_params *p = j->p;
    const role_plan *r = &g->role[plane_role(g, pi)];
    const uint8_t *base = j->in + plane_payload(g, pi);
    uint64_t D = g->D;
    size_t ss = kvs_dtype_size(p->scale_dtype);
    float *row = w->rows, *s = w->a, *z = w->b;
    float lo, hi, mid;
    code_range(p, &lo, &hi, &mid);
    const uint8_t *stored = base + r->off_codes + t * g->row_bytes, *u = stored;
    uint8_t *dst = j->dst + g->src_offset + (pi * g->plane_stride + t * g->row_stride) * g->es;
    /* element i's scale: s[i / group] */
    uint64_t group = r->axis == KVS_INTQ_TOKEN ? r->group : r->axis == KVS_INTQ_CHANNEL ? 1 : D;
    if (r->axis == KVS_INTQ_TOKEN) {
        uint64_t ng = ceil_div(D, r->group), first = t * ng;
        row_scales(j, base + r->off_scales + first * ss, base + r->off_zeros + first * ss, ng, w);
    } /* else block_scales filled s and z */
    if (j->k->decode_bf16 && fused_shape(p, g) && (group == 1 || group % 16 == 0)) {
        j->k->decode_bf16(stored, D, p->bits, s, z, group, mid, dst, j->stream,
                          payload_ahead(j->in, j->pl->bytes, stored, g->row_bytes));
    } else {
        if (p->bits != 8) { /* 8-bit codes are read where they are */
            unpack(j->k, stored, D, p->bits, w->codes);
            u = w->codes;
        }
        if (fused_rotated(j->k, p, g) && (group == 1 || group % 16 == 0)) {
            j->k->decode_rotated_bf16(u, D, s, z, group, mid, p->hadamard, dst, j->stream);
        } else {
            dequantize(j->k, u, D, s, z, group, mid, row);
            if (p->hadamard) rotate(j->k, row, D, p->hadamard);
            narrow(j->k, row, g->dtype, D, dst, j->stream);
        }
    }
    const uint8_t *val = base + r->off_values + t * r->nout * g->es;
    for (unsigned o = 0; o < r->nout; o++)
        memcpy(dst + get_le16(base + 2 * o) * g->es, val + o * g->es, g->es);
}

static int decode_range(void *ctx, uint64_t begin, uint64_t end)
{
    const dec_job *j = ctx;
    workspace w;
    int rc = ws_alloc(&w, max_channels(j->pl), 1);
    if (rc) return rc;
    for (uint64_t it = begin; it < end && rc == KVS_OK; it++) {
        uint32_t gi;
        uint64_t pi, bi;
        locate(j->pl, it, &gi, &pi, &bi);
        const group_plan *g = &j->pl->g[gi];
        const role_plan *r = &g->role[plane_role(g, pi)];
        uint64_t t0 = bi * r->block_rows;
        uint64_t t1 = t0 + r->block_rows < g->T ? t0 + r->block_rows : g->T;
        if (r->axis != KVS_INTQ_TOKEN) block_scales(j, g, pi, bi, &w);
        for (uint64_t t = t0; t < t1; t++) decode_row(j, g, pi, t, &w);
    }
    /* the rows' streamed lines ordered before the range is reported done
     * (the kernels do not fence per row, intq_kernels.h) */
    if (j->stream && j->k->store_fence) j->k->store_fence();
    ws_free(&w);
    return rc;
}

int kvs_intq_decode(const kvs_intq_params *p, const uint8_t *in, size_t n, kvs_memobj *dst)
{
    if (n < PAYLOAD_HEADER || in[0] != PAYLOAD_VERSION || !known_format(in[1]) || in[2] ||
        in[3])
        return kvs_set_error(KVS_ECORRUPT,
                             "int: payload header damaged: %zu bytes, version %u, memory format "
                             "%u, reserved %u %u; expected version %d, a format from 0 to %d, 0 0",
                             n, n ? in[0] : 0, n > 1 ? in[1] : 0, n > 2 ? in[2] : 0,
                             n > 3 ? in[3] : 0, PAYLOAD_VERSION, KVS_FMT_HS_TD);
    plan *pl = malloc(sizeof *pl);
    if (pl == NULL) return kvs_set_error(KVS_ENOMEM, "int: out of memory");
    int rc = make_plan(p, &dst->layout, in[1], pl);
    if (rc == KVS_EINVAL) { /* a layout the encoder cannot have written */
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        rc = kvs_set_error(KVS_ECORRUPT, "%s", msg);
    }
    if (rc == KVS_OK && n != pl->bytes)
        rc = kvs_set_error(KVS_ECORRUPT,
                           "int: stored object is %zu bytes, destination layout needs %llu", n,
                           (unsigned long long)pl->bytes);
    if (rc == KVS_OK && dst->capacity < kvs_layout_nbytes(&dst->layout))
        rc = kvs_set_error(KVS_ENOSPC, "int: destination holds %zu bytes, need %llu",
                           dst->capacity, (unsigned long long)kvs_layout_nbytes(&dst->layout));
    dec_job j = {NULL, kvs_layout_nbytes(&dst->layout) >= kvs_fp8_nt_min_bytes(), p, pl, in,
                 dst->data};
    if (rc == KVS_OK) rc = kernels_get(&j.k);
    /* (a group of empty planes has no bytes to check, however many planes) */
    for (uint32_t i = 0; i < pl->ngroups && rc == KVS_OK; i++)
        for (uint64_t pi = 0; pi < pl->g[i].nplanes && rc == KVS_OK; pi++) {
            if (pl->g[i].role[plane_role(&pl->g[i], pi)].bytes == 0) continue;
            rc = check_plane(j.k, p, &pl->g[i], pi, in, i);
        }
    if (rc == KVS_OK) {
        rc = kvs_serde_parallel_for(pl->nitems, (size_t)kvs_layout_nbytes(&dst->layout),
                                    decode_range, &j);
    }
    free(pl);
    return rc;
}

/* ---------------------------------------------------------------------
 * Parameters
 * ------------------------------------------------------------------ */

int kvs_intq_check(const kvs_intq_params *p, int code, const char *who)
{
    if (p->bits < 2 || p->bits > 8)
        return kvs_set_error(code, "%s: bits is %u; expected 2 to 8", who, p->bits);
    for (int k = 0; k < 2; k++) {
        if (p->axis[k] > KVS_INTQ_TENSOR)
            return kvs_set_error(code, "%s: %s axis is %u; expected 0 (token), 1 (channel) or 2 "
                                 "(tensor)", who, k ? "V" : "K", p->axis[k]);
        if (p->group[k] < 1 || p->group[k] > KVS_INTQ_GROUP_MAX)
            return kvs_set_error(code, "%s: %s group is %u; expected 1 to %d", who,
                                 k ? "V" : "K", p->group[k], KVS_INTQ_GROUP_MAX);
    }
    if (p->zero_point != 0 && p->zero_point != 1)
        return kvs_set_error(code, "%s: zero point flag is %d; expected 0 or 1", who,
                             p->zero_point);
    if (p->scale_dtype != KVS_DTYPE_FLOAT16 && p->scale_dtype != KVS_DTYPE_FLOAT32)
        return kvs_set_error(code, "%s: scale dtype is %d; expected %d (float16) or %d (float32)",
                             who, (int)p->scale_dtype, KVS_DTYPE_FLOAT16, KVS_DTYPE_FLOAT32);
    if (p->hadamard == 1 || p->hadamard > KVS_INTQ_HADAMARD_MAX ||
        (p->hadamard & (p->hadamard - 1)))
        return kvs_set_error(code, "%s: hadamard is %u; expected 0 (off) or a power of two from "
                             "2 to %d", who, p->hadamard, KVS_INTQ_HADAMARD_MAX);
    unsigned most = p->zero_point ? 1u << p->bits : (1u << p->bits) - 1;
    if (p->levels < 2 + !p->zero_point || p->levels > most || (!p->zero_point && !(p->levels & 1)))
        return kvs_set_error(code, "%s: levels is %u; expected %s from %u to %u with %u bits%s",
                             who, p->levels, p->zero_point ? "an integer" : "an odd integer",
                             2 + !p->zero_point, most, p->bits,
                             p->zero_point ? " and a zero point" : ", symmetric");
    if (p->k_outliers > KVS_INTQ_OUTLIERS_MAX)
        return kvs_set_error(code, "%s: k_outliers is %u; expected 0 to %d", who, p->k_outliers,
                             KVS_INTQ_OUTLIERS_MAX);
    return KVS_OK;
}
