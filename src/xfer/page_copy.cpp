#include "xfer/page_copy.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>
#include <utility>

#include "core/cuda_scope.hpp"
#include "core/driver.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "dma/engine.hpp"
#include "xfer/host_pool.hpp"
#include "xfer/pointer_kind.hpp"

namespace ferry {
namespace xfer {
namespace {

// Why a transfer within one GPU cannot go without SMs: CUDA runs every copy
// within a GPU as a kernel, whichever call submits it (docs/architecture.md,
// "The local block").
std::string within_one_gpu(int device) {
  return "dst and src are both in cuda:" + std::to_string(device) +
         "'s memory, and CUDA copies within one GPU on SMs (there is no copy-engine path for it)";
}

constexpr size_t kSlots = 8;
// The kernel's default grid: enough warps in flight to cover PCIe latency
// (each holds 4 x 16 bytes per lane in flight) on few SMs.
constexpr int kDefaultBlocks = 16;
constexpr int kDefaultThreads = 512;
constexpr size_t kDefaultChunk = 16 << 10;

size_t pitched_row_bytes() { return static_cast<size_t>(knob_int_in("FERRY_KV_PITCHED_ROW_BYTES")); }

std::string side_name(const char* side, size_t r) { return std::string(side) + "[" + std::to_string(r) + "]"; }

struct Where {
  bool host = false;
  int device = -1;
  uint64_t device_address = 0;
  uintptr_t allocation = 0;  // where the allocation holding the region starts; 0: not known
  size_t allocation_size = 0;
  std::shared_ptr<HostPool> pool;
};

// The start of the CUDA allocation holding [p, p + span) (device memory, or
// host memory CUDA allocated or registered); 0 where the driver cannot say,
// or where the span runs past the allocation that holds p (memory mapped in
// pieces, as PyTorch's expandable segments are: the driver names the piece).
// (start, size) of that allocation; (0, 0) where unknown.
std::pair<uintptr_t, size_t> allocation_of(const void* p, size_t span) {
  const auto at = reinterpret_cast<CUdeviceptr>(p);
  CUdeviceptr start = 0;
  size_t size = 0;
  if (driver().PointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at) != CUDA_SUCCESS ||
      driver().PointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, at) != CUDA_SUCCESS)
    return {0, 0};
  if (at < start || at - start + span > size) return {0, 0};
  return {static_cast<uintptr_t>(start), size};
}

// The span of a region: from its first page's start to its last page's end.
size_t span_of(const PageRegion& g) { return g.pages ? (g.pages - 1) * g.stride + g.bytes : 0; }

// `allocation`: look up where the region's allocation starts (only pitched
// copies need it; it costs driver calls).
Where where_is(const PageRegion& g, const char* side, size_t r, bool allocation) {
  Where w;
  const void* p = reinterpret_cast<const void*>(g.base);
  const size_t span = span_of(g);
  if ((w.pool = HostPool::find(p, span))) {
    w.host = true;
    w.device_address = g.base;  // pools are mapped with unified addressing: same address
    w.allocation = reinterpret_cast<uintptr_t>(w.pool->data());
    return w;
  }
  const PointerKind k = pointer_kind(p);
  switch (k.kind) {
    case MemKind::kPinnedHost:
      w.host = true;
      w.device_address = reinterpret_cast<uint64_t>(k.device_pointer);
      if (allocation) std::tie(w.allocation, w.allocation_size) = allocation_of(p, span);
      return w;
    case MemKind::kDevice:
      w.device = k.device;
      w.device_address = g.base;
      if (allocation) std::tie(w.allocation, w.allocation_size) = allocation_of(p, span);
      return w;
    case MemKind::kManaged:
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  side_name(side, r) +
                      " is managed (unified) memory; page transfers take pinned host memory or "
                      "GPU memory");
    case MemKind::kPageable:
      break;
  }
  throw_error(FERRY_ERROR_INVALID_ARGUMENT,
              side_name(side, r) +
                  " is pageable host memory: copy engines cannot read or write it in place (the driver would "
                  "stage every page through a bounce buffer). Allocate it pinned: ferry.kv.pinned_empty(...), "
                  "ferry.kv.HostPool, or tensor.pin_memory()");
}

// A list of copies on one stream as the strategy submits it: one call per
// row for the per-page baseline, else pitched and batched calls of
// `per_call` plain copies at most (0: FERRY_BATCH_MAX).
void submit(PageStrategy s, cudaStream_t stream, const std::vector<PitchedCopy>& copies, bool any_order,
            size_t per_call = 0) {
  if (s == PageStrategy::kPerPage)
    dma::copy_rows_one_by_one(stream, copies);
  else
    dma::copy_pitched(stream, copies, any_order, per_call);
}

}  // namespace

