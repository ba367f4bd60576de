// The symmetric heap's decisions, as pure functions and one pure class, so
// that the CPU tests run them: where an allocation lies, how far the mapped
// part of the heap grows, whether every rank made the same call.
//
// Every rank runs the same allocator on the same sequence of calls, so each
// allocation lands at the same offset in every rank's heap. No offsets are
// exchanged, and a peer's copy of an object is that peer's heap base plus the
// object's offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ferry {

// Allocations are whole multiples of this (and at least one: a zero-byte
// allocation still gets an address of its own).
constexpr size_t kHeapUnit = 256;

class HeapAllocator {
 public:
  // [reserved_front, capacity) is handed out; the front holds ferry's own words.
  HeapAllocator(size_t capacity, size_t reserved_front);

  // First fit at the lowest offset that is a multiple of `align` (a power of
  // two; at least kHeapUnit is used). Throws FERRY_ERROR_OUT_OF_MEMORY naming
  // the capacity knob when nothing fits, FERRY_ERROR_INVALID_ARGUMENT for a bad
  // alignment. Returns the offset.
  size_t alloc(size_t bytes, size_t align);
  // As alloc(), at the highest offset that fits (registered memory goes to
  // the top, away from the mapped prefix that alloc() grows).
  size_t alloc_top(size_t bytes, size_t align);
  // `offset` must be the start of a live allocation (else INVALID_ARGUMENT).
  void free(size_t offset);
  // The live allocation holding [offset, offset + bytes): true and its start
  // and size, else false.
  bool find(size_t offset, size_t bytes, size_t* start, size_t* size) const;

  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }  // bytes in live allocations, rounded as allocated
  size_t live_count() const { return live_.size(); }

 private:
  [[noreturn]] void exhausted(size_t bytes, size_t align) const;
  size_t take(std::map<size_t, size_t>::iterator it, size_t start, size_t need);

  size_t capacity_;
  size_t front_;
  size_t used_ = 0;
  std::map<size_t, size_t> live_;  // start -> size
  std::map<size_t, size_t> free_;  // start -> size, neighbours merged
};

// Bytes of a request as the allocator takes them (a whole number of units,
// at least one); 0 when the request overflows.
size_t heap_rounded_bytes(size_t bytes);

// The heap maps physical memory as one growing prefix [0, mapped). To cover
// [0, need_end): unchanged when already covered, else need_end rounded up to
// `granularity` and grown by at least `min_chunk`, never past `capacity`.
size_t heap_mapped_end(size_t mapped, size_t need_end, size_t granularity, size_t min_chunk, size_t capacity);

// The heap's capacity: `requested` (0: `knob_default`) rounded up to `granularity`.
size_t heap_capacity(size_t requested, size_t knob_default, size_t granularity);

// Registering memory that CUDA's virtual memory management made (not the
// heap's own): each rank's buffer lies in one or more whole physical
// allocations ("pieces", mapped only whole), and its first byte `lead` bytes
// into the first. The heap maps every rank's pieces back to back into one
// region at the same offset of each rank's heap, each rank's shifted by whole
// granules so that the buffer's first byte sits at the same offset on every
// rank.
struct RegistrationSpan {
  size_t lead = 0;             // the buffer's first byte, from the first piece's start
  std::vector<size_t> pieces;  // sizes of the allocations under the buffer, in address order
};
struct RegistrationPlan {
  size_t region_bytes = 0;    // the heap region every rank's pieces go into
  size_t data_offset = 0;     // the buffer's first byte, from the region's start, on every rank
  std::vector<size_t> shift;  // by rank: where its first piece goes, from the region's start
  std::string error;          // non-empty: why it cannot be registered, naming ranks
};
// `spans` by rank; `bytes`: the buffer's size on every rank; `granularity`:
// the alignment a mapping needs.
RegistrationPlan plan_registration(const std::vector<RegistrationSpan>& spans, size_t bytes, size_t granularity);

// What a rank tells its peers about a buffer it registers, as one string
// (the unit of the bootstrap's all-gather): memory that CUDA's virtual memory
// management made ('V': its size and span), memory shared through CUDA IPC
// ('I': the handle's bytes, opaque), or why it cannot be registered ('!').
struct RegistrationRecord {
  char kind = 0;  // 'V', 'I' or '!'
  size_t bytes = 0;
  RegistrationSpan span;  // 'V'
  std::string ipc;        // 'I'
  std::string error;      // '!'
  int code = 1;           // '!': its ferry_result_t (FERRY_ERROR_INVALID_ARGUMENT unless said)
};
std::string encode_registration(const RegistrationRecord& r);
// Throws FERRY_ERROR_INTERNAL naming `rank` when `s` is not a record.
RegistrationRecord decode_registration(const std::string& s, int rank);

// The record a rank gives for a collective heap call, and the check that
// every rank gave the same one. `records` is by rank; returns "" when they
// agree, else a message naming the ranks that differ and what each called.
std::string heap_call_record(uint64_t call, const std::string& what);
std::string heap_calls_mismatch(const std::vector<std::string>& records);

// What a fault word (include/ferry/device/heap.cuh: a bounded wait that gave
// up, or a call that could not run) left by `rank` means: its error code and
// message, naming the rank waited for. `code` 0: no fault in `word`.
struct HeapFault {
  int code = 0;
  std::string message;
};
HeapFault heap_fault(uint64_t word, int rank, double timeout_s);

}  // namespace ferry
