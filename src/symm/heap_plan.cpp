#include "symm/heap_plan.hpp"

#include <algorithm>
#include <cstring>

#include "core/error.hpp"
#include "ferry/device/heap.cuh"

namespace ferry {

namespace {

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

// The alignment an allocation gets: at least the heap's unit; `align` must be a power of two.
size_t allocation_align(size_t align) {
  FERRY_ARG_CHECK(align != 0 && (align & (align - 1)) == 0,
                  "align is " + std::to_string(align) + "; expected a power of two");
  return align < kHeapUnit ? kHeapUnit : align;
}

std::string mib(size_t bytes) {
  char buf[64];
  snprintf(buf, sizeof buf, "%.1f MiB", bytes / 1048576.0);
  return buf;
}

}  // namespace

size_t heap_rounded_bytes(size_t bytes) {
  if (bytes > SIZE_MAX - kHeapUnit) return 0;
  return bytes == 0 ? kHeapUnit : align_up(bytes, kHeapUnit);
}

HeapAllocator::HeapAllocator(size_t capacity, size_t reserved_front) : capacity_(capacity), front_(reserved_front) {
  FERRY_ARG_CHECK(reserved_front % kHeapUnit == 0 && reserved_front < capacity,
                  "heap capacity " + std::to_string(capacity) + " is too small; expected more than " +
                      std::to_string(reserved_front) + " bytes");
  free_[front_] = capacity_ - front_;
}

size_t HeapAllocator::take(std::map<size_t, size_t>::iterator it, size_t start, size_t need) {
  const size_t free_start = it->first, end_free = it->first + it->second;
  free_.erase(it);
  if (start > free_start) free_[free_start] = start - free_start;
  if (start + need < end_free) free_[start + need] = end_free - (start + need);
  live_[start] = need;
  used_ += need;
  return start;
}

void HeapAllocator::exhausted(size_t bytes, size_t align) const {
  throw_error(FERRY_ERROR_OUT_OF_MEMORY,
              "the symmetric heap has no room for " + std::to_string(bytes) + " bytes (aligned to " +
                  std::to_string(align) + "): " + mib(used_) + " of its " + mib(capacity_ - front_) +
                  " are in use by " + std::to_string(live_.size()) +
                  " allocations; create the heap with a larger capacity (FERRY_SYMM_HEAP_BYTES, or the capacity "
                  "argument)");
}

size_t HeapAllocator::alloc(size_t bytes, size_t align) {
  align = allocation_align(align);
  const size_t need = heap_rounded_bytes(bytes);
  if (need != 0) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      const size_t start = align_up(it->first, align);
      const size_t end_free = it->first + it->second;
      if (start >= end_free || end_free - start < need) continue;
      return take(it, start, need);
    }
  }
  exhausted(bytes, align);
}

size_t HeapAllocator::alloc_top(size_t bytes, size_t align) {
  align = allocation_align(align);
  const size_t need = heap_rounded_bytes(bytes);
  if (need != 0) {
    for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
      const size_t end_free = it->first + it->second;
      if (it->second < need) continue;
      const size_t start = (end_free - need) / align * align;
      if (start < it->first) continue;
      return take(std::next(it).base(), start, need);
    }
  }
  exhausted(bytes, align);
}

void HeapAllocator::free(size_t offset) {
  auto it = live_.find(offset);
  FERRY_ARG_CHECK(it != live_.end(),
                  "offset " + std::to_string(offset) + " is not the start of a live heap allocation");
  size_t start = it->first, size = it->second;
  used_ -= size;
  live_.erase(it);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      prev->second += size;
      return;
    }
  }
  free_[start] = size;
}

bool HeapAllocator::find(size_t offset, size_t bytes, size_t* start, size_t* size) const {
  auto it = live_.upper_bound(offset);
  if (it == live_.begin()) return false;
  --it;
  if (offset - it->first > it->second || bytes > it->second - (offset - it->first)) return false;
  if (start) *start = it->first;
  if (size) *size = it->second;
  return true;
}

size_t heap_mapped_end(size_t mapped, size_t need_end, size_t granularity, size_t min_chunk, size_t capacity) {
  if (need_end <= mapped) return mapped;
  // Past the capacity (or a chunk that reaches it) is the capacity, before
  // any sum that could wrap.
  if (need_end >= capacity || min_chunk >= capacity - mapped) return capacity;
  size_t end = align_up(need_end, granularity);
  if (end - mapped < min_chunk) end = align_up(mapped + min_chunk, granularity);
  return end < capacity ? end : capacity;
}

