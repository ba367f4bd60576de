/* Internals of the device API: how a rank meets the other members of a team
 * (the barriers of sync.cuh and the grid-wide barrier of coll.cuh). Not a
 * public header of its own. */
#ifndef FERRY_DEVICE_IMPL_MEET_CUH_
#define FERRY_DEVICE_IMPL_MEET_CUH_

#include <stdint.h>

#include "ferry/device/heap.cuh"
#include "ferry/device/impl/spin.cuh"
#include "ferry/device/team.cuh"

namespace ferry {
namespace device {
namespace impl {

/* Lane `lane` of `lanes` announces to, then waits for, members lane,
 * lane + lanes, ...: with a warp or a block every peer's trip overlaps the
 * others'. `mine(peer)` is this rank's count of meetings with peer (raised
 * here); `box(r, from)` the word in rank r's heap where `from` announces its
 * count: one writer per word, so a relaxed store after a release fence does.
 * The scope's other threads synchronized with this one before it got here;
 * the fence (cumulative) makes their earlier stores, and this thread's, land
 * before the announcements: it is the barrier's quiet as well. Only a lane
 * that announces needs it; with no member but this rank, lane 0 fences alone. */
template <class Mine, class Box>
__device__ inline bool meet_members(const Heap& h, const Team& t, unsigned lane, unsigned lanes, Mine mine, Box box) {
  bool fenced = false;
  for (int i = int(lane); i < t.size; i += int(lanes)) {
    const int peer = team_world_rank(t, i);
    if (peer == h.rank) continue;
    if (!fenced) fence_release(), fenced = true;
    store_relaxed(box(peer, h.rank), ++mine(peer));
  }
  if (t.size == 1 && lane == 0) fence_release();
  bool ok = true;
  for (int i = int(lane); i < t.size && ok; i += int(lanes)) {
    const int peer = team_world_rank(t, i);
    if (peer == h.rank) continue;
    const uint64_t want = mine(peer);
    const uint64_t* word = box(h.rank, peer);
    ok = spin(
        h, [&] { return load_acquire(word) >= want; }, WaitKind::kBarrier, peer);
  }
  return ok;
}

}  // namespace impl
}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_IMPL_MEET_CUH_ */
