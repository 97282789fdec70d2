/* coef_coder.h - internal: the entropy coder of the transform stage's
 * quantized coefficients in payload version 1 (stage_transform.c,
 * docs/frame_format.md "The transform payload"). Writers write version 2
 * (coef_rans.h) since 2026-12-02; the decoder stays so that version 1
 * payloads still decode, the encoder for the tests that make them.
 *
 * One stream holds a [rows x cols] matrix of integer coefficients in row
 * order (a row is a token, a column a component of the transform's basis).
 * Each column has a context class from 0 to KVS_COEF_CLASSES - 1 (the
 * encoder picks it from the column's spread and stores it beside the
 * stream); the columns of one class share adaptive probabilities, split
 * further by the magnitude of the same column one row before (0, 1, 2, 3 or
 * more), so the statistics are per component class and neighbourhood,
 * learnt from the stream itself: no table is stored. The coder is an adaptive binary range
 * coder (LZMA's range coder: carry propagation through a cached byte;
 * 15-bit probabilities whose rate slows from 1/4 to 1/128 as a context
 * learns). A coefficient q is coded as: q == 0 (adaptive),
 * the sign (equiprobable), the bit length e of |q| (0 to 15, unary,
 * adaptive), the two bits below the leading one (adaptive, as a tree), the
 * other e - 3 bits (equiprobable). |q| is at most KVS_COEF_MAX.
 *
 * Hostile input: the decoder reads nothing outside in[0..n), refuses a
 * stream whose first byte is not 0, whose code does not start below the
 * range, that ends before the last coefficient or that has bytes left after
 * it (KVS_ECORRUPT, with the numbers). Decoding writes only `out`. */
#ifndef KVSERDE_CODECS_COEF_CODER_H
#define KVSERDE_CODECS_COEF_CODER_H

#include <stddef.h>
#include <stdint.h>

#define KVS_COEF_CLASSES 32
#define KVS_COEF_MAX 65535

/* Encode q[rows x cols] (row stride cols) with column classes cls[cols]
 * into out[0..cap). KVS_OK with *n the bytes written; KVS_ENOSPC (no
 * message: the caller falls back to raw) when cap is too small. Values are
 * clamped to [-KVS_COEF_MAX, KVS_COEF_MAX]. */
int kvs_coef_encode(const int32_t *q, size_t rows, size_t cols, const uint8_t *cls,
                    uint8_t *out, size_t cap, size_t *n);

/* Decode exactly rows x cols coefficients from in[0..n) into out (as
 * floats, ready for the basis product). `what` names the stream in
 * messages ("transform: V layer 3"). */
int kvs_coef_decode(const uint8_t *in, size_t n, size_t rows, size_t cols, const uint8_t *cls,
                    float *out, const char *what);

#endif /* KVSERDE_CODECS_COEF_CODER_H */
