// What every rank writes into a peer's ready flag: a 64-bit tag holding the
// collective's sequence number (high 32 bits) and a hash of the call's
// arguments (low 32 bits). Peers wait for the exact tag they expect, so a rank
// that called with other arguments never satisfies the wait: it cannot write
// past what its peer expects, and the watchdog reports the mismatch by name.
#pragma once

#include <cstdint>

#include "coll/plan.hpp"

namespace ferry {

uint32_t call_signature(CollOp op, uint64_t bytes_per_rank, uint32_t registration, uint64_t offset);
// Never 0 (a fresh flag holds 0).
uint64_t make_tag(uint64_t seq, uint32_t signature);
inline uint64_t tag_seq(uint64_t tag) { return tag >> 32; }

}  // namespace ferry
