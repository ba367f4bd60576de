// Layout of the synchronization flags. Each rank owns one DeviceFlags block in
// its GPU's memory (ready and done flags: peers write them with small
// copy-engine copies and the rank's streams wait on them) and one HostFlags
// block in shared pinned host memory (progress counters its host publishes and
// peers' watchdogs read). One 64-byte line per slot.
//
// Why GPU memory: a stream waiting on a flag in host memory polls it across
// PCIe, and a copy into host memory after NVLink pushes waits for them to be
// visible there; on 4 H200s a message into a peer's host memory cost 18 us
// more than one into its GPU memory (bench/probes/flag_latency.cu,
// docs/performance.md). The host cannot read or write GPU memory directly: the
// watchdog copies the ready flags out and writes releases with stream
// operations on a rescue stream (coll/rescue.hpp).
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

// Written by rank p into rank r's done flags once p's data for r has landed.
// Copied on the stream that just pushed the data, GPU to GPU: it stays on the
// same (NVLink) copy engine.
struct alignas(64) DoneRecord {
  uint64_t value;
  uint64_t pad[7];
};

// Written by the owning rank's host: how many collectives it has enqueued and
// seen finish. Peers' watchdogs read it to say who is behind. `called` and
// `called_value`: the number of the call being enqueued and its flag value
// (kSmPathTag set on the SM path), written before its first step: a peer's
// watchdog names a call made otherwise (another path: the SM path writes no
// ready flag a snapshot would show) without waiting for the timeout.
struct alignas(64) Progress {
  uint64_t enqueued;
  uint64_t completed;
  uint64_t called;
  uint64_t called_value;
  uint64_t pad[4];
};
// Flag values use bits 0-31 and 48-63 (flag_value); this marks a call's value
// as published by a rank that runs it on the SM path.
constexpr uint64_t kSmPathTag = uint64_t{1} << 32;

// In shared pinned host memory.
struct HostFlags {
  Progress progress;
};

// The gate of a prepared collective armed with its gate in GPU memory: a
// stream or a kernel of this GPU writes it, the armed stream waits on it. Only
// this rank uses its gates. Values are never reused (one counter per
// communicator), and a gate is handed to another handle only once the last run
// it gated has finished, so a late write can never open the wrong run.
struct alignas(64) GateLine {
  uint64_t value;
  uint64_t pad[7];
};
constexpr int kMaxDeviceGates = 1024;

// In GPU memory, mapped by every peer.
struct DeviceFlags {
  ReadyRecord ready[kMaxRanks];  // indexed by the writing rank
  DoneRecord done[kMaxRanks];    // indexed by the writing rank
  GateLine gates[kMaxDeviceGates];
};

}  // namespace ferry
