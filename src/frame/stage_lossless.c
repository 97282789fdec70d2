/* stage_lossless.c - the "lossless" bytes stage (id 80): exact compression
 * of the typed stage's output, knowing its element size (kvs_stage_ctx).
 *
 * The elements are cut into blocks of LL_BLOCK_ELEMS elements (128 KiB of
 * bfloat16: a block, its planes and zstd's tables stay in a 1 MiB L2). In a
 * block, byte b of every element goes to plane b (bfloat16 / float16: the
 * mantissa-low plane and the sign+exponent plane; float32: four planes; fp8
 * codes and uint8: one plane). Each plane is stored raw or as one zstd frame,
 * whichever is smaller (the top plane with matches of at least 7 bytes:
 * LL_MIN_MATCH); a plane whose order-0 entropy estimate is above
 * LL_RAW_BITS bits per byte (the bfloat16 low byte of real KV: 7.97) is
 * stored raw without trying zstd, below level LL_TRY_ALL_LEVEL (zstd -1
 * gains 0.06% on that plane at the cost of a second compression; -19 gains
 * 0.8% from matches, so slow levels try every plane). Blocks are independent: encode and decode
 * run them through kvs_serde_parallel_for, and a damaged block is refused by
 * its own lengths, by zstd, and by the frame's checksum after this stage.
 *
 * Payload (docs/frame_format.md, little-endian):
 *   u8 version (1) | u8 element size s (1, 2, 4) | u16 0 | u32 block elements E
 *   | u64 decoded bytes n | u32 stored bytes of each block (nblocks =
 *   ceil(floor(n / s) / E)) | the blocks | the n mod s tail bytes, raw.
 *   A block of k elements is s plane records: u32 (bit 31: zstd frame, else
 *   raw; bits 0-30 the record's byte count, exactly k when raw) and the bytes.
 * So the output is at most n + 16 + (4 + 4 s) x nblocks bytes.
 *
 * Version 2 (the "rans" coder, 2-byte elements only): the same container
 * with an 8-byte longer header, u32 channel period P (1 to 4096) and u32 0
 * after n, and each block one record of lossless_exponent.c (the bfloat16
 * exponent through rANS with a table per channel group, sign and mantissa
 * raw; or the block raw): at most n + 24 + 5 x nblocks bytes. Version 3:
 * version 2 whose records may also be of kind 2, rows that refer to an
 * earlier row they repeat in part; the encoder writes it only when some
 * block uses that kind, so a version 2 reader reads everything else.
 * Version 4: version 3 whose records may also be of kind 3, the signs
 * coded per channel; written only when some block uses that kind. Other
 * element sizes get version 1 under either coder. A reader decodes every
 * version whatever its own configuration says.
 *
 * Parameters (2 bytes): i8 zstd level (-7 to 19, encoder only, recorded for
 * inspect; the rANS coder looks for row references from LL_REFS_LEVEL and
 * codes signs from LL_SIGNS_LEVEL),
 * u8 coder (0 zstd, 1 rans; encoder only, recorded for inspect).
 *
 * Why zstd: Debian's libzstd is maintained, fuzzed and fast, its literal
 * Huffman coder does the order-0 work on the exponent plane, and its match
 * finder picks up repeats (all-equal blocks, repeated rows) a plain entropy
 * coder misses. Its Huffman coder is not public API, so the per-channel
 * tables of version 2 need a coder of our own (src/codecs/rans.c; why, and
 * what each pays: docs/performance.md). zstd stays the default: its matches
 * win 0.6 % on the real KV cache, the rANS coder encodes 3x faster. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#ifdef __SSE2__
#include <emmintrin.h> /* x86-64 baseline: the bfloat16 plane split and join */
#endif

#include "frame/lossless_exponent.h"
#include "frame/stage.h"
#include "kvserde/error.h"
#include "kvserde/registry.h"
#include "kvserde/serde.h"
#include "util/crc32c.h"

#define LL_VERSION 1    /* byte planes through zstd */
#define LL_VERSION_RANS 2 /* the exponent through rANS (lossless_exponent.c) */
#define LL_VERSION_REFS 3 /* version 2 with records of row references */
#define LL_VERSION_SIGNS 4 /* version 3 with records of coded signs */
/* The rANS coder looks for row references from this level: they gain 2.9 %
 * on the real KV cache (1.519x -> 1.563x) and cost about a third of its
 * speed (docs/performance.md), so the default level keeps the fast coder. */
#define LL_REFS_LEVEL 2
/* ... and may code the signs (a flip of the sign above, per class of
 * channels) from this one: 1.563x -> 1.578x on the real KV cache, above
 * zstd -19 on the planes, at about half level 2's speed (docs/performance.md),
 * so a level of its own. */
#define LL_SIGNS_LEVEL 3
#define LL_HEADER_RANS 24u
#define LL_CODER_ZSTD 0
#define LL_CODER_RANS 1
#define LL_BLOCK_ELEMS 65536u
#define LL_HEADER 16u
#define LL_MAX_ELEM 4u
#define LL_MAX_BLOCK_BYTES ((uint64_t)16 << 20) /* refused above: 16 MiB */
#define LL_RAW_BITS 7.9
#define LL_TRY_ALL_LEVEL 10 /* from this level every plane is tried */
#define LL_ZSTD_FLAG 0x80000000u
#define LL_LEVEL_MIN (-7)
#define LL_LEVEL_MAX 19
#define LL_DEFAULT_LEVEL 1
/* The top plane of multi-byte elements (sign and exponent bits) is coded
 * with matches of at least 7 bytes (zstd's longest minimum): there the
 * short matches cost more than the literals they replace (kvdata, layers
 * 1-5: 1.529x instead of 1.502x at level 1, and faster; at level 19 the
 * high plane gains too). The other planes and fp8 codes lose by it. */
