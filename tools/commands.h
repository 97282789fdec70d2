/* commands.h - the kvserde tool's subcommands. Each returns the process
 * exit status: 0 success, 1 failure (message on stderr), 2 usage error. */
#ifndef KVSERDE_TOOL_COMMANDS_H
#define KVSERDE_TOOL_COMMANDS_H

int kvs_cmd_list(int argc, char **argv);
int kvs_cmd_demo(int argc, char **argv);
int kvs_cmd_bench(int argc, char **argv);
int kvs_cmd_encode(int argc, char **argv);
int kvs_cmd_decode(int argc, char **argv);
int kvs_cmd_inspect(int argc, char **argv);
int kvs_cmd_verify(int argc, char **argv);
int kvs_cmd_eval(int argc, char **argv);
int kvs_cmd_calibrate(int argc, char **argv);

#include <stddef.h>

/* Calibrate the transform stage on files and write it to out_path
 * (cmd_calibrate.c); 0, or -1 with the message printed. quiet: no summary. */
int kvs_tool_calibrate(const char *const *files, size_t nfiles, const char *out_path, int quiet);

/* The serde presets the project ships (cmd_eval.c): `kvserde list` shows
 * them, `kvserde eval --sweep` evaluates every one. */
typedef struct kvs_eval_preset {
    const char *name;
    const char *serde; /* the serde's JSON */
    const char *summary;
} kvs_eval_preset;
extern const kvs_eval_preset kvs_eval_presets[];
extern const size_t kvs_eval_npresets;

#endif
