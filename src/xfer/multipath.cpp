#include "xfer/multipath.hpp"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/clock.hpp"
#include "core/cuda_scope.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "dma/engine.hpp"
#include "sync/holds.hpp"

namespace ferry {
namespace xfer {

namespace {

constexpr double kFirstCopiesS = 10.0;  // bound on the links' first copies
constexpr size_t kFirstBytes = 64;      // scratch for the links' first copies, before the probes' bytes

std::string error_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"; }

std::string dev_name(int d) { return "cuda:" + std::to_string(d); }

// FERRY_DEBUG's timing events: a failure to record one only loses the log's figure.
void clock_mark(cudaEvent_t e, cudaStream_t s) {
  if (cudaEventRecord(e, s) != cudaSuccess) cudaGetLastError();
}
float clock_us(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, from, to) == cudaSuccess) return ms * 1e3f;
  cudaGetLastError();
  return -1;
}

bool ranges_overlap(const void* a, const void* b, size_t n) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return x < y + n && y < x + n;
}

}  // namespace

MultipathEngine::MultipathEngine(const MultipathOptions& options)
    : links_(options.link_devices), policy_(options.policy), bytes_(options.link_devices.size()) {
  // Made while some thread captures a graph (e.g. at a first copy inside
  // one): its allocations and streams must not invalidate that capture.
  RelaxedCaptureScope relax;
  FERRY_ARG_CHECK(!links_.empty(), "link_devices: expected at least one GPU");
  // What needs no GPU is checked before CUDA is asked (it would say: no GPU).
  for (int d : links_)
    FERRY_ARG_CHECK(d >= 0, "link_devices: " + std::to_string(d) + " is no GPU ordinal; expected 0 or more");
  chunk_bytes_ =
      options.chunk_bytes ? options.chunk_bytes : static_cast<size_t>(knob_int_in("FERRY_MULTIPATH_CHUNK_BYTES"));
  // (Rounded up to staging units later: a size near 2^64 would wrap to none.
  // Below 64 KiB a copy would be cut into millions of chunks.)
  FERRY_ARG_CHECK(chunk_bytes_ >= (size_t{64} << 10) && chunk_bytes_ <= (size_t{1} << 40),
                  "chunk_bytes is " + std::to_string(chunk_bytes_) + "; expected 64 KiB (65536) to 1 TiB");
  min_chunk_ = static_cast<size_t>(knob_int_in("FERRY_MULTIPATH_MIN_CHUNK_BYTES"));
  threshold_ =
      options.threshold_bytes ? options.threshold_bytes : static_cast<size_t>(knob_int_in("FERRY_MULTIPATH_MIN_BYTES"));
  head_bytes_ = options.head_bytes != SIZE_MAX ? options.head_bytes
                                               : static_cast<size_t>(knob_int_in("FERRY_MULTIPATH_HEAD_BYTES"));
  FERRY_ARG_CHECK(options.own_share_on_stream >= -1 && options.own_share_on_stream <= 1,
                  "own_share_on_stream is " + std::to_string(options.own_share_on_stream) +
                      "; expected 0, 1 or -1 (FERRY_MULTIPATH_OWN_SHARE_ON_STREAM)");
  policy_.own_share_on_stream = options.own_share_on_stream >= 0 ? options.own_share_on_stream == 1
                                                                 : knob_int("FERRY_MULTIPATH_OWN_SHARE_ON_STREAM") != 0;
  FERRY_ARG_CHECK(options.timeout_s >= 0 && std::isfinite(options.timeout_s),
                  "timeout is " + std::to_string(options.timeout_s) + "; expected seconds, or 0 for FERRY_TIMEOUT_S");
  timeout_s_ = timeout_seconds(options.timeout_s, "timeout");
  policy_.keep_warm_s = knob_float_in("FERRY_MULTIPATH_KEEP_WARM_MS") * 1e-3;
  FERRY_ARG_CHECK(policy_.outstanding >= 1 && policy_.outstanding <= 16,
                  "outstanding is " + std::to_string(policy_.outstanding) + "; expected 1..16");
  int count = 0;
  FERRY_CUDA_CHECK(cudaGetDeviceCount(&count));
  for (int d : links_)
    FERRY_ARG_CHECK(d < count,
                    "link_devices: " + std::to_string(d) + " is not a GPU here (0.." + std::to_string(count - 1) + ")");
  const int n = static_cast<int>(links_.size());
  if (policy_.may_relay.empty()) policy_.may_relay.assign(n, true);
  FERRY_ARG_CHECK(static_cast<int>(policy_.may_relay.size()) == n, "may_relay: expected one entry per link");
  link_rate_.assign(n, 0);
  link_late_.assign(n, {});
  others_.assign(n, false);
  processes_on_ = options.processes_on;
  if (processes_on_) {
    // What the engine will look at from its thread: known now, or refused.
    for (int i = 0; i < n; ++i) {
      const int p = processes_on_(links_[i]);
      FERRY_ARG_CHECK(p >= 0, "relays='idle': the programs running on " + dev_name(links_[i]) +
                                  " cannot be listed (NVML is missing or refused); pass relays='all' or a list");
      others_[i] = gpu_runs_other_programs(p);
    }
  }

  // A relay's copy engine writes into (or reads from) the target over
  // NVLink: peer access both ways between every two GPUs. A GPU that cannot
  // reach every other carries only its own copies.
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      if (links_[i] == links_[j]) continue;
      int ok = 0;
      FERRY_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, links_[i], links_[j]));
      if (!ok) {
        if (policy_.may_relay[i])
          debug_log("multipath: " + dev_name(links_[i]) + " does not relay: it cannot reach " + dev_name(links_[j]) +
                    " peer to peer");
        policy_.may_relay[i] = false;
        continue;
      }
      DeviceScope on(links_[i]);
      const cudaError_t e = cudaDeviceEnablePeerAccess(links_[j], 0);
      if (e == cudaSuccess) continue;
      cudaGetLastError();
      if (e == cudaErrorPeerAccessAlreadyEnabled) continue;
      // (e.g. too many peers): that GPU carries only its own copies, as one
      // that cannot reach the other.
      if (policy_.may_relay[i])
        debug_log("multipath: " + dev_name(links_[i]) + " does not relay: peer access to " + dev_name(links_[j]) +
                  " failed: " + error_text(e));
      policy_.may_relay[i] = false;
    }

  try {
    set_up_links();
  } catch (...) {
    // Nothing was enqueued yet: what was made is let go at once (members such
    // as the staging and the board free themselves), and the error raised is
    // the setup's.
    try {
      destroy_link_handles();
      for (Link& L : link_)
        if (L.scratch) {
          DeviceScope on(L.device);
          cudaFree(L.scratch);
        }
    } catch (const std::exception&) {
    }
    if (host_scratch_) cudaFreeHost(host_scratch_);
    cudaGetLastError();
    throw;
  }
  thread_ = std::thread([this] { run(); });
  watchdog_ = std::thread([this] { watch(); });
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(std::min(timeout_s_, kFirstCopiesS) + 5.0),
                    [&] { return ready_; }))
    debug_log("multipath: the engine's thread did not finish its first copies within the timeout");
}

