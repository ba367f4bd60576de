#include "coll/in_flight.hpp"

#include <thread>

#include "core/error.hpp"

namespace ferry {

InFlight::InFlight(int device, size_t capacity) : device_(device), entries_(capacity) {
  FERRY_CUDA_CHECK(cudaSetDevice(device));
  for (auto& e : entries_) FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&e.event, cudaEventDisableTiming));
}

InFlight::~InFlight() {
  cudaSetDevice(device_);
  for (auto& e : entries_) cudaEventDestroy(e.event);
}

bool InFlight::finished(Entry& e) {
  if (!e.pending) return true;
  if (e.enqueuing) return false;
  cudaError_t err = cudaEventQuery(e.event);
  if (err == cudaErrorNotReady) return false;
  if (err != cudaSuccess) cudaGetLastError();  // a sticky error surfaces at the caller's next CUDA call
  e.pending = false;
  return true;
}

void InFlight::drop_finished() {
  while (oldest_ < next_ && finished(entries_[oldest_ % entries_.size()])) {
    ++oldest_;
    ++completed_;
  }
}

size_t InFlight::begin(const Expectation& x, double timeout_s, const Gate& gate) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::unique_lock<std::mutex> lock(mu_);
  // A full ring's oldest slot is taken only once it is dropped, so that the
  // ring's oldest stays the oldest call. Only then: the event query is one
  // of the calls that invalidate a CUDA graph another thread captures in
  // global mode.
  while (next_ - oldest_ >= entries_.size()) {
    drop_finished();
    if (next_ - oldest_ < entries_.size()) break;
    if (Clock::now() > deadline)
      throw_error(FERRY_ERROR_TIMEOUT, std::string(coll_op_name(x.op)) + " #" + std::to_string(x.seq) + ": " +
                                           std::to_string(entries_.size()) +
                                           " collectives are still unfinished after " + std::to_string(timeout_s) +
                                           " s; ferry bounds how many may be in flight");
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lock.lock();
  }
  const size_t slot = next_ % entries_.size();
  Entry& e = entries_[slot];
  e.expect = x;
  e.started = Clock::now();
  e.gate = gate;
  e.stream = nullptr;
  e.pending = true;
  e.enqueuing = true;
  ++next_;
  return slot;
}

// CUDA calls here run outside mu_: with the stream's queue full they wait
// for the GPU, which may wait for a release from the watchdog, which takes
// mu_. (The watchdog never queries an enqueuing slot's event.)
void InFlight::end(size_t slot, cudaStream_t stream) {
  const cudaError_t err = cudaEventRecord(entries_[slot].event, stream);
  if (err != cudaSuccess) cudaGetLastError();
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[slot];
  e.enqueuing = false;
  e.stream = stream;
  e.started = Clock::now();
  if (err != cudaSuccess) {
    e.pending = false;
    FERRY_CUDA_CHECK(err);
  }
}

void InFlight::abandon(size_t slot, cudaStream_t stream) {
  const cudaError_t err = cudaEventRecord(entries_[slot].event, stream);
  if (err != cudaSuccess) cudaGetLastError();
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[slot];
  e.enqueuing = false;
  e.stream = stream;
  e.pending = err == cudaSuccess;  // else nothing shows when what was enqueued ends
}

void InFlight::order_after_previous(cudaStream_t stream) {
  cudaEvent_t wait_for = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (next_ == 0) return;
    const Entry& prev = entries_[(next_ - 1) % entries_.size()];
    if (prev.pending && !prev.enqueuing && prev.stream != stream) wait_for = prev.event;
  }
  if (wait_for) FERRY_CUDA_CHECK(cudaStreamWaitEvent(stream, wait_for, 0));
}

std::optional<InFlight::Pending> InFlight::oldest_unfinished() {
  std::lock_guard<std::mutex> lock(mu_);
  drop_finished();
  if (oldest_ == next_) return std::nullopt;
  Entry& e = entries_[oldest_ % entries_.size()];
  if (e.gate.host) {
    // Armed and waiting for its trigger is not a peer's failure; its clock
    // restarts at the trigger.
    if (*e.gate.host != e.gate.value)
      return Pending{e.expect, std::chrono::duration<double>(Clock::now() - e.started).count(), true, e.gate};
    e.gate = Gate{};
    e.started = Clock::now();
  }
  double age = std::chrono::duration<double>(Clock::now() - e.started).count();
  return Pending{e.expect, age, false, Gate{}};
}

bool InFlight::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  drop_finished();
  return oldest_ == next_;
}

uint64_t InFlight::completed() {
  std::lock_guard<std::mutex> lock(mu_);
  drop_finished();
  return completed_;
}

}  // namespace ferry
