#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "coll/reduce.hpp"
#include "coll/selector.hpp"
#include "coll/sm_path.hpp"

using namespace ferry;

TEST(SmPath, BlocksGrowWithBytesUpToTheCap) {
  // Low-latency format: SmPathBlocks::low_latency of data per block by default.
  const size_t kLl = SmPathBlocks{}.low_latency;
  EXPECT_EQ(sm_path_blocks(0), 1);
  EXPECT_EQ(sm_path_blocks(1), 1);
  EXPECT_EQ(sm_path_blocks(kLl), 1);
  EXPECT_EQ(sm_path_blocks(kLl + 1), 2);
  EXPECT_EQ(sm_path_blocks(kSmPathLowLatencyMaxBytes),
            std::min(int(kSmPathLowLatencyMaxBytes / kLl), kSmPathDefaultMaxBlocks));
  EXPECT_EQ(sm_path_blocks(16 * kSmPathThreads, {16 * kSmPathThreads}), 1);  // two units per thread
  EXPECT_EQ(sm_path_blocks(16 * kSmPathThreads + 1, {16 * kSmPathThreads}), 2);
  // Past it: SmPathBlocks::spans (8 KB) per block.
  EXPECT_EQ(sm_path_blocks(kSmPathLowLatencyMaxBytes + 1), int(kSmPathLowLatencyMaxBytes / (8 << 10)) + 1);
  EXPECT_EQ(sm_path_blocks(128 << 10), 16);
  EXPECT_EQ(sm_path_blocks(1 << 20), kSmPathDefaultMaxBlocks);
  EXPECT_EQ(sm_path_blocks(size_t(1) << 30), kSmPathDefaultMaxBlocks);
  // Fewer data bytes per block of the low-latency format: more blocks, still at most kSmPathDefaultMaxBlocks.
  EXPECT_EQ(sm_path_blocks(16 << 10, {2048}), 8);
  EXPECT_EQ(sm_path_blocks(16 << 10, {4096}), 4);
  EXPECT_EQ(sm_path_blocks(kSmPathLowLatencyMaxBytes, {1024}), kSmPathDefaultMaxBlocks);
  EXPECT_EQ(sm_path_blocks(1, {8}), 1);
  EXPECT_EQ(sm_path_blocks(kSmPathLowLatencyMaxBytes + 1, {1024}), sm_path_blocks(kSmPathLowLatencyMaxBytes + 1));
  // The span format's bytes per block.
  EXPECT_EQ(sm_path_blocks(256 << 10, {2048, 16 << 10}), 16);
  EXPECT_EQ(sm_path_blocks(256 << 10, {2048, 64 << 10}), 4);
  EXPECT_EQ(sm_path_blocks(1 << 20, {2048, 16}), kSmPathDefaultMaxBlocks);
  // Ranks sharing a GPU: an H200 holds 132 blocks of the heaviest kernel (one per SM).
  EXPECT_EQ(sm_path_grid_bound(kSmPathDefaultMaxBlocks, 132, 8), 8);
  EXPECT_EQ(sm_path_grid_bound(kSmPathDefaultMaxBlocks, 132, 4), 16);
  EXPECT_EQ(sm_path_grid_bound(kSmPathDefaultMaxBlocks, 132, 2), kSmPathDefaultMaxBlocks);
  EXPECT_EQ(sm_path_grid_bound(kSmPathDefaultMaxBlocks, 10, 8), 1);
  EXPECT_EQ(sm_path_grid_bound(kSmPathDefaultMaxBlocks, 0, 8), 1);
  // A cap on the grid, whatever the bytes.
  EXPECT_EQ(sm_path_blocks(64 << 10, {2048, 32 << 10, 8}), 8);
  EXPECT_EQ(sm_path_blocks(1 << 20, {2048, 32 << 10, 8}), 8);
  EXPECT_EQ(sm_path_blocks(1 << 20, {2048, 32 << 10, 0}), 1);
  EXPECT_EQ(sm_path_blocks(4 << 10, {2048, 32 << 10, 8}), 2);
  // FERRY_SM_MAX_BLOCKS above the default: the span format's bytes decide, up to the header's kSmPathMaxBlocks.
  EXPECT_EQ(sm_path_blocks(4 << 20, {2048, 32 << 10, 64}), 64);
  EXPECT_EQ(sm_path_blocks(4 << 20, {2048, 32 << 10, 128}), 128);
  EXPECT_EQ(sm_path_blocks(2 << 20, {2048, 32 << 10, 128}), 64);
  EXPECT_EQ(sm_path_blocks(size_t(1) << 30, {2048, 32 << 10, 1000}), kSmPathMaxBlocks);
  EXPECT_EQ(sm_path_blocks(64 << 10, {2048, 32 << 10, 128}), 32);  // the low-latency format: 2 KB per block
  // Sharing a GPU caps below the knob, never above it.
  EXPECT_EQ(sm_path_grid_bound(128, 132, 2), 33);
  EXPECT_EQ(sm_path_grid_bound(16, 132, 2), 16);
  EXPECT_EQ(sm_path_grid_bound(0, 132, 2), 1);
  // Alone on a GPU a large grid stays resident with kSmPathFreeSms left over: all 128 on an H200 (132 SMs), 110
  // on a GPU of 114, 28 on one of 32.
  EXPECT_EQ(sm_path_grid_bound(128, 132, 1), 128);
  EXPECT_EQ(sm_path_grid_bound(128, 114, 1), 114 - kSmPathFreeSms);
  EXPECT_EQ(sm_path_grid_bound(64, 114, 1), 64);
  EXPECT_EQ(sm_path_grid_bound(128, 32, 1), 32 - kSmPathFreeSms);
  EXPECT_EQ(sm_path_grid_bound(128, 2, 1), 1);
  EXPECT_EQ(sm_path_grid_bound(1000, 1000, 1), kSmPathMaxBlocks);
  static_assert(sizeof(SmPathHeader) <= kSmPathHeaderBytes, "flags for every block of the largest grid");
}

