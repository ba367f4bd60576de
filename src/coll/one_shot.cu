// The SM path's kernel: pushes by stores, one flag per peer, waits by
// spinning, copy out of the window (coll/one_shot.hpp says why it is safe).
#include "coll/copy_words.cuh"
#include "coll/kernel_wait.cuh"
#include "coll/one_shot_kernel.hpp"
#include "core/error.hpp"

namespace ferry {
namespace {

constexpr int kThreads = kOneShotThreads;
// 16-byte words each thread has in flight (as in the local copy kernel).
constexpr int kUnroll = 4;
// The whole block copies n bytes; 16-byte words when both ends allow it.
__device__ void copy_span(char* __restrict__ dst, const char* __restrict__ src, size_t n) {
  const size_t step = blockDim.x;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const size_t n16 = n / 16;
    copy_words<kUnroll, false>(reinterpret_cast<uint4*>(dst), reinterpret_cast<const uint4*>(src), n16, threadIdx.x,
                               step, kUnroll * step);
    for (size_t j = n16 * 16 + threadIdx.x; j < n; j += step) dst[j] = src[j];
  } else {
    for (size_t j = threadIdx.x; j < n; j += step) dst[j] = src[j];
  }
}

// ---- the low-latency format (coll/one_shot_ll.hpp)

// One unit: data word, flag, data word, flag, in one 16-byte store. Each
// 8-byte half lands whole, so a half whose flag is current holds current data.
__device__ void ll_store(char* unit, OneShotUnitData v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(unit), "r"(v.lo), "r"(flag), "r"(v.hi),
               "r"(flag)
               : "memory");
}

__device__ bool ll_load(const char* unit, uint32_t flag, OneShotUnitData* v) {
  uint32_t d0, f0, d1, f1;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
               : "l"(unit)
               : "memory");
  v->lo = d0;
  v->hi = d1;
  return f0 == flag && f1 == flag;
}

// The exchange in the low-latency format: every peer gets its units (at
// least one), then this block waits for its share of every peer's units and
// writes their data out. No barrier and no fence: each unit is its own flag.
__device__ void exchange_low_latency(const OneShotStep& s, const OneShotWindows& w, size_t slot_bytes,
                                     const KernelWait& c, uint64_t call, int parity) {
  const uint32_t flag = one_shot_ll_flag(call, s.tag);
  size_t u0 = 0;
  for (int k = 1; k < s.world; ++k) {
    const int p = (s.rank + k) % s.world;
    const char* src = s.in + s.send_offset[p];
    char* slot = w.base[p] + one_shot_ll_slot_offset(s.world, slot_bytes, parity, s.rank);
    const size_t n = s.send_bytes[p];
    const size_t end = one_shot_ll_share(one_shot_ll_units(n), s.blocks, blockIdx.x, &u0);
    for (size_t u = u0 + threadIdx.x; u < end; u += blockDim.x)
      ll_store(slot + 16 * u, one_shot_ll_pack(src + 8 * u, n > 8 * u ? n - 8 * u : 0), flag);
  }
  size_t begin = 0, len = 0;
  if ((len = one_shot_span_share(s.own_bytes, s.blocks, blockIdx.x, &begin)) > 0)
    copy_span(s.out + s.recv_offset[s.rank] + begin, s.in + s.send_offset[s.rank] + begin, len);
  for (int k = 1; k < s.world; ++k) {
    const int q = (s.rank - k + s.world) % s.world;  // the peer that wrote to us first
    const char* slot = w.base[s.rank] + one_shot_ll_slot_offset(s.world, slot_bytes, parity, q);
    char* dst = s.out + s.recv_offset[q];
    const size_t n = s.recv_bytes[q];
    const size_t end = one_shot_ll_share(one_shot_ll_units(n), s.blocks, blockIdx.x, &u0);
    for (size_t u = u0 + threadIdx.x; u < end; u += blockDim.x) {
      OneShotUnitData v;
      if (!wait_for([&] { return ll_load(slot + 16 * u, flag, &v); }, c, q, call)) return;
      one_shot_ll_unpack(dst + 8 * u, v, n > 8 * u ? n - 8 * u : 0);
    }
  }
}

