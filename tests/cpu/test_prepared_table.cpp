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

// Runs whose triggers went to kernels (device_trigger) and have not ended may
// still wait behind shut gates: arm() waits for them only where they, the
// armed handles and its own would pass kArmedOpsMax, and names only those.
TEST(PreparedTable, ArmingWaitsForRunsHandedToKernelsOnlyPastWhatAQueueHolds) {
  PreparedTable t;
  auto with_ops = [&](std::vector<size_t> ops) {
    PreparedCall c;
    c.ops = std::move(ops);
    return t.add(std::move(c));
  };
  const int a = with_ops({300, 10});
  const int b = with_ops({150, 10});
  const int c = with_ops({100, 10});
  std::set<int> running;  // runs not ended
  const auto unfinished = [&](const PreparedCall& call) {
    for (const auto& [id, x] : t.calls())
      if (&x == &call) return running.count(id) > 0;
    return false;
  };
  t.get(a, "device_trigger").handed_to_kernels = true;
  running = {a};
  EXPECT_TRUE(t.runs_to_wait_for(c, 0, unfinished).empty());  // 300 + 100
  t.get(b, "arm").armed = true;
  EXPECT_EQ(t.runs_to_wait_for(c, 0, unfinished), std::vector<int>{a});  // 150 armed + 300 handed + 100
  EXPECT_TRUE(t.runs_to_wait_for(c, 1, unfinished).empty());             // 10 + 10 + 10 on rank 1
  // Armed again itself before its kernel fired: its earlier run counts too.
  EXPECT_EQ(t.runs_to_wait_for(a, 0, unfinished), std::vector<int>{a});  // 150 + 300 + 300
  running.clear();                                                       // the kernel fired and the run ended
  EXPECT_TRUE(t.runs_to_wait_for(c, 0, unfinished).empty());
  EXPECT_TRUE(t.runs_to_wait_for(a, 0, unfinished).empty());
}