PageCopier& PageCopier::on(int device) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<PageCopier>> copiers;
  std::lock_guard<std::mutex> lock(mu);
  auto& c = copiers[device];
  if (!c) c.reset(new PageCopier(device));
  return *c;
}

PageCopier::PageCopier(int device) : device_(device) {
  DeviceScope on_device(device);
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, device));
  int pitch = 0;
  FERRY_CUDA_CHECK(cudaDeviceGetAttribute(&pitch, cudaDevAttrMaxPitch, device));
  max_pitch_ = static_cast<size_t>(std::max(0, pitch));
  int least = 0, greatest = 0;
  FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&urgent_, cudaStreamNonBlocking, greatest));
  // Loaded with the copier, so that a transfer's first kernel launch never
  // waits for the device (where another transfer's gate may be armed).
  load_page_kernel();
  for (int i = 0; i < kSliceStreams; ++i) {
    FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&slice_streams_[i], cudaStreamNonBlocking));
    FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&slice_done_[i], cudaEventDisableTiming));
  }
  engines_ = std::make_unique<EngineSet>(device, static_cast<int>(knob_int_in("FERRY_KV_STREAMS")));
  submit_ = std::make_unique<SubmitThreads>(device);
  slots_.resize(kSlots);
  for (auto& s : slots_) FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
  void* p = nullptr;
  FERRY_CUDA_CHECK(cudaHostAlloc(&p, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  kernel_error_ = static_cast<volatile uint64_t*>(p);
  *kernel_error_ = 0;
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&kernel_error_device_), p, 0));
  cudaDeviceProp prop{};
  std::string gpu;
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) gpu = prop.name;
  rules_ = startup_page_rules(shipped_page_tables(), gpu, knob_string("FERRY_KV_TUNING"));
}

PageCopier::~PageCopier() {
  // Process exit: the driver may be gone already; release what it still knows.
  // Not while an armed transfer may hold a stream: freeing would wait for its
  // trigger, and the process's memory goes with it anyway.
  if (!sync::holding_now().empty()) return;
  cudaSetDevice(device_);
  for (auto& s : slots_) {
    if (s.host) cudaFreeHost(s.host);
    if (s.marks) cudaFree(s.marks);
    cudaEventDestroy(s.done);
  }
  for (void* p : captured_staging_) cudaFreeHost(p);
  for (void* p : kept_marks_) cudaFree(p);
  if (urgent_) cudaStreamDestroy(urgent_);
  for (int i = 0; i < kSliceStreams; ++i) {
    if (slice_streams_[i]) cudaStreamDestroy(slice_streams_[i]);
    if (slice_done_[i]) cudaEventDestroy(slice_done_[i]);
  }
  if (kernel_error_) cudaFreeHost(const_cast<uint64_t*>(kernel_error_));
}

void PageCopier::set_rules(std::vector<PageRule> rules) {
  for (size_t i = 0; i < rules.size(); ++i)
    FERRY_ARG_CHECK(!uses_sm(rules[i].zero_sm), "rules[" + std::to_string(i) + "].zero_sm launches a kernel");
  std::lock_guard<std::mutex> lock(mu_);
  rules_ = std::move(rules);
}

PageStrategy PageCopier::choose(Direction direction, size_t copies, size_t bytes, bool zero_sm) const {
  std::lock_guard<std::mutex> lock(mu_);
  return select_page_strategy(rules_, direction, copies, bytes, zero_sm);
}

void PageCopier::check_kernel_errors() {
  uint64_t bad = __atomic_exchange_n(const_cast<uint64_t*>(kernel_error_), uint64_t{0}, __ATOMIC_ACQ_REL);
  if (!bad) return;
  const bool repeated = bad & kRepeatedDstBit;
  const std::string entry = std::to_string((bad & ~kRepeatedDstBit) - 1);
  throw_error(FERRY_ERROR_INVALID_ARGUMENT,
              "an earlier kernel page transfer with GPU index lists " +
                  (repeated ? "found dst_ids entry " + entry +
                                  " naming a destination page another entry named too (every entry naming that page "
                                  "was skipped, so that it was not written from two sources at once)"
                            : "skipped entry " + entry +
                                  ": its dst_ids or src_ids value was out of range (that page was not copied)") +
                  "; this call copied nothing (call it again)");
}

