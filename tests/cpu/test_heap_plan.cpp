// The symmetric heap's pure parts: the deterministic allocator, how far the
// mapped prefix grows, the check that every rank made the same call, and the
// team arithmetic kernels and the host share.
#include <gtest/gtest.h>

#include <random>

#include "core/error.hpp"
#include "error_of.hpp"
#include "ferry/device/team.cuh"
#include "symm/heap_plan.hpp"
#include "symm/registration.hpp"

using namespace ferry;
using device::Team;

TEST(HeapAllocator, SameCallsGiveSameOffsetsAndAlignmentHolds) {
  HeapAllocator a(1 << 20, 16384), b(1 << 20, 16384);
  std::mt19937 rng(7);
  std::vector<size_t> live;
  for (int i = 0; i < 2000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      size_t k = rng() % live.size();
      a.free(live[k]);
      b.free(live[k]);
      live.erase(live.begin() + k);
      continue;
    }
    size_t bytes = rng() % 5000, align = size_t(1) << (rng() % 13);
    size_t oa = 0, ob = 0;
    if (code_of([&] { oa = a.alloc(bytes, align); }) != FERRY_SUCCESS) continue;
    ob = b.alloc(bytes, align);
    EXPECT_EQ(oa, ob);
    EXPECT_EQ(oa % std::max<size_t>(align, kHeapUnit), 0u);
    EXPECT_GE(oa, 16384u);
    EXPECT_LE(oa + heap_rounded_bytes(bytes), size_t(1) << 20);
    // No live allocation overlaps another.
    for (size_t o : live) {
      size_t s = 0, z = 0;
      ASSERT_TRUE(a.find(o, 1, &s, &z));
      EXPECT_TRUE(oa + heap_rounded_bytes(bytes) <= s || s + z <= oa);
    }
    live.push_back(oa);
  }
  for (size_t o : live) a.free(o);
  EXPECT_EQ(a.used(), 0u);
  // Everything merged back: the whole usable space is one allocation again.
  EXPECT_EQ(a.alloc((1 << 20) - 16384, 256), 16384u);
}

TEST(HeapAllocator, ZeroBytesGetAnAddressOfTheirOwn) {
  HeapAllocator a(1 << 16, 256);
  size_t x = a.alloc(0, 1), y = a.alloc(0, 1);
  EXPECT_NE(x, y);
  EXPECT_EQ(a.used(), 2 * kHeapUnit);
}

