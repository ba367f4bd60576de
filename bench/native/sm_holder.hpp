// A kernel that occupies every SM of a GPU until released. The GPU tests use
// it to check which of ferry's paths need no SM: a copy-engine collective
// with copy signals and no own block to copy must finish while it runs;
// anything that launches a kernel (signal rounds by kernel, a local copy, a
// reduction, the SM path) must wait for its release. bench/probes/sm_free.cu
// measured the same for single submissions once; the tests keep checking it.
#pragma once

#include <cuda_runtime_api.h>

namespace ferry {

class SmHolder {
 public:
  SmHolder();  // for the current device
  ~SmHolder();
  SmHolder(const SmHolder&) = delete;
  SmHolder& operator=(const SmHolder&) = delete;

  // Fills every SM's thread slots with spinning blocks on `stream` (nothing
  // else fits beside them) and returns once all of them run. They spin until
  // release() or for `max_s` seconds. Throws if they are not all resident
  // within 5 s (something else holds SMs).
  void hold(cudaStream_t stream, double max_s);
  void release();
  int blocks() const { return blocks_; }

 private:
  int device_ = 0;
  int blocks_ = 0;
  cudaStream_t stream_ = nullptr;
  volatile int* words_ = nullptr;  // [0]: release; [1 + b]: block b runs (pinned, mapped)
};

}  // namespace ferry
