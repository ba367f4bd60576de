// Prepared collectives: prelaunch. A prepared call is validated and planned
// once; arming enqueues its commands on ferry's armed stream behind a wait on a
// trigger word; triggering writes the word (from the host, from a stream, or
// from a kernel). Everything before the trigger wait, the ready handshake
// included, runs while the caller still computes, so after the trigger only
// the pushes and the done messages remain.
//
// Where the gate lives: pinned host memory by default (the host can store to
// it; a stream polls it across PCIe), or GPU memory (arm with gate_on_device),
// which a stream or kernel of the same GPU writes and the armed stream sees
// sooner: bench/probes/flag_latency.cu measured a wait on host memory 4-10 us
// behind the store, a kernel polling the same word 4.5-5.3 us.
#include <chrono>
#include <thread>

#include "coll/communicator.hpp"
#include "core/cuda_scope.hpp"
#include "core/error.hpp"
#include "dma/engine.hpp"
#include "sync/gate.hpp"

namespace ferry {

int Communicator::prepare(const CollectiveArgs& args) {
  retire_released();  // their gate slots, if their runs are over
  PreparedCall p;
  p.args = args;
  p.built = build(args, &p.registrations);
  p.how = resolve(args);
  for (int i = 0; i < static_cast<int>(p.built.size()); ++i) {
    const size_t ops = host_operations(p.built[i].program, world_);
    p.ops.push_back(ops);
    if (ops > kArmedOpsMax)
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  std::string("prepare: this ") + coll_op_name(args.op) + " puts about " + std::to_string(ops) +
                      " operations on rank " + std::to_string(rank(i)) +
                      "'s stream; an armed call queues all of them behind its gate, and a stream's queue holds "
                      "about a thousand, so at most " +
                      std::to_string(kArmedOpsMax) +
                      ": run it as a plain call, or in fewer rounds (FERRY_SCRATCH_BYTES for an in-place all_to_all, "
                      "FERRY_REDUCE_ROUND_BYTES for a reduction)");
  }
  try {
    for (int i = 0; i < local_count(); ++i) {
      Local& L = *locals_[i];
      FERRY_CUDA_CHECK(cudaSetDevice(L.device));
      p.device_gate.push_back(L.gates.take());  // first: the words below are not given back
      p.host_gate.push_back(L.records->word());
      p.device_gate_copy.push_back(L.records->word());
      cudaEvent_t ev = nullptr;
      FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      p.finished.push_back(ev);
    }
  } catch (...) {
    // A later local rank had no free slot (or no event): the earlier ones'
    // slots and events go back, or every failed prepare() would shrink them.
    for (size_t i = 0; i < p.device_gate.size(); ++i) locals_[i]->gates.put_back(p.device_gate[i]);
    for (size_t i = 0; i < p.finished.size(); ++i) {
      cudaSetDevice(device(static_cast<int>(i)));
      cudaEventDestroy(p.finished[i]);
    }
    throw;
  }
  return prepared_.add(std::move(p));
}

void Communicator::arm(int handle, const std::vector<cudaStream_t>& after, bool gate_on_device) {
  ensure_open("arm");
  PreparedCall& p = prepared_.get(handle, "arm");
  if (p.armed)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                "arm: handle " + std::to_string(handle) + " is armed already; trigger it before arming it again");
  FERRY_ARG_CHECK(static_cast<int>(after.size()) == local_count(),
                  "arm: expected one stream per local rank (" + std::to_string(local_count()) + ")");
  for (auto s : after)
    if (s && dma::is_capturing(s))
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  "arm: the stream is capturing a CUDA graph; capture the collective call itself instead of arming");
  for (int i = 0; i < local_count(); ++i) prepared_.refuse_if_queue_full(handle, i, rank(i), "arm");
  wait_for_earlier_runs(handle);
  p.gate_on_device = gate_on_device;
  if (p.built.empty()) {
    p.armed = true;  // zero bytes: nothing to enqueue, but arm/trigger keep their rules
    return;
  }
  const uint64_t gen = p.generation = prepared_.next_generation();
  const uint64_t seq = ++seq_;
  for (int i = 0; i < local_count(); ++i) {
    Local& L = *locals_[i];
    FERRY_CUDA_CHECK(cudaSetDevice(L.device));
    cudaStream_t s = L.engines->armed();
    // Also after the legacy default stream (handle 0, torch's default): the
    // ready handshake tells peers this rank's output is free, which is only
    // true once the work enqueued so far on `after` is done with it.
    L.engines->order(after[i], s);
    L.in_flight->order_after_previous(s);
    publish_called(L.rank, seq, p.built[i].value, p.how.algo == Algo::kSm);
    size_t slot = L.in_flight->begin(expectation(seq, p.args, p.built[i]), timeout_s_, watched_gate(p, i));
    ValueWait gate{gate_address(p, i), gen};
    Emission e = emission(s, p.args, p.how);
    e.gate = &gate;
    try {
      L.emitter->emit(p.built[i], e);
      L.in_flight->end(slot, s);
    } catch (const std::exception& ex) {
      abandon_call(i, slot, s, "arm", ex);
      throw;
    }
    FERRY_CUDA_CHECK(cudaEventRecord(p.finished[i], s));
    __atomic_store_n(&host_flags(L.rank)->progress.enqueued, seq, __ATOMIC_RELEASE);
  }
  hold_until_triggered(handle, p);  // after the loop: an arming that failed there is never triggered
  p.armed = true;
}

