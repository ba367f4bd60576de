// What a ferry_comm_t is, for every C API file that takes one.
#pragma once

#include <memory>

#include "coll/communicator.hpp"
#include "core/error.hpp"
#include "ferry/ferry.h"

struct ferry_comm {
  std::unique_ptr<ferry::Communicator> impl;
};

namespace ferry {
namespace capi {

inline Communicator& get(ferry_comm_t comm) {
  if (!comm || !comm->impl) throw_error(FERRY_ERROR_INVALID_ARGUMENT, "comm is NULL or destroyed");
  return *comm->impl;
}

}  // namespace capi
}  // namespace ferry
