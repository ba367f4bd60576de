// A communicator's device memory, every rank's mapped in this process: its
// symmetric heap (the ready, done and gate flags, the SM path's windows, the
// scratch) and the buffers users allocate or register for collectives to
// write into. Everything that creates memory is collective, like the calls
// that need it: every rank makes the same calls in the same order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "bootstrap/group.hpp"
#include "coll/flags.hpp"
#include "coll/sm_path_kernel.hpp"
#include "symm/heap.hpp"
#include "symm/peer_buffer.hpp"
#include "symm/registration.hpp"

namespace ferry {

class CollectiveMemory {
 public:
  // A buffer peers write into: from allocate() (on the heap, ferry frees
  // it) or register_buffers() (the caller's memory: with one process per
  // rank, peers' VMM memory is imported piece by piece, cudaMalloc memory
  // opened by CUDA IPC).
  struct Registration {
    uint32_t id = 0;
    bool owned = false;          // from allocate(): ferry frees it
    size_t heap_offset = 0;      // owned: where the heap holds it
    std::vector<char*> base;     // by rank, as mapped in this process
    std::vector<size_t> size;    // by rank
    std::vector<void*> ipc;      // to close on close
    std::vector<VmmView> views;  // peers' registered VMM memory, to unmap on close
  };
  // A block of the heap at the same offset on every rank.
  struct ScratchBlock {
    size_t offset = 0;
    size_t bytes = 0;
  };

  // Collective: the heap, the flags zeroed, and the SM path's windows
  // (FERRY_SM_BYTES per source slot, the same on every rank; none when 0 or
  // for worlds larger than the SM path takes). The group's bootstrap must
  // outlive it.
  static std::unique_ptr<CollectiveMemory> create(const Group& group);
  ~CollectiveMemory();
  CollectiveMemory(const CollectiveMemory&) = delete;
  CollectiveMemory& operator=(const CollectiveMemory&) = delete;
  // Not collective: releases this process's mappings, without waiting for work
  // that still uses them (the caller's to finish first).
  void close();

  // `rank`'s ready, done and gate flags (GPU memory).
  DeviceFlags* device_flags(int rank) const {
    return reinterpret_cast<DeviceFlags*>(heap_->at(rank, device_flags_offset_));
  }
  const SmPathWindows& sm_path_windows() const { return sm_path_windows_; }
  // Bytes per source slot of a window; 0: no SM path.
  size_t sm_path_slot_bytes() const { return sm_path_blocks_.slot_bytes; }
  // Data bytes per block of the SM path (FERRY_SM_LL_BLOCK_BYTES, FERRY_SM_BLOCK_BYTES).
  const SmPathBlocks& sm_path_blocks() const { return sm_path_blocks_; }

  // The scratch, if it holds at least `bytes` per rank.
  const ScratchBlock* find_scratch(size_t bytes) const;
  // The scratch, grown to hold `bytes` per rank (collective when it grows).
  // An older, smaller block stays allocated until close: graphs and prepared
  // collectives may still point at it.
  const ScratchBlock& scratch(size_t bytes);
  char* scratch_at(int rank, const ScratchBlock& b) const { return heap_->at(rank, b.offset); }

  // The registration holding [ptr, ptr + bytes) on `rank`, or null.
  const Registration* find(int rank, const void* ptr, size_t bytes) const;
  // The registration that starts at `ptr` on the first local rank, or null.
  Registration* starting_at(const void* ptr);
  // Collective: `bytes` on every rank at the same heap offset, mapped for every rank.
  Registration& allocate(size_t bytes);
  // Collective: the callers' buffers (one per local rank), opened for every
  // rank. `problem`: why this rank refuses (one process per rank: every rank
  // then refuses, naming it).
  Registration& register_buffers(const std::vector<void*>& ptrs, const std::vector<size_t>& sizes,
                                 const std::string& problem = "");
  bool multi_process() const { return group_.multi_process(); }
  // Unmaps and forgets the registration; collective for one from allocate()
  // (the heap deregisters it on every rank), local for the callers' buffers.
  void release(uint32_t id);

 private:
  CollectiveMemory() = default;
  std::vector<std::string> allgather(const std::string& mine, const char* what) const;
  // The knobs' values, after checking across processes that every rank set them alike.
  std::vector<long long> agreed_knobs(const std::vector<const char*>& names) const;
  void create_sm_path_windows();
  void unmap(Registration& reg);

  Group group_;
  std::unique_ptr<SymmetricHeap> heap_;
  size_t device_flags_offset_ = 0;
  SmPathWindows sm_path_windows_{};
  SmPathBlocks sm_path_blocks_;
  std::vector<ScratchBlock> scratch_;      // largest last
  std::list<Registration> registrations_;  // a list: references stay valid
  uint32_t next_registration_ = 1;
  bool closed_ = false;
};

}  // namespace ferry
