// A collective as one rank runs it: a short list of steps, built once from the
// call (addresses only, no CUDA) and then emitted onto a stream, either right
// away (a plain call, or a call being captured into a CUDA graph) or behind a
// trigger (a prepared, prelaunched collective).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "coll/plan.hpp"
#include "coll/reduce.hpp"
#include "coll/sm_path.hpp"

namespace ferry {

struct Step {
  enum class Kind { kExchange, kReduce, kUnpack, kSmPath };
  Kind kind = Kind::kExchange;
  Exchange exchange;         // kExchange
  ReduceStep reduce{};       // kReduce: an SM kernel
  std::vector<Copy> unpack;  // kUnpack: local copy-engine copies (in-place all-to-all)
  SmPathStep sm_path;        // kSmPath: the whole collective as one SM kernel (algo "sm")
  // kReduce: runs on a side stream after everything before it, so that the
  // next round's exchange goes on meanwhile. The next step that is not an
  // exchange, and the end of the call, wait for the side stream.
  bool beside_next = false;
};

struct Program {
  std::vector<Step> steps;
  // Bit p set: some exchange writes into rank p / rank p writes into this one.
  uint64_t targets_mask = 0;
  uint64_t sources_mask = 0;

  void add_exchange(Exchange x);
  void add_reduce(const ReduceStep& r, bool beside_next = false);
  void add_unpack(std::vector<Copy> copies);
  // Every peer both writes into this rank's window and is written to.
  void add_sm_path(const SmPathStep& o);
};

// About how many operations, erring high, Emitter::emit puts on a stream for `p`, one
// rank's program in a world of `world` ranks (copies, batches of stream
// memory operations, kernel launches, event operations). Counted from the
// steps' kinds and the world alone, never from what one rank's steps hold
// (an exchange may skip a zero-byte push on one rank only), so that every
// rank of a call counts the same.
size_t host_operations(const Program& p, int world);

// A stream's queue takes about a thousand operations behind a wait that has
// not been released (dma::kQueueOpsBehindAWait). One
// thread enqueueing several local ranks' calls in turn would block in the
// first rank's full queue, behind a wait for a signal that a later rank's
// commands, not yet enqueued, would write: a healthy call failing at the
// timeout. So a call whose longest program holds more operations than this
// is enqueued on a thread per local rank (several streams may share one
// hardware queue, hence a quarter of what one queue held).
inline constexpr size_t kSerialEnqueueOps = 256;
bool enqueue_ranks_apart(int local_ranks, size_t most_host_operations);

// A call captured in one process for several GPUs becomes one CUDA graph per
// GPU, and replaying it launches those graphs one after another from one
// thread. A graph's launch blocks the host once the GPU's queues are full
// behind a wait, which only the next GPU's graph, not yet launched, would
// release: on two H200s (bench/probes/captured_long_calls.py) a part of
// about 3,300 operations (256 rounds of a reduce_scatter) launched in 3 ms,
// and one of 6,600 blocked until the timeout. Capture refuses parts longer
// than this with more than one local rank (one process per GPU has no limit).
inline constexpr size_t kCapturedOpsMax = 2048;
bool capture_fits(int local_ranks, size_t most_host_operations);

// An armed prepared call queues every operation behind its gate, which opens
// only at the trigger, after arm() returns; every handle of a rank waits on
// one armed stream. More than a stream's queue takes
// (dma::kQueueOpsBehindAWait) would block arm() itself. prepare() refuses a call of more than this many, and arm() one
// that would take the rank's handles armed and not yet triggered past it
// (the bound FERRY_KV_ARMED_MAX keeps for page transfers by default).
inline constexpr size_t kArmedOpsMax = 512;

}  // namespace ferry
