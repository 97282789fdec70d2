/* safetensors.c - read, validate and write safetensors files (see
 * safetensors.h for the rules), and kvserde's conventions inside them. */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "codecs/half.h"

/* ------------------------------------------------------------------------
 * dtypes
 * --------------------------------------------------------------------- */

static const struct {
    const char *name;
    unsigned bits;
} st_dtypes[KVS_ST_NDTYPES] = {
    [KVS_ST_BOOL] = {"BOOL", 8},       [KVS_ST_F4] = {"F4", 4},
    [KVS_ST_F6_E2M3] = {"F6_E2M3", 6}, [KVS_ST_F6_E3M2] = {"F6_E3M2", 6},
    [KVS_ST_U8] = {"U8", 8},           [KVS_ST_I8] = {"I8", 8},
    [KVS_ST_F8_E5M2] = {"F8_E5M2", 8}, [KVS_ST_F8_E4M3] = {"F8_E4M3", 8},
    [KVS_ST_F8_E8M0] = {"F8_E8M0", 8}, [KVS_ST_I16] = {"I16", 16},
    [KVS_ST_U16] = {"U16", 16},        [KVS_ST_F16] = {"F16", 16},
    [KVS_ST_BF16] = {"BF16", 16},      [KVS_ST_I32] = {"I32", 32},
    [KVS_ST_U32] = {"U32", 32},        [KVS_ST_F32] = {"F32", 32},
    [KVS_ST_C64] = {"C64", 64},        [KVS_ST_F64] = {"F64", 64},
    [KVS_ST_I64] = {"I64", 64},        [KVS_ST_U64] = {"U64", 64},
};

static int st_dtype_valid(kvs_st_dtype d) { return (unsigned)d < KVS_ST_NDTYPES; }

const char *kvs_st_dtype_name(kvs_st_dtype dtype)
{
    return st_dtype_valid(dtype) ? st_dtypes[dtype].name : "?";
}

unsigned kvs_st_dtype_bits(kvs_st_dtype dtype)
{
    return st_dtype_valid(dtype) ? st_dtypes[dtype].bits : 0;
}

int kvs_st_dtype_parse(const char *name, kvs_st_dtype *out)
{
    for (int i = 0; i < KVS_ST_NDTYPES; i++) {
        if (strcmp(name, st_dtypes[i].name) == 0) {
            *out = (kvs_st_dtype)i;
            return 0;
        }
    }
    return -1;
}

int kvs_st_dtype_to_kvs(kvs_st_dtype dtype, kvs_dtype *out)
{
    switch (dtype) {
    case KVS_ST_F32: *out = KVS_DTYPE_FLOAT32; return 0;
    case KVS_ST_F16: *out = KVS_DTYPE_FLOAT16; return 0;
    case KVS_ST_BF16: *out = KVS_DTYPE_BFLOAT16; return 0;
    case KVS_ST_U8: *out = KVS_DTYPE_UINT8; return 0;
    case KVS_ST_F8_E4M3: *out = KVS_DTYPE_FLOAT8_E4M3FN; return 0;
    case KVS_ST_F8_E5M2: *out = KVS_DTYPE_FLOAT8_E5M2; return 0;
    default: return -1;
    }
}

kvs_st_dtype kvs_st_dtype_from_kvs(kvs_dtype dtype)
{
    switch (dtype) {
    case KVS_DTYPE_FLOAT32: return KVS_ST_F32;
    case KVS_DTYPE_FLOAT16: return KVS_ST_F16;
    case KVS_DTYPE_BFLOAT16: return KVS_ST_BF16;
    case KVS_DTYPE_FLOAT8_E4M3FN: return KVS_ST_F8_E4M3;
    case KVS_DTYPE_FLOAT8_E5M2: return KVS_ST_F8_E5M2;
    case KVS_DTYPE_UINT8:
    default: return KVS_ST_U8;
    }
}

char *kvs_st_format_shape(uint32_t ndim, const uint64_t *shape, char *buf, size_t size)
{
    size_t pos = 0;
    if (size == 0) return buf;
    buf[0] = '\0';
#define PUT(...)                                                              \
    do {                                                                      \
        int n_ = snprintf(buf + pos, size - pos, __VA_ARGS__);                \
        if (n_ < 0 || (size_t)n_ >= size - pos) return buf;                   \
        pos += (size_t)n_;                                                    \
    } while (0)
    PUT("[");
    for (uint32_t d = 0; d < ndim; d++)
        PUT(d ? ", %llu" : "%llu", (unsigned long long)shape[d]);
    PUT("]");
#undef PUT
    return buf;
}

/* Element count x dtype bits / 8, refusing overflow and a partial byte.
 * Returns 0 and sets *nbytes / *numel, or -1 (overflow) / -2 (not a whole
 * number of bytes). */
static int shape_nbytes(uint32_t ndim, const uint64_t *shape, kvs_st_dtype dtype,
                        uint64_t *numel, uint64_t *nbytes)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(n, shape[d], &n)) return -1;
    uint64_t bits;
    if (__builtin_mul_overflow(n, (uint64_t)kvs_st_dtype_bits(dtype), &bits)) return -1;
    *numel = n;
    if (bits % 8) return -2;
    *nbytes = bits / 8;
    return 0;
}

/* ------------------------------------------------------------------------
 * Parsing
 * --------------------------------------------------------------------- */

