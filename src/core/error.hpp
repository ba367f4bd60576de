// Errors: one exception type inside the library, converted to result codes at
// the C API and to Python exceptions at the binding. Every check macro reports
// the failing expression, the CUDA error name and string, and file:line.
#pragma once

#include <stdexcept>
#include <string>

#include "ferry/ferry.h"

namespace ferry {

class Error : public std::runtime_error {
 public:
  Error(ferry_result_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ferry_result_t code() const { return code_; }

 private:
  ferry_result_t code_;
};

[[noreturn]] void throw_error(ferry_result_t code, const std::string& message);
// The code of `e` when it is ferry's Error, else `otherwise`: what a rank
// reports to its peers when a step of a collective call failed on it.
inline ferry_result_t error_code(const std::exception& e, ferry_result_t otherwise) {
  const auto* mine = dynamic_cast<const Error*>(&e);
  return mine ? mine->code() : otherwise;
}
[[noreturn]] void throw_cuda_error(int err, const char* expr, const char* file, int line);
[[noreturn]] void throw_cu_error(int err, const char* expr, const char* file, int line);
[[noreturn]] void throw_errno(const std::string& what, int err, const char* file, int line);

}  // namespace ferry

// An argument the caller got wrong: the message names the argument and what was expected.
#define FERRY_ARG_CHECK(cond, msg)                                        \
  do {                                                                    \
    if (!(cond)) ::ferry::throw_error(FERRY_ERROR_INVALID_ARGUMENT, msg); \
  } while (0)

#define FERRY_CUDA_CHECK(expr)                                                             \
  do {                                                                                     \
    int ferry_err_ = static_cast<int>(expr);                                               \
    if (ferry_err_ != 0) ::ferry::throw_cuda_error(ferry_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define FERRY_CU_CHECK(expr)                                                             \
  do {                                                                                   \
    int ferry_err_ = static_cast<int>(expr);                                             \
    if (ferry_err_ != 0) ::ferry::throw_cu_error(ferry_err_, #expr, __FILE__, __LINE__); \
  } while (0)

#define FERRY_SYS_CHECK(expr, what)                                        \
  do {                                                                     \
    if ((expr) < 0) ::ferry::throw_errno(what, errno, __FILE__, __LINE__); \
  } while (0)
