// Multipath transfers' pure parts: when a copy goes multipath, its chunks,
// the back-pressure scheduler, and, through a model of the links, the balance
// it reaches against static splits (the comparison published for MMA, a
// multipath host<->GPU design: two paths, with and without a foreign copy on
// one of them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <set>

#include "core/error.hpp"
#include "xfer/multipath_plan.hpp"

using namespace ferry::xfer;

namespace {

constexpr size_t kMiB = size_t(1) << 20;
constexpr size_t kGiB = size_t(1) << 30;

std::vector<LinkModel> equal_links(int n, double gbps = 55) { return std::vector<LinkModel>(n, LinkModel{gbps * 1e9}); }

// Probes on: `links` links and one copy of `bytes` into GPU 0 in `lane`, in 1 MiB chunks.
MultipathScheduler one_copy(int links, size_t bytes, int lane = 0) {
  MultipathScheduler s(links, MultipathPolicy{});
  s.add(0, split_chunks(bytes, kMiB), lane);
  return s;
}

// The scheduler's other rules, with every lane clear from the start.
MultipathPolicy unprobed() {
  MultipathPolicy p;
  p.probe = false;
  return p;
}

}  // namespace

TEST(MultipathChoice, PlainCopyWithTheReason) {
  MultipathCase k;
  k.bytes = 64 * kMiB;
  k.host_pinned = true;
  k.usable_relays = 3;
  k.threshold_bytes = 8 * kMiB;
  k.device = 2;
  EXPECT_TRUE(choose_multipath(k).multipath);
  auto says = [](MultipathCase c, const char* text) {
    const auto r = choose_multipath(c);
    EXPECT_FALSE(r.multipath) << text;
    EXPECT_NE(r.reason.find(text), std::string::npos) << r.reason;
  };
  auto small = k;
  small.bytes = 4 * kMiB;
  says(small, "below the multipath threshold");
  auto pageable = k;
  pageable.host_pinned = false;
  says(pageable, "pageable");
  auto alone = k;
  alone.usable_relays = 0;
  says(alone, "no peer GPU may relay");
  auto foreign = k;
  foreign.own_link = false;
  foreign.host_pinned = false;  // the missing link is said first
  says(foreign, "cuda:2 has no link in this engine");
  auto captured = k;
  captured.capturing = true;
  says(captured, "capturing a CUDA graph");
  captured.bytes = 4 * kMiB;  // a small copy in a graph: the threshold is the reason
  says(captured, "below the multipath threshold");
}

TEST(MultipathRoute, ARangeEndingInOtherMemoryIsNamed) {
  using ferry::xfer::MemKind;
  using ferry::xfer::multipath_range_end;
  EXPECT_EQ(multipath_range_end("src", MemKind::kPinnedHost, -1, MemKind::kPinnedHost, -1), "");
  EXPECT_EQ(multipath_range_end("dst", MemKind::kDevice, 1, MemKind::kDevice, 1), "");
  EXPECT_EQ(multipath_range_end("src", MemKind::kPinnedHost, -1, MemKind::kPageable, -1),
            "src starts in pinned host memory and its last byte is in pageable host memory");
  EXPECT_EQ(multipath_range_end("pieces[3].dst", MemKind::kDevice, 2, MemKind::kDevice, 3),
            "pieces[3].dst starts in GPU memory (cuda:2) and its last byte is in GPU memory (cuda:3)");
}

TEST(MultipathRoute, ARangePastTheEndOfTheAddressSpaceIsNamed) {
  using ferry::xfer::multipath_range_wraps;
  const auto at = [](uintptr_t a) { return reinterpret_cast<const void*>(a); };
  EXPECT_EQ(multipath_range_wraps("dst", at(0x1000), 4096), "");
  EXPECT_EQ(multipath_range_wraps("dst", at(UINTPTR_MAX - 4095), 4096), "");  // its last byte is the last one
  EXPECT_EQ(multipath_range_wraps("dst", at(8192), 0), "");
  EXPECT_EQ(multipath_range_wraps("src", at(UINTPTR_MAX - 4095), 4097),
            "src plus 4097 bytes runs past the end of the address space");
  EXPECT_EQ(multipath_range_wraps("pieces[2].dst", at(8192), SIZE_MAX - 4095),
            "pieces[2].dst plus " + std::to_string(SIZE_MAX - 4095) + " bytes runs past the end of the address space");
}

TEST(MultipathChunks, CoverTheCopyInOrder) {
  auto c = split_chunks(10 * kMiB + 3, 4 * kMiB);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[2].offset, 8 * kMiB);
  EXPECT_EQ(c[2].bytes, 2 * kMiB + 3);
  EXPECT_TRUE(split_chunks(0, kMiB).empty());
  EXPECT_THROW(split_chunks(1, 0), ferry::Error);
}

TEST(MultipathChunks, ABatchsCopiesEndToEndNoChunkCrossingACopysEnd) {
  // 3 MiB + 1, nothing, 1 MiB - 5, 2 MiB in 2 MiB chunks.
  auto c = split_batch({3 * kMiB + 1, 0, kMiB - 5, 2 * kMiB}, 2 * kMiB);
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].offset, 0u);
  EXPECT_EQ(c[0].bytes, 2 * kMiB);
  EXPECT_EQ(c[1].offset, 2 * kMiB);
  EXPECT_EQ(c[1].bytes, kMiB + 1);  // the first copy's end, not a whole chunk
  EXPECT_EQ(c[2].offset, 3 * kMiB + 1);
  EXPECT_EQ(c[2].bytes, kMiB - 5);
  EXPECT_EQ(c[3].offset, 4 * kMiB - 4);
  EXPECT_EQ(c[3].bytes, 2 * kMiB);
  size_t total = 0;
  for (const auto& x : c) total += x.bytes;
  EXPECT_EQ(total, 6 * kMiB - 4);
  EXPECT_TRUE(split_batch({}, kMiB).empty());
  EXPECT_TRUE(split_batch({0, 0}, kMiB).empty());
  EXPECT_THROW(split_batch({1}, 0), ferry::Error);
}

TEST(MultipathScheduler, BoundedOutstandingOwnLinkFirstThenTheLongestQueue) {
  MultipathPolicy p = unprobed();
  p.outstanding = 2;
  MultipathScheduler s(3, p);
  const int a = s.add(0, split_chunks(4 * kMiB, kMiB));  // 4 chunks for GPU 0
  const int b = s.add(1, split_chunks(kMiB, kMiB));      // 1 chunk for GPU 1
  Assignment x;
  ASSERT_TRUE(s.next(1, &x));  // link 1 serves GPU 1 first
  EXPECT_EQ(x.transfer, b);
  EXPECT_FALSE(x.relay());
  ASSERT_TRUE(s.next(1, &x));  // then relays for GPU 0
  EXPECT_EQ(x.transfer, a);
  EXPECT_TRUE(x.relay());
  EXPECT_FALSE(s.next(1, &x));  // two in flight: full
  ASSERT_TRUE(s.next(2, &x));   // link 2 has no transfer of its own: relays
  EXPECT_EQ(x.target, 0);
  s.complete(1);
  EXPECT_TRUE(s.done(b));
  EXPECT_FALSE(s.done(a));
  ASSERT_TRUE(s.next(0, &x));
  ASSERT_TRUE(s.next(1, &x));
  EXPECT_FALSE(s.next(2, &x)) << "GPU 0's four chunks are all taken";
  for (int l : {0, 1, 1, 2}) s.complete(l);
  EXPECT_TRUE(s.done(a));
  EXPECT_TRUE(s.idle());
  EXPECT_THROW(s.complete(2), ferry::Error);
  EXPECT_THROW(s.add(3, {}), ferry::Error);
}

TEST(MultipathScheduler, LinksThatMayNotRelayCarryOnlyTheirOwn) {
  MultipathPolicy p = unprobed();
  p.may_relay = {true, false};
  MultipathScheduler s(2, p);
  s.add(0, split_chunks(3 * kMiB, kMiB));
  Assignment x;
  EXPECT_FALSE(s.next(1, &x));
  EXPECT_TRUE(s.next(0, &x));
}

// own_share_on_stream: the engine copies the target's share on the caller's
// stream itself, so the scheduler gives the target's link none of its chunks
// while another link may relay them, and the link still relays for others.
TEST(MultipathScheduler, WithTheOwnShareOnTheStreamAGpusLinkCarriesNoneOfItsChunks) {
  MultipathPolicy p = unprobed();
  p.own_share_on_stream = true;
  MultipathScheduler s(3, p);
  const int into0 = s.add(0, split_chunks(4 * kMiB, kMiB));
  Assignment x;
  EXPECT_FALSE(s.next(0, &x)) << "link 0 took a chunk of its own GPU's copy";
  ASSERT_TRUE(s.next(1, &x));
  EXPECT_EQ(x.transfer, into0);
  EXPECT_TRUE(x.relay());
  const int into1 = s.add(1, split_chunks(kMiB, kMiB));
  ASSERT_TRUE(s.next(0, &x));  // link 0 relays GPU 1's chunk
  EXPECT_EQ(x.transfer, into1);
  EXPECT_EQ(x.link, 0);
  EXPECT_TRUE(x.relay());
  EXPECT_FALSE(s.next(1, &x) && x.target == 1) << "link 1 took a chunk of its own GPU's copy";
  // Every chunk of both copies still goes.
  for (int round = 0; round < 20 && !(s.done(into0) && s.done(into1)); ++round)
    for (int l = 0; l < 3; ++l) {
      while (s.next(l, &x)) EXPECT_NE(x.link, x.target);
      if (s.in_flight(l)) s.complete(l);
    }
  EXPECT_TRUE(s.done(into0));
  EXPECT_TRUE(s.done(into1));
}

