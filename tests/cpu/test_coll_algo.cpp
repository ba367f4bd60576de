// Which algorithm a device all-reduce runs (include/ferry/device/coll_algo.cuh), and where the low-latency
// receive area sits in a rank's heap.
#include <gtest/gtest.h>

#include "ferry/device/coll_algo.cuh"
#include "ferry/device/heap.cuh"

using ferry::device::AllReduceAlgo;
using ferry::device::choose_all_reduce;

namespace {

constexpr uint64_t kMax = ferry::device::kLowLatencyMaxBytes;
constexpr uint64_t kTwo = ferry::device::kTwoShotMinBytes;
constexpr AllReduceAlgo kAuto = AllReduceAlgo::kAuto;

}  // namespace

TEST(AllReduceAlgo, AutoTakesOneShotThenTwoShotNeverTheLowLatencyOnes) {
  for (uint64_t bytes : {uint64_t(0), uint64_t(2), uint64_t(8192), uint64_t(65536), kTwo - 16})
    EXPECT_EQ(choose_all_reduce(bytes, 4, 4, true, kAuto), AllReduceAlgo::kOneShot) << bytes;
  EXPECT_EQ(choose_all_reduce(kTwo, 4, 4, true, kAuto), AllReduceAlgo::kTwoShot);
  EXPECT_EQ(choose_all_reduce(uint64_t(1) << 32, 8, 8, true, kAuto), AllReduceAlgo::kTwoShot);
  // Unaligned buffers, or two members (the same traffic either way): one-shot.
  EXPECT_EQ(choose_all_reduce(kTwo, 4, 4, false, kAuto), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(kTwo, 4, 2, true, kAuto), AllReduceAlgo::kOneShot);
}

TEST(AllReduceAlgo, AskedIsTakenWhereTheCallAllowsItElseTheNearest) {
  EXPECT_EQ(choose_all_reduce(kMax, 4, 4, true, AllReduceAlgo::kLowLatency), AllReduceAlgo::kLowLatency);
  EXPECT_EQ(choose_all_reduce(kMax + 2, 4, 4, true, AllReduceAlgo::kLowLatency), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(64, 16, 4, true, AllReduceAlgo::kLowLatency), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(64, ferry::device::kLowLatencyMaxRanks, 8, true, AllReduceAlgo::kLowLatency),
            AllReduceAlgo::kLowLatency);
  EXPECT_EQ(choose_all_reduce(64, 4, 4, true, AllReduceAlgo::kTwoShot), AllReduceAlgo::kTwoShot);
  EXPECT_EQ(choose_all_reduce(64, 4, 4, false, AllReduceAlgo::kTwoShot), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(1 << 30, 4, 4, true, AllReduceAlgo::kOneShot), AllReduceAlgo::kOneShot);
  const auto ll2 = AllReduceAlgo::kLowLatencyTwoShot;
  EXPECT_EQ(choose_all_reduce(4 * (kMax / 2), 4, 4, true, ll2), ll2);  // a part per member: half a slot each
  EXPECT_EQ(choose_all_reduce(4 * (kMax / 2) + 16, 4, 4, true, ll2), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(2 * (kMax / 2), 4, 2, true, ll2), ll2);
  EXPECT_EQ(choose_all_reduce(2 * (kMax / 2) + 2, 4, 2, true, ll2), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(64, 16, 4, true, ll2), AllReduceAlgo::kOneShot);
  EXPECT_EQ(choose_all_reduce(64, 4, 1, true, ll2), AllReduceAlgo::kOneShot);
}

TEST(LowLatencyArea, SlotsFollowTheSyncWordsAndEndWhereUserAllocationsBegin) {
  using namespace ferry::device;
  char* base = reinterpret_cast<char*>(uint64_t(1) << 40);
  const Heap h{base, uint64_t(1) << 30, 1, 4, nullptr, 0};
  EXPECT_GE(kLowLatencyOffset, sizeof(HeapSync));
  EXPECT_EQ(reinterpret_cast<char*>(h.low_latency_slot(2, 0, 0)), h.rank_base(2) + kLowLatencyOffset);
  EXPECT_EQ(reinterpret_cast<char*>(h.low_latency_slot(2, 0, 3)) - reinterpret_cast<char*>(h.low_latency_slot(2, 0, 2)),
            int64_t(kLowLatencySlotBytes));
  // The last slot's last line is the last byte before user allocations.
  const char* last = reinterpret_cast<char*>(h.low_latency_slot(0, 1, kLowLatencyMaxRanks - 1)) + kLowLatencySlotBytes;
  EXPECT_EQ(last, h.rank_base(0) + kHeapReservedBytes);
  // A full call's lines fit a slot: one 8-byte line per 4 bytes of data.
  EXPECT_EQ(kLowLatencyMaxBytes / 4 * 8, kLowLatencySlotBytes);
  EXPECT_EQ(kHeapReservedBytes % 256, 0u);
}
