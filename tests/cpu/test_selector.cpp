#include <gtest/gtest.h>

#include <cstdlib>

#include "coll/selector.hpp"
#include "core/error.hpp"

using namespace ferry;

TEST(Selector, SmallSizesBatchLargeSizesSequential) {
  auto table = default_selector_table();
  for (CollOp op : {CollOp::kAllGather, CollOp::kAllToAll, CollOp::kAllToAllv, CollOp::kBroadcast,
                    CollOp::kReduceScatter, CollOp::kAllReduce}) {
    for (int world : {2, 4, 8}) {
      EXPECT_EQ(select_algo(op, world, 1024, Algo::kAuto, table), Algo::kB2b);
      EXPECT_EQ(select_algo(op, world, size_t(2) << 20, Algo::kAuto, table), Algo::kB2b);
      EXPECT_EQ(select_algo(op, world, (size_t(2) << 20) + 1, Algo::kAuto, table), Algo::kSeq);
      EXPECT_EQ(select_algo(op, world, size_t(1) << 30, Algo::kAuto, table), Algo::kSeq);
    }
  }
}

TEST(Selector, ParallelEnginesNeverChosenAutomatically) {
  auto table = default_selector_table();
  for (size_t bytes = 1; bytes <= (size_t(1) << 32); bytes *= 2)
    for (CollOp op : {CollOp::kAllGather, CollOp::kAllToAll})
      EXPECT_NE(select_algo(op, 4, bytes, Algo::kAuto, table), Algo::kPcpy);
}

TEST(Selector, ForcedVariantWins) {
  auto table = default_selector_table();
  EXPECT_EQ(select_algo(CollOp::kAllGather, 4, 1024, Algo::kPcpy, table), Algo::kPcpy);
  EXPECT_EQ(select_algo(CollOp::kAllGather, 4, size_t(1) << 30, Algo::kSeq, table), Algo::kSeq);
}

TEST(Selector, WorldSpecificRulesComeFirst) {
  std::vector<SelectorRule> table = {{CollOp::kAllGather, 8, 1 << 20, Algo::kPcpy},
                                     {CollOp::kAllGather, 0, 1 << 20, Algo::kB2b}};
  EXPECT_EQ(select_algo(CollOp::kAllGather, 8, 4096, Algo::kAuto, table), Algo::kPcpy);
  EXPECT_EQ(select_algo(CollOp::kAllGather, 4, 4096, Algo::kAuto, table), Algo::kB2b);
  EXPECT_EQ(select_algo(CollOp::kAllGather, 4, 8 << 20, Algo::kAuto, table), Algo::kSeq);  // no rule: seq
}

TEST(Selector, ParseNamesTheArgument) {
  EXPECT_EQ(parse_algo("b2b", "algo"), Algo::kB2b);
  EXPECT_EQ(parse_algo("", "algo"), Algo::kAuto);
  try {
    parse_algo("ring", "algo");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("algo is 'ring'"), std::string::npos);
  }
}
