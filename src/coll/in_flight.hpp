// Tracks the collectives a rank has enqueued and not yet seen finish: a ring of
// slots, each with a completion event and what the watchdog needs to explain a
// stuck one. A prepared collective's slot carries a gate (its trigger word):
// its clock starts when the trigger is seen, not when it was armed.
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

class InFlight {
 public:
  using Clock = std::chrono::steady_clock;

  InFlight(int device, size_t capacity);
  ~InFlight();
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

  // Takes a slot, first waiting (at most `timeout_s`) for the collective that
  // held it to finish.
  size_t begin(const Expectation& e, double timeout_s);
  // Marks the end of slot's collective in `stream`. With a gate, the slot's
  // clock starts once *gate == gate_value.
  void end(size_t slot, cudaStream_t stream, const volatile uint64_t* gate = nullptr, uint64_t gate_value = 0);
  // Makes `stream` wait for the previous collective when that one was issued on
  // another stream: a rank's collectives run in call order whatever streams
  // carry them (peers' flags hold one collective at a time).
  void order_after_previous(cudaStream_t stream);

  struct Pending {
    Expectation expect;
    double age_s;                      // since the trigger was seen (or since enqueued without a gate)
    bool waiting_for_trigger = false;  // then age_s counts from arming
  };
  // The oldest collective not yet finished, if any (drops finished ones).
  std::optional<Pending> oldest_unfinished();
  // True when everything enqueued has finished.
  bool idle();
  // How many collectives have finished, in order (for the shared progress record).
  uint64_t completed();
  // Writes the oldest collective's trigger value into its gate (watchdog only).
  void open_gate_of_oldest();

 private:
  struct Entry {
    cudaEvent_t event = nullptr;
    Expectation expect;
    Clock::time_point started;
    bool pending = false;
    cudaStream_t stream = nullptr;
    const volatile uint64_t* gate = nullptr;
    uint64_t gate_value = 0;
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