void MultipathEngine::set_up_links() {
  const int n = static_cast<int>(links_.size());
  // Pinned, as the copies' host side is: the links' first copies and probes.
  FERRY_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&host_scratch_),
                                 kFirstBytes + 2 * static_cast<size_t>(n) * kMultipathProbeBytes,
                                 cudaHostAllocPortable));
  link_.resize(n);
  for (int i = 0; i < n; ++i) {
    Link& L = link_[i];
    L.device = links_[i];
    DeviceScope on(L.device);
    // The greatest priority, meant for the stream operations around a chunk
    // where streams share hardware queues (CUDA_DEVICE_MAX_CONNECTIONS); not
    // verified. The copy engines ignore it: their order across streams is
    // first in, first out whatever the priority (measured).
    int least = 0, greatest = 0;
    FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&L.host, cudaStreamNonBlocking, greatest));
    FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&L.nvlink, cudaStreamNonBlocking, greatest));
    L.carried.assign(n, {});
    L.hop.resize(policy_.outstanding);
    L.landed.resize(policy_.outstanding);
    for (int s = 0; s < policy_.outstanding; ++s) {
      FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&L.hop[s], cudaEventDisableTiming));
      FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&L.landed[s], cudaEventDisableTiming));
    }
    if (debug_enabled()) {
      L.clock.resize(policy_.outstanding);
      for (auto& c : L.clock)
        for (auto& e : c) FERRY_CUDA_CHECK(cudaEventCreate(&e));
    }
    for (auto& pair : L.probe)
      for (auto& e : pair) FERRY_CUDA_CHECK(cudaEventCreate(&e));
    FERRY_CUDA_CHECK(cudaMalloc(&L.scratch, kFirstBytes + kMultipathProbeBytes));
  }
  // Staging only where the link may relay; a GPU short of memory relays
  // nothing, and the copy runs over fewer links.
  {
    const std::vector<int> need = relay_staging_need(links_, policy_.may_relay, policy_.outstanding);
    std::vector<std::vector<char*>> buffers;
    std::vector<std::string> why;
    staging_ = RelayStaging::make(links_, need, chunk_bytes_, &buffers, &why);
    for (int i = 0; i < n; ++i) {
      link_[i].staging = buffers[i];
      if (need[i] > 0 && buffers[i].empty()) {
        debug_log("multipath: " + dev_name(links_[i]) + " does not relay: " + why[i]);
        policy_.may_relay[i] = false;
      }
    }
    staging_where_ = staging_->where();
    debug_log("multipath: the relays' staging buffers: " + staging_where_);
  }
  // The link board, where there is something to relay over and the GPUs
  // have ids every process shares.
  if (policy_.board && knob_int("FERRY_MULTIPATH_BOARD") != 0 && n > 1) {
    board_gpu_.assign(n, std::nullopt);
    std::string why = "the GPUs have no UUID";
    bool named = false;
    for (int i = 0; i < n; ++i) {
      if (own_link(links_, links_[i]) != i) continue;  // a loopback relay: its GPU is the target's
      cudaDeviceProp prop{};
      if (const cudaError_t e = cudaGetDeviceProperties(&prop, links_[i]); e != cudaSuccess) {
        cudaGetLastError();
        why = dev_name(links_[i]) + "'s properties: " + error_text(e);
        named = false;
        break;
      }
      GpuId id{};
      std::memcpy(id.data(), prop.uuid.bytes, id.size());
      board_gpu_[i] = id;
      named = named || id != GpuId{};
    }
    if (named) board_ = LinkBoard::open("", &why);
    if (board_)
      board_token_ = LinkBoard::new_token();
    else
      debug_log("multipath: no link board: " + why + "; other programs' copies count only as the links' speeds");
  }
}

void MultipathEngine::destroy_link_handles() {
  for (Link& L : link_) {
    if (L.device < 0) continue;  // a setup that failed before this link
    DeviceScope on(L.device);
    for (auto e : L.hop)
      if (e) cudaEventDestroy(e);
    for (auto e : L.landed)
      if (e) cudaEventDestroy(e);
    for (auto& c : L.clock)
      for (auto e : c)
        if (e) cudaEventDestroy(e);
    for (auto& pair : L.probe)
      for (auto e : pair)
        if (e) cudaEventDestroy(e);
    if (L.host) cudaStreamDestroy(L.host);
    if (L.nvlink) cudaStreamDestroy(L.nvlink);
  }
}

// The links' first work, from the engine's thread, before any stream can wait
// on the engine: what the runtime and driver do on a thread's first calls and
// a stream's first work is not documented, and if any of it waits for the
// device while a caller's stream is held by a gate, it waits for good.
void MultipathEngine::first_copies() {
  try {
    uint64_t* host = host_scratch_;
    // The kinds of copy the engine makes: host to GPU and back on each link's
    // host stream, and GPU to GPU on its NVLink stream (to the next link's
    // GPU, as a relay's hop; to itself where there is one GPU).
    for (size_t i = 0; i < link_.size(); ++i) {
      Link& L = link_[i];
      Link& peer = link_[(i + 1) % link_.size()];
      DeviceScope on(L.device);
      char* mine = static_cast<char*>(L.scratch);
      FERRY_CUDA_CHECK(cudaMemcpyAsync(mine, host, 8, cudaMemcpyDefault, L.host));
      FERRY_CUDA_CHECK(cudaMemcpyAsync(host + 1 + i % 7, mine + 16, 8, cudaMemcpyDefault, L.host));
      FERRY_CUDA_CHECK(
          cudaMemcpyAsync(static_cast<char*>(peer.scratch) + 32, mine + 48, 8, cudaMemcpyDefault, L.nvlink));
    }
    if (!links_idle(std::min(timeout_s_, kFirstCopiesS)))
      debug_log("multipath: the links' first copies did not finish in time");
  } catch (const std::exception& e) {
    debug_log(std::string("multipath: the links' first copies failed: ") + e.what());
  }
}

MultipathEngine::~MultipathEngine() {
  try {
    close();
  } catch (const std::exception&) {  // said on stderr when the engine broke
  }
}

void MultipathEngine::close() {
  close_engine();
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty() && !error_told_) raise_error();
}

void MultipathEngine::close_engine() {
  bool drained = false, broken = false;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_), [&] { return unfinished_.empty() || broken_; });
    drained = unfinished_.empty() && !broken_;
    broken = broken_;
    stop_ = true;
    halted_ = true;  // no chunk after this: streams are let go below
    // Every stream that may still wait on a gate is let go before the
    // engine's thread is joined (it may be held in a CUDA call until then).
    open_every_gate();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (watchdog_.joinable()) watchdog_.join();
  withdraw_board();
  // The gates' words stay allocated: a stream may not have read them yet.
  std::vector<StreamGate*> gates;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& g : gates_) gates.push_back(&g);
  }
  for (StreamGate* g : gates) {
    // A copy of another thread past its closed_ check records its head's
    // events while it holds the gate's arm_mu (taken before mu_, as there).
    std::lock_guard<std::mutex> arm(*g->arm_mu);
    std::lock_guard<std::mutex> lock(mu_);
    g->gate->keep();
    g->reached->keep();
    g->head_done->keep();
    destroy_events(g->head_time);  // a pending event is released once it completes
  }
  if (!drained && !broken)
    std::fprintf(stderr,
                 "ferry: a multipath engine closed with copies not landed after %.0f s; their streams were let go and "
                 "their data is incomplete\n",
                 timeout_s_);
  // Memory a copy engine may still write stays.
  if (!links_idle(drained ? timeout_s_ : 1.0)) {
    static_cast<void>(staging_.release());  // kept for good, as above
    return;
  }
  destroy_link_handles();
  std::vector<std::pair<int, void*>> scratch;
  for (const Link& L : link_)
    if (L.scratch) scratch.emplace_back(L.device, L.scratch);
  link_.clear();
  // Freeing memory waits for every stream of the GPU: kept for later while an
  // armed transfer may hold one.
  std::shared_ptr<RelayStaging> staging(std::move(staging_));
  sync::free_when_unheld(
      [scratch, staging = std::move(staging), host = host_scratch_]() mutable {
        RelaxedCaptureScope relax;  // it may run on a thread that captures
        int caller = 0;             // the staging's teardown sets devices of its own
        cudaGetDevice(&caller);
        for (auto [device, p] : scratch) {
          DeviceScope on(device);
          cudaFree(p);
        }
        staging.reset();
        cudaFreeHost(host);
        cudaSetDevice(caller);
      },
      "a multipath engine's staging and scratch memory");
  host_scratch_ = nullptr;
}

