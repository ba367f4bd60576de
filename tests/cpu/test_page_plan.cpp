// The pure part of paged KV transfers: validation, run merging, splitting, and
// the auto table. Every case builds sides from plain numbers (no GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <random>
#include <string>

#include "core/error.hpp"
#include "error_of.hpp"
#include "xfer/page_plan.hpp"
#include "xfer/page_select.hpp"

using namespace ferry;
using namespace ferry::xfer;

namespace {

// `regions` regions in one allocation that starts at `base`.
PageSide side(uintptr_t base, size_t stride, size_t bytes, size_t pages, int regions = 1, size_t region_gap = 0) {
  PageSide s;
  for (int r = 0; r < regions; ++r)
    s.regions.push_back(PageRegion{base + r * (region_gap ? region_gap : stride * pages), stride, bytes, pages, base});
  return s;
}

PageIds ids(const std::vector<int64_t>& v) { return PageIds{v.data(), v.size(), true}; }

// The page-by-page reference: (dst byte, src byte) every 16 bytes of every
// region's page d[i] <- s[i].
std::map<uintptr_t, uintptr_t> reference_pairs(const PageSide& dst, const PageSide& src, const std::vector<int64_t>& d,
                                               const std::vector<int64_t>& s, size_t bytes) {
  std::map<uintptr_t, uintptr_t> out;
  for (size_t r = 0; r < dst.regions.size(); ++r)
    for (size_t i = 0; i < d.size(); ++i)
      for (size_t b = 0; b < bytes; b += 16)
        out[dst.regions[r].base + d[i] * dst.regions[r].stride + b] =
            src.regions[r].base + s[i] * src.regions[r].stride + b;
  return out;
}

}  // namespace

TEST(PagePlan, OneCopyPerPageWhenNothingIsAdjacent) {
  auto dst = side(0x100000, 4096, 4096, 16), src = side(0x900000, 4096, 4096, 16);
  std::vector<int64_t> d{3, 9, 1}, s{7, 2, 12};
  auto copies = plan_page_copies(dst, src, ids(d), ids(s), true);
  ASSERT_EQ(copies.size(), 3u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(copies[1].dst), 0x100000u + 9 * 4096);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(copies[1].src), 0x900000u + 2 * 4096);
  EXPECT_EQ(copies[1].bytes, 4096u);
}

TEST(PagePlan, RunsOfAdjacentPagesMerge) {
  auto dst = side(0x100000, 512, 512, 64), src = side(0x900000, 512, 512, 64);
  std::vector<int64_t> d{4, 5, 6, 20, 21, 9}, s{10, 11, 12, 30, 32, 13};
  auto copies = plan_page_copies(dst, src, ids(d), ids(s), true);
  // 4-6 <- 10-12 is one run; 20 <- 30 and 21 <- 32 are not (source gap); 9 <- 13 alone.
  ASSERT_EQ(copies.size(), 4u);
  EXPECT_EQ(copies[0].bytes, 3u * 512);
  EXPECT_EQ(copies[1].bytes, 512u);
  EXPECT_EQ(copies[2].bytes, 512u);
  auto unmerged = plan_page_copies(dst, src, ids(d), ids(s), false);
  EXPECT_EQ(unmerged.size(), 6u);
}

TEST(PagePlan, StridedPagesNeverMerge) {
  // vLLM's per-layer [2, blocks, ...] viewed as K: the stride is the page, but a
  // page-first layout with several layers has stride > bytes.
  auto dst = side(0x100000, 8192, 4096, 8), src = side(0x900000, 4096, 4096, 8);
  std::vector<int64_t> d{0, 1, 2}, s{0, 1, 2};
  EXPECT_EQ(plan_page_copies(dst, src, ids(d), ids(s), true).size(), 3u);
}

TEST(PagePlan, RegionsShareOneMapping) {
  auto dst = side(0x1000000, 1024, 1024, 10, 3), src = side(0x9000000, 1024, 1024, 20, 3);
  std::vector<int64_t> d{0, 5}, s{19, 3};
  auto copies = plan_page_copies(dst, src, ids(d), ids(s), true);
  ASSERT_EQ(copies.size(), 6u);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(copies[2 * r].src), 0x9000000u + r * 1024 * 20 + 19 * 1024);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(copies[2 * r + 1].dst), 0x1000000u + r * 1024 * 10 + 5 * 1024);
  }
  EXPECT_EQ(request_bytes(dst, 2), 6u * 1024);
}

TEST(PagePlan, Int32Ids) {
  auto dst = side(0x100000, 64, 64, 8), src = side(0x900000, 64, 64, 8);
  std::vector<int32_t> d{1, 2}, s{3, 4};
  auto copies = plan_page_copies(dst, src, PageIds{d.data(), 2, false}, PageIds{s.data(), 2, false}, true);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].bytes, 128u);
}

TEST(PagePlan, ZeroPagesIsNothing) {
  auto dst = side(0x100000, 64, 64, 8), src = side(0x900000, 64, 64, 8);
  EXPECT_TRUE(plan_page_copies(dst, src, PageIds{nullptr, 0, true}, PageIds{nullptr, 0, true}, true).empty());
}

TEST(PagePlan, BadInputIsNamed) {
  auto dst = side(0x100000, 4096, 4096, 16), src = side(0x900000, 4096, 4096, 8);
  std::vector<int64_t> ok{1, 2}, neg{1, -1}, big{1, 16}, big_src{8, 1}, dup{3, 3}, one{1};
  EXPECT_NE(error_of([&] { plan_page_copies(dst, src, ids(neg), ids(ok), true); }).find("dst_ids[1] = -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, src, ids(big), ids(ok), true); }).find("dst has 16 pages"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, src, ids(ok), ids(big_src), true); }).find("src_ids[0] = 8"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, src, ids(dup), ids(ok), true); }).find("page 3 twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, src, ids(one), ids(ok), true); }).find("same length"),
            std::string::npos);
  auto half = side(0x900000, 2048, 2048, 8);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, half, ids(ok), ids(ok), true); }).find("equal page sizes"),
            std::string::npos);
  auto two = side(0x900000, 4096, 4096, 8, 2);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, two, ids(ok), ids(ok), true); }).find("pair up"), std::string::npos);
  auto overlapping = side(0x900000, 1024, 4096, 8);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, overlapping, ids(ok), ids(ok), true); }).find("pages overlap"),
            std::string::npos);
  // A region whose span wraps past 64 bits would pass every check sized by it.
  auto wraps = side(0x900000, 4096, 4096, (size_t{1} << 52) + 1);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, wraps, ids(ok), ids(ok), true); }).find("run past the address space"),
            std::string::npos);
  auto past_top = side(uintptr_t{1} << 62, size_t{1} << 50, 4096, 4097);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, past_top, ids(ok), ids(ok), true); }).find("src[0]: 4097 pages"),
            std::string::npos);
  PageSide null_side = side(0, 4096, 4096, 8);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, null_side, ids(ok), ids(ok), true); }).find("null pointer"),
            std::string::npos);
  // The range named ends at the last valid index; negative source indices and 32-bit lists are checked alike.
  EXPECT_NE(error_of([&] { plan_page_copies(dst, src, ids(big), ids(ok), true); }).find("valid indices 0..15)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan_page_copies(dst, src, ids(ok), ids(neg), true); }).find("src_ids[1] = -1"),
            std::string::npos);
  std::vector<int32_t> neg32{2, -3}, ok32{1, 2};
  EXPECT_NE(error_of([&] {
              plan_page_copies(dst, src, PageIds{neg32.data(), 2, false}, PageIds{ok32.data(), 2, false}, true);
            }).find("dst_ids[1] = -3"),
            std::string::npos);
  auto empty = side(0x100000, 4096, 4096, 0);
  std::vector<int64_t> zero{0};
  EXPECT_NE(error_of([&] {
              plan_page_copies(empty, src, ids(zero), ids(zero), true);
            }).find("dst has 0 pages (no index is valid)"),
            std::string::npos);
  // Two tensors that share memory half a page apart: src page 1 is half of dst pages 1 and 2.
  auto shifted = side(0x100800, 4096, 4096, 16);
  const std::string e = error_of([&] { plan_page_copies(dst, shifted, ids(ok), ids(ok), true); });
  EXPECT_NE(e.find("src_ids[0] = 1: page 1 of src[0] shares memory with page 1 of dst[0] (dst_ids[0])"),
            std::string::npos)
      << e;
}

