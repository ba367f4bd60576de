// One collective call's arguments, as the Python and C layers pass them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>
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

// Ranks that share a GPU (FERRY_SHARED_GPUS) need a stream each: one rank's
// part of a call on a stream behind another's, which waits for it, would
// wait until the timeout. Throws naming `op`, both ranks and the GPU.
// `ranks`, `devices`, `streams`: by local rank.
void check_own_streams(const char* op, const std::vector<int>& ranks, const std::vector<int>& devices,
                       const std::vector<cudaStream_t>& streams);

}  // namespace ferry
