// The watchdog: a thread per communicator that looks at every unfinished
// collective every FERRY_WATCHDOG_MS, names late or mismatched peers, reports
// armed runs never triggered and ferry kernels that gave up, and frees the GPU
// when it gives up (stream writes on each rank's rescue stream). With
// FERRY_EXIT_AFTER_S a second thread, which makes no CUDA call, ends a process
// whose failure no call has raised in time. Its decisions are pure functions
// in coll/watch_rules.hpp; this class reads the state they need and acts. The
// communicator owns what it watches and outlives it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "coll/failure.hpp"
#include "coll/flags.hpp"
#include "coll/in_flight.hpp"
#include "coll/record_pool.hpp"
#include "coll/rescue.hpp"

namespace ferry {

// FERRY_WATCHDOG_MS, 1..60000 (refused by name otherwise): how often the
// watchdog looks, and so how much longer than the timeout a wait may last.
long long watchdog_interval_ms();

class Watchdog {
 public:
  // One local rank as the watchdog sees it.
  struct Rank {
    int rank = 0;
    InFlight* in_flight = nullptr;
    Rescue* rescue = nullptr;
    // The word a ferry kernel of this rank sets when it gives up (pinned host memory).
    const uint64_t* kernel_fault = nullptr;
  };
  // `host_flags` and `pids` by rank, for the whole world; `fail` records a
  // failure (and makes ferry's waiting kernels give up); `failure` is what it
  // recorded.
  Watchdog(std::vector<Rank> ranks, std::vector<HostFlags*> host_flags, std::vector<int> pids, double timeout_s,
           double exit_after_s, const Failure& failure, std::function<void(const std::string&)> fail);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void start();
  // Stops both threads and waits for them; idempotent.
  void stop();

  // A call captured into a CUDA graph on local rank `local`: the watchdog
  // cannot see its runs end, so the captured commands write a state word (1
  // while running, 0 after), taken from `records` (which owns it). One per
  // local rank and distinct call (`record`: its interned ready record), so
  // capturing it again reuses the word. Returns the word's device address.
  const uint64_t* captured_state(int local, const ReadyRecord* record, const Expectation& expect, RecordPool& records);
  // Reports a ferry kernel (SM path, signal round) of local rank `local` that
  // gave up waiting; the watchdog looks at every interval, a caller's check()
  // at once.
  void check_kernel_fault(int local);

 private:
  struct Captured {
    int local = 0;
    Expectation expect;
    Pinned<uint64_t> state;
    std::vector<uint64_t> last_flags;
    double unchanged_since = -1;
  };
  struct MismatchSeen {
    uint64_t seq = 0;
    uint64_t value = 0;
    std::chrono::steady_clock::time_point since;
  };

  void loop();
  void exit_if_undelivered();
  // `running`: a captured call's state word (host address), nonzero while
  // its graph runs; null for an eager call.
  bool diagnose_and_unblock(int local, const Expectation& x, double age_s, const uint64_t* running = nullptr);
  void watch(Captured& c);
  void fail_untriggered(int local, const InFlight::Pending& p);
  void publish_progress();

  std::vector<Rank> ranks_;
  std::vector<HostFlags*> host_flags_;  // by rank
  std::vector<int> pids_;               // by rank
  int world_ = 0;
  double timeout_s_ = 0;
  double exit_after_s_ = 0;  // FERRY_EXIT_AFTER_S
  const Failure& failure_;
  std::function<void(const std::string&)> fail_;

  std::mutex captured_mu_;
  std::map<std::pair<int, const ReadyRecord*>, Captured> captured_;
  std::vector<MismatchSeen> mismatch_seen_;  // [local][peer]

  std::thread thread_;
  // Ends an undelivered failure (FERRY_EXIT_AFTER_S): a thread of its own,
  // which makes no CUDA call, since the watchdog's calls can wait inside CUDA
  // behind the very thread that is stuck.
  std::thread exit_guard_;
  std::atomic<int64_t> tick_ns_{0};  // steady clock at the start of a look; 0 between looks
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

}  // namespace ferry
