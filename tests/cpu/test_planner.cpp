// Every collective's planner (coll/planner.hpp), end to end without a GPU:
// every rank's program runs on byte arrays standing for its buffers, step by
// step in lockstep (an exchange's pushes, then its own-block copies, then its
// read-backs; a reduction; an unpack), and every byte of every output is
// compared with a reference computed from the inputs. Within an exchange no
// byte may be written twice or written while it is read, and a reduction
// that runs beside the next exchange may share no byte with it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "coll/planner.hpp"

using namespace ferry;

namespace {

using Bytes = std::vector<unsigned char>;

struct Range {
  uintptr_t begin, end;
};
bool overlap(const Range& a, const Range& b) { return a.begin < b.end && b.begin < a.end; }
Range range(const void* p, size_t n) { return {reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(p) + n}; }

// Byte arrays at fake, far-apart addresses: buffer `kind` of rank p at kind << 44 | p << 36.
struct Memory {
  std::map<uintptr_t, Bytes> arrays;
  char* make(int kind, int rank, size_t bytes, unsigned char fill) {
    const uintptr_t base = uintptr_t(kind) << 44 | uintptr_t(rank) << 36;
    arrays[base].assign(bytes, fill);
    return reinterpret_cast<char*>(base);
  }
  Bytes& of(const void* base) { return arrays.at(reinterpret_cast<uintptr_t>(base)); }
  unsigned char* at(const void* p, size_t n) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = arrays.upper_bound(a);
    EXPECT_NE(it, arrays.begin()) << "address outside every buffer";
    --it;
    EXPECT_LE(a + n, it->first + it->second.size()) << "a copy runs past the end of its buffer";
    return it->second.data() + (a - it->first);
  }
};

template <typename T>
T combine(T a, T b, RedOp op) {
  return op == RedOp::kSum ? a + b : op == RedOp::kMax ? (a > b ? a : b) : (a < b ? a : b);
}

template <typename T>
void reduce_into(Memory& m, const ReduceStep& r) {
  const size_t n = r.count * sizeof(T);
  if (!n) return;
  std::vector<T> acc(r.count);
  std::memcpy(acc.data(), m.at(r.own, n), n);
  for (int p = 0; p < r.world; ++p) {
    if (p == r.rank) continue;
    std::vector<T> slot(r.count);
    std::memcpy(slot.data(), m.at(r.scratch + p * r.slot_stride, n), n);
    for (size_t i = 0; i < r.count; ++i) acc[i] = combine(acc[i], slot[i], r.op);
  }
  std::memcpy(m.at(r.out, n), acc.data(), n);
}

std::vector<Range> reduce_ranges(const ReduceStep& r) {
  const size_t n = r.count * dtype_bytes(r.dtype);
  std::vector<Range> out{range(r.out, n), range(r.own, n)};
  for (int p = 0; p < r.world; ++p) out.push_back(range(r.scratch + p * r.slot_stride, n));
  return out;
}

