// Probe: which ways of writing a word release a stream that waits on it
// (cuStreamWaitValue64 >= 1), from the thread that waits or another one, and
// with or without a kernel's first launch between (lazy module loading)?
// This tries every combination of:
//   memory   the word in cudaMalloc memory, in VMM memory (cuMemCreate +
//            cuMemMap, as the heap maps it), or in pinned device-mapped host memory;
//   release  a stream write (cuStreamWriteValue64) or an 8-byte copy from pinned
//            memory, on a stream of default or greatest priority made up
//            front; or a host store (pinned word only);
//   thread   issued from the waiting thread or from another thread;
//   kernel   whether a kernel never launched before is launched, from a
//            thread of its own, on the waiting stream or on another one,
//            after the wait and before the release (lazy loading): does the
//            launch block, and does the release still work while it does?
// Each case waits 0.2 s, releases, and reports whether the stream passed
// within 3 s. A case that hangs is abandoned (its stream stays blocked, so
// each case uses its own stream and word).
//
//   ferry_probe_stream_wait [--device D]
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/driver.hpp"
#include "core/error.hpp"
#include "symm/peer_buffer.hpp"

namespace {

// One kernel per case, so that "first launch" is true for each case that asks for it.
template <int N>
__global__ void fresh(int* p) {
  if (threadIdx.x == 0) p[N] += 1;
}
using KernelFn = void (*)(int*);
KernelFn kernels[] = {fresh<0>,  fresh<1>,  fresh<2>,  fresh<3>,  fresh<4>,  fresh<5>,  fresh<6>,  fresh<7>,
                      fresh<8>,  fresh<9>,  fresh<10>, fresh<11>, fresh<12>, fresh<13>, fresh<14>, fresh<15>,
                      fresh<16>, fresh<17>, fresh<18>, fresh<19>, fresh<20>, fresh<21>, fresh<22>, fresh<23>,
                      fresh<24>, fresh<25>, fresh<26>, fresh<27>, fresh<28>, fresh<29>, fresh<30>, fresh<31>,
                      fresh<32>, fresh<33>, fresh<34>, fresh<35>, fresh<36>, fresh<37>, fresh<38>, fresh<39>,
                      fresh<40>, fresh<41>, fresh<42>, fresh<43>, fresh<44>, fresh<45>, fresh<46>, fresh<47>,
                      fresh<48>, fresh<49>, fresh<50>, fresh<51>, fresh<52>, fresh<53>, fresh<54>, fresh<55>,
                      fresh<56>, fresh<57>, fresh<58>, fresh<59>, fresh<60>, fresh<61>, fresh<62>, fresh<63>};
constexpr int kKernels = sizeof(kernels) / sizeof(kernels[0]);

enum class Memory { kMalloc, kVmm, kPinned };
enum class Release { kStreamWrite, kCopy, kHostStore };

const char* name(Memory m) { return m == Memory::kMalloc ? "cudaMalloc" : m == Memory::kVmm ? "VMM" : "pinned"; }
const char* name(Release r) {
  return r == Release::kStreamWrite ? "stream write" : r == Release::kCopy ? "8-byte copy" : "host store";
}

uint64_t* word_in(Memory m, int device, uint64_t** host_view) {
  *host_view = nullptr;
  if (m == Memory::kMalloc) {
    void* p = nullptr;
    FERRY_CUDA_CHECK(cudaMalloc(&p, 64));
    FERRY_CUDA_CHECK(cudaMemset(p, 0, 64));
    return static_cast<uint64_t*>(p);
  }
  if (m == Memory::kVmm) {
    ferry::VmmMapping v = ferry::vmm_allocate(device, 2 << 20, false, {device});
    FERRY_CUDA_CHECK(cudaMemset(reinterpret_cast<void*>(v.ptr), 0, 64));
    return reinterpret_cast<uint64_t*>(v.ptr);  // kept mapped for the probe's life
  }
  void* h = nullptr;
  FERRY_CUDA_CHECK(cudaHostAlloc(&h, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(h, 0, 64);
  void* d = nullptr;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(&d, h, 0));
  *host_view = static_cast<uint64_t*>(h);
  return static_cast<uint64_t*>(d);
}

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--device")) device = std::atoi(argv[i + 1]);
  FERRY_CUDA_CHECK(cudaSetDevice(device));
  const ferry::DriverApi& cu = ferry::driver();
  int least = 0, greatest = 0;
  FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  int* counters = nullptr;
  FERRY_CUDA_CHECK(cudaMalloc(&counters, 64 * sizeof(int)));
  uint64_t* one = nullptr;  // the value a copy writes
  FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&one), 8, cudaHostAllocPortable));
  *one = 1;
  int next_kernel = 0, hung = 0, cases = 0;
  std::printf("device %d; a case passes when the waiting stream goes on within 3 s of the release\n", device);
  for (Memory m : {Memory::kMalloc, Memory::kVmm, Memory::kPinned})
    for (Release r : {Release::kStreamWrite, Release::kCopy, Release::kHostStore})
      for (int prio : {least, greatest})
        for (bool other_thread : {false, true})
          for (int launch : {0, 1, 2}) {  // none, on the waiting stream, on another stream
            const bool first_launch = launch > 0;
            const int kernel_stream = launch - 1;
            if (r == Release::kHostStore && (m != Memory::kPinned || prio != least)) continue;
            if (first_launch && next_kernel >= kKernels) continue;
            ++cases;
            uint64_t* host = nullptr;
            uint64_t* w = word_in(m, device, &host);
            cudaStream_t waiting = nullptr, rescue = nullptr, other = nullptr;
            FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&waiting, cudaStreamNonBlocking));
            FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
            FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&rescue, cudaStreamNonBlocking, prio));
            cudaEvent_t passed = nullptr;
            FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&passed, cudaEventDisableTiming));
            FERRY_CU_CHECK(cu.StreamWaitValue64(reinterpret_cast<CUstream>(waiting), reinterpret_cast<CUdeviceptr>(w),
                                                1, CU_STREAM_WAIT_VALUE_GEQ));
            // The first launch from a thread of its own: under lazy loading
            // it may block until the wait passes, and the release must not
            // need it. Its event is recorded once it returns.
            auto launched = std::make_shared<std::atomic<bool>>(!first_launch);
            if (first_launch) {
              KernelFn k = kernels[next_kernel++];
              cudaStream_t on = kernel_stream == 0 ? waiting : other;
              std::thread([k, on, counters, launched] {
                k<<<1, 32, 0, on>>>(counters);
                *launched = true;
              }).detach();
              std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
            FERRY_CUDA_CHECK(cudaEventRecord(passed, waiting));
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            const bool launch_returned_before_release = *launched;
            auto release = [&] {
              if (r == Release::kStreamWrite)
                cu.StreamWriteValue64(reinterpret_cast<CUstream>(rescue), reinterpret_cast<CUdeviceptr>(w), 1,
                                      CU_STREAM_WRITE_VALUE_DEFAULT);
              else if (r == Release::kCopy)
                cudaMemcpyAsync(w, one, 8, cudaMemcpyHostToDevice, rescue);
              else
                __atomic_store_n(host, 1, __ATOMIC_RELEASE);
            };
            if (other_thread)
              std::thread(release).join();
            else
              release();
            const auto t0 = std::chrono::steady_clock::now();
            bool ok = false;
            while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
              if (cudaEventQuery(passed) == cudaSuccess) {
                ok = true;
                break;
              }
              cudaGetLastError();
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            hung += !ok;
            while (!*launched && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3))
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
            std::printf("%-11s %-12s %-8s %-13s %-24s %-34s %s\n", name(m), name(r),
                        prio == greatest ? "greatest" : "default", other_thread ? "other thread" : "same thread",
                        !first_launch        ? "no kernel"
                        : kernel_stream == 0 ? "new kernel, waiting strm"
                                             : "new kernel, other stream",
                        !first_launch ? ""
                        : *launched   ? (launch_returned_before_release ? "launch returned at once"
                                                                        : "launch returned after release")
                                      : "LAUNCH STILL BLOCKED",
                        ok ? ("passed " + std::to_string(ms) + " ms").c_str() : "STILL BLOCKED");
            std::fflush(stdout);
            if (!ok) {
              // Later cases' first launches would wait for this stream: try
              // once more from a fresh greatest-priority stream, else stop.
              cudaStream_t again = nullptr;
              FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&again, cudaStreamNonBlocking, greatest));
              cu.StreamWriteValue64(reinterpret_cast<CUstream>(again), reinterpret_cast<CUdeviceptr>(w), 1,
                                    CU_STREAM_WRITE_VALUE_DEFAULT);
              if (host) __atomic_store_n(host, 1, __ATOMIC_RELEASE);
              std::this_thread::sleep_for(std::chrono::seconds(2));
              if (cudaEventQuery(passed) != cudaSuccess) {
                std::printf("the blocked stream stays blocked after a second release; stopping (%d cases run)\n",
                            cases);
                return 1;
              }
              std::printf("  (a second release, a stream write from a fresh greatest-priority stream, let it go)\n");
            }
          }
  std::printf("%d cases, %d still blocked\n", cases, hung);
  return hung ? 1 : 0;
}
