// Host threads that submit copy-engine work at the same time. The driver lets
// batched copy submissions from several threads run partly in parallel (on
// one H200, 1024 page copies of 4 KB landed 1.48x sooner from four threads
// than from one, bench/probes/batch_threads.cu), while one thread spreading
// the same copies over several streams was slower than one stream.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace ferry {

class SubmitThreads {
 public:
  // The threads' current GPU is `device` (-1: left alone); threads are made
  // as first needed, then kept.
  explicit SubmitThreads(int device);
  ~SubmitThreads();
  SubmitThreads(const SubmitThreads&) = delete;
  SubmitThreads& operator=(const SubmitThreads&) = delete;

  // Runs task(i) for every i in [0, n) at once: task(0) on the calling
  // thread, the others on pool threads. Returns when all have returned; then
  // rethrows the first exception any of them threw. One run at a time per
  // pool: a second caller while one runs gets FERRY_ERROR_INTERNAL.
  void run(int n, const std::function<void(int)>& task);

  int threads() const;  // pool threads made so far

 private:
  void loop(int index);

  const int device_;
  mutable std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> threads_;
  const std::function<void(int)>* task_ = nullptr;
  int n_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  std::exception_ptr error_;
  bool busy_ = false;
  bool stop_ = false;
};

}  // namespace ferry
