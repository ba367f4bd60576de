// The symmetric heap benchmark's kernels (python/ferry/bench/symm.py builds
// them with torch's cpp_extension against ferry.get_include()). Each launcher
// takes the heap handle's bytes and returns a cudaError_t; each kernel repeats
// its operation `iters` times so that one launch's events time many.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "ferry/device/coll.cuh"
#include "ferry/device/heap.cuh"
#include "ferry/device/rma.cuh"
#include "ferry/device/signal.cuh"
#include "ferry/device/sync.cuh"
#include "ferry/device/team.cuh"

using namespace ferry::device;

namespace {

// Block b puts its slice of `bytes` (split evenly over the grid) into the peer, `iters` times; then quiet.
__global__ void put_kernel(Heap h, char* dst, const char* src, uint64_t bytes, int peer, int iters) {
  uint64_t begin, end;
  impl::block_slice(bytes, &begin, &end);
  for (int i = 0; i < iters; ++i)
    if (end > begin) put<Scope::kBlock>(h, dst + begin, src + begin, end - begin, peer);
  quiet();
}

// Block b gets a slice of `bytes` (split evenly over the grid) from the
// peer's src into local dst, `iters` times: loads over NVLink, where put
// stores. Each round a block takes the next block's slice: the same slice
// again would come from the SM's L1 (plain loads cache there, and a slice of
// 1-4 MiB over 32 blocks fits), which no real get of new data does.
__global__ void get_kernel(Heap h, char* dst, const char* src, uint64_t bytes, int peer, int iters) {
  const uint64_t per = (bytes + gridDim.x - 1) / gridDim.x;
  for (int i = 0; i < iters; ++i) {
    const uint64_t b = (blockIdx.x + uint64_t(i)) % gridDim.x;
    const uint64_t begin = per * b < bytes ? per * b : bytes;
    const uint64_t end = begin + per < bytes ? begin + per : bytes;
    if (end > begin) get<Scope::kBlock>(h, dst + begin, src + begin, end - begin, peer);
  }
}

// put or get (`get`) at thread or warp scope: each thread (each warp) of the
// grid moves its own slice of `bytes`, `iters` times (a get's unit takes the
// slice of the same unit of the next block each round, as get_kernel does,
// so that no round is served from its SM's L1); a put ends with quiet.
template <Scope S>
__global__ void scoped_kernel(Heap h, char* dst, const char* src, uint64_t bytes, int peer, int iters, int get) {
  const uint64_t size = S == Scope::kWarp ? 32 : 1;
  const uint64_t units = uint64_t(gridDim.x) * blockDim.x / size, per_block = blockDim.x / size;
  const uint64_t unit = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / size;
  const uint64_t per = ((bytes + units - 1) / units + 15) / 16 * 16;  // 16-byte slices where the size allows
  for (int i = 0; i < iters; ++i) {
    const uint64_t u = get ? (unit + uint64_t(i) * per_block) % units : unit;
    const uint64_t begin = per * u < bytes ? per * u : bytes;
    const uint64_t end = begin + per < bytes ? begin + per : bytes;
    if (end <= begin) continue;  // whole warps skip together: a warp's lanes share u
    if (get)
      ferry::device::get<S>(h, dst + begin, src + begin, end - begin, peer);
    else
      put<S>(h, dst + begin, src + begin, end - begin, peer);
  }
  if (!get) quiet();
}

// A put's latency at one scope: the first thread, warp or block of the grid
// puts `bytes` and waits for them to land (quiet), `iters` times.
template <Scope S>
__global__ void put_latency_kernel(Heap h, char* dst, const char* src, uint64_t bytes, int peer, int iters) {
  if (blockIdx.x != 0 || (S == Scope::kThread && threadIdx.x != 0) || (S == Scope::kWarp && threadIdx.x >= 32)) return;
  for (int i = 0; i < iters; ++i) {
    put<S>(h, dst, src, bytes, peer);
    if (S == Scope::kBlock) {
      if (threadIdx.x == 0) quiet();  // the block's barrier in put ordered every thread's stores before it
      __syncthreads();
    } else {
      quiet();
    }
  }
}

// g's latency: `iters` loads of the peer's words, each at an address the
// one before returned (the words are 0), so that none starts before the last
// one came back; each in another of kLatencyLines 128-byte lines (more than
// an L1 holds), so that none is served from a cache however g loads.
constexpr int kLatencyLines = 4096;
__global__ void g_latency_kernel(Heap h, const int64_t* src, int peer, int iters, int64_t* out) {
  int64_t v = 0;
  for (int i = 0; i < iters; ++i) v = g(h, src + v + int64_t(i % kLatencyLines) * 16, peer);
  *out = v;
}

// Ranks 0 and 1: rank 0 sets rank 1's word to base + i, rank 1 answers;
// iters round trips. `base` grows from launch to launch, so the words never
// need resetting.
__global__ void pingpong_kernel(Heap h, uint64_t* sig, uint64_t base, int iters, int* ok) {
  const int peer = 1 - h.rank;
  bool good = true;
  for (uint64_t i = base + 1; i <= base + iters && good; ++i) {
    if (h.rank == 0) {
      signal_op(h, sig, i, SignalOp::kSet, peer);
      good = signal_wait_until(h, sig, Cmp::kGe, i, peer);
    } else {
      good = signal_wait_until(h, sig, Cmp::kGe, i, peer);
      signal_op(h, sig, i, SignalOp::kSet, peer);
    }
  }
  if (!good) *ok = 0;
}

// The same with p() (a plain strong store, no release: NVSHMEM's signal_op orders nothing either) and wait_until.
__global__ void pingpong_p_kernel(Heap h, uint64_t* sig, uint64_t base, int iters, int* ok) {
  const int peer = 1 - h.rank;
  bool good = true;
  for (uint64_t i = base + 1; i <= base + iters && good; ++i) {
    if (h.rank == 0) {
      p(h, sig, i, peer);
      good = wait_until(h, sig, Cmp::kGe, i, peer);
    } else {
      good = wait_until(h, sig, Cmp::kGe, i, peer);
      p(h, sig, i, peer);
    }
  }
  if (!good) *ok = 0;
}

// An experiment, not the device API: a put whose NVLink writes are TMA bulk
// copies (cp.async.bulk) from shared memory, to see whether they beat the SM
// stores' ~350 GB/s ceiling (the copy engines reach 390). One thread per block
// drives a pipeline of kBulkStages chunks: a bulk load from src into shared
// memory, then a bulk store from there into the peer. Needs 16-byte aligned
// dst, src and a 16-byte multiple of bytes per block (the benchmark's sizes).
constexpr int kBulkStages = 4;
constexpr uint32_t kBulkChunk = 16384;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The same for gets: block b loads a slice of the peer's src (the next
// block's each round, as get_kernel) with kWords 16-byte words in flight per
// thread; a load waits for a round trip over NVLink, so more in flight may
// pay where it did not for stores.
template <int kWords>
__global__ void get_wide_kernel(Heap h, char* dst, const char* src, uint64_t bytes, int peer, int iters) {
  const uint64_t per = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16, n = blockDim.x;
  const uint4* remote = reinterpret_cast<const uint4*>(h.peer_ptr(src, peer));
  uint4* local = reinterpret_cast<uint4*>(dst);
  for (int it = 0; it < iters; ++it) {
    const uint64_t b = (blockIdx.x + uint64_t(it)) % gridDim.x;
    const uint64_t begin = per * b < bytes ? per * b : bytes;
    const uint64_t end = begin + per < bytes ? begin + per : bytes;
    const uint64_t first = begin / 16, words = (end - begin) / 16;
    uint64_t i = threadIdx.x;
    for (; i + (kWords - 1) * n < words; i += kWords * n) {
      uint4 v[kWords];
#pragma unroll
      for (int k = 0; k < kWords; ++k) v[k] = remote[first + i + k * n];
#pragma unroll
      for (int k = 0; k < kWords; ++k) local[first + i + k * n] = v[k];
    }
    for (; i < words; i += n) local[first + i] = remote[first + i];
  }
}

// An experiment on the put's store pipeline: block b stores its slice (16-byte
// aligned) with kWords 16-byte words in flight per thread (the device API's
// put keeps 8); the launcher picks the threads per block. Repeated
// `iters` times, then quiet, as put_kernel.
template <int kWords>
__global__ void put_wide_kernel(Heap h, char* dst, const char* src, uint64_t bytes, int peer, int iters) {
  const uint64_t per = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
  const uint64_t begin = per * blockIdx.x < bytes ? per * blockIdx.x : bytes;
  const uint64_t end = begin + per < bytes ? begin + per : bytes;
  uint4* d = reinterpret_cast<uint4*>(h.peer_ptr(dst + begin, peer));
  const uint4* s = reinterpret_cast<const uint4*>(src + begin);
  const uint64_t words = (end - begin) / 16, n = blockDim.x;
  for (int it = 0; it < iters; ++it) {
    uint64_t i = threadIdx.x;
    for (; i + (kWords - 1) * n < words; i += kWords * n) {
      uint4 v[kWords];
#pragma unroll
      for (int k = 0; k < kWords; ++k) v[k] = s[i + k * n];
#pragma unroll
      for (int k = 0; k < kWords; ++k) d[i + k * n] = v[k];
    }
    for (; i < words; i += n) d[i] = s[i];
    __syncthreads();
  }
  quiet();
}

__global__ void put_bulk_kernel(Heap h, char* dst, const char* src, uint64_t bytes, int peer, int iters) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) char stage[];
  __shared__ __align__(8) uint64_t full[kBulkStages];
  if (threadIdx.x != 0) return;
  const uint64_t per = ((bytes + gridDim.x - 1) / gridDim.x + 15) / 16 * 16;
  const uint64_t begin = per * blockIdx.x < bytes ? per * blockIdx.x : bytes;
  const uint64_t end = begin + per < bytes ? begin + per : bytes;
  char* remote = h.peer_ptr(dst, peer);
  for (int s = 0; s < kBulkStages; ++s)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[s])) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  uint32_t parity[kBulkStages] = {};
  const uint64_t len = end - begin, chunks = (len + kBulkChunk - 1) / kBulkChunk;
  auto load = [&](uint64_t c) {
    const int s = int(c % kBulkStages);
    const uint64_t off = begin + c * kBulkChunk;
    const uint32_t n = uint32_t(len - c * kBulkChunk < kBulkChunk ? len - c * kBulkChunk : kBulkChunk);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&full[s])), "r"(n)
                 : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_addr(stage + s * kBulkChunk)),
                 "l"(src + off), "r"(n), "r"(smem_addr(&full[s]))
                 : "memory");
  };
  for (int it = 0; it < iters; ++it) {
    for (uint64_t c = 0; c < chunks && c < kBulkStages; ++c) load(c);
    for (uint64_t c = 0; c < chunks; ++c) {
      const int s = int(c % kBulkStages);
      uint32_t done = 0;
      while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(smem_addr(&full[s])), "r"(parity[s])
                     : "memory");
      parity[s] ^= 1u;
      const uint64_t off = begin + c * kBulkChunk;
      const uint32_t n = uint32_t(len - c * kBulkChunk < kBulkChunk ? len - c * kBulkChunk : kBulkChunk);
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(remote + off),
                   "r"(smem_addr(stage + s * kBulkChunk)), "r"(n)
                   : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      // Refill the stage of the chunk before this one once its store has read it
      // (every group but the newest), so this store overlaps that load.
      if (c >= 1 && c - 1 + kBulkStages < chunks) {
        asm volatile("cp.async.bulk.wait_group.read 1;" ::: "memory");
        load(c - 1 + kBulkStages);
      }
    }
    // Every store read its stage before the next iteration loads into it again.
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
  }
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  quiet();
#else
  __trap();  // no bulk copies before sm_90: fail loudly rather than time an empty kernel
#endif
}

// References for the A/B of the device API's waits: a wait that looks with
// relaxed loads and reads the word once more with acquire once it sees the
// value (the form the API's acquire polls replaced), p + wait_until and a
// one-block barrier; and that barrier polling with acquire loads.
__device__ __forceinline__ uint64_t ref_load_relaxed(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
using ferry::device::impl::load_acquire;

__global__ void pingpong_p_relaxed_poll_kernel(Heap h, uint64_t* sig, uint64_t base, int iters, int* ok) {
  const int peer = 1 - h.rank;
  for (uint64_t i = base + 1; i <= base + iters; ++i) {
    if (h.rank == 0) p(h, sig, i, peer);
    const uint64_t t0 = clock64();
    while (ref_load_relaxed(sig) < i)
      if (clock64() - t0 > (1ull << 36)) {  // about 30 s: a reference, not the API (no fault word)
        *ok = 0;
        return;
      }
    (void)load_acquire(sig);
    if (h.rank == 1) p(h, sig, i, peer);
  }
}

// kAcquirePoll: the same barrier polling with acquire loads (the poll apart from the rest of the barrier's shape).
template <bool kAcquirePoll>
__global__ void barrier_reference_kernel(Heap h, int iters, int* ok) {
  HeapSync* own = h.sync(h.rank);
  for (int it = 0; it < iters; ++it) {
    __syncthreads();
    const int lane = threadIdx.x;
    if (lane < h.world && lane != h.rank) {
      asm volatile("fence.acq_rel.sys;" ::: "memory");
      const uint64_t want = ++own->completed[lane];
      asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(&h.sync(lane)->arrivals[h.rank]), "l"(want) : "memory");
      const uint64_t t0 = clock64();
      while ((kAcquirePoll ? load_acquire(&own->arrivals[lane]) : ref_load_relaxed(&own->arrivals[lane])) < want)
        if (clock64() - t0 > (1ull << 36)) {
          *ok = 0;
          break;
        }
      if (!kAcquirePoll) (void)load_acquire(&own->arrivals[lane]);
    }
    __syncthreads();
  }
}

