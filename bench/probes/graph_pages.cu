// Probe: can a CUDA graph of memcpy nodes, instantiated once and given new
// addresses per call, submit scattered page copies for less host time than
// the driver's batched call? Inline, a small paged KV transfer on copy engines
// is bound by the host: cudaMemcpyBatchAsync costs about 0.8-1.3 us a copy
// and one cudaMemcpyAsync per page 1.6-2.9 us, while a kernel launch costs a
// few. A graph's copies are built when it is instantiated; the question is
// what updating each node (cudaGraphExecMemcpyNodeSetParams1D) and one launch
// cost. This times, for `pages` scattered pages, both directions:
//   per-page:     one cudaMemcpyAsync per page;
//   batched:      cudaMemcpyBatchAsync, calls of at most 32 copies (ferry's default);
//   graph-build:  a graph built, instantiated, launched and destroyed per call;
//   graph-update: one instantiated graph of `pages` independent memcpy nodes,
//                 each node given its page's addresses per call, then one launch;
//   chain-update: the same with the nodes in one chain;
//   graph-replay: the instantiated graph launched as it is (the same pages
//                 every call: the floor of a cached transfer);
//   kernel:       a gather kernel on 16 blocks of 512 threads (uses SMs), for scale;
// host time of the submission and time until the copies landed (median of
// --reps after a warm-up), and every copied byte of the last rep against a
// poisoned destination (exit 1 if any is wrong). Then graph-update once more
// with every SM held by spinning blocks: it must land while they spin, or it
// is not SM-free (the tiny kernel after it is the control: it must not).
//
//   ferry_probe_graph_pages [--pages 64,256,1024] [--page-bytes 4096,16384,65536] [--reps 50]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.hpp"
#include "probe_data.hpp"
#include "probe_timing.hpp"
#include "sm_holder.hpp"

namespace {

using ferry::probe::fill;
using ferry::probe::median;
using ferry::probe::now_us;
using ferry::probe::pages_wrong;
using ferry::probe::parse_list;

constexpr size_t kBatchMax = 32;

struct Pages {
  std::vector<void*> dst, src;
  size_t bytes = 0;
};

__global__ void gather(void* const* dst, void* const* src, size_t n, size_t bytes) {
  const size_t lane = threadIdx.x % 32, warps = size_t(gridDim.x) * blockDim.x / 32;
  for (size_t t = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; t < n; t += warps) {
    uint4* d = static_cast<uint4*>(dst[t]);
    const uint4* s = static_cast<const uint4*>(src[t]);
    for (size_t k = lane; k < bytes / 16; k += 32) d[k] = s[k];
  }
}

__global__ void tiny(int* p) { *p = 1; }

void run_per_page(const Pages& p, cudaStream_t s) {
  for (size_t i = 0; i < p.dst.size(); ++i)
    FERRY_CUDA_CHECK(cudaMemcpyAsync(p.dst[i], p.src[i], p.bytes, cudaMemcpyDefault, s));
}

void run_batched(Pages& p, std::vector<size_t>& sizes, cudaStream_t s) {
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  const size_t n = p.dst.size();
  for (size_t at = 0; at < n; at += kBatchMax) {
    size_t idx = 0;
    FERRY_CUDA_CHECK(cudaMemcpyBatchAsync(p.dst.data() + at, p.src.data() + at, sizes.data() + at,
                                          std::min(kBatchMax, n - at), &attr, &idx, 1, s));
  }
}

struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  std::vector<cudaGraphNode_t> nodes;
  void destroy() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    exec = nullptr;
    graph = nullptr;
    nodes.clear();
  }
};

Graph build(const Pages& p, bool chain) {
  Graph g;
  FERRY_CUDA_CHECK(cudaGraphCreate(&g.graph, 0));
  g.nodes.resize(p.dst.size());
  for (size_t i = 0; i < p.dst.size(); ++i) {
    const cudaGraphNode_t* dep = chain && i > 0 ? &g.nodes[i - 1] : nullptr;
    FERRY_CUDA_CHECK(cudaGraphAddMemcpyNode1D(&g.nodes[i], g.graph, dep, dep ? 1 : 0, p.dst[i], p.src[i], p.bytes,
                                              cudaMemcpyDefault));
  }
  FERRY_CUDA_CHECK(cudaGraphInstantiateWithFlags(&g.exec, g.graph, 0));
  return g;
}

