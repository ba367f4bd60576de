#include "xfer/page_plan.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "core/error.hpp"

namespace ferry {
namespace xfer {
namespace {

// The index range an out-of-range message names.
std::string valid_range(size_t pages) {
  return pages == 0 ? " (no index is valid)" : " (valid indices 0.." + std::to_string(pages - 1) + ")";
}

std::string name(const char* side, size_t r) { return std::string(side) + "[" + std::to_string(r) + "]"; }

void check_region(const PageRegion& g, const char* side, size_t r) {
  if (g.bytes == 0 || g.pages == 0) return;  // nothing to copy in this region
  FERRY_ARG_CHECK(g.base != 0, name(side, r) + " is a null pointer with " + std::to_string(g.pages) + " pages of " +
                                   std::to_string(g.bytes) + " bytes");
  FERRY_ARG_CHECK(g.pages == 1 || g.stride >= g.bytes,
                  name(side, r) + ": pages overlap (stride " + std::to_string(g.stride) + " bytes < " +
                      std::to_string(g.bytes) + " bytes per page); each page must be contiguous and apart");
  // Its span, (pages - 1) x stride + bytes from base, in addresses (below
  // 2^63 wherever CUDA runs): a span that wrapped would pass every check
  // sized by it and the copies would address memory far outside the region.
  constexpr uint64_t kTop = uint64_t{1} << 63;
  const uint64_t more = g.pages - 1;
  const bool fits = g.bytes <= kTop && (more == 0 || g.stride <= (kTop - g.bytes) / more) &&
                    g.base <= kTop - (more * g.stride + g.bytes);
  FERRY_ARG_CHECK(fits, name(side, r) + ": " + std::to_string(g.pages) + " pages " + std::to_string(g.stride) +
                            " bytes apart from address " + std::to_string(g.base) +
                            " run past the address space (2^63)");
}

size_t min_pages(const PageSide& s) {
  size_t n = SIZE_MAX;
  for (const auto& g : s.regions) n = std::min(n, g.pages);
  return s.regions.empty() ? 0 : n;
}

// One region of a side as the overlap check sees it.
struct Span {
  const PageRegion* g = nullptr;
  size_t r = 0;
  bool dst = false;
  uintptr_t lo = 0, hi = 0;  // its first byte and one past its last page's end
  size_t key = 0;            // its stride; 0 for a region of one page, whose stride means nothing
  size_t off = 0;            // lo % key: where its pages start within a stride
};

int64_t floor_div(int64_t n, int64_t d) {
  const int64_t q = n / d;
  return (n % d != 0 && n < 0) ? q - 1 : q;
}

// The pages of `b` that overlap page `p` of `a`: [first, last], empty where
// first > last. Addresses are below 2^63 on every platform CUDA runs on.
std::pair<int64_t, int64_t> pages_under(const PageRegion& a, int64_t p, const PageRegion& b) {
  const int64_t at = static_cast<int64_t>(a.base + static_cast<uint64_t>(p) * a.stride) - static_cast<int64_t>(b.base);
  const int64_t ab = static_cast<int64_t>(a.bytes), bb = static_cast<int64_t>(b.bytes);
  if (b.pages == 1)
    return at < bb && at + ab > 0 ? std::make_pair(int64_t{0}, int64_t{0}) : std::make_pair(int64_t{1}, int64_t{0});
  const int64_t s = static_cast<int64_t>(b.stride);
  // Page q of b overlaps it where q * s < at + ab and q * s + bb > at.
  const int64_t first = std::max<int64_t>(0, floor_div(at - bb, s) + 1);
  const int64_t last = std::min<int64_t>(static_cast<int64_t>(b.pages) - 1, floor_div(at + ab - 1, s));
  return {first, last};
}

bool marked_bit(const std::vector<uint64_t>& bits, int64_t page) {
  return (bits[static_cast<uint64_t>(page) / 64] >> (static_cast<uint64_t>(page) % 64)) & 1;
}

// Calls pair(a, b) for every two spans whose pages can share memory, at least
// one of them a destination, and some more: every pair that overlaps both in
// address range and within a stride. Regions of one stride are compared by
// their places within a stride where those cover it about twice at most (the
// regions of a page-first pool, interleaved: their ranges all overlap, their
// places within a stride do not, but for the same pool on the other side),
// else by address range (per-layer tensors, a page each stride), so that the
// usual layouts cost a sort, not a comparison of every two regions.
template <class Pair>
void overlapping_spans(std::vector<Span>& spans, Pair&& pair) {
  auto consider = [&](const Span& a, const Span& b) {
    if ((a.dst || b.dst) && a.lo < b.hi && b.lo < a.hi) pair(a, b);
  };
  std::sort(spans.begin(), spans.end(),
            [](const Span& x, const Span& y) { return x.key != y.key ? x.key < y.key : x.lo < y.lo; });
  struct Group {
    size_t begin, end;
    uintptr_t lo, hi;
    bool dst;
  };
  std::vector<Group> groups;
  for (size_t i = 0; i < spans.size();) {
    Group g{i, i, UINTPTR_MAX, 0, false};
    size_t sum = 0;
    for (; g.end < spans.size() && spans[g.end].key == spans[i].key; ++g.end) {
      g.lo = std::min(g.lo, spans[g.end].lo);
      g.hi = std::max(g.hi, spans[g.end].hi);
      g.dst = g.dst || spans[g.end].dst;
      sum += spans[g.end].g->bytes;
    }
    const size_t s = spans[i].key;
    // By place within a stride where the places cover each point of a stride
    // about twice at most (a page-first pool's tensors, on one side or both);
    // else by address (per-layer tensors, whose pages fill every stride).
    if (g.dst && s > 0 && sum <= 2 * s) {
      std::sort(spans.begin() + g.begin, spans.begin() + g.end,
                [](const Span& x, const Span& y) { return x.off < y.off; });
      for (size_t a = g.begin; a < g.end; ++a) {
        const size_t end = spans[a].off + spans[a].g->bytes;
        for (size_t b = a + 1; b < g.end && spans[b].off < end; ++b) consider(spans[a], spans[b]);
        if (end > s)
          for (size_t b = g.begin; b < a && spans[b].off < end - s; ++b) consider(spans[a], spans[b]);
      }
    } else if (g.dst) {
      for (size_t a = g.begin; a < g.end; ++a)
        for (size_t b = a + 1; b < g.end && spans[b].lo < spans[a].hi; ++b) consider(spans[a], spans[b]);
    }
    groups.push_back(g);
    i = g.end;
  }
  for (size_t x = 0; x < groups.size(); ++x)
    for (size_t y = x + 1; y < groups.size(); ++y) {
      const Group &gx = groups[x], &gy = groups[y];
      if (!(gx.dst || gy.dst) || gx.hi <= gy.lo || gy.hi <= gx.lo) continue;
      for (size_t a = gx.begin; a < gx.end; ++a)
        for (size_t b = gy.begin; b < gy.end; ++b) consider(spans[a], spans[b]);
    }
}

std::vector<Span> spans_of(const PageSide& dst, const PageSide& src) {
  std::vector<Span> out;
  out.reserve(dst.regions.size() + src.regions.size());
  for (int side = 0; side < 2; ++side) {
    const PageSide& ps = side == 0 ? dst : src;
    for (size_t r = 0; r < ps.regions.size(); ++r) {
      const PageRegion& g = ps.regions[r];
      if (g.bytes == 0 || g.pages == 0) continue;
      Span sp;
      sp.g = &g;
      sp.r = r;
      sp.dst = side == 0;
      sp.lo = g.base;
      sp.hi = g.base + (g.pages - 1) * g.stride + g.bytes;
      sp.key = g.pages > 1 ? g.stride : 0;
      sp.off = sp.key ? sp.lo % sp.key : 0;
      out.push_back(sp);
    }
  }
  return out;
}

// Two regions of a call whose pages may share memory: destination region
// `a` and region `b` of the destination (b_dst) or the source side.
struct RegionPair {
  size_t a = 0, b = 0;
  bool b_dst = false;
};

bool same_regions(const std::vector<PageRegion>& x, const std::vector<PageRegion>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].base != y[i].base || x[i].stride != y[i].stride || x[i].bytes != y[i].bytes || x[i].pages != y[i].pages)
      return false;
  return true;
}

// The pairs overlapping_spans finds, for the last few sides this thread
// asked about: a server calls with the same caches again and again (a fetch
// and a save are two), and then the check costs a comparison of the regions
// (64 tensors a side, 64 pages: 0.35 us against 3.2-3.4 for a layout not
// seen before on the development host, bench/probes/page_check_cost.cpp).
// The reference holds until this thread's next call: a loop over it must not
// check another transfer.
const std::vector<RegionPair>& candidate_pairs(const PageSide& dst, const PageSide& src) {
  struct Known {
    std::vector<PageRegion> dst, src;
    std::vector<RegionPair> pairs;
  };
  thread_local std::vector<Known> known;
  thread_local size_t next = 0;
  for (const Known& k : known)
    if (same_regions(k.dst, dst.regions) && same_regions(k.src, src.regions)) return k.pairs;
  constexpr size_t kKept = 4;
  Known* slot = nullptr;
  if (known.size() < kKept) {
    known.emplace_back();
    slot = &known.back();
  } else {
    slot = &known[next++ % kKept];
  }
  Known& k = *slot;
  k.dst.clear();  // matches nothing until its pairs are complete
  k.src.clear();
  k.pairs.clear();
  std::vector<Span> spans = spans_of(dst, src);
  overlapping_spans(spans, [&](const Span& x, const Span& y) {
    const Span &a = x.dst ? x : y, &b = x.dst ? y : x;
    k.pairs.push_back(RegionPair{a.r, b.r, b.dst});
  });
  k.dst = dst.regions;
  k.src = src.regions;
  return k.pairs;
}

bool same_layout(const PageRegion& a, const PageRegion& b) {
  return a.base == b.base && a.stride == b.stride && a.bytes == b.bytes;
}

// Whether some page of `a` overlaps some page of `b`, whichever pages the
// index lists name (exact for one stride or a region of one page; any
// overlap of address ranges otherwise).
bool pages_can_meet(const PageRegion& a, const PageRegion& b) {
  if (a.pages == 1) {
    const auto q = pages_under(a, 0, b);
    return q.first <= q.second;
  }
  if (b.pages == 1) return pages_can_meet(b, a);
  if (a.stride != b.stride) return true;
  // Page p of a meets page q of b where (p - q) * s lies in (d - a.bytes, d + b.bytes), d = b.base - a.base.
  const int64_t s = static_cast<int64_t>(a.stride);
  const int64_t d = static_cast<int64_t>(b.base) - static_cast<int64_t>(a.base);
  const int64_t lo =
      std::max<int64_t>(floor_div(d - static_cast<int64_t>(a.bytes), s) + 1, -(static_cast<int64_t>(b.pages) - 1));
  const int64_t hi =
      std::min<int64_t>(floor_div(d + static_cast<int64_t>(b.bytes) - 1, s), static_cast<int64_t>(a.pages) - 1);
  return lo <= hi;
}

std::string index_of(const PageIds& ids, int64_t value) {
  for (size_t i = 0; i < ids.count; ++i)
    if (ids.at(i) == value) return std::to_string(i);
  return "?";
}

// The number of index pairs from i on whose destination and source pages both
// follow page i's, up to `most`: one copy when the pages are contiguous.
size_t run_at(const PageIds& dst_ids, const PageIds& src_ids, size_t i, size_t most) {
  const int64_t di = dst_ids.at(i), si = src_ids.at(i);
  size_t run = 1;
  while (run < most && i + run < dst_ids.count && dst_ids.at(i + run) == di + static_cast<int64_t>(run) &&
         src_ids.at(i + run) == si + static_cast<int64_t>(run))
    ++run;
  return run;
}

// Bits of destination (and, where needed, source) pages seen in the current
// check; cleared after use so that each call costs O(count), not O(pages).
thread_local std::vector<uint64_t> t_seen;
thread_local std::vector<uint64_t> t_src_seen;

// The first way pages of two regions of one call share memory, with the
// index lists: "" where none does. `a` is a destination region, `b` either
// (not a source of the same layout: check_ids takes those pairs at once).
// `dst_pages` / `src_pages`: the sides' fewest pages, which bound their lists'
// indices (and the bits marked).
std::string meeting(const PageSide& dst, const PageSide& src, const RegionPair& pr, const PageIds& dst_ids,
                    const PageIds& src_ids, const std::vector<uint64_t>& dst_seen,
                    const std::vector<uint64_t>& src_seen, size_t dst_pages, size_t src_pages) {
  const PageRegion &ga = dst.regions[pr.a], &gb = (pr.b_dst ? dst : src).regions[pr.b];
  const PageIds& b_ids = pr.b_dst ? dst_ids : src_ids;
  const std::vector<uint64_t>& b_seen = pr.b_dst ? dst_seen : src_seen;
  const size_t b_pages = pr.b_dst ? dst_pages : src_pages;
  // Walk the lists of the side whose pages each meet at most two of the
  // other's: where the other is one page, or a page no longer than the
  // other's stride (of two regions of several pages one is, as each stride
  // is at least its page).
  const bool from_a = gb.pages == 1 || (ga.pages > 1 && ga.bytes <= gb.stride);
  const PageRegion &walk = from_a ? ga : gb, &other = from_a ? gb : ga;
  const PageIds& walk_ids = from_a ? dst_ids : b_ids;
  const std::vector<uint64_t>& other_seen = from_a ? b_seen : dst_seen;
  // A region's pages past its side's fewest are in no list (nor the bits).
  const int64_t other_last = static_cast<int64_t>(from_a ? b_pages : dst_pages) - 1;
  for (size_t i = 0; i < walk_ids.count; ++i) {
    const int64_t p = walk_ids.at(i);
    const auto q = pages_under(walk, p, other);
    for (int64_t o = q.first; o <= std::min(q.second, other_last); ++o) {
      if (!marked_bit(other_seen, o)) continue;
      const int64_t pa = from_a ? p : o, pb = from_a ? o : p;  // a's page, b's page
      const std::string na = name("dst", pr.a), nb = name(pr.b_dst ? "dst" : "src", pr.b);
      if (!pr.b_dst)
        return "src_ids[" + index_of(src_ids, pb) + "] = " + std::to_string(pb) + ": page " + std::to_string(pb) +
               " of " + nb + " shares memory with page " + std::to_string(pa) + " of " + na + " (dst_ids[" +
               index_of(dst_ids, pa) + "]), which the same call writes; a page read and written by one call would race";
      return na + " and " + nb + " share memory: page " + std::to_string(pa) + " of " + na + " (dst_ids[" +
             index_of(dst_ids, pa) + "]) overlaps page " + std::to_string(pb) + " of " + nb + " (dst_ids[" +
             index_of(dst_ids, pb) + "]); two copies would race on it";
    }
  }
  return "";
}

}  // namespace

