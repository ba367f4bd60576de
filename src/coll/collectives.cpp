// Validating and planning collective calls. Every call is checked on every
// local rank before anything is enqueued (no half-issued collective), then
// turned into a Program of exchanges, reductions and local copies (plan.hpp).
#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>

#include "coll/communicator.hpp"
#include "coll/planner.hpp"
#include "coll/signature.hpp"
#include "core/cuda_scope.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "core/host_trace.hpp"
#include "dma/engine.hpp"
#include "sync/holds.hpp"

namespace ferry {
namespace {

std::string bytes_str(size_t b) { return std::to_string(b) + " bytes"; }

}  // namespace

Emission Communicator::emission(cudaStream_t stream, const CollectiveArgs& a, const Resolved& how) {
  Emission e;
  e.stream = stream;
  e.algo = how.algo;
  e.local_copy = a.local_copy;
  e.kernel_signals = how.kernel_signals;
  return e;
}

size_t Communicator::selection_bytes(const CollectiveArgs& a) const {
  return planner_for(a.op).selection_bytes(a, world_);
}

Resolved Communicator::choose(CollOp op, size_t bytes_per_rank) const {
  return selector_.choose(op, bytes_per_rank, memory_->sm_path_blocks());
}

bool Communicator::sm_path_takes(CollOp op, size_t bytes) const {
  const size_t largest =
      op == CollOp::kAllToAllv ? bytes : sm_path_largest_block(op, world_, bytes, {}, memory_->sm_path_blocks());
  return sm_path_unsupported(op, world_, largest, memory_->sm_path_slot_bytes()).empty();
}

Resolved Communicator::resolve(const CollectiveArgs& a) const {
  return selector_.resolve(a, selection_bytes(a), memory_->sm_path_blocks());
}

void Communicator::set_selector_table(const std::vector<SelectorRule>& rules) {
  selector_.set_table(rules);
  recent_calls_.clear();  // their variants were chosen with the old table
}

void Communicator::set_selector_preset(const std::string& preset) {
  selector_.set_preset(preset);
  recent_calls_.clear();
}

Expectation Communicator::expectation(uint64_t seq, const CollectiveArgs& a, const Built& b) const {
  Expectation x;
  x.seq = seq;
  x.op = a.op;
  x.value = b.value;
  x.record = b.record.host;
  x.targets_mask = b.program.targets_mask;
  x.sources_mask = b.program.sources_mask;
  return x;
}

std::vector<Built> Communicator::build(const CollectiveArgs& a, std::vector<uint32_t>* regs_used) {
  const std::string name = coll_op_name(a.op);
  ensure_open(name.c_str());
  const int n = local_count();
  FERRY_ARG_CHECK(static_cast<int>(a.outs.size()) == n && static_cast<int>(a.ins.size()) == n &&
                      static_cast<int>(a.streams.size()) == n,
                  name + ": expected one out, in and stream per local rank (" + std::to_string(n) + ")");
  const bool reduction = a.op == CollOp::kReduceScatter || a.op == CollOp::kAllReduce;
  if (reduction) {
    FERRY_ARG_CHECK(dtype_bytes(a.dtype) > 0, name + ": dtype is not one ferry reduces");
    // The front ends parse the op by name; a value of the enum from anywhere else would launch nothing.
    FERRY_ARG_CHECK(a.red_op == RedOp::kSum || a.red_op == RedOp::kMax || a.red_op == RedOp::kMin,
                    name + ": op is " + std::to_string(static_cast<uint32_t>(a.red_op)) + "; expected sum, max or min");
  }
  const CollectivePlanner& planner = planner_for(a.op);

  // The shape that must match on every rank (what each rank's `out` and `in`
  // hold: rank_bytes).
  const CallShape call = planner.shape(a, world_);
  const size_t shape = call.bytes;
  // Nothing moves anywhere: nothing to enqueue, so nothing to order in the
  // streams (a prepared call arms and triggers as usual; a capture records nothing).
  if (shape == 0) return {};
  const bool sm = resolve(a).algo == Algo::kSm;
  if (sm) {
    const std::string why = sm_path_unsupported(a.op, world_, sm_largest_block(a, world_, memory_->sm_path_blocks()),
                                                memory_->sm_path_slot_bytes());
    FERRY_ARG_CHECK(why.empty(), name + ": " + why);
  }

  PlanKnobs knobs;
  knobs.scratch_cap = static_cast<size_t>(knob_int_in("FERRY_SCRATCH_BYTES"));

  // Scratch, when the call needs it; sized the same on every rank (the call is collective).
  const bool capturing = dma::is_capturing(a.streams[0]);
  const bool in_place = planner.in_place(a);
  const ScratchPlan scratch_plan = sm ? ScratchPlan{} : planner.scratch(a, world_, shape, knobs, [&](size_t bytes) {
    return !capturing || memory_->find_scratch(bytes);
  });
  const size_t scratch_need = scratch_plan.bytes(world_);

  // Before any per-rank check that could fail on one rank only: growing the
  // scratch is itself collective.
  const ScratchBlock* scr = nullptr;
  if (scratch_need) {
    scr = memory_->find_scratch(scratch_need);
    if (!scr && capturing)
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  name + ": needs " + bytes_str(scratch_need) +
                      " of scratch per rank, and allocating it is a collective step that must not happen while a "
                      "CUDA graph is being captured; call comm.reserve_scratch(" +
                      std::to_string(scratch_need) + ") on every rank before capturing");
    if (!scr) scr = &scratch(scratch_need);
  }
  // Knobs that can fail on one rank only: after the collective step above,
  // and only where a reduction on copy engines reads them.
  if (reduction && !sm) {
    knobs.reduce_round_bytes = static_cast<size_t>(knob_int_in("FERRY_REDUCE_ROUND_BYTES"));
    knobs.reduce_blocks = static_cast<int>(knob_int_in("FERRY_REDUCE_BLOCKS"));
  }
  // What shapes this call's exchanges (chunks, rounds) comes from knobs each
  // rank reads for itself: in the signature, ranks set apart are a mismatch
  // the watchdog names, not bytes unpacked where a peer never wrote them.
  const uint64_t settings = sm ? 0 : planner.exchange_settings(a, world_, shape, scratch_plan, knobs);
  const uint64_t extra = call.extra ^ (settings ? hash_values(&settings, 1) : 0);
  PlanBuffers buffers;
  buffers.world = world_;
  if (scr)
    for (int p = 0; p < world_; ++p) buffers.scratch_by_rank.push_back(memory_->scratch_at(p, *scr));

