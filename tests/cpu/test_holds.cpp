// Holds (src/sync/holds.hpp): a free waits while something may hold a
// stream, and runs once nothing does.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "sync/holds.hpp"

namespace ferry {
namespace {

TEST(Holds, FreeRunsAtOnceWhenNothingHolds) {
  int freed = 0;
  sync::free_when_unheld([&] { ++freed; }, "a buffer");
  EXPECT_EQ(freed, 1);
  EXPECT_EQ(sync::holding_now(), "");
}

TEST(Holds, FreeIsKeptWhileAHoldHoldsAndRunsAfter) {
  std::atomic<bool> armed{true};
  int freed = 0;
  {
    sync::Hold hold("a transfer armed on cuda:0", [&] { return armed.load(); });
    EXPECT_EQ(sync::holding_now(), "a transfer armed on cuda:0");
    sync::free_when_unheld([&] { ++freed; }, "a host pool");
    EXPECT_EQ(freed, 0);
    EXPECT_EQ(sync::run_kept_frees(), 1u);  // still held
    EXPECT_EQ(freed, 0);
    armed = false;  // triggered: the hold stays registered but no longer holds
    EXPECT_EQ(sync::holding_now(), "");
    EXPECT_EQ(sync::run_kept_frees(), 0u);
    EXPECT_EQ(freed, 1);
  }
  EXPECT_EQ(sync::run_kept_frees(), 0u);
  EXPECT_EQ(freed, 1);  // run once only
}

TEST(Holds, KeptFreesRunAtTheNextFreeInOrder) {
  std::vector<int> order;
  auto hold = std::make_unique<sync::Hold>("armed", [] { return true; });
  sync::free_when_unheld([&] { order.push_back(1); }, "first");
  sync::free_when_unheld([&] { order.push_back(2); }, "second");
  EXPECT_TRUE(order.empty());
  hold.reset();  // dropped: no longer asked
  sync::free_when_unheld([&] { order.push_back(3); }, "third");
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(Holds, AnOwnerIsNotAskedAboutItsOwnHolds) {
  int mine = 0, other = 0;
  sync::Hold a(
      "mine", [] { return true; }, &mine);
  EXPECT_EQ(sync::holding_now(&mine), "");
  EXPECT_EQ(sync::holding_now(), "mine");
  {
    sync::Hold b(
        "someone else's", [] { return true; }, &other);
    EXPECT_EQ(sync::holding_now(&mine), "someone else's");
  }
  EXPECT_EQ(sync::holding_now(&mine), "");
}

TEST(Holds, ARefusalNamesTheCallTheHoldAndWhatWouldWait) {
  int owner = 0;
  EXPECT_NO_THROW(sync::refuse_while_held("close", "unmapping the heap's memory"));
  sync::Hold h(
      "a prepared page transfer (fetch, 4096 bytes) armed on cuda:0", [] { return true; }, &owner);
  EXPECT_NO_THROW(sync::refuse_while_held("close", "freeing GPU memory", &owner));
  try {
    sync::refuse_while_held("close", "unmapping the heap's memory");
    FAIL() << "not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
    const std::string m = e.what();
    EXPECT_NE(m.find("close: a prepared page transfer (fetch, 4096 bytes) armed on cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("unmapping the heap's memory waits for every stream"), std::string::npos) << m;
    EXPECT_NE(m.find("trigger it first"), std::string::npos) << m;
  }
}

TEST(Holds, ARefusalGoesToThePeersAsARecordTheyCanTellApart) {
  EXPECT_EQ(sync::refusal("Communicator", "setting one up"), "");
  bool holding = true;
  sync::Hold h("a prepared page transfer (fetch, 4096 bytes) armed on cuda:0", [&] { return holding; });
  const std::string why = sync::refusal("Communicator", "setting one up");
  EXPECT_EQ(why.rfind("Communicator: a prepared page transfer", 0), 0u) << why;
  // A communicator's records (host name first) and a heap's ("call #1: ...")
  // are not refusals; the first refusing rank is named with its message.
  std::vector<std::string> records = {"node7\n123\n0000:00:06.0\n/tmp/s\n", sync::refusal_record(why),
                                      sync::refusal_record("rank 2's own reason"), "call #1: create"};
  const auto [rank, message] = sync::first_refusal(records);
  EXPECT_EQ(rank, 1);
  EXPECT_EQ(message, why);
  records[1] = "call #1: create";
  EXPECT_EQ(sync::first_refusal(records), std::make_pair(2, std::string("rank 2's own reason")));
  records[2] = "refused";  // only the marker makes a refusal
  EXPECT_EQ(sync::first_refusal(records).first, -1);
  EXPECT_EQ(sync::first_refusal({}).first, -1);
  EXPECT_EQ(sync::first_refusal({sync::refusal_record("")}), std::make_pair(0, std::string()));
  holding = false;
  EXPECT_EQ(sync::refusal("Communicator", "setting one up"), "");
}

TEST(Holds, ARefusedSetupTellsThePeersAndTheyNameTheRank) {
  std::vector<std::string> told;
  auto tell = [&](const std::string& mine) {
    told.push_back(mine);
    return std::vector<std::string>{"peer's record", mine};
  };
  try {
    sync::refuse_setup("Communicator: a transfer armed on cuda:0", tell);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
    EXPECT_STREQ(e.what(), "Communicator: a transfer armed on cuda:0");
  }
  ASSERT_EQ(told.size(), 1u);
  // A peer's view of the same exchange.
  const std::vector<std::string> records = {"peer's record", told[0]};
  try {
    sync::throw_if_refused(records, "communicator setup");
    FAIL() << "a refusal was not seen";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
    EXPECT_STREQ(e.what(), "communicator setup: rank 1 refused it: Communicator: a transfer armed on cuda:0");
  }
  EXPECT_NO_THROW(sync::throw_if_refused({"a", "b"}, "communicator setup"));
  // No exchange to tell (a GPU bootstrap), or one that fails: the refusal alone.
  EXPECT_THROW(sync::refuse_setup("refused", nullptr), Error);
  auto failing = [](const std::string&) -> std::vector<std::string> { throw std::runtime_error("peer gone"); };
  try {
    sync::refuse_setup("refused", failing);
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "refused");
  }
}

TEST(Holds, AThrowingFreeDoesNotStopTheOthers) {
  int freed = 0;
  {
    sync::Hold hold("armed", [] { return true; });
    sync::free_when_unheld([] { throw std::runtime_error("gone"); }, "broken");
    sync::free_when_unheld([&] { ++freed; }, "fine");
  }
  EXPECT_EQ(sync::run_kept_frees(), 0u);
  EXPECT_EQ(freed, 1);
}

TEST(Holds, HoldsComeAndGoWhileOtherThreadsFree) {
  std::atomic<int> freed{0};
  std::atomic<bool> stop{false};
  std::thread holder([&] {
    while (!stop) {
      sync::Hold h("armed", [] { return true; });
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> freers;
  for (int t = 0; t < 3; ++t)
    freers.emplace_back([&] {
      for (int i = 0; i < 200; ++i) sync::free_when_unheld([&] { ++freed; }, "buffer");
    });
  for (auto& t : freers) t.join();
  stop = true;
  holder.join();
  sync::run_kept_frees();
  EXPECT_EQ(freed.load(), 600);  // each exactly once, whether at once or kept
}

}  // namespace
}  // namespace ferry
