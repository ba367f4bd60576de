// The six collectives' planners (planner.hpp).
#include "coll/planner.hpp"
#include "coll/signature.hpp"
#include "core/error.hpp"

namespace ferry {
namespace {

// Reduce-scatter's data movement and reduction, in rounds (reduce_round_bytes):
// round j pushes bytes [begin, begin + len) of every peer's block into that
// peer's slot for this rank, then reduces the same bytes of this rank's block
// into `result`. Every round's reduction but the last runs beside the next
// round's pushes. `blocks`: the block each rank ends with, as parts of `in`.
void add_reduce_scatter(Program& program, const PlanBuffers& b, const std::vector<Block>& blocks, char* result,
                        size_t slot_stride, const CollectiveArgs& a, const PlanKnobs& k) {
  const size_t largest = largest_block(blocks);
  const auto rounds = plan_rounds(largest, reduce_round_bytes(largest, k.reduce_round_bytes));
  for (size_t j = 0; j < rounds.size(); ++j) {
    std::vector<Block> part;
    std::vector<char*> slots;
    for (int p = 0; p < b.world; ++p) {
      part.push_back(block_round(blocks[p], rounds[j]));
      slots.push_back(b.scratch_by_rank[p] + rounds[j].begin);
    }
    program.add_exchange(plan_scatter_to_scratch(b.rank, b.world, slots, b.in, part, slot_stride));
    const Block& mine = part[b.rank];
    program.add_reduce(ReduceStep{result + rounds[j].begin, b.in + mine.offset, slots[b.rank], slot_stride, b.rank,
                                  b.world, mine.bytes / dtype_bytes(a.dtype), a.dtype, a.red_op, k.reduce_blocks},
                       j + 1 < rounds.size());
  }
}

std::string overlap_unless(bool allowed, const char* in, size_t in_bytes, const char* out, size_t out_bytes,
                           const char* rule) {
  return allowed || !ranges_overlap(out, out_bytes, in, in_bytes) ? std::string() : std::string(rule);
}

// A reduction's round as its rounds' bounds see it: one round of any size
// past the largest block is the same one round.
uint64_t round_setting(size_t largest, const PlanKnobs& k) {
  return std::min(reduce_round_bytes(largest, k.reduce_round_bytes), largest);
}

uint64_t reduction_extra(const CollectiveArgs& a) { return uint64_t(a.dtype) << 8 | uint64_t(a.red_op); }

// x * y where it fits in 64 bits, else an error naming the call and `what`. A
// C caller's sizes can be anything, and a product that wrapped would size the
// checks of out and in for far fewer bytes than the plan then moves.
size_t product(size_t x, size_t y, const CollectiveArgs& a, const char* what) {
  if (y != 0 && x > SIZE_MAX / y)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(coll_op_name(a.op)) + ": " + what + " is " +
                                                  std::to_string(x) + " x " + std::to_string(y) +
                                                  " bytes, past 64 bits");
  return x * y;
}

// A reduction's bytes per rank (count x the dtype's size), with its buffers'
// sizes and scratch slots known to fit.
size_t reduction_bytes(const CollectiveArgs& a, int world, bool in_is_world) {
  const size_t bytes = product(a.count, dtype_bytes(a.dtype), a, "count x the dtype's size");
  const size_t w = static_cast<size_t>(world);
  if (in_is_world) product(bytes, w, a, "in (count x the dtype's size x world)");
  const size_t slot = bytes <= SIZE_MAX - 256 ? scratch_slot_stride(bytes) : SIZE_MAX;
  product(slot, w, a, "the scratch slots (count x the dtype's size, rounded up, x world)");
  return bytes;
}

class AllGather final : public CollectivePlanner {
 public:
  CallShape shape(const CollectiveArgs& a, int world) const override {
    product(a.bytes_per_rank, static_cast<size_t>(world), a, "out (bytes x world)");
    return {a.bytes_per_rank, 0};
  }
  std::string overlap_error(const char* in, const char* out, int rank, size_t shape, size_t in_bytes,
                            size_t out_bytes) const override {
    return overlap_unless(in == out + static_cast<size_t>(rank) * shape, in, in_bytes, out, out_bytes,
                          "in may only be this rank's own block of out (in-place)");
  }
  Program plan(const CollectiveArgs&, const PlanBuffers& b, size_t shape, const ScratchPlan&,
               const PlanKnobs&) const override {
    Program p;
    p.add_exchange(plan_all_gather(b.rank, b.world, b.out_by_rank, b.in, shape));
    return p;
  }
};

class AllToAll final : public CollectivePlanner {
 public:
  CallShape shape(const CollectiveArgs& a, int world) const override {
    product(a.bytes_per_rank, static_cast<size_t>(world), a, "out (bytes x world)");
    return {a.bytes_per_rank, 0};
  }
  bool in_place(const CollectiveArgs& a, int local = 0) const override {
    return static_cast<int>(a.ins.size()) > local && a.ins[local] == a.outs[local];
  }
  ScratchPlan scratch(const CollectiveArgs& a, int world, size_t shape, const PlanKnobs& k,
                      const std::function<bool(size_t)>& scratch_possible) const override {
    ScratchPlan s;
    if (in_place(a)) {
      s.chunk = in_place_chunk(shape, world, k.scratch_cap);
      s.slot_stride = scratch_slot_stride(s.chunk);
    } else {
      s.bounce_bytes = own_block_bounce_bytes(a.local_copy, shape, world, scratch_possible(shape));
    }
    return s;
  }
  bool writes_out(const CollectiveArgs& a) const override { return !in_place(a); }
  std::string overlap_error(const char* in, const char* out, int, size_t, size_t in_bytes,
                            size_t out_bytes) const override {
    return overlap_unless(in == out, in, in_bytes, out, out_bytes, "in may only be out itself (in-place)");
  }
  Program plan(const CollectiveArgs& a, const PlanBuffers& b, size_t shape, const ScratchPlan& s,
               const PlanKnobs&) const override {
    Program p;
    if (!in_place(a)) {
      p.add_exchange(
          plan_all_to_all(b.rank, b.world, b.out_by_rank, b.in, shape, s.bounce_bytes ? &b.scratch_by_rank : nullptr));
      return p;
    }
    for (const auto& round : plan_rounds(shape, s.chunk)) {
      p.add_exchange(plan_in_place_round(b.rank, b.world, b.scratch_by_rank, b.out, shape, round, s.slot_stride));
      p.add_unpack(
          plan_in_place_unpack(b.rank, b.world, b.out, b.scratch_by_rank[b.rank], shape, round, s.slot_stride));
    }
    return p;
  }
};

class AllToAllv final : public CollectivePlanner {
 public:
  CallShape shape(const CollectiveArgs& a, int world) const override {
    const size_t W = static_cast<size_t>(world);
    FERRY_ARG_CHECK(a.counts.size() == W * W, std::string(coll_op_name(a.op)) +
                                                  ": counts must hold world * world = " + std::to_string(W * W) +
                                                  " entries (bytes from rank s to rank d at [s * world + d]), got " +
                                                  std::to_string(a.counts.size()));
    std::vector<uint64_t> c(a.counts.begin(), a.counts.end());
    CallShape s{0, hash_values(c.data(), c.size())};
    // Every rank's part is a sum of some of them: the whole fitting, each does.
    for (size_t x : a.counts) {
      FERRY_ARG_CHECK(x <= SIZE_MAX - s.bytes, std::string(coll_op_name(a.op)) + ": counts add up past 64 bits (" +
                                                   std::to_string(x) + " after " + std::to_string(s.bytes) + ")");
      s.bytes += x;
    }
    return s;
  }
  size_t selection_bytes(const CollectiveArgs& a, int world) const override {
    size_t total = 0;
    for (size_t c : a.counts) total += c;
    return total / (static_cast<size_t>(world) * world);
  }
  ScratchPlan scratch(const CollectiveArgs& a, int world, size_t, const PlanKnobs&,
                      const std::function<bool(size_t)>& scratch_possible) const override {
    const size_t own = all_to_allv_largest_own(world, a.counts);
    ScratchPlan s;
    s.bounce_bytes = own_block_bounce_bytes(a.local_copy, own, world, scratch_possible(own));
    return s;
  }
  std::string overlap_error(const char* in, const char* out, int, size_t, size_t in_bytes,
                            size_t out_bytes) const override {
    return overlap_unless(false, in, in_bytes, out, out_bytes, "all_to_allv is out-of-place");
  }
  Program plan(const CollectiveArgs& a, const PlanBuffers& b, size_t, const ScratchPlan& s,
               const PlanKnobs&) const override {
    Program p;
    p.add_exchange(plan_all_to_allv(b.rank, b.world, b.out_by_rank, b.in, a.counts,
                                    s.bounce_bytes ? &b.scratch_by_rank : nullptr));
    return p;
  }
};

class Broadcast final : public CollectivePlanner {
 public:
  CallShape shape(const CollectiveArgs& a, int world) const override {
    FERRY_ARG_CHECK(a.root >= 0 && a.root < world, std::string(coll_op_name(a.op)) + ": root is " +
                                                       std::to_string(a.root) + "; expected 0.." +
                                                       std::to_string(world - 1));
    return {a.bytes_per_rank, static_cast<uint64_t>(a.root)};
  }
  std::string overlap_error(const char* in, const char* out, int, size_t, size_t in_bytes,
                            size_t out_bytes) const override {
    return overlap_unless(in == out, in, in_bytes, out, out_bytes, "in may only be out itself (in-place)");
  }
  Program plan(const CollectiveArgs& a, const PlanBuffers& b, size_t shape, const ScratchPlan&,
               const PlanKnobs&) const override {
    Program p;
    p.add_exchange(plan_broadcast(b.rank, b.world, a.root, b.out_by_rank, b.in, shape));
    return p;
  }
};

class ReduceScatter final : public CollectivePlanner {
 public:
  CallShape shape(const CollectiveArgs& a, int world) const override {
    return {reduction_bytes(a, world, true), reduction_extra(a)};
  }
  ScratchPlan scratch(const CollectiveArgs&, int, size_t shape, const PlanKnobs&,
                      const std::function<bool(size_t)>&) const override {
    ScratchPlan s;
    s.slot_stride = scratch_slot_stride(shape);
    return s;
  }
  uint64_t exchange_settings(const CollectiveArgs&, int, size_t shape, const ScratchPlan&,
                             const PlanKnobs& k) const override {
    return round_setting(shape, k);  // every block is `shape` long
  }
  bool writes_out(const CollectiveArgs&) const override { return false; }
  std::string overlap_error(const char* in, const char* out, int rank, size_t shape, size_t in_bytes,
                            size_t out_bytes) const override {
    return overlap_unless(in + static_cast<size_t>(rank) * shape == out, in, in_bytes, out, out_bytes,
                          "out may only be this rank's own block of in");
  }
  Program plan(const CollectiveArgs& a, const PlanBuffers& b, size_t shape, const ScratchPlan& s,
               const PlanKnobs& k) const override {
    Program p;
    std::vector<Block> blocks;
    for (int r = 0; r < b.world; ++r) blocks.push_back(Block{static_cast<size_t>(r) * shape, shape});
    add_reduce_scatter(p, b, blocks, b.out, s.slot_stride, a, k);
    return p;
  }
};

class AllReduce final : public CollectivePlanner {
 public:
  CallShape shape(const CollectiveArgs& a, int world) const override {
    return {reduction_bytes(a, world, false), reduction_extra(a)};
  }
  size_t selection_bytes(const CollectiveArgs& a, int world) const override {
    return a.count * dtype_bytes(a.dtype) / world;
  }
  ScratchPlan scratch(const CollectiveArgs& a, int world, size_t, const PlanKnobs&,
                      const std::function<bool(size_t)>&) const override {
    ScratchPlan s;
    s.slot_stride = scratch_slot_stride(largest_block(all_reduce_blocks(a.count, dtype_bytes(a.dtype), world)));
    return s;
  }
  uint64_t exchange_settings(const CollectiveArgs& a, int world, size_t, const ScratchPlan&,
                             const PlanKnobs& k) const override {
    return round_setting(largest_block(all_reduce_blocks(a.count, dtype_bytes(a.dtype), world)), k);
  }
  std::string overlap_error(const char* in, const char* out, int, size_t, size_t in_bytes,
                            size_t out_bytes) const override {
    return overlap_unless(in == out, in, in_bytes, out, out_bytes, "in may only be out itself (in-place)");
  }
  // Blocks of the whole buffer (one exchange: nothing left to gather), or one
  // block per rank, reduced by its owner and gathered.
  Program plan(const CollectiveArgs& a, const PlanBuffers& b, size_t shape, const ScratchPlan& s,
               const PlanKnobs& k) const override {
    Program p;
    const auto blocks = all_reduce_blocks(a.count, dtype_bytes(a.dtype), b.world);
    add_reduce_scatter(p, b, blocks, b.out + blocks[b.rank].offset, s.slot_stride, a, k);
    if (!all_reduce_one_exchange(b.world, shape))
      p.add_exchange(plan_gather_blocks(b.rank, b.world, b.out_by_rank, blocks));
    return p;
  }
};

}  // namespace

size_t CollectivePlanner::selection_bytes(const CollectiveArgs& a, int world) const { return shape(a, world).bytes; }

const CollectivePlanner& planner_for(CollOp op) {
  static const AllGather all_gather;
  static const AllToAll all_to_all;
  static const AllToAllv all_to_allv;
  static const Broadcast broadcast;
  static const ReduceScatter reduce_scatter;
  static const AllReduce all_reduce;
  switch (op) {
    case CollOp::kAllGather:
      return all_gather;
    case CollOp::kAllToAll:
      return all_to_all;
    case CollOp::kAllToAllv:
      return all_to_allv;
    case CollOp::kBroadcast:
      return broadcast;
    case CollOp::kReduceScatter:
      return reduce_scatter;
    case CollOp::kAllReduce:
      return all_reduce;
  }
  throw_error(FERRY_ERROR_INVALID_ARGUMENT, "op " + std::to_string(static_cast<uint32_t>(op)) + " is not a collective");
}

}  // namespace ferry
