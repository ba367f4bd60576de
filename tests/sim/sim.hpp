// Controls of the fake CUDA runtime (fake_cuda.cpp) for the simulation tests.
#pragma once

#include <cstddef>

namespace sim {

struct Faults {
  int fail_on_device = -1;     // cudaMemcpyAsync on a stream of this device fails at once
  int hang_on_device = -1;     // copies on a stream of this device never finish
  size_t hang_from_bytes = 0;  // ... those of at least this many bytes (above kMultipathProbeBytes: not the probes)
  // cudaMemcpyAsync blocks its caller until this is cleared, as every CUDA
  // call does while a kernel's module loads lazily and waits for a stream.
  bool hold_copy_calls = false;
  bool hold_host_alloc = false;  // the same for cudaHostAlloc
  // cudaMalloc on this device fails (out of memory) for blocks of at least this many bytes.
  int no_memory_on_device = -1;
  size_t no_memory_from_bytes = 0;
  // Events recorded on a stream of this device report a failure once their
  // stream has got to them: work there failed after it was submitted.
  int fail_events_on_device = -1;
  // cudaMemcpyAsync of at least `fail_late_from_bytes` on a stream of this
  // device fails once `fail_late_after` such copies succeeded there (counted
  // from set_faults): a relay failing between a chunk's two hops, or at a
  // later chunk of the same pass.
  int fail_late_on_device = -1;
  int fail_late_after = 0;
  size_t fail_late_from_bytes = 0;
  // The first `slow_copies` copies of at least `slow_from_bytes` on a stream
  // of this device take `slow_extra_s` longer (a first use's one-time cost).
  int slow_on_device = -1;
  int slow_copies = 0;
  size_t slow_from_bytes = 0;
  double slow_extra_s = 0;
  // cudaDeviceEnablePeerAccess from this device fails (too many peers).
  int no_peer_access_from_device = -1;
};

// A fresh machine of `devices` GPUs whose copies move `bytes_per_s`.
void reset(int devices, double bytes_per_s = 20e9);
void set_faults(const Faults& f);
// How many cudaMemcpyAsync calls of exactly `bytes` were made since reset().
size_t copies(size_t bytes);
// How many live cudaMalloc blocks on `device` hold exactly `bytes` each.
size_t device_blocks(int device, size_t bytes);
// How many blocks from cudaMalloc and cudaHostAlloc are live.
size_t live_blocks();

}  // namespace sim
