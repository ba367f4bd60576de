#include "coll/watch_rules.hpp"

#include <algorithm>

namespace ferry {

bool foreign_ready_is_mismatch(uint64_t seq, uint64_t peer_completed, bool late, bool grace_over) {
  if (seq == 0 || peer_completed >= seq) return false;
  return late || grace_over;
}

CalledApart called_apart(uint64_t theirs, uint64_t ours, uint64_t sm_path_tag, bool peer_ready_read_empty) {
  if (theirs == ours) return CalledApart::kSame;
  if ((theirs ^ ours) & sm_path_tag) return CalledApart::kOtherPath;
  return peer_ready_read_empty ? CalledApart::kOtherArguments : CalledApart::kSame;
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

std::string describe_ranks_without_cuda(const std::vector<RankSeen>& ranks) {
  uint64_t furthest = 0;
  for (const RankSeen& p : ranks)
    if (!p.exited) furthest = std::max(furthest, p.called);
  std::vector<std::string> exited, behind, rest;
  for (const RankSeen& p : ranks) {
    const std::string who = "rank " + std::to_string(p.rank) + (p.here ? " (this process)" : "");
    if (p.exited) {
      exited.push_back(who + " (pid " + std::to_string(p.pid) + ") has exited");
      continue;
    }
    std::string counts = "called collective #" + std::to_string(p.called) + ", finished #" + std::to_string(p.finished);
    (p.called < furthest ? behind : rest).push_back(who + (p.called < furthest ? " is behind: " : ": ") + counts);
  }
  std::string out;
  for (const auto* group : {&exited, &behind, &rest})
    for (const std::string& line : *group) out += (out.empty() ? "" : "; ") + line;
  return out;
}

}  // namespace ferry