PageCopier::Located PageCopier::locate(const PageSide& dst, const PageSide& src, cudaStream_t stream,
                                       bool allocations) {
  Located out;
  const int stream_device = dma::stream_device(stream, device_);
  FERRY_ARG_CHECK(stream_device == device_, "stream: it belongs to cuda:" + std::to_string(stream_device) +
                                                " but the GPU tensors are on cuda:" + std::to_string(device_));
  int dst_host = -1, src_host = -1;  // -1 unknown, 0 device, 1 host
  out.kernel_regions.resize(dst.regions.size());
  out.dst = dst;
  out.src = src;
  for (int side = 0; side < 2; ++side) {
    const PageSide& s = side == 0 ? dst : src;
    const char* sname = side == 0 ? "dst" : "src";
    int& kind = side == 0 ? dst_host : src_host;
    // The last allocation looked up, [start, end), and the region found in it
    // at `at`: the regions of one allocation (a stacked cache's per-layer
    // views, a pool's tensors) are looked up once, where the driver's lookups
    // cost about a microsecond a region. Addresses are linear within it.
    // (The range, which pitched copies need anyway, costs two more lookups;
    // where they are not needed, it is looked up for a side's first region
    // only, so that tensors of separate allocations cost one lookup each.)
    struct Seen {
      uintptr_t start = 0, end = 0, at = 0;
      Where w;
    } seen;
    bool ranged = false;
    for (size_t r = 0; r < s.regions.size(); ++r) {
      const PageRegion& g = s.regions[r];
      if (g.bytes == 0 || g.pages == 0) continue;
      const uintptr_t lo = g.base, hi = g.base + span_of(g);
      Where w;
      if (seen.end && lo >= seen.start && hi <= seen.end) {
        w = seen.w;
        w.device_address = seen.w.device_address + (lo - seen.at);
      } else {
        w = where_is(g, sname, r, allocations || (!ranged && s.regions.size() > 1));
        ranged = true;
        seen = Seen{};
        if (w.pool) {
          seen.start = reinterpret_cast<uintptr_t>(w.pool->data());
          seen.end = seen.start + w.pool->bytes();
        } else if (w.allocation) {
          seen.start = w.allocation;
          seen.end = w.allocation + w.allocation_size;
        }
        seen.at = lo;
        if (!allocations && !w.pool) w.allocation = 0;  // as when not looked up
        seen.w = w;
      }
      int k = w.host ? 1 : 0;
      if (kind >= 0 && kind != k)
        throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                    std::string(sname) + " mixes host and GPU tensors (" + side_name(sname, r) + " is " +
                        (w.host ? "host memory" : "GPU memory") + "); one side is all host or all GPU");
      kind = k;
      if (!w.host)
        FERRY_ARG_CHECK(w.device == device_, side_name(sname, r) + " is on cuda:" + std::to_string(w.device) +
                                                 " but the transfer runs on cuda:" + std::to_string(device_));
      if (w.pool) out.pools.push_back(w.pool);
      (side == 0 ? out.dst : out.src).regions[r].allocation = w.allocation;
      KernelRegion& kr = out.kernel_regions[r];
      (side == 0 ? kr.dst : kr.src) = w.device_address;
      (side == 0 ? kr.dst_stride : kr.src_stride) = g.stride;
      kr.bytes = g.bytes;
    }
  }
  bool dh = dst_host == 1, sh = src_host == 1;
  out.direction = sh && !dh   ? Direction::kHostToDevice
                  : !sh && dh ? Direction::kDeviceToHost
                  : sh && dh  ? Direction::kHostToHost
                              : Direction::kDeviceToDevice;
  return out;
}

Direction PageCopier::direction(const PageSide& dst, const PageSide& src) {
  check_sides(dst, src);
  return locate(dst, src, nullptr).direction;
}

void PageCopier::note_pools(const Located& where, cudaStream_t stream) {
  if (where.pools.empty()) return;
  if (dma::is_capturing(stream)) {
    // A graph replays these copies whenever it is launched: its pools stay for
    // the life of the process, and close() refuses them.
    for (const auto& p : where.pools) {
      p->keep_for_graph();
      captured_pools_.push_back(p);
    }
    return;
  }
  HostPool* last = nullptr;
  for (const auto& p : where.pools)
    if (p.get() != last) {
      p->note_use(stream);
      last = p.get();
    }
}

void PageCopier::run_copies(PageStrategy s, const std::vector<PitchedCopy>& copies, const PageCopyOptions& o,
                            Direction d, cudaStream_t stream) {
  // Any order only for a source no earlier stream work can still write: host
  // memory read by a fetch, when the caller vouches for it.
  const bool any_order = o.settled_source && d == Direction::kHostToDevice;
  if (o.slice_bytes > 0 && s != PageStrategy::kKernel) {
    run_sliced(s, copies, o.slice_bytes, any_order, stream);
    return;
  }
  switch (s) {
    case PageStrategy::kPerPage:
    case PageStrategy::kBatched:
      submit(s, stream, copies, any_order, page_batch_size(d, true, copies, dma::copies_per_batch_call()));
      return;
    case PageStrategy::kStreams: {
      auto parts = split_by_bytes(copies, static_cast<size_t>(engines_->peer_count()));
      if (parts.size() <= 1) {
        dma::copy_pitched(stream, copies, any_order);
        return;
      }
      const int n = static_cast<int>(parts.size());
      engines_->fork(stream, n);
      try {
        // Each part from a thread of its own, at the same time: one thread
        // submitting every part was slower than one batched submission.
        submit_->run(n, [&](int i) {
          std::vector<PitchedCopy> part(copies.begin() + static_cast<long>(parts[i].first),
                                        copies.begin() + static_cast<long>(parts[i].second));
          dma::copy_pitched(engines_->peer(i), part, any_order);
        });
      } catch (...) {
        // What was queued still runs: the caller's stream waits for it, so
        // the pools it reads stay in use until then.
        try {
          engines_->join(stream, n);
        } catch (...) {
        }
        throw;
      }
      engines_->join(stream, n);
      return;
    }
    case PageStrategy::kKernel:
      break;
  }
  throw_error(FERRY_ERROR_INTERNAL, "run_copies: the kernel strategy takes no copy list");
}

