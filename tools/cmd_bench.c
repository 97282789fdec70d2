/* kvserde bench - the fp8 conversion benchmark (bench/fp8_bench.c). */
#include "commands.h"
#include "fp8_bench.h"

int kvs_cmd_bench(int argc, char **argv)
{
    return kvs_fp8_bench_main(argc, argv);
}
