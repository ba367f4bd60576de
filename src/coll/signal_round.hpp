// Signal rounds by kernel (signals "kernel", coll/signals.hpp): the ready and done rounds of an
// exchange (coll/emitter.cpp) sent and awaited by one single-block kernel
// instead of small copy-engine copies and stream waits. The data still moves
// on copy engines. Same flags, values and resets as the copy-engine rounds,
// so the flag protocol (docs/architecture.md) and the watchdog's diagnosis
// and release are unchanged: a store from an SM reaches a peer in about a
// microsecond, a copy-engine message in 5-10 (docs/performance.md), at the
// price of one block on one SM for the length of the wait.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "coll/flags.hpp"
#include "coll/kernel_wait.hpp"
#include "coll/signals.hpp"

namespace ferry {

struct SignalRound {
  DeviceFlags* flags[kMaxRanks] = {};  // every rank's block, as mapped on this GPU
  ReadyRecord record{};                // the call's record (a done round uses its value)
  uint64_t signal_mask = 0;            // ranks whose block this rank writes into
  uint64_t wait_mask = 0;              // ranks whose message this rank waits for
  uint64_t* state_word = nullptr;      // a captured call's state word (host memory), or null
  uint64_t state_value = 0;            // written there first (ready round) or last (done round)
  int rank = 0;
  int done = 0;  // 0: the ready round (records into ready[rank]), 1: the done round
};

// The ranks a round writes to and waits for, as bit masks (bit q: rank q).
// The ready round tells an exchange's sources that they may write and waits
// for its targets' permission; the done round tells targets that their data
// is there and waits for its sources'. The copy-engine rounds (emitter.cpp)
// message the same ranks; tests/cpu/test_protocol.cpp model-checks these.
struct SignalMasks {
  uint64_t signal = 0;
  uint64_t wait = 0;
};
inline SignalMasks signal_masks(const std::vector<int>& sources, const std::vector<int>& targets, bool done) {
  SignalMasks m;
  for (int q : done ? targets : sources) m.signal |= uint64_t{1} << q;
  for (int q : done ? sources : targets) m.wait |= uint64_t{1} << q;
  return m;
}

// The round on `stream`: writes, then waits for (and resets) every awaited
// flag, then waits for the gate of `c` if any.
void launch_signal_round(const SignalRound& r, const KernelWait& c, cudaStream_t stream);
// Loads the kernel now (see load_local_copy_kernels for why).
void load_signal_round_kernels();

}  // namespace ferry
