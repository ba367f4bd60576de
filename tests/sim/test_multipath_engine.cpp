// The multipath engine (src/xfer/multipath.cpp, the real code) against
// simulated GPUs (fake_cuda.cpp): every byte, stream order, copies on several
// streams and threads, errors and hangs, close. What the GPU tests check on
// hardware, here on every CI run.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "core/error.hpp"
#include "dma/engine.hpp"
#include "sim.hpp"
#include "sync/holds.hpp"
#include "xfer/link_board.hpp"
#include "xfer/multipath.hpp"

using ferry::xfer::MultipathEngine;
using ferry::xfer::MultipathOptions;
using ferry::xfer::MultipathPiece;

namespace {

constexpr size_t MiB = size_t{1} << 20;

// The message of the ferry error `f` throws ("" when it throws none).
template <class F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const ferry::Error& e) {
    return e.what();
  }
  return "";
}

// Once a test gave up waiting for a stream (drained() false), the engine may
// still be copying into that stream's buffers: a real cudaFree waits for the
// device's work, the fake's frees at once, and the copies' memmoves would then
// write freed heap. From then on the test's buffers are freed in TearDown,
// after its engines were closed (their threads joined, their links drained).
std::atomic<bool> gave_up{false};
std::mutex deferred_mu;
std::vector<void*> deferred;

struct Buf {
  void* p = nullptr;
  size_t n = 0;
  Buf(size_t bytes, int device) : n(bytes) {
    if (device < 0) {
      cudaHostAlloc(&p, bytes, 0);
    } else {
      cudaSetDevice(device);
      cudaMalloc(&p, bytes);
      cudaSetDevice(0);
    }
  }
  ~Buf() {
    if (!gave_up) {
      cudaFree(p);
      return;
    }
    std::lock_guard<std::mutex> lock(deferred_mu);
    deferred.push_back(p);
  }
  unsigned char* b() const { return static_cast<unsigned char*>(p); }
};

void fill(const Buf& b, unsigned seed) {
  std::mt19937_64 g(seed);
  size_t i = 0;
  for (; i + 8 <= b.n; i += 8) {
    const uint64_t v = g();
    std::memcpy(b.b() + i, &v, 8);
  }
  for (; i < b.n; ++i) b.b()[i] = static_cast<unsigned char>(g());
}

// True once `s` has passed everything queued (bounded: a stream held for good fails the test, not CI).
bool drained(cudaStream_t s, double limit_s = 10) {
  const auto t0 = std::chrono::steady_clock::now();
  while (cudaStreamQuery(s) == cudaErrorNotReady) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit_s) {
      gave_up = true;
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// `count` host sources of `n` random bytes and poisoned destinations on `device`.
struct Pairs {
  std::vector<std::unique_ptr<Buf>> src, dst;
  Pairs(int count, size_t n, int device, unsigned seed) {
    for (int i = 0; i < count; ++i) {
      src.push_back(std::make_unique<Buf>(n, -1));
      dst.push_back(std::make_unique<Buf>(n, device));
      fill(*src.back(), seed + i);
      std::memset(dst.back()->p, 0xA5, n);
    }
  }
  bool same(int i) const { return std::memcmp(dst[i]->p, src[i]->p, src[i]->n) == 0; }
};

cudaStream_t new_stream(int device) {
  cudaSetDevice(device);
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaSetDevice(0);
  return s;
}

MultipathOptions options(std::vector<int> links, size_t chunk = MiB + 4097, size_t threshold = 2 * MiB) {
  MultipathOptions o;
  o.link_devices = std::move(links);
  o.chunk_bytes = chunk;
  o.threshold_bytes = threshold;
  o.timeout_s = 10;
  return o;
}

// A stream held by a gate word until release() (as a kernel that runs long would).
struct Hold {
  uint64_t* word = nullptr;
  explicit Hold(cudaStream_t s) {
    cudaHostAlloc(reinterpret_cast<void**>(&word), 8, 0);
    *word = 0;
    ferry::dma::mem_ops(s, {ferry::MemOp{ferry::MemOp::Kind::kWaitAtLeast, word, 1}});
  }
  void release() { __atomic_store_n(word, 1, __ATOMIC_RELEASE); }
};

// `n` random bytes from host memory to GPU 0 and back through `e` on one
// stream: the stream drains, check() raises nothing, and both copies match
// the source byte for byte.
void expect_round_trip(MultipathEngine& e, size_t n, unsigned seed) {
  Buf host(n, -1), dev(n, 0), back(n, -1);
  fill(host, seed);
  cudaStream_t s = new_stream(0);
  e.copy(dev.p, host.p, n, s);
  e.copy(back.p, dev.p, n, s);
  ASSERT_TRUE(drained(s));
  e.check();
  EXPECT_EQ(std::memcmp(dev.p, host.p, n), 0);
  EXPECT_EQ(std::memcmp(back.p, host.p, n), 0);
}

// check() raises the engine's error, and its text holds every one of `parts`.
void expect_broken_saying(MultipathEngine& e, std::initializer_list<const char*> parts) {
  try {
    e.check();
    ADD_FAILURE() << "check() raised nothing";
  } catch (const ferry::Error& err) {
    EXPECT_EQ(err.code(), FERRY_ERROR_BROKEN);
    for (const char* part : parts) EXPECT_NE(std::string(err.what()).find(part), std::string::npos) << err.what();
  }
}

// A 16 MiB copy into GPU 0 over `links` under `faults` (timeout 0.5 s): its
// stream goes on, the engine's error holds every one of `saying`, and the
// broken engine refuses the next copy.
void times_out_letting_the_stream_go(const std::vector<int>& links, const sim::Faults& faults,
                                     std::initializer_list<const char*> saying, int own_share_on_stream = -1) {
  MultipathOptions o = options(links);
  o.timeout_s = 0.5;
  o.own_share_on_stream = own_share_on_stream;
  MultipathEngine e(o);
  sim::set_faults(faults);
  const size_t n = 16 * MiB;
  Buf host(n, -1), dev(n, 0);
  cudaStream_t s = new_stream(0);
  e.copy(dev.p, host.p, n, s);
  EXPECT_TRUE(drained(s, 20)) << "the stream stayed held";
  expect_broken_saying(e, saying);
  EXPECT_THROW(e.copy(dev.p, host.p, n, s), ferry::Error);
  sim::set_faults(sim::Faults{});
}

class MultipathSim : public ::testing::Test {
 protected:
  void SetUp() override { sim::reset(3); }
  void TearDown() override {
    std::lock_guard<std::mutex> lock(deferred_mu);
    for (void* p : deferred) cudaFree(p);
    deferred.clear();
    gave_up = false;
  }
};

// A GPU's id on the link board (its UUID).
ferry::xfer::GpuId board_id(int device) {
  ferry::xfer::GpuId id{};
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  std::memcpy(id.data(), prop.uuid.bytes, 16);
  return id;
}

}  // namespace

TEST_F(MultipathSim, EveryByteBothWaysOverOwnLinkAndRelays) {
  MultipathEngine e(options({0, 1, 2}));
  for (size_t n : {size_t{1}, 4097 + size_t{3}, 2 * MiB, 8 * MiB + 13, 24 * MiB + 7}) {
    Buf host(n, -1), dev(n, 0), back(n, -1);
    fill(host, static_cast<unsigned>(n));
    std::memset(dev.p, 0xA5, n);
    std::memset(back.p, 0xA5, n);
    cudaStream_t s = new_stream(0);
    const auto before = e.bytes_by_link();
    auto r = e.copy(dev.p, host.p, n, s);
    EXPECT_EQ(r.multipath, n >= 2 * MiB) << n;
    e.copy(back.p, dev.p, n, s);
    cudaStreamSynchronize(s);
    e.check();
    EXPECT_EQ(std::memcmp(back.p, host.p, n), 0) << n;
    const auto after = e.bytes_by_link();
    if (n >= 24 * MiB) {  // many chunks: a relay whose probe lands after the first few still takes some
      EXPECT_GT(after[1], before[1]) << n;
      EXPECT_GT(after[2], before[2]) << n;
    }
    cudaStreamDestroy(s);
  }
}