TEST(PagePlan, DuplicateCheckLeavesNoStateBehind) {
  // The bitmap of seen pages is reused between calls: an error must not leak
  // marks into the next call, and a valid call must not either.
  auto dst = side(0x100000, 64, 64, 1000), src = side(0x900000, 64, 64, 1000);
  std::vector<int64_t> dup{5, 700, 5}, s{1, 2, 3}, again{5, 700, 6};
  EXPECT_FALSE(error_of([&] { plan_page_copies(dst, src, ids(dup), ids(s), true); }).empty());
  EXPECT_EQ(plan_page_copies(dst, src, ids(again), ids(s), false).size(), 3u);
  EXPECT_EQ(plan_page_copies(dst, src, ids(again), ids(s), false).size(), 3u);
}

TEST(PagePlan, CopiesWithinOneTensorMustNotReadWrittenPages) {
  auto cache = side(0x100000, 256, 256, 32);
  std::vector<int64_t> d{1, 2}, s{5, 1};
  EXPECT_NE(error_of([&] { plan_page_copies(cache, cache, ids(d), ids(s), true); }).find("also a destination"),
            std::string::npos);
  std::vector<int64_t> s_ok{5, 6};
  EXPECT_EQ(plan_page_copies(cache, cache, ids(d), ids(s_ok), true).size(), 1u);
}

bool passes(const std::function<void()>& fn) { return code_of(fn) == FERRY_SUCCESS; }

PageRegion region(uintptr_t base, size_t stride, size_t bytes, size_t pages) {
  return PageRegion{base, stride, bytes, pages, 0};
}

PageSide sides_of(std::initializer_list<PageRegion> regions) {
  PageSide s;
  s.regions = regions;
  return s;
}

TEST(PagePlan, RegionsThatShareMemoryAreCheckedAcrossTensors) {
  const size_t P = 256, N = 16;
  const PageRegion l0 = region(0x100000, P, P, N), l1 = region(0x200000, P, P, N), l2 = region(0x300000, P, P, N);
  std::vector<int64_t> five{5}, six{6}, zero{0};
  // One tensor given twice as a destination: both copies write its page 5.
  std::string e = error_of([&] { check_ids(sides_of({l0, l0}), sides_of({l1, l2}), ids(five), ids(five)); });
  EXPECT_NE(e.find("dst[0] and dst[1] share memory: page 5 of dst[0] (dst_ids[0]) overlaps page 5 of dst[1]"),
            std::string::npos)
      << e;
  // Layers shifted by one on one GPU: src[0] is dst[1], so page 5 is read and written.
  e = error_of([&] { check_ids(sides_of({l0, l1}), sides_of({l1, l2}), ids(five), ids(five)); });
  EXPECT_NE(e.find("src_ids[0] = 5 is also a destination page of the same tensor"), std::string::npos) << e;
  // The same shift reading page 6 and writing page 5 touches no page twice.
  EXPECT_TRUE(passes([&] { check_ids(sides_of({l0, l1}), sides_of({l1, l2}), ids(five), ids(six)); }));
  // One tensor's views a page apart (t[1:] and t[:-1]): t[2] written as page 1 of one, read as page 2 of the other.
  const PageRegion tail = region(0x100000 + P, P, P, N - 1), head = region(0x100000, P, P, N - 1);
  std::vector<int64_t> one{1}, two{2};
  e = error_of([&] { check_ids(sides_of({tail}), sides_of({head}), ids(one), ids(two)); });
  EXPECT_NE(e.find("src_ids[0] = 2: page 2 of src[0] shares memory with page 1 of dst[0] (dst_ids[0])"),
            std::string::npos)
      << e;
  EXPECT_TRUE(passes([&] { check_ids(sides_of({tail}), sides_of({head}), ids(zero), ids(two)); }));
  // A view of one page (its stride means nothing) inside a tensor it reads from: t[3:4] <- t[5], and <- t[3].
  const PageRegion one_page = region(0x100000 + 3 * P, 7, P, 1);
  EXPECT_TRUE(passes([&] { check_ids(sides_of({one_page}), sides_of({l0}), ids(zero), ids(five)); }));
  std::vector<int64_t> three{3};
  e = error_of([&] { check_ids(sides_of({one_page}), sides_of({l0}), ids(zero), ids(three)); });
  EXPECT_NE(e.find("page 3 of src[0] shares memory with page 0 of dst[0]"), std::string::npos) << e;
}

TEST(PagePlan, APageFirstPoolsInterleavedTensorsShareNoPage) {
  // [pages, 8 tensors, 1 KB]: tensor i is page p at base + p * 8 KB + i KB. Saved into, every tensor's range
  // overlaps every other's, and no page of one touches a page of another.
  const size_t K = 1024, T = 8, N = 64;
  PageSide pool, gpu;
  for (size_t i = 0; i < T; ++i) {
    pool.regions.push_back(region(0x1000000 + i * K, T * K, K, N));
    gpu.regions.push_back(region(0x9000000 + i * N * K, K, K, N));
  }
  std::vector<int64_t> d(N), s(N);
  for (size_t i = 0; i < N; ++i) d[i] = s[i] = static_cast<int64_t>(i);
  EXPECT_TRUE(passes([&] { check_ids(pool, gpu, ids(d), ids(s)); }));
  EXPECT_TRUE(passes([&] { check_layouts(pool, gpu); }));
  // A tensor's view shifted by half a tensor overlaps its neighbours' pages.
  pool.regions[3].base += K / 2;
  EXPECT_FALSE(passes([&] { check_ids(pool, gpu, ids(d), ids(s)); }));
  EXPECT_NE(error_of([&] { check_layouts(pool, gpu); }).find("share memory"), std::string::npos);
}

