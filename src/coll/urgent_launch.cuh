// How ferry launches its kernels (the local copy, the reductions). They run
// beside the user's compute, and the collective's stream waits for them: at
// normal priority their blocks are dispatched only after the blocks a long
// GEMM has already queued, and the collective stalls behind the GEMM. At the
// device's highest priority they take the next free SM instead.
// FERRY_URGENT_KERNELS=0 launches them at normal priority (for comparison).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/env.hpp"
#include "core/error.hpp"

namespace ferry {

inline int urgent_kernel_priority() {
  static const int priority = [] {
    if (knob_int("FERRY_URGENT_KERNELS") == 0) return 0;
    int least = 0, greatest = 0;
    FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    return greatest;
  }();
  return priority;
}

template <typename... Params, typename... Args>
void launch_urgent(void (*kernel)(Params...), int blocks, int threads, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.stream = stream;
  cudaLaunchAttribute priority{};
  priority.id = cudaLaunchAttributePriority;
  priority.val.priority = urgent_kernel_priority();
  config.attrs = &priority;
  config.numAttrs = 1;
  FERRY_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

}  // namespace ferry
