/* kvserde/l2_fs.h - the filesystem L2 adapter ("fs"), kvserde's embedded
 * default: one file per key under a directory.
 *
 * The adapter keeps the whole contract of l2.h (three event fds, one task-id
 * counter from 0, pop-once results, lock counts) and runs every store,
 * lookup and load on its own worker threads, never the caller's.
 *
 * On disk
 *   A stored object is a regular file holding exactly the object's first
 *   used_size bytes (kvs_memobj_size): no header, so the file size is the
 *   object size. Integrity checks belong to a serde, not to this adapter.
 *   The file's path below the directory is kvs_fs_key_path(key): every key
 *   field is encoded in it, distinct keys never share a path, and no key can
 *   name anything outside the directory (see kvs_fs_key_path for the scheme).
 *   Names starting with '.' are never object files. The adapter's
 *   temporary files are named ".tmp-kvs-" followed by exactly 32 lowercase
 *   hex digits (a random 64-bit number per adapter, then a counter); the
 *   root also holds the store marker ".kvserde-store" (below).
 *
 * Store marker and adoption
 *   The first open of a directory writes ".kvserde-store", one line
 *   "kvserde fs store, format 1", with the store's file mode. An open finds
 *   either the marker (a marker with other contents is refused with
 *   KVS_EUNSUPPORTED: "fs: '/kv/.kvserde-store' is not a store marker of
 *   format 1 (it should hold one line: 'kvserde fs store, format 1')") or
 *   no marker; then the directory is taken as a store (and marked) only if
 *   every entry of its root is one kvserde makes: a directory named as
 *   kvs_fs_key_path() names the first directory of a key, or a temporary
 *   file. That covers an empty directory and a store written before markers
 *   existed. Anything else is refused with KVS_EEXIST, naming one foreign
 *   entry: "fs: directory '/home/u' is not a kvserde store: no
 *   .kvserde-store marker, and it holds 'notes.txt'; set "adopt": true to
 *   use it". With adopt the directory is used (and marked) as it is;
 *   foreign files in it stay untouched, as below. A directory the adapter
 *   cannot write to is left unmarked (nothing can be stored there).
 *
 * What an open touches
 *   The open walks only the directories the key scheme makes (the chain of
 *   model/salt directories and the long-hash directory, checked name by
 *   name: a directory such as "app" or "m+/sub" is never entered, so an
 *   unreadable foreign directory does not matter); an unreadable directory
 *   of the scheme is refused (KVS_EIO), since its objects could not be
 *   counted. In the directories it walks, it removes only files named
 *   exactly like its temporary files and not locked by a live writer; a
 *   ".tmp-build.lock" or a ".tmp-<16 hex>-<n>" left by a version before
 *   the marker is never removed (delete those by hand when no writer runs).
 *
 * Permissions
 *   Every file the adapter makes (objects, marker) gets exactly `mode`
 *   (default 0600) and every directory it makes (the key directories, and
 *   the store directory and its missing parents when create is on) gets
 *   `mode` plus an execute bit for each read bit (default 0700; 0640 ->
 *   0750, 0660 -> 0770), whatever the process's umask (set with fchmod after
 *   creating; the umask is process-wide and is not changed), keeping a
 *   setgid bit inherited from the parent (so a group-shared store keeps
 *   its group). A directory that already exists keeps its mode. Refused
 *   modes (KVS_EINVAL): above 0777 ("fs: mode 1600 is not a permission mode (0000 to 0777)"), with
 *   execute bits ("fs: mode 0755 has execute bits; give the files' mode,
 *   such as 0640 (directories get the matching execute bits)"), writable by
 *   others ("fs: mode 0666 lets every local user write the store; grant
 *   write to the owner and group only"), or not letting the owner read and
 *   write ("fs: mode 0400 must let the owner read and write (0600)").
 *
 * Store
 *   Each object is written to a new temporary file in the directory that
 *   will hold it (created on demand), flushed with fsync (unless no_fsync),
 *   then renamed over the key's path, and the directory is fsync'ed: a
 *   reader sees the old object or the new one, never a torn one, and a crash
 *   leaves at most a temporary file, which the next adapter opening the
 *   directory removes. Another adapter (in this process or another) opening
 *   the directory never removes a live writer's temporary file: the writer
 *   holds an flock on it from just after creating it until the rename, and
 *   checks once locked that the name still leads to its file (an opener
 *   may have removed it in between; the writer then starts over under a new
 *   name); the opener removes a file only if it gets the lock and the name
 *   still leads to the file it locked. On any failure the temporary
 *   file is removed and the task fails with KVS_EIO and a message naming
 *   the key, the system call, the reason and the path:
 *       "fs: store of key 0: write: No space left on device (/kv/m+/00ff,0,0)"
 *   A task's keys are split into up to `workers` contiguous runs stored in
 *   parallel; each run goes in key order and stops at its first failing key
 *   (the keys before it in the run stay stored). The task's error is the
 *   failing key with the lowest index. Storing a key that is present
 *   replaces it and keeps its locks.
 *
 * Capacity
 *   If capacity_bytes is not 0, the sum of the stored files' sizes may not
 *   pass it: a store that would fails with KVS_ENOSPC ("fs: capacity
 *   exceeded storing key 1: 600 bytes would make 1100 bytes used, capacity
 *   1000 (/kv/...)"). Nothing is evicted. The usage is counted when the
 *   adapter opens the directory (a scan of the object files) and kept up
 *   to date by this adapter's stores and deletes; changes made by other
 *   processes are seen at the next open.
 *
 * Cost of an open
 *   The census reads every directory of the store and stats every object
 *   file, with or without capacity_bytes (status and usage report the
 *   counts), so an open costs time in proportion to the objects stored:
 *   about what reading the directories and stat-ing every file costs,
 *   measured at 124 ms (best of 15; 4 us per object) for 30,483 objects
 *   with their metadata cached on a loaded 2-core VM, more when it has to
 *   come from disk (docs/performance.md). Open the adapter once per
 *   process, not per request.
 *
 * Lookup-and-lock
 *   A key is found if its path is a regular file. A miss is not an error;
 *   a path that is something else (KVS_ECORRUPT: "fs: lookup of key 0: not
 *   a regular file (/kv/...)") or a failing stat other than "no such file"
 *   (KVS_EIO) is a miss whose reason is the result's status and message.
 *   Lock counts live in this adapter (a second adapter on the same
 *   directory does not see them).
 *
 * Load
 *   The file is opened and its size taken first. A missing key
 *   (KVS_ENOTFOUND: "fs: load of key 2: not found (/kv/...)"), a path that
 *   is not a regular file (KVS_ECORRUPT), a file that is not exactly a
 *   KV-shaped destination's layout size (KVS_ECORRUPT: "fs: load of key 0:
 *   stored object is 16384 bytes, destination layout needs 12288 (/kv/...)";
 *   see kvserde/l2.h), a file larger than the
 *   destination's capacity (KVS_ENOSPC: "fs: load of key 0: stored object is
 *   4096 bytes, destination holds 1024 (/kv/...)"), a file that shrinks or
 *   grows while it is read (KVS_ECORRUPT) and a failing read (KVS_EIO)
 *   clear only that key's bit; the lowest-index such error is the result's
 *   status and message. Since there is no header, a file truncated by
 *   someone else between two loads loads as a shorter object into a byte
 *   buffer (the serde wrapper's temps), where the serde detects it; a
 *   KV-shaped destination refuses it as above.
 *
 * Unlock, delete, object sizes, usage, status
 *   Synchronous. Delete removes unlocked keys' files (a locked key is kept
 *   and reported not deleted); a file that cannot be removed is reported
 *   not deleted and the call returns KVS_EIO after trying the other keys.
 *   Object sizes are stat() sizes (-1 for a missing key or a path that is
 *   not a regular file). After close, delete and object sizes are refused
 *   with KVS_ECLOSED (the directory is released); unlock, usage and status
 *   keep working. Status:
 *       {"type": "fs", "path": P, "is_healthy": true, "keys": N,
 *        "bytes_used": B, "capacity_bytes": C, "locked_keys": L,
 *        "workers": W, "fsync": true}
 *   is_healthy is false once closed or if the directory has been removed.
 *
 * JSON spec (kvs_l2_create):
 *     {"type": "fs", "path": "/var/cache/kv", "fsync": true,
 *      "capacity_bytes": 0, "workers": 2, "create": true, "adopt": false,
 *      "mode": "0600"}
 *   path is required (a non-empty string); fsync and create are booleans
 *   (default true; create makes the directory and its parents if missing);
 *   adopt a boolean (default false: see "Store marker and adoption"); mode
 *   a string of one to four octal digits ("0640", "640"; default "0600"; an
 *   integer is refused, since JSON has no octal: "fs: mode must be a
 *   string of octal digits such as "0640", got integer");
 *   capacity_bytes an integer >= 0 (0 or absent: unbounded); workers an
 *   integer from 1 to 1024 (default 2; 2.0 and "2" are accepted as for a
 *   serde's max_workers). Any other key is refused: "fs: unknown key 'foo';
 *   accepted: path, fsync, capacity_bytes, workers, create, adopt, mode".
 *
 * Requirements: a POSIX filesystem with case-sensitive names (the adapter
 * refuses a directory where "A" and "a" are the same name, since model
 * names differing only in case would collide) and atomic rename.
 */
