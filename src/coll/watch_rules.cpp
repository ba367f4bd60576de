#include "coll/watch_rules.hpp"

namespace ferry {

bool foreign_ready_is_mismatch(uint64_t seq, uint64_t peer_completed, bool late, bool grace_over) {
  if (seq == 0 || peer_completed >= seq) return false;
  return late || grace_over;
}

}  // namespace ferry
