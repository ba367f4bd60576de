// A kernel that computes for a while and then triggers a prepared collective
// from the device, the way a user's GEMM would at its end. Used by the tests
// and by `ferry bench --prelaunch` to measure device-triggered prelaunch; it is
// also the worked example of include/ferry/device.cuh.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry {

void launch_trigger_kernel(uint64_t* word, uint64_t value, long long spin_ns, cudaStream_t stream);

}  // namespace ferry
