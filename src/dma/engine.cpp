#include "dma/engine.hpp"

#include <atomic>
#include <chrono>
#include <thread>

#include "core/driver.hpp"
#include "core/env.hpp"
#include "core/error.hpp"

namespace ferry {
namespace dma {
namespace {

// Set once a driver refuses cudaMemcpyBatchAsync, so later calls skip it.
std::atomic<bool> g_batch_unsupported{false};

constexpr unsigned kMaxMemOpsPerBatch = 255;

// GEQ compares as (int64_t)(*addr - value) >= 0: a counter that grows past
// the value still satisfies the wait.
unsigned wait_flag(MemOp::Kind k) {
  return k == MemOp::Kind::kWaitAtLeast ? CU_STREAM_WAIT_VALUE_GEQ : CU_STREAM_WAIT_VALUE_EQ;
}

}  // namespace

bool is_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FERRY_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

bool is_legacy_default(cudaStream_t stream) { return stream == nullptr || stream == cudaStreamLegacy; }

int stream_device(cudaStream_t stream, int gpu) {
  if (is_legacy_default(stream) || stream == cudaStreamPerThread || is_capturing(stream)) return gpu;
  int device = gpu;
  if (cudaStreamGetDevice(stream, &device) != cudaSuccess) {
    cudaGetLastError();
    return gpu;
  }
  return device;
}

void copy_one(cudaStream_t stream, const Copy& c) {
  if (c.bytes == 0) return;
  FERRY_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, stream));
}

// Even a single copy goes through the batched call where possible: it carries
// the hint that keeps the copy on a copy engine (a plain cudaMemcpyAsync within
// one GPU may run as an SM kernel), and costs less host time per copy (on an H200
// host about 0.8 us per copy in a batch, 1.6 us for one cudaMemcpyPeerAsync).
void copy(cudaStream_t stream, const Copy& c) { copy_batch(stream, {c}); }

namespace {
bool batch_disabled() {
  static const bool disabled = knob_int("FERRY_DISABLE_BATCH") != 0;
  return disabled;
}
size_t knob_batch_max() {
  static const size_t most = static_cast<size_t>(std::max<long long>(1, knob_int("FERRY_BATCH_MAX")));
  return most;
}
}  // namespace

size_t copies_per_batch_call() { return batch_disabled() || g_batch_unsupported.load() ? 1 : knob_batch_max(); }

void copy_batch(cudaStream_t stream, const std::vector<Copy>& copies, bool settled_source, size_t batch_max) {
  if (copies.empty()) return;
  const bool disabled = batch_disabled();
  if (batch_max == 0) batch_max = knob_batch_max();
  Submission how =
      choose_submission(disabled, is_capturing(stream), is_legacy_default(stream), !g_batch_unsupported.load());
  if (how == Submission::kBatched) {
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    for (const auto& c : copies) {
      if (c.bytes == 0) continue;
      dsts.push_back(c.dst);
      srcs.push_back(c.src);
      sizes.push_back(c.bytes);
    }
    cudaMemcpyAttributes attr{};
    // The source is read in stream order unless the caller vouches that nothing
    // still writes it; the hint asks the driver for copy engines rather than SM copies.
    attr.srcAccessOrder = settled_source ? cudaMemcpySrcAccessOrderAny : cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_idx = 0;
    for (auto [b, e] : split_batches(dsts.size(), batch_max)) {
      cudaError_t err =
          cudaMemcpyBatchAsync(dsts.data() + b, srcs.data() + b, sizes.data() + b, e - b, &attr, &attr_idx, 1, stream);
      if (err == cudaErrorNotSupported || err == cudaErrorCallRequiresNewerDriver) {
        cudaGetLastError();
        g_batch_unsupported = true;
        for (size_t i = b; i < dsts.size(); ++i) copy_one(stream, Copy{dsts[i], srcs[i], sizes[i]});
        return;
      }
      FERRY_CUDA_CHECK(err);
    }
    return;
  }
  for (const auto& c : copies) copy_one(stream, c);
}

void copy_pitched(cudaStream_t stream, const std::vector<PitchedCopy>& copies, bool settled_source, size_t batch_max) {
  std::vector<Copy> single;
  for (const auto& c : copies) {
    if (c.width == 0 || c.rows == 0) continue;
    if (c.rows == 1) {
      single.push_back(c.row(0));
      continue;
    }
    FERRY_CUDA_CHECK(
        cudaMemcpy2DAsync(c.dst, c.dst_pitch, c.src, c.src_pitch, c.width, c.rows, cudaMemcpyDefault, stream));
  }
  copy_batch(stream, single, settled_source, batch_max);
}

void copy_rows_one_by_one(cudaStream_t stream, const std::vector<PitchedCopy>& copies) {
  for (const auto& c : copies)
    for (size_t i = 0; i < c.rows; ++i) copy_one(stream, c.row(i));
}

