/* The C API end to end on every visible GPU (up to 8): all_gather and
 * all_to_all from unaligned inputs, a prepared all_gather triggered from the
 * host and from a stream step after step, an all_gather with its signal
 * rounds sent by a kernel (ferry_coll_options_t.signals), one under a tuning
 * table of its own (ferry_comm_set_tuning, ferry_comm_choose), every output byte
 * checked; then a call on an unregistered output and one with an options value
 * outside its enum, which must be refused with a message that says so; last, a pool and a
 * symmetric heap that outlive their communicator. Two ways to run it:
 *
 *   ferry_example_c                  one process drives every GPU (ferry_comm_init_local)
 *   ferry_example_c --processes N    N processes, one per GPU (ferry_comm_init), with an
 *                                    all-gather of our own through shared memory (with
 *                                    FERRY_SHARED_GPUS=1, for tests, ranks share the GPUs)
 *
 *   cmake -S . -B build -G Ninja && cmake --build build --target ferry_example_c
 * Prints "ok" and exits 0; 77 where there are not 2 GPUs (with --processes N, not N;
 * unless FERRY_SHARED_GPUS=1, for tests: then ranks share the GPUs); 1 on any failure.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry/ferry.h"
#include "ferry/symm.h"

#define MAX_GPUS 8

#define CHECK_FERRY(call)                                                                                           \
  do {                                                                                                              \
    ferry_result_t r_ = (call);                                                                                     \
    if (r_ != FERRY_SUCCESS) {                                                                                      \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, ferry_result_name(r_), ferry_last_error()); \
      exit(1);                                                                                                      \
    }                                                                                                               \
  } while (0)

#define CHECK_CUDA(call)                                                                     \
  do {                                                                                       \
    cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                               \
    }                                                                                        \
  } while (0)

/* The ranks this process drives: local index l is rank ranks[l] on GPU devices[l]. */
static int world, locals;
static int ranks[MAX_GPUS], devices[MAX_GPUS];
static void* outs[MAX_GPUS];      /* registered (ferry_comm_alloc) */
static void* in_blocks[MAX_GPUS]; /* cudaMalloc, one byte past the start: unaligned */
static void* in_bases[MAX_GPUS];
static ferry_stream_t streams[MAX_GPUS];
static unsigned char* host; /* staging for fills and checks */
static long wrong;

/* Byte i of rank r's input in test `salt`. */
static unsigned char pattern(int r, size_t i, int salt) {
  return (unsigned char)(i * 131u + (size_t)r * 29u + (size_t)salt * 7u + 1u);
}

static void fill_inputs(size_t bytes, int salt) {
  for (int l = 0; l < locals; ++l) {
    for (size_t i = 0; i < bytes; ++i) host[i] = pattern(ranks[l], i, salt);
    CHECK_CUDA(cudaSetDevice(devices[l]));
    CHECK_CUDA(cudaMemcpy(in_blocks[l], host, bytes, cudaMemcpyHostToDevice));
  }
}

static void poison_outputs(size_t bytes) {
  for (int l = 0; l < locals; ++l) {
    CHECK_CUDA(cudaSetDevice(devices[l]));
    CHECK_CUDA(cudaMemset(outs[l], 0xCC, bytes));
  }
}

/* Byte i of rank r's output must be expected(r, i, n, salt); counts the rest. */
typedef unsigned char (*expected_fn)(int r, size_t i, size_t n, int salt);

static void check_outputs(const char* what, size_t bytes, expected_fn expected, size_t n, int salt) {
  for (int l = 0; l < locals; ++l) {
    CHECK_CUDA(cudaSetDevice(devices[l]));
    CHECK_CUDA(cudaMemcpy(host, outs[l], bytes, cudaMemcpyDeviceToHost));
    long bad = 0;
    for (size_t i = 0; i < bytes; ++i) bad += host[i] != expected(ranks[l], i, n, salt);
    if (bad) fprintf(stderr, "%s: rank %d: %ld wrong bytes of %zu\n", what, ranks[l], bad, bytes);
    wrong += bad;
  }
}

