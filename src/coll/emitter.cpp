// Turning a planned collective into stream commands. Per exchange:
//   1. ready: one small copy into each source's ready flags, in its GPU's
//      memory ("you may write into me")
//   2. one batch of memory operations: wait for every target's ready, reset
//      those flags to 0, and (prepared collectives) wait for the trigger
//   3. the pushes (and this rank's own block, locally)
//   4. done: one small copy into each target's done flags (GPU memory) after its data
//   5. one batch: wait for every source's done, reset those flags to 0
// No kernel runs here unless the program has a reduction, the local block
// is copied with the SM kernel, the call runs on the SM path (algo "sm",
// one kernel instead of all of the above: coll/sm_path.hpp), or
// the call signals by kernel (signals "kernel": steps 1-2 and 4-5 as one
// single-block kernel each: coll/signal_round.hpp).
#include "coll/emitter.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "core/host_trace.hpp"

namespace ferry {

Emitter::Emitter(int rank, int world, EngineSet& engines, const CollectiveMemory& memory, const uint64_t* abort,
                 uint64_t* fault, double timeout_s)
    : rank_(rank),
      world_(world),
      engines_(engines),
      memory_(memory),
      abort_(abort),
      fault_(fault),
      kernel_timeout_ns_(static_cast<uint64_t>((timeout_s + 1.0) * 1e9)) {}

void Emitter::emit(const Built& b, const Emission& e) const {
  // Batched copies are not allowed on the legacy default stream: run on our own.
  const bool own_stream = dma::is_legacy_default(e.stream);
  cudaStream_t s = own_stream ? engines_.main() : e.stream;
  if (own_stream) engines_.order(e.stream, s);
  size_t exchanges = 0;
  for (const auto& step : b.program.steps) exchanges += step.kind == Step::Kind::kExchange;
  size_t k = 0;
  // Reductions running on the side stream beside the next round's exchange.
  bool side_busy = false;
  for (const auto& step : b.program.steps) {
    if (step.beside_next) {
      engines_.order(s, engines_.side());
      launch_reduce(step.reduce, engines_.side());
      side_busy = true;
      continue;
    }
    if (side_busy && step.kind != Step::Kind::kExchange) {
      engines_.order(engines_.side(), s);
      side_busy = false;
    }
    switch (step.kind) {
      case Step::Kind::kExchange:
        exchange(step.exchange, b, s, e, k == 0, k + 1 == exchanges);
        ++k;
        break;
      case Step::Kind::kReduce:
        launch_reduce(step.reduce, s);
        break;
      case Step::Kind::kUnpack:
        dma::copy_batch(s, step.unpack);
        break;
      case Step::Kind::kSmPath:
        // A prepared call's kernel waits for the gate itself (launched now, it
        // is resident when the trigger comes).
        // The kernel's own bound comes a second after the watchdog's, which
        // names late peers from their progress; it is what bounds a kernel
        // replayed from a graph, which the watchdog cannot follow (test:
        // kernel_gives_up_in_a_graph, where this bound named the peer).
        launch_sm_path(step.sm_path, memory_.sm_path_windows(), memory_.sm_path_slot_bytes(), kernel_wait(e.gate), s);
        break;
    }
  }
  if (side_busy) engines_.order(engines_.side(), s);
  if (own_stream) engines_.order(s, e.stream);
}

namespace {

// This thread's capture mode set to relaxed while ferry captures and
// instantiates its own graph. Under the default (global) mode, a capture
// that the user runs meanwhile on another stream, in this thread or another,
// forbids instantiating a graph, and the attempt invalidates the user's
// capture; relaxed mode allows it and leaves other captures alone.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { FERRY_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&previous_)); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&previous_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode previous_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace

// Captures the call's commands on ferry's capture stream, in this thread's
// own capture mode (other threads, and their captures, are not affected).
cudaGraphExec_t Emitter::capture(const Built& b, Emission e) const {
  RelaxedCaptureMode relaxed;
  cudaStream_t cs = engines_.capture();
  FERRY_CUDA_CHECK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
  e.stream = cs;
  cudaGraph_t graph = nullptr;
  try {
    emit(b, e);
  } catch (...) {
    if (cudaStreamEndCapture(cs, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    throw;
  }
  FERRY_CUDA_CHECK(cudaStreamEndCapture(cs, &graph));
  cudaGraphExec_t exec = nullptr;
  cudaError_t err = cudaGraphInstantiateWithFlags(&exec, graph, 0);
  cudaGraphDestroy(graph);
  FERRY_CUDA_CHECK(err);
  return exec;
}

KernelWait Emitter::kernel_wait(const ValueWait* gate) const {
  return KernelWait{abort_, fault_, kernel_timeout_ns_, gate ? static_cast<const uint64_t*>(gate->addr) : nullptr,
                    gate ? gate->value : 0};
}

SignalRound Emitter::signal_round(const Exchange& x, const Built& b, bool done) const {
  SignalRound r;
  r.rank = rank_;
  r.done = done;
  r.record = *b.record.host;
  for (int q = 0; q < world_; ++q) r.flags[q] = flags(q);
  const SignalMasks m = signal_masks(x.sources, x.targets, done);
  r.signal_mask = m.signal;
  r.wait_mask = m.wait;
  return r;
}

void Emitter::exchange(const Exchange& x, const Built& b, cudaStream_t s, const Emission& e, bool first,
                       bool last) const {
  ready_round(x, b, s, e, first);
  // Copy-engine done messages, one per target, each sent after the pushes to
  // that target in stream order; none when a kernel sends them.
  std::vector<Copy> done;
  if (!e.kernel_signals)
    for (int t : x.targets) done.push_back(Copy{&flags(t)->done[rank_].value, b.record.done_source, sizeof(uint64_t)});

  // The own block: read back from a peer after the push there (no SM), or
  // copied within the GPU (an SM kernel: CUDA has no other way).
  const LocalCopy how = resolve_local_copy(e.local_copy, x.local_pull.peer >= 0, x.local.bytes);
  const bool pull_back = how == LocalCopy::kPeer && x.local.bytes > 0;
  bool side = false;
  if (e.algo == Algo::kPcpy && !x.targets.empty()) {
    // One stream per target: its push, then its done. These streams never wait
    // on flags (the waits stay on `s`), so sharing a hardware queue with another
    // stream cannot hold a message that a peer waits for.
    const int n = static_cast<int>(x.targets.size());
    FERRY_ARG_CHECK(n <= engines_.peer_count(), "pcpy: more targets than peer engines");
    engines_.fork(s, n);
    for (int k = 0; k < n; ++k) {
      cudaStream_t pk = engines_.peer(k);
      for (const auto& pc : x.pushes)
        if (pc.peer == x.targets[k]) dma::copy(pk, pc.copy);
      if (pull_back && x.local_pull.peer == x.targets[k]) dma::copy_one(pk, x.local_pull.copy);
      if (!done.empty()) dma::copy(pk, done[k]);
    }
    if (!pull_back) copy_local(x.local, how, s);
    engines_.join(s, n);
  } else {
    side = !pull_back && x.local.bytes > 0 && local_copy_on_side_stream(x.local.bytes);
    if (!pull_back) {
      HostTraceScope t(HostStage::kLocal);
      if (side) {
        engines_.order(s, engines_.side());
        copy_local(x.local, how, engines_.side());
      } else {
        copy_local(x.local, how, s);
      }
    }
    {
      HostTraceScope t(HostStage::kPushes);
      std::vector<Copy> data;
      for (const auto& pc : x.pushes) data.push_back(pc.copy);
      if (e.algo == Algo::kSeq) {
        // Stream order makes the steps of the cyclic shift happen one at a time.
        for (const auto& c : data) dma::copy(s, c);
      } else {
        dma::copy_batch(s, data);
      }
      // After the pushes in stream order, before the done messages: the peer
      // leaves its copy alone until it has them.
      if (pull_back) dma::copy_one(s, x.local_pull.copy);
    }
    if (!done.empty()) {
      HostTraceScope t(HostStage::kDone);
      size_t largest = 0;
      for (const auto& pc : x.pushes) largest = std::max(largest, pc.copy.bytes);
      if (done_copies_one_by_one(world_, largest)) {
        for (const auto& c : done) dma::copy_one(s, c);
      } else {
        dma::copy_batch(s, done);
      }
    }
  }
  done_round(x, b, s, e, last);
  if (side) engines_.order(engines_.side(), s);
}

// Steps 1 and 2: by a kernel, or by copy engines and stream waits.
void Emitter::ready_round(const Exchange& x, const Built& b, cudaStream_t s, const Emission& e, bool first) const {
  if (!e.kernel_signals) {
    ready_copies(x, b, s, e, first);
    return;
  }
  SignalRound ready = signal_round(x, b, false);
  if (first && e.state_word) {  // "running" from the first round on
    ready.state_word = const_cast<uint64_t*>(e.state_word);
    ready.state_value = 1;
  }
  HostTraceScope t(HostStage::kBefore);
  launch_signal_round(ready, kernel_wait(first ? e.gate : nullptr), s);
}

// Step 5, and with a kernel step 4 too (the copy-engine done messages follow
// the pushes in exchange()).
void Emitter::done_round(const Exchange& x, const Built& b, cudaStream_t s, const Emission& e, bool last) const {
  HostTraceScope t(HostStage::kAfter);
  if (e.kernel_signals) {
    SignalRound finish = signal_round(x, b, true);
    if (last && e.state_word) {  // "finished" after the last round
      finish.state_word = const_cast<uint64_t*>(e.state_word);
      finish.state_value = 0;
    }
    launch_signal_round(finish, kernel_wait(nullptr), s);
    return;
  }
  using K = MemOp::Kind;
  DeviceFlags* mine = flags(rank_);
  std::vector<MemOp> after;
  for (int q : x.sources) after.push_back(MemOp{K::kWait, &mine->done[q].value, b.value});
  for (int q : x.sources) after.push_back(MemOp{K::kWrite, &mine->done[q].value, 0});
  if (last && e.state_word) after.push_back(MemOp{K::kWrite, e.state_word, 0});
  dma::mem_ops(s, after);
}

// Steps 1 and 2 on copy engines and stream waits.
void Emitter::ready_copies(const Exchange& x, const Built& b, cudaStream_t s, const Emission& e, bool first) const {
  using K = MemOp::Kind;
  const int r = rank_;
  DeviceFlags* mine = flags(r);
  {
    // One plain copy each from the pinned record: for messages this small the
    // batched call cost more time on the GPU (as for the done copies below).
    // In a graph (captured by the user or by ReplayCache) they are parallel
    // branches, which cost nothing there; on a live stream the extra event
    // operations would cost more than the copies' serial latency.
    HostTraceScope t(HostStage::kReady);
    const int n = static_cast<int>(x.sources.size());
    const bool branches = n > 1 && n <= engines_.peer_count() && dma::is_capturing(s);
    if (branches) engines_.fork(s, n);
    for (int k = 0; k < n; ++k) {
      const int q = x.sources[k];
      dma::copy_one(branches ? engines_.peer(k) : s, Copy{&flags(q)->ready[r], b.record.mapped, kReadyCopyBytes});
    }
    if (branches) engines_.join(s, n);
  }

  std::vector<MemOp> before;
  if (first && e.state_word) before.push_back(MemOp{K::kWrite, e.state_word, 1});
  // The done copies read the value from GPU memory (see DoneRecord).
  if (!x.targets.empty()) before.push_back(MemOp{K::kWrite, b.record.done_source, b.value});
  for (int t : x.targets) before.push_back(MemOp{K::kWait, &mine->ready[t].value, b.value});
  for (int t : x.targets) before.push_back(MemOp{K::kWrite, &mine->ready[t].value, 0});
  // At least: gate words only grow, and a later arm's trigger may land first.
  if (first && e.gate) before.push_back(MemOp{K::kWaitAtLeast, e.gate->addr, e.gate->value});
  HostTraceScope t(HostStage::kBefore);
  dma::mem_ops(s, before);
}

}  // namespace ferry
