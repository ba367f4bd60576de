// What a ferry kernel that waits for peers needs from the host: how to give
// up, where to say so, and (prepared calls) which gate to wait for. Shared by
// the SM path's kernel (coll/one_shot.hpp) and the signal rounds
// (coll/signal_round.hpp).
#pragma once

#include <cstdint>

namespace ferry {

// Pinned host memory, device views. `abort` set by the host makes every
// waiting kernel give up at once (the communicator failed); `fault` gets
// kKernelFaultBit | source << 32 | call number mod 2^32 (kSignalRoundFaultBit
// too from a signal round, whose call number is 0) from the first wait past
// the timeout. A prepared call's first kernel is launched at arm() and spins
// on `gate` until it holds `gate_value` (nothing is launched after the
// trigger; the watchdog bounds that wait by opening the gate, or by `abort`).
struct KernelWait {
  const volatile uint64_t* abort = nullptr;
  uint64_t* fault = nullptr;
  uint64_t timeout_ns = 0;
  const uint64_t* gate = nullptr;
  uint64_t gate_value = 0;
};

constexpr uint64_t kKernelFaultBit = uint64_t(1) << 63;
constexpr uint64_t kSignalRoundFaultBit = uint64_t(1) << 62;

}  // namespace ferry
