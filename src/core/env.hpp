// Every environment knob ferry reads, declared once. `ferry doctor` prints the table.
#pragma once

#include <climits>
#include <string>
#include <vector>

namespace ferry {

struct Knob {
  const char* name;
  const char* type;  // "int", "float", "string"
  const char* default_value;
  const char* doc;
  // An "int" or "float" knob's values: knob_int_in and knob_float_in refuse
  // others, ferry doctor shows them and flags a setting outside them.
  long long lo = LLONG_MIN;
  long long hi = LLONG_MAX;
};

const std::vector<Knob>& knobs();

// Value of a declared knob (the environment's, else its default). Throws on
// an undeclared name, so every read goes through the table.
std::string knob_string(const char* name);
long long knob_int(const char* name);
// knob_int within the range the knob table declares for it, else an error
// naming the knob and the range (a negative number cast to a size would be a
// huge one).
long long knob_int_in(const char* name);
// A knob's range as its errors and ferry doctor write it ("1..64", "at least
// 65536", "0..2^40"); "" for a knob without one.
std::string knob_range(const Knob& k);
// What is wrong with this process's setting of `k`: for a knob with a range,
// a value not of its type or outside it; for a float knob without one, a
// value that is not a number (FERRY_TIMEOUT_S: also out of its bounds). ""
// where it is unset or fine.
std::string knob_problem(const Knob& k);
double knob_float(const char* name);
// knob_float, finite and within the range the knob table declares for it,
// else an error naming the knob and the range.
double knob_float_in(const char* name);

// Seconds every bounded wait waits at most: `given` where it is positive,
// else FERRY_TIMEOUT_S. Refuses, naming `what` or the knob, a bound that is
// not a number, infinite, or past kMaxTimeoutS (a deadline that far overflows
// the clocks' integer durations; a knob of 0 or less would time out at once).
constexpr double kMaxTimeoutS = 1e6;
double timeout_seconds(double given, const char* what);
// The bound a teardown waits, which cannot refuse a knob: FERRY_TIMEOUT_S
// within (0, kMaxTimeoutS], its default where it is not a number or not
// positive.
double teardown_timeout_seconds() noexcept;

// Knobs every rank of a job must set alike. knob_settings: this process's
// raw settings of `names` as one record ("=value" or "unset" per knob);
// knob_mismatch: "" when every rank's record (by rank) equals `mine` (rank
// `me`'s), else a message naming the first knob and rank that differ.
std::string knob_settings(const std::vector<const char*>& names);
std::string knob_mismatch(const std::vector<const char*>& names, const std::vector<std::string>& records, int me);

}  // namespace ferry
