// Which copies a rank issues for a collective: pure functions of the ranks'
// buffer addresses, tested on the CPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dma/batch_plan.hpp"

namespace ferry {

enum class CollOp : uint32_t { kAllGather = 1, kAllToAll = 2 };

const char* coll_op_name(CollOp op);

struct PeerCopy {
  int peer;
  Copy copy;
};

// The pushes `rank` makes into its peers' outputs, in cyclic-shift order
// (step k sends to rank (rank + k) % world), which keeps every GPU sending to
// a different peer at each step (DESIGN.md: the order decides large-size
// bandwidth). `out_by_rank[p]` is rank p's output as mapped in this process.
//   all_gather: in (bytes) -> out_p[rank * bytes]
//   all_to_all: in[p * bytes] (bytes) -> out_p[rank * bytes]
std::vector<PeerCopy> plan_pushes(CollOp op, int rank, int world, const std::vector<char*>& out_by_rank, const char* in,
                                  size_t bytes);

// The copy of this rank's own block; bytes == 0 when `in` already is that
// block (in-place all-gather).
Copy plan_local(CollOp op, int rank, char* out, const char* in, size_t bytes);

// Whether a rank's own block is copied on a side stream, concurrently with the
// pushes, instead of ahead of them on the collective's stream. Worth its two
// extra event operations only for large blocks (the copy then overlaps the
// much longer pushes; 256 MB: about 0.5 ms of a 2.6 ms all-gather on 4 H200s).
bool local_copy_on_side_stream(size_t bytes);

// True when [a, a + na) and [b, b + nb) share a byte.
bool ranges_overlap(const void* a, size_t na, const void* b, size_t nb);

}  // namespace ferry
