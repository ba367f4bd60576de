#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>

#include "coll/collective_args.hpp"
#include "coll/selector.hpp"
#include "coll/sm_path.hpp"
#include "core/error.hpp"

using namespace ferry;

TEST(Selector, SmallSizesBatchLargeSizesSequential) {
  auto table = default_selector_table();
  for (CollOp op : {CollOp::kAllGather, CollOp::kAllToAll, CollOp::kAllToAllv, CollOp::kBroadcast,
                    CollOp::kReduceScatter, CollOp::kAllReduce}) {
    for (int world : {2, 4, 8}) {
      EXPECT_EQ(select_variant(op, world, 1024, Algo::kAuto, table).algo, Algo::kB2b);
      EXPECT_EQ(select_variant(op, world, size_t(2) << 20, Algo::kAuto, table).algo, Algo::kB2b);
      EXPECT_EQ(select_variant(op, world, (size_t(2) << 20) + 1, Algo::kAuto, table).algo, Algo::kSeq);
      EXPECT_EQ(select_variant(op, world, size_t(1) << 30, Algo::kAuto, table).algo, Algo::kSeq);
    }
  }
}

TEST(Selector, ParallelEnginesNeverChosenAutomatically) {
  auto table = default_selector_table();
  for (size_t bytes = 1; bytes <= (size_t(1) << 32); bytes *= 2)
    for (CollOp op : {CollOp::kAllGather, CollOp::kAllToAll})
      EXPECT_NE(select_variant(op, 4, bytes, Algo::kAuto, table).algo, Algo::kPcpy);
}

TEST(Selector, ForcedVariantWins) {
  auto table = default_selector_table();
  EXPECT_EQ(select_variant(CollOp::kAllGather, 4, 1024, Algo::kPcpy, table).algo, Algo::kPcpy);
  EXPECT_EQ(select_variant(CollOp::kAllGather, 4, size_t(1) << 30, Algo::kSeq, table).algo, Algo::kSeq);
}

TEST(Selector, WorldSpecificRulesComeFirst) {
  std::vector<SelectorRule> table = {{CollOp::kAllGather, 8, 1 << 20, Algo::kPcpy},
                                     {CollOp::kAllGather, 0, 1 << 20, Algo::kB2b}};
  EXPECT_EQ(select_variant(CollOp::kAllGather, 8, 4096, Algo::kAuto, table).algo, Algo::kPcpy);
  EXPECT_EQ(select_variant(CollOp::kAllGather, 4, 4096, Algo::kAuto, table).algo, Algo::kB2b);
  EXPECT_EQ(select_variant(CollOp::kAllGather, 4, 8 << 20, Algo::kAuto, table).algo, Algo::kSeq);  // no rule: seq
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

TEST(Selector, ARuleMayNameTheSignalsAndAForcedVariantDoesNot) {
  const std::vector<SelectorRule> table = {
      {CollOp::kAllGather, 0, 1 << 20, Algo::kB2b},
      {CollOp::kAllGather, 0, size_t(64) << 20, Algo::kPcpy, Signals::kKernel},
  };
  const Selection small = select_variant(CollOp::kAllGather, 2, 4096, Algo::kAuto, table);
  EXPECT_EQ(small.algo, Algo::kB2b);
  EXPECT_EQ(small.signals, Signals::kAuto);
  const Selection mid = select_variant(CollOp::kAllGather, 2, 4 << 20, Algo::kAuto, table);
  EXPECT_EQ(mid.algo, Algo::kPcpy);
  EXPECT_EQ(mid.signals, Signals::kKernel);
  EXPECT_EQ(select_variant(CollOp::kAllGather, 2, 4 << 20, Algo::kSeq, table).signals, Signals::kAuto);
  EXPECT_EQ(select_variant(CollOp::kAllGather, 2, size_t(1) << 30, Algo::kAuto, table).signals, Signals::kAuto);
}

TEST(Signals, TheCallWinsThenTheRuleThenTheCommunicator) {
  EXPECT_EQ(parse_signals("auto", "signals"), Signals::kAuto);
  EXPECT_EQ(parse_signals("copy", "signals"), Signals::kCopy);
  EXPECT_EQ(parse_signals("kernel", "signals"), Signals::kKernel);
  EXPECT_EQ(parse_signals("sm", "signals"), Signals::kKernel);  // its first name
  EXPECT_STREQ(signals_name(Signals::kKernel), "kernel");
  for (bool by_kernel : {false, true}) {
    for (Signals rule : {Signals::kAuto, Signals::kCopy, Signals::kKernel}) {
      EXPECT_FALSE(kernel_signals(Signals::kCopy, rule, by_kernel));
      EXPECT_TRUE(kernel_signals(Signals::kKernel, rule, by_kernel));
    }
    EXPECT_EQ(kernel_signals(Signals::kAuto, Signals::kAuto, by_kernel), by_kernel);
    EXPECT_FALSE(kernel_signals(Signals::kAuto, Signals::kCopy, by_kernel));
    EXPECT_TRUE(kernel_signals(Signals::kAuto, Signals::kKernel, by_kernel));
  }
  try {
    parse_signals("rounds", "signals");
    FAIL() << "no error for signals='rounds'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("signals is 'rounds'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'auto', 'copy'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("or 'kernel'"), std::string::npos) << e.what();
  }
}

