/* pipeline_internal.h - internal: the knob and the counter of pipeline.c
 * that tests and bench_pipeline use. Not part of the API. */
#ifndef KVSERDE_FRAME_PIPELINE_INTERNAL_H
#define KVSERDE_FRAME_PIPELINE_INTERNAL_H

#include <stdint.h>

#include "kvserde/serde.h"

/* Output bytes per fused block (pipeline.c: the typed stage writes a block,
 * the checksum and the encryption run over it while it is in cache).
 * Default 256 KiB; bench_pipeline --fuse-kib changes it (before any thread
 * serializes) to measure other sizes. 0 means the default. */
extern uint64_t kvs_pipeline_fuse_block;

/* Scratch buffers the pipeline deserializer `de` has allocated so far (a
 * decode that reuses a kept buffer allocates none). */
uint64_t kvs_pipeline_scratch_allocs(kvs_deserializer *de);

#endif /* KVSERDE_FRAME_PIPELINE_INTERNAL_H */
