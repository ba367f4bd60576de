// ferry's debug log: decisions and recoveries a user may want to see, on
// stderr, only with FERRY_DEBUG=1 (read once).
#pragma once

#include <string>

namespace ferry {

bool debug_enabled();
// One line "ferry: <message>" on stderr where FERRY_DEBUG is on.
void debug_log(const std::string& message);

}  // namespace ferry
