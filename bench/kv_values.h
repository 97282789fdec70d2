/* kv_values.h - plausible bfloat16 KV values for the benchmarks: small
 * magnitudes in [-4, 4), every mantissa bit in use, deterministic per seed.
 * Shared by bench_processor and bench_small (bench/kv_values.c). */
#ifndef KVS_BENCH_KV_VALUES_H
#define KVS_BENCH_KV_VALUES_H

#include <stddef.h>
#include <stdint.h>

void kvs_bench_fill_bf16(uint16_t *v, size_t n, uint32_t seed);

#endif /* KVS_BENCH_KV_VALUES_H */