void check_sides(const PageSide& dst, const PageSide& src) {
  FERRY_ARG_CHECK(!dst.regions.empty(), "dst: no tensors given");
  FERRY_ARG_CHECK(dst.regions.size() == src.regions.size(),
                  "dst has " + std::to_string(dst.regions.size()) + " tensors and src " +
                      std::to_string(src.regions.size()) + "; they must pair up one to one");
  for (size_t r = 0; r < dst.regions.size(); ++r) {
    check_region(dst.regions[r], "dst", r);
    check_region(src.regions[r], "src", r);
    FERRY_ARG_CHECK(dst.regions[r].bytes == src.regions[r].bytes,
                    name("dst", r) + " has pages of " + std::to_string(dst.regions[r].bytes) + " bytes and " +
                        name("src", r) + " of " + std::to_string(src.regions[r].bytes) +
                        "; paired tensors must have equal page sizes (same dtype and page shape)");
  }
}

void check_ids(const PageSide& dst, const PageSide& src, const PageIds& dst_ids, const PageIds& src_ids) {
  FERRY_ARG_CHECK(dst_ids.count == src_ids.count, "dst_ids has " + std::to_string(dst_ids.count) +
                                                      " entries and src_ids " + std::to_string(src_ids.count) +
                                                      "; they must have the same length");
  const size_t n = dst_ids.count;
  if (n == 0) return;
  FERRY_ARG_CHECK(dst_ids.data && src_ids.data, "dst_ids/src_ids: null pointer with a non-zero count");
  const size_t dst_pages = min_pages(dst), src_pages = min_pages(src);
  for (size_t i = 0; i < n; ++i) {
    int64_t d = dst_ids.at(i), s = src_ids.at(i);
    if (d < 0 || static_cast<uint64_t>(d) >= dst_pages)
      throw_error(FERRY_ERROR_INVALID_ARGUMENT, "dst_ids[" + std::to_string(i) + "] = " + std::to_string(d) +
                                                    " is out of range: dst has " + std::to_string(dst_pages) +
                                                    " pages" + valid_range(dst_pages));
    if (s < 0 || static_cast<uint64_t>(s) >= src_pages)
      throw_error(FERRY_ERROR_INVALID_ARGUMENT, "src_ids[" + std::to_string(i) + "] = " + std::to_string(s) +
                                                    " is out of range: src has " + std::to_string(src_pages) +
                                                    " pages" + valid_range(src_pages));
  }
  // Duplicate destinations, then pages of two regions that share memory
  // where one is written: a destination page that is another region's
  // destination page too, or is read by the same call.
  auto& seen = t_seen;
  if (seen.size() < dst_pages / 64 + 1) seen.resize(dst_pages / 64 + 1, 0);
  size_t marked = 0;
  std::string error;
  for (; marked < n; ++marked) {
    uint64_t d = static_cast<uint64_t>(dst_ids.at(marked));
    uint64_t bit = uint64_t{1} << (d % 64);
    if (seen[d / 64] & bit) {
      size_t first = 0;
      while (static_cast<uint64_t>(dst_ids.at(first)) != d) ++first;
      error = "dst_ids has page " + std::to_string(d) + " twice (at " + std::to_string(first) + " and " +
              std::to_string(marked) + "): two copies would race on one destination page";
      break;
    }
    seen[d / 64] |= bit;
  }
  auto& src_seen = t_src_seen;
  bool src_marked = false;
  if (error.empty()) {
    // Pairs of one layout (one tensor on both sides) meet exactly where a
    // source page is a destination page, whichever the pair: checked once.
    bool one_layout_checked = false;
    for (const RegionPair& pr : candidate_pairs(dst, src)) {
      if (!pr.b_dst && same_layout(dst.regions[pr.a], src.regions[pr.b])) {
        if (one_layout_checked) continue;
        one_layout_checked = true;
        for (size_t i = 0; i < n && error.empty(); ++i) {
          const int64_t q = src_ids.at(i);
          if (q < static_cast<int64_t>(dst_pages) && marked_bit(seen, q))
            error = "src_ids[" + std::to_string(i) + "] = " + std::to_string(q) +
                    " is also a destination page of the same tensor; a page read and written by one call would race";
        }
        if (!error.empty()) break;
        continue;
      }
      if (!pr.b_dst && !src_marked) {
        if (src_seen.size() < src_pages / 64 + 1) src_seen.resize(src_pages / 64 + 1, 0);
        for (size_t i = 0; i < n; ++i) {
          const uint64_t q = static_cast<uint64_t>(src_ids.at(i));
          src_seen[q / 64] |= uint64_t{1} << (q % 64);
        }
        src_marked = true;
      }
      error = meeting(dst, src, pr, dst_ids, src_ids, seen, src_seen, dst_pages, src_pages);
      if (!error.empty()) break;
    }
  }
  for (size_t i = 0; i < marked; ++i) seen[static_cast<uint64_t>(dst_ids.at(i)) / 64] = 0;
  if (src_marked)
    for (size_t i = 0; i < n; ++i) src_seen[static_cast<uint64_t>(src_ids.at(i)) / 64] = 0;
  if (!error.empty()) throw_error(FERRY_ERROR_INVALID_ARGUMENT, error);
}

