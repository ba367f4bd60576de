// The ranks of one host as a layer above the bootstrap sees them: which ranks
// this process drives and on which GPUs, and how the processes exchange small
// records and file descriptors. A communicator hands one to the memory layer
// (symm/heap.hpp), which runs its own collective setup through it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/unix_socket.hpp"

namespace ferry {

// Out-of-band all-gather of one blob per rank (rank order). Must be bounded in
// time and name missing ranks when it gives up.
using AllGatherFn = std::function<std::vector<std::string>(const std::string& mine)>;

struct Group {
  int world = 0;
  std::vector<int> ranks;    // the ranks this process drives
  std::vector<int> devices;  // their GPUs (a GPU may hold several ranks: FERRY_SHARED_GPUS)
  double timeout_s = 300;
  // One process per rank (create): the all-gather and the descriptor exchange.
  // One process driving every rank (create_local): both empty.
  AllGatherFn allgather;
  bool allgather_on_host = false;  // moves its bytes on the host alone: it cannot wait for a GPU
  // Shared with whoever made the group: a heap may outlive the communicator
  // whose group it was made from, and still grow and free over it.
  std::shared_ptr<FdExchange> fds;
  std::vector<std::string> socket_paths;  // by rank
  std::function<int()> next_tag;          // a fresh descriptor-message tag, the same on every rank; holds its own count

  bool multi_process() const { return static_cast<bool>(allgather); }
  int local_count() const { return static_cast<int>(ranks.size()); }
};

}  // namespace ferry