// Reserved links (the link board) still relay a copy whose own share is on
// the caller's stream, and its own link still takes none of it: after copy()
// returned, nothing of such a copy may reach the target over its own link.
// A copy without the share stays off reserved links.
TEST(MultipathScheduler, ReservedLinksStillRelayACopyWhoseOwnShareIsOnTheStream) {
  MultipathScheduler s(3, unprobed());
  s.reserve(1, 0, true);
  s.reserve(2, 0, true);
  const int shared = s.add(0, split_chunks(4 * kMiB, kMiB), 0, true);
  Assignment x;
  EXPECT_FALSE(s.next(0, &x)) << "the own link took a chunk of a copy whose own share is on the stream";
  ASSERT_TRUE(s.next(1, &x));
  EXPECT_EQ(x.transfer, shared);
  for (int round = 0; round < 20 && !s.done(shared); ++round)
    for (int l = 0; l < 3; ++l) {
      while (s.next(l, &x)) EXPECT_NE(x.link, 0);
      while (s.in_flight(l)) s.complete(l);
    }
  EXPECT_TRUE(s.done(shared));
  const int plain = s.add(0, split_chunks(4 * kMiB, kMiB), 0, false);
  EXPECT_FALSE(s.next(1, &x)) << "a reserved link relayed a copy without the own share on the stream";
  EXPECT_FALSE(s.next(2, &x));
  ASSERT_TRUE(s.next(0, &x));
  EXPECT_EQ(x.transfer, plain);
}

// Where no other link may carry any of a copy (every relay reserved by the
// link board), its own link takes it in copies of up to kMultipathAloneChunk
// rather than chunk by chunk (each copy costs the copy engine a few
// microseconds), never across the end of one of a batch's copies and with no
// finer tail; with a relay free again, chunks go as given.
TEST(MultipathScheduler, AloneOnItsCopyALinkTakesItInLargeCopies) {
  MultipathScheduler s(2, unprobed());
  s.reserve(1, 0, true);
  const size_t chunk = 8 * kMiB;
  const int big = s.add(0, split_chunks(200 * kMiB, chunk));
  Assignment x;
  EXPECT_FALSE(s.next(1, &x)) << "a reserved link relayed";
  std::vector<size_t> took;
  size_t at = 0;
  for (int round = 0; round < 20 && !s.done(big); ++round) {
    while (s.next(0, &x)) {
      EXPECT_EQ(x.chunk.offset, at);
      at += x.chunk.bytes;
      took.push_back(x.chunk.bytes);
    }
    s.complete(0);
  }
  EXPECT_TRUE(s.done(big));
  EXPECT_TRUE(s.idle());
  EXPECT_EQ(took, (std::vector<size_t>{kMultipathAloneChunk, kMultipathAloneChunk, kMultipathAloneChunk, 8 * kMiB}));

  // A batch: copies of 20, 3 and 30 MiB stay apart.
  const int batch = s.add(0, split_batch({20 * kMiB, 3 * kMiB, 30 * kMiB}, chunk));
  took.clear();
  for (int round = 0; round < 20 && !s.done(batch); ++round) {
    while (s.next(0, &x)) took.push_back(x.chunk.bytes);
    s.complete(0);
  }
  EXPECT_TRUE(s.done(batch));
  EXPECT_EQ(took, (std::vector<size_t>{20 * kMiB, 3 * kMiB, 30 * kMiB}));

  // The relay free again: 8 MiB chunks on both links, the tail finer.
  s.reserve(1, 0, false);
  const int shared = s.add(0, split_chunks(64 * kMiB, chunk));
  ASSERT_TRUE(s.next(0, &x));
  EXPECT_EQ(x.chunk.bytes, chunk);
  ASSERT_TRUE(s.next(1, &x));
  EXPECT_EQ(x.chunk.bytes, chunk);
  EXPECT_TRUE(x.relay());
  size_t smallest = chunk;
  for (int round = 0; round < 40 && !s.done(shared); ++round)
    for (int l = 0; l < 2; ++l) {
      while (s.next(l, &x)) smallest = std::min(smallest, x.chunk.bytes);
      if (s.in_flight(l)) s.complete(l);
    }
  EXPECT_TRUE(s.done(shared));
  EXPECT_LT(smallest, chunk) << "no finer tail with two links";
}

// A large copy its own link took and gave back (as when a relay of the same
// round fails: stop_relay gives back all that round gave the link) goes to a
// relay freed meanwhile in chunks no larger than those added: a relay's
// staging buffer holds no more.
TEST(MultipathScheduler, ALargeCopyGivenBackGoesToARelayInChunksAsAdded) {
  MultipathPolicy p = unprobed();
  p.tail_chunk = 0;
  MultipathScheduler s(3, p);
  s.reserve(1, 0, true);
  s.reserve(2, 0, true);
  const size_t chunk = 8 * kMiB;
  const int into0 = s.add(0, split_chunks(9 * chunk, chunk), 0);
  Assignment x;
  ASSERT_TRUE(s.next(0, &x));
  ASSERT_GT(x.chunk.bytes, chunk) << "the case did not arise: link 0 took no large copy";
  s.give_back(0);
  s.reserve(1, 0, false);
  ASSERT_TRUE(s.next(1, &x));  // the freed relay first: the large copy is at the front of GPU 0's queue
  EXPECT_TRUE(x.relay());
  EXPECT_LE(x.chunk.bytes, chunk) << "a relay took more than its staging buffer holds";
  for (int round = 0; round < 40 && !s.done(into0); ++round)
    for (int l = 0; l < 3; ++l) {
      while (s.next(l, &x))
        if (x.relay()) EXPECT_LE(x.chunk.bytes, chunk) << "a relay took more than its staging buffer holds";
      if (s.in_flight(l)) s.complete(l);
    }
  EXPECT_TRUE(s.done(into0));
  EXPECT_TRUE(s.idle());
}

// The setting is per copy: a copy whose stream could not take the own share
// (a stream on another GPU) is carried by the target's link as usual, and the
// link keeps out of the next copy, whose share is on its stream, once it is
// the front of the queue.
TEST(MultipathScheduler, TheOwnShareOnTheStreamIsPerCopy) {
  MultipathPolicy p = unprobed();
  p.own_share_on_stream = true;
  MultipathScheduler s(2, p);
  const int plain = s.add(0, split_chunks(kMiB, kMiB), 0, false);
  const int shared = s.add(0, split_chunks(kMiB, kMiB), 0);  // the policy's: on the stream
  Assignment x;
  ASSERT_TRUE(s.next(0, &x)) << "the target's link did not carry a copy without its share on the stream";
  EXPECT_EQ(x.transfer, plain);
  EXPECT_FALSE(x.relay());
  EXPECT_FALSE(s.next(0, &x)) << "the target's link took a chunk of a copy whose share is on the stream";
  ASSERT_TRUE(s.next(1, &x));
  EXPECT_EQ(x.transfer, shared);
  EXPECT_TRUE(x.relay());
  s.complete(0);
  s.complete(1);
  EXPECT_TRUE(s.done(plain) && s.done(shared));
  s.forget_transfers();
  const int off = s.add(0, split_chunks(kMiB, kMiB), 0, false);  // the flag is kept by transfer, not by id reuse
  ASSERT_TRUE(s.next(0, &x));
  EXPECT_EQ(x.transfer, off);
}

// With no link left that may relay, the target's own link carries its chunks
// after all: the copy never waits for a relay that will not come.
TEST(MultipathScheduler, WithTheOwnShareOnTheStreamTheOwnLinkIsTheLastResort) {
  MultipathPolicy p = unprobed();
  p.own_share_on_stream = true;
  p.may_relay = {true, false};
  MultipathScheduler only(2, p);
  only.add(0, split_chunks(2 * kMiB, kMiB));
  Assignment x;
  ASSERT_TRUE(only.next(0, &x));
  EXPECT_FALSE(x.relay());

  p.may_relay = {true, true};
  MultipathScheduler s(2, p);
  s.add(0, split_chunks(3 * kMiB, kMiB));
  EXPECT_FALSE(s.next(0, &x));
  ASSERT_TRUE(s.next(1, &x));
  s.give_back(1);  // the relay fails: it relays no more
  ASSERT_TRUE(s.next(0, &x)) << "the own link did not take over";
  EXPECT_FALSE(x.relay());
}

// With probes on: relays whose every chunk waits 2 ms behind foreign copies
// for a second, and the target's own link keeping out of its GPU's copy.
// Each held relay becomes the last resort and takes chunks rather than only
// probing again (a relay that only probes would leave the copy waiting out
// the whole second).
TEST(MultipathBalance, WithTheOwnShareOnTheStreamHeldRelaysStillCarry) {
  std::vector<LinkModel> links = equal_links(3);
  for (int l : {1, 2}) {
    links[l].busy_share = 0.5;
    links[l].busy_until = 1.0;
    links[l].busy_wait_s = 2e-3;
  }
  MultipathPolicy p;
  p.own_share_on_stream = true;
  const auto r = simulate(links, {SimTransfer{0, 64 * kMiB}}, 4 * kMiB, p);
  EXPECT_LT(r.seconds, 0.1);
  EXPECT_EQ(r.bytes_by_link[0], 0u) << "the own link carried its GPU's chunks";
  EXPECT_EQ(r.bytes_by_link[1] + r.bytes_by_link[2], 64 * kMiB);
}

// The comparison's first case: two equal paths, no foreign traffic. The dynamic
// split is as good as the even static one; a 1:2 split is not.
TEST(MultipathBalance, TwoEqualPaths) {
  const auto links = equal_links(2);
  const SimTransfer t{0, kGiB};
  const double ideal = ideal_seconds(links, kGiB);
  const auto dyn = simulate(links, {t}, 4 * kMiB, MultipathPolicy{});
  const auto even = simulate_static(links, t, 4 * kMiB, {1, 1});
  const auto skewed = simulate_static(links, t, 4 * kMiB, {1, 2});
  EXPECT_LT(dyn.seconds, 1.02 * ideal);
  EXPECT_LT(even.seconds, 1.02 * ideal);
  EXPECT_GT(skewed.seconds, 1.3 * ideal);
  EXPECT_NEAR(double(dyn.bytes_by_link[0]) / double(dyn.bytes_by_link[1]), 1.0, 0.05);
  EXPECT_EQ(dyn.bytes_by_link[0] + dyn.bytes_by_link[1], kGiB);
}

