#include "xfer/multipath_plan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "core/error.hpp"

namespace ferry {
namespace xfer {

std::vector<Chunk> split_chunks(size_t bytes, size_t chunk_bytes) { return split_batch({bytes}, chunk_bytes); }

std::vector<Chunk> split_batch(const std::vector<size_t>& sizes, size_t chunk_bytes) {
  FERRY_ARG_CHECK(chunk_bytes > 0, "chunk_bytes must be positive");
  std::vector<Chunk> out;
  size_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    FERRY_ARG_CHECK(sizes[i] <= SIZE_MAX - at, "pieces[" + std::to_string(i) + "]: the batch passes 64 bits of bytes");
    // Steps by what is left, not past the end: a sum could wrap.
    for (size_t off = 0; off < sizes[i];) {
      const size_t n = std::min(chunk_bytes, sizes[i] - off);
      out.push_back(Chunk{at + off, n, i});
      off += n;
    }
    at += sizes[i];
  }
  return out;
}

namespace {
constexpr size_t kStep = size_t{64} << 10;  // chunk and head sizes
}  // namespace

size_t multipath_chunk_bytes(size_t bytes, int links, int outstanding, size_t max_chunk, size_t min_chunk) {
  FERRY_ARG_CHECK(max_chunk > 0, "max_chunk must be positive");
  const size_t slots = static_cast<size_t>(std::max(links, 1)) * static_cast<size_t>(std::max(outstanding, 1));
  size_t chunk = bytes / slots + (bytes % slots != 0);  // (rounded up without a sum that could wrap)
  chunk = chunk > SIZE_MAX - kStep ? max_chunk : (chunk + kStep - 1) / kStep * kStep;
  return std::min(max_chunk, std::max(chunk, min_chunk));
}

size_t multipath_head_bytes(size_t bytes, int links, size_t head_bytes) {
  if (head_bytes == 0 || links < 1) return 0;
  const size_t share = bytes / static_cast<size_t>(links);
  return std::min(head_bytes, share) / kStep * kStep;
}

MultipathSplit multipath_split(size_t bytes, int relays, size_t head_bytes, bool own_share_on_stream,
                               size_t first_piece, bool stream_on_target, double own_fraction) {
  MultipathSplit s;
  size_t head = 0;
  if (own_share_on_stream && own_fraction >= 0) {
    // (Clamped before the cast: a double past 2^64 has no size_t.)
    const double share = static_cast<double>(bytes) * std::min(own_fraction, 1.0);
    head = (share >= static_cast<double>(bytes) ? bytes : static_cast<size_t>(share)) / kStep * kStep;
  } else
    head = multipath_head_bytes(bytes, relays + 1, own_share_on_stream ? SIZE_MAX : head_bytes);
  s.head = stream_on_target ? std::min(head, first_piece) : 0;
  // With the own share on the stream the target's link takes none of the rest,
  // head or not. A stream on another GPU cannot take the share (nothing the
  // program later puts on the target GPU holds what that stream waits for):
  // the target's link then carries its chunks as usual.
  s.own_share_on_stream = own_share_on_stream && stream_on_target;
  s.rest_links = s.own_share_on_stream ? std::max(relays, 1) : relays + 1;
  return s;
}

double multipath_own_fraction(const std::vector<double>& rate, const std::vector<bool>& relays, int own,
                              bool own_late) {
  FERRY_ARG_CHECK(own >= 0 && own < static_cast<int>(rate.size()) && relays.size() == rate.size(),
                  "multipath_own_fraction: a rate and a relay flag per link, and the own link among them");
  if (own_late) return 0;
  auto known = [](double r) { return r > 0 && std::isfinite(r); };
  int n = 0, measured = 0;
  double sum = 0;
  for (size_t l = 0; l < rate.size(); ++l) {
    if (static_cast<int>(l) == own || !relays[l]) continue;
    ++n;
    if (known(rate[l])) {
      ++measured;
      sum += rate[l];
    }
  }
  if (n == 0 || !known(rate[own]) || measured == 0) return -1;
  const double relaying = sum / measured * n;
  const double even = 1.0 / (n + 1);
  return std::clamp(rate[own] / (rate[own] + relaying), even / 4, std::min(2 * even, 1.0));
}

MultipathChoice choose_multipath(const MultipathCase& k) {
  MultipathChoice c;
  if (!k.own_link)
    c.reason = "cuda:" + std::to_string(k.device) + " has no link in this engine";
  else if (!k.host_pinned)
    c.reason =
        "the host memory is pageable: the driver stages it through its own buffer, and a peer's copy engine "
        "cannot read it";
  else if (k.usable_relays <= 0)
    c.reason =
        "no peer GPU may relay (none reachable, none allowed, none with room for its staging buffers, or with "
        "relays='idle' another program runs on each)";
  else if (k.bytes < k.threshold_bytes)
    c.reason =
        std::to_string(k.bytes) + " bytes is below the multipath threshold of " + std::to_string(k.threshold_bytes);
  else if (k.capturing)
    c.reason =
        "the stream is capturing a CUDA graph: a graph cannot hold the engine's schedule, which follows the links "
        "as they drain";
  else
    c.multipath = true;
  return c;
}

std::string mem_kind_name(MemKind k, int device) {
  switch (k) {
    case MemKind::kPageable:
      return "pageable host memory";
    case MemKind::kPinnedHost:
      return "pinned host memory";
    case MemKind::kManaged:
      return "managed memory";
    default:
      return "GPU memory (cuda:" + std::to_string(device) + ")";
  }
}

std::string multipath_range_end(const char* what, MemKind first, int first_device, MemKind last, int last_device) {
  if (first == last && (first != MemKind::kDevice || first_device == last_device)) return "";
  return std::string(what) + " starts in " + mem_kind_name(first, first_device) + " and its last byte is in " +
         mem_kind_name(last, last_device);
}

std::string multipath_range_wraps(const char* what, const void* p, size_t bytes) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  if (bytes == 0 || bytes - 1 <= UINTPTR_MAX - at) return "";
  return std::string(what) + " plus " + std::to_string(bytes) + " bytes runs past the end of the address space";
}