  std::vector<Built> out(n);
  for (int i = 0; i < n; ++i) {
    const int r = rank(i);
    char* o = static_cast<char*>(a.outs[i]);
    const char* in = static_cast<const char*>(a.ins[i]);
    // A pointer is checked only where this rank moves bytes through it: an
    // empty part (a zero-element tensor: a null pointer) is fine.
    const RankBytes mine = rank_bytes(a.op, world_, r, a.root, shape, a.counts);
    if (mine.out) check_device_pointer(o, device(i), "out");
    if (mine.in) check_device_pointer(in, device(i), "in");
    if (reduction) {
      // The reduction kernels load whole elements: a misaligned one would be
      // a fault of the whole CUDA context, not an error of this call.
      const size_t align = dtype_bytes(a.dtype);
      auto check_aligned = [&](const void* p, const char* what) {
        FERRY_ARG_CHECK(reinterpret_cast<uintptr_t>(p) % align == 0,
                        name + ": " + what + " on rank " + std::to_string(r) + " is at an address not a multiple of " +
                            std::to_string(align) + " bytes, its dtype's element size");
      };
      if (mine.out) check_aligned(o, "out");
      if (mine.in) check_aligned(in, "in");
    }

    // Where peers write: `out` (registered) or ferry's scratch.
    const Registration* reg = nullptr;
    uint64_t offset = 0;
    buffers.out_by_rank.clear();
    if (planner.writes_out(a)) {
      // Only all_to_allv lets a rank's out be empty while others' are not:
      // this rank still writes into its peers' outputs, found at its own
      // out's offset in its registered buffer, which a null pointer lacks.
      if (!o)
        throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                    name + ": out on rank " + std::to_string(r) +
                        " is empty and has no address (a null pointer: a zero-element tensor of its own, not a "
                        "view of a registered buffer); peers' outputs are found at the offset of this rank's out "
                        "in its registered buffer, so pass an empty slice of that buffer (e.g. out_buffer[:0])");
      reg = memory_->find(r, o, mine.out);
      if (!reg)
        throw_error(FERRY_ERROR_NOT_REGISTERED,
                    name + ": out (" + bytes_str(mine.out) + " on rank " + std::to_string(r) +
                        ") is not inside a buffer registered with this communicator; allocate it with comm.alloc() "
                        "or register it with comm.register()");
      offset = o - reg->base[r];
      for (int p = 0; p < world_; ++p) {
        const size_t need = rank_bytes(a.op, world_, p, a.root, shape, a.counts).out;
        if (need > reg->size[p] || offset > reg->size[p] - need)  // (a sum could wrap)
          throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                      name + ": out needs " + bytes_str(need) + " at offset " + std::to_string(offset) +
                          " of buffer #" + std::to_string(reg->id) + " on rank " + std::to_string(p) +
                          ", but that rank registered only " + bytes_str(reg->size[p]) + " for it");
        buffers.out_by_rank.push_back(reg->base[p] + offset);
      }
      if (regs_used) regs_used->push_back(reg->id);
    }

    // Overlap between in and out: only the collective's in-place form.
    if (mine.in) {
      const std::string rule = planner.overlap_error(in, o, r, shape, mine.in, mine.out);
      if (!rule.empty())
        throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                    name + ": in and out overlap on rank " + std::to_string(r) + "; " + rule);
    }
    if (planner.in_place(a, i) != in_place)
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  name + ": in-place on some local ranks and not on others; pass in == out on all or none");

    Built& b = out[i];
    const uint32_t reg_id = reg ? reg->id : 0;
    const uint32_t sig = call_signature(a.op, shape, reg_id, offset, extra);
    b.value = flag_value(sig);
    ReadyRecord s{};
    s.value = b.value;
    s.bytes_per_rank = shape;
    s.offset = offset;
    s.op = static_cast<uint32_t>(a.op);
    s.registration = reg_id;
    b.record = locals_[i]->records->intern(s);
    if (sm) {
      SmPathStep step = plan_sm_path(a.op, r, world_, in, o, shape, a.root, a.counts, sig,
                                     reduction ? static_cast<uint32_t>(a.dtype) : 0,
                                     reduction ? static_cast<uint32_t>(a.red_op) : 0, memory_->sm_path_blocks());
      // A two-shot all_reduce's second shot stores into the peers' outputs
      // (registered: all_reduce writes `out`, so every rank has them).
      if (step.two_shot_rounds) {
        if (static_cast<int>(buffers.out_by_rank.size()) != world_)
          throw_error(FERRY_ERROR_INTERNAL, name + ": a two-shot call on the SM path without its peers' outputs");
        for (int p = 0; p < world_; ++p) step.out_by_rank[p] = buffers.out_by_rank[p];
      }
      b.program.add_sm_path(step);
      continue;
    }
    buffers.rank = r;
    buffers.out = o;
    buffers.in = in;
    b.program = planner.plan(a, buffers, shape, scratch_plan, knobs);
  }
  return out;
}

