// Probe: does submitting scattered page copies from several host threads at
// once cut the host time of a paged KV fetch? The copy engines are fast once
// the copies are queued (docs/kv.md); inline, the driver's time per copy in
// cudaMemcpyBatchAsync (about 0.8 us on an H200) is the limit. This splits
// one request of `pages` scattered pinned-host-to-GPU page copies into
// `threads` batches on `threads` streams, each submitted by a thread of its
// own (all released at once), and reports the host time until the last
// thread's call returned, and the time until the copies landed; threads = 1
// is today's submission (calls of at most 128 copies, ferry's FERRY_BATCH_MAX,
// with its flags) on one stream, and "1 thread, N streams" today's 'streams'
// strategy. Every byte is checked; exit 1 if any is wrong.
//
//   ferry_probe_batch_threads [--pages 1024] [--page-bytes 16384] [--reps 20]
//
// One line per case: median host us and total us over reps after a warm-up.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
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
#include "probe_timing.hpp"

namespace {

using ferry::probe::median;
using ferry::probe::now_us;

constexpr size_t kBatchMax = 128;  // ferry's FERRY_BATCH_MAX default

// Copies [b, e) as ferry's dma::copy_batch submits them: calls of at most kBatchMax copies.
void batch(cudaStream_t s, std::vector<void*>& dsts, std::vector<const void*>& srcs, std::vector<size_t>& sizes,
           size_t b, size_t e) {
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  for (size_t at = b; at < e; at += kBatchMax) {
    const size_t n = std::min(kBatchMax, e - at);
    size_t idx = 0;
    FERRY_CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data() + at, const_cast<void**>(srcs.data() + at), sizes.data() + at, n,
                                          &attr, &idx, 1, s));
  }
}

}  // namespace

int main(int argc, char** argv) {
  size_t pages = 1024, page_bytes = 16384;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--pages")) pages = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--page-bytes")) page_bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  if (reps < 1 || pages < 1 || page_bytes < 1) {
    std::fprintf(stderr, "--reps, --pages and --page-bytes must be at least 1\n");
    return 2;
  }
  FERRY_CUDA_CHECK(cudaSetDevice(0));
  const size_t pool = 2 * pages;  // twice as many pages each side: no two picked pages adjacent by chance often
  char* host = nullptr;
  char* dev = nullptr;
  FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), pool * page_bytes, cudaHostAllocPortable));
  FERRY_CUDA_CHECK(cudaMalloc(&dev, pool * page_bytes));
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < pool * page_bytes; ++i) host[i] = static_cast<char>(rng());
  std::vector<size_t> src_ids(pool), dst_ids(pool);
  std::iota(src_ids.begin(), src_ids.end(), 0);
  std::iota(dst_ids.begin(), dst_ids.end(), 0);
  std::shuffle(src_ids.begin(), src_ids.end(), rng);
  std::shuffle(dst_ids.begin(), dst_ids.end(), rng);
  std::vector<void*> dsts(pages);
  std::vector<const void*> srcs(pages);
  std::vector<size_t> sizes(pages, page_bytes);
  for (size_t i = 0; i < pages; ++i) {
    dsts[i] = dev + dst_ids[i] * page_bytes;
    srcs[i] = host + src_ids[i] * page_bytes;
  }
  constexpr int kMaxThreads = 8;
  std::vector<cudaStream_t> streams(kMaxThreads);
  for (auto& s : streams) FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::printf("pages %zu x %zu bytes, %d reps (median)\n", pages, page_bytes, reps);
  size_t wrong_total = 0;
  // (threads, streams): one thread per stream, and today's 'streams' strategy (one thread, 4 streams).
  const std::pair<int, int> cases[] = {{1, 1}, {1, 4}, {2, 2}, {4, 4}, {8, 8}};
  for (auto [threads, nstreams] : cases) {
    std::vector<double> host_us, total_us;
    for (int rep = -1; rep < reps; ++rep) {
      FERRY_CUDA_CHECK(cudaMemset(dev, 0, pool * page_bytes));
      FERRY_CUDA_CHECK(cudaDeviceSynchronize());
      std::atomic<int> ready{0};
      std::atomic<bool> go{false};
      std::vector<double> ended(threads, 0);
      std::vector<std::thread> workers;
      const size_t per = (pages + nstreams - 1) / nstreams;
      const int streams_per_thread = nstreams / threads;
      for (int t = 0; t < threads; ++t)
        workers.emplace_back([&, t] {
          FERRY_CUDA_CHECK(cudaSetDevice(0));
          FERRY_CUDA_CHECK(cudaStreamQuery(streams[t]));  // the thread's first CUDA call before the timing
          ready.fetch_add(1);
          while (!go.load(std::memory_order_acquire)) {
          }
          for (int k = 0; k < streams_per_thread; ++k) {
            const int j = t * streams_per_thread + k;
            batch(streams[j], dsts, srcs, sizes, std::min(pages, j * per), std::min(pages, (j + 1) * per));
          }
          ended[t] = now_us();
        });
      while (ready.load() < threads) {
      }
      const double t0 = now_us();
      go.store(true, std::memory_order_release);
      for (auto& w : workers) w.join();
      const double t1 = *std::max_element(ended.begin(), ended.end());
      for (int j = 0; j < nstreams; ++j) FERRY_CUDA_CHECK(cudaStreamSynchronize(streams[j]));
      const double t2 = now_us();
      if (rep >= 0) {
        host_us.push_back(t1 - t0);
        total_us.push_back(t2 - t0);
      }
    }
    // Every byte of the last rep.
    std::vector<char> back(pool * page_bytes);
    FERRY_CUDA_CHECK(cudaMemcpy(back.data(), dev, pool * page_bytes, cudaMemcpyDeviceToHost));
    size_t wrong = 0;
    for (size_t i = 0; i < pages; ++i)
      if (std::memcmp(back.data() + dst_ids[i] * page_bytes, host + src_ids[i] * page_bytes, page_bytes)) ++wrong;
    wrong_total += wrong;
    std::printf("%d thread(s), %d stream(s): host %.1f us, until landed %.1f us (%.1f GB/s), %zu pages wrong\n",
                threads, nstreams, median(host_us), median(total_us), pages * page_bytes / median(total_us) / 1e3,
                wrong);
  }
  return wrong_total ? 1 : 0;
}
