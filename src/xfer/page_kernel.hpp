// The SM strategy for page transfers: one kernel gathers every page of a
// request, a warp per unit of work (a page's region, cut in chunks), reading
// and writing pinned host memory in place. It exists for users who allow SMs
// and as the comparison the copy engines are measured against; the grid sets
// how many SMs it takes (2 x 1024 threads and 12 blocks are the grids two
// serving engines use).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "xfer/page_plan.hpp"

namespace ferry {
namespace xfer {

struct PageKernelArgs {
  const KernelRegion* regions = nullptr;  // device-readable
  int nregions = 0;
  uint64_t units_per_page = 0;    // sum over regions of ceil(bytes / chunk)
  uint64_t chunk = 0;             // bytes of one unit
  const void* src_ids = nullptr;  // device-readable
  const void* dst_ids = nullptr;
  bool ids_64 = true;
  uint64_t pages = 0;
  bool vec16 = false;  // every address, stride and size is a multiple of 16
  // With `error` set (lists not checked on the host), an entry outside
  // [0, dst_pages) x [0, src_pages) is skipped and 1 + its index stored there
  // (the first one wins).
  unsigned long long* error = nullptr;
  uint64_t dst_pages = 0, src_pages = 0;
  // With `error` set: a bit per destination page that more than one entry
  // names (launch_page_marks); every entry naming such a page is skipped.
  const uint32_t* repeated = nullptr;
};

// What `error` holds for a destination page named twice: this bit, with 1 +
// the index of an entry that named it again.
constexpr unsigned long long kRepeatedDstBit = 1ULL << 62;

// 32-bit words of one bitmap of `dst_pages` pages; launch_page_marks takes
// two such bitmaps, back to back.
inline uint64_t page_mark_words(uint64_t dst_pages) { return (dst_pages + 31) / 32; }

// Before a kernel that reads dst_ids in place: clears `marks` (two bitmaps
// of page_mark_words(dst_pages) words, device memory) and marks in the
// second every destination page that more than one of the `pages` entries
// names, storing kRepeatedDstBit | (1 + entry) in `error` (the first error
// wins). Entries out of range are left to the copy kernel.
void launch_page_marks(const void* dst_ids, bool ids_64, uint64_t pages, uint64_t dst_pages, uint32_t* marks,
                       unsigned long long* error, cudaStream_t stream);

// Most regions the kernel holds in shared memory.
constexpr int kMaxKernelRegions = 1024;

void launch_page_kernel(const PageKernelArgs& args, int blocks, int threads, cudaStream_t stream);

// Loads the kernel's module on the current device now. Under lazy module
// loading a kernel's first launch waits for the whole device, which an armed
// gate (a prepared transfer or collective) may hold until its trigger.
void load_page_kernel();

}  // namespace xfer
}  // namespace ferry
