// Probe: does the stream shape of a multipath copy with a head hang while
// another thread feeds host-to-GPU copies of its own into the same GPU? No
// ferry code: the engine is a host thread that opens the gate once the
// stream says the head landed. One case per process:
//
//   ferry_probe_head_wait --shape head|side|none|plain --foreign events|query|none [--head-events]
//                         [--foreign-mib N] [--patience S]
//
// shapes, on the caller's stream s (all words pinned, device-mapped host memory):
//   head  s: write reached=i; copy 16 MiB H2D; {write head_done=i; wait gate>=i}
//         (a multipath copy whose own share rides on the caller's stream)
//   side  s: {write reached=i; wait gate>=i};
//         a stream of its own: wait reached>=i; copy 16 MiB H2D; write head_done=i
//   none  s: {write reached=i; wait gate>=i}; the host opens on reached
//   plain s: copy 16 MiB H2D (no words: what any program's copy meets)
// foreign: a thread keeps three or four 64 MiB H2D copies queued on stream f, each
//   followed by an event record, and waits for the oldest (events); or polls
//   f with cudaStreamQuery (query); or does nothing (none).
// --head-events: timing events recorded on s around the head (head shape).
// --foreign-mib N: the foreign copies' size (default 64); --patience S: how
// long a copy is polled (default 5 s).
// Every copy on s is bracketed by timing events, as a benchmark's are.
// Three copies before the foreign thread starts, eight after; each copy is
// polled for --patience seconds at most. Exit 0 when all landed, 2 on a hang (the words
// and which streams are done are printed); a failed CUDA call throws, naming it.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <thread>

#include "core/driver.hpp"
#include "core/error.hpp"

namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

CUstreamBatchMemOpParams write_op(uint64_t* addr, uint64_t v) {
  CUstreamBatchMemOpParams p{};
  p.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
  p.writeValue.address = reinterpret_cast<CUdeviceptr>(addr);
  p.writeValue.value64 = v;
  return p;
}