void update(Graph& g, const Pages& p) {
  for (size_t i = 0; i < p.dst.size(); ++i)
    FERRY_CUDA_CHECK(
        cudaGraphExecMemcpyNodeSetParams1D(g.exec, g.nodes[i], p.dst[i], p.src[i], p.bytes, cudaMemcpyDefault));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> counts = {64, 256, 1024}, page_sizes = {4096, 16384, 65536};
  int reps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--pages")) counts = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--page-bytes")) page_sizes = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  if (reps < 1 || counts.empty() || page_sizes.empty()) {
    std::fprintf(stderr, "--reps, --pages and --page-bytes must be at least 1\n");
    return 2;
  }
  FERRY_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t s;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937_64 rng(7);
  size_t wrong_total = 0;
  for (size_t page_bytes : page_sizes)
    for (size_t pages : counts) {
      const size_t pool = 2 * pages, total = pool * page_bytes;  // picked pages rarely adjacent
      char *host = nullptr, *dev = nullptr;
      FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), total, cudaHostAllocPortable));
      FERRY_CUDA_CHECK(cudaMalloc(&dev, total));
      std::vector<char> expect(total), back(total);
      fill(expect.data(), total, 11 + page_bytes + pages);
      void** ids = nullptr;  // the kernel's pointer lists: [0, pages) destinations, [pages, 2 pages) sources
      FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ids), 2 * pages * sizeof(void*)));
      std::vector<size_t> sizes(pages, page_bytes);
      for (int dir = 0; dir < 2; ++dir) {  // 0: host to GPU (fetch), 1: GPU to host (save)
        std::vector<size_t> a(pool), b(pool);
        std::iota(a.begin(), a.end(), 0);
        std::iota(b.begin(), b.end(), 0);
        std::shuffle(a.begin(), a.end(), rng);
        std::shuffle(b.begin(), b.end(), rng);
        char* to = dir == 0 ? dev : host;
        char* from = dir == 0 ? host : dev;
        Pages p{{}, {}, page_bytes};
        Pages other{{}, {}, page_bytes};  // the pages an updated graph was built with
        for (size_t i = 0; i < pages; ++i) {
          p.dst.push_back(to + a[i] * page_bytes);
          p.src.push_back(from + b[i] * page_bytes);
          other.dst.push_back(to + a[pages + i] * page_bytes);
          other.src.push_back(from + b[pages + i] * page_bytes);
        }
        std::vector<void*> table(p.dst);
        table.insert(table.end(), p.src.begin(), p.src.end());
        FERRY_CUDA_CHECK(cudaMemcpy(ids, table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice));
        Graph upd = build(other, false), chained = build(other, true), same = build(p, false);
        const char* names[] = {"per-page",     "batched",      "graph-build", "graph-update",
                               "chain-update", "graph-replay", "kernel"};
        for (int m = 0; m < 7; ++m) {
          std::vector<double> host_us, total_us;
          for (int rep = -3; rep < reps; ++rep) {
            if (rep == -3 || rep == reps - 1) {  // the source's data, and a poisoned destination before the checked rep
              if (dir == 0) {
                std::memcpy(host, expect.data(), total);
                FERRY_CUDA_CHECK(cudaMemset(dev, 0xff, total));
              } else {
                FERRY_CUDA_CHECK(cudaMemcpy(dev, expect.data(), total, cudaMemcpyHostToDevice));
                std::memset(host, 0xff, total);
              }
              FERRY_CUDA_CHECK(cudaDeviceSynchronize());
            }
            if (m == 3) update(upd, other);  // away from this rep's pages, so that every rep updates every node
            if (m == 4) update(chained, other);
            const double t0 = now_us();
            if (m == 0) run_per_page(p, s);
            if (m == 1) run_batched(p, sizes, s);
            if (m == 2) {
              Graph g = build(p, false);
              FERRY_CUDA_CHECK(cudaGraphLaunch(g.exec, s));
              g.destroy();
            }
            if (m == 3) {
              update(upd, p);
              FERRY_CUDA_CHECK(cudaGraphLaunch(upd.exec, s));
            }
            if (m == 4) {
              update(chained, p);
              FERRY_CUDA_CHECK(cudaGraphLaunch(chained.exec, s));
            }
            if (m == 5) FERRY_CUDA_CHECK(cudaGraphLaunch(same.exec, s));
            if (m == 6) {
              gather<<<16, 512, 0, s>>>(ids, ids + pages, pages, page_bytes);
              FERRY_CUDA_CHECK(cudaGetLastError());
            }
            const double t1 = now_us();
            FERRY_CUDA_CHECK(cudaStreamSynchronize(s));
            const double t2 = now_us();
            if (rep >= 0) {
              host_us.push_back(t1 - t0);
              total_us.push_back(t2 - t0);
            }
          }
          const char* got = host;
          if (dir == 0) {
            FERRY_CUDA_CHECK(cudaMemcpy(back.data(), dev, total, cudaMemcpyDeviceToHost));
            got = back.data();
          }
          const size_t wrong = pages_wrong(got, expect.data(), a, b, pages, page_bytes);
          wrong_total += wrong;
          std::printf("%s %5zu x %6zu B %-12s host %8.1f us, until landed %8.1f us (%5.1f GB/s), %zu pages wrong\n",
                      dir == 0 ? "fetch" : "save ", pages, page_bytes, names[m], median(host_us), median(total_us),
                      double(pages) * page_bytes / median(total_us) / 1e3, wrong);
          std::fflush(stdout);
        }
        upd.destroy();
        chained.destroy();
        same.destroy();
      }
      FERRY_CUDA_CHECK(cudaFreeHost(host));
      FERRY_CUDA_CHECK(cudaFree(dev));
      FERRY_CUDA_CHECK(cudaFree(ids));
    }

  // SM-free: an updated graph's copies must land while every SM is held; a tiny kernel must not.
  {
    const size_t pages = 64, page_bytes = 16384, total = 2 * pages * page_bytes;
    char *host = nullptr, *dev = nullptr;
    int* word = nullptr;
    FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), total, cudaHostAllocPortable));
    FERRY_CUDA_CHECK(cudaMalloc(&dev, total));
    FERRY_CUDA_CHECK(cudaMalloc(&word, sizeof(int)));
    Pages p{{}, {}, page_bytes}, other{{}, {}, page_bytes};
    for (size_t i = 0; i < pages; ++i) {
      p.dst.push_back(dev + (2 * i) * page_bytes);
      p.src.push_back(host + (2 * i + 1) * page_bytes);
      other.dst.push_back(dev + (2 * i + 1) * page_bytes);
      other.src.push_back(host + (2 * i) * page_bytes);
    }
    Graph g = build(other, false);
    update(g, p);
    cudaStream_t spin, test;
    FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&spin, cudaStreamNonBlocking));
    FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&test, cudaStreamNonBlocking));
    cudaEvent_t copied, ran;
    FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
    FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&ran, cudaEventDisableTiming));
    ferry::SmHolder holder;
    holder.hold(spin, 3.0);
    FERRY_CUDA_CHECK(cudaGraphLaunch(g.exec, test));
    FERRY_CUDA_CHECK(cudaEventRecord(copied, test));
    tiny<<<1, 1, 0, test>>>(word);
    FERRY_CUDA_CHECK(cudaEventRecord(ran, test));
    auto landed_while_held = [](cudaEvent_t e) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
      while (std::chrono::steady_clock::now() < until) {
        if (cudaEventQuery(e) == cudaSuccess) return true;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      return false;
    };
    const bool copies_free = landed_while_held(copied);
    const bool kernel_free = landed_while_held(ran);
    holder.release();
    FERRY_CUDA_CHECK(cudaDeviceSynchronize());
    std::printf("SM-held: graph-update copies %s; control kernel %s (%d spinning blocks)\n",
                copies_free ? "landed (no SM)" : "waited (needs an SM)",
                kernel_free ? "ran: the method is void" : "waited, as it must", holder.blocks());
    if (!copies_free || kernel_free) wrong_total += 1;
    g.destroy();
    FERRY_CUDA_CHECK(cudaFreeHost(host));
    FERRY_CUDA_CHECK(cudaFree(dev));
    FERRY_CUDA_CHECK(cudaFree(word));
  }
  return wrong_total ? 1 : 0;
}
