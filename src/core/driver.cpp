#include "core/driver.hpp"

#include <cuda_runtime_api.h>

#include <mutex>

#include "core/error.hpp"

namespace ferry {
namespace {

// The driver ABI version we ask each symbol for: CUDA 12.0 semantics (the _v2
// stream memory operations, 64-bit address ranges).
constexpr int kDriverAbiVersion = 12000;

template <typename Fn>
void resolve(const char* name, Fn* fn) {
  void* ptr = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  cudaError_t err = cudaGetDriverEntryPointByVersion(name, &ptr, kDriverAbiVersion, cudaEnableDefault, &status);
  if (err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice || err == cudaErrorInitializationError) {
    throw_error(FERRY_ERROR_NO_GPU,
                std::string("cannot load the CUDA driver (") + cudaGetErrorString(err) + "). " + driver_missing_hint());
  }
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || ptr == nullptr) {
    throw_error(FERRY_ERROR_UNSUPPORTED, std::string("the installed CUDA driver has no entry point ") + name +
                                             " (ferry needs a CUDA 12.0 or newer driver)");
  }
  *fn = reinterpret_cast<Fn>(ptr);
}

DriverApi load() {
  DriverApi api{};
  resolve("cuGetErrorName", &api.GetErrorName);
  resolve("cuMemCreate", &api.MemCreate);
  resolve("cuMemRelease", &api.MemRelease);
  resolve("cuMemAddressReserve", &api.MemAddressReserve);
  resolve("cuMemAddressFree", &api.MemAddressFree);
  resolve("cuMemMap", &api.MemMap);
  resolve("cuMemUnmap", &api.MemUnmap);
  resolve("cuMemSetAccess", &api.MemSetAccess);
  resolve("cuMemGetAllocationGranularity", &api.MemGetAllocationGranularity);
  resolve("cuMemExportToShareableHandle", &api.MemExportToShareableHandle);
  resolve("cuMemImportFromShareableHandle", &api.MemImportFromShareableHandle);
  resolve("cuMemGetAddressRange", &api.MemGetAddressRange);
  resolve("cuMemRetainAllocationHandle", &api.MemRetainAllocationHandle);
  resolve("cuMemGetAllocationPropertiesFromHandle", &api.MemGetAllocationPropertiesFromHandle);
  resolve("cuPointerGetAttribute", &api.PointerGetAttribute);
  resolve("cuStreamWaitValue64", &api.StreamWaitValue64);
  resolve("cuStreamWriteValue64", &api.StreamWriteValue64);
  resolve("cuStreamBatchMemOp", &api.StreamBatchMemOp);
  resolve("cuDeviceGetAttribute", &api.DeviceGetAttribute);
  resolve("cuDriverGetVersion", &api.DriverGetVersion);
  return api;
}

}  // namespace

const DriverApi& driver() {
  static std::once_flag once;
  static DriverApi api;
  static std::string failure;
  static ferry_result_t failure_code = FERRY_SUCCESS;
  std::call_once(once, [] {
    try {
      api = load();
    } catch (const Error& e) {
      failure = e.what();
      failure_code = e.code();
    }
  });
  if (failure_code != FERRY_SUCCESS) throw_error(failure_code, failure);
  return api;
}

bool driver_available() {
  int version = 0;
  return cudaDriverGetVersion(&version) == cudaSuccess && version > 0;
}

std::string driver_missing_hint() {
  return "ferry moves data with NVIDIA GPUs' copy engines and needs an NVIDIA driver (libcuda.so.1) "
         "and at least one visible GPU; CPU-only parts (topology files, the selector, bootstrap) work without one";
}

std::string driver_error_name(int result) {
  const char* name = nullptr;
  try {
    if (driver().GetErrorName(static_cast<CUresult>(result), &name) == CUDA_SUCCESS && name) return name;
  } catch (const Error&) {
  }
  return "CUresult " + std::to_string(result);
}

}  // namespace ferry
