// Which copies a rank issues for a collective: pure functions of the ranks'
// buffer addresses, tested on the CPU.
//
// Every collective here is built from exchanges. An exchange is one round of
// ferry's push protocol seen from one rank: it tells the ranks that will write
// into it ("sources") that they may ("ready"), waits until the ranks it writes
// into ("targets") said the same, pushes its copies, reads its own block back
// from a peer where it goes through one (local_pull), tells each target its
// data landed ("done") and waits for the same from its sources.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coll/local_copy.hpp"
#include "dma/batch_plan.hpp"

namespace ferry {

enum class CollOp : uint32_t {
  kAllGather = 1,
  kAllToAll = 2,
  kAllToAllv = 3,
  kBroadcast = 4,
  kReduceScatter = 5,
  kAllReduce = 6,
};

const char* coll_op_name(CollOp op);
// The op of a name coll_op_name gives; anything else is an error that names `what`.
CollOp parse_coll_op(const std::string& name, const std::string& what);

struct PeerCopy {
  int peer;
  Copy copy;
};

struct Exchange {
  std::vector<int> targets;         // ranks this one writes into
  std::vector<int> sources;         // ranks that write into this one
  std::vector<PeerCopy> pushes;     // in cyclic-shift order; zero-byte copies omitted
  Copy local{nullptr, nullptr, 0};  // this rank's own block (bytes == 0: nothing to copy)
  // The same result as `local` without an SM (CUDA copies within one GPU on
  // SMs; a copy from a peer runs on a copy engine): read back, after the push
  // to `peer`, the bytes that push wrote there. peer < 0: none (the own block
  // is sent nowhere else, as in all_to_all).
  PeerCopy local_pull{-1, Copy{nullptr, nullptr, 0}};
};

// A contiguous piece of a rank's buffer: [offset, offset + bytes).
struct Block {
  size_t offset;
  size_t bytes;
};

// Peers in cyclic-shift order from `rank`: rank+1, rank+2, ... (mod world).
// At each step every rank sends to a different peer, which keeps one receiver
// from taking all senders at once. The order decides large-size bandwidth:
// on 4 H200s, 374 GB/s busbw at 256 MB against about 200 with all peers at
// once (docs/performance.md, "What the hardware allows at large sizes").
std::vector<int> cyclic_peers(int rank, int world);

// `out_by_rank[p]` is rank p's output as mapped in this process.
//   all_gather: in (bytes) -> out_p[rank * bytes]; in-place when in is out_rank[rank * bytes].
Exchange plan_all_gather(int rank, int world, const std::vector<char*>& out_by_rank, const char* in, size_t bytes);
//   all_to_all: in[p * bytes] (bytes) -> out_p[rank * bytes]. With `bounce`
//   (each rank's bounce area, as mapped here; see add_bounce) the own block
//   goes out and back through the first target instead of a copy within the GPU.
Exchange plan_all_to_all(int rank, int world, const std::vector<char*>& out_by_rank, const char* in, size_t bytes,
                         const std::vector<char*>* bounce = nullptr);
//   all_to_allv: counts[src * world + dst] bytes; `in` is packed by destination
//   (rank order), every output is packed by source (rank order).
Exchange plan_all_to_allv(int rank, int world, const std::vector<char*>& out_by_rank, const char* in,
                          const std::vector<size_t>& counts, const std::vector<char*>* bounce = nullptr);
// The largest own block (counts[r * world + r]) of any rank: the bounce area
// every rank needs for all_to_allv.
size_t all_to_allv_largest_own(int world, const std::vector<size_t>& counts);
// Offsets (bytes) into src's input and dst's output that all_to_allv uses.
size_t all_to_allv_send_offset(int world, const std::vector<size_t>& counts, int src, int dst);
size_t all_to_allv_recv_offset(int world, const std::vector<size_t>& counts, int src, int dst);
size_t all_to_allv_send_total(int world, const std::vector<size_t>& counts, int src);
size_t all_to_allv_recv_total(int world, const std::vector<size_t>& counts, int dst);
//   broadcast: root's in (bytes) -> every out_p; the root copies locally unless in == out.
Exchange plan_broadcast(int rank, int world, int root, const std::vector<char*>& out_by_rank, const char* in,
                        size_t bytes);
//   gather blocks in place: out_rank[blocks[rank]] -> out_p[blocks[rank]] (the
//   second half of an all-reduce, blocks of uneven size).
Exchange plan_gather_blocks(int rank, int world, const std::vector<char*>& out_by_rank,
                            const std::vector<Block>& blocks);
//   scatter to scratch: in[blocks[p]] -> scratch_p[rank * slot_stride] (the data
//   movement of a reduce-scatter; the reduction then reads the slots).
Exchange plan_scatter_to_scratch(int rank, int world, const std::vector<char*>& scratch_by_rank, const char* in,
                                 const std::vector<Block>& blocks, size_t slot_stride);

// All-reduce cuts `count` elements into one block per rank, as even as
// possible in units of `unit_bytes` (earlier ranks take the extra units, the
// last rank the elements short of a unit). A 16-byte unit keeps every block's
// start as aligned as the buffer's, which the reduction kernel's vector loads need.
std::vector<Block> split_blocks(size_t count, size_t element_bytes, int world, size_t unit_bytes = 0);
// Whether an all-reduce of `bytes` per rank runs as one exchange (every rank
// pushes its whole buffer into its peers' scratch, then reduces all of it)
// instead of a reduce-scatter and an all-gather (two exchanges). On 2 ranks
// both move the same bytes per link, so one exchange saves a round of ready
// and done signals (10-25 us on H200) for a reduction twice as long (its
// scratch is twice as large too: up to kAllReduceOneExchangeMaxBytes). On
// more ranks it would send world - 1 times the buffer: not taken.
inline constexpr size_t kAllReduceOneExchangeMaxBytes = size_t(64) << 20;
bool all_reduce_one_exchange(int world, size_t bytes);
// The blocks of an all-reduce as collectives.cpp moves them: split_blocks
// in 16-byte units, or, in one exchange, the whole buffer for every rank.
std::vector<Block> all_reduce_blocks(size_t count, size_t element_bytes, int world);

// A collective in rounds: round j moves bytes [begin, begin + len) of every
// block. In-place all-to-all goes through a bounded scratch this way (in round j
// every rank pushes that chunk of its block for p into slot `rank` of p's
// scratch, then unpacks its own slots); reduce-scatter and all-reduce reduce
// round j while the copy engines move round j + 1 (reduce_round_bytes).
struct Round {
  size_t begin;
  size_t len;
};
// Rounds of at most `chunk_bytes` (0: one round) covering `bytes_per_rank`.
std::vector<Round> plan_rounds(size_t bytes_per_rank, size_t chunk_bytes);
// The part of `b` that round `r` moves (empty, at the block's end, when the
// block is shorter than the round's start: blocks may differ in size).
Block block_round(const Block& b, const Round& r);
// The round of a reduce-scatter whose largest block (one rank's result) is
// `block_bytes`: the whole block below kReduceRoundMinBytes, else about
// block / rounds with rounds = block / kReduceRoundMinBytes, at most
// kReduceMaxRounds, in 256-byte multiples (every element type divides them).
// Each round adds one ready and one done signal round (10-15 us each on H200);
// pipelining saves all but the last round's reduction (at about 2.5 TB/s of
// HBM traffic: 3 bytes moved per result byte on 2 GPUs). `forced` > 0 (the
// FERRY_REDUCE_ROUND_BYTES knob, for measurements) replaces the rule.
inline constexpr size_t kReduceRoundMinBytes = size_t(64) << 20;
inline constexpr size_t kReduceMaxRounds = 4;
size_t reduce_round_bytes(size_t block_bytes, size_t forced = 0);
// The chunk of each block an in-place round moves: as much as fits when every
// peer's slot must fit in `scratch_cap` bytes, at least 1, at most the block.
size_t in_place_chunk(size_t bytes_per_rank, int world, size_t scratch_cap);
// Bytes between two peers' slots in a scratch buffer holding `slot_bytes` each
// (256-byte aligned, never 0).
size_t scratch_slot_stride(size_t slot_bytes);
size_t largest_block(const std::vector<Block>& blocks);
Exchange plan_in_place_round(int rank, int world, const std::vector<char*>& scratch_by_rank, const char* buf,
                             size_t bytes_per_rank, const Round& round, size_t slot_stride);
std::vector<Copy> plan_in_place_unpack(int rank, int world, char* buf, const char* scratch, size_t bytes_per_rank,
                                       const Round& round, size_t slot_stride);

// all_to_all(v) sends the own block nowhere, so there is nothing to read
// back; with a bounce area on every rank (ferry's scratch) the own block is
// pushed into the first target's area with the other pushes and read back from
// there (Exchange::local_pull): two transfers instead of a copy within the GPU.
// The area receives only from the rank before it in cyclic order.
void add_bounce(Exchange& x, const std::vector<char*>& bounce);

// How a rank's own block is copied when the caller asked for `asked`: kAuto
// becomes kPeer (the SM-free pull back, see Exchange::local_pull) when the
// exchange has one and the block is at most kPeerLocalMaxBytes, else kKernel.
// An explicit kPeer without a pull falls back to kKernel. The bound weighs two
// measurements on 2 H200s (docs/performance-log.md, "The own block read back
// from a peer").
// Alone, the pull costs nothing up to 256 KB (graph 27.6-28.6 us against
// 29.1-30.7 with the kernel), 1 (eager) to 7 us (graph) at 1 MB, 18 us at 4 MB,
// and at 16 MB and more it halves 2-GPU bandwidth (one more block per peer).
// Beside GEMMs the kernel waits for SMs and the collective with it: at 64 KB
// and 1 MB the all-gathers then end 6-8 ms after the GEMMs, with the pull
// they end with them. all_to_all's bounce (two transfers) costs 3-7 us alone
// and wins beside GEMMs the same way. Up to 1 MiB ferry goes through a peer.
inline constexpr size_t kPeerLocalMaxBytes = size_t(1) << 20;
LocalCopy resolve_local_copy(LocalCopy asked, bool has_pull, size_t bytes);

// Bytes of the bounce area every rank needs for all_to_all(v)'s own block
// (see add_bounce), or 0 for no bounce. `largest_own`: the largest own block
// of any rank, so every rank decides alike. `scratch_possible`: ferry's
// scratch is large enough, or may be grown now (not while a graph is being
// captured). Without it the automatic choice falls back to the kernel; an
// explicit kPeer still asks for the area (and the caller reports that it
// cannot have it).
size_t own_block_bounce_bytes(LocalCopy asked, size_t largest_own, int world, bool scratch_possible);

// Whether a rank's own block is copied on a side stream, concurrently with the
// pushes, instead of ahead of them on the collective's stream. Worth its two
// extra event operations only for large blocks (the copy then overlaps the
// much longer pushes; 256 MB: about 0.5 ms of a 2.6 ms all-gather on 4 H200s).
bool local_copy_on_side_stream(size_t bytes);

// Whether the done messages (8-byte copies after the pushes) go one
// cudaMemcpyAsync each instead of one batched call. Measured trigger-to-done
// with bench/probes/flag_latency.cu on H200s: one by one 11.9 us
// against 19.8 batched (2 GPUs, 1 KB per peer), 14.2 vs 22.2 (2 GPUs, 1 MB),
// 22.9 vs 30.4 (4 GPUs, 1 KB); only 4 GPUs at 1 MB went the other way (45.9
// vs 40.8). `largest_push` is the largest push of the exchange in bytes.
bool done_copies_one_by_one(int world, size_t largest_push);

// True when [a, a + na) and [b, b + nb) share a byte.
bool ranges_overlap(const void* a, size_t na, const void* b, size_t nb);

// The bytes rank `rank`'s `out` and `in` hold in a call (`bytes`: the
// call's shape, as the signature has it: all_gather's input, one all_to_all
// block, the broadcast, reduce_scatter's result, all_reduce's buffer;
// all_to_allv: `counts`). A pointer is looked at only where this is not 0:
// a zero-element tensor has a null data pointer, and empty parts are normal
// (in an MoE step a rank with no tokens sends or receives nothing; a
// broadcast's other ranks send nothing).
struct RankBytes {
  size_t out = 0;
  size_t in = 0;
};
RankBytes rank_bytes(CollOp op, int world, int rank, int root, size_t bytes, const std::vector<size_t>& counts);

}  // namespace ferry
