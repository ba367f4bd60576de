#include "coll/in_flight.hpp"

#include <thread>

#include "core/error.hpp"

namespace ferry {

InFlight::InFlight(int device, size_t capacity) : device_(device), entries_(capacity) {
  FERRY_CUDA_CHECK(cudaSetDevice(device));
  for (auto& e : entries_) FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&e.event, cudaEventDisableTiming));
  void* host = nullptr;
  FERRY_CUDA_CHECK(cudaHostAlloc(&host, capacity * sizeof(SourceSlot), cudaHostAllocPortable | cudaHostAllocMapped));
  source_host_ = static_cast<SourceSlot*>(host);
  void* dev = nullptr;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(&dev, host, 0));
  source_device_ = static_cast<SourceSlot*>(dev);
}

InFlight::~InFlight() {
  cudaSetDevice(device_);
  for (auto& e : entries_) cudaEventDestroy(e.event);
  if (source_host_) cudaFreeHost(source_host_);
}

bool InFlight::finished(Entry& e) {
  if (!e.pending) return true;
  cudaError_t err = cudaEventQuery(e.event);
  if (err == cudaErrorNotReady) return false;
  if (err != cudaSuccess) cudaGetLastError();  // a sticky error surfaces at the caller's next CUDA call
  e.pending = false;
  return true;
}

size_t InFlight::begin(uint64_t seq, CollOp op, double timeout_s) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::unique_lock<std::mutex> lock(mu_);
  size_t slot = next_ % entries_.size();
  while (!finished(entries_[slot])) {
    if (Clock::now() > deadline)
      throw_error(FERRY_ERROR_TIMEOUT, std::string(coll_op_name(op)) + " #" + std::to_string(seq) + ": " +
                                           std::to_string(entries_.size()) +
                                           " collectives are still unfinished after " + std::to_string(timeout_s) +
                                           " s; ferry bounds how many may be in flight");
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    lock.lock();
  }
  Entry& e = entries_[slot];
  e.seq = seq;
  e.op = op;
  return slot;
}

void InFlight::end(size_t slot, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry& e = entries_[slot];
  FERRY_CUDA_CHECK(cudaEventRecord(e.event, stream));
  e.stream = stream;
  e.enqueued = Clock::now();
  e.pending = true;
  ++next_;
}

void InFlight::order_after_previous(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (next_ == 0) return;
  Entry& prev = entries_[(next_ - 1) % entries_.size()];
  if (prev.pending && prev.stream != stream) FERRY_CUDA_CHECK(cudaStreamWaitEvent(stream, prev.event, 0));
}

std::optional<InFlight::Pending> InFlight::oldest_unfinished() {
  std::lock_guard<std::mutex> lock(mu_);
  while (oldest_ < next_) {
    Entry& e = entries_[oldest_ % entries_.size()];
    if (!finished(e)) {
      double age = std::chrono::duration<double>(Clock::now() - e.enqueued).count();
      return Pending{oldest_ % entries_.size(), e.seq, e.op, age};
    }
    ++oldest_;
  }
  return std::nullopt;
}

bool InFlight::idle() { return !oldest_unfinished().has_value(); }

}  // namespace ferry
