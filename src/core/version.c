/* version.c - the linked library's version. */
#include "kvserde/kvserde.h"

const char *kvs_version(void) { return KVS_VERSION_STRING; }