std::string MultipathEngine::busy_links(double limit_s) {
  if (links_idle(limit_s)) return "";
  std::string out;
  for (const Link& L : link_)
    for (cudaStream_t s : {L.host, L.nvlink})
      if (cudaStreamQuery(s) != cudaSuccess) {
        cudaGetLastError();
        out += (out.empty() ? "" : ", ") + dev_name(L.device);
        break;
      }
  return out.empty() ? "none (a stream query failed)" : out;
}

bool MultipathEngine::links_idle(double limit_s) {
  const double until = steady_seconds() + limit_s;
  for (Link& L : link_)
    for (cudaStream_t s : {L.host, L.nvlink})
      while (true) {
        const cudaError_t q = cudaStreamQuery(s);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
          cudaGetLastError();
          return false;
        }
        if (steady_seconds() > until) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
  return true;
}

std::vector<size_t> MultipathEngine::bytes_by_link() const {
  std::vector<size_t> out;
  for (const auto& b : bytes_) out.push_back(b.load());
  return out;
}

void MultipathEngine::check() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!error_.empty()) raise_error();
}

void MultipathEngine::raise_error() {
  error_told_ = true;
  throw_error(FERRY_ERROR_BROKEN, error_);
}

void MultipathEngine::say_broken() {
  // Streams went on past copies that did not land, which nothing on them
  // shows (the transparent mode's program may never call ferry again):
  // said once, whatever FERRY_DEBUG is.
  if (said_broken_) return;
  said_broken_ = true;
  std::fprintf(stderr, "ferry: a multipath copy failed and its stream was let go; its data is incomplete: %s\n",
               error_.c_str());
}

void MultipathEngine::synchronize() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_) throw_error(FERRY_ERROR_CLOSED, "the multipath engine is closed");
    const uint64_t want = next_id_;
    if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_),
                      [&] { return unfinished_.empty() || *unfinished_.begin() > want || broken_; }))
      throw_error(FERRY_ERROR_TIMEOUT, "multipath synchronize: copies still in flight after " +
                                           std::to_string(timeout_s_) +
                                           " s (a copy starts when its stream gets to it: is that stream blocked?)");
  }
  check();
}

MultipathEngine::StreamGate* MultipathEngine::gate_for(int device, cudaStream_t stream) {
  const std::thread::id thread = stream == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id();
  auto find = [&]() -> StreamGate* {
    for (auto& g : gates_)
      if (g.device == device && g.stream == stream && g.thread == thread) return &g;
    return nullptr;
  };
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (StreamGate* g = find()) return g;
  }
  // Pinned allocations are CUDA calls: made outside mu_.
  auto gate = std::make_unique<HostGate>();
  auto reached = std::make_unique<HostGate>();
  auto head_done = std::make_unique<HostGate>();
  HeadTimes head_time{};
  for (auto& pair : head_time)
    for (auto& e : pair)
      if (cudaEventCreate(&e) != cudaSuccess) {
        cudaGetLastError();
        e = nullptr;  // that slot's heads go untimed
      }
  std::lock_guard<std::mutex> lock(mu_);
  if (StreamGate* g = find()) {  // another thread made it meanwhile
    destroy_events(head_time);
    return g;
  }
  gates_.push_back(StreamGate{device, stream, thread, std::move(gate), std::move(reached), std::move(head_done),
                              std::make_unique<std::mutex>(), 0, 0, head_time,
                              std::make_unique<std::atomic<uint64_t>>(0)});
  return &gates_.back();
}

MultipathReport MultipathEngine::copy(void* dst, const void* src, size_t bytes, cudaStream_t stream,
                                      int default_device) {
  return copy_batch({MultipathPiece{dst, src, bytes}}, stream, default_device);
}

