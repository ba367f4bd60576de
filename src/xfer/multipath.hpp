// Multipath host<->GPU copies: one large copy split into chunks that travel
// over several GPUs' host links at once. A chunk for GPU t goes over t's own
// link, or over a relay GPU r's link into a staging buffer on r and on to t
// over NVLink (device to host: the reverse). Copy engines only, no kernel.
//
// Stream order without an SM: the caller's stream writes a word as it gets
// to the copy (the engine's thread reads it, with no CUDA call) and then waits
// on a gate word (src/sync/gate.hpp) that the thread opens once the last chunk
// landed. Between the two, the thread feeds the links by back-pressure
// (MultipathScheduler, multipath_plan.hpp): a link takes a chunk when its
// outstanding queue has room, its measured speed would not make the chunk the
// copy's last, and a probe found no foreign copies queued in its direction.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "sync/gate.hpp"
#include "xfer/link_board.hpp"
#include "xfer/multipath_plan.hpp"
#include "xfer/relay_staging.hpp"

namespace ferry {
namespace xfer {

struct MultipathOptions {
  // The CUDA device of each host link. A device listed more than once adds
  // relays through that same GPU: the testing mode on one GPU, where every
  // chunk, staging buffer and pipeline runs for real over one link.
  std::vector<int> link_devices;
  size_t chunk_bytes = 0;      // 0: FERRY_MULTIPATH_CHUNK_BYTES
  size_t threshold_bytes = 0;  // 0: FERRY_MULTIPATH_MIN_BYTES; smaller copies run as one plain copy
  // The most of a copy's head that the caller's stream moves itself
  // (multipath_head_bytes); SIZE_MAX: FERRY_MULTIPATH_HEAD_BYTES.
  size_t head_bytes = SIZE_MAX;
  // policy.own_share_on_stream from FERRY_MULTIPATH_OWN_SHARE_ON_STREAM where
  // this is -1; 0 or 1 set it.
  int own_share_on_stream = -1;
  MultipathPolicy policy;  // outstanding chunks per link, own link first, which links may relay
  double timeout_s = 0;    // 0: FERRY_TIMEOUT_S; bound on a copy once its stream got to it
  // relays="idle": how many compute processes run on a CUDA device, this one
  // included (-1: not known); a link relays only while its GPU runs no other
  // program (gpu_runs_other_programs), looked at every
  // kOtherProgramsLookS. Empty: every link policy.may_relay allows relays.
  std::function<int(int device)> processes_on;
};

// One copy of a batch: `bytes` from `src` to `dst`.
struct MultipathPiece {
  void* dst = nullptr;
  const void* src = nullptr;
  size_t bytes = 0;
};

// What a copy() did, for tests, benchmarks and the debug log.
struct MultipathReport {
  bool multipath = false;
  std::string reason;  // why it ran as one plain copy
  int chunks = 0;
  int links = 0;  // links that may carry it
};

class MultipathEngine {
 public:
  explicit MultipathEngine(const MultipathOptions& options);
  ~MultipathEngine();  // close()
  MultipathEngine(const MultipathEngine&) = delete;
  MultipathEngine& operator=(const MultipathEngine&) = delete;

