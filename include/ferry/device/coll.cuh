/* Collectives over a team, run by whole grids: every block of a kernel on
 * every member calls them, with the same grid size (at most kMaxGridBlocks
 * blocks) and the same arguments, and the blocks split the work.
 *
 *   barrier_all(h, team)                                   every block of every member arrived
 *   broadcast(h, team, dst, src, count, root)              root's src into every member's dst
 *   fcollect(h, team, dst, src, count)                     all-gather: member i's src into dst[i * count ...]
 *   alltoall(h, team, dst, src, count)                     member i's src[j * count ...] into member j's dst[i * count
 * ...] reduce(h, team, dst, src, count, op, root)             root's dst = op over members' src all_reduce(h, team,
 * dst, src, count, op)               every member's dst = op over members' src reduce_scatter(h, team, dst, src, count,
 * op)           member i's dst = op over members' src[i * count ...]
 *
 * dst and src are on the heap (the same objects on every member) and do not
 * overlap; root is a team rank. T: float, __half, __nv_bfloat16, int32_t (reductions; halves
 * add in float), any trivially copyable T for the others. Each call starts
 * and ends with barrier_all: on return dst is complete here and src may be
 * written again. Returns false when a wait gave up (h.timeout_ns; heap.check()
 * names the peer) or the grid is larger than kMaxGridBlocks; dst is then
 * undefined, and the heap's barrier words are out of step: close the heap (a
 * later barrier could pass early). Pushes (broadcast, fcollect, alltoall) are stores over NVLink
 * from SMs; reductions read every member's src. */
#ifndef FERRY_DEVICE_COLL_CUH_
#define FERRY_DEVICE_COLL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "ferry/device/heap.cuh"
#include "ferry/device/impl/spin.cuh"
#include "ferry/device/rma.cuh"
#include "ferry/device/team.cuh"

