// Which variant runs a collective: a pure function of the call and a tuning
// table, tested on the CPU. The default table comes from measurements on
// H200 machines (bench/results/); FERRY_ALGO or the call's `algo` overrides it.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "coll/plan.hpp"
#include "coll/signals.hpp"

namespace ferry {

struct SmPathBlocks;  // coll/sm_path.hpp

// kSm: not a copy-engine variant: one SM kernel moves the data (coll/sm_path.hpp).
enum class Algo { kAuto = 0, kPcpy = 1, kB2b = 2, kSeq = 3, kSm = 4 };

const char* algo_name(Algo a);
// "auto", "pcpy", "b2b", "seq", "sm"; anything else is an error that names `what`.
Algo parse_algo(const std::string& name, const char* what);

// A rule: for `op` on `world` ranks (0: any), calls of at most `max_bytes`
// per rank use `algo`, signalling as `signals` says (kAuto: as the
// communicator's FERRY_SIGNALS). Rules are tried in order; the first match wins.
struct SelectorRule {
  CollOp op;
  int world;
  size_t max_bytes;
  Algo algo;
  Signals signals = Signals::kAuto;
};

// The selector's answer: the variant, and the matching rule's signals.
struct Selection {
  Algo algo = Algo::kSeq;
  Signals signals = Signals::kAuto;
};

std::vector<SelectorRule> default_selector_table();

// `forced` (from the call or FERRY_ALGO) wins unless it is kAuto, with no
// signals of its own; with no matching rule, seq (the safe choice at any
// size). Rules naming kSm are skipped when `sm_possible` is false (the call
// cannot take the SM path).
Selection select_variant(CollOp op, int world, size_t bytes_per_rank, Algo forced,
                         const std::vector<SelectorRule>& table, bool sm_possible = true);

struct CollectiveArgs;

// What runs a call: the variant, and whether its signal rounds are kernels.
struct Resolved {
  Algo algo = Algo::kAuto;
  bool kernel_signals = false;
};

// A communicator's selector: its table (the startup one, or one set later)
// and its knobs (FERRY_ALGO, FERRY_SIGNALS) applied to calls. Pure: no CUDA;
// the caller passes the SM path's window size, which the SM path's rules need.
class Selector {
 public:
  Selector() = default;
  Selector(std::string gpu_name, int world, std::vector<SelectorRule> startup_table, Algo forced,
           bool kernel_signals_default);
  // The call's algo and signals where they are not "auto", else the table's,
  // else FERRY_SIGNALS for the signals. An explicit algo wins (the planner
  // explains an "sm" the call cannot take), and then the table says nothing
  // about signals.
  Resolved resolve(const CollectiveArgs& args, size_t selection_bytes, const SmPathBlocks& sm_blocks) const;
  // What a call of this shape with algo and signals "auto" would use;
  // `bytes_per_rank` as the selector counts it (all_reduce: a rank's share
  // of the buffer, taken as world times that: a buffer that world does not
  // divide is up to world - 1 bytes more, which can only matter where
  // FERRY_SM_TWO_SHOT_BYTES is above FERRY_SM_BYTES and the call sits at it).
  Resolved choose(CollOp op, size_t bytes_per_rank, const SmPathBlocks& sm_blocks) const;
  // Empty: the startup table.
  void set_table(const std::vector<SelectorRule>& rules);
  // A shipped preset ("sm-free", "latency") for this GPU model; an unknown
  // preset, or none shipped for this GPU, is an error.
  void set_preset(const std::string& preset);

 private:
  std::string gpu_name_;  // picks shipped tables
  int world_ = 0;
  std::vector<SelectorRule> table_;
  std::vector<SelectorRule> startup_table_;  // what an empty set_table restores
  Algo forced_ = Algo::kAuto;                // FERRY_ALGO
  bool kernel_signals_default_ = false;      // FERRY_SIGNALS=kernel: what a call's signals="auto" means
};

// The largest block one rank sends one peer on the SM path (sm_path_largest_block).
size_t sm_largest_block(const CollectiveArgs& args, int world, const SmPathBlocks& sm_blocks);

}  // namespace ferry