MultipathReport MultipathEngine::copy_batch(const std::vector<MultipathPiece>& pieces, cudaStream_t stream,
                                            int default_device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw_error(FERRY_ERROR_CLOSED, "the multipath engine is closed");
  }
  check();
  // The pointer queries below must not invalidate a graph some thread
  // captures (a captured call itself runs as plain copies).
  RelaxedCaptureScope relax;
  MultipathReport r;
  const bool batch = pieces.size() != 1;
  auto name = [&](size_t i, const char* what) {
    // As both front ends name a batch's lists: dsts[i], srcs[i].
    return batch ? std::string(what) + "s[" + std::to_string(i) + "]" : std::string(what);
  };
  // Every copy checked and routed; a batch's copies share one direction and one GPU.
  std::vector<Piece> parts;
  MultipathRoute route;
  size_t total = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const MultipathPiece& p = pieces[i];
    if (p.bytes == 0) continue;
    FERRY_ARG_CHECK(p.dst != nullptr, name(i, "dst") + " is null");
    FERRY_ARG_CHECK(p.src != nullptr, name(i, "src") + " is null");
    for (const auto& [what, at] :
         {std::make_pair(name(i, "dst"), static_cast<const void*>(p.dst)), std::make_pair(name(i, "src"), p.src)}) {
      const std::string wraps = multipath_range_wraps(what.c_str(), at, p.bytes);
      FERRY_ARG_CHECK(wraps.empty(), wraps);
    }
    FERRY_ARG_CHECK(!ranges_overlap(p.dst, p.src, p.bytes), name(i, "dst") + " and " + name(i, "src") + " overlap");
    const PointerKind dk = pointer_kind(p.dst), sk = pointer_kind(p.src);
    const MultipathRoute here = route_multipath(dk.kind, dk.device, sk.kind, sk.device);
    for (const auto& [what, first, last] :
         {std::make_tuple(name(i, "dst"), dk, pointer_kind(static_cast<const char*>(p.dst) + p.bytes - 1)),
          std::make_tuple(name(i, "src"), sk, pointer_kind(static_cast<const char*>(p.src) + p.bytes - 1))}) {
      const std::string torn = multipath_range_end(what.c_str(), first.kind, first.device, last.kind, last.device);
      FERRY_ARG_CHECK(torn.empty(), torn + "; a copy's range must lie in one piece of memory (" +
                                        std::to_string(p.bytes) + " bytes from its start)");
    }
    FERRY_ARG_CHECK(here.error.empty(),
                    "multipath copy" + (batch ? " " + std::to_string(i) + " of the batch" : "") + ": " + here.error);
    if (parts.empty()) {
      route = here;
    } else {
      const auto way = [](const MultipathRoute& x) {
        return (x.to_device ? "host to " : "from ") + dev_name(x.device) + (x.to_device ? "" : " to host");
      };
      FERRY_ARG_CHECK(here.to_device == route.to_device && here.device == route.device,
                      name(i, here.to_device ? "dst" : "src") + ": copies " + way(here) +
                          "; expected every copy of a batch to go the way of the first (" + way(route) + ")");
      route.host_pinned = route.host_pinned && here.host_pinned;
    }
    parts.push_back(Piece{static_cast<char*>(p.dst), static_cast<const char*>(p.src), p.bytes, total});
    total += p.bytes;
  }
  if (total == 0) {
    r.reason = "zero bytes";
    return r;
  }
  if (parts.size() > 1) {
    // Two copies writing the same bytes would race: refused, not ordered.
    std::vector<const Piece*> by_dst;
    for (const Piece& p : parts) by_dst.push_back(&p);
    std::sort(by_dst.begin(), by_dst.end(), [](const Piece* a, const Piece* b) { return a->dst < b->dst; });
    for (size_t i = 1; i < by_dst.size(); ++i)
      FERRY_ARG_CHECK(by_dst[i - 1]->dst + by_dst[i - 1]->bytes <= by_dst[i]->dst,
                      "dsts: two destinations overlap (of " + std::to_string(by_dst[i - 1]->bytes) + " and " +
                          std::to_string(by_dst[i]->bytes) + " bytes); expected disjoint destinations");
  }

  // The stream's own GPU: its reached write and gate wait go there; the
  // chunks go to the copy's GPU.
  const int fallback = default_device >= 0 ? default_device : route.device;
  int stream_device;
  {
    DeviceScope on(fallback);  // a default stream's capture state is its GPU's
    stream_device = dma::stream_device(stream, fallback);
  }
  const int own = own_link(links_, route.device);
  int relays = 0;
  double own_fraction = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<bool> relaying = policy_.may_relay;
    for (size_t i = 0; i < links_.size(); ++i) {
      relaying[i] = relaying[i] && !others_[i];
      if (static_cast<int>(i) != own && relaying[i]) ++relays;
    }
    if (own >= 0)
      own_fraction =
          multipath_own_fraction(link_rate_, relaying, own, link_late_[own][MultipathScheduler::lane(route.to_device)]);
  }
  DeviceScope on(stream_device);
  MultipathCase facts;
  facts.bytes = total;
  facts.host_pinned = route.host_pinned;
  facts.usable_relays = relays;
  facts.threshold_bytes = threshold_;
  facts.device = route.device;
  facts.own_link = own >= 0;
  facts.capturing = dma::is_capturing(stream);
  const MultipathChoice choice = choose_multipath(facts);
  if (!choice.multipath) {
    debug_log("multipath copy of " + std::to_string(total) + " bytes" +
              (parts.size() > 1 ? " in " + std::to_string(parts.size()) + " pieces" : "") +
              " runs as plain copies: " + choice.reason);
    for (const Piece& p : parts) FERRY_CUDA_CHECK(cudaMemcpyAsync(p.dst, p.src, p.bytes, cudaMemcpyDefault, stream));
    r.reason = choice.reason;
    return r;
  }

  // The head: the caller's own stream copies it over the target's link at
  // once (only where that stream is the target GPU's), while the engine's
  // thread starts the rest. It is the start of the first copy. With
  // own_share_on_stream it is the target link's share (multipath_own_fraction):
  // the scheduler gives that link none of the rest.
  const MultipathSplit split = multipath_split(total, relays, head_bytes_, policy_.own_share_on_stream,
                                               parts.front().bytes, stream_device == route.device, own_fraction);
  const size_t head = split.head;
  void* head_dst = parts.front().dst;
  const void* head_src = parts.front().src;
  Transfer t;
  size_t chunks = 0;
  t.head = head;
  t.own_share_on_stream = split.own_share_on_stream;
  t.target = own;
  t.to_device = route.to_device;
  parts.front().dst += head;
  parts.front().src += head;
  parts.front().bytes -= head;
  std::vector<size_t> sizes;
  size_t at = 0;
  for (Piece& p : parts) {
    p.at = at;
    at += p.bytes;
    sizes.push_back(p.bytes);
  }
  t.pieces = std::move(parts);
  t.bytes = total - head;
  t.chunks = split_batch(
      sizes, multipath_chunk_bytes(t.bytes, split.rest_links, policy_.outstanding, chunk_bytes_, min_chunk_));
  t.gate = gate_for(stream_device, stream);
  {
    // The reached word's write, the head and the gate's wait go onto the
    // stream in the order of their generations: two threads copying on one
    // stream can never interleave them. Without a head the write and the wait
    // are one batch (both or neither); if anything fails after the write, its
    // generation is spent and opened, so no later copy starts on that write.
    std::lock_guard<std::mutex> arm(*t.gate->arm_mu);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) throw_error(FERRY_ERROR_CLOSED, "the multipath engine is closed");
      if (!error_.empty()) raise_error();
      t.generation = t.gate->armed + 1;  // only the holder of the gate's arm_mu changes it
    }
    const MemOp write{MemOp::Kind::kWrite, t.gate->reached->device_trigger().first, t.generation};
    const MemOp wait{MemOp::Kind::kWaitAtLeast, t.gate->gate->device_trigger().first, t.generation};
    if (head == 0) {
      dma::mem_ops(stream, {write, wait});
    } else {
      dma::mem_ops(stream, {write});
      try {
        // An own share is timed on the GPU: its time is the own link's speed.
        auto& slot = t.gate->head_time[t.generation % kHeadTimes];
        if (t.own_share_on_stream && slot[0] && slot[1]) {
          t.gate->timing->store(t.generation);
          t.head_timed = cudaEventRecord(slot[0], stream) == cudaSuccess;
          if (!t.head_timed) cudaGetLastError();
        }
        FERRY_CUDA_CHECK(cudaMemcpyAsync(head_dst, head_src, head, cudaMemcpyDefault, stream));
        if (t.head_timed && cudaEventRecord(slot[1], stream) != cudaSuccess) {
          cudaGetLastError();
          t.head_timed = false;
        }
        dma::mem_ops(stream,
                     {MemOp{MemOp::Kind::kWrite, t.gate->head_done->device_trigger().first, t.generation}, wait});
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        t.gate->armed = t.generation;
        t.gate->open(t.generation);
        throw;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    t.gate->armed = t.generation;
    if (broken_ || closed_) {
      // The engine broke (or closed) while the wait went on: it must not hold the stream.
      t.gate->open(t.generation);
      if (closed_) throw_error(FERRY_ERROR_CLOSED, "the multipath engine is closed");
      raise_error();
    }
    t.id = ++next_id_;
    unfinished_.insert(t.id);
    t.queued = steady_seconds();
    watched_[t.id] = Watched{t.gate, t.generation, t.queued};
    chunks = t.chunks.size();
    queued_.push_back(std::move(t));
  }
  cv_.notify_all();
  r.multipath = true;
  r.chunks = static_cast<int>(chunks) + (head ? 1 : 0);
  r.links = relays + 1;
  return r;
}

// A chunk's first CUDA call on its link: the whole copy on the target's own
// link; a relay's first hop into its staging buffer. `hop` keeps what the
// relay's second hop needs. False where a relay could not take it.
bool MultipathEngine::first_hop(Transfer& t, const Assignment& a, Hop* hop) {
  Link& L = link_[a.link];
  DeviceScope on(L.device);
  // The piece the chunk lies in (chunks never cross a piece's end).
  const auto piece = std::prev(std::upper_bound(t.pieces.begin(), t.pieces.end(), a.chunk.offset,
                                                [](size_t off, const Piece& p) { return off < p.at; }));
  *hop = Hop{&t,
             a,
             L.next_slot,
             piece->dst + (a.chunk.offset - piece->at),
             piece->src + (a.chunk.offset - piece->at),
             steady_seconds()};
  const size_t n = a.chunk.bytes;
  cudaStream_t first = !a.relay() || t.to_device ? L.host : L.nvlink;
  if (!L.clock.empty()) clock_mark(L.clock[hop->slot][0], first);
  if (!a.relay()) {
    FERRY_CUDA_CHECK(cudaMemcpyAsync(hop->dst, hop->src, n, cudaMemcpyDefault, L.host));
    if (!L.clock.empty()) {  // before `landed`: done once it is
      clock_mark(L.clock[hop->slot][1], L.host);
      clock_mark(L.clock[hop->slot][2], L.host);
    }
    FERRY_CUDA_CHECK(cudaEventRecord(L.landed[hop->slot], L.host));
    return true;
  }
  // Two streams per relay: while one chunk crosses NVLink, the next crosses
  // the host link into the other staging buffer.
  if (n > chunk_bytes_)
    throw_error(FERRY_ERROR_INTERNAL, "multipath: a relay chunk of " + std::to_string(n) +
                                          " bytes is larger than its staging buffer (" + std::to_string(chunk_bytes_) +
                                          ")");
  const cudaError_t e = cudaMemcpyAsync(L.staging[hop->slot], hop->src, n, cudaMemcpyDefault, first);
  if (e == cudaSuccess) return true;
  cudaGetLastError();
  return false;
}

