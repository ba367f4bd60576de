// The decisions of multipath host<->GPU transfers, as pure code the CPU tests
// run: whether a copy goes multipath at all, how it splits into chunks, and
// which link carries each chunk next. The engine that moves bytes drives the
// same scheduler with completions from the GPU; `simulate` drives it with a
// model of links, so that the balance can be checked without a GPU.
//
// Every host link (a GPU's PCIe link) has an outstanding queue of a few
// chunks; a link whose queue has room takes the next chunk, from its own GPU's
// transfers first and otherwise as a relay through its GPU for another
// target. A congested link drains its queue more slowly and so takes fewer
// chunks: the queues' back-pressure is the signal. Back-pressure alone fails
// where a copy engine serves a foreign copy's long commands first (FIFO): one
// chunk there waits milliseconds, and the whole transfer with it. So the
// scheduler also keeps each link's measured time per byte, and a link takes
// a chunk only where it would land no later than the other links would
// finish the rest of that transfer with it (earliest finish); an estimate
// older than kEstimateStaleS lets an idle link try again.
//
// Earliest finish still lets the first chunk onto a held link, and a copy is
// only as early as its last chunk. A GPU's copy engine serves its host-to-GPU
// copies first in, first out across every stream (priority and hardware
// queues make no difference), and its GPU-to-host copies the same, beside
// them: a chunk waits behind every foreign copy queued on its direction
// before it. So a link that has been idle in a direction (a lane) for
// kClearS first sends a probe (kMultipathProbeBytes, not part of any copy) there, and
// takes chunks in that lane only once a probe landed within kPromptS; a late
// one (foreign copies were queued) is followed by another, and the copy goes
// over the other links meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "xfer/pointer_kind.hpp"

