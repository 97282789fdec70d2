/* kvs_test_intq_ref.h - the portable build of the integer quantizer
 * (src/codecs/intq.c: no AVX2 clones, no hand-written kernels) compiled
 * into the test under other names, ref_intq_check / _bound / _encode /
 * _decode, to hold the library's variants against; its static row
 * functions (minmax, quantize_run, ...) are visible to the test too.
 * Include it once, before other headers. */
#ifndef KVS_TEST_INTQ_REF_H
#define KVS_TEST_INTQ_REF_H

#define KVS_NO_CLONES 1
#define KVS_INTQ_PORTABLE 1
#define kvs_intq_check ref_intq_check
#define kvs_intq_bound ref_intq_bound
#define kvs_intq_encode ref_intq_encode
#define kvs_intq_encode_fed ref_intq_encode_fed
#define kvs_intq_decode ref_intq_decode
#include "codecs/intq.c"
#undef kvs_intq_check
#undef kvs_intq_bound
#undef kvs_intq_encode
#undef kvs_intq_encode_fed
#undef kvs_intq_decode
/* the library's */
int kvs_intq_encode(const kvs_intq_params *p, const kvs_memobj *src, uint8_t *out, size_t cap,
                    size_t *n);
int kvs_intq_decode(const kvs_intq_params *p, const uint8_t *in, size_t n, kvs_memobj *dst);
int kvs_intq_encode_fed(const kvs_intq_params *p, const kvs_memobj *src, uint8_t *out,
                        size_t cap, size_t *n, kvs_intq_feed feed,
                        kvs_intq_feed_crc32c feed_crc32c, void *state);

#endif /* KVS_TEST_INTQ_REF_H */
