// Empty parts of a call: a rank that sends or receives nothing in
// all_to_allv passes a zero-element tensor, whose data pointer is null. What
// each rank's pointers must hold (rank_bytes) decides which pointers are
// looked at, and the plans built around a null empty pointer never read or
// write through it.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "coll/plan.hpp"
#include "coll/sm_path.hpp"

using namespace ferry;

namespace {

std::vector<char*> far_apart(int world, uintptr_t tag) {
  std::vector<char*> out;
  for (int p = 0; p < world; ++p) out.push_back(reinterpret_cast<char*>(tag << 44 | uintptr_t(p) << 36));
  return out;
}

// Byte arrays standing for the GPUs' buffers; a copy through a pointer that is
// not inside one of them (a null one) fails the test.
struct Memory {
  std::map<const char*, std::vector<unsigned char>*> bases;
  unsigned char* at(const void* p, size_t bytes) {
    auto c = static_cast<const char*>(p);
    auto it = bases.upper_bound(c);
    if (it == bases.begin()) return nullptr;
    --it;
    if (c + bytes > it->first + it->second->size()) return nullptr;
    return it->second->data() + (c - it->first);
  }
  void run(const Copy& c) {
    if (c.bytes == 0) return;
    unsigned char* d = at(c.dst, c.bytes);
    unsigned char* s = at(c.src, c.bytes);
    ASSERT_TRUE(d && s) << "a copy of " << c.bytes << " bytes outside every buffer";
    std::memmove(d, s, c.bytes);
  }
};

}  // namespace

TEST(EmptyCalls, RankBytesOfEveryCollective) {
  const std::vector<size_t> none;
  // all_gather: out world x in; all_to_all: both world blocks.
  EXPECT_EQ(rank_bytes(CollOp::kAllGather, 4, 1, 0, 10, none).out, 40u);
  EXPECT_EQ(rank_bytes(CollOp::kAllGather, 4, 1, 0, 10, none).in, 10u);
  EXPECT_EQ(rank_bytes(CollOp::kAllToAll, 4, 3, 0, 10, none).out, 40u);
  EXPECT_EQ(rank_bytes(CollOp::kAllToAll, 4, 3, 0, 10, none).in, 40u);
  // broadcast: only the root sends.
  EXPECT_EQ(rank_bytes(CollOp::kBroadcast, 4, 2, 2, 10, none).in, 10u);
  EXPECT_EQ(rank_bytes(CollOp::kBroadcast, 4, 1, 2, 10, none).in, 0u);
  EXPECT_EQ(rank_bytes(CollOp::kBroadcast, 4, 1, 2, 10, none).out, 10u);
  // reductions: bytes is reduce_scatter's result, all_reduce's buffer.
  EXPECT_EQ(rank_bytes(CollOp::kReduceScatter, 4, 0, 0, 8, none).out, 8u);
  EXPECT_EQ(rank_bytes(CollOp::kReduceScatter, 4, 0, 0, 8, none).in, 32u);
  EXPECT_EQ(rank_bytes(CollOp::kAllReduce, 4, 0, 0, 8, none).out, 8u);
  EXPECT_EQ(rank_bytes(CollOp::kAllReduce, 4, 0, 0, 8, none).in, 8u);
  // all_to_allv: rank 1 sends nothing, rank 2 receives nothing.
  const std::vector<size_t> counts = {1, 2, 0,  //
                                      0, 0, 0,  //
                                      4, 5, 0};
  EXPECT_EQ(rank_bytes(CollOp::kAllToAllv, 3, 0, 0, 12, counts).in, 3u);
  EXPECT_EQ(rank_bytes(CollOp::kAllToAllv, 3, 0, 0, 12, counts).out, 5u);
  EXPECT_EQ(rank_bytes(CollOp::kAllToAllv, 3, 1, 0, 12, counts).in, 0u);
  EXPECT_EQ(rank_bytes(CollOp::kAllToAllv, 3, 1, 0, 12, counts).out, 7u);
  EXPECT_EQ(rank_bytes(CollOp::kAllToAllv, 3, 2, 0, 12, counts).in, 9u);
  EXPECT_EQ(rank_bytes(CollOp::kAllToAllv, 3, 2, 0, 12, counts).out, 0u);
}