namespace ferry {
namespace xfer {

// A probe's size. Host-to-GPU copies of 4 KiB and less skip the copy
// engine's queue (the driver writes their bytes into the command stream), so
// a probe that small would land at once behind any queue; from 64 KiB they
// wait in it, as do GPU-to-host copies of every size (measured on H200).
constexpr size_t kMultipathProbeBytes = size_t{64} << 10;

struct Chunk {
  size_t offset = 0;  // in the transfer
  size_t bytes = 0;
  size_t piece = 0;  // the batch's copy it lies in (split_batch)
};

// The most a link takes at once of its own GPU's copy where no other link
// may carry any of it (every relay reserved by the link board, say): then
// chunks only cost, since each copy costs its copy engine a few microseconds
// (a 2 MiB chunk took 43-45 us on two H200s where the link's speed gives 39),
// and the tail needs no finer chunks to finish with other links.
constexpr size_t kMultipathAloneChunk = size_t{64} << 20;

// `bytes` as chunks of `chunk_bytes` (the last one shorter), in order.
std::vector<Chunk> split_chunks(size_t bytes, size_t chunk_bytes);

// The copies of a batch laid end to end (copy i starts at the sum of the
// sizes before it) as chunks of at most `chunk_bytes` that never cross the
// end of a copy, in order, each naming its copy. Zero sizes give no chunk.
std::vector<Chunk> split_batch(const std::vector<size_t>& sizes, size_t chunk_bytes);

// The chunk size of one copy: small enough that every link's outstanding
// queue gets a chunk (a copy of a few chunks would otherwise fill the target's
// own link alone), at least `min_chunk` (each chunk costs a few microseconds
// of events and waits) in 64 KiB steps, at most `max_chunk` (the staging
// buffers' size).
constexpr size_t kMultipathMinChunk = size_t{2} << 20;
size_t multipath_chunk_bytes(size_t bytes, int links, int outstanding, size_t max_chunk,
                             size_t min_chunk = kMultipathMinChunk);

// The head of a copy that the caller's own stream moves itself over the
// target's link, at once, while the engine's thread starts the rest: at most
// `head_bytes` (0: none) and at most the target link's even share, in steps
// of 64 KiB.
size_t multipath_head_bytes(size_t bytes, int links, size_t head_bytes);

// How a copy of `bytes` over the target's link and `relays` relays splits:
// the head the caller's stream copies (only where that stream is the
// target's, `stream_on_target`; at most `first_piece`, the batch's first
// copy), and how many links share the rest. With own_share_on_stream and the
// stream on the target the head is the target link's share (`own_fraction`
// of the copy, or an even share) and the relays alone share the rest; with
// the stream on another GPU there is no head and the target's link shares
// the rest as usual.
struct MultipathSplit {
  size_t head = 0;
  int rest_links = 1;
  bool own_share_on_stream = false;  // this copy's own share is on the caller's stream
};
// `own_fraction`: the part of the copy the own share is (multipath_own_fraction;
// negative: an even share).
MultipathSplit multipath_split(size_t bytes, int relays, size_t head_bytes, bool own_share_on_stream,
                               size_t first_piece, bool stream_on_target, double own_fraction = -1);

// The part of a copy the caller's stream takes over the target's link where
// the own share is on the stream. None while that link's last probe came back
// late: the share would wait behind every copy queued there first, and the
// relays carry the whole copy. Otherwise the own link's measured speed
// against all the links' (`rate` in bytes/s by link, 0 or not finite: not measured; a relay
// not yet measured counts as the measured relays' mean), kept between a
// quarter of and twice the even share; an even share (-1) where the own link,
// or every relay, is unmeasured, or no link relays.
double multipath_own_fraction(const std::vector<double>& rate, const std::vector<bool>& relays, int own, bool own_late);

// Whether a copy goes multipath, and why not where it does not.
struct MultipathChoice {
  bool multipath = false;
  std::string reason;  // for the debug log: why the plain copy runs
};
// What decides it, gathered by the engine.
struct MultipathCase {
  size_t bytes = 0;
  bool host_pinned = false;
  int usable_relays = 0;  // links other than the copy's GPU's own that may relay
  size_t threshold_bytes = 0;
  int device = -1;         // the copy's GPU
  bool own_link = true;    // the copy's GPU has a link in the engine
  bool capturing = false;  // the stream captures a CUDA graph
};
MultipathChoice choose_multipath(const MultipathCase& c);

// "GPU memory (cuda:1)", "pinned host memory", ...
std::string mem_kind_name(MemKind k, int device);
// Empty where the first and the last byte of a range named `what` lie in
// the same kind of memory (and GPU); else what differs: such a range is
// refused (CUDA refuses a copy of it too, with cudaErrorInvalidValue).
std::string multipath_range_end(const char* what, MemKind first, int first_device, MemKind last, int last_device);
// Empty where `bytes` (> 0) from `p` end within the address space; else why
// the range named `what` is refused (its last byte would wrap to a low
// address, where the checks of its ends and of overlap would look at memory
// the copy never meant).
std::string multipath_range_wraps(const char* what, const void* p, size_t bytes);

// A copy's direction and its GPU, or why it cannot be a host<->GPU copy.
struct MultipathRoute {
  std::string error;  // empty where the copy is host<->GPU
  bool to_device = false;
  int device = -1;  // the GPU whose memory is the device side
  bool host_pinned = false;
};
MultipathRoute route_multipath(MemKind dst, int dst_device, MemKind src, int src_device);

// The link of `device` (its own host link) among the engine's links: the
// first listed on it, or -1. A device listed again (testing on one GPU) is a
// relay through the same GPU.
int own_link(const std::vector<int>& link_devices, int device);

// How long a post on the link board (MultipathPolicy::board) lasts unless
// renewed. An engine renews its posts every 20 us while its copies run and
// withdraws them once they ended (board_posts); the hold only covers an
// engine thread held up (in a CUDA call, on a busy CPU) and bounds what a
// program that died leaves behind.
constexpr double kMultipathBoardHoldS = 50e-3;

// A GPU and direction on the link board: (the link of the GPU, lane).
using BoardKey = std::pair<int, int>;
// What an engine posts on the link board at `now`: each GPU and direction of
// its copies under way, and of those that ended within kMultipathBoardGapS
// (`ended`: when each last ended; older entries are dropped). A program's
// next copy follows its last within tens of microseconds: withdrawn at once,
// the post would let another program's relay chunks onto the link in that
// gap, where the next copy's own chunks then queue behind them (on two H200s
// one program of two moved 58 GB/s and the other 48).
constexpr double kMultipathBoardGapS = 2e-3;
std::set<BoardKey> board_posts(const std::set<BoardKey>& under_way, std::map<BoardKey, double>* ended, double now);

// Which links to reserve (MultipathScheduler::reserve) in a lane, from the
// link board: `posted` (another program copies to or from the link's GPU
// that way), `targets` (this engine's own copies are into or out of that
// link's GPU), `on_board` (the link may relay and has a GPU on the board; a
// loopback relay has none). Every posted link, where every link that could relay for this
// engine is posted: every GPU's program then copies its own data, and
// relaying would only move one program's share onto another's link. None
// otherwise: with a link to spare, the engines share all of them (on four
// H200s two programs moved more, and more evenly, over all four links than
// over the two no one posted).
std::vector<bool> board_reservations(const std::vector<bool>& posted, const std::vector<bool>& targets,
                                     const std::vector<bool>& on_board);

// Which links may carry relays, and how a link picks among waiting targets.
struct MultipathPolicy {
  // Chunks in flight per link. On four H200s, 256-512 MiB copies host to GPU
  // moved 2-3% more with 3 than with 2 (docs/multipath.md, "Three chunks in
  // flight").
  int outstanding = 3;
  bool own_link_first = true;   // a link serves its own GPU's transfer before relaying
  std::vector<bool> may_relay;  // by link; empty: every link may relay
  enum class Pick { kLongestQueue, kInOrder } pick = Pick::kLongestQueue;
  bool earliest_finish = true;  // a link declines a chunk it would land after the others finish (see above)
  bool probe = true;            // a link idle in a lane probes it before it takes chunks there (see above)
  // The tail of a copy in finer chunks: links finish a copy together only to
  // within a chunk's time (about 190 us for 8 MiB at 44 GB/s, a tenth of a
  // 256 MiB copy over four links). Once no more than a chunk per link is
  // left, a clear link takes `tail_chunk` bytes of the next chunk rather than
  // all of it (0: never); a held link, whose every chunk waits behind foreign
  // copies, still takes whole ones.
  size_t tail_chunk = size_t{2} << 20;
  // A link carries none of its own GPU's chunks while another link may relay
  // them: the engine then copies the own link's share on the caller's stream
  // before the gate (the head), and nothing reaches the target GPU after
  // copy() returns, so later work the program puts on that GPU cannot hold
  // the copy's own chunks behind the gate that waits for them (the LD_PRELOAD
  // hazard, docs/multipath.md). Static for the own link, dynamic for the rest.
  bool own_share_on_stream = false;
  // Other programs' own copies first: where every other GPU is being copied
  // to or from in a lane by its own program (as the link board says,
  // src/xfer/link_board.hpp), their links relay nothing in that lane, so that
  // each program keeps its own link (board_reservations). The engine reads
  // the board and calls reserve(); the simulation models it between processes.
  bool board = true;
  // Links kept warm between copies: for this long after a lane of a link
  // last carried a chunk, it probes that lane again kRenewS after its last
  // chunk or probe landed, while nothing of that direction waits or is in
  // flight there, so that a copy that comes after a gap finds its links
  // clear (or known to be held) at once instead of waiting for their probes.
  // 0: off (a lane idle for kClearS probes when a copy wants it).
  double keep_warm_s = 0;
};

// relays="idle": a GPU relays only while no other program runs on it.
// `processes`: the compute processes the driver lists on that GPU, this one
// included (it holds a context on every GPU of its links); -1: not known,
// which counts as in use.
inline bool gpu_runs_other_programs(int processes) { return processes < 0 || processes > 1; }
// How often the engine looks again (NVML's list costs tens of microseconds a GPU).
constexpr double kOtherProgramsLookS = 0.5;

// One chunk given to a link: the transfer's target GPU and whether it relays.
struct Assignment {
  int transfer = -1;
  Chunk chunk;
  int target = -1;  // the GPU whose memory is the transfer's device side
  int link = -1;    // the GPU whose host link carries it
  bool relay() const { return link != target; }
};

// The scheduler: per-target queues of chunks, per-link outstanding queues.
// Links are numbered as GPUs: link g is GPU g's host link.
class MultipathScheduler {
 public:
  MultipathScheduler(int links, MultipathPolicy policy);

