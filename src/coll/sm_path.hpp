// The SM path for small collectives (algo "sm"): one kernel per call and rank
// stores the rank's data straight into every peer's window over NVLink, then
// one flag per peer; each receiver spins on its own window's flags and copies
// its slots into the output. One round of signals, each a store, where the
// copy-engine path needs two rounds of small copies (ready, then done) at
// several microseconds each (docs/performance.md, "Where the small-size latency goes").
//
// all_gather, all_to_all(v), broadcast, reduce_scatter and all_reduce, as
// tables of spans (SmPathStep). It uses SMs: up to FERRY_SM_MAX_BLOCKS blocks for the whole call, including
// the time spent waiting for the slowest peer. It exists for collectives on
// the critical path between kernels, where a few microseconds of one SM cost
// less than 20 us of waiting; beside compute, the copy-engine variants are
// the point of ferry. Never chosen by "auto" unless the tuning table says so.
//
// Why no ready round: every rank owns a window (mapped by its peers) with two
// slots per source, used on alternate calls. A rank writes into slot (e % 2)
// of call e only after finishing call e - 1, which needs every peer's flag of
// call e - 1, which each peer sends only after finishing call e - 2, the last
// reader of that slot. Flags carry (call number << 32 | call tag), so they are
// never reset and a peer that made another call never satisfies the wait.
//
// A large all_reduce on 3 or more ranks runs in two shots instead
// (sm_path_two_shot): each rank owns one part of the buffer; the parts go to
// their owners, which reduce them (a reduce_scatter), then each owner pushes
// its reduced part to every peer (an all_gather), in the same kernel, the
// second shot storing straight into the peers' (registered) outputs. Each
// rank sends 2 (world - 1) / world of the buffer instead of world - 1
// buffers, at the price of a second round of flags; a block's second shot
// sends only the share it reduced itself, so no block waits for the rest of
// its grid. A part larger than a slot goes in R rounds of a slot each,
// pipelined as R + 1 steps of the scheme above with one flag each (round k's
// first shot and round k - 1's second share a step; the rounds alternate
// between the two parities' slots). Every round is cut into the blocks'
// shares alike, so a block only ever overwrites slot bytes that the same
// block of the peer has read: the window bounds the round, not the call.
//
// Blocks up to kSmPathLowLatencyMaxBytes travel in the low-latency format
// instead (coll/sm_path_ll.hpp), into slots of their own: the flags ride in
// the data, which saves the release fence (a round trip over NVLink before a
// flag may go) at the price of twice the bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "coll/plan.hpp"
#include "coll/selector.hpp"
#include "coll/sm_path_ll.hpp"

