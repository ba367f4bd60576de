#include "bootstrap/unix_socket.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/error.hpp"

namespace ferry {
namespace {

constexpr unsigned kMagic = 0xFE44A001u;
constexpr size_t kMaxPayload = 4096;

struct Header {
  unsigned magic;
  int sender;
  int tag;
  int nfds;
  unsigned payload_bytes;
};

using Clock = std::chrono::steady_clock;

double seconds_left(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

sockaddr_un make_addr(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path))
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                "socket path '" + path + "' is too long for a Unix socket; set FERRY_SOCKET_DIR to a shorter folder");
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

FdExchange::FdExchange(int rank, const std::string& parent) : rank_(rank) {
  std::string base = parent;
  if (base.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    base = (tmp && *tmp) ? tmp : "/tmp";
  }
  std::string templ = base + "/ferry-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  // The socket's path is the folder's (as long as the template) and a name:
  // too long is refused before anything is made.
  socket_path_ = templ + "/rank-" + std::to_string(rank) + ".sock";
  sockaddr_un addr = make_addr(socket_path_);
  if (!mkdtemp(buf.data())) throw_errno("creating a private socket folder under " + base, errno, __FILE__, __LINE__);
  dir_ = buf.data();
  socket_path_ = dir_ + "/rank-" + std::to_string(rank) + ".sock";
  addr = make_addr(socket_path_);
  try {
    FERRY_SYS_CHECK(chmod(dir_.c_str(), 0700), "chmod 0700 " + dir_);
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FERRY_SYS_CHECK(listen_fd_, "socket(AF_UNIX)");
    FERRY_SYS_CHECK(bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), "bind " + socket_path_);
    FERRY_SYS_CHECK(listen(listen_fd_, 256), "listen " + socket_path_);
  } catch (...) {  // no destructor runs for a constructor that throws
    if (listen_fd_ >= 0) close(listen_fd_);
    unlink(socket_path_.c_str());
    rmdir(dir_.c_str());
    throw;
  }
}

FdExchange::~FdExchange() {
  if (listen_fd_ >= 0) close(listen_fd_);
  if (!socket_path_.empty()) unlink(socket_path_.c_str());
  if (!dir_.empty()) rmdir(dir_.c_str());
  for (auto& m : early_)
    for (int fd : m.fds) close(fd);
}

void FdExchange::send(const std::string& peer_path, int peer_rank, int tag, const std::vector<int>& fds,
                      const std::string& payload, double timeout_s) const {
  FERRY_ARG_CHECK(fds.size() <= static_cast<size_t>(kMaxFdsPerMessage), "too many file descriptors in one message");
  FERRY_ARG_CHECK(payload.size() <= kMaxPayload, "payload too large for one message");
  sockaddr_un addr = make_addr(peer_path);
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  int fd = -1;
  for (;;) {
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FERRY_SYS_CHECK(fd, "socket(AF_UNIX)");
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) break;
    int err = errno;
    close(fd);
    if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN)
      throw_errno("connecting to rank " + std::to_string(peer_rank) + " at " + peer_path, err, __FILE__, __LINE__);
    if (seconds_left(deadline) <= 0)
      throw_error(FERRY_ERROR_TIMEOUT, "rank " + std::to_string(peer_rank) + " did not accept a connection on " +
                                           peer_path + " within " + std::to_string(timeout_s) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  Header h{kMagic, rank_, tag, static_cast<int>(fds.size()), static_cast<unsigned>(payload.size())};
  iovec iov[2] = {{&h, sizeof(h)}, {const_cast<char*>(payload.data()), payload.size()}};
  char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
  std::memset(control, 0, sizeof(control));
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = payload.empty() ? 1 : 2;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
  int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(sizeof(h) + payload.size()))
    throw_errno("sending descriptors to rank " + std::to_string(peer_rank), err, __FILE__, __LINE__);
}

std::map<int, FdMessage> FdExchange::receive(const std::vector<int>& senders, int tag, double timeout_s,
                                             const std::string& what) {
  std::map<int, FdMessage> got;
  // A receive that throws (a sender missing at the deadline) closes the
  // descriptors the others sent: nobody else holds them.
  struct CloseUnlessReturned {
    std::map<int, FdMessage>& got;
    bool returned = false;
    ~CloseUnlessReturned() {
      if (returned) return;
      for (auto& [sender, m] : got)
        for (int fd : m.fds) close(fd);
    }
  } guard{got};
  auto wanted = [&](const FdMessage& m) {
    if (m.tag != tag) return false;
    for (int s : senders)
      if (s == m.sender) return got.count(s) == 0;
    return false;
  };
  for (auto it = early_.begin(); it != early_.end();) {
    if (wanted(*it)) {
      got[it->sender] = std::move(*it);
      it = early_.erase(it);
    } else {
      ++it;
    }
  }
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (got.size() < senders.size()) {
    double left = seconds_left(deadline);
    pollfd p{listen_fd_, POLLIN, 0};
    int r = left > 0 ? poll(&p, 1, static_cast<int>(left * 1000) + 1) : 0;
    if (r < 0 && errno == EINTR) continue;
    FERRY_SYS_CHECK(r, "poll on " + socket_path_);
    if (r == 0) {
      std::string missing;
      for (int s : senders)
        if (!got.count(s)) missing += (missing.empty() ? "" : ", ") + std::to_string(s);
      throw_error(FERRY_ERROR_TIMEOUT, "rank " + std::to_string(rank_) + ": rank(s) " + missing + " never sent " +
                                           what + " within " + std::to_string(timeout_s) + " s");
    }
    int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    // A connected sender writes its one message at once. One that stops
    // partway (a frozen process) may not hold the reads below past the
    // deadline: they give up with the time left, at most 5 s.
    const double read_s = std::min(5.0, std::max(0.001, seconds_left(deadline)));
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(read_s);
    tv.tv_usec = static_cast<suseconds_t>((read_s - static_cast<double>(tv.tv_sec)) * 1e6);
    setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    pollfd pc{conn, POLLIN, 0};
    if (poll(&pc, 1, static_cast<int>(read_s * 1000) + 1) <= 0) {
      close(conn);
      continue;
    }
    Header h{};
    char control[CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    iovec iov{&h, sizeof(h)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    FdMessage m;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
        size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        m.fds.resize(k);
        std::memcpy(m.fds.data(), CMSG_DATA(cm), k * sizeof(int));
      }
    }
    bool ok = n == static_cast<ssize_t>(sizeof(h)) && h.magic == kMagic && h.payload_bytes <= kMaxPayload;
    if (ok && h.payload_bytes > 0) {
      m.payload.resize(h.payload_bytes);
      ok = recv(conn, m.payload.data(), h.payload_bytes, MSG_WAITALL) == static_cast<ssize_t>(h.payload_bytes);
    }
    close(conn);
    if (!ok) {  // not one of ours: drop it
      for (int fd : m.fds) close(fd);
      continue;
    }
    m.sender = h.sender;
    m.tag = h.tag;
    if (wanted(m))
      got[m.sender] = std::move(m);
    else
      early_.push_back(std::move(m));
  }
  guard.returned = true;
  return got;
}

}  // namespace ferry