static int corrupt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int corrupt(const char *fmt, ...)
{
    char msg[KVS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kvs_set_error(KVS_ECORRUPT, "safetensors: %s", msg);
}

static int oom(void) { return kvs_set_error(KVS_ENOMEM, "safetensors: out of memory"); }

void kvs_st_file_free(kvs_st_file *file)
{
    if (file == NULL) return;
    for (size_t i = 0; i < file->ntensors; i++) {
        free(file->tensors[i].name);
        free(file->tensors[i].shape);
    }
    free(file->tensors);
    for (size_t i = 0; i < file->nmeta; i++) {
        free(file->meta[i].key);
        free(file->meta[i].value);
    }
    free(file->meta);
    kvs_name_index_free(&file->tensor_names);
    kvs_name_index_free(&file->meta_keys);
    memset(file, 0, sizeof *file);
}

static int parse_metadata(json_t *value, kvs_st_file *out)
{
    if (json_is_null(value)) return KVS_OK; /* the reference reads null as absent */
    if (!json_is_object(value))
        return corrupt("__metadata__ must be an object of strings, got %s",
                       kvs_json_type_name(value));
    out->has_metadata = 1;
    size_t n = json_object_size(value);
    out->meta = calloc(n ? n : 1, sizeof *out->meta);
    if (out->meta == NULL) return oom();
    const char *key;
    json_t *v;
    json_object_foreach(value, key, v) {
        if (!json_is_string(v))
            return corrupt("__metadata__ entry '%s' must be a string, got %s", key,
                           kvs_json_type_name(v));
        kvs_st_meta *m = &out->meta[out->nmeta];
        m->key = strdup(key);
        m->value = strdup(json_string_value(v));
        out->nmeta++;
        if (m->key == NULL || m->value == NULL) return oom();
    }
    return KVS_OK;
}

/* A JSON array of non-negative integers into a new uint64 array. */
static int parse_uints(const char *tname, const char *field, json_t *arr,
                       uint64_t **vals, size_t *n)
{
    if (arr == NULL) return corrupt("tensor '%s': missing '%s'", tname, field);
    if (!json_is_array(arr))
        return corrupt("tensor '%s': '%s' must be an array, got %s", tname, field,
                       kvs_json_type_name(arr));
    size_t count = json_array_size(arr);
    uint64_t *v = NULL;
    if (count && (v = malloc(count * sizeof *v)) == NULL) return oom();
    for (size_t i = 0; i < count; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0) {
            free(v);
            if (json_is_integer(x))
                return corrupt("tensor '%s': %s[%zu] must be a non-negative integer, got %lld",
                               tname, field, i, (long long)json_integer_value(x));
            return corrupt("tensor '%s': %s[%zu] must be a non-negative integer, got %s",
                           tname, field, i, kvs_json_type_name(x));
        }
        v[i] = (uint64_t)json_integer_value(x);
    }
    *vals = v;
    *n = count;
    return KVS_OK;
}

/* One tensor entry: dtype, shape, data_offsets and the byte size they
 * imply (checked against the span later, in offset order). */
static int parse_tensor(const char *name, json_t *value, kvs_st_tensor *t,
                        uint64_t *nbytes)
{
    if (!json_is_object(value))
        return corrupt("tensor '%s': entry must be an object, got %s", name,
                       kvs_json_type_name(value));
    json_t *dt = json_object_get(value, "dtype");
    if (dt == NULL) return corrupt("tensor '%s': missing 'dtype'", name);
    if (!json_is_string(dt))
        return corrupt("tensor '%s': 'dtype' must be a string, got %s", name,
                       kvs_json_type_name(dt));
    if (kvs_st_dtype_parse(json_string_value(dt), &t->dtype) != 0)
        return corrupt("tensor '%s': unknown dtype '%s'", name, json_string_value(dt));

    size_t ndim = 0;
    int rc = parse_uints(name, "shape", json_object_get(value, "shape"), &t->shape, &ndim);
    if (rc) return rc;
    if (ndim > UINT32_MAX) return corrupt("tensor '%s': %zu dimensions", name, ndim);
    t->ndim = (uint32_t)ndim;

    uint64_t *offs = NULL;
    size_t noffs = 0;
    rc = parse_uints(name, "data_offsets", json_object_get(value, "data_offsets"), &offs,
                     &noffs);
    if (rc) return rc;
    if (noffs != 2) {
        free(offs);
        return corrupt("tensor '%s': data_offsets must hold 2 integers, got %zu", name,
                       noffs);
    }
    t->begin = offs[0];
    t->end = offs[1];
    free(offs);

    char shape[256];
    rc = shape_nbytes(t->ndim, t->shape, t->dtype, &t->numel, nbytes);
    if (rc == -1)
        return corrupt("tensor '%s': shape %s x %s overflows 64 bits", name,
                       kvs_st_format_shape(t->ndim, t->shape, shape, sizeof shape),
                       kvs_st_dtype_name(t->dtype));
    if (rc == -2)
        return corrupt("tensor '%s': shape %s x %s is not a whole number of bytes", name,
                       kvs_st_format_shape(t->ndim, t->shape, shape, sizeof shape),
                       kvs_st_dtype_name(t->dtype));
    return KVS_OK;
}

typedef struct {
    kvs_st_tensor t;
    uint64_t nbytes;
} parsed_tensor;

static int cmp_offsets(const void *a, const void *b)
{
    const parsed_tensor *x = a, *y = b;
    if (x->t.begin != y->t.begin) return x->t.begin < y->t.begin ? -1 : 1;
    if (x->t.end != y->t.end) return x->t.end < y->t.end ? -1 : 1;
    return strcmp(x->t.name, y->t.name);
}

