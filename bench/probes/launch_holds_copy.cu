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
// pinned word. The main thread opens the gate (a host store) at 1 s whatever
// happened, then polls for 2 s more. Both threads exist, and made a CUDA
// call, before the gate holds (a thread's first CUDA call may do more than
// the engine's long-lived threads ever do). No CUDA call on the main thread
// after the setup. Prints one line with the times of each event; exits 0
// when the copy landed before the release, 1 when it landed only after it
// (held), 2 when it never landed or the waiting stream never passed.
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

}  // namespace

int main(int argc, char** argv) {
  std::string kernel = "fresh";
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--kernel")) kernel = argv[i + 1];
  if (kernel != "fresh" && kernel != "local" && kernel != "local-reserved" && kernel != "none") {
    std::fprintf(stderr, "--kernel %s: expected fresh, local, local-reserved or none\n", kernel.c_str());
    return 3;
  }
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
  // [0] the gate, [8] the waiting stream passed, [16] the copy landed, [24] a warm-up write
  uint64_t* words = nullptr;
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
  // Every stream's first work, and the copy and its stream write as the test will make them, before the gate holds.
  for (cudaStream_t s : {waiting, other, copy}) {
    FERRY_CUDA_CHECK(cudaMemsetAsync(counters, 0, 4, s));
    FERRY_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  FERRY_CUDA_CHECK(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyHostToDevice, copy));
  FERRY_CU_CHECK(cu.StreamWriteValue64(reinterpret_cast<CUstream>(copy), reinterpret_cast<CUdeviceptr>(dev_words + 24),
                                       1, CU_STREAM_WRITE_VALUE_DEFAULT));
  FERRY_CUDA_CHECK(cudaStreamSynchronize(copy));
  size_t free_before = 0, total = 0;
  FERRY_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));

  // The two helper threads, each past its first CUDA call, waiting for their turn.
  std::atomic<int> step{0};
  std::atomic<double> launched_ms{-1}, submitted_ms{-1};
  std::atomic<int> launch_err{0}, copy_err{0}, write_err{0};
  std::atomic<long long> free_after{-1};
  std::chrono::steady_clock::time_point t0;
  std::thread launcher([&] {
    cudaSetDevice(0);
    cudaStreamQuery(other);
    while (step.load() < 1) std::this_thread::yield();
    if (kernel == "fresh")
      fresh<<<1, 32, 0, other>>>(counters);
    else if (kernel != "none")
      local_heavy<<<132, 256, 0, other>>>(counters, 7);
    launch_err = static_cast<int>(cudaGetLastError());
    launched_ms = since(t0);
    size_t f = 0, t = 0;
    if (cudaMemGetInfo(&f, &t) == cudaSuccess) free_after = static_cast<long long>(f);
  });
  std::thread submitter([&] {
    cudaSetDevice(0);
    cudaStreamQuery(copy);
    while (step.load() < 2) std::this_thread::yield();
    copy_err = static_cast<int>(cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyHostToDevice, copy));
    write_err = static_cast<int>(cu.StreamWriteValue64(reinterpret_cast<CUstream>(copy),
                                                       reinterpret_cast<CUdeviceptr>(dev_words + 16), 1,
                                                       CU_STREAM_WRITE_VALUE_DEFAULT));
    submitted_ms = since(t0);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // both threads past their first call

  FERRY_CU_CHECK(cu.StreamWaitValue64(reinterpret_cast<CUstream>(waiting), reinterpret_cast<CUdeviceptr>(dev_words), 1,
                                      CU_STREAM_WAIT_VALUE_GEQ));
  FERRY_CU_CHECK(cu.StreamWriteValue64(reinterpret_cast<CUstream>(waiting),
                                       reinterpret_cast<CUdeviceptr>(dev_words + 8), 1, CU_STREAM_WRITE_VALUE_DEFAULT));
  t0 = std::chrono::steady_clock::now();
  step = 1;  // the launch
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  step = 2;  // the copy
  double landed_ms = -1;
  while (since(t0) < 1000) {  // the gate opens at 1 s, whatever happened
    if (landed_ms < 0 && __atomic_load_n(words + 16, __ATOMIC_ACQUIRE)) landed_ms = since(t0);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double released_ms = since(t0);
  __atomic_store_n(words, 1, __ATOMIC_RELEASE);
  double passed_ms = -1;
  while (since(t0) < 3000 && (passed_ms < 0 || landed_ms < 0)) {
    if (landed_ms < 0 && __atomic_load_n(words + 16, __ATOMIC_ACQUIRE)) landed_ms = since(t0);
    if (passed_ms < 0 && __atomic_load_n(words + 8, __ATOMIC_ACQUIRE)) passed_ms = since(t0);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  auto show = [](double ms) { return ms < 0 ? std::string("never") : std::to_string(ms).substr(0, 7) + " ms"; };
  const long long fa = free_after;
  std::printf(
      "kernel %-14s | launch returned %-11s (error %d; %s MiB reserved by it) | copy submitted %-11s (errors %d, %d) | "
      "copy landed %-11s | gate opened %s | waiting stream passed %-11s | %s\n",
      kernel.c_str(), show(launched_ms).c_str(), static_cast<int>(launch_err),
      fa < 0 ? "?" : std::to_string((static_cast<long long>(free_before) - fa) >> 20).c_str(),
      show(submitted_ms).c_str(), static_cast<int>(copy_err), static_cast<int>(write_err), show(landed_ms).c_str(),
      show(released_ms).c_str(), show(passed_ms).c_str(),
      landed_ms >= 0 && landed_ms < released_ms ? "copy not held"
      : landed_ms >= 0                          ? "HELD until the gate opened"
                                                : "copy never landed");
  std::fflush(stdout);
  _exit(landed_ms < 0 || passed_ms < 0 ? 2 : landed_ms < released_ms ? 0 : 1);
}
