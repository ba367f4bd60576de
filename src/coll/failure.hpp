// A communicator's failure: the first error it met, when, and whether a call
// has raised it yet. Any thread may record one (the watchdog, a call that
// found a fault); the first message stays. Calls raise it once as the error
// it is (FERRY_ERROR_TIMEOUT: a peer did not do its part), then as
// FERRY_ERROR_BROKEN naming it, until the communicator is closed.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

namespace ferry {

class Failure {
 public:
  using Clock = std::chrono::steady_clock;

  // Records `message` unless a failure was recorded already; true for the first.
  bool set(const std::string& message, Clock::time_point now = Clock::now());
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  // Throws the failure (see above); returns when there is none.
  void raise();

  struct Seen {
    bool broken = false;
    bool raised = false;  // a call has raised it
    double since_s = 0;   // since it was recorded
    std::string message;
  };
  Seen seen(Clock::time_point now = Clock::now()) const;

 private:
  mutable std::mutex mu_;
  std::string message_;
  Clock::time_point at_;
  bool raised_ = false;
  std::atomic<bool> broken_{false};
};

}  // namespace ferry
