#include "core/error.hpp"
#include "ferry/device.cuh"
#include "trigger_kernel.hpp"

namespace ferry {
namespace {

__global__ void spin_then_trigger(ferry_trigger_t t, long long spin_ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (static_cast<long long>(now - start) < spin_ns);
  ferry_device_trigger_fire(t);
}

}  // namespace

void launch_trigger_kernel(uint64_t* word, uint64_t value, long long spin_ns, cudaStream_t stream) {
  ferry_trigger_t t{reinterpret_cast<unsigned long long*>(word), value};
  spin_then_trigger<<<1, 1, 0, stream>>>(t, spin_ns);
  FERRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ferry
