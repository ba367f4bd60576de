// What a call under test throws: error_of, the message of the
// invalid-argument error it must throw; code_of, the code of whatever ferry
// error it throws (FERRY_SUCCESS for none), and its message.
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

inline ferry_result_t code_of(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const ferry::Error& e) {
    if (message) *message = e.what();
    return e.code();
  }
  return FERRY_SUCCESS;
}
