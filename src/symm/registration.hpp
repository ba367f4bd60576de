// Device memory that CUDA's virtual memory management made (cuMemCreate:
// PyTorch's allocator with expandable segments, NCCL's, a ferry heap's), as
// the physical allocations under a buffer, so that the symmetric heap can map
// them a second time at its own addresses (SymmetricHeap::register_memory).
// Memory from cudaMalloc has no such handle and cannot be mapped twice.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/group.hpp"

namespace ferry {

struct VmmPiece {
  CUmemGenericAllocationHandle handle = 0;  // retained: one cuMemRelease owed
  CUdeviceptr start = 0;                    // where the owner mapped it
  size_t size = 0;
};

struct VmmBuffer {
  std::vector<VmmPiece> pieces;  // in address order, back to back
  size_t lead = 0;               // the buffer's first byte, from the first piece's start
  bool exportable = false;       // every piece can travel as a POSIX file descriptor
};

// Whether `ptr` lies in memory that CUDA's virtual memory management mapped.
bool is_vmm_memory(const void* ptr);
// The allocations under [ptr, ptr + bytes), each retained. Each is taken to
// be mapped whole from its start, as PyTorch, NCCL and ferry map theirs (a
// mapping of part of an allocation would be mapped again from its start). Throws
// FERRY_ERROR_INVALID_ARGUMENT naming `what` when the memory is not VMM
// memory of GPU `device`, or not mapped throughout.
VmmBuffer find_vmm_buffer(const void* ptr, size_t bytes, int device, const char* what);
// Releases the retained handles (nothing else: the owner's mapping stays).
void release_vmm_buffer(VmmBuffer& b);

// A peer's registered buffer as mapped in this process: its pieces back to
// back in an address range of their own (the buffer starts `lead` bytes in).
struct VmmView {
  CUdeviceptr base = 0;
  size_t size = 0;    // the range reserved: every piece's size
  size_t mapped = 0;  // the pieces mapped so far
  std::vector<std::pair<CUmemGenericAllocationHandle, size_t>> pieces;
};
// Reserves the range for pieces of `sizes`.
VmmView vmm_view_reserve(const std::vector<size_t>& sizes);
// Maps the next piece (its handle now owned by the view) for `device`.
void vmm_view_map(VmmView& v, CUmemGenericAllocationHandle handle, size_t size, int device);
// Unmaps and releases every piece and frees the range; never throws.
void vmm_view_release(VmmView& v);

// A failure on this rank alone in the middle of a collective step (making
// or mapping memory the ranks share): the rank keeps taking part in the
// exchanges, then all learn of it together.
class LocalFailure {
 public:
  // Runs `step` unless an earlier one failed; keeps the first failure.
  void run(const std::function<void()>& step);
  bool failed() const { return static_cast<bool>(error_); }
  const std::string& message() const { return message_; }
  // Its ferry_result_t (FERRY_ERROR_INTERNAL for an exception not ferry's).
  int code() const { return code_; }
  // With one process per rank, collective: every rank says how it went. The
  // rank that failed throws its own error; the others throw one of the same
  // code, naming the first rank that failed and quoting its message.
  void agree(const Group& group, const char* what) const;
  // Throws the failure, if any (one process for every rank: no peer to tell).
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
  std::string message_;
  int code_ = 0;
};

// With one process per rank, collective over the group: sends `mine` (this
// rank's pieces exported as POSIX file descriptors, in order; the caller
// keeps them) to every peer and imports every peer's, in messages of at most
// kMaxFdsPerMessage. `counts`, by rank: how many pieces each rank sends (the
// same vector on every rank, so every rank exchanges the same number of
// messages). `take(rank, index, handle)` receives each imported piece and owns
// its handle from then on. Every descriptor received is closed here. A piece
// that cannot be imported or taken is `failure`'s: the exchange goes on, and
// nothing more is imported or taken. `what` names the memory in errors.
void exchange_vmm_pieces(const Group& group, const std::vector<int>& mine, const std::vector<size_t>& counts,
                         const std::function<void(int, size_t, CUmemGenericAllocationHandle)>& take,
                         LocalFailure& failure, const std::string& what = "registered memory");

}  // namespace ferry