#define LL_MIN_MATCH 7

typedef struct lossless_stage {
    kvs_stage base;
    int level;
    int coder; /* LL_CODER_* */
} lossless_stage;

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p)
{
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

static int ll_create(const json_t *config, kvs_stage **out)
{
    static const char *const known[] = {"type", "level", "coder", NULL};
    int rc = kvs_json_check_keys(config, "lossless", "member", known);
    if (rc) return rc;
    int level = LL_DEFAULT_LEVEL;
    const json_t *lv = json_object_get(config, "level");
    if (lv != NULL) {
        if (!json_is_integer(lv) || json_integer_value(lv) < LL_LEVEL_MIN ||
            json_integer_value(lv) > LL_LEVEL_MAX || json_integer_value(lv) == 0)
            return kvs_set_error(KVS_EINVAL,
                                 "lossless: \"level\" must be an integer from %d to %d other "
                                 "than 0 (zstd's level; for the rans coder 2 and up add row "
                                 "references, 3 and up coded signs; default %d), got %s",
                                 LL_LEVEL_MIN, LL_LEVEL_MAX, LL_DEFAULT_LEVEL,
                                 json_is_integer(lv) ? "an out-of-range integer"
                                                     : kvs_json_type_name(lv));
        level = (int)json_integer_value(lv);
    }
    int coder = LL_CODER_ZSTD;
    const json_t *cv = json_object_get(config, "coder");
    if (cv != NULL) {
        const char *name = json_is_string(cv) ? json_string_value(cv) : NULL;
        if (name != NULL && strcmp(name, "rans") == 0)
            coder = LL_CODER_RANS;
        else if (name == NULL || strcmp(name, "zstd") != 0)
            return kvs_set_error(KVS_EINVAL,
                                 "lossless: \"coder\" must be \"zstd\" (default) or \"rans\", "
                                 "got %s%s%s",
                                 name ? "\"" : "", name ? name : kvs_json_type_name(cv),
                                 name ? "\"" : "");
    }
    lossless_stage *s = calloc(1, sizeof *s);
    if (s == NULL) return kvs_set_error(KVS_ENOMEM, "lossless: out of memory creating the stage");
    s->base.type = &kvs_stage_lossless_type;
    s->level = level;
    s->coder = coder;
    *out = &s->base;
    return KVS_OK;
}

static size_t ll_bound(const kvs_stage *self, size_t n)
{
    (void)self;
    /* Worst case over element sizes and versions: one-byte elements have the
     * most blocks (n / E) at 8 bytes each; s-byte ones n / (s E) at 4 + 4 s
     * (version 2: 5 each, 8 more header bytes). */
    size_t blocks = n / LL_BLOCK_ELEMS + 1;
    size_t extra = LL_HEADER + 4 * LL_MAX_ELEM + 8 * blocks + 4;
    return n > SIZE_MAX - extra ? SIZE_MAX : n + extra;
}

/* One zstd context of each kind kept for the next call: creating one per
 * blob (its workspace allocated and set up) cost as much as coding a
 * 64 KiB plane. A call takes the kept one or makes its own, and keeps it
 * afterwards if the slot is free (else frees it); the kept ones are
 * reachable from here until the process ends. */
static _Atomic(ZSTD_CCtx *) cctx_kept;
static _Atomic(ZSTD_DCtx *) dctx_kept;

static ZSTD_CCtx *cctx_take(void)
{
    ZSTD_CCtx *c = atomic_exchange(&cctx_kept, NULL);
    return c ? c : ZSTD_createCCtx();
}

static void cctx_give(ZSTD_CCtx *c)
{
    ZSTD_CCtx *none = NULL;
    if (c && !atomic_compare_exchange_strong(&cctx_kept, &none, c)) ZSTD_freeCCtx(c);
}

static ZSTD_DCtx *dctx_take(void)
{
    ZSTD_DCtx *d = atomic_exchange(&dctx_kept, NULL);
    return d ? d : ZSTD_createDCtx();
}

static void dctx_give(ZSTD_DCtx *d)
{
    ZSTD_DCtx *none = NULL;
    if (d && !atomic_compare_exchange_strong(&dctx_kept, &none, d)) ZSTD_freeDCtx(d);
}

/* The same for one plane buffer of LL_KEPT_BUF bytes (a block's planes of
 * up to 4-byte elements): malloc would map and fault in 128 KiB and more
 * afresh on every call. Larger needs (a payload's own E) get their own. */
#define LL_KEPT_BUF ((size_t)LL_MAX_ELEM * LL_BLOCK_ELEMS)
static _Atomic(uint8_t *) buf_kept;

static uint8_t *buf_take(size_t need)
{
    if (need > LL_KEPT_BUF) return malloc(need);
    uint8_t *b = atomic_exchange(&buf_kept, NULL);
    return b ? b : malloc(LL_KEPT_BUF);
}

static void buf_give(uint8_t *b, size_t need)
{
    uint8_t *none = NULL;
    if (b && (need > LL_KEPT_BUF || !atomic_compare_exchange_strong(&buf_kept, &none, b)))
        free(b);
}

/* ---- encode ---------------------------------------------------------- */

typedef struct enc_job {
    const uint8_t *in;
    uint8_t *out;       /* a range of blocks [b0, b1) is written from slot b0,
                         * out + base + b0 * slot, each block right after the one
                         * before, so that one range (one thread) ends in place */
    size_t base, slot;  /* slot = block_max(E): a block never needs more */
    uint32_t *stored;   /* bytes block b used */
    size_t *at;         /* where block b was written, from out */
    uint32_t *crc;      /* not NULL: the kvs_crc32c of block b's record, taken
                         * right after it is written */
    uint8_t *kinds;     /* version 2: the kind beyond 1 block b's record uses
                         * (KVS_LLX_REFS, KVS_LLX_SIGNS, 0) */
    uint64_t nelems;
    unsigned s;
    int level;
    int version;     /* of the payload: LL_VERSION or LL_VERSION_RANS (the
                      * encoder raises it to what the records need after) */
    uint32_t period; /* version 2: the channel period */
} enc_job;

/* The most bytes a block of k elements of s bytes takes in `version`. */
static size_t block_max(int version, unsigned s, size_t k)
{
    return version != LL_VERSION ? KVS_LLX_RECORD_MAX(k) : 4 * s + (size_t)s * k;
}

/* Order-0 entropy estimate of a plane, bits per byte. */
static double plane_bits(const uint8_t *p, size_t k)
{
    uint32_t h[4][256];
    memset(h, 0, sizeof h);
    size_t i = 0;
    for (; i + 4 <= k; i += 4) {
        h[0][p[i]]++;
        h[1][p[i + 1]]++;
        h[2][p[i + 2]]++;
        h[3][p[i + 3]]++;
    }
    for (; i < k; i++) h[0][p[i]]++;
    double bits = 0;
    for (int v = 0; v < 256; v++) {
        uint32_t c = h[0][v] + h[1][v] + h[2][v] + h[3][v];
        if (c) bits -= (double)c * log2((double)c / (double)k);
    }
    return bits / (double)k;
}

/* One plane record at rec: zstd if smaller, else raw. Returns its bytes. */
static size_t put_plane(ZSTD_CCtx *cc, int level, int top, const uint8_t *plane, size_t k,
                        uint8_t *rec)
{
    if (k > 64 && (level >= LL_TRY_ALL_LEVEL || plane_bits(plane, k) < LL_RAW_BITS)) {
        /* the level is set on cc by enc_range; 0 is zstd's own minimum */
        size_t z = ZSTD_CCtx_setParameter(cc, ZSTD_c_minMatch, top ? LL_MIN_MATCH : 0);
        if (!ZSTD_isError(z)) z = ZSTD_compress2(cc, rec + 4, k - 1, plane, k);
        if (!ZSTD_isError(z) && z < k) {
            put32(rec, LL_ZSTD_FLAG | (uint32_t)z);
            return 4 + z;
        }
    }
    put32(rec, (uint32_t)k);
    memcpy(rec + 4, plane, k);
    return 4 + k;
}

static void split_planes(const uint8_t *src, size_t k, unsigned s, uint8_t *planes)
{
    if (s == 2) {
        uint8_t *p0 = planes, *p1 = planes + k;
        size_t i = 0;
#ifdef __SSE2__
        const __m128i lo = _mm_set1_epi16(0x00FF);
        for (; i + 16 <= k; i += 16) {
            __m128i a = _mm_loadu_si128((const __m128i *)(src + 2 * i));
            __m128i b = _mm_loadu_si128((const __m128i *)(src + 2 * i + 16));
            _mm_storeu_si128((__m128i *)(p0 + i),
                             _mm_packus_epi16(_mm_and_si128(a, lo), _mm_and_si128(b, lo)));
            _mm_storeu_si128((__m128i *)(p1 + i),
                             _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
        }
#endif
        for (; i < k; i++) {
            p0[i] = src[2 * i];
            p1[i] = src[2 * i + 1];
        }
        return;
    }
    for (size_t i = 0; i < k; i++)
        for (unsigned b = 0; b < s; b++) planes[b * k + i] = src[s * i + b];
}

/* Version 2 blocks [b0, b1) (lossless_exponent.c). */
static int enc_range_rans(const enc_job *j, uint64_t b0, uint64_t b1)
{
    kvs_llx_scratch *w = kvs_llx_scratch_take(LL_BLOCK_ELEMS);
    if (w == NULL) return kvs_set_error(KVS_ENOMEM, "lossless: out of memory for a block's fields");
    size_t pos = j->base + (size_t)b0 * j->slot;
    for (uint64_t b = b0; b < b1; b++) {
        uint64_t e0 = b * LL_BLOCK_ELEMS;
        size_t k = (size_t)(j->nelems - e0 < LL_BLOCK_ELEMS ? j->nelems - e0 : LL_BLOCK_ELEMS);
        size_t used = 0;
        unsigned tools = (j->level >= LL_REFS_LEVEL ? KVS_LLX_REFS : 0) |
                         (j->level >= LL_SIGNS_LEVEL ? KVS_LLX_SIGNS : 0);
        /* While this block's symbols are coded: the next block of the
         * range, and the record area from past this block's split field
         * (its stream's place and the next block's split field, within
         * the range's slots: a record is at most 1 + 2k bytes). */
        kvs_rans_warm warm = {NULL, 0, j->out + pos + 1 + k, k};
        if (b + 1 < b1) {
            uint64_t left = j->nelems - (e0 + k);
            size_t k_next = (size_t)(left < LL_BLOCK_ELEMS ? left : LL_BLOCK_ELEMS);
            warm.read = j->in + (e0 + k) * 2, warm.read_len = 2 * k_next;
            warm.write_len += 1 + 2 * k_next;
        }
        j->kinds[b] = (uint8_t)kvs_llx_encode_block(w, j->in + e0 * 2, k, e0, j->period, tools,
                                                    &warm, j->out + pos, &used);
        j->stored[b] = (uint32_t)used;
        j->at[b] = pos;
        if (j->crc) j->crc[b] = kvs_crc32c(0, j->out + pos, used);
        pos += used;
    }
    kvs_llx_scratch_give(w);
    return KVS_OK;
}

static int enc_range(void *vctx, uint64_t begin, uint64_t end)
{
    const enc_job *j = vctx;
    uint64_t b0 = begin / KVS_SPLIT_ALIGN, b1 = end / KVS_SPLIT_ALIGN;
    if (j->version != LL_VERSION) return enc_range_rans(j, b0, b1);
    ZSTD_CCtx *cc = cctx_take();
    size_t need = (size_t)j->s * LL_BLOCK_ELEMS;
    uint8_t *planes = j->s > 1 ? buf_take(need) : NULL;
    if (cc == NULL || (j->s > 1 && planes == NULL)) {
        cctx_give(cc);
        buf_give(planes, need);
        return kvs_set_error(KVS_ENOMEM, "lossless: out of memory for a block's planes");
    }
    size_t e1 = ZSTD_CCtx_reset(cc, ZSTD_reset_session_and_parameters);
    size_t e2 = ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, j->level);
    if (ZSTD_isError(e1) || ZSTD_isError(e2)) {
        cctx_give(cc);
        buf_give(planes, need);
        return kvs_set_error(KVS_EINVAL, "lossless: zstd refuses level %d: %s", j->level,
                             ZSTD_getErrorName(ZSTD_isError(e2) ? e2 : e1));
    }
    size_t pos = j->base + (size_t)b0 * j->slot;
    for (uint64_t b = b0; b < b1; b++) {
        uint64_t e0 = b * LL_BLOCK_ELEMS;
        size_t k = (size_t)(j->nelems - e0 < LL_BLOCK_ELEMS ? j->nelems - e0 : LL_BLOCK_ELEMS);
        const uint8_t *src = j->in + e0 * j->s;
        uint8_t *rec = j->out + pos;
        size_t used = 0;
        if (j->s == 1) {
            used = put_plane(cc, j->level, 0, src, k, rec);
        } else {
            split_planes(src, k, j->s, planes);
            for (unsigned p = 0; p < j->s; p++)
                used += put_plane(cc, j->level, p == j->s - 1, planes + (size_t)p * k, k,
                                  rec + used);
        }
        j->stored[b] = (uint32_t)used;
        j->at[b] = pos;
        if (j->crc) j->crc[b] = kvs_crc32c(0, rec, used);
        pos += used;
    }
    cctx_give(cc);
    buf_give(planes, need);
    return KVS_OK;
}

static unsigned ctx_elem_size(const kvs_stage_ctx *ctx)
{
    unsigned s = ctx ? ctx->elem_size : 0;
    return s == 1 || s == 2 || s == 4 ? s : 1;
}

/* ll_encode, and with crc not NULL the kvs_crc32c of its output, from each
 * block's as it was written (the blocks' bytes do not change as they move
 * down) and the header, table and tail's. */
static int ll_encode_to(const kvs_stage *self, const kvs_stage_ctx *ctx, const uint8_t *in,
                        size_t n, uint8_t *out, size_t cap, size_t *outn, uint32_t *crc)
{
    const lossless_stage *st = KVS_CONTAINER_OF(self, const lossless_stage, base);
    unsigned s = ctx_elem_size(ctx);
    int version = st->coder == LL_CODER_RANS && s == 2 ? LL_VERSION_RANS : LL_VERSION;
    size_t header = version == LL_VERSION_RANS ? LL_HEADER_RANS : LL_HEADER;
    /* The channel period of version 2: the layout's last dim, where the
     * group map stays small against a block. */
    uint64_t channels = ctx ? ctx->channels : 0;
    uint32_t period = channels >= 2 && channels <= KVS_LLX_MAX_PERIOD ? (uint32_t)channels : 1;
    uint64_t nelems = n / s;
    uint64_t nblocks = (nelems + LL_BLOCK_ELEMS - 1) / LL_BLOCK_ELEMS;
    size_t base = header + 4 * (size_t)nblocks;
    size_t slot = block_max(version, s, LL_BLOCK_ELEMS);
    size_t tail = n - (size_t)nelems * s;
    /* The slots: every block but the last is full; the last at most one. */
    size_t need = base + (size_t)nblocks * slot + tail;
    if (nblocks > 0)
        need -= slot - block_max(version, s, (size_t)(nelems - (nblocks - 1) * LL_BLOCK_ELEMS));
    if (cap < need || cap < ll_bound(self, n))
        return kvs_set_error(KVS_ENOSPC, "lossless: output holds %zu bytes, need %zu", cap,
                             ll_bound(self, n));
    uint32_t *stored = malloc(nblocks ? (size_t)nblocks * sizeof *stored : 1);
    size_t *at_b = malloc(nblocks ? (size_t)nblocks * sizeof *at_b : 1);
    uint32_t *crc_b = crc ? malloc(nblocks ? (size_t)nblocks * sizeof *crc_b : 1) : NULL;
    uint8_t *kinds = calloc(nblocks ? (size_t)nblocks : 1, 1);
    int rc = KVS_OK;
    if (stored == NULL || at_b == NULL || kinds == NULL || (crc && crc_b == NULL))
        rc = kvs_set_error(KVS_ENOMEM, "lossless: out of memory");
    enc_job job = {in,   out,   base,      slot,    stored,  at_b, crc_b,
                   kinds, nelems, s,       st->level, version, period};
    if (rc == KVS_OK) rc = kvs_serde_parallel_for(nblocks * KVS_SPLIT_ALIGN, n, enc_range, &job);
    if (rc) {
        free(stored);
        free(at_b);
        free(crc_b);
        free(kinds);
        return rc;
    }
    /* the first version that holds every kind used */
    for (uint64_t b = 0; b < nblocks; b++) {
        if (kinds[b] == KVS_LLX_SIGNS) version = LL_VERSION_SIGNS;
        if (kinds[b] == KVS_LLX_REFS && version < LL_VERSION_REFS) version = LL_VERSION_REFS;
    }
    free(kinds);
    /* Close the gaps between ranges: block b moves down to its final
     * offset (never up; none moves when one range took them all). */
    size_t at = base;
    for (uint64_t b = 0; b < nblocks; b++) {
        if (at_b[b] != at) memmove(out + at, out + at_b[b], stored[b]);
        put32(out + header + 4 * (size_t)b, stored[b]);
        at += stored[b];
    }
    free(at_b);
    if (tail) memcpy(out + at, in + (size_t)nelems * s, tail);
    at += tail;
    out[0] = (uint8_t)version;
    out[1] = (uint8_t)s;
    out[2] = out[3] = 0;
    put32(out + 4, LL_BLOCK_ELEMS);
    put64(out + 8, n);
    if (version != LL_VERSION) {
        put32(out + 16, period);
        put32(out + 20, 0);
    }
    if (crc) {
        uint32_t c = kvs_crc32c(0, out, base);
        for (uint64_t b = 0; b < nblocks; b++) c = kvs_crc32c_combine(c, crc_b[b], stored[b]);
        *crc = kvs_crc32c(c, out + at - tail, tail);
    }
    free(crc_b);
    free(stored);
    *outn = at;
    return KVS_OK;
}

static int ll_encode(const kvs_stage *self, const uint8_t *params, size_t nparams,
                     const kvs_stage_ctx *ctx, const uint8_t *in, size_t n, uint8_t *out,
                     size_t cap, size_t *outn)
{
    (void)params;
    (void)nparams;
    return ll_encode_to(self, ctx, in, n, out, cap, outn, NULL);
}

static int ll_encode_crc32c(const kvs_stage *self, const uint8_t *params, size_t nparams,
                            const kvs_stage_ctx *ctx, const uint8_t *in, size_t n, uint8_t *out,
                            size_t cap, size_t *outn, uint32_t *crc)
{
    (void)params;
    (void)nparams;
    return ll_encode_to(self, ctx, in, n, out, cap, outn, crc);
}

/* ---- decode ---------------------------------------------------------- */

typedef struct ll_head {
    int version;
    unsigned s;
    uint32_t E;
    uint32_t period; /* version 2 */
    uint64_t n, nelems, nblocks;
    size_t table, tail;
} ll_head;

/* The header and the block table's lengths against in[0..len). */
static int read_head(const uint8_t *in, size_t len, ll_head *h)
{
    if (len < LL_HEADER)
        return kvs_set_error(KVS_ECORRUPT, "lossless: %zu bytes, shorter than the %u-byte header",
                             len, LL_HEADER);
    if (in[0] < LL_VERSION || in[0] > LL_VERSION_SIGNS)
        return kvs_set_error(KVS_ECORRUPT, "lossless: version %u, expected %u to %u", in[0],
                             LL_VERSION, LL_VERSION_SIGNS);
    h->version = in[0];
    h->s = in[1];
    if ((h->s != 1 && h->s != 2 && h->s != 4) || in[2] || in[3])
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: element size %u (1, 2 or 4) or reserved bytes %u %u",
                             in[1], in[2], in[3]);
    size_t header = LL_HEADER;
    h->period = 1;
    if (h->version != LL_VERSION) {
        header = LL_HEADER_RANS;
        if (len < LL_HEADER_RANS)
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: %zu bytes, shorter than the %u-byte version %d header",
                                 len, LL_HEADER_RANS, h->version);
        h->period = get32(in + 16);
        if (h->s != 2 || h->period == 0 || h->period > KVS_LLX_MAX_PERIOD || get32(in + 20))
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: version %d with element size %u (2), channel period "
                                 "%u (1 to %u), reserved %u (0)",
                                 h->version, h->s, h->period, KVS_LLX_MAX_PERIOD, get32(in + 20));
    }
    h->E = get32(in + 4);
    if (h->E == 0 || (uint64_t)h->E * h->s > LL_MAX_BLOCK_BYTES)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block of %u elements of %u bytes (1 to %llu bytes)",
                             h->E, h->s, (unsigned long long)LL_MAX_BLOCK_BYTES);
    h->n = get64(in + 8);
    h->nelems = h->n / h->s;
    h->nblocks = (h->nelems + h->E - 1) / h->E;
    h->tail = (size_t)(h->n % h->s);
    if (h->nblocks > (len - header) / 4)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: %llu decoded bytes need %llu blocks; the %zu stored "
                             "bytes cannot hold their table",
                             (unsigned long long)h->n, (unsigned long long)h->nblocks, len);
    h->table = header;
    uint64_t sum = header + 4 * h->nblocks + h->tail;
    for (uint64_t b = 0; b < h->nblocks; b++) sum += get32(in + header + 4 * b);
    if (sum != len)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: the block table accounts for %llu bytes, %zu stored",
                             (unsigned long long)sum, len);
    return KVS_OK;
}

