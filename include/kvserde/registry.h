/* kvserde/registry.h - create serdes by name from JSON configs (upstream
 * serde/factory.py).
 *
 * A config is a JSON object {"type": "<name>", ...kwargs}, given as text or
 * as an already-parsed jansson object (json_t). The registry is
 * process-global and thread-safe; the built-in serdes ("fp8", then
 * "kv_split") are registered once, before first use, without the caller
 * doing anything.
 *
 * Two kinds of serde share one name space:
 *   single  one tensor in, one blob out (serde.h): kvs_serde_register,
 *           kvs_serde_create_pair / kvs_serde_create -> kvs_processor
 *   multi   a group of optional tensors in, one blob out (multi.h):
 *           kvs_multi_serde_register, kvs_multi_serde_create_pair /
 *           kvs_multi_serde_create -> kvs_multi_processor
 * A name is registered once, with its kind; creating it through the other
 * kind's functions is refused with a message that says which kind it is,
 * in words a person at a shell can act on, naming no C function ("serde
 * type 'kv_split' is multi-output (a group of tensors per blob, such as K
 * and V); create it with the multi-output API").
 *
 * Two kwargs belong to the registry, not to a serde: "type" (which factory)
 * and "max_workers" (the async processor's worker threads: an integer from
 * 1 to 1024, default 1; an integral float such as 2.0 and a digit string such as "2"
 * are accepted; 0, -1, 2.5 and "two" are refused). A factory sees the other
 * kwargs only.
 *
 *     kvs_serde_pair pair;
 *     if (kvs_serde_create_pair("{\"type\": \"fp8\", \"fp8_dtype\": \"float8_e5m2\"}",
 *                               &pair) != KVS_OK)
 *         fprintf(stderr, "%s\n", kvs_last_error());
 */
#ifndef KVSERDE_REGISTRY_H
#define KVSERDE_REGISTRY_H

#include <jansson.h>
#include <stddef.h>

#include "export.h"
#include "multi.h"
#include "multi_processor.h"
#include "processor.h"
#include "serde.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a factory builds: the sync halves of one serde, and the worker count
 * the async processor should use (filled in by the registry). */
typedef struct kvs_serde_pair {
    kvs_serializer *serializer;
    kvs_deserializer *deserializer;
    unsigned max_workers;
} kvs_serde_pair;

/* A factory: read `kwargs` (a JSON object: the config without "type" and
 * "max_workers"; never NULL) and set out->serializer and out->deserializer
 * (both). On failure return a KVS_E* code with kvs_set_error() and leave
 * nothing allocated. `userdata` is what was given to kvs_serde_register(). */
typedef int (*kvs_serde_factory_fn)(const json_t *kwargs, void *userdata,
                                    kvs_serde_pair *out);

/* Register a factory under `name` (1 to 63 characters). A name already
 * registered is refused with KVS_EEXIST: "serde type already registered:
 * 'fp8'". There is no unregister: names live for the process. */
KVS_API int kvs_serde_register(const char *name, kvs_serde_factory_fn factory,
                               void *userdata);

/* The registered names of both kinds, in registration order: writes up to
 * `cap` pointers (static strings, valid for the process) into names and
 * returns the total count (call with cap 0 to size the array). */
KVS_API size_t kvs_serde_types(const char **names, size_t cap);

/* What a registered serde takes and gives. The values are part of the ABI. */
typedef enum kvs_serde_kind {
    KVS_SERDE_SINGLE = 1, /* kvs_serializer / kvs_deserializer (serde.h) */
    KVS_SERDE_MULTI = 2,  /* kvs_multi_serializer / _deserializer (multi.h) */
} kvs_serde_kind;

/* The kind of the serde registered as `name`. KVS_EINVAL for NULL
 * arguments, or for a name nobody registered (the message lists the
 * registered ones: "unknown serde type 'x'; registered: fp8, kv_split"). */
KVS_API int kvs_serde_type_kind(const char *name, kvs_serde_kind *out);

/* "single", "multi", or "unknown" for any other value. */
KVS_API const char *kvs_serde_kind_name(kvs_serde_kind kind);

/* Build the sync pair from a config given as JSON text / as a parsed object.
 * Refused with KVS_EINVAL and a message of its own for: malformed JSON
 * ("serde config: invalid JSON at line 1, column 9: ..."), a config that is
 * not an object ("serde config: must be a JSON object, got array"), a
 * missing type ("serde config: missing 'type' field"), a non-string type
 * ("serde config: 'type' must be a string, got integer"), an unknown type
 * ("unknown serde type 'x'; registered: fp8, kv_split"), a multi-output type
 * ("serde type 'kv_split' is multi-output (a group of tensors per blob,
 * such as K and V); create it with the multi-output API"),
 * a bad max_workers ("serde config: max_workers must be an integer from 1
 * to 1024, got 0"), and whatever the factory refuses. On failure *out is
 * zeroed. */
KVS_API int kvs_serde_create_pair(const char *json_text, kvs_serde_pair *out);
KVS_API int kvs_serde_create_pair_json(const json_t *config, kvs_serde_pair *out);

