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

  // "a symmetric heap over N GPU(s), B bytes each", "plain allocations", or
  // "none" (no link relays): for the debug log, the API and the tests.
  virtual std::string where() const = 0;
};

}  // namespace xfer
}  // namespace ferry
