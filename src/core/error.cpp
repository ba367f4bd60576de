#include "core/error.hpp"

#include <cuda_runtime_api.h>

#include <cstring>

#include "core/driver.hpp"

namespace ferry {

void throw_error(ferry_result_t code, const std::string& message) { throw Error(code, message); }

void throw_cuda_error(int err, const char* expr, const char* file, int line) {
  auto e = static_cast<cudaError_t>(err);
  // Reported here: a later check of cudaGetLastError() (after a kernel
  // launch) must not find it again and blame its own call. A sticky error
  // stays whatever this does.
  cudaGetLastError();
  ferry_result_t code = FERRY_ERROR_CUDA;
  if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice) code = FERRY_ERROR_NO_GPU;
  std::string msg = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ") in " + expr + " at " + file +
                    ":" + std::to_string(line);
  if (code == FERRY_ERROR_NO_GPU) msg += ". " + driver_missing_hint();
  throw Error(code, msg);
}

void throw_cu_error(int err, const char* expr, const char* file, int line) {
  std::string msg = driver_error_name(err) + " in " + expr + " at " + file + ":" + std::to_string(line);
  throw Error(FERRY_ERROR_CUDA, msg);
}

void throw_errno(const std::string& what, int err, const char* file, int line) {
  throw Error(FERRY_ERROR_SYSTEM, what + ": " + std::strerror(err) + " at " + file + ":" + std::to_string(line));
}

}  // namespace ferry