// The rest of a chunk after first_hop(): a relay's second hop, from its
// staging buffer on to the target (or the host); then the chunk is in flight.
bool MultipathEngine::second_hop(const Hop& h) {
  Link& L = link_[h.a.link];
  if (h.a.relay()) {
    DeviceScope on(L.device);
    cudaStream_t first = h.t->to_device ? L.host : L.nvlink;
    cudaStream_t second = h.t->to_device ? L.nvlink : L.host;
    if (!L.clock.empty()) clock_mark(L.clock[h.slot][1], first);  // before `hop`, which `landed` follows
    cudaError_t e = cudaEventRecord(L.hop[h.slot], first);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(second, L.hop[h.slot], 0);
    if (e == cudaSuccess) e = cudaMemcpyAsync(h.dst, L.staging[h.slot], h.a.chunk.bytes, cudaMemcpyDefault, second);
    if (e == cudaSuccess && !L.clock.empty()) clock_mark(L.clock[h.slot][2], second);  // before `landed`
    if (e == cudaSuccess) e = cudaEventRecord(L.landed[h.slot], second);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
  }
  L.next_slot = (h.slot + 1) % policy_.outstanding;
  if (!h.t->link_first.empty() && h.t->link_first[h.a.link] == 0) h.t->link_first[h.a.link] = h.given;
  // A link's first chunk to or from a GPU in a direction is not timed: on
  // four H200s a relay's second hop in a new engine's first copy took 105-112
  // us for 2 MiB and 7-19 us after, and an own link's first 2 MiB out of its
  // GPU landed 2.7 ms after it went out, 46 us of it on the GPU
  // (docs/multipath.md). Timed, that one chunk kept the link out of short
  // copies until its estimate aged out.
  bool& before = L.carried[h.a.target][MultipathScheduler::lane(h.t->to_device)];
  const bool first = !before;
  before = true;
  // Given when its first call went out: the link's speed counts from then.
  L.flight.push_back(Link::InFlight{h.t->id, h.a.chunk.bytes, h.slot, h.given, first});
  return true;
}

// A relay that could not take a chunk: that chunk and the `count` - 1 given
// to it after it go back to their queues for the other links, and this link
// relays no more. (The target's own link failing is an error of the copy.)
void MultipathEngine::stop_relay(int link, int count, const std::string& why) {
  for (int i = 0; i < count; ++i) sched_->give_back(link);
  {
    std::lock_guard<std::mutex> lock(mu_);
    policy_.may_relay[link] = false;  // copy() sizes chunks by the relays left
  }
  debug_log("multipath: " + dev_name(link_[link].device) + " relays no more: " + why +
            "; its chunks go over the other links");
}

// Every chunk the links took in one pass. A chunk is submitted only once its
// copy's stream got to the copy (its reached word holds the copy's
// generation): a link stream never waits for a caller's stream, so copies of
// different streams can never hold each other up. Each link's first chunk starts with
// one CUDA call per link, relays first (their chunks cross two hops), before
// any relay's second hop: a relay's chunk takes five calls, and submitted link
// after link the last relay of an 8 MB copy started 30-45 us after the first.
// A link's later chunks follow in order, each whole, as before.
void MultipathEngine::submit_all(const std::vector<std::vector<Assignment>>& given,
                                 const std::function<Transfer&(int)>& transfer_of) {
  const int n = static_cast<int>(given.size());
  std::vector<int> order;
  for (int pass = 0; pass < 2; ++pass)
    for (int l = 0; l < n; ++l)
      if (!given[l].empty() && given[l].front().relay() == (pass == 0)) order.push_back(l);
  std::vector<Hop> first(n);
  std::vector<bool> started(n, false);
  for (int l : order) {
    if (halted_) return;  // the watchdog let the streams go: no chunk after that
    const Assignment& a = given[l].front();
    if (first_hop(transfer_of(a.transfer), a, &first[l]))
      started[l] = true;
    else
      stop_relay(l, static_cast<int>(given[l].size()), "its first hop failed");
  }
  for (int l : order) {
    if (!started[l]) continue;
    const int k = static_cast<int>(given[l].size());
    for (int i = 0; i < k; ++i) {
      if (halted_) return;
      Hop h = first[l];
      bool ok = i == 0 || first_hop(transfer_of(given[l][i].transfer), given[l][i], &h);
      // The streams may have been let go while the first hop went out (a
      // call held, the watchdog's release): no second hop into their buffers.
      if (ok && halted_) return;
      ok = ok && second_hop(h);
      if (!ok) {
        stop_relay(l, k - i, "a chunk's copy or event failed");
        break;
      }
    }
  }
}

// kMultipathProbeBytes over `l`'s host link in `lane`'s direction, on the
// stream its chunks of that direction cross the link on: it lands once every
// copy queued before it in that direction on that GPU, from any stream, has.
void MultipathEngine::probe(int l, int lane) {
  Link& L = link_[l];
  DeviceScope on(L.device);
  char* host = reinterpret_cast<char*>(host_scratch_) + kFirstBytes + (2 * l + lane) * kMultipathProbeBytes;
  char* dev = static_cast<char*>(L.scratch) + kFirstBytes;
  const size_t n = kMultipathProbeBytes;
  cudaError_t e = cudaEventRecord(L.probe[lane][0], L.host);
  if (e == cudaSuccess)
    e = lane == 0 ? cudaMemcpyAsync(dev, host, n, cudaMemcpyDefault, L.host)
                  : cudaMemcpyAsync(host, dev, n, cudaMemcpyDefault, L.host);
  if (e == cudaSuccess) e = cudaEventRecord(L.probe[lane][1], L.host);
  if (e == cudaSuccess) return;
  cudaGetLastError();
  probe_lost(l, lane, "the link of " + dev_name(L.device) + " failed: " + error_text(e));
}

// A probe that could not be sent, or whose landing reports an error: as a
// chunk a link cannot take, an error of its own GPU's copies (waiting, or on
// their way), and otherwise the link relays no more. No copy's bytes were in
// it, so a lane kept warm that fails between copies only retires its relay.
void MultipathEngine::probe_lost(int l, int lane, const std::string& why) {
  if (sched_->probe_failed(l, lane)) throw_error(FERRY_ERROR_CUDA, "multipath: " + why);
  bool was = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    was = policy_.may_relay[l];
    policy_.may_relay[l] = false;
  }
  // Said once: a lane kept warm probes again, and may fail again, until its time is up.
  if (was)
    debug_log("multipath: " + dev_name(link_[l].device) + " relays no more: " + why +
              "; copies go over the other links");
}

