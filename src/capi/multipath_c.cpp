// The C API of multipath host<->GPU copies (include/ferry/multipath.h): a thin
// shim over src/xfer/multipath.hpp.
#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "capi/guarded.hpp"
#include "ferry/multipath.h"
#include "topo/topology.hpp"
#include "xfer/multipath.hpp"

struct ferry_multipath {
  std::unique_ptr<ferry::xfer::MultipathEngine> impl;
};

ferry_result_t ferry_multipath_create(const int* devices, int count, const ferry_multipath_options_t* options,
                                      ferry_multipath_t* engine) {
  return ferry::capi::guarded([&] {
    FERRY_ARG_CHECK(engine, "engine is NULL");
    *engine = nullptr;
    FERRY_ARG_CHECK(count >= 0, "count is negative");
    FERRY_ARG_CHECK(devices || count == 0, "devices is NULL with count " + std::to_string(count));
    if (options) {
      FERRY_ARG_CHECK(options->relay_first == 0 || options->relay_first == 1,
                      "options->relay_first is " + std::to_string(options->relay_first) + "; expected 0 or 1");
      FERRY_ARG_CHECK(options->relays_idle == 0 || options->relays_idle == 1,
                      "options->relays_idle is " + std::to_string(options->relays_idle) + "; expected 0 or 1");
    }
    ferry::xfer::MultipathOptions o;
    if (count == 0) {
      int n = 0;
      FERRY_CUDA_CHECK(cudaGetDeviceCount(&n));
      for (int d = 0; d < n; ++d) o.link_devices.push_back(d);
    } else {
      o.link_devices.assign(devices, devices + count);
    }
    if (options) {
      o.chunk_bytes = options->chunk_bytes;
      o.threshold_bytes = options->min_bytes;
      if (options->outstanding) o.policy.outstanding = options->outstanding;
      o.policy.own_link_first = options->relay_first == 0;
      o.timeout_s = options->timeout_s;
      if (options->relays_idle) o.processes_on = ferry::gpu_compute_processes;
    }
    *engine = new ferry_multipath{std::make_unique<ferry::xfer::MultipathEngine>(o)};
  });
}

ferry_result_t ferry_multipath_copy(ferry_multipath_t engine, void* dst, const void* src, size_t bytes,
                                    ferry_stream_t stream, int* multipath) {
  return ferry::capi::guarded([&] {
    FERRY_ARG_CHECK(engine && engine->impl, "engine is NULL or destroyed");
    int current = 0;  // a default stream is the current GPU's, as in cudaMemcpyAsync
    FERRY_CUDA_CHECK(cudaGetDevice(&current));
    auto r = engine->impl->copy(dst, src, bytes, static_cast<cudaStream_t>(stream), current);
    if (multipath) *multipath = r.multipath ? 1 : 0;
  });
}

ferry_result_t ferry_multipath_copy_batch(ferry_multipath_t engine, void* const* dsts, const void* const* srcs,
                                          const size_t* sizes, size_t count, ferry_stream_t stream, int* multipath) {
  return ferry::capi::guarded([&] {
    FERRY_ARG_CHECK(engine && engine->impl, "engine is NULL or destroyed");
    FERRY_ARG_CHECK(count == 0 || (dsts && srcs && sizes), "dsts, srcs and sizes must not be NULL when count > 0");
    std::vector<ferry::xfer::MultipathPiece> pieces(count);
    for (size_t i = 0; i < count; ++i) pieces[i] = {dsts[i], srcs[i], sizes[i]};
    int current = 0;  // a default stream is the current GPU's, as in cudaMemcpyAsync
    FERRY_CUDA_CHECK(cudaGetDevice(&current));
    auto r = engine->impl->copy_batch(pieces, static_cast<cudaStream_t>(stream), current);
    if (multipath) *multipath = r.multipath ? 1 : 0;
  });
}

ferry_result_t ferry_multipath_copy_sync(ferry_multipath_t engine, void* dst, const void* src, size_t bytes,
                                         int* multipath) {
  return ferry::capi::guarded([&] {
    FERRY_ARG_CHECK(engine && engine->impl, "engine is NULL or destroyed");
    // cudaMemcpy's stream: the legacy default stream of the current GPU.
    int current = 0;
    FERRY_CUDA_CHECK(cudaGetDevice(&current));
    auto r = engine->impl->copy(dst, src, bytes, cudaStreamLegacy, current);
    if (multipath) *multipath = r.multipath ? 1 : 0;
    FERRY_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    engine->impl->check();
  });
}

ferry_result_t ferry_multipath_synchronize(ferry_multipath_t engine) {
  return ferry::capi::guarded([&] {
    FERRY_ARG_CHECK(engine && engine->impl, "engine is NULL or destroyed");
    engine->impl->synchronize();
  });
}

ferry_result_t ferry_multipath_destroy(ferry_multipath_t engine) {
  // Nothing to destroy is no call: the message of the failure a caller is
  // cleaning up after stays.
  if (!engine) return FERRY_SUCCESS;
  return ferry::capi::guarded([&] {
    std::unique_ptr<ferry_multipath> owned(engine);
    if (owned->impl) owned->impl->close();
  });
}
