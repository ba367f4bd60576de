// The SM path's kernel: pushes by stores, one flag per peer, waits by
// spinning, copy out of the window (coll/sm_path.hpp says why it is safe).
#include <algorithm>
#include <cstring>
#include <limits>

#include "coll/copy_words.cuh"
#include "coll/kernel_wait.cuh"
#include "coll/reduce_math.cuh"
#include "coll/sm_path_kernel.hpp"
#include "core/cuda_scope.hpp"
#include "core/error.hpp"

namespace ferry {
namespace {

constexpr int kThreads = kSmPathThreads;
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

// What a call does with its peers' data once it is in the window: copy it
// into the output (NoReduction), or reduce every rank's span into the output
// (Reduction<T, Op>: reduce_scatter, all_reduce).
struct NoReduction {};
template <typename T, RedOp Op>
struct Reduction {
  using type = T;
  static constexpr RedOp op = Op;
};
template <typename R>
constexpr bool is_reduction = !std::is_same_v<R, NoReduction>;

// Every rank's contribution in rank order: this rank's from its input, the
// peers' from their slots of this rank's window.
struct SmPathSources {
  const char* src[kSmPathMaxRanks];
};

// ---- the low-latency format (coll/sm_path_ll.hpp)

// One unit: data word, flag, data word, flag, in one 16-byte store. Each
// 8-byte half lands whole, so a half whose flag is current holds current data.
__device__ void ll_store(char* unit, SmPathUnitData v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(unit), "r"(v.lo), "r"(flag), "r"(v.hi),
               "r"(flag)
               : "memory");
}

__device__ bool ll_load(const char* unit, uint32_t flag, SmPathUnitData* v) {
  uint32_t d0, f0, d1, f1;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
               : "l"(unit)
               : "memory");
  v->lo = d0;
  v->hi = d1;
  return f0 == flag && f1 == flag;
}

// A reduction's receiving side in the low-latency format: per unit, every
// rank's data in rank order (this rank's from its input, the others as their
// units arrive), reduced and written out. The thread that reduces a unit is
// the one that sent it (same share, same stride), so an in-place all_reduce
// overwrites only input this thread has already sent.
template <typename T, RedOp Op>
__device__ void reduce_low_latency(const SmPathStep& s, const SmPathWindows& w, size_t slot_bytes, const KernelWait& c,
                                   uint64_t call, int parity, uint32_t flag) {
  using A = typename Acc<T>::type;
  constexpr int E = 8 / sizeof(T);
  const size_t n = s.recv_bytes[s.rank];  // every rank's span is this long
  const char* own = s.in + s.send_offset[s.rank];
  size_t u0 = 0;
  const size_t end = sm_path_ll_share(sm_path_ll_units(n), s.blocks, blockIdx.x, &u0);
  for (size_t u = u0 + threadIdx.x; u < end; u += blockDim.x) {
    const size_t avail = n > 8 * u ? n - 8 * u : 0;
    A acc[E];
    for (int q = 0; q < s.world; ++q) {
      SmPathUnitData v;
      if (q == s.rank) {
        v = sm_path_ll_pack(own + 8 * u, avail);
      } else {
        const char* slot = w.base[s.rank] + sm_path_ll_slot_offset(s.world, slot_bytes, parity, q);
        if (!wait_for([&] { return ll_load(slot + 16 * u, flag, &v); }, c, q, call)) return;
      }
      T e[E];
      memcpy(e, &v, 8);
#pragma unroll
      for (int k = 0; k < E; ++k) acc[k] = q == 0 ? static_cast<A>(e[k]) : combine<Op>(acc[k], static_cast<A>(e[k]));
    }
    T e[E];
#pragma unroll
    for (int k = 0; k < E; ++k) e[k] = static_cast<T>(acc[k]);
    SmPathUnitData r;
    memcpy(&r, e, 8);
    sm_path_ll_unpack(s.out + 8 * u, r, avail);
  }
}

