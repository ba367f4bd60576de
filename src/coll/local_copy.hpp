// The one kernel in ferry: copying a rank's own block within its GPU. CUDA
// runs a copy within one GPU on SMs whichever call makes it (cudaMemcpyAsync,
// the batched call with the copy-engine hint, a graph's memcpy node: measured
// by bench/probes/sm_free.cu, docs/architecture.md), so the local block of an
// out-of-place collective needs SMs either way. ferry's kernel takes a bounded
// share of them (32 blocks); "driver" hands the copy to CUDA's own kernel,
// which spreads it over every SM for a shorter time. In-place calls copy
// nothing.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "dma/batch_plan.hpp"

namespace ferry {

// kPeer: no copy within the GPU at all; the block is read back from a peer
// that the collective sent it to (Exchange::local_pull), on a copy engine.
enum class LocalCopy { kAuto = 0, kDriver = 1, kKernel = 2, kPeer = 3 };
// "auto", "driver", "sm", "peer".
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
