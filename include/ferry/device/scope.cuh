/* Which threads take part in a device call: one thread, a whole warp (all 32
 * lanes, converged: warp scope needs blocks of whole warps), or a whole block
 * (every thread). Warp and block calls
 * split the work among their threads and return to all of them together. */
#ifndef FERRY_DEVICE_SCOPE_CUH_
#define FERRY_DEVICE_SCOPE_CUH_

namespace ferry {
namespace device {

enum class Scope { kThread, kWarp, kBlock };

namespace impl {

__device__ __forceinline__ unsigned block_thread() {
  return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
}
template <Scope S>
__device__ __forceinline__ unsigned scope_lane() {
  if constexpr (S == Scope::kThread) return 0;
  if constexpr (S == Scope::kWarp) return block_thread() % 32;
  return block_thread();
}
template <Scope S>
__device__ __forceinline__ unsigned scope_size() {
  if constexpr (S == Scope::kThread) return 1;
  if constexpr (S == Scope::kWarp) return 32;
  return blockDim.x * blockDim.y * blockDim.z;
}
template <Scope S>
__device__ __forceinline__ void scope_sync() {
  if constexpr (S == Scope::kWarp) __syncwarp();
  if constexpr (S == Scope::kBlock) __syncthreads();
}

}  // namespace impl
}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_SCOPE_CUH_ */
