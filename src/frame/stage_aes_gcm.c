/* TEMPORARY (replaced by the aes branch before landing): aes_gcm refuses. */
#include "frame/stage.h"
#include "kvserde/error.h"
static int aes_create(const json_t *c, kvs_stage **o) { (void)c; (void)o; return kvs_set_error(KVS_EUNSUPPORTED, "aes_gcm: not built"); }
static int aes_check(const uint8_t *p, size_t n) { (void)p; (void)n; return kvs_set_error(KVS_EUNSUPPORTED, "aes_gcm: not built"); }
const kvs_stage_type kvs_stage_aes_gcm_type = {.name = "aes_gcm", .id = KVS_STAGE_AES_GCM, .kind = KVS_STAGE_TRANSFORM, .in_place = 1, .needs_header = 1, .create = aes_create, .check_params = aes_check};
int kvs_keyring_from_config(const json_t *stages, kvs_keyring **out) { (void)stages; *out = NULL; return KVS_OK; }
void kvs_keyring_free(kvs_keyring *kr) { (void)kr; }
