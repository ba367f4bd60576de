/* Atomics on a peer's copy of a symmetric variable (system scope, so they
 * are atomic with the peer's own atomics and with other GPUs').
 *
 *   T old = atomic_fetch_add(h, &counter, T(1), peer);
 *
 * T: int32_t, uint32_t, int64_t or uint64_t. Each call is one thread's;
 * none orders other memory (use fence() or quiet() around it). */
#ifndef FERRY_DEVICE_ATOMIC_CUH_
#define FERRY_DEVICE_ATOMIC_CUH_

#include <stdint.h>

#include <type_traits>

#include "ferry/device/heap.cuh"

namespace ferry {
namespace device {
namespace impl {

/* The unsigned type CUDA's atomics take for a T of this size. */
template <class T>
struct AtomicWord {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "atomics take 32- or 64-bit integers");
  using type = typename std::conditional<sizeof(T) == 4, unsigned int, unsigned long long>::type;
};
template <class T>
using atomic_word_t = typename AtomicWord<T>::type;

template <class T>
__device__ __forceinline__ atomic_word_t<T>* word(const Heap& h, T* p, int peer) {
  return reinterpret_cast<atomic_word_t<T>*>(h.peer_ptr(p, peer));
}
template <class T>
__device__ __forceinline__ atomic_word_t<T> bits(T v) {
  return static_cast<atomic_word_t<T>>(v);
}

}  // namespace impl

template <class T>
__device__ __forceinline__ T atomic_fetch_add(const Heap& h, T* dst, T v, int peer) {
  return static_cast<T>(atomicAdd_system(impl::word(h, dst, peer), impl::bits(v)));
}
template <class T>
__device__ __forceinline__ void atomic_add(const Heap& h, T* dst, T v, int peer) {
  atomic_fetch_add(h, dst, v, peer);
}
template <class T>
__device__ __forceinline__ T atomic_fetch_inc(const Heap& h, T* dst, int peer) {
  return atomic_fetch_add(h, dst, T(1), peer);
}
template <class T>
__device__ __forceinline__ void atomic_inc(const Heap& h, T* dst, int peer) {
  atomic_fetch_add(h, dst, T(1), peer);
}
template <class T>
__device__ __forceinline__ T atomic_swap(const Heap& h, T* dst, T v, int peer) {
  return static_cast<T>(atomicExch_system(impl::word(h, dst, peer), impl::bits(v)));
}
/* Stores `v` where the peer's word equals `expected`; returns the word's old value. */
template <class T>
__device__ __forceinline__ T atomic_compare_swap(const Heap& h, T* dst, T expected, T v, int peer) {
  return static_cast<T>(atomicCAS_system(impl::word(h, dst, peer), impl::bits(expected), impl::bits(v)));
}
template <class T>
__device__ __forceinline__ T atomic_fetch_and(const Heap& h, T* dst, T v, int peer) {
  return static_cast<T>(atomicAnd_system(impl::word(h, dst, peer), impl::bits(v)));
}
template <class T>
__device__ __forceinline__ T atomic_fetch_or(const Heap& h, T* dst, T v, int peer) {
  return static_cast<T>(atomicOr_system(impl::word(h, dst, peer), impl::bits(v)));
}
template <class T>
__device__ __forceinline__ T atomic_fetch_xor(const Heap& h, T* dst, T v, int peer) {
  return static_cast<T>(atomicXor_system(impl::word(h, dst, peer), impl::bits(v)));
}
template <class T>
__device__ __forceinline__ void atomic_and(const Heap& h, T* dst, T v, int peer) {
  atomic_fetch_and(h, dst, v, peer);
}
template <class T>
__device__ __forceinline__ void atomic_or(const Heap& h, T* dst, T v, int peer) {
  atomic_fetch_or(h, dst, v, peer);
}
template <class T>
__device__ __forceinline__ void atomic_xor(const Heap& h, T* dst, T v, int peer) {
  atomic_fetch_xor(h, dst, v, peer);
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_ATOMIC_CUH_ */
