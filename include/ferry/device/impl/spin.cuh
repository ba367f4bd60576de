/* Internals of the device API: system-scope loads and stores, the clock, and
 * the bounded spin every wait of it uses. Not a public header of its own. */
#ifndef FERRY_DEVICE_IMPL_SPIN_CUH_
#define FERRY_DEVICE_IMPL_SPIN_CUH_

#include <stdint.h>

#include "ferry/device/heap.cuh"

namespace ferry {
namespace device {

/* How a wait compares the word it watches with its value. */
enum class Cmp { kEq, kNe, kGt, kGe, kLt, kLe };

namespace impl {

template <class T>
__device__ __forceinline__ bool compare(T a, Cmp c, T b) {
  switch (c) {
    case Cmp::kEq:
      return a == b;
    case Cmp::kNe:
      return a != b;
    case Cmp::kGt:
      return a > b;
    case Cmp::kGe:
      return a >= b;
    case Cmp::kLt:
      return a < b;
    default:
      return a <= b;
  }
}

/* Waits poll with acquire loads: the look that sees the value is the
 * acquire. Polling relaxed and reading the word once more with acquire
 * after it costs that second trip to memory on every wait. */
__device__ __forceinline__ uint64_t load_acquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
template <class T>
__device__ __forceinline__ T load_acquire_as(const T* p) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "waits watch 32- or 64-bit words");
  if constexpr (sizeof(T) == 8) {
    uint64_t v = load_acquire(reinterpret_cast<const uint64_t*>(p));
    return *reinterpret_cast<T*>(&v);
  } else {
    uint32_t v = load_acquire(reinterpret_cast<const uint32_t*>(p));
    return *reinterpret_cast<T*>(&v);
  }
}

/* Makes this thread's earlier stores, and those it has seen, precede its
 * later ones for every observer (cumulative); lighter than __threadfence_system(), which is sequentially consistent. */
__device__ __forceinline__ void fence_release() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }
/* A strong store that is a release only after fence_release(). */
__device__ __forceinline__ void store_relaxed(uint64_t* p, uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void store_release(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ uint64_t now_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* Leaves the fault word (the first fault stays). */
__device__ __forceinline__ void report(const Heap& h, WaitKind kind, int peer) {
  if (h.fault) atomicCAS_system(h.fault, 0ull, (unsigned long long)heap_fault_word(kind, peer));
}

/* Whether a wait of this rank has given up (the fault word is set): the
 * heap's words are out of step from then on. */
__device__ __forceinline__ bool faulted(const Heap& h) {
  return h.fault && (*reinterpret_cast<volatile unsigned long long*>(h.fault) & kHeapFaultBit);
}

/* A wait that has lasted this long looks at the fault word, and again each
 * time this much longer: waits queued behind one that gave up then end
 * within about this long, not a whole timeout each. A wait shorter than this
 * never reads host memory, and a long one reads it about a thousand times a
 * second per warp, not at every look (thousands of lanes may wait at once,
 * one unit each, behind a late peer). */
constexpr uint64_t kFaultLookEveryNs = 1000000;

/* Spins until ok(); after h.timeout_ns it reports (kind, peer) and returns
 * false, and it also returns false, leaving the first report in place, once
 * another wait has given up (looked at every kFaultLookEveryNs). The clock
 * is read once per 256 looks. */
template <class Ok>
__device__ bool spin(const Heap& h, Ok ok, WaitKind kind, int peer) {
  uint64_t start = 0, next_fault_look = 0;
  for (unsigned looks = 1; !ok(); ++looks) {
    if (looks % 256) continue;
    const uint64_t t = now_ns();
    if (start == 0) {
      start = t;
      next_fault_look = t + kFaultLookEveryNs;
      continue;
    }
    if (t - start > h.timeout_ns) {
      report(h, kind, peer);
      return false;
    }
    if (t >= next_fault_look) {
      if (faulted(h)) return false;
      next_fault_look = t + kFaultLookEveryNs;
    }
  }
  return true;
}

}  // namespace impl
}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_IMPL_SPIN_CUH_ */