TEST(SmPath, SlotsFollowTheHeaderAndNeverOverlap) {
  const size_t slot = 1 << 20;
  for (int world : {1, 2, 4, 8}) {
    const size_t window = sm_path_window_bytes(world, slot);
    EXPECT_EQ(window, kSmPathHeaderBytes + 2 * world * (slot + kSmPathLowLatencySlotBytes));
    size_t expected = kSmPathHeaderBytes;
    for (int parity : {0, 1})
      for (int src = 0; src < world; ++src) {
        EXPECT_EQ(sm_path_slot_offset(world, slot, parity, src), expected);
        EXPECT_EQ(sm_path_slot_offset(world, slot, parity, src) % 16, 0u);  // the kernel's 16-byte words
        expected += slot;
      }
    for (int parity : {0, 1})
      for (int src = 0; src < world; ++src) {
        EXPECT_EQ(sm_path_ll_slot_offset(world, slot, parity, src), expected);
        EXPECT_EQ(sm_path_ll_slot_offset(world, slot, parity, src) % 16, 0u);  // one unit per store
        expected += kSmPathLowLatencySlotBytes;
      }
    EXPECT_EQ(expected, window);
  }
}

TEST(SmPath, LowLatencyUnitsCarryEveryByteAndFitTheirSlot) {
  EXPECT_EQ(sm_path_ll_units(0), 1u);  // a peer with nothing to send still signals
  EXPECT_EQ(sm_path_ll_units(1), 1u);
  EXPECT_EQ(sm_path_ll_units(8), 1u);
  EXPECT_EQ(sm_path_ll_units(9), 2u);
  EXPECT_EQ(sm_path_ll_units(kSmPathLowLatencyMaxBytes) * 16, kSmPathLowLatencySlotBytes);
  EXPECT_TRUE(sm_path_low_latency(0));
  EXPECT_TRUE(sm_path_low_latency(kSmPathLowLatencyMaxBytes));
  EXPECT_FALSE(sm_path_low_latency(kSmPathLowLatencyMaxBytes + 1));
  // The plan picks the format from the call's largest block.
  std::vector<char> in(64), out(64);
  EXPECT_EQ(plan_sm_path(CollOp::kAllGather, 0, 2, in.data(), out.data(), 16, 0, {}, 7).low_latency, 1u);
  EXPECT_EQ(plan_sm_path(CollOp::kAllGather, 0, 2, in.data(), out.data(), kSmPathLowLatencyMaxBytes + 1, 0, {}, 7)
                .low_latency,
            0u);
  const std::vector<size_t> counts = {0, kSmPathLowLatencyMaxBytes + 1, 8, 0};  // one block too large for the format
  EXPECT_EQ(plan_sm_path(CollOp::kAllToAllv, 0, 2, in.data(), out.data(), 0, 0, counts, 7).low_latency, 0u);
}

TEST(SmPath, LowLatencyUnitsPackAndUnpackEveryByteAtAnyAlignment) {
  // A span of odd length at every offset, through units and back, as the
  // kernel moves it (sender packs from the input, receiver unpacks to the
  // output); bytes past the span stay untouched.
  std::vector<char> src(96), dst(96);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 37 + 11);
  for (size_t src_at : {0, 1, 3, 8, 13})
    for (size_t dst_at : {0, 5, 8, 15})
      for (size_t n : {0, 1, 7, 8, 9, 23, 64}) {
        std::fill(dst.begin(), dst.end(), char(0x5a));
        for (size_t u = 0; u < sm_path_ll_units(n); ++u) {
          const size_t avail = n > 8 * u ? n - 8 * u : 0;
          sm_path_ll_unpack(dst.data() + dst_at + 8 * u, sm_path_ll_pack(src.data() + src_at + 8 * u, avail), avail);
        }
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= dst_at && i < dst_at + n;
          ASSERT_EQ(dst[i], inside ? src[src_at + i - dst_at] : char(0x5a))
              << "src at " << src_at << ", dst at " << dst_at << ", " << n << " bytes, byte " << i;
        }
      }
  // Bytes past the span read as 0 (the tail of the last unit).
  const SmPathUnitData d = sm_path_ll_pack(src.data(), 3);
  EXPECT_EQ(d.hi, 0u);
  EXPECT_EQ(d.lo >> 24, 0u);
}

TEST(SmPath, LowLatencyFlagsAreNeverZeroAndChangeFromOneUseOfASlotToTheNext) {
  for (uint32_t tag : {0u, 7u, 0xffffffffu, 2654435761u})
    for (uint64_t call = 1; call < 5000; ++call) {
      EXPECT_NE(sm_path_ll_flag(call, tag), 0u);
      EXPECT_NE(sm_path_ll_flag(call, tag), sm_path_ll_flag(call + 2, tag));  // same slot, next use
      EXPECT_NE(sm_path_ll_flag(call, tag), sm_path_ll_flag(call, tag ^ 1));  // a peer with another call
    }
  // The flag that would be 0 is replaced; the call numbers around it keep theirs.
  const uint32_t tag = 2654435761u;  // call 1 * constant ^ tag == 0
  EXPECT_EQ(sm_path_ll_flag(1, tag), 0x9e3779b9u);
  EXPECT_NE(sm_path_ll_flag(3, tag), sm_path_ll_flag(1, tag));
}

