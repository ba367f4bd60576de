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

size_t host_operations(const Program& p, int world) {
  const size_t peers = world > 1 ? static_cast<size_t>(world - 1) : 0;
  size_t ops = 0;
  for (const auto& s : p.steps) {
    switch (s.kind) {
      case Step::Kind::kExchange:
        // A ready copy, a push and a done copy per peer; the waits before and
        // after (one batch each); the own block (up to three kernels, or a
        // copy on the side stream and its two orderings); two event operations
        // more (pcpy's fork and join on the caller's stream).
        ops += 3 * peers + 2 + 3 + 2;
        break;
      case Step::Kind::kReduce:
        ops += 3;  // the launch, and the side stream's two orderings
        break;
      case Step::Kind::kUnpack:
        ops += peers + 1;  // one copy per block when copies are not batched
        break;
      case Step::Kind::kSmPath:
        ops += 1;
        break;
    }
  }
  return ops;
}

bool enqueue_ranks_apart(int local_ranks, size_t most_host_operations) {
  return local_ranks > 1 && most_host_operations > kSerialEnqueueOps;
}

bool capture_fits(int local_ranks, size_t most_host_operations) {
  return local_ranks <= 1 || most_host_operations <= kCapturedOpsMax;
}

}  // namespace ferry
