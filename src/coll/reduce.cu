#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "coll/reduce.hpp"
#include "core/error.hpp"

namespace ferry {
namespace {

constexpr int kThreads = 512;
// Few blocks, like the local copy: bandwidth-bound, and the SMs belong to the user's compute.
constexpr int kMaxBlocks = 32;
constexpr int kMaxWorld = 64;
// 16-byte words of each input a thread has in flight: the own block's and the
// first slot's are loaded together, 2 x kUnroll loads before the first use.
// One load at a time per thread (the first version, one element per load)
// reached about 0.34 TB/s of HBM traffic with 32 blocks; the local copy kernel
// moves 2.9 TB/s with 8 words in flight (docs/performance-log.md).
constexpr int kUnroll = 4;

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
__device__ A combine(A a, A b) {
  if constexpr (Op == RedOp::kMax)
    return a > b ? a : b;
  else if constexpr (Op == RedOp::kMin)
    return a < b ? a : b;
  else
    return a + b;
}

struct SlotTable {
  const char* slot[kMaxWorld];
};

// out[i] = own[i] op slot_0[i] op slot_1[i] ..., in the accumulator type
// (float for 16-bit floats) and rounded once. Element by element from `first`;
// the vector kernel below leaves it the elements after its last whole word.
template <typename T, RedOp Op>
__device__ void reduce_elements(T* __restrict__ out, const T* own, const SlotTable& slots, int n_slots, size_t first,
                                size_t count, size_t thread, size_t threads) {
  using A = typename Acc<T>::type;
  for (size_t i = first + thread; i < count; i += threads) {
    A acc = static_cast<A>(own[i]);
    for (int s = 0; s < n_slots; ++s)
      acc = combine<Op>(acc, static_cast<A>(reinterpret_cast<const T*>(slots.slot[s])[i]));
    out[i] = static_cast<T>(acc);
  }
}

template <typename T, RedOp Op>
__global__ void reduce_scalar(T* __restrict__ out, const T* own, SlotTable slots, int n_slots, size_t count) {
  reduce_elements<T, Op>(out, own, slots, n_slots, 0, count, blockIdx.x * size_t(blockDim.x) + threadIdx.x,
                         size_t(gridDim.x) * blockDim.x);
}

// The same on 16-byte words (out, own and every slot 16-byte aligned):
// groups of kUnroll words blockDim apart per thread, as in copy_words, and
// block 0 takes the elements after the last whole word. Streaming loads and
// stores: every byte is read or written once.
template <typename T, RedOp Op>
__global__ void __launch_bounds__(kThreads)
    reduce_vec16(T* __restrict__ out, const T* own, SlotTable slots, int n_slots, size_t count) {
  using A = typename Acc<T>::type;
  constexpr int E = 16 / sizeof(T);
  const size_t n16 = count / E, step = blockDim.x, group = size_t(gridDim.x) * step * kUnroll;
  auto* out16 = reinterpret_cast<uint4*>(out);
  auto* own16 = reinterpret_cast<const uint4*>(own);
  for (size_t i = size_t(blockIdx.x) * step * kUnroll + threadIdx.x; i < n16; i += group) {
    uint4 a[kUnroll], b[kUnroll];
    auto load = [&](uint4* v, const uint4* src) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (i + u * step < n16) v[u] = __ldcs(src + i + u * step);
    };
    auto slot16 = [&](int k) { return reinterpret_cast<const uint4*>(slots.slot[k]); };
    load(a, own16);
    if (n_slots > 0) load(b, slot16(0));
    // In A, rounded to T once at the end, as reduce_elements does.
    A acc[kUnroll][E];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[u][e] = static_cast<A>(reinterpret_cast<const T*>(&a[u])[e]);
    for (int k = 0; k < n_slots; ++k) {
      if (k > 0) load(b, slot16(k));
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int e = 0; e < E; ++e)
          acc[u][e] = combine<Op>(acc[u][e], static_cast<A>(reinterpret_cast<const T*>(&b[u])[e]));
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + u * step >= n16) continue;
      uint4 w;
#pragma unroll
      for (int e = 0; e < E; ++e) reinterpret_cast<T*>(&w)[e] = static_cast<T>(acc[u][e]);
      __stcs(out16 + i + u * step, w);
    }
  }
  if (blockIdx.x == 0) reduce_elements<T, Op>(out, own, slots, n_slots, n16 * E, count, threadIdx.x, blockDim.x);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T, RedOp Op>