  // Copies `bytes` from `src` to `dst` (one in pinned or pageable host
  // memory, the other in GPU memory) in `stream`'s order and returns at once.
  // A default stream (null, legacy, per-thread) is `default_device`'s, or,
  // with -1, that of the GPU the copy reads or writes. Raises an error an
  // earlier copy met.
  MultipathReport copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, int default_device = -1);
  // Several copies in one direction for one GPU (e.g. every weight of a
  // model) as one copy: one start and one finish in `stream`'s order, and the
  // links kept busy from the first byte to the last rather than refilled
  // copy after copy. Destinations may not overlap. Below the threshold in
  // total, for pageable memory or while capturing, each runs as a plain copy.
  MultipathReport copy_batch(const std::vector<MultipathPiece>& pieces, cudaStream_t stream, int default_device = -1);
  // Waits until every multipath copy so far landed (bounded by the timeout),
  // then raises an error one of them met. Plain copies are ordered in their
  // streams only.
  void synchronize();
  // Raises the first error a copy met (a CUDA error, a chunk that did not
  // land in time). Every stream waiting on the engine was let go, and every
  // copy not complete then is invalid.
  void check();
  // Waits (bounded) for the copies in flight, stops the engine's thread and
  // frees its memory; a second call does nothing. Past the bound the streams
  // are let go (said on stderr) and memory a copy engine may still write stays.
  // Then raises the engine's error if no call raised it yet (check(), a copy).
  void close();

  const std::vector<int>& link_devices() const { return links_; }
  // Host-link bytes each link carried so far (a relay's chunks count on the relay's link).
  std::vector<size_t> bytes_by_link() const;
  size_t chunk_bytes() const { return chunk_bytes_; }
  size_t threshold_bytes() const { return threshold_; }
  // Links whose staging buffers could not be made (out of memory), that
  // cannot reach the others, or that failed to take a chunk: they carry only
  // their own GPU's copies.
  std::vector<bool> may_relay() const {
    std::lock_guard<std::mutex> lock(mu_);
    return policy_.may_relay;
  }
  // Where the relays' staging buffers are (relay_staging.hpp): on a
  // symmetric heap over the relaying GPUs, or plain allocations where the
  // heap could not be had.
  const std::string& staging_where() const { return staging_where_; }

