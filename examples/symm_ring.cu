// The symmetric heap from C++/CUDA: a ring in which every rank puts a block
// of its data into the next rank's copy of a buffer and signals it, then
// waits for the previous rank's; every byte is checked. One process drives
// every visible GPU (or, with FERRY_SHARED_GPUS=1 and an argument, that many
// ranks sharing them):
//
//   ./ferry_example_symm_ring [ranks]
//
// Then the same ring runs through memory the program made itself with CUDA's
// virtual memory management (cuMemCreate), registered into the heap; memory
// from cudaMalloc is refused.
//
// Prints "symm_ring: ok" and exits 0 when every byte arrived.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ferry/device/heap.cuh"
#include "ferry/device/signal.cuh"
#include "ferry/ferry.h"
#include "ferry/symm.h"

using namespace ferry::device;

#define CHECK_FERRY(call)                                                                            \
  do {                                                                                               \
    ferry_result_t r_ = (call);                                                                      \
    if (r_ != FERRY_SUCCESS) {                                                                       \
      std::fprintf(stderr, "%s failed: %s: %s\n", #call, ferry_result_name(r_), ferry_last_error()); \
      std::exit(1);                                                                                  \
    }                                                                                                \
  } while (0)
#define CHECK_CUDA(call)                                                      \
  do {                                                                        \
    cudaError_t e_ = (call);                                                  \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

// Fills this rank's source with a pattern of (rank, i), puts it into the next
// rank's buffer with a signal, waits for the previous rank's, and counts the
// bytes of it that are not the previous rank's pattern.
__global__ void ring(Heap h, unsigned char* src, unsigned char* buf, uint64_t bytes, uint64_t* sig, uint64_t round,
                     unsigned long long* wrong) {
  for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x)
    src[i] = static_cast<unsigned char>(h.rank * 31 + i * 7 + round);
  __syncthreads();
  put_signal<Scope::kBlock>(h, buf, src, bytes, sig, round, SignalOp::kSet, (h.rank + 1) % h.world);
  __shared__ bool ok;
  const int prev = (h.rank + h.world - 1) % h.world;
  if (threadIdx.x == 0) ok = signal_wait_until(h, sig, Cmp::kGe, round, prev);
  __syncthreads();
  if (!ok) {
    if (threadIdx.x == 0) atomicAdd(wrong, 1ull << 40);
    return;
  }
  for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x)
    if (buf[i] != static_cast<unsigned char>(prev * 31 + i * 7 + round)) atomicAdd(wrong, 1ull);
}

