/* fs_names.h - internal: the object key <-> relative path mapping of the fs
 * adapter (the public entry points are kvs_fs_key_path / kvs_fs_path_key
 * in kvserde/l2_fs.h; the scheme and its proof are in fs_names.c).
 *
 * Pure functions: no file is touched, no global state. */
#ifndef KVS_L2_FS_NAMES_H
#define KVS_L2_FS_NAMES_H

#include <stddef.h>
#include <stdint.h>

#include "kvserde/l2_fs.h"
#include "kvserde/memobj.h"

/* The longest component the scheme writes (well under NAME_MAX = 255). */
#define KVS_FS_COMPONENT_MAX 200

/* Chunk hashes longer than this many bytes put their first
 * 2 * KVS_FS_HASH_SPLIT hex digits in a directory component of their own. */
#define KVS_FS_HASH_SPLIT 64

/* Write the path of `key` (assumed valid: kvs_object_key_validate) into
 * buf, NUL-terminated; return its length (< KVS_FS_KEY_PATH_MAX). */
size_t kvs_fs_encode_key(const kvs_object_key *key, char buf[KVS_FS_KEY_PATH_MAX]);

/* The length of the directory part of an encoded path: the index of its
 * last '/' (every encoded path has one). */
size_t kvs_fs_dir_len(const char *path, size_t len);

/* The adapter's temporary files: TEMP_PREFIX followed by exactly 32
 * lowercase hex digits (the writer's 64-bit random nonce, then a 64-bit
 * sequence number), so that a file is only ever treated as a kvserde
 * leftover if it has exactly this shape. */
#define KVS_FS_TEMP_PREFIX ".tmp-kvs-"
#define KVS_FS_TEMP_HEX 32
#define KVS_FS_TEMP_NAME_LEN (sizeof KVS_FS_TEMP_PREFIX - 1 + KVS_FS_TEMP_HEX)

/* Write the temporary name for (nonce, seq) into buf (at least
 * KVS_FS_TEMP_NAME_LEN + 1 bytes). */
void kvs_fs_temp_name(uint64_t nonce, uint64_t seq, char *buf);

/* 1 if `name` (one component) is exactly a temporary name. */
int kvs_fs_is_temp_name(const char *name);

/* 1 if the directory `rel` (relative to the store's root, components
 * separated by '/', not empty) is one kvs_fs_key_path() can put a key
 * file below: the D components (each non-final one a full cut, at most
 * one '+' in all), then at most one H component after the '+'. The
 * adapter's census enters only such directories, so it never walks into
 * (or removes anything from) a directory kvserde did not make. */
int kvs_fs_is_store_dir(const char *rel);

#endif /* KVS_L2_FS_NAMES_H */
