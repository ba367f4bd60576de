#include "coll/signature.hpp"

namespace ferry {

static uint32_t fnv1a(uint32_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= static_cast<uint32_t>(v & 0xff);
    h *= 16777619u;
    v >>= 8;
  }
  return h;
}

uint32_t call_signature(CollOp op, uint64_t bytes_per_rank, uint32_t registration, uint64_t offset, uint64_t extra) {
  uint32_t h = 2166136261u;
  h = fnv1a(h, static_cast<uint64_t>(op));
  h = fnv1a(h, bytes_per_rank);
  h = fnv1a(h, registration);
  h = fnv1a(h, offset);
  h = fnv1a(h, extra);
  return h;
}

uint64_t flag_value(uint32_t signature) { return (uint64_t(0xfe77) << 48) | signature; }

uint64_t hash_values(const uint64_t* v, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= v[i];
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace ferry
