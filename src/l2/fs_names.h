/* fs_names.h - internal: the object key <-> relative path mapping of the fs
 * adapter (the public entry points are kvs_fs_key_path / kvs_fs_path_key
 * in kvserde/l2_fs.h; the scheme and its proof are in fs_names.c).
 *
 * Pure functions: no file is touched, no global state. */
#ifndef KVS_L2_FS_NAMES_H
#define KVS_L2_FS_NAMES_H

#include <stddef.h>

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

#endif /* KVS_L2_FS_NAMES_H */