MultipathRoute route_multipath(MemKind dst, int dst_device, MemKind src, int src_device) {
  MultipathRoute r;
  const auto name = mem_kind_name;
  if (dst == MemKind::kManaged || src == MemKind::kManaged) {
    r.error = std::string(dst == MemKind::kManaged ? "dst" : "src") +
              " is managed memory; multipath copies move between host memory and GPU memory allocated as such";
    return r;
  }
  const bool dst_dev = dst == MemKind::kDevice, src_dev = src == MemKind::kDevice;
  if (dst_dev == src_dev) {
    r.error = "dst is " + name(dst, dst_device) + " and src is " + name(src, src_device) +
              "; multipath copies move between host and GPU memory (one side each)";
    return r;
  }
  r.to_device = dst_dev;
  r.device = dst_dev ? dst_device : src_device;
  r.host_pinned = (dst_dev ? src : dst) == MemKind::kPinnedHost;
  return r;
}

int own_link(const std::vector<int>& link_devices, int device) {
  for (size_t i = 0; i < link_devices.size(); ++i)
    if (link_devices[i] == device) return static_cast<int>(i);
  return -1;
}

namespace {
int checked_links(int links) {
  FERRY_ARG_CHECK(links >= 1, "links must be at least 1");
  return links;
}
}  // namespace

MultipathScheduler::MultipathScheduler(int links, MultipathPolicy policy)
    : policy_(std::move(policy)),
      est_(checked_links(links)),
      waiting_bytes_(links * kLanes, 0),
      waiting_(links * kLanes),
      flight_(links),
      seen_(links, std::vector<double>(kLanes, -std::numeric_limits<double>::infinity())),
      used_(links, std::vector<double>(kLanes, -std::numeric_limits<double>::infinity())),
      probing_(links, std::vector<bool>(kLanes, false)),
      probe_sent_(links, std::vector<double>(kLanes, 0.0)),
      late_(links, std::vector<bool>(kLanes, false)),
      resort_(links, std::vector<bool>(kLanes, false)),
      reserved_(links, std::vector<bool>(kLanes, false)),
      others_(links, false),
      expected_(links * kLanes, -std::numeric_limits<double>::infinity()) {
  FERRY_ARG_CHECK(links >= 1, "links must be at least 1");
  FERRY_ARG_CHECK(policy_.outstanding >= 1, "outstanding must be at least 1");
  FERRY_ARG_CHECK(policy_.keep_warm_s >= 0, "keep_warm_s must be at least 0");
  FERRY_ARG_CHECK(policy_.may_relay.empty() || static_cast<int>(policy_.may_relay.size()) == links,
                  "may_relay must name every link or none");
}

int MultipathScheduler::add(int target, const std::vector<Chunk>& chunks, int lane,
                            std::optional<bool> own_share_on_stream, bool head_pending) {
  FERRY_ARG_CHECK(target >= 0 && target < links(),
                  "target is " + std::to_string(target) + "; expected a GPU 0.." + std::to_string(links() - 1));
  FERRY_ARG_CHECK(lane >= 0 && lane < kLanes, "lane is " + std::to_string(lane) + "; expected 0 or 1");
  int id = static_cast<int>(target_of_.size());
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    target_of_.emplace_back();
    lane_of_.emplace_back();
    own_on_stream_.emplace_back();
    head_pending_.emplace_back();
    remaining_.emplace_back();
    chunk_max_.emplace_back();
  }
  target_of_[id] = target;
  lane_of_[id] = lane;
  own_on_stream_[id] = own_share_on_stream.value_or(policy_.own_share_on_stream);
  head_pending_[id] = head_pending;
  remaining_[id] = chunks.size();
  size_t largest = 0;
  for (const Chunk& c : chunks) largest = std::max(largest, c.bytes);
  chunk_max_[id] = largest;
  const int q = queue_of(target, lane);
  expected_[q] = -std::numeric_limits<double>::infinity();
  for (const Chunk& c : chunks) {
    waiting_[q].push_back(Queued{id, c});
    waiting_bytes_[q] += c.bytes;
  }
  return id;
}