#ifndef KVSERDE_L2_FS_H
#define KVSERDE_L2_FS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "export.h"
#include "l2.h"
#include "memobj.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVS_FS_DEFAULT_WORKERS 2
#define KVS_FS_MAX_WORKERS 1024
#define KVS_FS_DEFAULT_MODE 0600 /* objects; directories 0700 */

/* Bytes (NUL included) that always hold kvs_fs_key_path() of a valid key.
 * The longest path is 1455 characters (a 255-byte model name and a
 * 128-byte cache salt of escaped bytes, a 128-byte hash, the extreme rank
 * and group ids). */
#define KVS_FS_KEY_PATH_MAX 1536

/* Options of kvs_fs_adapter_create(). A zero-initialized struct with a path
 * is the default configuration (fsync on, directory created, unbounded, two
 * workers): the flags are negative so that forgetting one is safe. */
typedef struct kvs_fs_options {
    const char *path;        /* the directory (required, copied) */
    int no_fsync;            /* 1: skip fsync of files and directories */
    int no_create;           /* 1: refuse a missing directory instead of making it */
    uint64_t capacity_bytes; /* 0 = unbounded */
    unsigned workers;        /* worker threads; 0 = KVS_FS_DEFAULT_WORKERS */
    int adopt;               /* 1: accept a non-empty directory with no store marker */
    unsigned mode;           /* files' permission bits; 0 = KVS_FS_DEFAULT_MODE */
} kvs_fs_options;

