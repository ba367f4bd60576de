// The ring of collectives a rank has enqueued (coll/in_flight.hpp) on the
// simulated CUDA runtime: a call is watched from begin(), before its event
// exists; a call enqueued in part stays watched until what was enqueued ends;
// a full ring waits for its oldest call and keeps the oldest unfinished one
// first.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "coll/in_flight.hpp"
#include "core/error.hpp"
#include "sim.hpp"

using namespace ferry;

namespace {

Expectation call(uint64_t seq) {
  Expectation x;
  x.seq = seq;
  x.op = CollOp::kAllGather;
  x.value = 0xfe77000000000000ull | seq;
  return x;
}

// A stream whose next copy of `bytes` takes `extra_s` longer: what it
// enqueues after that copy finishes that much later.
struct SlowStream {
  cudaStream_t s = nullptr;
  std::vector<char> a = std::vector<char>(1 << 20), b = std::vector<char>(1 << 20);
  SlowStream() { cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); }
  ~SlowStream() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  void hold_for(double extra_s, size_t bytes) {
    sim::Faults f;
    f.slow_on_device = 0;
    f.slow_copies = 1;
    f.slow_from_bytes = bytes;
    f.slow_extra_s = extra_s;
    sim::set_faults(f);
    cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDefault, s);
    sim::set_faults(sim::Faults{});
  }
};

bool wait_until(const std::function<bool()>& ok, double limit_s = 10) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
  while (!ok()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

class InFlightSim : public ::testing::Test {
 protected:
  void SetUp() override { sim::reset(1); }
};

}  // namespace

TEST_F(InFlightSim, ACallIsWatchedFromItsFirstCommand) {
  InFlight ring(0, 4);
  SlowStream st;
  const size_t slot = ring.begin(call(1), 5);
  // Enqueuing: no event yet, but the watchdog sees the call.
  auto seen = ring.oldest_unfinished();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->expect.seq, 1u);
  EXPECT_FALSE(ring.idle());
  EXPECT_EQ(ring.completed(), 0u);
  ring.end(slot, st.s);
  EXPECT_TRUE(wait_until([&] { return ring.idle(); }));
  EXPECT_EQ(ring.completed(), 1u);
}

TEST_F(InFlightSim, ACallEnqueuedInPartStaysWatchedUntilWhatWasEnqueuedEnds) {
  InFlight ring(0, 4);
  SlowStream st;
  const size_t slot = ring.begin(call(1), 5);
  st.hold_for(0.3, 4096);  // what the call enqueued before it failed
  ring.abandon(slot, st.s);
  auto seen = ring.oldest_unfinished();
  ASSERT_TRUE(seen.has_value()) << "an abandoned call was dropped while its commands run";
  EXPECT_EQ(seen->expect.seq, 1u);
  EXPECT_EQ(ring.completed(), 0u) << "an abandoned call was counted done while its commands run";
  EXPECT_TRUE(wait_until([&] { return ring.idle(); }));
  EXPECT_EQ(ring.completed(), 1u);
}

TEST_F(InFlightSim, AFullRingWaitsForItsOldestAndKeepsTheOldestUnfinishedFirst) {
  InFlight ring(0, 2);
  SlowStream first, second;
  size_t slot = ring.begin(call(1), 5);
  first.hold_for(0.2, 4096);
  ring.end(slot, first.s);
  slot = ring.begin(call(2), 5);
  second.hold_for(2.0, 8192);
  ring.end(slot, second.s);
  const auto t0 = std::chrono::steady_clock::now();
  slot = ring.begin(call(3), 5);  // the ring is full: waits for call 1
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.1);
  auto seen = ring.oldest_unfinished();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->expect.seq, 2u) << "the oldest unfinished call is call 2";
  EXPECT_EQ(ring.completed(), 1u);
  ring.end(slot, second.s);
  EXPECT_TRUE(wait_until([&] { return ring.idle(); }));
  EXPECT_EQ(ring.completed(), 3u);
}

TEST_F(InFlightSim, AFullRingThatDoesNotDrainIsATimeoutNamingTheCall) {
  InFlight ring(0, 1);
  SlowStream st;
  size_t slot = ring.begin(call(1), 5);
  st.hold_for(1.0, 4096);
  ring.end(slot, st.s);
  try {
    ring.begin(call(2), 0.1);
    ADD_FAILURE() << "begin() returned with the ring full";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_TIMEOUT);
    EXPECT_NE(std::string(e.what()).find("all_gather #2"), std::string::npos) << e.what();
  }
}