/* The tensors in offset order must tile the data section exactly. */
static int check_layout(const parsed_tensor *pt, size_t n, uint64_t data_len)
{
    uint64_t pos = 0;
    const char *prev = NULL;
    char shape[256];
    for (size_t i = 0; i < n; i++) {
        const kvs_st_tensor *t = &pt[i].t;
        unsigned long long b = t->begin, e = t->end;
        if (e < b)
            return corrupt("tensor '%s': data_offsets [%llu, %llu] end before they begin",
                           t->name, b, e);
        if (b < pos)
            return corrupt("tensor '%s': data_offsets [%llu, %llu] overlap tensor '%s', "
                           "which ends at %llu",
                           t->name, b, e, prev, (unsigned long long)pos);
        if (b > pos) {
            if (prev == NULL)
                return corrupt("tensor '%s': data_offsets [%llu, %llu] leave a gap: "
                               "the data section starts at 0",
                               t->name, b, e);
            return corrupt("tensor '%s': data_offsets [%llu, %llu] leave a gap after "
                           "tensor '%s', which ends at %llu",
                           t->name, b, e, prev, (unsigned long long)pos);
        }
        if (e > data_len)
            return corrupt("tensor '%s': data_offsets [%llu, %llu] run past the end of "
                           "the data section, which holds %llu bytes (truncated file?)",
                           t->name, b, e, (unsigned long long)data_len);
        if (e - b != pt[i].nbytes)
            return corrupt("tensor '%s': data_offsets [%llu, %llu] span %llu bytes but "
                           "shape %s x %s needs %llu",
                           t->name, b, e, e - b,
                           kvs_st_format_shape(t->ndim, t->shape, shape, sizeof shape),
                           kvs_st_dtype_name(t->dtype), (unsigned long long)pt[i].nbytes);
        pos = e;
        prev = t->name;
    }
    if (pos != data_len)
        return corrupt("the tensors cover %llu bytes but the data section holds %llu: "
                       "%llu trailing byte%s",
                       (unsigned long long)pos, (unsigned long long)data_len,
                       (unsigned long long)(data_len - pos), data_len - pos == 1 ? "" : "s");
    return KVS_OK;
}

/* The name indexes of a parsed file; the metadata entries are put in key
 * order on the way (the JSON object's order is its hash table's). The keys
 * are unique: the JSON parser refused duplicates. */
static int index_file(kvs_st_file *f)
{
    if (kvs_name_index_build(&f->tensor_names, f->tensors, f->ntensors, sizeof *f->tensors,
                             offsetof(kvs_st_tensor, name)) != KVS_OK ||
        kvs_name_index_build(&f->meta_keys, f->meta, f->nmeta, sizeof *f->meta,
                             offsetof(kvs_st_meta, key)) != KVS_OK)
        return oom();
    if (f->nmeta == 0) return KVS_OK;
    kvs_st_meta *sorted = malloc(f->nmeta * sizeof *sorted);
    if (sorted == NULL) return oom();
    for (size_t i = 0; i < f->nmeta; i++) {
        sorted[i] = f->meta[f->meta_keys.entries[i].index];
        f->meta_keys.entries[i].index = i;
    }
    free(f->meta);
    f->meta = sorted;
    return KVS_OK;
}

