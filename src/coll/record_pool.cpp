#include "coll/record_pool.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "core/env.hpp"
#include "core/error.hpp"

namespace ferry {
namespace {
constexpr size_t kLinesPerChunk = 1024;  // 64 KiB
}

// Runs `fn` with this thread allowed to make calls that a capture in global
// mode forbids: records are interned while a stream may be capturing a graph,
// and allocating or filling them is not stream work.
template <typename Fn>
static cudaError_t outside_capture(Fn fn) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t err = cudaThreadExchangeStreamCaptureMode(&mode);
  if (err != cudaSuccess) return err;
  err = fn();
  cudaThreadExchangeStreamCaptureMode(&mode);
  return err;
}

RecordPool::RecordPool(int device) : device_(device), device_records_(knob_string("FERRY_FLAG_SOURCE") == "device") {}

RecordPool::~RecordPool() {
  for (void* c : chunks_) cudaFreeHost(c);
  for (void* c : device_chunks_) cudaFree(c);
}

SourceSlot* RecordPool::device_copy(const SourceSlot& s) {
  constexpr size_t kPerChunk = 512;
  if (device_left_ == 0) {
    void* dev = nullptr;
    FERRY_CUDA_CHECK(outside_capture([&] { return cudaMalloc(&dev, kPerChunk * sizeof(SourceSlot)); }));
    device_chunks_.push_back(dev);
    device_next_ = static_cast<SourceSlot*>(dev);
    device_left_ = kPerChunk;
  }
  SourceSlot* out = device_next_++;
  --device_left_;
  // A synchronous copy on its own non-blocking stream: no implicit ordering
  // with the caller's streams, and the record is in place before any command
  // that reads it is enqueued.
  FERRY_CUDA_CHECK(outside_capture([&] {
    cudaStream_t st = nullptr;
    cudaError_t err = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    if (err == cudaSuccess) err = cudaMemcpyAsync(out, &s, sizeof(s), cudaMemcpyHostToDevice, st);
    if (err == cudaSuccess) err = cudaStreamSynchronize(st);
    if (st) cudaStreamDestroy(st);
    return err;
  }));
  return out;
}

Pinned<RecordPool::Line> RecordPool::lines(size_t n) {
  if (used_ + n > capacity_) {
    FERRY_CUDA_CHECK(cudaSetDevice(device_));
    void* host = nullptr;
    void* dev = nullptr;
    FERRY_CUDA_CHECK(outside_capture([&] {
      cudaError_t err =
          cudaHostAlloc(&host, kLinesPerChunk * sizeof(Line), cudaHostAllocPortable | cudaHostAllocMapped);
      return err == cudaSuccess ? cudaHostGetDevicePointer(&dev, host, 0) : err;
    }));
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
  if (device_records_) {
    FERRY_CUDA_CHECK(cudaSetDevice(device_));
    p.device = device_copy(s);
  }
  interned_.emplace(std::move(key), p);
  return p;
}

Pinned<uint64_t> RecordPool::word() {
  std::lock_guard<std::mutex> lock(mu_);
  auto l = lines(1);
  return Pinned<uint64_t>{reinterpret_cast<uint64_t*>(l.host), reinterpret_cast<uint64_t*>(l.device)};
}

}  // namespace ferry
