// What a GPU's clocks did over a stretch of time: an NVML reading every
// period on a thread of its own (SM clock, instantaneous power, and the
// reasons the driver gives for holding clocks down). ferry bench --overlap
// uses it to tell a compute kernel slowed by SMs or memory taken from it from
// one slowed by a GPU that lowered its clocks to stay within its power limit.
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ferry {

// NVML's clocks-event reasons (nvmlClocksEventReason*), the bits we report.
constexpr unsigned long long kClockReasonPowerCap = 0x4;         // software power cap
constexpr unsigned long long kClockReasonThermal = 0x20 | 0x40;  // software and hardware thermal slowdown
constexpr unsigned long long kClockReasonPowerBrake = 0x80;      // hardware power brake

struct ClockReading {
  int sm_mhz = -1;          // -1: not available
  long long power_mw = -1;  // instantaneous board power; -1: not available
  unsigned long long reasons = 0;
};

struct ClockSummary {
  int samples = 0;
  double mean_sm_mhz = 0;  // over the readings that have a clock
  int min_sm_mhz = 0;
  double mean_power_w = 0;  // over the readings that have a power; 0 when none has
  double power_capped = 0;  // share of readings with the power cap or power brake set
  double thermal = 0;       // share of readings with a thermal slowdown set
};

// Pure: the summary of a series of readings (CPU-tested).
ClockSummary summarize_clocks(const std::vector<ClockReading>& readings);

// One reading of the GPU with this PCI bus id; false without NVML or that GPU.
// Defined in nvml.cpp.
bool read_clocks(const std::string& pci_bus_id, ClockReading* out);

class ClockSampler {
 public:
  ClockSampler(std::string pci_bus_id, int period_us);
  ~ClockSampler();
  ClockSampler(const ClockSampler&) = delete;
  ClockSampler& operator=(const ClockSampler&) = delete;

  // Starts reading (discarding earlier readings); a running sampler restarts.
  void start();
  // Stops and summarizes what was read since start(), once: a second stop()
  // summarizes nothing.
  ClockSummary stop();

 private:
  void halt();

  std::string bus_;
  int period_us_;
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::mutex mutex_;
  std::vector<ClockReading> readings_;
};

}  // namespace ferry