// Every chunk of `t` landed: its stream goes on.
void MultipathEngine::land(Transfer& t, double now) {
  // The stream goes on first: the debug line below (a string and a write to
  // stderr) would otherwise be in the time of every copy it describes.
  {
    std::lock_guard<std::mutex> lock(mu_);  // a waiter checks and sleeps under it: no lost wake-up
    t.gate->open(t.generation);
    unfinished_.erase(t.id);
    watched_.erase(t.id);
  }
  cv_.notify_all();
  if (debug_enabled()) {
    // Where the time went: a link whose last chunk landed well before the
    // others' was starved or held; a late first call is the engine's thread.
    auto us = [&](double at) { return std::to_string(static_cast<long>((at - t.started) * 1e6)); };
    auto ms = [](double at) {
      char b[32];
      std::snprintf(b, sizeof b, "%.3f", at * 1e3);
      return std::string(b);
    };
    std::string by_link = t.head ? "the caller's stream (head) " + std::to_string(t.head >> 10) + " KiB" : "";
    for (size_t l = 0; l < link_.size(); ++l) {
      if (!t.link_bytes[l]) continue;
      by_link += (by_link.empty() ? "" : ", ") + dev_name(link_[l].device) +
                 (static_cast<int>(l) == t.target ? " (own) " : " ") + std::to_string(t.link_bytes[l] >> 10) +
                 " KiB, first out at " + us(t.link_first[l]) + " us, last landed at " + us(t.link_last[l]) + " us";
      if (!link_[l].clock.empty())  // the last chunk on the GPU's clock
        by_link += static_cast<int>(l) == t.target
                       ? " (its last chunk " + std::to_string(static_cast<long>(t.link_hop1[l])) + " us on the GPU)"
                       : " (its last chunk's hops " + std::to_string(static_cast<long>(t.link_hop1[l])) + " + " +
                             std::to_string(static_cast<long>(t.link_hop2[l])) + " us on the GPU)";
      // The probe that cleared the link for this copy, if it went out near its start.
      const int lane = MultipathScheduler::lane(t.to_device);
      const double sent = sched_->probe_sent(static_cast<int>(l), lane), seen = link_[l].probe_seen[lane];
      if (seen >= sent && seen > t.queued - MultipathScheduler::kClearS && sent <= t.link_first[l])
        by_link += " (its probe out at " + us(sent) + " us, seen landed at " + us(seen) + " us, " +
                   std::to_string(static_cast<long>(link_[l].probe_gpu_us[lane])) + " us on the GPU)";
    }
    debug_log("multipath: a copy of " + std::to_string(t.bytes + t.head) + " bytes" +
              (t.pieces.size() > 1 ? " in " + std::to_string(t.pieces.size()) + " pieces" : "") +
              (t.to_device ? " into " : " from ") + dev_name(links_[t.target]) + " landed " +
              std::to_string(static_cast<long>((now - t.started) * 1e6)) +
              " us after the engine saw its stream get to it (at " + ms(t.started) +
              " ms on the steady clock, queued at " + ms(t.queued) + ", landed at " + ms(now) +
              " ms); by link: " + by_link);
  }
}

// After an error: the chunks already on the links finish (bounded), then
// every stream waiting on the engine goes on, and check() says why.
void MultipathEngine::fail_and_release(const std::string& message, std::deque<Transfer>& pending,
                                       std::deque<Transfer>& active) {
  debug_log("multipath: " + message + "; every stream waiting on a copy is let go");
  {
    // No chunk after this, and the first cause stays the one reported.
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = message;
    halted_ = true;
  }
  // The chunks on the links finish first, within the copies' own bound, so
  // that no copy writes a buffer after its stream went on: the buffer may be
  // another tensor's by then. Where they do not, the error says so. Link
  // streams never wait for callers' streams; should these calls be held
  // (lazy loading), the watchdog, still watching, lets the streams go.
  const std::string busy = busy_links(timeout_s_);
  std::lock_guard<std::mutex> lock(mu_);
  if (!busy.empty() && error_ == message)
    error_ += "; chunks on the links of " + busy + " had not landed " + std::to_string(timeout_s_) +
              " s later, when the streams were let go: they may still write the copies' buffers (keep them until "
              "those GPUs are idle)";
  broken_ = true;
  say_broken();
  open_every_gate();
  unfinished_.clear();
  watched_.clear();
  for (auto* list : {&pending, &active, &queued_}) list->clear();
  for (Link& L : link_) L.flight.clear();
  cv_.notify_all();
}

void MultipathEngine::open_every_gate() {
  for (auto& g : gates_) g.open(g.armed);
}

// The watchdog's thread makes no CUDA call, so it runs while every CUDA call
// of the process is blocked. That happens when a kernel is launched for the
// first time under lazy module loading while a copy holds its stream: the
// load waits for that stream, and the engine's copies, which would let the
// stream go, wait for the load. A copy not landed a second past the timeout
// after its stream got to it lets every stream go (a host store each), and
// the engine is broken.
void MultipathEngine::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(20));
    if (stop_ || broken_) continue;
    const double now = steady_seconds();
    for (auto& [id, w] : watched_) {
      if (w.reached_at == 0 && w.gate->reached->value() >= w.generation) w.reached_at = now;
      if (w.reached_at == 0) {
        // Its stream has not got to it: the work before it on that stream is
        // the program's, and may take any time; the debug log says so once.
        if (!w.said && now - w.queued_at > timeout_s_ && debug_enabled()) {
          w.said = true;
          debug_log("multipath: copy " + std::to_string(id) + " was armed " +
                    std::to_string(static_cast<long>(now - w.queued_at)) +
                    " s ago and its stream has not got to it (reached word " +
                    std::to_string(w.gate->reached->value()) + ", its generation " + std::to_string(w.generation) +
                    ", head done " + std::to_string(w.gate->head_done->value()) + ", gate opened to " +
                    std::to_string(w.gate->opened) +
                    "); where its stream copied earlier, another stream that keeps copies queued to the same GPU "
                    "can hold it there as long as it does (docs/multipath.md, Hazards)");
        }
        continue;
      }
      if (now - w.reached_at < timeout_s_ + 1.0) continue;
      if (error_.empty())
        error_ = "multipath: a copy did not land within " + std::to_string(timeout_s_) +
                 " s of its stream getting to it (the engine's thread held in a CUDA call, or its copies held "
                 "behind the waiting stream). Known causes: a kernel launched for the first time while a copy "
                 "holds its stream, under lazy module loading (CUDA_MODULE_LOADING=LAZY, the default: launch every "
                 "kernel once before, or set CUDA_MODULE_LOADING=EAGER), and under eager loading with streams "
                 "sharing few hardware queues (CUDA_DEVICE_MAX_CONNECTIONS 8, the default, or less: 32 makes it "
                 "rarer); cudaFree while a copy is in flight. Every stream was let go; copies not landed then are "
                 "incomplete";
      debug_log(error_);
      broken_ = true;
      say_broken();
      halted_ = true;
      open_every_gate();
      unfinished_.clear();
      watched_.clear();
      cv_.notify_all();
      break;
    }
  }
}

// Every kBoardLookS (soon after a copy starts, so that programs starting
// together see each other before their relays take chunks): posts each GPU
// and direction of the copies under way or just ended (board_posts; each to
// last kMultipathBoardHoldS unless renewed), withdraws the rest, and reserves
// links as board_reservations says.
// relays="idle": every kOtherProgramsLookS, which links' GPUs run another
// program; those relay nothing until they run none.
void MultipathEngine::look_for_other_programs(double now) {
  if (!processes_on_ || now - others_at_ < kOtherProgramsLookS) return;
  others_at_ = now;
  std::map<int, bool> by_gpu;  // loopback links share their GPU's answer
  for (int l = 0; l < static_cast<int>(links_.size()); ++l) {
    if (!by_gpu.count(links_[l])) by_gpu[links_[l]] = gpu_runs_other_programs(processes_on_(links_[l]));
    const bool others = by_gpu[links_[l]];
    bool was = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      was = others_[l];
      others_[l] = others;  // what copy() counts relays by
    }
    sched_->set_other_programs(l, others);
    if (others == was) continue;
    debug_log("multipath: " + dev_name(links_[l]) + (others ? " relays nothing" : " relays again") +
              " (relays='idle'): " + (others ? "another program runs on it" : "no other program runs on it"));
  }
}

