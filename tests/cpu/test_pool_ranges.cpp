// The symmetric pool's allocator (symm/pool_ranges.hpp): the same requests
// give the same offsets, ranges come back to their own stream only,
// neighbours merge.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/error.hpp"
#include "symm/pool_ranges.hpp"

using ferry::PoolRanges;
constexpr size_t A = PoolRanges::kAlign;
using Spot = std::pair<int, size_t>;

TEST(PoolRanges, FirstFitThenTailThenNone) {
  PoolRanges r;
  EXPECT_FALSE(r.allocate(100, 1));  // no chunk yet: the caller adds one
  r.add_chunk(4 * A);
  EXPECT_EQ(r.allocate(100, 1), Spot(0, 0));
  EXPECT_EQ(r.allocate(A + 1, 1), Spot(0, A));  // rounded up to 2 x A
  EXPECT_EQ(r.allocate(A, 1), Spot(0, 3 * A));
  EXPECT_FALSE(r.allocate(1, 1));  // full
  r.add_chunk(8 * A);
  EXPECT_EQ(r.allocate(1, 1), Spot(1, 0));
  EXPECT_EQ(r.allocate(0, 1), Spot(1, A));  // an empty request still takes a unit
  EXPECT_EQ(r.bytes_in_use(), 6 * A);
}

TEST(PoolRanges, FreedRangesServeTheirOwnStreamOnly) {
  PoolRanges r;
  r.add_chunk(4 * A);
  auto a = *r.allocate(2 * A, 7);
  r.allocate(2 * A, 8);
  r.release(a.first, a.second);
  EXPECT_FALSE(r.allocate(A, 8));           // stream 8 may not take stream 7's range (it may still be in use there)
  EXPECT_EQ(r.allocate(A, 7), Spot(0, 0));  // first fit, split
  EXPECT_EQ(r.allocate(A, 7), Spot(0, A));
}

TEST(PoolRanges, NeighboursMergeAndALargeRequestReusesThem) {
  PoolRanges r;
  r.add_chunk(8 * A);
  std::vector<Spot> spots;
  for (int i = 0; i < 4; ++i) spots.push_back(*r.allocate(A, 0));
  for (int i : {2, 0, 1}) r.release(spots[i].first, spots[i].second);
  const auto free = r.free_ranges(0);
  ASSERT_EQ(free.size(), 1u);
  EXPECT_EQ(free[0], std::make_tuple(0, size_t{0}, 3 * A));
  EXPECT_EQ(r.allocate(3 * A, 0), Spot(0, 0));
}

TEST(PoolRanges, TheSameSequenceGivesTheSameOffsets) {
  // What makes the pool symmetric: two ranks that make the same calls get the
  // same answers, whatever the sizes and the order of frees; and no two
  // ranges in use overlap.
  auto replay = [](unsigned seed) {
    std::mt19937 rng(seed);
    PoolRanges r;
    std::vector<Spot> live, out;
    r.add_chunk(64 * A);
    for (int k = 0; k < 500; ++k) {
      if (!live.empty() && rng() % 100 < 45) {
        const size_t i = rng() % live.size();
        r.release(live[i].first, live[i].second);
        live.erase(live.begin() + static_cast<long>(i));
        continue;
      }
      const size_t n = 1 + rng() % (6 * A);
      const uint64_t stream = 1 + rng() % 2;
      auto spot = r.allocate(n, stream);
      if (!spot) {
        r.add_chunk(64 * A);
        spot = r.allocate(n, stream);
      }
      EXPECT_TRUE(spot.has_value());
      out.push_back(*spot);
      live.push_back(*spot);
      size_t chunk = SIZE_MAX, end = 0;
      for (const auto& [where, use] : r.in_use()) {
        if (where.first == static_cast<int>(chunk)) EXPECT_LE(end, where.second) << "ranges in use overlap";
        chunk = static_cast<size_t>(where.first);
        end = where.second + use.first;
      }
    }
    return out;
  };
  EXPECT_EQ(replay(3), replay(3));
  EXPECT_NE(replay(3), replay(4));
}

TEST(PoolRanges, BadInputIsNamed) {
  PoolRanges r;
  try {
    r.add_chunk(1000);
    ADD_FAILURE() << "a chunk of 1000 bytes was taken";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a positive multiple of 512"), std::string::npos) << e.what();
  }
  r.add_chunk(4 * A);
  EXPECT_THROW(r.release(0, A), ferry::Error);  // nothing in use there
}

TEST(PoolRanges, ANewChunkIsThePoolsSizeOrTheRequestsInWhole2MiB) {
  constexpr size_t MiB = size_t{1} << 20;
  EXPECT_EQ(PoolRanges::chunk_for(0, 1), 2 * MiB);  // a pool's own size, rounded up
  EXPECT_EQ(PoolRanges::chunk_for(100, 256 * MiB), 256 * MiB);
  EXPECT_EQ(PoolRanges::chunk_for(300 * MiB + 1, 256 * MiB), 302 * MiB);  // a larger request its own
  EXPECT_THROW(PoolRanges::chunk_for(SIZE_MAX - 5, 256 * MiB), ferry::Error);
  try {
    PoolRanges::chunk_for(0, SIZE_MAX);
    ADD_FAILURE() << "taken";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("chunk_bytes is 18446744073709551615"), std::string::npos) << e.what();
  }
}
