#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "coll/prepared_table.hpp"
#include "core/error.hpp"
#include "error_of.hpp"

using namespace ferry;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(PreparedTable, HandlesAreNeverReusedAndAReleasedOneIsNamedAsSuch) {
  PreparedTable t;
  const int a = t.add({}), b = t.add({});
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 2);
  t.release(a, "release");
  EXPECT_EQ(t.add({}), 3);
  EXPECT_TRUE(has(error_of([&] { t.get(a, "trigger"); }), "trigger: handle 1 is not a prepared collective"));
  EXPECT_TRUE(has(error_of([&] { t.release(a, "release"); }), "released already?"));
  EXPECT_FALSE(t.armed(a));
  EXPECT_EQ(t.calls().size(), 2u);
}

TEST(PreparedTable, AnArmedHandleIsNeitherReleasedNorWaitedPast) {
  PreparedTable t;
  PreparedCall c;
  c.registrations = {7};
  const int h = t.add(c);
  t.refuse_if_armed("synchronize");
  t.get(h, "arm").armed = true;
  EXPECT_TRUE(t.armed(h));
  EXPECT_TRUE(has(error_of([&] { t.release(h, "release"); }), "release: handle 1 is armed; trigger it first"));
  EXPECT_TRUE(has(error_of([&] { t.refuse_if_armed("synchronize"); }),
                  "synchronize: prepared collective 1 is armed and not triggered"));
  EXPECT_TRUE(t.armed(h));  // the refused release left it
  t.get(h, "trigger").armed = false;
  t.refuse_if_armed("synchronize");
  const PreparedCall released = t.release(h, "release");
  EXPECT_EQ(released.registrations, std::vector<uint32_t>{7});  // what release_prepared retires the gates of
  EXPECT_TRUE(t.calls().empty());
}

TEST(PreparedTable, ABufferInUseIsNamedWithItsHandle) {
  PreparedTable t;
  PreparedCall c;
  c.registrations = {3, 9};
  t.add({});
  const int h = t.add(c);
  t.refuse_if_uses(4, "free");
  const std::string e = error_of([&] { t.refuse_if_uses(9, "free"); });
  EXPECT_TRUE(has(e, "free: buffer #9 is used by prepared collective " + std::to_string(h))) << e;
  t.release(h, "release");
  t.refuse_if_uses(9, "free");
}

TEST(PreparedTable, EachArmingGetsANewGateValue) {
  PreparedTable t;
  EXPECT_EQ(t.next_generation(), 1u);  // 0 means never armed
  t.release(t.add({}), "release");     // handles come and go; the values go on counting
  EXPECT_EQ(t.next_generation(), 2u);
}

// Every handle of a rank waits on one armed stream: what handles armed and
// not yet triggered queue there counts against the bound, by local rank; a
// triggered handle, an empty call and the handle itself do not.
TEST(PreparedTable, ArmingPastWhatAQueueHoldsIsRefusedNamingTheArmedHandles) {
  PreparedTable t;
  auto with_ops = [&](std::vector<size_t> ops) {
    PreparedCall c;
    c.ops = std::move(ops);
    return t.add(std::move(c));
  };
  const int a = with_ops({300, 10});
  const int b = with_ops({200, 10});
  const int c = with_ops({13, 505});
  const int empty = with_ops({});
  for (int h : {a, b, c, empty})
    for (int local : {0, 1}) t.refuse_if_queue_full(h, local, 4 + local, "arm");
  t.get(a, "arm").armed = true;
  t.refuse_if_queue_full(a, 0, 4, "arm");  // itself, armed again, is refused elsewhere
  t.refuse_if_queue_full(b, 0, 4, "arm");  // 300 + 200
  const std::string e = error_of([&] { t.refuse_if_queue_full(c, 1, 5, "arm"); });
  EXPECT_TRUE(has(e,
                  "arm: handle 3 puts about 505 operations on rank 5's armed stream, behind about 10 of handles "
                  "armed and not yet triggered (1)"))
      << e;
  t.get(b, "arm").armed = true;
  const std::string e0 = error_of([&] { t.refuse_if_queue_full(c, 0, 4, "arm"); });
  EXPECT_TRUE(has(e0, "behind about 500 of handles armed and not yet triggered (1, 2)")) << e0;
  EXPECT_TRUE(has(e0, "at most 512")) << e0;
  t.refuse_if_queue_full(empty, 0, 4, "arm");
  t.get(a, "trigger").armed = false;
  t.refuse_if_queue_full(c, 0, 4, "arm");  // 200 + 13
  t.get(b, "trigger").armed = false;
  t.refuse_if_queue_full(c, 1, 5, "arm");
}