int kvs_safetensors_parse(const uint8_t *buf, size_t len, kvs_st_file *out)
{
    memset(out, 0, sizeof *out);
    if (buf == NULL && len > 0) return kvs_set_error(KVS_EINVAL, "safetensors: NULL buffer");
    if (len < 8)
        return corrupt("file too small: %zu bytes; the header size alone takes 8", len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | buf[i];
    if (n > KVS_ST_MAX_HEADER)
        return corrupt("header too large: %llu bytes; the limit is %u",
                       (unsigned long long)n, KVS_ST_MAX_HEADER);
    if (n > len - 8)
        return corrupt("truncated header: %llu bytes declared but the file holds %zu "
                       "after the size",
                       (unsigned long long)n, len - 8);
    if (n == 0) return corrupt("empty header");
    if (buf[8] != '{')
        return corrupt("header must be a JSON object starting with '{', got byte 0x%02x",
                       buf[8]);

    json_error_t jerr;
    json_t *root = json_loadb((const char *)buf + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return corrupt("header is not valid JSON: %s (line %d, column %d)", jerr.text,
                       jerr.line, jerr.column);
    /* A header starting with '{' that parses is an object. */
    out->header_len = n;
    out->data_start = 8 + n;
    out->data_len = len - 8 - n;

    size_t total = json_object_size(root);
    parsed_tensor *pt = calloc(total ? total : 1, sizeof *pt);
    int rc = KVS_OK;
    size_t count = 0;
    if (pt == NULL) rc = oom();
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (rc) break;
        if (strcmp(key, "__metadata__") == 0) {
            rc = parse_metadata(value, out);
            continue;
        }
        parsed_tensor *p = &pt[count++];
        if ((p->t.name = strdup(key)) == NULL) {
            rc = oom();
            break;
        }
        rc = parse_tensor(key, value, &p->t, &p->nbytes);
    }
    json_decref(root);

    if (rc == KVS_OK) {
        qsort(pt, count, sizeof *pt, cmp_offsets);
        rc = check_layout(pt, count, out->data_len);
    }
    if (rc == KVS_OK) {
        out->tensors = calloc(count ? count : 1, sizeof *out->tensors);
        if (out->tensors == NULL) rc = oom();
    }
    if (rc) {
        for (size_t i = 0; i < count; i++) {
            free(pt[i].t.name);
            free(pt[i].t.shape);
        }
        free(pt);
        kvs_st_file_free(out);
        return rc;
    }
    for (size_t i = 0; i < count; i++) {
        out->tensors[i] = pt[i].t;
        out->tensors[i].data = buf + out->data_start + pt[i].t.begin;
    }
    out->ntensors = count;
    free(pt);
    rc = index_file(out);
    if (rc) kvs_st_file_free(out);
    return rc;
}

const kvs_st_tensor *kvs_st_find(const kvs_st_file *file, const char *name)
{
    size_t i = kvs_name_index_find(&file->tensor_names, name);
    return i == KVS_NAME_NONE ? NULL : &file->tensors[i];
}

const char *kvs_st_meta_get(const kvs_st_file *file, const char *key)
{
    size_t i = kvs_name_index_find(&file->meta_keys, key);
    return i == KVS_NAME_NONE ? NULL : file->meta[i].value;
}

/* ------------------------------------------------------------------------
 * Reading files
 * --------------------------------------------------------------------- */

int kvs_st_map(const char *path, kvs_st_mapped *out)
{
    memset(out, 0, sizeof *out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kvs_set_error(KVS_EIO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kvs_set_error(KVS_EIO, "%s: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return kvs_set_error(KVS_EIO, "%s: %s", path, strerror(EISDIR));
    }
    if (S_ISREG(st.st_mode) && st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p != MAP_FAILED) {
            close(fd);
            out->data = p;
            out->len = (size_t)st.st_size;
            out->mapped = 1;
            return KVS_OK;
        }
    }
    /* Not mappable (a pipe, an empty file, a file system without mmap):
     * read it all. */
    size_t cap = 1 << 16, len = 0;
    uint8_t *buf = malloc(cap);
    if (buf == NULL) {
        close(fd);
        return oom();
    }
    for (;;) {
        if (len == cap) {
            uint8_t *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                close(fd);
                return oom();
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return kvs_set_error(KVS_EIO, "%s: %s", path, strerror(e));
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    close(fd);
    out->data = buf;
    out->len = len;
    out->mapped = 0;
    return KVS_OK;
}

void kvs_st_unmap(kvs_st_mapped *m)
{
    if (m == NULL || m->data == NULL) return;
    if (m->mapped)
        munmap((void *)m->data, m->len);
    else
        free((void *)m->data);
    memset(m, 0, sizeof *m);
}

int kvs_st_open(const char *path, kvs_st_mapped *map, kvs_st_file *file)
{
    memset(file, 0, sizeof *file);
    int rc = kvs_st_map(path, map);
    if (rc) return rc;
    rc = kvs_safetensors_parse(map->data, map->len, file);
    if (rc) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        kvs_st_unmap(map);
        return kvs_set_error(rc, "%s: %s", path, msg);
    }
    return KVS_OK;
}

void kvs_st_close(kvs_st_mapped *map, kvs_st_file *file)
{
    kvs_st_file_free(file);
    kvs_st_unmap(map);
}

/* ------------------------------------------------------------------------
 * Writing
 * --------------------------------------------------------------------- */

/* The reference's layout order: larger dtype (alignment) first, then name.
 * `base` is the tensor array the sorted indices point into. */
static int cmp_layout(const void *a, const void *b, void *base)
{
    const kvs_st_out *x = &((const kvs_st_out *)base)[*(const size_t *)a];
    const kvs_st_out *y = &((const kvs_st_out *)base)[*(const size_t *)b];
    if (x->dtype != y->dtype) return x->dtype > y->dtype ? -1 : 1;
    return strcmp(x->name, y->name);
}

static json_t *uint_array(size_t n, const uint64_t *v)
{
    json_t *arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
        if (json_array_append_new(arr, json_integer((json_int_t)v[i])) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}

int kvs_st_build_header(const kvs_st_out *tensors, size_t ntensors, const kvs_st_meta *meta,
                        size_t nmeta, uint8_t **header, size_t *header_len, size_t *order)
{
    char shape[256];
    for (size_t i = 0; i < ntensors; i++) {
        const kvs_st_out *t = &tensors[i];
        uint64_t numel, nbytes;
        if (!st_dtype_valid(t->dtype))
            return kvs_set_error(KVS_EINVAL, "safetensors: tensor '%s': invalid dtype %d",
                                 t->name, (int)t->dtype);
        if (strcmp(t->name, "__metadata__") == 0)
            return kvs_set_error(KVS_EINVAL,
                                 "safetensors: '__metadata__' cannot name a tensor");
        for (uint32_t d = 0; d < t->ndim; d++)
            if (t->shape[d] > (uint64_t)INT64_MAX)
                return kvs_set_error(KVS_EINVAL, "safetensors: tensor '%s': dimension too large",
                                     t->name);
        if (shape_nbytes(t->ndim, t->shape, t->dtype, &numel, &nbytes) != 0 ||
            nbytes != t->nbytes)
            return kvs_set_error(KVS_EINVAL,
                                 "safetensors: tensor '%s': %llu bytes do not match shape %s x %s",
                                 t->name, (unsigned long long)t->nbytes,
                                 kvs_st_format_shape(t->ndim, t->shape, shape, sizeof shape),
                                 kvs_st_dtype_name(t->dtype));
        order[i] = i;
    }
    /* Names and metadata keys are unique; the keys are written sorted. */
    kvs_name_index names, keys;
    if (kvs_name_index_build(&names, tensors, ntensors, sizeof *tensors,
                             offsetof(kvs_st_out, name)) != KVS_OK)
        return oom();
    const char *dup = kvs_name_index_duplicate(&names);
    int rc = dup ? kvs_set_error(KVS_EINVAL, "safetensors: duplicate tensor name '%s'", dup)
                 : KVS_OK;
    kvs_name_index_free(&names);
    if (rc) return rc;
    if (kvs_name_index_build(&keys, meta, nmeta, sizeof *meta, offsetof(kvs_st_meta, key)) !=
        KVS_OK)
        return oom();
    if ((dup = kvs_name_index_duplicate(&keys)) != NULL) {
        rc = kvs_set_error(KVS_EINVAL, "safetensors: duplicate metadata key '%s'", dup);
        kvs_name_index_free(&keys);
        return rc;
    }
    qsort_r(order, ntensors, sizeof *order, cmp_layout, (void *)tensors);

    json_t *root = json_object();
    if (root == NULL) rc = oom();
    if (rc == KVS_OK && nmeta) {
        json_t *m = json_object();
        if (m == NULL || json_object_set_new(root, "__metadata__", m) != 0) rc = oom();
        for (size_t i = 0; rc == KVS_OK && i < nmeta; i++) {
            const kvs_st_meta *e = &meta[keys.entries[i].index];
            if (json_object_set_new(m, e->key, json_string(e->value)) != 0)
                rc = kvs_set_error(KVS_EINVAL,
                                   "safetensors: metadata '%s' is not valid UTF-8", e->key);
        }
    }
    kvs_name_index_free(&keys);
    uint64_t offset = 0;
    for (size_t i = 0; rc == KVS_OK && i < ntensors; i++) {
        const kvs_st_out *t = &tensors[order[i]];
        uint64_t offs[2] = {offset, offset + t->nbytes};
        json_t *e = json_object();
        json_t *sh = uint_array(t->ndim, t->shape);
        json_t *of = uint_array(2, offs);
        if (e == NULL || sh == NULL || of == NULL ||
            json_object_set_new(e, "dtype", json_string(kvs_st_dtype_name(t->dtype))) ||
            json_object_set_new(e, "shape", sh) || json_object_set_new(e, "data_offsets", of)) {
            json_decref(e);
            rc = oom();
            break;
        }
        if (json_object_set_new(root, t->name, e) != 0)
            rc = kvs_set_error(KVS_EINVAL, "safetensors: tensor name '%s' is not valid UTF-8",
                               t->name);
        offset += t->nbytes;
    }
    char *text = NULL;
    if (rc == KVS_OK && (text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER)) == NULL)
        rc = oom();
    json_decref(root);
    if (rc) return rc;

    size_t tlen = strlen(text);
    size_t padded = (tlen + 7) / 8 * 8;
    if (padded > KVS_ST_MAX_HEADER) { /* no reader would open the file */
        free(text);
        return kvs_set_error(KVS_EINVAL,
                             "safetensors: the header would take %zu bytes; the limit is %u",
                             padded, KVS_ST_MAX_HEADER);
    }
    uint8_t *h = malloc(8 + padded);
    if (h == NULL) {
        free(text);
        return oom();
    }
    for (int i = 0; i < 8; i++) h[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(h + 8, text, tlen);
    memset(h + 8 + tlen, ' ', padded - tlen);
    free(text);
    *header = h;
    *header_len = 8 + padded;
    return KVS_OK;
}

static int write_all(int fd, const void *data, uint64_t len)
{
    const uint8_t *p = data;
    while (len > 0) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t w = write(fd, p, chunk);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        len -= (uint64_t)w;
    }
    return 0;
}

int kvs_safetensors_write(const char *path, const kvs_st_out *tensors, size_t ntensors,
                          const kvs_st_meta *meta, size_t nmeta, kvs_st_produce_fn produce,
                          void *ctx)
{
    size_t *order = malloc((ntensors ? ntensors : 1) * sizeof *order);
    if (order == NULL) return oom();
    uint8_t *header = NULL;
    size_t header_len = 0;
    int rc = kvs_st_build_header(tensors, ntensors, meta, nmeta, &header, &header_len, order);
    if (rc) {
        free(order);
        return rc;
    }

    /* The temporary file lives next to the destination, so the rename is
     * atomic (same file system); it is hidden (leading dot). */
    const char *slash = strrchr(path, '/');
    size_t dirlen = slash ? (size_t)(slash - path) : 0;
    const char *base = slash ? slash + 1 : path;
    char *dir = slash ? strndup(path, dirlen ? dirlen : 1) : strdup(".");
    size_t tlen = strlen(dir) + strlen(base) + 32;
    char *tmp = malloc(tlen);
    if (dir == NULL || tmp == NULL) {
        free(dir);
        free(tmp);
        free(order);
        free(header);
        return oom();
    }
    snprintf(tmp, tlen, "%s/.%s.kvserde-tmp-XXXXXX", dir, base);

    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        rc = kvs_set_error(KVS_EIO, "safetensors: cannot create a temporary file in '%s': %s",
                           dir, strerror(errno));
        goto out;
    }
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, 0666 & ~mask) != 0) goto io_fail;
    if (write_all(fd, header, header_len) != 0) goto io_fail;
    for (size_t i = 0; i < ntensors; i++) {
        const kvs_st_out *t = &tensors[order[i]];
        const void *data = t->data;
        if (data == NULL && t->nbytes > 0) {
            if (produce == NULL) {
                rc = kvs_set_error(KVS_EINVAL, "safetensors: tensor '%s' has no data", t->name);
                goto fail;
            }
            rc = produce(ctx, order[i], &data);
            if (rc) goto fail;
        }
        if (t->nbytes && write_all(fd, data, t->nbytes) != 0) goto io_fail;
    }
    if (fsync(fd) != 0) goto io_fail;
    if (close(fd) != 0) {
        fd = -1;
        goto io_fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        rc = kvs_set_error(KVS_EIO, "safetensors: cannot rename '%s' to '%s': %s", tmp, path,
                           strerror(errno));
        goto fail;
    }
    /* Make the rename itself durable; not every file system can fsync a
     * directory, so a failure here is not an error. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    goto out;

io_fail:
    rc = kvs_set_error(KVS_EIO, "safetensors: writing '%s': %s", path, strerror(errno));
fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
out:
    free(dir);
    free(tmp);
    free(order);
    free(header);
    return rc;
}

/* ------------------------------------------------------------------------
 * Float conversions
 * --------------------------------------------------------------------- */

static float load_float(const void *src, kvs_dtype dtype, size_t i)
{
    if (dtype == KVS_DTYPE_FLOAT32) {
        float f;
        memcpy(&f, (const uint8_t *)src + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const uint8_t *)src + 2 * i, 2);
    return dtype == KVS_DTYPE_FLOAT16 ? kvs_f16_to_f32(h) : kvs_bf16_to_f32(h);
}

void kvs_convert_floats(const void *src, kvs_dtype src_dtype, void *dst, kvs_dtype dst_dtype,
                        size_t n)
{
    if (src_dtype == dst_dtype) {
        memcpy(dst, src, n * kvs_dtype_size(src_dtype));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float f = load_float(src, src_dtype, i);
        if (dst_dtype == KVS_DTYPE_FLOAT32) {
            memcpy((uint8_t *)dst + 4 * i, &f, 4);
        } else {
            uint16_t h = dst_dtype == KVS_DTYPE_FLOAT16 ? kvs_f32_to_f16(f) : kvs_f32_to_bf16(f);
            memcpy((uint8_t *)dst + 2 * i, &h, 2);
        }
    }
}

/* ------------------------------------------------------------------------
 * kvserde's conventions
 * --------------------------------------------------------------------- */

int kvs_enc_layout(uint32_t ndim, const uint64_t *shape, kvs_dtype dtype, kvs_layout *out)
{
    memset(out, 0, sizeof *out);
    if (ndim <= KVS_MAX_DIMS) {
        int64_t dims[KVS_MAX_DIMS];
        for (uint32_t d = 0; d < ndim; d++) {
            if (shape[d] > (uint64_t)INT64_MAX)
                return kvs_set_error(KVS_EINVAL, "dimension %u too large: %llu", d,
                                     (unsigned long long)shape[d]);
            dims[d] = (int64_t)shape[d];
        }
        return kvs_layout_add_group(out, ndim, dims, dtype);
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < ndim; d++)
        if (__builtin_mul_overflow(numel, shape[d], &numel))
            return kvs_set_error(KVS_EINVAL, "element count overflows 64 bits");
    return kvs_layout_flat(out, numel, dtype);
}

static json_t *load_object(const char *text, const char *what)
{
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        kvs_set_error(KVS_EINVAL, "%s: invalid JSON at line %d, column %d: %s", what,
                      jerr.line, jerr.column, jerr.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        kvs_set_error(KVS_EINVAL, "%s: must be a JSON object, got %s", what,
                      kvs_json_type_name(root));
        json_decref(root);
        return NULL;
    }
    return root;
}

int kvs_serde_config_canonical(const char *json_text, char **out)
{
    json_t *root = load_object(json_text, "serde config");
    if (root == NULL) return KVS_EINVAL;
    *out = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    json_decref(root);
    return *out ? KVS_OK : oom();
}

int kvs_serde_config_fp8(const char *json_text, kvs_dtype *fp8)
{
    json_t *root = load_object(json_text, "serde config");
    if (root == NULL) return KVS_EINVAL;
    int rc = 0;
    json_t *type = json_object_get(root, "type");
    json_t *dt = json_object_get(root, "fp8_dtype");
    if (!json_is_string(type)) {
        rc = kvs_set_error(KVS_EINVAL, "serde config: 'type' must be a string");
    } else if (strcmp(json_string_value(type), "fp8") == 0) {
        rc = 1;
        *fp8 = KVS_DTYPE_FLOAT8_E4M3FN;
        if (dt != NULL) {
            if (json_is_string(dt) && strcmp(json_string_value(dt), "float8_e5m2") == 0)
                *fp8 = KVS_DTYPE_FLOAT8_E5M2;
            else if (!json_is_string(dt) || strcmp(json_string_value(dt), "float8_e4m3fn") != 0)
                rc = kvs_set_error(KVS_EINVAL, "serde config: bad fp8_dtype");
        }
    }
    json_decref(root);
    return rc;
}

static int enc_corrupt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int enc_corrupt(const char *fmt, ...)
{
    char msg[KVS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kvs_set_error(KVS_ECORRUPT, "kvserde metadata: %s", msg);
}

void kvs_enc_close(kvs_enc_file *enc)
{
    if (enc == NULL) return;
    kvs_serde_pair_destroy(&enc->serde);
    kvs_multi_serde_pair_destroy(&enc->multi_serde);
    for (size_t i = 0; enc->info && i < enc->ntensors; i++) free(enc->info[i].shape);
    free(enc->info);
    memset(enc, 0, sizeof *enc);
}

static int has_prefix(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* "[2,4,8]" (kvserde.shape) into a new array. */
static int parse_shape_text(const char *tname, const char *text, kvs_enc_info *info)
{
    json_error_t jerr;
    json_t *arr = json_loads(text, JSON_DECODE_ANY, &jerr);
    int rc = KVS_OK;
    size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
    if (!json_is_array(arr) || n > UINT32_MAX) {
        rc = enc_corrupt("tensor '%s': kvserde.shape '%s' is not a JSON array of sizes", tname,
                         text);
        goto out;
    }
    if (n && (info->shape = malloc(n * sizeof *info->shape)) == NULL) {
        rc = oom();
        goto out;
    }
    info->ndim = (uint32_t)n;
    info->numel = 1;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(arr, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0) {
            rc = enc_corrupt("tensor '%s': kvserde.shape '%s' is not a JSON array of sizes",
                             tname, text);
            goto out;
        }
        info->shape[i] = (uint64_t)json_integer_value(x);
        if (__builtin_mul_overflow(info->numel, info->shape[i], &info->numel)) {
            rc = enc_corrupt("tensor '%s': kvserde.shape '%s' overflows 64 bits", tname, text);
            goto out;
        }
    }
out:
    json_decref(arr);
    return rc;
}

/* Fill info for tensor t, which kvserde.dtype.<name> says is encoded. */
/* A blob tensor whose bytes are a frame: its header must parse and record
 * the layout kvserde.shape and kvserde.dtype give (info->layout). */
static int enc_frame(const kvs_st_tensor *t, kvs_enc_info *info)
{
    kvs_frame_info fi;
    int rc = kvs_frame_inspect(t->data, (size_t)(t->end - t->begin), &fi);
    if (rc) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        return kvs_set_error(rc, "tensor '%s': %s", t->name, msg);
    }
    if (!kvs_layout_equal(&fi.layout, &info->layout)) {
        char a[256], b[256];
        return enc_corrupt("tensor '%s': the frame holds %s but %s%s and %s%s say %s", t->name,
                           kvs_layout_format(&fi.layout, a, sizeof a), KVS_META_SHAPE, t->name,
                           KVS_META_DTYPE, t->name, kvs_layout_format(&info->layout, b, sizeof b));
    }
    info->kind = KVS_ENC_FRAME;
    info->frame_format = fi.format;
    return KVS_OK;
}

static int enc_tensor(const kvs_st_file *file, const kvs_st_tensor *t, const char *dtype_text,
                      int is_fp8, kvs_dtype fp8, int pipeline, kvs_enc_info *info)
{
    if (kvs_dtype_parse(dtype_text, &info->orig_dtype) != KVS_OK ||
        (info->orig_dtype != KVS_DTYPE_FLOAT32 && info->orig_dtype != KVS_DTYPE_FLOAT16 &&
         info->orig_dtype != KVS_DTYPE_BFLOAT16))
        return enc_corrupt("tensor '%s': original dtype '%s' is not float32, float16 or "
                           "bfloat16",
                           t->name, dtype_text);
    size_t klen = strlen(KVS_META_SHAPE) + strlen(t->name) + 1;
    char *key = malloc(klen);
    if (key == NULL) return oom();
    snprintf(key, klen, "%s%s", KVS_META_SHAPE, t->name);
    const char *shape_text = kvs_st_meta_get(file, key);
    free(key);
    int rc;
    if (shape_text != NULL) {
        info->kind = KVS_ENC_BLOB;
        if (t->dtype != KVS_ST_U8 || t->ndim != 1)
            return enc_corrupt("tensor '%s' has a kvserde.shape entry but is %s with %u "
                               "dimensions, not a 1-D U8 blob",
                               t->name, kvs_st_dtype_name(t->dtype), t->ndim);
        rc = parse_shape_text(t->name, shape_text, info);
        if (rc) return rc;
    } else {
        info->kind = KVS_ENC_FP8;
        kvs_dtype stored;
        if ((t->dtype != KVS_ST_F8_E4M3 && t->dtype != KVS_ST_F8_E5M2) ||
            kvs_st_dtype_to_kvs(t->dtype, &stored) != 0)
            return enc_corrupt("tensor '%s' is %s; an encoded tensor without kvserde.shape "
                               "must be F8_E4M3 or F8_E5M2",
                               t->name, kvs_st_dtype_name(t->dtype));
        if (!is_fp8)
            return enc_corrupt("tensor '%s' is a native %s tensor but kvserde.serde is not "
                               "the fp8 serde",
                               t->name, kvs_st_dtype_name(t->dtype));
        if (stored != fp8)
            return enc_corrupt("tensor '%s' is %s but kvserde.serde encodes %s", t->name,
                               kvs_st_dtype_name(t->dtype), kvs_dtype_name(fp8));
        info->ndim = t->ndim;
        info->numel = t->numel;
        if (t->ndim) {
            info->shape = malloc(t->ndim * sizeof *info->shape);
            if (info->shape == NULL) return oom();
            memcpy(info->shape, t->shape, t->ndim * sizeof *info->shape);
        }
    }
    rc = kvs_enc_layout(info->ndim, info->shape, info->orig_dtype, &info->layout);
    if (rc) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        return enc_corrupt("tensor '%s': %s", t->name, msg);
    }
    if (info->kind == KVS_ENC_BLOB) {
        /* A frame says what it is, whatever kvserde.serde says. */
        if (kvs_frame_detect(t->data, (size_t)(t->end - t->begin))) return enc_frame(t, info);
        if (pipeline)
            return enc_corrupt("tensor '%s' is not a frame but kvserde.serde is the pipeline "
                               "serde",
                               t->name);
    }
    return KVS_OK;
}

