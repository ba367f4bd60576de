// The message of the invalid-argument error `fn` throws, or "" (and a test
// failure) when it throws none.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/error.hpp"

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const ferry::Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}
