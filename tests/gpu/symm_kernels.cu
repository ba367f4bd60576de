// Test kernels for the symmetric heap's device API (include/ferry/device/),
// launched from tests/gpu/test_symm.py through ctypes. Each launcher takes the
// heap handle as the raw bytes of ferry::device::Heap (HeapHandle.as_bytes()),
// so every test also checks that the struct crosses by value intact.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "ferry/device/atomic.cuh"
#include "ferry/device/coll.cuh"
#include "ferry/device/heap.cuh"
#include "ferry/device/rma.cuh"
#include "ferry/device/signal.cuh"
#include "ferry/device/sync.cuh"
#include "ferry/device/team.cuh"

using namespace ferry::device;

namespace {

template <Scope S>
__global__ void put_kernel(Heap h, void* dst, const void* src, uint64_t bytes, int peer, int get) {
  if (get)
    ::ferry::device::get<S>(h, dst, src, bytes, peer);
  else
    ::ferry::device::put<S>(h, dst, src, bytes, peer);
}

template <Scope S>
__global__ void put_signal_kernel(Heap h, void* dst, const void* src, uint64_t bytes, uint64_t* sig, uint64_t value,
                                  int add, int peer) {
  put_signal<S>(h, dst, src, bytes, sig, value, add ? SignalOp::kAdd : SignalOp::kSet, peer);
}

// Waits for the signal, then copies what arrived (so the test sees what was
// visible when the signal was).
__global__ void wait_copy_kernel(Heap h, const uint64_t* sig, uint64_t value, int from, const char* data, char* out,
                                 uint64_t bytes, int* ok) {
  __shared__ int good;
  if (threadIdx.x == 0) good = signal_wait_until(h, sig, Cmp::kGe, value, from);
  __syncthreads();
  if (threadIdx.x == 0) *ok = good;
  if (!good) return;
  for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x) out[i] = data[i];
}

__global__ void wait_until_kernel(Heap h, const int32_t* ivar, int32_t value, int from, int* ok) {
  *ok = wait_until(h, ivar, Cmp::kEq, value, from);
}

__global__ void p_g_kernel(Heap h, int64_t* dst, int64_t value, int peer, const int64_t* src, int64_t* out) {
  p(h, dst, value, peer);
  *out = g(h, src, peer);
}

// test() on this rank's own word: out[0] whether it equals `value`, out[1]
// whether it is at least value + 1.
__global__ void test_kernel(const int32_t* ivar, int32_t value, int* out) {
  out[0] = test(ivar, Cmp::kEq, value);
  out[1] = test(ivar, Cmp::kGe, int32_t(value + 1));
}

// One thread hands `rounds` slots of `n` words to `peer`: put, then fence()
// and a put of the round into the peer's `flag` (mode 0), or quiet() and a
// relaxed atomic add to it (mode 1). Another warp's thread takes this rank's
// slots from the rank on its left, each after wait_until(flag >= round), and
// counts the words that were not yet there into *bad.
__global__ void handoff_kernel(Heap h, int64_t* slots, int n, uint64_t* flag, int rounds, int mode, int* bad) {
  const int right = (h.rank + 1) % h.world, left = (h.rank + h.world - 1) % h.world;
  if (threadIdx.x == 0) {
    for (int k = 1; k <= rounds; ++k) {
      int64_t* slot = slots + int64_t(k - 1) * n;
      for (int j = 0; j < n; ++j) p(h, slot + j, int64_t(h.rank) * 1000000 + k * 1000 + j, right);
      if (mode == 0) {
        fence();
        p(h, flag, uint64_t(k), right);
      } else {
        quiet();
        atomic_add(h, flag, uint64_t(1), right);
      }
    }
  } else if (threadIdx.x == 32) {
    int wrong = 0;
    for (int k = 1; k <= rounds; ++k) {
      if (!wait_until(h, static_cast<const uint64_t*>(flag), Cmp::kGe, uint64_t(k), left)) {
        wrong = -1;
        break;
      }
      const volatile int64_t* slot = slots + int64_t(k - 1) * n;
      for (int j = 0; j < n; ++j) wrong += slot[j] != int64_t(left) * 1000000 + k * 1000 + j;
    }
    *bad = wrong;
  }
}