void check_layouts(const PageSide& dst, const PageSide& src) {
  for (const RegionPair& pr : candidate_pairs(dst, src)) {
    const PageRegion &a = dst.regions[pr.a], &b = (pr.b_dst ? dst : src).regions[pr.b];
    if (!pr.b_dst && same_layout(a, b)) continue;  // one tensor: only the lists tell
    if (!pages_can_meet(a, b)) continue;
    const std::string na = name("dst", pr.a), nb = name(pr.b_dst ? "dst" : "src", pr.b);
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                pr.b_dst ? na + " and " + nb +
                               " share memory: a page of one is a page of the other; two copies would "
                               "race on it"
                         : na + " and " + nb +
                               " overlap in memory with different page layouts; copies between them would race");
  }
}

std::vector<Copy> plan_page_copies(const PageSide& dst, const PageSide& src, const PageIds& dst_ids,
                                   const PageIds& src_ids, bool merge) {
  std::vector<Copy> out;
  for (const PitchedCopy& c : plan_page_rows(dst, src, dst_ids, src_ids, merge, 0, 0)) out.push_back(c.row(0));
  return out;
}

std::vector<RegionLadder> region_ladders(const PageSide& dst, const PageSide& src, size_t max_pitch) {
  const auto& D = dst.regions;
  const auto& S = src.regions;
  auto usable = [&](size_t r) {
    return D[r].bytes > 0 && D[r].pages > 0 && S[r].pages > 0 && D[r].allocation != 0 && S[r].allocation != 0;
  };
  // Region r's pages in the same allocations, at the same sizes and strides, as region f's.
  auto alike = [&](size_t f, size_t r) {
    return usable(r) && D[r].allocation == D[f].allocation && S[r].allocation == S[f].allocation &&
           D[r].bytes == D[f].bytes && D[r].stride == D[f].stride && S[r].stride == S[f].stride;
  };
  std::vector<RegionLadder> out;
  for (size_t r = 0; r < D.size();) {
    RegionLadder l{r, 1, 0, 0};
    if (max_pitch > 0 && usable(r) && r + 1 < D.size() && alike(r, r + 1) && D[r + 1].base > D[r].base &&
        S[r + 1].base > S[r].base) {
      const size_t dp = D[r + 1].base - D[r].base, sp = S[r + 1].base - S[r].base;
      if (dp >= D[r].bytes && sp >= D[r].bytes && dp <= max_pitch && sp <= max_pitch) {
        size_t k = 2;
        while (r + k < D.size() && alike(r, r + k) && D[r + k].base == D[r + k - 1].base + dp &&
               S[r + k].base == S[r + k - 1].base + sp)
          ++k;
        if (k >= kMinPitchedRows) l = RegionLadder{r, k, dp, sp};
      }
    }
    out.push_back(l);
    r += l.count;
  }
  return out;
}

