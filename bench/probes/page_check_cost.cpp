// Probe (CPU only): the host time of a page transfer's index checks
// (xfer::check_ids), which every copy_blocks call runs, and with it the
// overlap check across tensors. T tensors a side, n scattered pages:
//   in turn:     a fetch (per-layer GPU tensors <- a page-first host pool)
//                and a save (the reverse), the sides the same every call, as a
//                server's are;
//   new layout:  the GPU tensors at another address every call (the overlap
//                check's search runs every time);
//   one pool:    a page-first pool on both sides (a copy within it).
// Each figure is the mean of 2,000 calls, after one untimed call. Build it
// optimised (the development build is not):
//
//   cmake -S . -B build/rel -G Ninja -DCMAKE_BUILD_TYPE=Release -DFERRY_BUILD_TESTS=OFF
//   cmake --build build/rel --target ferry_probe_page_checks && build/rel/ferry_probe_page_checks
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include "xfer/page_plan.hpp"

using ferry::xfer::PageIds;
using ferry::xfer::PageRegion;
using ferry::xfer::PageSide;

namespace {

template <class F>
double us_per_call(int calls, F&& f) {
  f();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) f();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / calls;
}

}  // namespace

int main() {
  constexpr size_t kPage = 4096, kPages = 4096;
  constexpr int kCalls = 2000;
  std::printf("tensors  pages  in turn (us)  new layout (us)  one pool (us)\n");
  for (size_t T : {size_t{2}, size_t{64}})
    for (size_t n : {size_t{64}, size_t{1024}}) {
      PageSide pool, gpu;
      for (size_t i = 0; i < T; ++i) {
        pool.regions.push_back(PageRegion{0x100000000 + i * kPage, T * kPage, kPage, kPages, 0x100000000});
        const uintptr_t at = 0x900000000 + i * kPages * kPage * 2;
        gpu.regions.push_back(PageRegion{at, kPage, kPage, kPages, at});
      }
      std::mt19937_64 rng(1);
      std::vector<int64_t> d(kPages), s(kPages);
      for (size_t i = 0; i < kPages; ++i) d[i] = s[i] = static_cast<int64_t>(i);
      std::shuffle(d.begin(), d.end(), rng);
      std::shuffle(s.begin(), s.end(), rng);
      d.resize(n);
      s.resize(n);
      const PageIds di{d.data(), n, true}, si{s.data(), n, true};
      const double in_turn = us_per_call(kCalls,
                                         [&] {
                                           ferry::xfer::check_ids(gpu, pool, di, si);
                                           ferry::xfer::check_ids(pool, gpu, di, si);
                                         }) /
                             2;
      PageSide moved = gpu;
      const double fresh = us_per_call(kCalls, [&] {
        for (auto& g : moved.regions) g.base += size_t{1} << 30;
        ferry::xfer::check_ids(moved, pool, di, si);
      });
      // Within one pool: destinations 0..n-1, sources past them.
      std::vector<int64_t> pd(n), ps(n);
      for (size_t i = 0; i < n; ++i) {
        pd[i] = static_cast<int64_t>(i);
        ps[i] = static_cast<int64_t>(kPages / 2 + i);
      }
      const PageIds pdi{pd.data(), n, true}, psi{ps.data(), n, true};
      const double one_pool = us_per_call(kCalls, [&] { ferry::xfer::check_ids(pool, pool, pdi, psi); });
      std::printf("%7zu  %5zu  %12.2f  %15.2f  %13.2f\n", T, n, in_turn, fresh, one_pool);
    }
  return 0;
}
