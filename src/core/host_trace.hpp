// Where the host's time goes in one collective call, stage by stage
// (FERRY_HOST_TRACE=1; printed to stderr when a communicator closes). Small
// collectives are bound by host enqueue time, so this is how we find it.
// FERRY_HOST_TRACE=2 also prints every stage as it begins and ends: the last
// line without its end names the CUDA call that a stuck host is inside.
#pragma once

#include <chrono>

namespace ferry {

enum class HostStage {
  kBuild,
  kInFlight,
  kReady,
  kBefore,
  kLocal,
  kPushes,
  kDone,
  kAfter,
  kReplay,
  kCapture,
  kGraphLaunch,
  kPoolGrowth,
  kRun,
  kCount
};

// 0: off; 1: means per stage; 2: also each stage's begin and end, as they happen.
int host_trace_level();
inline bool host_trace_enabled() { return host_trace_level() > 0; }
void host_trace_add(HostStage stage, double us);
// Level 2: one line to stderr, "ferry trace <what>", flushed.
void host_trace_event(HostStage stage, const char* what, double us = -1);
// Level 2: which rank the stages that follow belong to.
void host_trace_rank(const char* what, int rank, int device);
// Prints the means so far to stderr and starts over.
void host_trace_report();

// Adds the scope's duration to `stage` when tracing is on.
class HostTraceScope {
 public:
  explicit HostTraceScope(HostStage stage) : stage_(stage), level_(host_trace_level()) {
    if (level_ == 0) return;
    if (level_ > 1) host_trace_event(stage_, "begin");
    start_ = std::chrono::steady_clock::now();
  }
  ~HostTraceScope() {
    if (level_ == 0) return;
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count();
    host_trace_add(stage_, us);
    if (level_ > 1) host_trace_event(stage_, "end", us);
  }
  HostTraceScope(const HostTraceScope&) = delete;
  HostTraceScope& operator=(const HostTraceScope&) = delete;

 private:
  HostStage stage_;
  int level_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ferry
