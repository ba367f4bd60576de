// The one kernel in ferry: copying a rank's own block within its GPU. A
// copy-engine copy inside one GPU is far slower than an SM copy (see
// docs/architecture.md), so the local block of an out-of-place collective uses
// this kernel unless the caller asks for the copy engine (no SM at all) or the
// call is in-place (nothing to copy).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "dma/batch_plan.hpp"

namespace ferry {

enum class LocalCopy { kAuto = 0, kCopyEngine = 1, kKernel = 2, kMemcpy = 3 };
// "auto", "ce", "sm" ("memcpy", a plain cudaMemcpyAsync, for measurements only).
LocalCopy parse_local_copy(const std::string& name, const char* what);

void launch_local_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);
// Loads the kernels' module on the current device now. With CUDA's lazy
// loading, the first launch loads it, and loading can wait for the device to
// go idle: a first launch behind an armed (prelaunched) wait then never
// returns. Communicators call this for each of their GPUs at creation.
void load_local_copy_kernels();
// Copies a block within one GPU the way `how` says (kAuto: the kernel).
void copy_local(const Copy& c, LocalCopy how, cudaStream_t stream);

}  // namespace ferry
