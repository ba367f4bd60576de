// Probe: what one prelaunched exchange costs after its trigger, piece by piece.
// One process drives every visible GPU (or --gpus N). Per iteration each GPU's
// stream has, enqueued ahead: wait for the host trigger, [pushes of --bytes to
// every peer], [one 8-byte done copy into every peer's flag, then a batch of
// waits on its own flags with resets], a write of "finished" into host memory.
// The host stores the trigger and spins until every GPU reported finished:
// trigger-to-done, the number ferry's prelaunch target is about.
//
// The variants differ only in where the done flags live and how they are copied:
//   h2h: source record and flag in pinned host memory (ferry's default until now)
//   d2h: source record in GPU memory, flag in pinned host memory
//   d2d: source record in GPU memory, flag in the peer's GPU memory
// and batched (cudaMemcpyBatchAsync) against one cudaMemcpyAsync per copy.
// One more cuts the memory operations after the done copies (d2d, one copy each):
//   lanes: every source copies one byte into its own byte of ONE 64-bit word of
//          the target, which waits for the whole word (1 wait + 1 reset
//          instead of one wait and one reset per source)
// and the waits themselves, a stream memory operation each, against a one-block
// kernel that spins on the same words (an SM for the wait's duration):
//   kernel done-wait: the waits for the peers' done flags (and their resets)
//   kernel trigger: the wait for the host trigger as well
// and, since the results fall into modes about 8 us apart (as if a stream
// wait that fails its first look is looked at again only that much later),
// spacers between the done copies and the waits, so that the first look
// comes later and finds the peer's flag more often:
//   spacer write: one stream write into this GPU's memory
//   spacer copies: N more 8-byte copies into an unused line of every peer
//
// With --streams K, the trigger floor and pushes + done run on each of K
// streams per GPU in turn, twice: whether a stream keeps its mode.
//
// With --busy 1, one block per GPU spins beside all of it.
//
//   ferry_probe_flags [--gpus N] [--bytes B] [--iters N] [--streams K] [--busy 0|1]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "dma/engine.hpp"
#include "probe_timing.hpp"

using ferry::Copy;
using ferry::MemOp;

namespace {

using ferry::probe::now_us;

enum class Where { kHost, kDevice };

struct Variant {
  const char* name;
  bool data;
  bool flags;
  Where source;
  Where flag;
  bool batched;
  bool lanes = false;
  bool kernel_wait = false;
  bool kernel_trigger = false;
  bool spacer_write = false;
  int spacer_copies = 0;
};

// Up to 8 words, one thread each: spin until every word holds its value, then
// (reset) write 0 back.
struct SpinSet {
  const unsigned long long* addr[8];
  unsigned long long value[8];
  int n;
  bool reset;
};

__global__ void spin_until(SpinSet s) {
  const int i = threadIdx.x;
  if (i < s.n) {
    volatile const unsigned long long* a = s.addr[i];
    while (*a != s.value[i]) {
    }
  }
  __syncthreads();
  if (i < s.n && s.reset) *const_cast<unsigned long long*>(s.addr[i]) = 0;
}

// --busy: one block per GPU spinning on its own stream for the whole run (a
// GPU whose SMs all idle may sit in a slower state than one running a kernel).
__global__ void keep_busy(const volatile unsigned long long* stop) {
  while (*stop == 0) __nanosleep(1000);
}

void spin(cudaStream_t stream, const std::vector<MemOp>& waits, bool reset) {
  SpinSet set{};
  for (const auto& w : waits) {
    if (w.kind != MemOp::Kind::kWait) continue;
    set.addr[set.n] = static_cast<const unsigned long long*>(w.addr);
    set.value[set.n++] = w.value;
  }
  set.reset = reset;
  spin_until<<<1, 32, 0, stream>>>(set);
  FERRY_CUDA_CHECK(cudaGetLastError());
}

struct Gpu {
  int device = 0;
  cudaStream_t stream = nullptr;         // the one the variant runs on
  std::vector<cudaStream_t> pool;        // --streams of them
  char* in = nullptr;                    // the block this GPU pushes
  char* out = nullptr;                   // one slot per peer
  uint64_t* device_flags = nullptr;      // one 64-byte line per peer
  uint64_t* device_values = nullptr;     // values 1..iters, one line each
  uint64_t* lane_word = nullptr;         // one byte per writing GPU
  unsigned char* lane_values = nullptr;  // iteration i writes 1 + i % 255
};

constexpr size_t kLine = 8;  // uint64 words per 64-byte line

template <typename T>
T* device_alloc(size_t n) {
  void* p = nullptr;
  FERRY_CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
  return static_cast<T*>(p);
}

uint64_t* host_words(size_t n) {
  void* p = nullptr;
  FERRY_CUDA_CHECK(cudaHostAlloc(&p, n * sizeof(uint64_t), cudaHostAllocPortable | cudaHostAllocMapped));
  std::memset(p, 0, n * sizeof(uint64_t));
  return static_cast<uint64_t*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  int gpus = 0, iters = 300, streams = 1;
  bool busy = false;
  size_t bytes = 1024;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--gpus") gpus = std::atoi(argv[i + 1]);
    if (a == "--bytes") bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (a == "--iters") iters = std::atoi(argv[i + 1]);
    if (a == "--streams") streams = std::max(1, std::atoi(argv[i + 1]));
    if (a == "--busy") busy = std::atoi(argv[i + 1]) != 0;
  }
  int count = 0;
  FERRY_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (gpus <= 0 || gpus > count) gpus = count;
  const int warmup = 20, total = warmup + iters;

