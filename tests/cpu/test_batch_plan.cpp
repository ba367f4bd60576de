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

// Bounds and counts near 2^64 (the Python binding takes any size_t): two
// runs that end where the count does, not a wrapped run and a loop that never ends.
TEST(SplitBatches, CountsAndBoundsNear64BitsDoNotWrap) {
  const size_t top = ~size_t(0), half = (size_t(1) << 63) + 1;
  const auto b = split_batches(top, half);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0], std::make_pair(size_t(0), half));
  EXPECT_EQ(b[1], std::make_pair(half, top));
  EXPECT_EQ(split_batches(top, top).size(), 1u);
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
