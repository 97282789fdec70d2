/* kvserde/kvserde.h - the whole public API, and the library version.
 *
 * kvserde serializes LLM KV-cache tensors on their way from CPU memory (L1)
 * to durable or remote storage (L2) and back. Start with registry.h (create
 * a serde from JSON) and serde.h (the sync interface). */
#ifndef KVSERDE_H
#define KVSERDE_H

#include "dtype.h"
#include "error.h"
#include "export.h"
#include "fp8.h"
#include "ggml.h"
#include "l2.h"
#include "l2_fs.h"
#include "l2_memory.h"
#include "l2_redis.h"
#include "memobj.h"
#include "multi.h"
#include "multi_processor.h"
#include "processor.h"
#include "registry.h"
#include "pipeline.h"
#include "serde.h"

#define KVS_VERSION_MAJOR 0
#define KVS_VERSION_MINOR 1
#define KVS_VERSION_PATCH 0
#define KVS_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library actually linked ("0.1.0"). */
KVS_API const char *kvs_version(void);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_H */
