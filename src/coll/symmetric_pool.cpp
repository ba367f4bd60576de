#include "coll/symmetric_pool.hpp"

#include <algorithm>
#include <string>

#include "core/error.hpp"

namespace ferry {

SymmetricPool::SymmetricPool(std::weak_ptr<Communicator> comm, size_t chunk_bytes) : comm_(std::move(comm)) {
  FERRY_ARG_CHECK(chunk_bytes > 0 && chunk_bytes <= (size_t{1} << 50),
                  "chunk_bytes is " + std::to_string(chunk_bytes) + "; expected a positive size");
  chunk_bytes_ = PoolRanges::chunk_for(0, chunk_bytes);
}

SymmetricPool::~SymmetricPool() {
  try {
    close();
  } catch (...) {
  }
}

std::shared_ptr<Communicator> SymmetricPool::open_comm(const char* what) const {
  if (closed_) throw_error(FERRY_ERROR_CLOSED, std::string(what) + ": the pool is closed");
  std::shared_ptr<Communicator> comm = comm_.lock();
  if (!comm || comm->closed())
    throw_error(FERRY_ERROR_CLOSED, std::string(what) + ": the pool's communicator is " +
                                        (comm ? "closed" : "destroyed") + ", and its close freed the pool's chunks");
  return comm;
}

std::vector<void*> SymmetricPool::alloc(size_t bytes, cudaStream_t stream) {
  const std::shared_ptr<Communicator> comm = open_comm("alloc");
  FERRY_ARG_CHECK(bytes <= (size_t{1} << 50), "bytes is " + std::to_string(bytes) + "; expected at most 2^50");
  const uint64_t key = reinterpret_cast<uint64_t>(stream);
  auto spot = ranges_.allocate(bytes, key);
  if (!spot) {
    const size_t size = PoolRanges::chunk_for(bytes, chunk_bytes_);
    chunks_.push_back(comm->alloc(size));
    ranges_.add_chunk(size);
    spot = ranges_.allocate(bytes, key);
    FERRY_ARG_CHECK(spot.has_value(), "the pool's new chunk did not hold the request");
  }
  std::vector<void*> out;
  for (void* base : chunks_.at(static_cast<size_t>(spot->first)))
    out.push_back(static_cast<char*>(base) + spot->second);
  return out;
}

void SymmetricPool::free(const void* first) {
  open_comm("free");
  const char* p = static_cast<const char*>(first);
  for (size_t c = 0; c < chunks_.size(); ++c) {
    const char* base = static_cast<const char*>(chunks_[c].at(0));
    if (p < base || p >= base + ranges_.chunk_size(static_cast<int>(c))) continue;
    const std::pair<int, size_t> at{static_cast<int>(c), static_cast<size_t>(p - base)};
    FERRY_ARG_CHECK(ranges_.in_use().count(at),
                    "ptr lies inside this pool's chunk " + std::to_string(c) + " at offset " +
                        std::to_string(at.second) +
                        ", where no buffer in use starts; expected a pointer alloc returned");
    ranges_.release(at.first, at.second);
    return;
  }
  throw_error(FERRY_ERROR_INVALID_ARGUMENT, "ptr is not a buffer of this pool; expected a pointer alloc returned");
}

void SymmetricPool::close() {
  if (closed_) return;
  closed_ = true;
  // A closed or destroyed communicator freed the chunks already.
  const std::shared_ptr<Communicator> comm = comm_.lock();
  if (comm && !comm->closed())
    for (const auto& chunk : chunks_) comm->free(chunk);
  chunks_.clear();
  ranges_ = PoolRanges();
}

bool SymmetricPool::live() const {
  if (closed_) return false;
  const std::shared_ptr<Communicator> comm = comm_.lock();
  return comm && !comm->closed();
}

size_t SymmetricPool::bytes_reserved() const {
  if (!live()) return 0;
  size_t n = 0;
  for (int c = 0; c < ranges_.chunks(); ++c) n += ranges_.chunk_size(c);
  return n;
}

}  // namespace ferry