// The comparison's second case: a foreign copy takes half of the target's own
// link for the whole transfer. The dynamic split moves chunks to the free
// path and reaches at least 90% of the capacity left (the target);
// the even static split does not, the 1:2 one roughly does.
TEST(MultipathBalance, AForeignCopyOnTheTargetsOwnLink) {
  auto links = equal_links(2);
  links[0].busy_share = 0.5;
  links[0].busy_until = 1e9;
  const SimTransfer t{0, kGiB};
  const double ideal = ideal_seconds(links, kGiB);
  const auto dyn = simulate(links, {t}, 4 * kMiB, MultipathPolicy{});
  const auto even = simulate_static(links, t, 4 * kMiB, {1, 1});
  const auto skewed = simulate_static(links, t, 4 * kMiB, {1, 2});
  EXPECT_LT(dyn.seconds, ideal / 0.9);
  EXPECT_GT(even.seconds, 1.4 * ideal);
  EXPECT_LT(skewed.seconds, 1.05 * ideal);
  EXPECT_NEAR(double(dyn.bytes_by_link[1]) / double(dyn.bytes_by_link[0]), 2.0, 0.15);
}

// A foreign copy that starts part way: the split follows it while it lasts.
TEST(MultipathBalance, AForeignCopyThatComesAndGoes) {
  auto links = equal_links(4);
  const double alone = ideal_seconds(links, 4 * kGiB);
  links[0].busy_share = 0.75;
  links[0].busy_from = alone / 4;
  links[0].busy_until = alone / 2;
  const double ideal = ideal_seconds(links, 4 * kGiB);
  const auto dyn = simulate(links, {SimTransfer{0, 4 * kGiB}}, 4 * kMiB, MultipathPolicy{});
  EXPECT_LT(dyn.seconds, ideal / 0.9);
}

// Every GPU fetching its own data at once: own link first leaves nothing to
// relay but the last few chunks, so NVLink carries almost nothing.
TEST(MultipathBalance, OwnLinkFirstRelaysOnlyTheTail) {
  const auto links = equal_links(4);
  std::vector<SimTransfer> ts;
  for (int g = 0; g < 4; ++g) ts.push_back(SimTransfer{g, kGiB});
  const auto dyn = simulate(links, ts, 4 * kMiB, MultipathPolicy{});
  EXPECT_LE(dyn.relayed_bytes, 4 * 4 * kMiB);
  MultipathPolicy any;
  any.own_link_first = false;
  const auto mixed = simulate(links, ts, 4 * kMiB, any);
  EXPECT_GT(mixed.relayed_bytes, dyn.relayed_bytes);
  EXPECT_LT(dyn.seconds, 1.02 * ideal_seconds(links, 4 * kGiB));
}

// More paths, more bandwidth: one GPU's copy over 1 to 4 host links (the
// static round-robin probe on 4 H200s measured 54, 107, 155, 184 GB/s; the
// model has no host-side ceiling, so it scales linearly).
TEST(MultipathBalance, ScalesWithThePaths) {
  double last = 1e9;
  for (int n = 1; n <= 8; ++n) {  // up to a full eight-GPU node
    const auto dyn = simulate(equal_links(n), {SimTransfer{0, kGiB}}, 4 * kMiB, MultipathPolicy{});
    const double gbps = double(kGiB) / dyn.seconds / 1e9;
    EXPECT_NEAR(gbps, 55.0 * n, 55.0 * n * 0.03) << n << " paths";
    EXPECT_LT(dyn.seconds, last);
    last = dyn.seconds;
  }
}

// Two programs using ferry at once, each fetching 1 GiB into its own GPU over
// all four links: they share the links about evenly, and together they keep
// the links as busy as one program alone would.
TEST(MultipathBalance, TwoProcessesShareTheLinksFairly) {
  const auto links = equal_links(4);
  const auto both =
      simulate_processes(links, {{SimTransfer{0, kGiB}}, {SimTransfer{1, kGiB}}}, 4 * kMiB, MultipathPolicy{});
  ASSERT_EQ(both.size(), 2u);
  EXPECT_NEAR(both[0].seconds / both[1].seconds, 1.0, 0.05);
  EXPECT_LT(std::max(both[0].seconds, both[1].seconds), 1.03 * ideal_seconds(links, 2 * kGiB));
}

// Every GPU's program copying its own 1 GiB at once (tensor-parallel ranks
// waking their shards): with the link board each keeps its own link and
// relays nothing, so that no program ends later than it would over its own
// link alone; without it each relayed three quarters of its bytes through
// links the others needed.
TEST(MultipathBalance, EveryProgramCopyingItsOwnKeepsItsOwnLink) {
  const auto links = equal_links(4);
  const std::vector<std::vector<SimTransfer>> own = {
      {SimTransfer{0, kGiB}}, {SimTransfer{1, kGiB}}, {SimTransfer{2, kGiB}}, {SimTransfer{3, kGiB}}};
  const auto with = simulate_processes(links, own, 8 * kMiB, MultipathPolicy{}, 1 / 300e9);
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(with[p].relayed_bytes, 0u) << "program " << p;
    EXPECT_EQ(with[p].bytes_by_link[p], kGiB) << "program " << p;
    EXPECT_LT(with[p].seconds, 1.01 * ideal_seconds({links[p]}, kGiB)) << "program " << p;
  }
  MultipathPolicy no_board;
  no_board.board = false;
  const auto without = simulate_processes(links, own, 8 * kMiB, no_board, 1 / 300e9);
  EXPECT_GT(without[0].relayed_bytes, kGiB / 2);
}

// Eight GPUs: with one program per GPU each keeps its own link; with one
// program copying into GPU 0 alone, all eight links share its copy evenly.
TEST(MultipathBalance, EightGpus) {
  const auto links = equal_links(8);
  std::vector<std::vector<SimTransfer>> own;
  for (int p = 0; p < 8; ++p) own.push_back({SimTransfer{p, kGiB}});
  const auto each = simulate_processes(links, own, 8 * kMiB, MultipathPolicy{}, 1 / 300e9);
  ASSERT_EQ(each.size(), 8u);
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(each[p].relayed_bytes, 0u) << "program " << p;
    EXPECT_LT(each[p].seconds, 1.01 * ideal_seconds({links[p]}, kGiB)) << "program " << p;
  }
  const auto one = simulate(links, {SimTransfer{0, 4 * kGiB}}, 8 * kMiB, MultipathPolicy{});
  EXPECT_LT(one.seconds, 1.03 * ideal_seconds(links, 4 * kGiB));
  ASSERT_EQ(one.bytes_by_link.size(), 8u);
  for (int l = 0; l < 8; ++l) EXPECT_NEAR(double(one.bytes_by_link[l]), 4.0 * kGiB / 8, 4.0 * kGiB / 8 * 0.05) << l;
}

// Four programs, one of them short: once it ended, its link is free, and
// the others relay through it (and through each other's, as with no board).
TEST(MultipathBalance, ALinkFreedByItsProgramRelaysAgain) {
  const auto links = equal_links(4);
  const auto r = simulate_processes(
      links, {{SimTransfer{0, kGiB}}, {SimTransfer{1, 64 * kMiB}}, {SimTransfer{2, kGiB}}, {SimTransfer{3, kGiB}}},
      8 * kMiB, MultipathPolicy{}, 1 / 300e9);
  EXPECT_EQ(r[1].relayed_bytes, 0u);  // while it copied, every link was its own program's
  EXPECT_GT(r[0].bytes_by_link[1], kGiB / 16);
  EXPECT_LT(r[0].seconds, 0.9 * ideal_seconds({links[0]}, kGiB));  // faster than its own link alone
}

// Posts last over the gap between a program's copies, not longer.
TEST(MultipathBoard, PostsOutlastACopyByTheGapToTheNext) {
  std::map<BoardKey, double> ended;
  EXPECT_EQ(board_posts({{0, 1}}, &ended, 1.0), (std::set<BoardKey>{{0, 1}}));
  ended[{0, 1}] = 1.0;  // its copy landed
  ended[{2, 0}] = 1.0;
  EXPECT_EQ(board_posts({}, &ended, 1.0 + kMultipathBoardGapS / 2), (std::set<BoardKey>{{0, 1}, {2, 0}}));
  EXPECT_EQ(board_posts({{3, 0}}, &ended, 1.0 + kMultipathBoardGapS / 2), (std::set<BoardKey>{{0, 1}, {2, 0}, {3, 0}}));
  EXPECT_EQ(ended.size(), 2u);
  EXPECT_EQ(board_posts({{2, 0}}, &ended, 1.0 + kMultipathBoardGapS), (std::set<BoardKey>{{2, 0}}))
      << "a post outlasted the gap";
  EXPECT_TRUE(ended.empty()) << "entries past the gap are dropped";
  EXPECT_TRUE(board_posts({}, &ended, 2.0).empty());
}

// The rule itself: every link that could relay posted, or none reserved.
TEST(MultipathBoard, ReservesOnlyWhereEveryLinkThatCouldRelayIsPosted) {
  const std::vector<bool> all(4, true);
  // This engine copies into GPU 0; the other three GPUs are each copied by their program.
  EXPECT_EQ(board_reservations({false, true, true, true}, {true, false, false, false}, all),
            (std::vector<bool>{false, true, true, true}));
  // GPU 3 is free: nothing reserved, the engines share every link.
  EXPECT_EQ(board_reservations({false, true, true, false}, {true, false, false, false}, all), std::vector<bool>(4));
  // GPU 1 is copied by this engine too: the rest decide.
  EXPECT_EQ(board_reservations({false, true, true, true}, {true, true, false, false}, all),
            (std::vector<bool>{false, false, true, true}));
  // A loopback relay has no GPU on the board: never reserved, and it does not count.
  EXPECT_EQ(board_reservations({true, false, false}, {false, false, false}, {true, false, false}),
            (std::vector<bool>{true, false, false}));
  EXPECT_EQ(board_reservations({false, false}, {true, false}, {true, false}), std::vector<bool>(2));
  EXPECT_THROW(board_reservations({false}, {false, false}, {true, true}), ferry::Error);
}

TEST(MultipathRoute, DirectionDeviceAndPinnedness) {
  auto r = route_multipath(MemKind::kDevice, 3, MemKind::kPinnedHost, -1);
  EXPECT_TRUE(r.error.empty());
  EXPECT_TRUE(r.to_device);
  EXPECT_EQ(r.device, 3);
  EXPECT_TRUE(r.host_pinned);
  r = route_multipath(MemKind::kPageable, -1, MemKind::kDevice, 1);
  EXPECT_TRUE(r.error.empty());
  EXPECT_FALSE(r.to_device);
  EXPECT_EQ(r.device, 1);
  EXPECT_FALSE(r.host_pinned);
}

