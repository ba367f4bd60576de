#include <gtest/gtest.h>

#include "coll/signature.hpp"

using namespace ferry;

TEST(Signature, DiffersWhenAnyArgumentDiffers) {
  uint32_t base = call_signature(CollOp::kAllGather, 4096, 1, 0);
  EXPECT_NE(base, call_signature(CollOp::kAllToAll, 4096, 1, 0));
  EXPECT_NE(base, call_signature(CollOp::kAllGather, 4097, 1, 0));
  EXPECT_NE(base, call_signature(CollOp::kAllGather, 4096, 2, 0));
  EXPECT_NE(base, call_signature(CollOp::kAllGather, 4096, 1, 64));
  EXPECT_EQ(base, call_signature(CollOp::kAllGather, 4096, 1, 0));
}

TEST(Signature, TagsAreNeverZeroAndCarryTheSequence) {
  for (uint64_t seq : {0ull, 1ull, 41ull, 0xffffffffull, 0x100000000ull}) {
    uint64_t t = make_tag(seq, 0);
    EXPECT_NE(t, 0u);
    EXPECT_EQ(tag_seq(t), seq & 0xffffffffull);
  }
}
