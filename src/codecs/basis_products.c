/* basis_products.c - the transform stage's basis products on AMX-BF16
 * tiles (basis_products.h): the choice, the packed basis copies, and the
 * padding around the tile kernel (basis_products_amx.c).
 *
 * Why AMX: the products are 2 x 256 flops per element at encode (about
 * 2 x kept at decode), which float32 FMA at this core's peak caps below the
 * stage's targets (docs/fidelity.md "Speed"); TDPBF16PS multiplies
 * bfloat16 at about 14 times that rate, so even four products per basis
 * product (the hi / lo parts) leave the products a small share. */
#include "codecs/basis_products.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "codecs/basis_products_kernel.h"
#include "codecs/clones.h"
#include "codecs/half.h"
#include "util/cpu_features.h"

#if KVS_HAVE_X86
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* The packed copies: both orientations share one shape because the basis
 * is square (K and N both hidden, padded to 32: kblocks x 32 and
 * ntiles x 16 with ntiles even). */
struct kvs_basis_packed {
    size_t kblocks, ntiles;
    size_t part;   /* uint16_t per part of one layer's K or V basis */
    uint16_t *fwd; /* [kv][layer][FWD_PARTS][part]: B^T, for the forward product */
    uint16_t *inv; /* [kv][layer][INV_PARTS][part]: B, for the inverse product */
    float *bmean;  /* [kv][layer][16 ntiles]: (the sum of B's parts) mean, in double */
};

/* Encode splits the basis into three bfloat16 parts (each split leaves at
 * most 2^-8 of the rest: within 2^-24 of it, float32's rounding): with two
 * (2^-16) the coefficients rounded the other way from a float64 product's
 * 15 times as often as sgemm's did (926 against 63 of 12.6 M on kvdata at
 * step 0.019), with three less often (36; docs/fidelity.md "Speed"). Decode rounds its output
 * to the destination dtype, where two parts are already below that. */
#define FWD_PARTS 3
#define INV_PARTS 2

/* ---- the choice -------------------------------------------------------- */

#if KVS_HAVE_X86
/* arch_prctl's request for a dynamically enabled state component and
 * XTILEDATA's number (asm/prctl.h; not in every libc's headers). Granted
 * for the whole process, for good: the kernel then gives every signal
 * frame room for the 8 KiB tile state. */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int amx_permitted;
static pthread_once_t permission_once = PTHREAD_ONCE_INIT;

static void ask_permission(void)
{
    amx_permitted = (kvs_cpu_features() & KVS_CPU_AMX_BF16) &&
                    syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}
#endif

static int amx_available(void)
{
#if KVS_HAVE_X86
    pthread_once(&permission_once, ask_permission);
    return amx_permitted;
#else
    return 0;
#endif
}

static atomic_int amx_state = -1; /* -1 not chosen yet, 0 sgemm, 1 AMX */

int kvs_basis_amx_in_use(void)
{
    int s = atomic_load_explicit(&amx_state, memory_order_relaxed);
    if (s < 0) {
        s = !kvs_cpu_isa_forced_pre_avx512() && amx_available();
        atomic_store_explicit(&amx_state, s, memory_order_relaxed);
    }
    return s;
}

int kvs_basis_set_amx(int on)
{
    int s = on && amx_available();
    atomic_store_explicit(&amx_state, s, memory_order_relaxed);
    return s;
}

/* ---- packing ----------------------------------------------------------- */

static size_t round_up(size_t n, size_t m)
{
    return (n + m - 1) / m * m;
}

/* A float as the sum of nparts bfloat16, each the remainder so far
 * rounded to nearest; part q goes to out[q * stride]. */
static void split_bf16(float v, size_t nparts, uint16_t *out, size_t stride)
{
    for (size_t q = 0; q < nparts; q++) {
        out[q * stride] = kvs_f32_to_bf16(v);
        v -= kvs_bf16_to_f32(out[q * stride]);
    }
}

/* split_bf16 into two parts for an integer-valued float of magnitude at
 * most 2^15 (the coefficients): no NaN to keep, and the remainder is
 * exact, so both parts are bit operations the loop over a row vectorizes. */
