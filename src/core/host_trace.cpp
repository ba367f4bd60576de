#include "core/host_trace.hpp"

#include <atomic>
#include <cstdio>

#include "core/env.hpp"

namespace ferry {
namespace {

constexpr int kStages = static_cast<int>(HostStage::kCount);
const char* const kNames[kStages] = {"build",        "in_flight",     "ready copies", "before memops", "local copy",
                                     "pushes",       "done copies",   "after memops", "replay lookup", "capture",
                                     "graph launch", "record growth", "run (total)"};

struct Totals {
  std::atomic<long long> calls[kStages] = {};
  std::atomic<long long> ns[kStages] = {};
};

Totals& totals() {
  static Totals t;
  return t;
}

}  // namespace

int host_trace_level() {
  static const int level = static_cast<int>(knob_int("FERRY_HOST_TRACE"));
  return level;
}

void host_trace_event(HostStage stage, const char* what, double us) {
  if (us < 0)
    std::fprintf(stderr, "ferry trace %s %s\n", kNames[static_cast<int>(stage)], what);
  else
    std::fprintf(stderr, "ferry trace %s %s %.1f us\n", kNames[static_cast<int>(stage)], what, us);
  std::fflush(stderr);
}

void host_trace_rank(const char* what, int rank, int device) {
  if (host_trace_level() < 2) return;
  std::fprintf(stderr, "ferry trace %s: rank %d on GPU %d\n", what, rank, device);
  std::fflush(stderr);
}

void host_trace_report() {
  Totals& t = totals();
  if (!host_trace_enabled() || t.calls[static_cast<int>(HostStage::kRun)] == 0) return;
  std::fprintf(stderr, "ferry host trace (mean us per occurrence of each stage):\n");
  for (int i = 0; i < kStages; ++i) {
    long long c = t.calls[i].exchange(0), ns = t.ns[i].exchange(0);
    if (c > 0) std::fprintf(stderr, "  %-14s %8.2f us  (%lld times)\n", kNames[i], ns / 1e3 / c, c);
  }
}

void host_trace_add(HostStage stage, double us) {
  int i = static_cast<int>(stage);
  totals().calls[i] += 1;
  totals().ns[i] += static_cast<long long>(us * 1e3);
}

}  // namespace ferry