TEST(HeapAllocator, ExhaustedNamesTheKnobAndBadInputIsRefused) {
  HeapAllocator a(1 << 16, 256);
  std::string msg;
  EXPECT_EQ(code_of([&] { a.alloc(1 << 16, 256); }, &msg), FERRY_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(msg.find("FERRY_SYMM_HEAP_BYTES"), std::string::npos) << msg;
  EXPECT_EQ(code_of([&] { a.alloc(SIZE_MAX, 256); }), FERRY_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(code_of([&] { a.alloc(16, 3); }, &msg), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(msg.find("align"), std::string::npos);
  size_t o = a.alloc(100, 1);
  EXPECT_EQ(code_of([&] { a.free(o + 256); }), FERRY_ERROR_INVALID_ARGUMENT);
  a.free(o);
  EXPECT_EQ(code_of([&] { a.free(o); }), FERRY_ERROR_INVALID_ARGUMENT);  // twice
}

TEST(HeapAllocator, FindSeesOnlyRangesInsideOneLiveAllocation) {
  HeapAllocator a(1 << 16, 256);
  size_t o = a.alloc(1000, 256);  // 1024 bytes as allocated
  size_t s = 0, z = 0;
  EXPECT_TRUE(a.find(o, 1024, &s, &z));
  EXPECT_EQ(s, o);
  EXPECT_EQ(z, 1024u);
  EXPECT_TRUE(a.find(o + 1000, 24, &s, &z));
  EXPECT_FALSE(a.find(o + 1000, 25, &s, &z));
  EXPECT_FALSE(a.find(o - 1, 1, &s, &z));
  EXPECT_FALSE(a.find(o + 1024, 1, &s, &z));
}

TEST(HeapAllocator, LargerThanTwoGigabytes) {
  const size_t cap = size_t(64) << 30;
  HeapAllocator a(cap, 16384);
  size_t o = a.alloc(size_t(5) << 30, 1 << 21);
  EXPECT_EQ(o % (1 << 21), 0u);
  EXPECT_EQ(a.used(), size_t(5) << 30);
}

TEST(HeapGrowth, MappedPrefixGrowsByWholeChunksNeverPastCapacity) {
  const size_t g = 2 << 20, chunk = 64 << 20, cap = 1 << 30;
  EXPECT_EQ(heap_mapped_end(0, 16384, g, chunk, cap), chunk);
  EXPECT_EQ(heap_mapped_end(chunk, chunk, g, chunk, cap), chunk);           // covered
  EXPECT_EQ(heap_mapped_end(chunk, chunk + 1, g, chunk, cap), 2 * chunk);   // at least one chunk more
  EXPECT_EQ(heap_mapped_end(chunk, 300 << 20, g, chunk, cap), 300u << 20);  // more than a chunk: to the granule
  EXPECT_EQ(heap_mapped_end(chunk, (300 << 20) + 1, g, chunk, cap), (302u << 20));
  EXPECT_EQ(heap_mapped_end(cap - g, cap, g, chunk, cap), cap);  // the chunk is cut at the capacity
  EXPECT_EQ(heap_capacity(0, 1000, g), g);
  EXPECT_EQ(heap_capacity(3 << 20, 1000, g), 4u << 20);
  EXPECT_EQ(code_of([&] { heap_capacity(0, 0, g); }), FERRY_ERROR_INVALID_ARGUMENT);
  // Chunks as large as the address space (a knob of -1 read as bytes) map up to the capacity, never short of the
  // need (a sum that wrapped would give 0 and 4 MiB here).
  EXPECT_EQ(heap_mapped_end(0, 256, g, SIZE_MAX, cap), cap);
  EXPECT_EQ(heap_mapped_end(4 << 20, 6 << 20, g, SIZE_MAX - (1 << 20), cap), cap);
  EXPECT_EQ(heap_mapped_end(0, SIZE_MAX - 1, g, chunk, cap), cap);
  // The knob is named where it gave the capacity.
  std::string message;
  EXPECT_EQ(code_of([&] { heap_capacity(0, SIZE_MAX, g); }, &message), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("FERRY_SYMM_HEAP_BYTES is 18446744073709551615 bytes"), std::string::npos) << message;
  EXPECT_EQ(code_of([&] { heap_capacity(size_t(1) << 50, 1000, g); }, &message), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(message.find("capacity is"), std::string::npos) << message;
}

TEST(HeapAllocator, AllocTopTakesTheHighestFitAndLeavesTheRestToAlloc) {
  const size_t g = 2 << 20, cap = 64 << 20;
  HeapAllocator a(cap, 16384);
  const size_t top = a.alloc_top(5 << 20, g);  // ends at 63 MiB: its start is aligned down to 58
  EXPECT_EQ(top % g, 0u);
  EXPECT_EQ(top, cap - (6u << 20));
  EXPECT_EQ(a.used(), 5u << 20);
  const size_t next = a.alloc_top(1, g);
  EXPECT_EQ(next, cap - (8u << 20));  // below the first, aligned down
  // alloc() still fills from the bottom and finds the gap left above `top`.
  EXPECT_EQ(a.alloc(1000, 256), 16384u);
  size_t s = 0;
  EXPECT_TRUE(a.find(top + (5 << 20) - 1, 1, &s, nullptr));
  EXPECT_EQ(s, top);
  a.free(top);
  a.free(next);
  EXPECT_EQ(a.alloc_top(cap - (2 << 20), g) % g, 0u);  // nearly all: the one block that fits
  EXPECT_EQ(code_of([&] { a.alloc_top(4 << 20, g); }), FERRY_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(code_of([&] { a.alloc_top(1, 3); }), FERRY_ERROR_INVALID_ARGUMENT);
}

TEST(HeapAllocator, AllocTopMatchesAnExhaustiveSearch) {
  std::mt19937 rng(7);
  const size_t cap = 1 << 18;
  HeapAllocator a(cap, 256);
  std::vector<size_t> live;
  for (int i = 0; i < 400; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      size_t k = rng() % live.size();
      a.free(live[k]);
      live.erase(live.begin() + k);
      continue;
    }
    const size_t bytes = 1 + rng() % 12000, align = size_t(256) << (rng() % 5);
    // The highest aligned start whose rounded range is free, by brute force over the live set.
    const size_t need = heap_rounded_bytes(bytes);
    size_t best = SIZE_MAX;
    for (size_t start = (cap - need) / align * align; start >= 256 && start + need <= cap; start -= align) {
      bool clear = true;
      for (size_t o : live) {
        size_t st = 0, sz = 0;
        a.find(o, 1, &st, &sz);
        if (start < st + sz && st < start + need) clear = false;
      }
      if (clear) {
        best = start;
        break;
      }
      if (start < align) break;
    }
    if (best == SIZE_MAX) {
      EXPECT_EQ(code_of([&] { a.alloc_top(bytes, align); }), FERRY_ERROR_OUT_OF_MEMORY);
      continue;
    }
    size_t got = a.alloc_top(bytes, align);
    EXPECT_EQ(got, best) << "bytes " << bytes << " align " << align;
    live.push_back(got);
  }
}

TEST(Registration, EveryRanksBufferLandsAtOneOffset) {
  const size_t g = 2 << 20;
  // Rank 0: one 8 MiB allocation, the buffer 3 granules and 4 KiB in; rank 1:
  // two allocations of 2 and 20 MiB, the buffer 4 KiB in; rank 2: 6 MiB, 1 granule in.
  std::vector<RegistrationSpan> spans = {{3 * g + 4096, {8 * g}}, {4096, {g, 10 * g}}, {g + 4096, {3 * g}}};
  RegistrationPlan p = plan_registration(spans, g, g);
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.data_offset, 3 * g + 4096);
  ASSERT_EQ(p.shift.size(), 3u);
  EXPECT_EQ(p.shift[0], 0u);
  EXPECT_EQ(p.shift[1], 3 * g);
  EXPECT_EQ(p.shift[2], 2 * g);
  for (size_t r = 0; r < 3; ++r) EXPECT_EQ(p.shift[r] + spans[r].lead, p.data_offset);
  EXPECT_EQ(p.region_bytes, 14 * g);  // rank 1: 3 granules of shift and 11 of pieces
}

TEST(Registration, RefusalsNameTheRankAndTheReason) {
  const size_t g = 2 << 20;
  auto error = [&](std::vector<RegistrationSpan> spans, size_t bytes) {
    return plan_registration(spans, bytes, g).error;
  };
  std::string e = error({{0, {g}}, {4096, {g}}}, 100);
  EXPECT_NE(e.find("different offsets"), std::string::npos) << e;
  EXPECT_NE(e.find("rank 1: 4096"), std::string::npos) << e;
  e = error({{0, {g}}, {0, {g + 4096}}}, 100);
  EXPECT_NE(e.find("rank 1's buffer lies in an allocation of"), std::string::npos) << e;
  e = error({{0, {g}}, {0, {g}}}, g + 1);  // longer than what lies under it
  EXPECT_NE(e.find("rank 0's buffer"), std::string::npos) << e;
  EXPECT_NE(e.find("does not lie inside"), std::string::npos) << e;
  e = error({{0, {g}}, {0, {}}}, 1);
  EXPECT_NE(e.find("rank 1's buffer lies in no allocation"), std::string::npos) << e;
  EXPECT_NE(error({}, 1), "");
  EXPECT_EQ(error({{g - 1, {g, g}}, {g - 1, {2 * g}}}, g + 1), "");  // exactly to the end
}

TEST(Registration, RecordsRoundTripAndMalformedOnesAreNamed) {
  RegistrationRecord v;
  v.kind = 'V';
  v.bytes = (size_t(40) << 20) + 12345;
  v.span = {4096, std::vector<size_t>(24, size_t(2) << 20)};
  RegistrationRecord got = decode_registration(encode_registration(v), 1);
  EXPECT_EQ(got.kind, 'V');
  EXPECT_EQ(got.bytes, v.bytes);
  EXPECT_EQ(got.span.lead, v.span.lead);
  EXPECT_EQ(got.span.pieces, v.span.pieces);
  // An IPC handle is opaque bytes, NULs included.
  RegistrationRecord i;
  i.kind = 'I';
  i.bytes = 1000003;
  i.ipc = std::string("\0\x01\xff\0handle", 10);
  got = decode_registration(encode_registration(i), 2);
  EXPECT_EQ(got.kind, 'I');
  EXPECT_EQ(got.bytes, 1000003u);
  EXPECT_EQ(got.ipc, i.ipc);
  RegistrationRecord e;
  e.kind = '!';
  e.error = "register: the buffer is not VMM memory: 2 pieces";
  e.code = FERRY_ERROR_OUT_OF_MEMORY;
  got = decode_registration(encode_registration(e), 3);
  EXPECT_EQ(got.kind, '!');
  EXPECT_EQ(got.error, e.error);
  EXPECT_EQ(got.code, FERRY_ERROR_OUT_OF_MEMORY);
  for (const char* bad :
       {"", "V", "V 12", "V 12 x", "V 12  3", "V 12 3 ", "X 1 2", "I\x01", "!", "!msg", "!:msg", "!0:msg", "!11",
        "!12345:msg", "V 99999999999999999999999 0", "V 12 3", "V 12 0 0", "V 12 4096 4096", "V 5000 0 4096"}) {
    std::string m;
    EXPECT_EQ(code_of([&] { decode_registration(bad, 5); }, &m), FERRY_ERROR_INTERNAL) << bad;
    EXPECT_NE(m.find("rank 5"), std::string::npos) << m;
  }
}

// A group of `world` ranks seen from `rank`, whose all-gather returns
// `others` with this rank's record in its place.
Group fake_group(int rank, std::vector<std::string> others) {
  Group g;
  g.world = static_cast<int>(others.size());
  g.ranks = {rank};
  g.devices = {0};
  g.allgather = [rank, others](const std::string& mine) mutable {
    others[rank] = mine;
    return others;
  };
  return g;
}

TEST(LocalFailure, EveryRankRaisesTheFailingRanksCodeAndTheOthersNameIt) {
  LocalFailure oom;
  oom.run([] { throw_error(FERRY_ERROR_OUT_OF_MEMORY, "GPU 0 is out of memory (4096 bytes asked for)"); });
  oom.run([] { throw_error(FERRY_ERROR_INVALID_ARGUMENT, "a later step"); });  // not run: the first failure stays
  ASSERT_TRUE(oom.failed());
  EXPECT_EQ(oom.code(), FERRY_ERROR_OUT_OF_MEMORY);
  // What rank 0 (failed) sends, as rank 1 (fine) will see it.
  std::string sent;
  Group g0 = fake_group(0, {"", "ok"});
  auto inner = g0.allgather;
  g0.allgather = [&](const std::string& mine) {
    sent = mine;
    return inner(mine);
  };
  std::string m;
  // The failing rank raises its own error.
  EXPECT_EQ(code_of([&] { oom.agree(g0, "growth"); }, &m), FERRY_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(m, "GPU 0 is out of memory (4096 bytes asked for)");
  // A rank that did fine raises the same kind, naming rank 0 and quoting it.
  LocalFailure fine;
  fine.run([] {});
  EXPECT_FALSE(fine.failed());
  EXPECT_EQ(code_of([&] { fine.agree(fake_group(1, {sent, ""}), "growth"); }, &m), FERRY_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(m.find("growth: rank 0 failed: GPU 0 is out of memory"), std::string::npos) << m;
  // A message that names the same step already says it once.
  LocalFailure named;
  named.run([] { throw_error(FERRY_ERROR_NOT_REGISTERED, "free: the buffer at 0x10 is not registered"); });
  Group g2 = fake_group(0, {"", "ok"});
  auto inner2 = g2.allgather;
  g2.allgather = [&](const std::string& mine) {
    sent = mine;
    return inner2(mine);
  };
  EXPECT_EQ(code_of([&] { named.agree(g2, "free"); }, &m), FERRY_ERROR_NOT_REGISTERED);
  EXPECT_EQ(code_of([&] { fine.agree(fake_group(1, {sent, ""}), "free"); }, &m), FERRY_ERROR_NOT_REGISTERED);
  EXPECT_EQ(m.rfind("free: rank 0 failed: the buffer at 0x10 is not registered", 0), 0u) << m;
  EXPECT_EQ(m.find("free: free"), std::string::npos) << m;
  // Nobody failed: nothing raised.
  EXPECT_EQ(code_of([&] { fine.agree(fake_group(1, {"ok", ""}), "growth"); }), FERRY_SUCCESS);
  // An exception that is not ferry's travels as an internal error.
  LocalFailure other;
  other.run([] { throw std::runtime_error("bad_alloc-like"); });
  EXPECT_EQ(other.code(), FERRY_ERROR_INTERNAL);
  // A malformed answer is named, not taken for a failure of some kind.
  EXPECT_EQ(code_of([&] { fine.agree(fake_group(1, {"garbage", ""}), "growth"); }, &m), FERRY_ERROR_INTERNAL);
  EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
}

TEST(HeapCalls, AgreementAndTheStrayRankIsNamed) {
  std::vector<std::string> r(4, heap_call_record(3, "alloc(1024 bytes, align 256)"));
  EXPECT_EQ(heap_calls_mismatch(r), "");
  r[2] = heap_call_record(3, "free(offset 16384)");
  std::string m = heap_calls_mismatch(r);
  EXPECT_NE(m.find("rank 2 made call #3: free(offset 16384)"), std::string::npos) << m;
  EXPECT_NE(m.find("the other ranks made call #3: alloc(1024 bytes, align 256)"), std::string::npos) << m;
  EXPECT_EQ(m.find("rank 0"), std::string::npos) << m;
}

TEST(Teams, WorldAndStridedSplits) {
  Team w = device::world_team(5, 8);
  EXPECT_TRUE(device::team_usable(w, 8));
  Team odd = device::team_split_strided(w, 1, 2, 4);  // 1 3 5 7
  EXPECT_EQ(odd.size, 4);
  EXPECT_EQ(odd.my, 2);
  EXPECT_EQ(device::team_world_rank(odd, 3), 7);
  EXPECT_EQ(device::team_rank_of(odd, 4), -1);
  Team pair = device::team_split_strided(odd, 2, 1, 2);  // 5 7
  EXPECT_EQ(pair.start, 5);
  EXPECT_EQ(pair.stride, 2);
  EXPECT_EQ(pair.my, 0);
  Team evens = device::team_split_strided(w, 0, 2, 4);  // 0 2 4 6: 5 is not a member
  EXPECT_EQ(evens.my, -1);
  EXPECT_FALSE(device::team_usable(evens, 8));
  // Splits that leave the parent are no team.
  EXPECT_EQ(device::team_split_strided(w, 1, 2, 5).size, 0);
  EXPECT_EQ(device::team_split_strided(w, 0, 0, 2).size, 0);
  EXPECT_EQ(device::team_split_strided(w, -1, 1, 2).size, 0);
  EXPECT_FALSE(device::team_usable(w, 4));  // a team larger than the heap's world
  // Strides and spans past int: a team whose last member would wrap is not
  // usable, and nested splits of single members keep a stride of 1.
  EXPECT_FALSE(device::team_usable(Team{0, 1 << 30, 3, 0}, 2));
  EXPECT_FALSE(device::team_usable(Team{0, 0, 2, 0}, 2));
  Team one = device::team_split_strided(device::team_split_strided(w, 5, 65536, 1), 0, 65536, 1);
  EXPECT_EQ(one.size, 1);
  EXPECT_EQ(one.stride, 1);
  EXPECT_EQ(one.my, 0);
  EXPECT_EQ(device::team_rank_of(one, 5), 0);
  EXPECT_EQ(device::team_rank_of(one, 6), -1);
  EXPECT_TRUE(device::team_usable(one, 8));
  EXPECT_EQ(device::team_rank_of(Team{0, 0, 2, 0}, 0), -1);  // a hand-made stride of 0 divides nothing
  EXPECT_EQ(device::team_split_strided(Team{0, 1 << 20, 4096, 0}, 0, 4095, 2).size, 0);  // stride 2^20 x 4095
  // Every rank of a heap is on one machine: the node team is the world.
  Team node = device::node_team(5, 8);
  EXPECT_EQ(node.start, 0);
  EXPECT_EQ(node.stride, 1);
  EXPECT_EQ(node.size, 8);
  EXPECT_EQ(node.my, 5);
}

TEST(HeapFault, EachFaultWordGivesItsCodeAndNamesWhoWasAwaited) {
  using device::heap_fault_word;
  using device::WaitKind;
  EXPECT_EQ(heap_fault(0, 0, 2.0).code, 0);
  EXPECT_EQ(heap_fault(0x1234, 0, 2.0).code, 0);  // no fault bit
  HeapFault f = heap_fault(heap_fault_word(WaitKind::kBarrier, 1), 0, 2.0);
  EXPECT_EQ(f.code, FERRY_ERROR_TIMEOUT);
  EXPECT_NE(f.message.find("a barrier on rank 0 waited for rank 1 longer than the timeout (2.0"), std::string::npos)
      << f.message;
  EXPECT_NE(f.message.find("FERRY_TIMEOUT_S"), std::string::npos);
  f = heap_fault(heap_fault_word(WaitKind::kSignal, -1), 3, 1.0);
  EXPECT_NE(f.message.find("signal_wait_until on rank 3 waited for a signal from any rank"), std::string::npos)
      << f.message;
  f = heap_fault(heap_fault_word(WaitKind::kStreamWait, 2), 0, 1.0);
  EXPECT_NE(f.message.find("heap.wait) on rank 0 waited for rank 2"), std::string::npos) << f.message;
  f = heap_fault(heap_fault_word(WaitKind::kGridSync, -1), 1, 1.0);
  EXPECT_EQ(f.code, FERRY_ERROR_TIMEOUT);
  EXPECT_NE(f.message.find("every block of its grid"), std::string::npos) << f.message;
  f = heap_fault(heap_fault_word(WaitKind::kBadTeam, -1), 1, 1.0);
  EXPECT_EQ(f.code, FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(f.message.find("not a usable member"), std::string::npos) << f.message;
  f = heap_fault(heap_fault_word(WaitKind::kBadGrid, -1), 1, 1.0);
  EXPECT_EQ(f.code, FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(f.message.find("kMaxGridBlocks"), std::string::npos) << f.message;
  EXPECT_NE(f.message.find("the fault stays with the heap"), std::string::npos) << f.message;
  f = heap_fault(heap_fault_word(WaitKind::kBadRoot, 4), 2, 1.0);
  EXPECT_EQ(f.code, FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(f.message.find("rank 2 called broadcast or reduce with a root outside the team: root 4; expected a team "
                           "rank 0..size-1"),
            std::string::npos)
      << f.message;
  f = heap_fault(heap_fault_word(WaitKind::kBadRoot, -1), 0, 1.0);
  EXPECT_NE(f.message.find("root -1;"), std::string::npos) << f.message;
}