// Runs every rank's program in lockstep; failures name `what`.
void run_programs(Memory& m, const std::vector<Program>& programs, const std::string& what) {
  const size_t steps = programs[0].steps.size();
  for (const auto& p : programs) ASSERT_EQ(p.steps.size(), steps) << what << ": ranks plan different step counts";
  std::vector<Range> beside;  // what a reduction running beside the next exchange touches
  for (size_t k = 0; k < steps; ++k) {
    const Step::Kind kind = programs[0].steps[k].kind;
    for (const auto& p : programs) ASSERT_EQ(p.steps[k].kind, kind) << what << ": step " << k;
    if (kind == Step::Kind::kExchange) {
      // Reads first, then writes: copies of one exchange run concurrently.
      std::vector<Range> reads, writes;
      std::vector<std::pair<void*, Bytes>> landed;
      for (const auto& p : programs) {
        const Exchange& x = p.steps[k].exchange;
        std::vector<Copy> copies;
        for (const auto& pc : x.pushes) copies.push_back(pc.copy);
        if (x.local.bytes) copies.push_back(x.local);
        for (const Copy& c : copies) {
          if (!c.bytes) continue;
          reads.push_back(range(c.src, c.bytes));
          writes.push_back(range(c.dst, c.bytes));
          const unsigned char* src = m.at(c.src, c.bytes);
          landed.emplace_back(c.dst, Bytes(src, src + c.bytes));
        }
      }
      for (size_t i = 0; i < writes.size(); ++i) {
        for (size_t j = 0; j < i; ++j) ASSERT_FALSE(overlap(writes[i], writes[j])) << what << ": step " << k;
        for (const Range& r : reads)
          ASSERT_FALSE(overlap(writes[i], r)) << what << ": step " << k << " reads a byte it writes";
        for (const Range& r : beside)
          ASSERT_FALSE(overlap(writes[i], r)) << what << ": step " << k << " writes what the reduction beside it uses";
      }
      for (auto& [dst, bytes] : landed) std::memcpy(m.at(dst, bytes.size()), bytes.data(), bytes.size());
      for (const auto& p : programs) {
        const Copy& c = p.steps[k].exchange.local_pull.copy;
        if (p.steps[k].exchange.local_pull.peer >= 0 && c.bytes)
          std::memmove(m.at(c.dst, c.bytes), m.at(c.src, c.bytes), c.bytes);
      }
      beside.clear();
    } else if (kind == Step::Kind::kReduce) {
      for (const auto& p : programs) {
        const ReduceStep& r = p.steps[k].reduce;
        switch (r.dtype) {
          case DType::kInt32:
            reduce_into<int32_t>(m, r);
            break;
          case DType::kFloat32:
            reduce_into<float>(m, r);
            break;
          default:
            FAIL() << what << ": the test reduces int32 and float32 only";
        }
        if (p.steps[k].beside_next)
          for (const Range& x : reduce_ranges(r)) beside.push_back(x);
      }
    } else if (kind == Step::Kind::kUnpack) {
      for (const auto& p : programs)
        for (const Copy& c : p.steps[k].unpack)
          if (c.bytes) std::memmove(m.at(c.dst, c.bytes), m.at(c.src, c.bytes), c.bytes);
      beside.clear();
    } else {
      FAIL() << what << ": a planner returned an SM-path step";
    }
  }
}

Bytes random_bytes(std::mt19937& rng, size_t n) {
  Bytes b(n);
  for (auto& x : b) x = static_cast<unsigned char>(rng());
  return b;
}

// Where a rank's in and out sit: apart, or one inside the other at a per-rank
// offset (the collectives' in-place forms).
enum class Layout { kApart, kInInsideOut, kOutInsideIn };

// Rank r's buffers as a planner sees them.
PlanBuffers buffers_of(int r, int world, const std::vector<char*>& outs, const std::vector<char*>& ins,
                       const std::vector<char*>& scratch, bool writes_out) {
  PlanBuffers b;
  b.rank = r;
  b.world = world;
  b.out = outs[r];
  b.in = ins[r];
  if (writes_out) b.out_by_rank = outs;
  b.scratch_by_rank = scratch;
  return b;
}

// One call on every rank: buffers, programs, then the outputs.
struct Call {
  CollectiveArgs a;
  PlanKnobs knobs;
  bool scratch_possible = true;
  int world = 1;
  Memory m;
  std::vector<char*> outs, ins, scratch;
  size_t out_bytes = 0;

