/* Signals and waits on symmetric variables.
 *
 *   signal_op(h, sig, value, SignalOp::kSet | kAdd, peer)   set or add to the peer's copy of `sig`
 *   put_signal<S>(h, dst, src, bytes, sig, value, op, peer) a put, then the signal, ordered after it
 *   signal_wait_until(h, sig, Cmp::kGe, value, from)        wait on this rank's own `sig`
 *   wait_until(h, ivar, cmp, value, from) / test(ivar, cmp, value)  the same for any 32/64-bit integer
 *
 * `sig` is a uint64_t on the heap. A signal has release semantics: the
 * calling thread's earlier stores to that peer are visible before it. A wait
 * has acquire semantics and is bounded by h.timeout_ns: on timeout it returns
 * false and leaves the fault word naming `from` (the rank expected to
 * signal; -1 when any may). */
#ifndef FERRY_DEVICE_SIGNAL_CUH_
#define FERRY_DEVICE_SIGNAL_CUH_

#include <stdint.h>

#include "ferry/device/heap.cuh"
#include "ferry/device/impl/spin.cuh"
#include "ferry/device/rma.cuh"
#include "ferry/device/scope.cuh"

namespace ferry {
namespace device {

enum class SignalOp { kSet, kAdd };

__device__ __forceinline__ void signal_op(const Heap& h, uint64_t* sig, uint64_t value, SignalOp op, int peer) {
  uint64_t* remote = h.peer_ptr(sig, peer);
  if (op == SignalOp::kSet) {
    impl::store_release(remote, value);
  } else {
    impl::fence_release();
    atomicAdd_system(reinterpret_cast<unsigned long long*>(remote), (unsigned long long)value);
  }
}

template <Scope S = Scope::kThread>
__device__ __forceinline__ void put_signal(const Heap& h, void* dst, const void* src, uint64_t bytes, uint64_t* sig,
                                           uint64_t value, SignalOp op, int peer) {
  // put ends with the scope's barrier; the signal's release is cumulative over
  // every lane's stores this lane saw there.
  put<S>(h, dst, src, bytes, peer);
  if (impl::scope_lane<S>() == 0) signal_op(h, sig, value, op, peer);
  impl::scope_sync<S>();
}

template <class T>
__device__ __forceinline__ bool test(const T* ivar, Cmp cmp, T value) {
  return impl::compare(impl::load_acquire_as(ivar), cmp, value);
}

template <class T>
__device__ inline bool wait_until(const Heap& h, const T* ivar, Cmp cmp, T value, int from = -1) {
  return impl::spin(
      h, [&] { return impl::compare(impl::load_acquire_as(ivar), cmp, value); }, WaitKind::kWaitUntil, from);
}

__device__ inline bool signal_wait_until(const Heap& h, const uint64_t* sig, Cmp cmp, uint64_t value, int from = -1,
                                         uint64_t* seen = nullptr) {
  uint64_t v = 0;
  const bool ok = impl::spin(
      h, [&] { return impl::compare(v = impl::load_acquire(sig), cmp, value); }, WaitKind::kSignal, from);
  if (seen) *seen = v;
  return ok;
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_SIGNAL_CUH_ */
