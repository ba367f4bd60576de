#include <gtest/gtest.h>

#include "coll/replay_cache.hpp"

namespace ferry {
namespace {

char buf[4096];

Program all_gather_like(size_t bytes) {
  Exchange x;
  x.targets = {1, 2, 3};
  x.sources = {3, 2, 1};
  for (int p = 1; p < 4; ++p) x.pushes.push_back(PeerCopy{p, Copy{buf + 1024 * p, buf, bytes}});
  x.local = Copy{buf + 8, buf, bytes};
  Program prog;
  prog.add_exchange(x);
  return prog;
}

}  // namespace

TEST(EmissionKey, EqualCommandsEqualKeys) {
  EXPECT_EQ(emission_key(all_gather_like(64), buf, Algo::kB2b, LocalCopy::kAuto, false),
            emission_key(all_gather_like(64), buf, Algo::kB2b, LocalCopy::kAuto, false));
}

TEST(EmissionKey, AnyDifferenceInWhatIsEnqueuedChangesTheKey) {
  const std::string base = emission_key(all_gather_like(64), buf, Algo::kB2b, LocalCopy::kAuto, false);
  EXPECT_NE(base, emission_key(all_gather_like(65), buf, Algo::kB2b, LocalCopy::kAuto, false));       // size
  EXPECT_NE(base, emission_key(all_gather_like(64), buf + 64, Algo::kB2b, LocalCopy::kAuto, false));  // record
  EXPECT_NE(base, emission_key(all_gather_like(64), buf, Algo::kSeq, LocalCopy::kAuto, false));       // variant
  EXPECT_NE(base, emission_key(all_gather_like(64), buf, Algo::kB2b, LocalCopy::kDriver, false));
  EXPECT_NE(base, emission_key(all_gather_like(64), buf, Algo::kB2b, LocalCopy::kAuto, true));  // kernel signals

  Program moved = all_gather_like(64);
  moved.steps[0].exchange.pushes[1].copy.dst = buf + 2000;  // another peer address
  EXPECT_NE(base, emission_key(moved, buf, Algo::kB2b, LocalCopy::kAuto, false));

  Program input = all_gather_like(64);
  input.steps[0].exchange.local.src = buf + 1;  // another input buffer
  EXPECT_NE(base, emission_key(input, buf, Algo::kB2b, LocalCopy::kAuto, false));

  Program reduced = all_gather_like(64);
  reduced.add_reduce(ReduceStep{buf, buf, buf, 256, 0, 4, 16, DType::kFloat32, RedOp::kSum});
  Program reduced_max = all_gather_like(64);
  reduced_max.add_reduce(ReduceStep{buf, buf, buf, 256, 0, 4, 16, DType::kFloat32, RedOp::kMax});
  EXPECT_NE(base, emission_key(reduced, buf, Algo::kB2b, LocalCopy::kAuto, false));
  EXPECT_NE(emission_key(reduced, buf, Algo::kB2b, LocalCopy::kAuto, false),
            emission_key(reduced_max, buf, Algo::kB2b, LocalCopy::kAuto, false));
}

TEST(ReplayCache, ASingleKernelLaunchIsNotReplayed) {
  EXPECT_TRUE(replayable(all_gather_like(64)));
  Program sm_path;
  SmPathStep s;
  s.world = 4;
  sm_path.add_sm_path(s);
  EXPECT_FALSE(replayable(sm_path));
}

TEST(ReplayCache, CapturesOnlyCallsThatRepeat) {
  EXPECT_FALSE(worth_capturing(1));
  EXPECT_TRUE(worth_capturing(2));
  ReplayCache cache(8);
  EXPECT_EQ(cache.touch("a").seen, 1u);
  EXPECT_EQ(cache.touch("a").seen, 2u);
  EXPECT_EQ(cache.touch("b").seen, 1u);
}

TEST(ReplayCache, EvictsTheLeastRecentlyUsed) {
  ReplayCache cache(2);
  cache.touch("a");
  cache.touch("b");
  cache.touch("a");
  cache.touch("c");  // evicts b
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.touch("a").seen, 3u);
  EXPECT_EQ(cache.touch("b").seen, 1u);  // forgotten; evicts c
  EXPECT_EQ(cache.touch("c").seen, 1u);
}

}  // namespace ferry