 private:
  // One gate per caller stream, each opened in that stream's order only: a
  // copy held up on one stream never holds up another stream's. A stream is
  // its handle on its device (handle 0 is a different stream on each GPU),
  // and the calling thread's for cudaStreamPerThread.
  static constexpr int kHeadTimes = 8;
  using HeadTimes = std::array<std::array<cudaEvent_t, 2>, kHeadTimes>;
  static void destroy_events(HeadTimes& events) {
    for (auto& pair : events)
      for (auto& e : pair)
        if (e) cudaEventDestroy(e), e = nullptr;
  }
  struct StreamGate {
    int device;
    cudaStream_t stream;
    std::thread::id thread;
    std::unique_ptr<HostGate> gate;
    // The stream writes each arming's generation here as it gets to it: the
    // host sees a copy's start without a CUDA call.
    std::unique_ptr<HostGate> reached;
    // A copy with a head: the stream writes its generation here once the head landed.
    std::unique_ptr<HostGate> head_done;
    // Orders the reached-write-and-wait pairs copy() enqueues on this stream
    // (CUDA calls, so never under mu_, which the watchdog needs).
    std::unique_ptr<std::mutex> arm_mu;
    uint64_t armed = 0;   // the last generation the stream was made to wait for (under mu_)
    uint64_t opened = 0;  // the highest generation opened: opening never goes back
    // An own share's start and end on the GPU's clock, by generation %
    // kHeadTimes: the own link's speed. `timing` is the generation last
    // recorded, so that a slot recorded again meanwhile is not read.
    HeadTimes head_time{};
    std::unique_ptr<std::atomic<uint64_t>> timing;
    // Lets every arming up to `generation` go (under mu_).
    void open(uint64_t generation) {
      opened = std::max(opened, generation);
      gate->open_to(opened);
    }
  };
  // A copy the watchdog bounds: its stream's gate and generation, and when
  // the watchdog first saw the stream get to it.
  struct Watched {
    StreamGate* gate;
    uint64_t generation;
    double queued_at = 0;  // when copy() armed it
    double reached_at = 0;
    bool said = false;  // FERRY_DEBUG said that its stream had not got to it after the timeout
  };
  // A batch's copies laid end to end: a chunk's offset names its copy.
  struct Piece {
    char* dst = nullptr;
    const char* src = nullptr;
    size_t bytes = 0;
    size_t at = 0;  // where it starts among the batch's bytes
  };
  struct Transfer {
    uint64_t id = 0;
    int target = -1;  // its own link
    bool to_device = true;
    std::vector<Piece> pieces;
    size_t bytes = 0;           // of every piece
    std::vector<Chunk> chunks;  // split_batch of the pieces in multipath_chunk_bytes
    StreamGate* gate = nullptr;
    size_t head = 0;                   // bytes the caller's stream copies itself (over `target`'s link)
    bool own_share_on_stream = false;  // the head is the target link's share: that link takes no chunk
    uint64_t generation = 0;           // what its stream's gate waits for
    int sched = -1;                    // the scheduler's id, once its stream got to it
    double deadline = 0;
    // When the engine saw its stream get to it (for the debug log, and the
    // head's time), and by link the bytes carried, when its first chunk there
    // went out and when its last one there was seen landed.
    double started = 0;
    double queued = 0;        // when copy() handed it to the engine's thread
    double noticed = 0;       // when the engine's thread took it from there
    bool head_seen = false;   // the head's landing was seen
    bool head_timed = false;  // its start and end were recorded (head_time's slot of its generation)
    std::vector<size_t> link_bytes;
    std::vector<double> link_first;
    std::vector<double> link_last;
    // FERRY_DEBUG: by link, its last chunk's hops on the GPU's clock (us; a
    // relay's second hop from its first hop's end, the gap included).
    std::vector<float> link_hop1, link_hop2;
  };
  struct Link {
    int device = -1;
    cudaStream_t host = nullptr;    // the host-link hop (own copies and a relay's PCIe hop)
    cudaStream_t nvlink = nullptr;  // a relay's hop between the relay and the target
    std::vector<char*> staging;     // one per outstanding chunk
    std::vector<cudaEvent_t> hop;   // a relay's first hop done, per slot
    std::vector<cudaEvent_t> landed;
    // FERRY_DEBUG only, per slot: a chunk's start, its first hop's end, its end.
    std::vector<std::array<cudaEvent_t, 3>> clock;
    void* scratch = nullptr;  // the streams' first copies, then a probe's bytes
    // A probe's start and end on the GPU's clock, by lane: its time there (not
    // when the host saw it) says whether copies were queued before it.
    cudaEvent_t probe[MultipathScheduler::kLanes][2] = {};
    // FERRY_DEBUG: by lane, when its last probe was seen landed and its time on the GPU (us).
    double probe_seen[MultipathScheduler::kLanes] = {};
    float probe_gpu_us[MultipathScheduler::kLanes] = {};
    struct InFlight {
      uint64_t transfer;
      size_t bytes;
      int slot;
      double given;        // when it was submitted (steady seconds)
      bool first = false;  // this link's first chunk to or from that GPU in that direction: not timed
    };
    std::deque<InFlight> flight;
    // By link index of the target and lane: this link carried a chunk there before.
    std::vector<std::array<bool, MultipathScheduler::kLanes>> carried;
    int next_slot = 0;
    double last_landed = 0;  // when its previous chunk was seen landed
  };

