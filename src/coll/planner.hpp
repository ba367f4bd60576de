// One planner per collective: everything about a call that depends on which
// collective it is, in one place each. The size every rank must agree on, the
// bytes the selector weighs, the scratch its copy-engine form needs, whether
// peers write into its output, which overlap of in and out is its in-place
// form, and its program of exchanges, reductions and unpacks (program.hpp).
// Pure functions of the call and the ranks' addresses, tested on the CPU by
// running every rank's program on byte arrays; Communicator::build
// (collectives.cpp) checks pointers and registrations, finds the memory and
// asks these.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coll/collective_args.hpp"
#include "coll/program.hpp"

namespace ferry {

// What every rank must agree on: the call's shape in bytes (see rank_bytes:
// all_gather's input, one all_to_all block, the broadcast, reduce_scatter's
// result, all_reduce's buffer, all_to_allv's total) and what else goes into
// its signature (counts, root, element type and reduction).
struct CallShape {
  size_t bytes = 0;
  uint64_t extra = 0;
};

// The scratch a copy-engine call needs on every rank.
struct ScratchPlan {
  size_t slot_stride = 0;   // bytes between peers' slots (reductions, in-place all_to_all); 0: no slots
  size_t chunk = 0;         // in-place all_to_all: bytes of each block per round
  size_t bounce_bytes = 0;  // all_to_all(v) out of place: the own block's bounce area (add_bounce)
  size_t bytes(int world) const { return slot_stride ? slot_stride * static_cast<size_t>(world) : bounce_bytes; }
};

// Knobs a plan reads, read once by the caller (FERRY_SCRATCH_BYTES,
// FERRY_REDUCE_ROUND_BYTES, FERRY_REDUCE_BLOCKS).
struct PlanKnobs {
  size_t scratch_cap = size_t(64) << 20;
  size_t reduce_round_bytes = 0;  // 0: ferry's rule (reduce_round_bytes)
  int reduce_blocks = 32;
};

// One rank's addresses, as mapped in this process.
struct PlanBuffers {
  int rank = 0;
  int world = 1;
  char* out = nullptr;
  const char* in = nullptr;
  std::vector<char*> out_by_rank;      // every rank's out (empty where peers do not write out)
  std::vector<char*> scratch_by_rank;  // every rank's scratch (empty without scratch)
};

class CollectivePlanner {
 public:
  virtual ~CollectivePlanner() = default;
  // Also checks what only this collective has (all_to_allv's counts, broadcast's root).
  virtual CallShape shape(const CollectiveArgs& a, int world) const = 0;
  // The bytes per rank the selector's rules are written for.
  virtual size_t selection_bytes(const CollectiveArgs& a, int world) const;
  // Whether local rank `local`'s part of this call works in place (all_to_all:
  // in == out); the call's form is local rank 0's, and every local rank must share it.
  virtual bool in_place(const CollectiveArgs&, int /*local*/ = 0) const { return false; }
  // The copy-engine form's scratch. `scratch_possible(bytes)`: whether that
  // much scratch exists or may be grown now (not while a graph is captured).
  virtual ScratchPlan scratch(const CollectiveArgs&, int /*world*/, size_t /*shape*/, const PlanKnobs&,
                              const std::function<bool(size_t)>& /*scratch_possible*/) const {
    return {};
  }
  // What, besides the call's shape, the ranks' programs must agree on for
  // their exchanges to meet (in-place all_to_all's chunk, a reduction's
  // round), as read from knobs each rank reads for itself; 0: nothing.
  virtual uint64_t exchange_settings(const CollectiveArgs&, int /*world*/, size_t /*shape*/, const ScratchPlan& s,
                                     const PlanKnobs&) const {
    return s.chunk;
  }
  // Whether peers write into `out` (which must then be registered) rather than into scratch only.
  virtual bool writes_out(const CollectiveArgs&) const { return true; }
  // Empty when rank `rank`'s in and out may overlap as they do (this
  // collective's in-place form, or no overlap at all), else the rule broken.
  virtual std::string overlap_error(const char* in, const char* out, int rank, size_t shape, size_t in_bytes,
                                    size_t out_bytes) const = 0;
  // The copy-engine program of rank b.rank.
  virtual Program plan(const CollectiveArgs& a, const PlanBuffers& b, size_t shape, const ScratchPlan& s,
                       const PlanKnobs& k) const = 0;
};

const CollectivePlanner& planner_for(CollOp op);

}  // namespace ferry
