#include "sync/gate.hpp"

#include <mutex>
#include <vector>

#include "core/error.hpp"
#include "dma/engine.hpp"
#include "sync/holds.hpp"

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

namespace {

// Gate words for every HostGate of the process, 64-byte lines carved from
// pinned pages that are never freed. Freeing pinned memory (cudaFreeHost)
// waits for the whole device, and a device with an armed gate on it waits
// for its trigger: a gate made and dropped while another one is armed (a
// refused prepare, a transfer destroyed) would hang if it owned its memory.
class GateWords {
 public:
  struct Word {
    volatile uint64_t* host;
    uint64_t* device;
  };

  Word take() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) grow();
    Word w = free_.back();
    free_.pop_back();
    *w.host = 0;
    return w;
  }

  // Back for reuse: no write to it may still be on its way (a gate that
  // cannot tell keeps its word instead).
  void give(Word w) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(w);
  }

 private:
  static constexpr size_t kLine = 64;  // the word is polled by a copy engine across PCIe: a line of its own
  static constexpr size_t kPage = 4096;

  void grow() {
    void* p = nullptr;
    FERRY_CUDA_CHECK(cudaHostAlloc(&p, kPage, cudaHostAllocMapped | cudaHostAllocPortable));
    void* d = nullptr;
    FERRY_CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
    for (size_t at = kPage; at >= kLine; at -= kLine)
      free_.push_back(Word{reinterpret_cast<volatile uint64_t*>(static_cast<char*>(p) + at - kLine),
                           reinterpret_cast<uint64_t*>(static_cast<char*>(d) + at - kLine)});
  }

  std::mutex mu_;
  std::vector<Word> free_;
};

GateWords& gate_words() {
  static auto* words = new GateWords;  // never destroyed: a stream may read a word until the process ends
  return *words;
}

}  // namespace

HostGate::HostGate() {
  GateWords::Word w = gate_words().take();
  host_ = w.host;
  device_ = w.device;
}

HostGate::~HostGate() {
  hold_.reset();  // before the word may go back
  if (host_ && owned_) gate_words().give(GateWords::Word{host_, device_});
}

uint64_t HostGate::arm(cudaStream_t stream) {
  gate::wait_on_stream(stream, device_, generation_ + 1);
  armed_to_.store(++generation_, std::memory_order_release);
  return generation_;
}

void HostGate::hold_while_armed(std::string what) {
  hold_ = std::make_unique<sync::Hold>(std::move(what),
                                       [this] { return value() < armed_to_.load(std::memory_order_acquire); });
}

void HostGate::open() { gate::open_from_host(host_, generation_); }

void HostGate::open_on(cudaStream_t stream) { gate::open_on_stream(stream, device_, generation_); }

uint64_t HostGate::value() const { return __atomic_load_n(const_cast<uint64_t*>(host_), __ATOMIC_ACQUIRE); }

bool HostGate::is_open() const { return value() >= generation_; }

}  // namespace ferry
