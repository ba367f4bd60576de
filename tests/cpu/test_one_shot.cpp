#include <gtest/gtest.h>

#include <limits>

#include "coll/one_shot.hpp"
#include "coll/selector.hpp"

using namespace ferry;

TEST(OneShot, BlocksGrowWithBytesUpToTheCap) {
  EXPECT_EQ(one_shot_blocks(0), 1);
  EXPECT_EQ(one_shot_blocks(1), 1);
  EXPECT_EQ(one_shot_blocks(32 << 10), 1);
  EXPECT_EQ(one_shot_blocks((32 << 10) + 1), 2);
  EXPECT_EQ(one_shot_blocks(1 << 20), kOneShotMaxBlocks);
  EXPECT_EQ(one_shot_blocks(size_t(1) << 30), kOneShotMaxBlocks);
}

TEST(OneShot, SlotsFollowTheHeaderAndNeverOverlap) {
  const size_t slot = 1 << 20;
  for (int world : {1, 2, 4, 8}) {
    const size_t window = one_shot_window_bytes(world, slot);
    EXPECT_EQ(window, kOneShotHeaderBytes + 2 * world * slot);
    size_t expected = kOneShotHeaderBytes;
    for (int parity : {0, 1})
      for (int src = 0; src < world; ++src) {
        EXPECT_EQ(one_shot_slot_offset(world, slot, parity, src), expected);
        EXPECT_EQ(one_shot_slot_offset(world, slot, parity, src) % 16, 0u);  // the kernel's 16-byte words
        expected += slot;
      }
    EXPECT_EQ(expected, window);
  }
}

TEST(OneShot, PlanStridesAndOwnCopy) {
  char out[64], in[16];
  auto ag = plan_one_shot(CollOp::kAllGather, 1, 4, in, out, 16, 0, 7);
  EXPECT_EQ(ag.in_stride, 0u);
  EXPECT_EQ(ag.out_stride, 16u);
  EXPECT_EQ(ag.root, -1);
  EXPECT_TRUE(ag.own_copy);
  EXPECT_EQ(ag.tag, 7u);
  EXPECT_FALSE(plan_one_shot(CollOp::kAllGather, 1, 4, out + 16, out, 16, 0, 7).own_copy);  // in place

  auto a2a = plan_one_shot(CollOp::kAllToAll, 2, 4, in, out, 16, 0, 7);
  EXPECT_EQ(a2a.in_stride, 16u);
  EXPECT_EQ(a2a.out_stride, 16u);
  EXPECT_TRUE(a2a.own_copy);
  EXPECT_FALSE(plan_one_shot(CollOp::kAllToAll, 2, 4, out, out, 16, 0, 7).own_copy);  // in place

  auto root = plan_one_shot(CollOp::kBroadcast, 3, 4, in, out, 16, 3, 7);
  EXPECT_EQ(root.root, 3);
  EXPECT_EQ(root.in_stride, 0u);
  EXPECT_EQ(root.out_stride, 0u);
  EXPECT_TRUE(root.own_copy);
  EXPECT_FALSE(plan_one_shot(CollOp::kBroadcast, 3, 4, out, out, 16, 3, 7).own_copy);  // root in place
  EXPECT_FALSE(plan_one_shot(CollOp::kBroadcast, 1, 4, in, out, 16, 3, 7).own_copy);   // not the root
}

TEST(OneShot, UnsupportedCallsSayWhy) {
  const size_t slot = 1 << 20;
  EXPECT_EQ(one_shot_unsupported(CollOp::kAllGather, 8, slot, slot), "");
  EXPECT_EQ(one_shot_unsupported(CollOp::kAllToAll, 2, 1, slot), "");
  EXPECT_EQ(one_shot_unsupported(CollOp::kBroadcast, 1, 0, slot), "");
  EXPECT_NE(one_shot_unsupported(CollOp::kAllToAllv, 2, 1, slot).find("not all_to_allv"), std::string::npos);
  EXPECT_NE(one_shot_unsupported(CollOp::kAllReduce, 2, 1, slot).find("not all_reduce"), std::string::npos);
  EXPECT_NE(one_shot_unsupported(CollOp::kAllGather, 9, 1, slot).find("at most 8 ranks"), std::string::npos);
  EXPECT_NE(one_shot_unsupported(CollOp::kAllGather, 2, 1, 0).find("FERRY_SM_BYTES=0"), std::string::npos);
  EXPECT_NE(one_shot_unsupported(CollOp::kAllGather, 2, slot + 1, slot).find("this call moves 1048577"),
            std::string::npos);
}

TEST(OneShot, SelectorSkipsSmRulesWhereTheCallCannotTakeThem) {
  constexpr size_t kAny = std::numeric_limits<size_t>::max();
  std::vector<SelectorRule> table = {{CollOp::kAllGather, 0, 1 << 20, Algo::kSm},
                                     {CollOp::kAllGather, 0, kAny, Algo::kSeq}};
  EXPECT_EQ(select_algo(CollOp::kAllGather, 2, 4096, Algo::kAuto, table, true), Algo::kSm);
  EXPECT_EQ(select_algo(CollOp::kAllGather, 2, 4096, Algo::kAuto, table, false), Algo::kSeq);
  EXPECT_EQ(select_algo(CollOp::kAllGather, 2, 4096, Algo::kSm, table, false), Algo::kSm);  // forced: build() explains
  EXPECT_EQ(parse_algo("sm", "algo"), Algo::kSm);
  EXPECT_STREQ(algo_name(Algo::kSm), "sm");
}

TEST(OneShot, DefaultTableNeverPicksTheSmPath) {
  auto table = default_selector_table();
  for (size_t bytes = 1; bytes <= (size_t(1) << 32); bytes *= 2)
    for (CollOp op : {CollOp::kAllGather, CollOp::kAllToAll, CollOp::kBroadcast})
      EXPECT_NE(select_algo(op, 2, bytes, Algo::kAuto, table), Algo::kSm);
}
