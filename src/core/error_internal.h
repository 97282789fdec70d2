/* error_internal.h - internal: what the library's own checked calls need
 * from the error module beyond the public error.h. */
#ifndef KVSERDE_ERROR_INTERNAL_H
#define KVSERDE_ERROR_INTERNAL_H

/* The number of kvs_set_error() calls made on this thread so far: compare
 * before and after a call to learn whether it recorded a message. */
unsigned long kvs_error_serial(void);

#endif
