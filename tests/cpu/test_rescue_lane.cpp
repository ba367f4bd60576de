#include <gtest/gtest.h>

#include "dma/rescue_lane.hpp"

namespace ferry {

TEST(RescueStep, AnIdleStreamIsUsed) {
  EXPECT_EQ(rescue_step(true, 0.0, 1), RescueStep::kUse);
  EXPECT_EQ(rescue_step(true, 5.0, kMaxRescueStreams), RescueStep::kUse);
}

TEST(RescueStep, ABusyStreamIsGivenTimeBeforeItIsReplaced) {
  EXPECT_EQ(rescue_step(false, 0.0, 1), RescueStep::kWait);
  EXPECT_EQ(rescue_step(false, kRescueStuckAfterS * 0.5, 1), RescueStep::kWait);
  EXPECT_EQ(rescue_step(false, kRescueStuckAfterS, 1), RescueStep::kReplace);
  EXPECT_EQ(rescue_step(false, 60.0, 7), RescueStep::kReplace);
}

TEST(RescueStep, StreamsMadeAreBounded) {
  // Every hardware queue has been tried once (at most 32 exist).
  EXPECT_GT(kMaxRescueStreams, size_t{32});
  EXPECT_EQ(rescue_step(false, 60.0, kMaxRescueStreams - 1), RescueStep::kReplace);
  EXPECT_EQ(rescue_step(false, 60.0, kMaxRescueStreams), RescueStep::kWait);
}

}  // namespace ferry