static int ll_decoded_size(const uint8_t *params, size_t nparams, const uint8_t *in, size_t n,
                           size_t *outn)
{
    (void)params;
    (void)nparams;
    ll_head h = {0};
    int rc = read_head(in, n, &h);
    if (rc) return rc;
    if (h.n > SIZE_MAX) return kvs_set_error(KVS_ECORRUPT, "lossless: decoded size too large");
    *outn = (size_t)h.n;
    return KVS_OK;
}

typedef struct dec_job {
    const uint8_t *in;
    const size_t *offset; /* of each block in `in` */
    const uint32_t *len;
    uint8_t *out;
    const ll_head *h;
    kvs_llx_held *held; /* not NULL: the blocks are held, written after all (ll_decode_direct) */
} dec_job;

static int get_plane(ZSTD_DCtx *dc, const uint8_t *rec, size_t avail, size_t k, uint8_t *plane,
                     size_t *used, uint64_t b, unsigned p)
{
    if (avail < 4)
        return kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: plane %u record truncated",
                             (unsigned long long)b, p);
    uint32_t w = get32(rec);
    size_t m = w & ~LL_ZSTD_FLAG;
    if (m > avail - 4)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: block %llu: plane %u claims %zu bytes, %zu left",
                             (unsigned long long)b, p, m, avail - 4);
    if (!(w & LL_ZSTD_FLAG)) {
        if (m != k)
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: block %llu: raw plane %u of %zu bytes, expected %zu",
                                 (unsigned long long)b, p, m, k);
        memcpy(plane, rec + 4, k);
    } else {
        size_t got = ZSTD_decompressDCtx(dc, plane, k, rec + 4, m);
        if (ZSTD_isError(got) || got != k)
            return kvs_set_error(KVS_ECORRUPT,
                                 "lossless: block %llu: plane %u does not decode to %zu bytes: %s",
                                 (unsigned long long)b, p, k,
                                 ZSTD_isError(got) ? ZSTD_getErrorName(got) : "wrong size");
    }
    *used = 4 + m;
    return KVS_OK;
}

