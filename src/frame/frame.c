/* frame.c - the frame header: written by the pipeline serializer, parsed
 * (as hostile input) by its deserializer, the tool and the scrub. */
#include "frame/frame.h"

#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "kvserde/dtype.h"
#include "kvserde/error.h"
#include "kvserde/pipeline.h"
#include "util/crc32c.h"
#include "util/le.h"

/* ---------------------------------------------------------------------
 * Keys
 * ------------------------------------------------------------------ */

size_t kvs_key_canonical(const kvs_object_key *key, uint8_t *out)
{
    static const char tag[] = "kvserde-key-v1"; /* its NUL is written too */
    size_t n = 0;
    /* A key that did not come from kvs_object_key_init may claim more hash
     * bytes than it has: never read or write past the arrays. */
    size_t hl = key->chunk_hash_len < KVS_CHUNK_HASH_MAX ? key->chunk_hash_len
                                                         : KVS_CHUNK_HASH_MAX;
    memcpy(out, tag, sizeof tag);
    n += sizeof tag;
    put_le32(out + n, (uint32_t)hl);
    n += 4;
    memcpy(out + n, key->chunk_hash, hl);
    n += hl;
    size_t ml = strnlen(key->model_name, KVS_MODEL_NAME_MAX);
    put_le16(out + n, (uint16_t)ml);
    n += 2;
    memcpy(out + n, key->model_name, ml);
    n += ml;
    put_le64(out + n, (uint64_t)key->kv_rank);
    n += 8;
    put_le64(out + n, (uint64_t)key->object_group_id);
    n += 8;
    size_t sl = strnlen(key->cache_salt, KVS_CACHE_SALT_MAX);
    put_le16(out + n, (uint16_t)sl);
    n += 2;
    memcpy(out + n, key->cache_salt, sl);
    return n + sl;
}

uint64_t kvs_object_key_fingerprint(const kvs_object_key *key)
{
    if (key == NULL) return 0;
    uint8_t buf[KVS_KEY_CANONICAL_MAX];
    size_t n = kvs_key_canonical(key, buf);
    return XXH3_64bits(buf, n);
}

void kvs_key_describe(const kvs_object_key *key, char *buf, size_t cap)
{
    if (key == NULL) {
        snprintf(buf, cap, "no key");
        return;
    }
    snprintf(buf, cap, "key %016llx, model '%.64s'",
             (unsigned long long)kvs_object_key_fingerprint(key), key->model_name);
}

/* ---------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------ */

size_t kvs_frame_header_size(const kvs_layout *layout, const size_t *nparams,
                             uint32_t nstages)
{
    size_t n = KVS_FRAME_FIXED + 4;
    for (uint32_t g = 0; g < layout->ngroups; g++) n += 2 + 8 * layout->groups[g].shape.ndim;
    for (uint32_t s = 0; s < nstages; s++) n += 4 + nparams[s];
    return n;
}

void kvs_frame_write_header(uint8_t *out, const kvs_layout *layout, kvs_memory_format format,
                            const kvs_object_key *key, uint64_t payload_len,
                            const uint16_t *ids, const uint8_t *const *params,
                            const size_t *nparams, uint32_t nstages)
{
    size_t h = kvs_frame_header_size(layout, nparams, nstages);
    memcpy(out, KVS_FRAME_MAGIC, 4);
    out[4] = KVS_FRAME_VERSION;
    out[5] = key ? KVS_FRAME_FLAG_KEYED : 0;
    put_le16(out + 6, (uint16_t)h);
    put_le64(out + 8, payload_len);
    put_le64(out + 16, kvs_object_key_fingerprint(key));
    out[24] = (uint8_t)format;
    out[25] = (uint8_t)layout->ngroups;
    out[26] = (uint8_t)nstages;
    out[27] = 0;
    size_t p = KVS_FRAME_FIXED;
    for (uint32_t g = 0; g < layout->ngroups; g++) {
        const kvs_group *gr = &layout->groups[g];
        out[p++] = (uint8_t)gr->dtype;
        out[p++] = (uint8_t)gr->shape.ndim;
        for (uint32_t d = 0; d < gr->shape.ndim; d++, p += 8)
            put_le64(out + p, (uint64_t)gr->shape.dims[d]);
    }
    for (uint32_t s = 0; s < nstages; s++) {
        put_le16(out + p, ids[s]);
        put_le16(out + p + 2, (uint16_t)nparams[s]);
        p += 4;
        if (nparams[s]) memcpy(out + p, params[s], nparams[s]);
        p += nparams[s];
    }
    put_le32(out + p, kvs_crc32c(0, out, p));
}

