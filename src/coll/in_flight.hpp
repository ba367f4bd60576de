// Tracks the collectives a rank has enqueued and not yet seen finish: a ring of
// slots, each with a completion event and the pinned source of its flags.
// The watchdog asks it for the oldest unfinished one.
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

class InFlight {
 public:
  using Clock = std::chrono::steady_clock;

  InFlight(int device, size_t capacity);
  ~InFlight();
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

  // Takes the slot for collective `seq`, first waiting (at most `timeout_s`)
  // for the collective that held it to finish. Its SourceSlot is free to fill.
  size_t begin(uint64_t seq, CollOp op, double timeout_s);
  // Marks the end of slot's collective in `stream`.
  void end(size_t slot, cudaStream_t stream);
  // Makes `stream` wait for the previous collective when that one was issued on
  // another stream: a rank's collectives run in call order whatever streams
  // carry them (peers' flags hold one collective at a time).
  void order_after_previous(cudaStream_t stream);

  SourceSlot* source_host(size_t slot) const { return &source_host_[slot]; }
  const SourceSlot* source_device(size_t slot) const { return &source_device_[slot]; }

  struct Pending {
    size_t slot;
    uint64_t seq;
    CollOp op;
    double age_s;
  };
  // The oldest collective not yet finished, if any (drops finished ones).
  std::optional<Pending> oldest_unfinished();
  // True when everything enqueued has finished.
  bool idle();

 private:
  struct Entry {
    cudaEvent_t event = nullptr;
    uint64_t seq = 0;
    CollOp op = CollOp::kAllGather;
    Clock::time_point enqueued;
    bool pending = false;
    cudaStream_t stream = nullptr;
  };
  bool finished(Entry& e);  // with mu_ held

  int device_;
  std::vector<Entry> entries_;
  SourceSlot* source_host_ = nullptr;
  SourceSlot* source_device_ = nullptr;
  size_t oldest_ = 0, next_ = 0;  // ring positions (monotonic counters)
  std::mutex mu_;
};

}  // namespace ferry
