/* stage_aes_gcm.h - internal: the pieces of the aes_gcm stage
 * (stage_aes_gcm.c) that its tests check on their own, below the stage
 * interface of stage.h: the key id, the per-tenant subkey and the raw AEAD.
 * Nothing here is part of the library's API. */
#ifndef KVSERDE_FRAME_STAGE_AES_GCM_H
#define KVSERDE_FRAME_STAGE_AES_GCM_H

#include <stddef.h>
#include <stdint.h>

#define KVS_AES_GCM_KEY_LEN 32    /* AES-256 master keys and subkeys */
#define KVS_AES_GCM_KEY_ID_LEN 8  /* the key id recorded in every blob */
#define KVS_AES_GCM_NONCE_LEN 12  /* 96-bit random nonce */
#define KVS_AES_GCM_TAG_LEN 16    /* appended to the ciphertext */
/* The parameter block of a frame: key id, then nonce. */
#define KVS_AES_GCM_PARAMS_LEN (KVS_AES_GCM_KEY_ID_LEN + KVS_AES_GCM_NONCE_LEN)
/* Largest plaintext of one (key, nonce): 2^39 - 256 bits (SP 800-38D). */
#define KVS_AES_GCM_MAX_PLAINTEXT ((UINT64_C(1) << 36) - 32)

/* The key id of a master key: the first 8 bytes of
 * SHA-256("kvserde aes_gcm key id v1" || key) (the label without a NUL).
 * KVS_OK, or KVS_ENOMEM / KVS_EIO with a message. */
int kvs_aes_gcm_key_id(const uint8_t key[KVS_AES_GCM_KEY_LEN],
                       uint8_t id[KVS_AES_GCM_KEY_ID_LEN]);

/* The subkey of one tenant: HKDF-SHA256 (RFC 5869) with IKM = the master
 * key, an empty salt, info = "kvserde aes_gcm v1" || 0x00 || cache_salt,
 * 32 bytes of output. cache_salt NULL = "". The caller wipes `out`. */
int kvs_aes_gcm_subkey(const uint8_t master[KVS_AES_GCM_KEY_LEN], const char *cache_salt,
                       uint8_t out[KVS_AES_GCM_KEY_LEN]);

/* AES-256-GCM with a 96-bit nonce; the additional data is aad1 || aad2
 * (either may be NULL with length 0). seal: in[0..n) -> out[0..n) and the
 * 16-byte tag; open: verifies `tag` and writes out[0..n), KVS_EAUTH (and
 * out wiped) if it does not match. out == in is allowed. n is at most
 * KVS_AES_GCM_MAX_PLAINTEXT; inputs above INT_MAX bytes are fed to the
 * cipher in pieces of kvs_aes_gcm_update_chunk bytes. */
int kvs_aes_gcm_seal(const uint8_t key[KVS_AES_GCM_KEY_LEN],
                     const uint8_t nonce[KVS_AES_GCM_NONCE_LEN], const uint8_t *aad1,
                     size_t aad1_len, const uint8_t *aad2, size_t aad2_len,
                     const uint8_t *in, size_t n, uint8_t *out,
                     uint8_t tag[KVS_AES_GCM_TAG_LEN]);
int kvs_aes_gcm_open(const uint8_t key[KVS_AES_GCM_KEY_LEN],
                     const uint8_t nonce[KVS_AES_GCM_NONCE_LEN], const uint8_t *aad1,
                     size_t aad1_len, const uint8_t *aad2, size_t aad2_len,
                     const uint8_t *in, size_t n, const uint8_t tag[KVS_AES_GCM_TAG_LEN],
                     uint8_t *out);

/* The piece size of the cipher's update calls: 1 GiB; at most INT_MAX.
 * Tests lower it (before any thread encrypts) to exercise the piecing on
 * small inputs. */
extern size_t kvs_aes_gcm_update_chunk;

#endif /* KVSERDE_FRAME_STAGE_AES_GCM_H */
