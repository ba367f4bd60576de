#include <gtest/gtest.h>

#include <functional>

#include "coll/call_memo.hpp"

namespace ferry {
namespace {

CollectiveArgs some_call() {
  CollectiveArgs a;
  a.op = CollOp::kAllToAllv;
  a.outs = {reinterpret_cast<void*>(0x7f0000001000), reinterpret_cast<void*>(0x7f0000101000)};
  a.ins = {reinterpret_cast<const void*>(0x7f0000201000), reinterpret_cast<const void*>(0x7f0000301000)};
  a.streams = {reinterpret_cast<cudaStream_t>(0x10), reinterpret_cast<cudaStream_t>(0x20)};
  a.bytes_per_rank = 4096;
  a.counts = {1, 2, 3, 4};
  return a;
}

}  // namespace

TEST(CallKey, EqualCallsHaveEqualKeysWhateverTheStreams) {
  CollectiveArgs a = some_call(), b = some_call();
  b.streams = {reinterpret_cast<cudaStream_t>(0x30), nullptr};
  EXPECT_EQ(call_key(a, false), call_key(b, false));
}

TEST(CallKey, EveryArgumentThatBuildReadsChangesTheKey) {
  const std::string base = call_key(some_call(), false);
  EXPECT_NE(call_key(some_call(), true), base) << "capture state";
  const std::vector<std::function<void(CollectiveArgs&)>> changes = {
      [](CollectiveArgs& a) { a.op = CollOp::kAllToAll; },
      [](CollectiveArgs& a) { a.outs[1] = static_cast<char*>(a.outs[1]) + 1; },
      [](CollectiveArgs& a) { a.ins[0] = static_cast<const char*>(a.ins[0]) + 256; },
      [](CollectiveArgs& a) { a.outs.pop_back(); },
      [](CollectiveArgs& a) { a.bytes_per_rank += 1; },
      [](CollectiveArgs& a) { a.counts[3] = 5; },
      [](CollectiveArgs& a) { a.counts.push_back(0); },
      [](CollectiveArgs& a) { a.root = 1; },
      [](CollectiveArgs& a) { a.count = 7; },
      [](CollectiveArgs& a) { a.dtype = DType::kBFloat16; },
      [](CollectiveArgs& a) { a.red_op = RedOp::kMax; },
      [](CollectiveArgs& a) { a.algo = Algo::kSm; },
      [](CollectiveArgs& a) { a.local_copy = LocalCopy::kPeer; },
      [](CollectiveArgs& a) { a.signals = Signals::kKernel; },
  };
  for (size_t i = 0; i < changes.size(); ++i) {
    CollectiveArgs a = some_call();
    changes[i](a);
    EXPECT_NE(call_key(a, false), base) << "change #" << i;
  }
}

TEST(CallKey, CountsAndPointersDoNotRunTogether) {
  // Vectors carry their length: moving an element from one to the next differs.
  CollectiveArgs a = some_call(), b = some_call();
  a.counts = {1, 2};
  b.counts = {1, 2, 0};
  EXPECT_NE(call_key(a, false), call_key(b, false));
}

TEST(CallMemo, FindsWhatWasPutAndForgetsAtCapacity) {
  CallMemo<int> memo(3);
  EXPECT_EQ(memo.find("a"), nullptr);
  memo.put("a", std::make_shared<const int>(1));
  memo.put("b", std::make_shared<const int>(2));
  ASSERT_NE(memo.find("a"), nullptr);
  EXPECT_EQ(*memo.find("a"), 1);
  memo.put("c", std::make_shared<const int>(3));
  EXPECT_EQ(memo.size(), 3u);
  memo.put("d", std::make_shared<const int>(4));  // full: starts over
  EXPECT_EQ(memo.size(), 1u);
  EXPECT_EQ(memo.find("a"), nullptr);
  EXPECT_EQ(*memo.find("d"), 4);
  memo.clear();
  EXPECT_EQ(memo.find("d"), nullptr);
}

}  // namespace ferry
