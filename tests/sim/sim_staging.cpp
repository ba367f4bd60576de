// The simulated GPUs have no virtual memory management for a symmetric heap:
// the engine's staging here is the fallback, plain allocations, which the
// fake runtime can refuse (a relay GPU short of memory).
#include "xfer/relay_staging.hpp"

namespace ferry {
namespace xfer {

std::unique_ptr<RelayStaging> RelayStaging::make(const std::vector<int>& devices, const std::vector<int>& need,
                                                 size_t bytes, std::vector<std::vector<char*>>* buffers,
                                                 std::vector<std::string>* why) {
  return plain(devices, need, bytes, buffers, why);
}

}  // namespace xfer
}  // namespace ferry