  // A link's measured speed: seconds per byte (0: not measured), and when.
  // Kept as decaying sums of service time and bytes, so that a burst (one
  // chunk waits behind a foreign command, the next follows at once) counts
  // as the slow link it is; a sample after kEstimateStaleS without one starts
  // afresh.
  struct Estimate {
    double at = 0;       // when the last sample came
    double seconds = 0;  // decaying sums of service time and bytes
    double bytes = 0;
    double s_per_byte() const { return bytes > 0 ? seconds / bytes : 0; }  // 0: not measured
  };
  static constexpr double kEstimateStaleS = 0.1;
  // Lanes: 0, copies into a GPU; 1, copies out of one. A lane is clear on a
  // link while chunks of it are in flight there, or for kClearS after one of
  // its chunks or prompt probes landed. A probe alone takes about 10 us; one
  // foreign 4 MB command, about 80.
  static constexpr int kLanes = 2;
  static constexpr double kClearS = 1e-3;
  static constexpr double kPromptS = 100e-6;
  // A prompt probe lands about kProbeS after it went out, as the engine sees
  // it; while one is out for at most kProbeYoungS, its link counts in the
  // earliest-finish rule as starting then (a small copy's chunks stay for it
  // rather than pile onto a clear link).
  static constexpr double kProbeS = 20e-6;
  static constexpr double kProbeYoungS = 50e-6;
  // A prompt probe ages out its link's estimate where that is this many
  // times slower than the fastest other link's (probe_landed).
  static constexpr double kForgetSlower = 4.0;
  // A lane kept warm (MultipathPolicy::keep_warm_s) probes again once it has
  // been idle this long since its last chunk or probe landed: before kClearS
  // lapses, with time for the probe to come back.
  static constexpr double kRenewS = 0.7e-3;
  static int lane(bool to_device) { return to_device ? 0 : 1; }