// One slice after another over kSliceStreams streams, each slice waiting for
// the one kSlicesQueued before it: at most that many slices are on the copy
// engine at once, and the engine is never idle while slices are left. The
// 'streams' strategy's spread makes no sense here: its slices are batched.
void PageCopier::run_sliced(PageStrategy s, const std::vector<PitchedCopy>& copies, size_t slice_bytes, bool any_order,
                            cudaStream_t stream) {
  const auto slices = slice_copies(copies, slice_bytes);
  if (slices.size() <= 1) {
    submit(s, stream, copies, any_order);
    return;
  }
  for (cudaStream_t st : slice_streams_) engines_->order(stream, st);
  try {
    for (size_t k = 0; k < slices.size(); ++k) {
      cudaStream_t st = slice_streams_[k % kSliceStreams];
      if (k >= kSlicesQueued)
        FERRY_CUDA_CHECK(cudaStreamWaitEvent(st, slice_done_[(k - kSlicesQueued) % kSliceStreams], 0));
      submit(s, st, slices[k], any_order);
      FERRY_CUDA_CHECK(cudaEventRecord(slice_done_[k % kSliceStreams], st));
    }
  } catch (...) {
    // The slices already queued still run: the caller's stream waits for
    // them, so that no later work reuses their buffers under them.
    for (cudaStream_t st : slice_streams_) {
      try {
        engines_->order(st, stream);
      } catch (...) {
      }
    }
    throw;
  }
  for (cudaStream_t st : slice_streams_) engines_->order(st, stream);
}

void* PageCopier::stage(size_t bytes, cudaStream_t stream, bool capturing) {
  if (capturing) {
    // A graph replays the kernel with these very addresses: the staging must
    // outlive it, so it is never reused.
    void* p = nullptr;
    FERRY_CUDA_CHECK(cudaHostAlloc(&p, std::max<size_t>(bytes, 64), cudaHostAllocMapped | cudaHostAllocPortable));
    captured_staging_.push_back(p);
    return p;
  }
  Slot& s = slots_[next_slot_++ % slots_.size()];
  // The slot's previous kernel must be done reading it.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds(0, "timeout"));
  for (;;) {
    cudaError_t q = cudaEventQuery(s.done);
    if (q == cudaSuccess) break;
    if (q != cudaErrorNotReady) FERRY_CUDA_CHECK(q);
    if (std::chrono::steady_clock::now() > deadline)
      throw_error(FERRY_ERROR_TIMEOUT,
                  "kernel page transfer: an earlier transfer's kernel has not finished within "
                  "FERRY_TIMEOUT_S; its stream is stuck");
    std::this_thread::yield();
  }
  if (s.capacity < bytes) {
    // Not freed now: cudaFreeHost waits for the whole device, which an armed
    // gate may hold. Capacities at least double, so what is kept aside is
    // less than what is in use.
    if (s.host) captured_staging_.push_back(s.host);
    s.host = nullptr;
    size_t cap = std::max<size_t>({bytes, 2 * s.capacity, size_t(64) << 10});
    FERRY_CUDA_CHECK(cudaHostAlloc(&s.host, cap, cudaHostAllocMapped | cudaHostAllocPortable));
    s.capacity = cap;
  }
  (void)stream;
  return s.host;
}

uint32_t* PageCopier::stage_marks(uint64_t words, bool capturing) {
  // A graph launched again clears and marks the same words: they must outlive it.
  if (capturing) {
    void* p = nullptr;
    FERRY_CUDA_CHECK(cudaMalloc(&p, words * sizeof(uint32_t)));
    kept_marks_.push_back(p);
    return static_cast<uint32_t*>(p);
  }
  Slot& s = slots_[(next_slot_ - 1) % slots_.size()];
  if (s.mark_words < words) {
    // Not freed now: cudaFree waits for the whole device, which an armed
    // gate may hold. At least doubled, and 64K pages' worth at first.
    if (s.marks) kept_marks_.push_back(s.marks);
    s.marks = nullptr;
    const uint64_t cap = std::max<uint64_t>({words, 2 * s.mark_words, 2 * page_mark_words(uint64_t(1) << 16)});
    FERRY_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&s.marks), cap * sizeof(uint32_t)));
    s.mark_words = cap;
  }
  return s.marks;
}

