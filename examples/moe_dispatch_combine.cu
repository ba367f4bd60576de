// An MoE dispatch/combine pair for one node on ferry's device API, in the
// style of DeepEP's low-latency kernels: every token's row goes straight from
// its rank's memory into a fixed slot of each chosen expert's rank (no
// all-to-all of counts first), an expert turns it around, and the result goes
// back into a slot of the token's own rank, where the top-k results are
// summed with their weights. Signals, not barriers, order each step.
//
// examples/moe_dispatch_combine.py builds this file with torch's
// cpp_extension (include path: ferry.get_include()) and calls the three
// launchers below through ctypes; tests/gpu/test_symm.py runs it.
//
// Layout (bf16 rows of `hidden`; E experts, `epr` per rank, expert e on rank e / epr):
//   recv_x[epr][world][tokens][hidden]   rows received, by local expert and source rank (heap)
//   recv_meta[epr][world][tokens]        token * topk + k of each received row (heap, int32)
//   recv_count[epr][world]               rows received from each source (heap, int32)
//   recv_flag[epr][world]                the round in which they arrived (heap, uint64)
//   combine_in[tokens][topk][hidden]     expert outputs back at the token's rank (heap)
//   combine_flag[E]                      the round in which expert e sent them (heap, uint64)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "ferry/device/heap.cuh"
#include "ferry/device/rma.cuh"
#include "ferry/device/signal.cuh"
#include "ferry/device/sync.cuh"

using namespace ferry::device;

namespace {

struct Moe {
  int tokens, hidden, topk, experts, epr;
};

// Block e: the tokens of this rank routed to expert e, in token order, each
// row put into slot i of e's rank; then the count and the round's signal.
__global__ void dispatch_kernel(Heap h, Moe m, const __nv_bfloat16* x, const int32_t* topk_idx, __nv_bfloat16* recv_x,
                                int32_t* recv_meta, int32_t* recv_count, uint64_t* recv_flag, uint64_t round) {
  extern __shared__ int32_t routed[];  // token * topk + k, for this expert
  __shared__ int n;
  const int e = blockIdx.x, dest = e / m.epr, local = e % m.epr;
  if (threadIdx.x == 0) {
    n = 0;
    for (int i = 0; i < m.tokens * m.topk; ++i)
      if (topk_idx[i] == e) routed[n++] = i;
  }
  __syncthreads();
  const uint64_t row_bytes = uint64_t(m.hidden) * sizeof(__nv_bfloat16);
  const uint64_t region = (uint64_t(local) * h.world + h.rank) * m.tokens;  // this source's slots at e
  for (int i = 0; i < n; ++i) {
    const int token = routed[i] / m.topk;
    put<Scope::kBlock>(h, recv_x + (region + i) * m.hidden, x + uint64_t(token) * m.hidden, row_bytes, dest);
    if (threadIdx.x == 0) p(h, recv_meta + region + i, routed[i], dest);
  }
  if (threadIdx.x == 0) {
    p(h, recv_count + local * h.world + h.rank, n, dest);
    fence();  // the rows and the count land before the signal
    signal_op(h, recv_flag + local * h.world + h.rank, round, SignalOp::kSet, dest);
  }
}

// Block (local expert, source): waits for the source's rows, applies the
// expert (here: multiply by e + 1, in float), and stores each result straight
// into the source's combine_in; then signals the source.
__global__ void expert_kernel(Heap h, Moe m, const __nv_bfloat16* recv_x, const int32_t* recv_meta,
                              const int32_t* recv_count, const uint64_t* recv_flag, __nv_bfloat16* combine_in,
                              uint64_t* combine_flag, uint64_t round, int* ok) {
  const int local = blockIdx.x / h.world, src = blockIdx.x % h.world;
  const int e = h.rank * m.epr + local;
  __shared__ int good;
  if (threadIdx.x == 0) {
    good = signal_wait_until(h, recv_flag + local * h.world + src, Cmp::kGe, round, src);
    if (!good) atomicExch(ok, 0);
  }
  __syncthreads();
  if (!good) return;
  const int n = recv_count[local * h.world + src];
  const uint64_t region = (uint64_t(local) * h.world + src) * m.tokens;
  const float scale = float(e + 1);
  __nv_bfloat16* out = h.peer_ptr(combine_in, src);
  for (int i = 0; i < n; ++i) {
    const int slot = recv_meta[region + i];  // token * topk + k at the source
    const __nv_bfloat16* row = recv_x + (region + i) * m.hidden;
    __nv_bfloat16* dst = out + uint64_t(slot) * m.hidden;
    for (int j = threadIdx.x; j < m.hidden; j += blockDim.x)
      dst[j] = __float2bfloat16(__bfloat162float(row[j]) * scale);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    fence();
    signal_op(h, combine_flag + e, round, SignalOp::kSet, src);
  }
}

// Tokens t = blockIdx.x, + gridDim.x, ...: waits for the experts of token t,
// then out[t] = sum over k of weight[t][k] * combine_in[t][k] (float, rounded
// once). A bounded grid: spinning blocks of one rank must leave room on the
// GPU for the expert kernels of ranks that share it.
__global__ void combine_kernel(Heap h, Moe m, const int32_t* topk_idx, const float* topk_w,
                               const __nv_bfloat16* combine_in, const uint64_t* combine_flag, __nv_bfloat16* out,
                               uint64_t round, int* ok) {
  __shared__ int good;
  for (int t = blockIdx.x; t < m.tokens; t += gridDim.x) {
    if (threadIdx.x == 0) {
      good = 1;
      for (int k = 0; k < m.topk && good; ++k) {
        const int e = topk_idx[t * m.topk + k];
        good = signal_wait_until(h, combine_flag + e, Cmp::kGe, round, e / m.epr);
      }
      if (!good) atomicExch(ok, 0);
    }
    __syncthreads();
    if (!good) return;
    for (int j = threadIdx.x; j < m.hidden; j += blockDim.x) {
      float acc = 0.f;
      for (int k = 0; k < m.topk; ++k)
        acc += topk_w[t * m.topk + k] * __bfloat162float(combine_in[(uint64_t(t) * m.topk + k) * m.hidden + j]);
      out[uint64_t(t) * m.hidden + j] = __float2bfloat16(acc);
    }
    __syncthreads();  // `good` is rewritten for the next token
  }
}

}  // namespace

