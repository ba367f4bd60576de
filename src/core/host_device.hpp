// FERRY_HOST_DEVICE: a function both the GPU code and the CPU tests run.
#pragma once

#ifdef __CUDACC__
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif
