#include <gtest/gtest.h>

#include "coll/collective_args.hpp"
#include "core/error.hpp"

using namespace ferry;

namespace {
cudaStream_t s(uintptr_t v) { return reinterpret_cast<cudaStream_t>(v); }
}  // namespace

TEST(CollectiveArgs, RanksSharingAGpuNeedStreamsOfTheirOwn) {
  // FERRY_SHARED_GPUS: ranks 0 and 2 on GPU 0, 1 and 3 on GPU 1.
  const std::vector<int> ranks{0, 1, 2, 3}, devices{0, 1, 0, 1};
  try {
    check_own_streams("all_gather", ranks, devices, {s(5), s(6), s(7), s(6)});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("all_gather: stream: ranks 1 and 3 share GPU 1 and one stream"),
              std::string::npos)
        << e.what();
  }
  check_own_streams("all_gather", ranks, devices, {s(5), s(6), s(7), s(8)});
  // The legacy default stream (null) twice on one GPU is one stream too.
  EXPECT_THROW(check_own_streams("broadcast", ranks, devices, {nullptr, s(6), nullptr, s(8)}), Error);
  // And so is cudaStreamLegacy, its other name.
  EXPECT_THROW(check_own_streams("broadcast", ranks, devices, {nullptr, s(6), cudaStreamLegacy, s(8)}), Error);
  // One rank per GPU: the same handle on two GPUs is no conflict.
  check_own_streams("all_gather", {0, 1}, {0, 1}, {s(5), s(5)});
}
