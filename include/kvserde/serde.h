/* kvserde/serde.h - the synchronous serde interface (upstream serde/base.py,
 * sync half).
 *
 * A serde is a pure transform: a serializer turns a KV-shaped memory object
 * into bytes, a deserializer turns bytes back into a KV-shaped object. No
 * threads, no fds: the async processor (processor.h) adds those.
 *
 * Implementing one: embed the interface struct and recover yourself with
 * KVS_CONTAINER_OF:
 *
 *     struct my_ser { kvs_serializer base; int level; };
 *     static int my_serialize(kvs_serializer *s, const kvs_memobj *src,
 *                             kvs_memobj *dst, const kvs_object_key *key,
 *                             size_t *nwritten) {
 *         struct my_ser *self = KVS_CONTAINER_OF(s, struct my_ser, base);
 *         ...
 *     }
 *     static const struct kvs_serializer_ops my_ops = {
 *         "my", my_serialize, my_estimate, my_destroy };
 *
 * Contracts every implementation keeps (callers rely on them):
 *   - serialize is deterministic: the same src gives the same bytes.
 *   - estimate_serialized_size depends only on the layout and is an upper
 *     bound on what serialize writes for any object of that layout.
 *   - on failure nothing is written to dst (refuse before writing), and the
 *     thread's error message says why (kvs_set_error).
 *   - serialize and deserialize may be called from several threads at once
 *     on different objects.
 *
 * The object key (upstream PR #4203). serialize and deserialize receive the
 * key of the object they transform, or NULL where no key exists (a serde
 * used directly on a file, a test). A serde may use it to bind a blob to
 * its key (framed pipelines record a fingerprint of it) or to encrypt per
 * key; a serde that needs a key refuses NULL with KVS_EINVAL and a message
 * that says so. A serde that does not use it ignores it. The key is only
 * read during the call.
 */
#ifndef KVSERDE_SERDE_H
#define KVSERDE_SERDE_H

#include <stddef.h>
#include <stdint.h>

#include "export.h"
#include "memobj.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvs_serializer kvs_serializer;
typedef struct kvs_deserializer kvs_deserializer;

struct kvs_serializer_ops {
    /* Short name used in messages ("fp8"). */
    const char *name;
    /* Write src's data into dst (from dst->data, at most dst->capacity
     * bytes) and set *nwritten to the bytes written. Does not change
     * dst->used_size (the async layer narrows it). */
    int (*serialize)(kvs_serializer *self, const kvs_memobj *src,
                     kvs_memobj *dst, const kvs_object_key *key,
                     size_t *nwritten);
    /* The buffer size to allocate for serializing an object of `layout`. */
    int (*estimate_serialized_size)(const kvs_serializer *self,
                                    const kvs_layout *layout, size_t *nbytes);
    /* Free the serializer. */
    void (*destroy)(kvs_serializer *self);
};

struct kvs_serializer {
    const struct kvs_serializer_ops *ops;
};

struct kvs_deserializer_ops {
    const char *name;
    /* Read serialized bytes from src (its first used_size bytes) and fill
     * dst, whose layout says what to produce. key as for serialize. */
    int (*deserialize)(kvs_deserializer *self, const kvs_memobj *src,
                       kvs_memobj *dst, const kvs_object_key *key);
    void (*destroy)(kvs_deserializer *self);
};

struct kvs_deserializer {
    const struct kvs_deserializer_ops *ops;
};

/* Checked calls through the ops tables. NULL arguments (other than key,
 * which may be NULL) are refused with KVS_EINVAL; otherwise they return
 * what the implementation returns, and
 * make sure a failing implementation left a message. */
KVS_API int kvs_serialize(kvs_serializer *ser, const kvs_memobj *src,
                          kvs_memobj *dst, const kvs_object_key *key,
                          size_t *nwritten);
KVS_API int kvs_estimate_serialized_size(const kvs_serializer *ser,
                                         const kvs_layout *layout,
                                         size_t *nbytes);
KVS_API int kvs_deserialize(kvs_deserializer *de, const kvs_memobj *src,
                            kvs_memobj *dst, const kvs_object_key *key);
/* Destroy through the ops table; NULL is a no-op. */
KVS_API void kvs_serializer_destroy(kvs_serializer *ser);
KVS_API void kvs_deserializer_destroy(kvs_deserializer *de);

/* Upstream utils.serialized_layout_desc: the layout of the temporary buffer
 * that serializing an object of `layout` needs: one flat uint8 group of the
 * serializer's estimate. */
KVS_API int kvs_serialized_layout(const kvs_serializer *ser,
                                  const kvs_layout *layout, kvs_layout *out);