__global__ void barrier_kernel(Heap h, int iters, int* ok) {
  const Team t = world_team(h);
  for (int i = 0; i < iters; ++i)
    if (!barrier<Scope::kBlock>(h, t)) {
      if (threadIdx.x == 0) *ok = 0;
      return;
    }
}

// barrier_on_stream's kernel form as a plain launch, one barrier a launch:
// the reference for its programmatic (PDL) launch.
__global__ void stream_barrier_plain_kernel(Heap h, int* ok) {
  if (!barrier<Scope::kWarp>(h, world_team(h)) && threadIdx.x == 0) *ok = 0;
}

// Where a two-shot all-reduce's time goes (an experiment: --two-shot-phases):
// its grid-wide barrier alone, and its data phase alone (reduce this rank's
// part from every member's src, push it into every member's dst) with no
// barrier around it, so its result is not checked.
__global__ void grid_barrier_kernel(Heap h, int iters, int* ok) {
  const Team t = world_team(h);
  for (int i = 0; i < iters; ++i)
    if (!barrier_all(h, t)) {
      if (threadIdx.x == 0) *ok = 0;
      return;
    }
}

__global__ void two_shot_data_kernel(Heap h, __nv_bfloat16* dst, const __nv_bfloat16* src, uint64_t count, int iters) {
  const Team t = world_team(h);
  for (int i = 0; i < iters; ++i) impl::reduce_and_push(h, t, dst, src, count, ReduceOp::kSum);
}