TEST(PagePlan, OnePageFirstPoolOnBothSidesMovesPagesWithinIt) {
  // A copy within one page-first cache (copy on write): each tensor on both sides; pages moved, not shared.
  const size_t K = 1024, T = 64, N = 256;
  PageSide pool;
  for (size_t i = 0; i < T; ++i) pool.regions.push_back(region(0x1000000 + i * K, T * K, K, N));
  std::vector<int64_t> d{10, 11, 12}, s{200, 201, 11};
  EXPECT_NE(error_of([&] { check_ids(pool, pool, ids(d), ids(s)); }).find("src_ids[2] = 11 is also a destination page"),
            std::string::npos);
  s[2] = 202;
  EXPECT_TRUE(passes([&] { check_ids(pool, pool, ids(d), ids(s)); }));
  EXPECT_TRUE(passes([&] { check_layouts(pool, pool); }));
}

TEST(PagePlan, RegionsOfMorePagesThanTheirSideAreLookedUpWithinTheLists) {
  // src[1] has 10 pages, so the lists name src pages 0..9; src[0], dst[0]'s memory half a page on, meets dst
  // page 150 at its pages 149 and 150, which no list names (and no bit of the source side's marks).
  const size_t P = 4096;
  const PageRegion k = region(0x10000000, P, P, 1000), half_on = region(0x10000000 + P / 2, P, P, 1000),
                   w = region(0x20000000, P, P, 200), x = region(0x30000000, P, P, 10);
  std::vector<int64_t> d{150}, s{3};
  EXPECT_TRUE(passes([&] { check_ids(sides_of({k, w}), sides_of({half_on, x}), ids(d), ids(s)); }));
  d[0] = 3;
  EXPECT_FALSE(passes([&] { check_ids(sides_of({k, w}), sides_of({half_on, x}), ids(d), ids(s)); }));
}

TEST(PagePlan, LayoutsAloneRefuseWhatAnyListsWouldRace) {
  const size_t P = 256, N = 16;
  const PageRegion a = region(0x100000, P, P, N), b = region(0x200000, P, P, N);
  // One tensor on both sides: only the lists can tell.
  EXPECT_TRUE(passes([&] { check_layouts(sides_of({a}), sides_of({a})); }));
  EXPECT_NE(error_of([&] {
              check_layouts(sides_of({a, a}), sides_of({b, b}));
            }).find("dst[0] and dst[1] share memory"),
            std::string::npos);
  const PageRegion shifted = region(0x100000 + P / 2, P, P, N);
  EXPECT_NE(error_of([&] { check_layouts(sides_of({a}), sides_of({shifted})); }).find("different page layouts"),
            std::string::npos);
  // Adjacent tensors, and views of one tensor whose pages cannot meet (the first half written, the second read).
  const PageRegion first = region(0x100000, P, P, N / 2), second = region(0x100000 + N / 2 * P, P, P, N / 2);
  EXPECT_TRUE(passes([&] { check_layouts(sides_of({first}), sides_of({second})); }));
}

// Every byte a request writes against every other it writes or reads: the
// reference for the checks above, on random layouts within one small arena.
bool races(const PageSide& dst, const PageSide& src, const std::vector<int64_t>& d, const std::vector<int64_t>& s,
           bool layouts_only) {
  struct Iv {
    uintptr_t lo, hi;
    size_t r;
    bool dst;
  };
  std::vector<Iv> w, rd;
  for (size_t r = 0; r < dst.regions.size(); ++r) {
    const PageRegion &g = dst.regions[r], &h = src.regions[r];
    for (int64_t p : d) w.push_back(Iv{g.base + p * g.stride, g.base + p * g.stride + g.bytes, r, true});
    for (int64_t q : s) rd.push_back(Iv{h.base + q * h.stride, h.base + q * h.stride + h.bytes, r, false});
  }
  auto meet = [](const Iv& x, const Iv& y) { return x.lo < y.hi && y.lo < x.hi; };
  for (size_t i = 0; i < w.size(); ++i)
    for (size_t j = i + 1; j < w.size(); ++j)
      if (meet(w[i], w[j])) return true;
  for (const Iv& x : w)
    for (const Iv& y : rd) {
      if (!meet(x, y)) continue;
      const PageRegion &g = dst.regions[x.r], &h = src.regions[y.r];
      if (layouts_only && g.base == h.base && g.stride == h.stride && g.bytes == h.bytes) continue;
      return true;
    }
  return false;
}

TEST(PagePlan, OverlapChecksMatchAByteReference) {
  std::mt19937_64 rng(11);
  int refused = 0, accepted = 0, layouts_refused = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const size_t regions = 1 + rng() % 3, unit = 16;
    PageSide dst, src;
    for (size_t r = 0; r < regions; ++r) {
      for (int side = 0; side < 2; ++side) {
        const size_t bytes = side == 0 ? unit * (1 + rng() % 4) : dst.regions[r].bytes;
        const size_t pages = 1 + rng() % 6;
        const size_t stride = bytes + unit * (rng() % 5);
        const uintptr_t base = 0x10000 + unit * (rng() % 48);
        (side == 0 ? dst : src).regions.push_back(region(base, stride, bytes, pages));
      }
    }
    size_t dp = SIZE_MAX, sp = SIZE_MAX;
    for (size_t r = 0; r < regions; ++r) {
      dp = std::min(dp, dst.regions[r].pages);
      sp = std::min(sp, src.regions[r].pages);
    }
    const size_t n = 1 + rng() % std::min(dp, sp);
    std::vector<int64_t> d(dp), s(n);
    for (size_t i = 0; i < dp; ++i) d[i] = static_cast<int64_t>(i);
    std::shuffle(d.begin(), d.end(), rng);
    d.resize(n);
    for (auto& q : s) q = static_cast<int64_t>(rng() % sp);
    const bool race = races(dst, src, d, s, false);
    const bool got = !passes([&] { check_ids(dst, src, ids(d), ids(s)); });
    ASSERT_EQ(got, race) << "trial " << trial;
    (got ? refused : accepted)++;
    // Without the lists: whatever it lets through races only where one tensor is on both sides.
    const bool layouts = !passes([&] { check_layouts(dst, src); });
    if (!layouts) ASSERT_FALSE(races(dst, src, d, s, true)) << "trial " << trial;
    layouts_refused += layouts;
  }
  EXPECT_GT(refused, 1000);
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(layouts_refused, 1000);
}

TEST(PagePlan, RandomRequestsMatchAReferenceExpansion) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    size_t pages = 1 + rng() % 300, n = rng() % (pages + 1), bytes = 16 * (1 + rng() % 8);
    int regions = 1 + static_cast<int>(rng() % 3);
    auto dst = side(0x10000000, bytes, bytes, pages, regions, 1 << 20);
    auto src = side(0x90000000, bytes, bytes, pages, regions, 1 << 20);
    std::vector<int64_t> perm(pages);
    for (size_t i = 0; i < pages; ++i) perm[i] = static_cast<int64_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int64_t> d(perm.begin(), perm.begin() + static_cast<long>(n)), s(n);
    for (auto& x : s) x = static_cast<int64_t>(rng() % pages);
    if (rng() % 2) std::sort(d.begin(), d.end());  // sorted: runs appear
    auto copies = plan_page_copies(dst, src, ids(d), ids(s), true);
    // Expand the copies back into (dst byte, src byte) pairs and compare with
    // the page-by-page reference; no destination byte may be written twice.
    std::map<uintptr_t, uintptr_t> got;
    size_t written = 0;
    for (const auto& c : copies)
      for (size_t b = 0; b < c.bytes; b += 16, ++written)
        got[reinterpret_cast<uintptr_t>(c.dst) + b] = reinterpret_cast<uintptr_t>(c.src) + b;
    const auto want = reference_pairs(dst, src, d, s, bytes);
    ASSERT_EQ(got, want) << "trial " << trial;
    ASSERT_EQ(written, want.size()) << "trial " << trial << ": a destination written twice";
    EXPECT_EQ(count_page_rows(dst, src, ids(d), ids(s), true, 0, 0), copies.size()) << "trial " << trial;
    EXPECT_EQ(count_page_rows(dst, src, ids(d), ids(s), false, 0, 0), n * regions) << "trial " << trial;
  }
}

