#include "symm/peer_buffer.hpp"

#include <string>

#include "core/driver.hpp"
#include "core/error.hpp"

namespace ferry {

CUmemAllocationProp vmm_prop(int device, bool exportable) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = exportable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

void vmm_set_access(CUdeviceptr ptr, size_t size, const std::vector<int>& devices) {
  std::vector<CUmemAccessDesc> access;
  for (int d : devices) {
    // Once per GPU (a GPU may hold several ranks: FERRY_SHARED_GPUS).
    bool seen = false;
    for (const auto& a : access) seen = seen || a.location.id == d;
    if (seen) continue;
    CUmemAccessDesc a{};
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = d;
    a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    access.push_back(a);
  }
  FERRY_CU_CHECK(driver().MemSetAccess(ptr, size, access.data(), access.size()));
}

static void map_with_access(VmmMapping& m, const std::vector<int>& devices) {
  const DriverApi& cu = driver();
  FERRY_CU_CHECK(cu.MemAddressReserve(&m.ptr, m.size, 0, 0, 0));
  FERRY_CU_CHECK(cu.MemMap(m.ptr, m.size, 0, m.handle, 0));
  vmm_set_access(m.ptr, m.size, devices);
}

VmmMapping vmm_allocate(int device, size_t bytes, bool exportable, const std::vector<int>& access_devices) {
  const DriverApi& cu = driver();
  CUmemAllocationProp prop = vmm_prop(device, exportable);
  size_t gran = 0;
  FERRY_CU_CHECK(cu.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  VmmMapping m;
  m.size = (std::max<size_t>(bytes, 1) + gran - 1) / gran * gran;
  const CUresult res = cu.MemCreate(&m.handle, m.size, &prop, 0);
  if (res == CUDA_ERROR_OUT_OF_MEMORY)
    throw_error(FERRY_ERROR_OUT_OF_MEMORY,
                "GPU " + std::to_string(device) + " is out of memory (" + std::to_string(m.size) + " bytes asked for)");
  FERRY_CU_CHECK(res);
  try {
    map_with_access(m, access_devices);
  } catch (...) {
    vmm_release(m);
    throw;
  }
  return m;
}

void vmm_release(VmmMapping& m) {
  const DriverApi& cu = driver();
  if (m.ptr) {
    cu.MemUnmap(m.ptr, m.size);
    cu.MemAddressFree(m.ptr, m.size);
  }
  if (m.handle) cu.MemRelease(m.handle);
  m = VmmMapping{};
}

IpcExport ipc_export(const void* ptr) {
  IpcExport e{};
  CUdeviceptr base = 0;
  size_t size = 0;
  FERRY_CU_CHECK(driver().MemGetAddressRange(&base, &size, reinterpret_cast<CUdeviceptr>(ptr)));
  cudaError_t err = cudaIpcGetMemHandle(&e.handle, reinterpret_cast<void*>(base));
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                std::string("register: the memory at this pointer cannot be shared with CUDA IPC (") +
                    cudaGetErrorString(err) +
                    "); it is neither cudaMalloc memory nor memory that CUDA's virtual memory management made. "
                    "Allocate it with comm.alloc() instead");
  }
  e.offset = reinterpret_cast<CUdeviceptr>(ptr) - base;
  e.base_size = size;
  return e;
}

void* ipc_open(const cudaIpcMemHandle_t& handle) {
  void* base = nullptr;
  FERRY_CUDA_CHECK(cudaIpcOpenMemHandle(&base, handle, cudaIpcMemLazyEnablePeerAccess));
  return base;
}

void ipc_close(void* base) { cudaIpcCloseMemHandle(base); }

void check_device_pointer(const void* ptr, int expected_device, const char* what) {
  FERRY_ARG_CHECK(ptr != nullptr, std::string(what) + " is a null pointer");
  cudaPointerAttributes attr{};
  cudaError_t err = cudaPointerGetAttributes(&attr, ptr);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(what) + " is not a pointer CUDA knows (" +
                                                  cudaGetErrorString(err) + "); expected device memory");
  }
  if (attr.type != cudaMemoryTypeDevice)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(what) + " points to " +
                                                  (attr.type == cudaMemoryTypeHost      ? "pinned host"
                                                   : attr.type == cudaMemoryTypeManaged ? "managed"
                                                                                        : "pageable host") +
                                                  " memory; expected device memory on GPU " +
                                                  std::to_string(expected_device));
  if (attr.device != expected_device)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(what) + " is on GPU " + std::to_string(attr.device) +
                                                  "; expected GPU " + std::to_string(expected_device));
}

}  // namespace ferry
