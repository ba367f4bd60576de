#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "coll/plan.hpp"
#include "coll/program.hpp"
#include "core/error.hpp"

using namespace ferry;

namespace {
// Fake, far-apart addresses: each rank's buffer at a distinct high base.
std::vector<char*> fake_buffers(int world, uintptr_t tag = 1) {
  std::vector<char*> out;
  for (int p = 0; p < world; ++p) out.push_back(reinterpret_cast<char*>(tag << 44 | uintptr_t(p) << 36));
  return out;
}

// Runs the plans of every rank on byte arrays standing for the GPUs' buffers:
// the whole protocol's data movement, checked without a GPU.
struct Sim {
  std::map<char*, std::vector<unsigned char>*> bases;
  void add(char* base, std::vector<unsigned char>* mem) { bases[base] = mem; }
  unsigned char* at(const void* p) {
    auto c = static_cast<const char*>(p);
    auto it = bases.upper_bound(const_cast<char*>(c));
    --it;
    return it->second->data() + (c - it->first);
  }
  void run(const Copy& c) {
    if (c.bytes) std::memmove(at(c.dst), at(c.src), c.bytes);
  }
};
}  // namespace

TEST(Plan, CyclicShiftStepsFormPermutations) {
  // At every step each rank targets a different peer: no receiver takes two pushes at once.
  for (int world : {2, 3, 4, 8}) {
    for (int k = 0; k < world - 1; ++k) {
      std::set<int> targets;
      for (int r = 0; r < world; ++r) targets.insert(cyclic_peers(r, world)[k]);
      EXPECT_EQ(static_cast<int>(targets.size()), world);
    }
  }
}

TEST(Plan, AllGatherPushesOwnBlockEverywhere) {
  auto outs = fake_buffers(4);
  const char* in = reinterpret_cast<const char*>(0x1000);
  auto x = plan_all_gather(1, 4, outs, in, 100);
  ASSERT_EQ(x.pushes.size(), 3u);
  EXPECT_EQ(x.targets, (std::vector<int>{2, 3, 0}));
  EXPECT_EQ(x.sources, x.targets);
  for (const auto& pc : x.pushes) {
    EXPECT_EQ(pc.copy.dst, outs[pc.peer] + 100);
    EXPECT_EQ(pc.copy.src, in);
  }
  EXPECT_EQ(x.local.dst, outs[1] + 100);
  EXPECT_EQ(plan_all_gather(1, 4, outs, outs[1] + 100, 100).local.bytes, 0u);  // in-place
}

TEST(Plan, OwnBlockIsReadBackFromThePeerItsOwnPushWrote) {
  // all_gather and a broadcast root: the pull's source is exactly the first
  // push's destination, its destination the local copy's, so running pushes
  // then pulls fills every output without a copy within a GPU.
  const int world = 3;
  const size_t n = 37;
  std::vector<std::vector<unsigned char>> in(world), out(world);
  Sim sim;
  auto ins = fake_buffers(world, 2), outs = fake_buffers(world, 3);
  for (int r = 0; r < world; ++r) {
    in[r].resize(n);
    for (size_t i = 0; i < n; ++i) in[r][i] = static_cast<unsigned char>(r * 60 + i);
    out[r].assign(world * n, 0xee);
    sim.add(ins[r], &in[r]);
    sim.add(outs[r], &out[r]);
  }
  std::vector<Exchange> xs;
  for (int r = 0; r < world; ++r) xs.push_back(plan_all_gather(r, world, outs, ins[r], n));
  for (const auto& x : xs) {
    ASSERT_GE(x.local_pull.peer, 0);
    EXPECT_EQ(x.local_pull.peer, x.pushes.front().peer);
    EXPECT_EQ(x.local_pull.copy.src, x.pushes.front().copy.dst);
    EXPECT_EQ(x.local_pull.copy.dst, x.local.dst);
    EXPECT_EQ(x.local_pull.copy.bytes, x.local.bytes);
    for (const auto& pc : x.pushes) sim.run(pc.copy);
  }
  for (const auto& x : xs) sim.run(x.local_pull.copy);
  for (int d = 0; d < world; ++d)
    for (int s = 0; s < world; ++s)
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[d][s * n + i], in[s][i]) << d << " " << s << " " << i;

  auto root = plan_broadcast(1, 4, 1, fake_buffers(4), ins[0], 64);
  EXPECT_EQ(root.local_pull.peer, 2);
  EXPECT_EQ(root.local_pull.copy.src, root.pushes.front().copy.dst);
  // Nothing to read back: in-place calls, all_to_all (its own block goes nowhere else), one rank.
  EXPECT_LT(plan_all_gather(1, 4, fake_buffers(4), fake_buffers(4)[1] + 64, 64).local_pull.peer, 0);
  EXPECT_LT(plan_all_to_all(1, 4, fake_buffers(4), ins[0], 64).local_pull.peer, 0);
  EXPECT_LT(plan_all_gather(0, 1, fake_buffers(1), ins[0], 64).local_pull.peer, 0);
}

