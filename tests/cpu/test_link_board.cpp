// The link board (src/xfer/link_board.hpp): posts seen by other engines and
// not by their own, by GPU and lane, until they lapse; across processes; a
// full board and a board of another layout.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "xfer/link_board.hpp"

using ferry::xfer::GpuId;
using ferry::xfer::LinkBoard;

namespace {

GpuId gpu(uint8_t n) {
  GpuId g{};
  g.fill(0x11);
  g[15] = n;
  return g;
}

// A board of the test's own, gone afterwards.
struct Named {
  std::string name = "/ferry-link-board-test-" + std::to_string(getpid()) + "-" +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name();
  ~Named() { shm_unlink(name.c_str()); }
};

std::unique_ptr<LinkBoard> open_board(const std::string& name) {
  std::string why;
  auto b = LinkBoard::open(name, &why);
  EXPECT_TRUE(b) << why;
  return b;
}

constexpr int64_t kSecond = 1000000000;

}  // namespace

TEST(LinkBoard, APostIsSeenByOtherEnginesOnlyAndLapses) {
  Named n;
  auto a = open_board(n.name), b = open_board(n.name);
  ASSERT_TRUE(a && b);
  const uint64_t ta = LinkBoard::new_token(), tb = LinkBoard::new_token();
  ASSERT_NE(ta, tb);
  const int64_t now = LinkBoard::now_ns();
  ASSERT_TRUE(a->post(gpu(0), 0, ta, now + kSecond));
  auto seen = b->busy({gpu(0), gpu(1)}, tb, now);
  EXPECT_TRUE(seen[0][0]);
  EXPECT_FALSE(seen[0][1]);  // the other direction is free
  EXPECT_FALSE(seen[1][0] || seen[1][1]);
  EXPECT_FALSE(a->busy({gpu(0)}, ta, now)[0][0]);                // its own post
  EXPECT_FALSE(b->busy({gpu(0)}, tb, now + 2 * kSecond)[0][0]);  // lapsed
  // Renewed: seen again; the same slot, not a second one.
  ASSERT_TRUE(a->post(gpu(0), 0, ta, now + 3 * kSecond));
  EXPECT_TRUE(b->busy({gpu(0)}, tb, now + 2 * kSecond)[0][0]);
  // B's post on the same GPU: each sees the other's.
  ASSERT_TRUE(b->post(gpu(0), 1, tb, now + kSecond));
  EXPECT_TRUE(a->busy({gpu(0)}, ta, now)[0][1]);
  EXPECT_FALSE(b->busy({gpu(0)}, tb, now)[0][1]);
}

TEST(LinkBoard, APostOutlivesItsProcessUntilItLapses) {
  Named n;
  const int64_t now = LinkBoard::now_ns();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string why;
    auto b = LinkBoard::open(n.name, &why);
    const bool ok = b && b->post(gpu(3), 1, LinkBoard::new_token(), now + 5 * kSecond);
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto a = open_board(n.name);
  ASSERT_TRUE(a);
  const uint64_t me = LinkBoard::new_token();
  EXPECT_TRUE(a->busy({gpu(3)}, me, now)[0][1]);
  EXPECT_FALSE(a->busy({gpu(3)}, me, now + 6 * kSecond)[0][1]);
}

TEST(LinkBoard, AFullBoardRefusesAPostAndKeepsTheOthers) {
  Named n;
  auto a = open_board(n.name);
  ASSERT_TRUE(a);
  const int64_t until = LinkBoard::now_ns() + kSecond;
  for (int i = 0; i < LinkBoard::kSlots; ++i)
    ASSERT_TRUE(a->post(gpu(static_cast<uint8_t>(i % 8)), 0, 1000 + i, until)) << i;
  EXPECT_FALSE(a->post(gpu(9), 0, 5000, until));
  EXPECT_TRUE(a->post(gpu(0), 1, 1000, until));  // its own slot: still there
  const auto seen = a->busy({gpu(7), gpu(9)}, 1, LinkBoard::now_ns());
  EXPECT_TRUE(seen[0][0]);
  EXPECT_FALSE(seen[1][0]);
}

