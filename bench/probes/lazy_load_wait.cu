// Probe: under lazy module loading (CUDA_MODULE_LOADING=LAZY, the default),
// what does a kernel's first launch do while a stream of the device waits on
// a word (cuStreamWaitValue64 >= 1), and which releases still work then?
// One case per process (a hang must not spoil the next case):
//
//   ferry_probe_lazy_wait --release host|write|copy --launch waiting|other|none
//
//   release  host: a store into the pinned word (no CUDA call); write:
//            cuStreamWriteValue64 from another stream; copy: an 8-byte
//            cudaMemcpyAsync from pinned memory on another stream. Issued
//            from a thread of its own 200 ms after the launch.
//   launch   a kernel never launched before, from a thread of its own, on
//            the waiting stream, on another stream, or none.
//
// Nothing on the main thread calls CUDA after the setup: the waiting stream
// reports that it passed by writing a second pinned word, polled from the
// host. Prints one line; exits at once (a blocked CUDA call is left blocked).
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

__global__ void fresh(int* p) {
  if (threadIdx.x == 0) p[0] += 1;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string release = "host", launch = "waiting";
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--release")) release = argv[i + 1];
    if (!std::strcmp(argv[i], "--launch")) launch = argv[i + 1];
  }
  FERRY_CUDA_CHECK(cudaSetDevice(0));
  const ferry::DriverApi& cu = ferry::driver();
  int* counters = nullptr;
  FERRY_CUDA_CHECK(cudaMalloc(&counters, 64));
  uint64_t *words = nullptr, *one = nullptr;  // words[0]: the gate; words[8]: "the stream passed"
  FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&words), 128, cudaHostAllocMapped | cudaHostAllocPortable));
  FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&one), 8, cudaHostAllocPortable));
  std::memset(words, 0, 128);
  *one = 1;
  uint64_t* dev_words = nullptr;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dev_words), words, 0));
  cudaStream_t waiting = nullptr, other = nullptr, rescue = nullptr;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&rescue, cudaStreamNonBlocking));
  FERRY_CU_CHECK(cu.StreamWaitValue64(reinterpret_cast<CUstream>(waiting), reinterpret_cast<CUdeviceptr>(dev_words), 1,
                                      CU_STREAM_WAIT_VALUE_GEQ));
  FERRY_CU_CHECK(cu.StreamWriteValue64(reinterpret_cast<CUstream>(waiting),
                                       reinterpret_cast<CUdeviceptr>(dev_words + 8), 1, CU_STREAM_WRITE_VALUE_DEFAULT));
  const auto t0 = std::chrono::steady_clock::now();
  std::atomic<double> launched_ms{-1}, released_ms{-1};
  if (launch != "none") {
    cudaStream_t on = launch == "waiting" ? waiting : other;
    std::thread([&, on] {
      fresh<<<1, 32, 0, on>>>(counters);
      launched_ms = since(t0);
    }).detach();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double launch_before = launched_ms;
  const auto t_release = std::chrono::steady_clock::now();
  std::thread([&] {
    if (release == "host")
      __atomic_store_n(words, 1, __ATOMIC_RELEASE);
    else if (release == "write")
      cu.StreamWriteValue64(reinterpret_cast<CUstream>(rescue), reinterpret_cast<CUdeviceptr>(dev_words), 1,
                            CU_STREAM_WRITE_VALUE_DEFAULT);
    else
      cudaMemcpyAsync(dev_words, one, 8, cudaMemcpyHostToDevice, rescue);
    released_ms = since(t0);
  }).detach();
  double passed_ms = -1;
  while (since(t_release) < 3000) {
    if (__atomic_load_n(words + 8, __ATOMIC_ACQUIRE)) {
      passed_ms = since(t0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto show = [](double ms) { return ms < 0 ? std::string("never") : std::to_string(ms).substr(0, 7) + " ms"; };
  std::printf(
      "release %-5s launch %-7s | launch returned %-10s (%s the release) | release call returned %-10s | "
      "stream passed %s\n",
      release.c_str(), launch.c_str(), show(static_cast<double>(launched_ms)).c_str(),
      launch == "none"     ? "-"
      : launch_before >= 0 ? "before"
                           : "not before",
      show(released_ms).c_str(), show(passed_ms).c_str());
  std::fflush(stdout);
  _exit(passed_ms >= 0 ? 0 : 1);
}
