#include <cstdint>

#include "coll/copy_words.cuh"
#include "coll/local_copy.hpp"
#include "core/error.hpp"
#include "dma/engine.hpp"

namespace ferry {
namespace {

constexpr int kThreads = 512;
// Few blocks: the copy is bandwidth-bound and should leave most SMs to the
// user's compute.
constexpr int kMaxBlocks = 32;

// Words each thread has in flight. One 16-byte load per thread leaves an SM
// waiting on memory latency (about 17 GB/s per SM measured on H200, 32 blocks:
// 0.54 TB/s); eight keep 64 KB in flight per block, so the same bytes take
// fewer SM-microseconds away from the user's kernels.
constexpr int kUnroll = 8;

// Streaming loads and stores (evict-first): the block is read and written
// once, and should not push the user's working set out of L2.
__global__ void copy_vec16(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n16) {
  const size_t step = blockDim.x;
  copy_words<kUnroll, true>(dst, src, n16, size_t(blockIdx.x) * step * kUnroll + threadIdx.x, step,
                            size_t(gridDim.x) * step * kUnroll);
}

__global__ void copy_bytes(unsigned char* __restrict__ dst, const unsigned char* __restrict__ src, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) dst[i] = src[i];
}

// dst[i] = the 4 bytes at (src_aligned + shift/8 + 4i), from two aligned
// words; kUnroll output words in flight per thread, as in copy_vec16.
__global__ void copy_skewed(uint32_t* __restrict__ dst, const uint32_t* __restrict__ src_aligned, unsigned shift,
                            size_t n4) {
  const size_t step = blockDim.x;
  size_t i = size_t(blockIdx.x) * step * kUnroll + threadIdx.x;
  for (; i + (kUnroll - 1) * step < n4; i += size_t(gridDim.x) * step * kUnroll) {
    uint32_t lo[kUnroll], hi[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      lo[u] = __ldcs(src_aligned + i + u * step);
      hi[u] = __ldcs(src_aligned + i + u * step + 1);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) __stcs(dst + i + u * step, __funnelshift_r(lo[u], hi[u], shift));
  }
  for (; i < n4; i += step) dst[i] = __funnelshift_r(src_aligned[i], src_aligned[i + 1], shift);
}

int blocks_for(size_t items) {
  size_t b = (items + kThreads - 1) / kThreads;
  return static_cast<int>(b < kMaxBlocks ? (b == 0 ? 1 : b) : kMaxBlocks);
}

}  // namespace

void load_local_copy_kernels() {
  cudaFuncAttributes a;
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, copy_vec16));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, copy_bytes));
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, copy_skewed));
}

void launch_local_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  auto* d8 = static_cast<unsigned char*>(dst);
  auto* s8 = static_cast<const unsigned char*>(src);
  if (bytes < 64) {
    copy_bytes<<<1, kThreads, 0, stream>>>(d8, s8, bytes);
  } else if (d % 16 == s % 16) {
    // Co-aligned: bytes up to a 16-byte boundary, 16-byte words, a byte tail.
    size_t head = (16 - d % 16) % 16;
    size_t n16 = (bytes - head) / 16, tail = bytes - head - n16 * 16;
    if (head) copy_bytes<<<1, kThreads, 0, stream>>>(d8, s8, head);
    copy_vec16<<<blocks_for((n16 + kUnroll - 1) / kUnroll), kThreads, 0, stream>>>(
        reinterpret_cast<uint4*>(d8 + head), reinterpret_cast<const uint4*>(s8 + head), n16);
    if (tail) copy_bytes<<<1, kThreads, 0, stream>>>(d8 + head + n16 * 16, s8 + head + n16 * 16, tail);
  } else {
    // Skewed: align the destination to 4 bytes and build each word from two
    // aligned source words, so no thread moves single bytes in the bulk.
    size_t head = (4 - d % 4) % 4;
    size_t n4 = (bytes - head) / 4 - 1;  // the last word's neighbour would lie past the source
    size_t done = head + n4 * 4;
    if (head) copy_bytes<<<1, kThreads, 0, stream>>>(d8, s8, head);
    const unsigned char* s_body = s8 + head;
    auto shift = static_cast<unsigned>(reinterpret_cast<uintptr_t>(s_body) % 4) * 8;
    copy_skewed<<<blocks_for((n4 + kUnroll - 1) / kUnroll), kThreads, 0, stream>>>(
        reinterpret_cast<uint32_t*>(d8 + head), reinterpret_cast<const uint32_t*>(s_body - shift / 8), shift, n4);
    copy_bytes<<<1, kThreads, 0, stream>>>(d8 + done, s8 + done, bytes - done);
  }
  FERRY_CUDA_CHECK(cudaGetLastError());
}

void copy_local(const Copy& c, LocalCopy how, cudaStream_t stream) {
  if (c.bytes == 0) return;
  switch (how) {
    case LocalCopy::kDriver:
      dma::copy_one(stream, c);
      break;
    default:
      launch_local_copy(c.dst, c.src, c.bytes, stream);
  }
}

LocalCopy parse_local_copy(const std::string& name, const char* what) {
  if (name == "auto" || name.empty()) return LocalCopy::kAuto;
  if (name == "driver") return LocalCopy::kDriver;
  if (name == "sm") return LocalCopy::kKernel;
  if (name == "peer") return LocalCopy::kPeer;
  std::string why = std::string(what) + " is '" + name + "'; expected 'auto', 'peer', 'sm' or 'driver'";
  if (name == "ce")
    why +=
        " ('ce' was removed: a copy within one GPU runs on SMs whatever call makes it, see "
        "docs/architecture.md; 'driver' is the path it named)";
  throw_error(FERRY_ERROR_INVALID_ARGUMENT, why);
}

}  // namespace ferry