// `bytes` (rounded up to the granule) of this device's memory made with
// cuMemCreate and mapped, as an allocator built on CUDA's virtual memory
// management makes it. The driver entry points come through the runtime, so
// the program need not link libcuda.
void* vmm_alloc(int device, size_t bytes) {
  auto entry = [](const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    CHECK_CUDA(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
    return fn;
  };
  auto granularity = reinterpret_cast<decltype(&cuMemGetAllocationGranularity)>(entry("cuMemGetAllocationGranularity"));
  auto reserve = reinterpret_cast<decltype(&cuMemAddressReserve)>(entry("cuMemAddressReserve"));
  auto create = reinterpret_cast<decltype(&cuMemCreate)>(entry("cuMemCreate"));
  auto map = reinterpret_cast<decltype(&cuMemMap)>(entry("cuMemMap"));
  auto access = reinterpret_cast<decltype(&cuMemSetAccess)>(entry("cuMemSetAccess"));
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location = {CU_MEM_LOCATION_TYPE_DEVICE, device};
  size_t g = 0;
  CUdeviceptr p = 0;
  CUmemGenericAllocationHandle h = 0;
  bool ok = granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS;
  bytes = (bytes + g - 1) / g * g;
  ok = ok && reserve(&p, bytes, g, 0, 0) == CUDA_SUCCESS && create(&h, bytes, &prop, 0) == CUDA_SUCCESS &&
       map(p, bytes, 0, h, 0) == CUDA_SUCCESS;
  CUmemAccessDesc rw{{CU_MEM_LOCATION_TYPE_DEVICE, device}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
  ok = ok && access(p, bytes, &rw, 1) == CUDA_SUCCESS;
  if (!ok) {
    std::fprintf(stderr, "making VMM memory failed\n");
    std::exit(1);
  }
  return reinterpret_cast<void*>(p);  // kept until the program ends
}

int main(int argc, char** argv) {
  int gpus = 0;
  CHECK_CUDA(cudaGetDeviceCount(&gpus));
  const int ranks = argc > 1 ? std::atoi(argv[1]) : gpus;
  std::vector<int> devices;
  for (int r = 0; r < ranks; ++r) devices.push_back(r % gpus);
  ferry_comm_t comm;
  CHECK_FERRY(ferry_comm_init_local(devices.data(), ranks, 30.0, &comm));
  ferry_heap_t heap;
  CHECK_FERRY(ferry_heap_create(comm, size_t(1) << 30, &heap));

  const uint64_t bytes = (1 << 20) + 3;
  std::vector<void*> buf(ranks), sig(ranks);
  CHECK_FERRY(ferry_heap_alloc(heap, bytes, 256, nullptr, buf.data()));
  CHECK_FERRY(ferry_heap_alloc(heap, 8, 8, nullptr, sig.data()));
  // Bytes per rank: the capacity asked for, what the two allocations hold,
  // and the GPU memory mapped for them (whole chunks).
  size_t capacity = 0, used = 0, mapped = 0;
  CHECK_FERRY(ferry_heap_sizes(heap, &capacity, &used, &mapped));
  if (capacity < (size_t(1) << 30) || used < bytes + 8 || mapped < used) {
    std::fprintf(stderr, "heap sizes: capacity %zu, used %zu, mapped %zu\n", capacity, used, mapped);
    return 1;
  }
  std::vector<Heap> handles(ranks);
  std::vector<cudaStream_t> streams(ranks);
  std::vector<unsigned char*> src(ranks);
  std::vector<unsigned long long*> wrong(ranks);
  for (int r = 0; r < ranks; ++r) {
    CHECK_FERRY(ferry_heap_handle(heap, r, &handles[r], sizeof(Heap)));
    CHECK_CUDA(cudaSetDevice(devices[r]));
    CHECK_CUDA(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc(&src[r], bytes));
    CHECK_CUDA(cudaMalloc(&wrong[r], sizeof(unsigned long long)));
    CHECK_CUDA(cudaMemset(sig[r], 0, 8));
    CHECK_CUDA(cudaMemset(wrong[r], 0, sizeof(unsigned long long)));
  }
  for (int r = 0; r < ranks; ++r) {  // every signal word is zero before any rank signals
    CHECK_CUDA(cudaSetDevice(devices[r]));
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  // Every rank's kernel is launched before the host waits for any: each one
  // waits for its neighbour's signal.
  for (uint64_t round = 1; round <= 3; ++round) {
    for (int r = 0; r < ranks; ++r) {
      CHECK_CUDA(cudaSetDevice(devices[r]));
      ring<<<1, 256, 0, streams[r]>>>(handles[r], src[r], static_cast<unsigned char*>(buf[r]), bytes,
                                      static_cast<uint64_t*>(sig[r]), round, wrong[r]);
      CHECK_CUDA(cudaGetLastError());
    }
    for (int r = 0; r < ranks; ++r) CHECK_CUDA(cudaStreamSynchronize(streams[r]));
  }
  // The ring again, through each rank's own VMM memory registered into the
  // heap: reg[r] is its heap address, the same memory as mine[r].
  std::vector<void*> mine(ranks), reg(ranks);
  for (int r = 0; r < ranks; ++r) mine[r] = vmm_alloc(devices[r], bytes);
  std::vector<void*> plain(src.begin(), src.end());  // from cudaMalloc
  if (ferry_heap_register(heap, plain.data(), bytes, nullptr, reg.data()) != FERRY_ERROR_INVALID_ARGUMENT) {
    std::printf("registering cudaMalloc memory was not refused\n");
    return 1;
  }
  CHECK_FERRY(ferry_heap_register(heap, mine.data(), bytes, nullptr, reg.data()));
  for (int r = 0; r < ranks; ++r) {
    CHECK_CUDA(cudaSetDevice(devices[r]));
    ring<<<1, 256, 0, streams[r]>>>(handles[r], src[r], static_cast<unsigned char*>(reg[r]), bytes,
                                    static_cast<uint64_t*>(sig[r]), 4, wrong[r]);
    CHECK_CUDA(cudaGetLastError());
  }
  for (int r = 0; r < ranks; ++r) CHECK_CUDA(cudaStreamSynchronize(streams[r]));
  CHECK_FERRY(ferry_heap_deregister(heap, reg[0]));
  // What arrived, read through the program's own addresses of the memory.
  std::vector<unsigned char> got(bytes);
  for (int r = 0; r < ranks; ++r) {
    // A VMM mapping is readable only from the GPUs it grants access (this
    // one, its own): the copy runs there.
    CHECK_CUDA(cudaSetDevice(devices[r]));
    CHECK_CUDA(cudaMemcpy(got.data(), mine[r], bytes, cudaMemcpyDeviceToHost));
    const int prev = (r + ranks - 1) % ranks;
    for (uint64_t i = 0; i < bytes; ++i)
      if (got[i] != static_cast<unsigned char>(prev * 31 + i * 7 + 4)) {
        std::printf("rank %d: registered memory differs at byte %llu\n", r, static_cast<unsigned long long>(i));
        return 1;
      }
  }
  CHECK_FERRY(ferry_heap_check(heap));
  unsigned long long bad = 0;
  for (int r = 0; r < ranks; ++r) {
    unsigned long long w = 0;
    CHECK_CUDA(cudaMemcpy(&w, wrong[r], sizeof w, cudaMemcpyDeviceToHost));
    if (w) std::printf("rank %d: %llu wrong bytes, %llu waits gave up\n", r, w & ((1ull << 40) - 1), w >> 40);
    bad += w;
  }
  for (int r = 0; r < ranks; ++r) {
    CHECK_CUDA(cudaSetDevice(devices[r]));
    cudaFree(src[r]);
    cudaFree(wrong[r]);
    cudaStreamDestroy(streams[r]);
  }
  CHECK_FERRY(ferry_heap_free(heap, buf[0]));
  CHECK_FERRY(ferry_heap_free(heap, sig[0]));
  size_t after = 1;
  CHECK_FERRY(ferry_heap_sizes(heap, nullptr, &after, nullptr));
  if (after >= used) {
    std::fprintf(stderr, "heap sizes: %zu bytes in use after freeing both allocations (%zu before)\n", after, used);
    bad = 1;
  }
  ferry_heap_destroy(heap);
  ferry_comm_destroy(comm);
  std::printf(bad ? "symm_ring: FAILED\n" : "symm_ring: ok (%d ranks, 4 rounds of %llu bytes, the last registered)\n",
              ranks, static_cast<unsigned long long>(bytes));
  return bad ? 1 : 0;
}
