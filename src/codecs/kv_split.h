/* kv_split.h - internal: the registry factory of the kv_split multi-output
 * serde (include/kvserde/multi.h documents the serde itself). */
#ifndef KVSERDE_CODECS_KV_SPLIT_H
#define KVSERDE_CODECS_KV_SPLIT_H

#include <jansson.h>

#include "kvserde/multi.h"

/* Build a kv_split pair from its JSON kwargs (the config without "type";
 * never NULL):
 *   k_dtype   "native" (default) | "float8_e4m3fn" | "float8_e5m2"
 *   v_dtype   "float8_e4m3fn" (default) | "float8_e5m2" | "native"
 *   scale     "per_tensor" (default) | "none" | "per_layer" | "per_layer_head" |
 *             "per_token" (multi.h, kvs_kv_split_scale)
 *   mode      "kv" (default) | "v_only"
 *   saturate  JSON boolean, default true (fp8 overflow policy, as "fp8")
 *   num_kv_heads  integer >= 1 (the heads of per_layer_head); absent = the
 *             layout's head axis
 *   max_workers  accepted; read into out->max_workers (default 1) if the
 *             registry left it in
 * An unknown key or value is refused with KVS_EINVAL and the accepted list
 * ("kv_split: unknown kwarg 'foo'; accepted: k_dtype, v_dtype, scale, mode,
 * saturate, num_kv_heads, max_workers"; "kv_split: mode must be one of kv, v_only; got
 * 'k_only'"). On failure nothing is allocated and *out is zeroed. */
int kvs_kv_split_factory(const json_t *kwargs, void *userdata,
                         struct kvs_multi_serde_pair *out);

#endif /* KVSERDE_CODECS_KV_SPLIT_H */
