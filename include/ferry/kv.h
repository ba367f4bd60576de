/* ferry: paged KV-cache transfers between host and GPU memory (C API).
 *
 * A side of a transfer (source or destination) is an array of regions that
 * share one page mapping: region r holds page p at base + p * page_stride,
 * page_bytes long and contiguous (one tensor whose first dimension is the page
 * is one region; per-layer or per-K/V tensors are one region each).
 * ferry_kv_copy_blocks copies page src_ids[i] to page dst_ids[i] in every
 * region pair, ordered in `stream` like cudaMemcpyAsync: work enqueued there
 * later sees the pages, and the copies see all earlier work. Host memory must
 * be pinned (a ferry_host_pool_t, cudaHostAlloc, cudaHostRegister); pageable
 * memory is refused with the reason. Bad indices (out of range, negative, a
 * destination page twice), memory the call would write through two pages or
 * write and read (a region given twice, regions that overlap), mismatched
 * page sizes and pageable memory return FERRY_ERROR_INVALID_ARGUMENT and a
 * message naming the argument; nothing is copied then. See docs/kv.md for
 * which mode to use when.
 */
#ifndef FERRY_KV_H_
#define FERRY_KV_H_

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  void* base;         /* page 0 of this region (host or GPU memory) */
  size_t page_stride; /* bytes from one page to the next */
  size_t page_bytes;  /* bytes of one page (equal for paired regions) */
  size_t pages;       /* valid indices are 0 .. pages - 1 */
} ferry_kv_region_t;

typedef enum {
  FERRY_KV_AUTO = 0,     /* ferry's table for this GPU picks per direction and page size */
  FERRY_KV_PER_PAGE = 1, /* one cudaMemcpyAsync per page (the baseline) */
  FERRY_KV_BATCHED = 2,  /* cudaMemcpyBatchAsync in bounded batches, runs of adjacent pages merged */
  FERRY_KV_STREAMS = 3,  /* the batched copies spread over several of ferry's streams */
  FERRY_KV_KERNEL = 4    /* an SM kernel gathering the pages (takes SMs) */
} ferry_kv_mode_t;

enum {
  FERRY_KV_ZERO_SM = 1u,        /* never launch a kernel (AUTO picks among copy-engine modes); refused within one
                                   GPU, where CUDA copies on SMs */
  FERRY_KV_URGENT = 2u,         /* run on ferry's highest-priority stream, after the work queued on `stream` */
  FERRY_KV_SETTLED_SOURCE = 4u, /* nothing queued before still writes the host source (fetches only) */
  FERRY_KV_SLICED = 8u,         /* copy-engine work in slices of FERRY_KV_SLICE_BYTES, at most 2 on the copy
                                   engine at a time: an urgent fetch from another stream waits for that much at most */
  FERRY_KV_UNPITCHED = 16u      /* copy every region's page by itself, even where regions lie at one stride in
                                   one allocation on both sides (by default such a page's regions go as the rows
                                   of one pitched copy: up to FERRY_KV_PITCHED_ROW_BYTES a page, or at any width
                                   where they lie end to end on one side, as in a page-first layout) */
};

/* Copies `count` pages on GPU `device` (where the GPU side lives). */
FERRY_API ferry_result_t ferry_kv_copy_blocks(int device, const ferry_kv_region_t* dst, const ferry_kv_region_t* src,
                                              size_t regions, const int64_t* dst_ids, const int64_t* src_ids,
                                              size_t count, ferry_kv_mode_t mode, unsigned flags,
                                              ferry_stream_t stream);