/* Open (and unless no_create, make) the directory and create an adapter on
 * it (ops name "fs"). Opening checks or writes the store marker, removes
 * leftover temporary files and counts the objects already stored (see
 * above). Refused: KVS_EINVAL for opts or out NULL, a missing or empty path
 * ("fs: path is empty"), workers above KVS_FS_MAX_WORKERS ("fs: workers
 * 2000 out of range [1, 1024]"), a bad mode (see Permissions);
 * KVS_ENOTFOUND for a missing directory with no_create ("fs: cannot open
 * directory '/x': No such file or directory"); KVS_EEXIST for a directory
 * that is not a store, without adopt; KVS_EIO when the directory cannot be
 * made or opened, is not a directory, the marker cannot be read or
 * written, or an eventfd or thread cannot be created; KVS_EUNSUPPORTED for
 * a case-insensitive directory or a marker of another format; KVS_ENOMEM.
 * Free with kvs_l2_destroy(). */
KVS_API int kvs_fs_adapter_create(const kvs_fs_options *opts, kvs_l2_adapter **out);

/* The path, relative to the adapter's directory, of the file that holds
 * `key`, written NUL-terminated into buf. Pure: it touches no file.
 *
 * Scheme: <D>/<F> where
 *   D = escape(model_name) "+" escape(cache_salt), cut into directory
 *       components of at most 200 bytes;
 *   F = hex(chunk_hash) "," kv_rank "," object_group_id
 *       (lowercase hex, canonical decimal: "-" only for a negative rank),
 *       with, for a hash over 64 bytes, its first 128 hex digits and a ","
 *       as one more directory component before F.
 * escape() keeps A-Z a-z 0-9 '_' '-' and '.' as they are and writes any
 * other byte as '%' and two uppercase hex digits ('/' is "%2F", '%' is
 * "%25"); a '.' that would start a component is escaped too, and no code
 * is cut between two components. Examples:
 *     "meta-llama/Llama-3-8B", salt "", hash 00 00 00 07, rank 0, group 0
 *         -> "meta-llama%2FLlama-3-8B+/00000007,0,0"
 *     "..", salt "s", hash ab, rank -1, group 3  -> "%2E.+s/ab,-1,3"
 * Every component is 1 to 200 bytes of printable ASCII without '/', and
 * none starts with '.', so none is "." or "..", none is a ".tmp-" file,
 * and every path stays inside the directory. Distinct keys give distinct
 * paths, and no key's file is a directory of another key's path
 * (kvs_fs_path_key() inverts this function).
 *
 * Refused: KVS_EINVAL for NULL arguments or an invalid key (as
 * kvs_object_key_validate); KVS_ENOSPC if size is too small ("fs: key path
 * needs 40 bytes, buffer holds 16"); buf is then "" if size > 0. */
KVS_API int kvs_fs_key_path(const kvs_object_key *key, char *buf, size_t size);

/* The inverse: the key whose kvs_fs_key_path() is exactly `path`. Anything
 * else is refused with KVS_EINVAL ("fs: not a key path: 'x'"), so a
 * directory listing can be mapped back to keys and odd files skipped. */
KVS_API int kvs_fs_path_key(const char *path, kvs_object_key *out);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_L2_FS_H */
