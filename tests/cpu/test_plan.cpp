#include <gtest/gtest.h>

#include <set>

#include "coll/plan.hpp"

using namespace ferry;

namespace {
std::vector<char*> fake_outputs(int world) {
  std::vector<char*> out;
  for (int p = 0; p < world; ++p) out.push_back(reinterpret_cast<char*>(uintptr_t(1) << 40 | uintptr_t(p) << 32));
  return out;
}
}  // namespace

TEST(PlanPushes, AllGatherCyclicShift) {
  for (int world : {1, 2, 4, 8}) {
    auto outs = fake_outputs(world);
    const char* in = reinterpret_cast<const char*>(0x1000);
    for (int rank = 0; rank < world; ++rank) {
      auto pushes = plan_pushes(CollOp::kAllGather, rank, world, outs, in, 100);
      ASSERT_EQ(static_cast<int>(pushes.size()), world - 1);
      for (int k = 0; k < world - 1; ++k) {
        int p = (rank + k + 1) % world;
        EXPECT_EQ(pushes[k].peer, p);
        EXPECT_EQ(pushes[k].copy.dst, outs[p] + rank * 100);
        EXPECT_EQ(pushes[k].copy.src, in);
        EXPECT_EQ(pushes[k].copy.bytes, 100u);
      }
    }
  }
}

TEST(PlanPushes, StepsFormPermutations) {
  // At every step, each rank targets a different peer: no receiver gets two pushes at once.
  int world = 8;
  auto outs = fake_outputs(world);
  for (int k = 0; k < world - 1; ++k) {
    std::set<int> targets;
    for (int rank = 0; rank < world; ++rank)
      targets.insert(plan_pushes(CollOp::kAllGather, rank, world, outs, nullptr, 1)[k].peer);
    EXPECT_EQ(static_cast<int>(targets.size()), world);
  }
}

TEST(PlanPushes, AllToAllSendsEachPeerItsBlock) {
  int world = 4;
  auto outs = fake_outputs(world);
  const char* in = reinterpret_cast<const char*>(0x10000);
  auto pushes = plan_pushes(CollOp::kAllToAll, 1, world, outs, in, 64);
  ASSERT_EQ(pushes.size(), 3u);
  for (const auto& pc : pushes) {
    EXPECT_EQ(pc.copy.src, in + pc.peer * 64);
    EXPECT_EQ(pc.copy.dst, outs[pc.peer] + 1 * 64);
  }
}

TEST(PlanPushes, ZeroBytesIsNoWork) {
  EXPECT_TRUE(plan_pushes(CollOp::kAllGather, 0, 4, fake_outputs(4), nullptr, 0).empty());
}

TEST(PlanLocal, InPlaceAllGatherSkipsTheCopy) {
  char buf[400];
  EXPECT_EQ(plan_local(CollOp::kAllGather, 2, buf, buf + 200, 100).bytes, 0u);
  Copy c = plan_local(CollOp::kAllGather, 2, buf, buf + 100, 100);
  EXPECT_EQ(c.bytes, 100u);
  EXPECT_EQ(c.dst, buf + 200);
  char in[400];
  Copy a = plan_local(CollOp::kAllToAll, 3, buf, in, 100);
  EXPECT_EQ(a.dst, buf + 300);
  EXPECT_EQ(a.src, in + 300);
}

TEST(RangesOverlap, Edges) {
  char b[100];
  EXPECT_TRUE(ranges_overlap(b, 10, b + 9, 10));
  EXPECT_FALSE(ranges_overlap(b, 10, b + 10, 10));
  EXPECT_FALSE(ranges_overlap(b, 0, b, 10));
  EXPECT_TRUE(ranges_overlap(b + 5, 1, b, 100));
}

TEST(LocalCopyPlacement, SideStreamOnlyForLargeBlocks) {
  EXPECT_FALSE(local_copy_on_side_stream(4096));
  EXPECT_FALSE(local_copy_on_side_stream((size_t(1) << 20) - 1));
  EXPECT_TRUE(local_copy_on_side_stream(size_t(1) << 20));
}