TEST(Plan, AllToAllOwnBlockBouncesThroughTheNextRank) {
  // Pushes (the bounce included) of every rank, then every pull: each output
  // is complete, no rank copied within its GPU, and each bounce area took
  // exactly one rank's block (the rank before it in cyclic order).
  const int world = 3;
  const size_t n = 11;
  std::vector<size_t> counts = {4, 0, 5, 7, 9, 1, 3, 2, 6};  // all_to_allv [src * world + dst]
  for (bool v : {false, true}) {
    std::vector<std::vector<unsigned char>> in(world), out(world), area(world);
    Sim sim;
    auto ins = fake_buffers(world, 2), outs = fake_buffers(world, 3), bounce = fake_buffers(world, 4);
    for (int r = 0; r < world; ++r) {
      in[r].resize(v ? all_to_allv_send_total(world, counts, r) : world * n);
      for (size_t i = 0; i < in[r].size(); ++i) in[r][i] = static_cast<unsigned char>(r * 70 + i);
      out[r].assign(v ? all_to_allv_recv_total(world, counts, r) : world * n, 0xee);
      area[r].assign(v ? all_to_allv_largest_own(world, counts) : n, 0xdd);
      sim.add(ins[r], &in[r]);
      sim.add(outs[r], &out[r]);
      sim.add(bounce[r], &area[r]);
    }
    EXPECT_EQ(all_to_allv_largest_own(world, counts), 9u);
    std::vector<Exchange> xs;
    for (int r = 0; r < world; ++r) {
      xs.push_back(v ? plan_all_to_allv(r, world, outs, ins[r], counts, &bounce)
                     : plan_all_to_all(r, world, outs, ins[r], n, &bounce));
      const Exchange& x = xs.back();
      ASSERT_EQ(x.local_pull.peer, (r + 1) % world);
      EXPECT_EQ(x.pushes.back().copy.dst, bounce[(r + 1) % world]);
      EXPECT_EQ(x.local_pull.copy.src, bounce[(r + 1) % world]);
      EXPECT_EQ(x.local_pull.copy.dst, x.local.dst);
      for (const auto& pc : x.pushes) sim.run(pc.copy);
    }
    for (const auto& x : xs) sim.run(x.local_pull.copy);
    for (int d = 0; d < world; ++d) {
      size_t at = 0;
      for (int src = 0; src < world; ++src) {
        const size_t len = v ? counts[src * world + d] : n;
        const size_t from = v ? all_to_allv_send_offset(world, counts, src, d) : d * n;
        for (size_t i = 0; i < len; ++i) ASSERT_EQ(out[d][at + i], in[src][from + i]) << v << d << src << i;
        at += len;
      }
    }
  }
  // Nothing to bounce: an empty own block, one rank.
  std::vector<size_t> zero_own = {0, 1, 1, 0};
  auto b2 = fake_buffers(2, 4);
  EXPECT_LT(plan_all_to_allv(0, 2, fake_buffers(2), fake_buffers(2, 2)[0], zero_own, &b2).local_pull.peer, 0);
  auto b1 = fake_buffers(1, 4);
  EXPECT_LT(plan_all_to_all(0, 1, fake_buffers(1), fake_buffers(1, 2)[0], 8, &b1).local_pull.peer, 0);
}