void MultipathEngine::read_board(const std::deque<Transfer>& active, double now) {
  constexpr double kBoardLookS = 20e-6;
  if (!board_ || now - board_at_ < kBoardLookS) return;
  board_at_ = now;
  const int64_t at = LinkBoard::now_ns();
  const auto hold = static_cast<int64_t>(kMultipathBoardHoldS * 1e9);
  std::set<BoardKey> copying;
  for (const auto& t : active)
    if (board_gpu_[t.target]) copying.insert({t.target, MultipathScheduler::lane(t.to_device)});
  const std::set<BoardKey> under_way = board_posts(copying, &board_ended_, now);
  for (const auto& [link, lane] : board_posted_)
    if (!under_way.count({link, lane})) board_->post(*board_gpu_[link], lane, board_token_, 0);
  for (const auto& [link, lane] : under_way)
    if (!board_->post(*board_gpu_[link], lane, board_token_, at + hold) && !board_full_said_) {
      board_full_said_ = true;
      debug_log("multipath: the link board is full (" + std::to_string(LinkBoard::kSlots) +
                " slots, one per engine and GPU, taken): other programs cannot see this engine's copies "
                "and may relay over its links");
    }
  board_posted_ = under_way;
  const int n = static_cast<int>(board_gpu_.size());
  std::vector<GpuId> gpus;
  std::vector<int> of;
  std::vector<bool> on_board(n, false);
  // A link that cannot relay (not in `relays`, or relays="idle" and another
  // program on its GPU) is no spare link to share.
  const auto& may = sched_->policy().may_relay;
  for (int l = 0; l < n; ++l)
    if (board_gpu_[l])
      gpus.push_back(*board_gpu_[l]), of.push_back(l),
          on_board[l] = (may.empty() || may[l]) && !sched_->other_programs(l);
  const auto busy = board_->busy(gpus, board_token_, at);
  for (int lane = 0; lane < MultipathScheduler::kLanes; ++lane) {
    std::vector<bool> posted(n, false), targets(n, false);
    for (size_t k = 0; k < of.size(); ++k) posted[of[k]] = busy[k][lane];
    for (const auto& [link, l] : board_posted_)
      if (l == lane) targets[link] = true;
    const auto reserve = board_reservations(posted, targets, on_board);
    for (int l = 0; l < n; ++l) {
      if (reserve[l] != sched_->reserved(l, lane) && debug_enabled())
        debug_log("multipath: " + dev_name(links_[l]) + "'s link " + (reserve[l] ? "relays nothing" : "relays again") +
                  (lane == 0 ? " into" : " out of") + " other GPUs: " +
                  (reserve[l] ? "every GPU it could relay for is being copied by its own program"
                              : "a GPU's link is free of other programs' copies"));
      sched_->reserve(l, lane, reserve[l]);
    }
  }
}

void MultipathEngine::withdraw_board() {
  if (!board_) return;
  for (const auto& [link, lane] : board_posted_) board_->post(*board_gpu_[link], lane, board_token_, 0);
  board_posted_.clear();
  board_ended_.clear();
}

