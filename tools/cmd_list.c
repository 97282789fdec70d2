/* kvserde list - what this build offers: serde types (with their kind), L2
 * adapter types and fp8 kernels. */
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "kvserde/kvserde.h"

#define MAX_LISTED 64

int kvs_cmd_list(int argc, char **argv)
{
    if (argc > 1) {
        int help = strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0;
        fprintf(help ? stdout : stderr,
                "usage: kvserde list\n\nLists the registered serde types with their kind "
                "(single: one tensor per blob; multi: a group of\ntensors per blob, such as "
                "K and V), the stage types of pipelines, the L2 adapter types and the fp8\n"
                "kernel variants, and the serde presets `kvserde eval --sweep` runs.\n");
        return help ? 0 : 2;
    }
    const char *names[MAX_LISTED];
    size_t n = kvs_serde_types(names, MAX_LISTED);
    if (n > MAX_LISTED) n = MAX_LISTED;
    int width = 8;
    for (size_t i = 0; i < n; i++)
        if ((int)strlen(names[i]) > width) width = (int)strlen(names[i]);
    printf("kvserde %s\n\nserde types:\n", kvs_version());
    for (size_t i = 0; i < n; i++) {
        kvs_serde_kind kind;
        const char *k = kvs_serde_type_kind(names[i], &kind) == KVS_OK
                            ? kvs_serde_kind_name(kind)
                            : "unknown";
        printf("  %-*s  %s\n", width, names[i], k);
    }

    n = kvs_pipeline_stage_types(names, MAX_LISTED);
    if (n > MAX_LISTED) n = MAX_LISTED;
    printf("\npipeline stages (docs/frame_format.md):\n");
    for (size_t i = 0; i < n; i++) printf("  %s\n", names[i]);

    n = kvs_l2_types(names, MAX_LISTED);
    if (n > MAX_LISTED) n = MAX_LISTED;
    printf("\nL2 adapter types:\n");
    for (size_t i = 0; i < n; i++) printf("  %s\n", names[i]);

    printf("\nserde presets (kvserde eval --sweep):\n");
    for (size_t i = 0; i < kvs_eval_npresets; i++)
        printf("  %-13s %s\n                %s\n", kvs_eval_presets[i].name,
               kvs_eval_presets[i].summary, kvs_eval_presets[i].serde);

    printf("\nfp8 kernels:\n");
    const char *const *isas = kvs_fp8_isa_names();
    const char *active = kvs_fp8_isa();
    for (size_t i = 0; isas[i]; i++)
        printf("  %-10s %s%s\n", isas[i],
               kvs_fp8_isa_available(isas[i]) ? "available" : "not available",
               strcmp(active, isas[i]) == 0 ? " (in use)" : "");
    if (strcmp(active, "none") == 0) {
        /* KVSERDE_ISA asked for a variant that cannot run: say why. */
        uint8_t code;
        float one = 1.0f;
        kvs_fp8_encode(&one, KVS_DTYPE_FLOAT32, &code, KVS_DTYPE_FLOAT8_E4M3FN, 1, 1);
        fprintf(stderr, "kvserde: %s\n", kvs_last_error());
        return 1;
    }
    return 0;
}