// The kernel strategy counts rows instead of planning copies: the count must
// refuse what the plan refuses, with the same words.
TEST(PagePlan, CountingRowsChecksAsPlanningDoes) {
  auto cache = side(0x10000000, 64, 64, 8, 2, 1 << 20);
  auto host = side(0x90000000, 64, 64, 8, 2, 1 << 20);
  for (const auto& [d, s] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{1, 1}, {2, 3}}, {{8}, {0}}, {{0}, {-1}}, {{0, 1}, {0}}}) {
    const std::string planned = error_of([&] { plan_page_rows(cache, host, ids(d), ids(s), true, 0, 0); });
    ASSERT_FALSE(planned.empty());
    EXPECT_EQ(error_of([&] { count_page_rows(cache, host, ids(d), ids(s), true, 0, 0); }), planned);
  }
  auto one = side(0x90000000, 64, 64, 8, 1, 1 << 20);
  std::vector<int64_t> d{0}, s{0};
  EXPECT_NE(error_of([&] { count_page_rows(cache, one, ids(d), ids(s), true, 0, 0); }).find("pair up"),
            std::string::npos);
}

TEST(PagePlan, SplitByBytesCoversEverythingOnce) {
  std::vector<PitchedCopy> copies;
  for (int i = 0; i < 10; ++i)
    copies.push_back(
        PitchedCopy{nullptr, nullptr, static_cast<size_t>(100 * (i % 3 + 1)), size_t(1 + i % 4), 4096, 4096});
  for (size_t parts : {1u, 2u, 3u, 4u, 16u}) {
    auto groups = split_by_bytes(copies, parts);
    ASSERT_LE(groups.size(), parts);
    size_t next = 0;
    for (auto [b, e] : groups) {
      EXPECT_EQ(b, next);
      EXPECT_LT(b, e);
      next = e;
    }
    EXPECT_EQ(next, copies.size());
  }
  EXPECT_TRUE(split_by_bytes({}, 4).empty());
}

namespace {

// (dst byte, src byte) of every byte a list of copies moves, in order.
std::vector<std::pair<uintptr_t, uintptr_t>> expand(const std::vector<PitchedCopy>& copies, size_t step = 1) {
  std::vector<std::pair<uintptr_t, uintptr_t>> out;
  for (const PitchedCopy& c : copies)
    for (size_t r = 0; r < c.rows; ++r) {
      const Copy row = c.row(r);
      for (size_t b = 0; b < row.bytes; b += step)
        out.emplace_back(reinterpret_cast<uintptr_t>(row.dst) + b, reinterpret_cast<uintptr_t>(row.src) + b);
    }
  return out;
}

}  // namespace

// Every byte of every copy once, in order, each slice at most the bound and
// only the last one short; a row longer than what is left of a slice cut
// into pieces, a pitched copy cut between rows.
TEST(PagePlan, SlicesCoverEveryByteOnceInOrderWithinTheBound) {
  std::vector<PitchedCopy> copies;
  uintptr_t d = 1 << 20, s = 1 << 28;
  const size_t widths[] = {3000, 16, 10000, 0, 4096, 1, 700, 2048};
  const size_t rows[] = {1, 1, 1, 1, 1, 1, 9, 5};
  for (int i = 0; i < 8; ++i) {
    const size_t dp = rows[i] > 1 ? widths[i] + 100 : 0, sp = rows[i] > 1 ? widths[i] + 36 : 0;
    copies.push_back(
        PitchedCopy{reinterpret_cast<void*>(d), reinterpret_cast<const void*>(s), widths[i], rows[i], dp, sp});
    d += rows[i] * (widths[i] + 100) + 64;
    s += rows[i] * (widths[i] + 128) + 128;
  }
  for (size_t slice : {size_t{1}, size_t{7}, size_t{1400}, size_t{4096}, size_t{5000}, size_t{1} << 30}) {
    auto slices = slice_copies(copies, slice);
    std::vector<std::pair<uintptr_t, uintptr_t>> got;
    for (size_t i = 0; i < slices.size(); ++i) {
      size_t total = 0;
      for (const PitchedCopy& c : slices[i]) {
        total += c.bytes();
        EXPECT_TRUE(c.rows == 1 || (c.dst_pitch >= c.width && c.src_pitch >= c.width));
      }
      auto part = expand(slices[i]);
      got.insert(got.end(), part.begin(), part.end());
      EXPECT_LE(total, slice);
      if (i + 1 < slices.size()) EXPECT_EQ(total, slice) << "only the last slice is short";
    }
    EXPECT_EQ(got, expand(copies)) << slice;
  }
  EXPECT_EQ(slice_copies(copies, 0).size(), 1u);
  EXPECT_TRUE(slice_copies({}, 4096).empty());
}

