/* Multipath host<->GPU copies from C: one copy each way in a stream's order,
 * a batch each way (every piece a different size, one of them empty), the
 * synchronous form, pageable memory (one plain copy) and the errors bad input
 * gets; every byte checked against the source.
 *
 *   build/ferry_example_multipath_c [GPUS]
 *
 * The engine uses the first GPUS GPUs (default: every one); with one GPU it
 * lists GPU 0 three times, which adds two relays through GPU 0 itself (a
 * testing mode: chunks, staging and reassembly run for real, over one link).
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/multipath.h"

#define BYTES ((size_t)(48 << 20) + 13) /* odd, so that the last chunk is short */
#define PIECES 5

static int failures = 0;

static void check(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s (%s)\n", what, ferry_last_error());
    failures++;
  }
}

static void fill(unsigned char* p, size_t n, unsigned seed) {
  srand(seed);
  for (size_t i = 0; i < n; ++i) p[i] = (unsigned char)rand();
}

static void report_bytes(const unsigned char* got, const unsigned char* want, size_t n, const char* what) {
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += got[i] != want[i];
  printf("%s: %zu wrong bytes of %zu\n", what, wrong, n);
  check(wrong == 0, what);
}

int main(int argc, char** argv) {
  int visible = 0;
  if (cudaGetDeviceCount(&visible) != cudaSuccess || visible == 0) {
    fprintf(stderr, "multipath_c: no GPU\n");
    return 2;
  }
  int gpus = argc > 1 ? atoi(argv[1]) : visible;
  if (gpus < 1 || gpus > visible) gpus = visible;
  int devices[8];
  int count = 0;
  if (gpus == 1) {
    devices[0] = devices[1] = devices[2] = 0;
    count = 3;
  } else {
    for (; count < gpus && count < 8; ++count) devices[count] = count;
  }
  cudaSetDevice(0);
  ferry_multipath_options_t options = {0};
  options.min_bytes = 1 << 20; /* smaller copies run as one cudaMemcpyAsync */
  options.timeout_s = 60;
  ferry_multipath_t engine = NULL;
  check(ferry_multipath_create(devices, count, &options, &engine) == FERRY_SUCCESS, "ferry_multipath_create");
  if (!engine) return 1;

  unsigned char *src = NULL, *back = NULL, *gpu = NULL;
  cudaMallocHost((void**)&src, BYTES);
  cudaMallocHost((void**)&back, BYTES);
  cudaMalloc((void**)&gpu, BYTES);
  unsigned char* seen = (unsigned char*)malloc(BYTES);
  fill(src, BYTES, 11);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  /* One copy each way. The memset before must not land over the copy, and
   * the plain copy after must see all of it: the stream's order. */
  int multipath = -1;
  memset(back, 0x5A, BYTES);
  cudaMemsetAsync(gpu, 0xA5, BYTES, stream);
  check(ferry_multipath_copy(engine, gpu, src, BYTES, stream, &multipath) == FERRY_SUCCESS, "copy to the GPU");
  check(multipath == 1, "a copy past min_bytes goes multipath");
  cudaMemcpyAsync(seen, gpu, BYTES, cudaMemcpyDeviceToHost, stream);
  check(ferry_multipath_copy(engine, back, gpu, BYTES, stream, &multipath) == FERRY_SUCCESS, "copy to the host");
  check(multipath == 1, "a copy back past min_bytes goes multipath");
  check(cudaStreamSynchronize(stream) == cudaSuccess, "stream synchronize");
  report_bytes(seen, src, BYTES, "to the GPU, read by the next operation in the stream");
  report_bytes(back, src, BYTES, "to the host");

  /* A batch each way: pieces of different sizes, one empty, at scattered
   * offsets of the GPU buffer, gathered back into the host buffer. */
  const size_t sizes[PIECES] = {(size_t)(9 << 20) + 1, 0, (size_t)(3 << 20) + 4095, 777, (size_t)(16 << 20)};
  const size_t gpu_at[PIECES] = {(size_t)(30 << 20), 5, (size_t)(1 << 20), 3, (size_t)(12 << 20) + 1};
  void* dsts[PIECES];
  const void* srcs[PIECES];
  size_t host_at = 0;
  for (int i = 0; i < PIECES; ++i) {
    dsts[i] = gpu + gpu_at[i];
    srcs[i] = src + host_at;
    host_at += sizes[i];
  }
  cudaMemsetAsync(gpu, 0xA5, BYTES, stream);
  memset(back, 0x5A, BYTES);
  check(ferry_multipath_copy_batch(engine, dsts, srcs, sizes, PIECES, stream, &multipath) == FERRY_SUCCESS,
        "batch to the GPU");
  check(multipath == 1, "a batch past min_bytes goes multipath");
  void* back_dsts[PIECES];
  const void* back_srcs[PIECES];
  for (int i = 0; i < PIECES; ++i) {
    back_dsts[i] = back + ((const unsigned char*)srcs[i] - src);
    back_srcs[i] = dsts[i];
  }
  check(ferry_multipath_copy_batch(engine, back_dsts, back_srcs, sizes, PIECES, stream, &multipath) == FERRY_SUCCESS,
        "batch to the host");
  cudaMemcpyAsync(seen, gpu, BYTES, cudaMemcpyDeviceToHost, stream);
  check(cudaStreamSynchronize(stream) == cudaSuccess, "stream synchronize");
  report_bytes(back, src, host_at, "batch there and back");
  size_t wrong = 0;
  for (int i = 0; i < PIECES; ++i) wrong += memcmp(seen + gpu_at[i], srcs[i], sizes[i]) != 0;
  /* Bytes of the GPU buffer no piece covers keep the memset's value. */
  for (size_t b = (size_t)(29 << 20); b < (size_t)(30 << 20); b += 4093) wrong += seen[b] != 0xA5;
  printf("batch pieces on the GPU: %zu wrong\n", wrong);
  check(wrong == 0, "batch pieces on the GPU");

  /* The synchronous form, as cudaMemcpy. */
  fill(src, BYTES, 12);
  memset(back, 0x5A, BYTES);
  check(ferry_multipath_copy_sync(engine, gpu, src, BYTES, &multipath) == FERRY_SUCCESS, "copy_sync to the GPU");
  check(ferry_multipath_copy_sync(engine, back, gpu, BYTES, &multipath) == FERRY_SUCCESS, "copy_sync to the host");
  report_bytes(back, src, BYTES, "copy_sync there and back");

  /* Pageable memory: one plain copy, still right. */
  unsigned char* pageable = (unsigned char*)malloc(BYTES);
  fill(pageable, BYTES, 13);
  check(ferry_multipath_copy(engine, gpu, pageable, BYTES, stream, &multipath) == FERRY_SUCCESS, "pageable copy");
  check(multipath == 0, "pageable memory runs as one plain copy");
  cudaMemcpyAsync(seen, gpu, BYTES, cudaMemcpyDeviceToHost, stream);
  cudaStreamSynchronize(stream);
  report_bytes(seen, pageable, BYTES, "pageable to the GPU");

  /* Bad input: refused with a message naming the argument, nothing copied. */
  check(ferry_multipath_copy(engine, src + 8, src, 64 << 20, stream, NULL) == FERRY_ERROR_INVALID_ARGUMENT,
        "overlapping dst and src refused");
  printf("overlap: %s\n", ferry_last_error());
  check(ferry_multipath_copy(engine, NULL, src, 1 << 20, stream, NULL) == FERRY_ERROR_INVALID_ARGUMENT,
        "null dst refused");
  printf("null: %s\n", ferry_last_error());
  void* overlapping[2] = {gpu, gpu + 100};
  const void* two_srcs[2] = {src, src + 4096};
  const size_t two_sizes[2] = {4096, 4096};
  check(ferry_multipath_copy_batch(engine, overlapping, two_srcs, two_sizes, 2, stream, NULL) ==
            FERRY_ERROR_INVALID_ARGUMENT,
        "overlapping batch destinations refused");
  printf("batch overlap: %s\n", ferry_last_error());
  int bad_device = visible;
  ferry_multipath_t none = NULL;
  check(ferry_multipath_create(&bad_device, 1, NULL, &none) == FERRY_ERROR_INVALID_ARGUMENT && none == NULL,
        "a device that is not there refused");
  printf("bad device: %s\n", ferry_last_error());
  check(ferry_multipath_copy(NULL, gpu, src, 1 << 20, stream, NULL) == FERRY_ERROR_INVALID_ARGUMENT,
        "null engine refused");

  check(ferry_multipath_synchronize(engine) == FERRY_SUCCESS, "ferry_multipath_synchronize");
  check(ferry_multipath_destroy(engine) == FERRY_SUCCESS, "ferry_multipath_destroy");
  cudaStreamDestroy(stream);
  cudaFreeHost(src);
  cudaFreeHost(back);
  cudaFree(gpu);
  free(seen);
  free(pageable);
  if (failures)
    printf("multipath_c: %d checks FAILED (%d links)\n", failures, count);
  else
    printf("multipath_c: all checks passed (%d links)\n", count);
  return failures ? 1 : 0;
}