static long tensor_index(const kvs_st_file *file, const char *name)
{
    const kvs_st_tensor *t = kvs_st_find(file, name);
    return t ? (long)(t - file->tensors) : -1;
}

int kvs_serde_config_multi(const char *json_text)
{
    json_t *root = load_object(json_text, "serde config");
    if (root == NULL) return KVS_EINVAL;
    const char *type = json_string_value(json_object_get(root, "type"));
    kvs_serde_kind kind;
    int rc = type == NULL ? kvs_set_error(KVS_EINVAL, "serde config: 'type' must be a string")
             : kvs_serde_type_kind(type, &kind) == KVS_OK && kind == KVS_SERDE_MULTI;
    json_decref(root);
    return rc;
}

/* 1 if a serde config's "type" is "pipeline", 0 if not, KVS_EINVAL if the
 * text is not a JSON object. */
static int serde_config_pipeline(const char *json_text)
{
    json_t *root = load_object(json_text, "serde config");
    if (root == NULL) return KVS_EINVAL;
    const char *type = json_string_value(json_object_get(root, "type"));
    int rc = type != NULL && strcmp(type, "pipeline") == 0;
    json_decref(root);
    return rc;
}

int kvs_enc_open(const kvs_st_file *file, kvs_deserializer *frames, kvs_enc_file *out)
{
    memset(out, 0, sizeof *out);
    out->frames = frames;
    out->info = calloc(file->ntensors ? file->ntensors : 1, sizeof *out->info);
    if (out->info == NULL) return oom();
    out->ntensors = file->ntensors;
    const char *serde = kvs_st_meta_get(file, KVS_META_SERDE);
    int rc = KVS_OK;
    if (serde == NULL) {
        for (size_t i = 0; i < file->nmeta; i++)
            if (has_prefix(file->meta[i].key, KVS_META_PREFIX)) {
                rc = enc_corrupt("'%s' without '%s'", file->meta[i].key, KVS_META_SERDE);
                kvs_enc_close(out);
                return rc;
            }
        return KVS_OK;
    }
    const char *format = kvs_st_meta_get(file, KVS_META_FORMAT);
    kvs_dtype fp8 = KVS_DTYPE_FLOAT8_E4M3FN;
    int is_fp8 = 0;
    if (format == NULL)
        rc = enc_corrupt("'%s' without '%s'", KVS_META_SERDE, KVS_META_FORMAT);
    else if (strcmp(format, KVS_META_FORMAT_VERSION) != 0)
        rc = enc_corrupt("unsupported %s '%s'; this kvserde reads format %s", KVS_META_FORMAT,
                         format, KVS_META_FORMAT_VERSION);
    if (rc == KVS_OK) {
        /* The pipeline serde is not built: its frames rebuild their own
         * chain, and its config may name key files only the writer has. */
        out->pipeline = serde_config_pipeline(serde);
        if (out->pipeline < 0) {
            char msg[KVS_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", kvs_last_error());
            rc = enc_corrupt("%s: %s", KVS_META_SERDE, msg);
        }
    }
    if (rc == KVS_OK && !out->pipeline) {
        out->multi = kvs_serde_config_multi(serde);
        if (out->multi < 0) {
            char msg[KVS_ERROR_MSG_MAX];
            snprintf(msg, sizeof msg, "%s", kvs_last_error());
            rc = enc_corrupt("%s: %s", KVS_META_SERDE, msg);
        }
    }
    if (rc == KVS_OK && out->multi &&
        (rc = kvs_multi_serde_create_pair(serde, &out->multi_serde)) != KVS_OK) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        rc = enc_corrupt("%s: %s", KVS_META_SERDE, msg);
    }
    if (rc == KVS_OK && !out->pipeline && !out->multi &&
        (rc = kvs_serde_create_pair(serde, &out->serde)) != KVS_OK) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        rc = enc_corrupt("%s: %s", KVS_META_SERDE, msg);
    }
    if (rc == KVS_OK) {
        is_fp8 = kvs_serde_config_fp8(serde, &fp8);
        if (is_fp8 < 0) rc = enc_corrupt("%s: %s", KVS_META_SERDE, kvs_last_error());
    }
    out->encoded = 1;
    for (size_t i = 0; rc == KVS_OK && i < file->nmeta; i++) {
        const char *key = file->meta[i].key;
        if (!has_prefix(key, KVS_META_PREFIX) || strcmp(key, KVS_META_SERDE) == 0 ||
            strcmp(key, KVS_META_FORMAT) == 0)
            continue;
        if (out->multi) {
            /* checked by the reader of the entry (kvserde decode) */
            if (!has_prefix(key, KVS_META_KV_SPLIT))
                rc = enc_corrupt("unknown key '%s' (kvserde.serde is a multi-output serde)", key);
        } else if (has_prefix(key, KVS_META_DTYPE)) {
            const char *name = key + strlen(KVS_META_DTYPE);
            long ti = tensor_index(file, name);
            if (ti < 0)
                rc = enc_corrupt("'%s' names no tensor", key);
            else
                rc = enc_tensor(file, &file->tensors[ti], file->meta[i].value, is_fp8, fp8,
                                out->pipeline, &out->info[ti]);
        } else if (has_prefix(key, KVS_META_SHAPE)) {
            const char *name = key + strlen(KVS_META_SHAPE);
            long ti = tensor_index(file, name);
            if (ti < 0)
                rc = enc_corrupt("'%s' names no tensor", key);
            else if (out->info[ti].kind == KVS_ENC_NONE) {
                /* dtype entries sort before shape entries, so an encoded
                 * tensor's info is filled by now */
                rc = enc_corrupt("'%s' without '%s%s'", key, KVS_META_DTYPE, name);
            }
        } else {
            rc = enc_corrupt("unknown key '%s'", key);
        }
    }
    if (rc) kvs_enc_close(out);
    return rc;
}

