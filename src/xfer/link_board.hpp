// The link board: a small table in shared host memory, one per user and
// machine, on which every multipath engine posts the GPUs it is copying to or
// from, by direction, for a moment at a time and renewed while it copies.
// Engines of other programs read it and relay nothing over a posted GPU's
// host link in that direction (MultipathPolicy::board): where every GPU's
// program copies its own data at once (tensor-parallel ranks waking their
// weights, say), each keeps its own link instead of crowding the others'.
//
// A post lives in a slot of its engine (a random token) and the GPU (its
// UUID, the same in every process whatever the device numbering); a program
// that ends leaves posts that lapse within moments, and slots idle for
// kStaleNs are taken over. A post's end is kept to 2^16 ns (rounded up). One
// thread per LinkBoard object.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ferry {
namespace xfer {

using GpuId = std::array<uint8_t, 16>;

class LinkBoard {
 public:
  static constexpr int kSlots = 128;
  static constexpr int kLanes = 2;                               // 0: copies into a GPU, 1: out of one
  static constexpr int64_t kStaleNs = int64_t{10} * 1000000000;  // a slot idle this long may be taken over

  // Opens the board named `name` (a POSIX shared memory name; empty: this
  // user's, "/ferry-link-board-2-<uid>"), making it where there is none. Null
  // where shared memory cannot be had, with the reason in `why`. This object
  // takes over another engine's slot idle for `stale_ns` (tests pass less,
  // down to below zero: any slot, to race takeovers against posts).
  static std::unique_ptr<LinkBoard> open(const std::string& name, std::string* why, int64_t stale_ns = kStaleNs);
  ~LinkBoard();
  LinkBoard(const LinkBoard&) = delete;
  LinkBoard& operator=(const LinkBoard&) = delete;

  // Posts that engine `token` copies to or from `gpu` in `lane` until
  // `until_ns` (now_ns()'s clock; a time past withdraws the post). False
  // where every slot is taken (or, on a board that takes any slot at once,
  // where its slots were taken over as fast as it claimed them). The slots this object took go back when it
  // is destroyed.
  bool post(const GpuId& gpu, int lane, uint64_t token, int64_t until_ns);
  // For each of `gpus`, by lane: an engine other than `token` has a post
  // there lasting past `now_ns`.
  std::vector<std::array<bool, kLanes>> busy(const std::vector<GpuId>& gpus, uint64_t token, int64_t now_ns) const;

  // The clock posts are in: monotonic, the same in every process of the machine.
  static int64_t now_ns();
  // A token no other engine has (random).
  static uint64_t new_token();

 private:
  struct Table;
  LinkBoard(Table* table, size_t bytes, int64_t stale_ns) : table_(table), bytes_(bytes), stale_ns_(stale_ns) {}
  int claim(const GpuId& gpu, uint64_t token, int64_t now_ns);  // a slot index, or -1

  Table* table_;
  size_t bytes_;
  int64_t stale_ns_;
  // This object's slots: (gpu, token) -> (index, the state it was claimed with).
  std::map<std::pair<GpuId, uint64_t>, std::pair<int, uint64_t>> mine_;
};

}  // namespace xfer
}  // namespace ferry