static void join_planes(const uint8_t *planes, size_t k, unsigned s, uint8_t *dst)
{
    if (s == 2) {
        const uint8_t *p0 = planes, *p1 = planes + k;
        size_t i = 0;
#ifdef __SSE2__
        for (; i + 16 <= k; i += 16) {
            __m128i a = _mm_loadu_si128((const __m128i *)(p0 + i));
            __m128i b = _mm_loadu_si128((const __m128i *)(p1 + i));
            _mm_storeu_si128((__m128i *)(dst + 2 * i), _mm_unpacklo_epi8(a, b));
            _mm_storeu_si128((__m128i *)(dst + 2 * i + 16), _mm_unpackhi_epi8(a, b));
        }
#endif
        for (; i < k; i++) {
            dst[2 * i] = p0[i];
            dst[2 * i + 1] = p1[i];
        }
        return;
    }
    for (size_t i = 0; i < k; i++)
        for (unsigned b = 0; b < s; b++) dst[s * i + b] = planes[b * k + i];
}

/* Block b of the payload, for lossless_exponent.c. */
static kvs_llx_block rans_block(const dec_job *j, uint64_t b)
{
    const ll_head *h = j->h;
    uint64_t e0 = b * h->E;
    size_t k = (size_t)(h->nelems - e0 < h->E ? h->nelems - e0 : h->E);
    return (kvs_llx_block){j->in + j->offset[b], j->len[b], k, e0, b, j->out + e0 * 2};
}