TEST(MultipathRoute, OneSideEachOrANamedError) {
  auto r = route_multipath(MemKind::kDevice, 0, MemKind::kDevice, 1);
  EXPECT_NE(r.error.find("dst is GPU memory (cuda:0) and src is GPU memory (cuda:1)"), std::string::npos) << r.error;
  r = route_multipath(MemKind::kPinnedHost, -1, MemKind::kPageable, -1);
  EXPECT_NE(r.error.find("pinned host memory and src is pageable host memory"), std::string::npos) << r.error;
  r = route_multipath(MemKind::kDevice, 0, MemKind::kManaged, 0);
  EXPECT_NE(r.error.find("src is managed memory"), std::string::npos) << r.error;
}

TEST(MultipathLinks, OwnLinkIsTheFirstOnTheDevice) {
  EXPECT_EQ(own_link({0, 1, 2, 3}, 2), 2);
  EXPECT_EQ(own_link({0, 0, 0}, 0), 0);  // one GPU, relaying through itself (testing)
  EXPECT_EQ(own_link({1, 2}, 0), -1);
}

TEST(MultipathScheduler, CopiesThatAlwaysOverlapReuseTheIdsOfFinishedOnes) {
  // A save and a fetch always in flight together: the scheduler is never idle,
  // and its per-copy state stays as large as the copies in flight.
  MultipathScheduler s(1, unprobed());
  int older = s.add(0, split_chunks(kMiB, kMiB));
  std::set<int> ids{older};
  for (int round = 0; round < 1000; ++round) {
    const int newer = s.add(0, split_chunks(kMiB, kMiB), round % 2);
    ids.insert(newer);
    Assignment a;
    while (s.next(0, &a)) {
    }
    ASSERT_EQ(s.in_flight(0), 2) << round;
    s.complete(0);  // the older copy's chunk lands; the newer one's stays in flight
    ASSERT_TRUE(s.done(older)) << round;
    ASSERT_FALSE(s.idle()) << round;
    EXPECT_THROW(s.finish(newer), ferry::Error) << "not done yet";
    s.finish(older);
    older = newer;
  }
  EXPECT_EQ(ids.size(), 2u) << "ids stay as few as the copies in flight at once";
  EXPECT_THROW(s.finish(-1), ferry::Error);
  // Finishing one copy twice would give its id to two later copies.
  Assignment a;
  while (s.next(0, &a)) {
  }
  s.complete(0);
  ASSERT_TRUE(s.done(older));
  s.finish(older);
  EXPECT_THROW(s.finish(older), ferry::Error);
  EXPECT_NE(s.add(0, split_chunks(kMiB, kMiB)), s.add(0, split_chunks(kMiB, kMiB)));
}

TEST(MultipathChunkSize, EveryLinksQueueGetsAChunkWithinTheBounds) {
  const size_t MiB = size_t{1} << 20;
  // 16 MiB over 2 links with 2 outstanding each: 4 chunks, so the relay takes half.
  EXPECT_EQ(multipath_chunk_bytes(16 * MiB, 2, 2, 8 * MiB), 4 * MiB);
  // Large copies use the staging buffers' size.
  EXPECT_EQ(multipath_chunk_bytes(1024 * MiB, 4, 2, 8 * MiB), 8 * MiB);
  // Never below the floor; never above the staging buffers, even where the floor is larger.
  EXPECT_EQ(multipath_chunk_bytes(8 * MiB, 8, 2, 8 * MiB), 2 * MiB);
  EXPECT_EQ(multipath_chunk_bytes(8 * MiB, 3, 2, MiB + 4097), MiB + 4097);
  // 64 KiB steps.
  EXPECT_EQ(multipath_chunk_bytes(10 * MiB + 1, 2, 2, 8 * MiB) % (64 << 10), 0u);
  EXPECT_THROW(multipath_chunk_bytes(MiB, 2, 2, 0), ferry::Error);
  // Near 2^64 bytes nothing wraps: the largest chunk, not the smallest.
  EXPECT_EQ(multipath_chunk_bytes(SIZE_MAX, 4, 3, 8 * MiB), 8 * MiB);
  EXPECT_EQ(multipath_chunk_bytes(SIZE_MAX, 1, 1, 8 * MiB), 8 * MiB);
}

TEST(MultipathChunkSize, SplitsNearTheEndOfTheAddressSpaceNeitherWrapNorOverlap) {
  const size_t half = size_t(1) << 63;
  EXPECT_THROW(split_batch({half, half, 4}, half), ferry::Error);  // the third piece would sit at offset 0
  const auto c = split_chunks(SIZE_MAX, half);                     // ends: the offsets do not wrap to 0
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].offset, half);
  EXPECT_EQ(c[1].bytes, half - 1);
  // The whole copy as the own share, however large.
  EXPECT_EQ(multipath_split(SIZE_MAX, 3, 0, true, SIZE_MAX, true, 1.0).head, SIZE_MAX / (64 << 10) * (64 << 10));
  EXPECT_THROW(MultipathScheduler(-1, MultipathPolicy{}), ferry::Error);
}

TEST(MultipathScheduler, AChunkGivenBackGoesToTheOtherLinksAndTheLinkRelaysNoMore) {
  MultipathScheduler s(3, unprobed());
  const int t = s.add(0, split_chunks(6, 1));
  Assignment a;
  ASSERT_TRUE(s.next(1, &a));  // a relay takes chunk 0
  EXPECT_EQ(a.chunk.offset, 0u);
  s.give_back(1);  // and cannot submit it
  EXPECT_EQ(s.in_flight(1), 0);
  EXPECT_FALSE(s.next(1, &a));  // relays no more
  ASSERT_TRUE(s.next(2, &a));
  EXPECT_EQ(a.chunk.offset, 0u);  // the chunk given back is next
  EXPECT_FALSE(s.policy().may_relay[1]);
  std::vector<int> order;
  while (!s.done(t)) {
    for (int l : {0, 2}) {
      Assignment b;
      while (s.next(l, &b)) order.push_back(static_cast<int>(b.chunk.offset));
      if (s.in_flight(l)) s.complete(l);
    }
  }
  EXPECT_EQ(order.size(), 5u);  // chunks 1..5 (chunk 0 went to link 2 above)
}

// A copy engine that serves a foreign copy's long commands first makes each
// chunk on the target's link wait milliseconds (busy_wait_s), and a stream
// of copies, each waiting for its slowest chunk, goes no faster than a plain
// copy. With the links' measured speed the target's own link stops taking
// chunks it would land last, after the first; with probes it takes none, and
// the copies go at the relay's speed.
TEST(MultipathBalance, AForeignCopyThatHoldsTheEngineFirst) {
  auto links = equal_links(2);
  links[0].busy_from = 0;
  links[0].busy_until = 10;
  links[0].busy_wait_s = 0.01;
  links[0].busy_share = 0.5;
  const std::vector<SimTransfer> copies(8, SimTransfer{0, 256 * kMiB});
  MultipathPolicy measured = unprobed(), blind = unprobed();
  blind.earliest_finish = false;
  const auto probed = simulate(links, copies, 8 * kMiB, MultipathPolicy{}, 0.0, true);
  const auto with = simulate(links, copies, 8 * kMiB, measured, 0.0, true);
  const auto without = simulate(links, copies, 8 * kMiB, blind, 0.0, true);
  const double relay_alone = 8.0 * 256 * kMiB / 55e9;
  // Back-pressure alone: every copy waits for a chunk on the held link.
  EXPECT_GT(without.seconds, 8 * 0.01);
  // Measured: the first copy learns, the rest go over the relay in the main.
  EXPECT_LT(with.seconds, relay_alone + 3 * 0.0105) << with.seconds;
  EXPECT_LT(with.seconds, 0.6 * without.seconds);
  EXPECT_GT(with.bytes_by_link[1], 6 * with.bytes_by_link[0]);
  // Probed: no chunk waits behind the foreign copy.
  EXPECT_LT(probed.seconds, relay_alone + 1e-4) << probed.seconds;
  EXPECT_EQ(probed.bytes_by_link[0], 0u);
}

// Every link held a little (each chunk that starts waits 150 us): probes find
// no better link, and the copy goes about as fast as without them.
TEST(MultipathBalance, EveryLinkHeldCostsProbesLittle) {
  auto links = equal_links(2);
  for (auto& m : links) {
    m.busy_from = 0;
    m.busy_until = 0.05;
    m.busy_wait_s = 150e-6;
  }
  const std::vector<SimTransfer> copy = {{0, 64 * kMiB}};
  const auto probed = simulate(links, copy, 8 * kMiB, MultipathPolicy{});
  const auto unprobed_ = simulate(links, copy, 8 * kMiB, unprobed());
  EXPECT_LT(probed.seconds, unprobed_.seconds + 0.5e-3) << probed.seconds << " against " << unprobed_.seconds;
}

// Once the foreign copy is gone the own link's old estimate ages out: an idle
// link tries again and carries its share.
TEST(MultipathBalance, AHeldLinkIsTriedAgainOnceItsEstimateIsOld) {
  auto links = equal_links(2);
  links[0].busy_from = 0;
  links[0].busy_until = 0.03;
  links[0].busy_wait_s = 0.01;
  const std::vector<SimTransfer> copies(120, SimTransfer{0, 256 * kMiB});
  const auto r = simulate(links, copies, 8 * kMiB, MultipathPolicy{}, 0.0, true);
  const double ideal = ideal_seconds(links, 120 * 256 * kMiB);
  EXPECT_LT(r.seconds, 1.25 * ideal) << r.seconds << " against " << ideal;
  EXPECT_GT(r.bytes_by_link[0], r.bytes_by_link[1] / 2);
}