  std::vector<Gpu> g(gpus);
  for (int r = 0; r < gpus; ++r) {
    g[r].device = r;
    FERRY_CUDA_CHECK(cudaSetDevice(r));
    for (int p = 0; p < gpus; ++p)
      if (p != r && cudaDeviceEnablePeerAccess(p, 0) != cudaSuccess) cudaGetLastError();
    g[r].pool.resize(streams);
    for (auto& st : g[r].pool) FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    g[r].stream = g[r].pool[0];
    g[r].in = device_alloc<char>(bytes);
    g[r].out = device_alloc<char>(bytes * gpus);
    g[r].device_flags = device_alloc<uint64_t>(gpus * kLine);
    FERRY_CUDA_CHECK(cudaMemset(g[r].device_flags, 0, gpus * kLine * sizeof(uint64_t)));
    std::vector<uint64_t> values(total * kLine, 0);
    for (int i = 0; i < total; ++i) values[i * kLine] = i + 1;
    g[r].device_values = device_alloc<uint64_t>(values.size());
    FERRY_CUDA_CHECK(
        cudaMemcpy(g[r].device_values, values.data(), values.size() * sizeof(uint64_t), cudaMemcpyHostToDevice));
    g[r].lane_word = device_alloc<uint64_t>(kLine);
    FERRY_CUDA_CHECK(cudaMemset(g[r].lane_word, 0, kLine * sizeof(uint64_t)));
    std::vector<unsigned char> lane(total);
    for (int i = 0; i < total; ++i) lane[i] = static_cast<unsigned char>(1 + i % 255);
    g[r].lane_values = device_alloc<unsigned char>(total);
    FERRY_CUDA_CHECK(cudaMemcpy(g[r].lane_values, lane.data(), total, cudaMemcpyHostToDevice));
  }
  if (gpus > 8) {
    std::fprintf(stderr, "lanes variant: at most 8 GPUs\n");
    return 2;
  }
  uint64_t* trigger = host_words(kLine);
  uint64_t* finished = host_words(gpus * kLine);
  uint64_t* host_flags = host_words(size_t(gpus) * gpus * kLine);  // [owner][writer]
  uint64_t* host_values = host_words(total * kLine);
  for (int i = 0; i < total; ++i) host_values[i * kLine] = i + 1;

