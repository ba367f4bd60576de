#include "symm/pool_ranges.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace ferry {

size_t PoolRanges::chunk_for(size_t bytes, size_t chunk_bytes) {
  FERRY_ARG_CHECK(bytes <= SIZE_MAX - kChunkRound, "a request of " + std::to_string(bytes) + " bytes is too large");
  FERRY_ARG_CHECK(chunk_bytes <= SIZE_MAX - kChunkRound,
                  "chunk_bytes is " + std::to_string(chunk_bytes) + "; too large for a chunk");
  const auto round = [](size_t n) { return (n + kChunkRound - 1) / kChunkRound * kChunkRound; };
  return std::max(round(chunk_bytes), round(bytes ? bytes : 1));
}

int PoolRanges::add_chunk(size_t size) {
  FERRY_ARG_CHECK(size > 0 && size % kAlign == 0,
                  "chunk size " + std::to_string(size) + " is not a positive multiple of " + std::to_string(kAlign));
  chunks_.push_back(Chunk{size, 0});
  return static_cast<int>(chunks_.size()) - 1;
}

std::optional<std::pair<int, size_t>> PoolRanges::allocate(size_t bytes, uint64_t stream) {
  FERRY_ARG_CHECK(bytes <= SIZE_MAX - kAlign, "a request of " + std::to_string(bytes) + " bytes is too large");
  const size_t size = ((bytes ? bytes : 1) + kAlign - 1) / kAlign * kAlign;
  auto by_stream = free_.find(stream);
  if (by_stream != free_.end()) {
    auto& free = by_stream->second;
    for (auto it = free.begin(); it != free.end(); ++it) {
      if (it->second < size) continue;
      const auto [chunk, offset] = it->first;
      const size_t left = it->second - size;
      free.erase(it);
      if (left) free[{chunk, offset + size}] = left;
      in_use_[{chunk, offset}] = {size, stream};
      return std::make_pair(chunk, offset);
    }
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    Chunk& chunk = chunks_[c];
    if (chunk.size - chunk.tail < size) continue;
    const size_t offset = chunk.tail;
    chunk.tail += size;
    in_use_[{static_cast<int>(c), offset}] = {size, stream};
    return std::make_pair(static_cast<int>(c), offset);
  }
  return std::nullopt;
}

void PoolRanges::release(int chunk, size_t offset) {
  auto it = in_use_.find({chunk, offset});
  FERRY_ARG_CHECK(it != in_use_.end(),
                  "no range in use starts at offset " + std::to_string(offset) + " of chunk " + std::to_string(chunk));
  const auto [size, stream] = it->second;
  in_use_.erase(it);
  auto& free = free_[stream];
  auto at = free.emplace(std::make_pair(chunk, offset), size).first;
  // Merged with the free neighbour after it, then with the one before.
  auto next = std::next(at);
  if (next != free.end() && next->first.first == chunk && offset + at->second == next->first.second) {
    at->second += next->second;
    free.erase(next);
  }
  if (at != free.begin()) {
    auto prev = std::prev(at);
    if (prev->first.first == chunk && prev->first.second + prev->second == offset) {
      prev->second += at->second;
      free.erase(at);
    }
  }
}

size_t PoolRanges::bytes_in_use() const {
  size_t n = 0;
  for (const auto& [where, use] : in_use_) n += use.first;
  return n;
}

std::vector<std::tuple<int, size_t, size_t>> PoolRanges::free_ranges(uint64_t stream) const {
  std::vector<std::tuple<int, size_t, size_t>> out;
  auto it = free_.find(stream);
  if (it == free_.end()) return out;
  for (const auto& [where, size] : it->second) out.emplace_back(where.first, where.second, size);
  return out;
}

}  // namespace ferry