namespace ferry {

constexpr int kSmPathMaxRanks = 8;
// The most blocks a call may run (the header's flags are laid out for it);
// FERRY_SM_MAX_BLOCKS picks a grid bound up to it, kSmPathDefaultMaxBlocks by default.
constexpr int kSmPathMaxBlocks = 128;
constexpr int kSmPathDefaultMaxBlocks = 32;
constexpr size_t kSmPathHeaderBytes = 16384;
constexpr size_t kSmPathDefaultTwoShotBytes = 1 << 20;
constexpr int kSmPathThreads = 512;  // per block

// At the start of each rank's window (GPU memory, zeroed at creation).
struct SmPathHeader {
  uint64_t flags[kSmPathMaxRanks][kSmPathMaxBlocks];  // [source][block]
  uint64_t calls;                                     // calls completed on this path
  uint64_t opened;    // a prepared call's number once its gate opened (block 0 tells the others)
  uint32_t arrivals;  // blocks of the running call that finished
};
static_assert(sizeof(SmPathHeader) <= kSmPathHeaderBytes, "the SM path's header too large");

// One rank's part of a call, as spans: what goes to peer p is
// send_bytes[p] at in + send_offset[p]; what comes from source q lands at
// out + recv_offset[q] (recv_bytes[q]); this rank's own block, own_bytes from
// in + send_offset[rank] to out + recv_offset[rank] (0: nothing to copy, e.g.
// in place). Every collective the path runs is one such table.
struct SmPathStep {
  const char* in = nullptr;
  char* out = nullptr;
  // Each rank's `out` as mapped here (its registered buffer), which a
  // two-shot all_reduce needs: the second shot stores the reduced part
  // straight into every peer's `out`, so no rank copies parts out of a
  // window (measured faster at 1 MB: docs/performance.md).
  char* out_by_rank[kSmPathMaxRanks] = {};
  size_t send_offset[kSmPathMaxRanks] = {};
  size_t send_bytes[kSmPathMaxRanks] = {};
  size_t recv_offset[kSmPathMaxRanks] = {};
  size_t recv_bytes[kSmPathMaxRanks] = {};
  size_t own_bytes = 0;
  int rank = 0;
  int world = 1;
  int blocks = 1;            // the same on every rank: from the largest block of the call
  uint32_t tag = 0;          // the call's signature: peers must agree
  uint32_t low_latency = 0;  // 1: the low-latency format (sm_path_low_latency)
  // Reductions (reduce_scatter, all_reduce): the DType and RedOp values; 0:
  // none. Then every source's recv_bytes land in the window only, and `out`
  // gets the reduction of every rank's span in rank order (this rank's from
  // in + send_offset[rank]) instead of copies.
  uint32_t dtype = 0;
  uint32_t red_op = 0;
  // The rounds of an all_reduce in two shots (sm_path_two_shot; 0: one
  // shot). Then span p of `in` (send_offset[p], send_bytes[p]) is rank p's
  // part, and recv_offset[q], recv_bytes[q] say where part q lies in `out`;
  // round k takes bytes [k * two_shot_chunk, (k + 1) * two_shot_chunk) of
  // every part, as a reduce_scatter into out's own part, then an all_gather
  // of that piece; R rounds run as R + 1 steps of flags (c to c + R), step k
  // carrying round k's first shot and round k - 1's second.
  uint32_t two_shot_rounds = 0;  // no padding: the replay cache keys on the struct's bytes
  size_t two_shot_chunk = 0;
};

// Window bytes per rank: the header, two slots per source rank, then two
// low-latency slots per source rank.
inline size_t sm_path_window_bytes(int world, size_t slot_bytes) {
  return kSmPathHeaderBytes + 2 * static_cast<size_t>(world) * (slot_bytes + kSmPathLowLatencySlotBytes);
}
// Offset of the slot that `source` writes on calls of parity `parity` (the kernel uses it too).
FERRY_HOST_DEVICE inline size_t sm_path_slot_offset(int world, size_t slot_bytes, int parity, int source) {
  return kSmPathHeaderBytes + (static_cast<size_t>(parity) * world + source) * slot_bytes;
}
// The same for the low-latency slots, after all the others.
FERRY_HOST_DEVICE inline size_t sm_path_ll_slot_offset(int world, size_t slot_bytes, int parity, int source) {
  return kSmPathHeaderBytes + 2 * static_cast<size_t>(world) * slot_bytes +
         (static_cast<size_t>(parity) * world + source) * kSmPathLowLatencySlotBytes;
}
// The bytes [*begin, *begin + returned) of a `len`-byte span that block
// `block` of `blocks` moves in the span format, sending and receiving alike
// (a receiver's block waits for the same block's flag, so both sides must cut
// alike): chunks of 16-byte multiples, so a chunk keeps its span's alignment.
FERRY_HOST_DEVICE inline size_t sm_path_span_share(size_t len, int blocks, int block, size_t* begin) {
  const size_t per = ((len + blocks - 1) / blocks + 15) / 16 * 16;
  const size_t b = per * static_cast<size_t>(block);
  *begin = b < len ? b : len;
  return (*begin + per < len ? *begin + per : len) - *begin;
}
// The span format's flag: what a rank stores into each peer's
// SmPathHeader::flags[rank][block] once its block's data is there.
FERRY_HOST_DEVICE inline uint64_t sm_path_flag_value(uint64_t call, uint32_t tag) { return call << 32 | tag; }
// Whether a peer's flag `seen` lets a block go on in call `call` of signature
// `tag`: the peer's flag of this call, or of its next call. There is one flag
// per peer and block, and the peer may finish this call (it needs only this
// rank's flags) and overwrite the flag with its next call's before a block
// here has read it (seen on 2 H200s once in about 10,000 calls: both ranks
// then waited for good). Reaching its next call also proves that the peer's
// tag matched ours, and its data of this call stays in its slot, which it
// rewrites only two calls on, after our next flag.
FERRY_HOST_DEVICE inline bool sm_path_flag_passes(uint64_t seen, uint64_t call, uint32_t tag) {
  return seen == sm_path_flag_value(call, tag) || seen >> 32 == ((call + 1) & 0xffffffffu);
}
// Data bytes per block of a call, the same on every rank: in the
// low-latency format (FERRY_SM_LL_BLOCK_BYTES) and in the span format
// (FERRY_SM_BLOCK_BYTES). On two H200s (two hosts), 2 KB in the low-latency
// format made 16-64 KB calls 0.65-0.82 times NCCL's time in the same run,
// against 0.72-0.96 with 8 KB, and 1 KB was no faster; on four H200s
// 0.60-1.03 against 0.74-1.15. In the span format 8 KB per block instead of
// 32 KB gave the 128 KB-1 MB calls that get more blocks from it lower ratios
// in 10 of 12 cells on two H200s and 8 of 10 on four, the rest within the runs'
// spread (the A/B runs in docs/performance-log.md).
// `max_blocks` caps a call's grid (FERRY_SM_MAX_BLOCKS: the SMs a call may
// hold, bounded by sm_path_grid_bound): each block spins until its peers'
// blocks have run, so all of them must fit on the GPU at once.
// `two_shot_from`: all_reduce buffers from this many bytes take the two-shot
// form on 3 or more ranks (FERRY_SM_TWO_SHOT_BYTES; 0: never).
// `slot_bytes`: the window's slot (FERRY_SM_BYTES rounded up to 256; 0: no
// window, the path is off), the most a call moves per peer block and one
// round of a two-shot all_reduce per part (plans made without a window, in
// tests, take 0 as unbounded).
struct SmPathBlocks {
  size_t low_latency = 2048;
  size_t spans = 8 << 10;
  int max_blocks = kSmPathDefaultMaxBlocks;
  size_t two_shot_from = kSmPathDefaultTwoShotBytes;
  size_t slot_bytes = 0;
};
// SmPathBlocks::max_blocks from FERRY_SM_MAX_BLOCKS (`limit`) and the GPU:
// every block of a grid spins until its peers' blocks have run, so all of
// them must be resident at once; `resident` blocks of the kernel fit on the
// GPU (the least over the ranks' GPUs). Alone on a GPU (`sharing` 1), the
// grid leaves kSmPathFreeSms of them to other kernels (the one that
// triggers a prepared call, signal rounds). Where `sharing` ranks share a GPU
// (FERRY_SHARED_GPUS, tests), half is left for other waiting kernels and the
// rest split among the ranks. At least 1, at most `limit` and kSmPathMaxBlocks.
constexpr int kSmPathFreeSms = 4;
int sm_path_grid_bound(int limit, int resident, int sharing);
// Blocks for a call whose largest block is `bytes` (the same on every rank):
// at least 1, at most per.max_blocks (itself at most kSmPathMaxBlocks).
int sm_path_blocks(size_t bytes, SmPathBlocks per = {});
// Whether an all_reduce of `bytes` (the whole buffer) on `world` ranks takes
// the two-shot form: from per.two_shot_from bytes on 3 or more ranks, where
// each round's chunk is too large for the low-latency format (which the
// two-shot form does not have). On 2 ranks both forms send one buffer per rank.
bool sm_path_two_shot(CollOp op, int world, size_t bytes, const SmPathBlocks& per);
// Rank p's part of a two-shot all_reduce: [p * part, min((p + 1) * part,
// bytes)) with part = bytes / world rounded up to 16 bytes (so that every
// part starts where its buffer's alignment allows 16-byte words); the last
// parts may be short or empty.
size_t sm_path_two_shot_part(size_t bytes, int world);
// The bytes of each part that one round of a two-shot all_reduce moves: the
// part, or a slot (per.slot_bytes, rounded down to 16) where the part is
// larger; the rounds are ceil(part / chunk).
size_t sm_path_two_shot_chunk(size_t bytes, int world, const SmPathBlocks& per);
// The bytes [*begin, *begin + returned) of a `len`-byte span that block
// `block` of `blocks` moves in one round of a two-shot all_reduce whose full
// rounds are `chunk` bytes: its share of a full round (sm_path_span_share),
// cut to the span, so that a short last round and every part cut alike.
FERRY_HOST_DEVICE inline size_t sm_path_round_share(size_t len, size_t chunk, int blocks, int block, size_t* begin) {
  const size_t n = sm_path_span_share(chunk, blocks, block, begin);
  if (*begin >= len) {
    *begin = len;
    return 0;
  }
  return n < len - *begin ? n : len - *begin;
}
// The largest block one rank sends one peer: `bytes` (all_gather's input,
// an all_to_all block, a broadcast, reduce_scatter's result, all_reduce's
// whole buffer, or one round's chunk in the two-shot form), or the largest entry of
// all_to_allv's counts (bytes from rank s to rank d at [s * world + d]).
size_t sm_path_largest_block(CollOp op, int world, size_t bytes, const std::vector<size_t>& counts,
                             const SmPathBlocks& per);
// Empty when the call can take the SM path; else why not (for the error of an explicit algo="sm").
std::string sm_path_unsupported(CollOp op, int world, size_t largest_block, size_t slot_bytes);
// The selector for a call without an explicit algo: `forced` (FERRY_ALGO)
// and table rules naming "sm" apply only where the SM path can take the call.
Selection select_variant_with_sm(CollOp op, int world, size_t selection_bytes, size_t largest_block, size_t slot_bytes,
                                 Algo forced, const std::vector<SelectorRule>& table);
// all_gather, all_to_all (in place too: data goes through the window),
// all_to_allv (`counts` as above), broadcast (from `root`), and the
// reductions (`dtype`, `red_op`): reduce_scatter (`bytes`: one rank's result)
// sends block p of `in` to rank p; all_reduce (`bytes`: the whole buffer)
// sends all of `in` to every peer, and every rank reduces every rank's copy
// (one round of signals instead of the two exchanges of the copy-engine path),
// or, where sm_path_two_shot says so, sends part p to rank p and gets the
// reduced parts back.
SmPathStep plan_sm_path(CollOp op, int rank, int world, const char* in, char* out, size_t bytes, int root,
                        const std::vector<size_t>& counts, uint32_t tag, uint32_t dtype = 0, uint32_t red_op = 0,
                        SmPathBlocks per = {});

}  // namespace ferry
