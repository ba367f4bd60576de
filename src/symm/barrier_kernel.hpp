// The symmetric heap's barrier on a stream in its kernel form: one warp runs
// the device API's barrier over the world. An SM for a few microseconds
// instead of copy engines: about a third of their GPU time, and it can be
// captured in a CUDA graph. It is launched as a programmatic dependent of the
// kernel before it on the stream (compute capability 9.0 and later), so that
// its launch overlaps that kernel's end; docs/symm.md has the numbers.
#pragma once

#include <cuda_runtime.h>

#include "ferry/device/heap.cuh"

namespace ferry {

// Queues the barrier on `stream` (the device of `h`'s rank current). `armed`
// false queues a kernel that returns at once: under lazy module loading a
// kernel's first launch waits for the device, so the heap launches it once
// before any barrier can spin.
cudaError_t launch_barrier_kernel(const device::Heap& h, cudaStream_t stream, bool armed = true);

}  // namespace ferry
