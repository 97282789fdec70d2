/* fp8_avx512fp16.c - the avx512fp16 fp8 variant: fp8_avx512.c compiled a
 * second time with AVX512-FP16 (Sapphire Rapids, Zen 5 and later), which
 * gives its float16 -> e4m3fn encoder float16 arithmetic (f16_e4m3fn_core_fp16
 * there); every other kernel is the avx512 one. Same bytes as the scalar
 * variant, like every variant. The dispatcher checks AVX512-FP16 on top of
 * everything the avx512 variant needs. */
#include "codecs/fp8_avx512.c"
