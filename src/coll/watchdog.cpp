#include "coll/watchdog.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "coll/kernel_wait.hpp"
#include "coll/signature.hpp"
#include "coll/watch_rules.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "core/process.hpp"

namespace ferry {

long long watchdog_interval_ms() { return knob_int_in("FERRY_WATCHDOG_MS"); }

namespace {

// How long another call's value may sit in a flag, with its writer not yet
// past this collective, before it counts as an argument mismatch.
constexpr std::chrono::milliseconds kMismatchGrace(200);
// The watchdog reads an eager call's ready flags (a copy out of GPU memory)
// only once the call is this old.
constexpr double kSnapshotAfterS = 0.05;
// How long one look keeps releasing a failed collective's waits.
constexpr std::chrono::milliseconds kReleaseBurst(5);

}  // namespace

Watchdog::Watchdog(std::vector<Rank> ranks, std::vector<HostFlags*> host_flags, std::vector<int> pids, double timeout_s,
                   double exit_after_s, const Failure& failure, std::function<void(const std::string&)> fail)
    : ranks_(std::move(ranks)),
      host_flags_(std::move(host_flags)),
      pids_(std::move(pids)),
      world_(static_cast<int>(host_flags_.size())),
      timeout_s_(timeout_s),
      exit_after_s_(exit_after_s),
      failure_(failure),
      fail_(std::move(fail)),
      mismatch_seen_(kMaxRanks * kMaxRanks) {}

Watchdog::~Watchdog() { stop(); }

void Watchdog::start() {
  thread_ = std::thread([this] { loop(); });
  if (exit_after_s_ > 0)
    exit_guard_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(mu_);
      while (!stop_) {
        cv_.wait_for(lock, std::chrono::milliseconds(100));
        lock.unlock();
        exit_if_undelivered();
        lock.lock();
      }
    });
}

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (exit_guard_.joinable()) exit_guard_.join();
}

const uint64_t* Watchdog::captured_state(int local, const ReadyRecord* record, const Expectation& expect,
                                         RecordPool& records) {
  std::lock_guard<std::mutex> lock(captured_mu_);
  auto key = std::make_pair(local, record);
  auto it = captured_.find(key);
  if (it == captured_.end()) {
    Captured c;
    c.local = local;
    c.expect = expect;
    c.state = records.word();
    it = captured_.emplace(key, std::move(c)).first;
  }
  return it->second.state.device;
}

void Watchdog::loop() {
  // The watchdog queries events while the user's threads may capture CUDA
  // graphs; in relaxed mode its calls never invalidate their capture.
  cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&relaxed);
  auto interval = std::chrono::milliseconds(watchdog_interval_ms());
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, interval);
    if (stop_) break;
    lock.unlock();
    tick_ns_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    publish_progress();
    for (int i = 0; i < static_cast<int>(ranks_.size()); ++i) {
      check_kernel_fault(i);
      auto pending = ranks_[i].in_flight->oldest_unfinished();
      if (pending && pending->waiting_for_trigger) {
        // A gate in GPU memory is read through a copy, made only once the
        // wait has lasted (the usual arm-to-trigger gap costs nothing).
        switch (look_at_armed(pending->gate.device != nullptr, pending->age_s, kSnapshotAfterS, timeout_s_)) {
          case ArmedLook::kReadGate:
            ranks_[i].rescue->mirror_gate(pending->gate);
            break;
          case ArmedLook::kOpenGate:
            fail_untriggered(i, *pending);
            break;
          case ArmedLook::kNothing:
            break;
        }
      } else if (pending) {
        diagnose_and_unblock(i, pending->expect, pending->age_s);
      }
    }
    {
      std::lock_guard<std::mutex> cl(captured_mu_);
      for (auto& [key, c] : captured_) watch(c);
    }
    tick_ns_.store(0, std::memory_order_relaxed);
    lock.lock();
  }
}

