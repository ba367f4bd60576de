#include <gtest/gtest.h>

#include <cstdlib>

#include "core/env.hpp"
#include "core/error.hpp"

using namespace ferry;

TEST(Knobs, EveryKnobHasDocAndParses) {
  for (const auto& k : knobs()) {
    EXPECT_TRUE(std::string(k.name).rfind("FERRY_", 0) == 0) << k.name;
    EXPECT_GT(std::string(k.doc).size(), 10u) << k.name;
    if (std::string(k.type) == "int") knob_int(k.name);
    if (std::string(k.type) == "float") knob_float(k.name);
  }
}

TEST(Knobs, UndeclaredNameIsAnError) { EXPECT_THROW(knob_string("FERRY_NO_SUCH_KNOB"), Error); }

TEST(Knobs, BadValueNamesTheVariable) {
  setenv("FERRY_BATCH_MAX", "lots", 1);
  try {
    knob_int("FERRY_BATCH_MAX");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FERRY_BATCH_MAX=lots"), std::string::npos);
  }
  unsetenv("FERRY_BATCH_MAX");
  EXPECT_EQ(knob_int("FERRY_BATCH_MAX"), 128);
}

TEST(Errors, CudaErrorsNameTheCall) {
  try {
    FERRY_CUDA_CHECK(2 /* cudaErrorMemoryAllocation */);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_CUDA);
    std::string m = e.what();
    EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos);
    EXPECT_NE(m.find("test_errors.cpp"), std::string::npos);
  }
}