  // Queues a transfer to or from `target`'s memory in `lane`; returns its id.
  // `own_share_on_stream` (default: the policy's): the caller's stream copies
  // the target link's share, so that link takes none of these chunks while
  // another link may relay them.
  // `head_pending`: the caller's stream is copying that share now, ahead of
  // anything else into the target in that direction (copy engines serve a
  // direction first in, first out): the own link does not probe behind it
  // until head_landed().
  int add(int target, const std::vector<Chunk>& chunks, int lane = 0,
          std::optional<bool> own_share_on_stream = std::nullopt, bool head_pending = false);
  void head_landed(int transfer) { head_pending_.at(transfer) = false; }
  // A copy to or from `target` in `lane` is queued on a stream that has not
  // got to it yet: the links that would carry it probe that lane now
  // (start_probe), so that the copy finds them clear, or known to be held,
  // when it starts instead of waiting for their probes then. Lasts kClearS
  // from `now`, or until a copy there is added.
  void expect(int target, int lane, double now);
  // The next chunk for `link` (at time `now`, seconds) if its outstanding
  // queue has room, a transfer in a lane clear there may use it, and it would
  // not be the transfer's straggler; the link's queue then holds it until
  // complete().
  bool next(int link, Assignment* out, double now = 0);
  // The lane `link` should probe now (it would take chunks there but the lane
  // is not clear, and no probe is out), marked as probing; or -1. The caller
  // sends the probe and reports probe_landed().
  int start_probe(int link, double now);
  // `waited_s`: the probe's time on the link (on the GPU's clock: the host
  // may see it late).
  void probe_landed(int link, int lane, double now, double waited_s);
  // The probe start_probe() asked for could not be sent, as a chunk a link
  // cannot take: true where `link`'s own GPU has chunks waiting, or a copy
  // it would carry on its way since expect() (an error of those copies);
  // otherwise `link` relays no more and false.
  bool probe_failed(int link, int lane);
  bool any_probing() const;
  // The earliest time a lane kept warm is due to probe (start_probe() then
  // sends it); infinity if none is (the policy's keep_warm_s is 0, or no lane
  // carried within it).
  double warm_due() const;
  // `link`'s lane is kept out: a probe is out, the last one came back late, or
  // it carries as a last resort until a prompt one.
  bool held(int link, int lane) const {
    return probing_.at(link).at(lane) || late_.at(link).at(lane) || resort_.at(link).at(lane);
  }
  bool probing(int link, int lane) const { return probing_.at(link)[lane]; }
  // `link`'s last probe in `lane` came back late (copies were queued there first).
  bool late(int link, int lane) const { return late_.at(link).at(lane); }
  // What sizes an own share (multipath_own_fraction), at `now`: `link`'s
  // speed in bytes/s if measured within kShareRateFreshS (else 0), and
  // whether `lane` counts as late there (its last probe came back late, or
  // one has been out longer than a prompt one takes).
  static constexpr double kShareRateFreshS = 1.0;
  double share_rate(int link, double now) const;
  bool share_late(int link, int lane, double now) const;
  double probe_sent(int link, int lane) const { return probe_sent_.at(link)[lane]; }
  // The oldest chunk in flight on `link` landed (seen at `now`).
  void complete(int link, double now = 0);
  // When idle: forgets the transfers so far (ids start from 0 again); the
  // links' speeds and lanes, and the relays given up on, stay.
  void forget_transfers();
  // `transfer` is done and its caller let go: its id goes to a later add().
  // Without it, copies that always overlap (one stream saving while another
  // fetches) never leave the scheduler idle, and its per-copy state would
  // grow with every copy.
  void finish(int transfer);
  // `link` served `bytes` in `seconds` (from when it could start on them to
  // when they landed), observed at `now`.
  void observe(int link, size_t bytes, double seconds, double now);
  const std::vector<Estimate>& estimates() const { return est_; }
  // The chunk next() just gave `link` could not be submitted there (a relay
  // failing): it goes back to the front of its queue, and `link` relays
  // nothing more (it still carries its own GPU's chunks if it may).
  void give_back(int link);
  // `link` relays nothing more (it failed to take work).
  void stop_relaying(int link);
  // `link`'s GPU is being copied to or from in `lane` by another program
  // (`on`), or no longer: while on, `link` takes no relay chunks in that lane
  // and probes for none (but those of a transfer whose own share is on the
  // caller's stream); it still carries its own GPU's.
  void reserve(int link, int lane, bool on) { reserved_.at(link).at(lane) = on; }
  // `link`'s GPU runs another program (relays="idle"), or no longer: while
  // on, `link` relays nothing (it still carries its own GPU's chunks).
  void set_other_programs(int link, bool on) { others_.at(link) = on; }
  bool other_programs(int link) const { return others_.at(link); }
  bool reserved(int link, int lane) const { return reserved_.at(link).at(lane); }
  bool waiting(int target) const {
    for (int lane = 0; lane < kLanes; ++lane)
      if (!waiting_.at(queue_of(target, lane)).empty()) return true;
    return false;
  }