/* A transfer planned once and enqueued ahead behind a gate, released later:
 * on the critical path only the copies remain (docs/kv.md, "Prepared
 * transfers"). Copy engines only: mode FERRY_KV_BATCHED (batched copies),
 * FERRY_KV_STREAMS (the same: one stream waits on the gate) or
 * FERRY_KV_PER_PAGE; FERRY_KV_AUTO and FERRY_KV_KERNEL are refused. flags: FERRY_KV_UNPITCHED, and FERRY_KV_ZERO_SM,
 * which a prepared transfer always is; the other flags are refused. The
 * index lists are read during the call. A transfer within one GPU is refused
 * (CUDA copies there on SMs). At most FERRY_KV_ARMED_MAX (512) host calls
 * may wait behind the gate; a larger transfer is refused with the count.
 *
 *   ferry_kv_prepare(...)              plan and check once
 *   ferry_kv_prepared_arm(t, s)        enqueue behind the gate, after the work so far on s
 *   ferry_kv_prepared_trigger(t)       open it from the host, or
 *   ferry_kv_prepared_trigger_on(t, s) in stream order (a stream memory write, no kernel), or
 *   ferry_kv_prepared_device_trigger   (word, value) for a kernel to store (ferry/device.cuh)
 *   ferry_kv_prepared_wait(t, s)       s waits for the pages
 * Re-arm after each trigger. Armed again before an earlier run's trigger,
 * handed to a stream or a kernel, has landed, where those runs and this one
 * would pass what the stream's queue takes, ferry_kv_prepared_arm waits for
 * that trigger first and returns FERRY_ERROR_TIMEOUT at FERRY_TIMEOUT_S.
 * Destroying an armed transfer opens its gate, so that its stream never
 * waits forever: queued copies cannot be withdrawn. */
typedef struct ferry_kv_prepared* ferry_kv_prepared_t;
FERRY_API ferry_result_t ferry_kv_prepare(int device, const ferry_kv_region_t* dst, const ferry_kv_region_t* src,
                                          size_t regions, const int64_t* dst_ids, const int64_t* src_ids, size_t count,
                                          ferry_kv_mode_t mode, unsigned flags, ferry_kv_prepared_t* prepared);
FERRY_API ferry_result_t ferry_kv_prepared_arm(ferry_kv_prepared_t prepared, ferry_stream_t after);
FERRY_API ferry_result_t ferry_kv_prepared_trigger(ferry_kv_prepared_t prepared);
FERRY_API ferry_result_t ferry_kv_prepared_trigger_on(ferry_kv_prepared_t prepared, ferry_stream_t stream);
FERRY_API ferry_result_t ferry_kv_prepared_device_trigger(ferry_kv_prepared_t prepared, ferry_trigger_t* trigger);
/* Makes `stream` wait for the last armed run's copies. */
FERRY_API ferry_result_t ferry_kv_prepared_wait(ferry_kv_prepared_t prepared, ferry_stream_t stream);
/* Host wait for the last armed run, at most timeout_s; FERRY_ERROR_TIMEOUT
 * says whether the gate was ever opened. */
FERRY_API ferry_result_t ferry_kv_prepared_synchronize(ferry_kv_prepared_t prepared, double timeout_s);
/* The bytes the transfer moves and the copies it makes, adjacent pages merged
 * and a page's pitched copy counted once (either pointer may be NULL). */
FERRY_API ferry_result_t ferry_kv_prepared_sizes(ferry_kv_prepared_t prepared, size_t* bytes, size_t* copies);
/* Opens an armed transfer's gate and waits (at most FERRY_TIMEOUT_S) until
 * its stream is past it; the handle is gone after the call (NULL: nothing to
 * do, FERRY_SUCCESS, as for every destroy function). */
FERRY_API ferry_result_t ferry_kv_prepared_destroy(ferry_kv_prepared_t prepared);

/* Pinned host memory for KV pages, mapped for the GPU and placed on its NUMA
 * node (mmap + cudaHostRegister from 64 MiB, huge pages where available). */
typedef struct ferry_host_pool* ferry_host_pool_t;
FERRY_API ferry_result_t ferry_host_pool_create(size_t bytes, int device, ferry_host_pool_t* pool);
FERRY_API void* ferry_host_pool_data(ferry_host_pool_t pool);
/* Refused (FERRY_ERROR_INVALID_ARGUMENT) while a transfer touching the pool is
 * in flight, or a prepared transfer over it is not destroyed yet; the pool
 * stays valid then. While another prepared transfer is
 * armed and not yet triggered, the memory is freed later, once none is
 * (freeing pinned memory waits for every stream of the GPU). */
FERRY_API ferry_result_t ferry_host_pool_destroy(ferry_host_pool_t pool);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_KV_H_ */
