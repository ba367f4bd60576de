// The fallback staging: one cudaMalloc per buffer (relay_staging.hpp).
#include "xfer/relay_staging.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "core/cuda_scope.hpp"
#include "core/error.hpp"

namespace ferry {
namespace xfer {

namespace {

class PlainStaging final : public RelayStaging {
 public:
  std::string where() const override { return owned_.empty() ? "none" : "plain allocations"; }
  ~PlainStaging() override {
    for (const auto& [device, p] : owned_) {
      try {
        DeviceScope on(device);
        cudaFree(p);
      } catch (const std::exception&) {  // a broken device: its memory went with its context
      }
    }
  }
  std::vector<std::pair<int, void*>> owned_;
};

}  // namespace

std::vector<int> relay_staging_need(const std::vector<int>& devices, const std::vector<bool>& may_relay,
                                    int outstanding) {
  const size_t n = devices.size();
  std::vector<int> need(n, 0);
  for (size_t l = 0; l < n && l < may_relay.size(); ++l) {
    const bool first_of_its_gpu = std::find(devices.begin(), devices.end(), devices[l]) == devices.begin() + l;
    const bool other_gpu = std::any_of(devices.begin(), devices.end(), [&](int d) { return d != devices[l]; });
    if (may_relay[l] && (!first_of_its_gpu || other_gpu)) need[l] = outstanding;
  }
  return need;
}

StagingLayout plan_relay_staging(const std::vector<int>& devices, const std::vector<int>& need, size_t bytes) {
  constexpr size_t kAlign = size_t{64} << 10;  // as the driver's allocations at least are
  FERRY_ARG_CHECK(need.size() == devices.size(), "plan_relay_staging: need has " + std::to_string(need.size()) +
                                                     " entries for " + std::to_string(devices.size()) + " links");
  // Past 2^40 a buffer is no chunk's staging, and its stride could wrap.
  FERRY_ARG_CHECK(bytes >= 1 && bytes <= (size_t{1} << 40),
                  "plan_relay_staging: bytes is " + std::to_string(bytes) + "; expected 1..2^40");
  const size_t stride = (bytes + kAlign - 1) / kAlign * kAlign;
  StagingLayout out;
  out.gpu_of.assign(devices.size(), -1);
  out.offsets.assign(devices.size(), {});
  std::vector<size_t> used;  // by GPU: bytes given so far
  for (size_t l = 0; l < devices.size(); ++l) {
    if (need[l] <= 0) continue;
    const auto it = std::find(out.gpus.begin(), out.gpus.end(), devices[l]);
    const int g = static_cast<int>(it - out.gpus.begin());
    if (it == out.gpus.end()) {
      out.gpus.push_back(devices[l]);
      used.push_back(0);
    }
    out.gpu_of[l] = g;
    for (int k = 0; k < need[l]; ++k) {
      out.offsets[l].push_back(used[g]);
      used[g] += stride;
    }
  }
  for (size_t u : used) out.bytes_per_gpu = std::max(out.bytes_per_gpu, u);
  return out;
}

std::unique_ptr<RelayStaging> RelayStaging::plain(const std::vector<int>& devices, const std::vector<int>& need,
                                                  size_t bytes, std::vector<std::vector<char*>>* buffers,
                                                  std::vector<std::string>* why) {
  auto s = std::make_unique<PlainStaging>();
  buffers->assign(devices.size(), {});
  why->assign(devices.size(), "");
  for (size_t l = 0; l < devices.size(); ++l) {
    if (need[l] <= 0) continue;
    DeviceScope on(devices[l]);
    std::vector<void*> got;
    for (int k = 0; k < need[l]; ++k) {
      void* p = nullptr;
      const cudaError_t e = cudaMalloc(&p, bytes);
      if (e != cudaSuccess) {
        cudaGetLastError();
        (*why)[l] = "no room for its staging buffers (" + std::to_string(need[l]) + " x " + std::to_string(bytes) +
                    " bytes): " + cudaGetErrorName(e);
        for (void* q : got) cudaFree(q);
        got.clear();
        break;
      }
      got.push_back(p);
    }
    for (void* p : got) {
      s->owned_.emplace_back(devices[l], p);
      (*buffers)[l].push_back(static_cast<char*>(p));
    }
  }
  return s;
}

}  // namespace xfer
}  // namespace ferry