void MultipathScheduler::observe(int link, size_t bytes, double seconds, double now) {
  if (bytes == 0 || !(seconds > 0)) return;
  Estimate& e = est_.at(link);
  constexpr double kKeep = 0.5;  // each older sample counts half as much as the next
  if (e.bytes <= 0 || now - e.at > kEstimateStaleS) {
    e.seconds = seconds;
    e.bytes = static_cast<double>(bytes);
  } else {
    e.seconds = kKeep * e.seconds + seconds;
    e.bytes = kKeep * e.bytes + static_cast<double>(bytes);
  }
  e.at = now;
}

size_t MultipathScheduler::flight_bytes(int link) const {
  size_t b = 0;
  for (const Assignment& a : flight_[link]) b += a.chunk.bytes;
  return b;
}

// Earliest finish: `link` takes a chunk of `bytes` of queue `q` only where
// it would land no later than the other links that would take from that
// queue next would finish it with the chunk: the queue's bytes and theirs in
// flight at their summed speed, and at least the time one of them needs for
// the chunk (so that of links all idle, the fastest always takes it). A link
// busy with another queue (its own GPU's, or a longer one) is no help. A
// stale estimate lets an idle link try.
bool MultipathScheduler::lands_in_time(int link, int q, size_t bytes, double now) const {
  // A link not measured yet counts as fast as the fastest one measured: were
  // it to count for nothing, the measured links would take every chunk and
  // it would never be measured.
  const double fastest = fastest_s_per_byte();
  const Estimate& e = est_[link];
  const double own = e.s_per_byte() > 0 ? e.s_per_byte() : fastest;
  if (!policy_.earliest_finish || !std::isfinite(own)) return true;
  if (flight_[link].empty() && now - e.at > kEstimateStaleS) return true;
  double rate = 0, backlog = static_cast<double>(waiting_bytes_[q]);
  double one = std::numeric_limits<double>::infinity();
  const int lane = q % kLanes;
  for (int j = 0; j < links(); ++j) {
    if (j == link) continue;
    // Another link counts where it would take from the queue now, or once
    // its probe in this lane lands, if that probe is young and the last one
    // was prompt: it starts kProbeS after the probe went out.
    double wait = 0;
    if (pick(j, now) != q) {
      const double age = now - probe_sent_[j][lane];
      if (!probing_[j][lane] || late_[j][lane] || age > kProbeYoungS || !would_serve(j, q)) continue;
      wait = std::max(0.0, kProbeS - age);
    }
    const double s = est_[j].s_per_byte() > 0 ? est_[j].s_per_byte() : fastest;
    const double flying = static_cast<double>(flight_bytes(j));
    rate += 1.0 / s;
    backlog += flying;
    one = std::min(one, wait + (flying + static_cast<double>(bytes)) * s);
  }
  if (rate <= 0) return true;  // no other link may carry it
  const double mine = static_cast<double>(flight_bytes(link) + bytes) * own;
  return mine <= std::max(backlog / rate, one);
}

double MultipathScheduler::fastest_s_per_byte(int except) const {
  double fastest = std::numeric_limits<double>::infinity();
  for (int j = 0; j < links(); ++j)
    if (j != except && est_[j].s_per_byte() > 0) fastest = std::min(fastest, est_[j].s_per_byte());
  return fastest;
}

bool MultipathScheduler::alone(int link, int q) const {
  const int target = q / kLanes, lane = q % kLanes;
  if (link != target) return false;
  for (int j = 0; j < links(); ++j)
    if (j != link && serves(j, target, lane)) return false;
  return true;
}

bool MultipathScheduler::clear(int link, int lane, double now) const {
  if (!policy_.probe) return true;
  if (resort_[link][lane]) return false;  // only a prompt probe clears a link taken as a last resort
  if (now - seen_[link][lane] <= kClearS) return true;
  for (const Assignment& a : flight_[link])
    if (lane_of_[a.transfer] == lane) return true;
  return false;
}

bool MultipathScheduler::carries_own(int link, int lane) const {
  const std::deque<Queued>& w = waiting_[queue_of(link, lane)];
  if (!(w.empty() ? policy_.own_share_on_stream : own_on_stream_[w.front().transfer])) return true;
  for (int j = 0; j < links(); ++j)
    if (j != link && may_relay(j)) return false;  // reservations do not hold such a transfer (serves())
  return true;
}

// `link` would take from queue `q` once clear: `q` is its own GPU's, or it
// relays and has no own work it serves first.
bool MultipathScheduler::would_serve(int link, int q) const {
  const int target = q / kLanes;
  if (link == target) return carries_own(link, q % kLanes);
  if (!serves(link, target, q % kLanes)) return false;
  if (!policy_.own_link_first) return true;
  for (int lane = 0; lane < kLanes; ++lane)
    if (!waiting_[queue_of(link, lane)].empty() && carries_own(link, lane)) return false;
  return true;
}

// `link`'s last probe in the queue's lane came back late (or it already
// carries as a last resort), and no other link that would serve the queue may
// do better: then waiting behind the copies queued there is the best there is
// (the copy would otherwise never go).
bool MultipathScheduler::last_resort(int link, int q, double now) const {
  const int lane = q % kLanes;
  // A link already carrying as a last resort goes on while its next probe is out.
  const bool held = resort_[link][lane] || (late_[link][lane] && !probing_[link][lane]);
  return held && !others_may_do_better(link, q, now);
}

