/* Ordering and synchronization on the symmetric heap.
 *
 *   fence()              this thread's earlier puts and atomics to each peer land before its later ones to that peer
 *   quiet()              this thread's earlier puts and atomics have landed and are visible to every peer
 *   barrier<S>(h, team)  quiet, then wait until every member of `team` reached the same barrier
 *   sync<S>(h, team)     the same without the quiet (orders execution, not memory)
 *
 * barrier and sync are collective over the team's members: each calls them the
 * same number of times, in the same order with respect to every other team
 * they share members with. One scope per rank calls them at a time. Each wait
 * is bounded by h.timeout_ns: on timeout the call returns false and leaves the
 * fault word naming the member it waited for (the host raises it: heap.check()).
 * A team this rank is not a member of, or that does not fit the heap, returns
 * false at once and leaves WaitKind::kBadTeam. */
#ifndef FERRY_DEVICE_SYNC_CUH_
#define FERRY_DEVICE_SYNC_CUH_

#include "ferry/device/heap.cuh"
#include "ferry/device/impl/spin.cuh"
#include "ferry/device/scope.cuh"
#include "ferry/device/team.cuh"

namespace ferry {
namespace device {

__device__ __forceinline__ void fence() { __threadfence_system(); }
__device__ __forceinline__ void quiet() { __threadfence_system(); }

namespace impl {

/* One thread's part of sync(): announce to every member, then wait for each. */
__device__ inline bool sync_members(const Heap& h, const Team& t) {
  if (!team_usable(t, h.world) || team_world_rank(t, t.my) != h.rank) {
    report(h, WaitKind::kBadTeam, -1);
    return false;
  }
  HeapSync* own = h.sync(h.rank);
  // The scope's other threads synchronized with this one before it got here;
  // the fence makes their earlier stores precede the announcements too.
  __threadfence_system();
  for (int i = 0; i < t.size; ++i) {
    const int peer = team_world_rank(t, i);
    if (peer != h.rank) atomicAdd_system(reinterpret_cast<unsigned long long*>(&h.sync(peer)->arrivals[h.rank]), 1ull);
  }
  bool ok = true;
  for (int i = 0; i < t.size && ok; ++i) {
    const int peer = team_world_rank(t, i);
    if (peer == h.rank) continue;
    const uint64_t want = ++own->completed[peer];
    ok = spin(
        h, [&] { return load_acquire(&own->arrivals[peer]) >= want; }, WaitKind::kBarrier, peer);
  }
  return ok;
}

}  // namespace impl

template <Scope S = Scope::kThread>
__device__ inline bool sync(const Heap& h, const Team& t) {
  __shared__ int ok_shared;
  bool ok = true;
  impl::scope_sync<S>();
  if (impl::scope_lane<S>() == 0) ok = impl::sync_members(h, t);
  if constexpr (S == Scope::kThread) return ok;
  if constexpr (S == Scope::kWarp) {
    const bool all = __shfl_sync(0xffffffffu, ok ? 1 : 0, 0) != 0;
    __syncwarp();  // a shuffle orders no memory: the other lanes' later loads follow lane 0's acquire
    return all;
  }
  if (impl::scope_lane<S>() == 0) ok_shared = ok;
  __syncthreads();
  return ok_shared != 0;
}

template <Scope S = Scope::kThread>
__device__ inline bool barrier(const Heap& h, const Team& t) {
  quiet();
  return sync<S>(h, t);
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_SYNC_CUH_ */
