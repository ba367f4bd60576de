// What the watchdog does to one local rank's GPU, on that rank's rescue
// stream (a highest-priority stream nothing else uses): copies its ready
// flags out to read them, refreshes a device gate's host copy, opens a gate,
// and writes the values a blocked stream waits for. The flags live in GPU
// memory, which the host cannot read or write directly, so stream operations
// do it. Nothing is queued behind an unfinished rescue, so the watchdog
// itself never blocks on the GPU. (Even with a single hardware queue the
// rescue stream never waited behind an armed stream in the GPU tests,
// test_untriggered_with_few_hardware_queues.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "coll/flags.hpp"
#include "coll/in_flight.hpp"

namespace ferry {

class Rescue {
 public:
  // `flags`: this rank's flags (GPU memory); `snapshot`: pinned host memory
  // for `world` ready records. Both outlive it.
  Rescue(int device, int world, cudaStream_t stream, DeviceFlags* flags, ReadyRecord* snapshot)
      : device_(device), world_(world), stream_(stream), flags_(flags), snapshot_(snapshot) {}

  // Copies the ready flags into snapshot() and waits briefly for the copy;
  // false when that cannot be done now (an earlier rescue still queued).
  bool snapshot_ready() const;
  const ReadyRecord* snapshot() const { return snapshot_; }
  // Refreshes a device gate's host copy (not waited for: read on the next look).
  void mirror_gate(const Gate& gate) const;
  // Opens a gate without its trigger (a failure, close): stores the value in
  // the host word, and a gate in GPU memory also gets a stream write (best
  // effort, like release_waits).
  void open_gate(const Gate& gate) const;
  // Writes `value` into the ready flags from `ready_peers` and the done flags
  // from `done_peers` (bit masks of ranks), unless an earlier rescue is still queued.
  void release_waits(uint64_t value, uint64_t ready_peers, uint64_t done_peers) const;

 private:
  int device_;
  int world_;
  cudaStream_t stream_;
  DeviceFlags* flags_;
  ReadyRecord* snapshot_;
};

}  // namespace ferry
