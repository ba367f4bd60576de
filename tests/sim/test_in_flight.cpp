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

// The oldest unfinished call of `ring` is call `seq`, with `done` calls done before it.
void expect_oldest(InFlight& ring, uint64_t seq, uint64_t done) {
  const auto seen = ring.oldest_unfinished();
  ASSERT_TRUE(seen.has_value()) << "no unfinished call; expected call " << seq;
  EXPECT_EQ(seen->expect.seq, seq);
  EXPECT_EQ(ring.completed(), done);
}

// `ring` drains, with `done` calls done in all.
void expect_drains(InFlight& ring, uint64_t done) {
  EXPECT_TRUE(wait_until([&] { return ring.idle(); }));
  EXPECT_EQ(ring.completed(), done);
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
  expect_oldest(ring, 1, 0);
  EXPECT_FALSE(ring.idle());
  ring.end(slot, st.s);
  expect_drains(ring, 1);
}

TEST_F(InFlightSim, ACallEnqueuedInPartStaysWatchedUntilWhatWasEnqueuedEnds) {
  InFlight ring(0, 4);
  SlowStream st;
  const size_t slot = ring.begin(call(1), 5);
  st.hold_for(0.3, 4096);  // what the call enqueued before it failed
  ring.abandon(slot, st.s);
  expect_oldest(ring, 1, 0);  // neither dropped nor counted done while its commands run
  expect_drains(ring, 1);
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
  expect_oldest(ring, 2, 1);
  ring.end(slot, second.s);
  expect_drains(ring, 3);
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