// The exchange in the low-latency format: every peer gets its units (at
// least one), then this block waits for its share of every peer's units and
// writes their data (or, for a reduction, the reduced data) out. No barrier
// and no fence: each unit is its own flag.
template <typename R>
__device__ void exchange_low_latency(const SmPathStep& s, const SmPathWindows& w, size_t slot_bytes,
                                     const KernelWait& c, uint64_t call, int parity) {
  const uint32_t flag = sm_path_ll_flag(call, s.tag);
  size_t u0 = 0;
  for (int k = 1; k < s.world; ++k) {
    const int p = (s.rank + k) % s.world;
    const char* src = s.in + s.send_offset[p];
    char* slot = w.base[p] + sm_path_ll_slot_offset(s.world, slot_bytes, parity, s.rank);
    const size_t n = s.send_bytes[p];
    const size_t end = sm_path_ll_share(sm_path_ll_units(n), s.blocks, blockIdx.x, &u0);
    for (size_t u = u0 + threadIdx.x; u < end; u += blockDim.x)
      ll_store(slot + 16 * u, sm_path_ll_pack(src + 8 * u, n > 8 * u ? n - 8 * u : 0), flag);
  }
  if constexpr (is_reduction<R>) {
    reduce_low_latency<typename R::type, R::op>(s, w, slot_bytes, c, call, parity, flag);
    return;
  }
  size_t begin = 0, len = 0;
  if ((len = sm_path_span_share(s.own_bytes, s.blocks, blockIdx.x, &begin)) > 0)
    copy_span(s.out + s.recv_offset[s.rank] + begin, s.in + s.send_offset[s.rank] + begin, len);
  for (int k = 1; k < s.world; ++k) {
    const int q = (s.rank - k + s.world) % s.world;  // the peer that wrote to us first
    const char* slot = w.base[s.rank] + sm_path_ll_slot_offset(s.world, slot_bytes, parity, q);
    char* dst = s.out + s.recv_offset[q];
    const size_t n = s.recv_bytes[q];
    const size_t end = sm_path_ll_share(sm_path_ll_units(n), s.blocks, blockIdx.x, &u0);
    for (size_t u = u0 + threadIdx.x; u < end; u += blockDim.x) {
      SmPathUnitData v;
      if (!wait_for([&] { return ll_load(slot + 16 * u, flag, &v); }, c, q, call)) return;
      sm_path_ll_unpack(dst + 8 * u, v, n > 8 * u ? n - 8 * u : 0);
    }
  }
}

// Which pushes a block makes (push_shares): a whole call's (kWhole), or a
// two-shot all_reduce round's (SmPathStep::two_shot_rounds): kScatter sends
// the round's piece of part p of `in` into rank p's slots (rank p reduces
// it into its part of `out`), kGather stores this rank's reduced piece
// straight into every peer's `out`.
enum class Shot { kWhole, kScatter, kGather };

// Where a two-shot round lies in every part: bytes [at, at + chunk) (for
// kWhole: at 0, chunk 0, the whole spans).
struct Round {
  size_t at = 0;
  size_t chunk = 0;
};

// This block's share of a span of `full` bytes in round `r`: the round's
// piece of the span, cut as every round is (sm_path_round_share).
__device__ size_t round_share(size_t full, Round r, int blocks, size_t* begin) {
  if (r.chunk == 0) return sm_path_span_share(full, blocks, blockIdx.x, begin);
  const size_t piece = full > r.at ? (full - r.at < r.chunk ? full - r.at : r.chunk) : 0;
  return sm_path_round_share(piece, r.chunk, blocks, blockIdx.x, begin);
}

// A reduction's last step with flags: this block's share of the result (of
// round `r`'s piece) from every rank's span in rank order (16-byte words
// where everything is aligned).
template <typename T, RedOp Op>
__device__ void reduce_out(const SmPathStep& s, char* out, const SmPathWindows& w, size_t slot_bytes, int parity,
                           Round r) {
  size_t begin = 0;
  const size_t len = round_share(s.recv_bytes[s.rank], r, s.blocks, &begin);
  if (len == 0) return;
  SmPathSources in;
  for (int q = 0; q < s.world; ++q)
    in.src[q] = q == s.rank ? s.in + s.send_offset[q] + r.at + begin
                            : w.base[s.rank] + sm_path_slot_offset(s.world, slot_bytes, parity, q) + begin;
  reduce_range<T, Op, kUnroll>(reinterpret_cast<T*>(out + r.at + begin), in, s.world, len / sizeof(T), 0, 1);
}

// The pieces of an exchange with one flag per peer and block (blocks above
// kSmPathLowLatencyMaxBytes).