  int in_flight(int link) const { return static_cast<int>(flight_.at(link).size()); }
  bool done(int transfer) const { return remaining_.at(transfer) == 0; }
  bool idle() const;
  int links() const { return static_cast<int>(flight_.size()); }
  const MultipathPolicy& policy() const { return policy_; }

 private:
  struct Queued {
    int transfer;
    Chunk chunk;
  };
  // Chunks wait in one queue per target GPU and lane.
  static int queue_of(int target, int lane) { return target * kLanes + lane; }
  int pick(int link, double now) const;  // the queue `link` would take from next, or -1
  bool lands_in_time(int link, int q, size_t bytes, double now) const;
  size_t take_bytes(int link, int q, double now) const;  // of queue q's next chunk
  // `link` is queue `q`'s GPU's own and no other link may carry any of it.
  bool alone(int link, int q) const;
  size_t flight_bytes(int link) const;
  // The fastest measured time per byte of the links but `except` (infinity: none measured).
  double fastest_s_per_byte(int except = -1) const;
  bool clear(int link, int lane, double now) const;
  // When `link`'s idle `lane` is due to probe to stay clear (infinity: not kept warm).
  double warm_at(int link, int lane) const;
  bool last_resort(int link, int q, double now) const;
  bool would_serve(int link, int q) const;
  bool others_may_do_better(int link, int q, double now) const;
  bool others_probe_young(int link, int q, double now) const;
  // Queue `q` has a chunk, and its lane is clear on `link` (or `link` is its last resort).
  bool usable(int link, int q, double now) const;
  // `link` may carry `target`'s chunks in `lane`: its own, or as a relay. A
  // reserved link still relays a transfer whose own share is on the
  // caller's stream: the rest of it may go nowhere but over relays, since a
  // chunk on the target's own link after copy() returned is the hazard that
  // share exists to avoid.
  bool serves(int link, int target, int lane) const {
    if (link == target) return carries_own(link, lane);
    return may_relay(link) && (!reserved_[link][lane] || front_own_on_stream(target, lane));
  }
  bool may_relay(int link) const { return (policy_.may_relay.empty() || policy_.may_relay[link]) && !others_[link]; }
  // The next chunk waiting for `target` in `lane` is of a transfer whose own share is on the caller's stream.
  bool front_own_on_stream(int target, int lane) const {
    const auto& w = waiting_[queue_of(target, lane)];
    return !w.empty() && own_on_stream_[w.front().transfer];
  }
  // `link` carries its own GPU's next chunk in `lane`: always, except where
  // that chunk's transfer has its own share on the caller's stream and
  // another link may relay it.
  bool carries_own(int link, int lane) const;

