// Pinned host memory for KV pages: page-locked, mapped for the GPU, placed on
// the GPU's NUMA node. Small pools come from cudaHostAlloc; large ones from
// mmap (huge pages where the system has them) bound to the node, then
// registered with CUDA, which pins large ranges faster and lets the pages be
// placed before they are touched.
//
// A pool's memory is never freed under a transfer: transfers that touch a pool
// record an event in it, close() refuses while one is unfinished, and the
// destructor waits for them (bounded by FERRY_TIMEOUT_S; past that it keeps the
// memory rather than free it under a copy engine).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ferry {
namespace xfer {

struct HostPoolOptions {
  int device = -1;      // the GPU the pool serves (NUMA placement); -1: the current device
  int numa_node = -2;   // -2: the GPU's node; -1: no placement; >= 0: that node
  int huge_pages = -1;  // -1: where available; 0: never; 1: required (fails without)
};

class HostPool {
 public:
  // Registers the pool so that transfers find it by address (find()).
  static std::shared_ptr<HostPool> create(size_t bytes, const HostPoolOptions& options);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  int numa_node() const { return numa_node_; }
  // "cudaHostAlloc" or "mmap+cudaHostRegister"
  const std::string& backing() const { return backing_; }
  // "hugetlb" (explicit huge pages), "thp" (transparent huge pages asked for) or "none"
  const std::string& huge_pages() const { return huge_pages_; }

  // Records that work enqueued so far on `stream` reads or writes the pool.
  void note_use(cudaStream_t stream);
  // True while a noted transfer has not finished.
  bool in_flight();
  // Frees the memory now; throws FERRY_ERROR_INVALID_ARGUMENT while a transfer
  // is in flight or a view (a tensor over the pool) is alive.
  void close();
  // Views (tensors over the pool) that are alive; close() refuses while any is.
  void add_view() { ++views_; }
  void drop_view() { --views_; }
  int views() const { return views_.load(); }
  // Prepared transfers planned over the pool (they keep its addresses, and
  // may be armed again at any time): close() refuses while any is alive.
  void add_prepared() { ++prepared_; }
  void drop_prepared() { --prepared_; }
  // A captured CUDA graph copies into or out of the pool: close() refuses it
  // from now on (the graph may be launched at any time).
  void keep_for_graph() { graph_ = true; }
  bool closed() const { return data_ == nullptr; }

  // The live pool holding [p, p + bytes), or nullptr.
  static std::shared_ptr<HostPool> find(const void* p, size_t bytes);

 private:
  HostPool() = default;
  void release(double timeout_s);

  void* data_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_bytes_ = 0;
  int device_ = 0;
  int numa_node_ = -1;
  std::string backing_;
  std::string huge_pages_ = "none";
  std::mutex mu_;
  std::vector<std::pair<int, cudaEvent_t>> events_;  // (device, event): an event records only on its device's streams
  std::atomic<int> views_{0};
  std::atomic<int> prepared_{0};
  std::atomic<bool> graph_{false};
};

// The NUMA node of `device` as the kernel reports it (-1 if unknown).
int gpu_numa_node(int device);

}  // namespace xfer
}  // namespace ferry
