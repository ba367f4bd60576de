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
//   kernel:  a gather kernel on 16 blocks of 512 threads, a warp per page and
//            region, 16-byte words (pinned host memory read or written in
//            place), for comparison.
//
// --sequential-dst puts the pages at destination pages 0..pages-1 in order
// (a fetched prefix lands so); --rows N cuts each pitched copy into copies of
// at most N rows, submitted group by group (2d only; 0: all the regions in
// one). Batched copies go region by region, as ferry plans them.
// --host-page-first keeps the host side page by page ([pages, regions, page
// bytes], a page's regions contiguous, as SGLang's page-first host layout
// and vLLM's cross-layer blocks do); the GPU side stays [regions, pages, page
// bytes]. A pitched copy then reads (or writes) one contiguous span of the
// host per page. --gpu-page-first does the same on the GPU side instead.
//
//   ferry_probe_pitched_pages [--pages 1024] [--regions 64] [--page-bytes 4096,16384,32768]
//                             [--reps 10] [--ops-per-call 0] [--sequential-dst] [--rows 0]
//                             [--host-page-first | --gpu-page-first]
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
#include "probe_data.hpp"
#include "probe_timing.hpp"

namespace {

using ferry::probe::fill;
using ferry::probe::median;
using ferry::probe::now_us;
using ferry::probe::parse_list;

constexpr size_t kBatchMax = 128;

struct Case {
  char* dst;
  const char* src;
  size_t dst_pitch, src_pitch;  // bytes from one region to the next
  size_t dst_step, src_step;    // bytes from one page to the next
  size_t page_bytes, regions;
  std::vector<size_t> dst_ids, src_ids;
  char* dst_at(size_t r, size_t i) const { return dst + r * dst_pitch + dst_ids[i] * dst_step; }
  const char* src_at(size_t r, size_t i) const { return src + r * src_pitch + src_ids[i] * src_step; }
};

// Warp w of the grid takes tasks w, w + warps, ...; task t is page t / regions, region t % regions.
__global__ void gather(char* dst, const char* src, size_t dst_pitch, size_t src_pitch, size_t dst_step, size_t src_step,
                       size_t page_bytes, size_t regions, const size_t* dst_ids, const size_t* src_ids, size_t pages) {
  const size_t lane = threadIdx.x % 32, warps = size_t(gridDim.x) * blockDim.x / 32;
  const size_t words = page_bytes / 16;
  for (size_t t = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; t < pages * regions; t += warps) {
    const size_t i = t / regions, r = t % regions;
    uint4* d = reinterpret_cast<uint4*>(dst + r * dst_pitch + dst_ids[i] * dst_step);
    const uint4* s = reinterpret_cast<const uint4*>(src + r * src_pitch + src_ids[i] * src_step);
    for (size_t k = lane; k < words; k += 32) d[k] = s[k];
  }
}

struct KernelIds {
  size_t *dst = nullptr, *src = nullptr;
};

void run_kernel(const Case& c, const KernelIds& ids, cudaStream_t s) {
  gather<<<16, 512, 0, s>>>(c.dst, c.src, c.dst_pitch, c.src_pitch, c.dst_step, c.src_step, c.page_bytes, c.regions,
                            ids.dst, ids.src, c.dst_ids.size());
  FERRY_CUDA_CHECK(cudaGetLastError());
}

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
      dsts.push_back(c.dst_at(r, i));
      srcs.push_back(const_cast<char*>(c.src_at(r, i)));
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
      FERRY_CUDA_CHECK(cudaMemcpy2DAsync(c.dst_at(r, i), c.dst_pitch, c.src_at(r, i), c.src_pitch, c.page_bytes,
                                         std::min(rows, c.regions - r), cudaMemcpyDefault, s));
}

void run_3d_batch(const Case& c, cudaStream_t s, size_t per_call) {
  std::vector<cudaMemcpy3DBatchOp> ops(c.dst_ids.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    cudaMemcpy3DBatchOp& op = ops[i];
    op = {};
    op.src.type = cudaMemcpyOperandTypePointer;
    op.src.op.ptr.ptr = const_cast<char*>(c.src_at(0, i));
    op.src.op.ptr.rowLength = c.src_pitch;
    op.dst.type = cudaMemcpyOperandTypePointer;
    op.dst.op.ptr.ptr = c.dst_at(0, i);
    op.dst.op.ptr.rowLength = c.dst_pitch;
    op.extent = make_cudaExtent(c.page_bytes, c.regions, 1);
    op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    op.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  }
  if (per_call == 0) per_call = ops.size();
  for (size_t at = 0; at < ops.size(); at += per_call)
    FERRY_CUDA_CHECK(cudaMemcpy3DBatchAsync(std::min(per_call, ops.size() - at), ops.data() + at, 0, s));
}

}  // namespace

