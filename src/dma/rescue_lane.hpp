// The stream the watchdog reaches GPU memory with when it must read a flag or
// release a wait that no peer will write (flags in GPU memory cannot be touched
// by the host directly).
//
// CUDA maps streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 by
// default) and a stream that shares a queue with a blocked stream (an armed
// collective's wait on its gate, a wait on a stuck peer) waits behind it: then
// the rescue that would unblock it can never run. A rescue stream that stays
// busy much longer than a rescue takes is therefore replaced by a new stream,
// which the driver puts on another queue, up to a bound. Old streams are kept
// until the lane is destroyed, so a stream handed out stays valid.
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <mutex>
#include <vector>

namespace ferry {

// A rescue is a few stream memory operations or one small copy: microseconds.
// Busy for this long, it waits behind something else.
constexpr double kRescueStuckAfterS = 0.1;
// More streams than the largest CUDA_DEVICE_MAX_CONNECTIONS (32): every
// hardware queue is tried once before the lane gives up.
constexpr size_t kMaxRescueStreams = 40;

enum class RescueStep {
  kUse,      // the current stream is idle: queue the rescue there
  kWait,     // busy, not for long (or no stream left to try): not now
  kReplace,  // busy too long: make a new stream and queue the rescue there
};

// Pure: what to do given whether the current stream is idle, for how long it
// has been seen busy, and how many streams the lane has made.
RescueStep rescue_step(bool idle, double busy_for_s, size_t streams_made);

class RescueLane {
 public:
  explicit RescueLane(int device);
  ~RescueLane();
  RescueLane(const RescueLane&) = delete;
  RescueLane& operator=(const RescueLane&) = delete;

  // A stream with nothing queued on it (the current one, or a new one when the
  // current one is stuck), or nullptr: not now. Thread-safe; sets the device.
  cudaStream_t idle();
  // Every stream the lane made (for a bounded drain on close).
  std::vector<cudaStream_t> streams() const;

 private:
  int device_;
  mutable std::mutex mu_;
  std::vector<cudaStream_t> streams_;  // the last one is current
  bool busy_seen_ = false;
  std::chrono::steady_clock::time_point busy_since_;
};

}  // namespace ferry
