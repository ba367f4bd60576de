// The symmetric heap: one address range per process holding every rank's
// heap at the same stride, physical memory mapped into it on demand as one
// growing prefix, and a deterministic allocator (symm/heap_plan.hpp), so that
// an object sits at the same offset in every rank's heap and a kernel finds a
// peer's copy by arithmetic (include/ferry/device/heap.cuh).
//
// In one process driving several ranks every rank's memory is mapped into the
// one range; with one process per rank each rank's chunks travel to its peers
// as POSIX file descriptors over the group's Unix sockets. Allocation and
// free are collective and explicit: every rank calls them with the same
// arguments in the same order; a rank that does not is named.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/group.hpp"
#include "ferry/device/heap.cuh"
#include "symm/heap_plan.hpp"
#include "symm/registration.hpp"

namespace ferry {

class SymmetricHeap {
 public:
  // Collective over the group. `capacity`: bytes of each rank's heap (0:
  // FERRY_SYMM_HEAP_BYTES); address space only, physical memory comes as
  // allocations need it. `min_chunk`: the least physical memory one growth
  // maps (0: FERRY_SYMM_CHUNK_BYTES); the same on every rank. The group's
  // bootstrap must outlive the heap. `words` false: a heap of memory only,
  // whose own words (barriers, signals, waits, the kernels' handle) are never
  // used: create() then runs nothing on the GPUs (no zeroing, no kernel),
  // maps nothing until the first allocation, and allocations start at offset
  // 0, as the multipath engine's staging needs (copy engines only); those
  // calls are refused.
  static std::unique_ptr<SymmetricHeap> create(const Group& group, size_t capacity, size_t min_chunk = 0,
                                               bool words = true);
  ~SymmetricHeap();
  SymmetricHeap(const SymmetricHeap&) = delete;
  SymmetricHeap& operator=(const SymmetricHeap&) = delete;

  // Not collective: unmaps this process's view, without waiting for work that
  // still uses it (the caller's to finish first). Peers' views of this rank's
  // memory stay valid until they close theirs.
  void close();
  bool closed() const { return closed_; }

  // Collective: `bytes` at the same offset on every rank, aligned to `align`;
  // returns the offset. `streams`: the callers' streams, by local rank (fewer
  // is fine); while one captures a CUDA graph, an allocation that needs new
  // physical memory is refused with the size to reserve() first.
  size_t alloc(size_t bytes, size_t align, const std::vector<cudaStream_t>& streams);
  // Collective: frees the allocation starting at `offset`.
  void free(size_t offset);
  // Collective: maps physical memory under the first `bytes` of the heap's
  // usable space, so that allocations within it map nothing.
  void reserve(size_t bytes);
  // Collective: maps each local rank's existing buffer of `bytes` (by local
  // rank) into the heap at the same offset on every rank, which it returns;
  // the buffer and its heap address are then one memory. The buffer must be
  // CUDA VMM memory (cuMemCreate; exportable as a POSIX file descriptor with
  // one process per rank) starting at the same offset within its granule on
  // every rank. The heap holds the memory until deregister(), even if its
  // owner frees it first. Registered regions sit at the top of the heap, so
  // they cap how far alloc() can grow. Refused while a stream in `streams`
  // captures a CUDA graph. `call`: how the ranks' call records and errors
  // name it (a caller that registers on its users' behalf names their call).
  // `failed_before`: with one process per rank, a failure of this rank's
  // before the call (making the buffer): it still takes part, and every rank
  // refuses together with that error's code, naming it.
  size_t register_memory(const std::vector<void*>& buffers, size_t bytes, const std::vector<cudaStream_t>& streams,
                         const char* call = "register", const LocalFailure* failed_before = nullptr);
  // Collective: unmaps the registered buffer at `offset` (what
  // register_memory returned); the owner's own mapping stays. Work that still
  // uses the heap's addresses of it must be finished. Refused while a stream
  // in `streams` captures a CUDA graph.
  void deregister(size_t offset, const std::vector<cudaStream_t>& streams = {}, const char* call = "deregister");

  int world() const { return group_.world; }
  int local_count() const { return group_.local_count(); }
  int rank(int local) const { return group_.ranks.at(local); }
  size_t capacity() const { return capacity_; }  // per rank
  size_t used() const { return allocator_.used(); }
  size_t mapped() const { return mapped_; }  // per rank, ferry's words in front included (none without them)

  // `rank`'s heap at `offset`, as mapped in this process.
  char* at(int rank, size_t offset) const;
  // The allocation holding [p, p + bytes) in any rank's heap: its rank and
  // offset. Throws naming `what` when `p` is not there.
  void locate(const void* p, size_t bytes, const char* what, int* rank, size_t* offset) const;
  // The handle kernels take (include/ferry/device/heap.cuh).
  device::Heap handle(int local) const;
  // Throws the first fault a kernel or a stream wait left (a bounded wait
  // that gave up, or a call a kernel refused), naming the rank it waited for.
  // After close(), the faults the heap had when it closed.
  void check();