namespace {

// Runs one call of every rank on the CPU the way the kernel moves bytes and
// returns each rank's output. `ins[r]` and `outs[r]` are rank r's buffers;
// `in_place` makes each rank's input alias its output. The format is the
// plan's (the low-latency units for small blocks) unless `spans` forces the
// other one: pushes into the peers' slots, own block, copy out of the window.
std::vector<std::vector<char>> simulate(CollOp op, int world, size_t bytes, int root, const std::vector<size_t>& counts,
                                        std::vector<std::vector<char>> ins, std::vector<std::vector<char>> outs,
                                        bool in_place = false, bool spans = false) {
  std::vector<SmPathStep> steps;
  for (int r = 0; r < world; ++r) {
    const char* in = in_place ? outs[r].data() + (op == CollOp::kAllGather ? r * bytes : 0) : ins[r].data();
    steps.push_back(plan_sm_path(op, r, world, in, outs[r].data(), bytes, root, counts, 7));
    if (spans) steps.back().low_latency = 0;
  }
  // slots[dst][src]: bytes (span format, with the block that wrote each
  // byte) or units (low-latency format).
  std::vector<std::vector<std::vector<char>>> slots(world, std::vector<std::vector<char>>(world));
  std::vector<std::vector<std::vector<int>>> writer(world, std::vector<std::vector<int>>(world));
  struct Unit {
    SmPathUnitData data;
    uint32_t flag = 0;
  };
  std::vector<std::vector<std::vector<Unit>>> units(world, std::vector<std::vector<Unit>>(world));
  const uint32_t flag = sm_path_ll_flag(1, 7);
  for (int r = 0; r < world; ++r) {  // pushes
    const SmPathStep& s = steps[r];
    for (int p = 0; p < world; ++p) {
      if (p == r) continue;
      const size_t n = s.send_bytes[p];
      if (!s.low_latency) {
        slots[p][r].assign(n, 'x');
        writer[p][r].assign(n, -1);
        for (int b = 0; b < s.blocks; ++b) {  // each block its share, then its flag
          size_t begin = 0;
          const size_t len = sm_path_span_share(n, s.blocks, b, &begin);
          std::copy(s.in + s.send_offset[p] + begin, s.in + s.send_offset[p] + begin + len,
                    slots[p][r].begin() + begin);
          std::fill(writer[p][r].begin() + begin, writer[p][r].begin() + begin + len, b);
        }
        continue;
      }
      units[p][r].resize(sm_path_ll_units(n));
      for (int b = 0; b < s.blocks; ++b) {  // each block its share, as in the kernel
        size_t u0 = 0;
        const size_t end = sm_path_ll_share(sm_path_ll_units(n), s.blocks, b, &u0);
        for (size_t u = u0; u < end; ++u)
          units[p][r][u] = Unit{sm_path_ll_pack(s.in + s.send_offset[p] + 8 * u, n > 8 * u ? n - 8 * u : 0), flag};
      }
    }
  }
  for (int r = 0; r < world; ++r) {  // own block, each block its share
    const SmPathStep& s = steps[r];
    for (int b = 0; b < s.blocks; ++b) {
      size_t begin = 0;
      const size_t len = sm_path_span_share(s.own_bytes, s.blocks, b, &begin);
      std::copy(s.in + s.send_offset[r] + begin, s.in + s.send_offset[r] + begin + len,
                s.out + s.recv_offset[r] + begin);
    }
  }
  for (int r = 0; r < world; ++r) {  // out of the window
    const SmPathStep& s = steps[r];
    for (int q = 0; q < world; ++q) {
      if (q == r) continue;
      const size_t n = s.recv_bytes[q];
      if (!s.low_latency) {
        // Block b waits for the sender's flag of block b: every byte it
        // copies out must be one that the sender's block b wrote.
        EXPECT_EQ(n, slots[r][q].size()) << "rank " << r << " from " << q;
        for (int b = 0; b < s.blocks; ++b) {
          size_t begin = 0;
          const size_t len = sm_path_span_share(n, s.blocks, b, &begin);
          for (size_t i = begin; i < begin + len && i < slots[r][q].size(); ++i) {
            EXPECT_EQ(writer[r][q][i], b) << "rank " << r << " from " << q << ", byte " << i;
            s.out[s.recv_offset[q] + i] = slots[r][q][i];
          }
        }
        continue;
      }
      // The receiver waits for exactly the units the sender sent, each with the call's flag.
      EXPECT_EQ(sm_path_ll_units(n), units[r][q].size()) << "rank " << r << " from " << q;
      for (int b = 0; b < s.blocks; ++b) {
        size_t u0 = 0;
        const size_t end = sm_path_ll_share(sm_path_ll_units(n), s.blocks, b, &u0);
        for (size_t u = u0; u < end && u < units[r][q].size(); ++u) {
          EXPECT_EQ(units[r][q][u].flag, flag) << "rank " << r << " from " << q << ", unit " << u << " never sent";
          sm_path_ll_unpack(s.out + s.recv_offset[q] + 8 * u, units[r][q][u].data, n > 8 * u ? n - 8 * u : 0);
        }
      }
    }
  }
  return outs;
}

std::vector<char> pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 31 + seed * 97 + 5) & 0xff);
  return v;
}

}  // namespace

TEST(SmPath, AllGatherAllToAllBroadcastMoveTheRightBytes) {
  // Both formats; sizes from one unit to several blocks in each (37 B: one
  // block; 40,001 B: low-latency, 20 blocks; 70,001 B: past it, 9 blocks).
  const int W = 4;
  for (size_t n : {size_t(37), size_t(40001), size_t(70001)})
    for (bool spans : {false, true}) {
      std::vector<std::vector<char>> ins, outs;
      for (int r = 0; r < W; ++r) ins.push_back(pattern(W * n, r)), outs.push_back(std::vector<char>(W * n, 'x'));
      auto ag = simulate(CollOp::kAllGather, W, n, 0, {}, ins, outs, false, spans);
      auto a2a = simulate(CollOp::kAllToAll, W, n, 0, {}, ins, outs, false, spans);
      auto bc = simulate(CollOp::kBroadcast, W, W * n, 2, {}, ins, outs, false, spans);
      for (int r = 0; r < W; ++r) {
        for (int q = 0; q < W; ++q)
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(ag[r][q * n + i], ins[q][i]) << n << " B, spans " << spans;
            ASSERT_EQ(a2a[r][q * n + i], ins[q][r * n + i]) << n << " B, spans " << spans;
          }
        ASSERT_EQ(bc[r], ins[2]) << n << " B, spans " << spans;
      }
    }
  EXPECT_EQ(sm_path_blocks(40001, {8192}), 5);
  EXPECT_EQ(sm_path_blocks(40001, {2048}), 20);
  EXPECT_EQ(sm_path_blocks(70001), 9);
  EXPECT_EQ(sm_path_blocks(70001, {2048, 32 << 10}), 3);
}