void wait_values(cudaStream_t stream, const std::vector<ValueWait>& waits) {
  std::vector<MemOp> ops;
  for (const auto& w : waits) ops.push_back(MemOp{MemOp::Kind::kWait, w.addr, w.value});
  mem_ops(stream, ops);
}

void mem_ops(cudaStream_t stream, const std::vector<MemOp>& ops) {
  if (ops.empty()) return;
  const DriverApi& cu = driver();
  auto cs = reinterpret_cast<CUstream>(stream);
  if (ops.size() == 1) {
    auto addr = reinterpret_cast<CUdeviceptr>(ops[0].addr);
    if (ops[0].kind != MemOp::Kind::kWrite)
      FERRY_CU_CHECK(cu.StreamWaitValue64(cs, addr, ops[0].value, wait_flag(ops[0].kind)));
    else
      FERRY_CU_CHECK(cu.StreamWriteValue64(cs, addr, ops[0].value, CU_STREAM_WRITE_VALUE_DEFAULT));
    return;
  }
  std::vector<CUstreamBatchMemOpParams> params(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    params[i] = CUstreamBatchMemOpParams{};
    if (ops[i].kind != MemOp::Kind::kWrite) {
      params[i].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
      params[i].waitValue.address = reinterpret_cast<CUdeviceptr>(ops[i].addr);
      params[i].waitValue.value64 = ops[i].value;
      params[i].waitValue.flags = wait_flag(ops[i].kind);
    } else {
      params[i].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
      params[i].writeValue.address = reinterpret_cast<CUdeviceptr>(ops[i].addr);
      params[i].writeValue.value64 = ops[i].value;
      params[i].writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
    }
  }
  for (size_t b = 0; b < params.size(); b += kMaxMemOpsPerBatch) {
    unsigned n = static_cast<unsigned>(std::min<size_t>(kMaxMemOpsPerBatch, params.size() - b));
    FERRY_CU_CHECK(cu.StreamBatchMemOp(cs, n, params.data() + b, 0));
  }
}

}  // namespace dma

namespace {
constexpr size_t kOrderEvents = 256;  // more than one fork + join of the largest world
}

EngineSet::EngineSet(int device, int peer_engines) : device_(device) {
  FERRY_CUDA_CHECK(cudaSetDevice(device));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&main_, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&armed_, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_, cudaStreamNonBlocking));
  int least = 0, greatest = 0;
  FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&rescue_, cudaStreamNonBlocking, greatest));
  for (int i = 0; i < peer_engines; ++i) {
    cudaStream_t s = nullptr;
    FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    peers_.push_back(s);
  }
  for (size_t i = 0; i < kOrderEvents; ++i) {
    cudaEvent_t e = nullptr;
    FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
  }
}

EngineSet::~EngineSet() {
  cudaSetDevice(device_);
  for (auto e : events_) cudaEventDestroy(e);
  for (auto s : peers_) cudaStreamDestroy(s);
  if (main_) cudaStreamDestroy(main_);
  if (side_) cudaStreamDestroy(side_);
  if (armed_) cudaStreamDestroy(armed_);
  if (rescue_) cudaStreamDestroy(rescue_);
  if (capture_) cudaStreamDestroy(capture_);
}

bool EngineSet::synchronize(double timeout_s) {
  cudaSetDevice(device_);
  std::vector<cudaStream_t> all = {main_, side_, armed_, rescue_};
  all.insert(all.end(), peers_.begin(), peers_.end());
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                         std::chrono::duration<double>(timeout_s));
  for (auto s : all) {
    while (cudaStreamQuery(s) == cudaErrorNotReady) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  cudaGetLastError();
  return true;
}

// Re-recording an event is safe once the waits on its earlier record are
// enqueued: cudaStreamWaitEvent captures the event's state at call time.
cudaEvent_t EngineSet::next_event() { return events_[next_event_++ % events_.size()]; }

void EngineSet::order(cudaStream_t from, cudaStream_t to) {
  cudaEvent_t e = next_event();
  FERRY_CUDA_CHECK(cudaEventRecord(e, from));
  FERRY_CUDA_CHECK(cudaStreamWaitEvent(to, e, 0));
}

void EngineSet::fork(cudaStream_t from, int n) {
  cudaEvent_t e = next_event();
  FERRY_CUDA_CHECK(cudaEventRecord(e, from));
  for (int i = 0; i < n; ++i) FERRY_CUDA_CHECK(cudaStreamWaitEvent(peers_[i], e, 0));
}

void EngineSet::join(cudaStream_t to, int n) {
  for (int i = 0; i < n; ++i) order(peers_[i], to);
}

}  // namespace ferry
