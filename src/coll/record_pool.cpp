#include "coll/record_pool.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "core/error.hpp"

namespace ferry {
namespace {
constexpr size_t kLinesPerChunk = 1024;  // 64 KiB
}

RecordPool::RecordPool(int device) : device_(device) {}

RecordPool::~RecordPool() {
  for (void* c : chunks_) cudaFreeHost(c);
}

Pinned<RecordPool::Line> RecordPool::lines(size_t n) {
  if (used_ + n > capacity_) {
    FERRY_CUDA_CHECK(cudaSetDevice(device_));
    // Records are interned while a stream may be capturing a graph: an
    // allocation is not stream work, so let it through.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    FERRY_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    void* host = nullptr;
    void* dev = nullptr;
    cudaError_t err = cudaHostAlloc(&host, kLinesPerChunk * sizeof(Line), cudaHostAllocPortable | cudaHostAllocMapped);
    if (err == cudaSuccess) err = cudaHostGetDevicePointer(&dev, host, 0);
    cudaThreadExchangeStreamCaptureMode(&mode);
    FERRY_CUDA_CHECK(err);
    std::memset(host, 0, kLinesPerChunk * sizeof(Line));
    chunks_.push_back(host);
    current_ = Pinned<Line>{static_cast<Line*>(host), static_cast<Line*>(dev)};
    used_ = 0;
    capacity_ = kLinesPerChunk;
  }
  Pinned<Line> out{current_.host + used_, current_.device + used_};
  used_ += n;
  return out;
}

Pinned<SourceSlot> RecordPool::intern(const SourceSlot& s) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string key(reinterpret_cast<const char*>(&s), sizeof(s));
  auto it = interned_.find(key);
  if (it != interned_.end()) return it->second;
  static_assert(sizeof(SourceSlot) % sizeof(Line) == 0, "records are whole lines");
  auto l = lines(sizeof(SourceSlot) / sizeof(Line));
  Pinned<SourceSlot> p{reinterpret_cast<SourceSlot*>(l.host), reinterpret_cast<SourceSlot*>(l.device)};
  std::memcpy(p.host, &s, sizeof(s));
  interned_.emplace(std::move(key), p);
  return p;
}

Pinned<uint64_t> RecordPool::word() {
  std::lock_guard<std::mutex> lock(mu_);
  auto l = lines(1);
  return Pinned<uint64_t>{reinterpret_cast<uint64_t*>(l.host), reinterpret_cast<uint64_t*>(l.device)};
}

}  // namespace ferry