CUstreamBatchMemOpParams wait_op(uint64_t* addr, uint64_t v) {
  CUstreamBatchMemOpParams p{};
  p.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_64;
  p.waitValue.address = reinterpret_cast<CUdeviceptr>(addr);
  p.waitValue.value64 = v;
  p.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  std::string shape = "head", foreign = "events";
  bool head_events = false;
  double patience_ms = 5000;
  size_t foreign_mib = 64;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--shape") && i + 1 < argc)
      shape = argv[++i];
    else if (!std::strcmp(argv[i], "--foreign") && i + 1 < argc)
      foreign = argv[++i];
    else if (!std::strcmp(argv[i], "--head-events"))
      head_events = true;
    else if (!std::strcmp(argv[i], "--foreign-mib") && i + 1 < argc)
      foreign_mib = std::stoul(argv[++i]);
    else if (!std::strcmp(argv[i], "--patience") && i + 1 < argc)
      patience_ms = 1000 * std::stod(argv[++i]);
  }
  if ((shape != "head" && shape != "side" && shape != "none" && shape != "plain") ||
      (foreign != "events" && foreign != "query" && foreign != "none")) {
    std::fprintf(stderr,
                 "--shape head|side|none|plain --foreign events|query|none [--head-events] [--foreign-mib N] "
                 "[--patience S]\n");
    return 3;
  }
  FERRY_CUDA_CHECK(cudaSetDevice(0));
  const ferry::DriverApi& cu = ferry::driver();
  const size_t kHead = size_t(16) << 20, kForeign = foreign_mib << 20;
  void *hsrc, *hdst, *fsrc, *fdst;
  FERRY_CUDA_CHECK(cudaHostAlloc(&hsrc, kHead, cudaHostAllocPortable));
  FERRY_CUDA_CHECK(cudaMalloc(&hdst, kHead));
  FERRY_CUDA_CHECK(cudaHostAlloc(&fsrc, kForeign, cudaHostAllocPortable));
  FERRY_CUDA_CHECK(cudaMalloc(&fdst, kForeign));
  // [0] reached, [8] head_done, [16] gate (64-bit words, 64 bytes apart)
  uint64_t* words;
  FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&words), 256, cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(words, 0, 256);
  uint64_t* dw;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&dw), words, 0));
  uint64_t *reached = dw, *head_done = dw + 8, *gate = dw + 16;
  volatile uint64_t* h = words;
  cudaStream_t s, side, f;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&f, cudaStreamNonBlocking));
  cudaEvent_t a, b, he[2];
  FERRY_CUDA_CHECK(cudaEventCreate(&a));
  FERRY_CUDA_CHECK(cudaEventCreate(&b));
  FERRY_CUDA_CHECK(cudaEventCreate(&he[0]));
  FERRY_CUDA_CHECK(cudaEventCreate(&he[1]));

  // The engine: opens the gate for generation i once the head landed (or, without a head, once reached).
  std::atomic<bool> quit{false};
  std::thread engine([&] {
    uint64_t opened = 0;
    while (!quit.load()) {
      const uint64_t seen = shape == "plain"  ? 0
                            : shape == "none" ? __atomic_load_n(&h[0], __ATOMIC_ACQUIRE)
                                              : __atomic_load_n(&h[8], __ATOMIC_ACQUIRE);
      if (seen > opened) {
        opened = seen;
        __atomic_store_n(&h[16], opened, __ATOMIC_RELEASE);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });

  auto copy = [&](uint64_t i) {
    FERRY_CUDA_CHECK(cudaEventRecord(a, s));
    if (shape == "plain") {
      FERRY_CUDA_CHECK(cudaMemcpyAsync(hdst, hsrc, kHead, cudaMemcpyHostToDevice, s));
    } else if (shape == "head") {
      CUstreamBatchMemOpParams w = write_op(reached, i);
      FERRY_CU_CHECK(cu.StreamBatchMemOp(reinterpret_cast<CUstream>(s), 1, &w, 0));
      if (head_events) FERRY_CUDA_CHECK(cudaEventRecord(he[0], s));
      FERRY_CUDA_CHECK(cudaMemcpyAsync(hdst, hsrc, kHead, cudaMemcpyHostToDevice, s));
      if (head_events) FERRY_CUDA_CHECK(cudaEventRecord(he[1], s));
      CUstreamBatchMemOpParams ops[2] = {write_op(head_done, i), wait_op(gate, i)};
      FERRY_CU_CHECK(cu.StreamBatchMemOp(reinterpret_cast<CUstream>(s), 2, ops, 0));
    } else {
      CUstreamBatchMemOpParams ops[2] = {write_op(reached, i), wait_op(gate, i)};
      FERRY_CU_CHECK(cu.StreamBatchMemOp(reinterpret_cast<CUstream>(s), 2, ops, 0));
      if (shape == "side") {
        CUstreamBatchMemOpParams w = wait_op(reached, i);
        FERRY_CU_CHECK(cu.StreamBatchMemOp(reinterpret_cast<CUstream>(side), 1, &w, 0));
        FERRY_CUDA_CHECK(cudaMemcpyAsync(hdst, hsrc, kHead, cudaMemcpyHostToDevice, side));
        CUstreamBatchMemOpParams d = write_op(head_done, i);
        FERRY_CU_CHECK(cu.StreamBatchMemOp(reinterpret_cast<CUstream>(side), 1, &d, 0));
      }
    }
    FERRY_CUDA_CHECK(cudaEventRecord(b, s));
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      cudaError_t q = cudaStreamQuery(s);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) FERRY_CUDA_CHECK(q);
      if (since(t0) > patience_ms) return -1.0;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    float ms = 0;
    FERRY_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return double(ms);
  };

  for (uint64_t i = 1; i <= 3; ++i)
    if (copy(i) < 0) {
      std::printf("shape %s foreign %s: HUNG in a warm-up\n", shape.c_str(), foreign.c_str());
      _exit(2);
    }
  std::atomic<bool> stop{false};
  std::atomic<long> foreign_done{0};
  std::thread feeder([&] {
    cudaSetDevice(0);
    if (foreign == "none") return;
    std::deque<cudaEvent_t> marks;
    while (!stop.load()) {
      FERRY_CUDA_CHECK(cudaMemcpyAsync(fdst, fsrc, kForeign, cudaMemcpyHostToDevice, f));
      if (foreign == "events") {
        cudaEvent_t e;
        FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        FERRY_CUDA_CHECK(cudaEventRecord(e, f));
        marks.push_back(e);
        if (marks.size() >= 4) {
          FERRY_CUDA_CHECK(cudaEventSynchronize(marks.front()));
          FERRY_CUDA_CHECK(cudaEventDestroy(marks.front()));
          marks.pop_front();
          ++foreign_done;
        }
      } else {
        while (cudaStreamQuery(f) == cudaErrorNotReady && !stop.load())
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        ++foreign_done;
      }
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (uint64_t i = 4; i <= 11; ++i) {
    const double ms = copy(i);
    if (ms < 0) {
      std::printf(
          "shape %s foreign %s%s: HUNG at copy %llu: reached %llu, head_done %llu, gate %llu; s %s, side %s, f %s; "
          "foreign copies done %ld\n",
          shape.c_str(), foreign.c_str(), head_events ? " head-events" : "", (unsigned long long)i,
          (unsigned long long)h[0], (unsigned long long)h[8], (unsigned long long)h[16],
          cudaStreamQuery(s) == cudaSuccess ? "idle" : "busy", cudaStreamQuery(side) == cudaSuccess ? "idle" : "busy",
          cudaStreamQuery(f) == cudaSuccess ? "idle" : "busy", foreign_done.load());
      std::fflush(stdout);
      _exit(2);
    }
    std::printf("shape %s foreign %s%s: copy %llu %.3f ms\n", shape.c_str(), foreign.c_str(),
                head_events ? " head-events" : "", (unsigned long long)i, ms);
  }
  stop = true;
  feeder.join();
  quit = true;
  engine.join();
  FERRY_CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("shape %s foreign %s%s: ok, foreign copies done %ld\n", shape.c_str(), foreign.c_str(),
              head_events ? " head-events" : "", foreign_done.load());
  return 0;
}