void Communicator::reserve_scratch(size_t bytes) {
  ensure_open("reserve_scratch");
  FERRY_ARG_CHECK(bytes > 0, "reserve_scratch: bytes must be positive");
  scratch(bytes);
}

const Communicator::ScratchBlock& Communicator::scratch(size_t bytes) {
  if (const ScratchBlock* s = memory_->find_scratch(bytes)) return *s;
  const ScratchBlock& s = memory_->scratch(bytes);
  recent_calls_.clear();
  return s;
}

std::shared_ptr<const Communicator::PlannedCall> Communicator::plan_call(const CollectiveArgs& a, bool capturing) {
  ensure_open(coll_op_name(a.op));
  std::string key = call_key(a, capturing);
  if (auto known = recent_calls_.find(key)) return known;
  auto call = std::make_shared<PlannedCall>();
  call->built = build(a);
  call->how = resolve(a);
  // The replay cache's key, once per distinct call instead of once per call.
  for (int i = 0; i < static_cast<int>(call->built.size()); ++i) {
    const Built& b = call->built[i];
    call->replay_keys.push_back(
        locals_[i]->replays && replayable(b.program)
            ? emission_key(b.program, b.record.mapped, call->how.algo, a.local_copy, call->how.kernel_signals)
            : std::string());
  }
  size_t most_ops = 0;
  for (const Built& b : call->built) most_ops = std::max(most_ops, host_operations(b.program, world_));
  call->most_ops = most_ops;
  call->ranks_apart = enqueue_ranks_apart(local_count(), most_ops);
  recent_calls_.put(key, call);
  return call;
}