  // `in_data`: each rank's input; `out_bytes`: each rank's output. In place,
  // the inner buffer sits at offset(rank) of the outer one, and the planner
  // must accept that overlap.
  void run(const std::vector<Bytes>& in_data, size_t out_size, const std::string& what, Layout layout = Layout::kApart,
           const std::function<size_t(int)>& offset = nullptr) {
    const CollectivePlanner& planner = planner_for(a.op);
    out_bytes = out_size;
    outs.clear();
    ins.clear();
    scratch.clear();
    a.outs.clear();
    a.ins.clear();
    for (int r = 0; r < world; ++r) {
      const size_t in_bytes = in_data[r].size();
      if (layout == Layout::kOutInsideIn) {
        ins.push_back(m.make(2, r, in_bytes, 0));
        outs.push_back(ins[r] + offset(r));
      } else {
        outs.push_back(m.make(1, r, out_bytes, 0xEE));  // poisoned
        ins.push_back(layout == Layout::kInInsideOut ? outs[r] + offset(r) : m.make(2, r, in_bytes, 0));
      }
      std::memcpy(m.at(ins[r], in_bytes), in_data[r].data(), in_bytes);
      if (layout != Layout::kApart)
        EXPECT_EQ(planner.overlap_error(ins[r], outs[r], r, planner.shape(a, world).bytes, in_bytes, out_bytes), "")
            << what;
      a.outs.push_back(outs[r]);
      a.ins.push_back(ins[r]);
    }
    const CallShape shape = planner.shape(a, world);
    ASSERT_GT(shape.bytes, 0u);
    const ScratchPlan s = planner.scratch(a, world, shape.bytes, knobs, [&](size_t) { return scratch_possible; });
    if (s.bytes(world))
      for (int r = 0; r < world; ++r) scratch.push_back(m.make(3, r, s.bytes(world), 0xCC));
    std::vector<Program> programs;
    for (int r = 0; r < world; ++r)
      programs.push_back(
          planner.plan(a, buffers_of(r, world, outs, ins, scratch, planner.writes_out(a)), shape.bytes, s, knobs));
    run_programs(m, programs, what);
  }
  Bytes out(int r) {
    const unsigned char* p = m.at(outs[r], out_bytes);
    return Bytes(p, p + out_bytes);
  }
};

std::string label(const char* op, int world, size_t bytes, const std::string& more = "") {
  return std::string(op) + " world " + std::to_string(world) + " bytes " + std::to_string(bytes) + more;
}

}  // namespace

TEST(Planner, AllGatherEveryRankGetsEveryBlock) {
  std::mt19937 rng(1);
  for (int world = 1; world <= 8; ++world)
    for (size_t bytes : {size_t(1), size_t(13), size_t(4099)})
      for (bool in_place : {false, true}) {
        Call c;
        c.world = world;
        c.a.op = CollOp::kAllGather;
        c.a.bytes_per_rank = bytes;
        std::vector<Bytes> in;
        for (int r = 0; r < world; ++r) in.push_back(random_bytes(rng, bytes));
        const std::string what = label("all_gather", world, bytes, in_place ? " in place" : "");
        if (in_place)  // each rank's input is its own block of out
          c.run(in, bytes * world, what, Layout::kInInsideOut, [&](int r) { return r * bytes; });
        else
          c.run(in, bytes * world, what);
        for (int r = 0; r < world; ++r)
          for (int p = 0; p < world; ++p)
            ASSERT_EQ(0, std::memcmp(c.out(r).data() + p * bytes, in[p].data(), bytes))
                << what << " rank " << r << " block " << p;
      }
}

TEST(Planner, AllToAllEveryBlockReachesItsRankWithOrWithoutBounceAndInPlaceInRounds) {
  std::mt19937 rng(2);
  for (int world = 1; world <= 8; ++world)
    for (size_t bytes : {size_t(1), size_t(37), size_t(5000)})
      for (int variant = 0; variant < 4; ++variant) {
        // 0: out of place, own block by kernel; 1: bounced through the next rank; 2: in place, one round;
        // 3: in place through a scratch too small for one round.
        Call c;
        c.world = world;
        c.a.op = CollOp::kAllToAll;
        c.a.bytes_per_rank = bytes;
        c.a.local_copy = variant == 1 ? LocalCopy::kPeer : LocalCopy::kKernel;
        c.knobs.scratch_cap = variant == 3 ? std::max<size_t>(world * 7, 1) : size_t(64) << 20;
        std::vector<Bytes> in;
        for (int r = 0; r < world; ++r) in.push_back(random_bytes(rng, bytes * world));
        const std::string what = label("all_to_all", world, bytes, " variant " + std::to_string(variant));
        if (variant >= 2)
          c.run(in, bytes * world, what, Layout::kInInsideOut, [](int) { return size_t(0); });
        else
          c.run(in, bytes * world, what);
        if (variant == 1 && world > 1) EXPECT_FALSE(c.scratch.empty()) << what << ": no bounce area";
        for (int r = 0; r < world; ++r)
          for (int p = 0; p < world; ++p)
            ASSERT_EQ(0, std::memcmp(c.out(r).data() + p * bytes, in[p].data() + r * bytes, bytes))
                << what << " rank " << r << " block from " << p;
      }
}

