/* frames.c - the frame deserializer the tool's commands share (frames.h). */
#include "frames.h"

#include <stdio.h>

int kvs_tool_frame_deserializer(char *const *key_files, size_t nkeys, const char *transform,
                                kvs_serde_pair *pair)
{
    /* Only the deserializer's key files and transform matter: it reads every
     * frame's own stage chain. */
    json_t *stages = transform ? json_pack("[{s:s,s:s}]", "type", "transform", "path", transform)
                               : json_pack("[{s:s}]", "type", "bytes");
    if (stages == NULL) return kvs_set_error(KVS_ENOMEM, "out of memory");
    if (nkeys) {
        json_t *files = json_array();
        for (size_t i = 0; i < nkeys; i++) json_array_append_new(files, json_string(key_files[i]));
        json_array_append_new(stages, json_pack("{s:s,s:o}", "type", "aes_gcm", "key_files", files));
    }
    json_t *config = json_pack("{s:s,s:o}", "type", "pipeline", "stages", stages);
    if (config == NULL) return kvs_set_error(KVS_ENOMEM, "out of memory");
    int rc = kvs_serde_create_pair_json(config, pair);
    json_decref(config);
    return rc;
}

int kvs_tool_add_key_file(const char *cmd, char **key_files, size_t *nkeys, char *path)
{
    if (*nkeys == KVS_TOOL_MAX_KEY_FILES) {
        fprintf(stderr, "kvserde %s: at most %d --key-file\n", cmd, KVS_TOOL_MAX_KEY_FILES);
        return -1;
    }
    key_files[(*nkeys)++] = path;
    return 0;
}
