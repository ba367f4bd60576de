#include "core/log.hpp"

#include <cstdio>

#include "core/env.hpp"

namespace ferry {

bool debug_enabled() {
  static const bool on = [] {
    try {
      return knob_int("FERRY_DEBUG") > 0;
    } catch (const std::exception&) {
      return false;  // a malformed value must not make logging throw
    }
  }();
  return on;
}

void debug_log(const std::string& message) {
  if (!debug_enabled()) return;
  std::fprintf(stderr, "ferry: %s\n", message.c_str());
  std::fflush(stderr);
}

}  // namespace ferry
