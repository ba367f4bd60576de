// Who sends and awaits a copy-engine exchange's two rounds of signals ("you
// may write into me", "your data is there"): small copy-engine copies and
// stream waits (no SM), or one single-block kernel per round
// (coll/signal_round.hpp: 5-13 us less per call on 2 H200s, but each round
// waits for an SM beside a GPU-filling kernel). Both write the same flags
// with the same values, so ranks need not agree. Pure, CPU-tested.
#pragma once

#include <string>

#include "core/error.hpp"

namespace ferry {

// kAuto: not decided here (a call: the tuning table's rule, else the
// communicator's FERRY_SIGNALS; a rule: the communicator's).
enum class Signals { kAuto = 0, kCopy = 1, kKernel = 2 };

// "auto", "copy", "kernel" ("sm", its first name, is still taken: algo="sm"
// is the SM path, another concept); anything else is an error that names `what`.
inline Signals parse_signals(const std::string& name, const char* what) {
  if (name == "auto" || name.empty()) return Signals::kAuto;
  if (name == "copy") return Signals::kCopy;
  if (name == "kernel" || name == "sm") return Signals::kKernel;
  throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(what) + " is '" + name +
                                                "'; expected 'auto', 'copy' (copy engines, no SM) or 'kernel' (a " +
                                                "one-block kernel per round)");
}

inline const char* signals_name(Signals s) {
  return s == Signals::kKernel ? "kernel" : s == Signals::kCopy ? "copy" : "auto";
}

// FERRY_SIGNALS, the communicator's default: true for "kernel" (or "sm"),
// false for "copy"; anything else is refused, naming the knob.
inline bool kernel_signals_default(const std::string& setting) {
  FERRY_ARG_CHECK(setting == "copy" || setting == "kernel" || setting == "sm",
                  "FERRY_SIGNALS=" + setting + ": expected 'copy' or 'kernel'");
  return setting != "copy";
}

// The call's choice wins, then the tuning table's rule, then FERRY_SIGNALS.
inline bool kernel_signals(Signals call, Signals rule, bool communicator_default) {
  if (call != Signals::kAuto) return call == Signals::kKernel;
  if (rule != Signals::kAuto) return rule == Signals::kKernel;
  return communicator_default;
}

}  // namespace ferry
