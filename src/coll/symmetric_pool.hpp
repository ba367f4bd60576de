// Buffers for the collectives' outputs from a few large peer-visible chunks
// instead of one collective alloc per buffer: what ferry.torch.SymmetricPool
// does for PyTorch, for C and C++ programs (ferry_pool_*).
//
// Every rank must make the same requests in the same order (SPMD code): a
// buffer's chunk and offset depend only on that sequence (PoolRanges), so it
// sits at the same offset of the same chunk on every rank, as a collective
// needs. A request that does not fit adds a chunk with the communicator's
// alloc, which is collective. A freed buffer is reused only by later
// requests on the stream it was asked for on.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "coll/communicator.hpp"
#include "symm/pool_ranges.hpp"

namespace ferry {

class SymmetricPool {
 public:
  // Chunks of at least `chunk_bytes` (rounded up to 2 MiB) from `comm`. The
  // pool does not keep the communicator alive: once it is closed or gone, its
  // close() has freed the chunks, and alloc and free are refused.
  // Its streams are told apart by their handles: local rank 0's stream stands for all local ranks.
  SymmetricPool(std::weak_ptr<Communicator> comm, size_t chunk_bytes);
  ~SymmetricPool();
  SymmetricPool(const SymmetricPool&) = delete;
  SymmetricPool& operator=(const SymmetricPool&) = delete;

  // `bytes` for each local rank, first used on `stream` (local rank 0's
  // stream stands for all of them). Collective only where a chunk is added.
  std::vector<void*> alloc(size_t bytes, cudaStream_t stream);
  // The buffer alloc() returned with `first` as local rank 0's pointer, back
  // to the pool (INVALID_ARGUMENT where no buffer in use starts there).
  void free(const void* first);
  // The chunks back to the communicator (collective). Buffers become invalid.
  void close();

  // 0 once the pool or its communicator is closed (its chunks are freed then).
  size_t bytes_reserved() const;
  size_t bytes_in_use() const { return live() ? ranges_.bytes_in_use() : 0; }

 private:
  bool live() const;
  // The communicator, open; CLOSED naming `what` where it is closed or gone.
  std::shared_ptr<Communicator> open_comm(const char* what) const;

  std::weak_ptr<Communicator> comm_;
  bool closed_ = false;
  size_t chunk_bytes_;
  PoolRanges ranges_;
  std::vector<std::vector<void*>> chunks_;  // by chunk, by local rank
};

}  // namespace ferry
