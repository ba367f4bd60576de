#include <chrono>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "sm_holder.hpp"

namespace ferry {
namespace {

// 512 threads and at most 32 registers each: an SM's whole register file and
// thread slots go to maxThreadsPerMultiProcessor / 512 such blocks.
constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads, 4) hold_sm(volatile int* words, long long max_ns) {
  if (threadIdx.x == 0) {
    words[1 + blockIdx.x] = 1;
    __threadfence_system();
    unsigned long long start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      __nanosleep(2000);
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (words[0] == 0 && static_cast<long long>(now - start) < max_ns);
  }
  __syncthreads();  // the other threads stay resident, waiting here
}

}  // namespace

SmHolder::SmHolder() {
  FERRY_CUDA_CHECK(cudaGetDevice(&device_));
  int sms = 0, threads = 0;
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_));
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device_));
  blocks_ = sms * (threads / kThreads);
  // Loads the kernel now: with lazy loading, a first launch may wait for the
  // device to go idle.
  cudaFuncAttributes attr{};
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&attr, hold_sm));
  void* p = nullptr;
  FERRY_CUDA_CHECK(cudaHostAlloc(&p, sizeof(int) * (1 + blocks_), cudaHostAllocMapped | cudaHostAllocPortable));
  words_ = static_cast<volatile int*>(p);
}

SmHolder::~SmHolder() {
  release();
  if (stream_) cudaStreamSynchronize(stream_);  // bounded by hold()'s max_s
  cudaFreeHost(const_cast<int*>(words_));
}

void SmHolder::hold(cudaStream_t stream, double max_s) {
  for (int i = 0; i <= blocks_; ++i) words_[i] = 0;
  FERRY_CUDA_CHECK(cudaSetDevice(device_));
  void* dev = nullptr;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(&dev, const_cast<int*>(words_), 0));
  stream_ = stream;
  hold_sm<<<blocks_, kThreads, 0, stream>>>(static_cast<volatile int*>(dev), static_cast<long long>(max_s * 1e9));
  FERRY_CUDA_CHECK(cudaGetLastError());
  const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    int running = 0;
    for (int b = 0; b < blocks_; ++b) running += words_[1 + b];
    if (running == blocks_) return;
    if (std::chrono::steady_clock::now() > limit) {
      release();
      throw_error(FERRY_ERROR_CUDA, "SmHolder: only " + std::to_string(running) + " of " + std::to_string(blocks_) +
                                        " blocks became resident within 5 s; something else holds SMs");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void SmHolder::release() { words_[0] = 1; }

}  // namespace ferry