namespace ferry {
namespace device {

enum class ReduceOp { kSum, kMax, kMin };

namespace impl {

__device__ __forceinline__ unsigned grid_blocks() { return gridDim.x * gridDim.y * gridDim.z; }
__device__ __forceinline__ unsigned grid_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

/* Thread 0 of each block: every block of this rank's grid arrived (a
 * generation barrier, so grids of any size may follow each other). */
__device__ inline bool local_grid_sync(const Heap& h) {
  HeapSync* own = h.sync(h.rank);
  auto* count = reinterpret_cast<unsigned long long*>(&own->grid_local_count);
  const uint64_t gen = load_acquire(&own->grid_local_generation);
  __threadfence_system();
  if (atomicAdd(count, 1ull) == grid_blocks() - 1) {
    __threadfence();  // acquire the other blocks' arrivals before releasing the generation
    *reinterpret_cast<volatile uint64_t*>(count) = 0;
    store_release(&own->grid_local_generation, gen + 1);
    return true;
  }
  return spin(
      h, [&] { return load_acquire(&own->grid_local_generation) != gen; }, WaitKind::kBarrier, h.rank);
}

/* Thread 0 of one block: every block of this rank arrived; then this block
 * meets the same block of every other member, each of which passed the same
 * two steps there. Counters are per (peer, block): they stay in step because
 * every member runs the same grid. */
__device__ inline bool grid_sync_block(const Heap& h, const Team& t) {
  const unsigned me_block = grid_block();
  if (grid_blocks() > unsigned(kMaxGridBlocks) || !team_usable(t, h.world) || team_world_rank(t, t.my) != h.rank) {
    report(h, WaitKind::kBadTeam, -1);
    return false;
  }
  if (!local_grid_sync(h)) return false;
  HeapSync* own = h.sync(h.rank);
  __threadfence_system();
  for (int i = 0; i < t.size; ++i) {
    const int peer = team_world_rank(t, i);
    if (peer == h.rank) continue;
    const uint64_t round = ++own->grid_rounds[peer][me_block];
    store_release(&h.sync(peer)->grid_arrivals[h.rank][me_block], round);
  }
  for (int i = 0; i < t.size; ++i) {
    const int peer = team_world_rank(t, i);
    if (peer == h.rank) continue;
    const uint64_t round = own->grid_rounds[peer][me_block];
    if (!spin(
            h, [&] { return load_acquire(&own->grid_arrivals[peer][me_block]) >= round; }, WaitKind::kBarrier, peer))
      return false;
  }
  return true;
}

/* [begin, end) of `count` items for this block. */
__device__ __forceinline__ void block_slice(uint64_t count, uint64_t* begin, uint64_t* end) {
  const uint64_t blocks = grid_blocks(), b = grid_block();
  const uint64_t per = (count + blocks - 1) / blocks;
  *begin = per * b < count ? per * b : count;
  *end = *begin + per < count ? *begin + per : count;
}

template <class T>
struct Acc {
  using type = T;
  static __device__ __forceinline__ type in(T v) { return v; }
  static __device__ __forceinline__ T out(type v) { return v; }
};
template <>
struct Acc<__half> {
  using type = float;
  static __device__ __forceinline__ float in(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half out(float v) { return __float2half(v); }
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
  static __device__ __forceinline__ float in(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 out(float v) { return __float2bfloat16(v); }
};

template <class A>
__device__ __forceinline__ A combine(A a, A b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kMax:
      return a > b ? a : b;
    default:
      return a < b ? a : b;
  }
}

/* dst[i] = op over members m of (m's copy of src)[i], for this block's slice of [0, count). */
template <class T>
__device__ inline void reduce_slice(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count, ReduceOp op) {
  using A = typename Acc<T>::type;
  uint64_t begin, end;
  block_slice(count, &begin, &end);
  const unsigned lane = scope_lane<Scope::kBlock>(), lanes = scope_size<Scope::kBlock>();
  for (uint64_t i = begin + lane; i < end; i += lanes) {
    A acc = Acc<T>::in(h.peer_ptr(src, team_world_rank(t, 0))[i]);
    for (int m = 1; m < t.size; ++m) acc = combine(acc, Acc<T>::in(h.peer_ptr(src, team_world_rank(t, m))[i]), op);
    dst[i] = Acc<T>::out(acc);
  }
}

/* This block's slice of `bytes` from src into `peer`'s copy of dst. */
__device__ inline void push_slice(const Heap& h, char* dst, const char* src, uint64_t bytes, int peer) {
  uint64_t begin, end;
  block_slice(bytes, &begin, &end);
  if (end > begin) copy_bytes<Scope::kBlock>(h.peer_ptr(dst + begin, peer), src + begin, end - begin);
}

}  // namespace impl

/* Every block of every member of the team arrived (and its earlier stores landed). */
__device__ inline bool barrier_all(const Heap& h, const Team& t) {
  __shared__ int ok;
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) ok = impl::grid_sync_block(h, t);
  __syncthreads();
  return ok != 0;
}

template <class T>
__device__ inline bool broadcast(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count, int root) {
  if (!barrier_all(h, t)) return false;
  if (t.my == root)
    for (int m = 0; m < t.size; ++m)
      impl::push_slice(h, reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src), count * sizeof(T),
                       team_world_rank(t, m));
  return barrier_all(h, t);
}

template <class T>
__device__ inline bool fcollect(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count) {
  if (!barrier_all(h, t)) return false;
  for (int k = 0; k < t.size; ++k) {
    const int m = (t.my + k) % t.size;  // every member starts with a different peer
    impl::push_slice(h, reinterpret_cast<char*>(dst + uint64_t(t.my) * count), reinterpret_cast<const char*>(src),
                     count * sizeof(T), team_world_rank(t, m));
  }
  return barrier_all(h, t);
}

template <class T>
__device__ inline bool alltoall(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count) {
  if (!barrier_all(h, t)) return false;
  for (int k = 0; k < t.size; ++k) {
    const int m = (t.my + k) % t.size;
    impl::push_slice(h, reinterpret_cast<char*>(dst + uint64_t(t.my) * count),
                     reinterpret_cast<const char*>(src + uint64_t(m) * count), count * sizeof(T),
                     team_world_rank(t, m));
  }
  return barrier_all(h, t);
}

template <class T>
__device__ inline bool reduce(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count, ReduceOp op,
                              int root) {
  if (!barrier_all(h, t)) return false;
  if (t.my == root) impl::reduce_slice(h, t, dst, src, count, op);
  return barrier_all(h, t);
}

template <class T>
__device__ inline bool all_reduce(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count, ReduceOp op) {
  if (!barrier_all(h, t)) return false;
  impl::reduce_slice(h, t, dst, src, count, op);
  return barrier_all(h, t);
}

template <class T>
__device__ inline bool reduce_scatter(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count, ReduceOp op) {
  if (!barrier_all(h, t)) return false;
  // Read the members' block t.my; write it to this rank's dst. reduce_slice reads
  // src + i through peer_ptr, so shift src to the block first.
  impl::reduce_slice(h, t, dst, src + uint64_t(t.my) * count, count, op);
  return barrier_all(h, t);
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_COLL_CUH_ */
