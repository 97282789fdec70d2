/* kwargs.c - typed, checked reads of a serde's JSON kwargs, shared by every
 * factory so all of them refuse bad values with the same kind of message. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvserde/error.h"
#include "kvserde/registry.h"
#include "util/name_list.h"

#define MAX_WORKERS_LIMIT 1024u

const char *kvs_json_type_name(const json_t *value)
{
    switch (json_typeof(value)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "real";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

int kvs_json_check_keys(const json_t *obj, const char *component, const char *noun,
                        const char *const *known)
{
    const char *key;
    const json_t *value;
    json_object_foreach((json_t *)obj, key, value) {
        size_t n = 0;
        while (known && known[n] && strcmp(key, known[n]) != 0) n++;
        if (known && known[n]) continue;
        for (n = 0; known && known[n]; n++) {}
        char list[512];
        kvs_names_join(known, n, "(none)", list, sizeof list);
        return kvs_set_error(KVS_EINVAL, "%s: unknown %s '%s'; accepted: %s", component,
                             noun, key, list);
    }
    return KVS_OK;
}

int kvs_kwargs_check_known(const json_t *kwargs, const char *component,
                           const char *const *known)
{
    /* max_workers is the registry's and always accepted, so it ends the list */
    const char *all[64];
    size_t n = 0;
    for (; known && known[n] && n < 62; n++) all[n] = known[n];
    all[n++] = "max_workers";
    all[n] = NULL;
    return kvs_json_check_keys(kwargs, component, "kwarg", all);
}

int kvs_kwargs_get_bool(const json_t *kwargs, const char *component, const char *key,
                        int def, int *out)
{
    const json_t *v = json_object_get(kwargs, key);
    if (v == NULL) {
        *out = def;
        return KVS_OK;
    }
    if (!json_is_boolean(v))
        return kvs_set_error(KVS_EINVAL, "%s: %s must be a JSON boolean, got %s",
                             component, key, kvs_json_type_name(v));
    *out = json_is_true(v);
    return KVS_OK;
}

int kvs_kwargs_get_choice(const json_t *kwargs, const char *component, const char *key,
                          const char *const *choices, int def_index, int *index)
{
    const json_t *v = json_object_get(kwargs, key);
    if (v == NULL) {
        *index = def_index;
        return KVS_OK;
    }
    if (!json_is_string(v))
        return kvs_set_error(KVS_EINVAL, "%s: %s must be a string, got %s", component,
                             key, kvs_json_type_name(v));
    const char *s = json_string_value(v);
    for (int i = 0; choices[i]; i++) {
        if (strcmp(s, choices[i]) == 0) {
            *index = i;
            return KVS_OK;
        }
    }
    size_t n = 0;
    while (choices[n]) n++;
    char list[256];
    kvs_names_join(choices, n, "", list, sizeof list);
    return kvs_set_error(KVS_EINVAL, "%s: %s must be one of %s; got '%s'", component,
                         key, list, s);
}

/* The value as an integer if it is an integer, an integral real, or a string
 * of decimal digits; else 0 (with *text describing what it was). */
static int integral_value(const json_t *v, long long *out, char *text, size_t size)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        snprintf(text, size, "%lld", *out);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        snprintf(text, size, "%g", d);
        if (d != floor(d) || fabs(d) > 1e15) return 0;
        *out = (long long)d;
        return 1;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        snprintf(text, size, "'%s'", s);
        if (*s == '\0' || strspn(s, "0123456789") != strlen(s) || strlen(s) > 15)
            return 0;
        *out = strtoll(s, NULL, 10);
        return 1;
    }
    snprintf(text, size, "%s", kvs_json_type_name(v));
    return 0;
}

int kvs_kwargs_get_positive_int(const json_t *kwargs, const char *component,
                                const char *key, unsigned def, unsigned *out)
{
    const json_t *v = json_object_get(kwargs, key);
    if (v == NULL) {
        *out = def;
        return KVS_OK;
    }
    long long n;
    char text[96];
    if (!integral_value(v, &n, text, sizeof text) || n < 1 || n > MAX_WORKERS_LIMIT)
        return kvs_set_error(KVS_EINVAL, "%s: %s must be an integer from 1 to %u, got %s",
                             component, key, MAX_WORKERS_LIMIT, text);
    *out = (unsigned)n;
    return KVS_OK;
}
