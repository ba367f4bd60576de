// NVSHMEM measured the way python/ferry/bench/symm.py measures ferry's heap,
// so that both land in one table: put bandwidth to the next rank (block scope,
// 1 and 8 blocks; and nvshmemx_putmem_on_stream), a signal's half round trip
// between ranks 0 and 1, barrier latency in a kernel and on a stream, and bf16
// all-reduce latency in a kernel (one block: NVSHMEM's device collectives run
// one block per team) and on a stream. Each time is rank 0's CUDA-event time
// of one launch that repeats the operation `iters` times, after a host
// barrier; the median of `reps` launches after a warm-up. In-kernel rows are
// the slope between launches of `iters` and 5 x `iters` operations (what a
// launch costs once drops out), as ferry's are.
//
// python/ferry/bench/nvshmem.py builds it against the nvidia-nvshmem wheel and
// starts one process per GPU:
//   nvshmem_bench RANK WORLD UID_FILE MIN_BYTES MAX_BYTES ITERS REPS AR_SIZES(csv)
// Rank 0 writes NVSHMEM's unique id to UID_FILE; the others read it. Rank 0
// prints one "record op impl bytes time_us scope" line per measurement and
// "check ..." lines for the bytes it verified.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nvshmem.h>
#include <nvshmemx.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

#define CHECK_CUDA(x)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      std::fprintf(stderr, "nvshmem_bench: %s failed: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                       \
    }                                                                                     \
  } while (0)

__global__ void put_kernel(char* dst, const char* src, uint64_t bytes, int peer, int iters) {
  const uint64_t per = (bytes + gridDim.x - 1) / gridDim.x;
  const uint64_t begin = per * blockIdx.x < bytes ? per * blockIdx.x : bytes;
  const uint64_t end = begin + per < bytes ? begin + per : bytes;
  for (int i = 0; i < iters; ++i)
    if (end > begin) nvshmemx_putmem_block(dst + begin, src + begin, end - begin, peer);
  nvshmem_quiet();
}

// A get on `blocks` blocks: each round a block takes the next block's slice
// (the same slice again would come from L1), as ferry's get rows do.
__global__ void get_kernel(char* dst, const char* src, uint64_t bytes, int peer, int iters) {
  const uint64_t per = (bytes + gridDim.x - 1) / gridDim.x;
  for (int i = 0; i < iters; ++i) {
    const uint64_t b = (blockIdx.x + uint64_t(i)) % gridDim.x;
    const uint64_t begin = per * b < bytes ? per * b : bytes;
    const uint64_t end = begin + per < bytes ? begin + per : bytes;
    if (end > begin) nvshmemx_getmem_block(dst + begin, src + begin, end - begin, peer);
  }
}

// put or get at thread (kWarp false) or warp scope: each thread or warp its
// own slice, as ferry's scoped rows.
template <bool kWarp>
__global__ void scoped_kernel(char* dst, const char* src, uint64_t bytes, int peer, int iters, int get) {
  const uint64_t size = kWarp ? 32 : 1;
  const uint64_t units = uint64_t(gridDim.x) * blockDim.x / size, per_block = blockDim.x / size;
  const uint64_t unit = (uint64_t(blockIdx.x) * blockDim.x + threadIdx.x) / size;
  const uint64_t per = ((bytes + units - 1) / units + 15) / 16 * 16;
  for (int i = 0; i < iters; ++i) {
    const uint64_t u = get ? (unit + uint64_t(i) * per_block) % units : unit;
    const uint64_t begin = per * u < bytes ? per * u : bytes;
    const uint64_t end = begin + per < bytes ? begin + per : bytes;
    if (end <= begin) continue;
    if (get && kWarp)
      nvshmemx_getmem_warp(dst + begin, src + begin, end - begin, peer);
    else if (get)
      nvshmem_getmem(dst + begin, src + begin, end - begin, peer);
    else if (kWarp)
      nvshmemx_putmem_warp(dst + begin, src + begin, end - begin, peer);
    else
      nvshmem_putmem(dst + begin, src + begin, end - begin, peer);
  }
  if (!get) nvshmem_quiet();
}

