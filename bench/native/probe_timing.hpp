// Host clock and median shared by the probes in bench/probes/.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace ferry {
namespace probe {

inline double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The middle value (the upper one of an even count); `v` must not be empty.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace probe
}  // namespace ferry