int PageCopier::run_kernel(Located& where, const PageSide& dst, const PageSide& src, const void* dst_ids,
                           const void* src_ids, bool is_64, size_t n, const PageCopyOptions& o, cudaStream_t stream,
                           const void* host_dst_ids, const void* host_src_ids) {
  FERRY_ARG_CHECK(!o.zero_sm, "mode='kernel' launches a kernel, which zero_sm=True forbids");
  const uint64_t chunk = o.kernel_chunk ? o.kernel_chunk : kDefaultChunk;
  auto& regions = where.kernel_regions;
  const KernelWork work = plan_kernel_work(regions, dst, src, chunk);
  if (work.units_per_page == 0 || n == 0) return 0;
  const bool capturing = dma::is_capturing(stream);
  const size_t id_bytes = is_64 ? 8 : 4;
  const size_t regions_bytes = regions.size() * sizeof(KernelRegion);
  const size_t ids_bytes = host_dst_ids ? 2 * n * id_bytes : 0;
  char* staging = static_cast<char*>(stage(regions_bytes + ids_bytes, stream, capturing));
  std::memcpy(staging, regions.data(), regions_bytes);
  if (host_dst_ids) {
    std::memcpy(staging + regions_bytes, host_dst_ids, n * id_bytes);
    std::memcpy(staging + regions_bytes + n * id_bytes, host_src_ids, n * id_bytes);
    dst_ids = staging + regions_bytes;
    src_ids = staging + regions_bytes + n * id_bytes;
  }
  PageKernelArgs a;
  a.regions = reinterpret_cast<const KernelRegion*>(staging);
  a.nregions = static_cast<int>(regions.size());
  a.units_per_page = work.units_per_page;
  a.chunk = chunk;
  a.src_ids = src_ids;
  a.dst_ids = dst_ids;
  a.ids_64 = is_64;
  a.pages = n;
  a.vec16 = work.vec16;
  // Lists read in place were not checked on the host: the kernel checks each
  // entry against the page counts and reports the first bad one.
  a.error = host_dst_ids ? nullptr : kernel_error_device_;
  a.dst_pages = work.dst_pages;
  a.src_pages = work.src_pages;
  if (a.error && work.dst_pages > 0) {
    // Nor were they checked for a destination page named twice, which the
    // kernel would write from two sources at once.
    uint32_t* marks = stage_marks(2 * page_mark_words(work.dst_pages), capturing);
    launch_page_marks(dst_ids, is_64, n, work.dst_pages, marks, a.error, stream);
    a.repeated = marks + page_mark_words(work.dst_pages);
  }
  const int threads = o.kernel_threads ? o.kernel_threads : kDefaultThreads;
  const int blocks = kernel_blocks(n * work.units_per_page, threads, o.kernel_blocks, kDefaultBlocks, sm_count_);
  launch_page_kernel(a, blocks, threads, stream);
  if (!capturing) FERRY_CUDA_CHECK(cudaEventRecord(slots_[(next_slot_ - 1) % slots_.size()].done, stream));
  return blocks;
}

