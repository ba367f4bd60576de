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

}  // namespace ferry
