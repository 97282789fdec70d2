/* frames.h - what the tool's commands share about framed blobs (the
 * pipeline serde's frames, docs/frame_format.md): the deserializer that
 * reads any frame, carrying only the --key-file keys. */
#ifndef KVSERDE_TOOL_FRAMES_H
#define KVSERDE_TOOL_FRAMES_H

#include <stddef.h>

#include "kvserde/kvserde.h"

/* How many --key-file options a command takes. */
#define KVS_TOOL_MAX_KEY_FILES 16

/* A pipeline deserializer for frames of any stage chain: a frame rebuilds
 * its own chain, so the config matters only for its aes_gcm key files
 * (nkeys of them; none is fine: such a deserializer reads every frame but
 * an encrypted one) and its transform file (`transform`, NULL for none:
 * frames of the transform stage are then refused). KVS_OK, or the
 * registry's code and message (a key file that cannot be read, or is open
 * to group or others; a transform file that is not one). */
int kvs_tool_frame_deserializer(char *const *key_files, size_t nkeys, const char *transform,
                                kvs_serde_pair *pair);

/* Collect one --key-file value: 0, or -1 after printing
 * "kvserde CMD: at most 16 --key-file" to stderr. */
int kvs_tool_add_key_file(const char *cmd, char **key_files, size_t *nkeys, char *path);

#endif
