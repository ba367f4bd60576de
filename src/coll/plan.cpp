#include "coll/plan.hpp"

namespace ferry {

const char* coll_op_name(CollOp op) {
  switch (op) {
    case CollOp::kAllGather:
      return "all_gather";
    case CollOp::kAllToAll:
      return "all_to_all";
  }
  return "unknown";
}

std::vector<PeerCopy> plan_pushes(CollOp op, int rank, int world, const std::vector<char*>& out_by_rank, const char* in,
                                  size_t bytes) {
  std::vector<PeerCopy> out;
  if (bytes == 0) return out;
  for (int k = 1; k < world; ++k) {
    int p = (rank + k) % world;
    const char* src = op == CollOp::kAllGather ? in : in + static_cast<size_t>(p) * bytes;
    out.push_back(PeerCopy{p, Copy{out_by_rank[p] + static_cast<size_t>(rank) * bytes, src, bytes}});
  }
  return out;
}

Copy plan_local(CollOp op, int rank, char* out, const char* in, size_t bytes) {
  char* dst = out + static_cast<size_t>(rank) * bytes;
  const char* src = op == CollOp::kAllGather ? in : in + static_cast<size_t>(rank) * bytes;
  if (dst == src) return Copy{dst, src, 0};
  return Copy{dst, src, bytes};
}

bool local_copy_on_side_stream(size_t bytes) { return bytes >= (size_t(1) << 20); }

bool ranges_overlap(const void* a, size_t na, const void* b, size_t nb) {
  if (na == 0 || nb == 0) return false;
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + nb && y < x + na;
}

}  // namespace ferry