TEST(Planner, AllToAllvPacksBySourceIncludingEmptyParts) {
  std::mt19937 rng(3);
  for (int world = 1; world <= 8; ++world)
    for (int trial = 0; trial < 3; ++trial)
      for (LocalCopy lc : {LocalCopy::kKernel, LocalCopy::kPeer}) {
        Call c;
        c.world = world;
        c.a.op = CollOp::kAllToAllv;
        c.a.local_copy = lc;
        c.a.counts.resize(world * world);
        for (auto& x : c.a.counts) x = rng() % 4 == 0 ? 0 : rng() % 700;  // some parts empty
        c.a.counts[0] += 1;                                               // never all empty
        std::vector<Bytes> in;
        size_t out_max = 1;
        for (int r = 0; r < world; ++r) {
          in.push_back(random_bytes(rng, std::max<size_t>(1, all_to_allv_send_total(world, c.a.counts, r))));
          out_max = std::max(out_max, all_to_allv_recv_total(world, c.a.counts, r));
        }
        const std::string what = label("all_to_allv", world, out_max, " trial " + std::to_string(trial));
        c.run(in, out_max, what);
        for (int d = 0; d < world; ++d)
          for (int s = 0; s < world; ++s) {
            const size_t n = c.a.counts[s * world + d];
            ASSERT_EQ(0, std::memcmp(c.out(d).data() + all_to_allv_recv_offset(world, c.a.counts, s, d),
                                     in[s].data() + all_to_allv_send_offset(world, c.a.counts, s, d), n))
                << what << " from " << s << " to " << d;
          }
      }
}

TEST(Planner, BroadcastFromEveryRoot) {
  std::mt19937 rng(4);
  for (int world = 1; world <= 8; ++world)
    for (int root = 0; root < world; ++root)
      for (bool in_place : {false, true}) {
        const size_t bytes = 1 + rng() % 3000;
        Call c;
        c.world = world;
        c.a.op = CollOp::kBroadcast;
        c.a.root = root;
        c.a.bytes_per_rank = bytes;
        std::vector<Bytes> in;
        for (int r = 0; r < world; ++r) in.push_back(random_bytes(rng, bytes));
        const std::string what = label("broadcast", world, bytes, " root " + std::to_string(root));
        if (in_place)
          c.run(in, bytes, what, Layout::kInInsideOut, [](int) { return size_t(0); });
        else
          c.run(in, bytes, what);
        for (int r = 0; r < world; ++r) ASSERT_EQ(c.out(r), in[root]) << what << " rank " << r;
      }
  Call bad;
  bad.world = 3;
  bad.a.op = CollOp::kBroadcast;
  bad.a.root = 3;
  EXPECT_THROW(planner_for(CollOp::kBroadcast).shape(bad.a, 3), Error);
}

