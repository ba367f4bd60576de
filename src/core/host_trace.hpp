// Where the host's time goes in one collective call, stage by stage
// (FERRY_HOST_TRACE=1; printed to stderr when a communicator closes). Small
// collectives are bound by host enqueue time, so this is how we find it.
#pragma once

#include <chrono>

namespace ferry {

enum class HostStage { kBuild, kInFlight, kReady, kBefore, kLocal, kPushes, kDone, kAfter, kReplay, kRun, kCount };

bool host_trace_enabled();
void host_trace_add(HostStage stage, double us);
// Prints the means so far to stderr and starts over.
void host_trace_report();

// Adds the scope's duration to `stage` when tracing is on.
class HostTraceScope {
 public:
  explicit HostTraceScope(HostStage stage) : stage_(stage), on_(host_trace_enabled()) {
    if (on_) start_ = std::chrono::steady_clock::now();
  }
  ~HostTraceScope() {
    if (on_)
      host_trace_add(stage_,
                     std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start_).count());
  }
  HostTraceScope(const HostTraceScope&) = delete;
  HostTraceScope& operator=(const HostTraceScope&) = delete;

 private:
  HostStage stage_;
  bool on_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace ferry
