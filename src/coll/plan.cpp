#include "coll/plan.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace ferry {
namespace {

std::vector<int> all_peers_but(int rank, int world) { return cyclic_peers(rank, world); }

void add_push(Exchange& x, int peer, char* dst, const char* src, size_t bytes) {
  if (bytes > 0) x.pushes.push_back(PeerCopy{peer, Copy{dst, src, bytes}});
}

Copy local_copy(char* dst, const char* src, size_t bytes) { return Copy{dst, src, dst == src ? 0 : bytes}; }

// The own block read back from `src` on `peer` (where a push of this exchange
// put it) instead of copied within the GPU.
void pull_own_block(Exchange& x, int peer, const char* src) {
  x.local_pull = PeerCopy{peer, Copy{x.local.dst, src, x.local.bytes}};
}

// For collectives that push the own block itself to every target at `at` of
// its output: the first target's copy is read back.
void set_local_pull(Exchange& x, const std::vector<char*>& out_by_rank, size_t at) {
  if (x.local.bytes == 0 || x.pushes.empty()) return;
  const int p = x.pushes.front().peer;
  pull_own_block(x, p, out_by_rank[p] + at);
}

}  // namespace

const char* coll_op_name(CollOp op) {
  switch (op) {
    case CollOp::kAllGather:
      return "all_gather";
    case CollOp::kAllToAll:
      return "all_to_all";
    case CollOp::kAllToAllv:
      return "all_to_allv";
    case CollOp::kBroadcast:
      return "broadcast";
    case CollOp::kReduceScatter:
      return "reduce_scatter";
    case CollOp::kAllReduce:
      return "all_reduce";
  }
  return "unknown";
}

CollOp parse_coll_op(const std::string& name, const std::string& what) {
  for (CollOp o : {CollOp::kAllGather, CollOp::kAllToAll, CollOp::kAllToAllv, CollOp::kBroadcast,
                   CollOp::kReduceScatter, CollOp::kAllReduce})
    if (name == coll_op_name(o)) return o;
  throw_error(FERRY_ERROR_INVALID_ARGUMENT,
              what + " is '" + name +
                  "'; expected all_gather, all_to_all, all_to_allv, broadcast, reduce_scatter or all_reduce");
}

std::vector<int> cyclic_peers(int rank, int world) {
  std::vector<int> out;
  for (int k = 1; k < world; ++k) out.push_back((rank + k) % world);
  return out;
}

Exchange plan_all_gather(int rank, int world, const std::vector<char*>& out_by_rank, const char* in, size_t bytes) {
  Exchange x;
  x.targets = x.sources = all_peers_but(rank, world);
  const size_t at = static_cast<size_t>(rank) * bytes;
  for (int p : x.targets) add_push(x, p, out_by_rank[p] + at, in, bytes);
  x.local = local_copy(out_by_rank[rank] + at, in, bytes);
  set_local_pull(x, out_by_rank, at);
  return x;
}

Exchange plan_all_to_all(int rank, int world, const std::vector<char*>& out_by_rank, const char* in, size_t bytes,
                         const std::vector<char*>* bounce) {
  Exchange x;
  x.targets = x.sources = all_peers_but(rank, world);
  const size_t at = static_cast<size_t>(rank) * bytes;
  for (int p : x.targets) add_push(x, p, out_by_rank[p] + at, in + static_cast<size_t>(p) * bytes, bytes);
  x.local = local_copy(out_by_rank[rank] + at, in + at, bytes);
  if (bounce) add_bounce(x, *bounce);
  return x;
}

void add_bounce(Exchange& x, const std::vector<char*>& bounce) {
  if (x.local.bytes == 0 || x.targets.empty()) return;
  const int p = x.targets.front();
  // Last among the pushes: in stream order (seq) the real data goes first.
  add_push(x, p, bounce[p], static_cast<const char*>(x.local.src), x.local.bytes);
  pull_own_block(x, p, bounce[p]);
}

size_t all_to_allv_send_offset(int world, const std::vector<size_t>& counts, int src, int dst) {
  size_t off = 0;
  for (int q = 0; q < dst; ++q) off += counts[static_cast<size_t>(src) * world + q];
  return off;
}

size_t all_to_allv_recv_offset(int world, const std::vector<size_t>& counts, int src, int dst) {
  size_t off = 0;
  for (int q = 0; q < src; ++q) off += counts[static_cast<size_t>(q) * world + dst];
  return off;
}

