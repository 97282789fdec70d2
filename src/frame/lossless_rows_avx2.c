/* lossless_rows_avx2.c - the rebuild of a row with a reference (record
 * kind 2, lossless_exponent.c) and the encoder's inverse, 16 elements at a
 * time with AVX2, for CPUs without AVX-512 VBMI2 (lossless_rows.h): AVX2
 * has no byte expand or compress, so each half of 8 moves through a pshufb
 * chosen by its 8 flag bits (two tables of 2 KiB, built once). On Zen 3
 * the scalar rebuild was a fifth of a level-2 block's decoding.
 * Compiled with the AVX2 flags (CMakeLists.txt); the caller checks the
 * CPU. Writes what the scalar loops write, bit for bit (test_lossless
 * compares them). */
#include <immintrin.h>
#include <pthread.h>

#include "frame/lossless_rows.h"

/* expand8[m]: the pshufb that spreads the next popcount(m) bytes to the
 * lanes set in m, in order (0x80: a zero elsewhere). compress8[m]: its
 * inverse, the bytes of the lanes set in m packed to the front. */
static uint8_t expand8[256][8], compress8[256][8];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void)
{
    for (unsigned m = 0; m < 256; m++) {
        unsigned j = 0;
        for (unsigned l = 0; l < 8; l++) {
            expand8[m][l] = 0x80;
            compress8[m][l] = 0x80;
        }
        for (unsigned l = 0; l < 8; l++)
            if (m >> l & 1) {
                expand8[m][l] = (uint8_t)j;
                compress8[m][j++] = (uint8_t)l;
            }
    }
}

/* 16 flag bits from bit `bit` of fl[0..nfb) (0 past its end). */
static inline unsigned flags16(const uint8_t *fl, size_t nfb, size_t bit)
{
    uint32_t v = 0;
    size_t b0 = bit >> 3;
    for (unsigned j = 0; j < 3 && b0 + j < nfb; j++) v |= (uint32_t)fl[b0 + j] << (8 * j);
    return v >> (bit & 7) & 0xFFFF;
}

static inline __m128i table8(const uint8_t t[8])
{
    return _mm_loadl_epi64((const __m128i *)t);
}

/* The bytes of in[0..) spread to the 16 lanes set in keep, in order. */
static inline __m128i expand16(const uint8_t *in, unsigned keep)
{
    unsigned lo = keep & 0xFF, hi = keep >> 8;
    __m128i a = _mm_shuffle_epi8(_mm_loadl_epi64((const __m128i *)in), table8(expand8[lo]));
    __m128i b = _mm_shuffle_epi8(
        _mm_loadl_epi64((const __m128i *)(in + __builtin_popcount(lo))), table8(expand8[hi]));
    return _mm_unpacklo_epi64(a, b);
}

size_t kvs_llx_row_refs_avx2(const uint8_t *above, const uint8_t *fl, size_t nfb, size_t fbit,
                             const uint8_t *sym, const uint8_t *sm, size_t avail, size_t n,
                             uint8_t *out, size_t *used)
{
    pthread_once(&tables_once, tables_init);
    const __m256i lo8 = _mm256_set1_epi16(0xFF), m80 = _mm256_set1_epi16(0x80),
                  m7f = _mm256_set1_epi16(0x7F);
    /* lane j's flag bit, to turn 16 bits into a lane mask */
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                          8192, 16384, (short)0x8000);
    size_t c = 0, s = 0;
    /* each step reads 16 bytes of sym and sm at most */
    for (; c + 16 <= n && s + 16 <= avail; c += 16, fbit += 16) {
        unsigned rep = flags16(fl, nfb, fbit), keep = ~rep & 0xFFFF;
        __m256i e = _mm256_cvtepu8_epi16(expand16(sym + s, keep));
        __m256i b = _mm256_cvtepu8_epi16(expand16(sm + s, keep));
        __m256i a = _mm256_loadu_si256((const __m256i *)(above + 2 * c));
        __m256i ex = _mm256_and_si256(_mm256_add_epi16(e, _mm256_srli_epi16(a, 7)), lo8);
        __m256i sign = _mm256_slli_epi16(_mm256_and_si256(b, m80), 8);
        __m256i v = _mm256_or_si256(_mm256_or_si256(sign, _mm256_slli_epi16(ex, 7)),
                                    _mm256_and_si256(b, m7f));
        __m256i r = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)rep), bit), bit);
        _mm256_storeu_si256((__m256i *)(out + 2 * c), _mm256_blendv_epi8(v, a, r));
        s += (size_t)__builtin_popcount(keep);
    }
    *used = s;
    return c;
}

size_t kvs_llx_row_split_avx2(const uint8_t *exp, const uint8_t *above, const uint8_t *sm,
                              const uint8_t *fl, size_t nfb, size_t fbit, size_t n, uint8_t ctx,
                              uint8_t *sym, uint8_t *sym_ctx, uint8_t *sm_out, size_t *used)
{
    pthread_once(&tables_once, tables_init);
    const __m128i cv = _mm_set1_epi8((char)ctx);
    size_t c = 0, s = 0;
    for (; c + 16 <= n; c += 16, fbit += 16) {
        unsigned keep = ~flags16(fl, nfb, fbit) & 0xFFFF, lo = keep & 0xFF, hi = keep >> 8;
        unsigned nlo = (unsigned)__builtin_popcount(lo);
        __m128i d = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)(exp + c)),
                                 _mm_loadu_si128((const __m128i *)(above + c)));
        __m128i b = _mm_loadu_si128((const __m128i *)(sm + c));
        /* whole 8-byte stores: each ends at most 16 bytes past s <= c */
        _mm_storel_epi64((__m128i *)(sym + s), _mm_shuffle_epi8(d, table8(compress8[lo])));
        _mm_storel_epi64((__m128i *)(sym + s + nlo),
                         _mm_shuffle_epi8(_mm_srli_si128(d, 8), table8(compress8[hi])));
        _mm_storel_epi64((__m128i *)(sm_out + s), _mm_shuffle_epi8(b, table8(compress8[lo])));
        _mm_storel_epi64((__m128i *)(sm_out + s + nlo),
                         _mm_shuffle_epi8(_mm_srli_si128(b, 8), table8(compress8[hi])));
        _mm_storeu_si128((__m128i *)(sym_ctx + s), cv);
        s += nlo + (unsigned)__builtin_popcount(hi);
    }
    *used = s;
    return c;
}
