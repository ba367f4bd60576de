#include <gtest/gtest.h>

#include "core/error.hpp"
#include "dma/batch_plan.hpp"

using namespace ferry;

TEST(SplitBatches, CoversEverythingInBoundedRuns) {
  for (size_t count : {0, 1, 5, 128, 129, 1000}) {
    for (size_t max : {1, 7, 128}) {
      auto b = split_batches(count, max);
      size_t next = 0;
      for (auto [lo, hi] : b) {
        EXPECT_EQ(lo, next);
        EXPECT_GT(hi, lo);
        EXPECT_LE(hi - lo, max);
        next = hi;
      }
      EXPECT_EQ(next, count);
    }
  }
}

TEST(SplitBatches, RejectsZeroBound) {
  try {
    split_batches(3, 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("batch_max"), std::string::npos);
  }
}

TEST(ChooseSubmission, FallsBackWhereBatchingCannotRun) {
  EXPECT_EQ(choose_submission(false, false, false, true), Submission::kBatched);
  EXPECT_EQ(choose_submission(true, false, false, true), Submission::kPerCopy);
  EXPECT_EQ(choose_submission(false, true, false, true), Submission::kPerCopy);    // graph capture
  EXPECT_EQ(choose_submission(false, false, true, true), Submission::kPerCopy);    // legacy stream
  EXPECT_EQ(choose_submission(false, false, false, false), Submission::kPerCopy);  // old driver
}
