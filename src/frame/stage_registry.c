/* stage_registry.c - the table of built-in stage types, looked up by the
 * JSON name (pipeline creation) and by the frame id (parsing). A table and
 * not a registration call: stage ids are part of the frame format, so the
 * set of stages a build reads is fixed when it is built. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "frame/stage.h"
#include "kvserde/error.h"
#include "util/name_list.h"

static const kvs_stage_type *const stage_types[] = {
    &kvs_stage_bytes_type,  &kvs_stage_fp8_type,    &kvs_stage_crc32c_type,
    &kvs_stage_xxh3_type,   &kvs_stage_aes_gcm_type, &kvs_stage_lossless_type,
    &kvs_stage_ggml_q8_0_type, &kvs_stage_ggml_q4_0_type,
    &kvs_stage_int_type,    &kvs_stage_transform_type,
};
#define NTYPES (sizeof stage_types / sizeof stage_types[0])

const kvs_stage_type *kvs_stage_type_by_name(const char *name)
{
    for (size_t i = 0; name && i < NTYPES; i++)
        if (strcmp(stage_types[i]->name, name) == 0) return stage_types[i];
    return NULL;
}

const kvs_stage_type *kvs_stage_type_by_id(uint16_t id)
{
    for (size_t i = 0; i < NTYPES; i++)
        if (stage_types[i]->id == id) return stage_types[i];
    return NULL;
}

size_t kvs_stage_type_names(const char **names, size_t cap)
{
    for (size_t i = 0; i < NTYPES && i < cap; i++) names[i] = stage_types[i]->name;
    return NTYPES;
}

static char list_text[256];

static void build_list_text(void)
{
    const char *names[NTYPES];
    kvs_stage_type_names(names, NTYPES);
    kvs_names_join(names, NTYPES, "(none)", list_text, sizeof list_text);
}

const char *kvs_stage_type_list_text(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_list_text);
    return list_text;
}

static char typed_list_text[256];

static void build_typed_list_text(void)
{
    const char *names[NTYPES];
    size_t n = 0;
    for (size_t i = 0; i < NTYPES; i++)
        if (stage_types[i]->kind == KVS_STAGE_TYPED) names[n++] = stage_types[i]->name;
    kvs_names_join(names, n, "(none)", typed_list_text, sizeof typed_list_text);
}

const char *kvs_stage_typed_list_text(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_typed_list_text);
    return typed_list_text;
}

static char id_list_text[256];

static void build_id_list_text(void)
{
    size_t n = 0;
    for (size_t i = 0; i < NTYPES && n < sizeof id_list_text; i++)
        n += (size_t)snprintf(id_list_text + n, sizeof id_list_text - n, "%s%u (%s)",
                              i ? ", " : "", (unsigned)stage_types[i]->id,
                              stage_types[i]->name);
}

const char *kvs_stage_type_id_list_text(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_id_list_text);
    return id_list_text;
}

void kvs_stage_typed_shape(uint16_t typed_id, const kvs_layout *layout, unsigned *elem_size,
                           uint64_t *channels)
{
    unsigned s = 0;
    uint64_t c = 0;
    for (uint32_t g = 0; g < layout->ngroups; g++) {
        const kvs_group *gr = &layout->groups[g];
        unsigned gs = typed_id == KVS_STAGE_FP8 || typed_id == KVS_STAGE_INT ||
                              typed_id == KVS_STAGE_TRANSFORM_CODED
                          ? 1
                          : (unsigned)kvs_dtype_size(gr->dtype);
        uint64_t gc = gr->shape.ndim ? (uint64_t)gr->shape.dims[gr->shape.ndim - 1] : 1;
        s = g == 0 || s == gs ? gs : 1;
        c = g == 0 || c == gc ? gc : 1;
    }
    if (typed_id == KVS_STAGE_GGML_Q8_0 || typed_id == KVS_STAGE_GGML_Q4_0) s = c = 1;
    *elem_size = s ? s : 1;
    *channels = c ? c : 1;
}

size_t kvs_stage_no_params_size(const kvs_stage *self)
{
    (void)self;
    return 0;
}

int kvs_stage_no_params_write(const kvs_stage *self, uint8_t *params)
{
    (void)self;
    (void)params;
    return KVS_OK;
}

json_t *kvs_stage_no_params_describe(const uint8_t *params, size_t nparams)
{
    (void)params;
    (void)nparams;
    return json_object();
}
