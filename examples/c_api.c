/* The C API end to end, one process driving every visible GPU:
 * all_gather and all_to_all from unaligned inputs, a prepared all_gather
 * triggered from the host and from a stream, step after step, every output
 * byte checked against the expected pattern; then a call on an unregistered
 * output, which must be refused with a message that says so.
 *
 *   cmake -S . -B build -G Ninja && cmake --build build --target ferry_example_c
 *   build/ferry_example_c          prints "ok" and exits 0 (77: fewer than 2 GPUs)
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/ferry.h"

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

static int world;
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
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < bytes; ++i) host[i] = pattern(r, i, salt);
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaMemcpy(in_blocks[r], host, bytes, cudaMemcpyHostToDevice));
  }
}

static void poison_outputs(size_t bytes) {
  for (int r = 0; r < world; ++r) {
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaMemset(outs[r], 0xCC, bytes));
  }
}

/* Rank r's output, byte i, must be what `expected` says; counts the rest. */
static void check_outputs(const char* what, size_t bytes,
                          unsigned char (*expected)(int r, size_t i, size_t n, int salt), size_t n, int salt) {
  for (int r = 0; r < world; ++r) {
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaMemcpy(host, outs[r], bytes, cudaMemcpyDeviceToHost));
    long bad = 0;
    for (size_t i = 0; i < bytes; ++i) bad += host[i] != expected(r, i, n, salt);
    if (bad) fprintf(stderr, "%s: rank %d: %ld wrong bytes of %zu\n", what, r, bad, bytes);
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

int main(void) {
  if (cudaGetDeviceCount(&world) != cudaSuccess) {
    printf("skipped: no usable GPU (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  if (world < 2) {
    printf("skipped: %d GPU(s) visible, 2 needed\n", world);
    return 77;
  }
  if (world > MAX_GPUS) world = MAX_GPUS;
  int devices[MAX_GPUS];
  for (int r = 0; r < world; ++r) devices[r] = r;

  ferry_comm_t comm = NULL;
  CHECK_FERRY(ferry_comm_init_local(devices, world, 60.0, &comm));

  const size_t n = 4099; /* bytes per rank's block: odd */
  const size_t total = (size_t)world * n;
  host = (unsigned char*)malloc(total);
  CHECK_FERRY(ferry_comm_alloc(comm, total, outs));
  for (int r = 0; r < world; ++r) {
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaMalloc(&in_bases[r], total + 1));
    in_blocks[r] = (char*)in_bases[r] + 1;
    cudaStream_t s;
    CHECK_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    streams[r] = s;
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
    if (step % 2 == 0)
      CHECK_FERRY(ferry_trigger(comm, handle)); /* a store from the host */
    else
      CHECK_FERRY(ferry_trigger_on(comm, handle, streams)); /* a stream memory write */
    CHECK_FERRY(ferry_wait(comm, handle, streams));
    for (int r = 0; r < world; ++r) {
      CHECK_CUDA(cudaSetDevice(r));
      CHECK_CUDA(cudaStreamSynchronize((cudaStream_t)streams[r]));
    }
    check_outputs(step % 2 == 0 ? "prepared all_gather, host trigger" : "prepared all_gather, stream trigger", total,
                  gathered, n, salt);
  }
  CHECK_FERRY(ferry_release(comm, handle));
  if (ferry_trigger(comm, handle) != FERRY_ERROR_INVALID_ARGUMENT) {
    fprintf(stderr, "a released handle was triggered without an error\n");
    ++wrong;
  }

  /* Bad input: the output is cudaMalloc memory ferry does not know. */
  void* unregistered[MAX_GPUS];
  for (int r = 0; r < world; ++r) {
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaMalloc(&unregistered[r], total));
  }
  ferry_result_t refused = ferry_all_gather(comm, unregistered, (const void* const*)in_blocks, n, streams, NULL);
  if (refused != FERRY_ERROR_NOT_REGISTERED || !strstr(ferry_last_error(), "not inside a buffer registered")) {
    fprintf(stderr, "an unregistered output gave %s: %s\n", ferry_result_name(refused), ferry_last_error());
    ++wrong;
  }
  for (int r = 0; r < world; ++r) {
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaFree(unregistered[r]));
  }

  CHECK_FERRY(ferry_comm_synchronize(comm));
  CHECK_FERRY(ferry_comm_free(comm, outs));
  CHECK_FERRY(ferry_comm_close(comm));
  ferry_comm_destroy(comm);
  for (int r = 0; r < world; ++r) {
    CHECK_CUDA(cudaSetDevice(r));
    CHECK_CUDA(cudaStreamDestroy((cudaStream_t)streams[r]));
    CHECK_CUDA(cudaFree(in_bases[r]));
  }
  free(host);
  if (wrong) {
    fprintf(stderr, "FAILED: %ld wrong\n", wrong);
    return 1;
  }
  printf("ok: %d GPUs, all_gather, all_to_all, prepared all_gather (host and stream triggers), refused call\n", world);
  return 0;
}