TEST(SmPath, AFlagPassesForThisCallOrThePeersNextOne) {
  const uint32_t tag = 0xabcd1234u;
  const uint64_t call = 9816;
  EXPECT_TRUE(sm_path_flag_passes(sm_path_flag_value(call, tag), call, tag));
  // Overwritten by the peer's next call (any tag: it got there only by matching ours).
  EXPECT_TRUE(sm_path_flag_passes(sm_path_flag_value(call + 1, tag), call, tag));
  EXPECT_TRUE(sm_path_flag_passes(sm_path_flag_value(call + 1, 7), call, tag));
  // Not yet sent, another call of the peer, a zeroed window, two calls on.
  EXPECT_FALSE(sm_path_flag_passes(sm_path_flag_value(call - 1, tag), call, tag));
  EXPECT_FALSE(sm_path_flag_passes(sm_path_flag_value(call, tag ^ 1), call, tag));
  EXPECT_FALSE(sm_path_flag_passes(0, call, tag));
  EXPECT_FALSE(sm_path_flag_passes(0, 1, 0));
  EXPECT_FALSE(sm_path_flag_passes(sm_path_flag_value(call + 2, tag), call, tag));
}

TEST(SmPath, SpanSharesTileTheSpanIn16ByteChunks) {
  for (size_t len : {size_t(0), size_t(1), size_t(15), size_t(16), size_t(100), size_t(70001), size_t(1) << 20})
    for (int blocks : {1, 3, 5, kSmPathMaxBlocks}) {
      size_t next = 0;
      for (int b = 0; b < blocks; ++b) {
        size_t begin = 0;
        const size_t n = sm_path_span_share(len, blocks, b, &begin);
        ASSERT_EQ(begin, next) << len << " B, " << blocks << " blocks, block " << b;
        if (n > 0 && begin + n < len) EXPECT_EQ(n % 16, 0u) << len << " B, block " << b;
        EXPECT_EQ(begin % 16 == 0 || n == 0, true) << len << " B, block " << b;
        next = begin + n;
      }
      EXPECT_EQ(next, len) << len << " B, " << blocks << " blocks";
    }
}

TEST(SmPath, InPlaceCallsCopyNothingLocally) {
  const int W = 3;
  const size_t n = 16;
  for (bool spans : {false, true}) {
    std::vector<std::vector<char>> outs;
    for (int r = 0; r < W; ++r) outs.push_back(pattern(W * n, 10 + r));
    auto ag = simulate(CollOp::kAllGather, W, n, 0, {}, {}, outs, true, spans);
    auto a2a = simulate(CollOp::kAllToAll, W, n, 0, {}, {}, outs, true, spans);
    for (int r = 0; r < W; ++r) {
      EXPECT_EQ(plan_sm_path(CollOp::kAllGather, r, W, outs[r].data() + r * n, outs[r].data(), n, 0, {}, 7).own_bytes,
                0u);
      EXPECT_EQ(plan_sm_path(CollOp::kAllToAll, r, W, outs[r].data(), outs[r].data(), n, 0, {}, 7).own_bytes, 0u);
      for (int q = 0; q < W; ++q)
        for (size_t i = 0; i < n; ++i) {
          EXPECT_EQ(ag[r][q * n + i], outs[q][q * n + i]);
          EXPECT_EQ(a2a[r][q * n + i], outs[q][r * n + i]);
        }
    }
  }
  char buf[16];
  EXPECT_EQ(plan_sm_path(CollOp::kBroadcast, 1, W, buf, buf, 16, 1, {}, 7).own_bytes, 0u);      // root in place
  EXPECT_EQ(plan_sm_path(CollOp::kBroadcast, 0, W, nullptr, buf, 16, 1, {}, 7).own_bytes, 0u);  // not the root
}

TEST(SmPath, AllToAllvPacksBySourceAndDestination) {
  const int W = 3;
  // counts[s * W + d]: bytes from s to d, zeros included.
  const std::vector<size_t> counts = {3, 0, 5, 7, 1, 0, 2, 4, 6};
  std::vector<std::vector<char>> ins, outs;
  for (int r = 0; r < W; ++r) {
    size_t send = 0, recv = 0;
    for (int p = 0; p < W; ++p) send += counts[r * W + p], recv += counts[p * W + r];
    ins.push_back(pattern(send, 20 + r));
    outs.push_back(std::vector<char>(recv, 'x'));
  }
  for (bool spans : {false, true}) {
    auto got = simulate(CollOp::kAllToAllv, W, 0, 0, counts, ins, outs, false, spans);
    for (int d = 0; d < W; ++d) {
      size_t at = 0;
      for (int s = 0; s < W; ++s) {
        size_t from = 0;
        for (int p = 0; p < d; ++p) from += counts[s * W + p];
        for (size_t i = 0; i < counts[s * W + d]; ++i) EXPECT_EQ(got[d][at + i], ins[s][from + i]) << s << "->" << d;
        at += counts[s * W + d];
      }
    }
  }
  EXPECT_EQ(sm_path_largest_block(CollOp::kAllToAllv, W, 0, counts, {}), 7u);
  EXPECT_EQ(plan_sm_path(CollOp::kAllToAllv, 0, W, ins[0].data(), outs[0].data(), 0, 0, counts, 7).blocks, 1);
  EXPECT_EQ(sm_path_largest_block(CollOp::kAllGather, W, 99, counts, {}), 99u);
}

