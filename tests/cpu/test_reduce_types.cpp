#include <gtest/gtest.h>

#include "coll/reduce.hpp"
#include "core/error.hpp"

using namespace ferry;

TEST(ReduceTypes, NamesRoundTripAndSizes) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32, DType::kFloat64, DType::kInt64})
    EXPECT_EQ(parse_dtype(dtype_name(t), "dtype"), t);
  EXPECT_EQ(dtype_bytes(DType::kBFloat16), 2u);
  EXPECT_EQ(dtype_bytes(DType::kInt64), 8u);
  for (RedOp op : {RedOp::kSum, RedOp::kMax, RedOp::kMin}) EXPECT_EQ(parse_red_op(red_op_name(op), "op"), op);
}

TEST(ReduceTypes, UnsupportedNamesAreErrorsNamingTheArgument) {
  try {
    parse_dtype("uint8", "dtype");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("dtype is 'uint8'"), std::string::npos);
  }
  try {
    parse_red_op("prod", "op");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("op is 'prod'; expected 'sum', 'max' or 'min'"), std::string::npos);
  }
}
