#include "sync/gate.hpp"

#include "core/error.hpp"
#include "dma/engine.hpp"

namespace ferry {
namespace gate {

// At least `value`, not equal to it: generations only grow, so an arming whose
// gate was opened again for a later arming before the stream reached this
// wait must still pass (with an equality wait it would hang).
void wait_on_stream(cudaStream_t stream, const uint64_t* device_word, uint64_t value) {
  dma::mem_ops(stream, {MemOp{MemOp::Kind::kWaitAtLeast, device_word, value}});
}

void open_from_host(volatile uint64_t* host_word, uint64_t value) {
  __atomic_store_n(const_cast<uint64_t*>(host_word), value, __ATOMIC_RELEASE);
}

void open_on_stream(cudaStream_t stream, uint64_t* device_word, uint64_t value) {
  dma::mem_ops(stream, {MemOp{MemOp::Kind::kWrite, device_word, value}});
}

}  // namespace gate

HostGate::HostGate() {
  void* p = nullptr;
  // A line of its own: the word is polled by a copy engine across PCIe.
  FERRY_CUDA_CHECK(cudaHostAlloc(&p, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  host_ = static_cast<volatile uint64_t*>(p);
  *host_ = 0;
  void* d = nullptr;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
  device_ = static_cast<uint64_t*>(d);
}

HostGate::~HostGate() {
  if (host_ && owned_) cudaFreeHost(const_cast<uint64_t*>(host_));
}

uint64_t HostGate::arm(cudaStream_t stream) {
  gate::wait_on_stream(stream, device_, generation_ + 1);
  return ++generation_;
}

void HostGate::open() { gate::open_from_host(host_, generation_); }

void HostGate::open_on(cudaStream_t stream) { gate::open_on_stream(stream, device_, generation_); }

uint64_t HostGate::value() const { return __atomic_load_n(const_cast<uint64_t*>(host_), __ATOMIC_ACQUIRE); }

bool HostGate::is_open() const { return value() >= generation_; }

}  // namespace ferry
