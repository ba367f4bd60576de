#include "dma/rescue_lane.hpp"

#include <cstdio>

#include "core/error.hpp"

namespace ferry {

RescueStep rescue_step(bool idle, double busy_for_s, size_t streams_made) {
  if (idle) return RescueStep::kUse;
  if (busy_for_s < kRescueStuckAfterS || streams_made >= kMaxRescueStreams) return RescueStep::kWait;
  return RescueStep::kReplace;
}

namespace {
cudaStream_t make_stream() {
  int least = 0, greatest = 0;
  FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  return s;
}
}  // namespace

RescueLane::RescueLane(int device) : device_(device) {
  FERRY_CUDA_CHECK(cudaSetDevice(device));
  streams_.push_back(make_stream());
}

RescueLane::~RescueLane() {
  cudaSetDevice(device_);
  for (auto s : streams_) cudaStreamDestroy(s);
}

cudaStream_t RescueLane::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudaSetDevice(device_) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  const bool idle = cudaStreamQuery(streams_.back()) == cudaSuccess;
  cudaGetLastError();
  const auto now = std::chrono::steady_clock::now();
  if (!idle && !busy_seen_) {
    busy_seen_ = true;
    busy_since_ = now;
  }
  const double busy_for = idle ? 0.0 : std::chrono::duration<double>(now - busy_since_).count();
  switch (rescue_step(idle, busy_for, streams_.size())) {
    case RescueStep::kUse:
      busy_seen_ = false;
      return streams_.back();
    case RescueStep::kWait:
      return nullptr;
    case RescueStep::kReplace:
      break;
  }
  cudaStream_t s = nullptr;
  try {
    s = make_stream();
  } catch (const std::exception&) {
    return nullptr;  // called from the watchdog: a rescue is best effort
  }
  streams_.push_back(s);
  busy_seen_ = false;
  if (streams_.size() == 2)  // once per GPU: it says why, and what avoids it
    std::fprintf(stderr,
                 "ferry: GPU %d: the watchdog's rescue stream stayed busy for %.2f s, likely behind a blocked stream "
                 "in a shared CUDA hardware queue; it goes on with a new stream (raising CUDA_DEVICE_MAX_CONNECTIONS, "
                 "e.g. to 32, "
                 "avoids this; docs/api.md, Prelaunch)\n",
                 device_, busy_for);
  return s;
}

std::vector<cudaStream_t> RescueLane::streams() const {
  std::lock_guard<std::mutex> lock(mu_);
  return streams_;
}

}  // namespace ferry