  // On a stream, by copy engines (no kernel). `local`: which of this
  // process's ranks calls; `dst` / `src` / `sig`: addresses in that rank's
  // heap (the peer's copy is the one moved or signalled).
  void put(int local, void* dst, const void* src, size_t bytes, int peer, cudaStream_t stream);
  void get(int local, void* dst, const void* src, size_t bytes, int peer, cudaStream_t stream);
  // Sets the peer's copy of the 64-bit word `sig` to `value` once the stream reaches it.
  void signal(int local, uint64_t* sig, uint64_t value, int peer, cudaStream_t stream);
  // Holds the stream until this rank's `sig` is at least `value`; past the
  // timeout the wait is released and check() raises, naming `from` (-1: any).
  // Refused once the rank's fault word is set (the watcher would release it
  // at once); so is barrier_on_stream.
  void wait(int local, const uint64_t* sig, uint64_t value, int from, cudaStream_t stream);
  // Holds each local rank's stream until every rank's stream reached its
  // barrier_on_stream. Collective; one stream per local rank. With copy
  // engines (no kernel) it cannot be captured; with `kernel`, one warp per
  // rank runs the device API's barrier (capturable).
  void barrier_on_stream(const std::vector<cudaStream_t>& streams, bool kernel = false);
  // Holds `stream` until every put, get and signal local rank `local` made
  // through the heap, on any stream, has completed (each on the copy engine
  // that carried it, so the peer can see it); no kernel. Those made on
  // `stream` itself are before it already. Calls captured in a CUDA graph
  // are ordered by the graph; a capturing `stream` is refused.
  void quiet(int local, cudaStream_t stream);

 private:
  struct Chunk {
    CUmemGenericAllocationHandle handle = 0;
    CUdeviceptr ptr = 0;
    size_t size = 0;
  };
  // A registered buffer: its region in the allocator and every rank's pieces mapped there.
  struct Registration {
    size_t data_offset = 0;  // the buffer's offset, from the region's start
    size_t bytes = 0;
    std::vector<Chunk> chunks;
  };
  // A stream wait the watcher bounds.
  struct Watched {
    int local;
    cudaEvent_t reached;  // recorded before the wait
    cudaEvent_t passed;   // recorded after it
    uint64_t* word;
    uint64_t value;
    int from;
    const char* what;
    double deadline;  // steady clock, seconds; 0 until the stream reached the wait
  };

  SymmetricHeap() = default;
  // The collective call check. `local`: a failure this rank found before
  // the call's exchange; it goes to the peers as a refusal, so that every
  // rank throws in the same call and the ranks' call counts stay in step.
  void agree(const std::string& what, const LocalFailure* local = nullptr);
  HeapFault fault_of(int local) const;  // what local rank's fault word says now
  void refuse_if_faulted(int local, const char* what) const;
  void grow(size_t end);   // maps [mapped_, end) on every rank
  size_t ceiling() const;  // how far the mapped prefix may grow: below every registration
  void map_chunk(std::vector<Chunk>& into, CUdeviceptr at, size_t size, CUmemGenericAllocationHandle handle,
                 const std::vector<int>& access);
  static void unmap_chunks(std::vector<Chunk>& chunks);
  void check_local(int local, const char* what) const;
  // The offset of [p, p + bytes) in local rank `local`'s own heap; throws naming `what` elsewhere.
  size_t own_offset(int local, const void* p, size_t bytes, const char* what) const;
  void check_words(const char* what) const;     // refuses `what` on a heap of memory only
  void issued(int local, cudaStream_t stream);  // after a put, get or signal on `stream` (quiet)
  void watch(int local, const uint64_t* word, uint64_t value, int from, const char* what, cudaStream_t stream);
  void watcher_loop();

  Group group_;
  size_t capacity_ = 0;
  size_t granularity_ = 0;
  size_t min_chunk_ = 0;
  size_t mapped_ = 0;
  CUdeviceptr base_ = 0;
  HeapAllocator allocator_{2 * device::kHeapReservedBytes, device::kHeapReservedBytes};
  std::vector<Chunk> chunks_;
  std::map<size_t, Registration> registrations_;  // by region start
  std::vector<unsigned long long*> fault_;        // by local rank, pinned host words
  std::vector<uint64_t> barrier_generation_;      // by local rank, barrier_on_stream
  std::vector<unsigned> staging_next_;            // by local rank
  uint64_t calls_ = 0;
  bool closed_ = false;
  HeapFault fault_at_close_;                   // what check() raises once closed
  bool words_ = true;                          // create(words): ferry's own words zeroed and usable
  size_t front_ = device::kHeapReservedBytes;  // where allocations start: after the words, or 0 without them

  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  std::vector<Watched> watched_;
  // By local rank: events of finished waits, reused: a barrier on a stream
  // watches one wait per peer, and making two events for each was most of its host time.
  std::vector<std::vector<cudaEvent_t>> spare_events_;
  bool stop_watcher_ = false;
  std::thread watcher_;
  // By local rank: the stream that releases a wait past its deadline (made with
  // the heap, not when a wait is already stuck) and the pinned words it copies from.
  std::vector<cudaStream_t> rescue_;
  std::vector<uint64_t*> rescue_values_;
  // By local rank: for each stream a put, get or signal went on whose
  // latest one may not have landed yet, an event recorded after that one
  // (quiet waits for these).
  std::mutex issued_mu_;
  std::vector<std::map<unsigned long long, cudaEvent_t>> issued_;  // by stream id (cudaStreamGetId)
};

}  // namespace ferry