TEST(SmPath, ReductionsSendTheirBlocksAndReduceInsteadOfCopying) {
  std::vector<char> in(3 * 100), out(100);
  const auto dt = static_cast<uint32_t>(DType::kBFloat16), op = static_cast<uint32_t>(RedOp::kMax);
  // reduce_scatter: block p of the input to rank p, a result of one block.
  SmPathStep rs = plan_sm_path(CollOp::kReduceScatter, 1, 3, in.data(), out.data(), 100, 0, {}, 7, dt, op);
  EXPECT_EQ(rs.dtype, dt);
  EXPECT_EQ(rs.red_op, op);
  EXPECT_EQ(rs.own_bytes, 0u);  // nothing copied: the own block is read where it is
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ(rs.send_offset[p], 100u * p);
    EXPECT_EQ(rs.send_bytes[p], 100u);
    EXPECT_EQ(rs.recv_bytes[p], 100u);
    EXPECT_EQ(rs.recv_offset[p], 0u);
  }
  // all_reduce: the whole input to every rank, also in place.
  SmPathStep ar = plan_sm_path(CollOp::kAllReduce, 2, 3, out.data(), out.data(), 100, 0, {}, 7, dt, op);
  EXPECT_EQ(ar.own_bytes, 0u);
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ(ar.send_offset[p], 0u);
    EXPECT_EQ(ar.send_bytes[p], 100u);
    EXPECT_EQ(ar.recv_bytes[p], 100u);
  }
  EXPECT_EQ(ar.low_latency, 1u);
  EXPECT_EQ(plan_sm_path(CollOp::kAllGather, 0, 2, in.data(), out.data(), 16, 0, {}, 7).dtype, 0u);
}

TEST(SmPath, UnsupportedCallsSayWhy) {
  const size_t slot = 1 << 20;
  EXPECT_EQ(sm_path_unsupported(CollOp::kAllGather, 8, slot, slot), "");
  EXPECT_EQ(sm_path_unsupported(CollOp::kAllToAll, 2, 1, slot), "");
  EXPECT_EQ(sm_path_unsupported(CollOp::kBroadcast, 1, 0, slot), "");
  EXPECT_EQ(sm_path_unsupported(CollOp::kAllToAllv, 2, 1, slot), "");
  EXPECT_EQ(sm_path_unsupported(CollOp::kReduceScatter, 2, 1, slot), "");
  EXPECT_EQ(sm_path_unsupported(CollOp::kAllReduce, 2, slot, slot), "");
  EXPECT_NE(sm_path_unsupported(CollOp::kAllGather, 9, 1, slot).find("at most 8 ranks"), std::string::npos);
  EXPECT_NE(sm_path_unsupported(CollOp::kAllGather, 2, 1, 0).find("FERRY_SM_BYTES=0"), std::string::npos);
  EXPECT_NE(sm_path_unsupported(CollOp::kAllGather, 2, slot + 1, slot).find("this call moves 1048577"),
            std::string::npos);
}

TEST(SmPath, SelectorSkipsSmRulesWhereTheCallCannotTakeThem) {
  constexpr size_t kAny = std::numeric_limits<size_t>::max();
  std::vector<SelectorRule> table = {{CollOp::kAllGather, 0, 1 << 20, Algo::kSm},
                                     {CollOp::kAllGather, 0, kAny, Algo::kSeq}};
  EXPECT_EQ(select_variant(CollOp::kAllGather, 2, 4096, Algo::kAuto, table, true).algo, Algo::kSm);
  EXPECT_EQ(select_variant(CollOp::kAllGather, 2, 4096, Algo::kAuto, table, false).algo, Algo::kSeq);
  EXPECT_EQ(select_variant(CollOp::kAllGather, 2, 4096, Algo::kSm, table, false).algo,
            Algo::kSm);  // forced: build() explains
  EXPECT_EQ(parse_algo("sm", "algo"), Algo::kSm);
  EXPECT_STREQ(algo_name(Algo::kSm), "sm");
}

TEST(SmPath, DefaultTableNeverPicksTheSmPath) {
  auto table = default_selector_table();
  for (size_t bytes = 1; bytes <= (size_t(1) << 32); bytes *= 2)
    for (CollOp op : {CollOp::kAllGather, CollOp::kAllToAll, CollOp::kBroadcast})
      EXPECT_NE(select_variant(op, 2, bytes, Algo::kAuto, table).algo, Algo::kSm);
}

TEST(SmPath, SelectionHonoursTheWindowForForcedAndTabledSm) {
  constexpr size_t kAny = std::numeric_limits<size_t>::max();
  const size_t slot = 1 << 20;
  std::vector<SelectorRule> table = {{CollOp::kAllToAllv, 0, 1 << 20, Algo::kSm},
                                     {CollOp::kAllToAllv, 0, kAny, Algo::kB2b}};
  // A table rule for "sm" applies where the largest block fits, not beyond.
  EXPECT_EQ(select_variant_with_sm(CollOp::kAllToAllv, 4, 1000, 4000, slot, Algo::kAuto, table).algo, Algo::kSm);
  EXPECT_EQ(select_variant_with_sm(CollOp::kAllToAllv, 4, 1000, slot + 1, slot, Algo::kAuto, table).algo, Algo::kB2b);
  // FERRY_ALGO=sm falls back to the table where the path cannot run.
  EXPECT_EQ(select_variant_with_sm(CollOp::kReduceScatter, 4, 64, slot + 1, slot, Algo::kSm, {}).algo, Algo::kSeq);
  EXPECT_EQ(select_variant_with_sm(CollOp::kReduceScatter, 4, 64, 64, slot, Algo::kSm, {}).algo, Algo::kSm);
  EXPECT_EQ(select_variant_with_sm(CollOp::kAllGather, 4, 64, 64, 0, Algo::kSm, table).algo, Algo::kSeq);
  EXPECT_EQ(select_variant_with_sm(CollOp::kAllGather, 4, 64, 64, slot, Algo::kSm, table).algo, Algo::kSm);
  // Other forced variants are untouched.
  EXPECT_EQ(select_variant_with_sm(CollOp::kAllGather, 4, 64, 64, slot, Algo::kPcpy, table).algo, Algo::kPcpy);
}