// Runs triggered already and not ended may still be on the armed stream (all
// of them behind a gate handed to a kernel not yet launched): arm() waits for
// the oldest of them, as few as make room under what a queue takes behind a
// wait, asks the GPU only where they could pass it, and refuses where they
// wait behind a handle armed and not yet triggered (only the host opens it).
TEST(PreparedTable, ArmingWaitsForTheOldestUnfinishedRunsOnlyPastWhatAQueueHolds) {
  PreparedTable t;
  auto with_ops = [&](std::vector<size_t> ops, uint64_t generation) {
    PreparedCall c;
    c.ops = std::move(ops);
    c.generation = generation;
    return t.add(std::move(c));
  };
  const int a = with_ops({500, 10}, 10);  // triggered (a kernel, say), running
  const int b = with_ops({200, 10}, 0);   // never armed yet
  const int c = with_ops({300, 10}, 0);
  const int d = with_ops({100, 10}, 0);
  std::set<const PreparedCall*> running;  // runs not ended
  int asked = 0;
  const auto unfinished = [&](const PreparedCall& call) {
    ++asked;
    return running.count(&call) > 0;
  };
  running = {&t.get(a, "x")};
  EXPECT_TRUE(t.queue_room(c, 0, unfinished).wait_for.empty());  // 500 + 100 + 300 at most
  EXPECT_EQ(asked, 0) << "the GPU was asked although everything fits";
  t.get(b, "arm").armed = true;
  t.get(b, "x").generation = 20;
  // 200 armed + 500 running + 300: past the queue; a was armed before b, so it can end.
  auto room = t.queue_room(c, 0, unfinished);
  EXPECT_EQ(room.wait_for, std::vector<int>{a});
  EXPECT_TRUE(room.armed.empty());
  EXPECT_GT(asked, 0);
  EXPECT_TRUE(t.queue_room(c, 1, unfinished).wait_for.empty());  // 10 + 10 + 10 on rank 1
  // Two runs not ended: only the oldest is waited for where that makes room.
  running.insert(&t.get(d, "x"));
  t.get(d, "x").generation = 40;
  t.get(b, "x").armed = false;
  t.get(b, "x").generation = 50;          // b triggered from the host after both, its run ended
  room = t.queue_room(c, 0, unfinished);  // 500 + 100 + 300 = 900: room enough
  EXPECT_TRUE(room.wait_for.empty());
  t.get(b, "x").armed = true;             // armed again after both
  room = t.queue_room(c, 0, unfinished);  // 200 + 500 + 100 + 300 = 1100: a alone makes room
  EXPECT_EQ(room.wait_for, std::vector<int>{a});
  // The handle itself armed again while its own last run has not ended: that run counts.
  room = t.queue_room(a, 0, unfinished);  // 200 + 500 + 100 + 500
  EXPECT_EQ(room.wait_for, std::vector<int>{a});
  // Armed before the runs not ended: they end only after the host triggers it.
  t.get(b, "x").generation = 5;
  room = t.queue_room(c, 0, unfinished);
  EXPECT_TRUE(room.wait_for.empty());
  EXPECT_EQ(room.armed, std::vector<int>{b});
  // A released call's run counts as well, named by its index.
  t.get(b, "x").armed = false;
  running = {};
  std::vector<PreparedCall> released(1);
  released[0].ops = {700};
  released[0].generation = 60;
  running.insert(&released[0]);
  EXPECT_EQ(t.queue_room(c, 0, unfinished, released).wait_for, std::vector<int>{-1});
  running = {};  // every run ended
  EXPECT_TRUE(t.queue_room(c, 0, unfinished, released).wait_for.empty());
}
