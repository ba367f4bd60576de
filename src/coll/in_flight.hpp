// Tracks the collectives a rank has enqueued and not yet seen finish: a ring of
// slots, each with a completion event and what the watchdog needs to explain a
// stuck one. A prepared collective's slot carries a gate (its trigger word):
// its clock starts when the trigger is seen, not when it was armed. A gate in
// GPU memory is seen through a host copy that the watchdog refreshes.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "coll/flags.hpp"
#include "coll/plan.hpp"

namespace ferry {

// What a rank expects from its peers for one collective.
struct Expectation {
  uint64_t seq = 0;
  CollOp op = CollOp::kAllGather;
  uint64_t value = 0;
  const ReadyRecord* record = nullptr;  // host view: what this rank was called with
  uint64_t targets_mask = 0;
  uint64_t sources_mask = 0;
};

// The trigger word a prepared collective waits on. `host` is what the host
// reads: the gate itself (pinned host memory), or, for a gate in GPU memory
// (`device` set), a host copy that the watchdog refreshes (Rescue::mirror_gate).
struct Gate {
  volatile uint64_t* host = nullptr;
  const uint64_t* device = nullptr;
  uint64_t value = 0;
};

class InFlight {
 public:
  using Clock = std::chrono::steady_clock;

  InFlight(int device, size_t capacity);
  ~InFlight();
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

  // Takes a slot, first waiting (at most `timeout_s`) for the collective that
  // held it to finish. The collective is watched from here, while it is
  // enqueued: a call of many rounds can fill its stream's queue, and then the
  // host waits inside CUDA for waits only the watchdog may release. With a
  // gate, the slot's clock starts once *gate.host == gate.value.
  size_t begin(const Expectation& e, double timeout_s, const Gate& gate = Gate{});
  // Marks the end of slot's collective in `stream`.
  void end(size_t slot, cudaStream_t stream);
  // A slot whose collective was not enqueued whole (its emission threw):
  // what was enqueued stays watched until it ends on `stream` (the caller
  // fails the communicator, so the watchdog releases its waits).
  void abandon(size_t slot, cudaStream_t stream);
  // Makes `stream` wait for the previous collective when that one was issued on
  // another stream: a rank's collectives run in call order whatever streams
  // carry them (peers' flags hold one collective at a time).
  void order_after_previous(cudaStream_t stream);

  struct Pending {
    Expectation expect;
    double age_s;                      // since the trigger was seen (or since enqueued without a gate)
    bool waiting_for_trigger = false;  // then age_s counts from arming
    Gate gate;                         // when waiting for the trigger
  };
  // The oldest collective not yet finished, if any (drops finished ones).
  std::optional<Pending> oldest_unfinished();
  // True when everything enqueued has finished.
  bool idle();
  // How many collectives have finished, in order (for the shared progress record).
  uint64_t completed();

 private:
  struct Entry {
    cudaEvent_t event = nullptr;
    Expectation expect;
    Clock::time_point started;
    bool pending = false;
    bool enqueuing = false;  // between begin() and end(): no event recorded yet
    cudaStream_t stream = nullptr;
    Gate gate;  // host == nullptr: none, or seen open
  };
  bool finished(Entry& e);  // with mu_ held
  void drop_finished();     // with mu_ held

  int device_;
  std::vector<Entry> entries_;
  size_t oldest_ = 0, next_ = 0;  // ring positions (monotonic counters)
  uint64_t completed_ = 0;
  std::mutex mu_;
};

}  // namespace ferry
