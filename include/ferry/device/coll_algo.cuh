/* Which algorithm a device all-reduce (coll.cuh) runs: a pure function of
 * the call, the same on every member, so every member picks the same one.
 *
 *   kLowLatency  each member pushes its data with the round into every
 *                member's receive area (8-byte lines: 4 bytes of data, 4 of
 *                round) and reduces what arrives: no barrier, one trip over
 *                the links; worlds of at most kLowLatencyMaxRanks, calls of at
 *                most kLowLatencyMaxBytes per rank
 *   kOneShot     barrier; every member reads every member's src and reduces
 *                all of it; barrier
 *   kTwoShot     barrier; member i reduces the i-th part and stores it into
 *                every member's dst; barrier (half the traffic of one-shot
 *                per rank once the team has more than two members); needs
 *                dst and src on 16-byte boundaries
 *   kLowLatencyTwoShot  two-shot in the low-latency format: member i's part
 *                of every member's data goes to member i in lines, member i
 *                sends the reduced part back in lines: no barrier; calls of at
 *                most team size x kLowLatencyMaxBytes / 2 bytes per rank
 *
 * kAuto takes only the barrier algorithms. The low-latency ones are fast
 * (on four H200s 3.5 us for 8 KB, 7.5 us for 512 KB) but their receive
 * slots are shared by the blocks of a grid while rounds are counted per
 * block: consecutive calls on a heap must have the same grid, the same count
 * and the same algorithm, or a line can be taken from an older call or
 * overwritten before it is read (docs/symm.md, "Known problems"). They also
 * return when this block's share of dst is complete, not the whole of dst. */
#ifndef FERRY_DEVICE_COLL_ALGO_CUH_
#define FERRY_DEVICE_COLL_ALGO_CUH_

#include <stdint.h>

#include "ferry/device/heap.cuh"

namespace ferry {
namespace device {

enum class AllReduceAlgo { kAuto = 0, kLowLatency = 1, kOneShot = 2, kTwoShot = 3, kLowLatencyTwoShot = 4 };

/* From this many bytes per rank kAuto takes two-shot (where it can). */
constexpr uint64_t kTwoShotMinBytes = 262144;

/* The algorithm a call runs: `asked` where the call allows it, else the
 * nearest one that does (low latency past its limits: one-shot; two-shot on
 * unaligned buffers: one-shot). `aligned`: dst and src both on 16-byte boundaries. */
FERRY_DEVICE_HD AllReduceAlgo choose_all_reduce(uint64_t bytes, int world, int team_size, bool aligned,
                                                AllReduceAlgo asked) {
  const bool ll_world = world <= kLowLatencyMaxRanks;
  const bool ll_fits = ll_world && bytes <= kLowLatencyMaxBytes;
  const bool ll_two_fits = ll_world && team_size >= 2 && bytes <= uint64_t(team_size) * (kLowLatencyMaxBytes / 2);
  if (asked == AllReduceAlgo::kAuto)
    return aligned && team_size > 2 && bytes >= kTwoShotMinBytes ? AllReduceAlgo::kTwoShot : AllReduceAlgo::kOneShot;
  if (asked == AllReduceAlgo::kLowLatency && !ll_fits) return AllReduceAlgo::kOneShot;
  if (asked == AllReduceAlgo::kLowLatencyTwoShot && !ll_two_fits) return AllReduceAlgo::kOneShot;
  if (asked == AllReduceAlgo::kTwoShot && !aligned) return AllReduceAlgo::kOneShot;
  return asked;
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_COLL_ALGO_CUH_ */
