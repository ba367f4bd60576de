// The C API's one way of running a call: ferry::Error becomes its result code
// and the thread's last-error message (ferry_last_error), shared by every C
// API file.
#pragma once

#include <cstring>
#include <exception>
#include <string>
#include <type_traits>

#include "core/error.hpp"
#include "ferry/ferry.h"

namespace ferry {
namespace capi {

// The calling thread's message for its last failed call (one per library:
// an inline function's static is shared by every file that uses it).
inline std::string& last_error() {
  thread_local std::string message;
  return message;
}

// The integer a C caller stored in an enum field or argument. Any int is a
// value of a C enum, while in C++ loading a value outside the enumeration's
// range is undefined (and a range check of it may be optimised away): the
// bytes are read as the enum's integer type instead.
template <typename E>
int enum_value(const E& e) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<int>(v);
}

// enum_value(e), refused with `message` outside [lo, hi].
template <typename E>
int enum_in(const E& e, int lo, int hi, const std::string& message) {
  const int v = enum_value(e);
  FERRY_ARG_CHECK(v >= lo && v <= hi, message);
  return v;
}

template <typename Fn>
ferry_result_t guarded(Fn&& fn) {
  try {
    last_error().clear();
    fn();
    return FERRY_SUCCESS;
  } catch (const Error& e) {
    last_error() = e.what();
    return e.code();
  } catch (const std::exception& e) {
    last_error() = e.what();
    return FERRY_ERROR_INTERNAL;
  }
}

}  // namespace capi
}  // namespace ferry