/* Version 2 blocks [b0, b1) (lossless_exponent.c), two at a time where
 * there are two: their rANS streams decode at once (kvs_llx_decode_pair);
 * with j->held only checked and held (kvs_llx_hold_range, two streams at
 * once from the first block to the last), for dec_write. */
static int dec_range_rans(const dec_job *j, uint64_t b0, uint64_t b1)
{
    const ll_head *h = j->h;
    kvs_llx_scratch *w[2] = {kvs_llx_scratch_take(h->E),
                             b1 - b0 >= 2 ? kvs_llx_scratch_take(h->E) : NULL};
    int rc = KVS_OK;
    if (w[0] == NULL || (b1 - b0 >= 2 && w[1] == NULL))
        rc = kvs_set_error(KVS_ENOMEM, "lossless: out of memory for a block's fields");
    unsigned tools = (h->version >= LL_VERSION_REFS ? KVS_LLX_REFS : 0) |
                     (h->version >= LL_VERSION_SIGNS ? KVS_LLX_SIGNS : 0);
    if (j->held && rc == KVS_OK) {
        kvs_llx_block blk[KVS_LLX_HELD_MAX]; /* ll_direct_ok: at most that many */
        for (uint64_t b = b0; b < b1; b++) blk[b - b0] = rans_block(j, b);
        rc = kvs_llx_hold_range(w, j->held, b0, blk, (size_t)(b1 - b0), h->period, tools);
        b0 = b1;
    }
    for (uint64_t b = b0; b < b1 && rc == KVS_OK;) {
        kvs_llx_block blk[2];
        int pair = b1 - b >= 2;
        for (int s = 0; s < 1 + pair; s++) blk[s] = rans_block(j, b + (uint64_t)s);
        rc = pair ? kvs_llx_decode_pair(w, blk, h->period, tools)
                  : kvs_llx_decode_block(w[0], blk[0].rec, blk[0].len, blk[0].k, blk[0].first,
                                         h->period, tools, blk[0].block, blk[0].dst);
        b += 1 + (uint64_t)pair;
    }
    kvs_llx_scratch_give(w[0]);
    kvs_llx_scratch_give(w[1]);
    return rc;
}

