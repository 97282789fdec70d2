/* bench_fp8.c - fp8 conversion throughput against memcpy; see
 * bench/fp8_bench.c and docs/performance.md. Reports; asserts nothing. */
#include "fp8_bench.h"

int main(int argc, char **argv)
{
    return kvs_fp8_bench_main(argc, argv);
}