/* all_gather: block q of every output is rank q's input. */
static unsigned char gathered(int r, size_t i, size_t n, int salt) {
  (void)r;
  return pattern((int)(i / n), i % n, salt);
}

/* all_to_all: block q of rank r's output is block r of rank q's input. */
static unsigned char exchanged(int r, size_t i, size_t n, int salt) {
  return pattern((int)(i / n), (size_t)r * n + i % n, salt);
}

/* `r` was `want` and ferry_last_error() holds `words`; else a complaint naming `what`. */
static void expect_refused(const char* what, ferry_result_t r, ferry_result_t want, const char* words) {
  if (r != want || !strstr(ferry_last_error(), words)) {
    fprintf(stderr, "%s gave %s: %s\n", what, ferry_result_name(r), ferry_last_error());
    ++wrong;
  }
}

/* Everything the example checks, on the ranks of this process. */
static void run_checks(ferry_comm_t comm) {
  const size_t n = 4099; /* bytes per rank's block: odd */
  const size_t total = (size_t)world * n;
  host = (unsigned char*)malloc(total);
  CHECK_FERRY(ferry_comm_alloc(comm, total, outs));
  for (int l = 0; l < locals; ++l) {
    CHECK_CUDA(cudaSetDevice(devices[l]));
    CHECK_CUDA(cudaMalloc(&in_bases[l], total + 1));
    in_blocks[l] = (char*)in_bases[l] + 1;
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams[l] = s;
  }

  /* Eager calls, twice each (the second is replayed from a CUDA graph). */
  for (int rep = 0; rep < 2; ++rep) {
    fill_inputs(n, 1 + rep);
    poison_outputs(total);
    CHECK_FERRY(ferry_all_gather(comm, outs, (const void* const*)in_blocks, n, streams, NULL));
    CHECK_FERRY(ferry_comm_synchronize(comm));
    check_outputs("all_gather", total, gathered, n, 1 + rep);

    fill_inputs(total, 3 + rep);
    poison_outputs(total);
    CHECK_FERRY(ferry_all_to_all(comm, outs, (const void* const*)in_blocks, n, streams, NULL));
    CHECK_FERRY(ferry_comm_synchronize(comm));
    check_outputs("all_to_all", total, exchanged, n, 3 + rep);
  }

  /* Options: the signal rounds sent by a one-block kernel (not SM-free; docs/api.md). */
  ferry_coll_options_t kernel_signals = {.algo = FERRY_ALGO_AUTO, .signals = FERRY_SIGNALS_KERNEL};
  fill_inputs(n, 5);
  poison_outputs(total);
  CHECK_FERRY(ferry_all_gather(comm, outs, (const void* const*)in_blocks, n, streams, &kernel_signals));
  CHECK_FERRY(ferry_comm_synchronize(comm));
  check_outputs("all_gather, signals by kernel", total, gathered, n, 5);

  /* A tuning table of our own (the shape of Python's "latency" preset): small
   * all_gathers on the SM path, larger ones on copy engines with kernel signals. */
  const ferry_tuning_rule_t latency[2] = {
      {FERRY_OP_ALL_GATHER, 0, (size_t)1 << 20, FERRY_ALGO_SM, FERRY_SIGNALS_AUTO},
      {FERRY_OP_ALL_GATHER, 0, SIZE_MAX, FERRY_ALGO_B2B, FERRY_SIGNALS_KERNEL},
  };
  CHECK_FERRY(ferry_comm_set_tuning(comm, latency, 2));
  ferry_algo_t algo;
  ferry_signals_t signals;
  CHECK_FERRY(ferry_comm_choose(comm, FERRY_OP_ALL_GATHER, n, &algo, &signals));
  if (algo != FERRY_ALGO_SM) {
    fprintf(stderr, "with the table, a %zu-byte all_gather chose algo %d, not the SM path\n", n, (int)algo);
    ++wrong;
  }
  CHECK_FERRY(ferry_comm_choose(comm, FERRY_OP_ALL_GATHER, (size_t)4 << 20, &algo, &signals));
  if (algo != FERRY_ALGO_B2B || signals != FERRY_SIGNALS_KERNEL) {
    fprintf(stderr, "with the table, a 4 MiB all_gather chose algo %d signals %d\n", (int)algo, (int)signals);
    ++wrong;
  }
  fill_inputs(n, 6);
  poison_outputs(total);
  CHECK_FERRY(ferry_all_gather(comm, outs, (const void* const*)in_blocks, n, streams, NULL));
  CHECK_FERRY(ferry_comm_synchronize(comm));
  check_outputs("all_gather, own tuning table", total, gathered, n, 6);
  /* Back to the table the communicator started with: FERRY_TUNING's, else the
   * SM-free table ferry ships for this GPU model, else the built-in default. */
  CHECK_FERRY(ferry_comm_set_tuning(comm, NULL, 0));
  CHECK_FERRY(ferry_comm_choose(comm, FERRY_OP_ALL_GATHER, n, &algo, &signals));
  if (algo == FERRY_ALGO_SM && getenv("FERRY_TUNING") == NULL) {
    fprintf(stderr, "the starting table chose the SM path\n");
    ++wrong;
  }
  /* A shipped preset by name: "latency" takes the SM path for small all_gathers
   * where ferry ships it for this GPU model (H200); elsewhere it is refused. */
  ferry_result_t preset = ferry_comm_set_tuning_preset(comm, "latency");
  if (preset == FERRY_SUCCESS) {
    CHECK_FERRY(ferry_comm_choose(comm, FERRY_OP_ALL_GATHER, 4096, &algo, &signals));
    if (algo != FERRY_ALGO_SM) {
      fprintf(stderr, "the latency preset chose algo %d for a 4 KiB all_gather\n", (int)algo);
      ++wrong;
    }
    fprintf(stderr, "latency preset: a 4 KiB all_gather takes the SM path\n");
  } else if (preset == FERRY_ERROR_INVALID_ARGUMENT) {
    fprintf(stderr, "latency preset: %s\n", ferry_last_error());
  } else {
    CHECK_FERRY(preset);
  }
  if (ferry_comm_set_tuning_preset(comm, "fastest") != FERRY_ERROR_INVALID_ARGUMENT) {
    fprintf(stderr, "an unknown preset was not refused\n");
    ++wrong;
  }
  CHECK_FERRY(ferry_comm_set_tuning(comm, NULL, 0));

  /* Prelaunch: prepared once, armed and triggered step after step. */
  ferry_call_t call;
  memset(&call, 0, sizeof(call));
  call.op = FERRY_OP_ALL_GATHER;
  call.outs = outs;
  call.ins = (const void* const*)in_blocks;
  call.bytes = n;
  call.streams = streams;
  int handle = 0;
  CHECK_FERRY(ferry_prepare(comm, &call, &handle));
  for (int step = 0; step < 6; ++step) {
    const int salt = 10 + step;
    fill_inputs(n, salt);
    poison_outputs(total);
    CHECK_FERRY(ferry_arm(comm, handle, streams));
    if (step == 0 && ferry_comm_synchronize(comm) != FERRY_ERROR_INVALID_ARGUMENT) {
      fprintf(stderr, "synchronize while armed was not refused\n");
      ++wrong;
    }
    if (step % 2 == 0)
      CHECK_FERRY(ferry_trigger(comm, handle)); /* a store from the host */
    else
      CHECK_FERRY(ferry_trigger_on(comm, handle, streams)); /* a stream memory write */
    CHECK_FERRY(ferry_wait(comm, handle, streams));
    for (int l = 0; l < locals; ++l) {
      CHECK_CUDA(cudaSetDevice(devices[l]));
      CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)streams[l]));
    }
    check_outputs(step % 2 == 0 ? "prepared all_gather, host trigger" : "prepared all_gather, stream trigger", total,
                  gathered, n, salt);
  }
  CHECK_FERRY(ferry_release(comm, handle));
  if (ferry_trigger(comm, handle) != FERRY_ERROR_INVALID_ARGUMENT) {
    fprintf(stderr, "a released handle was triggered without an error\n");
    ++wrong;
  }

  /* A symmetric pool: an all_gather into one of its buffers, every byte
   * checked; a freed buffer comes back to the next request of its stream at
   * the same place, and a request on another stream gets another place. */
  {
    ferry_pool_t pool;
    void* registered[MAX_GPUS];
    void* again[MAX_GPUS];
    void* other[MAX_GPUS];
    size_t reserved = 0, in_use = 0;
    memcpy(registered, outs, sizeof outs);
    CHECK_FERRY(ferry_pool_create(comm, 1 << 20, &pool));
    CHECK_FERRY(ferry_pool_alloc(pool, total, streams[0], outs));
    fill_inputs(n, 9);
    poison_outputs(total);
    CHECK_FERRY(ferry_all_gather(comm, outs, (const void* const*)in_blocks, n, streams, NULL));
    CHECK_FERRY(ferry_comm_synchronize(comm));
    check_outputs("all_gather into a pool buffer", total, gathered, n, 9);
    CHECK_FERRY(ferry_pool_sizes(pool, &reserved, &in_use));
    if (reserved != (2u << 20) || in_use != (total + 511) / 512 * 512) {
      fprintf(stderr, "pool sizes: %zu reserved, %zu in use\n", reserved, in_use);
      ++wrong;
    }
    CHECK_FERRY(ferry_pool_free(pool, outs[0]));
    /* Another stream first: the freed buffer is not its to take. */
    CHECK_FERRY(ferry_pool_alloc(pool, total, NULL, other));
    CHECK_FERRY(ferry_pool_alloc(pool, total, streams[0], again));
    for (int l = 0; l < locals; ++l)
      if (again[l] != outs[l] || other[l] == outs[l]) {
        fprintf(stderr, "pool: rank %d reused %p for %p, and gave %p to another stream\n", ranks[l], again[l], outs[l],
                other[l]);
        ++wrong;
      }
    if (ferry_pool_free(pool, (char*)other[0] + 1) != FERRY_ERROR_INVALID_ARGUMENT) {
      fprintf(stderr, "pool: freeing a pointer inside a buffer was not refused\n");
      ++wrong;
    }
    ferry_pool_destroy(pool);
    memcpy(outs, registered, sizeof outs);
  }

  /* Bad input: the output is cudaMalloc memory ferry does not know. */
  void* unregistered[MAX_GPUS];
  for (int l = 0; l < locals; ++l) {
    CHECK_CUDA(cudaSetDevice(devices[l]));
    CHECK_CUDA(cudaMalloc(&unregistered[l], total));
  }
  expect_refused("an unregistered output",
                 ferry_all_gather(comm, unregistered, (const void* const*)in_blocks, n, streams, NULL),
                 FERRY_ERROR_NOT_REGISTERED, "not inside a buffer registered");
  /* Bad input: an options value outside its enum. */
  ferry_coll_options_t bad = {.signals = (ferry_signals_t)7};
  expect_refused("signals = 7", ferry_all_gather(comm, outs, (const void* const*)in_blocks, n, streams, &bad),
                 FERRY_ERROR_INVALID_ARGUMENT, "options->signals");

  CHECK_FERRY(ferry_comm_synchronize(comm));
  CHECK_FERRY(ferry_comm_free(comm, outs));
  for (int l = 0; l < locals; ++l) {
    CHECK_CUDA(cudaSetDevice(devices[l]));
    CHECK_CUDA(cudaFree(unregistered[l]));
    CHECK_CUDA(cudaStreamDestroy((cudaStream_t)streams[l]));
    CHECK_CUDA(cudaFree(in_bases[l]));
  }
  free(host);
}