PageCopyReport PageCopier::copy(const PageSide& dst, const PageSide& src, const PageIds& dst_ids,
                                const PageIds& src_ids, const PageCopyOptions& o, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  RelaxedCaptureScope relax(dma::is_capturing(stream));
  check_kernel_errors();
  check_sides(dst, src);
  const bool may_pitch = pitch_possible(o.pitched, o.strategy, dst.regions.size());
  Located where = locate(dst, src, stream, may_pitch);
  // (A transfer of nothing has no memory to tell its direction by: let it through.)
  FERRY_ARG_CHECK(!(o.zero_sm && where.direction == Direction::kDeviceToDevice && request_bytes(dst, dst_ids.count)),
                  "zero_sm=True: " + within_one_gpu(device_) +
                      "; call it with zero_sm=False (mode='kernel' is the "
                      "fastest copy within a GPU)");
  const bool pitched = may_pitch && pitch_direction(where.direction);
  PageCopyReport rep;
  rep.direction = where.direction;
  rep.bytes = request_bytes(dst, dst_ids.count);
  DeviceScope on_device(device_);
  FERRY_ARG_CHECK(dst_ids.is_64 == src_ids.is_64, "dst_ids and src_ids must have one integer width");
  const size_t max_pitch = pitched ? max_pitch_ : 0;
  // The kernel reads the lists itself: it needs them checked and its rows
  // counted, not a copy made for every page of every tensor.
  const bool may_run_kernel = o.strategy ? *o.strategy == PageStrategy::kKernel : !o.zero_sm;
  std::vector<PitchedCopy> copies;
  size_t rows = 0;
  if (may_run_kernel) {
    rows = count_page_rows(where.dst, where.src, dst_ids, src_ids, o.merge, max_pitch, pitched_row_bytes());
  } else {
    copies = plan_page_rows(where.dst, where.src, dst_ids, src_ids, o.merge, max_pitch, pitched_row_bytes());
    for (const auto& c : copies) rows += c.rows;
  }
  // auto looks at rows, not copies: its table was measured with a copy per
  // page and tensor, and pitched copies save the host's time per row, not
  // the copy engine's. With Qwen2.5-0.5B's 4 KB pages in one allocation per
  // side the kernel still fetched 32K tokens in 11.4 ms against the pitched
  // copies' 19.2.
  PageStrategy s = o.strategy ? *o.strategy : select_page_strategy(rules_, where.direction, rows, rep.bytes, o.zero_sm);
  FERRY_ARG_CHECK(!(o.zero_sm && uses_sm(s)), "mode='kernel' launches a kernel, which zero_sm=True forbids");
  rep.strategy = s;
  if (may_run_kernel && s != PageStrategy::kKernel)  // counting checked the lists
    copies = plan_page_rows(where.dst, where.src, dst_ids, src_ids, o.merge, max_pitch, pitched_row_bytes(),
                            /*validated=*/true);
  if (s == PageStrategy::kKernel) {
    rep.copies = rows;  // it takes a pitched copy's rows one by one
  } else {
    for (const auto& c : copies) {
      // The baseline takes a pitched copy's rows one by one.
      rep.copies += s == PageStrategy::kPerPage ? c.rows : 1;
      rep.pitched += s != PageStrategy::kPerPage && c.rows > 1;
    }
  }
  if (rows == 0) return rep;
  cudaStream_t run = stream;
  if (o.urgent)
    run = urgent_;
  else if (runs_on_own_stream(s, dma::is_legacy_default(stream)))
    run = engines_->main();
  if (run != stream) engines_->order(stream, run);
  try {
    if (s == PageStrategy::kKernel) {
      rep.sms = run_kernel(where, dst, src, nullptr, nullptr, dst_ids.is_64, dst_ids.count, o, run, dst_ids.data,
                           src_ids.data);
    } else {
      run_copies(s, copies, o, where.direction, run);
    }
  } catch (...) {
    // Copies queued before the failure still run: their pools stay in use
    // until the stream passes them.
    try {
      if (run != stream) engines_->order(run, stream);
      note_pools(where, stream);
    } catch (...) {
    }
    throw;
  }
  if (run != stream) engines_->order(run, stream);
  note_pools(where, stream);
  return rep;
}

PageCopyReport PageCopier::copy_device_ids(const PageSide& dst, const PageSide& src, const DeviceIds& ids,
                                           const PageCopyOptions& o, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  RelaxedCaptureScope relax(dma::is_capturing(stream));
  check_kernel_errors();
  check_sides(dst, src);
  FERRY_ARG_CHECK(!o.strategy || *o.strategy == PageStrategy::kKernel,
                  "index lists in GPU memory are read in place by the kernel strategy only; copy them to the host "
                  "for copy-engine strategies");
  FERRY_ARG_CHECK(ids.count == 0 || (ids.dst && ids.src), "dst_ids/src_ids: null pointer with a non-zero count");
  // The kernel checks each entry's range; which pages the lists name is not
  // known here, so regions that could race for some lists are refused.
  check_layouts(dst, src);
  Located where = locate(dst, src, stream);
  PageCopyReport rep;
  rep.direction = where.direction;
  rep.strategy = PageStrategy::kKernel;
  rep.bytes = request_bytes(dst, ids.count);
  rep.copies = ids.count * dst.regions.size();
  if (ids.count == 0) return rep;
  DeviceScope on_device(device_);
  cudaStream_t run = stream;
  if (o.urgent) {
    engines_->order(stream, urgent_);
    run = urgent_;
  }
  rep.sms = run_kernel(where, dst, src, ids.dst, ids.src, ids.is_64, ids.count, o, run, nullptr, nullptr);
  if (o.urgent) engines_->order(urgent_, stream);
  note_pools(where, stream);
  return rep;
}

