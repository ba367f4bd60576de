// The arithmetic of ferry's reductions, shared by the reduction kernel after
// copy-engine moves (coll/reduce.cu) and the SM path (coll/sm_path.cu):
//   out[i] = src[0][i] op src[1][i] op ... op src[n-1][i]
// with the sources in rank order, so every rank and every variant computes
// the same bits; accumulated in float for 16-bit floats, rounded once.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "coll/reduce.hpp"
#include "core/host_device.hpp"

namespace ferry {

template <typename T>
struct Acc {
  using type = T;
};
template <>
struct Acc<__half> {
  using type = float;
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
};

template <RedOp Op, typename A>
__device__ inline A combine(A a, A b) {
  if constexpr (Op == RedOp::kMax)
    return a > b ? a : b;
  else if constexpr (Op == RedOp::kMin)
    return a < b ? a : b;
  else
    return a + b;
}

// One rank's contribution per entry, in rank order.
constexpr int kReduceMaxSources = 64;
struct ReduceSources {
  const char* src[kReduceMaxSources];
};

template <typename Sources>
FERRY_HOST_DEVICE inline bool reduce_aligned16(const void* out, const Sources& in, int n) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(out);
  for (int k = 0; k < n; ++k) bits |= reinterpret_cast<uintptr_t>(in.src[k]);
  return bits % 16 == 0;
}

// Elements [first + thread, count) in steps of `threads`, one at a time (any
// alignment). `Sources`: anything with a `src` array (ReduceSources, or a
// smaller one where fewer ranks are possible).
template <typename T, RedOp Op, typename Sources>
__device__ inline void reduce_elements(T* __restrict__ out, const Sources& in, int n, size_t first, size_t count,
                                       size_t thread, size_t threads) {
  using A = typename Acc<T>::type;
  for (size_t i = first + thread; i < count; i += threads) {
    A acc = static_cast<A>(reinterpret_cast<const T*>(in.src[0])[i]);
    for (int k = 1; k < n; ++k) acc = combine<Op>(acc, static_cast<A>(reinterpret_cast<const T*>(in.src[k])[i]));
    out[i] = static_cast<T>(acc);
  }
}

// 16-byte words [i, n16) of out and every source (all 16-byte aligned), in
// groups of kUnroll words `lane` apart, the next group `group` further (as
// copy_words). Sources are loaded several at a time (two, or four for
// 16-bit types), so that 8 x 16 bytes or more per thread are in flight before
// each use (with one source at a time past the first two, 4 or 8 sources
// reduced at about 2 TB/s with 32 blocks against 2.9 for 2:
// bench/results/2026-11-24-NVIDIA-H200-reduce-kernel.*). They are still
// added in rank order. Streaming loads and stores: every byte
// is read or written once.
//
// kTwo (n == 2, the common case on 2 GPUs): each output word straight from
// the two sources' words, with no accumulators held across loads, so 16-bit
// types can keep as many words in flight as the others. kAtOnce: sources
// loaded together otherwise (2, or 4 where the registers allow).
template <typename T, RedOp Op, int kUnroll, bool kTwo, int kAtOnce, typename Sources>
__device__ inline void reduce_words(T* __restrict__ out, const Sources& in, int n, size_t n16, size_t i, size_t lane,
                                    size_t group) {
  using A = typename Acc<T>::type;
  constexpr int E = 16 / sizeof(T);
  auto* out16 = reinterpret_cast<uint4*>(out);
  for (; i < n16; i += group) {
    // Named arrays, not v[kAtOnce][kUnroll] with loops: that form, tried, made
    // bf16 with 3-8 sources 6-11% slower (docs/performance-log.md).
    uint4 a[kUnroll], b[kUnroll], c[kUnroll], d[kUnroll];  // c, d: with kAtOnce 4 only
    auto load = [&](uint4* v, int k) {
      auto* p = reinterpret_cast<const uint4*>(in.src[k]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i + u * lane < n16) v[u] = __ldcs(p + i + u * lane);
    };
    auto add = [&](A(&acc)[kUnroll][E], const uint4* v) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int e = 0; e < E; ++e)
          acc[u][e] = combine<Op>(acc[u][e], static_cast<A>(reinterpret_cast<const T*>(&v[u])[e]));
    };
    load(a, 0);
    if (n > 1) load(b, 1);
    if constexpr (kTwo) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (i + u * lane >= n16) continue;
        uint4 w;
