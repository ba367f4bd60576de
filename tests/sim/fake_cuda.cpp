// A fake CUDA runtime for CPU tests of code that schedules GPU work from host
// threads (the multipath engine): it runs the real engine against simulated
// GPUs, so that ordering, concurrency, errors and every byte can be checked
// without a GPU. Only the calls that code makes are here.
//
// Model: "device" and "pinned" memory are host memory tagged with their kind;
// each stream is a thread that runs its operations in order (copies take time
// in proportion to their size; event records, event waits, and 64-bit waits
// and writes on memory as CUDA's stream memory operations do); the default
// streams are one per device (handle 0 and cudaStreamLegacy) and one per
// device and thread (cudaStreamPerThread). Tests can make a device's copies
// fail or never finish (sim.hpp).
#include <cuda_runtime_api.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "core/error.hpp"
#include "dma/engine.hpp"
#include "sim.hpp"

namespace {

struct Event {
  std::atomic<int> device{-1};  // of the stream it was last recorded on
  std::atomic<uint64_t> recorded{0};
  std::atomic<uint64_t> completed{0};
  std::atomic<double> at{0};  // when its stream last got to it (the GPU's clock, here the host's)
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Stream {
  int device = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> ops;
  bool busy = false;
  bool stop = false;
  std::thread worker;

  explicit Stream(int d) : device(d) {
    worker = std::thread([this] {
      // A copy's modelled time is microseconds: Linux's default timer slack
      // (50 us) would stretch it, and the engine reads probes' times.
      prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
      std::unique_lock<std::mutex> lock(mu);
      while (true) {
        cv.wait(lock, [&] { return stop || !ops.empty(); });
        if (ops.empty()) return;
        auto op = std::move(ops.front());
        ops.pop_front();
        busy = true;
        lock.unlock();
        op();
        lock.lock();
        busy = false;
        cv.notify_all();
      }
    });
  }
  // Ends the worker once the queue is empty. The object is never freed: its
  // worker may still run, and a stream left blocked (a test of a hang) must
  // not hang the test binary's exit.
  void retire() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    worker.detach();
  }
  void push(std::function<void()> op) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ops.push_back(std::move(op));
    }
    cv.notify_all();
  }
  bool idle() {
    std::lock_guard<std::mutex> lock(mu);
    return ops.empty() && !busy;
  }
};

struct Allocation {
  size_t size;
  int kind;  // cudaMemoryTypeDevice or cudaMemoryTypeHost
  int device;
};

struct State {
  std::mutex mu;
  int devices = 2;
  std::map<uintptr_t, Allocation> allocations;
  std::map<std::pair<int, std::thread::id>, Stream*> defaults;  // thread id() for the legacy streams
  sim::Faults faults;
  int late_copies = 0;                      // copies counted for faults.fail_late_after
  int slow_copies = 0;                      // copies counted for faults.slow_copies
  std::map<size_t, size_t> copies_by_size;  // cudaMemcpyAsync calls since reset(), by bytes
  double bytes_per_s = 20e9;
  uint64_t machine = 0;  // set by reset(): the GPUs' UUIDs, unlike any other test's machine
};

State& state() {
  static State* s = new State;  // never destroyed: stream threads may outlive main's statics
  return *s;
}

thread_local int t_device = 0;
thread_local cudaError_t t_last = cudaSuccess;

cudaError_t fail(cudaError_t e) {
  t_last = e;
  return e;
}

bool is_default_handle(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

Stream* resolve(cudaStream_t s) {
  if (!is_default_handle(s)) return reinterpret_cast<Stream*>(s);
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  const auto key = std::make_pair(t_device, s == cudaStreamPerThread ? std::this_thread::get_id() : std::thread::id());
  auto& slot = st.defaults[key];
  if (!slot) slot = new Stream(t_device);
  return slot;
}

const Allocation* find(const void* p, uintptr_t* base = nullptr) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = st.allocations.upper_bound(a);
  if (it == st.allocations.begin()) return nullptr;
  --it;
  if (a >= it->first + it->second.size) return nullptr;
  if (base) *base = it->first;
  return &it->second;
}

void* allocate(size_t n, int kind, int device) {
  void* p = std::aligned_alloc(256, (std::max<size_t>(n, 1) + 255) / 256 * 256);
  if (!p) return nullptr;
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{std::max<size_t>(n, 1), kind, device};
  return p;
}

}  // namespace

