// Which copies the LD_PRELOAD library hands to the multipath engine
// (src/preload/route.h).
#include <gtest/gtest.h>

#include "preload/route.h"

TEST(PreloadRoute, HostDeviceCopiesFromTheThreshold) {
  const size_t MiB = size_t{1} << 20;
  EXPECT_TRUE(ferry_preload_routes(8 * MiB, cudaMemcpyHostToDevice, 8 * MiB));
  EXPECT_TRUE(ferry_preload_routes(64 * MiB, cudaMemcpyDeviceToHost, 8 * MiB));
  EXPECT_TRUE(ferry_preload_routes(64 * MiB, cudaMemcpyDefault, 8 * MiB));  // the engine looks at the pointers
  EXPECT_FALSE(ferry_preload_routes(8 * MiB - 1, cudaMemcpyHostToDevice, 8 * MiB));
  EXPECT_FALSE(ferry_preload_routes(64 * MiB, cudaMemcpyDeviceToDevice, 8 * MiB));
  EXPECT_FALSE(ferry_preload_routes(64 * MiB, cudaMemcpyHostToHost, 8 * MiB));
  EXPECT_FALSE(ferry_preload_routes(0, cudaMemcpyHostToDevice, 0));
}

TEST(PreloadRoute, ThresholdFromTheEnvironment) {
  EXPECT_EQ(ferry_preload_min_bytes(nullptr, 7), 7u);
  EXPECT_EQ(ferry_preload_min_bytes("", 7), 7u);
  EXPECT_EQ(ferry_preload_min_bytes("1048576", 7), 1048576u);
  EXPECT_EQ(ferry_preload_min_bytes("1M", 7), 7u);  // not a plain integer: the default
  EXPECT_EQ(ferry_preload_min_bytes("-5", 7), 7u);
  // Past 64 bits: the default, not the wrapped remainder (1 for 18446744073709551617, which would route every copy).
  EXPECT_EQ(ferry_preload_min_bytes("18446744073709551617", 7), 7u);
  EXPECT_EQ(ferry_preload_min_bytes("18446744073709551615", 7), SIZE_MAX);
  // 0 is a value, as for the engine's knob (its range starts at 0): every nonzero copy routes.
  EXPECT_EQ(ferry_preload_min_bytes("0", 7), 0u);
  EXPECT_TRUE(ferry_preload_routes(1, cudaMemcpyHostToDevice, ferry_preload_min_bytes("0", 7)));
}

TEST(PreloadRoute, EngineFailuresAsCudaErrors) {
  EXPECT_EQ(ferry_preload_cuda_error(FERRY_SUCCESS), cudaSuccess);
  EXPECT_EQ(ferry_preload_cuda_error(FERRY_ERROR_TIMEOUT), cudaErrorTimeout);
  EXPECT_EQ(ferry_preload_cuda_error(FERRY_ERROR_OUT_OF_MEMORY), cudaErrorMemoryAllocation);
  EXPECT_EQ(ferry_preload_cuda_error(FERRY_ERROR_NO_GPU), cudaErrorNoDevice);
  EXPECT_EQ(ferry_preload_cuda_error(FERRY_ERROR_UNSUPPORTED), cudaErrorNotSupported);
  // A failure with no CUDA counterpart is still a failure, never success.
  for (ferry_result_t r : {FERRY_ERROR_CUDA, FERRY_ERROR_SYSTEM, FERRY_ERROR_BROKEN, FERRY_ERROR_INTERNAL})
    EXPECT_EQ(ferry_preload_cuda_error(r), cudaErrorUnknown);
}
