// What every rank writes into a peer's flags for a call: a 64-bit value made
// from a hash of the call's arguments. Peers wait for the exact value they
// expect, so a rank that called with other arguments never satisfies the wait:
// it cannot write past what its peer expects, and the watchdog names the
// mismatch at once. The value is the same on every run of the same call, which
// lets CUDA graphs and prepared collectives replay their commands.
#pragma once

#include <cstdint>

#include "coll/plan.hpp"

namespace ferry {

// `extra` folds in what else must agree: root, counts, dtype, reduction op.
uint32_t call_signature(CollOp op, uint64_t bytes_per_rank, uint32_t registration, uint64_t offset, uint64_t extra = 0);
// Never 0 (a reset flag holds 0).
uint64_t flag_value(uint32_t signature);
// A hash of a list of numbers (all_to_allv counts).
uint64_t hash_values(const uint64_t* v, size_t n);

}  // namespace ferry