std::vector<PitchedCopy> plan_page_rows(const PageSide& dst, const PageSide& src, const PageIds& dst_ids,
                                        const PageIds& src_ids, bool merge, size_t max_pitch, size_t max_width,
                                        bool validated) {
  if (!validated) {
    check_sides(dst, src);
    check_ids(dst, src, dst_ids, src_ids);
  }
  std::vector<PitchedCopy> out;
  const size_t n = dst_ids.count;
  if (n == 0) return out;
  const auto ladders = region_ladders(dst, src, max_width > 0 ? max_pitch : 0);
  out.reserve(n * ladders.size());
  for (const RegionLadder& l : ladders) {
    const PageRegion &d = dst.regions[l.first], &s = src.regions[l.first];
    if (d.bytes == 0) continue;
    // Pages that follow each other in memory only when the stride is the
    // page; a pitched copy's run must also stay within a pitch.
    const bool can_merge = merge && d.stride == d.bytes && s.stride == s.bytes;
    const size_t most = l.count > 1 ? std::min(l.dst_pitch, l.src_pitch) / d.bytes : SIZE_MAX;
    // Runs too wide for a pitched copy: plain copies, tensor by tensor after
    // the ladder's pitched ones. A copy engine took plain copies submitted
    // page by page (each page's tensors in turn) a third slower than tensor
    // by tensor (bench/probes/pitched_pages.cu: 31.5 against 45.8 GB/s).
    // A single page's rows that lie end to end on one side (a page-first
    // layout: a page's tensors one span) stay pitched at any width: the copy
    // engine moved such 32 KB rows at 49 GB/s. Rows end to end on both sides
    // are one span: a plain copy.
    std::vector<PitchedCopy> wide;
    for (size_t i = 0; i < n;) {
      const int64_t di = dst_ids.at(i), si = src_ids.at(i);
      const size_t run = can_merge ? run_at(dst_ids, src_ids, i, most) : 1;
      const PitchedCopy c{reinterpret_cast<void*>(d.base + static_cast<size_t>(di) * d.stride),
                          reinterpret_cast<const void*>(s.base + static_cast<size_t>(si) * s.stride),
                          run * d.bytes,
                          l.count,
                          l.dst_pitch,
                          l.src_pitch};
      const bool dst_span = c.width == c.dst_pitch, src_span = c.width == c.src_pitch;
      if (c.rows > 1 && dst_span && src_span)
        out.push_back(PitchedCopy{c.dst, c.src, c.width * c.rows});
      else if (c.rows > 1 && c.width > max_width && !(run == 1 && (dst_span || src_span)))
        wide.push_back(c);
      else
        out.push_back(c);
      i += run;
    }
    for (size_t r = 0; r < l.count; ++r)
      for (const PitchedCopy& c : wide) out.push_back(PitchedCopy{c.row(r).dst, c.row(r).src, c.width});
  }
  return out;
}

