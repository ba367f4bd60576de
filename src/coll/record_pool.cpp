#include "coll/record_pool.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "core/error.hpp"
#include "core/host_trace.hpp"

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

RecordPool::RecordPool(int device) : device_(device) {}

RecordPool::~RecordPool() {
  for (void* c : chunks_) cudaFreeHost(c);
  for (void* c : device_chunks_) cudaFree(c);
}

// One 64-byte line of GPU memory. Allocated, never filled from the host: no
// stream is involved, so this cannot wait behind an armed stream that shares a
// hardware queue with it.
uint64_t* RecordPool::device_line() {
  if (device_left_ == 0) {
    HostTraceScope t(HostStage::kPoolGrowth);
    void* dev = nullptr;
    FERRY_CUDA_CHECK(cudaSetDevice(device_));
    FERRY_CUDA_CHECK(outside_capture([&] { return cudaMalloc(&dev, kLinesPerChunk * sizeof(Line)); }));
    device_chunks_.push_back(dev);
    device_next_ = static_cast<Line*>(dev);
    device_left_ = kLinesPerChunk;
  }
  --device_left_;
  return reinterpret_cast<uint64_t*>(device_next_++);
}

Pinned<RecordPool::Line> RecordPool::lines(size_t n) {
  if (used_ + n > capacity_) {
    HostTraceScope t(HostStage::kPoolGrowth);
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

Record RecordPool::intern(const ReadyRecord& s) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string key(reinterpret_cast<const char*>(&s), sizeof(s));
  auto it = interned_.find(key);
  if (it != interned_.end()) return it->second;
  static_assert(sizeof(ReadyRecord) == sizeof(Line), "a record is one line");
  auto l = lines(1);
  Record r{reinterpret_cast<ReadyRecord*>(l.host), reinterpret_cast<ReadyRecord*>(l.device), device_line()};
  std::memcpy(r.host, &s, sizeof(s));
  interned_.emplace(std::move(key), r);
  return r;
}

Pinned<ReadyRecord> RecordPool::records(size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (n > kLinesPerChunk) throw_error(FERRY_ERROR_INTERNAL, "RecordPool::records: more than one chunk asked for");
  auto l = lines(n);
  return Pinned<ReadyRecord>{reinterpret_cast<ReadyRecord*>(l.host), reinterpret_cast<ReadyRecord*>(l.device)};
}

Pinned<uint64_t> RecordPool::word() {
  std::lock_guard<std::mutex> lock(mu_);
  auto l = lines(1);
  return Pinned<uint64_t>{reinterpret_cast<uint64_t*>(l.host), reinterpret_cast<uint64_t*>(l.device)};
}

}  // namespace ferry
