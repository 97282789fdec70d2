/* fp8_bench.h - the fp8 conversion benchmark, shared by bench/bench_fp8
 * and `kvserde bench`. */
#ifndef KVSERDE_BENCH_FP8_BENCH_H
#define KVSERDE_BENCH_FP8_BENCH_H

/* Runs the benchmark with command-line options (argv[0] is the program or
 * subcommand name; `--help` lists the options). Prints a table, or one JSON
 * document with --json, on stdout. Returns the exit status: 0 done, 1
 * failure (message on stderr), 2 usage error. */
int kvs_fp8_bench_main(int argc, char **argv);

#endif /* KVSERDE_BENCH_FP8_BENCH_H */