size_t count_page_rows(const PageSide& dst, const PageSide& src, const PageIds& dst_ids, const PageIds& src_ids,
                       bool merge, size_t max_pitch, size_t max_width) {
  check_sides(dst, src);
  check_ids(dst, src, dst_ids, src_ids);
  const size_t n = dst_ids.count;
  if (n == 0) return 0;
  // A region alone gives a row per run, and its runs depend only on whether
  // it can merge: counted once for each answer, not once per region.
  size_t alone[2] = {SIZE_MAX, SIZE_MAX};
  size_t rows = 0;
  for (const RegionLadder& l : region_ladders(dst, src, max_width > 0 ? max_pitch : 0)) {
    const PageRegion &d = dst.regions[l.first], &s = src.regions[l.first];
    if (d.bytes == 0) continue;
    const bool can_merge = merge && d.stride == d.bytes && s.stride == s.bytes;
    if (l.count == 1) {
      size_t& runs = alone[can_merge];
      if (runs == SIZE_MAX) {
        runs = 0;
        for (size_t i = 0; i < n; i += can_merge ? run_at(dst_ids, src_ids, i, SIZE_MAX) : 1) ++runs;
      }
      rows += runs;
      continue;
    }
    // As plan_page_rows: a run's rows, whether pitched or plain region by
    // region, except rows end to end on both sides, which are one copy.
    const size_t most = std::min(l.dst_pitch, l.src_pitch) / d.bytes;
    for (size_t i = 0; i < n;) {
      const size_t run = can_merge ? run_at(dst_ids, src_ids, i, most) : 1;
      const size_t width = run * d.bytes;
      rows += width == l.dst_pitch && width == l.src_pitch ? 1 : l.count;
      i += run;
    }
  }
  return rows;
}

