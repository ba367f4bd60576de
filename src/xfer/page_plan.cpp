#include "xfer/page_plan.hpp"

#include <algorithm>

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
}

size_t min_pages(const PageSide& s) {
  size_t n = SIZE_MAX;
  for (const auto& g : s.regions) n = std::min(n, g.pages);
  return s.regions.empty() ? 0 : n;
}

bool ranges_overlap(const PageRegion& a, const PageRegion& b) {
  if (a.bytes == 0 || b.bytes == 0 || a.pages == 0 || b.pages == 0) return false;
  uintptr_t a_end = a.base + (a.pages - 1) * a.stride + a.bytes;
  uintptr_t b_end = b.base + (b.pages - 1) * b.stride + b.bytes;
  return a.base < b_end && b.base < a_end;
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

// Bits of destination pages seen in the current check; cleared after use so
// that each call costs O(count), not O(pages).
thread_local std::vector<uint64_t> t_seen;

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
  // Duplicate destinations, and (where a side is the same memory as the other)
  // a page that is both read and written by the same call.
  bool same_memory = false;
  for (size_t r = 0; r < dst.regions.size(); ++r) {
    const auto &a = dst.regions[r], &b = src.regions[r];
    if (!ranges_overlap(a, b)) continue;
    FERRY_ARG_CHECK(a.base == b.base && a.stride == b.stride,
                    name("dst", r) + " and " + name("src", r) +
                        " overlap in memory with different page layouts; copies between them would race");
    same_memory = true;
  }
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
  if (error.empty() && same_memory) {
    for (size_t i = 0; i < n; ++i) {
      uint64_t s = static_cast<uint64_t>(src_ids.at(i));
      if (s < dst_pages && (seen[s / 64] >> (s % 64) & 1)) {
        error = "src_ids[" + std::to_string(i) + "] = " + std::to_string(s) +
                " is also a destination page of the same tensor; a page read and written by one call would race";
        break;
      }
    }
  }
  for (size_t i = 0; i < marked; ++i) seen[static_cast<uint64_t>(dst_ids.at(i)) / 64] = 0;
  if (!error.empty()) throw_error(FERRY_ERROR_INVALID_ARGUMENT, error);
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
                                        const PageIds& src_ids, bool merge, size_t max_pitch, size_t max_width) {
  check_sides(dst, src);
  check_ids(dst, src, dst_ids, src_ids);
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

bool pitch_possible(bool asked, std::optional<PageStrategy> strategy) {
  return asked && strategy != PageStrategy::kPerPage && strategy != PageStrategy::kKernel;
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

}  // namespace xfer
}  // namespace ferry