namespace {
template <typename T>
std::vector<Bytes> reduction_inputs(std::mt19937& rng, int world, size_t count) {
  std::vector<Bytes> in;
  for (int r = 0; r < world; ++r) {
    std::vector<T> v(count);
    // Small integers: float sums are exact in any order.
    for (auto& x : v) x = static_cast<T>(static_cast<int>(rng() % 2001) - 1000);
    Bytes b(count * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    in.push_back(b);
  }
  return in;
}

template <typename T>
T element(const Bytes& b, size_t i) {
  T x;
  std::memcpy(&x, b.data() + i * sizeof(T), sizeof(T));
  return x;
}

// reduce_scatter (each rank's result: its block of the reduction of every
// rank's `count * world` elements) or all_reduce (the reduction of every
// rank's `count` elements), in place or not, in rounds of `round_bytes`.
template <typename T>
void check_reduction(CollOp coll, DType dtype, RedOp op, int world, size_t count, size_t round_bytes, bool in_place,
                     std::mt19937& rng) {
  const bool scatter = coll == CollOp::kReduceScatter;
  Call c;
  c.world = world;
  c.a.op = coll;
  c.a.count = count;
  c.a.dtype = dtype;
  c.a.red_op = op;
  c.knobs.reduce_round_bytes = round_bytes;
  const auto in = reduction_inputs<T>(rng, world, scatter ? count * world : count);
  const size_t bytes = count * sizeof(T);
  const std::string what = label(coll_op_name(coll), world, bytes,
                                 " rounds of " + std::to_string(round_bytes) + (in_place ? " in place" : ""));
  if (!in_place)
    c.run(in, bytes, what);
  else if (scatter)  // out is this rank's own block of in
    c.run(in, bytes, what, Layout::kOutInsideIn, [&](int r) { return r * bytes; });
  else
    c.run(in, bytes, what, Layout::kInInsideOut, [](int) { return size_t(0); });
  for (int r = 0; r < world; ++r) {
    const Bytes got = c.out(r);
    for (size_t i = 0; i < count; ++i) {
      const size_t at = scatter ? r * count + i : i;
      T want = element<T>(in[0], at);
      for (int p = 1; p < world; ++p) want = combine(want, element<T>(in[p], at), op);
      ASSERT_EQ(element<T>(got, i), want) << what << " rank " << r << " element " << i;
    }
  }
}
}  // namespace

// reduce_scatter, and all_reduce (one exchange, or reduce-scatter then gather),
// in one round and in many, in place and out: a float sum and an int32 max or min.
TEST(Planner, ReductionsInOneRoundAndInManyInAndOutOfPlace) {
  std::mt19937 rng(5);
  for (auto [op, int_op] : {std::pair{CollOp::kReduceScatter, RedOp::kMax}, std::pair{CollOp::kAllReduce, RedOp::kMin}})
    for (int world = 1; world <= 8; ++world)
      for (size_t count : {size_t(1), size_t(5), size_t(7), size_t(1000), size_t(1003)})
        for (size_t round_bytes : {size_t(0), size_t(256)})
          for (bool in_place : {false, true}) {
            check_reduction<float>(op, DType::kFloat32, RedOp::kSum, world, count, round_bytes, in_place, rng);
            check_reduction<int32_t>(op, DType::kInt32, int_op, world, count, round_bytes, in_place, rng);
          }
}

// What each rank reads from its own knobs and its exchanges depend on: the
// same where the programs meet (one round of any size past the block), apart
// where they would not (four rounds against two, chunks of another size).
TEST(Planner, ExchangeSettingsDifferExactlyWhereProgramsWouldNotMeet) {
  auto settings = [](CollOp op, size_t count, int world, size_t round, size_t cap) {
    CollectiveArgs a;
    a.op = op;
    a.count = count;
    a.bytes_per_rank = count * 4;
    a.dtype = DType::kFloat32;
    char buf[8];
    a.ins = {buf};
    a.outs = {buf};
    PlanKnobs k;
    k.reduce_round_bytes = round;
    k.scratch_cap = cap;
    const CollectivePlanner& p = planner_for(op);
    const size_t shape = p.shape(a, world).bytes;
    return p.exchange_settings(a, world, shape, p.scratch(a, world, shape, k, [](size_t) { return true; }), k);
  };
  const size_t cap = size_t(64) << 20;
  for (CollOp op : {CollOp::kReduceScatter, CollOp::kAllReduce}) {
    const size_t count = 4096;  // blocks of 16 KiB (reduce_scatter) or up to 16 KiB (all_reduce) on 2 ranks
    EXPECT_NE(settings(op, count, 2, 4096, cap), settings(op, count, 2, 8192, cap)) << coll_op_name(op);
    EXPECT_EQ(settings(op, count, 2, 0, cap), settings(op, count, 2, 1 << 20, cap)) << coll_op_name(op);
    EXPECT_EQ(settings(op, count, 2, 1 << 20, cap), settings(op, count, 2, 2 << 20, cap)) << coll_op_name(op);
    EXPECT_EQ(settings(op, count, 2, 4096, cap), settings(op, count, 2, 4096, 1 << 20)) << coll_op_name(op);
  }
  // In-place all_to_all (in == out above): its chunk follows the scratch cap.
  EXPECT_NE(settings(CollOp::kAllToAll, 1 << 20, 2, 0, 1 << 20), settings(CollOp::kAllToAll, 1 << 20, 2, 0, 2 << 20));
  EXPECT_EQ(settings(CollOp::kAllToAll, 1 << 10, 2, 0, 1 << 20), settings(CollOp::kAllToAll, 1 << 10, 2, 0, 2 << 20));
  EXPECT_EQ(settings(CollOp::kAllToAll, 1 << 10, 2, 0, 1 << 20),
            settings(CollOp::kAllToAll, 1 << 10, 2, 4096, 1 << 20));
  EXPECT_EQ(settings(CollOp::kAllGather, 1 << 20, 2, 0, 1 << 20), settings(CollOp::kAllGather, 1 << 20, 2, 0, 2 << 20));
}

TEST(Planner, OverlapsOtherThanTheInPlaceFormsAreNamed) {
  char buf[64];
  // all_gather: in may be this rank's own block of out, nothing else.
  EXPECT_EQ(planner_for(CollOp::kAllGather).overlap_error(buf + 8, buf, 1, 8, 8, 32), "");
  EXPECT_NE(planner_for(CollOp::kAllGather).overlap_error(buf + 4, buf, 1, 8, 8, 32), "");
  // reduce_scatter: out may be this rank's own block of in.
  EXPECT_EQ(planner_for(CollOp::kReduceScatter).overlap_error(buf, buf + 16, 2, 8, 32, 8), "");
  EXPECT_NE(planner_for(CollOp::kReduceScatter).overlap_error(buf, buf + 8, 2, 8, 32, 8), "");
  // all_to_allv is out of place only; disjoint buffers are always fine.
  EXPECT_NE(planner_for(CollOp::kAllToAllv).overlap_error(buf, buf, 0, 8, 8, 8), "");
  EXPECT_EQ(planner_for(CollOp::kAllToAllv).overlap_error(buf, buf + 8, 0, 8, 8, 8), "");
  for (CollOp op : {CollOp::kAllToAll, CollOp::kBroadcast, CollOp::kAllReduce}) {
    EXPECT_EQ(planner_for(op).overlap_error(buf, buf, 0, 8, 8, 8), "") << coll_op_name(op);
    EXPECT_NE(planner_for(op).overlap_error(buf + 1, buf, 0, 8, 8, 8), "") << coll_op_name(op);
  }
}

TEST(Planner, SelectionBytesAreBytesPerRank) {
  CollectiveArgs a;
  a.op = CollOp::kAllReduce;
  a.count = 1024;
  a.dtype = DType::kFloat32;
  EXPECT_EQ(planner_for(a.op).selection_bytes(a, 4), 1024u);
  a.op = CollOp::kReduceScatter;
  EXPECT_EQ(planner_for(a.op).selection_bytes(a, 4), 4096u);
  a.op = CollOp::kAllToAllv;
  a.counts.assign(4, 100);
  EXPECT_EQ(planner_for(a.op).selection_bytes(a, 2), 100u);
  a.counts.assign(3, 100);
  EXPECT_THROW(planner_for(a.op).shape(a, 2), Error);
  a.op = CollOp::kAllGather;
  a.bytes_per_rank = 77;
  EXPECT_EQ(planner_for(a.op).selection_bytes(a, 8), 77u);
}

TEST(Planner, SizesPast64BitsAreRefusedBeforeAnythingIsSizedByThem) {
  // A C caller's sizes: a product that wrapped would size the checks of out for 0 bytes, then plan 2^63.
  auto refused = [](const CollectiveArgs& a, int world, const char* what) {
    try {
      planner_for(a.op).shape(a, world);
      ADD_FAILURE() << coll_op_name(a.op) << " taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  CollectiveArgs a;
  for (CollOp op : {CollOp::kAllGather, CollOp::kAllToAll}) {
    a.op = op;
    a.bytes_per_rank = size_t(1) << 63;
    refused(a, 2, "out (bytes x world) is 9223372036854775808 x 2 bytes, past 64 bits");
    a.bytes_per_rank = size_t(1) << 62;
    EXPECT_EQ(planner_for(op).shape(a, 2).bytes, size_t(1) << 62);  // 2^63 fits
  }
  a.op = CollOp::kAllToAllv;
  a.counts = {1, size_t(1) << 63, 0, size_t(1) << 63};
  refused(a, 2, "counts add up past 64 bits");
  a.op = CollOp::kAllReduce;
  a.dtype = DType::kFloat32;
  a.count = (size_t(1) << 62) + 1;
  refused(a, 4, "count x the dtype's size");
  a.count = size_t(1) << 60;  // 2^62 bytes: its slots for 4 ranks do not fit
  refused(a, 4, "the scratch slots");
  a.op = CollOp::kReduceScatter;
  a.count = size_t(1) << 61;  // 2^63 bytes per rank, in is twice that
  refused(a, 2, "in (count x the dtype's size x world)");
  a.count = size_t(1) << 20;
  EXPECT_EQ(planner_for(a.op).shape(a, 8).bytes, size_t(4) << 20);
}

TEST(Planner, AllToAllInPlaceIsAskedOfEveryLocalRank) {
  // build() refuses a call in place on some local ranks and not on others,
  // whichever local rank is the odd one out (an out-of-place rank 1 beside an
  // in-place rank 0, or the other way round).
  char a0[8], a1[8], b1[8];
  CollectiveArgs a;
  a.op = CollOp::kAllToAll;
  a.outs = {a0, a1};
  a.ins = {a0, b1};
  const CollectivePlanner& p = planner_for(CollOp::kAllToAll);
  EXPECT_TRUE(p.in_place(a, 0));
  EXPECT_FALSE(p.in_place(a, 1));
  EXPECT_TRUE(p.in_place(a));
  a.ins = {b1, a1};
  EXPECT_FALSE(p.in_place(a, 0));
  EXPECT_TRUE(p.in_place(a, 1));
  for (CollOp op : {CollOp::kAllGather, CollOp::kBroadcast, CollOp::kAllReduce})
    EXPECT_FALSE(planner_for(op).in_place(a, 1)) << coll_op_name(op);
}

// Which calls one thread may enqueue for every local rank in turn: the
// default reductions and a large all-to-all stay on it; a call of thousands
// of rounds (forced rounds, an in-place all-to-all through a small scratch)
// goes on a thread per rank, which any world of one rank never needs. An
// armed call may hold kArmedOpsMax operations, and a call captured for
// several local ranks kCapturedOpsMax.
TEST(Planner, CallsLongerThanAStreamQueueAreEnqueuedRankByRankApartNotArmedOrNotCaptured) {
  auto most_ops = [](CollOp op, size_t count, int world, size_t round, size_t cap, bool in_place) {
    CollectiveArgs a;
    a.op = op;
    a.count = count;
    a.bytes_per_rank = count * 4;
    a.dtype = DType::kFloat32;
    PlanKnobs k;
    k.reduce_round_bytes = round;
    k.scratch_cap = cap;
    std::vector<char*> outs, ins, scratch;
    for (int r = 0; r < world; ++r) {
      outs.push_back(reinterpret_cast<char*>(uintptr_t(1) << 44 | uintptr_t(r) << 36));
      ins.push_back(in_place ? outs[r] : reinterpret_cast<char*>(uintptr_t(2) << 44 | uintptr_t(r) << 36));
      a.outs.push_back(outs[r]);
      a.ins.push_back(ins[r]);
    }
    const CollectivePlanner& p = planner_for(op);
    const size_t shape = p.shape(a, world).bytes;
    const ScratchPlan s = p.scratch(a, world, shape, k, [](size_t) { return true; });
    if (s.bytes(world))
      for (int r = 0; r < world; ++r)
        scratch.push_back(reinterpret_cast<char*>(uintptr_t(3) << 44 | uintptr_t(r) << 36));
    size_t most = 0;
    for (int r = 0; r < world; ++r)
      most = std::max(
          most,
          host_operations(p.plan(a, buffers_of(r, world, outs, ins, scratch, p.writes_out(a)), shape, s, k), world));
    return most;
  };
  const size_t cap = size_t(64) << 20;
  for (int world : {2, 4, 8}) {
    // 512 MiB of result per rank, the default rounds (at most four).
    const size_t big = (size_t(512) << 20) / 4;
    EXPECT_FALSE(enqueue_ranks_apart(world, most_ops(CollOp::kReduceScatter, big, world, 0, cap, false))) << world;
    EXPECT_FALSE(enqueue_ranks_apart(world, most_ops(CollOp::kAllReduce, big, world, 0, cap, false))) << world;
    EXPECT_FALSE(enqueue_ranks_apart(world, most_ops(CollOp::kAllToAll, big, world, 0, cap, false))) << world;
    EXPECT_FALSE(enqueue_ranks_apart(world, most_ops(CollOp::kAllGather, big, world, 0, cap, false))) << world;
    // 16 MiB of result in rounds of 4 KiB: 4,096 rounds.
    const size_t ops = most_ops(CollOp::kReduceScatter, size_t(4) << 20, world, 4096, cap, false);
    EXPECT_GT(ops, size_t(4096)) << world;
    EXPECT_TRUE(enqueue_ranks_apart(world, ops)) << world;
    EXPECT_FALSE(enqueue_ranks_apart(1, ops));
    // In place through a 4 KiB scratch: 4 MiB blocks in chunks of 4096 / world.
    EXPECT_TRUE(enqueue_ranks_apart(world, most_ops(CollOp::kAllToAll, size_t(1) << 20, world, 0, 4096, true)))
        << world;
  }
  // A prepared reduce_scatter (test_single_process.py's refusal): 64 rounds
  // of 4 KiB are refused at any world, 16 taken at any world up to 8.
  for (int world : {2, 4, 8}) {
    EXPECT_GT(most_ops(CollOp::kReduceScatter, 64 * 1024, world, 4096, cap, false), kArmedOpsMax) << world;
    EXPECT_LE(most_ops(CollOp::kReduceScatter, 16 * 1024, world, 4096, cap, false), kArmedOpsMax) << world;
  }
  EXPECT_FALSE(enqueue_ranks_apart(2, kSerialEnqueueOps));
  EXPECT_TRUE(enqueue_ranks_apart(2, kSerialEnqueueOps + 1));
  // Captured for several local ranks (bench/probes/captured_long_calls.py:
  // on two H200s a graph of 512 rounds of 4 KiB blocked its launch, one of
  // 256 did not): the defaults fit at every world, 512 rounds at none, 128
  // at world 2; one local rank has no limit.
  for (int world : {2, 4, 8}) {
    const size_t big = (size_t(512) << 20) / 4;
    for (CollOp op : {CollOp::kReduceScatter, CollOp::kAllReduce, CollOp::kAllToAll, CollOp::kAllGather})
      EXPECT_TRUE(capture_fits(world, most_ops(op, big, world, 0, cap, false))) << coll_op_name(op) << " " << world;
    // In place through the default 64 MiB scratch: 512 MiB per rank fits up
    // to world 4; at world 8 (2,304 operations) 256 MiB does.
    const size_t in_place = world < 8 ? big : big / 2;
    EXPECT_TRUE(capture_fits(world, most_ops(CollOp::kAllToAll, in_place, world, 0, cap, true)))
        << world << ": " << most_ops(CollOp::kAllToAll, in_place, world, 0, cap, true);
    if (world == 8) EXPECT_FALSE(capture_fits(world, most_ops(CollOp::kAllToAll, big, world, 0, cap, true)));
    const size_t ops = most_ops(CollOp::kReduceScatter, 512 * 1024, world, 4096, cap, false);
    EXPECT_FALSE(capture_fits(world, ops)) << world;
    EXPECT_TRUE(capture_fits(1, ops));
  }
  EXPECT_TRUE(capture_fits(2, most_ops(CollOp::kReduceScatter, 128 * 1024, 2, 4096, cap, false)));
  EXPECT_TRUE(capture_fits(2, kCapturedOpsMax));
  EXPECT_FALSE(capture_fits(2, kCapturedOpsMax + 1));
}
