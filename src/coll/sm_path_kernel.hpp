// Launching the SM path's kernel (coll/sm_path.hpp says what it does).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "coll/kernel_wait.hpp"
#include "coll/sm_path.hpp"

namespace ferry {

struct SmPathWindows {
  char* base[kSmPathMaxRanks];  // each rank's window, as mapped on this GPU
};

void launch_sm_path(const SmPathStep& s, const SmPathWindows& w, size_t slot_bytes, const KernelWait& c,
                    cudaStream_t stream);
// Loads the kernel now (see load_local_copy_kernels for why).
void load_sm_path_kernels();
// Blocks of the SM path's kernel that GPU `device` holds at once (its
// heaviest instantiation's occupancy times the GPU's SMs).
int sm_path_resident_blocks(int device);

}  // namespace ferry