// op: 0 fetch_add, 1 inc, 2 or, 3 and, 4 xor, 5 compare_swap increments, 6
// swap, 7 add, 8 fetch_inc, 9 fetch_and, 10 fetch_or, 11 fetch_xor. Where
// `olds` is given, the fetching ops store what they returned at
// olds[thread * iters + i].
template <class T>
__global__ void atomic_kernel(Heap h, int op, T* dst, T value, int peer, int iters, T* olds) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  for (int i = 0; i < iters; ++i) {
    T old = 0;
    switch (op) {
      case 0:
        old = atomic_fetch_add(h, dst, value, peer);
        break;
      case 7:
        atomic_add(h, dst, value, peer);
        break;
      case 8:
        old = atomic_fetch_inc(h, dst, peer);
        break;
      case 9:
        old = atomic_fetch_and(h, dst, value, peer);
        break;
      case 10:
        old = atomic_fetch_or(h, dst, value, peer);
        break;
      case 11:
        old = atomic_fetch_xor(h, dst, value, peer);
        break;
      case 1:
        atomic_inc(h, dst, peer);
        break;
      case 2:
        atomic_or(h, dst, value, peer);
        break;
      case 3:
        atomic_and(h, dst, value, peer);
        break;
      case 4:
        atomic_xor(h, dst, value, peer);
        break;
      case 5: {
        T seen = atomic_compare_swap(h, dst, T(0), T(0), peer);
        for (;;) {
          T old = atomic_compare_swap(h, dst, seen, T(seen + 1), peer);
          if (old == seen) break;
          seen = old;
        }
        break;
      }
      default:
        old = atomic_swap(h, dst, value, peer);
        break;
    }
    if (olds && (op == 0 || op >= 8)) olds[int64_t(t) * iters + i] = old;
    if (olds && op == 6) olds[t] = old;
  }
}

// rounds x (add 1 to the team root's counter; barrier; read it back): after
// round k's barrier the counter is at least k * size.
template <Scope S>
__global__ void barrier_kernel(Heap h, int start, int stride, int size, uint64_t* counter, int rounds, int* out) {
  Team t = team_split_strided(world_team(h), start, stride, size);
  int bad = 0, failed = 0;
  const int root = t.size > 0 ? team_world_rank(t, 0) : 0;
  for (int k = 1; k <= rounds; ++k) {
    if (impl::scope_lane<S>() == 0 && t.my >= 0) atomic_add(h, counter, uint64_t(1), root);
    if (!barrier<S>(h, t)) {
      failed = 1;
      break;
    }
    if (impl::scope_lane<S>() == 0 && g(h, counter, root) < uint64_t(k) * t.size) ++bad;
    if (!sync<S>(h, t)) {  // nobody adds for the next round before every member read this one
      failed = 1;
      break;
    }
  }
  if (impl::scope_lane<S>() == 0) {
    out[0] = bad;
    out[1] = failed;
  }
}

// A grid whose block 1 returns at once: block 0's grid_sync gives up and reports kGridSync.
__global__ void grid_sync_fault_kernel(Heap h, int* out) {
  if (blockIdx.x == 1) return;
  const bool ok = grid_sync(h);
  if (threadIdx.x == 0) out[0] = ok;
}

