// Which multipath links get staging buffers, and where each buffer lies in
// its GPU's one allocation (xfer/relay_staging.hpp).
#include <gtest/gtest.h>

#include <set>

#include "core/error.hpp"
#include "xfer/relay_staging.hpp"

using ferry::xfer::plan_relay_staging;
using ferry::xfer::relay_staging_need;

namespace {
constexpr size_t kKiB = 1024;
constexpr size_t kMiB = kKiB * kKiB;
}  // namespace

TEST(RelayStaging, NeedOnlyWhereALinkMayRelayForAnother) {
  EXPECT_EQ(relay_staging_need({0}, {true}, 2), std::vector<int>({0}));  // one link: nothing to relay for
  EXPECT_EQ(relay_staging_need({0, 1, 2, 3}, {true, true, false, true}, 2), std::vector<int>({2, 2, 0, 2}));
  EXPECT_EQ(relay_staging_need({}, {}, 2), std::vector<int>());
}

// Loopback relays: on one GPU alone its first link carries that GPU's own
// copies and nothing else (copies into GPUs outside the engine run plain);
// the loopback links relay into it. Beside another GPU the first link
// relays for that one too.
TEST(RelayStaging, AGpuAloneRelaysNothingOverItsFirstLink) {
  EXPECT_EQ(relay_staging_need({0, 0, 0, 0}, {true, true, true, true}, 2), std::vector<int>({0, 2, 2, 2}));
  EXPECT_EQ(relay_staging_need({3, 3}, {true, false}, 2), std::vector<int>({0, 0}));
  EXPECT_EQ(relay_staging_need({0, 0, 1}, {true, true, true}, 2), std::vector<int>({2, 2, 2}));
  EXPECT_EQ(relay_staging_need({0, 1, 0}, {true, true, true}, 3), std::vector<int>({3, 3, 3}));
}

// Four GPUs, each relaying: one buffer pair each at the same offsets, 64 KiB aligned.
TEST(RelayStaging, OneAllocationPerGpuAtTheSameOffsets) {
  const auto p = plan_relay_staging({0, 1, 2, 3}, {2, 2, 2, 2}, 8 * kMiB);
  EXPECT_EQ(p.gpus, std::vector<int>({0, 1, 2, 3}));
  EXPECT_EQ(p.bytes_per_gpu, 16 * kMiB);
  for (int l = 0; l < 4; ++l) {
    EXPECT_EQ(p.gpu_of[l], l);
    EXPECT_EQ(p.offsets[l], std::vector<size_t>({0, 8 * kMiB}));
  }
}

// Inputs that would place buffers wrongly are refused: a need list of
// another length (read past its end), a size of 0 or past 2^40 (a stride
// of 0, every buffer at offset 0).
TEST(RelayStaging, InputsThatWouldOverlapBuffersAreRefused) {
  EXPECT_THROW(plan_relay_staging({0, 1, 2}, {2, 2}, kMiB), ferry::Error);
  EXPECT_THROW(plan_relay_staging({0, 1}, {2, 2}, 0), ferry::Error);
  EXPECT_THROW(plan_relay_staging({0, 1}, {2, 2}, ~size_t(0) - 100), ferry::Error);
  EXPECT_NO_THROW(plan_relay_staging({0, 1}, {2, 2}, size_t(1) << 40));
}

// Loopback relays: the links of one GPU share its allocation without
// overlapping, each buffer on a 64 KiB boundary even for an odd chunk size;
// a link that needs none gets none.
TEST(RelayStaging, LoopbackLinksShareTheirGpusAllocationWithoutOverlap) {
  const size_t bytes = kMiB + 4097;
  const size_t stride = 17 * 64 * kKiB;  // bytes rounded up to 64 KiB
  const auto p = plan_relay_staging({0, 1, 0, 0}, {2, 0, 2, 2}, bytes);
  EXPECT_EQ(p.gpus, std::vector<int>({0}));
  EXPECT_EQ(p.gpu_of, std::vector<int>({0, -1, 0, 0}));
  EXPECT_TRUE(p.offsets[1].empty());
  EXPECT_EQ(p.bytes_per_gpu, 6 * stride);
  std::set<size_t> seen;
  for (const auto& link : p.offsets)
    for (size_t at : link) {
      EXPECT_EQ(at % (64 * kKiB), 0u);
      EXPECT_LE(at + bytes, p.bytes_per_gpu);
      EXPECT_TRUE(seen.insert(at).second) << "two buffers at " << at;
    }
  EXPECT_EQ(seen.size(), 6u);
}

// GPUs holding different numbers of buffers: the allocation is sized for the fullest.
TEST(RelayStaging, TheAllocationFitsTheFullestGpu) {
  const auto p = plan_relay_staging({0, 1, 0}, {2, 2, 2}, 2 * kMiB);
  EXPECT_EQ(p.gpus, std::vector<int>({0, 1}));
  EXPECT_EQ(p.bytes_per_gpu, 8 * kMiB);
  EXPECT_EQ(p.offsets[2], std::vector<size_t>({4 * kMiB, 6 * kMiB}));
  EXPECT_EQ(plan_relay_staging({0, 1}, {0, 0}, kMiB).gpus.size(), 0u);
}
