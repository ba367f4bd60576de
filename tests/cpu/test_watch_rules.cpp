#include <gtest/gtest.h>

#include "coll/watch_rules.hpp"

namespace ferry {

TEST(ForeignReady, EagerMismatchAfterGraceUnlessPeerFinished) {
  EXPECT_FALSE(foreign_ready_is_mismatch(5, 4, false, false));  // within the grace period
  EXPECT_TRUE(foreign_ready_is_mismatch(5, 4, false, true));
  EXPECT_TRUE(foreign_ready_is_mismatch(5, 4, true, false));
  EXPECT_FALSE(foreign_ready_is_mismatch(5, 5, true, true));  // the peer is one collective ahead
}

TEST(ForeignReady, GraphReplaysNeverCountAsMismatch) {
  // Peers run replays ahead without publishing them: only the timeout judges.
  EXPECT_FALSE(foreign_ready_is_mismatch(0, 0, false, true));
  EXPECT_FALSE(foreign_ready_is_mismatch(0, 0, true, true));
}

TEST(CalledApart, AnotherPathAtOnceOtherArgumentsOnlyWithoutTheirReadyRecord) {
  const uint64_t tag = uint64_t{1} << 32, v = 0xfe77000012345678ull, w = 0xfe770000abcdef01ull;
  EXPECT_EQ(called_apart(v, v, tag, true), CalledApart::kSame);
  EXPECT_EQ(called_apart(v | tag, v | tag, tag, true), CalledApart::kSame);  // both on the SM path
  EXPECT_EQ(called_apart(v | tag, v, tag, false), CalledApart::kOtherPath);
  EXPECT_EQ(called_apart(v, w | tag, tag, false), CalledApart::kOtherPath);  // path and arguments: the path is said
  EXPECT_EQ(called_apart(v, w, tag, true), CalledApart::kOtherArguments);
  EXPECT_EQ(called_apart(v, w, tag, false), CalledApart::kSame);  // their ready record will name both calls
}

TEST(ArmedLook, AGateInGpuMemoryIsReadOnlyOnceTheWaitHasLasted) {
  EXPECT_EQ(look_at_armed(true, 0.01, 0.05, 2.0), ArmedLook::kNothing);
  EXPECT_EQ(look_at_armed(true, 0.05, 0.05, 2.0), ArmedLook::kReadGate);
  EXPECT_EQ(look_at_armed(true, 2.0, 0.05, 2.0), ArmedLook::kReadGate);
  // A host gate is read by the host directly: nothing to copy.
  EXPECT_EQ(look_at_armed(false, 1.0, 0.05, 2.0), ArmedLook::kNothing);
}

TEST(ArmedLook, PastTheTimeoutTheGateIsOpenedAndNotRead) {
  // Reading it in the same look would hold the rescue stream the opening needs.
  EXPECT_EQ(look_at_armed(true, 2.01, 0.05, 2.0), ArmedLook::kOpenGate);
  EXPECT_EQ(look_at_armed(true, 60.0, 0.05, 2.0), ArmedLook::kOpenGate);
  EXPECT_EQ(look_at_armed(false, 2.01, 0.05, 2.0), ArmedLook::kOpenGate);
}

TEST(ExitUndelivered, OnlyWhenOnAndTheErrorWasNotRaisedInTime) {
  EXPECT_FALSE(exit_undelivered_failure(0, true, false, 1e9));   // off by default
  EXPECT_FALSE(exit_undelivered_failure(5, false, false, 1e9));  // nothing failed
  EXPECT_FALSE(exit_undelivered_failure(5, true, true, 1e9));    // a call raised it: the program knows
  EXPECT_FALSE(exit_undelivered_failure(5, true, false, 4.9));
  EXPECT_TRUE(exit_undelivered_failure(5, true, false, 5.0));
}

TEST(ExitStuckWatchdog, OnlyWhenOnAndALookOutlastsTimeoutPlusGrace) {
  EXPECT_FALSE(exit_stuck_watchdog(0, 10, 1e9));
  EXPECT_FALSE(exit_stuck_watchdog(5, 10, 0));  // between looks
  EXPECT_FALSE(exit_stuck_watchdog(5, 10, 15));
  EXPECT_TRUE(exit_stuck_watchdog(5, 10, 15.1));
}

TEST(DescribePeersWithoutCuda, ExitedFirstThenRanksBehindThenTheRest) {
  EXPECT_EQ(describe_ranks_without_cuda({}), "");
  const std::string s = describe_ranks_without_cuda(
      {RankSeen{1, 11, false, 27, 27}, RankSeen{2, 12, false, 26, 26}, RankSeen{3, 13, true, 48, 47}});
  EXPECT_EQ(s,
            "rank 3 (pid 13) has exited; rank 2 is behind: called collective #26, finished #26; rank 1: called "
            "collective #27, finished #27");
  // A rank of this process says so; an exited peer's counts do not make the living ones look behind.
  EXPECT_EQ(describe_ranks_without_cuda({RankSeen{0, 5, true, 99, 99}, RankSeen{1, 6, false, 3, 2, true}}),
            "rank 0 (pid 5) has exited; rank 1 (this process): called collective #3, finished #2");
}

}  // namespace ferry
