/* Which algorithm a device all-reduce (coll.cuh) runs: a pure function of
 * the call, the same on every member, so every member picks the same one.
 *
 *   kLowLatency  each member pushes its data with the round into every
 *                member's receive area (8-byte lines: 4 bytes of data, 4 of
 *                round) and reduces what arrives: no barrier, one trip over
 *                the links; worlds of at most kLowLatencyMaxRanks, at most
 *                kLowLatencyBlockLines x 4 bytes per rank per block
 *   kOneShot     barrier; every member reads every member's src and reduces
 *                all of it; barrier
 *   kTwoShot     barrier; member i reduces the i-th part and stores it into
 *                every member's dst; barrier (half the traffic of one-shot
 *                per rank once the team has more than two members); needs
 *                dst and src on 16-byte boundaries
 *   kLowLatencyTwoShot  two-shot in the low-latency format: member i's part
 *                of every member's data goes to member i in lines, member i
 *                sends the reduced part back in lines: no barrier; each
 *                member's part at most kLowLatencyBlockLines / 2 x 4 bytes per block;
 *                asked by name only: with the wait for the whole grid that
 *                kAuto's contract adds, it was never faster than one-shot or
 *                two-shot
 *   kTwoShotPerBlock  kTwoShot whose two meetings are per block: each block
 *                meets the same block of every other member, before and
 *                after, and never waits for the rest of its own grid; asked
 *                by name only (kAuto never takes it); src written before
 *                the kernel (or grid_sync(h) first); 16-byte boundaries,
 *                else one-shot, with one-shot's whole-grid contract
 *
 * The limits of kAuto come from measurements on four H200s (docs/symm.md). */
#ifndef FERRY_DEVICE_COLL_ALGO_CUH_
#define FERRY_DEVICE_COLL_ALGO_CUH_

#include <stdint.h>

#include "ferry/device/heap.cuh"

namespace ferry {
namespace device {

enum class AllReduceAlgo {
  kAuto = 0,
  kLowLatency = 1,
  kOneShot = 2,
  kTwoShot = 3,
  kLowLatencyTwoShot = 4,
  kTwoShotPerBlock = 5
};

/* kAuto takes the low-latency format up to this many bytes per rank for
 * each block of the grid: each block's threads push and unpack its share
 * line by line, so few blocks make it slow. */
constexpr uint64_t kLowLatencyAutoBytesPerBlock = 4096;
/* From this many bytes per rank kAuto takes two-shot (where it can). */
constexpr uint64_t kTwoShotMinBytes = 262144;

/* The algorithm a call runs: `asked` where the call allows it, else the
 * nearest one that does (low latency past its limits: one-shot; either
 * two-shot on unaligned buffers: one-shot). `blocks`: the grid's; `aligned`: dst and src
 * both on 16-byte boundaries. */
FERRY_DEVICE_HD AllReduceAlgo choose_all_reduce(uint64_t bytes, int world, int team_size, unsigned blocks, bool aligned,
                                                AllReduceAlgo asked) {
  const uint64_t units = (bytes + 3) / 4, per_block = blocks ? (units + blocks - 1) / blocks : units;
  const uint64_t part = team_size > 0 ? (units + team_size - 1) / team_size : units;
  const uint64_t part_per_block = blocks ? (part + blocks - 1) / blocks : part;
  const bool ll_world = world <= kLowLatencyMaxRanks && blocks >= 1 && blocks <= unsigned(kMaxGridBlocks);
  const bool ll_fits = ll_world && per_block <= kLowLatencyBlockLines;
  const bool ll_two_fits = ll_world && team_size >= 2 && part_per_block <= kLowLatencyBlockLines / 2;
  if (asked == AllReduceAlgo::kAuto) {
    if (ll_fits && bytes <= kLowLatencyAutoBytesPerBlock * blocks) return AllReduceAlgo::kLowLatency;
    return aligned && team_size > 2 && bytes >= kTwoShotMinBytes ? AllReduceAlgo::kTwoShot : AllReduceAlgo::kOneShot;
  }
  if (asked == AllReduceAlgo::kLowLatency && !ll_fits) return AllReduceAlgo::kOneShot;
  if (asked == AllReduceAlgo::kLowLatencyTwoShot && !ll_two_fits) return AllReduceAlgo::kOneShot;
  if ((asked == AllReduceAlgo::kTwoShot || asked == AllReduceAlgo::kTwoShotPerBlock) && !aligned)
    return AllReduceAlgo::kOneShot;
  return asked;
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_COLL_ALGO_CUH_ */