  void set_up_links();          // the constructor's streams, events and memory
  void destroy_link_handles();  // the links' streams and events (not their memory)
  void run();
  void first_copies();
  void watch();
  void open_every_gate();           // under mu_
  void say_broken();                // under mu_, once error_ is final
  [[noreturn]] void raise_error();  // under mu_: error_ to a caller, as FERRY_ERROR_BROKEN
  void close_engine();              // close() but the error it raises
  // A chunk between its first CUDA call and the rest (submit_all).
  struct Hop {
    Transfer* t = nullptr;
    Assignment a;
    int slot = 0;
    char* dst = nullptr;
    const char* src = nullptr;
    double given = 0;  // when its first call went out (steady seconds)
  };
  bool first_hop(Transfer& t, const Assignment& a, Hop* hop);
  bool second_hop(const Hop& h);
  void stop_relay(int link, int count, const std::string& why);
  void submit_all(const std::vector<std::vector<Assignment>>& given, const std::function<Transfer&(int)>& transfer_of);
  void probe(int link, int lane);
  void probe_lost(int link, int lane, const std::string& why);
  void land(Transfer& t, double now);
  bool links_idle(double limit_s);
  // "" once every link is idle (waiting up to `limit_s`), else the GPUs whose links are not.
  std::string busy_links(double limit_s);
  void fail_and_release(const std::string& message, std::deque<Transfer>& pending, std::deque<Transfer>& active);
  StreamGate* gate_for(int device, cudaStream_t stream);  // takes mu_; allocates outside it
  // The link board: posts the GPUs and directions of the copies in `active`
  // and reserves the links other programs posted (MultipathPolicy::board).
  void read_board(const std::deque<Transfer>& active, double now);
  void withdraw_board();  // every post of this engine (the engine's thread, or close() after it)

  std::vector<int> links_;
  size_t chunk_bytes_ = 0;
  size_t min_chunk_ = kMultipathMinChunk;
  size_t threshold_ = 0;
  size_t head_bytes_ = 0;
  double timeout_s_ = 0;
  MultipathPolicy policy_;
  std::vector<Link> link_;
  std::unique_ptr<RelayStaging> staging_;      // holds every link's staging buffers
  std::string staging_where_ = "none";         // staging_->where(), kept: close() drops staging_
  uint64_t* host_scratch_ = nullptr;           // pinned: the first copies' words, then 2 probes' bytes per link
  std::deque<StreamGate> gates_;               // a deque: transfers point at its elements
  std::unique_ptr<MultipathScheduler> sched_;  // the engine's thread's only
  // The link board (null: off, or no shared memory), this engine's token on
  // it, each link's GPU there (loopback relays have none: never reserved),
  // and when the engine's thread last looked; the thread's only.
  std::unique_ptr<LinkBoard> board_;
  uint64_t board_token_ = 0;
  std::vector<std::optional<GpuId>> board_gpu_;
  std::set<BoardKey> board_posted_;         // posted at the last look
  std::map<BoardKey, double> board_ended_;  // when a copy there last landed (board_posts)
  bool board_full_said_ = false;            // a post found every slot taken (said once in the debug log)
  double board_at_ = -1;
  // relays="idle" (MultipathOptions::processes_on): what counts the programs
  // on a GPU, and when the engine's thread last looked.
  std::function<int(int)> processes_on_;
  double others_at_ = -1;
  void look_for_other_programs(double now);  // the engine's thread

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Transfer> queued_;    // handed to the thread
  std::set<uint64_t> unfinished_;  // ids of copies not yet landed
  uint64_t next_id_ = 0;
  std::string error_;
  bool error_told_ = false;          // raised to a caller, by check() or close()
  bool said_broken_ = false;         // said on stderr (say_broken)
  bool broken_ = false;              // after an error: every stream let go, no copy taken
  std::atomic<bool> halted_{false};  // broken_, for the engine's thread between CUDA calls
  bool stop_ = false;
  bool closed_ = false;
  bool ready_ = false;                   // the engine's thread made its first CUDA calls
  std::map<uint64_t, Watched> watched_;  // by copy id, until it lands
  // What copy() sizes an own share by, from the engine's thread: each link's
  // measured speed (bytes/s, 0: not measured) and, by lane, whether its last
  // probe came back late.
  std::vector<double> link_rate_;
  std::vector<std::array<bool, MultipathScheduler::kLanes>> link_late_;
  // By link: its GPU runs another program (relays="idle"): it relays nothing.
  std::vector<bool> others_;
  std::vector<std::atomic<size_t>> bytes_;
  std::thread thread_;
  std::thread watchdog_;
};

}  // namespace xfer
}  // namespace ferry