int main(int argc, char** argv) {
  size_t pages = 1024, regions = 64, per_call = 0, rows = 0;
  bool sequential_dst = false, host_page_first = false, gpu_page_first = false;
  std::vector<size_t> page_sizes = {4096, 16384, 32768};
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--sequential-dst")) sequential_dst = true;
    if (!std::strcmp(argv[i], "--host-page-first")) host_page_first = true;
    if (!std::strcmp(argv[i], "--gpu-page-first")) gpu_page_first = true;
  }
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--sequential-dst") || !std::strcmp(argv[i], "--host-page-first") ||
        !std::strcmp(argv[i], "--gpu-page-first")) {
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
  if (host_page_first && gpu_page_first) {
    std::fprintf(stderr, "--host-page-first and --gpu-page-first: one side at most (both: one plain copy per page)\n");
    return 2;
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
    // Each side's region pitch and page step: [regions, pool, page], or page first [pool, regions, page].
    const size_t dev_pitch = gpu_page_first ? page_bytes : region_bytes;
    const size_t dev_step = gpu_page_first ? regions * page_bytes : page_bytes;
    const size_t host_pitch = host_page_first ? page_bytes : region_bytes;
    const size_t host_step = host_page_first ? regions * page_bytes : page_bytes;
    std::vector<char> back(total), expect(total);
    fill(expect.data(), total, 11 + page_bytes);
    KernelIds ids;
    FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ids.dst), pages * sizeof(size_t)));
    FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ids.src), pages * sizeof(size_t)));
    for (int dir = 0; dir < 2; ++dir) {  // 0: host to GPU (fetch), 1: GPU to host (save)
      Case c = dir == 0 ? Case{dev, host, dev_pitch, host_pitch, dev_step, host_step, page_bytes, regions, a, b}
                        : Case{host, dev, host_pitch, dev_pitch, host_step, dev_step, page_bytes, regions, a, b};
      FERRY_CUDA_CHECK(cudaMemcpy(ids.dst, c.dst_ids.data(), pages * sizeof(size_t), cudaMemcpyHostToDevice));
      FERRY_CUDA_CHECK(cudaMemcpy(ids.src, c.src_ids.data(), pages * sizeof(size_t), cudaMemcpyHostToDevice));
      const char* name[] = {"batched", "2d", "3d-batch", "kernel"};
      for (int m = 0; m < 4; ++m) {
        if (m == 3 && page_bytes % 16) continue;
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
          if (m == 3) run_kernel(c, ids, s);
          const double t1 = now_us();
          FERRY_CUDA_CHECK(cudaStreamSynchronize(s));
          const double t2 = now_us();
          if (rep >= 0) {
            host_us.push_back(t1 - t0);
            total_us.push_back(t2 - t0);
          }
        }
        // Every copied byte of the last rep. `expect` is laid out as the source
        // side (filled into it), `got` as the destination side.
        const char* got = host;
        if (dir == 0) {
          FERRY_CUDA_CHECK(cudaMemcpy(back.data(), dev, total, cudaMemcpyDeviceToHost));
          got = back.data();
        }
        size_t wrong = 0;
        for (size_t i = 0; i < pages; ++i)
          for (size_t r = 0; r < regions; ++r)
            if (std::memcmp(got + (c.dst_at(r, i) - c.dst), expect.data() + (c.src_at(r, i) - c.src), page_bytes))
              ++wrong;
        wrong_total += wrong;
        const double moved = double(pages) * regions * page_bytes;
        std::printf(
            "%s%s %zu pages x %zu regions x %zu B, %-8s: host %9.1f us, until landed %9.1f us (%5.1f GB/s), %zu "
            "copies wrong\n",
            host_page_first  ? "host-page-first "
            : gpu_page_first ? "gpu-page-first "
                             : "",
            dir == 0 ? "fetch" : "save ", pages, regions, page_bytes, name[m], median(host_us), median(total_us),
            moved / median(total_us) / 1e3, wrong);
        std::fflush(stdout);
      }
    }
    FERRY_CUDA_CHECK(cudaFreeHost(host));
    FERRY_CUDA_CHECK(cudaFree(dev));
    FERRY_CUDA_CHECK(cudaFree(ids.dst));
    FERRY_CUDA_CHECK(cudaFree(ids.src));
  }
  return wrong_total ? 1 : 0;
}