__global__ void all_reduce_kernel(Heap h, __nv_bfloat16* dst, const __nv_bfloat16* src, uint64_t count, int iters,
                                  AllReduceAlgo algo, int* ok) {
  const Team t = world_team(h);
  for (int i = 0; i < iters; ++i)
    if (!all_reduce(h, t, dst, src, count, ReduceOp::kSum, algo)) {
      if (threadIdx.x == 0) *ok = 0;
      return;
    }
}

using WideKernel = void (*)(Heap, char*, const char*, uint64_t, int, int);

// put_wide_kernel or get_wide_kernel with 4, 8 or 16 words in flight (`by_words`, in that order).
int launch_wide(const WideKernel (&by_words)[3], const void* heap, void* dst, const void* src, uint64_t bytes, int peer,
                int iters, int blocks, int threads, int words, cudaStream_t s) {
  if (bytes % 16 || reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16)
    return cudaErrorInvalidValue;
  const int k = words == 4 ? 0 : words == 8 ? 1 : words == 16 ? 2 : -1;
  if (k < 0) return cudaErrorInvalidValue;
  by_words[k]<<<blocks, threads, 0, s>>>(heap_from_bytes(heap), static_cast<char*>(dst), static_cast<const char*>(src),
                                         bytes, peer, iters);
  return cudaGetLastError();
}

}  // namespace