TEST(Plan, AllToAllBounceChoice) {
  const size_t cap = kPeerLocalMaxBytes;
  EXPECT_EQ(own_block_bounce_bytes(LocalCopy::kAuto, 4096, 4, true), 4096u);
  EXPECT_EQ(own_block_bounce_bytes(LocalCopy::kAuto, cap + 1, 4, true), 0u);  // the kernel above the bound
  EXPECT_EQ(own_block_bounce_bytes(LocalCopy::kPeer, cap * 8, 4, true), cap * 8);
  EXPECT_EQ(own_block_bounce_bytes(LocalCopy::kKernel, 4096, 4, true), 0u);
  EXPECT_EQ(own_block_bounce_bytes(LocalCopy::kDriver, 4096, 4, true), 0u);
  EXPECT_EQ(own_block_bounce_bytes(LocalCopy::kAuto, 0, 4, true), 0u);     // nothing of its own anywhere
  EXPECT_EQ(own_block_bounce_bytes(LocalCopy::kPeer, 4096, 1, true), 0u);  // no peer
  // No scratch to be had (a capture): auto falls back; an explicit peer still
  // asks, so the caller names the scratch to reserve.
  EXPECT_EQ(own_block_bounce_bytes(LocalCopy::kAuto, 4096, 4, false), 0u);
  EXPECT_EQ(own_block_bounce_bytes(LocalCopy::kPeer, 4096, 4, false), 4096u);
}

TEST(Plan, LocalCopyChoice) {
  const size_t cap = kPeerLocalMaxBytes;
  EXPECT_EQ(resolve_local_copy(LocalCopy::kAuto, true, 1), LocalCopy::kPeer);
  EXPECT_EQ(resolve_local_copy(LocalCopy::kAuto, true, cap), LocalCopy::kPeer);
  EXPECT_EQ(resolve_local_copy(LocalCopy::kAuto, true, cap + 1), LocalCopy::kKernel);
  EXPECT_EQ(resolve_local_copy(LocalCopy::kAuto, false, 1), LocalCopy::kKernel);
  EXPECT_EQ(resolve_local_copy(LocalCopy::kPeer, true, cap * 64), LocalCopy::kPeer);
  EXPECT_EQ(resolve_local_copy(LocalCopy::kPeer, false, 1), LocalCopy::kKernel);
  EXPECT_EQ(resolve_local_copy(LocalCopy::kDriver, true, 1), LocalCopy::kDriver);
  EXPECT_EQ(resolve_local_copy(LocalCopy::kKernel, true, 1), LocalCopy::kKernel);
}

TEST(Plan, LocalCopyNames) {
  EXPECT_EQ(parse_local_copy("auto", "local_copy"), LocalCopy::kAuto);
  EXPECT_EQ(parse_local_copy("", "local_copy"), LocalCopy::kAuto);
  EXPECT_EQ(parse_local_copy("peer", "local_copy"), LocalCopy::kPeer);
  EXPECT_EQ(parse_local_copy("sm", "local_copy"), LocalCopy::kKernel);
  EXPECT_EQ(parse_local_copy("driver", "local_copy"), LocalCopy::kDriver);
  for (const char* bad : {"ce", "dma"}) {
    try {
      parse_local_copy(bad, "local_copy");
      FAIL() << bad;
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(std::string("local_copy is '") + bad + "'"), std::string::npos) << m;
      EXPECT_EQ(m.find("was removed") != std::string::npos, std::string(bad) == "ce") << m;
    }
  }
}

TEST(Plan, AllToAllvMovesEveryByteOnceToItsPackedPlace) {
  const int world = 3;
  std::vector<size_t> counts = {1, 0, 5, 7, 2, 0, 3, 4, 9};  // [src * world + dst]
  std::vector<std::vector<unsigned char>> in(world), out(world);
  Sim sim;
  auto ins = fake_buffers(world, 2), outs = fake_buffers(world, 3);
  for (int r = 0; r < world; ++r) {
    in[r].resize(all_to_allv_send_total(world, counts, r));
    for (size_t i = 0; i < in[r].size(); ++i) in[r][i] = static_cast<unsigned char>(r * 50 + i);
    out[r].assign(all_to_allv_recv_total(world, counts, r), 0xee);
    sim.add(ins[r], &in[r]);
    sim.add(outs[r], &out[r]);
  }
  for (int r = 0; r < world; ++r) {
    auto x = plan_all_to_allv(r, world, outs, ins[r], counts);
    for (const auto& pc : x.pushes) sim.run(pc.copy);
    sim.run(x.local);
  }
  for (int d = 0; d < world; ++d) {
    size_t at = 0;
    for (int s = 0; s < world; ++s) {
      size_t from = all_to_allv_send_offset(world, counts, s, d);
      for (size_t i = 0; i < counts[s * world + d]; ++i) EXPECT_EQ(out[d][at + i], in[s][from + i]);
      at += counts[s * world + d];
    }
    EXPECT_EQ(at, out[d].size());
  }
}