// A failure that no ferry call has raised within FERRY_EXIT_AFTER_S ends the
// process: the thread that would make the next call may be stuck inside CUDA,
// where no error reaches it, and a process that hangs helps nobody.
void Watchdog::exit_if_undelivered() {
  // The watchdog itself stuck inside a CUDA call for longer than a timeout:
  // it can neither name a peer nor release a stream, so nothing else will.
  const int64_t tick = tick_ns_.load(std::memory_order_relaxed);
  const double stuck_s = tick ? std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch() -
                                                              std::chrono::steady_clock::duration(tick))
                                    .count()
                              : 0.0;
  if (exit_stuck_watchdog(exit_after_s_, timeout_s_, stuck_s)) {
    // The ranks are named from host memory and process ids alone: CUDA is
    // what this process is stuck in.
    std::vector<RankSeen> seen;
    for (int q = 0; q < world_; ++q) {
      const bool here = std::any_of(ranks_.begin(), ranks_.end(), [q](const Rank& L) { return L.rank == q; });
      const Progress& pq = host_flags_[q]->progress;
      seen.push_back(RankSeen{q, pids_[q], !here && process_exited(pids_[q]),
                              __atomic_load_n(&pq.enqueued, __ATOMIC_ACQUIRE),
                              __atomic_load_n(&pq.completed, __ATOMIC_ACQUIRE), here});
    }
    const std::string named = describe_ranks_without_cuda(seen);
    std::fprintf(stderr,
                 "ferry: ending the process (status 75): ferry's watchdog has waited inside a CUDA call for %.0f s, "
                 "longer than the timeout (%g s) plus FERRY_EXIT_AFTER_S=%g s; another thread of this process holds "
                 "CUDA while it waits for the GPU, which is likely held by a stream wait of ferry that no peer will "
                 "satisfy.%s%s\n",
                 stuck_s, timeout_s_, exit_after_s_, named.empty() ? "" : " Ranks: ", named.c_str());
    std::fflush(stderr);
    std::_Exit(75);
  }
  const Failure::Seen f = failure_.seen();
  if (!exit_undelivered_failure(exit_after_s_, f.broken, f.raised, f.since_s)) return;
  std::fprintf(stderr,
               "ferry: ending the process (status 75): no ferry call raised this error within FERRY_EXIT_AFTER_S=%g "
               "s, so the program is likely stuck where no error reaches it: %s\n",
               exit_after_s_, f.message.c_str());
  std::fflush(stderr);
  std::_Exit(75);
}

// A prepared collective armed for longer than the timeout without its trigger
// being seen. Often a deadlock: the work meant to trigger it waits behind the
// armed stream in a shared hardware queue. Report it and open the gate, so the
// GPU drains (the collective then runs on whatever its input holds).
void Watchdog::fail_untriggered(int local, const InFlight::Pending& p) {
  fail_(std::string(coll_op_name(p.expect.op)) + " #" + std::to_string(p.expect.seq) + " on rank " +
        std::to_string(ranks_[local].rank) + " was armed " + std::to_string(p.age_s) +
        " s ago and never triggered. Two known causes: a kernel launched for the first time after arm() (CUDA's "
        "lazy loading can synchronize the context, which waits for the armed stream: run every such kernel once "
        "before arming, or set CUDA_MODULE_LOADING=EAGER), or trigger work queued behind the armed wait in a shared "
        "CUDA hardware queue (raise CUDA_DEVICE_MAX_CONNECTIONS, e.g. 32); see docs/api.md, Prelaunch. The gate "
        "was opened to free the GPU; the output is undefined");
  ranks_[local].rescue->open_gate(p.gate);
}

void Watchdog::check_kernel_fault(int local) {
  const KernelFault f = read_kernel_fault(__atomic_load_n(ranks_[local].kernel_fault, __ATOMIC_ACQUIRE));
  if (!f.set || failure_.broken()) return;
  const int q = f.source;
  const std::string what = f.signal_round
                               ? std::string("a collective's signal round by kernel (signals 'kernel')")
                               : "a collective on the SM path (algo 'sm', its step #" + std::to_string(f.call) +
                                     " on that path: one per call, R + 1 for a two-shot all_reduce in R rounds)";
  fail_(what + " on rank " + std::to_string(ranks_[local].rank) + " gave up after waiting " +
        std::to_string(timeout_s_) + " s for rank " + std::to_string(q) + ": rank " + std::to_string(q) +
        " has not made the same call, made it with other arguments, or its GPU is held by other work. The output is "
        "undefined; close this communicator");
}

void Watchdog::publish_progress() {
  for (const Rank& L : ranks_)
    __atomic_store_n(&host_flags_[L.rank]->progress.completed, L.in_flight->completed(), __ATOMIC_RELEASE);
}

