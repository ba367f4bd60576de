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

template <typename A>
__device__ A combine(A a, A b, RedOp op) {
  switch (op) {
    case RedOp::kMax:
      return a > b ? a : b;
    case RedOp::kMin:
      return a < b ? a : b;
    default:
      return a + b;
  }
}

struct SlotTable {
  const char* slot[kMaxWorld];
};

template <typename T>
__global__ void reduce_kernel(T* __restrict__ out, const T* own, SlotTable slots, int n_slots, size_t count, RedOp op) {
  using A = typename Acc<T>::type;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    A acc = static_cast<A>(own[i]);
    for (int s = 0; s < n_slots; ++s)
      acc = combine(acc, static_cast<A>(reinterpret_cast<const T*>(slots.slot[s])[i]), op);
    out[i] = static_cast<T>(acc);
  }
}

template <typename T>
void launch_typed(const ReduceStep& s, cudaStream_t stream) {
  SlotTable t{};
  int n = 0;
  // Peers in rank order, so every rank adds the same numbers in the same order
  // (all-reduce results are then identical on every rank).
  for (int p = 0; p < s.world; ++p)
    if (p != s.rank) t.slot[n++] = s.scratch + static_cast<size_t>(p) * s.slot_stride;
  size_t blocks = (s.count + kThreads - 1) / kThreads;
  int grid = static_cast<int>(blocks < kMaxBlocks ? (blocks ? blocks : 1) : kMaxBlocks);
  reduce_kernel<T>
      <<<grid, kThreads, 0, stream>>>(static_cast<T*>(s.out), static_cast<const T*>(s.own), t, n, s.count, s.op);
  FERRY_CUDA_CHECK(cudaGetLastError());
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
  cudaFuncAttributes a;
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_kernel<float>));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_kernel<__half>));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_kernel<__nv_bfloat16>));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_kernel<int32_t>));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_kernel<double>));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_kernel<long long>));
}

void launch_reduce(const ReduceStep& s, cudaStream_t stream) {
  if (s.count == 0) return;
  switch (s.dtype) {
    case DType::kFloat32:
      return launch_typed<float>(s, stream);
    case DType::kFloat16:
      return launch_typed<__half>(s, stream);
    case DType::kBFloat16:
      return launch_typed<__nv_bfloat16>(s, stream);
    case DType::kInt32:
      return launch_typed<int32_t>(s, stream);
    case DType::kFloat64:
      return launch_typed<double>(s, stream);
    case DType::kInt64:
      return launch_typed<long long>(s, stream);
  }
}

}  // namespace ferry