void Communicator::run(const CollectiveArgs& a) {
  HostTraceScope whole(HostStage::kRun);
  FERRY_ARG_CHECK(
      static_cast<int>(a.streams.size()) == local_count(),
      std::string(coll_op_name(a.op)) + ": expected one stream per local rank (" + std::to_string(local_count()) + ")");
  if (shares_gpus_) {
    std::vector<int> ranks, devices;
    for (const auto& L : locals_) {
      ranks.push_back(L->rank);
      devices.push_back(L->device);
    }
    check_own_streams(coll_op_name(a.op), ranks, devices, a.streams);
  }
  const bool capturing = dma::is_capturing(a.streams[0]);
  // Before anything is built or enqueued: a call half captured and half
  // eager would leave some ranks' parts in a graph and the others waiting.
  for (int i = 1; i < local_count() && i < static_cast<int>(a.streams.size()); ++i) {
    DeviceScope on(locals_[i]->device);
    FERRY_ARG_CHECK(dma::is_capturing(a.streams[i]) == capturing,
                    std::string(coll_op_name(a.op)) + ": streams[0] is " + (capturing ? "" : "not ") +
                        "capturing a CUDA graph and streams[" + std::to_string(i) + "] is" + (capturing ? " not" : "") +
                        "; every local rank's stream must be, or none");
  }
  std::shared_ptr<const PlannedCall> call;
  {
    HostTraceScope t(HostStage::kBuild);
    call = plan_call(a, capturing);
  }
  const std::vector<Built>& built = call->built;
  if (built.empty()) return;
  const Resolved how = call->how;
  const uint64_t seq = capturing ? 0 : ++seq_;
  if (capturing) {
    FERRY_ARG_CHECK(capture_fits(local_count(), call->most_ops),
                    std::string(coll_op_name(a.op)) + ": this call puts about " + std::to_string(call->most_ops) +
                        " operations on a local rank's stream, and captured for " + std::to_string(local_count()) +
                        " GPUs in one process it becomes graphs whose replay, one launch after another from one "
                        "thread, would block in the first launch behind a wait that only a later graph releases (at "
                        "most " +
                        std::to_string(kCapturedOpsMax) +
                        "): run it as a plain call (each rank's part is then enqueued on a thread of its own), capture "
                        "it in one process per GPU, or make it fewer rounds (FERRY_SCRATCH_BYTES for an in-place "
                        "all_to_all, FERRY_REDUCE_ROUND_BYTES for a reduction)");
    for (int i = 0; i < local_count(); ++i) {
      Local& L = *locals_[i];
      host_trace_rank(coll_op_name(a.op), L.rank, L.device);
      FERRY_CUDA_CHECK(cudaSetDevice(L.device));
      Emission e = emission(a.streams[i], a, how);
      e.state_word = watchdog_->captured_state(i, static_cast<const ReadyRecord*>(built[i].record.host),
                                               expectation(0, a, built[i]), *L.records);
      L.emitter->emit(built[i], e);
    }
    return;
  }
  if (!call->ranks_apart) {
    for (int i = 0; i < local_count(); ++i) enqueue_eager(i, a, *call, seq, call->replay_keys[i]);
    return;
  }
  enqueue_apart(a, *call, seq);
}

void Communicator::enqueue_apart(const CollectiveArgs& a, const PlannedCall& call, uint64_t seq) {
  // cudaStreamPerThread names another stream in each thread: such a rank's
  // part goes on its own main stream, after the caller's work enqueued so
  // far and before what the caller enqueues next.
  CollectiveArgs args = a;
  std::vector<int> per_thread;
  for (int i = 0; i < local_count(); ++i)
    if (a.streams[i] == cudaStreamPerThread) {
      Local& L = *locals_[i];
      DeviceScope on(L.device);
      L.engines->order(cudaStreamPerThread, L.engines->main());
      args.streams[i] = L.engines->main();
      per_thread.push_back(i);
    }
  // Each thread in this thread's capture mode, so that a user's capture
  // elsewhere sees the same calls it would from this thread. With ranks
  // sharing a GPU nothing is captured for replay: a capture's end can wait
  // for that GPU's work, which another of these threads may be enqueueing.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  FERRY_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));  // mode: this thread's own
  cudaStreamCaptureMode back = mode;
  FERRY_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&back));
  std::mutex mu;
  std::exception_ptr first;
  // A part that was not enqueued leaves the others waiting for it: the
  // communicator fails at once (the first error stays its message), not at
  // the timeout, and the call raises the first error that happened.
  auto failed = [&](int i, const char* why) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!first) first = std::current_exception();
    }
    fail(std::string(coll_op_name(a.op)) + " on rank " + std::to_string(rank(i)) + " could not enqueue its part (" +
         why + "); its peers would wait for the rest. Close this communicator");
  };
  auto part = [&](int i) {
    try {
      cudaStreamCaptureMode m = mode;
      FERRY_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&m));
      enqueue_eager(i, args, call, seq, shares_gpus_ ? std::string() : call.replay_keys[i]);
    } catch (const std::exception& ex) {
      failed(i, ex.what());
    } catch (...) {
      failed(i, "an unknown error");
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < local_count(); ++i) {
    try {
      threads.emplace_back(part, i);
    } catch (const std::exception& ex) {
      failed(i, ex.what());  // no thread for this rank, nor for the ones after it
      break;
    }
  }
  for (auto& t : threads) t.join();
  for (int i : per_thread) {
    Local& L = *locals_[i];
    DeviceScope on(L.device);
    L.engines->order(L.engines->main(), cudaStreamPerThread);
  }
  if (first) std::rethrow_exception(first);
}