namespace {
std::string describe(const ReadyRecord& x) {
  return std::string(coll_op_name(static_cast<CollOp>(x.op))) + "(bytes=" + std::to_string(x.bytes_per_rank) +
         ", buffer #" + std::to_string(x.registration) + ", offset " + std::to_string(x.offset) + ")";
}
bool has(uint64_t mask, int q) { return (mask >> q) & 1; }
// What a rank published for call #seq (Progress::called), or nothing when it is at another call.
std::optional<uint64_t> called_value(const Progress& p, uint64_t seq) {
  if (__atomic_load_n(&p.called, __ATOMIC_ACQUIRE) != seq) return std::nullopt;
  const uint64_t v = __atomic_load_n(&p.called_value, __ATOMIC_ACQUIRE);
  if (__atomic_load_n(&p.called, __ATOMIC_ACQUIRE) != seq) return std::nullopt;
  return v;
}
const char* path_name(uint64_t called) { return called & kSmPathTag ? "the SM path (algo 'sm')" : "copy engines"; }
}  // namespace

// Looks at the flags of a collective that has not finished. When it is past the
// timeout (or a peer process has exited, called with other arguments, or the
// communicator already failed), names each peer that did not do its part,
// records the error, and releases the stream's waits by writing the expected
// values itself, so nothing hangs. `x.seq` is 0 for runs of a captured graph,
// whose progress the host cannot count.
bool Watchdog::diagnose_and_unblock(int local, const Expectation& x, double age_s, const uint64_t* running) {
  const Rank& L = ranks_[local];
  const int r = L.rank;
  if (failure_.broken()) {
    // Failed already: release every wait of this collective, whatever the
    // peers did (a late message from a peer may have overwritten an earlier
    // release), so that no stream stays blocked and close() can finish. A
    // call in rounds waits again each round (a flag is cleared once its wait
    // passes): released round after round for a while, not one round a look,
    // while the call still runs (an eager call: the oldest unfinished one; a
    // captured one, which the in-flight ring never holds: its state word).
    const auto until = std::chrono::steady_clock::now() + kReleaseBurst;
    for (;;) {
      L.rescue->release_waits(x.value, x.targets_mask, x.sources_mask);
      if (std::chrono::steady_clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      if (running) {
        if (__atomic_load_n(running, __ATOMIC_ACQUIRE) == 0) break;
        continue;
      }
      const auto still = L.in_flight->oldest_unfinished();
      if (!still || still->expect.seq != x.seq || still->expect.value != x.value) break;
    }
    return true;
  }
  const bool late = age_s > timeout_s_;
  bool definite = false;  // a dead peer or a mismatch: no need to wait for the timeout
  std::vector<std::string> problems;
  std::vector<int> stuck;
  // The ready flags are in GPU memory: copied out only for an eager call that
  // has taken a while (healthy ones finish long before; a foreign value counts
  // as a mismatch only after kMismatchGrace anyway).
  const bool looked = x.seq > 0 && age_s >= kSnapshotAfterS && L.rescue->snapshot_ready();
  const ReadyRecord* seen = L.rescue->snapshot();
  for (int q = 0; q < world_; ++q) {
    if (q == r || !(has(x.targets_mask, q) || has(x.sources_mask, q))) continue;
    uint64_t ready = looked && has(x.targets_mask, q) ? seen[q].value : 0;
    std::string who = "rank " + std::to_string(q);
    const Progress& pq = host_flags_[q]->progress;
    uint64_t enq = __atomic_load_n(&pq.enqueued, __ATOMIC_ACQUIRE);
    uint64_t comp = __atomic_load_n(&pq.completed, __ATOMIC_ACQUIRE);
    if (ready != 0 && ready != x.value && x.seq > 0) {
      // Another call's value (see foreign_ready_is_mismatch). A peer one
      // collective ahead has finished this one, which its watchdog publishes
      // within an interval or two; kMismatchGrace leaves time for that.
      MismatchSeen& m = mismatch_seen_[local * kMaxRanks + q];
      auto now = std::chrono::steady_clock::now();
      if (m.seq != x.seq || m.value != ready) m = MismatchSeen{x.seq, ready, now};
      if (foreign_ready_is_mismatch(x.seq, comp, late, now - m.since > kMismatchGrace)) {
        const std::string theirs = describe(seen[q]), ours = describe(*x.record);
        problems.push_back(theirs == ours
                               ? who + " called " + theirs + " as rank " + std::to_string(r) +
                                     " did, with another dtype, reduction op or setting (FERRY_SCRATCH_BYTES, "
                                     "FERRY_REDUCE_ROUND_BYTES): they must match on every rank"
                               : who + " called " + theirs + " where rank " + std::to_string(r) + " called " + ours +
                                     ": the arguments must match on every rank");
        definite = true;
        stuck.push_back(q);
        continue;
      }
    }
    // The same call made otherwise, as both ranks published it: on another
    // path (an SM-path rank writes no ready flag: only this shows it), or
    // with other arguments where the peer's ready record has not come.
    if (x.seq > 0) {
      const auto theirs = called_value(pq, x.seq), ours = called_value(host_flags_[r]->progress, x.seq);
      const CalledApart apart =
          theirs && ours ? called_apart(*theirs, *ours, kSmPathTag, looked && ready == 0) : CalledApart::kSame;
      if (apart != CalledApart::kSame) {
        problems.push_back(
            apart == CalledApart::kOtherPath
                ? who + " runs collective #" + std::to_string(x.seq) + " on " + path_name(*theirs) + " and rank " +
                      std::to_string(r) + " on " + path_name(*ours) +
                      ": every rank must take the same path (the same algo argument, FERRY_ALGO, tuning table and "
                      "FERRY_SM_BYTES)"
                : who + " made collective #" + std::to_string(x.seq) + " with other arguments than rank " +
                      std::to_string(r) + "'s " + describe(*x.record) + ": the arguments must match on every rank");
        definite = true;
        stuck.push_back(q);
        continue;
      }
    }
    if (process_exited(pids_[q])) {
      problems.push_back(who + " (pid " + std::to_string(pids_[q]) + ") has exited");
      definite = true;
      stuck.push_back(q);
      continue;
    }
    if (x.seq > 0) {
      if (comp >= x.seq) continue;  // q finished its part of this collective
      if (enq < x.seq)
        problems.push_back(who + " has not called collective #" + std::to_string(x.seq) + " (its last was #" +
                           std::to_string(enq) + ")");
      else
        problems.push_back(who +
                           " called it but has not finished (it waits for another rank, or its stream is "
                           "held by other work)");
    } else {
      // A peer of this process: its graph may not have been launched at all,
      // behind this rank's launch blocked on the host (docs/api.md, "CUDA graphs").
      const bool ours = std::any_of(ranks_.begin(), ranks_.end(), [q](const Rank& k) { return k.rank == q; });
      problems.push_back(who + " did not complete its part" +
                         (ours ? std::string(" (rank ") + std::to_string(q) +
                                     " is driven by this process: where each GPU's graph is launched in turn from "
                                     "one thread, a long graph's launch blocks the host in front of the next one; "
                                     "launch each from a thread of its own)"
                               : std::string()));
    }
    stuck.push_back(q);
  }
  if (stuck.empty()) return false;  // peers are fine: the stream is busy with the caller's own work
  if (!late && !definite && !failure_.broken()) return false;
  std::string msg = std::string(coll_op_name(x.op)) +
                    (x.seq ? " #" + std::to_string(x.seq) : std::string(" (in a CUDA graph)")) + " on rank " +
                    std::to_string(r) + " failed after " + std::to_string(age_s) + " s: ";
  for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
  msg += ". The registered buffers it touched hold undefined data; close this communicator";
  fail_(msg);
  uint64_t stuck_mask = 0;
  for (int q : stuck) stuck_mask |= uint64_t{1} << q;
  L.rescue->release_waits(x.value, x.targets_mask & stuck_mask, x.sources_mask & stuck_mask);
  return true;
}

// A captured collective is stuck when its state word says it runs and its
// ready flags have not changed for the whole timeout (runs that follow each
// other keep changing them).
void Watchdog::watch(Captured& c) {
  if (__atomic_load_n(c.state.host, __ATOMIC_ACQUIRE) == 0) {
    c.unchanged_since = -1;
    return;
  }
  const Rescue& rescue = *ranks_[c.local].rescue;
  if (!rescue.snapshot_ready()) return;
  const ReadyRecord* seen = rescue.snapshot();
  std::vector<uint64_t> now;
  for (int q = 0; q < world_; ++q) now.push_back(seen[q].value);
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  if (c.unchanged_since < 0 || now != c.last_flags) {
    c.last_flags = now;
    c.unchanged_since = t;
  }
  diagnose_and_unblock(c.local, c.expect, t - c.unchanged_since, c.state.host);
}

}  // namespace ferry