static int dec_range(void *vctx, uint64_t begin, uint64_t end)
{
    const dec_job *j = vctx;
    const ll_head *h = j->h;
    uint64_t b0 = begin / KVS_SPLIT_ALIGN, b1 = end / KVS_SPLIT_ALIGN;
    if (h->version != LL_VERSION) return dec_range_rans(j, b0, b1);
    ZSTD_DCtx *dc = dctx_take();
    size_t need = (size_t)h->s * h->E;
    uint8_t *planes = h->s > 1 ? buf_take(need) : NULL;
    int rc = KVS_OK;
    if (dc == NULL || (h->s > 1 && planes == NULL))
        rc = kvs_set_error(KVS_ENOMEM, "lossless: out of memory for a block's planes");
    for (uint64_t b = b0; b < b1 && rc == KVS_OK; b++) {
        uint64_t e0 = b * h->E;
        size_t k = (size_t)(h->nelems - e0 < h->E ? h->nelems - e0 : h->E);
        const uint8_t *rec = j->in + j->offset[b];
        size_t avail = j->len[b], used = 0;
        uint8_t *dst = j->out + e0 * h->s;
        for (unsigned p = 0; p < h->s && rc == KVS_OK; p++) {
            rc = get_plane(dc, rec, avail, k, h->s == 1 ? dst : planes + (size_t)p * k, &used,
                           b, p);
            rec += used;
            avail -= rc ? 0 : used;
        }
        if (rc == KVS_OK && avail != 0)
            rc = kvs_set_error(KVS_ECORRUPT, "lossless: block %llu: %zu bytes after its planes",
                               (unsigned long long)b, avail);
        if (rc == KVS_OK && h->s > 1) join_planes(planes, k, h->s, dst);
    }
    dctx_give(dc);
    buf_give(planes, need);
    return rc;
}

