/* kvserde - the command-line tool: dispatches to one subcommand. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "kvserde/kvserde.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"demo", kvs_cmd_demo, "store synthetic KV chunks through a serde into L2 and back"},
    {"list", kvs_cmd_list, "list the registered serdes and the fp8 kernel in use"},
    {"encode", kvs_cmd_encode, "encode the float tensors of a safetensors file with a serde"},
    {"decode", kvs_cmd_decode, "decode a file written by `kvserde encode`"},
    {"bench", kvs_cmd_bench, "measure fp8 conversion speed against memcpy (--help)"},
    {"inspect", kvs_cmd_inspect, "list a safetensors file's tensors; --compare for accuracy"},
    {"calibrate", kvs_cmd_calibrate, "estimate the transform stage's basis from sample KV chunks"},
    {"eval", kvs_cmd_eval, "size, speed and fidelity of serdes on KV safetensors files"},
    {"verify", kvs_cmd_verify, "scrub a filesystem store: count ok, damaged and foreign objects"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: kvserde <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\n`kvserde <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kvserde %s\n", kvs_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvserde: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
