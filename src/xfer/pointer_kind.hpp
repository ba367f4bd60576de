// What CUDA knows of a pointer: the one classification that page transfers
// and multipath copies both decide on.
#pragma once

namespace ferry {
namespace xfer {

enum class MemKind { kPageable, kPinnedHost, kDevice, kManaged };

struct PointerKind {
  MemKind kind = MemKind::kPageable;
  int device = -1;                 // the GPU of device memory
  void* device_pointer = nullptr;  // pinned host memory's address as a GPU sees it
};

// Pageable where CUDA does not know the pointer.
PointerKind pointer_kind(const void* p);

}  // namespace xfer
}  // namespace ferry
