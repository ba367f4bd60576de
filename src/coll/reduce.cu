#include "coll/reduce.hpp"
#include "coll/reduce_math.cuh"
#include "core/error.hpp"

namespace ferry {
namespace {

constexpr int kThreads = 512;
// 16-byte words of each source a thread has in flight (reduce_words loads
// two sources at once). One element per load reached about 0.34 TB/s of HBM
// traffic with 32 blocks; the local copy kernel moves 2.9 TB/s with 8 words
// in flight (docs/performance-log.md). 16-bit types
// keep 4: their float accumulators (8 per word) would not fit twice as many.
template <typename T>
constexpr int kUnroll = sizeof(T) >= 4 ? 8 : 4;
// Sources loaded together past two: 16-bit types, with 4 words each, take 4
// (with 32 blocks 1.05-1.33 times faster for 3-8 sources than 2 at a time:
// bench/results/2026-11-24-NVIDIA-H200-reduce-kernel-four-r{1,2}.* against
// -four-base-r{1,2}.*); the others, with 8 words each, 2.
template <typename T>
constexpr int kAtOnce = sizeof(T) == 2 ? 4 : 2;

// Grid-wide over the call's elements (reduce_range: words where aligned).
template <typename T, RedOp Op>
__global__ void __launch_bounds__(kThreads) reduce_kernel(T* __restrict__ out, ReduceSources in, int n, size_t count) {
  reduce_range<T, Op, kUnroll<T>, kAtOnce<T>>(out, in, n, count, blockIdx.x, gridDim.x);
}

template <typename T, RedOp Op>
void launch_typed(const ReduceStep& s, cudaStream_t stream) {
  // Every rank's contribution in rank order, this rank's own in its place.
  ReduceSources in{};
  for (int p = 0; p < s.world; ++p)
    in.src[p] = p == s.rank ? static_cast<const char*>(s.own) : s.scratch + static_cast<size_t>(p) * s.slot_stride;
  // Blocks for the word path's groups; at most max_blocks either way (few,
  // like the local copy: bandwidth-bound, and the SMs belong to the user's compute).
  const size_t per_block = size_t(kThreads) * kUnroll<T> * (16 / sizeof(T));
  const size_t blocks = (s.count + per_block - 1) / per_block;
  const size_t most = static_cast<size_t>(s.max_blocks);
  const int grid = static_cast<int>(blocks < most ? (blocks ? blocks : 1) : most);
  reduce_kernel<T, Op><<<grid, kThreads, 0, stream>>>(static_cast<T*>(s.out), in, s.world, s.count);
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
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kFloat64, DType::kInt64})
    for (RedOp op : {RedOp::kSum, RedOp::kMax, RedOp::kMin})
      with_reduction(t, op, [](auto type, auto red) {
        using T = typename decltype(type)::type;
        cudaFuncAttributes a;
        FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, reduce_kernel<T, decltype(red)::value>));
      });
}

void launch_reduce(const ReduceStep& s, cudaStream_t stream) {
  if (s.count == 0) return;
  FERRY_ARG_CHECK(s.max_blocks >= 1, "max_blocks is " + std::to_string(s.max_blocks) + "; expected at least 1");
  with_reduction(s.dtype, s.op, [&](auto type, auto red) {
    launch_typed<typename decltype(type)::type, decltype(red)::value>(s, stream);
  });
}

}  // namespace ferry