TEST(Plan, BroadcastRootPushesOthersOnlyReceive) {
  auto outs = fake_buffers(4);
  const char* in = reinterpret_cast<const char*>(0x1000);
  auto root = plan_broadcast(2, 4, 2, outs, in, 64);
  EXPECT_EQ(root.targets.size(), 3u);
  EXPECT_TRUE(root.sources.empty());
  EXPECT_EQ(root.pushes.size(), 3u);
  EXPECT_EQ(root.local.bytes, 64u);
  auto leaf = plan_broadcast(0, 4, 2, outs, nullptr, 64);
  EXPECT_TRUE(leaf.targets.empty());
  EXPECT_EQ(leaf.sources, (std::vector<int>{2}));
  EXPECT_TRUE(leaf.pushes.empty());
  EXPECT_EQ(plan_broadcast(2, 4, 2, outs, outs[2], 64).local.bytes, 0u);
}

TEST(Plan, SplitBlocksCoverTheCountEvenly) {
  for (size_t count : {0ul, 1ul, 7ul, 8ul, 1000003ul}) {
    auto b = split_blocks(count, 2, 4);
    size_t at = 0, most = 0, least = SIZE_MAX;
    for (const auto& x : b) {
      EXPECT_EQ(x.offset, at);
      at += x.bytes;
      most = std::max(most, x.bytes);
      least = std::min(least, x.bytes);
    }
    EXPECT_EQ(at, count * 2);
    EXPECT_LE(most - least, 2u);
  }
}

TEST(Plan, AllReduceDataMovementReachesEveryRank) {
  // The shape collectives.cpp builds above one exchange's bound: blocks in
  // 16-byte units, then per round a scatter of every block's part into the
  // slots and a "reduction" of this rank's part; a gather at the end. One
  // round, and rounds of 512 bytes (uneven blocks, so the last round of a
  // short block is empty); every byte checked.
  for (int world : {2, 3, 4})
    for (size_t round_bytes : {size_t(0), size_t(512)}) {
      const size_t count = 1003, es = 4;
      auto blocks = split_blocks(count, es, world, 16);
      for (const auto& b : blocks) EXPECT_EQ(b.offset % 16, 0u);
      const size_t stride = scratch_slot_stride(largest_block(blocks));
      std::vector<std::vector<unsigned char>> in(world), out(world), scr(world);
      auto ins = fake_buffers(world, 2), outs = fake_buffers(world, 3), scrs = fake_buffers(world, 4);
      Sim sim;
      for (int r = 0; r < world; ++r) {
        in[r].resize(count * es);
        for (size_t i = 0; i < in[r].size(); ++i) in[r][i] = static_cast<unsigned char>(r * 31 + i * 7);
        out[r].assign(count * es, 0);
        scr[r].assign(stride * world, 0);
        sim.add(ins[r], &in[r]);
        sim.add(outs[r], &out[r]);
        sim.add(scrs[r], &scr[r]);
      }
      const auto rounds = plan_rounds(largest_block(blocks), round_bytes);
      ASSERT_EQ(rounds.size(), round_bytes ? (largest_block(blocks) + round_bytes - 1) / round_bytes : 1);
      for (const auto& round : rounds) {
        std::vector<Block> part;
        std::vector<char*> slots;
        for (int p = 0; p < world; ++p) {
          part.push_back(block_round(blocks[p], round));
          slots.push_back(scrs[p] + round.begin);
        }
        for (int r = 0; r < world; ++r)
          for (const auto& pc : plan_scatter_to_scratch(r, world, slots, ins[r], part, stride).pushes) sim.run(pc.copy);
        for (int r = 0; r < world; ++r)
          for (size_t i = 0; i < part[r].bytes; ++i) {
            unsigned sum = in[r][part[r].offset + i];
            for (int p = 0; p < world; ++p)
              if (p != r) sum += scr[r][p * stride + round.begin + i];
            out[r][part[r].offset + i] = static_cast<unsigned char>(sum);
          }
      }
      for (int r = 0; r < world; ++r)
        for (const auto& pc : plan_gather_blocks(r, world, outs, blocks).pushes) sim.run(pc.copy);
      for (int r = 0; r < world; ++r)
        for (size_t i = 0; i < count * es; ++i) {
          unsigned sum = 0;
          for (int p = 0; p < world; ++p) sum += in[p][i];
          ASSERT_EQ(out[r][i], static_cast<unsigned char>(sum)) << "world " << world << " rank " << r << " byte " << i;
        }
    }
}

