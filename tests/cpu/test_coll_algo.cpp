// Which algorithm a device all-reduce runs (include/ferry/device/coll_algo.cuh), and where the low-latency
// receive area sits in a rank's heap.
#include <gtest/gtest.h>

#include "ferry/device/coll_algo.cuh"
#include "ferry/device/heap.cuh"

using ferry::device::AllReduceAlgo;
using ferry::device::choose_all_reduce;

namespace {

constexpr uint64_t kLines = ferry::device::kLowLatencyBlockLines;
constexpr uint64_t kPerBlock = ferry::device::kLowLatencyAutoBytesPerBlock;
constexpr uint64_t kTwo = ferry::device::kTwoShotMinBytes;
constexpr AllReduceAlgo kAuto = AllReduceAlgo::kAuto;

}  // namespace

TEST(AllReduceAlgo, AutoTakesLowLatencyWhileEachBlockHasLittleThenOneShotThenTwoShot) {
  EXPECT_EQ(choose_all_reduce(0, 4, 4, 1, true, kAuto), AllReduceAlgo::kLowLatency);
  EXPECT_EQ(choose_all_reduce(kPerBlock, 4, 4, 1, true, kAuto), AllReduceAlgo::kLowLatency);
  EXPECT_EQ(choose_all_reduce(kPerBlock + 2, 4, 4, 1, true, kAuto), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(kPerBlock + 2, 4, 2, 1, true, kAuto), AllReduceAlgo::kOneShot);  // two members
  EXPECT_EQ(choose_all_reduce(64 * kPerBlock, 4, 4, 64, true, kAuto), AllReduceAlgo::kLowLatency);
  EXPECT_EQ(choose_all_reduce(512 << 10, 4, 4, 64, true, kAuto), AllReduceAlgo::kTwoShot);
  EXPECT_EQ(choose_all_reduce(512 << 10, 4, 4, 8, true, kAuto), AllReduceAlgo::kTwoShot);
  EXPECT_EQ(choose_all_reduce(kTwo - 16, 4, 4, 1, true, kAuto), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(4 << 20, 4, 4, 64, true, kAuto), AllReduceAlgo::kTwoShot);
  EXPECT_EQ(choose_all_reduce(kTwo, 4, 4, 1, false, kAuto), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(kTwo, 4, 2, 1, true, kAuto), AllReduceAlgo::kOneShot);
  // Worlds past the receive area's slots never take the low-latency format, whatever the team.
  EXPECT_EQ(choose_all_reduce(64, ferry::device::kLowLatencyMaxRanks + 1, 2, 1, true, kAuto), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(64, ferry::device::kLowLatencyMaxRanks, 8, 1, true, kAuto), AllReduceAlgo::kLowLatency);
}

// Measured on four H200s with the wait for the whole grid kAuto's contract
// needs: never faster than one-shot or two-shot, up to 5 us slower.
TEST(AllReduceAlgo, AutoNeverTakesTheLowLatencyTwoShot) {
  for (uint64_t bytes = 4096; bytes <= (8u << 20); bytes *= 2)
    for (unsigned blocks : {1u, 8u, 16u, 32u, 64u})
      for (int team : {3, 4, 8})
        EXPECT_NE(choose_all_reduce(bytes, 8, team, blocks, true, kAuto), AllReduceAlgo::kLowLatencyTwoShot)
            << bytes << " bytes, " << blocks << " blocks, " << team << " members";
}

TEST(AllReduceAlgo, LowLatencyAskedRunsOnlyWhereEachBlocksLinesFitItsRegion) {
  const auto ll = AllReduceAlgo::kLowLatency, ll2 = AllReduceAlgo::kLowLatencyTwoShot;
  EXPECT_EQ(choose_all_reduce(kLines * 4, 4, 4, 1, true, ll), ll);
  EXPECT_EQ(choose_all_reduce(kLines * 4 + 2, 4, 4, 1, true, ll), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(kLines * 4 * 64, 4, 4, 64, true, ll), ll);
  EXPECT_EQ(choose_all_reduce(kLines * 4 * 64 + 4, 4, 4, 64, true, ll), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(64, 4, 4, ferry::device::kMaxGridBlocks + 1, true, ll), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(64, 16, 4, 1, true, ll), AllReduceAlgo::kOneShot);
  // Two-shot: each member's part, half a region per block.
  EXPECT_EQ(choose_all_reduce(4 * (kLines / 2) * 4, 4, 4, 1, true, ll2), ll2);
  EXPECT_EQ(choose_all_reduce(4 * (kLines / 2) * 4 + 16, 4, 4, 1, true, ll2), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(64, 4, 1, 1, true, ll2), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(64, 4, 4, 1, true, AllReduceAlgo::kTwoShot), AllReduceAlgo::kTwoShot);
  EXPECT_EQ(choose_all_reduce(64, 4, 4, 1, false, AllReduceAlgo::kTwoShot), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(1 << 30, 4, 4, 32, true, AllReduceAlgo::kOneShot), AllReduceAlgo::kOneShot);
}

// The per-block two-shot: asked by name on 16-byte boundaries, at any size and
// grid; one-shot off them; kAuto never picks it.
TEST(AllReduceAlgo, PerBlockTwoShotOnlyByNameAndOnAlignedBuffers) {
  const auto pb = AllReduceAlgo::kTwoShotPerBlock;
  EXPECT_EQ(choose_all_reduce(4 << 20, 4, 4, 64, true, pb), pb);
  EXPECT_EQ(choose_all_reduce(64, 4, 2, 1, true, pb), pb);
  EXPECT_EQ(choose_all_reduce(4 << 20, 4, 4, 64, false, pb), AllReduceAlgo::kOneShot);
  for (uint64_t bytes : {uint64_t(64), uint64_t(512) << 10, uint64_t(4) << 20, uint64_t(1) << 30})
    for (unsigned blocks : {1u, 8u, 64u})
      EXPECT_NE(choose_all_reduce(bytes, 4, 4, blocks, true, AllReduceAlgo::kAuto), pb) << bytes << " " << blocks;
}

TEST(LowLatencyArea, EachBlockHasARegionOfEverySlotAndTheAreaEndsWhereUserAllocationsBegin) {
  using namespace ferry::device;
  char* base = reinterpret_cast<char*>(uint64_t(1) << 40);
  const Heap h{base, uint64_t(1) << 30, 1, 4, nullptr, 0};
  EXPECT_GE(kLowLatencyOffset, sizeof(HeapSync));
  EXPECT_EQ(reinterpret_cast<char*>(h.low_latency_slot(2, 0, 0, 0)), h.rank_base(2) + kLowLatencyOffset);
  EXPECT_EQ(h.low_latency_slot(2, 0, 0, 1) - h.low_latency_slot(2, 0, 0, 0), int64_t(kLowLatencyBlockLines));
  EXPECT_EQ(
      reinterpret_cast<char*>(h.low_latency_slot(2, 0, 3, 0)) - reinterpret_cast<char*>(h.low_latency_slot(2, 0, 2, 0)),
      int64_t(kLowLatencySlotBytes));
  // The last block's region of the last slot ends where user allocations begin.
  const uint64_t* last = h.low_latency_slot(0, 1, kLowLatencyMaxRanks - 1, kMaxGridBlocks - 1) + kLowLatencyBlockLines;
  EXPECT_EQ(reinterpret_cast<const char*>(last), h.rank_base(0) + kHeapReservedBytes);
  EXPECT_EQ(kHeapReservedBytes % 256, 0u);
}
