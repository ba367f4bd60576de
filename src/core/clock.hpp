// One monotonic clock for deadlines, in seconds.
#pragma once

#include <chrono>

namespace ferry {

inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace ferry
