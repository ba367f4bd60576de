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

TEST(InlineBatchSize, SmallTransfersInAtLeastFourCallsOfAtLeastEight) {
  EXPECT_EQ(inline_batch_size(64, 32), 16u);   // 4 calls, not 2
  EXPECT_EQ(inline_batch_size(100, 32), 25u);  // 4 calls
  EXPECT_EQ(inline_batch_size(128, 32), 32u);  // from 4 x FERRY_BATCH_MAX: the bound
  EXPECT_EQ(inline_batch_size(4096, 32), 32u);
  EXPECT_EQ(inline_batch_size(20, 32), 8u);  // 3 calls of at most 8
  EXPECT_EQ(inline_batch_size(5, 32), 8u);   // one call
  EXPECT_EQ(inline_batch_size(0, 32), 8u);
  EXPECT_EQ(inline_batch_size(64, 4), 4u);  // never over the bound
  EXPECT_EQ(inline_batch_size(64, 1), 1u);  // batching off
  for (size_t n : {1, 9, 33, 127, 129, 1000})
    for (size_t most : {1, 8, 16, 32, 128}) {
      const size_t per = inline_batch_size(n, most);
      EXPECT_GE(per, 1u);
      EXPECT_LE(per, most);
    }
  EXPECT_THROW(inline_batch_size(64, 0), Error);
}

TEST(ChooseSubmission, FallsBackWhereBatchingCannotRun) {
  EXPECT_EQ(choose_submission(false, false, false, true), Submission::kBatched);
  EXPECT_EQ(choose_submission(true, false, false, true), Submission::kPerCopy);
  EXPECT_EQ(choose_submission(false, true, false, true), Submission::kPerCopy);    // graph capture
  EXPECT_EQ(choose_submission(false, false, true, true), Submission::kPerCopy);    // legacy stream
  EXPECT_EQ(choose_submission(false, false, false, false), Submission::kPerCopy);  // old driver
}