// Another link that would serve the queue is not known to be held: clear by
// a prompt probe, not yet probed (its turn comes in the same round), or with
// a probe out that may yet be prompt.
bool MultipathScheduler::others_may_do_better(int link, int q, double now) const {
  const int lane = q % kLanes;
  for (int j = 0; j < links(); ++j) {
    if (j == link || !would_serve(j, q) || late_[j][lane]) continue;
    if (!probing_[j][lane] || clear(j, lane, now)) return true;
  }
  return others_probe_young(link, q, now);
}

// Another link that would serve the queue has a probe out that may yet be
// prompt (out for less than twice kPromptS; older, it most likely comes back
// late; if not, that link takes over once it lands).
bool MultipathScheduler::others_probe_young(int link, int q, double now) const {
  const int lane = q % kLanes;
  for (int j = 0; j < links(); ++j)
    if (j != link && would_serve(j, q) && probing_[j][lane] && now - probe_sent_[j][lane] <= 2 * kPromptS) return true;
  return false;
}

bool MultipathScheduler::usable(int link, int q, double now) const {
  return !waiting_[q].empty() && (clear(link, q % kLanes, now) || last_resort(link, q, now));
}

int MultipathScheduler::pick(int link, double now) const {
  int from = -1;
  const bool relaying = may_relay(link);  // serves() says for which queues
  auto longer = [&](int q) {
    return from < 0 ||
           (policy_.pick == MultipathPolicy::Pick::kLongestQueue && waiting_[q].size() > waiting_[from].size());
  };
  if (policy_.own_link_first ||
      !relaying)  // its own GPU's transfers first (a link that may not relay carries only those)
    for (int lane = 0; lane < kLanes; ++lane)
      if (const int q = queue_of(link, lane); carries_own(link, lane) && usable(link, q, now) && longer(q)) from = q;
  if (from < 0 && relaying) {
    // A relay: from the longest queue (fewest chunks left over for the other
    // links to relay), or the first in order.
    for (int q = 0; q < static_cast<int>(waiting_.size()); ++q) {
      if (!serves(link, q / kLanes, q % kLanes) || !usable(link, q, now)) continue;
      if (longer(q)) from = q;
      if (policy_.pick == MultipathPolicy::Pick::kInOrder) break;
    }
  }
  return from;
}

bool MultipathScheduler::next(int link, Assignment* out, double now) {
  if (static_cast<int>(flight_.at(link).size()) >= policy_.outstanding) return false;
  const int from = pick(link, now);
  if (from < 0) return false;
  const size_t bytes = take_bytes(link, from, now);
  if (!lands_in_time(link, from, bytes, now)) return false;
  if (!clear(link, from % kLanes, now)) resort_[link][from % kLanes] = true;  // taken as a last resort
  Queued& front = waiting_[from].front();
  Queued q = front;
  if (bytes < front.chunk.bytes) {  // the chunk's start; its rest stays first in the queue
    q.chunk.bytes = bytes;
    front.chunk.offset += bytes;
    front.chunk.bytes -= bytes;
    ++remaining_[q.transfer];
  } else {
    waiting_[from].pop_front();
    // Alone on its own GPU's queue: the next chunks of the same copy go with it.
    while (alone(link, from) && !waiting_[from].empty()) {
      const Queued& n = waiting_[from].front();
      if (n.transfer != q.transfer || n.chunk.piece != q.chunk.piece ||
          n.chunk.offset != q.chunk.offset + q.chunk.bytes || q.chunk.bytes + n.chunk.bytes > kMultipathAloneChunk)
        break;
      q.chunk.bytes += n.chunk.bytes;
      waiting_bytes_[from] -= n.chunk.bytes;
      --remaining_[q.transfer];
      waiting_[from].pop_front();
    }
  }
  waiting_bytes_[from] -= bytes;
  Assignment a;
  a.transfer = q.transfer;
  a.chunk = q.chunk;
  a.target = target_of_[q.transfer];
  a.link = link;
  flight_[link].push_back(a);
  *out = a;
  return true;
}

size_t MultipathScheduler::take_bytes(int link, int q, double now) const {
  const Queued& front = waiting_[q].front();
  // A relay takes no more than a chunk as added (its staging buffers' size),
  // even of one its own link took larger and gave back.
  const size_t whole = link == q / kLanes ? front.chunk.bytes : std::min(front.chunk.bytes, chunk_max_[front.transfer]);
  const size_t tail = policy_.tail_chunk;
  if (tail == 0 || whole < 2 * tail || !clear(link, q % kLanes, now) || alone(link, q)) return whole;
  return waiting_bytes_[q] <= static_cast<size_t>(links()) * whole ? tail : whole;
}

void MultipathScheduler::complete(int link, double now) {
  FERRY_ARG_CHECK(!flight_.at(link).empty(), "complete: link " + std::to_string(link) + " has nothing in flight");
  const int transfer = flight_[link].front().transfer;
  --remaining_[transfer];
  double& seen = seen_[link][lane_of_[transfer]];
  seen = std::max(seen, now);
  double& used = used_[link][lane_of_[transfer]];
  used = std::max(used, now);
  flight_[link].pop_front();
}

