// Scoped CUDA thread state: the current device, and the stream-capture mode.
// Both give the caller's state back when they go, on every path.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.hpp"

namespace ferry {

// Makes `device` current for the scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    FERRY_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

// Relaxed stream-capture mode for this thread, where `relax` is true. While
// some stream captures a graph in the default (global) mode, a host-side call
// such as a pointer query, a pinned allocation or a free from any thread
// invalidates the capture; ferry's host-side work around a call must not.
class RelaxedCaptureScope {
 public:
  explicit RelaxedCaptureScope(bool relax = true) : on_(relax) {
    if (on_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  ~RelaxedCaptureScope() {
    if (on_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedCaptureScope(const RelaxedCaptureScope&) = delete;
  RelaxedCaptureScope& operator=(const RelaxedCaptureScope&) = delete;

 private:
  bool on_;
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace ferry
