#include "xfer/host_pool.hpp"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include "core/cuda_scope.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "sync/holds.hpp"

namespace ferry {
namespace xfer {
namespace {

// Below this, cudaHostAlloc; from here on, mmap + cudaHostRegister.
constexpr size_t kMmapFrom = size_t{64} << 20;
constexpr size_t kHugePage = size_t{2} << 20;
constexpr int kMpolPreferred = 1;

std::mutex g_registry_mu;
std::map<uintptr_t, std::weak_ptr<HostPool>>& registry() {
  static auto* r = new std::map<uintptr_t, std::weak_ptr<HostPool>>();
  return *r;
}

bool bind_to_node(void* p, size_t bytes, int node) {
  if (node < 0 || node >= 64) return false;
  unsigned long mask = 1UL << node;
  return syscall(SYS_mbind, p, bytes, kMpolPreferred, &mask, 64, 0) == 0;
}

}  // namespace

int gpu_numa_node(int device) {
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, sizeof(bus), device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  std::string id(bus);
  std::transform(id.begin(), id.end(), id.begin(), [](unsigned char c) { return std::tolower(c); });
  // C stdio, not iostreams: parsing a number through a stream's locale crashed
  // inside the Python extension once torch (with its own C++ runtime) was loaded.
  FILE* f = std::fopen(("/sys/bus/pci/devices/" + id + "/numa_node").c_str(), "r");
  if (!f) return -1;
  int node = -1;
  if (std::fscanf(f, "%d", &node) != 1) node = -1;
  std::fclose(f);
  return node;
}

std::shared_ptr<HostPool> HostPool::create(size_t bytes, const HostPoolOptions& o) {
  FERRY_ARG_CHECK(bytes > 0, "HostPool: bytes must be positive");
  FERRY_ARG_CHECK(o.huge_pages >= -1 && o.huge_pages <= 1, "HostPool: huge_pages must be -1 (auto), 0 or 1");
  sync::run_kept_frees();  // what earlier teardowns kept, before this pool pins more
  std::shared_ptr<HostPool> pool(new HostPool());
  int device = o.device;
  if (device < 0) FERRY_CUDA_CHECK(cudaGetDevice(&device));
  pool->device_ = device;
  pool->bytes_ = bytes;
  pool->numa_node_ = o.numa_node == -2 ? gpu_numa_node(device) : o.numa_node;
  DeviceScope on_device(device);
  if (bytes < kMmapFrom && o.huge_pages != 1) {
    FERRY_CUDA_CHECK(cudaHostAlloc(&pool->data_, bytes, cudaHostAllocPortable | cudaHostAllocMapped));
    pool->backing_ = "cudaHostAlloc";
    pool->numa_node_ = -1;  // placed by the driver
  } else {
    size_t len = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = MAP_FAILED;
    if (o.huge_pages != 0) {
      p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
      if (p != MAP_FAILED) pool->huge_pages_ = "hugetlb";
    }
    if (p == MAP_FAILED) {
      if (o.huge_pages == 1)
        throw_error(FERRY_ERROR_SYSTEM,
                    "HostPool: huge_pages=1 but mmap(MAP_HUGETLB) failed for " + std::to_string(len) +
                        " bytes (reserve huge pages in /proc/sys/vm/nr_hugepages, or pass huge_pages=-1)");
      p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      FERRY_SYS_CHECK(p == MAP_FAILED ? -1 : 0, "HostPool: mmap of " + std::to_string(len) + " bytes");
      if (o.huge_pages != 0 && madvise(p, len, MADV_HUGEPAGE) == 0) pool->huge_pages_ = "thp";
    }
    if (pool->numa_node_ >= 0 && !bind_to_node(p, len, pool->numa_node_)) pool->numa_node_ = -1;
    cudaError_t err = cudaHostRegister(p, len, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (err != cudaSuccess) {
      munmap(p, len);
      FERRY_CUDA_CHECK(err);
    }
    pool->data_ = p;
    pool->mapped_bytes_ = len;
    pool->backing_ = "mmap+cudaHostRegister";
  }
  std::lock_guard<std::mutex> lock(g_registry_mu);
  registry()[reinterpret_cast<uintptr_t>(pool->data_)] = pool;
  return pool;
}

std::shared_ptr<HostPool> HostPool::find(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_registry_mu);
  auto& r = registry();
  auto it = r.upper_bound(reinterpret_cast<uintptr_t>(p));
  if (it == r.begin()) return nullptr;
  --it;
  auto pool = it->second.lock();
  if (!pool || pool->closed()) return nullptr;
  uintptr_t a = reinterpret_cast<uintptr_t>(p), base = it->first;
  return a + bytes <= base + pool->bytes_ ? pool : nullptr;
}

void HostPool::note_use(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  int device = 0;
  FERRY_CUDA_CHECK(cudaGetDevice(&device));  // the stream's: callers set it
  cudaEvent_t ev = nullptr;
  for (auto [d, e] : events_) {
    if (d != device) continue;
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaSuccess) {
      ev = e;
      break;
    }
    if (q != cudaErrorNotReady) cudaGetLastError();
  }
  if (!ev) {
    FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    events_.emplace_back(device, ev);
  }
  FERRY_CUDA_CHECK(cudaEventRecord(ev, stream));
}

bool HostPool::in_flight() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto [d, e] : events_) {
    (void)d;
    cudaError_t q = cudaEventQuery(e);
    if (q == cudaErrorNotReady) return true;
    if (q != cudaSuccess) cudaGetLastError();
  }
  return false;
}