size_t all_to_allv_send_total(int world, const std::vector<size_t>& counts, int src) {
  return all_to_allv_send_offset(world, counts, src, world);
}

size_t all_to_allv_recv_total(int world, const std::vector<size_t>& counts, int dst) {
  return all_to_allv_recv_offset(world, counts, world, dst);
}

size_t all_to_allv_largest_own(int world, const std::vector<size_t>& counts) {
  size_t most = 0;
  for (int r = 0; r < world; ++r) most = std::max(most, counts[static_cast<size_t>(r) * world + r]);
  return most;
}

Exchange plan_all_to_allv(int rank, int world, const std::vector<char*>& out_by_rank, const char* in,
                          const std::vector<size_t>& counts, const std::vector<char*>* bounce) {
  Exchange x;
  // Every pair handshakes even when it moves no bytes: the protocol stays one
  // shape, and a peer that called with other counts is caught by its signature.
  x.targets = x.sources = all_peers_but(rank, world);
  for (int p : x.targets)
    add_push(x, p, out_by_rank[p] + all_to_allv_recv_offset(world, counts, rank, p),
             in + all_to_allv_send_offset(world, counts, rank, p), counts[static_cast<size_t>(rank) * world + p]);
  x.local = local_copy(out_by_rank[rank] + all_to_allv_recv_offset(world, counts, rank, rank),
                       in + all_to_allv_send_offset(world, counts, rank, rank),
                       counts[static_cast<size_t>(rank) * world + rank]);
  if (bounce) add_bounce(x, *bounce);
  return x;
}

Exchange plan_broadcast(int rank, int world, int root, const std::vector<char*>& out_by_rank, const char* in,
                        size_t bytes) {
  Exchange x;
  if (rank == root) {
    x.targets = all_peers_but(rank, world);
    for (int p : x.targets) add_push(x, p, out_by_rank[p], in, bytes);
    x.local = local_copy(out_by_rank[rank], in, bytes);
    set_local_pull(x, out_by_rank, 0);
  } else if (world > 1) {
    x.sources = {root};
  }
  return x;
}

Exchange plan_gather_blocks(int rank, int world, const std::vector<char*>& out_by_rank,
                            const std::vector<Block>& blocks) {
  Exchange x;
  x.targets = x.sources = all_peers_but(rank, world);
  const Block& mine = blocks[rank];
  for (int p : x.targets) add_push(x, p, out_by_rank[p] + mine.offset, out_by_rank[rank] + mine.offset, mine.bytes);
  return x;
}

Exchange plan_scatter_to_scratch(int rank, int world, const std::vector<char*>& scratch_by_rank, const char* in,
                                 const std::vector<Block>& blocks, size_t slot_stride) {
  Exchange x;
  x.targets = x.sources = all_peers_but(rank, world);
  for (int p : x.targets)
    add_push(x, p, scratch_by_rank[p] + static_cast<size_t>(rank) * slot_stride, in + blocks[p].offset,
             blocks[p].bytes);
  return x;
}

std::vector<Block> split_blocks(size_t count, size_t element_bytes, int world, size_t unit_bytes) {
  // Elements per unit: a whole number of elements, at least one.
  const size_t unit = std::max<size_t>(1, unit_bytes / element_bytes);
  const size_t units = count / unit, base = units / world, extra = units % world;
  std::vector<Block> out;
  size_t at = 0;
  for (int r = 0; r < world; ++r) {
    size_t n = (base + (static_cast<size_t>(r) < extra ? 1 : 0)) * unit;
    if (r == world - 1) n = count - at;
    out.push_back(Block{at * element_bytes, n * element_bytes});
    at += n;
  }
  return out;
}

bool all_reduce_one_exchange(int world, size_t bytes) { return world == 2 && bytes <= kAllReduceOneExchangeMaxBytes; }

std::vector<Block> all_reduce_blocks(size_t count, size_t element_bytes, int world) {
  if (all_reduce_one_exchange(world, count * element_bytes))
    return std::vector<Block>(static_cast<size_t>(world), Block{0, count * element_bytes});
  return split_blocks(count, element_bytes, world, 16);
}

Block block_round(const Block& b, const Round& r) {
  const size_t begin = std::min(r.begin, b.bytes);
  return Block{b.offset + begin, std::min(r.len, b.bytes - begin)};
}

