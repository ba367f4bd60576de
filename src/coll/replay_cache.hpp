// Repeated eager calls replayed from CUDA graphs. An eager call enqueues about
// a dozen CUDA operations (copies, batches of stream memory operations,
// sometimes a kernel), which costs the host 27-42 us on H200 hosts while the
// GPU side of a small collective takes less (docs/performance-log.md, "Host time
// per eager call"): small eager calls were host-bound. A call whose commands
// were enqueued before (same program: same addresses, sizes, variant) is
// captured once into a graph and from then on launched with one
// cudaGraphLaunch. The graph holds exactly the commands the call would
// enqueue, so the protocol, the flags and the watchdog see no difference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <unordered_map>

#include "coll/local_copy.hpp"
#include "coll/program.hpp"
#include "coll/selector.hpp"

namespace ferry {

// Everything emit() turns into commands for one call, as bytes: equal keys
// enqueue equal commands.
std::string emission_key(const Program& program, const void* record, Algo algo, LocalCopy local_copy,
                         bool kernel_signals);

// Whether a call seen `times_seen` times (this one included) is worth
// capturing: capturing costs about as much as a few eager calls, so calls that
// never repeat (all_to_allv with new counts every step) are not captured.
bool worth_capturing(uint64_t times_seen);

// Whether a program gains anything from being replayed as a graph: not one
// that is a single kernel launch already (the SM path).
bool replayable(const Program& program);

// One per local rank: the captured graphs by key, least recently used evicted
// beyond `capacity` (with the keys seen but not yet captured).
class ReplayCache {
 public:
  explicit ReplayCache(size_t capacity) : capacity_(capacity) {}
  ~ReplayCache();
  ReplayCache(const ReplayCache&) = delete;
  ReplayCache& operator=(const ReplayCache&) = delete;

  struct Entry {
    uint64_t seen = 0;
    uint64_t last_use = 0;
    cudaGraphExec_t exec = nullptr;
    bool uncapturable = false;  // a capture failed: always enqueue this one
  };
  // The entry for `key`, counted as seen once more.
  Entry& touch(const std::string& key);
  size_t size() const { return entries_.size(); }

 private:
  void evict_oldest();

  size_t capacity_;
  uint64_t clock_ = 0;
  std::unordered_map<std::string, Entry> entries_;
};

}  // namespace ferry
