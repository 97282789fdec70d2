/* kv_values.c - see kv_values.h. */
#include "kv_values.h"

#include <string.h>

void kvs_bench_fill_bf16(uint16_t *v, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t h = (uint32_t)(i + seed) * 2654435761u;
        float f = ((float)(h >> 8) / 16777216.0f) * 8.0f - 4.0f;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        v[i] = (uint16_t)(bits >> 16);
    }
}