// Regions at one stride on both sides form a ladder; anything that breaks
// the stride, the page shape or the pitch bounds ends it.
TEST(PagePlan, RegionLaddersFollowTheLayout) {
  const size_t page = 4096, pages = 64, pitch = page * pages;
  // [6, pages, page] on the GPU, [6, 2 * pages, page] on the host: one ladder of 6.
  auto dst = side(0x10000000, page, page, pages, 6), src = side(0x90000000, page, page, 2 * pages, 6);
  auto l = region_ladders(dst, src, SIZE_MAX);
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].count, 6u);
  EXPECT_EQ(l[0].dst_pitch, pitch);
  EXPECT_EQ(l[0].src_pitch, 2 * pitch);
  // No pitched copies asked for, or pitches over the GPU's limit: every region alone.
  EXPECT_EQ(region_ladders(dst, src, 0).size(), 6u);
  EXPECT_EQ(region_ladders(dst, src, pitch).size(), 6u);  // the source pitch is over
  EXPECT_EQ(region_ladders(dst, src, 2 * pitch).size(), 1u);
  // vLLM's per-layer [2, blocks, ...]: K and V of a layer are two apart, the
  // layers anywhere: pairs are too short to be worth a pitched copy.
  PageSide vd, vs;
  for (uintptr_t layer : {0x10000000u, 0x30000000u, 0x20000000u})
    for (int kv = 0; kv < 2; ++kv) {
      vd.regions.push_back(PageRegion{layer + kv * pitch, page, page, pages, layer});
      vs.regions.push_back(PageRegion{layer + 0x80000000u + kv * pitch, page, page, pages, layer + 0x80000000u});
    }
  EXPECT_EQ(region_ladders(vd, vs, SIZE_MAX).size(), 6u);
  // Mixed: 4 stacked, one elsewhere, 3 stacked again; a region of other page
  // bytes, stride or a zero-byte region breaks a ladder.
  PageSide md, ms;
  auto add = [&](uintptr_t db, uintptr_t sb, size_t bytes, size_t stride) {
    md.regions.push_back(PageRegion{db, stride, bytes, pages, 1});
    ms.regions.push_back(PageRegion{sb, stride, bytes, pages, 1});
  };
  for (int r = 0; r < 4; ++r) add(0x10000000 + r * pitch, 0x90000000 + r * pitch, page, page);
  add(0x50000000, 0xA0000000, page, page);
  for (int r = 0; r < 3; ++r) add(0x60000000 + r * pitch, 0xB0000000 + r * pitch, page, page);
  add(0x60000000 + 3 * pitch, 0xB0000000 + 3 * pitch, page / 2, page);                              // other page bytes
  for (int r = 0; r < 3; ++r) add(0x70000000 + r * pitch, 0xC0000000 + r * pitch, page, 2 * page);  // stride 2 pages
  add(0x70000000 + 3 * pitch, 0xC0000000 + 3 * pitch, 0, 2 * page);  // a zero-byte region ends that ladder too
  for (int r = 4; r < 7; ++r) add(0x70000000 + r * pitch, 0xC0000000 + r * pitch, page, 2 * page);
  auto m = region_ladders(md, ms, SIZE_MAX);
  std::vector<size_t> counts;
  for (const auto& x : m) counts.push_back(x.count);
  EXPECT_EQ(counts, (std::vector<size_t>{4, 1, 3, 1, 3, 1, 3}));
  // Bases that step down, or pitches under a page (overlapping rows): alone.
  PageSide down_d, down_s, close_d, close_s;
  for (int r = 0; r < 4; ++r) {
    down_d.regions.push_back(PageRegion{0x50000000 - r * pitch, page, page, pages, 1});
    down_s.regions.push_back(PageRegion{0x90000000 - r * pitch, page, page, pages, 1});
    close_d.regions.push_back(PageRegion{0x50000000 + r * (page / 2), 4 * page, page / 2 + 1, 8, 1});
    close_s.regions.push_back(PageRegion{0x90000000 + r * pitch, 4 * page, page / 2 + 1, 8, 1});
  }
  EXPECT_EQ(region_ladders(down_d, down_s, SIZE_MAX).size(), 4u);
  EXPECT_EQ(region_ladders(close_d, close_s, SIZE_MAX).size(), 4u);
  // Adjacent at one stride but in separate allocations (or allocations not
  // known): the driver would refuse the rows, so they stay apart.
  auto split = side(0x10000000, page, page, pages, 6), split_src = side(0x90000000, page, page, pages, 6);
  for (size_t r = 3; r < 6; ++r) split.regions[r].allocation = split.regions[3].base;
  std::vector<size_t> split_counts;
  for (const auto& x : region_ladders(split, split_src, SIZE_MAX)) split_counts.push_back(x.count);
  EXPECT_EQ(split_counts, (std::vector<size_t>{3, 3}));
  // The source side's allocation changing halfway ends a ladder as well.
  auto whole = side(0x10000000, page, page, pages, 6), src_split = side(0x90000000, page, page, pages, 6);
  for (size_t r = 2; r < 6; ++r) src_split.regions[r].allocation = src_split.regions[2].base;
  std::vector<size_t> src_counts;
  for (const auto& x : region_ladders(whole, src_split, SIZE_MAX)) src_counts.push_back(x.count);
  EXPECT_EQ(src_counts, (std::vector<size_t>{1, 1, 4}));
  for (auto& g : split_src.regions) g.allocation = 0;
  EXPECT_EQ(region_ladders(split, split_src, SIZE_MAX).size(), 6u);
}

// Pages wider than the row limit go as one plain copy per region; a run of
// narrow pages past it likewise; narrow single pages as one pitched copy.
TEST(PagePlan, RowsWiderThanTheLimitGoAsPlainCopies) {
  const size_t page = 4096, pages = 32;
  auto dst = side(0x10000000, page, page, pages, 8), src = side(0x90000000, page, page, pages, 8);
  std::vector<int64_t> d{3, 4, 10}, s{7, 8, 20};  // a run of two, then one page
  auto narrow = plan_page_rows(dst, src, ids(d), ids(s), true, SIZE_MAX, page);
  ASSERT_EQ(narrow.size(), 9u);  // the one page as a pitched copy, then the run of two as 8 plain copies of 8 KB
  EXPECT_EQ(narrow[0].rows, 8u);
  for (size_t i = 1; i < 9; ++i) {
    EXPECT_EQ(narrow[i].rows, 1u);
    EXPECT_EQ(narrow[i].width, 2 * page);
  }
  auto wide = plan_page_rows(dst, src, ids(d), ids(s), true, SIZE_MAX, 2 * page);
  ASSERT_EQ(wide.size(), 2u);
  EXPECT_EQ(wide[0].rows, 8u);
  EXPECT_EQ(wide[0].width, 2 * page);
  EXPECT_EQ(plan_page_rows(dst, src, ids(d), ids(s), true, SIZE_MAX, 0).size(), 16u);  // 0: none pitched
  // Pages wider than the limit: plain copies tensor by tensor (every copy of
  // tensor 0, then of tensor 1, ...), as without pitched copies.
  std::vector<int64_t> d2{9, 2, 30, 17}, s2{1, 5, 3, 20};
  auto plain = plan_page_rows(dst, src, ids(d2), ids(s2), true, SIZE_MAX, page / 2);
  auto flat = plan_page_copies(dst, src, ids(d2), ids(s2), true);
  ASSERT_EQ(plain.size(), flat.size());
  for (size_t i = 0; i < flat.size(); ++i) {
    EXPECT_EQ(plain[i].rows, 1u);
    EXPECT_EQ(plain[i].dst, flat[i].dst) << i;
    EXPECT_EQ(plain[i].src, flat[i].src) << i;
  }
}

// Pitched copies only where asked, on strategies that take them, with
// regions enough for a ladder, between host and GPU.
TEST(PagePlan, PitchedCopiesOnlyWhereTheyRunOnCopyEngines) {
  EXPECT_TRUE(pitch_possible(true, std::nullopt, 64));  // auto
  EXPECT_TRUE(pitch_possible(true, PageStrategy::kBatched, 64));
  EXPECT_TRUE(pitch_possible(true, PageStrategy::kStreams, kMinPitchedRows));
  EXPECT_FALSE(pitch_possible(true, PageStrategy::kPerPage, 64));  // the baseline
  EXPECT_FALSE(pitch_possible(true, PageStrategy::kKernel, 64));
  EXPECT_FALSE(pitch_possible(false, PageStrategy::kBatched, 64));
  EXPECT_FALSE(pitch_possible(true, std::nullopt, kMinPitchedRows - 1));  // no ladder: one tensor a side, or two
  EXPECT_FALSE(pitch_possible(true, PageStrategy::kBatched, 1));
  EXPECT_TRUE(pitch_direction(Direction::kHostToDevice));
  EXPECT_TRUE(pitch_direction(Direction::kDeviceToHost));
  EXPECT_FALSE(pitch_direction(Direction::kDeviceToDevice));
  EXPECT_FALSE(pitch_direction(Direction::kHostToHost));
}

