/* builtins.h - internal: the factories of the serdes built into kvserde,
 * registered by the registry before its first use, in this order:
 *   "fp8"       single  (src/codecs/fp8_serde.c)
 *   "kv_split"  multi   (src/codecs/kv_split.c)
 *   "pipeline"  single  (src/frame/pipeline.c)
 *   "ggml_q8_0", "ggml_q4_0"  single  (src/codecs/ggml_serde.c)
 */
#ifndef KVSERDE_BUILTINS_H
#define KVSERDE_BUILTINS_H

#include "codecs/kv_split.h"
#include "kvserde/registry.h"

int kvs_fp8_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out);
int kvs_pipeline_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out);
int kvs_ggml_q8_0_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out);
int kvs_ggml_q4_0_factory(const json_t *kwargs, void *userdata, kvs_serde_pair *out);

#endif
