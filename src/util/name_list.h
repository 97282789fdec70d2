/* name_list.h - internal: the "a, b, c" lists that refusal messages give
 * ("unknown serde type 'x'; registered: fp8, kv_split"). */
#ifndef KVS_UTIL_NAME_LIST_H
#define KVS_UTIL_NAME_LIST_H

#include <stddef.h>

/* Sort names[0..n) in place, by strcmp. */
void kvs_names_sort(const char **names, size_t n);

/* Write names[0..n) joined by ", " into buf (NUL-terminated, truncated to
 * size > 0), or `if_empty` when n == 0. Returns buf. */
char *kvs_names_join(const char *const *names, size_t n, const char *if_empty,
                     char *buf, size_t size);

#endif /* KVS_UTIL_NAME_LIST_H */