// Random layouts and requests: the pitched plan moves exactly the bytes of
// the page-by-page reference, each once, its rows never overlap, and runs
// never pass a pitch.
TEST(PagePlan, PitchedPlansMatchAReferenceExpansion) {
  std::mt19937_64 rng(11);
  size_t pitched_seen = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const size_t pages = 1 + rng() % 200, n = rng() % (pages + 1), bytes = 16 * (1 + rng() % 8);
    const int regions = 1 + static_cast<int>(rng() % 9);
    // Stacked on both sides ([regions, pages, page]); the source regions are
    // sometimes only a few pages apart (they overlap, which reading allows,
    // and runs get cut at the pitch).
    const size_t dgap = bytes * (pages + rng() % 3), sgap = bytes * (rng() % 2 ? pages : 2 + rng() % 4);
    auto dst = side(0x10000000, bytes, bytes, pages, regions, dgap);
    auto src = side(0x90000000, bytes, bytes, pages, regions, sgap);
    // Sometimes one side page first ([pages, regions, page]: a page's regions end to end).
    const int page_first = static_cast<int>(rng() % 4);  // 0: neither, 1: dst, 2: src, 3: both
    if (page_first & 1) dst = side(0x10000000, bytes * regions, bytes, pages, regions, bytes);
    if (page_first & 2) src = side(0x90000000, bytes * regions, bytes, pages, regions, bytes);
    if (rng() % 4 == 0) src.regions[rng() % regions].base += 0x4000000;    // one region elsewhere
    if (rng() % 4 == 0) dst.regions[rng() % regions].allocation = 0x1234;  // one region in an allocation of its own
    std::vector<int64_t> perm(pages);
    for (size_t i = 0; i < pages; ++i) perm[i] = static_cast<int64_t>(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int64_t> d(perm.begin(), perm.begin() + static_cast<long>(n)), s(n);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (size_t i = 0; i < n; ++i) s[i] = rng() % 2 ? perm[i] : d[i];  // sometimes runs on both sides
    if (rng() % 2) {
      std::sort(d.begin(), d.end());
      std::sort(s.begin(), s.end());
      s.erase(std::unique(s.begin(), s.end()), s.end());
      s.resize(n, 0);
    }
    const size_t max_pitch = rng() % 5 == 0 ? bytes * pages : SIZE_MAX;
    const size_t wide_at = rng() % 4;  // 0: every page wider than max_width
    const size_t max_width = wide_at == 0 ? bytes / 2 : wide_at == 1 ? bytes * (1 + rng() % 3) : SIZE_MAX;
    const bool merge = rng() % 4 != 0;
    auto copies = plan_page_rows(dst, src, ids(d), ids(s), merge, max_pitch, max_width);
    std::map<uintptr_t, uintptr_t> got;
    size_t moved = 0, rows = 0;
    for (const auto& c : copies) rows += c.rows;
    EXPECT_EQ(count_page_rows(dst, src, ids(d), ids(s), merge, max_pitch, max_width), rows) << "trial " << trial;
    // Planned again after counting validated (what auto does): the same copies.
    const auto again = plan_page_rows(dst, src, ids(d), ids(s), merge, max_pitch, max_width, /*validated=*/true);
    ASSERT_EQ(again.size(), copies.size()) << "trial " << trial;
    for (size_t i = 0; i < copies.size(); ++i)
      ASSERT_TRUE(again[i].dst == copies[i].dst && again[i].src == copies[i].src && again[i].width == copies[i].width &&
                  again[i].rows == copies[i].rows)
          << "trial " << trial << ", copy " << i;
    for (const auto& c : copies) {
      if (c.rows > 1) {
        ++pitched_seen;
        EXPECT_GE(c.dst_pitch, c.width);
        EXPECT_GE(c.src_pitch, c.width);
        EXPECT_LE(c.dst_pitch, max_pitch);
        EXPECT_LE(c.src_pitch, max_pitch);
        EXPECT_FALSE(c.width == c.dst_pitch && c.width == c.src_pitch) << "one span on both sides: a plain copy";
        if (c.width > max_width)  // wider than the limit only one page end to end on one side
          EXPECT_TRUE(c.width == bytes && (c.width == c.dst_pitch || c.width == c.src_pitch));
      }
      moved += c.bytes();
    }
    for (auto [db, sb] : expand(copies, 16)) EXPECT_TRUE(got.emplace(db, sb).second) << "a byte written twice";
    ASSERT_EQ(got, reference_pairs(dst, src, d, s, bytes)) << "trial " << trial;
    EXPECT_EQ(moved, n * regions * bytes);
  }
  EXPECT_GT(pitched_seen, 100u) << "the random layouts must exercise pitched copies";
}

// Rows wider than max_width go plain, unless they lie end to end on one
// side (page first there): then one pitched copy per page at any width.
TEST(PagePlan, WideRowsEndToEndOnOneSideStayPitched) {
  const size_t bytes = 32 << 10, pages = 8;
  const int regions = 6;
  const auto gpu = side(0x10000000, bytes, bytes, pages, regions);                          // [regions, pages, page]
  const auto host_first = side(0x90000000, bytes * regions, bytes, pages, regions, bytes);  // [pages, regions, page]
  const auto host_stacked = side(0x90000000, bytes, bytes, pages, regions);
  std::vector<int64_t> d{5, 2, 7}, s{1, 6, 3};
  for (bool fetch : {true, false}) {
    auto copies = fetch ? plan_page_rows(gpu, host_first, ids(d), ids(s), true, SIZE_MAX, 8192)
                        : plan_page_rows(host_first, gpu, ids(s), ids(d), true, SIZE_MAX, 8192);
    ASSERT_EQ(copies.size(), 3u) << "fetch " << fetch;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(copies[i].rows, static_cast<size_t>(regions));
      EXPECT_EQ(copies[i].width, bytes);
      const auto& c = copies[i];
      const uintptr_t host = fetch ? reinterpret_cast<uintptr_t>(c.src) : reinterpret_cast<uintptr_t>(c.dst);
      EXPECT_EQ(host, 0x90000000u + static_cast<uintptr_t>(s[i] * bytes * regions));
      EXPECT_EQ(fetch ? c.src_pitch : c.dst_pitch, bytes);
      EXPECT_EQ(fetch ? c.dst_pitch : c.src_pitch, bytes * pages);
    }
  }
  // Stacked on both sides: rows apart on both, so plain copies, region by region.
  auto plain = plan_page_rows(gpu, host_stacked, ids(d), ids(s), true, SIZE_MAX, 8192);
  ASSERT_EQ(plain.size(), 3u * regions);
  for (const auto& c : plain) EXPECT_EQ(c.rows, 1u);
  // Narrow rows go pitched either way.
  EXPECT_EQ(plan_page_rows(gpu, host_stacked, ids(d), ids(s), true, SIZE_MAX, bytes).size(), 3u);
  // Page first on both sides: each page one span, one plain copy.
  const auto gpu_first = side(0x10000000, bytes * regions, bytes, pages, regions, bytes);
  auto spans = plan_page_rows(gpu_first, host_first, ids(d), ids(s), true, SIZE_MAX, 8192);
  ASSERT_EQ(spans.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(spans[i].rows, 1u);
    EXPECT_EQ(spans[i].width, bytes * regions);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(spans[i].dst), 0x10000000u + static_cast<uintptr_t>(d[i] * bytes * regions));
  }
  // Stacked both sides, a run of pages filling both pitches (whole regions
  // in order): one span too; a run filling one pitch only stays plain per
  // region when wider than the limit.
  const auto small = side(0x20000000, bytes, bytes, 4, regions),
             small_host = side(0xa0000000, bytes, bytes, 4, regions);
  std::vector<int64_t> all{0, 1, 2, 3};
  auto whole = plan_page_rows(small, small_host, ids(all), ids(all), true, SIZE_MAX, 8192);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].width, 4 * bytes * regions);
  auto part = plan_page_rows(small, host_stacked, ids(all), ids(all), true, SIZE_MAX, 8192);
  ASSERT_EQ(part.size(), static_cast<size_t>(regions));  // 4 pages fill the GPU's pitch only: plain, region by region
  for (const auto& c : part) EXPECT_EQ(c.rows, 1u);
}

