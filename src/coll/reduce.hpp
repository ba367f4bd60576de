// The reduction of reduce-scatter and all-reduce: a small SM kernel. Copy
// engines move the data (each rank's blocks into its peers' scratch slots);
// adding them up needs arithmetic, which copy engines do not have. The kernel
// reads the rank's own block and every peer's slot once and writes the result.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry {

enum class DType : uint32_t { kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3, kInt32 = 4, kFloat64 = 5, kInt64 = 6 };
enum class RedOp : uint32_t { kSum = 1, kMax = 2, kMin = 3 };

size_t dtype_bytes(DType t);
// "float32", "float16", "bfloat16", "int32", "float64", "int64"; otherwise an error naming `what`.
DType parse_dtype(const std::string& name, const char* what);
// "sum", "max", "min"; otherwise an error naming `what`.
RedOp parse_red_op(const std::string& name, const char* what);
const char* dtype_name(DType t);
const char* red_op_name(RedOp op);

struct ReduceStep {
  void* out;            // count elements
  const void* own;      // this rank's contribution (count elements); may equal out
  const char* scratch;  // world slots of slot_stride bytes; slot p holds rank p's contribution
  size_t slot_stride;
  int rank;
  int world;
  size_t count;
  DType dtype;
  RedOp op;
  int max_blocks;  // grid bound (FERRY_REDUCE_BLOCKS: few, the SMs belong to the user's compute)
};

void launch_reduce(const ReduceStep& s, cudaStream_t stream);
// Loads the reduction kernels now (see load_local_copy_kernels for why).
void load_reduce_kernels();

}  // namespace ferry