/* The held blocks [b0, b1) written (every block of the object checked). */
static int dec_write(void *vctx, uint64_t begin, uint64_t end)
{
    const dec_job *j = vctx;
    for (uint64_t b = begin / KVS_SPLIT_ALIGN; b < end / KVS_SPLIT_ALIGN; b++)
        kvs_llx_held_write(j->held, b);
    return KVS_OK;
}

/* Whether ll_decode_direct takes a payload of this head: the rANS coder's
 * versions (the zstd planes are joined as each block decodes) in blocks
 * of the encoder's size, at most KVS_LLX_HELD_MAX of them (a slot a
 * block). */
static int direct_shape(const ll_head *h)
{
    return h->version != LL_VERSION && h->E == LL_BLOCK_ELEMS && h->nblocks >= 1 &&
           h->nblocks <= KVS_LLX_HELD_MAX;
}

static int ll_direct_ok(const uint8_t *params, size_t nparams, const uint8_t *in, size_t n)
{
    (void)params;
    (void)nparams;
    ll_head h = {0};
    return n >= LL_HEADER && read_head(in, n, &h) == KVS_OK && direct_shape(&h);
}

typedef int (*ll_accept_fn)(void *arg, uint32_t crc);

static int ll_decode_to(const kvs_stage_ctx *ctx, const uint8_t *in, size_t n, uint8_t *out,
                        size_t cap, size_t *outn, int direct, ll_accept_fn accept, void *arg);

static int ll_decode(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                     const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn)
{
    (void)params;
    (void)nparams;
    return ll_decode_to(ctx, in, n, out, cap, outn, 0, NULL, NULL);
}

/* ll_decode into the caller's destination: every block is checked and held
 * first (kvs_llx_hold_range), then all are written, so a refusal (the same, with
 * the same message) leaves out untouched. Only where ll_direct_ok. */
static int ll_decode_direct(const uint8_t *params, size_t nparams, const kvs_stage_ctx *ctx,
                            const uint8_t *in, size_t n, uint8_t *out, size_t cap, size_t *outn,
                            ll_accept_fn accept, void *arg)
{
    (void)params;
    (void)nparams;
    return ll_decode_to(ctx, in, n, out, cap, outn, 1, accept, arg);
}

/* A refusal rc of ll_decode_direct's input not yet checked: the check's
 * refusal instead when the input does not pass it (it came first). */
static int ll_refuse(int rc, const uint8_t *in, size_t n, ll_accept_fn accept, void *arg)
{
    int a = accept ? accept(arg, kvs_crc32c(0, in, n)) : KVS_OK;
    return a ? a : rc;
}