static inline void split_integer(float v, uint16_t *hi, uint16_t *lo)
{
    uint32_t u = kvs_f32_to_bits(v);
    *hi = (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    *lo = (uint16_t)(kvs_f32_to_bits(v - kvs_bf16_to_f32(*hi)) >> 16);
}

/* One layer's basis, split once (split_bf16, FWD_PARTS parts; the first
 * INV_PARTS of them are the inverse's split too, each part being the
 * remainder so far rounded) into parts[q][j * h + e], as the kernel's
 * operand of K rows x N columns, in nparts parts p->part apart: element
 * (k, n) is basis element (n, k) when transposed (forward: K runs over the
 * hidden channels), else (k, n); zero beyond h. */
static void pack_basis(const uint16_t *parts, size_t h, int transposed,
                       const kvs_basis_packed *p, size_t nparts, uint16_t *out)
{
    for (size_t nt = 0; nt < p->ntiles; nt++)
        for (size_t kb = 0; kb < p->kblocks; kb++) {
            size_t tile = (nt * p->kblocks + kb) * 512;
            for (size_t r = 0; r < 16; r++)
                for (size_t n = 0; n < 16; n++)
                    for (size_t pair = 0; pair < 2; pair++) {
                        size_t k = kb * 32 + 2 * r + pair, col = nt * 16 + n;
                        size_t at = transposed ? col * h + k : k * h + col;
                        for (size_t q = 0; q < nparts; q++)
                            out[q * p->part + tile + r * 32 + n * 2 + pair] =
                                k < h && col < h ? parts[q * h * h + at] : 0;
                    }
        }
}

void kvs_basis_packed_free(kvs_basis_packed *p)
{
    if (p == NULL) return;
    free(p->fwd);
    free(p->inv);
    free(p->bmean);
    free(p);
}

kvs_basis_packed *kvs_basis_pack(const kvs_transform *t)
{
    if (!kvs_basis_amx_in_use()) return NULL;
    kvs_basis_packed *p = calloc(1, sizeof *p);
    if (p == NULL) return NULL;
    size_t h = t->hidden, streams = (size_t)2 * t->layers;
    p->kblocks = round_up(h, 32) / 32;
    p->ntiles = round_up(h, 32) / 16;
    p->part = p->ntiles * p->kblocks * 512;
    p->fwd = malloc(streams * FWD_PARTS * p->part * sizeof(uint16_t));
    p->inv = malloc(streams * INV_PARTS * p->part * sizeof(uint16_t));
    p->bmean = calloc(streams * p->ntiles * 16, sizeof(float));
    if (p->fwd == NULL || p->inv == NULL || p->bmean == NULL) {
        kvs_basis_packed_free(p);
        return NULL;
    }
    uint16_t *parts = malloc(FWD_PARTS * h * h * sizeof(uint16_t));
    if (parts == NULL) {
        kvs_basis_packed_free(p);
        return NULL;
    }
    for (size_t s = 0; s < streams; s++) {
        int kv = (int)(s / t->layers);
        size_t l = s % t->layers;
        const float *b = t->basis[kv] + l * h * h, *mean = t->mean[kv] + l * h;
        for (size_t e = 0; e < h * h; e++) split_bf16(b[e], FWD_PARTS, parts + e, h * h);
        pack_basis(parts, h, 1, p, FWD_PARTS, p->fwd + FWD_PARTS * s * p->part);
        pack_basis(parts, h, 0, p, INV_PARTS, p->inv + INV_PARTS * s * p->part);
        /* with the parts the tiles multiply, so the mean's product cancels
         * the same basis the data's does */
        for (size_t j = 0; j < h; j++) {
            double sum = 0;
            for (size_t e = 0; e < h; e++) {
                double v = 0;
                for (size_t q = 0; q < FWD_PARTS; q++)
                    v += kvs_bf16_to_f32(parts[q * h * h + j * h + e]);
                sum += v * mean[e];
            }
            p->bmean[s * p->ntiles * 16 + j] = (float)sum;
        }
    }
    free(parts);
    return p;
}

/* ---- the products ------------------------------------------------------ */

static int run_gemm(const kvs_basis_gemm *g)
{
#if KVS_HAVE_X86
    kvs_basis_amx_gemm(g);
    return 1;
#else
    (void)g;
    return 0;
#endif
}

/* The T x kept coefficients q as their hi and lo parts (split_integer)
 * in Tpad rows of kpad, zero beyond them, and per 32 rows x 32 columns
 * whether any lo is nonzero: every byte of a, a_lo and lo_flags written,
 * so the buffers need no clearing first (a calloc of them cost a pass of
 * its own). */
CLONES_V4 static void split_rows(const float *q, size_t T, size_t Tpad, size_t kept, size_t kpad,
                              uint16_t *a, uint16_t *a_lo, uint8_t *lo_flags)
{
    size_t kblocks = kpad / 32;
    memset(lo_flags, 0, Tpad / 32 * kblocks);
    for (size_t r = 0; r < T; r++) {
        for (size_t kb = 0; kb < kblocks; kb++) {
            size_t k0 = kb * 32, k1 = k0 + 32 < kept ? k0 + 32 : kept;
            uint16_t any = 0;
            for (size_t k = k0; k < k1; k++) {
                split_integer(q[r * kept + k], &a[r * kpad + k], &a_lo[r * kpad + k]);
                any |= a_lo[r * kpad + k];
            }
            lo_flags[r / 32 * kblocks + kb] |= any != 0;
        }
        for (size_t k = kept; k < kpad; k++) a[r * kpad + k] = a_lo[r * kpad + k] = 0;
    }
    memset(a + T * kpad, 0, (Tpad - T) * kpad * sizeof(uint16_t));
    memset(a_lo + T * kpad, 0, (Tpad - T) * kpad * sizeof(uint16_t));
}

/* out (T rows of h, ldc apart) into dst (rows of h): (out - sub) * scale,
 * or out * scale where sub is NULL. */
CLONES_V4 static void scale_rows(const float *out, size_t ldc, size_t T, size_t h,
                              const float *sub, float scale, float *dst)
{
    for (size_t r = 0; r < T; r++) {
        const float *o = out + r * ldc;
        float *d = dst + r * h;
        if (sub)
            for (size_t j = 0; j < h; j++) d[j] = (o[j] - sub[j]) * scale;
        else
            for (size_t j = 0; j < h; j++) d[j] = o[j] * scale;
    }
}

int kvs_basis_forward(const kvs_transform *t, int kv, uint32_t l, const uint16_t *x, size_t T,
                      float inv_delta, float *c)
{
    const kvs_basis_packed *p = t->packed;
    if (p == NULL || !kvs_basis_amx_in_use()) return 0;
    size_t h = t->hidden, kpad = p->kblocks * 32, npad = p->ntiles * 16, Tpad = round_up(T, 32);
    size_t s = (size_t)kv * t->layers + l;
    /* the tiles read whole 32 x 32 blocks: the rows are used in place
     * where they fill them, else copied into a zero-padded buffer */
    int in_place = T == Tpad && h == kpad;
    uint16_t *apad = in_place ? NULL : calloc(Tpad * kpad, sizeof(uint16_t));
    float *cpad = in_place ? NULL : malloc(Tpad * npad * sizeof(float));
    if (!in_place && (apad == NULL || cpad == NULL)) {
        free(apad), free(cpad);
        return 0;
    }
    for (size_t r = 0; !in_place && r < T; r++)
        memcpy(apad + r * kpad, x + r * h, h * sizeof(uint16_t));
    float *out = in_place ? c : cpad;
    size_t ldc = in_place ? h : npad;
    kvs_basis_gemm g = {.a = in_place ? x : apad, .lda = kpad, .m = Tpad, .kblocks = p->kblocks,
                        .nparts = FWD_PARTS, .nt_stride = p->kblocks * 512,
                        .ntiles = p->ntiles, .c = out, .ldc = ldc};
    for (size_t q = 0; q < FWD_PARTS; q++) g.b[q] = p->fwd + (FWD_PARTS * s + q) * p->part;
    int done = run_gemm(&g);
    const float *bmean = p->bmean + s * npad;
    if (done) scale_rows(out, ldc, T, h, bmean, inv_delta, c);
    free(apad), free(cpad);
    return done;
}

int kvs_basis_inverse(const kvs_transform *t, int kv, uint32_t l, const float *q, size_t T,
                      size_t kept, float delta, float *x)
{
    const kvs_basis_packed *p = t->packed;
    if (p == NULL || !kvs_basis_amx_in_use() || kept == 0 || kept > t->hidden) return 0;
    size_t h = t->hidden, npad = p->ntiles * 16, Tpad = round_up(T, 32);
    size_t kblocks = round_up(kept, 32) / 32, kpad = kblocks * 32;
    size_t s = (size_t)kv * t->layers + l;
    int in_place = T == Tpad && h == npad;
    uint16_t *a = malloc(2 * Tpad * kpad * sizeof(uint16_t));
    uint8_t *lo_flags = malloc(Tpad / 32 * kblocks);
    float *cpad = in_place ? NULL : malloc(Tpad * npad * sizeof(float));
    if (a == NULL || lo_flags == NULL || (!in_place && cpad == NULL)) {
        free(a), free(lo_flags), free(cpad);
        return 0;
    }
    uint16_t *a_lo = a + Tpad * kpad; /* not before the check: no offset from NULL */
    split_rows(q, T, Tpad, kept, kpad, a, a_lo, lo_flags);
    float *out = in_place ? x : cpad;
    size_t ldc = in_place ? h : npad;
    kvs_basis_gemm g = {.a = a, .a_lo = a_lo, .a_lo_flags = lo_flags, .lda = kpad, .m = Tpad,
                        .kblocks = kblocks, .nparts = INV_PARTS,
                        .nt_stride = p->kblocks * 512, .ntiles = p->ntiles, .c = out, .ldc = ldc};
    for (size_t part = 0; part < INV_PARTS; part++)
        g.b[part] = p->inv + (INV_PARTS * s + part) * p->part;
    int done = run_gemm(&g);
    if (done) scale_rows(out, ldc, T, h, NULL, delta, x);
    free(a), free(lo_flags), free(cpad);
    return done;
}