TEST(LinkBoard, ABoardOfAnotherLayoutIsRefusedWithTheReason) {
  Named n;
  const int fd = shm_open(n.name.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  void* p = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(p, MAP_FAILED);
  const uint64_t other = 42;
  std::memcpy(p, &other, sizeof other);
  munmap(p, 4096);
  std::string why;
  EXPECT_FALSE(LinkBoard::open(n.name, &why));
  EXPECT_NE(why.find("another layout"), std::string::npos) << why;
}

TEST(LinkBoard, ABoardsSlotsGoBackWhenItIsDestroyedAndAWithdrawalTakesNone) {
  Named n;
  const int64_t until = LinkBoard::now_ns() + kSecond;
  {
    auto a = open_board(n.name);
    ASSERT_TRUE(a);
    for (int i = 0; i < LinkBoard::kSlots; ++i) ASSERT_TRUE(a->post(gpu(1), 0, 1000 + i, until)) << i;
    auto b = open_board(n.name);
    ASSERT_TRUE(b);
    EXPECT_FALSE(b->post(gpu(2), 0, 7, until));  // full
    EXPECT_TRUE(b->post(gpu(2), 0, 7, 0));       // a withdrawal needs no slot
  }
  auto c = open_board(n.name);
  ASSERT_TRUE(c);
  EXPECT_FALSE(c->busy({gpu(1)}, 1, LinkBoard::now_ns())[0][0]);  // gone with their board
  EXPECT_TRUE(c->post(gpu(2), 0, 7, until));
}

// Eight processes claiming slots at once, eight each: every claim lands in a
// slot of its own (the board then takes exactly the rest, and no more).
TEST(LinkBoard, ProcessesClaimingAtOnceNeverShareASlot) {
  Named n;
  const int64_t until = LinkBoard::now_ns() + 20 * kSecond;
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> kids;
  for (int k = 0; k < 8; ++k) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(go[1]);
      char c;
      std::string why;
      auto b = LinkBoard::open(n.name, &why);
      if (!b || read(go[0], &c, 1) != 0) _exit(2);  // the parent closing the pipe starts every child at once
      bool ok = true;
      for (int i = 0; i < 8; ++i) ok = b->post(gpu(static_cast<uint8_t>(k)), 0, 100 * (k + 1) + i, until) && ok;
      b.release();  // its slots stay taken: the parent counts them
      _exit(ok ? 0 : 1);
    }
    kids.push_back(child);
  }
  close(go[0]);
  close(go[1]);
  for (pid_t kid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(kid, &status, 0), kid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto a = open_board(n.name);
  ASSERT_TRUE(a);
  std::vector<GpuId> gpus;
  for (int k = 0; k < 8; ++k) gpus.push_back(gpu(static_cast<uint8_t>(k)));
  for (const auto& seen : a->busy(gpus, 1, LinkBoard::now_ns())) EXPECT_TRUE(seen[0]);
  const int left = LinkBoard::kSlots - 64;
  for (int i = 0; i < left; ++i) ASSERT_TRUE(a->post(gpu(20), 0, 5000 + i, until)) << i;
  EXPECT_FALSE(a->post(gpu(21), 0, 9999, until)) << "a slot was claimed twice, or lost";
}

// Two engines posting while a third keeps taking slots over (each board
// takes any slot at once; the third, made anew each time, claims afresh and
// frees its slot when destroyed), and a fourth only reads: a post that raced
// a takeover of its slot must not land in the new owner's slot. Engine A
// posts only copies out of GPU 1, B only copies into GPU 2, C only into GPU
// 3: GPU 1 is never busy in, GPUs 2 and 3 never out.
TEST(LinkBoard, APostRacingATakeoverOfItsSlotLeavesTheNewOwnersLanesAlone) {
  Named n;
  std::string why;
  const int64_t any = -3600 * kSecond;
  auto a = LinkBoard::open(n.name, &why, any), b = LinkBoard::open(n.name, &why, any);
  auto reader = open_board(n.name);
  ASSERT_TRUE(a && b && reader) << why;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> a_posts{0}, b_posts{0}, takeovers{0};
  auto poster = [&](LinkBoard* board, uint8_t g, int lane, uint64_t token, std::atomic<int64_t>* posts) {
    while (!stop.load(std::memory_order_relaxed))
      if (board->post(gpu(g), lane, token, LinkBoard::now_ns() + kSecond))
        posts->fetch_add(1, std::memory_order_relaxed);
  };
  std::thread ta(poster, a.get(), 1, 1, 11, &a_posts), tb(poster, b.get(), 2, 0, 22, &b_posts);
  std::thread tc([&] {
    for (uint64_t t = 100; !stop.load(std::memory_order_relaxed); ++t) {
      std::string w;
      auto c = LinkBoard::open(n.name, &w, any);
      if (c && c->post(gpu(3), 0, t, LinkBoard::now_ns() + kSecond)) takeovers.fetch_add(1, std::memory_order_relaxed);
    }
  });
  int wrong = 0, a_seen = 0;
  const int64_t end = LinkBoard::now_ns() + kSecond;
  while (LinkBoard::now_ns() < end) {
    const auto seen = reader->busy({gpu(1), gpu(2), gpu(3)}, 33, LinkBoard::now_ns());
    wrong += seen[0][0] || seen[1][1] || seen[2][1];
    a_seen += seen[0][1];
  }
  stop = true;
  ta.join();
  tb.join();
  tc.join();
  EXPECT_EQ(wrong, 0) << "a post landed in the slot that another engine had taken over";
  EXPECT_GT(a_posts.load(), 0);
  EXPECT_GT(b_posts.load(), 0);
  EXPECT_GT(takeovers.load(), 1000) << "too few claims to race the posts";
  EXPECT_GT(a_seen, 0);
}