void launch_typed(const ReduceStep& s, cudaStream_t stream) {
  SlotTable t{};
  int n = 0;
  bool vec = aligned16(s.out) && aligned16(s.own);
  // Peers in rank order, so every rank adds the same numbers in the same order
  // (all-reduce results are then identical on every rank).
  for (int p = 0; p < s.world; ++p)
    if (p != s.rank) t.slot[n++] = s.scratch + static_cast<size_t>(p) * s.slot_stride;
  for (int k = 0; k < n; ++k) vec = vec && aligned16(t.slot[k]);
  auto* out = static_cast<T*>(s.out);
  auto* own = static_cast<const T*>(s.own);
  const size_t per_block = vec ? size_t(kThreads) * kUnroll * (16 / sizeof(T)) : kThreads;
  const size_t blocks = (s.count + per_block - 1) / per_block;
  const int grid = static_cast<int>(blocks < kMaxBlocks ? (blocks ? blocks : 1) : kMaxBlocks);
  if (vec)
    reduce_vec16<T, Op><<<grid, kThreads, 0, stream>>>(out, own, t, n, s.count);
  else
    reduce_scalar<T, Op><<<grid, kThreads, 0, stream>>>(out, own, t, n, s.count);
  FERRY_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void launch_for_op(const ReduceStep& s, cudaStream_t stream) {
  switch (s.op) {
    case RedOp::kSum:
      return launch_typed<T, RedOp::kSum>(s, stream);
    case RedOp::kMax:
      return launch_typed<T, RedOp::kMax>(s, stream);
    case RedOp::kMin:
      return launch_typed<T, RedOp::kMin>(s, stream);
  }
}

template <typename T>
void load_typed() {
  cudaFuncAttributes a;
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_vec16<T, RedOp::kSum>));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_vec16<T, RedOp::kMax>));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_vec16<T, RedOp::kMin>));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_scalar<T, RedOp::kSum>));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_scalar<T, RedOp::kMax>));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_scalar<T, RedOp::kMin>));
}

}  // namespace

size_t dtype_bytes(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt64:
      return "int64";
  }
  return "unknown";
}

const char* red_op_name(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return "sum";
    case RedOp::kMax:
      return "max";
    case RedOp::kMin:
      return "min";
  }
  return "unknown";
}

DType parse_dtype(const std::string& name, const char* what) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kFloat64, DType::kInt64})
    if (name == dtype_name(t)) return t;
  throw_error(FERRY_ERROR_INVALID_ARGUMENT,
              std::string(what) + " is '" + name +
                  "'; reductions support float32, float16, bfloat16, int32, float64 and int64");
}

RedOp parse_red_op(const std::string& name, const char* what) {
  for (RedOp op : {RedOp::kSum, RedOp::kMax, RedOp::kMin})
    if (name == red_op_name(op)) return op;
  throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(what) + " is '" + name + "'; expected 'sum', 'max' or 'min'");
}

void load_reduce_kernels() {
  load_typed<float>();
  load_typed<__half>();
  load_typed<__nv_bfloat16>();
  load_typed<int32_t>();
  load_typed<double>();
  load_typed<long long>();
}

void launch_reduce(const ReduceStep& s, cudaStream_t stream) {
  if (s.count == 0) return;
  switch (s.dtype) {
    case DType::kFloat32:
      return launch_for_op<float>(s, stream);
    case DType::kFloat16:
      return launch_for_op<__half>(s, stream);
    case DType::kBFloat16:
      return launch_for_op<__nv_bfloat16>(s, stream);
    case DType::kInt32:
      return launch_for_op<int32_t>(s, stream);
    case DType::kFloat64:
      return launch_for_op<double>(s, stream);
    case DType::kInt64:
      return launch_for_op<long long>(s, stream);
  }
}

}  // namespace ferry
