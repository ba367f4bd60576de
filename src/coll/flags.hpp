// Layout of the synchronization flags. Each rank owns one FlagBlock in shared
// pinned host memory; peers write into it with small copy-engine copies, the
// rank's streams wait on it with cuStreamWaitValue64, and the host reads it
// to diagnose a stuck collective. One 64-byte line per slot.
#pragma once

#include <cstdint>

namespace ferry {

constexpr int kMaxRanks = 64;

// Written by rank p into rank r's block: "p has reached collective `tag` and
// r may now write into p's output". The fields after `tag` only serve error
// messages: what p was called with.
struct alignas(64) ReadyRecord {
  uint64_t tag;
  uint64_t bytes_per_rank;
  uint64_t offset;
  uint32_t op;
  uint32_t registration;
  uint64_t pad[4];
};
constexpr size_t kReadyCopyBytes = 32;  // tag .. registration

// Written by rank p into rank r's block once p's data for r has landed.
struct alignas(64) DoneRecord {
  uint64_t tag;
  uint64_t pad[7];
};

struct FlagBlock {
  ReadyRecord ready[kMaxRanks];  // indexed by the writing rank
  DoneRecord done[kMaxRanks];
};

// What a rank copies into its peers' blocks for one collective; one per
// in-flight slot, in the rank's private pinned memory.
struct SourceSlot {
  ReadyRecord ready;
  DoneRecord done;
};

}  // namespace ferry
