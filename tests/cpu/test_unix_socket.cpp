#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "bootstrap/unix_socket.hpp"
#include "core/error.hpp"

using namespace ferry;

TEST(FdExchange, FolderIsPrivate) {
  FdExchange ex(0, "");
  std::string dir = ex.socket_path().substr(0, ex.socket_path().rfind('/'));
  struct stat st {};
  ASSERT_EQ(stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(FdExchange, PassesDescriptorsBetweenProcesses) {
  FdExchange receiver(0, "");
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    FdExchange sender(1, "");
    sender.send(receiver.socket_path(), 0, 7, {pipefd[1]}, "hello", 5.0);
    _exit(0);
  }
  close(pipefd[1]);
  auto got = receiver.receive({1}, 7, 5.0, "a pipe");
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[1].payload, "hello");
  ASSERT_EQ(got[1].fds.size(), 1u);
  // The received descriptor is the pipe's write end: writing to it reaches our read end.
  ASSERT_EQ(write(got[1].fds[0], "x", 1), 1);
  char c = 0;
  ASSERT_EQ(read(pipefd[0], &c, 1), 1);
  EXPECT_EQ(c, 'x');
  close(got[1].fds[0]);
  close(pipefd[0]);
}

TEST(FdExchange, EarlyMessagesWaitForTheirTurn) {
  FdExchange a(0, ""), b(1, "");
  b.send(a.socket_path(), 0, 2, {}, "second", 5.0);
  b.send(a.socket_path(), 0, 1, {}, "first", 5.0);
  EXPECT_EQ(a.receive({1}, 1, 5.0, "x")[1].payload, "first");
  EXPECT_EQ(a.receive({1}, 2, 5.0, "x")[1].payload, "second");
}

TEST(FdExchange, TimeoutNamesTheMissingRanks) {
  FdExchange a(0, ""), b(2, "");
  b.send(a.socket_path(), 0, 3, {}, "", 5.0);
  try {
    a.receive({1, 2, 3}, 3, 0.2, "their flag memory");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_TIMEOUT);
    std::string m = e.what();
    EXPECT_NE(m.find("rank(s) 1, 3 never sent their flag memory"), std::string::npos) << m;
  }
}

TEST(FdExchange, SendToAbsentPeerTimesOut) {
  FdExchange a(0, "");
  try {
    a.send("/tmp/ferry-does-not-exist/rank-5.sock", 5, 1, {}, "", 0.1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_TIMEOUT);
    EXPECT_NE(std::string(e.what()).find("rank 5"), std::string::npos);
  }
}

// A client that connects and stops partway through its header (a frozen
// process) must not hold a receive past its deadline.
TEST(FdExchange, ASenderFrozenMidMessageCostsNoMoreThanTheTimeout) {
  FdExchange a(0, "");
  int c = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(c, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, a.socket_path().c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(write(c, "abc", 3), 3);  // part of a header, then nothing more
  const auto t0 = std::chrono::steady_clock::now();
  try {
    a.receive({1}, 4, 1.0, "a message");
    FAIL() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_TIMEOUT) << e.what();
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 3.0);
  close(c);
}

namespace {

int open_descriptors() {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) n += fcntl(fd, F_GETFD) != -1;
  return n;
}

}  // namespace

// A receive that gives up closes what the senders that did arrive sent.
TEST(FdExchange, AReceiveThatTimesOutClosesTheDescriptorsItGot) {
  FdExchange a(0, ""), b(2, "");
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  const int before = open_descriptors();
  b.send(a.socket_path(), 0, 4, {pipefd[0], pipefd[1]}, "", 5.0);
  EXPECT_THROW(a.receive({1, 2}, 4, 0.2, "pipes"), Error);
  EXPECT_EQ(open_descriptors(), before);
  close(pipefd[0]);
  close(pipefd[1]);
}

// A parent folder too long for a socket path is refused before a private
// folder is made under it (none is left behind).
TEST(FdExchange, ATooLongSocketPathLeavesNoFolder) {
  char parent[] = "/tmp/ferry-long-XXXXXX";
  ASSERT_NE(mkdtemp(parent), nullptr);
  std::string deep = std::string(parent) + "/" + std::string(100, 'd');
  ASSERT_EQ(mkdir(deep.c_str(), 0700), 0);
  try {
    FdExchange ex(0, deep);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("FERRY_SOCKET_DIR"), std::string::npos) << e.what();
  }
  EXPECT_EQ(rmdir(deep.c_str()), 0) << "a folder was left under it";
  rmdir(parent);
}
