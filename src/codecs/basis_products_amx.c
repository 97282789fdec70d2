/* basis_products_amx.c - the AMX-BF16 tile kernel of the transform's basis
 * products (basis_products.h): C = A x B with A bfloat16 rows, B a
 * tile-packed bfloat16 matrix, C float32, every product exact and summed in
 * float32 by TDPBF16PS. Compiled with -mamx-tile -mamx-bf16 (CMakeLists.txt:
 * *_amx.c); called only where the CPU has AMX and the process holds the
 * permission to use its tile state (basis_products.c). */
#include <immintrin.h>
#include <stdint.h>

#include "codecs/basis_products_kernel.h"

/* The configuration lives in static storage: gcc 12's _tile_loadconfig
 * tells the compiler it reads only a pointer's worth of the 64 bytes, so
 * a configuration built on the stack can have its stores optimized away
 * (ldtilecfg then faults on a zero palette). */
static const struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config = {
    .palette = 1,
    /* 16 floats, 32 bfloat16 or 16 bfloat16 pairs a row */
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

void kvs_basis_amx_config(void)
{
    _tile_loadconfig(&tile_config);
}

/* C's column tiles nt, nt + 1 += A's rows (tiles 4, 5) x one packed part. */
#define FOUR_PRODUCTS(bp, nt_stride)                                                        \
    do {                                                                                    \
        _tile_loadd(6, (bp), 64);                                                           \
        _tile_loadd(7, (bp) + (nt_stride), 64);                                             \
        _tile_dpbf16ps(0, 4, 6);                                                            \
        _tile_dpbf16ps(1, 4, 7);                                                            \
        _tile_dpbf16ps(2, 5, 6);                                                            \
        _tile_dpbf16ps(3, 5, 7);                                                            \
    } while (0)

/* Tiles 0-3 accumulate a 32 x 32 block of C (two row tiles x two column
 * tiles), 4-5 hold A's two row tiles, 6-7 B's two column tiles: each tile
 * loaded feeds two products, the most eight tile registers allow. */
void kvs_basis_amx_gemm(const kvs_basis_gemm *g)
{
    kvs_basis_amx_config();
    size_t lda_bytes = g->lda * 2, ldc_bytes = g->ldc * 4, nt_stride = g->nt_stride;
    for (size_t m0 = 0; m0 < g->m; m0 += 32) {
        const uint16_t *arow = g->a + m0 * g->lda;
        const uint16_t *arow_lo = g->a_lo ? g->a_lo + m0 * g->lda : NULL;
        const uint8_t *flags = g->a_lo_flags ? g->a_lo_flags + (m0 / 32) * g->kblocks : NULL;
        for (size_t nt = 0; nt < g->ntiles; nt += 2) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (size_t kb = 0; kb < g->kblocks; kb++) {
                size_t off = nt * nt_stride + kb * 512;
                _tile_loadd(4, arow + kb * 32, lda_bytes);
                _tile_loadd(5, arow + 16 * g->lda + kb * 32, lda_bytes);
                for (size_t p = 0; p < g->nparts; p++) FOUR_PRODUCTS(g->b[p] + off, nt_stride);
                /* A's low parts only where a row block of this column
                 * block has any (decode: coefficients beyond +-256) */
                if (arow_lo && flags[kb]) {
                    _tile_loadd(4, arow_lo + kb * 32, lda_bytes);
                    _tile_loadd(5, arow_lo + 16 * g->lda + kb * 32, lda_bytes);
                    for (size_t p = 0; p < g->nparts; p++)
                        FOUR_PRODUCTS(g->b[p] + off, nt_stride);
                }
            }
            float *c = g->c + m0 * g->ldc + nt * 16;
            _tile_stored(0, c, ldc_bytes);
            _tile_stored(1, c + 16, ldc_bytes);
            _tile_stored(2, c + 16 * g->ldc, ldc_bytes);
            _tile_stored(3, c + 16 * g->ldc + 16, ldc_bytes);
        }
    }
    _tile_release();
}
