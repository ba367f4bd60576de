// Which variant runs a collective: a pure function of the call and a tuning
// table, tested on the CPU. The default table comes from measurements on
// H200 machines (bench/results/); FERRY_ALGO or the call's `algo` overrides it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "coll/plan.hpp"
#include "coll/signals.hpp"

namespace ferry {

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

}  // namespace ferry
