/* Ordering and synchronization on the symmetric heap.
 *
 *   fence()              this thread's earlier puts and atomics to each peer land before its later ones to that peer
 *   quiet()              this thread's earlier puts and atomics have landed and are visible to every peer
 *   barrier<S>(h, team)  quiet, then wait until every member of `team` reached the same barrier
 *   sync<S>(h, team)     the same as barrier: the release each announcement needs is the quiet's fence
 *
 * The barrier's quiet is the scope's, not each thread's: the stores every
 * thread of the scope made before it are visible to every member once that
 * member's barrier returns. A thread that afterwards tells a peer something
 * with a relaxed atomic (which orders nothing) calls quiet() first.
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
#include "ferry/device/impl/meet.cuh"
#include "ferry/device/impl/spin.cuh"
#include "ferry/device/scope.cuh"
#include "ferry/device/team.cuh"

namespace ferry {
namespace device {

__device__ __forceinline__ void fence() { __threadfence_system(); }
__device__ __forceinline__ void quiet() { __threadfence_system(); }

namespace impl {

/* The scope's lanes meet the team's other members: each rank counts the
 * barriers it did with each peer (completed[peer]) and announces that count
 * in the peer's arrivals[rank]. */
__device__ inline bool sync_members(const Heap& h, const Team& t, unsigned lane, unsigned lanes) {
  if (!team_usable(t, h.world) || team_world_rank(t, t.my) != h.rank) {
    if (lane == 0) report(h, WaitKind::kBadTeam, -1);
    return false;
  }
  HeapSync* own = h.sync(h.rank);
  return meet_members(
      h, t, lane, lanes, [&](int peer) -> uint64_t& { return own->completed[peer]; },
      [&](int r, int from) { return &h.sync(r)->arrivals[from]; });
}

}  // namespace impl

template <Scope S = Scope::kThread>
__device__ inline bool sync(const Heap& h, const Team& t) {
  impl::scope_sync<S>();
  if constexpr (S == Scope::kThread) return impl::sync_members(h, t, 0, 1);
  if constexpr (S == Scope::kWarp) {
    const bool ok = impl::sync_members(h, t, impl::scope_lane<S>(), 32);
    const bool all = __all_sync(0xffffffffu, ok);
    __syncwarp();  // a vote orders no memory: every lane's later loads follow every lane's acquire
    return all;
  }
  // A block: its first warp's lanes take a peer each; one block barrier
  // both ends the wait and tells every thread whether a lane failed.
  const unsigned lane = impl::scope_lane<S>(), size = impl::scope_size<S>();
  const bool failed = lane < 32 && !impl::sync_members(h, t, lane, size < 32 ? size : 32);
  return __syncthreads_or(failed) == 0;
}

/* The quiet is the fence each announcing lane makes after the scope met
 * (sync_members): one fence on the way, not one per thread and another per lane. */
template <Scope S = Scope::kThread>
__device__ inline bool barrier(const Heap& h, const Team& t) {
  return sync<S>(h, t);
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_SYNC_CUH_ */
