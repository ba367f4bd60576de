#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "dma/submit_threads.hpp"

using namespace ferry;

TEST(SubmitThreads, RunsEveryTaskOnceOnItsOwnThread) {
  SubmitThreads pool(-1);
  for (int n : {0, 1, 2, 4, 3, 8, 1, 5}) {  // growing and shrinking, the pool's threads reused
    std::vector<std::atomic<int>> ran(static_cast<size_t>(n));
    std::vector<std::thread::id> who(static_cast<size_t>(n));
    pool.run(n, [&](int i) {
      ran[static_cast<size_t>(i)]++;
      who[static_cast<size_t>(i)] = std::this_thread::get_id();
    });
    for (int i = 0; i < n; ++i) EXPECT_EQ(ran[static_cast<size_t>(i)].load(), 1) << "n " << n << " task " << i;
    if (n > 0) EXPECT_EQ(who[0], std::this_thread::get_id());
    for (int i = 1; i < n; ++i)
      for (int j = 0; j < i; ++j) EXPECT_NE(who[static_cast<size_t>(i)], who[static_cast<size_t>(j)]);
  }
  EXPECT_EQ(pool.threads(), 7);
}

TEST(SubmitThreads, TasksRunAtTheSameTime) {
  SubmitThreads pool(-1);
  const int n = 4;
  std::atomic<int> arrived{0};
  std::atomic<int> met{0};
  pool.run(n, [&](int) {
    arrived++;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (arrived.load() < n && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    if (arrived.load() == n) met++;
  });
  EXPECT_EQ(met.load(), n);  // every task saw all four started before any returned
}

TEST(SubmitThreads, RethrowsAfterEveryTaskReturned) {
  SubmitThreads pool(-1);
  for (int thrower : {0, 2}) {
    std::atomic<int> finished{0};
    EXPECT_THROW(pool.run(4,
                          [&](int i) {
                            if (i == thrower) throw std::runtime_error("task failed");
                            std::this_thread::sleep_for(std::chrono::milliseconds(20));
                            finished++;
                          }),
                 std::runtime_error);
    EXPECT_EQ(finished.load(), 3) << "thrower " << thrower;
  }
  std::atomic<int> ran{0};
  pool.run(4, [&](int) { ran++; });  // usable after a failure
  EXPECT_EQ(ran.load(), 4);
}

TEST(SubmitThreads, ManyRunsInARow) {
  SubmitThreads pool(-1);
  std::atomic<long> sum{0};
  for (int r = 0; r < 2000; ++r) pool.run(1 + r % 4, [&](int i) { sum += i + 1; });
  long expect = 0;
  for (int r = 0; r < 2000; ++r)
    for (int i = 0; i < 1 + r % 4; ++i) expect += i + 1;
  EXPECT_EQ(sum.load(), expect);
}

TEST(SubmitThreads, ASecondRunWhileOneRunsIsRefused) {
  SubmitThreads pool(-1);
  std::atomic<bool> inside{false}, release{false}, refused{false};
  std::thread other([&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!inside.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    try {
      pool.run(2, [](int) {});
    } catch (const Error&) {
      refused = true;
    }
    release = true;
  });
  pool.run(2, [&](int i) {
    if (i != 0) return;
    inside = true;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!release.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  });
  other.join();
  EXPECT_TRUE(refused.load());
  std::atomic<int> ran{0};
  pool.run(3, [&](int) { ran++; });  // free again
  EXPECT_EQ(ran.load(), 3);
}
