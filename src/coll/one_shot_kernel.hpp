// Launching the SM path's kernel (coll/one_shot.hpp says what it does).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "coll/kernel_wait.hpp"
#include "coll/one_shot.hpp"

namespace ferry {

struct OneShotWindows {
  char* base[kOneShotMaxRanks];  // each rank's window, as mapped on this GPU
};

void launch_one_shot(const OneShotStep& s, const OneShotWindows& w, size_t slot_bytes, const KernelWait& c,
                     cudaStream_t stream);
// Loads the kernel now (see load_local_copy_kernels for why).
void load_one_shot_kernels();

}  // namespace ferry
