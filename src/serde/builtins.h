/* builtins.h - internal: the factories of the serdes built into kvserde,
 * registered by the registry before its first use. */
#ifndef KVSERDE_BUILTINS_H
#define KVSERDE_BUILTINS_H

#include "kvserde/registry.h"

int kvs_fp8_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out);

#endif
