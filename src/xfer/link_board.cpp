#include "xfer/link_board.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>

namespace ferry {
namespace xfer {

namespace {

constexpr uint64_t kMagic = 0x66657272796c6232ull;  // "ferrylb2": this layout
// A slot's state: a generation (bumped at each claim) above two bits of phase.
constexpr uint64_t kFree = 0, kClaiming = 1, kReady = 2, kPhase = 3;
// A lane's post: its end in now_ns()'s clock, rounded up to 2^16 ns, above
// the low 16 bits of the generation it was posted in. A post that raced a
// takeover of its slot carries the old generation: its compare-and-swap
// fails, and readers would not count it.
constexpr uint64_t kTag = 0xFFFF;

uint64_t tag_of(uint64_t state) { return (state >> 2) & kTag; }

uint64_t tagged(int64_t until, uint64_t state) {
  const int64_t most = std::numeric_limits<int64_t>::max() & ~static_cast<int64_t>(kTag);  // no overflow rounding up
  const uint64_t end = until <= 0 ? 0 : (static_cast<uint64_t>(std::min(until, most)) + kTag) & ~kTag;
  return end | tag_of(state);
}

int64_t end_of(uint64_t post) { return static_cast<int64_t>(post & ~kTag); }

static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int64_t>::is_always_lock_free,
              "the board's atomics are shared between processes: they must be lock-free");

uint64_t half(const GpuId& g, int which) {
  uint64_t v = 0;
  std::memcpy(&v, g.data() + 8 * which, 8);
  return v;
}

}  // namespace

// Zeroed memory is an empty board: a new segment needs no setting up, so two
// programs opening it at once cannot race on that.
struct LinkBoard::Table {
  struct Slot {
    std::atomic<uint64_t> state;
    std::atomic<uint64_t> token;
    std::atomic<uint64_t> gpu[2];
    std::atomic<int64_t> claimed;
    std::atomic<uint64_t> until[kLanes];  // tagged()
  };
  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> used;  // slots ever claimed: readers look no further
  Slot slots[kSlots];
};

std::unique_ptr<LinkBoard> LinkBoard::open(const std::string& name, std::string* why, int64_t stale_ns) {
  // The layout's number in the name: programs of another ferry version keep to a board of their own.
  const std::string n = name.empty() ? "/ferry-link-board-2-" + std::to_string(getuid()) : name;
  auto fail = [&](const std::string& what) -> std::unique_ptr<LinkBoard> {
    if (why) *why = what + " (" + n + "): " + std::strerror(errno);
    return nullptr;
  };
  const int fd = shm_open(n.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) return fail("shm_open");
  struct stat st {};
  if (fstat(fd, &st) != 0 || (st.st_size < static_cast<off_t>(sizeof(Table)) && ftruncate(fd, sizeof(Table)) != 0)) {
    auto r = fail("sizing the board");
    close(fd);
    return r;
  }
  void* p = mmap(nullptr, sizeof(Table), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return fail("mmap");
  auto* t = static_cast<Table*>(p);
  uint64_t m = 0;
  if (!t->magic.compare_exchange_strong(m, kMagic) && m != kMagic) {
    munmap(p, sizeof(Table));
    errno = EPROTO;
    return fail("a board of another layout");
  }
  return std::unique_ptr<LinkBoard>(new LinkBoard(t, sizeof(Table), stale_ns));
}

// Its slots go back: free for the next engine at once.
LinkBoard::~LinkBoard() {
  for (const auto& entry : mine_) {
    uint64_t st = entry.second.second;
    table_->slots[entry.second.first].state.compare_exchange_strong(st, (((st >> 2) + 1) << 2) | kFree,
                                                                    std::memory_order_acq_rel);
  }
  munmap(table_, bytes_);
}

int64_t LinkBoard::now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

uint64_t LinkBoard::new_token() {
  std::random_device rd;
  uint64_t t = (uint64_t{rd()} << 32) ^ rd() ^ (uint64_t(getpid()) << 20) ^ static_cast<uint64_t>(now_ns());
  return t ? t : 1;
}

int LinkBoard::claim(const GpuId& gpu, uint64_t token, int64_t now) {
  for (int i = 0; i < kSlots; ++i) {
    Table::Slot& s = table_->slots[i];
    uint64_t st = s.state.load(std::memory_order_acquire);
    bool take = (st & kPhase) == kFree;
    if ((st & kPhase) == kReady) {  // idle long enough: its engine is gone
      const int64_t last =
          std::max({s.claimed.load(std::memory_order_relaxed), end_of(s.until[0].load(std::memory_order_relaxed)),
                    end_of(s.until[1].load(std::memory_order_relaxed))});
      take = last < now - stale_ns_;
    }
    if (!take || !s.state.compare_exchange_strong(st, (st & ~kPhase) | kClaiming, std::memory_order_acq_rel)) continue;
    // A reader that saw the slot ready before the claim sees none of the new
    // fields without also seeing the state change (a seqlock's write side).
    std::atomic_thread_fence(std::memory_order_release);
    s.token.store(token, std::memory_order_relaxed);
    s.gpu[0].store(half(gpu, 0), std::memory_order_relaxed);
    s.gpu[1].store(half(gpu, 1), std::memory_order_relaxed);
    s.claimed.store(now, std::memory_order_relaxed);
    const uint64_t ready = (((st >> 2) + 1) << 2) | kReady;
    for (auto& u : s.until) u.store(tagged(0, ready), std::memory_order_relaxed);
    s.state.store(ready, std::memory_order_release);
    for (uint64_t used = table_->used.load(); used < uint64_t(i) + 1;)
      if (table_->used.compare_exchange_weak(used, uint64_t(i) + 1)) break;
    mine_[{gpu, token}] = {i, ready};
    return i;
  }
  return -1;
}

bool LinkBoard::post(const GpuId& gpu, int lane, uint64_t token, int64_t until_ns) {
  if (lane < 0 || lane >= kLanes) return false;
  const int64_t now = now_ns();
  // A slot is ours until it lies idle past the stale time and another engine
  // takes it; then the swap below fails (the lane holds the new generation's
  // tag) and the post goes to a slot claimed anew. A swap that lands between
  // the taker's claim and its writing of the lanes is overwritten there, and
  // this post is missing until its next renewal. Bounded: only boards that
  // take any slot at once (tests) can lose a slot just claimed.
  for (int tries = 0; tries < kSlots; ++tries) {
    auto it = mine_.find({gpu, token});
    if (it == mine_.end()) {
      if (until_ns <= now) return true;  // a withdrawal, and nothing of ours there to withdraw
      if (claim(gpu, token, now) < 0) return false;
      it = mine_.find({gpu, token});
    }
    const auto [i, state] = it->second;
    Table::Slot& s = table_->slots[i];
    uint64_t post = s.until[lane].load(std::memory_order_acquire);
    while ((post & kTag) == tag_of(state) && s.state.load(std::memory_order_acquire) == state)
      if (s.until[lane].compare_exchange_weak(post, tagged(until_ns, state), std::memory_order_acq_rel)) {
        s.claimed.store(now, std::memory_order_relaxed);  // in use: not stale
        return true;
      }
    mine_.erase(it);
  }
  return false;
}

std::vector<std::array<bool, LinkBoard::kLanes>> LinkBoard::busy(const std::vector<GpuId>& gpus, uint64_t token,
                                                                 int64_t now) const {
  std::vector<std::array<bool, kLanes>> out(gpus.size(), {false, false});
  const uint64_t used = std::min<uint64_t>(table_->used.load(std::memory_order_acquire), kSlots);
  for (uint64_t i = 0; i < used; ++i) {
    const Table::Slot& s = table_->slots[i];
    const uint64_t st = s.state.load(std::memory_order_acquire);
    if ((st & kPhase) != kReady) continue;
    const uint64_t tok = s.token.load(std::memory_order_relaxed);
    const uint64_t lo = s.gpu[0].load(std::memory_order_relaxed), hi = s.gpu[1].load(std::memory_order_relaxed);
    uint64_t until[kLanes];
    for (int l = 0; l < kLanes; ++l) until[l] = s.until[l].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.state.load(std::memory_order_relaxed) != st || tok == token) continue;  // taken over meanwhile, or ours
    for (size_t k = 0; k < gpus.size(); ++k)
      if (half(gpus[k], 0) == lo && half(gpus[k], 1) == hi)
        for (int l = 0; l < kLanes; ++l)
          out[k][l] = out[k][l] || ((until[l] & kTag) == tag_of(st) && end_of(until[l]) > now);
  }
  return out;
}

}  // namespace xfer
}  // namespace ferry
