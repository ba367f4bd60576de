/* ferry: multipath host<->GPU copies (C API).
 *
 * A multipath engine splits a large copy between pinned host memory and a GPU
 * into chunks that travel over several GPUs' host links at once, relayed
 * through peer GPUs over NVLink, on copy engines only (no kernel). A copy is
 * ordered in `stream` like cudaMemcpyAsync: it starts when the stream gets to
 * it, and work enqueued there later sees all of it. Copies below the engine's
 * threshold, of pageable memory, made while the stream captures a CUDA graph,
 * or with no GPU that may relay run as one cudaMemcpyAsync (FERRY_DEBUG=1
 * prints why). An error a copy met (a CUDA error, a copy that did not land in
 * time) is returned by the next call (FERRY_ERROR_BROKEN): every stream was
 * let go and every copy not complete then is invalid. See docs/multipath.md.
 */
#ifndef FERRY_MULTIPATH_H_
#define FERRY_MULTIPATH_H_

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_multipath* ferry_multipath_t;

/* Zero in a field: its default. */
typedef struct {
  size_t chunk_bytes; /* largest chunk, the staging buffers' size (FERRY_MULTIPATH_CHUNK_BYTES) */
  size_t min_bytes;   /* smallest copy that goes multipath (FERRY_MULTIPATH_MIN_BYTES) */
  int outstanding;    /* chunks in flight per link (3) */
  int relay_first;    /* 1: a link may relay before serving its own GPU's copies (0: its own first) */
  double timeout_s;   /* bound on a copy once its stream got to it, at most 1e6 s (0: FERRY_TIMEOUT_S) */
  int relays_idle;    /* 1: a GPU relays only while no other program runs on it (NVML; 0: every GPU relays) */
} ferry_multipath_options_t;

/* An engine over the host links of `devices` (count GPUs; NULL and 0: every
 * visible GPU), every one of which may relay. A GPU listed again adds a relay
 * through that same GPU: a testing mode on one GPU, where chunks, staging and
 * reassembly run for real over its one link. `options` may be NULL. */
FERRY_API ferry_result_t ferry_multipath_create(const int* devices, int count, const ferry_multipath_options_t* options,
                                                ferry_multipath_t* engine);
/* Copies `bytes` from `src` to `dst` (one pinned or pageable host memory, the
 * other GPU memory) in `stream`'s order; returns at once. A default stream
 * (0, cudaStreamLegacy, cudaStreamPerThread) is the current GPU's, as in
 * cudaMemcpyAsync. `multipath` (may be
 * NULL) is set to 1 where the copy went over several links, 0 where it ran as
 * one plain copy. */
FERRY_API ferry_result_t ferry_multipath_copy(ferry_multipath_t engine, void* dst, const void* src, size_t bytes,
                                              ferry_stream_t stream, int* multipath);
/* `count` copies (dsts[i] <- srcs[i], sizes[i] bytes), all host to one GPU or
 * all from one GPU to host, as one copy in `stream`'s order: one start, one
 * finish, the links kept busy across them (e.g. every weight of a model).
 * Destinations may not overlap. Below the threshold in total, each runs as
 * one cudaMemcpyAsync. */
FERRY_API ferry_result_t ferry_multipath_copy_batch(ferry_multipath_t engine, void* const* dsts,
                                                    const void* const* srcs, const size_t* sizes, size_t count,
                                                    ferry_stream_t stream, int* multipath);
/* As cudaMemcpy: the copy on the legacy default stream of the current GPU,
 * returning once that stream has passed it. */
FERRY_API ferry_result_t ferry_multipath_copy_sync(ferry_multipath_t engine, void* dst, const void* src, size_t bytes,
                                                   int* multipath);
/* Waits (bounded by the timeout) until every multipath copy so far landed. */
FERRY_API ferry_result_t ferry_multipath_synchronize(ferry_multipath_t engine);
/* Waits (bounded) for copies in flight and frees the engine (its memory later,
 * once no prepared transfer or collective is armed and not yet triggered).
 * Returns FERRY_ERROR_BROKEN, the engine freed all the same, when a copy
 * failed and no earlier call returned that error. */
FERRY_API ferry_result_t ferry_multipath_destroy(ferry_multipath_t engine);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_MULTIPATH_H_ */