size_t heap_capacity(size_t requested, size_t knob_default, size_t granularity) {
  const size_t want = requested ? requested : knob_default;
  const std::string what = requested ? "capacity" : "FERRY_SYMM_HEAP_BYTES";
  FERRY_ARG_CHECK(want > 0, what + " must be positive");
  FERRY_ARG_CHECK(want <= (size_t(1) << 46), what + " is " + std::to_string(want) + " bytes; expected at most 64 TiB");
  return align_up(want, granularity);
}

RegistrationPlan plan_registration(const std::vector<RegistrationSpan>& spans, size_t bytes, size_t granularity) {
  RegistrationPlan plan;
  if (spans.empty() || granularity == 0) {
    plan.error = "no ranks to register";
    return plan;
  }
  const size_t g = granularity;
  size_t q_max = 0;
  for (size_t r = 0; r < spans.size(); ++r) {
    const RegistrationSpan& s = spans[r];
    const std::string who = "rank " + std::to_string(r) + "'s buffer";
    if (s.pieces.empty()) {
      plan.error = who + " lies in no allocation";
      return plan;
    }
    size_t span = 0;
    for (size_t piece : s.pieces) {
      if (piece == 0 || piece % g != 0) {
        plan.error = who + " lies in an allocation of " + std::to_string(piece) +
                     " bytes, which is not a whole number of " + std::to_string(g) + "-byte granules";
        return plan;
      }
      span += piece;
    }
    if (s.lead >= s.pieces[0] || bytes > span - s.lead) {
      plan.error = who + " (" + std::to_string(bytes) + " bytes, " + std::to_string(s.lead) +
                   " bytes into its first allocation) does not lie inside the allocations found under it";
      return plan;
    }
    if (s.lead % g != spans[0].lead % g) {
      plan.error = "the buffers start at different offsets within their " + std::to_string(g) +
                   "-byte granules (rank 0: " + std::to_string(spans[0].lead % g) + " bytes in, rank " +
                   std::to_string(r) + ": " + std::to_string(s.lead % g) +
                   "); every rank's buffer must start at the same offset modulo " + std::to_string(g) + " bytes";
      return plan;
    }
    q_max = std::max(q_max, s.lead / g);
  }
  plan.data_offset = q_max * g + spans[0].lead % g;
  for (const RegistrationSpan& s : spans) {
    size_t span = 0;
    for (size_t piece : s.pieces) span += piece;
    plan.shift.push_back((q_max - s.lead / g) * g);
    plan.region_bytes = std::max(plan.region_bytes, plan.shift.back() + span);
  }
  return plan;
}

std::string encode_registration(const RegistrationRecord& r) {
  if (r.kind == '!') return "!" + std::to_string(r.code) + ":" + r.error;
  if (r.kind == 'I') {
    const uint64_t bytes = r.bytes;
    std::string out = "I";
    out.append(reinterpret_cast<const char*>(&bytes), sizeof bytes);
    return out + r.ipc;
  }
  FERRY_ARG_CHECK(r.kind == 'V', std::string("registration record of kind '") + r.kind + "'");
  std::string out = "V " + std::to_string(r.bytes) + " " + std::to_string(r.span.lead);
  for (size_t p : r.span.pieces) out += " " + std::to_string(p);
  return out;
}

RegistrationRecord decode_registration(const std::string& s, int rank) {
  auto malformed = [&] {
    throw_error(FERRY_ERROR_INTERNAL, "rank " + std::to_string(rank) + " sent a malformed registration record");
  };
  RegistrationRecord r;
  if (s.empty()) malformed();
  r.kind = s[0];
  if (r.kind == '!') {
    // The error's code, then ':' and its message.
    size_t i = 1;
    int code = 0;
    for (; i < s.size() && i < 4 && s[i] >= '0' && s[i] <= '9'; ++i) code = code * 10 + (s[i] - '0');
    if (i == 1 || i >= s.size() || s[i] != ':' || code == 0) malformed();
    r.code = code;
    r.error = s.substr(i + 1);
  } else if (r.kind == 'I') {
    uint64_t bytes = 0;
    if (s.size() < 1 + sizeof bytes) malformed();
    std::memcpy(&bytes, s.data() + 1, sizeof bytes);
    r.bytes = bytes;
    r.ipc = s.substr(1 + sizeof bytes);
  } else if (r.kind == 'V') {
    // Numbers parsed by hand: a stream extraction of a number (its locale)
    // spun forever inside a Python process on the GPU machine.
    std::vector<size_t> numbers;
    size_t i = 1;
    while (i < s.size()) {
      if (s[i] != ' ') malformed();
      ++i;
      size_t v = 0, digits = 0;
      for (; i < s.size() && s[i] >= '0' && s[i] <= '9'; ++i, ++digits) {
        if (v > (SIZE_MAX - 9) / 10) malformed();
        v = v * 10 + static_cast<size_t>(s[i] - '0');
      }
      if (digits == 0) malformed();
      numbers.push_back(v);
    }
    if (numbers.size() < 3) malformed();  // the size, the lead and at least one piece
    r.bytes = numbers[0];
    r.span.lead = numbers[1];
    r.span.pieces.assign(numbers.begin() + 2, numbers.end());
    size_t span = 0;
    for (size_t p : r.span.pieces) {
      if (p == 0 || span > SIZE_MAX - p) malformed();
      span += p;
    }
    if (r.span.lead >= r.span.pieces[0] || r.bytes > span - r.span.lead) malformed();
  } else {
    malformed();
  }
  return r;
}

