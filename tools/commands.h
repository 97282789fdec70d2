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

#endif