// A put's latency: the first thread (0), warp (1) or block (2) puts and quiets, `iters` times.
template <int kScope>
__global__ void put_latency_kernel(char* dst, const char* src, uint64_t bytes, int peer, int iters) {
  if ((kScope == 0 && threadIdx.x != 0) || (kScope == 1 && threadIdx.x >= 32)) return;
  for (int i = 0; i < iters; ++i) {
    if (kScope == 0) nvshmem_putmem(dst, src, bytes, peer);
    if (kScope == 1) nvshmemx_putmem_warp(dst, src, bytes, peer);
    if (kScope == 2) nvshmemx_putmem_block(dst, src, bytes, peer);
    if (kScope != 2 || threadIdx.x == 0) nvshmem_quiet();
    if (kScope == 2) __syncthreads();
  }
}

// g's latency: dependent loads of the peer's words (0), each in another of
// kLatencyLines 128-byte lines, as ferry's row.
constexpr int kLatencyLines = 4096;
__global__ void g_latency_kernel(const int64_t* src, int peer, int iters, int64_t* out) {
  int64_t v = 0;
  for (int i = 0; i < iters; ++i) v = nvshmem_int64_g(src + v + int64_t(i % kLatencyLines) * 16, peer);
  *out = v;
}

__global__ void pingpong_kernel(uint64_t* sig, uint64_t base, int iters, int me) {
  const int peer = 1 - me;
  for (uint64_t i = base + 1; i <= base + iters; ++i) {
    if (me == 0) {
      nvshmemx_signal_op(sig, i, NVSHMEM_SIGNAL_SET, peer);
      nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, i);
    } else {
      nvshmem_signal_wait_until(sig, NVSHMEM_CMP_GE, i);
      nvshmemx_signal_op(sig, i, NVSHMEM_SIGNAL_SET, peer);
    }
  }
}

__global__ void barrier_kernel(int iters) {
  for (int i = 0; i < iters; ++i) nvshmemx_barrier_all_block();
}

__global__ void all_reduce_kernel(__nv_bfloat16* dst, const __nv_bfloat16* src, size_t count, int iters) {
  for (int i = 0; i < iters; ++i) nvshmemx_bfloat16_sum_reduce_block(NVSHMEM_TEAM_WORLD, dst, src, count);
}

// Small integers, different on every rank, whose sums bf16 holds exactly.
__global__ void fill_bf16(__nv_bfloat16* p, size_t n, int rank) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = __float2bfloat16(static_cast<float>(static_cast<int>((i * 7 + rank * 3) % 9) - 4));
}

__global__ void fill_bytes(unsigned char* p, size_t n, int rank) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    p[i] = static_cast<unsigned char>((i * 131 + rank * 17 + (i >> 12)) & 0xff);
}

unsigned char expected_byte(size_t i, int rank) {
  return static_cast<unsigned char>((i * 131 + rank * 17 + (i >> 12)) & 0xff);
}

struct Timer {
  cudaStream_t s;
  cudaEvent_t a, b;
  int reps;

