// The device gate slots of a local rank (coll/gate_slots.hpp) with stand-in
// events: a slot of a released prepared collective comes back only once its
// last run's event has completed.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "coll/gate_slots.hpp"
#include "coll/prepared_table.hpp"
#include "error_of.hpp"

using namespace ferry;

namespace {

cudaEvent_t fake_event(uintptr_t id) { return reinterpret_cast<cudaEvent_t>(id); }

}  // namespace

TEST(GateSlots, ASlotComesBackOnlyOnceItsLastRunFinished) {
  std::set<cudaEvent_t> done, destroyed;
  GateSlots slots(
      3, [&](cudaEvent_t e) { return done.count(e) > 0; }, [&](cudaEvent_t e) { destroyed.insert(e); });
  EXPECT_EQ(slots.take(), 0);
  EXPECT_EQ(slots.take(), 1);
  EXPECT_EQ(slots.take(), 2);
  const std::string full = error_of([&] { slots.take(); });
  EXPECT_NE(full.find("prepare: 3 prepared collectives exist already"), std::string::npos) << full;
  slots.retire(1, fake_event(11));
  EXPECT_FALSE(error_of([&] { slots.take(); }).empty());  // its run has not finished
  EXPECT_TRUE(destroyed.empty());
  done.insert(fake_event(11));
  EXPECT_EQ(slots.take(), 1);
  EXPECT_EQ(destroyed.count(fake_event(11)), 1u);  // the event goes with the wait
  slots.retire(0, fake_event(12));
  slots.retire(2, fake_event(13));
  done.insert(fake_event(13));
  slots.reclaim();
  EXPECT_EQ(slots.free_count(), 1u);
  slots.drop_retiring();  // close(): the unfinished one's event destroyed, its slot never handed out again
  EXPECT_EQ(destroyed.count(fake_event(12)), 1u);
  EXPECT_EQ(slots.take(), 2);
  EXPECT_FALSE(error_of([&] { slots.take(); }).empty());
}

TEST(GateSlots, ASlotNeverArmedComesBackAtOnce) {
  GateSlots slots(
      2, [](cudaEvent_t) { return false; }, [](cudaEvent_t) {});
  const int a = slots.take(), b = slots.take();
  EXPECT_FALSE(error_of([&] { slots.take(); }).empty());
  slots.put_back(b);  // prepare() failed on a later local rank: no run, no event to wait for
  EXPECT_EQ(slots.free_count(), 1u);
  EXPECT_EQ(slots.take(), b);
  slots.retire(a, fake_event(1));  // a released one whose run never ends stays out
  EXPECT_FALSE(error_of([&] { slots.take(); }).empty());
}

TEST(PreparedCall, TheGateIsTheHostWordOrTheRanksDeviceSlot) {
  auto flags = std::make_unique<DeviceFlags>();
  uint64_t host_word = 0, device_view = 0, copy_word = 0;
  PreparedCall p;
  p.host_gate.push_back(Pinned<uint64_t>{&host_word, &device_view});
  p.device_gate.push_back(5);
  p.device_gate_copy.push_back(Pinned<uint64_t>{&copy_word, nullptr});
  p.generation = 7;
  EXPECT_EQ(p.gate_address(0, flags.get()), &device_view);
  Gate g = p.watched_gate(0, flags.get());
  EXPECT_EQ(g.host, &host_word);
  EXPECT_EQ(g.device, nullptr);
  EXPECT_EQ(g.value, 7u);
  p.gate_on_device = true;
  EXPECT_EQ(p.gate_address(0, flags.get()), &flags->gates[5].value);
  g = p.watched_gate(0, flags.get());
  EXPECT_EQ(g.host, &copy_word);  // where the watchdog's rescue copies the device gate
  EXPECT_EQ(g.device, &flags->gates[5].value);
  EXPECT_EQ(g.value, 7u);
}
