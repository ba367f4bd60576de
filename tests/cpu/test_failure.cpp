// A communicator's failure record (src/coll/failure.hpp): the first message
// stays, a call raises it once as a timeout and then as "broken", and the exit
// guard sees how long it has gone unraised.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "coll/failure.hpp"
#include "core/error.hpp"
#include "error_of.hpp"

using namespace ferry;

namespace {

ferry_result_t raised(Failure& f, std::string* message = nullptr) {
  return code_of([&] { f.raise(); }, message);
}

}  // namespace

TEST(Failure, NothingUntilSetThenTimeoutOnceThenBroken) {
  Failure f;
  EXPECT_FALSE(f.broken());
  EXPECT_EQ(raised(f), FERRY_SUCCESS);
  EXPECT_FALSE(f.seen().broken);
  const auto t0 = Failure::Clock::now();
  EXPECT_TRUE(f.set("all_gather #3 on rank 0 failed: rank 1 has exited", t0));
  EXPECT_FALSE(f.set("a later failure", t0 + std::chrono::seconds(1)));  // the first one stays
  EXPECT_TRUE(f.broken());
  Failure::Seen s = f.seen(t0 + std::chrono::seconds(5));
  EXPECT_TRUE(s.broken);
  EXPECT_FALSE(s.raised);
  EXPECT_DOUBLE_EQ(s.since_s, 5.0);
  EXPECT_EQ(s.message, "all_gather #3 on rank 0 failed: rank 1 has exited");
  std::string m;
  EXPECT_EQ(raised(f, &m), FERRY_ERROR_TIMEOUT);
  EXPECT_EQ(m, "all_gather #3 on rank 0 failed: rank 1 has exited");
  EXPECT_TRUE(f.seen().raised);
  EXPECT_EQ(raised(f, &m), FERRY_ERROR_BROKEN);
  EXPECT_NE(m.find("broken by an earlier error (all_gather #3"), std::string::npos) << m;
  EXPECT_EQ(raised(f), FERRY_ERROR_BROKEN);
}

TEST(Failure, ManyThreadsOneFirstMessage) {
  Failure f;
  std::vector<std::thread> threads;
  std::atomic<int> firsts{0};
  for (int i = 0; i < 8; ++i) threads.emplace_back([&, i] { firsts += f.set("failure " + std::to_string(i)) ? 1 : 0; });
  for (auto& t : threads) t.join();
  EXPECT_EQ(firsts.load(), 1);
  const std::string m = f.seen().message;
  EXPECT_EQ(m.rfind("failure ", 0), 0u) << m;
}