TEST(SmPath, TwoShotAllReduceFromItsThresholdOnThreeOrMoreRanks) {
  SmPathBlocks per;
  per.two_shot_from = 1 << 20;
  for (int world : {3, 4, 8}) {
    EXPECT_TRUE(sm_path_two_shot(CollOp::kAllReduce, world, 4 << 20, per)) << world;
    EXPECT_TRUE(sm_path_two_shot(CollOp::kAllReduce, world, 1 << 20, per)) << world;
    EXPECT_FALSE(sm_path_two_shot(CollOp::kAllReduce, world, (1 << 20) - 16, per)) << world;
    for (CollOp op : {CollOp::kAllGather, CollOp::kAllToAll, CollOp::kReduceScatter, CollOp::kBroadcast})
      EXPECT_FALSE(sm_path_two_shot(op, world, 4 << 20, per));
  }
  EXPECT_FALSE(sm_path_two_shot(CollOp::kAllReduce, 2, 4 << 20, per));  // the same bytes either way
  // Parts that would travel in the low-latency format keep one shot.
  per.two_shot_from = 1;
  EXPECT_FALSE(sm_path_two_shot(CollOp::kAllReduce, 4, 4 * kSmPathLowLatencyMaxBytes, per));
  EXPECT_TRUE(sm_path_two_shot(CollOp::kAllReduce, 4, 4 * kSmPathLowLatencyMaxBytes + 64, per));
  per.two_shot_from = 0;  // FERRY_SM_TWO_SHOT_BYTES=0: never
  EXPECT_FALSE(sm_path_two_shot(CollOp::kAllReduce, 4, size_t(1) << 30, per));
  EXPECT_EQ(SmPathBlocks{}.two_shot_from, kSmPathDefaultTwoShotBytes);
}

TEST(SmPath, TwoShotPartsAre16ByteMultiplesThatCoverTheBuffer) {
  for (int world : {3, 4, 5, 7, 8})
    for (size_t bytes : {size_t(1) << 20, size_t(4 << 20) + 4, size_t(1000003) * 2, size_t(300001) * 4}) {
      const size_t part = sm_path_two_shot_part(bytes, world);
      EXPECT_EQ(part % 16, 0u);
      EXPECT_GE(part * world, bytes);
      EXPECT_LT(part * (world - 1), bytes) << "every rank but the last holds data: " << world << ", " << bytes;
    }
  // A 4 MB all_reduce on four ranks sends 1 MiB parts: one round in the default window.
  SmPathBlocks per;
  per.two_shot_from = 1 << 20;
  per.slot_bytes = 1 << 20;
  EXPECT_EQ(sm_path_two_shot_chunk(4 << 20, 4, per), size_t(1) << 20);
  EXPECT_EQ(sm_path_largest_block(CollOp::kAllReduce, 4, 4 << 20, {}, per), size_t(1) << 20);
  // 16 MB: 4 MiB parts in rounds of the 1 MiB slot; the call fits the window whatever its size.
  EXPECT_EQ(sm_path_two_shot_chunk(16 << 20, 4, per), size_t(1) << 20);
  EXPECT_EQ(sm_path_unsupported(CollOp::kAllReduce, 4, sm_path_largest_block(CollOp::kAllReduce, 4, 1 << 30, {}, per),
                                1 << 20),
            "");
  EXPECT_EQ(sm_path_largest_block(CollOp::kAllReduce, 2, 4 << 20, {}, per), size_t(4) << 20);  // one shot on 2
  // An unbounded window (0): one round of the whole part.
  per.slot_bytes = 0;
  EXPECT_EQ(sm_path_two_shot_chunk(16 << 20, 4, per), size_t(4) << 20);
  // A slot under the low-latency format's limit keeps one shot (the two-shot form has no such format).
  per.slot_bytes = 32 << 10;
  EXPECT_FALSE(sm_path_two_shot(CollOp::kAllReduce, 4, 16 << 20, per));
  // Slots off 16 bytes round down.
  per.slot_bytes = (100 << 10) + 8;
  EXPECT_EQ(sm_path_two_shot_chunk(16 << 20, 4, per), size_t(100) << 10);
}

TEST(SmPath, RoundSharesCutEveryRoundAlike) {
  const size_t chunk = 100000;  // 16-byte shares of 3,136 bytes over 32 blocks
  const int blocks = 32;
  for (size_t len : {size_t(0), size_t(1), size_t(3136), size_t(50000), size_t(99999), chunk}) {
    size_t next = 0;
    for (int b = 0; b < blocks; ++b) {
      size_t begin = 0, full_begin = 0;
      const size_t n = sm_path_round_share(len, chunk, blocks, b, &begin);
      const size_t full = sm_path_span_share(chunk, blocks, b, &full_begin);
      // The same block's bytes as in a full round, cut to the piece.
      if (n > 0) {
        EXPECT_EQ(begin, full_begin);
        EXPECT_LE(begin + n, full_begin + full);
      }
      EXPECT_EQ(begin, next) << len << ", block " << b;
      next = begin + n;
    }
    EXPECT_EQ(next, len);
  }
}

