// The communicator's prepared collectives (prelaunch) by handle: what each
// was planned as, where its gates are, and whether it is armed. Arming,
// triggering and waiting enqueue work and stay with the communicator
// (coll/prepared.cpp); this keeps the handles and the rules about them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "coll/built.hpp"
#include "coll/collective_args.hpp"
#include "coll/flags.hpp"
#include "coll/in_flight.hpp"
#include "coll/record_pool.hpp"
#include "coll/selector.hpp"
#include "sync/holds.hpp"

namespace ferry {

struct PreparedCall {
  CollectiveArgs args;
  std::vector<Built> built;  // by local rank
  Resolved how;
  // By local rank: the host gate, the slot of the device gate in this
  // rank's DeviceFlags::gates, and the watchdog's host copy of the device
  // gate (its own word: a late copy never lands in the host gate).
  std::vector<Pinned<uint64_t>> host_gate;
  std::vector<int> device_gate;
  std::vector<Pinned<uint64_t>> device_gate_copy;
  bool gate_on_device = false;          // where the last arming waits
  std::vector<cudaEvent_t> finished;    // by local rank: the last armed run's end
  std::vector<size_t> ops;              // by local rank: host_operations of its program
  std::vector<uint32_t> registrations;  // buffers it refers to
  uint64_t generation = 0;              // the last arming's gate value; 0: never armed
  bool armed = false;
  // Registered at each arming until its trigger lands (sync/holds.hpp): till
  // then a free anywhere in the process would wait for ferry's armed stream.
  std::shared_ptr<sync::Hold> hold;

  // host_operations of local rank `local`'s program (0 where it has none).
  size_t ops_at(int local) const {
    return static_cast<size_t>(local) < ops.size() ? ops[static_cast<size_t>(local)] : size_t(0);
  }
  // The word local rank `local`'s armed stream waits on (device address):
  // its host gate, or with gate_on_device its slot in `flags` (that rank's
  // DeviceFlags, mapped here).
  uint64_t* gate_address(int local, DeviceFlags* flags) const {
    return gate_on_device ? &flags->gates[device_gate[local]].value : host_gate[local].device;
  }
  // The same gate as the watchdog sees it: the host gate, or the device gate
  // with the host word a rescue copies it into.
  Gate watched_gate(int local, DeviceFlags* flags) const {
    if (!gate_on_device) return Gate{host_gate[local].host, nullptr, generation};
    return Gate{device_gate_copy[local].host, gate_address(local, flags), generation};
  }
};

class PreparedTable {
 public:
  // Its handle: ids from 1, never reused.
  int add(PreparedCall call);
  // Throws, naming `what`, for a handle this table does not hold.
  PreparedCall& get(int handle, const char* what);
  bool armed(int handle) const;
  // Removes the handle; throws, naming `what`, while it is armed (its commands already wait in the stream).
  PreparedCall release(int handle, const char* what);
  // The value of the next arming's gate: unique per table, so a late trigger
  // of an earlier arming never opens a later one.
  uint64_t next_generation() { return ++generation_; }
  // Throw, naming `what`, while some handle is armed and not triggered, or
  // refers to the buffer registration `registration`.
  void refuse_if_armed(const char* what) const;
  void refuse_if_uses(uint32_t registration, const char* what) const;
  // Throws, naming `what`, when arming `handle` would queue more than
  // kArmedOpsMax operations (PreparedCall::ops) on local rank `local`'s
  // armed stream behind gates not yet triggered, its own included.
  void refuse_if_queue_full(int handle, int local, int rank, const char* what) const;
  // What arming `handle` on local rank `local` must wait for first. Runs
  // triggered already that `unfinished` says have not ended may still wait
  // on that rank's armed stream, before the armed handles' and this one's
  // operations: one handed to kernels (device_trigger) not yet launched
  // holds itself and every later run behind its gate. Past what the queue
  // takes (dma::kQueueOpsBehindAWait) the host would block inside CUDA, for
  // good where those kernels are launched only after arm() returns.
  // `unfinished` is asked only where the runs could pass that bound.
  // `released`: calls released while their runs may still hold the stream.
  struct QueueRoom {
    std::vector<int> wait_for;  // runs to wait for, oldest first (a released call: -1 - its index)
    std::vector<int> armed;     // armed handles that hold handed runs behind them: refuse, naming these
  };
  QueueRoom queue_room(int handle, int local, const std::function<bool(const PreparedCall&)>& unfinished,
                       const std::vector<PreparedCall>& released = {}) const;

  const std::map<int, PreparedCall>& calls() const { return calls_; }
  // Forgets every handle (close(), after their events are destroyed).
  void clear() { calls_.clear(); }
  // Unregisters every handle's hold (close(), before their events are destroyed).
  void drop_holds() {
    for (auto& [id, call] : calls_) call.hold.reset();
  }

 private:
  std::map<int, PreparedCall> calls_;
  int next_handle_ = 1;
  uint64_t generation_ = 0;
};

}  // namespace ferry