static int ll_decode_to(const kvs_stage_ctx *ctx, const uint8_t *in, size_t n, uint8_t *out,
                        size_t cap, size_t *outn, int direct, ll_accept_fn accept, void *arg)
{
    ll_head h = {0};
    int rc = read_head(in, n, &h);
    if (rc) return ll_refuse(rc, in, n, accept, arg);
    if (direct && !direct_shape(&h))
        return kvs_set_error(KVS_EINVAL, "lossless: decoding into the destination takes payload "
                             "versions 2-4 of 1 to %u blocks of %u elements",
                             KVS_LLX_HELD_MAX, LL_BLOCK_ELEMS);
    if (ctx && ctx->elem_size && ctx_elem_size(ctx) != h.s)
        return ll_refuse(kvs_set_error(KVS_ECORRUPT,
                                       "lossless: stored with %u-byte elements; the typed stage "
                                       "before it produces %u-byte elements",
                                       h.s, ctx_elem_size(ctx)),
                         in, n, accept, arg);
    if (cap < h.n)
        return ll_refuse(kvs_set_error(KVS_ENOSPC, "lossless: output holds %zu bytes, need %llu",
                                       cap, (unsigned long long)h.n),
                         in, n, accept, arg);
    size_t *offset = malloc(h.nblocks ? (size_t)h.nblocks * sizeof *offset : 1);
    uint32_t *len = malloc(h.nblocks ? (size_t)h.nblocks * sizeof *len : 1);
    if (offset == NULL || len == NULL) {
        free(offset);
        free(len);
        return ll_refuse(kvs_set_error(KVS_ENOMEM, "lossless: out of memory for %llu blocks",
                                       (unsigned long long)h.nblocks),
                         in, n, accept, arg);
    }
    size_t at = h.table + 4 * (size_t)h.nblocks;
    for (uint64_t b = 0; b < h.nblocks; b++) {
        len[b] = get32(in + h.table + 4 * b);
        offset[b] = at;
        at += len[b];
    }
    dec_job job = {in, offset, len, out, &h, NULL};
    if (direct && (job.held = kvs_llx_held_take(h.nblocks)) == NULL)
        rc = kvs_set_error(KVS_ENOMEM, "lossless: out of memory for %llu held blocks",
                           (unsigned long long)h.nblocks);
    if (rc == KVS_OK)
        rc = kvs_serde_parallel_for(h.nblocks * KVS_SPLIT_ALIGN, h.n, dec_range, &job);
    if (rc) {
        rc = ll_refuse(rc, in, n, accept, arg);
    } else if (accept) {
        /* the input's CRC-32C from its blocks' (taken as they were held) */
        uint32_t c = kvs_crc32c(0, in, h.table + 4 * (size_t)h.nblocks);
        for (uint64_t b = 0; b < h.nblocks; b++)
            c = kvs_crc32c_combine(c, kvs_llx_held_crc(job.held, b), len[b]);
        rc = accept(arg, kvs_crc32c(c, in + at, h.tail));
    }
    if (rc == KVS_OK && direct)
        rc = kvs_serde_parallel_for(h.nblocks * KVS_SPLIT_ALIGN, h.n, dec_write, &job);
    kvs_llx_held_give(job.held);
    free(offset);
    free(len);
    if (rc) return rc;
    if (h.tail) memcpy(out + h.nelems * h.s, in + at, h.tail);
    *outn = (size_t)h.n;
    return KVS_OK;
}

/* ---- parameters ------------------------------------------------------ */

static size_t ll_params_size(const kvs_stage *self)
{
    (void)self;
    return 2;
}

static int ll_write_params(const kvs_stage *self, uint8_t *params)
{
    const lossless_stage *st = KVS_CONTAINER_OF(self, const lossless_stage, base);
    params[0] = (uint8_t)(int8_t)st->level;
    params[1] = (uint8_t)st->coder;
    return KVS_OK;
}

static int ll_check_params(const uint8_t *params, size_t nparams)
{
    if (nparams != 2)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: %zu parameter bytes in the frame, expected 2", nparams);
    int level = (int8_t)params[0];
    if (level < LL_LEVEL_MIN || level > LL_LEVEL_MAX || level == 0 || params[1] > LL_CODER_RANS)
        return kvs_set_error(KVS_ECORRUPT,
                             "lossless: parameters level %d (%d to %d, not 0), coder %u (0 zstd, "
                             "1 rans)",
                             level, LL_LEVEL_MIN, LL_LEVEL_MAX, params[1]);
    return KVS_OK;
}

static json_t *ll_describe(const uint8_t *params, size_t nparams)
{
    (void)nparams;
    return json_pack("{s:i,s:s}", "level", (int)(int8_t)params[0], "coder",
                     params[1] == LL_CODER_RANS ? "rans" : "zstd");
}

static void ll_destroy(kvs_stage *self)
{
    free(KVS_CONTAINER_OF(self, lossless_stage, base));
}

const kvs_stage_type kvs_stage_lossless_type = {
    .name = "lossless",
    .id = KVS_STAGE_LOSSLESS,
    .kind = KVS_STAGE_TRANSFORM,
    .create = ll_create,
    .bytes_bound = ll_bound,
    .in_place = 0,
    .needs_header = 0,
    .transform_encode = ll_encode,
    .transform_encode_crc32c = ll_encode_crc32c,
    .transform_decoded_size = ll_decoded_size,
    .transform_decode = ll_decode,
    .transform_direct_ok = ll_direct_ok,
    .transform_decode_direct = ll_decode_direct,
    .params_size = ll_params_size,
    .write_params = ll_write_params,
    .check_params = ll_check_params,
    .describe_params = ll_describe,
    .destroy = ll_destroy,
};
