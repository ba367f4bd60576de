// Where the multipath engine's relays keep their staging buffers: a chunk
// crossing a relay GPU lands in one of that GPU's buffers before it goes on.
//
// make() puts them on a symmetric heap over the engine's GPUs
// (symm/heap.hpp), the memory layer under every ferry capability: one
// allocation at the same offset on every GPU that relays, a relay link's
// buffers in it. Where the heap cannot be had (a GPU short of memory, a
// driver without virtual memory management) it falls back to plain(): one
// allocation per buffer, link by link, and a link short of memory relays
// nothing while the others still do.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace ferry {
namespace xfer {

// Which links get staging buffers (`devices[l]`: link l's GPU): `outstanding`
// each where link l may relay and has copies to relay: into another GPU of
// the engine, or into its own GPU where it is not that GPU's first link (a
// loopback relay). A GPU's first link carries its own GPU's copies itself,
// and copies into GPUs outside the engine run plain, so a GPU alone in the
// engine relays nothing over its first link.
std::vector<int> relay_staging_need(const std::vector<int>& devices, const std::vector<bool>& may_relay,
                                    int outstanding);

// Where each link's buffers lie when every relaying GPU holds one allocation
// of the same size (a symmetric heap's): buffers of `bytes` at 64 KiB
// boundaries, the links of one GPU (loopback relays) one after another.
struct StagingLayout {
  std::vector<int> gpus;                     // the GPUs with buffers, in link order
  size_t bytes_per_gpu = 0;                  // the one allocation on each, sized for the fullest GPU
  std::vector<int> gpu_of;                   // by link: index into `gpus`, -1 where it needs none
  std::vector<std::vector<size_t>> offsets;  // by link: each buffer's offset in its GPU's allocation
};
StagingLayout plan_relay_staging(const std::vector<int>& devices, const std::vector<int>& need, size_t bytes);

class RelayStaging {
 public:
  virtual ~RelayStaging() = default;

  // `devices[l]`: link l's GPU; `need[l]`: how many buffers of `bytes` it
  // needs there (0: none). `buffers` gets link l's buffers in `(*buffers)[l]`,
  // empty where it got none, with the reason in `(*why)[l]`. Loopback relays
  // (several links on one GPU) each get buffers of their own.
  static std::unique_ptr<RelayStaging> make(const std::vector<int>& devices, const std::vector<int>& need, size_t bytes,
                                            std::vector<std::vector<char*>>* buffers, std::vector<std::string>* why);
  // The fallback: cudaMalloc, buffer by buffer.
  static std::unique_ptr<RelayStaging> plain(const std::vector<int>& devices, const std::vector<int>& need,
                                             size_t bytes, std::vector<std::vector<char*>>* buffers,
                                             std::vector<std::string>* why);

  // "a symmetric heap over N GPU(s), B bytes each, M mapped", "plain allocations", or
  // "none" (no link relays): for the debug log, the API and the tests.
  virtual std::string where() const = 0;
};

}  // namespace xfer
}  // namespace ferry