int MultipathScheduler::start_probe(int link, double now) {
  if (!policy_.probe) return -1;
  const bool full = static_cast<int>(flight_.at(link).size()) >= policy_.outstanding;
  // One probe per lane serves every queue of that direction the link may take.
  for (int lane = 0; lane < kLanes; ++lane) {
    if (!probing_[link][lane] && now >= warm_at(link, lane)) {
      probing_[link][lane] = true;
      probe_sent_[link][lane] = now;
      return lane;
    }
    if (clear(link, lane, now) || probing_[link][lane]) continue;
    bool wanted = false, resort = resort_[link][lane], wait = false;
    for (int t = 0; t < links(); ++t) {
      const int q = queue_of(t, lane);
      // A link also probes while its GPU's copy has the own share on the
      // caller's stream, once that share landed (a probe behind it would only
      // time it): the next copy's share follows what the probe finds.
      if (t == link && !waiting_[q].empty() && !carries_own(link, lane) && !head_pending_[waiting_[q].front().transfer])
        wanted = true;
      if (waiting_[q].empty()) {
        // A copy on its way there: the links that would carry it probe now,
        // but not behind their own GPU's share on a caller's stream (the
        // probe would only time that share, and come back late).
        const std::deque<Queued>& own = waiting_[queue_of(link, lane)];
        const bool behind_head = !own.empty() && head_pending_[own.front().transfer];
        if (now <= expected_[q] && serves(link, t, lane) && !behind_head) wanted = true;
        continue;
      }
      if (!serves(link, t, lane)) continue;
      wanted = true;
      resort = resort || last_resort(link, q, now);
      wait = wait || (late_[link][lane] && others_probe_young(link, q, now));
    }
    if (!wanted) continue;
    if (resort) {
      // Held, and carrying what no other link will: it probes again now and
      // then, to see whether the copies queued there are gone. A link that
      // only became the last resort takes a chunk first: with a probe out it
      // would take none, and the links waiting for that probe none either.
      if (!resort_[link][lane] || now - probe_sent_[link][lane] < kClearS) continue;
    } else if (full || wait) {
      // Nothing to take now, or late while another link's probe may yet be
      // prompt: wait for it rather than probe again.
      continue;
    }
    probing_[link][lane] = true;
    probe_sent_[link][lane] = now;
    return lane;
  }
  return -1;
}

double MultipathScheduler::share_rate(int link, double now) const {
  const Estimate& e = est_.at(link);
  const double s_per_byte = e.s_per_byte();
  return s_per_byte > 0 && now - e.at <= kShareRateFreshS ? 1 / s_per_byte : 0;
}

bool MultipathScheduler::share_late(int link, int lane, double now) const {
  return late(link, lane) || (probing(link, lane) && now - probe_sent(link, lane) > kPromptS);
}

void MultipathScheduler::probe_landed(int link, int lane, double now, double waited_s) {
  FERRY_ARG_CHECK(link >= 0 && link < links() && lane >= 0 && lane < kLanes && probing_[link][lane],
                  "probe_landed: no probe out on that link and lane");
  probing_[link][lane] = false;
  // A late probe waited behind foreign copies: the next chunk may wait behind
  // more of them, so the lane stays unclear and start_probe() sends another
  // (unless no other link can take the copy: last_resort()).
  late_[link][lane] = waited_s > kPromptS;
  // A late probe holds its lane from now, though its last chunk or probe
  // landed within kClearS (as a lane kept warm's may have).
  if (late_[link][lane]) seen_[link][lane] = -std::numeric_limits<double>::infinity();
  if (!late_[link][lane]) {
    seen_[link][lane] = std::max(seen_[link][lane], now);
    resort_[link][lane] = false;
    // Nothing is queued there: an estimate kForgetSlower times the fastest
    // other link's may have come from a queue, or a first copy's cost, that
    // is gone, and would keep the link out of copies until it aged out. It
    // counts as aged out now: the idle link takes a chunk, whose time starts
    // the estimate afresh (a link that is that slow stays measured so).
    if (est_[link].s_per_byte() > kForgetSlower * fastest_s_per_byte(link))
      est_[link].at = -std::numeric_limits<double>::infinity();
  }
}

void MultipathScheduler::expect(int target, int lane, double now) {
  FERRY_ARG_CHECK(target >= 0 && target < links() && lane >= 0 && lane < kLanes,
                  "expect: target " + std::to_string(target) + " or lane " + std::to_string(lane) + " out of range");
  expected_[queue_of(target, lane)] = now + kClearS;
}

bool MultipathScheduler::probe_failed(int link, int lane) {
  FERRY_ARG_CHECK(link >= 0 && link < links() && lane >= 0 && lane < kLanes && probing_[link][lane],
                  "probe_failed: no probe out on that link and lane");
  probing_[link][lane] = false;
  for (int own = 0; own < kLanes; ++own) {
    const int q = queue_of(link, own);
    const bool coming = expected_[q] > -std::numeric_limits<double>::infinity();  // expect(), not yet added
    // Its own GPU's copy, even one whose share the caller's stream copies:
    // that share crosses the same link.
    if (!waiting_[q].empty() || (coming && carries_own(link, own))) return true;
  }
  stop_relaying(link);
  return false;
}