TEST(Plan, AllReduceOnTwoRanksIsOneExchangeUpToItsBound) {
  const size_t MiB = size_t(1) << 20;
  EXPECT_TRUE(all_reduce_one_exchange(2, 1));
  EXPECT_TRUE(all_reduce_one_exchange(2, kAllReduceOneExchangeMaxBytes));
  EXPECT_FALSE(all_reduce_one_exchange(2, kAllReduceOneExchangeMaxBytes + 1));
  EXPECT_FALSE(all_reduce_one_exchange(4, 1024));
  auto whole = all_reduce_blocks(1000, 4, 2);
  ASSERT_EQ(whole.size(), 2u);
  for (const auto& b : whole) {
    EXPECT_EQ(b.offset, 0u);
    EXPECT_EQ(b.bytes, 4000u);
  }
  EXPECT_EQ(all_reduce_blocks(1000, 4, 4).size(), 4u);
  EXPECT_EQ(largest_block(all_reduce_blocks(128 * MiB / 4, 4, 2)), 64 * MiB);  // split above the bound

  // Data movement: each rank's whole buffer into the other's slot, then every
  // rank reduces both in rank order: the same sum everywhere, nothing to gather.
  const int world = 2;
  const size_t bytes = 1003, stride = scratch_slot_stride(bytes);
  std::vector<std::vector<unsigned char>> in(world), scr(world);
  auto ins = fake_buffers(world, 2), scrs = fake_buffers(world, 4);
  Sim sim;
  for (int r = 0; r < world; ++r) {
    in[r].resize(bytes);
    for (size_t i = 0; i < bytes; ++i) in[r][i] = static_cast<unsigned char>(r * 13 + i);
    scr[r].assign(stride * world, 0);
    sim.add(ins[r], &in[r]);
    sim.add(scrs[r], &scr[r]);
  }
  auto blocks = all_reduce_blocks(bytes, 1, world);
  for (int r = 0; r < world; ++r)
    for (const auto& pc : plan_scatter_to_scratch(r, world, scrs, ins[r], blocks, stride).pushes) sim.run(pc.copy);
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < bytes; ++i)
      ASSERT_EQ(static_cast<unsigned char>(in[r][i] + scr[r][(1 - r) * stride + i]),
                static_cast<unsigned char>(in[0][i] + in[1][i]));
}

TEST(Plan, SplitBlocksInUnitsKeepBlockStartsAligned) {
  for (size_t es : {2ul, 4ul, 8ul})
    for (size_t count : {1ul, 7ul, 100ul, 1000003ul})
      for (int world : {2, 3, 8}) {
        auto b = split_blocks(count, es, world, 16);
        size_t at = 0;
        for (const auto& x : b) {
          EXPECT_EQ(x.offset, at);
          EXPECT_EQ(x.offset % 16, 0u) << "count " << count << " es " << es << " world " << world;
          at += x.bytes;
        }
        EXPECT_EQ(at, count * es);
        // As even as the unit allows: within one unit plus the short tail.
        EXPECT_LE(largest_block(b), (count * es / world + 16) / 16 * 16 + 16);
      }
}

TEST(Plan, ReduceRoundsPipelineOnlyLargeBlocks) {
  const size_t MiB = size_t(1) << 20;
  EXPECT_EQ(reduce_round_bytes(1000), 1000u);           // one round
  EXPECT_EQ(reduce_round_bytes(127 * MiB), 127 * MiB);  // still one
  EXPECT_EQ(reduce_round_bytes(128 * MiB), 64 * MiB);   // two
  EXPECT_EQ(reduce_round_bytes(512 * MiB), 128 * MiB);  // at most four
  EXPECT_EQ(reduce_round_bytes(2048 * MiB), 512 * MiB);
  EXPECT_EQ(reduce_round_bytes(1000, 300), 512u);  // forced, in 256-byte multiples
  for (size_t block : {129 * MiB + 3, 300 * MiB + 1, 1000 * MiB + 7}) {
    const size_t r = reduce_round_bytes(block);
    EXPECT_EQ(r % 256, 0u);
    const auto rounds = plan_rounds(block, r);
    EXPECT_GE(rounds.size(), 2u);
    EXPECT_LE(rounds.size(), kReduceMaxRounds);
    EXPECT_EQ(rounds.back().begin + rounds.back().len, block);
  }
  // A block shorter than a round's start gives an empty part at its end.
  const Block b{4096, 100};
  EXPECT_EQ(block_round(b, Round{0, 64}).offset, 4096u);
  EXPECT_EQ(block_round(b, Round{64, 64}).bytes, 36u);
  EXPECT_EQ(block_round(b, Round{128, 64}).bytes, 0u);
  EXPECT_EQ(block_round(b, Round{128, 64}).offset, 4196u);
}

