// A communicator: the ranks, their flags, their registered buffers, and the
// watchdog that bounds every wait (coll/watchdog.hpp). Its device memory (flags, the SM path's
// windows, scratch, registered buffers) is a CollectiveMemory. One process per GPU (create) or one process
// driving several GPUs (create_local); the collectives below serve both, with
// one entry per local rank in every array argument.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/group.hpp"
#include "bootstrap/unix_socket.hpp"
#include "coll/built.hpp"
#include "coll/call_memo.hpp"
#include "coll/collective_memory.hpp"
#include "coll/emitter.hpp"
#include "coll/failure.hpp"
#include "coll/flags.hpp"
#include "coll/gate_slots.hpp"
#include "coll/in_flight.hpp"
#include "coll/prepared_table.hpp"
#include "coll/program.hpp"
#include "coll/record_pool.hpp"
#include "coll/replay_cache.hpp"
#include "coll/rescue.hpp"
#include "coll/selector.hpp"
#include "coll/watchdog.hpp"
#include "dma/engine.hpp"
#include "symm/shared_host_memory.hpp"

namespace ferry {

class Communicator {
 public:
  // `allgather_on_host`: the all-gather moves its bytes on the host alone
  // (a TCP or file store, a gloo group), so that it cannot wait for a GPU.
  // Only then does a rank that refuses the setup while something is armed
  // (sync/holds.hpp) tell its peers in the first exchange; otherwise it
  // raises at once, and its peers wait for it until the bootstrap's timeout.
  static std::unique_ptr<Communicator> create(int rank, int world, int device, const AllGatherFn& allgather,
                                              double timeout_s, bool allgather_on_host = false);
  static std::unique_ptr<Communicator> create_local(const std::vector<int>& devices, double timeout_s);
  ~Communicator();

  void close();
  bool closed() const { return closed_; }

  int world() const { return world_; }
  // The GPU model (its CUDA name), which picks the shipped tuning tables.
  const std::string& gpu_name() const { return gpu_name_; }
  int local_count() const { return static_cast<int>(locals_.size()); }
  int rank(int local) const { return locals_.at(local)->rank; }
  int device(int local) const { return locals_.at(local)->device; }
  double timeout_s() const { return timeout_s_; }
  // Its ranks as the memory layer sees them (symm/heap.hpp); valid while it is open.
  Group group();

  // Collective. One pointer per local rank.
  std::vector<void*> alloc(size_t bytes);
  void free(const std::vector<void*>& ptrs);
  void register_buffers(const std::vector<void*>& ptrs, const std::vector<size_t>& sizes);
  void deregister(const std::vector<void*>& ptrs);
  // Makes ferry's scratch (reduce_scatter, all_reduce, in-place all_to_all)
  // at least `bytes` per rank. Collective. Those calls grow it themselves
  // (collectively) on first use, except while a CUDA graph is being captured,
  // where they refuse and name the size to reserve first.
  void reserve_scratch(size_t bytes);

  // Enqueues the collective in the callers' streams (or captures it into the
  // CUDA graph those streams are capturing).
  void run(const CollectiveArgs& args);

  // Prepared collectives (prelaunch): validated and planned once, then armed
  // (enqueued behind a wait on a trigger word) and triggered, as often as
  // needed. Handles are ids; release() forgets one.
  int prepare(const CollectiveArgs& args);
  // Enqueues the handle's commands on ferry's armed stream, after the work
  // enqueued so far on `after` (one stream per local rank; null: the legacy
  // default stream), behind a wait on the handle's gate: in pinned host memory
  // (any trigger), or with `gate_on_device` in GPU memory, which a stream or a
  // kernel of this GPU opens sooner and the host cannot open.
  void arm(int handle, const std::vector<cudaStream_t>& after, bool gate_on_device = false);
  // Opens the gate from the host (a store to pinned memory).
  void trigger(int handle);
  // Opens the gate from each local rank's stream, in stream order (no kernel, no host round trip).
  void trigger_on(int handle, const std::vector<cudaStream_t>& streams);
  // The word and value a kernel stores (then __threadfence_system) to open the
  // gate of local rank `local` (see include/ferry/device.cuh). Counts as triggering.
  std::pair<uint64_t*, uint64_t> device_trigger(int handle, int local);
  // Makes each stream wait for the handle's last armed run.
  void wait(int handle, const std::vector<cudaStream_t>& streams);
  bool armed(int handle) const;
  // The event recorded after the handle's last armed run on local rank `local`.
  cudaEvent_t finished_event(int handle, int local);
  void release_prepared(int handle);

