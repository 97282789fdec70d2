/* error.c - status strings and the per-thread last-error message. */
#include <stdarg.h>
#include <stdio.h>

#include "core/error_internal.h"
#include "kvserde/error.h"

/* Thread-local so concurrent callers never see each other's messages. */
static _Thread_local char last_message[KVS_ERROR_MSG_MAX];
static _Thread_local int last_code;
/* Counts kvs_set_error() calls on this thread, so a checked call can tell
 * whether an implementation it called reported its failure. */
static _Thread_local unsigned long error_serial;

const char *kvs_strerror(int status)
{
    switch (status) {
    case KVS_OK: return "ok";
    case KVS_EINVAL: return "invalid argument";
    case KVS_ENOSPC: return "no space";
    case KVS_ENOMEM: return "out of memory";
    case KVS_ECORRUPT: return "corrupt input";
    case KVS_EEXIST: return "already exists";
    case KVS_ENOTFOUND: return "not found";
    case KVS_ECLOSED: return "closed";
    case KVS_EIO: return "I/O error";
    case KVS_EUNSUPPORTED: return "unsupported";
    case KVS_EKEY: return "written for another key";
    case KVS_EAUTH: return "authentication failed";
    default: return "unknown kvserde status";
    }
}

const char *kvs_last_error(void) { return last_message; }

int kvs_last_error_code(void) { return last_code; }

void kvs_clear_error(void)
{
    last_message[0] = '\0';
    last_code = KVS_OK;
}

int kvs_set_error(int status, const char *fmt, ...)
{
    /* Format into a scratch buffer first: callers may pass kvs_last_error()
     * itself as an argument (to prefix context onto an inner message). */
    char buf[KVS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    snprintf(last_message, sizeof last_message, "%s", buf);
    last_code = status;
    error_serial++;
    return status;
}

unsigned long kvs_error_serial(void) { return error_serial; }