void Communicator::enqueue_eager(int i, const CollectiveArgs& a, const PlannedCall& call, uint64_t seq,
                                 const std::string& replay_key) {
  Local& L = *locals_[i];
  const Built& b = call.built[i];
  host_trace_rank(coll_op_name(a.op), L.rank, L.device);
  FERRY_CUDA_CHECK(cudaSetDevice(L.device));
  const Emission e = emission(a.streams[i], a, call.how);
  size_t slot = 0;
  {
    HostTraceScope t(HostStage::kInFlight);
    L.in_flight->order_after_previous(a.streams[i]);
    publish_called(L.rank, seq, b.value, call.how.algo == Algo::kSm);
    slot = L.in_flight->begin(expectation(seq, a, b), timeout_s_);
  }
  try {
    emit_eager(i, b, e, replay_key);
    HostTraceScope t(HostStage::kInFlight);
    L.in_flight->end(slot, a.streams[i]);
  } catch (const std::exception& ex) {
    abandon_call(i, slot, a.streams[i], coll_op_name(a.op), ex);
    throw;
  }
  __atomic_store_n(&host_flags(L.rank)->progress.enqueued, seq, __ATOMIC_RELEASE);
}

void Communicator::emit_eager(int local, const Built& b, const Emission& e, const std::string& replay_key) {
  Local& L = *locals_[local];
  if (replay_key.empty()) return L.emitter->emit(b, e);
  ReplayCache::Entry* entry = nullptr;
  {
    HostTraceScope t(HostStage::kReplay);
    entry = &L.replays->touch(replay_key);
  }
  // Not while the GPU may wait for the host: see gpu_may_wait_for_host. The
  // call runs as a plain call and is captured at a later repeat.
  if (!entry->exec && !entry->uncapturable && worth_capturing(entry->seen) && !gpu_may_wait_for_host(local)) {
    // A call that cannot be captured (e.g. this thread is inside a user's
    // global-mode capture, which forbids instantiating graphs) runs as a
    // plain call, now and later: the cache never makes a call fail.
    try {
      HostTraceScope t(HostStage::kCapture);
      entry->exec = L.emitter->capture(b, e);
    } catch (const std::exception&) {
      cudaGetLastError();
      entry->uncapturable = true;
    }
  }
  if (!entry->exec) return L.emitter->emit(b, e);
  HostTraceScope t(HostStage::kGraphLaunch);
  FERRY_CUDA_CHECK(cudaGraphLaunch(entry->exec, e.stream));
}

bool Communicator::gpu_may_wait_for_host(int local) {
  // Another owner's armed gate (a prepared page transfer, another
  // communicator's prepared call) may hold a stream of this GPU as well.
  if (!sync::holding_now(this).empty()) return true;
  const int dev = locals_[local]->device;
  for (int i = 0; i < local_count(); ++i) {
    if (locals_[i]->device != dev) continue;
    // FERRY_SHARED_GPUS: a rank of this GPU enqueued earlier in this call
    // waits for this one.
    if (i != local && !locals_[i]->in_flight->idle()) return true;
    // An armed run: its trigger may come after this call.
    for (const auto& [id, p] : prepared_.calls())
      if (p.generation > 0 && cudaEventQuery(p.finished[i]) == cudaErrorNotReady) return true;
  }
  return false;
}

}  // namespace ferry
