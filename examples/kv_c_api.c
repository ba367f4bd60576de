/* Paged KV transfers from C: fetch scattered pages from a pinned host pool
 * into GPU pages and save them back, with every mode, whole and in slices
 * (FERRY_KV_SLICED; FERRY_KV_SLICE_BYTES sets their size), each checked byte
 * for byte; then prepared transfers, armed ahead and released from the host,
 * from a stream and through a device trigger; then the errors bad input gets.
 *
 *   build/ferry_example_kv_c        (built by CMake beside libferry)
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/kv.h"

#define PAGES 256
#define PAGE_BYTES 16384
#define N 100

static int failures = 0;

static void check(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "FAILED: %s (%s)\n", what, ferry_last_error());
    failures++;
  }
}

/* Pages dst_ids[i] of `got` against pages src_ids[i] of `want`. */
static int wrong_pages(const unsigned char* got, const unsigned char* want, const int64_t* dst_ids,
                       const int64_t* src_ids, int n) {
  int wrong = 0;
  for (int i = 0; i < n; ++i)
    wrong += memcmp(got + dst_ids[i] * PAGE_BYTES, want + src_ids[i] * PAGE_BYTES, PAGE_BYTES) != 0;
  return wrong;
}

/* Prepared transfers: a fetch armed ahead and released three ways, and a save
 * with one copy per page; every page checked, and the gate shown to hold. */
static void prepared(int device, ferry_host_pool_t pool, ferry_kv_region_t* gpu_side, ferry_kv_region_t* host_side,
                     ferry_kv_region_t* back_side, unsigned char* gpu, const unsigned char* host, unsigned char* back,
                     unsigned char* check_buf, const int64_t* dst_ids, const int64_t* src_ids, cudaStream_t stream) {
  cudaStream_t other;
  cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking);
  ferry_kv_prepared_t fetch = NULL, save = NULL;
  check(ferry_kv_prepare(device, gpu_side, host_side, 1, dst_ids, src_ids, N, FERRY_KV_BATCHED, 0, &fetch) ==
            FERRY_SUCCESS,
        "ferry_kv_prepare (fetch)");
  check(ferry_kv_prepare(device, back_side, gpu_side, 1, dst_ids, dst_ids, N, FERRY_KV_PER_PAGE, FERRY_KV_ZERO_SM,
                         &save) == FERRY_SUCCESS,
        "ferry_kv_prepare (save)");
  if (!fetch || !save) {
    ferry_kv_prepared_destroy(fetch); /* NULL is refused, harmlessly */
    ferry_kv_prepared_destroy(save);
    cudaStreamDestroy(other);
    return;
  }
  size_t bytes = 0, copies = 0;
  check(ferry_kv_prepared_sizes(fetch, &bytes, &copies) == FERRY_SUCCESS && bytes == (size_t)N * PAGE_BYTES &&
            copies >= 1 && copies <= N,
        "ferry_kv_prepared_sizes");
  const char* how[] = {"host trigger", "stream trigger", "device trigger"};
  for (int t = 0; t < 3; ++t) {
    cudaMemsetAsync(gpu, 0xA5, PAGES * PAGE_BYTES, stream);
    check(ferry_kv_prepared_arm(fetch, stream) == FERRY_SUCCESS, "arm");
    /* Armed, not released: the copies wait behind the gate. */
    check(ferry_kv_prepared_synchronize(fetch, 0.05) == FERRY_ERROR_TIMEOUT, "an unopened gate holds the copies");
    if (t == 0) check(ferry_kv_prepared_trigger(fetch) == FERRY_SUCCESS, "trigger");
    if (t == 1) check(ferry_kv_prepared_trigger_on(fetch, other) == FERRY_SUCCESS, "trigger_on");
    if (t == 2) {
      ferry_trigger_t trig = {NULL, 0};
      check(ferry_kv_prepared_device_trigger(fetch, &trig) == FERRY_SUCCESS && trig.word, "device_trigger");
      /* What a kernel's ferry_device_trigger_fire stores, stored here by a copy. */
      unsigned long long v = trig.value;
      check(trig.word && cudaMemcpy(trig.word, &v, sizeof v, cudaMemcpyDefault) == cudaSuccess,
            "store the device trigger's value");
    }
    /* Bounded: a gate that stays shut is an error here, not a hang. */
    check(ferry_kv_prepared_synchronize(fetch, 30.0) == FERRY_SUCCESS, "the released copies land");
    check(ferry_kv_prepared_wait(fetch, stream) == FERRY_SUCCESS, "wait");
    cudaMemcpyAsync(check_buf, gpu, PAGES * PAGE_BYTES, cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    const int wrong = wrong_pages(check_buf, host, dst_ids, src_ids, N);
    printf("prepared fetch, %s: %d wrong pages\n", how[t], wrong);
    check(wrong == 0, "prepared fetch byte check");
  }
  memset(back, 0x5A, PAGES * PAGE_BYTES);
  check(ferry_kv_prepared_arm(save, stream) == FERRY_SUCCESS, "arm (save)");
  check(ferry_kv_prepared_trigger_on(save, stream) == FERRY_SUCCESS, "trigger_on (save)");
  check(ferry_kv_prepared_synchronize(save, 30.0) == FERRY_SUCCESS, "synchronize (save)");
  int wrong = wrong_pages(back, check_buf, dst_ids, dst_ids, N);
  printf("prepared save, one copy per page: %d wrong pages\n", wrong);
  check(wrong == 0, "prepared save byte check");
  /* Bad use: each refused with a message naming what is wrong. */
  check(ferry_kv_prepared_trigger(fetch) == FERRY_ERROR_INVALID_ARGUMENT, "trigger before arm refused");
  printf("trigger before arm: %s\n", ferry_last_error());
  check(ferry_kv_prepared_arm(fetch, stream) == FERRY_SUCCESS, "arm again");
  check(ferry_kv_prepared_arm(fetch, stream) == FERRY_ERROR_INVALID_ARGUMENT, "arming an armed transfer refused");
  printf("armed twice: %s\n", ferry_last_error());
  ferry_kv_prepared_t bad = NULL;
  check(ferry_kv_prepare(device, gpu_side, host_side, 1, dst_ids, src_ids, N, FERRY_KV_KERNEL, 0, &bad) ==
                FERRY_ERROR_INVALID_ARGUMENT &&
            !bad,
        "prepared kernel refused");
  printf("prepared kernel: %s\n", ferry_last_error());
  check(ferry_kv_prepare(device, gpu_side, host_side, 1, dst_ids, src_ids, N, FERRY_KV_BATCHED, FERRY_KV_URGENT,
                         &bad) == FERRY_ERROR_INVALID_ARGUMENT,
        "prepared urgent refused");
  printf("prepared urgent: %s\n", ferry_last_error());
  check(ferry_kv_prepare(device, gpu_side, gpu_side, 1, dst_ids, src_ids, N, FERRY_KV_BATCHED, 0, &bad) ==
                FERRY_ERROR_INVALID_ARGUMENT &&
            strstr(ferry_last_error(), "within one GPU"),
        "prepared transfer within one GPU refused");
  printf("within one GPU: %s\n", ferry_last_error());
  /* The pool under them cannot go while they may be armed again. */
  check(
      ferry_host_pool_destroy(pool) == FERRY_ERROR_INVALID_ARGUMENT && strstr(ferry_last_error(), "prepared transfers"),
      "a pool under prepared transfers is not destroyed");
  printf("pool under prepared transfers: %s\n", ferry_last_error());
  /* Destroyed while armed: the gate opens, the copies run, nothing waits forever. */
  check(ferry_kv_prepared_destroy(fetch) == FERRY_SUCCESS, "destroy an armed transfer");
  check(ferry_kv_prepared_destroy(save) == FERRY_SUCCESS, "destroy");
  check(ferry_kv_prepared_destroy(NULL) == FERRY_SUCCESS, "destroying NULL is no call, as free(NULL)");
  check(cudaStreamSynchronize(stream) == cudaSuccess, "the stream goes on after an armed transfer is destroyed");
  cudaStreamDestroy(other);
}

