// Device memory that peers can map: CUDA VMM allocations exported as POSIX
// file descriptors, and existing cudaMalloc allocations shared through CUDA IPC.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <vector>

namespace ferry {

// A VMM allocation mapped in this process.
struct VmmMapping {
  CUmemGenericAllocationHandle handle = 0;
  CUdeviceptr ptr = 0;
  size_t size = 0;  // mapped size (a multiple of the granularity)
};

// The properties of a pinned VMM allocation on `device` (a POSIX fd handle when `exportable`).
CUmemAllocationProp vmm_prop(int device, bool exportable);
// Read and write access to [ptr, ptr + size) for each distinct GPU in `devices`.
void vmm_set_access(CUdeviceptr ptr, size_t size, const std::vector<int>& devices);

// Allocates `bytes` on `device`, exportable as a POSIX fd (when `exportable`),
// mapped and readable/writable by every device in `access_devices`.
VmmMapping vmm_allocate(int device, size_t bytes, bool exportable, const std::vector<int>& access_devices);
void vmm_release(VmmMapping& m);

// CUDA IPC for memory from cudaMalloc (the PyTorch caching allocator's).
struct IpcExport {
  cudaIpcMemHandle_t handle;
  unsigned long long offset;  // of the registered pointer within its allocation
  unsigned long long base_size;
};
IpcExport ipc_export(const void* ptr);
// Opens a peer's allocation on the current device; returns its base address.
void* ipc_open(const cudaIpcMemHandle_t& handle);
void ipc_close(void* base);

// Which kind of memory a pointer is; throws a clear error for host memory or
// memory on a device other than `expected_device`. `what` names the argument.
void check_device_pointer(const void* ptr, int expected_device, const char* what);

}  // namespace ferry
