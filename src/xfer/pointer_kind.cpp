#include "xfer/pointer_kind.hpp"

#include <cuda_runtime_api.h>

namespace ferry {
namespace xfer {

PointerKind pointer_kind(const void* p) {
  PointerKind k;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // an unknown pointer is not an error of the call
    return k;
  }
  switch (a.type) {
    case cudaMemoryTypeDevice:
      k.kind = MemKind::kDevice;
      k.device = a.device;
      break;
    case cudaMemoryTypeHost:
      k.kind = MemKind::kPinnedHost;
      k.device_pointer = a.devicePointer;
      break;
    case cudaMemoryTypeManaged:
      k.kind = MemKind::kManaged;
      k.device = a.device;
      break;
    default:
      break;
  }
  return k;
}

}  // namespace xfer
}  // namespace ferry
