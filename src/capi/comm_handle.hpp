// What a ferry_comm_t is, for every C API file that takes one.
#pragma once

#include <memory>

#include "coll/communicator.hpp"
#include "core/error.hpp"
#include "ferry/ferry.h"

struct ferry_comm {
  // Shared: a pool made from it watches it (weak_ptr) and stops using it once
  // the handle is destroyed.
  std::shared_ptr<ferry::Communicator> impl;
};

namespace ferry {
namespace capi {

inline const std::shared_ptr<Communicator>& get_shared(ferry_comm_t comm) {
  if (!comm || !comm->impl) throw_error(FERRY_ERROR_INVALID_ARGUMENT, "comm is NULL or destroyed");
  return comm->impl;
}

inline Communicator& get(ferry_comm_t comm) { return *get_shared(comm); }

}  // namespace capi
}  // namespace ferry