  // Sets the selector's table (rules tried in order); empty: the table the
  // communicator started with (coll/tuning.hpp: FERRY_TUNING, else the shipped
  // table for its GPU model, else the built-in default).
  void set_selector_table(const std::vector<SelectorRule>& rules);
  // Sets the table of a shipped preset ("sm-free", "latency") for this GPU
  // model; an unknown preset, or none shipped for this GPU, is an error.
  void set_selector_preset(const std::string& preset);
  // What a call of this shape with algo and signals "auto" would use.
  Resolved choose(CollOp op, size_t bytes_per_rank) const;
  // Whether algo "sm" takes `op` of `bytes` per rank (this communicator's
  // window and world): all_gather's input, an all_to_all block, the
  // broadcast, reduce_scatter's result, all_reduce's whole buffer (split into
  // parts where it takes two shots), or all_to_allv's largest count.
  bool sm_path_takes(CollOp op, size_t bytes) const;

  // Throws the first asynchronous error (FERRY_ERROR_BROKEN after it was seen once).
  void check();
  // Waits (bounded) for every enqueued collective; then check(). Refused at
  // once while a prepared collective is armed and not triggered (the wait
  // would last until the timeout).
  void synchronize();

 private:
  // Throws, naming `what` and the hold, while something elsewhere in the
  // process (an armed prepared transfer or collective) may hold a stream
  // that the memory this call frees would wait for.
  void refuse_while_held(const char* what);
  // Registers prepared call `handle`'s hold for the arming just made.
  void hold_until_triggered(int handle, PreparedCall& p);
  // arm(): waits, bounded, for earlier runs that stand between `handle` and the queue's bound.
  void wait_for_earlier_runs(int handle);
  // Gives a released call's gate slots and events back (its hold first).
  void retire(PreparedCall& p);
  // Retires the released calls whose holds no longer hold.
  void retire_released();

  struct Local {
    int rank = 0;
    int device = 0;
    std::unique_ptr<EngineSet> engines;
    std::unique_ptr<InFlight> in_flight;
    std::unique_ptr<RecordPool> records;
    // Where the rescue copies this rank's ready flags for the watchdog to read.
    Pinned<ReadyRecord> ready_snapshot;
    // Graphs of repeated eager calls; null when FERRY_REPLAY_CALLS=0.
    std::unique_ptr<ReplayCache> replays;
    // Its device gates (DeviceFlags::gates slots) for prepared collectives.
    GateSlots gates{kMaxDeviceGates};
    // Words in pinned host memory for ferry's waiting kernels (the SM path,
    // signal rounds): set by the host to make them give up; set by a kernel
    // that gave up (KernelWait).
    Pinned<uint64_t> kernel_abort;
    Pinned<uint64_t> kernel_fault;
    // Its stream commands, and the watchdog's actions on its GPU (made once
    // the communicator's memory exists).
    std::unique_ptr<Emitter> emitter;
    std::unique_ptr<Rescue> rescue;
  };
  using Registration = CollectiveMemory::Registration;
  using ScratchBlock = CollectiveMemory::ScratchBlock;

  Communicator() = default;
  void init_common(double timeout_s, int device);
  static std::unique_ptr<Local> make_local(int rank, int device, int world);
  // The local ranks' parts that need the communicator's memory.
  void attach_memory();
  void start_watchdog();
  void ensure_open(const char* what);
  std::vector<std::string> allgather(const std::string& mine, const char* what);
  // group() without the open and broken checks: for a collective step that
  // every rank must reach even when its own checks failed.
  Group peers();

  // Validates the call on every local rank (nothing is enqueued when any is
  // wrong) and plans it. May allocate scratch (collective, like the call).
  std::vector<Built> build(const CollectiveArgs& args, std::vector<uint32_t>* registrations = nullptr);
  // A call as run() needs it: planned once per distinct call (CallMemo).
  struct PlannedCall {
    std::vector<Built> built;
    Resolved how;
    std::vector<std::string> replay_keys;  // by local rank (see emit_eager)
    bool ranks_apart = false;              // enqueued on a thread per local rank (enqueue_ranks_apart)
    size_t most_ops = 0;                   // host_operations of the longest local rank's part
  };
  std::shared_ptr<const PlannedCall> plan_call(const CollectiveArgs& args, bool capturing);
  // What the emitter needs of a call, onto `stream` (eager, captured or armed).
  static Emission emission(cudaStream_t stream, const CollectiveArgs& args, const Resolved& how);
  size_t selection_bytes(const CollectiveArgs& args) const;
  // The call's algo and signals where they are not "auto", else the
  // selector's (the tuning table), else FERRY_SIGNALS for the signals.
  Resolved resolve(const CollectiveArgs& args) const;
  Expectation expectation(uint64_t seq, const CollectiveArgs& args, const Built& b) const;
  // synchronize() without refusing armed handles: the bounded wait, then
  // check() (close() drains armed runs whose gates it opened itself).
  void wait_for_enqueued();
  // The scratch, grown when it holds less than `bytes` (collective); a growth
  // drops every cached plan: they point at the old block, and no two ranks
  // may use different blocks for one call.
  const ScratchBlock& scratch(size_t bytes);