int main(void) {
  int device = 0;
  if (cudaSetDevice(device) != cudaSuccess) {
    fprintf(stderr, "kv_c_api: no GPU\n");
    return 2;
  }
  ferry_host_pool_t pool = NULL;
  check(ferry_host_pool_create(2 * PAGES * PAGE_BYTES, device, &pool) == FERRY_SUCCESS, "ferry_host_pool_create");
  if (!pool) return 1;
  unsigned char* host = (unsigned char*)ferry_host_pool_data(pool);
  unsigned char* back = host + PAGES * PAGE_BYTES; /* where pages are saved to */
  unsigned char* gpu = NULL;
  cudaMalloc((void**)&gpu, PAGES * PAGE_BYTES);
  unsigned char* check_buf = (unsigned char*)malloc(PAGES * PAGE_BYTES);
  srand(7);
  for (size_t i = 0; i < (size_t)PAGES * PAGE_BYTES; ++i) host[i] = (unsigned char)rand();

  int64_t dst_ids[N], src_ids[N];
  /* Distinct destinations (a permutation's prefix), random sources. */
  int64_t perm[PAGES];
  for (int i = 0; i < PAGES; ++i) perm[i] = i;
  for (int i = PAGES - 1; i > 0; --i) {
    int j = rand() % (i + 1);
    int64_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  for (int i = 0; i < N; ++i) {
    dst_ids[i] = perm[i];
    src_ids[i] = rand() % PAGES;
  }
  ferry_kv_region_t host_side = {host, PAGE_BYTES, PAGE_BYTES, PAGES};
  ferry_kv_region_t back_side = {back, PAGE_BYTES, PAGE_BYTES, PAGES};
  ferry_kv_region_t gpu_side = {gpu, PAGE_BYTES, PAGE_BYTES, PAGES};
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const ferry_kv_mode_t modes[] = {FERRY_KV_AUTO, FERRY_KV_PER_PAGE, FERRY_KV_BATCHED, FERRY_KV_STREAMS,
                                   FERRY_KV_KERNEL};
  /* The kernel mode is never sliced (the flag only applies to copy engines). */
  const unsigned flag_sets[] = {0u, FERRY_KV_SLICED, FERRY_KV_SLICED | FERRY_KV_URGENT};
  for (int run = 0; run < 15; ++run) {
    const int m = run % 5;
    const unsigned flags = flag_sets[run / 5];
    cudaMemsetAsync(gpu, 0xA5, PAGES * PAGE_BYTES, stream);
    memset(back, 0x5A, PAGES * PAGE_BYTES);
    /* Fetch host -> GPU, then save GPU -> host (same ids reversed), in one stream. */
    check(ferry_kv_copy_blocks(device, &gpu_side, &host_side, 1, dst_ids, src_ids, N, modes[m], flags, stream) ==
              FERRY_SUCCESS,
          "fetch");
    check(ferry_kv_copy_blocks(device, &back_side, &gpu_side, 1, src_ids, dst_ids, 0, modes[m], flags, stream) ==
              FERRY_SUCCESS,
          "save of zero pages");
    check(ferry_kv_copy_blocks(device, &back_side, &gpu_side, 1, dst_ids, dst_ids, N, modes[m], flags, stream) ==
              FERRY_SUCCESS,
          "save");
    cudaMemcpyAsync(check_buf, gpu, PAGES * PAGE_BYTES, cudaMemcpyDeviceToHost, stream);
    cudaStreamSynchronize(stream);
    int wrong = 0;
    for (int i = 0; i < N; ++i) {
      wrong += memcmp(check_buf + dst_ids[i] * PAGE_BYTES, host + src_ids[i] * PAGE_BYTES, PAGE_BYTES) != 0;
      wrong += memcmp(back + dst_ids[i] * PAGE_BYTES, host + src_ids[i] * PAGE_BYTES, PAGE_BYTES) != 0;
    }
    /* Pages not named must be untouched. */
    int untouched = 1;
    for (int i = N; i < PAGES; ++i)
      for (int b = 0; b < PAGE_BYTES; b += 997) untouched &= back[perm[i] * PAGE_BYTES + b] == 0x5A;
    printf("mode %d flags %u: %d wrong pages, untouched pages %s\n", (int)modes[m], flags, wrong,
           untouched ? "intact" : "CHANGED");
    check(wrong == 0 && untouched, "byte check");
  }
  prepared(device, pool, &gpu_side, &host_side, &back_side, gpu, host, back, check_buf, dst_ids, src_ids, stream);
  /* Bad input: each refused with a message naming the argument, nothing copied. */
  int64_t bad = PAGES;
  check(ferry_kv_copy_blocks(device, &gpu_side, &host_side, 1, &bad, src_ids, 1, FERRY_KV_AUTO, 0, stream) ==
            FERRY_ERROR_INVALID_ARGUMENT,
        "out-of-range index refused");
  printf("out of range: %s\n", ferry_last_error());
  int64_t dup[2] = {3, 3};
  check(ferry_kv_copy_blocks(device, &gpu_side, &host_side, 1, dup, src_ids, 2, FERRY_KV_AUTO, 0, stream) ==
            FERRY_ERROR_INVALID_ARGUMENT,
        "duplicate destination refused");
  printf("duplicate: %s\n", ferry_last_error());
  unsigned char* pageable = (unsigned char*)malloc(PAGES * PAGE_BYTES);
  ferry_kv_region_t pageable_side = {pageable, PAGE_BYTES, PAGE_BYTES, PAGES};
  check(ferry_kv_copy_blocks(device, &gpu_side, &pageable_side, 1, dst_ids, src_ids, N, FERRY_KV_AUTO, 0, stream) ==
            FERRY_ERROR_INVALID_ARGUMENT,
        "pageable memory refused");
  printf("pageable: %s\n", ferry_last_error());
  check(ferry_kv_copy_blocks(device, &gpu_side, &host_side, 1, dst_ids, src_ids, N, FERRY_KV_KERNEL, FERRY_KV_ZERO_SM,
                             stream) == FERRY_ERROR_INVALID_ARGUMENT,
        "kernel with zero_sm refused");
  check(ferry_kv_copy_blocks(device, &gpu_side, &host_side, 1, dst_ids, src_ids, N, FERRY_KV_AUTO, 1u << 20, stream) ==
            FERRY_ERROR_INVALID_ARGUMENT,
        "unknown flag refused");
  printf("unknown flag: %s\n", ferry_last_error());
  cudaStreamSynchronize(stream);
  check(ferry_host_pool_destroy(pool) == FERRY_SUCCESS, "ferry_host_pool_destroy");
  cudaFree(gpu);
  free(check_buf);
  free(pageable);
  cudaStreamDestroy(stream);
  printf(failures ? "kv_c_api: %d checks FAILED\n" : "kv_c_api: all checks passed\n", failures);
  return failures ? 1 : 0;
}
