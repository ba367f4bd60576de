#include <atomic>

#include "ferry/device/sync.cuh"
#include "ferry/device/team.cuh"
#include "symm/barrier_kernel.hpp"

namespace ferry {
namespace {

// A timeout leaves the fault word; heap.check() raises it naming the peer.
//
// Launched as a programmatic dependent (PDL): the block is made resident while
// the kernel before it on the stream still runs, and waits in
// griddepcontrol.wait until that kernel finished and its writes are visible,
// so the stream's order is kept and only the launch's latency overlaps. It
// lets the next such launch in at once for the same reason: that one waits too.
__global__ void world_barrier_kernel(device::Heap h, bool armed) {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (armed) device::barrier<device::Scope::kWarp>(h, device::world_team(h));
}

// A programmatic launch only where the kernel that runs was compiled for
// compute capability 9.0 or later: an older build (PTX JIT-compiled on a
// Hopper) has no griddepcontrol.wait, and would not wait for the kernel
// before it.
bool programmatic_launch(int device) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> ptx[kMaxDevices] = {};  // 0: not asked yet
  if (device < 0 || device >= kMaxDevices) return false;
  int v = ptx[device].load(std::memory_order_relaxed);
  if (v == 0) {
    cudaFuncAttributes attr{};
    if (cudaFuncGetAttributes(&attr, world_barrier_kernel) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    v = attr.ptxVersion;
    ptx[device].store(v, std::memory_order_relaxed);
  }
  return v >= 90;
}

}  // namespace

cudaError_t launch_barrier_kernel(const device::Heap& h, cudaStream_t stream, bool armed) {
  int device = -1;
  if (cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  config.stream = stream;
  cudaLaunchAttribute attribute = {};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  if (programmatic_launch(device)) {
    config.attrs = &attribute;
    config.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&config, world_barrier_kernel, h, armed);
}

}  // namespace ferry
