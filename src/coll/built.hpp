// A validated, planned call as one local rank runs it: what the planner made
// (coll/planner.hpp) and the interned ready record its signals carry.
// Eager calls, captured calls and prepared calls all emit one of these.
#pragma once

#include <cstdint>

#include "coll/program.hpp"
#include "coll/record_pool.hpp"

namespace ferry {

struct Built {
  Program program;
  Record record;
  uint64_t value = 0;
};

}  // namespace ferry