double MultipathScheduler::warm_at(int link, int lane) const {
  constexpr double kNever = std::numeric_limits<double>::infinity();
  if (!policy_.probe || policy_.keep_warm_s <= 0 || reserved_[link][lane]) return kNever;
  // Only while idle in the lane: a probe behind chunks would time them, and
  // a copy's own waiting chunks are probed for as they are.
  for (const Assignment& a : flight_[link])
    if (lane_of_[a.transfer] == lane) return kNever;
  for (int t = 0; t < links(); ++t)
    if (!waiting_[queue_of(t, lane)].empty()) return kNever;
  // Nor behind its own GPU's share on a caller's stream, which it would time.
  for (size_t id = 0; id < head_pending_.size(); ++id)
    if (head_pending_[id] && target_of_[id] == link && lane_of_[id] == lane) return kNever;
  const double at = std::max(seen_[link][lane], probe_sent_[link][lane]) + kRenewS;
  return at - used_[link][lane] <= policy_.keep_warm_s ? at : kNever;
}

double MultipathScheduler::warm_due() const {
  double due = std::numeric_limits<double>::infinity();
  for (int l = 0; l < links(); ++l)
    for (int lane = 0; lane < kLanes; ++lane)
      if (!probing_[l][lane]) due = std::min(due, warm_at(l, lane));
  return due;
}

bool MultipathScheduler::any_probing() const {
  for (const auto& lanes : probing_)
    for (bool p : lanes)
      if (p) return true;
  return false;
}

void MultipathScheduler::finish(int transfer) {
  FERRY_ARG_CHECK(transfer >= 0 && transfer < static_cast<int>(remaining_.size()) && remaining_[transfer] == 0,
                  "finish: transfer " + std::to_string(transfer) + " is not done");
  // Twice would hand its id to two later add() calls, the second overwriting the first's state.
  FERRY_ARG_CHECK(std::find(free_ids_.begin(), free_ids_.end(), transfer) == free_ids_.end(),
                  "finish: transfer " + std::to_string(transfer) + " was finished already");
  head_pending_[transfer] = false;
  free_ids_.push_back(transfer);
}

void MultipathScheduler::forget_transfers() {
  FERRY_ARG_CHECK(idle(), "forget_transfers: chunks are still waiting or in flight");
  free_ids_.clear();
  target_of_.clear();
  lane_of_.clear();
  own_on_stream_.clear();
  head_pending_.clear();
  remaining_.clear();
  chunk_max_.clear();
}

void MultipathScheduler::give_back(int link) {
  FERRY_ARG_CHECK(!flight_.at(link).empty(), "give_back: link " + std::to_string(link) + " has nothing in flight");
  const Assignment a = flight_[link].back();
  flight_[link].pop_back();
  const int q = queue_of(a.target, lane_of_[a.transfer]);
  waiting_[q].push_front(Queued{a.transfer, a.chunk});
  waiting_bytes_[q] += a.chunk.bytes;
  stop_relaying(link);
}

void MultipathScheduler::stop_relaying(int link) {
  if (policy_.may_relay.empty()) policy_.may_relay.assign(links(), true);
  policy_.may_relay.at(link) = false;
}

bool MultipathScheduler::idle() const {
  for (const auto& f : flight_)
    if (!f.empty()) return false;
  for (const auto& w : waiting_)
    if (!w.empty()) return false;
  return true;
}

namespace {

// When `bytes` starting at `start` have crossed the link, its foreign copy considered.
double serve_until(const LinkModel& m, double start, double bytes) {
  if (m.busy_wait_s > 0 && start >= m.busy_from && start < m.busy_until) start += m.busy_wait_s;
  double t = start, left = bytes;
  const bool busy = m.busy_share > 0 && m.busy_until > m.busy_from;
  if (busy && t < m.busy_until) {
    if (t < m.busy_from) {
      const double room = m.bytes_per_s * (m.busy_from - t);
      if (left <= room) return t + left / m.bytes_per_s;
      left -= room;
      t = m.busy_from;
    }
    const double rate = m.bytes_per_s * (1.0 - std::min(m.busy_share, 1.0));
    const double room = rate * (m.busy_until - t);
    if (rate > 0 && left <= room) return t + left / rate;
    left -= std::max(room, 0.0);
    t = m.busy_until;
  }
  return t + left / m.bytes_per_s;
}

// Bytes the link can move in [0, t).
double capacity_until(const LinkModel& m, double t) {
  double bytes = m.bytes_per_s * t;
  if (m.busy_share > 0 && m.busy_until > m.busy_from && t > m.busy_from)
    bytes -= m.bytes_per_s * std::min(m.busy_share, 1.0) * (std::min(t, m.busy_until) - m.busy_from);
  return bytes;
}

}  // namespace

