#include "coll/program.hpp"

namespace ferry {

void Program::add_exchange(Exchange x) {
  for (int p : x.targets) targets_mask |= uint64_t(1) << p;
  for (int p : x.sources) sources_mask |= uint64_t(1) << p;
  Step s;
  s.kind = Step::Kind::kExchange;
  s.exchange = std::move(x);
  steps.push_back(std::move(s));
}

void Program::add_reduce(const ReduceStep& r, bool beside_next) {
  Step s;
  s.kind = Step::Kind::kReduce;
  s.reduce = r;
  s.beside_next = beside_next;
  steps.push_back(std::move(s));
}

void Program::add_unpack(std::vector<Copy> copies) {
  Step s;
  s.kind = Step::Kind::kUnpack;
  s.unpack = std::move(copies);
  steps.push_back(std::move(s));
}

void Program::add_sm_path(const SmPathStep& o) {
  for (int p = 0; p < o.world; ++p)
    if (p != o.rank) targets_mask |= uint64_t(1) << p, sources_mask |= uint64_t(1) << p;
  Step s;
  s.kind = Step::Kind::kSmPath;
  s.sm_path = o;
  steps.push_back(std::move(s));
}

}  // namespace ferry