#pragma unroll
        for (int e = 0; e < E; ++e)
          reinterpret_cast<T*>(&w)[e] =
              static_cast<T>(combine<Op>(static_cast<A>(reinterpret_cast<const T*>(&a[u])[e]),
                                         static_cast<A>(reinterpret_cast<const T*>(&b[u])[e])));
        __stcs(out16 + i + u * lane, w);
      }
      continue;
    }
    static_assert(kAtOnce == 2 || kAtOnce == 4, "two or four sources at a time");
    if (kAtOnce > 2 && n > 2) load(c, 2);
    if (kAtOnce > 3 && n > 3) load(d, 3);
    A acc[kUnroll][E];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[u][e] = static_cast<A>(reinterpret_cast<const T*>(&a[u])[e]);
    if (n > 1) add(acc, b);
    if (kAtOnce > 2 && n > 2) add(acc, c);
    if (kAtOnce > 3 && n > 3) add(acc, d);
    for (int k = kAtOnce; k < n; k += kAtOnce) {
      load(a, k);
      if (k + 1 < n) load(b, k + 1);
      if (kAtOnce > 2 && k + 2 < n) load(c, k + 2);
      if (kAtOnce > 3 && k + 3 < n) load(d, k + 3);
      add(acc, a);
      if (k + 1 < n) add(acc, b);
      if (kAtOnce > 2 && k + 2 < n) add(acc, c);
      if (kAtOnce > 3 && k + 3 < n) add(acc, d);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u * lane >= n16) continue;
      uint4 w;
#pragma unroll
      for (int e = 0; e < E; ++e) reinterpret_cast<T*>(&w)[e] = static_cast<T>(acc[u][e]);
      __stcs(out16 + i + u * lane, w);
    }
  }
}

// `count` elements of out from every source: 16-byte words where out and
// every source are 16-byte aligned, elements otherwise and for the tail.
// The threads of `groups` thread blocks take part (this block is number
// `group`): the whole grid in the reduction kernel, one block in the SM path.
// kAtOnce: how many sources reduce_words loads together past two sources
// (its comment); the reduction kernel lets 16-bit types take 4.
template <typename T, RedOp Op, int kUnroll, int kAtOnce = 2, typename Sources>
__device__ inline void reduce_range(T* __restrict__ out, const Sources& in, int n, size_t count, size_t group,
                                    size_t groups) {
  const size_t lane = blockDim.x;
  size_t first = 0;
  if (reduce_aligned16(out, in, n)) {
    constexpr size_t E = 16 / sizeof(T);
    if (n == 2) {
      // No accumulators: 16-bit types, which keep fewer words for theirs, take twice as many here.
      constexpr int U = sizeof(T) >= 4 ? kUnroll : 2 * kUnroll;
      reduce_words<T, Op, U, true, 2>(out, in, n, count / E, group * lane * U + threadIdx.x, lane, groups * lane * U);
    } else {
      reduce_words<T, Op, kUnroll, false, kAtOnce>(out, in, n, count / E, group * lane * kUnroll + threadIdx.x, lane,
                                                   groups * lane * kUnroll);
    }
    first = count / E * E;
  }
  reduce_elements<T, Op>(out, in, n, first, count, group * lane + threadIdx.x, groups * lane);
}

// On the host (to pick a kernel): calls f(Type<T>{}, std::integral_constant<RedOp, Op>{}) for a reduction's
// element type and operation, given as DType and RedOp values.
template <typename T>
struct Type {
  using type = T;
};
template <typename T, typename F>
inline void with_red_op(RedOp op, F&& f) {
  switch (op) {
    case RedOp::kSum:
      return f(Type<T>{}, std::integral_constant<RedOp, RedOp::kSum>{});
    case RedOp::kMax:
      return f(Type<T>{}, std::integral_constant<RedOp, RedOp::kMax>{});
    case RedOp::kMin:
      return f(Type<T>{}, std::integral_constant<RedOp, RedOp::kMin>{});
  }
}
template <typename F>
inline void with_reduction(DType dtype, RedOp op, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return with_red_op<float>(op, f);
    case DType::kFloat16:
      return with_red_op<__half>(op, f);
    case DType::kBFloat16:
      return with_red_op<__nv_bfloat16>(op, f);
    case DType::kInt32:
      return with_red_op<int32_t>(op, f);
    case DType::kFloat64:
      return with_red_op<double>(op, f);
    case DType::kInt64:
      return with_red_op<long long>(op, f);
  }
}

}  // namespace ferry
