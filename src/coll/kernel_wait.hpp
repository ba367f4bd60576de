// What a ferry kernel that waits for peers needs from the host: how to give
// up, where to say so, and (prepared calls) which gate to wait for. Shared by
// the SM path's kernel (coll/sm_path.hpp) and the signal rounds
// (coll/signal_round.hpp).
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

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

// The fault word a kernel leaves when it gives up waiting for `source`, and
// what the host reads back from it (the watchdog names the peer from it).
FERRY_HOST_DEVICE inline uint64_t kernel_fault_word(int source, uint64_t call, uint64_t extra_bits) {
  return kKernelFaultBit | extra_bits | uint64_t(source) << 32 | (call & 0xffffffffu);
}
struct KernelFault {
  bool set = false;           // some kernel gave up
  bool signal_round = false;  // a signal round's (signals "kernel"), else the SM path's
  int source = -1;            // the rank it waited for
  uint32_t call = 0;          // the SM path's call number mod 2^32 (0 from a signal round)
};
inline KernelFault read_kernel_fault(uint64_t word) {
  KernelFault f;
  if (!(word & kKernelFaultBit)) return f;
  f.set = true;
  f.signal_round = (word & kSignalRoundFaultBit) != 0;
  f.source = static_cast<int>((word >> 32) & 0x3fffffff);
  f.call = static_cast<uint32_t>(word & 0xffffffffu);
  return f;
}

}  // namespace ferry