TEST(EmptyCalls, AllToAllvWithARankThatSendsNothingAndOneThatReceivesNothing) {
  // Rank 1 sends nothing (its `in` is null), rank 2 receives nothing (its
  // `out` is an empty slice at the registered offset, like every rank's); rank
  // 3 sends only to itself. Every pair still handshakes (targets and sources:
  // all peers), no copy has zero bytes or touches a null pointer, and every
  // byte lands once where it belongs, bounce through the next rank or not.
  const int world = 4;
  const std::vector<size_t> counts = {3, 5, 0, 7,   //
                                      0, 0, 0, 0,   //
                                      2, 9, 0, 1,   //
                                      0, 0, 0, 6};  // [src * world + dst]
  for (bool bounce : {false, true}) {
    std::vector<std::vector<unsigned char>> in(world), out(world), area(world);
    Memory mem;
    auto ins = far_apart(world, 2), outs = far_apart(world, 3), areas = far_apart(world, 4);
    std::vector<const char*> in_ptr(world);
    for (int r = 0; r < world; ++r) {
      in[r].resize(all_to_allv_send_total(world, counts, r));
      for (size_t i = 0; i < in[r].size(); ++i) in[r][i] = static_cast<unsigned char>(r * 60 + i + 1);
      in_ptr[r] = in[r].empty() ? nullptr : ins[r];
      if (!in[r].empty()) mem.bases[ins[r]] = &in[r];
      out[r].assign(all_to_allv_recv_total(world, counts, r), 0xee);
      if (!out[r].empty()) mem.bases[outs[r]] = &out[r];
      area[r].assign(all_to_allv_largest_own(world, counts), 0xdd);
      mem.bases[areas[r]] = &area[r];
    }
    ASSERT_TRUE(in[1].empty());
    ASSERT_TRUE(out[2].empty());
    std::vector<Exchange> xs;
    for (int r = 0; r < world; ++r) {
      xs.push_back(plan_all_to_allv(r, world, outs, in_ptr[r], counts, bounce ? &areas : nullptr));
      const Exchange& x = xs.back();
      EXPECT_EQ(x.targets, cyclic_peers(r, world));
      EXPECT_EQ(x.sources, cyclic_peers(r, world));
      for (const auto& pc : x.pushes) {
        EXPECT_GT(pc.copy.bytes, 0u);
        mem.run(pc.copy);
      }
    }
    EXPECT_TRUE(xs[1].pushes.empty());
    EXPECT_EQ(xs[1].local.bytes, 0u);
    for (const auto& x : xs) {
      if (x.local_pull.peer >= 0)
        mem.run(x.local_pull.copy);
      else
        mem.run(x.local);
    }
    for (int d = 0; d < world; ++d) {
      size_t at = 0;
      for (int s = 0; s < world; ++s) {
        const size_t from = all_to_allv_send_offset(world, counts, s, d);
        for (size_t i = 0; i < counts[s * world + d]; ++i)
          ASSERT_EQ(out[d][at + i], in[s][from + i]) << bounce << " " << d << " " << s << " " << i;
        at += counts[s * world + d];
      }
      EXPECT_EQ(at, out[d].size());
    }
  }
}

TEST(EmptyCalls, TheSmPathMovesNothingThroughANullPointer) {
  // algo "sm": a rank that sends nothing (null in) has no span to send and no
  // own block; one that receives nothing has nothing to copy out. The
  // low-latency format still sends each peer one unit (its flag), whose data
  // reads nothing.
  const int world = 3;
  const std::vector<size_t> counts = {0, 0, 0,  //
                                      4, 0, 8,  //
                                      2, 0, 1};
  char* out = reinterpret_cast<char*>(uintptr_t(1) << 40);
  SmPathStep quiet = plan_sm_path(CollOp::kAllToAllv, 0, world, nullptr, out, 0, 0, counts, 7);
  for (int p = 0; p < world; ++p) EXPECT_EQ(quiet.send_bytes[p], 0u);
  EXPECT_EQ(quiet.own_bytes, 0u);
  EXPECT_EQ(quiet.recv_bytes[1], 4u);
  SmPathStep deaf = plan_sm_path(CollOp::kAllToAllv, 1, world, out, nullptr, 0, 0, counts, 7);
  for (int p = 0; p < world; ++p) EXPECT_EQ(deaf.recv_bytes[p], 0u);
  EXPECT_EQ(deaf.own_bytes, 0u);
  EXPECT_EQ(deaf.send_bytes[2], 8u);
  EXPECT_EQ(sm_path_ll_units(0), 1u);
  const SmPathUnitData d = sm_path_ll_pack(nullptr, 0);  // reads nothing
  EXPECT_EQ(d.lo, 0u);
  EXPECT_EQ(d.hi, 0u);
  sm_path_ll_unpack(nullptr, d, 0);  // writes nothing
  size_t begin = 99;
  EXPECT_EQ(sm_path_span_share(0, 4, 2, &begin), 0u);
}

TEST(EmptyCalls, EmptyRangesNeverOverlap) {
  char buf[16];
  EXPECT_FALSE(ranges_overlap(nullptr, 0, buf, 16));
  EXPECT_FALSE(ranges_overlap(buf + 4, 0, buf, 16));  // an empty slice inside another buffer
  EXPECT_FALSE(ranges_overlap(nullptr, 0, nullptr, 0));
}
