// The SM path for small collectives (algo "sm"): one kernel per call and rank
// stores the rank's data straight into every peer's window over NVLink, then
// one flag per peer; each receiver spins on its own window's flags and copies
// its slots into the output. One round of signals, each a store, where the
// copy-engine path needs two rounds of small copies (ready, then done) at
// several microseconds each (docs/performance.md, floor analysis).
//
// It uses SMs: up to kOneShotMaxBlocks blocks for the whole call, including
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
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "coll/plan.hpp"

namespace ferry {

constexpr int kOneShotMaxRanks = 8;
constexpr int kOneShotMaxBlocks = 32;
constexpr size_t kOneShotHeaderBytes = 4096;

// At the start of each rank's window (GPU memory, zeroed at creation).
struct OneShotHeader {
  uint64_t flags[kOneShotMaxRanks][kOneShotMaxBlocks];  // [source][block]
  uint64_t calls;                                       // calls completed on this path
  uint64_t opened;    // a prepared call's number once its gate opened (block 0 tells the others)
  uint32_t arrivals;  // blocks of the running call that finished
};
static_assert(sizeof(OneShotHeader) <= kOneShotHeaderBytes, "one-shot header too large");

// One rank's part of a call. What goes to peer p starts at in + p * in_stride;
// what comes from source s lands at out + s * out_stride; `bytes` each.
struct OneShotStep {
  const char* in = nullptr;
  char* out = nullptr;
  size_t bytes = 0;
  size_t in_stride = 0;
  size_t out_stride = 0;
  int root = -1;          // broadcast: only the root sends; -1: every rank
  bool own_copy = false;  // copy this rank's own block from in to out
  int rank = 0;
  int world = 1;
  int blocks = 1;
  uint32_t tag = 0;  // the call's signature: peers must agree
};

#ifdef __CUDACC__
#define FERRY_HOST_DEVICE __host__ __device__
#else
#define FERRY_HOST_DEVICE
#endif

// Window bytes per rank: the header, then two slots per source rank.
inline size_t one_shot_window_bytes(int world, size_t slot_bytes) {
  return kOneShotHeaderBytes + 2 * static_cast<size_t>(world) * slot_bytes;
}
// Offset of the slot that `source` writes on calls of parity `parity` (the kernel uses it too).
FERRY_HOST_DEVICE inline size_t one_shot_slot_offset(int world, size_t slot_bytes, int parity, int source) {
  return kOneShotHeaderBytes + (static_cast<size_t>(parity) * world + source) * slot_bytes;
}
// Blocks for `bytes` per peer: about 32 KB each, at least 1, at most kOneShotMaxBlocks.
int one_shot_blocks(size_t bytes);
// Empty when the call can take the SM path; else why not (for the error of an explicit algo="sm").
std::string one_shot_unsupported(CollOp op, int world, size_t bytes_per_peer, size_t slot_bytes);
// all_gather, all_to_all (in place too: data goes through the window) and broadcast.
OneShotStep plan_one_shot(CollOp op, int rank, int world, const char* in, char* out, size_t bytes, int root,
                          uint32_t tag);

}  // namespace ferry
