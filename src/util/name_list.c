/* name_list.c - see name_list.h. */
#include "util/name_list.h"

#include <stdio.h>
#include <string.h>

void kvs_names_sort(const char **names, size_t n)
{
    /* insertion sort: the lists are a few dozen names at most */
    for (size_t i = 1; i < n; i++) {
        const char *name = names[i];
        size_t j = i;
        for (; j > 0 && strcmp(names[j - 1], name) > 0; j--) names[j] = names[j - 1];
        names[j] = name;
    }
}

char *kvs_names_join(const char *const *names, size_t n, const char *if_empty,
                     char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    if (n == 0) {
        snprintf(buf, size, "%s", if_empty);
        return buf;
    }
    for (size_t i = 0; i < n && len < size; i++) {
        int w = snprintf(buf + len, size - len, "%s%s", i ? ", " : "", names[i]);
        if (w < 0) break;
        len += (size_t)w;
    }
    return buf;
}
