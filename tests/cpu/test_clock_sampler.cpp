#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "topo/clock_sampler.hpp"

namespace ferry {

TEST(ClockSummary, MeansMinimumAndShares) {
  std::vector<ClockReading> r = {
      {1980, 600000, 0},
      {1830, 700000, kClockReasonPowerCap},
      {1755, 690000, kClockReasonPowerCap | 0x40},
      {1980, 610000, kClockReasonPowerBrake},
  };
  ClockSummary s = summarize_clocks(r);
  EXPECT_EQ(s.samples, 4);
  EXPECT_DOUBLE_EQ(s.mean_sm_mhz, (1980 + 1830 + 1755 + 1980) / 4.0);
  EXPECT_EQ(s.min_sm_mhz, 1755);
  EXPECT_DOUBLE_EQ(s.mean_power_w, (600 + 700 + 690 + 610) / 4.0);
  EXPECT_DOUBLE_EQ(s.power_capped, 0.75);
  EXPECT_DOUBLE_EQ(s.thermal, 0.25);
}

TEST(ClockSummary, MissingFieldsAreLeftOutOfTheirMeans) {
  std::vector<ClockReading> r = {{-1, 500000, 0}, {1500, -1, 0}, {1700, -1, 0}};
  ClockSummary s = summarize_clocks(r);
  EXPECT_DOUBLE_EQ(s.mean_sm_mhz, 1600.0);
  EXPECT_EQ(s.min_sm_mhz, 1500);
  EXPECT_DOUBLE_EQ(s.mean_power_w, 500.0);
  EXPECT_DOUBLE_EQ(s.power_capped, 0.0);
}

TEST(ClockSummary, NoReadings) {
  ClockSummary s = summarize_clocks({});
  EXPECT_EQ(s.samples, 0);
  EXPECT_DOUBLE_EQ(s.mean_sm_mhz, 0.0);
  EXPECT_DOUBLE_EQ(s.mean_power_w, 0.0);
}

TEST(ClockSampler, WithoutNvmlStopsWithNoReadings) {
  // No GPU has this bus id, so every reading fails and none is kept.
  ClockSampler sampler("ffff:ff:ff.f", 100);
  sampler.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(sampler.stop().samples, 0);
  EXPECT_EQ(sampler.stop().samples, 0);  // stopping twice is harmless
}

}  // namespace ferry