size_t reduce_round_bytes(size_t block_bytes, size_t forced) {
  if (forced > 0) return (forced + 255) / 256 * 256;
  if (block_bytes < 2 * kReduceRoundMinBytes) return block_bytes;
  const size_t rounds = std::min(kReduceMaxRounds, block_bytes / kReduceRoundMinBytes);
  return ((block_bytes + rounds - 1) / rounds + 255) / 256 * 256;
}

std::vector<Round> plan_rounds(size_t bytes_per_rank, size_t chunk_bytes) {
  std::vector<Round> out;
  if (chunk_bytes == 0) chunk_bytes = bytes_per_rank;
  for (size_t b = 0; b < bytes_per_rank; b += chunk_bytes)
    out.push_back(Round{b, std::min(chunk_bytes, bytes_per_rank - b)});
  return out;
}

size_t in_place_chunk(size_t bytes_per_rank, int world, size_t scratch_cap) {
  return std::max<size_t>(1, std::min(bytes_per_rank, scratch_cap / static_cast<size_t>(world)));
}

size_t scratch_slot_stride(size_t slot_bytes) { return (std::max<size_t>(slot_bytes, 1) + 255) / 256 * 256; }

size_t largest_block(const std::vector<Block>& blocks) {
  size_t most = 0;
  for (const auto& b : blocks) most = std::max(most, b.bytes);
  return most;
}

Exchange plan_in_place_round(int rank, int world, const std::vector<char*>& scratch_by_rank, const char* buf,
                             size_t bytes_per_rank, const Round& round, size_t slot_stride) {
  Exchange x;
  x.targets = x.sources = all_peers_but(rank, world);
  for (int p : x.targets)
    add_push(x, p, scratch_by_rank[p] + static_cast<size_t>(rank) * slot_stride,
             buf + static_cast<size_t>(p) * bytes_per_rank + round.begin, round.len);
  return x;
}

std::vector<Copy> plan_in_place_unpack(int rank, int world, char* buf, const char* scratch, size_t bytes_per_rank,
                                       const Round& round, size_t slot_stride) {
  std::vector<Copy> out;
  for (int q : cyclic_peers(rank, world))
    out.push_back(Copy{buf + static_cast<size_t>(q) * bytes_per_rank + round.begin,
                       scratch + static_cast<size_t>(q) * slot_stride, round.len});
  return out;
}

LocalCopy resolve_local_copy(LocalCopy asked, bool has_pull, size_t bytes) {
  if (asked == LocalCopy::kPeer) return has_pull ? LocalCopy::kPeer : LocalCopy::kKernel;
  if (asked == LocalCopy::kAuto) return has_pull && bytes <= kPeerLocalMaxBytes ? LocalCopy::kPeer : LocalCopy::kKernel;
  return asked;
}

size_t own_block_bounce_bytes(LocalCopy asked, size_t largest_own, int world, bool scratch_possible) {
  if (largest_own == 0 || world < 2) return 0;
  if (resolve_local_copy(asked, true, largest_own) != LocalCopy::kPeer) return 0;
  return scratch_possible || asked == LocalCopy::kPeer ? largest_own : 0;
}

bool local_copy_on_side_stream(size_t bytes) { return bytes >= (size_t(1) << 20); }

bool done_copies_one_by_one(int world, size_t largest_push) { return world <= 2 || largest_push < (size_t(1) << 20); }

bool ranges_overlap(const void* a, size_t na, const void* b, size_t nb) {
  if (na == 0 || nb == 0) return false;
  auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + nb && y < x + na;
}

RankBytes rank_bytes(CollOp op, int world, int rank, int root, size_t bytes, const std::vector<size_t>& counts) {
  const size_t W = static_cast<size_t>(world);
  switch (op) {
    case CollOp::kAllGather:
      return {bytes * W, bytes};
    case CollOp::kAllToAll:
      return {bytes * W, bytes * W};
    case CollOp::kAllToAllv:
      return {all_to_allv_recv_total(world, counts, rank), all_to_allv_send_total(world, counts, rank)};
    case CollOp::kBroadcast:
      return {bytes, rank == root ? bytes : 0};
    case CollOp::kReduceScatter:
      return {bytes, bytes * W};
    case CollOp::kAllReduce:
      return {bytes, bytes};
  }
  return {};
}

}  // namespace ferry