/* Closes and destroys `comm` while a pool and a symmetric heap made from it
 * are still held, as a program tearing down in any order may. The pool then
 * refuses requests (the communicator's close freed its chunks) and can still
 * be destroyed; the heap still grows, collectively, through the descriptor
 * exchange it shares with the communicator, and frees. */
static void close_under_pool_and_heap(ferry_comm_t comm) {
  ferry_pool_t pool;
  ferry_heap_t heap;
  void* got[MAX_GPUS];
  CHECK_FERRY(ferry_pool_create(comm, 1 << 20, &pool));
  CHECK_FERRY(ferry_pool_alloc(pool, 4096, NULL, got));
  CHECK_FERRY(ferry_heap_create(comm, (size_t)1 << 30, &heap));
  CHECK_FERRY(ferry_comm_close(comm));
  expect_refused("a pool request after its communicator closed", ferry_pool_alloc(pool, 4096, NULL, got),
                 FERRY_ERROR_CLOSED, "communicator is closed");
  size_t reserved = 1, in_use = 1;
  CHECK_FERRY(ferry_pool_sizes(pool, &reserved, &in_use));
  if (reserved || in_use) {
    fprintf(stderr, "a pool whose communicator closed reports %zu bytes reserved, %zu in use\n", reserved, in_use);
    ++wrong;
  }
  ferry_comm_destroy(comm);
  expect_refused("a pool request after its communicator was destroyed", ferry_pool_alloc(pool, 4096, NULL, got),
                 FERRY_ERROR_CLOSED, "communicator is destroyed");
  ferry_pool_destroy(pool);
  /* Its first chunk: mapped on every rank and, with a process per rank,
   * exchanged between the processes. */
  const size_t bytes = ((size_t)5 << 20) + 3;
  CHECK_FERRY(ferry_heap_alloc(heap, bytes, 256, NULL, got));
  size_t capacity = 0, used = 0, mapped = 0;
  CHECK_FERRY(ferry_heap_sizes(heap, &capacity, &used, &mapped));
  if (mapped < bytes || used < bytes) {
    fprintf(stderr, "a heap growing after its communicator closed: %zu used, %zu mapped\n", used, mapped);
    ++wrong;
  }
  for (int l = 0; l < locals; ++l) { /* the memory is there: every byte written and read back */
    CHECK_CUDA(cudaSetDevice(devices[l]));
    CHECK_CUDA(cudaMemset(got[l], 0x5A + l, bytes));
    unsigned char* back = (unsigned char*)malloc(bytes);
    if (!back) {
      fprintf(stderr, "malloc of %zu bytes failed\n", bytes);
      exit(1);
    }
    CHECK_CUDA(cudaMemcpy(back, got[l], bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < bytes; ++i)
      if (back[i] != (unsigned char)(0x5A + l)) {
        fprintf(stderr, "rank %d: heap byte %zu reads %d after its communicator closed\n", ranks[l], i, back[i]);
        ++wrong;
        break;
      }
    free(back);
  }
  CHECK_FERRY(ferry_heap_check(heap));
  CHECK_FERRY(ferry_heap_free(heap, got[0]));
  ferry_heap_destroy(heap);
}

/* ---- an all-gather for ferry_comm_init: shared memory between forked processes */

#define SHARED_SLOT_BYTES (1 << 20)

struct shared_area {
  unsigned long arrived, round; /* a barrier: arrivals in this round, rounds completed */
  unsigned char data[MAX_GPUS][SHARED_SLOT_BYTES];
};

struct allgather_ctx {
  struct shared_area* area;
  int rank, world;
};

/* Every rank arrives, or -1 after 60 s (ferry's all-gather must be bounded). */
static int barrier(struct shared_area* a, int n) {
  const unsigned long round = __atomic_load_n(&a->round, __ATOMIC_ACQUIRE);
  if (__atomic_add_fetch(&a->arrived, 1, __ATOMIC_ACQ_REL) == (unsigned long)n) {
    __atomic_store_n(&a->arrived, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&a->round, round + 1, __ATOMIC_RELEASE);
    return 0;
  }
  const time_t deadline = time(NULL) + 60;
  while (__atomic_load_n(&a->round, __ATOMIC_ACQUIRE) == round) {
    if (time(NULL) > deadline) return -1;
    usleep(20);
  }
  return 0;
}

static int shared_allgather(void* ctx, const void* mine, size_t nbytes, void* all) {
  struct allgather_ctx* c = (struct allgather_ctx*)ctx;
  if (nbytes > SHARED_SLOT_BYTES) return -1;
  memcpy(c->area->data[c->rank], mine, nbytes);
  if (barrier(c->area, c->world) != 0) return -1;
  for (int p = 0; p < c->world; ++p) memcpy((unsigned char*)all + (size_t)p * nbytes, c->area->data[p], nbytes);
  return barrier(c->area, c->world); /* nobody writes the next round before all have read */
}

/* One forked process: rank `rank` on GPU `rank` (modulo the GPUs where they
 * are shared). CUDA starts here, after fork. */
static int run_rank(struct shared_area* area, int rank) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess) {
    printf("skipped: no usable GPU (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  /* Every rank sees the same count, so all skip together, before any exchange. */
  const char* shared = getenv("FERRY_SHARED_GPUS");
  if (gpus < world && !(shared && strcmp(shared, "1") == 0)) {
    if (rank == 0) printf("skipped: %d GPU(s) visible, %d needed (or FERRY_SHARED_GPUS=1)\n", gpus, world);
    return 77;
  }
  struct allgather_ctx ctx = {area, rank, world};
  ferry_comm_config_t cfg = {rank, world, rank % gpus, shared_allgather, &ctx, 60.0};
  locals = 1;
  ranks[0] = rank;
  devices[0] = rank % gpus;
  ferry_comm_t comm = NULL;
  CHECK_FERRY(ferry_comm_init(&cfg, &comm));
  run_checks(comm);
  close_under_pool_and_heap(comm);
  return wrong ? 1 : 0;
}

static int run_processes(int n) {
  /* No CUDA call before fork: a child cannot use CUDA that its parent started. */
  struct shared_area* area = (struct shared_area*)mmap(NULL, sizeof(struct shared_area), PROT_READ | PROT_WRITE,
                                                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  world = n;
  pid_t pids[MAX_GPUS];
  for (int r = 0; r < n; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) {
      perror("fork");
      return 1;
    }
    if (pids[r] == 0) _exit(run_rank(area, r));
  }
  int failed = 0, skipped = 0;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
      ++skipped;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d failed (status %d)\n", r, status);
      failed = 1;
    }
  }
  munmap(area, sizeof(struct shared_area));
  if (skipped == n) return 77;
  return failed || skipped ? 1 : 0;
}