// The engine's thread: starts copies whose streams got to them, feeds every
// link that has room, retires chunks as they land, and lets each copy's
// stream go once all of its chunks landed.
void MultipathEngine::run() {
  // This thread's queries and copies never touch a captured stream: they must
  // not invalidate a graph that another thread captures meanwhile.
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  // Its short sleeps between polls are a copy's latency: Linux's default
  // timer slack (50 us) would stretch each 5 us sleep tenfold.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  first_copies();
  {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = true;
  }
  cv_.notify_all();
  const int n = static_cast<int>(links_.size());
  sched_ = std::make_unique<MultipathScheduler>(n, policy_);
  {
    // What the constructor saw of other programs (relays='idle'), until the first look.
    std::lock_guard<std::mutex> lock(mu_);
    for (int l = 0; l < n; ++l) sched_->set_other_programs(l, others_[l]);
  }
  auto& sched = sched_;
  std::deque<Transfer> pending;  // their streams have not got to them yet
  std::deque<Transfer> active;   // handed to the scheduler
  auto by_sched = [&](int sid) -> Transfer& {
    for (Transfer& t : active)
      if (t.sched == sid) return t;
    throw_error(FERRY_ERROR_INTERNAL, "multipath: a chunk of an unknown copy");
  };
  auto in_flight = [&] {
    for (const Link& L : link_)
      if (!L.flight.empty()) return true;
    return false;
  };
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Idle: posts kept over the gap to a next copy are withdrawn once it passed.
      // Lanes kept warm probe on time (MultipathPolicy::keep_warm_s).
      if (!in_flight() && pending.empty() && active.empty() && queued_.empty() && !stop_ && !sched->any_probing()) {
        const long us =
            multipath_idle_wait_us(board_posted_.empty() ? 100000 : 1000, sched->warm_due() - steady_seconds());
        cv_.wait_for(lock, std::chrono::microseconds(us));
      }
      if (stop_) break;
      if (broken_ && !in_flight() && pending.empty() && active.empty()) {
        cv_.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
      while (!queued_.empty()) {
        pending.push_back(std::move(queued_.front()));
        queued_.pop_front();
        pending.back().noticed = steady_seconds();
      }
    }
    bool progress = false;
    try {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (broken_) throw_error(FERRY_ERROR_BROKEN, error_);  // the watchdog let every stream go
      }
      const double t_now = steady_seconds();
      look_for_other_programs(t_now);
      // Start: copies whose streams got there, in the order they were made.
      for (auto it = pending.begin(); it != pending.end();) {
        if (it->gate->reached->value() < it->generation) {
          ++it;
          continue;
        }
        if (sched->idle() && active.empty()) sched->forget_transfers();  // ids stay small
        it->sched = sched->add(it->target, it->chunks, MultipathScheduler::lane(it->to_device), it->own_share_on_stream,
                               it->own_share_on_stream && it->head > 0);
        it->chunks.clear();
        it->deadline = t_now + timeout_s_;
        it->started = t_now;
        it->link_bytes.assign(n, 0);
        it->link_first.assign(n, 0);
        it->link_last.assign(n, 0);
        it->link_hop1.assign(n, 0);
        it->link_hop2.assign(n, 0);
        active.push_back(std::move(*it));
        it = pending.erase(it);
        progress = true;
      }
      // Copies on their way: their links probe while the streams get to
      // them, each for kClearS after this thread took it (not after it was
      // queued: a thread that came late still probes). A copy that started
      // meanwhile cleared its queue's expectation, so every one is set again.
      for (const Transfer& t : pending)
        if (t.target >= 0 && t_now - t.noticed < MultipathScheduler::kClearS)
          sched->expect(t.target, MultipathScheduler::lane(t.to_device), t.noticed);
      read_board(active, t_now);
      // Feed: every link idle in a direction where chunks wait probes it
      // first, then every link with room takes its next chunks. Probes go
      // before any chunk: a link that probed only after the clear links took
      // every chunk would sit out copy after copy of a stream of short ones.
      for (int l = 0; l < n; ++l)
        for (int lane; !halted_ && (lane = sched->start_probe(l, t_now)) >= 0;) probe(l, lane);
      if (!halted_) {
        std::vector<std::vector<Assignment>> given(n);
        for (int l = 0; l < n; ++l)
          for (Assignment a; sched->next(l, &a, t_now);) given[l].push_back(a);
        submit_all(given, by_sched);
      }
      // Retire what landed, oldest first on each link, and the probes.
      for (int l = 0; l < n; ++l) {
        Link& L = link_[l];
        for (int lane = 0; lane < MultipathScheduler::kLanes; ++lane) {
          if (!sched->probing(l, lane)) continue;
          const cudaError_t q = cudaEventQuery(L.probe[lane][1]);
          if (q == cudaErrorNotReady) continue;
          if (q != cudaSuccess) {
            cudaGetLastError();
            probe_lost(l, lane, "a probe on the link of " + dev_name(L.device) + " failed: " + error_text(q));
            progress = true;
            continue;
          }
          const double seen = steady_seconds();
          const double host_s = seen - sched->probe_sent(l, lane);
          float gpu_ms = 0;
          const bool timed = cudaEventElapsedTime(&gpu_ms, L.probe[lane][0], L.probe[lane][1]) == cudaSuccess;
          if (!timed) cudaGetLastError();
          const double waited = timed ? gpu_ms * 1e-3 : host_s;
          if (debug_enabled() &&
              (waited > MultipathScheduler::kPromptS || host_s > 10 * MultipathScheduler::kPromptS)) {
            const std::string said = "multipath: a probe " + std::string(lane == 0 ? "into " : "out of ") +
                                     dev_name(L.device) + " took " + std::to_string(static_cast<long>(waited * 1e6)) +
                                     " us on the GPU and " + std::to_string(static_cast<long>(host_s * 1e6)) +
                                     " us as the engine saw it: ";
            debug_log(said + (waited > MultipathScheduler::kPromptS
                                  ? "copies were queued there first; that link takes no chunk that way until one is "
                                    "prompt, unless no other link will take the copy"
                                  : "it started late (behind earlier work on its stream, or the GPU serving another "
                                    "context)"));
          }
          L.probe_seen[lane] = seen;
          L.probe_gpu_us[lane] = static_cast<float>(waited * 1e6);
          sched->probe_landed(l, lane, seen, waited);
          progress = true;
        }
        while (!L.flight.empty()) {
          const cudaError_t q = cudaEventQuery(L.landed[L.flight.front().slot]);
          if (q == cudaErrorNotReady) break;
          if (q != cudaSuccess) {
            cudaGetLastError();
            throw_error(FERRY_ERROR_CUDA, std::string("multipath: a chunk on the link of ") + dev_name(L.device) +
                                              " failed: " + error_text(q));
          }
          // The link's speed: from when it could start on the chunk (given,
          // or its previous chunk landed) to when the chunk was seen landed.
          const Link::InFlight& f = L.flight.front();
          const double seen = steady_seconds();
          if (!f.first) sched->observe(l, f.bytes, seen - std::max(f.given, L.last_landed), seen);
          L.last_landed = seen;
          for (Transfer& t : active)
            if (t.id == f.transfer) {
              t.link_bytes[l] += f.bytes;
              t.link_last[l] = seen;
              if (!L.clock.empty()) {
                const auto& c = L.clock[f.slot];
                t.link_hop1[l] = clock_us(c[0], c[1]);
                t.link_hop2[l] = clock_us(c[1], c[2]);
              }
            }
          bytes_[l] += f.bytes;
          L.flight.pop_front();
          sched->complete(l, seen);
          progress = true;
        }
      }
      // An own share landed: its time on the GPU's clock is the target
      // link's speed, and that link may probe again.
      for (Transfer& t : active)
        if (t.own_share_on_stream && t.head && !t.head_seen && t.gate->head_done->value() >= t.generation) {
          t.head_seen = true;
          sched->head_landed(t.sched);
          progress = true;
          if (!t.head_timed) continue;
          const auto& slot = t.gate->head_time[t.generation % kHeadTimes];
          float ms = 0;
          const bool timed = cudaEventElapsedTime(&ms, slot[0], slot[1]) == cudaSuccess;
          if (!timed) cudaGetLastError();
          // Not if a later copy on that stream recorded the slot again meanwhile.
          if (timed && ms > 0 && t.gate->timing->load() < t.generation + kHeadTimes)
            sched->observe(t.target, t.head, ms * 1e-3, steady_seconds());
        }
      if (progress) {
        // What copy() sizes the next own share by (the scheduler is this thread's only).
        std::lock_guard<std::mutex> lock(mu_);
        for (int l = 0; l < n; ++l) {
          link_rate_[l] = sched->share_rate(l, t_now);
          for (int lane = 0; lane < MultipathScheduler::kLanes; ++lane)
            link_late_[l][lane] = sched->share_late(l, lane, t_now);
        }
      }
      // Let each finished copy's stream go; a started copy has the timeout to land.
      for (auto it = active.begin(); it != active.end();) {
        if (sched->done(it->sched) && (!it->head || it->gate->head_done->value() >= it->generation)) {
          sched->finish(it->sched);
          if (board_ && board_gpu_[it->target])
            board_ended_[{it->target, MultipathScheduler::lane(it->to_device)}] = steady_seconds();
          bytes_[it->target] += it->head;
          land(*it, steady_seconds());
          it = active.erase(it);
          continue;
        }
        if (t_now > it->deadline) {
          std::string where, probing;
          const int lane = MultipathScheduler::lane(it->to_device);
          for (int l = 0; l < n; ++l) {
            for (const auto& f : link_[l].flight)
              if (f.transfer == it->id) where += (where.empty() ? "" : ", ") + dev_name(link_[l].device);
            if (sched->held(l, lane)) probing += (probing.empty() ? "" : ", ") + dev_name(link_[l].device);
          }
          if (!probing.empty())  // links kept out: copies queued there first, by their probes
            where += (where.empty() ? "none" : "") +
                     std::string("; links kept out by copies queued there first (their probes late or not landed): ") +
                     probing;
          throw_error(FERRY_ERROR_TIMEOUT, "multipath: a copy of " + std::to_string(it->bytes) + " bytes " +
                                               (it->to_device ? "into " : "from ") + dev_name(links_[it->target]) +
                                               " did not land within " + std::to_string(timeout_s_) +
                                               " s of its start; chunks still on the links of " +
                                               (where.empty() ? std::string("none") : where));
        }
        ++it;
      }
    } catch (const std::exception& e) {
      fail_and_release(e.what(), pending, active);
      withdraw_board();
      continue;
    }
    // (A probe for a copy whose stream has not got there yet is looked at
    // with that copy: it may wait long behind another program's copies.)
    if (in_flight() || (sched->any_probing() && !active.empty())) {
      std::this_thread::sleep_for(std::chrono::microseconds(5));
    } else if (!pending.empty()) {
      // Waiting only for streams to get to their copies: streams held for
      // long cost few looks (multipath_pending_wait_us).
      double last = 0;
      for (const Transfer& t : pending) last = std::max(last, t.queued);
      const double now = steady_seconds();
      const bool busy = progress || now - last < 1e-3;
      std::this_thread::sleep_for(std::chrono::microseconds(multipath_pending_wait_us(busy, sched->warm_due() - now)));
    } else if (sched->any_probing()) {
      // Only probes out, no copy (lanes kept warm, or a relay's late one):
      // looked at every 100 us, a copy handed over meanwhile waking the
      // thread. A lane stays clear for kClearS from when its probe was seen
      // landed, 0.3 ms more than a lane kept warm waits to probe again.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::microseconds(100), [&] { return !queued_.empty() || stop_; });
    } else if (!active.empty()) {
      // A copy whose own share the caller's stream still copies, with nothing
      // else in flight: its landing is looked at as a chunk's would be.
      std::this_thread::sleep_for(std::chrono::microseconds(5));
    }
  }
}

}  // namespace xfer
}  // namespace ferry
