// The C API of the symmetric heap (include/ferry/symm.h): a thin shim over src/symm/.
#include <cstring>
#include <memory>
#include <vector>

#include "capi/comm_handle.hpp"
#include "capi/guarded.hpp"
#include "ferry/symm.h"
#include "symm/heap.hpp"

struct ferry_heap {
  std::unique_ptr<ferry::SymmetricHeap> impl;
};

namespace {

using ferry::capi::guarded;

ferry::SymmetricHeap& get_heap(ferry_heap_t heap) {
  if (!heap || !heap->impl) ferry::throw_error(FERRY_ERROR_INVALID_ARGUMENT, "heap is NULL or destroyed");
  return *heap->impl;
}

}  // namespace

ferry_result_t ferry_heap_create(ferry_comm_t comm, size_t capacity, ferry_heap_t* heap) {
  return guarded([&] {
    FERRY_ARG_CHECK(heap != nullptr, "heap is NULL");
    *heap = nullptr;  // a caller that destroys it after a failure destroys nothing
    auto impl = ferry::SymmetricHeap::create(ferry::capi::get(comm).group(), capacity);
    *heap = new ferry_heap{std::move(impl)};
  });
}

void ferry_heap_destroy(ferry_heap_t heap) { delete heap; }

ferry_result_t ferry_heap_alloc(ferry_heap_t heap, size_t bytes, size_t align, ferry_stream_t stream, void** ptrs) {
  return guarded([&] {
    ferry::SymmetricHeap& h = get_heap(heap);
    FERRY_ARG_CHECK(ptrs != nullptr, "ptrs is NULL");
    const size_t offset = h.alloc(bytes, align, {static_cast<cudaStream_t>(stream)});
    for (int i = 0; i < h.local_count(); ++i) ptrs[i] = h.at(h.rank(i), offset);
  });
}

ferry_result_t ferry_heap_free(ferry_heap_t heap, const void* ptr) {
  return guarded([&] {
    ferry::SymmetricHeap& h = get_heap(heap);
    int rank = 0;
    size_t offset = 0;
    h.locate(ptr, 1, "ptr", &rank, &offset);
    h.free(offset);
  });
}

ferry_result_t ferry_heap_reserve(ferry_heap_t heap, size_t bytes) {
  return guarded([&] { get_heap(heap).reserve(bytes); });
}

ferry_result_t ferry_heap_register(ferry_heap_t heap, void* const* buffers, size_t bytes, ferry_stream_t stream,
                                   void** ptrs) {
  return guarded([&] {
    ferry::SymmetricHeap& h = get_heap(heap);
    FERRY_ARG_CHECK(buffers != nullptr, "buffers is NULL");
    FERRY_ARG_CHECK(ptrs != nullptr, "ptrs is NULL");
    const size_t offset = h.register_memory(std::vector<void*>(buffers, buffers + h.local_count()), bytes,
                                            {static_cast<cudaStream_t>(stream)});
    for (int i = 0; i < h.local_count(); ++i) ptrs[i] = h.at(h.rank(i), offset);
  });
}

ferry_result_t ferry_heap_deregister(ferry_heap_t heap, const void* ptr) {
  return guarded([&] {
    ferry::SymmetricHeap& h = get_heap(heap);
    int rank = 0;
    size_t offset = 0;
    h.locate(ptr, 1, "ptr", &rank, &offset);
    h.deregister(offset, {});
  });
}

ferry_result_t ferry_heap_handle(ferry_heap_t heap, int local, void* handle, size_t size) {
  return guarded([&] {
    FERRY_ARG_CHECK(handle != nullptr, "handle is NULL");
    FERRY_ARG_CHECK(size >= sizeof(ferry::device::Heap), "size is " + std::to_string(size) + "; expected at least " +
                                                             std::to_string(sizeof(ferry::device::Heap)));
    const ferry::device::Heap h = get_heap(heap).handle(local);
    std::memcpy(handle, &h, sizeof h);  // `handle` need not be aligned
  });
}

size_t ferry_heap_handle_size(void) { return sizeof(ferry::device::Heap); }

ferry_result_t ferry_heap_check(ferry_heap_t heap) {
  return guarded([&] { get_heap(heap).check(); });
}

ferry_result_t ferry_heap_sizes(ferry_heap_t heap, size_t* capacity, size_t* used, size_t* mapped) {
  return guarded([&] {
    ferry::SymmetricHeap& h = get_heap(heap);
    if (capacity) *capacity = h.capacity();
    if (used) *used = h.used();
    if (mapped) *mapped = h.mapped();
  });
}
