/* LD_PRELOAD=libferry_preload.so: an unmodified program's cudaMemcpy and
 * cudaMemcpyAsync between pinned host memory and a GPU, from
 * FERRY_MULTIPATH_MIN_BYTES up, go through ferry's multipath engine (every
 * visible GPU's host link), in the same stream order. Everything else goes to
 * the CUDA runtime untouched. Nothing happens before the first such call: a
 * program that never copies with CUDA is not affected. The engine lives in
 * libferry.so, next to this library, whose own CUDA calls bind to the CUDA
 * runtime linked into it and so never come back here. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/multipath.h"
#include "preload/route.h"

typedef cudaError_t (*memcpy_async_fn)(void*, const void*, size_t, enum cudaMemcpyKind, cudaStream_t);
typedef cudaError_t (*memcpy_fn)(void*, const void*, size_t, enum cudaMemcpyKind);
typedef ferry_result_t (*create_fn)(const int*, int, const ferry_multipath_options_t*, ferry_multipath_t*);
typedef ferry_result_t (*copy_fn)(ferry_multipath_t, void*, const void*, size_t, ferry_stream_t, int*);
typedef ferry_result_t (*copy_sync_fn)(ferry_multipath_t, void*, const void*, size_t, int*);
typedef const char* (*last_error_fn)(void);

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static memcpy_async_fn g_real_async;
static memcpy_fn g_real_sync;
static create_fn g_create;
static copy_fn g_copy;
static copy_sync_fn g_copy_sync;
static last_error_fn g_last_error;
static ferry_multipath_t g_engine;
static int g_off; /* libferry missing, or the engine could not be made: every copy goes straight through */
static int g_debug;
static size_t g_min_bytes;

static void say(const char* what, const char* detail) {
  if (g_debug) fprintf(stderr, "ferry preload: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
}

static void find_runtime(void) {
  g_real_async = (memcpy_async_fn)dlsym(RTLD_NEXT, "cudaMemcpyAsync");
  g_real_sync = (memcpy_fn)dlsym(RTLD_NEXT, "cudaMemcpy");
  if (g_real_async && g_real_sync) return;
  /* A runtime loaded into a library's local scope is not "next": ask for it by name. */
  static const char* names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
    void* rt = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
    if (!rt) continue;
    g_real_async = (memcpy_async_fn)dlsym(rt, "cudaMemcpyAsync");
    g_real_sync = (memcpy_fn)dlsym(rt, "cudaMemcpy");
    if (g_real_async && g_real_sync) return;
  }
}

static void init(void) {
  find_runtime();
  const char* d = getenv("FERRY_DEBUG");
  g_debug = d && *d && strcmp(d, "0") != 0;
  g_min_bytes = ferry_preload_min_bytes(getenv("FERRY_MULTIPATH_MIN_BYTES"), (size_t)8 << 20);
  Dl_info info;
  char path[PATH_MAX];
  if (!dladdr((void*)init, &info) || !info.dli_fname || strlen(info.dli_fname) >= sizeof(path)) {
    g_off = 1;
    return;
  }
  strcpy(path, info.dli_fname);
  char* slash = strrchr(path, '/');
  const char* name = "libferry.so";
  if (!slash || (size_t)(slash - path) + 1 + strlen(name) >= sizeof(path)) {
    g_off = 1;
    return;
  }
  strcpy(slash + 1, name);
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    g_create = (create_fn)dlsym(lib, "ferry_multipath_create");
    g_copy = (copy_fn)dlsym(lib, "ferry_multipath_copy");
    g_copy_sync = (copy_sync_fn)dlsym(lib, "ferry_multipath_copy_sync");
    g_last_error = (last_error_fn)dlsym(lib, "ferry_last_error");
  }
  if (!g_create || !g_copy || !g_copy_sync || !g_last_error || !g_real_async || !g_real_sync) {
    g_off = 1;
    say("off (libferry.so or the CUDA runtime's copy calls not found)", lib ? NULL : dlerror());
  }
}

static ferry_multipath_t engine(void) {
  pthread_mutex_lock(&g_mu);
  if (!g_engine && !g_off) {
    if (g_create(NULL, 0, NULL, &g_engine) != FERRY_SUCCESS) {
      g_off = 1;
      g_engine = NULL;
      say("off (the multipath engine could not be made)", g_last_error());
    } else {
      say("routing host<->GPU copies through the multipath engine", NULL);
    }
  }
  ferry_multipath_t e = g_engine;
  pthread_mutex_unlock(&g_mu);
  return e;
}

/* 1: ferry took the copy (*err set); 0: the runtime should run it. `sync`:
 * cudaMemcpy's semantics (the legacy stream of the GPU side, waited for). */
static int through_ferry(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream,
                         int sync, cudaError_t* err) {
  pthread_once(&g_once, init);
  if (g_off || !ferry_preload_routes(count, kind, g_min_bytes)) return 0;
  ferry_multipath_t e = engine();
  if (!e) return 0;
  int multipath = 0;
  ferry_result_t r = sync ? g_copy_sync(e, dst, src, count, &multipath)
                          : g_copy(e, dst, src, count, (ferry_stream_t)stream, &multipath);
  if (r == FERRY_SUCCESS) {
    *err = cudaSuccess;
    return 1;
  }
  if (r == FERRY_ERROR_INVALID_ARGUMENT) {
    say("left to the runtime", g_last_error()); /* not a copy ferry can take: CUDA's own result */
    return 0;
  }
  /* The engine failed (a CUDA error, a copy that did not land): its copies
   * since are invalid; this call reports it as an asynchronous CUDA error would. */
  fprintf(stderr, "ferry preload: %s\n", g_last_error());
  *err = cudaErrorUnknown;
  return 1;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  if (through_ferry(dst, src, count, kind, stream, 0, &err)) return err;
  pthread_once(&g_once, init);
  return g_real_async ? g_real_async(dst, src, count, kind, stream) : cudaErrorNotSupported;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  cudaError_t err = cudaSuccess;
  if (through_ferry(dst, src, count, kind, (cudaStream_t)0, 1, &err)) return err;
  pthread_once(&g_once, init);
  return g_real_sync ? g_real_sync(dst, src, count, kind) : cudaErrorNotSupported;
}
