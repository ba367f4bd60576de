#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
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
