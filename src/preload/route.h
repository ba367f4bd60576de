/* Which cudaMemcpy / cudaMemcpyAsync calls the LD_PRELOAD library hands to the
 * multipath engine: pure, C, tested on the CPU (tests/cpu/test_preload_route.cpp).
 * The engine itself then checks that one side is pinned host memory and the
 * other GPU memory, and runs anything else as the plain copy. */
#ifndef FERRY_PRELOAD_ROUTE_H_
#define FERRY_PRELOAD_ROUTE_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "ferry/ferry.h"

/* 1 where the copy may go multipath: host<->device (or left to the pointers,
 * cudaMemcpyDefault) and at least `min_bytes`. */
static inline int ferry_preload_routes(size_t count, enum cudaMemcpyKind kind, size_t min_bytes) {
  if (count == 0 || count < min_bytes) return 0;
  return kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDefault;
}

/* FERRY_MULTIPATH_MIN_BYTES as the preload library reads it (no knob table
 * there): a non-negative integer, else `fallback`. 0 routes every nonzero
 * copy, as it does for the engine's own knob. */
static inline size_t ferry_preload_min_bytes(const char* text, size_t fallback) {
  if (!text || !*text) return fallback;
  size_t v = 0;
  for (const char* p = text; *p; ++p) {
    if (*p < '0' || *p > '9') return fallback;
    const size_t d = (size_t)(*p - '0');
    if (v > (SIZE_MAX - d) / 10) return fallback; /* past 64 bits: no value (the engine refuses it too) */
    v = v * 10 + d;
  }
  return v;
}

/* The CUDA error a copy the engine took and failed returns to the program:
 * the nearest CUDA meaning of ferry's result (the engine's message goes to
 * stderr). A CUDA error inside the engine is usually sticky, and the
 * program's own next call reports it by name. */
static inline cudaError_t ferry_preload_cuda_error(ferry_result_t r) {
  switch (r) {
    case FERRY_SUCCESS:
      return cudaSuccess;
    case FERRY_ERROR_TIMEOUT:
      return cudaErrorTimeout; /* a chunk that did not land in time */
    case FERRY_ERROR_OUT_OF_MEMORY:
      return cudaErrorMemoryAllocation;
    case FERRY_ERROR_NO_GPU:
      return cudaErrorNoDevice;
    case FERRY_ERROR_UNSUPPORTED:
      return cudaErrorNotSupported;
    case FERRY_ERROR_INVALID_ARGUMENT:
      return cudaErrorInvalidValue;
    default:
      return cudaErrorUnknown;
  }
}

#endif /* FERRY_PRELOAD_ROUTE_H_ */