// The exchange with one flag per peer and block (blocks above
// kOneShotLowLatencyMaxBytes): pushes, a barrier, the flags, waits, copy out.
__device__ void exchange_with_flags(const OneShotStep& s, const OneShotWindows& w, size_t slot_bytes,
                                    const KernelWait& c, uint64_t call, int parity) {
  auto* mine = reinterpret_cast<OneShotHeader*>(w.base[s.rank]);
  const uint64_t value = one_shot_flag_value(call, s.tag);

  // 1. Pushes into the peers' windows, in cyclic-shift order, and the own block.
  size_t begin = 0, len = 0;
  for (int k = 1; k < s.world; ++k) {
    const int p = (s.rank + k) % s.world;
    if ((len = one_shot_span_share(s.send_bytes[p], s.blocks, blockIdx.x, &begin)) > 0)
      copy_span(w.base[p] + one_shot_slot_offset(s.world, slot_bytes, parity, s.rank) + begin,
                s.in + s.send_offset[p] + begin, len);
  }
  if ((len = one_shot_span_share(s.own_bytes, s.blocks, blockIdx.x, &begin)) > 0)
    copy_span(s.out + s.recv_offset[s.rank] + begin, s.in + s.send_offset[s.rank] + begin, len);
  __syncthreads();

  // 2. One flag per peer, after the block's stores: the barrier orders
  // them before thread 0's release store, and a release at system scope
  // covers what its thread has synchronized with (the pattern NCCL uses:
  // barrier, fence, flag; st.release.sys is that fence and store). Every
  // rank signals every peer, with or without data: it tells the peer that
  // this rank's previous call is over.
  if (threadIdx.x == 0) {
    for (int k = 1; k < s.world; ++k) {
      const int p = (s.rank + k) % s.world;
      store_release(&reinterpret_cast<OneShotHeader*>(w.base[p])->flags[s.rank][blockIdx.x], value);
    }
  }

  // 3. Wait for each peer's flag for this chunk (or its next call's, which
  // may have replaced it: one_shot_flag_passes), bounded.
  bool gave_up = false;
  if (threadIdx.x < s.world && threadIdx.x != s.rank) {
    const uint64_t* flag = &mine->flags[threadIdx.x][blockIdx.x];
    gave_up = !wait_for([&] { return one_shot_flag_passes(load_acquire(flag), call, s.tag); }, c, threadIdx.x, call);
  }
  gave_up = __syncthreads_or(gave_up);

  // 4. Out of the window into the output.
  if (!gave_up)
    for (int q = 0; q < s.world; ++q)
      if (q != s.rank && (len = one_shot_span_share(s.recv_bytes[q], s.blocks, blockIdx.x, &begin)) > 0)
        copy_span(s.out + s.recv_offset[q] + begin,
                  w.base[s.rank] + one_shot_slot_offset(s.world, slot_bytes, parity, q) + begin, len);
}

__global__ void __launch_bounds__(kThreads)
    one_shot_kernel(OneShotStep s, OneShotWindows w, size_t slot_bytes, KernelWait c) {
  auto* mine = reinterpret_cast<OneShotHeader*>(w.base[s.rank]);
  // Every block reads the count before any block can have raised it (the
  // last block to finish does, below); the next call's kernel starts after
  // this one ends.
  const uint64_t call = *reinterpret_cast<volatile uint64_t*>(&mine->calls) + 1;
  if (c.gate) {
    // Prepared: resident before the trigger, so nothing is launched after
    // it. One block polls the gate (host memory for a host gate: one reader
    // across PCIe) and tells the others through this GPU's memory.
    if (threadIdx.x == 0) {
      if (blockIdx.x == 0)
        wait_for_gate(c.gate, c.gate_value, c);
      else
        wait_for_gate(&mine->opened, call, c);
      if (blockIdx.x == 0) store_release(&mine->opened, call);
    }
    __syncthreads();
  }
  const int parity = static_cast<int>(call & 1);
  // A block that gave up waiting still counts itself below; the fault word
  // tells the host.
  if (s.low_latency)
    exchange_low_latency(s, w, slot_bytes, c, call, parity);
  else
    exchange_with_flags(s, w, slot_bytes, c, call, parity);

  // The last block to finish counts the call.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&mine->arrivals, 1u) == static_cast<unsigned>(s.blocks) - 1) {
      mine->arrivals = 0;
      *reinterpret_cast<volatile uint64_t*>(&mine->calls) = call;
      __threadfence();
    }
  }
}

}  // namespace

void load_one_shot_kernels() {
  cudaFuncAttributes a;
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, one_shot_kernel));
}

void launch_one_shot(const OneShotStep& s, const OneShotWindows& w, size_t slot_bytes, const KernelWait& c,
                     cudaStream_t stream) {
  one_shot_kernel<<<s.blocks, kThreads, 0, stream>>>(s, w, slot_bytes, c);
  FERRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ferry