/* ---------------------------------------------------------------------
 * Splitting one large object across the processor's workers
 * ---------------------------------------------------------------------
 * A transform that converts items independently (fp8: element i of the
 * source -> byte i of the output) can let the async processor that runs it
 * spread one large object over its idle workers. The serde opts in from
 * inside its serialize / deserialize: it first checks everything that can
 * fail (dtypes, sizes: "refuse before writing" as above), then hands the
 * item-wise work to kvs_serde_parallel_for():
 *
 *     static int encode_range(void *ctx, uint64_t begin, uint64_t end) {
 *         struct job *j = ctx;         // items [begin, end) -> bytes [begin, end)
 *         return my_kernel(j->src + begin * j->isize, j->dst + begin, end - begin);
 *     }
 *     ...validate src and dst, refuse before writing...
 *     rc = kvs_serde_parallel_for(numel, kvs_layout_nbytes(&src->layout),
 *                                 encode_range, &job);
 *
 * Called on one of an async processor's worker threads (while that processor
 * runs this transform), with more than one worker, `nbytes` (the object's
 * size, the unit of the threshold and of the piece size) at least the
 * processor's split threshold (kvs_async_processor_set_split in
 * processor.h, default
 * KVS_SPLIT_DEFAULT_MIN_BYTES) and idle workers to help, it cuts [0, n) into
 * pieces of about the split chunk size (boundaries at multiples of
 * KVS_SPLIT_ALIGN items) that the calling worker and the idle ones claim
 * one at a time; it returns when every piece has finished. Anywhere else
 * (the caller's own thread, one worker, a small object, all workers busy)
 * it is exactly one call fn(ctx, 0, n) on the calling thread. So a serde
 * that uses it behaves the same with or without a processor, and its bytes
 * never depend on the split: the caller must make fn's output for an item
 * depend on that item alone.
 *
 * fn may run on several threads at once, on disjoint ranges; it must not
 * call back into the processor. It returns KVS_OK, or a KVS_E* status with
 * kvs_set_error() (one without a message gets "serde: items [0, 640) failed:
 * I/O error"). kvs_serde_parallel_for returns KVS_OK when every range
 * succeeded; otherwise every range still runs, and it returns the status of
 * the failing range with the lowest begin and sets that range's message on
 * the calling thread (a split failure reads exactly as an unsplit one
 * whenever fn's message does not name positions). n == 0 makes no call.
 * KVS_EINVAL for a NULL fn ("serde: parallel_for: NULL function").
 *
 * Why a function and not extra ops: appending members to the ops tables
 * above would break every positional initializer of them under
 * -Wmissing-field-initializers (-Wextra), in kvserde's own tests and in
 * users' code; a serde opting in through a call changes no table. */

/* Items [begin, end) of one object; see kvs_serde_parallel_for. */
typedef int (*kvs_serde_range_fn)(void *ctx, uint64_t begin, uint64_t end);

/* Piece boundaries (other than 0 and n) are multiples of this many items,
 * so pieces of byte-per-item outputs start on cache-line boundaries. */
#define KVS_SPLIT_ALIGN 64
/* The default threshold: objects of at least this many bytes are split.
 * Measured with bench_processor (fp8, bfloat16, one task at a time, 2
 * workers) on the 2-vCPU AVX-512 KVM machine kvserde is developed on: below
 * 8 MiB splitting loses (0.6-0.9x: waking the second worker and sharing the
 * caches cost more than the halved conversion saves), 16 MiB is a wash for
 * deserialize, from 32 MiB both directions gain (1.0-1.3x at 32 MiB,
 * 1.3-1.5x at 256 MiB). */
#define KVS_SPLIT_DEFAULT_MIN_BYTES ((size_t)32 << 20)
/* The default piece size, in bytes of `nbytes`. Pieces must stay large:
 * the fp8 kernels switch to non-temporal stores when one call writes at
 * least 8 MiB (KVS_FP8_NT_DEFAULT_MIN_BYTES, src/codecs/fp8_kernels.h), and
 * 16 MiB of bfloat16 / float16 writes that much in both directions (float32
 * encode pieces write 4 MiB and take ordinary stores). With 1 MiB pieces a 256 MiB deserialize was
 * 0.8-0.9x of one worker instead of 1.1-1.2x. */
#define KVS_SPLIT_DEFAULT_CHUNK_BYTES ((size_t)16 << 20)

KVS_API int kvs_serde_parallel_for(uint64_t n, uint64_t nbytes,
                                   kvs_serde_range_fn fn, void *ctx);

#ifdef __cplusplus
}
#endif
#endif /* KVSERDE_SERDE_H */