/* Destroy both halves and zero the pair. NULL is a no-op. */
KVS_API void kvs_serde_pair_destroy(kvs_serde_pair *pair);

/* Upstream create_serde_processor: build the configured serde and wrap it in
 * a new, independent async processor (kvs_async_processor_create) with the
 * config's max_workers. Refused as kvs_serde_create_pair() (a multi-output
 * type: "serde type 'kv_split' is multi-output (a group of tensors per
 * blob, such as K and V); create it with the multi-output API"),
 * plus the processor's own failures (KVS_EIO: no eventfd or thread). *out is
 * untouched on failure; nothing leaks. Free with kvs_processor_destroy(). */
KVS_API int kvs_serde_create(const char *json_text, kvs_processor **out);
KVS_API int kvs_serde_create_json(const json_t *config, kvs_processor **out);

/* ----- Multi-output serdes (multi.h, multi_processor.h) --------------- */

/* A multi factory: as kvs_serde_factory_fn, setting out->serializer and
 * out->deserializer (both, with the same group_size). */
typedef int (*kvs_multi_serde_factory_fn)(const json_t *kwargs, void *userdata,
                                          kvs_multi_serde_pair *out);

/* Register a multi-output factory under `name`, in the same name space as
 * kvs_serde_register (same rules and refusals: "serde type already
 * registered: 'kv_split'"). */
KVS_API int kvs_multi_serde_register(const char *name,
                                     kvs_multi_serde_factory_fn factory,
                                     void *userdata);

/* Build the sync halves of a multi-output serde from a config: the config
 * rules of kvs_serde_create_pair ("type" and "max_workers" belong to the
 * registry, the factory sees the rest), and a single-output type refused
 * ("serde type 'fp8' is single-output (one tensor per blob); create it
 * with the single-output API"). A factory whose halves disagree on
 * group_size is refused. On failure *out is
 * zeroed. Free with kvs_multi_serde_pair_destroy(). */
KVS_API int kvs_multi_serde_create_pair(const char *json_text,
                                        kvs_multi_serde_pair *out);
KVS_API int kvs_multi_serde_create_pair_json(const json_t *config,
                                             kvs_multi_serde_pair *out);

/* The multi counterpart of kvs_serde_create: the configured multi serde in
 * a new, independent kvs_async_multi_processor_create processor with the
 * config's max_workers, e.g.
 *     {"type": "kv_split", "v_dtype": "float8_e5m2", "max_workers": 2}
 * A single-output type is refused ("serde type 'fp8' is single-output (one
 * tensor per blob); create it with the single-output API"). *out is untouched on failure; nothing leaks. Free
 * with kvs_multi_processor_destroy(). */
KVS_API int kvs_multi_serde_create(const char *json_text, kvs_multi_processor **out);
KVS_API int kvs_multi_serde_create_json(const json_t *config,
                                        kvs_multi_processor **out);

/* ----- Helpers for factories reading their kwargs --------------------- */

/* Refuse any key of the JSON object `obj` not in the NULL-terminated list
 * `known`, naming what the keys are (`noun`) and the accepted ones:
 * "fs: unknown key 'paht'; accepted: path, fsync, ...". For adapter specs
 * and any other JSON options. */
KVS_API int kvs_json_check_keys(const json_t *obj, const char *component,
                                const char *noun, const char *const *known);

/* Refuse any key of `kwargs` not in the NULL-terminated list `known`:
 * "fp8: unknown kwarg 'foo'; accepted: fp8_dtype, saturate, max_workers"
 * (max_workers is always accepted, so it always ends the list). */
KVS_API int kvs_kwargs_check_known(const json_t *kwargs, const char *component,
                                   const char *const *known);

/* A JSON boolean under `key`, or `def` if absent. Anything else is refused:
 * "fp8: saturate must be a JSON boolean, got string". */
KVS_API int kvs_kwargs_get_bool(const json_t *kwargs, const char *component,
                                const char *key, int def, int *out);

/* A string under `key` that must be one of the NULL-terminated `choices`;
 * sets *index to its position, or to `def_index` if absent. Refused:
 * "fp8: fp8_dtype must be one of float8_e4m3fn, float8_e5m2; got 'float16'"
 * (or "... must be a string, got integer"). */
KVS_API int kvs_kwargs_get_choice(const json_t *kwargs, const char *component,
                                  const char *key, const char *const *choices,
                                  int def_index, int *index);

/* An integer from 1 to 1024 under `key`, or `def` if absent, accepting an
 * integral float (2.0) and a string of decimal digits ("2") as upstream's
 * int() does. Refused: "serde config: max_workers must be an integer from 1
 * to 1024, got 2.5" (strings are quoted in the message: got 'two'). */
KVS_API int kvs_kwargs_get_positive_int(const json_t *kwargs, const char *component,
                                        const char *key, unsigned def, unsigned *out);

/* The JSON type name of a value: "object", "array", "string", "integer",
 * "real", "boolean", "null". */
KVS_API const char *kvs_json_type_name(const json_t *value);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_REGISTRY_H */
