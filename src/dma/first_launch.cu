#include <cuda_runtime_api.h>

#include <mutex>
#include <set>

#include "core/error.hpp"
#include "dma/first_launch.hpp"

namespace ferry {
namespace dma {
namespace {

__global__ void empty_kernel() {}

}  // namespace

void complete_first_launch(int device) {
  static std::mutex mu;
  static std::set<int> done;
  std::lock_guard<std::mutex> lock(mu);
  if (done.count(device)) return;
  int previous = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&previous));
  FERRY_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    empty_kernel<<<1, 1, 0, s>>>();
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  cudaSetDevice(previous);
  FERRY_CUDA_CHECK(e);
  done.insert(device);
}

}  // namespace dma
}  // namespace ferry