TEST(Signals, TheCommunicatorsSettingIsParsedAndABadOneNamesTheKnob) {
  EXPECT_TRUE(kernel_signals_default("kernel"));
  EXPECT_TRUE(kernel_signals_default("sm"));
  EXPECT_FALSE(kernel_signals_default("copy"));
  try {
    kernel_signals_default("rounds");
    FAIL() << "no error for FERRY_SIGNALS=rounds";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FERRY_SIGNALS=rounds"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'copy' or 'kernel'"), std::string::npos) << e.what();
  }
}

namespace {

// The SM path's shape with a window of `slot_bytes` per slot (0: none).
SmPathBlocks sm(size_t slot_bytes, size_t two_shot_from = kSmPathDefaultTwoShotBytes) {
  SmPathBlocks b;
  b.slot_bytes = slot_bytes;
  b.two_shot_from = two_shot_from;
  return b;
}

CollectiveArgs call(CollOp op, size_t bytes, Algo algo = Algo::kAuto, Signals signals = Signals::kAuto) {
  CollectiveArgs a;
  a.op = op;
  a.bytes_per_rank = bytes;
  a.algo = algo;
  a.signals = signals;
  return a;
}

}  // namespace

TEST(SelectorTable, TheCallWinsThenTheKnobThenTheTable) {
  const std::vector<SelectorRule> startup = {{CollOp::kAllGather, 0, 1 << 20, Algo::kB2b, Signals::kKernel},
                                             {CollOp::kAllGather, 0, size_t(1) << 40, Algo::kSeq}};
  const size_t window = 1 << 20;
  Selector table("NVIDIA H200", 4, startup, Algo::kAuto, false);
  Resolved r = table.resolve(call(CollOp::kAllGather, 4096), 4096, sm(window));
  EXPECT_EQ(r.algo, Algo::kB2b);
  EXPECT_TRUE(r.kernel_signals);  // the rule's signals
  r = table.resolve(call(CollOp::kAllGather, 4096, Algo::kPcpy), 4096, sm(window));
  EXPECT_EQ(r.algo, Algo::kPcpy);
  EXPECT_FALSE(r.kernel_signals);  // an explicit algo: the rule says nothing, FERRY_SIGNALS=copy
  r = table.resolve(call(CollOp::kAllGather, 4096, Algo::kAuto, Signals::kCopy), 4096, sm(window));
  EXPECT_FALSE(r.kernel_signals);  // the call's signals win over the rule's
  EXPECT_EQ(table.resolve(call(CollOp::kAllGather, 8 << 20), 8 << 20, sm(window)).algo, Algo::kSeq);

  Selector forced("NVIDIA H200", 4, startup, Algo::kPcpy, true);  // FERRY_ALGO=pcpy FERRY_SIGNALS=sm
  r = forced.resolve(call(CollOp::kAllGather, 4096), 4096, sm(window));
  EXPECT_EQ(r.algo, Algo::kPcpy);
  EXPECT_TRUE(r.kernel_signals);
  EXPECT_EQ(forced.resolve(call(CollOp::kAllGather, 4096, Algo::kSeq), 4096, sm(window)).algo, Algo::kSeq);
}

TEST(SelectorTable, AnSmRuleNeedsTheWindow) {
  const std::vector<SelectorRule> startup = {{CollOp::kAllReduce, 0, 64 << 10, Algo::kSm},
                                             {CollOp::kAllReduce, 0, size_t(1) << 40, Algo::kB2b}};
  Selector table("NVIDIA H200", 4, startup, Algo::kAuto, false);
  CollectiveArgs a = call(CollOp::kAllReduce, 0);
  a.count = 1024;
  a.dtype = DType::kFloat32;
  EXPECT_EQ(table.resolve(a, 4096, sm(1 << 20)).algo, Algo::kSm);
  // The rule reads the selection bytes, the window the largest block (count x 4 bytes here):
  // a call selected as 128 KB takes the b2b rule even though its 4 KB block fits the window.
  EXPECT_EQ(table.resolve(a, 128 << 10, sm(1 << 20)).algo, Algo::kB2b);
  EXPECT_EQ(table.resolve(a, 4096, sm(0)).algo, Algo::kB2b);     // FERRY_SM_BYTES=0: no window
  EXPECT_EQ(table.resolve(a, 4096, sm(1024)).algo, Algo::kB2b);  // a 4 KB block does not fit a 1 KB window
  EXPECT_EQ(table.choose(CollOp::kAllReduce, 4096, sm(1 << 20)).algo, Algo::kSm);
  EXPECT_EQ(table.choose(CollOp::kAllReduce, 4096, sm(0)).algo, Algo::kB2b);
  Selector forced_sm("NVIDIA H200", 4, startup, Algo::kSm, false);  // FERRY_ALGO=sm where the call cannot take it
  EXPECT_EQ(forced_sm.resolve(a, 4096, sm(0)).algo, Algo::kB2b);
}