TEST(SmPath, TwoShotPlanSendsPartPToRankP) {
  SmPathBlocks per;
  per.two_shot_from = 1 << 20;
  const int W = 4;
  const size_t bytes = (3 << 20) + 48;  // parts of 786,448 bytes; the last one 786,432
  const size_t part = sm_path_two_shot_part(bytes, W);
  std::vector<char> in(bytes), out(bytes);
  const auto dt = static_cast<uint32_t>(DType::kFloat32), op = static_cast<uint32_t>(RedOp::kSum);
  for (bool in_place : {false, true}) {
    char* src = in_place ? out.data() : in.data();
    const SmPathStep s = plan_sm_path(CollOp::kAllReduce, 1, W, src, out.data(), bytes, 0, {}, 7, dt, op, per);
    EXPECT_EQ(s.two_shot_rounds, 1u);  // one round: no slot bound in `per`
    EXPECT_EQ(s.two_shot_chunk, part);
    EXPECT_EQ(s.low_latency, 0u);
    EXPECT_EQ(s.own_bytes, 0u);
    EXPECT_EQ(s.blocks, sm_path_blocks(part, per));
    size_t covered = 0;
    for (int p = 0; p < W; ++p) {
      EXPECT_EQ(s.send_offset[p], p * part);
      EXPECT_EQ(s.recv_offset[p], p * part);
      EXPECT_EQ(s.send_bytes[p], s.recv_bytes[p]);
      covered += s.send_bytes[p];
    }
    EXPECT_EQ(covered, bytes);
    EXPECT_EQ(s.send_bytes[W - 1], bytes - 3 * part);
  }
  // Below the threshold: one shot, the whole buffer to every peer.
  const SmPathStep one =
      plan_sm_path(CollOp::kAllReduce, 1, W, in.data(), out.data(), (1 << 20) - 16, 0, {}, 7, dt, op, per);
  EXPECT_EQ(one.two_shot_rounds, 0u);
  EXPECT_EQ(one.send_bytes[0], (size_t(1) << 20) - 16);
}

// The two-shot all_reduce on the CPU as the kernel's blocks run it, in an
// order the flags allow: every (rank, block) is an actor that pushes round
// 0's first shot and flags step 0; then per round k waits for step k from
// the same block of every peer (its flag word holds the peer's last step; a
// wait passes on k or k + 1, and a flag two steps ahead is an error), reduces
// its share of piece k from the slots of parity `parity(k)`, stores it into
// every peer's `out`, pushes round k + 1's first shot and flags step k + 1;
// at last it waits for step R. A seeded random scheduler interleaves the
// actors, so ranks and blocks run skewed as far as their waits let them.
// Slot bytes carry the round that wrote them: a reduction that finds
// another round's bytes, or a block writing slot bytes another block read
// last, is reported. Returns "" or the first problem.
static std::string simulate_two_shot(const std::vector<SmPathStep>& steps, int world,
                                     const std::function<int(uint32_t)>& parity, uint64_t seed) {
  const int blocks = steps[0].blocks;
  const size_t chunk = steps[0].two_shot_chunk;
  const uint32_t rounds = steps[0].two_shot_rounds;
  struct Slot {
    std::vector<char> bytes;
    std::vector<int> round, reader;
  };
  // slots[parity][dst][src]
  std::vector<std::vector<std::vector<Slot>>> slots(
      2, std::vector<std::vector<Slot>>(
             world, std::vector<Slot>(world, Slot{std::vector<char>(chunk, 'x'), std::vector<int>(chunk, -1),
                                                  std::vector<int>(chunk, -1)})));
  // flag[dst][src][block]: the last step src's block posted to dst.
  std::vector<std::vector<std::vector<int64_t>>> flag(
      world, std::vector<std::vector<int64_t>>(world, std::vector<int64_t>(blocks, -1)));
  auto piece = [&](size_t full, uint32_t k) {
    const size_t at = k * chunk;
    return full > at ? std::min(full - at, chunk) : size_t(0);
  };
  std::string problem;
  auto fail = [&](const std::string& what) {
    if (problem.empty()) problem = what;
  };
  auto scatter = [&](int r, int b, uint32_t k) {
    const SmPathStep& s = steps[r];
    for (int p = 0; p < world; ++p) {
      if (p == r) continue;
      size_t begin = 0;
      const size_t len = sm_path_round_share(piece(s.send_bytes[p], k), chunk, blocks, b, &begin);
      Slot& slot = slots[parity(k)][p][r];
      for (size_t i = begin; i < begin + len; ++i) {
        if (slot.reader[i] != -1 && slot.reader[i] != b)
          fail("slot byte " + std::to_string(i) + " read by block " + std::to_string(slot.reader[i]) +
               ", overwritten by block " + std::to_string(b) + " in round " + std::to_string(k));
        slot.bytes[i] = s.in[s.send_offset[p] + k * chunk + i];
        slot.round[i] = static_cast<int>(k);
      }
    }
    for (int p = 0; p < world; ++p)
      if (p != r) flag[p][r][b] = k;
  };
  auto work = [&](int r, int b, uint32_t k) {
    const SmPathStep& s = steps[r];
    const size_t at = k * chunk;
    size_t begin = 0;
    const size_t len = sm_path_round_share(piece(s.recv_bytes[r], k), chunk, blocks, b, &begin);
    if (len % 4) fail("a share of " + std::to_string(len) + " bytes");
    for (size_t i = begin; i + 4 <= begin + len; i += 4) {
      int32_t acc = 0;
      for (int q = 0; q < world; ++q) {
        int32_t v;
        if (q == r) {
          std::memcpy(&v, s.in + s.send_offset[r] + at + i, 4);
        } else {
          Slot& slot = slots[parity(k)][r][q];
          if (slot.round[i] != static_cast<int>(k))
            fail("rank " + std::to_string(r) + " block " + std::to_string(b) + " read round " +
                 std::to_string(slot.round[i]) + "'s bytes of rank " + std::to_string(q) + " in round " +
                 std::to_string(k));
          std::memcpy(&v, slot.bytes.data() + i, 4);
          std::fill(slot.reader.begin() + i, slot.reader.begin() + i + 4, b);
        }
        acc += v;
      }
      std::memcpy(s.out + s.recv_offset[r] + at + i, &acc, 4);
    }
    for (int p = 0; p < world; ++p)
      if (p != r)
        std::copy(s.out + s.recv_offset[r] + at + begin, s.out + s.recv_offset[r] + at + begin + len,
                  steps[p].out + steps[p].recv_offset[r] + at + begin);
    if (k + 1 < rounds) {
      scatter(r, b, k + 1);  // flags step k + 1 too
    } else {
      for (int p = 0; p < world; ++p)
        if (p != r) flag[p][r][b] = k + 1;
    }
  };
  // An actor's next action: 0 the first push; 2k + 1 the wait for step k; 2k + 2 round k's work; 2R + 1 the
  // last wait; 2R + 2 done.
  std::vector<uint32_t> next(static_cast<size_t>(world) * blocks, 0);
  std::mt19937_64 rng(seed);
  std::vector<int> ready;
  for (;;) {
    ready.clear();
    bool all_done = true;
    for (int a = 0; a < world * blocks; ++a) {
      const int r = a / blocks, b = a % blocks;
      const uint32_t n = next[a];
      if (n == 2 * rounds + 2) continue;
      all_done = false;
      if (n % 2 == 1) {  // a wait for step (n - 1) / 2
        const int64_t k = (n - 1) / 2;
        bool ok = true;
        for (int q = 0; q < world; ++q) {
          if (q == r) continue;
          if (flag[r][q][b] > k + 1) fail("rank " + std::to_string(q) + " is two steps ahead");
          ok = ok && flag[r][q][b] >= k;
        }
        if (!ok) continue;
      }
      ready.push_back(a);
    }
    if (all_done || !problem.empty()) break;
    if (ready.empty()) return "deadlock";
    const int a = ready[rng() % ready.size()];
    const int r = a / blocks, b = a % blocks;
    const uint32_t n = next[a]++;
    if (n == 0) scatter(r, b, 0);
    if (n % 2 == 0 && n > 0 && n < 2 * rounds + 2) work(r, b, n / 2 - 1);
  }
  return problem;
}