size_t submission_calls(const std::vector<PitchedCopy>& copies, bool one_by_one, size_t per_batch) {
  size_t pitched = 0, single = 0;
  for (const PitchedCopy& c : copies) {
    if (c.width == 0 || c.rows == 0) continue;
    if (one_by_one)
      single += c.rows;
    else if (c.rows > 1)
      ++pitched;
    else
      ++single;
  }
  if (one_by_one) return single;
  return pitched + split_batches(single, std::max<size_t>(1, per_batch)).size();
}

bool pitch_possible(bool asked, std::optional<PageStrategy> strategy, size_t regions) {
  return asked && strategy != PageStrategy::kPerPage && strategy != PageStrategy::kKernel && regions >= kMinPitchedRows;
}

bool pitch_direction(Direction d) { return d == Direction::kHostToDevice || d == Direction::kDeviceToHost; }

std::vector<std::pair<size_t, size_t>> split_by_bytes(const std::vector<PitchedCopy>& copies, size_t parts) {
  std::vector<std::pair<size_t, size_t>> out;
  if (copies.empty() || parts == 0) return out;
  size_t total = 0;
  for (const auto& c : copies) total += c.bytes();
  parts = std::min(parts, copies.size());
  size_t begin = 0, acc = 0;
  for (size_t i = 0; i < copies.size(); ++i) {
    acc += copies[i].bytes();
    // Close a group once it reaches its share of the bytes so far.
    size_t k = out.size() + 1;
    if (k < parts && acc * parts >= total * k) {
      out.emplace_back(begin, i + 1);
      begin = i + 1;
    }
  }
  if (begin < copies.size()) out.emplace_back(begin, copies.size());
  return out;
}