// What a prepared transfer holds in its stream's queue: host calls.
TEST(PagePlan, SubmissionCallsCountHostCalls) {
  char d[64], s[64];
  auto pc = [&](size_t width, size_t rows) { return PitchedCopy{d, s, width, rows, 4096, 4096}; };
  const std::vector<PitchedCopy> copies = {pc(16, 48), pc(16, 1), pc(16, 1), pc(16, 3), pc(0, 5), pc(16, 1)};
  EXPECT_EQ(submission_calls(copies, false, 32), 3u);  // two pitched copies, one batched call of three
  EXPECT_EQ(submission_calls(copies, false, 2), 4u);   // three plain copies in calls of two
  EXPECT_EQ(submission_calls(copies, false, 0), 5u);   // no batching: one call each
  EXPECT_EQ(submission_calls(copies, true, 32), 54u);  // per page: every row (48 + 1 + 1 + 3 + 1), empty ones none
  EXPECT_EQ(submission_calls({}, false, 32), 0u);
  std::vector<PitchedCopy> plain(16384, pc(16, 1));
  EXPECT_EQ(submission_calls(plain, false, 32), 512u);
}

TEST(PageSelect, TableThenDefault) {
  std::vector<PageRule> rules = {
      {Direction::kHostToDevice, 16 << 10, SIZE_MAX, PageStrategy::kKernel, PageStrategy::kStreams},
      {Direction::kHostToDevice, SIZE_MAX, 64, PageStrategy::kPerPage, PageStrategy::kPerPage},
  };
  EXPECT_EQ(select_page_strategy(rules, Direction::kHostToDevice, 100, 100 * 4096, false), PageStrategy::kKernel);
  EXPECT_EQ(select_page_strategy(rules, Direction::kHostToDevice, 100, 100 * 4096, true), PageStrategy::kStreams);
  EXPECT_EQ(select_page_strategy(rules, Direction::kHostToDevice, 10, 10 << 20, false), PageStrategy::kPerPage);
  // No rule for 1000 copies of 1 MiB: the default (batched for large copies).
  EXPECT_EQ(select_page_strategy(rules, Direction::kHostToDevice, 1000, size_t{1000} << 20, false),
            PageStrategy::kBatched);
  // The default never hands zero_sm a kernel.
  for (auto d : {Direction::kHostToDevice, Direction::kDeviceToHost, Direction::kDeviceToDevice})
    for (size_t b : {size_t{64}, size_t{4096}, size_t{1} << 22})
      EXPECT_FALSE(uses_sm(select_page_strategy({}, d, 10, 10 * b, true)));
}

// Batched submission is refused on the legacy default stream: there the
// copy-engine strategies run on ferry's own stream, joined by events.
TEST(PageSelect, LegacyDefaultStreamMovesBatchedCopiesToOwnStream) {
  EXPECT_TRUE(runs_on_own_stream(PageStrategy::kBatched, true));
  EXPECT_TRUE(runs_on_own_stream(PageStrategy::kStreams, true));
  EXPECT_FALSE(runs_on_own_stream(PageStrategy::kPerPage, true));  // the baseline stays what it is
  EXPECT_FALSE(runs_on_own_stream(PageStrategy::kKernel, true));   // a launch is fine there
  for (auto s : {PageStrategy::kPerPage, PageStrategy::kBatched, PageStrategy::kStreams, PageStrategy::kKernel})
    EXPECT_FALSE(runs_on_own_stream(s, false));
}

TEST(PageSelect, JsonTablesAreCheckedByField) {
  auto t = page_table_from_json(
      R"({"gpu": "H100", "rules": [{"direction": "d2h", "max_copy_bytes": 65536, "max_copies": null,
          "strategy": "kernel", "zero_sm": "batched"}]})",
      "t.json");
  EXPECT_EQ(t.gpu, "H100");
  ASSERT_EQ(t.rules.size(), 1u);
  EXPECT_EQ(t.rules[0].direction, Direction::kDeviceToHost);
  EXPECT_EQ(t.rules[0].max_copy_bytes, 65536u);
  EXPECT_EQ(t.rules[0].max_copies, SIZE_MAX);
  auto bad = [](const char* text) { return error_of([&] { page_table_from_json(text, "t.json"); }); };
  EXPECT_NE(
      bad(R"({"rules": [{"direction": "up", "strategy": "kernel", "zero_sm": "batched"}]})").find("rules[0].direction"),
      std::string::npos);
  EXPECT_NE(
      bad(R"({"rules": [{"direction": "h2d", "strategy": "kernel", "zero_sm": "kernel"}]})").find("launches a kernel"),
      std::string::npos);
  EXPECT_NE(bad(R"({"rules": [{"direction": "h2d", "strategy": "fast", "zero_sm": "batched"}]})").find("'fast'"),
            std::string::npos);
  EXPECT_NE(bad(R"({"rules": [{"direction": "h2d", "max_copies": -1, "strategy": "kernel", "zero_sm": "batched"}]})")
                .find("max_copies"),
            std::string::npos);
  // A misspelt bound would make the rule match every size; a gpu that is no string would match no GPU.
  EXPECT_NE(
      bad(R"({"rules": [{"direction": "h2d", "max_copy_byte": 8192, "strategy": "kernel", "zero_sm": "batched"}]})")
          .find("rules[0].max_copy_byte is not a rule's field"),
      std::string::npos);
  EXPECT_NE(bad(R"({"gpu": 200, "rules": []})").find("\"gpu\" must be a string"), std::string::npos);
  EXPECT_NE(bad(R"([1, 2])").find("expected an object"), std::string::npos);
}

TEST(PageSelect, StartupTableFromKnobShippedOrDefault) {
  std::vector<PageTable> shipped = {PageTable{
      "H200", {{Direction::kHostToDevice, SIZE_MAX, SIZE_MAX, PageStrategy::kStreams, PageStrategy::kStreams}}}};
  auto none = [](const std::string&) { return std::optional<std::string>(); };
  auto file = [](const std::string&) {
    return std::optional<std::string>(
        R"({"rules": [{"direction": "h2d", "strategy": "per_page", "zero_sm": "per_page"}]})");
  };
  EXPECT_EQ(startup_page_rules(shipped, "NVIDIA H200", "", none)[0].strategy, PageStrategy::kStreams);
  EXPECT_EQ(startup_page_rules(shipped, "NVIDIA H100 80GB HBM3", "", none).size(), default_page_rules().size());
  EXPECT_EQ(startup_page_rules(shipped, "NVIDIA H200", "/t.json", file)[0].strategy, PageStrategy::kPerPage);
  EXPECT_NE(error_of([&] { startup_page_rules(shipped, "NVIDIA H200", "/nope.json", none); }).find("FERRY_KV_TUNING"),
            std::string::npos);
}