// Runs triggered already and not ended may still be on a rank's armed
// stream, all of them behind a gate handed to a kernel not yet launched;
// arming more behind them past what its queue takes would block the host
// inside CUDA until that kernel fires, and forever where it is launched only
// after arm() returns. Waits (one deadline for every rank) for the oldest of
// them to end, as few as make room, before anything is enqueued.
void Communicator::wait_for_earlier_runs(int handle) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  const auto names = [](const std::vector<int>& ids) {
    std::string out;
    for (int k : ids) out += (out.empty() ? "" : ", ") + (k > 0 ? std::to_string(k) : std::string("a released one"));
    return out;
  };
  for (int i = 0; i < local_count(); ++i) {
    const auto unfinished = [i](const PreparedCall& c) {
      if (static_cast<size_t>(i) >= c.finished.size()) return false;
      RelaxedCaptureScope relax;  // another thread may be capturing in global mode
      const cudaError_t q = cudaEventQuery(c.finished[i]);
      if (q == cudaErrorNotReady) return true;
      FERRY_CUDA_CHECK(q);
      return false;
    };
    for (;;) {
      const PreparedTable::QueueRoom room = prepared_.queue_room(handle, i, unfinished, released_holding_);
      if (!room.armed.empty())
        throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                    "arm: handle " + std::to_string(handle) + " would queue on rank " + std::to_string(rank(i)) +
                        "'s armed stream behind runs that wait, in turn, behind handles armed and not yet "
                        "triggered (" +
                        names(room.armed) + "), past what a stream's queue takes: trigger those handles first");
      if (room.wait_for.empty()) break;
      check();  // a failed communicator says so now, not at the deadline
      if (std::chrono::steady_clock::now() > deadline)
        throw_error(FERRY_ERROR_TIMEOUT,
                    "arm: handle " + std::to_string(handle) + " would queue on rank " + std::to_string(rank(i)) +
                        "'s armed stream behind runs of handles " + names(room.wait_for) +
                        " that have not ended after " + std::to_string(timeout_s_) +
                        " s, past what a stream's queue takes (" + std::to_string(dma::kQueueOpsBehindAWait) +
                        " operations behind a wait); a trigger handed to a kernel holds its run and every later "
                        "one: launch the kernels that fire them before arming again");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

// Registered for this arming (sync/holds.hpp): it holds ferry's armed stream
// until its trigger lands, which for a gate in host memory is its word
// reaching the generation. A gate in GPU memory the host cannot read, so
// there the run's end stands in for it.
void Communicator::hold_until_triggered(int handle, PreparedCall& p) {
  std::function<bool()> holding;
  if (!p.gate_on_device) {
    std::vector<const uint64_t*> words;
    for (const auto& g : p.host_gate) words.push_back(g.host);
    holding = [words, gen = p.generation] {
      for (const uint64_t* w : words)
        if (__atomic_load_n(w, __ATOMIC_ACQUIRE) < gen) return true;
      return false;
    };
  } else {
    holding = [finished = p.finished] {
      RelaxedCaptureScope relax;  // another thread may be capturing in global mode
      for (cudaEvent_t e : finished)
        if (cudaEventQuery(e) == cudaErrorNotReady) return true;
      return false;
    };
  }
  p.hold = std::make_shared<sync::Hold>("prepared collective " + std::to_string(handle) + " (" +
                                            coll_op_name(p.args.op) + ") armed and not yet triggered",
                                        std::move(holding), this);
}

void Communicator::trigger(int handle) {
  PreparedCall& p = prepared_.get(handle, "trigger");
  if (!p.armed)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                "trigger: handle " + std::to_string(handle) + " is not armed; call arm() first");
  if (p.gate_on_device)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                "trigger: handle " + std::to_string(handle) +
                    " was armed with its gate in GPU memory, which the host cannot write; trigger it from a stream "
                    "or a kernel, or arm it with the gate in host memory");
  for (auto& g : p.host_gate) gate::open_from_host(g.host, p.generation);
  p.armed = false;
}

