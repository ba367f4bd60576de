#include "coll/selector.hpp"

#include <limits>

#include "core/error.hpp"

namespace ferry {

const char* algo_name(Algo a) {
  switch (a) {
    case Algo::kAuto:
      return "auto";
    case Algo::kPcpy:
      return "pcpy";
    case Algo::kB2b:
      return "b2b";
    case Algo::kSeq:
      return "seq";
    case Algo::kSm:
      return "sm";
  }
  return "unknown";
}

Algo parse_algo(const std::string& name, const char* what) {
  if (name == "auto" || name.empty()) return Algo::kAuto;
  if (name == "pcpy") return Algo::kPcpy;
  if (name == "b2b") return Algo::kB2b;
  if (name == "seq") return Algo::kSeq;
  if (name == "sm") return Algo::kSm;
  throw_error(FERRY_ERROR_INVALID_ARGUMENT,
              std::string(what) + " is '" + name + "'; expected one of 'auto', 'pcpy', 'b2b', 'seq', 'sm'");
}

std::vector<SelectorRule> default_selector_table() {
  // From `ferry bench` on 2 and 4 H200s (docs/performance.md): one
  // batched submission (b2b) is fastest up to about 2 MB per rank; above, the
  // pushes issued one after another in cyclic-shift order (seq) are as fast or
  // faster (x4 all-gather: 85 us at 4 MB against 92 for b2b; 372 GB/s busbw at
  // 256 MB). Parallel engines (pcpy) lose 30-40% of the bandwidth from 64 MB up
  // on x4 and are never chosen here. `ferry tune` measures a table per machine;
  // python/ferry/tuning/ ships the measured H200 tables, which Python loads.
  constexpr size_t kAny = std::numeric_limits<size_t>::max();
  std::vector<SelectorRule> t;
  for (CollOp op : {CollOp::kAllGather, CollOp::kAllToAll, CollOp::kAllToAllv, CollOp::kBroadcast,
                    CollOp::kReduceScatter, CollOp::kAllReduce}) {
    t.push_back({op, 0, size_t(2) << 20, Algo::kB2b});
    t.push_back({op, 0, kAny, Algo::kSeq});
  }
  return t;
}

Selection select_variant(CollOp op, int world, size_t bytes_per_rank, Algo forced,
                         const std::vector<SelectorRule>& table, bool sm_possible) {
  if (forced != Algo::kAuto) return {forced, Signals::kAuto};
  for (const auto& r : table)
    if (r.op == op && (r.world == 0 || r.world == world) && bytes_per_rank <= r.max_bytes &&
        (r.algo != Algo::kSm || sm_possible))
      return {r.algo, r.signals};
  return {};
}

}  // namespace ferry