  MultipathPolicy policy_;
  std::vector<Estimate> est_;                    // by link
  std::vector<size_t> waiting_bytes_;            // by queue_of(target, lane)
  std::vector<std::deque<Queued>> waiting_;      // by queue_of(target, lane)
  std::vector<std::deque<Assignment>> flight_;   // by link
  std::vector<int> target_of_;                   // by transfer
  std::vector<int> lane_of_;                     // by transfer
  std::vector<bool> own_on_stream_;              // by transfer: its own share is on the caller's stream
  std::vector<bool> head_pending_;               // by transfer: that share has not landed yet
  std::vector<int> free_ids_;                    // of finished transfers, for add() to reuse
  std::vector<std::vector<double>> seen_;        // by link and lane: when a chunk or probe last landed there
  std::vector<std::vector<double>> used_;        // by link and lane: when a chunk last landed there
  std::vector<std::vector<bool>> probing_;       // by link and lane: a probe is out
  std::vector<std::vector<double>> probe_sent_;  // by link and lane: when it was sent
  std::vector<std::vector<bool>> late_;          // by link and lane: the last probe came back late
  std::vector<std::vector<bool>> resort_;        // by link and lane: took chunks while held, until a prompt probe
  std::vector<std::vector<bool>> reserved_;      // by link and lane: another program copies its GPU's own data
  std::vector<bool> others_;                     // by link: another program runs on its GPU (relays="idle")
  std::vector<double> expected_;                 // by queue: a copy is on its way there until then (expect())
  std::vector<size_t> remaining_;                // chunks not yet landed, by transfer
  std::vector<size_t> chunk_max_;                // by transfer: its largest chunk as added, the most a relay takes
};

// How long the engine's thread waits before it looks again, in
// microseconds. `warm_in_s`: until a lane kept warm is due to probe
// (MultipathScheduler::warm_due() less now; infinity where none is, and
// negative where one is overdue).
// Waiting only for streams to get to their copies: 5 us while `busy` (its
// last pass moved something, or a copy was queued within the last
// millisecond: a copy's start is its latency), else 200 us, or as long as a
// lane kept warm has left, but never under 5 us.
long multipath_pending_wait_us(bool busy, double warm_in_s);
// Idle (no copy, nothing in flight, no probe out): `idle_us`, or as long as a
// lane kept warm has left (0: it is due).
long multipath_idle_wait_us(long idle_us, double warm_in_s);

// ---- a model of the links, for the tests and for choosing chunk sizes

struct LinkModel {
  double bytes_per_s = 55e9;  // the host link alone
  // A foreign copy on this link from `busy_from` to `busy_until` seconds
  // takes `busy_share` of its bandwidth.
  double busy_share = 0.0;
  double busy_from = 0.0;
  double busy_until = 0.0;
  // And, where the copy engine serves the foreign copy's long commands first
  // (FIFO), each chunk that starts then waits this long before it moves.
  double busy_wait_s = 0.0;
};

struct SimTransfer {
  int target;
  size_t bytes;
};

struct SimResult {
  double seconds = 0;                 // until the last chunk landed
  std::vector<size_t> bytes_by_link;  // host-link bytes each link carried
  size_t relayed_bytes = 0;           // bytes that crossed NVLink
  std::vector<double> finish_by_transfer;
};

// Runs the scheduler against the model: each link serves its outstanding
// chunks one after another at its bandwidth left by the foreign copy; a relay
// adds `relay_seconds_per_byte` after the host link (NVLink, overlapped with
// the next chunk: two pipelines per relay). The scheduler observes each
// chunk's service time, as the engine's does.
// With `in_order`, each transfer starts when the one before it landed (a
// stream of copies); otherwise all start at once.
SimResult simulate(const std::vector<LinkModel>& links, const std::vector<SimTransfer>& transfers, size_t chunk_bytes,
                   const MultipathPolicy& policy, double relay_seconds_per_byte = 0.0, bool in_order = false);

// Several processes, each with a scheduler of its own, on the same links: a
// link serves the chunks all of them gave it in the order given (how two
// programs that both use ferry share the links).
std::vector<SimResult> simulate_processes(const std::vector<LinkModel>& links,
                                          const std::vector<std::vector<SimTransfer>>& processes, size_t chunk_bytes,
                                          const MultipathPolicy& policy, double relay_seconds_per_byte = 0.0,
                                          bool in_order = false);

// The same transfers with every chunk given in advance by fixed ratios (e.g.
// {1, 2}: link 1 gets two chunks for each of link 0's), the static split the
// dynamic one is measured against.
SimResult simulate_static(const std::vector<LinkModel>& links, const SimTransfer& transfer, size_t chunk_bytes,
                          const std::vector<int>& ratio);

// The fastest the links could move `bytes` in the model (every link busy
// until the same moment), for judging a result.
double ideal_seconds(const std::vector<LinkModel>& links, size_t bytes);

}  // namespace xfer
}  // namespace ferry
