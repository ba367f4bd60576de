#include "coll/selector.hpp"

#include <limits>

#include "coll/collective_args.hpp"
#include "coll/sm_path.hpp"
#include "coll/tuning.hpp"
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

Selector::Selector(std::string gpu_name, int world, std::vector<SelectorRule> startup_table, Algo forced,
                   bool kernel_signals_default)
    : gpu_name_(std::move(gpu_name)),
      world_(world),
      table_(startup_table),
      startup_table_(std::move(startup_table)),
      forced_(forced),
      kernel_signals_default_(kernel_signals_default) {}

Resolved Selector::resolve(const CollectiveArgs& a, size_t selection_bytes, const SmPathBlocks& sm_blocks) const {
  const Selection s = a.algo != Algo::kAuto ? Selection{a.algo, Signals::kAuto}
                                            : select_variant_with_sm(a.op, world_, selection_bytes,
                                                                     sm_largest_block(a, world_, sm_blocks),
                                                                     sm_blocks.slot_bytes, forced_, table_);
  return {s.algo, kernel_signals(a.signals, s.signals, kernel_signals_default_)};
}

Resolved Selector::choose(CollOp op, size_t bytes_per_rank, const SmPathBlocks& sm_blocks) const {
  const size_t largest =
      op == CollOp::kAllReduce
          ? sm_path_largest_block(op, world_, bytes_per_rank * static_cast<size_t>(world_), {}, sm_blocks)
          : bytes_per_rank;
  const Selection s =
      select_variant_with_sm(op, world_, bytes_per_rank, largest, sm_blocks.slot_bytes, forced_, table_);
  return {s.algo, kernel_signals(Signals::kAuto, s.signals, kernel_signals_default_)};
}

void Selector::set_table(const std::vector<SelectorRule>& rules) { table_ = rules.empty() ? startup_table_ : rules; }

void Selector::set_preset(const std::string& preset) {
  set_table(shipped_preset(shipped_tables(), gpu_name_, world_, preset));
}

size_t sm_largest_block(const CollectiveArgs& a, int world, const SmPathBlocks& sm_blocks) {
  const bool reduction = a.op == CollOp::kReduceScatter || a.op == CollOp::kAllReduce;
  return sm_path_largest_block(a.op, world, reduction ? a.count * dtype_bytes(a.dtype) : a.bytes_per_rank, a.counts,
                               sm_blocks);
}

}  // namespace ferry
