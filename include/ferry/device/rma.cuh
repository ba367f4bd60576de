/* One-sided puts and gets on the symmetric heap (NVLink or PCIe peer
 * memory, loads and stores by the calling threads).
 *
 *   put<S>(h, dst, src, bytes, peer)   dst: in this rank's heap (peer's copy written); src: any local memory
 *   get<S>(h, dst, src, bytes, peer)   src: in this rank's heap (peer's copy read);    dst: any local memory
 *   p(h, dst, value, peer), g(h, src, peer): one element
 *
 * S is the scope (scope.cuh): every thread of it calls with the same
 * arguments. Stores are not ordered with later ones to other addresses until
 * fence() or quiet() (sync.cuh); put_signal (signal.cuh) orders them with
 * its signal. Words of 16 bytes move where dst and src share their alignment,
 * bytes elsewhere. */
#ifndef FERRY_DEVICE_RMA_CUH_
#define FERRY_DEVICE_RMA_CUH_

#include <stdint.h>

#include "ferry/device/heap.cuh"
#include "ferry/device/scope.cuh"

namespace ferry {
namespace device {
namespace impl {

template <Scope S>
__device__ __forceinline__ void copy_bytes(char* dst, const char* src, uint64_t bytes) {
  const unsigned lane = scope_lane<S>(), n = scope_size<S>();
  uint64_t head = 0;
  if (((uintptr_t(dst) ^ uintptr_t(src)) & 15) == 0) {
    head = (16 - (uintptr_t(dst) & 15)) & 15;
    if (head > bytes) head = bytes;
    const uint64_t words = (bytes - head) / 16;
    uint4* d = reinterpret_cast<uint4*>(dst + head);
    const uint4* s = reinterpret_cast<const uint4*>(src + head);
    // Eight words per thread in flight, the last round too (its loads and
    // stores predicated): a load over NVLink (a get) waits a round trip. A
    // block-scope get of 1-16 MB on 8 blocks read a peer at 196-242 GB/s with
    // four in flight and 245-325 with eight (two H200s); puts moved the same.
    constexpr int kInFlight = 8;
    for (uint64_t round = 0; round < words; round += kInFlight * uint64_t(n)) {
      uint4 v[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const uint64_t i = round + lane + k * uint64_t(n);
        if (i < words) v[k] = s[i];
      }
#pragma unroll
      for (int k = 0; k < kInFlight; ++k) {
        const uint64_t i = round + lane + k * uint64_t(n);
        if (i < words) d[i] = v[k];
      }
    }
    for (uint64_t i = head + words * 16 + lane; i < bytes; i += n) dst[i] = src[i];
  } else {
    head = bytes;
  }
  for (uint64_t i = lane; i < head; i += n) dst[i] = src[i];
  scope_sync<S>();
}

}  // namespace impl

template <Scope S = Scope::kThread>
__device__ __forceinline__ void put(const Heap& h, void* dst, const void* src, uint64_t bytes, int peer) {
  impl::copy_bytes<S>(h.peer_ptr(static_cast<char*>(dst), peer), static_cast<const char*>(src), bytes);
}

template <Scope S = Scope::kThread>
__device__ __forceinline__ void get(const Heap& h, void* dst, const void* src, uint64_t bytes, int peer) {
  impl::copy_bytes<S>(static_cast<char*>(dst), h.peer_ptr(static_cast<const char*>(src), peer), bytes);
}

template <class T>
__device__ __forceinline__ void p(const Heap& h, T* dst, T value, int peer) {
  *reinterpret_cast<volatile T*>(h.peer_ptr(dst, peer)) = value;
}

template <class T>
__device__ __forceinline__ T g(const Heap& h, const T* src, int peer) {
  return *reinterpret_cast<const volatile T*>(h.peer_ptr(src, peer));
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_RMA_CUH_ */