// The tail: every link idle and measured equal, one chunk left; it is taken
// whole by one link, or, split at the tail, in 2 MiB parts by several (none
// declines for good), across link counts.
TEST(MultipathScheduler, EarliestFinishNeverLeavesAChunkBehind) {
  for (size_t tail : {size_t{0}, 2 * kMiB})
    for (int n : {2, 3, 4, 8}) {
      MultipathPolicy p = unprobed();
      p.tail_chunk = tail;
      MultipathScheduler s(n, p);
      for (int l = 0; l < n; ++l) s.observe(l, 8 * kMiB, 8 * kMiB / 55e9, 0.0);
      const int t = s.add(n - 1, split_chunks(8 * kMiB, 8 * kMiB));
      Assignment a;
      int taken = 0;
      size_t given = 0, next_offset = 0;
      for (int l = 0; l < n; ++l)
        while (s.next(l, &a, 0.001)) {
          ++taken;
          EXPECT_EQ(a.chunk.offset, next_offset) << "parts in order, none lost";
          next_offset += a.chunk.bytes;
          given += a.chunk.bytes;
        }
      EXPECT_EQ(given, 8 * kMiB) << n << " links, tail " << tail;
      if (tail == 0) EXPECT_EQ(taken, 1) << n << " links";
      if (tail > 0) EXPECT_EQ(taken, 4) << n << " links";
      for (int l = 0; l < n; ++l)
        while (s.in_flight(l)) s.complete(l, 0.002);
      EXPECT_TRUE(s.done(t)) << "every part counted";
    }
  // A slow link declines while a fast one can finish sooner, and takes the
  // chunk when it is the only link that may carry it.
  MultipathPolicy only_own = unprobed();
  only_own.may_relay = {false, false};
  MultipathScheduler alone(2, only_own);
  alone.observe(0, 8 * kMiB, 1.0, 0.0);
  alone.observe(1, 8 * kMiB, 0.001, 0.0);
  alone.add(0, split_chunks(16 * kMiB, 8 * kMiB));
  Assignment a;
  EXPECT_TRUE(alone.next(0, &a, 0.001));
  MultipathScheduler both(2, unprobed());
  both.observe(0, 8 * kMiB, 1.0, 0.0);
  both.observe(1, 8 * kMiB, 0.001, 0.0);
  both.add(0, split_chunks(32 * kMiB, 8 * kMiB));
  EXPECT_FALSE(both.next(0, &a, 0.001));
  EXPECT_TRUE(both.next(1, &a, 0.001));
  EXPECT_TRUE(both.next(1, &a, 0.001));
  EXPECT_TRUE(both.next(0, &a, 0.5)) << "an idle link with an old estimate tries again";
}

// Two links measured, two never used: the measured ones do not take every
// chunk of a short copy between them, so the other two take some and are
// measured (were they not, every later short copy would leave them out too).
TEST(MultipathScheduler, LinksNotMeasuredYetStillGetChunks) {
  MultipathScheduler s(4, unprobed());
  s.observe(0, 2 * kMiB, 2 * kMiB / 44e9, 0.0);
  s.observe(1, 2 * kMiB, 2 * kMiB / 44e9, 0.0);
  s.add(0, split_chunks(8 * kMiB, 2 * kMiB));
  Assignment a;
  std::vector<int> taken(4, 0);
  for (int l = 0; l < 4; ++l)
    while (s.next(l, &a, 0.001)) ++taken[l];
  EXPECT_EQ(taken, (std::vector<int>{1, 1, 1, 1}));
}

// A tail part given back (its relay failed) goes first again, ahead of the
// rest of its chunk: the copy's bytes are all given once, in order, and the
// copy completes.
TEST(MultipathScheduler, ATailPartGivenBackKeepsTheCopyWhole) {
  MultipathPolicy p = unprobed();
  MultipathScheduler s(3, p);
  const int t = s.add(0, split_chunks(8 * kMiB, 8 * kMiB));
  Assignment a;
  ASSERT_TRUE(s.next(1, &a, 0.0));
  EXPECT_EQ(a.chunk.bytes, 2 * kMiB) << "a tail part";
  s.give_back(1);  // link 1 could not submit it and relays no more
  std::vector<std::pair<size_t, size_t>> given;
  for (int round = 0; round < 8 && !s.done(t); ++round) {
    for (int l = 0; l < 3; ++l)
      while (s.next(l, &a, 0.0)) given.emplace_back(a.chunk.offset, a.chunk.bytes);
    for (int l = 0; l < 3; ++l)
      while (s.in_flight(l)) s.complete(l, 0.0);
  }
  EXPECT_TRUE(s.done(t));
  std::sort(given.begin(), given.end());
  size_t next = 0;
  for (auto [off, n] : given) {
    EXPECT_EQ(off, next);
    next += n;
  }
  EXPECT_EQ(next, 8 * kMiB);
}

// On the GPU a chunk that waited behind a foreign command was followed at
// once by the next one queued behind it: per chunk, one slow and one fast
// sample. The estimate counts the pair as the slow link it is; after a quiet
// spell a fresh sample replaces it.
TEST(MultipathScheduler, ABurstCountsAsTheSlowLinkItIs) {
  MultipathScheduler s(2, unprobed());
  const size_t chunk = 8 * kMiB;
  const double clean = chunk / 55e9;
  s.observe(1, chunk, clean, 0.000);
  s.observe(1, chunk, clean, 0.001);
  s.observe(0, chunk, 0.005, 0.005);
  s.observe(0, chunk, clean, 0.0052);
  EXPECT_GT(s.estimates()[0].s_per_byte(), 5 * s.estimates()[1].s_per_byte());
  s.add(0, split_chunks(64 * kMiB, chunk));
  Assignment a;
  EXPECT_FALSE(s.next(0, &a, 0.006)) << "the held link took a chunk it would land last";
  EXPECT_TRUE(s.next(1, &a, 0.006));
  s.observe(0, chunk, clean, 0.5);  // after a quiet spell: afresh
  EXPECT_NEAR(s.estimates()[0].s_per_byte(), 1 / 55e9, 1e-13);
}

// Link 1 serves its own long copy first, so it is no help to a short copy
// into GPU 0 whose own link is slow; earliest finish must not make that
// short copy wait for the long one.
TEST(MultipathBalance, AShortCopyIsNotLeftBehindALongOneOnAnotherGpu) {
  auto links = equal_links(2);
  links[0].bytes_per_s = 11e9;  // held to a fifth by something else
  const std::vector<SimTransfer> both = {{1, 10 * kGiB}, {0, 32 * kMiB}};
  MultipathPolicy blind;
  blind.earliest_finish = false;
  const auto with = simulate(links, both, 8 * kMiB, MultipathPolicy{});
  const auto without = simulate(links, both, 8 * kMiB, blind);
  EXPECT_LT(with.finish_by_transfer[1], 1.5 * without.finish_by_transfer[1])
      << with.finish_by_transfer[1] << " against " << without.finish_by_transfer[1];
  EXPECT_LT(with.finish_by_transfer[0], 1.05 * without.finish_by_transfer[0]);
}

TEST(MultipathHead, AtMostTheKnobAndTheTargetLinksShareIn64KiBSteps) {
  EXPECT_EQ(multipath_head_bytes(24 * kMiB, 3, 3 * kMiB), 3 * kMiB);
  EXPECT_EQ(multipath_head_bytes(2 * kMiB, 3, 3 * kMiB), (2 * kMiB / 3) / (64 << 10) * (64 << 10));
  EXPECT_EQ(multipath_head_bytes(24 * kMiB, 3, 0), 0u);
  EXPECT_EQ(multipath_head_bytes(100, 2, 3 * kMiB), 0u);
}

TEST(MultipathHead, TheOwnShareOnTheStreamIsTheWholeEvenShareAndTheRelaysShareTheRest) {
  // Three links (two relays), 24 MiB: the knob's head, and the rest over all three.
  MultipathSplit s = multipath_split(24 * kMiB, 2, 3 * kMiB, false, 24 * kMiB, true);
  EXPECT_EQ(s.head, 3 * kMiB);
  EXPECT_EQ(s.rest_links, 3);
  s = multipath_split(24 * kMiB, 2, 0, true, 24 * kMiB, true);
  EXPECT_EQ(s.head, 8 * kMiB);
  EXPECT_EQ(s.rest_links, 2);
  s = multipath_split(24 * kMiB, 2, 0, true, kMiB + 5, true);  // a batch whose first copy is short
  EXPECT_EQ(s.head, kMiB + 5);
  EXPECT_EQ(s.rest_links, 2);
  EXPECT_TRUE(s.own_share_on_stream);
  // The stream is another GPU's: no head, and the target's link shares the rest.
  s = multipath_split(24 * kMiB, 2, 0, true, 24 * kMiB, false);
  EXPECT_EQ(s.head, 0u);
  EXPECT_EQ(s.rest_links, 3);
  EXPECT_FALSE(s.own_share_on_stream);
  s = multipath_split(24 * kMiB, 2, 3 * kMiB, false, 24 * kMiB, false);
  EXPECT_EQ(s.head, 0u);
  EXPECT_FALSE(s.own_share_on_stream);
}

// The own share follows the links' measured speeds: none while the own
// link's probe came back late, an even share until the links are measured,
// and otherwise its speed's part, within a quarter of and twice the even share.
TEST(MultipathHead, TheOwnShareFollowsTheLinksMeasuredSpeeds) {
  const std::vector<bool> all(4, true);
  EXPECT_EQ(multipath_own_fraction({40e9, 40e9, 40e9, 40e9}, all, 0, true), 0);
  EXPECT_EQ(multipath_own_fraction({0, 40e9, 40e9, 40e9}, all, 0, false), -1);
  EXPECT_EQ(multipath_own_fraction({40e9, 0, 0, 0}, all, 0, false), -1);
  EXPECT_EQ(multipath_own_fraction({40e9, 0, 0, 0}, {true, false, false, false}, 0, false), -1);  // no relay
  EXPECT_DOUBLE_EQ(multipath_own_fraction({40e9, 40e9, 40e9, 40e9}, all, 0, false), 0.25);
  // A relay not measured yet counts as the others' mean.
  EXPECT_DOUBLE_EQ(multipath_own_fraction({40e9, 40e9, 0, 40e9}, all, 0, false), 0.25);
  // A link that may not relay does not count.
  EXPECT_DOUBLE_EQ(multipath_own_fraction({40e9, 40e9, 40e9, 40e9}, {true, true, false, true}, 0, false), 1.0 / 3);
  EXPECT_NEAR(multipath_own_fraction({60e9, 40e9, 40e9, 40e9}, all, 0, false), 60.0 / 180, 1e-12);
  // A foreign copy on the own link: its part shrinks, down to a quarter of the even share.
  EXPECT_NEAR(multipath_own_fraction({12e9, 40e9, 40e9, 40e9}, all, 0, false), 12.0 / 132, 1e-12);
  EXPECT_DOUBLE_EQ(multipath_own_fraction({1e9, 40e9, 40e9, 40e9}, all, 0, false), 0.25 / 4);
  EXPECT_DOUBLE_EQ(multipath_own_fraction({400e9, 40e9, 40e9, 40e9}, all, 0, false), 0.5);
  EXPECT_EQ(multipath_own_fraction({std::numeric_limits<double>::infinity(), 40e9, 40e9, 40e9}, all, 0, false), -1);
  EXPECT_EQ(multipath_own_fraction({40e9, std::nan(""), 0, 0}, all, 0, false), -1);
  EXPECT_THROW(multipath_own_fraction({1, 1}, all, 0, false), ferry::Error);
  EXPECT_THROW(multipath_own_fraction({1, 1}, {true, true}, 2, false), ferry::Error);
  // In the split: the fraction sizes the head (in whole steps); none leaves the relays all of it.
  MultipathSplit s = multipath_split(64 * kMiB, 3, 0, true, 64 * kMiB, true, 0.125);
  EXPECT_EQ(s.head, 8 * kMiB);
  EXPECT_EQ(s.rest_links, 3);
  s = multipath_split(64 * kMiB, 3, 0, true, 64 * kMiB, true, 0);
  EXPECT_EQ(s.head, 0u);
  EXPECT_EQ(s.rest_links, 3);
  EXPECT_TRUE(s.own_share_on_stream);
  s = multipath_split(64 * kMiB, 3, 0, true, 64 * kMiB, true, -1);
  EXPECT_EQ(s.head, 16 * kMiB);
  s = multipath_split(64 * kMiB, 3, 2 * kMiB, false, 64 * kMiB, true, 0.5);  // the fraction is the own share's only
  EXPECT_EQ(s.head, 2 * kMiB);
}