TEST(SelectorTable, ATwoShotAllReduceNeedsTheWindowForItsPartOnly) {
  const std::vector<SelectorRule> startup = {{CollOp::kAllReduce, 0, 4 << 20, Algo::kSm},
                                             {CollOp::kAllReduce, 0, size_t(1) << 40, Algo::kB2b}};
  Selector table("NVIDIA H200", 4, startup, Algo::kAuto, false);
  CollectiveArgs a = call(CollOp::kAllReduce, 0);
  a.count = 1 << 20;  // 4 MiB of float32: parts of 1 MiB on 4 ranks
  a.dtype = DType::kFloat32;
  EXPECT_EQ(table.resolve(a, 1 << 20, sm(1 << 20, 1 << 20)).algo, Algo::kSm);
  // FERRY_SM_TWO_SHOT_BYTES=0: the whole buffer must fit.
  EXPECT_EQ(table.resolve(a, 1 << 20, sm(1 << 20, 0)).algo, Algo::kB2b);
  EXPECT_EQ(table.resolve(a, 1 << 20, sm(4 << 20, 0)).algo, Algo::kSm);
  // choose() counts all_reduce's bytes as a rank's share: a buffer of 4 MiB + 64 takes two shots in rounds.
  EXPECT_EQ(table.choose(CollOp::kAllReduce, (1 << 20) + 16, sm(1 << 20, 1 << 20)).algo, Algo::kSm);
  EXPECT_EQ(table.choose(CollOp::kAllReduce, (1 << 20) + 16, sm(1 << 20, 0)).algo, Algo::kB2b);
}

TEST(SelectorTable, AnEmptyTableRestoresTheStartupOneAndAnUnknownPresetIsRefused) {
  const std::vector<SelectorRule> startup = {{CollOp::kBroadcast, 0, size_t(1) << 40, Algo::kSeq}};
  Selector table("NVIDIA H200", 4, startup, Algo::kAuto, false);
  table.set_table({{CollOp::kBroadcast, 0, size_t(1) << 40, Algo::kB2b}});
  EXPECT_EQ(table.choose(CollOp::kBroadcast, 4096, sm(0)).algo, Algo::kB2b);
  table.set_table({});
  EXPECT_EQ(table.choose(CollOp::kBroadcast, 4096, sm(0)).algo, Algo::kSeq);
  try {
    table.set_preset("fastest");
    FAIL() << "no error for an unknown preset";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fastest'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(table.choose(CollOp::kBroadcast, 4096, sm(0)).algo, Algo::kSeq);  // unchanged by the refusal
}

// What choose() reports is what resolve() runs, for every collective and
// size where the selector's bytes say the call exactly (all_reduce: a buffer
// that world divides), with the latency preset's kind of rules and the
// SM path's default knobs.
TEST(SelectorTable, ChooseReportsWhatResolveRuns) {
  constexpr size_t kAny = std::numeric_limits<size_t>::max();
  for (int world : {2, 3, 4, 8}) {
    std::vector<SelectorRule> rules;
    for (CollOp op :
         {CollOp::kAllGather, CollOp::kAllToAll, CollOp::kBroadcast, CollOp::kReduceScatter, CollOp::kAllReduce}) {
      rules.push_back({op, 0, size_t(4) << 20, Algo::kSm});
      rules.push_back({op, 0, kAny, Algo::kB2b, Signals::kKernel});
    }
    Selector table("NVIDIA H200", world, rules, Algo::kAuto, false);
    const SmPathBlocks per = sm(1 << 20);
    for (size_t elems : {size_t(1), size_t(1000), size_t(65536), size_t(262144), size_t(262148), size_t(1) << 20,
                         size_t(3) << 20, size_t(1) << 22}) {
      for (CollOp op :
           {CollOp::kAllGather, CollOp::kAllToAll, CollOp::kBroadcast, CollOp::kReduceScatter, CollOp::kAllReduce}) {
        CollectiveArgs a = call(op, elems * 4);
        size_t selection = elems * 4;
        if (op == CollOp::kReduceScatter || op == CollOp::kAllReduce) {
          a.dtype = DType::kFloat32;
          a.count = op == CollOp::kAllReduce ? elems * world : elems;  // all_reduce: world x the share
        }
        const Resolved ran = table.resolve(a, selection, per);
        const Resolved told = table.choose(op, selection, per);
        EXPECT_EQ(ran.algo, told.algo) << coll_op_name(op) << ", world " << world << ", " << elems << " floats";
        EXPECT_EQ(ran.kernel_signals, told.kernel_signals) << coll_op_name(op) << ", world " << world;
      }
    }
  }
}
