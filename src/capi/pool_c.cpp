// The C API of the symmetric pool (include/ferry/ferry.h, ferry_pool_*): a
// thin shim over coll/symmetric_pool.hpp.
#include <cstring>
#include <memory>

#include "capi/comm_handle.hpp"
#include "capi/guarded.hpp"
#include "coll/symmetric_pool.hpp"
#include "ferry/ferry.h"

struct ferry_pool {
  std::unique_ptr<ferry::SymmetricPool> impl;
};

namespace {

ferry::SymmetricPool& get_pool(ferry_pool_t pool) {
  if (!pool || !pool->impl) ferry::throw_error(FERRY_ERROR_INVALID_ARGUMENT, "pool is NULL or destroyed");
  return *pool->impl;
}

}  // namespace

ferry_result_t ferry_pool_create(ferry_comm_t comm, size_t chunk_bytes, ferry_pool_t* pool) {
  return ferry::capi::guarded([&] {
    FERRY_ARG_CHECK(pool, "pool must not be NULL");
    *pool = nullptr;  // a caller that destroys it after a failure destroys nothing
    auto p = std::make_unique<ferry_pool>();
    p->impl = std::make_unique<ferry::SymmetricPool>(ferry::capi::get_shared(comm), chunk_bytes);
    *pool = p.release();
  });
}

ferry_result_t ferry_pool_alloc(ferry_pool_t pool, size_t bytes, ferry_stream_t stream, void** ptrs) {
  return ferry::capi::guarded([&] {
    FERRY_ARG_CHECK(ptrs, "ptrs must not be NULL");
    auto v = get_pool(pool).alloc(bytes, reinterpret_cast<cudaStream_t>(stream));
    std::memcpy(ptrs, v.data(), v.size() * sizeof(void*));
  });
}

ferry_result_t ferry_pool_free(ferry_pool_t pool, const void* ptr) {
  return ferry::capi::guarded([&] { get_pool(pool).free(ptr); });
}

ferry_result_t ferry_pool_sizes(ferry_pool_t pool, size_t* reserved, size_t* in_use) {
  return ferry::capi::guarded([&] {
    const ferry::SymmetricPool& p = get_pool(pool);
    if (reserved) *reserved = p.bytes_reserved();
    if (in_use) *in_use = p.bytes_in_use();
  });
}

void ferry_pool_destroy(ferry_pool_t pool) {
  if (!pool) return;
  ferry::capi::guarded([&] { pool->impl.reset(); });
  delete pool;
}
