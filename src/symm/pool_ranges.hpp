// Where a symmetric pool puts each buffer: a deterministic range allocator
// over chunks of peer-visible memory. Pure (no GPU), CPU-tested.
//
// ferry's collectives need a peer's buffer at the same offset of the same
// chunk on every rank. A pool whose every rank makes the same requests in
// the same order gets the same answers here, because every decision depends
// only on that sequence: first fit in this stream's free ranges, then the
// untouched tail of the first chunk with room, else the caller adds a chunk
// (collectively).
//
// A freed range goes back to the stream it was allocated on and is reused
// only by later requests on that stream, which is PyTorch's caching-allocator
// rule: a program whose memory reuse is correct with torch.empty (FSDP's is)
// stays correct here, with no event of our own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace ferry {

class PoolRanges {
 public:
  static constexpr size_t kAlign = 512;  // every range starts at a multiple (any dtype, any copy engine)
  static constexpr size_t kChunkRound = size_t{2} << 20;  // chunks are whole 2 MiB (the driver's granularity)

  // The size of the chunk a pool adds for a request of `bytes` that fit no
  // chunk it has: `chunk_bytes` (the pool's, rounded up to kChunkRound), or
  // the request's own where larger. Pure: every pool (C++ and Python) asks here.
  static size_t chunk_for(size_t bytes, size_t chunk_bytes);

  // A chunk of `size` bytes (a positive multiple of kAlign, else
  // INVALID_ARGUMENT); returns its index.
  int add_chunk(size_t size);
  // (chunk, offset) of `bytes` (rounded up to kAlign, at least one unit) for
  // `stream`, or nothing when no chunk has room (add one of at least that size).
  std::optional<std::pair<int, size_t>> allocate(size_t bytes, uint64_t stream);
  // Returns a range in use to its stream's free ranges, merged with free
  // neighbours of that stream (INVALID_ARGUMENT where none starts there).
  void release(int chunk, size_t offset);

  size_t bytes_in_use() const;
  int chunks() const { return static_cast<int>(chunks_.size()); }
  size_t chunk_size(int chunk) const { return chunks_.at(chunk).size; }
  // `stream`'s free ranges (chunk, offset, size), in order.
  std::vector<std::tuple<int, size_t, size_t>> free_ranges(uint64_t stream) const;
  // Every range in use: (chunk, offset) -> (size, stream).
  const std::map<std::pair<int, size_t>, std::pair<size_t, uint64_t>>& in_use() const { return in_use_; }

 private:
  struct Chunk {
    size_t size = 0;
    size_t tail = 0;  // bytes from the start never handed out yet
  };
  std::vector<Chunk> chunks_;
  // By stream: free ranges (chunk, offset) -> size, neighbours merged.
  std::map<uint64_t, std::map<std::pair<int, size_t>, size_t>> free_;
  std::map<std::pair<int, size_t>, std::pair<size_t, uint64_t>> in_use_;
};

}  // namespace ferry
