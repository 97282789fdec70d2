/* kvserde/error.h - status codes and error messages.
 *
 * Every public kvserde function that can fail returns an int: KVS_OK (0) on
 * success or one of the negative KVS_E* codes below. On failure it also
 * records a message for the calling thread that names the component and the
 * numbers involved, e.g. "fp8: destination too small: 1024 bytes, need 4096".
 * Read it with kvs_last_error(). No kvserde function prints, aborts or exits
 * because of bad input.
 */
#ifndef KVSERDE_ERROR_H
#define KVSERDE_ERROR_H

#include "export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. The numeric values are part of the ABI and never change. */
enum kvs_status {
    KVS_OK = 0,
    KVS_EINVAL = -1,       /* invalid argument or configuration */
    KVS_ENOSPC = -2,       /* destination buffer or store too small */
    KVS_ENOMEM = -3,       /* memory allocation failed */
    KVS_ECORRUPT = -4,     /* input bytes are truncated or malformed */
    KVS_EEXIST = -5,       /* already exists (e.g. duplicate registration) */
    KVS_ENOTFOUND = -6,    /* no such entry */
    KVS_ECLOSED = -7,      /* object already closed */
    KVS_EIO = -8,          /* an operating-system call failed */
    KVS_EUNSUPPORTED = -9, /* valid request this build or CPU cannot serve;
                              also a blob of an unknown format version or stage */
    KVS_EKEY = -10,        /* a framed blob written for another object key */
    KVS_EAUTH = -11,       /* authentication failed: wrong encryption key, or
                              ciphertext, header or key tampered with */
};

/* The fixed, static description of a status code ("invalid argument").
 * Unknown codes give "unknown kvserde status". Never returns NULL. */
KVS_API const char *kvs_strerror(int status);

/* The message recorded by the calling thread's most recent failing kvserde
 * call (thread-local; at most KVS_ERROR_MSG_MAX - 1 characters). Successful
 * calls do not clear it. Returns "" if nothing has failed on this thread.
 * The pointer stays valid until the thread's next kvserde call. */
KVS_API const char *kvs_last_error(void);

/* The status code that goes with kvs_last_error() (KVS_OK if none). */
KVS_API int kvs_last_error_code(void);

/* Forget the calling thread's last error. */
KVS_API void kvs_clear_error(void);

/* Record a failure for the calling thread and return `status`, so
 * implementations of kvserde interfaces (serdes, adapters) can report errors
 * the same way the library does:
 *     return kvs_set_error(KVS_EINVAL, "myserde: bad level %d", level);
 * The message is formatted like printf and truncated to fit. */
KVS_API int kvs_set_error(int status, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define KVS_ERROR_MSG_MAX 512

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_ERROR_H */
