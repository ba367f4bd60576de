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

uint32_t call_signature(CollOp op, uint64_t bytes_per_rank, uint32_t registration, uint64_t offset) {
  uint32_t h = 2166136261u;
  h = fnv1a(h, static_cast<uint64_t>(op));
  h = fnv1a(h, bytes_per_rank);
  h = fnv1a(h, registration);
  h = fnv1a(h, offset);
  return h | 1u;  // odd, so a tag is never 0
}

uint64_t make_tag(uint64_t seq, uint32_t signature) { return ((seq & 0xffffffffull) << 32) | (signature | 1u); }

}  // namespace ferry