static int run_one_process(void) {
  if (cudaGetDeviceCount(&world) != cudaSuccess) {
    printf("skipped: no usable GPU (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  /* FERRY_SHARED_GPUS=1 (testing only): where one GPU is visible, two ranks share it. */
  const int gpus = world;
  const char* shared = getenv("FERRY_SHARED_GPUS");
  if (world < 2 && shared && strcmp(shared, "1") == 0) world = 2;
  if (world < 2) {
    printf("skipped: %d GPU(s) visible, 2 needed\n", world);
    return 77;
  }
  if (world > MAX_GPUS) world = MAX_GPUS;
  locals = world;
  for (int r = 0; r < world; ++r) {
    ranks[r] = r;
    devices[r] = r % gpus;
  }
  ferry_comm_t comm = NULL;
  CHECK_FERRY(ferry_comm_init_local(devices, world, 60.0, &comm));
  run_checks(comm);
  close_under_pool_and_heap(comm);
  return wrong ? 1 : 0;
}

int main(int argc, char** argv) {
  int n = 0;
  if (argc == 3 && strcmp(argv[1], "--processes") == 0) n = atoi(argv[2]);
  if (argc != 1 && !(n >= 2 && n <= MAX_GPUS)) {
    fprintf(stderr, "usage: %s [--processes N]   (2 <= N <= %d, one GPU each)\n", argv[0], MAX_GPUS);
    return 2;
  }
  const int rc = n ? run_processes(n) : run_one_process();
  if (rc == 0)
    printf(
        "ok: all_gather, all_to_all, signals by kernel, prepared all_gather (host and stream triggers), refused calls, "
        "a pool and a heap that outlive their communicator; %s\n",
        n ? "one process per GPU" : "one process for all GPUs");
  return rc;
}
