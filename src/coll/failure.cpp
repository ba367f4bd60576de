#include "coll/failure.hpp"

#include "core/error.hpp"

namespace ferry {

bool Failure::set(const std::string& message, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool first = !broken_.load(std::memory_order_relaxed);
  if (first) {
    message_ = message;
    at_ = now;
    broken_.store(true, std::memory_order_release);
  }
  return first;
}

void Failure::raise() {
  if (!broken()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!raised_) {
    raised_ = true;
    throw_error(FERRY_ERROR_TIMEOUT, message_);
  }
  throw_error(FERRY_ERROR_BROKEN,
              "the communicator is broken by an earlier error (" + message_ + "); close it and create a new one");
}

Failure::Seen Failure::seen(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  Seen s;
  s.broken = broken_.load(std::memory_order_relaxed);
  if (!s.broken) return s;
  s.raised = raised_;
  s.since_s = std::chrono::duration<double>(now - at_).count();
  s.message = message_;
  return s;
}

}  // namespace ferry