// While its GPU's copy has the own share on the stream, the own link probes
// (what it finds sizes the next copy's share) once that share landed (a
// probe queued behind it would time only it), but takes no chunk.
TEST(MultipathProbe, AnOwnLinkProbesWhileItsShareIsOnTheStream) {
  MultipathPolicy p;
  p.own_share_on_stream = true;
  MultipathScheduler s(2, p);
  const int t = s.add(0, split_chunks(4 * kMiB, kMiB), 0, std::nullopt, true);
  EXPECT_EQ(s.start_probe(0, 0.0), -1) << "the own link probed behind its copy's share";
  s.head_landed(t);
  EXPECT_EQ(s.start_probe(0, 0.0), 0);
  s.probe_landed(0, 0, 1e-3, 5e-3);  // late: copies were queued there
  EXPECT_TRUE(s.late(0, 0));
  Assignment a;
  EXPECT_FALSE(s.next(0, &a, 1e-3));
  EXPECT_EQ(s.start_probe(0, 2e-3), 0);  // and again while the copy waits
  s.probe_landed(0, 0, 3e-3, 10e-6);
  EXPECT_FALSE(s.late(0, 0));
  EXPECT_FALSE(s.next(0, &a, 3e-3)) << "the own link took a chunk of a copy whose share is on the stream";
}

// What sizes the next own share: a speed only while fresh, and a lane late
// after a late probe or while a probe is out longer than a prompt one takes.
TEST(MultipathProbe, TheShareIsSizedByFreshSpeedsAndLateProbes) {
  MultipathPolicy p;
  p.own_share_on_stream = true;
  MultipathScheduler s(2, p);
  EXPECT_EQ(s.share_rate(0, 0.0), 0) << "an unmeasured link has a speed";
  s.observe(0, 4 * kMiB, 1e-4, 1.0);
  EXPECT_NEAR(s.share_rate(0, 1.5), 4.0 * kMiB / 1e-4, 1);
  EXPECT_EQ(s.share_rate(0, 1.0 + MultipathScheduler::kShareRateFreshS + 0.01), 0) << "a stale speed counts";
  s.add(0, split_chunks(4 * kMiB, kMiB), 0);
  ASSERT_EQ(s.start_probe(0, 2.0), 0);
  EXPECT_FALSE(s.share_late(0, 0, 2.0 + MultipathScheduler::kPromptS / 2));
  EXPECT_TRUE(s.share_late(0, 0, 2.0 + 2 * MultipathScheduler::kPromptS)) << "a probe out too long is not late";
  EXPECT_FALSE(s.share_late(0, 1, 2.0 + 2 * MultipathScheduler::kPromptS)) << "the other lane was judged too";
  s.probe_landed(0, 0, 2.01, 5e-3);
  EXPECT_TRUE(s.share_late(0, 0, 2.01));
  ASSERT_EQ(s.start_probe(0, 2.02), 0);
  s.probe_landed(0, 0, 2.03, 10e-6);
  EXPECT_FALSE(s.share_late(0, 0, 2.03));
}

// A link idle in a lane takes chunks there only after a probe landed
// promptly; the other lane is judged on its own.
TEST(MultipathProbe, ALaneIsClearOnlyAfterAPromptProbe) {
  MultipathScheduler s(2, MultipathPolicy{});
  const int in = s.add(0, split_chunks(4 * kMiB, kMiB), 0);
  Assignment a;
  EXPECT_FALSE(s.next(0, &a, 0.0)) << "an unprobed lane took a chunk";
  EXPECT_EQ(s.start_probe(0, 0.0), 0);
  EXPECT_EQ(s.start_probe(0, 0.0), -1) << "a second probe while one is out";
  EXPECT_TRUE(s.probing(0, 0));
  s.probe_landed(0, 0, 20e-6, 20e-6);
  ASSERT_TRUE(s.next(0, &a, 20e-6));
  EXPECT_EQ(a.transfer, in);
  EXPECT_EQ(s.start_probe(0, 20e-6), -1) << "a clear lane probed";
  // Link 1 relays only once its own probe landed.
  EXPECT_FALSE(s.next(1, &a, 20e-6));
  EXPECT_EQ(s.start_probe(1, 20e-6), 0);
  s.probe_landed(1, 0, 40e-6, 20e-6);
  EXPECT_TRUE(s.next(1, &a, 40e-6));
  EXPECT_TRUE(a.relay());
  // Copies out of GPU 1: lane 1, not probed on either link yet.
  MultipathScheduler out(2, MultipathPolicy{});
  out.add(1, split_chunks(2 * kMiB, kMiB), 0);
  out.add(1, split_chunks(2 * kMiB, kMiB), 1);
  EXPECT_EQ(out.start_probe(1, 0.0), 0);
  out.probe_landed(1, 0, 10e-6, 10e-6);
  EXPECT_TRUE(out.next(1, &a, 10e-6));
  EXPECT_TRUE(out.next(1, &a, 10e-6));
  out.complete(1, 30e-6);
  out.complete(1, 50e-6);
  EXPECT_FALSE(out.next(1, &a, 60e-6)) << "lane 1 took a chunk on lane 0's probe";
  EXPECT_EQ(out.start_probe(1, 60e-6), 1);
}

// A small copy onto a clear own link while the relays' lanes lapsed: the
// relays probe first, and the own link does not take the chunks they would
// land sooner meanwhile (on four H200s an 8 MB copy went over the own link
// and one relay, copy after copy, the other relays never clear again). A
// probe that is late, or out too long, stops counting.
TEST(MultipathProbe, AClearOwnLinkLeavesChunksToRelaysWhoseProbesAreOut) {
  for (int outcome = 0; outcome < 3; ++outcome) {  // probes prompt, late, not landed
    const MultipathPolicy p;
    MultipathScheduler s(4, p);
    for (int l = 0; l < 4; ++l) s.observe(l, 2 * kMiB, 2 * kMiB / (l ? 38e9 : 50e9), 0.009);
    // The own link carried the last copy alone and is clear; the relays' lanes lapsed.
    s.add(0, split_chunks(2 * kMiB, 2 * kMiB));
    ASSERT_EQ(s.start_probe(0, 0.0090), 0);
    s.probe_landed(0, 0, 0.00901, 10e-6);
    Assignment a;
    ASSERT_TRUE(s.next(0, &a, 0.00901));
    s.complete(0, 0.0100);
    const double t = 0.0105;
    s.add(0, split_chunks(8 * kMiB, 2 * kMiB));
    EXPECT_EQ(s.start_probe(0, t), -1) << "a clear lane probed";
    for (int l = 1; l < 4; ++l) EXPECT_EQ(s.start_probe(l, t), 0) << l;
    std::vector<int> taken(4, 0);
    for (int l = 0; l < 4; ++l)
      while (s.next(l, &a, t)) ++taken[l];
    EXPECT_EQ(taken, (std::vector<int>{1, 0, 0, 0})) << "while the relays' probes are out";
    if (outcome == 0) {
      for (int l = 1; l < 4; ++l) s.probe_landed(l, 0, t + 15e-6, 12e-6);
      for (int l = 0; l < 4; ++l)
        while (s.next(l, &a, t + 15e-6)) ++taken[l];
      EXPECT_EQ(taken, (std::vector<int>{1, 1, 1, 1})) << "once the probes came back prompt";
    } else if (outcome == 1) {
      for (int l = 1; l < 4; ++l) s.probe_landed(l, 0, t + 15e-6, 2e-3);
      while (s.next(0, &a, t + 15e-6)) ++taken[0];
      EXPECT_EQ(taken[0], p.outstanding) << "the relays came back late: the own link fills its queue";
    } else {
      while (s.next(0, &a, t + 60e-6)) ++taken[0];
      EXPECT_EQ(taken[0], p.outstanding) << "the relays' probes out past the wait: the own link fills its queue";
    }
  }
}