PreparedPages::PreparedPages(int device, const PageSide& dst, const PageSide& src, const PageIds& dst_ids,
                             const PageIds& src_ids, PageStrategy strategy, bool merge, bool pitched)
    : device_(device), strategy_(strategy) {
  FERRY_ARG_CHECK(!uses_sm(strategy),
                  "prepare: mode='kernel' cannot be prepared (an armed kernel would hold its "
                  "SMs while it waits); prepared transfers run on copy engines");
  DeviceScope on_device(device);
  PageCopier& copier = PageCopier::on(device);
  check_sides(dst, src);
  const bool may_pitch = pitch_possible(pitched, strategy, dst.regions.size());
  auto where = copier.locate(dst, src, nullptr, may_pitch);
  FERRY_ARG_CHECK(where.direction != Direction::kDeviceToDevice || request_bytes(dst, dst_ids.count) == 0,
                  "prepare: " + within_one_gpu(device) +
                      ", and a prepared transfer runs on copy engines only; use copy_blocks for it");
  direction_ = where.direction;
  pitched = may_pitch && pitch_direction(direction_);
  pools_ = where.pools;
  copies_ = plan_page_rows(where.dst, where.src, dst_ids, src_ids, merge, pitched ? copier.max_pitch() : 0,
                           pitched_row_bytes());
  bytes_ = request_bytes(dst, dst_ids.count);
  // What fills the stream's queue behind the gate is host calls, not copies
  // or rows (submission_calls).
  const size_t calls = calls_ =
      submission_calls(copies_, strategy == PageStrategy::kPerPage, dma::copies_per_batch_call());
  const size_t most = static_cast<size_t>(knob_int_in("FERRY_KV_ARMED_MAX"));
  FERRY_ARG_CHECK(calls <= most,
                  "prepare: " + std::to_string(calls) +
                      " host calls to enqueue after merging runs (a batched call takes up to FERRY_BATCH_MAX plain "
                      "copies, a pitched copy one, mode='per_page' one per copy); at most " +
                      std::to_string(most) +
                      " may wait behind a gate (FERRY_KV_ARMED_MAX: a stream's queue is finite, and the host would "
                      "block while enqueueing); split the transfer");
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&finished_, cudaEventDisableTiming));
  gate_->hold_while_armed(hold_name());
  for (const auto& p : pools_) p->add_prepared();  // last: the destructor drops it
}

std::string PreparedPages::hold_name() const {
  return std::string("a prepared page transfer (") + (direction_ == Direction::kHostToDevice ? "fetch" : "save") +
         ", " + std::to_string(bytes_) + " bytes) armed on cuda:" + std::to_string(device_) + " and not yet triggered";
}

PreparedPages::~PreparedPages() {
  try {
    DeviceScope on_device(device_);
    // Never leave the stream waiting on a gate nobody will open (a device
    // trigger handed out may never fire). Opening twice is harmless: the wait
    // is for at least the generation. Queued copies cannot be withdrawn, so an
    // armed transfer that is released runs them.
    // A trigger handed out (to a stream or a kernel) that has not landed may
    // still write the word: it must never open another gate's work, so the
    // word is kept out of the pool.
    if (armed_ && opened_ && !gate_->is_open()) gate_->keep();
    if (armed_) gate_->open();
    for (auto& g : retired_gates_) g->open();  // their triggers may never land
    // The gate's word goes back to the pool with this object: the stream must
    // be past its wait first. Bounded; past the bound the word is kept.
    if (ran_) synchronize(teardown_timeout_seconds());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ferry: a prepared page transfer was released unfinished (%s); its gate is kept\n", e.what());
    gate_->keep();
  }
  for (const auto& p : pools_) p->drop_prepared();
  if (stream_) cudaStreamDestroy(stream_);  // returns at once; CUDA frees it once its work is done
  if (finished_) cudaEventDestroy(finished_);
  cudaGetLastError();
}

void PreparedPages::arm(cudaStream_t after) {
  FERRY_ARG_CHECK(!armed_ || opened_, "arm: the transfer is armed already; trigger it before arming it again");
  FERRY_ARG_CHECK(!(after && dma::is_capturing(after)),
                  "arm: the stream is capturing a CUDA graph; capture copy_blocks itself instead of arming");
  const int stream_device = dma::stream_device(after, device_);
  FERRY_ARG_CHECK(stream_device == device_, "arm: the stream belongs to cuda:" + std::to_string(stream_device) +
                                                " but the transfer is on cuda:" + std::to_string(device_));
  DeviceScope on_device(device_);
  wait_for_earlier_triggers();
  cudaEvent_t e = nullptr;
  FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(e, after);
  const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(stream_, e, 0) : recorded;
  cudaEventDestroy(e);
  FERRY_CUDA_CHECK(waited);
  // Armed again before the last trigger handed out landed: that trigger (a
  // stream write, a kernel's store) writes the last generation whenever it
  // lands, which on a shared word could undo a later open. This arming waits
  // on a word of its own; the old one opens only the run it was meant for.
  if (armed_ && opened_ && !gate_->is_open()) {
    gate_->keep();
    retired_gates_.push_back(std::move(gate_));
    retired_runs_.push_back(gate_run_);
    gate_ = std::make_unique<HostGate>();
    gate_->hold_while_armed(hold_name());
  }
  gate_->arm(stream_);
  gate_run_ = runs_++;
  // From here the stream waits on the gate: whatever fails below, the
  // destructor must open it and wait for the stream to pass the wait, which
  // finished_, recorded after it, tells.
  armed_ = true;
  opened_ = false;
  ran_ = true;
  try {
    submit(strategy_, stream_, copies_, false);
  } catch (...) {
    if (cudaEventRecord(finished_, stream_) != cudaSuccess) {
      cudaGetLastError();
      gate_->keep();  // no way to tell when the stream is past its wait
    }
    for (const auto& p : pools_) p->note_use(stream_);  // what was queued still reads and writes them
    throw;
  }
  FERRY_CUDA_CHECK(cudaEventRecord(finished_, stream_));
  for (const auto& p : pools_) p->note_use(stream_);
}