// coll: 0 broadcast, 1 fcollect, 2 alltoall, 3 reduce, 4 all_reduce, 5 reduce_scatter, 6 barrier_all,
// 7/8/9/10 all_reduce asking for the low-latency / one-shot / two-shot / low-latency two-shot algorithm
// 11 all_reduce (kAuto), then the last block copies dst[0, count) to dst[count, 2 count)
// 12 (n = count / 2) two low-latency all_reduces by name back to back into dst[0, n) and dst[n, 2n), grid_sync,
//    then kAuto over dst[0, n) into dst[2n, 3n)
// 13 all_reduce asking for the per-block two-shot
// 14 (n = count / 2) two per-block two-shots back to back into dst[0, n) and dst[n, 2n), then kTwoShot over
//    dst[0, n) into dst[2n, 3n)
template <class T>
__device__ bool run_coll(const Heap& h, const Team& t, int coll, void* dst, const void* src, uint64_t count, int root,
                         ReduceOp op) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  switch (coll) {
    case 0:
      return broadcast(h, t, d, s, count, root);
    case 1:
      return fcollect(h, t, d, s, count);
    case 2:
      return alltoall(h, t, d, s, count);
    case 3:
      return reduce(h, t, d, s, count, op, root);
    case 4:
      return all_reduce(h, t, d, s, count, op);
    case 5:
      return reduce_scatter(h, t, d, s, count, op);
    case 7:
      return all_reduce(h, t, d, s, count, op, AllReduceAlgo::kLowLatency);
    case 8:
      return all_reduce(h, t, d, s, count, op, AllReduceAlgo::kOneShot);
    case 9:
      return all_reduce(h, t, d, s, count, op, AllReduceAlgo::kTwoShot);
    case 10:
      return all_reduce(h, t, d, s, count, op, AllReduceAlgo::kLowLatencyTwoShot);
    case 13:
      return all_reduce(h, t, d, s, count, op, AllReduceAlgo::kTwoShotPerBlock);
    case 12: {
      // n = count / 2: two low-latency calls by name back to back (same
      // shape, no grid sync between them) into dst[0, n) and dst[n, 2n);
      // grid_sync; then kAuto over dst[0, n) into dst[2n, 3n).
      const uint64_t n = count / 2;
      if (!all_reduce(h, t, d, s, n, op, AllReduceAlgo::kLowLatency)) return false;
      if (!all_reduce(h, t, d + n, s, n, op, AllReduceAlgo::kLowLatency)) return false;
      if (!grid_sync(h)) return false;
      return all_reduce(h, t, d + 2 * n, d, n, op);
    }
    case 14: {
      // n = count / 2: two per-block two-shots back to back into dst[0, n)
      // and dst[n, 2n) (the same shape: nothing between them), then kTwoShot,
      // whose barriers come first, over dst[0, n) into dst[2n, 3n): the
      // per-block meetings and the barriers raise the same counters.
      const uint64_t n = count / 2;
      if (!all_reduce(h, t, d, s, n, op, AllReduceAlgo::kTwoShotPerBlock)) return false;
      if (!all_reduce(h, t, d + n, s, n, op, AllReduceAlgo::kTwoShotPerBlock)) return false;
      return all_reduce(h, t, d + 2 * n, d, n, op, AllReduceAlgo::kTwoShot);
    }
    case 11: {
      // kAuto returns with all of dst: the grid's last block copies all of it
      // to dst + count right away (other blocks' shares included).
      if (!all_reduce(h, t, d, s, count, op)) return false;
      if (blockIdx.x == gridDim.x - 1)
        for (uint64_t i = threadIdx.x; i < count; i += blockDim.x) d[count + i] = d[i];
      return true;
    }
    default:
      return barrier_all(h, t);
  }
}

// dtype: 0 float, 1 half, 2 bfloat16, 3 int32. ok[block] = what the call returned there.
__global__ void coll_kernel(Heap h, int coll, int dtype, int redop, void* dst, const void* src, uint64_t count,
                            int root, int start, int stride, int size, int* ok) {
  const Team t = team_split_strided(world_team(h), start, stride, size);
  const ReduceOp op = redop == 0 ? ReduceOp::kSum : redop == 1 ? ReduceOp::kMax : ReduceOp::kMin;
  bool good;
  switch (dtype) {
    case 0:
      good = run_coll<float>(h, t, coll, dst, src, count, root, op);
      break;
    case 1:
      good = run_coll<__half>(h, t, coll, dst, src, count, root, op);
      break;
    case 2:
      good = run_coll<__nv_bfloat16>(h, t, coll, dst, src, count, root, op);
      break;
    default:
      good = run_coll<int32_t>(h, t, coll, dst, src, count, root, op);
      break;
  }
  if (threadIdx.x == 0) ok[blockIdx.x] = good ? 1 : 0;
}

}  // namespace

#define FT_SCOPED(kernel, scope, args)              \
  switch (scope) {                                  \
    case 0:                                         \
      kernel<Scope::kThread><<<1, 1, 0, s>>> args;  \
      break;                                        \
    case 1:                                         \
      kernel<Scope::kWarp><<<1, 32, 0, s>>> args;   \
      break;                                        \
    default:                                        \
      kernel<Scope::kBlock><<<1, 256, 0, s>>> args; \
      break;                                        \
  }