// A late probe waited behind foreign copies: while another link can take the
// copy, the lane stays out and probes again until one is prompt. A clear lane
// lapses kClearS after its last landing.
TEST(MultipathProbe, ALateProbeKeepsTheLaneOutAndAClearLaneLapses) {
  MultipathScheduler s = one_copy(2, 8 * kMiB);
  Assignment a;
  ASSERT_EQ(s.start_probe(0, 0.0), 0);
  ASSERT_EQ(s.start_probe(1, 0.0049), 0);
  s.probe_landed(1, 0, 0.00491, 10e-6);  // link 1: clear
  s.probe_landed(0, 0, 0.005, 0.005);
  EXPECT_TRUE(s.held(0, 0));
  EXPECT_FALSE(s.next(0, &a, 0.005));
  ASSERT_EQ(s.start_probe(0, 0.005), 0);
  s.probe_landed(0, 0, 0.005 + 30e-6, 30e-6);
  EXPECT_FALSE(s.held(0, 0));
  ASSERT_TRUE(s.next(0, &a, 0.00503));
  ASSERT_TRUE(s.next(0, &a, 0.00503));
  s.complete(0, 0.0051);
  EXPECT_TRUE(s.next(0, &a, 0.0052)) << "in flight: clear";
  s.complete(0, 0.0053);
  s.complete(0, 0.0054);
  EXPECT_TRUE(s.next(0, &a, 0.0054 + MultipathScheduler::kClearS / 2));
  s.complete(0, 0.0060);
  EXPECT_FALSE(s.next(0, &a, 0.0060 + 2 * MultipathScheduler::kClearS)) << "idle past kClearS: unprobed";
  EXPECT_EQ(s.start_probe(0, 0.0080), 0);
  EXPECT_THROW(s.probe_landed(0, 1, 0.009, 1e-3), ferry::Error);
}

// Where every link that may take a copy came back late, waiting behind the
// copies queued there is all there is: the copy goes (not never). While
// another link's probe is out, a late link waits for it.
TEST(MultipathProbe, WhenEveryLinkIsHeldTheCopyStillGoes) {
  Assignment a;
  // (A link alone takes up to kMultipathAloneChunk at once: enough for three.)
  MultipathScheduler alone = one_copy(1, 3 * kMultipathAloneChunk);
  ASSERT_EQ(alone.start_probe(0, 0.0), 0);
  alone.probe_landed(0, 0, 0.01, 0.01);
  EXPECT_TRUE(alone.next(0, &a, 0.01)) << "the only link did not take the copy";
  EXPECT_TRUE(alone.held(0, 0));
  EXPECT_EQ(alone.start_probe(0, 0.01), 0) << "a held link carrying the copy stopped probing";
  EXPECT_TRUE(alone.next(0, &a, 0.01)) << "the copy stopped while the link's next probe is out";
  alone.probe_landed(0, 0, 0.0101, 20e-6);  // prompt: the queue there is gone
  EXPECT_FALSE(alone.held(0, 0));

  MultipathScheduler two = one_copy(2, 4 * kMiB);
  ASSERT_EQ(two.start_probe(0, 0.0), 0);
  ASSERT_EQ(two.start_probe(1, 0.0), 0);
  two.probe_landed(0, 0, 150e-6, 150e-6);
  EXPECT_FALSE(two.next(0, &a, 150e-6)) << "took a chunk while link 1's probe might yet be prompt";
  EXPECT_EQ(two.start_probe(0, 150e-6), -1) << "probed again while link 1's probe might yet be prompt";
  two.probe_landed(1, 0, 0.02, 0.02);
  EXPECT_TRUE(two.next(0, &a, 0.02));
  EXPECT_TRUE(two.next(1, &a, 0.02)) << "a held link taking the copy shut out the other held one";

  // At a new copy, a link known to be held waits while another has not been
  // probed yet (its turn comes in the same round), rather than going first.
  MultipathScheduler fresh = one_copy(2, kMiB);
  ASSERT_EQ(fresh.start_probe(0, 0.0), 0);
  fresh.probe_landed(0, 0, 0.01, 0.01);
  EXPECT_FALSE(fresh.next(0, &a, 0.01)) << "a held link went first while link 1 was unprobed";
  EXPECT_EQ(fresh.start_probe(1, 0.01), 0);

  // The engine could not send a probe: the lane is free to be probed again.
  MultipathScheduler failed = one_copy(1, kMiB);
  ASSERT_EQ(failed.start_probe(0, 0.0), 0);
  failed.probe_failed(0, 0);
  EXPECT_FALSE(failed.probing(0, 0));
  EXPECT_EQ(failed.start_probe(0, 0.0), 0);
}

// One queue per target and direction: copies into a GPU held behind a late
// lane do not hold copies out of it.
TEST(MultipathProbe, AHeldDirectionDoesNotHoldTheOther) {
  MultipathScheduler s = one_copy(2, 4 * kMiB);  // into GPU 0, first
  const int out = s.add(0, split_chunks(2 * kMiB, kMiB), 1);
  EXPECT_EQ(s.start_probe(0, 0.0), 0);
  EXPECT_EQ(s.start_probe(0, 0.0), 1);
  s.probe_landed(0, 1, 20e-6, 20e-6);  // lane 1 clear; lane 0's probe still out
  Assignment a;
  ASSERT_TRUE(s.next(0, &a, 20e-6));
  EXPECT_EQ(a.transfer, out);
}

// Promptness is the probe's own time on the link, not when the host saw it
// land: a busy host that looks late does not keep a clear link out.
TEST(MultipathProbe, APromptProbeSeenLateStillClearsTheLane) {
  MultipathScheduler s = one_copy(1, 2 * kMiB);
  Assignment a;
  ASSERT_EQ(s.start_probe(0, 0.0), 0);
  s.probe_landed(0, 0, 0.004, 15e-6);  // seen 4 ms later; 15 us on the GPU
  EXPECT_TRUE(s.next(0, &a, 0.004));
}

// A held link taken as a last resort stops once another link proves clear.
TEST(MultipathProbe, AHeldLinkStopsOnceAnotherProvesClear) {
  MultipathScheduler s = one_copy(2, 8 * kMiB);
  Assignment a;
  ASSERT_EQ(s.start_probe(0, 0.0), 0);
  ASSERT_EQ(s.start_probe(1, 0.0), 0);
  s.probe_landed(0, 0, 150e-6, 150e-6);
  ASSERT_TRUE(s.next(0, &a, 250e-6)) << "link 1's probe, out 250 us, will be late: link 0 goes";
  s.probe_landed(1, 0, 300e-6, 20e-6);  // prompt on the GPU
  EXPECT_FALSE(s.next(0, &a, 300e-6)) << "the held link went on beside a clear one";
  EXPECT_TRUE(s.next(1, &a, 300e-6));
}

// Link 1 serves its own long copy first; link 0 is held for good. A short
// copy into GPU 0 goes over link 0, behind what is queued there, rather than
// waiting for GPU 1's copy to end.
TEST(MultipathBalance, AHeldOwnLinkStillCarriesWhatNoOtherLinkWill) {
  auto links = equal_links(2);
  links[0].busy_from = 0;
  links[0].busy_until = 100;
  links[0].busy_wait_s = 500e-6;
  const std::vector<SimTransfer> both = {{1, 10 * kGiB}, {0, 32 * kMiB}};
  const auto r = simulate(links, both, 8 * kMiB, MultipathPolicy{});
  EXPECT_LT(r.finish_by_transfer[1], 0.01) << "the short copy waited for the long one";
}

// Both links held for 10 ms, then link 1 is free and link 0 stays held: once
// link 1's probe is prompt, link 0 (a last resort until then) stops.
TEST(MultipathBalance, ProbingResumesAfterEveryLinkWasHeld) {
  auto links = equal_links(2);
  for (auto& m : links) {
    m.busy_from = 0;
    m.busy_wait_s = 300e-6;
  }
  links[0].busy_until = 100;
  links[1].busy_until = 0.01;
  const std::vector<SimTransfer> copies(40, SimTransfer{0, 32 * kMiB});
  const auto r = simulate(links, copies, 8 * kMiB, MultipathPolicy{}, 0.0, true);
  const double relay_alone = 40.0 * 32 * kMiB / 55e9;
  EXPECT_LT(r.seconds, relay_alone + 0.008) << r.seconds << " against " << relay_alone;
  // What link 0 can carry in the 10 ms both were held (a chunk per 450 us), and no more.
  EXPECT_LE(r.bytes_by_link[0], 200 * kMiB) << r.bytes_by_link[0] / kMiB << " MiB on the held link";
}

// A copy queued on a stream that has not got to it yet: the links that would
// carry it probe its direction while the stream gets there, so that it finds
// them clear when it starts (on four H200s, probing only then put a copy's
// first chunks 50-170 us after its start). The expectation lapses; a link
// that may not relay does not probe for another GPU's copy; the own link's
// probe failing is an error of that copy, a relay's only stops it relaying.
TEST(MultipathProbe, ACopyOnItsWayHasItsLinksProbedBeforeItStarts) {
  MultipathScheduler s(3, MultipathPolicy{});
  EXPECT_EQ(s.start_probe(0, 0.0), -1) << "probed with no copy";
  s.expect(0, 1, 0.0);  // out of GPU 0
  for (int l = 0; l < 3; ++l) EXPECT_EQ(s.start_probe(l, 0.0), 1) << "link " << l;
  EXPECT_EQ(s.start_probe(0, 0.0), -1) << "a second probe, or one in the other direction";
  for (int l = 0; l < 3; ++l) s.probe_landed(l, 1, 30e-6, 10e-6);
  s.add(0, split_chunks(6 * kMiB, 2 * kMiB), 1);
  Assignment a;
  for (int l = 0; l < 3; ++l) {
    EXPECT_EQ(s.start_probe(l, 50e-6), -1) << "link " << l << " probed again at the start";
    EXPECT_TRUE(s.next(l, &a, 50e-6)) << "link " << l << " took no chunk at the start";
  }

  MultipathScheduler lapsed(2, MultipathPolicy{});
  lapsed.expect(1, 0, 0.0);
  EXPECT_EQ(lapsed.start_probe(0, 2 * MultipathScheduler::kClearS), -1);
  EXPECT_EQ(lapsed.start_probe(1, 2 * MultipathScheduler::kClearS), -1);

  MultipathPolicy own_only;
  own_only.may_relay = {true, false};
  MultipathScheduler u(2, own_only);
  u.expect(0, 0, 0.0);
  EXPECT_EQ(u.start_probe(1, 0.0), -1) << "a link that may not relay probed for another GPU";
  EXPECT_EQ(u.start_probe(0, 0.0), 0);

  // With the own share on the caller's stream, the own link does not probe
  // behind that share, for its own copy or, while such a share is pending,
  // for another GPU's; once the share landed it probes, and a failing probe
  // there is an error of its copy (it had looped, the link asked again).
  MultipathPolicy share;
  share.own_share_on_stream = true;
  MultipathScheduler o(2, share);
  o.expect(0, 0, 0.0);
  EXPECT_EQ(o.start_probe(0, 0.0), -1) << "the own link probed for a copy whose share is on the stream";
  EXPECT_EQ(o.start_probe(1, 0.0), 0);
  MultipathScheduler h(2, share);
  const int mine = h.add(1, split_chunks(4 * kMiB, kMiB), 0, true, true);
  h.expect(0, 0, 0.0);
  EXPECT_EQ(h.start_probe(1, 0.0), -1) << "link 1 probed behind its own GPU's share on the stream";
  h.head_landed(mine);
  ASSERT_EQ(h.start_probe(1, 0.0), 0);
  EXPECT_TRUE(h.probe_failed(1, 0)) << "a failed probe of a GPU whose copy waits was not that copy's error";

  MultipathScheduler f(2, MultipathPolicy{});
  f.expect(0, 0, 0.0);
  ASSERT_EQ(f.start_probe(1, 0.0), 0);
  EXPECT_FALSE(f.probe_failed(1, 0)) << "a relay's failed probe failed the copy";
  EXPECT_EQ(f.start_probe(1, 0.0), -1) << "a relay probed again after it failed";
  ASSERT_EQ(f.start_probe(0, 0.0), 0);
  EXPECT_TRUE(f.probe_failed(0, 0)) << "the own link's failed probe was not the copy's error";
}