void Communicator::trigger_on(int handle, const std::vector<cudaStream_t>& streams) {
  PreparedCall& p = prepared_.get(handle, "trigger_on");
  if (!p.armed)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                "trigger_on: handle " + std::to_string(handle) + " is not armed; call arm() first");
  FERRY_ARG_CHECK(static_cast<int>(streams.size()) == local_count(),
                  "trigger_on: expected one stream per local rank (" + std::to_string(local_count()) + ")");
  for (int i = 0; i < local_count(); ++i) {
    FERRY_CUDA_CHECK(cudaSetDevice(device(i)));
    if (!p.built.empty()) gate::open_on_stream(streams[i], gate_address(p, i), p.generation);
  }
  p.armed = false;
}

std::pair<uint64_t*, uint64_t> Communicator::device_trigger(int handle, int local) {
  PreparedCall& p = prepared_.get(handle, "device_trigger");
  if (!p.armed)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                "device_trigger: handle " + std::to_string(handle) + " is not armed; call arm() first");
  FERRY_ARG_CHECK(local >= 0 && local < local_count(), "device_trigger: local rank out of range");
  auto out = std::make_pair(gate_address(p, local), p.generation);
  if (local == local_count() - 1) p.armed = false;  // handed to the kernels
  return out;
}

void Communicator::wait(int handle, const std::vector<cudaStream_t>& streams) {
  PreparedCall& p = prepared_.get(handle, "wait");
  FERRY_ARG_CHECK(static_cast<int>(streams.size()) == local_count(),
                  "wait: expected one stream per local rank (" + std::to_string(local_count()) + ")");
  if (p.generation == 0) return;
  for (int i = 0; i < local_count(); ++i) {
    FERRY_CUDA_CHECK(cudaSetDevice(device(i)));
    FERRY_CUDA_CHECK(cudaStreamWaitEvent(streams[i], p.finished[i], 0));
  }
}

cudaEvent_t Communicator::finished_event(int handle, int local) {
  PreparedCall& p = prepared_.get(handle, "finished_event");
  FERRY_ARG_CHECK(local >= 0 && local < local_count(), "finished_event: local rank out of range");
  return p.finished[local];
}

bool Communicator::armed(int handle) const { return prepared_.armed(handle); }

void Communicator::release_prepared(int handle) {
  retire_released();  // first: a failure here leaves the handle as it was
  PreparedCall p = prepared_.release(handle, "release");
  if (p.hold && p.hold->holding()) {
    released_holding_.push_back(std::move(p));
    return;
  }
  retire(p);
}

void Communicator::retire(PreparedCall& p) {
  p.hold.reset();  // before its events may go (the gates' retire destroys those that completed)
  for (int i = 0; i < local_count(); ++i) {
    cudaSetDevice(device(i));
    // The gate comes back once this event (its last run's end) completes.
    locals_[i]->gates.retire(p.device_gate[i], p.finished[i]);
  }
}

void Communicator::retire_released() {
  for (size_t k = 0; k < released_holding_.size();) {
    PreparedCall& p = released_holding_[k];
    if (p.hold->holding()) {
      ++k;
      continue;
    }
    retire(p);
    released_holding_.erase(released_holding_.begin() + static_cast<long>(k));
  }
}

}  // namespace ferry
