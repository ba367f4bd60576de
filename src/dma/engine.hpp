// The copy-engine command layer. A CUDA stream stands for a copy engine's queue
// (the driver maps streams onto the GPU's engines). Commands: a copy, a bounded
// batch of copies, a wait on a 64-bit value in memory, and a flag write to a
// peer, which is a small copy (writing another GPU's memory with
// cuStreamWriteValue hung on our machines; see docs/architecture.md).
// Nothing here launches a kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dma/batch_plan.hpp"

namespace ferry {

// One wait: until the 64-bit word at `addr` (device-visible) equals `value`.
struct ValueWait {
  const void* addr;
  uint64_t value;
};

// A stream memory operation: wait until the 64-bit word at `addr` equals
// `value` (kWaitAtLeast: is at least `value`, for counters that only grow), or
// write `value` there. Only local GPU memory or pinned host memory: writing
// another GPU's memory this way hung on our machines.
struct MemOp {
  enum class Kind { kWait, kWaitAtLeast, kWrite };
  Kind kind;
  const void* addr;
  uint64_t value;
};

namespace dma {

// Stream operations (copies, batched calls, memory-operation batches, kernel
// launches) one stream's queue takes behind a wait that has not been
// released before the host blocks inside CUDA: on an H200 the 1,024th
// blocked, for collectives' commands and for page transfers' batched calls
// alike. Kept under that by a margin.
inline constexpr size_t kQueueOpsBehindAWait = 960;

// One copy on a copy engine (batched call with the copy-engine hint where possible).
void copy(cudaStream_t stream, const Copy& c);
// One plain cudaMemcpyAsync (the driver picks how to run it).
void copy_one(cudaStream_t stream, const Copy& c);
// Submits `copies` (no order among them) on `stream` in batches of at most
// `batch_max` copies (0: FERRY_BATCH_MAX), or one by one where batching is
// not possible. With `settled_source` the engine may read the sources out of
// stream order (srcAccessOrder=Any): only where nothing enqueued before still
// writes them.
void copy_batch(cudaStream_t stream, const std::vector<Copy>& copies, bool settled_source = false,
                size_t batch_max = 0);
// Copies per host call copy_batch makes on a stream that is neither capturing
// nor the legacy default: FERRY_BATCH_MAX, or 1 where batching is off or
// the driver lacks the batched call.
size_t copies_per_batch_call();
// Submits `copies` (no order among them): single rows as copy_batch does,
// several rows as one cudaMemcpy2DAsync each (no batched form of it is
// cheaper on the host: cudaMemcpy3DBatchAsync took as long per copy).
void copy_pitched(cudaStream_t stream, const std::vector<PitchedCopy>& copies, bool settled_source = false,
                  size_t batch_max = 0);
// Each row of each copy with its own cudaMemcpyAsync (the per-page baseline).
void copy_rows_one_by_one(cudaStream_t stream, const std::vector<PitchedCopy>& copies);
// Blocks `stream` until every wait is satisfied (one cuStreamBatchMemOp per 255).
void wait_values(cudaStream_t stream, const std::vector<ValueWait>& waits);
// Enqueues `ops` in array order, which CUDA keeps inside one batch: a write
// after a wait happens only once the wait is satisfied.
void mem_ops(cudaStream_t stream, const std::vector<MemOp>& ops);

bool is_capturing(cudaStream_t stream);
bool is_legacy_default(cudaStream_t stream);
// The GPU `stream` belongs to. A default stream (null, legacy, per-thread)
// names no GPU of its own: it is taken as `gpu`'s (the caller's choice: torch
// takes the tensor's GPU, the CUDA runtime the current one); so is a
// capturing stream, which may not be asked.
int stream_device(cudaStream_t stream, int gpu);

}  // namespace dma

// The streams ferry issues copy-engine work on, for one GPU: `main` for batched
// (b2b) work and one per peer for parallel (pcpy) work.
class EngineSet {
 public:
  EngineSet(int device, int peer_engines);
  ~EngineSet();
  EngineSet(const EngineSet&) = delete;
  EngineSet& operator=(const EngineSet&) = delete;

  cudaStream_t main() const { return main_; }
  // Where a rank's own block is copied when that runs beside the pushes.
  cudaStream_t side() const { return side_; }
  // Where prepared collectives wait for their trigger.
  cudaStream_t armed() const { return armed_; }
  // Highest priority, used only by the watchdog to read flags and release a
  // failed collective's waits on GPU memory.
  cudaStream_t rescue() const { return rescue_; }
  // Only captures repeated calls into graphs (ReplayCache); never runs work.
  cudaStream_t capture() const { return capture_; }
  cudaStream_t peer(int i) const { return peers_[i]; }
  int peer_count() const { return static_cast<int>(peers_.size()); }

  // Host wait, at most `timeout_s`, for everything enqueued on these streams
  // (errors ignored: used on close). False when something is still running.
  bool synchronize(double timeout_s);

  // Makes `to` wait for everything enqueued so far on `from` (no host wait).
  void order(cudaStream_t from, cudaStream_t to);
  // Makes the first `n` peer engines wait for `from`.
  void fork(cudaStream_t from, int n);
  // Makes `to` wait for the first `n` peer engines.
  void join(cudaStream_t to, int n);

 private:
  int device_;
  cudaStream_t main_ = nullptr;
  cudaStream_t side_ = nullptr;
  cudaStream_t armed_ = nullptr;
  cudaStream_t rescue_ = nullptr;
  cudaStream_t capture_ = nullptr;
  std::vector<cudaStream_t> peers_;
  std::vector<cudaEvent_t> events_;  // ring used by order(), fork() and join()
  cudaEvent_t next_event();
  size_t next_event_ = 0;
};

}  // namespace ferry