TEST(Plan, InPlaceAllToAllInRoundsThroughBoundedScratch) {
  const int world = 3;
  const size_t bytes = 1000, chunk = 300, stride = 320;
  std::vector<std::vector<unsigned char>> buf(world), scr(world), want(world);
  auto bufs = fake_buffers(world, 2), scrs = fake_buffers(world, 4);
  Sim sim;
  for (int r = 0; r < world; ++r) {
    buf[r].resize(bytes * world);
    for (size_t i = 0; i < buf[r].size(); ++i) buf[r][i] = static_cast<unsigned char>(r * 7 + i * 13);
    scr[r].assign(stride * world, 0);
    sim.add(bufs[r], &buf[r]);
    sim.add(scrs[r], &scr[r]);
  }
  for (int d = 0; d < world; ++d) {
    want[d].resize(bytes * world);
    for (int s = 0; s < world; ++s)
      std::copy(buf[s].begin() + d * bytes, buf[s].begin() + (d + 1) * bytes, want[d].begin() + s * bytes);
  }
  auto rounds = plan_rounds(bytes, chunk);
  ASSERT_EQ(rounds.size(), 4u);
  for (const auto& round : rounds) {
    // Every rank pushes (the done handshake), then every rank unpacks.
    for (int r = 0; r < world; ++r)
      for (const auto& pc : plan_in_place_round(r, world, scrs, bufs[r], bytes, round, stride).pushes) sim.run(pc.copy);
    for (int r = 0; r < world; ++r)
      for (const auto& c : plan_in_place_unpack(r, world, bufs[r], scrs[r], bytes, round, stride)) sim.run(c);
  }
  for (int r = 0; r < world; ++r) EXPECT_EQ(buf[r], want[r]);
}

TEST(Plan, ScratchSizingStaysWithinTheCap) {
  EXPECT_EQ(in_place_chunk(1000, 4, 64 << 20), 1000u);                 // the whole block fits
  EXPECT_EQ(in_place_chunk(size_t(1) << 30, 4, 64 << 20), 16u << 20);  // cap / world
  EXPECT_EQ(in_place_chunk(5, 8, 4), 1u);                              // never 0
  EXPECT_EQ(scratch_slot_stride(0), 256u);
  EXPECT_EQ(scratch_slot_stride(256), 256u);
  EXPECT_EQ(scratch_slot_stride(257), 512u);
  for (size_t cap : {size_t(4096), size_t(64) << 20})
    for (int world : {2, 4, 8})
      for (size_t block : {size_t(1), size_t(100003), size_t(1) << 28}) {
        size_t chunk = in_place_chunk(block, world, cap);
        EXPECT_LE(chunk, block);
        EXPECT_LE(scratch_slot_stride(chunk) * world, cap + 256 * world);
      }
  EXPECT_EQ(largest_block(split_blocks(10, 4, 4)), 12u);
}

TEST(Program, MasksNameEveryPeerOfEveryExchange) {
  Program p;
  p.add_exchange(plan_broadcast(0, 4, 2, fake_buffers(4), nullptr, 8));
  EXPECT_EQ(p.targets_mask, 0u);
  EXPECT_EQ(p.sources_mask, 1u << 2);
  p.add_exchange(plan_all_gather(0, 4, fake_buffers(4), nullptr, 8));
  EXPECT_EQ(p.targets_mask, 0b1110u);
}

TEST(RangesOverlap, Edges) {
  char b[100];
  EXPECT_TRUE(ranges_overlap(b, 10, b + 9, 10));
  EXPECT_FALSE(ranges_overlap(b, 10, b + 10, 10));
  EXPECT_FALSE(ranges_overlap(b, 0, b, 10));
  EXPECT_TRUE(ranges_overlap(b + 5, 1, b, 100));
}

TEST(DoneCopies, OneByOneExceptLargePushesBeyondTwoRanks) {
  EXPECT_TRUE(done_copies_one_by_one(2, 1 << 30));
  EXPECT_TRUE(done_copies_one_by_one(4, 1024));
  EXPECT_TRUE(done_copies_one_by_one(8, (1 << 20) - 1));
  EXPECT_FALSE(done_copies_one_by_one(4, 1 << 20));
  EXPECT_FALSE(done_copies_one_by_one(8, 256 << 20));
}
