#include "dma/submit_threads.hpp"

#include <cuda_runtime_api.h>

#include "core/error.hpp"

namespace ferry {

SubmitThreads::SubmitThreads(int device) : device_(device) {}

SubmitThreads::~SubmitThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

int SubmitThreads::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(threads_.size());
}

void SubmitThreads::run(int n, const std::function<void(int)>& task) {
  if (n <= 1) {
    if (n == 1) task(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (busy_) throw_error(FERRY_ERROR_INTERNAL, "SubmitThreads::run: called while another run is in progress");
    while (static_cast<int>(threads_.size()) < n - 1) {
      const int index = static_cast<int>(threads_.size());
      threads_.emplace_back([this, index] { loop(index); });
    }
    busy_ = true;
    task_ = &task;
    n_ = n;
    pending_ = n - 1;
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr mine;
  try {
    task(0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  // Every other task has returned before this does: `task` and what it
  // refers to live in the caller's frame.
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  task_ = nullptr;
  busy_ = false;
  std::exception_ptr theirs = error_;
  error_ = nullptr;
  lock.unlock();
  if (mine) std::rethrow_exception(mine);
  if (theirs) std::rethrow_exception(theirs);
}

// Pool thread `index` runs task(index + 1) of each run that has that many tasks.
void SubmitThreads::loop(int index) {
  uint64_t seen = 0;
  bool on_device = false;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index + 1 >= n_) continue;
    const auto* task = task_;
    lock.unlock();
    std::exception_ptr error;
    try {
      if (!on_device && device_ >= 0) {
        FERRY_CUDA_CHECK(cudaSetDevice(device_));
        on_device = true;
      }
      (*task)(index + 1);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

}  // namespace ferry
