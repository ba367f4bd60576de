// The one kernel in ferry: copying a rank's own block within its GPU. A
// copy-engine copy inside one GPU is far slower than an SM copy (see
// docs/architecture.md), so the local block of an out-of-place collective uses
// this kernel unless the caller asks for the copy engine (no SM at all) or the
// call is in-place (nothing to copy).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace ferry {

void launch_local_copy(void* dst, const void* src, size_t bytes, cudaStream_t stream);

}  // namespace ferry
