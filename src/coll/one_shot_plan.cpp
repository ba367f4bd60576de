#include "coll/one_shot.hpp"

namespace ferry {

int one_shot_blocks(size_t bytes) {
  // 32 KB per block: one block moves a few KB in about a microsecond over
  // NVLink; more blocks only pay off once the bytes keep them busy.
  constexpr size_t kPerBlock = 32 << 10;
  size_t b = (bytes + kPerBlock - 1) / kPerBlock;
  if (b < 1) b = 1;
  return static_cast<int>(b < size_t(kOneShotMaxBlocks) ? b : kOneShotMaxBlocks);
}

std::string one_shot_unsupported(CollOp op, int world, size_t bytes_per_peer, size_t slot_bytes) {
  if (op != CollOp::kAllGather && op != CollOp::kAllToAll && op != CollOp::kBroadcast)
    return std::string("algo 'sm' runs all_gather, all_to_all and broadcast, not ") + coll_op_name(op);
  if (world > kOneShotMaxRanks)
    return "algo 'sm' runs on at most " + std::to_string(kOneShotMaxRanks) + " ranks; this communicator has " +
           std::to_string(world);
  if (slot_bytes == 0) return "algo 'sm' is off (FERRY_SM_BYTES=0: no window was allocated)";
  if (bytes_per_peer > slot_bytes)
    return "algo 'sm' moves at most FERRY_SM_BYTES = " + std::to_string(slot_bytes) +
           " bytes per peer; this call moves " + std::to_string(bytes_per_peer) +
           " (use a copy-engine variant, or raise FERRY_SM_BYTES on every rank)";
  return {};
}

OneShotStep plan_one_shot(CollOp op, int rank, int world, const char* in, char* out, size_t bytes, int root,
                          uint32_t tag) {
  OneShotStep s;
  s.in = in;
  s.out = out;
  s.bytes = bytes;
  s.rank = rank;
  s.world = world;
  s.blocks = one_shot_blocks(bytes);
  s.tag = tag;
  switch (op) {
    case CollOp::kAllGather:
      s.out_stride = bytes;
      // In place: the input is this rank's block of the output already.
      s.own_copy = in != out + static_cast<size_t>(rank) * bytes;
      break;
    case CollOp::kAllToAll:
      s.in_stride = s.out_stride = bytes;
      s.own_copy = in != out;
      break;
    case CollOp::kBroadcast:
      s.root = root;
      s.own_copy = rank == root && in != out;
      break;
    default:
      break;
  }
  return s;
}

}  // namespace ferry
