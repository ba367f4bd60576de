// Layout of the synchronization flags. Each rank owns one FlagBlock in shared
// pinned host memory (ready flags and progress: peers write them with small
// copy-engine copies, the rank's streams wait on them, and the host reads them
// to diagnose a stuck collective) and one DoneBlock in its GPU's memory (done
// flags: the message that follows the data, see DoneBlock). One 64-byte line
// per slot.
//
// Flags are reset after use: a stream that passed its wait for a peer's value
// writes 0 back in the same batch of memory operations. A flag therefore holds
// a value only between a peer's write and the wait that consumes it, the value
// of a call never changes from one run to the next, and the same commands can
// be replayed (CUDA graphs, prepared collectives). Why a reset is safe: a peer
// writes its next value into a flag only after a message this rank sends after
// the reset (see docs/architecture.md, "Flag protocol").
#pragma once

#include <cstdint>

namespace ferry {

constexpr int kMaxRanks = 64;

// Written by rank p into rank r's block: "r may now write into p's output (or
// scratch)". The fields after `value` only serve error messages: what p was
// called with.
struct alignas(64) ReadyRecord {
  uint64_t value;
  uint64_t bytes_per_rank;
  uint64_t offset;
  uint32_t op;
  uint32_t registration;
  uint64_t pad[4];
};
constexpr size_t kReadyCopyBytes = 32;  // value .. registration

// Written by rank p into rank r's DoneBlock once p's data for r has landed.
struct alignas(64) DoneRecord {
  uint64_t value;
  uint64_t pad[7];
};

// Written by the owning rank's host: how many collectives it has enqueued and
// seen finish. Peers' watchdogs read it to say who is behind.
struct alignas(64) Progress {
  uint64_t enqueued;
  uint64_t completed;
  uint64_t pad[6];
};

struct FlagBlock {
  ReadyRecord ready[kMaxRanks];  // indexed by the writing rank
  Progress progress;
};

// In GPU memory. The done message is copied on the stream that just pushed
// the data: GPU to GPU it stays on the same (NVLink) copy engine. Into host
// memory it cost 5-18 us more per exchange after the pushes on H200 (4 GPUs,
// 1 KB: 22.9 us against 41.3 us trigger-to-done; bench/probes/flag_latency.cpp,
// docs/performance.md). The host cannot read it; the watchdog releases its
// waits with a stream write (Communicator::release_done_waits).
struct DoneBlock {
  DoneRecord done[kMaxRanks];  // indexed by the writing rank
};

}  // namespace ferry