int kvs_enc_decode_tensor(const kvs_st_file *file, kvs_enc_file *enc, size_t i, kvs_dtype dtype,
                          void *dst)
{
    const kvs_st_tensor *t = &file->tensors[i];
    const kvs_enc_info *info = &enc->info[i];
    if (info->kind == KVS_ENC_NONE)
        return kvs_set_error(KVS_EINVAL, "kvserde: tensor '%s' is not encoded", t->name);
    if (info->numel == 0) return KVS_OK;
    uint64_t span = t->end - t->begin;
    kvs_layout src_layout, dst_layout;
    kvs_memobj src, out;
    int rc = kvs_layout_flat(&src_layout, span, KVS_DTYPE_UINT8);
    if (rc == KVS_OK)
        rc = kvs_memobj_init(&src, (void *)(uintptr_t)t->data, (size_t)span, &src_layout,
                             KVS_FMT_BINARY_BUFFER);
    if (rc) return rc;
    /* Native fp8 tensors decode straight to the asked dtype (the fp8 serde
     * produces any float type); a blob is decoded as what it was, then
     * converted. */
    kvs_dtype via = info->kind == KVS_ENC_FP8 ? dtype : info->orig_dtype;
    rc = kvs_enc_layout(info->ndim, info->shape, via, &dst_layout);
    if (rc) return rc;
    size_t nbytes = (size_t)kvs_layout_nbytes(&dst_layout);
    void *buf = via == dtype ? dst : malloc(nbytes);
    if (buf == NULL) return oom();
    rc = kvs_memobj_init(&out, buf, nbytes, &dst_layout,
                         info->kind == KVS_ENC_FRAME ? info->frame_format : KVS_FMT_UNDEFINED);
    kvs_deserializer *de = info->kind == KVS_ENC_FRAME ? enc->frames : enc->serde.deserializer;
    if (rc == KVS_OK && de == NULL)
        rc = kvs_set_error(KVS_EINVAL, "no deserializer for this tensor");
    if (rc == KVS_OK) rc = kvs_deserialize(de, &src, &out, NULL);
    if (rc == KVS_OK && buf != dst) kvs_convert_floats(buf, via, dst, dtype, (size_t)info->numel);
    if (buf != dst) free(buf);
    if (rc) {
        char msg[KVS_ERROR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", kvs_last_error());
        return kvs_set_error(rc, "tensor '%s': %s", t->name, msg);
    }
    return KVS_OK;
}