std::set<BoardKey> board_posts(const std::set<BoardKey>& under_way, std::map<BoardKey, double>* ended, double now) {
  std::set<BoardKey> out = under_way;
  for (auto it = ended->begin(); it != ended->end();) {
    if (now - it->second >= kMultipathBoardGapS) {
      it = ended->erase(it);
      continue;
    }
    out.insert(it->first);
    ++it;
  }
  return out;
}

std::vector<bool> board_reservations(const std::vector<bool>& posted, const std::vector<bool>& targets,
                                     const std::vector<bool>& on_board) {
  FERRY_ARG_CHECK(posted.size() == targets.size() && posted.size() == on_board.size(),
                  "board_reservations: expected one entry per link in each list");
  bool any = false, all = true;
  for (size_t l = 0; l < posted.size(); ++l) {
    if (!on_board[l] || targets[l]) continue;  // not a relay this can keep off
    any = true;
    all = all && posted[l];
  }
  std::vector<bool> out(posted.size(), false);
  if (any && all)
    for (size_t l = 0; l < posted.size(); ++l) out[l] = on_board[l] && !targets[l];
  return out;
}

std::vector<SimResult> simulate_processes(const std::vector<LinkModel>& links,
                                          const std::vector<std::vector<SimTransfer>>& processes, size_t chunk_bytes,
                                          const MultipathPolicy& policy, double relay_seconds_per_byte, bool in_order) {
  const int n = static_cast<int>(links.size());
  const size_t procs = processes.size();
  std::vector<MultipathScheduler> sched(procs, MultipathScheduler(n, policy));
  std::vector<SimResult> r(procs);
  std::vector<size_t> added(procs, 0);  // transfers given to the scheduler so far, by process
  for (size_t p = 0; p < procs; ++p) {
    r[p].bytes_by_link.assign(n, 0);
    r[p].finish_by_transfer.assign(processes[p].size(), 0.0);
    for (const auto& t : processes[p]) {
      sched[p].add(t.target, split_chunks(t.bytes, chunk_bytes));
      if (++added[p]; in_order) break;
    }
  }
  // Per link: the chunks every process gave it, in the order given (the
  // link's FIFO), and when its current head lands.
  struct Held {
    size_t process;
    Assignment a;
    double given;  // when the scheduler gave it
  };
  const double never = std::numeric_limits<double>::infinity();
  std::vector<std::deque<Held>> queue(n);
  std::vector<double> head_done(n, never), free_at(n, 0.0);
  // A probe: kMultipathProbeBytes on the link, landing after the chunks
  // already on it (every process's) and the foreign copy's wait, by process,
  // link and lane.
  constexpr double kProbeLatencyS = 5e-6;
  std::vector<std::vector<std::vector<double>>> probe_done(
      procs, std::vector<std::vector<double>>(n, std::vector<double>(MultipathScheduler::kLanes, never)));
  auto start_head = [&](int l, double now) {
    if (!queue[l].empty() && head_done[l] == never)
      head_done[l] =
          serve_until(links[l], std::max(now, free_at[l]), static_cast<double>(queue[l].front().a.chunk.bytes));
  };
  // The link board (MultipathPolicy::board): process p sees a link posted
  // while another process copies to or from its GPU, and reserves as
  // board_reservations says. A process's next copy follows its last at once
  // here, so the engine's posts over the gap between copies (board_posts)
  // change nothing and are not modelled.
  auto read_board = [&](size_t p) {
    if (!policy.board || procs < 2) return;
    std::vector<bool> posted(n, false), targets(n, false);
    for (size_t q = 0; q < procs; ++q)
      for (size_t k = 0; k < added[q]; ++k)
        if (!sched[q].done(static_cast<int>(k))) (q == p ? targets : posted)[processes[q][k].target] = true;
    const auto reserve = board_reservations(posted, targets, std::vector<bool>(n, true));
    for (int l = 0; l < n; ++l) sched[p].reserve(l, 0, reserve[l]);
  };
  // As the engine feeds the links: every link probes where it should, then
  // every link takes chunks, starting from link `first`.
  auto refill = [&](size_t p, int first, double now) {
    read_board(p);
    for (int i = 0; i < n; ++i) {
      const int l = (first + i) % n;
      for (int lane; (lane = sched[p].start_probe(l, now)) >= 0;) {
        double t = std::max(now, free_at[l]);
        for (size_t k = 0; k < queue[l].size(); ++k)
          t = k == 0 && head_done[l] != never
                  ? head_done[l]
                  : serve_until(links[l], t, static_cast<double>(queue[l][k].a.chunk.bytes));
        probe_done[p][l][lane] = serve_until(links[l], t, static_cast<double>(kMultipathProbeBytes)) + kProbeLatencyS;
      }
    }
    for (int i = 0; i < n; ++i) {
      const int l = (first + i) % n;
      Assignment a;
      while (sched[p].next(l, &a, now)) queue[l].push_back(Held{p, a, now});
      start_head(l, now);
    }
  };
  for (size_t p = 0; p < procs; ++p) refill(p, 0, 0.0);
  for (;;) {
    int l = -1;
    for (int i = 0; i < n; ++i)
      if (!queue[i].empty() && (l < 0 || head_done[i] < head_done[l])) l = i;
    // A probe that lands before the next chunk: its link may take chunks.
    size_t pp = 0;
    int pl = -1, plane = -1;
    for (size_t p = 0; p < procs; ++p)
      for (int i = 0; i < n; ++i)
        for (int k = 0; k < MultipathScheduler::kLanes; ++k)
          if (probe_done[p][i][k] < (pl < 0 ? never : probe_done[pp][pl][plane])) pp = p, pl = i, plane = k;
    if (pl >= 0 && (l < 0 || probe_done[pp][pl][plane] < head_done[l])) {
      const double now = probe_done[pp][pl][plane];
      probe_done[pp][pl][plane] = never;
      sched[pp].probe_landed(pl, plane, now, now - sched[pp].probe_sent(pl, plane));
      refill(pp, pl, now);
      continue;
    }
    if (l < 0) break;
    const double now = head_done[l];
    const Held h = queue[l].front();
    queue[l].pop_front();
    sched[h.process].complete(l, now);
    sched[h.process].observe(l, h.a.chunk.bytes, now - std::max(h.given, free_at[l]), now);
    SimResult& res = r[h.process];
    res.bytes_by_link[l] += h.a.chunk.bytes;
    double landed = now;
    if (h.a.relay()) {
      res.relayed_bytes += h.a.chunk.bytes;
      landed += relay_seconds_per_byte * static_cast<double>(h.a.chunk.bytes);
    }
    res.finish_by_transfer[h.a.transfer] = std::max(res.finish_by_transfer[h.a.transfer], landed);
    res.seconds = std::max(res.seconds, landed);
    free_at[l] = now;
    head_done[l] = never;
    double at = now;
    const auto& mine = processes[h.process];
    if (in_order && sched[h.process].done(h.a.transfer) && added[h.process] < mine.size()) {
      // The stream gets to the next copy once this one landed.
      at = res.finish_by_transfer[h.a.transfer];
      const SimTransfer& t = mine[added[h.process]++];
      sched[h.process].add(t.target, split_chunks(t.bytes, chunk_bytes));
    }
    // Every link: one that declined a chunk may take it now.
    refill(h.process, l, at);
    start_head(l, now);
  }
  return r;
}