  // One launch's event time in microseconds, after a host barrier.
  template <class F>
  double once(F launch) {
    CHECK_CUDA(cudaStreamSynchronize(s));
    nvshmem_barrier_all();
    CHECK_CUDA(cudaEventRecord(a, s));
    launch();
    CHECK_CUDA(cudaEventRecord(b, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
    return ms * 1000.0;
  }

  // Median of `reps` timed launches (after a warm-up) in microseconds per launch.
  template <class F>
  double operator()(F launch) {
    std::vector<double> t;
    for (int r = 0; r <= reps; ++r) {
      const double us = once(launch);
      if (r > 0) t.push_back(us);
    }
    return median(t);
  }

  // Microseconds per operation of launch(n), a kernel repeating an operation
  // n times: launches of `iters` and of kSlope * iters operations alternate
  // (after a warm-up pair), and the difference of their medians over the
  // difference in count leaves out what a launch costs once, as
  // python/ferry/bench/symm.py measures ferry's kernels.
  template <class F>
  double per_op(F launch, int iters) {
    std::vector<double> t1, t2;
    for (int r = 0; r <= reps; ++r) {
      const double a1 = once([&] { launch(iters); });
      const double a2 = once([&] { launch(kSlope * iters); });
      if (r > 0) {
        t1.push_back(a1);
        t2.push_back(a2);
      }
    }
    return (median(t2) - median(t1)) / ((kSlope - 1) * iters);
  }

  static constexpr int kSlope = 5;

  static double median(std::vector<double> t) {
    std::sort(t.begin(), t.end());
    const size_t n = t.size();
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
  }
};

void collective_launch(const void* fn, int blocks, int threads, void** args, cudaStream_t s) {
  const int err = nvshmemx_collective_launch(fn, dim3(blocks), dim3(threads), args, 0, s);
  if (err != 0) {
    std::fprintf(stderr, "nvshmem_bench: nvshmemx_collective_launch failed (%d)\n", err);
    std::exit(2);
  }
}

nvshmemx_uniqueid_t exchange_uid(int rank, const std::string& path) {
  nvshmemx_uniqueid_t uid = NVSHMEMX_UNIQUEID_INITIALIZER;
  if (rank == 0) {
    if (nvshmemx_get_uniqueid(&uid) != 0) {
      std::fprintf(stderr, "nvshmem_bench: nvshmemx_get_uniqueid failed\n");
      std::exit(2);
    }
    const std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f || std::fwrite(&uid, sizeof uid, 1, f) != 1 || std::fclose(f) != 0 ||
        std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::fprintf(stderr, "nvshmem_bench: cannot write %s\n", path.c_str());
      std::exit(2);
    }
    return uid;
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (f) {
      const bool ok = std::fread(&uid, sizeof uid, 1, f) == 1;
      std::fclose(f);
      if (ok) return uid;
    }
    if (std::chrono::steady_clock::now() > give_up) {
      std::fprintf(stderr, "nvshmem_bench: rank %d: no unique id in %s after 60 s\n", rank, path.c_str());
      std::exit(2);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::vector<uint64_t> parse_sizes(const char* csv) {
  std::vector<uint64_t> out;
  for (const char* p = csv; *p;) {
    char* end = nullptr;
    out.push_back(std::strtoull(p, &end, 10));
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: %s RANK WORLD UID_FILE MIN_BYTES MAX_BYTES ITERS REPS AR_SIZES\n", argv[0]);
    return 2;
  }
  const int rank = std::atoi(argv[1]), world = std::atoi(argv[2]);
  const uint64_t min_bytes = std::strtoull(argv[4], nullptr, 10), max_bytes = std::strtoull(argv[5], nullptr, 10);
  const int iters = std::atoi(argv[6]), reps = std::atoi(argv[7]);
  const std::vector<uint64_t> ar_sizes = parse_sizes(argv[8]);
  int devices = 0;
  CHECK_CUDA(cudaGetDeviceCount(&devices));
  CHECK_CUDA(cudaSetDevice(rank % devices));

  nvshmemx_uniqueid_t uid = exchange_uid(rank, argv[3]);
  nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
  nvshmemx_set_attr_uniqueid_args(rank, world, &uid, &attr);
  if (nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr) != 0) {
    std::fprintf(stderr, "nvshmem_bench: rank %d: nvshmemx_init_attr failed\n", rank);
    return 2;
  }
  const int me = nvshmem_my_pe(), n = nvshmem_n_pes();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const bool report = me == 0;
  auto emit = [&](const char* op, const char* impl, uint64_t bytes, double us, const char* scope) {
    if (report) std::printf("record %s %s %llu %.3f %s\n", op, impl, (unsigned long long)bytes, us, scope);
    std::fflush(stdout);
  };

  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  Timer timed{s, nullptr, nullptr, reps};
  CHECK_CUDA(cudaEventCreate(&timed.a));
  CHECK_CUDA(cudaEventCreate(&timed.b));
  int failures = 0;

  // Put bandwidth to the next rank.
  char* dst = static_cast<char*>(nvshmem_malloc(max_bytes));
  char* src = nullptr;
  CHECK_CUDA(cudaMalloc(&src, max_bytes));
  if (!dst) {
    std::fprintf(stderr, "nvshmem_bench: nvshmem_malloc(%llu) failed\n", (unsigned long long)max_bytes);
    return 2;
  }
  fill_bytes<<<1024, 256, 0, s>>>(reinterpret_cast<unsigned char*>(src), max_bytes, me);
  for (uint64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    for (int blocks : {1, 8}) {
      const double t = timed.per_op(
          [&](int it) {
            put_kernel<<<blocks, 512, 0, s>>>(dst, src, bytes, next, it);
            CHECK_CUDA(cudaGetLastError());
          },
          iters);
      emit("put", blocks == 1 ? "nvshmem-device-1b" : "nvshmem-device-8b", bytes, t, "block");
    }
    const double t = timed([&] {
      for (int i = 0; i < iters; ++i) nvshmemx_putmem_on_stream(dst, src, bytes, next, s);
      nvshmemx_quiet_on_stream(s);
    });
    emit("put", "nvshmem-stream", bytes, t / iters, "stream");
  }
  {
    // What landed here is the previous rank's source, every byte.
    CHECK_CUDA(cudaStreamSynchronize(s));
    nvshmem_barrier_all();
    std::vector<unsigned char> got(max_bytes);
    CHECK_CUDA(cudaMemcpy(got.data(), dst, max_bytes, cudaMemcpyDeviceToHost));
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < max_bytes; ++i) wrong += got[i] != expected_byte(i, prev);
    if (report)
      std::printf("check put %llu bytes: %llu wrong\n", (unsigned long long)max_bytes, (unsigned long long)wrong);
    failures += wrong != 0;
  }

  // Get from the next rank (its dst holds this rank's bytes, put above), and
  // put and get at thread and warp scope; every byte checked once.
  char* got_dev = nullptr;
  CHECK_CUDA(cudaMalloc(&got_dev, max_bytes));
  auto check_got = [&](const char* what, uint64_t bytes, int source) {
    CHECK_CUDA(cudaStreamSynchronize(s));
    nvshmem_barrier_all();
    std::vector<unsigned char> got(bytes);
    CHECK_CUDA(cudaMemcpy(got.data(), got_dev, bytes, cudaMemcpyDeviceToHost));
    uint64_t wrong = 0;
    for (uint64_t i = 0; i < bytes; ++i) wrong += got[i] != expected_byte(i, source);
    if (wrong && report)
      std::printf("check %s %llu bytes: %llu wrong\n", what, (unsigned long long)bytes, (unsigned long long)wrong);
    failures += wrong != 0;
  };
  for (uint64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    double t = timed.per_op(
        [&](int it) {
          get_kernel<<<8, 512, 0, s>>>(got_dev, dst, bytes, next, it);
          CHECK_CUDA(cudaGetLastError());
        },
        iters);
    emit("get", "nvshmem-device-8b", bytes, t, "block");
    CHECK_CUDA(cudaMemsetAsync(got_dev, 0xA5, bytes, s));
    get_kernel<<<8, 512, 0, s>>>(got_dev, dst, bytes, next, 1);
    check_got("get", bytes, me);
    for (int warp = 0; warp < 2; ++warp) {
      for (int get = 0; get < 2; ++get) {
        auto launch = [&](int it) {
          if (warp)
            scoped_kernel<true><<<8, 512, 0, s>>>(get ? got_dev : dst, get ? dst : src, bytes, next, it, get);
          else
            scoped_kernel<false><<<8, 512, 0, s>>>(get ? got_dev : dst, get ? dst : src, bytes, next, it, get);
          CHECK_CUDA(cudaGetLastError());
        };
        t = timed.per_op(launch, iters);
        emit(get ? "get" : "put", warp ? "nvshmem-device-8b-warp" : "nvshmem-device-8b-thread", bytes, t,
             warp ? "warp" : "thread");
        if (get) {
          CHECK_CUDA(cudaMemsetAsync(got_dev, 0xA5, bytes, s));
          launch(1);
          check_got(warp ? "get by warps" : "get by threads", bytes, me);
        }
      }
    }
  }
  CHECK_CUDA(cudaFree(got_dev));
  for (uint64_t bytes : {uint64_t(8), uint64_t(4096)}) {
    const char* names[] = {"nvshmem-device-thread", "nvshmem-device-warp", "nvshmem-device-block"};
    const char* scopes[] = {"thread", "warp", "block"};
    for (int scope = 0; scope < 3; ++scope) {
      const double t = timed.per_op(
          [&](int it) {
            if (scope == 0) put_latency_kernel<0><<<1, 32, 0, s>>>(dst, src, bytes, next, it);
            if (scope == 1) put_latency_kernel<1><<<1, 32, 0, s>>>(dst, src, bytes, next, it);
            if (scope == 2) put_latency_kernel<2><<<1, 512, 0, s>>>(dst, src, bytes, next, it);
            CHECK_CUDA(cudaGetLastError());
          },
          iters);
      emit("put_latency", names[scope], bytes, t, scopes[scope]);
    }
  }
  {
    int64_t* word = static_cast<int64_t*>(nvshmem_calloc(kLatencyLines * 16, sizeof(int64_t)));
    int64_t* out = nullptr;
    CHECK_CUDA(cudaMalloc(&out, sizeof(int64_t)));
    CHECK_CUDA(cudaMemsetAsync(out, 0xff, sizeof(int64_t), s));
    nvshmem_barrier_all();
    const double t = timed.per_op(
        [&](int it) {
          g_latency_kernel<<<1, 1, 0, s>>>(word, next, it, out);
          CHECK_CUDA(cudaGetLastError());
        },
        iters);
    emit("g_latency", "nvshmem-device", 8, t, "thread");
    int64_t v = -1;
    CHECK_CUDA(cudaMemcpy(&v, out, sizeof v, cudaMemcpyDeviceToHost));
    failures += v != 0;
    CHECK_CUDA(cudaFree(out));
    nvshmem_barrier_all();
    nvshmem_free(word);
  }

  // A signal's half round trip between ranks 0 and 1; barriers.
  uint64_t* sig = static_cast<uint64_t*>(nvshmem_calloc(1, sizeof(uint64_t)));
  uint64_t done = 0;  // round trips so far: every launch goes on counting where the last stopped
  double t = timed.per_op(
      [&](int it) {
        const uint64_t base = done;
        done += it;
        if (me < 2) {
          pingpong_kernel<<<1, 1, 0, s>>>(sig, base, it, me);
          CHECK_CUDA(cudaGetLastError());
        }
      },
      iters);
  emit("signal_half_rtt", "nvshmem-device", 8, t / 2, "thread");
  t = timed.per_op(
      [&](int it) {
        void* args[] = {&it};
        collective_launch(reinterpret_cast<const void*>(barrier_kernel), 1, 32, args, s);
      },
      iters);
  emit("barrier", "nvshmem-device", 0, t, "block");
  t = timed([&] {
    for (int i = 0; i < iters; ++i) nvshmemx_barrier_all_on_stream(s);
  });
  emit("barrier", "nvshmem-stream", 0, t / iters, "stream");

  // bf16 all-reduce by size.
  const uint64_t ar_max = *std::max_element(ar_sizes.begin(), ar_sizes.end());
  auto* a_src = static_cast<__nv_bfloat16*>(nvshmem_malloc(ar_max));
  auto* a_dst = static_cast<__nv_bfloat16*>(nvshmem_malloc(ar_max));
  fill_bf16<<<256, 256, 0, s>>>(a_src, ar_max / 2, me);
  // Every element of the last result against the sum computed here; poisoned before the next impl runs.
  auto check_all_reduce = [&](size_t count, const char* impl) {
    CHECK_CUDA(cudaStreamSynchronize(s));
    nvshmem_barrier_all();  // every member's part has landed here
    std::vector<__nv_bfloat16> got(count);
    CHECK_CUDA(cudaMemcpy(got.data(), a_dst, count * 2, cudaMemcpyDeviceToHost));
    uint64_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<float>(static_cast<int>((i * 7 + r * 3) % 9) - 4);
      wrong += __bfloat162float(got[i]) != want;
    }
    if (report)
      std::printf("check all_reduce %s %llu bytes: %llu wrong\n", impl, (unsigned long long)count * 2,
                  (unsigned long long)wrong);
    failures += wrong != 0;
    CHECK_CUDA(cudaMemsetAsync(a_dst, 0xff, count * 2, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    nvshmem_barrier_all();  // no member writes here again before the poison is in place
  };
  for (uint64_t bytes : ar_sizes) {
    const size_t count = bytes / 2;
    for (int threads : {512, 1024}) {
      t = timed.per_op(
          [&](int it) {
            size_t c = count;
            void* args[] = {&a_dst, &a_src, &c, &it};
            collective_launch(reinterpret_cast<const void*>(all_reduce_kernel), 1, threads, args, s);
          },
          iters);
      emit("all_reduce", threads == 512 ? "nvshmem-device-1b" : "nvshmem-device-1b1024t", bytes, t, "grid");
      check_all_reduce(count, threads == 512 ? "nvshmem-device-1b" : "nvshmem-device-1b1024t");
    }
    t = timed([&] {
      for (int i = 0; i < iters; ++i)
        nvshmemx_bfloat16_sum_reduce_on_stream(NVSHMEM_TEAM_WORLD, a_dst, a_src, count, s);
    });
    emit("all_reduce", "nvshmem-stream", bytes, t / iters, "stream");
    check_all_reduce(count, "nvshmem-stream");
  }

  CHECK_CUDA(cudaStreamSynchronize(s));
  nvshmem_barrier_all();
  nvshmem_free(a_dst);
  nvshmem_free(a_src);
  nvshmem_free(sig);
  nvshmem_free(dst);
  CHECK_CUDA(cudaFree(src));
  nvshmem_finalize();
  return failures ? 1 : 0;
}