/* ---------------------------------------------------------------------
 * Parsing (hostile input: every length checked against the blob)
 * ------------------------------------------------------------------ */

int kvs_frame_is_framed(const uint8_t *blob, size_t len)
{
    return len >= 4 && memcmp(blob, KVS_FRAME_MAGIC, 4) == 0;
}

int kvs_frame_parse(const uint8_t *blob, size_t len, const char *who, kvs_frame *out)
{
    if (!kvs_frame_is_framed(blob, len))
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: not a kvserde frame (%zu bytes, no 'KVSF' magic)", who, len);
    if (len < KVS_FRAME_FIXED + 4)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: frame truncated: %zu bytes, a header needs at least %d",
                             who, len, KVS_FRAME_FIXED + 4);
    memset(out, 0, sizeof *out);
    out->version = blob[4];
    if (out->version != KVS_FRAME_VERSION)
        return kvs_set_error(KVS_EUNSUPPORTED,
                             "%s: frame format version %u; this build reads version %d",
                             who, out->version, KVS_FRAME_VERSION);
    out->header_len = get_le16(blob + 6);
    size_t h = out->header_len;
    if (h < KVS_FRAME_FIXED + 4 || h > len)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: frame header length %zu does not fit the %zu-byte blob", who,
                             h, len);
    uint32_t crc = kvs_crc32c(0, blob, h - 4), stored = get_le32(blob + h - 4);
    if (crc != stored)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: frame header damaged: CRC-32C 0x%08x, stored 0x%08x", who,
                             crc, stored);
    /* The CRC matched: what follows is what a writer wrote, but a writer
     * can be hostile too, so every field is still checked. */
    out->flags = blob[5];
    if (out->flags & ~KVS_FRAME_FLAG_KEYED)
        return kvs_set_error(KVS_EUNSUPPORTED, "%s: unknown frame flags 0x%02x", who,
                             out->flags);
    out->payload_len = get_le64(blob + 8);
    out->key_fingerprint = get_le64(blob + 16);
    if (blob[24] > KVS_FMT_HS_TD)
        return kvs_set_error(KVS_ECORRUPT, "%s: unknown memory format %u in the frame", who,
                             blob[24]);
    out->format = (kvs_memory_format)blob[24];
    uint32_t ngroups = blob[25], nstages = blob[26];
    if (ngroups > KVS_MAX_GROUPS)
        return kvs_set_error(KVS_ECORRUPT, "%s: frame has %u groups, at most %d", who,
                             ngroups, KVS_MAX_GROUPS);
    if (nstages < 1 || nstages > KVS_FRAME_MAX_STAGES)
        return kvs_set_error(KVS_ECORRUPT, "%s: frame has %u stages, expected 1 to %d", who,
                             nstages, KVS_FRAME_MAX_STAGES);
    if (blob[27] != 0)
        return kvs_set_error(KVS_ECORRUPT, "%s: reserved frame byte is 0x%02x, not 0", who,
                             blob[27]);
    size_t end = h - 4, p = KVS_FRAME_FIXED;
    out->layout.ngroups = ngroups;
    for (uint32_t g = 0; g < ngroups; g++) {
        if (end - p < 2)
            return kvs_set_error(KVS_ECORRUPT, "%s: frame header ends inside group %u", who, g);
        kvs_group *gr = &out->layout.groups[g];
        if (!kvs_dtype_valid(blob[p]))
            return kvs_set_error(KVS_ECORRUPT, "%s: group %u has unknown dtype %u", who, g,
                                 blob[p]);
        gr->dtype = (kvs_dtype)blob[p];
        gr->shape.ndim = blob[p + 1];
        p += 2;
        if (gr->shape.ndim > KVS_MAX_DIMS)
            return kvs_set_error(KVS_ECORRUPT, "%s: group %u has %u dims, at most %d", who, g,
                                 gr->shape.ndim, KVS_MAX_DIMS);
        if ((end - p) / 8 < gr->shape.ndim)
            return kvs_set_error(KVS_ECORRUPT, "%s: frame header ends inside group %u", who, g);
        for (uint32_t d = 0; d < gr->shape.ndim; d++, p += 8)
            gr->shape.dims[d] = (int64_t)get_le64(blob + p);
    }
    /* Negative dims and element counts that overflow are the layout's own
     * checks (the same ones every layout passes). */
    if (kvs_layout_validate(&out->layout) != KVS_OK)
        return kvs_set_error(KVS_ECORRUPT, "%s: frame layout is invalid: %s", who,
                             kvs_last_error());
    out->nstages = nstages;
    for (uint32_t s = 0; s < nstages; s++) {
        kvs_frame_stage *st = &out->stages[s];
        if (end - p < 4)
            return kvs_set_error(KVS_ECORRUPT, "%s: frame header ends inside stage %u", who, s);
        st->id = get_le16(blob + p);
        st->nparams = get_le16(blob + p + 2);
        p += 4;
        if (st->nparams > KVS_STAGE_PARAMS_MAX || end - p < st->nparams)
            return kvs_set_error(KVS_ECORRUPT,
                                 "%s: frame stage %u has %u parameter bytes; %zu remain in the "
                                 "header, at most %d allowed",
                                 who, s, st->nparams, end - p, KVS_STAGE_PARAMS_MAX);
        st->params = blob + p;
        p += st->nparams;
        st->type = kvs_stage_type_by_id(st->id);
        if (st->type == NULL)
            return kvs_set_error(KVS_EUNSUPPORTED,
                                 "%s: frame stage %u has unknown stage id %u; this build "
                                 "knows ids %s",
                                 who, s, st->id, kvs_stage_type_id_list_text());
        if ((s == 0) != (st->type->kind == KVS_STAGE_TYPED))
            return kvs_set_error(KVS_ECORRUPT, "%s: frame stage %u '%s' is %s a typed stage",
                                 who, s, st->type->name, s == 0 ? "not" : "also");
        int rc = st->type->check_params(st->params, st->nparams);
        if (rc) return kvs_set_error(rc, "%s: frame stage %u: %s", who, s, kvs_last_error());
    }
    if (p != end)
        return kvs_set_error(KVS_ECORRUPT, "%s: frame header has %zu unused bytes", who,
                             end - p);
    /* kvserde writes no frame without a payload check (pipeline.h); one
     * without could be damaged without anyone noticing, so it is refused. */
    int checked = 0;
    for (uint32_t s = 1; s < nstages; s++)
        checked |= out->stages[s].type->kind == KVS_STAGE_CHECK || out->stages[s].type->needs_header;
    if (!checked)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: frame has no payload check (no checksum or encryption stage)",
                             who);
    if (out->payload_len != len - h)
        return kvs_set_error(KVS_ECORRUPT,
                             "%s: frame %s: payload is %llu bytes, the blob holds %zu after "
                             "its %zu-byte header",
                             who, out->payload_len > len - h ? "truncated" : "has trailing bytes",
                             (unsigned long long)out->payload_len, len - h, h);
    if (!(out->flags & KVS_FRAME_FLAG_KEYED) && out->key_fingerprint != 0)
        return kvs_set_error(KVS_ECORRUPT, "%s: unbound frame carries a key fingerprint", who);
    out->header = blob;
    out->payload = blob + h;
    return KVS_OK;
}