// 1. This block's pushes, in cyclic-shift order: kWhole and kScatter into the
// peers' slots of `parity` (kWhole also copies the own block into `out`),
// kGather this rank's reduced piece straight into the peers' outputs.
template <Shot kShot>
__device__ void push_shares(const SmPathStep& s, const SmPathWindows& w, size_t slot_bytes, int parity, Round r) {
  size_t begin = 0, len = 0;
  for (int k = 1; k < s.world; ++k) {
    const int p = (s.rank + k) % s.world;
    const char* src = (kShot == Shot::kGather ? s.out + s.recv_offset[s.rank] : s.in + s.send_offset[p]) + r.at;
    const size_t n = kShot == Shot::kGather ? s.recv_bytes[s.rank] : s.send_bytes[p];
    char* dst = kShot == Shot::kGather ? s.out_by_rank[p] + s.recv_offset[s.rank] + r.at
                                       : w.base[p] + sm_path_slot_offset(s.world, slot_bytes, parity, s.rank);
    if ((len = round_share(n, r, s.blocks, &begin)) > 0) copy_span(dst + begin, src + begin, len);
  }
  if (kShot == Shot::kWhole && (len = sm_path_span_share(s.own_bytes, s.blocks, blockIdx.x, &begin)) > 0)
    copy_span(s.out + s.recv_offset[s.rank] + begin, s.in + s.send_offset[s.rank] + begin, len);
}

// 2. One flag per peer, after the block's stores: the caller's barrier orders
// them before thread 0's release store, and a release at system scope covers
// what its thread has synchronized with (the pattern NCCL uses: barrier,
// fence, flag; st.release.sys is that fence and store). Every rank signals
// every peer, with or without data: it tells the peer that this rank's
// previous call is over.
__device__ void signal_peers(const SmPathStep& s, const SmPathWindows& w, uint64_t call) {
  if (threadIdx.x != 0) return;
  const uint64_t value = sm_path_flag_value(call, s.tag);
  for (int k = 1; k < s.world; ++k) {
    const int p = (s.rank + k) % s.world;
    store_release(&reinterpret_cast<SmPathHeader*>(w.base[p])->flags[s.rank][blockIdx.x], value);
  }
}

// 3. Waits for each peer's flag for this block (or its next call's, which may
// have replaced it: sm_path_flag_passes), bounded; a barrier of the block
// after. False where a wait gave up (the fault word tells the host).
__device__ bool wait_peers(const SmPathStep& s, const SmPathWindows& w, const KernelWait& c, uint64_t call) {
  const auto* mine = reinterpret_cast<const SmPathHeader*>(w.base[s.rank]);
  bool gave_up = false;
  if (threadIdx.x < s.world && threadIdx.x != s.rank) {
    const uint64_t* flag = &mine->flags[threadIdx.x][blockIdx.x];
    gave_up = !wait_for([&] { return sm_path_flag_passes(load_acquire(flag), call, s.tag); }, c, threadIdx.x, call);
  }
  return !__syncthreads_or(gave_up);
}

// A whole call: pushes, a barrier, the flags, waits, then out of the window
// into the output (or reduced into it). The barrier after the waits also
// keeps an in-place all_reduce from overwriting input this block still sends.
template <typename R>
__device__ void exchange_with_flags(const SmPathStep& s, const SmPathWindows& w, size_t slot_bytes, const KernelWait& c,
                                    uint64_t call, int parity) {
  push_shares<Shot::kWhole>(s, w, slot_bytes, parity, Round{});
  __syncthreads();
  signal_peers(s, w, call);
  if (!wait_peers(s, w, c, call)) return;
  if constexpr (is_reduction<R>) {
    reduce_out<typename R::type, R::op>(s, s.out, w, slot_bytes, parity, Round{});
  } else {
    size_t begin = 0, len = 0;
    for (int q = 0; q < s.world; ++q)
      if (q != s.rank && (len = sm_path_span_share(s.recv_bytes[q], s.blocks, blockIdx.x, &begin)) > 0)
        copy_span(s.out + s.recv_offset[q] + begin,
                  w.base[s.rank] + sm_path_slot_offset(s.world, slot_bytes, parity, q) + begin, len);
  }
}

