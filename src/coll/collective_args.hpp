// One collective call's arguments, as the Python and C layers pass them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

#include "coll/local_copy.hpp"
#include "coll/plan.hpp"
#include "coll/reduce.hpp"
#include "coll/selector.hpp"
#include "coll/signals.hpp"

namespace ferry {

// One collective call: what it is, and one out, in and stream per local rank.
struct CollectiveArgs {
  CollOp op = CollOp::kAllGather;
  std::vector<void*> outs;
  std::vector<const void*> ins;
  std::vector<cudaStream_t> streams;
  // all_gather, all_to_all: bytes of one rank's block; broadcast: bytes in all.
  size_t bytes_per_rank = 0;
  // all_to_allv: bytes from rank s to rank d at [s * world + d], the same on every rank.
  std::vector<size_t> counts;
  int root = 0;  // broadcast
  // reduce_scatter: elements per rank's output block; all_reduce: elements in all.
  size_t count = 0;
  DType dtype = DType::kFloat32;
  RedOp red_op = RedOp::kSum;
  Algo algo = Algo::kAuto;
  LocalCopy local_copy = LocalCopy::kAuto;
  Signals signals = Signals::kAuto;
};

}  // namespace ferry
