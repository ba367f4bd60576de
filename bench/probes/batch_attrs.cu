// Probe: does any attribute or size of a cudaMemcpyBatchAsync call cut the
// driver's host time per copy? Inline, a small paged KV transfer on copy
// engines costs the host about 1-1.5 us a copy in ferry's batched calls (32
// copies a call, source read in stream order, the overlap-with-compute hint),
// which keeps it near a per-page loop at 64 pages. This times, for `pages`
// scattered pages, each direction, the batched submission with:
//   stream+hint: ferry's attributes (srcAccessOrder Stream, PreferOverlapWithCompute);
//   stream:      the same without the hint;
//   any:         srcAccessOrder Any (what settled_source=True sets);
//   during-call: srcAccessOrder DuringApiCall (the source may be read before
//                the call returns: the driver may take small host sources inline);
//   and stream+hint in calls of 8, 16, 64 and 128 copies, and in one call;
// host time of the submission and time until the copies landed (median of
// --reps after a warm-up). Every copied byte of each variant's last rep is
// checked against a poisoned destination; exit 1 if any is wrong.
//
//   ferry_probe_batch_attrs [--pages 64,256,1024] [--page-bytes 4096,16384,65536] [--reps 30]
#include <cuda_runtime_api.h>

#include <algorithm>
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
using ferry::probe::pages_wrong;
using ferry::probe::parse_list;

struct Variant {
  const char* name;
  cudaMemcpySrcAccessOrder order;
  unsigned flags;
  size_t per_call;  // 0: every copy in one call
};

void submit(const Variant& v, std::vector<void*>& dst, std::vector<void*>& src, std::vector<size_t>& sizes,
            cudaStream_t s) {
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = v.order;
  attr.flags = v.flags;
  const size_t n = dst.size(), per = v.per_call ? v.per_call : n;
  for (size_t at = 0; at < n; at += per) {
    size_t idx = 0;
    FERRY_CUDA_CHECK(cudaMemcpyBatchAsync(dst.data() + at, src.data() + at, sizes.data() + at, std::min(per, n - at),
                                          &attr, &idx, 1, s));
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<size_t> counts = {64, 256, 1024}, page_sizes = {4096, 16384, 65536};
  int reps = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--pages")) counts = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--page-bytes")) page_sizes = parse_list(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  if (reps < 1 || counts.empty() || page_sizes.empty()) {
    std::fprintf(stderr, "--reps, --pages and --page-bytes must be at least 1\n");
    return 2;
  }
  const unsigned hint = cudaMemcpyFlagPreferOverlapWithCompute;
  const Variant variants[] = {
      {"stream+hint", cudaMemcpySrcAccessOrderStream, hint, 32},
      {"stream", cudaMemcpySrcAccessOrderStream, 0, 32},
      {"any", cudaMemcpySrcAccessOrderAny, hint, 32},
      {"during-call", cudaMemcpySrcAccessOrderDuringApiCall, hint, 32},
      {"calls-of-8", cudaMemcpySrcAccessOrderStream, hint, 8},
      {"calls-of-16", cudaMemcpySrcAccessOrderStream, hint, 16},
      {"calls-of-64", cudaMemcpySrcAccessOrderStream, hint, 64},
      {"calls-of-128", cudaMemcpySrcAccessOrderStream, hint, 128},
      {"one-call", cudaMemcpySrcAccessOrderStream, hint, 0},
  };
  FERRY_CUDA_CHECK(cudaSetDevice(0));
  cudaStream_t s;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937_64 rng(7);
  size_t wrong_total = 0;
  for (size_t page_bytes : page_sizes)
    for (size_t pages : counts) {
      const size_t pool = 2 * pages, total = pool * page_bytes;
      char *host = nullptr, *dev = nullptr;
      FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host), total, cudaHostAllocPortable));
      FERRY_CUDA_CHECK(cudaMalloc(&dev, total));
      std::vector<char> expect(total), back(total);
      fill(expect.data(), total, 13 + page_bytes + pages);
      std::vector<size_t> sizes(pages, page_bytes);
      for (int dir = 0; dir < 2; ++dir) {  // 0: host to GPU (fetch), 1: GPU to host (save)
        std::vector<size_t> a(pool), b(pool);
        std::iota(a.begin(), a.end(), 0);
        std::iota(b.begin(), b.end(), 0);
        std::shuffle(a.begin(), a.end(), rng);
        std::shuffle(b.begin(), b.end(), rng);
        char* to = dir == 0 ? dev : host;
        char* from = dir == 0 ? host : dev;
        std::vector<void*> dst, src;
        for (size_t i = 0; i < pages; ++i) {
          dst.push_back(to + a[i] * page_bytes);
          src.push_back(from + b[i] * page_bytes);
        }
        for (const Variant& v : variants) {
          std::vector<double> host_us, total_us;
          for (int rep = -3; rep < reps; ++rep) {
            if (rep == -3 || rep == reps - 1) {  // the source's data; a poisoned destination before the checked rep
              if (dir == 0) {
                std::memcpy(host, expect.data(), total);
                FERRY_CUDA_CHECK(cudaMemset(dev, 0xff, total));
              } else {
                FERRY_CUDA_CHECK(cudaMemcpy(dev, expect.data(), total, cudaMemcpyHostToDevice));
                std::memset(host, 0xff, total);
              }
              FERRY_CUDA_CHECK(cudaDeviceSynchronize());
            }
            const double t0 = now_us();
            submit(v, dst, src, sizes, s);
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
          std::printf(
              "%s %5zu x %6zu B %-12s host %8.1f us (%5.2f a copy), until landed %8.1f us (%5.1f GB/s), %zu "
              "pages wrong\n",
              dir == 0 ? "fetch" : "save ", pages, page_bytes, v.name, median(host_us), median(host_us) / pages,
              median(total_us), double(pages) * page_bytes / median(total_us) / 1e3, wrong);
          std::fflush(stdout);
        }
      }
      FERRY_CUDA_CHECK(cudaFreeHost(host));
      FERRY_CUDA_CHECK(cudaFree(dev));
    }
  return wrong_total ? 1 : 0;
}