std::vector<std::vector<PitchedCopy>> slice_copies(const std::vector<PitchedCopy>& copies, size_t slice_bytes) {
  std::vector<std::vector<PitchedCopy>> out;
  if (copies.empty()) return out;
  if (slice_bytes == 0) return {copies};
  out.emplace_back();
  size_t room = slice_bytes;
  auto piece = [&](void* dst, const void* src, size_t bytes) {
    for (size_t off = 0; off < bytes;) {
      if (room == 0) {
        out.emplace_back();
        room = slice_bytes;
      }
      const size_t n = std::min(room, bytes - off);
      out.back().push_back(PitchedCopy{static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, n});
      off += n;
      room -= n;
    }
  };
  for (const PitchedCopy& c : copies) {
    if (c.width == 0) continue;
    for (size_t i = 0; i < c.rows;) {
      if (room == 0) {
        out.emplace_back();
        room = slice_bytes;
      }
      const size_t k = std::min(c.rows - i, room / c.width);
      if (k == 0) {  // the row is wider than what is left of this slice
        const Copy r = c.row(i++);
        piece(r.dst, r.src, r.bytes);
        continue;
      }
      PitchedCopy part = c;
      part.dst = static_cast<char*>(c.dst) + i * c.dst_pitch;
      part.src = static_cast<const char*>(c.src) + i * c.src_pitch;
      part.rows = k;
      out.back().push_back(part);
      room -= k * c.width;
      i += k;
    }
  }
  return out;
}

