// Gates: a 64-bit word that a stream waits on until it holds a given value (a
// generation), so that work can be enqueued ahead and released later from the
// host (a store to pinned memory), from another stream (a stream write, no
// kernel), or from a kernel (include/ferry/device.cuh). Prepared
// collectives and prepared host<->GPU transfers both hold their commands
// behind one. Each arming waits for a new generation, so a late or repeated
// open of an older generation never releases newer work.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "sync/holds.hpp"

namespace ferry {
namespace gate {

// Enqueues on `stream` a wait until *device_word >= value. The word is local
// GPU memory or pinned, device-mapped host memory.
void wait_on_stream(cudaStream_t stream, const uint64_t* device_word, uint64_t value);
// Opens from the host: a release store, so that everything the host wrote
// before is visible to the work behind the gate.
void open_from_host(volatile uint64_t* host_word, uint64_t value);
// Opens in `stream`'s order (a stream memory write: no kernel, no host round trip).
void open_on_stream(cudaStream_t stream, uint64_t* device_word, uint64_t value);

}  // namespace gate

// A gate of its own: one word of pinned, device-mapped host memory, so that
// any of the three openers can reach it. The words come from a pool of the
// process that is never freed (freeing pinned memory waits for the whole
// device, which an armed gate may hold), and a gate's word goes back to it
// when the gate is destroyed: by then nothing may still write it, or the
// gate must keep() it.
class HostGate {
 public:
  HostGate();
  ~HostGate();
  HostGate(const HostGate&) = delete;
  HostGate& operator=(const HostGate&) = delete;

  // Enqueues a wait for a new generation on `stream`; returns that generation.
  uint64_t arm(cudaStream_t stream);
  // The generation the last arm() waits for (0 before the first).
  uint64_t generation() const { return generation_; }
  void open();
  // Opens every arming up to `generation` (a work queue that finishes its
  // armings in order opens each as it finishes).
  void open_to(uint64_t generation) { gate::open_from_host(host_, generation); }
  void open_on(cudaStream_t stream);
  // The word and value a kernel stores to open the last arming.
  std::pair<uint64_t*, uint64_t> device_trigger() const { return {device_, generation_}; }
  // True once the last arming's generation is in the word (as the host sees it).
  bool is_open() const;
  // The word as the host sees it (a stream may write it: open_on_stream).
  uint64_t value() const;
  // Gives up the word for good (never reused), for a stream or kernel that
  // may still read or write it; the gate still opens it.
  void keep() { owned_ = false; }
  // For a gate that user code opens: registered as a hold (sync/holds.hpp)
  // named `what` while an arming's generation is not yet in the word.
  void hold_while_armed(std::string what);

 private:
  volatile uint64_t* host_ = nullptr;
  bool owned_ = true;
  uint64_t* device_ = nullptr;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> armed_to_{0};  // generation_, for a hold's check from another thread
  std::unique_ptr<sync::Hold> hold_;
};

}  // namespace ferry