namespace sim {

void reset(int devices, double bytes_per_s) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.devices = devices;
  st.bytes_per_s = bytes_per_s;
  st.machine = (uint64_t(getpid()) << 32) ^ std::random_device{}() ^
               static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  st.faults = Faults{};
  st.copies_by_size.clear();
}

size_t copies(size_t bytes) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  const auto it = st.copies_by_size.find(bytes);
  return it == st.copies_by_size.end() ? 0 : it->second;
}

size_t device_blocks(int device, size_t bytes) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  size_t n = 0;
  for (const auto& [at, a] : st.allocations)
    n += a.kind == cudaMemoryTypeDevice && a.device == device && a.size == bytes;
  return n;
}

size_t live_blocks() {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.allocations.size();
}

void set_faults(const Faults& f) {
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.faults = f;
  st.late_copies = 0;
  st.slow_copies = 0;
}

}  // namespace sim

// ---- the runtime calls

extern "C" {

cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}
const char* cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorFake"; }
const char* cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "a simulated failure"; }

cudaError_t cudaGetDeviceCount(int* n) {
  *n = state().devices;
  return cudaSuccess;
}
cudaError_t cudaGetDevice(int* d) {
  *d = t_device;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= state().devices) return fail(cudaErrorInvalidDevice);
  t_device = d;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  if (d < 0 || d >= state().devices) return fail(cudaErrorInvalidDevice);
  std::memset(p, 0, sizeof *p);
  const uint64_t machine = state().machine;
  std::memcpy(p->uuid.bytes, &machine, 8);
  std::memcpy(p->uuid.bytes + 8, &d, sizeof d);
  return cudaSuccess;
}
cudaError_t cudaDeviceCanAccessPeer(int* ok, int, int) {
  *ok = 1;
  return cudaSuccess;
}
cudaError_t cudaDeviceEnablePeerAccess(int, unsigned) {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().faults.no_peer_access_from_device == t_device ? fail(cudaErrorTooManyPeers) : cudaSuccess;
}
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  *least = 0;
  *greatest = -5;
  return cudaSuccess;
}
cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode*) { return cudaSuccess; }