std::string heap_call_record(uint64_t call, const std::string& what) {
  return "call #" + std::to_string(call) + ": " + what;
}

std::string heap_calls_mismatch(const std::vector<std::string>& records) {
  if (records.empty()) return "";
  // The record most ranks gave is taken as the expected one, so that one
  // stray rank is named rather than the majority.
  std::map<std::string, int> votes;
  for (const auto& r : records) ++votes[r];
  const std::string* common = &records[0];
  int best = 0;
  for (const auto& [r, n] : votes)
    if (n > best) best = n, common = &r;
  if (best == static_cast<int>(records.size())) return "";
  std::string msg =
      "the ranks made different symmetric-heap calls (every rank must allocate and free the same "
      "sizes in the same order): ";
  std::string others;
  for (size_t r = 0; r < records.size(); ++r)
    if (records[r] != *common)
      others += (others.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " made " + records[r]);
  return msg + others + "; the other ranks made " + *common;
}

namespace {

const char* kind_name(uint32_t kind) {
  switch (static_cast<device::WaitKind>(kind)) {
    case device::WaitKind::kBarrier:
      return "a barrier";
    case device::WaitKind::kSignal:
      return "signal_wait_until";
    case device::WaitKind::kWaitUntil:
      return "wait_until";
    case device::WaitKind::kBadTeam:
      return "a barrier over a team this rank is not a usable member of";
    case device::WaitKind::kStreamWait:
      return "a stream's wait (heap.wait)";
    case device::WaitKind::kStreamBarrier:
      return "barrier_on_stream";
    case device::WaitKind::kBadGrid:
      return "a collective with a grid of more blocks than it takes";
    case device::WaitKind::kGridSync:
      return "the wait among its own grid's blocks (grid_sync, or a collective's first step)";
    case device::WaitKind::kBadRoot:
      return "broadcast or reduce with a root outside the team";
  }
  return "a wait";
}

}  // namespace

HeapFault heap_fault(uint64_t w, int rank, double timeout_s) {
  HeapFault f;
  if (!(w & device::kHeapFaultBit)) return f;
  const uint32_t kind = static_cast<uint32_t>((w >> 32) & 0xff);
  const int peer = static_cast<int>(static_cast<uint32_t>(w));
  const std::string on = "rank " + std::to_string(rank);
  // A call refused in a kernel leaves the fault too: the peers that made the
  // call as asked may be waiting for this rank, so its words cannot be trusted.
  const std::string stays = "; the fault stays with the heap and its later waits give up: close it";
  if (kind == static_cast<uint32_t>(device::WaitKind::kBadGrid)) {
    f.code = FERRY_ERROR_INVALID_ARGUMENT;
    f.message = on + " called " + kind_name(kind) + " (at most " + std::to_string(device::kMaxGridBlocks) +
                " blocks, ferry::device::kMaxGridBlocks)" + stays;
    return f;
  }
  if (kind == static_cast<uint32_t>(device::WaitKind::kBadTeam)) {
    f.code = FERRY_ERROR_INVALID_ARGUMENT;
    f.message = on + " called " + kind_name(kind) +
                " (a split that did not fit its parent, or a team without this rank)" + stays;
    return f;
  }
  if (kind == static_cast<uint32_t>(device::WaitKind::kBadRoot)) {
    f.code = FERRY_ERROR_INVALID_ARGUMENT;
    f.message = on + " called " + kind_name(kind) + ": root " + std::to_string(peer) +
                "; expected a team rank 0..size-1" + stays;
    return f;
  }
  std::string who = peer < 0 ? std::string("a signal from any rank") : "rank " + std::to_string(peer);
  if (kind == static_cast<uint32_t>(device::WaitKind::kGridSync))
    who =
        "every block of its grid to arrive (all of them must run at once: at most kMaxGridBlocks, and no block "
        "returning before the others)";
  f.code = FERRY_ERROR_TIMEOUT;
  f.message = std::string(kind_name(kind)) + " on " + on + " waited for " + who + " longer than the timeout (" +
              std::to_string(timeout_s) +
              " s, FERRY_TIMEOUT_S) and gave up; the heap's words are no longer in step: close it";
  return f;
}

}  // namespace ferry
