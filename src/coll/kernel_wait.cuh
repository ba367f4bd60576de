// Device side of KernelWait (coll/kernel_wait.hpp): system-scope flag loads
// and stores, and the bounded spin every waiting ferry kernel uses.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "coll/kernel_wait.hpp"
#include "ferry/device/impl/spin.cuh"

namespace ferry {

// Spins between looks at the clock and the abort word (host memory: a read
// crosses PCIe, so not on every spin).
constexpr unsigned kSpinsPerLook = 1024;

// The same system-scope loads, stores and clock as the public device API.
using device::impl::load_acquire;
using device::impl::now_ns;
using device::impl::store_release;

// Spins until `ok()`; false when it gave up (abort, or the timeout: then the
// fault word names `source`, with `fault_bits` and `call`).
template <typename Ok>
__device__ bool wait_for(Ok ok, const KernelWait& c, int source, uint64_t call, uint64_t fault_bits = 0) {
  uint64_t start = 0;  // read at the first look: most waits end before it
  for (unsigned spins = 1; !ok(); ++spins) {
    if (spins % kSpinsPerLook) continue;
    const bool aborted = *c.abort != 0;
    if (start == 0) start = now_ns();
    if (aborted || now_ns() - start > c.timeout_ns) {
      if (!aborted) *reinterpret_cast<volatile uint64_t*>(c.fault) = kernel_fault_word(source, call, fault_bits);
      return false;
    }
  }
  return true;
}

// A prepared call's gate (or a word standing for it): spins until `word`
// holds at least `want`, or abort. Gate words only grow (one generation per
// arm), so a later trigger that lands before this kernel looks still opens
// it; an equality wait would spin forever. Unbounded otherwise: the watchdog
// opens a gate that stays shut past the timeout.
__device__ __forceinline__ void wait_for_gate(const uint64_t* word, uint64_t want, const KernelWait& c) {
  for (unsigned spins = 1; load_acquire(word) < want; ++spins)
    if (spins % kSpinsPerLook == 0 && *c.abort) break;
}

}  // namespace ferry