extern "C" {

int bench_put(const void* heap, void* dst, const void* src, uint64_t bytes, int peer, int iters, int blocks,
              cudaStream_t s) {
  put_kernel<<<blocks, 512, 0, s>>>(heap_from_bytes(heap), static_cast<char*>(dst), static_cast<const char*>(src),
                                    bytes, peer, iters);
  return cudaGetLastError();
}

int bench_get(const void* heap, void* dst, const void* src, uint64_t bytes, int peer, int iters, int blocks,
              cudaStream_t s) {
  get_kernel<<<blocks, 512, 0, s>>>(heap_from_bytes(heap), static_cast<char*>(dst), static_cast<const char*>(src),
                                    bytes, peer, iters);
  return cudaGetLastError();
}

int bench_put_bulk(const void* heap, void* dst, const void* src, uint64_t bytes, int peer, int iters, int blocks,
                   cudaStream_t s) {
  // Bulk copies take 16-byte aligned addresses and sizes; a misaligned one is a sticky fault.
  if (bytes % 16 || reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16)
    return cudaErrorInvalidValue;
  // More than the 48 KB of shared memory a launch gets without asking; set on every launch, since each
  // GPU (one process may drive several) keeps its own.
  const cudaError_t attr =
      cudaFuncSetAttribute(put_bulk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkStages * kBulkChunk);
  if (attr != cudaSuccess) return attr;
  put_bulk_kernel<<<blocks, 32, kBulkStages * kBulkChunk, s>>>(heap_from_bytes(heap), static_cast<char*>(dst),
                                                               static_cast<const char*>(src), bytes, peer, iters);
  return cudaGetLastError();
}

int bench_put_wide(const void* heap, void* dst, const void* src, uint64_t bytes, int peer, int iters, int blocks,
                   int threads, int words, cudaStream_t s) {
  return launch_wide({put_wide_kernel<4>, put_wide_kernel<8>, put_wide_kernel<16>}, heap, dst, src, bytes, peer, iters,
                     blocks, threads, words, s);
}

int bench_get_wide(const void* heap, void* dst, const void* src, uint64_t bytes, int peer, int iters, int blocks,
                   int threads, int words, cudaStream_t s) {
  return launch_wide({get_wide_kernel<4>, get_wide_kernel<8>, get_wide_kernel<16>}, heap, dst, src, bytes, peer, iters,
                     blocks, threads, words, s);
}

int bench_scoped(const void* heap, void* dst, const void* src, uint64_t bytes, int peer, int iters, int blocks,
                 int scope, int get, cudaStream_t s) {
  const Heap h = heap_from_bytes(heap);
  char* d = static_cast<char*>(dst);
  const char* c = static_cast<const char*>(src);
  if (scope == 0)
    scoped_kernel<Scope::kThread><<<blocks, 512, 0, s>>>(h, d, c, bytes, peer, iters, get);
  else
    scoped_kernel<Scope::kWarp><<<blocks, 512, 0, s>>>(h, d, c, bytes, peer, iters, get);
  return cudaGetLastError();
}

int bench_put_latency(const void* heap, void* dst, const void* src, uint64_t bytes, int peer, int iters, int scope,
                      cudaStream_t s) {
  const Heap h = heap_from_bytes(heap);
  char* d = static_cast<char*>(dst);
  const char* c = static_cast<const char*>(src);
  if (scope == 0)
    put_latency_kernel<Scope::kThread><<<1, 32, 0, s>>>(h, d, c, bytes, peer, iters);
  else if (scope == 1)
    put_latency_kernel<Scope::kWarp><<<1, 32, 0, s>>>(h, d, c, bytes, peer, iters);
  else
    put_latency_kernel<Scope::kBlock><<<1, 512, 0, s>>>(h, d, c, bytes, peer, iters);
  return cudaGetLastError();
}

int bench_g_latency(const void* heap, const void* src, int peer, int iters, void* out, cudaStream_t s) {
  g_latency_kernel<<<1, 1, 0, s>>>(heap_from_bytes(heap), static_cast<const int64_t*>(src), peer, iters,
                                   static_cast<int64_t*>(out));
  return cudaGetLastError();
}

int bench_pingpong(const void* heap, uint64_t* sig, uint64_t base, int iters, int* ok, cudaStream_t s) {
  pingpong_kernel<<<1, 1, 0, s>>>(heap_from_bytes(heap), sig, base, iters, ok);
  return cudaGetLastError();
}

int bench_pingpong_p(const void* heap, uint64_t* sig, uint64_t base, int iters, int* ok, cudaStream_t s) {
  pingpong_p_kernel<<<1, 1, 0, s>>>(heap_from_bytes(heap), sig, base, iters, ok);
  return cudaGetLastError();
}

int bench_pingpong_p_relaxed_poll(const void* heap, uint64_t* sig, uint64_t base, int iters, int* ok, cudaStream_t s) {
  pingpong_p_relaxed_poll_kernel<<<1, 1, 0, s>>>(heap_from_bytes(heap), sig, base, iters, ok);
  return cudaGetLastError();
}

int bench_barrier_relaxed_poll(const void* heap, int iters, int* ok, cudaStream_t s) {
  barrier_reference_kernel<false><<<1, 32, 0, s>>>(heap_from_bytes(heap), iters, ok);
  return cudaGetLastError();
}

int bench_barrier_reference_acquire_poll(const void* heap, int iters, int* ok, cudaStream_t s) {
  barrier_reference_kernel<true><<<1, 32, 0, s>>>(heap_from_bytes(heap), iters, ok);
  return cudaGetLastError();
}

int bench_barrier(const void* heap, int iters, int* ok, cudaStream_t s) {
  barrier_kernel<<<1, 32, 0, s>>>(heap_from_bytes(heap), iters, ok);
  return cudaGetLastError();
}

int bench_stream_barrier_plain(const void* heap, int* ok, cudaStream_t s) {
  stream_barrier_plain_kernel<<<1, 32, 0, s>>>(heap_from_bytes(heap), ok);
  return cudaGetLastError();
}

int bench_grid_barrier(const void* heap, int iters, int blocks, int* ok, cudaStream_t s) {
  grid_barrier_kernel<<<blocks, 512, 0, s>>>(heap_from_bytes(heap), iters, ok);
  return cudaGetLastError();
}

int bench_two_shot_data(const void* heap, void* dst, const void* src, uint64_t count, int iters, int blocks,
                        int threads, cudaStream_t s) {
  two_shot_data_kernel<<<blocks, threads, 0, s>>>(heap_from_bytes(heap), static_cast<__nv_bfloat16*>(dst),
                                                  static_cast<const __nv_bfloat16*>(src), count, iters);
  return cudaGetLastError();
}

// The all-reduce with `threads` per block instead of 512 (--two-shot-phases): with fewer threads each one
// takes several vectors in turn, so its next loads go out while its last stores drain.
int bench_all_reduce_threads(const void* heap, void* dst, const void* src, uint64_t count, int iters, int blocks,
                             int threads, int algo, int* ok, cudaStream_t s) {
  all_reduce_kernel<<<blocks, threads, 0, s>>>(heap_from_bytes(heap), static_cast<__nv_bfloat16*>(dst),
                                               static_cast<const __nv_bfloat16*>(src), count, iters,
                                               static_cast<AllReduceAlgo>(algo), ok);
  return cudaGetLastError();
}

// algo: AllReduceAlgo's value (0 auto, 1 low latency, 2 one-shot, 3 two-shot, 4 low-latency two-shot,
// 5 per-block two-shot).
int bench_all_reduce(const void* heap, void* dst, const void* src, uint64_t count, int iters, int blocks, int algo,
                     int* ok, cudaStream_t s) {
  all_reduce_kernel<<<blocks, 512, 0, s>>>(heap_from_bytes(heap), static_cast<__nv_bfloat16*>(dst),
                                           static_cast<const __nv_bfloat16*>(src), count, iters,
                                           static_cast<AllReduceAlgo>(algo), ok);
  return cudaGetLastError();
}

}  // extern "C"