size_t PreparedPages::queued_runs() const {
  std::vector<size_t> shut;
  for (size_t k = 0; k < retired_gates_.size(); ++k)
    if (!retired_gates_[k]->is_open()) shut.push_back(retired_runs_[k]);
  if (armed_ && opened_ && !gate_->is_open()) shut.push_back(gate_run_);
  return xfer::runs_behind_a_shut_gate(runs_, shut);
}

// Armed again while triggers handed out before (to a stream or a kernel)
// have not landed: those runs, and every run armed after the oldest of them,
// still wait on this stream, and this run's calls go behind them. Past what
// a queue takes behind a wait the host would block inside CUDA until those
// triggers fire, forever where one fires only after arm() returns (a kernel
// launched next): wait for them here, bounded, before anything is enqueued.
void PreparedPages::wait_for_earlier_triggers() {
  const auto too_many = [this] {
    return rearm_must_wait(queued_runs(), calls_, dma::kQueueOpsBehindAWait);
  };
  if (!too_many()) return;
  const double timeout_s = teardown_timeout_seconds();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (too_many()) {
    if (std::chrono::steady_clock::now() > deadline) {
      const size_t behind = queued_runs();
      throw_error(FERRY_ERROR_TIMEOUT,
                  "arm: " + std::to_string(behind) + " earlier run(s) of this transfer (" +
                      std::to_string(behind * calls_) +
                      " host calls) wait behind a trigger handed out (to a "
                      "stream or a kernel) that has not landed after " +
                      std::to_string(timeout_s) + " s (FERRY_TIMEOUT_S), and this arming's " + std::to_string(calls_) +
                      " more would pass what a stream's queue takes behind a wait (" +
                      std::to_string(dma::kQueueOpsBehindAWait) +
                      ") and block the host: fire that trigger (launch its kernel, or let its stream reach it) "
                      "before arming again");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void PreparedPages::trigger() {
  FERRY_ARG_CHECK(armed_ && !opened_, "trigger: the transfer is not armed; call arm() first");
  gate_->open();
  opened_ = true;
}

void PreparedPages::trigger_on(cudaStream_t stream) {
  FERRY_ARG_CHECK(armed_ && !opened_, "trigger_on: the transfer is not armed; call arm() first");
  DeviceScope on_device(device_);
  gate_->open_on(stream);
  opened_ = true;
}

std::pair<uint64_t*, uint64_t> PreparedPages::device_trigger() {
  FERRY_ARG_CHECK(armed_ && !opened_, "device_trigger: the transfer is not armed; call arm() first");
  opened_ = true;  // handed to a kernel
  return gate_->device_trigger();
}

void PreparedPages::wait(cudaStream_t stream) {
  if (!ran_) return;
  DeviceScope on_device(device_);
  FERRY_CUDA_CHECK(cudaStreamWaitEvent(stream, finished_, 0));
}

std::string PreparedPages::why_unfinished() const {
  for (const auto& g : retired_gates_)
    if (!g->is_open())
      return "an earlier arming's trigger (handed to a stream or a kernel) has not landed, and its copies come "
             "first";
  return gate_->is_open() ? "its gate is open, so the copies themselves are stuck"
                          : "its gate was never opened (call trigger(), trigger_on() or fire the device trigger)";
}

void PreparedPages::synchronize(double timeout_s) {
  // (an infinite deadline is no time point at all)
  FERRY_ARG_CHECK(timeout_s >= 0 && timeout_s <= kMaxTimeoutS, "synchronize: timeout is " + std::to_string(timeout_s) +
                                                                   " s; expected 0 to " + std::to_string(kMaxTimeoutS) +
                                                                   " s");
  if (!ran_) return;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    cudaError_t q = cudaEventQuery(finished_);
    if (q == cudaSuccess) {
      sync::run_kept_frees();  // what a teardown kept while this transfer held its stream
      return;
    }
    if (q != cudaErrorNotReady) FERRY_CUDA_CHECK(q);
    if (std::chrono::steady_clock::now() > deadline)
      throw_error(FERRY_ERROR_TIMEOUT, std::string("prepared transfer: not finished after ") +
                                           std::to_string(timeout_s) + " s; " + why_unfinished());
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

}  // namespace xfer
}  // namespace ferry
