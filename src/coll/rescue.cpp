#include "coll/rescue.hpp"

#include <chrono>
#include <thread>
#include <vector>

#include "dma/engine.hpp"
#include "sync/gate.hpp"

namespace ferry {
namespace {

// How long a rescue waits for its stream to be idle, or for its snapshot copy.
constexpr std::chrono::milliseconds kRescueWait(20);

// The rescue stream once it is idle, waiting at most `limit` for that; else nullptr.
cudaStream_t idle(int device, cudaStream_t stream, std::chrono::microseconds limit = {}) {
  if (cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (cudaStreamQuery(stream) == cudaSuccess) return stream;
    cudaGetLastError();
    if (std::chrono::steady_clock::now() >= deadline) return nullptr;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

bool has(uint64_t mask, int q) { return (mask >> q) & 1; }

}  // namespace

bool Rescue::snapshot_ready() const {
  cudaStream_t s = idle(device_, stream_);
  if (!s) return false;
  if (cudaMemcpyAsync(snapshot_, flags_->ready, world_ * sizeof(ReadyRecord), cudaMemcpyDeviceToHost, s) !=
      cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  const auto deadline = std::chrono::steady_clock::now() + kRescueWait;
  while (cudaStreamQuery(s) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  cudaGetLastError();
  return true;
}

void Rescue::mirror_gate(const Gate& gate) const {
  cudaStream_t s = idle(device_, stream_);
  if (!s) return;
  if (cudaMemcpyAsync(const_cast<uint64_t*>(gate.host), gate.device, sizeof(uint64_t), cudaMemcpyDeviceToHost, s) !=
      cudaSuccess)
    cudaGetLastError();
}

void Rescue::open_gate(const Gate& gate) const {
  gate::open_from_host(gate.host, gate.value);
  if (!gate.device) return;
  // Opening is what frees the GPU: worth waiting a moment for a rescue that
  // is still running (a read of this gate, for instance).
  cudaStream_t s = idle(device_, stream_, kRescueWait);
  if (!s) return;
  try {
    gate::open_on_stream(s, const_cast<uint64_t*>(gate.device), gate.value);
  } catch (const std::exception&) {
    // A rescue that cannot be queued leaves the stream blocked.
  }
}

void Rescue::release_waits(uint64_t value, uint64_t ready_peers, uint64_t done_peers) const {
  if ((ready_peers | done_peers) == 0) return;
  cudaStream_t s = idle(device_, stream_, kRescueWait);
  if (!s) return;
  std::vector<MemOp> writes;
  for (int q = 0; q < world_; ++q) {
    if (has(ready_peers, q)) writes.push_back(MemOp{MemOp::Kind::kWrite, &flags_->ready[q].value, value});
    if (has(done_peers, q)) writes.push_back(MemOp{MemOp::Kind::kWrite, &flags_->done[q].value, value});
  }
  try {
    dma::mem_ops(s, writes);
  } catch (const std::exception&) {
    // The communicator has failed already; a release that cannot be queued leaves the stream blocked.
  }
}

}  // namespace ferry