SimResult simulate(const std::vector<LinkModel>& links, const std::vector<SimTransfer>& transfers, size_t chunk_bytes,
                   const MultipathPolicy& policy, double relay_seconds_per_byte, bool in_order) {
  return simulate_processes(links, {transfers}, chunk_bytes, policy, relay_seconds_per_byte, in_order)[0];
}

SimResult simulate_static(const std::vector<LinkModel>& links, const SimTransfer& transfer, size_t chunk_bytes,
                          const std::vector<int>& ratio) {
  FERRY_ARG_CHECK(ratio.size() == links.size(), "ratio must give one weight per link");
  std::vector<int> order;
  for (size_t l = 0; l < ratio.size(); ++l) order.insert(order.end(), std::max(ratio[l], 0), static_cast<int>(l));
  FERRY_ARG_CHECK(!order.empty(), "ratio gives no link any chunk");
  SimResult r;
  r.bytes_by_link.assign(links.size(), 0);
  r.finish_by_transfer.assign(1, 0.0);
  std::vector<double> t(links.size(), 0.0);
  const auto chunks = split_chunks(transfer.bytes, chunk_bytes);
  for (size_t i = 0; i < chunks.size(); ++i) {
    const int l = order[i % order.size()];
    t[l] = serve_until(links[l], t[l], static_cast<double>(chunks[i].bytes));
    r.bytes_by_link[l] += chunks[i].bytes;
    if (l != transfer.target) r.relayed_bytes += chunks[i].bytes;
  }
  r.seconds = *std::max_element(t.begin(), t.end());
  r.finish_by_transfer[0] = r.seconds;
  return r;
}

namespace {

// `seconds` as whole microseconds, rounded up, at most `cap` (infinity included).
long micros_up_to(double seconds, long cap) {
  return seconds < static_cast<double>(cap) * 1e-6 ? static_cast<long>(std::ceil(seconds * 1e6)) : cap;
}

}  // namespace

long multipath_pending_wait_us(bool busy, double warm_in_s) {
  constexpr long kBusyUs = 5, kHeldUs = 200;
  return busy ? kBusyUs : std::max(kBusyUs, micros_up_to(warm_in_s, kHeldUs));
}

long multipath_idle_wait_us(long idle_us, double warm_in_s) { return std::max(0L, micros_up_to(warm_in_s, idle_us)); }

double ideal_seconds(const std::vector<LinkModel>& links, size_t bytes) {
  double lo = 0, hi = 1;
  auto total = [&](double t) {
    double b = 0;
    for (const auto& m : links) b += capacity_until(m, t);
    return b;
  };
  while (total(hi) < static_cast<double>(bytes)) hi *= 2;
  for (int i = 0; i < 100; ++i) {
    const double mid = (lo + hi) / 2;
    (total(mid) < static_cast<double>(bytes) ? lo : hi) = mid;
  }
  return hi;
}

}  // namespace xfer
}  // namespace ferry
