#include <gtest/gtest.h>

#include "coll/signature.hpp"

using namespace ferry;

TEST(Signature, DiffersWhenAnyArgumentDiffers) {
  uint32_t base = call_signature(CollOp::kAllGather, 4096, 1, 0);
  EXPECT_NE(base, call_signature(CollOp::kAllToAll, 4096, 1, 0));
  EXPECT_NE(base, call_signature(CollOp::kAllGather, 4097, 1, 0));
  EXPECT_NE(base, call_signature(CollOp::kAllGather, 4096, 2, 0));
  EXPECT_NE(base, call_signature(CollOp::kAllGather, 4096, 1, 64));
  EXPECT_NE(base, call_signature(CollOp::kAllGather, 4096, 1, 0, 3));
  EXPECT_EQ(base, call_signature(CollOp::kAllGather, 4096, 1, 0));
}

TEST(Signature, ValuesAreNeverZeroAndStable) {
  for (uint32_t sig : {0u, 1u, 0xffffffffu}) {
    EXPECT_NE(flag_value(sig), 0u);
    EXPECT_EQ(flag_value(sig), flag_value(sig));
  }
}

TEST(Signature, CountsHashSeesEveryEntry) {
  uint64_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 4, 3};
  EXPECT_NE(hash_values(a, 4), hash_values(b, 4));
  EXPECT_EQ(hash_values(a, 4), hash_values(a, 4));
}
