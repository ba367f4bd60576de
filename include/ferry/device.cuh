/* Triggering a prepared ferry collective from inside a CUDA kernel.
 *
 *   ferry_trigger_t t;                       // from ferry_device_trigger() (C) or
 *   ferry_device_trigger(comm, h, 0, &t);    // handle.device_trigger() (Python)
 *   my_gemm<<<grid, block, 0, stream>>>(..., t);
 *
 *   __global__ void my_gemm(..., ferry_trigger_t t) {
 *     ... compute, write the collective's input ...
 *     ferry_device_trigger_fire(t);  // once, by one thread, after the input is written
 *   }
 *
 * The fence makes every store this thread made before it visible to the copy
 * engines before the trigger word changes. Stores by other threads of the
 * kernel must be ordered first (e.g. __syncthreads() and a last-block-done
 * counter, or fire from the kernel's last block). */
#ifndef FERRY_DEVICE_CUH_
#define FERRY_DEVICE_CUH_

#include "ferry/ferry.h"

__device__ inline void ferry_device_trigger_fire(ferry_trigger_t t) {
  __threadfence_system();
  *reinterpret_cast<volatile unsigned long long*>(t.word) = t.value;
  __threadfence_system();
}

#endif /* FERRY_DEVICE_CUH_ */
