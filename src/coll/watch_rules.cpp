#include "coll/watch_rules.hpp"

namespace ferry {

bool foreign_ready_is_mismatch(uint64_t seq, uint64_t peer_completed, bool late, bool grace_over) {
  if (seq == 0 || peer_completed >= seq) return false;
  return late || grace_over;
}

ArmedLook look_at_armed(bool gate_on_device, double age_s, double read_after_s, double timeout_s) {
  if (age_s > timeout_s) return ArmedLook::kOpenGate;
  if (gate_on_device && age_s >= read_after_s) return ArmedLook::kReadGate;
  return ArmedLook::kNothing;
}

bool exit_undelivered_failure(double exit_after_s, bool failed, bool raised, double since_failure_s) {
  return exit_after_s > 0 && failed && !raised && since_failure_s >= exit_after_s;
}

bool exit_stuck_watchdog(double exit_after_s, double timeout_s, double stuck_s) {
  return exit_after_s > 0 && stuck_s > timeout_s + exit_after_s;
}

}  // namespace ferry
