// Probe: does an operation need an SM? ferry claims that its collectives'
// data movement and signalling run without SMs (copy engines and the stream
// front end); this checks each submission path it uses, on the GPU.
//
// Method: every SM of every GPU used (0, and 1 when there is a second) is
// filled with ferry's SmHolder (spinning blocks that take every SM's thread
// slots and registers; the GPU tests use it too), then the operation is
// enqueued on another stream. If the operation completes while the spinners still hold every SM,
// it ran without one; if it completes only after they are released, it
// needed one. A tiny kernel is the control (it must be reported as needing an
// SM, or the method is void).
//
//   ferry_probe_sm_free [--bytes B]      (a second GPU adds the peer cases)
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "dma/engine.hpp"
#include "sm_holder.hpp"

using ferry::Copy;
using ferry::MemOp;

namespace {

__global__ void tiny(char* p) {
  if (threadIdx.x == 0) p[0] = 1;
}

struct Case {
  std::string name;
  std::function<void(cudaStream_t)> enqueue;
  bool capturable = true;  // the batched call cannot be captured into a graph
};

// A graph holding what `enqueue` puts on a stream, instantiated once.
cudaGraphExec_t captured(const std::function<void(cudaStream_t)>& enqueue) {
  cudaStream_t s = nullptr;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  enqueue(s);
  cudaGraph_t g = nullptr;
  FERRY_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec = nullptr;
  FERRY_CUDA_CHECK(cudaGraphInstantiateWithFlags(&exec, g, 0));
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  return exec;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 1 << 20;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::strcmp(argv[i], "--bytes") == 0) bytes = std::strtoull(argv[i + 1], nullptr, 10);
  try {
    int gpus = 0;
    FERRY_CUDA_CHECK(cudaGetDeviceCount(&gpus));
    FERRY_CUDA_CHECK(cudaSetDevice(0));
    const bool peer = gpus > 1;
    if (peer) {
      cudaError_t err = cudaDeviceEnablePeerAccess(1, 0);
      if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled) FERRY_CUDA_CHECK(err);
      cudaGetLastError();
    }
    cudaDeviceProp prop{};
    FERRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

