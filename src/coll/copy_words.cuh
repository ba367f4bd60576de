// The inner loop of ferry's copy kernels: 16-byte words, several loads in
// flight per thread before their stores (one load at a time leaves a thread
// waiting on memory latency). Used grid-wide by the local copy kernel and
// block-wide by the SM path.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace ferry {

// Copies words [i, n) that belong to this thread: groups of kUnroll words
// `lane_step` apart, the next group `group_step` further. The last, partial
// group is copied word by word (later groups start past n). kStreaming:
// evict-first loads and stores, for data read and written once.
template <int kUnroll, bool kStreaming>
__device__ inline void copy_words(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n, size_t i,
                                  size_t lane_step, size_t group_step) {
  auto load = [](const uint4* p) {
    if constexpr (kStreaming)
      return __ldcs(p);
    else
      return *p;
  };
  auto store = [](uint4* p, uint4 v) {
    if constexpr (kStreaming)
      __stcs(p, v);
    else
      *p = v;
  };
  for (; i + (kUnroll - 1) * lane_step < n; i += group_step) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = load(src + i + u * lane_step);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) store(dst + i + u * lane_step, v[u]);
  }
  for (; i < n; i += lane_step) store(dst + i, load(src + i));
}

}  // namespace ferry
