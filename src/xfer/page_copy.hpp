// Paged KV-cache transfers: executes a page request (page_plan.hpp) on one GPU
// with the strategy the caller names or `auto` picks (page_select.hpp), in the
// caller's stream order. Copy-engine strategies launch no kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dma/engine.hpp"
#include "dma/submit_threads.hpp"
#include "sync/gate.hpp"
#include "xfer/page_kernel.hpp"
#include "xfer/page_plan.hpp"
#include "xfer/page_select.hpp"

namespace ferry {
namespace xfer {

struct PageCopyOptions {
  std::optional<PageStrategy> strategy;  // nullopt: auto
  bool zero_sm = false;                  // never launch a kernel
  bool urgent = false;                   // run on ferry's urgent stream, not behind bulk work on the caller's
  bool settled_source = false;           // nothing in the stream still writes the source (srcAccessOrder=Any)
  bool merge = true;                     // merge runs of adjacent pages into one copy
  // A page's regions at one stride on both sides (region_ladders) go as one
  // pitched copy; the per-page baseline never does.
  bool pitched = true;
  // Copy-engine work submitted in slices of this many bytes, at most
  // kSlicesQueued of them on the copy engine at a time, so that an urgent
  // fetch from another stream waits behind that much and no more (0: all at
  // once). A copy engine serves host-to-GPU copies first in, first out across
  // streams, whatever their priority.
  size_t slice_bytes = 0;
  int kernel_blocks = 0;  // kernel grid; 0: ferry's choice
  int kernel_threads = 0;
  size_t kernel_chunk = 0;  // bytes per warp task; 0: ferry's choice (SIZE_MAX: whole pages)
};

// Index lists the kernel strategy reads in place from GPU memory (no host
// sync). Each entry is bounds-checked in the kernel; a bad one is skipped and
// reported by the next call on this GPU (check_kernel_errors). Duplicates in
// device lists are not detected.
struct DeviceIds {
  const void* dst = nullptr;
  const void* src = nullptr;
  size_t count = 0;
  bool is_64 = true;
};

// What a call did, for benchmarks and debugging.
struct PageCopyReport {
  PageStrategy strategy = PageStrategy::kBatched;
  Direction direction = Direction::kHostToDevice;
  size_t copies = 0;   // submitted, after merging (the per-page baseline: every row)
  size_t pitched = 0;  // of which pitched copies of several rows
  size_t bytes = 0;
  int sms = 0;  // blocks of the kernel, or 0
};

class PreparedPages;

// One per GPU, created on first use; thread-safe.
class PageCopier {
 public:
  static PageCopier& on(int device);
  ~PageCopier();

  PageCopyReport copy(const PageSide& dst, const PageSide& src, const PageIds& dst_ids, const PageIds& src_ids,
                      const PageCopyOptions& o, cudaStream_t stream);
  // The kernel strategy with index lists in GPU memory.
  PageCopyReport copy_device_ids(const PageSide& dst, const PageSide& src, const DeviceIds& ids,
                                 const PageCopyOptions& o, cudaStream_t stream);
  // The strategy auto would run for this request (no copy).
  PageStrategy choose(Direction direction, size_t copies, size_t bytes, bool zero_sm) const;
  Direction direction(const PageSide& dst, const PageSide& src);

  void set_rules(std::vector<PageRule> rules);
  // Throws if an earlier kernel with GPU index lists skipped an out-of-range entry.
  void check_kernel_errors();

 private:
  friend class PreparedPages;
  explicit PageCopier(int device);
  struct Located {
    Direction direction;
    std::vector<KernelRegion> kernel_regions;  // device-usable addresses
    std::vector<std::shared_ptr<class HostPool>> pools;
    // The sides with each region's allocation filled in (PageRegion::allocation).
    PageSide dst, src;
  };
  // `allocations`: also where each region's allocation starts (pitched copies need it).
  Located locate(const PageSide& dst, const PageSide& src, cudaStream_t stream, bool allocations = false);
  void run_copies(PageStrategy s, const std::vector<PitchedCopy>& copies, const PageCopyOptions& o, Direction d,
                  cudaStream_t stream);
  void run_sliced(PageStrategy s, const std::vector<PitchedCopy>& copies, size_t slice_bytes, bool any_order,
                  cudaStream_t stream);
  // The widest pitch the GPU takes in a pitched copy (cudaDevAttrMaxPitch).
  size_t max_pitch() const { return max_pitch_; }
  int run_kernel(Located& where, const PageSide& dst, const PageSide& src, const void* dst_ids, const void* src_ids,
                 bool is_64, size_t n, const PageCopyOptions& o, cudaStream_t stream, const void* host_dst_ids,
                 const void* host_src_ids);
  // Host staging the kernel reads (regions, and host index lists copied in).
  void* stage(size_t bytes, cudaStream_t stream, bool capturing);
  // Device memory for launch_page_marks' `words` x 2 words, beside the slot
  // stage() just handed out (free of earlier kernels as it is), or kept for
  // a graph while capturing.
  uint32_t* stage_marks(uint64_t words, bool capturing);
  void note_pools(const Located& where, cudaStream_t stream);