void HostPool::close() {
  if (closed()) return;
  if (graph_)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                "HostPool.close: a captured CUDA graph copies into or out of this pool and may be launched again; "
                "its memory stays until the process exits");
  if (views() > 0)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, "HostPool.close: " + std::to_string(views()) +
                                                  " tensors over this pool are still alive; drop them first (the "
                                                  "pool is freed when the last one goes)");
  if (const int n = prepared_.load(); n > 0)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                "HostPool.close: " + std::to_string(n) +
                    " prepared transfers copy into or out of this pool and may be armed again; release them first");
  if (in_flight())
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                "HostPool.close: a transfer that reads or writes this pool is still in flight; synchronize its "
                "stream first");
  release(0);
}

void HostPool::release(double timeout_s) {
  if (!data_) return;
  // A pool can go (Python's garbage collector) while some stream captures a
  // graph; freeing pinned memory then must not invalidate that capture.
  RelaxedCaptureScope relax;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (in_flight()) {
    if (std::chrono::steady_clock::now() > deadline) {
      std::fprintf(stderr,
                   "ferry: a host pool of %zu bytes was dropped while a transfer into or out of it was still "
                   "running after %.0f s; its memory is kept (not freed under the copy engine)\n",
                   bytes_, timeout_s);
      data_ = nullptr;
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  {
    std::lock_guard<std::mutex> lock(g_registry_mu);
    registry().erase(reinterpret_cast<uintptr_t>(data_));
  }
  // Freeing pinned memory waits for every stream of the GPU: kept for later
  // while an armed transfer may hold one.
  sync::free_when_unheld(
      [data = data_, mapped = mapped_bytes_, device = device_] {
        RelaxedCaptureScope relax;  // it may run on a thread that captures
        DeviceScope on_device(device);
        if (mapped) {
          cudaHostUnregister(data);
          munmap(data, mapped);
        } else {
          cudaFreeHost(data);
        }
        cudaGetLastError();
      },
      "a host pool of " + std::to_string(bytes_) + " bytes");
  data_ = nullptr;
}

HostPool::~HostPool() {
  try {
    release(teardown_timeout_seconds());
  } catch (...) {
  }
  for (auto [d, e] : events_) {
    (void)d;
    cudaEventDestroy(e);
  }
}

}  // namespace xfer
}  // namespace ferry
