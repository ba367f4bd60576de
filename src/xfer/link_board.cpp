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
#include <random>

namespace ferry {
namespace xfer {

namespace {

constexpr uint64_t kMagic = 0x66657272796c6231ull;  // "ferrylb1": this layout
// A slot's state: a generation (bumped at each claim) above two bits of phase.
constexpr uint64_t kFree = 0, kClaiming = 1, kReady = 2, kPhase = 3;

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
    std::atomic<int64_t> until[kLanes];
  };
  std::atomic<uint64_t> magic;
  std::atomic<uint64_t> used;  // slots ever claimed: readers look no further
  Slot slots[kSlots];
};

std::unique_ptr<LinkBoard> LinkBoard::open(const std::string& name, std::string* why) {
  const std::string n = name.empty() ? "/ferry-link-board-" + std::to_string(getuid()) : name;
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
  return std::unique_ptr<LinkBoard>(new LinkBoard(t, sizeof(Table)));
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
          std::max({s.claimed.load(std::memory_order_relaxed), s.until[0].load(std::memory_order_relaxed),
                    s.until[1].load(std::memory_order_relaxed)});
      take = last < now - kStaleNs;
    }
    if (!take || !s.state.compare_exchange_strong(st, (st & ~kPhase) | kClaiming, std::memory_order_acq_rel)) continue;
    // A reader that saw the slot ready before the claim sees none of the new
    // fields without also seeing the state change (a seqlock's write side).
    std::atomic_thread_fence(std::memory_order_release);
    s.token.store(token, std::memory_order_relaxed);
    s.gpu[0].store(half(gpu, 0), std::memory_order_relaxed);
    s.gpu[1].store(half(gpu, 1), std::memory_order_relaxed);
    s.claimed.store(now, std::memory_order_relaxed);
    for (auto& u : s.until) u.store(0, std::memory_order_relaxed);
    const uint64_t ready = (((st >> 2) + 1) << 2) | kReady;
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
  int i = -1;
  const int64_t now = now_ns();
  auto it = mine_.find({gpu, token});
  // Still ours unless it lay idle past kStaleNs and another engine took it.
  if (it != mine_.end() && table_->slots[it->second.first].state.load(std::memory_order_acquire) == it->second.second)
    i = it->second.first;
  if (i < 0) {
    if (it != mine_.end()) mine_.erase(it);
    if (until_ns <= now) return true;  // a withdrawal, and nothing of ours there to withdraw
    i = claim(gpu, token, now);
    if (i < 0) return false;
  }
  Table::Slot& s = table_->slots[i];
  s.claimed.store(now, std::memory_order_relaxed);  // in use: not stale
  s.until[lane].store(until_ns, std::memory_order_release);
  return true;
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
    int64_t until[kLanes];
    for (int l = 0; l < kLanes; ++l) until[l] = s.until[l].load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.state.load(std::memory_order_relaxed) != st || tok == token) continue;  // taken over meanwhile, or ours
    for (size_t k = 0; k < gpus.size(); ++k)
      if (half(gpus[k], 0) == lo && half(gpus[k], 1) == hi)
        for (int l = 0; l < kLanes; ++l) out[k][l] = out[k][l] || until[l] > now;
  }
  return out;
}

}  // namespace xfer
}  // namespace ferry