cudaError_t cudaMalloc(void** p, size_t n) {
  {
    std::lock_guard<std::mutex> lock(state().mu);
    const sim::Faults& f = state().faults;
    if (f.no_memory_on_device == t_device && n >= f.no_memory_from_bytes) {
      *p = nullptr;
      return fail(cudaErrorMemoryAllocation);
    }
  }
  *p = allocate(n, cudaMemoryTypeDevice, t_device);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(state().mu);
      if (!state().faults.hold_host_alloc) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *p = allocate(n, cudaMemoryTypeHost, -1);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaHostGetDevicePointer(void** d, void* h, unsigned) {
  *d = h;
  return cudaSuccess;
}
static cudaError_t release(void* p) {
  if (!p) return cudaSuccess;
  State& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.allocations.erase(reinterpret_cast<uintptr_t>(p));
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) { return release(p); }
cudaError_t cudaFreeHost(void* p) { return release(p); }

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
  std::memset(a, 0, sizeof(*a));
  const Allocation* al = find(p);
  a->type = al ? static_cast<cudaMemoryType>(al->kind) : cudaMemoryTypeUnregistered;
  a->device = al ? al->device : -1;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned, int) {
  *s = reinterpret_cast<cudaStream_t>(new Stream(t_device));
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) {
  *s = reinterpret_cast<cudaStream_t>(new Stream(t_device));
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (!is_default_handle(s)) reinterpret_cast<Stream*>(s)->retire();
  return cudaSuccess;
}
cudaError_t cudaStreamGetDevice(cudaStream_t s, int* d) {
  *d = is_default_handle(s) ? t_device : reinterpret_cast<Stream*>(s)->device;
  return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t s) { return resolve(s)->idle() ? cudaSuccess : cudaErrorNotReady; }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  Stream* st = resolve(s);
  while (!st->idle()) std::this_thread::sleep_for(std::chrono::microseconds(20));
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned) {
  *e = reinterpret_cast<cudaEvent_t>(new Event);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = static_cast<float>((reinterpret_cast<Event*>(b)->at - reinterpret_cast<Event*>(a)->at) * 1e3);
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  // Kept: an operation already queued may still complete it (CUDA defers the release too).
  (void)e;
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  auto* ev = reinterpret_cast<Event*>(e);
  const uint64_t gen = ++ev->recorded;
  ev->device = resolve(s)->device;
  resolve(s)->push([ev, gen] {
    ev->at = now_s();
    uint64_t cur = ev->completed.load();
    while (cur < gen && !ev->completed.compare_exchange_weak(cur, gen)) {
    }
  });
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
  auto* ev = reinterpret_cast<Event*>(e);
  if (ev->completed.load() < ev->recorded.load()) return cudaErrorNotReady;
  int failing;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    failing = state().faults.fail_events_on_device;
  }
  return failing >= 0 && failing == ev->device.load() ? fail(cudaErrorLaunchFailure) : cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  cudaError_t q;
  while ((q = cudaEventQuery(e)) == cudaErrorNotReady) std::this_thread::sleep_for(std::chrono::microseconds(20));
  return q;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
  auto* ev = reinterpret_cast<Event*>(e);
  const uint64_t gen = ev->recorded.load();
  resolve(s)->push([ev, gen] {
    while (ev->completed.load() < gen) std::this_thread::sleep_for(std::chrono::microseconds(5));
  });
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t s) {
  Stream* st = resolve(s);
  State& state_ = state();
  sim::Faults f;
  double bps;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(state_.mu);
      f = state_.faults;
      bps = state_.bytes_per_s;
    }
    if (!f.hold_copy_calls) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  {
    std::lock_guard<std::mutex> lock(state_.mu);
    ++state_.copies_by_size[n];
  }
  if (f.fail_on_device == st->device) return fail(cudaErrorLaunchFailure);
  if (f.fail_late_on_device == st->device && n >= f.fail_late_from_bytes) {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (state_.late_copies++ >= f.fail_late_after) return fail(cudaErrorLaunchFailure);
  }
  const bool hang = f.hang_on_device == st->device && n >= f.hang_from_bytes;
  double extra = 0;
  if (f.slow_on_device == st->device && n >= f.slow_from_bytes) {
    std::lock_guard<std::mutex> lock(state_.mu);
    if (state_.slow_copies++ < f.slow_copies) extra = f.slow_extra_s;
  }
  st->push([dst, src, n, bps, hang, extra] {
    if (hang) {
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    // Below ~20 us a sleep is mostly the scheduler's; such copies (probes among them) take no modelled time.
    const double t = static_cast<double>(n) / bps + extra;
    if (t > 20e-6) std::this_thread::sleep_for(std::chrono::duration<double>(t));
    std::memmove(dst, src, n);
  });
  return cudaSuccess;
}

}  // extern "C"

// ---- the stream memory operations ferry's dma layer enqueues, and what
// error.cpp asks of the driver layer

namespace ferry {
namespace dma {

void mem_ops(cudaStream_t stream, const std::vector<MemOp>& ops) {
  for (const MemOp& op : ops) {
    auto* word = reinterpret_cast<std::atomic<uint64_t>*>(const_cast<void*>(op.addr));
    const uint64_t v = op.value;
    switch (op.kind) {
      case MemOp::Kind::kWrite:
        resolve(stream)->push([word, v] { word->store(v); });
        break;
      case MemOp::Kind::kWaitAtLeast:
        resolve(stream)->push([word, v] {
          while (static_cast<int64_t>(word->load() - v) < 0) std::this_thread::sleep_for(std::chrono::microseconds(5));
        });
        break;
      case MemOp::Kind::kWait:
        resolve(stream)->push([word, v] {
          while (word->load() != v) std::this_thread::sleep_for(std::chrono::microseconds(5));
        });
        break;
    }
  }
}

bool is_capturing(cudaStream_t) { return false; }

int stream_device(cudaStream_t s, int gpu) {
  if (is_default_handle(s)) return gpu;
  int d = gpu;
  cudaStreamGetDevice(s, &d);
  return d;
}

}  // namespace dma

std::string driver_missing_hint() { return "a fake runtime"; }
std::string driver_error_name(int result) { return "CUDA_ERROR_" + std::to_string(result); }

}  // namespace ferry