TEST(PageSelect, ShippedTablesParseAndNeverGiveZeroSmAKernel) {
  const auto& tables = shipped_page_tables();
  ASSERT_FALSE(tables.empty());
  for (const auto& t : tables) {
    EXPECT_FALSE(t.gpu.empty());
    ASSERT_FALSE(t.rules.empty());
    for (const auto& r : t.rules) EXPECT_FALSE(uses_sm(r.zero_sm));
  }
  // The H200 table answers every direction it was measured in.
  auto rules =
      startup_page_rules(tables, "NVIDIA H200", "", [](const std::string&) { return std::optional<std::string>(); });
  EXPECT_EQ(rules.size(), tables[0].rules.size());
}

TEST(PageKernelWork, UnitsAndBoundsOverRegions) {
  auto dst = side(0x100000, 4096, 4096, 10, 3), src = side(0x900000, 4096, 4096, 20, 3);
  dst.regions[1].bytes = src.regions[1].bytes = 0;  // a region with nothing to copy
  std::vector<KernelRegion> regions(3);
  for (size_t r = 0; r < 3; ++r)
    regions[r] = KernelRegion{src.regions[r].base, dst.regions[r].base, 4096, 4096, dst.regions[r].bytes, 0};
  KernelWork w = plan_kernel_work(regions, dst, src, 1024);
  EXPECT_EQ(w.units_per_page, 8u);  // 4 + 0 + 4
  EXPECT_EQ(regions[0].first_unit, 0u);
  EXPECT_EQ(regions[1].first_unit, 4u);
  EXPECT_EQ(regions[2].first_unit, 4u);  // the empty region takes no unit
  EXPECT_TRUE(w.vec16);
  EXPECT_EQ(w.dst_pages, 10u);
  EXPECT_EQ(w.src_pages, 20u);
  // A chunk of 1000 bytes would start units off 16-byte boundaries.
  EXPECT_FALSE(plan_kernel_work(regions, dst, src, 1000).vec16);
  EXPECT_EQ(plan_kernel_work(regions, dst, src, 1000).units_per_page, 10u);  // 5 + 5
  // A page size that is no multiple of 16 too.
  regions[0].bytes = 4095;
  EXPECT_FALSE(plan_kernel_work(regions, dst, src, 1024).vec16);
  EXPECT_NE(error_of([&] { plan_kernel_work(regions, dst, src, 0); }).find("kernel_chunk"), std::string::npos);
}

TEST(PageKernelWork, BlocksFollowTheRequestOrTheWork) {
  EXPECT_EQ(kernel_blocks(1000, 512, 7, 16, 132), 7);   // asked for
  EXPECT_EQ(kernel_blocks(1000, 512, 0, 16, 132), 16);  // capped
  EXPECT_EQ(kernel_blocks(20, 512, 0, 16, 132), 2);     // one task per warp: 16 warps a block
  EXPECT_EQ(kernel_blocks(1000, 512, 0, 16, 8), 8);     // fewer SMs than the cap
  EXPECT_EQ(kernel_blocks(0, 512, 0, 16, 132), 1);
}

TEST(PageBatchSize, InlineFetchesOfFewCopiesInAtLeastFourCallsOfAtLeastEight) {
  auto rows = [](size_t singles, size_t pitched, size_t empty) {
    std::vector<PitchedCopy> v;
    static char buf[1];
    for (size_t i = 0; i < singles; ++i) v.push_back(PitchedCopy{buf, buf, 4096});
    for (size_t i = 0; i < pitched; ++i) v.push_back(PitchedCopy{buf, buf, 4096, 3, 8192, 8192});
    for (size_t i = 0; i < empty; ++i) v.push_back(PitchedCopy{buf, buf, 0});
    return v;
  };
  const auto h2d = Direction::kHostToDevice;
  EXPECT_EQ(page_batch_size(h2d, true, rows(64, 0, 0), 32), 16u);   // 4 calls, not 2
  EXPECT_EQ(page_batch_size(h2d, true, rows(100, 0, 0), 32), 25u);  // 4 calls
  EXPECT_EQ(page_batch_size(h2d, true, rows(128, 0, 0), 32), 32u);  // from 4 x the bound: the bound
  EXPECT_EQ(page_batch_size(h2d, true, rows(4096, 0, 0), 32), 32u);
  EXPECT_EQ(page_batch_size(h2d, true, rows(20, 0, 0), 32), 8u);  // 3 calls of at most 8
  EXPECT_EQ(page_batch_size(h2d, true, rows(0, 0, 0), 32), 8u);
  EXPECT_EQ(page_batch_size(h2d, true, rows(64, 0, 0), 4), 4u);  // never over the bound
  EXPECT_EQ(page_batch_size(h2d, true, rows(64, 0, 0), 1), 1u);  // batching off
  // Only the single rows ride in batched calls: pitched and empty copies do not count.
  EXPECT_EQ(page_batch_size(h2d, true, rows(64, 200, 300), 32), 16u);
  // Saves, and anything submitted ahead of its trigger, keep the bound.
  EXPECT_EQ(page_batch_size(Direction::kDeviceToHost, true, rows(64, 0, 0), 32), 32u);
  EXPECT_EQ(page_batch_size(Direction::kDeviceToDevice, true, rows(64, 0, 0), 32), 32u);
  EXPECT_EQ(page_batch_size(h2d, false, rows(64, 0, 0), 32), 32u);
  EXPECT_NE(error_of([&] { page_batch_size(h2d, true, rows(64, 0, 0), 0); }).find("batch_max"), std::string::npos);
}

// A prepared transfer armed again before earlier triggers landed: the runs
// from the oldest shut gate on count (later ones queue behind it), and a new
// run waits only where they and it would pass what the queue takes.
TEST(PagePlan, RearmingCountsRunsFromTheOldestShutGateAndWaitsOnlyPastTheQueue) {
  using ferry::xfer::rearm_must_wait;
  using ferry::xfer::runs_behind_a_shut_gate;
  EXPECT_EQ(runs_behind_a_shut_gate(0, {}), 0u);
  EXPECT_EQ(runs_behind_a_shut_gate(5, {}), 0u);      // every trigger landed
  EXPECT_EQ(runs_behind_a_shut_gate(5, {4}), 1u);     // the last run's gate
  EXPECT_EQ(runs_behind_a_shut_gate(5, {2}), 3u);     // runs 3 and 4 (opened) queue behind run 2
  EXPECT_EQ(runs_behind_a_shut_gate(5, {3, 1}), 4u);  // from the oldest
  EXPECT_FALSE(rearm_must_wait(0, 2000, 960));        // nothing behind: a run's own bound is prepare()'s
  EXPECT_FALSE(rearm_must_wait(1, 480, 960));         // 960 in all
  EXPECT_TRUE(rearm_must_wait(1, 481, 960));
  EXPECT_TRUE(rearm_must_wait(3, 300, 960));
}
