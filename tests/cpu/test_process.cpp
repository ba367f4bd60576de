#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "core/process.hpp"

using namespace ferry;

TEST(ProcessExited, LiveZombieAndReaped) {
  EXPECT_FALSE(process_exited(getpid()));
  EXPECT_FALSE(process_exited(0));
  pid_t child = fork();
  if (child == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    _exit(0);
  }
  ASSERT_GT(child, 0);
  EXPECT_FALSE(process_exited(child));  // alive, sleeping
  // Exited but not reaped: a zombie, which kill(pid, 0) still finds.
  for (int i = 0; i < 200 && !process_exited(child); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(process_exited(child));
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(process_exited(child));  // reaped: gone
}
