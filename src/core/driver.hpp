// Lazily resolved CUDA driver entry points. The library never links libcuda:
// cudart_static opens it on first use, and each driver function we need is
// looked up through cudaGetDriverEntryPointByVersion. On a machine with no
// driver, the first GPU call fails with a message that says so.
#pragma once

#include <cuda.h>

#include <string>

namespace ferry {

struct DriverApi {
  decltype(&::cuGetErrorName) GetErrorName;
  decltype(&::cuMemCreate) MemCreate;
  decltype(&::cuMemRelease) MemRelease;
  decltype(&::cuMemAddressReserve) MemAddressReserve;
  decltype(&::cuMemAddressFree) MemAddressFree;
  decltype(&::cuMemMap) MemMap;
  decltype(&::cuMemUnmap) MemUnmap;
  decltype(&::cuMemSetAccess) MemSetAccess;
  decltype(&::cuMemGetAllocationGranularity) MemGetAllocationGranularity;
  decltype(&::cuMemExportToShareableHandle) MemExportToShareableHandle;
  decltype(&::cuMemImportFromShareableHandle) MemImportFromShareableHandle;
  decltype(&::cuMemGetAddressRange) MemGetAddressRange;
  decltype(&::cuMemRetainAllocationHandle) MemRetainAllocationHandle;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) MemGetAllocationPropertiesFromHandle;
  decltype(&::cuPointerGetAttribute) PointerGetAttribute;
  decltype(&::cuStreamWaitValue64) StreamWaitValue64;
  decltype(&::cuStreamWriteValue64) StreamWriteValue64;
  decltype(&::cuStreamBatchMemOp) StreamBatchMemOp;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute;
  decltype(&::cuDriverGetVersion) DriverGetVersion;
};

// Resolves all entry points on first call (thread-safe); throws ferry::Error
// with FERRY_ERROR_NO_GPU when no driver can be loaded.
const DriverApi& driver();

// True when a CUDA driver can be loaded; never throws.
bool driver_available();

// A sentence for users on machines without a driver or GPU.
std::string driver_missing_hint();

// "CUDA_ERROR_X" for a driver result, usable even when the driver is missing.
std::string driver_error_name(int result);

}  // namespace ferry