  const Variant variants[] = {
      {"floor (trigger, finished)", false, false, Where::kHost, Where::kHost, true},
      {"pushes only", true, false, Where::kHost, Where::kHost, true},
      {"flags h2h batched", false, true, Where::kHost, Where::kHost, true},
      {"flags d2h batched", false, true, Where::kDevice, Where::kHost, true},
      {"flags d2d batched", false, true, Where::kDevice, Where::kDevice, true},
      {"flags d2h per-copy", false, true, Where::kDevice, Where::kHost, false},
      {"flags d2d per-copy", false, true, Where::kDevice, Where::kDevice, false},
      {"pushes + h2h batched", true, true, Where::kHost, Where::kHost, true},
      {"pushes + d2h batched", true, true, Where::kDevice, Where::kHost, true},
      {"pushes + d2d batched", true, true, Where::kDevice, Where::kDevice, true},
      {"pushes + d2d per-copy", true, true, Where::kDevice, Where::kDevice, false},
      {"flags d2d lanes", false, true, Where::kDevice, Where::kDevice, false, true},
      {"pushes + d2d lanes", true, true, Where::kDevice, Where::kDevice, false, true},
      {"floor, kernel trigger", false, false, Where::kHost, Where::kHost, true, false, false, true},
      {"pushes + d2d, kernel done-wait", true, true, Where::kDevice, Where::kDevice, false, false, true},
      {"pushes + d2d, kernel both", true, true, Where::kDevice, Where::kDevice, false, false, true, true},
      {"pushes + d2d, spacer write", true, true, Where::kDevice, Where::kDevice, false, false, false, false, true},
      {"pushes + d2d, 1 spacer copy", true, true, Where::kDevice, Where::kDevice, false, false, false, false, false, 1},
      {"pushes + d2d, 2 spacer copies", true, true, Where::kDevice, Where::kDevice, false, false, false, false, false,
       2},
  };
  uint64_t epoch = 0;  // trigger and finished values never repeat across variants
  uint64_t* stop = host_words(kLine);
  std::vector<cudaStream_t> busy_streams(gpus);
  if (busy)
    for (int r = 0; r < gpus; ++r) {
      FERRY_CUDA_CHECK(cudaSetDevice(r));
      FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&busy_streams[r], cudaStreamNonBlocking));
      keep_busy<<<1, 32, 0, busy_streams[r]>>>(reinterpret_cast<const volatile unsigned long long*>(stop));
      FERRY_CUDA_CHECK(cudaGetLastError());
    }
  std::printf("gpus %d, bytes per peer %zu, %d iterations after %d warm-up%s; trigger-to-done in us\n", gpus, bytes,
              iters, warmup, busy ? ", one spinning block per GPU beside" : "");
  std::printf("%-32s %9s %9s %9s %9s %12s\n", "variant", "median", "mean", "p10", "p90", "enqueue(us)");
  auto run_variant = [&](const Variant& v, const std::string& name) -> bool {
    std::vector<double> lat, enq;
    for (int i = 0; i < total; ++i) {
      const uint64_t tick = ++epoch;
      double e0 = now_us();
      for (int r = 0; r < gpus; ++r) {
        FERRY_CUDA_CHECK(cudaSetDevice(r));
        cudaStream_t s = g[r].stream;
        if (v.kernel_trigger) {
          spin(s, {MemOp{MemOp::Kind::kWait, trigger, tick}}, false);
        } else {
          ferry::dma::mem_ops(s, {MemOp{MemOp::Kind::kWait, trigger, tick}});
        }
        std::vector<Copy> pushes, flags;
        std::vector<MemOp> waits;
        const unsigned char lane_value = static_cast<unsigned char>(1 + i % 255);
        uint64_t lanes_expected = 0;
        for (int p = 0; p < gpus; ++p) {
          if (p == r) continue;
          if (v.data) pushes.push_back(Copy{g[p].out + r * bytes, g[r].in, bytes});
          if (!v.flags) continue;
          if (v.lanes) {
            flags.push_back(Copy{reinterpret_cast<char*>(g[p].lane_word) + r, g[r].lane_values + i, 1});
            lanes_expected |= uint64_t{lane_value} << (8 * p);
            continue;
          }
          const void* src = v.source == Where::kDevice ? static_cast<void*>(g[r].device_values + i * kLine)
                                                       : static_cast<void*>(host_values + i * kLine);
          void* dst = v.flag == Where::kDevice ? static_cast<void*>(g[p].device_flags + r * kLine)
                                               : static_cast<void*>(host_flags + (p * gpus + r) * kLine);
          flags.push_back(Copy{dst, src, sizeof(uint64_t)});
          const void* mine = v.flag == Where::kDevice ? static_cast<void*>(g[r].device_flags + p * kLine)
                                                      : static_cast<void*>(host_flags + (r * gpus + p) * kLine);
          waits.push_back(MemOp{MemOp::Kind::kWait, mine, uint64_t(i + 1)});
          waits.push_back(MemOp{MemOp::Kind::kWrite, mine, 0});
        }
        if (v.lanes && v.flags) {
          waits.push_back(MemOp{MemOp::Kind::kWait, g[r].lane_word, lanes_expected});
          waits.push_back(MemOp{MemOp::Kind::kWrite, g[r].lane_word, 0});
        }
        if (!pushes.empty()) ferry::dma::copy_batch(s, pushes);
        if (v.batched) {
          ferry::dma::copy_batch(s, flags);
        } else {
          for (const auto& c : flags) ferry::dma::copy_one(s, c);
        }
        // A peer's line at its own index is never written by anyone else.
        for (int k = 0; k < v.spacer_copies; ++k)
          for (int p = 0; p < gpus; ++p)
            if (p != r) ferry::dma::copy_one(s, Copy{g[p].device_flags + p * kLine, g[r].device_values + i * kLine, 8});
        if (v.spacer_write) ferry::dma::mem_ops(s, {MemOp{MemOp::Kind::kWrite, g[r].device_flags + r * kLine, tick}});
        // Waits first, then resets: one batch keeps their order.
        std::stable_partition(waits.begin(), waits.end(), [](const MemOp& m) { return m.kind == MemOp::Kind::kWait; });
        if (v.kernel_wait) {
          spin(s, waits, true);
        } else {
          ferry::dma::mem_ops(s, waits);
        }
        ferry::dma::mem_ops(s, {MemOp{MemOp::Kind::kWrite, finished + r * kLine, tick}});
      }
      double e1 = now_us();
      std::atomic_thread_fence(std::memory_order_seq_cst);
      double t0 = now_us();
      reinterpret_cast<volatile uint64_t*>(trigger)[0] = tick;
      for (int r = 0; r < gpus; ++r) {
        const double limit = t0 + 5e6;
        while (reinterpret_cast<volatile uint64_t*>(finished)[r * kLine] != tick) {
          if (now_us() > limit) {
            std::fprintf(stderr, "variant '%s': GPU %d did not finish within 5 s\n", v.name, r);
            return false;
          }
        }
      }
      double t1 = now_us();
      if (i >= warmup) lat.push_back(t1 - t0), enq.push_back(e1 - e0);
    }
    std::sort(lat.begin(), lat.end());
    std::sort(enq.begin(), enq.end());
    auto at = [](const std::vector<double>& x, double q) { return x[size_t(q * (x.size() - 1))]; };
    double mean = 0;
    for (double x : lat) mean += x / lat.size();
    std::printf("%-32s %9.1f %9.1f %9.1f %9.1f %12.1f\n", name.c_str(), at(lat, 0.5), mean, at(lat, 0.1), at(lat, 0.9),
                at(enq, 0.5));
    std::fflush(stdout);
    return true;
  };
  if (streams == 1) {
    for (const auto& v : variants)
      if (!run_variant(v, v.name)) return 2;
  } else {
    // The same variants on each stream of a pool, twice over: does a
    // stream (its hardware queue, its copy engine) keep its mode?
    for (int pass = 0; pass < 2; ++pass)
      for (int k = 0; k < streams; ++k) {
        for (auto& gpu : g) gpu.stream = gpu.pool[k];
        for (const auto& v : variants) {
          const std::string n = v.name;
          if (n != "floor (trigger, finished)" && n != "pushes + d2d per-copy") continue;
          if (!run_variant(v, n.substr(0, 21) + " [stream " + std::to_string(k) + "]")) return 2;
        }
      }
  }
  reinterpret_cast<volatile uint64_t*>(stop)[0] = 1;
  for (int r = 0; r < gpus; ++r) {
    FERRY_CUDA_CHECK(cudaSetDevice(r));
    for (cudaStream_t st : g[r].pool) FERRY_CUDA_CHECK(cudaStreamSynchronize(st));
    if (busy) FERRY_CUDA_CHECK(cudaStreamSynchronize(busy_streams[r]));
  }
  return 0;
}
