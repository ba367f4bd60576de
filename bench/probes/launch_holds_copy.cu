// Probe: while a stream of GPU 0 waits on a word (cuStreamWaitValue64, as a
// multipath copy's gate holds the caller's stream), does a kernel's first
// launch on another stream stop a later host-to-GPU copy on a third stream
// from running? The multipath engine submits the target's own-link chunks
// after copy() returns; if a first launch makes later work wait for what is
// already queued, those chunks wait for the gate, which waits for them.
// One case per process (a hang must not spoil the next case):
//
//   ferry_probe_launch_holds --kernel fresh|local|local-reserved|none
//
//   fresh           a kernel never launched before, no local memory
//   local           one never launched before whose threads need 16 KiB of
//                   local memory each (more than the context has reserved)
//   local-reserved  the same after cudaDeviceSetLimit(cudaLimitStackSize)
//                   made room for it during the setup
//
// Order: the gate's wait goes on stream `waiting`; a thread launches the
// kernel on stream `other`; 50 ms later another thread submits an 8 MiB
// pinned host-to-GPU copy on stream `copy` followed by a stream write into a
// pinned word; the main thread polls that word for 1 s, then opens the gate
// (a host store) and polls the waiting stream's own word. No CUDA call on the
// main thread after the setup. Prints one line; exits at once.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "core/driver.hpp"
#include "core/error.hpp"

namespace {

constexpr int kLocalInts = 4096;  // 16 KiB per thread

__global__ void fresh(int* p) {
  if (threadIdx.x == 0) p[0] += 1;
}

// Indexed by a value the compiler cannot know, so the array lives in local memory.
__global__ void local_heavy(int* p, int k) {
  int a[kLocalInts];
  for (int i = 0; i < kLocalInts; ++i) a[(i * k) & (kLocalInts - 1)] = i + threadIdx.x;
  if (a[(k * threadIdx.x) & (kLocalInts - 1)] == -1) p[1] = 1;  // never true; keeps the stores
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

bool poll(const uint64_t* word, double ms) {
  const auto t = std::chrono::steady_clock::now();
  while (since(t) < ms) {
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE)) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  std::string kernel = "fresh";
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--kernel")) kernel = argv[i + 1];
  FERRY_CUDA_CHECK(cudaSetDevice(0));
  const ferry::DriverApi& cu = ferry::driver();
  if (kernel == "local-reserved")
    FERRY_CUDA_CHECK(cudaDeviceSetLimit(cudaLimitStackSize, kLocalInts * sizeof(int) + 4096));
  int* counters = nullptr;
  FERRY_CUDA_CHECK(cudaMalloc(&counters, 64));
  constexpr size_t kBytes = size_t(8) << 20;
  void *src = nullptr, *dst = nullptr;
  FERRY_CUDA_CHECK(cudaHostAlloc(&src, kBytes, cudaHostAllocPortable));
  FERRY_CUDA_CHECK(cudaMalloc(&dst, kBytes));
  uint64_t* words = nullptr;  // [0] the gate, [8] the waiting stream passed, [16] the copy landed
  FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&words), 256, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(words, 0, 256);
  uint64_t* dev_words = nullptr;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_words), words, 0));
  int least = 0, greatest = 0;
  FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t waiting = nullptr, other = nullptr, copy = nullptr;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&copy, cudaStreamNonBlocking, greatest));
  // Every stream's first work before the gate holds anything (a stream's first use may itself wait).
  for (cudaStream_t s : {waiting, other, copy}) {
    FERRY_CUDA_CHECK(cudaMemsetAsync(counters, 0, 4, s));
    FERRY_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src, 4096, cudaMemcpyHostToDevice, copy));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(copy));
  FERRY_CU_CHECK(cu.StreamWaitValue64(reinterpret_cast<CUstream>(waiting), reinterpret_cast<CUdeviceptr>(dev_words), 1,
                                      CU_STREAM_WAIT_VALUE_GEQ));
  FERRY_CU_CHECK(cu.StreamWriteValue64(reinterpret_cast<CUstream>(waiting),
                                       reinterpret_cast<CUdeviceptr>(dev_words + 8), 1, CU_STREAM_WRITE_VALUE_DEFAULT));
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<double> launched_ms{-1}, submitted_ms{-1};
  if (kernel != "none") {
    std::thread([&] {
      if (kernel == "fresh")
        fresh<<<1, 32, 0, other>>>(counters);
      else
        local_heavy<<<132, 256, 0, other>>>(counters, 7);
      launched_ms = since(t0);
    }).detach();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  std::thread([&] {
    cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyHostToDevice, copy);
    cu.StreamWriteValue64(reinterpret_cast<CUstream>(copy), reinterpret_cast<CUdeviceptr>(dev_words + 16), 1,
                          CU_STREAM_WRITE_VALUE_DEFAULT);
    submitted_ms = since(t0);
  }).detach();
  const bool landed_before = poll(words + 16, 1000);
  const double launch_at_release = launched_ms, submit_at_release = submitted_ms;
  __atomic_store_n(words, 1, __ATOMIC_RELEASE);
  const bool passed = poll(words + 8, 2000);
  const bool landed_after = landed_before || poll(words + 16, 1000);
  auto show = [](double ms) { return ms < 0 ? std::string("not yet") : std::to_string(ms).substr(0, 6) + " ms"; };
  std::printf(
      "kernel %-14s | launch returned %-9s copy submitted %-9s (at the gate's release) | copy landed %s | "
      "waiting stream passed %s\n",
      kernel.c_str(), show(launch_at_release).c_str(), show(submit_at_release).c_str(),
      landed_before  ? "before the release"
      : landed_after ? "only after the release (HELD)"
                     : "never",
      passed ? "yes" : "no");
  std::fflush(stdout);
  _exit(landed_before ? 0 : 1);
}