size_t request_bytes(const PageSide& side, size_t pages) {
  size_t b = 0;
  for (const auto& g : side.regions) b += g.bytes;
  return b * pages;
}

KernelWork plan_kernel_work(std::vector<KernelRegion>& regions, const PageSide& dst, const PageSide& src,
                            uint64_t chunk) {
  FERRY_ARG_CHECK(chunk > 0, "kernel_chunk must be positive");
  auto a16 = [](uint64_t v) { return v % 16 == 0; };
  KernelWork w;
  w.vec16 = a16(chunk);  // every unit starts on a 16-byte boundary
  for (size_t r = 0; r < regions.size(); ++r) {
    KernelRegion& g = regions[r];
    g.first_unit = w.units_per_page;
    if (g.bytes == 0) continue;
    w.units_per_page += (g.bytes - 1) / chunk + 1;
    w.vec16 = w.vec16 && a16(g.src) && a16(g.dst) && a16(g.src_stride) && a16(g.dst_stride) && a16(g.bytes);
    w.dst_pages = std::min<uint64_t>(w.dst_pages, dst.regions[r].pages);
    w.src_pages = std::min<uint64_t>(w.src_pages, src.regions[r].pages);
  }
  return w;
}

int kernel_blocks(uint64_t tasks, int threads, int requested, int cap, int sms) {
  if (requested > 0) return requested;
  const uint64_t per_block = static_cast<uint64_t>(std::max(1, threads / 32));
  const uint64_t wanted = std::max<uint64_t>(1, (tasks + per_block - 1) / per_block);
  return static_cast<int>(
      std::min<uint64_t>({wanted, static_cast<uint64_t>(std::max(1, cap)), static_cast<uint64_t>(std::max(1, sms))}));
}

bool runs_on_own_stream(PageStrategy s, bool legacy_default_stream) {
  return legacy_default_stream && (s == PageStrategy::kBatched || s == PageStrategy::kStreams);
}

const char* strategy_name(PageStrategy s) {
  switch (s) {
    case PageStrategy::kPerPage:
      return "per_page";
    case PageStrategy::kBatched:
      return "batched";
    case PageStrategy::kStreams:
      return "streams";
    case PageStrategy::kKernel:
      return "kernel";
  }
  return "?";
}

PageStrategy parse_strategy(const std::string& name, const char* what) {
  for (auto s : {PageStrategy::kPerPage, PageStrategy::kBatched, PageStrategy::kStreams, PageStrategy::kKernel})
    if (name == strategy_name(s)) return s;
  throw_error(FERRY_ERROR_INVALID_ARGUMENT,
              std::string(what) + ": '" + name + "' is not a strategy (per_page, batched, streams, kernel)");
}

bool uses_sm(PageStrategy s) { return s == PageStrategy::kKernel; }

const char* direction_name(Direction d) {
  switch (d) {
    case Direction::kHostToDevice:
      return "h2d";
    case Direction::kDeviceToHost:
      return "d2h";
    case Direction::kDeviceToDevice:
      return "d2d";
    case Direction::kHostToHost:
      return "h2h";
  }
  return "?";
}

size_t page_batch_size(Direction d, bool inline_call, const std::vector<PitchedCopy>& copies, size_t batch_max) {
  FERRY_ARG_CHECK(batch_max >= 1, "batch_max must be at least 1");
  if (!inline_call || d != Direction::kHostToDevice) return batch_max;
  constexpr size_t kCalls = 4, kLeast = 8;
  const auto singles = static_cast<size_t>(
      std::count_if(copies.begin(), copies.end(), [](const PitchedCopy& c) { return c.rows == 1 && c.width > 0; }));
  return std::min(batch_max, std::max(kLeast, (singles + kCalls - 1) / kCalls));
}

size_t runs_behind_a_shut_gate(size_t runs, const std::vector<size_t>& shut_gate_runs) {
  size_t oldest = runs;
  for (size_t r : shut_gate_runs) oldest = std::min(oldest, r);
  return runs - oldest;
}

bool rearm_must_wait(size_t behind, size_t calls, size_t queue_ops) {
  return behind > 0 && (behind + 1) * calls > queue_ops;
}

}  // namespace xfer
}  // namespace ferry
