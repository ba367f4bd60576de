// Seeded data and list arguments shared by the probes in bench/probes/.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace ferry {
namespace probe {

// `bytes` of splitmix64 output from `seed` (a tail under 8 bytes is left as it is).
inline void fill(char* p, size_t bytes, uint64_t seed) {
  uint64_t x = seed;
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, 8);
  }
}

// "4096,16384" as numbers.
inline std::vector<size_t> parse_list(const char* s) {
  std::vector<size_t> v;
  for (const char* q = s; *q;) {
    v.push_back(std::strtoull(q, const_cast<char**>(&q), 10));
    if (*q == ',') ++q;
  }
  return v;
}

// Pages of `got` (page dst_ids[i]) that differ from `expect` (page src_ids[i]),
// for the first `pages` entries.
inline size_t pages_wrong(const char* got, const char* expect, const std::vector<size_t>& dst_ids,
                          const std::vector<size_t>& src_ids, size_t pages, size_t page_bytes) {
  size_t wrong = 0;
  for (size_t i = 0; i < pages; ++i)
    if (std::memcmp(got + dst_ids[i] * page_bytes, expect + src_ids[i] * page_bytes, page_bytes)) ++wrong;
  return wrong;
}

}  // namespace probe
}  // namespace ferry
