#include "topo/clock_sampler.hpp"

#include <algorithm>
#include <chrono>

namespace ferry {

ClockSummary summarize_clocks(const std::vector<ClockReading>& readings) {
  ClockSummary s;
  s.samples = static_cast<int>(readings.size());
  if (readings.empty()) return s;
  double mhz_sum = 0, mw_sum = 0;
  int with_clock = 0, with_power = 0, capped = 0, hot = 0;
  for (const auto& r : readings) {
    if (r.sm_mhz >= 0) {
      mhz_sum += r.sm_mhz;
      s.min_sm_mhz = with_clock == 0 ? r.sm_mhz : std::min(s.min_sm_mhz, r.sm_mhz);
      ++with_clock;
    }
    if (r.power_mw >= 0) {
      mw_sum += static_cast<double>(r.power_mw);
      ++with_power;
    }
    capped += (r.reasons & (kClockReasonPowerCap | kClockReasonPowerBrake)) != 0;
    hot += (r.reasons & kClockReasonThermal) != 0;
  }
  if (with_clock) s.mean_sm_mhz = mhz_sum / with_clock;
  if (with_power) s.mean_power_w = mw_sum / with_power / 1000.0;
  s.power_capped = static_cast<double>(capped) / s.samples;
  s.thermal = static_cast<double>(hot) / s.samples;
  return s;
}

ClockSampler::ClockSampler(std::string pci_bus_id, int period_us)
    : bus_(std::move(pci_bus_id)), period_us_(std::max(period_us, 50)) {}

ClockSampler::~ClockSampler() { halt(); }

void ClockSampler::halt() {
  running_ = false;
  if (thread_.joinable()) thread_.join();
}

void ClockSampler::start() {
  halt();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    readings_.clear();
  }
  running_ = true;
  thread_ = std::thread([this] {
    auto next = std::chrono::steady_clock::now();
    while (running_) {
      ClockReading r;
      if (read_clocks(bus_, &r)) {
        std::lock_guard<std::mutex> lock(mutex_);
        readings_.push_back(r);
      }
      // A slow reading delays the next one instead of bunching readings up.
      next = std::max(next + std::chrono::microseconds(period_us_), std::chrono::steady_clock::now());
      std::this_thread::sleep_until(next);
    }
  });
}

ClockSummary ClockSampler::stop() {
  halt();
  std::lock_guard<std::mutex> lock(mutex_);
  ClockSummary s = summarize_clocks(readings_);
  readings_.clear();
  return s;
}

}  // namespace ferry