  // An eager call: Emitter::emit, or, when the same commands were enqueued before,
  // one launch of the graph they were captured into (ReplayCache).
  // `replay_key`: the call's key in the local rank's ReplayCache, or empty
  // when it is not replayed (replays off, or a single kernel already).
  void emit_eager(int local, const Built& b, const Emission& e, const std::string& replay_key);
  // Local rank `local`'s part of an eager call numbered `seq`: watched from
  // its first command, published, emitted; on an error the call is abandoned
  // and the communicator fails.
  void enqueue_eager(int local, const CollectiveArgs& args, const PlannedCall& call, uint64_t seq,
                     const std::string& replay_key);
  // An eager call's parts on a thread per local rank (PlannedCall::ranks_apart).
  void enqueue_apart(const CollectiveArgs& args, const PlannedCall& call, uint64_t seq);
  // Whether local rank `local`'s GPU may hold work that waits for something
  // this host does later: an armed run not yet finished (of this
  // communicator, or any other hold: a prepared page transfer, another
  // communicator's prepared call), or (FERRY_SHARED_GPUS)
  // another rank of that GPU with unfinished work. Ending a capture or
  // instantiating its graph can wait for the GPU's work (seen with shared
  // GPUs: the host stuck in Emitter::capture while two ranks of its GPU waited
  // for the third), so the replay cache does not capture then.
  bool gpu_may_wait_for_host(int local);
  // The word a prepared collective's armed stream waits on on local rank
  // `local` (device address), and that gate as the watchdog sees it.
  uint64_t* gate_address(const PreparedCall& p, int local) const {
    return p.gate_address(local, device_flags(locals_[local]->rank));
  }
  Gate watched_gate(const PreparedCall& p, int local) const {
    return p.watched_gate(local, device_flags(locals_[local]->rank));
  }

  HostFlags* host_flags(int rank) const { return static_cast<HostFlags*>(flag_mem_[rank].host()); }
  // What call #seq is on `rank`, for peers' watchdogs (Progress::called):
  // the number is cleared while the value changes, so that a reader that sees
  // the same number before and after reading the value has that call's.
  void publish_called(int rank, uint64_t seq, uint64_t value, bool sm_path) const {
    Progress& p = host_flags(rank)->progress;
    __atomic_store_n(&p.called, uint64_t{0}, __ATOMIC_RELEASE);
    __atomic_store_n(&p.called_value, value | (sm_path ? kSmPathTag : 0), __ATOMIC_RELEASE);
    __atomic_store_n(&p.called, seq, __ATOMIC_RELEASE);
  }
  // `rank`'s ready and done flags, mapped in this process (GPU memory).
  DeviceFlags* device_flags(int rank) const { return memory_->device_flags(rank); }

  void fail(const std::string& message);
  // A call whose commands were enqueued in part on local rank `local`: its
  // peers wait for the rest, so the communicator fails, and what was
  // enqueued stays watched (its waits released) until it ends.
  void abandon_call(int local, size_t slot, cudaStream_t stream, const std::string& what, const std::exception& why);

  int world_ = 0;
  bool multi_process_ = false;
  bool shares_gpus_ = false;  // some local ranks share a GPU (FERRY_SHARED_GPUS)
  double timeout_s_ = 300;
  AllGatherFn allgather_;
  bool allgather_on_host_ = false;
  std::vector<std::unique_ptr<Local>> locals_;
  std::vector<SharedHostMemory> flag_mem_;  // by rank (HostFlags); peers' blocks imported
  std::unique_ptr<CollectiveMemory> memory_;
  std::vector<int> pids_;            // by rank
  std::shared_ptr<FdExchange> fds_;  // shared with the groups it hands out
  std::vector<std::string> socket_paths_;
  std::shared_ptr<int> next_fd_tag_ = std::make_shared<int>(100);  // and so is the tag count
  uint64_t seq_ = 0;
  std::string gpu_name_;
  Selector selector_;
  PreparedTable prepared_;
  // Released while their last arming may still hold ferry's armed stream (a
  // handle released after device_trigger(), before the kernel that fires it
  // was launched): each keeps its hold, gate and events until its trigger
  // lands, so that a free meanwhile is kept instead of waiting for it.
  std::vector<PreparedCall> released_holding_;
  // Recent eager calls' plans; cleared when registrations, the selector or the scratch change.
  CallMemo<PlannedCall> recent_calls_{256};

  bool closed_ = false;
  Failure failure_;
  double exit_after_s_ = 0;             // FERRY_EXIT_AFTER_S
  std::unique_ptr<Watchdog> watchdog_;  // from start_watchdog() until close()
};

}  // namespace ferry
