// Probe: can one pitched copy per page replace one copy per page and layer?
// A paged KV fetch of a model with L layers copies 2L regions per page (K and
// V of every layer); inline, the driver's host time per copy in
// cudaMemcpyBatchAsync (about 0.8 us on an H200) decides how fast it goes.
// When both sides keep the regions at one stride in one allocation
// ([regions, pages, page bytes]), a page's regions are the rows of one 2D
// copy: width the page, height the regions, each side's pitch its region
// stride. This times, for `pages` scattered pages of `regions` regions:
//   batched: one copy per page and region, cudaMemcpyBatchAsync calls of at
//            most 128 copies (ferry's FERRY_BATCH_MAX default);
//   2d:      one cudaMemcpy2DAsync per page;
//   3d-batch: cudaMemcpy3DBatchAsync, one op per page, calls of at most
//            `--ops-per-call` ops (0: all in one call);
// host time of the submission and time until the copies landed (median of
// --reps after a warm-up, no graphs), both directions. Every byte of the last
// rep is checked against a poisoned destination; exit 1 if any is wrong.
//
// --sequential-dst puts the pages at destination pages 0..pages-1 in order
// (a fetched prefix lands so); --rows N cuts each pitched copy into copies of
// at most N rows, submitted group by group (2d only; 0: all the regions in
// one). Batched copies go region by region, as ferry plans them.
//
//   ferry_probe_pitched_pages [--pages 1024] [--regions 64] [--page-bytes 4096,16384,32768]
//                             [--reps 10] [--ops-per-call 0] [--sequential-dst] [--rows 0]
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
#include <vector>

#include "core/error.hpp"
#include "probe_timing.hpp"

namespace {

using ferry::probe::median;
using ferry::probe::now_us;

constexpr size_t kBatchMax = 128;

struct Case {
  char* dst;
  const char* src;
  size_t dst_pitch, src_pitch;  // bytes from one region to the next
  size_t page_bytes, regions;
  std::vector<size_t> dst_ids, src_ids;
};

void run_batched(const Case& c, cudaStream_t s) {
  std::vector<void*> dsts;
  std::vector<void*> srcs;
  std::vector<size_t> sizes;
  const size_t n = c.dst_ids.size() * c.regions;
  dsts.reserve(n);
  srcs.reserve(n);
  sizes.assign(n, c.page_bytes);
  for (size_t r = 0; r < c.regions; ++r)  // region by region, as ferry plans them
    for (size_t i = 0; i < c.dst_ids.size(); ++i) {
      dsts.push_back(c.dst + r * c.dst_pitch + c.dst_ids[i] * c.page_bytes);
      srcs.push_back(const_cast<char*>(c.src + r * c.src_pitch + c.src_ids[i] * c.page_bytes));
    }
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  for (size_t at = 0; at < n; at += kBatchMax) {
    const size_t k = std::min(kBatchMax, n - at);
    size_t idx = 0;
    FERRY_CUDA_CHECK(cudaMemcpyBatchAsync(dsts.data() + at, srcs.data() + at, sizes.data() + at, k, &attr, &idx, 1, s));
  }
}

void run_2d(const Case& c, cudaStream_t s, size_t rows) {
  if (rows == 0) rows = c.regions;
  for (size_t r = 0; r < c.regions; r += rows)  // group by group, each group's pages in order
    for (size_t i = 0; i < c.dst_ids.size(); ++i)
      FERRY_CUDA_CHECK(cudaMemcpy2DAsync(c.dst + r * c.dst_pitch + c.dst_ids[i] * c.page_bytes, c.dst_pitch,
                                         c.src + r * c.src_pitch + c.src_ids[i] * c.page_bytes, c.src_pitch,
                                         c.page_bytes, std::min(rows, c.regions - r), cudaMemcpyDefault, s));
}

void run_3d_batch(const Case& c, cudaStream_t s, size_t per_call) {
  std::vector<cudaMemcpy3DBatchOp> ops(c.dst_ids.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    cudaMemcpy3DBatchOp& op = ops[i];
    op = {};
    op.src.type = cudaMemcpyOperandTypePointer;
    op.src.op.ptr.ptr = const_cast<char*>(c.src + c.src_ids[i] * c.page_bytes);
    op.src.op.ptr.rowLength = c.src_pitch;
    op.dst.type = cudaMemcpyOperandTypePointer;
    op.dst.op.ptr.ptr = c.dst + c.dst_ids[i] * c.page_bytes;
    op.dst.op.ptr.rowLength = c.dst_pitch;
    op.extent = make_cudaExtent(c.page_bytes, c.regions, 1);
    op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    op.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  }
  if (per_call == 0) per_call = ops.size();
  for (size_t at = 0; at < ops.size(); at += per_call)
    FERRY_CUDA_CHECK(cudaMemcpy3DBatchAsync(std::min(per_call, ops.size() - at), ops.data() + at, 0, s));
}

void fill(char* p, size_t bytes, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, 8);
  }
}

