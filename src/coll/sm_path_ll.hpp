// The SM path's low-latency format (coll/sm_path.hpp; NCCL's LL protocol is
// the model): every 8 data bytes travel with two copies of a 32-bit flag in
// one 16-byte unit {data, flag, data, flag}, written with one store, so the
// receiver polls the data itself and no fence has to precede a flag. An
// 8-byte half lands whole, so a half whose flag is current holds current
// data. Host and device share these functions; the CPU tests run them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/host_device.hpp"

namespace ferry {

// Calls whose largest block is at most this use the format (twice the bytes
// cross NVLink, which only small blocks can afford).
constexpr size_t kSmPathLowLatencyMaxBytes = 64 << 10;
// Whether a call whose largest block is `largest_block` uses the format.
inline bool sm_path_low_latency(size_t largest_block) { return largest_block <= kSmPathLowLatencyMaxBytes; }

// 16-byte units of the low-latency format that carry `bytes`: at least one,
// so that a rank with nothing for a peer still tells it that it got there.
FERRY_HOST_DEVICE inline size_t sm_path_ll_units(size_t bytes) { return bytes == 0 ? 1 : (bytes + 7) / 8; }
constexpr size_t kSmPathLowLatencySlotBytes = ((kSmPathLowLatencyMaxBytes + 7) / 8) * 16;
// The flag of call `call` with signature `tag` in low-latency units: never 0
// (windows start zeroed), and different for calls two apart (the previous
// user of the same slot): call * odd constant is a bijection mod 2^32.
FERRY_HOST_DEVICE inline uint32_t sm_path_ll_flag(uint64_t call, uint32_t tag) {
  const uint32_t f = static_cast<uint32_t>(call) * 2654435761u ^ tag;
  return f != 0 ? f : 0x9e3779b9u;
}

// The units [*begin, returned end) of `units` that block `block` of `blocks`
// handles, sending and receiving alike.
FERRY_HOST_DEVICE inline size_t sm_path_ll_share(size_t units, int blocks, int block, size_t* begin) {
  const size_t per = (units + blocks - 1) / blocks;
  const size_t b = per * static_cast<size_t>(block);
  *begin = b < units ? b : units;
  return *begin + per < units ? *begin + per : units;
}

// The data of one unit: up to 8 bytes at p, of which `avail` are valid (the
// rest read as 0), any alignment; and back (only `avail` bytes written).
struct SmPathUnitData {
  uint32_t lo = 0, hi = 0;
};
FERRY_HOST_DEVICE inline SmPathUnitData sm_path_ll_pack(const char* p, size_t avail) {
  SmPathUnitData d;
  if (avail >= 8 && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    d.lo = reinterpret_cast<const uint32_t*>(p)[0];
    d.hi = reinterpret_cast<const uint32_t*>(p)[1];
    return d;
  }
  for (size_t i = 0; i < 8 && i < avail; ++i) {
    const uint32_t b = static_cast<unsigned char>(p[i]);
    if (i < 4)
      d.lo |= b << (8 * i);
    else
      d.hi |= b << (8 * (i - 4));
  }
  return d;
}
FERRY_HOST_DEVICE inline void sm_path_ll_unpack(char* p, SmPathUnitData d, size_t avail) {
  if (avail >= 8 && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    reinterpret_cast<uint32_t*>(p)[0] = d.lo;
    reinterpret_cast<uint32_t*>(p)[1] = d.hi;
    return;
  }
  for (size_t i = 0; i < 8 && i < avail; ++i)
    p[i] = static_cast<char>(((i < 4 ? d.lo >> (8 * i) : d.hi >> (8 * (i - 4)))) & 0xff);
}

}  // namespace ferry