// A two-shot all_reduce (SmPathStep::two_shot_rounds, R rounds) as steps
// `call` to `call + R`, one flag each, pipelined: step k's flag says that
// this block has pushed round k's first shot (its share of part p's piece k
// into rank p's slots of parity (call + k) & 1) and round k - 1's second
// (its share of the reduced piece k - 1 straight into every peer's `out`).
// Between the waits for steps k and k + 1 a block reduces round k's piece,
// pushes it, and pushes round k + 1's first shot; the last step only tells
// that the last round's results have landed. Why each store is safe, for a
// block and the peer's block of the same index (every round is cut into the
// blocks' shares alike, sm_path_round_share, so they touch the same bytes):
// - round k + 1's first shot rewrites the slots of parity (call + k + 1) & 1,
//   which the peer's block read in round k - 1, before it sent the flag of
//   step k that this block has waited for;
// - a second shot sends only the share of the piece this block reduced
//   itself, so no block waits for the rest of its grid;
// - in place, round k's second shot lands where the peer's block sent its
//   input in round k's first shot, before its flag of step k.
// The kernel after this one starts once every block has seen step R from
// every peer, after which no peer reads a slot of this call.
template <typename R>
__device__ void two_shot(const SmPathStep& s, const SmPathWindows& w, size_t slot_bytes, const KernelWait& c,
                         uint64_t call) {
  const uint32_t rounds = s.two_shot_rounds;
  const size_t chunk = s.two_shot_chunk;
  push_shares<Shot::kScatter>(s, w, slot_bytes, static_cast<int>(call & 1), Round{0, chunk});
  __syncthreads();
  signal_peers(s, w, call);
  for (uint32_t k = 0; k < rounds; ++k) {
    const uint64_t e = call + k;
    const Round r{k * chunk, chunk};
    if (!wait_peers(s, w, c, e)) return;
    reduce_out<typename R::type, R::op>(s, s.out + s.recv_offset[s.rank], w, slot_bytes, static_cast<int>(e & 1), r);
    __syncthreads();  // the block's reduced share whole before its threads send it
    push_shares<Shot::kGather>(s, w, slot_bytes, 0, r);
    if (k + 1 < rounds)
      push_shares<Shot::kScatter>(s, w, slot_bytes, static_cast<int>((e + 1) & 1), Round{r.at + chunk, chunk});
    __syncthreads();
    signal_peers(s, w, e + 1);
  }
  wait_peers(s, w, c, call + rounds);
}

template <typename R>
__global__ void __launch_bounds__(kThreads)
    sm_path_kernel(SmPathStep s, SmPathWindows w, size_t slot_bytes, KernelWait c) {
  auto* mine = reinterpret_cast<SmPathHeader*>(w.base[s.rank]);
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
  if (s.low_latency) {
    exchange_low_latency<R>(s, w, slot_bytes, c, call, parity);
  } else if constexpr (is_reduction<R>) {
    if (s.two_shot_rounds)
      two_shot<R>(s, w, slot_bytes, c, call);
    else
      exchange_with_flags<R>(s, w, slot_bytes, c, call, parity);
  } else {
    exchange_with_flags<R>(s, w, slot_bytes, c, call, parity);
  }

  // The last block to finish counts the call (a two-shot all_reduce's R rounds count R + 1).
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(&mine->arrivals, 1u) == static_cast<unsigned>(s.blocks) - 1) {
      mine->arrivals = 0;
      *reinterpret_cast<volatile uint64_t*>(&mine->calls) = call + s.two_shot_rounds;
      __threadfence();
    }
  }
}

// The kernel for a step: copies, or a reduction of the step's type and operation.
template <typename F>
void with_kernel(const SmPathStep& s, F&& f) {
  if (s.dtype == 0) return f(sm_path_kernel<NoReduction>);
  with_reduction(static_cast<DType>(s.dtype), static_cast<RedOp>(s.red_op), [&](auto type, auto red) {
    f(sm_path_kernel<Reduction<typename decltype(type)::type, decltype(red)::value>>);
  });
}

}  // namespace

void load_sm_path_kernels() {
  cudaFuncAttributes a;
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, sm_path_kernel<NoReduction>));
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kFloat64, DType::kInt64})
    for (RedOp op : {RedOp::kSum, RedOp::kMax, RedOp::kMin}) {
      SmPathStep s;
      s.dtype = static_cast<uint32_t>(t);
      s.red_op = static_cast<uint32_t>(op);
      with_kernel(s, [&](auto kernel) { FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, kernel)); });
    }
}

int sm_path_resident_blocks(int device) {
  DeviceScope on(device);
  int sms = 0;
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  int fewest = std::numeric_limits<int>::max();
  auto look = [&](auto kernel) {
    int n = 0;
    FERRY_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, 0));
    fewest = std::min(fewest, n);
  };
  look(sm_path_kernel<NoReduction>);
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kFloat64, DType::kInt64})
    for (RedOp op : {RedOp::kSum, RedOp::kMax, RedOp::kMin}) {
      SmPathStep s;
      s.dtype = static_cast<uint32_t>(t);
      s.red_op = static_cast<uint32_t>(op);
      with_kernel(s, look);
    }
  return sms * fewest;
}

void launch_sm_path(const SmPathStep& s, const SmPathWindows& w, size_t slot_bytes, const KernelWait& c,
                    cudaStream_t stream) {
  with_kernel(s, [&](auto kernel) { kernel<<<s.blocks, kThreads, 0, stream>>>(s, w, slot_bytes, c); });
  FERRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ferry