    char *a = nullptr, *b = nullptr, *remote = nullptr, *host = nullptr;
    uint64_t* word = nullptr;
    FERRY_CUDA_CHECK(cudaMalloc(&a, bytes));
    FERRY_CUDA_CHECK(cudaMalloc(&b, bytes));
    FERRY_CUDA_CHECK(cudaMalloc(&word, 64));
    FERRY_CUDA_CHECK(cudaHostAlloc(&host, 64, cudaHostAllocMapped | cudaHostAllocPortable));
    if (peer) {
      FERRY_CUDA_CHECK(cudaSetDevice(1));
      FERRY_CUDA_CHECK(cudaMalloc(&remote, bytes));
      FERRY_CUDA_CHECK(cudaSetDevice(0));
    }
    const int spinning_gpus = peer ? 2 : 1;
    std::vector<std::unique_ptr<ferry::SmHolder>> holders;
    for (int g = 0; g < spinning_gpus; ++g) {
      FERRY_CUDA_CHECK(cudaSetDevice(g));
      holders.push_back(std::make_unique<ferry::SmHolder>());
    }
    FERRY_CUDA_CHECK(cudaSetDevice(0));
    std::printf("GPU 0: %s, %d SMs, held by %d spinning blocks\n", prop.name, prop.multiProcessorCount,
                holders[0]->blocks());
    // GPU 1's stream for copies that GPU 1 issues; GPU 0's test stream waits on them.
    cudaStream_t on_peer = nullptr;
    cudaEvent_t peer_done = nullptr;
    if (peer) {
      FERRY_CUDA_CHECK(cudaSetDevice(1));
      cudaError_t err = cudaDeviceEnablePeerAccess(0, 0);
      if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled) FERRY_CUDA_CHECK(err);
      cudaGetLastError();
      FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&on_peer, cudaStreamNonBlocking));
      FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&peer_done, cudaEventDisableTiming));
      FERRY_CUDA_CHECK(cudaSetDevice(0));
    }

    std::vector<Case> cases = {
        {"control: a 1-block kernel", [&](cudaStream_t s) { tiny<<<1, 32, 0, s>>>(a); }},
        {"stream memory operations (write + wait, as ferry's flag batches)",
         [&](cudaStream_t s) {
           ferry::dma::mem_ops(s, {MemOp{MemOp::Kind::kWrite, word, 7}, MemOp{MemOp::Kind::kWait, word, 7}});
         }},
        {"copy within the GPU, cudaMemcpyAsync",
         [&](cudaStream_t s) {
           ferry::dma::copy_one(s, {b, a, bytes});
         }},
        {"copy within the GPU, cudaMemcpy2DAsync (64 rows)",
         [&](cudaStream_t s) {
           FERRY_CUDA_CHECK(cudaMemcpy2DAsync(b, bytes / 64, a, bytes / 64, bytes / 64, 64, cudaMemcpyDefault, s));
         }},
        {"copy within the GPU, cudaMemcpyBatchAsync with the copy-engine hint",
         [&](cudaStream_t s) {
           ferry::dma::copy_batch(s, {{b, a, bytes}});
         },
         false},
        {"32 B pinned host -> GPU, cudaMemcpyAsync (a ready record)",
         [&](cudaStream_t s) {
           ferry::dma::copy_one(s, {word, host, 32});
         }},
    };
    if (peer) {
      cases.push_back({"copy to the peer GPU, cudaMemcpyAsync (a push)", [&](cudaStream_t s) {
                         ferry::dma::copy_one(s, {remote, a, bytes});
                       }});
      cases.push_back({"copy to the peer GPU, cudaMemcpyBatchAsync",
                       [&](cudaStream_t s) {
                         ferry::dma::copy_batch(s, {{remote, a, bytes}});
                       },
                       false});
      cases.push_back({"copy from the peer GPU, cudaMemcpyAsync (a pull)", [&](cudaStream_t s) {
                         ferry::dma::copy_one(s, {b, remote, bytes});
                       }});
      // A copy within GPU 0 that GPU 1's copy engine makes over NVLink (out and
      // back): a local block moved without GPU 0's SMs, if the driver agrees.
      cases.push_back({"copy within GPU 0 issued on GPU 1's stream",
                       [&](cudaStream_t s) {
                         FERRY_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDefault, on_peer));
                         FERRY_CUDA_CHECK(cudaEventRecord(peer_done, on_peer));
                         FERRY_CUDA_CHECK(cudaStreamWaitEvent(s, peer_done, 0));
                       },
                       false});
      cases.push_back({"8 B to the peer GPU, cudaMemcpyAsync (a done message)", [&](cudaStream_t s) {
                         ferry::dma::copy_one(s, {remote, word, 8});
                       }});
    }
    // The same submissions captured into graphs (what replayed eager calls and
    // users' graphs run): the batched call is not captured, so only plain copies.
    std::vector<Case> graph_cases;
    for (const auto& c : cases) {
      if (!c.capturable) continue;
      cudaGraphExec_t exec = captured(c.enqueue);
      graph_cases.push_back(
          {"in a CUDA graph: " + c.name, [exec](cudaStream_t s) { FERRY_CUDA_CHECK(cudaGraphLaunch(exec, s)); }});
    }
    cases.insert(cases.end(), graph_cases.begin(), graph_cases.end());

    cudaStream_t spin_stream[2] = {}, test = nullptr;
    for (int g = 0; g < spinning_gpus; ++g) {
      FERRY_CUDA_CHECK(cudaSetDevice(g));
      FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&spin_stream[g], cudaStreamNonBlocking));
    }
    FERRY_CUDA_CHECK(cudaSetDevice(0));
    FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&test, cudaStreamNonBlocking));
    cudaEvent_t done = nullptr;
    FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));

    bool control_ok = true;
    for (size_t i = 0; i < cases.size(); ++i) {
      // Warm: the first use of a path may load code or set up state.
      cases[i].enqueue(test);
      FERRY_CUDA_CHECK(cudaStreamSynchronize(test));
      bool held = true;  // every SM of every GPU taken (SmHolder throws after 5 s otherwise)
      for (int g = 0; g < spinning_gpus && held; ++g) {
        try {
          holders[g]->hold(spin_stream[g], 2.0);
        } catch (const ferry::Error& e) {
          std::fprintf(stderr, "GPU %d: %s\n", g, e.what());
          held = false;
        }
      }
      FERRY_CUDA_CHECK(cudaSetDevice(0));
      cases[i].enqueue(test);
      FERRY_CUDA_CHECK(cudaEventRecord(done, test));
      auto t1 = std::chrono::steady_clock::now();
      bool finished = false;
      while (std::chrono::steady_clock::now() - t1 < std::chrono::milliseconds(300))
        if ((finished = cudaEventQuery(done) == cudaSuccess)) break;
      for (auto& h : holders) h->release();
      for (int g = 0; g < spinning_gpus; ++g) FERRY_CUDA_CHECK(cudaStreamSynchronize(spin_stream[g]));
      FERRY_CUDA_CHECK(cudaStreamSynchronize(test));
      const char* verdict = !held      ? "VOID (the spinner did not fill every SM)"
                            : finished ? "no SM (finished while every SM was busy)"
                                       : "NEEDS AN SM (finished only after the SMs were released)";
      if (i == 0 && (!held || finished)) control_ok = false;
      std::printf("%-90s %s\n", cases[i].name.c_str(), verdict);
    }
    if (!control_ok) std::printf("the control kernel was not held back: this method does not work here\n");
    return control_ok ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "probe failed: %s\n", e.what());
    return 1;
  }
}
