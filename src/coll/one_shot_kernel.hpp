// Launching the SM path's kernel (coll/one_shot.hpp says what it does).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "coll/one_shot.hpp"

namespace ferry {

struct OneShotWindows {
  char* base[kOneShotMaxRanks];  // each rank's window, as mapped on this GPU
};

// Where a kernel that gave up reports it (pinned host memory, device views).
// `abort` set by the host makes every waiting block give up at once (the
// communicator failed); `fault` gets (1 << 63 | source << 32 | call number
// mod 2^32) from the first block that waited past the timeout. A prepared
// call's kernel is launched at arm() and spins on `gate` until it holds
// `gate_value` (no launch after the trigger; the watchdog bounds that wait by
// opening the gate, or by `abort`).
struct OneShotControl {
  const volatile uint64_t* abort = nullptr;
  uint64_t* fault = nullptr;
  uint64_t timeout_ns = 0;
  const uint64_t* gate = nullptr;
  uint64_t gate_value = 0;
};

constexpr uint64_t kOneShotFaultBit = uint64_t(1) << 63;

void launch_one_shot(const OneShotStep& s, const OneShotWindows& w, size_t slot_bytes, const OneShotControl& c,
                     cudaStream_t stream);
// Loads the kernel now (see load_local_copy_kernels for why).
void load_one_shot_kernels();

}  // namespace ferry