// Every rank's result is the sum of every rank's input, under many orders
// of the actors (simulate_two_shot), with rounds alternating between the two
// parities' slots as the kernel's do.
TEST(SmPath, TwoShotAllReduceSumsEveryElementInAnyOrderTheFlagsAllow) {
  for (size_t slot : {size_t(0), size_t(80) << 10})  // one round, or rounds of 80 KiB
    for (int world : {3, 4, 5, 8})
      for (size_t count : {size_t(131101), size_t(300007)})
        for (bool in_place : {false, true})
          for (uint64_t seed : {1, 2}) {
            SmPathBlocks per;
            per.two_shot_from = 1;
            per.spans = 4096;  // more blocks than the default for this size, so that shares are many
            per.slot_bytes = slot;
            const size_t bytes = count * 4;
            std::vector<std::vector<int32_t>> ins(world), outs(world, std::vector<int32_t>(count, -7));
            std::vector<int64_t> want(count, 0);
            for (int r = 0; r < world; ++r) {
              ins[r].resize(count);
              for (size_t i = 0; i < count; ++i) {
                ins[r][i] = static_cast<int32_t>((i * 2654435761u + r * 40503u) % 100003) - 50000;
                want[i] += ins[r][i];
              }
              if (in_place) outs[r] = ins[r];
            }
            std::vector<SmPathStep> steps;
            for (int r = 0; r < world; ++r) {
              const char* src = reinterpret_cast<const char*>(in_place ? outs[r].data() : ins[r].data());
              steps.push_back(plan_sm_path(CollOp::kAllReduce, r, world, src, reinterpret_cast<char*>(outs[r].data()),
                                           bytes, 0, {}, 7, static_cast<uint32_t>(DType::kInt32),
                                           static_cast<uint32_t>(RedOp::kSum), per));
              ASSERT_GE(steps.back().two_shot_rounds, 1u);
              ASSERT_EQ(steps.back().blocks, steps[0].blocks) << "the same grid on every rank";
              ASSERT_EQ(steps.back().two_shot_rounds, steps[0].two_shot_rounds) << "the same rounds on every rank";
            }
            if (slot) ASSERT_LE(steps[0].two_shot_chunk, slot);
            if (slot && sm_path_two_shot_part(bytes, world) > slot) ASSERT_GT(steps[0].two_shot_rounds, 1u);
            const std::string problem = simulate_two_shot(
                steps, world, [](uint32_t k) { return int(k & 1); }, seed);
            ASSERT_EQ(problem, "") << "slot " << slot << ", world " << world << ", count " << count
                                   << (in_place ? " in place" : "") << ", seed " << seed;
            for (int r = 0; r < world; ++r)
              for (size_t i = 0; i < count; ++i)
                ASSERT_EQ(outs[r][i], static_cast<int32_t>(want[i]))
                    << "slot " << slot << ", world " << world << ", count " << count << (in_place ? " in place" : "")
                    << ", rank " << r << ", element " << i << ", seed " << seed;
          }
}

// The simulation can fail: rounds that all use one parity's slots (safe only
// with a second wait per round) let a rank that is a step ahead overwrite a
// slot its peer has not read yet, and some order of the actors shows it.
TEST(SmPath, TwoShotSimulationCatchesRoundsSharingOneSlot) {
  SmPathBlocks per;
  per.two_shot_from = 1;
  per.spans = 4096;
  per.slot_bytes = size_t(80) << 10;
  const int world = 4;
  const size_t count = 300007;
  std::vector<std::vector<int32_t>> ins(world, std::vector<int32_t>(count, 1)),
      outs(world, std::vector<int32_t>(count));
  int caught = 0;
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    std::vector<SmPathStep> steps;
    for (int r = 0; r < world; ++r)
      steps.push_back(plan_sm_path(CollOp::kAllReduce, r, world, reinterpret_cast<const char*>(ins[r].data()),
                                   reinterpret_cast<char*>(outs[r].data()), count * 4, 0, {}, 7,
                                   static_cast<uint32_t>(DType::kInt32), static_cast<uint32_t>(RedOp::kSum), per));
    ASSERT_GT(steps[0].two_shot_rounds, 2u);
    caught += !simulate_two_shot(
                   steps, world, [](uint32_t) { return 0; }, seed)
                   .empty();
  }
  EXPECT_GT(caught, 0);
}