std::vector<size_t> parse_list(const char* s) {
  std::vector<size_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoull(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  size_t pages = 1024, regions = 64, per_call = 0, rows = 0;
  bool sequential_dst = false;
  std::vector<size_t> page_sizes = {4096, 16384, 32768};
  int reps = 10;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--sequential-dst")) sequential_dst = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--sequential-dst")) {
      --i;
      continue;
    }
    if (!std::strcmp(argv[i], "--rows")) rows = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--pages")) pages = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--regions")) regions = std::strtoull(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--page-bytes")) page_sizes = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--ops-per-call")) per_call = std::strtoull(argv[i + 1], nullptr, 10);
  }
  if (reps < 1 || pages < 1 || regions < 1 || page_sizes.empty()) {
    std::fprintf(stderr, "--reps, --pages, --regions and --page-bytes must be at least 1\n");
    return 2;
  }
  FERRY_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t s;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  size_t wrong_total = 0;
  std::mt19937_64 rng(7);
  for (size_t page_bytes : page_sizes) {
    const size_t pool = 2 * pages;  // page slots per region on each side: picked pages rarely adjacent
    const size_t region_bytes = pool * page_bytes, total = regions * region_bytes;
    char *host = nullptr, *dev = nullptr;
    FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), total, cudaHostAllocPortable));
    FERRY_CUDA_CHECK(cudaMalloc(&dev, total));
    std::vector<size_t> a(pool), b(pool);
    std::iota(a.begin(), a.end(), 0);
    std::iota(b.begin(), b.end(), 0);
    std::shuffle(a.begin(), a.end(), rng);
    std::shuffle(b.begin(), b.end(), rng);
    a.resize(pages);
    b.resize(pages);
    if (sequential_dst) std::iota(a.begin(), a.end(), 0);
    std::vector<char> back(total), expect(total);
    fill(expect.data(), total, 11 + page_bytes);
    for (int dir = 0; dir < 2; ++dir) {  // 0: host to GPU (fetch), 1: GPU to host (save)
      Case c{dir == 0 ? dev : host, dir == 0 ? host : dev, region_bytes, region_bytes, page_bytes, regions, a, b};
      const char* name[] = {"batched", "2d", "3d-batch"};
      for (int m = 0; m < 3; ++m) {
        std::vector<double> host_us, total_us;
        for (int rep = -1; rep < reps; ++rep) {
          // The source holds the data, the destination is poisoned before every rep.
          if (dir == 0) {
            if (rep == -1) std::memcpy(host, expect.data(), total);
            FERRY_CUDA_CHECK(cudaMemset(dev, 0xff, total));
          } else {
            if (rep == -1) FERRY_CUDA_CHECK(cudaMemcpy(dev, expect.data(), total, cudaMemcpyHostToDevice));
            std::memset(host, 0xff, total);
          }
          FERRY_CUDA_CHECK(cudaDeviceSynchronize());
          const double t0 = now_us();
          if (m == 0) run_batched(c, s);
          if (m == 1) run_2d(c, s, rows);
          if (m == 2) run_3d_batch(c, s, per_call);
          const double t1 = now_us();
          FERRY_CUDA_CHECK(cudaStreamSynchronize(s));
          const double t2 = now_us();
          if (rep >= 0) {
            host_us.push_back(t1 - t0);
            total_us.push_back(t2 - t0);
          }
        }
        // Every copied byte of the last rep.
        const char* got = host;
        if (dir == 0) {
          FERRY_CUDA_CHECK(cudaMemcpy(back.data(), dev, total, cudaMemcpyDeviceToHost));
          got = back.data();
        }
        size_t wrong = 0;
        for (size_t i = 0; i < pages; ++i)
          for (size_t r = 0; r < regions; ++r)
            if (std::memcmp(got + r * region_bytes + c.dst_ids[i] * page_bytes,
                            expect.data() + r * region_bytes + c.src_ids[i] * page_bytes, page_bytes))
              ++wrong;
        wrong_total += wrong;
        const double moved = double(pages) * regions * page_bytes;
        std::printf(
            "%s %zu pages x %zu regions x %zu B, %-8s: host %9.1f us, until landed %9.1f us (%5.1f GB/s), %zu "
            "copies wrong\n",
            dir == 0 ? "fetch" : "save ", pages, regions, page_bytes, name[m], median(host_us), median(total_us),
            moved / median(total_us) / 1e3, wrong);
        std::fflush(stdout);
      }
    }
    FERRY_CUDA_CHECK(cudaFreeHost(host));
    FERRY_CUDA_CHECK(cudaFree(dev));
  }
  return wrong_total ? 1 : 0;
}