extern "C" {

int ft_put(const void* raw, int scope, void* dst, const void* src, uint64_t bytes, int peer, int get, cudaStream_t s) {
  Heap h = heap_from_bytes(raw);
  FT_SCOPED(put_kernel, scope, (h, dst, src, bytes, peer, get));
  return cudaGetLastError();
}

int ft_put_signal(const void* raw, int scope, void* dst, const void* src, uint64_t bytes, uint64_t* sig, uint64_t value,
                  int add, int peer, cudaStream_t s) {
  Heap h = heap_from_bytes(raw);
  FT_SCOPED(put_signal_kernel, scope, (h, dst, src, bytes, sig, value, add, peer));
  return cudaGetLastError();
}

int ft_wait_copy(const void* raw, const uint64_t* sig, uint64_t value, int from, const char* data, char* out,
                 uint64_t bytes, int* ok, cudaStream_t s) {
  wait_copy_kernel<<<1, 256, 0, s>>>(heap_from_bytes(raw), sig, value, from, data, out, bytes, ok);
  return cudaGetLastError();
}

int ft_wait_until(const void* raw, const int32_t* ivar, int32_t value, int from, int* ok, cudaStream_t s) {
  wait_until_kernel<<<1, 1, 0, s>>>(heap_from_bytes(raw), ivar, value, from, ok);
  return cudaGetLastError();
}

int ft_test(const int32_t* ivar, int32_t value, int* out, cudaStream_t s) {
  test_kernel<<<1, 1, 0, s>>>(ivar, value, out);
  return cudaGetLastError();
}

int ft_handoff(const void* raw, int64_t* slots, int n, uint64_t* flag, int rounds, int mode, int* bad, cudaStream_t s) {
  handoff_kernel<<<1, 64, 0, s>>>(heap_from_bytes(raw), slots, n, flag, rounds, mode, bad);
  return cudaGetLastError();
}

int ft_p_g(const void* raw, int64_t* dst, int64_t value, int peer, const int64_t* src, int64_t* out, cudaStream_t s) {
  p_g_kernel<<<1, 1, 0, s>>>(heap_from_bytes(raw), dst, value, peer, src, out);
  return cudaGetLastError();
}

int ft_atomic(const void* raw, int op, int width, void* dst, uint64_t value, int peer, int iters, int blocks,
              int threads, void* olds, cudaStream_t s) {
  Heap h = heap_from_bytes(raw);
  if (width == 32)
    atomic_kernel<uint32_t><<<blocks, threads, 0, s>>>(h, op, static_cast<uint32_t*>(dst), uint32_t(value), peer, iters,
                                                       static_cast<uint32_t*>(olds));
  else
    atomic_kernel<uint64_t><<<blocks, threads, 0, s>>>(h, op, static_cast<uint64_t*>(dst), value, peer, iters,
                                                       static_cast<uint64_t*>(olds));
  return cudaGetLastError();
}

int ft_barrier(const void* raw, int scope, int start, int stride, int size, uint64_t* counter, int rounds, int* out,
               cudaStream_t s) {
  Heap h = heap_from_bytes(raw);
  FT_SCOPED(barrier_kernel, scope, (h, start, stride, size, counter, rounds, out));
  return cudaGetLastError();
}

int ft_coll(const void* raw, int coll, int dtype, int redop, void* dst, const void* src, uint64_t count, int root,
            int start, int stride, int size, int blocks, int* ok, cudaStream_t s) {
  coll_kernel<<<blocks, 256, 0, s>>>(heap_from_bytes(raw), coll, dtype, redop, dst, src, count, root, start, stride,
                                     size, ok);
  return cudaGetLastError();
}

int ft_grid_sync_fault(const void* raw, int* out, cudaStream_t s) {
  grid_sync_fault_kernel<<<2, 64, 0, s>>>(heap_from_bytes(raw), out);
  return cudaGetLastError();
}

int ft_handle_size() { return static_cast<int>(sizeof(Heap)); }

}  // extern "C"