// A lane kept warm probes before kClearS lapses while idle, so that a copy
// after a gap finds its link clear at once; without it, the same copy waits
// for a probe. A late probe there holds the lane at once, and the probes
// stop keep_warm_s after the lane last carried.
TEST(MultipathProbe, ALaneKeptWarmIsClearForACopyAfterAGap) {
  constexpr double kWarm = 5e-3;
  auto carried_once = [](double keep_warm_s, int links = 1) {
    MultipathPolicy p;
    p.keep_warm_s = keep_warm_s;
    auto s = std::make_unique<MultipathScheduler>(links, p);
    s->add(0, split_chunks(2 * kMiB, 2 * kMiB), 0);
    EXPECT_EQ(s->start_probe(0, 0.0), 0);
    s->probe_landed(0, 0, 10e-6, 5e-6);
    Assignment a;
    EXPECT_TRUE(s->next(0, &a, 20e-6));
    s->complete(0, 100e-6);
    return s;
  };
  const double gap = 100e-6 + 2 * MultipathScheduler::kClearS;  // the next copy's start
  {
    auto s = carried_once(kWarm);
    EXPECT_NEAR(s->warm_due(), 100e-6 + MultipathScheduler::kRenewS, 1e-9);
    EXPECT_EQ(s->start_probe(0, 500e-6), -1) << "probed before it was due";
    int probes = 0;
    for (double at = s->warm_due(); at < gap; at = s->warm_due(), ++probes) {
      ASSERT_EQ(s->start_probe(0, at), 0) << "no probe at " << at;
      EXPECT_EQ(s->start_probe(0, at), -1) << "a second probe while one is out";
      s->probe_landed(0, 0, at + 20e-6, 5e-6);
    }
    EXPECT_GE(probes, 2);
    s->add(0, split_chunks(2 * kMiB, 2 * kMiB), 0);
    EXPECT_EQ(s->start_probe(0, gap), -1) << "the copy after the gap waited for a probe";
    Assignment a;
    EXPECT_TRUE(s->next(0, &a, gap)) << "the copy after the gap found its link held";
    EXPECT_EQ(s->start_probe(0, gap + 2 * MultipathScheduler::kRenewS), -1) << "probed behind its own chunk";
  }
  {
    auto s = carried_once(0);
    EXPECT_EQ(s->start_probe(0, 100e-6 + MultipathScheduler::kRenewS), -1) << "kept warm with keep_warm_s 0";
    EXPECT_EQ(s->warm_due(), std::numeric_limits<double>::infinity());
    s->add(0, split_chunks(2 * kMiB, 2 * kMiB), 0);
    Assignment a;
    EXPECT_FALSE(s->next(0, &a, gap)) << "a lapsed lane took a chunk without a probe";
  }
  {
    // Link 1, not yet probed, may do better than link 0 held.
    auto s = carried_once(kWarm, 2);
    const double at = 100e-6 + MultipathScheduler::kRenewS;
    ASSERT_EQ(s->start_probe(0, at), 0);
    s->probe_landed(0, 0, at + 160e-6, 150e-6);  // foreign copies were queued there
    EXPECT_TRUE(s->late(0, 0));
    s->add(0, split_chunks(2 * kMiB, 2 * kMiB), 0);
    Assignment a;
    // Within kClearS of its last chunk's landing, but held.
    ASSERT_LT(at + 170e-6, 100e-6 + MultipathScheduler::kClearS);
    EXPECT_FALSE(s->next(0, &a, at + 170e-6)) << "a lane whose warm probe came back late took a chunk";
  }
  {
    auto s = carried_once(kWarm);
    double last = 0;
    for (double at = s->warm_due(); std::isfinite(at); at = s->warm_due()) {
      ASSERT_EQ(s->start_probe(0, at), 0) << "no probe at " << at;
      s->probe_landed(0, 0, at + 20e-6, 5e-6);
      last = at;
    }
    EXPECT_GT(last, 100e-6 + kWarm - 2 * MultipathScheduler::kRenewS) << "the probes stopped early";
    EXPECT_LE(last, 100e-6 + kWarm) << "the probes went on past keep_warm_s";
    EXPECT_EQ(s->start_probe(0, 100e-6 + kWarm + MultipathScheduler::kRenewS), -1) << "probed past keep_warm_s";
  }
  {
    // A thread that comes late, past keep_warm_s, for a probe that was due
    // within it sends that probe, and then none: a due time left in the past
    // would have the engine's thread look again at once, for good.
    auto s = carried_once(kWarm);
    double due = s->warm_due();
    while (s->warm_due() < 100e-6 + kWarm - MultipathScheduler::kRenewS) {
      ASSERT_EQ(s->start_probe(0, due), 0);
      s->probe_landed(0, 0, due + 20e-6, 5e-6);
      due = s->warm_due();
    }
    ASSERT_LE(due, 100e-6 + kWarm);
    const double late = 100e-6 + kWarm + 1e-3;
    EXPECT_EQ(s->start_probe(0, late), 0) << "the probe due within keep_warm_s was not sent";
    s->probe_landed(0, 0, late + 20e-6, 5e-6);
    EXPECT_EQ(s->warm_due(), std::numeric_limits<double>::infinity());
  }
  {
    // Not behind its own GPU's share on a caller's stream, which it would time.
    auto s = carried_once(kWarm, 2);
    const double at = 100e-6 + MultipathScheduler::kRenewS;
    const int t = s->add(0, split_chunks(2 * kMiB, 2 * kMiB), 0, true, true);
    ASSERT_EQ(s->start_probe(1, at), 0);
    s->probe_landed(1, 0, at + 10e-6, 5e-6);
    Assignment a;
    ASSERT_TRUE(s->next(1, &a, at + 20e-6));
    EXPECT_EQ(s->start_probe(0, at + 30e-6), -1) << "probed behind its own GPU's share on the stream";
    s->head_landed(t);
    EXPECT_EQ(s->start_probe(0, at + 40e-6), 0) << "not kept warm once that share landed";
  }
}

// The engine's thread's waits: no lane kept warm (infinity) gives the full
// wait, an overdue one none (idle) or the shortest (pending), and fractions
// of a microsecond round up.
TEST(MultipathWait, TheThreadWaitsNoLongerThanALaneKeptWarmHasLeft) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(multipath_pending_wait_us(true, kInf), 5);
  EXPECT_EQ(multipath_pending_wait_us(true, 1e-3), 5);
  EXPECT_EQ(multipath_pending_wait_us(false, kInf), 200);
  EXPECT_EQ(multipath_pending_wait_us(false, 1e-3), 200);
  EXPECT_EQ(multipath_pending_wait_us(false, 50.2e-6), 51);
  EXPECT_EQ(multipath_pending_wait_us(false, -1e-3), 5);
  EXPECT_EQ(multipath_idle_wait_us(100000, kInf), 100000);
  EXPECT_EQ(multipath_idle_wait_us(1000, 0.5), 1000);
  EXPECT_EQ(multipath_idle_wait_us(100000, 650.4e-6), 651);
  EXPECT_EQ(multipath_idle_wait_us(100000, -2e-3), 0);
}

// One slow chunk (a first copy's cost: on four H200s an own link's first
// 2 MiB out of its GPU landed 2.7 ms after it went out, 46 us of it on the
// GPU) kept that link out of the copies after it until its estimate aged
// out. A prompt probe says nothing is queued there: an estimate far slower
// than the other links' then counts as aged out, one a few times slower not.
TEST(MultipathProbe, APromptProbeForgetsAnEstimateFarSlowerThanTheOthers) {
  for (const double slow_s : {2.7e-3, 120e-6}) {
    MultipathScheduler s(2, MultipathPolicy{});
    s.add(0, split_chunks(4 * kMiB, 2 * kMiB), 0);
    Assignment a;
    for (int l = 0; l < 2; ++l) {
      ASSERT_EQ(s.start_probe(l, 0.0), 0);
      s.probe_landed(l, 0, 10e-6, 10e-6);
      ASSERT_TRUE(s.next(l, &a, 10e-6));
    }
    s.observe(1, 2 * kMiB, 40e-6, 50e-6);
    s.complete(1, 50e-6);
    s.observe(0, 2 * kMiB, slow_s, 10e-6 + slow_s);
    s.complete(0, 10e-6 + slow_s);
    const double t = 7e-3;  // the next copy: lanes lapsed, estimates fresh
    s.add(0, split_chunks(4 * kMiB, 2 * kMiB), 0);
    for (int l = 0; l < 2; ++l) {
      ASSERT_EQ(s.start_probe(l, t), 0);
      s.probe_landed(l, 0, t + 20e-6, 10e-6);
    }
    if (slow_s > 1e-3)
      EXPECT_TRUE(s.next(0, &a, t + 20e-6)) << "a link 67 times slower than the other, probed clear, kept out";
    else
      EXPECT_FALSE(s.next(0, &a, t + 20e-6)) << "a link 3 times slower than the other lost its estimate";
  }
}