  int device_;
  int sm_count_ = 0;
  size_t max_pitch_ = 0;
  mutable std::mutex mu_;
  std::vector<PageRule> rules_;
  cudaStream_t urgent_ = nullptr;
  // Sliced submission: slice k runs on stream k % kSliceStreams once slice
  // k - kSlicesQueued is done (a stream waiting on another's event holds its
  // copies back from the copy engine; on its own stream it would not).
  static constexpr int kSlicesQueued = 2;
  static constexpr int kSliceStreams = kSlicesQueued + 1;
  cudaStream_t slice_streams_[kSliceStreams] = {};
  cudaEvent_t slice_done_[kSliceStreams] = {};
  // The streams the 'streams' strategy spreads copies over (its peer engines),
  // the one copy-engine strategies run on instead of the legacy default stream
  // (its main stream: runs_on_own_stream), and the events that order them
  // with the caller's stream.
  std::unique_ptr<EngineSet> engines_;
  // The 'streams' strategy's submitting threads: one per stream it uses.
  std::unique_ptr<SubmitThreads> submit_;
  struct Slot {
    void* host = nullptr;
    size_t capacity = 0;
    cudaEvent_t done = nullptr;
    uint32_t* marks = nullptr;  // device memory, mark_words words
    uint64_t mark_words = 0;
  };
  std::vector<Slot> slots_;
  size_t next_slot_ = 0;
  std::vector<void*> captured_staging_;  // kept for the graphs that read them, and outgrown slots (freed at exit)
  std::vector<std::shared_ptr<class HostPool>> captured_pools_;  // likewise
  std::vector<void*> kept_marks_;              // device marks of captured calls and outgrown slots (freed at exit)
  volatile uint64_t* kernel_error_ = nullptr;  // pinned: 1 + index of the first bad entry
  unsigned long long* kernel_error_device_ = nullptr;
};

// A transfer planned once and enqueued ahead behind a gate, released later from
// the host, a stream or a kernel: what is left on the critical path is the
// copies themselves. Copy engines only.
class PreparedPages {
 public:
  PreparedPages(int device, const PageSide& dst, const PageSide& src, const PageIds& dst_ids, const PageIds& src_ids,
                PageStrategy strategy, bool merge, bool pitched = true);
  ~PreparedPages();
  PreparedPages(const PreparedPages&) = delete;
  PreparedPages& operator=(const PreparedPages&) = delete;

  // Enqueues the copies on ferry's armed stream after the work enqueued so far
  // on `after`, behind the gate.
  void arm(cudaStream_t after);
  void trigger();
  void trigger_on(cudaStream_t stream);
  std::pair<uint64_t*, uint64_t> device_trigger();
  // Makes `stream` wait for the last armed run.
  void wait(cudaStream_t stream);
  // Host wait for the last armed run, at most timeout_s; throws
  // FERRY_ERROR_TIMEOUT naming the gate when it was never opened.
  void synchronize(double timeout_s);
  bool armed() const { return armed_ && !opened_; }
  size_t copies() const { return copies_.size(); }
  size_t bytes() const { return bytes_; }
  PageStrategy strategy() const { return strategy_; }
  Direction direction() const { return direction_; }

 private:
  // Why the last armed run has not finished, for a timeout's message.
  std::string why_unfinished() const;
  // What the gate's hold is called (sync/holds.hpp): in messages that refuse a teardown.
  std::string hold_name() const;
  // Runs that may still wait on the stream: from the oldest arming whose
  // trigger, handed out, has not landed (runs after it queue behind it).
  size_t queued_runs() const;
  // Before arming again: waits (bounded) for earlier armings' triggers where
  // their runs and this one would pass what a queue takes behind a wait.
  void wait_for_earlier_triggers();

  int device_;
  std::vector<PitchedCopy> copies_;
  size_t bytes_ = 0;
  PageStrategy strategy_;
  Direction direction_;
  std::vector<std::shared_ptr<class HostPool>> pools_;
  std::unique_ptr<HostGate> gate_ = std::make_unique<HostGate>();  // the last arming's
  // Gates of earlier armings whose trigger (a stream write, a kernel's store)
  // had not landed when the transfer was armed again: kept, never reused.
  std::vector<std::unique_ptr<HostGate>> retired_gates_;
  std::vector<size_t> retired_runs_;  // by retired gate: the arming (run number) it gated
  size_t runs_ = 0;                   // armings so far
  size_t gate_run_ = 0;               // the arming gate_ gates
  cudaStream_t stream_ = nullptr;
  cudaEvent_t finished_ = nullptr;
  size_t calls_ = 0;  // host calls one run enqueues behind its gate (submission_calls)
  bool armed_ = false;
  bool opened_ = false;
  bool ran_ = false;
};

}  // namespace xfer
}  // namespace ferry
