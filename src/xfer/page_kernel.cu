#include <algorithm>

#include "core/error.hpp"
#include "xfer/page_kernel.hpp"

namespace ferry {
namespace xfer {
namespace {

constexpr int kUnroll = 4;

__device__ __forceinline__ int64_t load_id(const void* ids, bool is_64, uint64_t i) {
  return is_64 ? static_cast<const int64_t*>(ids)[i] : static_cast<const int32_t*>(ids)[i];
}

// A warp copies [src, src + len) to dst: 16-byte words, kUnroll loads in
// flight per lane before the stores (reads of host memory cross PCIe, so many
// must be outstanding).
__device__ __forceinline__ void warp_copy16(char* dst, const char* src, uint64_t len, int lane) {
  const uint64_t step = 32 * 16;
  uint64_t off = static_cast<uint64_t>(lane) * 16;
  for (; off + (kUnroll - 1) * step < len; off += kUnroll * step) {
    uint4 v[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) v[j] = *reinterpret_cast<const uint4*>(src + off + j * step);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) *reinterpret_cast<uint4*>(dst + off + j * step) = v[j];
  }
  for (; off < len; off += step) *reinterpret_cast<uint4*>(dst + off) = *reinterpret_cast<const uint4*>(src + off);
}

__device__ __forceinline__ void warp_copy1(char* dst, const char* src, uint64_t len, int lane) {
  for (uint64_t off = lane; off < len; off += 32) dst[off] = src[off];
}

__global__ void page_gather(PageKernelArgs a) {
  extern __shared__ KernelRegion regions[];
  for (int r = threadIdx.x; r < a.nregions; r += blockDim.x) regions[r] = a.regions[r];
  __syncthreads();
  const int lane = threadIdx.x % 32;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (blockDim.x / 32);
  const uint64_t total = a.pages * a.units_per_page;
  for (uint64_t u = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; u < total; u += warps) {
    const uint64_t i = u / a.units_per_page;
    const uint64_t k = u % a.units_per_page;
    int lo = 0, hi = a.nregions - 1;  // the last region whose first unit is <= k
    while (lo < hi) {
      int mid = (lo + hi + 1) / 2;
      if (regions[mid].first_unit <= k)
        lo = mid;
      else
        hi = mid - 1;
    }
    const KernelRegion& g = regions[lo];
    const uint64_t off = (k - g.first_unit) * a.chunk;
    if (off >= g.bytes) continue;  // a region of zero bytes
    const uint64_t len = min(a.chunk, g.bytes - off);
    const int64_t s = load_id(a.src_ids, a.ids_64, i), d = load_id(a.dst_ids, a.ids_64, i);
    if (a.error &&
        (s < 0 || d < 0 || static_cast<uint64_t>(s) >= a.src_pages || static_cast<uint64_t>(d) >= a.dst_pages)) {
      if (lane == 0) atomicCAS(a.error, 0ULL, static_cast<unsigned long long>(i) + 1);
      continue;
    }
    if (a.repeated && (a.repeated[d >> 5] >> (d & 31)) & 1u) continue;  // reported by launch_page_marks
    const char* src = reinterpret_cast<const char*>(g.src + static_cast<uint64_t>(s) * g.src_stride + off);
    char* dst = reinterpret_cast<char*>(g.dst + static_cast<uint64_t>(d) * g.dst_stride + off);
    if (a.vec16)
      warp_copy16(dst, src, len, lane);
    else
      warp_copy1(dst, src, len, lane);
  }
}

// One thread per entry: the first to name a page sets its bit in `seen`;
// any later one sets it in `repeated` too.
__global__ void page_marks(const void* dst_ids, bool ids_64, uint64_t pages, uint64_t dst_pages, uint32_t* seen,
                           uint32_t* repeated, unsigned long long* error) {
  const uint64_t step = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < pages; i += step) {
    const int64_t d = load_id(dst_ids, ids_64, i);
    if (d < 0 || static_cast<uint64_t>(d) >= dst_pages) continue;
    const uint32_t bit = 1u << (d & 31);
    if (atomicOr(&seen[d >> 5], bit) & bit) {
      atomicOr(&repeated[d >> 5], bit);
      atomicCAS(error, 0ULL, kRepeatedDstBit | (i + 1));
    }
  }
}

}  // namespace

void launch_page_marks(const void* dst_ids, bool ids_64, uint64_t pages, uint64_t dst_pages, uint32_t* marks,
                       unsigned long long* error, cudaStream_t stream) {
  const uint64_t words = page_mark_words(dst_pages);
  if (pages == 0 || words == 0) return;
  FERRY_CUDA_CHECK(cudaMemsetAsync(marks, 0, 2 * words * sizeof(uint32_t), stream));
  constexpr int kThreads = 256;
  const int blocks = static_cast<int>(std::min<uint64_t>((pages + kThreads - 1) / kThreads, 1024));
  page_marks<<<blocks, kThreads, 0, stream>>>(dst_ids, ids_64, pages, dst_pages, marks, marks + words, error);
  FERRY_CUDA_CHECK(cudaGetLastError());
}

void load_page_kernel() {
  cudaFuncAttributes attributes{};
  // Best effort: a GPU with no image for the kernel still copies on copy
  // engines; the kernel's launch reports that error where it is used.
  if (cudaFuncGetAttributes(&attributes, page_gather) != cudaSuccess) cudaGetLastError();
  if (cudaFuncGetAttributes(&attributes, page_marks) != cudaSuccess) cudaGetLastError();
}

void launch_page_kernel(const PageKernelArgs& args, int blocks, int threads, cudaStream_t stream) {
  if (args.pages == 0 || args.units_per_page == 0) return;
  FERRY_ARG_CHECK(args.nregions > 0 && args.nregions <= kMaxKernelRegions,
                  "kernel strategy: at most " + std::to_string(kMaxKernelRegions) + " tensors per side");
  FERRY_ARG_CHECK(threads >= 32 && threads <= 1024 && threads % 32 == 0,
                  "kernel strategy: threads must be a multiple of 32 in 32..1024");
  FERRY_ARG_CHECK(blocks >= 1, "kernel strategy: blocks must be at least 1");
  size_t shared = sizeof(KernelRegion) * static_cast<size_t>(args.nregions);
  if (shared > 48 * 1024)
    FERRY_CUDA_CHECK(
        cudaFuncSetAttribute(page_gather, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  page_gather<<<blocks, threads, shared, stream>>>(args);
  FERRY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace xfer
}  // namespace ferry