extern "C" {

int moe_dispatch(const void* heap, int tokens, int hidden, int topk, int experts, int epr, const void* x,
                 const int32_t* topk_idx, void* recv_x, int32_t* recv_meta, int32_t* recv_count, uint64_t* recv_flag,
                 uint64_t round, cudaStream_t s) {
  Moe m{tokens, hidden, topk, experts, epr};
  const size_t routed_bytes = size_t(tokens) * topk * sizeof(int32_t);  // the block's list of routed rows
  if (routed_bytes > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(dispatch_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(routed_bytes));
    if (e != cudaSuccess) return e;  // more tokens x top-k than a block's shared memory holds
  }
  dispatch_kernel<<<experts, 512, routed_bytes, s>>>(heap_from_bytes(heap), m, static_cast<const __nv_bfloat16*>(x),
                                                     topk_idx, static_cast<__nv_bfloat16*>(recv_x), recv_meta,
                                                     recv_count, recv_flag, round);
  return cudaGetLastError();
}

int moe_expert(const void* heap, int tokens, int hidden, int topk, int experts, int epr, const void* recv_x,
               const int32_t* recv_meta, const int32_t* recv_count, const uint64_t* recv_flag, void* combine_in,
               uint64_t* combine_flag, uint64_t round, int* ok, cudaStream_t s) {
  Moe m{tokens, hidden, topk, experts, epr};
  Heap h = heap_from_bytes(heap);
  expert_kernel<<<epr * h.world, 256, 0, s>>>(h, m, static_cast<const __nv_bfloat16*>(recv_x), recv_meta, recv_count,
                                              recv_flag, static_cast<__nv_bfloat16*>(combine_in), combine_flag, round,
                                              ok);
  return cudaGetLastError();
}

int moe_combine(const void* heap, int tokens, int hidden, int topk, int experts, int epr, const int32_t* topk_idx,
                const float* topk_w, const void* combine_in, const uint64_t* combine_flag, void* out, uint64_t round,
                int* ok, cudaStream_t s) {
  Moe m{tokens, hidden, topk, experts, epr};
  const int blocks = tokens < 32 ? tokens : 32;
  combine_kernel<<<blocks, 256, 0, s>>>(heap_from_bytes(heap), m, topk_idx, topk_w,
                                        static_cast<const __nv_bfloat16*>(combine_in), combine_flag,
                                        static_cast<__nv_bfloat16*>(out), round, ok);
  return cudaGetLastError();
}

}  // extern "C"
