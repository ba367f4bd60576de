// Passing file descriptors between the processes of one host: each rank
// listens on a Unix domain socket inside a private folder (mode 0700) and
// peers send it descriptors with SCM_RIGHTS. Every receive is bounded and its
// timeout error names the ranks that never sent.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace ferry {

// The most descriptors one message carries.
constexpr int kMaxFdsPerMessage = 16;

struct FdMessage {
  int sender = -1;
  int tag = 0;
  std::vector<int> fds;  // owned by the receiver after receive()
  std::string payload;   // small, optional
};

class FdExchange {
 public:
  // Creates <parent>/ferry-XXXXXX (mode 0700) holding rank-<rank>.sock.
  // parent empty: $TMPDIR, else /tmp.
  FdExchange(int rank, const std::string& parent);
  ~FdExchange();
  FdExchange(const FdExchange&) = delete;
  FdExchange& operator=(const FdExchange&) = delete;

  const std::string& socket_path() const { return socket_path_; }

  // Sends `fds` (at most kMaxFdsPerMessage) and `payload` to the socket at `peer_path`, retrying until it
  // accepts or `timeout_s` passes; the error names `peer_rank`.
  void send(const std::string& peer_path, int peer_rank, int tag, const std::vector<int>& fds,
            const std::string& payload, double timeout_s) const;

  // Receives one message with `tag` from each rank in `senders`. Messages for
  // other tags that arrive early are kept for their own receive.
  std::map<int, FdMessage> receive(const std::vector<int>& senders, int tag, double timeout_s, const std::string& what);

 private:
  int rank_;
  int listen_fd_ = -1;
  std::string dir_;
  std::string socket_path_;
  std::vector<FdMessage> early_;
};

}  // namespace ferry
