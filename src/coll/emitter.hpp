// One local rank's stream commands for a planned collective (coll/built.hpp):
// the exchanges with their ready and done signals, reductions, unpacks and
// the SM path's kernel, enqueued on a stream or captured into a graph. Eager,
// captured and prepared calls all go through it; which call runs, when, and
// what the watchdog expects of it stay with the communicator.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "coll/built.hpp"
#include "coll/collective_memory.hpp"
#include "coll/kernel_wait.hpp"
#include "coll/local_copy.hpp"
#include "coll/selector.hpp"
#include "coll/signal_round.hpp"
#include "dma/engine.hpp"

namespace ferry {

// How one call is enqueued on one local rank.
struct Emission {
  cudaStream_t stream = nullptr;
  Algo algo = Algo::kB2b;
  LocalCopy local_copy = LocalCopy::kAuto;
  bool kernel_signals = false;           // the two signal rounds by kernel (coll/signal_round.hpp)
  const ValueWait* gate = nullptr;       // waited on after the first exchange's ready handshake
  const uint64_t* state_word = nullptr;  // device address, for captured calls
};

class Emitter {
 public:
  // Everything it is given belongs to the communicator and outlives it.
  // `abort` and `fault`: device views of the rank's kernel words
  // (coll/kernel_wait.hpp); a waiting kernel gives up a second after
  // `timeout_s`, so the watchdog, which names late peers, speaks first.
  Emitter(int rank, int world, EngineSet& engines, const CollectiveMemory& memory, const uint64_t* abort,
          uint64_t* fault, double timeout_s);

  // Enqueues the program on e.stream (ferry's own stream, ordered after it,
  // when that is the legacy default stream, where batched copies are not allowed).
  void emit(const Built& b, const Emission& e) const;
  // The same commands captured into a graph on ferry's capture stream, in
  // this thread's own capture mode (other threads' captures are not affected).
  cudaGraphExec_t capture(const Built& b, Emission e) const;

 private:
  // One exchange: b2b and seq put everything on one stream (b2b submits the
  // pushes as one batch, seq one after another in cyclic-shift order); pcpy
  // spreads the pushes over one stream per peer and keeps the waits on one.
  void exchange(const Exchange& x, const Built& b, cudaStream_t s, const Emission& e, bool first, bool last) const;
  // Its two rounds of signals: by copy engines and stream waits, or, where
  // the call resolved to kernel signals (Emission::kernel_signals), by one
  // kernel each (coll/signal_round.hpp).
  void ready_round(const Exchange& x, const Built& b, cudaStream_t s, const Emission& e, bool first) const;
  void ready_copies(const Exchange& x, const Built& b, cudaStream_t s, const Emission& e, bool first) const;
  void done_round(const Exchange& x, const Built& b, cudaStream_t s, const Emission& e, bool last) const;
  KernelWait kernel_wait(const ValueWait* gate) const;
  SignalRound signal_round(const Exchange& x, const Built& b, bool done) const;
  DeviceFlags* flags(int rank) const { return memory_.device_flags(rank); }

  int rank_;
  int world_;
  EngineSet& engines_;
  const CollectiveMemory& memory_;
  const uint64_t* abort_;
  uint64_t* fault_;
  uint64_t kernel_timeout_ns_;
};

}  // namespace ferry
