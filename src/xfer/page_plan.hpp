// Paged KV-cache transfers, the pure part: what a request to copy pages by
// index means in copies, and whether it is valid. No CUDA call here; tested on
// the CPU (tests/cpu/test_page_plan.cpp).
//
// A side of a transfer (source or destination) is a list of regions that share
// one page mapping: region r holds page p at base + p * stride, `bytes` long
// and contiguous. One tensor whose first dimension is the page is one region;
// a list of per-layer (or per-K/V) tensors is one region each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dma/batch_plan.hpp"

namespace ferry {
namespace xfer {

struct PageRegion {
  uintptr_t base = 0;
  size_t stride = 0;  // bytes from one page to the next
  size_t bytes = 0;   // bytes of one page
  size_t pages = 0;   // valid page indices are [0, pages)
  // Where the allocation holding the region starts (0: not known). The rows
  // of a pitched copy must lie in one allocation: the driver refuses rows
  // that cross into the next, even when the two happen to be adjacent.
  uintptr_t allocation = 0;
};

struct PageSide {
  std::vector<PageRegion> regions;
};

// Index lists as the caller gives them: int32 or int64, host memory.
struct PageIds {
  const void* data = nullptr;
  size_t count = 0;
  bool is_64 = true;
  int64_t at(size_t i) const {
    return is_64 ? static_cast<const int64_t*>(data)[i] : static_cast<const int32_t*>(data)[i];
  }
};

// Checks that the two sides match (same number of regions, same bytes per page
// at each position) and that every region is well-formed. Throws
// FERRY_ERROR_INVALID_ARGUMENT naming `dst[r]` or `src[r]`.
void check_sides(const PageSide& dst, const PageSide& src);

// Checks the index lists against the sides: equal lengths, every index in
// range and non-negative, no destination page twice, and no memory that the
// call writes through one page and also writes or reads through another (of
// any two regions: the same tensor on both sides, a tensor given twice, views
// that overlap); copies would race on it. Throws naming `dst_ids[i]` /
// `src_ids[i]` or the regions.
void check_ids(const PageSide& dst, const PageSide& src, const PageIds& dst_ids, const PageIds& src_ids);

// What can be checked without the index lists (lists in GPU memory): no two
// regions whose pages can share memory where one is written, except a
// destination and a source of the same layout (one tensor on both sides),
// where only the lists tell. Throws naming the regions.
void check_layouts(const PageSide& dst, const PageSide& src);

// The copies for a request, region by region, in index order. With `merge`,
// consecutive pairs whose source and destination pages both follow each other
// in memory become one copy (runs of adjacent pages are common: a prefix
// saved in one go lands on consecutive pages). Validates first.
std::vector<Copy> plan_page_copies(const PageSide& dst, const PageSide& src, const PageIds& dst_ids,
                                   const PageIds& src_ids, bool merge);

// Regions [first, first + count) whose pages a pitched copy can take as its
// rows: on each side one known allocation, the same page bytes and page
// strides, and bases that step by `dst_pitch` on the destination side and
// `src_pitch` on the source side from one region to the next. A layout that
// keeps every layer's K and V in one allocation ([regions, pages, ...] on
// each side, in the same region order) is one ladder.
struct RegionLadder {
  size_t first = 0, count = 1;
  size_t dst_pitch = 0, src_pitch = 0;
};

// Fewer rows than this go as plain copies: one cudaMemcpy2DAsync costs the
// host about as much as two or three copies of a batched call (1.6-2.5 us
// against 0.5-0.9 on an H200 host, bench/probes/pitched_pages.cu).
constexpr size_t kMinPitchedRows = 3;

// The sides' regions cut into ladders, in order, greedily: each ladder as
// long as it goes, with both pitches at least the page bytes (rows must not
// overlap) and at most `max_pitch` (the GPU's limit for a pitched copy);
// ladders shorter than kMinPitchedRows are single regions. `max_pitch` 0:
// every region alone.
std::vector<RegionLadder> region_ladders(const PageSide& dst, const PageSide& src, size_t max_pitch);

// The copies for a request, ladder by ladder, in index order: one pitched
// copy per page (or run of pages, with `merge`) of a ladder, a plain copy
// (one row) per page of a single region. A run is cut where its width would
// pass a pitch; a page or run wider than `max_width` goes as one plain copy
// per region, after the ladder's pitched copies, region by region (a copy
// engine moved 32 KB rows of pitched copies at 33 GB/s, where plain copies
// of them, region by region, took 46; at 4 KB rows the pitched copies were
// 4-7 times faster, bench/probes/pitched_pages.cu), unless it is one page
// whose rows lie end to end on one side (pitch = width: a page-first layout
// such as [pages, regions, ...]), where pitched copies of 32 KB rows ran at
// 49. Rows end to end on both sides go as one plain copy of them all.
// `max_pitch` or `max_width` 0: no pitched copies (plan_page_copies's
// copies). Validates first, unless `validated` says count_page_rows did so
// for the same arguments.
std::vector<PitchedCopy> plan_page_rows(const PageSide& dst, const PageSide& src, const PageIds& dst_ids,
                                        const PageIds& src_ids, bool merge, size_t max_pitch, size_t max_width,
                                        bool validated = false);

// The rows of plan_page_rows's copies (a plain copy is one row), without
// making them: what the kernel strategy and `auto` need. A plan holds a copy
// per page and tensor where tensors cannot be pitched: for a kernel call of
// 64 tensors x 1024 pages on an H200 host, planning cost 959 us of the call
// and counting 42 (bench/probes/kv_host_cost.py --pages 1024 --page-bytes 64
// --tensors 64). Validates as the plan does.
size_t count_page_rows(const PageSide& dst, const PageSide& src, const PageIds& dst_ids, const PageIds& src_ids,
                       bool merge, size_t max_pitch, size_t max_width);

// Host calls that submitting `copies` on one stream makes: every row by
// itself with `one_by_one` (the per-page baseline), else one per pitched
// copy and one per `per_batch` plain copies (a batched call). A prepared
// transfer's calls wait in its stream's queue behind the gate, and that queue
// is finite: on an H200 (CUDA 13.0) arming 1024 calls of either kind blocked
// the host until the gate opened, 512 per-copy calls and 683 pitched ones did
// not, whatever their rows (bench/probes/kv_armed.py).
size_t submission_calls(const std::vector<PitchedCopy>& copies, bool one_by_one, size_t per_batch);

// A prepared transfer armed again before earlier triggers, handed to a
// stream or a kernel, have landed: the runs still on its stream are those
// from the oldest arming whose gate is shut on (later runs queue behind it),
// given `runs` armings so far (numbered from 0) and the arming numbers of
// the gates still shut; 0 where none is.
size_t runs_behind_a_shut_gate(size_t runs, const std::vector<size_t>& shut_gate_runs);
// Whether a new run of `calls` host calls behind `behind` such runs of as
// many must wait for their triggers first: past `queue_ops` the host would
// block inside CUDA until they fire.
bool rearm_must_wait(size_t behind, size_t calls, size_t queue_ops);

// Splits `copies` into at most `parts` contiguous groups of about equal bytes
// (for submission on several streams). Empty groups are dropped.
std::vector<std::pair<size_t, size_t>> split_by_bytes(const std::vector<PitchedCopy>& copies, size_t parts);

// `copies` in order as slices of at most `slice_bytes` each, for a bulk
// transfer submitted a few slices at a time: a copy engine serves host-to-GPU
// copies first in, first out across streams, so a small urgent fetch waits
// behind whatever is queued on it, and no more than that. A pitched copy is
// cut between rows; a row wider than what is left of a slice is cut into
// pieces. Only the last slice is short. `slice_bytes` 0: one slice.
std::vector<std::vector<PitchedCopy>> slice_copies(const std::vector<PitchedCopy>& copies, size_t slice_bytes);

// Bytes moved by a request: pages * sum of region page bytes.
size_t request_bytes(const PageSide& side, size_t pages);

// How the page copies of a request get executed.
enum class PageStrategy {
  kPerPage,  // one cudaMemcpyAsync per copy: the baseline
  kBatched,  // cudaMemcpyBatchAsync in bounded batches, runs merged
  kStreams,  // the batched copies spread over several of ferry's streams
  kKernel,   // an SM kernel gathering the pages (reads pinned host memory in place)
};

const char* strategy_name(PageStrategy s);
// Parses "per_page", "batched", "streams", "kernel"; throws naming `what` otherwise.
PageStrategy parse_strategy(const std::string& name, const char* what);
bool uses_sm(PageStrategy s);
// Whether `s` runs on one of ferry's own streams, joined to the caller's by
// events, rather than on the caller's stream itself: batched copies cannot be
// submitted on the legacy default stream (torch's default stream), where they
// would fall back to one copy-engine call per copy, about 3.3 us each against
// 0.65 batched. The per-page baseline and the kernel stay on the caller's stream.
bool runs_on_own_stream(PageStrategy s, bool legacy_default_stream);

// One region as the kernel sees it: device-usable addresses.
struct KernelRegion {
  uint64_t src = 0, dst = 0;
  uint64_t src_stride = 0, dst_stride = 0;
  uint64_t bytes = 0;       // of one page
  uint64_t first_unit = 0;  // units of the regions before this one, within one page
};

// How the SM strategy splits a request into warp tasks: each page's region is
// cut into `chunk`-byte units. Sets each region's first_unit.
struct KernelWork {
  uint64_t units_per_page = 0;  // over all regions
  bool vec16 = false;           // 16-byte words: every address, stride, page size and chunk a multiple of 16
  uint64_t dst_pages = UINT64_MAX,
           src_pages = UINT64_MAX;  // the bounds a kernel checks lists it reads in place against
};
KernelWork plan_kernel_work(std::vector<KernelRegion>& regions, const PageSide& dst, const PageSide& src,
                            uint64_t chunk);

// Blocks of `threads` for `tasks` warp tasks: `requested` when given, else
// one task per warp at most, bounded by `cap` and the GPU's `sms`.
int kernel_blocks(uint64_t tasks, int threads, int requested, int cap, int sms);

enum class Direction { kHostToDevice, kDeviceToHost, kDeviceToDevice, kHostToHost };
const char* direction_name(Direction d);

// Whether a request may go as pitched copies: asked for, a strategy that
// takes them (the per-page baseline copies every row by itself, the kernel
// reads the regions itself; nullopt is auto, which may pick either), and
// enough regions a side for a ladder (kMinPitchedRows). Where it says no, the
// caller skips looking up the allocations' ranges, which pitched copies need:
// two more driver lookups a side, about a microsecond each.
bool pitch_possible(bool asked, std::optional<PageStrategy> strategy, size_t regions);
// Whether pitched copies run in this direction: between host and GPU only.
// Within a GPU a copy without the batched call's copy-engine hint may run on
// SMs (a 2D copy has no such hint); host to host is no copy engine's work.
bool pitch_direction(Direction d);

// Copies per batched call for the single-row copies in `copies` (pitched
// ones go one call each): an inline fetch (`inline_call`, host to GPU) of few
// copies in calls of a quarter of them, at least 8 a call (so up to 4 calls,
// fewer when there are fewer than 32), so that the copy engine starts on the
// first call while the host submits the rest; everything else in calls of
// `batch_max` (>= 1: FERRY_BATCH_MAX, or 1 where batching is off). On an
// H200, 64 scattered 16 KB pages fetched in calls of 16 landed in 102 us
// against 145 in calls of 32; from 256 pages, and for saves, calls of 16 and
// 32 took about as long (docs/kv.md, after the host-time table). An armed
// transfer's calls are all submitted before its trigger: `inline_call` false.
size_t page_batch_size(Direction d, bool inline_call, const std::vector<PitchedCopy>& copies, size_t batch_max);

}  // namespace xfer
}  // namespace ferry