TEST_F(MultipathSim, StartsWhenItsStreamGetsThereAndTheStreamWaitsForTheEnd) {
  MultipathEngine e(options({0, 1}));
  const size_t n = 16 * MiB + 5;
  Buf host(n, -1), dev(n, 0), after(n, -1);
  fill(host, 1);
  std::memset(dev.p, 0xA5, n);
  cudaStream_t s = new_stream(0);
  Hold hold(s);
  e.copy(dev.p, host.p, n, s);
  cudaMemcpyAsync(after.p, dev.p, n, cudaMemcpyDefault, s);  // consumes right after
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(dev.b()[0], 0xA5) << "the copy started before its stream got to it";
  EXPECT_EQ(e.bytes_by_link()[0] + e.bytes_by_link()[1], 0u);
  hold.release();
  cudaStreamSynchronize(s);
  EXPECT_EQ(std::memcmp(after.p, host.p, n), 0) << "the consumer ran before the copy landed";
}

TEST_F(MultipathSim, ACopyWaitingForItsStreamHoldsUpNoOtherStream) {
  MultipathEngine e(options({0, 1, 2}));
  const size_t n = 16 * MiB;
  Buf a_src(n, -1), b_src(n, -1), a_dst(n, 0), b_dst(n, 1);
  fill(a_src, 2);
  fill(b_src, 3);
  cudaStream_t sa = new_stream(0), sb = new_stream(1);
  Hold hold(sa);
  e.copy(a_dst.p, a_src.p, n, sa);  // its stream is held
  e.copy(b_dst.p, b_src.p, n, sb);  // another stream, another target
  ASSERT_TRUE(drained(sb, 5)) << "copy B waited for copy A's stream";
  EXPECT_EQ(std::memcmp(b_dst.p, b_src.p, n), 0);
  EXPECT_EQ(cudaStreamQuery(sa), cudaErrorNotReady);
  hold.release();
  cudaStreamSynchronize(sa);
  e.synchronize();
  EXPECT_EQ(std::memcmp(a_dst.p, a_src.p, n), 0);
}

// A default stream names no GPU: with GPU 0 current, a copy into GPU 1 on
// "the default stream" is ordered in GPU 1's, unless the caller names the
// GPU (as the C API does with the current one).
TEST_F(MultipathSim, ADefaultStreamIsTheCopysGpusUnlessNamed) {
  MultipathEngine e(options({0, 1}));
  const size_t n = 8 * MiB + 1;
  Buf src(n, -1), dst(n, 1), dst2(n, 1), after(n, -1);
  fill(src, 6);
  std::memset(dst.p, 0, n);
  std::memset(dst2.p, 0, n);
  auto untouched = [&](const Buf& b) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return std::all_of(b.b(), b.b() + n, [](unsigned char c) { return c == 0; });
  };
  cudaSetDevice(1);
  Hold hold1(nullptr);  // GPU 1's default stream held
  cudaSetDevice(0);
  e.copy(dst.p, src.p, n, nullptr);  // GPU 0 current; the copy's GPU is 1
  EXPECT_TRUE(untouched(dst)) << "the copy ran before GPU 1's default stream got to it";
  EXPECT_TRUE(drained(nullptr, 5)) << "GPU 0's default stream waited for a copy of GPU 1's";
  cudaSetDevice(1);
  cudaMemcpyAsync(after.p, dst.p, n, cudaMemcpyDefault, nullptr);
  hold1.release();
  cudaStreamSynchronize(nullptr);
  cudaSetDevice(0);
  EXPECT_EQ(std::memcmp(after.p, src.p, n), 0) << "GPU 1's default stream went on before the copy landed";
  // Named: GPU 0's default stream (the C API names the current GPU's).
  Hold hold0(nullptr);
  e.copy(dst2.p, src.p, n, nullptr, 0);
  EXPECT_TRUE(untouched(dst2)) << "the copy ran before GPU 0's default stream got to it";
  hold0.release();
  cudaStreamSynchronize(nullptr);
  EXPECT_EQ(std::memcmp(dst2.p, src.p, n), 0);
}

TEST_F(MultipathSim, DefaultStreamsOfTwoGpusDoNotShareAGate) {
  MultipathEngine e(options({0, 1}));
  const size_t n = 8 * MiB + 1;
  Buf src0(n, -1), src1(n, -1), dst0(n, 0), dst1(n, 1), after0(n, -1);
  fill(src0, 4);
  fill(src1, 5);
  cudaSetDevice(0);
  Hold hold(nullptr);  // GPU 0's default stream held
  e.copy(dst0.p, src0.p, n, nullptr);
  cudaMemcpyAsync(after0.p, dst0.p, n, cudaMemcpyDefault, nullptr);
  cudaSetDevice(1);
  e.copy(dst1.p, src1.p, n, nullptr);  // GPU 1's default stream: lands at once
  const bool went_on = drained(nullptr, 5);
  cudaSetDevice(0);
  if (!went_on) hold.release();
  ASSERT_TRUE(went_on) << "GPU 1's default stream waited for GPU 0's";
  EXPECT_EQ(std::memcmp(dst1.p, src1.p, n), 0);
  EXPECT_EQ(cudaStreamQuery(nullptr), cudaErrorNotReady) << "GPU 0's default stream went on early";
  hold.release();
  cudaStreamSynchronize(nullptr);
  EXPECT_EQ(std::memcmp(after0.p, src0.p, n), 0);
}

