#include <algorithm>

#include "coll/sm_path.hpp"

namespace ferry {

int sm_path_blocks(size_t bytes, SmPathBlocks per) {
  // Low-latency format: each thread stores, then waits for, its units (8
  // data bytes each) one after another, so more blocks shorten that row.
  const bool ll = sm_path_low_latency(bytes);
  const size_t unit = ll ? 8 : 1, have = ll ? sm_path_ll_units(bytes) : bytes;
  const size_t step = std::max<size_t>((ll ? per.low_latency : per.spans) / unit, 1);
  const size_t b = std::max<size_t>((have + step - 1) / step, 1);
  return static_cast<int>(std::min<size_t>(b, static_cast<size_t>(std::clamp(per.max_blocks, 1, kSmPathMaxBlocks))));
}

int sm_path_grid_bound(int limit, int resident, int sharing) {
  const int most = std::clamp(limit, 1, kSmPathMaxBlocks);
  if (sharing > 1) return std::clamp(resident / (2 * sharing), 1, most);
  return std::clamp(resident - kSmPathFreeSms, 1, most);
}

bool sm_path_two_shot(CollOp op, int world, size_t bytes, const SmPathBlocks& per) {
  return op == CollOp::kAllReduce && world >= 3 && per.two_shot_from > 0 && bytes >= per.two_shot_from &&
         !sm_path_low_latency(sm_path_two_shot_chunk(bytes, world, per));
}

size_t sm_path_two_shot_part(size_t bytes, int world) {
  const auto w = static_cast<size_t>(std::max(world, 1));
  return ((bytes + w - 1) / w + 15) / 16 * 16;
}

size_t sm_path_two_shot_chunk(size_t bytes, int world, const SmPathBlocks& per) {
  const size_t part = sm_path_two_shot_part(bytes, world);
  const size_t slot = per.slot_bytes / 16 * 16;
  return slot > 0 && part > slot ? slot : part;
}

size_t sm_path_largest_block(CollOp op, int world, size_t bytes, const std::vector<size_t>& counts,
                             const SmPathBlocks& per) {
  if (sm_path_two_shot(op, world, bytes, per)) return sm_path_two_shot_chunk(bytes, world, per);
  if (op != CollOp::kAllToAllv) return bytes;
  size_t largest = 0;
  for (size_t c : counts) largest = c > largest ? c : largest;
  return largest;
}

std::string sm_path_unsupported(CollOp /* every op runs on the SM path */, int world, size_t largest_block,
                                size_t slot_bytes) {
  if (world > kSmPathMaxRanks)
    return "algo 'sm' runs on at most " + std::to_string(kSmPathMaxRanks) + " ranks; this communicator has " +
           std::to_string(world);
  if (slot_bytes == 0) return "algo 'sm' is off (FERRY_SM_BYTES=0: no window was allocated)";
  if (largest_block > slot_bytes)
    return "algo 'sm' moves at most FERRY_SM_BYTES = " + std::to_string(slot_bytes) +
           " bytes per peer; this call moves " + std::to_string(largest_block) +
           " (use a copy-engine variant, or raise FERRY_SM_BYTES on every rank)";
  return {};
}

Selection select_variant_with_sm(CollOp op, int world, size_t selection_bytes, size_t largest_block, size_t slot_bytes,
                                 Algo forced, const std::vector<SelectorRule>& table) {
  const bool sm_possible = sm_path_unsupported(op, world, largest_block, slot_bytes).empty();
  if (forced == Algo::kSm && !sm_possible) forced = Algo::kAuto;
  return select_variant(op, world, selection_bytes, forced, table, sm_possible);
}

SmPathStep plan_sm_path(CollOp op, int rank, int world, const char* in, char* out, size_t bytes, int root,
                        const std::vector<size_t>& counts, uint32_t tag, uint32_t dtype, uint32_t red_op,
                        SmPathBlocks per) {
  SmPathStep s;
  s.dtype = dtype;
  s.red_op = red_op;
  s.in = in;
  s.out = out;
  s.rank = rank;
  s.world = world;
  const size_t largest = sm_path_largest_block(op, world, bytes, counts, per);
  const size_t part = sm_path_two_shot_part(bytes, world);
  if (sm_path_two_shot(op, world, bytes, per)) {
    s.two_shot_chunk = sm_path_two_shot_chunk(bytes, world, per);
    s.two_shot_rounds = static_cast<uint32_t>((part + s.two_shot_chunk - 1) / s.two_shot_chunk);
  }
  s.blocks = sm_path_blocks(largest, per);
  s.low_latency = sm_path_low_latency(largest);
  s.tag = tag;
  const auto W = static_cast<size_t>(world);
  const auto r = static_cast<size_t>(rank);
  for (size_t p = 0; p < W; ++p) {
    switch (op) {
      case CollOp::kAllGather:
        s.send_bytes[p] = s.recv_bytes[p] = bytes;
        s.recv_offset[p] = p * bytes;
        break;
      case CollOp::kAllToAll:
        s.send_bytes[p] = s.recv_bytes[p] = bytes;
        s.send_offset[p] = s.recv_offset[p] = p * bytes;
        break;
      case CollOp::kAllToAllv:
        // Packed by destination on the way in, by source on the way out.
        s.send_bytes[p] = counts[r * W + p];
        s.recv_bytes[p] = counts[p * W + r];
        if (p > 0) {
          s.send_offset[p] = s.send_offset[p - 1] + counts[r * W + p - 1];
          s.recv_offset[p] = s.recv_offset[p - 1] + counts[(p - 1) * W + r];
        }
        break;
      case CollOp::kBroadcast:
        s.send_bytes[p] = r == static_cast<size_t>(root) ? bytes : 0;
        s.recv_bytes[p] = p == static_cast<size_t>(root) ? bytes : 0;
        break;
      case CollOp::kReduceScatter:  // block p of `in` to rank p; the result at out
        s.send_bytes[p] = s.recv_bytes[p] = bytes;
        s.send_offset[p] = p * bytes;
        break;
      case CollOp::kAllReduce:
        if (s.two_shot_rounds) {  // part p of `in` to rank p, which sends it back reduced into part p of `out`
          s.send_offset[p] = s.recv_offset[p] = std::min(p * part, bytes);
          s.send_bytes[p] = s.recv_bytes[p] = std::min(part, bytes - s.send_offset[p]);
        } else {  // all of `in` to every rank
          s.send_bytes[p] = s.recv_bytes[p] = bytes;
        }
        break;
    }
  }
  // The own block (none for a broadcast's non-roots: they receive nothing
  // from themselves), unless the call is in place: the input already lies
  // where it goes. A reduction reads its own span where it is.
  s.own_bytes = dtype == 0 && in + s.send_offset[r] != out + s.recv_offset[r] ? s.recv_bytes[r] : 0;
  return s;
}

}  // namespace ferry