TEST_F(MultipathSim, ManyThreadsAndStreamsAtOnce) {
  MultipathEngine e(options({0, 1, 2}, 2 * MiB, MiB));
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 g(100 + t);
      const int target = t % 3;
      cudaStream_t s = new_stream(target);
      for (int i = 0; i < 6; ++i) {
        const size_t n = MiB + g() % (12 * MiB);
        Buf host(n, -1), dev(n, target), back(n, -1);
        fill(host, g());
        e.copy(dev.p, host.p, n, s);
        e.copy(back.p, dev.p, n, s);
        if (!drained(s) || std::memcmp(back.p, host.p, n) != 0) ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  e.synchronize();
  EXPECT_EQ(wrong.load(), 0);
}

TEST_F(MultipathSim, OneStreamFromTwoThreadsKeepsEachCopyWhole) {
  MultipathEngine e(options({0, 1}, MiB, MiB));
  cudaStream_t s = new_stream(0);
  const size_t n = 6 * MiB + 3;
  Pairs p(16, n, 0, 200);
  std::thread a([&] {
    for (int i = 0; i < 16; i += 2) e.copy(p.dst[i]->p, p.src[i]->p, n, s);
  });
  std::thread b([&] {
    for (int i = 1; i < 16; i += 2) e.copy(p.dst[i]->p, p.src[i]->p, n, s);
  });
  a.join();
  b.join();
  ASSERT_TRUE(drained(s));
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(p.same(i)) << i;
}

TEST_F(MultipathSim, PlainCopyBelowTheThresholdAndForPageableMemory) {
  MultipathEngine e(options({0, 1}));
  std::vector<unsigned char> pageable(8 * MiB);
  for (size_t i = 0; i < pageable.size(); ++i) pageable[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  Buf dev(8 * MiB, 0), small_host(4096, -1), small_dev(4096, 0);
  fill(small_host, 9);
  std::memset(dev.p, 0xA5, 8 * MiB);
  std::memset(small_dev.p, 0xA5, 4096);
  auto r = e.copy(dev.p, pageable.data(), pageable.size(), nullptr);
  EXPECT_FALSE(r.multipath);
  EXPECT_NE(r.reason.find("pageable"), std::string::npos) << r.reason;
  r = e.copy(small_dev.p, small_host.p, 4096, nullptr);
  EXPECT_FALSE(r.multipath);
  EXPECT_NE(r.reason.find("threshold"), std::string::npos) << r.reason;
  cudaStreamSynchronize(nullptr);
  EXPECT_EQ(std::memcmp(dev.p, pageable.data(), pageable.size()), 0);
  EXPECT_EQ(std::memcmp(small_dev.p, small_host.p, 4096), 0);
}

TEST_F(MultipathSim, BadInputIsNamed) {
  MultipathEngine e(options({0, 1}));
  Buf a(MiB, 0), b(MiB, 1), h(MiB, -1);
  EXPECT_THROW(e.copy(a.p, b.p, MiB, nullptr), ferry::Error);  // both on GPUs
  try {
    e.copy(a.p, b.p, MiB, nullptr);
  } catch (const ferry::Error& err) {
    EXPECT_NE(std::string(err.what()).find("dst is GPU memory (cuda:0) and src is GPU memory (cuda:1)"),
              std::string::npos)
        << err.what();
  }
  // Overlap and null pointers are named before the route is looked at (both
  // on the host would be refused anyway).
  EXPECT_NE(error_text([&] { e.copy(h.b() + 16, h.p, 64, nullptr); }).find("dst and src overlap"), std::string::npos);
  EXPECT_NE(error_text([&] { e.copy(nullptr, h.p, 64, nullptr); }).find("dst is null"), std::string::npos);
  EXPECT_NE(error_text([&] { e.copy(a.p, nullptr, 64, nullptr); }).find("src is null"), std::string::npos);
  // A size that wraps past the end of the address space: its last byte would
  // land back inside the buffers, where the checks of its ends would pass.
  const std::string wrapped = error_text([&] { e.copy(a.b() + 8192, h.b() + 8192, SIZE_MAX - 4095, nullptr); });
  EXPECT_NE(
      wrapped.find("dst plus " + std::to_string(SIZE_MAX - 4095) + " bytes runs past the end of the address space"),
      std::string::npos)
      << wrapped;
  MultipathOptions bad = options({0, 7});
  EXPECT_THROW(MultipathEngine x(bad), ferry::Error);
  bad = options({0, 1});
  bad.timeout_s = -1;
  EXPECT_THROW(MultipathEngine x(bad), ferry::Error);
}

TEST_F(MultipathSim, ARelayThatNeverFinishesTimesOutLetsTheStreamGoAndSaysWhere) {
  sim::Faults f;
  f.hang_on_device = 1;
  f.hang_from_bytes = ferry::xfer::kMultipathProbeBytes + 1;  // its probes land; its chunks do not
  times_out_letting_the_stream_go({0, 1}, f, {"did not land within", "cuda:1"});
}

// Foreign copies queued on a link hold everything after them there, the
// engine's probe too: the link carries nothing and the copy goes over the
// others, on time.
TEST_F(MultipathSim, ALinkWhoseProbeDoesNotLandCarriesNothing) {
  MultipathOptions o = options({0, 1, 2});
  o.timeout_s = 1;
  o.own_share_on_stream = 0;  // the engine schedules the own link: it keeps out of the held one
  MultipathEngine e(o);
  sim::Faults f;
  f.hang_on_device = 0;  // the target's own link
  sim::set_faults(f);
  const size_t n = 16 * MiB + 5;
  Buf host(n, -1), dev(n, 0);
  fill(host, 5);
  cudaStream_t s = new_stream(0);
  for (int i = 0; i < 3; ++i) {
    std::memset(dev.p, 0, n);
    e.copy(dev.p, host.p, n, s);
    ASSERT_TRUE(drained(s, 3)) << "copy " << i << " waited for the held link";
    e.check();
    EXPECT_EQ(std::memcmp(dev.p, host.p, n), 0);
  }
  EXPECT_EQ(e.bytes_by_link()[0], 0u);
  sim::set_faults(sim::Faults{});
}

// With the other link gone (its probe cannot be sent), a copy whose own link
// stays held times out, and the error says the probe there has not landed.
TEST_F(MultipathSim, ACopyWhoseOnlyLinkStaysHeldTimesOutNamingTheProbe) {
  sim::Faults f;
  f.hang_on_device = 0;
  f.fail_on_device = 1;
  times_out_letting_the_stream_go(
      {0, 1}, f, {"links kept out by copies queued there first (their probes late or not landed): cuda:0"},
      0);  // the engine schedules the own link (with the own share on the stream, the stream holds it)
}

TEST_F(MultipathSim, ARelayThatCannotTakeAChunkLeavesItToTheOtherLinks) {
  MultipathEngine e(options({0, 1, 2}));
  sim::Faults f;
  f.fail_on_device = 1;
  sim::set_faults(f);
  const size_t n = 16 * MiB + 9;
  Buf host(n, -1), dev(n, 0);
  fill(host, 11);
  cudaStream_t s = new_stream(0);
  e.copy(dev.p, host.p, n, s);
  ASSERT_TRUE(drained(s));
  e.check();  // no error: the copy completed over links 0 and 2
  EXPECT_EQ(std::memcmp(dev.p, host.p, n), 0);
  EXPECT_FALSE(e.may_relay()[1]);
  EXPECT_TRUE(e.may_relay()[2]);
  EXPECT_EQ(e.bytes_by_link()[1], 0u);
  sim::set_faults(sim::Faults{});
}

// A relay failing after a chunk's first hop went out (its second hop, or a
// later chunk of the same pass): every chunk it had not finished goes back to
// the other links, each byte lands once, and the relay is retired.
TEST_F(MultipathSim, ARelayFailingBetweenHopsLeavesItsChunksToTheOtherLinks) {
  for (bool to_device : {true, false})
    for (int after : {1, 2, 3}) {
      MultipathEngine e(options({0, 1, 2}));
      sim::Faults f;
      f.fail_late_on_device = 1;
      f.fail_late_after = after;
      f.fail_late_from_bytes = 256 << 10;  // chunks' hops, not the probes (64 KiB)
      sim::set_faults(f);
      const size_t n = 32 * MiB + 9;
      Buf host(n, -1), dev(n, 0);
      fill(host, 17 + static_cast<unsigned>(after));
      if (!to_device) std::memcpy(dev.p, host.p, n), std::memset(host.p, 0, n);
      Buf ref(n, 0);
      std::memcpy(ref.p, to_device ? host.p : dev.p, n);
      cudaStream_t s = new_stream(0);
      if (to_device)
        e.copy(dev.p, host.p, n, s);
      else
        e.copy(host.p, dev.p, n, s);
      ASSERT_TRUE(drained(s)) << to_device << " " << after;
      e.check();  // no error: the copy completed over links 0 and 2
      EXPECT_EQ(std::memcmp(to_device ? dev.p : host.p, ref.p, n), 0) << to_device << " " << after;
      EXPECT_FALSE(e.may_relay()[1]) << to_device << " " << after;
      EXPECT_TRUE(e.may_relay()[2]);
      // Link 1 carried at most the chunks whose both hops went out before the failure.
      EXPECT_LE(e.bytes_by_link()[1], static_cast<size_t>(after / 2) * (MiB + 4097)) << to_device << " " << after;
      // The failed relay's first hop of its last chunk may still be reading
      // the buffers (a real cudaFree would wait for it, the fake's does not):
      // the engine first, its links drained, then the buffers.
      e.close();
      sim::set_faults(sim::Faults{});
    }
}

// Staging only where a link can relay: one link alone needs none (its GPU
// short of memory for it changes nothing), two links get theirs.
TEST_F(MultipathSim, StagingOnlyWhereALinkCanRelay) {
  sim::Faults f;
  f.no_memory_on_device = 0;
  f.no_memory_from_bytes = 1 * MiB;  // the link's small scratch fits; staging would not
  sim::set_faults(f);
  MultipathEngine alone(options({0}));
  sim::set_faults(sim::Faults{});
  EXPECT_EQ(alone.staging_where(), "none");
  EXPECT_TRUE(alone.may_relay()[0]);  // nothing to relay for, nothing taken away
  MultipathEngine two(options({0, 1}));
  EXPECT_EQ(two.staging_where(), "plain allocations");  // the simulated GPUs have no heap
  EXPECT_TRUE(two.may_relay()[0] && two.may_relay()[1]);
  MultipathEngine loop(options({0, 0}));
  EXPECT_EQ(loop.staging_where(), "plain allocations");
}

// One GPU with loopback relays: its first link carries its own copies and
// gets no staging (nothing to relay for); the loopback links get theirs and
// carry their share, every byte.
TEST_F(MultipathSim, OneGpuAloneStagesOnlyItsLoopbackRelays) {
  const size_t chunk = MiB + 8191;  // a size no other allocation has (earlier tests may keep theirs for good)
  const size_t before = sim::device_blocks(0, chunk);
  MultipathEngine e(options({0, 0, 0}, chunk));
  EXPECT_EQ(e.staging_where(), "plain allocations");
  const size_t buffers = static_cast<size_t>(ferry::xfer::MultipathPolicy{}.outstanding);
  EXPECT_EQ(sim::device_blocks(0, chunk) - before, 2u * buffers);  // two relays, a buffer per chunk in flight each
  expect_round_trip(e, 32 * MiB + 5, 23);
  EXPECT_GT(e.bytes_by_link()[1] + e.bytes_by_link()[2], 0u);
  e.close();
  EXPECT_EQ(sim::device_blocks(0, chunk), before);
}

// Freeing memory waits for every stream of the GPU, and a stream armed behind
// a gate that user code opens waits for its trigger: while such a hold
// holds, close() keeps the staging instead of freeing it, and the next free
// with nothing held frees it.
TEST_F(MultipathSim, CloseWhileAnArmedTransferHoldsAStreamKeepsTheStagingForLater) {
  const size_t chunk = MiB + 12289;  // a size no other allocation has
  const size_t before = sim::device_blocks(0, chunk);
  std::atomic<bool> armed{true};
  auto hold = std::make_unique<ferry::sync::Hold>("a transfer armed in the test", [&] { return armed.load(); });
  MultipathEngine e(options({0, 0, 0}, chunk));
  expect_round_trip(e, 8 * MiB + 3, 29);
  e.close();  // returns: nothing waits for the hold
  EXPECT_EQ(sim::device_blocks(0, chunk) - before,
            2u * static_cast<size_t>(ferry::xfer::MultipathPolicy{}.outstanding));
  EXPECT_EQ(ferry::sync::run_kept_frees(), 1u);
  armed = false;  // triggered
  EXPECT_EQ(ferry::sync::run_kept_frees(), 0u);
  EXPECT_EQ(sim::device_blocks(0, chunk), before);
}

// A GPU made with `fault` set relays nothing (the engine over GPUs 0-2, `relay`
// the one left out); copies run over the other links, every byte.
static void expect_relay_left_out(const sim::Faults& fault, int relay, unsigned seed) {
  sim::set_faults(fault);
  MultipathEngine e(options({0, 1, 2}));
  sim::set_faults(sim::Faults{});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(e.may_relay()[i], i != relay) << "link " << i;
  expect_round_trip(e, 32 * MiB + 5, seed);
  EXPECT_EQ(e.bytes_by_link()[relay], 0u);
  EXPECT_GT(e.bytes_by_link()[relay == 1 ? 2 : 1], 0u);
}

// Without room for its staging buffers.
TEST_F(MultipathSim, ARelayWithoutMemoryForStagingLeavesItsShareToTheOthers) {
  sim::Faults f;
  f.no_memory_on_device = 1;
  f.no_memory_from_bytes = 1 * MiB;  // its small scratch fits; its staging does not
  expect_relay_left_out(f, 1, 21);
}

// Without peer access (e.g. too many peers), as one that cannot reach the others.
TEST_F(MultipathSim, ARelayWithoutPeerAccessLeavesItsShareToTheOthers) {
  sim::Faults f;
  f.no_peer_access_from_device = 2;
  expect_relay_left_out(f, 2, 23);
}

// An engine whose setup fails part way (a link's scratch out of memory)
// raises that, and what it had made is freed: nothing is left allocated.
TEST_F(MultipathSim, ASetupThatFailsFreesWhatItMade) {
  const size_t before = sim::live_blocks();
  sim::Faults f;
  f.no_memory_on_device = 1;
  sim::set_faults(f);
  try {
    MultipathEngine e(options({0, 1, 2}));
    ADD_FAILURE() << "the engine was made";
  } catch (const ferry::Error& err) {
    EXPECT_NE(std::string(err.what()).find("cudaMalloc"), std::string::npos) << err.what();
  }
  sim::set_faults(sim::Faults{});
  EXPECT_EQ(sim::live_blocks(), before) << "the failed setup left memory allocated";
}

// A relay whose work fails after it was submitted (its events report an
// error): the copy either completes through the other links, the relay
// retired (when its probe was what failed), or the engine breaks naming it
// (when a chunk was); never short without an error.
TEST_F(MultipathSim, ARelayFailingAfterSubmissionIsRetiredOrBreaksTheEngineNamingIt) {
  MultipathOptions o = options({0, 1});
  o.timeout_s = 10;  // under ThreadSanitizer the first copy alone took up to 2 s
  MultipathEngine e(o);
  const size_t n = 32 * MiB;
  Buf host(n, -1), dev(n, 0);
  fill(host, 5);
  cudaStream_t s = new_stream(0);
  e.copy(dev.p, host.p, n, s);
  ASSERT_TRUE(drained(s));
  e.check();
  ASSERT_GT(e.bytes_by_link()[1], 0u) << "the relay carried nothing before the fault";
  std::memset(dev.p, 0, n);
  sim::Faults f;
  f.fail_events_on_device = 1;
  sim::set_faults(f);
  bool broken = false;
  try {
    e.copy(dev.p, host.p, n, s);  // the engine may have broken already, at a probe between copies
    EXPECT_TRUE(drained(s, 20)) << "the stream stayed held";
    e.synchronize();
  } catch (const ferry::Error& err) {
    broken = true;
    EXPECT_EQ(err.code(), FERRY_ERROR_BROKEN) << err.what();
    EXPECT_NE(std::string(err.what()).find("cuda:1"), std::string::npos) << err.what();
  }
  if (broken) {
    EXPECT_THROW(e.copy(dev.p, host.p, n, s), ferry::Error);
  } else {
    EXPECT_FALSE(e.may_relay()[1]) << "the failing relay was not retired";
    EXPECT_EQ(std::memcmp(dev.p, host.p, n), 0) << "the copy completed short without an error";
  }
  e.close();
  sim::set_faults(sim::Faults{});
}

// A lane kept warm whose probe fails between copies retires that relay, and
// the next copy completes over the other links. The lanes stay warm for a
// second: with the default 50 ms, a slow host (ThreadSanitizer on two CPUs)
// let them lapse before the fault was set, and no probe ever met it.
TEST_F(MultipathSim, AKeptWarmProbeFailingBetweenCopiesRetiresTheRelay) {
  setenv("FERRY_MULTIPATH_KEEP_WARM_MS", "1000", 1);
  MultipathEngine e(options({0, 1, 2}));
  unsetenv("FERRY_MULTIPATH_KEEP_WARM_MS");
  const size_t n = 8 * MiB + 3;
  Pairs p(1, n, 0, 14);
  cudaStream_t s = new_stream(0);
  for (int i = 0; i < 10 && e.bytes_by_link()[2] == 0; ++i) {  // an 8 MiB copy may leave one link out
    e.copy(p.dst[0]->p, p.src[0]->p, n, s);
    ASSERT_TRUE(drained(s));
  }
  e.check();
  ASSERT_GT(e.bytes_by_link()[2], 0u) << "link 2 carried nothing in 10 copies: not kept warm";
  sim::Faults f;
  f.fail_events_on_device = 2;
  sim::set_faults(f);
  const auto t0 = std::chrono::steady_clock::now();
  while (e.may_relay()[2]) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "link 2 was not retired";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  e.check();  // no copy failed
  const size_t before = e.bytes_by_link()[2];
  std::memset(p.dst[0]->p, 0, n);
  e.copy(p.dst[0]->p, p.src[0]->p, n, s);
  ASSERT_TRUE(drained(s));
  e.check();
  EXPECT_TRUE(p.same(0));
  EXPECT_EQ(e.bytes_by_link()[2], before);
  e.close();
  sim::set_faults(sim::Faults{});
}

// A 16 MiB copy into GPU 0 whose own link fails: the engine's own copies
// there fail (the caller's stream copies none of it). `copy()` returns once
// the caller's stream went on.
struct OwnLinkFailing {
  static MultipathOptions own_link_options() {
    MultipathOptions o = options({0, 1});
    o.own_share_on_stream = 0;
    return o;
  }
  static constexpr size_t n = 16 * MiB;
  MultipathEngine e{own_link_options()};
  Buf host{n, -1}, dev{n, 0};
  cudaStream_t s = new_stream(0);
  OwnLinkFailing() {
    sim::Faults f;
    f.fail_on_device = 0;
    sim::set_faults(f);
  }
  ~OwnLinkFailing() { sim::set_faults(sim::Faults{}); }
  void copy() {
    e.copy(dev.p, host.p, n, s);
    ASSERT_TRUE(drained(s)) << "the stream stayed held";
  }
};

TEST_F(MultipathSim, TheTargetsOwnLinkFailingIsAClearErrorAndTheStreamGoesOn) {
  OwnLinkFailing f;
  f.copy();
  try {
    f.e.synchronize();
    ADD_FAILURE() << "synchronize() raised nothing";
  } catch (const ferry::Error& err) {
    EXPECT_EQ(err.code(), FERRY_ERROR_BROKEN) << err.what();
  }
}

// Nothing on the caller's stream shows a copy that failed: the engine says
// so on stderr at once, and close() raises it when no call did.
TEST_F(MultipathSim, AFailureNoCallRaisedIsSaidAndRaisedByClose) {
  OwnLinkFailing f;
  testing::internal::CaptureStderr();
  f.copy();
  const auto t0 = std::chrono::steady_clock::now();
  std::string said;
  while (said.find("ferry: a multipath copy failed") == std::string::npos &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    said += testing::internal::GetCapturedStderr();
    testing::internal::CaptureStderr();
  }
  said += testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("its data is incomplete"), std::string::npos) << said;
  try {
    f.e.close();
    ADD_FAILURE() << "close() raised nothing";
  } catch (const ferry::Error& err) {
    EXPECT_EQ(err.code(), FERRY_ERROR_BROKEN) << err.what();
  }
  f.e.close();  // raised once: a second close does nothing
}

TEST_F(MultipathSim, CloseWaitsForCopiesInFlightAndRefusesLaterOnes) {
  const size_t n = 32 * MiB;
  Buf host(n, -1), dev(n, 0);
  fill(host, 9);
  cudaStream_t s = new_stream(0);
  MultipathEngine e(options({0, 1, 2}));
  e.copy(dev.p, host.p, n, s);
  e.close();
  cudaStreamSynchronize(s);
  EXPECT_EQ(std::memcmp(dev.p, host.p, n), 0);
  EXPECT_THROW(e.copy(dev.p, host.p, n, s), ferry::Error);
  EXPECT_THROW(e.synchronize(), ferry::Error);
  e.close();  // a second close does nothing
}

// A relay's first chunk to a GPU can pay a one-time cost (on four H200s its
// second hop took 105-112 us for 2 MiB in a new engine, 7-19 after): that
// chunk is not taken for the relay's speed, so the relay still carries the
// next short copy instead of sitting out until its estimate ages.
TEST_F(MultipathSim, ARelaysSlowFirstChunkDoesNotKeepItOut) {
  // One chunk in flight per link and no probes: a copy of two chunks gives
  // each link one, so the relay's only chunk of the first copy is the slow one.
  MultipathOptions o = options({0, 1}, MiB, MiB);
  o.policy.outstanding = 1;
  o.policy.probe = false;
  MultipathEngine e(o);
  sim::Faults f;
  f.slow_on_device = 1;
  f.slow_copies = 1;
  f.slow_from_bytes = 256 << 10;  // a chunk's hop, not a probe
  f.slow_extra_s = 0.05;
  sim::set_faults(f);
  const size_t n = 2 * MiB;
  Pairs p(2, n, 0, 77);
  cudaStream_t s = new_stream(0);
  // Both on one stream, so that the second starts as soon as the first
  // landed, within the 0.1 s a slow estimate would keep the relay out.
  e.copy(p.dst[0]->p, p.src[0]->p, n, s);
  e.copy(p.dst[1]->p, p.src[1]->p, n, s);
  ASSERT_TRUE(drained(s));
  EXPECT_EQ(e.bytes_by_link()[1], 2 * MiB) << "the relay sat out the second copy";
  EXPECT_TRUE(p.same(0));
  EXPECT_TRUE(p.same(1));
}

TEST_F(MultipathSim, ManyCopiesBackToBackOnOneStream) {
  MultipathEngine e(options({0, 1}, MiB, MiB));
  cudaStream_t s = new_stream(0);
  const size_t n = 6 * MiB + 3;
  Pairs p(16, n, 0, 300);
  for (int i = 0; i < 16; ++i) e.copy(p.dst[i]->p, p.src[i]->p, n, s);
  ASSERT_TRUE(drained(s));
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(p.same(i)) << i;
}

// Random copies in both directions, on random streams of random GPUs from four
// threads, with streams held for a while at random: every byte lands and no
// stream stays held.
TEST_F(MultipathSim, RandomCopiesStreamsAndHoldsAllLand) {
  MultipathOptions o = options({0, 1, 2}, 2 * MiB, MiB);
  o.policy.outstanding = 3;
  MultipathEngine e(o);
  std::atomic<int> wrong{0}, stuck{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937 g(1000 + t);
      std::vector<cudaStream_t> streams;
      for (int d = 0; d < 3; ++d) streams.push_back(new_stream(d));
      for (int round = 0; round < 8; ++round) {
        const int d = static_cast<int>(g() % 3);
        cudaStream_t s = streams[d];
        std::unique_ptr<Hold> hold;
        if (g() % 3 == 0) hold = std::make_unique<Hold>(s);
        const size_t n = 1 + g() % (10 * MiB);
        Buf host(n, -1), dev(n, d), back(n, -1);
        fill(host, g());
        e.copy(dev.p, host.p, n, s);
        e.copy(back.p, dev.p, n, s);
        if (hold) {
          std::this_thread::sleep_for(std::chrono::milliseconds(g() % 20));
          hold->release();
        }
        if (!drained(s)) {
          ++stuck;
          return;
        }
        if (std::memcmp(back.p, host.p, n) != 0) ++wrong;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(stuck.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  e.synchronize();
}

// The two-GPU run's hang, replayed: only GPU 0 may relay, the copy goes into
// GPU 1 on its default stream while GPU 0 is current.
TEST_F(MultipathSim, OnlySomeGpusRelayIntoAnotherGpusDefaultStream) {
  MultipathOptions o = options({0, 1}, 2 * MiB, MiB);
  o.policy.may_relay = {true, false};
  MultipathEngine e(o);
  const size_t n = 96 * MiB + 9;
  Buf src(n, -1), dst(n, 1), back(n, -1);
  fill(src, 7);
  cudaSetDevice(0);
  auto r = e.copy(dst.p, src.p, n, nullptr);
  EXPECT_TRUE(r.multipath) << r.reason;
  EXPECT_EQ(r.links, 2);
  cudaSetDevice(1);
  ASSERT_TRUE(drained(nullptr, 8)) << "GPU 1's default stream never got past the copy";
  cudaSetDevice(0);
  e.check();
  EXPECT_EQ(std::memcmp(dst.p, src.p, n), 0);
  const auto used = e.bytes_by_link();
  EXPECT_GT(used[0], 0u);
  EXPECT_GT(used[1], 0u);
}

// relays="idle": a GPU another program runs on relays nothing while it does
// (the copy goes over the others, or as one plain copy where none is left),
// and relays again within kOtherProgramsLookS of that program's end; a GPU
// whose programs cannot be listed is refused when the engine is made.
TEST_F(MultipathSim, IdleRelaysKeepOffGpusOtherProgramsRunOn) {
  static std::atomic<int> on_gpu1{2};  // this program and another
  MultipathOptions o = options({0, 1, 2}, 2 * MiB, MiB);
  o.processes_on = [](int device) { return device == 1 ? on_gpu1.load() : 1; };
  MultipathEngine e(o);
  const size_t n = 48 * MiB + 3;
  auto copy_in = [&](unsigned seed) {
    Buf src(n, -1), dst(n, 0);
    fill(src, seed);
    cudaStream_t s = new_stream(0);
    const auto before = e.bytes_by_link();
    auto r = e.copy(dst.p, src.p, n, s);
    EXPECT_TRUE(drained(s));
    e.check();
    EXPECT_EQ(std::memcmp(dst.p, src.p, n), 0);
    const auto after = e.bytes_by_link();
    std::vector<size_t> moved(after.size());
    for (size_t i = 0; i < after.size(); ++i) moved[i] = after[i] - before[i];
    return std::make_pair(r, moved);
  };
  auto [r, moved] = copy_in(1);
  EXPECT_TRUE(r.multipath) << r.reason;
  EXPECT_EQ(r.links, 2);  // GPU 0's own link and GPU 2's
  EXPECT_EQ(moved[1], 0u) << "a GPU another program runs on relayed";
  EXPECT_GT(moved[2], 0u);
  on_gpu1 = 1;  // the other program ended
  std::this_thread::sleep_for(std::chrono::duration<double>(ferry::xfer::kOtherProgramsLookS + 0.2));
  std::tie(r, moved) = copy_in(2);
  EXPECT_EQ(r.links, 3);
  EXPECT_GT(moved[1], 0u) << "GPU 1 did not relay again once no other program ran on it";

  // Every peer in use: one plain copy, saying why.
  MultipathOptions busy = options({0, 1}, 2 * MiB, MiB);
  busy.processes_on = [](int device) { return device == 0 ? 1 : 3; };
  MultipathEngine b(busy);
  Buf src(n, -1), dst(n, 0);
  fill(src, 3);
  cudaStream_t s = new_stream(0);
  const auto plain = b.copy(dst.p, src.p, n, s);
  ASSERT_TRUE(drained(s));
  EXPECT_FALSE(plain.multipath);
  EXPECT_FALSE(plain.reason.empty());
  EXPECT_EQ(std::memcmp(dst.p, src.p, n), 0);

  MultipathOptions unknown = options({0, 1});
  unknown.processes_on = [](int) { return -1; };
  try {
    MultipathEngine u(unknown);
    ADD_FAILURE() << "an engine whose GPUs' programs cannot be listed was made";
  } catch (const ferry::Error& err) {
    EXPECT_NE(std::string(err.what()).find("relays='idle'"), std::string::npos) << err.what();
  }
}

// Under lazy module loading a kernel's first launch while a copy holds its
// stream blocks every CUDA call of the process, the engine's copies
// included, until that stream goes on. The watchdog, which makes no CUDA
// call, lets the stream go a second past the timeout, and says why.
TEST_F(MultipathSim, AWatchdogLetsTheStreamGoWhenTheEnginesCallsAreHeld) {
  MultipathOptions o = options({0, 1});
  o.timeout_s = 0.3;
  o.own_share_on_stream = 0;  // else copy() itself makes a held call, as a plain copy would
  MultipathEngine e(o);
  const size_t n = 8 * MiB + 1;
  Buf src(n, -1), dst(n, 0);
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  sim::Faults held;
  held.hold_copy_calls = true;
  sim::set_faults(held);
  const auto t0 = std::chrono::steady_clock::now();
  e.copy(dst.p, src.p, n, s);
  const bool went_on = drained(s, 5);
  const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  sim::set_faults(sim::Faults{});
  ASSERT_TRUE(went_on) << "the stream stayed held with the engine's thread blocked";
  EXPECT_GT(after, 1.2);
  EXPECT_LT(after, 2.5);
  expect_broken_saying(e, {"CUDA_MODULE_LOADING=EAGER"});
  e.close();
  cudaStreamDestroy(s);
}

// A copy on a new stream makes its gate words with CUDA calls; with those
// calls held too, the watchdog must still get its lock and let the first
// stream go.
TEST_F(MultipathSim, AWatchdogIsNotHeldByACopyMakingItsGate) {
  MultipathOptions o = options({0, 1});
  o.timeout_s = 0.3;
  o.own_share_on_stream = 0;  // else copy() itself makes a held call, as a plain copy would
  MultipathEngine e(o);
  const size_t n = 8 * MiB + 1;
  Buf src(n, -1), dst(n, 0), src2(n, -1), dst2(n, 0);
  cudaStream_t s = nullptr, s2 = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
  sim::Faults held;
  held.hold_copy_calls = true;
  sim::set_faults(held);
  e.copy(dst.p, src.p, n, s);
  held.hold_host_alloc = true;
  sim::set_faults(held);
  std::thread other([&] {
    try {
      e.copy(dst2.p, src2.p, n, s2);  // a new stream: its gate words are made now, and that call is held
    } catch (const ferry::Error&) {
    }
  });
  const bool went_on = drained(s, 5);
  sim::set_faults(sim::Faults{});
  other.join();
  ASSERT_TRUE(went_on) << "the watchdog waited for a copy making its gate";
  EXPECT_THROW(e.check(), ferry::Error);
  EXPECT_TRUE(drained(s2, 5)) << "a copy enqueued as the engine broke kept its stream";
  e.close();
  cudaStreamDestroy(s);
  cudaStreamDestroy(s2);
}

// A head copied by the caller's own stream (head_bytes): every byte both
// ways, nothing before the stream gets there, everything before the work
// after it, the rest still over the relays.
TEST_F(MultipathSim, AHeadOnTheCallersStreamKeepsOrderAndEveryByte) {
  MultipathOptions o = options({0, 1, 2});
  o.head_bytes = 3 * MiB;
  MultipathEngine e(o);
  size_t relayed_large = 0;  // by the relays in the copies of 8 MiB and more
  for (size_t n : {2 * MiB, 8 * MiB + 13, 24 * MiB + 7}) {
    Buf host(n, -1), dev(n, 0), back(n, -1), after(n, -1);
    fill(host, static_cast<unsigned>(n) + 1);
    std::memset(dev.p, 0, n);
    std::memset(back.p, 0xA5, n);
    cudaStream_t s = new_stream(0);
    Hold hold(s);
    const auto before = e.bytes_by_link();
    auto r = e.copy(dev.p, host.p, n, s);
    EXPECT_TRUE(r.multipath) << n;
    cudaMemcpyAsync(after.p, dev.p, n, cudaMemcpyDefault, s);
    e.copy(back.p, dev.p, n, s);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    EXPECT_TRUE(std::all_of(dev.b(), dev.b() + n, [](unsigned char c) { return c == 0; }))
        << n << ": bytes moved before the stream got to the copy";
    hold.release();
    cudaStreamSynchronize(s);
    e.check();
    EXPECT_EQ(std::memcmp(after.p, host.p, n), 0) << n << ": the work after the copy saw it incomplete";
    EXPECT_EQ(std::memcmp(back.p, host.p, n), 0) << n;
    const auto moved = e.bytes_by_link();
    if (n >= 8 * MiB) relayed_large += moved[1] + moved[2] - before[1] - before[2];
    cudaStreamDestroy(s);
  }
  // (Summed: a copy whose relays' probes came back late can go over the own
  // link alone.)
  EXPECT_GT(relayed_large, 0u) << "the rest of no copy went over the relays";
}

// With the own share on the stream: every byte both ways, copy after copy;
// the target's link carries each copy's share alone (timed on the stream's
// events), at most twice the even share, and the relays the rest.
TEST_F(MultipathSim, TheOwnShareOnTheStreamCopyAfterCopy) {
  MultipathOptions o = options({0, 1, 2});
  o.own_share_on_stream = 1;
  MultipathEngine e(o);
  cudaStream_t s = new_stream(0);
  for (int i = 0; i < 6; ++i) {
    const size_t n = 24 * MiB + 7 * i;
    Buf host(n, -1), dev(n, 0), back(n, -1);
    fill(host, 40 + i);
    std::memset(back.p, 0xA5, n);
    const auto before = e.bytes_by_link();
    EXPECT_TRUE(e.copy(dev.p, host.p, n, s).multipath);
    EXPECT_TRUE(e.copy(back.p, dev.p, n, s).multipath);
    cudaStreamSynchronize(s);
    e.check();
    ASSERT_EQ(std::memcmp(back.p, host.p, n), 0) << "copy " << i;
    const auto after = e.bytes_by_link();
    size_t all = 0;
    for (size_t l = 0; l < after.size(); ++l) all += after[l] - before[l];
    EXPECT_EQ(all, 2 * n) << "copy " << i;
    EXPECT_LE(after[0] - before[0], 2 * (2 * (n / 3) + (64 << 10))) << "copy " << i;
    EXPECT_GE(after[1] - before[1] + after[2] - before[2], 2 * (n - 2 * (n / 3))) << "copy " << i;
  }
  cudaStreamDestroy(s);
}

// synchronize() covers a copy's head (the caller's stream copies it), and
// the head counts in bytes_by_link.
TEST_F(MultipathSim, SynchronizeAndTheLinksCountCoverTheHead) {
  MultipathOptions o = options({0, 1});
  o.head_bytes = 64 * MiB;  // as much as the target link's share allows
  MultipathEngine e(o);
  const size_t n = 64 * MiB;
  Buf dev(n, 0), host(n, -1);
  fill(dev, 9);
  std::memset(host.p, 0, n);
  cudaStream_t s = new_stream(0);
  const auto before = e.bytes_by_link();
  e.copy(host.p, dev.p, n, s);
  e.synchronize();
  EXPECT_EQ(std::memcmp(host.p, dev.p, n), 0) << "synchronize() returned before the head landed";
  const auto after = e.bytes_by_link();
  EXPECT_EQ(after[0] + after[1] - before[0] - before[1], n);
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

// close() while another thread's copy is between its reached write and its
// gate's wait (its head call held) neither crashes nor leaves that stream
// waiting.
TEST_F(MultipathSim, CloseWhileACopyIsBeingEnqueued) {
  MultipathOptions o = options({0, 1});
  o.head_bytes = 4 * MiB;
  auto e = std::make_unique<MultipathEngine>(o);
  const size_t n = 16 * MiB;
  Buf src(n, -1), dst(n, 0);
  cudaStream_t s = new_stream(0);
  sim::Faults held;
  held.hold_copy_calls = true;
  sim::set_faults(held);
  int code = 0;
  std::thread caller([&] {
    try {
      e->copy(dst.p, src.p, n, s);
    } catch (const ferry::Error& err) {
      code = err.code();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the caller is in its head's copy call
  std::thread closer([&] { e->close(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  sim::set_faults(sim::Faults{});
  caller.join();
  closer.join();
  EXPECT_TRUE(drained(s, 5)) << "the stream was left waiting on the gate";
  EXPECT_TRUE(code == 0 || code == FERRY_ERROR_CLOSED) << code;
  e.reset();
  cudaStreamDestroy(s);
}

// A batch: copies at odd offsets of one buffer each side, with gaps that must
// stay poisoned; one start and one finish in the stream's order; the head
// takes the first copy's start; bad batches are named.
TEST_F(MultipathSim, ABatchIsOneCopyInStreamOrderEveryByteAndNoGapWritten) {
  MultipathOptions o = options({0, 1, 2});
  o.head_bytes = MiB;
  MultipathEngine e(o);
  const std::vector<size_t> sizes = {3 * MiB + 7, 1, 0, 4099, 9 * MiB + 1, 5, 2 * MiB};
  std::vector<size_t> at;
  size_t total = 3;
  for (size_t n : sizes) {
    at.push_back(total);
    total += n + 3;
  }
  Buf host(total, -1), dev(total, 0), back(total, -1), after(total, -1);
  fill(host, 77);
  std::memset(dev.p, 0xA5, total);
  std::memset(back.p, 0xA5, total);
  std::vector<MultipathPiece> in, out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    in.push_back({dev.b() + at[i], host.b() + at[i], sizes[i]});
    out.push_back({back.b() + at[i], dev.b() + at[i], sizes[i]});
  }
  cudaStream_t s = new_stream(0);
  Hold hold(s);
  auto r = e.copy_batch(in, s);
  EXPECT_TRUE(r.multipath);
  cudaMemcpyAsync(after.p, dev.p, total, cudaMemcpyDefault, s);
  e.copy_batch(out, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_TRUE(std::all_of(dev.b(), dev.b() + total, [](unsigned char c) { return c == 0xA5; }))
      << "bytes moved before the stream got to the batch";
  hold.release();
  cudaStreamSynchronize(s);
  e.check();
  std::vector<unsigned char> expect(total, 0xA5);
  for (size_t i = 0; i < sizes.size(); ++i) std::memcpy(expect.data() + at[i], host.b() + at[i], sizes[i]);
  EXPECT_EQ(std::memcmp(after.p, expect.data(), total), 0) << "the work after the batch saw it incomplete";
  EXPECT_EQ(std::memcmp(back.p, expect.data(), total), 0);
  // Mixed directions, overlapping destinations and null pointers are named.
  auto says = [&](const std::vector<MultipathPiece>& bad, const char* text) {
    try {
      e.copy_batch(bad, s);
      ADD_FAILURE() << "no error for: " << text;
    } catch (const ferry::Error& err) {
      EXPECT_NE(std::string(err.what()).find(text), std::string::npos) << err.what();
    }
  };
  says({in[0], out[1]}, "srcs[1]: copies from cuda:0 to host; expected every copy of a batch");
  says({in[0], {dev.b() + at[0] + 5, host.b() + at[4], 64}}, "two destinations overlap");
  says({in[0], {nullptr, host.p, 64}}, "dsts[1] is null");
  EXPECT_EQ(e.copy_batch({}, s).reason, "zero bytes");
  e.check();
  cudaStreamDestroy(s);
}

// The tail split into parts through the engine (8 MiB chunks, 512 KiB parts):
// a batch of odd copies whose first is shorter than the head lands every
// byte both ways, also while a relay fails to take chunks mid-copy.
TEST_F(MultipathSim, TailPartsAndAHeadLongerThanTheFirstCopyLandEveryByte) {
  for (int failing : {-1, 1}) {
    MultipathOptions o = options({0, 1, 2}, 8 * MiB);
    o.head_bytes = MiB;
    o.policy.tail_chunk = 512 << 10;
    MultipathEngine e(o);
    sim::Faults f;
    f.fail_on_device = failing;
    sim::set_faults(f);
    const std::vector<size_t> sizes = {5, 40 * MiB + 3, 7 * MiB + 1, 1};
    size_t total = 0;
    for (size_t n : sizes) total += n;
    Buf host(total, -1), dev(total, 0), back(total, -1);
    fill(host, 31 + static_cast<unsigned>(failing + 1));
    std::memset(dev.p, 0xA5, total);
    std::memset(back.p, 0xA5, total);
    std::vector<MultipathPiece> in, out;
    size_t at = 0;
    for (size_t n : sizes) {
      in.push_back({dev.b() + at, host.b() + at, n});
      out.push_back({back.b() + at, dev.b() + at, n});
      at += n;
    }
    cudaStream_t s = new_stream(0);
    EXPECT_TRUE(e.copy_batch(in, s).multipath);
    e.copy_batch(out, s);
    ASSERT_TRUE(drained(s)) << failing;
    e.check();
    EXPECT_EQ(std::memcmp(dev.p, host.p, total), 0) << failing;
    EXPECT_EQ(std::memcmp(back.p, host.p, total), 0) << failing;
    size_t moved = 0;
    for (size_t b : e.bytes_by_link()) moved += b;
    EXPECT_EQ(moved, 2 * total) << "every byte counted once on some link";
    if (failing == 1) EXPECT_FALSE(e.may_relay()[1]);
    sim::set_faults(sim::Faults{});
    cudaStreamDestroy(s);
  }
}

// An engine's posts outlast its copy by the gap to a next one
// (kMultipathBoardGapS), and are withdrawn soon after, well before they
// would lapse (kMultipathBoardHoldS).
TEST_F(MultipathSim, PostsOutlastACopyByTheGapAndGoSoonAfter) {
  using std::chrono::steady_clock;
  sim::reset(2, 20e9);
  MultipathEngine b(options({0, 1}, MiB, MiB));
  const size_t n = 8 * MiB;
  Buf h(n, -1), d(n, 1);
  std::string why;
  auto seen = ferry::xfer::LinkBoard::open("", &why);
  ASSERT_TRUE(seen) << why;
  const std::vector<ferry::xfer::GpuId> gpus{board_id(1)};
  auto posted = [&] { return seen->busy(gpus, 1, ferry::xfer::LinkBoard::now_ns())[0][0]; };
  cudaStream_t s = new_stream(1);
  // A millisecond after the copy landed its post is still up (the gap is 2
  // ms; withdrawn with the copy, it would be gone). A busy machine can wake
  // this thread late: up to five tries.
  bool kept = false;
  for (int attempt = 0; attempt < 5 && !kept; ++attempt) {
    fill(h, 7 + attempt);
    const auto r = b.copy(d.p, h.p, n, s);
    ASSERT_TRUE(r.multipath) << r.reason;
    b.synchronize();  // returns as the copy lands
    const auto landed = steady_clock::now();
    std::this_thread::sleep_until(landed + std::chrono::milliseconds(1));
    kept = posted() && steady_clock::now() - landed < std::chrono::microseconds(1500);
    while (posted()) {
      ASSERT_LT(steady_clock::now() - landed, std::chrono::milliseconds(40)) << "the post stayed until it lapsed";
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ASSERT_TRUE(drained(s));
    EXPECT_EQ(std::memcmp(d.p, h.p, n), 0);
  }
  EXPECT_TRUE(kept) << "the post went with the copy: another program could relay over the link before its next";
}

// Three engines (three programs, as far as the link board goes): while B
// and C copy into GPUs 1 and 2, A's copy into GPU 0 relays over neither's
// link, every GPU being copied by its own program; with the board off it
// does (B's and C's chunks there do not hold A's probes long enough to keep
// A off them).
TEST_F(MultipathSim, EveryOtherGpuCopiedByItsProgramKeepsRelaysOffTheirLinks) {
  sim::reset(3, 2e9);  // slow links: B's and C's copies outlast A's
  for (const bool board : {true, false}) {
    setenv("FERRY_MULTIPATH_BOARD", board ? "1" : "0", 1);
    // B's and C's 64 MiB at 2 GB/s take 33 ms, but under ThreadSanitizer on
    // a loaded CPU far longer: a timeout would let their streams go with
    // chunks still landing (check() below says so).
    MultipathOptions slow_ok = options({0, 1, 2}, MiB, MiB);
    slow_ok.timeout_s = 120;
    MultipathEngine b(slow_ok), c(slow_ok);
    MultipathEngine a(slow_ok);
    unsetenv("FERRY_MULTIPATH_BOARD");
    const size_t big = 64 * MiB, n = 4 * MiB;  // A's copy well inside B's and C's
    Buf bh(big, -1), bd(big, 1), ch(big, -1), cd(big, 2);
    fill(bh, 5);
    fill(ch, 6);
    Pairs p(1, n, 0, 9);
    cudaStream_t sb = new_stream(1), sc = new_stream(2), sa = new_stream(0);
    b.copy(bd.p, bh.p, big, sb);
    c.copy(cd.p, ch.p, big, sc);
    if (board) {  // their copies under way: their posts up
      std::string why;
      auto seen = ferry::xfer::LinkBoard::open("", &why);
      ASSERT_TRUE(seen) << why;
      const std::vector<ferry::xfer::GpuId> gpus{board_id(1), board_id(2)};
      const auto t0 = std::chrono::steady_clock::now();
      for (;;) {
        const auto busy = seen->busy(gpus, 1, ferry::xfer::LinkBoard::now_ns());
        if (busy[0][0] && busy[1][0]) break;
        ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "B and C never posted";
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    a.copy(p.dst[0]->p, p.src[0]->p, n, sa);
    ASSERT_TRUE(drained(sa));
    auto used = a.bytes_by_link();
    EXPECT_EQ(cudaStreamQuery(sb), cudaErrorNotReady) << "B's copy ended before A's: the case did not arise";
    EXPECT_EQ(cudaStreamQuery(sc), cudaErrorNotReady) << "C's copy ended before A's: the case did not arise";
    // Without the board, A's probes of links 1 and 2 can come back late
    // behind B's and C's chunks and keep A off them for a whole copy: A
    // copies again while B and C still run.
    for (int again = 0; !board && again < 3 && used[1] + used[2] == 0 && cudaStreamQuery(sb) == cudaErrorNotReady &&
                        cudaStreamQuery(sc) == cudaErrorNotReady;
         ++again) {
      a.copy(p.dst[0]->p, p.src[0]->p, n, sa);
      ASSERT_TRUE(drained(sa));
      used = a.bytes_by_link();
    }
    if (board)
      EXPECT_EQ(used[1] + used[2], 0u) << "A relayed over the link of a GPU its own program copies into";
    else
      EXPECT_GT(used[1] + used[2], 0u) << "without the board A would relay";
    ASSERT_TRUE(drained(sb, 120));
    ASSERT_TRUE(drained(sc, 120));
    ASSERT_NO_THROW(b.check()) << "B's engine let its stream go on an error";
    ASSERT_NO_THROW(c.check()) << "C's engine let its stream go on an error";
    EXPECT_TRUE(p.same(0));
    EXPECT_EQ(std::memcmp(bd.p, bh.p, big), 0);
    EXPECT_EQ(std::memcmp(cd.p, ch.p, big), 0);
  }
}

// The board with relays="idle": GPU 2 runs another program, so its link
// relays nothing; B copies into GPU 1. Every link that could relay for A is
// then posted, so A keeps off GPU 1's link too, as if GPU 2 had none.
TEST_F(MultipathSim, AGpuThatCannotRelayIsNoSpareLinkOnTheBoard) {
  sim::reset(3, 2e9);  // slow links: B's copy outlasts A's
  setenv("FERRY_MULTIPATH_BOARD", "1", 1);
  MultipathOptions ob = options({0, 1, 2}, MiB, MiB);
  ob.timeout_s = 120;  // as above: B's copy may take long under a sanitizer
  MultipathOptions oa = ob;
  oa.processes_on = [](int device) { return device == 2 ? 2 : 1; };
  MultipathEngine b(ob), a(oa);
  unsetenv("FERRY_MULTIPATH_BOARD");
  const size_t big = 64 * MiB, n = 4 * MiB;
  Buf bh(big, -1), bd(big, 1);
  fill(bh, 5);
  Pairs p(1, n, 0, 9);
  cudaStream_t sb = new_stream(1), sa = new_stream(0);
  b.copy(bd.p, bh.p, big, sb);
  std::string why;
  auto seen = ferry::xfer::LinkBoard::open("", &why);
  ASSERT_TRUE(seen) << why;
  const std::vector<ferry::xfer::GpuId> gpu1{board_id(1)};
  const auto t0 = std::chrono::steady_clock::now();
  while (!seen->busy(gpu1, 1, ferry::xfer::LinkBoard::now_ns())[0][0]) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "B never posted";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Probes coming back late behind B's chunks can keep A off link 1 for a
  // copy even where it may relay: three copies give it the chance.
  for (int k = 0; k < 3; ++k) {
    a.copy(p.dst[0]->p, p.src[0]->p, n, sa);
    ASSERT_TRUE(drained(sa));
  }
  const auto used = a.bytes_by_link();
  EXPECT_EQ(cudaStreamQuery(sb), cudaErrorNotReady) << "B's copy ended before A's: the case did not arise";
  EXPECT_EQ(used[2], 0u) << "a GPU another program runs on relayed";
  EXPECT_EQ(used[1], 0u) << "A relayed over the link of a GPU its own program copies into, with no link to spare";
  ASSERT_TRUE(drained(sb, 120));
  ASSERT_NO_THROW(b.check());
  EXPECT_TRUE(p.same(0));
  EXPECT_EQ(std::memcmp(bd.p, bh.p, big), 0);
}

// A copy whose stream is held (as behind a kernel) when copy() returns: its
// links probe while the stream gets there, so that its chunks need not wait
// for probes once it does; the stream stays held meanwhile, and the bytes
// arrive whole after the release.
TEST_F(MultipathSim, LinksProbeForACopyWhileItsStreamIsHeld) {
  setenv("FERRY_MULTIPATH_KEEP_WARM_MS", "0", 1);  // lanes lapse between copies
  MultipathEngine e(options({0, 1, 2}));
  unsetenv("FERRY_MULTIPATH_KEEP_WARM_MS");
  const size_t n = 8 * MiB;
  Pairs p(1, n, 0, 12);
  cudaStream_t s = new_stream(0);
  e.copy(p.dst[0]->p, p.src[0]->p, n, s);  // every link measured, then idle
  ASSERT_TRUE(drained(s));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // every lane lapsed
  const size_t before = sim::copies(ferry::xfer::kMultipathProbeBytes);
  Hold hold(s);
  e.copy(p.dst[0]->p, p.src[0]->p, n, s);
  const auto t0 = std::chrono::steady_clock::now();
  while (sim::copies(ferry::xfer::kMultipathProbeBytes) - before < 3) {
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5))
        << "the links did not probe while the copy's stream was held ("
        << sim::copies(ferry::xfer::kMultipathProbeBytes) - before << " probes)";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady) << "the stream went on while held";
  hold.release();
  ASSERT_TRUE(drained(s));
  e.check();
  EXPECT_TRUE(p.same(0));
}

// With FERRY_MULTIPATH_KEEP_WARM_MS, the links that carried a copy probe
// while idle (each lane every 0.7 ms), for that long and no longer; without
// it they send nothing between copies. The copies stay byte-exact.
TEST_F(MultipathSim, LinksKeptWarmProbeBetweenCopiesForAWhile) {
  for (const bool warm : {false, true}) {
    // 300 ms: ThreadSanitizer on two loaded CPUs took over 30 ms from the
    // last landing to the stream seen going on.
    setenv("FERRY_MULTIPATH_KEEP_WARM_MS", warm ? "300" : "0", 1);
    MultipathEngine e(options({0, 1, 2}));
    unsetenv("FERRY_MULTIPATH_KEEP_WARM_MS");
    const size_t n = 8 * MiB;
    Pairs p(1, n, 0, 13);
    cudaStream_t s = new_stream(0);
    e.copy(p.dst[0]->p, p.src[0]->p, n, s);
    ASSERT_TRUE(drained(s));
    e.check();
    EXPECT_TRUE(p.same(0));
    const size_t before = sim::copies(ferry::xfer::kMultipathProbeBytes);
    std::this_thread::sleep_for(std::chrono::milliseconds(15));
    const size_t idle = sim::copies(ferry::xfer::kMultipathProbeBytes) - before;
    if (!warm) {
      EXPECT_EQ(idle, 0u) << "links probed between copies with keep-warm off";
      continue;
    }
    // Three links, 15 ms: about 20 probes each; a loaded machine (or
    // ThreadSanitizer) sends far fewer, but each link some.
    EXPECT_GE(idle, 3u) << "the links kept warm probed too little";
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // past the 300 ms
    const size_t after = sim::copies(ferry::xfer::kMultipathProbeBytes);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(sim::copies(ferry::xfer::kMultipathProbeBytes), after) << "links probed past keep-warm's time";
    e.copy(p.dst[0]->p, p.src[0]->p, n, s);
    ASSERT_TRUE(drained(s));
    e.check();
    EXPECT_TRUE(p.same(0));
  }
}
